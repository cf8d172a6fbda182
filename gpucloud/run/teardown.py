"""Teardown from the state store: the run handles of a run (stored by each attempt, or rebuilt
from the journal when provision crashed before returning one) and the teardown of all of them.

Used by the run itself (its `finally`), `down` and `gc`: one rule for what "everything the run
created" means. When the store itself cannot be read, `down` tears a run down from the handle
files kept beside it (`teardown_from_handle_files`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from gpucloud.contract import registry as providers
from gpucloud.contract.provider import RunHandle, Unreachable
from gpucloud.state.guard import read_handles
from gpucloud.state.runs_db import Journal, ResourceRecord, RunRecord, Store


def run_handles(store: Store, run: RunRecord) -> list[RunHandle]:
    """One handle per cloud+region where the run has (or may have) resources: the stored handle of
    the latest attempt there when it names every live journal row, else a partial handle
    (complete=False) listing the journal's rows, so the provider also looks for what was being created."""
    alive = store.resources(run.id, alive_only=True)
    targets: list[tuple[str, str]] = []
    for res in alive:
        key = (res.cloud, res.region or "")
        if key not in targets:
            targets.append(key)
    if not run.final:
        for att in run.attempts:
            if att.ended_at is None and (att.cloud, att.region) not in targets:
                targets.append((att.cloud, att.region))
        if run.cloud and run.region and (run.cloud, run.region) not in targets and not run.attempts:
            targets.append((run.cloud, run.region))
    return [
        _handle_for(run, cloud, region, [r for r in alive if (r.cloud, r.region or "") == (cloud, region)])
        for cloud, region in targets
    ]


def latest_handle(run: RunRecord) -> RunHandle | None:
    """The handle of the run's latest launched attempt (None: none launched). One cut short in
    provision (counted as launched by the watcher, its follower died before storing a handle) gets
    a partial handle of its own: its machines, found by the attempt's tags, may run and report on
    the run's channel, while the attempt before it is over; asking about that one's machines would
    call a healthy relaunch lost."""
    launched = [a for a in run.attempts if a.launched]
    if not launched:
        return None
    att = launched[-1]
    if att.handle_json:
        return RunHandle.from_json(att.handle_json)
    return RunHandle(run.id, att.cloud, att.region, attempt=att.idx, zone=att.zone, complete=False)


def _handle_for(run: RunRecord, cloud: str, region: str, alive: list[ResourceRecord]) -> RunHandle:
    stored = [a for a in run.attempts if (a.cloud, a.region) == (cloud, region) and a.handle_json]
    if stored:
        handle = RunHandle.from_json(stored[-1].handle_json or "")
    else:
        tried = [a.idx for a in run.attempts if (a.cloud, a.region) == (cloud, region)]
        handle = RunHandle(run_id=run.id, cloud=cloud, region=region, attempt=tried[-1] if tried else 0, complete=False)
    named = set(handle.nodes) | {i for ids in handle.resources.values() for i in ids}
    for res in alive:
        if res.cloud_id not in named and res.name not in named:
            handle.complete = False
            handle.add(res.kind, res.cloud_id or res.name or "")
    return handle


def teardown_run(
    store: Store,
    journal: Journal,
    run: RunRecord,
    *,
    wait: bool,
    say: Callable[[str], None] | None = None,
    unreached: list[str] | None = None,
) -> list[str]:
    """Tear down every handle of the run; returns the errors (one line per cloud+region that failed).
    `unreached` gets the cloud/region of each failure that never reached the machines (Unreachable).
    The run's open attempts end with reason "teardown" once nothing failed."""
    errors = []
    for handle in run_handles(store, run):
        where = f"{handle.cloud}/{handle.region}"
        try:
            providers.get_provider(handle.cloud).teardown(handle, journal, wait=wait)
            store.event(run.id, "teardown", f"{where}: done")
        except Exception as exc:  # keep going: another region may still be billing
            msg = f"{where}: {exc}"
            errors.append(msg)
            if unreached is not None and isinstance(exc, Unreachable):
                unreached.append(where)
            store.event(run.id, "teardown-error", msg)
            if say:
                say(f"teardown of {msg} failed")
    if not errors:
        store.end_attempt(run.id, None, "teardown")
        from gpucloud.run.ssh_entries import forget

        forget(run.id)  # its ssh entries name machines that are gone
    return errors


class HandleOnlyJournal(Journal):
    """A journal for a teardown without a usable store: the handle is all there is to go by, and
    nothing is recorded (the store cannot take it)."""

    def __init__(self) -> None:  # no Store: opening it is what failed
        pass

    def intent(self, run_id: str, kind: str, name: str, region: str, cloud: str) -> int:
        return 0

    def created(self, res_id: int, cloud_id: str) -> None:
        return None

    def deleted(self, res_id: int) -> None:
        return None

    def resources(self, run_id: str, alive_only: bool = True) -> list[ResourceRecord]:
        return []

    def event(self, run_id: str, kind: str, message: str) -> None:
        return None


def teardown_from_handle_files(store_path: Path, ref: str, *, say: Callable[[str], None]) -> tuple[str, list[str]]:
    """Tear down the run `ref` names from its handle files beside the store (one per attempt; each
    cloud+region's newest). Returns the run id and the errors; LookupError when there is no file."""
    run_id, docs = read_handles(store_path, ref)
    newest: dict[tuple[str, str], RunHandle] = {}
    for doc in docs:
        try:
            handle = RunHandle.from_json(json.dumps(doc))
        except (KeyError, TypeError, ValueError):
            continue  # a hand-edited or foreign file: the other attempts' files still count
        newest[(handle.cloud, handle.region)] = handle
    errors = []
    for handle in newest.values():
        try:
            providers.get_provider(handle.cloud).teardown(handle, HandleOnlyJournal(), wait=True)
        except Exception as exc:  # keep going: another region may still be billing
            errors.append(f"{handle.cloud}/{handle.region}: {exc}")
            say(f"teardown of {handle.cloud}/{handle.region} failed: {exc}")
    return run_id, errors
