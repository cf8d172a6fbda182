"""A kept machine's second job against a cold run, on the same machine: seconds from starting the
command to the first line of the job's own output on its stdout, for `gpucloud run` (cold: provision,
boot, stack, code) and `gpucloud run --on RUN` (kept: a signed request in the channel, the changed
files, the job). Providers: the local provider, the AWS simulator (moto + the VM simulator) and the
Azure simulator (fake ARM + Azurite + the VM simulator), through the kept-machine tests, which
append what they measured here. The 5 s budget (tests/support/keep_timing.FIRST_LINE_BUDGET_S) is
held here, on the median, not by the simulator tests: they run beside the whole suite on CI, where a
loaded 2-core machine measured 4.4-4.8 s, and assert only that the kept machine beats the cold run.
Exits 1 when a provider's median kept time is over the budget.

Run: python bench/bench_keep.py [--repeat 3] [--providers local aws azure]   (from the repo root)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.keep_timing import FIRST_LINE_BUDGET_S  # noqa: E402

TESTS = {
    "local": "tests/run/test_keep.py::test_the_next_job_shows_its_first_line_within_5s",
    "aws": "tests/providers/aws/test_aws_keep.py",
    "azure": "tests/providers/azure/test_azure_keep.py",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--providers", nargs="+", default=list(TESTS))
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="gpucloud-bench-keep-")) / "keep.jsonl"
    env = {**os.environ, "GPUCLOUD_BENCH_KEEP": str(out), "PYTHONPATH": str(REPO)}
    for _ in range(args.repeat):
        for name in args.providers:
            cmd = [sys.executable, "-m", "pytest", "-q", "-n0", "-p", "no:cacheprovider", TESTS[name]]
            done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
            if done.returncode:
                print(f"{name}: the test failed (its figures, if any, are still below)\n{done.stdout[-1500:]}")
    rows: dict[str, list[dict]] = {}
    for line in out.read_text().splitlines() if out.exists() else []:
        doc = json.loads(line)
        rows.setdefault(doc["provider"], []).append(doc)
    print(f"{'provider':<16} {'n':>2} {'cold run (s)':>13} {'run --on (s)':>13}")
    over = []
    for name, docs in rows.items():
        cold = statistics.median(d["cold_s"] for d in docs)
        kept = statistics.median(d["kept_s"] for d in docs)
        print(f"{name:<16} {len(docs):>2} {cold:>13.1f} {kept:>13.1f}")
        if kept > FIRST_LINE_BUDGET_S:
            over.append(f"{name} {kept:.1f} s")
    if over:
        print(f"over the {FIRST_LINE_BUDGET_S:.0f} s budget: {', '.join(over)} (load average {os.getloadavg()[0]:.1f})")
        sys.exit(1)


if __name__ == "__main__":
    main()
