"""`inputs:` and `outputs:` between the caller and the node (docs/DATA.md).

At plan time (`check`): every source is looked up from the caller (a bucket that does not exist,
an empty prefix, a missing local path or an https URL that does not answer fails here, naming
it), giving the files, their total size and an ETA for `plan`. After launch (`grants`): the
node's document of exactly the grants the job file names, expiring at the run's deadline: one
GET URL per input file, one read/list credential per mounted input folder (`mode: mount`), one
write-only grant per output prefix. A bucket's store is the DataStore its scheme's provider offers
(gpucloud/contract/services.py, found through the registry: each says what its grants allow); this
module names no cloud. It is sealed to the node's key with its secrets
(gpucloud/run/secrets.py) and never written in plain text. Local inputs go up to the run's
channel first (not through the code tarball's cap); the node copies inputs in parallel before
`setup` and syncs outputs at the end, straight between the node and the bucket.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucloud.channel.run_objects import run_prefix
from gpucloud.contract import registry as providers
from gpucloud.errors import UserError
from gpucloud.prose import to_stderr
from gpucloud.spec.data import DataSource, input_source, parse_location
from gpucloud.ui.untrusted import shown
from gpucloud.vm.agent.names import path_problem

if TYPE_CHECKING:
    from gpucloud.contract.services import DataStore
    from gpucloud.spec.load import JobSpec

ASSUMED_MBPS = 100.0  # MB/s a node copies from a bucket in its region, for plan's ETA
REFUSED_SHOWN = 20  # skipped object names named one a line; the rest are counted


class Unreached(UserError):
    """A source that gave no answer at all (no route, no name, a timeout): `plan` warns, `run` refuses."""

    kind = "user"  # bad input as any other (exit 2, the --json error's kind)


@dataclass
class Input:
    dest: str
    source: DataSource
    files: list[tuple[str, int, str]]  # (path under dest, size, key / URL / local path); none when mounted
    region: str = ""
    mode: str = "copy"  # or "mount": the folder is mounted read-only on the node, not listed or copied
    by_node: bool = False  # mounted under the node's own identity (every cloud of the job gives one)


@dataclass
class Output:
    src: str
    dest: DataSource
    region: str = ""


@dataclass
class DataPlan:
    inputs: list[Input] = field(default_factory=list)
    outputs: list[Output] = field(default_factory=list)
    uploaded: dict[str, list[str]] = field(default_factory=dict)  # run id -> channel keys of local inputs
    mounted: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)  # (run id, input) -> grant
    unchecked: list[str] = field(default_factory=list)  # `plan` only: sources it could not check from here
    admitted: set[tuple[str, int]] = field(default_factory=set)  # (run, attempt): node identity given the prefixes
    node_stores: set[str] = field(default_factory=set)  # bucket schemes the current attempt's nodes were admitted to

    @property
    def copied(self) -> list[Input]:
        return [i for i in self.inputs if i.mode == "copy"]

    @property
    def total_bytes(self) -> int:
        return sum(size for i in self.inputs for _, size, _ in i.files)

    def summary(self) -> str:
        files = sum(len(i.files) for i in self.inputs)
        mb = self.total_bytes / 1e6
        parts = []
        if self.copied:
            parts.append(f"inputs: {files} file(s), {mb:,.1f} MB, about {max(1, round(mb / ASSUMED_MBPS))} s to copy")
        mounts = [i for i in self.inputs if i.mode == "mount"]
        if mounts:
            parts.append("mounted read-only (not copied): " + ", ".join(f"{i.dest} <- {i.source.text}" for i in mounts))
        if self.outputs:
            parts.append("outputs: " + ", ".join(f"{o.src} -> {o.dest.text}" for o in self.outputs))
        return "; ".join(parts)

    def as_json(self) -> dict[str, Any]:
        return {
            "inputs": [
                {"path": i.dest, "source": i.source.text, "mode": "mount", "files": None, "bytes": None}
                if i.mode == "mount"
                else {
                    "path": i.dest,
                    "source": i.source.text,
                    "mode": "copy",
                    "files": len(i.files),
                    "bytes": sum(s for _, s, _ in i.files),
                }
                for i in self.inputs
            ],
            "outputs": [{"path": o.src, "destination": o.dest.text} for o in self.outputs],
        }

    def grants(
        self, channel: Any, run_id: str, rank: int, num_nodes: int, deadline: float, handle: Any = None
    ) -> dict[str, Any]:
        """The node's document: GET URLs per input file, one write grant per output prefix; and, once
        per attempt, the same prefixes admitted to the nodes' own identity where the cloud gives
        them one (`handle`: the attempt's RunHandle), so they outlast the caller's credentials."""
        expires = datetime.fromtimestamp(deadline, UTC)
        if handle is not None and (run_id, handle.attempt) not in self.admitted:
            self.admitted.add((run_id, handle.attempt))
            self.admit(handle)
        if run_id not in self.uploaded:
            self.uploaded[run_id] = _upload_local(self, channel, run_id)
        doc: dict[str, Any] = {"inputs": [], "outputs": []}
        for n, item in enumerate(self.inputs):
            if item.mode == "mount":
                grant = self._mount(item, n, run_id, expires)
                doc["inputs"].append({"dest": item.dest, "source": item.source.text, "mount": grant})
                continue
            urls = _urls(item, channel, run_id, n, expires, rank)
            files = [
                {"rel": rel, "size": size, "url": url} for (rel, size, _), url in zip(item.files, urls, strict=True)
            ]
            doc["inputs"].append({"dest": item.dest, "files": files})
        for out in self.outputs:
            prefix = out.dest.prefix
            if prefix and not prefix.endswith("/"):
                prefix += "/"
            if num_nodes > 1:
                prefix += f"node-{rank}/"
            doc["outputs"].append({"src": out.src, **_output_grant(out, prefix, expires)})
        return doc

    def _mount(self, item: Input, n: int, run_id: str, expires: datetime) -> dict[str, Any]:
        """The node mounts as itself where its attempt was admitted; else one credential per run,
        shared by its nodes."""
        src = item.source
        if item.by_node and src.kind in self.node_stores:
            return _bucket_store(src).node_mount_grant(src.bucket, src.prefix, item.region)
        if (run_id, n) not in self.mounted:
            self.mounted[(run_id, n)] = _mount_grant(item, run_id, expires)
        return self.mounted[(run_id, n)]

    def admit(self, handle: Any) -> None:
        """Each bucket store's named prefixes to the attempt's node identity; a refusal is a warning
        (the node still has the grants, signed by the caller)."""
        self.node_stores.clear()
        for scheme in providers.bucket_schemes():
            ins = [i for i in self.inputs if i.source.kind == scheme]
            outs = [o for o in self.outputs if o.dest.kind == scheme]
            if not ins and not outs:
                continue
            store = _bucket_store(ins[0].source if ins else outs[0].dest)
            reads = [(i.source.bucket, i.source.prefix) for i in ins]
            mounts = [(i.source.bucket, i.source.prefix) for i in ins if i.mode == "mount"]
            problem = store.admit_node(handle, reads, [(o.dest.bucket, o.dest.prefix) for o in outs], mounts)
            if problem:
                print(shown(f"warning: {problem}.", limit=600), file=sys.stderr)
            else:
                self.node_stores.add(scheme)


def _store(src: DataSource) -> DataStore | None:
    """The store of a bucket source (its provider's, found by its scheme); None for a URL or a path."""
    return providers.data_store(src.kind, src.account)


def _urls(item: Input, channel: Any, run_id: str, n: int, expires: datetime, rank: int) -> list[str]:
    src = item.source
    store = _store(src)
    if store is not None:
        return store.input_urls(src.bucket, item.region, [k for _, _, k in item.files], expires)
    if src.kind == "https":
        return [src.url]
    return [channel.node_url(channel.url_get(_local_key(run_id, n, rel), expires), rank) for rel, _, _ in item.files]


def _bucket_store(src: DataSource) -> DataStore:
    store = _store(src)
    if store is None:  # the spec lets only bucket schemes be mounted or written to
        raise UserError(f"{src.text}: no provider serves this kind of bucket.")
    return store


def _mount_grant(item: Input, run_id: str, expires: datetime) -> dict[str, Any]:
    src = item.source
    return _bucket_store(src).mount_grant(src.bucket, src.prefix, item.region, run_id, expires, f"inputs.{item.dest}")


def _check_mount(src: DataSource, where: str, max_duration: int, clouds: list[str]) -> str:
    """A mounted folder looked up like a copied one (the bucket, objects under it; no listing of
    every file), and whether a mount credential can be had for it (unless the nodes mount it under
    their own identity); its region."""
    if _by_node(src, clouds):
        return _bucket_store(src).check_node_mount(src.bucket, src.prefix, where)
    _mount_limit(src, where, max_duration, clouds)
    return _bucket_store(src).check_mount(src.bucket, src.prefix, where)


def _by_node(src: DataSource, clouds: list[str]) -> bool:
    """Every cloud the job may run on mounts this store's folders under the node's own identity."""
    cls = providers.data_store_class(src.kind)
    return cls is not None and bool(clouds) and all(cls.node_mounts(c) for c in clouds)


def _mount_limit(src: DataSource, where: str, max_duration: int, clouds: list[str]) -> None:
    """A store's mount credentials may last less than the job: a longer job is refused from its file
    alone (a node mounting under its own identity has no such limit)."""
    cls = providers.data_store_class(src.kind)
    if cls is not None and not _by_node(src, clouds):
        cls.mount_limit(max_duration, where)


def _output_grant(out: Output, prefix: str, expires: datetime) -> dict[str, Any]:
    return _bucket_store(out.dest).output_grant(out.dest.bucket, out.region, prefix, expires)


def _local_key(run_id: str, n: int, rel: str) -> str:
    return f"{run_prefix(run_id)}/inputs/{n}/{rel or 'file'}"


def _upload_local(plan: DataPlan, channel: Any, run_id: str) -> list[str]:
    keys = []
    for n, item in enumerate(plan.inputs):
        if item.source.kind == "path":
            for rel, _, path in item.files:
                key = _local_key(run_id, n, rel)
                channel.put_file(key, Path(path))
                keys.append(key)
    return keys


def _local_files(path: Path, where: str) -> list[tuple[str, int, str]]:
    if path.is_file():
        return [("", path.stat().st_size, str(path))]
    if not path.is_dir():
        raise UserError(f"{where}: {path} does not exist.", hint="Check the path (relative to the job file).")
    files = [
        (p.relative_to(path).as_posix(), p.stat().st_size, str(p))
        for p in sorted(path.rglob("*"))
        if p.is_file() and not p.is_symlink()
    ]
    if not files:
        raise UserError(f"{where}: the folder {path} is empty.")
    return files


def usable_files(files: list[tuple[str, int, str]], where: str, source: str) -> list[tuple[str, int, str]]:
    """The listed files whose path under the input the node takes (gpucloud/vm/agent/names.py: no
    control character, backslash, absolute path, empty, '.' or '..' component). Whoever can add an
    object to the bucket chooses its key, so a refused one is skipped with a warning naming it (one
    line each, the first REFUSED_SHOWN), never sent to the node; UserError when none is left."""
    kept = []
    refused = 0
    for item in files:
        why = path_problem(item[0])
        if not why:
            kept.append(item)
            continue
        refused += 1
        if refused <= REFUSED_SHOWN:  # one line each, never wrapped: a wrapped key could start a line
            print(shown(f"warning: {where}: skipped {item[2]}: its name has {why}.", limit=600), file=sys.stderr)
    if refused > REFUSED_SHOWN:
        to_stderr(f"warning: {where}: skipped {refused - REFUSED_SHOWN} more object(s) with names the node refuses.")
    if refused and not kept:
        raise UserError(
            f"{where}: every object under {source} has a name the node refuses ({refused} skipped).",
            hint="Rename the objects: plain relative names, without control characters, '\\', '.' or '..' parts.",
        )
    return kept


def _https_size(url: str, where: str) -> int:
    req = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:  # noqa: S310 (https only, from the job file)
            return int(resp.headers.get("Content-Length") or 0)
    except urllib.error.HTTPError as exc:
        raise UserError(f"{where}: {url} answered HTTP {exc.code}.", hint="Check the URL.") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise Unreached(f"{where}: cannot reach {url}: {getattr(exc, 'reason', exc)}.") from None


def check(spec: JobSpec, *, explore: bool = False) -> DataPlan:
    """Look every source and destination up from the caller; UserError naming the first bad one.
    `explore` (`plan`): a bucket whose store has no credentials here is not asked at all (an SDK
    without credentials can spend minutes retrying), and it, or a URL that does not answer from
    here, is one line in `DataPlan.unchecked` instead (`run` checks it again, before anything is
    created). A real answer (no such bucket, an empty prefix, HTTP 404) stays an error."""
    plan = DataPlan()
    base = spec.source.parent if spec.source else Path.cwd()
    for dest, value in spec.inputs.items():
        text, mode = input_source(value)
        src, where = parse_location(text), f"inputs.{dest}"
        clouds = list(spec.resources.cloud)
        if mode == "mount":
            _mount_limit(src, where, spec.max_duration, clouds)  # the job file's own limit: checked without credentials
        try:
            _credentials_or_skip(src, explore)
            plan.inputs.append(_input(src, dest, mode, where, base, (spec.max_duration, clouds)))
        except UserError as exc:
            plan.unchecked.append(_unchecked(exc, src, where, explore))
    for path, text in spec.outputs.items():
        target, where = parse_location(text), f"outputs.{path}"
        _warn_short_grant(target, where, spec.max_duration, list(spec.resources.cloud))
        try:
            _credentials_or_skip(target, explore)
            plan.outputs.append(Output(path, target, _output_region(target, where)))
        except UserError as exc:
            plan.unchecked.append(_unchecked(exc, target, where, explore))
    return plan


def _warn_short_grant(target: DataSource, where: str, max_duration: int, clouds: list[str]) -> None:
    """An output goes up at the job's end through a grant the caller made at launch: on a cloud
    where that grant can die before max_duration, say so (`plan` and `run`; the job may end first)."""
    cls = providers.data_store_class(target.kind)
    if cls is None:
        return
    lives = {cloud: cls.grant_life_s(cloud) for cloud in clouds or providers.any_clouds()}
    short = {cloud: life for cloud, life in lives.items() if life is not None and life < max_duration}
    if short:
        life = min(short.values())
        to_stderr(
            f"warning: {where}: on {', '.join(sorted(short))} the node writes {shown(target.text)} through a "
            f"grant that lasts {life / 86400:g} days at most, and max_duration is {max_duration / 86400:g} days: "
            "files the job writes there after that are not uploaded. Lower max_duration, or keep such files "
            "as artifacts (docs/DATA.md)."
        )


class _NoCredentials(UserError):
    """`plan` found no credentials for a bucket's store: the bucket is not asked."""

    kind = "user"


def _credentials_or_skip(src: DataSource, explore: bool) -> None:
    if explore and src.kind in providers.bucket_schemes() and not providers.bucket_credentials_found(src.kind):
        raise _NoCredentials(src.text)


def _input(src: DataSource, dest: str, mode: str, where: str, base: Path, job: tuple[int, list[str]]) -> Input:
    """One input looked up: its files (none when mounted) and its bucket's region. `job`: its
    max_duration and the clouds it may run on."""
    if mode == "mount":
        region = _check_mount(src, where, *job)
        return Input(dest, src, [], region, mode, by_node=_by_node(src, job[1]))
    region, store = "", _store(src)
    if store is not None:
        region, files = store.list_input(src.bucket, src.prefix, where)
    elif src.kind == "https":
        files = [("", _https_size(src.url, where), src.url)]
    else:
        files = _local_files((base / src.url).resolve(), where)
    if dest.endswith("/") and len(files) == 1 and not files[0][0]:  # one file into a folder
        files = [(Path(files[0][2].split("?")[0]).name, files[0][1], files[0][2])]
    return Input(dest, src, usable_files(files, where, src.text), region)


def _output_region(target: DataSource, where: str) -> str:
    return _bucket_store(target).check_output(target.bucket, where)


def _unchecked(exc: UserError, src: DataSource, where: str, explore: bool) -> str:
    """The warning for a source `plan` could not check from here; the error itself when `run`
    asks, or when the check gave a real answer (a missing bucket, an empty prefix, HTTP 404)."""
    if explore and isinstance(exc, _NoCredentials):
        entry = providers.bucket_provider(src.kind)
        why = f"no {entry.title if entry else src.kind} credentials found here"
    elif explore and isinstance(exc, Unreached):
        why = "it does not answer from here"
    else:
        raise exc
    return f"{where}: {src.text} was not checked ({why}); `run` checks it before anything is created."


def policy_statements(spec: JobSpec) -> list[dict[str, Any]]:
    """The statements the job's bucket inputs and outputs need from the caller (`iam-policy --data`),
    from each store: a mounted input's reads too (its credential can do no more than its caller),
    and no mount credential where the nodes mount under their own identity."""
    sources = [(parse_location(text), mode) for text, mode in map(input_source, spec.inputs.values())]
    targets = list(map(parse_location, spec.outputs.values()))
    statements: list[dict[str, Any]] = []
    for scheme in providers.bucket_schemes():
        cls = providers.data_store_class(scheme)
        if cls is not None:
            reads = [(s.bucket, s.prefix) for s, _ in sources if s.kind == scheme]
            mounted = [s for s, mode in sources if s.kind == scheme and mode == "mount"]
            mounts = [(s.bucket, s.prefix) for s in mounted if not _by_node(s, list(spec.resources.cloud))]
            writes = [(s.bucket, s.prefix) for s in targets if s.kind == scheme]
            statements += cls.policy_statements(reads, writes, mounts)
    return statements
