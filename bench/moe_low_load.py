"""What the MoE runs' optimistic TTFT is made of (issue 55): the passes at low load, and what a fitted factor would have to be.

    python bench/moe_low_load.py [--data PATH] [--jobs N] [--max-evaluations N]

At 1-4 clients little queues, so a run's mean TTFT is about one prefill pass. Prints, from
aiconfigurator's sample (`../shared/data/perf/`, the runs bench/moe_accuracy.py replays):
1. the aggregated MoE runs at 1-4 clients, per engine, machine, model, weights, layout and input
   length: the median measured mean TTFT and TPOT beside the shipped profiles' replay and the same
   profiles timed by their engine's measured kernel curves (`kernel_curves`);
2. the dense aggregated runs at 1-4 clients (bench/fidelity.py's), alike, for comparison;
3. `moe_efficiency` (the routed experts' share of the GEMM peak, the one factor only MoE layers
   read; 1 in the shipped SGLang and TensorRT-LLM profiles, fitted on dense runs) fitted alone per
   engine and weight precision to the aggregated MoE runs at up to 64 clients, within 0.02-1:
   its value, whether it ends on a bound, and the TTFT and TPOT error (MAPE / median %) shipped,
   fitted in-sample, and held out by machine (each machine predicted by the fit on the others);
4. which form the shipped profiles' TTFT error takes on the fp8 MoE runs, per engine and load:
   measured = a + b x predicted (a latency every request adds: a floor) or m x predicted (a
   factor, as `--confidence` applies it), each fitted by soft-L1 least squares on log ratios,
   with its MAPE.
"""

from __future__ import annotations

import argparse
from functools import partial

import numpy as np
import pandas as pd
from moe_accuracy import DEFAULT, runs_of
from moe_accuracy import _profile as moe_profile

from splitplan.base.parallel import run_units
from splitplan.sim import deployments as dep
from splitplan.specs.engine import load_engine

LOW = 4  # clients: at most this many, a run's TTFT is about one pass
MOE_FACTOR = {"moe_efficiency": (0.02, 1.0, 0.1)}


def _table(frame: pd.DataFrame, keys: list[str]) -> str:
    rows = frame.groupby(keys).agg(runs=("ttft_ms", "size"), ttft=("ttft_ms", "median"), shipped=("ttft_shipped", "median"),
                                   curves=("ttft_curves", "median"), tpot=("tpot_ms", "median"),
                                   tpot_shipped=("tpot_shipped", "median"), tpot_curves=("tpot_curves", "median"))
    head = ("| " + " | ".join(keys) + " | runs | TTFT measured ms | shipped | curves | TPOT measured ms | shipped | curves |\n"
            + "|---" * (len(keys) + 7) + "|\n")
    return head + "\n".join("| " + " | ".join(str(k) for k in (key if isinstance(key, tuple) else (key,))) + f" | {r.runs:.0f} | "
                            + " | ".join(f"{v:.1f}" for v in r.iloc[1:]) + " |" for key, r in rows.iterrows())


def _predicted(frame: pd.DataFrame, profile_of, jobs: int) -> pd.DataFrame:
    runner = partial(run_units, jobs=jobs)
    out = frame.copy()
    for tag, curved in (("shipped", False), ("curves", True)):
        values = np.full((len(frame), 2), np.nan)
        for name, group in frame.groupby(frame.apply(profile_of, axis=1)):
            profile = load_engine(name)
            if curved:
                profile = profile.model_copy(update={"kernel_curves": group.engine.iloc[0]})
            values[group.index] = dep.predict(group, profile, runner)
        out[f"ttft_{tag}"], out[f"tpot_{tag}"] = values[:, 0], values[:, 1]
    return out


def _error(predicted: np.ndarray, measured: np.ndarray) -> str:
    e = (predicted / measured - 1) * 100
    cells = []
    for j in range(2):
        x = e[:, j][np.isfinite(e[:, j])]
        cells.append(f"{np.mean(np.abs(x)):.0f} / {np.median(x):+.0f}" if len(x) else "-")
    return " | ".join(cells)


