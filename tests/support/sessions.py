"""`gpucloud ssh RUN -N` held open in the background, the local URL it prints for a forwarded port,
and a page read through it: what the port-forward tests of every provider share."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request

URL_RE = re.compile(r"port (\d+) -> (http://127\.0\.0\.1:(\d+)/) \(([^)]*)\)")


def hold_forwards(env: dict[str, str], run_id: str) -> tuple[subprocess.Popen[str], re.Match[str]]:
    """`gpucloud ssh RUN -N` started; its first URL line (node port, URL, local port, how)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpucloud", "ssh", run_id, "-N"],
        env={**env, "COLUMNS": "300"},  # the URL line unwrapped
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    found = URL_RE.search(line)
    if found is None:
        proc.terminate()
        raise AssertionError(f"no URL line from gpucloud ssh -N: {line!r}")
    return proc, found


def page(url: str) -> str:
    """The page at `url`, or "" while nothing serves it."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return str(resp.read().decode())
    except OSError:
        return ""
