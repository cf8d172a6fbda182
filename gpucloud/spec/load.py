"""The job file: the public entry points (parse_spec, load_spec, json_schema) over the models
(spec_models), the shared values and error types (spec_values), YAML loading (spec_yaml) and the
mapping of validation errors to lines (spec_errors).

The model attributes are a contract used by planner, render and lifecycle; keep their names and
types. The validators accept the friendly input forms (docs/INTERNALS.md, "Job file": "K80:1", "6h", "any",
"pytorch==2.0.1") and turn them into the canonical values the rest of gpucloud relies on.

Errors are the user's first contact with gpucloud, so every problem becomes one line
`<file>:<line>: <dotted.field>: <what is wrong>. <what was expected / did you mean>` and all problems
of a file are reported together in one `SpecError` (exit code 2), never as a traceback. Line numbers
come from the composed YAML node tree (PyYAML), onto which pydantic's error locations are mapped.

Imports stay light (no yaml, catalog or cloud SDK at import time): `gpucloud validate` and the
planner import this module on their hot path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from gpucloud.spec.errors import FIELD_HINTS, INPUT_ONLY_FIELDS, issues_from, unknown_key_message
from gpucloud.spec.models import GpuRequest, JobSpec, Resources, StackSpec, image_kind
from gpucloud.spec.reach import Allowances, reach_issues
from gpucloud.spec.source import compose_yaml
from gpucloud.spec.values import SpecError, SpecIssue, describe, did_you_mean, parse_duration

__all__ = [
    "Allowances",
    "GpuRequest",
    "JobSpec",
    "Resources",
    "SpecError",
    "SpecIssue",
    "StackSpec",
    "describe",
    "did_you_mean",
    "image_kind",
    "json_schema",
    "load_spec",
    "parse_spec",
    "parse_duration",
]

_MAX_FILE_BYTES = 1 << 20  # a job file is a few hundred bytes; anything this big is a wrong path


def _workdir_issue(spec: JobSpec, base_dir: Path, filename: str, line: int | None) -> SpecIssue | None:
    """A relative workdir is resolved against the job file's folder and may lead up to a parent
    (a job file in `jobs/` of a monorepo uploads the repository with `workdir: ..`). The root
    folder and the home folder itself (or a folder above it) are refused, relative or absolute:
    they would upload every file the user owns."""
    target = (base_dir.resolve() / spec.workdir).resolve()
    home = Path.home().resolve()
    if target != target.parent and target != home and target not in home.parents:
        return None
    what = (
        "the root folder /"
        if target == target.parent
        else (f"your home folder {home}" if target == home else f"{target}, a folder above your home folder")
    )
    return SpecIssue(
        filename,
        line,
        "workdir",
        f"'{spec.workdir}' is {what}, which would upload everything in it. Point workdir "
        f"at the project's own folder, e.g. workdir: . (the job file's folder {base_dir.resolve()}) "
        "or workdir: .. (its parent)",
    )


def _workdir_size_issue(spec: JobSpec, base_dir: Path, filename: str, line: int | None) -> SpecIssue | None:
    """A workdir that packs past the upload cap would fail only at `run`'s upload, after its run record:
    refused here (validate, plan, run alike). Same file list as the code tarball; only a folder whose files
    add up past the cap is packed (the tarball's own code, stopped at the cap), so a compressible folder
    is not refused on its raw size. None when it fits or is missing (describe_upload says so)."""
    import tempfile

    from gpucloud.channel.workdir import DEFAULT_CODE_CAP, human_bytes, pack_workdir, workdir_files
    from gpucloud.errors import UserError
    from gpucloud.spec.reach import credential_places

    root = (base_dir.resolve() / spec.workdir).resolve()
    if not root.is_dir():
        return None
    skip = credential_places()
    files = workdir_files(root, skip)
    raw = 0
    biggest: list[tuple[int, str]] = []
    for rel in files:
        try:
            size = (root / rel).lstat().st_size
        except OSError:
            continue
        raw += size
        biggest.append((size, rel))
    if raw <= DEFAULT_CODE_CAP:
        return None
    with tempfile.TemporaryDirectory(prefix="gpucloud-size-") as tmp:
        try:
            pack_workdir(root, dest=Path(tmp) / "code.tar.gz", skip=skip)
            return None
        except UserError as exc:
            packed = str(exc).split(" packs to ", 1)[-1].split(", above", 1)[0]
    largest = ", ".join(f"{rel} ({human_bytes(size)})" for size, rel in sorted(biggest, reverse=True)[:3])
    return SpecIssue(
        filename,
        line,
        "workdir",
        f"'{spec.workdir}' ({root}) packs to {packed}, above the {human_bytes(DEFAULT_CODE_CAP)} upload cap "
        f"({len(files)} file(s), {human_bytes(raw)} before compression; largest: {largest}), so `run` would "
        "fail at the upload. List the large files (datasets, checkpoints, outputs) in the workdir's .gitignore "
        "and bring them with inputs: or in setup:, or point workdir at a smaller folder (the cap is fixed).",
    )


def parse_spec(
    text: str,
    filename: str,
    base_dir: Path | None = None,
    *,
    resources: dict[str, Any] | None = None,
    allow: Allowances | None = None,
) -> JobSpec:
    """Parse and validate job-file text; `filename` is only used in messages, `base_dir` (the job
    file's folder, else the current one) resolves a relative workdir and local inputs. `resources`:
    fields the command line sets (`--cloud`, `--host`), applied before validation so that the job is
    judged as it will run. `allow`: the credential secrets and local inputs outside the job's folder
    that the caller allowed (spec/reach.py). Raises SpecError listing every problem (file, line,
    field, what is wrong and what was expected)."""
    data, builder = compose_yaml(text, filename)
    _must_be_mapping(data, builder, filename)
    if resources and isinstance(data.get("resources", {}), (dict, type(None))):
        data["resources"] = {**(data.get("resources") or {}), **resources}
    issues = list(builder.issues)
    root_line = builder.lines[()].value_line
    for key in INPUT_ONLY_FIELDS & data.keys():
        text = unknown_key_message(key, ())
        issues.append(
            SpecIssue(filename, builder.lines[(key,)].key_line, key, text if text.endswith("?") else text + ".")
        )
        del data[key]
    spec: JobSpec | None = None
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        issues.extend(
            i for i in issues_from(exc, filename, builder.lines, root_line) if i.field not in builder.bad_paths
        )
    if spec is not None:
        where = builder.lines.get(("workdir",))
        issues.extend(_workdir_issues(spec, base_dir, filename, where.value_line if where else None))
        issues.extend(reach_issues(spec, base_dir or Path.cwd(), filename, builder.lines, allow))
    if issues or spec is None:
        from gpucloud.spec.peer_keys import import_hint
        from gpucloud.spec.peers import peer_hint  # only a failing file pays for the peer check

        error = SpecError(issues)
        error.hint = peer_hint(data, filename)  # a SkyPilot task or dstack file: name the command that converts it
        error.hint = error.hint or import_hint([i.message for i in issues], filename)
        raise error
    return spec


def _must_be_mapping(data: object, builder: Any, filename: str) -> None:
    """An empty file or one whose top level is not a mapping: one issue that shows the smallest job."""
    minimal = (
        "Expected at least name, resources.gpu and run, e.g.\n"
        "  name: mnist-t4\n  resources: {gpu: T4:1}\n  run: python train.py"
    )
    if data is None:
        raise SpecError([SpecIssue(filename, 1, "", f"the job file is empty. {minimal}")])
    if not isinstance(data, dict):
        line = builder.lines[()].value_line
        raise SpecError(
            [
                SpecIssue(
                    filename,
                    line,
                    "",
                    "the job file must be a mapping of keys (name, resources, run, ...), "
                    f"but it is {describe(data)}. {minimal}",
                )
            ]
        )


def _workdir_issues(spec: JobSpec, base_dir: Path | None, filename: str, line: int | None) -> list[SpecIssue]:
    """The workdir must exist (when the job's folder is known); only then is its packed size judged."""
    if base_dir is None:
        return []
    if issue := _workdir_issue(spec, base_dir, filename, line):
        return [issue]
    size_issue = _workdir_size_issue(spec, base_dir, filename, line)
    return [size_issue] if size_issue else []


def load_spec(path: str | Path, *, resources: dict[str, Any] | None = None, allow: Allowances | None = None) -> JobSpec:
    """Read, parse and validate a job file; `spec.source` is its resolved path. `resources`,
    `allow`: see parse_spec. Raises SpecError."""
    name = str(path)
    p = Path(path)

    def fail(message: str, line: int | None = None) -> NoReturn:
        raise SpecError([SpecIssue(name, line, "", message if message.endswith(".") else message + ".")])

    if p.is_dir():
        fail("is a directory, not a job file. Pass the YAML file itself, e.g. " + str(p / "job.yaml"))
    try:
        with p.open("rb") as fh:
            raw = fh.read(_MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        fail(f"no such file. Check the path (relative paths start at {Path.cwd()})")
    except PermissionError:
        fail("cannot be read: permission denied. Check the file's permissions")
    except OSError as exc:
        fail(f"cannot be read: {exc.strerror or exc}. Check the path")
    if len(raw) > _MAX_FILE_BYTES:
        fail(f"is larger than {_MAX_FILE_BYTES // 1024} KiB, far too big for a job file. Check the path")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        fail(f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}). Save the job file as UTF-8", line)
    spec = parse_spec(text, name, p.resolve().parent, resources=resources, allow=allow)
    spec.source = p.resolve()
    return spec


def json_schema() -> dict[str, Any]:
    """JSON Schema of the *input* form (what people write: "K80:1", "6h", "any"), for YAML editors."""
    from gpucloud.spec.schema import refine

    schema = JobSpec.model_json_schema(mode="validation")
    schema["properties"].pop("source", None)
    sections = {"": schema, **{k.lower(): v for k, v in schema.get("$defs", {}).items()}}
    for dotted, hint in FIELD_HINTS.items():  # editors show these on hover
        parent, _, key = dotted.rpartition(".")
        section = {"": "", "resources": "resources", "resources.gpu": "gpurequest", "stack": "stackspec"}.get(parent)
        prop = sections.get(section, {}).get("properties", {}).get(key) if section is not None else None
        if prop is not None:
            prop.setdefault("description", hint[:1].upper() + hint[1:] + ("" if hint.endswith(".") else "."))
    refine(schema)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **{k: v for k, v in schema.items() if k != "title"},
        "title": "gpucloud job file",
    }
