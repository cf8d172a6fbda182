"""AWS EC2: create a run's machines, watch them, and tear everything down (DESIGN.md section 7).

What every run gets, and why:
- a security group of its own with no inbound rule (the VM only pulls and pushes through presigned
  S3 URLs); `ssh: true` opens port 22 to the caller's public address only, with a key pair whose
  private half is stored 0600 under GPUCLOUD_HOME; a multi-node run adds one rule whose source is
  the group itself, so the run's own nodes (torchrun, NCCL) reach each other and nobody else does;
- multi-node: the N machines come from ONE RunInstances call (MinCount = MaxCount = N, all or
  nothing, one zone) into a cluster placement group created and deleted with the run; a capacity
  error moves the whole group to the next zone. Every node boots the same user-data and takes its
  rank from its launch index (IMDS `ami-launch-index`), which is also the rank order here;
- IMDSv2 required with hop limit 1 (no SSRF to the metadata service from a container), an encrypted
  gp3 root volume, and `InstanceInitiatedShutdownBehavior=terminate`, so the VM's own
  `shutdown -h now` at the end or at its deadline ends the bill even when the CLI is gone;
- the tags `gpucloud-run`, `gpucloud-expires` and `Name` on the instance, its volume, the security
  group and the key pair, so `down` and `gc` find everything without the local state store;
- a ClientToken per attempt and zone that stays the same across retries, so a retried
  RunInstances never starts a second, paid machine (or group).

Errors are classified by code ("contains", FACTS.md section 4) into the ProvisionError kinds that
drive failover. Throttling and AWS-side failures back off exponentially with jitter, bounded.
boto3 is imported lazily (`gpucloud --help` must stay fast); the standard boto3 chain supplies
credentials and honours `AWS_ENDPOINT_URL`.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucloud.errors import GpucloudError
from gpucloud.providers.base import (
    TAG_EXPIRES,
    TAG_RUN,
    CapacityError,
    FatalProvisionError,
    LaunchRequest,
    PriceError,
    ProvisionError,
    QuotaError,
    ThrottledError,
    ssh_source_cidr,
)

if TYPE_CHECKING:
    from gpucloud.channel_s3 import S3Channel
    from gpucloud.state import Journal

CLOUD = "aws"
TAG_ATTEMPT = "gpucloud-attempt"
TAG_NODE = "gpucloud-node"
CANONICAL_OWNER = "099720109477"

# Error codes (FACTS.md section 4), matched with "contains" because CloudTrail and some SDK paths
# prefix them with "Client." / "Server.".
CAPACITY_CODES = ("InsufficientInstanceCapacity", "InsufficientHostCapacity", "InsufficientCapacity",
                  "UnfulfillableCapacity")
QUOTA_CODES = ("VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded")
PRICE_CODES = ("SpotMaxPriceTooLow",)
THROTTLE_CODES = ("RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequestsException",
                  "SlowDown", "RequestThrottled")
# AWS-side failures worth retrying like throttling (5xx): a bad minute is not a bad region.
SERVER_CODES = ("InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable")
NOT_FOUND_CODES = ("NotFound", "NoSuchEntity")
PLACEMENT_STRATEGY = "cluster"  # low-latency, high-bandwidth network between the nodes of one zone
PG_GONE_STATES = ("deleting", "deleted")

# Service Quotas codes for the vCPU quotas RunInstances trips over, by instance family
# (on-demand P: L-417A185B, G/VT: L-DB2E81BA; spot P: L-7212CCBC, G/VT: L-3819A6DF [S];
# standard A/C/D/H/I/M/R/T/Z on-demand L-1216C47A, spot L-34B43A08 [K]).
_QUOTA_BY_FAMILY = {
    ("p", False): ("L-417A185B", "Running On-Demand P instances"),
    ("g", False): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("vt", False): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("p", True): ("L-7212CCBC", "All P Spot Instance Requests"),
    ("g", True): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("vt", True): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
}
_STANDARD_QUOTA = {False: ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
                   True: ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests")}

_UBUNTU_CODENAMES = {"18.04": "bionic", "20.04": "focal", "22.04": "jammy", "24.04": "noble"}


# ---- error classification ---------------------------------------------------------------------

def error_code(exc: BaseException) -> str:
    """The AWS error code of a botocore ClientError ("" for anything else)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", "") or "")
    return ""


def error_message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Message", "") or "")
    return str(exc)


def _has(code: str, names: Iterable[str]) -> bool:
    return any(name in code for name in names)


def error_kind(code: str) -> str:
    """capacity | quota | price | throttle | server | fatal, by "contains" on the code."""
    if _has(code, THROTTLE_CODES):
        return "throttle"
    if _has(code, QUOTA_CODES):
        return "quota"
    if _has(code, PRICE_CODES):
        return "price"
    # "Unsupported" (type not offered in that zone) is matched whole: "UnsupportedOperation" is fatal.
    if _has(code, CAPACITY_CODES) or code.rsplit(".", 1)[-1] == "Unsupported":
        return "capacity"
    if _has(code, SERVER_CODES):
        return "server"
    return "fatal"


def quota_for(instance_type: str, spot: bool) -> tuple[str, str]:
    """(quota code, quota name) of the vCPU quota that limits launching this instance type."""
    family = re.match(r"[a-z]+", instance_type.lower())
    letters = family.group(0) if family else ""
    for key in (letters, letters[:2], letters[:1]):
        hit = _QUOTA_BY_FAMILY.get((key, spot))
        if hit:
            return hit
    return _STANDARD_QUOTA[spot]


def classify(exc: BaseException, *, region: str, instance_type: str, spot: bool, what: str,
             tries: int = 1) -> ProvisionError:
    """The ProvisionError that tells the lifecycle what to do after this AWS error."""
    code = error_code(exc) or type(exc).__name__
    msg = error_message(exc)
    where = f"{region}/{instance_type}{' (spot)' if spot else ''}"
    kind = error_kind(code) if error_code(exc) else "server"
    if kind == "capacity":
        return CapacityError(f"{where}: no capacity ({code}) while {what}: {msg}", code=code)
    if kind == "quota":
        qcode, qname = quota_for(instance_type, spot)
        return QuotaError(
            f"{where}: quota reached ({code}: {msg}); the limiting quota is '{qname}' ({qcode}).",
            code=code, quota_code=qcode,
            hint=f"Request more in Service Quotas: aws service-quotas request-service-quota-increase "
                 f"--service-code ec2 --quota-code {qcode} --region {region} --desired-value <vCPUs>",
        )
    if kind == "price":
        return PriceError(f"{where}: the spot price is above the max price ({code}: {msg})", code=code,
                          hint="Raise resources.max_price_per_hour or use spot: auto.")
    if kind in ("throttle", "server"):
        return ThrottledError(f"{where}: AWS kept answering {code} while {what} (gave up after {tries} tries): {msg}",
                              code=code)
    return FatalProvisionError(f"{where}: AWS refused {what} ({code}: {msg})", code=code)


