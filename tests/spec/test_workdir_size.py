"""A workdir past the upload cap is refused by `validate`, `plan` and `run` alike, before any run
record, naming the job file's line, the size and the fix; a folder that is large but compresses
under the cap is not refused on its raw size."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.cli import clean_env, cli

JOB = "name: big\nresources:\n  cloud: local\nworkdir: w\nrun: ls -la\n"


def job_with(tmp_path: Path, data: bytes) -> Path:
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "train.py").write_text("print('hi')\n")
    (tmp_path / "w" / "data.bin").write_bytes(data)
    (tmp_path / "job.yaml").write_text(JOB)
    return tmp_path / "job.yaml"


def test_a_workdir_past_the_cap_is_refused_before_any_run(tmp_path: Path) -> None:
    job = job_with(tmp_path, os.urandom(120 * 1024 * 1024))
    env = clean_env(columns=200, GPUCLOUD_HOME=str(tmp_path / "home"))
    for argv in (["validate", str(job)], ["plan", str(job)], ["run", str(job), "--cloud", "local"]):
        proc = cli(*argv, env=env, timeout=300)
        assert proc.returncode == 2, (argv, proc.stderr)
        text = " ".join(proc.stderr.split())
        assert "job.yaml:4: workdir:" in text and "above the 100.0 MiB upload cap" in text, text
        assert "120.0 MiB before compression" in text and "data.bin (120.0 MiB)" in text
        assert ".gitignore" in text and "Traceback" not in text
    listing = cli("ls", "--json", env=env)
    assert listing.returncode == 0 and listing.stdout.strip() in ("[]", ""), listing.stdout  # no `error` run


def test_a_large_folder_that_compresses_under_the_cap_passes(tmp_path: Path) -> None:
    job = job_with(tmp_path, bytes(110 * 1024 * 1024))
    proc = cli("validate", str(job), env=clean_env())
    assert proc.returncode == 0, proc.stderr


def test_ignored_large_files_do_not_count(tmp_path: Path) -> None:
    job = job_with(tmp_path, os.urandom(101 * 1024 * 1024))
    (tmp_path / "w" / ".gitignore").write_text("data.bin\n")
    proc = cli("validate", str(job), env=clean_env())
    assert proc.returncode == 0, proc.stderr
