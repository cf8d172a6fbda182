"""A watcher's own teardown of a run (a budget's `down`) goes on to its end: the run turns final as
the teardown begins, and neither this watcher's clean-up of final runs' leases nor its renewals may
stop the `down` halfway, which would leave the run final with its machines up."""

from __future__ import annotations

import subprocess
import sys
import time

from gpucloud.run.watch_all import Watcher
from gpucloud.state.leases import Leases


def test_a_budget_teardown_under_way_outlives_the_run_turning_final() -> None:
    watcher = Watcher(poll_s=0.1, lease_s=0.5, gc_every_s=0)
    store = watcher.store
    store.create_run("r1", name="r1", price_per_hour=1.0)
    assert Leases(store).take("r1", watcher.holder, 0.5, action="budget")
    down = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])  # stands in for `down r1`
    watcher.children["r1"], watcher.downs = down, {"r1"}
    store.finish_run("r1", "down", message="torn down by `gpucloud down`")  # what `down` does first
    end = time.monotonic() + 10
    while "r1" in watcher.children and time.monotonic() < end:
        watcher.tick()
        time.sleep(0.1)
    assert down.returncode == 0, "the watcher stopped its own teardown halfway"
    assert "r1" not in Leases(store).taken_over()  # done: the lease went with it


def test_a_watcher_stopped_while_its_follower_finishes_a_final_run_waits_and_drops_the_lease() -> None:
    """SIGTERM to `watch --all` just as a followed run turned final: the follower (collecting, tearing
    down) is waited for, not killed, and the final run's lease row goes rather than staying behind."""
    watcher = Watcher(poll_s=0.1, lease_s=5, gc_every_s=0)
    store = watcher.store
    store.create_run("r2", name="r2", price_per_hour=1.0)
    assert Leases(store).take("r2", watcher.holder, 5)
    follower = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])  # `watch r2`, finishing
    watcher.children["r2"] = follower
    store.finish_run("r2", "succeeded", message="done")
    watcher.stop()
    assert follower.returncode == 0, "the watcher killed a follower finishing a final run"
    assert "r2" not in Leases(store).taken_over()
