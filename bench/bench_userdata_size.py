"""Rendered user-data size for every example on AWS and Azure: raw bytes, gzip'd bytes, and what the
cloud counts against its limit (AWS 16,384 B after gzip when needed; Azure 64 KiB of base64).

    python bench/bench_userdata_size.py

Runs the real CLI (`gpucloud render`), so it measures what a user would send.
"""

from __future__ import annotations

import base64
import gzip
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = ["quickstart.yaml", "t4-any-cloud.yaml", "a100-azure.yaml", "ddp-2-nodes.yaml"]


def render(example: str, cloud: str) -> bytes | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "gpucloud", "render", str(REPO / "examples" / example), "--cloud", cloud],
        capture_output=True,
        env={**env, "CI": "true"},
        check=False,
    )
    return proc.stdout if proc.returncode == 0 else None


def main() -> None:
    print(f"{'example':<20} {'cloud':<6} {'raw B':>8} {'gzip B':>8} {'base64 B':>9}")
    for example in EXAMPLES:
        for cloud in ("aws", "azure"):
            text = render(example, cloud)
            if text is None:
                print(f"{example:<20} {cloud:<6} {'(not for this cloud)':>27}")
                continue
            packed = gzip.compress(text, compresslevel=9, mtime=0)
            print(f"{example:<20} {cloud:<6} {len(text):>8,} {len(packed):>8,} {len(base64.b64encode(text)):>9,}")


if __name__ == "__main__":
    main()
