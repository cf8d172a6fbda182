"""The job file: pydantic v2 models (JobSpec and friends) and YAML loading with line-aware errors.

The model attributes are a contract used by planner, render and lifecycle; keep their names and
types. The validators accept the friendly input forms of DESIGN.md section 3 ("K80:1", "6h", "any",
"pytorch==2.0.1") and turn them into the canonical values the rest of gpucloud relies on.

Errors are the user's first contact with gpucloud, so every problem becomes one line
`<file>:<line>: <dotted.field>: <what is wrong>. <what was expected / did you mean>` and all problems
of a file are reported together in one `SpecError` (exit code 2), never as a traceback. Line numbers
come from the composed YAML node tree (PyYAML), onto which pydantic's error locations are mapped.

Imports stay light (no yaml, catalog or cloud SDK at import time): `gpucloud validate` and the
planner import this module on their hot path.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gpucloud.errors import UserError

if TYPE_CHECKING:
    from yaml import Node

__all__ = [
    "GpuRequest",
    "JobSpec",
    "Resources",
    "SpecError",
    "SpecIssue",
    "StackSpec",
    "json_schema",
    "load_spec",
    "parse_spec",
    "parse_duration",
]

CloudName = Literal["aws", "azure", "local", "ssh"]
FrameworkName = Literal["pytorch", "tensorflow", "none"]

_CLOUD_INPUT = Literal["any", "aws", "azure", "local", "ssh"]
_CLOUD_WORDS = ("aws", "azure", "local", "ssh", "any")
# `[user@]host[:port]` or a ~/.ssh/config alias; never an ssh option (no leading dash, no spaces).
_HOST_RE = re.compile(r"^(?:[A-Za-z0-9._][A-Za-z0-9._+-]*@)?(?:[A-Za-z0-9_][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?$")
_FRAMEWORKS = ("pytorch", "tensorflow", "none")
_FRAMEWORK_ALIASES = {"torch": "pytorch", "tf": "tensorflow", "keras": "tensorflow", "cpu": "none"}
_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_AMI_RE = re.compile(r"^ami-[0-9a-f]{8,17}$")
_REGION_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_INSTANCE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)*$")
_PKG_VERSION_RE = re.compile(r"^[0-9][0-9A-Za-z.+!-]*$")
_DURATION_RE = re.compile(r"^(?:(\d+)\s*d)?\s*(?:(\d+)\s*h)?\s*(?:(\d+)\s*m)?\s*(?:(\d+)\s*s)?$")
_DURATION_PATTERN = r"^\s*[0-9]+\s*$|^\s*([0-9]+\s*d)?\s*([0-9]+\s*h)?\s*([0-9]+\s*m)?\s*([0-9]+\s*s)?\s*$"
_GPU_SHORTHAND_PATTERN = r"^\s*[A-Za-z0-9][A-Za-z0-9 _.-]*(:\s*[0-9]+)?\s*$"
_IMAGE_PATTERN = r"^(auto|ami-[0-9a-f]{8,17}|[^:\s]+:[^:\s]+:[^:\s]+:[^:\s]+)$"
MIN_DURATION_S = 1  # short deadlines are legitimate on the local provider (a timeout for a quick job)
MAX_DURATION_S = 30 * 86400
_MAX_FILE_BYTES = 1 << 20  # a job file is a few hundred bytes; anything this big is a wrong path
_MAX_NODES_BUILT = 100_000  # guards against YAML alias bombs ("billion laughs")


# ---------------------------------------------------------------------------------------------
# Small helpers shared by the validators


def _fail(message: str, *sub: str | int) -> NoReturn:
    """Raise a validation error whose text is exactly `message` (pydantic would otherwise prefix
    "Value error, "). `sub` extends the error location below the validated field, so that e.g. a
    bad item of a cloud list points at that item's line."""
    raise PydanticCustomError("spec", "{msg}", {"msg": message, "sub": tuple(sub)})


def describe(value: Any) -> str:
    """A value as the user wrote it in YAML terms ("the number 5", "a list"), for error messages."""
    if value is None:
        return "nothing (an empty value)"
    if isinstance(value, bool):
        return f"{'true' if value else 'false'} (a boolean)"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"'{value}'" if value else "an empty string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, bytes | bytearray):
        return "binary data"
    if isinstance(value, _dt.date):
        return f"the date {value.isoformat()}"
    return f"a {type(value).__name__}"


def did_you_mean(word: str, choices: list[str] | tuple[str, ...], *, cutoff: float = 0.6) -> str | None:
    """The closest choice to `word` (case, '-' and '_' ignored), or None when nothing is close."""

    def norm(s: str) -> str:
        return s.lower().replace("-", "_")

    by_norm = {norm(c): c for c in choices}
    match = difflib.get_close_matches(norm(word), list(by_norm), n=1, cutoff=cutoff)
    return by_norm[match[0]] if match else None


def _no_bool(value: Any) -> Any:
    """YAML reads `yes`/`true` as booleans and pydantic would quietly take them as 1: refuse."""
    if isinstance(value, bool):
        _fail(f"expected a number, got {describe(value)}")
    return value


