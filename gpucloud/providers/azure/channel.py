"""Azure Blob backend of the run channel: per-object SAS URLs the VM uses with plain curl.

One storage account (StorageV2, HTTPS only, TLS 1.2, no anonymous blob access) and one private
container per subscription and region, created on first use in the resource group
`gpucloud-storage-<region>`. That group carries no expiry tag: it outlives runs, and `gc` never
touches it; each run's objects live under `runs/<run_id>/`.

The storage account is managed through ARM's generic resource API and `listKeys` with explicit
api-versions (azure-mgmt-resource's client), which spares a dependency on azure-mgmt-storage.
The data plane uses the account key from `listKeys` both to write (code, manifests) and to sign
service SAS URLs that expire with the run (7 days at most). The manifest also says `node_identity
managed`: the node sends the same requests with its managed identity's token (node_access.py,
gpucloud/vm/agent/blob_token.py), so its channel outlives the SAS URLs and the account key.

A node's log is one append blob (`runs/<run_id>/node-<rank>/log.append`), created empty by
`prepare`; the VM holds one SAS URL for it with the add permission only and appends its log in
blocks of at most LOG_PART_MAX bytes (Append Block), so the manifest does not grow with the run's
length. Readers take byte ranges up to status.json's `log_bytes`.

`GPUCLOUD_AZURE_BLOB_ENDPOINT` replaces the account's blob endpoint (e.g. a storage emulator at
`http://127.0.0.1:10000/devstoreaccount1`). A path-style endpoint names its account in the path,
and that is the account the URLs are signed for; the key still comes from `listKeys`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from gpucloud.channel import trust as channel_trust
from gpucloud.channel.run_objects import LOG_PART_MAX, Channel, ObjectRefused, node_prefix
from gpucloud.errors import UserError
from gpucloud.providers.azure.access import SAS_MAX_S, pipeline_kwargs
from gpucloud.vm.agent.blob_token import IDENTITY_LINE

STORAGE_API = "2023-05-01"
CONTAINER = "gpucloud"
# SAS validity starts a little in the past: the VM's or the storage service's clock may lag ours.
CLOCK_SKEW = timedelta(minutes=15)
# A SAS URL lives at most as long as S3's SigV4 presigned URLs (providers/aws/channel.py MAX_PRESIGN): a leaked
# manifest is useless after a week whatever the job's max_duration says.
MAX_SAS = timedelta(seconds=SAS_MAX_S)


def log_blob(run_id: str, rank: int) -> str:
    """The node's append blob: its whole log, in the order the VM appended it."""
    return f"{node_prefix(run_id, rank)}/log.append"


def storage_group_name(region: str) -> str:
    return f"gpucloud-storage-{region}"


def storage_account_name(subscription_id: str, region: str) -> str:
    """Globally unique, stable per subscription and region, 3-24 lowercase letters and digits."""
    return "gpuc" + hashlib.sha256(f"{subscription_id}:{region}".encode()).hexdigest()[:20]


def account_from_endpoint(url: str) -> str:
    """The account a blob endpoint serves: the first path segment for path-style endpoints
    (emulators, IP addresses), else the first label of the host name."""
    parts = urlsplit(url)
    segment = parts.path.strip("/").split("/")[0]
    return segment or (parts.hostname or "").split(".")[0]


def _refuse_public(account: Any, name: str, group: str) -> None:
    """An existing channel account must not allow anonymous blob access (someone changed it, or
    an older API default left it on): the run's code and artifacts would be one setting away
    from public. Unset counts as allowed, as it did before API version 2019-04-01."""
    props = account.properties if isinstance(account.properties, dict) else {}
    if props.get("allowBlobPublicAccess", True) is not False:
        raise UserError(
            f"The storage account {name} (resource group {group}) that holds gpucloud's run channel allows "
            "public blob access.",
            hint=f"Turn it off: az storage account update --name {name} --resource-group {group} "
            "--allow-blob-public-access false",
        )


