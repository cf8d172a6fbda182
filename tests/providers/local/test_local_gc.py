"""Local `gc` removes an ended run's sandbox whatever the job left in it: a tree deeper than
Python's recursion limit (a job can make one in a second), links to the user's files (removed,
never followed), a mount left behind (named, never walked, gc exits 75), odd folder names; and it never
raises, so one such sandbox does not stop every later gc."""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpucloud.contract.tags import GcIncomplete
from gpucloud.providers.local import engine
from gpucloud.providers.local.provider import LocalProvider, remove_tree

RUN = "old-20200101-000000-beef"
DEPTH = 1500  # over sys.getrecursionlimit() (1000): shutil.rmtree on Python 3.11 raised RecursionError


def ended_sandbox(prov: LocalProvider, run_id: str = RUN, rank: int = 0) -> Path:
    """A node of a run that ended two days ago (no process)."""
    sandbox = prov.sandbox(run_id, rank)
    sandbox.mkdir(parents=True)
    (sandbox / engine.PID_FILE).write_text(json.dumps({"pid": 0, "booted_at": time.time() - 2 * 86400}))
    return sandbox


def deep_tree(top: Path, depth: int) -> None:
    """`top/d/d/d/...` `depth` levels deep, a file at the bottom (built with relative steps: the
    full path is longer than some tools take)."""
    top.mkdir(parents=True, exist_ok=True)
    here = os.open(top, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=here)
        nxt = os.open("d", os.O_RDONLY, dir_fd=here)
        os.close(here)
        here = nxt
    fd = os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=here)
    os.close(fd)
    os.close(here)


def test_gc_removes_a_tree_deeper_than_the_recursion_limit(gpucloud_home: Path) -> None:
    prov = LocalProvider()
    deep_tree(ended_sandbox(prov) / "job" / "out", DEPTH)
    t0 = time.monotonic()
    lines = prov.gc(datetime.now(UTC), dry_run=False)
    assert lines == [f"local: {RUN} sandbox of an ended run (removed)"]
    assert not prov.run_dir(RUN).exists() and time.monotonic() - t0 < 60
    assert prov.gc(datetime.now(UTC), dry_run=False) == []  # and the next gc has nothing left to trip on


def test_remove_tree_never_follows_a_link(tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    top = tmp_path / "sandbox"
    deep_tree(top, 50)
    (top / "d" / "to-folder").symlink_to(precious)
    (top / "to-file").symlink_to(precious / "thesis.tex")
    assert remove_tree(top) == [] and not top.exists()
    assert (precious / "thesis.tex").read_text() == "years of work"
    assert remove_tree(top) == []  # already gone: nothing to say


def test_a_mount_left_behind_is_never_walked(gpucloud_home: Path) -> None:
    """An input mount a killed rclone left in the sandbox (here a tmpfs): not entered, not emptied,
    named; gc exits 75 and the next gc tries again."""
    prov = LocalProvider()
    mnt = ended_sandbox(prov) / "data"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "none", str(mnt)], capture_output=True, check=False).returncode:
        pytest.skip("needs mount(8) with CAP_SYS_ADMIN")
    try:
        (mnt / "bucket-object").write_text("someone's data")
        with pytest.raises(GcIncomplete) as err:
            prov.gc(datetime.now(UTC), dry_run=False)
        assert err.value.exit_code == 75
        assert "NOT removed: data: another filesystem is mounted there, left alone" in err.value.lines[0]
        assert (mnt / "bucket-object").read_text() == "someone's data"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_odd_sandbox_names_do_not_stop_gc(gpucloud_home: Path) -> None:
    prov = LocalProvider()
    ended_sandbox(prov)
    (prov.run_dir(RUN) / "node-x").mkdir()
    (prov.run_dir(RUN) / "node-²").mkdir()
    assert prov.gc(datetime.now(UTC), dry_run=True) == [f"local: {RUN} sandbox of an ended run (would remove)"]
    assert prov.gc(datetime.now(UTC), dry_run=False) == [f"local: {RUN} sandbox of an ended run (removed)"]
