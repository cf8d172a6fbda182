"""The commands that look at or end runs after `gpucloud run` started them: status/ls, logs, down
and gc. They work from the state store (the runs, their attempts and stored run handles) and,
for runs nobody follows, bring the record up to date from the run's channel (watch.py decides)."""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from gpucloud.contract import registry as providers
from gpucloud.contract.provider import Unreachable
from gpucloud.errors import Declined, InternalError, UserError
from gpucloud.prose import fill, output_width, to_stderr
from gpucloud.run.log import LogMirror
from gpucloud.run.sweep import Sweep
from gpucloud.run.watch import ended_at, observe, outcome, vm_phases
from gpucloud.state.guard import StoreError
from gpucloud.state.runs_db import Journal, ResourceRecord, RunRecord, Store, current_user, home_dir
from gpucloud.ui import views

if TYPE_CHECKING:
    from gpucloud.channel.run_objects import Channel

DEFAULT_POLL_S = 5.0  # `logs --follow` of a run whose provider is unknown
MACHINE_KINDS = ("process", "instance", "vm", "node")  # journal kinds that are the machines themselves
# A planned/provisioning run whose CLI is gone is finalised by status/gc after this many seconds.
STUCK_GRACE_S = 600.0


def pid_alive(pid: int | None) -> bool:
    """Whether a process (the CLI that follows a run) still lives: a zombie counts as gone."""
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


def channel_for(run: RunRecord) -> Channel | None:
    """The run's channel, or None when it never reached a region or its provider cannot open one."""
    if not run.cloud or not run.region:
        return None
    try:
        return providers.get_provider(run.cloud).channel(run.region)
    except Exception:
        return None


def _node_states(run: RunRecord) -> list[str]:
    """The provider's node states of the run's latest launched attempt (teardown.latest_handle)."""
    from gpucloud.run.teardown import latest_handle

    handle = latest_handle(run)
    if handle is None or run.status not in ("running", "provisioning"):
        return []
    try:
        return providers.get_provider(handle.cloud).node_states(handle)
    except Exception:
        return []


def _stuck_before_launch(store: Store, run: RunRecord, now: float) -> bool:
    """A run left `planned`/`provisioning` by a CLI that was killed before the first resource: no
    process will move it on, and nothing bills. Only after STUCK_GRACE_S, so a slow start is not it."""
    return (
        run.status in ("planned", "provisioning")
        and now - run.created_at > STUCK_GRACE_S
        and not pid_alive(run.pid)
        and not any(a.launched for a in run.attempts)
        and not store.resources(run.id, alive_only=True)
    )


