"""What every timing bench does the same way, so that its figures hold when someone else reruns them:
compile the package's bytecode first (a first run that writes .pyc files is not a sample), time the
command interleaved with a baseline (`python -c pass`) in the same run, so machine load shows in
both, and print min/median/max, the ratio of medians, the CPU time (user + system, which the load
changes much less than the wall time) and the load average beside the figures.
"""

from __future__ import annotations

import compileall
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASELINE = (sys.executable, "-c", "pass")
# Commands run from an empty folder, so `python -m gpucloud` imports the installed package (a plain
# install from a clean clone, or an editable one), never a source tree that happens to be the cwd.
NEUTRAL_CWD = Path(tempfile.mkdtemp(prefix="gpucloud-bench-cwd-"))


def compile_package() -> None:
    """Write the bytecode of the gpucloud that this Python imports (installed or from this tree)."""
    import gpucloud

    compileall.compile_dir(str(Path(gpucloud.__file__).parent), quiet=1)


def load_text() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} on {os.cpu_count()} CPUs"


@dataclass(frozen=True)
class Paired:
    label: str
    samples: list[float]
    baseline: list[float]
    # CPU seconds (user + system) of each sample and baseline run, children included: on a shared
    # machine the wall time grows with the load, the CPU time much less, so it is printed beside it
    cpu: list[float] = field(default_factory=list)
    cpu_baseline: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def ratio(self) -> float:
        return self.median / statistics.median(self.baseline)

    def line(self, target: float | None = None) -> str:
        s = self.samples
        verdict = "" if target is None else f"  target {target:.2f} s {'ok' if self.median <= target else 'OVER'}"
        return (
            f"{self.label}: min {min(s):.3f} / median {self.median:.3f} / max {max(s):.3f} s; "
            f"python -c pass median {statistics.median(self.baseline):.3f} s; ratio {self.ratio:.1f}x{verdict}"
            + self.cpu_text()
        )

    def cpu_text(self) -> str:
        if not self.cpu or not self.cpu_baseline:
            return ""
        mine, base = statistics.median(self.cpu), statistics.median(self.cpu_baseline)
        return f"; CPU (user+sys) median {mine:.3f} s vs {base:.3f} s, ratio {mine / base:.1f}x"


def run_paired(
    label: str, cmd: Sequence[str], runs: int, env: dict[str, str] | None = None, cwd: Path = NEUTRAL_CWD
) -> Paired:
    """`runs` samples of `cmd` and of the baseline, alternating (A B A B), after one unrecorded
    warm-up of each."""
    full_env = {**os.environ, "CI": "true", **(env or {})}
    samples: list[float] = []
    baseline: list[float] = []
    cpu: list[float] = []
    cpu_baseline: list[float] = []
    for i in range(runs + 1):
        for argv, into, cpu_into in ((cmd, samples, cpu), (BASELINE, baseline, cpu_baseline)):
            used = _children_cpu()
            start = time.perf_counter()
            subprocess.run(
                list(argv), cwd=cwd, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
            )
            if i:
                into.append(time.perf_counter() - start)
                cpu_into.append(_children_cpu() - used)
    return Paired(label, samples, baseline, cpu, cpu_baseline)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def gpucloud_cmd(*args: str) -> list[str]:
    """`python -m gpucloud ...` with this Python (an installed entry point or not: the same code)."""
    return [sys.executable, "-m", "gpucloud", *args]
