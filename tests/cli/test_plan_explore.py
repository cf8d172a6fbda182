"""`plan` as a place to explore: the README's job file and every file in examples/ plan with exit 0,
in price order and 80 columns wide (its market, price and estimate columns kept), in a shell with no
cloud credentials and no secret values (a real subprocess, AWS_*/AZURE_* removed, HOME without
~/.aws); what it could not check (an unset secret, a bucket without credentials for its store, a URL
that does not answer) is one warning line each, naming the field, in `warnings` of `--json` too;
`--strict` (CI) makes them errors, exit 2; `run` still refuses them before anything is created."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.cli import cli
from tests.support.sshd import example_hosts_lab, have_sshd
from tests.support.text import header, too_wide

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.relative_to(REPO / "examples") for p in (REPO / "examples").rglob("*.yaml"))
README_JOB = Path("readme-job.yaml")  # the README's job file, written beside the examples
NEEDS_A_CLUSTER = {Path("slurm/k80-slurm.yaml")}  # tests/providers/slurm/test_slurm_e2e.py plans it


def readme_job() -> str:
    """The README's job file, found as tests/support/job_fuzzer.py finds it (the yaml block with `run:`)."""
    blocks = re.findall(r"```yaml\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    return next(b for b in blocks if re.search(r"^run:", b, re.M))


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of examples/ (workdirs resolve there) with the README's job file beside them."""
    root = tmp_path_factory.mktemp("explore") / "examples"
    shutil.copytree(REPO / "examples", root)
    (root / README_JOB).write_text(readme_job())
    return root


@pytest.fixture(scope="module")
def bare_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment of someone with no cloud account yet: no AWS_*/AZURE_* variable, a HOME
    without credential files, no secret values; a URL does not answer (a proxy on a closed port);
    the examples' placeholder SSH host served by a stub machine."""
    home = tmp_path_factory.mktemp("home")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "ARM_"))}
    for name in ("HF_TOKEN", "WANDB_API_KEY"):
        env.pop(name, None)
    env.update(
        HOME=str(home),
        CI="true",
        AWS_EC2_METADATA_DISABLED="true",  # not on EC2: boto3 must not wait for an instance role
        COLUMNS="80",  # every plan must fit a terminal 80 wide
        HTTPS_PROXY="http://127.0.0.1:9",
        https_proxy="http://127.0.0.1:9",
        PYTHONPATH=str(REPO),
    )
    lab = example_hosts_lab(tmp_path_factory.mktemp("hosts") / "lab") if have_sshd() else None
    if lab is not None:
        env.update(lab.env())
    yield env
    if lab is not None:
        lab.close()


def unchecked_fields(path: Path) -> list[str]:
    """The fields of a job file `plan` cannot check without credentials or secret values."""
    doc = yaml.safe_load(path.read_text())
    fields = [f"secrets: {name}" for name in doc.get("secrets") or []]
    fields += [
        f"inputs.{k}" for k, v in (doc.get("inputs") or {}).items() if str(v).startswith(("s3:", "az:", "https:"))
    ]
    fields += [f"outputs.{k}" for k in doc.get("outputs") or {}]
    return fields


def _fits_and_keeps_what_plan_is_for(stdout: str, stderr: str, candidates: list[dict]) -> None:
    """80 columns: the market, price and estimate columns kept, instance names never cut, and the
    columns it dropped named on stderr."""
    head = header(stdout, "#") if "#" in stdout.split("─")[0] else header(stdout, "cloud")
    assert "market" in head and "$/h" in head and "est. $" in head, head
    for c in candidates[:10]:
        assert c["instance_type"] in stdout.split(), c["instance_type"]  # whole, never cut
    if "GPUs" not in head:
        assert any("not shown" in line for line in stderr.splitlines()) and "GPUs" in stderr, stderr


