"""Every request the node makes, through curl (file://, http(s), S3 POST forms and
Azure Append Block alike, each call bounded in time). One object per agent, swapped for a fake channel
in unit tests.

Every call is bounded: `--connect-timeout 10`, `--max-time`, and `--retry 2 --retry-connrefused`
(Ubuntu 20.04's curl 7.68 lacks --retry-all-errors). `hard=True` tries 4 times more, for the final
status, the last log part and the artifacts. Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Set, Tuple

from gpucloud.vm.protocol import AZURE_STORAGE_VERSION

CURL_BOUNDS = ("--connect-timeout", "10", "--retry", "2", "--retry-delay", "1", "--retry-connrefused")
HARD_TRIES = 4


class Transfer:
    """curl with bounds and retries; `sleep` between hard tries comes from the agent's clock."""

    def __init__(self, put_headers: Sequence[str] = (), sleep: Optional[Callable[[float], None]] = None) -> None:
        self.put_headers = list(put_headers)
        self._sleep = sleep or (lambda s: None)
        self._procs: Set[subprocess.Popen] = set()
        self._lock = threading.Lock()

    # ---- plumbing ------------------------------------------------------------------------------
    def _curl(self, args: Sequence[str], max_time: float, capture: bool = False) -> Tuple[int, bytes]:
        argv = ["curl", "-sS", *CURL_BOUNDS, "--max-time", str(int(max_time)), *args]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        except OSError:
            return 127, b""
        with self._lock:
            self._procs.add(proc)
        try:
            out, _ = proc.communicate(timeout=max_time * 4 + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        except BaseException:  # unwound by a signal (the run ended elsewhere): the call goes too
            proc.kill()
            raise
        finally:
            with self._lock:
                self._procs.discard(proc)
        return proc.returncode, out if capture else b""

    def _hard(self, attempt: Callable[[], bool], hard: bool) -> bool:
        if attempt():
            return True
        if not hard:
            return False
        for i in range(1, HARD_TRIES + 1):
            self._sleep(i)
            if attempt():
                return True
        return False

    def kill_all(self) -> None:
        """End every curl in flight (a pump told to stop does not wait for a hung upload)."""
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            try:
                proc.kill()
            except OSError:
                pass

    # ---- the calls -------------------------------------------------------------------------------
    def get(self, url: str, *, max_time: float = 30, limit: Optional[int] = None) -> Optional[bytes]:
        """The object's bytes, or None (missing, refused, unreachable, over `limit`)."""
        if not url:
            return None
        extra = ["--max-filesize", str(limit)] if limit else []
        rc, out = self._curl(["-f", *extra, url], max_time, capture=True)
        return out if rc == 0 else None

    def get_file(self, url: str, dest: Path, *, max_time: float = 1800, retries: int = 0) -> bool:
        if not url:
            return False
        extra = ["--retry", str(retries)] if retries else []
        rc, _ = self._curl(["-f", *extra, "-o", str(dest), url], max_time)
        return rc == 0

    def put_file(self, url: str, path: Path, *, max_time: float = 30, hard: bool = False) -> bool:
        if not url:
            return False
        headers: List[str] = []
        for h in self.put_headers:
            headers += ["-H", h]

        def once() -> bool:
            return self._curl(["-f", "-T", str(path), *headers, url], max_time)[0] == 0

        return self._hard(once, hard)

    def post_form(
        self,
        url: str,
        fields: Sequence[Tuple[str, str]],
        key: str,
        path: Path,
        *,
        max_time: float = 30,
        hard: bool = False,
    ) -> bool:
        """An S3 presigned POST: the policy's fields, the key, then the file (S3 wants it last)."""
        form: List[str] = []
        for name, value in fields:
            form += ["--form-string", f"{name}={value}"]
        form += ["--form-string", f"key={key}", "-F", f"file=@{path}"]

        def once() -> bool:
            return self._curl(["-f", "-o", "/dev/null", *form, url], max_time)[0] == 0

        return self._hard(once, hard)

    def append_block(
        self, url: str, path: Path, offset: Optional[int], *, max_time: float = 30, hard: bool = False
    ) -> bool:
        """Azure Append Block at `offset`: 201 landed; 412 = an earlier try of this part landed."""
        cond = ["-H", f"x-ms-blob-condition-appendpos: {offset}"] if offset is not None else []

        def once() -> bool:
            rc, out = self._curl(
                [
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    "-T",
                    str(path),
                    "-H",
                    f"x-ms-version: {AZURE_STORAGE_VERSION}",
                    *cond,
                    f"{url}&comp=appendblock",
                ],
                max_time,
                capture=True,
            )
            return out.strip() in (b"201", b"412") if offset is not None else out.strip() == b"201"

        return self._hard(once, hard)

    def request(self, method: str, url: str, headers: Sequence[str] = (), *, max_time: float = 20) -> Optional[bytes]:
        """A metadata or management call (IMDS, ARM): the body, or None on failure."""
        args = ["-f", "-X", method]
        for h in headers:
            args += ["-H", h]
        rc, out = self._curl([*args, url], max_time, capture=True)
        return out if rc == 0 else None
