"""EFA on a multi-node AWS run: the RunInstances request checked against botocore's own EC2 model,
the layout read from real DescribeInstanceTypes answers (moto's bundled AWS data), and a moto-backed
2-node p5.48xlarge run that carries the interfaces, the placement group and the rules in and out
whose peer is the group itself, and leaves nothing behind (Elastic IPs included).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from gpucloud.providers.aws.efa import EfaLayout, layout_from, network_interfaces, primary_interfaces
from gpucloud.providers.aws.launch import LaunchPlan, run_instances
from tests.support.aws_faults import AwsHooks
from tests.support.aws_requests import multinode_request
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive  # noqa: F401

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]
REGION = "us-east-1"


@cache
def aws_types() -> dict[str, Any]:
    """AWS's DescribeInstanceTypes entries as moto ships them (real answers, read from AWS)."""
    import moto as moto_pkg

    path = Path(moto_pkg.__file__).parent / "ec2" / "resources" / "instance_types.json.gz"
    with gzip.open(path, "rt") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def layout(instance_type: str) -> EfaLayout:
    return layout_from(aws_types()[instance_type])


class Recorder:
    """An AwsClients stand-in whose EC2 calls go through a real botocore client with its HTTP layer
    stubbed (botocore.stub.Stubber): the client's own handlers and its validation against the EC2
    service model run on every request, as before any real send; RunInstances answers N instances."""

    poll_s = 0.0

    def __init__(self) -> None:
        import boto3

        self.client = boto3.client(
            "ec2", region_name=REGION, aws_access_key_id="AKIATEST", aws_secret_access_key="test"
        )
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def ec2(self, op: str, region: str, **kwargs: Any) -> Any:
        from botocore.stub import Stubber

        n = kwargs.get("MaxCount", 1)
        answer = {"Instances": [{"InstanceId": f"i-{r:017x}", "AmiLaunchIndex": r} for r in range(n)]}
        with Stubber(self.client) as stub:
            stub.add_response(op, answer if op == "run_instances" else {}, None)
            out = getattr(self.client, op)(**kwargs)  # raises ParamValidationError on a wrong field
        self.calls.append(("".join(p.capitalize() for p in op.split("_")), kwargs))
        return out


class NullJournal:
    def intent(self, *args: Any) -> str:
        return "r"

    def created(self, *args: Any) -> None:
        pass

    def deleted(self, *args: Any) -> None:
        pass


def launch_params(instance_type: str, nodes: int, efa: EfaLayout) -> dict[str, Any]:
    rec = Recorder()
    req = dataclasses.replace(multinode_request(nodes), instance_type=instance_type)
    plan = LaunchPlan("ami-0123456789abcdef0", "/dev/sda1", "sg-0123", b"#!/bin/bash\n", nodes, "pg-name", None, efa)
    run_instances(rec, req, NullJournal(), REGION, plan, "us-east-1a", "subnet-0abc")  # type: ignore[arg-type]
    ((op, params),) = rec.calls
    assert op == "RunInstances"
    return params


@pytest.mark.parametrize(("itype", "count"), [("p5.48xlarge", 32), ("p5en.48xlarge", 16), ("p4d.24xlarge", 4)])
def test_a_two_node_launch_carries_one_efa_per_card(itype: str, count: int) -> None:
    params = launch_params(itype, 2, layout(itype))
    nics = params["NetworkInterfaces"]
    assert len(nics) == count
    assert [n["NetworkCardIndex"] for n in nics] == list(range(count)), "one interface per network card"
    assert nics[0]["InterfaceType"] == "efa" and nics[0]["DeviceIndex"] == 0, "card 0: EFA with the ENA"
    assert {n["InterfaceType"] for n in nics[1:]} == {"efa-only"} and {n["DeviceIndex"] for n in nics} == {0}
    assert all(n["Groups"] == ["sg-0123"] and n["SubnetId"] == "subnet-0abc" for n in nics)
    assert all(n["DeleteOnTermination"] for n in nics)
    # groups and subnet only on the interfaces (AWS refuses both places); no public IP request (refused
    # with several interfaces): each node gets an Elastic IP instead.
    assert "SecurityGroupIds" not in params and "SubnetId" not in params
    assert not any("AssociatePublicIpAddress" in n for n in nics)
    assert params["Placement"] == {"GroupName": "pg-name"}
    assert "network-interface" in {s["ResourceType"] for s in params["TagSpecifications"]}


