"""gpucloud against SkyPilot and dstack, each command paired with `python -c pass` in the same run
(bench/paired.py). The peers are installed in throwaway virtual environments; nothing here needs
credentials or the network. The commands, to rerun it:

    python -m venv /tmp/sky && /tmp/sky/bin/pip install skypilot==0.14.1
    python -m venv /tmp/dstack && /tmp/dstack/bin/pip install dstack==0.22.5
    python bench/bench_peers.py --sky /tmp/sky --dstack /tmp/dstack [--runs 7]
    python bench/bench_peers.py --sky /tmp/sky --plan [--rows 20000] [--runs 5]

`--help` of all three; with `--plan`, `gpucloud plan JOB` against SkyPilot's optimizer planning the
same request (bench/sky_plan.py, run with SkyPilot's Python) over the same offerings: the shipped
catalog, and with `--rows N` the shipped rows grown to about N through regions
(bench/bench_plan_rows.py), written in SkyPilot's own catalog format (`~/.sky/catalogs/v8/<cloud>/
vms.csv`, the columns of its `sky/catalog/data_fetchers/fetch_aws.py` and `fetch_azure.py`, plus
`common/accelerators.csv` and `common/metadata.csv`) under a temporary HOME, and in gpucloud's
indexed file under a temporary GPUCLOUD_HOME. Retired rows are left out of SkyPilot's copy (it has
no status). Each side's answer is printed, so the two are seen to plan the same thing. dstack's
`offer` needs its server and a configured backend, so it is not planned here.

The first (unrecorded) run of each command writes its bytecode, so the samples are warm starts.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired import NEUTRAL_CWD, REPO, compile_package, gpucloud_cmd, load_text, run_paired  # noqa: E402

# (job file, SkyPilot's request for the same: GPU, count, market, min vCPUs, places). t4-any-cloud
# is `spot: auto` on any cloud: its cheapest market is spot, which is what SkyPilot is asked.
PLAN_JOBS = (
    ("examples/t4-any-cloud.yaml", ["T4", "1", "spot", "0"]),
    (
        "examples/a100-azure.yaml",
        ["A100-80GB", "1", "on-demand", "24", "azure/eastus", "azure/westus2", "azure/westeurope"],
    ),
)
AWS_COLUMNS = ["AvailabilityZone", "Arch"]
AZURE_COLUMNS = ["Generation"]


def write_sky_catalog(home: Path, rows: list) -> None:
    """The offerings as SkyPilot's v8 catalog files under `home`/.sky/catalogs/v8/."""
    from gpucloud.catalog import shipped_catalog

    base = home / ".sky" / "catalogs" / "v8"
    common = ["InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB", "GpuInfo"]
    common += ["Price", "SpotPrice", "Region"]
    for cloud in ("aws", "azure"):
        (base / cloud).mkdir(parents=True, exist_ok=True)
        with open(base / cloud / "vms.csv", "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(common + (AWS_COLUMNS if cloud == "aws" else AZURE_COLUMNS))
            for o in rows:
                if o.cloud != cloud or o.status == "retired":
                    continue
                spot = "" if o.spot_price_per_hour is None else o.spot_price_per_hour
                extra = [f"{o.region}a", o.arch] if cloud == "aws" else ["V1"]
                out.writerow(
                    [o.instance_type, o.gpu, o.gpu_count, o.vcpus, o.memory_gib, "", o.price_per_hour, spot, o.region]
                    + extra
                )
    (base / "aws" / "images.csv").write_text("Tag,Region,OS,OSVersion,ImageId,CreationDate\n")
    (base / "azure" / "images.csv").write_text("Tag,Region,OS,OSVersion,ImageId,CreationDate\n")
    (base / "aws" / "instance_quota_mapping.csv").write_text("InstanceType,On-Demand Quota Code,Spot Quota Code\n")
    (base / "common").mkdir(parents=True, exist_ok=True)
    gpus = shipped_catalog().gpus
    names = sorted({o.gpu for o in rows})
    with open(base / "common" / "accelerators.csv", "w", newline="") as f:
        csv.writer(f).writerows([["AcceleratorName", "Clouds"], *[[n, "AWS, Azure"] for n in names]])
    with open(base / "common" / "metadata.csv", "w", newline="") as f:
        lines = [["GPU", "MemoryGB", "Manufacturer"], *[[n, gpus[n].memory_gib, "NVIDIA"] for n in names]]
        csv.writer(f).writerows(lines)


def version(cmd: list[str]) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return (out.stdout.strip() or out.stderr.strip()).splitlines()[-1] if (out.stdout or out.stderr) else "?"


def answer(cmd: list[str], env: dict[str, str]) -> str:
    """What a planner chose: the first candidate line of `gpucloud plan`, SkyPilot's stderr line."""
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env={**os.environ, **env}, cwd=NEUTRAL_CWD)
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    if cmd[-1].endswith(".yaml"):
        return next((line.strip() for line in out.stdout.splitlines() if line.strip().startswith("1 ")), "?")
    return out.stderr.strip().splitlines()[-1]


