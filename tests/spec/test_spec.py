"""The job file (gpucloud/spec/load.py): every friendly input form parses to its canonical value, and every
bad job file gives one clear SpecError naming the file, the line and the dotted field, with the
expected value or a "did you mean" -- never a traceback, also through the real CLI (exit 2)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucloud.errors import UserError
from gpucloud.spec.load import (
    GpuRequest,
    JobSpec,
    Resources,
    SpecError,
    StackSpec,
    json_schema,
    load_spec,
    parse_duration,
    parse_spec,
)
from gpucloud.spec.schema import HIDDEN
from tests.support.cli import ci_env, cli
from tests.support.text import flat

REPO = Path(__file__).resolve().parents[2]

# The documented example job file (every key, with comments: they must not disturb parsing or line numbers).
DESIGN_EXAMPLE = """\
name: mnist-k80                 # [a-z0-9-], 1..40 chars; used in tags and resource names
resources:
  cloud: aws                    # aws | azure | local | [aws, azure] | any (default any)
  regions: [us-east-1]          # optional filter
  gpu: K80:1                    # MODEL:COUNT per node; or instance_type: p2.xlarge
  spot: false                   # false | true | auto (auto = spot if cheaper, fall back)
  max_price_per_hour: 2.0       # optional, per node
  min_vcpus: 4                  # optional; min_memory_gib likewise
  disk_gb: 100
num_nodes: 1
stack:                          # all optional: resolved from the GPU when absent
  driver: auto                  # or a branch, e.g. "470"
  cuda: auto                    # or "11.4"; validated against the GPU architecture
  cudnn: auto
  framework: pytorch            # pytorch | tensorflow | none; version auto or pinned
