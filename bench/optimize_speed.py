"""Wall time of `splitplan optimize` as whole processes (import included).

    python bench/optimize_speed.py

Cases: the whole catalog on the embedded Azure code trace (defaults), and the Azure
conversation trace resampled at 70 req/s for 120 s. Target: under 5 s each on a
2-core machine (pool options are sized in one process per core; the `--jobs 1` case shows
one core). Prints one markdown row per case (best of 3 runs) and peak RSS.
"""

from __future__ import annotations

import resource
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


def main() -> None:
    print("| case | wall s (best of 3) | peak RSS MB |")
    print("|---|---|---|")
    for name, cmd in CASES.items():
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            best = min(best, time.perf_counter() - start)
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"| {name} | {best:.2f} | {rss:.0f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
