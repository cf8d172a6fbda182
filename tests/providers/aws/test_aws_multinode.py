"""Multi-node runs on AWS, against moto, the placement-group hooks and the VM simulator.

- Provider level: N nodes come from ONE RunInstances call (MinCount = MaxCount = N) into a cluster
  placement group created with the run (journalled before the call, tagged) and deleted at teardown
  once the instances are terminated; they boot one shared user-data; ranks follow AmiLaunchIndex and
  node_states answers N states in that order. The security group lets the group itself in (the
  run's own nodes) and nothing else; a single node keeps no inbound rule at all. A capacity error
  moves the whole group to the next zone, never splitting it; with no zone left nothing remains.
  `gc` sweeps an expired placement group.
- Lifecycle level: a capacity error everywhere in the first region moves both nodes to the next.
- End to end: examples/ddp-2-nodes.yaml on two simulated EC2 instances; they find their ranks from
  the launch index, meet at the barrier through moto's S3 and report the same final loss; nothing of
  the run remains (instances, security group, placement group).
"""

from __future__ import annotations

import json
import re
import socket
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucloud.contract.provider import TAG_EXPIRES, TAG_RUN, CapacityError
from tests.support.aws_faults import HOOKS, AwsHooks, Call, Fault, install
from tests.support.aws_requests import REGION, multinode_request
from tests.support.aws_runs import invoke, run_id_in  # noqa: F401
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive, user_data_of  # noqa: F401

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


@pytest.fixture
def hooks(moto: Moto) -> Any:  # noqa: F811
    from gpucloud.providers.aws import reset_shared

    install()
    HOOKS.reset()
    reset_shared(channels_only=True)
    yield HOOKS
    HOOKS.reset()


@pytest.fixture
def provider(moto: Moto, hooks: AwsHooks) -> Any:  # noqa: F811
    from gpucloud.providers.aws import AwsProvider

    p = AwsProvider(retry_base_s=0.01, poll_s=0.05, sleep=lambda s: None, public_ip=lambda: "203.0.113.7")
    p.TERMINATE_TIMEOUT_S = p.SG_DELETE_TIMEOUT_S = p.PG_DELETE_TIMEOUT_S = 5.0
    return p


@pytest.fixture
def journal(gpucloud_home: Path) -> Any:
    from gpucloud.state.runs_db import Journal, Store

    return Journal(Store())


_counter = iter(range(10_000))


def instances(moto: Moto, ids: list[str], region: str = REGION) -> list[dict[str, Any]]:  # noqa: F811
    out = moto.client("ec2", region).describe_instances(InstanceIds=ids)
    by_id = {i["InstanceId"]: i for r in out["Reservations"] for i in r["Instances"]}
    return [by_id[i] for i in ids]


def tags_of(obj: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in obj.get("Tags", [])}


def inbound(moto: Moto, sg_id: str, region: str = REGION) -> list[dict[str, Any]]:  # noqa: F811
    return moto.client("ec2", region).describe_security_groups(GroupIds=[sg_id])["SecurityGroups"][0]["IpPermissions"]


# ---- provider level --------------------------------------------------------------------------------