@pytest.mark.parametrize("rel", [README_JOB, *EXAMPLES], ids=str)
def test_plan_of_every_example_exits_0_without_credentials(rel: Path, examples: Path, bare_env: dict[str, str]) -> None:
    if rel in NEEDS_A_CLUSTER:
        pytest.skip("a Slurm login node: planned against a real cluster in tests/providers/slurm")
    if "hosts:" in (examples / rel).read_text() and not have_sshd():
        pytest.skip("needs /usr/sbin/sshd and ssh (openssh-server; .ci/run installs it)")
    human = cli("plan", str(rel), cwd=examples, env=bare_env)
    assert human.returncode == 0 and "Candidates" in human.stdout, human.stderr
    assert not too_wide(human.stdout) and not too_wide(human.stderr), too_wide(human.stdout + human.stderr)
    said = " ".join(human.stderr.split())
    fields = unchecked_fields(examples / rel)
    for field in fields:
        assert f"warning: {field}" in said, said
    assert "`run` checks it before anything is created" in said or not any(f.startswith(("in", "out")) for f in fields)
    out = cli("plan", "--json", str(rel), cwd=examples, env=bare_env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["candidates"] and all(c["arch"] for c in doc["candidates"])
    prices = [c["total_per_hour"] for c in doc["candidates"]]
    assert prices == sorted(prices)
    _fits_and_keeps_what_plan_is_for(human.stdout, human.stderr, doc["candidates"])
    for field in fields:
        assert any(w.startswith(field) for w in doc["warnings"]), (field, doc["warnings"])
    strict = cli("plan", "--strict", str(rel), cwd=examples, env=bare_env)
    if not fields:
        assert strict.returncode == 0, strict.stderr
        return
    assert strict.returncode == 2, strict.stderr
    said = " ".join(strict.stderr.split())
    assert f"plan --strict: {len(fields)} part(s) of the job could not be checked here" in said, said
    assert all(f"- {field}" in said for field in fields) and "Traceback" not in said


def test_the_readme_and_the_data_example_have_what_plan_cannot_check(examples: Path) -> None:
    """The two files the walk above must warn about really have secrets and buckets."""
    assert {"secrets: HF_TOKEN", "inputs.data/", "outputs.ckpt/"} <= set(unchecked_fields(examples / README_JOB))
    assert len(unchecked_fields(examples / "data/finetune.yaml")) == 5


def test_strict_json_is_the_error_document(examples: Path, bare_env: dict[str, str]) -> None:
    out = cli("plan", "--strict", "--json", "data/finetune.yaml", cwd=examples, env=bare_env)
    assert out.returncode == 2
    error = json.loads(out.stdout)["error"]
    assert error["exit_code"] == 2 and "secrets: HF_TOKEN" in error["message"]


def test_a_secret_given_is_no_warning_and_a_bucket_with_credentials_is_still_checked(
    examples: Path, bare_env: dict[str, str]
) -> None:
    """Values make the secrets' warnings go; with credentials configured (a dead endpoint) the
    bucket is looked up and its failure stays an error, as before."""
    env = {**bare_env, "HF_TOKEN": "x", "WANDB_API_KEY": "y"}
    out = cli("plan", "--json", "data/finetune.yaml", cwd=examples, env=env)
    assert out.returncode == 0, out.stderr
    warnings = json.loads(out.stdout)["warnings"]
    assert not [w for w in warnings if w.startswith("secrets:")] and any(w.startswith("inputs.") for w in warnings)
    configured = {
        **env,
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_MAX_ATTEMPTS": "1",
    }
    refused = cli("plan", "data/finetune.yaml", cwd=examples, env=configured)
    assert refused.returncode == 2 and "s3://" not in refused.stderr.split("error:")[0]
    assert "inputs.data/imagenet-mini/: cannot reach S3" in " ".join(refused.stderr.split()), refused.stderr


def test_run_still_refuses_them_before_anything_is_created(
    examples: Path, bare_env: dict[str, str], tmp_path: Path
) -> None:
    home = {**bare_env, "GPUCLOUD_HOME": str(tmp_path / "home")}
    no_secret = cli("run", "--yes", "--cloud", "local", "data/finetune.yaml", cwd=examples, env=home)
    assert no_secret.returncode == 2
    assert "secret HF_TOKEN, WANDB_API_KEY has no value: nothing was launched" in " ".join(no_secret.stderr.split())
    with_secrets = {**home, "HF_TOKEN": "x", "WANDB_API_KEY": "y"}
    no_bucket = cli("run", "--yes", "--cloud", "local", "data/finetune.yaml", cwd=examples, env=with_secrets)
    assert no_bucket.returncode == 2, no_bucket.stderr
    assert "inputs.data/imagenet-mini/: cannot reach S3" in " ".join(no_bucket.stderr.split())


def test_the_example_pipelines_plan_with_strict() -> None:
    """CI learns at plan time what `run` would refuse (docs/CI.md)."""
    for name in ("github-actions.yml", "gitlab-ci.yml"):
        text = (REPO / "examples" / "ci" / name).read_text()
        plans = [line for line in text.splitlines() if re.search(r"^\s*(- )?gpucloud plan ", line)]
        assert plans and all("--strict" in line for line in plans), (name, plans)


def test_a_store_without_credentials_is_not_asked_and_the_job_files_own_limits_still_hold(
    bare_env: dict[str, str], tmp_path: Path
) -> None:
    """An az:// input with no Azure credentials here: not asked at all (the SDK, with no way to
    sign in and no network, retried for about 3 minutes), one warning. A mount longer than S3's
    token limit is wrong in the file itself: still exit 2 without credentials."""
    import time

    job = tmp_path / "az.yaml"
    job.write_text("name: az\nresources:\n  gpu: T4:1\ninputs:\n  d/: az://myacct/data/x\nrun: x\n")
    started = time.monotonic()
    out = cli("plan", "--json", str(job), cwd=tmp_path, env=bare_env)
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - started < 20
    assert "inputs.d/: az://myacct/data/x was not checked (no Azure credentials found here)" in " ".join(
        json.loads(out.stdout)["warnings"]
    )
    long = tmp_path / "mount.yaml"
    long.write_text(
        "name: m\nresources:\n  gpu: T4:1\ninputs:\n  d/: {source: s3://my-bucket/p, mode: mount}\n"
        "max_duration: 48h\nrun: x\n"
    )
    refused = cli("plan", str(long), cwd=tmp_path, env=bare_env)
    assert refused.returncode == 2 and "at most 36 hours" in " ".join(refused.stderr.split()), refused.stderr
