"""The run lifecycle: plan -> record -> provision (with failover) -> follow -> collect -> teardown,
and the commands that look at or end runs later (status, ls, logs, down, gc).

Cloud-agnostic: everything cloud-specific sits behind the Provider protocol and the Channel. The
state store records each step before it is taken; teardown runs in `finally`, so no path out of
`run_job` (job failure, deadline, Ctrl-C, SIGTERM, a bug) leaves a paid machine behind.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from gpucloud.errors import (CloudAccessError, ConfigurationError, Declined, GpucloudError, InternalError,
                             NoCandidateError, UserError)
from gpucloud.progress import Progress, fmt_seconds
from gpucloud.runlog import LogMirror
from gpucloud.state import FINAL_STATUSES, Journal, RunRecord, Store, home_dir

if TYPE_CHECKING:
    from gpucloud.channel import Channel
    from gpucloud.planner import Candidate, Plan
    from gpucloud.providers.base import Provider
    from gpucloud.spec import JobSpec

VM_STAGES = ("preflight", "watchdog", "stack", "gpu_verify", "fetch_code", "setup", "barrier", "run", "artifacts",
             "done")
VM_FINAL_STATES = ("succeeded", "failed", "deadline", "error")
DEFAULT_POLL_S = 5.0          # providers may set `poll_interval` (local: 0.5 s)
DEFAULT_HEARTBEAT_S = 15.0    # the renderer's default; providers may set `heartbeat_interval`
STALE_HEARTBEATS = 3          # a node is suspect after this many missed heartbeats
CLI_DEADLINE_GRACE_S = 60.0   # the VM ends itself at the deadline; the CLI steps in after this
EXPIRY_MARGIN = timedelta(minutes=30)  # TAG_EXPIRES = deadline + margin (gc may sweep after it)
# Multi-node: once one node has failed, the others get this long (at least one poll) to report
# their own end, e.g. every rank hitting the same bug; then the run is torn down, peers included.
PEER_FAIL_GRACE_S = 3.0


class _Interrupt(KeyboardInterrupt):
    """Raised by the signal handler for SIGINT and SIGTERM alike (not an Exception: nothing may
    swallow it on the way to the teardown)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass
class RunResult:
    """What `gpucloud run` reports; `as_json()` is the --json document (DESIGN.md section 4)."""

    run_id: str
    status: str
    exit_code: int | None  # None: detached, the job is still running
    artifacts_dir: str | None = None
    phases: dict[str, float] = field(default_factory=dict)
    cost: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "status": self.status, "exit_code": self.exit_code,
                "artifacts_dir": self.artifacts_dir,
                "phases": {k: round(v, 3) for k, v in self.phases.items()}, "cost": round(self.cost, 6)}


# ---- helpers shared by every command ---------------------------------------------------------------

def new_run_id(name: str, now: datetime | None = None) -> str:
    """`<name>-<YYYYMMDD-HHMMSS>-<4 hex>` (UTC): sortable, readable, unique across processes."""
    now = now or datetime.now(UTC)
    return f"{name}-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def _provider(cloud: str) -> Provider:
    from gpucloud.providers import get_provider

    return get_provider(cloud)


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not following anything
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except OSError:
        return True


def _ask(question: str) -> bool:
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        answer = input()
    except EOFError:
        return False
    return answer.strip().lower() in {"y", "yes"}


def _vm_phases(statuses: list[dict | None]) -> dict[str, float]:
    """Seconds per VM stage (the slowest node's, for multi-node runs)."""
    out: dict[str, float] = {}
    for st in statuses:
        for name, info in ((st or {}).get("stages") or {}).items():
            if not isinstance(info, dict) or name == "done":
                continue
            start, end = info.get("start"), info.get("end")
            if isinstance(start, (int, float)) and isinstance(end, (int, float)):
                out[name] = max(out.get(name, 0.0), float(end) - float(start))
    return {k: out[k] for k in sorted(out, key=lambda s: VM_STAGES.index(s) if s in VM_STAGES else 99)}


def _end_time(st: dict | None) -> float:
    """When a node reached its final state, by its own clock (the `done` stage's start)."""
    done = ((st or {}).get("stages") or {}).get("done")
    start = done.get("start") if isinstance(done, dict) else None
    if isinstance(start, (int, float)):
        return float(start)
    beat = (st or {}).get("heartbeat")
    return float(beat) if isinstance(beat, (int, float)) else float("inf")


def _outcome(statuses: list[dict | None], seen: list[float | None] | None = None) -> tuple[str, int, str]:
    """(run status, exit code, message) from the nodes' final status.json documents.

    Several nodes: the exit code is rank 0's unless another rank failed first; "first" goes by the
    nodes' own end times (whole seconds), then by when the CLI saw them end (`seen`), and rank 0
    wins a tie. A node stopped because a peer failed ends later, so it is never the one blamed.
    """
    n = len(statuses)
    seen = list(seen or []) + [None] * (n - len(seen or []))
    states = [(st or {}).get("state") for st in statuses]
    codes = [(st or {}).get("exit_code") for st in statuses]
    messages = [str((st or {}).get("message") or "") for st in statuses]
    if "deadline" in states:
        return "deadline", 124, next((m for s, m in zip(states, messages) if s == "deadline" and m), "")
    bad = [r for r in range(n) if states[r] in ("failed", "error")]
    if bad:
        inf = float("inf")
        rank = min(bad, key=lambda r: (_end_time(statuses[r]), seen[r] if seen[r] is not None else inf, r != 0, r))
        state, code, message = states[rank], codes[rank], messages[rank]
        if state == "failed":
            status, code = "failed", code if isinstance(code, int) and code != 0 else 1
        else:
            status, code = "error", code if isinstance(code, int) and code != 0 else 70
        if n > 1:
            first = " first" if any(states[r] != "succeeded" for r in range(n) if r != rank) else ""
            message = f"node {rank} failed{first}: {message or f'exit code {code}'}"
        return status, code, message
    if all(s == "succeeded" for s in states):
        return "succeeded", 0, ""
    return "lost", 70, "a node stopped without reporting a final status"


