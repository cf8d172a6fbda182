"""The channel: file:// backend that curl can read and write, per-run manifests, log parts,
artifacts, and workdir packing that honours .gitignore and a size cap."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpucloud.channel.run_objects import (
    URL_MARGIN,
    Channel,
    FileChannel,
    ObjectRefused,
    iter_manifest,
    log_key,
    log_prefix,
    pack_workdir,
    workdir_files,
)
from gpucloud.errors import UserError

SOON = datetime.now(UTC) + timedelta(hours=1)


class MemoryChannel(Channel):
    """A second backend, to prove the run-level protocol depends only on the primitives."""

    put_headers = ("x-test: 1",)

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.expiries: list[datetime] = []

    def put_bytes(self, key: str, data: bytes) -> None:
        self.objects[key] = data

    def get_bytes(self, key: str, limit: int | None = None) -> bytes | None:
        data = self.objects.get(key)
        if data is not None and limit is not None and len(data) > limit:
            raise ObjectRefused(f"{key} is larger than its cap of {limit} bytes")
        return data

    def url_get(self, key: str, expires: datetime) -> str:
        self.expiries.append(expires)
        return f"mem://get/{key}"

    def url_put(self, key: str, expires: datetime) -> str:
        self.expiries.append(expires)
        return f"mem://put/{key}"

    def log_grant(self, run_id: str, rank: int, expires: datetime) -> list[str]:
        self.expiries.append(expires)
        return [f"log_dir mem://put/{log_prefix(run_id, rank)}"]

    def delete_prefix(self, prefix: str) -> None:
        for key in [k for k in self.objects if k.startswith(prefix)]:
            del self.objects[key]


def curl(*args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:  # noqa: A002
    return subprocess.run(["curl", "-fsS", *args], capture_output=True, timeout=30, input=input)


# ---- FileChannel primitives -------------------------------------------------------------------


def test_file_channel_roundtrip_and_missing(tmp_path: Path) -> None:
    ch = FileChannel(tmp_path / "store")
    assert ch.get_bytes("runs/r/x") is None
    ch.put_bytes("runs/r/a/b.bin", b"\x00\x01data")
    assert ch.get_bytes("runs/r/a/b.bin") == b"\x00\x01data"
    ch.put_bytes("runs/r/a/b.bin", b"short")
    assert ch.get_bytes("runs/r/a/b.bin") == b"short"
    ch.delete_prefix("runs/r")
    assert ch.get_bytes("runs/r/a/b.bin") is None
    with pytest.raises(ValueError):
        ch.put_bytes("../escape", b"x")


def test_curl_put_to_file_url_creates_the_object(tmp_path: Path) -> None:
    """curl's file:// upload creates the file but not its folder: url_put must create the folder."""
    ch = FileChannel(tmp_path / "store with space")
    src = tmp_path / "src"
    src.write_bytes(b"hello\n")
    url = ch.url_put("runs/r1/node-0/log/000000", SOON)
    assert url.startswith("file://")
    assert curl("--retry", "3", "-T", str(src), url).returncode == 0
    assert ch.get_bytes("runs/r1/node-0/log/000000") == b"hello\n"
    # overwrite with shorter content truncates (status.json is re-PUT all the time)
    src.write_bytes(b"x")
    assert curl("-T", str(src), url).returncode == 0
    assert ch.get_bytes("runs/r1/node-0/log/000000") == b"x"
    # and GET through the file:// URL works
    ch.put_bytes("runs/r1/code.tar.gz", b"code")
    got = curl(ch.url_get("runs/r1/code.tar.gz", SOON))
    assert got.returncode == 0 and got.stdout == b"code"
    assert curl(ch.url_get("runs/r1/missing", SOON)).returncode != 0


# ---- prepare / manifest -----------------------------------------------------------------------


