"""Wall and CPU time of `splitplan optimize` as whole processes (import included).

    python bench/optimize_speed.py

Cases: the whole catalog on the embedded Azure code trace (defaults), and the Azure
conversation trace resampled at 70 req/s for 120 s. Target: under 5 s each on a
2-core machine (pool options are sized in one process per core; the `--jobs 1` case shows
one core). Prints one markdown row per case: the best of 3 runs' wall time, that run's CPU
seconds (the process and the sizing processes it started, user and system) and the largest
peak RSS of one process of the 3 runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

CONV = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "azure_conv_2023.csv"
CASES = {
    "embedded Azure code trace, whole catalog": ["splitplan", "optimize", "--format", "json"],
    "Azure conversation, 70 req/s x 120 s, whole catalog": ["splitplan", "optimize", "--trace", str(CONV), "--rate", "70",
                                                              "--duration", "120", "--format", "json"],
    "embedded Azure code trace, whole catalog, --jobs 1": ["splitplan", "optimize", "--format", "json", "--jobs", "1"],
}


def run(cmd: list[str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MB) of one run of `cmd` (its own rusage, by wait4: the CPU of the
    processes it waited for included)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    print("| case | wall s (best of 3) | CPU s (that run) | peak RSS MB |")
    print("|---|---|---|---|")
    for name, cmd in CASES.items():
        runs = [run(cmd) for _ in range(3)]
        wall, cpu, _ = min(runs)
        print(f"| {name} | {wall:.2f} | {cpu:.2f} | {max(r[2] for r in runs):.0f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
