#!/bin/bash
# How often a rank of the DDP example fails after training: two torchrun "nodes" on loopback run
# examples/ddp/train_ddp.py N times, with one busy loop per core beside them (the load of a full
# test run on a small machine). Prints each failed run's folder (its logs, and a core dump where the
# kernel writes one into the working folder) and the count.
#   bash bench/ddp_exit.sh [N]      # N runs, 60 by default; PYTHON picks the interpreter (torch needed)
set -u
runs=${1:-60}
py=$(command -v "${PYTHON:-python3}") || { echo "no interpreter ${PYTHON:-python3}" >&2; exit 2; }
case $py in /*) ;; *) py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")" ;; esac  # the runs cd elsewhere
script="$(cd "$(dirname "$0")/.." && pwd)/examples/ddp/train_ddp.py"
"$py" -c "import torch" 2>/dev/null || { echo "$py cannot import torch: set PYTHON to one that can" >&2; exit 2; }
work=$(mktemp -d /tmp/ddp-exit-XXXXXX)
ulimit -c unlimited 2>/dev/null || true
for _ in $(seq "$(nproc)"); do (while :; do :; done) & done
trap 'kill $(jobs -p) 2>/dev/null' EXIT
failed=0
for i in $(seq "$runs"); do
  port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  for rank in 0 1; do
    mkdir -p "$work/run-$i/node-$rank"
    (cd "$work/run-$i/node-$rank" && GPUCLOUD_NODE_RANK=$rank "$py" -m torch.distributed.run --nnodes 2 \
      --node_rank "$rank" --nproc_per_node 1 --master_addr 127.0.0.1 --master_port "$port" \
      "$script" --epochs 3 > log.txt 2>&1; echo $? > rc) &
  done
  until [ -f "$work/run-$i/node-0/rc" ] && [ -f "$work/run-$i/node-1/rc" ]; do sleep 0.5; done
  if [ "$(cat "$work/run-$i/node-0/rc")$(cat "$work/run-$i/node-1/rc")" = "00" ]; then
    rm -rf "${work:?}/run-$i"
  else
    failed=$((failed + 1))
    echo "run $i failed: $work/run-$i"
  fi
done
echo "$failed of $runs runs failed"
