"""`inputs:` with `mode: mount` on the node (docs/DATA.md): each bucket folder is mounted read-only
with rclone before `setup`, and unmounted by whoever ends the run (a mount left behind keeps a
FUSE daemon alive).

rclone is configured only through its own process's environment (RCLONE_CONFIG_<REMOTE>_*): the
credentials, sealed to this node's key, are never on a command line or on disk. Each rclone runs
in a session of its own (a signal to the agent's process group does not pull the folder from under
a job that is still saving), and is recorded in `W/mounts.json` (path, pid), so any process of
the node (the watchdog process, the backstop) or the machine's teardown can unmount it.

Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from gpucloud.vm.agent.stage_api import StageFailed

RECORD = "mounts.json"
REMOTE = "GPUCLOUDIN"  # the rclone remote every mount is defined as (one rclone process per mount)
MOUNT_WAIT_S = 30.0  # until /proc/mounts shows the folder
LIST_WAIT_S = 60.0  # the first listing (the credentials and the endpoint answer)
STOP_WAIT_S = 5.0
DROPPED_ENV = ("AWS_", "AZURE_", "RCLONE_")  # the machine's own settings must not change the remote
NEEDS = (
    "inputs: {dest}: mode: mount needs rclone and FUSE on the machine; install rclone in the image "
    "(or the job's setup cannot do it: it runs later), or use mode: copy"
)

TELLING = ("ERROR", "CRITICAL", "Failed", "RESPONSE Status", "status code", "ServiceCode")

Log = Callable[[str], None]


def mount_items(doc: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [item for item in doc.get("inputs") or [] if isinstance(item.get("mount"), dict)]


def _which(tool: str, environ: Dict[str, str]) -> Optional[str]:
    return shutil.which(tool, path=environ.get("PATH") or os.defpath)


def fuse_tool(environ: Dict[str, str]) -> Optional[str]:
    return _which("fusermount3", environ) or _which("fusermount", environ)


def rclone_env(grant: Dict[str, Any], environ: Dict[str, str], cache: Path) -> Dict[str, str]:
    """The rclone process's environment: the machine's, less its AWS/Azure/rclone settings, plus the
    remote (the only place its credentials are)."""
    env = {k: v for k, v in environ.items() if not k.startswith(DROPPED_ENV)}
    env["RCLONE_CONFIG"] = os.devnull
    env["RCLONE_CACHE_DIR"] = str(cache)
    pre = f"RCLONE_CONFIG_{REMOTE}_"
    if grant.get("type") == "azureblob":
        env.update({pre + "TYPE": "azureblob", pre + "SAS_URL": str(grant["sas_url"])})
        return env
    endpoint = str(grant.get("endpoint") or "")
    env.update(
        {
            pre + "TYPE": "s3",
            pre + "PROVIDER": str(grant.get("provider") or "Other"),  # the CLI names the store's kind
            pre + "REGION": str(grant.get("region") or "us-east-1"),
        }
    )
    if grant.get("env_auth") is True:
        env.update(instance_role_env(environ, pre))
    else:
        env.update(
            {
                pre + "ENV_AUTH": "false",
                pre + "ACCESS_KEY_ID": str(grant["access_key_id"]),
                pre + "SECRET_ACCESS_KEY": str(grant["secret_access_key"]),
                pre + "SESSION_TOKEN": str(grant.get("session_token") or ""),
            }
        )
    if endpoint:
        env.update({pre + "ENDPOINT": endpoint, pre + "FORCE_PATH_STYLE": "true"})
    return env


def instance_role_env(environ: Dict[str, str], pre: str) -> Dict[str, str]:
    """rclone signing as the machine's own role: `env_auth` with the SDK's chain left nothing but
    the instance profile (no key variables, no shared files), from the IMDS the node uses; the SDK
    reads the credentials again before they expire, so the mount lasts the whole run."""
    out = {
        pre + "ENV_AUTH": "true",
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "false",
    }
    imds = environ.get("GPUCLOUD_IMDS_ENDPOINT", "")
    if imds:  # a test's simulated instance; the real one is the SDK's default
        out["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = imds.rstrip("/")
    return out


def remote_path(grant: Dict[str, Any]) -> str:
    where = grant.get("container") if grant.get("type") == "azureblob" else grant.get("bucket")
    return f"{REMOTE}:{where}/{grant.get('prefix') or ''}"


def secret_parts(grant: Dict[str, Any]) -> List[str]:
    """What a message about this mount must never show."""
    parts = [str(grant.get(k) or "") for k in ("secret_access_key", "session_token", "sas_url")]
    query = str(grant.get("sas_url") or "").partition("?")[2]
    parts += [query] + [v for k, _, v in (p.partition("=") for p in query.split("&")) if k == "sig"]
    return sorted((p for p in parts if len(p) >= 8), key=len, reverse=True)


def _masked(text: str, secrets: Sequence[str]) -> str:
    for value in secrets:
        text = text.replace(value, "***")
    return text


def mounted_paths() -> List[str]:
    try:
        with open("/proc/mounts", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    return [_unescape(line.split()[1]) for line in lines if len(line.split()) > 1]


def _unescape(field: str) -> str:
    """/proc/mounts writes a space in a path as \\040 (and tab, newline, backslash likewise)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _load(vm_dir: Path) -> List[Dict[str, Any]]:
    try:
        entries = json.loads((vm_dir / RECORD).read_text())
    except (OSError, ValueError):
        return []
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _save(vm_dir: Path, entries: List[Dict[str, Any]]) -> None:
    tmp = vm_dir / (RECORD + ".tmp")
    tmp.write_text(json.dumps(entries))
    os.replace(str(tmp), str(vm_dir / RECORD))


