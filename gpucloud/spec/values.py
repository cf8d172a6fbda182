"""Job-file values: the constants, the small parsers the validators share (durations, GPU names,
env keys and values, artifact paths), friendly descriptions of bad values, and the SpecIssue /
SpecError types every part of the job-file check reports through."""

from __future__ import annotations

import datetime as _dt
import difflib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo
from pydantic_core import PydanticCustomError

from gpucloud.contract import registry as providers
from gpucloud.errors import UserError

if TYPE_CHECKING:
    CloudName = str  # a Literal built at run time is opaque to a type checker; pydantic checks the names
else:
    CloudName = Literal[providers.names()]  # the registry's names
FrameworkName = Literal["pytorch", "tensorflow", "none"]

CLOUD_WORDS = (*providers.names(), "any")
CLOUD_INPUT = Literal[CLOUD_WORDS]  # type: ignore[valid-type]
# `[user@]host[:port]` or a ~/.ssh/config alias; never an ssh option (no leading dash, no spaces).
HOST_RE = re.compile(
    r"^(?:[A-Za-z0-9._][A-Za-z0-9._+-]*@)?(?:[A-Za-z0-9_][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?$"
)
FRAMEWORKS = ("pytorch", "tensorflow", "none")
FRAMEWORK_ALIASES = {"torch": "pytorch", "tf": "tensorflow", "keras": "tensorflow", "cpu": "none"}
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
AMI_RE = re.compile(r"^ami-[0-9a-f]{8,17}$")
REGION_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
INSTANCE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)*$")
PKG_VERSION_RE = re.compile(r"^[0-9][0-9A-Za-z.+!-]*$")
_DURATION_RE = re.compile(r"^(?:(\d+)\s*d)?\s*(?:(\d+)\s*h)?\s*(?:(\d+)\s*m)?\s*(?:(\d+)\s*s)?$")
DURATION_PATTERN = r"^\s*[0-9]+\s*$|^\s*([0-9]+\s*d)?\s*([0-9]+\s*h)?\s*([0-9]+\s*m)?\s*([0-9]+\s*s)?\s*$"
GPU_SHORTHAND_PATTERN = r"^\s*[A-Za-z0-9][A-Za-z0-9 _.|-]*(:\s*[0-9]*(\s*\.\.\s*[0-9]*)?)?\s*$"
IMAGE_PATTERN = r"^(auto|ami-[0-9a-f]{8,17}|[^:\s]+:[^:\s]+:[^:\s]+:[^:\s]+)$"
MIN_DURATION_S = 1  # short deadlines are legitimate on the local provider (a timeout for a quick job)
MAX_DURATION_S = 30 * 86400


# ---------------------------------------------------------------------------------------------
# Small helpers shared by the validators


def reject(message: str, *sub: str | int) -> NoReturn:
    """Raise a validation error whose text is exactly `message` (pydantic would otherwise prefix
    "Value error, "). `sub` extends the error location below the validated field, so that e.g. a
    bad item of a cloud list points at that item's line."""
    raise PydanticCustomError("spec", "{msg}", {"msg": message, "sub": tuple(sub)})


def describe(value: Any) -> str:
    """A value as the user wrote it in YAML terms ("the number 5", "a list"), for error messages."""
    if value is None:
        return "nothing (an empty value)"
    if isinstance(value, bool):
        return f"{'true' if value else 'false'} (a boolean)"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"'{value}'" if value else "an empty string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, bytes | bytearray):
        return "binary data"
    if isinstance(value, _dt.date):
        return f"the date {value.isoformat()}"
    return f"a {type(value).__name__}"


def did_you_mean(word: str, choices: list[str] | tuple[str, ...], *, cutoff: float = 0.6) -> str | None:
    """The closest choice to `word` (case, '-' and '_' ignored), or None when nothing is close."""

    def norm(s: str) -> str:
        return s.lower().replace("-", "_")

    by_norm = {norm(c): c for c in choices}
    match = difflib.get_close_matches(norm(word), list(by_norm), n=1, cutoff=cutoff)
    return by_norm[match[0]] if match else None


def refuse_bool(value: Any) -> Any:
    """YAML reads `yes`/`true` as booleans and pydantic would quietly take them as 1: refuse."""
    if isinstance(value, bool):
        reject(f"expected a number, got {describe(value)}")
    return value


