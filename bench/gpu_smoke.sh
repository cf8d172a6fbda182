#!/usr/bin/env bash
# GPU smoke check (DESIGN.md section 9), for a machine with a real NVIDIA GPU and gpucloud installed:
# run the bootstrap on the local provider with this host's GPU (stack install skipped: the driver is
# there), strict about the GPU being seen, then a short real PyTorch training job on it.
# Usage: bash bench/gpu_smoke.sh [OUT_DIR]     Exit 0 = GPU detected, verified and used by the job.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp -d)}
mkdir -p "$out"
command -v nvidia-smi >/dev/null || { echo "smoke: no nvidia-smi on this host" >&2; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/nvidia-smi.txt"
count=$(wc -l <"$out/nvidia-smi.txt")
model=$(python3 - "$out/nvidia-smi.txt" <<'PY'
import sys
from gpucloud.catalog import resolve_gpu_name
name = open(sys.argv[1]).readline().split(",")[0]
words = name.replace("NVIDIA", "").replace("Tesla", "").split()
for i in range(len(words)):
    for j in range(len(words), i, -1):
        hit = resolve_gpu_name("-".join(words[i:j]))
        if hit:
            print(hit)
            raise SystemExit
print("")
PY
)
[[ -n $model ]] || { echo "smoke: $(head -1 "$out/nvidia-smi.txt") is not in the catalog" >&2; exit 1; }
job="$PWD/examples/gpu-smoke.local.yaml"
trap 'rm -f "$job"' EXIT
cat >"$job" <<YAML
name: gpu-smoke
resources: {cloud: local, gpu: "$model:$count"}
workdir: torch-train
env: {EPOCHS: "3"}
run: python3 -c 'import torch; assert torch.cuda.is_available(), "PyTorch sees no GPU"; print("cuda devices", torch.cuda.device_count())' && python3 train.py --epochs "\$EPOCHS"
artifacts: [outputs/, metrics.json]
max_duration: 10m
YAML
export GPUCLOUD_HOME="$out/home"
(cd "$out" && gpucloud run "$job" --cloud local --json >"$out/run.json" 2>"$out/run.log") || { tail -40 "$out/run.log"; exit 1; }
cat "$out/run.json"
if grep -q "\[gpucloud\] WARNING" "$out/run.log"; then
  echo "smoke: the bootstrap's GPU check did not see the expected $count x $model" >&2; exit 1
fi
metrics=$(find "$out/gpucloud-runs" -name metrics.json | head -1)
grep -q '"device": "CPU"' "$metrics" && { echo "smoke: the job trained on the CPU" >&2; exit 1; }
echo "smoke: ok: $count x $model verified, job trained on $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["device"])' "$metrics")"
