"""The end of a kept machine, cleaned up from the caller's side: the follower.

A kept machine ends by itself (idle, max_duration, any deadline layer) long after the `gpucloud
run` that launched it returned. The node can end only itself: what the run made around it (the
AWS security group, node role and key pair, an Azure role assignment outside the resource group,
the run's key and ssh entries under GPUCLOUD_HOME) needs the caller's credentials, which never go
to the node. So when a machine is kept (`run`'s job ended kept; a detached run with `keep`), the
CLI starts one small process of its own, in a session of its own, that reads the run's channel
every POLL_S seconds (`commands.refresh`: the node's signed status, and the provider's node states
while a job runs) and, once the machine ended, records the run's end, keeps its log, and tears down
what is left, as `gpucloud down` would. Its pid is in GPUCLOUD_HOME/runs/RUN/kept-follower.pid; it
exits without tearing down anything when the run ended otherwise (`down`, `gc`). One that died (the
caller's machine was off) is started again by the next command that reads the run (`ls`, `status`,
`exec`: commands.refresh), kept or just ended; `gc` and `down` stay the last word (docs/KEEP.md).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the follower imports the rest once it has waited (below)
    from gpucloud.state.runs_db import RunRecord, Store

POLL_S = 3.0
# A machine just kept waits at least 10 s (the shortest `keep`): the follower starts its work after
# this, at low priority, so its start-up does not slow the next job the caller sends at once.
START_DELAY_S = 5.0
ENDED_BY_OTHERS = ("down", "down-pending")


def follow(run_id: str, *, poll_s: float = POLL_S) -> int:
    """Wait until the kept machine ended, then clean up; 0 when nothing was left to do or done."""
    from gpucloud.run.commands import refresh
    from gpucloud.run.keep import KEPT, follower_pid, pid_path, write_atomic
    from gpucloud.state.runs_db import Store

    store = Store()
    other = follower_pid(run_id)
    if other is not None and other != os.getpid():
        return 0  # one follower per run
    write_atomic(pid_path(run_id), f"{os.getpid()}\n")
    while True:
        run = store.get_run(run_id)
        if run is None:
            return 0
        if not run.final:
            run = refresh(store, run)
        if run.final:
            break
        time.sleep(poll_s if run.status == KEPT else 5 * poll_s)  # a first job: the provider is asked too
    if run.status in ENDED_BY_OTHERS:
        return 0
    return 1 if clean_up(store, run) else 0


def clean_up(store: Store, run: RunRecord) -> list[str]:
    """A kept run whose machine ended: its log kept, everything it still holds torn down."""
    from gpucloud.run.commands import channel_for
    from gpucloud.run.keep import KEPT
    from gpucloud.run.log import LogMirror
    from gpucloud.run.teardown import teardown_run
    from gpucloud.state.runs_db import Journal, home_dir

    channel = channel_for(run)  # what `status` marked gone already (its machines) is not asked again
    if channel is not None:
        try:  # an SSH host's channel goes with the teardown: the log is copied first
            LogMirror(home_dir(), run.id, run.num_nodes).sync(channel, final=True)
        except Exception as exc:  # noqa: BLE001 - the teardown matters more than the log
            print(f"the run's log could not be copied: {exc}", file=sys.stderr)
    t0 = time.monotonic()
    errors = teardown_run(store, Journal(store), run, wait=True, say=lambda m: print(m, file=sys.stderr))
    what = "with errors: " + "; ".join(errors) if errors else "nothing left"
    took = time.monotonic() - t0
    store.event(run.id, KEPT, f"the kept machine ended ({run.status}); torn down in {took:.1f}s, {what}")
    return errors


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m gpucloud.run.keep_end RUN", file=sys.stderr)
        return 2
    with contextlib.suppress(OSError):
        os.nice(10)
    time.sleep(START_DELAY_S)
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} following kept run {argv[0]}", file=sys.stderr)
    return follow(argv[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
