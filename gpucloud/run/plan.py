"""The plan a `gpucloud run` launches (lifecycle.run_job): the planner's candidates, less the clouds
whose credentials do not work, so that nobody is asked to launch what cannot start."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpucloud.errors import CloudAccessError, ConfigurationError, NoCandidateError
from gpucloud.prose import to_stderr

if TYPE_CHECKING:
    from gpucloud.plan.planner import Plan
    from gpucloud.spec.load import JobSpec


def launch_plan(
    spec: JobSpec,
    *,
    cloud: str | None,
    region: str | None,
    spot: bool | None,
    secrets: Mapping[str, str] | None = None,
) -> Plan:
    """The planner's plan for the job, checked before anything is shown or asked: no candidate is
    NoCandidateError, the clouds whose credentials do not work are dropped (usable_only). `secrets`
    let a `container:` login read the image's config, as `plan` does, so both choose the same stack."""
    from gpucloud.plan.planner import make_plan

    plan = make_plan(spec, cloud=cloud, region=region, spot=spot, secrets=secrets)
    if plan.candidates and all(c.assumed for c in plan.candidates):  # planned from the job file alone
        from gpucloud.contract.provider import Unreachable

        raise Unreachable(plan.candidates[0].assumed, hint="Make the host answer (`gpucloud hosts probe HOST`).")
    plan = replace(plan, candidates=[c for c in plan.candidates if not c.assumed])
    if not plan.candidates:
        raise NoCandidateError("the plan has no candidate to provision.", [])
    plan = usable_only(plan)
    from gpucloud.run.budgets import check_launch, worst_case

    check_launch(worst_case(plan.candidates[0].estimated_cost, spec.max_cost), spec.max_duration)  # before any create
    return plan


def usable_only(plan: Plan) -> Plan:
    """The plan without the clouds that cannot be used: first those with no credentials at all
    (the registry's cheap `configured()`: environment and files, no SDK, no network), then those
    whose credentials the cloud itself refuses or whose endpoint does not answer (the provider's
    `identity` check: one bounded call, every cloud at once). Each dropped cloud is named once with
    its fix; none left: ConfigurationError (78), which lists the reasons instead."""
    from gpucloud.contract import registry as providers

    clouds = list(dict.fromkeys(c.cloud for c in plan.candidates))
    reasons: dict[str, str] = {}
    for name in clouds:
        entry = providers.info(name)
        if not entry.configured():
            reasons[name] = f"{entry.title}: no credentials found. {entry.credentials_hint}"
    reasons.update(_refused_identities([name for name in clouds if name not in reasons]))
    if not reasons:
        return plan
    if len(reasons) == len(clouds):
        raise ConfigurationError(
            "no cloud is usable: none of the plan's clouds has working credentials:",
            list(reasons.values()),
            hint="`gpucloud check` shows what each cloud needs.",
        )
    for name, line in reasons.items():
        to_stderr(f"warning: skipping {name}: {line}")
    return replace(plan, candidates=[c for c in plan.candidates if c.cloud not in reasons])


def _refused_identities(clouds: list[str]) -> dict[str, str]:
    """cloud -> why its credentials do not work, for the clouds whose identity check failed."""
    from gpucloud.contract import registry as providers

    def ask(name: str) -> str | None:
        try:
            providers.verify_identity(name)
        except CloudAccessError as exc:
            return " ".join(exc.render().split("\n"))
        return None

    checked = [name for name in clouds if providers.info(name).identity]
    if not checked:
        return {}
    from concurrent.futures import ThreadPoolExecutor  # lazy: `plan` imports this module for looked_up

    with ThreadPoolExecutor(max_workers=len(checked), thread_name_prefix="identity") as pool:
        answers = dict(zip(checked, pool.map(ask, checked), strict=True))
    return {name: why for name, why in answers.items() if why is not None}


def looked_up(job: JobSpec, values: Mapping[str, str], *, explore: bool = False) -> tuple[Any, Any]:
    """What `plan` and `run` look up from here before anything is launched: the job's inputs/outputs
    (data_grants.py) and its container image's pull login (pull_login.py); None where none.
    `explore` (`plan`): the sources that cannot be checked from here are listed, not refused."""
    data = registry = None
    if job.inputs or job.outputs:
        from gpucloud.run.data_grants import check

        data = check(job, explore=explore)
    if job.container is not None:  # an ECR image that is not there fails here, as a missing bucket does
        from gpucloud.run.pull_login import pull_logins

        registry = pull_logins(job, values)
    return data, registry


def explore(
    job: JobSpec, secrets: Sequence[str], secret_files: Sequence[str], env: Sequence[str], *, strict: bool
) -> tuple[JobSpec, Any, Any, list[str]]:
    """`plan`'s look-ups: the job with its secrets resolved, their values, its data (None where none)
    and the warnings for what could not be checked here (`unchecked`)."""
    from gpucloud.spec.secrets import resolve

    job, values = resolve(job, secrets=secrets, secret_files=secret_files, env=env, missing_ok=True)
    data, _ = looked_up(job, values, explore=True)
    return job, values, data, unchecked(values, data, strict=strict)


def unchecked(values: Any, data: Any, *, strict: bool) -> list[str]:
    """`plan`'s warnings for what it could not check without credentials or secret values, one line
    each naming the field; `run` refuses each before anything is created. `strict` (`plan --strict`,
    for CI): each is an error instead (exit 2)."""
    lines = [
        f"secrets: {name} has no value here; `run` refuses to start without it (export {name}, or pass "
        f"--secret {name}=VALUE or --secret-file PATH)."
        for name in getattr(values, "missing", ())
    ]
    lines.extend(data.unchecked if data is not None else ())
    if strict and lines:
        from gpucloud.errors import UserError, render_items

        raise UserError(
            render_items(f"plan --strict: {len(lines)} part(s) of the job could not be checked here:", lines, None),
            hint="Give the secrets their values and the buckets' credentials, as `run` will need them; "
            "without --strict these are warnings.",
        )
    return lines


def plan_document(plan: Any, upload: Any, data: Any) -> dict[str, Any]:
    """`plan --json`: the plan, its upload and data checks, and with credentials each candidate's
    GPU quota (`quota`, run/quota_gate.py; imported only then)."""
    from gpucloud.run.quota_gate import plan_quotas

    quota = plan_quotas(plan.candidates)
    return {
        **plan.as_json(),
        "upload": upload.as_json(),
        **({"data": data.as_json()} if data else {}),
        **({"quota": quota} if quota else {}),
    }
