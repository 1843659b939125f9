"""Calibration accuracy on the Splitwise measurements: fitted and cross-validated,
and how a fit carries to machines and models it has not seen.

    python bench/calibration.py [--data PATH] [--folds 5]

1. The same call as `splitplan calibrate --perf-db DATA --max-prefill-batch-tokens 2048`
   (the command that wrote engine_profiles/splitwise-vllm.yaml): MAPE per (model,
   machine, TP, phase) before (lean), fitted, and k-fold cross-validated.
2. Transfer: fit on one machine (or model) only, predict the other, compared with
   the uncalibrated `lean` defaults (TP 8 sweeps, single-prompt prefills).
3. Measurement noise of the prefill medians: how far a median moves when its
   repeats are resampled (bootstrap), next to the model's cross-validated error.
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import pandas as pd

from splitplan import api
from splitplan.perf import calibrate as cal
from splitplan.perf.measurements import read_measurements
from splitplan.specs.engine import load_engine

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "perf" / "splitwise_perf_model.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--folds", type=int, default=5)
    args = parser.parse_args()
    result = api.calibrate(str(args.data), "lean", args.folds, max_prefill_batch_tokens=2048, jobs=os.cpu_count() or 1)
    print(f"| model | hardware | TP | phase | points | before (lean) | fitted | {args.folds}-fold CV |")
    print("|---|---|---|---|---|---|---|---|")
    for g in result.report["groups"]:
        print(f"| {g['model']} | {g['hardware']} | {g['tp']} | {g['phase']} | {g['points']} | {g['mape_before_pct']:.1f} "
              f"| {g['mape_fit_pct']:.1f} | {g['mape_cv_pct']:.1f} |")
    for phase, o in result.report["overall"].items():
        print(f"| all | | | {phase} | {o['points']} | {o['mape_before_pct']:.1f} | {o['mape_fit_pct']:.1f} | {o['mape_cv_pct']:.1f} |")

    points = cal.transfer_points(read_measurements(args.data))
    lean = load_engine("lean")
    print("\n| fitted on | predicted | phase | MAPE calibrated | MAPE lean |")
    print("|---|---|---|---|---|")
    for column, train, test in (("hardware", "a100-80gb", "h100-80gb"), ("hardware", "h100-80gb", "a100-80gb"),
                                ("model", "llama2-70b", "bloom-176b"), ("model", "bloom-176b", "llama2-70b")):
        mape = cal.transfer_mape(points, column, train, test, lean)
        for phase in ("prefill", "decode"):
            print(f"| {train} | {test} | {phase} | {mape[phase][0]:.1f} | {mape[phase][1]:.1f} |")

    print_noise(args.data)


def print_noise(data: Path) -> None:
    """How far the prefill medians (the fitted points) move when their repeats are resampled."""
    raw = pd.read_csv(data)
    raw = raw[(raw.batch_size == 1) | (raw.batch_size * raw.prompt_size <= 2048)]
    rng = np.random.default_rng(0)
    moves = {}
    for (model, hw, tp), rows in raw.groupby(["model", "hardware", "tensor_parallel"]):
        per_point = []
        for _, point in rows.groupby(["batch_size", "prompt_size"]):
            x = point.prompt_time.to_numpy()
            per_point.append(np.mean(np.abs(np.median(rng.choice(x, (1000, len(x))), axis=1) / np.median(x) - 1)) * 100)
        moves[(model, hw, tp)] = np.mean(per_point)
    print(f"\nPrefill measurement noise: resampling the repeats moves a group's medians by "
          f"{min(moves.values()):.1f} to {max(moves.values()):.1f} % on average (bootstrap, {len(moves)} groups).")


if __name__ == "__main__":
    main()
