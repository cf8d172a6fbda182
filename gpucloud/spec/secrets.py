"""The caller's side of `secrets:` and `--env`: values for the secret names, from `--secret
NAME=VALUE`, `--secret NAME` / the job's `secrets:` list (the caller's environment) or
`--secret-file PATH` (NAME=VALUE lines), and `--env NAME=VALUE` overrides of the file's `env`.

The values live only in a `SecretValues` in this process's memory: they are never written to the
job spec (which the state store keeps), never rendered, and reach the node sealed to its key
(gpucloud/run/secrets.py). A name without a value fails before anything is launched.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpucloud.errors import UserError
from gpucloud.spec.values import check_env_key

if TYPE_CHECKING:
    from gpucloud.spec.models import JobSpec

SECRET_FILE_MAX = 1024 * 1024
# Linux refuses an environment string (NAME=VALUE) of 32 pages or more (MAX_ARG_STRLEN): the job
# could not start with it, so such a value is refused before anything is launched.
SECRET_VALUE_MAX = 128 * 1024


class SecretValues(Mapping[str, str]):
    """Secret values by name; its repr and str never show a value (a stray log line or traceback
    prints names only)."""

    def __init__(self, values: Mapping[str, str] | None = None, missing: Sequence[str] = ()) -> None:
        self._values = dict(values or {})
        self.missing = tuple(missing)  # names without a value (`plan` only: `run` refuses them)

    def __getitem__(self, key: str) -> str:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"SecretValues({sorted(self._values)})"

    __str__ = __repr__


def _name(name: str, where: str, *, echo: bool = True) -> str:
    """A secret's name, checked as the job file's are. `echo=False` (a secret file's line): the
    error names the place only, since a line whose name is wrong may be a value."""
    try:
        return check_env_key(name.strip())
    except Exception as exc:  # the spec's own check: PydanticCustomError with the reason
        reason = str(exc) if echo else "the part before = is not a valid variable name (not shown: it may be a value)"
        raise UserError(f"{where}: {reason}", hint="Write NAME=VALUE with NAME like HF_TOKEN.") from None


def _value_problem(name: str, value: str) -> str | None:
    """Why a value cannot reach the job's environment (never the value itself), or None."""
    if "\0" in value:
        return f"secret {name}: its value holds a NUL character, which no environment variable can carry"
    size = len(name.encode()) + 1 + len(value.encode())
    if size >= SECRET_VALUE_MAX:
        return (
            f"secret {name}: its value is {size - len(name) - 1} bytes; an environment variable holds "
            f"less than {SECRET_VALUE_MAX // 1024} KiB with its name"
        )
    return None


def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    """`--env NAME=VALUE` (repeatable) as a dict; a malformed one fails naming it."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise UserError(f"--env {pair}: expected NAME=VALUE.", hint="e.g. --env EPOCHS=3")
        out[_name(name, "--env")] = value
    return out


def read_secret_file(path: str) -> dict[str, str]:
    """NAME=VALUE lines (blank lines and # comments skipped; one pair of surrounding quotes removed)."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = fh.read(SECRET_FILE_MAX + 1)
    except OSError as exc:
        raise UserError(f"--secret-file {path}: cannot read it ({exc.strerror}).", hint="Check the path.") from None
    if len(raw) > SECRET_FILE_MAX:
        raise UserError(f"--secret-file {path}: larger than 1 MiB.", hint="Keep only NAME=VALUE lines in it.")
    out: dict[str, str] = {}
    for n, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        name, sep, value = text.removeprefix("export ").partition("=")
        if not sep:
            raise UserError(f"--secret-file {path}:{n}: expected NAME=VALUE.", hint="One NAME=VALUE a line.")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[_name(name, f"--secret-file {path}:{n}", echo=False)] = value
    return out


def resolve(
    spec: JobSpec,
    *,
    secrets: Sequence[str] = (),
    secret_files: Sequence[str] = (),
    env: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    missing_ok: bool = False,
) -> tuple[JobSpec, SecretValues]:
    """The job with `--env` applied and every secret name (the job file's, each --secret-file's,
    each `--secret`'s) listed, and the values. Precedence: --secret NAME=VALUE, --secret-file, the
    environment. A name without a value is refused (`run`: before anything is launched), or with
    `missing_ok` (`plan`, a place to explore) listed in `SecretValues.missing` for a warning."""
    environ = os.environ if environ is None else environ
    given: dict[str, str] = {}
    for path in secret_files:
        given.update(read_secret_file(path))
    names = list(spec.secrets) + [n for n in given if n not in spec.secrets]  # a file's names are secrets
    for item in secrets:
        name, sep, value = item.partition("=")
        name = _name(name, "--secret", echo=False)
        if sep:
            given[name] = value
        if name not in names:
            names.append(name)
    values: dict[str, str] = {}
    missing = []
    for name in names:
        if name in given:
            values[name] = given[name]
        elif name in environ:
            values[name] = environ[name]
        else:
            missing.append(name)
    for name, value in values.items():
        if problem := _value_problem(name, value):
            raise UserError(
                f"{problem}: nothing was launched.",
                hint="Pass a file's contents as an input (inputs:) instead, or fix the value.",
            )
    if missing and not missing_ok:
        raise UserError(
            f"secret {', '.join(missing)} has no value: nothing was launched.",
            hint=f"Export {missing[0]} in this shell, or pass --secret {missing[0]}=VALUE or "
            "--secret-file PATH (NAME=VALUE lines).",
        )
    overrides = parse_env(env)
    clash = sorted(set(overrides) & set(names))
    if clash:
        raise UserError(f"--env {clash[0]}: {clash[0]} is a secret.", hint="Pass it with --secret instead.")
    clash = sorted(set(spec.env) & set(names))
    if clash:
        raise UserError(
            f"--secret {clash[0]}: {clash[0]} is set in the job file's env too.",
            hint="Remove it from env: a secret's value comes from the caller, never the file.",
        )
    if overrides or names != list(spec.secrets):
        spec = spec.model_copy(update={"env": {**spec.env, **overrides}, "secrets": names})
    return spec, SecretValues(values, missing)
