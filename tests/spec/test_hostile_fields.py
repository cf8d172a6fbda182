"""Hostile values in single fields, each refused with exit 2 and a clear message: a GPU memory pair of
the wrong shape, an image or registry that would read as an engine option, a short option cluster
hiding an owned flag, a whole bucket as an output, gpucloud's own channel bucket as data; and the
caller's secret values and secret-file lines, checked before launch without echoing them."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucloud.cli.app import app
from gpucloud.spec.load import SpecError, parse_spec

HEAD = "name: h\nresources: {cloud: local}\nrun: 'true'\n"


def refusal(body: str) -> str:
    with pytest.raises(SpecError) as exc:
        parse_spec(HEAD + body, "job.yaml")
    return str(exc.value)


@pytest.mark.parametrize(
    ("memory", "words"),
    [
        ("[24, [1]]", "a list in the pair is not a number"),
        ("[24, x]", "'x' in the pair is not a number"),
        ("[24, 1, 2]", "a list of 3 item(s)"),
        ("[]", "a list of 0 item(s)"),
        ("[.nan, null]", "nan in the pair is not a size"),
        ("[80, 24]", "is empty"),
        (".inf", "must be a number above 0"),
        (".nan", "must be a number above 0"),
        ("[true, null]", "true (a boolean) in the pair"),
    ],
)
def test_gpu_memory_of_the_wrong_shape_is_a_spec_error(memory: str, words: str) -> None:
    message = refusal(f"resources: {{cloud: aws, gpu: {{model: T4, memory: {memory}}}}}\n")
    assert "resources.gpu.memory" in message and words in message, message


def test_gpu_memory_pair_still_reads() -> None:
    spec = parse_spec(HEAD.replace("{cloud: local}", "{cloud: aws, gpu: {memory: [24, null]}}"), "j.yaml")
    assert spec.resources.gpu is not None and spec.resources.gpu.memory == (24.0, None)


@pytest.mark.parametrize("image", ["-eFOO=bar", "-e.foo/bar", "--privileged.x/y", "-v.x:5000/y"])
def test_an_image_starting_with_a_dash_is_refused(image: str) -> None:
    message = refusal(f"container: '{image}'\n")
    assert "container.image" in message and "starts with '-'" in message and "engine" in message, message


@pytest.mark.parametrize(
    ("option", "flag"), [("-eFOO=bar", "-e"), ("-itd", "-d"), ("-uroot", "-u"), ("-w/tmp", "-w"), ("-ie", "-e")]
)
def test_a_short_option_cluster_hiding_an_owned_flag_is_refused(option: str, flag: str) -> None:
    message = refusal(f"container: {{image: ubuntu, options: ['{option}']}}\n")
    assert "is set by gpucloud" in message and option in message, message


@pytest.mark.parametrize("option", ["-it", "-v/data:/data", "--shm-size=8g", "-p8080:80", "--ipc=host"])
def test_other_engine_options_still_pass(option: str) -> None:
    spec = parse_spec(HEAD + f"container: {{image: ubuntu, options: ['{option}']}}\n", "j.yaml")
    assert spec.container is not None and spec.container.options == [option]


def test_a_login_registry_that_reads_as_an_option_is_refused() -> None:
    body = "secrets: [P]\ncontainer: {image: ubuntu, login: {username: u, password_secret: P, registry: -x.io}}\n"
    assert "is not a registry host" in refusal(body)


@pytest.mark.parametrize("dest", ["s3://my-results", "s3://my-results/", "az://acct123/results", "az://acct123/res/"])
def test_an_output_to_a_whole_bucket_asks_for_a_prefix(dest: str) -> None:
    message = refusal(f"outputs: {{ckpt/: '{dest}'}}\n")
    assert "outputs.ckpt/" in message and "is a whole bucket" in message and "/my-run" in message, message


def test_an_output_under_a_prefix_passes() -> None:
    assert parse_spec(HEAD + "outputs: {ckpt/: s3://my-results/run-1}\n", "j.yaml").outputs


def test_the_channel_patterns_match_the_providers_names() -> None:
    from gpucloud.providers.aws.channel import bucket_name
    from gpucloud.providers.azure.channel import storage_account_name
    from gpucloud.spec import data

    assert data._CHANNEL_BUCKET.match(bucket_name("123456789012", "us-east-1"))
    assert data._CHANNEL_BUCKET.match(bucket_name("123456789012", "ap-southeast-2"))
    assert data._CHANNEL_ACCOUNT.match(storage_account_name("0000-sub", "eastus"))
    assert not data._CHANNEL_BUCKET.match("gpucloud-results")


@pytest.mark.parametrize(
    "field", ["inputs: {d: '{}'}", "inputs: {d: {source: '{}', mode: mount}}", "outputs: {o: '{}'}"]
)
@pytest.mark.parametrize(
    "where",
    [
        "s3://gpucloud-123456789012-us-east-1/runs/other",
        "s3://gpucloud-123456789012-eu-west-1",
        "az://gpuc0123456789abcdef0123/gpucloud/runs",
        "https://gpuc0123456789abcdef0123.blob.core.windows.net/gpucloud/runs/x",
    ],
)
def test_the_run_channel_is_no_input_or_output(field: str, where: str) -> None:
    message = refusal(field.replace("{}", where) + "\n")
    assert "gpucloud's own run channel" in message and "other runs'" in message, message


# ---------------------------------------------------------------------------------------------
# The caller's secret values: checked before launch (plan and run exit 2), never echoed


def _job(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(HEAD + "secrets: [TOK]\n")
    return path


@pytest.mark.parametrize("command", [["plan", "--json"], ["run", "--yes"]], ids=lambda c: c[0])
@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("abc\0defSECRETPART", "holds a NUL character"),
        ("S" * (128 * 1024), "is 131072 bytes; an environment variable holds less than 128 KiB"),
    ],
    ids=["nul", "big"],
)
def test_a_secret_value_that_no_environment_can_hold_fails_before_launch(
    tmp_path: Path, gpucloud_home: Path, command: list[str], value: str, words: str
) -> None:
    secret_file = tmp_path / "s.env"
    secret_file.write_bytes(b"TOK=" + value.encode())
    res = CliRunner().invoke(app, [*command, "--secret-file", str(secret_file), str(_job(tmp_path))])
    assert res.exit_code == 2, res.output
    assert f"secret TOK: its value {words}" in " ".join(res.output.split()) and "nothing was launched" in res.output
    assert "SECRETPART" not in res.output and "SSSS" not in res.output
    assert not (gpucloud_home / "runs").exists() or not any((gpucloud_home / "runs").iterdir())


def test_a_value_just_under_the_limit_passes(tmp_path: Path) -> None:
    secret_file = tmp_path / "s.env"
    secret_file.write_text("TOK=" + "S" * (128 * 1024 - 5))
    res = CliRunner().invoke(app, ["plan", "--json", "--secret-file", str(secret_file), str(_job(tmp_path))])
    assert res.exit_code == 0, res.output[-2000:]


@pytest.mark.parametrize("line", ["hf_abcdef-SECRETPART=x", "my token SECRETPART = x", "0SECRETPART=1"])
def test_a_secret_file_line_is_never_echoed(tmp_path: Path, line: str) -> None:
    secret_file = tmp_path / "s.env"
    secret_file.write_text(f"# a comment\nTOK=fine\n{line}\n")
    summary = tmp_path / "summary.md"
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}  # annotations and the summary too
    res = CliRunner().invoke(app, ["plan", "--json", "--secret-file", str(secret_file), str(_job(tmp_path))], env=env)
    assert res.exit_code == 2, res.output
    assert f"--secret-file {secret_file}:3:" in res.output and "::error" in res.output
    assert "SECRETPART" not in res.output
    assert not summary.exists() or "SECRETPART" not in summary.read_text()


def test_a_secret_flag_with_a_bad_name_is_not_echoed(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["plan", "--json", "--secret", "sk-SECRETPART=1", str(_job(tmp_path))])
    assert res.exit_code == 2 and "SECRETPART" not in res.output, res.output


@pytest.mark.parametrize(
    "text",
    [
        "".join(f"l{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 12)).replace(
            "l1: &a1 [*a0", "l0: &a0 [x]\nl1: &a1 [*a0"
        )
        + "name: x\nrun: *a11\n",
        "name: x\nrun: y\nenv: &e {A: 1, B: *e}\n",
    ],
    ids=["billion-laughs", "self-reference"],
)
def test_an_alias_bomb_is_refused_before_it_is_built(text: str) -> None:
    import time

    start = time.monotonic()
    with pytest.raises(SpecError, match="nested or aliased far too deeply"):
        parse_spec(text, "job.yaml")
    assert time.monotonic() - start < 0.5  # counted on the composed tree, not built to 100,000 nodes