def test_a_card_without_efa_keeps_a_plain_primary() -> None:
    # p6-b300.48xlarge: 17 cards, card 0 lists only "interface", 16 EFA interfaces at most.
    lay = layout("p6-b300.48xlarge")
    assert lay.count == 16 and not lay.primary_efa and 0 not in lay.cards
    nics = network_interfaces(lay, "sg-1", "subnet-1")
    assert "InterfaceType" not in nics[0] and nics[0]["NetworkCardIndex"] == 0
    assert [n["NetworkCardIndex"] for n in nics[1:]] == list(range(1, 17))
    launch_params("p6-b300.48xlarge", 2, lay)  # valid against the model


def test_one_efa_interface_keeps_the_public_address() -> None:
    lay = layout("g5.8xlarge")  # one EFA card
    assert lay.count == 1
    (nic,) = launch_params("g5.8xlarge", 2, lay)["NetworkInterfaces"]
    assert nic["InterfaceType"] == "efa" and nic["AssociatePublicIpAddress"] is True


@pytest.mark.parametrize(("itype", "nodes", "efa"), [("g5.xlarge", 2, True), ("p5.48xlarge", 1, False)])
def test_no_efa_type_or_one_node_launches_as_before(itype: str, nodes: int, efa: bool) -> None:
    lay = layout(itype) if efa else EfaLayout()  # provision reads no layout for one node
    assert not lay.cards or not efa
    params = launch_params(itype, nodes, lay)
    assert "NetworkInterfaces" not in params
    assert params["SecurityGroupIds"] == ["sg-0123"] and params["SubnetId"] == "subnet-0abc"


def test_every_efa_type_of_the_catalog_gets_a_valid_request() -> None:
    from gpucloud.catalog import load_catalog

    names = {o.instance_type for o in load_catalog().offerings if o.cloud == "aws"}
    seen = 0
    for name in sorted(names & set(aws_types())):
        lay = layout(name)
        if lay.count:
            seen += 1
            assert len(launch_params(name, 2, lay)["NetworkInterfaces"]) == max(lay.count, 1)
    assert seen >= 10


def test_primary_interfaces_are_card_zero_device_zero() -> None:
    insts = [
        {
            "NetworkInterfaces": [
                {"NetworkInterfaceId": "eni-b", "Attachment": {"DeviceIndex": 0, "NetworkCardIndex": 1}},
                {"NetworkInterfaceId": "eni-a", "Attachment": {"DeviceIndex": 0, "NetworkCardIndex": 0}},
            ]
        }
    ]
    assert primary_interfaces(insts) == ["eni-a"]


