"""How gpucloud reaches a Slurm cluster: its login node over the system's OpenSSH client (the ssh
provider's transport: one multiplexed connection, host keys never accepted silently, every call
bounded), or this machine when it is a submit host (`cluster: local`). Every Slurm command and
every channel read is one POSIX shell script run there.

The cluster's shared filesystem holds the run: `<root>/work/<run_id>/` (sbatch script, node
wrapper, each rank's shim, each node's folder) and `<root>/channel/runs/<run_id>/` (the
channel), where `<root>` is `$GPUCLOUD_REMOTE_ROOT` or `~/.gpucloud` on the login node. The nodes
must see that folder at the same path (a shared home, as on most clusters).
"""

from __future__ import annotations

import shlex
import subprocess
from typing import BinaryIO

from gpucloud.providers.ssh import transport as ssh_transport
from gpucloud.providers.ssh.channel import PRIVATE  # the job too: sbatch passes the umask on (SLURM_UMASK)
from gpucloud.providers.ssh.probe import REMOTE_ROOT
from gpucloud.ui.untrusted import shown

LOCAL = "local"


class Login:
    """One cluster's login node (`cluster:` as the job wrote it)."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self.local = cluster == LOCAL
        self._root: str | None = None

    def run(
        self,
        script: str,
        *,
        input: bytes | None = None,
        timeout: float = 120.0,
        check: bool = True,
        max_output: int = ssh_transport.DEFAULT_MAX_OUTPUT,
        retries: int = 2,
        sink: BinaryIO | None = None,
    ) -> ssh_transport.Result:
        """Run a shell script there with `R` set to the remote root. The same errors as the ssh
        transport: SshError (exit 75) when the command fails with `check`, or the host is not reached.
        With `sink` (a file opened for writing), stdout goes there (an artifacts tarball, never held
        in memory), as with the ssh transport."""
        body = f"{PRIVATE}R={REMOTE_ROOT}; {script}"
        if not self.local:
            return ssh_transport.run(
                ssh_transport.SshHost.parse(self.cluster),
                body,
                input=input,
                timeout=timeout,
                check=check,
                max_output=max_output,
                retries=retries,
                sink=sink,
            )
        try:
            from gpucloud.child_env import user_env

            proc = subprocess.run(
                ["bash", "-c", body],
                env=user_env(),  # sbatch exports it to the job: the user's own, not the CLI's additions
                input=input or b"",
                stdout=sink if sink is not None else subprocess.PIPE,
                stderr=subprocess.PIPE,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ssh_transport.SshError(
                f"this machine: `{script.strip()[:60]}` did not end within {timeout:.0f}s"
            ) from None
        err = ssh_transport.clean_text(proc.stderr.decode("utf-8", "replace").strip())
        if check and proc.returncode != 0:
            raise ssh_transport.SshError(
                f"this machine: `{script.strip()[:60]}` exited {proc.returncode}: {err[-500:]}"
            )
        return ssh_transport.Result(proc.returncode, (proc.stdout or b"")[: max_output + 1], err)

    def root(self) -> str:
        """The remote root as an absolute path (one call the first time)."""
        if self._root is None:
            out = self.run('mkdir -p "$R" && cd "$R" && pwd').stdout.decode("utf-8", "replace").strip().splitlines()
            if not out or not out[-1].startswith("/") or "\ufffd" in out[-1]:
                raise ssh_transport.SshError(
                    f"{self.cluster}: the remote root is not a readable absolute path: {shown(out[-1] if out else '')}",
                    hint="Set GPUCLOUD_REMOTE_ROOT there to a plain (UTF-8) absolute path.",
                )
            self._root = out[-1]
        return self._root

    def shell(self, command: str) -> str:
        """How a user runs `command` there, for hints."""
        if self.local:
            return command
        return ssh_transport.SshHost.parse(self.cluster).shell(command)


def script(body: str, **values: object) -> str:
    """Prefix a script with its variables, each quoted once for the remote shell."""
    return "".join(f"{k}={shlex.quote(str(v))}; " for k, v in values.items()) + "\n" + body
