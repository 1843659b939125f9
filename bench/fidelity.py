"""Fidelity on today's engines: measured deployments against closed-loop simulation.

    python bench/fidelity.py [--data PATH] [--default lean-fp8] [--jobs N]

NVIDIA aiconfigurator's silicon sample (../shared/data/perf, Apache-2.0) holds measured
serving runs: an engine (vLLM, SGLang, TensorRT-LLM), a machine, fixed input/output
lengths, a concurrency and a layout, with the run's mean TTFT and mean TPOT. Every run the
catalog can model (aggregated, fp8, dense Llama-3.1-70B / Llama-3.1-8B / Qwen3-32B, TP
only, on H100, H200, B200; see perf/deployments.py) is replayed as the benchmark ran it, a
closed loop of `concurrency` clients on one instance.

Per engine: the profile `splitplan calibrate --deployments ... --backend ENGINE` fits,
judged on held-out folds only (each machine predicted by a fit without it; SGLang, one
machine, by concurrency band), and the uncalibrated default (`--default`, lean-fp8),
which was fitted to nothing here. Prints MAPE % and median signed error % of TTFT and
TPOT per engine, machine and concurrency band. Targets (issue 13): held-out MAPE <= 15 %
per engine at every band, no median bias beyond +-10 %. About 20 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from splitplan import api
from splitplan.perf import deployments as dep
from splitplan.specs.engine import load_engine

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "perf" / "aiconfigurator_silicon_sample.csv"


def fmt(value) -> str:
    return "" if value is None or (isinstance(value, float) and np.isnan(value)) else f"{value:+.1f}" if value < 0 else f"{value:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT)
    parser.add_argument("--default", default="lean-fp8")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    runs, dropped = dep.read_deployments(args.data)
    print(f"{len(runs)} runs modelled; left out: " + "; ".join(f"{n} {reason}" for reason, n in dropped.items()) + "\n")
    print("| engine | machine | concurrency | runs | held-out TTFT MAPE % | TTFT median err % | held-out TPOT MAPE % "
          "| TPOT median err % | default TTFT MAPE % | TTFT median err % | default TPOT MAPE % | TPOT median err % |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for backend in sorted(runs.engine.unique()):
        start = time.perf_counter()
        cal = api.calibrate_deployments(str(args.data), backend, args.default, True, args.jobs)
        mine = cal.runs
        default = dep.error_table(mine, dep.predict(mine, load_engine(args.default), args.jobs), None)
        for held, base in zip(cal.table.to_dict("records"), default.to_dict("records")):
            print(f"| {backend} | {held['machine']} | {held['band']} | {held['runs']} "
                  f"| {fmt(held['ttft_mape_cv_pct'])} | {fmt(held['ttft_bias_cv_pct'])} "
                  f"| {fmt(held['tpot_mape_cv_pct'])} | {fmt(held['tpot_bias_cv_pct'])} "
                  f"| {fmt(base['ttft_mape_fit_pct'])} | {fmt(base['ttft_bias_fit_pct'])} "
                  f"| {fmt(base['tpot_mape_fit_pct'])} | {fmt(base['tpot_bias_fit_pct'])} |")
        print(f"<!-- {backend}: {time.perf_counter() - start:.0f} s; held out {cal.profile.fit['folds']} -->")


if __name__ == "__main__":
    main()
