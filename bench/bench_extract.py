"""Artifacts extraction in bounded time and memory: wall, CPU and peak RSS of one extraction per
hostile archive, each in a fresh child process (resource.getrusage), on this machine's Python.

Archives (written raw: one tar header repeated, gzip members concatenated, so they take well
under a second to make): a 1 MiB PAX header of digits (tarfile before 3.11.10 parses it in
quadratic time: CVE-2024-6232), 1M files, 1M symbolic links, 300k folders, and a normal artifacts
tarball of about 100 MB (100 incompressible 1 MiB files and 1,000 small ones) for regression.
`--old REV` also runs the extract.py of a git revision (its own tarfile walk) on each archive,
with the same per-archive time limit (`--limit`, default 60 s).
Usage: python bench/bench_extract.py [--old REV] [--limit S] [--node]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MiB = 1024 * 1024
END = bytes(1024)

CHILD = r"""
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
impl, archive, dest = sys.argv[2:5]
if impl == "node":
    from gpucloud.vm.agent.safe_extract import Refused, safe_untar
    t0, c0 = time.monotonic(), time.process_time()
    try:
        note = f"{safe_untar(archive, dest)} files"
    except Refused as exc:
        note = f"refused: {exc}"
else:
    if impl == "new":
        from gpucloud.channel.extract import ArchiveLimits, extract_tar
    else:
        import importlib.util
        spec = importlib.util.spec_from_file_location("old_extract", impl)
        mod = importlib.util.module_from_spec(spec); sys.modules["old_extract"] = mod
        spec.loader.exec_module(mod)
        ArchiveLimits = getattr(mod, "ArchiveLimits", None) or mod.Caps  # an older copy names it Caps
        extract_tar = mod.extract_tar
    from pathlib import Path
    t0, c0 = time.monotonic(), time.process_time()
    with open(archive, "rb") as fh:
        got = extract_tar(fh, Path(dest), ArchiveLimits())
    note = f"{got.files} files, {len(got.warnings)} lines" + (f"; {got.warnings[-1][:90]}" if got.warnings else "")
u = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall": time.monotonic() - t0, "cpu": time.process_time() - c0,
                  "rss": u.ru_maxrss / 1024, "note": note}))
"""


def header(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, link: str = "", mode: int = 0o644) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname, info.mode = kind, size, link, mode
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def numbered(kind: bytes, count: int, path: Path, per: int = 10_000, **kw: object) -> None:
    """`count` members of one kind with distinct names (n0000000...), in gzip members of `per`."""
    with open(path, "wb") as out:
        for start in range(0, count, per):
            blocks = b"".join(header(f"out/n{i:07d}", kind, **kw) for i in range(start, min(count, start + per)))  # type: ignore[arg-type]
            out.write(gzip.compress(blocks, 6))
        out.write(gzip.compress(END))


def pax_bomb(path: Path, size: int = MiB) -> None:
    path.write_bytes(gzip.compress(header("p", tarfile.XHDTYPE, size) + b"1" * size + header("f") + END, 9))


def normal(path: Path) -> None:
    """About 100 MB: 100 files of 1 MiB of random bytes (no gzip gain) and 1,000 small text files."""
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for i in range(100):
            info = tarfile.TarInfo(f"out/model/shard-{i:03d}.bin")
            info.size = MiB
            tar.addfile(info, _Bytes(os.urandom(MiB)))
        for i in range(1000):
            data = f"step {i} loss {1 / (i + 1):.6f}\n".encode() * 20
            info = tarfile.TarInfo(f"out/logs/{i // 100}/step-{i:04d}.txt")
            info.size = len(data)
            tar.addfile(info, _Bytes(data))


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        out = self.data[self.pos : self.pos + n] if n >= 0 else self.data[self.pos :]
        self.pos += len(out)
        return out


CASES = {
    "1 MiB PAX header": lambda p: pax_bomb(p),
    "1M files": lambda p: numbered(tarfile.REGTYPE, 1_000_000, p),
    "1M symlinks": lambda p: numbered(tarfile.SYMTYPE, 1_000_000, p, link="/etc/passwd"),
    "300k folders": lambda p: numbered(tarfile.DIRTYPE, 300_000, p, mode=0o755),
    "normal 100 MB": lambda p: normal(p),
}


def run(impl: str, archive: Path, dest: Path, limit: float) -> dict[str, object]:
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(REPO), impl, str(archive), str(dest)],
            capture_output=True,
            text=True,
            timeout=limit,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"wall": None, "note": f"stopped at the {limit:g} s limit"}
    if out.returncode:
        return {"wall": None, "note": f"failed: {out.stderr.strip().splitlines()[-1:]}"}
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", help="also run gpucloud/channel/extract.py of this git revision")
    ap.add_argument("--limit", type=float, default=60.0, help="seconds per extraction before it is stopped")
    ap.add_argument("--node", action="store_true", help="also the node's safe_untar (gpucloud/vm/agent)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-extract-") as tmp:
        impls = ["new"] + (["node"] if args.node else [])
        if args.old:
            old = Path(tmp) / "old_extract.py"
            show = ["git", "-C", str(REPO), "show", f"{args.old}:gpucloud/channel/extract.py"]
            old.write_bytes(subprocess.check_output(show))
            impls.append(str(old))
        print(f"Python {sys.version.split()[0]}; load: {os.getloadavg()[0]:.2f}")
        print("| archive | gz size | extraction | wall | CPU | peak RSS | outcome |")
        print("|---|---|---|---|---|---|---|")
        for name, make in CASES.items():
            archive = Path(tmp) / "a.tgz"
            make(archive)
            for impl in impls:
                dest = Path(tempfile.mkdtemp(dir=tmp))
                got = run(impl, archive, dest, args.limit)
                label = "this tree" if impl == "new" else "node safe_untar" if impl == "node" else f"{args.old}"
                wall = f"{got['wall']:.2f} s" if got["wall"] is not None else "-"
                cpu = f"{got['cpu']:.2f} s" if "cpu" in got else "-"
                rss = f"{got['rss']:.0f} MiB" if "rss" in got else "-"
                packed = archive.stat().st_size
                size = f"{packed / MiB:.1f} MiB" if packed > MiB else f"{packed / 1024:.1f} KiB"
                print(f"| {name} | {size} | {label} | {wall} | {cpu} | {rss} | {got['note']} |", flush=True)
                subprocess.run(["rm", "-rf", str(dest)], check=False)


if __name__ == "__main__":
    main()
