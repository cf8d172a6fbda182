"""Stack resolution (docs/STACKS.md): every catalog GPU resolves; pins are honoured or refused with the limit."""

from __future__ import annotations

import pytest

from gpucloud.catalog import gpu_names, load_catalog
from gpucloud.errors import UserError
from gpucloud.plan.stacks import MIN_DRIVER, Stack, resolve_stack
from gpucloud.spec.load import StackSpec

REASON_KEYS = {"gpu", "architecture", "driver", "min_driver_version", "cuda", "cudnn", "os_image", "framework"}


def pins(**kw: str) -> StackSpec:
    return StackSpec(**kw)


def raw_pins(**kw: str) -> StackSpec:
    """Pins that skip the job-file validation, as a direct caller of resolve_stack could pass them."""
    return StackSpec.model_construct(**{**StackSpec().model_dump(), **kw})


def _v(s: str) -> tuple[int, ...]:
    return tuple(int(p) for p in s.split("."))


@pytest.mark.parametrize("gpu", gpu_names())
@pytest.mark.parametrize("framework", ["none", "pytorch", "tensorflow"])
def test_every_catalog_gpu_resolves(gpu: str, framework: str) -> None:
    if gpu == "K40" and framework == "pytorch":
        pytest.skip("K40 + PyTorch is a documented error (test_k40_pytorch_error)")
    if gpu == "M60" and framework == "tensorflow":
        pytest.skip("M60 + TensorFlow is a documented error (test_m60_tensorflow_is_refused)")
    s = resolve_stack(gpu, pins(framework=framework))
    arch = load_catalog().gpu(gpu).architecture
    assert (s.gpu, s.architecture) == (gpu, arch)
    assert REASON_KEYS <= set(s.reasons) and all(s.reasons[k] for k in REASON_KEYS)
    assert s.cuda in MIN_DRIVER and s.min_driver_version == MIN_DRIVER[s.cuda]
    assert s.os_image == f"ubuntu-{s.ubuntu_version}" and s.cuda_repo == "ubuntu" + s.ubuntu_version.replace(".", "")
    assert s.cuda_packages == (f"cuda-toolkit-{s.cuda.replace('.', '-')}",)
    modules = "nvidia-open" if arch == "Blackwell" else "cuda-drivers"
    assert s.driver_packages == (f"{modules}-{s.driver}",)
    assert s.kernel_modules == ("open" if arch == "Blackwell" else "proprietary")
    assert s.cuda_toolkit is (arch == "Kepler" and framework == "tensorflow")
    assert s.cudnn_packages
    if framework == "none":
        assert s.framework_pip == () and s.framework_version is None
    else:
        assert s.framework_version and s.framework_pip[0].endswith(f"=={s.framework_version}")
    # Generation rules of docs/STACKS.md.
    if arch == "Kepler":
        assert (s.driver, s.cuda, s.cudnn, s.ubuntu_version) == ("470", "11.4", "8.2.4", "20.04")
    elif arch in ("Maxwell", "Pascal", "Volta"):
        assert (s.driver, s.cuda, s.cudnn, s.ubuntu_version) == ("580", "12.9", "9.10", "22.04")
        assert s.cudnn_packages == ("cudnn9-cuda-12=9.10.*",)  # 9.11 dropped sm_50-sm_70
    else:
        assert (s.driver, s.cuda, s.cudnn, s.ubuntu_version) == ("580", "12.8", "9", "22.04")
    json = s.as_json()
    assert set(json) == {"gpu", "architecture", "driver", "cuda", "cudnn", "os_image", "framework"}


