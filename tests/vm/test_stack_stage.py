"""The agent's stack stage (gpucloud/vm/agent/stack.py), run for real against the stub VM: the
kernel headers and branch lock before the driver, the pins that hold a branch, the fabric manager
pinned to the running driver, the GRID wait on a fake clock, and "check before install" for every
part (vendor images, baked images, a boot after a reboot) (docs/STACKS.md)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gpucloud.plan.images import resolve_node
from gpucloud.plan.stacks import resolve_stack
from gpucloud.spec.load import StackSpec
from gpucloud.vm.agent import stack
from gpucloud.vm.agent.gpu_check import gpu_tokens
from gpucloud.vm.agent.stack import GRID_POLL_S, stack_log_tail
from gpucloud.vm.agent.stage_api import StageFailed
from gpucloud.vm.job_env import stack_context
from tests.support.render_inputs import K80, T4
from tests.support.vm_sim import GPU_NAMES
from tests.vm.conftest import APT, APT_UPDATE, HEADERS, KERNEL, LOCK_580, STUBS, StubVm, candidate, config

K80_CFG = config(K80, "aws", "K80", 1, "p2.xlarge")
K80_STUB = {"STUB_GPU_NAME": "Tesla K80", "STUB_GPU_COUNT": "1"}
K80_TOOLKIT = APT + "cuda-toolkit-11-4 libcudnn8=8.2.4.*-1+cuda11.4"
K80_PIP = "python3 -m pip install --no-input torch==2.0.1 --index-url https://download.pytorch.org/whl/cu117"
DLAMI = {"STUB_DRIVER": "595.91.07", "STUB_PREINSTALLED": "cuda-keyring=1.1-1 nvidia-fabricmanager-595=595.91.07-1"}


def _run(vm: StubVm, cfg: dict) -> None:
    stack.run(cfg, vm.env(cfg))


def _fails(vm: StubVm, cfg: dict) -> str:
    with pytest.raises(StageFailed) as exc:
        _run(vm, cfg)
    return str(exc.value)


# ---- a whole install, then the same disk again --------------------------------------------------


def test_k80_installs_headers_first_then_driver_toolkit_and_wheel_then_nothing_again(tmp_path: Path) -> None:
    vm = StubVm(tmp_path, stub_env=dict(K80_STUB))
    _run(vm, K80_CFG)
    calls = vm.calls()
    assert any(c.startswith("dpkg -i ") and c.endswith("cuda-keyring.deb") for c in calls)
    assert vm.apt_installs() == [HEADERS, APT + "cuda-drivers-470", K80_TOOLKIT]
    assert calls.count(APT_UPDATE) == 1  # one update per run
    assert "modprobe nvidia" in calls
    assert vm.pip_installs() == [K80_PIP]
    assert "[gpucloud] pip install torch==2.0.1 --index-url https://download.pytorch.org/whl/cu117\n" in vm.log()
    assert (vm.state / "kmod").read_text().startswith("470.")

    # the same machine boots again (a reboot, or a baked image): every part is found, nothing installed
    (vm.state / "calls").unlink()
    again = StubVm(tmp_path, stub_env=dict(K80_STUB))
    _run(again, K80_CFG)
    assert not any(c.startswith(("apt-get", "dpkg -i")) or "pip install" in c for c in again.calls())
    assert "driver 470.256.02 already present" in again.log()
    assert "pytorch 2.0.1+stub already installed" in again.log()


def test_every_pinned_package_installed_skips_keyring_apt_and_pip(tmp_path: Path) -> None:
    """nvidia-smi reports another branch (so the fast path is not taken), but dpkg says every pinned
    package is installed at the pinned version: no keyring, no apt-get, no pip; modprobe still runs."""
    vm = StubVm(tmp_path, stub_env={"STUB_DRIVER": "535.1.1"}).preinstall(
        cuda_drivers_470="470.82.01-1", cuda_toolkit_11_4="11.4.4-1", libcudnn8="8.2.4.15-1+cuda11.4"
    )
    vm.preinstall(cuda_keyring="1.1-1")
    (vm.state / "py" / "torch").write_text("2.0.1+cu117")
    _run(vm, K80_CFG)
    assert not any(c.startswith(("apt-get", "dpkg -i")) or "pip install" in c for c in vm.calls())
    assert "modprobe nvidia" in vm.calls()
    assert "WARNING: driver 535.1.1 not in R470-R470" in vm.log()
    assert "pytorch 2.0.1+cu117 already installed" in vm.log()  # a local +cuXXX build is the version


def test_wrong_cudnn_version_is_reinstalled_and_a_present_keyring_is_kept(tmp_path: Path) -> None:
    vm = StubVm(tmp_path).preinstall(libcudnn8="8.9.7.29-1+cuda12.2", cuda_keyring="1.1-1")
    _run(vm, K80_CFG)
    assert vm.apt_installs() == [HEADERS, APT + "cuda-drivers-470", K80_TOOLKIT]
    assert not any(c.startswith("dpkg -i") for c in vm.calls())


def test_driver_of_the_branch_already_running_is_kept(tmp_path: Path) -> None:
    vm = StubVm(tmp_path, stub_env={"STUB_DRIVER": "470.82.01"}).preinstall(
        cuda_toolkit_11_4="11.4.4-1", libcudnn8="8.2.4.15-1+cuda11.4", cuda_keyring="1.1-1"
    )
    _run(vm, K80_CFG)
    assert vm.apt_installs() == [] and "modprobe nvidia" not in vm.calls()
    assert "[gpucloud] driver 470.82.01 already present\n" in vm.log()
    assert not vm.pins_file().exists()  # nothing installed: no lock written either


def test_a_boot_after_a_failed_or_interrupted_stack_installs_only_what_is_missing(tmp_path: Path) -> None:
    """The stage stopped after the driver and toolkit (here: pip failed; a reboot is the same): the
    next boot's stage (resumed) finds them and installs only the wheel."""
    vm = StubVm(tmp_path, stub_env=dict(K80_STUB))
    vm.override("python3", f'[[ "$*" == "-m pip install"* ]] && exit 1\nexec "{STUBS}/python3" "$@"\n')
    _fails(vm, K80_CFG)
    assert len(vm.apt_installs()) == 3
    (vm.state / "calls").unlink()
    (vm.tmp / "override" / "python3").unlink()
    env = vm.env(K80_CFG)
    env.resumed = True
    stack.run(K80_CFG, env)
    assert vm.apt_installs() == [] and not any(c.startswith("dpkg -i") for c in vm.calls())
    assert vm.pip_installs() == [K80_PIP]