def _text(value: Any, what: str) -> str:
    """A required, non-empty string (stripped), with a message that says what belongs there."""
    if value is None:
        _fail(f"has no value. Expected {what}")
    if not isinstance(value, str):
        _fail(f"expected {what}, got {describe(value)}. Quote the value if it is meant as text")
    text = value.strip()
    if not text:
        _fail(f"must not be empty. Expected {what}")
    return text


def parse_duration(value: Any) -> int:
    """Seconds from "90m", "6h", "2d", "1h30m", "45s", "3600" or an integer (bounds not checked)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        _fail(f"expected a duration such as 90m, 6h, 2d or 1h30m, got {describe(value)}")
    if isinstance(value, int):
        return value
    text = value.strip().lower()
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    m = _DURATION_RE.fullmatch(text)
    if not text or not m or not any(m.groups()):
        _fail(
            f"'{value}' is not a duration. Expected a number with a unit (s, m, h, d) such as 90m, "
            "6h, 2d or 1h30m, or whole seconds"
        )
    days, hours, minutes, seconds = (int(g or 0) for g in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def _fmt_duration(seconds: int) -> str:
    """1h30m-style text for error messages."""
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


def _resolve_gpu(name: str) -> str:
    """Canonical catalog name for a GPU name or alias, or an error listing what exists."""
    from gpucloud import catalog  # lazy: only job files that name a GPU pay for the catalog

    canonical = catalog.resolve_gpu_name(name)
    if canonical:
        return canonical
    known = catalog.gpu_names()
    suggestion = catalog.resolve_gpu_name(name.upper().replace("O", "0").replace("I", "1"))
    if suggestion is None:
        spellings = list(known)
        try:
            for gpu in catalog.load_catalog().gpus.values():
                spellings.extend(gpu.aliases)
        except (AttributeError, TypeError):  # an older catalog without aliases: names only
            pass
        # one wrong character in a 2-3 letter name ("T5") scores only 0.5 with difflib
        close = did_you_mean(name.upper(), spellings, cutoff=0.5 if len(name) <= 3 else 0.6)
        suggestion = catalog.resolve_gpu_name(close) if close else None
    hint = f"Did you mean '{suggestion}'? " if suggestion else ""
    _fail(f"unknown GPU '{name}'. {hint}Known GPUs: {', '.join(known)}")


# ---------------------------------------------------------------------------------------------
# Item types (Annotated, so that an error points at the item and its line, not the whole list)


def _env_key(value: Any) -> str:
    if not isinstance(value, str) or not _ENV_KEY_RE.fullmatch(value):
        _fail(
            f"'{value}' is not a valid environment variable name. Expected letters, digits and "
            "underscores, not starting with a digit, e.g. EPOCHS"
        )
    if value.upper().startswith("GPUCLOUD_"):
        _fail(f"'{value}' is reserved: names starting with GPUCLOUD_ are set by gpucloud itself. Rename it")
    return value


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    if value is None:
        _fail('has no value. Write "" for an empty value, or remove the variable')
    _fail(f"expected text, a number or true/false, got {describe(value)}. Quote it to pass it verbatim")


def _artifact(value: str) -> str:
    if not value.strip():
        _fail("must not be empty. Expected a path relative to the job's working folder, e.g. outputs/")
    if value.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:[\\/]", value):
        _fail(f"'{value}' is an absolute path. Artifacts are relative to the job's working folder, e.g. outputs/")
    if ".." in re.split(r"[\\/]+", value):
        _fail(f"'{value}' leaves the working folder with '..'. Use a path inside it, e.g. outputs/")
    return value


EnvKey = Annotated[str, BeforeValidator(_env_key, json_schema_input_type=str)]
EnvValue = Annotated[str, BeforeValidator(_env_value, json_schema_input_type=str | int | float | bool)]
ArtifactPath = Annotated[str, AfterValidator(_artifact)]


# ---------------------------------------------------------------------------------------------
# Models


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class GpuRequest(_Strict):
    """`MODEL:COUNT` per node; `model` is the catalog's canonical name (e.g. "A100-80GB")."""

    model: str
    count: int = Field(1, ge=1, le=16)

    @field_validator("model", mode="before", json_schema_input_type=str)
    @classmethod
    def _model(cls, value: Any) -> str:
        return _resolve_gpu(_text(value, "a GPU model such as K80, T4 or A100-80GB"))

    @field_validator("count", mode="before")
    @classmethod
    def _count(cls, value: Any) -> Any:
        return _no_bool(value)