def test_k80_defaults() -> None:
    s = resolve_stack("k80", pins(framework="pytorch"))
    assert isinstance(s, Stack)
    assert (s.gpu, s.architecture, s.compute_capability) == ("K80", "Kepler", "3.7")
    assert s.driver_packages == ("cuda-drivers-470",)
    assert s.cuda_packages == ("cuda-toolkit-11-4",)
    assert s.cudnn_packages == ("libcudnn8=8.2.4.*-1+cuda11.4",)
    assert s.os_image == "ubuntu-20.04" and s.cuda_repo == "ubuntu2004"
    assert s.min_driver_version == "470.82.01"
    assert s.framework_version == "2.1.2"
    assert s.framework_pip == ("torch==2.1.2", "--index-url", "https://download.pytorch.org/whl/cu118")
    assert "minor-version compatibility" in s.reasons["framework"]
    assert "2.1.2 is the last fully working one" in s.reasons["framework"]
    assert s.as_json()["framework"] == "pytorch==2.1.2"
    assert any("end of life" in w for w in s.warnings)


@pytest.mark.parametrize(
    ("version", "pip_tail"),
    [
        ("1.12", ("torch==1.12.1", "cu113")),
        ("1.13.1", ("torch==1.13.1", "cu116")),
        ("2.0.1", ("torch==2.0.1", "cu117")),
        ("2.1", ("torch==2.1.2", "cu118")),
    ],
)
def test_k80_pytorch_pins(version: str, pip_tail: tuple[str, str]) -> None:
    s = resolve_stack("K80", pins(framework="pytorch", framework_version=version))
    assert s.framework_pip[0] == pip_tail[0] and s.framework_pip[-1].endswith(pip_tail[1])


def test_k80_tensorflow() -> None:
    s = resolve_stack("K80", pins(framework="tensorflow"))
    assert s.framework_pip == ("tensorflow==2.11.1",)
    with pytest.raises(UserError, match="2.11 is the last release with Kepler kernels"):
        resolve_stack("K80", pins(framework="tensorflow", framework_version="2.12"))


def test_k80_cuda_12_error_states_keplers_limit() -> None:
    with pytest.raises(UserError) as exc:
        resolve_stack("K80", pins(cuda="12.2"))
    msg = exc.value.message
    assert "K80 cannot use CUDA 12.2" in msg
    assert "CUDA 11.x" in msg and "R470" in msg and "11.4" in msg and "CUDA 12.0 removed sm_35/sm_37" in msg
    assert exc.value.exit_code == 2


def test_k80_newer_11x_toolkit_is_refused_by_the_driver_limit() -> None:
    with pytest.raises(UserError, match=r"needs driver >= 520\.61\.05.*R470 is the last driver branch"):
        resolve_stack("K80", pins(cuda="11.8"))


def test_k40_pytorch_error_explains_the_options() -> None:
    with pytest.raises(UserError) as exc:
        resolve_stack("K40", pins(framework="pytorch"))
    msg = exc.value.message
    assert "no official wheels" in msg and "1.2" in msg
    assert "TORCH_CUDA_ARCH_LIST=3.5" in msg and "framework: none" in msg and "K80" in msg and "T4" in msg
    k80 = resolve_stack("K80", pins(framework="pytorch"))
    assert f"PyTorch {k80.framework_version}+cu118 runs there" in msg  # the K80 answer `stack K80` gives
    # K40 itself resolves (driver 470 / CUDA 11.4) for framework none and tensorflow.
    assert resolve_stack("K40").cuda == "11.4"


