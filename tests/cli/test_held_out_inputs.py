"""Plain mistakes found by held-out checks end as the error they are, through the real CLI: a
misconfigured Azure sign-in host is a configuration error (exit 78) naming the variable, with no
teardown talk for a run that launched nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.cli import cli

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("authority", ["http://login.example", "ftp://login.microsoftonline.com/"])
def test_an_azure_authority_host_that_is_not_https_is_a_configuration_error(tmp_path: Path, authority: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GPUCLOUD_", "IDENTITY_"))}
    env.update(
        {
            "GPUCLOUD_HOME": str(tmp_path / "home"),
            "CI": "true",
            "AZURE_AUTHORITY_HOST": authority,
            "AZURE_SUBSCRIPTION_ID": "00000000-0000-0000-0000-000000000000",
            "AZURE_TENANT_ID": "t",
            "AZURE_CLIENT_ID": "c",
            "AZURE_CLIENT_SECRET": "s",
            "AZURE_CONFIG_DIR": str(tmp_path / "az"),
            "GPUCLOUD_AZURE_ARM_ENDPOINT": "http://127.0.0.1:9",
        }
    )  # never reached
    (tmp_path / "job.yaml").write_text("name: auth\nrun: echo hi\nresources: {gpu: T4:1}\nmax_duration: 10m\n")
    out = cli("run", "job.yaml", "--cloud", "azure", "--yes", env=env, cwd=tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 78, text
    assert "AZURE_AUTHORITY_HOST" in out.stderr and "https://" in out.stderr, text
    assert "teardown" not in text and "internal error" not in text, text
    status = cli("ls", env=env, cwd=tmp_path)  # found by the credentials check before the prompt: no run started
    assert status.returncode == 0 and "auth-" not in status.stdout
    check = cli("check", "--cloud", "azure", env=env, cwd=tmp_path)
    assert check.returncode != 0 and "AZURE_AUTHORITY_HOST" in check.stdout + check.stderr
    assert "internal error" not in check.stdout + check.stderr


def test_a_bare_or_https_authority_host_is_left_to_azure_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucloud.providers.azure.access import authority_error, classify_access

    for fine in ("", "https://login.microsoftonline.us", "login.microsoftonline.com"):
        monkeypatch.setenv("AZURE_AUTHORITY_HOST", fine)
        assert authority_error() is None
    monkeypatch.setenv("AZURE_AUTHORITY_HOST", "http://x")
    err = classify_access(
        ValueError("'http://x' is an invalid authority. The value must be a TLS protected (https) URL.")
    )
    assert err is not None and err.exit_code == 78 and "AZURE_AUTHORITY_HOST" in err.message
