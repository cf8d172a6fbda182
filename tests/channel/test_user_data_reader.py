"""A principal that can read a VM's user-data cannot write the run's result (docs/SECURITY.md,
"Channel grants and user-data"), through the real CLI against moto (S3 + EC2) and Azurite + the
fake ARM server, with the VM simulators running the real bootstrap.

The reader does what `ec2:DescribeInstanceAttribute` (AWS ReadOnlyAccess) allows: it reads the
instance's user-data, follows its manifest URL, and uses the grants in the manifest to write a
forged status.json (state succeeded, exit code 0) and a forged artifacts tarball, over and over
until the CLI ends, once without a key of its own and once claiming the node with its own key and
signing its forgeries. The job's real result is exit code 3. The CLI must never report exit 0
and never bring back the forged artifact. On Azure custom data is write-only in the API (the fake
ARM server keeps it so); the test reads it from the fake server, i.e. it plays a stronger reader
(one with access to the VM's disk or custom data)."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.aws_runs import aws_env, start_hooked_cli  # noqa: F401
from tests.support.aws_runs import write_aws_job as aws_job
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.azure_fixtures import (  # noqa: F401  (fixtures)
    arm,
    azure_env,
    azurite,
    fake_arm_server,
)
from tests.support.azure_runs import write_azure_job as azure_job
from tests.support.azure_sim import AzureVmSimulator, azure_sim  # noqa: F401
from tests.support.cli import start_cli
from tests.support.fake_arm import FakeArm
from tests.support.moto_server import Moto, moto, moto_server  # noqa: F401
from tests.support.text import flat
from tests.support.user_data_reader import put_with_grant, read_grants, upload_file, user_data_script

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
JOB = "'echo real > out.txt; sleep 12; exit 3'"  # time for the reader to act
FORGED: list[float] = []  # when the reader's forgeries landed


def _forged_artifacts() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("forged.txt")
        info.size = 7
        tar.addfile(info, io.BytesIO(b"forged\n"))
    return buf.getvalue()


def _claim(grants: dict[str, str], headers: tuple[str, ...]) -> Callable[[bytes], bytes]:
    """Claim the node with the reader's own key; returns the signer for forged statuses."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from gpucloud.channel.trust import fingerprint

    key = Ed25519PrivateKey.generate()
    pub = base64.b64encode(
        key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    ).decode()
    path = upload_file((pub + "\n").encode())
    if "claim_append" in grants:
        done = subprocess.run(
            [
                "curl",
                "-fsS",
                "-o",
                "/dev/null",
                "-T",
                path,
                "-H",
                "x-ms-version: 2022-11-02",
                grants["claim_append"] + "&comp=appendblock",
            ],
            capture_output=True,
            check=False,
        )
    else:
        form = [a for f in grants.get("fields", "").splitlines() for a in ("--form-string", f.replace(" ", "=", 1))]
        done = subprocess.run(
            [
                "curl",
                "-fsS",
                "-o",
                "/dev/null",
                *form,
                "--form-string",
                f"key={grants['log_post_key']}claim-{fingerprint(pub)}",
                "-F",
                f"file=@{path}",
                grants["log_post"],
            ],
            capture_output=True,
            check=False,
        )
    assert done.returncode == 0, f"the reader's claim failed: {done.stderr!r}"

    def sign(doc: bytes) -> bytes:
        sig = base64.b64encode(key.sign(doc)).decode()
        return doc[:-2] + f',"sig":"{sig}"}}\n'.encode()

    del headers
    return sign


def _forge(
    grants: dict[str, str],
    headers: tuple[str, ...],
    run_id: str,
    stop: threading.Event,
    claim: bool,
    node_claimed: Callable[[], bool],
) -> None:
    """With `claim`, the reader claims at once (before or after the machine, whichever is first) but
    forges only once the machine has claimed too: a signed forgery that lands before the machine's
    first claim is the race docs/SECURITY.md says this design does not close."""
    import hashlib

    art = _forged_artifacts()
    sign = _claim(grants, headers) if claim else (lambda doc: doc)
    FORGED.clear()
    end = time.monotonic() + 120
    while claim and not node_claimed() and time.monotonic() < end and not stop.is_set():
        time.sleep(0.05)
    while not stop.is_set():
        doc = (
            json.dumps(
                {
                    "run_id": run_id,
                    "rank": 0,
                    "state": "succeeded",
                    "stage": "done",
                    "stages": {},
                    "heartbeat": int(time.time()),
                    "exit_code": 0,
                    "message": "",
                    "log_parts": 0,
                    "log_bytes": 0,
                    "artifacts_sha256": hashlib.sha256(art).hexdigest(),
                },
                separators=(",", ":"),
            ).encode()
            + b"\n"
        )
        put_with_grant(grants["artifacts_put"], art, headers)
        put_with_grant(grants["status_put"], sign(doc), headers)
        FORGED.append(time.time())
        stop.wait(0.3)


