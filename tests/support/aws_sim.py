"""The AWS VM simulator: every instance moto starts boots from its user-data.

A thread polls DescribeInstances in every catalog region. A new pending/running instance that
carries the gpucloud-run tag is booted by the shared guest engine (tests/support/vm_sim.py on
gpucloud/providers/local/engine.py) with `nvidia-smi` showing the instance type's GPU model and count from the
catalog. Its user-data comes from DescribeInstanceAttribute, gunzipped when compressed, as
cloud-init would. `shutdown` inside the guest terminates the moto instance through the API, as
`InstanceInitiatedShutdownBehavior=terminate` does on EC2; an instance terminated from outside
(teardown, gc) ends its guest. curl is real: the guest reaches moto's S3 through presigned URLs.

Each guest's GPUCLOUD_IMDS_ENDPOINT points at the simulator's own instance metadata service
(IMDSv2: token, `spot/instance-action`, `ami-launch-index`), never at the host's: the bootstrap's
guard polls `spot/instance-action`, which answers 404 until `preempt(instance_id)` (EC2's
interruption notice, two minutes ahead on EC2) and the notice JSON from then on.

An instance launched with a KeyName gets the key pair's public half as its session key: a test's
`sshd_port(instance_id)` starts the guest's own sshd (vm_sim.py), which admits that key only; the
test maps the instance's public address to that port in the user's ssh_config.

Multi-node: the N instances of one RunInstances call boot the same user-data; each guest gets
`GPUCLOUD_NODE_RANK=<AmiLaunchIndex>` (what a real node reads from IMDS `ami-launch-index`) and
`GPUCLOUD_NODE_IP=127.0.0.1` (its "private address": every guest lives on this host's loopback).
"""

from __future__ import annotations

import base64
import gzip
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.aws_faults import unhooked
from tests.support.moto_server import ACCOUNT, Moto, _catalog_regions
from tests.support.vm_sim import GPU_NAMES, Guest, GuestSimulator, gpu_of

_CLIENTS: dict[tuple[str, str, str], Any] = {}
_SESSIONS: dict[str, Any] = {}
_CLIENTS_LOCK = threading.Lock()


def _client(endpoint: str, region: str, service: str = "ec2") -> Any:
    """Unhooked clients, shared by every simulator of the process, made from one session so
    that botocore reads each service's model once (a model is ~0.3 s of JSON per session)."""
    with _CLIENTS_LOCK:
        key = (endpoint, region, service)
        if key not in _CLIENTS:
            import boto3

            if endpoint not in _SESSIONS:
                with unhooked():
                    _SESSIONS[endpoint] = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing")
            _CLIENTS[key] = _SESSIONS[endpoint].client(service, region_name=region, endpoint_url=endpoint)
        return _CLIENTS[key]


def instance_states(region: str) -> frozenset[tuple[str, str, bool]]:
    """(instance id, state, tagged gpucloud-run) of every instance moto's EC2 holds in `region`,
    read in this process: the poller asks the API only when this changed since its last scan."""
    from moto.ec2.models import ec2_backends

    account = ec2_backends[ACCOUNT]
    if region not in account.keys():
        return frozenset()
    ec2 = account[region]
    return frozenset(
        (i.id, i.state, "gpucloud-run" in ec2.tags.get(i.id, {}))
        for r in list(ec2.reservations.values())
        for i in list(r.instances)
    )


IMDS_TOKEN = "sim-imds-token"
ROLE_TTL_S = 5.0  # how long IMDS keeps the answer to "which role has this instance's profile"
CREDS_PATH = "latest/meta-data/iam/security-credentials/"
SPOT_ACTION_FILE = "imds-spot-instance-action"


