"""Azure: one resource group per run and region, VMs that delete their own group, a Blob channel
(docs/INTERNALS.md, "Providers"; facts in docs/PROVIDERS.md).

Module map: access (bounded client settings, the credential, errors that make Azure unusable:
CredentialsError / EndpointError), errors (ARM error codes -> ProvisionError kinds), machine (image reference, SSH key,
power state), channel (BlobChannel, SAS URLs), provider (AzureProvider), network (the attempt's
group, NSG, VNet, placement group), nodes (each node's resources, one thread per node), roles (the
VM's self-delete role assignment), arm (what those steps need from the provider). No azure SDK
import at import time.
"""

from gpucloud.providers.azure.errors import classify_error, quota_family
from gpucloud.providers.azure.machine import SUBNET_PREFIX, image_reference
from gpucloud.providers.azure.provider import AzureProvider, resource_group_name
from gpucloud.providers.azure.roles import CONTRIBUTOR_ROLE_ID

__all__ = [
    "CONTRIBUTOR_ROLE_ID",
    "SUBNET_PREFIX",
    "AzureProvider",
    "classify_error",
    "image_reference",
    "quota_family",
    "resource_group_name",
]
