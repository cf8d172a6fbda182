"""The job's container (job.json `container`): `setup` and `run` execute in its image through the
machine's engine, podman if it has one, else docker. The `container_pull` stage logs in (when the
job names a login), pulls, logs out and finds the image's shell; each step is then one
`<engine> run --rm` whose argv carries no value of the job's environment (`--env NAME` only: the
engine reads the values from its own environment). The running step's container is recorded in
`job.container`, so whichever part of the node stops the job (watchdog process, guard, a signal,
the backstop) also removes it: killing the engine's client leaves the container running.
docs/INTERNALS.md, "Containers".

Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from gpucloud.vm.agent import engine
from gpucloud.vm.agent.stage_api import StageEnv, StageFailed

IMAGE_EXIT = 66  # the image could not be had (pulled, or found with pull: never): README, exit codes
RECORD = "job.container"  # "<engine path> <container name>" while a step's container may run
NOTICE_DIR = "notice"  # mounted into the container: the preemption marker lives here
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")  # where podman looks for CDI specs
CDI_OUT = "/var/run/cdi/nvidia.yaml"
PULL_TRIES = 3
PROGRESS_S = 10.0  # a pull's progress line in the log at least this often
PULL_MIN_S = 600.0  # the shortest deadline a pull of an image of known size gets
PULL_MIN_BPS = 5e6  # the slowest download rate a pull is given time for (bytes/s)
PULL_BACKOFF_S = 2.0
ENGINE_CALL_S = 120.0  # login, logout, the shell probe, rm
HOST_GPU_VARS = ("CUDA_VISIBLE_DEVICES",)  # a shared host's or a Slurm allocation's GPUs, passed on
SHELL_PROBE = "command -v bash || echo sh"
# podman's `--init` runs catatonit from its helper folders (4.x reads only the first); Debian installs
# tini instead of catatonit beside docker.io (podman only recommends one of them), and then `--init`
# fails with exit 125. A static init from these paths is handed over with --init-path.
PODMAN_INITS = (
    "/usr/libexec/podman/catatonit",
    "/usr/local/libexec/podman/catatonit",
    "/usr/lib/podman/catatonit",
    "/usr/bin/catatonit",
    "/usr/bin/tini-static",
    "/usr/bin/docker-init",
)
CONTAINERS_CONFS = ("/etc/containers/containers.conf", "/usr/share/containers/containers.conf")
_INIT_PATH_SET = re.compile(r"^\s*init_path\s*=", re.MULTILINE)
# An engine's pull output (no terminal): podman's `Copying blob sha256:<id>` (`done` / `skipped` when
# it has it), docker's `<id>: Pull complete` / `Already exists`; a byte count `12.3MiB / 40.0MiB`.
_PODMAN_BLOB = re.compile(r"Copying blob (?:sha256:)?([0-9a-f]{12,})")
_DOCKER_LAYER = re.compile(r"^([0-9a-f]{12,}): ")
_LAYER_DONE = re.compile(r"\bdone\b|skipped|Pull complete|Already exists", re.IGNORECASE)
_BYTES = re.compile(r"[0-9.]+\s*[kKMG]i?B\s*/\s*[0-9.]+\s*[kKMG]i?B")

Run = Callable[..., "subprocess.CompletedProcess[str]"]

# The OCI distribution reference grammar (github.com/distribution/reference, regexp.go): an image
# the engine would read as an option (`-eFOO=bar`) or anything else outside it is refused.
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[a-fA-F0-9:]+\])"
DOMAIN = re.compile(_HOST + r"(?::[0-9]+)?")
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,}"
REFERENCE = re.compile(rf"(?:{DOMAIN.pattern}/)?{_PATH}(?:/{_PATH})*(?::{_TAG})?(?:@{_DIGEST})?")


def pick_engine(env: StageEnv, gpus: bool) -> str:
    """The engine's full path: the node's one engine decision (engine.py), shared with the stack stage."""
    name = engine.choose_for(env, gpus)
    return shutil.which(name, path=env.environ.get("PATH")) or name


def is_podman(engine: str) -> bool:
    return os.path.basename(engine).startswith("podman")


def checked_image(image: str) -> str:
    """`image` when it is an image reference (OCI grammar), else StageFailed: it goes on the engine's
    command line, where a leading '-' would be read as an option."""
    if not REFERENCE.fullmatch(image):
        raise StageFailed(f"container: {image[:200]!r} is not an image reference (registry/repository[:tag][@digest])")
    return image


def checked_server(server: str) -> str:
    """A registry's host[:port], else StageFailed (it is an argument of `<engine> login`)."""
    if not DOMAIN.fullmatch(server):
        raise StageFailed(f"container: {server[:200]!r} is not a registry host name")
    return server


