"""Whose run the work folder holds. A disk outlives its machine (an image made from a used disk, a
volume moved to a new instance), and with it the run folder and the enabled resume unit: without
this, a new machine would resume (or end itself for) a run that belongs to another machine.

The node tells "my run, rebooted" from "a new machine on an old disk" by the marks each machine
has apart from its disk: the SMBIOS UUID (EC2's instance, Azure's VM id), the board asset tag (the
instance id on EC2 Nitro), cloud-init's instance id and the user-data cloud-init holds. They are
recorded in `st/owner` when the run starts; a mark that differs later means another machine. A mark
either side could not read is not compared (nothing comparable: the run resumes, as before).

Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

OWNER = "owner"  # in st/
EARLIER = "earlier"  # W/earlier/<run>.<time>/: what a run of another machine left in W
KEEP = ("agent", EARLIER)  # the agent code is being written by this boot's shim: never moved
UNIT = "gpucloud-resume.service"
# What each machine has apart from its disk (relative to GPUCLOUD_MACHINE_ROOT, "/" on a machine)
MARK_FILES = (
    ("product_uuid", "sys/class/dmi/id/product_uuid"),
    ("board_asset_tag", "sys/class/dmi/id/board_asset_tag"),
    ("instance_id", "var/lib/cloud/data/instance-id"),
)
USER_DATA = "var/lib/cloud/instance/user-data.txt"


def marks(environ: Dict[str, str]) -> Dict[str, str]:
    """This machine's marks (name -> value); those it cannot read are left out."""
    root = Path(environ.get("GPUCLOUD_MACHINE_ROOT") or "/")
    out: Dict[str, str] = {}
    for name, rel in MARK_FILES:
        try:
            value = (root / rel).read_text(errors="replace").strip().lower()
        except OSError:
            continue
        if value and value.strip("0-") and value != "none":
            out[name] = value
    try:
        out["user_data"] = hashlib.sha256((root / USER_DATA).read_bytes()).hexdigest()
    except OSError:
        pass
    return out


def differs(recorded: Dict[str, str], now: Dict[str, str]) -> str:
    """The first mark both sides have that differs ('' when none does)."""
    return next((k for k in sorted(set(recorded) & set(now)) if recorded[k] != now[k]), "")


def read(vm_dir: Path) -> Optional[Dict[str, object]]:
    try:
        got = json.loads((vm_dir / "st" / OWNER).read_text())
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) else None


def record(vm_dir: Path, run_id: str, environ: Dict[str, str]) -> None:
    path = vm_dir / "st" / OWNER
    tmp = path.with_name(f".{OWNER}.{os.getpid()}")
    tmp.write_text(json.dumps({"run_id": run_id, "marks": marks(environ)}, sort_keys=True) + "\n")
    os.replace(tmp, path)


class _Locked:
    """flock on W itself: the resume unit's check and this boot's new run decide one at a time."""

    def __init__(self, vm_dir: Path) -> None:
        self.fd = os.open(str(vm_dir), os.O_RDONLY)

    def __enter__(self) -> "_Locked":
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def _set_aside(vm_dir: Path, run_id: str, environ: Dict[str, str]) -> Path:
    """Move what the earlier run left in W (but the agent code and the running shim) to
    W/earlier/<run>.<time>/: kept (its outputs may be someone's), out of this machine's way."""
    dest = vm_dir / EARLIER / f"{run_id or 'unknown'}.{int(time.time())}"
    dest.mkdir(parents=True, mode=0o700)
    shim = Path(environ.get("GPUCLOUD_SHIM") or "/")
    keep = KEEP + ((shim.name,) if shim.parent == vm_dir else ())
    for entry in sorted(os.listdir(str(vm_dir))):
        if entry not in keep:
            os.rename(str(vm_dir / entry), str(dest / entry))
    return dest


def _disable_unit(environ: Dict[str, str]) -> None:
    """The earlier run's resume unit, which no run of this machine wrote, goes."""
    etc = Path(environ.get("GPUCLOUD_ETC") or "/etc") / "systemd" / "system"
    for path in (etc / "multi-user.target.wants" / UNIT, etc / UNIT):
        try:
            path.unlink()
        except OSError:
            pass
    try:
        subprocess.run(["systemctl", "daemon-reload"], capture_output=True, check=False, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pass


def take_over(vm_dir: Path, run_id: str, environ: Dict[str, str]) -> Tuple[bool, List[str]]:
    """A new run starting in W (cloud-init ran this machine's user-data). Returns (rebooted, lines
    for the log): rebooted when W already holds this very run of this machine (cloud-init ran the
    same user-data again), which then resumes rather than start its job twice. Any other run's
    state is set aside first; then this run is recorded as W's owner."""
    lines: List[str] = []
    vm_dir.mkdir(parents=True, exist_ok=True)
    with _Locked(vm_dir):
        old = read(vm_dir)
        if old is not None and old.get("run_id") == run_id and not differs(_marks_of(old), marks(environ)):
            return True, ["this machine's run is in the work folder already: it resumes"]
        if old is not None or (vm_dir / "st").exists():  # every run makes st/ first
            old_id = str((old or {}).get("run_id") or "")
            dest = _set_aside(vm_dir, old_id, environ)
            lines.append(f"the work folder held another run ({old_id or 'unrecorded'}): set aside in {dest}")
        (vm_dir / "st").mkdir(exist_ok=True)
        record(vm_dir, run_id, environ)
    return False, lines


def resume_here(vm_dir: Path, run_id: str, environ: Dict[str, str], log: Callable[[str], None]) -> bool:
    """The resume unit's check, before the shim re-arms anything: this machine's own run after a
    reboot (True), or a run of another machine on this disk (False: its state set aside, its unit
    disabled; a run this machine started since owns W and is left alone)."""
    try:
        with _Locked(vm_dir):
            old = read(vm_dir)
            if old is None:
                return (vm_dir / "st" / "deadline").is_file()  # a run without a record: as before
            if old.get("run_id") != run_id:
                log(f"not resuming run {run_id}: the work folder holds run {old.get('run_id')} now")
                return False
            mark = differs(_marks_of(old), marks(environ))
            if not mark:
                return True
            dest = _set_aside(vm_dir, run_id, environ)
            _disable_unit(environ)
            log(f"not resuming run {run_id}: it ran on another machine ({mark} differs); set aside in {dest}")
            return False
    except OSError as exc:
        log(f"cannot tell whose run the work folder holds ({exc}): resuming it")
        return True


def _marks_of(owner: Dict[str, object]) -> Dict[str, str]:
    got = owner.get("marks")
    return {str(k): str(v) for k, v in got.items()} if isinstance(got, dict) else {}
