"""What `validate` and `plan` say about the upload before anything is paid for: the workdir exists,
how many files and bytes go to the machine, and the effective max_duration.
The same file list as the code tarball (`channel.workdir_files`: .gitignore honoured)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucloud.errors import UserError
from gpucloud.ui.progress import fmt_seconds

if TYPE_CHECKING:
    from gpucloud.spec.load import JobSpec


@dataclass(frozen=True)
class UploadInfo:
    workdir: Path
    files: int
    bytes: int
    max_duration_s: int

    def as_json(self) -> dict[str, Any]:
        return {
            "workdir": str(self.workdir),
            "files": self.files,
            "bytes": self.bytes,
            "max_duration_s": self.max_duration_s,
        }

    def summary(self) -> str:
        from gpucloud.channel.workdir import human_bytes

        return (
            f"workdir {self.workdir}: {self.files} file(s), {human_bytes(self.bytes)} uploaded before compression "
            f"(.gitignore honoured); max_duration {fmt_seconds(self.max_duration_s)} "
            f"({self.max_duration_s} s): the machine ends itself then"
        )


def describe_upload(spec: JobSpec) -> UploadInfo:
    """Raise a UserError naming the job file and field when the workdir is missing; else count it."""
    from gpucloud.channel.workdir import workdir_files
    from gpucloud.spec.reach import credential_places

    path = spec.workdir_path()
    where = f"{spec.source}: workdir" if spec.source else "workdir"
    if not path.exists():
        raise UserError(
            f"{where}: the folder {path} does not exist.",
            hint=f"Create it, or set workdir (relative to the job file's folder) to the folder "
            f"to upload; it is {spec.workdir!r} now.",
        )
    if not path.is_dir():
        raise UserError(
            f"{where}: {path} is a file, not a folder.",
            hint="Set workdir to the folder that holds the job's code, e.g. workdir: .",
        )
    files = workdir_files(path, credential_places())
    size = 0
    for rel in files:
        try:
            size += (path / rel).lstat().st_size  # a link travels as a link
        except OSError:
            continue
    return UploadInfo(workdir=path, files=len(files), bytes=size, max_duration_s=int(spec.max_duration))
