"""The slurm provider: jobs submitted with sbatch to a cluster people already have, through its
login node (docs/SLURM.md). Slurm places the job and enforces its time limit; gpucloud renders
the usual VM shim, which every node runs under a small wrapper (batch.py) and which fetches the
agent from the run's channel, and reads that channel and Slurm's view of the job through the login
node (channel.py)."""

from __future__ import annotations

import io
import os
import random
import re
import shlex
import tarfile
import urllib.parse
from datetime import datetime
from typing import TYPE_CHECKING

from gpucloud.contract.provider import (
    Candidate,
    CandidateError,
    Capabilities,
    FatalProvisionError,
    LaunchRequest,
    Provider,
    ProvisionError,
    RunHandle,
    expiry_tag,
)
from gpucloud.contract.session import SessionAsk, SessionPlan
from gpucloud.contract.tags import GcIncomplete
from gpucloud.errors import UserError
from gpucloud.providers.slurm import batch, sizing, sweep
from gpucloud.providers.slurm.channel import SlurmChannel
from gpucloud.providers.slurm.cluster import PLAN_SCRIPT, Partition, allowed, gpu_matches, parse_plan
from gpucloud.providers.slurm.login import Login, script
from gpucloud.providers.slurm.session import slurm_session
from gpucloud.providers.slurm.sizing import Size
from gpucloud.providers.ssh import transport as ssh_transport
from gpucloud.providers.ssh.channel import REMOVE_RUN, ROOT_TOKEN
from gpucloud.ui.untrusted import shown

if TYPE_CHECKING:
    from gpucloud.contract.provider import Journal, PlanRequest

RATE_ENV = "GPUCLOUD_SLURM_GPU_HOUR_RATE"  # chargeback $ per GPU-hour (plan and cost show $ with it)
STOP_GRACE_S = 30  # scancel's TERM, Slurm's KillWait, the agent's artifact upload

# `sbatch --parsable` prints exactly `jobid` or `jobid;cluster` (a multi-cluster site); its warnings
# go to stderr. Anything else (a site's wrapper that ignores --parsable) is no job id: the run's job,
# found by its name among the caller's own, is cancelled and `@unreadable OUT` says what was printed.
SUBMIT_SCRIPT = r"""
cd "$D" || exit 1
out=$(sbatch "$@" --output="$D/slurm-%j.out" "$D/job.sbatch" 2>"$D/sbatch.err"); rc=$?
err=$(head -c 2000 "$D/sbatch.err" 2>/dev/null); rm -f "$D/sbatch.err"
[ $rc -eq 0 ] || { echo "@refused $err $out"; exit 0; }
j=""
[ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] && j=$(printf '%s\n' "$out" | grep -Ex '[0-9]{1,12}(;.*)?' | cut -d';' -f1)
if [ -z "$j" ]; then
  me=$(id -un) && for i in $(squeue -h -u "$me" -n "$NAME" -o %i 2>/dev/null | grep -Ex '[0-9]{1,12}'); do
    scancel -u "$me" "$i"
  done
  echo "@unreadable $(printf '%s' "$out" | head -c 500 | tr '\n' ' ')"; exit 0
fi
echo "$j" >"$D/slurm-job"; echo "@job $j"
"""

# scancel the run's jobs (TERM, then Slurm's KillWait, then KILL) and wait until Slurm lets go of them.
# Only jobs the caller owns (an admin's scancel would end anyone's); with REMOVE, only folders whose
# real path is exactly the run's under the real remote root (no `..`, no link on the way), and only
# once its jobs are gone. Says `@left IDS` (still queued), `@scancel ERR`, and REMOVE_RUN's words.
CANCEL_SCRIPT = (
    r"""
me=$(id -un) || exit 1
j=$(head -c 40 "$R/work/$RUN/slurm-job" 2>/dev/null | tr -cd '0-9')
want=$(echo $JOBS $j | tr ' ' '\n' | grep -E '^[0-9]+$' | sort -u)
q=$(squeue -h -u "$me" -o %i 2>&1) ||
  { echo "@scancel squeue could not list the jobs: $(echo $q | head -c 300)"; exit 0; }
mine=$(printf '%s\n' "$q" | head -n 100000 | grep -E '^[0-9]+$' | sort -u)
mine=" $(echo $mine) "; ids=""
for i in $want; do case "$mine" in *" $i "*) ids="$ids $i" ;; esac; done
if [ -n "${ids// /}" ]; then err=$(scancel -u "$me" $ids 2>&1) || echo "@scancel $(echo $err | head -c 500)"; fi
left=""
for _ in $(seq 1 $((GRACE * 5))); do
  [ -z "${ids// /}" ] && break
  left=$(for i in $ids; do squeue -h -u "$me" -j "$i" -o %i 2>/dev/null; done | tr '\n' ' ')
  [ -z "${left// /}" ] && break; sleep 0.2
done
[ -n "${left// /}" ] && { echo "@left $left"; exit 0; }
[ -n "$REMOVE" ] || exit 0
"""
    + REMOVE_RUN
)

