"""Secrets and data on the AWS simulator (moto + the VM simulator running the real shim and
agent): the job gets its secret and its S3 input, writes its output to a bucket, and the value is
in no user-data (DescribeInstanceAttribute), no object of any bucket, no file under
GPUCLOUD_HOME and no output of the CLI, while the job printed its SHA-256.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import secrets
from pathlib import Path

from tests.support.aws_runs import aws_env, hooked_cli, run_id_in  # noqa: F401
from tests.support.aws_sim import aws_sim  # noqa: F401
from tests.support.azure_fixtures import arm, azure_env, azurite, fake_arm_server  # noqa: F401
from tests.support.azure_sim import azure_sim  # noqa: F401
from tests.support.cli import cli
from tests.support.moto_server import Moto, moto, moto_server  # noqa: F401


def _user_data(moto: Moto) -> list[bytes]:
    ec2 = moto.client("ec2")
    out = []
    for res in ec2.describe_instances()["Reservations"]:
        for inst in res["Instances"]:
            attr = ec2.describe_instance_attribute(InstanceId=inst["InstanceId"], Attribute="userData")
            raw = base64.b64decode(attr.get("UserData", {}).get("Value", "") or "")
            out.append(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return out


def test_secret_and_data_on_aws(aws_env: dict[str, str], moto: Moto, tmp_path: Path) -> None:  # noqa: F811
    value = "hf_" + secrets.token_hex(24)
    s3 = moto.client("s3")
    for bucket in ("gc-sec-in", "gc-sec-out"):
        s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket="gc-sec-in", Key="set/a.txt", Body=b"alpha")
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: awssec\nresources: {cloud: aws, regions: [us-east-1], gpu: T4:1}\nsecrets: [HF_TOKEN]\n"
        "inputs: {data/: s3://gc-sec-in/set}\noutputs: {out/: s3://gc-sec-out/r}\n"
        'run: \'printf %s "$HF_TOKEN" | sha256sum; echo raw=$HF_TOKEN; cat data/a.txt; '
        "mkdir -p out && echo result > out/r.txt; sleep 4'\nmax_duration: 10m\n"
        "outputs_sync: interval\ncheckpoint_interval: 1s\n"
    )
    env = {**aws_env, "HF_TOKEN": value}
    proc = hooked_cli(env, "run", str(job), "--cloud", "aws", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert hashlib.sha256(value.encode()).hexdigest() in proc.stdout and "raw=***" in proc.stdout
    assert "alpha" in proc.stdout
    assert s3.get_object(Bucket="gc-sec-out", Key="r/r.txt")["Body"].read() == b"result\n"
    # outputs_sync: interval: the file went up while the job slept; the final pass had nothing new.
    assert "outputs: out/: 1/1 files" in proc.stdout and "outputs: out/: 0/0 files" in proc.stdout
    needle = value.encode()
    datas = _user_data(moto)
    assert datas and not any(needle in d for d in datas)
    for bucket in s3.list_buckets()["Buckets"]:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket["Name"]):
            for obj in page.get("Contents") or []:
                body = s3.get_object(Bucket=bucket["Name"], Key=obj["Key"])["Body"].read()
                assert needle not in body, f"{bucket['Name']}/{obj['Key']}"
    home = Path(aws_env["GPUCLOUD_HOME"])
    assert [str(p) for p in home.rglob("*") if p.is_file() and needle in p.read_bytes()] == []
    status = hooked_cli(env, "status", run_id_in(proc.stderr), "--json")
    assert value not in proc.stdout + proc.stderr + status.stdout + status.stderr


def test_secret_and_data_on_azure(azure_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """The same on the Azure simulator (fake ARM + Azurite + the VM simulator): az:// in and out."""
    from azure.storage.blob import BlobServiceClient

    from tests.support.fake_arm import AZURITE_ACCOUNT, AZURITE_KEY

    value = "az_" + secrets.token_hex(24)
    endpoint = azure_env["GPUCLOUD_AZURE_BLOB_ENDPOINT"]
    svc = BlobServiceClient(endpoint, credential={"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY})
    src, out = svc.get_container_client("gc-az-in"), svc.get_container_client("gc-az-out")
    for c in (src, out):
        if not c.exists():
            c.create_container()
    src.upload_blob("set/a.txt", b"alpha", overwrite=True)
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: azsec\nresources: {cloud: azure, regions: [eastus], gpu: T4:1}\nsecrets: [HF_TOKEN]\n"
        f"inputs: {{data/: az://{AZURITE_ACCOUNT}/gc-az-in/set}}\n"
        f"outputs: {{out/: az://{AZURITE_ACCOUNT}/gc-az-out/r}}\n"
        'run: \'printf %s "$HF_TOKEN" | sha256sum; echo raw=$HF_TOKEN; cat data/a.txt; '
        "mkdir -p out && echo result > out/r.txt'\nmax_duration: 10m\n"
    )
    env = {**azure_env, "HF_TOKEN": value, "AZURE_STORAGE_KEY": AZURITE_KEY}
    proc = cli("run", str(job), "--cloud", "azure", timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert hashlib.sha256(value.encode()).hexdigest() in proc.stdout and "raw=***" in proc.stdout
    assert "alpha" in proc.stdout
    assert out.download_blob("r/r.txt").readall() == b"result\n"
    needle = value.encode()
    for container in svc.list_containers():
        client = svc.get_container_client(container.name)
        for blob in client.list_blobs():
            assert needle not in client.download_blob(blob.name).readall(), f"{container.name}/{blob.name}"
    home = Path(azure_env["GPUCLOUD_HOME"])
    assert [str(p) for p in home.rglob("*") if p.is_file() and needle in p.read_bytes()] == []
    assert value not in proc.stdout + proc.stderr
