"""A principal that can read the VMs' user-data cannot steer a multi-node run's rendezvous
(docs/SECURITY.md, "Multi-node rendezvous"), through the real CLI against moto (S3 + EC2) and
Azurite + the fake ARM server, with the VM simulators running the real bootstrap.

The reader takes rank 0's manifest from the user-data and PUTs a `ready` for rank 0 that points at
a machine of its own, over and over, from before the nodes meet. Rank 1 reaches the barrier a few
seconds after rank 0 (its setup sleeps), so what it reads of rank 0 is the forgery: it must refuse
it (the address is not signed by the key that claims rank 0, read through the channel's own
`claims_get` grant: a presigned S3 listing, an Azure read SAS on the claim blob) and the run must
fail closed naming rank 0. With nobody forging, the same 2-node run checks every peer and succeeds.
"""

from __future__ import annotations

import base64
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.aws_runs import aws_env, start_hooked_cli  # noqa: F401
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.azure_fixtures import (  # noqa: F401  (fixtures)
    arm,
    azure_env,
    azurite,
    fake_arm_server,
)
from tests.support.azure_sim import AzureVmSimulator, azure_sim  # noqa: F401
from tests.support.cli import start_cli
from tests.support.fake_arm import FakeArm
from tests.support.moto_server import Moto, moto, moto_server  # noqa: F401
from tests.support.text import flat
from tests.support.user_data_reader import put_with_grant, read_grants, user_data_script

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
FORGED_ADDRESS = "6.6.6.6"
SETUP = "'if [ \"$GPUCLOUD_NODE_RANK\" = 1 ]; then sleep 6; fi'"
RUN = "'echo \"rank $GPUCLOUD_NODE_RANK master $MASTER_ADDR\"'"


def _job(path: Path, cloud: str, region: str) -> Path:
    path.write_text(
        f"name: mn-ready\nresources:\n  cloud: {cloud}\n  regions: [{region}]\n  gpu: T4:1\nnum_nodes: 2\n"
        f"setup: {SETUP}\nrun: {RUN}\nmax_duration: 10m\n"
    )
    return path


def _rank0_grants(scripts: list[str]) -> dict[str, str] | None:
    """Rank 0's manifest, from whichever user-data leads to it (one shared script, or one per node)."""
    for script in scripts:
        grants = read_grants(script)
        if "/node-0/" in grants["ready_put"]:
            return grants
    return None


def _forge(grants: dict[str, str], headers: tuple[str, ...], stop: threading.Event, count: list[int]) -> None:
    while not stop.is_set():
        put_with_grant(grants["ready_put"], f"{FORGED_ADDRESS}\n".encode(), headers)
        count.append(1)
        stop.wait(0.1)


def _play(
    proc: subprocess.Popen[str], user_data: Callable[[], list[bytes]], headers: tuple[str, ...], forge: bool
) -> tuple[int, str, dict[str, str], int]:
    end = time.monotonic() + 90
    grants = None
    while grants is None and time.monotonic() < end and proc.poll() is None:
        grants = _rank0_grants([user_data_script(raw) for raw in user_data()])
        time.sleep(0.1)
    assert grants is not None, "rank 0's machine never showed up"
    stop, count = threading.Event(), [0]
    forger = threading.Thread(target=_forge, args=(grants, headers, stop, count), daemon=True)
    if forge:
        forger.start()
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        stop.set()
        if forge:
            forger.join(10)
    return proc.returncode, out + err, grants, len(count)


def _check(rc: int, out: str, grants: dict[str, str], forged: int, forge: bool) -> None:
    text = flat(out)
    if forge:
        assert forged, "the reader never managed to write: the test proves nothing"
        assert rc != 0, out[-4000:]
        assert "node 0's address is not signed by the key in it" in text, out[-4000:]
        assert f"master {FORGED_ADDRESS}" not in text
        assert grants.get("claims_get", "").startswith("0 "), "rank 0's manifest lets it read no peer's claims"
    else:
        assert rc == 0, out[-4000:]
        assert "each checked against its claim" in text, out[-4000:]
        assert "[node 1] rank 1 master 127.0.0.1" in text, out[-4000:]
    assert grants.get("claims_get", "").startswith("0 "), "rank 0's manifest lets it read no peer's claims"


@pytest.mark.parametrize("forge", [True, False], ids=["forged", "honest"])
def test_aws_forged_ready_is_refused_and_signed_ones_meet(
    aws_env: dict[str, str],  # noqa: F811
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    tmp_path: Path,
    forge: bool,
) -> None:
    spec = _job(tmp_path / "job.yaml", "aws", "us-east-1")
    before = set(aws_sim.booted)
    proc = start_hooked_cli(aws_env, "run", str(spec), "--cloud", "aws")
    ec2 = moto.client("ec2")

    def user_data() -> list[bytes]:
        out = []
        for iid in [i for i in aws_sim.booted if i not in before]:
            value = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData").get("UserData", {})
            if value.get("Value"):
                out.append(base64.b64decode(value["Value"]))
        return out

    rc, out, grants, forged = _play(proc, user_data, (), forge)
    _check(rc, out, grants, forged, forge)


@pytest.mark.parametrize("forge", [True, False], ids=["forged", "honest"])
def test_azure_forged_ready_is_refused_and_signed_ones_meet(
    azure_env: dict[str, str],  # noqa: F811
    arm: FakeArm,  # noqa: F811
    azure_sim: AzureVmSimulator,  # noqa: F811
    tmp_path: Path,
    forge: bool,
) -> None:
    spec = _job(tmp_path / "job.yaml", "azure", "eastus")
    before = {r.id for r in arm.vms()}
    proc = start_cli("run", str(spec), "--cloud", "azure", env=azure_env)

    def user_data() -> list[bytes]:
        texts = [arm.custom_data(r.id) for r in arm.vms() if r.id not in before]
        return [t.encode() for t in texts if t]

    rc, out, grants, forged = _play(proc, user_data, ("x-ms-blob-type: BlockBlob",), forge)
    _check(rc, out, grants, forged, forge)