def test_prepare_writes_one_manifest_per_node(tmp_path: Path) -> None:
    ch = FileChannel(tmp_path)
    deadline = datetime.now(UTC) + timedelta(minutes=10)
    urls = ch.prepare("r1", 3, deadline)
    assert len(urls) == 3
    for rank, url in enumerate(urls):
        text = curl(url).stdout.decode()
        pairs = list(iter_manifest(text))
        keys = [k for k, _ in pairs]
        assert keys[:5] == ["deadline", "code_get", "status_put", "artifacts_put", "ready_put"]
        assert dict(pairs)["deadline"] == str(int(deadline.timestamp()))
        ready = [rest.split(" ", 1) for k, rest in pairs if k == "ready_get"]
        assert [int(i) for i, _ in ready] == [0, 1, 2]
        # a folder store grants the node's log folder instead of one URL per part
        assert "log_put" not in keys
        log_dir = dict(pairs)["log_dir"]
        assert log_dir.endswith(f"/node-{rank}/log")
        assert f"/node-{rank}/status.json" in dict(pairs)["status_put"]
        # every PUT target's folder exists, so the VM's curl -T succeeds
        assert Path(log_dir.removeprefix("file://")).is_dir()
        assert curl("-T", "-", f"{log_dir}/000000", input=b"part").returncode == 0
    assert ch.read_log_parts("r1", 2) == []  # counted only once status.json says so


def test_manifest_size_does_not_grow_with_max_duration(tmp_path: Path) -> None:
    ch = FileChannel(tmp_path)
    short = ch.prepare("a", 1, datetime.now(UTC) + timedelta(minutes=1))
    long = ch.prepare("b", 1, datetime.now(UTC) + timedelta(hours=6))
    sizes = [len(curl(u).stdout) for u in (short[0], long[0])]
    assert abs(sizes[0] - sizes[1]) < 10 and sizes[1] < 2000, sizes


def test_prepare_expiry_is_deadline_plus_margin() -> None:
    ch = MemoryChannel()
    deadline = datetime(2030, 1, 1, 12, tzinfo=UTC)
    ch.prepare("r1", 1, deadline)
    assert ch.expiries and set(ch.expiries) == {deadline + URL_MARGIN}
    manifest = ch.objects["runs/r1/node-0/manifest"].decode()
    assert manifest.splitlines()[-1] == "log_dir mem://put/runs/r1/node-0/log/"


# ---- status / log parts / artifacts -----------------------------------------------------------


def test_read_status_tolerates_absent_and_half_written(tmp_path: Path) -> None:
    ch = FileChannel(tmp_path)
    assert ch.read_status("r1", 0) is None
    ch.put_bytes("runs/r1/node-0/status.json", b'{"state": "runn')
    assert ch.read_status("r1", 0) is None
    ch.put_bytes("runs/r1/node-0/status.json", json.dumps({"state": "running", "log_parts": 0}).encode())
    assert ch.read_status("r1", 0)["state"] == "running"


def test_read_log_parts_returns_only_complete_parts() -> None:
    ch = MemoryChannel()
    for i, data in enumerate([b"a\n", b"b\n", b"c"]):
        ch.put_bytes(log_key("r1", 0, i), data)
    assert ch.read_log_parts("r1", 0, 0) == []  # no status yet: nothing is known complete
    ch.put_bytes("runs/r1/node-0/status.json", b'{"log_parts": 2}')
    assert ch.read_log_parts("r1", 0, 0) == [b"a\n", b"b\n"]
    assert ch.read_log_parts("r1", 0, 1) == [b"b\n"]
    ch.put_bytes("runs/r1/node-0/status.json", b'{"log_parts": 3}')
    assert ch.read_log_parts("r1", 0, 2) == [b"c"]
    assert ch.read_log_parts("r1", 0, 3) == []


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_download_artifacts(tmp_path: Path) -> None:
    ch = FileChannel(tmp_path / "store")
    assert ch.download_artifacts("r1", 0, tmp_path / "out") is None
    ch.put_bytes("runs/r1/node-0/artifacts.tar.gz", _tar({"outputs/model.bin": b"w", "metrics.json": b"{}"}))
    got = ch.download_artifacts("r1", 0, tmp_path / "out")
    assert got is not None and got.dest == tmp_path / "out" and got.files == 2 and got.warnings == []
    assert (got.dest / "outputs/model.bin").read_bytes() == b"w"
    assert (got.dest / "metrics.json").read_bytes() == b"{}"


