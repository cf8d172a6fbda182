"""A run's `ssh_config` entries (`gpucloud ssh --write-config`): `gpucloud-RUN` and `gpucloud-RUN-N`
in a file of gpucloud's own under GPUCLOUD_HOME that ~/.ssh/config Includes, and their removal with
the run (teardown), so no entry outlives its machine (docs/SSH.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gpucloud.contract.provider import Provider, RunHandle
from gpucloud.contract.session import SESSION_FOLDER, SessionAsk
from gpucloud.errors import UserError
from gpucloud.prose import to_stderr
from gpucloud.state.records import RunRecord

SSH_FOLDER = SESSION_FOLDER  # under GPUCLOUD_HOME: one `RUN.conf` per run, Include'd by ~/.ssh/config
INCLUDE_MARK = "# gpucloud: its runs' ssh entries (gpucloud ssh --write-config)"


def ssh_folder() -> Path:
    from gpucloud.state.runs_db import home_dir

    folder = home_dir() / SSH_FOLDER
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def entry_text(run: RunRecord, blocks: list[tuple[list[str], list[tuple[str, str]]]]) -> str:
    """`Host` blocks for the run: `gpucloud-RUN` (node 0) and `gpucloud-RUN-N` per node."""
    lines = [
        f"# gpucloud run {run.id} ({run.name}): written by `gpucloud ssh --write-config`; `gpucloud down` removes it"
    ]
    for names, options in blocks:
        lines.append("Host " + " ".join(names))
        lines += [f"  {key} {value}" for key, value in options]
    return "\n".join(lines) + "\n"


def config_entries(run: RunRecord, handle: RunHandle, provider: Provider, *, write: bool) -> int:
    """Print (or write, with the Include line) the run's entries; a provider whose nodes are not
    reached by ssh (a node that is a process here) has none, said plainly."""
    blocks: list[tuple[list[str], list[tuple[str, str]]]] = []
    for rank in range(max(run.num_nodes, len(handle.nodes), 1)):
        plan = provider.session_path(handle, rank, SessionAsk())
        if not plan.ssh_options:
            raise UserError(
                f"run {run.id} runs on {handle.cloud}, whose nodes are not reached by ssh: there is no ssh entry.",
                hint=f"`gpucloud ssh {run.id}` opens a shell in the node's folder ({plan.node_folder}).",
            )
        names = [f"gpucloud-{run.id}-{rank}"] + ([f"gpucloud-{run.id}"] if rank == 0 else [])
        blocks.append((names, plan.ssh_options))
    text = entry_text(run, blocks)
    if not write:
        sys.stdout.write(text)
        return 0
    path = ssh_folder() / f"{run.id}.conf"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    added = include_line(ssh_folder())
    to_stderr(f"run {run.id}: ssh entries gpucloud-{run.id} (node 0) and gpucloud-{run.id}-N written to {path}")
    if added:
        to_stderr(f"added one Include line for {ssh_folder()}/*.conf at the top of {added}")
    to_stderr(
        f"Open it: `ssh gpucloud-{run.id}`; VS Code: Remote-SSH: Connect to Host... gpucloud-{run.id}; "
        f"rsync -a gpucloud-{run.id}:PATH ."
    )
    return 0


def include_line(folder: Path) -> Path | None:
    """Make ~/.ssh/config Include the folder's entries: one line at its top (an Include after a
    `Host` block would apply to that host only). Returns the file when the line was added."""
    config = Path.home() / ".ssh" / "config"
    config = config.resolve() if config.is_symlink() else config  # a dotfiles link stays a link
    line = f"Include {folder}/*.conf"
    try:
        old = config.read_text()
    except FileNotFoundError:
        old = ""
    if line in old.splitlines():
        return None
    config.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = config.with_name(f".config.gpucloud.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{INCLUDE_MARK}\n{line}\n" + (f"\n{old}" if old else ""))
    if config.exists():
        os.chmod(tmp, config.stat().st_mode & 0o777)
    tmp.replace(config)
    return config


def forget(run_id: str) -> None:
    """The run's entries go with the run (`down`): an entry naming a gone machine is a trap."""
    from gpucloud.state.runs_db import home_dir

    for suffix in (".conf", ".session", ".known_hosts"):  # entries, the session's config, host keys seen
        (home_dir() / SSH_FOLDER / f"{run_id}{suffix}").unlink(missing_ok=True)