# The caller's own jobs only (`-u`: an admin's squeue lists everyone's), each with its owner, which
# the CLI checks again (a squeue that ignored -u would show strangers' jobs).
GC_SCRIPT = r"""
me=$(id -un) || exit 1
echo "@me $me"
squeue -h -u "$me" -o "%i|%u|%k" 2>/dev/null | head -n 10000 | head -c 2000000
"""


class SlurmProvider(Provider):
    """Provider protocol over Slurm. Region = `<cluster>/<partition>` (cluster: the login node as
    the job wrote it, or `local`); instance type = the GRES asked per node (`gpu:k80:2`)."""

    name = "slurm"
    capabilities = Capabilities(
        poll_interval=1.0,
        log_interval=1.0,
        heartbeat_interval=5.0,
        barrier_timeout=600.0,
        self_termination="exit",
        vm_dir="$GPUCLOUD_VM_DIR",
        install_stack=False,  # the site's driver: checked on the node, never installed
        gpu_check="warn",
        node_ips_known=False,
        spot=False,
        multi_node=True,
        console_hint="its console output is in <remote root>/work/{run_id}/node-{rank}/console.log on {region}",
        channel_torn_down=True,  # the channel is a folder on the cluster, removed with the run
    )

    def __init__(self) -> None:
        self._channels: dict[str, SlurmChannel] = {}
        self._notes: list[str] = []

    # -- planning -------------------------------------------------------------------------------------

    def plan_candidates(self, job: PlanRequest) -> list[Candidate]:
        """One candidate per partition that can run the job (the job's `partition:` list in its
        order, else the default partition first); the others are named with why (plan_notes)."""
        where = f"{job.source}: " if job.source else ""
        cluster = job.scheduler.get("cluster", "")
        login = Login(cluster)
        text = login.run(PLAN_SCRIPT, timeout=60, max_output=8 << 20).stdout.decode("utf-8", "replace")
        if "@missing sbatch" in text:
            raise UserError(
                f"{where}resources.cluster: {cluster} has no sbatch on its PATH: not a Slurm submit host.",
                hint=f"Check `{login.shell('sinfo')}`.",
            )
        unreadable: list[str] = []
        parts = parse_plan(text, unreadable)
        cands, self._notes = [], unreadable
        for part in _partition_order(parts, job, where, cluster):
            why, gres_type, idle, size = _judge(part, job)
            if why:
                self._notes.append(f"slurm: partition {part.name} excluded: {why}.")
                continue
            cands.append(_candidate(self.name, cluster, part, job, gres_type, size))
            self._notes.extend(_partition_notes(part.name, job, idle, size))
        if not cands:
            raise UserError(
                f"{where}resources: no partition of {cluster} can run this job:\n  - "
                + "\n  - ".join(self._notes or ["(the cluster has no partition)"]),
                hint=f"`{login.shell('sinfo -o %P %G %l %a')}` shows what the cluster has.",
            )
        if job.gpu:
            self._notes.extend(_gpu_hour_notes(job, cands[0].price_per_hour))
        return cands

    def plan_notes(self) -> list[str]:
        """Why partitions were left out, and which will queue (shown as plan warnings)."""
        return list(self._notes)

    # -- Provider protocol ----------------------------------------------------------------------------

    def channel(self, region: str) -> SlurmChannel:
        cluster = region.rsplit("/", 1)[0]
        if cluster not in self._channels:
            self._channels[cluster] = SlurmChannel(Login(cluster))
        return self._channels[cluster]

    def master_port(self) -> int:
        """Cluster nodes are shared: a fixed 29500 may be another job's; pick one per run."""
        return random.randint(29500, 32767)

    def provision(self, req: LaunchRequest, journal: Journal) -> RunHandle:
        """Write the run's folder (sbatch script, node wrapper, one shim per rank) through the
        login node in one call, then sbatch it; the job id goes into the handle."""
        cluster, partition = req.region.rsplit("/", 1)
        login = self.channel(req.region).login
        handle = RunHandle(run_id=req.run_id, cloud=self.name, region=req.region, attempt=req.attempt)
        folder_id = journal.intent(req.run_id, "folder", f"{req.run_id}/folder", req.region, self.name)
        job_res = journal.intent(req.run_id, "job", f"{req.run_id}/job", req.region, self.name)
        try:
            root = login.root()
            run_dir, chan_dir = f"{root}/work/{req.run_id}", f"{root}/channel/runs/{req.run_id}"
            files = {
                "job.sbatch": batch.batch_script(req.run_id, run_dir, Size.of(req.vcpus, req.memory_gib)),
                "node.sh": batch.node_wrapper(req.run_id, run_dir, chan_dir),
                "expires": str(int(req.expires_at.timestamp())),
            }
            for rank, text in enumerate(req.user_data):
                files[f"shim-{rank}.sh"] = text.replace(ROOT_TOKEN, urllib.parse.quote(root))
            login.run(script('mkdir -p "$D" && tar -xzf - -C "$D"', D=run_dir), input=_tarball(files))
            journal.created(folder_id, f"{cluster}:work/{req.run_id}")
            gres_type = req.instance_type.split(":")[1] if req.instance_type.startswith("gpu:") else ""
            comment = f"gpucloud-run={req.run_id},gpucloud-expires={expiry_tag(req.expires_at)}"
            opts = batch.sbatch_options(req, partition, gres_type, comment)
            submit = script(SUBMIT_SCRIPT, D=run_dir, NAME=f"gpucloud-{req.run_id}")
            out = login.run(submit.replace('"$@"', shlex.join(opts)), timeout=60)
            text = out.stdout.decode("utf-8", "replace")
        except ssh_transport.SshError as exc:
            self._quiet_teardown(handle, journal)
            raise FatalProvisionError(exc.message, code="slurm", hint=exc.hint) from exc
        except BaseException:
            self._quiet_teardown(handle, journal)
            raise
        try:
            job_id = _job_id(text, login, partition)
        except ProvisionError:
            self._quiet_teardown(handle, journal)
            raise
        handle.add("job", job_id)
        handle.nodes = [f"job {job_id} node {r}" for r in range(req.num_nodes)]
        journal.created(job_res, job_id)
        journal.event(req.run_id, "slurm", f"submitted as Slurm job {job_id} on {cluster}, partition {partition}")
        return handle

    def _quiet_teardown(self, handle: RunHandle, journal: Journal) -> None:
        try:
            self.teardown(handle, journal, wait=False)
        except Exception:  # noqa: BLE001 - the lifecycle's final teardown retries
            pass

    def node_states(self, handle: RunHandle) -> list[str]:
        """Slurm's state of the run's job for every node: pending, running, or gone."""
        n = max(1, len(handle.nodes))
        try:
            job = self.channel(handle.region).job(handle.run_id)
        except ssh_transport.SshError:
            return ["running"] * n  # a dropped connection: the job goes on; heartbeats still bound it
        if job is None:
            return ["gone"] * n
        return [("pending" if job.waiting else "running" if job.active else "gone")] * n

    def session_path(self, handle: RunHandle, rank: int, ask: SessionAsk) -> SessionPlan:
        """Through the login node into the job's allocation: `srun --overlap` on the rank's node."""
        return slurm_session(self.channel(handle.region).login, handle, rank, ask)

    def stop(self, handle: RunHandle) -> None:
        """scancel the job and wait for Slurm to end it (its nodes get SIGTERM: the agent stops
        the job, uploads what it saved and its final status); folders are kept for the CLI to read."""
        self._cancel(handle, remove=False, grace=STOP_GRACE_S)

    def teardown(self, handle: RunHandle, journal: Journal, *, wait: bool = True) -> None:
        """scancel (Slurm's `down`), then remove the run's folder and channel on the cluster."""
        self._cancel(handle, remove=True, grace=STOP_GRACE_S if wait else 2)
        for res in journal.resources(handle.run_id, alive_only=True):
            if res.cloud == self.name:
                journal.deleted(res.id)

    def _cancel(self, handle: RunHandle, *, remove: bool, grace: int) -> list[str]:
        """What the cancel could not do (sweep.cancel_problems); stop and teardown go on regardless."""
        login = self.channel(handle.region).login
        jobs = " ".join(handle.resources.get("job", []))
        out = login.run(
            script(CANCEL_SCRIPT, RUN=handle.run_id, JOBS=jobs, GRACE=grace, REMOVE="1" if remove else ""),
            timeout=grace + 60,
        )
        return sweep.cancel_problems(out.stdout.decode("utf-8", "replace"), grace)

    def gc(self, now: datetime, *, dry_run: bool) -> list[str]:
        """On every cluster a recorded run used: cancel the caller's gpucloud jobs (by their comment
        tag, read strictly: sweep.py) whose expiry passed; GcIncomplete names what it could not."""
        from gpucloud.state.runs_db import Store

        clusters = {r.region.rsplit("/", 1)[0] for r in Store().list_runs() if r.cloud == self.name and r.region}
        lines: list[str] = []
        failures: list[str] = []
        for cluster in sorted(clusters):
            login = Login(cluster)
            try:
                out = login.run(GC_SCRIPT, retries=0, check=False).stdout.decode("utf-8", "replace")
            except (ssh_transport.SshError, UserError) as exc:
                lines.append(f"slurm: {cluster}: not reachable ({exc.message})")
                continue
            expired, notes = sweep.parse_listing(out, now)
            lines += [f"slurm: {cluster}: {note}" for note in notes]
            for job in expired:
                head = f"slurm: {cluster}: job {job.job_id} of run {job.run_id} past its expiry"
                if dry_run:
                    lines.append(f"{head} (would cancel)")
                    continue
                handle = RunHandle(run_id=job.run_id, cloud=self.name, region=f"{cluster}/-")
                handle.add("job", job.job_id)
                try:
                    problems = self._cancel(handle, remove=True, grace=sweep.GC_GRACE_S)
                except ssh_transport.SshError as exc:
                    problems = [exc.message]
                lines.append(f"{head} ({'NOT cancelled: ' + '; '.join(problems) if problems else 'cancelled'})")
                failures += [f"slurm: {cluster}: job {job.job_id}: {p}" for p in problems]
        if failures:
            raise GcIncomplete(lines, failures)
        return lines