@pytest.mark.parametrize(
    ("gpu", "kw", "needle"),
    [
        ("K80", {"driver": "535"}, "R470 is the last driver branch that supports Kepler"),
        ("V100", {"driver": "590"}, "R580 is the last driver branch"),
        ("K80", {"cudnn": "8.9"}, "need compute capability >= 5.0"),
        ("K80", {"cudnn": "9.1"}, "need compute capability >= 5.0"),
        ("K40", {"cudnn": "9"}, "need compute capability >= 5.0"),
        (
            "T4",
            {"driver": "535", "cuda": "12.8"},
            r"driver 535 is too old for CUDA 12\.8, which needs driver >= 570\.26",
        ),
        ("A100-80GB", {"driver": "470", "cuda": "12.2"}, "too old for CUDA 12.2"),
        ("T4", {"driver": "570.10", "cuda": "12.8"}, "too old"),
        ("V100", {"cuda": "13.0"}, "CUDA 13.0 removed them"),
        ("H100", {"cuda": "11.4"}, "needs CUDA 11.8 or newer"),
        ("T4", {"cuda": "12.3"}, "not a CUDA version gpucloud can check"),
        (
            "K80",
            {"framework": "pytorch", "framework_version": "2.2"},
            r"cu118 wheels 2\.1-2\.7\.1 carry sm_37 kernels, but from 2\.2 their bundled cuDNN no "
            r"longer supports Kepler, "
            r"so <= 2\.1\.2 is the last fully working one",
        ),
        ("V100", {"cudnn": "9.11"}, "cuDNN 9.11 dropped sm_50-sm_70"),
        ("P100", {"cudnn": "9"}, "an unpinned"),
        ("B200", {"driver": "565", "cuda": "12.6"}, "needs CUDA 12.8 or newer"),
        ("T4", {"framework": "pytorch", "framework_version": "3.0"}, "not one gpucloud knows wheels for"),
        ("T4", {"cuda": "11.8", "framework": "pytorch", "framework_version": "2.9"}, "no wheel for CUDA 11.x"),
        ("T4", {"cudnn": "8.9", "cuda": "13.0"}, "no build for CUDA 13.0"),
    ],
)
def test_pins_the_gpu_cannot_run_are_errors(gpu: str, kw: dict[str, str], needle: str) -> None:
    with pytest.raises(UserError, match=needle):
        resolve_stack(gpu, pins(**kw))


def test_malformed_pins_are_rejected_even_without_spec_validation() -> None:
    with pytest.raises(UserError, match="not a driver branch"):
        resolve_stack("T4", raw_pins(driver="latest"))
    with pytest.raises(UserError, match="not a CUDA version"):
        resolve_stack("T4", raw_pins(cuda="twelve"))


def test_pins_are_honoured() -> None:
    s = resolve_stack("T4", pins(driver="535", cuda="12.2", cudnn="9.1", framework="pytorch", framework_version="2.7"))
    assert (s.driver, s.cuda, s.cudnn) == ("535", "12.2", "9.1")
    assert s.driver_packages == ("cuda-drivers-535",) and s.cuda_packages == ("cuda-toolkit-12-2",)
    assert s.cudnn_packages == ("cudnn9-cuda-12=9.1.*",)
    assert s.framework_pip == ("torch==2.7.1", "--index-url", "https://download.pytorch.org/whl/cu126")
    assert s.min_driver_version == "535.54.03"
    assert "as pinned" in s.reasons["driver"] and "as pinned" in s.reasons["cuda"]

    k = resolve_stack("K80", pins(cuda="11.2", cudnn="8.1", driver="470"))
    assert (k.cuda, k.cudnn, k.driver) == ("11.2", "8.1", "470")
    assert k.cudnn_packages == ("libcudnn8=8.1.*",)

    v = resolve_stack("V100", pins(framework="pytorch", framework_version="2.8.0"))
    assert v.framework_pip[-1].endswith("cu126")  # the cu128 wheels dropped Volta

    old = resolve_stack("T4", pins(cuda="11.6"))
    assert old.ubuntu_version == "20.04"  # no CUDA 11.6 repository for 22.04


def test_the_cudnn_reason_names_the_package_the_stack_installs() -> None:
    for cuda in ("11.8", "12.8"):
        s = resolve_stack("A100-80GB", pins(cuda=cuda))
        (package,) = s.cudnn_packages
        assert package in s.reasons["cudnn"] and f"for CUDA {cuda.split('.')[0]}" in s.reasons["cudnn"]


def test_driver_pin_picks_a_cuda_it_can_run() -> None:
    s = resolve_stack("T4", pins(driver="535", framework="pytorch"))
    assert s.cuda == "12.2" and "pinned driver 535" in s.reasons["cuda"]
    assert s.framework_pip[-1].endswith("cu126")  # closest 12.x wheel; runs by minor-version compatibility


