"""Providers create and destroy machines; everything else in a run is shared (lifecycle, channel)."""

from __future__ import annotations

from gpucloud.providers.base import Provider


def get_provider(cloud: str, **kwargs: object) -> Provider:
    """Import the provider lazily: `gpucloud --help` must not import boto3 or azure."""
    if cloud == "local":
        from gpucloud.providers.local import LocalProvider

        return LocalProvider(**kwargs)  # type: ignore[arg-type]
    if cloud == "aws":
        from gpucloud.providers.aws import AwsProvider

        return AwsProvider(**kwargs)  # type: ignore[arg-type]
    if cloud == "azure":
        from gpucloud.providers.azure import AzureProvider

        return AzureProvider(**kwargs)  # type: ignore[arg-type]
    raise ValueError(f"unknown cloud {cloud!r}")
