"""The process's shared AWS clients: a client made before any credentials existed is not kept, so
credentials that appear later (an `aws sso login` in another terminal, variables set by a wrapper)
are used by the next call instead of failing it with "Unable to locate credentials" for the rest
of the process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.exceptions import NoCredentialsError

from gpucloud.providers.aws.session import reset_shared, shared_client


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", raising=False)
    monkeypatch.delenv("AWS_WEB_IDENTITY_TOKEN_FILE", raising=False)
    reset_shared()
    yield
    reset_shared()


def _presign(client: object) -> str:
    return str(client.generate_presigned_url("get_caller_identity", ExpiresIn=60))  # type: ignore[attr-defined]


def test_a_client_made_without_credentials_is_not_kept(no_credentials: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    session = boto3.Session(region_name="us-east-1")
    early = shared_client(session, "sts", "us-east-1")
    with pytest.raises(NoCredentialsError):
        _presign(early)

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEEXAMPLE00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x" * 40)
    later = shared_client(session, "sts", "us-east-1")
    assert later is not early
    assert "X-Amz-Credential=AKIAEXAMPLEEXAMPLE00" in _presign(later)
    assert shared_client(session, "sts", "us-east-1") is later  # kept once it can sign


def test_the_shared_session_follows_the_aws_variables(no_credentials: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client made under one AWS_ENDPOINT_URL (or keys, or region) is not handed out under another."""
    from gpucloud.providers.aws.session import shared_session

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEEXAMPLE00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x" * 40)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    first = shared_session()
    assert shared_session() is first  # nothing changed: the same session and clients
    assert shared_client(first, "s3", "us-east-1").meta.endpoint_url == "http://127.0.0.1:1"

    monkeypatch.delenv("AWS_ENDPOINT_URL")
    second = shared_session()
    assert second is not first
    assert shared_client(second, "s3", "us-east-1").meta.endpoint_url == "https://s3.us-east-1.amazonaws.com"
