"""Multi-node runs (num_nodes > 1): the VM-side barrier and environment, the lifecycle's exit-code
rule and whole-run teardown, and examples/ddp-2-nodes.yaml end to end on the local provider.

Bootstrap-level tests run the rendered scripts with bash against a FileChannel, one folder per
node, as test_bootstrap.py does for one node. End-to-end tests run the CLI in a subprocess.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpucloud.channel.run_objects import FileChannel, node_prefix, pack_workdir
from gpucloud.contract.provider import DEFAULT_MASTER_PORT
from gpucloud.contract.registry import capabilities
from gpucloud.providers.local.provider import LocalProvider
from gpucloud.run.watch import outcome as _outcome
from gpucloud.vm import protocol
from gpucloud.vm.agent.barrier import node_ip
from gpucloud.vm.agent.claim import verify
from gpucloud.vm.agent.hooks import hooks_for
from gpucloud.vm.agent.transfer import Transfer
from gpucloud.vm.agent_config import job_config
from gpucloud.vm.agent_pack import agent_archive, archive_sha256
from gpucloud.vm.shim import render_shim
from tests.support.cli import cli, start_cli
from tests.support.local_runs import leftovers, run_id_of, write_job
from tests.support.render_inputs import CPU, SHELLCHECK, T4, make_candidate, make_spec
from tests.support.text import flat

REPO = Path(__file__).resolve().parents[2]

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not importable here (CI installs torch 2.13.0 CPU)")


# ---- bootstrap level ---------------------------------------------------------------------------------


@dataclass
class Cluster:
    channel: FileChannel
    run_id: str
    scripts: list[Path]
    dirs: list[Path]

    def start(self, rank: int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.dirs[rank]), "LANG": "C.UTF-8"}
        return subprocess.Popen(
            ["bash", str(self.scripts[rank])],
            cwd=self.dirs[rank],
            env={**base, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def status(self, rank: int) -> dict:
        st = self.channel.read_status(self.run_id, rank)
        assert st is not None
        return st

    def log(self, rank: int) -> str:
        return b"".join(self.channel.read_log_parts(self.run_id, rank, 0)).decode()


def make_cluster(
    tmp: Path,
    *,
    nodes: int = 2,
    run: str = "echo hi",
    setup: str | None = None,
    master_port: int = 29555,
    barrier_timeout: float = 30,
    shared: bool = False,
) -> Cluster:
    run_id = f"r{uuid.uuid4().hex[:8]}"
    channel = FileChannel(tmp / "channel")
    wd = tmp / "workdir"
    wd.mkdir(parents=True)
    (wd / "hello.txt").write_text("hi\n")
    channel.upload_code(run_id, pack_workdir(wd, dest=tmp / "code.tar.gz"))
    deadline = datetime.now(UTC) + timedelta(seconds=120)
    spec = make_spec(cloud="local", gpu=None, env={"FOO": "bar"}, run=run, setup=setup, artifacts=[], num_nodes=nodes)
    cand = make_candidate("local", "", 0, nodes)
    cfg = job_config(
        spec,
        CPU,
        cand,
        caps=capabilities("local"),
        run_id=run_id,
        node_rank=None if shared else 0,
        log_interval=0.2,
        heartbeat_interval=0.4,
        master_port=master_port,
        barrier_timeout=barrier_timeout,
    )
    archive = agent_archive(cfg.to_json())
    channel.upload_agent(run_id, archive)
    urls = channel.prepare(run_id, nodes, deadline, agent=True)
    if shared:
        urls = [channel.node_index(run_id, urls, deadline, agent=True)] * nodes
    scripts, dirs = [], []
    for rank in range(nodes):
        text = render_shim(
            caps=capabilities("local"),
            run_id=run_id,
            max_duration=int(spec.max_duration),
            agent_sha256=archive_sha256(archive),
            manifest_url=urls[rank],
            node_rank=None if shared else rank,
        )
        vm_dir = tmp / f"node-{rank}"
        vm_dir.mkdir()
        (vm_dir / "bootstrap.sh").write_text(text)
        scripts.append(vm_dir / "bootstrap.sh")
        dirs.append(vm_dir)
    return Cluster(channel, run_id, scripts, dirs)


ENV_DUMP = (
    'echo "rank=$GPUCLOUD_NODE_RANK/$NODE_RANK nodes=$GPUCLOUD_NUM_NODES gpus=$GPUCLOUD_NUM_GPUS_PER_NODE '
    'master=$MASTER_ADDR:$MASTER_PORT foo=$FOO"; echo "ips=[$GPUCLOUD_NODE_IPS]"'
)


def test_two_nodes_meet_at_the_barrier_and_get_the_environment(tmp_path: Path) -> None:
    """Node 1 starts well after node 0: node 0 waits for it; both get the peers' addresses (published
    through `ready`), in rank order, rank 0's as MASTER_ADDR, and the rendered MASTER_PORT."""
    c = make_cluster(tmp_path, run=ENV_DUMP, setup='echo "setup master=[${MASTER_ADDR:-}]"')
    p0 = c.start(0, {"GPUCLOUD_NODE_IP": "10.0.0.11"})
    time.sleep(1.5)
    p1 = c.start(1, {"GPUCLOUD_NODE_IP": "10.0.0.22"})
    for p in (p0, p1):
        _, err = p.communicate(timeout=30)
        assert p.returncode == 0, err.decode()
    for rank in (0, 1):
        st = c.status(rank)
        assert st["state"] == "succeeded" and st["rank"] == rank
        assert list(st["stages"]) == [
            "preflight",
            "watchdog",
            "stack",
            "gpu_verify",
            "fetch_code",
            "setup",
            "barrier",
            "run",
            "done",
        ]
        assert st["stages"]["barrier"]["ok"] is True
        log = c.log(rank)
        assert f"rank={rank}/{rank} nodes=2 gpus=0 master=10.0.0.11:29555 foo=bar\n" in log
        assert "ips=[10.0.0.11\n10.0.0.22]\n" in log
        assert "setup master=[]" in log  # peers are known only from the barrier on
        ready = c.channel.get_bytes(f"{node_prefix(c.run_id, rank)}/ready") or b""
        ip, pub, sig = protocol.parse_ready(ready)  # the address first, signed by the node's claimed key
        assert ip == ("10.0.0.11" if rank == 0 else "10.0.0.22")
        claims = [(n, k.strip()) for n, k in c.channel.claims(c.run_id, rank)]
        assert claims == [(protocol.fingerprint(pub), pub.encode())]
        assert verify(pub, protocol.ready_signed_bytes(c.run_id, rank, ip), sig)
    # node 0 really waited for node 1
    assert c.status(0)["stages"]["barrier"]["end"] - c.status(0)["stages"]["barrier"]["start"] >= 1


