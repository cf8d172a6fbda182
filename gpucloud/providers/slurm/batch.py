"""The Slurm side of a run: the sbatch options gpucloud derives from the job, the batch script,
and the node wrapper each task runs before the usual VM shim (docs/INTERNALS.md, "VM agent").

Why a wrapper: the shim and its agent (the same ones every provider sends) run one node; under
Slurm one job runs all of them. The wrapper, started once per node (`srun --ntasks-per-node=1` for
several nodes), takes the node's rank from `SLURM_NODEID`, its address from the controller
(`scontrol show node <name>`'s NodeAddr, the address Slurm itself uses; rank 0 is the first of
`scontrol show hostnames $SLURM_JOB_NODELIST`, so the MASTER_ADDR the nodes agree on at the
barrier is that node's), gives the shim its folder and rank (`GPUCLOUD_VM_DIR`,
`GPUCLOUD_NODE_RANK`), and leaves GPU placement to Slurm: `CUDA_VISIBLE_DEVICES` is what Slurm set
for the job's GRES, and no lock of gpucloud's is taken. The shim then fetches the agent archive
from the run's channel on the shared filesystem (file:// URLs, as on an ssh host) and runs it.
The driver is the site's: the wrapper checks the node's against the stack's branch (older, or
newer than R470 for Kepler, is a warning at the top of the node's log) and installs nothing; the
GPU count and branch are the agent's own job config (`stack.gpu_count`, `stack.driver` of the
job.json in the run's agent archive, read with python3, which the agent needs anyway).
A requeued job (preemption with `--requeue`) runs the wrapper again: that start begins afresh,
with the checkpoint the earlier start uploaded (docs/SPOT.md), after the earlier start's status,
barrier address, node-key claims and sealed secrets are cleared (a second key would otherwise make
the run's results untrusted; the CLI seals the secrets again to the new start's key) and its log
parts are moved aside, so the CLI reads one log across starts.
"""

from __future__ import annotations

import shlex

from gpucloud.contract.provider import LaunchRequest
from gpucloud.providers.slurm.sizing import Size

BATCH_SCRIPT = """#!/bin/bash
# gpucloud run {run_id}: one task per node, each the node wrapper (docs/SLURM.md)
umask 077
{export}if [ "${{SLURM_NNODES:-1}}" -gt 1 ]; then
  exec srun --ntasks-per-node=1{step} --kill-on-bad-exit=0 bash {dir}/node.sh
fi
exec bash {dir}/node.sh
"""

NODE_WRAPPER = r"""#!/bin/bash
# gpucloud run __RUN__: one node of the job under Slurm (docs/SLURM.md)
umask 077  # the node's files are the user's alone on a shared filesystem
D=__DIR__ C=__CHANNEL__
RANK=${SLURM_NODEID:-0}
W=$D/node-$RANK
N=$C/node-$RANK
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && [ -d "$N" ]; then
  # The earlier start's confirmed log parts move to log-archive/, numbered after the ones already
  # there; log-base says how many precede this start's parts (the CLI reads one log across starts).
  base=$(head -c 20 "$N/log-base" 2>/dev/null | tr -cd '0-9'); base=${base:-0}
  n=$(grep -o '"log_parts": *[0-9]*' "$N/status.json" 2>/dev/null | grep -o '[0-9]*$'); n=${n:-0}
  mkdir -p "$N/log-archive"
  for ((i = 0; i < n; i++)); do
    f=$(printf %06d "$i"); [ -f "$N/log/$f" ] && mv -f "$N/log/$f" "$N/log-archive/$(printf %06d $((base + i)))"
  done
  rm -f "$N/log/"[0-9]* "$N/status.json" "$N/ready" "$N/done" "$N/log/claim-"* "$N/secrets.sealed"
  echo $((base + n)) >"$N/log-base.tmp" && mv -f "$N/log-base.tmp" "$N/log-base"
fi
rm -rf "$W" && mkdir -p "$W" || exit 1
addr() { scontrol show node -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n 's/^NodeAddr=//p' | head -n 1; }
ip=$(addr "${SLURMD_NODENAME:-$(hostname -s)}")
case $ip in *[!0-9.]* | "") ;; *) export GPUCLOUD_NODE_IP=$ip ;; esac
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null | head -n 1)
echo "start ${SLURM_RESTART_COUNT:-0}, rank $RANK; rank 0: $first at $(addr "$first")" >"$W/slurm-start"
node=${SLURMD_NODENAME:-$(hostname -s)}
# The GPU count and driver branch the job's stack needs: the agent's job config (job.json in the
# run's agent archive; the shim checks the archive's hash before the agent runs).
set -- $(tar -xzOf "$C/agent.tar.gz" job.json 2>/dev/null | timeout -k 2 20 python3 -c '
import json, sys
s = json.load(sys.stdin).get("stack") or {}
print(int(s.get("gpu_count") or 0), str(s.get("driver") or "").split(".")[0])' 2>/dev/null)
ngpu=${1:-0} want=${2:-}
case $want in *[!0-9]*) want= ;; esac
if [ "$ngpu" -gt 0 ] 2>/dev/null && [ -n "$want" ]; then
  drv=$(timeout -k 2 20 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null |
    head -n 1 | tr -cd '0-9.')
  if [ -z "$drv" ]; then
    note="WARNING: node $node: nvidia-smi shows no driver; the stack needs R$want (the site's to install)"
  elif [ "${drv%%.*}" -lt "$want" ]; then
    note="WARNING: node $node: the site's driver $drv is older than R$want, the branch the stack needs"
  elif [ "$want" = 470 ] && [ "${drv%%.*}" -gt 470 ]; then
    note="WARNING: node $node: the site's driver $drv no longer supports Kepler GPUs (R470 is the last)"
  else
    note="node $node: the site's driver $drv (the stack needs R$want; gpucloud installs none on a cluster)"
  fi
  echo "[gpucloud] $note" >>"$W/job.log"
fi
export GPUCLOUD_VM_DIR=$W GPUCLOUD_NODE_RANK=$RANK
cd "$W" && exec sh "$D/shim-$RANK.sh" </dev/null >"$W/console.log" 2>&1
"""


