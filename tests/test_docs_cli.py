"""The README against the CLI itself: the Commands table lists every command of the typer app
exactly once, every JSON error `kind` and every exit code the code can produce is documented, the
help texts say what they promise, and the examples' stack comments match `gpucloud stack`."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import re
import subprocess
from pathlib import Path

import pytest

import gpucloud
from tests.support.cli import cli
from tests.support.source_tree import SOURCE

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def gpucloud_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return cli(*args, env={**os.environ, "CI": "true", "COLUMNS": "80"}, cwd=REPO, timeout=60)


def section(title: str) -> str:
    """The README text from a `## title` heading to the next heading of the same level."""
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end > 0 else None]


def app_commands() -> set[str]:
    """Every leaf command of the typer app, with its group ("catalog refresh", "image ls")."""
    import typer

    from gpucloud.cli.app import app

    found: set[str] = set()

    def walk(command: object, path: list[str]) -> None:
        subs = getattr(command, "commands", None) or {}
        runs_itself = getattr(command, "callback", None) is not None or getattr(
            command, "invoke_without_command", False
        )
        if path and (not subs or runs_itself):
            found.add(" ".join(path))
        for name, sub in subs.items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


def table_commands() -> list[str]:
    """The commands named in the first cell of each row of the README's Commands table (a cell
    may name several: `gpucloud status [RUN]`, `gpucloud ls`)."""
    names: list[str] = []
    for line in section("Commands").splitlines():
        if not line.startswith("| `gpucloud "):
            continue
        cell = line.split(" | ")[0]
        for usage in re.findall(r"`gpucloud ([^`]+)`", cell):
            words = [w for w in usage.split() if re.fullmatch(r"[a-z][a-z-]*", w)]
            names.append(
                " ".join(words[:2])
                if len(words) > 1 and words[0] in {"catalog", "image", "hosts", "budget"}
                else words[0]
            )
    return names


def test_readme_commands_table_lists_every_command_exactly_once() -> None:
    listed = table_commands()
    twice = sorted({n for n in listed if listed.count(n) > 1})
    assert not twice, f"listed more than once in the README's Commands table: {twice}"
    commands = app_commands()
    assert set(listed) == commands, (
        f"missing from the table: {sorted(commands - set(listed))}; not commands: {sorted(set(listed) - commands)}"
    )


def test_readme_shows_the_required_options() -> None:
    """A required option must be in the table's usage, or the command shown cannot be typed as is."""
    import typer

    from gpucloud.cli.app import app

    rows = {line.split(" | ")[0]: line for line in section("Commands").splitlines() if line.startswith("| `gpucloud ")}

    def walk(command: object, path: list[str]) -> None:
        for name, sub in (getattr(command, "commands", None) or {}).items():
            walk(sub, [*path, name])
        for param in getattr(command, "params", []):
            if getattr(param, "required", False) and getattr(param, "param_type_name", "") == "option":
                usage = " ".join(path)
                cell = next(c for c in rows if f"`gpucloud {usage}" in c)
                assert param.opts[0] in cell, f"`gpucloud {usage}` needs {param.opts[0]}; the README does not show it"

    walk(typer.main.get_command(app), [])