class Resources(_Strict):
    cloud: list[CloudName] = Field(default_factory=lambda: ["aws", "azure"])  # "any" = aws + azure
    regions: list[str] | None = None
    gpu: GpuRequest | None = None
    instance_type: str | None = None
    spot: bool | Literal["auto"] = False
    max_price_per_hour: float | None = Field(None, gt=0)
    min_vcpus: int | None = Field(None, ge=1)
    min_memory_gib: float | None = Field(None, gt=0)
    disk_gb: int = Field(100, ge=20, le=16384)
    ssh: bool = False
    hosts: list[str] | None = None  # cloud: ssh only: the machines, `[user@]host[:port]` or ssh aliases

    @field_validator("hosts", mode="before", json_schema_input_type=str | list[str] | None)
    @classmethod
    def _hosts(cls, value: Any) -> list[str] | None:
        """One host or a list; each `[user@]host[:port]` or a ~/.ssh/config alias (docs/SSH.md)."""
        expected = "a list of hosts such as [gpu-box, alice@10.0.0.7:2222]"
        if value is None:
            return None
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items:
            _fail(f"expected {expected}, got {describe(value)}")
        out: list[str] = []
        for i, item in enumerate(items):
            sub = () if isinstance(value, str) else (i,)
            text = item.strip() if isinstance(item, str) else ""
            port = text.rpartition(":")[2] if ":" in text and not text.endswith("]") else ""
            if not _HOST_RE.fullmatch(text) or (port and not 1 <= int(port) <= 65535):
                _fail(f"{describe(item)} is not a host. Expected [user@]host[:port] or an alias from ~/.ssh/config", *sub)
            if text not in out:
                out.append(text)
        return out

    @model_validator(mode="after")
    def _hosts_need_ssh(self) -> Resources:
        """`hosts` names machines reached over SSH; with any other cloud it would be ignored silently."""
        if "ssh" in self.cloud and len(self.cloud) > 1:
            _fail("ssh cannot be combined with other clouds (your own machines are not a fallback "
                  "for paid ones). Use cloud: ssh alone", "cloud")
        if self.hosts and self.cloud != ["ssh"]:
            _fail("is only used with cloud: ssh. Add cloud: ssh, or remove hosts", "hosts")
        return self

    @field_validator("cloud", mode="before", json_schema_input_type=_CLOUD_INPUT | list[_CLOUD_INPUT])
    @classmethod
    def _cloud(cls, value: Any) -> list[str]:
        """"any" -> aws + azure; a single name or a list; case-insensitive, deduplicated in order."""
        expected = "aws, azure, local, ssh, any, or a list of them"
        if value is None:
            _fail(f"has no value. Expected {expected}")
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            _fail(f"expected {expected}, got {describe(value)}")
        if not items:
            _fail(f"the list is empty. Expected {expected}")
        out: list[str] = []
        for i, item in enumerate(items):
            sub = () if isinstance(value, str) else (i,)
            if not isinstance(item, str):
                _fail(f"expected a cloud name, got {describe(item)}. Expected {expected}", *sub)
            word = item.strip().lower()
            if word not in _CLOUD_WORDS:
                close = did_you_mean(word, _CLOUD_WORDS)
                hint = f"Did you mean '{close}'? " if close else ""
                _fail(f"unknown cloud '{item}'. {hint}Expected {expected}", *sub)
            for name in ("aws", "azure") if word == "any" else (word,):
                if name not in out:
                    out.append(name)
        return out

    @field_validator("regions", mode="before", json_schema_input_type=str | list[str] | None)
    @classmethod
    def _regions(cls, value: Any) -> list[str] | None:
        """A single region or a list; lower-cased ("East US" style names are not region codes)."""
        if value is None:
            return None
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            _fail(f"expected a region or a list of regions such as [us-east-1, eastus], got {describe(value)}")
        if not items:
            _fail("the list is empty. Name at least one region, or remove the key to allow all")
        out: list[str] = []
        for i, item in enumerate(items):
            sub = () if isinstance(value, str) else (i,)
            if not isinstance(item, str) or not _REGION_RE.fullmatch(item.strip().lower()):
                _fail(
                    f"{describe(item)} is not a region code. Expected names such as us-east-1 (AWS) "
                    "or eastus (Azure)",
                    *sub,
                )
            region = item.strip().lower()
            if region not in out:
                out.append(region)
        return out

    @field_validator("gpu", mode="before", json_schema_input_type=Annotated[str, Field(pattern=_GPU_SHORTHAND_PATTERN)] | GpuRequest | None)
    @classmethod
    def _gpu(cls, value: Any) -> Any:
        """"K80:1" / "k80" / "A100-80GB:8" -> {model, count}; mappings go to GpuRequest as they are."""
        expected = "MODEL:COUNT such as K80:1 or A100-80GB:8, or a mapping {model: K80, count: 1}"
        if isinstance(value, dict) and len(value) == 1:
            ((key, count),) = value.items()
            if key not in GpuRequest.model_fields and did_you_mean(str(key), list(GpuRequest.model_fields)) is None:
                from gpucloud import catalog

                if catalog.resolve_gpu_name(str(key)):
                    _fail(
                        f"'{key}: {count}' reads as a mapping because of the space after the colon. "
                        f"Write {key}:{count} (no space), or a mapping {{model: {key}, count: {count}}}"
                    )
        if value is None or isinstance(value, dict | GpuRequest):
            return value
        if not isinstance(value, str):
            _fail(f"expected {expected}, got {describe(value)}")
        model, sep, count = value.strip().rpartition(":")
        if not sep:
            model, count = count, "1"
        model, count = model.strip(), count.strip()
        if not model:
            _fail(f"'{value}' names no GPU model. Expected {expected}")
        if not re.fullmatch(r"[+-]?\d+", count):
            _fail(f"the GPU count '{count}' in '{value}' is not a whole number. Expected {expected}")
        return {"model": model, "count": int(count)}

    @field_validator("instance_type", mode="before")
    @classmethod
    def _instance_type(cls, value: Any) -> str | None:
        if value is None:
            return None
        text = _text(value, "an instance type such as p2.xlarge or Standard_NC6s_v3")
        if not _INSTANCE_RE.fullmatch(text):
            _fail(f"'{value}' is not an instance type name. Expected e.g. p2.xlarge or Standard_NC6s_v3")
        return text

    @field_validator("spot", mode="before", json_schema_input_type=bool | Literal["auto"])
    @classmethod
    def _spot(cls, value: Any) -> bool | str:
        if isinstance(value, bool):
            return value
        word = value.strip().lower() if isinstance(value, str) else None
        if word == "auto":
            return "auto"
        if word in {"true", "yes", "on"}:
            return True
        if word in {"false", "no", "off"}:
            return False
        _fail(
            f"{describe(value)} is not allowed. Expected true, false or auto "
            "(auto = spot when it is cheaper, falling back to on-demand)"
        )

    @field_validator("max_price_per_hour", "min_vcpus", "min_memory_gib", "disk_gb", mode="before")
    @classmethod
    def _numbers(cls, value: Any) -> Any:
        return _no_bool(value)


