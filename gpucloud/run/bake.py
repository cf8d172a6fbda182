"""`gpucloud image build SPEC|GPU`: bake a stack into a machine image.

The builder is a run like any other (gpucloud/run/lifecycle.py): recorded in the state store, its
resources journalled before they are created, torn down in `finally` whatever happens (Ctrl-C,
a failed stack stage, a crash of the snapshot call), and `down`/`gc` know it. Only the job differs:
its `run` is a marker that flushes the disk and waits, so that once the VM reports the `run`
stage, the stack (and, with --with-setup, the job's `setup`) is installed and the disk can be
snapshotted (AWS CreateImage; an Azure managed image), tagged with the stack hash
(gpucloud/plan/baked.py). Then the builder is torn down and the image is recorded locally, so
that `plan` and `run` pick it for every later job whose stack hashes the same.

The builder's bootstrap works in /tmp (BUILDER_DIR), which Ubuntu empties at boot
(systemd-tmpfiles, `D /tmp`): a VM booted from the image starts with no trace of the builder's run
folder (docs/STACKS.md, "Baked images").
"""

from __future__ import annotations

import tempfile
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from gpucloud.errors import Declined, GpucloudError, UserError
from gpucloud.run.lifecycle import RunInProgress
from gpucloud.run.log import LogMirror
from gpucloud.run.watch import observe, outcome
from gpucloud.vm.job_env import BUILDER_RUN

if TYPE_CHECKING:
    from gpucloud.contract.provider import BakedImage, Candidate, ImageStore
    from gpucloud.plan.planner import Plan
    from gpucloud.spec.load import JobSpec

BUILDER_DIR = "/tmp/gpucloud-builder"
BUILDER_MAX_DURATION_S = 3 * 3600  # a stack install takes 5-15 minutes; the snapshot a few more


def builder_spec(spec: JobSpec, *, with_setup: bool, empty_dir: str) -> JobSpec:
    """The builder's job: one node, the job's stack (and its setup and code when asked, else an
    empty folder as the code), a waiting marker as `run`."""
    update: dict[str, object] = {
        "name": f"image-{spec.name}"[:40].rstrip("-"),
        "num_nodes": 1,
        "run": BUILDER_RUN,
        "setup": spec.setup if with_setup else None,
        "artifacts": [],
        "max_duration": min(spec.max_duration, BUILDER_MAX_DURATION_S),
        "image": "auto",
    }
    if not with_setup:
        update["workdir"] = empty_dir
    return spec.model_copy(update=update)


def gpu_spec(gpu: str, framework: str | None, cloud: str | None) -> JobSpec:
    """A job file for `image build GPU`: that GPU, the default stack or `framework`."""
    import json

    from gpucloud.spec.load import parse_spec

    resources: dict[str, object] = {"gpu": f"{gpu}:1", **({"cloud": cloud} if cloud else {})}
    doc: dict[str, object] = {"name": "image", "resources": resources, "run": "true"}
    if framework:
        doc["stack"] = {"framework": framework}
    return parse_spec(json.dumps(doc), f"<image build {gpu}>")


def target_spec(target: str, *, framework: str | None, cloud: str | None) -> JobSpec:
    """SPEC (a job file) or GPU (a catalog name): which one the user meant."""
    from pathlib import Path

    from gpucloud.spec.load import load_spec

    if target.endswith((".yaml", ".yml")) or Path(target).is_file():
        return load_spec(target)
    return gpu_spec(target, framework, cloud)


def wanted_hash(plan: Plan, cand: Candidate, setup: str | None) -> str:
    """The stack hash an image built on `cand` gets (what a later run's plan looks for): over the
    install plan the plan made for that machine, not a second computation of it."""
    from gpucloud.plan.baked import stack_hash

    return stack_hash(plan.stack_for(cand), plan.node_for(cand), setup)


def build(
    target: str,
    *,
    cloud: str | None,
    region: str | None,
    with_setup: bool,
    framework: str | None,
    assume_yes: bool,
    json_out: bool = False,
) -> tuple[BakedImage, bool]:
    """Bake (or find) the image; (image, whether it was built now)."""
    spec = target_spec(target, framework=framework, cloud=cloud)
    with tempfile.TemporaryDirectory(prefix="gpucloud-builder-") as empty:
        return _build(
            builder_spec(spec, with_setup=with_setup, empty_dir=empty),
            cloud=cloud,
            region=region,
            assume_yes=assume_yes,
            json_out=json_out,
        )


