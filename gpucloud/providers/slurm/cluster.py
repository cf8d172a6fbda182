"""What gpucloud reads from Slurm: partitions with their GPU GRES, free GPUs and time limits (for
`plan`), and a job's state (for status, node states and the outcome). Parsing only; the commands
run through login.Login. Output formats are Slurm 22.05's (`scontrol show ... -o`: one
`Key=Value` record per line; `sinfo -O` with a `|` after every field)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpucloud.catalog import load_catalog, resolve_gpu_name
from gpucloud.ui.untrusted import shown
from gpucloud.vm.agent.gpu_check import gpu_tokens, matches_model

# One ssh call reads everything `plan` needs.
PLAN_SCRIPT = r"""
command -v sbatch >/dev/null || { echo "@missing sbatch"; exit 0; }
scontrol show partition -o 2>&1 | head -c 1000000
echo "@nodes"
sinfo -h -N -O "NodeList:|,Partition:|,Gres:|,GresUsed:|,StateLong:|,CPUs:|,Memory:|" 2>&1 | head -c 4000000
"""

_COUNT = re.compile(r"[0-9]{1,9}")
_TIME = re.compile(r"(?:[0-9]{1,5}-)?[0-9]{1,9}(?::[0-9]{1,2}){0,2}")
SHOWN_MAX = 200  # characters of a record that a note about it quotes

# Slurm job states (squeue(1), "JOB STATE CODES") and what they mean for a gpucloud node.
WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED", "RESIZING"}
ACTIVE = {"RUNNING", "CONFIGURING", "COMPLETING", "SIGNALING", "STAGE_OUT", "STOPPED"}
# Final states and (gpucloud state, exit code when the node wrote nothing, message).
FINAL: dict[str, tuple[str, int | None, str]] = {
    "COMPLETED": ("succeeded", 0, "Slurm: the job completed"),
    "FAILED": ("failed", 1, "Slurm: the job failed"),
    "CANCELLED": ("failed", 143, "Slurm: the job was cancelled (scancel)"),
    "TIMEOUT": ("deadline", None, "Slurm ended the job at its time limit (TIMEOUT): max_duration passed"),
    "PREEMPTED": ("preempted", None, "Slurm preempted the job and did not requeue it"),
    "NODE_FAIL": ("error", 70, "Slurm: a node of the job failed (NODE_FAIL)"),
    "BOOT_FAIL": ("error", 70, "Slurm: a node of the job failed to boot (BOOT_FAIL)"),
    "OUT_OF_MEMORY": ("failed", 137, "Slurm: the job ran out of memory (OUT_OF_MEMORY)"),
    "DEADLINE": ("deadline", None, "Slurm: the job reached its --deadline (DEADLINE)"),
    "SPECIAL_EXIT": ("failed", 1, "Slurm: the job was held after a special exit (SPECIAL_EXIT)"),
    "REVOKED": ("error", 70, "Slurm: the job was revoked (REVOKED)"),
}


def records(text: str) -> list[dict[str, str]]:
    """`scontrol show X -o` lines -> one dict per record (values never contain spaces there,
    except a few free-text ones gpucloud does not read)."""
    out = []
    for line in text.splitlines():
        if "=" not in line:
            continue
        rec: dict[str, str] = {}
        for word in line.split():
            key, eq, value = word.partition("=")
            if eq and key not in rec:
                rec[key] = value
        out.append(rec)
    return out


def number(text: str) -> int | None:
    """A plain count as Slurm prints it (ASCII digits, at most 9), else None: a field that is cut
    short, garbled or not a number is never turned into a traceback."""
    return int(text) if _COUNT.fullmatch(text) else None


def gres_gpus(text: str) -> dict[str, int]:
    """`gpu:k80:2(S:0-1),gpu:a100:4` -> {"k80": 2, "a100": 4}; an untyped `gpu:2` -> {"": 2}."""
    found: dict[str, int] = {}
    for item in re.sub(r"\([^)]*\)", "", text).split(","):
        parts = item.strip().split(":")
        count = number(parts[-1])
        if parts[0] != "gpu" or len(parts) < 2 or count is None:
            continue
        kind = parts[1] if len(parts) >= 3 else ""
        found[kind] = found.get(kind, 0) + count
    return found


def gpu_model(gres_type: str) -> str | None:
    """A cluster's GRES type as gpucloud's canonical model: a name or alias (`k80`, `tesla_k80`,
    `a100_80gb`), or the device name `AutoDetect=nvml` types GPUs with (NVML's name, nvidia-smi's,
    lower-cased with underscores for spaces: `nvidia_h100_80gb_hbm3`, `nvidia_a100_80gb_pcie`).
    Those are read by the rule the node's GPU check reads nvidia-smi's names with (every token of
    the model a whole word of the name), the most specific model winning (`tesla_v100-pcie-32gb`
    is a V100-32GB, not a V100); None when no model, or two equally, match."""
    text = gres_type.strip()
    for cand in (text, text.replace("_", "-"), re.sub(r"^(tesla|nvidia)[-_]", "", text, flags=re.I).replace("_", "-")):
        name = resolve_gpu_name(cand)
        if name:
            return name
    device = text.replace("_", " ")
    hits = {
        m: len(gpu_tokens(m)) for m in load_catalog().gpus if gpu_tokens(m) and matches_model(device, gpu_tokens(m))
    }
    best = [m for m, n in hits.items() if n == max(hits.values())]
    return best[0] if len(best) == 1 else None


def gpu_matches(gres_type: str, wanted: str) -> bool:
    """The GRES type is the job's GPU, or one of the models a family name stands for (`A100`)."""
    model = gpu_model(gres_type)
    return model is not None and (model == wanted or model in load_catalog().members(wanted))


