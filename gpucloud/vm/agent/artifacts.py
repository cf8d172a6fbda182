"""The job's artifacts: the listed paths under the job folder packed into one tar.gz, hashed (the
final status carries the SHA-256, signed) and uploaded, tried hard. Missing paths are skipped with a
line in the log; a failure is named in the final status message. Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path
from typing import Callable, Sequence


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pack(job_dir: Path, paths: Sequence[str], dest: Path, log: Callable[[str], None]) -> Path:
    """tar.gz of the paths that exist (links stored as links, never followed)."""
    with tarfile.open(dest, "w:gz") as tar:
        for p in paths:
            src = job_dir / p
            if not (src.exists() or src.is_symlink()):
                log(f"artifact {p} not found (skipped)")
                continue
            tar.add(str(src), arcname=p.lstrip("/"), recursive=True)
    return dest


def collect(
    job_dir: Path, paths: Sequence[str], work: Path, upload: Callable[[Path], bool], log: Callable[[str], None]
) -> tuple:
    """(sha256 or "", problem or None): pack, hash, upload."""
    dest = work / "artifacts.tar.gz"
    try:
        pack(job_dir, paths, dest, log)
    except (OSError, tarfile.TarError):
        return "", "artifacts: tar failed (see the log)"
    digest = sha256_file(dest)
    if not upload(dest):
        return digest, f"artifacts: upload of {dest.stat().st_size} bytes failed after 4 tries"
    return digest, None