# ---- driver branch pins -------------------------------------------------------------------------


def test_pins_file_holds_the_branch_before_the_driver(tmp_path: Path) -> None:
    vm = StubVm(tmp_path)
    _run(vm, K80_CFG)
    assert vm.pins_file().read_text() == (
        "Package: cuda-drivers* nvidia-* libnvidia-* libxnvctrl*\nPin: version 470.*\nPin-Priority: 1001\n"
    )


# (GPU, pins, instance, expected branch, driver package): every branch the stack table can choose or
# a job can pin, installed on plain Ubuntu from the fake repository.
CASES = [
    ("K80", {}, "p2.xlarge", "470", "cuda-drivers-470"),
    ("V100", {}, "p3dn.24xlarge", "580", "cuda-drivers-580"),
    ("T4", {"driver": "535"}, "g4dn.xlarge", "535", "cuda-drivers-535"),
    ("T4", {"driver": "570"}, "g4dn.xlarge", "570", "cuda-drivers-570"),
    ("T4", {}, "g4dn.xlarge", "580", "cuda-drivers-580"),
    ("T4", {"cuda": "13.1"}, "g4dn.xlarge", "590", "cuda-drivers=590.*"),
    ("B200", {}, "p6-b200.48xlarge", "580", "nvidia-open-580"),
    ("B200", {"cuda": "13.1"}, "p6-b200.48xlarge", "590", "nvidia-open=590.*"),
]


