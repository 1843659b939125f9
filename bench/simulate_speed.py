"""Simulator speed and memory on the issue's reference case.

    python bench/simulate_speed.py

A 10-minute, 70 req/s Poisson resample of the Azure code trace (about 42,000
requests) on 35 prompt + 5 token h100-80gb machines, BLOOM-176B at TP 8, lean engine.
Splitwise's own simulator takes about 36 s for this on a 2-core machine. Target:
under 1 s (3 s at the least), peak memory under 500 MB. Reports the best of 3 runs
of the simulation call, requests per second, and the peak RSS of the whole process.
"""

from __future__ import annotations

import resource
import time

import numpy as np

from splitplan import api
from splitplan.sim.cluster import PoolSpec, simulate
from splitplan.workload.trace import default_trace_path, load_trace, resample_poisson


def main() -> None:
    trace = resample_poisson(load_trace(default_trace_path()), 70.0, 600.0, np.random.default_rng(0))
    inst = api.instance("bloom-176b", "h100-80gb", 8)
    pools = [PoolSpec("prompt", inst, 35), PoolSpec("token", inst, 5)]
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        result = simulate(trace, pools)
        best = min(best, time.perf_counter() - start)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("| requests | events | wall s (best of 3) | requests/s | peak RSS MB |")
    print("|---|---|---|---|---|")
    print(f"| {len(trace):,} | {result.events:,} | {best:.2f} | {len(trace) / best:,.0f} | {rss_mb:.0f} |")


if __name__ == "__main__":
    main()
