"""The run itself: plan (run_plan.py) -> record -> provision (failover.py) -> follow (watch.py) ->
collect (run_artifacts.py) -> teardown (teardown.py). The commands that look at or end runs later live in commands.py.

Cloud-agnostic: everything cloud-specific sits behind the Provider protocol, its declared Capabilities and the
Channel. The state store records each step before it is taken; teardown runs in `finally`, so no path out of
`run_job` (job failure, deadline, Ctrl-C, SIGTERM, a bug) leaves a paid machine behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any

from gpucloud.errors import Declined, GpucloudError, NoCandidateError
from gpucloud.prose import to_stderr
from gpucloud.run import budget, gpu_report, keep
from gpucloud.run.artifacts import fetch_artifacts, refused_note, results_dir, settle_artifacts
from gpucloud.run.log import LogMirror
from gpucloud.run.result import RunResult, new_run_id
from gpucloud.run.secrets import SecretDelivery
from gpucloud.run.watch import observe, outcome, stage_order, stale, vm_phases, wait_final
from gpucloud.state.guard import no_space
from gpucloud.state.runs_db import FINAL_STATUSES, Journal, Store, home_dir
from gpucloud.ui import views
from gpucloud.ui.progress import Progress, awaited
from gpucloud.ui.timeline import format_nodes

if TYPE_CHECKING:
    from gpucloud.plan.planner import Plan
    from gpucloud.run.failover import Launch
    from gpucloud.run.recovery import Recovery
    from gpucloud.spec.load import JobSpec

CLI_DEADLINE_GRACE_S = 60.0  # the VM ends itself at the deadline; the CLI steps in after this
# Multi-node: once one node has failed, the others get this long (at least one poll) to report
# their own end, e.g. every rank hitting the same bug; then the run is torn down, peers included.
PEER_FAIL_GRACE_S = 3.0


class _Interrupt(KeyboardInterrupt):
    """Raised by the signal handler for SIGINT and SIGTERM alike (not an Exception: nothing may
    swallow it on the way to the teardown)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def run_job(
    spec: JobSpec,
    *,
    cloud: str | None,
    region: str | None,
    spot: bool | None,
    detach: bool,
    assume_yes: bool,
    json_out: bool,
    wait_teardown: bool,
    secret_values: Mapping[str, str] | None = None,
    data: Any = None,
    registry: Any = None,
) -> RunResult:
    """The whole lifecycle of one job; returns the result (exit code included) once torn down.
    `secret_values`: the values of the job's secret names (spec_secrets.py), and `data` the
    inputs/outputs checked at plan time (data_grants.py), and `registry` the container image's pull
    login (pull_login.py), all delivered sealed."""
    from gpucloud.channel.extract import ArchiveLimits
    from gpucloud.run.plan import launch_plan

    ArchiveLimits.from_env()  # a malformed artifacts cap is exit 2 before anything is launched
    t0 = time.monotonic()
    plan = launch_plan(spec, cloud=cloud, region=region, spot=spot, secrets=secret_values)
    plan_s = time.monotonic() - t0
    views.print_plan_summary(plan)
    free = all(c.total_per_hour == 0 for c in plan.candidates)  # a $0 run (local) is not worth a prompt
    if not assume_yes and not free and not views.ask("Launch it?"):
        raise Declined("not launched.")
    return RunInProgress(
        spec,
        plan,
        detach=detach,
        json_out=json_out,
        wait_teardown=wait_teardown,
        plan_s=plan_s,
        plan_kw={"cloud": cloud, "region": region, "spot": spot},
        secret_values=secret_values,
        data=data,
        registry=registry,
    ).execute()


