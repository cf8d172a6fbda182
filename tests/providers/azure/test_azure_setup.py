"""`gpucloud setup azure` and `iam-policy azure` against the fake ARM: the custom role is created
once (a second run changes nothing), a changed one is put back, `--print` gives the `az` commands
and creates nothing; the printed role names no Owner-like wildcard, and the fake ARM, given only
that role, refuses an action outside it with the action named (every Azure test runs under it:
tests/support/azure_fixtures.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from gpucloud.providers.azure.rbac import ACTIONS, NODE_DATA_ACTIONS, node_role_id, role_definition
from gpucloud.providers.azure.setup import node_role_path, role_path
from tests.support.arm_actions import action_of, allowed
from tests.support.azure_fixtures import arm, fake_arm_server  # noqa: F401
from tests.support.cli import cli
from tests.support.fake_arm import FakeArm

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def cli_with_arm(arm: FakeArm, home: Path, *args: str) -> subprocess.CompletedProcess[str]:  # noqa: F811
    """The CLI against the fake ARM server's credentials and `home`, no other cloud's variable, no stdin."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GPUCLOUD_AZURE"))}
    env.update(arm.client_env())
    env.update({"GPUCLOUD_HOME": str(home), "PYTHONPATH": str(REPO)})
    return cli(*args, env=env, stdin="")


def test_setup_creates_the_role_once_and_puts_back_a_changed_one(arm: FakeArm, gpucloud_home: Path) -> None:  # noqa: F811
    arm.operator_role = None  # an administrator runs setup (roleDefinitions/write is not the runner's)
    path = role_path(arm.subscription_id).lower()
    asked = cli_with_arm(arm, gpucloud_home, "setup", "azure")
    assert asked.returncode == 2 and "gpucloud runner" in asked.stderr and path not in arm.role_definitions
    assert "gpucloud node channel" in asked.stderr
    first = cli_with_arm(arm, gpucloud_home, "setup", "azure", "--yes", "--json")
    assert first.returncode == 0, first.stderr
    assert [p["state"] for p in json.loads(first.stdout)["pieces"]] == ["present", "present"]
    perms = arm.role_definitions[path]["properties"]["permissions"][0]
    assert sorted(perms["actions"]) == sorted(ACTIONS)
    node = arm.role_definitions[node_role_path(arm.subscription_id).lower()]["properties"]["permissions"][0]
    assert node["actions"] == [] and sorted(node["dataActions"]) == sorted(NODE_DATA_ACTIONS)
    assert not [a for a in node["dataActions"] if a.endswith(("/delete", "/move/action"))]
    puts = [c for c in arm.calls if c[0] == "PUT" and "roledefinitions" in c[1].lower()]
    assert len(puts) == 2, "each role created once"
    second = cli_with_arm(arm, gpucloud_home, "setup", "azure", "--yes")
    assert second.returncode == 0 and "created" not in second.stderr, second.stderr
    assert [c for c in arm.calls if c[0] == "PUT" and "roledefinitions" in c[1].lower()] == puts
    perms["actions"] = ["*"]  # someone widened it by hand
    third = cli_with_arm(arm, gpucloud_home, "setup", "azure", "--yes")
    assert third.returncode == 0 and "updated role definition" in third.stderr, third.stderr
    assert "*" not in arm.role_definitions[path]["properties"]["permissions"][0]["actions"]


def test_print_gives_the_az_commands_and_creates_nothing(arm: FakeArm, gpucloud_home: Path) -> None:  # noqa: F811
    out = cli_with_arm(arm, gpucloud_home, "setup", "azure", "--print")
    assert out.returncode == 0, out.stderr
    assert "az role definition create" not in out.stdout  # a random id: neither check nor the condition finds it
    for path in (role_path(arm.subscription_id), node_role_path(arm.subscription_id)):
        assert f'az rest --method put --url "https://management.azure.com{path}?' in out.stdout
    assert "az role assignment create" in out.stdout and "--condition-version 2.0" in out.stdout
    node_url = f"https://management.azure.com{node_role_path(arm.subscription_id)}"
    assert f'az rest --method put --url "{node_url}' in out.stdout
    assert out.stdout.count(node_role_id(arm.subscription_id)) >= 2, "created by the id the condition names"
    assert not arm.role_definitions
    # What an administrator's `az rest` PUTs make is what setup itself makes: nothing left to do after.
    files = dict(re.findall(r"cat > (\S+) <<'EOF'\n(.*?)\nEOF", out.stdout, re.S))
    put = r'az rest --method put --url "https://management.azure.com([^"?]+)\?[^"]*" --body @(\S+)'
    for url, file in re.findall(put, out.stdout):
        body = json.loads(files[file])  # as the fake's own PUT stores it (the administrator's `az rest`)
        kind = "Microsoft.Authorization/roleDefinitions"
        doc = {"id": url, "name": url.rsplit("/", 1)[-1], "type": kind, "properties": body["properties"]}
        arm.role_definitions[url.lower()] = doc
    again = cli_with_arm(arm, gpucloud_home, "setup", "azure", "--yes")
    assert again.returncode == 0 and "created" not in again.stderr and "updated" not in again.stderr, again.stderr
    printed = cli_with_arm(arm, gpucloud_home, "iam-policy", "azure")
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout) == role_definition(arm.subscription_id)


def test_the_role_is_least_privilege_and_the_fake_enforces_it() -> None:
    role = role_definition("s")
    assert not any(a == "*" or a.endswith("/*") for a in role["Actions"])  # no Owner/Contributor wildcard
    assert "Microsoft.Authorization/roleDefinitions/write" not in role["Actions"]  # cannot widen itself
    assert "Microsoft.Authorization/elevateAccess/action" not in role["Actions"]
    vm = "/subscriptions/s/resourceGroups/gpucloud-r/providers/Microsoft.Compute/virtualMachines/node-0"
    assert allowed(action_of("PUT", vm), role["Actions"])
    assert not allowed(action_of("POST", vm + "/capture"), role["Actions"])  # not an action gpucloud uses
    assert not allowed(action_of("PUT", "/subscriptions/s/oddity/x"), ["*"])  # unnamed: denied even by *


def test_check_reports_the_role_missing_then_present(arm: FakeArm, gpucloud_home: Path) -> None:  # noqa: F811
    before = json.loads(cli_with_arm(arm, gpucloud_home, "check", "--cloud", "azure", "--json").stdout)["clouds"][0]
    assert [p["state"] for p in before["setup"]] == ["missing", "missing"]
    assert any("gpucloud setup azure" in p["fix"] for p in before["problems"])
    role = arm.operator_role
    arm.operator_role = None  # the administrator
    assert cli_with_arm(arm, gpucloud_home, "setup", "azure", "--yes").returncode == 0
    arm.operator_role = role  # the runner again: check reads the role with roleDefinitions/read
    after = json.loads(cli_with_arm(arm, gpucloud_home, "check", "--cloud", "azure", "--json").stdout)["clouds"][0]
    assert [p["state"] for p in after["setup"]] == ["present", "present"] and after["usable"], after
    assert not [p for p in after["problems"] if "role definition" in p["problem"]]
