"""`gpucloud setup aws`: what an account needs once, beyond the permissions of whoever runs jobs.

Two kinds of piece, each read first and created or updated only when missing or different (so a
second run changes nothing):
- the deadline role `gpucloud-deadline` (deadline.py): EventBridge Scheduler assumes it to end a
  run's instances after its expiry. Creating a role needs iam:CreateRole, which the people who run
  jobs should not have: an administrator runs setup once.
- the runner policy as customer-managed policies `gpucloud-runner-1..N` (the document
  `gpucloud iam-policy aws` prints, split where IAM's 6,144-character limit of a managed policy
  requires), to attach to the users, groups or CI roles that run jobs.
Nothing per run is created here (per-run identities belong to the runs themselves). `--print`
gives the same as AWS CLI commands for an administrator who prefers to run them by hand.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from gpucloud.providers.aws.errors import error_code
from gpucloud.providers.aws.policy import deadline_role_documents, policy_document

RUNNER_POLICY = "gpucloud-runner"
DEADLINE_INLINE = "gpucloud-deadline"  # the name docs/PROVIDERS.md gives it by hand too
MANAGED_POLICY_MAX = 6144  # IAM: characters of a managed policy document, whitespace not counted
MAX_VERSIONS = 5  # IAM keeps at most five versions of a managed policy


def runner_documents() -> list[dict[str, Any]]:
    """The runner policy split into documents that each fit a managed policy, statements kept whole."""
    doc = policy_document()
    parts: list[list[dict[str, Any]]] = [[]]
    for statement in doc["Statement"]:
        trial = {"Version": doc["Version"], "Statement": [*parts[-1], statement]}
        if parts[-1] and len(json.dumps(trial, separators=(",", ":"))) > MANAGED_POLICY_MAX:
            parts.append([])
        parts[-1].append(statement)
    return [{"Version": doc["Version"], "Statement": p} for p in parts]


def runner_names() -> list[str]:
    return [f"{RUNNER_POLICY}-{i + 1}" for i in range(len(runner_documents()))]


def _same(a: Any, b: Any) -> bool:
    """Policy documents compared as data (IAM may hand them back URL-encoded strings)."""
    import urllib.parse

    def load(d: Any) -> Any:
        return json.loads(urllib.parse.unquote(d)) if isinstance(d, str) else d

    return bool(load(a) == load(b))


class AwsSetup:
    """The pieces of one account: `inspect()` says what is there, `apply()` makes the rest."""

    def __init__(self, iam: Any, account: str) -> None:
        self.iam, self.account = iam, account
        self.role = deadline_role_documents(account)

    def inspect(self) -> list[dict[str, Any]]:
        """One entry per piece: {piece, state (present/missing/differs), detail}."""
        out = [self._role_state()]
        for name, doc in zip(runner_names(), runner_documents(), strict=True):
            out.append(self._policy_state(name, doc))
        return out

    def _role_state(self) -> dict[str, Any]:
        name = self.role["RoleName"]
        piece = {"piece": f"role {name}", "kind": "deadline-role", "name": name}
        try:
            got = self.iam.get_role(RoleName=name)["Role"]
        except Exception as exc:  # noqa: BLE001 - classified by its code
            if "NoSuchEntity" not in error_code(exc):
                raise
            return {**piece, "state": "missing", "detail": "EventBridge Scheduler's role to end runs after expiry"}
        try:
            inline = self.iam.get_role_policy(RoleName=name, PolicyName=DEADLINE_INLINE)["PolicyDocument"]
        except Exception as exc:  # noqa: BLE001
            if "NoSuchEntity" not in error_code(exc):
                raise
            inline = None
        trust_ok = _same(got.get("AssumeRolePolicyDocument"), self.role["TrustPolicy"])
        perms_ok = inline is not None and _same(inline, self.role["PermissionPolicy"])
        if trust_ok and perms_ok:
            return {**piece, "state": "present", "detail": got.get("Arn", "")}
        wrong = [w for w, ok in (("trust policy", trust_ok), ("permission policy", perms_ok)) if not ok]
        return {**piece, "state": "differs", "detail": f"its {' and '.join(wrong)} will be set"}

    def _arn(self, name: str) -> str:
        return f"arn:aws:iam::{self.account}:policy/{name}"

    def _policy_state(self, name: str, doc: dict[str, Any]) -> dict[str, Any]:
        piece = {"piece": f"policy {name}", "kind": "runner-policy", "name": name, "arn": self._arn(name)}
        try:
            got = self.iam.get_policy(PolicyArn=self._arn(name))["Policy"]
        except Exception as exc:  # noqa: BLE001
            if "NoSuchEntity" not in error_code(exc):
                raise
            return {**piece, "state": "missing", "detail": "attach to whoever runs jobs"}
        version = self.iam.get_policy_version(PolicyArn=self._arn(name), VersionId=got["DefaultVersionId"])
        if _same(version["PolicyVersion"]["Document"], doc):
            return {**piece, "state": "present", "detail": self._arn(name)}
        return {**piece, "state": "differs", "detail": "a new default version with this gpucloud's policy"}

    def apply(self, pieces: list[dict[str, Any]], say: Callable[[str], None]) -> None:
        """Create or update each piece that is not present."""
        docs = dict(zip(runner_names(), runner_documents(), strict=True))
        for piece in pieces:
            if piece["state"] == "present":
                continue
            if piece["kind"] == "deadline-role":
                self._put_role(piece["state"])
            else:
                self._put_policy(piece["name"], docs[piece["name"]], piece["state"])
            say(f"{'created' if piece['state'] == 'missing' else 'updated'} {piece['piece']}")

    def _put_role(self, state: str) -> None:
        name, trust = self.role["RoleName"], json.dumps(self.role["TrustPolicy"])
        if state == "missing":
            self.iam.create_role(
                RoleName=name,
                AssumeRolePolicyDocument=trust,
                Description="gpucloud: EventBridge Scheduler ends a run's instances after its expiry",
                Tags=[{"Key": "gpucloud", "Value": "setup"}],
            )
        else:
            self.iam.update_assume_role_policy(RoleName=name, PolicyDocument=trust)
        self.iam.put_role_policy(
            RoleName=name, PolicyName=DEADLINE_INLINE, PolicyDocument=json.dumps(self.role["PermissionPolicy"])
        )

    def _put_policy(self, name: str, doc: dict[str, Any], state: str) -> None:
        text = json.dumps(doc, separators=(",", ":"))
        if state == "missing":
            self.iam.create_policy(
                PolicyName=name, PolicyDocument=text, Description="gpucloud: what running jobs needs"
            )
            return
        arn = self._arn(name)
        versions = self.iam.list_policy_versions(PolicyArn=arn)["Versions"]
        if len(versions) >= MAX_VERSIONS:
            oldest = min((v for v in versions if not v["IsDefaultVersion"]), key=lambda v: v["CreateDate"])
            self.iam.delete_policy_version(PolicyArn=arn, VersionId=oldest["VersionId"])
        self.iam.create_policy_version(PolicyArn=arn, PolicyDocument=text, SetAsDefault=True)


def attach_commands(account: str) -> list[str]:
    """How an administrator gives a person or a CI role the runner policy."""
    out = []
    for name in runner_names():
        arn = f"arn:aws:iam::{account}:policy/{name}"
        out.append(f"aws iam attach-user-policy --user-name <user> --policy-arn {arn}")
        out.append(f"aws iam attach-role-policy --role-name <ci-role> --policy-arn {arn}")
    return out


def print_commands(account: str) -> list[str]:
    """The whole setup as AWS CLI commands (`gpucloud setup aws --print`), files written inline."""
    role = deadline_role_documents(account)
    name = role["RoleName"]
    lines = [
        f"cat > gpucloud-deadline-trust.json <<'EOF'\n{json.dumps(role['TrustPolicy'], indent=2)}\nEOF",
        f"cat > gpucloud-deadline-permissions.json <<'EOF'\n{json.dumps(role['PermissionPolicy'], indent=2)}\nEOF",
        f"aws iam create-role --role-name {name} --assume-role-policy-document file://gpucloud-deadline-trust.json",
        f"aws iam put-role-policy --role-name {name} --policy-name {DEADLINE_INLINE} "
        "--policy-document file://gpucloud-deadline-permissions.json",
    ]
    for policy, doc in zip(runner_names(), runner_documents(), strict=True):
        lines.append(f"cat > {policy}.json <<'EOF'\n{json.dumps(doc, indent=2)}\nEOF")
        lines.append(f"aws iam create-policy --policy-name {policy} --policy-document file://{policy}.json")
    return lines + attach_commands(account)


def account_and_iam() -> tuple[str, Any]:
    """The credentials' account (STS) and an IAM client, with the bounded client config."""
    from gpucloud.providers.aws.session import shared_client, shared_session

    session = shared_session()
    region = session.region_name or "us-east-1"
    account = str(shared_client(session, "sts", region).get_caller_identity()["Account"])
    return account, shared_client(session, "iam", region)