def minutes(limit: str) -> int | None:
    """A Slurm time (`UNLIMITED`, `60`, `1:00:00`, `2-00:00:00`) in minutes; None = unlimited.
    ValueError for anything else (the caller names the partition and leaves it out)."""
    if limit.upper() in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    if not _TIME.fullmatch(limit):
        raise ValueError(f"not a Slurm time limit: {limit!r}")
    days, _, rest = limit.rpartition("-")
    nums = [int(x) for x in rest.split(":")]
    if len(nums) == 1:
        mins = nums[0]
    elif len(nums) == 2:
        mins = nums[0] + (1 if nums[1] else 0)
    else:
        mins = nums[0] * 60 + nums[1] + (1 if nums[2] else 0)
    return mins + (int(days) * 1440 if days else 0)


@dataclass
class Partition:
    name: str
    state: str
    max_minutes: int | None
    allow_accounts: str = "ALL"
    deny_accounts: str = ""
    allow_qos: str = "ALL"
    default: bool = False
    nodes: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> GRES type -> GPUs
    free: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> GRES type -> idle GPUs
    usable_nodes: set[str] = field(default_factory=set)  # nodes not down, drained or failing
    cpus: dict[str, int] = field(default_factory=dict)  # node -> CPUs (absent: not readable)
    memory_mb: dict[str, int] = field(default_factory=dict)  # node -> RealMemory in MB (absent: not readable)


def parse_plan(text: str, notes: list[str] | None = None) -> list[Partition]:
    """PLAN_SCRIPT's output -> partitions in the cluster's order; a partition whose record cannot
    be read (cut at the output cap, a garbled time limit) is left out and named in `notes`."""
    head, _, nodes = text.partition("@nodes")
    parts: dict[str, Partition] = {}
    for rec in records(head):
        if "PartitionName" not in rec:
            continue
        try:
            max_minutes = minutes(rec.get("MaxTime", "UNLIMITED"))
        except ValueError:
            if notes is not None:
                notes.append(
                    f"slurm: partition {shown(rec['PartitionName'], limit=SHOWN_MAX)} left out: its time limit "
                    f"{shown(rec.get('MaxTime', ''), limit=SHOWN_MAX)} cannot be read"
                )
            continue
        parts[rec["PartitionName"]] = Partition(
            name=rec["PartitionName"],
            state=rec.get("State", "UP"),
            max_minutes=max_minutes,
            allow_accounts=rec.get("AllowAccounts", "ALL"),
            deny_accounts=rec.get("DenyAccounts", ""),
            allow_qos=rec.get("AllowQos", "ALL"),
            default=rec.get("Default") == "YES",
        )
    for line in nodes.splitlines():
        cols = line.split("|")
        if len(cols) < 5:
            continue
        node, part, gres, used, state = (c.strip() for c in cols[:5])
        p = parts.get(part.rstrip("*"))
        if p is None:
            continue
        total = gres_gpus(gres)
        taken = gres_gpus(used)
        p.nodes[node] = total
        p.free[node] = {k: max(0, v - taken.get(k, 0)) for k, v in total.items()}
        for column, into in ((5, p.cpus), (6, p.memory_mb)):
            value = number(cols[column].strip()) if len(cols) > column else None
            if value:
                into[node] = value
        if not re.search(r"DOWN|DRAIN|FAIL|NOT_RESPONDING|INVAL|MAINT|POWER", state.upper()):
            p.usable_nodes.add(node)
    return list(parts.values())


