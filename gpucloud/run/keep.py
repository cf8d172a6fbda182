"""Kept runs on the CLI side: a run whose node reported its job's end with `kept` stays up (status
"kept", an active status: `ls` shows it with what it costs idle, `down` ends it, `gc` sweeps it
once past its deadline), and the workdir it was given is remembered file by file, so the next job
(`gpucloud exec`, `run --on`, run/exec_job.py) sends only what changed. A kept run gets a follower
(run/keep_end.py, a process of its own) that tears down what is left once its machine ended.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpucloud.errors import UserError
from gpucloud.state.records import RunRecord
from gpucloud.state.runs_db import Store, home_dir

if TYPE_CHECKING:
    from gpucloud.spec.load import JobSpec
    from gpucloud.ui.progress import Progress

KEPT = "kept"
LISTING = "workdir.json"
FOLLOWER = "gpucloud.run.keep_end"  # `python -m` it: the follower of a kept run
FOLLOWER_PID, FOLLOWER_LOG = "kept-follower.pid", "kept-follower.log"


def parse_keep(text: str, num_nodes: int) -> int | None:
    """`run --keep 30m` as the job file's `keep` reads it (off: None); bad input is exit 2."""
    from pydantic_core import PydanticCustomError

    from gpucloud.spec.values import keep_duration

    try:
        return keep_duration(text, num_nodes)
    except PydanticCustomError as exc:
        raise UserError(f"--keep: {exc.message()}.") from None


def run_spec(run: RunRecord) -> dict:
    """The job file as the run recorded it (JSON), {} when unreadable."""
    try:
        doc = json.loads(run.spec_json or "{}")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def kept_status(statuses: list[dict | None]) -> dict | None:
    """The node's `kept` field when its final status says the machine waits for the next job."""
    first = statuses[0] if statuses else None
    kept = first.get("kept") if first else None
    return kept if isinstance(kept, dict) else None


def record_kept(store: Store, run_id: str, code: int | None, say: Callable[[str], None]) -> bool:
    """The job ended and the machine stays: the run is "kept" (nobody follows it: `refresh` reads
    it like a detached run)."""
    run = store.get_run(run_id)
    idle = int(run_spec(run).get("keep") or 0) if run else 0
    store.update_run(run_id, status=KEPT, phase=idle_note(run), exit_code=code, detached=True, pid=None)
    store.event(run_id, KEPT, f"job ended (exit {code}); the machine waits {idle}s idle for the next job")
    start_follower(store, run_id)  # what the run made around the machine goes when it ends
    say(
        f"the machine is kept for {idle}s idle (at the latest until max_duration): "
        f"`gpucloud exec {run_id} -- CMD` or `gpucloud run --on {run_id} JOB` runs the next job on it, "
        f"`gpucloud down {run_id}` ends it"
    )
    return True


def still_kept(run: RunRecord, statuses: list[dict | None]) -> bool:
    """A kept run whose node still waits (its last status carries `kept`, or a later job runs); a
    detached run (`run --detach`, `gpucloud dev`) becomes one when its node says so."""
    first = statuses[0] if statuses else None
    if first is None or run.status not in (KEPT, "running"):
        return False
    return kept_status(statuses) is not None or (run.status == KEPT and first.get("state") in ("booting", "running"))


def mark_kept(store: Store, run: RunRecord, statuses: list[dict | None]) -> RunRecord:
    """A detached run whose job ended on a kept machine: recorded as kept, as `run` records it."""
    if run.status != KEPT:
        code = (statuses[0] or {}).get("exit_code")
        store.update_run(run.id, status=KEPT, phase=idle_note(run), exit_code=code if isinstance(code, int) else None)
        store.event(run.id, KEPT, f"job ended (exit {code}); the machine waits for the next job")
    start_follower(store, run.id)  # a live one (its own refresh brought it here) is left as it is
    return store.get_run(run.id) or run


def ended_kept(store: Store, run: RunRecord, ended: bool) -> None:
    """`refresh` found a kept run's machine ended (final or lost): its follower cleans up, started
    again if the one that watched it is gone."""
    if ended and run.status == KEPT:
        start_follower(store, run.id)


