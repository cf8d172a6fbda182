"""The container jobs every provider's container tests run (docs/CONTAINERS.md): the main job (inputs,
env, a secret, a checkpoint, artifacts, its own exit code), the two-node rendezvous and the
busybox counting job, the run's containers as podman lists them; and a container job file for the
planner's tests."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import yaml

from tests.support.containers import podman
from tests.support.local_runs import write_job
from tests.support.spot_job import write_count_job

SECRET = "bx_" + hashlib.sha256(str(os.getpid()).encode()).hexdigest()[:32]


JOB_SH = """\
set -e
cat data/in.txt
test -x /bin/busybox && test ! -d /usr && echo "in-image pwd=$(pwd)"
echo "run=$GPUCLOUD_RUN_ID rank=$GPUCLOUD_NODE_RANK nodes=$GPUCLOUD_NUM_NODES epochs=$EPOCHS path=$PATH"
echo "token=$BOX_TOKEN"
printf %s "$BOX_TOKEN" | sha256sum
test -d "$(dirname "$GPUCLOUD_PREEMPTED_FILE")" && echo notice-dir-mounted
mkdir -p out "$GPUCLOUD_CHECKPOINT_DIR"
echo "result of $GPUCLOUD_RUN_ID" > out/result.txt
echo step-9 > "$GPUCLOUD_CHECKPOINT_DIR/state"
exit "$CODE"
"""


def containers_of(run_id: str) -> list[str]:
    """Every container of the run, running or not (`podman ps -a`)."""
    out = podman("ps", "-a", "--format", "{{.Names}}", "--filter", f"name=gpucloud-{run_id}").stdout.decode()
    return out.split()


def main_job(folder: Path, image: str, code: int, resources: dict | None = None) -> Path:
    """The job of the main test: on the local provider, or on `resources` (an ssh host)."""
    (folder / "in").mkdir(parents=True, exist_ok=True)
    (folder / "in" / "in.txt").write_text("input-line-42\n")
    return write_job(
        folder,
        {
            "name": "boxed",
            "resources": resources or {"cloud": "local"},
            "container": {"image": image, "pull": "always"},  # the tests see it pulled, whatever ran before
            "inputs": {"data": "./in"},
            "secrets": ["BOX_TOKEN"],
            "env": {"EPOCHS": 2, "CODE": code},
            "checkpoint": "ckpt",
            "setup": 'echo "setup-in-image=$(test -d /usr && echo no || echo yes)"',
            "run": JOB_SH,
            "artifacts": ["out/"],
        },
    )


RENDEZVOUS = """\
if [ "$NODE_RANK" = 0 ]; then
  nc -l -p "$MASTER_PORT" -e sh -c 'read line; echo "$line" > got.txt' < /dev/null
  echo "rank0 got: $(cat got.txt)"
else
  i=0
  until echo "hello from rank $NODE_RANK" | nc "$MASTER_ADDR" "$MASTER_PORT"; do
    i=$((i+1)); [ $i -lt 100 ] || exit 9; sleep 0.2
  done
  echo "rank1 sent to $MASTER_ADDR:$MASTER_PORT"
fi
"""


COUNT_SH = """\
f="$GPUCLOUD_CHECKPOINT_DIR/count"
mkdir -p "$GPUCLOUD_CHECKPOINT_DIR"
i=$(cat "$f" 2>/dev/null || echo 0)
starts=$(( $(cat "$f.starts" 2>/dev/null || echo 0) + 1 ))
echo "$starts" > "$f.starts"
step="$STEP_S"
[ "$starts" -lt 3 ] || step=0.005  # the last attempt only has to finish
echo "resuming at $i"
trap 'echo "preempted at $i"; exit 143' TERM
while [ "$i" -lt "$N" ]; do
  if [ -e "$GPUCLOUD_PREEMPTED_FILE" ]; then echo "preempted at $i"; exit 143; fi
  sleep "$step"
  i=$((i + 1))
  echo "$i" > "$f.tmp" && busybox mv "$f.tmp" "$f"
done
printf %s "$i" > result.txt
echo "done $i"
"""


def count_job(folder: Path, image: str, n: int, resources: dict) -> Path:
    """tests/support/spot_job.py's counting job (fast from its third start too), in sh for the busybox
    image."""
    path = write_count_job(folder, n=n, cloud="local", extra={"resources": resources, "container": image})
    (folder / "count.sh").write_text(COUNT_SH)
    doc = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**doc, "run": "sh count.sh"}, sort_keys=False))
    return path


def write_container_job(tmp_path: Path, image: str, gpu: str = "T4:1", cloud: str = "aws", extra: str = "") -> Path:
    """tmp_path/job.yaml: one `gpu` on `cloud` running train.py in `image`, plus `extra` lines."""
    path = tmp_path / "job.yaml"
    path.write_text(
        f"name: c\nresources:\n  gpu: {gpu}\n  cloud: {cloud}\ncontainer: {image}\n{extra}run: python train.py\n"
    )
    return path