def required_text(value: Any, what: str) -> str:
    """A required, non-empty string (stripped), with a message that says what belongs there."""
    if value is None:
        reject(f"has no value. Expected {what}")
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        reject(
            f"expected one shell script ({what}), got a list of {len(value)} commands. Write them one per "
            "line after `|` (a YAML block: the lines run in order as one bash script), or join them with &&"
        )
    if not isinstance(value, str):
        reject(f"expected {what}, got {describe(value)}. Quote the value if it is meant as text")
    text = value.strip()
    if not text:
        reject(f"must not be empty. Expected {what}")
    return text


def parse_duration(value: Any) -> int:
    """Seconds from "90m", "6h", "2d", "1h30m", "45s", "3600" or an integer (bounds not checked)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        reject(f"expected a duration such as 90m, 6h, 2d or 1h30m, got {describe(value)}")
    if isinstance(value, int):
        return value
    text = value.strip().lower()
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    m = _DURATION_RE.fullmatch(text)
    if not text or not m or not any(m.groups()):
        reject(
            f"'{value}' is not a duration. Expected a number with a unit (s, m, h, d) such as 90m, "
            "6h, 2d or 1h30m, or whole seconds"
        )
    days, hours, minutes, seconds = (int(g or 0) for g in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def format_duration(seconds: int) -> str:
    """1h30m-style text for error messages."""
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


def resolve_gpu(name: str) -> str:
    """Canonical catalog name for a GPU name or alias, or an error listing what exists."""
    from gpucloud import catalog  # lazy: only job files that name a GPU pay for the catalog

    canonical = catalog.resolve_gpu_name(name)
    if canonical:
        return canonical
    known = catalog.gpu_names()
    suggestion = catalog.resolve_gpu_name(name.upper().replace("O", "0").replace("I", "1"))
    if suggestion is None:
        spellings = list(known)
        try:
            for gpu in catalog.load_catalog().gpus.values():
                spellings.extend(gpu.aliases)
        except (AttributeError, TypeError):  # an older catalog without aliases: names only
            pass
        # one wrong character in a 2-3 letter name ("T5") scores only 0.5 with difflib
        close = did_you_mean(name.upper(), spellings, cutoff=0.5 if len(name) <= 3 else 0.6)
        suggestion = catalog.resolve_gpu_name(close) if close else None
    hint = f"Did you mean '{suggestion}'? " if suggestion else ""
    reject(f"unknown GPU '{name}'. {hint}Known GPUs: {', '.join(known)}")


# ---------------------------------------------------------------------------------------------
# Item types (Annotated, so that an error points at the item and its line, not the whole list)


def check_env_key(value: Any) -> str:
    if not isinstance(value, str) or not ENV_KEY_RE.fullmatch(value):
        reject(
            f"'{value}' is not a valid environment variable name. Expected letters, digits and "
            "underscores, not starting with a digit, e.g. EPOCHS"
        )
    if value.upper().startswith("GPUCLOUD_"):
        reject(f"'{value}' is reserved: names starting with GPUCLOUD_ are set by gpucloud itself. Rename it")
    from gpucloud.vm.env import NODE_RESERVED, reserved_env_names  # lazy: imported only when a job has env

    if value in NODE_RESERVED:
        reject(
            f"'{value}' is reserved: the VM's bootstrap sets it to the GPUs the run was given (its slice of a "
            "shared host or a Slurm allocation). To use fewer of them, set it inside `run:`"
        )
    if value in reserved_env_names() or value.startswith("BASH"):
        reject(
            f"'{value}' is reserved: the job's shell (bash) owns this variable and the run would break. "
            f"Rename it, e.g. MY_{value.lstrip('_')}"
        )
    return value


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    if value is None:
        reject('has no value. Write "" for an empty value, or remove the variable')
    reject(f"expected text, a number or true/false, got {describe(value)}. Quote it to pass it verbatim")


def _artifact(value: str) -> str:
    if not value.strip():
        reject("must not be empty. Expected a path relative to the job's working folder, e.g. outputs/")
    if value.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:[\\/]", value):
        reject(f"'{value}' is an absolute path. Artifacts are relative to the job's working folder, e.g. outputs/")
    if ".." in re.split(r"[\\/]+", value):
        reject(f"'{value}' leaves the working folder with '..'. Use a path inside it, e.g. outputs/")
    return value


EnvKey = Annotated[str, BeforeValidator(check_env_key, json_schema_input_type=str)]
EnvValue = Annotated[str, BeforeValidator(_env_value, json_schema_input_type=str | int | float | bool)]
ArtifactPath = Annotated[str, AfterValidator(_artifact)]


def _port(value: Any) -> Any:
    """A TCP port on the node that `gpucloud ssh` forwards: a number (YAML's `yes` is not 1)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        reject(f"{describe(value)} is not a port. Expected a whole number from 1 to 65535, e.g. 8888")
    return value


def _unique_ports(ports: list[int]) -> list[int]:
    twice = sorted({p for p in ports if ports.count(p) > 1})
    if twice:
        reject(f"port {twice[0]} is listed twice. List each port once, e.g. [6006, 8888]")
    if len(ports) > MAX_PORTS:
        reject(f"{len(ports)} ports; at most {MAX_PORTS} are forwarded")
    return ports


MAX_PORTS = 16  # what one `gpucloud ssh` session forwards (contract/session.py MAX_FORWARDS)
PortList = Annotated[list[Annotated[int, BeforeValidator(_port)]], AfterValidator(_unique_ports)]


# ---------------------------------------------------------------------------------------------
# Errors


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a job file: where it is and what is wrong (with the fix)."""

    file: str
    line: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


class SpecError(UserError):
    """A job file is invalid. `issues` holds every problem found, sorted by line; the message is one
    line per problem, preceded by a summary line when there are several."""

    def __init__(self, issues: list[SpecIssue]) -> None:
        self.issues = sorted(issues, key=lambda i: (i.line or 0, i.field))
        if len(self.issues) == 1:
            message = str(self.issues[0])
        else:
            file = self.issues[0].file
            lines = [f"{file}: {len(self.issues)} problems in the job file:"]
            lines += [f"  {issue}" for issue in self.issues]
            message = "\n".join(lines)
        super().__init__(message)


# resources.arch: the host CPU's architecture. x86_64 by default, since most wheels and containers
# are built for it; a Graviton machine (AWS g5g, T4G) is a candidate only when the job says so.
CpuArch = Literal["x86_64", "arm64", "any"]
_ARCH_WORDS: dict[str, str] = {
    "x86_64": "x86_64",
    "amd64": "x86_64",
    "arm64": "arm64",
    "aarch64": "arm64",
    "any": "any",
}


def cpu_arch(value: Any) -> str:
    """x86_64 | arm64 | any, case-insensitive (amd64 and aarch64 are the same two)."""
    word = value.strip().lower() if isinstance(value, str) else None
    if word is None or word not in _ARCH_WORDS:
        close = did_you_mean(str(word or value), list(_ARCH_WORDS))
        hint = f"Did you mean '{close}'? " if close else ""
        reject(
            f"{describe(value)} is not a CPU architecture. {hint}Expected x86_64 (the default), arm64 "
            "(AWS Graviton: g5g) or any"
        )
    return _ARCH_WORDS[word]


KEEP_MIN_S = 10


def keep_duration(value: Any, num_nodes: Any) -> int | None:
    """`keep: 30m`: how long a finished job's machine waits idle for the next job (off: None). Only
    one node: a kept machine takes `gpucloud exec`/`run --on` jobs one at a time."""
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in ("off", "none")):
        return None
    seconds = parse_duration(value)
    if seconds < KEEP_MIN_S:
        reject(
            f"{describe(value)} is {seconds} s. Expected an idle time of at least {KEEP_MIN_S} s such as 30m, or off"
        )
    if isinstance(num_nodes, int) and num_nodes > 1:
        reject(f"keeps one machine, and this job has num_nodes: {num_nodes}. Remove keep, or set num_nodes: 1")
    return seconds


def _keep_field(value: Any, info: ValidationInfo) -> int | None:
    return keep_duration(value, info.data.get("num_nodes"))


# JobSpec.keep: "30m" / 1800 / off, for one node (declared after num_nodes, which it reads)
KeepSeconds = Annotated[
    int | None,
    BeforeValidator(_keep_field, json_schema_input_type=int | Annotated[str, Field(pattern=DURATION_PATTERN)] | None),
]