def test_download_artifacts_skips_path_traversal_and_keeps_the_rest(tmp_path: Path) -> None:
    ch = FileChannel(tmp_path / "store")
    ch.put_bytes("runs/r1/node-0/artifacts.tar.gz", _tar({"../evil": b"x", "/abs/evil": b"y", "ok.txt": b"ok"}))
    got = ch.download_artifacts("r1", 0, tmp_path / "out")
    assert got is not None and got.files == 1
    assert (tmp_path / "out" / "ok.txt").read_bytes() == b"ok"
    assert not (tmp_path / "evil").exists() and not Path("/abs/evil").exists()
    assert sorted(got.warnings) == [
        "artifact '../evil' not extracted: a path out of the artifacts folder (..)",
        "artifact '/abs/evil' not extracted: an absolute path",
    ]


def _job_artifacts(tmp_path: Path, build: str) -> Path:
    """A tar.gz made by GNU tar from a folder the way the VM's collect_artifacts makes it."""
    src = tmp_path / "job"
    src.mkdir()
    subprocess.run(["bash", "-c", build], cwd=src, check=True)
    out = tmp_path / "artifacts.tar.gz"
    subprocess.run(["tar", "-czf", str(out), "-C", str(src), "outputs"], check=True)
    return out


@pytest.mark.parametrize(
    ("build", "kept", "warning"),
    [
        (
            "mkdir outputs; echo w > outputs/model.bin; ln -s model.bin outputs/latest",
            {"outputs/model.bin"},
            ["'outputs/latest' not extracted: a symbolic link (to 'model.bin')"],
        ),
        (
            "mkdir outputs; echo w > outputs/model.bin; ln -s /etc/passwd outputs/passwd; ln -s "
            "../../secret outputs/up",
            {"outputs/model.bin"},
            [
                "'outputs/passwd' not extracted: a symbolic link (to '/etc/passwd')",
                "'outputs/up' not extracted: a symbolic link (to '../../secret')",
            ],
        ),
        (
            "mkdir outputs; echo w > outputs/model.bin; mkfifo outputs/pipe",
            {"outputs/model.bin"},
            ["'outputs/pipe' not extracted: a FIFO (named pipe)"],
        ),
    ],
    ids=["symlink-in", "symlink-out", "fifo"],
)
def test_artifact_links_and_fifos(tmp_path: Path, build: str, kept: set[str], warning: list[str] | None) -> None:
    """No link is ever extracted, even one that points inside: links are how extraction escapes."""
    ch = FileChannel(tmp_path / "store")
    ch.put_file("runs/r1/node-0/artifacts.tar.gz", _job_artifacts(tmp_path, build))
    got = ch.download_artifacts("r1", 0, tmp_path / "out")
    assert got is not None
    present = {str(p.relative_to(got.dest)) for p in got.dest.rglob("*") if p.is_file() or p.is_symlink()}
    assert present == kept and got.files == len(kept)
    assert sorted(w.removeprefix("artifact ") for w in got.warnings) == sorted(warning or [])


def test_ten_thousand_small_artifacts_all_come_back(tmp_path: Path) -> None:
    ch = FileChannel(tmp_path / "store")
    build = (
        "mkdir -p outputs; cd outputs; "
        "for d in $(seq 0 99); do mkdir $d; for f in $(seq 0 99); do echo $d.$f > $d/$f; done; done"
    )
    ch.put_file("runs/r1/node-0/artifacts.tar.gz", _job_artifacts(tmp_path, build))
    got = ch.download_artifacts("r1", 0, tmp_path / "out")
    assert got is not None and got.files == 10_000 and not got.warnings
    assert (got.dest / "outputs/42/7").read_text() == "42.7\n"
    assert sum(1 for p in got.dest.rglob("*") if p.is_file()) == 10_000


def test_upload_code(tmp_path: Path) -> None:
    ch = FileChannel(tmp_path / "store")
    tarball = tmp_path / "code.tar.gz"
    tarball.write_bytes(b"tgz")
    ch.upload_code("r1", tarball)
    assert ch.get_bytes("runs/r1/code.tar.gz") == b"tgz"


