"""A deterministic job-file fuzzer (tests/spec/test_fuzz.py, bench/fuzz_job_files.py): valid job files
(examples/ and the README's) mutated into hostile shapes, each run through `validate`, `plan --json`
and `render` in this process (typer's runner), every exit checked against the documented codes.

Mutations: a wrong type at a field (every field the job file knows, present or not), nested lists
and mappings, huge numbers, NaN/inf, unicode and control characters, empty strings, deep nesting,
unknown keys, a missing required key; and on the YAML text: alias bombs (billion laughs), duplicated
keys, tags (!!python/object, !!binary, !!set ...), anchors and merge keys, byte-level damage.

Offline: the network lookups `plan` makes for inputs/outputs are answered by stubs (`offline`), SSH
hosts by an ssh_config that points every host at a closed port, and no cloud credential is set; the
catalog is the shipped one.
"""

from __future__ import annotations

import contextlib
import copy
import os
import random
import re
import shutil
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
COMMANDS: tuple[tuple[str, ...], ...] = (("validate",), ("plan", "--json"), ("render",))
# Exit codes each command may give for a job file (README, "Exit codes"): 75 and 78 when a host or a
# cloud cannot be reached (plan and render look at the job's machines); never 70.
ALLOWED = {"validate": {0, 2}, "plan": {0, 2, 75, 78}, "render": {0, 2, 75, 78}}

FIELDS: tuple[tuple[str, ...], ...] = (
    ("name",),
    ("resources",),
    ("resources", "cloud"),
    ("resources", "regions"),
    ("resources", "gpu"),
    ("resources", "gpu", "model"),
    ("resources", "gpu", "count"),
    ("resources", "gpu", "memory"),
    ("resources", "gpu_order"),
    ("resources", "instance_type"),
    ("resources", "spot"),
    ("resources", "max_price_per_hour"),
    ("resources", "min_vcpus"),
    ("resources", "min_memory_gib"),
    ("resources", "disk_gb"),
    ("resources", "ssh"),
    ("resources", "idle_timeout"),
    ("resources", "hosts"),
    ("resources", "cluster"),
    ("resources", "partition"),
    ("resources", "account"),
    ("resources", "qos"),
    ("resources", "constraint"),
    ("num_nodes",),
    ("stack",),
    ("stack", "driver"),
    ("stack", "cuda"),
    ("stack", "cudnn"),
    ("stack", "framework"),
    ("stack", "framework_version"),
    ("stack", "cuda_toolkit"),
    ("stack", "install"),
    ("image",),
    ("container",),
    ("container", "image"),
    ("container", "options"),
    ("container", "user"),
    ("container", "entrypoint"),
    ("container", "login"),
    ("container", "login", "username"),
    ("container", "login", "password_secret"),
    ("container", "login", "registry"),
    ("workdir",),
    ("env",),
    ("env", "EPOCHS"),
    ("secrets",),
    ("inputs",),
    ("inputs", "data/"),
    ("inputs", "data/", "source"),
    ("inputs", "data/", "mode"),
    ("outputs",),
    ("outputs", "ckpt/"),
    ("outputs_sync",),
    ("setup",),
    ("run",),
    ("artifacts",),
    ("max_duration",),
    ("checkpoint",),
    ("checkpoint_interval",),
    ("recovery",),
    ("recovery", "max_restarts"),
    ("recovery", "fallback"),
)

_WORDS = (
    "",
    " ",
    "auto",
    "any",
    "none",
    "K80:1",
    "A100|H100:8",
    "L4:1..2",
    "24GB..",
    "..",
    ":",
    "-1",
    "0",
    "6h",
    "30d1s",
    "1e400",
    "pytorch==",
    "ubuntu",
    "-eFOO=bar",
    "--privileged",
    "s3://gpucloud-123456789012-us-east-1/x",
    "s3://bucket",
    "az://acct123/cont/p",
    "https://example.invalid/f",
    "ftp://x",
    "/proc/self/environ",
    "../../..",
    "~/.aws",
    "$(id)",
    "`id`",
    "a;rm -rf /",
    "::error::x",
    "\x1b[31mred",
    "\x00nul",
    "\u202eRTL",
    "\u200bzero-width",
    "e\u0301",
    "\U0001f600",
    "\ud800",
    "line\nbreak",
    "tab\there",
    "x" * 5000,
)