def _moe_factor_fits(runs: pd.DataFrame, jobs: int, max_evaluations: int) -> None:
    run = partial(run_units, jobs=jobs)
    print("| engine | weights | runs | moe_efficiency (all runs) | on a bound | held-out fits | TTFT shipped | TPOT shipped "
          "| TTFT fitted | TPOT fitted | TTFT held out | TPOT held out |\n" + "|---" * 12 + "|")
    for (engine, weights), group in runs.groupby(["engine", "weights"]):
        group = group.reset_index(drop=True)
        base = load_engine(moe_profile({"engine": engine, "weights": weights}))
        shipped = group[["ttft_shipped", "tpot_shipped"]].to_numpy(float)  # (predicted by `_predicted`)
        keep = np.isfinite(shipped[:, 0])
        group, shipped = group[keep].reset_index(drop=True), shipped[keep]
        fit = partial(dep.fit_deployments, base=base, max_evaluations=max_evaluations, run=run, factors=tuple(MOE_FACTOR),
                      table=MOE_FACTOR)
        fitted = fit(group)
        held = np.full_like(shipped, np.nan)
        folds = []
        for machine in sorted(group.machine.unique()):
            out = (group.machine == machine).to_numpy()
            if out.all():
                break
            fold = fit(group[~out])
            held[out] = dep.predict(group[out], fold, run)
            folds.append(f"{machine}: {fold.defaults.moe_efficiency:.3g}")
        measured = group[["ttft_ms", "tpot_ms"]].to_numpy(float)
        bound = ", ".join((fitted.fit or {}).get("at_bound", {}).values()) or "no"
        print(f"| {engine} | {weights} | {len(group)} | {fitted.defaults.moe_efficiency:.3g} | {bound} | "
              f"{'; '.join(folds) or '-'} (without it) | {_error(shipped, measured)} | "
              f"{_error(dep.predict(group, fitted, run), measured)} | {_error(held, measured)} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=DEFAULT)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--max-evaluations", type=int, default=12)
    args = parser.parse_args()
    moe, _ = runs_of(args.data, 64)
    moe = _predicted(moe[moe["mode"] == "agg"].reset_index(drop=True), moe_profile, args.jobs)  # (every table's, once)
    print(f"## MoE aggregated runs at 1-{LOW} clients (medians)\n")
    print(_table(moe[moe.concurrency <= LOW], ["engine", "machine", "model", "weights", "layout", "isl"]))
    dense, _ = dep.read_deployments(args.data)
    dense = dense[(dense.concurrency <= LOW) & (dense.precision == "fp8")].reset_index(drop=True)
    dense = _predicted(dense, lambda r: f"{r.engine}-fp8", args.jobs)
    print(f"\n## Dense fp8 aggregated runs at 1-{LOW} clients (medians)\n")
    print(_table(dense, ["engine", "machine", "model", "tp", "isl"]))
    print("\n## moe_efficiency fitted alone to the aggregated MoE runs (MAPE / median %)\n")
    _moe_factor_fits(moe, args.jobs, args.max_evaluations)
    print("\n## The shipped profiles' TTFT error on the fp8 MoE runs: a floor or a factor?\n")
    _error_form(moe[moe.weights == "fp8"])


def _error_form(runs: pd.DataFrame) -> None:
    print("| engine | clients | runs | floor a ms | b | MAPE % | factor m | MAPE % |\n|---|---|---|---|---|---|---|---|")
    runs = runs[np.isfinite(runs.ttft_shipped)]
    for engine, group in runs.groupby("engine"):
        for low, high in ((1, 4), (5, 16), (17, 64)):
            band = group[(group.concurrency >= low) & (group.concurrency <= high)]
            if len(band) >= 6:
                (a, b), m, mapes = _forms(band.ttft_shipped.to_numpy(), band.ttft_ms.to_numpy())
                print(f"| {engine} | {low}-{high} | {len(band)} | {a:.0f} | {b:.2f} | {mapes[0]:.0f} | {m:.2f} | {mapes[1]:.0f} |")


def _forms(predicted: np.ndarray, measured: np.ndarray):
    """measured = a + b x predicted, and measured = m x predicted, fitted on log ratios (soft L1): (a, b), m, their MAPEs %."""
    from scipy.optimize import least_squares

    def fit(form, start, lower, upper):
        return least_squares(lambda p: np.log(form(p) / measured), start, bounds=(lower, upper), loss="soft_l1", f_scale=0.1).x
    floor = fit(lambda p: p[0] + p[1] * predicted, [100.0, 1.0], [0, 0.1], [2000, 20])
    factor = fit(lambda p: p[0] * predicted, [2.0], [0.1], [50])[0]
    mapes = [np.mean(np.abs(v / measured - 1)) * 100 for v in (floor[0] + floor[1] * predicted, factor * predicted)]
    return floor, factor, mapes

if __name__ == "__main__":
    main()
