"""A kept machine (`keep:` in the job file, `run --keep`): after its job the node reports the job's
end (a signed status carrying `kept` and the job's number) and, instead of ending, waits for the
next job the run's owner signs into the channel's `request` object (job_request.py). It ends as any
run does (the final gate, `finish`, the provider's self-teardown) once it was idle for `keep_s`:
no job running, no open session (`W/sessions/<name>` holding a live pid), no GPU busy. The
deadline layers are untouched: the watchdog process, the backstop and the cloud's schedule still
end it at max_duration, so a kept machine lives at most max_duration from its boot.

Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

from gpucloud.vm.agent import data, gpu_usage, job_request, mounts, secret_env
from gpucloud.vm.agent.claim import verify
from gpucloud.vm.agent.clock import Clock
from gpucloud.vm.agent.ending import Ending
from gpucloud.vm.agent.private import private_tree
from gpucloud.vm.agent.safe_extract import Refused, safe_untar
from gpucloud.vm.agent.stage_api import StageFailed
from gpucloud.vm.agent.status import write_atomic

SESSIONS_DIR = "sessions"  # W/sessions/<name>: the pid of an open session (gpucloud ssh); a live one is not idle
GPU_CHECK_S = 5.0
# A kept machine's next job: its first seconds of log go up this often (then the run's log interval),
# so `exec` shows the first line within seconds; the request is polled as often.
FAST_LOG_S = 0.25
FAST_LOG_FOR_S = 30.0
Outcome = Tuple[str, int, str]  # state, exit code, message


def live_sessions(vm_dir: Path) -> int:
    """Open sessions: files under W/sessions/ whose first word is a live pid."""
    count = 0
    try:
        entries = list((vm_dir / SESSIONS_DIR).iterdir())
    except OSError:
        return 0
    for path in entries:
        try:
            pid = int(path.read_text().split()[0])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            continue
        count += 1
    return count


def _inside(root: Path, rel: str) -> Optional[Path]:
    """`rel` under `root` (no absolute path, no `..`, no link on the way), else None."""
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return None
    here = root
    for part in parts[:-1]:
        here = here / part
        if here.is_symlink() or not here.is_dir():
            return None
    return here / parts[-1]


class Keeping(Ending):
    """The agent's part: the job's end on a kept machine, the idle wait, the next job."""

    clock: Clock
    job_dir: Path
    st: Path
    threads: Dict[str, threading.Thread]
    pump_stop: threading.Event
    job_seq: int = 0
    fast_log_until: float = 0.0
    gpu_watch: Any = None
    _refused: str = ""
    key: Any
    secret_values: Dict[str, str]
    data_grants: Dict[str, Any]
    outputs: Optional[data.OutputSync]

    def push_outputs(self) -> None:
        raise NotImplementedError

    def report_inputs(self, progress: Dict[str, int]) -> None:
        raise NotImplementedError

    def _thread(self, name: str, target: Callable[[], None]) -> None:
        raise NotImplementedError

    def gate_check(self) -> None:
        raise NotImplementedError

    def pump_loop(self) -> None:
        raise NotImplementedError

    def stage(self, name: str, start: Optional[float] = None) -> None:
        raise NotImplementedError

    def stage_always(self, name: str) -> None:
        raise NotImplementedError

    def run_step(self, command: str, step: str = "run") -> int:
        raise NotImplementedError

    def start_gpu_watch(self) -> Any:
        raise NotImplementedError

    def job_stopping(self) -> None:
        """The job's last step ended: a machine that is not kept takes the final gate here."""
        if self.cfg.keep_s:
            if self.gate.taken():
                self.take_final("main")  # StandDown: someone else ends the run
            return
        self.take_final("main")

    def job_ended(self, state: str, rc: int, message: str) -> int:
        """The job's end; on a machine that is not kept, the run's end too."""
        if not self.cfg.keep_s:
            self.finish(state, rc, rc, message, terminate=False)
            return rc
        self.report_job(state, rc, message)
        return self.keep_loop((state, rc, message))

    def report_job(self, state: str, rc: int, message: str) -> None:
        """The job's final status (signed: its exit code and artifacts hash count), its log flushed
        first, then the pump goes on (heartbeats while kept)."""
        if message:
            self.log(message)
        self.log(f"job {self.job_seq}: state {state}, exit code {rc}; the machine is kept for {self.cfg.keep_s}s idle")
        if self.gpu_watch is not None:
            self.gpu_watch.stop.set()
        self.stop_pump()
        self.board.set_final(state, rc, message)
        now = int(self.clock.now())
        self.board.set(job=self.job_seq, kept={"since": now, "until": now + self.cfg.keep_s})
        if self.pump is not None:
            self.pump.drain()
        self.board.push(final=True)
        self.pump_stop.clear()
        self._thread("pump", self.pump_loop)

    def busy(self, now: float, next_gpu: float) -> Tuple[bool, float]:
        """Whether a session is open or a GPU works (sampled every GPU_CHECK_S); the next sample time."""
        if live_sessions(self.vm_dir):
            return True, next_gpu
        if self.cfg.gpu_count and now >= next_gpu:
            gpus = gpu_usage.sample()
            return any((g[0] or 0) >= gpu_usage.IDLE_PCT for g in gpus), now + GPU_CHECK_S
        return False, next_gpu

    def rejoin_keep(self) -> int:
        """A kept machine that rebooted while it waited: it waits again, its idle time counted from
        before the boot (the board's `kept.since`, wall clock) and its deadline the first boot's
        (st/deadline, which the backstop re-armed from too). Secrets lived in memory only: until a
        `run --on` brings a job's own, it holds none."""
        seq = self.board.get("job")  # the last job's number, as its kept status said
        self.job_seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else 0
        kept = self.board.get("kept") or {}
        since = kept.get("since") if isinstance(kept, dict) else None
        idle_from = float(since) if isinstance(since, (int, float)) else self.clock.now()
        code, message = self.board.get("exit_code"), str(self.board.get("message") or "")
        last = (str(self.board.get("state")), code if isinstance(code, int) else 1, message)
        self.log(f"the machine rebooted while kept: it waits again for the next job (idle since {int(idle_from)})")
        self.board.push()
        return self.keep_loop(last, idle_from)

    def keep_loop(self, last: Outcome, idle_from: Optional[float] = None) -> int:
        """Wait for the next job until idle for keep_s; then the run ends as every run does."""
        idle_from = self.clock.now() if idle_from is None else idle_from
        next_gpu = 0.0
        while True:
            self.gate_check()
            req = self.next_request()
            if req is not None:
                last = self.run_request(req)
                self.report_job(*last)
                idle_from = self.clock.now()
                continue
            now = self.clock.now()
            busy, next_gpu = self.busy(now, next_gpu)
            if busy:
                idle_from = now
                self.board.set(kept={"since": int(now), "until": int(now) + self.cfg.keep_s})
            if now - idle_from >= self.cfg.keep_s:
                break
            self.clock.sleep(self.cfg.keep_poll_s)
        self.take_final("main")
        self.board.set(kept=None)
        state, rc, message = last
        why = f"the kept machine was idle for {self.cfg.keep_s}s: it ends"
        self.finish(state, rc, rc, f"{message}; {why}" if message else why, terminate=False)
        return rc

    def next_request(self) -> Optional[Dict[str, Any]]:
        """A new job the owner signed, or None (none, already taken, or refused: logged once)."""
        url = self.manifest.url("request_get")
        if not url:
            return None
        raw = self.transfer.get(url, max_time=10, limit=job_request.REQUEST_MAX)
        if not raw or job_request.peek_seq(raw) <= self.job_seq:
            return None
        digest = hashlib.sha256(raw).hexdigest()
        if digest == self._refused:
            return None
        try:
            return job_request.parse(
                raw,
                run_id=self.cfg.run_id,
                rank=self.rank,
                owner_key=self.cfg.keep_key,
                last_seq=self.job_seq,
                verify=verify,
            )
        except job_request.Refused as exc:
            self._refused = digest
            self.log(f"a job request in the channel was refused: {exc}")
            return None

    def run_request(self, req: Dict[str, Any]) -> Outcome:
        """The owner's next job: the changed files, setup, run, artifacts; the job's own outcome."""
        self.job_seq = req["seq"]
        self.fast_log_until = self.clock.now() + FAST_LOG_FOR_S
        write_atomic(self.st / "job_seq", str(self.job_seq).encode())
        self.log(f"job {self.job_seq}: taken from the run's channel")
        self.cfg.setup, self.cfg.run, self.cfg.env = req["setup"], req["run"], req["env"]
        self.cfg.artifacts = req["artifacts"]
        self.board.set(
            state="running", stages={}, exit_code=None, message="", artifacts_sha256="", kept=None, job=self.job_seq
        )
        self.board.set(art_failed="")
        self.stage("fetch_code")
        problem = self.sync_code(req) or (self.job_secrets(req) if req["own_secrets"] else "")
        if problem:
            return "error", 1, problem
        if self.cfg.setup:
            self.stage("setup")
            rc = self.run_step(self.cfg.setup, "setup")
            if rc != 0:
                self.board.end_stage("setup", False)
                return "failed", rc, f"setup exited with code {rc}"
        self.stage("run")
        self.gpu_watch = self.start_gpu_watch()
        rc = self.run_step(self.cfg.run, "run")
        self.job_stopping()
        self.board.end_stage("run", rc == 0)
        self.push_outputs()
        if self.cfg.artifacts:
            self.stage_always("artifacts")
            if not self.collect_artifacts():
                self.log("artifact upload failed")
                self.board.end_stage("artifacts", False)
        return ("succeeded", 0, "") if rc == 0 else ("failed", rc, f"job exited with code {rc}")

    def sync_code(self, req: Dict[str, Any]) -> str:
        """The workdir's changed files (their archive's SHA-256 is in the signed request), then the
        removed ones; '' when done, else why not."""
        if req["code_get"]:
            archive = self.vm_dir / f"code-{self.job_seq}.tar.gz"
            if not self.transfer.get_file(req["code_get"], archive, max_time=1800):
                return "could not download the job's changed files"
            try:
                with open(archive, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                if digest != req["code_sha256"]:
                    return "the job's changed files are not the ones the owner signed (SHA-256 differs)"
                count = safe_untar(archive, self.job_dir, links=True)
            except (OSError, Refused) as exc:
                return f"could not unpack the job's changed files: {exc}"
            finally:
                try:
                    archive.unlink()
                except OSError:
                    pass
            private_tree(self.job_dir)
            self.log(f"job {self.job_seq}: {count} changed file(s) synced")
        for rel in req["delete"]:
            path = _inside(self.job_dir, rel)
            if path is not None and (path.is_symlink() or path.is_file()):
                path.unlink()
        return ""

    def job_secrets(self, req: Dict[str, Any]) -> str:
        """`run --on`: the job's own secrets and data grants replace the run's (none: none), sealed
        to this node's key in the object whose SHA-256 the owner signed; then its inputs. '' when
        done, else why not."""
        if self.outputs is not None:
            self.outputs.stop.set()
        mounts.unmount_recorded(self.vm_dir)  # the last job's mounted inputs are not this one's
        self.secret_values, self.data_grants, self.outputs = {}, {}, None
        self.cfg.secrets = []  # what run_step masks: this job's own names, not the first job's
        if not req["secrets_get"]:
            return ""
        blob = self.transfer.get(req["secrets_get"], max_time=30, limit=secret_env.sealed.SEALED_MAX)
        if not blob or hashlib.sha256(blob).hexdigest() != req["secrets_sha256"]:
            return "the job's sealed secrets are missing, or not the ones the owner signed (SHA-256 differs)"
        pem = self.key.key_path.read_text() if self.key.key_path.is_file() else None
        try:
            doc = secret_env.open_doc(blob, [], self.cfg.run_id, self.rank, pem)
        except StageFailed as exc:
            return str(exc)
        self.secret_values, self.data_grants = doc["env"], doc["data"]
        self.cfg.secrets = sorted(self.secret_values)
        if self.secret_values:
            self.log(f"job {self.job_seq}: secrets {', '.join(sorted(self.secret_values))} (masked in this log)")
        self.outputs = data.OutputSync(self.data_grants, self.job_dir, self.transfer, self.log)
        self.outputs.start(self.cfg.outputs_interval)
        if not self.data_grants.get("inputs"):
            return ""
        self.stage("inputs")
        try:
            mounts.mount_inputs(self.data_grants, self.job_dir, self.vm_dir, self.environ, self.log, self.clock.sleep)
            data.fetch_inputs(self.data_grants, self.job_dir, self.transfer, self.log, self.report_inputs)
        except StageFailed as exc:
            return str(exc)
        return ""