class AwsTeardownError(GpucloudError):
    """Some of a run's resources could not be deleted now; they keep their tags for `down`/`gc`."""

    exit_code = 70


# ---- small helpers ---------------------------------------------------------------------------------

def iso_utc(when: datetime) -> str:
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> datetime | None:
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (TypeError, ValueError):
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def client_token(run_id: str, attempt: int, zone: str, rank: int | None) -> str:
    """Same inputs, same token: every retry of one attempt in one zone reuses it (<= 64 chars)."""
    digest = hashlib.sha256(f"{run_id}|{attempt}|{zone}|{rank}".encode()).hexdigest()[:40]
    return f"gpucloud-{digest}"


def fit_user_data(script: str) -> bytes:
    """The user-data bytes for RunInstances: as is when within 16 KB, else gzip'd (cloud-init
    unpacks it). The renderer owns the format and raises a UserError naming the fix when even the
    gzip'd script is too big."""
    from gpucloud.render import fit_user_data as render_fit

    return render_fit(script, "aws")


def tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def tag_dict(tags: list[dict[str, str]] | None) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in tags or []}


_SHARED_LOCK = threading.RLock()
_SESSION: Any = None
_CLIENTS: dict[tuple[int, str, str], tuple[Any, Any]] = {}   # (id(session), service, region) -> (session, client)
_CHANNELS: dict[tuple[int, str], S3Channel] = {}


def shared_session() -> Any:
    """This process's default boto3 Session (standard credential chain, AWS_ENDPOINT_URL honoured)."""
    global _SESSION
    with _SHARED_LOCK:
        if _SESSION is None:
            import boto3

            _SESSION = boto3.Session()
        return _SESSION


def shared_client(session: Any, service: str, region: str) -> Any:
    key = (id(session), service, region)
    with _SHARED_LOCK:
        hit = _CLIENTS.get(key)
        if hit is not None and hit[0] is session:
            return hit[1]
        from gpucloud.providers.aws_access import client_config

        client = session.client(service, region_name=region, config=client_config(service))
        _CLIENTS[key] = (session, client)  # the session is kept alive, so its id is never reused
        return client


def reset_shared(*, channels_only: bool = False) -> None:
    """Forget the shared channels (their bucket check), and unless channels_only the session and
    clients too (new credentials or endpoint)."""
    global _SESSION
    with _SHARED_LOCK:
        _CHANNELS.clear()
        if not channels_only:
            _SESSION = None
            _CLIENTS.clear()


def _default_warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


@dataclass
class _Created:
    """What one provision attempt created, for cleanup when the attempt fails."""

    sg_id: str | None = None
    sg_res: int | None = None
    key_name: str | None = None
    key_res: int | None = None
    pg_name: str | None = None
    pg_res: int | None = None
    instance_ids: list[str] = field(default_factory=list)


