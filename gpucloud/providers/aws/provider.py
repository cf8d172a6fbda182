"""AwsProvider: the Provider protocol on EC2 + S3, composed from the modules of this package
(docs/INTERNALS.md, "Providers"; the AWS facts it relies on are in docs/PROVIDERS.md).

What every run gets: its own security group with no inbound rule (`ssh: true` opens port 22 to the
caller's address only, with a key pair stored 0600 under GPUCLOUD_HOME; a multi-node run adds one
rule in and out whose peer is the group itself), for several nodes a cluster placement group and,
on a type with EFA, one EFA interface per EFA network card plus an Elastic IP per node (efa.py),
and the instances of one RunInstances call (launch.py), then, best effort, an EventBridge Scheduler
schedule that terminates them after the run's expiry (deadline.py, the cloud-side deadline layer).
Everything carries the tags `gpucloud-run`, `gpucloud-expires` and `Name`; provision returns a
RunHandle listing what it created, which teardown and node_states work from. boto3 is imported
lazily (`gpucloud --help` stays fast).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucloud.contract.provider import (
    DEFAULT_MASTER_PORT,
    TAG_RUN,
    Capabilities,
    FatalProvisionError,
    LaunchRequest,
    Provider,
    RunHandle,
    ThrottledError,
)
from gpucloud.contract.provider import (
    fit_user_data as fit_to_limit,
)
from gpucloud.contract.tags import GcIncomplete
from gpucloud.providers.aws.access import classify_access, permission_denied
from gpucloud.providers.aws.credentials import credentials_warning, warn_once
from gpucloud.providers.aws.deadline import arm as arm_deadline
from gpucloud.providers.aws.deadline import collapse_skips
from gpucloud.providers.aws.efa import EfaLayout, efa_layout
from gpucloud.providers.aws.errors import classify
from gpucloud.providers.aws.identity import create_identity
from gpucloud.providers.aws.images import resolve_image, zones
from gpucloud.providers.aws.launch import LaunchPlan, launch
from gpucloud.providers.aws.network import CLOUD, intra_run_rule, placement_group, security_group, ssh_access
from gpucloud.providers.aws.reaper import instance_states
from gpucloud.providers.aws.session import AwsClients, shared_channel
from gpucloud.providers.aws.teardown import attempt_instances, gc_region, gc_roles, not_checked, teardown_handle

if TYPE_CHECKING:
    from gpucloud.contract.provider import Candidate, Image, Journal, PlanRequest
    from gpucloud.contract.session import SessionAsk, SessionPlan
    from gpucloud.providers.aws.channel import S3Channel

EC2_STATES = {
    "pending": "pending",
    "running": "running",
    "shutting-down": "stopping",
    "stopping": "stopping",
    "stopped": "stopping",
    "terminated": "gone",
}


def _default_warn(message: str) -> None:
    from gpucloud.prose import to_stderr

    to_stderr(f"warning: {message}")


class AwsProvider(AwsClients, Provider):
    """The Provider protocol on EC2 + S3."""

    name = CLOUD
    capabilities = Capabilities(
        poll_interval=5.0,
        shared_user_data=True,  # N nodes from one RunInstances: one script, rank from the launch index
        user_data_limit=16 * 1024,
        user_data_encoding="raw",  # docs/PROVIDERS.md, "User data"
        self_termination="shutdown",  # InstanceInitiatedShutdownBehavior=terminate
        spot=True,
        multi_node=True,
        preemption_notice="aws-imds-spot",
        preemption_grace=60.0,  # of the 2-minute notice: the rest is for the checkpoint upload
        console_hint=(
            "its boot output: `aws ec2 get-console-output --region {region} --latest --output text "
            "--instance-id <id>` (ids: `aws ec2 describe-instances --region {region} "
            f"--filters Name=tag:{TAG_RUN},Values={{run_id}}`)"
        ),
    )
    GC_WORKERS = 16

    def __init__(
        self,
        *,
        session: Any = None,
        public_ip: Callable[[], str] | None = None,
        warn: Callable[[str], None] | None = None,
        sleep: Callable[[float], None] | None = None,
        retry_attempts: int | None = None,
        retry_base_s: float | None = None,
        poll_s: float | None = None,
        keys_dir: Path | None = None,
    ) -> None:
        super().__init__(
            session=session, sleep=sleep, retry_attempts=retry_attempts, retry_base_s=retry_base_s, poll_s=poll_s
        )
        self._public_ip = public_ip
        self._warn = warn or _default_warn
        self._keys_dir = keys_dir
        self._images: dict[tuple[str, str], tuple[str, str]] = {}
        self._warned: set[str] = set()

    def channel(self, region: str) -> S3Channel:
        """The region's S3 channel, shared per session so the bucket is checked once per process."""
        from gpucloud.providers.aws.channel import S3Channel

        return shared_channel(self.session, region, lambda: S3Channel(self.session, region))

    @property
    def keys_dir(self) -> Path:
        if self._keys_dir is None:
            from gpucloud.state.runs_db import home_dir

            self._keys_dir = home_dir() / "keys"
        return self._keys_dir

    def key_path(self, run_id: str, region: str, attempt: int) -> Path:
        return self.keys_dir / f"gpucloud-{run_id}-{region}-{attempt}.pem"

    def resolve_image(
        self,
        region: str,
        ubuntu_version: str,
        image: str = "auto",
        chosen: Image | None = None,
        *,
        cpu_arch: str = "x86_64",
        warn: Callable[[str], None] | None = None,
    ) -> tuple[str, str]:
        """(AMI id, root device name) for the job's `image:`, else the plan's image (`chosen`),
        else the stack's Ubuntu of the instance's CPU architecture."""
        return resolve_image(self, self._images, region, ubuntu_version, image, chosen, cpu_arch=cpu_arch, warn=warn)

    def master_port(self) -> int:
        return DEFAULT_MASTER_PORT

    def plan_candidates(self, job: PlanRequest) -> list[Candidate]:
        """None of its own: a priced cloud's candidates come from the catalog (planner.py)."""
        return []

    # ---- provision ----------------------------------------------------------------------------
    def _check_credentials(self, run_id: str, deadline: datetime, journal: Journal | None) -> None:
        warn_once(self._warned, run_id, credentials_warning(self.session, deadline), self._warn, journal, run_id)

    def session_path(self, handle: RunHandle, rank: int, ask: SessionAsk) -> SessionPlan:
        """ssh to the node's public address with the run's key, through its rule for the caller's /32."""
        from gpucloud.providers.aws.ssh_session import aws_session

        return aws_session(self, handle, rank, ask)

    def provision(self, req: LaunchRequest, journal: Journal) -> RunHandle:
        """Create the attempt's security group (key pair; placement group for several nodes) and
        instances. On failure, delete what this attempt created and raise a ProvisionError."""
        deadline = req.expires_at if req.expires_at.tzinfo else req.expires_at.replace(tzinfo=UTC)
        self._check_credentials(req.run_id, deadline, journal)
        nodes = max(1, req.num_nodes, len(req.user_data))
        if len(set(req.user_data)) > 1:
            raise ValueError(
                f"AwsProvider launches the {nodes} nodes of a run in one call and needs one "
                "user-data for all (render with node_rank=None)"
            )
        payload = fit_user_data(req.user_data[0]) if req.user_data else b""  # too big: fails before any create
        handle = RunHandle(run_id=req.run_id, cloud=CLOUD, region=req.region, attempt=req.attempt)
        what = "finding the image"
        try:
            ami, root = self.resolve_image(
                req.region,
                req.ubuntu,
                req.image_ref,
                req.image,
                cpu_arch=req.cpu_arch,
                warn=lambda m: warn_once(self._warned, f"image:{req.run_id}:{m}", m, self._warn, journal, req.run_id),
            )
            what = "finding the default VPC and zones"
            vpc_id, zone_list = zones(self, req.region, req.instance_type)
            what = "creating the security group"
            sg_id = security_group(self, req, journal, handle, vpc_id)
            pg = key = None
            efa = EfaLayout()
            if nodes > 1:
                what = "reading the instance type's EFA network cards"
                efa = efa_layout(self, req.region, req.instance_type)
                what = "letting the run's nodes reach each other"
                intra_run_rule(self, req, req.region, sg_id)
                what = "creating the placement group"
                pg = placement_group(self, req, journal, handle)
            if req.ssh:
                what = "creating the SSH key pair"
                key = ssh_access(
                    self,
                    req,
                    journal,
                    handle,
                    sg_id,
                    self.key_path(req.run_id, req.region, req.attempt),
                    self._public_ip,
                )
            what = "creating the node's role and instance profile"
            profile = create_identity(self, req, journal, handle, self.channel(req.region).bucket)
            what = "launching instances"
            plan = LaunchPlan(ami, root, sg_id, payload, nodes, pg, key, efa, profile)
            launch(self, req, journal, handle, plan, zone_list)
            arm_deadline(
                self, req, journal, handle, deadline, lambda: self.channel(req.region).account, self._warn
            )  # never raises
        except Exception as exc:  # Ctrl-C is left to the lifecycle's teardown from the journal
            if any(r.cloud == CLOUD and r.region == req.region for r in journal.resources(req.run_id)):
                self._cleanup_attempt(handle, journal)  # else the journal says nothing was created here
            raise self._provision_error(exc, req, what) from None
        return handle

    @staticmethod
    def _provision_error(exc: BaseException, req: LaunchRequest, what: str) -> BaseException:
        """The error provision raises for `exc`: a ProvisionError kind, or `exc` itself."""
        from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
        from botocore.exceptions import ConnectionError as BotoConnectionError

        access = classify_access(exc, what=what) or permission_denied(exc, service="ec2", what=what)
        if access is not None:  # credentials / endpoint / a missing permission: skip AWS, not a capacity problem
            return access
        if isinstance(exc, ClientError):
            return classify(
                exc,
                region=req.region,
                instance_type=req.instance_type,
                spot=req.spot,
                what=what,
                tries=getattr(exc, "gpucloud_tries", 1),
            )
        if isinstance(exc, (BotoConnectionError, HTTPClientError)):
            return ThrottledError(
                f"{req.region}/{req.instance_type}: could not reach AWS while {what}: {exc}", code=type(exc).__name__
            )
        if isinstance(exc, BotoCoreError):
            return FatalProvisionError(
                f"{req.region}/{req.instance_type}: {what} failed: {exc}",
                code=type(exc).__name__,
                hint="Check the AWS credentials (`aws sts get-caller-identity`).",
            )
        return exc

    def _cleanup_attempt(self, handle: RunHandle, journal: Journal) -> None:
        """Best effort, without waiting for termination: what is left keeps its tags and the
        run's teardown (or gc) deletes it."""
        try:
            teardown_handle(self, handle, journal, self.keys_dir, wait=False)
        except Exception:  # noqa: BLE001 - keep the original error; teardown/gc finish the job
            pass

    # ---- state ----------------------------------------------------------------------------------
    def node_states(self, handle: RunHandle) -> list[str]:
        """Per node of the handle, in rank order: "gone" once EC2 no longer lists it or it is terminated.
        A handle without nodes (partial) has its attempt's instances, found by tag; a partial
        handle whose attempt has none (its follower died before RunInstances) is gone."""
        ids = handle.nodes or attempt_instances(self, handle.run_id, handle.region, handle.attempt)
        if not ids:
            return [] if handle.complete else ["gone"]
        states = instance_states(self, handle.region, ids)
        return [EC2_STATES.get(states.get(i, "terminated"), "gone") for i in ids]

    def console_hint(self, handle: RunHandle, rank: int) -> str:
        """Where to look when a machine died without a final status."""
        if rank < len(handle.nodes):
            return (
                f"its boot output: `aws ec2 get-console-output --region {handle.region} --latest --output text "
                f"--instance-id {handle.nodes[rank]}`"
            )
        return self.capabilities.console_hint.format(run_id=handle.run_id, rank=rank, region=handle.region)

    # ---- teardown / gc ------------------------------------------------------------------------
    def teardown(self, handle: RunHandle, journal: Journal, *, wait: bool = True) -> None:
        """Terminate the handle's instances, wait, then delete the other kinds it lists (for a
        partial handle, also what the journal and the run's tags name). Idempotent."""
        teardown_handle(self, handle, journal, self.keys_dir, wait=wait)

    def regions(self) -> list[str]:
        from gpucloud.catalog import load_catalog

        return load_catalog().regions(CLOUD)

    def gc(self, now: datetime, *, dry_run: bool) -> list[str]:
        """Every region of the catalog, concurrently: find (and unless dry_run delete) every
        instance, security group, placement group, key pair and volume whose expiry tag passed,
        and every deadline schedule long past its time."""
        if now.tzinfo is None:
            now = now.replace(tzinfo=UTC)
        regions = self.regions()
        if not regions:
            return []
        roles = gc_roles(self, regions)  # IAM is global: listed once, not per region
        with ThreadPoolExecutor(max_workers=min(self.GC_WORKERS, len(regions))) as pool:
            results = list(pool.map(lambda r: gc_region(self, r, now, dry_run, roles[r]), regions))
        lines, failures = not_checked([line for lines in results for line in lines], len(regions))
        if failures:  # a call that failed: what it lists is unknown, the sweep is not "clean" (exit 75)
            raise GcIncomplete(collapse_skips(lines), failures)
        return collapse_skips(lines)


def fit_user_data(script: str) -> bytes:
    """The user-data bytes for RunInstances: as is within the limit, else gzip'd (cloud-init
    unpacks it); the contract's size rule raises a UserError naming the fix when even that is too big."""
    return fit_to_limit(script, AwsProvider.capabilities, "AWS")
