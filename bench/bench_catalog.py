"""Catalog load + query time (target: loading and querying under 50 ms).

Each sample clears the per-process cache, so it parses and validates both CSVs again (the cost a
fresh `gpucloud plan` pays; module import is excluded). Prints medians of N samples.
Usage: python bench/bench_catalog.py [N]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

_t = time.perf_counter()
from gpucloud.catalog import load_catalog  # noqa: E402

IMPORT_S = time.perf_counter() - _t


def main(n: int = 50) -> None:
    t0 = time.perf_counter()
    load_catalog().query(gpu="k80")
    first = time.perf_counter() - t0
    loads, queries, both = [], [], []
    for _ in range(n):
        load_catalog.cache_clear()
        t0 = time.perf_counter()
        cat = load_catalog()
        t1 = time.perf_counter()
        cat.query(gpu="t4", cloud="aws", region="us-east-1")
        t2 = time.perf_counter()
        loads.append(t1 - t0)
        queries.append(t2 - t1)
        both.append(t2 - t0)
    ms = lambda xs: statistics.median(xs) * 1000  # noqa: E731
    print(f"catalog: {len(cat.gpus)} GPUs, {len(cat.offerings)} offerings; {n} samples")
    print(f"first import + load + query in this process: {(IMPORT_S + first) * 1000:.2f} ms")
    print(f"load (cache cleared)  median {ms(loads):.2f} ms  max {max(loads) * 1000:.2f} ms")
    print(f"query                 median {ms(queries):.3f} ms")
    print(f"load + query          median {ms(both):.2f} ms  (budget 50 ms)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50)
