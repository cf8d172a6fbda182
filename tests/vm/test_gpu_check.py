"""The agent's gpu_verify stage (gpucloud/vm/agent/gpu_check.py) against the stub nvidia-smi and
python3: the catalog model's tokens as whole words of nvidia-smi's names, strict vs warn, and the
framework's own device count (a driver/wheel mismatch must not train on the CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpucloud.vm.agent import gpu_check
from gpucloud.vm.agent.gpu_check import matches_model
from gpucloud.vm.agent.stage_api import StageFailed
from tests.support.render_inputs import A100_TF, K80
from tests.vm.conftest import StubVm, config


def _cfg(model: str, count: int, *, mode: str = "strict", framework: str = "none") -> dict[str, Any]:
    cfg = config(K80, "aws", model, count, "p2.xlarge")
    assert cfg["gpu_count"] == count and cfg["gpu_model"] == model
    cfg["gpu_check"] = mode
    if framework == "none":
        cfg.update(framework="none", framework_version="", framework_pip=[])
    return cfg


def _vm(tmp_path: Path, name: str, count: int, *, torch: str | None = None, **extra: str) -> StubVm:
    vm = StubVm(tmp_path, stub_env={"STUB_DRIVER": "580.65.06", "STUB_GPU_NAME": name, "STUB_GPU_COUNT": str(count)})
    vm.stub_env.update(extra)
    if torch is not None:
        (vm.state / "py" / "torch").write_text(torch)
    return vm


def _run(vm: StubVm, cfg: dict[str, Any]) -> None:
    gpu_check.run(cfg, vm.env(cfg))


def _fails(vm: StubVm, cfg: dict[str, Any]) -> str:
    with pytest.raises(StageFailed) as exc:
        _run(vm, cfg)
    return str(exc.value)


@pytest.mark.parametrize(
    ("model", "count", "smi_name", "smi_count", "message"),
    [
        ("A100-80GB", 8, "NVIDIA A100-SXM4-80GB", 8, None),
        ("A10G", 1, "NVIDIA A10G", 1, None),
        ("A10", 1, "NVIDIA A10G", 1, "GPU check failed: nvidia-smi shows 0 x A10, expected 1 (found: NVIDIA A10G)"),
        (
            "K80",
            2,
            "Tesla K80",
            1,
            "GPU check failed: nvidia-smi shows 1 x K80, expected 2 (found: Tesla K80)",
        ),
        (
            "A100-40GB",
            2,
            "NVIDIA A100-SXM4-80GB",
            2,
            "GPU check failed: nvidia-smi shows 0 x A100-40GB, expected 2 "
            "(found: NVIDIA A100-SXM4-80GB, NVIDIA A100-SXM4-80GB)",
        ),
    ],
)
def test_strict_check_of_model_and_count(
    tmp_path: Path, model: str, count: int, smi_name: str, smi_count: int, message: str | None
) -> None:
    vm = _vm(tmp_path, smi_name, smi_count)
    cfg = _cfg(model, count)
    if message is None:
        _run(vm, cfg)
        assert "WARNING" not in vm.log()
    else:
        assert _fails(vm, cfg) == message


def test_strict_without_any_gpu_fails(tmp_path: Path) -> None:
    vm = StubVm(tmp_path)  # no driver: nvidia-smi fails
    assert _fails(vm, _cfg("K80", 1)) == "GPU check failed: nvidia-smi shows 0 x K80, expected 1 (found: )"


def test_missing_nvidia_smi_reads_as_no_gpu(tmp_path: Path) -> None:
    vm = StubVm(tmp_path).override("nvidia-smi", "exit 127\n")
    _run(vm, _cfg("K80", 1, mode="warn"))
    assert "WARNING: no NVIDIA GPU on this host" in vm.log()


def test_warn_mode_without_gpu_runs_on_the_cpu(tmp_path: Path) -> None:
    vm = _vm(tmp_path, "Tesla K80", 0, torch="2.0.1")
    _run(vm, _cfg("K80", 1, mode="warn", framework="pytorch"))
    assert vm.log() == ("[gpucloud] WARNING: no NVIDIA GPU on this host (expected 1 x K80): the job runs on the CPU\n")
    assert not any(c.startswith("python3") for c in vm.calls())  # the framework is not asked


def test_warn_mode_mismatch_warns_and_checks_the_framework_against_what_is_there(tmp_path: Path) -> None:
    vm = _vm(tmp_path, "Tesla K80", 1, torch="2.0.1")
    _run(vm, _cfg("K80", 2, mode="warn", framework="pytorch"))
    assert vm.lines == [
        "WARNING: nvidia-smi shows 1 x K80, expected 2 (found: Tesla K80)",
        "PyTorch sees 1 GPU(s)",
    ]


def test_no_gpu_requested_checks_nothing(tmp_path: Path) -> None:
    vm = StubVm(tmp_path)
    _run(vm, _cfg("", 0, framework="pytorch"))
    assert vm.lines == ["no GPU requested"] and vm.calls() == []


def test_framework_seeing_all_gpus_is_logged(tmp_path: Path) -> None:
    vm = _vm(tmp_path, "Tesla K80", 8, torch="2.0.1")
    _run(vm, _cfg("K80", 8, framework="pytorch"))
    assert vm.lines == ["PyTorch sees 8 GPU(s)"]


def test_framework_seeing_fewer_gpus_is_an_error(tmp_path: Path) -> None:
    vm = _vm(tmp_path, "Tesla K80", 1, torch="2.0.1", STUB_FW_GPUS="0")
    assert _fails(vm, _cfg("K80", 1, framework="pytorch")) == (
        "PyTorch sees 0 GPUs, expected 1: driver/wheel mismatch (driver 470, CUDA 11.4, PyTorch 2.0.1); "
        "refusing to train on the CPU"
    )


def test_framework_not_importable_is_an_error_when_strict(tmp_path: Path) -> None:
    vm = _vm(tmp_path, "Tesla K80", 1)
    message = _fails(vm, _cfg("K80", 1, framework="pytorch"))
    assert message.startswith("PyTorch sees no GPUs, expected 1: driver/wheel mismatch")
    assert "No module named 'torch'" in (vm.vm_dir / "stack.log").read_text()  # its error went to stack.log


def test_framework_not_importable_only_warns_in_warn_mode(tmp_path: Path) -> None:
    vm = _vm(tmp_path, "Tesla K80", 1)
    _run(vm, _cfg("K80", 1, mode="warn", framework="pytorch"))
    assert vm.lines == ["WARNING: PyTorch is not importable here; GPU visibility not checked"]


def test_warn_mode_framework_seeing_fewer_gpus_is_still_an_error(tmp_path: Path) -> None:
    vm = _vm(tmp_path, "Tesla K80", 2, torch="2.0.1", STUB_FW_GPUS="1")
    message = _fails(vm, _cfg("K80", 2, mode="warn", framework="pytorch"))
    assert message.startswith("PyTorch sees 1 GPUs, expected 2: driver/wheel mismatch")


def test_tensorflow_counts_its_physical_gpus(tmp_path: Path) -> None:
    cfg = config(A100_TF, "aws", "A100-80GB", 8, "p4de.24xlarge")
    assert cfg["framework"] == "tensorflow"
    vm = _vm(tmp_path, "NVIDIA A100-SXM4-80GB", 8)
    (vm.state / "py" / "tensorflow").write_text("2.19.0")
    _run(vm, cfg)
    assert vm.lines == ["TensorFlow sees 8 GPU(s)"]
    assert any('len(tf.config.list_physical_devices("GPU"))' in c for c in vm.calls())
    vm.stub_env["STUB_FW_GPUS"] = "0"
    assert _fails(vm, cfg).startswith("TensorFlow sees 0 GPUs, expected 8: driver/wheel mismatch (driver 580, CUDA")


def test_no_framework_means_no_python(tmp_path: Path) -> None:
    vm = _vm(tmp_path, "Tesla K80", 1)
    _run(vm, _cfg("K80", 1))
    assert vm.lines == [] and not any(c.startswith("python3") for c in vm.calls())


@pytest.mark.parametrize(
    ("name", "tokens", "ok"),
    [
        ("NVIDIA A100-SXM4-80GB", ["A100", "80GB"], True),
        ("NVIDIA A100 80GB PCIe", ["A100", "80GB"], True),
        ("NVIDIA A10G", ["A10"], False),
        ("NVIDIA A10", ["A10"], True),
        ("Tesla T4", ["T4"], True),
        ("NVIDIA T4G", ["T4"], False),
        ("nvidia h100 80gb hbm3", ["H100", "80GB"], True),
        ("NVIDIA H100 NVL", ["H100", "80GB"], False),
    ],
)
def test_model_tokens_match_whole_words(name: str, tokens: list[str], ok: bool) -> None:
    assert matches_model(name, tokens) is ok