image: auto                     # or ami-..., or an Azure image URN
workdir: .                      # uploaded to the VM (respecting .gitignore); size-capped
env: {EPOCHS: "5"}
setup: pip install -r requirements.txt
run: python train.py --epochs $EPOCHS
artifacts: [outputs/, metrics.json]   # brought back to ./gpucloud-runs/<run-id>/
max_duration: 6h                # hard deadline: the VM ends itself when it passes
"""

MINIMAL = "name: tiny\nresources: {gpu: T4}\nrun: python train.py\n"

# Lines 1-4 of most bad files below: a valid job, so that each case has exactly one problem.
BASE = "name: job\nresources:\n  gpu: K80:1\nrun: python train.py\n"


def write(tmp_path: Path, text: str | bytes, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def spec_error(path: Path) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return info.value


def with_resources(*lines: str, extra: str = "") -> str:
    """name + a resources section (gpu K80:1 first, then `lines`) + run, then `extra` top-level lines."""
    body = "".join(f"  {line}\n" for line in lines)
    return f"name: job\nresources:\n  gpu: K80:1\n{body}run: python train.py\n{extra}"


def with_stack(*lines: str) -> str:
    body = "".join(f"  {line}\n" for line in lines)
    return f"name: job\nresources:\n  gpu: K80:1\nstack:\n{body}run: python train.py\n"


# ---------------------------------------------------------------------------------------------
# Good job files


def test_design_example_parses_to_canonical_values(tmp_path: Path) -> None:
    path = write(tmp_path, DESIGN_EXAMPLE)
    spec = load_spec(path)
    assert isinstance(spec, JobSpec)
    assert spec.name == "mnist-k80"
    res = spec.resources
    assert isinstance(res, Resources)
    assert res.cloud == ["aws"]
    assert res.regions == ["us-east-1"]
    assert isinstance(res.gpu, GpuRequest)
    assert (res.gpu.model, res.gpu.count) == ("K80", 1)
    assert res.instance_type is None
    assert res.spot is False
    assert res.max_price_per_hour == 2.0
    assert res.min_vcpus == 4 and res.min_memory_gib is None
    assert res.disk_gb == 100
    assert spec.num_nodes == 1
    assert isinstance(spec.stack, StackSpec)
    assert (spec.stack.driver, spec.stack.cuda, spec.stack.cudnn) == ("auto", "auto", "auto")
    assert (spec.stack.framework, spec.stack.framework_version) == ("pytorch", "auto")
    assert spec.image == "auto"
    assert spec.workdir == "."
    assert spec.env == {"EPOCHS": "5"}
    assert spec.setup == "pip install -r requirements.txt"
    assert spec.run == "python train.py --epochs $EPOCHS"
    assert spec.artifacts == ["outputs/", "metrics.json"]
    assert spec.max_duration == 6 * 3600
    assert spec.source == path.resolve()
    # parse_spec gives the same job (no source); `source` is not part of the dumped format
    same = parse_spec(DESIGN_EXAMPLE, "design.yaml")
    assert same.source is None
    assert same.model_dump() == spec.model_dump()
    assert "source" not in spec.model_dump()


def test_minimal_spec_gets_the_documented_defaults() -> None:
    spec = parse_spec(MINIMAL, "min.yaml")
    assert spec.name == "tiny" and spec.run == "python train.py"
    assert spec.resources.cloud == ["aws", "azure"]  # default "any"
    assert spec.resources.gpu == GpuRequest(model="T4", count=1)
    assert spec.resources.regions is None
    assert spec.resources.spot is False
    assert spec.resources.disk_gb == 100
    assert spec.resources.ssh is False
    assert spec.num_nodes == 1
    assert spec.stack == StackSpec(driver="auto", cuda="auto", cudnn="auto", framework="none", framework_version="auto")
    assert spec.image == "auto" and spec.workdir == "."
    assert spec.env == {} and spec.setup is None and spec.artifacts == []
    assert spec.max_duration == 6 * 3600
    assert spec.source is None


@pytest.mark.parametrize(
    ("gpu", "model", "count"),
    [
        ("K80:1", "K80", 1),
        ("k80", "K80", 1),
        ("A100-80GB:8", "A100-80GB", 8),
        ("tesla k80", "K80", 1),
        ("'t4 : 2'", "T4", 2),
        ("a100:4", "A100", 4),  # a family name: every memory variant (docs/CATALOG.md)
        ("{model: k80, count: 2}", "K80", 2),
        ("{model: H100}", "H100", 1),
        ("\n    model: A100-80GB\n    count: 8", "A100-80GB", 8),
    ],
    ids=[
        "K80:1",
        "k80",
        "A100-80GB:8",
        "tesla-k80",
        "spaces",
        "alias-a100",
        "mapping",
        "mapping-no-count",
        "block-mapping",
    ],
)
def test_gpu_input_forms(gpu: str, model: str, count: int) -> None:
    spec = parse_spec(f"name: job\nresources:\n  gpu: {gpu}\nrun: x\n", "job.yaml")
    assert spec.resources.gpu == GpuRequest(model=model, count=count)


def test_instance_type_instead_of_gpu() -> None:
    spec = parse_spec("name: job\nresources:\n  instance_type: p2.xlarge\nrun: x\n", "job.yaml")
    assert spec.resources.gpu is None
    assert spec.resources.instance_type == "p2.xlarge"


@pytest.mark.parametrize(
    ("cloud", "expected"),
    [
        ("any", ["aws", "azure"]),
        ("aws", ["aws"]),
        ("azure", ["azure"]),
        ("[aws, azure]", ["aws", "azure"]),
        ("[azure, aws]", ["azure", "aws"]),  # order kept
        ("[AWS, any, aws]", ["aws", "azure"]),  # case-insensitive, deduplicated
        ("local", ["local"]),
        ("[local, aws]", ["local", "aws"]),
    ],
)
def test_cloud_input_forms(cloud: str, expected: list[str]) -> None:
    spec = parse_spec(f"name: job\nresources:\n  cloud: {cloud}\n  gpu: K80:1\nrun: x\n", "job.yaml")
    assert spec.resources.cloud == expected


def test_local_job_needs_no_gpu() -> None:
    spec = parse_spec("name: job\nresources:\n  cloud: local\nrun: echo hi\n", "job.yaml")
    assert spec.resources.cloud == ["local"]
    assert spec.resources.gpu is None and spec.resources.instance_type is None


def test_regions_single_string_and_case() -> None:
    spec = parse_spec(with_resources("regions: US-East-1"), "job.yaml")
    assert spec.resources.regions == ["us-east-1"]
    spec = parse_spec(with_resources("regions: [eastus, us-west-2, eastus]"), "job.yaml")
    assert spec.resources.regions == ["eastus", "us-west-2"]


@pytest.mark.parametrize(
    ("spot", "expected"),
    [("false", False), ("true", True), ("auto", "auto"), ("AUTO", "auto"), ("'yes'", True), ("'off'", False)],
)
def test_spot_forms(spot: str, expected: bool | str) -> None:
    assert parse_spec(with_resources(f"spot: {spot}"), "job.yaml").resources.spot == expected


@pytest.mark.parametrize(
    ("duration", "seconds"),
    [
        ("90m", 90 * 60),
        ("6h", 6 * 3600),
        ("2d", 2 * 86400),
        ("1h30m", 90 * 60),
        ("'1h 30m'", 90 * 60),
        ("45s", 45),
        ("3600", 3600),
        ("'3600'", 3600),
        ("1", 1),  # the minimum
        ("30d", 30 * 86400),  # the maximum
        ("1d2h3m4s", 86400 + 2 * 3600 + 3 * 60 + 4),
    ],
)
def test_duration_forms(duration: str, seconds: int) -> None:
    spec = parse_spec(BASE + f"max_duration: {duration}\n", "job.yaml")
    assert spec.max_duration == seconds
    assert isinstance(spec.max_duration, int)


def test_parse_duration_directly() -> None:
    assert parse_duration("90m") == 5400
    assert parse_duration(" 6H ") == 21600
    assert parse_duration(3600) == 3600
    assert parse_duration("2d") == 172800


@pytest.mark.parametrize(
    ("framework", "name", "version"),
    [
        ("pytorch", "pytorch", "auto"),
        ("pytorch==2.0.1", "pytorch", "2.0.1"),
        ("'PyTorch == 2.1.0'", "pytorch", "2.1.0"),
        ("tensorflow==2.13.0", "tensorflow", "2.13.0"),
        ("none", "none", "auto"),
    ],
)
def test_framework_forms(framework: str, name: str, version: str) -> None:
    spec = parse_spec(with_stack(f"framework: {framework}"), "job.yaml")
    assert (spec.stack.framework, spec.stack.framework_version) == (name, version)


def test_framework_pin_and_matching_framework_version_agree() -> None:
    spec = parse_spec(with_stack("framework: pytorch==2.0.1", "framework_version: 2.0.1"), "job.yaml")
    assert (spec.stack.framework, spec.stack.framework_version) == ("pytorch", "2.0.1")


def test_stack_versions_keep_the_text_as_written() -> None:
    # YAML would read 11.10 as the float 11.1: the version must stay as written
    spec = parse_spec(with_stack("driver: 470", "cuda: 11.10", "cudnn: 8.9"), "job.yaml")
    assert (spec.stack.driver, spec.stack.cuda, spec.stack.cudnn) == ("470", "11.10", "8.9")


def test_env_values_are_coerced_to_text() -> None:
    text = BASE + "env:\n  N: 5\n  LR: 0.10\n  F: 1.5\n  ON: true\n  OFF: false\n  S: hello\n  Z: '007'\n  E: ''\n"
    spec = parse_spec(text, "job.yaml")
    assert spec.env == {
        "N": "5",
        "LR": "0.10",
        "F": "1.5",
        "ON": "true",
        "OFF": "false",
        "S": "hello",
        "Z": "007",
        "E": "",
    }
    assert all(isinstance(v, str) for v in spec.env.values())


def test_env_null_section_and_artifacts_single_string() -> None:
    spec = parse_spec(BASE + "env:\nartifacts: outputs/\nstack:\n", "job.yaml")
    assert spec.env == {}
    assert spec.artifacts == ["outputs/"]
    assert spec.stack.framework == "none"


@pytest.mark.parametrize(
    "image",
    ["auto", "ami-0abcdef1234567890", "ami-12345678", "Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest"],
)
def test_image_forms(image: str) -> None:
    assert parse_spec(BASE + f"image: {image}\n", "job.yaml").image == image


def test_source_is_set_by_load_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, MINIMAL, "job.yaml")
    monkeypatch.chdir(tmp_path)
    spec = load_spec("job.yaml")  # a relative str path
    assert spec.source == (tmp_path / "job.yaml").resolve()
    assert spec.source.is_absolute()
    assert parse_spec(MINIMAL, "job.yaml").source is None


def test_workdir_path_is_relative_to_the_job_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (tmp_path / "code").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the cwd must not matter for a loaded job file
    default = load_spec(write(jobs, MINIMAL, "a.yaml"))
    assert default.workdir_path() == jobs.resolve()
    sibling = load_spec(write(jobs, MINIMAL + "workdir: ../code\n", "b.yaml"))
    assert sibling.workdir_path() == (tmp_path / "code").resolve()
    up = load_spec(write(jobs, MINIMAL + f"workdir: {tmp_path / 'code'}\n", "b.yaml"))
    assert up.workdir_path() == (tmp_path / "code").resolve()
    # parsed text has no file: relative to the cwd
    assert parse_spec(MINIMAL + "workdir: src\n", "x.yaml").workdir_path() == (elsewhere / "src").resolve()


def test_load_spec_accepts_a_utf8_bom(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, b"\xef\xbb\xbf" + MINIMAL.encode()))
    assert spec.name == "tiny"


# ---------------------------------------------------------------------------------------------
# Bad job files: one SpecError each, naming file, line and field, with the specific hint


@dataclass(frozen=True)
class Bad:
    id: str
    text: str
    line: int
    field: str  # dotted field; "" for problems of the whole file (YAML syntax, empty file)
    hints: tuple[str, ...]
    issues: int = 1  # how many problems the file has in all


BAD_SPECS: list[Bad] = [
    # unknown keys, with "did you mean"
    Bad("top-level-typo", BASE + "envv: {A: 1}\n", 5, "envv", ("unknown key 'envv'", "Did you mean 'env'?")),
    Bad(
        "top-level-typo-name",
        "nmae: job\nresources:\n  gpu: K80:1\nrun: x\n",
        1,
        "nmae",
        ("Did you mean 'name'?",),
        issues=2,
    ),
    Bad(
        "resources-typo",
        with_resources("clod: aws"),
        4,
        "resources.clod",
        ("unknown key 'clod'", "Did you mean 'cloud'?"),
    ),
    Bad(
        "stack-typo",
        with_stack("framwork: pytorch"),
        5,
        "stack.framwork",
        ("unknown key 'framwork'", "Did you mean 'framework'?"),
    ),
    Bad(
        "key-at-wrong-level",
        BASE + "spot: true\n",
        5,
        "spot",
        ("Did you mean 'resources.spot'?", "belongs under resources"),
    ),
    Bad(
        "gpu-mapping-typo",
        "name: job\nresources:\n  gpu:\n    modle: K80\nrun: x\n",
        4,
        "resources.gpu.modle",
        ("Did you mean 'model'?",),
        issues=2,
    ),
    Bad("source-is-not-a-key", BASE + "source: /tmp/x.yaml\n", 5, "source", ("unknown key 'source'",)),
    # wrong types
    Bad(
        "resources-is-a-list",
        "name: job\nresources: [K80]\nrun: x\n",
        2,
        "resources",
        ("expected a mapping with gpu", "got a list"),
    ),
    Bad(
        "stack-is-text",
        BASE + "stack: pytorch\n",
        5,
        "stack",
        ("expected a mapping with driver, cuda", "got 'pytorch'"),
    ),
    Bad(
        "name-is-a-number",
        "name: 123\nresources:\n  gpu: K80:1\nrun: x\n",
        1,
        "name",
        ("got the number 123", "Quote the value"),
    ),
    Bad(
        "run-is-a-list",
        "name: job\nresources:\n  gpu: K80:1\nrun:\n  - a\n  - b\n",
        4,
        "run",
        ("expected one shell script", "got a list of 2 commands", "after `|`"),
    ),
    Bad(
        "num-nodes-text",
        BASE + "num_nodes: two\n",
        5,
        "num_nodes",
        ("expected a whole number of nodes from 1 to 64, got 'two'",),
    ),
    Bad("num-nodes-bool", BASE + "num_nodes: yes\n", 5, "num_nodes", ("expected a number, got true (a boolean)",)),
    Bad(
        "num-nodes-float", BASE + "num_nodes: 1.5\n", 5, "num_nodes", ("a whole number of nodes", "got the number 1.5")
    ),
    Bad("ssh-maybe", with_resources("ssh: maybe"), 4, "resources.ssh", ("expected true or false, got 'maybe'",)),
    Bad("env-is-a-list", BASE + "env: [A]\n", 5, "env", ("a mapping of NAME: value", "got a list")),
    Bad(
        "explicit-int-tag",
        BASE + "num_nodes: !!int abc\n",
        5,
        "num_nodes",
        ("'abc' is not a valid !!int value", "Remove the '!!int' tag"),
    ),
    Bad(
        "python-tag",
        BASE + "setup: !!python/name:os.system\n",
        5,
        "",
        ("could not determine a constructor", "remove the '!' tag"),
    ),
    # durations
    Bad(
        "duration-bad-unit",
        BASE + "max_duration: 6x\n",
        5,
        "max_duration",
        ("'6x' is not a duration", "90m, 6h, 2d or 1h30m"),
    ),
    Bad("duration-zero", BASE + "max_duration: 0\n", 5, "max_duration", ("is 0 s, shorter than the minimum of 1 s",)),
    Bad(
        "duration-zero-hours",
        BASE + "max_duration: 0h\n",
        5,
        "max_duration",
        ("'0h' is 0 s, shorter than the minimum",),
    ),
    Bad(
        "duration-too-long",
        BASE + "max_duration: 31d\n",
        5,
        "max_duration",
        ("'31d' is 31d, longer than the maximum of 30d",),
    ),
    Bad("duration-negative", BASE + "max_duration: -5m\n", 5, "max_duration", ("'-5m' is not a duration",)),
    Bad(
        "duration-float",
        BASE + "max_duration: 1.5\n",
        5,
        "max_duration",
        ("expected a duration such as 90m", "got the number 1.5"),
    ),
    Bad(
        "duration-sexagesimal", BASE + "max_duration: 1:30\n", 5, "max_duration", ("'1:30' is not a duration", "1h30m")
    ),
    # GPUs
    Bad(
        "gpu-K8O",
        "name: job\nresources:\n  gpu: K8O:1\nrun: x\n",
        3,
        "resources.gpu.model",
        ("unknown GPU 'K8O'", "Did you mean 'K80'?", "Known GPUs: K40, K80"),
    ),
    Bad(
        "gpu-A100-80BG",
        "name: job\nresources:\n  gpu: A100-80BG:8\nrun: x\n",
        3,
        "resources.gpu.model",
        ("unknown GPU 'A100-80BG'", "Did you mean 'A100-80GB'?"),
    ),
    Bad(
        "gpu-V10",
        "name: job\nresources:\n  gpu: V10\nrun: x\n",
        3,
        "resources.gpu.model",
        ("unknown GPU 'V10'", "Did you mean 'V100'?"),
    ),
    Bad(
        "gpu-mapping-unknown-model",
        "name: job\nresources:\n  gpu:\n    model: T5\n    count: 1\nrun: x\n",
        4,
        "resources.gpu.model",
        ("unknown GPU 'T5'", "Did you mean 'T4'?"),
    ),
    Bad(
        "gpu-count-zero",
        "name: job\nresources:\n  gpu: K80:0\nrun: x\n",
        3,
        "resources.gpu.count",
        ("must be at least 1, got 0", "1 to 16"),
    ),
    Bad(
        "gpu-count-negative",
        "name: job\nresources:\n  gpu: K80:-1\nrun: x\n",
        3,
        "resources.gpu.count",
        ("must be at least 1, got -1",),
    ),
    Bad(
        "gpu-count-not-a-number",
        "name: job\nresources:\n  gpu: K80:two\nrun: x\n",
        3,
        "resources.gpu",
        ("the GPU count 'two' in 'K80:two' is not a whole number", "MODEL:COUNT such as T4:1"),
    ),
    Bad(
        "gpu-count-too-many",
        "name: job\nresources:\n  gpu: K80:17\nrun: x\n",
        3,
        "resources.gpu.count",
        ("must be at most 16, got 17",),
    ),
    Bad(
        "gpu-mapping-count-zero",
        "name: job\nresources:\n  gpu:\n    model: K80\n    count: 0\nrun: x\n",
        5,
        "resources.gpu.count",
        ("must be at least 1, got 0",),
    ),
    Bad(
        "gpu-space-after-colon",
        "name: job\nresources:\n  gpu: {K80: 2}\nrun: x\n",
        3,
        "resources.gpu",
        ("Write K80:2 (no space)",),
    ),
    Bad("gpu-no-model", "name: job\nresources:\n  gpu: ':2'\nrun: x\n", 3, "resources.gpu", ("names no GPU model",)),
    Bad(
        "gpu-is-a-number",
        "name: job\nresources:\n  gpu: 80\nrun: x\n",
        3,
        "resources.gpu",
        ("expected MODEL:COUNT", "got the number 80"),
    ),
    Bad(
        "no-gpu-for-cloud-job",
        "name: job\nresources:\n  cloud: aws\nrun: x\n",
        2,
        "resources",
        (
            "needs a GPU or an instance type",
            "gpu: T4:1",
            "only cloud: local or ssh or slurm (in the file or as --cloud) runs without either",
        ),
    ),
    # machines you own (resources.hosts)
    Bad(
        "host-is-an-option",
        "name: job\nresources:\n  cloud: ssh\n  hosts: [gpu-box, -oProxyCommand=x]\nrun: x\n",
        4,
        "resources.hosts[1]",
        ("'-oProxyCommand=x' is not a host", "[user@]host[:port]"),
    ),
    Bad(
        "host-port-too-big",
        "name: job\nresources:\n  cloud: ssh\n  hosts: gpu-box:70000\nrun: x\n",
        4,
        "resources.hosts",
        ("'gpu-box:70000' is not a host",),
    ),
    Bad(
        "hosts-without-ssh",
        "name: job\nresources:\n  cloud: aws\n  gpu: T4:1\n  hosts: [gpu-box]\nrun: x\n",
        5,
        "resources.hosts",
        ("is only used with cloud: ssh", "remove hosts"),
    ),
    Bad(
        "ssh-mixed-with-aws",
        "name: job\nresources:\n  cloud: [ssh, aws]\n  gpu: T4:1\nrun: x\n",
        3,
        "resources.cloud",
        ("ssh cannot be combined with other clouds", "Use cloud: ssh alone"),
    ),
    Bad("no-resources-at-all", "name: job\nrun: x\n", 1, "resources", ("needs a GPU or an instance type",)),
    Bad(
        "no-gpu-local-and-aws",
        "name: job\nresources:\n  cloud: [local, aws]\nrun: x\n",
        2,
        "resources",
        ("needs a GPU or an instance type",),
    ),
    Bad(
        "instance-type-with-space",
        "name: job\nresources:\n  instance_type: p2 xlarge\nrun: x\n",
        3,
        "resources.instance_type",
        ("'p2 xlarge' is not an instance type name", "g4dn.xlarge"),
    ),
    # names
    Bad(
        "name-upper-case",
        "name: MyJob\nresources:\n  gpu: K80:1\nrun: x\n",
        1,
        "name",
        ("'MyJob' has upper-case letters", "Did you mean 'myjob'?"),
    ),
    Bad(
        "name-too-long",
        f"name: {'a' * 41}\nresources:\n  gpu: K80:1\nrun: x\n",
        1,
        "name",
        ("is 41 characters long; at most 40",),
    ),
    Bad(
        "name-underscore",
        "name: my_job\nresources:\n  gpu: K80:1\nrun: x\n",
        1,
        "name",
        ("'my_job' contains '_'", "Did you mean 'my-job'?"),
    ),
    Bad(
        "name-leading-dash",
        "name: -job\nresources:\n  gpu: K80:1\nrun: x\n",
        1,
        "name",
        ("'-job' starts or ends with a dash", "Did you mean 'job'?"),
    ),
    Bad(
        "name-empty", "name: ''\nresources:\n  gpu: K80:1\nrun: x\n", 1, "name", ("must not be empty", "e.g. mnist-k80")
    ),
    # env
    Bad(
        "env-key-invalid",
        BASE + "env:\n  1BAD: x\n",
        6,
        "env.1BAD",
        ("'1BAD' is not a valid environment variable name", "e.g. EPOCHS"),
    ),
    Bad(
        "env-key-dash",
        BASE + "env:\n  MY-VAR: x\n",
        6,
        "env.MY-VAR",
        ("'MY-VAR' is not a valid environment variable name",),
    ),
    Bad(
        "env-key-reserved",
        BASE + "env:\n  OK: 1\n  GPUCLOUD_TOKEN: x\n",
        7,
        "env.GPUCLOUD_TOKEN",
        ("is reserved", "GPUCLOUD_"),
    ),
    Bad("env-value-nested", BASE + "env:\n  A:\n    b: 1\n", 6, "env.A", ("got a mapping", "Quote it")),
    Bad("env-value-null", BASE + "env:\n  A:\n", 6, "env.A", ("has no value", 'Write "" for an empty value')),
    Bad("env-value-date", BASE + "env:\n  D: 2024-01-01\n", 6, "env.D", ("got the date 2024-01-01", "Quote it")),
    # artifacts
    Bad(
        "artifact-dotdot",
        BASE + "artifacts:\n  - out/../../x\n",
        6,
        "artifacts[0]",
        ("leaves the working folder with '..'",),
    ),
    Bad(
        "artifact-absolute",
        BASE + "artifacts:\n  - outputs/\n  - /etc/passwd\n",
        7,
        "artifacts[1]",
        ("'/etc/passwd' is an absolute path", "relative to the job's working folder"),
    ),
    Bad("artifact-home", BASE + "artifacts: ['~/x']\n", 5, "artifacts[0]", ("is an absolute path",)),
    Bad("artifact-empty", BASE + "artifacts:\n  - ''\n", 6, "artifacts[0]", ("must not be empty", "e.g. outputs/")),
    # images
    Bad(
        "image-bad-ami", BASE + "image: ami-xyz\n", 5, "image", ("'ami-xyz' is not an AMI id", "ami-0abcdef1234567890")
    ),
    Bad(
        "image-short-urn",
        BASE + "image: Canonical:ubuntu:22_04\n",
        5,
        "image",
        ("is not an Azure image URN", "Publisher:Offer:Sku:Version"),
    ),
    Bad(
        "image-unknown", BASE + "image: ubuntu\n", 5, "image", ("'ubuntu' is not an image", "Expected auto, an AMI id")
    ),
    # duplicates and YAML itself
    Bad("duplicate-top-key", BASE + "name: other\n", 5, "name", ("duplicate key 'name' on lines 1 and 5",)),
    Bad(
        "duplicate-nested-key",
        "name: job\nresources:\n  gpu: K80:1\n  gpu: T4:1\nrun: x\n",
        4,
        "resources.gpu",
        ("duplicate key 'gpu' on lines 3 and 4",),
    ),
    Bad(
        "yaml-syntax-error",
        "name: job\nresources:\n  gpu: [K80\nrun: x\n",
        4,
        "",
        ("invalid YAML", "while parsing a flow sequence on line 3"),
    ),
    Bad(
        "yaml-bad-indent",
        "name: job\n  run: x\n",
        2,
        "",
        ("invalid YAML: mapping values are not allowed here", "Check the indentation"),
    ),
    Bad("yaml-tab", "name: job\nresources:\n\tgpu: K80\nrun: x\n", 3, "", ("invalid YAML", "use spaces")),
    Bad("yaml-two-documents", BASE + "---\nname: second\n", 5, "", ("remove the extra '---' part",)),
    Bad(
        "yaml-complex-key",
        "name: job\n? [a, b]\n: c\nresources:\n  gpu: K80:1\nrun: x\n",
        2,
        "",
        ("a key must be a plain name",),
    ),
    Bad("empty-file", "", 1, "", ("the job file is empty", "name: mnist-t4", "gpu: T4:1")),
    Bad("comments-only", "# nothing here yet\n", 1, "", ("the job file is empty",)),
    Bad("top-level-list", "- name: job\n- run: x\n", 1, "", ("must be a mapping of keys", "but it is a list")),
    Bad("top-level-scalar", "hello\n", 1, "", ("must be a mapping of keys", "but it is 'hello'")),
    # run, setup, workdir
    Bad(
        "missing-run",
        "name: job\nresources:\n  gpu: K80:1\n",
        1,
        "run",
        ("required key 'run' is missing", "run: python train.py"),
    ),
    Bad(
        "empty-run",
        "name: job\nresources:\n  gpu: K80:1\nrun: '  '\n",
        4,
        "run",
        ("must not be empty", "the shell command that runs the job"),
    ),
    Bad("null-run", "name: job\nresources:\n  gpu: K80:1\nrun:\n", 4, "run", ("has no value",)),
    Bad(
        "missing-name",
        "resources:\n  gpu: K80:1\nrun: x\n",
        1,
        "name",
        ("required key 'name' is missing", "e.g. mnist-k80"),
    ),
    Bad("workdir-number", BASE + "workdir: 5\n", 5, "workdir", ("got the number 5",)),
    # numbers and bounds
    Bad("num-nodes-0", BASE + "num_nodes: 0\n", 5, "num_nodes", ("must be at least 1, got 0", "from 1 to 64")),
    Bad("num-nodes-65", BASE + "num_nodes: 65\n", 5, "num_nodes", ("must be at most 64, got 65",)),
    Bad(
        "disk-too-small",
        with_resources("disk_gb: 10"),
        4,
        "resources.disk_gb",
        ("must be at least 20, got 10", "20 to 16384"),
    ),
    Bad(
        "max-price-negative",
        with_resources("max_price_per_hour: -1"),
        4,
        "resources.max_price_per_hour",
        ("must be greater than 0, got -1", "USD per node-hour"),
    ),
    Bad(
        "max-price-text",
        with_resources("max_price_per_hour: cheap"),
        4,
        "resources.max_price_per_hour",
        ("got 'cheap'",),
    ),
    Bad("min-vcpus-zero", with_resources("min_vcpus: 0"), 4, "resources.min_vcpus", ("must be at least 1, got 0",)),
    Bad(
        "spot-maybe",
        with_resources("spot: maybe"),
        4,
        "resources.spot",
        ("'maybe' is not allowed", "Expected true, false or auto"),
    ),
    # stack
    Bad(
        "framework-jax",
        with_stack("framework: jax"),
        5,
        "stack.framework",
        ("unknown framework 'jax'", "pytorch, tensorflow or none"),
    ),
    Bad("framework-torch", with_stack("framework: torch"), 5, "stack.framework", ("Did you mean 'pytorch'?",)),
    Bad(
        "framework-empty-version",
        with_stack("framework: pytorch=="),
        5,
        "stack.framework",
        ("'pytorch==' has no version after '=='", "pytorch==2.0.1"),
    ),
    Bad(
        "framework-bad-version",
        with_stack("framework: pytorch==abc"),
        5,
        "stack.framework_version",
        ("'abc' is not a version",),
    ),
    Bad(
        "framework-pin-conflict",
        with_stack("framework: pytorch==2.0.1", "framework_version: 2.1.0"),
        5,
        "stack.framework",
        ("pins version 2.0.1 but framework_version says 2.1.0",),
    ),
    Bad("cuda-not-a-version", with_stack("cuda: eleven"), 5, "stack.cuda", ("'eleven' is not a version", "11.4")),
    # clouds and regions
    Bad(
        "cloud-gcp",
        "name: job\nresources:\n  cloud: gcp\n  gpu: K80:1\nrun: x\n",
        3,
        "resources.cloud",
        ("unknown cloud 'gcp'", "Expected aws, azure, local, ssh, slurm, any, or a list of them"),
    ),
    Bad(
        "cloud-typo",
        "name: job\nresources:\n  cloud: awz\n  gpu: K80:1\nrun: x\n",
        3,
        "resources.cloud",
        ("Did you mean 'aws'?",),
    ),
    Bad(
        "cloud-list-item",
        "name: job\nresources:\n  cloud:\n    - aws\n    - gcp\n  gpu: K80:1\nrun: x\n",
        5,
        "resources.cloud[1]",
        ("unknown cloud 'gcp'",),
    ),
    Bad(
        "cloud-empty-list",
        "name: job\nresources:\n  cloud: []\n  gpu: K80:1\nrun: x\n",
        3,
        "resources.cloud",
        ("the list is empty",),
    ),
    Bad(
        "regions-mapping",
        with_resources("regions: {us-east-1: 1}"),
        4,
        "resources.regions",
        ("expected a region or a list of regions", "got a mapping"),
    ),
    Bad(
        "regions-number-item",
        with_resources("regions:", "  - us-east-1", "  - 5"),
        6,
        "resources.regions[1]",
        ("the number 5 is not a region code", "us-east-1"),
    ),
    Bad("regions-number", with_resources("regions: 5"), 4, "resources.regions", ("got the number 5",)),
]


def test_bad_spec_ids_and_files_are_distinct() -> None:
    assert len(BAD_SPECS) >= 35
    assert len({b.id for b in BAD_SPECS}) == len(BAD_SPECS)
    assert len({b.text for b in BAD_SPECS}) == len(BAD_SPECS)


@pytest.mark.parametrize("bad", BAD_SPECS, ids=[b.id for b in BAD_SPECS])
def test_bad_spec_names_file_line_field_and_hint(bad: Bad, tmp_path: Path) -> None:
    path = write(tmp_path, bad.text, f"{bad.id}.yaml")
    exc = spec_error(path)
    assert isinstance(exc, UserError) and exc.exit_code == 2
    message = str(exc)
    assert "Traceback" not in message
    assert len(exc.issues) == bad.issues, message
    issue = next((i for i in exc.issues if i.line == bad.line and i.field == bad.field), None)
    assert issue is not None, f"no issue at line {bad.line} field {bad.field!r} in:\n{message}"
    assert issue.file == str(path)
    where = f"{path}:{bad.line}: {bad.field}: " if bad.field else f"{path}:{bad.line}: "
    rendered = str(issue)
    assert rendered.startswith(where), rendered
    assert rendered in message  # the rendered error holds the line itself
    for hint in bad.hints:
        assert hint in rendered, f"{hint!r} not in {rendered!r}"
    assert rendered.endswith((".", "?")) or "\n" in rendered  # a full sentence, no dangling text
    assert "?." not in rendered and not re.search(r"(?<!\.)\.\.(?=\s|$)|\.{4,}", rendered), rendered  # no "x.." / "?."
    assert exc.render() == message


def test_several_problems_are_reported_together(tmp_path: Path) -> None:
    text = "name: Bad_Name\nresources:\n  gpu: K8O:1\n  disk_gb: 5\nnum_nodes: 0\nrun: x\nmax_duraton: 6h\n"
    path = write(tmp_path, text)
    exc = spec_error(path)
    message = str(exc)
    assert message.splitlines()[0] == f"{path}: 5 problems in the job file:"
    got = [(i.line, i.field) for i in exc.issues]
    assert got == [
        (1, "name"),
        (3, "resources.gpu.model"),
        (4, "resources.disk_gb"),
        (5, "num_nodes"),
        (7, "max_duraton"),
    ]
    for needle in (
        "has upper-case letters",
        "Did you mean 'K80'?",
        "must be at least 20",
        "must be at least 1, got 0",
        "Did you mean 'max_duration'?",
    ):
        assert needle in message
    # one indented line per problem, in line order
    assert [line.split(":")[1] for line in message.splitlines()[1:]] == ["1", "3", "4", "5", "7"]


def test_duplicate_key_alongside_other_problems(tmp_path: Path) -> None:
    path = write(tmp_path, "name: job\nresources:\n  gpu: K80:1\nrun: x\nrun: y\nnum_nodes: 99\n")
    exc = spec_error(path)
    assert [(i.line, i.field) for i in exc.issues] == [(5, "run"), (6, "num_nodes")]
    assert "lines 4 and 5" in str(exc)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    exc = spec_error(path)
    assert str(exc).startswith(f"{path}: no such file.")
    assert "Check the path" in str(exc)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    exc = spec_error(tmp_path)
    assert str(exc).startswith(f"{tmp_path}: is a directory, not a job file.")
    assert str(tmp_path / "job.yaml") in str(exc)


def test_non_utf8_bytes(tmp_path: Path) -> None:
    path = write(tmp_path, b"name: job\nresources:\n  gpu: K80:1\nrun: caf\xe9\n")
    exc = spec_error(path)
    assert str(exc).startswith(f"{path}:4: is not UTF-8 text (byte 0xe9")
    assert "Save the job file as UTF-8" in str(exc)


def test_huge_file_is_refused_without_parsing(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "# " + "x" * (1 << 20) + "\n")
    exc = spec_error(path)
    assert str(exc).startswith(f"{path}: is larger than 1024 KiB")


def test_alias_bomb_is_a_spec_error() -> None:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    with pytest.raises(SpecError, match="nested or aliased far too deeply"):
        parse_spec("\n".join(lines) + "\n", "bomb.yaml")


def test_parse_spec_uses_the_given_filename() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(BASE + "num_nodes: 0\n", "some/dir/job.yaml")
    assert str(info.value).startswith("some/dir/job.yaml:5: num_nodes: ")


# ---------------------------------------------------------------------------------------------
# Through the real CLI


CLI_BAD = [
    "gpu-K8O",
    "duplicate-top-key",
    "yaml-syntax-error",
    "empty-file",
    "env-key-reserved",
    "framework-empty-version",
]


def test_cli_validate_bad_files_exit_2_without_traceback(tmp_path: Path) -> None:
    by_id = {b.id: b for b in BAD_SPECS}
    for case_id in CLI_BAD:
        bad = by_id[case_id]
        path = write(tmp_path, bad.text, f"{bad.id}.yaml")
        out = cli("validate", str(path), env=ci_env(), cwd=REPO)
        assert out.returncode == 2, (case_id, out.stderr)
        assert "Traceback" not in out.stderr + out.stdout
        where = f"{path}:{bad.line}: {bad.field}: " if bad.field else f"{path}:{bad.line}: "
        assert where in flat(out.stderr), (case_id, out.stderr)
        for hint in bad.hints:
            assert hint in flat(out.stderr), (case_id, hint, out.stderr)
    for special in (tmp_path / "missing.yaml", tmp_path):  # no file, a directory
        out = cli("validate", str(special), env=ci_env(), cwd=REPO)
        assert out.returncode == 2 and "Traceback" not in flat(out.stderr)
        assert str(special) in flat(out.stderr)
    nonutf = write(tmp_path, b"name: j\xff\n", "latin.yaml")
    out = cli("validate", str(nonutf), env=ci_env(), cwd=REPO)
    assert out.returncode == 2 and "Traceback" not in flat(out.stderr) and "is not UTF-8 text" in flat(out.stderr)


def test_cli_validate_good_file_exits_0(tmp_path: Path) -> None:
    path = write(tmp_path, DESIGN_EXAMPLE)
    out = cli("validate", str(path), env=ci_env(), cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "valid" in flat(out.stderr)
    assert "Traceback" not in flat(out.stderr)
    out = cli("validate", "--json", str(path), env=ci_env(), cwd=REPO)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["name"] == "mnist-k80" and doc["max_duration"] == 21600
    assert doc["resources"]["gpu"] == {"model": "K80", "count": 1}


def _deref(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/"), ref
        node: Any = root
        for part in ref[2:].split("/"):
            node = node[part]
        schema = node
    return schema


def test_cli_schema_prints_the_input_schema() -> None:
    out = cli("schema", env=ci_env(), cwd=REPO)
    assert out.returncode == 0, out.stderr
    schema = json.loads(out.stdout)
    top = set(JobSpec.model_fields) - {"source"}
    assert top <= set(schema["properties"])
    assert "source" not in schema["properties"]
    resources = _deref(schema["properties"]["resources"], schema)
    gpu = resources["properties"]["gpu"]
    branches = [_deref(b, schema) for b in gpu.get("anyOf", [gpu])]
    string_branches = [b for b in branches if b.get("type") == "string"]
    assert string_branches, gpu
    assert re.search(string_branches[0]["pattern"], "K80:1")
    assert any("model" in b.get("properties", {}) for b in branches)  # the mapping form too


# ---------------------------------------------------------------------------------------------
# json_schema(): the design example validates against it (a tiny checker, no jsonschema needed)

_JSON_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def schema_errors(schema: dict[str, Any], value: Any, root: dict[str, Any], where: str = "$") -> list[str]:
    """The subset of JSON Schema that json_schema() uses: $ref, anyOf, type, enum, const, pattern,
    minimum/maximum, properties/required/additionalProperties, items."""
    schema = _deref(schema, root)
    if "anyOf" in schema:
        if all(schema_errors(branch, value, root, where) for branch in schema["anyOf"]):
            return [f"{where}: {value!r} matches no branch of anyOf"]
        return []
    errors: list[str] = []
    kind = schema.get("type")
    if kind is not None and not _JSON_TYPES[kind](value):
        return [f"{where}: {value!r} is not of type {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} not in {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{where}: {value!r} != {schema['const']!r}")
    if "pattern" in schema and isinstance(value, str) and not re.search(schema["pattern"], value):
        errors.append(f"{where}: {value!r} does not match {schema['pattern']}")
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{where}: {value} < {schema['minimum']}")
    if "maximum" in schema and value > schema["maximum"]:
        errors.append(f"{where}: {value} > {schema['maximum']}")
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        errors.append(f"{where}: {value} <= {schema['exclusiveMinimum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        errors += [f"{where}: missing {key}" for key in schema.get("required", []) if key not in value]
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                errors += schema_errors(props[key], item, root, f"{where}.{key}")
            elif extra is False:
                errors.append(f"{where}: unknown key {key}")
            elif isinstance(extra, dict):
                errors += schema_errors(extra, item, root, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += schema_errors(schema["items"], item, root, f"{where}[{i}]")
    return errors


def test_json_schema_has_every_input_key() -> None:
    schema = json_schema()
    assert isinstance(schema, dict)
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert set(schema["properties"]) == set(JobSpec.model_fields) - {"source"}
    assert set(schema["required"]) == {"name", "run"}
    for key, model in (("resources", Resources), ("stack", StackSpec)):
        section = _deref(schema["properties"][key], schema)
        assert set(section["properties"]) == set(model.model_fields) - set(HIDDEN[model.__name__.lower()])
        assert section["additionalProperties"] is False
    gpu_request = schema["$defs"]["GpuRequest"]
    assert set(gpu_request["properties"]) == set(GpuRequest.model_fields) - {"other_models"}
    # descriptions from the field hints, without doubled punctuation
    assert "...." not in json.dumps(schema)
    assert schema["properties"]["max_duration"]["description"].startswith("A duration such as 90m")
    json.dumps(schema)  # serialisable as it is


def test_design_example_validates_against_json_schema() -> None:
    schema = json_schema()
    data = yaml.safe_load(DESIGN_EXAMPLE)
    assert schema_errors(schema, data, schema) == []
    assert schema_errors(schema, yaml.safe_load(MINIMAL), schema) == []
    for form in ("K80:1", "a100-80gb:8", {"model": "K80", "count": 2}):
        assert schema_errors(schema, {**data, "resources": {"gpu": form}}, schema) == []
    for duration in ("90m", "1h30m", 3600):
        assert schema_errors(schema, {**data, "max_duration": duration}, schema) == []


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"envv": {}}, "$: unknown key envv"),
        ({"resources": {"gpu": 5}}, "$.resources.gpu"),
        ({"resources": {"gpu": "K80:1", "clod": "aws"}}, "$.resources: unknown key clod"),
        ({"resources": {"cloud": "gcp"}}, "$.resources.cloud"),
        ({"num_nodes": 65}, "$.num_nodes"),
        ({"max_duration": "6x"}, "$.max_duration"),
        ({"image": "ubuntu"}, "$.image"),
        ({"stack": {"framework": "jax"}}, "$.stack.framework"),
        ({"env": {"A": [1]}}, "$.env.A"),
    ],
)
def test_json_schema_rejects_what_the_loader_rejects(change: dict[str, Any], where: str) -> None:
    schema = json_schema()
    data = {**yaml.safe_load(DESIGN_EXAMPLE), **change}
    errors = schema_errors(schema, data, schema)
    assert any(e.startswith(where) for e in errors), errors
    with pytest.raises(SpecError):
        parse_spec(yaml.safe_dump(data), "changed.yaml")


# ---------------------------------------------------------------------------------------------
# Characters no job can carry, a workdir out of the tree, variables the bootstrap owns

LOCAL_JOB = "name: j\nresources: {cloud: local}\n"
HOSTILE = [
    (
        "nul-in-env",
        LOCAL_JOB + 'run: echo hi\nenv:\n  A: "x\\0y"\n',
        5,
        "env.A",
        "control character NUL at character 2",
    ),
    ("esc-in-run", LOCAL_JOB + 'run: "echo \\e[31m red"\n', 3, "run", "control character ESC at character 6"),
    (
        "del-in-setup",
        LOCAL_JOB + 'run: echo hi\nsetup: "a\\x7fb"\n',
        4,
        "setup",
        "control character DEL at character 2",
    ),
    ("surrogate-in-run", LOCAL_JOB + 'run: "echo \\ud800"\n', 3, "run", "lone surrogate U+D800"),
    (
        "surrogate-key",
        LOCAL_JOB + 'run: echo hi\nenv:\n  "\\udc80": x\n',
        5,
        "env",
        "a key contains a lone surrogate U+DC80",
    ),
    (
        "env-CVD",
        LOCAL_JOB + "run: echo hi\nenv:\n  CUDA_VISIBLE_DEVICES: x\n",
        5,
        "env.CUDA_VISIBLE_DEVICES",
        "'CUDA_VISIBLE_DEVICES' is reserved: the VM's bootstrap",
    ),
    ("env-SECONDS", LOCAL_JOB + "run: echo hi\nenv:\n  SECONDS: x\n", 5, "env.SECONDS", "Rename it, e.g. MY_SECONDS"),
    ("env-BASH_ENV", LOCAL_JOB + "run: echo hi\nenv:\n  BASH_ENV: x\n", 5, "env.BASH_ENV", "'BASH_ENV' is reserved"),
    ("workdir-root", LOCAL_JOB + "run: echo hi\nworkdir: /\n", 4, "workdir", "'/' is the root folder /"),
    (
        "workdir-up-to-root",
        LOCAL_JOB + "run: echo hi\nworkdir: " + "../" * 40 + "\n",
        4,
        "workdir",
        "is the root folder /, which would upload everything in it. Point workdir at the project's own folder",
    ),
]


@pytest.mark.parametrize(("text", "line", "field", "needle"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_cli_rejects_hostile_job_files(tmp_path: Path, text: str, line: int, field: str, needle: str) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    path = write(tmp_path / "a" / "b", text, "job.yaml")
    out = cli("validate", str(path), env=ci_env(), cwd=REPO)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr + out.stdout and "internal error" not in flat(out.stderr)
    assert f"{path}:{line}: {field}: " in flat(out.stderr), out.stderr
    assert needle in flat(out.stderr), out.stderr


def test_workdir_may_name_a_parent_folder_relatively_but_not_home(tmp_path: Path) -> None:
    """A job file in `jobs/` of a monorepo uploads the repository with `workdir: ..`, a path that
    can be committed; the home folder itself (or above it) is refused, relative or absolute."""
    repo = tmp_path / "home" / "src" / "mono"
    (repo / "jobs").mkdir(parents=True)
    (repo / "train.py").write_text("print(1)\n")
    path = write(repo / "jobs", LOCAL_JOB + "run: python train.py\nworkdir: ..\n", "job.yaml")
    env = {**os.environ, "CI": "true", "HOME": str(tmp_path / "home"), "COLUMNS": "80"}
    ok = cli("validate", str(path), env=env, timeout=60)
    assert ok.returncode == 0 and f"workdir {repo.resolve()}: 2 file(s)" in flat(ok.stderr), ok.stderr
    for workdir in ("../../..", "../../../..", str(tmp_path / "home")):
        path.write_text(LOCAL_JOB + f"run: python train.py\nworkdir: {workdir}\n")
        out = cli("validate", str(path), env=env, timeout=60)
        assert out.returncode == 2 and f"{path}:4: workdir: '{workdir}' is " in flat(out.stderr), out.stderr
        assert "your home folder" in flat(out.stderr) or "above your home folder" in flat(out.stderr), out.stderr
        assert "Traceback" not in flat(out.stderr) and "workdir: .." in flat(out.stderr)


def test_workdir_outside_the_tree_is_fine_when_absolute(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "jobs").mkdir()
    path = write(tmp_path / "jobs", LOCAL_JOB + f"run: echo hi\nworkdir: {tmp_path / 'data'}\n", "job.yaml")
    assert load_spec(path).workdir_path() == (tmp_path / "data").resolve()
    inside = write(tmp_path / "jobs", LOCAL_JOB + "run: echo hi\nworkdir: ./sub/../\n", "in.yaml")
    assert load_spec(inside).workdir_path() == (tmp_path / "jobs").resolve()


def test_reserved_names_are_the_nodes_and_bashs() -> None:
    from gpucloud.vm.env import BASH_RESERVED, NODE_RESERVED, reserved_env_names

    names = reserved_env_names()
    assert {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "SECONDS", "PIPESTATUS"} <= names
    # the job's own, the user's, and the deleted bash bootstrap's names (nothing on the node uses them now)
    assert not {"NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "EPOCHS", "PYTHONPATH", "JOB", "W", "DEADLINE"} & names
    assert names == NODE_RESERVED | BASH_RESERVED
    for name in names:  # each one is a variable name, refused by the spec
        assert re.fullmatch(r"[A-Z_][A-Z0-9_]*", name), name
        with pytest.raises(ValueError, match="is reserved"):
            JobSpec.model_validate({"name": "j", "resources": {"cloud": ["local"]}, "run": "true", "env": {name: "x"}})


def test_cli_validate_shows_what_would_be_uploaded(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print(1)\n")
    (tmp_path / "code" / ".gitignore").write_text("data/\n")
    (tmp_path / "code" / "data").mkdir()
    (tmp_path / "code" / "data" / "big.bin").write_bytes(b"x" * 1000)
    path = write(tmp_path / "code", LOCAL_JOB + "run: python train.py\n", "job.yaml")
    out = cli("validate", str(path), env=ci_env(), cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert f"workdir {(tmp_path / 'code').resolve()}: 3 file(s), " in flat(out.stderr), out.stderr
