"""The provider contract: everything that crosses between the core and a provider.

The Provider protocol every cloud implements, the narrow requests it receives (`PlanRequest`,
`LaunchRequest`: values, never the job file), the types it hands back (`Candidate`, `Image`,
`RunHandle`, `BakedImage`), the `Journal` it writes through, the user-data size rule, and the
error classes that drive failover (docs/PROVIDERS.md, "AWS errors" and "Azure errors"). It imports
only the layers below it, so a provider depends on this module and never on the planner, the spec
or the state store's classes."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol, runtime_checkable

from gpucloud.errors import GpucloudError, SessionUnsupported, UserError

if TYPE_CHECKING:
    from gpucloud.channel.run_objects import Channel
    from gpucloud.contract.session import SessionAsk, SessionPlan
    from gpucloud.plan.stack_data import Stack
    from gpucloud.state.records import ResourceRecord

TAG_RUN = "gpucloud-run"
TAG_EXPIRES = "gpucloud-expires"  # UTC, ISO 8601 "2026-12-02T17:04:05Z"; see expiry_tag()
_EXPIRY_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")


def expiry_tag(when: datetime) -> str:
    """The one format of the TAG_EXPIRES value every provider writes and gc reads back
    ("2026-12-02T17:04:05Z"); a naive datetime is taken as UTC."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_expiry_tag(text: str | None) -> datetime | None:
    """The aware UTC datetime of a TAG_EXPIRES value, or None when it is missing or not exactly
    what expiry_tag() writes (gc then leaves the resource alone rather than guess: anyone who can
    tag a resource or comment a job may write anything there)."""
    if not isinstance(text, str) or not _EXPIRY_RE.fullmatch(text):
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


DEFAULT_MASTER_PORT = 29500  # torchrun's default; a cloud VM has its address to itself


