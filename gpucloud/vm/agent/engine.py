"""Which container engine runs a `container:` job on this node: one decision that the stack stage
(which installs the engine and gives it the GPUs) and the container_pull stage (which runs the
image) both take, so they never disagree.

podman is preferred where it can give the container the GPUs: it reaches them through CDI, which
podman has from 4.1, and the CDI spec nvidia-container-toolkit writes from 1.19.1 (schema 0.7.0,
with `additionalGids`) is read only by podman 5 (NVIDIA/nvidia-container-toolkit#1860: Ubuntu
24.04's podman 4.9 fails with "unknown field additionalGids"). Where podman cannot, docker (the
toolkit's nvidia runtime) is used. docs/CONTAINERS.md, "Engine".

Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Callable, Optional, Tuple

from gpucloud.vm.agent.stage_api import StageEnv, StageFailed

Version = Tuple[int, ...]

PODMAN_CDI = (4, 1)  # the first podman with CDI devices
PODMAN_CDI_07 = (5, 0)  # the first podman whose CDI library reads schema 0.7.0
TOOLKIT_CDI_07 = (1, 19, 1)  # the first nvidia-container-toolkit that writes schema 0.7.0
VERSION_S = 30.0


def version_of(text: str) -> Optional[Version]:
    """The first dotted version in a `--version` answer ("podman version 4.9.3" -> (4, 9, 3))."""
    found = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not found:
        return None
    return tuple(int(part) for part in found.groups() if part is not None)


def dotted(version: Version) -> str:
    return ".".join(str(part) for part in version)


def podman_gpu_problem(podman: Optional[Version], toolkit: Optional[Version]) -> str:
    """Why this podman cannot give a container the GPUs with this toolkit, or "" when it can."""
    if podman is None:
        return "podman does not say its version"
    if podman < PODMAN_CDI:
        return f"podman {dotted(podman)} has no CDI (needs {dotted(PODMAN_CDI)})"
    if toolkit is not None and toolkit >= TOOLKIT_CDI_07 and podman < PODMAN_CDI_07:
        return (
            f"podman {dotted(podman)} cannot read the CDI spec nvidia-container-toolkit {dotted(toolkit)} writes "
            f"(schema 0.7.0 needs podman {dotted(PODMAN_CDI_07)}; NVIDIA/nvidia-container-toolkit#1860)"
        )
    return ""


def decide(
    podman: Optional[Version], has_podman: bool, has_docker: bool, gpus: bool, toolkit: Optional[Version]
) -> Tuple[str, str]:
    """(engine name, or "" when none fits; the one-line reason)."""
    problem = podman_gpu_problem(podman, toolkit) if has_podman and gpus else ""
    if has_podman and not problem:
        why = f"podman {dotted(podman)}" if podman else "podman"
        return "podman", why + (" gives the GPUs through CDI" if gpus else " is here (daemonless)")
    if has_docker:
        return "docker", (problem + ": docker gives the GPUs instead") if problem else "docker (no podman here)"
    if problem:
        return "", problem + ", and there is no docker: install docker (docker.io) or podman >= 5 on the host"
    return "", "neither podman nor docker is on this machine"


def choose(
    path: Optional[str], answer: Callable[[str], Optional[str]], gpus: bool, toolkit: Optional[Version]
) -> Tuple[str, str]:
    """decide() for this machine: `answer(tool)` is the tool's `--version` output (None when it does
    not run); `toolkit` is the installed nvidia-ctk's version, else the one about to be installed."""
    # a stale binary on PATH that does not answer is not an engine
    podman_text = answer("podman") if shutil.which("podman", path=path) else None
    has_docker = shutil.which("docker", path=path) is not None and answer("docker") is not None
    podman = version_of(podman_text or "")
    if gpus and shutil.which("nvidia-ctk", path=path) is not None:
        toolkit = version_of(answer("nvidia-ctk") or "") or toolkit
    return decide(podman, podman_text is not None, has_docker, gpus, toolkit)


def version_answer(env: StageEnv) -> Callable[[str], Optional[str]]:
    """`tool --version`'s output on this machine, None when it does not run (bounded: a hung daemon
    client must not hold the stage)."""

    def answer(tool: str) -> Optional[str]:
        found = shutil.which(tool, path=env.environ.get("PATH"))
        if found is None:
            return None
        try:
            proc = env.run([found, "--version"], timeout=VERSION_S, to_stack_log=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return (proc.stdout or proc.stderr or "") if proc.returncode == 0 else None

    return answer


def choose_for(env: StageEnv, gpus: bool, toolkit: Optional[Version] = None) -> str:
    """The engine's name for this node, its reason logged in one line; StageFailed when none fits."""
    name, why = choose(env.environ.get("PATH"), version_answer(env), gpus, toolkit)
    if not name:
        raise StageFailed(f"container engine: {why}")
    env.log(f"container engine: {name}: {why}")
    return name