def http_reply(handler: BaseHTTPRequestHandler, code: int, body: str = "") -> None:
    """A plain-text reply of a stub HTTP server."""
    data = body.encode()
    handler.send_response(code)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class _Imds(BaseHTTPRequestHandler):
    """IMDSv2 of the simulated instances: `/<instance id>/latest/...`."""

    sim: AwsVmSimulator

    def _reply(self, code: int, body: str = "") -> None:
        http_reply(self, code, body)

    def do_PUT(self) -> None:  # noqa: N802
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        ok = self.path.endswith("/latest/api/token") and ttl
        data = (IMDS_TOKEN if ok else "").encode()
        self.send_response(200 if ok else 400)
        if ok:  # as EC2 answers: an SDK without it falls back to IMDSv1 (no token)
            self.send_header("X-aws-ec2-metadata-token-ttl-seconds", str(ttl))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        self.sim.imds_log.append(("GET", self.path, self.headers.get("X-aws-ec2-metadata-token") or ""))
        iid, _, path = self.path.lstrip("/").partition("/")
        guest = self.sim.guest(iid)
        if guest is None and iid == "latest":  # an SDK keeps the endpoint's host only (aws-sdk-go)
            guest, path = self.sim.only_guest(), self.path.lstrip("/")
        if guest is None or self.headers.get("X-aws-ec2-metadata-token") != IMDS_TOKEN:
            self._reply(401 if guest else 404)
        elif path == "latest/meta-data/spot/instance-action":
            self.sim.imds_polls += 1
            notice = guest.sandbox / SPOT_ACTION_FILE
            self._reply(200, notice.read_text()) if notice.exists() else self._reply(404)
        elif path == "latest/meta-data/ami-launch-index":
            self._reply(200, guest.meta.get("rank", "0"))
        elif path.startswith(CREDS_PATH):
            self._credentials(guest, path[len(CREDS_PATH) :])
        else:
            self._reply(404)

    def _credentials(self, guest: Guest, role: str) -> None:
        """The instance profile's role (a listing) or its credentials (EC2's document), or 404
        for an instance without a profile, as on EC2."""
        name = self.sim.role_of(guest)
        if name is None or role not in ("", name):
            self._reply(404)
        elif not role:
            self._reply(200, name)
        else:
            self.sim.creds_served += 1
            self._reply(200, json.dumps(self.sim.role_credentials(guest, name)))

    def log_message(self, *args: object) -> None:
        pass