# ---- against moto --------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_two_node_p5_run_on_moto_carries_efa_and_ends_clean(
    moto: Moto,  # noqa: F811
    provider: Any,
    journal: Any,
    hooks: AwsHooks,
) -> None:
    req = dataclasses.replace(multinode_request(2), instance_type="p5.48xlarge")
    handle = provider.provision(req, journal)
    (run,) = hooks.ops("RunInstances")
    assert len(run.params["NetworkInterfaces"]) == 32 and run.params["MinCount"] == 2
    assert run.params["Placement"] == {"GroupName": f"gpucloud-{req.run_id}-0"}
    sg_id = handle.resources["security-group"][0]
    own = [{"GroupId": sg_id, "Description": "gpucloud: the run's own nodes"}]
    (ingress,) = hooks.ops("AuthorizeSecurityGroupIngress")
    (egress,) = hooks.ops("AuthorizeSecurityGroupEgress")
    for rule in (ingress, egress):
        assert rule.params["IpPermissions"] == [{"IpProtocol": "-1", "UserIdGroupPairs": own}]
    ec2 = moto.client("ec2", REGION)
    group = ec2.describe_security_groups(GroupIds=[sg_id])["SecurityGroups"][0]
    assert any(p.get("UserIdGroupPairs") for p in group["IpPermissionsEgress"])
    inbound = group["IpPermissions"]
    assert inbound and all(
        not p.get("IpRanges") and not p.get("Ipv6Ranges") and [g["GroupId"] for g in p["UserIdGroupPairs"]] == [sg_id]
        for p in inbound
    ), "nothing from outside the run's own group"
    flt = [{"Name": "tag:gpucloud-run", "Values": [req.run_id]}]
    addresses = ec2.describe_addresses(Filters=flt)["Addresses"]
    assert len(addresses) == 2 and all(a.get("AssociationId") for a in addresses), "an Elastic IP per node"
    assert sorted(handle.resources["elastic-ip"]) == sorted(a["AllocationId"] for a in addresses)

    provider.teardown(handle, journal)
    assert tagged_alive(moto, req.run_id, [REGION]) == []
    from gpucloud.providers.aws.policy import policy_document
    from tests.support.iam_eval import is_allowed

    doc = policy_document()
    ops = {c.operation for c in hooks.calls if c.service == "ec2"}
    assert {"AllocateAddress", "AssociateAddress", "ReleaseAddress", "DescribeInstanceTypes"} <= ops
    assert [op for op in sorted(ops) if not is_allowed(f"ec2:{op}", doc)] == [], "every call in the IAM policy"
    tag_stmt = next(s for s in doc["Statement"] if s["Action"] == "ec2:CreateTags")
    creates = {"AllocateAddress", "AuthorizeSecurityGroupEgress", "RunInstances"} & ops
    assert creates <= set(tag_stmt["Condition"]["StringEquals"]["ec2:CreateAction"])
    assert ec2.describe_addresses(Filters=flt)["Addresses"] == []
    assert journal.resources(req.run_id) == [], "every journal row closed"


def test_the_policy_covers_the_efa_calls_and_only_on_tagged_objects() -> None:
    from gpucloud.providers.aws.policy import policy_document
    from tests.support.iam_eval import Request, decide

    doc = policy_document()
    arn = "arn:aws:ec2:us-east-1:123456789012"
    tag = {"aws:PrincipalAccount": "123456789012"}
    req_tag = {**tag, "aws:RequestTag/gpucloud-run": "r1"}
    res_tag = {**tag, "aws:ResourceTag/gpucloud-run": "r1"}
    for action in ("ec2:DescribeInstanceTypes", "ec2:DescribeAddresses"):
        assert decide(doc, Request(action, "*", tag)) == "Allow"
    assert decide(doc, Request("ec2:AllocateAddress", f"{arn}:elastic-ip/*", req_tag)) == "Allow"
    assert decide(doc, Request("ec2:AllocateAddress", f"{arn}:elastic-ip/*", tag)) != "Allow"
    for res in (f"{arn}:elastic-ip/eipalloc-1", f"{arn}:network-interface/eni-1"):
        assert decide(doc, Request("ec2:AssociateAddress", res, res_tag)) == "Allow"
        assert decide(doc, Request("ec2:AssociateAddress", res, tag)) != "Allow", "not someone else's"
    assert decide(doc, Request("ec2:ReleaseAddress", f"{arn}:elastic-ip/eipalloc-1", res_tag)) == "Allow"
    assert decide(doc, Request("ec2:ReleaseAddress", f"{arn}:elastic-ip/eipalloc-1", tag)) != "Allow"
    group = f"{arn}:security-group/sg-1"
    assert decide(doc, Request("ec2:AuthorizeSecurityGroupEgress", group, res_tag)) == "Allow"
    assert decide(doc, Request("ec2:AuthorizeSecurityGroupEgress", group, tag)) != "Allow"
    assert decide(doc, Request("ec2:AuthorizeSecurityGroupEgress", f"{arn}:security-group-rule/*", req_tag)) == "Allow"