def checked_mount(path: str) -> str:
    """A folder for `-v PATH:PATH`: absolute, without ':' or ',' (which would add a mount's options)
    or control characters."""
    if not path.startswith("/") or re.search(r"[:,\x00-\x1f\x7f]", path):
        raise StageFailed(f"container: cannot mount {path[:200]!r} into the container (':' ',' or a control character)")
    return path


def registry_host(image: str) -> str:
    """The registry of a normalised reference (the CLI sends registry/repository[:tag][@digest])."""
    return image.split("/", 1)[0]


def loopback(host: str) -> bool:
    """A registry on this machine: plain HTTP is normal there (docker allows it for 127.0.0.0/8 itself)."""
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
    return name in ("localhost", "[::1]") or name.startswith("127.")


def tls_flags(engine: str, host: str) -> List[str]:
    return ["--tls-verify=false"] if is_podman(engine) and loopback(host) else []


def container_name(run_id: str, rank: int, step: str) -> str:
    """gpucloud-<run>-<rank>-<step>, in the characters an engine takes in a name."""
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", f"gpucloud-{run_id}-{rank}-{step}")


def gpu_flags(engine: str) -> List[str]:
    """Every GPU of the node: CDI for podman, the NVIDIA Container Toolkit's `--gpus` for docker."""
    return ["--device", "nvidia.com/gpu=all"] if is_podman(engine) else ["--gpus", "all"]


def init_flags(engine: str, environ: Mapping[str, str]) -> Tuple[List[str], str]:
    """(the flags that give a step's container an init, which reaps the job's children and passes
    signals on; why there is none). docker brings its own; podman's is found here."""
    if not is_podman(engine):
        return ["--init"], ""
    confs = [environ.get("CONTAINERS_CONF", ""), *CONTAINERS_CONFS]
    for conf in filter(None, confs):
        try:
            if _INIT_PATH_SET.search(Path(conf).read_text(errors="replace")):
                return ["--init"], ""  # the machine's own setting
        except OSError:
            continue
    found = next((path for path in PODMAN_INITS if os.access(path, os.X_OK)), "")
    if found == PODMAN_INITS[0]:
        return ["--init"], ""
    if found:
        return ["--init", f"--init-path={found}"], ""
    return [], (
        "container: podman finds no init here (catatonit, tini-static): the step's shell is the container's "
        "PID 1, so children it leaves are not reaped; install catatonit on the machine (or its image) for one"
    )


def env_names(node_env: Iterable[str], secrets: Iterable[str], environ: Mapping[str, str]) -> List[str]:
    """The variables a step's container gets: the node's and the job's, the secrets, the host's GPU
    selection; never the host's PATH or HOME, which would override the image's."""
    names = set(node_env) | set(secrets) | {n for n in HOST_GPU_VARS if n in environ}
    return sorted(names)


def data_mounts(grants: Mapping[str, Any]) -> List[str]:
    """Absolute input and output folders (relative ones are under the job folder, mounted anyway)."""
    paths = [str(item.get("dest") or "") for item in grants.get("inputs") or []]
    paths += [str(item.get("src") or "") for item in grants.get("outputs") or []]
    return sorted({p.rstrip("/") or "/" for p in paths if p.startswith("/")})


def step_argv(
    doc: Mapping[str, Any],
    *,
    engine: str,
    name: str,
    job_dir: Path,
    mounts: Sequence[str],
    names: Sequence[str],
    gpus: bool,
    shell: str,
    command: str,
    init: Sequence[str] = ("--init",),
) -> List[str]:
    """One step's engine invocation: gpucloud's own flags, then the user's options, user, entrypoint."""
    argv = [engine, "run", "--rm", *init, "--name", name, "--network", "host", "--ipc", "host"]
    for path in map(checked_mount, [str(job_dir), *mounts]):
        argv += ["-v", f"{path}:{path}"]
    argv += ["-w", str(job_dir)]
    for var in names:
        argv += ["--env", var]
    if gpus:
        argv += gpu_flags(engine)
    argv += [str(o) for o in doc.get("options") or []]
    if doc.get("user"):  # `--flag=value`: a value that starts with '-' stays the flag's value
        argv += [f"--user={doc['user']}"]
    if doc.get("entrypoint"):
        argv += [f"--entrypoint={doc['entrypoint']}"]
    return argv + [checked_image(str(doc["image"])), shell, "-c", command]


