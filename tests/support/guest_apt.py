"""A local stand-in for NVIDIA's CUDA apt repositories, for a real apt on the guest
(tests/support/guest_vm.py): real .deb packages (dpkg-deb) in flat repositories indexed by
apt-ftparchive, one per `<distro>/<arch>` as NVIDIA lays them out, with the names, versions and
Depends of tests/data/nvidia_repo_packages.txt; its pinning packages install the apt preferences
they pin with. What the packages do is a stand-in: the DKMS kernel module packages fail, as DKMS
does, without the running kernel's headers, and then write a module file instead of building
one; `nvidia-driver` installs an `nvidia-smi` that shows the GPU the guest's kernel command line
names (`gpucloud.gpu=Tesla_K80`, `gpucloud.gpus=1`) once that module file exists, at the driver's
version. `cuda-keyring` adds the repository to apt's sources (unsigned: `[trusted=yes]`).

The guest reaches the repositories at REPO_URL (its units have it as GPUCLOUD_NVIDIA_REPO,
tests/support/guest_image.py).
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.support.guest_image import NVIDIA_REPO_URL

INDEX = Path(__file__).resolve().parent.parent / "data" / "nvidia_repo_packages.txt"
REPOS = ("ubuntu2004", "ubuntu2204")
REPO_URL = NVIDIA_REPO_URL
# Packages of the stacks' toolkits that the index leaves out (versions as NVIDIA's repositories name them)
EXTRA = (
    {"Package": "cuda-toolkit-11-4", "Version": "11.4.4-1"},
    {"Package": "libcudnn8", "Version": "8.2.4.15-1+cuda11.4"},
    {"Package": "libcudnn9-cuda-11", "Version": "9.10.2.21-1"},
    {"Package": "libcudnn9-cuda-12", "Version": "9.10.2.21-1"},
    {"Package": "cudnn9-cuda-12", "Version": "9.10.2.21-1", "Depends": "libcudnn9-cuda-12 (= 9.10.2.21-1)"},
)
# Conflicts and Provides the index leaves out, as NVIDIA's packaging has them: one kernel module
# flavour at a time, one driver providing `nvidia-driver-binary` (Ubuntu's nvidia-driver-NNN Provides
# and Conflicts it [V: `apt show nvidia-364`, Ubuntu's nvidia-graphics-drivers]); cuDNN 9's builds for
# CUDA 11 and 12 ship the same libcudnn.so.9 and exclude each other [I]; cuDNN 8 sits beside them [I].
RELATIONS: dict[str, dict[str, str]] = {
    "nvidia-driver": {"Provides": "nvidia-driver-binary", "Conflicts": "nvidia-driver-binary"},
    "nvidia-kernel-dkms": {"Provides": "nvidia-kernel-dkms-any", "Conflicts": "nvidia-kernel-open-dkms"},
    "nvidia-kernel-open-dkms": {"Provides": "nvidia-kernel-dkms-any", "Conflicts": "nvidia-kernel-dkms"},
    "libcudnn9-cuda-12": {"Provides": "libcudnn9", "Conflicts": "libcudnn9-cuda-11"},
    "libcudnn9-cuda-11": {"Provides": "libcudnn9", "Conflicts": "libcudnn9-cuda-12"},
}
SMI = """#!/bin/sh
# stand-in nvidia-smi (tests/support/guest_apt.py): the GPU the kernel command line names
[ -e /lib/modules/$(uname -r)/updates/dkms/nvidia.ko ] || {
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2; exit 9; }
name=$(tr ' ' '\\n' </proc/cmdline | sed -n 's/^gpucloud.gpu=//p' | tr _ ' ')
n=$(tr ' ' '\\n' </proc/cmdline | sed -n 's/^gpucloud.gpus=//p')
fields=$(printf '%s\\n' "$@" | sed -n 's/^--query-gpu=//p' | tr , ' ')
i=0
while [ "$i" -lt "${n:-1}" ]; do
  if [ -z "$fields" ]; then echo "GPU $i: $name"; i=$((i + 1)); continue; fi
  line=
  for f in $fields; do
    case $f in
      name) v=$name ;;
      driver_version) v=@VERSION@ ;;
      memory.total) v=16384 ;;
      *) v=0 ;;
    esac
    line=${line:+$line, }$v
  done
  echo "$line"
  i=$((i + 1))
done
"""
DKMS = """#!/bin/sh
set -e
[ "$1" = configure ] || exit 0
for k in /lib/modules/*; do
  r=${k##*/}
  [ -d "/usr/src/linux-headers-$r" ] || {
    echo "Error! Your kernel headers for kernel $r cannot be found." >&2; exit 1; }
  mkdir -p "$k/updates/dkms" && echo "stand-in module @VERSION@" >"$k/updates/dkms/nvidia.ko"