def _node_claimed(sim: AwsVmSimulator | AzureVmSimulator, before: set[str]) -> Callable[[], bool]:
    """Whether the run's machine has published its own claim (the agent's claim.done marker)."""

    def claimed() -> bool:
        with sim.lock:
            new = [g for vm_id, g in sim.guests.items() if vm_id not in before]
        return any(next(g.sandbox.rglob("claim.done"), None) for g in new)

    return claimed


def _play(
    proc: subprocess.Popen[str],
    read_user_data: Callable[[], bytes | None],
    headers: tuple[str, ...],
    claim: bool,
    node_claimed: Callable[[], bool],
) -> tuple[int, str, str]:
    end = time.monotonic() + 90
    raw = None
    while raw is None and time.monotonic() < end and proc.poll() is None:
        raw = read_user_data()
        time.sleep(0.2)
    assert raw is not None, "the VM never showed up"
    grants = read_grants(user_data_script(raw))
    run_id = grants["status_put"].split("/runs/", 1)[1].split("/", 1)[0]
    stop = threading.Event()
    forger = threading.Thread(target=_forge, args=(grants, headers, run_id, stop, claim, node_claimed), daemon=True)
    forger.start()
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        stop.set()
        forger.join(10)
    return proc.returncode, out, err


def _check(rc: int, out: str, err: str, cwd: Path) -> None:
    assert FORGED, "the reader never managed to write: the test proves nothing"
    assert rc != 0 and rc in (3, 65), err[-3000:]
    assert not list(cwd.rglob("forged.txt")), "the forged artifact was brought back"
    if rc == 65:
        assert "results are not trusted" in flat(err), err[-3000:]


@pytest.mark.parametrize("claim", [False, True], ids=["no-key", "own-key"])
def test_aws_user_data_reader_cannot_forge_the_result(
    aws_env: dict[str, str],
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,
    tmp_path: Path,  # noqa: F811
    claim: bool,
) -> None:
    spec = aws_job(tmp_path / "job.yaml", run=JOB, artifacts="[out.txt]")
    before = set(aws_sim.booted)
    proc = start_hooked_cli(aws_env, "run", str(spec), "--cloud", "aws")
    ec2 = moto.client("ec2")

    def user_data() -> bytes | None:
        new = [i for i in aws_sim.booted if i not in before]
        if not new:
            return None
        attr = ec2.describe_instance_attribute(InstanceId=new[0], Attribute="userData")
        value = attr.get("UserData", {}).get("Value")
        return base64.b64decode(value) if value else None

    rc, out, err = _play(proc, user_data, (), claim, _node_claimed(aws_sim, before))
    _check(rc, out, err, tmp_path)
    if claim:
        assert rc == 65 and "different keys claim" in err, err[-3000:]


@pytest.mark.parametrize("claim", [False, True], ids=["no-key", "own-key"])
def test_azure_custom_data_reader_cannot_forge_the_result(
    azure_env: dict[str, str],
    arm: FakeArm,  # noqa: F811
    azure_sim: AzureVmSimulator,
    tmp_path: Path,  # noqa: F811
    claim: bool,
) -> None:
    spec = azure_job(tmp_path / "job.yaml", run=JOB, artifacts="[out.txt]")
    before = {r.id for r in arm.vms()}
    known = set(azure_sim.guests)
    proc = start_cli("run", str(spec), "--cloud", "azure", env=azure_env)

    def user_data() -> bytes | None:
        new = [r for r in arm.vms() if r.id not in before]
        text = arm.custom_data(new[0].id) if new else None
        return text.encode() if text else None

    rc, out, err = _play(proc, user_data, ("x-ms-blob-type: BlockBlob",), claim, _node_claimed(azure_sim, known))
    _check(rc, out, err, tmp_path)
    if claim:
        assert rc == 65 and "different keys claim" in err, err[-3000:]
