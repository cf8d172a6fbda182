"""The next job on a kept machine: `gpucloud exec RUN -- CMD` and `gpucloud run --on RUN JOB`.

No connection to the node: the CLI writes a request signed by the run's owner key into the run's
channel (`node-0/request`, gpucloud/vm/agent/job_request.py), with the workdir's changed files as
a small archive beside it; the kept node polls for it, runs it on the stack it already has and
reports as a run does. The job is an attempt of its own in the run's record (its exit code in the
events, its artifacts in ./gpucloud-runs/RUN/job-N/, its cost from its start to the next job or
the machine's end).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tarfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucloud.channel.owner import owner_sign
from gpucloud.channel.run_objects import Channel, request_key, run_prefix
from gpucloud.contract.provider import RunHandle
from gpucloud.errors import UserError
from gpucloud.prose import to_stderr
from gpucloud.run import keep
from gpucloud.run.commands import channel_for, refresh, require_run
from gpucloud.run.log import LogMirror
from gpucloud.state.records import RunRecord
from gpucloud.state.runs_db import Store, home_dir
from gpucloud.vm.agent import job_request
from gpucloud.vm.protocol import FINAL_STATES

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpucloud.spec.load import JobSpec

POLL_S = 0.2
TAKE_WARN_S = 30.0
# What a machine is: a job file that asks for other machines cannot run on this one.
MACHINE_FIELDS = ("resources", "num_nodes", "stack", "image", "container", "max_duration")


@dataclass
class NextJob:
    """What the request carries besides the files."""

    setup: str
    run: str
    env: dict[str, str]
    artifacts: list[str]
    workdir: Path | None


def job_from_spec(run: RunRecord, spec: JobSpec) -> NextJob:
    """`run --on`: the job file's commands, if its machine is the kept one; else exit 2 naming the fields."""
    from gpucloud.vm.job_env import check_env

    old = keep.run_spec(run)
    new = spec.model_dump(mode="json")
    differ = [f for f in MACHINE_FIELDS if old.get(f) != new.get(f)]
    if differ:
        raise UserError(
            f"{spec.source or 'the job file'}: {', '.join(differ)} differ(s) from run {run.id}'s, so the job needs "
            "other machines than the kept one.",
            hint="Make those fields match the kept run's job file, or start a new run with `gpucloud run`.",
        )
    return NextJob(spec.setup or "", spec.run, check_env(spec.env), list(spec.artifacts), spec.workdir_path())


def job_from_command(run: RunRecord, command: str) -> NextJob:
    """`exec -- CMD`: the command, with the run's env and workdir (synced when it changed)."""
    spec = keep.run_spec(run)
    workdir = None
    if run.spec_path and spec.get("workdir"):
        workdir = (Path(run.spec_path).parent / str(spec["workdir"])).resolve()
    env = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
    return NextJob("", command, env, [], workdir if workdir and workdir.is_dir() else None)


def kept_run(store: Store, ref: str) -> tuple[RunRecord, Channel]:
    """The kept run `ref` names and its channel; a clear UserError for any other."""
    run = require_run(store, ref)
    if run.status != keep.KEPT:
        run = refresh(store, run)
        why = "has ended" if run.final else "is still running its job (its machine is not kept, or not yet)"
        raise UserError(
            f"run {run.id} {why} (status {run.status}): only a kept run takes another job.",
            hint="Keep one with `keep: 30m` in the job file or `run --keep 30m`; `gpucloud ls` shows kept runs.",
        )
    channel = channel_for(run)
    if channel is None:
        raise UserError(f"run {run.id}'s channel cannot be reached from here.")
    status = channel.read_status(run.id, 0)
    if not status or keep.kept_status([status]) is None:
        refresh(store, run)  # a machine that ended by itself: its run's record says so now
        state = (status or {}).get("state", "unknown")
        raise UserError(
            f"run {run.id}'s machine is not waiting for a job (its state: {state}): it is running one, or ended.",
            hint=f"`gpucloud status {run.id}` shows it.",
        )
    return run, channel