def test_one_shared_script_for_every_node(tmp_path: Path) -> None:
    """The AWS way (MinCount=MaxCount=N: every instance gets the same user-data): each node takes
    its rank from the environment (or the launch index) and its manifest from the node index."""
    c = make_cluster(tmp_path, run=ENV_DUMP, shared=True)
    assert c.scripts[0].read_text() == c.scripts[1].read_text()
    procs = [c.start(r, {"GPUCLOUD_NODE_RANK": str(r), "GPUCLOUD_NODE_IP": f"10.0.0.{r + 1}"}) for r in (1, 0)]
    for p in procs:
        _, err = p.communicate(timeout=30)
        assert p.returncode == 0, err.decode()
    for rank in (0, 1):
        assert c.status(rank)["rank"] == rank and c.status(rank)["state"] == "succeeded"
        assert f"rank={rank}/{rank} nodes=2 gpus=0 master=10.0.0.1:29555" in c.log(rank)
    # a node that cannot tell its rank stops before it touches any node's objects
    bad = c.start(0, {"GPUCLOUD_NODE_RANK": "7"})
    _, err = bad.communicate(timeout=30)
    assert bad.returncode == 1 and "cannot tell this node's rank (got '7', expected 0..1)" in err.decode()


class _FakeImds(BaseHTTPRequestHandler):
    """AWS IMDSv2: a token from PUT /latest/api/token, then the launch index with that token."""

    def do_PUT(self) -> None:
        ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self._reply(200 if ok else 400, b"tok-123")

    def do_GET(self) -> None:
        ok = (
            self.path == "/latest/meta-data/ami-launch-index"
            and self.headers.get("X-aws-ec2-metadata-token") == "tok-123"
        )
        self._reply(200 if ok else 401, b"3")

    def _reply(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_aws_shared_script_reads_the_launch_index(tmp_path: Path) -> None:
    spec = make_spec(cloud="aws", gpu="T4", count=1, num_nodes=4)
    cand = make_candidate("aws", "T4", 1, 4, instance_type="g4dn.xlarge")
    cfg = job_config(spec, T4, cand, caps=capabilities("aws"), run_id="run-1", node_rank=None)
    text = render_shim(
        caps=capabilities("aws"),
        run_id="run-1",
        max_duration=3600,
        agent_sha256="0" * 64,
        manifest_url="https://b.example/runs/run-1/nodes?sig=1",
        node_rank=None,
    )
    assert "RANK=${GPUCLOUD_NODE_RANK:-}" in text and "node any" in text and cfg.shared
    (tmp_path / "shared.sh").write_text(text)
    sc = subprocess.run([str(SHELLCHECK), "-s", "sh", str(tmp_path / "shared.sh")], capture_output=True, text=True)
    assert sc.returncode == 0, sc.stdout
    # the agent's AWS hooks ask IMDSv2 for the launch index (the node's rank)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeImds)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        hooks = hooks_for(
            cfg.self_termination,
            cfg.preemption_notice,
            Transfer(),
            {"GPUCLOUD_IMDS_ENDPOINT": f"http://127.0.0.1:{server.server_port}"},
            lambda line: None,
            lambda s: None,
        )
        assert hooks.launch_index() == 3
    finally:
        server.shutdown()