def test_four_nodes_come_from_one_call_in_one_placement_group(
    moto: Moto,
    provider: Any,
    journal: Any,  # noqa: F811
    hooks: AwsHooks,
) -> None:
    n = 4
    req = multinode_request(n)
    pg_name = f"gpucloud-{req.run_id}-0"
    journalled: list[bool] = []

    def watch(call: Call) -> None:  # the placement group is in the journal before AWS hears of it
        if call.operation == "CreatePlacementGroup":
            journalled.append(
                any(r.kind == "placement-group" and r.name == pg_name for r in journal.resources(req.run_id))
            )

    hooks.on_call = watch
    handle = provider.provision(req, journal)
    ids = handle.nodes
    assert handle.resources["placement-group"] == [pg_name] and len(handle.resources["security-group"]) == 1
    (run,) = hooks.ops("RunInstances")
    assert run.params["MinCount"] == run.params["MaxCount"] == n, "all or nothing, in one call"
    assert run.params["Placement"] == {"GroupName": pg_name}
    assert journalled == [True]

    insts = instances(moto, ids)
    assert [i["AmiLaunchIndex"] for i in insts] == list(range(n)), "ids in rank (launch index) order"
    assert len({i["Placement"]["AvailabilityZone"] for i in insts}) == 1 and len({i["SubnetId"] for i in insts}) == 1
    assert len({user_data_of(moto, i) for i in ids}) == 1, "every node boots the same script"
    for inst in insts:
        assert tags_of(inst)[TAG_RUN] == req.run_id and TAG_EXPIRES in tags_of(inst)

    (pg,) = [g for g in hooks.placement.groups(REGION) if g["GroupName"] == pg_name]
    assert pg["Strategy"] == "cluster" and pg["State"] == "available"
    assert tags_of(pg) == {
        TAG_RUN: req.run_id,
        TAG_EXPIRES: req.tags[TAG_EXPIRES],
        "Name": pg_name,
        "gpucloud-attempt": "0",
    }
    assert sorted(pg["Instances"]) == sorted(ids)
    (pg_rec,) = [r for r in journal.resources(req.run_id) if r.kind == "placement-group"]
    assert pg_rec.cloud_id == pg["GroupId"]
    assert provider.node_states(handle) == ["running"] * n

    # As on EC2, the group cannot go while its instances live: teardown must terminate first.
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError, match="InvalidPlacementGroup.InUse"):
        provider.client("ec2", REGION).delete_placement_group(GroupName=pg_name)
    provider.teardown(handle, journal)
    deletes = hooks.ops("DeletePlacementGroup")
    assert [c.injected for c in deletes] == ["InvalidPlacementGroup.InUse", "placement-group-fake"]
    assert tagged_alive(moto, req.run_id) == [] and not hooks.placement.groups(REGION)
    assert not journal.resources(req.run_id, alive_only=True)
    assert provider.node_states(handle) == ["gone"] * n


def test_security_group_lets_in_only_the_runs_own_nodes(
    moto: Moto,
    provider: Any,
    journal: Any,  # noqa: F811
    hooks: AwsHooks,
) -> None:
    multi, single = multinode_request(2), multinode_request(1)
    handles = [provider.provision(req, journal) for req in (multi, single)]
    try:
        groups = {c.params["GroupName"]: c for c in hooks.ops("CreateSecurityGroup")}
        sg_multi = moto.client("ec2").describe_security_groups(
            Filters=[{"Name": f"tag:{TAG_RUN}", "Values": [multi.run_id]}]
        )["SecurityGroups"][0]
        (rule,) = inbound(moto, sg_multi["GroupId"])
        assert rule["IpProtocol"] == "-1"
        assert [p["GroupId"] for p in rule["UserIdGroupPairs"]] == [sg_multi["GroupId"]], "source: the group itself"
        assert rule["IpRanges"] == rule["Ipv6Ranges"] == rule["PrefixListIds"] == []
        sg_single = moto.client("ec2").describe_security_groups(
            Filters=[{"Name": f"tag:{TAG_RUN}", "Values": [single.run_id]}]
        )["SecurityGroups"][0]
        assert inbound(moto, sg_single["GroupId"]) == [], "one node: no inbound rule at all"
        assert len(groups) == 2
        # a single node needs no placement group either
        assert len(hooks.ops("CreatePlacementGroup")) == 1
        (run_single,) = [c for c in hooks.ops("RunInstances") if c.params["MinCount"] == 1]
        assert "Placement" not in run_single.params
    finally:
        for handle in handles:
            provider.teardown(handle, journal)
    assert tagged_alive(moto, multi.run_id) == [] and tagged_alive(moto, single.run_id) == []


