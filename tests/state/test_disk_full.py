"""A full disk is not a damaged store: SQLite's "database or disk is full" (and its "disk I/O error"
when nothing is free) and an OSError ENOSPC say "No space left on <mount> (<device>)", exit 74, and
the fix (free space there), never the `mv` that moves a damaged store aside. On a real tmpfs of a
few KiB where the tests may mount one (root), simulated elsewhere."""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from gpucloud.cli.app import handles_errors
from gpucloud.state import guard
from gpucloud.state.guard import StoreError, no_space
from gpucloud.state.runs_db import Store
from tests.support.cli import cli
from tests.support.local_runs import write_job
from tests.support.text import flat


class FullDisk:
    """A connection whose every statement fails as SQLite fails on a full disk."""

    in_transaction = False

    def __init__(self, real: sqlite3.Connection, error: str = "database or disk is full") -> None:
        self.real, self.error = real, error

    def execute(self, *args: Any) -> Any:
        raise sqlite3.OperationalError(self.error)

    def close(self) -> None:
        self.real.close()


def assert_no_space(message: str, where: str) -> None:
    text = flat(message)
    assert "No space left on" in text and where in text, text
    assert "Free space" in text and "do not move the state store aside" in text, text
    assert "mv " not in text and "damaged" not in text.replace("Nothing is damaged", ""), text


def test_sqlite_full_is_no_space_not_damage(gpucloud_home: Path) -> None:
    store = Store()
    store._c.conn = FullDisk(store._c.conn)  # type: ignore[assignment]
    with pytest.raises(StoreError) as caught:
        store.create_run("full-20260101-000000-abcd", name="full", spec={})
    assert caught.value.exit_code == 74
    assert_no_space(caught.value.render(), str(gpucloud_home / "state.db"))


def test_an_io_error_is_no_space_when_nothing_is_free(gpucloud_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store()
    store._c.conn = FullDisk(store._c.conn, "disk I/O error")  # type: ignore[assignment]
    with pytest.raises(StoreError) as caught:
        store.create_run("io-20260101-000000-abcd", name="io", spec={})
    assert "disk I/O error" in caught.value.render()  # plenty free here: not called a full disk
    monkeypatch.setattr(guard, "_free_bytes", lambda path: 0)
    with pytest.raises(StoreError) as caught:
        store.create_run("io-20260101-000000-abcd", name="io", spec={})
    assert_no_space(caught.value.render(), "state.db")


def test_enospc_anywhere_is_exit_74_not_an_internal_error(capsys: pytest.CaptureFixture[str]) -> None:
    @handles_errors
    def command(json_out: bool = False) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/var/tmp/gpucloud/runs/r/log.txt")

    with pytest.raises(typer.Exit) as caught:
        command()
    assert caught.value.exit_code == 74
    err = capsys.readouterr().err
    assert_no_space(err, "/var/tmp/gpucloud/runs/r/log.txt")
    assert "internal error" not in err
    assert no_space(OSError(errno.EACCES, "denied", "/x")) is None
    assert no_space(sqlite3.OperationalError("database disk image is malformed"), Path("/x")) is None


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Any]:
    """A tmpfs of `size` bytes at a fresh folder (root only; skipped where it cannot be mounted)."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"tiny-{uuid.uuid4().hex[:6]}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
        mounted.append(where)
        return where

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_real_full_disk_is_no_space(tiny_disk: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 64 KiB tmpfs cannot hold a new store (SQLITE_FULL); a full one cannot take a run's
    records (SQLite's I/O error with nothing free): both exit 74 with where to free space."""
    small = tiny_disk("64k")
    monkeypatch.setenv("GPUCLOUD_HOME", str(small / "home"))
    res = cli("ls", cwd=tmp_path)
    assert res.returncode == 74, res.stderr
    assert_no_space(res.stderr, str(small))
    assert "tmpfs" in flat(res.stderr)

    full = tiny_disk("256k")
    monkeypatch.setenv("GPUCLOUD_HOME", str(full / "home"))
    assert cli("ls", cwd=tmp_path).returncode == 0  # the store fits
    with open(full / "fill", "wb", buffering=0) as fh:  # then the disk fills up
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    spec = write_job(tmp_path / "job", {"name": "full", "run": "echo hi"})
    res = cli("run", str(spec), cwd=tmp_path, timeout=120)
    assert res.returncode == 74, res.stderr
    assert_no_space(res.stderr, str(full))
    assert "internal error" not in res.stderr and "Traceback" not in res.stderr