class StackSpec(_Strict):
    driver: str = "auto"
    cuda: str = "auto"
    cudnn: str = "auto"
    framework: FrameworkName = "none"
    framework_version: str = "auto"
    install: bool = False  # cloud: ssh: may gpucloud install the driver/CUDA on your machine (sudo)?

    @model_validator(mode="before")
    @classmethod
    def _split_pin(cls, data: Any) -> Any:
        """"pytorch==2.0.1" -> framework pytorch + framework_version 2.0.1."""
        if not isinstance(data, dict) or not isinstance(data.get("framework"), str):
            return data
        name, sep, version = data["framework"].partition("==")
        if not sep:
            return data
        given = data.get("framework_version")
        if given not in (None, "auto") and str(given).strip() != version.strip():
            _fail(
                f"pins version {version.strip()} but framework_version says {given}. Keep one of them",
                "framework",
            )
        if not version.strip():
            _fail(f"'{data['framework']}' has no version after '=='. Expected e.g. pytorch==2.0.1", "framework")
        return {**data, "framework": name, "framework_version": version}

    @field_validator("driver", "cuda", "cudnn", mode="before", json_schema_input_type=str | int | float)
    @classmethod
    def _versions(cls, value: Any) -> str:
        """"auto" or a version like 470 / 11.4 / 8.9 (numbers from YAML are taken as text)."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)
        text = _text(value, "auto or a version such as 11.4")
        if text.lower() == "auto":
            return "auto"
        if not _VERSION_RE.fullmatch(text):
            _fail(f"'{value}' is not a version. Expected auto or digits and dots, e.g. 470, 11.4 or 8.9")
        return text

    @field_validator("framework", mode="before", json_schema_input_type=Annotated[str, Field(pattern=r"^\s*(pytorch|tensorflow|none)\s*(==\s*[0-9][0-9A-Za-z.+!-]*)?\s*$")])
    @classmethod
    def _framework(cls, value: Any) -> str:
        expected = "pytorch, tensorflow or none, optionally pinned like pytorch==2.0.1"
        word = _text(value, expected).lower()
        if word in _FRAMEWORKS:
            return word
        close = _FRAMEWORK_ALIASES.get(word) or did_you_mean(word, _FRAMEWORKS)
        hint = f"Did you mean '{close}'? " if close else ""
        _fail(f"unknown framework '{value}'. {hint}Expected {expected}")

    @field_validator("framework_version", mode="before", json_schema_input_type=str | int | float)
    @classmethod
    def _framework_version(cls, value: Any) -> str:
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)
        text = _text(value, "auto or a version such as 2.0.1")
        if text.lower() == "auto":
            return "auto"
        if not _PKG_VERSION_RE.fullmatch(text):
            _fail(f"'{text}' is not a version. Expected auto or a version such as 2.0.1")
        return text


class JobSpec(_Strict):
    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
    resources: Resources = Field(default_factory=Resources)
    num_nodes: int = Field(1, ge=1, le=64)
    stack: StackSpec = Field(default_factory=StackSpec)
    image: str = "auto"
    workdir: str = "."
    env: dict[EnvKey, EnvValue] = Field(default_factory=dict)
    setup: str | None = None
    run: str
    artifacts: list[ArtifactPath] = Field(default_factory=list)
    max_duration: int = Field(6 * 3600, ge=MIN_DURATION_S, le=MAX_DURATION_S)  # seconds; input "90m" / "6h" / "2d"
    source: Path | None = Field(None, exclude=True)  # the job file it came from (not part of the format)

    def workdir_path(self) -> Path:
        """workdir is relative to the job file's folder (like docker-compose), else to the cwd."""
        base = self.source.parent if self.source else Path.cwd()
        return (base / self.workdir).resolve()

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> str:
        """Says which rule the name breaks and offers a fixed-up name, rather than a bare regex."""
        rule = "lowercase letters, digits and dashes, 1-40 characters, not starting or ending with a dash"
        text = _text(value, f"a job name of {rule}, e.g. mnist-k80")
        if _NAME_RE.fullmatch(text):
            return text
        fixed = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]+", "-", text.lower()))[:40].strip("-")
        if len(text) > 40:
            problem = f"is {len(text)} characters long; at most 40 are allowed"
        elif text != text.lower():
            problem = f"'{text}' has upper-case letters"
        elif text.startswith("-") or text.endswith("-"):
            problem = f"'{text}' starts or ends with a dash"
        else:
            bad = sorted({c for c in text if not re.fullmatch(r"[a-z0-9-]", c)})
            problem = f"'{text}' contains {', '.join(repr(c) for c in bad)}"
        hint = f" Did you mean '{fixed}'?" if fixed and _NAME_RE.fullmatch(fixed) else ""
        _fail(f"{problem}. Expected {rule}.{hint}".rstrip("."))

    @field_validator("resources", "stack", mode="before")
    @classmethod
    def _empty_section(cls, value: Any) -> Any:
        """`stack:` with every line commented out is YAML null: treat it as the defaults."""
        return {} if value is None else value

    @field_validator("num_nodes", mode="before")
    @classmethod
    def _num_nodes(cls, value: Any) -> Any:
        return _no_bool(value)

    @field_validator("image", mode="before", json_schema_input_type=Annotated[str, Field(pattern=_IMAGE_PATTERN)])
    @classmethod
    def _image(cls, value: Any) -> str:
        expected = "auto, an AMI id such as ami-0abcdef1234567890, or an Azure image URN Publisher:Offer:Sku:Version"
        text = _text(value, expected)
        if text.lower() == "auto":
            return "auto"
        if _AMI_RE.fullmatch(text):
            return text
        parts = text.split(":")
        if len(parts) == 4 and all(p and not re.search(r"\s", p) for p in parts):
            return text
        if text.lower().startswith("ami-"):
            _fail(f"'{text}' is not an AMI id: expected ami- and 8 to 17 lower-case hex digits, e.g. ami-0abcdef1234567890")
        if ":" in text:
            _fail(f"'{text}' is not an Azure image URN: expected 4 parts Publisher:Offer:Sku:Version, e.g. Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest")
        _fail(f"'{text}' is not an image. Expected {expected}")

    @field_validator("workdir", mode="before")
    @classmethod
    def _workdir(cls, value: Any) -> str:
        return _text(value, "a folder to upload, relative to the job file, e.g. .")

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("setup", mode="before")
    @classmethod
    def _setup(cls, value: Any) -> Any:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        return _text(value, "a shell command run once before run, e.g. pip install -r requirements.txt")

    @field_validator("run", mode="before")
    @classmethod
    def _run(cls, value: Any) -> str:
        return _text(value, "the shell command that runs the job, e.g. python train.py")

    @field_validator("artifacts", mode="before", json_schema_input_type=list[str] | str | None)
    @classmethod
    def _artifacts(cls, value: Any) -> Any:
        if value is None:
            return []
        return [value] if isinstance(value, str) else value

    @field_validator("max_duration", mode="before", json_schema_input_type=Annotated[int, Field(ge=MIN_DURATION_S, le=MAX_DURATION_S)] | Annotated[str, Field(pattern=_DURATION_PATTERN)])
    @classmethod
    def _max_duration(cls, value: Any) -> int:
        seconds = parse_duration(value)
        if seconds < MIN_DURATION_S:
            _fail(f"{describe(value)} is {seconds} s, shorter than the minimum of {MIN_DURATION_S} s. Expected e.g. 90m, 6h or 2d")
        if seconds > MAX_DURATION_S:
            _fail(f"{describe(value)} is {_fmt_duration(seconds)}, longer than the maximum of 30d")
        return seconds

    @model_validator(mode="after")
    def _needs_hardware(self) -> JobSpec:
        """The planner needs a GPU or an instance type to pick machines; only local runs need neither."""
        res = self.resources
        if res.gpu is None and res.instance_type is None and res.cloud not in (["local"], ["ssh"]):
            _fail(
                "needs a GPU or an instance type. Add gpu: MODEL:COUNT (e.g. gpu: K80:1) or "
                "instance_type: p2.xlarge under resources; only cloud: local runs without either (and cloud: ssh, on your own machines)",
                "resources",
            )
        return self


