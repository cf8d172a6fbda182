"""What an SSH host has: GPUs (`nvidia-smi --query-gpu`), driver, CUDA, OS, free disk, sudo, and
the stack gpucloud resolves for it exactly as for a cloud VM (the job's `PlanRequest.stack_for`).

One ssh call per host reads everything (a small POSIX shell script); parsing and the driver
verdict are plain functions so they are tested without a host. docs/SSH.md explains the output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from gpucloud.providers.ssh import transport as ssh_transport

if TYPE_CHECKING:
    from gpucloud.contract.provider import PlanRequest
    from gpucloud.plan.stack_data import Stack

REMOTE_ROOT = "${GPUCLOUD_REMOTE_ROOT:-$HOME/.gpucloud}"  # the run folders, channel and locks on a host
NVIDIA_REPO = "https://developer.download.nvidia.com/compute/cuda/repos"
HOST_NVIDIA_REPO = "${GPUCLOUD_NVIDIA_REPO:-" + NVIDIA_REPO + "}"  # as run on the host: a mirror may be set there
# The last driver branch that still supports an architecture (NVIDIA dropped Kepler after R470;
# docs/SSH.md cites the source). A newer driver on such a GPU does not see it at all.
LAST_BRANCH = {"Kepler": 470}
# NVIDIA's CUDA repository path for each distribution gpucloud installs drivers on (apt, with the
# cuda-keyring package): ID and VERSION_ID of the host's /etc/os-release, the dots dropped
# (docs/SSH.md, "Operating systems", cites the sources). Any other OS: the job runs on the driver
# the host has; gpucloud does not install one there.
APT_REPOS = {
    ("ubuntu", "20.04"): "ubuntu2004",
    ("ubuntu", "22.04"): "ubuntu2204",
    ("ubuntu", "24.04"): "ubuntu2404",
    ("debian", "12"): "debian12",
}
SUPPORTED_OS = "Ubuntu 20.04, 22.04 or 24.04, or Debian 12"
# Bounds on what a host answers: nvidia-smi is stopped after SMI_TIMEOUT_S (coreutils `timeout`) and
# read up to SMI_MAX bytes (the rest ends it with SIGPIPE); the whole probe answer is at most
# PROBE_MAX bytes and PROBE_TIMEOUT_S seconds. A GPU listing is a few hundred bytes.
SMI_TIMEOUT_S = 20
SMI_MAX = 65536
PROBE_MAX = 1024 * 1024
PROBE_TIMEOUT_S = 60

PROBE_SCRIPT = (
    r"""
R=__ROOT__
(umask 077; mkdir -p "$R" 2>/dev/null)
echo "@root $(cd "$R" 2>/dev/null && pwd || echo "$R")"
echo "@user $(id -un)"
f=${GPUCLOUD_OS_RELEASE:-/etc/os-release}; [ -r "$f" ] || f=/usr/lib/os-release
if [ -r "$f" ]; then
  . "$f"; echo "@os ${ID:-linux} ${VERSION_ID:-} ${PRETTY_NAME:-}"
else
  echo "@os $(uname -s)"
fi
echo "@disk $(df -Pk "$R" 2>/dev/null | awk 'NR==2 {print $4}')"
if [ "$(id -u)" = 0 ]; then echo "@sudo root"
elif sudo -n true 2>/dev/null; then echo "@sudo yes"
else echo "@sudo no"; fi
for f in "$R"/locks/gpu-*; do [ -f "$f" ] && echo "@lock ${f##*/gpu-} $(head -c 200 "$f" | head -n 1)"; done
for t in bash curl tar gzip setsid flock sha256sum openssl; do
  command -v "$t" >/dev/null 2>&1 || echo "@missing $t"
done
python3 -c "import sys; sys.exit(sys.version_info < (3, 8))" >/dev/null 2>&1 || echo "@missing python3 (>= 3.8)"
smi() { if command -v timeout >/dev/null 2>&1; then timeout -k 2 __SMI_T__ nvidia-smi "$@"; else nvidia-smi "$@"; fi; }
if command -v nvidia-smi >/dev/null 2>&1; then
  out=$( { smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader,nounits 2>&1
          echo "@rc $?"; } | head -c __SMI_MAX__)
  rc=$(printf '%s\n' "$out" | sed -n 's/^@rc \([0-9]*\)$/\1/p' | tail -n 1)
  out=$(printf '%s\n' "$out" | grep -v '^@rc ')
  if [ "$rc" = 0 ]; then
    printf '%s\n' "$out" | sed 's/^/@gpu /'
    echo "@cuda $(smi 2>/dev/null | head -c __SMI_MAX__ | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)"
  elif [ -z "$rc" ]; then
    echo "@smi-error nvidia-smi printed more than __SMI_MAX__ bytes (stopped)"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "@smi-error nvidia-smi did not answer within __SMI_T__ s (stopped; a hung driver or GPU)"
  else
    echo "@smi-error $(printf '%s' "$out" | head -n 1 | head -c 300)"
  fi
