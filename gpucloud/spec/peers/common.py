"""What the peer importers share: reading a peer's YAML as plain data with the job file's limits, the
draft job they fill in (with a note for every field that has no gpucloud equivalent), the GPU and
cloud names gpucloud knows, and the YAML text the draft becomes.

Why plain data and not the job model: a peer file is not a gpucloud file, so its mistakes are the
peer's; the importer maps what it can, says what it could not, and the caller validates the result
as any job file (gpucloud/spec/peers/__init__.py)."""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path
from typing import Any

from gpucloud.contract import registry as providers
from gpucloud.errors import UserError
from gpucloud.prose import YAML_WIDTH
from gpucloud.spec.values import ENV_KEY_RE, NAME_RE

MAX_BYTES = 1 << 20  # as a job file: a peer task is a few KiB; more is a wrong path
MAX_NODES = 100_000  # composed nodes counted through aliases: an alias bomb stops here
NOTE = "# gpucloud import: "
# The order keys are written in (the README's job file order); anything else follows.
KEY_ORDER = (
    "name",
    "resources",
    "num_nodes",
    "container",
    "workdir",
    "env",
    "secrets",
    "inputs",
    "outputs",
    "setup",
    "run",
    "max_duration",
    "recovery",
)
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTP]i?B?|[kmgtp]i?b?)?\s*$")
_UNIT_GB = {"": 1.0, "K": 1 / 1024**2, "M": 1 / 1024, "G": 1.0, "T": 1024.0, "P": 1024.0**2}


class Draft:
    """The gpucloud job being written: `job` (plain data) and `notes`, each (output key or "" for the
    header, text). `peer` names the source format in messages."""

    def __init__(self, peer: str, filename: str) -> None:
        self.peer = peer
        self.filename = filename
        self.job: dict[str, Any] = {}
        self.notes: list[tuple[str, str]] = []
        self.unmapped: list[str] = []  # the peer's fields that did not map (or only partly)

    @property
    def resources(self) -> dict[str, Any]:
        return self.job.setdefault("resources", {})

    def note(self, field: str, text: str, at: str = "") -> None:
        """`field` of the peer file has no (exact) equivalent: say so where `at` is written."""
        self.notes.append((at, f"{field}: {text}"))
        if field not in self.unmapped:
            self.unmapped.append(field)

    def say(self, text: str, at: str = "") -> None:
        """A remark that is no unmapped field (what the importer filled in, and why)."""
        self.notes.append((at, text))

    def drop_rest(self, rest: dict[str, Any], prefix: str = "", at: str = "") -> None:
        """Each field left in `rest` has no equivalent: noted as dropped."""
        for key, value in rest.items():
            self.note(f"{prefix}{key}", f"{shown(value, 40)} has no gpucloud equivalent; dropped.", at)

    def mapping(self, value: Any, field: str, at: str = "") -> dict[str, Any]:
        """`value` as a mapping to read fields from: {} for none, and a note for anything else."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.note(field, f"{shown(value)} is not a mapping; dropped.", at)
            return {}
        return dict(value)


def shown(value: Any, limit: int = 60) -> str:
    """A peer value inside a comment: one line, printable, clipped (a comment cannot hold a newline)."""
    text = value if isinstance(value, str) else repr(value)
    text = "".join(c if c.isprintable() else " " for c in text.replace("\n", " ")).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------
# Reading


def read_peer(path: Path) -> tuple[dict[str, Any], str]:
    """The file as plain data (a mapping) and its text; UserError (exit 2) naming the file and the fix."""
    name = str(path)
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except IsADirectoryError:
        raise UserError(f"{name}: is a directory.", hint="Pass the SkyPilot or dstack YAML file itself.") from None
    except OSError as exc:
        raise UserError(f"{name}: cannot be read: {exc.strerror or exc}.", hint="Check the path.") from None
    if len(raw) > MAX_BYTES:
        raise UserError(f"{name}: is larger than {MAX_BYTES // 1024} KiB, far too big for a task file.")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(f"{name}: is not UTF-8 text (byte offset {exc.start}).", hint="Save it as UTF-8.") from None
    data = _safe_load(text, name)
    if not isinstance(data, dict):
        raise UserError(
            f"{name}: is not a SkyPilot task or a dstack configuration: it holds {type(data).__name__}, "
            "not a mapping of keys.",
            hint="Pass a SkyPilot task YAML (resources, setup, run) or a dstack .dstack.yml (type: task).",
        )
    return data, text


def _safe_load(text: str, name: str) -> Any:
    """PyYAML's safe loader, after counting the composed nodes through aliases (a "billion laughs"
    document composes small and expands huge) and refusing deep nesting."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        _count(node, [0])
        return None if node is None else yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{name}:{mark.line + 1}" if mark is not None else name
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise UserError(f"{where}: invalid YAML: {problem}.", hint="Fix the file's YAML first.") from None
    except (RecursionError, _TooBig):
        raise UserError(f"{name}: the YAML document is nested or aliased far too deeply to be a task file.") from None
    except (ValueError, TypeError) as exc:
        raise UserError(f"{name}: invalid YAML value: {exc}.") from None


