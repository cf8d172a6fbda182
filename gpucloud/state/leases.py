"""Watcher leases: which `gpucloud watch --all` acts on a run, until when.

A watcher takes a run's lease before it does anything to the run and renews it while it acts; a
lease that was not renewed expires, and then another watcher (or the same one, restarted) takes it.
Taking is one upsert whose WHERE lets it win only over an expired lease or one's own, so two
watchers never both hold a run (SQLite: the write lock; PostgreSQL: the row lock of the upsert).

A lease row stays, expired, after its holder let go: it marks a run watchers have taken over (the
run's own record then no longer says "detached"), until the run is final and the row is dropped.
"""

from __future__ import annotations

import time

from gpucloud.state.runs_db import Store

GC_LEASE = "gc:schedule"  # not a run: held by the watcher whose turn it is to run `gc`, until the next turn


class Leases:
    def __init__(self, store: Store) -> None:
        self.store = store

    def take(self, run_id: str, holder: str, ttl_s: float, action: str = "watch", *, if_expired: bool = False) -> bool:
        """Take the lease when it is free, expired or (unless if_expired) already ours; whether we got it."""
        now = time.time()
        mine = "" if if_expired else " OR leases.holder = excluded.holder"
        with self.store.transaction() as c:
            cur = c.execute(
                "INSERT INTO leases (run_id, holder, action, expires_at) VALUES (?,?,?,?)"
                " ON CONFLICT(run_id) DO UPDATE SET holder = excluded.holder, action = excluded.action,"
                " expires_at = excluded.expires_at WHERE leases.expires_at < ?" + mine,
                (run_id, holder, action, now + ttl_s, now),
            )
            return cur.rowcount == 1  # inserted, or the WHERE let the update through

    def renew(self, run_id: str, holder: str, ttl_s: float) -> bool:
        """Push our lease's expiry on; False when it is no longer ours (it expired and was taken)."""
        with self.store.transaction() as c:
            sql = "UPDATE leases SET expires_at = ? WHERE run_id = ? AND holder = ?"
            cur = c.execute(sql, (time.time() + ttl_s, run_id, holder))
            return bool(cur.rowcount)

    def release(self, run_id: str, holder: str, *, done: bool) -> None:
        """Let go: the row is dropped when the run is done, else left expired (the run stays a watcher's)."""
        with self.store.transaction() as c:
            if done:
                c.execute("DELETE FROM leases WHERE run_id = ? AND holder = ?", (run_id, holder))
            else:
                c.execute("UPDATE leases SET expires_at = 0 WHERE run_id = ? AND holder = ?", (run_id, holder))

    def taken_over(self) -> dict[str, str]:
        """run id -> holder, for every run a watcher holds or has held (expired or not)."""
        return {r["run_id"]: r["holder"] for r in self.store.query("SELECT run_id, holder FROM leases")}

    def drop(self, run_id: str) -> None:
        """Forget a final run's lease once nobody holds it: a run turns final when `down` begins, and
        the watcher tearing it down still holds (and renews) its lease until the teardown is over."""
        with self.store.transaction() as c:
            c.execute("DELETE FROM leases WHERE run_id = ? AND expires_at < ?", (run_id, time.time()))
