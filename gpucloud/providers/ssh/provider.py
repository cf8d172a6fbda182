"""The ssh provider: jobs on machines the user already has (a K40 box, a DevBox, an on-premise
cluster), reached with the system's OpenSSH client (docs/SSH.md).

A node is the usual bootstrap, started on its host detached from the ssh session (setsid nohup:
it survives a dropped connection) in `<remote root>/work/<run_id>/node-<rank>`; its channel is a
file channel on the host that the CLI reads over ssh (ssh_channel.py). Hosts are shared machines:
a lock per GPU index (taken under a per-host flock) hands each run its own GPUs, passed to the job
as CUDA_VISIBLE_DEVICES. Teardown kills the run's processes and removes its folders and locks; it
never shuts a machine down (the bootstrap's last step is a plain exit).
"""

from __future__ import annotations

import random
import re
import shlex
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING

from gpucloud.contract.provider import (
    Candidate,
    Capabilities,
    CapacityError,
    FatalProvisionError,
    LaunchRequest,
    Provider,
    RunHandle,
)
from gpucloud.contract.session import SessionAsk, SessionPlan, session_tail
from gpucloud.contract.tags import GcIncomplete, is_run_id
from gpucloud.errors import UserError
from gpucloud.providers.ssh import transport as ssh_transport
from gpucloud.providers.ssh.channel import (
    PRIVATE,
    REMOVE_RUN,
    SshChannel,
    fill_root,
    removal_problem,
    start_relay,
)
from gpucloud.providers.ssh.probe import (
    HOST_NVIDIA_REPO,
    REMOTE_ROOT,
    SMI_MAX,
    SMI_TIMEOUT_S,
    SUPPORTED_OS,
    HostProbe,
    assess,
    driver_problem,
    host_stack,
    install_command,
    os_label,
    probe_host,
    probe_or_unreachable,
)
from gpucloud.providers.ssh.session import NODE_SHELL, entry_options, session_argv
from gpucloud.ui.untrusted import shown

if TYPE_CHECKING:
    from gpucloud.contract.provider import Journal, PlanRequest
    from gpucloud.plan.stack_data import Stack
    from gpucloud.state.runs_db import Store

# How long stopped nodes get: the bootstrap gives its job 5 s to end on SIGTERM, then uploads.
STOP_GRACE_S = 15
MAX_GC_LINES = 10000  # folders one gc reads per host
STALE_LOCK_S = 120  # a lock whose run has no live process and no fresh folder is free again

# Identity of a run's processes on a host: the launch puts GPUCLOUD_VM_DIR=<node folder> in the
# bootstrap's environment, which the job, its children and the backstop inherit (even after setsid).
# A recorded pid is only signalled or counted as alive when /proc/PID/environ still carries that
# cookie: a pid the kernel has since given to someone else's process is never ours.
OURS = r"""
ours() { [ -n "$1" ] && grep -qszxF "GPUCLOUD_VM_DIR=$2" "/proc/$1/environ"; }
marked() { grep -lszxF "GPUCLOUD_VM_DIR=$1" /proc/[0-9]*/environ | cut -d/ -f3; }
"""

# Allocates NGPU free GPU indices under the host's flock; prints `@gpus 0,1` or `@busy <idx>:<run> ...`.
LOCK_SCRIPT = (
    r"""
L="$R/locks"; mkdir -p "$L" "$R/work" || exit 1
exec 9>"$L/.mutex"; flock -w 60 9 || { echo "@busy mutex"; exit 0; }
owner_alive() {
  local d="$R/work/$1" p
  [ -d "$d" ] || return 1
  for p in "$d"/node-*/pid; do [ -f "$p" ] && ours "$(head -c 20 "$p")" "${p%/pid}" && return 0; done
  [ $(( $(date +%s) - $(stat -c %Y "$d") )) -lt __STALE__ ]
}
mkdir -p "$R/work/$RUN"
total=$( { if command -v timeout >/dev/null; then timeout -k 2 __SMI_T__ nvidia-smi -L
            else nvidia-smi -L; fi; } 2>/dev/null \
  | head -c __SMI_MAX__ | grep -c '^GPU ')
free=""; held=""; n=0
for ((i = 0; i < total; i++)); do
  f="$L/gpu-$i"; o=$(cat "$f" 2>/dev/null)
  if [ -z "$o" ] || [ "$o" = "$RUN" ] || ! owner_alive "$o"; then
    if ((n < NGPU)); then free="$free${free:+,}$i"; n=$((n + 1)); fi
  else held="$held $i:$o"; fi
done
if ((n < NGPU)); then echo "@busy$held"; exit 0; fi
for i in ${free//,/ }; do echo "$RUN" >"$L/gpu-$i"; done
echo "@gpus $free"
""".replace("__STALE__", str(STALE_LOCK_S))
    .replace("__SMI_T__", str(SMI_TIMEOUT_S))
    .replace("__SMI_MAX__", str(SMI_MAX))
)