else
  echo "@smi-error nvidia-smi not found"
fi
""".replace("__ROOT__", REMOTE_ROOT)
    .replace("__SMI_T__", str(SMI_TIMEOUT_S))
    .replace("__SMI_MAX__", str(SMI_MAX))
)


_DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() also takes "²", which int() refuses


@dataclass
class GpuInfo:
    index: int
    name: str  # as nvidia-smi says it: "Tesla K40m"
    model: str | None  # catalog name ("K40"), None when gpucloud does not know the card
    memory_mib: int


@dataclass
class HostProbe:
    """One host's answers. `stack` is resolved for its first GPU (None: no GPU seen or unknown)."""

    host: str
    root: str = ""
    user: str = ""
    os: str = ""
    os_id: str = ""  # /etc/os-release ID ("debian") and VERSION_ID ("12")
    os_version: str = ""
    disk_free_gib: float = 0.0
    sudo: str = "no"  # "root" | "yes" | "no"
    missing_tools: list[str] = field(default_factory=list)
    gpus: list[GpuInfo] = field(default_factory=list)
    driver: str | None = None
    cuda: str | None = None
    smi_error: str | None = None
    stack: Stack | None = None
    problems: list[str] = field(default_factory=list)  # what stops a GPU job here, each with its fix
    notes: list[str] = field(default_factory=list)  # worth knowing, not blocking
    locks: dict[int, str] = field(default_factory=dict)  # GPU index -> run id holding its lock (maybe stale)
    unreachable: str = ""  # why ssh got no answer ("" when it did): nothing else was learnt

    @property
    def gpu_model(self) -> str | None:
        return self.gpus[0].model if self.gpus else None

    def count(self, model: str) -> int:
        return sum(1 for g in self.gpus if g.model == model)

    def render(self) -> str:
        """Human lines for `gpucloud hosts probe`."""
        return render_probe(self)

    def as_json(self) -> dict[str, object]:
        return {
            "host": self.host,
            "user": self.user,
            "os": self.os,
            "os_id": self.os_id,
            "os_version": self.os_version,
            "nvidia_repo": self.stack.cuda_repo if self.stack else None,
            "root": self.root,
            "disk_free_gib": round(self.disk_free_gib, 1),
            "sudo": self.sudo,
            "missing_tools": self.missing_tools,
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "model": g.model,
                    "memory_mib": g.memory_mib,
                    "locked_by": self.locks.get(g.index),
                }
                for g in self.gpus
            ],
            "driver": self.driver,
            "cuda": self.cuda,
            "nvidia_smi_error": self.smi_error,
            "stack": self.stack.as_json() if self.stack else None,
            "problems": self.problems,
            "notes": self.notes,
            "reachable": not self.unreachable,
        }


def parse_probe(host: str, text: str) -> HostProbe:
    """The probe script's `@key value` lines -> HostProbe (no stack yet)."""
    from gpucloud.catalog import resolve_gpu_name

    probe = HostProbe(host=host)
    if "@root " not in text and "@user " not in text:
        probe.problems.append(
            f"{host}: the probe printed nothing gpucloud understands (the login may not run "
            "commands: a ForceCommand, a restricted shell, or a profile that exits); check that "
            f"`ssh {host} 'echo ok'` prints ok"
        )
        return probe
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        value = value.strip()
        if key == "@root":
            probe.root = value
        elif key == "@user":
            probe.user = value
        elif key == "@os":
            probe.os = value
            fields = value.split(" ", 2)
            probe.os_id, probe.os_version = fields[0].lower(), (fields[1] if len(fields) > 1 else "")
        elif key == "@disk":
            probe.disk_free_gib = int(value) / 1048576 if _DIGITS.fullmatch(value) else 0.0
        elif key == "@sudo":
            probe.sudo = value
        elif key == "@lock" and _DIGITS.fullmatch(value.split(" ")[0]):
            index, _, run_id = value.partition(" ")
            probe.locks[int(index)] = run_id
        elif key == "@missing":
            probe.missing_tools.append(value)
        elif key == "@gpu":
            parts = [p.strip() for p in value.split(",")]
            if len(parts) >= 4 and _DIGITS.fullmatch(parts[0]):
                mem = int(parts[2]) if _DIGITS.fullmatch(parts[2]) else 0
                probe.gpus.append(GpuInfo(int(parts[0]), parts[1], resolve_gpu_name(parts[1]), mem))
                probe.driver = probe.driver or parts[3]
        elif key == "@cuda":
            probe.cuda = value or None
        elif key == "@smi-error":
            probe.smi_error = value or "nvidia-smi failed"
    return probe


