"""`python3 -m gpucloud.vm.agent.mask`: copy stdin to stdout with every secret's value replaced by
`***`, as CI systems do. The values come from the env names in GPUCLOUD_MASKED_NAMES (the job's
own environment, so nothing else holds them). A value split across two reads is still caught: the
tail that could start a value is held back until the next read (or the end).

Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import List

MASK = b"***"
READ = 65536


class Masker:
    def __init__(self, values: List[bytes]) -> None:
        self.values = sorted({v for v in values if v}, key=len, reverse=True)
        self.pending = b""

    def feed(self, data: bytes) -> bytes:
        buf = self.pending + data
        for v in self.values:
            buf = buf.replace(v, MASK)
        keep = self._held(buf)
        self.pending = buf[len(buf) - keep :] if keep else b""
        return buf[: len(buf) - keep]

    def flush(self) -> bytes:
        out, self.pending = self.pending, b""
        return out

    def _held(self, buf: bytes) -> int:
        """How many trailing bytes could be the start of a value."""
        for n in range(min(len(buf), max((len(v) for v in self.values), default=1) - 1), 0, -1):
            tail = buf[-n:]
            if any(v.startswith(tail) for v in self.values):
                return n
        return 0


def values_from_env(environ: "os._Environ[str]") -> List[bytes]:
    names = [n for n in environ.get("GPUCLOUD_MASKED_NAMES", "").split(",") if n]
    return [os.fsencode(environ[n]) for n in names if environ.get(n)]


def main() -> int:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    masker = Masker(values_from_env(os.environ))
    fin, fout = sys.stdin.fileno(), sys.stdout.buffer
    while True:
        data = os.read(fin, READ)
        if not data:
            break
        fout.write(masker.feed(data))
        fout.flush()
    fout.write(masker.flush())
    fout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
