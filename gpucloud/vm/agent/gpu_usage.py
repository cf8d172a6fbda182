"""GPU sampling on the node: `nvidia-smi --query-gpu=...` every few seconds, folded into a summary
small enough to ride on every status.json (right-sizing: peak memory, mean and p95 utilisation,
GPU-idle time; and the idle timeout that ends a hung job).

Bounded and cheap: one nvidia-smi call per interval (killed after 10 s), a 101-bucket utilisation
histogram (p95 to 1 %), running sums, and a series for plots of at most MAX_POINTS points (when
full, neighbours are merged and the step doubles). The summary is written atomically to `--out`;
when every GPU has been idle (< IDLE_PCT) for `--idle-timeout` seconds, `--out`.idle gets the
message and the sampler ends: the bootstrap's watchdog ends the run with it.

Run as `python3 gpu_usage.py --out FILE [--interval S] [--idle-timeout S] [--stop FILE] [--until EPOCH]
[--parent PID]`: it ends when the stop file appears, past `--until`, or when `--parent` is gone (a
killed bootstrap must not leave a sampler polling a host for ever). Stdlib only, Python >= 3.8
syntax (the agent's rule).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from typing import Any, Dict, List, Optional, Sequence

QUERY = "utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu"
IDLE_PCT = 5.0  # a GPU below this utilisation is idle
MAX_POINTS = 120
Gpu = List[Optional[float]]  # utilisation %, memory used MiB, memory total MiB, power W, temperature C


def parse(text: str) -> List[Gpu]:
    """nvidia-smi's `--format=csv,noheader,nounits` lines; "[N/A]" (power on some boards) -> None."""
    out: List[Gpu] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 5:
            continue
        row: Gpu = []
        for cell in cells:
            try:
                row.append(float(cell))
            except ValueError:
                row.append(None)
        out.append(row)
    return out