def watch_job(run_ref: str, *, json_out: bool) -> RunResult:
    """`gpucloud watch RUN`: follow a detached run from this process as `run` would have: stream
    it, recover it (spot recovery), collect its artifacts and tear it down at the end."""
    from gpucloud.errors import UserError
    from gpucloud.plan.planner import make_plan
    from gpucloud.run.commands import pid_alive, require_run
    from gpucloud.run.recovery import Recovery, launch_of, plan_args, relaunch_lookups

    store = Store()
    run = require_run(store, run_ref)
    if run.final:
        raise UserError(f"run {run.id} already ended ({run.status}); there is nothing to watch.")
    if run.pid and run.pid != os.getpid() and pid_alive(run.pid) and not run.detached:
        raise UserError(f"run {run.id} is already followed by process {run.pid}.")
    spec, data, values = relaunch_lookups(run, lambda line: to_stderr(f"warning: {line}"))
    kw = plan_args(store, run.id)
    plan = make_plan(spec, **{k: kw.get(k) for k in ("cloud", "region", "spot")})  # type: ignore[arg-type]
    follower = RunInProgress(
        spec, plan, detach=False, json_out=json_out, wait_teardown=True, plan_s=0.0, plan_kw=kw, run_id=run.id
    )
    follower.launch = launch_of(run, plan)
    follower.delivery = SecretDelivery(run.id, spec.num_nodes, values, data)
    follower.delivery.adopt(follower.launch)
    follower.recovery = Recovery.resume(spec, plan, run, follower.store, follower.journal, follower.progress)
    store.update_run(run.id, detached=False, pid=os.getpid())
    store.event(run.id, "watch", f"followed by `gpucloud watch` (pid {os.getpid()})")
    return follower.execute()


