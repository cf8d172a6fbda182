"""Baked images on Azure: a managed image of a builder VM, listed and deleted.

The images live in one resource group per region, `gpucloud-images-<region>`, tagged
`gpucloud:kind=image` and never with a run tag, so neither a run's teardown (which deletes the
run's own group) nor `gc` (which sweeps groups by their run and expiry tags) touches them. A
managed image is taken from a deallocated, generalized VM (Azure's rule for managed images); the
builder is torn down right after, so generalizing it costs nothing. ARM calls go through the
provider's clients (GPUCLOUD_AZURE_ARM_ENDPOINT honoured; tests use tests/support/fake_arm.py).
"""

from __future__ import annotations

from typing import Any

from gpucloud.contract.provider import KIND_TAG, KIND_VALUE, BakedImage
from gpucloud.providers.azure.machine import needs_gen1

IMAGE_GROUP_PREFIX = "gpucloud-images-"
DEPROVISION = "waagent -deprovision+user -force"


def _vm_parts(vm_id: str) -> tuple[str, str]:
    """(resource group, VM name) of a VM resource id."""
    parts = vm_id.strip("/").split("/")
    return parts[parts.index("resourceGroups") + 1], parts[-1]


class AzureImageStore:
    """`ImageStore` for Azure managed images (Microsoft.Compute/images)."""

    def __init__(self, provider: Any = None) -> None:
        if provider is None:
            from gpucloud.providers.azure.provider import AzureProvider

            provider = AzureProvider()
        self._provider = provider

    @staticmethod
    def group(region: str) -> str:
        return f"{IMAGE_GROUP_PREFIX}{region}"

    def create_image(self, region: str, instance_id: str, name: str, tags: dict[str, str]) -> str:
        compute = self._provider.compute
        rg, vm_name = _vm_parts(instance_id)
        self._provider.resource.resource_groups.create_or_update(
            self.group(region), {"location": region, "tags": {KIND_TAG: KIND_VALUE}}
        )
        vm = compute.virtual_machines.get(rg, vm_name)
        size = vm.hardware_profile.vm_size if vm.hardware_profile else ""
        # Azure's generalize steps: deprovision inside the guest first (SSH host keys, the admin user,
        # cloud-init and agent state), then deallocate and generalize [azure-compute-docs generalize.yml].
        compute.virtual_machines.begin_run_command(
            rg, vm_name, {"commandId": "RunShellScript", "script": [DEPROVISION]}
        ).result()
        compute.virtual_machines.begin_deallocate(rg, vm_name).result()
        compute.virtual_machines.generalize(rg, vm_name)
        image = compute.images.begin_create_or_update(
            self.group(region),
            name,
            {
                "location": region,
                "tags": tags,
                "properties": {
                    "sourceVirtualMachine": {"id": instance_id},
                    "hyperVGeneration": "V1" if needs_gen1(size or "", "") else "V2",
                },
            },
        ).result()
        return str(image.id)

    def list_images(self, region: str) -> list[BakedImage]:
        from azure.core.exceptions import ResourceNotFoundError

        from gpucloud.contract.provider import HASH_TAG

        try:
            images = list(self._provider.compute.images.list_by_resource_group(self.group(region)))
        except ResourceNotFoundError:  # no image was ever baked in this region
            return []
        out = []
        for image in images:
            tags = dict(image.tags or {})
            if tags.get(KIND_TAG) == KIND_VALUE:
                out.append(
                    BakedImage(
                        ref=str(image.id),
                        region=region,
                        name=str(image.name),
                        stack_hash=tags.get(HASH_TAG, ""),
                        tags=tags,
                    )
                )
        return out

    def delete_image(self, region: str, ref: str) -> None:
        self._provider.compute.images.begin_delete(self.group(region), ref.rstrip("/").rsplit("/", 1)[-1]).result()