class BlobChannel(Channel):
    """A container in one storage account, addressed by the channel's keys."""

    put_headers = ("x-ms-blob-type: BlockBlob",)

    def __init__(
        self, *, account_url: str, account_key: str, container: str = CONTAINER, account_name: str | None = None
    ) -> None:
        from azure.storage.blob import BlobServiceClient

        self.account_url = account_url.rstrip("/")
        self.account_name = account_name or account_from_endpoint(self.account_url)
        self.account_key = account_key
        self.container = container
        # Bounded like the ARM clients (docs/PROVIDERS.md, "Azure calls and retries"); uploads of
        # the code tarball go in blocks, each answered well within the read timeout.
        self._service = BlobServiceClient(
            self.account_url,
            credential={"account_name": self.account_name, "account_key": account_key},
            **pipeline_kwargs(),
        )
        self._container = self._service.get_container_client(container)
        self._https = self.account_url.lower().startswith("https://")

    # ---- creation -------------------------------------------------------------------------------
    @classmethod
    def for_region(
        cls,
        resource_client: Any,
        *,
        subscription_id: str,
        region: str,
        blob_endpoint: str | None = None,
        credential: Any = None,
    ) -> BlobChannel:
        """Find or create the region's storage account and container, then open the channel."""
        from azure.core.exceptions import ResourceNotFoundError
        from azure.core.rest import HttpRequest

        group = storage_group_name(region)
        name = storage_account_name(subscription_id, region)
        account_id = (
            f"/subscriptions/{subscription_id}/resourceGroups/{group}"
            f"/providers/Microsoft.Storage/storageAccounts/{name}"
        )
        try:
            account = resource_client.resources.get_by_id(account_id, api_version=STORAGE_API)
            _refuse_public(account, name, group)
        except ResourceNotFoundError:
            resource_client.resource_groups.create_or_update(
                group, {"location": region, "tags": {"gpucloud-role": "channel-storage"}}
            )
            account = resource_client.resources.begin_create_or_update_by_id(
                account_id,
                api_version=STORAGE_API,
                parameters={
                    "location": region,
                    "kind": "StorageV2",
                    "sku": {"name": "Standard_LRS"},
                    "tags": {"gpucloud-role": "channel-storage"},
                    "properties": {
                        "supportsHttpsTrafficOnly": True,
                        "minimumTlsVersion": "TLS1_2",
                        "allowBlobPublicAccess": False,
                        "allowSharedKeyAccess": True,
                        "accessTier": "Hot",
                    },
                },
            ).result()
        response = resource_client.send_request(HttpRequest("POST", f"{account_id}/listKeys?api-version={STORAGE_API}"))
        response.raise_for_status()
        keys = response.json().get("keys") or []
        if not keys:
            raise RuntimeError(f"storage account {name} returned no keys")
        props = account.properties if isinstance(account.properties, dict) else {}
        endpoint = (
            blob_endpoint
            or (props.get("primaryEndpoints") or {}).get("blob")
            or f"https://{name}.blob.core.windows.net/"
        )
        channel = cls(account_url=endpoint, account_key=keys[0]["value"], account_name=None if blob_endpoint else name)
        channel._ensure_container()
        return channel

    def _ensure_container(self) -> None:
        from azure.core.exceptions import ResourceExistsError

        try:
            self._container.create_container()  # private: no public access level
        except ResourceExistsError:
            if self._container.get_container_properties().public_access:  # made public by hand: undo
                self._container.set_container_access_policy(signed_identifiers={}, public_access=None)

    # ---- primitives -------------------------------------------------------------------------------
    def put_bytes(self, key: str, data: bytes) -> None:
        self._container.upload_blob(key, data, overwrite=True)

    def put_file(self, key: str, path: Path) -> None:
        with open(path, "rb") as fh:
            self._container.upload_blob(key, fh, overwrite=True, max_concurrency=4)

    def get_bytes(self, key: str, limit: int | None = None) -> bytes | None:
        """GET; with `limit`, at most `limit + 1` bytes are asked for, and a blob larger than the
        limit is refused by its size."""
        from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

        try:
            if limit is None:
                return self._container.download_blob(key).readall()
            blob = self._container.download_blob(key, offset=0, length=limit + 1)
        except ResourceNotFoundError:
            return None
        except HttpResponseError as exc:
            if exc.status_code == 416:  # a ranged read of an empty blob (a claim blob nobody appended to yet)
                return b""
            raise
        if blob.size > limit or (blob.properties.size or 0) > limit:
            raise ObjectRefused(f"{key} is larger than its cap of {limit} bytes ({blob.properties.size} bytes)")
        return blob.readall()

    def get_to_file(self, key: str, path: Path) -> bool:
        """Stream the blob to disk chunk by chunk (an artifacts tarball may be many GB)."""
        from azure.core.exceptions import ResourceNotFoundError

        try:
            stream = self._container.download_blob(key)
            with open(path, "wb") as out:
                out.writelines(stream.chunks())
        except ResourceNotFoundError:
            return False
        return True

    def _url(self, key: str, expires: datetime, **permission: bool) -> str:
        from azure.storage.blob import BlobSasPermissions, generate_blob_sas

        if expires.tzinfo is None:
            expires = expires.replace(tzinfo=UTC)
        expires = min(expires, datetime.now(UTC) + MAX_SAS)
        sas = generate_blob_sas(
            account_name=self.account_name,
            container_name=self.container,
            blob_name=key,
            account_key=self.account_key,
            permission=BlobSasPermissions(**permission),
            expiry=expires,
            start=datetime.now(UTC) - CLOCK_SKEW,
            protocol="https" if self._https else None,
        )
        return f"{self.account_url}/{self.container}/{quote(key)}?{sas}"

    def url_get(self, key: str, expires: datetime) -> str:
        return self._url(key, expires, read=True)

    def url_put(self, key: str, expires: datetime) -> str:
        return self._url(key, expires, create=True, write=True)

    signs = True

    def claim_grant(self, run_id: str, rank: int, expires: datetime) -> list[str]:
        """The node's claims: an empty append blob with an Append Block SAS (`a`): a key can be added,
        none replaced or removed."""
        key = f"{node_prefix(run_id, rank)}/claim.append"
        self._container.get_blob_client(key).create_append_blob()
        return [f"claim_append {self._url(key, expires, add=True)}"]

    def claims_url(self, run_id: str, rank: int, expires: datetime) -> str | None:
        """A read-only SAS (`r`) on the node's claim blob: its appended claim lines, nothing else."""
        return self._url(f"{node_prefix(run_id, rank)}/claim.append", expires, read=True)

    def claims(self, run_id: str, rank: int) -> list[tuple[str | None, bytes]]:
        """One claim per line of the append blob (capped)."""
        data = self.get_bytes(f"{node_prefix(run_id, rank)}/claim.append", limit=channel_trust.CLAIMS_MAX) or b""
        return [(None, line) for line in data.splitlines() if line.strip()]

    def log_grant(self, run_id: str, rank: int, expires: datetime) -> list[str]:
        """Create the node's empty append blob (replacing one of an earlier attempt) and grant
        only Append Block on it (SAS permission `a`: no read, no overwrite, no delete)."""
        key = log_blob(run_id, rank)
        self._container.get_blob_client(key).create_append_blob()
        # The node sends these requests with its managed identity's token (node_access.py); the
        # SAS URLs are the shim's first fetch and the fallback.
        return [IDENTITY_LINE, f"log_append {self._url(key, expires, add=True)}"]

    def iter_log(self, run_id: str, rank: int = 0, start: int = 0) -> Iterator[tuple[bytes, int]]:
        """(bytes, next byte offset) from byte `start` up to status.json's `log_bytes` (the VM
        bumps it only after an append succeeded), LOG_PART_MAX bytes per ranged read."""
        from azure.core.exceptions import ResourceNotFoundError

        status = self.read_status(run_id, rank)
        done = int(status.get("log_bytes") or 0) if status else 0
        pos = start
        while pos < done:
            length = min(LOG_PART_MAX, done - pos)
            try:
                data = self._container.download_blob(log_blob(run_id, rank), offset=pos, length=length).readall()
            except ResourceNotFoundError:
                return
            if not data:
                return
            pos += len(data)
            yield data, pos

    def delete_prefix(self, prefix: str) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        for blob in self._container.list_blobs(name_starts_with=prefix):
            try:
                self._container.delete_blob(blob.name)
            except ResourceNotFoundError:
                pass