def os_label(probe: HostProbe) -> str:
    """The host's OS as `plan` shows an OS image: "debian-12", "ubuntu-24.04"."""
    return "-".join(p for p in (probe.os_id, probe.os_version) if p) or "unknown"


def host_stack(stack: Stack, probe: HostProbe) -> Stack:
    """The stack as it is on this host: the host's own OS instead of a cloud image, and NVIDIA's
    repository for that OS (cuda_repo "" where gpucloud does not install drivers)."""
    if not probe.os_id:
        return stack
    repo = APT_REPOS.get((probe.os_id, probe.os_version), "")
    pretty = probe.os.split(" ", 2)[2] if probe.os.count(" ") >= 2 else os_label(probe)
    why = (
        f"The host's own OS, {pretty} (its /etc/os-release); NVIDIA's repository for it is {repo}."
        if repo
        else f"The host's own OS, {pretty} (its /etc/os-release); gpucloud installs drivers only on {SUPPORTED_OS}, "
        "so the host's own driver is used as it is."
    )
    return replace(stack, os_image=os_label(probe), cuda_repo=repo, reasons={**stack.reasons, "os_image": why})


def install_command(stack: Stack, sudo: str = "yes", repo: str = NVIDIA_REPO) -> str:
    """The commands that install the stack's driver from NVIDIA's apt repository (what `stack:
    {install: true}` runs over ssh, and what the error message tells a user to run by hand).
    `repo`: the repository base; the provider passes the host's GPUCLOUD_NVIDIA_REPO (a mirror)."""
    pre = "" if sudo == "root" else "sudo -n "
    deb = "cuda-keyring_1.1-1_all.deb"
    pkgs = " ".join(stack.driver_packages)
    return (
        f"curl -fsSLO {repo}/{stack.cuda_repo}/x86_64/{deb} && {pre}dpkg -i {deb} && "
        f"{pre}apt-get update && {pre}DEBIAN_FRONTEND=noninteractive apt-get install -y {pkgs}"
    )


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if _DIGITS.fullmatch(p))


def driver_problem(probe: HostProbe, stack: Stack, *, needs_cuda: bool = True) -> str | None:
    """Why the host's driver cannot run the stack (missing, too old, too new for the card), or None.
    `needs_cuda` False (no CUDA pin, no framework): an older driver that drives the card is fine,
    the job uses the host's own CUDA; `assess` notes it instead."""
    if stack.architecture == "none":
        return None
    fix = (
        f"install it with `{install_command(stack)}` (needs sudo), or set stack: {{install: true}} in the job"
        if stack.cuda_repo
        else f"install driver R{stack.driver} with the system's own packages (gpucloud "
        f"installs drivers only on {SUPPORTED_OS})"
    )
    if probe.driver is None:
        why = probe.smi_error or "nvidia-smi shows no GPU"
        return f"{probe.host}: no working NVIDIA driver ({why}); the {stack.gpu} needs driver R{stack.driver}: {fix}"
    have = _version_tuple(probe.driver)
    if needs_cuda and have < _version_tuple(stack.min_driver_version):
        return (
            f"{probe.host}: driver {probe.driver} is older than {stack.min_driver_version}, the least that runs "
            f"CUDA {stack.cuda}: {fix}"
        )
    last = LAST_BRANCH.get(stack.architecture)
    if last is not None and have and have[0] > last:
        return (
            f"{probe.host}: driver {probe.driver} no longer supports {stack.architecture} GPUs ({stack.gpu}); "
            f"R{last} is the last branch that does: {fix}"
        )
    return None


