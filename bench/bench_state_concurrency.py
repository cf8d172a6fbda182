"""Many CLIs writing one state store at once lose no update: N processes (each opens the store as a
CLI does, as a user of its own) start and end K runs each, with the journal rows, attempts, events
and phases a real run writes, all at the same moment; every one also appends to one shared run and
races to finish it. Then the real CLI (`ls --all --json`, `cost --all-users --json`) must show every
run ended, every resource deleted, every event there, and exactly one process winning the race.

`--cli`: the same number of processes, each a user of its own on a machine of its own (its own
GPUCLOUD_HOME; one shared home with SQLite), each driving the real `gpucloud` CLI on the local
provider: `run --detach` (a job that sleeps), `down RUN --yes`, then a followed `run` of a tiny job,
all at the same moment. Then `ls --all --json`, `cost --all-users --json` and the store must show
every run ended as its CLI said (`down`, `succeeded`), owned by its user, with its attempt launched
and ended, every journal row deleted, and no CLI failed.

Run: python bench/bench_state_concurrency.py [--procs 50] [--runs 4] [--backend postgresql|sqlite|both] [--cli]
(from the repo root; postgresql starts Debian's PostgreSQL in a temporary folder, as the tests do)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

WORKER = """
import json, sys, time
from gpucloud.state.runs_db import Journal, Store
tag, runs, start = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
while time.time() < start:
    time.sleep(0.005)
t0 = time.perf_counter()
store = Store()
journal = Journal(store)
lat = []
for i in range(runs):
    s = time.perf_counter()
    run_id = f"{tag}-{i}"
    store.create_run(run_id, name=tag, detached=True, price_per_hour=1.0)
    store.start_attempt(run_id, 0, cloud="local", region="r", instance_type="t", spot=True,
                        price_per_hour=1.0, num_nodes=1)
    res = [journal.intent(run_id, kind, f"{run_id}-{kind}", "r", "local") for kind in ("instance", "disk")]
    for n, rid in enumerate(res):
        journal.created(rid, f"{run_id}-{n}")
    store.set_attempt_handle(run_id, 0, json.dumps({"run_id": run_id, "cloud": "local", "region": "r"}))
    store.update_run(run_id, status="running", started_at=time.time(), phase="run")
    for k in range(3):
        store.event(run_id, "progress", f"step {k}")
    store.event("shared", "touch", tag)
    store.set_phases(run_id, {"provision": 0.1, "run": 1.0})
    store.end_attempt(run_id, None, "teardown")
    for rid in res:
        journal.deleted(rid)
    store.finish_run(run_id, "succeeded", exit_code=0)
    lat.append(time.perf_counter() - s)
won = store.finish_run("shared", "down", only_if_active=True)
print(json.dumps({"won": won, "lat": lat, "wall": time.perf_counter() - t0}))
"""


CLI_WORKER = """
import json, subprocess, sys, time
job_dir, start = sys.argv[1], float(sys.argv[2])
def cli(*args):
    s = time.perf_counter()
    argv = [sys.executable, "-m", "gpucloud", *args]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=job_dir)
    if out.returncode != 0:
        raise SystemExit(f"gpucloud {' '.join(args)}: exit {out.returncode}: {out.stderr.strip()[-600:]}")
    return out.stdout, time.perf_counter() - s
while time.time() < start:
    time.sleep(0.005)
t0 = time.perf_counter()
detached, t_detach = cli("run", f"{job_dir}/sleep.yaml", "--detach", "--yes")
_, t_down = cli("down", detached.strip(), "--yes")
followed, t_run = cli("run", f"{job_dir}/echo.yaml", "--yes", "--json")
doc = json.loads(followed)
print(json.dumps({"detached": detached.strip(), "followed": doc["run_id"], "status": doc["status"],
                  "lat": {"run --detach": t_detach, "down": t_down, "run": t_run}, "wall": time.perf_counter() - t0}))
