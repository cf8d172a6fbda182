"""Everything gpucloud writes under GPUCLOUD_HOME is private (docs/SECURITY.md, "Local files"):
0600 files in 0700 folders, and a home left 0755/0644 by an older version is tightened on first
use. Through the real CLI on the local provider."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import yaml

from tests.support.cli import cli, home_env

REPO = Path(__file__).resolve().parents[2]


def cli_in_home(home: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The CLI with `home` as its state folder and no cloud's or gpucloud's variable from this environment."""
    return cli(*args, env=home_env(home), cwd=cwd)


def loose(home: Path, skip: tuple[str, ...] = ()) -> list[str]:
    """Paths under home (and home itself) that a group or other could read, enter or write."""
    found = [f"{home} {stat.filemode(home.stat().st_mode)}"] if home.stat().st_mode & 0o077 else []
    for root, dirs, files in os.walk(home):
        rel = Path(root).relative_to(home)
        if rel.parts and rel.parts[0] in skip and len(rel.parts) > 1:
            continue  # inside the local machine's sandbox: the job's own files, behind a private folder
        for name in (*dirs, *files):
            mode = (Path(root) / name).lstat().st_mode
            if mode & 0o077 and not stat.S_ISLNK(mode):
                found.append(f"{rel / name} {stat.filemode(mode)}")
    return found


def test_a_run_leaves_only_private_files_under_the_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "name": "priv",
                "resources": {"cloud": "local"},
                "max_duration": "10m",
                "env": {"API_TOKEN": "s3cret"},
                "run": "echo token=$API_TOKEN",
            }
        )
    )
    out = cli_in_home(home, "run", str(job), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (home / "state.db").is_file() and any((home / "runs").rglob("*"))
    assert stat.S_IMODE((home / "state.db").stat().st_mode) == 0o600
    # local/RUN/ and channel/ hold what the local "VM" wrote with its own umask; their folders are private.
    assert loose(home, skip=("local", "channel")) == []
    for folder in ("local", "channel"):
        assert stat.S_IMODE((home / folder).stat().st_mode) == 0o700
    refreshed = cli_in_home(home, "ls", "--json", cwd=tmp_path)
    assert refreshed.returncode == 0, refreshed.stderr


def test_a_loose_home_from_an_older_version_is_tightened_on_open(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for folder in ("runs/old-run", "catalog/v1"):
        (home / folder).mkdir(parents=True)
    files = [
        home / "runs" / "old-run" / "log",
        home / "runs" / "old-run" / "handle-0.json",
        home / "catalog" / "v1" / "catalog.pickle",
        home / "images.json",
    ]
    for path in files:
        path.write_text("x")
        path.chmod(0o644)
    for path in (home, home / "runs", home / "runs" / "old-run", home / "catalog", home / "catalog" / "v1"):
        path.chmod(0o755)
    assert len(loose(home)) == 9  # the home, 4 folders, 4 files
    out = cli_in_home(home, "ls", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert loose(home) == []
    assert stat.S_IMODE((home / "state.db").stat().st_mode) == 0o600
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
