"""A GPU the clouds do not sell is refused with the way that still works: the providers that reach
a machine of yours (with the YAML to write, which validates as written, and the example files that
do it), and the PyTorch the stack resolver gives that GPU there. `gpus` says in one line why its
rows are `-`. The README's headline job plans."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpucloud.errors import UserError
from gpucloud.plan.planner import make_plan
from gpucloud.plan.stacks import resolve_stack
from gpucloud.spec.load import StackSpec, parse_spec
from tests.support.cli import clean_env, cli
from tests.support.planner_oracle import job

REPO = Path(__file__).resolve().parents[2]


def refusal(gpu: str, cloud: list[str] | None = None) -> str:
    with pytest.raises(UserError) as info:
        make_plan(job(gpu=gpu, cloud=cloud) if cloud else job(gpu=gpu))
    return info.value.render()


def yaml_blocks(text: str) -> list[dict[str, object]]:
    """The indented `resources:` blocks of a refusal, parsed."""
    blocks = re.findall(r"^    resources:\n(?:^      .*\n?)+", text, flags=re.M)
    return [yaml.safe_load(re.sub(r"^    ", "", b, flags=re.M)) for b in blocks]


@pytest.mark.parametrize(("gpu", "cloud"), [("K80", ["aws"]), ("K80", ["azure"]), ("K40", None)])
def test_an_unsold_gpu_names_ssh_and_slurm_with_yaml_that_validates(gpu: str, cloud: list[str] | None) -> None:
    text = refusal(f"{gpu}:1", cloud)
    blocks = yaml_blocks(text)
    assert [b["resources"]["cloud"] for b in blocks] == ["ssh", "slurm"]  # type: ignore[index]
    for block in blocks:
        spec = parse_spec(yaml.safe_dump({"name": "old-gpu", "run": "nvidia-smi", **block}), "job.yaml")
        assert spec.resources.gpu is not None and spec.resources.gpu.model == gpu
    for example in re.findall(r"examples/[\w/.-]+\.yaml", text):
        assert (REPO / example).is_file(), example
    assert "examples/k80-ssh.yaml" in text and f"gpucloud stack {gpu}" in text


def test_the_k80_refusal_gives_the_stack_resolvers_pytorch() -> None:
    stack = resolve_stack("K80", StackSpec(framework="pytorch"))
    text = " ".join(refusal("K80:1", ["aws"]).split())
    assert f"PyTorch {stack.framework_version}+cu118" in text and "2.1.2+cu118" in text
    assert f"CUDA {stack.cuda}" in text and f"driver R{stack.driver}" in text
    assert "no official wheels" in " ".join(refusal("K40:1").split())  # K40: the resolver's refusal, not a guess


def test_gpus_says_why_rows_are_dashes() -> None:
    proc = cli("gpus", env=clean_env())
    assert proc.returncode == 0, proc.stderr
    dashes = [line.split()[0] for line in proc.stdout.splitlines() if re.match(r"^\S+\s+\d+\s+-\s+-\s+-\s*$", line)]
    assert {"K40", "P100", "P40"} <= set(dashes)
    note = " ".join(proc.stderr.split())
    assert "K40, P100, P40" in note and "rows of -" in note and "`cloud: ssh`" in note
    assert all(len(line) <= 80 for line in proc.stderr.splitlines())


def test_the_readme_headline_job_plans(tmp_path: Path) -> None:
    """The first job file a newcomer reads is one `plan` accepts (its workdir made, buckets unchecked)."""
    readme = (REPO / "README.md").read_text()
    text = readme.split("## A job file", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    spec = yaml.safe_load(text)
    (tmp_path / spec["workdir"]).mkdir()
    (tmp_path / "job.yaml").write_text(text)
    proc = cli("plan", "job.yaml", cwd=tmp_path, env=clean_env(HF_TOKEN="x"))
    assert proc.returncode == 0, proc.stderr
    assert spec["resources"]["gpu"].split(":")[0] in proc.stdout


@pytest.mark.parametrize(("cuda", "major"), [("11.8", "11"), ("12.4", "12")])
def test_the_cudnn_reason_names_the_package_it_installs(cuda: str, major: str) -> None:
    """`stack A100-80GB --cuda 11.8` once gave a reason naming cudnn9-cuda-12 while installing
    cudnn9-cuda-11: the reason and the package agree for every CUDA major."""
    stack = resolve_stack("A100-80GB", StackSpec(cuda=cuda))
    assert stack.cudnn_packages == (f"cudnn9-cuda-{major}",)
    other = {"11": "12", "12": "11"}[major]
    assert f"cudnn9-cuda-{major}" in stack.reasons["cudnn"] and f"cudnn9-cuda-{other}" not in stack.reasons["cudnn"]