def remove_argv(engine: str, name: str) -> List[str]:
    """Stop at once (the job already had its SIGTERM and grace) and remove."""
    return [engine, "rm", "-f", "--time", "0", name] if is_podman(engine) else [engine, "rm", "-f", name]


def remove(engine: str, name: str, timeout: float = ENGINE_CALL_S) -> bool:
    """Remove a container whatever its state; True when the engine answered (a missing one is fine)."""
    try:
        subprocess.run(
            remove_argv(engine, name),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
        return True
    except (OSError, subprocess.SubprocessError):
        return False


def record(vm_dir: Path, engine: str, name: str) -> None:
    (vm_dir / RECORD).write_text(f"{engine} {name}\n")


def recorded(vm_dir: Path) -> Optional[Tuple[str, str]]:
    try:
        engine, name = (vm_dir / RECORD).read_text().split()
    except (OSError, ValueError):
        return None
    return engine, name


def remove_recorded(vm_dir: Path) -> None:
    """The recorded step's container removed (any process of the node, or the machine's teardown)."""
    found = recorded(vm_dir)
    if found is not None and remove(*found):
        try:
            (vm_dir / RECORD).unlink()
        except OSError:
            pass


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def cdi_has_nvidia(dirs: Sequence[str] = CDI_DIRS) -> bool:
    for folder in dirs:
        for path in sorted(Path(folder).glob("*")) if Path(folder).is_dir() else []:
            try:
                if path.suffix in (".yaml", ".yml", ".json") and "nvidia.com/gpu" in path.read_text(errors="replace"):
                    return True
            except OSError:
                continue
    return False


def pull_limit(size_bytes: Any, remaining: float) -> float:
    """How long one pull may take: in proportion to the image's size when the plan read it from the
    manifest (at PULL_MIN_BPS, never under PULL_MIN_S), else whatever the run's deadline leaves."""
    if isinstance(size_bytes, int) and not isinstance(size_bytes, bool) and size_bytes > 0:
        return max(1.0, min(remaining, max(PULL_MIN_S, size_bytes / PULL_MIN_BPS)))
    return max(1.0, remaining)


class PullProgress:
    """What an engine's pull output says so far: layers seen and done, the last byte count."""

    def __init__(self) -> None:
        self.layers: Dict[str, bool] = {}
        self.bytes = ""
        self.lines = 0

    def feed(self, line: str) -> None:
        self.lines += 1
        found = _PODMAN_BLOB.search(line) or _DOCKER_LAYER.match(line.strip())
        if found:
            done = bool(_LAYER_DONE.search(line))
            self.layers[found.group(1)[:12]] = self.layers.get(found.group(1)[:12], False) or done
        sizes = _BYTES.findall(line)
        if sizes:
            self.bytes = sizes[-1]

    def line(self, image: str, elapsed: float) -> str:
        parts = []
        if self.layers:
            parts.append(f"{sum(self.layers.values())}/{len(self.layers)} layers done")
        if self.bytes:
            parts.append(self.bytes)
        said = ", ".join(parts) or f"{self.lines} lines from the engine"
        return f"container: pulling {image}: {said}, {elapsed:.0f} s"


def follow_pull(argv: List[str], env: StageEnv, limit: float, image: str) -> "subprocess.CompletedProcess[str]":
    """The pull, its output read as it comes: a progress line in the log at least every PROGRESS_S
    (a multi-GB image takes minutes), killed at `limit` seconds (exit 124)."""
    progress, seen = PullProgress(), []  # type: PullProgress, List[str]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(env.environ),
            text=True,
            errors="replace",
        )
    except OSError as exc:
        return subprocess.CompletedProcess(argv, 127, "", str(exc))

    def read() -> None:
        for raw in proc.stdout or []:
            for part in raw.replace("\r", "\n").splitlines():
                if part.strip():
                    seen.append(part.strip())
                    progress.feed(part)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    t0 = time.monotonic()
    next_note = t0 + PROGRESS_S
    code = None  # type: Optional[int]
    while code is None:
        try:
            code = proc.wait(timeout=max(0.05, min(1.0, next_note - time.monotonic())))
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if now - t0 > limit or env.stopping():
                proc.kill()
                proc.wait()
                reader.join(5)
                why = f"the pull did not finish within {int(limit)} s" if now - t0 > limit else "stopped"
                return subprocess.CompletedProcess(argv, 124, "", why)
            if now >= next_note:
                env.log(progress.line(image, now - t0))
                next_note = now + PROGRESS_S
    reader.join(5)
    return subprocess.CompletedProcess(argv, code, "\n".join(seen[-20:]), "")