def refresh(store: Store, run: RunRecord) -> RunRecord:
    """Bring an active run's record up to date from its channel when no CLI is following it (a
    detached run, or a `run` that was killed): final status, exit code, current stage, or "lost".
    A killed `run` whose job ended is "collecting", not final, until `gpucloud collect` read it."""
    if run.final or (not run.detached and pid_alive(run.pid) and run.pid != os.getpid()):
        return run
    if _stuck_before_launch(store, run, time.time()):
        store.finish_run(
            run.id,
            "error",
            exit_code=70,
            only_if_active=True,
            message=f"the CLI ended while the run was {run.status}, before any machine was created",
        )
        return store.get_run(run.id) or run
    ch = channel_for(run)
    if ch is None:
        return run
    try:
        obs = observe(ch, run.id, run.num_nodes)
        if not obs.all_final:
            obs = observe(ch, run.id, run.num_nodes, _node_states(run))
    except Exception:
        return run
    from gpucloud.run import gpu_report
    from gpucloud.state.runs_db import home_dir

    gpu_report.save(home_dir(), run.id, obs.statuses)
    from gpucloud.run.keep import ended_kept, mark_kept, still_kept

    if still_kept(run, obs.statuses):  # its machine waits for the next job (run/keep.py)
        return mark_kept(store, run, obs.statuses)
    if obs.all_final and not run.detached:  # the `run` following it died before reading the result
        status, code, _ = outcome(obs.statuses)
        store.set_phases(run.id, vm_phases(obs.statuses))
        store.update_run(
            run.id,
            status="collecting",
            phase="collect",
            message=f"the job ended ({status}, exit {code}) but the `gpucloud run` following it "
            f"stopped before reading the result: `gpucloud collect {run.id}` brings it back",
        )
    elif obs.all_final:
        status, code, message = outcome(obs.statuses)
        store.set_phases(run.id, vm_phases(obs.statuses))
        end = ended_at(obs.statuses)
        store.finish_run(run.id, status, exit_code=code, message=message or None, only_if_active=True, ended_at=end)
        # Nobody follows it (no `gpucloud watch`): the attempt ends with the run (a preempted one as
        # preempted), at the nodes' own end, so `cost` bills it to there, not to whenever it was listed.
        store.end_attempt(run.id, None, (message or "preempted") if status == "preempted" else f"job {status}")
    elif obs.lost:
        store.finish_run(
            run.id, "lost", exit_code=70, message="the machine is gone without a final status", only_if_active=True
        )
    else:
        stage = obs.stage()
        if stage and stage != run.phase:
            store.update_run(run.id, phase=stage)
    ended_kept(store, run, obs.all_final or bool(obs.lost))
    return store.get_run(run.id) or run


def orphaned(run: RunRecord) -> bool:
    """A followed run whose `gpucloud run` died after the job ended: its result waits in the channel."""
    return run.status == "collecting" and not run.detached and not pid_alive(run.pid)


def reconcile(store: Store, run: RunRecord) -> RunRecord:
    """A finished run whose journal still lists machines: ask the provider; when every node is gone
    (a local process that exited, a VM that deleted itself), the journal says so, and `status` no
    longer shows them as "not yet deleted". Without credentials or network: what the store knows."""
    from gpucloud.run.teardown import run_handles

    alive = store.resources(run.id, alive_only=True)
    if not run.final or not alive:
        return run
    journal = Journal(store)
    for handle in run_handles(store, run):
        try:
            states = providers.get_provider(handle.cloud).node_states(handle)
        except Exception:  # noqa: BLE001 - no credentials now, no network: keep the journal as it is
            continue
        if states and all(state == "gone" for state in states):
            for res in alive:
                if (res.cloud, res.region or "") == (handle.cloud, handle.region) and res.kind in MACHINE_KINDS:
                    journal.deleted(res.id)
            store.event(run.id, "reconcile", f"the run's machines on {handle.cloud}/{handle.region} are gone")
    return store.get_run(run.id) or run


def require_run(store: Store, ref: str) -> RunRecord:
    """The run `ref` names, or the user error that says how to list the runs."""
    run = store.find_run(ref)
    if run is None:
        raise UserError(f"no run {ref!r} in {store.path}.", hint="`gpucloud ls` lists the runs.")
    return run


# ---- status / ls ---------------------------------------------------------------------------------------