def setup(*, dry: bool, confirm: Callable[[list[dict[str, Any]]], bool], say: Callable[[str], None]) -> dict[str, Any]:
    """`gpucloud setup aws`: inspect, show, ask (`confirm`), apply. With `dry` (`--print`) nothing
    is read or created: the commands are returned for an administrator (the account from STS)."""
    from gpucloud.providers.aws.access import classify_access

    if dry:  # for an administrator: the account from STS when these credentials have one
        try:
            account = account_and_iam()[0]
        except Exception:  # noqa: BLE001 - no credentials here: the administrator fills it in
            account = "<account-id>"
        return {"cloud": "aws", "account": account, "commands": print_commands(account)}
    try:
        account, iam = account_and_iam()
        helper = AwsSetup(iam, account)
        pieces = helper.inspect()
        done = all(p["state"] == "present" for p in pieces)
        if not done and confirm(pieces):
            helper.apply(pieces, say)
            pieces = helper.inspect()
    except Exception as exc:  # noqa: BLE001 - access errors become the paragraph with the fix
        access = classify_access(exc, what="setting up the account (IAM)")
        if access is not None:
            access.hint = (
                "`gpucloud setup aws` needs an administrator (iam:CreateRole, iam:PutRolePolicy, "
                "iam:CreatePolicy, iam:CreatePolicyVersion); `gpucloud setup aws --print` shows the "
                "same as commands to hand to one."
            )
            raise access from None
        raise
    return {"cloud": "aws", "account": account, "pieces": pieces, "attach": attach_commands(account)}