def assess(probe: HostProbe, gpu: str | None, count: int, job: PlanRequest) -> HostProbe:
    """Resolve the stack for the job's GPU (or the host's own first GPU when the job names none)
    with the job's resolver, and list what stops the job on this host, each with its fix."""
    if not probe.user and probe.problems:  # the host answered nothing: nothing more to judge
        return probe
    model = gpu or probe.gpu_model
    probe.stack = host_stack(job.stack_for(model), probe) if model and job.stack_for else None
    if probe.missing_tools:
        probe.problems.append(
            f"{probe.host}: missing {', '.join(probe.missing_tools)} (the node's shim and agent need them); "
            "install them with the system's package manager"
        )
    if gpu is None:
        return probe
    install = bool(job and job.install)
    if probe.gpus and probe.count(gpu) < count:
        have = ", ".join(f"{g.index}: {g.name}" for g in probe.gpus) or "none"
        probe.problems.append(f"{probe.host}: has {probe.count(gpu)} x {gpu}, the job asks for {count} (GPUs: {have})")
    assert probe.stack is not None
    needs_cuda = bool(job and job.needs_cuda)
    problem = driver_problem(probe, probe.stack, needs_cuda=needs_cuda)
    if problem is None and probe.driver and driver_problem(probe, probe.stack) is not None:
        probe.notes.append(
            f"{probe.host}: driver {probe.driver} (CUDA {probe.cuda or '?'}) is older than the "
            f"{probe.stack.min_driver_version} that CUDA {probe.stack.cuda} needs; the job uses the "
            "host's own CUDA (pin stack.cuda or a framework to require the resolved one)"
        )
    if problem and not (install and probe.sudo in ("root", "yes") and probe.stack.cuda_repo):
        if install and not probe.stack.cuda_repo:
            problem += f" (stack.install is true, but this host runs {os_label(probe)}: not {SUPPORTED_OS})"
        elif install:
            problem += f" (stack.install is true, but {probe.user or 'the user'} has no passwordless sudo there)"
        probe.problems.append(problem)
    return probe


def probe_host(host: str) -> HostProbe:
    """Run the probe over ssh (one call) and parse it."""
    parsed = ssh_transport.SshHost.parse(host)
    result = ssh_transport.run(parsed, PROBE_SCRIPT, timeout=PROBE_TIMEOUT_S, max_output=PROBE_MAX)
    return parse_probe(host, ssh_transport.clean_text(result.stdout.decode("utf-8", "replace")))


def probe_or_unreachable(host: str) -> HostProbe:
    """probe_host, with a host that does not answer as a probe whose problem says so: `hosts probe`
    reports every host, and a plan names every unreachable one, not only the first."""
    try:
        return probe_host(host)
    except ssh_transport.SshUnreachable as exc:
        why = f"{exc.message} ({exc.hint})" if exc.hint else exc.message
        return HostProbe(host=host, unreachable=why, problems=[why])


def render_probe(probe: HostProbe) -> str:
    """Human lines for `gpucloud hosts probe`."""
    if probe.unreachable:
        return f"{probe.host}: unreachable\n  problem: {probe.unreachable}"
    lines = [
        f"{probe.host}: {probe.user}@, {probe.os or 'unknown OS'}, {probe.disk_free_gib:.1f} GiB free in {probe.root}, "
        f"sudo: {probe.sudo}"
    ]
    if probe.gpus:
        for g in probe.gpus:
            held = f", locked by run {probe.locks[g.index]}" if g.index in probe.locks else ""
            lines.append(f"  GPU {g.index}: {g.name} ({g.model or 'not in the catalog'}), {g.memory_mib} MiB{held}")
        lines.append(f"  driver {probe.driver}, CUDA {probe.cuda or '?'}")
    else:
        lines.append(f"  no GPU: {probe.smi_error or 'nvidia-smi shows none'}")
    if probe.stack:
        st = probe.stack.as_json()
        lines.append(
            f"  stack: {st['architecture']}, driver R{st['driver']}, CUDA {st['cuda']}, cuDNN {st['cudnn']}, "
            f"framework {st['framework']}; OS {st['os_image']}, NVIDIA repository "
            f"{probe.stack.cuda_repo or 'none (gpucloud installs drivers only on ' + SUPPORTED_OS + ')'}"
        )
        for w in [*probe.stack.warnings, *probe.notes]:
            lines.append(f"  note: {w}")
    lines += [f"  problem: {p}" for p in probe.problems] or ["  ready for jobs"]
    return "\n".join(lines)