class ProvisionError(GpucloudError):
    """A cloud refused a launch. `kind` tells the lifecycle what to do next:
    capacity -> next candidate; quota -> skip the rest of that cloud+region (name `quota_code`);
    throttle -> the provider already backed off and gave up, next candidate; price -> next candidate;
    candidate -> this candidate cannot be used (its size, its subnet, or an error the classifier does
    not know), next candidate; image -> the image this candidate boots is not published (or not
    readable) in its region: skip the rest of that cloud+region, the cloud's other regions are still
    tried; fatal -> skip every remaining candidate of that cloud."""

    kind: Literal["capacity", "quota", "throttle", "price", "candidate", "image", "fatal"] = "fatal"

    def __init__(self, message: str, *, code: str = "", quota_code: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.code = code
        self.quota_code = quota_code


class CapacityError(ProvisionError):
    kind = "capacity"


class QuotaError(ProvisionError):
    kind = "quota"


class ThrottledError(ProvisionError):
    kind = "throttle"


class PriceError(ProvisionError):
    kind = "price"


class CandidateError(ProvisionError):
    kind = "candidate"


class ImageMissingError(ProvisionError):
    kind = "image"


# Kinds that say the cloud had no room or would not sell (capacity, quota, rate, price): a run that
# failed only for these is `no-capacity`; one that failed for anything else is an `error`.
CAPACITY_KINDS = frozenset({"capacity", "quota", "throttle", "price"})


class FatalProvisionError(ProvisionError):
    kind = "fatal"


class Unreachable(GpucloudError):
    """A provider could not reach the machines at all (a host that does not answer): nothing was done
    to them. `down` leaves such a run `down-pending`; `down` and `gc` try again later."""

    exit_code = 75  # EX_TEMPFAIL: try again later


class PriceSource(NamedTuple):
    """Where a row's price comes from, so that no table passes an estimate off as a quote.

    kind: "live" (a cloud's price API, `date` the fetch time), "shipped" (the catalog gpucloud
    ships, `date` as precise as its source), "estimate" (derived by the rule in `rule`), or "old"
    (a refresh could not read a current price and kept this one; `rule` says why)."""

    kind: str
    date: str
    rule: str = ""

    def as_json(self) -> dict[str, str]:
        doc = {"kind": self.kind, "date": self.date}
        if self.rule:
            doc["rule"] = self.rule
        return doc

    def short(self) -> str:
        """A table cell: `live 2026-12-01`, `shipped 2024-06`, `ESTIMATE`, `OLD 2026-11-02`."""
        day = self.date[:10]
        return {"live": f"live {day}", "shipped": f"shipped {day}", "estimate": "ESTIMATE"}.get(self.kind, f"OLD {day}")


@dataclass(frozen=True)
class Candidate:
    """One place the job could run: a cloud, region and machine type at a price, and the image it
    boots. The planner ranks them; the unpriced providers name their own (`plan_candidates`)."""

    cloud: str  # a provider name (gpucloud.providers registry)
    region: str  # an unpriced provider names its own (the local machine: "local")
    instance_type: str  # an unpriced provider names its own (the local machine: "localhost")
    gpu: str  # canonical GPU name, "" when the job asked for none
    gpu_count: int  # per node
    num_nodes: int
    spot: bool
    price_per_hour: float  # per node
    total_per_hour: float  # price_per_hour * num_nodes
    estimated_cost: float  # total_per_hour * max_duration hours
    status: str = "active"  # offering status ("legacy" candidates carry a warning)
    vcpus: int = 0
    memory_gib: float = 0.0
    arch: str = "x86_64"  # CPU architecture of the host (the offering's `arch`)
    image: Image | None = None  # the image it boots, chosen by the planner
    request: str = ""  # which of the job's GPU requests it meets, as written (`L4:1`, `A100|H100:8`)
    price_source: PriceSource | None = None  # live / shipped / estimate / old (catalog/prices.py)
    # What the provider could not check and assumed from the job file (a host that did not answer):
    # `plan` and `render` show such a candidate, a launch never uses it (run/plan.py).
    assumed: str = ""

    def as_json(self) -> dict[str, object]:
        return {
            "cloud": self.cloud,
            "region": self.region,
            "instance_type": self.instance_type,
            "gpu": self.gpu,
            "gpu_count": self.gpu_count,
            "num_nodes": self.num_nodes,
            "spot": self.spot,
            "price_per_hour": self.price_per_hour,
            "total_per_hour": self.total_per_hour,
            "estimated_cost": self.estimated_cost,
            "image": self.image.as_json() if self.image else None,
            "request": self.request,
            "price_source": self.price_source.as_json() if self.price_source else None,
        }


@dataclass(frozen=True)
class Image:
    """One row of images.csv: an image and what it has preinstalled ("" / () = nothing)."""

    cloud: str
    name: str
    cpu_arch: str
    gpu_archs: tuple[str, ...]  # ("*",) = any GPU (or none)
    vm_feature: str  # "" or "grid": rows for GRID VMs are used only there
    ubuntu: str
    modules: str  # "open" | "proprietary" | "grid" | "" (no driver)
    driver: str  # preinstalled branch, "" = none or not known
    cuda: tuple[str, ...]  # preinstalled toolkits
    cudnn: bool
    fabric_manager: bool
    extension: str  # a cloud VM extension that installs the driver ("" = none)
    found_by: str  # "ssm" (public parameter name) | "urn" (marketplace) | "job file"
    ref: str
    source: str
    checked: str

    @property
    def vendor(self) -> bool:
        return bool(self.modules)

    def as_json(self) -> dict[str, object]:
        """The `image` object of `plan --json`."""
        return {
            "name": self.name,
            "ref": self.ref,
            "found_by": self.found_by,
            "ubuntu": self.ubuntu,
            "preinstalled": {
                "driver": self.driver
                or ("from " + self.extension if self.extension else ("yes" if self.modules else "none")),
                "kernel_modules": self.modules or "none",
                "cuda": list(self.cuda),
                "cudnn": self.cudnn,
                "fabric_manager": self.fabric_manager,
            },
            "source": self.source,
            "checked": self.checked,
        }

    def summary(self) -> str:
        """One line for `plan`: the image and what it brings."""
        if not self.modules:
            has = "nothing NVIDIA preinstalled"
        elif self.extension:
            has = f"driver from the {self.extension} extension"
        else:
            parts = [
                f"driver R{self.driver}" if self.driver else "NVIDIA driver",
                f"CUDA {'/'.join(self.cuda)}" if self.cuda else "",
                "cuDNN" if self.cudnn else "",
                "fabric manager" if self.fabric_manager else "",
            ]
            has = ", ".join(p for p in parts if p)
        return f"{self.name} ({self.found_by} {self.ref}): {has}"


@dataclass(frozen=True)
class PlanRequest:
    """What a provider without catalog rows (this machine, SSH hosts) needs to name its own
    candidates: the job's asks as values, and its stack resolver (the job's pins applied)."""

    gpu: str | None  # canonical GPU model the job asks for, None for a CPU job
    gpu_count: int  # per node
    num_nodes: int
    hosts: tuple[str, ...] = ()  # the machines the job names (resources.hosts, --host)
    source: str | None = None  # the job file, named in messages
    stack_for: Callable[[str | None], Stack] | None = None  # the job's stack for a GPU model
    install: bool = False  # stack.install: the provider may install the driver where it lacks
    needs_cuda: bool = False  # the job pins CUDA or a framework: the host's own CUDA may not do
    framework: str = "none"  # stack.framework ("none" for a container: job); a provider that installs nothing finds it
    # A batch scheduler's settings (providers with takes_cluster): resources.cluster, partition,
    # account, qos, constraint, each only when the job sets it.
    scheduler: dict[str, str] = field(default_factory=dict)
    max_duration_s: int = 0  # the job's max_duration (a scheduler's own time limit is derived from it)
    min_vcpus: int = 0  # resources.min_vcpus per node (0: not set); a scheduler asks for them
    min_memory_gib: float = 0.0  # resources.min_memory_gib per node (0: not set)


@dataclass
class LaunchRequest:
    """Everything a provider needs to create the machines of one attempt, as values: where, what
    machine, which market, which image, the rendered user-data, the tags. Never the job file."""

    run_id: str
    job_name: str  # the job's name (machine names, display tags)
    region: str
    instance_type: str
    num_nodes: int
    user_data: list[str]  # rendered bootstrap, one per node rank (N copies when shared)
    expires_at: datetime  # UTC; deadline plus a teardown margin; goes into TAG_EXPIRES
    gpu: str = ""  # canonical GPU name, "" for a CPU job
    gpu_count: int = 0  # per node
    cpu_arch: str = "x86_64"  # the machine's CPU architecture ("x86_64" | "arm64")
    spot: bool = False
    max_price_per_hour: float | None = None  # spot cap per node (None: the cloud's own cap)
    disk_gb: int = 100
    image: Image | None = None  # the planned image (None: the provider's default for ubuntu)
    image_ref: str = "auto"  # the job's own image (`image:`), "auto": the planned one
    ubuntu: str = "22.04"  # the stack's Ubuntu release, for the provider's default image
    ssh: bool = False  # open SSH to the caller's address, with the user's key
    install_stack: Stack | None = None  # stack.install: what a host lacking the driver gets installed
    needs_cuda: bool = False  # the job pins CUDA or a framework (a host's own older CUDA will not do)
    framework: str = "none"  # as PlanRequest.framework
    attempt: int = 0  # index in the failover order; part of idempotency tokens
    tags: dict[str, str] = field(default_factory=dict)  # TAG_RUN, TAG_EXPIRES, Name ...
    scheduler: dict[str, str] = field(default_factory=dict)  # as PlanRequest.scheduler
    max_duration_s: int = 0  # the job's max_duration in seconds
    # The candidate's CPUs and memory per node: a batch scheduler asks for exactly these (0: none).
    vcpus: int = 0
    memory_gib: float = 0.0


class Journal(Protocol):
    """What providers write through: an intent row *before* each create call, then created/deleted.
    A crash between the two leaves an intent row, which tells teardown and gc where to look
    (the state store implements it: gpucloud.state.runs_db.Journal)."""

    def intent(self, run_id: str, kind: str, name: str, region: str, cloud: str) -> int: ...

    def created(self, res_id: int, cloud_id: str) -> None: ...

    def deleted(self, res_id: int) -> None: ...

    def resources(self, run_id: str, alive_only: bool = True) -> list[ResourceRecord]: ...

    def event(self, run_id: str, kind: str, message: str) -> None: ...


@dataclass(frozen=True)
class Capabilities:
    """What the lifecycle and the renderer need to know about a provider, declared once by the
    provider instead of probed with getattr or spelled as `provider == "..."` elsewhere."""

    poll_interval: float = 5.0  # s between the CLI's reads of the channel
    log_interval: float = 5.0  # s between log parts the VM uploads
    heartbeat_interval: float = 15.0  # s between the VM's heartbeats; "lost" after 3 missed
    barrier_timeout: float = 1200.0  # s a multi-node node waits for its peers
    shared_user_data: bool = False  # N identical machines in one call (one script for all)
    user_data_limit: int | None = None  # bytes the cloud accepts (None: no limit)
    user_data_encoding: Literal["raw", "base64"] = "raw"  # how the cloud counts the limit
    self_termination: Literal["exit", "shutdown", "azure-delete"] = "shutdown"  # bootstrap's last step
    vm_dir: str = "/var/lib/gpucloud"  # the VM's work folder ("$PWD": the sandbox the engine gives)
    install_stack: bool = True  # False: the host's driver/CUDA are used as they are
    gpu_check: Literal["strict", "warn"] = "strict"  # wrong GPU fails the run, or only warns
    node_ips_known: bool = False  # every node shares one address (publish 127.0.0.1)
    spot: bool = False  # can launch spot/low-priority machines (else `spot: true` is refused at plan time)
    multi_node: bool = True  # can run num_nodes > 1 (else refused at plan time)
    preemption_notice: str | None = None  # how the VM learns of a spot interruption, or None
    preemption_grace: float = 15.0  # s the job gets after SIGTERM on a notice (then checkpoint upload)
    console_hint: str = ""  # console_hint()'s text, {run_id} {rank} {region} filled in
    channel_torn_down: bool = False  # teardown removes the channel too: `down` mirrors the log first
    # (name, URL) of the cloud's endpoints the node's own calls use, from the cloud the CLI is
    # configured for (a sovereign cloud's, not the public one's); the job config carries them.
    node_endpoints: tuple[tuple[str, str], ...] = ()


@dataclass
class RunHandle:
    """What one attempt created: enough for teardown, node states and gc to act without guessing
    (stored in the state store's attempts table as JSON). `resources` maps a resource kind
    ("security-group", "placement-group", "key-pair", "resource-group", ...) to the ids or names of
    that kind; teardown calls the APIs only for the kinds listed. A partial handle (a crash before
    provision returned) is rebuilt from the journal's intent rows by `from_journal`."""

    run_id: str
    cloud: str
    region: str
    attempt: int = 0
    zone: str | None = None
    nodes: list[str] = field(default_factory=list)  # machine ids, rank order
    resources: dict[str, list[str]] = field(default_factory=dict)  # kind -> ids/names
    complete: bool = True  # False: rebuilt from the journal

    def add(self, kind: str, ident: str) -> None:
        items = self.resources.setdefault(kind, [])
        if ident not in items:
            items.append(ident)

    def to_json(self) -> str:
        import json

        return json.dumps(
            {
                "run_id": self.run_id,
                "cloud": self.cloud,
                "region": self.region,
                "attempt": self.attempt,
                "zone": self.zone,
                "nodes": self.nodes,
                "resources": self.resources,
                "complete": self.complete,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> RunHandle:
        import json

        data = json.loads(text)
        return cls(
            run_id=data["run_id"],
            cloud=data["cloud"],
            region=data["region"],
            attempt=int(data.get("attempt", 0)),
            zone=data.get("zone"),
            nodes=list(data.get("nodes", [])),
            resources={k: list(v) for k, v in (data.get("resources") or {}).items()},
            complete=bool(data.get("complete", True)),
        )


@runtime_checkable
class Provider(Protocol):
    """One cloud. Every cloud call that creates something is preceded by `journal.intent(...)`
    and followed by `journal.created(...)`, so a crash at any point can be cleaned up. A provider
    class subclasses it (`class MyProvider(Provider)`) to inherit the optional methods' defaults."""

    name: str
    capabilities: Capabilities

    def channel(self, region: str) -> Channel:
        """The object store the VM talks to for runs in this region (created on first use)."""
        ...

    def provision(self, req: LaunchRequest, journal: Journal) -> RunHandle:
        """Create the machines; return the handle (node ids in rank order). On failure, raise a
        ProvisionError subclass after cleaning up whatever this attempt created."""
        ...

    def node_states(self, handle: RunHandle) -> list[str]:
        """Per node, in rank order: "pending" | "running" | "stopping" | "gone". Lets the lifecycle
        tell a dead VM from a slow one together with the heartbeat in status.json."""
        ...

    def master_port(self) -> int:
        """MASTER_PORT for a multi-node job (29500 on clouds; a free port where runs share an address)."""
        ...

    def console_hint(self, handle: RunHandle, rank: int) -> str:
        """Where a user sees the console of node `rank` when it died without a word (the lifecycle
        appends it to the "lost" message)."""
        ...

    def plan_candidates(self, job: PlanRequest) -> list[Candidate]:
        """The provider's own candidates for the job. Called only for providers whose registry entry
        has priced=False (no catalog rows): the local machine, an SSH host. Priced providers return []."""
        ...

    def teardown(self, handle: RunHandle, journal: Journal, *, wait: bool = True) -> None:
        """Delete everything the handle lists (for a partial handle, also what the journal says was
        being created). Idempotent; safe after a partial provision."""
        ...

    def gc(self, now: datetime, *, dry_run: bool) -> list[str]:
        """Find (and unless dry_run delete) every tagged resource whose TAG_EXPIRES has passed,
        in every region. Returns one human line per resource."""
        ...

    # Optional: a provider class that subclasses Provider inherits these defaults, so the core calls
    # them plainly on every provider.

    def plan_stack(self, stack: Stack) -> Stack:
        """The stack as on the machines just planned (plan_candidates' hosts report theirs); the
        planner's own stack where the provider installs it."""
        return stack

    def plan_notes(self) -> list[str]:
        """What plan_candidates left out and why, as `plan` warnings."""
        return []

    def stop(self, handle: RunHandle) -> None:
        """Stop the nodes, keeping their folders: a provider whose teardown removes the channel
        (`capabilities.channel_torn_down`) is stopped first, so that what the job saved is read back
        before the teardown. Nothing to do where the channel outlives the machines."""
        return None

    def session_path(self, handle: RunHandle, rank: int, ask: SessionAsk) -> SessionPlan:
        """How `gpucloud ssh` reaches node `rank` (contract/session.py); a provider without one says so."""
        raise SessionUnsupported(f"gpucloud ssh: the {self.name} provider has no session path (docs/SSH.md).")


SSH_CIDR_ENV = "GPUCLOUD_SSH_CIDR"  # e.g. "203.0.113.7/32" when the public address cannot be looked up
IP_LOOKUP_URLS = ("https://checkip.amazonaws.com", "https://api.ipify.org")


def lookup_public_ip(timeout: float = 5.0) -> str:
    """This machine's public IPv4 address as the internet sees it (first lookup service that answers)."""
    import ipaddress
    import urllib.request

    last: Exception | None = None
    for url in IP_LOOKUP_URLS:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - fixed https URLs
                return str(ipaddress.IPv4Address(resp.read().decode().strip()))
        except (OSError, ValueError) as exc:
            last = exc
    raise OSError(f"no lookup service answered ({last})")


def ssh_source_cidr(lookup: Callable[[], str] | None = None) -> str:
    """The one address range `ssh: true` lets in: GPUCLOUD_SSH_CIDR, else the caller's public IP/32.
    Shared by every cloud so the rule and its error read the same everywhere."""
    import os

    cidr = os.environ.get(SSH_CIDR_ENV, "").strip()
    if cidr:
        return cidr
    try:
        return f"{(lookup or lookup_public_ip)()}/32"
    except Exception as exc:  # noqa: BLE001 - any lookup failure gets the same clear advice
        raise FatalProvisionError(
            f"ssh: true needs this machine's public IP address, and looking it up failed ({exc}).",
            hint=f"Set {SSH_CIDR_ENV}=<your address>/32, or drop `ssh: true` (jobs do not need it).",
        ) from None


@dataclass
class CloudCheck:
    """What `gpucloud check` found about one cloud (a provider's `check` function fills it);
    `usable` when credentials work and the API answered. Each problem carries its fix."""

    cloud: str
    usable: bool = False
    credentials: bool = False
    identity: dict[str, str] = field(default_factory=dict)
    regions: list[str] = field(default_factory=list)
    quotas: list[dict[str, object]] = field(default_factory=list)
    problems: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    # The one-time pieces `gpucloud setup CLOUD` creates: {piece, state, detail} each.
    setup: list[dict[str, str]] = field(default_factory=list)

    def problem(self, problem: str, fix: str | None) -> None:
        self.problems.append({"problem": problem, "fix": fix or ""})

    def as_json(self) -> dict[str, object]:
        from dataclasses import asdict

        doc = asdict(self)
        doc["seconds"] = round(self.seconds, 3)
        return doc


# The tags every baked image carries (a provider writes them, `image ls` and `gc` read them back).
HASH_TAG = "gpucloud:stack-hash"
KIND_TAG = "gpucloud:kind"
KIND_VALUE = "image"  # `gc` must treat these as images, never as a run's leftovers
STACK_TAG = "gpucloud:stack"


@dataclass(frozen=True)
class BakedImage:
    """An image a provider baked from a stack (`gpucloud image build`), found again by its hash."""

    ref: str  # AMI id / image resource id
    region: str
    name: str
    stack_hash: str
    tags: dict[str, str] = field(default_factory=dict)
    created: str = ""


class ImageStore(Protocol):
    """The three cloud calls image build/ls/rm need."""

    def create_image(self, region: str, instance_id: str, name: str, tags: dict[str, str]) -> str: ...

    def list_images(self, region: str) -> list[BakedImage]: ...

    def delete_image(self, region: str, ref: str) -> None: ...


def _as_bytes(data: str | bytes) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data


def user_data_size(data: str | bytes, caps: Capabilities) -> int:
    """Bytes as the cloud counts them (`caps.user_data_encoding`): the raw bytes, or their base64 text."""
    raw = _as_bytes(data)
    if caps.user_data_encoding == "base64":
        import base64

        return len(base64.b64encode(raw))
    return len(raw)


def check_user_data(data: str | bytes, caps: Capabilities, cloud: str = "this provider") -> int:
    """Raise UserError when the user-data exceeds `caps.user_data_limit`; return its counted size."""
    size = user_data_size(data, caps)
    limit = caps.user_data_limit
    if limit is not None and size > limit:
        raise UserError(
            f"The bootstrap for {cloud} is {size} bytes, above the {limit}-byte user-data limit.",
            hint="Shorten long `env`, `setup` or `run` values: put them in a script inside `workdir` and call it.",
        )
    return size


def compress_user_data(text: str) -> bytes:
    """gzip'd user-data (cloud-init detects and unpacks it); mtime 0 keeps it reproducible."""
    import gzip

    return gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0)


def fit_user_data(text: str, caps: Capabilities, cloud: str = "this provider") -> bytes:
    """The bytes to send as user-data: as is when they fit, gzip'd when that makes them fit.
    The one owner of the size rule: providers call this instead of keeping their own limit."""
    raw = text.encode("utf-8")
    limit = caps.user_data_limit
    if limit is None or user_data_size(raw, caps) <= limit:
        return raw
    packed = compress_user_data(text)
    check_user_data(packed, caps, cloud)
    return packed
