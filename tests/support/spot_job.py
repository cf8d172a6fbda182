"""The job of the spot-recovery tests (docs/SPOT.md): counts to N, one step per STEP_S, keeping the
count in its checkpoint folder; on SIGTERM (or the preempted file) it stops where it is. Each
attempt prints `resuming at K`, so a test sees that it resumed from the checkpoint, and the last
writes `result.txt` with the count."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

COUNT_PY = """\
import os, pathlib, signal, sys, time

N = int(os.environ["N"])
STEP = float(os.environ.get("STEP_S", "0.1"))
d = pathlib.Path(os.environ["GPUCLOUD_CHECKPOINT_DIR"])
f = d / "count"
i = int(f.read_text()) if f.exists() else 0
print(f"resuming at {i}", flush=True)
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
while i < N:
    if stop or os.path.exists(os.environ["GPUCLOUD_PREEMPTED_FILE"]):
        print(f"preempted at {i}", flush=True)
        sys.exit(143)
    time.sleep(STEP)
    i += 1
    tmp = d / "count.tmp"
    tmp.write_text(str(i))
    os.replace(tmp, f)
pathlib.Path("result.txt").write_text(str(i))
print(f"done {i}", flush=True)
"""


def write_count_job(folder: Path, *, n: int, cloud: str, step_s: float = 0.1, extra: dict | None = None) -> Path:
    """job.yaml + count.py in `folder`; `extra` adds or overrides job fields (recovery, resources ...)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "count.py").write_text(COUNT_PY)
    doc = {
        "name": "count",
        "resources": {"cloud": cloud},
        "max_duration": "10m",
        "checkpoint": "ckpt",
        "checkpoint_interval": "1s",
        "recovery": {"on": ["preemption"], "max_restarts": 2},
        "env": {"N": n, "STEP_S": step_s},
        "run": "python3 count.py",
        "artifacts": ["result.txt"],
        **(extra or {}),
    }
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def resumed_at(log: str) -> list[int]:
    """The `resuming at K` values, attempt by attempt."""
    return [int(m) for m in re.findall(r"resuming at (\d+)", log)]