def test_capacity_error_moves_all_nodes_to_the_next_zone_together(
    moto: Moto,
    provider: Any,
    journal: Any,  # noqa: F811
    hooks: AwsHooks,
) -> None:
    n = 4
    hooks.add(Fault("RunInstances", "InsufficientInstanceCapacity", times=1))
    req = multinode_request(n)
    handle = provider.provision(req, journal)
    ids = handle.nodes
    first, second = hooks.ops("RunInstances")
    assert first.injected == "InsufficientInstanceCapacity" and second.injected is None
    assert first.params["SubnetId"] != second.params["SubnetId"]
    for call in (first, second):
        assert call.params["MinCount"] == call.params["MaxCount"] == n
        assert call.params["Placement"] == first.params["Placement"], "the same placement group"
    assert len(hooks.ops("CreatePlacementGroup")) == 1
    insts = instances(moto, ids)
    assert {i["SubnetId"] for i in insts} == {second.params["SubnetId"]}, "all N in the second zone"
    provider.teardown(handle, journal)
    assert tagged_alive(moto, req.run_id) == []


def test_no_zone_with_room_for_the_group_leaves_nothing(
    moto: Moto,
    provider: Any,
    journal: Any,  # noqa: F811
    hooks: AwsHooks,
) -> None:
    hooks.add(Fault("RunInstances", "InsufficientInstanceCapacity", times=None))
    req = multinode_request(3)
    with pytest.raises(CapacityError, match="3 nodes together"):
        provider.provision(req, journal)
    runs = hooks.ops("RunInstances")
    assert len(runs) == len({c.params["SubnetId"] for c in runs}) > 1, "each zone tried once, for the whole group"
    assert all(c.params["MinCount"] == c.params["MaxCount"] == 3 for c in runs)
    assert tagged_alive(moto, req.run_id) == [], "security group and placement group go with the attempt"
    assert not journal.resources(req.run_id, alive_only=True)


def test_gc_sweeps_expired_placement_groups(
    moto: Moto,  # noqa: F811
    provider: Any,
    journal: Any,
    hooks: AwsHooks,
) -> None:
    from gpucloud.contract.provider import expiry_tag as iso_utc

    expired = multinode_request(2, region="us-west-2", expires_in=timedelta(minutes=-5))
    fresh = multinode_request(2)
    handles = {req.run_id: provider.provision(req, journal) for req in (expired, fresh)}
    # What a CLI killed right after CreatePlacementGroup leaves behind.
    stray = [
        {"Key": TAG_RUN, "Value": "mn-stray"},
        {"Key": TAG_EXPIRES, "Value": iso_utc(datetime.now(UTC) - timedelta(hours=1))},
    ]
    provider.client("ec2", "eu-west-1").create_placement_group(
        GroupName="gpucloud-mn-stray-0",
        Strategy="cluster",
        TagSpecifications=[{"ResourceType": "placement-group", "Tags": stray}],
    )
    now = datetime.now(UTC)
    dry = provider.gc(now, dry_run=True)
    assert any("placement group gpucloud-mn-stray-0" in line and "would delete" in line for line in dry), dry
    assert any(f"placement group gpucloud-{expired.run_id}-0" in line for line in dry), dry
    assert not any(fresh.run_id in line for line in dry)
    assert tagged_alive(moto, "mn-stray")

    done = provider.gc(now, dry_run=False)
    assert any("deleted placement group gpucloud-mn-stray-0" in line for line in done), done
    assert not any("could not" in line for line in done), done
    assert tagged_alive(moto, "mn-stray") == [] and tagged_alive(moto, expired.run_id) == []
    assert tagged_alive(moto, fresh.run_id), "not expired: untouched"
    provider.teardown(handles[fresh.run_id], journal)
    assert tagged_alive(moto, fresh.run_id) == []


# ---- lifecycle and end to end ------------------------------------------------------------------------


