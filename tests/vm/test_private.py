"""The node's files are private to its user (gpucloud/vm/agent/private.py), while the machine's own
software the stack stage installs stays readable by every user (apt reads keyrings as `_apt`)."""

from __future__ import annotations

import os
from pathlib import Path

from gpucloud.vm.agent.private import private_tree
from gpucloud.vm.agent.stage_api import StageEnv


def test_members_modes_are_narrowed_and_links_left_alone(tmp_path: Path) -> None:
    (tmp_path / "code" / "pkg").mkdir(parents=True)
    (tmp_path / "code" / "run.sh").write_text("echo\n")
    os.chmod(tmp_path / "code" / "run.sh", 0o755)
    os.chmod(tmp_path / "code" / "pkg", 0o755)
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    os.chmod(outside, 0o644)
    (tmp_path / "code" / "link").symlink_to(outside)
    assert private_tree(tmp_path / "code") == 2
    assert (tmp_path / "code" / "run.sh").stat().st_mode & 0o777 == 0o700  # still executable by its owner
    assert (tmp_path / "code" / "pkg").stat().st_mode & 0o777 == 0o700
    assert outside.stat().st_mode & 0o777 == 0o644  # a link's target is not the tree's


def test_the_stack_stage_installs_under_umask_022(tmp_path: Path) -> None:
    def env(system: bool) -> StageEnv:
        return StageEnv(
            log=print, vm_dir=tmp_path, environ={"PATH": os.environ["PATH"]}, now=lambda: 0.0,
            sleep=lambda s: None, stopping=lambda: False, system_umask=system,
        )  # fmt: skip

    old = os.umask(0o077)
    try:
        assert env(True).run(["sh", "-c", "umask"], to_stack_log=False).stdout.strip() == "0022"
        assert env(False).run(["sh", "-c", "umask"], to_stack_log=False).stdout.strip() == "0077"
        env(True).run(["touch", str(tmp_path / "key.asc")])
    finally:
        os.umask(old)
    assert (tmp_path / "key.asc").stat().st_mode & 0o777 == 0o644