# ---------------------------------------------------------------------------------------------
# Errors


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a job file: where it is and what is wrong (with the fix)."""

    file: str
    line: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


class SpecError(UserError):
    """A job file is invalid. `issues` holds every problem found, sorted by line; the message is one
    line per problem, preceded by a summary line when there are several."""

    def __init__(self, issues: list[SpecIssue]) -> None:
        self.issues = sorted(issues, key=lambda i: (i.line or 0, i.field))
        if len(self.issues) == 1:
            message = str(self.issues[0])
        else:
            file = self.issues[0].file
            lines = [f"{file}: {len(self.issues)} problems in the job file:"]
            lines += [f"  {issue}" for issue in self.issues]
            message = "\n".join(lines)
        super().__init__(message)


# Field hints: appended to pydantic's own type/bound errors so each says what belongs there.
_HINTS: dict[str, str] = {
    "name": "a job name of lowercase letters, digits and dashes, e.g. mnist-k80",
    "run": "the shell command that runs the job, e.g. run: python train.py",
    "setup": "a shell command run once before run, e.g. pip install -r requirements.txt",
    "workdir": "a folder to upload, relative to the job file, e.g. .",
    "image": "auto, an AMI id or an Azure image URN",
    "num_nodes": "a whole number of nodes from 1 to 64",
    "env": "a mapping of NAME: value, e.g. {EPOCHS: 5}",
    "artifacts": "a list of relative paths, e.g. [outputs/, metrics.json]",
    "max_duration": "a duration such as 90m, 6h or 2d",
    "resources": "a mapping with gpu, cloud, regions, spot, ...",
    "resources.gpu": "MODEL:COUNT such as K80:1, or a mapping {model: K80, count: 1}",
    "resources.gpu.model": "a GPU model such as K80, T4 or A100-80GB",
    "resources.gpu.count": "GPUs per node, a whole number from 1 to 16",
    "resources.instance_type": "an instance type such as p2.xlarge or Standard_NC6s_v3",
    "resources.max_price_per_hour": "a price in USD per node-hour, greater than 0, e.g. 2.5",
    "resources.min_vcpus": "a whole number of vCPUs, at least 1",
    "resources.min_memory_gib": "memory in GiB, greater than 0",
    "resources.disk_gb": "the disk size in GB, a whole number from 20 to 16384",
    "resources.ssh": "true or false",
    "stack": "a mapping with driver, cuda, cudnn and framework",
}
_TYPE_WORDS: dict[str, str] = {
    "string_type": "text",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}
# Section models by YAML path, for "unknown key" suggestions.
_SECTIONS: dict[tuple[str, ...], type[BaseModel]] = {
    (): JobSpec,
    ("resources",): Resources,
    ("resources", "gpu"): GpuRequest,
    ("stack",): StackSpec,
}
_INPUT_ONLY_EXCLUDED = {"source"}  # model fields that are not part of the file format
# Derived fields whose value comes from another key in the file.
_LOC_ALIASES = {("stack", "framework_version"): ("stack", "framework")}


def _known_keys(path: tuple[str | int, ...]) -> list[str]:
    model = _SECTIONS.get(tuple(str(p) for p in path))
    return [k for k in model.model_fields if k not in _INPUT_ONLY_EXCLUDED] if model else []


def _unknown_key_message(key: Any, parent: tuple[str | int, ...]) -> str:
    """'unknown key' with the closest key at this level, or the level where that key belongs."""
    word = str(key)
    known = _known_keys(parent)
    close = did_you_mean(word, known)
    if close:
        return f"unknown key '{word}'. Did you mean '{close}'?"
    elsewhere = {".".join((*p, k)): k for p, m in _SECTIONS.items() if p != parent for k in _known_keys(p)}
    norm = word.lower().replace("-", "_")
    exact = [full for full, k in elsewhere.items() if k == norm]
    close_full = exact[0] if exact else None
    if close_full is None:
        close_key = did_you_mean(word, list(set(elsewhere.values())), cutoff=0.8)
        close_full = next((f for f, k in elsewhere.items() if k == close_key), None) if close_key else None
    if close_full:
        section = close_full.rsplit(".", 1)[0] if "." in close_full else "the top level"
        return f"unknown key '{word}' here. Did you mean '{close_full}'? It belongs under {section}"
    return f"unknown key '{word}'. Known keys here: {', '.join(known)}"


def _dotted(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _hint_key(loc: tuple[str | int, ...]) -> str:
    return ".".join(str(p) for p in loc if not isinstance(p, int))


def _explain(err: dict[str, Any], loc: tuple[str | int, ...]) -> str:
    """Pydantic's error as '<what is wrong>. <what was expected>'."""
    kind: str = err["type"]
    ctx: dict[str, Any] = err.get("ctx") or {}
    value = err.get("input")
    hint = _HINTS.get(_hint_key(loc))
    expected = f" Expected {hint}." if hint else ""
    if kind == "spec":
        text = str(ctx["msg"])
        return text if text.endswith((".", "?")) else text + "."
    if kind == "missing":
        return f"required key '{loc[-1]}' is missing.{expected}".rstrip(".") + "."
    if kind == "extra_forbidden":
        text = _unknown_key_message(loc[-1], loc[:-1])
        return text if text.endswith("?") else text + "."
    if kind in _TYPE_WORDS:
        want = hint or _TYPE_WORDS[kind]
        if value is None:
            return f"has no value. Expected {want}."
        quote = " Quote the value if it is meant as text." if kind == "string_type" else ""
        return f"expected {want}, got {describe(value)}.{quote}"
    bounds = {
        "greater_than_equal": ("must be at least", "ge"),
        "greater_than": ("must be greater than", "gt"),
        "less_than_equal": ("must be at most", "le"),
        "less_than": ("must be less than", "lt"),
    }
    if kind in bounds:
        words, key = bounds[kind]
        limit = ctx.get(key)
        if isinstance(limit, float) and limit.is_integer():
            limit = int(limit)
        return f"{words} {limit}, got {value}.{expected}"
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        close = did_you_mean(str(value), choices) if isinstance(value, str) else None
        mean = f" Did you mean '{close}'?" if close else ""
        return f"{describe(value)} is not allowed.{mean} Expected one of {', '.join(choices)}."
    msg = str(err.get("msg", "invalid value")).rstrip(".")
    return f"{msg[:1].lower()}{msg[1:]}, got {describe(value)}.{expected}"


