"""The node's whole life, in threads: the main thread runs the stages (preflight, stack,
gpu_verify, fetch_code, setup, barrier, run, artifacts); beside it the watchdog (deadline), the
pump (log parts and heartbeat) and the guard (preemption notice, checkpoints). Whoever ends the run
takes the final gate first (final.py) and reports; the others stand down. The last step is the
provider's self-teardown (hooks.py). docs/INTERNALS.md, "VM agent".

Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from gpucloud.vm import protocol
from gpucloud.vm.agent import artifacts, container, data, gpu_check, stack
from gpucloud.vm.agent.barrier import Barrier, ReadyKeys, node_ip
from gpucloud.vm.agent.blob_token import IDENTITY, BlobBearer, ManagedIdentityToken
from gpucloud.vm.agent.checkpoints import Checkpoints
from gpucloud.vm.agent.claim import NodeKey, verify
from gpucloud.vm.agent.clock import Clock
from gpucloud.vm.agent.config import JobConfig
from gpucloud.vm.agent.deadline import Deadline, deadline_message, deadline_why
from gpucloud.vm.agent.ending import AgentExit, StandDown
from gpucloud.vm.agent.final import FinalGate
from gpucloud.vm.agent.gpu_watch import GpuWatching
from gpucloud.vm.agent.guard import Guard
from gpucloud.vm.agent.heartbeat import Heartbeat
from gpucloud.vm.agent.hooks import IMDS_DEFAULT, Hooks, hooks_for
from gpucloud.vm.agent.keep import FAST_LOG_S, Keeping
from gpucloud.vm.agent.logpump import LogPump
from gpucloud.vm.agent.private import private_tree
from gpucloud.vm.agent.runner import Runner
from gpucloud.vm.agent.safe_extract import Refused, safe_untar
from gpucloud.vm.agent.sigv4 import ImdsCredentials, Signer
from gpucloud.vm.agent.stage_api import StageEnv, StageFailed
from gpucloud.vm.agent.status import StatusBoard, write_atomic
from gpucloud.vm.agent.steps import JobSteps
from gpucloud.vm.agent.transfer import Transfer
from gpucloud.vm.agent.uploads import log_upload

MANIFEST_MAX = 1024 * 1024
STOP_PUMP_S = 5.0


class Agent(GpuWatching, JobSteps, Keeping):
    def __init__(
        self,
        cfg: JobConfig,
        vm_dir: Path,
        *,
        manifest_url: str = "",
        clock: Optional[Clock] = None,
        transfer: Optional[Transfer] = None,
        hooks: Optional[Hooks] = None,
        environ: Optional[Dict[str, str]] = None,
        resumed: bool = False,
        exit: Optional[Callable[[int], None]] = None,
    ) -> None:
        self.cfg = cfg
        self.environ = dict(os.environ if environ is None else environ)
        self.clock = clock or Clock()
        self.transfer = transfer or Transfer(cfg.put_headers, sleep=self.clock.sleep)
        self.manifest_url = manifest_url
        self.resumed = resumed
        self._exit = exit or _hard_exit
        self.rank = cfg.rank
        grace = self.environ.get("GPUCLOUD_DEADLINE_GRACE", "")
        if grace.isdigit():  # the simulators' short deadlines (the shim honours it too)
            cfg.grace = int(grace)
        self.bad_dir = ""
        self._set_dir(vm_dir)
        self.hooks = hooks or hooks_for(
            cfg.self_termination,
            cfg.preemption_notice,
            self.transfer,
            self.environ,
            self.log,
            self.clock.sleep,
            endpoints=cfg.endpoints,
        )
        self.manifest = protocol.Manifest()
        self.key = NodeKey(self.vm_dir, self.log)
        self.board = StatusBoard(
            cfg.run_id, self.rank, self.st, self.clock.now, self._upload_status, sign=None, log=self.log
        )
        self.gate = FinalGate(self.vm_dir)
        self.runner = Runner(self.vm_dir, self.job_dir, self.log_path, self.log, self.clock.sleep)
        self.deadline = Deadline(self.st, int(self.clock.now()) + cfg.max_duration)
        self.pump: Optional[LogPump] = None
        self.heartbeat: Optional[Heartbeat] = None
        self.guard: Optional[Guard] = None
        self.checkpoints: Optional[Checkpoints] = None
        self.pump_stop = threading.Event()
        self.guard_stop = threading.Event()
        self.threads: Dict[str, threading.Thread] = {}
        self.node_ips: List[str] = ["127.0.0.1"] if cfg.num_nodes == 1 else []
        self.watchdog_pid = 0
        self.parent_pid = 0  # in the watchdog process: the main agent process, told when it ended the run
        self.board.ended_elsewhere = lambda: self.gate.elsewhere()
        self.secret_values: Dict[str, str] = {}
        self.data_grants: Dict[str, Any] = {}
        self.pull_login: Dict[str, str] = {}  # the container image's, sealed: {server, username, password}
        self.outputs: Optional[data.OutputSync] = None
        self.box: Optional[container.Container] = None  # the job's container (container_pull)

    # ---- folders and the log -------------------------------------------------------------------
    def _set_dir(self, vm_dir: Path) -> None:
        self.vm_dir = Path(vm_dir)
        self.st = self.vm_dir / "st"
        self.job_dir = self.vm_dir / "job"
        self.log_path = self.vm_dir / "job.log"

    def make_dirs(self) -> None:
        """The work folder, or a temporary one so the run can still report why it cannot have it."""
        try:
            for d in (self.vm_dir, self.st, self.job_dir, self.vm_dir / container.NOTICE_DIR):
                d.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "ab"):
                pass
        except OSError:
            self.bad_dir = str(self.vm_dir)
            self._set_dir(Path(tempfile.mkdtemp(prefix="gpucloud.", dir=self.environ.get("TMPDIR") or None)))
            for d in (self.st, self.job_dir, self.vm_dir / container.NOTICE_DIR):
                d.mkdir(parents=True, exist_ok=True)
            self.gate = FinalGate(self.vm_dir)
            self.runner = Runner(self.vm_dir, self.job_dir, self.log_path, self.log, self.clock.sleep)
            self.key = NodeKey(self.vm_dir, self.log)
            self.board.st_dir = self.st
            self.deadline.path = self.st / "deadline"

    def log(self, line: str) -> None:
        text = f"[gpucloud] {line}\n"
        try:
            with open(self.log_path, "a", encoding="utf-8", errors="replace") as f:
                f.write(text)
        except OSError:
            pass
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def stage_env(self) -> StageEnv:
        return StageEnv(
            log=self.log,
            vm_dir=self.vm_dir,
            environ=self.environ,
            now=self.clock.now,
            sleep=self.clock.sleep,
            stopping=self.gate.taken,
            resumed=self.resumed,
            note=self.stage_note,
        )

    def stage_note(self, text: str) -> None:
        """A stage's wait (another apt holding apt's lock), in the status's message while it lasts."""
        self.board.set(message=text or None)
        self.board.push()

    # ---- status ------------------------------------------------------------------------------------
    def _upload_status(self, path: Path, final: bool) -> bool:
        url = self.manifest.url("status_put")
        if not url:
            return True
        return self.transfer.put_file(url, path, max_time=30, hard=final)

    def _sign(self, raw: bytes) -> Optional[str]:
        return self.key.sign(raw, self.clock.wait)

    def gate_check(self) -> None:
        if self.gate.taken():
            raise StandDown()

    def stage(self, name: str, start: Optional[float] = None) -> None:
        self.gate_check()
        self.board.begin_stage(name, start)
        self.log(f"stage {name}")
        self.board.push()

    # ---- the manifest ------------------------------------------------------------------------------
    def fetch_manifest(self, url: str) -> protocol.Manifest:
        """Retried until the deadline (the watchdog already runs); none: nothing can be reported."""
        path = self.vm_dir / "manifest"
        if self.resumed and path.is_file() and path.stat().st_size:
            return protocol.parse_manifest(path.read_text(encoding="utf-8", errors="replace"))
        i = 0
        while not self.deadline.passed(self.clock.now()):
            body = self.transfer.get(url, max_time=60, limit=MANIFEST_MAX)
            if body:
                write_atomic(path, body)
                return protocol.parse_manifest(body.decode("utf-8", "replace"))
            self.gate_check()
            i += 1
            self.clock.sleep(i * i if i < 8 else 60)
        raise AgentExit(1, f"cannot fetch the manifest from {url}: giving up")

    def resolve_rank(self) -> None:
        """A shared user-data: the rank from GPUCLOUD_NODE_RANK or the launch index, then the
        node's own manifest from the run's node index."""
        if not self.cfg.shared:
            return
        text = self.environ.get("GPUCLOUD_NODE_RANK", "")
        rank = int(text) if text.isdigit() else self.hooks.launch_index()
        if rank is None or not 0 <= rank < self.cfg.num_nodes:
            got = text or ("" if rank is None else rank)
            raise AgentExit(1, f"cannot tell this node's rank (got '{got}', expected 0..{self.cfg.num_nodes - 1})")
        self.rank = self.board.rank = rank
        index = self.fetch_manifest(self.manifest_url)
        self.manifest_url = index.nodes.get(rank, "")

    # ---- threads -------------------------------------------------------------------------------------
    def _thread(self, name: str, target: Callable[[], None]) -> None:
        t = threading.Thread(target=self._guarded(target), name=name, daemon=True)
        self.threads[name] = t
        t.start()

    def _guarded(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except StandDown:
                pass

        return run

    def start_watchdog(self) -> None:
        """Deadline layer (b) in a process of its own, forked before any thread starts (a fork of a
        threaded process may copy a held lock): it outlives a main process that is killed or stuck
        in a call. Its pid is in st/wd_pid."""
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
                    signal.signal(sig, signal.SIG_DFL)
                self.parent_pid = parent
                self.watchdog_process()
            except BaseException:  # noqa: BLE001 - the watchdog process never returns into main's code
                code = 1
            finally:
                os._exit(code)
        self.watchdog_pid = pid
        write_atomic(self.st / "wd_pid", f"{pid}\n".encode())

    def watchdog_process(self) -> None:
        """Wait for the deadline (re-read from st/deadline: the manifest may lower it), unless the
        run ends first; then end it from what is on disk (manifest, status fields, log position)."""
        while True:
            loaded = Deadline.load(self.st)
            if loaded is not None:
                self.deadline.at = loaded.at
            if self.gate.path.exists():
                return
            now = self.clock.now()
            if self.deadline.passed(now):
                break
            self.clock.sleep(min(self.cfg.tick_s, max(0.01, self.deadline.remaining(now))))
        self.end_at_deadline()

    def end_at_deadline(self) -> bool:
        """The deadline passed: stop the job and report `deadline`; False when someone else ended the run."""
        if not self.gate.take("watchdog"):
            return False
        write_atomic(self.st / "script_code", b"124")
        if self.parent_pid:  # 0 would signal the whole process group
            try:
                os.kill(self.parent_pid, signal.SIGUSR1)  # the main process stops what it does and waits for us
            except OSError:
                pass
        why = self.cfg.deadline_why
        self.log(f"{deadline_why(why)}: stopping the job")
        started = self.runner.pgid() is not None
        self.runner.kill()
        self.load_from_disk()
        if why and started:  # a cap on money ends the run as a stop does: what the job saved goes up
            self.artifacts_on_stop()
        self.finish("deadline", None, 124, deadline_message(self.deadline, why))
        return True

    def load_from_disk(self) -> None:
        """What another process of the node needs to report the end: manifest, fields, signer, log."""
        path = self.vm_dir / "manifest"
        if path.is_file():
            self.manifest = protocol.parse_manifest(path.read_text(encoding="utf-8", errors="replace"))
        self.board.load()
        self.use_identity()
        if self.manifest.signs:
            self.board.sign = self._sign
        if self.manifest.log.url:
            upload = log_upload(self.manifest.log, self.transfer)
            self.pump = LogPump(self.log_path, self.st, self.board, upload, self.cfg.log_part_max)

    def use_identity(self) -> None:
        """The node's own credentials where the manifest asks for them: its S3 signature (sigv4.py)
        or its managed identity's Blob token (blob_token.py)."""
        if self.transfer.signer is not None:
            return
        imds = self.environ.get("GPUCLOUD_IMDS_ENDPOINT", IMDS_DEFAULT)
        if self.manifest.identity == "imds":
            self.transfer.signer = Signer(ImdsCredentials(self.transfer.request, imds))
        elif self.manifest.identity == IDENTITY:
            self.transfer.signer = BlobBearer(ManagedIdentityToken(self.transfer.request, imds))

    def pump_loop(self) -> None:
        assert self.pump is not None and self.heartbeat is not None
        while not self.pump_stop.is_set():
            self.pump_tick()
            fast = self.clock.now() < self.fast_log_until  # a kept machine's next job starts (keep.py)
            self.clock.wait(self.pump_stop, FAST_LOG_S if fast else self.cfg.tick_s)

    def pump_tick(self) -> None:
        assert self.pump is not None and self.heartbeat is not None
        now = self.clock.now()
        log_s = FAST_LOG_S if now < self.fast_log_until else self.cfg.log_s
        if self.pump.step(now, self.deadline.at, log_s, self.board.push):
            self.heartbeat.sent(now)
        self.heartbeat.step(now)

    def stop_pump(self) -> None:
        self.pump_stop.set()
        t = self.threads.get("pump")
        if t is not None and t is not threading.current_thread():
            t.join(STOP_PUMP_S)
            if t.is_alive():
                self.transfer.kill_all()
                t.join(STOP_PUMP_S)

    def guard_loop(self) -> None:
        assert self.guard is not None
        while not self.guard_stop.is_set():
            if self.gate.taken():
                return
            self.guard.step(self.clock.now(), self.preempted)
            self.clock.wait(self.guard_stop, self.cfg.tick_s)

    def stop_guard(self) -> None:
        self.guard_stop.set()
        t = self.threads.get("guard")
        if t is not None and t is not threading.current_thread():
            t.join()

    def preempted(self, why: str) -> None:
        if not self.gate.take("guard"):
            raise StandDown()
        self.log(f"preemption notice: {why}; the job gets SIGTERM and {self.cfg.preempt_grace}s")
        self.preempted_file.parent.mkdir(parents=True, exist_ok=True)
        self.preempted_file.write_text("GPUCLOUD_PREEMPTED=1\n")
        self.runner.kill(self.cfg.preempt_grace)
        if self.checkpoints is not None:
            self.checkpoints.upload("notice")
        self.finish("preempted", None, 143, f"preempted: {why}")
        raise StandDown()

    # ---- the end ------------------------------------------------------------------------------------
    # ---- stages --------------------------------------------------------------------------------------
    def collect_artifacts(self) -> bool:
        digest, problem = artifacts.collect(
            self.job_dir,
            self.cfg.artifacts,
            self.vm_dir,
            lambda p: self.transfer.put_file(self.manifest.url("artifacts_put"), p, max_time=1800, hard=True),
            self.log,
        )
        self.board.set(artifacts_sha256=digest)
        if problem:
            self.board.set(art_failed=problem)
            return False
        return True

    def start(self) -> None:
        """Up to the pump: work folder, deadline, watchdog, manifest, claim, preflight."""
        t0 = self.clock.now()
        self.make_dirs()
        if self.resumed:
            loaded = Deadline.load(self.st)
            if loaded is not None:
                self.deadline = loaded
            self.board.load()
            try:
                t0 = float((self.st / "t0").read_text())
            except (OSError, ValueError):
                pass
        else:
            self.deadline.at = int(t0) + self.cfg.max_duration
            self.deadline.save()
            write_atomic(self.st / "t0", str(int(t0)).encode())
            self.board.save()
        self.start_watchdog()
        self.resolve_rank()
        self.manifest = self.fetch_manifest(self.manifest_url)
        self.use_identity()
        self.board.sign = self._sign if self.manifest.signs else None
        if self.manifest.signs and not self.key.reuse():
            try:
                self.key.done_path.unlink()
            except OSError:
                pass
            upload = log_upload(self.manifest.log, self.transfer)
            threading.Thread(
                target=self.key.claim,
                args=(upload, self.manifest.url("claim_append"), self.transfer),
                daemon=True,
                name="claim",
            ).start()
        self.deadline.lower(self.manifest.deadline)
        if not self.resumed and self.hooks.reboot_safe:
            shim = self.environ.get("GPUCLOUD_SHIM", "")
            if not shim or not self.hooks.boot_unit(self.vm_dir, Path(shim), self.cfg.run_id):
                self.log(
                    "WARNING: no boot unit: a reboot would end this run unreported "
                    "(the deadline still ends the machine)"
                )
        self.stage("preflight", t0)
        if self.bad_dir:
            self.fail(f"preflight: cannot create the work folder {self.bad_dir} (read-only or full disk?)")
        for tool in ("curl", "bash"):
            if shutil.which(tool, path=self.environ.get("PATH")) is None:
                self.fail(f"preflight: {tool} is missing")
        if not self.manifest.url("status_put"):
            self.fail("preflight: the manifest has no status_put")
        upload = log_upload(self.manifest.log, self.transfer)
        self.pump = LogPump(self.log_path, self.st, self.board, upload, self.cfg.log_part_max)
        self.heartbeat = Heartbeat(self.board, self.vm_dir, self.cfg.heartbeat_s, self.log)
        self._thread("pump", self.pump_loop)

    def main(self) -> int:
        """The stages in order; returns the script's exit code (the caller terminates with it)."""
        self.start()
        if self.back_kept:  # rebooted while kept: no job to run, it waits again (keep.py)
            return self.rejoin_keep()
        self.stage("watchdog")
        self.start_guard()
        self.log(f"deadline {self.deadline.iso()}; backstop {self.cfg.grace}s after max_duration")
        self.stack_stages()
        self.fetch_code()
        self.open_secrets()
        self.container_pull()
        self.board.set(state="running")
        if self.cfg.setup:
            self.stage("setup")
            rc = self.run_step(self.cfg.setup, "setup")
            if rc != 0:
                self.job_stopping()
                self.board.end_stage("setup", False)
                return self.job_ended("failed", rc, f"setup exited with code {rc}")
        if self.cfg.num_nodes > 1:
            self.barrier_stage()
        self.stage("run")
        self.gpu_watch = self.start_gpu_watch()
        rc = self.run_step(self.cfg.run, "run")
        self.job_stopping()
        if not self.cfg.keep_s:  # a kept machine still heeds a preemption notice
            self.stop_guard()
        self.board.end_stage("run", rc == 0)
        return self.after_run(rc)

    def start_guard(self) -> None:
        """The checkpoint keeper (when the job asked for one) and the preemption-notice guard's thread."""
        if self.cfg.checkpoint:
            self.checkpoints = Checkpoints(
                self.job_dir / self.cfg.checkpoint,
                self.vm_dir,
                self.st,
                self.manifest,
                self.transfer,
                self.rank,
                self.log,
            )
        self.guard = Guard(
            self.manifest.url("notice_get"),
            self.transfer,
            self.hooks,
            self.checkpoints,
            self.cfg.notice_s,
            self.cfg.checkpoint_interval,
            self.clock.now(),
        )
        self._thread("guard", self.guard_loop)

    def barrier_stage(self) -> None:
        """Every node waits for the others' signed ready records; learns the nodes' addresses."""
        self.stage("barrier")
        barrier = Barrier(
            self.manifest,
            self.transfer,
            self.vm_dir,
            self.rank,
            self.cfg.num_nodes,
            self.cfg.barrier_s,
            self.clock.now,
            self.clock.sleep,
            self.cfg.tick_s,
            self.log,
            self.gate.taken,
            ReadyKeys(self.cfg.run_id, self.key.public, self._sign, verify),
        )
        try:
            self.node_ips = barrier.wait(node_ip(self.environ, self.cfg.node_ips_known))
        except StageFailed as exc:
            self.gate_check()
            self.fail(str(exc))

    def after_run(self, rc: int) -> int:
        """The last checkpoint, outputs and artifacts are kept whatever the job's code; then the verdict."""
        if self.checkpoints is not None:
            self.checkpoints.upload("end")
        self.push_outputs()
        if self.cfg.artifacts:
            self.stage_always("artifacts")
            if not self.collect_artifacts():
                self.log("artifact upload failed")
                self.board.end_stage("artifacts", False)
        if rc == 0:
            return self.job_ended("succeeded", 0, "")
        return self.job_ended("failed", rc, f"job exited with code {rc}")

    def stack_stages(self) -> None:
        """stack (install what is missing) and gpu_verify (the GPUs the catalog promised are seen)."""
        self.stage("stack")
        try:
            stack.run(self.cfg.stack, replace(self.stage_env(), system_umask=True))
        except StageFailed:
            tail = stack.stack_log_tail(self.stage_env())
            if tail:
                with open(self.log_path, "a", encoding="utf-8", errors="replace") as f:
                    f.write(tail)
            self.fail(stack.stack_failed_message(self.cfg.stack))
        self.stage("gpu_verify")
        try:
            gpu_check.run(self.cfg.stack, self.stage_env())
        except StageFailed as exc:
            self.fail(str(exc))

    def stage_always(self, name: str) -> None:
        """A stage the gate's owner opens itself (after it took the gate)."""
        self.board.begin_stage(name)
        self.log(f"stage {name}")
        self.board.push()

    def fetch_code(self) -> None:
        self.stage("fetch_code")
        url = self.manifest.url("code_get")
        if url:
            archive = self.vm_dir / "code.tar.gz"
            if not self.transfer.get_file(url, archive, max_time=1800):
                self.fail("could not download the code")
            try:
                safe_untar(archive, self.job_dir, links=True)
            except Refused as exc:
                self.fail(f"could not unpack the code: {exc}")
            private_tree(self.job_dir)  # the members' modes (0644/0755) are set past the umask
        if self.checkpoints is not None:
            if not self.checkpoints.has_urls():
                self.fail("the manifest has no checkpoint URLs")
            self.checkpoints.restore()
            self.checkpoints.enabled = True


def _hard_exit(code: int) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)
