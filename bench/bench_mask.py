"""How fast does the node's log masker (gpucloud/vm/agent/mask.py) pass a job's output with a long
secret? Every step of a job with secrets runs through it, so its throughput bounds the job's log.
Two ways: `Masker.feed` in this process (64 KiB reads, as the filter reads), and the filter itself
(`python -m gpucloud.vm.agent.mask`) as a pipe. The stream is random bytes with the secret in it a
few times, some of them split across reads.

Usage: python bench/bench_mask.py [--secret-kb 100] [--mb 32] [--runs 3] [--impl PATH]. `--impl`
loads another mask.py (e.g. `git show 4f9cf6c:gpucloud/vm/agent/mask.py > /tmp/old_mask.py`) for
the before figure; the pipe is then not measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
READ = 65536


def load(impl: str | None) -> ModuleType:
    if not impl:
        from gpucloud.vm.agent import mask

        return mask
    spec = importlib.util.spec_from_file_location("mask_under_test", impl)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stream(secret: bytes, mb: int) -> bytes:
    body = bytearray(os.urandom(mb * 1024 * 1024))
    for i in range(1, 8):  # the secret a few times, at places that straddle reads
        at = i * len(body) // 8 - len(secret) // 2
        body[at : at + len(secret)] = secret
    return bytes(body)


def in_process(mask: ModuleType, secret: bytes, data: bytes) -> float:
    m = mask.Masker([secret])
    t0 = time.perf_counter()
    out = [m.feed(data[i : i + READ]) for i in range(0, len(data), READ)]
    out.append(m.flush())
    took = time.perf_counter() - t0
    assert secret not in b"".join(out)
    return len(data) / 1e6 / took


def through_pipe(secret: bytes, data: bytes) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUCLOUD_MASKED_NAMES": "S", "S": secret.decode()}
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "gpucloud.vm.agent.mask"], input=data, capture_output=True, env=env, check=True
    ).stdout
    took = time.perf_counter() - t0
    assert secret not in out
    return len(data) / 1e6 / took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--secret-kb", type=int, default=100)
    ap.add_argument("--mb", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--impl", default=None)
    args = ap.parse_args()
    secret = os.urandom(args.secret_kb * 1024).hex()[: args.secret_kb * 1000].encode()  # text, as env values are
    data = stream(secret, args.mb)
    mask = load(args.impl)
    feeds = [in_process(mask, secret, data) for _ in range(args.runs)]
    print(f"| secret | stream | way | MB/s (median of {args.runs}) |")
    print("|---|---|---|---|")
    print(f"| {args.secret_kb} KB | {args.mb} MiB | Masker.feed, 64 KiB reads | {statistics.median(feeds):.1f} |")
    if not args.impl:
        pipes = [through_pipe(secret, data) for _ in range(args.runs)]
        print(f"| {args.secret_kb} KB | {args.mb} MiB | the filter as a pipe | {statistics.median(pipes):.1f} |")


if __name__ == "__main__":
    main()