@dataclass(frozen=True)
class _Where:
    key_line: int
    value_line: int
    scalar: bool


def _line_for(loc: tuple[Any, ...], kind: str, on_key: bool, lines: dict[tuple[Any, ...], _Where], root_line: int) -> int:
    """The line of the offending key (unknown/bad keys) or value; for a missing key the parent's."""
    path = tuple(loc)
    if kind == "missing":
        path, on_key = path[:-1], True
    path = _LOC_ALIASES.get(path, path) if path not in lines else path
    exact = True
    while path and path not in lines:
        path, exact = path[:-1], False
    if not path:
        return root_line
    where = lines[path]
    # A scalar's own line unless the key itself is at fault; a mapping or list: the line of its key.
    return where.key_line if (on_key and exact) or not where.scalar else where.value_line


def _issues_from(exc: ValidationError, filename: str, lines: dict[tuple[Any, ...], _Where], root_line: int) -> list[SpecIssue]:
    issues: list[SpecIssue] = []
    for err in exc.errors():
        raw = tuple(err["loc"])
        on_key = "[key]" in raw or err["type"] == "extra_forbidden"
        sub = tuple((err.get("ctx") or {}).get("sub", ())) if err["type"] == "spec" else ()
        loc = tuple(p for p in raw if p != "[key]") + sub
        line = _line_for(loc, err["type"], on_key, lines, root_line)
        issues.append(SpecIssue(filename, line, _dotted(loc), _explain(err, loc)))
    return issues


