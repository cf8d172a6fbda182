"""resources.disk_gb below the OS disk of the VM's image is refused before anything of the run is
created, with the image's size and the fix (ARM's own refusal comes only at the VM create, after
the group and network, and names neither). The fake ARM serves image versions with a settable OS
disk size and refuses such a VM itself, as ARM does."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpucloud.contract.provider import FatalProvisionError, ProvisionError
from gpucloud.providers.azure.machine import image_reference
from tests.support.azure_fixtures import (  # noqa: F401  (fixtures)
    arm,
    fake_arm_server,
    journal,
    launch_request,
    provider,
    run_resources,
)
from tests.support.fake_arm import FakeArm

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _urn(req: Any) -> dict[str, str]:
    return image_reference(req.image_ref, req.ubuntu, req.instance_type, req.gpu, req.image)


def test_a_disk_below_the_image_is_refused_before_any_create(arm: FakeArm, provider: Any, journal: Any) -> None:
    req = launch_request("disk-small")
    image = _urn(req)
    arm.images.set(f"{image['publisher']}:{image['offer']}:{image['sku']}", 64)
    small = replace(req, disk_gb=50)
    with pytest.raises(FatalProvisionError) as exc:
        provider.provision(small, journal)
    text = f"{exc.value} {exc.value.hint}"
    assert "resources.disk_gb is 50 GB" in text and "has a 64 GB OS disk" in text, text
    assert "Set resources.disk_gb to 64 or more" in text
    with arm.lock:
        assert [p for m, p, _w in arm.calls if m == "PUT"] == [], "nothing was created"
        reads = [p for m, p, _w in arm.calls if m == "GET" and "/artifacttypes/vmimage/" in p.lower()]
    assert len(reads) == 2  # `latest` resolved, then that version read
    assert run_resources(arm, "disk-small") == []


def test_a_disk_at_the_image_size_launches(arm: FakeArm, provider: Any, journal: Any) -> None:
    req = launch_request("disk-fits")
    image = _urn(req)
    arm.images.set(f"{image['publisher']}:{image['offer']}:{image['sku']}", 64)
    handle = provider.provision(replace(req, disk_gb=64), journal)
    assert handle.nodes
    provider.teardown(handle, journal, wait=True)


def test_an_unreadable_image_size_is_no_refusal_and_arm_still_refuses(
    arm: FakeArm, provider: Any, journal: Any
) -> None:
    req = launch_request("disk-unread")
    image = _urn(req)
    arm.images.set(f"{image['publisher']}:{image['offer']}:{image['sku']}", 64)
    arm.inject("GET", r"/artifacttypes/vmimage/", code="InternalServerError", times=20)
    with pytest.raises(ProvisionError) as exc:
        provider.provision(replace(req, disk_gb=50), journal)
    assert not isinstance(exc.value, FatalProvisionError) or "OS disk" not in str(exc.value)
    assert "smaller than the size of the corresponding disk" in str(exc.value)  # ARM's own, at the VM create