LAUNCH_SCRIPT = r"""
W="$R/work/$RUN/node-$RANK"; rm -rf "$W"; mkdir -p "$W" && cat >"$W/bootstrap.sh" || exit 1
echo "$EXPIRES" >"$W/expires"
cd "$W" || exit 1
CUDA_VISIBLE_DEVICES="$GPUS" GPUCLOUD_VM_DIR="$W" GPUCLOUD_NODE_RANK="$RANK" \
  setsid nohup bash "$W/bootstrap.sh" </dev/null >"$W/console.log" 2>&1 &
echo $! >"$W/pid"; echo "@pid $!"
"""

STATES_SCRIPT = r"""
for p in "$R/work/$RUN"/node-*/pid; do
  [ -f "$p" ] || continue
  r=${p%/pid}; r=${r##*-}
  if ours "$(head -c 20 "$p")" "${p%/pid}"; then echo "$r running"; else echo "$r gone"; fi
done
"""

# TERM every process carrying the run's cookie and the process groups they lead or share (the
# bootstrap's, the job's own: the bootstrap setsid's the job; the deadline backstop, in a session of
# its own, which would otherwise KILL process groups by number at the deadline), wait, KILL.
TEARDOWN_SCRIPT = (
    r"""
ours_pids() { for d in "$R/work/$RUN"/node-*; do [ -d "$d" ] && marked "$d"; done; }
sig() {
  pids=$(ours_pids); [ -n "$pids" ] || return 0
  for p in $pids; do sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f3; done | sort -u | while read -r g; do
    [ -n "$g" ] && [ "$g" != 0 ] && kill -"$1" -- "-$g" 2>/dev/null
  done
  for p in $pids; do kill -"$1" "$p" 2>/dev/null; done
}
sig TERM
for _ in $(seq 1 $((GRACE * 10))); do [ -z "$(ours_pids)" ] && break; sleep 0.1; done
sig KILL
for f in "$R/work/$RUN"/node-*/mounts.json; do
  [ -f "$f" ] || continue  # input mounts (vm/agent/mounts.py) a killed rclone left: rm must not walk a bucket
  grep -o '"path": "[^"]*"' "$f" | cut -d'"' -f4 | while read -r m; do
    fusermount3 -uz "$m" 2>/dev/null || fusermount -uz "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
  done
done
for f in "$R/locks"/gpu-*; do [ -f "$f" ] && [ "$(cat "$f")" = "$RUN" ] && rm -f "$f"; done
"""
    + REMOVE_RUN
)

# Stop a run's nodes and keep their folders: TERM each bootstrap's group (the bootstrap stops its
# job once, uploads what the job saved and its final status), wait for it; a node whose bootstrap
# is gone gets its job TERMed. The teardown that follows kills what is left and removes the folders.
STOP_SCRIPT = r"""
pids=""
for d in "$R/work/$RUN"/node-*; do
  p=$(cat "$d/pid" 2>/dev/null) || continue
  if kill -0 "$p" 2>/dev/null; then kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p"; pids="$pids $p"
  elif [ -s "$d/job.pgid" ]; then kill -TERM -- "-$(cat "$d/job.pgid")" 2>/dev/null; fi
done
for _ in $(seq 1 $((GRACE * 10))); do
  alive=""; for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ -z "$alive" ] && break; sleep 0.1
done
true
"""