class _TooBig(Exception):
    pass


def _count(node: Any, seen: list[int]) -> None:
    if node is None:
        return
    seen[0] += 1
    if seen[0] > MAX_NODES:
        raise _TooBig()
    if isinstance(node.value, list):
        for item in node.value:
            for sub in item if isinstance(item, tuple) else (item,):
                _count(sub, seen)


# ---------------------------------------------------------------------------------------------
# Values


def job_name(value: Any, filename: str, draft: Draft) -> str:
    """A gpucloud name (lower-case letters, digits, dashes, 1-40) from the peer's name or the file's."""
    stem = Path(filename).name.split(".")[0] or "imported"
    raw = value if isinstance(value, str) and value.strip() else stem
    fixed = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]+", "-", raw.lower()))[:40].strip("-") or "imported"
    if not NAME_RE.fullmatch(fixed):
        fixed = "imported"
    if value is None:
        draft.say(f"the file names no job: name {fixed} comes from the file name.", "name")
    elif fixed != value:
        draft.say(f"name {shown(value)} became {fixed} (lower-case letters, digits and dashes).", "name")
    return fixed


def gpu_model(name: str) -> str | None:
    """The catalog's canonical name for a peer's GPU name, or None when gpucloud knows no such GPU."""
    from gpucloud import catalog

    return catalog.resolve_gpu_name(name.strip())


def offered_gpu(text: str, clouds: list[str], draft: Draft, field: str) -> str:
    """`text` ("MODEL:COUNT") when some cloud still sells that many of that GPU per machine, else
    the nearest count of the same family that is sold (noted): peers' examples ask for V100s whose
    instance types are retired, and a job that cannot be planned is no conversion."""
    from gpucloud import catalog

    model, _, count = text.partition(":")
    shipped = catalog.load_catalog()
    live = {
        (o.gpu, o.gpu_count)
        for o in shipped.offerings
        if o.status != "retired" and (not clouds or o.cloud in clouds) and o.gpu in shipped.members(model)
    }
    if not count.isdigit() or (model, int(count)) in live or not live:
        return text
    gpu, number = min(live, key=lambda gn: (abs(gn[1] - int(count)), gn[1], gn[0]))
    draft.note(
        field,
        f"{text}: no cloud gpucloud plans sells {count} x {model} per machine any more (retired instance "
        f"types); {gpu}:{number} is the nearest that is sold. Check its price with `gpucloud plan`, or "
        "choose another GPU (`gpucloud gpus`).",
        "resources",
    )
    return f"{gpu}:{number}"


