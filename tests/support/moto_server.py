"""moto in server mode for the AWS tests (docs/PROVIDERS.md, "Testing against fakes").

One ThreadedMotoServer per test session on 127.0.0.1 and a free port. The product code reaches it
only through the standard `AWS_ENDPOINT_URL` setting that boto3 honours natively, so it never knows
it is under test. Fake credentials go into the environment too, so subprocess CLIs and the
in-process code see the same account.

Speed (docs/PROVIDERS.md, "Testing against fakes"): `MOTO_EC2_LOAD_DEFAULT_AMIS=false`, one reused boto3
Session, two of moto's per-request lookups and its answers about static data cached (`fast_moto`),
and `tagged_alive` asks only the regions where moto holds anything at all (the rest cannot hold a
leak).
"""

from __future__ import annotations

import gzip
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

ACCOUNT = "123456789012"  # moto's default account
CANONICAL = "099720109477"  # Canonical's AWS account (owner of the Ubuntu AMIs)
DEFAULT_REGION = "us-east-1"

# Set before moto is imported: these are read at import / first use.
os.environ.setdefault("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
os.environ.setdefault("MOTO_ALLOW_NONEXISTENT_REGION", "false")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def aws_env(endpoint: str) -> dict[str, str]:
    """What a process needs to talk to the moto server with the standard boto3 chain (and, for
    a subprocess CLI with the test hooks, where the placement groups moto lacks are kept)."""
    from tests.support.aws_faults import PLACEMENT_ENV, SESSION_PLACEMENT

    return {
        PLACEMENT_ENV: str(SESSION_PLACEMENT),
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": DEFAULT_REGION,
        "AWS_REGION": DEFAULT_REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }


@dataclass
class Moto:
    """A running moto server and a session on it."""

    endpoint: str
    env: dict[str, str]
    session: Any  # boto3.Session
    _clients: dict[tuple[str, str], Any] = field(default_factory=dict)

    def client(self, service: str, region: str = DEFAULT_REGION) -> Any:
        key = (service, region)
        if key not in self._clients:
            self._clients[key] = self.session.client(service, region_name=region, endpoint_url=self.endpoint)
        return self._clients[key]

    def reset(self) -> None:
        """Forget every resource (moto's reset API), then re-seed the AMIs."""
        import urllib.request

        from tests.support.aws_faults import HOOKS

        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")).read()
        HOOKS.placement.clear()
        seed_ubuntu_images(self)


def seed_ubuntu_images(moto: Moto, regions: list[str] | None = None) -> dict[tuple[str, str], str]:
    """What AWS has and moto lacks: Canonical's Ubuntu AMIs and the public SSM parameters naming
    them (docs/PROVIDERS.md, "AWS images"). 20.04 and 24.04 get an SSM parameter; 22.04 only the AMI, so the
    describe_images fallback is exercised too (arm64, keys "<version>-arm64": every version has its
    parameter). Written into moto's backends directly (moto runs in
    this process), because real SSM refuses parameter names under /aws/."""
    from moto.ec2.models import ec2_backends
    from moto.ssm.models import ssm_backends

    codenames = {"20.04": "focal", "22.04": "jammy", "24.04": "noble"}
    out: dict[tuple[str, str], str] = {}
    for region in regions or _catalog_regions():
        ec2 = ec2_backends[ACCOUNT][region]
        ssm = ssm_backends[ACCOUNT][region]
        for version, code in codenames.items():
            disk = "hvm-ssd-gp3" if version == "24.04" else "hvm-ssd"
            name = f"ubuntu/images/{disk}/ubuntu-{code}-{version}-amd64-server-20260101"
            ami = _canonical_image(ec2, name, f"Canonical, Ubuntu, {version} LTS", "x86_64")
            out[(region, version)] = ami.id
            arm_name = name.replace("-amd64-", "-arm64-")
            arm = _canonical_image(ec2, arm_name, f"Canonical, Ubuntu, {version} LTS, arm64", "arm64")
            out[(region, f"{version}-arm64")] = arm.id
            _publish_ubuntu_parameter(ssm, version, "arm64", arm.id)
            if version == "22.04":
                continue
            _publish_ubuntu_parameter(ssm, version, "amd64", ami.id)
    return out


def _canonical_image(ec2: Any, name: str, description: str, arch: str) -> Any:
    """Canonical's image of that name in the region, registered once: seeding again (a test after
    the server's own seeding) must not add a second image of the same name, which a lookup of the
    newest would pick or not by the second it was made in."""
    for ami in ec2.amis.values():
        if ami.name == name and ami.owner_id == CANONICAL:
            return ami
    ami = ec2.register_image(name=name, description=description)
    ami.owner_id = CANONICAL
    ami.architecture = arch
    return ami


def fast_moto() -> None:
    """Cache two answers moto recomputes on every request although they never change while it
    runs: the handler class's method names (inspect.getmembers) and the list of its service
    folders (a listdir plus an isdir per service). Together they were a third of the server's CPU."""
    import functools

    from moto import backends
    from moto.core import responses

    if getattr(backends.list_of_moto_modules, "cache_info", None) is None:
        modules = backends.list_of_moto_modules
        backends.list_of_moto_modules = functools.cache(lambda: tuple(modules()))
    if getattr(responses.method_names_from_class, "cache_info", None) is None:
        responses.method_names_from_class = functools.cache(responses.method_names_from_class)
    _cache_static_answers(responses.BaseResponse)


# EC2 answers read from moto's bundled data that no request changes: serializing the hundreds of
# instance types to XML was two fifths of a catalog refresh's CPU, paid again on every call.
STATIC_ACTIONS = frozenset({"DescribeInstanceTypes", "DescribeInstanceTypeOfferings", "DescribeSpotPriceHistory"})


def _cache_static_answers(response_cls: Any) -> None:
    """Serialize each distinct request for static data once per process (key: region and every
    parameter, page tokens included); errors are never cached."""
    import json
    import threading

    original = response_cls.serialized
    if getattr(original, "static_cache", None) is not None:
        return
    cache: dict[str, Any] = {}
    lock = threading.Lock()

    def serialized(self: Any, action_result: Any) -> Any:
        action = self._get_action()
        if action not in STATIC_ACTIONS or isinstance(action_result.result, Exception):
            return original(self, action_result)
        key = json.dumps([self.region, action, self.querystring], sort_keys=True, default=str)
        with lock:
            hit = cache.get(key)
        if hit is None:
            hit = original(self, action_result)
            with lock:
                cache[key] = hit
        status, headers, body = hit
        return status, dict(headers), body

    serialized.static_cache = cache  # type: ignore[attr-defined]
    response_cls.serialized = serialized


def holds_anything(region: str) -> bool:
    """Whether moto's EC2 in `region` holds an instance not terminated, a key pair, a volume or a
    security group other than a VPC's default: a superset of what `tagged_alive` reports, read
    from the backend in this process, so a region without any is not asked through the API."""
    from moto.ec2.models import ec2_backends

    account = ec2_backends[ACCOUNT]
    if region not in account.keys():
        return False
    ec2 = account[region]
    groups = [g for by_vpc in list(ec2.groups.values()) for g in list(by_vpc.values())]
    live = any(i.state != "terminated" for r in list(ec2.reservations.values()) for i in list(r.instances))
    return bool(live or ec2.key_pairs or ec2.volumes or any(g.name != "default" for g in groups))


def _catalog_regions() -> list[str]:
    from gpucloud.catalog import load_catalog

    return load_catalog().regions("aws") or [DEFAULT_REGION]


_SINGLETON: tuple[Any, Moto] | None = None


def start_moto() -> Moto:
    """Start the process's moto server once (every AWS test module shares it)."""
    global _SINGLETON
    if _SINGLETON is not None:
        return _SINGLETON[1]
    import atexit
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    fast_moto()
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    atexit.register(server.stop)
    endpoint = f"http://127.0.0.1:{port}"
    import boto3

    from tests.support.aws_faults import unhooked

    with unhooked():
        session = boto3.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name=DEFAULT_REGION
        )
    moto = Moto(endpoint=endpoint, env=aws_env(endpoint), session=session)
    seed_ubuntu_images(moto)
    _SINGLETON = (server, moto)
    return moto