def _partition_order(parts: list[Partition], job: PlanRequest, where: str, cluster: str) -> list[Partition]:
    """The job's `partition:` list in its order (each must exist), else every partition, the default first."""
    asked = [p for p in job.scheduler.get("partition", "").split(",") if p]
    unknown = [p for p in asked if p not in {q.name for q in parts}]
    if unknown:
        raise UserError(
            f"{where}resources.partition: {cluster} has no partition {', '.join(unknown)} "
            f"(it has {', '.join(q.name for q in parts) or 'none'}).",
            hint="Use one of those names, or leave partition out to let gpucloud pick.",
        )
    if asked:
        return [next(q for q in parts if q.name == p) for p in asked]
    return sorted(parts, key=lambda q: not q.default)


def _partition_notes(name: str, job: PlanRequest, idle: int, size: Size) -> list[str]:
    """What a usable partition's candidate asks of each node, and a queue wait when too few GPUs are idle."""
    notes = []
    if size.cpus or size.memory_mb:
        notes.append(
            f"slurm: partition {name}: each node asks for {size.describe()}"
            + (
                " (the node's share for the job's GPUs; min_vcpus and min_memory_gib set them)."
                if size.derived
                else "."
            )
        )
    if job.gpu and idle < job.gpu_count * job.num_nodes:
        notes.append(
            f"slurm: partition {name}: {idle} {job.gpu} GPU(s) idle now, the job needs "
            f"{job.gpu_count * job.num_nodes}: it will wait in the queue (`gpucloud status` shows why)."
        )
    return notes


