"""Watcher leases on both backends: one holder at a time, taken over only after expiry, renewals
only by the holder, the gc turn once per period; many processes racing for one lease: one wins."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gpucloud.state.leases import GC_LEASE, Leases
from gpucloud.state.runs_db import Store

pytestmark = pytest.mark.usefixtures("backend")


def test_one_holder_until_expiry() -> None:
    leases = Leases(Store())
    assert leases.take("r1", "a", 60)
    assert not leases.take("r1", "b", 60)  # a holds it
    assert leases.take("r1", "a", 60)  # a renews by taking again
    assert leases.renew("r1", "a", 60) and not leases.renew("r1", "b", 60)
    assert leases.take("r2", "b", 0.2) and not leases.take("r2", "a", 60)
    time.sleep(0.3)
    assert leases.take("r2", "a", 60)  # b's expired: a takes it over
    assert not leases.renew("r2", "b", 60)  # and b, back, cannot renew what it lost
    leases.release("r1", "a", done=False)
    assert leases.taken_over() == {"r1": "a", "r2": "a"}  # released but still marked as taken over
    assert leases.take("r1", "b", 60)  # released: free at once
    leases.release("r1", "b", done=True)
    assert "r1" not in leases.taken_over()


def test_a_held_lease_of_a_final_run_is_not_dropped() -> None:
    """A run turns final as its teardown begins; the watcher doing the teardown still holds its
    lease, so another watcher's (or its own) clean-up of final runs' leases must leave it."""
    leases = Leases(Store())
    assert leases.take("r1", "a", 60, action="budget")
    leases.drop("r1")
    assert leases.taken_over() == {"r1": "a"} and leases.renew("r1", "a", 60)
    leases.release("r1", "a", done=False)  # let go (expired): now it may be forgotten
    leases.drop("r1")
    assert "r1" not in leases.taken_over()


def test_the_gc_turn_comes_once_per_period() -> None:
    leases = Leases(Store())
    assert leases.take(GC_LEASE, "a", 0.3, action="gc", if_expired=True)
    assert not leases.take(GC_LEASE, "a", 0.3, action="gc", if_expired=True)  # not even its holder, before the turn
    assert not leases.take(GC_LEASE, "b", 0.3, action="gc", if_expired=True)
    time.sleep(0.4)
    assert leases.take(GC_LEASE, "b", 0.3, action="gc", if_expired=True)


_RACER = """
import sys, time
from gpucloud.state.leases import Leases
from gpucloud.state.runs_db import Store
leases = Leases(Store())
start = float(sys.argv[2])
while time.time() < start:
    time.sleep(0.002)
print(leases.take("contended", sys.argv[1], 60))
"""


def test_racing_processes_one_wins() -> None:
    Store().close()  # schema first
    start = time.time() + 3
    procs = [
        subprocess.Popen([sys.executable, "-c", _RACER, f"w{i}", str(start)], stdout=subprocess.PIPE, text=True)
        for i in range(8)
    ]
    wins = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert wins.count("True") == 1, wins