class AwsVmSimulator(GuestSimulator):
    def __init__(self, moto: Moto, root: Path, *, poll_s: float = 0.3, regions: list[str] | None = None) -> None:
        super().__init__(root)
        self.moto = moto
        self.poll_s = poll_s
        self.regions = regions or _catalog_regions()
        self._seen: dict[str, frozenset[tuple[str, str, bool]]] = {}  # region -> instances at its last scan
        self.booted: list[str] = []
        self.region_of: dict[str, str] = {}
        self.shutdowns: list[str] = []
        self.errors: list[str] = []
        self.imds_polls = 0  # GETs of spot/instance-action (the bootstrap's guard)
        self.creds_served = 0  # role credential documents served by IMDS
        self._roles: dict[str, tuple[str | None, float]] = {}  # guest -> (its profile's role, when asked)
        self.imds_log: list[tuple[str, str, str]] = []  # (method, path, token) of each IMDS GET, for a failing test
        self.creds_s = 3600  # lifetime of the role credentials IMDS serves (STS, from moto)
        self._creds_cache: dict[tuple[str, str], tuple[dict[str, str], float]] = {}  # (guest, role) -> (doc, expiry)
        self.extra_env: dict[str, str] = {}  # more environment for every guest (a proxy in front of S3)
        self.on_credentials: list[Any] = []  # called with each (key id, secret, token, expiry epoch) served
        handler = type("Imds", (_Imds,), {"sim": self})
        self._imds = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self._imds.serve_forever, name="aws-sim-imds", daemon=True).start()
        self._poller = threading.Thread(target=self._poll, name="aws-sim-poller", daemon=True)
        self._poller.start()

    # ---- the fake cloud side ----------------------------------------------------------------------
    def ec2(self, region: str) -> Any:
        return _client(self.moto.endpoint, region)

    def _poll(self) -> None:
        """DescribeInstances in each region whose instances changed (ids, states, tags) since its
        last scan: what the scan does depends only on those, so an unchanged region is skipped."""
        while not self._stop.wait(self.poll_s):
            for region in self.regions:
                try:
                    now = instance_states(region)
                    if self._seen.get(region) == now:
                        continue
                    self._scan(region, self.ec2(region))
                    self._seen[region] = now
                except Exception as exc:  # noqa: BLE001 - a hiccup must not kill the simulator
                    self.errors.append(f"{region}: {exc}")

    def _scan(self, region: str, ec2: Any) -> None:
        out = ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": ["gpucloud-run"]}])
        for res in out.get("Reservations", []):
            for inst in res.get("Instances", []):
                iid, state = inst["InstanceId"], inst["State"]["Name"]
                with self.lock:
                    known = iid in self.guests or iid in self._gone
                if state in ("pending", "running") and not known:
                    self.region_of[iid] = region
                    self._boot(region, ec2, inst)
                elif state in ("shutting-down", "terminated", "stopped", "stopping") and iid in self.guests:
                    self.end_guest(iid)
                elif state in ("shutting-down", "terminated") and not known:
                    with self.lock:
                        self._gone.add(iid)

    def _boot(self, region: str, ec2: Any, inst: dict[str, Any]) -> None:
        iid = inst["InstanceId"]
        attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")
        raw = base64.b64decode(attr.get("UserData", {}).get("Value", "") or b"")
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        if not raw:
            with self.lock:
                self._gone.add(iid)  # no user-data: the instance just idles
            return
        itype = inst["InstanceType"]
        gpu, count = gpu_of("aws", itype)
        env = {
            "GPUCLOUD_NODE_RANK": str(inst.get("AmiLaunchIndex", 0)),
            "GPUCLOUD_NODE_IP": "127.0.0.1",
            "GPUCLOUD_IMDS_ENDPOINT": f"http://127.0.0.1:{self._imds.server_address[1]}/{iid}",
            **self.extra_env,
        }
        guest = self.boot_guest(
            iid,
            raw.decode(),
            gpu=gpu,
            gpu_count=count,
            env=env,
            name=f"{region}-{iid}",
            disk=self._image_disk(region, inst.get("ImageId", "")),
        )
        if guest is None:
            return
        guest.ssh_key = self._public_key(region, inst.get("KeyName") or "")
        guest.meta.update(
            instance_type=itype,
            region=region,
            gpu_name=GPU_NAMES.get(gpu, f"NVIDIA {gpu}"),
            user_data_bytes=str(len(raw)),
            rank=env["GPUCLOUD_NODE_RANK"],
            zone=(inst.get("Placement") or {}).get("AvailabilityZone", ""),
            profile=str((inst.get("IamInstanceProfile") or {}).get("Arn", "")).rsplit("/", 1)[-1],
        )
        self.booted.append(iid)

    def _public_key(self, region: str, key_name: str) -> str:
        """The public half of the instance's key pair (what cloud-init installs for the login user);
        "" for an instance launched without one. moto runs in this process and keeps it."""
        from moto.ec2.models import ec2_backends

        pair = ec2_backends[ACCOUNT][region].key_pairs.get(key_name) if key_name else None
        public = getattr(pair, "material_public", b"") or b""
        return public.decode() if isinstance(public, bytes) else str(public)

    def _image_disk(self, region: str, image_id: str) -> Path | None:
        """An AMI made by CreateImage from a simulated instance carries that instance's disk: its
        guest's stub state (moto runs in this process; its AMI records the source instance)."""
        from moto.ec2.models import ec2_backends

        ami = ec2_backends[ACCOUNT][region].amis.get(image_id)
        source = getattr(ami, "instance_id", None)
        with self.lock:
            guest = self.guests.get(source) if source else None
        return guest.sandbox / "stub-state" if guest is not None else None

    def on_guest_shutdown(self, guest: Guest) -> None:
        """EC2 with shutdown behaviour terminate: the guest's `shutdown -h now` ends the instance."""
        region = self.region_of.get(guest.vm_id, "us-east-1")
        try:
            self.ec2(region).terminate_instances(InstanceIds=[guest.vm_id])
        except Exception as exc:  # noqa: BLE001
            self.errors.append(f"terminate {guest.vm_id}: {exc}")
        with self.lock:
            self._gone.add(guest.vm_id)
            guest.ended = True
        self.shutdowns.append(guest.vm_id)  # last: a test that sees it finds the instance already ended

    def role_of(self, guest: Guest) -> str | None:
        """The role of the guest's instance profile (IAM, as EC2 resolves it), or None; an answer
        is kept ROLE_TTL_S, so that IMDS answers at once (rclone's IMDS client waits 1 s) on a
        loaded machine, and a deleted profile still shows within seconds."""
        now = time.time()
        kept = self._roles.get(guest.vm_id)
        if kept is not None and now - kept[1] < ROLE_TTL_S:
            return kept[0]
        name = self._role_of(guest)
        if name is not None:  # an instance whose profile is not seen yet is asked again next time
            self._roles[guest.vm_id] = (name, now)
        return name

    def _role_of(self, guest: Guest) -> str | None:
        profile = guest.meta.get("profile", "") or self._profile_now(guest)
        if not profile:
            return None
        iam = _client(self.moto.endpoint, "us-east-1", "iam")
        try:
            roles = iam.get_instance_profile(InstanceProfileName=profile)["InstanceProfile"]["Roles"]
        except Exception:  # noqa: BLE001 - a deleted profile: no credentials, as on EC2
            return None
        return str(roles[0]["RoleName"]) if roles else None

    def _profile_now(self, guest: Guest) -> str:
        """The instance's profile asked again: a scan that met the instance while RunInstances was
        still under way (moto adds the profile after the instance) saw none."""
        try:
            out = self.ec2(guest.meta.get("region", "us-east-1")).describe_instances(InstanceIds=[guest.vm_id])
            inst = out["Reservations"][0]["Instances"][0]
        except Exception:  # noqa: BLE001 - gone: no profile, as on EC2
            return ""
        guest.meta["profile"] = str((inst.get("IamInstanceProfile") or {}).get("Arn", "")).rsplit("/", 1)[-1]
        return guest.meta["profile"]

    def role_credentials(self, guest: Guest, role: str) -> dict[str, str]:
        """Short-lived credentials of the role from moto's STS, in IMDS's document format. Like EC2's
        IMDS, the same document is served again until 5 minutes before it expires: an SDK's IMDS
        client (rclone's: 1 s) must not wait for an STS call on a loaded machine."""
        key, now = (guest.vm_id, role), time.time()
        cached = self._creds_cache.get(key)
        if cached is not None and cached[1] - now > 300:
            return cached[0]
        doc = self._fresh_credentials(guest, role)
        self._creds_cache[key] = (doc, now + self.creds_s)
        return doc

    def _fresh_credentials(self, guest: Guest, role: str) -> dict[str, str]:
        sts = _client(self.moto.endpoint, "us-east-1", "sts")
        arn = f"arn:aws:iam::{ACCOUNT}:role/gpucloud/{guest.meta.get('region', '')}/{role}"
        creds = sts.assume_role(RoleArn=arn, RoleSessionName=guest.vm_id, DurationSeconds=self.creds_s)["Credentials"]
        expires = time.time() + self.creds_s
        for hook in self.on_credentials:
            hook(creds["AccessKeyId"], creds["SecretAccessKey"], creds["SessionToken"], expires)
        return {
            "Code": "Success",
            "Type": "AWS-HMAC",
            "AccessKeyId": creds["AccessKeyId"],
            "SecretAccessKey": creds["SecretAccessKey"],
            "Token": creds["SessionToken"],
            "Expiration": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires)),
        }

    def guest(self, instance_id: str) -> Guest | None:
        with self.lock:
            return self.guests.get(instance_id)

    def only_guest(self) -> Guest | None:
        """The one running guest (IMDS asked without an instance prefix), None when not exactly one."""
        with self.lock:
            alive = list(self.guests.values())
        alive = [g for g in alive if not g.ended]
        return alive[0] if len(alive) == 1 else None

    def preempt(self, instance_id: str, action: str = "terminate") -> None:
        """EC2's spot interruption notice for one instance, as its IMDS shows it."""
        guest = self.guest(instance_id)
        assert guest is not None, f"no guest {instance_id}"
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
        (guest.sandbox / SPOT_ACTION_FILE).write_text(json.dumps({"action": action, "time": when}))

    def stop(self) -> None:
        super().stop()
        self._poller.join(timeout=5)
        self._imds.shutdown()


@pytest.fixture
def aws_sim(moto: Moto, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AwsVmSimulator]:  # noqa: F811
    sim = AwsVmSimulator(moto, tmp_path_factory.mktemp("aws-vms"))
    try:
        yield sim
    finally:
        sim.stop()
