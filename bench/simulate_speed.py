"""Simulator speed and memory on the issue's reference case, analytic and measured.

    python bench/simulate_speed.py

A 10-minute, 70 req/s Poisson resample of the Azure code trace (about 42,000
requests) on 35 prompt + 5 token h100-80gb machines, BLOOM-176B at TP 8, lean engine:
once with the analytic model and once with `--perf-db` (the Splitwise measurements in
../shared/data/perf/, when present). Splitwise's own simulator takes about 36 s for
this on a 2-core machine. Targets: under 1 s of simulation either way, under 3 s for
the whole `splitplan simulate` process, peak memory under 500 MB. Reports the best of
3 runs of the simulation call, requests per second, the peak RSS of this process, and
the wall time of the CLI process (`--max-requests` large enough for the whole trace).
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np

from splitplan import api
from splitplan.perf.table import load_perf_db
from splitplan.sim.cluster import PoolSpec, simulate
from splitplan.workload.trace import default_trace_path, load_trace, resample_poisson

PERF_DB = Path(__file__).resolve().parents[2] / "shared" / "data" / "perf" / "splitwise_perf_model.csv"


def cli_seconds(extra: list[str]) -> float | None:
    exe = shutil.which("splitplan")
    if exe is None:
        return None
    args = [exe, "simulate", "--model", "bloom-176b", "--prompt-pool", "h100-80gb:8:35", "--token-pool", "h100-80gb:8:5",
            "--rate", "70", "--duration", "600", "--format", "json", *extra]
    start = time.perf_counter()
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    trace = resample_poisson(load_trace(default_trace_path()), 70.0, 600.0, np.random.default_rng(0))
    inst = api.instance("bloom-176b", "h100-80gb", 8)
    models = [("analytic", inst, [])]
    if PERF_DB.is_file():
        models.append(("--perf-db", load_perf_db(str(PERF_DB)).require(inst), ["--perf-db", str(PERF_DB)]))
    print("| model | requests | events | simulation s (best of 3) | requests/s | whole process s | peak RSS MB |")
    print("|---|---|---|---|---|---|---|")
    for name, perf, extra in models:
        pools = [PoolSpec("prompt", perf, 35), PoolSpec("token", perf, 5)]
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            result = simulate(trace, pools)
            best = min(best, time.perf_counter() - start)
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        whole = cli_seconds(extra)
        whole_text = f"{whole:.2f}" if whole is not None else "(splitplan not on PATH)"
        print(f"| {name} | {len(trace):,} | {result.events:,} | {best:.2f} | {len(trace) / best:,.0f} | {whole_text} | {rss_mb:.0f} |")


if __name__ == "__main__":
    main()
