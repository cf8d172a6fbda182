"""`cost --plot` and `status RUN --plot`: a real PNG of the expected size (opened and checked), an
SVG, and clear errors for a wrong suffix, a run without samples and a missing matplotlib."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpucloud.errors import UserError
from gpucloud.run.plot import plot_cost, plot_usage
from gpucloud.vm.agent.gpu_usage import Usage
from tests.support.cli import cli

pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is in the test dependencies")


def _report() -> dict:
    runs = [
        {"run_id": f"job-2026120{d}-000000-abc{d}", "created_at": 1_764_547_200 + d * 86_400, "cost": 0.5 * d}
        for d in range(1, 5)
    ]
    return {"runs": runs, "total": {"runs": len(runs), "cost": sum(r["cost"] for r in runs)}}


def _nodes() -> dict[str, dict]:
    nodes = {}
    for rank in ("0", "1"):
        usage = Usage(interval=5)
        for i in range(200):
            usage.add([[float(i % 100), 1000.0 + 10 * i, 16384.0, 70.0, 40.0]], when=5.0 * i)
        nodes[rank] = usage.as_json()
    return nodes


def test_cost_plot_is_a_png_of_the_expected_size(tmp_path: Path) -> None:
    from PIL import Image

    path = plot_cost(_report(), tmp_path / "cost.png")
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size == (800, 500)


def test_usage_plot_png_and_svg(tmp_path: Path) -> None:
    from PIL import Image

    png = plot_usage("job-1", _nodes(), tmp_path / "use.png")
    with Image.open(png) as img:
        assert img.size == (800, 500)
    svg = plot_usage("job-1", _nodes(), tmp_path / "use.svg")
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()


def test_clear_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UserError, match="must end in .png or .svg"):
        plot_cost(_report(), tmp_path / "cost.jpg")
    with pytest.raises(UserError, match="no GPU samples"):
        plot_usage("job-1", {}, tmp_path / "x.png")
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(UserError, match="needs matplotlib") as caught:
        plot_cost(_report(), tmp_path / "cost.png")
    assert "gpucloud[plot]" in caught.value.render()


def test_cli_cost_plot_and_help_stays_free_of_matplotlib(tmp_path: Path) -> None:
    env = {"GPUCLOUD_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    out = cli("cost", "--plot", str(tmp_path / "c.png"), env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "c.png").stat().st_size > 1000 and "wrote" in out.stderr
    load = "import sys, gpucloud.cli.app as c; "
    code = load + "c.app(['--help'], standalone_mode=False); print('matplotlib' in sys.modules)"
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert probe.stdout.strip().endswith("False"), probe.stdout + probe.stderr


def test_status_plot_reads_the_runs_saved_samples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    from gpucloud.run import gpu_report
    from gpucloud.run.plot import plot_run
    from gpucloud.state.runs_db import home_dir

    monkeypatch.setenv("GPUCLOUD_HOME", str(tmp_path / "home"))
    nodes = _nodes()
    gpu_report.save(home_dir(), "job-20261205-000000-abcd", [{"gpu": nodes["0"]}, {"gpu": nodes["1"]}])
    path = plot_run("job-20261205-000000-abcd", tmp_path / "run.png")
    with Image.open(path) as img:
        assert img.size == (800, 500)
    with pytest.raises(UserError, match="give the run"):
        plot_run(None, tmp_path / "x.png")
