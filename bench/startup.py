"""Start-up time of the CLI: `splitplan --help` and two small commands, in fresh processes.

    python bench/startup.py [--runs N]

Prints the median wall time of each (issue 15's target: under 0.5 s) and exits 1 if one
misses it. The heavy libraries (pandas, SciPy, PuLP) load only when a command needs them
(cli.common.api, workload.trace); tests/test_cli.py checks that they are not imported at start.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = [["--help"], ["--version"], ["hardware", "list"]]
TARGET_S = 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    worst = 0.0
    print("| command | median s | target s |\n|---|---|---|")
    for command in COMMANDS:
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", "from splitplan.cli import main; main()", *command],
                           check=True, stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        worst = max(worst, median)
        print(f"| splitplan {' '.join(command)} | {median:.2f} | {TARGET_S} |")
    sys.exit(0 if worst < TARGET_S else 1)


if __name__ == "__main__":
    main()