def allowed(listing: str, name: str | None) -> bool:
    """An AllowAccounts/AllowQos value (`ALL` or a comma list) admits `name` (None: the default)."""
    return listing.upper() == "ALL" or name is None or name in listing.split(",")


@dataclass
class JobState:
    """One job as `scontrol show job -o` tells it."""

    job_id: str
    state: str  # RUNNING, PENDING, TIMEOUT, ... (flags such as COMPLETING dropped)
    reason: str
    restarts: int
    exit_code: int | None
    partition: str = ""
    position: int | None = None  # place among the partition's pending jobs (1 = next)
    log_base: dict[int, int] = field(default_factory=dict)  # rank -> log parts of earlier starts

    @property
    def waiting(self) -> bool:
        return self.state in WAITING

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def final(self) -> bool:
        return not self.waiting and not self.active

    def pending_message(self) -> str:
        where = f", {_ordinal(self.position)} in partition {self.partition}'s queue" if self.position else ""
        again = f" (requeued, start {self.restarts + 1})" if self.restarts else ""
        return f"queued in Slurm as job {self.job_id}: {self.state} ({self.reason}){where}{again}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# Reads the run's job id from its folder, then the job's record and its queue position.
JOB_SCRIPT = r"""
for f in "$R/channel/runs/$RUN"/node-*/log-base; do
  [ -f "$f" ] && echo "@base ${f%/log-base}" "$(head -c 20 "$f" | tr -cd '0-9')"
done
j=$(head -c 40 "$R/work/$RUN/slurm-job" 2>/dev/null | tr -cd '0-9')
[ -n "$j" ] || { echo "@nojob"; exit 0; }
echo "@job $j"
scontrol show job -o "$j" 2>&1 | head -c 100000
echo "@queue"
p=$(scontrol show job -o "$j" 2>/dev/null | tr ' ' '\n' | sed -n 's/^Partition=//p' | head -n 1)
[ -n "$p" ] && squeue -h -t PD -p "$p" -S -p,i -o %i 2>/dev/null | head -n 10000
"""


def parse_job(text: str) -> JobState | None:
    """JOB_SCRIPT's output -> the job, or None when there is no job id or Slurm forgot the job."""
    if "@job " not in text:
        return None
    head, _, queue = text.partition("@queue")
    words = head.split("@job ", 1)[1].split()
    job_id = words[0] if words else ""
    recs = [r for r in records(head) if job_id and r.get("JobId") == job_id]
    if not recs:
        return None
    rec = recs[0]
    state = rec.get("JobState", "UNKNOWN").split("+")[0]
    code_text = rec.get("ExitCode", "")
    code, _, sig = code_text.partition(":")
    exit_code = number(code)
    signal = number(sig)
    if signal:
        exit_code = 128 + signal
    bases = {}
    for found in re.finditer(r"^@base \S*/node-([0-9]{1,6}) ([0-9]{1,9})$", text, re.M):
        bases[int(found.group(1))] = int(found.group(2))
    waiting = [line.strip() for line in queue.splitlines() if line.strip()]
    position = waiting.index(job_id) + 1 if job_id in waiting else None
    return JobState(
        job_id=job_id,
        state=state,
        reason=rec.get("Reason", "None"),
        restarts=number(rec.get("Restarts", "0")) or 0,
        exit_code=exit_code,
        partition=rec.get("Partition", ""),
        position=position,
        log_base=bases,
    )
