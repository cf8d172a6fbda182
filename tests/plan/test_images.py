"""Image choice and per-VM install plan (gpucloud/plan/images.py), and the boot timeline."""

from __future__ import annotations

import re

import pytest

from gpucloud.plan.images import choose_image, load_images, resolve_node, vm_features
from gpucloud.plan.stacks import resolve_stack
from gpucloud.spec.load import StackSpec
from gpucloud.ui.timeline import format_nodes, format_timeline, human, stage_groups
from tests.support.source_tree import package_dir


def node(gpu: str, cloud: str, instance: str, count: int = 1, arch: str = "x86_64", **pins: object):
    return resolve_node(
        resolve_stack(gpu, StackSpec(framework="pytorch", **pins)), cloud, instance, count, cpu_arch=arch
    )


@pytest.mark.parametrize(
    ("gpu", "cloud", "instance", "count", "arch", "image", "source", "fabric"),
    [
        ("T4", "aws", "g4dn.xlarge", 1, "x86_64", "dlami-base-oss", "apt", False),
        ("A100-40GB", "aws", "p4d.24xlarge", 8, "x86_64", "dlami-base-oss", "apt", True),
        ("H100", "aws", "p5.4xlarge", 1, "x86_64", "dlami-base-oss", "apt", False),  # one GPU: no NVSwitch
        ("H100", "aws", "p5.48xlarge", 8, "x86_64", "dlami-base-oss", "apt", True),
        ("B200", "aws", "p6-b200.48xlarge", 8, "x86_64", "dlami-base-oss", "apt", True),
        ("V100", "aws", "p3.2xlarge", 1, "x86_64", "ubuntu-22.04", "apt", False),
        ("K80", "aws", "p2.xlarge", 1, "x86_64", "ubuntu-20.04", "apt", False),
        ("T4G", "aws", "g5g.xlarge", 1, "arm64", "dlami-base-oss-arm64", "apt", False),
        ("A10", "azure", "Standard_NV36ads_A10_v5", 1, "x86_64", "ubuntu-22.04-grid", "grid", False),
        ("M60", "azure", "Standard_NV12s_v3", 1, "x86_64", "ubuntu-22.04-grid", "grid", False),
        # the HPC image's documented R535 is below the default stack's floor (R570 for CUDA 12.8)
        ("A100-40GB", "azure", "Standard_ND96asr_v4", 8, "x86_64", "ubuntu-22.04", "apt", True),
        ("H100", "azure", "Standard_ND96isr_H100_v5", 8, "x86_64", "ubuntu-22.04", "apt", True),
        ("K80", "azure", "Standard_NC6", 1, "x86_64", "ubuntu-20.04", "apt", False),
    ],
)
def test_image_and_install_plan(
    gpu: str, cloud: str, instance: str, count: int, arch: str, image: str, source: str, fabric: bool
) -> None:
    n = node(gpu, cloud, instance, count, arch)
    assert n.image is not None and n.image.name == image
    assert n.driver_source == source and n.fabric_manager is fabric
    assert n.cuda_packages == n.cudnn_packages == ()  # the wheel bundles CUDA: driver only
    assert n.repo_arch == ("sbsa" if arch == "arm64" else "x86_64")
    assert n.driver_packages == (() if source == "grid" else resolve_stack(gpu).driver_packages)
    assert n.as_json()["image"]["source"]


def test_driver_range_follows_the_gpu_and_pins() -> None:
    assert (node("K80", "aws", "p2.xlarge").driver_min, node("K80", "aws", "p2.xlarge").driver_max) == (470, 470)
    v100 = node("V100", "aws", "p3.2xlarge")
    assert (v100.driver_min, v100.driver_max) == (575, 580)
    pinned = node("T4", "aws", "g4dn.xlarge", driver="570", cuda="12.8")
    assert (pinned.driver_min, pinned.driver_max) == (570, 570)
    assert pinned.image is not None and pinned.image.name == "ubuntu-22.04"  # the DLAMI's R595 is not the pin


