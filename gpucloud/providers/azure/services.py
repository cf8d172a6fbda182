"""Azure's capability services (gpucloud/contract/services.py): Blob containers as inputs and
outputs (data.py) and Azure Container Registry pull tokens (acr.py), found through the registry."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Any

from gpucloud.contract.services import DataStore, Files, ImageLogin
from gpucloud.errors import UserError
from gpucloud.providers.azure import acr
from gpucloud.providers.azure.access import SAS_MAX_S

STORE_ENV = ("AZURE_STORAGE_KEY", "AZURE_STORAGE_CONNECTION_STRING", "AZURE_CLIENT_ID")


class BlobStore(DataStore):
    """az://ACCOUNT/CONTAINER/prefix inputs and outputs: SAS grants (data.Store, made when first asked)."""

    @classmethod
    def credentials_found(cls) -> bool:
        """A storage key, a service principal, or an `az login` sign-in."""
        return any(os.environ.get(name) for name in STORE_ENV) or (Path.home() / ".azure").is_dir()

    @classmethod
    def mount_limit(cls, max_duration: int, where: str) -> None:
        """A mounted container is read through one SAS: a job longer than its life is refused."""
        if max_duration > SAS_MAX_S:
            raise UserError(
                f"{where}: mode: mount on Azure Blob reads through a SAS that lasts {SAS_MAX_S // 86400} days at "
                f"most, and max_duration is {max_duration / 86400:g} days.",
                hint="Lower max_duration to 7d or less, or use mode: copy for this input.",
            )

    @classmethod
    def grant_life_s(cls, cloud: str) -> int | None:
        """Every node reaches your storage through SAS grants: its identity has no role there."""
        return SAS_MAX_S

    def _store(self) -> Any:
        from gpucloud.providers.azure.data import Store

        return Store(self.account)

    def list_input(self, bucket: str, prefix: str, where: str) -> tuple[str, Files]:
        return "", self._store().list_input(bucket, prefix, where)

    def check_output(self, bucket: str, where: str) -> str:
        self._store().check_output(bucket, where)
        return ""

    def check_mount(self, bucket: str, prefix: str, where: str) -> str:
        self._store().check_mount(bucket, prefix, where)
        return ""

    def input_urls(self, bucket: str, region: str, keys: list[str], expires: datetime) -> list[str]:
        return self._store().input_urls(bucket, keys, expires)

    def output_grant(self, bucket: str, region: str, prefix: str, expires: datetime) -> dict[str, Any]:
        return self._store().output_grant(bucket, prefix, expires)

    def mount_grant(
        self, bucket: str, prefix: str, region: str, run_id: str, expires: datetime, where: str
    ) -> dict[str, Any]:
        return self._store().mount_grant(bucket, prefix, expires)


class AcrLogin(ImageLogin):
    """An image in Azure Container Registry: a refresh token for the caller's Entra ID token."""

    def __init__(self, registry: str) -> None:
        self.registry = registry

    def pull_token(self, where: str) -> tuple[str, str, float | None]:
        return acr.pull_token(self.registry, where)


def acr_login(registry: str, repository: str, tag: str | None, digest: str | None) -> AcrLogin | None:
    """The image's ACR login, or None when its registry is not an Azure Container Registry."""
    return AcrLogin(registry) if acr.is_acr(registry) else None