GC_SCRIPT = r"""
now=$(date +%s)
for e in "$R"/work/*/node-*/expires; do
  [ -f "$e" ] || continue
  d=${e%/expires}; run=${d%/node-*}; run=${run##*/}
  if [ -f "$d/pid" ] && ours "$(head -c 20 "$d/pid")" "$d"; then
    [ "$(cat "$e")" -lt "$now" ] && echo "@expired $run ${d##*/}"
  elif [ $((now - $(stat -c %Y "$e"))) -gt 86400 ]; then echo "@ended $run ${d##*/}"; fi
done
"""


def _host(text: str) -> ssh_transport.SshHost:
    return ssh_transport.SshHost.parse(text)


def _script(body: str, **values: object) -> str:
    """Prefix a remote script with its variables, each quoted once for the remote shell."""
    head = "".join(f"{k}={shlex.quote(str(v))}; " for k, v in values.items())
    return f"{PRIVATE}R={REMOTE_ROOT}; {head}\n{OURS}{body}"


def _assumed_note(down: dict[str, str], job: PlanRequest) -> str:
    """The warning for a plan made from the job file alone: which hosts, why, and what was assumed."""
    gpus = f"{job.gpu_count} x {job.gpu}" if job.gpu else "no GPU (a CPU job)"
    os_image = job.stack_for(job.gpu).os_image if job.stack_for else "ubuntu-22.04"
    return (
        f"{', '.join(down)} did not answer, so this plan comes from the job file alone: assumed {gpus} "
        f"there, {os_image} and the stack gpucloud resolves for that GPU (the host's own OS, driver and "
        f"CUDA are unknown); `run` needs the host to answer ({'; '.join(down.values())})."
    )


def probe_hosts(hosts: list[str], job: PlanRequest) -> list[HostProbe]:
    """Probe every host at once (one ssh call each) and judge it for the job (`hosts probe`
    without --gpu: a job that names no GPU, its stack resolved for each host's own)."""
    with ThreadPoolExecutor(max_workers=min(8, len(hosts) or 1)) as pool:
        probes = list(pool.map(probe_or_unreachable, hosts))  # every host answers for itself
    return [p if p.unreachable else assess(p, job.gpu, job.gpu_count, job) for p in probes]