def _teardown_run(store: Store, journal: Journal, run: RunRecord, *, wait: bool,
                  say: Any = None) -> list[str]:
    """Tear down every cloud+region where the run has (or may have) resources; returns the errors."""
    targets: list[tuple[str, str]] = []
    for res in store.resources(run.id, alive_only=True):
        key = (res.cloud, res.region or "")
        if key not in targets:
            targets.append(key)
    if run.cloud and run.region and (run.cloud, run.region) not in targets and not run.final:
        targets.append((run.cloud, run.region))
    errors = []
    for cloud, region in targets:
        try:
            _provider(cloud).teardown(run.id, region, journal, wait=wait)
            store.event(run.id, "teardown", f"{cloud}/{region}: done")
        except Exception as exc:  # keep going: another region may still be billing
            msg = f"{cloud}/{region}: {exc}"
            errors.append(msg)
            store.event(run.id, "teardown-error", msg)
            if say:
                say(f"teardown of {msg} failed")
    return errors


def _channel_for(run: RunRecord) -> Channel | None:
    if not run.cloud or not run.region:
        return None
    try:
        return _provider(run.cloud).channel(run.region)
    except Exception:
        return None


def _refresh(store: Store, run: RunRecord) -> RunRecord:
    """Bring an active run's record up to date from its channel when no CLI is following it (a
    detached run, or a `run` that was killed): final status, exit code, current stage, or "lost"."""
    if run.final or (not run.detached and _pid_alive(run.pid) and run.pid != os.getpid()):
        return run
    ch = _channel_for(run)
    if ch is None:
        return run
    try:
        statuses = [ch.read_status(run.id, r) for r in range(run.num_nodes)]
    except Exception:
        return run
    if statuses and all(st and st.get("state") in VM_FINAL_STATES for st in statuses):
        status, code, message = _outcome(statuses)
        store.set_phases(run.id, _vm_phases(statuses))
        if not run.detached:  # issue 10: the `run` that followed it died before reading the result
            store.update_run(run.id, status="collecting", phase="collect",
                             message=f"the job ended ({status}, exit {code}) but the `gpucloud run` following it "
                                     f"stopped before reading the result: `gpucloud collect {run.id}` brings it back")
        else:
            store.finish_run(run.id, status, exit_code=code, message=message or None, only_if_active=True)
    else:
        stage = next((st.get("stage") for st in statuses if st and st.get("stage")), None)
        if stage and stage != run.phase:
            store.update_run(run.id, phase=stage)
        if run.status in ("running", "provisioning"):
            try:
                states = _provider(run.cloud or "local").node_states(run.id, run.region or "")
            except Exception:
                states = []
            if states and all(s == "gone" for s in states):
                # Re-read: the node may have written its final status just before it ended.
                statuses = [ch.read_status(run.id, r) for r in range(run.num_nodes)]
                if all(st and st.get("state") in VM_FINAL_STATES for st in statuses):
                    status, code, message = _outcome(statuses)
                    store.finish_run(run.id, status, exit_code=code, message=message or None, only_if_active=True)
                else:
                    store.finish_run(run.id, "lost", exit_code=70, message="the machine is gone without a final status",
                                     only_if_active=True)
    return store.get_run(run.id) or run


def _find(store: Store, ref: str) -> RunRecord:
    run = store.find_run(ref)
    if run is None:
        raise UserError(f"no run {ref!r} in {store.path}.", hint="`gpucloud ls` lists the runs.")
    return run


# ---- gpucloud run ------------------------------------------------------------------------------------

def run_job(spec: JobSpec, *, cloud: str | None, region: str | None, spot: bool | None, detach: bool,
            assume_yes: bool, json_out: bool, wait_teardown: bool) -> RunResult:
    """The whole lifecycle of one job; returns the result (exit code included) once torn down."""
    from gpucloud.planner import make_plan

    t0 = time.monotonic()
    plan = make_plan(spec, cloud=cloud, region=region, spot=spot)
    if not plan.candidates:
        raise NoCandidateError("the plan has no candidate to provision.", [])
    plan_s = time.monotonic() - t0
    _print_plan_summary(plan)
    free = all(c.total_per_hour == 0 for c in plan.candidates)  # a $0 run (local) is not worth a prompt
    if not assume_yes and not free and not _ask("Launch it?"):
        raise Declined("not launched.")
    return _Run(spec, plan, detach=detach, json_out=json_out, wait_teardown=wait_teardown, plan_s=plan_s).execute()


