"""inputs:/outputs: end to end on the local provider against moto (S3) and Azurite (Blob), and the
grants the node gets (docs/DATA.md).

The job reads an input of many files from s3://, az:// and a local folder, checks every byte
(the digest of the whole input is printed by the job and compared here), writes an output
that goes straight to a bucket prefix and never to the caller's results folder or state; a wrong
bucket fails at plan time naming it. Sizes are scaled by GPUCLOUD_DATA_E2E_FILES / _MB (defaults
are smaller than the issue's 2,000 files / 300 MB so the suite stays quick on a shared machine).
"""

from __future__ import annotations

import base64
import json
import re
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpucloud.run.data_grants import check
from gpucloud.spec.load import parse_spec
from tests.support.azurite import Azurite, azurite  # noqa: F401
from tests.support.cli import cli
from tests.support.data_files import DIGEST_PY, FILES, TOTAL_MB, blob_container, digest, make_files, use_azurite
from tests.support.local_runs import run_id_of, write_job
from tests.support.moto_server import Moto, moto, moto_server  # noqa: F401

OUT_MB = max(1, int(TOTAL_MB * 2 / 3))
pytestmark = pytest.mark.slow


def job_for(tmp_path: Path, inputs: dict[str, str], outputs: dict[str, str]) -> Path:
    run = " && ".join(
        [
            *(f"python digest.py {dest}" for dest in inputs),
            f"mkdir -p out && head -c {OUT_MB}000000 /dev/urandom > out/model.bin",
        ]
    )
    return write_job(
        tmp_path / "job",
        {"name": "data", "inputs": inputs, "outputs": outputs, "run": run},
        files={"digest.py": DIGEST_PY},
    )


def caller_copies(tmp_path: Path, home: Path, name: str = "model.bin") -> list[str]:
    """Output files on the caller's side: its results folder, the state store's folder, the channel."""
    places = [tmp_path / "gpucloud-runs", home / "runs", home / "channel"]
    return [str(p) for base in places if base.exists() for p in base.rglob(name)]


def test_s3_and_local_inputs_and_s3_output(tmp_path: Path, gpucloud_home: Path, moto: Moto) -> None:
    s3 = moto.client("s3")
    for bucket in ("gc-data-in", "gc-data-out"):
        s3.create_bucket(Bucket=bucket)
    files = make_files()
    for rel, body in files.items():
        s3.put_object(Bucket="gc-data-in", Key=f"set/{rel}", Body=body)
    local = make_files(20, 1)
    for rel, body in local.items():
        (tmp_path / "job" / "local" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "job" / "local" / rel).write_bytes(body)
    job = job_for(tmp_path, {"data": "s3://gc-data-in/set", "ldata": "./local"}, {"out": "s3://gc-data-out/run1"})
    plan = cli("plan", str(job), cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert f"inputs: {FILES + 20} file(s)" in " ".join(plan.stderr.split())
    t0 = time.monotonic()
    proc = cli("run", str(job), cwd=tmp_path, timeout=600)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (gpucloud_home / "runs" / run_id_of(proc.stderr) / "log.txt").read_text()
    assert f"DIGEST data {FILES} {digest(files)}" in log, log[-3000:]
    assert f"DIGEST ldata 20 {digest(local)}" in log
    assert "inputs: " in log and "outputs: out: 1/1 files" in log
    summary = " ".join(proc.stderr.split())
    assert re.search(r"inputs \d+s", summary) and re.search(r"outputs \d+s", summary), summary[-1500:]
    objs = s3.list_objects_v2(Bucket="gc-data-out", Prefix="run1/")["Contents"]
    assert [(o["Key"], o["Size"]) for o in objs] == [("run1/model.bin", OUT_MB * 1000000)]
    assert caller_copies(tmp_path, gpucloud_home) == []
    collected = json.loads(cli("collect", run_id_of(proc.stderr), "--json", cwd=tmp_path).stdout)
    assert collected["outputs"] == [{"path": "out", "destination": "s3://gc-data-out/run1/"}]
    print(f"s3 e2e: {FILES} files, {TOTAL_MB} MB in, {OUT_MB} MB out, run took {took:.1f} s")


def test_wrong_bucket_fails_at_plan_naming_it(tmp_path: Path, gpucloud_home: Path, moto: Moto) -> None:
    job = job_for(tmp_path, {"data": "s3://gc-no-such-bucket/x"}, {})
    for cmd in ("plan", "run"):
        proc = cli(cmd, str(job), cwd=tmp_path)
        assert proc.returncode == 2 and "gc-no-such-bucket" in proc.stderr and "Traceback" not in proc.stderr
    assert not (gpucloud_home / "local").exists()
    moto.client("s3").create_bucket(Bucket="gc-data-in2")
    job = job_for(tmp_path, {"data": "s3://gc-data-in2/empty"}, {"out": "s3://gc-missing-out/x"})
    proc = cli("plan", str(job), cwd=tmp_path)
    assert proc.returncode == 2 and "s3://gc-data-in2/empty/" in proc.stderr


def test_s3_grants_name_only_the_job_files(tmp_path: Path, moto: Moto) -> None:
    """moto does not check presigned signatures, so this reads what was signed: one GET per named
    object, a POST policy that allows keys under the output prefix only, all expiring at the deadline."""
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="gc-grant-in")
    s3.create_bucket(Bucket="gc-grant-out")
    for key in ("named/a", "named/b", "other/c"):
        s3.put_object(Bucket="gc-grant-in", Key=key, Body=b"x")
    spec = parse_spec(
        "name: g\nresources: {cloud: local}\nrun: x\ninputs: {d: s3://gc-grant-in/named}\n"
        "outputs: {o: s3://gc-grant-out/res}\n",
        "job.yaml",
    )
    deadline = datetime.now(UTC) + timedelta(hours=1)
    doc = check(spec).grants(None, "r1", 0, 1, deadline.timestamp())
    urls = [f["url"] for f in doc["inputs"][0]["files"]]
    assert [u.split("?")[0].rsplit("/", 2)[-2:] for u in urls] == [["named", "a"], ["named", "b"]]
    assert all(abs(int(u.split("X-Amz-Expires=")[1].split("&")[0]) - 3600) <= 5 for u in urls)
    post = doc["outputs"][0]
    policy = json.loads(base64.b64decode(dict(post["fields"])["policy"]))
    assert ["starts-with", "$key", "res/"] in policy["conditions"]
    assert abs(datetime.fromisoformat(policy["expiration"].replace("Z", "+00:00")) - deadline) < timedelta(seconds=5)
    assert not any("Action" in json.dumps(c) for c in policy["conditions"])


