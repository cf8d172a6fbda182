"""The job's steps as the agent runs them: their environment, the sealed secrets and the `inputs`
stage, the `container_pull` stage of a job with `container:`, one step (setup, run) on the machine
or in the job's image, its output masked when the job has secrets, and the `outputs` stage. Mixed
into the Agent (agent.py), whose attributes are declared here.

Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from gpucloud.vm.agent import container, data, fabric, mounts, secret_env
from gpucloud.vm.agent.clock import Clock
from gpucloud.vm.agent.deadline import Deadline
from gpucloud.vm.agent.ending import Ending
from gpucloud.vm.agent.stage_api import StageEnv, StageFailed

SHIM_ONLY = ("GPUCLOUD_BACKSTOP_PID", "GPUCLOUD_SHIM", "PYTHONPATH")


class JobSteps(Ending):
    clock: Clock
    deadline: Deadline
    job_dir: Path
    node_ips: List[str]
    secret_values: Dict[str, str]
    data_grants: Dict[str, Any]
    pull_login: Dict[str, str]
    box: Optional[container.Container]
    outputs: Optional[data.OutputSync]

    def gate_check(self) -> None:
        raise NotImplementedError

    def stage(self, name: str, start: Optional[float] = None) -> None:
        raise NotImplementedError

    def stage_env(self) -> StageEnv:
        raise NotImplementedError

    def stage_always(self, name: str) -> None:
        raise NotImplementedError

    @property
    def preempted_file(self) -> Path:
        """The preemption marker, in a folder a step's container has mounted at the same path."""
        return self.vm_dir / container.NOTICE_DIR / "preempted"

    def node_env(self) -> Dict[str, str]:
        """What the node tells the job (GPUCLOUD_*, rank, rendezvous), then the job's own `env`."""
        env = dict(
            GPUCLOUD_RUN_ID=self.cfg.run_id,
            GPUCLOUD_NODE_RANK=str(self.rank),
            GPUCLOUD_NUM_NODES=str(self.cfg.num_nodes),
            GPUCLOUD_NUM_GPUS_PER_NODE=str(self.cfg.gpu_count),
            NODE_RANK=str(self.rank),
            GPUCLOUD_PREEMPTED_FILE=str(self.preempted_file),
        )
        if self.node_ips:
            env.update(
                GPUCLOUD_NODE_IPS="\n".join(self.node_ips),
                MASTER_ADDR=self.node_ips[0],
                MASTER_PORT=str(self.cfg.master_port),
            )
        if not self.cfg.container:  # a container gets no /dev/infiniband: libfabric's choice stays its own
            env.update(fabric.fabric_env(self.cfg.num_nodes))  # EFA: libfabric's provider (fabric.py)
        if self.cfg.checkpoint:
            env["GPUCLOUD_CHECKPOINT_DIR"] = str(self.job_dir / self.cfg.checkpoint)
        env.update(self.cfg.env)
        return env

    def job_env(self) -> Dict[str, str]:
        """A step's environment: the machine's (PATH, HOME ...), then the node's and the job's."""
        env = {k: v for k, v in self.environ.items() if k not in SHIM_ONLY}
        env.update(self.node_env())
        return env

    def container_pull(self) -> None:
        """The job's image, ready before setup: engine, login, pull (retried), the image's shell."""
        if not self.cfg.container:
            return
        self.stage("container_pull")
        box = container.Container(self.cfg.container, self.vm_dir, self.job_dir, self.cfg.run_id, self.rank)
        try:
            box.prepare(
                self.stage_env(),
                self.pull_login_of(),
                self.cfg.gpu_count > 0,
                lambda: self.deadline.remaining(self.clock.now()),
            )
            box.add_mounts(container.data_mounts(self.data_grants))
        except container.ImageUnavailable as exc:  # its own exit code: not a bug, not the job's
            self.gate_check()
            self.fail(str(exc), container.IMAGE_EXIT)
        except StageFailed as exc:
            self.gate_check()
            self.fail(str(exc))
        if self.cfg.container.get("pull_only"):  # the image builder: the pulled image is what it keeps
            return
        self.box = box

    def pull_login_of(self) -> Dict[str, str]:
        """The sealed pull login; from `container.login` and its secret when the CLI sent none."""
        if self.pull_login:
            return self.pull_login
        login = self.cfg.container.get("login") or {}
        secret = str(login.get("password_secret") or "")
        if not login or secret not in self.secret_values:
            return {}
        return {"server": login["registry"], "username": login["username"], "password": self.secret_values[secret]}

    def run_step(self, command: str, step: str = "run") -> int:
        self.gate_check()
        env = {**self.job_env(), **self.secret_values}
        where = None
        if self.box is not None:
            names = container.env_names(self.node_env(), self.secret_values, self.environ)
            command, name = self.box.step(command, step, names, self.cfg.gpu_count > 0)
            where = (self.box.engine, name)
        if self.cfg.secrets:
            command = secret_env.masked_command(command, sorted(self.secret_values))
        return self.runner.run(command, env, where)

    def open_secrets(self) -> None:
        """The job's secrets and data grants, sealed to this node's key by the CLI (secret_env.py);
        in memory only. Then the inputs are mounted (mounts.py) and copied (data.py), before setup."""
        if not (self.cfg.secrets or self.cfg.data or self.cfg.container.get("sealed_login")):
            return
        self.clock.wait(self.key.done, 60.0)
        try:
            sealed_doc = secret_env.fetch(
                self.manifest.url("secrets_get"),
                self.cfg.secrets,
                run_id=self.cfg.run_id,
                rank=self.rank,
                get=lambda url: self.transfer.get(url, max_time=30, limit=secret_env.sealed.SEALED_MAX),
                key_pem=lambda: self.key.key_path.read_text() if self.key.key_path.is_file() else None,
                passed=lambda: self.deadline.passed(self.clock.now()),
                sleep=self.clock.sleep,
                stopping=self.gate.taken,
                log=self.log,
            )
        except StageFailed as exc:
            self.gate_check()
            self.fail(str(exc))
        self.secret_values, self.data_grants = sealed_doc["env"], sealed_doc["data"]
        self.pull_login = sealed_doc.get("registry") or {}
        if self.secret_values:
            self.log(f"secrets: {', '.join(sorted(self.secret_values))} (masked in this log)")
        self.outputs = data.OutputSync(self.data_grants, self.job_dir, self.transfer, self.log)
        self.outputs.start(self.cfg.outputs_interval)
        if self.data_grants.get("inputs"):
            self.stage("inputs")
            try:
                mounts.mount_inputs(
                    self.data_grants, self.job_dir, self.vm_dir, self.environ, self.log, self.clock.sleep
                )
                data.fetch_inputs(self.data_grants, self.job_dir, self.transfer, self.log, self.report_inputs)
            except StageFailed as exc:
                self.gate_check()
                self.fail(str(exc))

    def report_inputs(self, progress: Dict[str, int]) -> None:
        """The copy's progress in the status document (`status` shows it beside the timeline); pushed
        at most every few seconds by the pump, at once for the last file."""
        self.board.set(inputs=progress)
        if progress.get("files") == progress.get("of"):
            self.board.push()

    def push_outputs(self) -> None:
        """outputs: straight from this node to their bucket prefixes, after the run."""
        if self.outputs is None or not self.data_grants.get("outputs"):
            return
        self.stage_always("outputs")
        if not self.outputs.final():
            self.log("some outputs were not uploaded")
            self.board.end_stage("outputs", False)