"""
JOBS = {
    "sleep.yaml": "name: bench-sleep\nresources: {cloud: local}\nrun: sleep 600\nmax_duration: 15m\n",
    "echo.yaml": "name: bench-echo\nresources: {cloud: local}\nrun: echo done\nmax_duration: 15m\n",
}


def cli_round(env: dict[str, str], procs: int, shared_home: bool) -> dict[str, object]:
    """`procs` users at once, each `run --detach`, `down`, `run` with the real CLI; the checks."""
    from gpucloud.state.runs_db import Store

    os.environ.update(env)
    Store().create_run("shared", name="shared", detached=True)  # the schema, before the race
    root = Path(tempfile.mkdtemp(prefix="gpucloud-bench-cli-"))
    for name, text in JOBS.items():
        (root / name).write_text(text)
    start = time.time() + 3.0 + procs * 0.1  # every interpreter is up before the first CLI starts
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", CLI_WORKER, str(root), str(start)],
            env={**env, "GPUCLOUD_USER": f"user{i:02d}"}
            | ({} if shared_home else {"GPUCLOUD_HOME": tempfile.mkdtemp(prefix=f"gpucloud-bench-u{i:02d}-")}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(procs)
    ]
    results, errors = [], []
    for i, w in enumerate(workers):
        out, err = w.communicate(timeout=1800)
        if w.returncode == 0:
            results.append({**json.loads(out), "user": f"user{i:02d}"})
        else:
            errors.append(err.strip()[-600:])
    wall = time.time() - start
    return {"wall_s": round(wall, 2), **_cli_checks(env, procs, results, errors)}


def _cli_checks(env: dict[str, str], procs: int, results: list[dict], errors: list[str]) -> dict[str, object]:
    """What the CLI and the store show after the race, as counts that must all be 0."""
    from gpucloud.state.runs_db import Store

    every = {r["run_id"]: r for r in _cli(env, "ls", "--all", "--json")}  # type: ignore[attr-defined]
    cost = _cli(env, "cost", "--all-users", "--json")
    store = Store()
    expect = {r["detached"]: ("down", r["user"]) for r in results} | {
        r["followed"]: ("succeeded", r["user"]) for r in results
    }
    runs = [store.get_run(run_id) for run_id in expect]
    lost = {
        "failed processes": len(errors),
        "runs missing": sum(1 for run_id in expect if run_id not in every) + 2 * len(errors),
        "status not as its CLI said": sum(1 for k, (st, _) in expect.items() if every.get(k, {}).get("status") != st),
        "followed runs not succeeded": sum(1 for r in results if r["status"] != "succeeded"),
        "owners wrong": sum(1 for k, (_, user) in expect.items() if every.get(k, {}).get("owner") != user),
        "attempts not launched and ended": sum(
            1 for r in runs if r is None or [(a.launched, a.ended_at is not None) for a in r.attempts] != [(True, True)]
        ),
        "journal rows alive": len(store.resources(alive_only=True)),
        "runs without journal rows": sum(1 for k in expect if not store.resources(k, alive_only=False)),
        "runs without events": sum(1 for k in expect if not store.events(k)),
        "cost report runs missing": 2 * procs + 1 - cost["total"]["runs"],  # type: ignore[index]
    }
    lat: dict[str, list[float]] = {}
    for r in results:
        for step, secs in r["lat"].items():
            lat.setdefault(step, []).append(secs)
    return {
        "clis": 3 * procs,
        "per_cli_s_median": {k: round(statistics.median(v), 2) for k, v in lat.items()},
        "per_cli_s_max": {k: round(max(v), 2) for k, v in lat.items()},
        "lost": lost,
        "errors": errors[:3],
    }


def _cli(env: dict[str, str], *args: str) -> object:
    out = subprocess.run(
        [sys.executable, "-m", "gpucloud", *args], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(out.stdout)


def one_round(env: dict[str, str], procs: int, runs: int) -> dict[str, object]:
    """Start the workers together; check what the CLI then shows; the figures."""
    from gpucloud.state.runs_db import Store

    os.environ.update(env)
    Store().create_run("shared", name="shared", detached=True)  # also creates the schema before the race
    start = time.time() + 2.0 + procs * 0.05  # every interpreter is up before the first write
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, f"w{i:02d}", str(runs), str(start)],
            env={**env, "GPUCLOUD_USER": f"user{i:02d}"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(procs)
    ]
    results, errors = [], []
    for w in workers:
        out, err = w.communicate(timeout=600)
        (results.append(json.loads(out)) if w.returncode == 0 else errors.append(err.strip()[-400:]))
    wall = time.time() - start
    every = _cli(env, "ls", "--all", "--json")
    assert isinstance(every, list)
    ours = [r for r in every if r["run_id"] != "shared"]
    cost = _cli(env, "cost", "--all-users", "--json")
    store = Store()
    lost = {
        "failed processes": len(errors),
        "runs missing": procs * runs - len(ours),
        "runs not succeeded": sum(1 for r in ours if r["status"] != "succeeded"),
        "owners wrong": sum(1 for r in ours if r["owner"] != "user" + r["run_id"][1:3]),
        "resources not deleted": len(store.resources(alive_only=True)),
        "resources missing": procs * runs * 2 - len(store.resources(alive_only=False)),
        "shared-run events missing": procs * runs - sum(1 for e in store.events("shared") if e.kind == "touch"),
        "progress events missing": procs * runs * 3
        - sum(sum(1 for e in store.events(r["run_id"]) if e.kind == "progress") for r in ours),
        "race winners - 1": sum(1 for r in results if r["won"]) - 1,
        "cost report runs missing": procs * runs + 1 - cost["total"]["runs"],  # type: ignore[index]
    }
    lat = sorted(x for r in results for x in r["lat"])
    return {
        "wall_s": round(wall, 2),
        "runs_per_s": round(procs * runs / wall, 1),
        "run_ms_median": round(statistics.median(lat) * 1000, 1) if lat else None,
        "run_ms_p90": round(lat[int(len(lat) * 0.9)] * 1000, 1) if lat else None,
        "lost": lost,
        "errors": errors[:3],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=50)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--backend", choices=("postgresql", "sqlite", "both"), default="both")
    ap.add_argument("--cli", action="store_true", help="each process drives the real CLI (run --detach, down, run)")
    args = ap.parse_args()
    base = {**os.environ, "CI": "true", "PYTHONPATH": str(REPO)}
    failed = False
    for backend in ("postgresql", "sqlite") if args.backend == "both" else (args.backend,):
        home = tempfile.mkdtemp(prefix="gpucloud-bench-home-")
        env = {**base, "GPUCLOUD_HOME": home}
        env.pop("GPUCLOUD_STATE", None)
        os.environ.pop("GPUCLOUD_STATE", None)
        server = None
        if backend == "postgresql":
            from tests.support.postgres_server import PostgresServer

            server = PostgresServer().start()
            env["GPUCLOUD_STATE"] = server.fresh_database()
        try:
            if args.cli:
                figures = cli_round(env, args.procs, shared_home=server is None)
            else:
                figures = one_round(env, args.procs, args.runs)
        finally:
            if server is not None:
                server.stop()
        load = os.getloadavg()[0]
        each = {"mode": "cli"} if args.cli else {"runs_each": args.runs}
        print(json.dumps({"backend": backend, "procs": args.procs, **each, "load_1min": round(load, 1), **figures}))
        failed |= any(figures["lost"].values())  # type: ignore[union-attr]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
