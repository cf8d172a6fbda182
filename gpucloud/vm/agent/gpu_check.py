"""The gpu_verify stage: nvidia-smi must show the GPUs the catalog promised, and the framework must
see them, so that a driver/wheel mismatch never trains on the CPU unnoticed.

Strict (clouds): a wrong model or count, or a framework that sees fewer GPUs, fails the run.
Warn (local and SSH hosts, whose hardware the user brought): a mismatch is a warning, a host with
no GPU runs the job on the CPU, and a framework that is not importable is not checked.
`cfg` is the JSON object `gpucloud/vm/stack_config.py` builds. Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import re
from typing import Any, List, Mapping, Sequence

from gpucloud.vm.agent.stack import framework_print, run_quiet
from gpucloud.vm.agent.stage_api import StageEnv, StageFailed

FRAMEWORK_LABEL = {"pytorch": "PyTorch", "tensorflow": "TensorFlow"}


def gpu_tokens(model: str) -> List[str]:
    """Tokens that must all appear (as whole words) in nvidia-smi's name for the catalog model:
    "A100-80GB" -> ["A100", "80GB"] matches "NVIDIA A100-SXM4-80GB"; "A10" does not match "A10G"."""
    return [t for t in re.split(r"[^A-Z0-9]+", model.upper()) if t]


def matches_model(name: str, tokens: Sequence[str]) -> bool:
    """Every catalog token appears as a whole word of the upper-cased nvidia-smi name
    ("A10" matches "NVIDIA A10" but not "NVIDIA A10G")."""
    padded = f" {name.upper()} "
    return all(re.search(f"[^A-Z0-9]{re.escape(token)}[^A-Z0-9]", padded) for token in tokens)


def gpu_names(env: StageEnv) -> str:
    """nvidia-smi's GPU names, one a line ("" when nvidia-smi fails or is missing)."""
    out = run_quiet(env, ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], to_stack_log=False)
    return out.stdout.rstrip("\n") if out.returncode == 0 else ""


def run(cfg: Mapping[str, Any], env: StageEnv) -> None:
    """The gpu_verify stage; raises StageFailed with the status line where the run must not go on."""
    want = int(cfg.get("gpu_count") or 0)
    model, strict = str(cfg.get("gpu_model") or ""), cfg.get("gpu_check") == "strict"
    if want == 0:
        env.log("no GPU requested")
        return
    names = gpu_names(env)
    listed = [line for line in names.split("\n") if line]
    matching = sum(1 for line in listed if matches_model(line, cfg.get("gpu_tokens") or []))
    msg = f"nvidia-smi shows {matching} x {model}, expected {want} (found: {names.replace(chr(10), ', ')})"
    if matching != want:
        if strict:
            raise StageFailed(f"GPU check failed: {msg}")
        if not listed:
            env.log(f"WARNING: no NVIDIA GPU on this host (expected {want} x {model}): the job runs on the CPU")
            return
        env.log(f"WARNING: {msg}")
    framework = str(cfg.get("framework") or "none")
    if framework not in FRAMEWORK_LABEL:
        return
    expected = str(want if strict else len(listed))
    got = framework_print(env, framework, "torch.cuda.device_count()", 'len(tf.config.list_physical_devices("GPU"))')
    label = FRAMEWORK_LABEL[framework]
    if got != expected:
        if not got and not strict:
            env.log(f"WARNING: {label} is not importable here; GPU visibility not checked")
            return
        raise StageFailed(
            f"{label} sees {got or 'no'} GPUs, expected {expected}: driver/wheel mismatch (driver "
            f"{cfg.get('driver', '')}, CUDA {cfg.get('cuda', '')}, {label} {cfg.get('framework_version') or ''}); "
            "refusing to train on the CPU"
        )
    env.log(f"{label} sees {got} GPU(s)")