def _build(
    job: JobSpec, *, cloud: str | None, region: str | None, assume_yes: bool, json_out: bool
) -> tuple[BakedImage, bool]:
    from gpucloud.contract import registry as providers
    from gpucloud.plan.baked import find_baked, remember
    from gpucloud.plan.planner import make_plan
    from gpucloud.ui import views

    plan = make_plan(job, cloud=cloud, region=region, spot=False, baked=False)
    bakeable = [c for c in plan.candidates if providers.info(c.cloud).image_store]
    if not bakeable:
        raise UserError(
            f"none of the planned clouds ({', '.join(sorted({c.cloud for c in plan.candidates}))}) can bake images.",
            hint=f"Use --cloud with one of: {', '.join(providers.with_image_store())}.",
        )
    first = bakeable[0]
    plan.candidates = [c for c in bakeable if c.cloud == first.cloud]  # one image store: one cloud
    store = providers.image_store(first.cloud)
    setup = job.setup
    existing = find_baked(store, first.region, wanted_hash(plan, first, setup))
    if existing is not None:
        remember(first.cloud, existing)
        return existing, False
    views.print_plan_summary(plan)
    if not assume_yes and not views.ask("Boot a builder and bake the image?"):
        raise Declined("no image built.")
    bake = _Bake(job, plan, store, setup, json_out=json_out, registry=_pull_logins(job))
    result = bake.execute()
    if bake.baked is None:
        raise GpucloudError(
            f"no image was made: the builder run {result.run_id} ended {result.status}.",
            hint=f"`gpucloud logs {result.run_id}` shows its bootstrap log.",
        )
    remember(bake.cloud, bake.baked)
    return bake.baked, True


def _pull_logins(job: JobSpec) -> object:
    """A container job's image is pulled into the builder's disk: its login as for a run (a
    `container.login` secret's value from this environment, or the ECR/ACR token the CLI asks for)."""
    if job.container is None:
        return None
    import os

    from gpucloud.run.pull_login import pull_logins

    login = job.container.login
    if login is not None and login.password_secret not in os.environ:
        raise UserError(
            f"container.login: the builder pulls {job.container.image} and needs {login.password_secret}, "
            "which is not set in this environment.",
            hint=f"export {login.password_secret}=... before `gpucloud image build`.",
        )
    values = {login.password_secret: os.environ[login.password_secret]} if login is not None else {}
    return pull_logins(job, values)


class _Bake(RunInProgress):
    """A builder run: follow until the `run` stage starts, snapshot, then the usual teardown."""

    vm_dir = BUILDER_DIR

    def __init__(
        self,
        spec: JobSpec,
        plan: Plan,
        store: ImageStore,
        setup: str | None,
        *,
        json_out: bool,
        registry: object = None,
    ) -> None:
        super().__init__(spec, plan, detach=False, json_out=json_out, wait_teardown=True, plan_s=0.0, registry=registry)
        self.image_store, self.setup = store, setup
        self.baked: BakedImage | None = None
        self.cloud = ""

    def _follow(self) -> tuple[str, int, str]:
        assert self.launch is not None
        launch = self.launch
        caps = launch.provider.capabilities
        self.mirror = LogMirror(self.home, self.run_id, 1)
        shown: dict[str, str] = {}
        booted_at = time.time()
        while True:
            obs = observe(launch.channel, self.run_id, 1)
            self._pump_logs()
            self._show_stages(obs.statuses, shown)
            if obs.all_final:  # the marker never ends by itself: the stack or setup failed
                status, code, message = outcome(obs.statuses)
                return "error", code or 70, f"the builder ended before its snapshot ({status}): {message}"
            stages = (obs.statuses[0] or {}).get("stages") or {}
            if isinstance(stages.get("run"), dict) and stages["run"].get("start") is not None:
                break
            now = time.time()
            if now > launch.deadline:
                return "deadline", 124, "the builder did not finish its stack stage before max_duration"
            if now - booted_at > caps.heartbeat_interval * 3:
                lost = self._lost([False])
                if lost is not None:
                    return lost
            time.sleep(caps.poll_interval)
        return self._snapshot()

    def _snapshot(self) -> tuple[str, int, str]:
        """CreateImage / managed image of the builder's disk, tagged with the stack hash."""
        from gpucloud.plan.baked import BakedImage, image_tags

        assert self.launch is not None
        cand, handle = self.launch.candidate, self.launch.handle
        wanted = wanted_hash(self.plan, cand, self.setup)
        tags = image_tags(self.plan.stack, wanted, with_setup=bool(self.setup))
        name = f"gpucloud-{wanted}"
        self.progress.phase("snapshot")
        t0 = time.monotonic()
        ref = self.image_store.create_image(cand.region, handle.nodes[0], name, tags)
        self.phases["snapshot"] = time.monotonic() - t0
        self.progress.phase_done("snapshot", self.phases["snapshot"], note=ref)
        self.cloud = cand.cloud
        self.baked = BakedImage(
            ref=ref,
            region=cand.region,
            name=name,
            stack_hash=wanted,
            tags=tags,
            created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        self.store.event(self.run_id, "image", f"baked {ref} ({wanted}) in {cand.region}")
        return "succeeded", 0, f"image {ref}"

    def _collect(self) -> None:
        """A builder has no artifacts."""
