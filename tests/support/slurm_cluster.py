"""A real Slurm cluster on 127.0.0.1 for the slurm provider's tests (docs/SLURM.md, "Tests").

`SlurmCluster` starts munged, slurmctld and one or two slurmd (Debian's slurm-wlm, Slurm 22.05) in
a temp folder, each on its own free port, and stops them. What makes that work as root on one
machine without systemd or cgroups: munge with its own key and socket (slurm.conf `AuthInfo`
names the socket), `ProctrackType=proctrack/linuxproc`, `TaskPlugin=task/none`, several slurmd
on one host told apart with `slurmd -N NAME` (each node has its own `Port=`), and a `gpu` GRES
typed `k80` whose `File=` points at dummy device files the fixture makes: a count-only gpu GRES
registers as 0 on the node and drains it.

Two partitions share the nodes: `k80` (the default) and `urgent`, a higher priority tier whose
jobs preempt `k80` jobs by requeueing them (`PreemptType=preempt/partition_prio`,
`PreemptMode=REQUEUE`), which the requeue test uses; `short` (a one-minute MaxTime) and `physics`
(AllowAccounts=physics) are there for `plan` to exclude with their reasons. Client commands find the cluster through
`SLURM_CONF` (`env()`), which the login node's sshd passes on with SetEnv.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import stop_process
from tests.support.sshd import free_port

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "scancel")
GPUS_PER_NODE = 2


def have_slurm() -> bool:
    """Every binary the fixture starts or the provider calls is on PATH (`.ci/run` installs them)."""
    return all(shutil.which(b) for b in BINARIES)


def missing() -> str:
    return ", ".join(b for b in BINARIES if not shutil.which(b))


class SlurmCluster:
    """munged + slurmctld + `nodes` slurmd; `partition_time` is the default partition's MaxTime.

    The variant a site with cgroups enforces: `gres_type` as `AutoDetect=nvml` names GPUs (e.g.
    `nvidia_a100_80gb_pcie`, in a default partition named `partition`), `memory_mb` per node, and
    `enforced`: tasks bound to the CPUs they were given (`TaskPlugin=task/affinity`, so `nproc` in
    a task is its allocation) and memory a consumable resource (`CR_Core_Memory`)."""

    def __init__(
        self,
        folder: Path,
        *,
        nodes: int = 2,
        partition_time: str = "60",
        gres_type: str = "k80",
        partition: str = "k80",
        memory_mb: int = 1000,
        enforced: bool = False,
    ) -> None:
        self.folder = folder
        self.nodes = [f"n{i + 1}" for i in range(nodes)]
        self.gres_type, self.partition, self.memory_mb, self.enforced = gres_type, partition, memory_mb, enforced
        self.procs: list[subprocess.Popen] = []
        folder.mkdir(parents=True, exist_ok=True)
        self.conf = folder / "slurm.conf"
        self.socket = folder / "run" / "munge.socket"
        self._write(partition_time)

    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def _write(self, partition_time: str) -> None:
        f = self.folder
        for sub in ("munge", "run", "state", "spool", "log", "dev"):
            (f / sub).mkdir(exist_ok=True)
        os.chmod(f / "munge", 0o700)
        key = f / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        for i in range(GPUS_PER_NODE * len(self.nodes)):  # dummy device nodes: slurmd wants char devices
            os.mknod(f / "dev" / f"nvidia{i}", stat.S_IFCHR | 0o600, os.makedev(195, i))
        ctl_port = free_port()
        node_lines, gres_lines = [], []
        for n, name in enumerate(self.nodes):
            first = n * GPUS_PER_NODE
            devs = f"{f}/dev/nvidia[{first}-{first + GPUS_PER_NODE - 1}]"
            node_lines.append(
                f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={free_port()} CPUs=2 "
                f"RealMemory={self.memory_mb} Gres=gpu:{self.gres_type}:{GPUS_PER_NODE} State=UNKNOWN"
            )
            gres_lines.append(f"NodeName={name} Name=gpu Type={self.gres_type} File={devs}")
        nodelist = ",".join(self.nodes)
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=gctest",
                    "SlurmctldHost=localhost(127.0.0.1)",
                    f"SlurmctldPort={ctl_port}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.socket}",
                    f"StateSaveLocation={f}/state",
                    f"SlurmdSpoolDir={f}/spool/%n",
                    f"SlurmctldPidFile={f}/slurmctld.pid",
                    f"SlurmdPidFile={f}/slurmd-%n.pid",
                    f"SlurmctldLogFile={f}/log/slurmctld.log",
                    f"SlurmdLogFile={f}/log/slurmd-%n.log",
                    "ProctrackType=proctrack/linuxproc",
                    f"TaskPlugin={'task/affinity' if self.enforced else 'task/none'}",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "SelectType=select/cons_tres",
                    f"SelectTypeParameters={'CR_Core_Memory' if self.enforced else 'CR_Core'}",
                    "SchedulerType=sched/backfill",
                    "SchedulerParameters=sched_interval=2",
                    "GresTypes=gpu",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "SlurmdParameters=config_overrides",
                    "KillWait=5",
                    "MinJobAge=600",
                    "InactiveLimit=0",
                    "JobRequeue=1",
                    "PreemptType=preempt/partition_prio",
                    "PreemptMode=REQUEUE",
                    "SlurmctldDebug=info",
                    "SlurmdDebug=info",
                    *node_lines,
                    f"PartitionName={self.partition} Nodes={nodelist} Default=YES MaxTime={partition_time} State=UP "
                    "PriorityTier=1",
                    f"PartitionName=urgent Nodes={nodelist} MaxTime=60 State=UP PriorityTier=10",
                    f"PartitionName=short Nodes={nodelist} MaxTime=1 State=UP PriorityTier=1",
                    f"PartitionName=physics Nodes={nodelist} MaxTime=60 State=UP AllowAccounts=physics",
                    "",
                ]
            )
        )
        (f / "gres.conf").write_text("\n".join(gres_lines) + "\n")

    def start(self) -> SlurmCluster:
        f = self.folder
        self._spawn(
            [
                "munged",
                "-F",
                "--force",
                f"--socket={self.socket}",
                f"--key-file={f}/munge/munge.key",
                f"--pid-file={f}/munge/munged.pid",
                f"--log-file={f}/log/munged.log",
                f"--seed-file={f}/munge/munged.seed",
            ],
            "munged",
        )
        self._wait(lambda: self.socket.exists(), "munged's socket")
        self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        self._wait(lambda: self.scontrol("ping").returncode == 0, "slurmctld to answer `scontrol ping`")
        for name in self.nodes:
            (f / "spool" / name).mkdir(exist_ok=True)
            self._spawn(["slurmd", "-D", "-N", name, "-f", str(self.conf)], f"slurmd-{name}")
        self._wait(self._nodes_idle, "every node to be idle (sinfo)", timeout=60)
        return self

    def _spawn(self, argv: list[str], name: str) -> None:
        log = (self.folder / "log" / f"{name}.out").open("ab")
        env = {**os.environ, **self.env()}
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=log, env=env, start_new_session=True))

    def _wait(self, ready: object, what: str, timeout: float = 30.0) -> None:
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[0]} exited ({proc.returncode}): {self.logs()}")
            if ready():  # type: ignore[operator]
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out waiting for {what}: {self.logs()}")

    def _nodes_idle(self) -> bool:
        out = self.cmd(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout.split()
        states = dict(zip(out[::2], out[1::2], strict=False))
        return all(states.get(n) == "idle" for n in self.nodes)

    def cmd(self, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
        # cwd: sbatch writes a job's slurm-<id>.out there, inside the cluster's temp folder.
        return subprocess.run(
            argv,
            env={**os.environ, **self.env()},
            cwd=self.folder,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def scontrol(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.cmd(["scontrol", *args])

    def squeue(self) -> list[str]:
        """Jobs the controller still has queued or running (one `id state` line each)."""
        return [line for line in self.cmd(["squeue", "-h", "-o", "%i %T"]).stdout.splitlines() if line.strip()]

    def logs(self) -> str:
        out = []
        for p in sorted((self.folder / "log").glob("*")):
            try:
                out.append(f"--- {p.name}\n" + p.read_text(errors="replace")[-1500:])
            except OSError:
                continue
        return "\n".join(out)

    def stop(self) -> None:
        """Cancel what is left, then stop the daemons (slurmd first, munged last)."""
        if self.procs and self.procs[0].poll() is None:
            self.cmd(["scancel", "--full", "-u", "root"])
        for proc in reversed(self.procs):
            stop_process(proc)
        self.procs.clear()


@pytest.fixture(autouse=True)
def queue_empty_after(cluster: SlurmCluster) -> Iterator[None]:
    """After each test: the queue is empty (what a test left is cancelled, and the test fails)."""
    yield
    left = cluster.squeue()
    if left:
        cluster.cmd(["scancel", "--full", "-u", "root"])
    assert not left, f"the test left jobs in the queue: {left}"
