"""Failover: try the plan's candidates in order until one provisions (docs/INTERNALS.md, Lifecycle).

Each try is an attempt in the state store, recorded before the provider is called; the handle
provision returns is stored with it, and a failed attempt ends with the reason. The error kind
decides what is skipped next: capacity/throttle/price/candidate/image -> the next candidate, quota ->
the rest of that cloud+region, fatal -> the rest of that cloud. A cloud that cannot be used at all (no or
refused credentials, an endpoint that does not answer: CloudAccessError) is skipped once with one
line saying why; when that is all that happened, the run is a configuration error (exit 78).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from gpucloud.contract import registry as providers
from gpucloud.contract.provider import (
    CAPACITY_KINDS,
    TAG_EXPIRES,
    TAG_RUN,
    Provider,
    ProvisionError,
    RunHandle,
    expiry_tag,
)
from gpucloud.errors import CloudAccessError, ConfigurationError, GpucloudError, NoCandidateError, UserError
from gpucloud.plan.requests import launch_request
from gpucloud.run import budget
from gpucloud.state.runs_db import Journal, Store

if TYPE_CHECKING:
    from gpucloud.channel.run_objects import Channel
    from gpucloud.contract.provider import Candidate
    from gpucloud.plan.planner import Plan
    from gpucloud.spec.load import JobSpec
    from gpucloud.ui.progress import Progress

EXPIRY_MARGIN = timedelta(minutes=30)  # TAG_EXPIRES = deadline + margin (gc may sweep after it)


@dataclass
class Launch:
    """The attempt that provisioned: what following, collecting and teardown need."""

    provider: Provider
    candidate: Candidate
    channel: Channel
    handle: RunHandle
    deadline: float  # epoch seconds
    plan_index: int = 0  # the candidate's place in the plan (a relaunch starts after it)
    attempt: int = 0  # the attempt's index in the state store
    quota_skipped: list[str] = field(default_factory=list)  # "where: quota: why", skipped before it

    def skipped(self) -> list[str]:
        """The run summary's lines for the candidates skipped for quota (what to raise next time)."""
        return [f"skipped before launch: {q}" for q in self.quota_skipped]


