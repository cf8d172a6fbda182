"""`inputs:` with `mode: mount` (docs/DATA.md): end to end on the local provider with real rclone and
FUSE against moto (S3) and Azurite (Blob), the machine's S3 credentials (an STS federation token
whose session policy is proved with the project's IAM evaluator), and the failures a user sees.

A run mounts an s3:// and an az:// folder, its job digests the files through the mounts (compared
with the objects), cannot write them, and nothing is left after it: no mount in /proc/mounts, no
rclone process, no copy of an object on the caller's disk.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpucloud.errors import UserError
from gpucloud.providers.aws import mount as s3_mount
from gpucloud.run.data_grants import check
from gpucloud.spec.load import parse_spec
from gpucloud.vm.agent import mounts
from gpucloud.vm.agent.stage_api import StageFailed
from tests.support.azurite import Azurite, azurite  # noqa: F401
from tests.support.cli import cli
from tests.support.containers import ContainerLab, container_lab  # noqa: F401
from tests.support.data_files import DIGEST_PY, blob_container, digest, make_files, use_azurite
from tests.support.iam_eval import Request, decide
from tests.support.local_runs import run_id_of, write_job
from tests.support.moto_server import Moto, moto, moto_server  # noqa: F401
from tests.support.procs import gpucloud_until_started

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (shutil.which("rclone") and shutil.which("fusermount3") and os.path.exists("/dev/fuse")),
        reason="needs rclone and FUSE (.ci/run installs rclone and fuse3)",
    ),
]

BASE = "name: m\nresources: {cloud: local}\nrun: x\n"


def rclone_left(token: str) -> list[str]:
    """rclone processes whose command line names `token` (a path under the test's folders)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if b"rclone" in cmd and token.encode() in cmd and state not in ("Z", "X"):
            found.append(f"{entry.name}: {cmd!r}")
    return found


def mounts_under(root: Path) -> list[str]:
    return [p for p in mounts.mounted_paths() if p.startswith(os.path.realpath(root))]


def test_s3_and_az_folders_mounted_read_only_and_nothing_left(
    tmp_path: Path, gpucloud_home: Path, moto: Moto, azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="gc-mount-in")
    files = make_files(12, 0.3)
    for rel, body in files.items():
        s3.put_object(Bucket="gc-mount-in", Key=f"set/{rel}", Body=body)
    s3.put_object(Bucket="gc-mount-in", Key="settings/not-this", Body=b"x")
    use_azurite(azurite, monkeypatch)
    blobs = make_files(5, 0.1)
    src = blob_container(azurite, "gc-mount-az")
    for rel, body in blobs.items():
        src.upload_blob(f"val/{rel}", body, overwrite=True)  # type: ignore[attr-defined]
    acct = azurite.account_name
    val = tmp_path / "val-mount"  # an absolute machine path, outside the job's folder
    run = f"python digest.py data && python digest.py {val} && " + (
        "(touch data/new 2>/dev/null && echo WRITABLE || echo READ-ONLY) && ls data"
    )
    inputs = {
        "data/": {"source": "s3://gc-mount-in/set", "mode": "mount"},
        str(val): {"source": f"az://{acct}/gc-mount-az/val", "mode": "mount"},
    }
    job = write_job(tmp_path / "job", {"name": "mnt", "inputs": inputs, "run": run}, files={"digest.py": DIGEST_PY})

    plan = cli("plan", str(job), cwd=tmp_path)
    said = " ".join(plan.stderr.split())
    assert plan.returncode == 0, plan.stderr
    assert "mounted read-only (not copied): data/ <- s3://gc-mount-in/set" in said and "to copy" not in said, said
    doc = json.loads(cli("plan", str(job), "--json", cwd=tmp_path, check=True).stdout)
    assert doc["data"]["inputs"][0] == {
        "path": "data/",
        "source": "s3://gc-mount-in/set",
        "mode": "mount",
        "files": None,
        "bytes": None,
    }

    proc = cli("run", str(job), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = run_id_of(proc.stderr)
    log = (gpucloud_home / "runs" / run_id / "log.txt").read_text()
    assert f"DIGEST data {len(files)} {digest(files)}" in log, log[-3000:]
    assert f"DIGEST {val} {len(blobs)} {digest(blobs)}" in log, log[-3000:]
    assert "inputs: data/: mounted s3://gc-mount-in/set read-only" in log
    assert f"mounted az://{acct}/gc-mount-az/val read-only" in log
    assert "READ-ONLY" in log and "WRITABLE" not in log
    assert "inputs: data/: unmounted" in log
    assert "settings" not in log.split("READ-ONLY", 1)[1]  # the listing shows the named folder only
    assert mounts_under(gpucloud_home) == [] and mounts_under(tmp_path) == []
    assert rclone_left(str(gpucloud_home)) == [] and rclone_left(str(tmp_path)) == []
    names = {Path(rel).name for rel in [*files, *blobs]}
    on_disk = [p for base in (gpucloud_home, tmp_path) for p in base.rglob("*") if p.name in names]
    assert on_disk == [], on_disk  # read through the mount: never copied, on the node or the caller
    assert not any(val.iterdir())


def test_missing_rclone_fails_the_inputs_stage(tmp_path: Path, gpucloud_home: Path, moto: Moto) -> None:
    """The machine's PATH without rclone: the run ends in error at `inputs`, saying what to do."""
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="gc-mount-norc")
    s3.put_object(Bucket="gc-mount-norc", Key="set/a", Body=b"a")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        for tool in Path(folder).glob("*") if Path(folder).is_dir() else []:
            if tool.name != "rclone" and not (bin_dir / tool.name).exists():
                (bin_dir / tool.name).symlink_to(tool)
    job = write_job(
        tmp_path / "job",
        {"name": "norc", "inputs": {"data/": {"source": "s3://gc-mount-norc/set", "mode": "mount"}}, "run": "ls data"},
    )
    env_path = os.environ["PATH"]
    os.environ["PATH"] = str(bin_dir)
    try:
        proc = cli("run", str(job), cwd=tmp_path, timeout=300)
    finally:
        os.environ["PATH"] = env_path
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0
    assert "inputs: data/: mode: mount needs rclone and FUSE on the machine" in said, said[-2000:]
    assert "or use mode: copy" in said
    assert mounts_under(gpucloud_home) == []


def test_s3_session_policy_reads_only_the_named_folder() -> None:
    policy = s3_mount.session_policy("gc-in", "set")
    ok = [
        Request("s3:GetObject", "arn:aws:s3:::gc-in/set/a.bin"),
        Request("s3:GetObject", "arn:aws:s3:::gc-in/set/sub/b.bin"),
        Request("s3:ListBucket", "arn:aws:s3:::gc-in", {"s3:prefix": "set/"}),
        Request("s3:ListBucket", "arn:aws:s3:::gc-in", {"s3:prefix": "set/sub/"}),
    ]
    denied = [
        Request("s3:GetObject", "arn:aws:s3:::gc-in/settings/a"),
        Request("s3:GetObject", "arn:aws:s3:::gc-in/other/a"),
        Request("s3:GetObject", "arn:aws:s3:::gc-other/set/a"),
        Request("s3:ListBucket", "arn:aws:s3:::gc-in", {"s3:prefix": "other/"}),
        Request("s3:ListBucket", "arn:aws:s3:::gc-in", {"s3:prefix": "settings"}),
        Request("s3:ListBucket", "arn:aws:s3:::gc-in"),  # the whole bucket
        Request("s3:PutObject", "arn:aws:s3:::gc-in/set/a.bin"),
        Request("s3:DeleteObject", "arn:aws:s3:::gc-in/set/a.bin"),
        Request("s3:GetObjectAcl", "arn:aws:s3:::gc-in/set/a.bin"),
    ]
    assert [decide(policy, r) for r in ok] == ["Allow"] * len(ok)
    assert [decide(policy, r) for r in denied] == ["ImplicitDeny"] * len(denied)
    whole = s3_mount.session_policy("gc-in", "")
    assert decide(whole, Request("s3:ListBucket", "arn:aws:s3:::gc-in")) == "Allow"
    assert decide(whole, Request("s3:PutObject", "arn:aws:s3:::gc-in/a")) == "ImplicitDeny"


def test_s3_mount_grant_ends_at_the_deadline(moto: Moto) -> None:
    """The node's document: a federation token for the folder, DurationSeconds from the deadline
    (clamped to STS's 15 min .. 36 h), the endpoint the caller used (moto here)."""
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="gc-mount-grant")
    s3.put_object(Bucket="gc-mount-grant", Key="set/a", Body=b"a")
    spec = parse_spec(BASE + "inputs: {d/: {source: s3://gc-mount-grant/set, mode: mount}}\n", "job.yaml")
    plan = check(spec)
    assert plan.as_json()["inputs"][0]["mode"] == "mount" and plan.inputs[0].files == []
    deadline = datetime.now(UTC) + timedelta(hours=2)
    doc = plan.grants(None, "m-20260101-000000-abcd", 0, 1, deadline.timestamp())
    (item,) = doc["inputs"]
    grant = item["mount"]
    assert (item["dest"], grant["bucket"], grant["prefix"], grant["endpoint"]) == (
        "d/",
        "gc-mount-grant",
        "set/",
        moto.endpoint,
    )
    assert grant["access_key_id"] and grant["secret_access_key"] and grant["session_token"]
    assert plan.grants(None, "m-20260101-000000-abcd", 1, 2, deadline.timestamp())["inputs"][0]["mount"] == grant
    now = datetime.now(UTC)
    assert abs(s3_mount.token_seconds(deadline, now) - 7200) <= 1
    assert s3_mount.token_seconds(now + timedelta(minutes=3), now) == 900
    assert s3_mount.token_seconds(now + timedelta(days=3), now) == 129600
    long = parse_spec(
        BASE + "max_duration: 2d\ninputs: {d/: {source: s3://gc-mount-grant/set, mode: mount}}\n", "job.yaml"
    )
    with pytest.raises(UserError, match="at most 36 hours"):
        check(long)