def error_classes() -> list[type]:
    """Every GpucloudError subclass in the package (each module imported)."""
    from gpucloud.errors import GpucloudError

    for info in pkgutil.walk_packages(gpucloud.__path__, "gpucloud."):
        if info.name.endswith("__main__"):
            continue
        importlib.import_module(info.name)
    out: list[type] = []
    todo = [GpucloudError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


def kind_of(cls: type) -> str:
    from gpucloud.errors import error_kind

    exc = cls.__new__(cls)  # error_kind reads only the class's `kind` and name
    return error_kind(exc)


def documented_kinds() -> set[str]:
    text = section("Commands")
    para = text[text.index("`kind` is one of") :]
    para = para[: para.find("\n\n") if "\n\n" in para else None]
    return set(re.findall(r"`([a-z][a-z0-9-]*)`", para))


def test_every_json_error_kind_is_documented() -> None:
    kinds = {kind_of(cls) for cls in error_classes()}
    kinds |= {"usage", "interrupted", "internal"}  # cli.main / jsonout: errors without an exception class
    missing = sorted(kinds - documented_kinds())
    assert not missing, f"JSON error kinds the code can produce but the README does not list: {missing}"


def documented_exit_codes() -> set[int]:
    text = section("Commands")
    table = text[text.index("Exit codes:") :]
    return {int(m) for m in re.findall(r"^\| (\d+) \|", table, flags=re.MULTILINE)}


def code_exit_codes() -> set[int]:
    """Exit codes the code can return: every error class's, and every literal exit in the source."""
    codes = {int(cls.exit_code) for cls in error_classes()}
    for path in (REPO / "gpucloud").rglob("*.py"):
        text = path.read_text()
        codes |= {int(n) for n in re.findall(r"(?:typer\.Exit|sys\.exit)\((\d+)\)", text)}
        codes |= {
            int(n)
            for n in re.findall(r"^\s*return (\d+)\b", text, flags=re.MULTILINE)
            if path.name in ("collect.py", "check.py", "commands.py")
        }
    from gpucloud.ui.jsonout import BROKEN_PIPE_EXIT

    return (codes | {BROKEN_PIPE_EXIT}) - {0}


def test_every_exit_code_is_in_the_readme() -> None:
    missing = sorted(code_exit_codes() - documented_exit_codes())
    assert not missing, f"exit codes a command can return but the README does not list: {missing}"


def test_hosts_probe_does_not_use_the_declined_exit_code() -> None:
    """Exit 1 means a declined prompt; a host that cannot be used is a configuration problem (78)."""
    source = (SOURCE / "gpucloud" / "cli" / "setup.py").read_text()
    probe = source[source.index("def hosts_probe(") :]
    assert "typer.Exit(1)" not in probe and "typer.Exit(78)" in probe
    assert re.search(r"^\| 78 \|[^\n]*hosts probe", README, flags=re.MULTILINE)


def test_hosts_probe_exits_as_the_readme_table_says_for_unreachable_hosts() -> None:
    """The code the README's exit-code table gives `hosts probe` for an unreachable host is the one
    it returns, for every host at once (two that do not answer: both reported)."""
    row = next(m for m in re.finditer(r"^\| (\d+) \|([^\n]*)$", README, flags=re.MULTILINE) if "hosts probe" in m[2])
    assert "unreachable" in row[2]
    out = gpucloud_cli("hosts", "probe", "127.0.0.1:1", "127.0.0.1:2")
    assert out.returncode == int(row[1]), out.stdout + out.stderr
    assert "127.0.0.1:1: unreachable" in out.stdout and "127.0.0.1:2: unreachable" in out.stdout


@pytest.mark.parametrize("command", ["plan", "run", "render", "catalog", "gc"])
def test_cloud_help_lists_the_clouds(command: str) -> None:
    from gpucloud.contract import registry as providers

    out = gpucloud_cli(command, "--help")
    assert out.returncode == 0
    flat = " ".join(out.stdout.split())
    assert ", ".join(providers.names()) in flat, flat
    assert "`gpucloud --help` lists them" not in flat


STACK_COMMENT = re.compile(
    r"driver R(?P<driver>\d+)|CUDA (?P<cuda>\d+\.\d+)|cuDNN (?P<cudnn>\d+(?:\.\d+)*)|"
    r"PyTorch (?P<torch>\d+\.\d+\.\d+)(?:\+cu(?P<cu>\d+))?"
)


def example_claims() -> list[tuple[Path, dict[str, str]]]:
    """(example, what its comments say about the stack) for every example that says anything."""
    out = []
    for path in sorted((REPO / "examples").glob("*.yaml")):
        comments = " ".join(line.lstrip("# ") for line in path.read_text().splitlines() if line.startswith("#"))
        claims = {k: v for m in STACK_COMMENT.finditer(comments) for k, v in m.groupdict().items() if v}
        if claims:
            out.append((path, claims))
    return out


def test_examples_stack_comments_match_gpucloud_stack() -> None:
    from gpucloud.spec.load import load_spec

    claims = example_claims()
    assert any(p.name == "k80-ssh.yaml" for p, _ in claims)
    for path, said in claims:
        spec = load_spec(path)
        assert spec.resources.gpu is not None, path
        out = gpucloud_cli(
            "stack",
            spec.resources.gpu.model,
            *(["--framework", spec.stack.framework] if spec.stack.framework != "none" else []),
            "--json",
        )
        stack = json.loads(out.stdout)
        real = {
            "driver": stack["driver"],
            "cuda": stack["cuda"],
            "cudnn": stack["cudnn"],
            "torch": stack["framework"].partition("==")[2],
        }
        pip = " ".join(gpucloud_cli("stack", spec.resources.gpu.model).stdout.split())
        for key, value in said.items():
            if key == "cu":
                assert f"/whl/cu{value}" in pip, f"{path.name}: comment says +cu{value}; `gpucloud stack` says {pip}"
            elif key == "cudnn":
                assert real["cudnn"].startswith(value), (
                    f"{path.name}: comment says cuDNN {value}; `gpucloud stack` says {real['cudnn']}"
                )
            else:
                assert real[key] == value, f"{path.name}: comment says {key} {value}; `gpucloud stack` says {real[key]}"
