"""S3 in every region (docs/PROVIDERS.md, "S3 endpoints"): every URL the CLI gives a node names the
bucket's regional virtual-hosted host, and the node counts only a 2xx answer as a delivery.

The URL tests sign offline (fake credentials, no endpoint URL: botocore's presigner needs no
network); the node tests put tests/support/s3_front.py (307 on the global name, 400 in the wrong
region) before moto and run the agent's own Transfer through it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from gpucloud.channel.run_objects import iter_manifest
from gpucloud.contract.registry import capabilities
from gpucloud.providers.aws import data as s3_data
from gpucloud.providers.aws import mount as s3_mount
from gpucloud.providers.aws.channel import S3Channel, bucket_name
from gpucloud.providers.aws.session import reset_shared, shared_session
from gpucloud.vm.agent.transfer import Transfer
from gpucloud.vm.shim import render_shim
from tests.support.aws_runs import EXAMPLES, hooked_cli
from tests.support.aws_sim import aws_sim  # noqa: F401
from tests.support.moto_server import ACCOUNT, moto, moto_server, tagged_alive  # noqa: F401
from tests.support.s3_front import S3Front

REGIONS = ("eu-west-1", "ap-east-1", "us-east-1")
RUN = "regional-20261206-0001"
ENDPOINT_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_USE_DUALSTACK_ENDPOINT", "AWS_USE_FIPS_ENDPOINT")


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Fake credentials, no endpoint URL, no config file: what AWS itself would be given."""
    for name in (*ENDPOINT_VARS, "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEEXAMPLE00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x" * 40)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    reset_shared()
    yield
    reset_shared()


def _urls(text: str) -> list[str]:
    return [word for word in text.split() if word.startswith(("http://", "https://"))]


def _planned(region: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[str]]:
    """The bucket and every URL of a two-node run with checkpoints: manifests, node index, the
    URLs they hold (log POST included) and the user-data; the channel's writes are kept here."""
    written: dict[str, bytes] = {}
    monkeypatch.setattr(S3Channel, "ensure_bucket", lambda self: None)
    monkeypatch.setattr(S3Channel, "put_bytes", lambda self, key, data: written.__setitem__(key, data))
    bucket = bucket_name(ACCOUNT, region)
    channel = S3Channel(shared_session(), region, bucket=bucket, account=ACCOUNT)
    deadline = datetime.now(UTC) + timedelta(hours=2)
    manifests = channel.prepare(RUN, 2, deadline, checkpoint=True, agent=True, secrets=True)
    index = channel.node_index(RUN, manifests, deadline, agent=True)
    shim = render_shim(
        caps=capabilities("aws"),
        run_id=RUN,
        max_duration=7200,
        agent_sha256="0" * 64,
        manifest_url=index,
        node_rank=None,
    )
    urls = [*manifests, index, *_urls(shim)]
    for data in written.values():
        urls += [u for _, rest in iter_manifest(data.decode()) for u in _urls(rest)]
    return bucket, urls