def time_limit(max_duration_s: int) -> str:
    """`--time` in whole minutes (Slurm's unit), rounded down so that Slurm's limit comes first and
    the node's own deadline (the shim's backstop, the agent's watchdog) stays the second layer; at
    least one minute."""
    return str(max(1, max_duration_s // 60))


def gres(gres_type: str, count: int) -> str:
    return f"gpu:{gres_type}:{count}" if gres_type else f"gpu:{count}"


def sbatch_options(req: LaunchRequest, partition: str, gres_type: str, comment: str) -> list[str]:
    """The sbatch command line (options only) for one attempt."""
    opts = [
        "--parsable",
        f"--job-name=gpucloud-{req.run_id}",
        f"--comment={comment}",
        f"--nodes={req.num_nodes}",
        "--ntasks-per-node=1",
        f"--time={time_limit(req.max_duration_s)}",
        "--requeue",
        "--open-mode=append",
    ]
    if partition:
        opts.append(f"--partition={partition}")
    if req.gpu_count:
        opts.append(f"--gres={gres(gres_type, req.gpu_count)}")
    opts += resources(Size.of(req.vcpus, req.memory_gib))
    for key in ("account", "qos", "constraint"):
        if req.scheduler.get(key):
            opts.append(f"--{key}={req.scheduler[key]}")
    return opts


def resources(size: Size) -> list[str]:
    """The CPUs and memory of one node (one task per node), as sbatch and srun options."""
    opts = [f"--cpus-per-task={size.cpus}"] if size.cpus else []
    return opts + ([f"--mem={size.memory_mb}M"] if size.memory_mb else [])


def batch_script(run_id: str, run_dir: str, size: Size | None = None) -> str:
    """Since Slurm 22.05 an srun inside the job inherits no --cpus-per-task: gpucloud's own srun
    (several nodes) is given the node's CPUs and memory, and SRUN_CPUS_PER_TASK carries the CPUs to
    any srun of the job's own."""
    size = size or Size()
    export = f"export SRUN_CPUS_PER_TASK={size.cpus}\n" if size.cpus else ""
    step = "".join(f" {opt}" for opt in resources(size))
    return BATCH_SCRIPT.format(run_id=run_id, dir=shlex.quote(run_dir), export=export, step=step)


def node_wrapper(run_id: str, run_dir: str, channel_dir: str) -> str:
    return (
        NODE_WRAPPER.replace("__RUN__", run_id)
        .replace("__DIR__", shlex.quote(run_dir))
        .replace("__CHANNEL__", shlex.quote(channel_dir))
    )