def show_status(run_id: str | None, *, json_out: bool, all_users: bool = False) -> None:
    """One run with its phases and events, or every run (on a shared store, the user's own unless
    all_users); active ones refreshed from their channel."""
    from gpucloud.ui import jsonout

    store = Store()
    now = time.time()
    if run_id is not None:
        run = reconcile(store, refresh(store, require_run(store, run_id)))
        phases = store.phases(run.id)
        if json_out:
            doc = {
                **run.as_json(now),
                "phases": phases,
                "events": [{"ts": e.ts, "kind": e.kind, "message": e.message} for e in store.events(run.id)],
                "resources": [
                    {
                        "cloud": r.cloud,
                        "region": r.region,
                        "kind": r.kind,
                        "name": r.name,
                        "cloud_id": r.cloud_id,
                        "status": r.status,
                    }
                    for r in store.resources(run.id, alive_only=False)
                ],
                "attempts": [
                    {
                        "idx": a.idx,
                        "cloud": a.cloud,
                        "region": a.region,
                        "zone": a.zone,
                        "instance_type": a.instance_type,
                        "spot": a.spot,
                        "price_per_hour": a.price_per_hour,
                        "num_nodes": a.num_nodes,
                        "started_at": a.started_at,
                        "ended_at": a.ended_at,
                        "end_reason": a.end_reason,
                        "launched": a.launched,
                        "cost": round(a.cost(run.ended_at or now), 6),
                    }
                    for a in run.attempts
                ],
            }
            print(jsonout.dumps(doc))
            return
        views.print_run_detail(run, phases, store.resources(run.id, alive_only=True), now)
        _print_gpu_use(run, now)
        return
    owner = current_user() if store.shared and not all_users else None
    runs = [reconcile(store, refresh(store, r)) for r in store.list_runs(owner=owner)]
    if json_out:
        print(jsonout.dumps([{**r.as_json(now), "phases": store.phases(r.id)} for r in runs]))
        return
    if not runs:
        to_stderr("no runs yet (`gpucloud run JOB.yaml` starts one)")
        return
    views.print_runs(runs, now)


# ---- logs ---------------------------------------------------------------------------------------------


def show_logs(run_id: str, *, follow: bool) -> int:
    """Print the stored log plus newer parts from the channel; with follow, until the run ends.
    Returns the job's exit code when the run has ended (0 otherwise)."""
    store = Store()
    run = require_run(store, run_id)
    mirror = LogMirror(home_dir(), run.id, run.num_nodes)
    channel = channel_for(run)
    from gpucloud.ui.ci import LogFence

    out = LogFence(sys.stdout.buffer)  # under GitHub Actions the job's workflow commands are never run
    interval = providers.capabilities(run.cloud).poll_interval if run.cloud else DEFAULT_POLL_S

    def pump(final: bool = False) -> None:
        if channel is not None:
            try:
                mirror.sync(channel, final=final)
            except Exception as exc:  # the channel may be gone (expired URLs, deleted bucket)
                to_stderr(f"warning: newer log parts unavailable: {exc}")
        mirror.drain(out.write)
        out.flush()

    pump(final=run.final)
    if not follow:
        return 0
    if channel is None and not run.final:
        to_stderr(f"warning: cannot reach run {run.id}'s channel; showing the stored log only")
    try:
        while True:
            run = refresh(store, store.get_run(run.id) or run)
            if run.final or orphaned(run):
                break
            time.sleep(interval)
            pump()
    except KeyboardInterrupt:
        return 130
    pump(final=True)
    return run.exit_code if run.exit_code is not None else 0


# ---- down / gc --------------------------------------------------------------------------------------------


def _warn(message: str) -> None:
    views.note(f"warning: {message}")


def down_run(run_id: str, *, assume_yes: bool) -> None:
    """Tear one run down, from any process; the run is marked "down" unless it had already ended.
    A store that cannot be read does not stop it: the run's handle files beside it are used."""
    try:
        _down_with_store(run_id, assume_yes=assume_yes)
    except StoreError as exc:
        _down_without_store(run_id, exc, assume_yes=assume_yes)


def _keep_log(run: RunRecord) -> None:
    """Mirror what the channel holds before a teardown that may take the channel with it (an ssh
    host's folder): a detached run nobody followed keeps its log for `gpucloud logs`."""
    if not run.cloud or not providers.capabilities(run.cloud).channel_torn_down:
        return
    channel = channel_for(run)
    if channel is None:
        return
    try:
        LogMirror(home_dir(), run.id, run.num_nodes).sync(channel, final=run.final)
    except Exception as exc:  # noqa: BLE001 - the teardown matters more than the log
        _warn(f"the run's log could not be copied before teardown: {exc}")


