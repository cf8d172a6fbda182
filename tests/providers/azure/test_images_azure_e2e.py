"""`gpucloud image build` then `run` on Azure through the real CLI, against the fake ARM server,
Azurite and the simulator: the builder VM is deallocated, generalized and
captured as a managed image in the `gpucloud-images-<region>` group, the builder's run group is
deleted, the next run boots the image and its stack stage installs nothing, `gc` keeps the image
and `image rm` deletes it. The simulator gives a VM booted from a managed image the disk of the
VM the image was taken of (tests/support/azure_sim.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.azure_fixtures import arm, azure_env, azurite, fake_arm_server  # noqa: F401
from tests.support.azure_runs import settle
from tests.support.azure_sim import AzureVmSimulator, azure_sim  # noqa: F401
from tests.support.cli import cli
from tests.support.fake_arm import FakeArm
from tests.support.text import flat
from tests.support.vm_sim import guest_calls, install_calls

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
IMAGES = "microsoft.compute/images"


def test_azure_image_build_then_run_installs_nothing(
    azure_env: dict[str, str],
    arm: FakeArm,  # noqa: F811
    azure_sim: AzureVmSimulator,
    tmp_path: Path,
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: azbaked\nresources:\n  cloud: azure\n  regions: [eastus]\n  gpu: T4:1\n"
        "stack: {framework: pytorch}\nmax_duration: 15m\nrun: echo first-line-of-the-job\n"
    )
    built = cli(
        "image",
        "build",
        str(job),
        "--cloud",
        "azure",
        "--region",
        "eastus",
        "--yes",
        "--json",
        timeout=300,
        env=azure_env,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-4000:]
    doc = json.loads(built.stdout.strip().splitlines()[-1])
    assert doc["built"] is True and "/gpucloud-images-eastus/" in doc["ref"].lower()
    builder = azure_sim.booted[-1]
    # the guest is deprovisioned (Run Command, while it runs) before it is deallocated and generalized
    assert [script for _, script in arm.run_commands] == [["waagent -deprovision+user -force"]]
    assert install_calls(guest_calls(azure_sim, builder)), "the builder installed the stack"
    settle(arm, azure_sim)
    groups = {r["id"].split("/")[4].lower() for r in arm.snapshot() if r["state"] != "Deleting"}
    assert groups <= {"gpucloud-images-eastus"} | {g for g in groups if g.startswith("gpucloud-storage-")}, groups

    plan = cli("plan", str(job), "--json", env=azure_env)
    assert json.loads(plan.stdout)["candidates"][0]["image"]["found_by"] == "baked"
    run = cli("run", str(job), "--json", timeout=300, env=azure_env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    node = azure_sim.booted[-1]
    assert node != builder
    calls = guest_calls(azure_sim, node)
    assert install_calls(calls) == [], calls  # 0 apt-get installs, 0 pip installs

    gc = cli("gc", "--yes", env=azure_env)
    assert gc.returncode == 0 and "1 baked image(s) kept" in flat(gc.stderr), gc.stderr
    assert [r for r in arm.snapshot() if r["type"].lower() == IMAGES]
    removed = cli("image", "rm", doc["ref"], "--cloud", "azure", "--region", "eastus", env=azure_env)
    assert removed.returncode == 0, removed.stderr
    settle(arm, azure_sim)
    assert not [r for r in arm.snapshot() if r["type"].lower() == IMAGES and r["state"] != "Deleting"]