class SshProvider(Provider):
    """Provider protocol over ssh. Region = the run's hosts in rank order, joined with commas."""

    name = "ssh"
    capabilities = Capabilities(
        poll_interval=1.0,
        log_interval=1.0,
        heartbeat_interval=5.0,
        barrier_timeout=600.0,
        self_termination="exit",
        vm_dir="$GPUCLOUD_VM_DIR",
        install_stack=False,
        gpu_check="warn",
        node_ips_known=False,
        spot=False,
        multi_node=True,
        console_hint="its console output is in <remote root>/work/{run_id}/node-{rank}/console.log on {region}",
        channel_torn_down=True,  # the channel is a folder on the host, removed with the run
    )

    def __init__(self) -> None:
        self._channels: dict[str, SshChannel] = {}
        self._planned: list[HostProbe] = []  # the usable hosts of the last plan_candidates, in order
        self._notes: list[str] = []  # what the last plan assumed for hosts that did not answer

    # -- planning -------------------------------------------------------------------------------------

    def plan_candidates(self, job: PlanRequest) -> list[Candidate]:
        """One candidate per window of `num_nodes` consecutive usable hosts (failover moves on to
        the next window when a host is busy). Hosts that cannot run the job are named with the fix."""
        hosts = list(job.hosts)
        where = f"{job.source}: " if job.source else ""
        if not hosts:
            raise UserError(
                f"{where}resources.hosts: cloud: ssh needs the machines to use.",
                hint="Add hosts: [gpu-box, alice@10.0.0.7:2222] under resources, or pass --host HOST.",
            )
        probes = probe_hosts(hosts, job)
        usable = [p.host for p in probes if not p.problems]
        self._planned = [p for p in probes if not p.problems]
        down = {p.host: p.unreachable for p in probes if p.unreachable}
        if len(usable) < job.num_nodes and down:
            usable = [p.host for p in probes if not p.problems or p.unreachable]  # the silent ones assumed fit
            if len(usable) < job.num_nodes:  # try again later (75), every silent host named
                raise ssh_transport.SshUnreachable(
                    f"{where}resources.hosts: {len(down)} of {len(hosts)} host(s) do not answer:\n  - "
                    + "\n  - ".join(down.values())
                )
            self._notes = [_assumed_note(down, job)]
        if len(usable) < job.num_nodes:
            problems = [line for p in probes for line in p.problems]
            raise UserError(
                f"{where}resources.hosts: {len(usable)} of {len(hosts)} host(s) can run this job, "
                f"it needs {job.num_nodes}:\n  - " + "\n  - ".join(problems or ["(no problem reported)"]),
                hint="`gpucloud hosts probe HOST` shows what each host has.",
            )
        label = f"{job.gpu_count}x{job.gpu}" if job.gpu else "cpu"
        n = job.num_nodes
        return [
            Candidate(
                cloud=self.name,
                region=",".join(usable[i : i + n]),
                instance_type=label,
                gpu=job.gpu or "",
                gpu_count=job.gpu_count,
                num_nodes=n,
                spot=False,
                price_per_hour=0.0,
                total_per_hour=0.0,
                estimated_cost=0.0,
                assumed=self._notes[0] if set(usable[i : i + n]) & set(down) else "",
            )
            for i in range(len(usable) - n + 1)
        ]

    def plan_notes(self) -> list[str]:
        """What the plan assumed for hosts that did not answer (a `plan`/`render` warning)."""
        return list(self._notes)

    def plan_stack(self, stack: Stack) -> Stack:
        """The stack as on the first planned host: its own OS and NVIDIA's repository for it."""
        return host_stack(stack, self._planned[0]) if self._planned else stack

    # -- Provider protocol ----------------------------------------------------------------------------

    def channel(self, region: str) -> SshChannel:
        if region not in self._channels:
            self._channels[region] = SshChannel(region.split(","))
        return self._channels[region]

    def master_port(self) -> int:
        """Hosts are shared machines: a fixed 29500 may be another run's; pick one per run."""
        return random.randint(29500, 32767)

    def provision(self, req: LaunchRequest, journal: Journal) -> RunHandle:
        """Per host, in rank order: install the driver if allowed and needed, lock GPUs, start the
        bootstrap detached. Any failure tears down what this attempt started."""
        hosts = req.region.split(",")
        handle = RunHandle(run_id=req.run_id, cloud=self.name, region=req.region, attempt=req.attempt)
        try:
            for rank, (host, script) in enumerate(zip(hosts, req.user_data, strict=False)):
                # The node's folder outlives its process (console log, channel parts): a resource of
                # its own, so a finished run still has something for `down` (or gc) to remove.
                folder_id = journal.intent(
                    req.run_id, "folder", f"{req.run_id}/node-{rank}/folder", req.region, self.name
                )
                res_id = journal.intent(req.run_id, "process", f"{req.run_id}/node-{rank}", req.region, self.name)
                self._maybe_install(host, req)
                gpus = self._lock_gpus(host, req.run_id, req.gpu_count)
                out = ssh_transport.run(
                    _host(host),
                    _script(
                        LAUNCH_SCRIPT, RUN=req.run_id, RANK=rank, GPUS=gpus, EXPIRES=int(req.expires_at.timestamp())
                    ),
                    input=fill_root(script, host).encode(),
                ).stdout.decode("utf-8", "replace")
                pid = next((line.split()[1] for line in out.splitlines() if line.startswith("@pid ")), "?")
                handle.nodes.append(f"{host}#{pid}")
                journal.created(res_id, f"{host}#{pid}")
                journal.created(folder_id, f"{host}:work/{req.run_id}/node-{rank}")
        except (ssh_transport.SshError, CapacityError, FatalProvisionError) as exc:
            self._quiet_teardown(handle, journal)
            if isinstance(exc, (CapacityError, FatalProvisionError)):
                raise
            raise FatalProvisionError(exc.message, code="ssh", hint=exc.hint) from exc
        except BaseException:
            self._quiet_teardown(handle, journal)
            raise
        if len(hosts) > 1:
            start_relay(req.run_id, hosts, self.capabilities.barrier_timeout + 60)
        return handle

    def _quiet_teardown(self, handle: RunHandle, journal: Journal) -> None:
        try:
            self.teardown(handle, journal, wait=False)
        except Exception:  # noqa: BLE001 - the lifecycle's final teardown retries
            pass

    def _maybe_install(self, host: str, req: LaunchRequest) -> None:
        """`stack: {install: true}`: install the driver over ssh (sudo -n) when the host lacks it."""
        wanted = req.install_stack
        if not req.gpu or wanted is None:
            return
        probe = probe_host(host)
        if driver_problem(probe, wanted, needs_cuda=req.needs_cuda) is None:
            return
        stack = host_stack(wanted, probe)
        if not stack.cuda_repo:
            raise FatalProvisionError(
                f"{host}: the driver must be installed and the host runs {os_label(probe)}; "
                f"gpucloud installs drivers only on {SUPPORTED_OS}.",
                hint=f"Install driver R{stack.driver} with the host's own packages.",
            )
        if probe.sudo not in ("root", "yes"):
            raise FatalProvisionError(
                f"{host}: the driver must be installed and {probe.user} has no passwordless sudo.",
                hint=f"Run on the host: {install_command(stack)}",
            )
        command = install_command(stack, probe.sudo, HOST_NVIDIA_REPO)
        res = ssh_transport.run(_host(host), f'cd "$(mktemp -d)" && {command}', timeout=3600, check=False)
        if res.returncode != 0:
            raise FatalProvisionError(f"{host}: installing driver R{wanted.driver} failed: {res.stderr[-400:]}")

    def _lock_gpus(self, host: str, run_id: str, count: int) -> str:
        """CUDA_VISIBLE_DEVICES for this run on this host ("" for a CPU job), or CapacityError."""
        out = ssh_transport.run(_host(host), _script(LOCK_SCRIPT, RUN=run_id, NGPU=count)).stdout.decode(
            "utf-8", "replace"
        )
        for line in out.splitlines():
            if line.startswith("@gpus"):
                return line[5:].strip()
            if line.startswith("@busy"):
                held = line[5:].split()
                who = ", ".join(f"GPU {h.replace(':', ' held by run ', 1)}" for h in held) or "no free GPU"
                raise CapacityError(
                    f"{host}: {count} GPU(s) needed, not free ({shown(who, limit=500)}).",
                    hint="Wait for that run (`gpucloud ls`), or name more hosts.",
                )
        raise FatalProvisionError(f"{host}: could not take the GPU lock: {shown(out.strip()[-300:])}")

    def node_states(self, handle: RunHandle) -> list[str]:
        """ "running" or "gone" per node; a host that cannot be reached counts as running (it may be
        a dropped connection: the node goes on; the heartbeat and max_duration still bound it)."""
        states: list[str] = []
        for rank, host in enumerate(handle.region.split(",")):
            try:
                out = ssh_transport.run(_host(host), _script(STATES_SCRIPT, RUN=handle.run_id)).stdout.decode(
                    "utf-8", "replace"
                )
            except ssh_transport.SshError:
                states.append("running")
                continue
            found = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
            states.append(found.get(str(rank), "gone"))
        return states

    def session_path(self, handle: RunHandle, rank: int, ask: SessionAsk) -> SessionPlan:
        """Real ssh to the node's host with the provider's own settings, into the node's folder
        with the GPUs the run holds there; forwards listen on the caller's loopback only."""
        host = _host(handle.region.split(",")[rank])
        remote = _script(NODE_SHELL.replace("__TAIL__", session_tail(ask)), RUN=handle.run_id, RANK=rank)
        return SessionPlan(
            argv=session_argv(host, remote, ask),
            ssh_options=entry_options(host),
            node_folder=f"{REMOTE_ROOT}/work/{handle.run_id}/node-{rank}",
        )

    def stop(self, handle: RunHandle) -> None:
        """Stop the run's nodes as a shutdown would and keep their folders: the lifecycle reads an
        interrupted run's last log lines and artifacts back before the teardown removes them."""
        for host in dict.fromkeys(handle.region.split(",")):
            ssh_transport.run(_host(host), _script(STOP_SCRIPT, RUN=handle.run_id, GRACE=STOP_GRACE_S), timeout=60)

    def teardown(self, handle: RunHandle, journal: Journal, *, wait: bool = True) -> None:
        """Kill the run's processes, remove its work and channel folders and GPU locks, per host."""
        errors, unreached = [], 0
        for host in dict.fromkeys(handle.region.split(",")):
            try:
                ssh_transport.run(
                    _host(host), _script(TEARDOWN_SCRIPT, RUN=handle.run_id, GRACE=5 if wait else 2), timeout=60
                )
            except ssh_transport.SshError as exc:
                errors.append(exc.message)
                unreached += isinstance(exc, ssh_transport.SshUnreachable)
        if errors:
            kind = ssh_transport.SshUnreachable if unreached == len(errors) else ssh_transport.SshError
            raise kind("; ".join(errors))
        for res in journal.resources(handle.run_id, alive_only=True):
            if res.cloud == self.name:
                journal.deleted(res.id)

    def gc(self, now: datetime, *, dry_run: bool) -> list[str]:
        """On every host a recorded run used: kill nodes past their expiry, remove day-old folders
        (and their GPU locks), and mark the run's journal rows deleted. A folder whose name is not
        a run id is named and left alone; what could not be removed ends in GcIncomplete."""
        from gpucloud.state.runs_db import Store

        store = Store()
        hosts = {h for r in store.list_runs() if r.cloud == self.name and r.region for h in r.region.split(",")}
        lines: list[str] = []
        failures: list[str] = []
        for host in sorted(hosts):
            try:
                out = ssh_transport.run(_host(host), _script(GC_SCRIPT), retries=0).stdout
            except (ssh_transport.SshError, UserError) as exc:
                lines.append(f"ssh: {host}: not reachable ({exc.message})")
                continue
            for line in out.decode("utf-8", "replace").splitlines()[:MAX_GC_LINES]:
                kind, run_id, node = (line.split() + ["", "", ""])[:3]
                if not is_run_id(run_id) or not re.fullmatch(r"node-[0-9]{1,6}", node):
                    lines.append(f"ssh: {host}: work/{shown(line, limit=200)}: not a gpucloud run's folder, left alone")
                    continue
                what = "expired, still running" if kind == "@expired" else "ended over a day ago"
                head = f"ssh: {host}: {run_id}/{node} {what}"
                if dry_run:
                    lines.append(f"{head} (would remove)")
                    continue
                problems = self._sweep_run(store, host, run_id, node)
                lines.append(f"{head} ({'NOT removed: ' + '; '.join(problems) if problems else 'removed'})")
                failures += [f"ssh: {host}: {run_id}: {p}" for p in problems]
        if failures:
            raise GcIncomplete(lines, failures)
        return lines

    def _sweep_run(self, store: Store, host: str, run_id: str, node: str) -> list[str]:
        """Tear one run down on one host for gc; what could not be removed (the journal rows of the
        node are marked deleted only when nothing is left)."""
        from gpucloud.state.runs_db import Journal

        try:
            out = ssh_transport.run(_host(host), _script(TEARDOWN_SCRIPT, RUN=run_id, GRACE=2), timeout=60).stdout
        except ssh_transport.SshError as exc:
            return [exc.message]
        problems = [
            removal_problem(word, shown(path, limit=200))
            for word, _, path in (line.partition(" ") for line in out.decode("utf-8", "replace").splitlines())
            if word in ("@refused", "@kept")
        ]
        if not problems:
            journal = Journal(store)
            for res in journal.resources(run_id, alive_only=True):
                if res.cloud == self.name and res.name in (f"{run_id}/{node}", f"{run_id}/{node}/folder"):
                    journal.deleted(res.id)
        return problems
