"""The job file's `inputs:` and `outputs:` (docs/DATA.md): what each source or destination string
means, checked when the file is loaded (syntax only; whether a bucket exists is asked at plan
time, gpucloud/run/data_grants.py).

Sources: `s3://bucket/prefix`, `az://account/container/prefix`,
`https://<account>.blob.core.windows.net/container/prefix`, any other `https://` URL (one file),
or a local file or folder (relative to the job file). Destinations: the two bucket forms.
An input is copied (`mode: copy`, the default, kept as its source string) or, for a bucket
folder, mounted read-only on the machine (`mode: mount`, kept as a MountedInput).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict

from gpucloud.spec.values import describe, reject

_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_AZ_ACCOUNT = re.compile(r"^[a-z0-9]{3,24}$")
_AZ_CONTAINER = re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}$")
_BLOB_HOST = re.compile(r"^https://([a-z0-9]{3,24})\.blob\.core\.windows\.net/([^/?#]+)/?([^?#]*)$")
# gpucloud's own run channels (providers/aws/channel.py bucket_name: gpucloud-<account>-<region>;
# providers/azure/channel.py storage_account_name: gpuc + 20 hex digits). They hold every run's
# objects and grants, so no job reads or writes them as data. tests/spec/test_data_reach.py holds
# these patterns to the providers' own names.
_CHANNEL_BUCKET = re.compile(r"^gpucloud-[0-9]{12}-[a-z0-9-]+$")
_CHANNEL_ACCOUNT = re.compile(r"^gpuc[0-9a-f]{20}$")


@dataclass(frozen=True)
class DataSource:
    """One source or destination: kind s3 | az | https | path (a local file or folder)."""

    kind: str
    bucket: str = ""  # s3 bucket, or az container
    account: str = ""  # az storage account
    prefix: str = ""  # key prefix inside the bucket/container ("" = all of it)
    url: str = ""  # https: the URL; local: the path as written

    @property
    def text(self) -> str:
        if self.kind == "s3":
            return f"s3://{self.bucket}/{self.prefix}"
        if self.kind == "az":
            return f"az://{self.account}/{self.bucket}/{self.prefix}"
        return self.url


def parse_location(text: str) -> DataSource:
    """A source/destination string as a DataSource; ValueError with the fix when malformed."""
    text = text.strip()
    m = _BLOB_HOST.match(text)
    if m:
        text = f"az://{m.group(1)}/{m.group(2)}/{m.group(3)}"
    _refuse_malformed_scheme(text)
    if text.startswith("s3://"):
        bucket, _, prefix = text[5:].partition("/")
        if not _S3_BUCKET.match(bucket):
            raise ValueError(f"'{bucket}' is not an S3 bucket name. Expected s3://bucket/prefix")
        return DataSource("s3", bucket=bucket, prefix=prefix)
    if text.startswith("az://"):
        parts = text[5:].split("/", 2)
        if len(parts) < 2 or not _AZ_ACCOUNT.match(parts[0]) or not _AZ_CONTAINER.match(parts[1]):
            raise ValueError(f"'{text}' is not az://account/container/prefix (lower-case account and container)")
        return DataSource("az", account=parts[0], bucket=parts[1], prefix=parts[2] if len(parts) > 2 else "")
    if text.startswith("https://"):
        return DataSource("https", url=text)
    if re.match(r"^[a-z][a-z0-9+.-]*://", text):
        raise ValueError(f"'{text}': unknown scheme. Use s3://, az://, https:// or a local path")
    if not text:
        raise ValueError("is empty. Expected s3://bucket/prefix, az://account/container/prefix, https://... or a path")
    return DataSource("path", url=text)


def _refuse_malformed_scheme(text: str) -> None:
    """`s3:/bucket`, `s3:bucket`, `S3://bucket` or `https:/host` would otherwise be read as a local
    path and fail only on the machine: a known scheme written wrong is refused with the right form."""
    m = re.match(r"^(s3|az|https?)(:/{0,3})(?=[^/])", text, flags=re.IGNORECASE)
    if m is None or (m.group(2) == "://" and m.group(1) == m.group(1).lower()):
        return
    scheme = {"http": "https"}.get(m.group(1).lower(), m.group(1).lower())  # http is not taken: https
    fixed = f"{scheme}://{text[m.end() :]}"
    if m.group(2) == "://":
        raise ValueError(f"'{text}': write the scheme in lower case, {fixed}")
    raise ValueError(
        f"'{text}' is not a URL: {scheme}: needs two slashes. Did you mean {fixed}? (A local path starts with ./ or /)"
    )


def _channel_refusal(where: DataSource) -> str | None:
    if (where.kind == "s3" and _CHANNEL_BUCKET.match(where.bucket)) or (
        where.kind == "az" and _CHANNEL_ACCOUNT.match(where.account)
    ):
        name = where.bucket if where.kind == "s3" else f"the storage account {where.account}"
        return (
            f"'{where.text}' is in {name}, gpucloud's own run channel: it holds other runs' files and "
            "grants, so no job reads or writes it. Use a bucket of your own"
        )
    return None


def _vm_path(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        reject(f"expected a path on the machine (e.g. data/ or /data), got {describe(value)}")
    if ".." in re.split(r"/+", value):
        reject(f"'{value}' uses '..'. Write a path inside the job's folder (data/) or an absolute one (/data)")
    return value


class MountedInput(BaseModel):
    """An input with `mode: mount`: a bucket folder mounted read-only on the machine, not copied."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    source: str
    mode: Literal["mount"] = "mount"


