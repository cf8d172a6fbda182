"""`gpucloud run` checks each cloud's credentials with the cloud itself before its launch prompt:
AWS STS GetCallerIdentity (moto server), Azure's subscription GET (the fake ARM server). Working
credentials reach the prompt; a refused key, an unknown or disabled subscription and a dead
endpoint are reported once, before any prompt, and drop that cloud from the plan; with no cloud
left the run exits 78. Through the real CLI on a terminal (so that it would prompt), COLUMNS=80."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.azure_fixtures import arm, fake_arm_server  # noqa: F401  (fixtures)
from tests.support.dead_endpoint import dead_endpoint
from tests.support.fake_arm import FakeArm
from tests.support.moto_iam import enforced
from tests.support.moto_server import ACCOUNT, Moto, moto, moto_server  # noqa: F401  (fixtures)
from tests.support.text import flat

REPO = Path(__file__).resolve().parents[2]
WIDTH = 80
PROMPT = "Launch it?"
JOB = "name: {name}\nresources:\n  {cloud}gpu: T4:1\n  regions: [{regions}]\nrun: echo hi\nmax_duration: 10m\n"
AWS_JOB = JOB.format(name="awsjob", cloud="cloud: aws\n  ", regions="us-east-1")
AZURE_JOB = JOB.format(name="azjob", cloud="cloud: azure\n  ", regions="eastus")
ANY_JOB = JOB.format(name="anyjob", cloud="", regions="us-east-1, eastus")


def base_env(home: Path, **extra: str) -> dict[str, str]:
    """No cloud credentials of this machine, an 80-column terminal, no CI (so `run` may prompt)."""
    prefixes = ("AWS_", "AZURE_", "IDENTITY_", "GPUCLOUD_AZURE", "GPUCLOUD_TEST_", "MSI_", "CI")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.update(
        {
            "GPUCLOUD_HOME": str(home),
            "COLUMNS": str(WIDTH),
            "PYTHONPATH": str(REPO),
            "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-credentials"),
            "AWS_CONFIG_FILE": str(home / "no-config"),
            "AWS_EC2_METADATA_DISABLED": "true",
            "AZURE_CONFIG_DIR": str(home / "no-azure"),
        }
    )
    env.update(extra)
    return env


def run_on_tty(job: str, env: dict[str, str], cwd: Path, *args: str) -> tuple[int, str, str, float]:
    """`gpucloud run JOB` with a terminal on stdin, answering "n" if it prompts; (exit, stdout,
    stderr, seconds). stdout and stderr are pipes, as in a CI log."""
    spec = cwd / "job.yaml"
    spec.write_text(job)
    master, slave = pty.openpty()
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpucloud", "run", str(spec), *args],
        cwd=cwd,
        env=env,
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(slave)
    os.write(master, b"n\n")
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        os.close(master)
    return proc.returncode, out, err, time.monotonic() - t0


def assert_fits(stderr: str) -> None:
    wide = [line for line in stderr.splitlines() if len(line) > WIDTH]
    assert not wide, wide


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


# ---- AWS: STS GetCallerIdentity against moto -----------------------------------------------------


def test_aws_working_credentials_reach_the_prompt(moto: Moto, home: Path, tmp_path: Path) -> None:  # noqa: F811
    from gpucloud.contract import registry as providers

    assert providers.verify_identity("aws") == f"account {ACCOUNT} (arn:aws:sts::{ACCOUNT}:user/moto)"
    code, _, err, _ = run_on_tty(AWS_JOB, base_env(home, **moto.env), tmp_path)
    assert code == 1 and PROMPT in err and "not launched" in err, err
    assert "skipping" not in err and "credentials" not in err, err


@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_aws_dead_endpoint_is_reported_before_any_prompt(kind: str, home: Path, tmp_path: Path) -> None:
    with dead_endpoint(kind) as url:
        env = base_env(home, AWS_ACCESS_KEY_ID="AKIAFAKE", AWS_SECRET_ACCESS_KEY="fake", AWS_ENDPOINT_URL=url)
        env["AWS_DEFAULT_REGION"] = "us-east-1"
        code, _, err, seconds = run_on_tty(AWS_JOB, env, tmp_path)
    assert code == 78 and PROMPT not in err, err
    text = flat(err)
    assert text.count(f"AWS: could not reach {url}") == 1 and "STS GetCallerIdentity" in text, err
    assert "AWS_ENDPOINT_URL" in text and "internal error" not in text
    assert seconds < 30, seconds  # session.py's probe timeouts, not botocore's minute
    assert_fits(err)


def test_aws_rejected_key_is_reported_before_any_prompt(moto: Moto, home: Path, tmp_path: Path) -> None:  # noqa: F811
    env = base_env(home, **moto.env)
    env.update({"AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7NOTREAL", "AWS_SECRET_ACCESS_KEY": "wrong"})
    with enforced(moto):
        code, out, err, _ = run_on_tty(AWS_JOB, env, tmp_path, "--json")
    assert code == 78 and PROMPT not in err, err
    text = flat(err)
    assert text.count("AWS refused the credentials while checking the credentials") == 1, err
    assert "InvalidClientTokenId" in text and "aws configure" in text
    doc = json.loads(out)["error"]
    assert doc["kind"] == "configuration" and doc["exit_code"] == 78
    assert [d["cloud_reason"] for d in doc["details"]][0].startswith("AWS refused the credentials")
    assert_fits(err)


# ---- Azure: the subscription GET against the fake ARM --------------------------------------------


def test_azure_working_credentials_reach_the_prompt(arm: FakeArm, home: Path, tmp_path: Path) -> None:  # noqa: F811
    code, _, err, _ = run_on_tty(AZURE_JOB, base_env(home, **arm.client_env()), tmp_path)
    assert code == 1 and PROMPT in err and "not launched" in err, err
    assert "skipping" not in err and "credentials" not in err, err
    subscription_reads = [c for c in arm.calls if c[0] == "GET" and c[1] == f"/subscriptions/{arm.subscription_id}"]
    assert len(subscription_reads) == 1, arm.calls
    assert not [c for c in arm.calls if c[0] != "GET"], arm.calls  # nothing was created before the answer


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("revoked", "(HTTP 401 InvalidAuthenticationToken: The access token is invalid.)"),
        ("unknown-subscription", "HTTP 404 SubscriptionNotFound"),
        ("disabled", "is Disabled: nothing can be created in it"),
    ],
)
def test_azure_refusal_is_reported_before_any_prompt(
    setup: str,
    expected: str,
    arm: FakeArm,  # noqa: F811
    home: Path,
    tmp_path: Path,
) -> None:
    env = base_env(home, **arm.client_env())
    if setup == "revoked":
        arm.revoked = True
    elif setup == "unknown-subscription":
        env["AZURE_SUBSCRIPTION_ID"] = "11111111-2222-3333-4444-555555555555"
    else:
        arm.subscription_state = "Disabled"
    code, _, err, _ = run_on_tty(AZURE_JOB, env, tmp_path)
    assert code == 78 and PROMPT not in err, err
    text = flat(err)
    assert text.count(expected) == 1, err
    if setup == "unknown-subscription":
        assert "Check AZURE_SUBSCRIPTION_ID" in text
    assert "Traceback" not in err and "internal error" not in text
    assert_fits(err)


def test_an_azure_side_failure_says_nothing_about_the_credentials(
    arm: FakeArm,  # noqa: F811
    home: Path,
    tmp_path: Path,
) -> None:
    """ARM failing the subscription GET (after the pipeline's retries) is not a refusal: Azure stays in
    the plan and the prompt comes; the failover meets the failure, if it lasts."""
    arm.inject("GET", rf"^/subscriptions/{arm.subscription_id}$", code="InternalServerError", times=50)
    code, _, err, _ = run_on_tty(AZURE_JOB, base_env(home, **arm.client_env()), tmp_path)
    assert code == 1 and PROMPT in err and "skipping" not in err, err
    assert len([c for c in arm.calls if c[1] == f"/subscriptions/{arm.subscription_id}"]) > 1  # it was retried


def test_azure_dead_endpoint_is_reported_before_any_prompt(
    arm: FakeArm,  # noqa: F811
    home: Path,
    tmp_path: Path,
) -> None:
    with dead_endpoint("refused") as url:
        env = base_env(home, **{**arm.client_env(), "GPUCLOUD_AZURE_ARM_ENDPOINT": url})
        code, _, err, seconds = run_on_tty(AZURE_JOB, env, tmp_path)
    assert code == 78 and PROMPT not in err, err
    text = flat(err)
    assert text.count("Azure: could not reach") == 1 and "GPUCLOUD_AZURE_ARM_ENDPOINT" in text, err
    assert seconds < 30, seconds
    assert_fits(err)


# ---- both clouds: the one that fails is dropped, once, and the other is offered ---------------------


def test_a_cloud_that_fails_is_dropped_with_its_reason_and_the_other_is_offered(
    arm: FakeArm,  # noqa: F811
    home: Path,
    tmp_path: Path,
) -> None:
    with dead_endpoint("refused") as url:
        env = base_env(home, **arm.client_env())
        env.update({"AWS_ACCESS_KEY_ID": "AKIAFAKE", "AWS_SECRET_ACCESS_KEY": "fake", "AWS_ENDPOINT_URL": url})
        env["AWS_DEFAULT_REGION"] = "us-east-1"
        code, _, err, _ = run_on_tty(ANY_JOB, env, tmp_path)
    assert code == 1 and PROMPT in err, err
    text = flat(err)
    assert text.count("warning: skipping aws: AWS: could not reach") == 1, err
    assert text.index("skipping aws") < text.index(PROMPT)
    plan_line = next(line for line in err.splitlines() if line.startswith("plan: "))
    assert plan_line.startswith("plan: azure/eastus/"), err
    assert_fits(err)