def _tail(path: Path, secrets: Sequence[str]) -> str:
    """rclone's last words that say something (its errors span many lines of an HTTP dump)."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    telling = [ln for ln in lines if any(w in ln for w in TELLING)] or lines
    return _masked(" | ".join(telling[-3:]), secrets)[-600:]


def _listable(path: str) -> Optional[str]:
    """None when the mounted folder lists; else why (an error, or no answer in LIST_WAIT_S)."""
    box: Dict[str, str] = {}

    def look() -> None:
        try:
            os.listdir(path)
            box["ok"] = ""
        except OSError as exc:
            box["ok"] = exc.strerror or str(exc)

    t = threading.Thread(target=look, daemon=True, name="mount-check")
    t.start()
    t.join(LIST_WAIT_S)
    if "ok" not in box:
        return f"no answer in {LIST_WAIT_S:.0f} s"
    return box["ok"] or None


def mount_inputs(
    doc: Dict[str, Any], job_dir: Path, vm_dir: Path, environ: Dict[str, str], log: Log, sleep: Callable[[float], None]
) -> int:
    """Mount every `mode: mount` input read-only; the number mounted. StageFailed naming the first
    that cannot be (what is already mounted is recorded, for the end of the run to unmount)."""
    items = mount_items(doc)
    for item in items:
        if not _which("rclone", environ) or not fuse_tool(environ):
            raise StageFailed(NEEDS.format(dest=item["dest"]))
    for n, item in enumerate(items):
        _mount_one(n, item, job_dir, vm_dir, environ, log, sleep)
    return len(items)


def _mount_one(
    n: int,
    item: Dict[str, Any],
    job_dir: Path,
    vm_dir: Path,
    environ: Dict[str, str],
    log: Log,
    sleep: Callable[[float], None],
) -> None:
    dest, grant = str(item["dest"]), item["mount"]
    target = Path(dest) if dest.startswith("/") else job_dir / dest
    if target.is_dir() and any(target.iterdir()):
        raise StageFailed(f"inputs: {dest}: cannot mount {item.get('source')} on a folder that is not empty")
    if target.exists() and not target.is_dir():
        raise StageFailed(f"inputs: {dest}: cannot mount {item.get('source')} on a file")
    target.mkdir(parents=True, exist_ok=True)
    path = os.path.realpath(str(target))
    logfile = vm_dir / f"mount-{n}.log"
    argv = [str(_which("rclone", environ)), "mount", "--read-only", "--no-modtime", remote_path(grant), path]
    argv += ["--log-file", str(logfile), "--log-level", "NOTICE"]
    if os.geteuid() == 0:  # a job (or its container) running as another user can read it too
        argv.append("--allow-other")
    proc = subprocess.Popen(
        argv,
        env=rclone_env(grant, environ, vm_dir / "rclone-cache"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    _save(vm_dir, [*_load(vm_dir), {"path": path, "pid": proc.pid, "dest": dest}])
    secrets = secret_parts(grant)
    end = time.monotonic() + MOUNT_WAIT_S
    while path not in mounted_paths():
        if proc.poll() is not None or time.monotonic() > end:
            why = "rclone exited" if proc.poll() is not None else f"not mounted after {MOUNT_WAIT_S:.0f} s"
            raise StageFailed(f"inputs: {dest}: could not mount {item.get('source')}: {why}: {_tail(logfile, secrets)}")
        sleep(0.1)
    problem = _listable(path)
    if problem:
        raise StageFailed(
            f"inputs: {dest}: {item.get('source')} is mounted but cannot be listed ({problem}): "
            f"{_tail(logfile, secrets)}"
        )
    log(f"inputs: {dest}: mounted {item.get('source')} read-only")


def _alive_rclone(pid: int, path: str) -> bool:
    """`pid` is still the rclone of `path` (not a zombie, not a reused pid)."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X") and b"rclone" in cmd and path.encode() in cmd


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)  # this process's own child: no zombie left
    except OSError:
        pass


def _stop(pid: int, path: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _alive_rclone(pid, path):
            break
        try:
            os.kill(pid, sig)
        except OSError:
            break
        end = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < end:
            _reap(pid)
            if not _alive_rclone(pid, path):
                break
            time.sleep(0.05)
    _reap(pid)


def _unmount(path: str, lazy: bool) -> None:
    tool = fuse_tool(dict(os.environ))
    argv = [tool, "-uz" if lazy else "-u", path] if tool else ["umount", "-l", path] if lazy else ["umount", path]
    try:
        subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=15, check=False)
    except (OSError, subprocess.SubprocessError):
        pass


def unmount_recorded(vm_dir: Path, log: Optional[Log] = None) -> None:
    """Unmount every recorded input (any process of the node, or the machine's teardown): unmount,
    then the rclone stopped if it did not end with its mount, then a lazy unmount of a folder that
    is still busy. The record goes once nothing of it is left."""
    entries = _load(Path(vm_dir))
    for entry in reversed(entries):
        path, pid = str(entry.get("path") or ""), int(entry.get("pid") or 0)
        if path in mounted_paths():
            _unmount(path, lazy=False)
            for _ in range(int(STOP_WAIT_S * 20)):  # rclone ends with its mount
                _reap(pid)
                if not _alive_rclone(pid, path):
                    break
                time.sleep(0.05)
        _stop(pid, path)
        if path in mounted_paths():
            _unmount(path, lazy=True)
        if log is not None:
            log(f"inputs: {entry.get('dest')}: unmounted")
    if entries:
        try:
            os.unlink(str(Path(vm_dir) / RECORD))
        except OSError:
            pass
