"""What crosses between `gpucloud ssh` and a provider: the way into one running node.

A provider answers `Provider.session_path(handle, rank, ask)` with a `SessionPlan`: the argv the CLI
runs in the caller's terminal (a shell, or one command) and, where the path is real ssh, the
`ssh_config` options that reach the same node, so `gpucloud-RUN` works in VS Code and rsync too.
Nothing here opens a port to the world: a provider whose only path would is expected to say so
with `SessionUnsupported` instead (docs/SSH.md, "gpucloud ssh").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpucloud.errors import SessionUnsupported

MAX_FORWARDS = 16  # ports one session forwards (the job's `ports` and -L together)


@dataclass(frozen=True)
class Forward:
    """One forwarded port: `local` on the caller's loopback reaches `remote` on the node's loopback."""

    local: int
    remote: int


@dataclass(frozen=True)
class SessionAsk:
    """What the caller wants: `command` (empty: an interactive shell), a terminal or not, forwards,
    and `forward_only` (hold the forwards, run nothing: `ssh -N`)."""

    command: tuple[str, ...] = ()
    tty: bool = False
    forwards: tuple[Forward, ...] = ()
    forward_only: bool = False


@dataclass
class SessionPlan:
    """How to reach the node. `argv` is run as is (cwd and env when set: a node on this machine).
    `ssh_options`: the ssh_config lines of a `Host gpucloud-RUN` entry that reach the same node
    (empty: no ssh entry can be written, e.g. a node that is a process on this machine).
    `ports_local`: the node's loopback is this machine's, so its ports need no forward (the URL is
    the node's own port). `cleanup`: paths the CLI may remove when the session is over (none so far)."""

    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] | None = None
    ssh_options: list[tuple[str, str]] = field(default_factory=list)
    ports_local: bool = False
    node_folder: str = ""  # where the shell starts on the node (shown, and the ssh entry's RemoteCommand)


# The session's shell says it is open: its pid (kept by `exec`) in W/sessions/, which a kept machine's
# idle clock reads (vm/agent/keep.py), so a machine someone is working on is not ended as idle.
# Where W is not the session user's to write, the session still opens, unregistered.
SESSION_MARK = (
    'if [ -n "${GPUCLOUD_VM_DIR:-}" ]; then mkdir -p "$GPUCLOUD_VM_DIR/sessions" 2>/dev/null'
    ' && echo $$ >"$GPUCLOUD_VM_DIR/sessions/ssh-$$" 2>/dev/null; fi; '
)


def session_tail(ask: SessionAsk) -> str:
    """What the node's shell ends with: the session's mark, then the command (as ssh runs one: its
    words joined by spaces), a login shell, or a wait that only holds the forwards."""
    import shlex

    if ask.command:
        return SESSION_MARK + "exec bash -c " + shlex.quote(" ".join(ask.command))
    if ask.forward_only:
        # Held while the session's sshd lives: a command without a terminal gets no signal when the
        # client goes (ssh -N ended, the laptop asleep), and its mark would hold a kept machine.
        return SESSION_MARK + 'while [ -e "/proc/$PPID" ]; do sleep 2; done'
    return SESSION_MARK + 'exec "${SHELL:-bash}" -l'


def unsupported(cloud: str, why: str) -> SessionUnsupported:
    """The one error a provider without a session path raises, naming the provider and the reason."""
    return SessionUnsupported(
        f"gpucloud ssh: the {cloud} provider has no way into a node that opens nothing to the world: {why}.",
        hint="`gpucloud logs RUN --follow` shows the job's output; docs/SSH.md lists what each provider offers.",
    )


@dataclass(frozen=True)
class CloudNode:
    """A cloud node a session reaches with real ssh: its public address, login user and the run's
    private key (0600 under GPUCLOUD_HOME, made at launch, removed at teardown)."""

    run_id: str
    rank: int
    address: str
    user: str
    key: Path
    folder: str  # the node's work folder (the agent's), where the shell starts when it may


SESSION_FOLDER = "ssh-config"  # under GPUCLOUD_HOME, beside the `--write-config` entries


def cloud_entry(node: CloudNode, known_hosts: Path) -> list[tuple[str, str]]:
    """The node's ssh_config options. Its host key is new with the machine: the first connection
    records it in the run's own known_hosts file (accept-new), which the run's teardown removes."""
    return [
        ("HostName", node.address),
        ("User", node.user),
        ("IdentityFile", str(node.key)),
        ("IdentitiesOnly", "yes"),
        ("UserKnownHostsFile", str(known_hosts)),
        ("StrictHostKeyChecking", "accept-new"),
    ]


def cloud_session(node: CloudNode, ask: SessionAsk) -> SessionPlan:
    """ssh with a config of the session's own: the user's ssh_config first (GPUCLOUD_SSH_CONFIG or
    ~/.ssh/config: a bastion, a port of theirs wins, as in any ssh config), then the node's entry.
    The file is named so that the `*.conf` Include of `--write-config` never reads it."""
    import os
    import shlex

    from gpucloud.state.home import home_dir

    folder = home_dir() / SESSION_FOLDER
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    alias = f"gpucloud-{node.run_id}-{node.rank}"
    options = cloud_entry(node, folder / f"{node.run_id}.known_hosts")
    user_config = os.environ.get("GPUCLOUD_SSH_CONFIG", "").strip() or str(Path.home() / ".ssh" / "config")
    lines = [f"Include {user_config}"] if Path(user_config).expanduser().is_file() else []
    lines += [f"Host {alias}", *(f"  {k} {v}" for k, v in options)]
    path = folder / f"{node.run_id}.session"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    work = shlex.quote(node.folder)
    remote = f"export GPUCLOUD_VM_DIR={work}; cd {work}/job 2>/dev/null || cd; {session_tail(ask)}"
    forwards: list[str] = []
    for fwd in ask.forwards:
        forwards += ["-L", f"127.0.0.1:{fwd.local}:127.0.0.1:{fwd.remote}"]
    if forwards:
        forwards += ["-o", "ExitOnForwardFailure=yes"]
    own = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=15"]
    argv = ["ssh", "-F", str(path), *own, "-t" if ask.tty else "-T", *forwards, alias, remote]
    return SessionPlan(argv=argv, ssh_options=options, node_folder=node.folder)
