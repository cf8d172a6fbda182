"""A detached local run that has ended, whose artifacts a test replaces with a crafted tarball before
collecting them (the extraction's tests: tests/channel/test_extract.py and test_extract_bounds.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import yaml

from tests.support.cli import cli, home_env


class Finished:
    """A detached local run that has ended; `collect(tarball)` replaces its artifacts and collects."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.env = home_env(self.home)
        job = root / "job"
        job.mkdir()
        (job / "job.yaml").write_text(
            yaml.safe_dump(
                {
                    "name": "hostile",
                    "resources": {"cloud": "local"},
                    "max_duration": "10m",
                    "artifacts": ["out/"],
                    "run": "mkdir -p out; echo ok > out/ok.txt",
                }
            )
        )
        proc = cli("run", str(job / "job.yaml"), "-d", "--json", cwd=root, env=self.env)
        assert proc.returncode == 0, proc.stderr
        self.run_id = json.loads(proc.stdout)["run_id"]
        end = time.monotonic() + 60
        while json.loads(cli("status", self.run_id, "--json", cwd=root, env=self.env).stdout)["status"] in (
            "running",
            "provisioning",
        ):
            assert time.monotonic() < end, "the run did not finish"
            time.sleep(0.3)
        node = self.home / "channel" / "runs" / self.run_id / "node-0"
        self.tarball = node / "artifacts.tar.gz"
        assert self.tarball.is_file()
        # The crafted tarballs stand for what a hostile node uploads AND signs itself: this run's
        # manifest drops its `sign` line so the trust check (tests/channel/test_user_data_reader.py) lets
        # them through to the extraction under test here.
        manifest = node / "manifest"
        lines = manifest.read_text().splitlines(keepends=True)
        manifest.write_text("".join(line for line in lines if line.strip() != "sign ed25519"))

    def collect(
        self, write: Path | bytes, cwd: Path, human: bool = False, **env: str
    ) -> subprocess.CompletedProcess[str]:
        if isinstance(write, Path):
            os.replace(write, self.tarball)
        else:
            self.tarball.write_bytes(write)
        cwd.mkdir(parents=True, exist_ok=True)
        return cli("collect", self.run_id, *(() if human else ("--json",)), cwd=cwd, env={**self.env, **env})

    def dest(self, cwd: Path) -> Path:
        return cwd / "gpucloud-runs" / self.run_id