@pytest.fixture(scope="session")
def moto_server() -> Moto:
    """The session's moto server (tests clean up after themselves, or call reset())."""
    return start_moto()


@pytest.fixture
def moto(moto_server: Moto, monkeypatch: pytest.MonkeyPatch) -> Iterator[Moto]:
    """The moto server with this test's environment pointing the standard boto3 chain at it."""
    for key, value in moto_server.env.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CREDENTIAL_EXPIRATION", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    yield moto_server


NOT_TERMINATED = {
    "Name": "instance-state-name",
    "Values": ["pending", "running", "shutting-down", "stopping", "stopped"],
}


def tagged_alive(moto: Moto, run_id: str | None = None, regions: list[str] | None = None) -> list[str]:
    """Every resource still alive that carries the gpucloud-run tag (of `run_id`, or any), in every
    region: what a leak is. Terminated instances and deleted volumes do not count. Placement groups
    come from the hooks' fake (moto has none)."""
    from tests.support.aws_faults import HOOKS

    out: list[str] = []
    for region in regions or _catalog_regions():
        for pg in HOOKS.placement.groups(region):
            tags = {t["Key"]: t["Value"] for t in pg.get("Tags", [])}
            if (tags.get("gpucloud-run") == run_id) if run_id else "gpucloud-run" in tags:
                out.append(f"{region} placement-group {pg['GroupName']}")
        if not holds_anything(region):
            continue
        ec2 = moto.client("ec2", region)
        filters = (
            [{"Name": "tag:gpucloud-run", "Values": [run_id]}]
            if run_id
            else [{"Name": "tag-key", "Values": ["gpucloud-run"]}]
        )
        # terminated instances (every earlier test's, on the session's moto) are not asked for at all
        for res in ec2.describe_instances(Filters=filters + [NOT_TERMINATED])["Reservations"]:
            for inst in res["Instances"]:
                out.append(f"{region} instance {inst['InstanceId']} {inst['State']['Name']}")
        for sg in ec2.describe_security_groups(Filters=filters)["SecurityGroups"]:
            out.append(f"{region} security-group {sg['GroupId']}")
        for kp in ec2.describe_key_pairs(Filters=filters)["KeyPairs"]:
            out.append(f"{region} key-pair {kp['KeyName']}")
        for vol in ec2.describe_volumes(Filters=filters)["Volumes"]:
            if vol["State"] not in ("deleted", "deleting"):
                out.append(f"{region} volume {vol['VolumeId']} {vol['State']}")
    return out


