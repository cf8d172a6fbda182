"""Every request the node makes, through curl (file://, http(s), S3 POST forms and
Azure Append Block alike, each call bounded in time). One object per agent, swapped for a fake channel
in unit tests.

Every call is bounded: `--connect-timeout 10`, `--max-time`, and `--retry 2 --retry-connrefused`
(Ubuntu 20.04's curl 7.68 lacks --retry-all-errors). `hard=True` tries 4 times more, for the final
status, the last log part and the artifacts. Stdlib only, Python >= 3.8 syntax.

Only a 2xx answer is a delivery. `curl -f` fails on >= 400 alone, and S3 answers 307 on a bucket's
global name for hours after it is made: a redirect's body is not the object and its PUT did not
land. So every HTTP call reads the status code (`-w %{http_code}`, the last 3 bytes of stdout) and
counts anything else as a failure to retry; redirects are never followed (a presigned URL is signed
for its host). Each kind of refusal is written once to stderr, the machine's console log: the method,
the object (host and path, never the signature) and the code.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, List, Optional, Protocol, Sequence, Set, Tuple
from urllib.parse import urlsplit

from gpucloud.vm.agent.sigv4 import header_args, post_target
from gpucloud.vm.protocol import AZURE_STORAGE_VERSION

CURL_BOUNDS = ("--connect-timeout", "10", "--retry", "2", "--retry-delay", "1", "--retry-connrefused")
HARD_TRIES = 4
CODE = ("-w", "%{http_code}")  # written after the body: stdout's last 3 bytes ("000": no HTTP answer)
REPORTS_MAX = 100  # distinct refusals written to stderr, at most
SIGNED_QUIET = (b"400", b"401", b"403")  # the node's own PUT of a POST grant refused: the form follows


class OwnAuth(Protocol):
    """The node's own credentials for a granted URL: sigv4.Signer (S3), blob_token.BlobBearer (Azure)."""

    hides_missing: bool  # a 403 to the node's own GET may mean "no such object" (S3 without ListBucket)

    def signed(self, method: str, url: str, region: Optional[str] = None) -> Optional[Tuple[str, List[str]]]: ...


def delivered(url: str, rc: int, code: bytes) -> bool:
    """curl's exit 0 and, over HTTP(S), a 2xx answer (file:// has no code: "000")."""
    if rc != 0:
        return False
    if url.startswith(("http://", "https://")):
        return code[:1] == b"2" and len(code) == 3
    return True


def what(url: str) -> str:
    """The object a URL names, for a message: host and path, never the query (the signature)."""
    parts = urlsplit(url)
    text = (parts.netloc.rsplit("@", 1)[-1] + parts.path) if parts.netloc else parts.path
    return "".join(c if c.isprintable() else "?" for c in text)[:300]


