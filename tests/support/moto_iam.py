"""moto as the IAM decision-maker of an AWS test (docs/PROVIDERS.md, "Testing against fakes").

With `enforced(moto)` every request to the session's moto server is authenticated (SigV4 signature,
access key -> IAM user) and authorised by moto against the policies of that user in moto's own IAM
(`INITIAL_NO_AUTH_ACTION_COUNT` = 0, moto's switch). Three gaps of moto's evaluation are bridged
here, and only these:
- moto knows no resource ARN for most services (EC2, SSM, STS, Scheduler, Service Quotas): it asks
  about resource "*", which a statement naming ARNs never matches. Such a statement is taken to
  match: moto then decides by action only. Resources and condition keys (tags, IMDSv2, encryption,
  PassedToService ...) stay the project's own evaluator's job (tests/support/iam_eval.py).
- moto does not substitute policy variables; `${aws:PrincipalAccount}` becomes the account.
- moto names a few S3 operations by API name where IAM has its own action: HeadBucket is
  s3:ListBucket, a bucket's PutPublicAccessBlock is s3:PutBucketPublicAccessBlock, and
  PutBucketEncryption (which moto files under CreateBucket) is s3:PutEncryptionConfiguration
  (Service Authorization Reference, Amazon S3).
- moto cannot authorise a presigned request (no Authorization header: it fails with a 500). A
  presigned GET/PUT is decided for the user who signed it (its access key id), as AWS does; a
  presigned POST's policy is not evaluated (its signer's s3:PutObject is, by the CLI's own calls).
- moto verifies the SigV4 signature of a body-less GET or DELETE with query parameters (EventBridge
  Scheduler's DeleteSchedule/GetSchedule/ListSchedules `?groupName=`) as if those parameters were a
  form body, so every such call failed SignatureDoesNotMatch: such a request is checked with the
  empty body it was signed with.
The harness's own key ("testing": seeding, the VM simulator, leak checks) is an IAM user with
`*` on `*`: it plays AWS itself, not a customer.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.support.moto_server import ACCOUNT, Moto

HARNESS_USER = "gpucloud-test-harness"


def _harness_user() -> None:
    from moto.iam.models import iam_backends

    iam = iam_backends[ACCOUNT]["aws"]
    if any(u.name == HARNESS_USER for u in iam.list_users("/", None, None)):
        return
    iam.create_user(region_name="us-east-1", user_name=HARNESS_USER, path="/", tags=[])
    iam.put_user_policy(
        HARNESS_USER,
        "everything",
        json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}),
    )
    key = iam.create_access_key(HARNESS_USER)
    key.access_key_id, key.secret_access_key = "testing", "testing"


def _statement_matches(orig: Any) -> Any:
    def check(self: Any, element: str, value: str) -> bool:
        if element in ("Resource", "NotResource"):
            if value == "*" and element == "Resource":
                return True  # moto names no resource for this call: decide by action
            stmt = self._statement
            items = stmt[element] if isinstance(stmt[element], list) else [stmt[element]]
            self._statement = {**stmt, element: [i.replace("${aws:PrincipalAccount}", ACCOUNT) for i in items]}
            try:
                return bool(orig(self, element, value))
            finally:
                self._statement = stmt
        return bool(orig(self, element, value))

    return check


_S3_ACTIONS = {"s3:HeadBucket": "s3:ListBucket", "s3:PutPublicAccessBlock": "s3:PutBucketPublicAccessBlock"}


def _iam_action(action: str, path: str) -> str:
    """The IAM action of the S3 request moto calls `action` (see the module doc)."""
    query = urllib.parse.urlparse(path).query
    if action == "s3:CreateBucket" and "encryption" in urllib.parse.parse_qs(query, keep_blank_values=True):
        return "s3:PutEncryptionConfiguration"
    return _S3_ACTIONS.get(action, action)


def _s3_action_names(orig: Any) -> Any:
    def check(self: Any, resource: str) -> None:
        self._action = _iam_action(self._action, self._path)
        return orig(self, resource)  # type: ignore[no-any-return]

    return check


def _presigned(orig: Any) -> Any:
    def authenticate(self: Any, iam_request_cls: type, resource: str = "*") -> None:
        from moto import settings
        from moto.core.authorization import ActionAuthenticatorMixin

        if (
            "Authorization" in self.headers
            or ActionAuthenticatorMixin.request_count < settings.INITIAL_NO_AUTH_ACTION_COUNT
        ):
            return orig(self, iam_request_cls, resource)
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.uri).query)
        credential = (query.get("X-Amz-Credential") or query.get("AWSAccessKeyId") or [""])[0]
        if not credential:
            return None  # a presigned POST: its form policy was signed by a user allowed s3:PutObject
        from moto.iam.access_control import IAMPolicy, PermissionResult, create_access_key
        from moto.s3.exceptions import S3AccessDeniedError

        key = create_access_key(
            account_id=self.current_account, partition="aws", access_key_id=credential.split("/")[0], headers={}
        )
        action = _iam_action(f"s3:{self.data.get('Action') or self._get_action()}", self.uri)
        results = [IAMPolicy(p).is_action_permitted(action, resource) for p in key.collect_policies()]
        if PermissionResult.DENIED in results or PermissionResult.PERMITTED not in results:
            raise S3AccessDeniedError()
        return None

    return authenticate


def _bodyless_requests(orig: Any) -> Any:
    def create(self: Any) -> Any:
        if self._method in ("GET", "DELETE", "HEAD") and not self._body:
            saved = self._data
            self._data = b""
            try:
                return orig(self)
            finally:
                self._data = saved
        return orig(self)

    return create


@contextmanager
def enforced(moto: Moto) -> Iterator[None]:
    """IAM enforcement on the session's moto server for the duration (restored after)."""
    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin
    from moto.iam.access_control import IAMPolicyStatement, IAMRequestBase, S3IAMRequest

    _harness_user()
    saved = (
        settings.INITIAL_NO_AUTH_ACTION_COUNT,
        ActionAuthenticatorMixin.request_count,
        IAMPolicyStatement._check_element_matches,
        ActionAuthenticatorMixin._authenticate_and_authorize_action,
    )
    IAMPolicyStatement._check_element_matches = _statement_matches(saved[2])  # type: ignore[method-assign]
    ActionAuthenticatorMixin._authenticate_and_authorize_action = _presigned(saved[3])  # type: ignore[method-assign]
    checked = _s3_action_names(S3IAMRequest.check_action_permitted)
    S3IAMRequest.check_action_permitted = checked  # type: ignore[method-assign]
    created = IAMRequestBase._create_aws_request
    IAMRequestBase._create_aws_request = _bodyless_requests(created)  # type: ignore[method-assign]
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    ActionAuthenticatorMixin.request_count = 0
    try:
        yield
    finally:
        IAMRequestBase._create_aws_request = created  # type: ignore[method-assign]
        settings.INITIAL_NO_AUTH_ACTION_COUNT, ActionAuthenticatorMixin.request_count = saved[0], saved[1]
        IAMPolicyStatement._check_element_matches = saved[2]  # type: ignore[method-assign]
        ActionAuthenticatorMixin._authenticate_and_authorize_action = saved[3]  # type: ignore[method-assign]
        del S3IAMRequest.check_action_permitted  # back to IAMRequestBase's


def iam_user(moto: Moto, name: str, policy: dict[str, Any]) -> dict[str, str]:
    """An IAM user whose only policy is `policy` (moto validates the document as IAM does); the
    environment variables of its access key."""
    iam = moto.client("iam")
    try:
        iam.create_user(UserName=name)
    except iam.exceptions.EntityAlreadyExistsException:
        for key in iam.list_access_keys(UserName=name)["AccessKeyMetadata"]:
            iam.delete_access_key(UserName=name, AccessKeyId=key["AccessKeyId"])
        for pol in iam.list_user_policies(UserName=name)["PolicyNames"]:
            iam.delete_user_policy(UserName=name, PolicyName=pol)
    iam.put_user_policy(UserName=name, PolicyName="gpucloud", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