def test_the_node_pins_libfabric_to_efa_only_where_efa_devices_are(tmp_path: Path) -> None:
    from gpucloud.vm.agent.fabric import efa_devices, fabric_env

    root = tmp_path / "infiniband"
    drivers = tmp_path / "drivers"
    for drv in ("efa", "mlx5_core"):
        (drivers / drv).mkdir(parents=True)
    for dev, drv in (("rdmap16s27", "efa"), ("rdmap32s27", "efa"), ("mlx5_0", "mlx5_core")):
        (root / dev / "device").mkdir(parents=True)
        (root / dev / "device" / "driver").symlink_to(drivers / drv)
    assert efa_devices(str(root)) == ["rdmap16s27", "rdmap32s27"]
    assert fabric_env(2, str(root)) == {"FI_PROVIDER": "efa"}
    assert fabric_env(1, str(root)) == {}, "one node: no inter-node fabric to pin"
    assert fabric_env(2, str(tmp_path / "none")) == {}, "no RDMA devices (a g4dn, an SSH host)"
    (root / "rdmap16s27").rename(tmp_path / "x")
    (root / "rdmap32s27").rename(tmp_path / "y")
    assert fabric_env(2, str(root)) == {}, "InfiniBand (mlx5) is NCCL's own: nothing pinned"


@pytest.mark.parametrize(
    ("container", "job_env", "want"),
    [({}, {}, "efa"), ({"image": "nvcr.io/nvidia/pytorch:24.05-py3"}, {}, None), ({}, {"FI_PROVIDER": "tcp"}, "tcp")],
)
def test_the_job_env_gets_the_efa_provider_outside_a_container_and_its_own_env_wins(
    monkeypatch: pytest.MonkeyPatch, container: dict[str, str], job_env: dict[str, str], want: str | None
) -> None:
    from types import SimpleNamespace

    from gpucloud.vm.agent import fabric, steps

    monkeypatch.setattr(fabric, "fabric_env", lambda n: {"FI_PROVIDER": "efa"} if n > 1 else {})
    cfg = SimpleNamespace(
        run_id="r1", num_nodes=2, gpu_count=8, master_port=29500, checkpoint="", env=job_env, container=container
    )
    node = SimpleNamespace(cfg=cfg, rank=0, preempted_file="/x", node_ips=["10.0.0.1", "10.0.0.2"], job_dir=Path("/j"))
    env = steps.JobSteps.node_env(node)  # type: ignore[arg-type]
    assert env.get("FI_PROVIDER") == want
    assert "NCCL_SOCKET_IFNAME" not in env


def test_an_exhausted_address_quota_fails_before_any_instance_starts() -> None:
    from botocore.exceptions import ClientError

    from gpucloud.contract.provider import RunHandle
    from gpucloud.providers.aws.launch import launch

    class QuotaOfOne(Recorder):
        def ec2(self, op: str, region: str, **kwargs: Any) -> Any:
            if op == "allocate_address" and any(name == "AllocateAddress" for name, _ in self.calls):
                raise ClientError({"Error": {"Code": "AddressLimitExceeded", "Message": "quota"}}, "AllocateAddress")
            if op == "allocate_address":
                self.calls.append(("AllocateAddress", kwargs))
                return {"AllocationId": "eipalloc-1"}
            return super().ec2(op, region, **kwargs)

    rec = QuotaOfOne()
    req = dataclasses.replace(multinode_request(2), instance_type="p5.48xlarge")
    plan = LaunchPlan("ami-0123456789abcdef0", "/dev/sda1", "sg-0123", b"", 2, "pg", None, layout("p5.48xlarge"))
    handle = RunHandle(run_id=req.run_id, cloud="aws", region=REGION)
    with pytest.raises(ClientError, match="AddressLimitExceeded"):
        launch(rec, req, NullJournal(), handle, plan, [("us-east-1a", "subnet-0abc")])  # type: ignore[arg-type]
    assert [name for name, _ in rec.calls] == ["AllocateAddress"], "no RunInstances after the refusal"
    assert handle.resources["elastic-ip"] == ["eipalloc-1"], "what was allocated is in the handle, for teardown"


def test_the_address_quota_is_a_quota_error_naming_the_elastic_ip_quota() -> None:
    from botocore.exceptions import ClientError

    from gpucloud.contract.provider import QuotaError
    from gpucloud.providers.aws.errors import classify

    exc = ClientError({"Error": {"Code": "AddressLimitExceeded", "Message": "limit"}}, "AllocateAddress")
    err = classify(exc, region=REGION, instance_type="p5.48xlarge", spot=False, what="launching instances")
    assert isinstance(err, QuotaError) and "EC2-VPC Elastic IPs" in str(err) and "L-0263D0A3" in (err.hint or "")
