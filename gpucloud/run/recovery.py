"""Spot recovery (docs/SPOT.md): what the CLI following a run does when an attempt ends preempted
(or lost): record it, tear down what is left of it, and relaunch through the failover order
starting after the candidate that was lost, or on-demand once `max_restarts` preemptions have
happened and the job says `fallback: on-demand`. The same code serves `gpucloud run` and
`gpucloud watch RUN` (a detached run followed from anywhere with the credentials).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gpucloud.errors import NoCandidateError
from gpucloud.run import budget
from gpucloud.state.runs_db import Journal, RunRecord, Store

if TYPE_CHECKING:
    from gpucloud.plan.planner import Plan
    from gpucloud.run.failover import Launch
    from gpucloud.spec.load import JobSpec
    from gpucloud.ui.progress import Progress

PLAN_EVENT = "plan-args"  # event holding the CLI's --cloud/--region/--spot, for `watch` to re-plan
CAPACITY_PAUSE_S = 60.0  # `on: [capacity]`: pause before trying the whole order again
EVENTS = {"preempted": "preemption", "lost": "lost"}  # run status of an attempt's end -> recovery.on word


def record_plan_args(
    store: Store, run_id: str, *, cloud: str | None = None, region: str | None = None, spot: bool | None = None
) -> None:
    """The CLI's plan overrides, kept so that `gpucloud watch` plans a relaunch the same way."""
    store.event(run_id, PLAN_EVENT, json.dumps({"cloud": cloud, "region": region, "spot": spot}))


def plan_args(store: Store, run_id: str) -> dict[str, object]:
    for ev in reversed(store.events(run_id)):
        if ev.kind == PLAN_EVENT:
            try:
                return dict(json.loads(ev.message))
            except ValueError:
                break
    return {"cloud": None, "region": None, "spot": None}


@dataclass
class Recovery:
    """The restart budget of one run and the relaunch itself."""

    spec: JobSpec
    plan: Plan
    run_id: str
    store: Store
    journal: Journal
    progress: Progress
    plan_kw: dict[str, object] = field(default_factory=dict)
    restarts: int = 0
    preemptions: int = 0
    on_demand: bool = False  # the fallback happened: every later attempt is on-demand
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)  # a replan reads the image as run did
    spent_out: tuple[str, int, str] | None = None  # the run's end when max_cost left nothing to relaunch with

    @classmethod
    def resume(
        cls, spec: JobSpec, plan: Plan, run: RunRecord, store: Store, journal: Journal, progress: Progress
    ) -> Recovery:
        """The budget of a run already under way (`gpucloud watch`), counted from its attempts."""
        rec = cls(spec, plan, run.id, store, journal, progress, plan_kw=plan_args(store, run.id))
        launched = [a for a in run.attempts if a.launched]
        rec.restarts = max(0, len(launched) - 1)
        rec.preemptions = sum(1 for a in launched if (a.end_reason or "").startswith("preempted"))
        rec.on_demand = bool(launched) and any(a.spot for a in launched) and not launched[-1].spot
        return rec

    def next_market(self, status: str, launch: Launch) -> str | None:
        """ "spot" | "on-demand" | "same" for the next attempt, or None: no restart (not asked for,
        or none left). Counts the preemption."""
        policy = self.spec.recovery
        event = EVENTS.get(status)
        if policy is None or event is None or event not in policy.on:
            return None
        if event == "preemption":
            self.preemptions += 1
        if policy.fallback == "on-demand" and launch.candidate.spot and self.preemptions >= policy.max_restarts:
            return "on-demand"
        if self.restarts < policy.max_restarts:
            return "same"
        self.progress.warn(f"no restart left (recovery.max_restarts: {policy.max_restarts})")
        return None

    def relaunch(self, launch: Launch, status: str, message: str) -> Launch | None:
        """End the lost attempt, tear it down, provision the next one; None when no restart applies."""
        market = self.next_market(status, launch)
        reason = message if message.startswith(status) else f"{status}: {message}" if message else status
        self.store.end_attempt(self.run_id, launch.attempt, reason)
        self.store.event(self.run_id, "recovery", f"attempt {launch.attempt + 1} {status}: {message}")
        self._teardown_attempt()
        if market is None:
            return None
        self.spent_out = budget.spent_before_relaunch(
            self.store, self.run_id, self.spec.max_cost, status, self.progress.warn
        )
        if self.spent_out is not None:
            return None
        self.restarts += 1
        plan, order = self._order(launch, market)
        self.progress.info(
            f"restart {self.restarts} of {self.spec.recovery.max_restarts if self.spec.recovery else 0}"
            f" after {status}" + (": falling back to on-demand" if market == "on-demand" else "")
        )
        return self._provision(plan, order, launch)

    def _order(self, launch: Launch, market: str) -> tuple[Plan, list[int]]:
        """The failover order of the next attempt: after the lost candidate, wrapping around (so the
        same zone/region comes last), or the on-demand plan from its cheapest candidate."""
        if market == "on-demand" or self.on_demand:
            self.on_demand = True
            from gpucloud.plan.planner import make_plan

            cloud, region = self.plan_kw.get("cloud"), self.plan_kw.get("region")
            plan = make_plan(
                self.spec,
                cloud=cloud if isinstance(cloud, str) else None,
                region=region if isinstance(region, str) else None,
                spot=False,
                secrets=self.secrets,
            )
            if market == "on-demand" or launch.candidate.spot:
                return plan, list(range(len(plan.candidates)))
            plan_index = next((i for i, c in enumerate(plan.candidates) if c == launch.candidate), -1)
        else:
            plan, plan_index = self.plan, launch.plan_index
        n = len(plan.candidates)
        return plan, [(plan_index + 1 + k) % n for k in range(n)]

    def _provision(self, plan: Plan, order: list[int], launch: Launch) -> Launch:
        """The failover loop over `order`; with `on: [capacity]`, an order with no capacity anywhere
        is tried again after CAPACITY_PAUSE_S while restarts remain."""
        from gpucloud.run.failover import Failover

        source = (launch.channel, launch.candidate.cloud, launch.candidate.region)
        while True:
            loop = Failover(
                self.spec, plan, self.run_id, self.store, self.journal, self.progress, order=order, source=source
            )
            try:
                return loop.run(None)
            except NoCandidateError:
                policy = self.spec.recovery
                if policy is None or "capacity" not in policy.on or self.restarts >= policy.max_restarts:
                    raise
                self.restarts += 1
                self.progress.warn(
                    f"no capacity anywhere: trying again in {CAPACITY_PAUSE_S:.0f}s "
                    f"(restart {self.restarts} of {policy.max_restarts})"
                )
                time.sleep(CAPACITY_PAUSE_S)

    def _teardown_attempt(self) -> None:
        """Tear down what is left of the attempt (its machines may still be stopping)."""
        from gpucloud.run.teardown import teardown_run

        run = self.store.get_run(self.run_id)
        if run is None:
            return
        errors = teardown_run(self.store, self.journal, run, wait=True, say=self.progress.warn)
        if errors:
            self.progress.warn("the lost attempt's teardown is incomplete; the run's final teardown retries it")


