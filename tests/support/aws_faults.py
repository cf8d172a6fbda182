"""Fault injection, call recording and ClientToken idempotency for boto3, through botocore events.

docs/PROVIDERS.md, "Testing against fakes": a `before-call.<service>.<Operation>` handler that returns
`(http_response, parsed)` short-circuits the HTTP call and makes botocore raise the real
ClientError, exactly as if AWS had answered it. `install()` hooks every botocore Session created
afterwards in this process, so the product code (which builds its own sessions) is exercised
unchanged. Also here:
- a recorder of every operation (service, operation, region), for the IAM policy test;
- ClientToken idempotency for RunInstances, which moto lacks: a repeated token returns the first
  answer instead of starting a second machine, as AWS does;
- EC2 placement groups, which moto lacks too (`PlacementGroups`): Create/Delete/Describe answered
  from a small shared state file, with AWS's own checks around them.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAULTS_ENV = "GPUCLOUD_TEST_AWS_FAULTS"  # JSON list of Fault dicts, for subprocess CLIs
RECORD_ENV = "GPUCLOUD_TEST_AWS_RECORD"  # file to append "service operation region" lines to
PLACEMENT_ENV = "GPUCLOUD_TEST_AWS_PLACEMENT_GROUPS"  # the placement groups' state file, shared with subprocess CLIs
ACCOUNT = "123456789012"  # moto's default account

# HTTP status AWS uses for each kind of error we inject.
STATUS = {
    "InsufficientInstanceCapacity": 500,
    "RequestLimitExceeded": 503,
    "InternalError": 500,
    "VcpuLimitExceeded": 400,
    "DependencyViolation": 400,
    "SlowDown": 503,
}

# The four kinds of the fault matrix: one representative code each.
KINDS = {
    "capacity": "InsufficientInstanceCapacity",
    "quota": "VcpuLimitExceeded",
    "throttle": "RequestLimitExceeded",
    "generic": "InternalError",
}


@dataclass
class Fault:
    """Answer `operation` (optionally only in `region`, or only for `instance_type`) with `code`
    `times` times (None: every time), after letting `skip` matching calls through."""

    operation: str
    code: str | None  # None: no error, only the delay (a slow call)
    times: int | None = 1
    skip: int = 0
    region: str | None = None
    instance_type: str | None = None
    message: str = "injected by the test harness"
    delay: float = 0.0  # seconds to stall the call (before sending, or after the answer)
    after: bool = False  # stall after AWS answered (the resource exists, the caller waits)
    seen: int = 0
    hits: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in ("operation", "code", "times", "skip", "region", "instance_type", "message", "delay", "after")
        }


class _Http:
    """The little of an HTTP response botocore looks at after a before-call answer."""

    def __init__(self, status: int) -> None:
        self.status_code = status
        self.headers: dict[str, str] = {}
        self.content = b""
        self.raw = None


class PlacementGroups:
    """EC2 placement groups, which moto does not implement (docs/PROVIDERS.md, "Testing against fakes"), answered from
    botocore's before-call event like any injected fault: CreatePlacementGroup,
    DeletePlacementGroup and DescribePlacementGroups (tag, tag-key, group-name, state and strategy
    filters). The state is a JSON file (flock'd), so the test process and its subprocess CLIs
    (`gpucloud run`, `down`, `gc`) see the same groups. What AWS checks around them is checked
    too: RunInstances into a group that does not exist fails (InvalidPlacementGroup.Unknown), and a
    group cannot be deleted while one of its instances is not terminated yet
    (InvalidPlacementGroup.InUse; the states are read from moto), so teardown order matters here as
    it does on EC2."""

    OPS = frozenset({"CreatePlacementGroup", "DeletePlacementGroup", "DescribePlacementGroups"})

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    @contextmanager
    def _state(self) -> Iterator[dict[str, dict[str, dict[str, Any]]]]:
        """{region: {name: group}} under a thread lock and an flock; written back on exit."""
        with self._lock, open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = json.loads(self.path.read_text()) if self.path.is_file() else {}
            except ValueError:
                state = {}
            yield state
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}")
            tmp.write_text(json.dumps(state))
            tmp.replace(self.path)

    def groups(self, region: str | None = None) -> list[dict[str, Any]]:
        """Every live group (of one region), as DescribePlacementGroups shows it, plus `Region`
        and `Instances` (the ids launched into it)."""
        with self._state() as state:
            return [{**g, "Region": r} for r, by_name in state.items() if region in (None, r) for g in by_name.values()]

    def clear(self) -> None:
        with self._state() as state:
            state.clear()

    # -- the API ---------------------------------------------------------------------------------
    @staticmethod
    def _error(code: str, message: str) -> tuple[int, dict[str, Any]]:
        return 400, {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": 400}}

    @staticmethod
    def _ok(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, {**body, "ResponseMetadata": {"HTTPStatusCode": 200, "RequestId": str(uuid.uuid4())}}

    @staticmethod
    def _public(group: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in group.items() if k != "Instances"}

    def answer(self, operation: str, region: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        """(HTTP status, parsed answer) for a placement-group call or a RunInstances into a group
        that does not exist; None lets the call through to moto."""
        if operation == "RunInstances":
            name = (params.get("Placement") or {}).get("GroupName")
            if name:
                with self._state() as state:
                    if name not in state.get(region, {}):
                        return self._error("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
            return None
        if operation not in self.OPS:
            return None
        with self._state() as state:
            groups = state.setdefault(region, {})
            if operation == "CreatePlacementGroup":
                name = params["GroupName"]
                if name in groups:
                    return self._error(
                        "InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists."
                    )
                tags = [
                    t
                    for spec in params.get("TagSpecifications", [])
                    if spec.get("ResourceType") == "placement-group"
                    for t in spec.get("Tags", [])
                ]
                group = {
                    "GroupName": name,
                    "GroupId": f"pg-{uuid.uuid4().hex[:17]}",
                    "GroupArn": f"arn:aws:ec2:{region}:{ACCOUNT}:placement-group/{name}",
                    "Strategy": params.get("Strategy", "cluster"),
                    "State": "available",
                    "Tags": tags,
                    "Instances": [],
                }
                groups[name] = group
                return self._ok({"PlacementGroup": self._public(group)})
            if operation == "DeletePlacementGroup":
                name = params["GroupName"]
                group = groups.get(name)
                if group is None:
                    return self._error("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
                live = _live_instances(region, group["Instances"])
                if live:
                    return self._error(
                        "InvalidPlacementGroup.InUse",
                        f"There are instances in placement group {name}: {', '.join(live)}",
                    )
                del groups[name]
                return self._ok({})
            found = list(groups.values())
            for key, wanted in (("GroupName", params.get("GroupNames")), ("GroupId", params.get("GroupIds"))):
                if wanted:
                    missing = set(wanted) - {g[key] for g in found}
                    if missing:
                        return self._error(
                            "InvalidPlacementGroup.Unknown", f"The Placement Group '{sorted(missing)[0]}' is unknown."
                        )
                    found = [g for g in found if g[key] in wanted]
            for flt in params.get("Filters", []):
                found = [g for g in found if _matches(g, flt["Name"], flt.get("Values", []))]
            return self._ok({"PlacementGroups": [self._public(g) for g in found]})

    def launched(self, region: str, params: dict[str, Any], parsed: dict[str, Any]) -> None:
        """After a RunInstances into a group: remember its instances (for the InUse check)."""
        name = (params.get("Placement") or {}).get("GroupName")
        if not name:
            return
        ids = [i["InstanceId"] for i in parsed.get("Instances", [])]
        with self._state() as state:
            group = state.get(region, {}).get(name)
            if group is not None:
                group["Instances"] = sorted(set(group["Instances"]) | set(ids))


def _matches(group: dict[str, Any], name: str, values: list[str]) -> bool:
    tags = {t["Key"]: t["Value"] for t in group.get("Tags", [])}
    if name.startswith("tag:"):
        return tags.get(name[4:]) in values
    if name == "tag-key":
        return any(v in tags for v in values)
    field_of = {"group-name": "GroupName", "group-arn": "GroupArn", "state": "State", "strategy": "Strategy"}
    if name in field_of:
        return group.get(field_of[name]) in values
    raise ValueError(f"the placement-group fake has no filter {name!r}")


_STATE_CLIENTS: dict[tuple[str, str], Any] = {}


def _live_instances(region: str, ids: list[str]) -> list[str]:
    """Those of `ids` that moto does not show as terminated (AWS's InUse rule)."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if not ids or not endpoint:
        return []
    key = (endpoint, region)
    if key not in _STATE_CLIENTS:
        import boto3

        with unhooked():
            session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing")
        _STATE_CLIENTS[key] = session.client("ec2", region_name=region, endpoint_url=endpoint)
    out = _STATE_CLIENTS[key].describe_instances(Filters=[{"Name": "instance-id", "Values": ids}])
    return sorted(
        i["InstanceId"]
        for r in out.get("Reservations", [])
        for i in r["Instances"]
        if i["State"]["Name"] != "terminated"
    )


@dataclass
class Call:
    service: str
    operation: str
    region: str
    params: dict[str, Any]
    injected: str | None = None


@dataclass
class AwsHooks:
    """The process-wide hook state. Thread-safe: the provider's gc runs regions concurrently."""

    faults: list[Fault] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    record_file: Path | None = None
    idempotency: bool = True
    on_call: Callable[[Call], None] | None = None
    placement: PlacementGroups = field(default_factory=lambda: PlacementGroups(SESSION_PLACEMENT))
    _tokens: dict[tuple[str, str], Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self._lock:
            self.faults.clear()
            self.calls.clear()
            self._tokens.clear()
            self.on_call = None

    def add(self, *faults: Fault) -> None:
        with self._lock:
            self.faults.extend(faults)

    def ops(self, operation: str) -> list[Call]:
        return [c for c in self.calls if c.operation == operation]

    # -- handlers ---------------------------------------------------------------------------------
    def _params(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["gpucloud_api_params"] = dict(params)

    def _before_call(
        self, model: Any, params: dict[str, Any], context: dict[str, Any], request_signer: Any = None, **_: Any
    ) -> Any:
        service = model.service_model.service_name
        operation = model.name
        region = getattr(request_signer, "region_name", None) or ""
        api = dict(context.get("gpucloud_api_params") or {})
        context["gpucloud_region"] = region
        call = Call(service, operation, region, api)
        answer = None
        stall = 0.0
        with self._lock:
            for fault in self.faults:
                if fault.operation != operation or (fault.region and fault.region != region):
                    continue
                if fault.instance_type and api.get("InstanceType") != fault.instance_type:
                    continue
                fault.seen += 1
                if fault.seen <= fault.skip or (fault.times is not None and fault.hits >= fault.times):
                    continue
                fault.hits += 1
                if fault.after:
                    context["gpucloud_stall_after"] = fault.delay
                else:
                    stall = fault.delay
                if fault.code is None:
                    continue
                call.injected = fault.code
                answer = (
                    _Http(STATUS.get(fault.code, 400)),
                    {
                        "Error": {"Code": fault.code, "Message": fault.message},
                        "ResponseMetadata": {"HTTPStatusCode": STATUS.get(fault.code, 400)},
                    },
                )
                break
            if answer is None and self.idempotency and operation == "RunInstances" and api.get("ClientToken"):
                cached = self._tokens.get((region, api["ClientToken"]))
                if cached is not None:
                    call.injected = "idempotent-replay"
                    answer = (_Http(200), cached)
            self.calls.append(call)
            RECORDED.add((service, operation))
        if answer is None and service == "ec2":
            answer = self.placement.answer(operation, region, api)
            if answer is not None:
                status, parsed = answer
                call.injected = parsed.get("Error", {}).get("Code") or "placement-group-fake"
                answer = (_Http(status), parsed)
        if self.record_file is not None:
            with open(self.record_file, "a") as fh:
                fh.write(f"{service} {operation} {region}\n")
        if self.on_call is not None:
            self.on_call(call)
        if stall:
            time.sleep(stall)
        return answer

    def _after_call(
        self, model: Any, http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any
    ) -> None:
        if context.get("gpucloud_stall_after"):
            time.sleep(context.pop("gpucloud_stall_after"))
        if model.name != "RunInstances" or getattr(http_response, "status_code", 500) >= 300:
            return
        api = context.get("gpucloud_api_params") or {}
        self.placement.launched(context.get("gpucloud_region", ""), api, parsed)
        token = api.get("ClientToken")
        if token:
            region = context.get("gpucloud_region", "")
            with self._lock:
                self._tokens.setdefault((region, token), parsed)

    def attach(self, session: Any) -> None:
        """Register the handlers on a botocore (or boto3) Session."""
        core = getattr(session, "_session", session)
        core.gpucloud_test_hooks = self  # how `hooked` tells a session made before (or without) the hooks
        core.register("before-parameter-build", self._params)
        core.register("before-call", self._before_call)
        core.register("after-call", self._after_call)


# Every (service, operation) the product made in this process, never reset: the IAM policy test
# checks each one (subprocess CLIs append to the record file instead).
RECORDED: set[tuple[str, str]] = set()
# Where this test process's subprocess CLIs record their operations (GPUCLOUD_TEST_AWS_RECORD).
SESSION_RECORD = Path(tempfile.gettempdir()) / f"gpucloud-aws-ops-{os.getpid()}.txt"
atexit.register(lambda: SESSION_RECORD.unlink(missing_ok=True))
# The placement groups' state of this test process (subprocess CLIs get it through PLACEMENT_ENV).
SESSION_PLACEMENT = Path(tempfile.gettempdir()) / f"gpucloud-aws-pgs-{os.getpid()}.json"
atexit.register(
    lambda: [
        p.unlink(missing_ok=True)
        for p in (SESSION_PLACEMENT, SESSION_PLACEMENT.with_name(SESSION_PLACEMENT.name + ".lock"))
    ]
)
HOOKS = AwsHooks()
_local = threading.local()


class unhooked:
    """Sessions created inside `with unhooked():` get no hooks: the test's own clients (the
    simulator, assertions) must neither meet injected faults nor count as product calls."""

    def __enter__(self) -> None:
        _local.off = getattr(_local, "off", 0) + 1

    def __exit__(self, *exc: object) -> None:
        _local.off -= 1


def install(hooks: AwsHooks = HOOKS) -> AwsHooks:
    """Hook every botocore Session created from now on in this process (idempotent), and drop the
    provider's shared session when it was made without these hooks (before them, or while
    `unhooked`), so that the next one is created hooked: an in-process CLI whose calls bypass the
    hooks would meet no fault and record nothing."""
    import botocore.session

    from gpucloud.providers.aws import reset_shared
    from gpucloud.providers.aws.session import shared_session

    _local.off = 0  # called outside any `with unhooked()` block of this thread
    if getattr(botocore.session.Session.__init__, "gpucloud_test_hooks", None) is not hooks:
        original = botocore.session.Session.__init__

        def patched(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            if not getattr(_local, "off", 0):
                hooks.attach(self)

        patched.gpucloud_test_hooks = hooks  # type: ignore[attr-defined]
        botocore.session.Session.__init__ = patched  # type: ignore[method-assign]
        reset_shared()
    core = getattr(shared_session(), "_session", None)
    if getattr(core, "gpucloud_test_hooks", None) is not hooks:
        reset_shared()
    return hooks


def load_env(hooks: AwsHooks = HOOKS) -> AwsHooks:
    """Faults and the record file from the environment (how a subprocess CLI gets them)."""
    raw = os.environ.get(FAULTS_ENV)
    if raw:
        hooks.add(*(Fault(**d) for d in json.loads(raw)))
    rec = os.environ.get(RECORD_ENV)
    if rec:
        hooks.record_file = Path(rec)
    pgs = os.environ.get(PLACEMENT_ENV)
    if pgs:
        hooks.placement = PlacementGroups(Path(pgs))
    return hooks


def faults_env(faults: list[Fault]) -> str:
    return json.dumps([f.as_dict() for f in faults])


def recorded_ops(*files: Path) -> set[tuple[str, str]]:
    """RECORDED plus the operations subprocess CLIs wrote to record files."""
    out = set(RECORDED)
    for f in files:
        if f.is_file():
            for line in f.read_text().splitlines():
                parts = line.split()
                if len(parts) >= 2:
                    out.add((parts[0], parts[1]))
    return out
