"""MoE accuracy (issue 17): DeepSeek, Qwen3-MoE and gpt-oss deployments measured by NVIDIA
aiconfigurator, replayed as closed loops, against splitplan's predictions.

    python bench/moe_accuracy.py [--data PATH] [--jobs N] [--max-concurrency N] [--no-cv]

Takes the runs of `../shared/data/perf/aiconfigurator_silicon_sample.csv` that the catalog can
model: DeepSeek-R1 / DeepSeek-V3 and their NVFP4 checkpoints (same architecture: `deepseek-v3`),
Qwen3-235B-A22B (`qwen3-235b-a22b`) and gpt-oss-120b, on H100, H200, B200 and GB200 NVL72
(`gb200-nvl72`), fp8 or fp4 weights (gpt-oss's MXFP4 on Hopper, which has no fp4 tensor cores,
weight-only as the engines run it),
aggregated (one co-located instance) and disaggregated (prefill and decode workers), in every
layout the file records (`tp_size`, `attention_dp_size`, `moe_ep_size`, `pp_size`, and the
`prefill_`/`decode_` ones), at most `--max-concurrency` clients. Each run is replayed as the
benchmark ran it (sim.deployments.replay: `concurrency` clients, ten requests each, one to
an instance's share) and its mean TTFT and mean TPOT compared with the measured ones.

Two predictions (three with `--kernel-curves`: the shipped profiles timed by their engine's
measured kernel curves, issue 55; four with `--deepep`: those with the expert exchange timed by
DeepEP's measured kernels too, `expert_all_to_all: deepep`):
- shipped: the engine's shipped profile (`vllm-fp8`, `sglang-fp8`, `trtllm-fp8`), fitted on dense
  models only (bench/fidelity.py): every MoE run is held out from that fit.
- cv: held-out folds by machine. For each engine and each machine, the profile's
  DEPLOYMENT_FACTORS are refitted (sim.deployments.fit_deployments) on that engine's MoE runs on
  the other machines and predict the held-out machine's runs.

Prints, per (engine, machine, mode, layout kind), the runs, MAPE % and median signed error %
(predicted over measured, minus 1) of mean TTFT and mean TPOT, then the overall lines and
`N runs` (with the rows left out, by reason).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import pandas as pd

from splitplan.base.errors import SpecError
from splitplan.base.parallel import run_units
from splitplan.base.runner import Runner
from splitplan.sim import deployments
from splitplan.sim.deployments import fit_deployments, replay, run_pools
from splitplan.specs.engine import EngineProfile, load_engine
from splitplan.specs.layout import Layout
from splitplan.specs.model import load_model

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "perf" / "aiconfigurator_silicon_sample.csv"
MODELS = {"deepseek-ai/DeepSeek-R1": "deepseek-v3", "deepseek-ai/DeepSeek-V3": "deepseek-v3",
          "nvidia/DeepSeek-R1-NVFP4": "deepseek-v3", "nvidia/DeepSeek-V3.1-NVFP4": "deepseek-v3",
          "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b", "openai/gpt-oss-120b": "gpt-oss-120b"}
MACHINES = {**deployments.MACHINES, "gb200": "gb200-nvl72"}


def _layout(row: pd.Series, prefix: str = "", moe: bool = True) -> str:
    """aiconfigurator's layout columns as a splitplan layout (`tp8`, `dp8ep8`): attention TP x DP
    on every stage, the experts over EP of them (their TP the rest), PP stages; a dense model's
    TP and PP (its rows' MoE columns hold 0 or nothing)."""
    def get(col):
        value = row.get(prefix + col)
        return 1 if pd.isna(value) or (value == 0 and not moe) else int(value)
    tp, dp, ep, pp = get("tp_size"), get("attention_dp_size"), get("moe_ep_size"), get("pp_size")
    if not moe:
        return Layout(tp, dp, 1, pp).spec
    if tp * dp != get("moe_tp_size") * ep:
        raise ValueError(f"attention TP x DP {tp * dp} != MoE TP x EP {get('moe_tp_size') * ep}")
    return Layout(tp, dp, ep, pp).spec


def runs_of(path: Path, max_concurrency: int, models: dict[str, str] = MODELS) -> tuple[pd.DataFrame, dict[str, int]]:
    """The runs of `models` (the sample's model_path: a catalog name) the catalog can model, and how
    many were left out, by reason."""
    raw = pd.read_csv(path)
    raw = raw[raw.model_path.isin(list(models))]
    dropped: dict[str, int] = {}
    rows = []
    moe_models = {name for name in set(models.values()) if load_model(name).is_moe}
    for _, r in raw.iterrows():
        moe = models[r.model_path] in moe_models
        # the benchmark's clients (with attention DP, `batch_size` is per DP rank); aggregated runs
        # that do not record it ran `batch_size`
        recorded = re.search(r"silicon_concurrency=(\d+)", str(r.silicon_data_source))
        concurrency = int(recorded.group(1)) if recorded else (int(r.batch_size) if r["mode"] == "agg" else 0)
        # an aggregated run's clients are at most batch_size x TP x attention DP where it records both (its
        # batch_size per GPU or per DP rank: 3,599 of the sample's 3,607 such rows); more ran on instances
        # the row does not count (TensorRT-LLM's Qwen3-32B-NVFP4 runs: 416 clients at batch 13 and TP 2,
        # 15,000-token prompts at 719 ms TTFT, which two GPUs cannot prefill)
        dp = r.attention_dp_size if r.attention_dp_size >= 1 else 1  # (0 or not recorded: none)
        one_instance = r.batch_size * r.tp_size * dp if r["mode"] == "agg" else np.inf  # (NaN where not recorded: kept)
        reason = ("machine not in the catalog" if r.system not in MACHINES else
                  "no concurrency recorded" if concurrency < 1 else
                  "aggregated, more clients than one instance's batch (instances not recorded)"
                  if recorded and concurrency > one_instance else
                  "disaggregated, no worker counts recorded" if r["mode"] != "agg"
                  and (pd.isna(r.prefill_num_workers) or pd.isna(r.decode_num_workers)) else
                  "precision other than fp8/fp4" if r.precision not in ("fp8", "fp4") else
                  f"more than {max_concurrency} clients" if concurrency > max_concurrency else
                  "missing or non-positive latency" if not (r.silicon_ttft_ms > 0 and r.silicon_tpot_ms > 0) else "")
        run = {"model": models[r.model_path], "machine": MACHINES.get(r.system), "engine": r.backend, "mode": r["mode"],
               "weights": r.precision, "concurrency": concurrency, "isl": int(r.isl), "osl": int(r.osl),
               "ttft_ms": float(r.silicon_ttft_ms), "tpot_ms": float(r.silicon_tpot_ms)}
        try:
            if r["mode"] == "agg":
                run |= {"layout": _layout(r, moe=moe)}
            else:
                run |= {"prefill_layout": _layout(r, "prefill_", moe), "prefill_workers": int(r.prefill_num_workers),
                        "decode_layout": _layout(r, "decode_", moe), "decode_workers": int(r.decode_num_workers)}
        except ValueError:
            reason = reason or "inconsistent layout columns"
        if reason:
            dropped[reason] = dropped.get(reason, 0) + 1
            continue
        rows.append(run)
    return pd.DataFrame(rows), dropped


def kind(run: dict) -> str:
    """TP alone on one machine, EP on one machine, or instances over several machines."""
    pools, _ = run_pools(run, load_engine(_profile(run)))
    if any(p.perf.unit_machines > 1 for p in pools):
        return "over machines"
    return "EP or DP" if any(p.perf.layout != Layout(p.perf.layout.tp) for p in pools) else "TP"


def _profile(run: dict) -> str:
    """The engine's shipped profile, with fp4 weights where the run had them."""
    return f"{run['engine']}-fp8" + ("@weights=fp4" if run["weights"] == "fp4" else "")


def _unit(profile, run):
    """`run` replayed with `profile`: a profile, or None (the engine's shipped one) or "curves" (that one
    timed by its engine's measured kernel curves, `kernel_curves`) or "deepep" (and its expert exchange
    by DeepEP's)."""
    if not isinstance(profile, EngineProfile):
        shipped = load_engine(_profile(run))
        curved = {"kernel_curves": run["engine"], "expert_all_to_all": "deepep" if profile == "deepep" else None}
        profile = shipped.model_copy(update=curved) if profile in ("curves", "deepep") else shipped
    try:
        return replay(run, profile)
    except SpecError:  # a layout the catalog model cannot take (heads, experts)
        return float("nan"), float("nan")


def predict(runs: pd.DataFrame, jobs: int, profile=None) -> np.ndarray:
    return np.array(run_units(_unit, runs.to_dict("records"), profile, jobs=jobs), float).reshape(-1, 2)


def cross_validated(runs: pd.DataFrame, jobs: int, max_evaluations: int, train_runs: int) -> np.ndarray:
    """Held-out predictions: per engine and weights, each machine predicted by the shipped profile
    refitted on the other machines' runs (at most `train_runs` of them, drawn with a fixed seed:
    every fit replays its training runs some 7 x `max_evaluations` times); NaN where the engine
    ran on one machine only."""
    out = np.full((len(runs), 2), np.nan)
    runner: Runner = lambda fn, units, shared: run_units(fn, units, shared, jobs=jobs)  # noqa: E731
    for (engine, weights), group in runs.groupby(["engine", "weights"]):
        base = load_engine(_profile({"engine": engine, "weights": weights}))
        for machine in sorted(group.machine.unique()):
            train, held = group[group.machine != machine], group[group.machine == machine]
            if train.empty:
                continue
            train = train.sample(min(len(train), train_runs), random_state=0)
            fitted = fit_deployments(train, base, max_evaluations, runner)
            out[held.index] = predict(held, jobs, fitted)
            print(f"  fitted {engine} {weights} without {machine} on {len(train)} runs", flush=True)
    return out


def errors_pct(runs, predicted):
    """Signed errors % of TTFT and TPOT (n, 2): predicted over measured, minus 1."""
    return (predicted / runs[["ttft_ms", "tpot_ms"]].to_numpy(float) - 1) * 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--max-concurrency", type=int, default=64)
    parser.add_argument("--max-evaluations", type=int, default=6)
    parser.add_argument("--train-runs", type=int, default=40, help="runs each held-out fit is fitted on, at most")
    parser.add_argument("--no-cv", action="store_true", help="the shipped profiles only")
    parser.add_argument("--kernel-curves", action="store_true",
                        help="also the shipped profiles timed by their engine's measured kernel curves (issue 55)")
    parser.add_argument("--deepep", action="store_true", help="also those with the expert exchange on DeepEP's measured kernels")
    args = parser.parse_args()
    runs, dropped = runs_of(args.data, args.max_concurrency)
    shipped = predict(runs, args.jobs)
    fits = ~np.isnan(shipped[:, 0])
    runs, shipped = runs[fits].reset_index(drop=True), shipped[fits]
    dropped["an instance cannot hold the model (memory, heads or experts)"] = int((~fits).sum())
    runs["kind"] = [kind(r) for r in runs.to_dict("records")]
    tags = {"shipped": shipped}
    if args.kernel_curves:
        tags["curves"] = predict(runs, args.jobs, "curves")
    if args.deepep:
        tags["deepep"] = predict(runs, args.jobs, "deepep")
    if not args.no_cv:
        print("cross-validating by machine:", flush=True)
        tags["cv"] = cross_validated(runs, args.jobs, args.max_evaluations, args.train_runs)
    print(f"\n{len(runs)} MoE runs (at most {args.max_concurrency} clients)\n")
    print("| engine | machine | mode | layout | runs | " + " | ".join(
        f"TTFT MAPE % {t} | TTFT median % {t} | TPOT MAPE % {t} | TPOT median % {t}" for t in tags) + " |")
    print("|---|---|---|---|---|" + "---|" * 4 * len(tags))
    errs = {t: errors_pct(runs, p) for t, p in tags.items()}
    for key, group in runs.groupby(["engine", "machine", "mode", "kind"]):
        cells = []
        for t in tags:
            e = errs[t][group.index]
            cells += [f"{np.nanmean(np.abs(e[:, 0])):.0f}", f"{np.nanmedian(e[:, 0]):+.0f}",
                      f"{np.nanmean(np.abs(e[:, 1])):.0f}", f"{np.nanmedian(e[:, 1]):+.0f}"] if np.isfinite(e).any() else ["-"] * 4
        print(f"| {' | '.join(key)} | {len(group)} | " + " | ".join(cells) + " |")
    print()
    for t, e in errs.items():
        for mode in ("agg", "disagg", None):
            sel = (runs["mode"] == mode).to_numpy() if mode else np.ones(len(runs), bool)
            x = e[sel]
            x = x[np.isfinite(x[:, 0])]
            print(f"{mode or 'all'} runs, {t}: {len(x)} runs, TTFT MAPE {np.mean(np.abs(x[:, 0])):.0f} % "
                  f"(median {np.median(x[:, 0]):+.0f} %), TPOT MAPE {np.mean(np.abs(x[:, 1])):.0f} % (median {np.median(x[:, 1]):+.0f} %)")
    print(f"{len(runs)} runs; left out: " + "; ".join(f"{n} {reason}" for reason, n in sorted(dropped.items())))


if __name__ == "__main__":
    main()