done
"""


def index_stanzas() -> list[dict[str, str]]:
    """The index's package stanzas (field -> value), Ubuntu's kernel headers left out."""
    out: list[dict[str, str]] = []
    for block in INDEX.read_text().split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(("#", " "))
        )
        if "Package" in fields and not fields["Package"].startswith("linux-headers-"):
            out.append(fields)
    return out


def _files(fields: dict[str, str]) -> dict[str, tuple[str, int]]:
    """What one stand-in package installs (path -> (text, mode)) and its maintainer scripts."""
    name, version = fields["Package"], fields["Version"]
    upstream = version.split("-", 1)[0]
    files: dict[str, tuple[str, int]] = {}
    if name.startswith("nvidia-driver-pinning-"):
        pkgs, _, pin = fields.get("X-Pins", "").partition(" = ")
        pref = f"Package: {pkgs}\nPin: version {pin}\nPin-Priority: 1000\n"
        files[f"etc/apt/preferences.d/{name}"] = (pref, 0o644)
    if name == "nvidia-driver":
        files["usr/bin/nvidia-smi"] = (SMI.replace("@VERSION@", upstream), 0o755)
    if fields.get("X-Dkms") == "yes":
        files["DEBIAN/postinst"] = (DKMS.replace("@VERSION@", upstream), 0o755)
    if name.startswith("cuda-toolkit-"):
        cuda = name.removeprefix("cuda-toolkit-").replace("-", ".")
        files[f"usr/local/cuda-{cuda}/version.txt"] = (f"CUDA Version {cuda}\n", 0o644)
    if name.startswith("linux-headers-"):
        files[f"usr/src/{name}/Makefile"] = ("# stand-in\n", 0o644)
    files.setdefault(f"usr/share/gpucloud-standin/{name}", (version + "\n", 0o644))
    return files


def build_deb(fields: dict[str, str], dest: Path) -> Path:
    """One .deb with the stanza's control fields (Depends, Conflicts, Provides as given)."""
    name, version = fields["Package"], fields["Version"]
    arch = fields.get("Architecture", "amd64")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        control = [f"Package: {name}", f"Version: {version}", f"Architecture: {arch}"]
        control += [f"{k}: {fields[k]}" for k in ("Depends", "Conflicts", "Provides", "Breaks") if k in fields]
        control += ["Maintainer: gpucloud tests <tests@invalid>", f"Description: stand-in for {name}"]
        (root / "DEBIAN").mkdir()
        (root / "DEBIAN/control").write_text("\n".join(control) + "\n")
        for rel, (text, mode) in _files(fields).items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(mode)
        out = dest / f"{name}_{version.replace(':', '%3a')}_{arch}.deb"
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(root), str(out)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return out


def build_repos(folder: Path, kernel_release: str, url: str = REPO_URL) -> Path:
    """Every distro's flat repository under `folder`, its keyring's source at `url`; returns `folder`."""
    packages = [*index_stanzas(), *EXTRA, {"Package": f"linux-headers-{kernel_release}", "Version": "1"}]
    for distro in REPOS:
        repo = folder / distro / "x86_64"
        repo.mkdir(parents=True, exist_ok=True)
        for fields in packages:
            build_deb({**RELATIONS.get(fields["Package"], {}), **fields}, repo)
        _keyring(repo, distro, f"deb [trusted=yes] {url}/{distro}/x86_64/ /\n")
        with open(repo / "Packages", "w") as out:
            subprocess.run(["apt-ftparchive", "packages", "."], cwd=repo, check=True, stdout=out)
        with open(repo / "Release", "w") as out:
            subprocess.run(["apt-ftparchive", "release", "."], cwd=repo, check=True, stdout=out)
    return folder


def _keyring(repo: Path, distro: str, sources: str) -> None:
    """cuda-keyring: the repository's apt source (outside the index, as NVIDIA serves it)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "DEBIAN").mkdir()
        (root / "DEBIAN/control").write_text(
            "Package: cuda-keyring\nVersion: 1.1-1\nArchitecture: all\n"
            "Maintainer: gpucloud tests <tests@invalid>\nDescription: stand-in for cuda-keyring\n"
        )
        lst = root / "etc/apt/sources.list.d" / f"cuda-{distro}-x86_64.list"
        lst.parent.mkdir(parents=True)
        lst.write_text(sources)
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "--build", str(root), str(repo.parent / "cuda-keyring_1.1-1_all.deb")],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    (repo.parent / "cuda-keyring_1.1-1_all.deb").rename(repo / "cuda-keyring_1.1-1_all.deb")


class RepoServer:
    """The repositories over HTTP on a free port; `requests` lists the paths asked, in order."""

    def __init__(self, folder: Path) -> None:
        self.requests: list[str] = []
        seen = self.requests

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, fmt: str, *args: object) -> None:
                seen.append(self.path)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(folder)))
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]

    def start(self) -> RepoServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def preinstall_driver(disk: Path, kernel_release: str, version: str) -> None:
    """Put the stand-in driver (nvidia-smi and its module file) on a guest's disk, as an image with
    the driver baked in has it: the stack stage then finds it and installs nothing. debugfs writes
    into the ext4 image without mounting it."""
    with tempfile.TemporaryDirectory() as tmp:
        smi, kmod = Path(tmp, "nvidia-smi"), Path(tmp, "nvidia.ko")
        smi.write_text(SMI.replace("@VERSION@", version))
        kmod.write_text(f"stand-in module {version}\n")
        mods = f"/lib/modules/{kernel_release}/updates"
        script = Path(tmp, "cmds")
        script.write_text(
            f"mkdir {mods}\nmkdir {mods}/dkms\ncd {mods}/dkms\nwrite {kmod} nvidia.ko\n"
            f"cd /usr/bin\nwrite {smi} nvidia-smi\nsif /usr/bin/nvidia-smi mode 0100755\n"
        )
        subprocess.run(["debugfs", "-w", "-f", str(script), str(disk)], check=True, capture_output=True)
