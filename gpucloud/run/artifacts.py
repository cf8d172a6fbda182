"""A followed run's artifacts, read back at its end (lifecycle.RunInProgress._collect): every node's tarball
into ./gpucloud-runs/RUN/ (node-N/ per node when there are several), one line per refused member,
and the summary of what came back.

Kept apart from the lifecycle so that what the user sees about artifacts is decided in one place;
the lifecycle keeps the state store and the phase timing.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from gpucloud.channel.extract import ThroughLink, about_archive, cap_of, count_refused, make_folders
from gpucloud.errors import UserError
from gpucloud.ui.untrusted import shown

if TYPE_CHECKING:
    from gpucloud.channel.extract import ArtifactResult
    from gpucloud.channel.run_objects import Channel
    from gpucloud.ui.progress import Progress


def results_dir(run_id: str) -> Path:
    """Where a run's artifacts land: below the folder the CLI was started in."""
    return Path.cwd() / "gpucloud-runs" / run_id


def results_folders(dest: Path, num_nodes: int) -> None:
    """Create dest (RESULTS/RUN, and node-N/ per node when there are several) below the folder that
    holds RESULTS, never through a link: a `gpucloud-runs` or run folder that is a symbolic link
    (planted by anyone who can write the working folder) would put the artifacts, and the download's
    temporary file, wherever it points. UserError names the link and the fix."""
    nodes = [f"node-{rank}" for rank in range(num_nodes)] if num_nodes > 1 else [""]
    try:
        for node in nodes:
            make_folders(dest.parent.parent, [dest.parent.name, dest.name, *filter(None, [node])])
    except ThroughLink as exc:
        raise UserError(
            f"{shown(str(exc.path))} is a symbolic link (or not a folder): gpucloud writes a run's artifacts "
            "only into real folders, never through a link that could point anywhere; nothing was written.",
            hint=f"Remove or rename {shown(str(exc.path))} (gpucloud creates a real folder in its place), or "
            "run gpucloud from another folder.",
        ) from None


def refused_note(refused: list[str]) -> str:
    """The run summary's note on artifacts that were not extracted: which caps refused an archive,
    and how many members were refused."""
    caps = sorted({cap for line in refused if (cap := cap_of(line))})
    whole = [line for line in refused if about_archive(line) and not cap_of(line)]
    members = [line for line in refused if not about_archive(line)]
    parts = [f"artifacts over a cap ({', '.join(caps)}) not kept"] if caps else []
    if whole:
        parts.append(f"{len(whole)} artifacts archive(s) refused or cut short")
    if members:
        parts.append(f"{count_refused(members)} artifact member(s) refused")
    return ", ".join(parts) + ", see the warnings above and docs/SECURITY.md"


def fetch_artifacts(
    channel: Channel, run_id: str, num_nodes: int, dest: Path, *, refused: list[str], progress: Progress
) -> list[ArtifactResult]:
    """Download and extract every node's artifacts. A node whose artifacts cannot be read back is a
    warning, not an error: the others still come back. Each refused member is appended to
    `refused` (in place, as it is found, so that an interrupt keeps the lines seen so far) and
    shown as a warning. A results folder that is a link is one such line, and nothing is read."""
    got: list[ArtifactResult] = []
    try:
        results_folders(dest, num_nodes)
    except UserError as exc:
        refused.append(f"artifacts not read back: {exc.message} {exc.hint}")
        progress.warn(refused[-1])
        return got
    for rank in range(num_nodes):
        try:
            out = channel.download_artifacts(run_id, rank, dest if num_nodes == 1 else dest / f"node-{rank}")
        except Exception as exc:
            progress.warn(shown(f"artifacts of node {rank} could not be read back: {exc}"))
            continue
        if out is not None:
            got.append(out)
            for warning in out.warnings:
                refused.append(f"node {rank}: {warning}" if num_nodes > 1 else warning)
                progress.warn(refused[-1])
    return got


def settle_artifacts(
    got: list[ArtifactResult], dest: Path, *, interrupted: bool, expected: bool, progress: Progress
) -> Path | None:
    """Say what came back and return the folder, or None when nothing did. An interrupted run that
    brought back no file leaves no empty folder behind. `expected`: the job names artifacts."""
    if interrupted and not sum(out.files for out in got):
        got = []
        if not (dest.parent.is_symlink() or dest.is_symlink()):  # never a folder behind a planted link
            shutil.rmtree(dest, ignore_errors=True)
    if got:
        refused = sum(count_refused(out.warnings) for out in got)
        progress.info(
            f"artifacts in {dest}: {sum(out.files for out in got)} file(s)"
            + (f", {refused} refused (see the warnings above)" if refused else "")
        )
        return dest
    if expected and interrupted:
        progress.warn("nothing came back: none of the job's artifacts was uploaded before its machines stopped")
    elif expected:
        progress.warn("the job produced none of its artifacts")
    return None
