"""Big inputs: a 10-million-request trace summarized, optimized and simulated.

    python bench/big_trace.py [--requests 10000000] [--workdir DIR]

Generates (once) a splitwise-sim CSV of N requests: Poisson arrivals at 1,000 req/s
with sizes drawn from the Azure code trace (about 190 MB for 10 M). Then times each
command as a fresh process and reports its peak resident memory. Traces longer than
`--max-requests` are optimized (default 100,000) and simulated (default 1,000,000)
on their busiest stretch of that many requests; the window is echoed in the output.
Target: every command under 2 GB peak.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from splitplan.workload.trace import default_trace_path, load_trace

MEASURE = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def generate(path: Path, n: int) -> None:
    base = load_trace(default_trace_path())
    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        f.write("arrival_timestamp,prompt_size,token_size\n")
        start, chunk = 0.0, 1_000_000
        for i in range(0, n, chunk):
            m = min(chunk, n - i)
            arrival = start + np.cumsum(rng.exponential(1e-3, m))
            pick = rng.integers(0, len(base), m)
            np.savetxt(f, np.column_stack([arrival, base.prompt_tokens[pick], base.output_tokens[pick]]),
                       fmt=["%.6f", "%d", "%d"], delimiter=",")
            start = arrival[-1]


def run(args: list[str]) -> tuple[float, float]:
    begin = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", MEASURE, *args], check=True, capture_output=True, text=True)
    return time.perf_counter() - begin, int(out.stdout.strip()) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000_000)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "splitplan-big")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    trace = args.workdir / f"trace-{args.requests}.csv"
    if not trace.exists():
        generate(trace, args.requests)
    plan_dir = args.workdir / "plan"
    cases = {
        "trace summarize": ["splitplan", "trace", "summarize", str(trace), "--format", "json"],
        "optimize, a100 + h100 at TP 8": ["splitplan", "optimize", "--trace", str(trace), "--hardware", "a100-80gb,h100-80gb",
                                          "--tp", "8", "--format", "json", "--output-dir", str(plan_dir)],
        "optimize, whole catalog": ["splitplan", "optimize", "--trace", str(trace), "--format", "json"],
        "simulate that plan (1 M-request window)": ["splitplan", "simulate", "--trace", str(trace), "--plan",
                                                    str(plan_dir / "plan.json"), "--format", "json"],
    }
    print(f"{args.requests:,}-request trace ({trace.stat().st_size / 1e6:,.0f} MB CSV)\n")
    print("| command | wall s | peak RSS MB |")
    print("|---|---|---|")
    for name, command in cases.items():
        seconds, rss = run(command)
        print(f"| {name} | {seconds:.1f} | {rss:,.0f} |")
        sys.stdout.flush()
    window = json.loads((plan_dir / "plan.json").read_text())["inputs"]["window"]
    print(f"\noptimize sized on requests {window['start_s']:.0f}-{window['end_s']:.0f} s "
          f"({window['requests']:,} of {window['of']:,}, {window['rate_rps']:.0f} req/s)")


if __name__ == "__main__":
    main()
