"""The job, told to a provider: the contract's narrow requests built from the job file, and the
refusal of what a provider's Capabilities rule out. Providers never read the job file; this module
is the one place that turns it into the values they get (gpucloud/contract/provider.py)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from gpucloud.contract.provider import Candidate, LaunchRequest, PlanRequest

if TYPE_CHECKING:
    from gpucloud.plan.container import ImageCuda
    from gpucloud.plan.stack_data import Stack
    from gpucloud.spec.load import JobSpec


def where(spec: JobSpec) -> str:
    """The job file as a message prefix ("job.yaml: "), or nothing for a job without one."""
    return f"{spec.source}: " if spec.source else ""


def plan_request(spec: JobSpec, image: ImageCuda | None = None) -> PlanRequest:
    """The job's asks as values, for a provider that names its own candidates (this machine, hosts).
    A `container:` job (`image`, its CUDA) asks a host only for a driver that runs the image."""
    from gpucloud.plan.stacks import resolve_stack

    gpu, pins = spec.resources.gpu, spec.stack
    if image is not None:
        from gpucloud.plan.container_stack import container_stack

        return PlanRequest(
            gpu=(gpu.model or None) if gpu else None,
            gpu_count=gpu.count if gpu else 0,
            num_nodes=spec.num_nodes,
            hosts=tuple(spec.resources.hosts or ()),
            source=str(spec.source) if spec.source else None,
            stack_for=lambda model: container_stack(model, pins, image),
            install=pins.install,
            needs_cuda=True,  # the host's driver must reach the image's CUDA floor (the stack's min driver)
            scheduler=scheduler_settings(spec),
            max_duration_s=spec.max_duration,
            min_vcpus=spec.resources.min_vcpus or 0,
            min_memory_gib=spec.resources.min_memory_gib or 0.0,
        )
    return PlanRequest(
        gpu=(gpu.model or None) if gpu else None,  # "": a memory-only request names no model
        gpu_count=gpu.count if gpu else 0,
        num_nodes=spec.num_nodes,
        hosts=tuple(spec.resources.hosts or ()),
        source=str(spec.source) if spec.source else None,
        stack_for=lambda model: resolve_stack(model, pins),
        install=pins.install,
        needs_cuda=pins.cuda != "auto" or pins.framework != "none",
        framework=pins.framework,
        scheduler=scheduler_settings(spec),
        max_duration_s=spec.max_duration,
        min_vcpus=spec.resources.min_vcpus or 0,
        min_memory_gib=spec.resources.min_memory_gib or 0.0,
    )


def scheduler_settings(spec: JobSpec) -> dict[str, str]:
    """The batch scheduler fields the job sets (resources.cluster, partition, account, qos, constraint)."""
    res = spec.resources
    fields = {k: getattr(res, k) for k in ("cluster", "partition", "account", "qos", "constraint")}
    return {k: v for k, v in fields.items() if v}


def launch_request(
    spec: JobSpec,
    stack: Stack,
    cand: Candidate,
    *,
    run_id: str,
    user_data: list[str],
    expires_at: datetime,
    attempt: int = 0,
    tags: dict[str, str] | None = None,
) -> LaunchRequest:
    """What the provider gets for one attempt: the candidate's machine and the job's few launch
    fields as values (the provider never reads the job file)."""
    from gpucloud.plan.images import cpu_arch_of

    res = spec.resources
    return LaunchRequest(
        run_id=run_id,
        job_name=spec.name,
        region=cand.region,
        instance_type=cand.instance_type,
        num_nodes=cand.num_nodes,
        user_data=user_data,
        expires_at=expires_at,
        gpu=cand.gpu,
        gpu_count=cand.gpu_count,
        cpu_arch=cpu_arch_of(cand),
        spot=cand.spot,
        max_price_per_hour=res.max_price_per_hour,
        disk_gb=res.disk_gb,
        image=cand.image,
        image_ref=spec.image,
        ubuntu=stack.ubuntu_version,
        ssh=bool(res.ssh or spec.ports),  # forwarded ports need a session: its key and caller-only rule
        install_stack=stack if spec.stack.install else None,
        needs_cuda=spec.stack.cuda != "auto" or spec.stack.framework != "none",
        framework="none" if spec.container else spec.stack.framework,
        attempt=attempt,
        tags=dict(tags or {}),
        scheduler=scheduler_settings(spec),
        max_duration_s=spec.max_duration,
        vcpus=cand.vcpus,
        memory_gib=cand.memory_gib,
    )


def refuse_what_providers_cannot_do(spec: JobSpec, clouds: list[str], spot: bool | None) -> None:
    """A job asking for what a provider declares it cannot do (its Capabilities) is refused here,
    before anything is planned, rather than quietly planned without it."""
    from gpucloud.contract import registry as providers
    from gpucloud.errors import UserError

    wants_spot = (spec.resources.spot if spot is None else spot) is True
    if not wants_spot and spec.num_nodes <= 1:
        return  # nothing to check: no provider module imported for an ordinary job
    able = {name: providers.capabilities(name) for name in clouds}
    no_spot = [n for n, caps in able.items() if wants_spot and not caps.spot]
    if no_spot:
        sellers = [n for n in providers.names() if providers.capabilities(n).spot]
        raise UserError(
            f"{where(spec)}resources.spot: {', '.join(no_spot)} cannot launch spot machines "
            f"({'; '.join(providers.info(n).title for n in no_spot)} runs on-demand only), "
            "and the job asks for spot: true.",
            hint=f"Set spot: false (or spot: auto, spot where it is sold), or use a cloud that sells spot: "
            f"{', '.join(sellers)}.",
        )
    single = [n for n, caps in able.items() if spec.num_nodes > 1 and not caps.multi_node]
    if single:
        raise UserError(
            f"{where(spec)}num_nodes: {', '.join(single)} runs one node per job, "
            f"and the job asks for {spec.num_nodes}.",
            hint="Set num_nodes: 1, or use a cloud that runs several nodes: "
            + ", ".join(n for n in providers.names() if providers.capabilities(n).multi_node)
            + ".",
        )
