"""Compatibility shim: the Blob channel moved to gpucloud/providers/azure/channel.py (remove once
nothing imports this path)."""

from gpucloud.providers.azure.channel import BlobChannel, account_from_endpoint, storage_account_name, storage_group_name

__all__ = ["BlobChannel", "account_from_endpoint", "storage_account_name", "storage_group_name"]
