"""The node's GPU sampler (gpucloud/vm/agent/gpu_usage.py): nvidia-smi's CSV parsed, the summary's
figures (peak memory, mean and p95 utilisation, idle time), its bounds (series points, histogram),
the idle timeout, and one real run against the stub nvidia-smi with scripted utilisation."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from gpucloud.vm.agent import gpu_usage
from gpucloud.vm.agent.gpu_usage import MAX_POINTS, Usage, parse

STUBS = Path(__file__).resolve().parent.parent / "support" / "vm_stubs"
MODULE = Path(gpu_usage.__file__)


def test_parse_reads_every_gpu_and_takes_na_as_unknown() -> None:
    text = "45, 8123, 81559, 250.31, 60\n0, 3, 81559, [N/A], 35\nnot a line\n"
    assert parse(text) == [[45.0, 8123.0, 81559.0, 250.31, 60.0], [0.0, 3.0, 81559.0, None, 35.0]]
    assert parse("") == []


def test_summary_figures() -> None:
    usage = Usage(interval=5)
    utils = [100.0] * 10 + [0.0] * 90  # 100 samples, 1 GPU
    for i, u in enumerate(utils):
        usage.add([[u, 1000.0 + i, 16384.0, 70.0, 40.0 + i % 3]], when=1000.0 + 5 * i)
    doc = usage.as_json()
    assert doc["samples"] == 100 and doc["gpus"] == 1
    assert doc["util_mean"] == 10.0
    assert doc["util_p95"] == 100.0  # the top 10 % are at 100
    assert doc["mem_peak_mib"] == 1099.0 and doc["mem_total_mib"] == 16384.0
    assert doc["idle_s"] == 90 * 5  # each idle sample counts the interval before it
    assert doc["power_mean_w"] == 70.0 and doc["temp_peak_c"] == 42.0
    assert doc["now"] == [[0.0, 1099.0, 16384.0, 70.0, 40.0]]  # 40 + 99 % 3


def test_p95_of_a_busy_node() -> None:
    usage = Usage(interval=1)
    for i in range(100):
        usage.add([[float(i), 0.0, 1.0, None, None], [float(i), 0.0, 1.0, None, None]], when=float(i))
    assert usage.percentile(95) == 94.0 and usage.percentile(50) == 49.0
    assert usage.as_json()["power_mean_w"] is None


def test_the_series_stays_bounded_and_covers_the_whole_run() -> None:
    usage = Usage(interval=2)
    for i in range(10_000):
        usage.add([[50.0, float(i), 100.0, 1.0, 1.0]], when=2.0 * i)
    doc = usage.as_json()
    points = doc["series"]["points"]
    assert len(points) <= MAX_POINTS + 1
    assert points[0][0] == 0 and points[-1][0] > 0.9 * 2 * 10_000 - 2 * doc["series"]["step_s"]
    assert len(json.dumps(doc)) < 8000  # small enough for every status push


def test_idle_streak_resets_and_expires() -> None:
    usage = Usage(interval=1, idle_timeout=3)
    for t, u in enumerate([0, 0, 50, 0, 0, 0]):
        usage.add([[float(u), 0.0, 1.0, 1.0, 1.0]], when=float(t))
        if t < 5:
            assert not usage.idle_expired, t
    assert usage.idle_expired and usage.as_json()["idle_streak_s"] == 2 + 1


def test_a_gap_counts_at_most_three_intervals() -> None:
    usage = Usage(interval=1)
    usage.add([[0.0, 0.0, 1.0, 1.0, 1.0]], when=0.0)
    usage.add([[0.0, 0.0, 1.0, 1.0, 1.0]], when=100.0)  # the sampler was starved: no idle time invented
    assert usage.idle_s == 3.0


def _stub_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    return {
        **os.environ,
        "PATH": f"{STUBS}:{os.environ['PATH']}",
        "STUB_STATE": str(state),
        "STUB_LOG": str(tmp_path / "calls"),
        "STUB_DRIVER": "580.65.06",
        "STUB_REAL_PYTHON": sys.executable,
        **extra,
    }


def test_runs_against_the_stub_and_ends_on_idle(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    env = _stub_env(tmp_path, STUB_GPU_COUNT="2", STUB_GPU_UTIL="90,90,0", STUB_GPU_MEM_USED="8000,9000,100")
    args = [sys.executable, str(MODULE), "--out", str(out), "--interval", "0.2", "--idle-timeout", "0.5"]
    done = subprocess.run(args, env=env, timeout=30, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["gpus"] == 2 and doc["mem_peak_mib"] == 9000.0 and doc["util_p95"] == 90.0
    idle = (tmp_path / "gpu.json.idle").read_text()
    assert "idle" in idle and "resources.idle_timeout" in idle
    assert doc["samples"] <= 3 + 0.5 / 0.2 + 2  # ended within the threshold + one sample


def test_no_driver_writes_nothing_and_stops_on_the_stop_file(tmp_path: Path) -> None:
    out, stop = tmp_path / "gpu.json", tmp_path / "stop"
    env = _stub_env(tmp_path, STUB_DRIVER="")
    proc = subprocess.Popen(
        [sys.executable, str(MODULE), "--out", str(out), "--interval", "0.2", "--stop", str(stop)], env=env
    )
    try:
        stop.write_text("")
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
    assert not out.exists()


def test_module_is_python38_stdlib_only() -> None:
    source = MODULE.read_text()
    for line in source.splitlines():
        if line.startswith(("import ", "from ")) and "__future__" not in line:
            module = line.split()[1].split(".")[0]
            assert module in sys.stdlib_module_names, line
    ast.parse(source, feature_version=(3, 8))
    assert "GPU_USAGE_PY" not in source  # the template's heredoc delimiter


def test_ends_when_its_parent_is_gone_or_past_until(tmp_path: Path) -> None:
    env = _stub_env(tmp_path, STUB_GPU_UTIL="50")
    base = [sys.executable, str(MODULE), "--out", str(tmp_path / "g.json"), "--interval", "0.2"]
    done = subprocess.run([*base, "--until", "1"], env=env, timeout=20)
    assert done.returncode == 0 and not (tmp_path / "g.json").exists()  # past --until before sampling
    child = subprocess.Popen(["sleep", "1"])
    proc = subprocess.Popen([*base, "--parent", str(child.pid)], env=env)
    child.wait()
    assert proc.wait(timeout=20) == 0
