"""The job's `inputs:` and `outputs:` on the node (docs/DATA.md): the grants document arrives
sealed with the secrets (secret_env.py); inputs are copied before `setup`, several files at a
time, each to a temporary name renamed when whole (a file already there at its size is kept, so
a resumed node copies only what is missing), with progress in the log; outputs are uploaded at
the end straight to their bucket prefix (an S3 presigned POST, or a Blob container SAS PUT).
Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import quote

from gpucloud.vm.agent.names import CONTROL, curl_quoted, path_problem, shown, under
from gpucloud.vm.agent.stage_api import StageFailed
from gpucloud.vm.agent.transfer import Transfer

WORKERS = 16
BATCH = 256  # files per curl process (`--parallel`): one process and reused connections per batch
BLOCK_BLOB = "x-ms-blob-type: BlockBlob"
FILE_MAX_S = 3600


def _target(job_dir: Path, path: str) -> Path:
    return Path(path) if path.startswith("/") else job_dir / path


def _jobs(doc: Dict[str, Any], job_dir: Path) -> List[Tuple[str, Path, int]]:
    """(URL, file, size) of every input file; StageFailed naming the first name that is refused: one
    that is not a plain relative path (names.py), or that resolves outside its input's folder."""
    jobs: List[Tuple[str, Path, int]] = []
    for item in doc.get("inputs") or []:
        dest = _target(job_dir, str(item["dest"]))
        for f in item.get("files") or []:
            rel = str(f.get("rel") or "")
            why = path_problem(rel) or ("a control character" if CONTROL.search(str(item["dest"])) else "")
            if not why and not under(str(dest), rel):
                why = "a path that leads out of the input's folder"
            if why:
                raise StageFailed(f"input file name refused ({why}): {shown(rel)}")
            jobs.append((str(f["url"]), dest / rel if rel else dest, int(f.get("size") or 0)))
    return jobs


Report = Callable[[Dict[str, int]], None]