class InputForm(BaseModel):
    """The object form of an input as written in the job file (the JSON schema's view)."""

    model_config = ConfigDict(extra="forbid")
    source: str
    mode: Literal["copy", "mount"] = "copy"


def any_mounted(inputs: Mapping[str, str | MountedInput]) -> bool:
    """Whether some input is mounted (`mode: mount`) rather than copied: the machine needs rclone."""
    return any(isinstance(value, MountedInput) for value in inputs.values())


def input_source(value: str | MountedInput) -> tuple[str, str]:
    """(source string, mode) of one `inputs:` value as the spec keeps it."""
    if isinstance(value, MountedInput):
        return value.source, "mount"
    return value, "copy"


def _mount_refusal(where: DataSource) -> str:
    if where.kind == "https":
        return (
            f"'{where.url}' is one file over https: mode: mount takes a bucket folder "
            "(s3://bucket/prefix or az://account/container/prefix). Use mode: copy for it"
        )
    return (
        f"'{where.url}' is a local path, which is uploaded with the run: mode: mount takes a bucket folder "
        "(s3://bucket/prefix or az://account/container/prefix). Remove mode (copy is the default)"
    )


def _input(value: Any) -> str | MountedInput:
    mode = "copy"
    if isinstance(value, MountedInput):
        value = value.model_dump()
    if isinstance(value, dict):
        extra = sorted(set(value) - {"source", "mode"})
        if extra:
            reject(f"unknown key {extra[0]}. Expected source: and mode: copy or mount")
        mode = value.get("mode", "copy")
        if mode not in ("copy", "mount"):
            reject(
                f"mode {mode!r} is not a mode. Write mode: copy (copied onto the machine before setup, the "
                "default) or mode: mount (a bucket folder mounted read-only)"
            )
        value = value.get("source")
    if not isinstance(value, str):
        reject(
            "expected a source (s3://bucket/prefix, az://account/container/prefix, https://..., a path), "
            f"got {describe(value)}"
        )
    try:
        where = parse_location(value)
    except ValueError as exc:
        reject(str(exc))
    if refusal := _channel_refusal(where):
        reject(refusal)
    if mode == "copy":
        return value.strip()
    if where.kind not in ("s3", "az"):
        reject(_mount_refusal(where))
    return MountedInput(source=value.strip())


def _output(value: Any) -> str:
    if not isinstance(value, str):
        reject(f"expected a bucket prefix (s3://bucket/prefix or az://account/container/prefix), got {describe(value)}")
    try:
        where = parse_location(value)
    except ValueError as exc:
        reject(str(exc))
    if where.kind not in ("s3", "az"):
        reject(f"'{value}': outputs go to a bucket prefix, s3://bucket/prefix or az://account/container/prefix")
    if refusal := _channel_refusal(where):
        reject(refusal)
    if not where.prefix.strip("/"):
        reject(
            f"'{value}' is a whole bucket: the machine's grant would let it write every key in it. Name a "
            f"prefix for this job's outputs, e.g. {where.text.rstrip('/')}/my-run"
        )
    return value.strip()


DataPath = Annotated[str, BeforeValidator(_vm_path)]
InputSource = Annotated[str | MountedInput, BeforeValidator(_input, json_schema_input_type=str | InputForm)]
OutputDest = Annotated[str, BeforeValidator(_output)]