def _print_plan_summary(plan: Plan) -> None:
    c = plan.candidates[0]
    spec = plan.spec
    gpu = f"{c.gpu_count} x {c.gpu}" if c.gpu else "no GPU"
    market = "spot" if c.spot else "on-demand"
    more = f"; {len(plan.candidates) - 1} fallback candidate(s)" if len(plan.candidates) > 1 else ""
    print(f"plan: {c.cloud}/{c.region}/{c.instance_type} ({gpu}, {market}) x {c.num_nodes} node(s): "
          f"${c.total_per_hour:.3f}/h, at most ${c.estimated_cost:.2f} for max_duration "
          f"{fmt_seconds(spec.max_duration)}{more}", file=sys.stderr, flush=True)
    for w in plan.warnings:
        print(f"warning: {w}", file=sys.stderr, flush=True)


class _Run:
    """One `gpucloud run` in progress. Holds what teardown needs, whatever happens."""

    def __init__(self, spec: JobSpec, plan: Plan, *, detach: bool, json_out: bool, wait_teardown: bool,
                 plan_s: float) -> None:
        self.spec, self.plan = spec, plan
        self.detach, self.json_out, self.wait_teardown = detach, json_out, wait_teardown
        self.home = home_dir()
        self.store = Store()
        self.journal = Journal(self.store)
        self.run_id = new_run_id(spec.name)
        self.phases: dict[str, float] = {"plan": plan_s}
        self.progress = Progress(log_to_stderr=json_out)
        self.provider: Provider | None = None
        self.candidate: Candidate | None = None
        self.channel: Channel | None = None
        self.deadline = 0.0
        self.heartbeat_s = DEFAULT_HEARTBEAT_S
        self.signals = 0
        self.tearing_down = False
        self.artifacts_dir: str | None = None
        self.mirror: LogMirror | None = None
        self.peers_stopped: list[int] = []  # multi-node: nodes still running when the run was ended
        self._old_handlers: dict[int, Any] = {}

    # -- signals ------------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        if self.tearing_down or self.signals > 1:
            print(f"\nwarning: {signal.Signals(signum).name} received again: still tearing down run "
                  f"{self.run_id} so that nothing keeps billing; please wait.", file=sys.stderr, flush=True)
            return
        raise _Interrupt(signum)

    def _install_signals(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread: the caller handles signals
                pass

    def _restore_signals(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()

    # -- the lifecycle ------------------------------------------------------------------------------

    def execute(self) -> RunResult:
        spec, first = self.spec, self.plan.candidates[0]
        self.store.create_run(
            self.run_id, name=spec.name, spec_path=str(spec.source) if spec.source else None,
            spec=spec.model_dump(mode="json"), cloud=first.cloud, region=first.region,
            instance_type=first.instance_type, num_nodes=spec.num_nodes, price_per_hour=first.price_per_hour,
            detached=self.detach, pid=os.getpid(),
        )
        self.store.set_phase(self.run_id, "plan", self.phases["plan"])
        status, code, message = "error", 70, ""
        keep_running = False
        self._install_signals()
        try:
            with self.progress:
                self.progress.info(f"run {self.run_id}")
                try:
                    self._provision()
                    if self.detach:
                        keep_running = True
                        self.store.update_run(self.run_id, status="running", phase="booting")
                        self.progress.info(f"detached: the run ends itself at the latest at max_duration; "
                                           f"`gpucloud logs {self.run_id} --follow` follows it, "
                                           f"`gpucloud down {self.run_id}` ends it")
                        status, code = "detached", None
                    else:
                        status, code, message = self._follow()
                        if status not in ("interrupted", "down"):
                            self._collect()
                except _Interrupt as intr:
                    status, code = "interrupted", 130
                    message = f"{signal.Signals(intr.signum).name} received"
                    self.progress.warn(f"{message}: tearing down run {self.run_id}")
                except NoCandidateError as exc:
                    status, code, message = "no-capacity", exc.exit_code, exc.message
                    raise
                except GpucloudError as exc:
                    status, code, message = ("error", exc.exit_code, exc.message)
                    raise
                except Exception as exc:
                    status, code, message = "error", 70, f"{type(exc).__name__}: {exc}"
                    raise
                finally:
                    if not keep_running:
                        code = self._teardown(code)
                        self._drain_logs()
                        self.store.finish_run(self.run_id, status, exit_code=code, message=message or None)
                    self.store.set_phases(self.run_id, self.phases)
        finally:
            self._restore_signals()
        if message and status not in ("succeeded", "detached"):
            print(f"run {self.run_id}: {status} (exit {code}): {message}", file=sys.stderr, flush=True)
        elif status != "detached":
            print(f"run {self.run_id}: {status} (exit {code})", file=sys.stderr, flush=True)
        if status == "detached" and not self.json_out:
            print(self.run_id, flush=True)
        run = self.store.get_run(self.run_id)
        return RunResult(run_id=self.run_id, status=status, exit_code=code, artifacts_dir=self.artifacts_dir,
                         phases=dict(self.phases), cost=run.cost() if run else 0.0)

    def _provision(self) -> None:
        """Failover loop over the plan's candidates (docs/INTERNALS.md, Lifecycle)."""
        from gpucloud.channel import pack_workdir
        from gpucloud.providers.base import LaunchRequest, ProvisionError, TAG_EXPIRES, TAG_RUN
        from gpucloud.render import render_bootstrap

        spec = self.spec
        t0 = time.monotonic()
        self.progress.phase("provision")
        tarball = pack_workdir(spec.workdir_path())
        uploaded: set[int] = set()
        attempts: list[str] = []
        access: list[str] = []  # one line per cloud skipped for credentials / endpoint
        skip_clouds: set[str] = set()
        skip_regions: set[tuple[str, str]] = set()
        try:
            for index, cand in enumerate(self.plan.candidates):
                if cand.cloud in skip_clouds or (cand.cloud, cand.region) in skip_regions:
                    continue
                where = f"{cand.cloud}/{cand.region}/{cand.instance_type}" + (" (spot)" if cand.spot else "")
                self.progress.info(f"attempt {len(attempts) + 1}: {where}")
                self.store.update_run(self.run_id, cloud=cand.cloud, region=cand.region,
                                      instance_type=cand.instance_type, price_per_hour=cand.price_per_hour,
                                      status="provisioning", phase="provision", started_at=time.time())
                provider: Provider | None = None
                try:
                    provider = _provider(cand.cloud)
                    channel = provider.channel(cand.region)
                    if id(channel) not in uploaded:
                        channel.upload_code(self.run_id, tarball)
                        uploaded.add(id(channel))
                    if attempts:
                        channel.reset_nodes(self.run_id, spec.num_nodes)
                    deadline = datetime.now(UTC) + timedelta(seconds=spec.max_duration)
                    log_s, self.heartbeat_s = _intervals(provider, cand.cloud)
                    master_port, barrier_s = _rendezvous(provider)
                    urls = channel.prepare(self.run_id, spec.num_nodes, deadline, log_interval=log_s)
                    # A provider that launches N identical machines in one call gets one script for
                    # all: each node finds its rank at boot and its manifest through the node index.
                    shared = spec.num_nodes > 1 and bool(getattr(provider, "shared_user_data", False))
                    if shared:
                        urls = [channel.node_index(self.run_id, urls, deadline)]
                    user_data = [
                        render_bootstrap(spec, self.plan.stack, cand, provider=cand.cloud, run_id=self.run_id,
                                         node_rank=None if shared else rank, manifest_url=urls[rank],
                                         put_headers=channel.put_headers, log_interval=log_s,
                                         heartbeat_interval=self.heartbeat_s, master_port=master_port,
                                         barrier_timeout=barrier_s)
                        for rank in range(len(urls))
                    ]
                    if shared:
                        user_data *= spec.num_nodes
                    expires = deadline + EXPIRY_MARGIN
                    req = LaunchRequest(
                        run_id=self.run_id, spec=spec, candidate=cand, stack=self.plan.stack, user_data=user_data,
                        expires_at=expires, attempt=index,
                        tags={TAG_RUN: self.run_id, TAG_EXPIRES: expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
                              "Name": f"gpucloud-{self.run_id}"},
                    )
                    self.store.update_run(self.run_id, deadline=deadline.timestamp())
                    self.provider, self.candidate, self.channel = provider, cand, channel
                    self.deadline = deadline.timestamp()
                    provider.provision(req, self.journal)
                except CloudAccessError as exc:  # issue 10: skip this cloud once, say why and the fix
                    access.append(self._skip_cloud(exc, cand, skip_clouds))
                    attempts.append(f"{where}: {exc.kind}: {exc.message}")
                    self.provider = self.candidate = self.channel = None
                    continue
                except ProvisionError as exc:
                    reason = f"{exc.kind}: {exc.message}" + (f" (quota {exc.quota_code})" if exc.quota_code else "")
                    attempts.append(f"{where}: {reason}")
                    self.store.event(self.run_id, "attempt", attempts[-1])
                    self.progress.warn(f"{where} failed: {reason}")
                    if exc.kind == "quota":
                        skip_regions.add((cand.cloud, cand.region))
                        self.progress.info(f"skipping the rest of {cand.cloud}/{cand.region} (quota"
                                           f"{' ' + exc.quota_code if exc.quota_code else ''})")
                    elif exc.kind == "fatal":
                        skip_clouds.add(cand.cloud)
                        self.progress.info(f"skipping the rest of {cand.cloud}")
                    self._cleanup_attempt(provider, cand)
                    self.provider = self.candidate = self.channel = None
                    continue
                except GpucloudError as exc:
                    if isinstance(exc, UserError) or provider is None:
                        raise
                    # A cloud that cannot be used at all (credentials, endpoint): try the next cloud.
                    attempts.append(f"{where}: {exc.message}")
                    self.store.event(self.run_id, "attempt", attempts[-1])
                    self.progress.warn(f"{where} failed: {exc.message}")
                    skip_clouds.add(cand.cloud)
                    self._cleanup_attempt(provider, cand)
                    self.provider = self.candidate = self.channel = None
                    continue
                self.store.event(self.run_id, "attempt", f"{where}: provisioned")
                self.store.update_run(self.run_id, status="running", phase="booting")
                self.phases["provision"] = time.monotonic() - t0
                self.progress.phase_done("provision", self.phases["provision"], note=f"on {where}")
                return
        finally:
            try:
                tarball.unlink(missing_ok=True)
                tarball.parent.rmdir()
            except OSError:
                pass
        self.phases["provision"] = time.monotonic() - t0
        self._nothing_launched_costs_nothing()
        if access and len(access) == len(attempts):
            raise ConfigurationError("no cloud is usable: every candidate's cloud lacks working credentials "
                                     "or an endpoint that answers:", access,
                                     hint="`gpucloud check` shows what each cloud needs.")
        raise NoCandidateError(
            f"no candidate could be provisioned ({len(attempts)} attempt(s)):", attempts,
            hint="Try other regions or GPU types (`gpucloud plan` lists them), or ask for more quota.",
        )

    def _skip_cloud(self, exc: CloudAccessError, cand: Candidate, skip_clouds: set[str]) -> str:
        """One line for a cloud that cannot be used (no credentials, dead endpoint); its remaining
        candidates are skipped and failover goes on with the other clouds."""
        skip_clouds.add(cand.cloud)
        line = exc.message + (f" {exc.hint}" if exc.hint else "")
        self.store.event(self.run_id, "attempt", line)
        self.progress.warn(f"skipping {line}")
        self._cleanup_attempt(self.provider, cand)
        return line

    def _nothing_launched_costs_nothing(self) -> None:
        """A run whose attempts created no machine costs $0 (its price was the candidate's)."""
        if not any(r.cloud_id and r.kind in ("instance", "vm", "process", "node")
                   for r in self.journal.resources(self.run_id, alive_only=False)):
            self.store.update_run(self.run_id, price_per_hour=0.0)

    def _cleanup_attempt(self, provider: Provider | None, cand: Candidate) -> None:
        if provider is None:
            return
        if not any(r.cloud == cand.cloud and (r.region or cand.region) == cand.region
                   for r in self.journal.resources(self.run_id)):
            return  # the journal says nothing was created there: nothing to clean up
        try:
            provider.teardown(self.run_id, cand.region, self.journal, wait=True)
        except Exception as exc:
            self.progress.warn(f"cleanup after the failed attempt on {cand.cloud}/{cand.region}: {exc} "
                               f"(the final teardown retries it)")

    # -- following ----------------------------------------------------------------------------------

    def _follow(self) -> tuple[str, int, str]:
        """Stream logs and stages until every node reports a final status; detect dead machines and
        a passed deadline. Returns (status, exit code, message)."""
        assert self.provider is not None and self.channel is not None and self.candidate is not None
        provider, channel, n = self.provider, self.channel, self.spec.num_nodes
        interval = float(getattr(provider, "poll_interval", DEFAULT_POLL_S))
        mirror = self.mirror = LogMirror(self.home, self.run_id, n)
        shown: dict[str, str] = {}  # stage -> "start" | "end"
        booted_at = time.time()
        last_state_check = 0.0
        first_final_at: float | None = None
        statuses: list[dict | None] = [None] * n
        seen: list[float | None] = [None] * n  # when this CLI first saw each node's final status
        grace = max(PEER_FAIL_GRACE_S, interval)
        while True:
            statuses = [channel.read_status(self.run_id, r) for r in range(n)]
            mirror.sync(channel)
            self.progress.log(mirror.read_new())
            self._show_stages(statuses, shown)
            # Someone ran `gpucloud down` on this run from another terminal (it marks the run
            # before it kills anything, so the nodes' "stopped by a signal" status is not the outcome).
            rec = self.store.get_run(self.run_id)
            if rec is not None and rec.status == "down":
                self.progress.warn("the run was torn down by `gpucloud down` from another process")
                return "down", 130, "torn down by `gpucloud down`"
            finals = [bool(st and st.get("state") in VM_FINAL_STATES) for st in statuses]
            now = time.time()
            seen = [t if t is not None or not f else now for t, f in zip(seen, finals)]
            if all(finals):
                break
            bad = [r for r, st in enumerate(statuses) if finals[r] and st and st.get("state") != "succeeded"]
            if bad:
                if first_final_at is None:
                    first_final_at = now
                    self.progress.warn(f"node {bad[0]} ended ({statuses[bad[0]].get('state')}): the other "
                                       f"node(s) get {grace:.0f}s to finish, then the whole run is torn down")
                if now - first_final_at >= grace:
                    self.peers_stopped = [r for r in range(n) if not finals[r]]
                    break
            if now > self.deadline + CLI_DEADLINE_GRACE_S:
                self.progress.warn("max_duration passed and the machine did not end the run itself: tearing down")
                return "deadline", 124, "max_duration passed"
            if now - last_state_check >= max(interval, self.heartbeat_s) and self._stale(statuses, booted_at, now):
                last_state_check = now
                states = provider.node_states(self.run_id, self.candidate.region)
                dead = [r for r, s in enumerate(states) if s in ("gone", "stopping") and not finals[r]]
                if dead:
                    again = [channel.read_status(self.run_id, r) for r in dead]
                    if not all(st and st.get("state") in VM_FINAL_STATES for st in again):
                        mirror.sync(channel, final=True)
                        self.progress.log(mirror.read_new())
                        stage = next((st.get("stage") for st in again if st), None)
                        where = f"node {dead[0]}" if n > 1 else "the machine"
                        self.peers_stopped = [r for r in range(n) if not finals[r] and r not in dead]
                        hint = getattr(provider, "console_hint", None)
                        extra = f"; {hint(self.run_id, dead[0])}" if callable(hint) else ""
                        return "lost", 70, (f"{where} stopped without reporting a final status"
                                            f"{f' (last stage: {stage})' if stage else ''}{extra}")
            time.sleep(interval)
        # Final statuses are in; their log_parts count covers every part: take the rest.
        mirror.sync(channel, final=True)
        self.progress.log(mirror.read_new())
        self.progress.phase(None)
        self.phases.update(_vm_phases(statuses))
        status, code, message = _outcome(statuses, seen)
        if self.peers_stopped:
            message += f"; node(s) {', '.join(map(str, self.peers_stopped))} stopped with the run"
        return status, code, message

    def _stale(self, statuses: list[dict | None], booted_at: float, now: float) -> bool:
        limit = STALE_HEARTBEATS * self.heartbeat_s
        for st in statuses:
            if st is None:
                if now - booted_at > limit:
                    return True
                continue
            if st.get("state") in VM_FINAL_STATES:
                continue
            beat = st.get("heartbeat")
            if not isinstance(beat, (int, float)) or now - beat > limit:
                return True
        return False

    def _show_stages(self, statuses: list[dict | None], shown: dict[str, str]) -> None:
        """Stage changes of rank 0 (the others run the same stages) as progress lines."""
        st = statuses[0] if statuses else None
        if not st:
            return
        stages = st.get("stages") or {}
        for name in sorted(stages, key=lambda s: VM_STAGES.index(s) if s in VM_STAGES else 99):
            info = stages[name]
            if not isinstance(info, dict) or name == "done":
                continue
            start, end = info.get("start"), info.get("end")
            if start is not None and name not in shown:
                shown[name] = "start"
                if end is None:
                    self.progress.phase(name)
                    self.store.update_run(self.run_id, phase=name)
            if end is not None and shown.get(name) != "end":
                shown[name] = "end"
                secs = float(end) - float(start or end)
                self.progress.phase_done(name, secs, info.get("ok"))

    # -- the end ------------------------------------------------------------------------------------

    def _collect(self) -> None:
        assert self.channel is not None
        t0 = time.monotonic()
        self.store.update_run(self.run_id, status="collecting", phase="collect")
        dest = Path.cwd() / "gpucloud-runs" / self.run_id
        got = []
        n = self.spec.num_nodes
        for rank in range(n):
            try:
                out = self.channel.download_artifacts(self.run_id, rank, dest if n == 1 else dest / f"node-{rank}")
            except Exception as exc:
                self.progress.warn(f"artifacts of node {rank} could not be read back: {exc}")
                continue
            if out is not None:
                got.append(out)
        self.phases["collect"] = time.monotonic() - t0
        if got:
            self.artifacts_dir = str(dest)
            self.store.update_run(self.run_id, artifacts_dir=str(dest))
            self.progress.info(f"artifacts in {dest}")
        elif self.spec.artifacts:
            self.progress.warn("the job produced none of its artifacts")

    def _drain_logs(self) -> None:
        """After the teardown of a multi-node run that ended early: the nodes that were stopped
        pushed their last log lines when they got SIGTERM; show them too (best effort)."""
        if not self.peers_stopped or self.mirror is None or self.channel is None:
            return
        try:
            self.mirror.sync(self.channel, final=True)
            self.progress.log(self.mirror.read_new())
        except Exception:  # the channel may already be gone with the run
            pass

    def _teardown(self, code: int) -> int:
        """Always runs. A second Ctrl-C during it is ignored (with a warning)."""
        self.tearing_down = True
        t0 = time.monotonic()
        run = self.store.get_run(self.run_id)
        if run is None or (self.provider is None and not self.store.resources(self.run_id, alive_only=True)):
            return code  # nothing was ever created
        self.store.update_run(self.run_id, status="tearing-down", phase="teardown")
        self.progress.phase("teardown")
        errors = _teardown_run(self.store, self.journal, run, wait=self.wait_teardown, say=self.progress.warn)
        self.phases["teardown"] = time.monotonic() - t0
        if errors:
            self.progress.warn(f"teardown incomplete; run `gpucloud down {self.run_id}` (or `gpucloud gc`) "
                               "to finish it")
            return code if code != 0 else 70
        self.progress.phase_done("teardown", self.phases["teardown"])
        return code


def _rendezvous(provider: Provider) -> tuple[int, float]:
    """(MASTER_PORT, barrier timeout) for this provider's nodes. A provider whose nodes share an
    address with other runs (local: loopback) has a `master_port()` method giving a free port per
    run; clouds use the renderer's default (29500). `barrier_timeout` is an optional attribute."""
    from gpucloud import render

    pick = getattr(provider, "master_port", None)
    port = int(pick()) if callable(pick) else render.DEFAULT_MASTER_PORT
    barrier_s = getattr(provider, "barrier_timeout", None) or render.DEFAULT_BARRIER_TIMEOUT_S
    return port, float(barrier_s)


def _intervals(provider: Provider, cloud: str) -> tuple[float, float]:
    """(log part interval, heartbeat interval) for this provider's VMs: the provider may set them
    (`log_interval`, `heartbeat_interval`), else the renderer's defaults. The same log interval
    goes to `Channel.prepare` (it sizes the log parts) and the heartbeat one sizes staleness."""
    from gpucloud import render

    log_s = getattr(provider, "log_interval", None) or render.default_log_interval(cloud)
    hb_s = getattr(provider, "heartbeat_interval", None) or render.DEFAULT_HEARTBEAT_S
    return float(log_s), float(hb_s)


# ---- status / ls ---------------------------------------------------------------------------------------

def show_status(run_id: str | None, *, json_out: bool) -> None:
    """One run with its phases and events, or every run; active ones refreshed from their channel."""
    import json

    store = Store()
    now = time.time()
    from gpucloud.collect import reconcile

    if run_id is not None:
        run = reconcile(store, _refresh(store, _find(store, run_id)))
        phases = store.phases(run.id)
        if json_out:
            doc = {**run.as_json(now), "phases": phases,
                   "events": [{"ts": e.ts, "kind": e.kind, "message": e.message} for e in store.events(run.id)],
                   "resources": [{"cloud": r.cloud, "region": r.region, "kind": r.kind, "name": r.name,
                                  "cloud_id": r.cloud_id, "status": r.status}
                                 for r in store.resources(run.id, alive_only=False)]}
            print(json.dumps(doc, indent=2, default=str))
            return
        _print_run_detail(store, run, phases, now)
        return
    runs = [reconcile(store, _refresh(store, r)) for r in store.list_runs()]
    if json_out:
        print(json.dumps([{**r.as_json(now), "phases": store.phases(r.id)} for r in runs], indent=2, default=str))
        return
    if not runs:
        print("no runs yet (`gpucloud run JOB.yaml` starts one)", file=sys.stderr)
        return
    _print_runs(runs, now)


def _print_runs(runs: list[RunRecord], now: float) -> None:
    from rich import box
    from rich.table import Table

    from gpucloud.views import console, fit_table, least_width, output_width

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for col in ("RUN", "STATUS", "PHASE", "ELAPSED", "COST", "WHERE"):
        table.add_column(col, justify="right" if col in ("ELAPSED", "COST", "EXIT") else "left", overflow="fold")
    for r in runs:
        exit_note = f" ({r.exit_code})" if r.exit_code not in (None, 0) else ""
        table.add_row(r.id, r.status + exit_note + (" (detached)" if r.detached and not r.final else ""),
                      "-" if r.final else (r.phase or "-"), fmt_seconds(r.elapsed(now)), f"${r.cost(now):.4f}",
                      f"{r.cloud}/{r.region}\n{r.instance_type}" if r.cloud else "-")
    width = output_width()
    fit_table(table, width, ("PHASE", "ELAPSED"), foldable=("RUN",))
    console(max(width, least_width(table))).print(table)


def _print_run_detail(store: Store, run: RunRecord, phases: dict[str, float], now: float) -> None:
    lines = [
        f"run        {run.id}",
        f"status     {run.status}" + (f" (exit {run.exit_code})" if run.exit_code is not None else "")
        + (" (detached)" if run.detached and not run.final else ""),
        f"phase      {'-' if run.final else (run.phase or '-')}",
        f"where      {run.cloud}/{run.region}/{run.instance_type} x {run.num_nodes} node(s)",
        f"elapsed    {fmt_seconds(run.elapsed(now))}",
        f"cost       ${run.cost(now):.4f} (${run.price_per_hour:.3f}/h per node)",
    ]
    if run.deadline:
        lines.append(f"deadline   {datetime.fromtimestamp(run.deadline, UTC):%Y-%m-%d %H:%M:%S} UTC")
    if run.artifacts_dir:
        lines.append(f"artifacts  {run.artifacts_dir}")
    if run.message:
        lines.append(f"message    {run.message}")
    if phases:
        lines.append("phases     " + ", ".join(f"{k} {fmt_seconds(v)}" for k, v in phases.items()))
    alive = store.resources(run.id, alive_only=True)
    if alive:
        lines.append(f"resources  {len(alive)} not yet deleted: "
                     + ", ".join(f"{r.kind} {r.cloud_id or r.name} ({r.status})" for r in alive))
    print("\n".join(lines))


# ---- logs ---------------------------------------------------------------------------------------------

def show_logs(run_id: str, *, follow: bool) -> int:
    """Print the stored log plus newer parts from the channel; with follow, until the run ends.
    Returns the job's exit code when the run has ended (0 otherwise)."""
    store = Store()
    run = _find(store, run_id)
    mirror = LogMirror(home_dir(), run.id, run.num_nodes)
    channel = _channel_for(run)
    out = sys.stdout.buffer
    interval = float(getattr(_provider(run.cloud), "poll_interval", DEFAULT_POLL_S)) if run.cloud else DEFAULT_POLL_S

    def pump(final: bool = False) -> None:
        if channel is not None:
            try:
                mirror.sync(channel, final=final)
            except Exception as exc:  # the channel may be gone (expired URLs, deleted bucket)
                print(f"warning: newer log parts unavailable: {exc}", file=sys.stderr)
        data = mirror.read_new()
        if data:
            out.write(data)
            out.flush()

    pump(final=run.final)
    if not follow:
        return 0
    if channel is None and not run.final:
        print(f"warning: cannot reach run {run.id}'s channel; showing the stored log only", file=sys.stderr)
    try:
        while True:
            run = _refresh(store, store.get_run(run.id) or run)
            if run.final or (run.status == "collecting" and not run.detached and not _pid_alive(run.pid)):
                break
            time.sleep(interval)
            pump()
    except KeyboardInterrupt:
        return 130
    pump(final=True)
    return run.exit_code if run.exit_code is not None else 0


# ---- down / gc --------------------------------------------------------------------------------------------

def down_run(run_id: str, *, assume_yes: bool) -> None:
    """Tear one run down, from any process; the run is marked "down" unless it had already ended."""
    store = Store()
    journal = Journal(store)
    run = _find(store, run_id)
    alive = store.resources(run.id, alive_only=True)
    if run.final and not alive:
        print(f"run {run.id} already ended ({run.status}); nothing left to tear down", file=sys.stderr)
        return
    if not assume_yes and not _ask(f"Tear down run {run.id} ({run.status}, {len(alive)} resource(s))?"):
        raise Declined("nothing torn down.")
    # Mark first: a `run` following it sees "down" and stops instead of reporting a lost machine.
    store.finish_run(run.id, "down", message="torn down by `gpucloud down`", only_if_active=True)
    t0 = time.monotonic()
    errors = _teardown_run(store, journal, run, wait=True, say=lambda m: print(f"warning: {m}", file=sys.stderr))
    if errors:
        raise InternalError(f"teardown of run {run.id} incomplete:\n  " + "\n  ".join(errors),
                            hint=f"Run `gpucloud down {run.id}` again, or `gpucloud gc`.")
    store.event(run.id, "down", f"torn down in {time.monotonic() - t0:.1f}s")
    print(f"run {run.id}: torn down ({len(alive)} resource(s))", file=sys.stderr)


def _configured_clouds() -> list[str]:
    """Clouds whose credentials or endpoints are configured, without importing their SDKs."""
    clouds = []
    env = os.environ
    aws_files = [Path(env.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials")).expanduser(),
                 Path(env.get("AWS_CONFIG_FILE", "~/.aws/config")).expanduser()]
    if any(k in env for k in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_WEB_IDENTITY_TOKEN_FILE")) \
            or any(p.is_file() for p in aws_files):
        clouds.append("aws")
    if any(k in env for k in ("AZURE_SUBSCRIPTION_ID", "GPUCLOUD_AZURE_ARM_ENDPOINT")):
        clouds.append("azure")
    return clouds


def collect_garbage(*, dry_run: bool, assume_yes: bool, cloud: str | None) -> None:
    """Sweep leftovers two ways: runs in the state store that ended (or whose deadline passed with
    nobody following them) but still hold resources, and each provider's tag-based `gc`."""
    store = Store()
    journal = Journal(store)
    now = time.time()
    if cloud:
        clouds = [cloud]
    else:
        clouds = ["local"] + [c for c in [*store.clouds_with_resources(), *_configured_clouds()] if c != "local"]
        clouds = list(dict.fromkeys(clouds))

    stale: list[RunRecord] = []
    for run in store.list_runs():
        run = _refresh(store, run)
        if cloud and run.cloud != cloud and not any(r.cloud == cloud for r in store.resources(run.id)):
            continue
        if not store.resources(run.id, alive_only=True):
            continue
        followed = not run.detached and _pid_alive(run.pid)
        expired = run.deadline is not None and now > run.deadline + EXPIRY_MARGIN.total_seconds()
        # "collecting": the job ended but its `run` died first; its machines go, its results stay
        # in the channel for `gpucloud collect` (issue 10).
        if run.final or expired or (not followed and run.status in ("planned", "provisioning", "collecting")):
            stale.append(run)

    if not dry_run and not assume_yes:
        listed = [f"run {r.id} ({r.status}): {len(store.resources(r.id))} resource(s)" for r in stale]
        for c in clouds:
            listed += _safe_gc(c, datetime.now(UTC), dry_run=True)
        if not listed:
            print("nothing to collect", file=sys.stderr)
            return
        print("\n".join(listed))
        if not _ask("Delete these?"):
            raise Declined("nothing deleted.")

    found = 0
    for run in stale:
        found += 1
        n = len(store.resources(run.id))
        if dry_run:
            print(f"run {run.id} ({run.status}): {n} resource(s) would be torn down")
            continue
        errors = _teardown_run(store, journal, run, wait=True, say=lambda m: print(f"warning: {m}", file=sys.stderr))
        if not run.final and run.status != "collecting":
            store.finish_run(run.id, "lost", exit_code=70, message="swept by gc", only_if_active=True)
        print(f"run {run.id} ({run.status}): {n} resource(s) torn down" + (" with errors" if errors else ""))
    for c in clouds:
        lines = _safe_gc(c, datetime.now(UTC), dry_run=dry_run)
        found += len(lines)
        for line in lines:
            print(line)
    if not found:
        print("nothing to collect", file=sys.stderr)


def _safe_gc(cloud: str, now: datetime, *, dry_run: bool) -> list[str]:
    try:
        return _provider(cloud).gc(now, dry_run=dry_run)
    except Exception as exc:  # one cloud's missing credentials must not stop the others' sweep
        print(f"warning: gc on {cloud} failed: {exc}", file=sys.stderr)
        return []


__all__ = ["RunResult", "run_job", "show_status", "show_logs", "down_run", "collect_garbage", "new_run_id",
           "FINAL_STATUSES"]