class AwsProvider:
    """The Provider protocol on EC2 + S3 (docs/INTERNALS.md, "Providers")."""

    name = "aws"
    # N nodes come from one RunInstances call, so they boot one identical user-data and find their
    # rank from the launch index (docs/INTERNALS.md, "Multi-node").
    shared_user_data = True

    # Tunables (class attributes so a caller can shorten them for a fast fake cloud).
    poll_interval = 5.0       # how often the lifecycle reads status.json while following a run
    RETRY_ATTEMPTS = 6        # tries of one call under throttling / AWS-side errors
    RETRY_BASE_S = 0.5        # first backoff; doubles, with full jitter
    RETRY_CAP_S = 10.0        # longest single backoff
    POLL_S = 5.0              # instance-state polling while waiting for termination
    TERMINATE_TIMEOUT_S = 600.0
    SG_DELETE_TIMEOUT_S = 300.0  # DependencyViolation persists until the ENIs are gone
    PG_DELETE_TIMEOUT_S = 300.0  # InvalidPlacementGroup.InUse persists until the instances are gone
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
        self._session = session
        self._public_ip = public_ip
        self._warn = warn or _default_warn
        self._sleep = sleep or time.sleep
        self.retry_attempts = retry_attempts if retry_attempts is not None else self.RETRY_ATTEMPTS
        self.retry_base_s = retry_base_s if retry_base_s is not None else self.RETRY_BASE_S
        self.poll_s = poll_s if poll_s is not None else self.POLL_S
        self._keys_dir = keys_dir
        self._images: dict[tuple[str, str], tuple[str, str]] = {}
        self._warned_credentials: set[str] = set()

    # ---- sessions and clients -----------------------------------------------------------------
    @property
    def session(self) -> Any:
        """The injected session, else one boto3 Session shared by every provider of this process:
        the lifecycle makes several providers per run, and each new session would load the EC2
        service model again (~0.1 s of JSON per client)."""
        if self._session is None:
            self._session = shared_session()
        return self._session

    def client(self, service: str, region: str) -> Any:
        """One client per session, service and region (clients are thread-safe; creating them is not)."""
        return shared_client(self.session, service, region)

    def channel(self, region: str) -> S3Channel:
        """The region's S3 channel, shared per session so the bucket is checked once per process."""
        from gpucloud.channel_s3 import S3Channel

        key = (id(self.session), region)
        with _SHARED_LOCK:
            chan = _CHANNELS.get(key)
            if chan is None or chan.session is not self.session:
                chan = _CHANNELS[key] = S3Channel(self.session, region)
        return chan

    @property
    def keys_dir(self) -> Path:
        if self._keys_dir is None:
            from gpucloud.state import home_dir

            self._keys_dir = home_dir() / "keys"
        return self._keys_dir

    # ---- calls with backoff -----------------------------------------------------------------------
    def _backoff(self, attempt: int) -> float:
        """Exponential backoff with full jitter (the AWS architecture blog's recommendation)."""
        ceiling = min(self.RETRY_CAP_S, self.retry_base_s * (2 ** attempt))
        return random.uniform(ceiling / 2, ceiling)

    def _call(self, client: Any, op: str, **kwargs: Any) -> Any:
        """One API call; throttling and AWS-side failures are retried with the same arguments
        (the same ClientToken) up to RETRY_ATTEMPTS times, then the last error is raised with
        `gpucloud_tries` set on it."""
        from botocore.exceptions import ClientError, ConnectionError as BotoConnectionError

        from gpucloud.providers.aws_access import classify_access

        tries = 0
        while True:
            tries += 1
            try:
                return getattr(client, op)(**kwargs)
            except (ClientError, BotoConnectionError) as exc:
                access = classify_access(exc, what=op)  # refused credentials, dead endpoint: no retry
                if access is not None:
                    raise access from None
                retry = isinstance(exc, BotoConnectionError) or error_kind(error_code(exc)) in ("throttle", "server")
                if not retry or tries >= self.retry_attempts:
                    exc.gpucloud_tries = tries  # type: ignore[attr-defined]
                    raise
            except Exception as exc:
                access = classify_access(exc, what=op)  # e.g. NoCredentialsError
                if access is not None:
                    raise access from None
                raise
            self._sleep(self._backoff(tries - 1))

    # ---- credentials ------------------------------------------------------------------------------
    def _check_credentials(self, run_id: str, deadline: datetime, journal: Journal | None) -> None:
        """No credentials is fatal. Temporary credentials that end before the run's deadline get a
        warning: a presigned URL stops working when the credentials that signed it expire, whatever
        its own expiry, so the VM would lose its way to report logs, status and artifacts (and with
        credentials that do not refresh themselves, this CLI could not follow or tear down either)."""
        from gpucloud.errors import CredentialsError
        from gpucloud.providers.aws_access import CREDENTIALS_HINT

        creds = self.session.get_credentials()
        if creds is None:
            raise CredentialsError("AWS: no credentials found (environment, ~/.aws, SSO or instance role).",
                                   cloud=CLOUD, hint=CREDENTIALS_HINT)
        try:
            token = creds.get_frozen_credentials().token
        except Exception:  # noqa: BLE001 - a refresh failure shows up on the first real call
            return
        expiry = getattr(creds, "_expiry_time", None)
        if not token or expiry is None:
            return  # long-term keys, or a lifetime nobody told us
        if expiry.tzinfo is None:
            expiry = expiry.replace(tzinfo=UTC)
        if expiry >= deadline or run_id in self._warned_credentials:
            return
        self._warned_credentials.add(run_id)
        method = str(getattr(creds, "method", "") or "temporary")
        refreshes = method in {"iam-role", "container-role", "assume-role", "assume-role-with-web-identity",
                               "sso", "custom-process"}
        left = max(0, int((expiry - datetime.now(UTC)).total_seconds() // 60))
        message = (
            f"the AWS credentials ({method}) are temporary and expire at {iso_utc(expiry)} (in {left} min), "
            f"before this run's deadline {iso_utc(deadline)}. The VM's presigned URLs die with the credentials "
            "that signed them, so from then on the run cannot send logs, status or artifacts"
            + ("" if refreshes else ", and this CLI cannot follow or tear it down")
            + ". The VM still ends itself at its deadline and `gpucloud gc` removes anything left. "
            "Use credentials that last past the deadline (a longer role session duration, up to 12 h, or "
            "long-term keys of a user with `gpucloud iam-policy aws`), or a shorter max_duration."
        )
        self._warn(message)
        if journal is not None:
            try:
                journal.event(run_id, "warning", message)
            except Exception:  # noqa: BLE001 - a warning must never stop a launch
                pass

    # ---- images and network -----------------------------------------------------------------------
    def resolve_image(self, region: str, ubuntu_version: str, image: str = "auto") -> tuple[str, str]:
        """(AMI id, root device name). `image:` from the job file wins; else Canonical's Ubuntu AMI
        for the stack's version from AWS's public SSM parameter, falling back to DescribeImages."""
        key = (region, image if image != "auto" else f"ubuntu-{ubuntu_version}")
        if key in self._images:
            return self._images[key]
        from botocore.exceptions import ClientError

        ec2 = self.client("ec2", region)
        if image != "auto":
            if not image.startswith("ami-"):
                raise FatalProvisionError(f"image {image!r} is not an AMI id (ami-...), so it cannot run on AWS.",
                                          hint="Use an ami-... id, or `image: auto`.")
            ami = image
        else:
            ami = self._ubuntu_ami(region, ubuntu_version)
        try:
            found = self._call(ec2, "describe_images", ImageIds=[ami]).get("Images", [])
        except ClientError as exc:
            if "InvalidAMIID" in error_code(exc):
                found = []
            else:
                raise
        if not found:
            raise FatalProvisionError(f"AMI {ami} does not exist in {region} (or is not shared with this account).",
                                      code="InvalidAMIID.NotFound", hint="AMI ids are per region; check `image:`.")
        root = found[0].get("RootDeviceName") or "/dev/sda1"
        self._images[key] = (ami, root)
        return ami, root

    def _ubuntu_ami(self, region: str, version: str) -> str:
        from botocore.exceptions import ClientError

        volume = "ebs-gp3" if version >= "24.04" else "ebs-gp2"
        param = f"/aws/service/canonical/ubuntu/server/{version}/stable/current/amd64/hvm/{volume}/ami-id"
        try:
            return str(self._call(self.client("ssm", region), "get_parameter", Name=param)["Parameter"]["Value"])
        except ClientError as exc:
            if "ParameterNotFound" not in error_code(exc) and "AccessDenied" not in error_code(exc):
                raise
        code = _UBUNTU_CODENAMES.get(version)
        if code is None:
            raise FatalProvisionError(f"no Ubuntu {version} image is known on AWS.", hint="Set `image:` to an AMI id.")
        images = self._call(
            self.client("ec2", region), "describe_images", Owners=[CANONICAL_OWNER],
            Filters=[{"Name": "name", "Values": [f"ubuntu/images/hvm-ssd*/ubuntu-{code}-{version}-amd64-server-*"]},
                     {"Name": "state", "Values": ["available"]}],
        ).get("Images", [])
        if not images:
            raise FatalProvisionError(f"found no Canonical Ubuntu {version} AMI in {region}.",
                                      hint="Set `image:` to an AMI id for that region.")
        return str(max(images, key=lambda i: (i.get("CreationDate", ""), i.get("Name", "")))["ImageId"])

    def _zones(self, region: str, instance_type: str) -> tuple[str, list[tuple[str, str | None]]]:
        """The default VPC and the (zone, default subnet) pairs to try in order: only zones that
        offer the type when AWS says which (saves a failed RunInstances per zone)."""
        ec2 = self.client("ec2", region)
        vpcs = self._call(ec2, "describe_vpcs", Filters=[{"Name": "isDefault", "Values": ["true"]}]).get("Vpcs", [])
        if not vpcs:
            raise FatalProvisionError(
                f"{region} has no default VPC, which gpucloud launches into.",
                hint=f"Create one with `aws ec2 create-default-vpc --region {region}`.")
        subnets = self._call(
            ec2, "describe_subnets",
            Filters=[{"Name": "vpc-id", "Values": [vpcs[0]["VpcId"]]}, {"Name": "default-for-az", "Values": ["true"]}],
        ).get("Subnets", [])
        by_zone = {s["AvailabilityZone"]: s["SubnetId"] for s in subnets}
        offered = self._call(
            ec2, "describe_instance_type_offerings", LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [instance_type]}],
        ).get("InstanceTypeOfferings", [])
        zones = sorted({o["Location"] for o in offered} & set(by_zone)) or sorted(by_zone)
        return vpcs[0]["VpcId"], [(z, by_zone.get(z)) for z in zones] or [("", None)]

    # ---- provision ----------------------------------------------------------------------------------
    def _tags(self, req: LaunchRequest, name: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        tags = {"Name": name, **req.tags, TAG_RUN: req.run_id, TAG_EXPIRES: iso_utc(req.expires_at),
                TAG_ATTEMPT: str(req.attempt)}
        if extra:
            tags.update(extra)
        tags["Name"] = name
        return tags

    @staticmethod
    def _num_nodes(req: LaunchRequest) -> int:
        return max(1, req.candidate.num_nodes, len(req.user_data))

    def provision(self, req: LaunchRequest, journal: Journal) -> list[str]:
        """Create the attempt's security group (and key pair; and for several nodes the placement
        group) and its instances; ids in rank order."""
        from botocore.exceptions import BotoCoreError, ClientError

        cand = req.candidate
        region = cand.region
        deadline = req.expires_at if req.expires_at.tzinfo else req.expires_at.replace(tzinfo=UTC)
        self._check_credentials(req.run_id, deadline, journal)
        if deadline - datetime.now(UTC) > timedelta(days=7) and f"7d:{req.run_id}" not in self._warned_credentials:
            self._warned_credentials.add(f"7d:{req.run_id}")
            self._warn("max_duration is longer than 7 days, the most an S3 presigned URL can live: after 7 days "
                       "the VM can no longer report logs, status or artifacts (it still ends itself at its deadline).")
        created = _Created()
        nodes = self._num_nodes(req)
        if len(set(req.user_data)) > 1:
            # One RunInstances call gives every node the same user-data (shared_user_data): a
            # per-rank script would boot on whichever node got it.
            raise ValueError(f"AwsProvider launches the {nodes} nodes of a run in one call and needs one "
                             "user-data for all (render with node_rank=None)")
        payload = fit_user_data(req.user_data[0]) if req.user_data else b""  # too big: fails before any create
        try:
            what = "finding the image"
            ami, root_device = self.resolve_image(region, req.stack.ubuntu_version, req.spec.image)
            what = "finding the default VPC and zones"
            vpc_id, zones = self._zones(region, cand.instance_type)
            what = "creating the security group"
            self._security_group(req, journal, created, vpc_id)
            if nodes > 1:
                what = "letting the run's nodes reach each other"
                self._intra_run_rule(req, created)
                what = "creating the placement group"
                self._placement_group(req, journal, created)
            if req.spec.resources.ssh:
                what = "creating the SSH key pair"
                self._ssh_access(req, journal, created)
            what = "launching instances"
            ids = self._launch(req, journal, created, ami, root_device, zones, payload, nodes)
        except ProvisionError:
            self._cleanup_attempt(req, journal, created)
            raise
        except ClientError as exc:
            self._cleanup_attempt(req, journal, created)
            raise classify(exc, region=region, instance_type=cand.instance_type, spot=cand.spot, what=what,
                           tries=getattr(exc, "gpucloud_tries", 1)) from None
        except BotoCoreError as exc:
            from botocore.exceptions import ConnectionError as BotoConnectionError, HTTPClientError

            from gpucloud.providers.aws_access import classify_access

            self._cleanup_attempt(req, journal, created)
            access = classify_access(exc, what=what)
            if access is not None:
                raise access from None
            if isinstance(exc, (BotoConnectionError, HTTPClientError)):
                raise ThrottledError(f"{region}/{cand.instance_type}: could not reach AWS while {what}: {exc}",
                                     code=type(exc).__name__) from None
            raise FatalProvisionError(f"{region}/{cand.instance_type}: {what} failed: {exc}",
                                      code=type(exc).__name__,
                                      hint="Check the AWS credentials (`aws sts get-caller-identity`).") from None
        except Exception:
            self._cleanup_attempt(req, journal, created)
            raise
        return ids

    def _security_group(self, req: LaunchRequest, journal: Journal, created: _Created, vpc_id: str) -> None:
        from botocore.exceptions import ClientError

        region = req.candidate.region
        ec2 = self.client("ec2", region)
        name = f"gpucloud-{req.run_id}-{req.attempt}"
        res = journal.intent(req.run_id, "security-group", name, region, CLOUD)
        created.sg_res = res
        try:
            out = self._call(
                ec2, "create_security_group", GroupName=name, VpcId=vpc_id,
                Description=f"gpucloud run {req.run_id}: no inbound rules, outbound only",
                TagSpecifications=[{"ResourceType": "security-group", "Tags": tag_list(self._tags(req, name))}],
            )
            sg_id = out["GroupId"]
        except ClientError as exc:
            if "InvalidGroup.Duplicate" not in error_code(exc):
                raise
            # A retried attempt: the group is ours (same run, same attempt); reuse it.
            groups = self._call(ec2, "describe_security_groups",
                                Filters=[{"Name": "group-name", "Values": [name]},
                                         {"Name": f"tag:{TAG_RUN}", "Values": [req.run_id]}])["SecurityGroups"]
            if not groups:
                raise
            sg_id = groups[0]["GroupId"]
        created.sg_id = sg_id
        journal.created(res, sg_id)

    def _intra_run_rule(self, req: LaunchRequest, created: _Created) -> None:
        """All traffic from the group to itself: the run's own nodes (and only they, since no other
        machine carries this group) reach each other on any port, as torchrun and NCCL need."""
        from botocore.exceptions import ClientError

        assert created.sg_id
        name = f"gpucloud-{req.run_id}-{req.attempt}"
        try:
            self._call(
                self.client("ec2", req.candidate.region), "authorize_security_group_ingress", GroupId=created.sg_id,
                IpPermissions=[{"IpProtocol": "-1", "UserIdGroupPairs": [
                    {"GroupId": created.sg_id, "Description": "gpucloud: the run's own nodes"}]}],
                TagSpecifications=[{"ResourceType": "security-group-rule", "Tags": tag_list(self._tags(req, name))}],
            )
        except ClientError as exc:
            if "InvalidPermission.Duplicate" not in error_code(exc):
                raise  # a duplicate: a retried attempt reusing its group already has the rule

    def _placement_group(self, req: LaunchRequest, journal: Journal, created: _Created) -> None:
        """A cluster placement group for the attempt's nodes (one zone, one low-latency network
        segment), journalled before the call so a crash right after it still gets it deleted."""
        from botocore.exceptions import ClientError

        region = req.candidate.region
        name = f"gpucloud-{req.run_id}-{req.attempt}"
        res = journal.intent(req.run_id, "placement-group", name, region, CLOUD)
        created.pg_res = res
        try:
            out = self._call(
                self.client("ec2", region), "create_placement_group", GroupName=name, Strategy=PLACEMENT_STRATEGY,
                TagSpecifications=[{"ResourceType": "placement-group", "Tags": tag_list(self._tags(req, name))}],
            )
            ident = (out.get("PlacementGroup") or {}).get("GroupId") or name
        except ClientError as exc:
            if "InvalidPlacementGroup.Duplicate" not in error_code(exc):
                raise
            ident = name  # a retried attempt: the name carries the run id and attempt, so it is ours
        created.pg_name = name
        journal.created(res, ident)

    def _ssh_access(self, req: LaunchRequest, journal: Journal, created: _Created) -> None:
        """Port 22 from the caller's address only, and a fresh key pair stored 0600."""
        region = req.candidate.region
        ec2 = self.client("ec2", region)
        cidr = ssh_source_cidr(self._public_ip)
        assert created.sg_id
        name = f"gpucloud-{req.run_id}-{req.attempt}"
        self._call(
            ec2, "authorize_security_group_ingress", GroupId=created.sg_id,
            IpPermissions=[{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
                            "IpRanges": [{"CidrIp": cidr, "Description": "gpucloud ssh from the caller"}]}],
            TagSpecifications=[{"ResourceType": "security-group-rule", "Tags": tag_list(self._tags(req, name))}],
        )
        res = journal.intent(req.run_id, "key-pair", name, region, CLOUD)
        created.key_res = res
        out = self._call(
            ec2, "create_key_pair", KeyName=name, KeyType="ed25519",
            TagSpecifications=[{"ResourceType": "key-pair", "Tags": tag_list(self._tags(req, name))}],
        )
        created.key_name = name
        journal.created(res, out.get("KeyPairId") or name)
        path = self.key_path(req.run_id, region, req.attempt)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(out["KeyMaterial"])
        os.chmod(path, 0o600)

    def key_path(self, run_id: str, region: str, attempt: int) -> Path:
        return self.keys_dir / f"gpucloud-{run_id}-{region}-{attempt}.pem"

    def _launch(self, req: LaunchRequest, journal: Journal, created: _Created, ami: str, root_device: str,
                zones: list[tuple[str, str | None]], payload: bytes, nodes: int) -> list[str]:
        """All N nodes in one zone or none: a capacity error moves the whole group to the next zone
        (RunInstances with MinCount = MaxCount starts nothing when it cannot start all)."""
        from botocore.exceptions import ClientError

        cand = req.candidate
        last: ClientError | None = None
        tried: list[str] = []
        for zone, subnet in zones:
            try:
                return self._run(req, journal, created, ami, root_device, zone, subnet, payload, nodes)
            except ClientError as exc:
                if error_kind(error_code(exc)) != "capacity":
                    raise
                last = exc
                tried.append(zone or "default zone")
        assert last is not None
        what = f"{nodes} nodes together" if nodes > 1 else "the instance"
        raise CapacityError(
            f"{cand.region}/{cand.instance_type}{' (spot)' if cand.spot else ''}: no capacity for {what} in "
            f"{', '.join(tried)} ({error_code(last)}: {error_message(last)})", code=error_code(last))

    def _run(self, req: LaunchRequest, journal: Journal, created: _Created, ami: str, root_device: str,
             zone: str, subnet: str | None, user_data: bytes, count: int) -> list[str]:
        """One RunInstances call for `count` nodes; ids sorted by AmiLaunchIndex (= rank)."""
        from botocore.exceptions import ClientError

        cand = req.candidate
        region = cand.region
        name = req.tags.get("Name") or f"gpucloud-{req.run_id}"
        tags = tag_list(self._tags(req, name))
        kwargs: dict[str, Any] = {
            "ImageId": ami, "InstanceType": cand.instance_type, "MinCount": count, "MaxCount": count,
            "ClientToken": client_token(req.run_id, req.attempt, zone, None),
            "UserData": user_data,
            "SecurityGroupIds": [created.sg_id],
            "InstanceInitiatedShutdownBehavior": "terminate",
            "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 1, "HttpEndpoint": "enabled"},
            "BlockDeviceMappings": [{"DeviceName": root_device, "Ebs": {
                "VolumeSize": int(req.spec.resources.disk_gb), "VolumeType": "gp3", "Encrypted": True,
                "DeleteOnTermination": True}}],
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags},
                                  {"ResourceType": "volume", "Tags": tags}],
        }
        if subnet:
            kwargs["SubnetId"] = subnet
        if created.pg_name:
            kwargs["Placement"] = {"GroupName": created.pg_name}
        if created.key_name:
            kwargs["KeyName"] = created.key_name
        if cand.spot:
            kwargs["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
                "MaxPrice": f"{self._max_price(req):.4f}", "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate"}}
        intents = [journal.intent(req.run_id, "instance", f"{name}-node{r}", region, CLOUD) for r in range(count)]
        try:
            out = self._call(self.client("ec2", region), "run_instances", **kwargs)
        except ClientError:
            for res in intents:  # AWS answered "no": nothing was created
                journal.deleted(res)
            raise
        instances = sorted(out["Instances"], key=lambda i: i.get("AmiLaunchIndex", 0))
        ids = [i["InstanceId"] for i in instances]
        for res, iid in zip(intents, ids):
            journal.created(res, iid)
        created.instance_ids += ids
        return ids

    def _max_price(self, req: LaunchRequest) -> float:
        """The job's max price, else the on-demand price (what AWS caps a spot bid at anyway)."""
        if req.spec.resources.max_price_per_hour:
            return float(req.spec.resources.max_price_per_hour)
        try:
            from gpucloud.catalog import load_catalog

            for off in load_catalog().offerings:
                if off.cloud == CLOUD and off.instance_type == req.candidate.instance_type \
                        and off.region == req.candidate.region:
                    return float(off.price_per_hour)
        except Exception:  # noqa: BLE001 - the catalog is a convenience here
            pass
        return float(req.candidate.price_per_hour) * 3

    def _cleanup_attempt(self, req: LaunchRequest, journal: Journal, created: _Created) -> None:
        """Best effort, without waiting: what fails here keeps its tags and the run's teardown
        (or gc) deletes it."""
        region = req.candidate.region
        try:
            if created.instance_ids:
                self._terminate(region, created.instance_ids)
            if created.pg_name and not created.instance_ids:
                self._delete_pg(region, created.pg_name, timeout=0)
                if created.pg_res is not None:
                    journal.deleted(created.pg_res)
            if created.sg_id and not created.instance_ids:
                self._delete_sg(region, created.sg_id, timeout=0)
                if created.sg_res is not None:
                    journal.deleted(created.sg_res)
            if created.key_name:
                self._delete_key(region, created.key_name)
                if created.key_res is not None:
                    journal.deleted(created.key_res)
                self.key_path(req.run_id, region, req.attempt).unlink(missing_ok=True)
        except Exception:  # noqa: BLE001 - teardown/gc will finish the job; keep the original error
            pass

    # ---- state ------------------------------------------------------------------------------------------
    def _run_instances(self, run_id: str, region: str, include_terminated: bool = False) -> list[dict[str, Any]]:
        ec2 = self.client("ec2", region)
        filters = [{"Name": f"tag:{TAG_RUN}", "Values": [run_id]}]
        if not include_terminated:
            filters.append({"Name": "instance-state-name",
                            "Values": ["pending", "running", "shutting-down", "stopping", "stopped"]})
        out: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"Filters": filters}
        while True:
            page = self._call(ec2, "describe_instances", **kwargs)
            for res in page.get("Reservations", []):
                out.extend(res.get("Instances", []))
            token = page.get("NextToken")
            if not token:
                return out
            kwargs["NextToken"] = token

    def node_states(self, run_id: str, region: str) -> list[str]:
        """Per node of the run's latest attempt, in rank order."""
        instances = self._run_instances(run_id, region, include_terminated=True)
        if not instances:
            return []

        def attempt(i: dict[str, Any]) -> int:
            try:
                return int(tag_dict(i.get("Tags")).get(TAG_ATTEMPT, "0"))
            except ValueError:
                return 0

        latest = max(attempt(i) for i in instances)
        mine = [i for i in instances if attempt(i) == latest]

        def rank(i: dict[str, Any]) -> tuple[int, int, str]:
            node = tag_dict(i.get("Tags")).get(TAG_NODE)
            return (int(node) if node and node.isdigit() else i.get("AmiLaunchIndex", 0), 0, i["InstanceId"])

        mine.sort(key=rank)
        mapping = {"pending": "pending", "running": "running", "shutting-down": "stopping",
                   "stopping": "stopping", "stopped": "stopping", "terminated": "gone"}
        return [mapping.get(i["State"]["Name"], "gone") for i in mine]

    def console_hint(self, run_id: str, rank: int) -> str:
        """Where to look when a machine died without a final status."""
        return (f"its boot output: `aws ec2 get-console-output --latest --output text --instance-id <id>` "
                f"(ids: `aws ec2 describe-instances --filters Name=tag:{TAG_RUN},Values={run_id}`)")

    # ---- teardown ----------------------------------------------------------------------------------
    def _terminate(self, region: str, ids: list[str]) -> None:
        from botocore.exceptions import ClientError

        if not ids:
            return
        ec2 = self.client("ec2", region)
        try:
            self._call(ec2, "terminate_instances", InstanceIds=ids)
        except ClientError as exc:
            if "InvalidInstanceID" not in error_code(exc) or len(ids) == 1:
                if "InvalidInstanceID.NotFound" in error_code(exc):
                    return
                raise
            for iid in ids:  # one unknown id fails the whole call: go one by one
                self._terminate(region, [iid])

    def _wait_terminated(self, region: str, ids: list[str], timeout: float) -> list[str]:
        """Poll until every instance is terminated; returns the ones still alive at the timeout."""
        ec2 = self.client("ec2", region)
        end = time.monotonic() + timeout
        alive = list(ids)
        while alive:
            out = self._call(ec2, "describe_instances", Filters=[{"Name": "instance-id", "Values": alive}])
            states = {i["InstanceId"]: i["State"]["Name"] for r in out.get("Reservations", []) for i in r["Instances"]}
            alive = [i for i in alive if states.get(i, "terminated") != "terminated"]
            if not alive or time.monotonic() >= end:
                break
            self._sleep(self.poll_s)
        return alive

    def _delete_sg(self, region: str, sg_id: str, timeout: float) -> None:
        """Delete a security group, retrying DependencyViolation (instances still shutting down)."""
        self._delete_when_free(region, "delete_security_group", {"GroupId": sg_id},
                               gone=("InvalidGroup.NotFound", "InvalidGroupId"), busy="DependencyViolation",
                               timeout=timeout)

    def _delete_pg(self, region: str, name: str, timeout: float) -> None:
        """Delete a placement group, retrying InvalidPlacementGroup.InUse (AWS refuses while any
        instance in it is not yet terminated)."""
        self._delete_when_free(region, "delete_placement_group", {"GroupName": name},
                               gone=("InvalidPlacementGroup.Unknown",), busy="InUse", timeout=timeout)

    def _delete_when_free(self, region: str, op: str, kwargs: dict[str, str], *, gone: tuple[str, ...],
                          busy: str, timeout: float) -> None:
        """Call a delete that AWS refuses with `busy` while instances still use the thing: retry with
        backoff until `timeout`; an error code containing one of `gone` means already deleted."""
        from botocore.exceptions import ClientError

        ec2 = self.client("ec2", region)
        end = time.monotonic() + timeout
        tries = 0
        while True:
            try:
                self._call(ec2, op, **kwargs)
                return
            except ClientError as exc:
                code = error_code(exc)
                if any(g in code for g in gone):
                    return
                if busy not in code or time.monotonic() >= end:
                    raise
            self._sleep(min(self.RETRY_CAP_S, self._backoff(tries) + self.poll_s / 2))
            tries += 1

    def _delete_key(self, region: str, name: str) -> None:
        from botocore.exceptions import ClientError

        try:
            self._call(self.client("ec2", region), "delete_key_pair", KeyName=name)
        except ClientError as exc:
            if "InvalidKeyPair.NotFound" not in error_code(exc):
                raise

    def teardown(self, run_id: str, region: str, journal: Journal, *, wait: bool = True) -> None:
        """Terminate the run's instances, wait, delete its security groups, placement groups and key pairs.
        Found by tag (and by the journal), so it works after a crash and is idempotent. Objects
        in S3 stay: `gpucloud logs RUN` reads them later; the bucket's lifecycle rule expires them."""
        from botocore.exceptions import BotoCoreError, ClientError

        ec2 = self.client("ec2", region)
        problems: list[str] = []
        records = [r for r in journal.resources(run_id) if r.cloud == CLOUD and (r.region or region) == region]

        def step(what: str, fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except (ClientError, BotoCoreError) as exc:
                problems.append(f"{what}: {error_code(exc) or type(exc).__name__}: {error_message(exc)}")
                return None

        instances = step("listing instances", lambda: self._run_instances(run_id, region)) or []
        ids = sorted({i["InstanceId"] for i in instances}
                     | {r.cloud_id for r in records if r.kind == "instance" and r.cloud_id and r.cloud_id.startswith("i-")})
        terminated = bool(ids) and step(f"terminating {', '.join(ids)}",
                                        lambda: self._terminate(region, ids) or True) is not None
        alive = ids
        if terminated and wait:
            alive = step("waiting for termination", lambda: self._wait_terminated(region, ids, self.TERMINATE_TIMEOUT_S))
            alive = ids if alive is None else alive
            if alive:
                problems.append(f"still terminating after {self.TERMINATE_TIMEOUT_S:.0f}s: {', '.join(alive)}")
        elif terminated:
            alive = step("checking termination", lambda: self._wait_terminated(region, ids, 0))
            alive = ids if alive is None else alive

        groups = step("listing security groups", lambda: self._call(
            ec2, "describe_security_groups", Filters=[{"Name": f"tag:{TAG_RUN}", "Values": [run_id]}]))
        sg_ids = {g["GroupId"] for g in (groups or {}).get("SecurityGroups", [])}
        sg_ids |= {r.cloud_id for r in records if r.kind == "security-group" and r.cloud_id}

        def sweep(kind: str, label: str, names: set[str], delete: Callable[[str], object],
                  owns: Callable[[Any, str], bool]) -> None:
            """Delete what the run's instances depend on. AWS refuses (DependencyViolation, InUse)
            while an instance still uses it; it costs nothing and keeps its tags, so it is left for
            the next `down` or `gc` once they are gone."""
            for name in sorted(names):
                if alive:
                    journal.event(run_id, "teardown", f"{label} {name} left until its instances are gone")
                    if wait and not problems:
                        problems.append(f"{label} {name} kept: instances {', '.join(alive)} are not terminated")
                    continue
                if step(f"deleting {label} {name}", lambda name=name: delete(name) or True):
                    for r in records:
                        if r.kind == kind and owns(r, name):
                            journal.deleted(r.id)

        sweep("security-group", "security group", sg_ids,
              lambda sg: self._delete_sg(region, sg, self.SG_DELETE_TIMEOUT_S), lambda r, sg: r.cloud_id == sg)

        pgs = step("listing placement groups", lambda: self._call(
            ec2, "describe_placement_groups", Filters=[{"Name": f"tag:{TAG_RUN}", "Values": [run_id]}]))
        pg_names = {g["GroupName"] for g in (pgs or {}).get("PlacementGroups", [])
                    if g.get("State") not in PG_GONE_STATES}
        pg_names |= {r.name for r in records if r.kind == "placement-group" and r.name and r.cloud_id}
        sweep("placement-group", "placement group", pg_names,
              lambda pg: self._delete_pg(region, pg, self.PG_DELETE_TIMEOUT_S), lambda r, pg: r.name == pg)

        keys = step("listing key pairs", lambda: self._call(
            ec2, "describe_key_pairs", Filters=[{"Name": f"tag:{TAG_RUN}", "Values": [run_id]}]))
        key_names = {k["KeyName"] for k in (keys or {}).get("KeyPairs", [])}
        key_names |= {r.name for r in records if r.kind == "key-pair" and r.name and r.cloud_id}
        for key in sorted(key_names):
            if step(f"deleting key pair {key}", lambda key=key: self._delete_key(region, key) or True):
                for r in records:
                    if r.kind == "key-pair" and r.name == key:
                        journal.deleted(r.id)
        for path in self.keys_dir.glob(f"gpucloud-{run_id}-{region}-*.pem") if self.keys_dir.is_dir() else []:
            path.unlink(missing_ok=True)

        gone = set(ids) - set(alive or [])
        for r in records:
            if r.kind == "instance" and (r.cloud_id in gone or (r.cloud_id is None and not alive and not problems)):
                journal.deleted(r.id)
            elif r.kind in ("security-group", "key-pair", "placement-group") and r.cloud_id is None and not problems:
                journal.deleted(r.id)  # an intent whose create never happened (found nothing by tag)
        if problems:
            raise AwsTeardownError(
                f"teardown of run {run_id} in {region} is incomplete:\n  " + "\n  ".join(problems),
                hint=f"Run `gpucloud down {run_id}` again; everything left carries the tag {TAG_RUN}={run_id} "
                     "and `gpucloud gc` removes it once it has expired.",
            )

    # ---- gc -----------------------------------------------------------------------------------------------
    def regions(self) -> list[str]:
        from gpucloud.catalog import load_catalog

        return load_catalog().regions(CLOUD)

    def gc(self, now: datetime, *, dry_run: bool) -> list[str]:
        """Every region of the catalog, concurrently: find (and unless dry_run delete) every
        instance, security group, placement group, key pair and volume tagged gpucloud-expires < now."""
        if now.tzinfo is None:
            now = now.replace(tzinfo=UTC)
        regions = self.regions()
        if not regions:
            return []
        with ThreadPoolExecutor(max_workers=min(self.GC_WORKERS, len(regions))) as pool:
            results = list(pool.map(lambda r: self._gc_region(r, now, dry_run), regions))
        return [line for lines in results for line in lines]

    def _gc_region(self, region: str, now: datetime, dry_run: bool) -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        verb = "would delete" if dry_run else "deleted"
        lines: list[str] = []
        try:
            found = self._gc_find(region, now)
        except (ClientError, BotoCoreError) as exc:
            return [f"aws/{region}: skipped ({error_code(exc) or type(exc).__name__}: {error_message(exc)})"]
        instances, groups, pgs, keys, volumes = found

        def note(kind: str, ident: str, tags: dict[str, str], ok: bool = True, why: str = "") -> None:
            label = f"{kind} {ident} (run {tags.get(TAG_RUN, '?')}, expired {tags.get(TAG_EXPIRES, '?')})"
            lines.append(f"aws/{region}: {verb if ok else 'could not delete'} {label}{(': ' + why) if why else ''}")

        if dry_run:
            for kind, items in (("instance", instances), ("security group", groups), ("placement group", pgs),
                                ("key pair", keys), ("volume", volumes)):
                for ident, tags in items:
                    note(kind, ident, tags)
            return lines

        def attempt(kind: str, ident: str, tags: dict[str, str], fn: Callable[[], Any]) -> None:
            try:
                fn()
                note(kind, ident, tags)
            except (ClientError, BotoCoreError) as exc:
                note(kind, ident, tags, ok=False, why=f"{error_code(exc) or type(exc).__name__}: {error_message(exc)}")

        ids = [i for i, _ in instances]
        for ident, tags in instances:
            attempt("instance", ident, tags, lambda ident=ident: self._terminate(region, [ident]))
        if ids:
            try:
                self._wait_terminated(region, ids, self.TERMINATE_TIMEOUT_S)
            except (ClientError, BotoCoreError):
                pass
        for ident, tags in groups:
            attempt("security group", ident, tags, lambda ident=ident: self._delete_sg(region, ident, self.SG_DELETE_TIMEOUT_S))
        for ident, tags in pgs:
            attempt("placement group", ident, tags,
                    lambda ident=ident: self._delete_pg(region, ident, self.PG_DELETE_TIMEOUT_S))
        for ident, tags in keys:
            attempt("key pair", ident, tags, lambda ident=ident: self._delete_key(region, ident))
        if ids:  # root volumes went with their instances; look again for the ones that did not
            try:
                volumes = self._gc_find(region, now)[4]
            except (ClientError, BotoCoreError):
                pass
        for ident, tags in volumes:
            attempt("volume", ident, tags,
                    lambda ident=ident: self._call(self.client("ec2", region), "delete_volume", VolumeId=ident))
        return lines

    def _gc_find(self, region: str, now: datetime) -> tuple[list[tuple[str, dict[str, str]]], ...]:
        ec2 = self.client("ec2", region)
        flt = [{"Name": "tag-key", "Values": [TAG_EXPIRES]}]

        def expired(tags: dict[str, str]) -> bool:
            when = parse_iso(tags.get(TAG_EXPIRES, ""))
            return when is not None and when < now

        instances = []
        kwargs: dict[str, Any] = {"Filters": flt + [{"Name": "instance-state-name",
                                                      "Values": ["pending", "running", "stopping", "stopped", "shutting-down"]}]}
        while True:
            page = self._call(ec2, "describe_instances", **kwargs)
            for res in page.get("Reservations", []):
                for inst in res.get("Instances", []):
                    tags = tag_dict(inst.get("Tags"))
                    if expired(tags):
                        instances.append((inst["InstanceId"], tags))
            if not page.get("NextToken"):
                break
            kwargs["NextToken"] = page["NextToken"]
        groups = [(g["GroupId"], tag_dict(g.get("Tags")))
                  for g in self._call(ec2, "describe_security_groups", Filters=flt).get("SecurityGroups", [])
                  if expired(tag_dict(g.get("Tags")))]
        pgs = [(g["GroupName"], tag_dict(g.get("Tags")))
               for g in self._call(ec2, "describe_placement_groups", Filters=flt).get("PlacementGroups", [])
               if expired(tag_dict(g.get("Tags"))) and g.get("State") not in PG_GONE_STATES]
        keys = [(k["KeyName"], tag_dict(k.get("Tags")))
                for k in self._call(ec2, "describe_key_pairs", Filters=flt).get("KeyPairs", [])
                if expired(tag_dict(k.get("Tags")))]
        volumes = [(v["VolumeId"], tag_dict(v.get("Tags")))
                   for v in self._call(ec2, "describe_volumes",
                                       Filters=flt + [{"Name": "status", "Values": ["available", "error"]}]).get("Volumes", [])
                   if expired(tag_dict(v.get("Tags")))]
        return instances, groups, pgs, keys, volumes

