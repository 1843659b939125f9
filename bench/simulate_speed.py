"""Simulator speed and memory on the issue's reference case, analytic and measured.

    python bench/simulate_speed.py

A 10-minute, 70 req/s Poisson resample of the Azure code trace (about 42,000
requests) on 35 prompt + 5 token h100-80gb machines, BLOOM-176B at TP 8, lean engine:
once with the analytic model and once with `--perf-db` (the Splitwise measurements in
../shared/data/perf/, when present). Splitwise's own simulator takes about 36 s for
this on a 2-core machine. Targets: under 1 s of simulation either way, under 3 s for
the whole `splitplan simulate` process, peak memory under 500 MB, and (issue 31) at most
1.5 s for the whole process writing `--output-dir` (requests.csv and summary.json). Reports
the best of 3 runs of the simulation call, requests per second, the peak RSS of this process,
and the wall and CPU seconds of the CLI process without and with `--output-dir` (best of 3).
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from splitplan import api
from splitplan.perf.table import load_perf_db
from splitplan.sim.cluster import PoolSpec, simulate
from splitplan.workload.trace import default_trace_path, load_trace, resample_poisson

PERF_DB = Path(__file__).resolve().parents[2] / "shared" / "data" / "perf" / "splitwise_perf_model.csv"


def cli_seconds(extra: list[str], output_dir: bool = False) -> tuple[float, float] | None:
    """The CLI process's best wall and CPU seconds of 3 runs (CPU: user + system, the children's)."""
    exe = shutil.which("splitplan")
    if exe is None:
        return None
    args = [exe, "simulate", "--model", "bloom-176b", "--prompt-pool", "h100-80gb:8:35", "--token-pool", "h100-80gb:8:5",
            "--rate", "70", "--duration", "600", "--format", "json", *extra]
    best = (float("inf"), float("inf"))
    for _ in range(3):
        with tempfile.TemporaryDirectory() as folder:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(args + (["--output-dir", folder] if output_dir else []), check=True, stdout=subprocess.DEVNULL)
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        best = (min(best[0], wall), min(best[1], cpu))
    return best


def main() -> None:
    trace = resample_poisson(load_trace(default_trace_path()), 70.0, 600.0, np.random.default_rng(0))
    inst = api.instance("bloom-176b", "h100-80gb", 8)
    models = [("analytic", inst, [])]
    if PERF_DB.is_file():
        models.append(("--perf-db", load_perf_db(str(PERF_DB)).require(inst), ["--perf-db", str(PERF_DB)]))
    print("| model | requests | events | simulation s (best of 3) | requests/s | whole process: wall s / CPU s "
          "| with --output-dir: wall s / CPU s | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|")
    for name, perf, extra in models:
        pools = [PoolSpec("prompt", perf, 35), PoolSpec("token", perf, 5)]
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            result = simulate(trace, pools)
            best = min(best, time.perf_counter() - start)
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        whole = [cli_seconds(extra, output_dir) for output_dir in (False, True)]
        whole_text = [f"{w[0]:.2f} / {w[1]:.2f}" if w is not None else "(splitplan not on PATH)" for w in whole]
        print(f"| {name} | {len(trace):,} | {result.events:,} | {best:.2f} | {len(trace) / best:,.0f} | {whole_text[0]} "
              f"| {whole_text[1]} | {rss_mb:.0f} |")


if __name__ == "__main__":
    main()
