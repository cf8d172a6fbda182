"""The Azure node authenticates as itself, for its run only (docs/PROVIDERS.md, "Azure node identity").

Peers: the fake ARM (role assignments with their RBAC actions; its IMDS mints storage JWTs), Azurite
over https with OAuth on, and a front before it (tests/support/blob_front.py) that authorises each
Bearer request by the principal's role assignments and their ABAC condition, stricter than Azure,
and that refuses every SAS once a test says the CLI's grants are dead.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from tests.support.azure_fixtures import (  # noqa: F401  (fixtures)
    OperatorCredential,
    arm,
    fake_arm_server,
    journal,
    launch_request,
    wait_until,
)
from tests.support.azure_runs import write_azure_job
from tests.support.azure_sim import AzureVmSimulator, azure_sim  # noqa: F401
from tests.support.azurite import Azurite, azurite_binary, self_signed_cert, start_azurite
from tests.support.blob_front import BlobFront
from tests.support.cli import cli
from tests.support.fake_arm import BLOB_CONTRIBUTOR_ROLE, FakeArm, Resource

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]
REPO = Path(__file__).resolve().parents[3]
REGION = "eastus"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def oauth_azurite(tmp_path_factory: pytest.TempPathFactory, tls: tuple[Path, Path]) -> Iterator[Azurite]:
    if azurite_binary() is None:
        pytest.skip("Azurite is not installed: run `npm install --no-save azurite` in the repository root")
    server = start_azurite(tmp_path_factory.mktemp("azurite-oauth"), tls=tls)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def front(arm: FakeArm, oauth_azurite: Azurite, tls: tuple[Path, Path]) -> Iterator[BlobFront]:  # noqa: F811
    f = BlobFront(arm, oauth_azurite.port, *tls)
    try:
        yield f
    finally:
        f.stop()


@pytest.fixture
def node_role(arm: FakeArm) -> str:  # noqa: F811
    """`gpucloud setup azure` has made the node role (its PUT body, as setup sends it): its id."""
    from gpucloud.providers.azure.rbac import arm_body, node_role_definition, node_role_id
    from gpucloud.providers.azure.setup import node_role_path

    sub = arm.subscription_id
    path = node_role_path(sub)
    doc = {"id": path, "name": node_role_id(sub), **arm_body(sub, node_role_definition(sub))}
    with arm.lock:
        arm.role_definitions[path.lower()] = doc
    return node_role_id(sub)


@pytest.fixture
def provider(
    arm: FakeArm,  # noqa: F811
    front: BlobFront,
    tls: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    node_role: str,
) -> Any:
    from gpucloud.providers.azure import AzureProvider

    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls[0]))
    return AzureProvider(
        credential=OperatorCredential(arm),
        subscription_id=arm.subscription_id,
        arm_endpoint=arm.url,
        blob_endpoint=front.blob_endpoint,
    )


def channel_assignments(arm: FakeArm) -> list[dict[str, Any]]:  # noqa: F811
    """Every role assignment on a channel container (whatever its role)."""
    with arm.lock:
        return [
            r.body
            for r in arm.resources.values()
            if r.type.lower() == "microsoft.authorization/roleassignments"
            and "/blobservices/default/containers/" in str(r.body["properties"].get("scope", "")).lower()
        ]


def storage_token(arm: FakeArm, principal: str) -> str:  # noqa: F811
    """The VM's token, from its IMDS as the agent asks for it."""
    url = f"{arm.imds_endpoint(principal)}/metadata/identity/oauth2/token?api-version=2018-02-01&resource="
    req = urllib.request.Request(url + "https%3A%2F%2Fstorage.azure.com%2F", headers={"Metadata": "true"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return str(json.loads(resp.read())["access_token"])


def arm_token(arm: FakeArm, principal: str) -> str:  # noqa: F811
    """The VM's ARM token, from its IMDS (what a job on the VM can take)."""
    from urllib.parse import quote

    url = f"{arm.imds_endpoint(principal)}/metadata/identity/oauth2/token?api-version=2018-02-01&resource="
    req = urllib.request.Request(url + quote(arm.url, safe=""), headers={"Metadata": "true"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return str(json.loads(resp.read())["access_token"])


def arm_delete(arm: FakeArm, token: str, path: str) -> int:  # noqa: F811
    """One ARM DELETE with `token`: the HTTP status."""
    req = urllib.request.Request(
        f"{arm.url}{path}?api-version=2023-01-01", method="DELETE", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def as_node(front: BlobFront, tls: tuple[Path, Path], token: str, method: str, blob: str, data: bytes = b"") -> int:
    """One Blob REST call with the node's token: the HTTP status."""
    headers = {"Authorization": f"Bearer {token}", "x-ms-version": "2022-11-02"}
    if method == "PUT":
        headers["x-ms-blob-type"] = "BlockBlob"
    req = urllib.request.Request(
        f"{front.blob_endpoint}/gpucloud/{blob}", data=data if method == "PUT" else None, method=method, headers=headers
    )
    try:
        with urllib.request.urlopen(req, timeout=10, context=ssl.create_default_context(cafile=str(tls[0]))) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_node_identity_reaches_its_run_only_and_goes_at_teardown(
    arm: FakeArm,  # noqa: F811
    front: BlobFront,
    provider: Any,
    journal: Any,  # noqa: F811
    tls: tuple[Path, Path],
    node_role: str,
) -> None:
    run, other = "idt-20261207-000000-aaaa", "idt-20261207-000000-bbbb"
    channel = provider.channel(REGION)
    handle = provider.provision(launch_request(run), journal)
    (assignment,) = channel_assignments(arm)
    assert assignment["properties"]["scope"].endswith("/blobServices/default/containers/gpucloud")
    assert assignment["properties"]["roleDefinitionId"].endswith(f"/roleDefinitions/{node_role}")
    from gpucloud.providers.azure.rbac import assignment_condition

    condition = assignment_condition(arm.subscription_id)
    assert node_role in condition, "the runner role may assign the node role"
    assert BLOB_CONTRIBUTOR_ROLE not in condition, "and not the built-in one, whose Actions reach the container"
    assert [r.kind for r in journal.resources(run)].count("channel_access") == 1
    (vm,) = arm.vms()
    token = storage_token(arm, vm.body["identity"]["principalId"])
    channel.put_bytes(f"runs/{run}/node-0/status.json", b"{}")
    channel.put_bytes(f"runs/{other}/node-0/status.json", b"{}")
    assert as_node(front, tls, token, "GET", f"runs/{run}/node-0/status.json") == 200
    assert as_node(front, tls, token, "PUT", f"runs/{run}/node-0/status.json", b"{}") == 201
    assert as_node(front, tls, token, "PUT", f"runs/{run}/checkpoint/slot-0.tar.gz", b"x") == 201
    # Another run's prefix, this run's inputs, deletes: refused by the condition.
    assert as_node(front, tls, token, "GET", f"runs/{other}/node-0/status.json") == 403
    for blob in ("code.tar.gz", "agent.tar.gz", "node-0/manifest", "node-0/secrets.sealed", "node-0/request"):
        assert as_node(front, tls, token, "PUT", f"runs/{run}/{blob}", b"x") == 403, blob
    assert as_node(front, tls, token, "DELETE", f"runs/{run}/node-0/status.json") == 403
    assert as_node(front, tls, token, "GET", "other/x") == 403
    provider.teardown(handle, journal)
    assert channel_assignments(arm) == [], "teardown deletes the channel assignment"
    assert not journal.resources(run, alive_only=True)
    assert as_node(front, tls, token, "GET", f"runs/{run}/node-0/status.json") == 403
    with arm.lock:
        actions = [a for a in arm.actions if a and "roleAssignments" in a]
    assert "Microsoft.Authorization/roleAssignments/write" in actions
    assert "Microsoft.Authorization/roleAssignments/delete" in actions


@pytest.mark.parametrize(("why", "nodes"), [("refused", 1), ("no-role", 1), ("no-role", 3)])
def test_without_the_channel_assignment_the_node_keeps_its_sas_and_the_run_goes_on(
    arm: FakeArm,  # noqa: F811
    provider: Any,
    journal: Any,  # noqa: F811
    why: str,
    nodes: int,
) -> None:
    """`refused`: a runner role assigned with an older condition is refused the channel assignment
    (AuthorizationFailed). `no-role`: setup not run, so ARM answers RoleDefinitionDoesNotExist. The
    launch goes on, the journal says why once for the whole run (naming every node and the fix),
    teardown has nothing to delete."""
    run = f"idt-20261207-000000-{'cccc' if why == 'refused' else 'ffff'}{nodes}"
    provider.channel(REGION)
    if why == "refused":
        arm.inject(
            "PUT", r"/containers/gpucloud/providers/Microsoft\.Authorization/roleAssignments/", "AuthorizationFailed"
        )
    else:
        with arm.lock:
            arm.role_definitions.clear()
    handle = provider.provision(launch_request(run, nodes=nodes), journal)
    assert channel_assignments(arm) == [] and len(arm.vms()) == nodes
    said = [e.message for e in journal.store.events(run) if "SAS URLs only" in e.message]
    fix = "assign the runner role again" if why == "refused" else "`gpucloud setup azure`"
    assert len(said) == 1 and fix in said[0], journal.store.events(run)
    who = "node-0 reaches its" if nodes == 1 else "node-0, node-1, node-2 reach their"
    assert said[0].startswith(f"{who} channel through the CLI's SAS URLs only"), said
    assert not [r for r in journal.resources(run, alive_only=True) if r.kind == "channel_access"]
    provider.teardown(handle, journal)
    assert not journal.resources(run, alive_only=True)


def test_the_node_token_cannot_touch_the_container_or_other_runs_where_the_builtin_role_could(
    arm: FakeArm,  # noqa: F811
    front: BlobFront,
    provider: Any,
    journal: Any,  # noqa: F811
    tls: tuple[Path, Path],
    node_role: str,
) -> None:
    """A job takes its VM's ARM and storage tokens from IMDS: with the node role it can delete
    neither the region's channel container (ARM) nor another run's blob, nor one of its own; the
    built-in Storage Blob Data Contributor, with the very same condition, lets the ARM token delete
    the whole container (its control-plane Actions are not narrowed by any condition)."""
    from gpucloud.providers.azure.node_access import container_scope, description, node_condition

    run, other = "idt-20261207-000000-dddd", "idt-20261207-000000-eeee"
    channel = provider.channel(REGION)
    handle = provider.provision(launch_request(run), journal)
    (vm,) = arm.vms()
    principal = vm.body["identity"]["principalId"]
    scope = container_scope(arm.subscription_id, REGION)
    channel.put_bytes(f"runs/{other}/node-0/status.json", b"{}")
    channel.put_bytes(f"runs/{run}/node-0/status.json", b"{}")
    storage = storage_token(arm, principal)
    assert as_node(front, tls, storage, "DELETE", f"runs/{other}/node-0/status.json") == 403
    assert as_node(front, tls, storage, "DELETE", f"runs/{run}/node-0/status.json") == 403
    assert as_node(front, tls, storage, "PUT", f"runs/{other}/node-0/status.json", b"x") == 403
    token = arm_token(arm, principal)
    assert arm_delete(arm, token, scope) == 403, "the node role has no control-plane Actions"
    assert arm.deleted_containers == []
    # The shape this replaced: the built-in role with the same condition, for the same identity.
    _assignment(arm, str(uuid4()), description(run), node_condition(run), BLOB_CONTRIBUTOR_ROLE, principal)
    assert arm_delete(arm, token, scope) == 200, "the fake models the built-in role's container Actions"
    assert arm.deleted_containers == [scope]
    provider.teardown(handle, journal)


def _assignment(
    arm: FakeArm,  # noqa: F811
    name: str,
    description: str,
    condition: str | None,
    role: str,
    principal: str | None = None,
) -> str:
    """A channel role assignment put straight into the fake (by default its VM, and so its
    principal, is gone)."""
    from gpucloud.providers.azure.node_access import container_scope

    scope = container_scope(arm.subscription_id, REGION)
    path = f"{scope}/providers/Microsoft.Authorization/roleAssignments/{name}"
    props: dict[str, Any] = {
        "roleDefinitionId": f"/subscriptions/{arm.subscription_id}/providers/Microsoft.Authorization"
        f"/roleDefinitions/{role}",
        "principalId": principal or f"principal-{name}",
        "scope": scope,
        "description": description,
    }
    if condition is not None:
        props.update(condition=condition, conditionVersion="2.0")
    doc = {"id": path, "name": name, "type": "Microsoft.Authorization/roleAssignments", "properties": props}
    with arm.lock:
        arm.resources[path.lower()] = Resource(
            id=path, type="Microsoft.Authorization/roleAssignments", body=doc, rg=f"{arm.subscription_id}/x"
        )
    return path


def test_gc_removes_the_channel_assignment_of_an_ended_run_only(
    arm: FakeArm,  # noqa: F811
    provider: Any,
    node_role: str,
) -> None:
    from gpucloud.contract.tags import GcIncomplete
    from gpucloud.providers.azure.node_access import description, node_condition

    provider.channel(REGION)
    ended, live = "ended-20261207-000000-aaaa", "live-20261207-000000-bbbb"
    provider.resource.resource_groups.create_or_update(
        f"gpucloud-{live}-{REGION}",
        {"location": REGION, "tags": {"gpucloud-run": live, "gpucloud-expires": "2099-01-01T00:00:00Z"}},
    )
    n = "00000000-0000-0000-0000-00000000e0d"
    gone = _assignment(arm, f"{n}1", description(ended), node_condition(ended), node_role)
    kept = [
        _assignment(arm, f"{n}2", description(live), node_condition(live), node_role),
        _assignment(arm, f"{n}3", "someone else's reader", None, node_role),
        _assignment(arm, f"{n}4", description(ended), "(a changed condition)", node_role),
        # The same description and condition with another role (the built-in): not gpucloud's shape.
        _assignment(arm, f"{n}5", description(ended), node_condition(ended), BLOB_CONTRIBUTOR_ROLE),
    ]
    now = datetime.now(UTC)
    arm.inject("GET", r"/resourcegroups$", code="InternalServerError", times=20)
    with pytest.raises(GcIncomplete) as info:  # groups not all seen: no run counts as ended
        provider.gc(now, dry_run=False)
    assert not [line for line in info.value.lines if line.startswith("deleted")]
    assert len(channel_assignments(arm)) == 5
    arm.clear_injections()
    dry = provider.gc(now, dry_run=True)
    assert [line for line in dry if "role-assignment" in line] == [
        f"would delete azure/{REGION}/role-assignment/{gone.rsplit('/', 1)[-1]} (run {ended}, node channel access)"
    ]
    lines = provider.gc(now, dry_run=False)
    assert any(line.startswith("deleted") and ended in line for line in lines), lines
    left = sorted(a["id"] for a in channel_assignments(arm))
    assert left == sorted(kept), "only the ended run's assignment goes"


def test_run_outlives_the_clis_sas_through_the_node_identity(
    arm: FakeArm,  # noqa: F811
    azure_sim: AzureVmSimulator,  # noqa: F811
    front: BlobFront,
    tls: tuple[Path, Path],
    gpucloud_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    node_role: str,
) -> None:
    """The CLI's SAS URLs are refused from the node's first log part on (its first SAS, the
    manifest's, and the agent's boot went through); the run still streams its log to the end and
    delivers its final status and artifacts, through the node's own token."""
    import os

    monkeypatch.chdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUCLOUD_TEST_"))}
    env.update(arm.client_env())
    env.update(
        GPUCLOUD_AZURE_BLOB_ENDPOINT=front.blob_endpoint,
        REQUESTS_CA_BUNDLE=str(tls[0]),
        GPUCLOUD_HOME=str(gpucloud_home),
        CI="true",
        PYTHONPATH=str(REPO),
    )
    azure_sim.extra_env = {"CURL_CA_BUNDLE": str(tls[0])}
    arm.storage_token_seconds = 303  # the agent reads a token again 300 s before it expires: every 3 s here
    job = write_azure_job(
        tmp_path / "job.yaml",
        run="for i in 1 2 3 4 5 6 7 8; do echo tick-$i; sleep 0.5; done; echo made > out.txt",
        artifacts="[out.txt]",
        max_duration="2m",
    )

    def log_landed() -> bool:
        return any(s.blob.endswith("log.append") and s.status == 201 and s.auth != "key" for s in list(front.seen))

    def refuse_sas_once_the_log_flows() -> None:
        wait_until(
            log_landed,
            timeout=90,
            interval=0.02,
        )
        front.refuse_sas = True

    flip = threading.Thread(target=refuse_sas_once_the_log_flows, daemon=True)
    flip.start()
    t0 = time.monotonic()
    proc = cli("run", str(job), "--cloud", "azure", "--json", timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert front.refuse_sas, "the CLI's grants were refused during the run"
    doc = json.loads(proc.stdout)
    assert doc["status"] == "succeeded", doc
    assert "tick-8" in proc.stderr, "the log streamed to its end"
    assert (Path(doc["artifacts_dir"]) / "out.txt").read_text().strip() == "made"
    bearer = [(s.method, s.blob.rsplit("/", 1)[-1], s.status) for s in front.requests("bearer")]
    for blob in ("status.json", "log.append", "artifacts.tar.gz"):
        assert any(b == blob and st == 201 for _, b, st in bearer), (blob, bearer)
    assert arm.storage_tokens >= 2, "the token was read again before it expired"
    assert channel_assignments(arm) == [], "the run's teardown deleted its channel assignment"
    print(f"run with the identity: {time.monotonic() - t0:.1f} s")