def _gpu_hour_notes(job: PlanRequest, price_per_hour: float) -> list[str]:
    """The most GPU-hours the job can use (at the site's rate when one is set) and whose driver it runs on."""
    hours = job.gpu_count * job.num_nodes * job.max_duration_s / 3600
    rate = price_per_hour / job.gpu_count if job.gpu_count else 0.0
    return [
        f"slurm: at most {hours:g} GPU-hour(s) ({job.gpu_count} x {job.num_nodes} node(s) for max_duration)"
        + (f" at ${rate:g} per GPU-hour ({RATE_ENV})" if rate else f"; set {RATE_ENV} for a $ figure")
        + ".",
        f"slurm: the driver is the site's: the node's nvidia-smi is checked by the run, nothing is "
        f"installed (a {job.gpu} needs the stack above).",
    ]


def _judge(part: Partition, job: PlanRequest) -> tuple[str, str, int, Size]:
    """(why the partition cannot run the job or "", the cluster's GRES type for the job's GPU, idle
    GPUs on the nodes that can run it, the CPUs and memory each node asks for: sizing.py)."""
    why = _refused(part, job)
    if why:
        return why, "", 0, Size()
    if not job.gpu:
        nodes = sorted(part.usable_nodes)
        size = sizing.wanted(job, part, nodes)
        big = [n for n in nodes if sizing.holds(part, n, size)]
        if len(big) < job.num_nodes:
            held = f", {len(big)} of them with {size.describe()}" if len(big) < len(nodes) else ""
            return f"{len(nodes)} usable node(s){held}, the job needs {job.num_nodes}", "", 0, size
        return "", "", 0, size
    types = {t for gpus in part.nodes.values() for t in gpus}
    mine = sorted(t for t in types if t and gpu_matches(t, job.gpu))
    if not mine:
        have = ", ".join(sorted(f"gpu:{t}" if t else "gpu (untyped)" for t in types)) or "no GPU GRES"
        return f"no gpu:{job.gpu.lower()} GRES ({have})", "", 0, Size()
    gres_type = mine[0]
    fit = sorted(n for n in part.usable_nodes if part.nodes.get(n, {}).get(gres_type, 0) >= job.gpu_count)
    size = sizing.wanted(job, part, fit)
    big = [n for n in fit if sizing.holds(part, n, size)]
    if len(big) < job.num_nodes:
        held = f", {len(big)} of them with {size.describe()}" if len(big) < len(fit) else ""
        return (
            f"{len(fit)} usable node(s) with {job.gpu_count} gpu:{gres_type}{held}, the job needs {job.num_nodes}",
            "",
            0,
            size,
        )
    idle = sum(part.free.get(n, {}).get(gres_type, 0) for n in big)
    return "", gres_type, idle, size


