"""The node's files are its user's only (docs/SECURITY.md, "Private remote files"): on a shared SSH
host or Slurm cluster the node's folder holds its key, the manifest's grants, the code, inputs,
logs and artifacts, and the host's other users must not read them. The agent sets umask 077 at
its start (the watchdog and the job inherit it); a file whose mode is set explicitly afterwards
(an archive member's 0644/0755, which the umask does not narrow) is narrowed here.
Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

UMASK = 0o077
OTHERS = 0o077  # group and other permission bits


def private_tree(root: Path) -> int:
    """Clear the group and other bits of every file and folder under `root` (links are left alone:
    their own mode means nothing, and their target may be outside); how many were changed."""
    changed = 0
    for dirpath, dirs, files in os.walk(str(root)):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
                if not stat.S_ISLNK(st.st_mode) and st.st_mode & OTHERS:
                    os.chmod(path, stat.S_IMODE(st.st_mode) & ~OTHERS)
                    changed += 1
            except OSError:
                continue
    return changed
