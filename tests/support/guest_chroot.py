"""The guest's Debian root (the debootstrap folder tests/support/guest_image.py caches) as a chroot,
for what needs the guest's real apt and dpkg but not a boot: an overlay on the cached folder (the
cache stays as it is), /proc and /dev bound in, NVIDIA's stand-in repositories (guest_apt.py) at
/srv/nvidia as a `file:` source, and the agent's own code at /opt/gpucloud.

`run_stack(cfg)` runs the stack stage itself (gpucloud/vm/agent/stack.py, the node's code as
shipped) inside the root with the guest's python3, real apt-get, dpkg and curl; what a stage would
put in the status while it waits comes back on `NOTE ` lines. The chroot shares the host's kernel:
`uname -r` is the host's, so the root gets that release's /lib/modules folder and the stand-in
repositories carry that release's headers package.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import gpucloud
from gpucloud.contract.registry import capabilities
from gpucloud.vm.agent_config import job_config
from tests.support.guest_apt import build_repos
from tests.support.guest_image import CACHE, base_hash
from tests.support.render_inputs import make_candidate, make_spec

ROOT_REPO = "/srv/nvidia"
AGENT_CODE = "/opt/gpucloud"
RUN_STACK = """\
import json, os, sys, time
from pathlib import Path
from gpucloud.vm.agent import stack
from gpucloud.vm.agent.stage_api import StageEnv, StageFailed

w = Path("/var/lib/gpucloud")
w.mkdir(parents=True, exist_ok=True)
env = StageEnv(log=lambda line: print("[gpucloud] " + line, flush=True), vm_dir=w, environ=dict(os.environ),
               now=time.time, sleep=time.sleep, stopping=lambda: False, system_umask=True,
               note=lambda text: print("NOTE " + text, flush=True))
try:
    stack.run(json.loads(sys.argv[1]), env)
except StageFailed as exc:
    print("STACK FAILED " + str(exc) + "\\n" + stack.stack_log_tail(env), flush=True)
    sys.exit(1)
print("STACK OK", flush=True)
"""


def base_root() -> Path | None:
    """The cached debootstrap folder, or None when no guest was ever built here."""
    base = CACHE / f"base-{base_hash()}"
    return base / "root" if (base / "done").exists() else None


INSTANCE = {"K80": "p2.xlarge", "T4": "g4dn.xlarge"}


def chroot_repos(folder: Path) -> Path:
    """The stand-in repositories for a chroot on this host (its kernel's headers; a `file:` source)."""
    return build_repos(folder, os.uname().release, url=f"file:{ROOT_REPO}")


def stack_cfg(gpu: str, stack: Any) -> dict[str, Any]:
    """The stack stage's config of an AWS node of one `gpu` with `stack`, as the CLI renders it."""
    spec = make_spec(cloud="aws", gpu=gpu, count=1, env={}, run="true", setup=None, artifacts=[], max_duration=3600)
    cand = make_candidate("aws", gpu, 1, instance_type=INSTANCE[gpu])
    return dict(job_config(spec, stack, cand, caps=capabilities("aws"), run_id="r-chroot").stack)


class GuestRoot:
    """An overlay of the guest's root with the stand-in repositories; `close()` unmounts it."""

    def __init__(self, tmp: Path, base: Path, repos: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "root"
        self.mounts: list[Path] = []
        for d in ("upper", "work", "root"):
            (tmp / d).mkdir(parents=True, exist_ok=True)
        layers = f"lowerdir={base},upperdir={tmp / 'upper'},workdir={tmp / 'work'}"
        self._mount(["-t", "overlay", "overlay", "-o", layers])
        for src, dest in (("/proc", "proc"), ("/dev", "dev")):
            self._mount(["--bind", src], dest)
        self._mount(["--bind", str(repos)], ROOT_REPO.lstrip("/"))
        (self.root / "etc/apt/sources.list").write_text("")  # NVIDIA's stand-in only, as on the guest
        for kernel in (self.root / "lib/modules").iterdir():  # the guest's own kernel has its headers
            (self.root / "usr/src" / f"linux-headers-{kernel.name}").mkdir(parents=True, exist_ok=True)
        (self.root / "lib/modules" / os.uname().release).mkdir(parents=True, exist_ok=True)
        code = self.root / AGENT_CODE.lstrip("/")
        package = Path(gpucloud.__file__).resolve().parent  # the installed package (CI: the wheel's)
        for rel in ("__init__.py", "vm/__init__.py", "vm/protocol.py"):
            (code / "gpucloud" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(package / rel, code / "gpucloud" / rel)
        skip = shutil.ignore_patterns("__pycache__")
        shutil.copytree(package / "vm" / "agent", code / "gpucloud/vm/agent", ignore=skip)
        (code / "run_stack.py").write_text(RUN_STACK)

    def _mount(self, args: list[str], dest: str = "") -> None:
        target = self.root / dest if dest else self.root
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", *args, str(target)], check=True)
        self.mounts.append(target)

    def sh(self, script: str, timeout: float = 300, **popen: Any) -> subprocess.CompletedProcess[str]:
        """`sh -c script` inside the root (its PATH, no proxy), output captured."""
        return subprocess.run(
            ["chroot", str(self.root), "/bin/sh", "-c", script],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **popen,
        )

    def spawn(self, script: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["chroot", str(self.root), "/bin/sh", "-c", script],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def run_stack(self, cfg: dict[str, Any], timeout: float = 300) -> subprocess.CompletedProcess[str]:
        arg = json.dumps(cfg).replace("'", "'\\''")
        return self.sh(f"PYTHONPATH={AGENT_CODE} python3 {AGENT_CODE}/run_stack.py '{arg}' 2>&1", timeout)

    def installed(self) -> dict[str, str]:
        """Package -> version of what dpkg has installed in the root."""
        out = self.sh("dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n'").stdout
        return {f[1]: f[2] for f in (line.split() for line in out.splitlines()) if len(f) == 3 and f[0] == "ii"}

    def close(self) -> None:
        for target in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(target)], check=False)
        self.mounts.clear()


def _env() -> dict[str, str]:
    return {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "GPUCLOUD_NVIDIA_REPO": f"file://{ROOT_REPO}",
        "GPUCLOUD_CUDA_ROOT": "/usr/local",
    }
