"""Artifacts from a hostile machine never land outside ./gpucloud-runs/RUN (docs/SECURITY.md).

A finished detached run on the local provider has its artifacts tarball replaced by a crafted
one (what a hostile job or VM could upload), then the real `gpucloud collect` brings it back.
The walk in gpucloud/channel/extract.py must hold on this machine's Python (3.11.7, whose tarfile filter
the PATH_MAX symlink chain of CVE-2025-4517 bypasses).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.cli import cli, home_env
from tests.support.finished_run import Finished
from tests.support.text import flat

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    return Finished(tmp_path_factory.mktemp("hostile"))


def _member(
    tar: tarfile.TarFile,
    name: str,
    kind: bytes = tarfile.REGTYPE,
    data: bytes = b"",
    linkname: str = "",
    mode: int = 0o644,
) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.size = kind, linkname, mode, len(data)
    if kind == tarfile.CHRTYPE:
        info.devmajor, info.devminor = 1, 3  # /dev/null's numbers
    tar.addfile(info, io.BytesIO(data) if data else None)


def _tgz(build: object) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        build(tar)  # type: ignore[operator]
    return buf.getvalue()


def _pathmax_chain(tar: tarfile.TarFile, target: Path) -> None:
    """CVE-2025-4517's shape: symlinks whose resolved path passes PATH_MAX, so os.path.realpath
    stops resolving and tarfile's data filter believes the last link stays inside; then a link
    `escape` through them to `target` and a file written through `escape`."""
    comp = "d" * 247
    steps = "abcdefghijklmnop"
    path = ""
    for step in steps:
        _member(tar, os.path.join(path, comp), tarfile.DIRTYPE, mode=0o755)
        _member(tar, os.path.join(path, step), tarfile.SYMTYPE, linkname=comp)
        path = os.path.join(path, comp)
    linkpath = os.path.join("/".join(steps), "l" * 254)
    _member(tar, linkpath, tarfile.SYMTYPE, linkname="../" * len(steps))
    # 17 "..": textually back to the destination (the filter sees a path inside), really 17 folders
    # above it (the root, for any destination less than 17 deep), then on to the target.
    _member(tar, "escape", tarfile.SYMTYPE, linkname=linkpath + "/.." * 17 + str(target))
    _member(tar, "escape/pwned", data=b"overwritten by a hostile archive\n")
    _member(tar, "out/ok.txt", data=b"ok\n")


def test_pathmax_symlink_chain_writes_nothing_outside(finished: Finished, tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.mkdir()
    got = finished.collect(_tgz(lambda tar: _pathmax_chain(tar, target)), tmp_path / "cwd")
    assert got.returncode == 0, got.stderr
    assert not (target / "pwned").exists(), "the archive wrote outside the run's folder"
    dest = finished.dest(tmp_path / "cwd")
    assert (dest / "out" / "ok.txt").read_text() == "ok\n"
    assert not any(p.is_symlink() for p in dest.rglob("*"))
    doc = json.loads(got.stdout)
    assert len(doc["artifacts_refused"]) == 18, doc["artifacts_refused"]  # 16 + the long link + escape
    assert "'escape' not extracted: a symbolic link" in got.stderr


def _hostile(tar: tarfile.TarFile) -> None:
    _member(tar, "out/model.bin", data=b"weights")
    _member(tar, "out/hard", tarfile.LNKTYPE, linkname="out/model.bin")
    _member(tar, "out/null", tarfile.CHRTYPE)
    _member(tar, "out/pipe", tarfile.FIFOTYPE)
    _member(tar, "../up.txt", data=b"x")
    _member(tar, "out/../../up2.txt", data=b"x")
    _member(tar, "/tmp/gpucloud-abs-evil", data=b"x")
    _member(tar, "out/suid", data=b"#!/bin/sh\n", mode=0o4755)
    _member(tar, "out/sgid", data=b"#!/bin/sh\n", mode=0o2755)
    _member(tar, "out/sticky", tarfile.DIRTYPE, mode=0o1777)
    _member(tar, "out/plain.sh", data=b"#!/bin/sh\n", mode=0o755)


def test_links_devices_fifos_traversal_and_setuid_are_refused_and_named(finished: Finished, tmp_path: Path) -> None:
    cwd = tmp_path / "cwd"
    got = finished.collect(_tgz(_hostile), cwd)
    assert got.returncode == 0, got.stderr
    dest = finished.dest(cwd)
    files = {str(p.relative_to(dest)): p.lstat() for p in dest.rglob("*")}
    assert set(files) - {"job.log"} == {"out", "out/model.bin", "out/plain.sh"}
    assert all(stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) for st in files.values())
    assert all(not st.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX) for st in files.values())
    assert stat.S_IMODE(files["out/plain.sh"].st_mode) == 0o644  # no mode bits from the archive
    assert not (cwd / "gpucloud-runs" / "up.txt").exists() and not (cwd / "up2.txt").exists()
    assert not Path("/tmp/gpucloud-abs-evil").exists()
    doc = json.loads(got.stdout)
    why = {line.split("'")[1]: line.split("not extracted: ")[1] for line in doc["artifacts_refused"]}
    assert why == {
        "out/hard": "a hard link (to 'out/model.bin')",
        "out/null": "a device file",
        "out/pipe": "a FIFO (named pipe)",
        "../up.txt": "a path out of the artifacts folder (..)",
        "out/../../up2.txt": "a path out of the artifacts folder (..)",
        "/tmp/gpucloud-abs-evil": "an absolute path",
        "out/suid": "a setuid, setgid or sticky mode",
        "out/sgid": "a setuid, setgid or sticky mode",
        "out/sticky": "a setuid, setgid or sticky mode",
    }
    human = finished.collect(_tgz(_hostile), tmp_path / "again", human=True)
    assert "succeeded (exit 0)" in human.stderr and "9 artifact member(s) refused" in human.stderr, human.stderr


def test_a_link_planted_in_the_destination_is_not_followed(finished: Finished, tmp_path: Path) -> None:
    """A folder of the run's results that is a link (left by anyone) is not written through."""
    cwd, outside = tmp_path / "cwd", tmp_path / "outside"
    outside.mkdir()
    (finished.dest(cwd)).mkdir(parents=True)
    (finished.dest(cwd) / "out").symlink_to(outside)
    got = finished.collect(_tgz(lambda tar: _member(tar, "out/x.txt", data=b"x")), cwd)
    assert got.returncode == 0 and list(outside.iterdir()) == []
    assert "'out/x.txt' not extracted" in got.stderr