@dataclass
class Failover:
    """The provision loop of one run."""

    spec: JobSpec
    plan: Plan
    run_id: str
    store: Store
    journal: Journal
    progress: Progress
    vm_dir: str | None = None  # the bootstrap's work folder when not the provider's (image builders)
    failures: list[str] = field(default_factory=list)  # "where: why", one per failed attempt
    order: list[int] | None = None  # plan indices to try, in order (a relaunch); None: the whole plan
    # A relaunch: (channel, cloud, region) holding the run's code and checkpoints, copied from it
    # into another region's channel; and the nodes' objects of the last attempt are reset first.
    source: tuple[Channel, str, str] | None = None
    access: list[str] = field(default_factory=list)  # one line per cloud skipped (credentials, endpoint)
    kinds: set[str] = field(default_factory=set)  # the error kinds of the failed attempts
    _skip_clouds: set[str] = field(default_factory=set)
    _skip_regions: set[tuple[str, str]] = field(default_factory=set)
    quota_skips: dict[int, str] | None = None  # plan index -> why its quota cannot hold it (quota_gate.py)
    _quota_skipped: list[str] = field(default_factory=list)  # "where: quota: why", for the run's summary
    _budget_refused: GpucloudError | None = None  # the last candidate a budget refused (run raises it)
    _uploaded: set[int] = field(default_factory=set)  # channels that already have the code
    _copied: set[tuple[str, str]] = field(default_factory=set)

    def run(self, tarball: Path | None) -> Launch:
        """Provision the first candidate that works. Raise ConfigurationError (exit 78) when every
        attempt failed because its cloud cannot be used at all, else NoCandidateError.
        `tarball`: the packed workdir to upload (None on a relaunch: the code is in `source`)."""
        order = self.order if self.order is not None else range(len(self.plan.candidates))
        if self.quota_skips is None:
            self.quota_skips = self._read_quotas(list(order))
        for plan_index in order:
            cand = self.plan.candidates[plan_index]
            if cand.cloud in self._skip_clouds or (cand.cloud, cand.region) in self._skip_regions:
                continue
            if plan_index in self.quota_skips:
                self._skip_for_quota(cand, self.quota_skips[plan_index])
                continue
            if (refused := self._over_budget(cand)) is not None:
                self._skip_for_budget(cand, refused)
                continue
            index, where = self._record_attempt(cand)
            provider: Provider | None = None
            try:
                provider = providers.get_provider(cand.cloud)
                launch = self._attempt(provider, cand, index, tarball)
                launch.plan_index = plan_index
                launch.quota_skipped = list(self._quota_skipped)
            except CloudAccessError as exc:  # no credentials, dead endpoint: skip this cloud once
                self._skip_cloud(provider, cand, index, where, exc)
                continue
            except ProvisionError as exc:
                self.kinds.add(exc.kind)
                self._failed(provider, cand, index, where, self._reason(exc), self._skipped(exc, cand))
                continue
            except GpucloudError as exc:
                if isinstance(exc, UserError) or provider is None:
                    raise
                self._skip_clouds.add(cand.cloud)  # any other refusal of the cloud: try the next one
                self._failed(provider, cand, index, where, exc.message, "")
                continue
            self.store.event(self.run_id, "attempt", f"{where}: provisioned")
            return launch
        raise self._none_provisioned()

    def _record_attempt(self, cand: Candidate) -> tuple[int, str]:
        """The next attempt's index, recorded on the run and as an attempt row before anything is
        created, and where it goes (cloud/region/type) for the progress line and the events."""
        index = self.store.next_attempt_idx(self.run_id)
        where = f"{cand.cloud}/{cand.region}/{cand.instance_type}" + (" (spot)" if cand.spot else "")
        self.progress.info(f"attempt {index + 1}: {where}")
        self.store.update_run(
            self.run_id,
            cloud=cand.cloud,
            region=cand.region,
            instance_type=cand.instance_type,
            price_per_hour=cand.price_per_hour,
            status="provisioning",
            phase="provision",
            started_at=time.time(),
        )
        self.store.start_attempt(
            self.run_id,
            index,
            cloud=cand.cloud,
            region=cand.region,
            instance_type=cand.instance_type,
            spot=cand.spot,
            price_per_hour=cand.price_per_hour,
            num_nodes=cand.num_nodes,
        )
        return index, where

    def _none_provisioned(self) -> GpucloudError:
        """Every attempt failed: BudgetError (77) when a candidate was refused for a budget,
        ConfigurationError when no cloud was usable at all, else NoCandidateError."""
        if self._budget_refused is not None:
            from gpucloud.run.budgets import BudgetError

            before = [f for f in self.failures if ": budget: " not in f]
            said = f" Tried before it: {'; '.join(before)}." if before else ""
            return BudgetError(self._budget_refused.message + said, hint=self._budget_refused.hint)
        if self.access and len(self.access) == len(self.failures):
            return ConfigurationError(
                "no cloud is usable: every candidate's cloud lacks working credentials, "
                "a permission they need, or an endpoint that answers (each one's reason "
                "and fix are above).",
                self.access,
                hint="`gpucloud check` shows what each cloud needs.",
                shown=True,
            )
        capacity = bool(self.kinds & CAPACITY_KINDS)
        return NoCandidateError(
            f"no candidate could be provisioned ({len(self.failures)} attempt(s)):",
            self.failures,
            hint="Try other regions or GPU types (`gpucloud plan` lists them)"
            + (", or ask for more quota." if "quota" in self.kinds else "; each attempt's reason is above."),
            capacity=capacity,
        )

    def _read_quotas(self, order: list[int]) -> dict[int, str]:
        """The candidates whose GPU quota, read before any create, cannot hold them."""
        from gpucloud.run.quota_gate import read

        gate = read(self.plan.candidates, order)
        self.store.event(self.run_id, "quota", f"{len(gate.verdicts)} GPU quota(s) read in {gate.seconds:.2f} s")
        return gate.skips

    def _skip_for_quota(self, cand: Candidate, why: str) -> None:
        """A candidate skipped before its launch: one line naming the quota and how to raise it."""
        where = f"{cand.cloud}/{cand.region}/{cand.instance_type}" + (" (spot)" if cand.spot else "")
        self.kinds.add("quota")
        self.failures.append(f"{where}: quota: {why}")
        self._quota_skipped.append(self.failures[-1])
        self.store.event(self.run_id, "attempt", self.failures[-1])
        self.progress.warn(f"skipping {where} before launch: {why}")

    def _over_budget(self, cand: Candidate) -> GpucloudError | None:
        """A candidate the user's budgets cannot pay for (the plan checked only the first, so a
        failover to a dearer one, or a relaunch, is checked before its create), or one the run's
        max_cost has nothing left for."""
        from gpucloud.run.budgets import BudgetError, refusal, worst_case

        if cand.total_per_hour <= 0:
            return None
        spent = budget.spent(self.store, self.run_id) if self.spec.max_cost is not None else 0.0
        if self.spec.max_cost is not None and spent >= self.spec.max_cost:
            return BudgetError(
                f"Not launched again: the run's max_cost ${self.spec.max_cost:g} is spent (${spent:.4f})."
            )
        worst = worst_case(cand.estimated_cost, self.spec.max_cost, spent)
        return refusal(self.store, worst, self.spec.max_duration, f"{cand.cloud}/{cand.region}/{cand.instance_type}")

    def _skip_for_budget(self, cand: Candidate, refused: GpucloudError) -> None:
        """A candidate refused before its launch for a budget: named, and the next one tried."""
        where = f"{cand.cloud}/{cand.region}/{cand.instance_type}" + (" (spot)" if cand.spot else "")
        self.kinds.add("budget")
        self._budget_refused = refused
        self.failures.append(f"{where}: budget: {refused.message}")
        self.store.event(self.run_id, "budget", self.failures[-1])
        self.progress.warn(f"skipping {where} before launch: {refused.message}")

    @staticmethod
    def _reason(exc: ProvisionError) -> str:
        return f"{exc.kind}: {exc.message}" + (f" (quota {exc.quota_code})" if exc.quota_code else "")

    def _skipped(self, exc: ProvisionError, cand: Candidate) -> str:
        """What the error kind rules out from now on (recorded in the skip sets), as words."""
        if exc.kind == "quota":
            self._skip_regions.add((cand.cloud, cand.region))
            return f"the rest of {cand.cloud}/{cand.region} (quota{' ' + exc.quota_code if exc.quota_code else ''})"
        if exc.kind == "fatal":
            self._skip_clouds.add(cand.cloud)
            return f"the rest of {cand.cloud}"
        return ""

    def _skip_cloud(
        self, provider: Provider | None, cand: Candidate, index: int, where: str, exc: CloudAccessError
    ) -> None:
        """A cloud that cannot be used: one line saying why and the fix; its other candidates are
        skipped and failover goes on with the other clouds."""
        self._skip_clouds.add(cand.cloud)
        line = exc.message + (f" {exc.hint}" if exc.hint else "")
        self.access.append(line)
        self._failed(
            provider, cand, index, where, f"{exc.kind}: {exc.message}", f"the rest of {cand.cloud}", quiet=line
        )

    def _attempt(self, provider: Provider, cand: Candidate, index: int, tarball: Path | None) -> Launch:
        """One attempt: code upload, agent and channel URLs, the shim per node, then provision."""
        from gpucloud.vm.user_data import prepare_nodes

        spec, caps = self.spec, provider.capabilities
        if self.vm_dir:
            caps = replace(caps, vm_dir=self.vm_dir)
        channel = provider.channel(cand.region)
        if tarball is not None and id(channel) not in self._uploaded:
            channel.upload_code(self.run_id, tarball)
            self._uploaded.add(id(channel))
        if self.source is not None and (cand.cloud, cand.region) not in self._copied:
            src, cloud, region = self.source
            if (cloud, region) != (cand.cloud, cand.region):
                copied = src.copy_run_to(self.run_id, channel)
                self.progress.info(f"code and checkpoint copied to {cand.cloud}/{cand.region} ({copied} bytes)")
            self._copied.add((cand.cloud, cand.region))
        if self.failures or self.source is not None:
            channel.reset_nodes(self.run_id, spec.num_nodes)
        # max_cost ends the attempt where max_duration would: every deadline layer holds the cap
        seconds, why = budget.attempt_limit(
            self.store, self.run_id, spec.max_duration, spec.max_cost, cand.total_per_hour
        )
        if why:
            spec = spec.model_copy(update={"max_duration": seconds})
        deadline = datetime.fromtimestamp(math.ceil(time.time()) + seconds, UTC)
        user_data = prepare_nodes(
            spec,
            self.plan.stack_for(cand),
            cand,
            node=self.plan.node_for(cand),
            caps=caps,
            channel=channel,
            run_id=self.run_id,
            deadline=deadline,
            master_port=provider.master_port(),
            deadline_why=why,
        )
        expires = deadline + EXPIRY_MARGIN
        req = launch_request(
            spec,
            self.plan.stack_for(cand),
            cand,
            run_id=self.run_id,
            user_data=user_data,
            expires_at=expires,
            attempt=index,
            tags={TAG_RUN: self.run_id, TAG_EXPIRES: expiry_tag(expires), "Name": f"gpucloud-{self.run_id}"},
        )
        self.store.update_run(self.run_id, deadline=deadline.timestamp())
        handle = provider.provision(req, self.journal)
        self.store.set_attempt_handle(self.run_id, index, handle.to_json(), zone=handle.zone)
        return Launch(
            provider=provider,
            candidate=cand,
            channel=channel,
            handle=handle,
            deadline=deadline.timestamp(),
            attempt=index,
        )

    def _failed(
        self,
        provider: Provider | None,
        cand: Candidate,
        index: int,
        where: str,
        reason: str,
        skipped: str,
        *,
        quiet: str = "",
    ) -> None:
        """Record why the attempt failed, end it, and clean up whatever it created. `quiet`: one
        line shown instead of the failure and the skip (a cloud that cannot be used)."""
        self.failures.append(f"{where}: {reason}")
        self.store.event(self.run_id, "attempt", self.failures[-1])
        self.store.end_attempt(self.run_id, index, reason)
        if quiet:
            self.progress.warn(f"skipping {cand.cloud}: {quiet}")
        else:
            self.progress.warn(f"{where} failed: {reason}")
            if skipped:
                self.progress.info(f"skipping {skipped}")
        if provider is None:
            return
        from gpucloud.run.teardown import run_handles

        run = self.store.get_run(self.run_id)
        handles = (
            [h for h in run_handles(self.store, run) if (h.cloud, h.region) == (cand.cloud, cand.region)] if run else []
        )
        if not handles and not any(
            (r.cloud, r.region) == (cand.cloud, cand.region) for r in self.journal.resources(self.run_id)
        ):
            return  # the journal says nothing was created there: nothing to clean up
        # Begin the deletes and move on: what is not gone yet stays in the journal, and the run's
        # final teardown (or `down`, `gc`) waits for it.
        for handle in handles or [RunHandle(self.run_id, cand.cloud, cand.region, attempt=index, complete=False)]:
            try:
                provider.teardown(handle, self.journal, wait=False)
            except Exception as exc:
                self.progress.warn(
                    f"cleanup after the failed attempt on {cand.cloud}/{cand.region}: {exc} "
                    f"(the final teardown retries it)"
                )