@pytest.mark.parametrize("region", REGIONS)
def test_every_url_of_a_run_names_the_buckets_regional_host(
    region: str, offline: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket, urls = _planned(region, monkeypatch)
    assert len(urls) > 30  # every object of both nodes, the checkpoint slots and the log POST
    for url in urls:
        parts = urlsplit(url)
        assert (parts.scheme, parts.hostname) == ("https", f"{bucket}.s3.{region}.amazonaws.com"), url
        if parts.query:  # presigned GET/PUT: signed for the bucket's region (SigV4)
            assert f"/{region}/s3/aws4_request" in parse_qs(parts.query)["X-Amz-Credential"][0], url


@pytest.mark.parametrize("region", REGIONS)
def test_data_grants_name_the_users_bucket_in_its_own_region(region: str, offline: None) -> None:
    """A user's bucket elsewhere than the run: its own region's host and signature."""
    expires = datetime.now(UTC) + timedelta(hours=1)
    for url in s3_data.input_urls("users-data", region, ["set/a.bin", "set/b.bin"], expires):
        parts = urlsplit(url)
        assert parts.hostname == f"users-data.s3.{region}.amazonaws.com", url
        assert f"/{region}/s3/aws4_request" in parse_qs(parts.query)["X-Amz-Credential"][0]
    grant = s3_data.output_grant("users-out", region, "results/", expires)
    assert urlsplit(grant["url"]).hostname == f"users-out.s3.{region}.amazonaws.com"
    assert s3_mount.endpoint(region) == ""  # rclone's AWS provider: regional and virtual-hosted itself


@pytest.mark.parametrize(
    ("variable", "host"), [("AWS_USE_DUALSTACK_ENDPOINT", "s3.dualstack"), ("AWS_USE_FIPS_ENDPOINT", "s3-fips")]
)
def test_dual_stack_and_fips_only_when_the_user_configured_them(
    variable: str, host: str, offline: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, "true")
    reset_shared()
    bucket, urls = _planned("eu-west-1", monkeypatch)
    assert {urlsplit(u).hostname for u in urls} == {f"{bucket}.{host}.eu-west-1.amazonaws.com"}
    assert s3_mount.endpoint("eu-west-1") == f"https://{host}.eu-west-1.amazonaws.com"
    assert s3_mount.is_aws(s3_mount.endpoint("eu-west-1"))  # the node's rclone: provider AWS, that endpoint


def test_an_endpoint_url_keeps_path_style_on_it(moto: Any) -> None:  # noqa: F811
    """The tests' moto (AWS_ENDPOINT_URL): the store at that URL, the bucket in the path."""
    reset_shared()
    channel = S3Channel(shared_session(), "eu-west-1")
    url = channel.url_get("runs/x/manifest", datetime.now(UTC) + timedelta(hours=1))
    assert url.startswith(f"{moto.endpoint}/{bucket_name(ACCOUNT, 'eu-west-1')}/runs/x/manifest?")
    assert s3_mount.endpoint("eu-west-1") == moto.endpoint and not s3_mount.is_aws(moto.endpoint)


def test_a_bucket_in_another_region_is_found_and_signed_there(moto: Any) -> None:  # noqa: F811
    moto.client("s3", "ap-east-1").create_bucket(
        Bucket="users-far", CreateBucketConfiguration={"LocationConstraint": "ap-east-1"}
    )
    moto.client("s3", "ap-east-1").put_object(Bucket="users-far", Key="set/a", Body=b"a")
    try:
        region, files = s3_data.list_input("users-far", "set", "inputs.x")
        assert (region, files) == ("ap-east-1", [("a", 1, "set/a")])
        url = s3_data.input_urls("users-far", region, ["set/a"], datetime.now(UTC) + timedelta(hours=1))[0]
        assert "/ap-east-1/s3/aws4_request" in parse_qs(urlsplit(url).query)["X-Amz-Credential"][0]
    finally:
        moto.client("s3", "ap-east-1").delete_object(Bucket="users-far", Key="set/a")
        moto.client("s3", "ap-east-1").delete_bucket(Bucket="users-far")


# ---- the node's Transfer through the redirecting front, moto behind it ----------------------------
@pytest.fixture
def channel(moto: Any) -> Iterator[S3Channel]:  # noqa: F811
    reset_shared()
    chan = S3Channel(shared_session(), "us-east-1")
    yield chan
    chan.delete_prefix(f"runs/{RUN}/")


def _front(moto: Any, **kw: Any) -> Iterator[S3Front]:  # noqa: F811
    front = S3Front(upstream=moto.endpoint, **kw).start()
    try:
        yield front
    finally:
        front.stop()


def test_puts_and_posts_redirected_twice_land_on_a_later_try(
    moto: Any,
    channel: S3Channel,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],  # noqa: F811
) -> None:
    expires = datetime.now(UTC) + timedelta(hours=1)
    body = tmp_path / "status.json"
    body.write_text('{"state": "running"}')
    for front in _front(moto, redirects=2):
        transfer = Transfer(sleep=lambda s: None)
        key = f"runs/{RUN}/node-0/status.json"
        assert transfer.put_file(front.url_map(channel.url_put(key, expires)), body, hard=True)
        assert channel.get_bytes(key) == body.read_bytes()
        assert front.codes("/status.json") == [307, 307, 200]
        lines = dict(line.split(" ", 1) for line in channel.log_grant(RUN, 0, expires) if " " in line)
        fields = [tuple(line.split(" ", 2)[1:]) for line in channel.log_grant(RUN, 0, expires) if "_field " in line]
        post_url = front.url_map(lines["log_post"])
        assert transfer.post_form(post_url, fields, lines["log_post_key"] + "00000", body, hard=True)
        assert channel.get_bytes(lines["log_post_key"] + "00000") == body.read_bytes()
    err = capsys.readouterr().err
    assert f"gpucloud: PUT 127.0.0.1:{urlsplit(front.base).port}/{channel.bucket}/{key}: HTTP 307" in err
    assert "X-Amz-Signature" not in err  # the object is named, never the signature