class RunInProgress:
    """One `gpucloud run` in progress. Holds what teardown needs, whatever happens."""

    vm_dir: str | None = None  # the bootstrap's work folder, when not the provider's (gpucloud/run/bake.py)
    kept = False  # the node's final status says its machine waits for the next job (run/keep.py)

    def __init__(
        self,
        spec: JobSpec,
        plan: Plan,
        *,
        detach: bool,
        json_out: bool,
        wait_teardown: bool,
        plan_s: float,
        plan_kw: dict[str, Any] | None = None,
        run_id: str | None = None,
        secret_values: Mapping[str, str] | None = None,
        data: Any = None,
        registry: Any = None,
    ) -> None:
        self.spec, self.plan = spec, plan
        self.detach, self.json_out, self.wait_teardown = detach, json_out, wait_teardown
        self.home = home_dir()
        self.store = Store()
        self.journal = Journal(self.store)
        self.run_id = run_id or new_run_id(spec.name)
        self.attached = run_id is not None  # `gpucloud watch`: the run exists and has launched
        self.plan_kw = plan_kw or {}
        self.recovery: Recovery | None = None
        self.phases: dict[str, float] = {"plan": plan_s}
        self.progress = Progress(log_to_stderr=json_out)
        self.launch: Launch | None = None
        self.signals = 0
        self.interrupted = False  # the run was stopped by a signal: what comes back is what the job saved
        self.tearing_down = False
        self.artifacts_dir: str | None = None
        self.refused: list[str] = []
        self.mirror: LogMirror | None = None
        self.peers_stopped: list[int] = []  # multi-node: nodes still running when the run was ended
        self.launched_at: float | None = None  # wall clock when the machines were launched
        self.timeline: list[str] = []  # "node N: boot .. · stack .. · run .." (timeline.py), once final
        self._old_handlers: dict[int, Any] = {}
        self.secret_values = secret_values or {}
        self.delivery = SecretDelivery(self.run_id, spec.num_nodes, self.secret_values, data, registry)

    # -- signals ------------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        if self.tearing_down or self.signals > 1:
            to_stderr(
                f"\nwarning: {signal.Signals(signum).name} received again: still tearing down run "
                f"{self.run_id} so that nothing keeps billing; please wait."
            )
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
        if not self.attached:
            from gpucloud.run.recovery import record_plan_args

            self.store.create_run(
                self.run_id,
                name=spec.name,
                spec_path=str(spec.source) if spec.source else None,
                spec=spec.model_dump(mode="json"),
                cloud=first.cloud,
                region=first.region,
                instance_type=first.instance_type,
                num_nodes=spec.num_nodes,
                price_per_hour=first.price_per_hour,
                detached=self.detach,
                pid=os.getpid(),
            )
            record_plan_args(self.store, self.run_id, **self.plan_kw)
            self.store.set_phase(self.run_id, "plan", self.phases["plan"])
        self._install_signals()
        try:
            with self.progress:
                self.progress.info(f"run {self.run_id}")
                status, code, message = self._run_guarded()
        finally:
            self._restore_signals()
        if (message and status not in ("succeeded", "detached")) or self.refused:
            to_stderr(f"run {self.run_id}: {status} (exit {code}): {message}")
        elif status != "detached":
            print(f"run {self.run_id}: {status} (exit {code})", file=sys.stderr, flush=True)
        for line in (self.launch.skipped() if self.launch else []) + self.timeline:  # quotas to raise; billed time
            to_stderr(f"  {line}", continuation="    ")
        self._gpu_use()
        if status == "detached" and not self.json_out:
            print(self.run_id, flush=True)
        run = self.store.get_run(self.run_id)
        return RunResult(
            run_id=self.run_id,
            status=status,
            exit_code=code,
            artifacts_dir=self.artifacts_dir,
            phases=dict(self.phases),
            cost=run.cost() if run else 0.0,
            artifacts_refused=self.refused,
        )

    def _run_guarded(self) -> tuple[str, int | None, str]:
        """Provision, then follow (or detach), with the teardown in `finally`."""
        status, message = "error", ""
        code: int | None = 70
        keep_running = False
        try:
            if not self.attached:
                self._provision()
            if self.detach:
                self.delivery.before_detach(self.launch, self.progress)
                keep_running = True
                keep.mark_detached(self.store, self.run_id, self.spec, self.progress)  # running; `keep`: its follower
                status, code = "detached", None
            else:
                status, code, message = self._follow_recovering()
                if status not in (*budget.ENDED_EARLY, "down"):
                    self._collect()
                    if self.refused:  # the summary never reads as a plain success when files were refused
                        message = "; ".join(filter(None, [message, refused_note(self.refused)]))
                    keep_running = self.kept and keep.record_kept(self.store, self.run_id, code, self.progress.info)
        except _Interrupt as intr:
            status, code = "interrupted", 130
            message = f"{signal.Signals(intr.signum).name} received"
            self.progress.warn(f"{message}: tearing down run {self.run_id}")
        except NoCandidateError as exc:
            status, code, message = "no-capacity" if exc.capacity else "error", exc.exit_code, exc.message
            raise
        except GpucloudError as exc:
            status, code, message = ("error", exc.exit_code, exc.message)
            raise
        except Exception as exc:
            full = no_space(exc)  # a full disk is exit 74 with where to free space (state/guard.py), not a bug
            status, code, message = "error", 70, f"{type(exc).__name__}: {exc}"
            if full is not None:
                code, message = full.exit_code, full.message
            raise
        finally:
            if not keep_running:
                stopped = status in budget.ENDED_EARLY and self._stop_first()
                code = self._teardown(70 if code is None else code)
                self._drain_logs()
                if status in budget.ENDED_EARLY:
                    self._after_interrupt(f"run {self.run_id} {status} (exit {code}): {message}", stopped)
                self.store.finish_run(self.run_id, status, exit_code=code, message=message or None)
            self.store.set_phases(self.run_id, self.phases)
        return status, code, message

    def _provision(self) -> None:
        """The failover loop (failover.py); the code tarball is removed whatever happens."""
        from gpucloud.channel.run_objects import pack_workdir
        from gpucloud.run.failover import Failover
        from gpucloud.spec.reach import credential_places

        t0 = time.monotonic()
        self.progress.phase("provision")
        tarball = pack_workdir(self.spec.workdir_path(), skip=credential_places())
        keep.remember_workdir(self.spec, self.run_id, tarball)  # a kept machine's next job sends what changed
        loop = Failover(self.spec, self.plan, self.run_id, self.store, self.journal, self.progress, vm_dir=self.vm_dir)
        try:
            with self.progress.waiting("the cloud to create the machine(s)"):  # a line every 30 s
                self.launch = loop.run(tarball)
        finally:
            self.phases["provision"] = time.monotonic() - t0
            try:
                tarball.unlink(missing_ok=True)
                tarball.parent.rmdir()
            except OSError:
                pass
        self.launched_at = time.time()
        cand = self.launch.candidate
        where = f"{cand.cloud}/{cand.region}/{cand.instance_type}" + (" (spot)" if cand.spot else "")
        self.store.update_run(self.run_id, status="running", phase="booting")
        self.progress.phase_done("provision", self.phases["provision"], note=f"on {where}")

    # -- following ----------------------------------------------------------------------------------

    def _follow(self) -> tuple[str, int, str]:
        """Stream logs and stages until every node reports a final status; detect dead machines and
        a passed deadline. Returns (status, exit code, message)."""
        assert self.launch is not None
        launch, n = self.launch, self.spec.num_nodes
        caps = launch.provider.capabilities
        interval, heartbeat_s = caps.poll_interval, caps.heartbeat_interval
        if self.mirror is None:
            self.mirror = LogMirror(self.home, self.run_id, n)
        shown: dict[str, str] = {}  # stage -> "start" | "end"
        noted: set[str] = set()  # status fields already named as ignored
        booted_at, last_state_check = time.time(), 0.0
        first_final_at: float | None = None
        seen: list[float | None] = [None] * n  # when this CLI first saw each node's final status
        grace = max(PEER_FAIL_GRACE_S, interval)
        while True:
            obs = observe(launch.channel, self.run_id, n)
            gpu_report.save(self.home, self.run_id, obs.statuses)  # the GPU sampler's latest summary
            self.delivery.follow(launch, self.progress.warn)
            self._pump_logs()
            self._show_stages(obs.statuses, shown)
            self.progress.tick(awaited(obs.statuses[0] if obs.statuses else None))  # a line every 30 s
            for note in sorted(set(obs.notes) - noted):
                noted.add(note)
                self.progress.warn(note)
            # Someone ran `gpucloud down` on this run from another terminal (it marks the run
            # before it kills anything, so the nodes' "stopped by a signal" status is not the outcome).
            rec = self.store.get_run(self.run_id)
            if rec is not None and rec.status in ("down", "down-pending"):
                self.progress.warn("the run was torn down by `gpucloud down` from another process")
                return "down", 130, "torn down by `gpucloud down`"
            finals, now = obs.finals, time.time()
            seen = [t if t is not None or not f else now for t, f in zip(seen, finals, strict=False)]
            if obs.all_final:
                break
            bad = [r for r, st in enumerate(obs.statuses) if finals[r] and st and st.get("state") != "succeeded"]
            if bad:
                if first_final_at is None:
                    first_final_at = now
                    self.progress.warn(
                        f"node {bad[0]} ended ({(obs.statuses[bad[0]] or {}).get('state')}): the other "
                        f"node(s) get {grace:.0f}s to finish, then the whole run is torn down"
                    )
                if now - first_final_at >= grace:
                    self.peers_stopped = [r for r in range(n) if not finals[r]]
                    break
            if now > launch.deadline + CLI_DEADLINE_GRACE_S:
                self.progress.warn("max_duration passed and the machine did not end the run itself: tearing down")
                return "deadline", 124, "max_duration passed"
            if (ended := budget.over(self.store, self.run_id, self.spec.max_cost, self.progress.warn)) is not None:
                return ended
            if now - last_state_check >= max(interval, heartbeat_s) and stale(
                obs.statuses, booted_at, now, heartbeat_s
            ):
                last_state_check = now
                lost = self._lost(finals)
                if lost is not None:
                    return lost
            time.sleep(interval)
        return self._finished(obs.statuses, seen)

    def _follow_recovering(self) -> tuple[str, int, str]:
        """Follow the run, relaunching an attempt preempted or lost while recovery allows; the run ends
        at its max_cost instead when nothing is left of it for a relaunch."""
        status, code, message = self._follow()
        while status in ("preempted", "lost") and self._relaunch(status, message):
            status, code, message = self._follow()
        return (self.recovery.spent_out if self.recovery else None) or (status, code, message)

    def _relaunch(self, status: str, message: str) -> bool:
        """Spot recovery (recovery.py): the attempt ended preempted or lost; relaunch if the job's
        `recovery` says so. Returns whether a new attempt runs."""
        from gpucloud.run.recovery import Recovery

        assert self.launch is not None and self.mirror is not None
        if self.recovery is None:
            self.recovery = Recovery(
                self.spec,
                self.plan,
                self.run_id,
                self.store,
                self.journal,
                self.progress,
                plan_kw=self.plan_kw,
                secrets=self.secret_values,
            )
        self.progress.warn(f"attempt {self.launch.attempt + 1}: {message if message.startswith(status) else status}")
        t0 = time.monotonic()
        launch = self.recovery.relaunch(self.launch, status, message)
        self.phases["provision"] = self.phases.get("provision", 0.0) + time.monotonic() - t0
        if launch is None:
            return False
        self.launch, self.peers_stopped = launch, []
        self.delivery.reset()
        self.mirror.restart()
        self.store.update_run(self.run_id, status="running", phase="booting")
        return True

    def _lost(self, finals: list[bool]) -> tuple[str, int, str] | None:
        """Ask the provider whether the machines still exist; a dead one without a final status
        makes the run "lost"."""
        assert self.launch is not None
        launch, n = self.launch, self.spec.num_nodes
        obs = observe(launch.channel, self.run_id, n, launch.provider.node_states(launch.handle))
        if not obs.lost:
            return None
        self._pump_logs(final=True)
        dead = obs.lost
        stage = obs.stage(dead)
        where = f"node {dead[0]}" if n > 1 else "the machine"
        self.peers_stopped = [r for r in range(n) if not finals[r] and r not in dead]
        hint = launch.provider.console_hint(launch.handle, dead[0])
        return (
            "lost",
            70,
            (
                f"{where} stopped without reporting a final status"
                f"{f' (last stage: {stage})' if stage else ''}{f'; {hint}' if hint else ''}"
            ),
        )

    def _finished(self, statuses: list[dict | None], seen: list[float | None]) -> tuple[str, int, str]:
        """Final statuses are in; their log_parts count covers every part: take the rest."""
        self._pump_logs(final=True)
        self.progress.phase(None)
        self.phases.update(vm_phases(statuses))
        self.timeline = format_nodes(statuses, launched_at=self.launched_at)
        status, code, message = budget.node_end(outcome(statuses, seen), self.store, self.run_id, self.progress.warn)
        self.kept = keep.kept_status(statuses) is not None
        if self.peers_stopped:
            message += f"; node(s) {', '.join(map(str, self.peers_stopped))} stopped with the run"
        return status, code, message

    def _gpu_use(self) -> None:
        """The run's GPU use and the right-sized machine (gpu_report.py), when the nodes sampled."""
        run = self.store.get_run(self.run_id)
        doc = gpu_report.run_usage(self.home, run, time.time()) if run is not None else None
        for line in gpu_report.usage_lines(doc) if doc else []:
            to_stderr(f"  {line}")

    def _pump_logs(self, final: bool = False) -> None:
        assert self.mirror is not None and self.launch is not None
        self.mirror.sync(self.launch.channel, final=final)
        self.mirror.drain(self.progress.log)

    def _show_stages(self, statuses: list[dict | None], shown: dict[str, str]) -> None:
        """Stage changes of rank 0 (the others run the same stages) as progress lines."""
        st = statuses[0] if statuses else None
        if not st:
            return
        stages = st.get("stages") or {}
        for name in sorted(stages, key=stage_order):
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
                if st.get("state") == "preempted" and not info.get("ok"):  # not a failure of the job
                    self.progress.phase_done(name, secs, False, note=self._after_preemption(), mark="preempted")
                else:
                    self.progress.phase_done(name, secs, info.get("ok"))

    def _after_preemption(self) -> str:
        """What a preempted attempt leads to, as the job's `recovery` says (docs/SPOT.md)."""
        rec = self.spec.recovery
        if rec is not None and "preemption" in rec.on:
            then = ", then on on-demand" if rec.fallback == "on-demand" else ""
            return f"(the cloud reclaimed the spot machine: relaunching, up to {rec.max_restarts} restart(s){then})"
        return "(the cloud reclaimed the spot machine; the run ends preempted: `recovery:` in the job relaunches it)"

    # -- the end ------------------------------------------------------------------------------------

    def _collect(self) -> None:
        """Read the artifacts back (run_artifacts.py) and record where they landed."""
        assert self.launch is not None
        t0 = time.monotonic()
        interrupted = self.interrupted
        if not interrupted:
            self.store.update_run(self.run_id, status="collecting", phase="collect")
        dest = results_dir(self.run_id)
        n = self.spec.num_nodes
        got = fetch_artifacts(self.launch.channel, self.run_id, n, dest, refused=self.refused, progress=self.progress)
        self.phases["collect"] = time.monotonic() - t0
        found = settle_artifacts(
            got, dest, interrupted=interrupted, expected=bool(self.spec.artifacts), progress=self.progress
        )
        if found is not None:
            self.artifacts_dir = str(found)
            self.store.update_run(self.run_id, artifacts_dir=str(found))

    def _drain_logs(self) -> None:
        """After the teardown of a multi-node run that ended early: the nodes that were stopped
        pushed their last log lines when they got SIGTERM; show them too (best effort)."""
        if not self.peers_stopped or self.mirror is None or self.launch is None:
            return
        with contextlib.suppress(Exception):  # the channel may already be gone with the run
            self._pump_logs(final=True)

    def _stop_first(self) -> bool:
        """A provider whose teardown removes the channel (SSH hosts) stops the nodes first, keeping
        their folders (`Provider.stop`), so that what the job saved is read back before."""
        launch = self.launch
        if launch is None or not launch.provider.capabilities.channel_torn_down:
            return False
        self.tearing_down = True  # a second Ctrl-C from here on only warns
        try:
            launch.provider.stop(launch.handle)
        except Exception as exc:  # noqa: BLE001 - the teardown that follows reports what is left
            self.progress.warn(f"could not stop the run's nodes before its teardown: {exc}")
            return False
        self._bring_back()
        return True

    def _bring_back(self) -> None:
        """The nodes of a run the CLI ended were stopped as a cloud stops a machine: a job that saved its
        outputs on SIGTERM had them uploaded. Read back the last log lines and those artifacts (or none)."""
        try:
            self.interrupted = True
            wait_final(self.launch.channel, self.run_id, self.spec.num_nodes)  # type: ignore[union-attr]
            self._pump_logs(final=True)
            self._collect()
        except Exception as exc:  # noqa: BLE001 - best effort: the machines are gone, the channel may be too
            self.progress.warn(f"nothing came back from the interrupted run: {exc}")

    def _after_interrupt(self, verdict: str, stopped: bool) -> None:
        """After the teardown of a run the CLI ended (Ctrl-C, max_cost): bring back what the job saved
        (unless done before the teardown), then end the log with the run's verdict, as `status` has it."""
        if self.launch is None or self.mirror is None:
            return
        if not stopped:
            self._bring_back()
        self.mirror.note(verdict)

    def _teardown(self, code: int) -> int:
        """Always runs. A second Ctrl-C during it is ignored (with a warning). A store that broke
        during the run does not stop it: the handle files kept beside the store are used."""
        from gpucloud.run.teardown import run_handles, teardown_from_handle_files, teardown_run
        from gpucloud.state.guard import StoreError

        self.tearing_down = True
        t0 = time.monotonic()
        try:
            run = self.store.get_run(self.run_id)
            handles = run_handles(self.store, run) if run is not None else []
            if run is None or not any(h.nodes or h.resources for h in handles):
                # Nothing asked for, or every failed attempt cleaned up: every create is journalled first.
                self.store.end_attempt(self.run_id, None, "teardown: nothing was created")
                return code
            self.store.update_run(self.run_id, status="tearing-down", phase="teardown")
            self.progress.phase("teardown")
            errors = teardown_run(self.store, self.journal, run, wait=self.wait_teardown, say=self.progress.warn)
        except StoreError as exc:
            self.progress.warn(exc.render())
            try:
                errors = teardown_from_handle_files(self.store.path, self.run_id, say=self.progress.warn)[1]
            except LookupError as missing:  # provision never returned a handle: the tags are left
                errors = [f"{missing}; `gpucloud gc` sweeps by the clouds' tags"]
            code = code if code != 0 else exc.exit_code
        self.phases["teardown"] = time.monotonic() - t0
        if errors:
            self.progress.warn(f"teardown incomplete; `gpucloud down {self.run_id}` (or `gpucloud gc`) finishes it")
            return code if code != 0 else 70
        self.progress.phase_done("teardown", self.phases["teardown"])
        return code


__all__ = ["RunResult", "run_job", "new_run_id", "FINAL_STATUSES"]
