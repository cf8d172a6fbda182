"""Names from outside (an object key of an input bucket, a file under an input folder) checked before
they become a path on the node or a line of curl's config file (docs/SECURITY.md, "Names from
outside"). Whoever can add an object to an input bucket chooses its key: a newline in it would be a
new line of curl's config (`upload-file = /etc/passwd`), a `..` a path outside the input folder. The
CLI's listing (gpucloud/run/data_grants.py) skips such keys with a warning and the node refuses them
again, through these same functions, so both ends refuse the same names.
Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import os
import re

# C0 controls, DEL and C1 controls: never part of a name the node writes or passes on.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def path_problem(rel: str) -> str:
    """Why `rel` (a '/'-separated path under an input folder; '' is the input itself) is refused, or ''."""
    if not rel:
        return ""
    if CONTROL.search(rel):
        return "a control character (newline, tab, NUL, ...)"
    if "\\" in rel:
        return "a backslash"
    for part in rel.split("/"):
        if part in (".", ".."):
            return f"a '{part}' path component"
        if not part:
            return "an empty path component (a leading '/', '//' or a trailing '/')"
    return ""


def under(base: str, rel: str) -> str:
    """`base/rel` when it resolves (links followed) inside `base`, else ''."""
    root = os.path.realpath(base)
    path = os.path.realpath(os.path.join(base, rel)) if rel else root
    inside = path == root if not rel else path.startswith(root.rstrip("/") + "/")
    return path if inside else ""


def curl_quoted(value: str) -> str:
    """`value` as a double-quoted value of curl's config syntax (`-K`): backslash and quote escaped.
    A control character is refused (ValueError): curl turns `\\n` back into a newline, and a raw one
    would end the line."""
    if CONTROL.search(value):
        raise ValueError("a control character")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def shown(text: str, limit: int = 200) -> str:
    """A name as the node's messages show it: escapes visible, at most `limit` characters."""
    return ascii(text[:limit])[1:-1] + ("..." if len(text) > limit else "")
