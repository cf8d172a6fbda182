"""GPU architecture -> driver / CUDA / cuDNN / OS image / framework, with pin validation.

OWNER: catalog+stacks helper. The Stack dataclass is a contract used by planner, render and the
providers; keep its attribute names. `resolve_stack` is to be implemented here (FACTS.md section 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Stack:
    gpu: str                      # canonical GPU name, e.g. "K80"
    architecture: str             # "Kepler"
    compute_capability: str       # "3.7"
    driver: str                   # branch, e.g. "470"
    cuda: str                     # "11.4"
    cudnn: str                    # "8.2.4"
    os_image: str                 # "ubuntu-20.04"
    framework: str                # "pytorch" | "tensorflow" | "none"
    framework_version: str | None  # "2.0.1" (None when framework is none)
    # What the VM-side installer needs (Ubuntu/apt names, exact pins):
    ubuntu_version: str           # "20.04"
    cuda_repo: str                # "ubuntu2004" (path part of NVIDIA's apt repository)
    driver_packages: tuple[str, ...]   # e.g. ("cuda-drivers-470",)
    cuda_packages: tuple[str, ...]     # e.g. ("cuda-toolkit-11-4",)
    cudnn_packages: tuple[str, ...]    # e.g. ("libcudnn8=8.2.4.*-1+cuda11.4",)
    framework_pip: tuple[str, ...]     # pip args, e.g. ("torch==2.0.1", "--index-url", "https://download.pytorch.org/whl/cu117")
    min_driver_version: str       # lowest driver that runs this CUDA, e.g. "470.82.01"
    reasons: dict[str, str] = field(default_factory=dict)  # per key above: why it was chosen
    warnings: tuple[str, ...] = ()

    def as_json(self) -> dict[str, object]:
        """The `stack` object of `plan --json` / `stack --json` (DESIGN.md section 4)."""
        return {
            "gpu": self.gpu,
            "architecture": self.architecture,
            "driver": self.driver,
            "cuda": self.cuda,
            "cudnn": self.cudnn,
            "os_image": self.os_image,
            "framework": self.framework if self.framework == "none" else f"{self.framework}=={self.framework_version}",
        }