class ImageUnavailable(StageFailed):
    """The job's image is not on the machine and could not be pulled: the run ends with IMAGE_EXIT."""


class Container:
    """The job's image on this node: `prepare` is the container_pull stage, `step` one step's command."""

    def __init__(self, doc: Mapping[str, Any], vm_dir: Path, job_dir: Path, run_id: str, rank: int) -> None:
        self.doc = dict(doc)
        self.image = str(doc["image"])
        self.vm_dir, self.job_dir = vm_dir, job_dir
        self.run_id, self.rank = run_id, rank
        self.engine = ""
        self.init: List[str] = ["--init"]
        self.shell = "bash"
        self.mounts: List[str] = [str(vm_dir / NOTICE_DIR)]

    # ---- the container_pull stage ------------------------------------------------------------------
    def prepare(self, env: StageEnv, login: Mapping[str, str], gpus: bool, remaining: Callable[[], float]) -> None:
        """`login`: the sealed pull login {server, username, password}, or {} for a public image."""
        checked_image(self.image)
        self.engine = pick_engine(env, gpus)
        policy = str(self.doc.get("pull") or "always")
        env.log(f"container: {os.path.basename(self.engine)}, image {self.image}, pull: {policy}")
        self.init, no_init = init_flags(self.engine, env.environ)
        if no_init:
            env.log(no_init)
        if gpus and is_podman(self.engine):
            self.ensure_cdi(env)
        if (self.doc.get("prepulled") or policy != "always") and self.present(env, remaining):
            held = "is in this machine's image (baked with it): not pulled again" if self.doc.get("prepulled") else ""
            env.log(f"container: {self.image} {held or f'is already on this machine: not pulled (pull: {policy})'}")
            self.shell = self.probe_shell(env, remaining)
            return
        if policy == "never":
            raise ImageUnavailable(
                f"container: image {self.image} is not on this machine and container.pull is `never`: build or "
                f"load it there first (`{os.path.basename(self.engine)} load`, or `build -t {self.image}`), "
                "or set container.pull: missing to pull it when absent"
            )
        auth = self.vm_dir / "st" / "registry-auth" if login else None
        if login:  # checked before the login, so that the logout in `finally` names a host too
            checked_server(str(login.get("server") or registry_host(self.image)))
        try:
            if auth is not None:
                self.login(env, login, auth, remaining)
            self.pull(env, auth, remaining)
        finally:
            if auth is not None:
                logout = self._engine(auth) + ["logout", *self._authfile(auth), str(login.get("server") or "")]
                self._call(env, logout, remaining)
                shutil.rmtree(auth, ignore_errors=True)
        self.shell = self.probe_shell(env, remaining)
        env.log(f"container: steps run with {self.shell} in {self.image}")

    def present(self, env: StageEnv, remaining: Callable[[], float]) -> bool:
        """Whether the engine already holds the image (`image inspect` answers for podman and docker)."""
        return self._call(env, [self.engine, "image", "inspect", self.image], remaining).returncode == 0

    def _engine(self, auth: Optional[Path]) -> List[str]:
        """The engine; docker with a login keeps its credentials in a folder of the run's own."""
        return (
            [self.engine, "--config", str(auth)] if auth is not None and not is_podman(self.engine) else [self.engine]
        )

    def _authfile(self, auth: Optional[Path]) -> List[str]:
        """podman's credentials file of the run's own (never the machine's)."""
        return ["--authfile", str(auth / "auth.json")] if auth is not None and is_podman(self.engine) else []

    def _call(
        self,
        env: StageEnv,
        argv: List[str],
        remaining: Callable[[], float],
        stdin: Optional[str] = None,
        long: bool = False,
    ) -> "subprocess.CompletedProcess[str]":
        limit = max(1.0, remaining()) if long else max(1.0, min(ENGINE_CALL_S, remaining()))
        try:
            return env.run(argv, timeout=limit, to_stack_log=False, stdin=stdin)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", f"{argv[1]} did not finish within {int(limit)} s")
        except OSError as exc:
            return subprocess.CompletedProcess(argv, 127, "", str(exc))

    def login(self, env: StageEnv, login: Mapping[str, str], auth: Path, remaining: Callable[[], float]) -> None:
        """`<engine> login --password-stdin` into the run's own credentials file."""
        server = checked_server(str(login.get("server") or registry_host(self.image)))
        user = str(login.get("username") or "")
        auth.mkdir(mode=0o700, parents=True, exist_ok=True)
        argv = self._engine(auth) + ["login", *self._authfile(auth), f"--username={user}", "--password-stdin"]
        proc = self._call(env, argv + tls_flags(self.engine, server) + [server], remaining, stdin=login.get("password"))
        if proc.returncode != 0:
            named = (self.doc.get("login") or {}).get("password_secret")
            fix = f"check the username and the value of {named}" if named else "the CLI's pull token was refused"
            raise StageFailed(
                f"container: login to {server} as {user} failed: {last_line(proc.stderr or proc.stdout)} ({fix})"
            )
        env.log(f"container: logged in to {server} as {user}")

    def pull(self, env: StageEnv, auth: Optional[Path], remaining: Callable[[], float]) -> None:
        host = registry_host(self.image)
        argv = self._engine(auth) + ["pull", *self._authfile(auth), *tls_flags(self.engine, host), self.image]
        why = ""
        for attempt in range(1, PULL_TRIES + 1):
            if env.stopping():
                raise StageFailed("container: stopped while pulling the image")
            t0 = env.now()
            limit = pull_limit(self.doc.get("size_bytes"), remaining())
            proc = follow_pull(argv, env, limit, self.image)
            if proc.returncode == 0:
                env.log(f"container: pulled {self.image} in {env.now() - t0:.1f} s")
                return
            why = last_line(proc.stderr or proc.stdout)
            env.log(f"container: pull {attempt}/{PULL_TRIES} of {self.image} failed: {why}")
            if attempt < PULL_TRIES and remaining() > PULL_BACKOFF_S * attempt:
                env.sleep(PULL_BACKOFF_S * attempt)
        raise ImageUnavailable(
            f"container: cannot pull {self.image}: {why}. Check the image's name and tag and the registry login "
            "(container.login); an image built or loaded on the machine runs with container.pull: missing"
        )

    def probe_shell(self, env: StageEnv, remaining: Callable[[], float]) -> str:
        """bash when the image has it (the job's commands are bash elsewhere), else sh."""
        name = container_name(self.run_id, self.rank, "probe")
        argv = [self.engine, "run", "--rm", "--name", name, "--network", "host", "--entrypoint", "sh", self.image]
        try:
            proc = self._call(env, argv + ["-c", SHELL_PROBE], remaining)
        finally:
            remove(self.engine, name)
        if proc.returncode != 0:
            raise StageFailed(
                f"container: {self.image} cannot run sh ({last_line(proc.stderr or proc.stdout)}): setup and run "
                "need a shell in the image"
            )
        return "bash" if last_line(proc.stdout).startswith("/") else "sh"

    def ensure_cdi(self, env: StageEnv) -> None:
        """podman reaches the GPUs through a CDI spec; made once with nvidia-ctk when there is none."""
        if cdi_has_nvidia():
            return
        tool = shutil.which("nvidia-ctk", path=env.environ.get("PATH"))
        if tool is None:
            raise StageFailed(
                "container: this machine has GPUs but no CDI spec for them (/etc/cdi, /var/run/cdi) and no "
                "nvidia-ctk to make one: install the NVIDIA Container Toolkit on the machine (or in its image)"
            )
        proc = env.run([tool, "cdi", "generate", f"--output={CDI_OUT}"], timeout=ENGINE_CALL_S, to_stack_log=False)
        if proc.returncode != 0 or not cdi_has_nvidia():
            raise StageFailed(f"container: nvidia-ctk cdi generate failed: {last_line(proc.stderr or proc.stdout)}")
        env.log(f"container: wrote the GPUs' CDI spec to {CDI_OUT}")

    # ---- a step ----------------------------------------------------------------------------------------
    def add_mounts(self, paths: Iterable[str]) -> None:
        for path in paths:
            Path(path).mkdir(parents=True, exist_ok=True)
            if path not in self.mounts:
                self.mounts.append(path)

    def step(self, command: str, step: str, names: Sequence[str], gpus: bool) -> Tuple[str, str]:
        """(the shell command that runs `command` in the image, the container's name)."""
        name = container_name(self.run_id, self.rank, step)
        remove(self.engine, name)  # a leftover of an earlier boot of this node would block the name
        argv = step_argv(
            self.doc,
            engine=self.engine,
            name=name,
            job_dir=self.job_dir,
            mounts=self.mounts,
            names=names,
            gpus=gpus,
            shell=self.shell,
            command=command,
            init=self.init,
        )
        return " ".join(shlex.quote(a) for a in argv), name