def test_barrier_timeout_fails_the_node_clearly(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, nodes=3, run="touch ran", barrier_timeout=2)
    p0 = c.start(0)
    p1 = c.start(1)
    for p in (p0, p1):
        p.communicate(timeout=30)
        assert p.returncode == 1
    for rank in (0, 1):
        st = c.status(rank)
        assert st["state"] == "error" and st["exit_code"] is None
        assert st["stage"] == "done" and st["stages"]["barrier"]["ok"] is False and "run" not in st["stages"]
        assert "barrier: node(s) 2 not ready after 2s" in st["message"]
        assert not (c.dirs[rank] / "job" / "ran").exists()


def test_a_forged_ready_is_refused_by_its_peers_and_signed_ones_meet(tmp_path: Path) -> None:
    """A reader of user-data writes node 1's `ready` through the grant before node 1 gets there: node 0
    refuses it (it is not signed by the key that claims node 1, read through the channel's own
    `claims_get` lines: node 0 lists node 1's claim files) and ends in error naming node 1, without
    running the job. With nothing forged, both nodes check each other's and run."""
    c = make_cluster(tmp_path / "forged", run="touch ran", barrier_timeout=20)
    for rank in range(2):
        manifest = (c.channel.get_bytes(f"{node_prefix(c.run_id, rank)}/manifest") or b"").decode()
        listed = protocol.parse_manifest(manifest)
        assert [listed.ranked_url("claims_get", r) for r in range(2)] == [
            c.channel.claims_url(c.run_id, r, datetime.now(UTC)) for r in range(2)
        ]
    c.channel.put_bytes(f"{node_prefix(c.run_id, 1)}/ready", b"6.6.6.6\n")
    p0 = c.start(0, {"GPUCLOUD_NODE_IP": "10.0.0.11"})
    p0.communicate(timeout=60)
    st = c.status(0)
    assert p0.returncode == 1 and st["state"] == "error" and st["stages"]["barrier"]["ok"] is False, st
    assert "node 1's address is not signed by the key in it" in st["message"]
    assert not (c.dirs[0] / "job" / "ran").exists()
    c = make_cluster(tmp_path / "signed", run="touch ran", barrier_timeout=30)
    procs = [c.start(r, {"GPUCLOUD_NODE_IP": f"10.0.0.{11 * (r + 1)}"}) for r in range(2)]
    for p in procs:
        p.communicate(timeout=60)
    for rank in range(2):
        st = c.status(rank)
        assert st["state"] == "succeeded", st
        assert "each checked against its claim" in c.log(rank)


