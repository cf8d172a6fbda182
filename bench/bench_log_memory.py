"""Memory of the CLI's log copy for a 2 GiB job log (target: under 200 MB).

A FileChannel gets 128 log parts of 16 MiB (the VM's largest part with a log folder), hard links of
one file so the disk holds 16 MiB; a fresh process mirrors them with LogMirror (default 1 GiB cap:
head and tail kept) and prints the copy to /dev/null the way `gpucloud logs` does. Reported: that
process's peak RSS, the time, and the size of the kept copy.

Usage: python bench/bench_log_memory.py [--parts 128]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PART = 16 << 20
CHILD = """
import sys
from pathlib import Path
from gpucloud.channel.run_objects import FileChannel
from gpucloud.run.log import LogMirror
root = Path(sys.argv[1])
mirror = LogMirror(root / "home", "big")
mirror.sync(FileChannel(root / "store"), final=True)
with open("/dev/null", "wb") as out:
    mirror.drain(out.write)
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpucloud-logbench-") as tmp:
        root = Path(tmp)
        logdir = root / "store" / "runs" / "big" / "node-0" / "log"
        logdir.mkdir(parents=True)
        line = b"epoch 0001 step 000123 loss 0.123456 lr 0.000300 some more text to fill\n"
        (logdir / "000000").write_bytes((line * (PART // len(line) + 1))[:PART])
        for i in range(1, args.parts):
            os.link(logdir / "000000", logdir / f"{i:06d}")
        (root / "store" / "runs" / "big" / "node-0" / "status.json").write_text(json.dumps({"log_parts": args.parts}))
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", CHILD, str(root)], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
        wall = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB -> MiB
        kept = (root / "home" / "runs" / "big" / "log.txt").stat().st_size
        print(
            f"log {args.parts * PART / (1 << 30):.2f} GiB in {args.parts} parts: peak RSS {peak:.0f} MiB, "
            f"{wall:.1f} s, kept copy {kept / (1 << 20):.0f} MiB (cap 1 GiB: head + tail)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