def _refused(part: Partition, job: PlanRequest) -> str:
    """Why the partition is closed to the job whatever its nodes hold (state, time, account, QOS)."""
    if part.state.upper() != "UP":
        return f"it is {part.state}"
    need_min = max(1, job.max_duration_s // 60)
    if part.max_minutes is not None and part.max_minutes < need_min:
        return f"its time limit ({part.max_minutes} min) is below max_duration ({need_min} min)"
    account = job.scheduler.get("account")
    if not allowed(part.allow_accounts, account) or (account and account in part.deny_accounts.split(",")):
        return f"not allowed for account {account}"
    qos = job.scheduler.get("qos")
    if not allowed(part.allow_qos, qos):
        return f"not allowed for QOS {qos}"
    return ""


def _job_id(text: str, login: Login, partition: str) -> str:
    """SUBMIT_SCRIPT's answer -> the job id; a refusal is the candidate's error (failover tries the
    next partition), an unreadable id the cluster's."""
    found = re.search(r"^@job ([0-9]+)$", text, re.M)
    if found:
        return found.group(1)
    if "@unreadable" in text:
        said = shown(text.split("@unreadable", 1)[1].strip(), limit=300)
        raise FatalProvisionError(
            f"{login.cluster}: `sbatch --parsable` printed `{said}`, not a job id (`jobid` or `jobid;cluster`); "
            "the job it may have submitted was cancelled",
            code="sbatch",
            hint=f"Check `{login.shell('sbatch --parsable --wrap true')}`: a site wrapper around sbatch may "
            "print more than --parsable does.",
        )
    why = shown(text.split("@refused", 1)[-1].strip()[-500:] or "no job id", limit=500)
    raise CandidateError(f"{login.cluster}: sbatch refused the job in partition {partition}: {why}", code="sbatch")


def _candidate(cloud: str, cluster: str, part: Partition, job: PlanRequest, gres_type: str, size: Size) -> Candidate:
    """Price: the chargeback rate per GPU-hour when the site sets one (RATE_ENV), else 0."""
    try:
        rate = max(0.0, float(os.environ.get(RATE_ENV, "0") or 0))
    except ValueError:
        rate = 0.0
    per_node = rate * job.gpu_count
    total = per_node * job.num_nodes
    return Candidate(
        cloud=cloud,
        region=f"{cluster}/{part.name}",
        instance_type=batch.gres(gres_type, job.gpu_count) if job.gpu else "cpu",
        gpu=job.gpu or "",
        gpu_count=job.gpu_count,
        num_nodes=job.num_nodes,
        spot=False,
        price_per_hour=per_node,
        total_per_hour=total,
        estimated_cost=total * job.max_duration_s / 3600,
        vcpus=size.cpus,
        memory_gib=size.memory_gib,
    )


def _tarball(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o700
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