def test_no_capacity_in_the_first_region_moves_both_nodes_to_the_next(  # noqa: F811
    inproc: None, moto: Moto, aws_sim: AwsVmSimulator, tmp_path: Path
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: mn-failover\nresources:\n  cloud: aws\n  regions: [us-east-1, us-west-2]\n  gpu: T4:1\n"
        'num_nodes: 2\nrun: echo "rank $GPUCLOUD_NODE_RANK of $GPUCLOUD_NUM_NODES, master $MASTER_ADDR"\n'
        "max_duration: 10m\n"
    )
    HOOKS.add(Fault("RunInstances", "InsufficientInstanceCapacity", times=None, region="us-east-1"))
    code, out = invoke("run", str(job), "--cloud", "aws")
    assert code == 0, out[-3000:]
    east = [c for c in HOOKS.ops("RunInstances") if c.region == "us-east-1"]
    west = [c for c in HOOKS.ops("RunInstances") if c.region == "us-west-2"]
    assert east and all(c.injected == "InsufficientInstanceCapacity" for c in east)
    assert len(west) == 1 and west[0].params["MinCount"] == west[0].params["MaxCount"] == 2
    assert "[node 0] rank 0 of 2, master 127.0.0.1" in out and "[node 1] rank 1 of 2, master 127.0.0.1" in out
    regions = {g.meta["region"] for g in aws_sim.guests.values()}
    assert regions == {"us-west-2"} and sorted(g.meta["rank"] for g in aws_sim.guests.values()) == ["0", "1"]
    aws_sim.wait_idle(20)
    assert tagged_alive(moto, run_id_in(out)) == []
    assert not aws_sim.leftover_processes()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not importable here (CI installs the CPU wheel)")
def test_ddp_example_on_two_aws_nodes(
    inproc: None,
    moto: Moto,
    aws_sim: AwsVmSimulator,  # noqa: F811
    tmp_path: Path,
) -> None:
    """examples/ddp-2-nodes.yaml as it is, but for MASTER_PORT: both simulated guests share this
    host's loopback, so the run sets a free port through the job's own `env` (which wins over
    gpucloud's 29500)."""
    doc = yaml.safe_load((REPO / "examples" / "ddp-2-nodes.yaml").read_text())
    doc["workdir"] = str(REPO / "examples" / doc["workdir"])
    job = tmp_path / "ddp-2-nodes.yaml"
    doc["env"]["MASTER_PORT"] = str(_free_port())
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    t0 = time.monotonic()
    code, log = invoke("run", str(job), "--cloud", "aws")
    wall = time.monotonic() - t0
    assert code == 0, log[-4000:]
    run_id = run_id_in(log)
    losses = {int(r): v for r, v in re.findall(r"^\[node (\d)\] rank \d final loss (\S+)$", log, re.M)}
    assert set(losses) == {0, 1}, log[-4000:]
    assert losses[0] == losses[1]
    assert "[node 0] rank 0/2 (node 0" in log and "[node 1] rank 1/2 (node 1" in log and "backend gloo" in log
    assert f"master 127.0.0.1:{doc['env']['MASTER_PORT']}" in log
    out = tmp_path / "gpucloud-runs" / run_id
    metrics = [json.loads((out / f"node-{r}" / "metrics.json").read_text()) for r in (0, 1)]
    assert metrics[0]["final_loss"] == metrics[1]["final_loss"]
    assert (out / "node-0" / "outputs" / "model.pt").stat().st_size > 0
    # One call, one placement group, one zone; each guest took its rank from its launch index.
    (run,) = HOOKS.ops("RunInstances")
    assert run.params["MinCount"] == run.params["MaxCount"] == 2 and run.params["Placement"]["GroupName"]
    assert len(HOOKS.ops("CreatePlacementGroup")) == 1
    guests = sorted(aws_sim.guests.values(), key=lambda g: g.meta["rank"])
    assert [g.meta["rank"] for g in guests] == ["0", "1"] and len({g.meta["zone"] for g in guests}) == 1
    assert all(g.meta["gpu_name"] == "Tesla T4" for g in guests)
    # Nothing of the run remains: instances, security group, placement group; no guest process.
    aws_sim.wait_idle(20)
    assert tagged_alive(moto, run_id) == []
    assert [c.injected for c in HOOKS.ops("DeletePlacementGroup")][-1] == "placement-group-fake"
    assert not aws_sim.leftover_processes()
    print(f"\n2-node DDP run on simulated AWS: {wall:.1f}s wall")
