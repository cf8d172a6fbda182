"""`--help` of gpucloud, SkyPilot and dstack, each paired with `python -c pass` in the same run
(bench/paired.py). The peers are installed in throwaway virtual environments; nothing here needs
credentials. The commands, to rerun it:

    python -m venv /tmp/sky && /tmp/sky/bin/pip install skypilot==0.14.1
    python -m venv /tmp/dstack && /tmp/dstack/bin/pip install dstack==0.22.5
    python bench/bench_peers.py --sky /tmp/sky --dstack /tmp/dstack [--runs 7]

The first (unrecorded) run of each command writes its bytecode, so the samples are warm starts.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired import compile_package, gpucloud_cmd, load_text, run_paired  # noqa: E402


def version(cmd: list[str]) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return (out.stdout.strip() or out.stderr.strip()).splitlines()[-1] if (out.stdout or out.stderr) else "?"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sky", type=Path, required=True, help="venv with skypilot installed")
    parser.add_argument("--dstack", type=Path, required=True, help="venv with dstack installed")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    compile_package()
    sky, dstack = str(args.sky / "bin" / "sky"), str(args.dstack / "bin" / "dstack")
    print(f"{version([sky, '--version'])}; dstack {version([dstack, '--version'])}; runs={args.runs}; {load_text()}")
    ours = run_paired("gpucloud --help", gpucloud_cmd("--help"), args.runs)
    print(ours.line() + f"  [{load_text()}]")
    for label, cmd in (("sky --help", [sky, "--help"]), ("dstack --help", [dstack, "--help"])):
        theirs = run_paired(label, cmd, args.runs)
        print(theirs.line() + f"  [{load_text()}]; {theirs.median / ours.median:.1f}x gpucloud's median")


if __name__ == "__main__":
    main()
