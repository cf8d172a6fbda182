"""A real OpenSSH server on 127.0.0.1 for the ssh provider's tests (docs/SSH.md, "Tests").

`SshdServer` runs `/usr/sbin/sshd -D -e -f <config>` in the foreground on a free unprivileged port
with a throwaway host key; `SshLab` holds one client key, one known_hosts file and one ssh_config
(Host aliases for every server) passed to gpucloud through GPUCLOUD_SSH_CONFIG, exactly as a user's
~/.ssh/config would be. Each server gets its own remote root (GPUCLOUD_REMOTE_ROOT via SetEnv), so
two servers on one machine look like two hosts; a server may get a stub `nvidia-smi` first on PATH.

Running as root (CI and this sandbox): sshd needs its privilege separation folder (/run/sshd),
PermitRootLogin, and StrictModes off for keys kept under a temp folder; UsePAM off so no PAM
stack is needed. The remote user is whoever runs the tests.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.procs import stop_process

SSHD = "/usr/sbin/sshd"
VM_STUBS = Path(__file__).resolve().parent / "vm_stubs"

STUB_NVIDIA_SMI = r"""#!/bin/bash
# Stub nvidia-smi for the ssh tests: GPU name, count, memory and driver from the lines below.
NAME=%(name)s COUNT=%(count)d MEM=%(mem)d DRIVER=%(driver)s CUDA=%(cuda)s
if [[ $DRIVER == apt ]]; then  # no driver until the apt-get stub "installed" cuda-drivers-<branch>
  f=$(ls "$STUB_STATE"/pkgs/cuda-drivers-* 2>/dev/null | head -n 1)
  [[ -n $f ]] || { echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2; exit 9; }
  DRIVER=${f##*-}.82.01
fi
q=""; for a in "$@"; do case $a in --query-gpu=*) q=${a#--query-gpu=} ;; esac; done
if [[ -n $q ]]; then
  for ((i = 0; i < COUNT; i++)); do
    out=()
    IFS=, read -ra fields <<<"$q"
    for f in "${fields[@]}"; do
      case $f in
        index) out+=("$i") ;; name) out+=("$NAME") ;; memory.total) out+=("$MEM") ;;
        driver_version) out+=("$DRIVER") ;; uuid) out+=("GPU-stub-$i") ;; *) out+=("[N/A]") ;;
      esac
    done
    (IFS=,; echo "${out[*]}" | sed 's/,/, /g')
  done
  exit 0
fi
[[ $* == *-L* ]] && { for ((i = 0; i < COUNT; i++)); do echo "GPU $i: $NAME (UUID: GPU-stub-$i)"; done; exit 0; }
echo "| NVIDIA-SMI $DRIVER    Driver Version: $DRIVER    CUDA Version: $CUDA |"
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def have_sshd() -> bool:
    return os.access(SSHD, os.X_OK) and shutil.which("ssh") is not None


@dataclass
class SshdServer:
    """One sshd: `alias` is its Host name in the lab's ssh_config."""

    alias: str
    folder: Path
    port: int
    remote_root: Path
    proc: subprocess.Popen | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.folder / "sshd.log"

    def accepted(self) -> int:
        """Completed logins so far: one per SSH handshake (the multiplexing tests count them)."""
        try:
            return len(re.findall(r"Accepted publickey", self.log_path.read_text(errors="replace")))
        except OSError:
            return 0

    def stop(self) -> None:
        stop_process(self.proc)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def session_pids(self) -> list[int]:
        """sshd processes serving connections of this server (children of the listener)."""
        if self.proc is None:
            return []
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False)
        return [int(p) for p in out.stdout.split()]