def _bomb(path: Path, expanded: int) -> int:
    """A tar.gz of one file of zeros: the tar header, then the same small gzip member repeated
    (a gzip file may be many members); returns its size. 4 MiB of it expands to about 4 GiB."""
    header = tarfile.TarInfo("out/zeros.bin")
    header.size = expanded
    block = gzip.compress(bytes(MiB), compresslevel=9)
    with open(path, "wb") as out:
        out.write(gzip.compress(header.tobuf(format=tarfile.PAX_FORMAT)))
        out.writelines(block for _ in range(expanded // MiB))
        out.write(gzip.compress(bytes(1024)))  # the two zero blocks that end a tar
    return path.stat().st_size


def test_a_4_mb_object_that_expands_to_4_gb_is_refused_by_the_size_cap(finished: Finished, tmp_path: Path) -> None:
    packed = _bomb(tmp_path / "bomb.tgz", 4096 * MiB)
    assert packed < 5 * MiB
    got = finished.collect(tmp_path / "bomb.tgz", tmp_path / "cwd", GPUCLOUD_ARTIFACTS_MAX_BYTES="1G")
    assert got.returncode == 0, got.stderr
    assert not (finished.dest(tmp_path / "cwd") / "out" / "zeros.bin").exists()
    assert (
        f"'out/zeros.bin' ({4096 * MiB} bytes) would take the total past {1024 * MiB} bytes "
        "(cap GPUCLOUD_ARTIFACTS_MAX_BYTES)" in flat(got.stderr)
    )
    assert json.loads(got.stdout)["artifacts_refused"]


def test_the_expansion_ratio_cap_stops_a_bomb_under_the_size_cap(finished: Finished, tmp_path: Path) -> None:
    _bomb(tmp_path / "bomb.tgz", 4096 * MiB)
    got = finished.collect(tmp_path / "bomb.tgz", tmp_path / "cwd")  # default caps: 50 GiB would let it in
    assert got.returncode == 0, got.stderr
    assert "cap GPUCLOUD_ARTIFACTS_MAX_RATIO" in flat(got.stderr)
    assert not (finished.dest(tmp_path / "cwd") / "out" / "zeros.bin").exists()  # the partial file is removed


def test_file_count_cap_and_a_bad_cap_setting(finished: Finished, tmp_path: Path) -> None:
    many = _tgz(lambda tar: [_member(tar, f"out/f{i}", data=b"x") for i in range(20)])
    got = finished.collect(many, tmp_path / "cwd", GPUCLOUD_ARTIFACTS_MAX_FILES="5")
    assert got.returncode == 0 and "more than 5 files (cap GPUCLOUD_ARTIFACTS_MAX_FILES)" in flat(got.stderr)
    assert "nothing of this archive was kept" in flat(got.stderr)  # counted before anything is written
    assert not (finished.dest(tmp_path / "cwd") / "out").exists()
    bad = finished.collect(many, tmp_path / "cwd2", GPUCLOUD_ARTIFACTS_MAX_BYTES="lots")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "GPUCLOUD_ARTIFACTS_MAX_BYTES='lots' is not a valid size" in bad.stderr


def test_a_bad_cap_setting_stops_run_before_anything_is_launched(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "capped", "resources": {"cloud": "local"}, "run": "true"}))
    out = cli("run", str(job), cwd=tmp_path, env=home_env(home, GPUCLOUD_ARTIFACTS_MAX_RATIO="-3"))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "GPUCLOUD_ARTIFACTS_MAX_RATIO='-3' is not a valid ratio" in out.stderr
    assert not (home / "local").exists() or not any((home / "local").glob("capped-*"))