class Usage:
    """The running summary of one node's GPUs."""

    def __init__(self, interval: float, idle_timeout: float = 0.0) -> None:
        self.interval = interval
        self.idle_timeout = idle_timeout
        self.samples = 0
        self.t0 = 0.0
        self.last = 0.0
        self.hist = [0] * 101
        self.util_sum = 0.0
        self.util_n = 0
        self.idle_s = 0.0
        self.streak_s = 0.0
        self.mem_peak = 0.0
        self.mem_total = 0.0
        self.power_sum = 0.0
        self.power_n = 0
        self.power_peak = 0.0
        self.temp_peak = 0.0
        self.now: List[Gpu] = []
        self.step = interval
        self.points: List[List[float]] = []  # [seconds since t0, mean utilisation, memory used MiB (max GPU)]
        self._bucket: List[List[float]] = []

    def add(self, gpus: Sequence[Gpu], when: float) -> None:
        """Fold one sample (every GPU of the node at `when`)."""
        if not gpus:
            return
        dt = min(when - self.last, 3 * self.interval) if self.samples else 0.0
        if not self.samples:
            self.t0 = when
        self.samples += 1
        self.last = when
        self.now = [list(g) for g in gpus]
        utils = [g[0] for g in gpus if g[0] is not None]
        mems = [g[1] for g in gpus if g[1] is not None]
        for u in utils:
            self.hist[int(max(0.0, min(100.0, u)))] += 1
            self.util_sum += u
            self.util_n += 1
        for g in gpus:
            if g[2] is not None:
                self.mem_total = max(self.mem_total, g[2])
            if g[3] is not None:
                self.power_sum += g[3]
                self.power_n += 1
                self.power_peak = max(self.power_peak, g[3])
            if g[4] is not None:
                self.temp_peak = max(self.temp_peak, g[4])
        mem = max(mems) if mems else 0.0
        self.mem_peak = max(self.mem_peak, mem)
        idle = bool(utils) and max(utils) < IDLE_PCT
        if idle:
            self.idle_s += dt
            self.streak_s += dt
        else:
            self.streak_s = 0.0
        self._point(when - self.t0, sum(utils) / len(utils) if utils else 0.0, mem)

    def _point(self, t: float, util: float, mem: float) -> None:
        """One series point per `step` seconds (a bucket's mean utilisation and peak memory)."""
        self._bucket.append([t, util, mem])
        if len(self._bucket) * self.interval < self.step and t > 0:
            return
        first = self._bucket[0][0]
        self.points.append(
            [
                round(first, 1),
                round(sum(b[1] for b in self._bucket) / len(self._bucket), 1),
                max(b[2] for b in self._bucket),
            ]
        )
        self._bucket = []
        if len(self.points) > MAX_POINTS:
            merged = []
            for i in range(0, len(self.points), 2):
                pair = self.points[i : i + 2]
                merged.append([pair[0][0], round(sum(p[1] for p in pair) / len(pair), 1), max(p[2] for p in pair)])
            self.points = merged
            self.step *= 2

    def percentile(self, pct: float) -> float:
        total = sum(self.hist)
        if not total:
            return 0.0
        rank = pct / 100.0 * total
        seen = 0
        for value, count in enumerate(self.hist):
            seen += count
            if seen >= rank:
                return float(value)
        return 100.0

    @property
    def idle_expired(self) -> bool:
        return self.idle_timeout > 0 and self.streak_s >= self.idle_timeout

    def as_json(self) -> Dict[str, Any]:
        """The compact summary (a few hundred bytes plus the series)."""
        return {
            "gpus": len(self.now),
            "samples": self.samples,
            "interval_s": self.interval,
            "t0": round(self.t0, 1),
            "t": round(self.last, 1),
            "util_mean": round(self.util_sum / self.util_n, 1) if self.util_n else 0.0,
            "util_p95": self.percentile(95),
            "idle_s": round(self.idle_s, 1),
            "idle_streak_s": round(self.streak_s, 1),
            "mem_peak_mib": self.mem_peak,
            "mem_total_mib": self.mem_total,
            "power_mean_w": round(self.power_sum / self.power_n, 1) if self.power_n else None,
            "power_peak_w": self.power_peak if self.power_n else None,
            "temp_peak_c": self.temp_peak or None,
            "now": self.now,
            "series": {"step_s": self.step, "points": self.points},
        }


def sample(timeout: float = 10.0) -> List[Gpu]:
    """One nvidia-smi call; [] when it fails (no driver yet, a hung driver killed after `timeout`)."""
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return parse(done.stdout.decode("utf-8", "replace")) if done.returncode == 0 else []


def alive(pid: int) -> bool:
    """Whether process `pid` still exists (0: not watched)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write(path: str, doc: Dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    os.replace(tmp, path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--idle-timeout", type=float, default=0.0)
    parser.add_argument("--stop", default="")
    parser.add_argument("--max-samples", type=int, default=0)  # 0: until --stop appears
    parser.add_argument("--until", type=float, default=0.0)  # epoch: never outlive the run's deadline
    parser.add_argument("--parent", type=int, default=0)  # the bootstrap: gone (killed) -> stop too
    args = parser.parse_args(argv)
    usage = Usage(max(args.interval, 0.2), args.idle_timeout)
    taken = 0
    while (
        not (args.stop and os.path.exists(args.stop))
        and alive(args.parent)
        and not (args.until and time.time() > args.until)
    ):
        usage.add(sample(), time.time())
        taken += 1
        if usage.samples:
            write(args.out, usage.as_json())
        if usage.idle_expired:
            with open(args.out + ".idle", "w") as fh:
                fh.write(
                    f"every GPU was idle (under {IDLE_PCT:g} % utilisation) for {usage.streak_s:.0f} s, "
                    f"past resources.idle_timeout {args.idle_timeout:g} s: the job was stopped so that it "
                    "stops billing"
                )
            return 0
        if args.max_samples and taken >= args.max_samples:
            return 0
        time.sleep(usage.interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