def bench_plan(sky_venv: Path, rows: int, runs: int) -> None:
    """`gpucloud plan` against SkyPilot's optimizer over the same offerings."""
    from bench_plan_rows import grown_rows, replicas_for

    from gpucloud.catalog import load_catalog, offerings_db, shipped_catalog

    folder = Path(tempfile.mkdtemp(prefix="gpucloud-peers-"))
    offerings = list(shipped_catalog().offerings) if not rows else grown_rows(replicas_for(rows), "regions")
    write_sky_catalog(folder / "sky-home", offerings)
    ours_env = {"GPUCLOUD_HOME": str(folder / "gpucloud-home"), "COLUMNS": "200"}
    if rows:
        os.environ["GPUCLOUD_HOME"] = ours_env["GPUCLOUD_HOME"]
        load_catalog.cache_clear()  # type: ignore[attr-defined]
        offerings_db.write(offerings_db.cache_file(), offerings, created_at="2026-12-04T00:00:00Z", clouds={})
    sky_env = {"HOME": str(folder / "sky-home"), "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"}
    sky_python = str(sky_venv / "bin" / "python")
    kind = "grown through regions" if rows else "shipped"
    print(f"\n== plan over {len(offerings):,} offerings ({kind}); {load_text()}")
    for job, request in PLAN_JOBS:
        ours_cmd = gpucloud_cmd("plan", str(REPO / job))
        sky_cmd = [sky_python, str(REPO / "bench" / "sky_plan.py"), *request]
        print(f"{job}: gpucloud #{answer(ours_cmd, ours_env)}")
        print(f"  SkyPilot: {answer(sky_cmd, sky_env)}")
        ours = run_paired(f"  gpucloud plan {job}", ours_cmd, runs, ours_env)
        print(ours.line() + f"  [{load_text()}]")
        theirs = run_paired(f"  SkyPilot optimizer, {' '.join(request)}", sky_cmd, runs, sky_env)
        print(theirs.line() + f"  [{load_text()}]; {theirs.median / ours.median:.1f}x gpucloud's median")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sky", type=Path, required=True, help="venv with skypilot installed")
    parser.add_argument("--dstack", type=Path, help="venv with dstack installed (for --help)")
    parser.add_argument("--plan", action="store_true", help="plan against SkyPilot's optimizer instead of --help")
    parser.add_argument("--rows", type=int, default=0, help="with --plan: grow the catalog to about this many rows")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    compile_package()
    if args.plan:
        bench_plan(args.sky, args.rows, args.runs)
        return
    if args.dstack is None:
        parser.error("--dstack is needed for --help")
    sky, dstack = str(args.sky / "bin" / "sky"), str(args.dstack / "bin" / "dstack")
    print(f"{version([sky, '--version'])}; dstack {version([dstack, '--version'])}; runs={args.runs}; {load_text()}")
    ours = run_paired("gpucloud --help", gpucloud_cmd("--help"), args.runs)
    print(ours.line() + f"  [{load_text()}]")
    for label, cmd in (("sky --help", [sky, "--help"]), ("dstack --help", [dstack, "--help"])):
        theirs = run_paired(label, cmd, args.runs)
        print(theirs.line() + f"  [{load_text()}]; {theirs.median / ours.median:.1f}x gpucloud's median")


if __name__ == "__main__":
    main()
