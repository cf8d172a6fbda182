"""`gpucloud ssh` over the system's OpenSSH client: the argv of an interactive session and the
`ssh_config` options of a `gpucloud-RUN` entry, both from the provider's own connection settings
(the user's ssh_config or GPUCLOUD_SSH_CONFIG, host keys never accepted silently: transport.py).

A session gets a connection of its own (ControlMaster=no, ControlPath=none): a forward requested
through a shared master would stay with the master after the session ended.
"""

from __future__ import annotations

from gpucloud.contract.session import SessionAsk
from gpucloud.providers.ssh import transport as ssh_transport

# ssh -G keys copied into a gpucloud-RUN entry (lower case as -G prints them -> ssh_config spelling).
ENTRY_KEYS = (
    ("hostname", "HostName"),
    ("port", "Port"),
    ("user", "User"),
    ("identityfile", "IdentityFile"),
    ("identitiesonly", "IdentitiesOnly"),
    ("userknownhostsfile", "UserKnownHostsFile"),
    ("globalknownhostsfile", "GlobalKnownHostsFile"),
    ("proxyjump", "ProxyJump"),
    ("proxycommand", "ProxyCommand"),
    ("certificatefile", "CertificateFile"),
)

# The node's shell: in its folder, with the GPUs the run holds (read from the bootstrap's own
# environment, only when that process carries the node's cookie). `__TAIL__` is what runs there.
NODE_SHELL = r"""W="$R/work/$RUN/node-$RANK"
[ -d "$W" ] || { echo "gpucloud ssh: node $RANK of run $RUN has no folder on this host" >&2; exit 2; }
p=$(head -c 20 "$W/pid" 2>/dev/null | tr -cd 0-9)
if [ -n "$p" ] && grep -qszxF "GPUCLOUD_VM_DIR=$W" "/proc/$p/environ"; then
  g=$(tr '\0' '\n' <"/proc/$p/environ" | sed -n 's/^CUDA_VISIBLE_DEVICES=//p' | head -n 1)
  [ -n "$g" ] && export CUDA_VISIBLE_DEVICES="$g"
fi
export GPUCLOUD_VM_DIR="$W" GPUCLOUD_NODE_RANK="$RANK"
cd "$W/job" 2>/dev/null || cd "$W" || exit 1
__TAIL__"""


def session_argv(host: ssh_transport.SshHost, remote: str, ask: SessionAsk, forward_to: str = "127.0.0.1") -> list[str]:
    """`ssh` with the provider's options, a connection of its own, the forwards on the caller's
    loopback (`ExitOnForwardFailure`: a port taken here fails the session rather than silently not
    forwarding), a terminal when asked, and the remote script."""
    own = ["-o", "ControlMaster=no", "-o", "ControlPath=none"]  # ssh takes the first value of an option
    forwards: list[str] = []
    for fwd in ask.forwards:
        forwards += ["-L", f"127.0.0.1:{fwd.local}:{forward_to}:{fwd.remote}"]
    if forwards:
        forwards += ["-o", "ExitOnForwardFailure=yes"]
    return [
        "ssh",
        *own,
        *ssh_transport.base_args(host),
        "-t" if ask.tty else "-T",
        *forwards,
        *host.destination(),
        remote,
    ]


def entry_options(host: ssh_transport.SshHost) -> list[tuple[str, str]]:
    """The options `ssh -G` resolves for the host (the user's config, GPUCLOUD_SSH_CONFIG), as
    ssh_config lines, so `ssh gpucloud-RUN` reaches it without gpucloud in between."""
    conf = ssh_transport.effective_config(host)
    found: list[tuple[str, str]] = []
    for key, spelled in ENTRY_KEYS:
        value = conf.get(key, "")
        if value and value != "none" and not (key == "identitiesonly" and value == "no"):
            found.append((spelled, value))
    strict = conf.get("stricthostkeychecking", "ask")
    found.append(("StrictHostKeyChecking", "yes" if strict in ("ask", "true") else strict))
    return found
