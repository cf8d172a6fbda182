"""The stack stage: check the NVIDIA driver, CUDA toolkit/cuDNN and framework the job needs -- or for
a `container:` job the driver, a container engine and NVIDIA's container toolkit -- and install from
NVIDIA's apt repositories, Ubuntu's (or pip) only what is missing (docs/STACKS.md).

Every part is checked before it is installed, so a vendor image, a baked image or a boot after a
reboot installs nothing it already has. The order and the pins are what keep the driver on its
branch: the running kernel's headers and the branch lock (an apt preferences file, and from R580
NVIDIA's nvidia-driver-pinning-<branch>) go in before any driver package, in an apt transaction of
their own, because the repository's meta-packages have no upper bound on the driver.

`cfg` is the JSON object `gpucloud/vm/stack_config.py` builds on the CLI side.
Stdlib only, Python >= 3.8 syntax (runs on Ubuntu 20.04).
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpucloud.vm.agent import engine
from gpucloud.vm.agent.stage_api import StageEnv, StageFailed

DEFAULT_NVIDIA_REPO = "https://developer.download.nvidia.com/compute/cuda/repos"
DEFAULT_GRID_WAIT_S = 1200
GRID_POLL_S = 1.0
# apt waits up to 10 minutes for the dpkg lock another apt (cloud-init, unattended-upgrades) holds, and
# retries each download 3 times. DPkg::Lock::Timeout does not cover /var/lib/apt/lists/lock, so an
# `apt-get update` racing the first-boot update still fails at once: apt_get retries that itself.
APT_GET = ("apt-get", "-o", "DPkg::Lock::Timeout=600", "-o", "Acquire::Retries=3")
# apt's own words for a lock another apt holds, or a mirror that failed for a moment; any other
# failure is the package graph's or the machine's and is not retried.
APT_TRANSIENT = (
    "Could not get lock",
    "Unable to lock",
    "Unable to acquire the dpkg frontend lock",
    "is another process using it",
    "Temporary failure resolving",
    "Failed to fetch",
    "Some index files failed to download",
    "Hash Sum mismatch",
    "Could not connect to",
    "Connection timed out",
    "Connection failed",
)
APT_BACKOFF_S = (5, 10, 20, 40, 60, 60, 60, 60, 60, 60, 60, 60)  # between tries: about 10 minutes in all
# apt's and dpkg's locks (fcntl locks, listed in /proc/locks while held). cloud-init's first-boot
# package_update holds them while the stack stage starts; `dpkg -i` has no lock timeout at all.
APT_LOCKS = ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock", "/var/lib/apt/lists/lock")
LOCK_WAIT_S = 600
# The driver's packages, as the branch pin names them, and a version of a driver branch ("470.256.02-1")
DRIVER_PATTERNS = ("cuda-drivers*", "nvidia-*", "libnvidia-*", "libxnvctrl*")
DRIVER_VERSION = re.compile(r"^[0-9]{3}\.[0-9]")
BRANCH_METAS = ("cuda-drivers", "nvidia-open")  # meta-packages that hold one branch (>= its version)
LOCK_POLL_S = 1.0
APT_INSTALL = ("install", "-y", "--no-install-recommends")
# Bounded like every curl of the node: connect timeout, retries that include a refused connection.
CURL = ("curl", "-fsSL", "--connect-timeout", "10", "--retry", "2", "--retry-delay", "1", "--retry-connrefused")
KEYRING_DEB = "cuda-keyring_1.1-1_all.deb"
PINS_FILE = "gpucloud-nvidia-driver"
STACK_LOG_TAIL_LINES = 30
FRAMEWORK_IMPORT = {"pytorch": "import torch", "tensorflow": "import tensorflow as tf"}
# NVIDIA's container toolkit repository (libnvidia-container): its signing key and the one apt line
# its install guide writes ($(ARCH) is apt's own substitution); GPUCLOUD_NVIDIA_CTK_REPO overrides it.
DEFAULT_CTK_REPO = "https://nvidia.github.io/libnvidia-container"
CTK_KEY = "nvidia-container-toolkit.asc"
CTK_LIST = "nvidia-container-toolkit.list"


class _StackAbort(Exception):
    """One step could not finish; the stage ends with the stack's one-line message."""


