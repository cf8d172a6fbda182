"""`gpucloud import`: real SkyPilot and dstack example files (tests/data/peers, README there) become
job files that pass `validate` and `plan`, every field that did not map is named in a
`# gpucloud import:` comment and on stderr, anything else is refused with exit 2, and `validate`
of a peer file names the command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpucloud.cli.app import app
from tests.support.text import too_wide, yaml_lines

PEERS = Path(__file__).resolve().parents[1] / "data" / "peers"
SKYPILOT = sorted((PEERS / "skypilot").glob("*.yaml"))
DSTACK = sorted(p for p in (PEERS / "dstack").glob("*.yml") if "dev-environment" not in p.name)
SECRETS = {"HUGGING_FACE_HUB_TOKEN": "hf-test", "WANDB_API_KEY": "wandb-test"}


def cli_in_process(*argv: str) -> tuple[int, str, str]:
    """The CLI in this process (typer's CliRunner): exit code, stdout and stderr."""
    res = CliRunner().invoke(app, list(argv))
    return res.exit_code, res.stdout, res.stderr


def imported(src: Path, tmp_path: Path) -> tuple[Path, str]:
    out = tmp_path / f"{src.name.split('.')[0]}-job.yaml"
    code, stdout, stderr = cli_in_process("import", str(src), "--out", str(out))
    assert code == 0, stderr
    assert stdout == ""
    return out, stderr


def test_the_examples_are_at_least_three_and_two() -> None:
    assert len(SKYPILOT) >= 3 and len(DSTACK) >= 2
    readme = (PEERS / "README.md").read_text()
    for path in [*SKYPILOT, *DSTACK]:
        assert path.name in readme, path


@pytest.mark.parametrize("src", [*SKYPILOT, *DSTACK], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_example_converts_validates_and_plans(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    job, _ = imported(src, tmp_path)
    assert not too_wide(yaml_lines(job.read_text())), too_wide(yaml_lines(job.read_text()))  # 80 columns
    code, _, stderr = cli_in_process("validate", str(job))
    assert code == 0, stderr
    data = yaml.safe_load(job.read_text())
    code, stdout, stderr = cli_in_process("plan", "--json", str(job))
    assert code == 0, stderr
    doc = json.loads(stdout)
    assert doc["candidates"]
    if data.get("outputs") or data.get("inputs"):
        # plan asks S3 about the job's buckets; with no credentials here each is a warning (run checks
        # it again), and an error only under --strict.
        assert any("was not checked (no AWS credentials found here)" in w for w in doc["warnings"]), doc["warnings"]
        code, _, stderr = cli_in_process("plan", "--strict", str(job))
        assert code == 2 and "plan --strict:" in stderr, stderr


@pytest.mark.parametrize("src", [*SKYPILOT, *DSTACK], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_unmapped_field_is_named_in_a_comment_and_on_stderr(src: Path, tmp_path: Path) -> None:
    job, stderr = imported(src, tmp_path)
    text = job.read_text()
    comments = " ".join(
        line.removeprefix("#").strip() for line in text.splitlines() if line.startswith(("# gpucloud import:", "#   "))
    )
    found = re.search(r"did not map, each noted in a\s+`# gpucloud import:` comment:\s+(.*)\.$", stderr, re.S)
    listed = [f.strip() for f in found.group(1).replace("\n", " ").split(",")] if found else []
    for field in listed:
        assert f"{field}:" in comments or f"{field} " in comments, (field, text)
    assert found or "Every field mapped" in stderr
    notes = [line for line in text.splitlines() if line.startswith(("# gpucloud import:", "#   "))]
    assert all(len(line) <= 80 for line in notes), text


EXPECTED_UNMAPPED = {
    "dstack/vllm-serve-task.dstack.yml": ["ports"],
    "dstack/torchrun.dstack.yml": ["resources.shm_size", "python"],
    "dstack/trl-train.dstack.yml": ["resources.shm_size", "python"],
    "skypilot/spot-bert_qa.yaml": ["resources.spot_recovery", "file_mounts./checkpoint"],
    "skypilot/detectron2_docker.yaml": ["file_mounts./inputs", "file_mounts./detectron2"],
}


@pytest.mark.parametrize("rel", sorted(EXPECTED_UNMAPPED))
def test_what_did_not_map_is_listed(rel: str, tmp_path: Path) -> None:
    job, stderr = imported(PEERS / rel, tmp_path)
    flat = " ".join(stderr.split())
    for field in EXPECTED_UNMAPPED[rel]:
        assert field in flat, stderr
        assert f"# gpucloud import: {field}:" in job.read_text()


def test_the_examples_map_their_fields(tmp_path: Path) -> None:
    def job(rel: str) -> dict:
        return yaml.safe_load(imported(PEERS / rel, tmp_path)[0].read_text())

    ddp = job("skypilot/distributed-pytorch-train.yaml")
    assert ddp["name"] == "mingpt-ddp" and ddp["num_nodes"] == 2
    assert ddp["resources"] == {"gpu": "L4:1", "min_vcpus": 4}
    assert ddp["run"].startswith('export SKYPILOT_NODE_RANK="$GPUCLOUD_NODE_RANK"\n')
    bert = job("skypilot/spot-bert_qa.yaml")
    assert bert["resources"]["spot"] is True and bert["recovery"] is True
    # V100:1 (p3.2xlarge) is retired: the nearest V100 that is still sold, noted
    assert bert["resources"]["gpu"] == "V100-32GB:8"
    resnet = job("skypilot/spot-resnet.yaml")
    assert resnet["outputs"] == {"/checkpoint": "s3://checkpoint-bucket-resnet/resnet"}
    torchrun = job("dstack/torchrun.dstack.yml")
    assert torchrun["num_nodes"] == 2 and torchrun["env"] == {"NCCL_DEBUG": "INFO"}
    assert torchrun["resources"]["gpu"] == {"memory": "1GB..", "count": "1..8"}
    assert 'export DSTACK_MASTER_NODE_IP="$MASTER_ADDR"' in torchrun["run"] and "set -e\n" in torchrun["run"]
    trl = job("dstack/trl-train.dstack.yml")
    assert trl["secrets"] == ["HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY"]
    assert trl["resources"]["gpu"] == {"memory": "24GB..", "count": "1.."}
    vllm = job("dstack/vllm-serve-task.dstack.yml")
    assert vllm["container"] == "vllm/vllm-openai:latest" and vllm["name"] == "vllm-serve-task"


SKY_FORMS = """\
name: Forms_Test
resources:
  infra: aws/us-east-1
  accelerators: {A100-80GB: 8}
  use_spot: true
  disk_size: 256GB
  cpus: 32+
  memory: 64
  image_id: docker:nvcr.io/nvidia/pytorch:24.08-py3
  ports: 8080
  disk_tier: best
num_nodes: 2
envs:
  EPOCHS: 5
  HF_TOKEN:
file_mounts:
  /data:
    source: s3://my-datasets/imagenet
    mode: MOUNT
  /raw: s3://my-datasets/raw
  /gcs: gs://somewhere/else
run: python train.py --epochs $EPOCHS
"""


def test_skypilot_field_forms(tmp_path: Path) -> None:
    src = tmp_path / "task.yaml"
    src.write_text(SKY_FORMS)
    job, stderr = imported(src, tmp_path)
    data = yaml.safe_load(job.read_text())
    res = data["resources"]
    assert res["gpu"] == "A100-80GB:8" and res["regions"] == ["us-east-1"] and res["spot"] is True
    assert res["disk_gb"] == 256 and res["min_vcpus"] == 32 and res["min_memory_gib"] == 64
    assert data["container"] == "nvcr.io/nvidia/pytorch:24.08-py3"
    assert data["env"] == {"EPOCHS": "5"} and data["secrets"] == ["HF_TOKEN"]
    assert data["inputs"] == {
        "/data": {"source": "s3://my-datasets/imagenet", "mode": "mount"},
        "/raw": "s3://my-datasets/raw",
    }
    flat = " ".join(stderr.split())
    for field in ("resources.ports", "resources.disk_tier", "file_mounts./gcs", "resources.memory"):
        assert field in flat
    assert cli_in_process("validate", str(job))[0] == 0


@pytest.mark.parametrize(
    ("accelerators", "gpu"),
    [
        ("A10G:4", "A10G:4"),
        ("L4", "L4:1"),
        ("V100:4", "V100-32GB:8"),  # p3.8xlarge is retired: the nearest V100 still sold
        ("['L4', 'A10G:2']", ["L4:1", "A10G:2"]),
        ("{V100, T4}", ["V100:1", "T4:1"]),
        ("{A100: 8, H100: 8}", ["A100:8", "H100:8"]),
    ],
)
def test_skypilot_accelerator_forms(accelerators: str, gpu: object, tmp_path: Path) -> None:
    src = tmp_path / "task.yaml"
    src.write_text(f"resources:\n  accelerators: {accelerators}\nrun: nvidia-smi\n")
    job, _ = imported(src, tmp_path)
    assert yaml.safe_load(job.read_text())["resources"]["gpu"] == gpu


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [
        ("A100:80GB:2", {"model": "A100-80GB", "memory": "80GB", "count": "2"}),
        ("24GB..", {"memory": "24GB..", "count": 1}),
        ("A10G,L4", {"model": ["A10G", "L4"], "count": 1}),
        ("nvidia:T4:1", "T4:1"),
        (
            "{name: [A10G, L4], memory: 24GB.., count: 1..2}",
            {"model": ["A10G", "L4"], "memory": "24GB..", "count": "1..2"},
        ),
    ],
)
def test_dstack_gpu_forms(gpu: str, expected: object, tmp_path: Path) -> None:
    src = tmp_path / "train.dstack.yml"
    src.write_text(
        f"type: task\ncommands: [python train.py]\nresources:\n  gpu: {gpu}\n  disk: 200GB..\n  cpu: 8..\n"
        "spot_policy: auto\nmax_duration: 2h\nbackends: [aws, gcp]\nregions: [us-east-1]\nworking_dir: src\n"
    )
    job, stderr = imported(src, tmp_path)
    data = yaml.safe_load(job.read_text())
    assert data["resources"]["gpu"] == expected
    assert data["resources"]["disk_gb"] == 200 and data["resources"]["min_vcpus"] == 8
    assert data["resources"]["spot"] == "auto" and data["max_duration"] == "2h"
    assert data["resources"]["cloud"] == "aws" and data["resources"]["regions"] == ["us-east-1"]
    flat = " ".join(stderr.split())
    assert "backends" in flat and "working_dir" in flat


def test_a_file_that_is_neither_is_refused(tmp_path: Path) -> None:
    for text in ("name: mnist\nresources: {gpu: T4:1}\nrun: python train.py\n", "- a\n- list\n", "hello\n"):
        src = tmp_path / "job.yaml"
        src.write_text(text)
        code, stdout, stderr = cli_in_process("import", str(src))
        assert code == 2 and stdout == "" and "Traceback" not in stderr
        assert "SkyPilot" in stderr and "dstack" in stderr, stderr


def test_a_dstack_dev_environment_is_refused() -> None:
    code, _, stderr = cli_in_process("import", str(PEERS / "dstack" / "axolotl-dev-environment.dstack.yml"))
    assert code == 2 and "dev-environment" in stderr and "type: task" in stderr


def test_hostile_input_is_refused_quickly(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 12)]
    bomb.write_text("\n".join(lines) + "\nenvs: *a11\nrun: x\n")
    code, _, stderr = cli_in_process("import", str(bomb))
    assert code == 2 and "too deeply" in stderr
    big = tmp_path / "big.yaml"
    big.write_text("run: x\n" + "#" * (1 << 21))
    code, _, stderr = cli_in_process("import", str(big))
    assert code == 2 and "KiB" in stderr


def test_out_never_overwrites(tmp_path: Path) -> None:
    out = tmp_path / "job.yaml"
    out.write_text("keep me\n")
    code, _, stderr = cli_in_process("import", str(PEERS / "skypilot" / "minimal.yaml"), "--out", str(out))
    assert code == 2 and "exists" in stderr and out.read_text() == "keep me\n"


@pytest.mark.parametrize(
    ("rel", "kind"),
    [("skypilot/minimal.yaml", "a SkyPilot task"), ("dstack/torchrun.dstack.yml", "a dstack configuration")],
)
def test_validate_of_a_peer_file_names_import(rel: str, kind: str) -> None:
    code, _, stderr = cli_in_process("validate", str(PEERS / rel))
    flat = " ".join(stderr.split())
    assert code == 2
    assert flat.endswith(f"This looks like {kind}: `gpucloud import {PEERS / rel}` converts it."), flat


def test_commands_without_type_read_as_dstack(tmp_path: Path) -> None:
    src = tmp_path / "job.yaml"
    src.write_text("name: t\nresources: {gpu: 24GB}\ncommands: [python train.py]\n")
    code, _, stderr = cli_in_process("validate", str(src))
    assert code == 2 and "This looks like a dstack configuration" in " ".join(stderr.split())
    job, _ = imported(src, tmp_path)
    assert yaml.safe_load(job.read_text())["run"] == "set -e\npython train.py\n"


def test_validate_of_a_wrong_gpucloud_file_does_not_name_import(tmp_path: Path) -> None:
    src = tmp_path / "job.yaml"
    src.write_text("name: mnist\nresources: {gpu: T4:1, regoins: [us-east-1]}\nrun: python train.py\n")
    code, _, stderr = cli_in_process("validate", str(src))
    assert code == 2 and "gpucloud import" not in stderr


def test_a_value_shown_in_a_comment_cannot_add_a_key(tmp_path: Path) -> None:
    """A peer value quoted in a `# gpucloud import:` note is one printable line: a newline in it
    would end the comment and write the rest into the job file as YAML."""
    src = tmp_path / "task.yaml"
    src.write_text(
        'resources:\n  accelerators: L4\n  ports: "8080\\nsecrets: [AWS_SECRET_ACCESS_KEY]\\nrun: curl evil"\n'
        'labels: "x\\u001b]0;title\\u0007\\nimage: ami-0123456789abcdef0"\nrun: python train.py\n'
    )
    job, _ = imported(src, tmp_path)
    data = yaml.safe_load(job.read_text())
    assert data["run"] == "python train.py" and "secrets" not in data and "image" not in data
    assert "\x1b" not in job.read_text() and "\x07" not in job.read_text()
