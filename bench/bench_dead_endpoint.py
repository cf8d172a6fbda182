"""How long `gpucloud run` takes to give up on a cloud whose endpoint is dead or silent (it must
be under 20 s per cloud, name the endpoint, and exit 78 when no cloud is usable).

Cases (each a real CLI subprocess; no network needed):
- AWS, connection refused: fake keys, AWS_ENDPOINT_URL=http://127.0.0.1:9.
- AWS, silent endpoint: a local TCP server that accepts connections and never answers.
- Azure, connection refused: the ARM endpoint and the managed-identity endpoint at 127.0.0.1:9.
- `gpucloud check` with both clouds dead (concurrent).

Run: python bench/bench_dead_endpoint.py [--runs 3]   (from the repo root)
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEAD = "http://127.0.0.1:9"


def silent_server() -> tuple[str, socket.socket]:
    """Accepts TCP connections and never sends a byte (a wrong host, a hung proxy)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}", sock


def base_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GPUCLOUD_", "IDENTITY_"))}
    env.update(
        {
            "GPUCLOUD_HOME": str(home),
            "CI": "true",
            "PYTHONPATH": str(REPO),
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_SHARED_CREDENTIALS_FILE": str(home / "none"),
            "AWS_CONFIG_FILE": str(home / "none"),
        }
    )
    return env


def timed(args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, int, str]:
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "gpucloud", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    return time.perf_counter() - start, out.returncode, out.stderr + out.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    silent_url, _sock = silent_server()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        home = work / "home"
        home.mkdir()
        for cloud in ("aws", "azure"):
            (work / f"{cloud}.yaml").write_text(
                f"name: dead\nresources: {{gpu: T4:1, cloud: {cloud}}}\nrun: echo\nmax_duration: 10m\n"
            )
        aws = {**base_env(home), "AWS_ACCESS_KEY_ID": "AKIAFAKE", "AWS_SECRET_ACCESS_KEY": "fake"}
        azure = {
            **base_env(home),
            "AZURE_SUBSCRIPTION_ID": "00000000-0000-0000-0000-000000000000",
            "GPUCLOUD_AZURE_ARM_ENDPOINT": DEAD,
            "IDENTITY_ENDPOINT": f"{DEAD}/_identity",
            "IDENTITY_HEADER": "x",
        }
        cases = [
            ("run, AWS endpoint refuses connections", ["run", "aws.yaml", "--yes"], {**aws, "AWS_ENDPOINT_URL": DEAD}),
            (
                "run, AWS endpoint accepts and never answers",
                ["run", "aws.yaml", "--yes"],
                {**aws, "AWS_ENDPOINT_URL": silent_url},
            ),
            ("run, Azure ARM + identity endpoints refuse connections", ["run", "azure.yaml", "--yes"], azure),
            (
                "check, both clouds dead (concurrent)",
                ["check"],
                {**azure, **{k: v for k, v in aws.items() if k.startswith("AWS_")}, "AWS_ENDPOINT_URL": DEAD},
            ),
        ]
        print("| case | median wall | max | exit code | names the endpoint |")
        print("|---|---|---|---|---|")
        for label, args, env in cases:
            times, codes, named = [], set(), True
            for _ in range(runs):
                secs, code, text = timed(args, env, work)
                times.append(secs)
                codes.add(code)
                named = named and "127.0.0.1" in text and "internal error" not in text
            print(
                f"| {label} | {statistics.median(times):.1f} s | {max(times):.1f} s | "
                f"{', '.join(map(str, sorted(codes)))} | {'yes' if named else 'NO'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
