"""The per-run node roles in moto's IAM, and a SigV4 front's authorizer that applies their inline
policies to each request as S3 would (tests/support/s3_sigv4.py `authorize`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import parse_qs, unquote

from tests.support.iam_eval import Request, decide
from tests.support.moto_server import Moto


def node_roles(moto: Moto) -> list[str]:
    iam = moto.client("iam")
    return [r["RoleName"] for r in iam.list_roles(PathPrefix="/gpucloud/")["Roles"]]


def role_policies(moto: Moto) -> Callable[[str, str, str, str], bool]:
    """The front's IAM: the CLI's key may do anything; any other key (a node's role) what the
    inline policies of the run's roles allow, evaluated per request as S3 would."""

    def allowed(key: str, method: str, path: str, query: str) -> bool:
        if key == "testing":
            return True
        iam = moto.client("iam")
        docs = []
        for role in node_roles(moto):
            for name in iam.list_role_policies(RoleName=role)["PolicyNames"]:
                raw = iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"]
                docs.append(json.loads(raw) if isinstance(raw, str) else raw)
        bucket, _, obj = unquote(path).lstrip("/").partition("/")
        if not obj:
            prefix = parse_qs(query).get("prefix", [""])[0]
            request = Request("s3:ListBucket", f"arn:aws:s3:::{bucket}", {"s3:prefix": prefix} if prefix else {})
        else:
            action = {"GET": "s3:GetObject", "HEAD": "s3:GetObject", "PUT": "s3:PutObject"}.get(method, "s3:Other")
            request = Request(action, f"arn:aws:s3:::{bucket}/{obj}", {})
        return any(decide(doc, request) == "Allow" for doc in docs)

    return allowed
