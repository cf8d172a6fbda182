"""Finishing runs that nobody followed to the end.

- `gpucloud collect RUN`: for a detached run, or one whose `gpucloud run` died, read the nodes'
  final status, download the log and the artifacts into ./gpucloud-runs/RUN/, record the outcome
  and tear down whatever the run still holds.
- `status`/`ls` (commands.refresh, commands.reconcile) show a run whose CLI was killed before it
  read the result as "collecting" with the command that finishes it, never as "succeeded".
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucloud.errors import GpucloudError, UserError
from gpucloud.prose import to_stderr
from gpucloud.state.runs_db import Journal, RunRecord, Store, home_dir
from gpucloud.ui.untrusted import shown

if TYPE_CHECKING:
    from gpucloud.channel.run_objects import Channel

RESULTS_DIR = "gpucloud-runs"


class NotFinished(GpucloudError):
    """The run is still going: nothing to collect yet. Exit 75 (try again later)."""

    exit_code = 75
    kind = "not-finished"


@dataclass
class Collected:
    run_id: str
    status: str
    exit_code: int | None
    directory: str
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    log: str | None = None
    teardown_errors: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # one line per artifact member not extracted
    outputs: list[dict[str, str]] = field(default_factory=list)  # `outputs:`: machine path -> bucket prefix

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "status": self.status,
            "exit_code": self.exit_code,
            "directory": self.directory,
            "artifacts": self.artifacts,
            "log": self.log,
            "artifacts_refused": self.refused,
            "teardown_errors": self.teardown_errors,
            "outputs": self.outputs,
        }


def _final_statuses(run: RunRecord) -> list[dict | None]:
    from gpucloud.run.commands import channel_for
    from gpucloud.run.watch import is_final

    channel = channel_for(run)
    if channel is None:
        raise UserError(
            f"run {run.id} never reached a machine ({run.status}): there is nothing to collect.",
            hint="`gpucloud status RUN` shows what happened.",
        )
    statuses = [channel.read_status(run.id, r) for r in range(run.num_nodes)]
    if not all(is_final(st) for st in statuses):
        stage = next((shown(st.get("stage")) for st in statuses if st and st.get("stage")), None)
        raise NotFinished(
            f"run {run.id} has not finished yet" + (f" (stage {stage})" if stage else "") + ".",
            hint=f"`gpucloud logs {run.id} --follow` waits for it; collect afterwards.",
        )
    return statuses


def collect_run(ref: str, *, dest_root: Path | None = None) -> Collected:
    """Download log and artifacts of a finished run, record its outcome, tear down what is left."""
    from gpucloud.channel.extract import ArchiveLimits
    from gpucloud.run.artifacts import results_folders
    from gpucloud.run.commands import channel_for, require_run
    from gpucloud.run.log import LogMirror
    from gpucloud.run.teardown import teardown_run
    from gpucloud.run.watch import ended_at, outcome, vm_phases

    ArchiveLimits.from_env()  # a malformed cap setting is exit 2 before anything is read or torn down
    store = Store()
    run = require_run(store, ref)
    statuses = _final_statuses(run)
    channel = channel_for(run)
    assert channel is not None
    dest = (dest_root or Path.cwd() / RESULTS_DIR) / run.id
    results_folders(dest, run.num_nodes)  # never through a link (run/artifacts.py)
    mirror = LogMirror(home_dir(), run.id, run.num_nodes)
    mirror.sync(channel, final=True)
    log = None
    if mirror.path.is_file():
        shutil.copyfile(mirror.path, dest / "job.log")
        log = str(dest / "job.log")
    got, refused = _download_artifacts(channel, run, dest)
    for line in refused:  # a member's name is the archive's: fenced
        to_stderr(f"warning: {shown(line)}")
    status, code, message = outcome(statuses)
    store.set_phases(run.id, vm_phases(statuses))
    store.finish_run(
        run.id, status, exit_code=code, message=message or None, only_if_active=True, ended_at=ended_at(statuses)
    )
    store.end_attempt(run.id, None, f"job {status}")  # its attempt ended with it: `cost` stops billing there
    store.update_run(run.id, artifacts_dir=str(dest))
    store.event(
        run.id,
        "collect",
        f"log and {len(got)} artifact set(s) into {dest}"
        + (f"; {len(refused)} artifact member(s) refused" if refused else ""),
    )
    errors: list[str] = []
    if store.resources(run.id, alive_only=True):
        errors = teardown_run(
            store,
            Journal(store),
            store.get_run(run.id) or run,
            wait=True,
            say=lambda m: to_stderr(f"warning: {m}"),
        )
    final = store.get_run(run.id) or run
    return Collected(
        run_id=run.id,
        status=final.status,
        exit_code=final.exit_code,
        directory=str(dest),
        artifacts=got,
        log=log,
        teardown_errors=errors,
        refused=refused,
        outputs=_outputs(final),
    )


def _download_artifacts(channel: Channel, run: RunRecord, dest: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Each node's artifacts into `dest` (node-N/ when there are several): what each gave, as plain JSON
    values (the folder as a string, counts, one line per refused member), and the refused members."""
    got: list[dict[str, Any]] = []
    refused: list[str] = []
    for rank in range(run.num_nodes):
        out = channel.download_artifacts(run.id, rank, dest if run.num_nodes == 1 else dest / f"node-{rank}")
        if out is not None:
            got.append({"node": rank, "directory": str(out.dest), "files": out.files, "refused": list(out.warnings)})
            refused += [f"node {rank}: {w}" if run.num_nodes > 1 else w for w in out.warnings]
    return got, refused


def _outputs(run: RunRecord) -> list[dict[str, str]]:
    """Where the job's `outputs:` went (straight from the machines; several nodes: node-N/ each)."""
    try:
        outputs = (json.loads(run.spec_json or "{}") or {}).get("outputs") or {}
    except ValueError:
        return []
    suffix = "node-N/" if run.num_nodes > 1 else ""
    return [{"path": p, "destination": d.rstrip("/") + "/" + suffix} for p, d in outputs.items()]


def collect_command(ref: str, *, json_out: bool) -> int:
    """`gpucloud collect RUN`; returns the job's exit code (what `run` would have returned)."""
    from gpucloud.ui.jsonout import emit

    result = collect_run(ref)
    if json_out:
        emit(result.as_json())
    else:
        to_stderr(
            f"run {result.run_id}: {result.status} "
            + (f"(exit {result.exit_code})" if result.exit_code is not None else "(the job reported no exit code)")
            + f"; results in {result.directory}"
            + (f"; {len(result.refused)} artifact member(s) refused (see the warnings above)" if result.refused else "")
        )
        if not result.artifacts:
            to_stderr("no artifacts were uploaded by the job")
        for out in result.outputs:
            to_stderr(f"outputs: {out['path']} -> {out['destination']} (uploaded by the machine)")
    if result.teardown_errors:
        return 70
    return result.exit_code or 0