# ---------------------------------------------------------------------------------------------
# YAML: node tree -> (data, line map, duplicate-key issues)

_STR_TAG = "tag:yaml.org,2002:str"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_NUMBER_TAGS = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}


def _keeps_raw_text(path: tuple[Any, ...]) -> bool:
    """Values read verbatim when YAML sees a number: `cuda: 11.10` must not become "11.1", nor an
    env value `LR: 0.10` become "0.1"."""
    return (len(path) == 2 and path[0] == "env") or (
        len(path) == 2 and path[0] == "stack" and path[1] in {"driver", "cuda", "cudnn", "framework_version"}
    )


class _Builder:
    """Builds plain Python data from a composed YAML tree while recording each path's lines."""

    def __init__(self, loader: Any, filename: str) -> None:
        self.loader = loader
        self.filename = filename
        self.lines: dict[tuple[Any, ...], _Where] = {}
        self.issues: list[SpecIssue] = []
        self.bad_paths: set[str] = set()  # already reported (bad YAML value): skip the model's errors there
        self.count = 0

    def build(self, node: Node, path: tuple[Any, ...], key_line: int) -> Any:
        import yaml

        self.count += 1
        if self.count > _MAX_NODES_BUILT:
            raise _TooBig()
        value_line = node.start_mark.line + 1
        self.lines[path] = _Where(key_line, value_line, isinstance(node, yaml.ScalarNode))
        if isinstance(node, yaml.MappingNode):
            if node.tag != _MAP_TAG:
                self._issue(value_line, path, f"the YAML tag '{node.tag}' is not supported. Remove it")
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _SEQ_TAG:
                self._issue(value_line, path, f"the YAML tag '{node.tag}' is not supported. Remove it")
            return [self.build(item, (*path, i), item.start_mark.line + 1) for i, item in enumerate(node.value)]
        if node.tag in _NUMBER_TAGS and (_keeps_raw_text(path) or ":" in node.value):
            # YAML 1.1 reads 1:30 as the base-60 number 90: nobody means that in a job file, so the
            # text goes to the validator, which says what it expected (e.g. 1h30m for a duration).
            return node.value
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.MarkedYAMLError:
            raise
        except (ValueError, TypeError, AttributeError):  # e.g. `!!int abc`, `!!timestamp nonsense`
            tag = str(node.tag).rsplit(":", 1)[-1]
            self._issue(value_line, path, f"'{node.value}' is not a valid !!{tag} value. Remove the '!!{tag}' tag or fix the value")
            self.bad_paths.add(_dotted(path))
            return None

    def _mapping(self, node: Any, path: tuple[Any, ...]) -> dict[str, Any]:
        import yaml

        out: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        merged: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE_TAG:  # `<<: *defaults`: explicit keys win over merged ones
                sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                own = self.lines[path]
                for source in sources:
                    built = self.build(source, path, line)
                    if isinstance(built, dict):
                        merged = {**built, **merged}
                self.lines[path] = own  # building the anchor re-recorded this path at the anchor
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self._issue(line, path, "a key must be a plain name, not a list or mapping")
                continue
            key = key_node.value  # keys are names: `1:` or `yes:` stay the text that was written
            if key in first_line:
                self._issue(
                    line,
                    (*path, key),
                    f"duplicate key '{key}' on lines {first_line[key]} and {line}. YAML would silently "
                    "keep only the last one; remove one of them",
                )
            first_line[key] = line
            out[key] = self.build(value_node, (*path, key), line)
        return {**merged, **out}

    def _issue(self, line: int, path: tuple[Any, ...], message: str) -> None:
        self.issues.append(SpecIssue(self.filename, line, _dotted(path), message + "."))


class _TooBig(Exception):
    """The document expands to more nodes than any job file has (alias bomb)."""


def _line_text(text: str, line: int | None) -> str:
    lines = text.splitlines()
    return lines[line - 1] if line and 0 < line <= len(lines) else ""