class _Progress:
    """Files and bytes copied so far: a log line every tenth of the way, and each step to `report`
    (the status document's `inputs` field, which `status` shows beside the timeline)."""

    def __init__(self, count: int, total: int, log: Callable[[str], None], report: Optional[Report] = None) -> None:
        self.count, self.total, self.log, self.report = count, total, log, report
        self.files = self.bytes = 0
        self.lock = threading.Lock()
        self.t0 = time.time()
        self.step = max(1, count // 10)

    def add(self, size: int) -> None:
        with self.lock:
            self.files += 1
            self.bytes += size
            if self.files % self.step == 0 or self.files == self.count:
                mb, secs = self.bytes / 1e6, max(0.001, time.time() - self.t0)
                of = f"{mb:.1f}/{self.total / 1e6:.1f} MB"
                self.log(f"inputs: {self.files}/{self.count} files, {of} ({mb / secs:.1f} MB/s)")
                if self.report is not None:
                    self.report({"files": self.files, "of": self.count, "bytes": self.bytes, "of_bytes": self.total})


def _fetch_one(job: Tuple[str, Path, int], transfer: Transfer) -> bool:
    url, path, size = job
    if path.is_file() and path.stat().st_size == size:
        return True
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.part")
    if not transfer.get_file(url, tmp, max_time=FILE_MAX_S, retries=3):
        return False
    if size and tmp.stat().st_size != size:
        return False
    os.replace(str(tmp), str(path))
    return True


def _keep(job: Tuple[str, Path, int]) -> bool:
    """A whole download (or a file already there at its size) takes its final name."""
    _, path, size = job
    if path.is_file() and path.stat().st_size == size:
        return True
    tmp = path.with_name(f".{path.name}.part")
    if tmp.is_file() and (not size or tmp.stat().st_size == size):
        os.replace(str(tmp), str(path))
        return True
    return False


def curl_config(batch: List[Tuple[str, Path, int]]) -> str:
    """curl's `-K` config for a batch: every value double-quoted with curl's escapes; a URL or file
    name with a control character in it is refused (StageFailed), never written as a line."""
    lines = []
    for url, path, _ in batch:
        tmp = path.with_name(f".{path.name}.part")
        try:
            lines += [f"url = {curl_quoted(url)}", f"output = {curl_quoted(str(tmp))}"]
        except ValueError as exc:
            raise StageFailed(f"input file refused ({exc} in its URL or name): {shown(str(path))}") from None
    return "\n".join(lines) + "\n"


def _curl_batch(batch: List[Tuple[str, Path, int]]) -> None:
    """One curl for many files (`--parallel`, curl >= 7.66); what it misses is fetched one by one."""
    text = curl_config(batch)
    for _, path, _ in batch:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, cfg = tempfile.mkstemp(prefix="gpucloud-inputs.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        subprocess.run(
            ["curl", "-sS", "-f", "--parallel", "--parallel-max", str(WORKERS), "--retry", "2",
             "--connect-timeout", "10", "--max-time", str(FILE_MAX_S), "-K", cfg],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
            timeout=FILE_MAX_S * 2,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        pass
    finally:
        os.unlink(cfg)


def fetch_inputs(
    doc: Dict[str, Any],
    job_dir: Path,
    transfer: Transfer,
    log: Callable[[str], None],
    report: Optional[Report] = None,
) -> Tuple[int, int]:
    """Copy every input; (files, bytes). StageFailed naming the first file that failed."""
    jobs = _jobs(doc, job_dir)
    progress = _Progress(len(jobs), sum(size for _, _, size in jobs), log, report)
    todo = [j for j in jobs if not _keep(j)]
    for j in jobs:
        if j not in todo:
            progress.add(j[2])
    for i in range(0, len(todo), BATCH):
        batch = todo[i : i + BATCH]
        _curl_batch(batch)
        for j in batch:
            if _keep(j):
                progress.add(j[2])
    left = [j for j in todo if not _keep(j)]

    def one(job: Tuple[str, Path, int]) -> str:
        ok = _fetch_one(job, transfer)
        progress.add(job[2])
        return "" if ok else str(job[1])

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:  # what the batches missed, one by one
        failed = [p for p in pool.map(one, left) if p]
    if failed:
        raise StageFailed(f"could not copy {len(failed)} input file(s), first {failed[0]}")
    return len(jobs), progress.total


def push_outputs(
    doc: Dict[str, Any],
    job_dir: Path,
    transfer: Transfer,
    log: Callable[[str], None],
    sent: Optional[Dict[str, Tuple[int, int]]] = None,
) -> bool:
    """Upload every file under each output path to its prefix; False when any failed (logged).
    With `sent` (path -> (size, mtime_ns) uploaded before), only new or changed files go up."""
    ok = True
    blob = Transfer([BLOCK_BLOB])
    for grant in doc.get("outputs") or []:
        src = _target(job_dir, str(grant["src"]))
        if not src.exists():
            log(f"outputs: {grant['src']} does not exist: nothing to upload")
            continue
        files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file() and not p.is_symlink())
        stamps = {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in files}
        if sent is not None:
            files = [p for p in files if sent.get(str(p)) != stamps[str(p)]]
        base = src.parent if src.is_file() else src
        t0 = time.time()
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            results = list(pool.map(lambda p, g=grant, b=base: _upload(g, b, p, transfer, blob), files))
        mb = sum(p.stat().st_size for p in files) / 1e6
        log(f"outputs: {grant['src']}: {sum(results)}/{len(files)} files, {mb:.1f} MB in {time.time() - t0:.1f} s")
        ok = ok and all(results)
        if sent is not None:
            sent.update({str(p): stamps[str(p)] for i, p in enumerate(files) if results[i]})
    return ok


class OutputSync:
    """`outputs_sync: interval`: new or changed output files go up every `interval` seconds while the
    job runs (a thread), and once more at the end (`final`); each file once per change."""

    def __init__(self, doc: Dict[str, Any], job_dir: Path, transfer: Transfer, log: Callable[[str], None]) -> None:
        self.doc, self.job_dir, self.transfer, self.log = doc, job_dir, transfer, log
        self.sent: Dict[str, Tuple[int, int]] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread: Optional[threading.Thread] = None

    def start(self, interval: float) -> "OutputSync":
        if interval > 0 and self.doc.get("outputs"):
            self.thread = threading.Thread(target=self._loop, args=(interval,), daemon=True, name="outputs")
            self.thread.start()
        return self

    def _loop(self, interval: float) -> None:
        while not self.stop.wait(interval):
            self.push()

    def push(self) -> bool:
        with self.lock:
            return push_outputs(self.doc, self.job_dir, self.transfer, self.log, self.sent)

    def final(self) -> bool:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
        return self.push()


def _upload(grant: Dict[str, Any], base: Path, path: Path, transfer: Transfer, blob: Transfer) -> bool:
    key = str(grant["prefix"]) + path.relative_to(base).as_posix()
    if grant.get("style") == "post":
        fields = [(str(k), str(v)) for k, v in grant.get("fields") or []]
        return transfer.post_form(str(grant["url"]), fields, key, path, max_time=FILE_MAX_S, hard=True)
    url = "{}/{}?{}".format(grant["url"], quote(key), grant["sas"])
    return blob.put_file(url, path, max_time=FILE_MAX_S, hard=True)
