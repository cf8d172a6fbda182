"""The container image's pull login: checked and obtained by the CLI (ECR against moto's real ECR
API in server mode, or `container.login` with a secret), sealed to each node's key beside its
secrets, asked for again when it is about to run out, and what `iam-policy aws --data` adds for it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpucloud.errors import UserError
from gpucloud.run.pull_login import PullLogin, PullLogins, pull_logins
from gpucloud.run.secrets import SecretDelivery
from gpucloud.spec.load import parse_spec
from gpucloud.vm.agent import sealed
from tests.support.azure_fixtures import arm, fake_arm_server  # noqa: F401
from tests.support.cli import cli
from tests.support.fake_arm import FakeArm
from tests.support.local_runs import write_job
from tests.support.moto_server import Moto, moto, moto_server  # noqa: F401
from tests.support.node_keys import OneNodeChannel, openssl_node_key

ACCOUNT = "123456789012"  # moto's account
HOST = f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com"
MANIFEST = json.dumps(
    {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "size": 2,
            "digest": "sha256:" + "a" * 64,
        },
        "layers": [],
    }
)


def job(image: str, extra: str = "") -> Any:
    return parse_spec(
        f"name: c\nresources: {{cloud: aws, gpu: T4}}\ncontainer: {image}\nrun: 'true'\n{extra}", "job.yaml"
    )


def push(moto: Moto, repo: str, tag: str) -> None:  # noqa: F811
    ecr = moto.client("ecr")
    try:
        ecr.create_repository(repositoryName=repo)
    except ecr.exceptions.RepositoryAlreadyExistsException:
        pass
    try:
        ecr.put_image(repositoryName=repo, imageManifest=MANIFEST, imageTag=tag)
    except ecr.exceptions.ImageAlreadyExistsException:  # the session's moto server keeps it
        pass


def test_ecr_image_gets_a_token_login_for_its_registry(moto: Moto) -> None:  # noqa: F811
    push(moto, "team/train", "1.4")
    logins = pull_logins(job(f"{HOST}/team/train:1.4"), {})
    assert logins is not None
    assert logins.current() == {"server": HOST, "username": "AWS", "password": f"{ACCOUNT}-auth-token"}


@pytest.mark.parametrize(
    ("image", "says"),
    [
        (f"{HOST}/team/nope:1.4", "ECR repository 'team/nope' does not exist in account 123456789012"),
        (f"{HOST}/team/train:9.9", "ECR repository 'team/train' has no image 9.9"),
    ],
)
def test_a_missing_ecr_image_fails_before_launch_naming_it(moto: Moto, image: str, says: str) -> None:  # noqa: F811
    push(moto, "team/train", "1.4")
    with pytest.raises(UserError) as err:
        pull_logins(job(image), {})
    assert says in err.value.message and f"container: {image}" in err.value.message


def test_public_images_need_no_login_and_a_login_takes_its_secret() -> None:
    assert pull_logins(job("nvcr.io/nvidia/pytorch:24.08-py3"), {}) is None
    spec = job(
        "{image: nvcr.io/nvidia/pytorch:24.08-py3, login: {username: $oauthtoken, password_secret: NGC_API_KEY}}",
        "secrets: [NGC_API_KEY]\n",
    )
    logins = pull_logins(spec, {"NGC_API_KEY": "nvapi-xyz"})
    assert logins is not None
    assert logins.current() == {"server": "nvcr.io", "username": "$oauthtoken", "password": "nvapi-xyz"}
    assert "nvapi-xyz" not in repr(PullLogin("nvcr.io", "u", "nvapi-xyz"))


def test_a_token_is_asked_again_when_less_than_an_hour_is_left() -> None:
    now = [0.0]
    made: list[float] = []

    def make() -> PullLogin:
        made.append(now[0])
        return PullLogin("r.example", "AWS", f"t{len(made)}", expires_at=now[0] + 12 * 3600)

    logins = PullLogins(make, now=lambda: now[0])
    assert logins.current()["password"] == "t1"
    now[0] = 10 * 3600
    assert logins.current()["password"] == "t1"
    now[0] = 11.5 * 3600
    assert logins.current()["password"] == "t2" and made == [0.0, 11.5 * 3600]


def test_the_login_rides_sealed_to_the_node_key_only(tmp_path: Path) -> None:
    pub, seed = openssl_node_key(tmp_path)
    channel = OneNodeChannel(pub)
    logins = PullLogins(lambda: PullLogin("r.example:5000", "bot", "s3cr3t-pw"))
    delivery = SecretDelivery("run-1", 1, {}, None, logins)
    assert delivery.wanted and delivery.step(SimpleNamespace(channel=channel, deadline=0)) == []
    (blob,) = channel.objects.values()
    assert b"s3cr3t-pw" not in blob
    doc = json.loads(sealed.open_sealed(seed, blob))
    assert doc["registry"] == {"server": "r.example:5000", "username": "bot", "password": "s3cr3t-pw"}
    assert doc["env"] == {}


def test_iam_policy_data_adds_only_the_ecr_pull_of_the_jobs_repository(tmp_path: Path) -> None:
    from tests.support.iam_eval import Request, decide

    spec = write_job(
        tmp_path / "job",
        {"name": "c", "resources": {"cloud": "aws", "gpu": "T4"}, "container": f"{HOST}/team/train:1.4", "run": "true"},
    )
    policy = json.loads(cli("iam-policy", "aws", "--data", str(spec), cwd=tmp_path, check=True).stdout)
    ecr = [s for s in policy["Statement"] if s["Sid"].startswith("Ecr")]
    repo = f"arn:aws:ecr:us-east-1:{ACCOUNT}:repository/team/train"
    allowed = [
        Request("ecr:GetAuthorizationToken", "*"),
        Request("ecr:BatchGetImage", repo),
        Request("ecr:GetDownloadUrlForLayer", repo),
        Request("ecr:DescribeImages", repo),
    ]
    denied = [
        Request("ecr:BatchGetImage", f"arn:aws:ecr:us-east-1:{ACCOUNT}:repository/team/other"),
        Request("ecr:PutImage", repo),
        Request("ecr:DeleteRepository", repo),
    ]
    assert [decide({"Statement": ecr}, r) for r in allowed] == ["Allow"] * len(allowed)
    assert [decide({"Statement": ecr}, r) for r in denied] == ["ImplicitDeny"] * len(denied)
    public = write_job(tmp_path / "pub", {"name": "c", "container": "pytorch/pytorch:2.4.0", "run": "true"})
    plain = json.loads(cli("iam-policy", "aws", "--data", str(public), cwd=tmp_path, check=True).stdout)
    assert not [s for s in plain["Statement"] if s["Sid"].startswith("Ecr")]


class _AcrExchange:
    """ACR's token exchange as its docs describe it (POST /oauth2/exchange, form grant_type=access_token,
    service, tenant, access_token; 200 {"refresh_token"}; 401 for a token Entra ID did not issue), with
    the fake ARM server as the token issuer."""

    def __init__(self, arm: FakeArm, registries: set[str]) -> None:  # noqa: F811
        import base64 as b64
        import threading
        import urllib.parse
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen: list[dict[str, str]] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                form = dict(urllib.parse.parse_qsl(self.rfile.read(int(self.headers["Content-Length"])).decode()))
                seen.append(form)
                ok = (
                    self.path == "/oauth2/exchange"
                    and form.get("grant_type") == "access_token"
                    and form.get("service") in registries
                    and arm.principal_of(form.get("access_token", "")) is not None
                )
                claims = b64.urlsafe_b64encode(json.dumps({"exp": 4102444800}).encode()).decode().rstrip("=")
                body = {"refresh_token": f"hdr.{claims}.sig"} if ok else {"errors": [{"code": "UNAUTHORIZED"}]}
                raw = json.dumps(body).encode()
                self.send_response(200 if ok else 401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.seen = seen
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


def test_acr_image_gets_a_refresh_token_for_the_callers_entra_token(
    arm: FakeArm,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    acr = _AcrExchange(arm, {"myteam.azurecr.io"})
    monkeypatch.setenv("GPUCLOUD_AZURE_ACR_ENDPOINT", acr.url)
    try:
        logins = pull_logins(job("myteam.azurecr.io/train/x:1"), {})
        assert logins is not None
        got = logins.current()
        assert got["server"] == "myteam.azurecr.io" and got["username"] == "00000000-0000-0000-0000-000000000000"
        assert got["password"].startswith("hdr.") and acr.seen[-1]["service"] == "myteam.azurecr.io"
        with pytest.raises(UserError) as err:  # the registry refuses: a clear error before launch
            pull_logins(job("otherteam.azurecr.io/train/x:1"), {})
        assert "otherteam.azurecr.io refused the exchange" in err.value.message and "AcrPull" in (err.value.hint or "")
    finally:
        acr.server.shutdown()