def send_changes(channel: Channel, run: RunRecord, seq: int, workdir: Path | None) -> tuple[str, str, list[str]]:
    """Upload the workdir's changed files; (GET URL, archive SHA-256, removed paths)."""
    if workdir is None:
        return "", "", []
    from gpucloud.channel.run_objects import pack_workdir
    from gpucloud.spec.reach import credential_places

    full = pack_workdir(workdir, skip=credential_places())
    try:
        now = keep.tarball_listing(full)
        before = keep.load_listing(run.id)
        changed = {name for name, digest in now.items() if before.get(name) != digest}
        removed = sorted(set(before) - set(now))
        if not changed:
            keep.save_listing(run.id, now)
            return "", "", removed
        delta = full.with_name("changes.tar.gz")
        with tarfile.open(full, "r:gz") as src, tarfile.open(delta, "w:gz", format=tarfile.PAX_FORMAT) as out:
            for member in src:
                if member.name.removeprefix("./") in changed:
                    out.addfile(member, src.extractfile(member) if member.isfile() else None)
        key = f"{run_prefix(run.id)}/exec/{seq}.tar.gz"
        channel.put_file(key, delta)
        expires = datetime.fromtimestamp(run.deadline or time.time(), UTC) + timedelta(hours=1)
        digest = _sha(delta.read_bytes())
        keep.save_listing(run.id, now)
        to_stderr(f"job {seq}: {len(changed)} changed file(s), {len(removed)} removed")
        return channel.node_url(channel.url_get(key, expires), 0), digest, removed  # signed as the node reads it
    finally:
        shutil.rmtree(full.parent, ignore_errors=True)


def new_attempt(store: Store, run: RunRecord, seq: int) -> None:
    """The job's own attempt on the same machine: the previous one ends where this one starts."""
    prev = next((a for a in reversed(run.attempts) if a.launched and a.handle_json), None)
    if prev is None:
        raise UserError(f"run {run.id} has no launched machine in its record.")
    store.end_attempt(run.id, prev.idx, f"kept: job {seq} started")
    store.start_attempt(
        run.id,
        seq,
        cloud=prev.cloud,
        region=prev.region,
        instance_type=prev.instance_type,
        spot=prev.spot,
        price_per_hour=prev.price_per_hour,
        num_nodes=prev.num_nodes,
        zone=prev.zone,
    )
    store.set_attempt_handle(run.id, seq, prev.handle_json or "", zone=prev.zone)


def send_sealed(channel: Channel, run: RunRecord, seq: int, values: Mapping[str, str], data: Any) -> dict[str, Any]:
    """`run --on`: the job's own secrets and input/output grants, sealed to the key that claimed the
    kept node (as a run's are, run/secrets.py) under exec/N.sealed; the request names its SHA-256, so
    the node opens only what the owner signed for this job. No secrets and no data: the node drops
    the first job's (`own_secrets` with no object)."""
    from gpucloud.channel import trust as channel_trust
    from gpucloud.vm.agent import sealed

    if not values and data is None:
        return {"own_secrets": True}
    try:
        key, problem = channel_trust.claimed_key(channel.claims(run.id, 0))
    except channel_trust.ObjectRefused as exc:
        key, problem = None, exc.message
    if key is None:
        raise UserError(
            f"run {run.id}'s machine has no single key to seal the job's secrets and inputs to "
            f"({problem or 'it published none'}), so they are not sent.",
            hint="Start a new run with `gpucloud run` for this job.",
        )
    doc: dict[str, Any] = {"run_id": run.id, "rank": 0, "env": dict(values)}
    deadline = run.deadline or time.time() + 3600
    if data is not None:
        doc["data"] = data.grants(channel, run.id, 0, 1, deadline, last_handle(run))
    blob = sealed.seal(key, json.dumps(doc, separators=(",", ":")).encode())
    obj = f"{run_prefix(run.id)}/exec/{seq}.sealed"
    channel.put_bytes(obj, blob)
    expires = datetime.fromtimestamp(deadline, UTC) + timedelta(hours=1)
    url = channel.node_url(channel.url_get(obj, expires), 0)  # an SSH host's path filled before signing
    return {"own_secrets": True, "secrets_get": url, "secrets_sha256": _sha(blob)}


