"""MoE accuracy (issue 17): DeepSeek and Qwen3-MoE deployments measured by NVIDIA aiconfigurator,
replayed as closed loops, against splitplan's predictions.

    python bench/moe_accuracy.py [--data PATH] [--jobs N] [--max-concurrency N]

Takes the aggregated runs of `../shared/data/perf/aiconfigurator_silicon_sample.csv` that the
catalog can model today: DeepSeek-R1 / DeepSeek-V3 (same architecture: `deepseek-v3`) and
Qwen3-235B-A22B (`qwen3-235b-a22b`), on H100/H200/B200, TP within one machine with no pipeline,
attention-DP or expert parallelism (the wide-EP and disaggregated rows wait for issue 17's
layouts), fp8 or fp4 weights (`--weights fp4`). Each run is replayed as the benchmark ran it
(sim.deployments.replay: `concurrency` clients, ten requests each) under the engine's shipped
profile (`vllm-fp8`, `sglang-fp8`, `trtllm-fp8`) and under the uncalibrated `lean-fp8`.

Every MoE run is held out: the shipped profiles were fitted on dense models only (bench/fidelity.py),
so this is the error a planner sees on a model family none of its fits has seen. Prints, per
(model, engine, machine, weights), the runs, MAPE % and median signed error % (predicted over
measured, minus 1) of mean TTFT and mean TPOT, then `N runs` overall.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from splitplan.parallel import run_units
from splitplan.perf.roofline import Instance
from splitplan.sim.deployments import MACHINES, replay
from splitplan.specs.engine import load_engine
from splitplan.specs.hardware import load_hardware
from splitplan.specs.model import load_model

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "perf" / "aiconfigurator_silicon_sample.csv"
MODELS = {"deepseek-ai/DeepSeek-R1": "deepseek-v3", "deepseek-ai/DeepSeek-V3": "deepseek-v3",
          "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b"}


def runs_of(path: Path, max_concurrency: int) -> pd.DataFrame:
    raw = pd.read_csv(path)
    one = lambda col: raw[col].fillna(1).astype(float) == 1  # noqa: E731 - (empty means 1)
    keep = (raw["mode"] == "agg") & raw.model_path.isin(list(MODELS)) & raw.system.isin(list(MACHINES)) \
        & raw.precision.isin(["fp8", "fp4"]) & one("pp_size") & one("attention_dp_size") & one("moe_ep_size") \
        & (raw.batch_size <= max_concurrency) & (raw.silicon_ttft_ms > 0) & (raw.silicon_tpot_ms > 0)
    kept = raw[keep]
    return pd.DataFrame({
        "model": kept.model_path.map(MODELS), "machine": kept.system.map(MACHINES), "engine": kept.backend,
        "weights": kept.precision, "tp": kept.tp_size.astype(int), "concurrency": kept.batch_size.astype(int),
        "isl": kept.isl.astype(int), "osl": kept.osl.astype(int),
        "ttft_ms": kept.silicon_ttft_ms.astype(float), "tpot_ms": kept.silicon_tpot_ms.astype(float),
    }).reset_index(drop=True)


def _profile(tag: str, run: dict) -> str:
    """The engine's shipped profile, or lean-fp8; with fp4 weights where the run had them."""
    base = f"{run['engine']}-fp8" if tag == "shipped" else tag
    return base + ("@weights=fp4" if run["weights"] == "fp4" else "")


def _unit(tag, run):
    """Predicted (TTFT, TPOT) ms of one run; NaN where the instance cannot hold the model."""
    profile = load_engine(_profile(tag, run))
    inst = Instance(load_model(run["model"]), load_hardware(run["machine"]), profile, int(run["tp"]))
    return replay(run, profile) if inst.fit.fits else (float("nan"), float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--max-concurrency", type=int, default=64)
    args = parser.parse_args()
    runs = runs_of(args.data, args.max_concurrency)
    measured = runs[["ttft_ms", "tpot_ms"]].to_numpy(float)
    print(f"{len(runs)} aggregated MoE runs (TP only, at most {args.max_concurrency} clients), all held out from every fit\n")
    print("| model | engine | machine | weights | runs | profile | TTFT MAPE % | TTFT median % | TPOT MAPE % | TPOT median % |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    overall = {}
    for tag in ("shipped", "lean-fp8"):
        predicted = np.array(run_units(_unit, runs.to_dict("records"), tag, jobs=args.jobs), float).reshape(-1, 2)
        err = (predicted / measured - 1) * 100
        frame = runs.assign(ttft_err=err[:, 0], tpot_err=err[:, 1])
        for key, group in frame.groupby(["model", "engine", "machine", "weights"]):
            t, p = group.ttft_err.dropna(), group.tpot_err.dropna()
            print(f"| {' | '.join(key)} | {len(group)} | {tag} | {t.abs().mean():.0f} | {t.median():+.0f} | "
                  f"{p.abs().mean():.0f} | {p.median():+.0f} |")
        overall[tag] = (np.nanmean(np.abs(err[:, 0])), np.nanmedian(err[:, 0]), np.nanmean(np.abs(err[:, 1])),
                        np.nanmedian(err[:, 1]), int(np.isnan(err[:, 0]).sum()))
    print()
    for tag, (tm, tb, pm, pb, missing) in overall.items():
        print(f"all runs, {tag}: TTFT MAPE {tm:.0f} % (median {tb:+.0f} %), TPOT MAPE {pm:.0f} % (median {pb:+.0f} %)"
              + (f"; {missing} runs not predicted" if missing else ""))
    print(f"{len(runs)} runs")


if __name__ == "__main__":
    main()