class Transfer:
    """curl with bounds and retries; `sleep` between hard tries comes from the agent's clock."""

    def __init__(self, put_headers: Sequence[str] = (), sleep: Optional[Callable[[float], None]] = None) -> None:
        self.put_headers = list(put_headers)
        self._sleep = sleep or (lambda s: None)
        self._procs: Set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._reported: Set[Tuple[str, str, str]] = set()
        self.last_refusal = ""  # the latest non-delivery, as written to stderr
        self.signer: Optional[OwnAuth] = None  # the node's own credentials (sigv4.py, blob_token.py), when it has them

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

    def _checked(
        self,
        method: str,
        url: str,
        args: Sequence[str],
        max_time: float,
        name: str = "",
        quiet: Sequence[bytes] = (),
        region: Optional[str] = None,
    ) -> Tuple[Optional[bytes], bytes]:
        """One request that counts as done only on a 2xx: (stdout, the body when not sent to a file,
        or None; the HTTP code). Codes in `quiet` are ordinary answers (an object not there yet: 404).
        With a signer, a granted URL goes with the node's own credentials first (S3 SigV4, Azure
        Bearer); a 4xx there (not the identity's object, credentials not there yet) tries the URL as
        granted. S3 answers 403, not 404, for a missing object to a role without s3:ListBucket
        (`hides_missing`): where 404 is an ordinary answer, so is that."""
        signer = self.signer
        own = signer.signed(method, url, region) if signer is not None else None
        if signer is not None and own is not None:
            rc, out = self._curl([*args, *header_args(own[1]), *CODE, own[0]], max_time, capture=True)
            body, code = out[:-3], out[-3:]
            if delivered(own[0], rc, code) or code in quiet:
                return (body if delivered(own[0], rc, code) else None), code
            if code == b"403" and b"404" in quiet and signer.hides_missing:
                return None, b"404"
            if code[:1] != b"4" or url == own[0]:
                if code not in SIGNED_QUIET or url != own[0]:
                    self._report(method, name or what(url), code.decode("ascii", "replace"), rc)
                return None, code
        rc, out = self._curl([*args, *CODE, url], max_time, capture=True)
        body, code = out[:-3], out[-3:]
        if delivered(url, rc, code):
            return body, code
        if code not in quiet:
            self._report(method, name or what(url), code.decode("ascii", "replace"), rc)
        return None, code

    def _report(self, method: str, obj: str, code: str, rc: int) -> None:
        """Once per method, object and answer: the console log says why nothing was delivered."""
        why = f"HTTP {code}" if code not in ("", "000") else "no HTTP answer"
        line = f"gpucloud: {method} {obj}: {why} (curl exit {rc}); not delivered, only a 2xx is"
        with self._lock:
            self.last_refusal = line
            key = (method, obj, code if code != "000" else str(rc))
            if key in self._reported or len(self._reported) >= REPORTS_MAX:
                return
            self._reported.add(key)
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

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
        return self._checked("GET", url, ["-f", *extra], max_time, quiet=(b"404",))[0]

    def get_file(self, url: str, dest: Path, *, max_time: float = 1800, retries: int = 0) -> bool:
        if not url:
            return False
        """A redirect (S3's 307 while a bucket's name is young) is tried again like a hard call: it
        says the object is there, on another host this URL is not signed for."""
        extra = ["--retry", str(retries)] if retries else []
        for i in range(HARD_TRIES + 1):
            if i:
                self._sleep(i)
            body, code = self._checked("GET", url, ["-f", *extra, "-o", str(dest)], max_time)
            if body is not None:
                return True
            try:  # a redirect's body is not the object
                Path(dest).unlink()
            except OSError:
                pass
            if code[:1] != b"3":
                return False
        return False

    def put_file(self, url: str, path: Path, *, max_time: float = 30, hard: bool = False) -> bool:
        if not url:
            return False
        headers: List[str] = []
        for h in self.put_headers:
            headers += ["-H", h]

        def once() -> bool:
            return (
                self._checked("PUT", url, ["-f", "-o", "/dev/null", "-T", str(path), *headers], max_time)[0] is not None
            )

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
        target = post_target(url, fields, key) if self.signer is not None else None

        def once() -> bool:
            if target is not None:  # the node's own PUT of the key; the form if the role cannot
                put = ["-f", "-o", "/dev/null", "-T", str(path)]
                if self._checked("PUT", target[0], put, max_time, region=target[1])[0] is not None:
                    return True
            sent = self._checked("POST", url, ["-f", "-o", "/dev/null", *form], max_time, name=f"{what(url)} key {key}")
            return sent[0] is not None

        return self._hard(once, hard)

    def append_block(
        self, url: str, path: Path, offset: Optional[int], *, max_time: float = 30, hard: bool = False
    ) -> bool:
        """Azure Append Block at `offset`: 201 landed; 412 = an earlier try of this part landed.
        With the node's own token, sent with it first; a 4xx there is tried with the SAS."""
        cond = ["-H", f"x-ms-blob-condition-appendpos: {offset}"] if offset is not None else []
        ok = (b"201", b"412") if offset is not None else (b"201",)
        target = f"{url}&comp=appendblock"

        def send(to: str, auth: Sequence[str]) -> Tuple[int, bytes]:
            version = [] if auth else ["-H", f"x-ms-version: {AZURE_STORAGE_VERSION}"]
            args = ["-o", "/dev/null", *CODE, "-T", str(path), *version, *header_args(auth), *cond, to]
            rc, out = self._curl(args, max_time, capture=True)
            return rc, out.strip()

        def once() -> bool:
            own = self.signer.signed("PUT", target) if self.signer is not None else None
            if own is not None:
                rc, code = send(own[0], own[1])
                if code in ok:
                    return True
                if code[:1] != b"4":
                    self._report("PUT", what(url) + " appendblock", code.decode("ascii", "replace"), rc)
                    return False
            rc, code = send(target, ())
            if code in ok:
                return True
            self._report("PUT", what(url) + " appendblock", code.decode("ascii", "replace"), rc)
            return False

        return self._hard(once, hard)

    def request(self, method: str, url: str, headers: Sequence[str] = (), *, max_time: float = 20) -> Optional[bytes]:
        """A metadata or management call (IMDS, ARM): the body, or None on failure."""
        args = ["-f", "-X", method]
        for h in headers:
            args += ["-H", h]
        rc, out = self._curl([*args, *CODE, url], max_time, capture=True)  # metadata: no console line
        return out[:-3] if delivered(url, rc, out[-3:]) else None
