"""The CLI's log copy is bounded: parts are appended one at a time, and past
GPUCLOUD_LOG_CAP the head and the tail are kept with a note of what was dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud.channel.run_objects import FileChannel, log_key
from gpucloud.run.log import DEFAULT_CAP, LogMirror, log_cap
from tests.support.cli import cli


def _publish(channel: FileChannel, run_id: str, parts: list[bytes], rank: int = 0) -> None:
    for i, data in enumerate(parts):
        channel.put_bytes(log_key(run_id, rank, i), data)
    channel.put_bytes(f"runs/{run_id}/node-{rank}/status.json", json.dumps({"log_parts": len(parts)}).encode())


def test_cap_setting() -> None:
    assert log_cap("") == DEFAULT_CAP == 1 << 30
    assert log_cap("200M") == 200 << 20 and log_cap("2g") == 2 << 30 and log_cap("64KiB") == 64 << 10
    assert log_cap("65536") == 65536 and log_cap("12") == 4096  # a floor: a cap must keep something
    assert log_cap("lots") == DEFAULT_CAP  # unreadable: the default, never a lost log


def test_small_log_is_kept_byte_for_byte(tmp_path: Path) -> None:
    channel = FileChannel(tmp_path / "store")
    parts = [f"line {i}\n".encode() * 10 for i in range(20)]
    _publish(channel, "r1", parts)
    mirror = LogMirror(tmp_path / "home", "r1", cap=1 << 20)
    assert mirror.sync(channel, final=True) == 20
    got: list[bytes] = []
    mirror.drain(got.append, chunk=100)
    assert b"".join(got) == b"".join(parts) and max(map(len, got)) <= 100


@pytest.mark.parametrize("num_nodes", [1, 2])
def test_past_the_cap_head_and_tail_are_kept_with_a_note(tmp_path: Path, num_nodes: int) -> None:
    channel = FileChannel(tmp_path / "store")
    cap = 64 << 10
    lines = [f"row {i:07d}\n".encode() for i in range(100_000)]  # 1.2 MB
    chunks = [b"".join(lines[i : i + 1000]) for i in range(0, len(lines), 1000)]
    for rank in range(num_nodes):
        _publish(channel, "r1", chunks, rank)
    mirror = LogMirror(tmp_path / "home", "r1", num_nodes, cap=cap)
    mirror.sync(channel)
    live = mirror.read_new()
    assert len(live) == cap // 2  # the head; the live view pauses while the tail is kept
    mirror.sync(channel, final=True)
    text = (tmp_path / "home" / "runs" / "r1" / "log.txt").read_bytes()
    full = b"".join(
        b"".join(f"[node {r}] ".encode() * (num_nodes > 1) + line for line in lines) for r in range(num_nodes)
    )
    assert text.startswith(full[: cap // 2])
    head, note, tail = text[: cap // 2], *text[cap // 2 :].split(b"\n", 2)[1:]
    assert note.startswith(b"[gpucloud] log cap of 65536 bytes (GPUCLOUD_LOG_CAP) reached: ")
    dropped = int(note.split(b"reached: ")[1].split(b" ")[0])
    assert full.endswith(tail) and cap // 4 <= len(tail) <= cap // 2
    assert len(head) + dropped + len(tail) == len(full)
    assert len(text) < cap + 200
    assert not list((tmp_path / "home" / "runs" / "r1").glob("log.tail.*"))
    assert mirror.read_new() == text[cap // 2 :]  # the note and the tail follow the head


def test_a_local_run_keeps_one_copy_of_its_log(tmp_path: Path, gpucloud_home: Path) -> None:
    """Before: the sandbox's job.log, the file channel's parts and the CLI's mirror each held the
    whole log. Now the mirror is the one copy on this disk, and `logs` still prints every byte."""
    import os

    from tests.conftest import REPO

    spec = tmp_path / "chatty.yaml"
    spec.write_text("name: chatty\nresources: {cloud: local}\nrun: seq 1 400000\n")  # 2.7 MB
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = cli("run", str(spec), "--json", env=env, cwd=tmp_path, timeout=180)
    assert run.returncode == 0, run.stderr
    run_id = json.loads(run.stdout)["run_id"]
    expected = "".join(f"{i}\n" for i in range(1, 400_001)).encode()
    log_files = [p for p in gpucloud_home.rglob("*") if p.is_file() and p.stat().st_size > 100_000]
    assert log_files == [gpucloud_home / "runs" / run_id / "log.txt"], log_files
    # Only the node's key claim stays beside the (released) parts: it is not log (channel_trust.py).
    assert not [
        p
        for p in (gpucloud_home / "channel" / "runs" / run_id / "node-0" / "log").iterdir()
        if not p.name.startswith("claim-")
    ]
    logs = cli("logs", run_id, env=env, cwd=tmp_path, timeout=60, text=False)
    assert logs.returncode == 0, logs.stderr
    job_lines = b"".join(line for line in logs.stdout.splitlines(keepends=True) if not line.startswith(b"[gpucloud]"))
    assert job_lines == expected, (len(job_lines), len(expected))  # every line of the job, in order