def _down_with_store(run_id: str, *, assume_yes: bool) -> None:
    from gpucloud.run.teardown import teardown_run

    store = Store()
    journal = Journal(store)
    run = require_run(store, run_id)
    alive = store.resources(run.id, alive_only=True)
    if run.final and not alive:
        to_stderr("\n".join([f"run {run.id} already ended ({run.status}); nothing left to tear down", *_kept(run)]))
        return
    if not assume_yes and not views.ask(f"Tear down run {run.id} ({run.status}, {len(alive)} resource(s))?"):
        raise Declined("nothing torn down.")
    _keep_log(run)
    # Mark first: a `run` following it sees "down" and stops instead of reporting a lost machine.
    store.finish_run(run.id, "down", message="torn down by `gpucloud down`", only_if_active=True)
    unreached: list[str] = []
    t0 = time.monotonic()
    errors = teardown_run(store, journal, run, wait=True, say=_warn, unreached=unreached)
    _say_torn_down(store, run, alive, done=not errors)
    if errors:
        _down_incomplete(store, run.id, errors, unreached)
    _down_done(store, run.id)
    store.event(run.id, "down", f"torn down in {time.monotonic() - t0:.1f}s")


def _say_torn_down(store: Store, run: RunRecord, handled: list[ResourceRecord], *, done: bool) -> None:
    """Each resource by kind and id, deleted or not; then what the run's channel keeps (and for how
    long) after a teardown, as its provider says."""
    left = {r.id for r in store.resources(run.id, alive_only=True)}
    head = f"run {run.id}: " + (f"torn down ({len(handled)} resource(s))" if done else "teardown incomplete")
    lines = [head + (":" if handled else ""), *views.resource_lines(handled, left)]
    to_stderr("\n".join(lines + _kept(run)))


def _kept(run: RunRecord) -> list[str]:
    """What the run's channel keeps after its teardown, as its provider's registry entry says."""
    kept = providers.info(run.cloud).channel_kept if run.cloud in providers.names() else ""
    return [kept.format(run_id=run.id)] if kept else []


def _down_incomplete(store: Store, run_id: str, errors: list[str], unreached: list[str]) -> None:
    """A teardown that did not finish: the run is `down-pending` (not `down`: its job may still run
    and hold its GPU), and `down`/`gc` try again. Machines that were not reached at all: exit 75."""
    current = store.get_run(run_id)
    if current is not None and current.status in ("down", "down-pending"):
        store.update_run(
            run_id, status="down-pending", message="`gpucloud down` could not finish: " + "; ".join(errors)[:500]
        )
    retry = f"Run `gpucloud down {run_id}` again once it can be reached (`gpucloud gc` retries too)."
    if unreached and len(unreached) == len(errors):
        raise Unreachable(
            f"run {run_id} is down-pending: {', '.join(unreached)} not reached, so its job may still "
            "be running there (and holding its GPU):\n  " + "\n  ".join(errors),
            hint=retry,
        )
    raise InternalError(
        f"teardown of run {run_id} incomplete (the run is down-pending):\n  " + "\n  ".join(errors), hint=retry
    )


def _down_done(store: Store, run_id: str) -> None:
    """A `down-pending` run whose teardown now finished becomes `down`."""
    current = store.get_run(run_id)
    if current is not None and current.status == "down-pending":
        store.update_run(run_id, status="down", message="torn down by `gpucloud down`")