def test_a_second_claim_on_a_peer_fails_the_barrier_closed(tmp_path: Path) -> None:
    """A reader of user-data also claims node 1 with a key of its own (through node 1's log grant)
    and signs node 1's `ready` with it: node 0 sees two keys claiming node 1 and refuses."""
    from gpucloud.vm.agent.claim import NodeKey

    c = make_cluster(tmp_path, run="touch ran", barrier_timeout=20)
    (tmp_path / "thief").mkdir()
    key = NodeKey(tmp_path / "thief", lambda line: None)
    pub = key.make()
    assert pub
    key.mark_done()
    log = c.channel.root / node_prefix(c.run_id, 1) / "log"
    (log / protocol.claim_name(pub)).write_text(pub + "\n")
    sig = key.sign(protocol.ready_signed_bytes(c.run_id, 1, "6.6.6.6"), lambda event, s: True)
    c.channel.put_bytes(f"{node_prefix(c.run_id, 1)}/ready", protocol.ready_text("6.6.6.6", pub, sig or ""))
    p1 = c.start(1, {"GPUCLOUD_NODE_IP": "10.0.0.22"})
    until = time.monotonic() + 30
    while len(c.channel.claims(c.run_id, 1)) < 2 and time.monotonic() < until:  # node 1 claimed itself too
        time.sleep(0.1)
    p0 = c.start(0, {"GPUCLOUD_NODE_IP": "10.0.0.11"})
    for p in (p0, p1):
        p.communicate(timeout=60)
    st = c.status(0)
    assert st["state"] == "error" and "node 1 is claimed by 2 keys" in st["message"], st
    assert not (c.dirs[0] / "job" / "ran").exists()


def test_single_node_skips_the_barrier_and_still_sets_the_torchrun_variables(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, nodes=1, run=ENV_DUMP, master_port=DEFAULT_MASTER_PORT)
    p = c.start(0)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err.decode()
    st = c.status(0)
    assert "barrier" not in st["stages"]
    log = c.log(0)
    assert "rank=0/0 nodes=1 gpus=0 master=127.0.0.1:29500 foo=bar\n" in log and "ips=[127.0.0.1]\n" in log
    assert c.channel.get_bytes(f"{node_prefix(c.run_id, 0)}/ready") is None


def test_render_rank_1_for_a_cloud(tmp_path: Path) -> None:
    """A cloud node publishes its primary private address (default route's source), not loopback;
    MASTER_PORT defaults to 29500 there, and the rank and node count are given per node."""
    spec = make_spec(cloud="aws", gpu="T4", count=4, num_nodes=2)
    cand = make_candidate("aws", "T4", 4, 2, instance_type="g4dn.12xlarge")
    cfg = job_config(spec, T4, cand, caps=capabilities("aws"), run_id="run-1", node_rank=1, barrier_timeout=600)
    text = render_shim(
        caps=capabilities("aws"),
        run_id="run-1",
        max_duration=3600,
        agent_sha256="0" * 64,
        manifest_url="u",
        node_rank=1,
    )
    assert "\nRANK=1\n" in text and cfg.rank == 1 and cfg.num_nodes == 2 and cfg.gpu_count == 4
    assert cfg.master_port == 29500 and cfg.barrier_s == 600 and not cfg.node_ips_known
    # the agent's node_ip, run on this machine, finds an IPv4 address; GPUCLOUD_NODE_IP overrides it
    assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+", node_ip({"PATH": os.environ["PATH"]}, known=False))
    assert node_ip({"GPUCLOUD_NODE_IP": "10.1.2.3"}, known=False) == "10.1.2.3"
    local = job_config(
        make_spec(cloud="local", gpu=None, num_nodes=2),
        CPU,
        make_candidate("local", "", 0, 2),
        caps=capabilities("local"),
        run_id="run-1",
        node_rank=1,
        master_port=41234,
    )
    assert local.master_port == 41234 and local.node_ips_known and node_ip({}, known=True) == "127.0.0.1"
    with pytest.raises(ValueError):
        job_config(spec, T4, cand, caps=capabilities("aws"), run_id="run-1", node_rank=2)
    with pytest.raises(ValueError):
        job_config(spec, T4, cand, caps=capabilities("aws"), run_id="run-1", master_port=70000)


def test_reset_nodes_removes_a_previous_attempts_addresses_and_statuses(tmp_path: Path) -> None:
    ch = FileChannel(tmp_path)
    for rank in range(3):
        ch.put_bytes(f"{node_prefix('r1', rank)}/ready", b"10.9.9.9\n")
    ch.put_bytes(f"{node_prefix('r1', 0)}/status.json", b"{}")
    ch.put_bytes(f"{node_prefix('r2', 0)}/ready", b"10.9.9.8\n")  # another run's node
    ch.reset_nodes("r1", 3)
    assert all(ch.get_bytes(f"{node_prefix('r1', r)}/ready") is None for r in range(3))
    assert ch.get_bytes(f"{node_prefix('r1', 0)}/status.json") is None  # read as this attempt's otherwise
    assert ch.get_bytes(f"{node_prefix('r2', 0)}/ready") == b"10.9.9.8\n"