@pytest.mark.parametrize(("gpu", "pins", "instance", "branch", "package"), CASES, ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_installs_end_on_the_stacks_branch(
    tmp_path: Path, gpu: str, pins: dict[str, str], instance: str, branch: str, package: str
) -> None:
    """Resolved by the fake apt as apt would: without the headers first the DKMS build fails, and
    without the lock (preferences file, R580+ pinning package) the meta-package pulls a newer branch."""
    spec_stack = resolve_stack(gpu, StackSpec(framework="none", **pins))
    cfg = config(spec_stack, "aws", gpu, 1, instance, job_image="ami-0123456789abcdef0")  # plain image
    cfg["fabric_manager"] = False  # the fabric manager has its own tests
    vm = StubVm(tmp_path, stub_env={"STUB_GPU_NAME": GPU_NAMES[gpu]})
    _run(vm, cfg)
    lock = [f"nvidia-driver-pinning-{branch}"] if int(branch) >= 580 else []
    assert vm.apt_installs() == [APT + " ".join([f"linux-headers-{KERNEL}", *lock]), APT + package]
    modules = "nvidia-kernel-open-dkms" if package.startswith("nvidia-open") else "nvidia-kernel-dkms"
    built = {p.name for p in (vm.state / "pkgs").iterdir() if p.name.startswith("nvidia-kernel-")}
    assert built == {modules}, built  # Blackwell: the open modules only
    assert (vm.state / "kmod").read_text().split(".")[0] == branch
    prefs = vm.pins_file().read_text()
    assert f"Pin: version {branch}.*" in prefs and "Pin-Priority: 1001" in prefs


def test_apt_ending_on_another_branch_fails_the_stage(tmp_path: Path) -> None:
    vm = StubVm(tmp_path, stub_env={"STUB_APT_REPO": ""})  # plain stub apt: marks packages installed
    (vm.state / "driver").write_text("595.71.05")  # ... and the module that loads is R595's
    message = _fails(vm, K80_CFG)
    assert message == "stack install failed (driver 470, CUDA 11.4); stack.log tail above"
    assert "[gpucloud] apt installed driver 595.71.05, not R470-R470\n" in vm.log()
    assert vm.apt_installs() == [HEADERS, APT + "cuda-drivers-470"]  # nothing after the failed driver


def test_first_boot_apt_lock_and_a_flaky_mirror_are_waited_out(tmp_path: Path) -> None:
    """cloud-init's own apt holds the lists lock for the first two calls (apt fails at once: the
    DPkg lock timeout does not cover it), then the mirror fails two updates (apt exits 0 with
    "Failed to fetch"): the stage waits with backoff on the agent's clock and installs the stack."""
    vm = StubVm(tmp_path, stub_env={**K80_STUB, "STUB_APT_LOCKED": "2", "STUB_APT_MIRROR_FAILS": "2"})
    _run(vm, K80_CFG)
    assert vm.apt_installs()[-1] == K80_TOOLKIT
    assert vm.calls().count(APT_UPDATE) == 5  # 2 locked, 2 with a failed fetch, then the one that counts
    assert vm.clock.sleeps[:4] == list(stack.APT_BACKOFF_S[:4])
    assert "apt-get update: Could not get lock; trying again in 5 s" in vm.log()
    assert "apt-get update: Temporary failure resolving; trying again in 20 s" in vm.log()


def test_a_held_apt_lock_is_waited_for_and_named_in_the_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another apt holds apt's locks as the stage starts (dpkg -i has no lock timeout at all): the
    stage polls on the agent's clock until it is free and says whom it waits for while it waits
    (tests/guest/test_guest_chroot_apt.py does it with the guest's real apt and dpkg)."""
    holders = iter(["pid 4242 (apt-get)"] * 3)
    monkeypatch.setattr(stack, "lock_holder", lambda paths: next(holders, ""))
    notes: list[str] = []
    vm = StubVm(tmp_path, stub_env=dict(K80_STUB))
    stack.run(K80_CFG, replace(vm.env(K80_CFG), note=notes.append))
    assert notes == ["stack: waiting for apt's lock, held by pid 4242 (apt-get)", ""]
    assert "apt is busy: pid 4242 (apt-get) holds its lock; waiting up to 600 s" in vm.log()
    assert vm.clock.sleeps[:2] == [stack.LOCK_POLL_S] * 2 and "apt's lock is free" in vm.log()


def test_lock_holder_names_the_process_that_holds_the_lock(tmp_path: Path) -> None:
    lock = tmp_path / "lock-frontend"
    lock.touch()
    hold = "import fcntl, sys, time\nf = open(sys.argv[1], 'a')\nfcntl.lockf(f, fcntl.LOCK_EX)\nprint(1, flush=True)\n"
    hold += "time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", hold, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline()
        assert stack.lock_holder([str(lock)]).startswith(f"pid {child.pid} (python")
    finally:
        child.kill()
        child.wait()
    assert stack.lock_holder([str(lock)]) == ""


def test_apt_that_stays_locked_fails_by_its_bound(tmp_path: Path) -> None:
    vm = StubVm(tmp_path, stub_env={**K80_STUB, "STUB_APT_LOCKED": "1000"})
    assert "stack install failed" in _fails(vm, K80_CFG)
    assert vm.clock.sleeps == list(stack.APT_BACKOFF_S)  # about 10 minutes, then the stage fails
    assert "Could not get lock" in stack_log_tail(vm.env(K80_CFG))


def test_apt_failure_fails_the_stage_with_the_stack_log_tail(tmp_path: Path) -> None:
    vm = StubVm(tmp_path, stub_env={"STUB_APT_FAIL": "1"})
    assert _fails(vm, K80_CFG) == "stack install failed (driver 470, CUDA 11.4); stack.log tail above"
    assert "E: stub apt failure" in stack_log_tail(vm.env(K80_CFG))
    assert not vm.pip_installs()


def test_stack_log_tail_is_the_last_30_lines(tmp_path: Path) -> None:
    vm = StubVm(tmp_path)
    env = vm.env(K80_CFG)
    assert stack_log_tail(env) == ""
    env.stack_log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert stack_log_tail(env) == "".join(f"line {i}\n" for i in range(70, 100))
    assert stack_log_tail(env, 2) == "line 98\nline 99\n"


def test_missing_keyring_download_fails_before_any_apt(tmp_path: Path) -> None:
    vm = StubVm(tmp_path, stub_env={"GPUCLOUD_NVIDIA_REPO": (tmp_path / "nowhere").as_uri()})
    _fails(vm, K80_CFG)
    assert not any(c.startswith(("apt-get", "dpkg -i")) for c in vm.calls())


def test_keyring_comes_from_the_stacks_repository_and_arch(tmp_path: Path) -> None:
    cfg = {**K80_CFG, "repo_arch": "sbsa"}
    vm = StubVm(tmp_path)
    env = vm.env(cfg)  # the fake mirror has the keyring under ubuntu2004/sbsa only
    stack.run(cfg, env)
    assert any(c.startswith("dpkg -i ") for c in vm.calls())
    other = StubVm(tmp_path / "other")
    env = other.env(cfg)
    with pytest.raises(StageFailed):
        stack.run({**cfg, "repo_arch": "x86_64"}, env)
    assert not any(c.startswith(("apt-get", "dpkg -i")) for c in other.calls())


# ---- fabric manager -----------------------------------------------------------------------------


def _p4d(job_image: str) -> dict:
    return config(
        resolve_stack("A100-40GB", StackSpec(framework="none")),
        "aws",
        "A100-40GB",
        8,
        "p4d.24xlarge",
        job_image=job_image,
    )


def test_fabric_manager_on_plain_ubuntu_is_pinned_to_the_installed_driver(tmp_path: Path) -> None:
    cfg = _p4d("ami-0123456789abcdef0")
    assert cfg["fabric_manager"] is True
    vm = StubVm(tmp_path)
    _run(vm, cfg)
    assert vm.apt_installs() == [LOCK_580, APT + "cuda-drivers-580", APT + "nvidia-fabricmanager-580=580.105.08-*"]
    assert "systemctl enable --now nvidia-fabricmanager" in vm.calls()
    assert "[gpucloud] fabric manager 580.105.08 running\n" in vm.log()


def test_fabric_manager_of_the_vendor_image_is_only_started(tmp_path: Path) -> None:
    vm = StubVm(tmp_path, stub_env=dict(DLAMI))
    _run(vm, _p4d("auto"))
    assert vm.apt_installs() == [] and "systemctl enable --now nvidia-fabricmanager" in vm.calls()
    assert "driver 595.91.07 already present" in vm.log()


@pytest.mark.parametrize(
    ("driver", "preinstalled", "install"),
    [
        ("590.44.01", "", "nvidia-fabricmanager=590.44.01-*"),  # from R590: no branch suffix
        ("580.105.08", "", "nvidia-fabricmanager-580=580.105.08-*"),
        ("590.44.01", "nvidia-fabricmanager=590.44.01-1", None),  # R590's unsuffixed one is found too
        ("590.44.01", "nvidia-fabricmanager=580.105.08-1", "nvidia-fabricmanager=590.44.01-*"),  # wrong version
    ],
)
def test_fabric_manager_naming_follows_the_driver(
    tmp_path: Path, driver: str, preinstalled: str, install: str | None
) -> None:
    cfg = _p4d("ami-0123456789abcdef0")
    vm = StubVm(tmp_path, stub_env={"STUB_DRIVER": driver, "STUB_PREINSTALLED": f"cuda-keyring=1.1-1 {preinstalled}"})
    _run(vm, cfg)
    assert vm.apt_installs() == ([APT + install] if install else [])


def test_fabric_manager_that_does_not_start_fails_the_stage(tmp_path: Path) -> None:
    vm = StubVm(tmp_path, stub_env=dict(DLAMI))
    vm.override("systemctl", "exit 1\n")
    _fails(vm, _p4d("auto"))
    assert "[gpucloud] fabric manager did not start\n" in vm.log()


# ---- GRID: the cloud's extension installs the driver --------------------------------------------


def _grid() -> dict:
    return config(resolve_stack("A10", StackSpec(framework="none")), "azure", "A10", 1, "Standard_NV36ads_A10_v5")


def test_grid_driver_already_there_is_used(tmp_path: Path) -> None:
    vm = StubVm(tmp_path, stub_env={"STUB_DRIVER": "550.144.06"})
    cfg = _grid()
    assert cfg["driver_source"] == "grid" and cfg["driver_packages"] == []
    _run(vm, cfg)
    assert "waiting for the GRID driver of the cloud's extension" in vm.log()
    assert vm.apt_installs() == [] and vm.clock.sleeps == []


def test_grid_driver_that_appears_later_is_waited_for(tmp_path: Path) -> None:
    vm = StubVm(tmp_path)
    vm.clock.on_sleep = lambda n: (vm.state / "driver").write_text("550.144.06") if n == 3 else None
    _run(vm, _grid())
    assert vm.clock.sleeps == [GRID_POLL_S] * 3 and vm.apt_installs() == []
    assert "WARNING" not in vm.log()


def test_no_grid_driver_fails_after_the_wait_and_never_installs_one(tmp_path: Path) -> None:
    vm = StubVm(tmp_path, stub_env={"GPUCLOUD_GRID_WAIT_S": "3"})
    start = vm.clock.t
    _fails(vm, _grid())
    assert "[gpucloud] no GRID driver after 3s\n" in vm.log()
    assert vm.clock.t - start >= 3 and len(vm.clock.sleeps) == 3
    assert vm.apt_installs() == []  # never cuda-drivers on a GRID VM


def test_grid_wait_is_20_minutes_by_default(tmp_path: Path) -> None:
    vm = StubVm(tmp_path)
    vm.clock.step = 400.0  # a slow clock: three polls cover the default wait
    start = vm.clock.t
    _fails(vm, _grid())
    assert "no GRID driver after 1200s" in vm.log() and vm.clock.t - start == 1200


def test_grid_wait_ends_when_the_run_must_stop(tmp_path: Path) -> None:
    vm = StubVm(tmp_path)
    vm.clock.stop_after = 2
    _fails(vm, _grid())
    assert len(vm.clock.sleeps) == 2 and "no GRID driver" not in vm.log()


# ---- toolkit, cuDNN and framework ---------------------------------------------------------------


def test_toolkit_found_by_its_cuda_folder(tmp_path: Path) -> None:
    vm = StubVm(tmp_path, stub_env={"STUB_DRIVER": "470.82.01"})
    (vm.cuda_root / "cuda-11.4").mkdir(parents=True)
    _run(vm, K80_CFG)
    assert vm.apt_installs() == [APT + "libcudnn8=8.2.4.*-1+cuda11.4"]
    assert not any(c.startswith("nvcc") for c in vm.calls())  # the folder is enough


def test_toolkit_found_by_nvcc_release(tmp_path: Path) -> None:
    vm = StubVm(tmp_path, stub_env={"STUB_DRIVER": "470.82.01"}).preinstall(cuda_toolkit_11_4="11.4.4-1")
    _run(vm, K80_CFG)
    assert "nvcc --version" in vm.calls()
    assert vm.apt_installs() == [APT + "libcudnn8=8.2.4.*-1+cuda11.4"]


def test_nvcc_of_another_release_installs_the_toolkit(tmp_path: Path) -> None:
    vm = StubVm(tmp_path, stub_env={"STUB_DRIVER": "470.82.01"}).preinstall(
        cuda_toolkit_12_2="12.2.2-1", libcudnn8="8.2.4.15-1+cuda11.4"
    )
    _run(vm, K80_CFG)
    assert vm.apt_installs() == [APT + "cuda-toolkit-11-4"]


def test_no_toolkit_stage_when_the_wheel_brings_cuda(tmp_path: Path) -> None:
    cfg = config(T4, "azure", "T4", 1, "Standard_NC4as_T4_v3")
    assert cfg["cuda_packages"] == [] and cfg["cudnn_packages"] == []
    vm = StubVm(tmp_path, stub_env={"STUB_GPU_NAME": "Tesla T4"})
    _run(vm, cfg)
    assert vm.apt_installs() == [LOCK_580, APT + "cuda-drivers-580"]
    assert not any(c.startswith("nvcc") for c in vm.calls())
    assert [c.split(" --index-url")[0] for c in vm.pip_installs()] == ["python3 -m pip install --no-input torch==2.7.1"]


@pytest.mark.parametrize(
    ("have", "installs"), [("2.0.1", False), ("2.0.1+cu117", False), ("2.0.10", True), ("1.13.1", True)]
)
def test_framework_version_check(tmp_path: Path, have: str, installs: bool) -> None:
    vm = StubVm(tmp_path, stub_env={"STUB_DRIVER": "470.82.01"}).preinstall(
        cuda_toolkit_11_4="11.4.4-1", libcudnn8="8.2.4.15-1+cuda11.4"
    )
    (vm.state / "py" / "torch").write_text(have)
    _run(vm, K80_CFG)
    assert vm.pip_installs() == ([K80_PIP] if installs else [])
    assert (f"pytorch {have} already installed" in vm.log()) is not installs


def test_missing_pip_comes_from_apt(tmp_path: Path) -> None:
    vm = StubVm(tmp_path, stub_env={"STUB_DRIVER": "470.82.01"}).preinstall(
        cuda_toolkit_11_4="11.4.4-1", libcudnn8="8.2.4.15-1+cuda11.4"
    )
    vm.override("python3", f'[[ "$*" == "-m pip --version" ]] && exit 1\nexec "{STUBS}/python3" "$@"\n')
    _run(vm, K80_CFG)
    calls = [c for c in vm.calls() if c.startswith(("apt-get", "python3 -m pip install"))]
    assert calls == [APT_UPDATE, APT + "python3-pip", K80_PIP]


def test_pip_failure_fails_the_stage(tmp_path: Path) -> None:
    vm = StubVm(tmp_path, stub_env={"STUB_DRIVER": "470.82.01", "STUB_PIP_RC": "1"}).preinstall(
        cuda_toolkit_11_4="11.4.4-1", libcudnn8="8.2.4.15-1+cuda11.4"
    )
    assert _fails(vm, K80_CFG).startswith("stack install failed (driver 470, CUDA 11.4)")
    assert vm.pip_installs() == [K80_PIP]


def test_tensorflow_version_is_read_from_tf(tmp_path: Path) -> None:
    cfg = {**K80_CFG, "framework": "tensorflow", "framework_version": "2.11.0", "framework_pip": ["tensorflow==2.11.0"]}
    vm = StubVm(tmp_path, stub_env={"STUB_DRIVER": "470.82.01"}).preinstall(
        cuda_toolkit_11_4="11.4.4-1", libcudnn8="8.2.4.15-1+cuda11.4"
    )
    _run(vm, cfg)
    assert vm.pip_installs() == ["python3 -m pip install --no-input tensorflow==2.11.0"]
    _run(vm, cfg)
    assert "tensorflow 2.11.0 already installed" in vm.log() and len(vm.pip_installs()) == 1


# ---- providers whose host brings its own stack, and machines without a GPU ----------------------


def test_host_stack_is_never_touched(tmp_path: Path) -> None:
    cfg = config(K80, "ssh", "K80", 1, "host")
    assert cfg["skip_stack"] is True and cfg["gpu_check"] == "warn"
    vm = StubVm(tmp_path)
    _run(vm, cfg)
    assert vm.calls() == []
    assert vm.log() == "[gpucloud] stack install skipped on this provider (driver and CUDA are the host's)\n"


def test_cpu_machine_installs_nothing(tmp_path: Path) -> None:
    from tests.support.render_inputs import CPU

    cfg = config(CPU, "aws", "", 0, "m5.large")
    assert cfg["driver_source"] == "none" and cfg["gpu_count"] == 0
    vm = StubVm(tmp_path)
    _run(vm, cfg)
    assert vm.calls() == [] and vm.lines == []


# ---- the config the CLI builds ------------------------------------------------------------------


def test_config_is_the_nodes_stack_context_plus_the_gpu_and_framework() -> None:
    k80_stack = resolve_stack("K80", StackSpec(framework="pytorch"))
    cand = candidate("aws", "A100-80GB", 8, "p4de.24xlarge")
    node = resolve_node(k80_stack, "aws", "p2.xlarge", 1)
    from gpucloud.contract.registry import capabilities
    from gpucloud.vm.stack_config import stack_config

    cfg = stack_config(node, k80_stack, cand, capabilities("aws"))
    assert {k: cfg[k] for k in stack_context(node)} == stack_context(node)
    assert cfg["gpu_tokens"] == gpu_tokens("A100-80GB") == ["A100", "80GB"] and cfg["gpu_count"] == 8
    assert (cfg["driver"], cfg["cuda"], cfg["cuda_repo"]) == ("470", k80_stack.cuda, "ubuntu2004")
    assert cfg["framework_pip"][0] == "torch==2.1.2" and cfg["framework_version"] == "2.1.2"
    assert cfg["skip_stack"] is False and cfg["gpu_check"] == "strict"
    import json

    assert json.loads(json.dumps(cfg)) == cfg  # it travels as JSON


def test_config_of_open_modules_arm64_and_vendor_images() -> None:
    b200 = config(resolve_stack("B200", StackSpec(framework="pytorch")), "aws", "B200", 8, "p6-b200.48xlarge")
    assert b200["driver_packages"] == ["nvidia-open-580"] and b200["driver_lock"] == ["nvidia-driver-pinning-580"]
    assert b200["fabric_manager"] is True
    assert b200["driver_min"] == 570
    arm = config(resolve_stack("T4G", StackSpec(framework="pytorch")), "aws", "T4G", 1, "g5g.xlarge", arch="arm64")
    assert arm["repo_arch"] == "sbsa" and arm["image_name"] == "dlami-base-oss-arm64"
    toolkit = config(
        resolve_stack("T4", StackSpec(framework="pytorch", cuda_toolkit=True)), "aws", "T4", 1, "g4dn.xlarge"
    )
    assert toolkit["cuda_packages"] == ["cuda-toolkit-12-8"] and toolkit["cudnn_packages"] == ["cudnn9-cuda-12"]
    t4 = config(resolve_stack("T4", StackSpec(framework="pytorch")), "aws", "T4", 1, "g4dn.xlarge")
    assert t4["image_name"] == "dlami-base-oss" and t4["cuda_packages"] == [] and t4["driver_min"] == 570
    none = config(resolve_stack("T4", StackSpec(framework="none")), "aws", "T4", 1, "g4dn.xlarge")
    assert none["framework"] == "none" and none["framework_pip"] == []


def test_config_pins_the_stack_exactly() -> None:
    """The values the stacks pin (tests/support/render_inputs.py) reach the stages unchanged."""
    from tests.support.render_inputs import A100_TF

    k80 = K80_CFG
    assert (k80["driver_packages"], k80["driver_min"], k80["driver_max"]) == (["cuda-drivers-470"], 470, 470)
    assert k80["cuda_packages"] == ["cuda-toolkit-11-4"] and k80["cudnn_packages"] == ["libcudnn8=8.2.4.*-1+cuda11.4"]
    assert k80["framework_pip"] == ["torch==2.0.1", "--index-url", "https://download.pytorch.org/whl/cu117"]
    assert k80["cuda_repo"] == "ubuntu2004"
    tf = config(A100_TF, "azure", "A100-80GB", 8, "Standard_ND96amsr_A100_v4")
    assert (tf["framework"], tf["gpu_tokens"], tf["gpu_count"]) == ("tensorflow", ["A100", "80GB"], 8)