def preempt_run(run_id: str, *, node: int | None) -> None:
    """`gpucloud preempt`: write the simulated interruption notice (the channel's `notice` object,
    docs/SPOT.md) for one node or every node; each node's guard acts on it within seconds, as on a
    cloud's own notice: SIGTERM to the job, checkpoint upload, state `preempted`."""
    store = Store()
    run = require_run(store, run_id)
    if run.final:
        raise UserError(f"run {run.id} already ended ({run.status}); there is nothing to preempt.")
    if node is not None and not 0 <= node < run.num_nodes:
        raise UserError(f"--node {node}: run {run.id} has node(s) 0..{run.num_nodes - 1}.")
    channel = channel_for(run)
    if channel is None or run.status not in ("running", "provisioning"):
        raise UserError(
            f"run {run.id} is {run.status}: no machine to send the notice to yet.",
            hint="Try again once `gpucloud status` shows it running.",
        )
    ranks = [node] if node is not None else list(range(run.num_nodes))
    for rank in ranks:
        channel.send_notice(run.id, rank)
    store.event(run.id, "preempt", f"simulated interruption notice sent to node(s) {ranks}")
    to_stderr(f"run {run.id}: interruption notice sent to node(s) {', '.join(map(str, ranks))}")


def _down_without_store(ref: str, damage: StoreError, *, assume_yes: bool) -> None:
    """`down` when the store is damaged: tear down from the handle files; the damage is still said."""
    from gpucloud.run.teardown import teardown_from_handle_files

    to_stderr(f"warning: {damage.render()}")
    if not assume_yes and not views.ask(f"Tear down run {ref} from its handle files?"):
        raise Declined("nothing torn down.")
    try:
        run_id, errors = teardown_from_handle_files(damage.path, ref, say=_warn)
    except LookupError as exc:
        raise StoreError(
            f"{damage.message} Run {ref} cannot be torn down without it: {exc}.",
            path=damage.path,
            hint="`gpucloud gc` still sweeps what the clouds' tags say has expired.",
        ) from None
    if errors:
        raise InternalError(
            f"teardown of run {run_id} incomplete:\n  " + "\n  ".join(errors),
            hint=f"Run `gpucloud down {run_id}` again, or `gpucloud gc`.",
        )
    to_stderr(f"run {run_id}: torn down from its handle files (the state store was not used)")


def _gc_clouds(store: Store | None, cloud: str | None) -> list[str]:
    """The providers gc sweeps: the one asked for, else the unpriced ones (always reachable), those
    with live resources in the store, and the configured clouds."""
    if cloud:
        return [cloud]
    unpriced = [c for c in providers.names() if not providers.info(c).priced]
    in_store = store.clouds_with_resources() if store is not None else []
    return list(dict.fromkeys([*unpriced, *in_store, *providers.configured_clouds()]))


def _stale_runs(store: Store, cloud: str | None, now: float) -> list[RunRecord]:
    """Runs that ended (or whose deadline passed with nobody following them) but hold resources."""
    from gpucloud.run.failover import EXPIRY_MARGIN

    stale: list[RunRecord] = []
    for run in store.list_runs():
        run = refresh(store, run)
        if cloud and run.cloud != cloud and not any(r.cloud == cloud for r in store.resources(run.id)):
            continue
        if not store.resources(run.id, alive_only=True):
            continue
        followed = not run.detached and pid_alive(run.pid)
        expired = run.deadline is not None and now > run.deadline + EXPIRY_MARGIN.total_seconds()
        # "collecting": the job ended but its `run` died first; its machines go, its results stay
        # in the channel for `gpucloud collect`.
        if run.final or expired or (not followed and run.status in ("planned", "provisioning", "collecting")):
            stale.append(run)
    return stale


def collect_garbage(*, dry_run: bool, assume_yes: bool, cloud: str | None) -> None:
    """Sweep leftovers two ways: runs in the state store that ended (or whose deadline passed with
    nobody following them) but still hold resources, torn down from their stored handles; and each
    provider's tag-based `gc` as the fallback for what the store does not know (and all there is
    when the store cannot be read). Exit 78 when what should have been checked was not."""
    sweep = Sweep()
    try:
        found = _gc_with_store(sweep, dry_run=dry_run, assume_yes=assume_yes, cloud=cloud)
    except StoreError as exc:  # the tags still say what expired: sweep by them alone
        to_stderr(f"warning: {exc.render()}\ngc sweeps by the clouds' tags only.")
        found = _gc_by_tags(sweep, _gc_clouds(None, cloud), dry_run=dry_run, assume_yes=assume_yes)
    from gpucloud.plan.baked import load_index

    kept = [b for c, b in load_index() if cloud is None or c == cloud]
    if kept:  # tagged gpucloud:kind=image, never a run's: no sweep touches them
        to_stderr(
            f"{len(kept)} baked image(s) kept: images are not runs (`gpucloud image ls` lists them, "
            "`gpucloud image rm` deletes one)"
        )
    sweep.verdict(cloud, found)


