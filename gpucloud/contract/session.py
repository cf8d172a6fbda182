"""What crosses between `gpucloud ssh` and a provider: the way into one running node.

A provider answers `Provider.session(handle, rank, ask)` with a `SessionPlan`: the argv the CLI
runs in the caller's terminal (a shell, or one command) and, where the path is real ssh, the
`ssh_config` options that reach the same node, so `gpucloud-RUN` works in VS Code and rsync too.
Nothing here opens a port to the world: a provider whose only path would is expected to say so
with `SessionUnsupported` instead (docs/SSH.md, "gpucloud ssh").
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


def unsupported(cloud: str, why: str) -> SessionUnsupported:
    """The one error a provider without a session path raises, naming the provider and the reason."""
    return SessionUnsupported(
        f"gpucloud ssh: the {cloud} provider has no way into a node that opens nothing to the world: {why}.",
        hint="`gpucloud logs RUN --follow` shows the job's output; docs/SSH.md lists what each provider offers.",
    )
