"""The plan a `gpucloud run` launches (lifecycle.run_job): the planner's candidates, less the clouds
that have no credentials at all, so that nobody is asked to launch what cannot start."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from gpucloud.errors import ConfigurationError, NoCandidateError
from gpucloud.prose import to_stderr

if TYPE_CHECKING:
    from gpucloud.planner import Plan
    from gpucloud.spec import JobSpec


def launch_plan(spec: JobSpec, *, cloud: str | None, region: str | None, spot: bool | None) -> Plan:
    """The planner's plan for the job, checked before anything is shown or asked: no candidate is
    NoCandidateError, the clouds without credentials are dropped (configured_only)."""
    from gpucloud.planner import make_plan

    plan = make_plan(spec, cloud=cloud, region=region, spot=spot)
    if not plan.candidates:
        raise NoCandidateError("the plan has no candidate to provision.", [])
    return configured_only(plan)


def configured_only(plan: Plan) -> Plan:
    """The plan without the clouds that have no credentials at all (the registry's cheap
    `configured()`: environment and files, no SDK, no network), each named once with its fix, so
    that nobody is asked to launch what cannot start. None left: ConfigurationError (78)."""
    from gpucloud import providers

    clouds = list(dict.fromkeys(c.cloud for c in plan.candidates))
    missing = {name: providers.info(name) for name in clouds if not providers.info(name).configured()}
    if not missing:
        return plan
    reasons = {
        name: f"{entry.title}: no credentials found. {entry.credentials_hint}" for name, entry in missing.items()
    }
    if len(missing) == len(clouds):
        raise ConfigurationError(
            "no cloud is usable: none of the plan's clouds has credentials:",
            list(reasons.values()),
            hint="`gpucloud check` shows what each cloud needs.",
        )
    for name, line in reasons.items():
        to_stderr(f"warning: skipping {name}: {line}")
    return replace(plan, candidates=[c for c in plan.candidates if c.cloud not in missing])