def stack_failed_message(cfg: Mapping[str, Any]) -> str:
    """The status line of a failed stack stage (the details are in stack.log, whose tail the core logs)."""
    return f"stack install failed (driver {cfg.get('driver', '')}, CUDA {cfg.get('cuda', '')}); stack.log tail above"


def stack_log_tail(env: StageEnv, n: int = STACK_LOG_TAIL_LINES) -> str:
    """The last n lines of stack.log ("" when there is none): what the core appends to job.log on failure."""
    try:
        lines = env.stack_log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "".join(line + "\n" for line in lines[-n:])


def run_quiet(env: StageEnv, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """env.run that reports a missing command as exit code 127 (as a shell would) instead of raising."""
    try:
        return env.run(argv, **kwargs)
    except OSError as exc:
        return subprocess.CompletedProcess(list(argv), 127, "", str(exc))


def framework_print(env: StageEnv, framework: str, torch_expr: str, tf_expr: str) -> str:
    """The last stdout line of `python3 -c "<import>; print(<expr>)"` ("" for no framework); its
    stderr (an ImportError) goes to stack.log."""
    if framework not in FRAMEWORK_IMPORT:
        return ""
    expr = torch_expr if framework == "pytorch" else tf_expr
    out = run_quiet(env, ["python3", "-c", f"{FRAMEWORK_IMPORT[framework]}; print({expr})"], to_stack_log=False)
    if out.stderr:
        _append_stack_log(env, out.stderr)
    lines = (out.stdout or "").splitlines()
    return lines[-1] if lines else ""


def driver_version(env: StageEnv) -> str:
    """The running driver's version as nvidia-smi reports it ("" when there is no driver)."""
    out = run_quiet(env, ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], to_stack_log=False)
    lines = (out.stdout or "").splitlines()
    return lines[0].strip() if lines else ""


APT_SAID_MAX = 256 * 1024  # bytes of one apt run's output read back to classify its failure


def _stack_log_size(env: StageEnv) -> int:
    try:
        return env.stack_log.stat().st_size
    except OSError:
        return 0


def _stack_log_since(env: StageEnv, offset: int) -> str:
    """What was appended to stack.log since `offset` (its last APT_SAID_MAX bytes)."""
    try:
        with open(env.stack_log, "rb") as fh:
            fh.seek(max(offset, fh.seek(0, 2) - APT_SAID_MAX))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _append_stack_log(env: StageEnv, text: str) -> None:
    """Best effort, like a shell's `2>>stack.log`: a work folder that cannot be written loses the text."""
    try:
        with open(env.stack_log, "a") as out:
            out.write(text if text.endswith("\n") else text + "\n")
    except OSError:
        pass


def _env_value(env: StageEnv, name: str, default: str) -> str:
    """An environment override; unset and empty both mean the default (bash's ${X:-default})."""
    return env.environ.get(name) or default


def lock_holder(paths: Sequence[str]) -> str:
    """Who holds one of apt's locks: 'pid N (command)', or '' when nobody does (or it cannot tell).
    By inode only: through an overlay (a container's root) the lock sits on the lower file system."""
    inodes = set()
    for path in paths:
        try:
            inodes.add(os.stat(path).st_ino)
        except OSError:
            pass
    try:
        with open("/proc/locks") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return ""
    for line in lines:
        f = line.split()  # "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; a waiter has "->"
        if len(f) < 6 or "->" in f or not f[4].isdigit() or f[5].rpartition(":")[2] not in {str(i) for i in inodes}:
            continue
        try:
            with open(f"/proc/{f[4]}/comm") as fh:
                return f"pid {f[4]} ({fh.read().strip()})"
        except OSError:
            return f"pid {f[4]}"
    return ""