def mark_detached(store: Store, run_id: str, spec: JobSpec, progress: Progress) -> None:
    """A detached run is running from here on; one with `keep` outlives any CLI, so its follower
    starts now (it marks the run kept when the node says so, and cleans up after the end). The
    user is told how to follow, collect and end it."""
    store.update_run(run_id, status="running", phase="booting")
    if spec.keep:
        start_follower(store, run_id)
    progress.info(
        f"detached: the run ends itself at the latest at max_duration; "
        f"`gpucloud logs {run_id} --follow` follows it, "
        f"`gpucloud collect {run_id}` brings back its log and artifacts once it ended, "
        f"`gpucloud down {run_id}` ends it"
    )
    if spec.recovery is not None:
        progress.warn(
            f"recovery applies only while a CLI follows the run: start `gpucloud watch {run_id}`, "
            "or a preemption ends it"
        )


# ---- the follower (run/keep_end.py: the process itself) -----------------------------------------


def follower_pid(run_id: str) -> int | None:
    """The live follower's pid (its pid file names a process running keep_end), else None."""
    try:
        pid = int(pid_path(run_id).read_text().split()[0])
        if not Path("/proc/self").is_dir():  # no /proc (macOS): a live pid is taken for the follower
            os.kill(pid, 0)
            return pid
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return None
    return pid if FOLLOWER.encode() in cmdline else None


def start_follower(store: Store, run_id: str) -> int | None:
    """Start the run's follower unless one lives; its pid (None when it could not be started)."""
    live = follower_pid(run_id)
    if live is not None:
        return live
    path = pid_path(run_id)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(FOLLOWER_LOG), "ab") as log:
            proc = subprocess.Popen(  # noqa: S603 - this interpreter, gpucloud's module, a run id from the store
                [sys.executable, "-m", FOLLOWER, run_id],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # a ^C or a closed terminal of the launching CLI does not end it
                close_fds=True,
            )
    except OSError as exc:
        store.event(run_id, KEPT, f"no follower could be started ({exc}): `gc` or `down` cleans up")
        return None
    write_atomic(path, f"{proc.pid}\n")
    store.event(run_id, KEPT, f"follower started (pid {proc.pid}): it tears down what is left once the machine ends")
    return proc.pid


def pid_path(run_id: str) -> Path:
    return home_dir() / "runs" / run_id / FOLLOWER_PID


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.time_ns()}")
    tmp.write_text(text)
    tmp.replace(path)


def idle_note(run: RunRecord | None) -> str:
    """A kept run's phase (`ls`, `status`): what its waiting machine costs."""
    per_hour = (run.price_per_hour or 0.0) * max(1, run.num_nodes) if run else 0.0
    return f"idle, ${per_hour:.3f}/h"


# ---- the workdir as the node has it --------------------------------------------------------------


def listing_path(run_id: str) -> Path:
    return home_dir() / "runs" / run_id / LISTING


def remember_workdir(spec: JobSpec, run_id: str, tarball: Path) -> None:
    """A kept run's files as the node was given them (the code tarball gpucloud packed itself)."""
    if spec.keep:
        save_listing(run_id, tarball_listing(tarball))


def tarball_listing(tarball: Path) -> dict[str, str]:
    import hashlib
    import tarfile

    files: dict[str, str] = {}
    with tarfile.open(tarball, "r:gz") as tar:  # gpucloud's own archive, packed on this machine
        for member in tar:
            if member.isfile():
                f = tar.extractfile(member)
                if f is not None:
                    files[member.name.removeprefix("./")] = hashlib.sha256(f.read()).hexdigest()
            elif member.issym():
                files[member.name.removeprefix("./")] = "link:" + member.linkname
    return files


def save_listing(run_id: str, files: dict[str, str]) -> None:
    path = listing_path(run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(files, sort_keys=True))


def load_listing(run_id: str) -> dict[str, str]:
    try:
        data = json.loads(listing_path(run_id).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
