"""The slurm provider end to end, through the CLI, against a real Slurm 22.05 cluster on 127.0.0.1
(tests/support/slurm_cluster.py: munged, slurmctld, two slurmd with two dummy K80 GPUs each),
reached through a real OpenSSH login node (tests/support/sshd.py): plan on the K80 partition
(Kepler stack, partitions excluded with their reasons), the quickstart, exit codes, max_duration
-> Slurm TIMEOUT -> 124, Ctrl-C -> scancel -> 130, a two-node rendezvous, a pending job's reason
in `status`, and a preempted, requeued job that resumes from its checkpoint."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support.cli import cli
from tests.support.slurm_cluster import (
    SlurmCluster,
    have_slurm,
    missing,
    queue_empty_after,  # noqa: F401  (autouse: the queue is empty after each test)
)
from tests.support.slurm_runs import cli_env, cluster, job, login  # noqa: F401  (fixtures)
from tests.support.sshd import SshdServer, SshLab, have_sshd
from tests.support.text import flat

pytestmark = [
    pytest.mark.skipif(not have_sshd(), reason="needs /usr/sbin/sshd and ssh (openssh-server)"),
    pytest.mark.skipif(
        not have_slurm(), reason=f"needs Slurm and munge (apt-get install slurm-wlm munge): {missing()}"
    ),
]


OLD_RUN = "old-20200101-000000-beef"  # a run id as gpucloud makes them


def wait_for(predicate: Callable[[], object], timeout: float = 60.0, step: float = 0.3) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return False


def run_dirs(server: SshdServer) -> list[Path]:
    work = server.remote_root / "work"
    return list(work.iterdir()) if work.is_dir() else []


def test_plan_on_a_k80_partition_resolves_kepler(cli_env: dict[str, str], tmp_path: Path) -> None:
    spec = job(tmp_path, "k80plan", "max_duration: 30m\nrun: nvidia-smi\n", "gpu: K80:2, account: chem")
    res = cli("plan", str(spec), "--json", cwd=tmp_path, env=cli_env, timeout=240)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    stack = doc["stack"]
    assert (stack["driver"], stack["cuda"]) == ("470", "11.4")
    cands = doc["candidates"]
    assert [c["region"] for c in cands] == ["hpc-login/k80", "hpc-login/urgent"], cands
    assert cands[0]["instance_type"] == "gpu:k80:2" and cands[0]["gpu"] == "K80"
    warnings = flat(" ".join(doc["warnings"]))
    assert "partition short excluded: its time limit (1 min) is below max_duration (30 min)" in warnings
    assert "partition physics excluded: not allowed for account chem" in warnings
    assert "driver is the site's" in warnings
    assert "at most 1 GPU-hour(s) (2 x 1 node(s) for max_duration)" in warnings
    # A chargeback rate makes the GPU-hours cost money: $0.50 x 2 GPUs per node-hour.
    priced = cli(
        "plan", str(spec), "--json", cwd=tmp_path, env={**cli_env, "GPUCLOUD_SLURM_GPU_HOUR_RATE": "0.5"}, timeout=240
    )
    first = json.loads(priced.stdout)["candidates"][0]
    assert (first["price_per_hour"], first["estimated_cost"]) == (1.0, 0.5)
    # A GPU the cluster has no GRES for: every partition is named with what it has.
    none = cli("plan", str(job(tmp_path, "t4", "run: x\n", "gpu: T4:1")), cwd=tmp_path, env=cli_env, timeout=240)
    assert none.returncode == 2 and "no gpu:t4 GRES (gpu:k80)" in flat(none.stderr), none.stderr
    # An unknown partition is named with the cluster's own.
    bad = cli(
        "plan",
        str(job(tmp_path, "nop", "run: x\n", "gpu: K80:1, partition: a100")),
        cwd=tmp_path,
        env=cli_env,
        timeout=240,
    )
    assert bad.returncode == 2 and "has no partition a100" in flat(bad.stderr), bad.stderr


def test_job_file_fields_are_checked_with_their_line(cli_env: dict[str, str], tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\nresources:\n  cloud: slurm\n  cluster: hpc-login\n  qos: 'high prio'\nrun: x\n")
    res = cli("validate", str(spec), cwd=tmp_path, env=cli_env, timeout=240)
    assert res.returncode == 2 and f"{spec}:5: resources.qos: 'high prio' is not valid" in flat(res.stderr)
    spec.write_text("name: bad\nresources:\n  cloud: local\n  partition: k80\nrun: x\n")
    res = cli("validate", str(spec), cwd=tmp_path, env=cli_env, timeout=240)
    assert res.returncode == 2 and "resources.partition: is only used with cloud: slurm" in flat(res.stderr)


def test_quickstart(
    cluster: SlurmCluster, login: tuple[SshLab, SshdServer], cli_env: dict[str, str], tmp_path: Path
) -> None:
    _, server = login
    before = server.accepted()
    spec = job(
        tmp_path,
        "quick",
        'run: echo "hello rank=$GPUCLOUD_NODE_RANK gpus=$CUDA_VISIBLE_DEVICES job=$SLURM_JOB_ID"; '
        "mkdir -p out && echo 42 > out/answer.txt\nartifacts: [out]\n",
    )
    res = cli("run", str(spec), "--json", cwd=tmp_path, env=cli_env, timeout=240)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["status"] == "succeeded"
    found = re.search(r"hello rank=0 gpus=(\S+) job=(\d+)", res.stderr)
    assert found and found.group(1) == "0", res.stderr  # CUDA_VISIBLE_DEVICES is Slurm's GRES binding
    assert (Path(doc["artifacts_dir"]) / "out" / "answer.txt").read_text() == "42\n"
    # The job id is in the run handle (attempts table), and Slurm ran it to completion.
    status = json.loads(cli("status", doc["run_id"], "--json", cwd=tmp_path, env=cli_env, timeout=240).stdout)
    handle_ids = [a for a in status["attempts"] if a["launched"]]
    assert handle_ids and status["resources"][-1]["cloud_id"] == found.group(2)
    assert "JobState=COMPLETED" in cluster.scontrol("show", "job", found.group(2)).stdout
    assert server.accepted() - before == 1, "plan, submit, follow and teardown share one ssh connection"
    assert not run_dirs(server), "teardown removes the run's folder on the cluster"


def test_the_example_runs_on_the_cluster(cli_env: dict[str, str], tmp_path: Path) -> None:
    """examples/slurm/k80-slurm.yaml names the login node `hpc-login`, the alias of the test's."""
    res = cli(
        "run", str(REPO / "examples" / "slurm" / "k80-slurm.yaml"), "--json", cwd=tmp_path, env=cli_env, timeout=240
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["status"] == "succeeded" and (Path(doc["artifacts_dir"]) / "metrics.json").is_file()


def test_gc_cancels_expired_jobs_by_their_tag(cluster: SlurmCluster, cli_env: dict[str, str], tmp_path: Path) -> None:
    res = cli("run", str(job(tmp_path, "first", "run: echo one\n")), cwd=tmp_path, env=cli_env, timeout=240)
    assert res.returncode == 0, res.stderr  # a recorded run on the cluster: gc visits it
    tag = f"gpucloud-run={OLD_RUN},gpucloud-expires=2020-01-01T00:00:00Z"
    stale = cluster.cmd(["sbatch", "--parsable", f"--comment={tag}", "-p", "k80", "--wrap", "sleep 300"])
    fresh = cluster.cmd(["sbatch", "--parsable", "-p", "k80", "--wrap", "sleep 300"])  # not gpucloud's
    dry = cli("gc", "--dry-run", "--cloud", "slurm", cwd=tmp_path, env=cli_env, timeout=240)
    assert f"job {stale.stdout.strip()} of run {OLD_RUN} past its expiry (would cancel)" in flat(
        dry.stdout + dry.stderr
    )
    assert len(cluster.squeue()) == 2
    done = cli("gc", "--yes", "--cloud", "slurm", cwd=tmp_path, env=cli_env, timeout=240)
    assert done.returncode == 0, done.stderr
    assert wait_for(lambda: [line.split()[0] for line in cluster.squeue()] == [fresh.stdout.strip()], 30)
    cluster.cmd(["scancel", fresh.stdout.strip()])
    assert wait_for(lambda: not cluster.squeue(), 30)


STRANGER = "gcstranger"  # a second Unix user on the cluster


@pytest.fixture
def stranger(cluster: SlurmCluster) -> Iterator[Callable[[str], str]]:
    """A second Unix user who submits jobs to the same cluster: `submit(comment)` -> job id. The
    cluster's folder is opened (o+x) down to slurm.conf and munge's socket for them, as a site's are."""
    if subprocess.run(["id", STRANGER], capture_output=True, check=False).returncode != 0:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", STRANGER], check=True)
    opened = []
    readable = [(p, 0o001) for p in (cluster.folder, *cluster.folder.parents, cluster.socket.parent)]
    for path, bits in [*readable, (cluster.conf, 0o004), (cluster.folder / "gres.conf", 0o004)]:
        mode = path.stat().st_mode
        if mode & bits != bits:
            opened.append((path, mode))
            path.chmod(mode | bits)
    jobs: list[str] = []

    def submit(comment: str) -> str:
        argv = ["sbatch", "--parsable", f"--comment={comment}", "-p", "k80", "--chdir=/tmp", "--output=/dev/null"]
        res = cluster.cmd(
            ["runuser", "-u", STRANGER, "--", "env", f"SLURM_CONF={cluster.conf}", *argv, "--wrap", "sleep 300"]
        )
        assert res.returncode == 0, res.stderr
        jobs.append(res.stdout.strip())
        return jobs[-1]

    yield submit
    if jobs:
        cluster.cmd(["scancel", *jobs])
        wait_for(lambda: not any(line.split()[0] in jobs for line in cluster.squeue()), 30)
    for path, mode in opened:
        path.chmod(mode)


def test_gc_touches_only_the_callers_own_jobs(
    cluster: SlurmCluster,
    login: tuple[SshLab, SshdServer],
    stranger: Callable[[str], str],
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """Another user's jobs on a shared cluster, with comments that name a gpucloud run (a hostile
    `../../precious`, a well-formed id): the caller's gc (root here, an admin whose squeue and
    scancel reach everyone's jobs) cancels neither and deletes nothing of theirs or its own; its own
    malformed tag is named and left alone; its own expired job is cancelled."""
    _, server = login
    res = cli("run", str(job(tmp_path, "first", "run: echo one\n")), cwd=tmp_path, env=cli_env, timeout=240)
    assert res.returncode == 0, res.stderr  # a recorded run on the cluster: gc visits it
    precious = [server.remote_root.parent / "precious", server.remote_root / "precious"]
    for folder in precious:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "thesis.tex").write_text("years of work")
    expired = "gpucloud-expires=2020-01-01T00:00:00Z"
    hostile = stranger(f"gpucloud-run=../../precious,{expired}")
    lookalike = stranger(f"gpucloud-run={OLD_RUN},{expired}")
    odd = cluster.cmd(
        ["sbatch", "--parsable", f"--comment=gpucloud-run=../../precious,{expired}", "-p", "k80", "--wrap", "sleep 300"]
    )
    mine = cluster.cmd(
        ["sbatch", "--parsable", f"--comment=gpucloud-run={OLD_RUN},{expired}", "-p", "k80", "--wrap", "sleep 300"]
    )
    odd_id, mine_id = odd.stdout.strip(), mine.stdout.strip()
    done = cli("gc", "--yes", "--cloud", "slurm", cwd=tmp_path, env=cli_env, timeout=240)
    out = flat(done.stdout + done.stderr)
    try:
        assert done.returncode == 0, out
        assert f"job {mine_id} of run {OLD_RUN} past its expiry (cancelled)" in out
        assert f"job {odd_id}: its comment is not a gpucloud-run tag as gpucloud writes it, left alone" in out
        assert hostile not in out and lookalike not in out, "another user's jobs are not even listed"
        assert all((folder / "thesis.tex").is_file() for folder in precious)
        queue = {line.split()[0]: line.split()[1] for line in cluster.squeue()}
        assert mine_id not in queue and {hostile, lookalike, odd_id} <= set(queue), queue
        assert queue[hostile] in ("PENDING", "RUNNING") and queue[lookalike] in ("PENDING", "RUNNING")
    finally:
        cluster.cmd(["scancel", odd_id, mine_id])
        wait_for(lambda: not any(line.split()[0] in (odd_id, mine_id) for line in cluster.squeue()), 30)


def test_slurm_run_files_are_private(
    cluster: SlurmCluster, login: tuple[SshLab, SshdServer], cli_env: dict[str, str], tmp_path: Path
) -> None:
    """The run's folders on the cluster (batch script, node wrapper, shims, the node's folder and
    console, the channel's objects, Slurm's own output file) are the user's alone: 0700 folders,
    no group/other bits on what the provider, its channel and Slurm wrote."""
    _, server = login
    res = cli(
        "run",
        str(job(tmp_path, "private", "run: echo up; sleep 300\n")),
        "--detach",
        "--json",
        cwd=tmp_path,
        env=cli_env,
        timeout=240,
    )
    assert res.returncode == 0, res.stderr
    run_id = json.loads(res.stdout)["run_id"]
    work, chan = server.remote_root / "work" / run_id, server.remote_root / "channel" / "runs" / run_id
    try:
        assert wait_for(lambda: (chan / "node-0" / "status.json").is_file(), 60)
        found = [p for top in (work, chan) for p in [top, *top.rglob("*")] if not p.is_symlink()]
        assert (work / "job.sbatch") in found and (work / "node.sh") in found and (work / "node-0") in found
        assert any(p.name.startswith("slurm-") and p.name.endswith(".out") for p in found)
        theirs = [work / "node-0" / "agent", work / "node-0" / "job"]  # the agent's own extractions
        loose = [
            f"{oct(p.stat().st_mode & 0o777)} {p}"
            for p in found
            if p.stat().st_mode & 0o077 and (p.is_dir() or not any(t in p.parents for t in theirs))
        ]
        assert not loose, "\n".join(loose)
        assert server.remote_root.stat().st_mode & 0o077 == 0
    finally:
        assert cli("down", run_id, "--yes", cwd=tmp_path, env=cli_env, timeout=240).returncode == 0
        assert wait_for(lambda: not cluster.squeue(), 30)


def test_cluster_local_on_a_submit_host(cluster: SlurmCluster, gpucloud_home: Path, tmp_path: Path) -> None:
    """`cluster: local`: the Slurm commands and the channel are on this machine (no ssh)."""
    env = {**os.environ, **cluster.env(), "GPUCLOUD_HOME": str(gpucloud_home), "CI": "true"}
    env.update(PYTHONPATH=str(REPO), GPUCLOUD_REMOTE_ROOT=str(tmp_path / "remote"))
    spec = tmp_path / "here.yaml"
    spec.write_text(
        "name: here\nresources: {cloud: slurm, cluster: local, gpu: K80:2}\nmax_duration: 10m\n"
        'run: echo "on $SLURM_JOB_PARTITION with $CUDA_VISIBLE_DEVICES"\n'
    )
    res = cli("run", str(spec), cwd=tmp_path, env=env, timeout=240)
    assert res.returncode == 0, res.stderr
    assert "on k80 with 0,1" in res.stdout + res.stderr  # the default partition, both GPUs of a node
    assert not list((tmp_path / "remote" / "work").iterdir())


def test_the_sites_driver_is_checked_never_installed(cli_env: dict[str, str], tmp_path: Path) -> None:
    res = cli("run", str(job(tmp_path, "drv", "run: echo ok\n")), cwd=tmp_path, env=cli_env, timeout=240)
    assert res.returncode == 0, res.stderr
    assert "node n1: the site's driver 470.256.02 (the stack needs R470" in flat(res.stdout)
    spec = tmp_path / "old.yaml"
    spec.write_text(job(tmp_path, "old", "run: echo ok\n").read_text().replace("hpc-login", "old-login"))
    res = cli("run", str(spec), cwd=tmp_path, env=cli_env, timeout=240)
    assert res.returncode == 0, res.stderr
    assert "WARNING: node n1: the site's driver 460.32.03 is older than R470" in flat(res.stdout)


def test_failing_job_exit_code(cli_env: dict[str, str], tmp_path: Path) -> None:
    res = cli("run", str(job(tmp_path, "three", "run: echo bye; exit 3\n")), cwd=tmp_path, env=cli_env, timeout=240)
    assert res.returncode == 3, res.stderr
    assert "job exited with code 3" in flat(res.stdout + res.stderr)


def test_max_duration_is_slurms_time_limit(cluster: SlurmCluster, cli_env: dict[str, str], tmp_path: Path) -> None:
    """--time is max_duration in whole minutes (here 1); Slurm's TIMEOUT comes before the node's own
    deadline (115 s) and is the run's deadline: exit 124."""
    spec = job(tmp_path, "slow", "max_duration: 115s\nrun: echo started; sleep 300\n")
    res = cli("run", str(spec), cwd=tmp_path, timeout=300, env=cli_env)
    assert res.returncode == 124, res.stderr
    assert "TIMEOUT" in flat(res.stdout + res.stderr), res.stderr


def test_ctrl_c_cancels_the_job(
    cluster: SlurmCluster, login: tuple[SshLab, SshdServer], cli_env: dict[str, str], tmp_path: Path
) -> None:
    _, server = login
    spec = job(tmp_path, "stopme", "run: echo started; sleep 300\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpucloud", "run", str(spec)],
        env=cli_env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert wait_for(lambda: any(any(d.rglob("job.pgid")) for d in run_dirs(server)), 90)
    assert cluster.squeue(), "the job runs in Slurm"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert not cluster.squeue(), "scancel: nothing left in squeue"
    assert not run_dirs(server)


RENDEZVOUS = r"""python3 - <<'EOF'
import os, socket, time
rank, addr, port = int(os.environ["NODE_RANK"]), os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if rank == 0:
    srv = socket.create_server(("0.0.0.0", port))
    conn, _ = srv.accept()
    print("rank 0 got", conn.recv(100).decode(), "from", os.environ["SLURM_JOB_NODELIST"], flush=True)
else:
    for _ in range(100):
        try:
            socket.create_connection((addr, port), timeout=2).sendall(b"hello-from-rank-1")
            break
        except OSError:
            time.sleep(0.2)
    print("rank 1 sent to", addr, flush=True)
EOF
"""


def test_two_nodes_rendezvous(cli_env: dict[str, str], tmp_path: Path) -> None:
    body = "num_nodes: 2\nrun: |\n" + "".join(f"  {line}\n" for line in RENDEZVOUS.splitlines())
    res = cli("run", str(job(tmp_path, "pair", body)), cwd=tmp_path, env=cli_env, timeout=240)
    assert res.returncode == 0, res.stderr
    out = res.stdout + res.stderr
    assert "[node 0] rank 0 got hello-from-rank-1 from n[1-2]" in out  # one task on each of the two nodes
    assert "[node 1] rank 1 sent to 127.0.0.1" in out  # rank 0's NodeAddr, as Slurm knows it


def test_pending_job_shows_its_reason(cluster: SlurmCluster, cli_env: dict[str, str], tmp_path: Path) -> None:
    blocker = cluster.cmd(["sbatch", "--parsable", "-N2", "--gres=gpu:k80:2", "-p", "k80", "--wrap", "sleep 300"])
    blocker_id = blocker.stdout.strip()
    assert wait_for(lambda: f"{blocker_id} RUNNING" in cluster.squeue(), 30)
    res = cli(
        "run",
        str(job(tmp_path, "waiter", "run: echo ran\n")),
        "--detach",
        "--json",
        cwd=tmp_path,
        env=cli_env,
        timeout=240,
    )
    assert res.returncode == 0, res.stderr
    run_id = json.loads(res.stdout)["run_id"]

    def phase() -> str:
        out = cli("status", run_id, "--json", cwd=tmp_path, env=cli_env, timeout=240)
        return str(json.loads(out.stdout).get("phase"))

    assert wait_for(lambda: "Resources" in phase(), 30), phase()
    shown = flat(cli("status", run_id, cwd=tmp_path, env=cli_env, timeout=240).stdout)
    assert "queued in Slurm as job" in shown and "PENDING (Resources)" in shown and "1st in partition k80" in shown
    cluster.cmd(["scancel", blocker_id])
    down = cli("down", run_id, "--yes", cwd=tmp_path, env=cli_env, timeout=240)
    assert down.returncode == 0, down.stderr
    assert wait_for(lambda: not cluster.squeue(), 30)


RESUMABLE = r"""d=$GPUCLOUD_CHECKPOINT_DIR; n=$(cat "$d/step" 2>/dev/null || echo 0)
echo "start at step $n (restart ${SLURM_RESTART_COUNT:-0}) token $(printf %s "$RESUME_TOKEN" | sha256sum | cut -c1-16)"
while [ "$n" -lt 14 ]; do n=$((n + 1)); echo "$n" >"$d/step"; echo "step $n"; sleep 1; done
"""


def test_preempted_job_is_requeued_and_resumes(
    cluster: SlurmCluster, login: tuple[SshLab, SshdServer], cli_env: dict[str, str], tmp_path: Path
) -> None:
    """With a secret: the requeued start claims a new node key, and the CLI seals the secret again."""
    _, server = login
    body = "secrets: [RESUME_TOKEN]\ncheckpoint: ckpt\ncheckpoint_interval: 1s\nrun: |\n"
    body += "".join(f"  {x}\n" for x in RESUMABLE.splitlines())
    spec = job(tmp_path, "resume", body, "gpu: K80:2, partition: k80")
    token = "requeue-" + os.urandom(8).hex()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpucloud", "run", str(spec)],
        env={**cli_env, "RESUME_TOKEN": token},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    slot = server.remote_root / "channel" / "runs"
    assert wait_for(lambda: any(slot.rglob("slot-*.sum")) and _step(server) >= 4, 90), _step(server)
    job_id = cluster.squeue()[0].split()[0]
    urgent = cluster.cmd(["sbatch", "--parsable", "-N2", "--gres=gpu:k80:2", "-p", "urgent", "--wrap", "sleep 2"])
    assert urgent.returncode == 0, urgent.stderr
    assert wait_for(lambda: "Restarts=1" in cluster.scontrol("show", "job", job_id).stdout, 60)
    # Slurm holds a requeued job for two minutes (its begin time); once the urgent job is done, the
    # test lets it start now.
    assert wait_for(lambda: "JobState=COMPLETED" in cluster.scontrol("show", "job", urgent.stdout.strip()).stdout, 60)

    def started() -> bool:
        cluster.scontrol("update", f"job={job_id}", "StartTime=now")
        return "JobState=RUNNING" in cluster.scontrol("show", "job", job_id).stdout

    assert wait_for(started, 60, step=2), cluster.scontrol("show", "job", job_id).stdout
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    digest = hashlib.sha256(token.encode()).hexdigest()[:16]
    assert f"start at step 0 (restart 0) token {digest}" in out  # one log across both starts
    resumed = [int(m) for m in re.findall(rf"start at step (\d+) \(restart 1\) token {digest}", out)]
    assert resumed and resumed[0] >= 3, out
    assert re.search(r"checkpoint \d+ restored", out), out


def _step(server: SshdServer) -> int:
    for path in (server.remote_root / "work").rglob("ckpt/step"):
        try:
            return int(path.read_text().strip() or 0)
        except (OSError, ValueError):
            continue
    return 0
