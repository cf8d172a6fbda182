"""What `gpucloud gc` may touch on a Slurm cluster, read from the cluster's own answers.

A shared cluster's queue holds other people's jobs, and a job's comment is whatever its owner
wrote: a comment is only taken as gpucloud's when it is exactly what the provider writes
(`gpucloud-run=<run id>,gpucloud-expires=<expiry>`), on a job of the calling user (checked here
again, whatever squeue's filter did). Everything else that looks like gpucloud's is named and left
alone; nothing read here raises (docs/SECURITY.md, "What gc deletes")."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gpucloud.contract.provider import TAG_RUN
from gpucloud.contract.tags import parse_run_tags
from gpucloud.providers.ssh.channel import removal_problem
from gpucloud.ui.untrusted import shown

GC_GRACE_S = 5  # how long gc waits for a cancelled job to leave the queue
SHOWN_MAX = 200  # characters of a foreign comment or line that a note quotes


@dataclass(frozen=True)
class Expired:
    """One of the caller's gpucloud jobs whose expiry passed."""

    job_id: str
    run_id: str
    expires: datetime


def parse_listing(text: str, now: datetime) -> tuple[list[Expired], list[str]]:
    """GC_SCRIPT's output -> (the caller's gpucloud jobs past their expiry, one note per job or line
    left alone and why)."""
    lines = text.splitlines()
    me = lines[0][4:].strip() if lines and lines[0].startswith("@me ") else ""
    if not me:
        return [], ["could not tell which user gpucloud runs as there (`id -un` said nothing): nothing cancelled"]
    expired: list[Expired] = []
    notes: list[str] = []
    for line in lines[1:]:
        if not line.strip():
            continue
        parts = line.split("|", 2)
        if len(parts) != 3:
            notes.append(f"unreadable squeue line left alone: {shown(line, limit=SHOWN_MAX)}")
            continue
        job_id, user, comment = parts
        if "gpucloud" not in comment:
            continue  # not a gpucloud job: none of gc's business
        what = f"job {shown(job_id, limit=SHOWN_MAX)}"
        if not (job_id.isascii() and job_id.isdigit()):
            notes.append(f"{what}: not a plain job id, left alone")
        elif user != me:
            notes.append(f"{what} belongs to {shown(user, limit=SHOWN_MAX)}, not {shown(me)}: left alone")
        elif (tags := parse_run_tags(comment)) is None:
            notes.append(
                f"{what}: its comment is not a {TAG_RUN} tag as gpucloud writes it, left alone: "
                f"{shown(comment, limit=SHOWN_MAX)}"
            )
        elif tags[1] <= now:
            expired.append(Expired(job_id, tags[0], tags[1]))
    return expired, notes


def cancel_problems(text: str, grace: int) -> list[str]:
    """CANCEL_SCRIPT's output -> what it could not do (empty: every job gone, every folder removed)."""
    problems = []
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        rest = shown(rest.strip(), limit=SHOWN_MAX)
        if word == "@left":
            problems.append(f"job(s) {rest} still in the queue {grace}s after scancel; folders kept")
        elif word == "@scancel":
            problems.append(f"scancel failed: {rest}")
        elif word in ("@refused", "@kept"):
            problems.append(removal_problem(word, rest))
    return problems
