"""`gpucloud dev JOB`: a machine to develop on. The job file's machine, stack, workdir, inputs and
setup, as a run does; its `run` is replaced by a line that says the machine is ready, and the run
is kept (`keep:`, docs/KEEP.md) for `--idle`, so it ends by itself once idle. Then the session's
way in is written: the `gpucloud-RUN` ssh entry where the node is reached by ssh, and how to open
it in an editor (docs/SSH.md, "gpucloud dev")."""

from __future__ import annotations

import time

from gpucloud.errors import UserError
from gpucloud.prose import to_stderr

READY_LINE = "gpucloud dev: the machine is ready"
READY_WAIT_S = 1800.0  # boot and stack install on a cloud; the job's setup comes on top
# The stages before the job's `run` (ui/timeline.py's names, and a run not yet booted): until one of
# these is behind it, the machine is not ready.
BEFORE_READY = (None, "", "plan", "provision", "booting", "boot", "stack", "fetch", "inputs", "pull", "setup")


def dev_job(path: str, *, idle: str) -> object:
    """The job file as a development machine: kept for `idle`, its `run` only the ready line."""
    from gpucloud.spec.load import load_spec
    from gpucloud.spec.values import parse_duration

    job = load_spec(path)
    try:
        seconds = parse_duration(idle)
    except Exception:  # noqa: BLE001 - the spec's own rejection, said for the option
        raise UserError(f"--idle {idle!r} is not a duration.", hint="Write e.g. --idle 30m or --idle 2h.") from None
    return job.model_copy(update={"keep": seconds, "run": f"echo {READY_LINE!r}"})


def start_dev(path: str, *, idle: str, assume_yes: bool) -> int:
    """Launch it detached, wait for the kept machine, write the ssh entry, say how to open it."""
    from gpucloud.run.lifecycle import run_job
    from gpucloud.run.plan import looked_up
    from gpucloud.spec import secrets as spec_secrets

    job, values = spec_secrets.resolve(dev_job(path, idle=idle))  # type: ignore[arg-type]
    data, registry = looked_up(job, values)
    result = run_job(
        job,
        cloud=None,
        region=None,
        spot=None,
        detach=True,
        assume_yes=assume_yes,
        json_out=False,
        wait_teardown=True,
        secret_values=values,
        data=data,
        registry=registry,
    )
    if result.exit_code:
        return int(result.exit_code)
    return _ready(result.run_id, idle)


def _ready(run_id: str, idle: str) -> int:
    """Wait until the setup is done and the machine waits, then the entry and the editor line."""
    from gpucloud.run.commands import refresh, require_run
    from gpucloud.run.session import session_target
    from gpucloud.run.ssh_entries import config_entries
    from gpucloud.state.runs_db import Store

    store = Store()
    end = time.monotonic() + READY_WAIT_S
    while True:
        run = refresh(store, require_run(store, run_id))
        if run.final:
            raise UserError(
                f"run {run_id} ended ({run.status}) before the machine was ready: `gpucloud logs {run_id}`."
            )
        if run.phase not in BEFORE_READY or time.monotonic() > end:
            break
        time.sleep(1.0)
    handle = session_target(store, run, 0)
    from gpucloud.contract import registry as providers
    from gpucloud.contract.session import SessionAsk

    plan = providers.get_provider(handle.cloud).session_path(handle, 0, SessionAsk())
    if plan.ssh_options:
        config_entries(run, handle, providers.get_provider(handle.cloud), write=True)
        where = f"{plan.node_folder}/job" if plan.node_folder.startswith("/") else "/"
        to_stderr(f"VS Code: code --folder-uri vscode-remote://ssh-remote+gpucloud-{run_id}{where}")
    else:
        to_stderr(f"the node is this machine: its folder is {plan.node_folder}")
    to_stderr(
        f"run {run_id}: `gpucloud ssh {run_id}` opens a shell there; it ends after {idle} idle, "
        f"or now with `gpucloud down {run_id}`."
    )
    print(run_id)
    return 0