def _sha(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def last_handle(run: RunRecord) -> RunHandle | None:
    """The kept machine's handle (its node identity is given the job's data prefixes, as at launch)."""
    prev = next((a for a in reversed(run.attempts) if a.launched and a.handle_json), None)
    return RunHandle.from_json(prev.handle_json or "") if prev is not None else None


def exec_job(
    ref: str,
    *,
    command: str | None = None,
    spec: JobSpec | None = None,
    secret_values: Mapping[str, str] | None = None,
    data: Any = None,
) -> int:
    """Run the next job on kept run `ref`, stream its log, bring back its artifacts; its exit code.
    `run --on` (spec) sends the job's own secrets and data; `exec` keeps the run's."""
    t0 = time.monotonic()
    store = Store()
    run, channel = kept_run(store, ref)
    job = job_from_spec(run, spec) if spec is not None else job_from_command(run, command or "")
    seq = store.next_attempt_idx(run.id)
    own = send_sealed(channel, run, seq, secret_values or {}, data) if spec is not None else {}
    code_get, code_sha, removed = send_changes(channel, run, seq, job.workdir)
    doc: dict[str, Any] = {
        **own,
        "run_id": run.id,
        "rank": 0,
        "seq": seq,
        "code_get": code_get,
        "code_sha256": code_sha,
        "delete": removed,
        "setup": job.setup,
        "run": job.run,
        "env": job.env,
        "artifacts": job.artifacts,
    }
    body = job_request.request_body(doc)
    mirror = LogMirror(home_dir(), run.id, 1)
    mirror.sync(channel)  # what the machine logged before this job was shown already
    mirror.offset = mirror.path.stat().st_size if mirror.path.is_file() else 0
    new_attempt(store, run, seq)
    store.update_run(run.id, phase=f"job {seq}")
    channel.put_bytes(request_key(run.id, 0), job_request.signed_request(body, owner_sign(run.id, body)))
    store.event(run.id, "job", f"job {seq} sent: {job.run[:200]}")
    to_stderr(f"run {run.id}: job {seq} sent to the kept machine ({time.monotonic() - t0:.1f}s)")
    state, rc, message = follow(channel, mirror, run, seq)
    store.event(run.id, "job", f"job {seq}: {state} (exit {rc}){': ' + message if message else ''}")
    store.update_run(run.id, exit_code=rc, message=message or None, phase=keep.idle_note(run))
    if job.artifacts:
        bring_back(channel, run, seq)
    to_stderr(f"run {run.id} job {seq}: {state} (exit {rc}){': ' + message if message else ''}")
    return rc


def follow(channel: Channel, mirror: LogMirror, run: RunRecord, seq: int) -> tuple[str, int, str]:
    """The job's log as it comes, until the node's signed final status for job `seq`."""
    from gpucloud.ui.ci import LogFence

    out = LogFence(sys.stdout.buffer)
    sent, warned = time.monotonic(), False
    deadline = (run.deadline or time.time()) + 60
    while True:
        status = channel.read_status(run.id, 0) or {}
        mirror.sync(channel)
        mirror.drain(out.write)
        out.flush()
        state, job = status.get("state"), status.get("job", 0)
        if job == seq and state in FINAL_STATES:
            break
        if job != seq and state in FINAL_STATES and keep.kept_status([status]) is None:
            return "error", 70, "the kept machine ended before it took the job"
        if not warned and job != seq and time.monotonic() - sent > TAKE_WARN_S:
            warned = True
            to_stderr(f"warning: the kept machine has not taken job {seq} after {TAKE_WARN_S:.0f}s")
        if time.time() > deadline:
            return "deadline", 124, "max_duration passed"
        time.sleep(POLL_S)
    mirror.sync(channel, final=True)
    mirror.drain(out.write)
    out.flush()
    code = status.get("exit_code")
    return str(state), int(code) if isinstance(code, int) else 1, str(status.get("message") or "")


def bring_back(channel: Channel, run: RunRecord, seq: int) -> None:
    from gpucloud.run.artifacts import fetch_artifacts, results_dir, settle_artifacts
    from gpucloud.ui.progress import Progress

    refused: list[str] = []
    dest = results_dir(run.id) / f"job-{seq}"
    with Progress(log_to_stderr=True) as progress:
        got = fetch_artifacts(channel, run.id, 1, dest, refused=refused, progress=progress)
        settle_artifacts(got, dest, interrupted=False, expected=True, progress=progress)
