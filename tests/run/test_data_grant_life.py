"""A grant the caller makes at launch can die before the job ends: an Azure SAS or an S3 URL held by
a node that is not an AWS instance lasts 7 days at most. A mounted Azure container longer than that
is refused from the job file; an output that may go up after it is a warning in `plan` (and `run`)."""

from __future__ import annotations

from pathlib import Path

from tests.support.cli import clean_env, cli


def _job(tmp_path: Path, cloud: str, data: str, days: int) -> Path:
    job = tmp_path / f"{cloud}-{days}.yaml"
    job.write_text(
        f"name: long\nresources:\n  cloud: {cloud}\n  gpu: T4:1\n{data}\nrun: python3 train.py\nmax_duration: {days}d\n"
    )
    return job


def test_a_mounted_azure_container_longer_than_its_sas_is_refused(tmp_path: Path) -> None:
    data = "inputs:\n  data/:\n    source: az://acct/datasets/mini\n    mode: mount"
    proc = cli("plan", str(_job(tmp_path, "azure", data, 10)), env=clean_env(columns=200))
    assert proc.returncode == 2, proc.stderr
    assert "inputs.data/" in proc.stderr and "7 days" in proc.stderr and "mode: copy" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_output_that_may_outlive_its_grant_is_a_warning_naming_the_clouds(tmp_path: Path) -> None:
    azure = cli("plan", str(_job(tmp_path, "azure", "outputs:\n  out/: az://acct/results/run", 10)), env=clean_env(200))
    assert azure.returncode == 0, azure.stderr
    assert "warning: outputs.out/: on azure the node writes az://acct/results/run" in azure.stderr
    assert "7 days at most, and max_duration is 10 days" in azure.stderr
    s3 = "outputs:\n  out/: s3://my-results/run"
    on_aws = cli("plan", str(_job(tmp_path, "aws", s3, 10)), env=clean_env(200))
    assert on_aws.returncode == 0 and "grant that lasts" not in on_aws.stderr  # the node signs with its own role
    on_azure = cli("plan", str(_job(tmp_path, "azure", s3, 10)), env=clean_env(200))
    assert "warning: outputs.out/: on azure the node writes s3://my-results/run" in on_azure.stderr
    short = cli("plan", str(_job(tmp_path, "azure", "outputs:\n  out/: az://acct/results/run", 6)), env=clean_env(200))
    assert short.returncode == 0 and "grant that lasts" not in short.stderr