def test_local_provider_picks_a_free_master_port() -> None:
    import socket

    port = LocalProvider().master_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free right after it was picked


# ---- the exit-code rule ------------------------------------------------------------------------------


def _st(state: str, code: int | None, done: int, message: str = "") -> dict:
    return {
        "state": state,
        "exit_code": code,
        "message": message,
        "heartbeat": done,
        "stages": {"done": {"start": done, "end": done, "ok": True}},
    }


def test_exit_code_is_rank_0s_unless_another_rank_failed_first() -> None:
    assert _outcome([_st("succeeded", 0, 10), _st("succeeded", 0, 11)]) == ("succeeded", 0, "")
    # rank 1 failed first; rank 0 failed after it (e.g. its collective lost the peer)
    status, code, msg = _outcome(
        [_st("failed", 1, 20, "job exited with code 1"), _st("failed", 3, 15, "job exited with code 3")]
    )
    assert (status, code) == ("failed", 3) and msg == "node 1 failed first: job exited with code 3"
    # the same second: rank 0 wins the tie unless the CLI saw rank 1 end earlier
    both = [_st("failed", 1, 15, "job exited with code 1"), _st("failed", 3, 15, "job exited with code 3")]
    assert _outcome(both)[1] == 1
    assert _outcome(both, [5.0, 4.0])[1] == 3
    # rank 0 succeeded, rank 1 failed: rank 1's code
    assert _outcome([_st("succeeded", 0, 10), _st("failed", 4, 12, "job exited with code 4")])[:2] == ("failed", 4)
    # a node still running when the run ended (stopped with it) is never the one blamed
    status, code, msg = _outcome([None, _st("error", None, 9, "barrier: node(s) 0 not ready after 2s")])
    assert (status, code) == ("error", 70) and msg.startswith("node 1 failed first: barrier")
    assert _outcome([_st("deadline", None, 9, "max_duration passed"), _st("failed", 2, 8)])[:2] == ("deadline", 124)


# ---- end to end on the local provider ---------------------------------------------------------------


@pytest.mark.slow
@needs_torch
def test_ddp_example_on_two_local_nodes(tmp_path: Path, gpucloud_home: Path) -> None:
    t0 = time.monotonic()
    proc = cli(
        "run", str(REPO / "examples" / "ddp-2-nodes.yaml"), "--cloud", "local", "--json", cwd=tmp_path, timeout=180
    )
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    assert doc["status"] == "succeeded" and doc["exit_code"] == 0 and doc["cost"] == 0
    assert {"plan", "provision", "barrier", "run", "collect", "teardown"} <= set(doc["phases"])
    run_id = doc["run_id"]
    log = proc.stderr  # with --json the job's log goes to stderr
    losses = {int(r): v for r, v in re.findall(r"^\[node (\d)\] rank \d final loss (\S+)$", log, re.M)}
    assert set(losses) == {0, 1}, log[-4000:]
    assert losses[0] == losses[1]
    assert "[node 0] rank 0/2 (node 0" in log and "[node 1] rank 1/2 (node 1" in log and "backend gloo" in log
    out = Path(doc["artifacts_dir"])
    assert out == tmp_path / "gpucloud-runs" / run_id
    metrics = [json.loads((out / f"node-{r}" / "metrics.json").read_text()) for r in (0, 1)]
    assert [m["rank"] for m in metrics] == [0, 1] and all(m["world_size"] == 2 for m in metrics)
    assert metrics[0]["final_loss"] == metrics[1]["final_loss"] < 0.5
    assert (out / "node-0" / "outputs" / "model.pt").stat().st_size > 0
    assert not (out / "node-1" / "outputs").exists()  # only rank 0 saves the model
    stored = (gpucloud_home / "runs" / run_id / "log.txt").read_text()
    assert all(line.startswith(("[node 0] ", "[node 1] ")) for line in stored.splitlines())
    assert leftovers(gpucloud_home, run_id) == []
    print(f"\n2-node DDP local run: {wall:.1f}s wall")


