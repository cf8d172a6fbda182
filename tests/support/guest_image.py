"""A small Debian cloud guest for the tests that boot a real Linux (tests/guest/): built once with
debootstrap, kept under the user's cache folder and rebuilt only when this recipe changes.

The disk is a plain ext4 image made with `mkfs.ext4 -d` from the debootstrap folder (no loop
mount, no partition table, no bootloader): qemu boots the kernel and initrd taken out of it
directly. What the guest is given is what a Debian cloud image has that gpucloud's node side
touches: systemd, cloud-init (its datasource pinned to EC2 so it probes nothing else), python3,
curl, openssl, apt; units that only cost boot time under software emulation are masked.

Building needs root (debootstrap's chroot) and Debian's mirror; `GPUCLOUD_GUEST_MIRROR` names
another mirror. The build is serialised by a lock file, so parallel test workers build it once.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SUITE = "bookworm"
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "udev",
    "cloud-init",
    "python3",
    "curl",
    "openssl",
    "ca-certificates",
    "linux-image-cloud-amd64",
    "iproute2",
    "apt",
    "isc-dhcp-client",
    "openssh-server",  # `gpucloud ssh` reaches the node's sshd, as on a cloud image
    "python3-cffi-backend",  # provides what python3-cryptography needs (debootstrap resolves no virtuals)
)
# Units a cloud image runs that only cost boot time here (timers, getty, firstboot helpers).
MASKED = (
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
    "man-db.timer",
    "dpkg-db-backup.timer",
    "systemd-tmpfiles-clean.timer",
    "serial-getty@ttyS0.service",
    "getty@tty1.service",
    "systemd-timesyncd.service",
    "networking.service",
    "ifupdown-pre.service",
    "cron.service",
    "systemd-pstore.service",
    "modprobe@drm.service",
)
CLOUD_CFG = """\
# gpucloud test guest: the EC2 datasource only, at the simulator's metadata address
datasource_list: [ Ec2 ]
datasource:
  Ec2:
    strict_id: false
    metadata_urls: [ "http://169.254.169.254" ]
    max_wait: 60
    timeout: 5
network: {config: disabled}
apt_preserve_sources_list: true
manage_etc_hosts: false
# the login user of the images gpucloud's AWS session names (Ubuntu's): cloud-init creates it and
# installs the instance's public key (IMDS public-keys, from the run's key pair) for it
system_info:
  default_user: {name: ubuntu, lock_passwd: true, gecos: Ubuntu, groups: [adm], shell: /bin/bash}
# no locales package in the minbase root: cloud-init's locale module would fail cloud-config.service
locale: false
# new host keys per instance as on a cloud image, one type only: each is seconds of CPU under TCG
ssh_deletekeys: true
ssh_genkeytypes: [ed25519]
"""
# NVIDIA's repositories as the guest reaches their stand-in (tests/support/guest_apt.py), for every unit
NVIDIA_REPO_URL = "http://169.254.169.4"
MANAGER_ENV = f"[Manager]\nDefaultEnvironment=GPUCLOUD_NVIDIA_REPO={NVIDIA_REPO_URL}\n"
NETWORK = "[Match]\nName=e*\n[Network]\nDHCP=ipv4\n[DHCPv4]\nUseDomains=false\n"
FSTAB = "/dev/vda / ext4 rw,noatime 0 1\n"
IMAGE_SIZE = "2G"
# the user's cache folder (XDG), as other tools keep rebuildable downloads
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpucloud-tests" / "guest"


@dataclass(frozen=True)
class GuestImage:
    """A built guest: the disk (ext4, the whole device is the root filesystem), kernel and initrd."""

    disk: Path
    kernel: Path
    initrd: Path
    kernel_release: str
    build_s: dict[str, float]  # seconds per build stage (empty when it came from the cache)


def recipe_hash() -> str:
    """What the image is built from: this file (packages, units, configuration) and the suite."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def mirror() -> str:
    return os.environ.get("GPUCLOUD_GUEST_MIRROR", "http://deb.debian.org/debian")


def missing_tools() -> list[str]:
    """The host tools a build and a boot need that are not installed (the tests skip naming them)."""
    tools = ("debootstrap", "mkfs.ext4", "qemu-system-x86_64", "dpkg-deb", "apt-ftparchive")
    return [t for t in tools if shutil.which(t) is None and not Path("/usr/sbin", t).exists()]


