"""Plan one job with SkyPilot's optimizer, in-process, offline: run with the Python of a venv that has
SkyPilot installed and HOME pointing at a folder whose ~/.sky/catalogs/v8/ holds the catalog written
by bench/bench_peers.py (SkyPilot reads a catalog file there and fetches nothing when it exists).

AWS and Azure are declared enabled without credentials (the optimizer asks `sky check`'s cache
otherwise). Prints the chosen resources and SkyPilot's own wall time on stderr.

Usage: python sky_plan.py GPU COUNT on-demand|spot MIN_VCPUS [CLOUD[/REGION] ...]
"""

import sys
import time

started = time.perf_counter()

import sky  # noqa: E402
from sky import check as sky_check  # noqa: E402
from sky import clouds, optimizer  # noqa: E402

sky_check.get_cached_enabled_clouds_or_refresh = lambda *a, **k: [clouds.AWS(), clouds.Azure()]


def main() -> None:
    gpu, count, market, min_vcpus, *where = sys.argv[1:]
    cpus = f"{min_vcpus}+" if int(min_vcpus) else None
    with sky.Dag() as dag:
        task = sky.Task(run="true")
        task.set_resources(
            {
                sky.Resources(infra=place, accelerators={gpu: int(count)}, use_spot=market == "spot", cpus=cpus)
                for place in where or ["aws", "azure"]
            }
        )
    optimizer.Optimizer.optimize(dag, quiet=True)
    print(f"{task.best_resources} in {time.perf_counter() - started:.3f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