def test_a_redirected_get_is_no_object_and_is_never_followed(
    moto: Any,
    channel: S3Channel,
    tmp_path: Path,  # noqa: F811
) -> None:
    expires = datetime.now(UTC) + timedelta(hours=1)
    key = f"runs/{RUN}/code.tar.gz"
    channel.put_bytes(key, b"the code")
    for front in _front(moto, redirects=2):
        transfer = Transfer(sleep=lambda s: None)
        url = front.url_map(channel.url_get(key, expires))
        assert transfer.get(url) is None and transfer.get(url) is None  # the error document is not the object
        assert transfer.get(url) == b"the code"
        dest = tmp_path / "code.tar.gz"
        front.seen.clear()
        assert transfer.get_file(url, dest) and dest.read_bytes() == b"the code"
        assert front.codes("/code.tar.gz") == [307, 307, 200, 307, 307, 200]


@pytest.mark.parametrize("code", [307, 400])
def test_a_put_that_only_gets_3xx_or_4xx_is_never_delivered_and_says_why(
    moto: Any,
    channel: S3Channel,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    code: int,  # noqa: F811
) -> None:
    expires = datetime.now(UTC) + timedelta(hours=1)
    body = tmp_path / "artifacts.tar.gz"
    body.write_bytes(b"tar")
    key = f"runs/{RUN}/node-0/artifacts.tar.gz"
    for front in _front(moto, redirects=10**9, wrong_region=code == 400):
        transfer = Transfer(sleep=lambda s: None)
        assert not transfer.put_file(front.url_map(channel.url_put(key, expires)), body, hard=True)
        assert front.codes("/artifacts.tar.gz") == [code] * 5  # the hard tries, every one refused
    assert channel.get_bytes(key) is None
    err = capsys.readouterr().err
    assert err.count(f"artifacts.tar.gz: HTTP {code}") == 1  # once per object and answer, not per try
    assert f"{key}: HTTP {code}" in transfer.last_refusal


# ---- a whole run on the AWS simulator, its store answering 307 twice per object -------------------
def test_a_run_on_the_aws_simulator_delivers_everything_through_redirects(
    aws_env: dict[str, str],
    moto: Any,  # noqa: F811
    aws_sim: Any,  # noqa: F811
) -> None:
    """The CLI's S3 goes through the front (AWS_ENDPOINT_URL_S3), so the guests' presigned URLs do
    too: each object's first two node requests are answered 307, and the run still ends with its
    status, log and artifacts, the redirects named on the guest's console."""
    for front in _front(moto, redirects=2):
        env = {**aws_env, "AWS_ENDPOINT_URL_S3": front.base}
        proc = hooked_cli(env, "run", str(EXAMPLES / "quickstart.yaml"), "--cloud", "aws", "--json", timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        doc = json.loads(proc.stdout)
        assert (doc["status"], doc["exit_code"]) == ("succeeded", 0)
        assert (Path(doc["artifacts_dir"]) / "metrics.json").is_file()
        assert "epoch" in proc.stderr  # the log streamed
        for method, end in (
            ("GET", "/manifest"),
            ("GET", "/code.tar.gz"),
            ("PUT", "/status.json"),
            ("PUT", "/artifacts.tar.gz"),
        ):
            codes = front.codes(end, method)  # the node's requests (the CLI's own pass the front)
            assert codes[:3] == [307, 307, 200], (method, end, codes)
        (iid,) = aws_sim.booted
        console = aws_sim.guest(iid).console()
        assert "gpucloud: manifest: HTTP 307" in console and "status.json: HTTP 307" in console
        assert tagged_alive(moto, doc["run_id"]) == []


@pytest.mark.parametrize("answer", ["head", "redirect"])
def test_a_users_bucket_region_comes_from_s3_asked_in_a_real_region(
    answer: str, offline: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HeadBucket is asked of the caller's region (a region-less client is "aws-global", which has
    no FIPS form); the bucket's region is in the answer's header, a redirect's included."""
    from botocore.stub import Stubber

    asked: list[str | None] = []
    real = s3_data.s3_client

    def stubbed(region: str | None = None) -> Any:
        asked.append(region)
        client = real(region)
        stub = Stubber(client)
        meta = {"HTTPHeaders": {"x-amz-bucket-region": "ap-east-1"}}
        if answer == "head":
            stub.add_response("head_bucket", {"ResponseMetadata": meta}, {"Bucket": "users-far"})
        else:
            stub.add_client_error("head_bucket", "301", "Moved", 301, response_meta=meta)
        stub.activate()
        return client

    monkeypatch.setattr(s3_data, "s3_client", stubbed)
    assert s3_data.bucket_region("users-far", "inputs.x") == "ap-east-1"
    assert asked == ["us-east-1"]
