"""What gc reads back as gpucloud's own: run ids, a Slurm job's comment tag, a cloud resource's
`gpucloud-run`/`gpucloud-expires` tags, and the error a provider's gc raises when it found
something of its own that it could not cancel or remove. Anyone who can tag a resource, comment
a job or name a folder can write these values, so each is read strictly: anything not exactly as
gpucloud writes it is named by gc and never acted on (docs/SECURITY.md, "What gc cancels and
deletes")."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime

from gpucloud.contract.provider import TAG_EXPIRES, TAG_RUN, parse_expiry_tag
from gpucloud.errors import GpucloudError
from gpucloud.ui.untrusted import shown

# A run id (gpucloud/run/result.py new_run_id): the job's name, then the UTC time and 4 hex digits.
RUN_ID_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?-[0-9]{8}-[0-9]{6}-[0-9a-f]{4}")
_LABEL_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9])?")
_COMMENT_RE = re.compile(rf"{TAG_RUN}=([^,]*),{TAG_EXPIRES}=([^,]*)")


def is_run_id(text: object) -> bool:
    """Whether `text` is exactly a run id as gpucloud makes them (`<name>-<YYYYMMDD>-<HHMMSS>-<4 hex>`,
    the name as a job file's `name:`): a run id read back from a tag, a job comment or a folder
    name goes into remote paths, so anything else is never acted on."""
    return isinstance(text, str) and RUN_ID_RE.fullmatch(text) is not None


def parse_run_tags(text: str) -> tuple[str, datetime] | None:
    """`gpucloud-run=<run id>,gpucloud-expires=<expiry>` (a Slurm job's comment, exactly as the
    provider writes it) -> (run id, expiry); None for anything else, however close."""
    found = _COMMENT_RE.fullmatch(text)
    if not found or not is_run_id(found.group(1)):
        return None
    expires = parse_expiry_tag(found.group(2))
    return (found.group(1), expires) if expires is not None else None


def tagged_expiry(tags: Mapping[str, object]) -> tuple[datetime | None, str]:
    """(expiry, "") for a cloud resource whose gpucloud tags are as gpucloud writes them; (None, why)
    for a malformed or hostile pair, which gc names and never acts on. The run tag is a label there
    (resources are deleted by id), so any plain name passes; `..`, slashes, blanks or controls do not."""
    run, expires = tags.get(TAG_RUN), tags.get(TAG_EXPIRES)
    when = parse_expiry_tag(expires if isinstance(expires, str) else None)
    if when is None:
        return None, f"its {TAG_EXPIRES} tag ({shown(expires, limit=100)}) is not a time as gpucloud writes it"
    if not isinstance(run, str) or not _LABEL_RE.fullmatch(run):
        return None, f"its {TAG_RUN} tag ({shown(run, limit=100)}) is not a run id"
    return when, ""


class GcIncomplete(GpucloudError):
    """gc found something of its own that it could not cancel or remove (a job still queued after
    scancel, a folder that is not where it should be): named, and exit 75 as `down` with a host
    that cannot be reached, so a script sees that the sweep must be run again."""

    exit_code = 75

    def __init__(self, lines: list[str], failures: list[str]) -> None:
        super().__init__(
            "gc could not finish: " + "; ".join(failures),
            hint="What is named is still there (or not gpucloud's to remove): check it, run `gpucloud gc` again.",
        )
        self.lines = lines
        self.failures = failures
