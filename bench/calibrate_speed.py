"""Wall and CPU time of `splitplan calibrate --deployments` per engine, as whole processes.

    python bench/calibrate_speed.py [--data CSV] [--backend NAME ...] [--jobs N]

Each backend of aiconfigurator's silicon sample (default: ../shared/data/perf/) is fitted as the
README's commands fit it (from `lean-fp8`: the fit, then the held-out folds by machine), into a temporary folder.
Target (issue 31): at most 120 s per engine. Prints one markdown row per backend: runs replayed,
wall seconds, CPU seconds (the process and its workers, user and system), peak RSS of one process.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from optimize_speed import run  # noqa: E402  (one way of timing a process for the benches)

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "perf" / "aiconfigurator_silicon_sample.csv"
BACKENDS = ["vllm", "sglang", "trtllm"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--backend", nargs="*", default=BACKENDS)
    parser.add_argument("--jobs", type=int, default=0, help="passed to calibrate (0: one process per core)")
    args = parser.parse_args()
    from splitplan.sim.deployments import read_deployments
    runs, _ = read_deployments(args.data)
    print("| engine | runs | wall s | CPU s | peak RSS MB |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for backend in args.backend:
            cmd = ["splitplan", "calibrate", "--deployments", args.data, "--backend", backend, "--jobs", str(args.jobs),
                   "--output", str(Path(folder) / f"{backend}.yaml")]
            wall, cpu, rss = run(cmd)
            print(f"| {backend} | {int((runs.engine == backend).sum())} | {wall:.0f} | {cpu:.0f} | {rss:.0f} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