def hostile_value(rng: random.Random, depth: int = 0) -> Any:
    """One value of a random hostile shape."""
    kind = rng.randrange(14 if depth < 3 else 10)
    if kind == 0:
        return rng.choice([0, -1, 1, 2**31, 2**63, 10**100, -(10**100)])
    if kind == 1:
        return rng.choice([float("nan"), float("inf"), float("-inf"), 1e308, -0.0, 0.5, 1e-320])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind in (3, 4, 5, 6):
        return rng.choice(_WORDS)
    if kind == 7:
        return "".join(
            chr(rng.choice([rng.randrange(32), rng.randrange(0x7F, 0xA0), rng.randrange(0x110000)]))
            for _ in range(rng.randrange(1, 12))
        )
    if kind == 8:
        return rng.choice([[], {}, [[]], [{}], {"": None}])
    if kind == 9:
        return nested(rng.randrange(2, 60), rng.random() < 0.5)
    if kind in (10, 11):
        return [hostile_value(rng, depth + 1) for _ in range(rng.randrange(1, 4))]
    return {
        rng.choice(["a", "model", "count", "", "1", "source", "mode"]): hostile_value(rng, depth + 1)
        for _ in range(rng.randrange(1, 4))
    }


def nested(depth: int, as_list: bool) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value] if as_list else {"a": value}
    return value