def whole(value: Any) -> int | None:
    """A positive count from a number or "4" / "4+" / "4.5" (rounded up), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str) and re.fullmatch(r"\s*[0-9]+(\.[0-9]+)?\s*\+?\s*", value):
        number = float(value.strip().rstrip("+"))
    else:
        return None
    return max(1, math.ceil(number)) if number > 0 else None


def size_gb(value: Any) -> float | None:
    """GB from 256 / "256" / "256GB" / "1TB" / "512MB" (binary units, as both peers count), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if value > 0 else None
    if not isinstance(value, str):
        return None
    found = _SIZE_RE.fullmatch(value.rstrip("+"))
    if not found:
        return None
    unit = (found.group(2) or "").upper()[:1]
    gb = float(found.group(1)) * _UNIT_GB[unit]
    return gb if gb > 0 else None


def gpucloud_clouds(names: list[Any], field: str, draft: Draft) -> list[str]:
    """The peer's clouds that gpucloud has as priced providers; the others noted."""
    ours = providers.priced_clouds()
    kept = [str(n).strip().lower() for n in names if str(n).strip().lower() in ours]
    dropped = [shown(n) for n in names if str(n).strip().lower() not in ours]
    if dropped:
        draft.note(
            field,
            f"{', '.join(dropped)} {'is' if len(dropped) == 1 else 'are'} not a gpucloud cloud. gpucloud runs on "
            f"{', '.join(ours)}, your own machines (cloud: ssh with hosts:) and Slurm (cloud: slurm); "
            + ("kept the rest." if kept else "left cloud unset, so any of them is planned."),
            "resources",
        )
    return list(dict.fromkeys(kept))


def env_names(keys: list[Any], field: str, draft: Draft) -> list[str]:
    """The keys that are valid variable names gpucloud lets a job set; the others noted."""
    good = [k for k in keys if isinstance(k, str) and ENV_KEY_RE.fullmatch(k) and not k.upper().startswith("GPUCLOUD_")]
    for key in keys:
        if key not in good:
            draft.note(f"{field}.{shown(key)}", "not a variable name gpucloud lets a job set; dropped.", "env")
    return good


def env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def with_peer_variables(script: str, aliases: dict[str, str]) -> tuple[str, list[str]]:
    """`script` with the peer's node variables it uses set from gpucloud's, first (and their names)."""
    used = [name for name in aliases if re.search(rf"\b{name}\b", script)]
    if not used:
        return script, []
    head = "".join(f'export {name}="{aliases[name]}"\n' for name in used)
    return head + script, used


# ---------------------------------------------------------------------------------------------
# Writing


def render(draft: Draft, source: str) -> str:
    """The job as YAML, keys in the README's order, each note as a `# gpucloud import:` comment
    above the key it concerns (the header for the rest)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    out = [
        "# A gpucloud job file, converted by `gpucloud import`",
        f"# from {draft.peer}:",
        f"# {shown(source, 200)}",
        "# Check it with `gpucloud validate` and `gpucloud plan` before `gpucloud run`.",
    ]
    out += _comments(draft, "")
    keys = [k for k in KEY_ORDER if k in draft.job] + [k for k in draft.job if k not in KEY_ORDER]
    keys = list(dict.fromkeys(keys + [at for at, _ in draft.notes if at]))
    for key in keys:
        out += _comments(draft, key)
        if key in draft.job:
            job = {key: draft.job[key]}
            block = yaml.dump(job, Dumper=Dumper, sort_keys=False, width=YAML_WIDTH, allow_unicode=True)
            out.append(block.rstrip("\n"))
    return "\n".join(out) + "\n"


def _comments(draft: Draft, at: str) -> list[str]:
    lines: list[str] = []
    for where, text in draft.notes:
        if where == at:
            lines += textwrap.wrap(
                text, 80, initial_indent=NOTE, subsequent_indent="#   ", break_on_hyphens=False, break_long_words=False
            ) or [NOTE.rstrip()]
    return lines