def test_mount_sources_checked_before_launch(moto: Moto) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="gc-mount-chk")
    s3.put_object(Bucket="gc-mount-chk", Key="one.bin", Body=b"a")
    for source, words in [
        ("s3://gc-mount-nope/set", "gc-mount-nope"),
        ("s3://gc-mount-chk/empty", "no objects under s3://gc-mount-chk/empty/"),
        ("s3://gc-mount-chk/one.bin", "is one object: mode: mount mounts a folder"),
    ]:
        spec = parse_spec(BASE + f"inputs: {{d/: {{source: {source}, mode: mount}}}}\n", "job.yaml")
        with pytest.raises(UserError, match=words):
            check(spec)


def test_iam_policy_data_adds_the_federation_token(tmp_path: Path) -> None:
    job = write_job(
        tmp_path / "job", {"name": "pol", "inputs": {"d/": {"source": "s3://gc-in/set", "mode": "mount"}}, "run": "x"}
    )
    policy = json.loads(cli("iam-policy", "aws", "--data", str(job), cwd=tmp_path, check=True).stdout)
    data = {"Statement": [s for s in policy["Statement"] if s["Sid"].startswith("Data")]}
    assert decide(data, Request("sts:GetFederationToken", "arn:aws:sts::123456789012:federated-user/gc-x")) == "Allow"
    assert decide(data, Request("s3:GetObject", "arn:aws:s3:::gc-in/set/a")) == "Allow"
    assert decide(data, Request("s3:ListBucket", "arn:aws:s3:::gc-in")) == "Allow"
    assert decide(data, Request("s3:GetObject", "arn:aws:s3:::gc-in/other/a")) == "ImplicitDeny"
    assert decide(data, Request("s3:PutObject", "arn:aws:s3:::gc-in/set/a")) == "ImplicitDeny"