def base_hash() -> str:
    """What the debootstrap folder is made of (the suite and the packages)."""
    return hashlib.sha256(repr((SUITE, PACKAGES)).encode()).hexdigest()[:16]


def guest_image() -> GuestImage:
    """The cached image for this recipe, built now if there is none (under a lock). The
    debootstrap folder is cached on its own, so a change of configuration alone rebuilds in seconds."""
    CACHE.mkdir(parents=True, exist_ok=True)
    base, folder = CACHE / f"base-{base_hash()}", CACHE / f"image-{recipe_hash()}"
    stages: dict[str, float] = {}
    with open(CACHE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (base / "done").exists():
            stages["debootstrap"] = _debootstrap(base)
        if not (folder / "done").exists():
            stages["configure+mkfs"] = _build(base / "root", folder)
        for old in CACHE.iterdir():
            if old.is_dir() and old not in (base, folder):
                shutil.rmtree(old, ignore_errors=True)
    release = (folder / "release").read_text().strip()
    return GuestImage(folder / "disk.raw", folder / "vmlinuz", folder / "initrd.img", release, stages)


def _debootstrap(base: Path) -> float:
    """The Debian system itself; seconds it took."""
    t = time.monotonic()
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    got = subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(base / "root"), mirror()],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if got.returncode != 0:
        raise RuntimeError(f"debootstrap failed ({got.returncode}):\n{got.stdout[-3000:]}")
    (base / "done").write_text("ok\n")
    return time.monotonic() - t


def _build(base_root: Path, folder: Path) -> float:
    """The configured disk, kernel and initrd from a copy of the debootstrap folder; seconds it took."""
    t = time.monotonic()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    root = folder / "root"
    subprocess.run(["cp", "-a", str(base_root), str(root)], check=True)
    _configure(root)
    kernel = _newest(root / "boot", "vmlinuz-")
    (folder / "release").write_text(kernel.name.removeprefix("vmlinuz-") + "\n")
    shutil.copyfile(kernel, folder / "vmlinuz")
    shutil.copyfile(_newest(root / "boot", "initrd.img-"), folder / "initrd.img")
    disk = folder / "disk.raw"
    disk.unlink(missing_ok=True)
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-L", "gpuroot", "-d", str(root), str(disk), IMAGE_SIZE],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    shutil.rmtree(root)
    (folder / "done").write_text("ok\n")
    return time.monotonic() - t


def _newest(folder: Path, prefix: str) -> Path:
    found = sorted(p for p in folder.iterdir() if p.name.startswith(prefix))
    if not found:
        raise RuntimeError(f"no {prefix}* in {folder}: the kernel package did not install")
    return found[-1]


def _configure(root: Path) -> None:
    """The guest's own files: fstab, network, cloud-init's datasource, masked units, no docs."""
    (root / "etc/fstab").write_text(FSTAB)
    (root / "etc/hostname").write_text("guest\n")
    (root / "etc/machine-id").write_text("6c1f2f0c8e2a4d3b9c1d2e3f4a5b6c7d\n")  # no first-boot presets
    (root / "etc/cloud/cloud.cfg.d/90-gpucloud-test.cfg").write_text(CLOUD_CFG)
    (root / "etc/systemd/network/10-dhcp.network").write_text(NETWORK)
    (root / "etc/apt/sources.list").write_text("")
    (root / "etc/systemd/system.conf.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/systemd/system.conf.d/gpucloud-test.conf").write_text(MANAGER_ENV)
    system = root / "etc/systemd/system"
    wants = system / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / "systemd-networkd.service"
    if not link.exists():
        link.symlink_to("/lib/systemd/system/systemd-networkd.service")
    online = system / "network-online.target.wants"
    online.mkdir(parents=True, exist_ok=True)
    wait = online / "systemd-networkd-wait-online.service"
    if not wait.exists():
        wait.symlink_to("/lib/systemd/system/systemd-networkd-wait-online.service")
    for unit in MASKED:
        target = system / unit
        if target.is_symlink() or target.exists():
            target.unlink()
        target.symlink_to("/dev/null")
    for junk in ("usr/share/doc", "usr/share/man", "usr/share/locale", "var/cache/apt", "var/lib/apt/lists"):
        shutil.rmtree(root / junk, ignore_errors=True)
    (root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)


if __name__ == "__main__":  # .ci/run builds it in the background before the tests start
    import json

    started = time.monotonic()
    built = guest_image()
    print(json.dumps({"stages_s": built.build_s, "total_s": round(time.monotonic() - started, 1)}))
