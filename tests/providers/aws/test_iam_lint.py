"""parliament, the IAM linter that ships the AWS Service Authorization Reference, on every policy the
CLI prints (`gpucloud iam-policy aws`, the deadline role's trust and permission policies): no finding
but the ones listed, each with its reason, in tests/support/parliament_suppressions.yaml."""

from __future__ import annotations

import importlib.resources
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import cli

REPO = Path(__file__).resolve().parents[3]
SUPPRESSIONS = REPO / "tests" / "support" / "parliament_suppressions.yaml"
ACCOUNT = "123456789012"
DOCUMENTS = {
    "user": ["iam-policy", "aws"],
    "trust": ["iam-policy", "aws", "--deadline-role", "--part", "trust", "--account", ACCOUNT],
    "permissions": ["iam-policy", "aws", "--deadline-role", "--part", "permissions", "--account", ACCOUNT],
}


def _parliament() -> Any:
    """parliament 1.6 finds its data files through pkg_resources, which setuptools 81+ no longer
    ships; the same two lookups through importlib.resources."""
    if "pkg_resources" not in sys.modules:
        try:
            import pkg_resources  # noqa: F401
        except ImportError:
            shim = types.ModuleType("pkg_resources")
            shim.resource_filename = (  # type: ignore[attr-defined]
                lambda package, name: str(importlib.resources.files(package).joinpath(name))
            )
            sys.modules["pkg_resources"] = shim
    import parliament

    return parliament


def printed(args: list[str]) -> str:
    out = cli(*args, env={**os.environ, "CI": "true"}, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    json.loads(out.stdout)
    return out.stdout


def subject(finding: Any) -> Any:
    """What a suppression names: the actions of a resource mismatch, the ARN of an invalid ARN, else
    the detail text."""
    if finding.issue == "RESOURCE_MISMATCH":
        return sorted({d["action"] for d in finding.detail})
    if finding.issue == "INVALID_ARN":
        return finding.location["string"]
    return finding.detail


def findings(document: str, text: str) -> list[tuple[str, str, Any]]:
    policy = _parliament().analyze_policy_string(text, include_community_auditors=True)
    return [(document, f.issue, subject(f)) for f in policy.findings]


def suppressions() -> list[dict[str, Any]]:
    entries = yaml.safe_load(SUPPRESSIONS.read_text())
    for e in entries:
        assert set(e) == {"document", "issue", "subject", "why"} and len(e["why"]) > 40, e
    return list(entries)


def key(document: str, issue: str, subj: Any) -> str:
    return json.dumps([document, issue, subj], sort_keys=True)


def test_parliament_finds_nothing_unexplained_in_the_printed_policies() -> None:
    found = [f for name, args in DOCUMENTS.items() for f in findings(name, printed(args))]
    allowed = {key(e["document"], e["issue"], e["subject"]) for e in suppressions()}
    unexplained = [f for f in found if key(*f) not in allowed]
    assert unexplained == [], f"parliament findings with no entry in {SUPPRESSIONS.name}: {unexplained}"
    stale = allowed - {key(*f) for f in found}
    assert not stale, f"entries in {SUPPRESSIONS.name} that match no finding any more: {sorted(stale)}"


def test_parliament_would_catch_the_mistakes_it_is_here_for() -> None:
    """The linter is live: an unknown action and a condition key the action does not have are
    findings, not suppressed. (parliament checks keys per action, not per resource type: the test
    below does that for the ingress statements.)"""
    allowed = {key(e["document"], e["issue"], e["subject"]) for e in suppressions()}
    doc = json.loads(printed(DOCUMENTS["user"]))
    doc["Statement"].append({"Sid": "Typo", "Effect": "Allow", "Action": "ec2:RunInstance", "Resource": "*"})
    doc["Statement"].append(
        {
            "Sid": "Rule",
            "Effect": "Allow",
            "Action": "ec2:AuthorizeSecurityGroupIngress",
            "Resource": "arn:aws:ec2:*:*:security-group-rule/*",
            "Condition": {"StringEquals": {"ec2:InstanceType": "p5.48xlarge"}},
        }
    )
    issues = {f[1] for f in findings("user", json.dumps(doc)) if key(*f) not in allowed}
    assert {"UNKNOWN_ACTION", "UNKNOWN_CONDITION_FOR_ACTION"} <= issues, issues


@pytest.mark.parametrize("statement", ["IngressRulesOnOwnGroups", "IngressRulesCarryTheRunTag"])
def test_ingress_conditions_use_keys_each_resource_supports(statement: str) -> None:
    """A `security-group-rule` supports request tags only, a `security-group` resource tags: each
    statement's condition keys are ones the Service Authorization Reference lists for its resource."""
    parliament = _parliament()
    doc = json.loads(printed(DOCUMENTS["user"]))
    stmt = next(s for s in doc["Statement"] if s["Sid"] == statement)
    kind = stmt["Resource"].split(":")[-1].split("/")[0]
    privilege = next(
        p
        for svc in parliament.iam_definition
        if svc["prefix"] == "ec2"
        for p in svc["privileges"]
        if p["privilege"] == "AuthorizeSecurityGroupIngress"
    )
    keys = next(r["condition_keys"] for r in privilege["resource_types"] if r["resource_type"].rstrip("*") == kind)
    for op in stmt["Condition"].values():
        for k in op:
            assert k.split("/")[0] + "/${TagKey}" in keys, (statement, k, keys)