def test_credentials_that_cannot_federate_are_refused_before_launch(
    moto: Moto, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller whose IAM identity may read the bucket but not call GetFederationToken (on AWS: also
    any role or SSO session) is told before launch to use an IAM user's keys or mode: copy."""
    from gpucloud.providers.aws.session import reset_shared
    from tests.support.moto_iam import enforced, iam_user

    s3 = moto.client("s3")
    s3.create_bucket(Bucket="gc-mount-iam")
    s3.put_object(Bucket="gc-mount-iam", Key="set/a", Body=b"a")
    reads = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::gc-mount-iam"},
            {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::gc-mount-iam/set/*"},
        ],
    }
    spec = parse_spec(BASE + "inputs: {d/: {source: s3://gc-mount-iam/set, mode: mount}}\n", "job.yaml")
    with enforced(moto):
        for key, value in iam_user(moto, "gc-mount-reader", reads).items():
            monkeypatch.setenv(key, value)
        reset_shared()
        try:
            with pytest.raises(UserError) as exc:
                check(spec)
            copy = parse_spec(BASE + "inputs: {d/: s3://gc-mount-iam/set}\n", "job.yaml")
            assert [f[0] for f in check(copy).inputs[0].files] == ["a"]  # the same keys can copy it
        finally:
            reset_shared()
    text = exc.value.render()
    assert "inputs.d/" in text and "GetFederationToken" in text, text
    assert "long-term IAM user credentials" in text and "mode: copy" in text, text


def test_a_mount_that_cannot_list_fails_without_showing_its_grant(tmp_path: Path, azurite: Azurite) -> None:
    """rclone mounts lazily: a grant the store refuses shows at the first listing, which fails the
    stage with rclone's words, the grant masked; what was mounted is unmounted by the record."""
    bad = "se=2099-01-01&sp=rl&sv=2021-08-06&sr=c&sig=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA%3D"
    _container_plain(azurite, "gc-mount-bad")
    grant = {
        "type": "azureblob",
        "container": "gc-mount-bad",
        "prefix": "",
        "sas_url": f"{azurite.blob_endpoint}/gc-mount-bad?{bad}",
    }
    doc = {"inputs": [{"dest": "data/", "source": "az://x/gc-mount-bad", "mount": grant}]}
    job_dir, vm_dir = tmp_path / "job", tmp_path
    job_dir.mkdir()
    lines: list[str] = []
    with pytest.raises(StageFailed) as exc:
        mounts.mount_inputs(doc, job_dir, vm_dir, dict(os.environ), lines.append, time.sleep)
    text = str(exc.value)
    assert text.startswith("inputs: data/: az://x/gc-mount-bad is mounted but cannot be listed"), text
    assert "AAAAAAAAAAAA" not in text and "sig=" not in text, text
    assert "RESPONSE Status: 403" in text, text
    mounts.unmount_recorded(vm_dir, lines.append)
    assert mounts_under(tmp_path) == [] and rclone_left(str(tmp_path)) == []
    assert lines == ["inputs: data/: unmounted"] and not (vm_dir / mounts.RECORD).exists()
    (job_dir / "data" / "keep").write_text("x")
    with pytest.raises(StageFailed, match="not empty"):
        mounts.mount_inputs(doc, job_dir, vm_dir, dict(os.environ), lines.append, time.sleep)


def _container_plain(azurite: Azurite, name: str) -> None:
    from azure.storage.blob import BlobServiceClient

    svc = BlobServiceClient(
        azurite.blob_endpoint, credential={"account_name": azurite.account_name, "account_key": azurite.account_key}
    )
    client = svc.get_container_client(name)
    if not client.exists():
        client.create_container()
    client.upload_blob("a", b"a", overwrite=True)


@pytest.mark.parametrize("end", ["deadline", "ctrl-c"])
def test_every_end_of_the_run_unmounts(tmp_path: Path, gpucloud_home: Path, moto: Moto, end: str) -> None:
    """The deadline (the watchdog process ends the run) and Ctrl-C (the teardown stops the node)
    leave no mount and no rclone behind, like a run that succeeds."""
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="gc-mount-end")
    s3.put_object(Bucket="gc-mount-end", Key="set/a", Body=b"a")
    doc = {
        "name": f"end-{end}",
        "inputs": {"data/": {"source": "s3://gc-mount-end/set", "mode": "mount"}},
        "run": "cat data/a && echo; echo started; sleep 300",
        **({"max_duration": "8s"} if end == "deadline" else {}),
    }
    job = write_job(tmp_path / "job", doc)
    proc = gpucloud_until_started(["run", str(job)], tmp_path)
    assert len(mounts_under(gpucloud_home)) == 1 and rclone_left(str(gpucloud_home))  # mounted while it runs
    secret = rclone_secret(str(gpucloud_home))
    assert len(secret) >= 16
    if end == "ctrl-c":
        proc.send_signal(signal.SIGINT)
    rc = proc.wait(60)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert rc == (124 if end == "deadline" else 130), stderr
    assert mounts_under(gpucloud_home) == [] and rclone_left(str(gpucloud_home)) == []
    log = (gpucloud_home / "runs" / run_id_of(stderr) / "log.txt").read_text()
    assert "inputs: data/: unmounted" in log, log[-2000:]
    leaks = [
        p
        for base in (gpucloud_home, tmp_path)
        for p in base.rglob("*")
        if p.is_file() and secret.encode() in p.read_bytes()
    ]
    assert leaks == [] and secret not in stderr, leaks  # in rclone's environment only


def rclone_secret(token: str) -> str:
    """The secret key of the running rclone under `token`: in its environment, not its command line."""
    (entry,) = [e.split(":")[0] for e in rclone_left(token)]
    cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
    env = dict(kv.split("=", 1) for kv in Path(f"/proc/{entry}/environ").read_bytes().decode().split("\0") if "=" in kv)
    secret = env[f"RCLONE_CONFIG_{mounts.REMOTE}_SECRET_ACCESS_KEY"]
    assert secret.encode() not in cmd and b"RCLONE" not in cmd and b"secret" not in cmd.lower()
    assert env[f"RCLONE_CONFIG_{mounts.REMOTE}_SESSION_TOKEN"]
    return secret


def test_a_killed_rclone_leaves_a_mount_the_teardown_removes(tmp_path: Path, azurite: Azurite) -> None:
    """A machine lost at once (SIGKILL to everything, the local provider's `kill(grace=0)`) leaves
    a dead FUSE mount; the teardown's unmount_recorded removes it from the record alone."""
    from gpucloud.providers.azure.data import Store

    _container_plain(azurite, "gc-mount-kill")
    os.environ["GPUCLOUD_AZURE_BLOB_ENDPOINT"] = azurite.blob_endpoint
    os.environ["AZURE_STORAGE_KEY"] = azurite.account_key
    try:
        grant = Store(azurite.account_name).mount_grant("gc-mount-kill", "", datetime.now(UTC) + timedelta(hours=1))
    finally:
        del os.environ["GPUCLOUD_AZURE_BLOB_ENDPOINT"], os.environ["AZURE_STORAGE_KEY"]
    doc = {"inputs": [{"dest": "data", "source": "az://x/gc-mount-kill", "mount": grant}]}
    (tmp_path / "job").mkdir()
    assert mounts.mount_inputs(doc, tmp_path / "job", tmp_path, dict(os.environ), print, time.sleep) == 1
    assert (tmp_path / "job" / "data" / "a").read_bytes() == b"a"
    (entry,) = json.loads((tmp_path / mounts.RECORD).read_text())
    os.kill(entry["pid"], signal.SIGKILL)
    os.waitpid(entry["pid"], 0)
    assert mounts_under(tmp_path) == [entry["path"]]  # dead, still mounted
    mounts.unmount_recorded(tmp_path)
    assert mounts_under(tmp_path) == [] and not (tmp_path / mounts.RECORD).exists()


def test_a_container_job_reads_the_mount(
    tmp_path: Path, gpucloud_home: Path, moto: Moto, container_lab: ContainerLab
) -> None:
    """The job's folder is bind-mounted into the container recursively: the input's mount under it
    is seen inside the image (busybox here), read-only; an absolute one is its own bind."""
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="gc-mount-box")
    s3.put_object(Bucket="gc-mount-box", Key="set/sub/a.txt", Body=b"boxed-mount-line\n")
    abs_dest = tmp_path / "abs-mount"
    job = write_job(
        tmp_path / "job",
        {
            "name": "boxmount",
            "container": {"image": container_lab.image},
            "inputs": {
                "data/": {"source": "s3://gc-mount-box/set", "mode": "mount"},
                str(abs_dest): {"source": "s3://gc-mount-box/set/sub", "mode": "mount"},
            },
            "run": f"test ! -d /usr && cat data/sub/a.txt && cat {abs_dest}/a.txt && "
            "(touch data/x 2>/dev/null && echo WRITABLE || echo READ-ONLY)",
        },
    )
    proc = cli("run", str(job), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (gpucloud_home / "runs" / run_id_of(proc.stderr) / "log.txt").read_text()
    assert log.count("boxed-mount-line") == 2 and "READ-ONLY" in log and "WRITABLE" not in log, log[-2000:]
    assert mounts_under(gpucloud_home) == [] and mounts_under(tmp_path) == []
    assert rclone_left(str(gpucloud_home)) == []
