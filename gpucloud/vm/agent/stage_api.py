"""What a stage of the VM agent gets from the agent core, and how it says it failed.

Stdlib only, Python >= 3.8 syntax: this module runs on the VM (Ubuntu 20.04 for Kepler hosts).
Stages never sleep or read the clock directly, so unit tests drive them with a fake clock.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence


class StageFailed(Exception):
    """The stage could not do its job; str(exc) is the one line status.json and the log carry."""


@dataclass
class StageEnv:
    """The agent core's services, handed to a stage.

    log: writes one `[gpucloud] ` line to job.log (and stderr).
    vm_dir: the node's work folder ($GPUCLOUD_VM_DIR); stack.log lives there.
    environ: the agent's environment (GPUCLOUD_NVIDIA_REPO, GPUCLOUD_CUDA_ROOT, GPUCLOUD_ETC, PATH ...).
    now / sleep: the clock (a fake one in unit tests); sleep returns early when the run must stop.
    stopping: True once the deadline passed or a signal/preemption asked the node to stop; a stage
        that waits polls it and raises StageFailed (or returns) instead of waiting on.
    resumed: this boot continues a run after a reboot (each stage checks before it installs).
    note: what the stage is waiting for, shown in the status while it waits ('' when it no longer is).
    """

    log: Callable[[str], None]
    vm_dir: Path
    environ: Mapping[str, str]
    now: Callable[[], float]
    sleep: Callable[[float], None]
    stopping: Callable[[], bool]
    resumed: bool = False
    # The machine's own software (apt, dpkg, pip, repository keys) is installed for every user: its
    # commands run under umask 022, not the agent's 077 (apt reads keyrings as its `_apt` user).
    system_umask: bool = False
    note: Callable[[str], None] = lambda text: None

    @property
    def stack_log(self) -> Path:
        return self.vm_dir / "stack.log"

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        to_stack_log: bool = True,
        extra_env: Mapping[str, str] | None = None,
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command; its stdout+stderr go to stack.log (or are captured when to_stack_log is False);
        `stdin`: text it reads (a password never goes on argv), else the agent's own stdin."""
        env = dict(self.environ)
        env.update(extra_env or {})
        if self.system_umask:
            argv = ["sh", "-c", 'umask 022 && exec "$@"', "sh", *argv]
        if to_stack_log:
            with open(self.stack_log, "a") as out:
                return subprocess.run(
                    list(argv),
                    input=stdin,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    timeout=timeout,
                    text=True,
                    check=False,
                )
        return subprocess.run(
            list(argv),
            input=stdin,
            capture_output=True,
            env=env,
            timeout=timeout,
            text=True,
            check=False,
        )