def test_new_cuda_pin_raises_the_driver_and_drops_the_suffix() -> None:
    s = resolve_stack("H100", pins(cuda="13.1", framework="pytorch"))
    assert s.driver == "590" and s.driver_packages == ("cuda-drivers=590.*",)
    assert s.cudnn_packages == ("cudnn9-cuda-13",)
    assert s.framework_pip == ("torch==2.9.0", "--index-url", "https://download.pytorch.org/whl/cu130")
    assert resolve_stack("H100", pins(cuda="13.0")).driver == "580"
    s132 = resolve_stack("H100", pins(cuda="13.2"))
    assert s132.driver == "595" and s132.driver_packages == ("cuda-drivers=595.*",)


def test_a10_warns_about_the_grid_driver() -> None:
    s = resolve_stack("A10")
    assert any("GRID" in w for w in s.warnings)
    assert not resolve_stack("A10G").warnings


def test_cpu_stack() -> None:
    s = resolve_stack(None)
    assert (s.architecture, s.driver, s.cuda, s.cudnn) == ("none", "none", "none", "none")
    assert s.driver_packages == s.cuda_packages == s.cudnn_packages == s.framework_pip == ()
    assert s.os_image == "ubuntu-22.04" and s.framework == "none"
    t = resolve_stack(None, pins(framework="pytorch"))
    assert t.framework_pip == ("torch==2.8.0", "--index-url", "https://download.pytorch.org/whl/cpu")
    assert resolve_stack(None, pins(framework="tensorflow")).framework_pip == ("tensorflow-cpu==2.19.0",)
    with pytest.raises(UserError, match="CPU-only job"):
        resolve_stack(None, pins(cuda="12.8"))


def test_unknown_gpu_lists_known_ones() -> None:
    with pytest.raises(UserError, match="Known GPUs: K40, K80, .*H200.*B200"):
        resolve_stack("GTX1080")


def test_aliases_resolve_to_canonical_stacks() -> None:
    assert resolve_stack("a100").gpu == "A100"  # the family (catalog GPU family): A100-40GB or -80GB
    assert resolve_stack("Tesla K80").driver == "470"


def test_min_driver_table_is_monotonic() -> None:
    versions = list(MIN_DRIVER.items())
    assert versions == sorted(versions, key=lambda kv: _v(kv[0]))
    assert [_v(d) for _, d in versions] == sorted(_v(d) for _, d in versions)


# ---- data fixes ------------------------------------------------------------------------------------


def test_m60_tensorflow_is_refused() -> None:
    with pytest.raises(UserError, match=r"no Maxwell \(sm_50/sm_52\) kernels.*framework: pytorch"):
        resolve_stack("M60", pins(framework="tensorflow"))
    assert resolve_stack("P100", pins(framework="tensorflow")).framework_version == "2.19.0"


def test_blackwell_needs_open_modules_r570_and_cuda_128() -> None:
    for gpu in ("B200", "GB200"):
        s = resolve_stack(gpu, pins(framework="pytorch"))
        assert s.kernel_modules == "open" and s.driver_packages == ("nvidia-open-580",)
        assert s.cuda == "12.8" and "open kernel modules" in s.reasons["kernel_modules"]
    assert resolve_stack("B200", pins(cuda="13.1")).driver_packages == ("nvidia-open=590.*",)
    with pytest.raises(UserError, match=r"driver 565 is too old for CUDA 12\.8"):
        resolve_stack("B200", pins(driver="565"))
    assert resolve_stack("V100").kernel_modules == "proprietary"


def test_new_gpu_rows_resolve() -> None:
    assert resolve_stack("H100-NVL").architecture == "Hopper"
    assert resolve_stack("T4G").compute_capability == "7.5"
    assert resolve_stack("V100-32GB").cudnn == "9.10"


def test_toolkit_only_when_asked() -> None:
    assert not resolve_stack("T4", pins(framework="pytorch")).cuda_toolkit
    asked = resolve_stack("T4", pins(framework="pytorch", cuda_toolkit=True))
    assert asked.cuda_toolkit and "stack.cuda_toolkit: true" in asked.reasons["cuda_toolkit"]
    assert resolve_stack("K80", pins(framework="tensorflow")).cuda_toolkit  # TF 2.11 loads system CUDA/cuDNN


def test_r580_end_of_life_is_june_2028() -> None:
    assert "June 2028" in resolve_stack("V100").reasons["driver"]