def _set(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node: Any = doc
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


def mutate_data(doc: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """One to three changes to the parsed job: hostile values, unknown keys, a key removed."""
    doc = copy.deepcopy(doc)
    for _ in range(rng.randrange(1, 4)):
        roll = rng.random()
        if roll < 0.75:
            _set(doc, rng.choice(FIELDS), hostile_value(rng))
        elif roll < 0.85:
            _set(doc, (*rng.choice(FIELDS)[:-1], rng.choice(["nmae", "gpus", "x" * 300, "1", "\u00e9"])), 1)
        elif doc:
            doc.pop(rng.choice(sorted(doc)), None)
    return doc


_TAGS = (
    "!!python/object/apply:os.system ['echo pwned']",
    "!!python/name:os.system",
    "!!binary aGVsbG8=",
    "!!set {a, b}",
    "!!omap [a: 1]",
    "!!timestamp 2001-12-14",
    "!!float nan",
    "!!int 0x1f",
    "!custom x",
    "!!str",
    "!!map {a: 1}",
    "!!seq [1]",
    "!<tag:yaml.org,2002:python/object:object> {}",
)


def billion_laughs(levels: int, width: int) -> str:
    lines = ["bomb0: &a0 [lol, lol]"]
    for i in range(1, levels):
        lines.append(f"bomb{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def mutate_text(text: str, rng: random.Random, light: bool = False) -> str:
    """A YAML-level attack on the dumped text. `light`: bombs, nesting and long lines kept small
    (each full-size one costs the loader seconds; the bench runs them)."""
    lines = text.splitlines() or [""]
    roll = rng.randrange(9)
    if roll == 0:  # an alias bomb in front, its last level used as a field's value
        levels = rng.randrange(3, 6) if light else rng.randrange(4, 12)
        key = rng.choice(["run", "env", "secrets", "artifacts", "resources"])
        bomb = billion_laughs(levels, rng.randrange(2, 4 if light else 10)).replace("bomb", "x_bomb")
        return bomb + text + f"\n{key}: *a{levels - 1}\n"
    if roll == 1:  # a duplicated key
        line = rng.choice(lines)
        return text + "\n" + line + "\n"
    if roll == 2:  # a tag as a field's value
        key = rng.choice([p[0] for p in FIELDS])
        return text + f"\n{key}: {rng.choice(_TAGS)}\n"
    if roll == 3:  # an anchor and a merge key
        return "base: &b {name: x, run: y}\n" + text + "\n<<: *b\nresources: {<<: *b}\n"
    if roll == 4:  # deep flow nesting
        depth = rng.choice([50, 500] if light else [50, 500, 5000])
        return text + f"\nenv: {'[' * depth}{']' * depth}\n"
    if roll == 5:  # damage: bytes flipped, a line cut or repeated
        chars = list(text)
        for _ in range(rng.randrange(1, 6)):
            if chars:
                chars[rng.randrange(len(chars))] = rng.choice(
                    [":", "-", "[", "{", "\t", "'", '"', "&", "*", "!", "%", "\x00", "\ufeff"]
                )
        return "".join(chars)
    if roll == 6:  # a huge or odd number literal
        key = rng.choice(["num_nodes", "max_duration", "checkpoint_interval", "resources"])
        return (
            text
            + f"\n{key}: {rng.choice(['1e400', '-.inf', '.nan', '0x' + 'f' * 200, '9' * 5000, '0o777', '1_000'])}\n"
        )
    if roll == 7:  # a very long single line
        return text + "\nrun: " + "a" * rng.choice([10_000] if light else [10_000, 900_000]) + "\n"
    return "\n".join(lines[: rng.randrange(len(lines) + 1)]) + "\n"  # truncated


def seeds() -> list[tuple[Path, str]]:
    """(place relative to the repository, text) of every valid job file we mutate."""
    out = [(p.relative_to(REPO), p.read_text()) for p in sorted((REPO / "examples").rglob("*.yaml"))]
    readme = (REPO / "README.md").read_text()
    for block in re.findall(r"```yaml\n(.*?)```", readme, re.S):
        if re.search(r"^run:", block, re.M):
            out.append((Path("examples/readme.yaml"), block))
            uncommented = re.sub(r"^(\s*)# ((?:hosts|cluster|partition|container):)", r"\1\2", block, flags=re.M)
            out.append((Path("examples/readme-uncommented.yaml"), uncommented))
    return out


def generate(count: int, seed: int = 0, light: bool = False) -> Iterator[tuple[str, Path, str]]:
    """`count` (id, place, text) job files, the same for the same seed and `light`."""
    rng = random.Random(seed)
    bases = seeds()
    for n in range(count):
        place, text = bases[n % len(bases)]
        doc = yaml.safe_load(text)
        if rng.random() < 0.7 and isinstance(doc, dict):
            doc = mutate_data(doc, rng)
            try:
                text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=rng.random() < 0.5, width=10_000)
            except (yaml.YAMLError, RecursionError, ValueError):
                text = repr(doc)
        if rng.random() < 0.4:
            text = mutate_text(text, rng, light)
        yield f"{seed}-{n}", place, text


# ---------------------------------------------------------------------------------------------
# Running them


@dataclass
class Outcome:
    """The counts per command and exit code, and every failure (exit 70, an undocumented exit, a
    traceback) with its file."""

    codes: Counter[tuple[str, int]] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    files: int = 0
    seconds: float = 0.0


class _NoSleep:
    """The `time` module without its pauses."""

    monotonic = staticmethod(time.monotonic)
    perf_counter = staticmethod(time.perf_counter)
    time = staticmethod(time.time)

    @staticmethod
    def sleep(seconds: float) -> None:
        return None


class _FakeStore:
    """A storage account that has one object under every prefix (plan's lookups, offline)."""

    def __init__(self, account: str) -> None:
        self.account = account

    def list_input(self, container: str, prefix: str, where: str) -> tuple[str, list[tuple[str, int, str]]]:
        return "us-east-1", [("a", 1, f"{prefix}/a")]

    def check_output(self, container: str, where: str) -> str:
        return "us-east-1"

    def check_mount(self, container: str, prefix: str, where: str) -> str:
        return "us-east-1"


def _fake_store(src: Any) -> _FakeStore | None:
    """A fake wherever the registry has a store for the scheme (S3 and Blob alike), None elsewhere."""
    from gpucloud.contract import registry

    return _FakeStore(src.account) if registry.data_store_class(src.kind) else None


@contextlib.contextmanager
def offline(tmp: Path) -> Iterator[None]:
    """The network lookups plan makes for a job's data answered from here; SSH to a closed port."""
    from gpucloud.providers.aws import data as s3
    from gpucloud.providers.aws import mount
    from gpucloud.providers.ssh import transport
    from gpucloud.run import data_grants

    config = tmp / "ssh_config"
    config.write_text("Host *\n  HostName 127.0.0.1\n  Port 1\n  ConnectionAttempts 1\n  ConnectTimeout 1\n")
    saved_env = dict(os.environ)
    patches: list[tuple[Any, str, Any]] = [
        (transport, "time", _NoSleep),  # ssh's retry pauses: the closed port answers at once
        (data_grants, "_store", _fake_store),
        (data_grants, "_https_size", lambda url, where: 1),
        (s3, "list_input", lambda bucket, prefix, where: ("us-east-1", [("a", 1, f"{prefix}/a")])),
        (s3, "check_output", lambda bucket, where: "us-east-1"),
        (mount, "check_mount", lambda bucket, prefix, where: "us-east-1"),
    ]
    for k in [k for k in os.environ if k.startswith(("AWS_", "AZURE_", "ARM_", "GOOGLE_"))]:
        del os.environ[k]
    os.environ.update({"GPUCLOUD_SSH_CONFIG": str(config), "AWS_EC2_METADATA_DISABLED": "true", "COLUMNS": "120"})
    try:
        with _patched(patches):
            yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)


@contextlib.contextmanager
def _patched(patches: list[tuple[Any, str, Any]]) -> Iterator[None]:
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, value in patches:
        setattr(obj, name, value)
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def workspace(tmp: Path) -> Path:
    """A copy of examples/ (the job files' workdirs resolve there) in which the mutants are written."""
    root = tmp / "repo"
    if not (root / "examples").exists():
        shutil.copytree(REPO / "examples", root / "examples")
    return root


def run_one(invoke: Callable[[list[str]], Any], path: Path, name: str, outcome: Outcome, every: bool) -> None:
    """The three commands on one file; `every=False`: plan and render only when validate passed (a
    file validate refuses fails the same way in their shared loader)."""
    for command in COMMANDS:
        res = invoke([*command, str(path)])
        code = res.exit_code
        outcome.codes[(command[0], code)] += 1
        exc = res.exception
        crashed = exc is not None and not isinstance(exc, SystemExit)
        output = res.output or ""
        if code not in ALLOWED[command[0]] or crashed or "Traceback (most recent call last)" in output:
            detail = "".join(traceback.format_exception(exc)) if crashed and exc else output[-1500:]
            outcome.failures.append(f"{name} {' '.join(command)} -> exit {code}\n{detail}")
        if command[0] == "validate" and code != 0 and not every:
            return


def fuzz(
    count: int,
    tmp: Path,
    seed: int = 0,
    *,
    light: bool = False,
    every: bool = True,
    on_file: Callable[[str, Path], None] | None = None,
) -> Outcome:
    """Generate `count` job files and run each through validate, plan --json and render (`light`:
    small bombs; `every=False`: plan/render on every file validate passes, one in four it refuses)."""
    import typer.main
    import typer.testing
    from typer.testing import CliRunner

    from gpucloud.cli.app import app

    runner = CliRunner()
    built = typer.main.get_command(app)  # typer rebuilds the click command on every invoke: once is enough
    root = workspace(tmp)
    outcome = Outcome()
    start = time.monotonic()
    with offline(tmp), _patched([(typer.testing, "_get_command", lambda _app: built)]):
        for n, (name, place, text) in enumerate(generate(count, seed, light)):
            path = root / place.parent / f"fuzz-{name}.yaml"
            path.write_bytes(text.encode("utf-8", "surrogatepass"))
            if on_file:
                on_file(name, path)
            run_one(lambda args: runner.invoke(app, args), path, name, outcome, every or n % 4 == 0)
            if not any(name in f for f in outcome.failures):
                path.unlink()
            outcome.files += 1
    outcome.seconds = time.monotonic() - start
    return outcome
