"""Units of inputs/outputs and the node's sealed document: job-file forms and their errors, the
node's resumable copy, refused names, and the sealed document's checks (no clouds, no processes
beyond curl against a local HTTP server)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucloud.errors import UserError
from gpucloud.spec.data import parse_location
from gpucloud.spec.load import SpecError, load_spec, parse_spec
from gpucloud.vm.agent import data, sealed, secret_env
from gpucloud.vm.agent.stage_api import StageFailed
from gpucloud.vm.agent.transfer import Transfer
from tests.support.moto_server import Moto, moto, moto_server  # noqa: F401

BASE = "name: d\nresources: {cloud: local}\nrun: x\n"


def test_location_forms() -> None:
    assert parse_location("s3://bkt-1/a/b").text == "s3://bkt-1/a/b"
    az = parse_location("https://acct1.blob.core.windows.net/cont/pre/x")
    assert (az.kind, az.account, az.bucket, az.prefix) == ("az", "acct1", "cont", "pre/x")
    assert parse_location("az://acct1/cont").prefix == ""
    assert parse_location("./here").kind == "path" and parse_location("https://x.org/f").kind == "https"
    for bad in ("s3://Bad_Bucket/x", "az://UPPER/c/p", "ftp://x/y", "gs://b/p"):
        with pytest.raises(ValueError):
            parse_location(bad)


@pytest.mark.parametrize(
    "body,where,words",
    [
        ("inputs: {data/: ftp://x}", "inputs.data/", "unknown scheme"),
        ("inputs: {../up: s3://bkt/x}", "inputs", "'..'"),
        ("inputs: {d: {source: s3://bkt/x, mode: rsync}}", "inputs.d", "mode: copy"),
        ("inputs: {d: {source: 'https://x.org/f', mode: mount}}", "inputs.d", "one file over https"),
        ("inputs: {d: {source: ./here, mode: mount}}", "inputs.d", "local path"),
        ("outputs: {o: https://x.org/y}", "outputs.o", "bucket prefix"),
        ("outputs: {o: ./local}", "outputs.o", "bucket prefix"),
        ("secrets: [GPUCLOUD_X]", "secrets", "reserved"),
    ],
)
def test_bad_data_fields_name_the_field(body: str, where: str, words: str) -> None:
    with pytest.raises(SpecError) as exc:
        parse_spec(BASE + body + "\n", "job.yaml")
    text = str(exc.value)
    assert where in text and words in text, text


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    root = tmp_path / "srv"
    root.mkdir()
    (root / "a.bin").write_bytes(b"A" * 1000)
    (root / "b.bin").write_bytes(b"B" * 10)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: object, **k: object) -> None:
            super().__init__(*a, directory=str(root), **k)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


def test_node_copy_is_resumable_and_checks_sizes(tmp_path: Path, server: str) -> None:
    job = tmp_path / "job"
    doc = {
        "inputs": [
            {"dest": "d", "files": [{"rel": "x/a.bin", "url": f"{server}/a.bin", "size": 1000}]},
            {"dest": str(tmp_path / "abs.bin"), "files": [{"rel": "", "url": f"{server}/b.bin", "size": 10}]},
        ]
    }
    lines: list[str] = []
    assert data.fetch_inputs(doc, job, Transfer(), lines.append) == (2, 1010)
    assert (job / "d/x/a.bin").read_bytes() == b"A" * 1000 and (tmp_path / "abs.bin").read_bytes() == b"B" * 10
    assert any("2/2 files" in line for line in lines)
    (job / "d/x/a.bin").write_bytes(b"Z" * 1000)  # same size: kept (a resumed node copies what is missing)
    doc["inputs"][0]["files"][0]["url"] = f"{server}/missing"
    data.fetch_inputs(doc, job, Transfer(), lines.append)
    assert (job / "d/x/a.bin").read_bytes() == b"Z" * 1000
    (job / "d/x/a.bin").unlink()
    with pytest.raises(StageFailed, match="could not copy 1 input file"):
        data.fetch_inputs(doc, job, Transfer(), lines.append)
    doc["inputs"][0]["files"][0].update(url=f"{server}/b.bin", size=999)  # wrong size: refused
    with pytest.raises(StageFailed):
        data.fetch_inputs(doc, job, Transfer(), lines.append)
    with pytest.raises(StageFailed, match="refused"):
        data.fetch_inputs(
            {"inputs": [{"dest": "d", "files": [{"rel": "../x", "url": server}]}]}, job, Transfer(), print
        )


def _pem(tmp_path: Path) -> tuple[str, str]:
    from tests.support.node_keys import openssl_node_key

    pub, _ = openssl_node_key(tmp_path)
    return pub, (tmp_path / "k.pem").read_text()


def test_sealed_document_checks(tmp_path: Path) -> None:
    pub, pem = _pem(tmp_path)
    doc = {"run_id": "r1", "rank": 0, "env": {"A": "1"}, "data": {"inputs": []}}
    blob = sealed.seal(pub, json.dumps(doc).encode())
    calls: list[str] = []

    def fetch(blob: bytes | None, rank: int = 0, names: tuple[str, ...] = ("A",)) -> dict:
        return secret_env.fetch(
            "http://x", names, run_id="r1", rank=rank, get=lambda u: blob, key_pem=lambda: pem,
            passed=lambda: len(calls) > 3, sleep=lambda s: calls.append("s"), stopping=lambda: False, log=print,
        )  # fmt: skip

    assert fetch(blob) == {"env": {"A": "1"}, "data": {"inputs": []}, "registry": {}}  # no pull login sealed
    with pytest.raises(StageFailed, match="another run or node"):
        fetch(blob, rank=1)
    with pytest.raises(StageFailed, match="lacks B"):
        fetch(blob, names=("A", "B"))
    with pytest.raises(StageFailed, match="cannot be opened"):
        fetch(blob[:-1] + b"\0")
    with pytest.raises(StageFailed, match="never arrived"):
        fetch(None)


def test_masked_command_keeps_the_exit_code_and_masks(tmp_path: Path) -> None:
    import subprocess

    cmd = secret_env.masked_command("echo token=$TOK; echo err $TOK >&2; exit 7", ["TOK"])
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, env={"TOK": "s3cr3t", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 7
    assert proc.stdout == b"token=***\nerr ***\n"


def test_masked_step_ends_when_its_job_does_not_at_the_sigterm() -> None:
    """SIGTERM to the step's group (a notice, the deadline): the wrapping shell waits for the job,
    which saves its work first; a step that ended at the signal would have its container removed
    before the job inside had its grace."""
    import os
    import signal
    import subprocess
    import time

    job = "trap 'sleep 0.5; echo saved $TOK; exit 143' TERM; echo started; while :; do sleep 0.05; done"
    cmd = secret_env.masked_command(job, ["TOK"])
    proc = subprocess.Popen(
        ["bash", "-c", cmd],
        stdout=subprocess.PIPE,
        env={"TOK": "s3cr3t", "PATH": "/usr/bin:/bin"},
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(10) == 143 and time.monotonic() - t0 >= 0.4
    assert proc.stdout.read().endswith(b"saved ***\n")


def test_output_sync_uploads_new_and_changed_files_only(tmp_path: Path) -> None:
    job = tmp_path / "job"
    (job / "out").mkdir(parents=True)
    uploads: list[str] = []

    class Recorder(Transfer):
        def post_form(  # type: ignore[override]
            self, url: str, fields: object, key: str, path: Path, **kw: object
        ) -> bool:
            uploads.append(f"{key}={path.read_text()}")
            return True

    doc = {"outputs": [{"src": "out", "style": "post", "url": "http://x", "fields": [], "prefix": "p/"}]}
    sync = data.OutputSync(doc, job, Recorder(), lambda line: None).start(0.2)
    (job / "out" / "a.txt").write_text("1")
    for _ in range(50):
        if uploads:
            break
        threading.Event().wait(0.1)
    assert uploads == ["p/a.txt=1"]  # uploaded while the job runs
    (job / "out" / "b.txt").write_text("2")
    (job / "out" / "a.txt").write_text("11")
    assert sync.final()
    assert sorted(uploads[1:]) == ["p/a.txt=11", "p/b.txt=2"]  # each file once per change
    n = len(uploads)
    assert sync.push() and len(uploads) == n  # nothing changed: nothing sent


def test_outputs_sync_reaches_the_node_config() -> None:
    from gpucloud.spec.load import parse_spec as parse

    spec = parse(BASE + "outputs: {o: s3://bkt/x}\noutputs_sync: interval\ncheckpoint_interval: 5m\n", "j.yaml")
    assert spec.outputs_sync == "interval" and spec.checkpoint_interval == 300
    with pytest.raises(SpecError, match="outputs_sync"):
        parse(BASE + "outputs_sync: hourly\n", "j.yaml")


HOSTILE_KEY = "set/a\nupload-file = /etc/passwd\nurl = http://127.0.0.1:1/x"


def test_listing_skips_keys_the_node_would_refuse(
    moto: Moto, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anyone who can add an object to the input bucket chooses its key: a key with a '..' or '.'
    part, an empty part, a backslash or a control character is skipped with one warning line each,
    shown escaped, and never reaches the node's document. (moto's server refuses a newline in a key,
    which S3 takes: the reviewer's key goes through a local folder's listing, the same check.)"""
    from gpucloud.run.data_grants import check

    monkeypatch.setenv("COLUMNS", "40")  # one line per warning whatever the width: never wrapped
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="gc-names")
    bad = ["set/../escape", "set/a/../../up", "set/./dot", "set//empty", "set/b\\c", "set/e\x1b[31mred"]
    bad.append("set/\x07 ::error::x")  # a control character and, after a blank, a workflow command
    for key in ["set/ok.bin", "set/sub/ok2.bin", *bad]:
        s3.put_object(Bucket="gc-names", Key=key, Body=b"x")
    plan = check(parse_spec(BASE + "inputs: {d/: s3://gc-names/set}\n", "job.yaml"))
    assert sorted(rel for rel, _, _ in plan.inputs[0].files) == ["ok.bin", "sub/ok2.bin"]
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("warning: inputs.d/: skipped")]
    assert len(lines) == len(bad) and "set//empty: its name has an empty path component" in err
    assert "set/e\\x1b[31mred" in err and "\x1b" not in err, err
    s3.put_object(Bucket="gc-names", Key="only/../x", Body=b"x")
    with pytest.raises(UserError, match="every object under s3://gc-names/only has a name the node refuses"):
        check(parse_spec(BASE + "inputs: {d/: s3://gc-names/only}\n", "job.yaml"))
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "ok.bin").write_bytes(b"x")
    (folder / HOSTILE_KEY.replace("/", "_")).write_bytes(b"x")
    job = tmp_path / "job.yaml"
    job.write_text(BASE + "inputs: {d/: ./in}\n")
    plan = check(load_spec(job))
    assert [rel for rel, _, _ in plan.inputs[0].files] == ["ok.bin"]
    err = capsys.readouterr().err
    assert "set_a\\x0aupload-file = _etc_passwd\\x0aurl" in err and "upload-file = _etc_passwd\n" not in err, err


def test_listing_caps_its_warnings() -> None:
    from gpucloud.run import data_grants

    files = [(f"../f{i}", 1, f"k{i}") for i in range(100)] + [("ok", 1, "ok")]
    assert data_grants.usable_files(files, "inputs.d", "s3://b/p") == [("ok", 1, "ok")]