def _gc_with_store(sweep: Sweep, *, dry_run: bool, assume_yes: bool, cloud: str | None) -> int:
    """Returns how many stale runs and tagged leftovers were found."""
    from gpucloud.run.teardown import teardown_run

    store = Store()
    journal = Journal(store)
    clouds = _gc_clouds(store, cloud)
    stale = _stale_runs(store, cloud, time.time())
    if not dry_run and not assume_yes:
        listed = []
        for r in stale:
            alive = store.resources(r.id, alive_only=True)
            listed += [f"run {r.id} ({r.status}): {len(alive)} resource(s):", *views.resource_lines(alive, None)]
        for c in clouds:
            listed += sweep.gc(c, datetime.now(UTC), dry_run=True)
        if not _confirm_sweep(listed):
            return 0

    found = 0
    width = output_width()
    for run in stale:
        found += 1
        alive = store.resources(run.id, alive_only=True)
        if dry_run:
            lines = [f"run {run.id} ({run.status}): {len(alive)} resource(s) would be torn down:"]
            print(fill("\n".join(lines + views.resource_lines(alive, None)), width))
            continue
        errors = teardown_run(store, journal, run, wait=True, say=_warn)
        if not errors:
            _down_done(store, run.id)
        if not run.final and not orphaned(run):
            store.finish_run(run.id, "lost", exit_code=70, message="swept by gc", only_if_active=True)
        left = {r.id for r in store.resources(run.id, alive_only=True)}
        head = f"run {run.id} ({run.status}): {len(alive)} resource(s) torn down" + (" with errors" if errors else "")
        print(fill("\n".join([head + ":", *views.resource_lines(alive, left)]), width))
    for c in clouds:
        lines = sweep.gc(c, datetime.now(UTC), dry_run=dry_run)
        found += len(lines)
        for line in lines:
            print(line)
    return found


def _gc_by_tags(sweep: Sweep, clouds: list[str], *, dry_run: bool, assume_yes: bool) -> int:
    """gc without the store: each provider's tag-based sweep (what expired), nothing else."""
    if not dry_run and not assume_yes:
        if not _confirm_sweep([line for c in clouds for line in sweep.gc(c, datetime.now(UTC), dry_run=True)]):
            return 0
    lines = [line for c in clouds for line in sweep.gc(c, datetime.now(UTC), dry_run=dry_run)]
    if lines:
        print("\n".join(lines))
    return len(lines)


def _confirm_sweep(listed: list[str]) -> bool:
    """Show what gc would delete and ask; False when there is nothing to collect."""
    if not listed:
        return False
    print("\n".join(listed))
    if not views.ask("Delete these?"):
        raise Declined("nothing deleted.")
    return True


def _print_gpu_use(run: RunRecord, now: float) -> None:
    """`status RUN`: each node's current GPU values and the run's GPU use so far (gpu_report.py)."""
    from gpucloud.run import gpu_report
    from gpucloud.state.runs_db import home_dir

    nodes = gpu_report.load(home_dir(), run.id)
    doc = gpu_report.run_usage(home_dir(), run, now) if nodes else None
    width = output_width()
    for line in [*gpu_report.node_lines(nodes), *(gpu_report.usage_lines(doc) if doc else [])]:
        print(fill(line, width, continuation="    "))
