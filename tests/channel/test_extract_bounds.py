"""Archives are read in bounded time and memory on this machine's Python (3.11.7, whose tarfile
parses a PAX header in quadratic time: CVE-2024-6232), each cap named, member names fenced, and
no artifact written through a link in the results folder (docs/SECURITY.md, "Archives and
extraction").

The hostile archives are written raw (one tar header repeated, gzip members concatenated), so a
million members take a fraction of a second to make. The CLI runs as a child of a small probe
that prints the child's CPU seconds and peak RSS (resource.getrusage).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from gpucloud.channel.extract import SHOWN_REFUSED, ArchiveLimits, count_refused, extract_tar
from gpucloud.run.artifacts import refused_note
from gpucloud.vm.agent.safe_extract import MAX_EXT_HEADER, Refused, safe_untar
from tests.support.cli import cli, home_env
from tests.support.finished_run import Finished
from tests.support.text import flat

pytestmark = pytest.mark.slow
MiB = 1024 * 1024
END = bytes(1024)  # the two zero blocks that end a tar


def header(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, link: str = "", mode: int = 0o644) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname, info.mode = kind, size, link, mode
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def repeated(block: bytes, count: int, per: int = 10_000) -> bytes:
    """A tar.gz of `block` `count` times: one gzip member of `per` copies, concatenated."""
    member = gzip.compress(block * per, 6)
    return member * (count // per) + gzip.compress(block * (count % per) + END)


def pax_bomb(size: int = MiB) -> bytes:
    """One PAX header of `size` digits: tarfile before 3.11.10 searches it for `hdrcharset` with a
    regex that backtracks at every position (quadratic: the 1.1 KB gzip of it ran for minutes)."""
    return gzip.compress(header("././@PaxHeader", tarfile.XHDTYPE, size) + b"1" * size + header("f") + END, 9)


def _probe(finished: Finished, cwd: Path, **env: str) -> dict[str, float]:
    """`gpucloud collect` of the run as a child: its CPU seconds, wall seconds, peak RSS in MiB, output."""
    probe = (
        "import json, resource, subprocess, sys, time; t = time.monotonic(); "
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=60); "
        "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
        "print(json.dumps({'cpu': u.ru_utime + u.ru_stime, 'wall': time.monotonic() - t, "
        "'rss': u.ru_maxrss / 1024, 'rc': p.returncode, 'stderr': p.stderr}))"
    )
    cwd.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        [sys.executable, "-c", probe, sys.executable, "-m", "gpucloud", "collect", finished.run_id],
        cwd=cwd,
        env={**finished.env, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr  # a TimeoutExpired in the probe: the archive was not bounded
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    return Finished(tmp_path_factory.mktemp("bounds"))


@pytest.fixture(scope="module")
def baseline(finished: Finished, tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    """The same collect of a one-file archive: what the CLI costs without a hostile archive."""
    finished.tarball.write_bytes(gzip.compress(header("out/ok.txt", size=3) + b"ok\n".ljust(512, b"\0") + END))
    return _probe(finished, tmp_path_factory.mktemp("baseline"))


@pytest.mark.parametrize(
    ("archive", "why"),
    [
        (lambda: pax_bomb(), f"a PAX header of {MiB} bytes (over the {MAX_EXT_HEADER}-byte cap on one header"),
        (lambda: repeated(header("out/f"), 1_000_000), "more than 100000 files (cap GPUCLOUD_ARTIFACTS_MAX_FILES)"),
        (
            lambda: repeated(header("out/l", tarfile.SYMTYPE, link="/etc/passwd"), 1_000_000),
            "more than 10000 refused members (cap GPUCLOUD_ARTIFACTS_MAX_REFUSED)",
        ),
        (
            lambda: repeated(header("out/d", tarfile.DIRTYPE, mode=0o755), 300_000),
            "more than 20000 folders (cap GPUCLOUD_ARTIFACTS_MAX_FOLDERS)",
        ),
        (lambda: repeated(header("./"), 1_000_000), "more than 140000 members (cap GPUCLOUD_ARTIFACTS_MAX_MEMBERS)"),
    ],
    ids=["pax-1MiB", "1M-files", "1M-symlinks", "300k-folders", "1M-dots"],
)
def test_a_hostile_archive_is_refused_in_bounded_time_and_memory(
    finished: Finished, baseline: dict[str, float], tmp_path: Path, archive: object, why: str
) -> None:
    data = archive()  # type: ignore[operator]
    assert len(data) < 3 * MiB
    finished.tarball.write_bytes(data)
    got = _probe(finished, tmp_path / "cwd")
    assert got["rc"] == 0, got["stderr"]
    assert why in flat(got["stderr"]) and "nothing of this archive was kept" in flat(got["stderr"])
    assert sorted(p.name for p in finished.dest(tmp_path / "cwd").iterdir()) == ["job.log"]
    assert got["cpu"] - baseline["cpu"] < 2.0, (got, baseline)  # CPU: the machine's other load does not count
    assert got["rss"] < 200, got
    print(f"{why[:40]}: {got['cpu']:.2f} s CPU ({baseline['cpu']:.2f} s without it), {got['rss']:.0f} MiB")


def test_refused_members_are_named_up_to_a_cap_then_counted(finished: Finished, tmp_path: Path) -> None:
    links = b"".join(header(f"out/l{i}", tarfile.SYMTYPE, link="/etc") for i in range(100))
    got = finished.collect(gzip.compress(links + header("out/ok", size=2) + b"ok".ljust(512, b"\0") + END), tmp_path)
    assert got.returncode == 0, got.stderr
    lines = json.loads(got.stdout)["artifacts_refused"]
    assert len(lines) == SHOWN_REFUSED + 1 and count_refused(lines) == 100
    assert lines[-1] == f"artifacts: {100 - SHOWN_REFUSED} more member(s) not extracted (only the first 20 are named)"
    assert (finished.dest(tmp_path) / "out" / "ok").read_text() == "ok"
    assert refused_note(lines).startswith("100 artifact member(s) refused")
    capped = ["artifacts not extracted: more than 5 files (cap GPUCLOUD_ARTIFACTS_MAX_FILES); nothing ..."]
    assert refused_note(capped).startswith("artifacts over a cap (GPUCLOUD_ARTIFACTS_MAX_FILES) not kept")


HOSTILE_NAMES = ["a##[error]b", "\x1b]0;owned\x07\x1b[2J", "x\n::add-mask::y", "r\u202etxt.exe", "\r::error::z"]


def test_member_names_in_refused_lines_are_fenced(finished: Finished, tmp_path: Path) -> None:
    members = b"".join(header(f"out/{n}", tarfile.SYMTYPE, link=n) for n in HOSTILE_NAMES)
    members += header("out/\x1b[31m##[group]", size=1, mode=0o4755) + b"x".ljust(512, b"\0")
    got = finished.collect(gzip.compress(members + END), tmp_path, human=True)
    assert got.returncode == 0, got.stderr
    assert "not extracted: a symbolic link" in got.stderr and "\\x1b" in got.stderr
    for bad in ("\x1b", "\x07", "\u202e", "\r", "##["):
        assert bad not in got.stderr, (bad, got.stderr)
    assert not any(line.lstrip().startswith("::") for line in got.stderr.splitlines()), got.stderr


@pytest.mark.parametrize("where", ["gpucloud-runs", "run"])
def test_artifacts_are_never_written_through_a_linked_results_folder(
    finished: Finished, tmp_path: Path, where: str
) -> None:
    cwd, outside = tmp_path / "cwd", tmp_path / "outside"
    outside.mkdir()
    cwd.mkdir()
    link = cwd / "gpucloud-runs"
    if where == "run":
        link.mkdir()
        link = link / finished.run_id
    link.symlink_to(outside)
    got = finished.collect(gzip.compress(header("out/x", size=1) + b"x".ljust(512, b"\0") + END), cwd)
    assert got.returncode == 2 and "Traceback" not in got.stderr, got.stderr
    assert f"{link} is a symbolic link" in flat(got.stderr) and f"Remove or rename {link}" in flat(got.stderr)
    assert list(outside.iterdir()) == []


def test_run_does_not_write_artifacts_through_a_linked_results_folder(tmp_path: Path) -> None:
    job, cwd, outside = tmp_path / "job.yaml", tmp_path / "cwd", tmp_path / "outside"
    job.write_text(
        yaml.safe_dump(
            {
                "name": "linked",
                "resources": {"cloud": "local"},
                "artifacts": ["out/"],
                "run": "mkdir out; echo x > out/x",
            }
        )
    )
    outside.mkdir()
    cwd.mkdir()
    (cwd / "gpucloud-runs").symlink_to(outside)
    got = cli("run", str(job), cwd=cwd, env=home_env(tmp_path / "home"))
    assert "Traceback" not in got.stderr and got.returncode == 0, got.stderr
    assert list(outside.iterdir()) == []
    assert f"{cwd / 'gpucloud-runs'} is a symbolic link" in flat(got.stderr), got.stderr


# ---- the reader itself, in this process: formats, damage, the node's extraction ----------------------


def _tarfile_archive(fmt: int, names: list[str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=fmt) as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = len(name.encode())
            tar.addfile(info, io.BytesIO(name.encode()))
    return buf.getvalue()


LONG = ["d" * 90 + "/" + "e" * 90 + "/f.txt", "x" * 200 + "/" + "y" * 120, "snow/☃ é.txt", "plain/a.txt"]


FORMATS = [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]


@pytest.mark.parametrize("fmt", FORMATS, ids=["ustar", "gnu", "pax"])
def test_long_and_unicode_names_come_back_in_every_tar_format(tmp_path: Path, fmt: int) -> None:
    names = LONG[:1] + LONG[2:] if fmt == tarfile.USTAR_FORMAT else LONG  # ustar: 255 bytes at most
    raw = tmp_path / "a.tgz"
    raw.write_bytes(_tarfile_archive(fmt, names))
    with open(raw, "rb") as fh:
        got = extract_tar(fh, tmp_path / "out", ArchiveLimits())
    assert got.warnings == [] and got.files == len(names)
    for name in names:
        assert (tmp_path / "out" / name).read_text() == name
    assert safe_untar(raw, tmp_path / "node") == len(names)
    assert all((tmp_path / "node" / name).read_text() == name for name in names)


def test_a_damaged_archive_keeps_what_came_before_the_damage(tmp_path: Path) -> None:
    good = header("a.txt", size=1) + b"a".ljust(512, b"\0")
    bad = bytearray(header("b.txt", size=1))
    bad[0] ^= 1  # the checksum no longer matches
    raw = tmp_path / "d.tgz"
    raw.write_bytes(gzip.compress(good + bytes(bad) + b"b".ljust(512, b"\0") + END))
    with open(raw, "rb") as fh:
        got = extract_tar(fh, tmp_path / "out", ArchiveLimits())
    assert (tmp_path / "out" / "a.txt").read_text() == "a" and got.files == 1
    assert got.warnings == ["artifacts: the archive is damaged (a header with a bad checksum); extraction stopped"]
    with pytest.raises(Refused, match="bad checksum"):
        safe_untar(raw, tmp_path / "node")
    assert not (tmp_path / "node").exists()  # the node writes nothing of an archive it refuses


def test_pax_and_long_name_headers_are_read_in_linear_time_up_to_the_cap(tmp_path: Path) -> None:
    """Just under the cap, headers that make tarfile backtrack are read at once (and refused as damage);
    a GNU long name over the cap is refused unread."""
    size = MAX_EXT_HEADER - 512
    cases = {
        "digits": gzip.compress(header("p", tarfile.XHDTYPE, size) + b"1" * size + header("f") + END),
        "spaces": gzip.compress(header("p", tarfile.XHDTYPE, size) + b"9 " * (size // 2) + header("f") + END),
        "gnu-long": gzip.compress(header("././@LongLink", tarfile.GNUTYPE_LONGNAME, MiB) + b"a" * MiB + END),
    }
    for what, data in cases.items():
        (tmp_path / f"{what}.tgz").write_bytes(data)
        start = time.process_time()
        with pytest.raises(Refused):
            safe_untar(tmp_path / f"{what}.tgz", tmp_path / what)
        with open(tmp_path / f"{what}.tgz", "rb") as fh:
            got = extract_tar(fh, tmp_path / f"{what}-cli", ArchiveLimits())
        assert time.process_time() - start < 0.5, what
        assert len(got.warnings) == 1 and got.files == 0, (what, got.warnings)


def test_the_node_refuses_a_pax_bomb_and_a_million_members_quickly(tmp_path: Path) -> None:
    for what, data, why in (
        ("pax", pax_bomb(), "PAX header of 1048576 bytes"),
        ("members", repeated(header("f"), 1_000_000), "more than 200000 members"),
    ):
        (tmp_path / f"{what}.tgz").write_bytes(data)
        start = time.process_time()
        with pytest.raises(Refused, match=why):
            safe_untar(tmp_path / f"{what}.tgz", tmp_path / what)
        assert time.process_time() - start < 2.0, what
        assert not (tmp_path / what).exists()


def test_the_node_writes_nothing_through_a_link_of_its_own_archive(tmp_path: Path) -> None:
    """A code archive may hold a link that stays inside; a later member under that link would be
    written wherever the link's chain leads, so it is refused (nothing is followed)."""
    inner = header("a/b", tarfile.SYMTYPE, link="..") + header("c", tarfile.SYMTYPE, link="a/b/..")
    archive = tmp_path / "code.tgz"
    archive.write_bytes(gzip.compress(inner + header("c/evil", size=1) + b"x".ljust(512, b"\0") + END))
    (tmp_path / "dest").mkdir()
    with pytest.raises(Refused):
        safe_untar(archive, tmp_path / "dest", links=True)
    assert not (tmp_path / "evil").exists()
    assert os.path.lexists(tmp_path / "dest" / "c")  # what came before the refused member stays