def launch_of(run: RunRecord, plan: Plan) -> Launch:
    """The Launch of a run's latest launched attempt, rebuilt from the store (`gpucloud watch`);
    one cut short in provision is followed by a partial handle of its own (teardown.latest_handle)."""
    from gpucloud.contract import registry as providers
    from gpucloud.errors import UserError
    from gpucloud.run.failover import Launch
    from gpucloud.run.teardown import latest_handle

    handle = latest_handle(run)
    if handle is None:
        raise UserError(f"run {run.id} has no launched attempt to watch.")
    att = [a for a in run.attempts if a.launched][-1]
    provider = providers.get_provider(handle.cloud)
    key = (att.cloud, att.region, att.instance_type, att.spot)
    plan_index = next(
        (i for i, c in enumerate(plan.candidates) if (c.cloud, c.region, c.instance_type, c.spot) == key), -1
    )
    cand = (
        plan.candidates[plan_index]
        if plan_index >= 0
        else replace(
            plan.candidates[0],
            cloud=att.cloud,
            region=att.region,
            instance_type=att.instance_type or "",
            spot=att.spot,
            price_per_hour=att.price_per_hour,
        )
    )
    return Launch(
        provider=provider,
        candidate=cand,
        channel=provider.channel(att.region),
        handle=handle,
        deadline=run.deadline or time.time() + 3600,
        plan_index=max(plan_index, 0),
        attempt=att.idx,
    )


def relaunch_lookups(run: RunRecord, warn: Callable[[str], None]) -> tuple[JobSpec, Any, Mapping[str, str]]:
    """The job of a run `gpucloud watch` follows, and what a relaunch seals, as the launching CLI
    would: the job's data grants (looked up again with the watcher's credentials) and the secret
    values of the watcher's environment. What cannot be had here is a warning: the run goes on, a
    relaunch without it."""
    from gpucloud.errors import UserError
    from gpucloud.spec.load import JobSpec
    from gpucloud.spec.secrets import resolve

    spec = JobSpec.model_validate(json.loads(run.spec_json or "{}"))
    _, values = resolve(spec, missing_ok=True)
    if values.missing:
        warn(f"a relaunch gets no value for {', '.join(values.missing)}: set it in this environment")
    if not (spec.inputs or spec.outputs):
        return spec, None, values
    from gpucloud.run.data_grants import check

    try:
        return spec, check(spec), values
    except UserError as exc:
        warn(f"a relaunch gets no data grants: {exc.message}")
        return spec, None, values