def _random_chunks(total: int) -> Iterator[bytes]:
    seed = os.urandom(MiB)
    for i in range(total // MiB):
        yield seed[i % 7 :] + seed[: i % 7]  # no two chunks alike within gzip's window


class _Stream(io.RawIOBase):
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.buf = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        while not self.buf:
            self.buf = next(self.chunks, b"")
            if not self.buf:
                return 0
        n = min(len(b), len(self.buf))
        b[:n], self.buf = self.buf[:n], self.buf[n:]
        return n


def test_a_large_artifact_is_streamed_with_bounded_memory(finished: Finished, tmp_path: Path) -> None:
    size = 160 * MiB  # above the 150 MiB bound: a collect holding the artifact in memory cannot pass
    src = tmp_path / "big.tgz"
    with open(src, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz", compresslevel=1) as tar:
        info = tarfile.TarInfo("out/big.bin")
        info.size = size
        tar.addfile(info, io.BufferedReader(_Stream(_random_chunks(size))))
    assert src.stat().st_size > size * 0.9  # incompressible: the download itself is large too
    os.replace(src, finished.tarball)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    probe = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, sys.executable, "-m", "gpucloud", "collect", finished.run_id],
        cwd=cwd,
        env=finished.env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    peak_mib = int(out.stdout.strip()) / 1024
    assert (finished.dest(cwd) / "out" / "big.bin").stat().st_size == size
    assert peak_mib < 150, f"collect took {peak_mib:.0f} MiB of RAM for a {size // MiB} MiB artifact"
    print(f"peak RSS of collect for a {size // MiB} MiB artifact: {peak_mib:.0f} MiB")


# ---- on the VM: the bootstrap's checkpoint restore ------------------------------------------------


def _slot(channel_run: Path, slot: int, seq: int, data: bytes) -> None:
    import hashlib

    ckpt = channel_run / "checkpoint"
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / f"slot-{slot}.tar.gz").write_bytes(data)
    (ckpt / f"slot-{slot}.sum").write_text(f"{seq} {hashlib.sha256(data).hexdigest()} {len(data)} end\n")


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (
            lambda tar: (_member(tar, "state", data=b"v2\n"), _member(tar, "null", tarfile.CHRTYPE, mode=0o666)),
            "checkpoint 2 not restored: a member of type c: null",
        ),
        (
            lambda tar: (_member(tar, "state", data=b"v2\n"), _member(tar, "suid", data=b"x", mode=0o4755)),
            "checkpoint 2 not restored: a setuid, setgid or sticky mode: suid",
        ),
        (
            lambda tar: (_member(tar, "state", data=b"v2\n"), _member(tar, "up", tarfile.SYMTYPE, linkname="/etc")),
            "checkpoint 2 not restored: a member of type l: up",
        ),
        (
            lambda tar: _member(tar, "../../../../outside", data=b"x"),
            "checkpoint 2 not restored: a path out of the folder: ../../../../outside",
        ),
    ],
    ids=["device", "setuid", "symlink", "dotdot"],
)
def test_a_hostile_newest_checkpoint_falls_back_to_the_previous_one(tmp_path: Path, bad: object, why: str) -> None:
    """Runs as root here: GNU tar alone would create the device node and keep the setuid bit."""
    from tests.support.vm_boot import make_vm

    run_id = "rhostile1"
    channel_run = tmp_path / "channel" / "runs" / run_id
    _slot(channel_run, 0, 1, _tgz(lambda tar: _member(tar, "state", data=b"v1\n")))
    _slot(channel_run, 1, 2, _tgz(bad))
    job = 'echo "restored $(cat ckpt/state)"; find ckpt -mindepth 1 -printf "%M %p\\n"'
    vm = make_vm(tmp_path, run=job, spot={"checkpoint": "ckpt", "checkpoint_interval": 60}, run_id=run_id).run(60)
    assert vm.status()["state"] == "succeeded", vm.log()
    assert why in vm.log() and "checkpoint 1 restored" in vm.log(), vm.log()
    out = vm.job_output()
    # private: the agent narrows what it unpacks to the user (umask 077, gpucloud/vm/agent/private.py)
    assert "restored v1" in out and out.count("ckpt/") == 1 and "-rw------- ckpt/state" in out, out
    assert not (tmp_path / "outside").exists()
