"""The CLI side of GPU sampling (gpucloud/run/gpu_report.py): node summaries kept across reads, the
run's figures, right-sizing against the catalog, and the step summary's small table."""

from __future__ import annotations

from pathlib import Path

from gpucloud.run import gpu_report
from gpucloud.state.runs_db import AttemptRecord
from gpucloud.ui.ci import usage_markdown
from gpucloud.vm.agent.gpu_usage import Usage


def _node(util: float, used_mib: float, total_mib: float = 24576.0, samples: int = 10) -> dict:
    usage = Usage(interval=5)
    for i in range(samples):
        usage.add([[util, used_mib, total_mib, 100.0, 50.0]], when=5.0 * i)
    return usage.as_json()


def _attempt(itype: str = "g5.xlarge", spot: bool = False, price: float = 1.006) -> AttemptRecord:
    return AttemptRecord(
        run_id="r",
        idx=0,
        cloud="aws",
        region="us-east-1",
        zone=None,
        instance_type=itype,
        spot=spot,
        price_per_hour=price,
        num_nodes=1,
        started_at=0.0,
        ended_at=3600.0,
        end_reason="succeeded",
        launched=True,
        handle_json=None,
    )


def test_save_keeps_each_nodes_latest_summary(tmp_path: Path) -> None:
    gpu_report.save(tmp_path, "r", [{"gpu": _node(10, 100)}, None])
    gpu_report.save(tmp_path, "r", [None, {"gpu": _node(90, 200)}])  # node 0 sent nothing new
    nodes = gpu_report.load(tmp_path, "r")
    assert set(nodes) == {"0", "1"} and nodes["0"]["util_mean"] == 10.0
    gpu_report.save(tmp_path, "r", [{"state": "running"}])  # no sample: nothing written
    assert gpu_report.load(tmp_path, "other") == {}


def test_summary_over_nodes() -> None:
    doc = gpu_report.summarize({"0": _node(10, 2048, samples=10), "1": _node(40, 8192, samples=30)})
    assert doc is not None
    assert doc["peak_memory_gib"] == 8.0 and doc["gpu_memory_gib"] == 24.0
    assert doc["util_mean"] == 32.5  # weighted by samples
    assert doc["util_p95"] == 40.0 and doc["samples"] == 40
    assert gpu_report.summarize({}) is None


def test_right_size_picks_the_cheapest_x86_machine_that_holds_the_peak() -> None:
    summary = gpu_report.summarize({"0": _node(20, 8000)})
    assert summary is not None
    fit = gpu_report.right_size(summary, _attempt(), 3600.0)
    assert fit is not None and fit["instance_type"] == "g4dn.xlarge" and fit["gpu"] == "T4"
    assert fit["needed_gib_per_gpu"] == round(summary["peak_memory_gib"] * 1.25, 2)
    assert fit["would_have_cost"] == 0.526 and fit["cost"] == 1.006 and fit["saving"] > 0
    big = gpu_report.summarize({"0": _node(90, 22000)})
    assert big is not None
    same = gpu_report.right_size(big, _attempt(), 3600.0)  # 26.9 GiB needed: nothing cheaper holds it
    assert same is not None and same["gpu"] != "T4" and gpu_report.usage_lines({**big, "right_size": same})
    assert gpu_report.right_size(summary, _attempt(itype="localhost"), 60.0) is None


def test_usage_lines_and_markdown() -> None:
    summary = gpu_report.summarize({"0": _node(20, 8000)})
    assert summary is not None
    doc = {**summary, "right_size": gpu_report.right_size(summary, _attempt(), 3600.0)}
    lines = gpu_report.usage_lines(doc)
    assert lines[0].startswith("GPU use: peak memory 7.81 of 24 GiB per GPU") and "g4dn.xlarge" in lines[1]
    table = "\n".join(usage_markdown(doc))
    assert "| peak memory per GPU | 7.81 of 24 GiB |" in table
    assert "| would have fitted | `g4dn.xlarge` (1 × T4): $0.5260 instead of $1.0060 |" in table
    assert usage_markdown(None) == []
    node = gpu_report.node_lines({"0": _node(20, 8000)})
    assert node == ["node 0: gpu0 20 % 7.8/24 GiB 100 W 50 C"]
