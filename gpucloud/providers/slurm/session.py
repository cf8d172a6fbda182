"""`gpucloud ssh` on Slurm: through the login node into the run's own allocation, as a job step
that shares it (`srun --jobid=J --overlap`), on the node of that rank and in its folder. No port is
opened anywhere: the step is Slurm's own, the connection the login node's ssh (docs/SLURM.md).

A forwarded port goes through the login node to the compute node's address (`ssh -L` with the
node's NodeAddr as target): the job must listen on an address the login node reaches, which is the
cluster's network, never the caller's side of it.
"""

from __future__ import annotations

from gpucloud.contract.provider import RunHandle
from gpucloud.contract.session import SessionAsk, SessionPlan, session_tail
from gpucloud.errors import UserError
from gpucloud.providers.slurm.login import Login, script
from gpucloud.providers.ssh import transport as ssh_transport
from gpucloud.providers.ssh.probe import REMOTE_ROOT
from gpucloud.providers.ssh.session import entry_options, session_argv

# The rank's node of the job (Slurm's node list order is the ranks' order: SLURM_NODEID).
NODE_OF = r"""nodes=$(squeue -h -j "$J" -o %N 2>/dev/null)
[ -n "$nodes" ] || { echo "gpucloud ssh: Slurm job $J is not running (squeue lists no nodes for it)" >&2; exit 2; }
node=$(scontrol show hostnames "$nodes" | sed -n "$((RANK + 1))p")
[ -n "$node" ] || { echo "gpucloud ssh: Slurm job $J has no node $RANK" >&2; exit 2; }
"""

STEP = r"""export R RUN RANK
exec srun --jobid="$J" --overlap --nodes=1 --ntasks=1 --nodelist="$node" __PTY__ bash -c "$INNER"
"""

# What runs in the step on the node: its folder, the node's variables, then the session's tail.
INNER = (
    'W="$R/work/$RUN/node-$RANK"; export GPUCLOUD_VM_DIR="$W" GPUCLOUD_NODE_RANK="$RANK"; '
    'cd "$W/job" 2>/dev/null || cd "$W" || exit 1; '
)

ADDR_OF = r"""scontrol show node -o "$node" 2>/dev/null | tr ' ' '\n' | sed -n 's/^NodeAddr=//p' | head -n 1
"""


def job_id(handle: RunHandle) -> str:
    jobs = handle.resources.get("job") or []
    if not jobs:
        raise UserError(f"run {handle.run_id} has no Slurm job yet.", hint="Try again once `gpucloud status` shows it.")
    return jobs[-1]


def step_script(handle: RunHandle, rank: int, ask: SessionAsk) -> str:
    """The login node's script: find the rank's node, then the overlapping step there."""
    inner = INNER + session_tail(ask)  # one line: it also goes into an ssh_config RemoteCommand
    pty = "--pty" if ask.tty else ""
    body = NODE_OF + STEP.replace("__PTY__", pty)
    text = f"R={REMOTE_ROOT}; " + script(body, J=job_id(handle), RUN=handle.run_id, RANK=rank, INNER=inner)
    return "; ".join(line.strip() for line in text.splitlines() if line.strip()).replace(";;", ";")


def node_address(login: Login, handle: RunHandle, rank: int) -> str:
    """The NodeAddr of the rank's node, which a forward targets from the login node."""
    body = NODE_OF + ADDR_OF
    out = login.run(script(body, J=job_id(handle), RANK=rank), timeout=30, check=False)
    addr = out.stdout.decode("utf-8", "replace").strip().splitlines()
    if out.returncode != 0 or not addr or not all(c.isalnum() or c in ".-:" for c in addr[-1]):
        raise UserError(f"run {handle.run_id}: node {rank}'s address could not be read from Slurm.")
    return addr[-1]


def slurm_session(login: Login, handle: RunHandle, rank: int, ask: SessionAsk) -> SessionPlan:
    """ssh to the login node (or this machine, a submit host) running the step script."""
    remote = step_script(handle, rank, ask)
    folder = f"{REMOTE_ROOT}/work/{handle.run_id}/node-{rank}"
    if login.local:
        if ask.forwards:
            raise UserError("cluster: local has no ssh to forward ports over; reach the node's address directly.")
        return SessionPlan(argv=["bash", "-c", remote], node_folder=folder)
    host = ssh_transport.SshHost.parse(login.cluster)
    forward_to = node_address(login, handle, rank) if ask.forwards else "127.0.0.1"
    shell = step_script(handle, rank, SessionAsk(tty=True))
    # ssh_config expands %-tokens in RemoteCommand: squeue's %N is written %%N there.
    options = [*entry_options(host), ("RequestTTY", "yes"), ("RemoteCommand", shell.replace("%", "%%"))]
    return SessionPlan(argv=session_argv(host, remote, ask, forward_to), ssh_options=options, node_folder=folder)