def test_az_input_and_output(
    tmp_path: Path, gpucloud_home: Path, azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_azurite(azurite, monkeypatch)
    src, out = blob_container(azurite, "gc-in"), blob_container(azurite, "gc-out")
    files = make_files()
    for rel, body in files.items():
        src.upload_blob(f"set/{rel}", body, overwrite=True)  # type: ignore[attr-defined]
    acct = azurite.account_name
    job = job_for(tmp_path, {"data": f"az://{acct}/gc-in/set"}, {"out": f"az://{acct}/gc-out/run1"})
    proc = cli("run", str(job), cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (gpucloud_home / "runs" / run_id_of(proc.stderr) / "log.txt").read_text()
    assert f"DIGEST data {FILES} {digest(files)}" in log, log[-3000:]
    blobs = [(b.name, b.size) for b in out.list_blobs(name_starts_with="run1/")]  # type: ignore[attr-defined]
    assert blobs == [("run1/model.bin", OUT_MB * 1000000)]
    assert caller_copies(tmp_path, gpucloud_home) == []
    job = job_for(tmp_path, {"data": f"az://{acct}/gc-nope/set"}, {})
    proc = cli("plan", str(job), cwd=tmp_path)
    assert proc.returncode == 2 and "gc-nope" in proc.stderr


def _status(url: str, method: str = "GET", body: bytes | None = None) -> int:
    req = urllib.request.Request(url, method=method, data=body)
    if method == "PUT":
        req.add_header("x-ms-blob-type", "BlockBlob")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_az_grants_are_least_privilege_and_expire(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> None:
    """Azurite checks SAS signatures: the node's grants read only the named blobs, cannot write the
    input, cannot read or list the output, and stop working after the deadline."""
    use_azurite(azurite, monkeypatch)
    src, _ = blob_container(azurite, "gc-gin"), blob_container(azurite, "gc-gout")
    for name in ("named/a", "other/b"):
        src.upload_blob(name, b"data", overwrite=True)  # type: ignore[attr-defined]
    acct = azurite.account_name
    spec = parse_spec(
        f"name: g\nresources: {{cloud: local}}\nrun: x\ninputs: {{d: az://{acct}/gc-gin/named}}\n"
        f"outputs: {{o: az://{acct}/gc-gout/res}}\n",
        "job.yaml",
    )
    deadline = time.time() + 8
    doc = check(spec).grants(None, "r1", 0, 1, deadline)
    (read,) = [f["url"] for f in doc["inputs"][0]["files"]]
    base, sas = read.split("?")
    assert _status(read) == 200
    assert _status(base.replace("named/a", "other/b") + "?" + sas) == 403  # another blob: refused
    assert _status(read, "PUT", b"overwrite") == 403  # the input cannot be written
    out = doc["outputs"][0]
    put = f"{out['url']}/res/x.bin?{out['sas']}"
    assert _status(put, "PUT", b"result") == 201
    assert _status(put) == 403  # write-only: the output cannot be read back
    assert _status(f"{out['url']}?restype=container&comp=list&{out['sas']}") == 403  # nor listed
    time.sleep(max(0.0, deadline - time.time()) + 2)
    assert _status(read) == 403 and _status(put, "PUT", b"late") == 403  # expired at the deadline


def test_iam_policy_data_grants_exactly_the_named_prefixes(tmp_path: Path) -> None:
    from tests.support.iam_eval import Request, decide

    job = job_for(tmp_path, {"data": "s3://gc-in/set", "more": "s3://gc-in/extra/x.bin"}, {"out": "s3://gc-out/run1"})
    proc = cli("iam-policy", "aws", "--data", str(job), cwd=tmp_path, check=True)
    policy = json.loads(proc.stdout)
    data = [s for s in policy["Statement"] if s["Sid"].startswith("Data")]
    assert {s["Sid"] for s in data} == {"DataFindBuckets", "DataReadInputs", "DataWriteOutputs"}
    ok = [
        Request("s3:ListBucket", "arn:aws:s3:::gc-in"),
        Request("s3:GetObject", "arn:aws:s3:::gc-in/set/part-00/f1.bin"),
        Request("s3:GetObject", "arn:aws:s3:::gc-in/extra/x.bin"),
        Request("s3:PutObject", "arn:aws:s3:::gc-out/run1/model.bin"),
    ]
    denied = [
        Request("s3:GetObject", "arn:aws:s3:::gc-in/private/key"),
        Request("s3:GetObject", "arn:aws:s3:::gc-in/settings/key"),
        Request("s3:PutObject", "arn:aws:s3:::gc-in/set/f"),
        Request("s3:GetObject", "arn:aws:s3:::gc-out/run1/model.bin"),
        Request("s3:PutObject", "arn:aws:s3:::gc-out/run10/x"),
        Request("s3:DeleteObject", "arn:aws:s3:::gc-in/set/f"),
    ]
    assert [decide({"Statement": data}, r) for r in ok] == ["Allow"] * len(ok)
    assert [decide({"Statement": data}, r) for r in denied] == ["ImplicitDeny"] * len(denied)


def test_two_nodes_write_their_outputs_under_their_own_prefix(tmp_path: Path, gpucloud_home: Path, moto: Moto) -> None:
    """Both nodes read the same input; node N's output goes to <prefix>/node-N/, straight from the node."""
    s3 = moto.client("s3")
    for bucket in ("gc-multi-in", "gc-multi-out"):
        s3.create_bucket(Bucket=bucket)
    files = make_files(30, 1)
    for rel, body in files.items():
        s3.put_object(Bucket="gc-multi-in", Key=f"set/{rel}", Body=body)
    run = (
        "python digest.py data && mkdir -p out/sub && echo rank=$GPUCLOUD_NODE_RANK > out/rank.txt && "
        "head -c 300000 /dev/urandom > out/sub/weights-$GPUCLOUD_NODE_RANK.bin"
    )
    job = write_job(
        tmp_path / "job",
        {
            "name": "data2",
            "num_nodes": 2,
            "inputs": {"data": "s3://gc-multi-in/set"},
            "outputs": {"out": "s3://gc-multi-out/run2"},
            "run": run,
        },
        files={"digest.py": DIGEST_PY},
    )
    proc = cli("run", str(job), cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (gpucloud_home / "runs" / run_id_of(proc.stderr) / "log.txt").read_text()
    assert log.count(f"DIGEST data 30 {digest(files)}") == 2, log[-3000:]  # each node read all of it
    objs = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket="gc-multi-out", Prefix="run2/")["Contents"]}
    assert objs == {
        "run2/node-0/rank.txt": 7,
        "run2/node-0/sub/weights-0.bin": 300000,
        "run2/node-1/rank.txt": 7,
        "run2/node-1/sub/weights-1.bin": 300000,
    }
    for rank in (0, 1):
        body = s3.get_object(Bucket="gc-multi-out", Key=f"run2/node-{rank}/rank.txt")["Body"].read()
        assert body == f"rank={rank}\n".encode()
    assert caller_copies(tmp_path, gpucloud_home, "rank.txt") == []
