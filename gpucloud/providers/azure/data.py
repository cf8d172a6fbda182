"""`inputs:`/`outputs:` on Azure Blob (docs/DATA.md): the caller's check before launch (the
container, the blobs under a prefix) and the machine's grants, expiring at the run's deadline: a
read-only SAS per input blob (those blobs only: no list, no write), a read/list SAS on the
container of a mounted input (`mode: mount`: rclone's `sas_url`), and for each output prefix a
create/write-only SAS on its container (no read, list or delete; Blob SAS cannot narrow a plain
container to a prefix, so a job should have its own output container or accept that the grant
covers new blobs anywhere in it). With an account key (AZURE_STORAGE_KEY, or
AZURE_STORAGE_CONNECTION_STRING) the SAS is a service SAS; otherwise a user-delegation SAS from
the caller's Entra ID sign-in (needs Storage Blob Data Reader/Contributor and the delegation key
permission). GPUCLOUD_AZURE_BLOB_ENDPOINT points at another endpoint (Azurite).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from gpucloud.errors import UserError
from gpucloud.providers.azure.access import SAS_MAX_S, default_credential, pipeline_kwargs
from gpucloud.providers.azure.provider import BLOB_ENDPOINT_ENV

CLOCK_SKEW = timedelta(minutes=15)
MAX_SAS = timedelta(seconds=SAS_MAX_S)


def _account_key(account: str) -> str | None:
    conn = os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")
    parts = dict(p.split("=", 1) for p in conn.split(";") if "=" in p)
    if parts.get("AccountName") == account and parts.get("AccountKey"):
        return parts["AccountKey"]
    return os.environ.get("AZURE_STORAGE_KEY") or None


def account_url(account: str) -> str:
    endpoint = os.environ.get(BLOB_ENDPOINT_ENV, "").rstrip("/")
    return endpoint if endpoint else f"https://{account}.blob.core.windows.net"


class Store:
    """One storage account as the caller sees it."""

    def __init__(self, account: str) -> None:
        from azure.storage.blob import BlobServiceClient

        self.account, self.url = account, account_url(account)
        self.key = _account_key(account)
        cred: Any = {"account_name": account, "account_key": self.key} if self.key else default_credential()
        self.service = BlobServiceClient(self.url, credential=cred, **pipeline_kwargs())
        self._delegation: Any = None

    def _container(self, container: str, where: str) -> Any:
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        client = self.service.get_container_client(container)
        try:
            client.get_container_properties()
        except ResourceNotFoundError:
            raise UserError(
                f"{where}: container '{container}' does not exist in storage account '{self.account}'.",
                hint="Check az://ACCOUNT/CONTAINER/prefix in the job file.",
            ) from None
        except AzureError as exc:
            raise UserError(
                f"{where}: cannot read container '{container}' of storage account '{self.account}': "
                f"{str(exc).splitlines()[0]}.",
                hint="Set AZURE_STORAGE_KEY, or sign in with a role that can read the container.",
            ) from None
        return client

    def list_input(self, container: str, prefix: str, where: str) -> list[tuple[str, int, str]]:
        client = self._container(container, where)
        if prefix and not prefix.endswith("/"):
            one = [b for b in client.list_blobs(name_starts_with=prefix) if b.name == prefix]
            if one:
                return [("", int(one[0].size), prefix)]
            prefix += "/"
        files = [
            (b.name[len(prefix) :], int(b.size), b.name)
            for b in client.list_blobs(name_starts_with=prefix or None)
            if not b.name.endswith("/")
        ]
        if not files:
            raise UserError(
                f"{where}: no blobs under az://{self.account}/{container}/{prefix}.",
                hint="Check the prefix in the job file.",
            )
        return files

    def check_mount(self, container: str, prefix: str, where: str) -> None:
        """`mode: mount`: the container, and blobs under the folder (one is enough)."""
        client = self._container(container, where)
        pre = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
        if next(iter(client.list_blobs(name_starts_with=pre or None, results_per_page=1)), None) is None:
            raise UserError(
                f"{where}: no blobs under az://{self.account}/{container}/{pre}.",
                hint="Check the prefix in the job file.",
            )

    def mount_grant(self, container: str, prefix: str, expires: datetime) -> dict[str, Any]:
        """rclone's `sas_url` for a read-only mount: read and list on the container (a service SAS
        cannot be narrowed to a prefix, so the machine can read the whole container), no write."""
        sas = self._sas(container, None, expires, read=True, list=True)
        pre = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
        return {"type": "azureblob", "container": container, "prefix": pre, "sas_url": f"{self.url}/{container}?{sas}"}

    def check_output(self, container: str, where: str) -> None:
        self._container(container, where)

    def _sas(self, container: str, blob: str | None, expires: datetime, **perm: bool) -> str:
        from azure.storage.blob import (
            BlobSasPermissions,
            ContainerSasPermissions,
            generate_blob_sas,
            generate_container_sas,
        )

        start = datetime.now(UTC) - CLOCK_SKEW
        expires = min(expires, datetime.now(UTC) + MAX_SAS)
        auth: dict[str, Any] = {"account_key": self.key}
        if not self.key:
            if self._delegation is None:
                self._delegation = self.service.get_user_delegation_key(start, expires)
            auth = {"user_delegation_key": self._delegation}
        https = "https" if self.url.startswith("https://") else None
        if blob is None:
            return generate_container_sas(
                self.account,
                container,
                permission=ContainerSasPermissions(**perm),
                expiry=expires,
                start=start,
                protocol=https,
                **auth,
            )
        return generate_blob_sas(
            self.account,
            container,
            blob,
            permission=BlobSasPermissions(**perm),
            expiry=expires,
            start=start,
            protocol=https,
            **auth,
        )

    def input_urls(self, container: str, names: list[str], expires: datetime) -> list[str]:
        return [f"{self.url}/{container}/{quote(n)}?{self._sas(container, n, expires, read=True)}" for n in names]

    def output_grant(self, container: str, prefix: str, expires: datetime) -> dict[str, Any]:
        """`PUT <url>/<prefix><path>?<sas>` with x-ms-blob-type: BlockBlob, per file."""
        sas = self._sas(container, None, expires, create=True, write=True)
        return {"style": "put", "url": f"{self.url}/{container}", "sas": sas, "prefix": prefix}