def start_sshd(
    alias: str, folder: Path, *, authorized_keys: Path, env: dict[str, str], force_command: str | None = None
) -> SshdServer:
    """Start one sshd in `folder` (its host key, config and log there) on a free loopback port:
    logins by the keys in `authorized_keys` only, with `env` (sshd SetEnv, each pair quoted: no
    double quote in a value) and sshd's ForceCommand when given. Returns once it accepts connections."""
    host_key = folder / "ssh_host_ed25519_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
    server = SshdServer(alias=alias, folder=folder, port=free_port(), remote_root=folder / "remote")
    assert not any('"' in f"{k}{v}" for k, v in env.items()), env
    (folder / "sshd_config").write_text(
        f"Port {server.port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {folder / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {authorized_keys}\nPermitRootLogin prohibit-password\nStrictModes no\n"
        "UsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nLogLevel VERBOSE\n"
        "MaxSessions 100\nMaxStartups 100\n"
        "SetEnv "
        + " ".join(f'"{k}={v}"' for k, v in env.items())
        + "\n"
        + (f"ForceCommand {force_command}\n" if force_command else "")
    )
    log = server.log_path.open("ab")
    server.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(folder / "sshd_config")], stdout=log, stderr=log)
    for _ in range(100):
        if server.proc.poll() is not None:
            raise RuntimeError(f"sshd {alias} exited: {server.log_path.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.05)
    return server


def login_refused(port: int, folder: Path) -> bool:
    """Whether sshd on `port` refuses a login by a fresh key of `folder` (one it was never given)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = folder / "id_other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    opts = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    user = pwd.getpwuid(os.getuid()).pw_name
    res = subprocess.run(
        ["ssh", "-F", "/dev/null", *opts, "-o", "IdentitiesOnly=yes", "-i", str(key), "-p", str(port)]
        + [f"{user}@127.0.0.1", "true"],
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
    )
    return res.returncode == 255 and "Permission denied" in res.stderr


class SshLab:
    """Client key, known_hosts and ssh_config shared by a test's sshd servers."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        self.client_key = folder / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.client_key)], check=True)
        self.known_hosts = folder / "known_hosts"
        self.known_hosts.write_text("")
        self.config = folder / "ssh_config"
        self.servers: list[SshdServer] = []
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self._control_dirs: list[str] = []
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder

    def env(self) -> dict[str, str]:
        """What the CLI under test needs: the config file and a private control-socket folder."""
        return {"GPUCLOUD_SSH_CONFIG": str(self.config), "GPUCLOUD_SSH_CONTROL_DIR": self.control_dir()}

    def control_dir(self) -> str:
        """A fresh, short folder for ControlMaster sockets (socket paths are limited to 108 bytes)."""
        path = tempfile.mkdtemp(prefix="gcssh-", dir="/tmp")
        self._control_dirs.append(path)
        return path

    def add_server(
        self,
        alias: str,
        *,
        gpu: tuple[str, int, int, str, str] | None = None,
        trusted: bool = True,
        os_release: str | None = None,
        smi: str | None = None,
        force_command: str | None = None,
        env: dict[str, str] | None = None,
    ) -> SshdServer:
        """Start sshd `alias`; gpu = (name, count, memory MiB, driver, cuda) installs a stub nvidia-smi
        (`smi`: a script of the test's own instead; `force_command`: sshd's ForceCommand).
        Driver "apt": none until the driver package is installed through the stub apt-get/dpkg of
        tests/support/vm_stubs (their state in <folder>/state), from a fake NVIDIA repository.
        os_release: the text of the host's os-release file (GPUCLOUD_OS_RELEASE points the probe at it).
        env: more variables for every login (sshd SetEnv; no double quotes), e.g. a Slurm login node's SLURM_CONF."""
        folder = self.folder / alias
        folder.mkdir()
        bin_dir = folder / "bin"
        bin_dir.mkdir()
        if gpu:
            name, count, mem, driver, cuda = gpu
            stub = bin_dir / "nvidia-smi"
            stub.write_text(
                STUB_NVIDIA_SMI % {"name": repr(name), "count": count, "mem": mem, "driver": driver, "cuda": cuda}
            )
            stub.chmod(0o755)
        if smi is not None:  # a misbehaving nvidia-smi: this shell script instead of the stub
            (bin_dir / "nvidia-smi").write_text(smi)
            (bin_dir / "nvidia-smi").chmod(0o755)
        remote_root = folder / "remote"
        path = (
            f"{bin_dir}:{os.path.dirname(shutil.which('python3') or '/usr/bin/python3')}:/usr/local/bin:/usr/bin:/bin"
        )
        login_env = {"PATH": path, "GPUCLOUD_REMOTE_ROOT": str(remote_root)}
        if gpu and gpu[3] == "apt":
            repo = folder / "nvidia-repo"
            for dist in ("ubuntu2004", "ubuntu2204", "ubuntu2404", "debian12"):
                (repo / dist / "x86_64").mkdir(parents=True)
                (repo / dist / "x86_64" / "cuda-keyring_1.1-1_all.deb").write_bytes(b"stub keyring")
            for name in ("apt-get", "dpkg", "_common.sh"):  # not the whole folder: its python3 stub
                shutil.copy2(VM_STUBS / name, bin_dir / name)
            login_env.update(STUB_STATE=str(folder / "state"), GPUCLOUD_NVIDIA_REPO=repo.as_uri())
        if os_release is not None:
            (folder / "os-release").write_text(os_release)
            login_env["GPUCLOUD_OS_RELEASE"] = str(folder / "os-release")
        login_env.update(env or {})
        # A home of the host's own: bash runs ~/.bashrc for every ssh command, and this machine's
        # root account runs `pyenv init` there (a rehash under a lock that a killed login leaves
        # behind: 2 s per command, and its shims ahead of PATH). A host of the test is a clean account.
        home = folder / "home"
        home.mkdir()
        login_env["HOME"] = str(home)
        server = start_sshd(
            alias, folder, authorized_keys=Path(f"{self.client_key}.pub"), env=login_env, force_command=force_command
        )
        if trusted:
            pub = (folder / "ssh_host_ed25519_key.pub").read_text().split()
            with self.known_hosts.open("a") as fh:
                fh.write(f"[127.0.0.1]:{server.port} {pub[0]} {pub[1]}\n")
        self.servers.append(server)
        self._write_config()
        return server

    def _write_config(self) -> None:
        blocks = [
            f"Host {s.alias}\n  HostName 127.0.0.1\n  Port {s.port}\n  User {self.user}\n"
            f"  IdentityFile {self.client_key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {self.known_hosts}\n"
            "  GlobalKnownHostsFile /dev/null\n"
            for s in self.servers
        ]
        self.config.write_text("\n".join(blocks))

    def close(self) -> None:
        for ctl in self._control_dirs:
            for sock in Path(ctl).glob("*"):
                subprocess.run(
                    ["ssh", "-F", str(self.config), "-o", f"ControlPath={sock}", "-O", "exit", "x"],
                    capture_output=True,
                    timeout=10,
                    check=False,
                )
            shutil.rmtree(ctl, ignore_errors=True)
        for server in self.servers:
            server.stop()


# The placeholder hosts the examples name (examples/k80-ssh.yaml), served by stub machines so the
# example tests validate, plan and render them like the cloud examples.
EXAMPLE_HOSTS: dict[str, tuple[str, int, int, str, str]] = {"k80-box": ("Tesla K80", 1, 11441, "470.256.02", "11.4")}


def example_hosts_lab(folder: Path) -> SshLab:
    """An SshLab with one stub server per placeholder host of the examples (EXAMPLE_HOSTS)."""
    lab = SshLab(folder)
    for alias, gpu in EXAMPLE_HOSTS.items():
        lab.add_server(alias, gpu=gpu)
    return lab