class StackInstall:
    """One run of the stack stage; `apt_fresh` remembers that this run already ran `apt-get update`."""

    def __init__(self, cfg: Mapping[str, Any], env: StageEnv) -> None:
        self.cfg, self.env = cfg, env
        self.apt_fresh = False
        self.driver_min = int(cfg.get("driver_min") or 0)
        self.driver_max = int(cfg.get("driver_max") or 0)
        locks = env.environ.get("GPUCLOUD_APT_LOCKS")
        self.locks = APT_LOCKS if locks is None else tuple(p for p in locks.split(":") if p)

    # ---- packages -----------------------------------------------------------------------------
    def pkg_ok(self, spec: str) -> bool:
        """Installed, and (for `name=version-glob`) at a version the glob matches."""
        name, _, want = spec.partition("=")
        out = run_quiet(self.env, ["dpkg-query", "-W", "-f=${Status} ${Version}", name], to_stack_log=False)
        prefix = "install ok installed "
        have = out.stdout.rstrip("\n")
        if out.returncode != 0 or not have.startswith(prefix):
            return False
        return not want or fnmatch.fnmatchcase(have[len(prefix) :], want)

    def wait_lock(self) -> None:
        """While another apt or dpkg holds apt's locks (cloud-init's first-boot package update), wait
        for it, bounded, and say so in the status; apt's own lock timeout covers what is left."""
        holder = lock_holder(self.locks)
        if not holder:
            return
        self.env.log(f"apt is busy: {holder} holds its lock; waiting up to {LOCK_WAIT_S} s")
        self.env.note(f"stack: waiting for apt's lock, held by {holder}")
        end = self.env.now() + LOCK_WAIT_S
        while holder and self.env.now() < end and not self.env.stopping():
            self.env.sleep(LOCK_POLL_S)
            holder = lock_holder(self.locks)
        self.env.note("")
        self.env.log(f"apt's lock is still held by {holder}: going on" if holder else "apt's lock is free")

    def apt_get(self, *args: str) -> bool:
        """One apt-get, tried again with bounded backoff while apt says another apt holds its lock or a
        mirror failed for a moment (an `update` whose index files failed counts, although apt exits 0)."""
        for wait in (*APT_BACKOFF_S, None):
            self.wait_lock()
            start = _stack_log_size(self.env)
            out = run_quiet(self.env, [*APT_GET, *args], extra_env={"DEBIAN_FRONTEND": "noninteractive"})
            said = _stack_log_since(self.env, start)
            transient = [w for w in APT_TRANSIENT if w in said]
            if out.returncode == 0 and not (args[:1] == ("update",) and transient):
                return True
            if not transient or wait is None or self.env.stopping():
                return False
            self.env.log(f"apt-get {args[0]}: {transient[0]}; trying again in {wait} s")
            self.env.sleep(wait)
        return False

    def keyring(self) -> bool:
        """NVIDIA's repository keyring (cuda-keyring), unless it is installed already."""
        if self.pkg_ok("cuda-keyring"):
            return True
        repo = _env_value(self.env, "GPUCLOUD_NVIDIA_REPO", DEFAULT_NVIDIA_REPO)
        url = f"{repo}/{self.cfg.get('cuda_repo', '')}/{self.cfg.get('repo_arch', '')}/{KEYRING_DEB}"
        deb = str(self.env.vm_dir / "cuda-keyring.deb")
        got = run_quiet(self.env, [*CURL, "--max-time", "300", "-o", deb, url])
        if got.returncode != 0:
            return False
        self.wait_lock()  # dpkg itself fails at once on a held lock
        return run_quiet(self.env, ["dpkg", "-i", deb]).returncode == 0

    def apt_install(self, packages: Sequence[str]) -> bool:
        """Install from NVIDIA's repository: the keyring first, one `apt-get update` per run."""
        return self.keyring() and self.apt_plain(packages)

    def apt_plain(self, packages: Sequence[str]) -> bool:
        """Install from the sources apt has (one `update` per run, again after a source was added)."""
        self.env.log("apt-get install " + " ".join(packages))
        if not self.apt_fresh and not self.apt_get("update"):
            return False
        self.apt_fresh = True
        return self.apt_get(*APT_INSTALL, *packages)

    def kernel_release(self) -> str:
        out = run_quiet(self.env, ["uname", "-r"], to_stack_log=False)
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else os.uname().release

    def drv_lock(self) -> bool:
        """The branch pin and the running kernel's headers, in place before any driver package."""
        folder = Path(_env_value(self.env, "GPUCLOUD_ETC", "/etc")) / "apt" / "preferences.d"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / PINS_FILE).write_text(
                f"Package: {' '.join(DRIVER_PATTERNS)}\n"
                f"Pin: version {self.cfg.get('driver', '')}.*\n"
                "Pin-Priority: 1001\n"
            )
        except OSError as exc:
            _append_stack_log(self.env, f"cannot write the apt preferences file: {exc}")
            return False
        return self.apt_install([f"linux-headers-{self.kernel_release()}", *self.cfg.get("driver_lock", [])])

    # ---- driver -------------------------------------------------------------------------------
    def drv_ok(self, version: str) -> bool:
        branch = version.split(".", 1)[0]
        return branch.isdigit() and branch.isascii() and self.driver_min <= int(branch) <= self.driver_max

    def branches(self) -> str:
        return f"R{self.driver_min}-R{self.driver_max}"

    def apt_driver(self) -> str:
        """The driver from the repository, unless a driver of an accepted branch runs already."""
        version = driver_version(self.env)
        if self.drv_ok(version):
            self.env.log(f"driver {version} already present")
            return version
        missing = [p for p in self.cfg.get("driver_packages", []) if not self.pkg_ok(p)]
        other = self.other_branch()
        if other:  # named in the install, the branch pin (1001) takes them to the stack's branch
            self.env.log(f"driver packages of another branch installed ({' '.join(other)}): switching")
        args = ["--allow-downgrades"] if other else []
        if (missing or other) and not (self.drv_lock() and self.apt_install([*args, *missing, *other])):
            raise _StackAbort()
        run_quiet(self.env, ["modprobe", "nvidia"])
        version = driver_version(self.env)
        if (missing or other) and not self.drv_ok(version):
            self.env.log(f"apt installed driver {version or 'none'}, not {self.branches()}")
            raise _StackAbort()
        return version

    def other_branch(self) -> list[str]:
        """Installed driver packages of another branch (a used disk, a vendor image): a meta-package
        of the stack's branch is satisfied by them (`nvidia-driver (>= 470.57.02)` holds for 580),
        so installing it alone would leave them. Packages whose version is no driver branch (the
        container toolkit's, a pinning package's) are not the driver's."""
        argv = ["dpkg-query", "-W", "-f=${db:Status-Abbrev} ${Package} ${Version}\n", *DRIVER_PATTERNS]
        out = run_quiet(self.env, argv, to_stack_log=False)
        branch = str(self.cfg.get("driver", ""))
        found = []
        for line in (out.stdout or "").splitlines():
            f = line.split()
            if len(f) == 3 and f[0] == "ii" and DRIVER_VERSION.match(f[2]) and f[2].split(".", 1)[0] != branch:
                # the other branch's meta-packages and branch-named packages go (apt's `name-`); the
                # rest (nvidia-driver, nvidia-kernel-dkms ...) are taken to the pinned branch
                other = f[2].split(".", 1)[0]
                found.append(f[1] + "-" if f[1].startswith(BRANCH_METAS) or f[1].endswith("-" + other) else f[1])
        return found

    def grid_driver(self) -> str:
        """Wait for the driver the cloud's GRID extension installs (never apt's cuda-drivers here)."""
        raw = _env_value(self.env, "GPUCLOUD_GRID_WAIT_S", str(DEFAULT_GRID_WAIT_S))
        try:
            wait_s = int(raw)
        except ValueError:
            wait_s = DEFAULT_GRID_WAIT_S
        end = self.env.now() + wait_s
        self.env.log("waiting for the GRID driver of the cloud's extension")
        version = driver_version(self.env)
        while not version:
            if self.env.now() >= end:
                self.env.log(f"no GRID driver after {wait_s}s")
                raise _StackAbort()
            if self.env.stopping():
                raise _StackAbort()
            self.env.sleep(GRID_POLL_S)
            version = driver_version(self.env)
        return version

    def fabric_manager(self, version: str) -> None:
        """The fabric manager of an NVSwitch machine, pinned to the running driver's exact version;
        from R590 its package, like the driver's, has no branch suffix."""
        if not version:
            raise _StackAbort()
        branch = version.split(".", 1)[0]
        package = f"nvidia-fabricmanager-{branch}"
        if not (self.pkg_ok(f"{package}={version}-*") or self.pkg_ok(f"nvidia-fabricmanager={version}-*")):
            if branch.isdigit() and int(branch) >= 590:
                package = "nvidia-fabricmanager"
            if not self.apt_install([f"{package}={version}-*"]):
                raise _StackAbort()
        if run_quiet(self.env, ["systemctl", "enable", "--now", "nvidia-fabricmanager"]).returncode != 0:
            self.env.log("fabric manager did not start")
            raise _StackAbort()
        self.env.log(f"fabric manager {version} running")

    def driver(self) -> None:
        source = self.cfg.get("driver_source", "none")
        version = self.grid_driver() if source == "grid" else self.apt_driver()
        if not self.drv_ok(version):
            self.env.log(f"WARNING: driver {version or 'none'} not in {self.branches()}")
        if self.cfg.get("fabric_manager"):
            self.fabric_manager(version)

    # ---- toolkit and framework ----------------------------------------------------------------
    def toolkit(self) -> None:
        """The system CUDA toolkit (found by its folder or nvcc's release) and cuDNN, where missing."""
        cuda = str(self.cfg.get("cuda", ""))
        missing: list[str] = []
        root = Path(_env_value(self.env, "GPUCLOUD_CUDA_ROOT", "/usr/local"))
        if not (root / f"cuda-{cuda}").is_dir():
            nvcc = run_quiet(self.env, ["nvcc", "--version"], to_stack_log=False)
            if f"release {cuda}" not in nvcc.stdout:
                missing += self.cfg.get("cuda_packages", [])
        missing += [p for p in self.cfg.get("cudnn_packages", []) if not self.pkg_ok(p)]
        if missing and not self.apt_install(missing):
            raise _StackAbort()

    def framework(self) -> None:
        """The framework's pinned wheel, unless that version (a local `+cuXXX` build included) is there."""
        framework, want = self.cfg.get("framework", "none"), str(self.cfg.get("framework_version") or "")
        have = framework_print(self.env, framework, "__version__", "__version__")
        if have and (have == want or have.startswith(want + "+")):
            self.env.log(f"{framework} {have} already installed")
            return
        pip_version = run_quiet(self.env, ["python3", "-m", "pip", "--version"], to_stack_log=False)
        if pip_version.returncode != 0 and not (self.apt_get("update") and self.apt_get(*APT_INSTALL, "python3-pip")):
            raise _StackAbort()
        pip_args = list(self.cfg.get("framework_pip", []))
        self.env.log("pip install " + " ".join(pip_args))
        pip = run_quiet(
            self.env,
            ["python3", "-m", "pip", "install", "--no-input", *pip_args],
            extra_env={"PIP_BREAK_SYSTEM_PACKAGES": "1"},
        )
        if pip.returncode != 0:
            raise _StackAbort()

    # ---- a container job's host: engine and NVIDIA container toolkit --------------------------------
    def runs(self, *argv: str) -> bool:
        """The command is there and answers (a stale binary on PATH is not an engine)."""
        if shutil.which(argv[0], path=self.env.environ.get("PATH")) is None:
            return False
        return run_quiet(self.env, list(argv), to_stack_log=False).returncode == 0

    def engine(self, packages: Sequence[str], toolkit: Sequence[str]) -> str:
        """The node's one engine decision (engine.py, the container_pull stage takes the same); when
        none fits, the engine packages (Ubuntu's docker.io) and the decision again."""
        gpus = bool(toolkit)
        pinned = engine.version_of(toolkit[0].split("=", 1)[1]) if toolkit and "=" in toolkit[0] else None
        try:
            return engine.choose_for(self.env, gpus, pinned)
        except StageFailed as exc:
            self.env.log(f"{exc}: installing " + (" ".join(packages) or "nothing"))
        if not packages or not self.apt_plain(packages):
            self.env.log("no container engine, and installing " + (" ".join(packages) or "one") + " failed")
            raise _StackAbort()
        try:
            return engine.choose_for(self.env, gpus, pinned)
        except StageFailed as exc:
            self.env.log(f"no container engine after installing {' '.join(packages)}: {exc}")
            raise _StackAbort() from None

    def ctk_repo(self) -> bool:
        """NVIDIA's container toolkit source: its key (ASCII-armoured, which apt reads as .asc) and list."""
        etc = Path(_env_value(self.env, "GPUCLOUD_ETC", "/etc")) / "apt"
        default = str((self.cfg.get("container") or {}).get("toolkit_repo") or DEFAULT_CTK_REPO)
        repo = _env_value(self.env, "GPUCLOUD_NVIDIA_CTK_REPO", default)
        key = etc / "keyrings" / CTK_KEY
        try:
            key.parent.mkdir(parents=True, exist_ok=True)
            (etc / "sources.list.d").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _append_stack_log(self.env, f"cannot write the apt sources: {exc}")
            return False
        got = run_quiet(self.env, [*CURL, "--max-time", "60", "-o", str(key), f"{repo}/gpgkey"])
        if got.returncode != 0:
            return False
        line = f"deb [signed-by={key}] {repo}/stable/deb/$(ARCH) /\n"
        try:
            (etc / "sources.list.d" / CTK_LIST).write_text(line)
        except OSError as exc:
            _append_stack_log(self.env, f"cannot write the apt sources: {exc}")
            return False
        self.apt_fresh = False  # a new source: the next install updates first
        return True

    def ctk(self, packages: Sequence[str]) -> None:
        """NVIDIA's container toolkit, pinned, unless `nvidia-ctk` is already there."""
        if self.runs("nvidia-ctk", "--version"):
            self.env.log("NVIDIA container toolkit already present")
            return
        missing = [p for p in packages if not self.pkg_ok(p)]
        if missing and not (self.ctk_repo() and self.apt_plain(missing)):
            raise _StackAbort()
        if not self.runs("nvidia-ctk", "--version"):
            self.env.log("the NVIDIA container toolkit was installed but nvidia-ctk does not run")
            raise _StackAbort()

    def gpu_runtime(self, engine: str) -> None:
        """Give the engine the GPUs: docker's nvidia runtime (restarting docker only when its config
        changed), podman's CDI spec (regenerated: it lists the running driver's files)."""
        etc = Path(_env_value(self.env, "GPUCLOUD_ETC", "/etc"))
        if engine == "podman":
            argv = ["nvidia-ctk", "cdi", "generate", f"--output={etc / 'cdi' / 'nvidia.yaml'}"]
            if run_quiet(self.env, argv).returncode != 0:
                self.env.log("nvidia-ctk cdi generate failed")
                raise _StackAbort()
            self.env.log("podman: CDI spec for the GPUs written")
            return
        daemon = etc / "docker" / "daemon.json"
        before = daemon.read_text() if daemon.is_file() else None
        argv = ["nvidia-ctk", "runtime", "configure", "--runtime=docker", f"--config={daemon}"]
        if run_quiet(self.env, argv).returncode != 0:
            self.env.log("nvidia-ctk runtime configure failed")
            raise _StackAbort()
        after = daemon.read_text() if daemon.is_file() else None
        if after != before and run_quiet(self.env, ["systemctl", "restart", "docker"]).returncode != 0:
            self.env.log("docker did not restart with the NVIDIA runtime")
            raise _StackAbort()
        self.env.log("docker: NVIDIA runtime " + ("configured" if after != before else "already configured"))

    def container_host(self) -> None:
        host = self.cfg.get("container") or {}
        name = self.engine(host.get("engine_packages") or [], host.get("toolkit_packages") or [])
        if host.get("toolkit_packages"):  # a GPU job: the engine must give the container the GPUs
            self.ctk(host["toolkit_packages"])
            self.gpu_runtime(name)

    def mount_tools(self, packages: Sequence[str]) -> None:
        """rclone and FUSE for the job's mounted inputs, where missing (stock cloud images have neither
        rclone nor, on some, fusermount3)."""
        path = self.env.environ.get("PATH")
        fuse = any(shutil.which(name, path=path) for name in ("fusermount3", "fusermount"))
        if self.runs("rclone", "version") and fuse:
            self.env.log("rclone and FUSE already present")
            return
        if not self.apt_plain(packages) or not self.runs("rclone", "version"):
            self.env.log("installing " + " ".join(packages) + " for the mounted inputs failed")
            raise _StackAbort()

    def install(self) -> None:
        if self.cfg.get("driver_source", "none") != "none":
            self.driver()
        if self.cfg.get("cuda_packages") or self.cfg.get("cudnn_packages"):
            self.toolkit()
        if self.cfg.get("framework", "none") in FRAMEWORK_IMPORT:
            self.framework()
        if self.cfg.get("container"):
            self.container_host()
        if self.cfg.get("mount_packages"):
            self.mount_tools(self.cfg["mount_packages"])


def run(cfg: Mapping[str, Any], env: StageEnv) -> None:
    """The stack stage. Raises StageFailed with the stack's one-line message; the details went to
    stack.log (see stack_log_tail) and to the log lines written on the way."""
    if cfg.get("skip_stack"):
        env.log("stack install skipped on this provider (driver and CUDA are the host's)")
        return
    try:
        StackInstall(cfg, env).install()
    except _StackAbort:
        raise StageFailed(stack_failed_message(cfg)) from None