@pytest.mark.slow
def test_one_failing_node_tears_down_the_run_with_its_exit_code(tmp_path: Path, gpucloud_home: Path) -> None:
    token = f"gpucloud-peer-{uuid.uuid4().hex[:8]}"
    run = (
        f'if [ "$GPUCLOUD_NODE_RANK" = 1 ]; then echo "rank 1 gives up"; exit 5; fi; '
        f'echo "rank 0 trains"; bash -c "sleep 120 # {token}"'
    )
    job = write_job(tmp_path / "job", {"name": "peer-fails", "num_nodes": 2, "run": run})
    t0 = time.monotonic()
    proc = cli("run", str(job), "--cloud", "local", cwd=tmp_path, timeout=60)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 5, proc.stderr
    assert elapsed < 30
    assert "[node 1] rank 1 gives up" in proc.stdout and "[node 0] rank 0 trains" in proc.stdout
    assert "failed (exit 5): node 1 failed first: job exited with code 5; node(s) 0 stopped with the run" in flat(
        proc.stderr
    )
    run_id = run_id_of(proc.stderr)
    assert leftovers(gpucloud_home, run_id, token) == []
    st = json.loads(cli("status", run_id, "--json", cwd=tmp_path, check=True).stdout)
    assert st["status"] == "failed" and st["exit_code"] == 5
    assert all(r["status"] == "deleted" for r in st["resources"])


@pytest.mark.slow
def test_a_dying_node_tears_down_the_others(tmp_path: Path, gpucloud_home: Path) -> None:
    """Node 1's machine disappears (its whole process group SIGKILLed, no final status): the run
    ends as lost (70), naming node 1, and node 0 is killed with it."""
    token = f"gpucloud-dying-{uuid.uuid4().hex[:8]}"
    job = write_job(
        tmp_path / "job",
        {"name": "peer-dies", "num_nodes": 2, "run": f'echo "up $GPUCLOUD_NODE_RANK"; bash -c "sleep 120 # {token}"'},
    )
    proc = start_cli("run", str(job), "--cloud", "local", cwd=tmp_path)
    try:
        sandbox = None
        end = time.monotonic() + 30
        while time.monotonic() < end:
            for node in (gpucloud_home / "local").glob("peer-dies-*/node-1"):
                log = node / "job.log"
                if log.exists() and "up 1" in log.read_text(errors="replace"):
                    sandbox = node
            if sandbox is not None:
                break
            time.sleep(0.2)
        assert sandbox is not None, "node 1 never started its job"
        from gpucloud.providers.local.engine import BootedVm, marked_pids

        vm = BootedVm.load(sandbox)
        assert vm is not None
        for pid in [vm.pid, *marked_pids(sandbox)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, err = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 70, err
    assert "node 1 stopped without reporting a final status" in flat(err)
    run_id = run_id_of(err)
    assert leftovers(gpucloud_home, run_id, token) == []


@pytest.mark.slow
def test_lifecycle_gives_a_shared_user_data_provider_one_script(
    tmp_path: Path, gpucloud_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider with `shared_user_data = True` (AWS: one RunInstances for N) gets N identical
    scripts; the nodes still end up with ranks 0..N-1 (here from GPUCLOUD_NODE_RANK, as set by the
    local engine; on AWS from the launch index)."""
    from gpucloud.contract import registry as providers
    from gpucloud.plan.planner import make_plan
    from gpucloud.run import lifecycle
    from gpucloud.spec.load import load_spec

    seen: list[list[str]] = []

    class SharedLocal(LocalProvider):
        capabilities = replace(LocalProvider.capabilities, shared_user_data=True)

        def provision(self, req, journal):  # type: ignore[no-untyped-def]
            seen.append(list(req.user_data))
            return super().provision(req, journal)

    prov = SharedLocal()
    monkeypatch.setattr(providers, "get_provider", lambda cloud, **kw: prov)
    monkeypatch.chdir(tmp_path)
    spec = load_spec(write_job(tmp_path / "job", {"name": "shared", "num_nodes": 2, "run": ENV_DUMP}))
    run = lifecycle.RunInProgress(
        spec, make_plan(spec, cloud="local"), detach=False, json_out=True, wait_teardown=True, plan_s=0.0
    )
    result = run.execute()
    assert (result.status, result.exit_code) == ("succeeded", 0)
    assert len(seen) == 1 and len(seen[0]) == 2 and seen[0][0] == seen[0][1]
    log = (gpucloud_home / "runs" / run.run_id / "log.txt").read_text()
    assert "[node 0] rank=0/0 nodes=2" in log and "[node 1] rank=1/1 nodes=2" in log
    assert "[node 1] ips=[127.0.0.1" in log
