"""Input copy throughput (docs/DATA.md): what a node does for `inputs:` (the agent's parallel curl
copy, gpucloud/vm/agent/data.py, from the grants `data_grants` makes) against the plain baseline
in the same run: boto3's transfer manager (what `aws s3 cp --recursive` uses) for S3, and the
Azure SDK's `download_blob` on a pool of the same width for Blob. Both read the same objects from a
local moto server (its own process) or Azurite (node_modules, as the tests use it).

Prints a Markdown table: median MB/s and files/s per method over --runs, and the load average.

Usage: python bench/bench_data_copy.py [--files 500] [--mb 100] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

WORKERS = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    exe = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen([str(exe), "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("moto_server did not start")


def timed(fn: Callable[[], Any], dest: Path) -> float:
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def gpucloud_copy(spec_text: str, dest: Path) -> Callable[[], Any]:
    from gpucloud.run.data_grants import check
    from gpucloud.spec.load import parse_spec
    from gpucloud.vm.agent.data import fetch_inputs
    from gpucloud.vm.agent.transfer import Transfer

    doc = check(parse_spec(spec_text, "job.yaml")).grants(None, "bench", 0, 1, time.time() + 3600)
    return lambda: fetch_inputs(doc, dest, Transfer(), lambda line: None)


def s3_baseline(s3: Any, bucket: str, keys: list[str], dest: Path) -> Callable[[], Any]:
    from boto3.s3.transfer import TransferConfig
    from s3transfer.manager import TransferManager

    def run() -> None:
        with TransferManager(s3, TransferConfig(max_concurrency=WORKERS)) as tm:
            futures = []
            for key in keys:
                path = dest / "data" / key
                path.parent.mkdir(parents=True, exist_ok=True)
                futures.append(tm.download(bucket, key, str(path)))
            for f in futures:
                f.result()

    return run


def blob_baseline(container: Any, names: list[str], dest: Path) -> Callable[[], Any]:
    def one(name: str) -> None:
        path = dest / "data" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            container.download_blob(name).readinto(fh)

    def run() -> None:
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(one, names))

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=500)
    ap.add_argument("--mb", type=float, default=100.0)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    size = int(args.mb * 1e6 / args.files)
    files = {f"p{i // 100:02d}/f{i:05d}.bin": os.urandom(size) for i in range(args.files)}
    total = size * args.files
    work = Path(tempfile.mkdtemp(prefix="bench-data-"))
    rows: list[tuple[str, str, list[float]]] = []
    moto, endpoint = start_moto()
    try:
        import boto3

        os.environ.update(
            AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
        )  # fmt: skip
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="bench-in")
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(lambda kv: s3.put_object(Bucket="bench-in", Key=kv[0], Body=kv[1]), files.items()))
        spec = "name: b\nresources: {cloud: local}\nrun: x\ninputs: {data/: s3://bench-in/}\n"
        ours, base = [], []
        for _ in range(args.runs):
            ours.append(timed(gpucloud_copy(spec, work / "a"), work / "a"))
            base.append(timed(s3_baseline(s3, "bench-in", list(files), work / "b"), work / "b"))
        rows += [
            ("S3 (moto)", "gpucloud node copy (curl x16)", ours),
            ("S3 (moto)", "boto3 transfer manager x16", base),
        ]
    finally:
        moto.terminate()
    from tests.support.azurite import start_azurite

    azurite = start_azurite(work / "azurite")
    try:
        from azure.storage.blob import BlobServiceClient

        os.environ.update(GPUCLOUD_AZURE_BLOB_ENDPOINT=azurite.blob_endpoint, AZURE_STORAGE_KEY=azurite.account_key)
        svc = BlobServiceClient(
            azurite.blob_endpoint, credential={"account_name": azurite.account_name, "account_key": azurite.account_key}
        )
        container = svc.get_container_client("bench-in")
        container.create_container()
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(lambda kv: container.upload_blob(kv[0], kv[1]), files.items()))
        spec = (
            f"name: b\nresources: {{cloud: local}}\nrun: x\ninputs: {{data/: az://{azurite.account_name}/bench-in/}}\n"
        )
        ours, base = [], []
        for _ in range(args.runs):
            ours.append(timed(gpucloud_copy(spec, work / "a"), work / "a"))
            base.append(timed(blob_baseline(container, list(files), work / "b"), work / "b"))
        rows += [
            ("Blob (Azurite)", "gpucloud node copy (curl x16)", ours),
            ("Blob (Azurite)", "azure SDK download_blob x16", base),
        ]
    finally:
        azurite.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.files} files, {total / 1e6:.0f} MB, median of {args.runs}; load average {os.getloadavg()[0]:.1f}\n")
    print("| store | method | MB/s | files/s | s |")
    print("|---|---|---|---|---|")
    for store, method, times in rows:
        t = statistics.median(times)
        print(f"| {store} | {method} | {total / 1e6 / t:.1f} | {args.files / t:.0f} | {t:.2f} |")


if __name__ == "__main__":
    main()