def test_toolkit_only_when_asked_and_job_image_wins() -> None:
    asked = node("T4", "aws", "g4dn.xlarge", cuda_toolkit=True)
    assert asked.cuda_packages == ("cuda-toolkit-12-8",) and asked.cudnn_packages == ("cudnn9-cuda-12",)
    stack = resolve_stack("T4")
    own = choose_image(stack, "aws", "g4dn.xlarge", 1, job_image="ami-0123456789abcdef0")
    assert own is not None and own.ref == "ami-0123456789abcdef0" and own.found_by == "job file"


def test_vm_features_need_eight_gpus_for_nvswitch() -> None:
    assert vm_features("aws", "p4d.24xlarge", 8) == {"nvswitch"}
    assert vm_features("aws", "p5.4xlarge", 1) == frozenset()
    assert vm_features("azure", "Standard_NV6ads_A10_v5", 1) == {"grid"}
    assert vm_features("azure", "Standard_NC24ads_A100_v4", 1) == frozenset()


def test_every_image_row_has_a_source_and_date() -> None:
    for image in load_images():
        assert image.source and re.fullmatch(r"\d{4}-\d{2}", image.checked), image.name
        assert image.found_by in ("ssm", "urn")


def test_no_cloud_names_in_image_code() -> None:
    """Cloud facts live in data rows (DESIGN: outside providers/, code does not spell cloud names)."""
    root = package_dir()
    for module in ("gpucloud.plan.images", "gpucloud.plan.stacks", "gpucloud.plan.stack_data", "gpucloud.ui.timeline"):
        name = module.removeprefix("gpucloud.").replace(".", "/") + ".py"
        code = (root / name).read_text()
        assert not re.search(r"[\"'](aws|azure|local)[\"']", code), name


def test_timeline_groups_and_formats() -> None:
    stages = {
        "preflight": {"start": 100, "end": 101, "ok": True},
        "watchdog": {"start": 101, "end": 102, "ok": True},
        "stack": {"start": 102, "end": 222, "ok": True},
        "gpu_verify": {"start": 222, "end": 225, "ok": True},
        "fetch_code": {"start": 225, "end": 228, "ok": True},
        "run": {"start": 228, "end": None, "ok": None},
    }
    groups = stage_groups(stages, launched_at=0, now=3828)
    assert [(g, s) for g, s, _ in groups] == [("boot", 102), ("stack", 123), ("fetch", 3), ("run", 3600)]
    assert groups[-1][2] is True
    assert (
        format_timeline(stages, launched_at=0, now=3828) == "boot 1m42s · stack 2m03s · fetch 3s · run 1h00m (running)"
    )
    assert format_nodes([{"stages": stages}, None], now=3828)[0].startswith("node 0: boot 2s")
    assert human(4) == "4s" and format_timeline({}) == ""


def test_timeline_shows_the_input_copy_while_it_runs_and_the_outputs_stage() -> None:
    stages = {
        "preflight": {"start": 100, "end": 101, "ok": True},
        "fetch_code": {"start": 101, "end": 103, "ok": True},
        "inputs": {"start": 103, "end": None, "ok": None},
    }
    progress = {"files": 412, "of": 2000, "bytes": 61_800_000, "of_bytes": 300_000_000}
    line = format_nodes([{"stages": stages, "inputs": progress}], now=163)[0]
    assert line == "node 0: boot 1s · fetch 2s · inputs 1m00s (running) (inputs 412/2000 files, 61.8/300.0 MB)"
    stages["inputs"]["end"] = 170
    stages.update(run={"start": 170, "end": 200, "ok": True}, outputs={"start": 200, "end": 209, "ok": True})
    assert format_nodes([{"stages": stages, "inputs": progress}], now=300)[0] == (
        "node 0: boot 1s · fetch 2s · inputs 1m07s · run 30s · outputs 9s"
    )
    assert format_nodes([{"stages": stages, "inputs": "junk"}], now=300)[0].endswith("outputs 9s")