def user_data_of(moto: Moto, instance_id: str, region: str = DEFAULT_REGION) -> bytes:
    """The instance's user-data as the VM would see it (gunzipped when compressed)."""
    import base64

    attr = moto.client("ec2", region).describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    raw = base64.b64decode(attr.get("UserData", {}).get("Value", "") or b"")
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


__all__ = [
    "ACCOUNT",
    "CANONICAL",
    "Moto",
    "aws_env",
    "fast_moto",
    "holds_anything",
    "moto",
    "moto_server",
    "seed_ubuntu_images",
    "start_moto",
    "tagged_alive",
    "user_data_of",
]


def _publish_ubuntu_parameter(ssm: Any, version: str, arch: str, ami_id: str) -> None:
    """Canonical's public SSM parameter naming the current Ubuntu AMI, as real AWS publishes it."""
    from moto.core.utils import utcnow
    from moto.ssm.models import Parameter

    vol = "ebs-gp3" if version == "24.04" else "ebs-gp2"
    name = f"/aws/service/canonical/ubuntu/server/{version}/stable/current/{arch}/hvm/{vol}/ami-id"
    ssm._parameters[name] = [  # noqa: SLF001 - seeding what real AWS publishes
        Parameter(
            account_id=ACCOUNT,
            name=name,
            value=ami_id,
            parameter_type="String",
            description=None,
            allowed_pattern=None,
            keyid=None,
            last_modified_date=utcnow(),
            version=1,
            data_type="aws:ec2:image",
        )
    ]