def _yaml_error(filename: str, exc: Exception, text: str) -> SpecError:
    """A PyYAML error as one line with its line number."""
    import yaml

    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        what = exc.problem or "invalid YAML"
        context = ""
        if exc.context:
            at = f" on line {exc.context_mark.line + 1}" if exc.context_mark else ""
            context = f" ({exc.context}{at})"
        if "expected a single document" in f"{what} {exc.context or ''}":
            advice = "A job file holds one YAML document: remove the extra '---' part"
        elif "could not determine a constructor" in what:
            advice = "Job files use plain YAML: remove the '!' tag"
        elif "\t" in what or "\t" in _line_text(text, line):
            advice = "YAML does not allow tabs for indentation: use spaces"
        else:
            advice = "Check the indentation, the colons and the quoting around this line"
        return SpecError([SpecIssue(filename, line, "", f"invalid YAML: {what}{context}. {advice}.")])
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        return SpecError(
            [SpecIssue(filename, line, "", f"invalid YAML: the character {exc.character!r} is not allowed in YAML text. Remove it.")]
        )
    return SpecError([SpecIssue(filename, None, "", f"invalid YAML: {exc}.")])


def _compose(text: str, filename: str) -> tuple[Any, _Builder]:
    """Compose the YAML text and build data + line map, turning every YAML failure into SpecError."""
    import yaml

    loader = yaml.SafeLoader(text)
    builder = _Builder(loader, filename)
    try:
        node = loader.get_single_node()
        data = None if node is None else builder.build(node, (), node.start_mark.line + 1)
    except (yaml.YAMLError, ValueError, TypeError, AttributeError) as exc:
        # ValueError & co.: PyYAML constructors choking on e.g. `!!timestamp nonsense`
        if isinstance(exc, yaml.YAMLError):
            raise _yaml_error(filename, exc, text) from None
        raise SpecError([SpecIssue(filename, None, "", f"invalid YAML value: {exc}.")]) from None
    except (RecursionError, _TooBig):
        raise SpecError(
            [SpecIssue(filename, None, "", "the YAML document is nested or aliased far too deeply to be a job file.")]
        ) from None
    finally:
        loader.dispose()
    return data, builder


# ---------------------------------------------------------------------------------------------
# Public API


def parse_spec(text: str, filename: str) -> JobSpec:
    """Parse and validate job-file text; `filename` is only used in messages. Raises SpecError
    listing every problem (file, line, field, what is wrong and what was expected)."""
    data, builder = _compose(text, filename)
    minimal = "Expected at least name, resources.gpu and run, e.g.\n  name: mnist-k80\n  resources: {gpu: K80:1}\n  run: python train.py"
    if data is None:
        raise SpecError([SpecIssue(filename, 1, "", f"the job file is empty. {minimal}")])
    if not isinstance(data, dict):
        line = builder.lines[()].value_line
        raise SpecError(
            [SpecIssue(filename, line, "", f"the job file must be a mapping of keys (name, resources, run, ...), but it is {describe(data)}. {minimal}")]
        )
    issues = list(builder.issues)
    root_line = builder.lines[()].value_line
    for key in _INPUT_ONLY_EXCLUDED & data.keys():
        text = _unknown_key_message(key, ())
        issues.append(SpecIssue(filename, builder.lines[(key,)].key_line, key, text if text.endswith("?") else text + "."))
        del data[key]
    spec: JobSpec | None = None
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        issues.extend(i for i in _issues_from(exc, filename, builder.lines, root_line) if i.field not in builder.bad_paths)
    if issues or spec is None:
        raise SpecError(issues)
    return spec


def load_spec(path: str | Path) -> JobSpec:
    """Read, parse and validate a job file; `spec.source` is its resolved path. Raises SpecError."""
    name = str(path)
    p = Path(path)

    def fail(message: str, line: int | None = None) -> NoReturn:
        raise SpecError([SpecIssue(name, line, "", message if message.endswith(".") else message + ".")])

    if p.is_dir():
        fail("is a directory, not a job file. Pass the YAML file itself, e.g. " + str(p / "job.yaml"))
    try:
        with p.open("rb") as fh:
            raw = fh.read(_MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        fail(f"no such file. Check the path (relative paths start at {Path.cwd()})")
    except PermissionError:
        fail("cannot be read: permission denied. Check the file's permissions")
    except OSError as exc:
        fail(f"cannot be read: {exc.strerror or exc}. Check the path")
    if len(raw) > _MAX_FILE_BYTES:
        fail(f"is larger than {_MAX_FILE_BYTES // 1024} KiB, far too big for a job file. Check the path")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        fail(f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}). Save the job file as UTF-8", line)
    spec = parse_spec(text, name)
    spec.source = p.resolve()
    return spec


def json_schema() -> dict[str, Any]:
    """JSON Schema of the *input* form (what people write: "K80:1", "6h", "any"), for YAML editors."""
    schema = JobSpec.model_json_schema(mode="validation")
    schema["properties"].pop("source", None)
    sections = {"": schema, **{k.lower(): v for k, v in schema.get("$defs", {}).items()}}
    for dotted, hint in _HINTS.items():  # editors show these on hover
        parent, _, key = dotted.rpartition(".")
        section = {"": "", "resources": "resources", "resources.gpu": "gpurequest", "stack": "stackspec"}.get(parent)
        prop = sections.get(section, {}).get("properties", {}).get(key) if section is not None else None
        if prop is not None:
            prop.setdefault("description", hint[:1].upper() + hint[1:] + ("" if hint.endswith(".") else "."))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **{k: v for k, v in schema.items() if k != "title"},
        "title": "gpucloud job file",
    }
