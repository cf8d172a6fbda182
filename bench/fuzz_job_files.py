"""The job-file fuzzer at full size (tests/support/job_fuzzer.py; the test runs 300 with small bombs):
--count generated job files (full-size alias bombs, nesting and long lines) through `validate`,
`plan --json` and `render` in one process, offline. Prints the count per command and exit code, the
seconds, and every exit 70 / undocumented exit / traceback with its file (kept under --keep).

Usage: python bench/fuzz_job_files.py [--count 3000] [--seed 0] [--keep DIR]
Exit status: 0 when no file crashed the CLI, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import job_fuzzer  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=Path("fuzz-failures"), help="where failing files are copied")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpucloud-fuzz-") as tmp:
        os.environ["GPUCLOUD_HOME"] = str(Path(tmp) / "home")  # no run is recorded in the caller's own
        os.environ["CI"] = "true"
        outcome = job_fuzzer.fuzz(args.count, Path(tmp), seed=args.seed)
        failed = sorted({line.split()[0] for line in outcome.failures})
        if failed:
            args.keep.mkdir(parents=True, exist_ok=True)
            for path in Path(tmp, "repo").rglob("fuzz-*.yaml"):
                if path.stem.removeprefix("fuzz-") in failed:
                    shutil.copy(path, args.keep / path.name)
    print(f"{outcome.files} job files, seed {args.seed}, {outcome.seconds:.1f} s")
    print("| command | exit code | count |")
    print("|---|---|---|")
    for (command, code), n in sorted(outcome.codes.items()):
        print(f"| {command} | {code} | {n} |")
    exit70 = sum(n for (_, code), n in outcome.codes.items() if code == 70)
    print(f"exit 70: {exit70}; failures: {len(outcome.failures)}")
    for failure in outcome.failures:
        print("----")
        print(failure)
    return 1 if outcome.failures else 0


if __name__ == "__main__":
    sys.exit(main())