# ---- pack_workdir -----------------------------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _names(tarball: Path) -> set[str]:
    with tarfile.open(tarball) as tar:
        return {m.name for m in tar.getmembers()}


COMMON = {
    "train.py": "print(1)\n",
    "lib/util.py": "x = 1\n",
    "data/big.bin": "0" * 100,
    "logs/run.log": "log\n",
    "keep.log": "keep\n",
    "secret.env": "K=V\n",
    "sub/.gitignore": "local_only.txt\n",
    "sub/local_only.txt": "no\n",
    "sub/shared.txt": "yes\n",
    "__pycache__/x.pyc": "c",
    "lib/__pycache__/y.pyc": "c",
    ".venv/bin/python": "py",
    "gpucloud-runs/old/out.txt": "old",
    ".gitignore": "/data/\n*.log\n!keep.log\nsecret.env\n",
}
EXPECTED = {"train.py", "lib/util.py", "keep.log", "sub/.gitignore", "sub/shared.txt", ".gitignore"}


def test_pack_workdir_plain_folder_honours_gitignore(tmp_path: Path) -> None:
    _tree(tmp_path / "wd", COMMON)
    tarball = pack_workdir(tmp_path / "wd", dest=tmp_path / "code.tar.gz")
    assert _names(tarball) == EXPECTED


def test_pack_workdir_in_git_work_tree_uses_git(tmp_path: Path) -> None:
    wd = tmp_path / "repo"
    _tree(wd, COMMON)
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "init", "-q", str(wd)], check=True, env=env)
    # a tracked file that is ignored still ships (git's rule), an untracked unignored one too
    (wd / "notes.log").write_text("tracked")
    subprocess.run(["git", "-C", str(wd), "add", "-f", "notes.log", "train.py"], check=True, env=env)
    (wd / "untracked.py").write_text("u")
    assert set(workdir_files(wd)) == EXPECTED | {"notes.log", "untracked.py"}
    # a deleted-but-tracked file is skipped, not an error
    (wd / "notes.log").unlink()
    tarball = pack_workdir(wd, dest=tmp_path / "code.tar.gz")
    assert _names(tarball) == EXPECTED | {"untracked.py"}


def test_pack_workdir_subfolder_of_git_repo(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _tree(repo, {"top.py": "t", "proj/a.py": "a", "proj/out/x.bin": "x", ".gitignore": "out/\n"})
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    assert set(workdir_files(repo / "proj")) == {"a.py"}


def test_pack_workdir_cap(tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "weights.bin").write_bytes(os.urandom(300_000))
    with pytest.raises(UserError) as exc:
        pack_workdir(wd, cap_bytes=100_000, dest=tmp_path / "code.tar.gz")
    text = exc.value.render()
    assert str(wd) in text and ".gitignore" in text
    assert re.search(r"packs to more than [\d.]+ KiB, above the cap of 97\.7 KiB", text), text
    assert not (tmp_path / "code.tar.gz").exists()
    tarball = pack_workdir(wd, cap_bytes=1_000_000, dest=tmp_path / "ok.tar.gz")
    assert _names(tarball) == {"weights.bin"}


def test_pack_workdir_stops_inside_a_file_far_past_the_cap(tmp_path: Path) -> None:
    """A dataset left in the workdir is refused after about the cap's worth of compression, not after
    compressing all of it (a many-GiB checkpoint would take minutes)."""
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "dataset.bin").write_bytes(os.urandom(16 * 1024 * 1024))  # incompressible: packs to ~16 MiB
    with pytest.raises(UserError) as exc:
        pack_workdir(wd, cap_bytes=1024 * 1024, dest=tmp_path / "code.tar.gz")
    said = re.search(r"packs to more than ([\d.]+) MiB", exc.value.render())
    assert said and 1.0 <= float(said.group(1)) < 1.5, exc.value.render()
    assert not (tmp_path / "code.tar.gz").exists()


def test_pack_workdir_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not a folder"):
        pack_workdir(tmp_path / "nope")
