"""The channel of a Slurm run: a file channel on the cluster's shared filesystem, read through the
login node (the ssh provider's SshChannel with one host for every rank), plus Slurm's own word.

Every node writes its objects under the login node's `<root>/channel/` (shared), so each rank's
keys live on the one login host. `read_status` also asks Slurm about the job (one call per poll):
- while the job waits in the queue (PENDING, or requeued after a preemption) the node has nothing
  to say; the status is a `booting` one whose stage names the pending reason and the queue
  position, so `status` and the run's progress lines show why it waits;
- a node's final status is taken once Slurm says the job ended; until then a final status left by
  a start that Slurm requeued is not final;
- where Slurm ended the job itself (TIMEOUT, PREEMPTED without requeue, NODE_FAIL,
  OUT_OF_MEMORY, FAILED or CANCELLED before the node reported), Slurm's state decides: a TIMEOUT is the
  deadline (exit 124) even though the node, killed by Slurm's SIGTERM, reported a signal. A
  COMPLETED job is never reported for a node that wrote no final status (that read is retried, and
  a node gone without one is "lost" as anywhere): success is the node's own, signed word.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator

from gpucloud.channel.run_objects import LOG_PART_MAX, SMALL_OBJECT_MAX, ObjectRefused, log_key, node_prefix
from gpucloud.providers.slurm import login as _login
from gpucloud.providers.slurm.cluster import FINAL, JOB_SCRIPT, JobState, parse_job
from gpucloud.providers.slurm.login import Login
from gpucloud.providers.ssh import transport as ssh_transport
from gpucloud.providers.ssh.channel import PUT_P, ROOT_TOKEN, SshChannel

JOB_CACHE_S = 0.8  # one Slurm query serves every rank's read of one poll


class _SameHost(list[str]):
    """Every rank's objects are on the login node's shared filesystem."""

    def __getitem__(self, index: object) -> str:  # type: ignore[override]
        return str(list.__getitem__(self, 0))


class SlurmChannel(SshChannel):
    def __init__(self, login: Login) -> None:
        super().__init__([login.cluster])
        self.hosts = _SameHost([login.cluster])
        self.login = login
        self._jobs: dict[str, tuple[float, JobState | None]] = {}

    def _targets(self, key: str) -> list[str]:
        return [self.login.cluster]

    def _run(self, host: str, script: str, **kwargs: object) -> ssh_transport.Result:  # noqa: F811
        return self.login.run(script, **kwargs)  # type: ignore[arg-type]

    def node_url(self, url: str, rank: int) -> str:
        """Every node shares the login node's root (one filesystem)."""
        return url.replace(ROOT_TOKEN, urllib.parse.quote(self.login.root())) if ROOT_TOKEN in url else url

    def put_bytes(self, key: str, data: bytes) -> None:
        if ROOT_TOKEN.encode() in data:
            data = data.replace(ROOT_TOKEN.encode(), urllib.parse.quote(self.login.root()).encode())
        path = self._path(key)
        self._run(
            self.login.cluster,
            f"p={path}; {PUT_P}",
            input=data,
        )

    # ---- Slurm's word -------------------------------------------------------------------------------
    def job(self, run_id: str) -> JobState | None:
        """The run's Slurm job now (cached for one poll); None before submission or once Slurm forgot it."""
        seen = self._jobs.get(run_id)
        if seen and time.monotonic() - seen[0] < JOB_CACHE_S:
            return seen[1]
        out = self.login.run(_login.script(JOB_SCRIPT, RUN=run_id), check=False, max_output=SMALL_OBJECT_MAX)
        state = parse_job(out.stdout.decode("utf-8", "replace"))
        self._jobs[run_id] = (time.monotonic(), state)
        return state

    def read_status(self, run_id: str, rank: int = 0) -> dict | None:
        st = super().read_status(run_id, rank)
        try:
            job = self.job(run_id)
        except ssh_transport.SshError:
            return st
        out = merge(st, job, run_id, rank)
        base = job.log_base.get(rank, 0) if job else 0
        if out is not None and base:  # parts of earlier starts (requeues) come first
            out = {**out, "log_parts": base + int(out.get("log_parts") or 0)}
        return out

    def iter_log(self, run_id: str, rank: int = 0, start: int = 0) -> Iterator[tuple[bytes, int]]:
        """One log across the job's starts: parts below the log base are the archived ones."""
        status = self.read_status(run_id, rank)
        done = int(status.get("log_parts") or 0) if status else 0
        seen = self._jobs.get(run_id)
        base = seen[1].log_base.get(rank, 0) if seen and seen[1] else 0
        for i in range(start, done):
            key = f"{node_prefix(run_id, rank)}/log-archive/{i:06d}" if i < base else log_key(run_id, rank, i - base)
            try:
                data = self.get_bytes(key, limit=LOG_PART_MAX)
            except ObjectRefused as exc:
                data = f"[gpucloud] log part {i} not read: {exc.message}\n".encode()
            if data is None:
                return
            yield data, i + 1


def merge(st: dict | None, job: JobState | None, run_id: str, rank: int) -> dict | None:
    """The node's status with Slurm's state applied (the module docstring says how)."""
    if job is None:
        return st
    final = bool(st and st.get("state") in ("succeeded", "failed", "deadline", "error", "preempted"))
    if job.waiting:
        return _waiting(st, job, run_id, rank)
    if job.active:
        # A node stopped by a signal while Slurm still has the job: Slurm's reason (time limit,
        # preemption and requeue, scancel) comes with the job's end; read it again next poll.
        signalled = final and st is not None and st.get("state") == "failed" and st.get("exit_code") is None
        return _hold(st) if signalled and st is not None else st
    meaning = FINAL.get(job.state)
    if meaning is None:
        return st
    state, code, message = meaning
    if state in ("deadline", "preempted") or (state == "error" and not final):
        return _final(st, run_id, rank, state, None if state != "error" else code, message)
    if not final and job.state != "COMPLETED":  # the node never reported: Slurm's verdict and exit code
        return _final(st, run_id, rank, state, job.exit_code or code, message)
    return st


def _hold(st: dict) -> dict:
    """A final status while Slurm still runs the job: the node is finishing (or a requeue is coming);
    read it again next poll, once Slurm has the job's end."""
    return {**st, "state": "running", "heartbeat": time.time()}


def _waiting(st: dict | None, job: JobState, run_id: str, rank: int) -> dict:
    now = time.time()
    return {
        "run_id": run_id,
        "rank": rank,
        "state": "booting",
        "stage": job.pending_message(),
        "stages": {},
        "heartbeat": now,
        "exit_code": None,
        "message": job.pending_message(),
        "log_parts": 0,
        "log_bytes": 0,
    }


def _final(st: dict | None, run_id: str, rank: int, state: str, code: int | None, message: str) -> dict:
    base = dict(st or {"run_id": run_id, "rank": rank, "stages": {}, "log_parts": 0, "log_bytes": 0})
    note = f"{message}; the node said: {base['message']}" if base.get("message") else message
    base.update(state=state, exit_code=code, message=note, heartbeat=time.time())
    base.setdefault("stage", "done")
    return base
