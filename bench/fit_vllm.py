"""Fit the `vllm` engine profiles: bf16 on measured vLLM v0.15.1 runs, fp8 on aiconfigurator's vLLM rows.

    python bench/fit_vllm.py [--data DIR] [--deployments CSV] [--jobs N] [--evaluations N] [--no-cv]
                             [--no-fp8 | --fp8-only] [--write]

bf16 (`engine_profiles/vllm.yaml`): the load stages of `../shared/data/real-runs/` (measured, used
here and never copied into the project) replayed as `bench/real_runs.py` replays them (the run's
chunked scheduler, budget, `max_num_seqs`, memory fraction and prefix cache). The operators are
timed by vLLM's measured kernel curves (`kernel_curves: vllm`, issue 55; the hardware files'
`kernels:`), so on the runs' H100 only the engine's overheads (`OVERHEADS`) are fitted, with
`scipy.optimize.least_squares` (soft-L1 on the log ratio of predicted to measured mean TTFT, TPOT
and E2E, each factor within physical bounds). Then, the overheads held, the factors the curves
replace on H100 (`ROOFLINE_ONLY`) are fitted to the same stages without the curves: the roofline's,
for GPUs that have none (A100-40GB, the capped H100, MI300X, a GPU of the user's; column "without
curves"). What stays fixed is the engine as documented (`base_profile`): chunked prefill, async
scheduling, CUDA-graph decode (about 1 us between graph-launched kernels), vLLM's default budget and
sequence cap on H100-class GPUs, and the roofline's dense GEMM efficiency (`compute_efficiency`,
REFERENCE.md's 75 %, which these runs cannot pin: their prefix cache leaves little prefill).
Held-out error: folds by model, each model's stages predicted by a fit without them.

fp8 (`engine_profiles/vllm-fp8.yaml`): the bf16 profile at fp8 (weights, KV and activations), its
operators timed by the same curves wherever a GPU has them, the engine's overheads kept. Its two
efficiencies are refitted to aiconfigurator's aggregated vLLM runs of catalog models (closed loops,
`splitplan calibrate --deployments`'s replay) as the roofline's for GPUs without curves; on the
runs' own GPUs (H100, H200, B200) the curves time every operator those efficiencies would, so the
profile's error on these runs is out-of-sample (printed for both: the curves, and the scalars as
fitted). `--write` writes both profiles with their provenance and error.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_runs as rr  # noqa: E402

from splitplan.base.parallel import run_units  # noqa: E402
from splitplan.perf.bounds import at_bounds, bounds  # noqa: E402
from splitplan.sim import deployments as dep  # noqa: E402
from splitplan.specs.engine import engine_to_yaml, load_engine  # noqa: E402
from splitplan.specs.hardware import load_hardware  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VLLM_YAML = ROOT / "engine_profiles" / "vllm.yaml"  # (the shipped bf16 profile: --fp8-only and --keep-roofline start from it)
DEPLOYMENTS = ROOT.parent / "shared" / "data" / "perf" / "aiconfigurator_silicon_sample.csv"
# name: (lower, upper, scale); physical bounds
FACTORS = {
    "memory_efficiency": (0.5, 0.92, 1.0),  # a device copy reaches 85-90 % of datasheet bandwidth
    "decode_overhead_s": (0.0, 0.01, 1e-3),
    "prefill_overhead_s": (0.0, 0.03, 1e-3),
    "sequence_overhead_s": (0.0, 2e-4, 1e-5),
    "moe_efficiency": (0.05, 1.0, 1.0),
    "collective_latency_s": (0.0, 5e-5, 1e-5),  # NCCL / custom all-reduce of a few kB: a few to tens of us
    "frontend_latency_s": (0.0, 0.03, 1e-3),
}
FP8_FACTORS = ("compute_efficiency", "memory_efficiency")
# What vLLM's curves time on the runs' H100 in place of these factors: with the curves they move
# nothing there, so they are fitted without the curves, the overheads held, for the GPUs that have none.
ROOFLINE_ONLY = ("memory_efficiency", "moe_efficiency", "collective_latency_s")
OVERHEADS = tuple(n for n in FACTORS if n not in ROOFLINE_ONLY)
CURVED = ("vLLM's measured kernels on this GPU (NVIDIA aiconfigurator-core 0.12.0's tables, its hardware file's kernels:), "
          "the engine's overheads fitted with them (bench/fit_vllm.py, 2026-12) to vLLM v0.15.1 on H100")
FITTED = ("fitted (bench/fit_vllm.py, 2026-12) to vLLM v0.15.1 on H100 without kernel curves, the overheads held: the decode's "
          "achieved bandwidth, the MoE experts' efficiency and the all-reduce latency; dense prefill at REFERENCE.md's 75 % "
          "of peak at this machine's sustained clock")
METRICS = ("ttft_mean", "tpot_mean", "e2e_mean")
SOURCE = ("vLLM v0.15.1 (the measured runs): chunked prefill and async scheduling on by default; "
          "max_num_batched_tokens 8192 and max_num_seqs 1024, vLLM's defaults for its API server on GPUs of 70 GB "
          "or more other than A100 (EngineArgs.get_batch_defaults; 2048 and 256 elsewhere: pass --max-num-batched-tokens "
          "and --max-num-seqs)")

PREFIX_SOURCE = ("vLLM v0.15.1: automatic prefix caching on by default in the V1 engine (enable_prefix_caching), reused in "
                 "whole blocks of block_size 16 (CacheConfig's default on CUDA)")


def base_profile():
    """vLLM as documented, before fitting: `lean`'s datasheet factors with the engine's scheduler."""
    lean = load_engine("lean")
    return lean.model_copy(update={
        "name": "vllm", "kernel_curves": "vllm",
        "description": "vLLM v0.15.1 (bf16): chunked prefill, async scheduling, CUDA graphs; operators timed by vLLM's "
                       "measured kernel curves where a GPU has them, overheads fitted to measured runs",
        "source": "bench/fit_vllm.py on ../shared/data/real-runs (vLLM v0.15.1 on H100, 2026-02); operators by NVIDIA "
                  "aiconfigurator-core 0.12.0's vLLM kernel tables (kernel_curves: vllm)",
        "scheduler": "chunked", "max_num_batched_tokens": 8192, "max_num_seqs": 1024, "scheduler_source": SOURCE,
        "async_scheduling": True, "prefix_caching": True, "kv_block_tokens": 16, "prefix_caching_source": PREFIX_SOURCE,
        "efficiency_sources": {name: _efficiency_source(name, text, lean) for name, text in lean.efficiency_sources.items()},
        # where the fit starts: the decode at about 80 % of bandwidth, graph-launched kernels and
        # sub-millisecond host work per step (overlapped by async scheduling), a few ms of front end
        "frontend_latency_s": 5e-3,
        "defaults": lean.defaults.model_copy(update={
            "kernel_launch_s": 1e-6, "memory_efficiency": 0.78, "decode_overhead_s": 8e-4, "prefill_overhead_s": 5e-4,
            "sequence_overhead_s": 5e-6, "moe_efficiency": 0.5, "collective_latency_s": 5e-6}),
    })


def _efficiency_source(machine: str, lean_source: str, lean) -> str:
    if load_hardware(machine).curves_for("vllm") is not None:
        return CURVED
    return f"{lean_source}; the rest as fitted" if machine in lean.hardware_overrides else FITTED


def with_values(profile, values: dict):
    values = dict(values)
    top = {k: values.pop(k) for k in list(values) if k in type(profile).model_fields}
    return profile.model_copy(update={**top, "defaults": profile.defaults.model_copy(update=values)})


def value(profile, name: str) -> float:
    return getattr(profile, name) if name in type(profile).model_fields else getattr(profile.defaults, name)


def _unit(shared, item):
    data, = shared
    profile, row = item
    out = rr.replay(profile, data, row)
    return [out[f"predicted_{m}"] for m in rr.METRICS]


def predict(profile, stages: pd.DataFrame, data: Path, jobs: int) -> np.ndarray:
    """(stages, len(rr.METRICS)) predicted figures (ms)."""
    items = [(profile, row) for _, row in stages.iterrows()]
    return np.array(run_units(_unit, items, (data,), jobs), float)


def measured(stages: pd.DataFrame) -> np.ndarray:
    return stages[[f"{m}_ms" for m in rr.METRICS]].to_numpy(float)


def fit(profile, stages: pd.DataFrame, data: Path, jobs: int, evaluations: int, names: tuple[str, ...] = tuple(FACTORS)):
    """`profile` with `names` (of FACTORS) fitted to the stages, within perf.bounds' bounds for H100
    (the runs' machine); the factors that ended on a bound in its `fit.at_bound`."""
    names = list(names)
    lower, upper, why = bounds(FACTORS, names, [load_hardware("h100-80gb")], profile.weights)
    scale = np.array([FACTORS[n][2] for n in names])
    target = np.log(measured(stages)[:, :len(METRICS)])

    def residuals(x):
        p = predict(with_values(profile, dict(zip(names, map(float, x), strict=True))), stages, data, jobs)
        return (np.log(p[:, :len(METRICS)]) - target).ravel()

    start = np.clip([value(profile, n) for n in names], lower, upper)
    result = least_squares(residuals, start, bounds=(lower, upper), x_scale=scale, loss="soft_l1", f_scale=0.1,
                           diff_step=1e-2, max_nfev=evaluations)
    fitted = with_values(profile, dict(zip(names, map(float, result.x), strict=True)))
    return fitted.model_copy(update={"fit": {"at_bound": at_bounds(names, result.x, lower, upper, why)}})


def table(stages: pd.DataFrame, columns: dict[str, np.ndarray]) -> pd.DataFrame:
    """MAPE % / median signed error % per model and overall, for each set of predictions."""
    truth = measured(stages)
    rows = []
    for model, idx in list(stages.groupby("model_arg", sort=False).indices.items()) + [("all", np.arange(len(stages)))]:
        row = {"model": model, "stages": len(idx)}
        for tag, pred in columns.items():
            err = (pred[idx] / truth[idx] - 1) * 100
            for k, m in enumerate(rr.METRICS[:3]):
                row[f"{m} {tag}"] = f"{np.abs(err[:, k]).mean():.1f} / {np.median(err[:, k]):+.1f}"
        rows.append(row)
    return pd.DataFrame(rows)


def summary(stages: pd.DataFrame, pred: np.ndarray) -> dict:
    truth = measured(stages)
    err = (pred / truth - 1) * 100
    out = {}
    for k, m in enumerate(rr.METRICS[:3]):
        out[f"{m}_mape_pct"] = round(float(np.abs(err[:, k]).mean()), 1)
        out[f"{m}_bias_pct"] = round(float(np.median(err[:, k])), 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=rr.DATA)
    parser.add_argument("--deployments", type=Path, default=DEPLOYMENTS)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--evaluations", type=int, default=12, help="least-squares steps per fit")
    parser.add_argument("--no-cv", action="store_true", help="skip the held-out folds by model")
    parser.add_argument("--no-fp8", action="store_true", help="skip the fp8 refit")
    parser.add_argument("--fp8-only", action="store_true", help="refit only fp8, from engine_profiles/vllm.yaml as shipped")
    parser.add_argument("--write", action="store_true", help="write engine_profiles/vllm.yaml and vllm-fp8.yaml")
    parser.add_argument("--keep-roofline", action="store_true",
                        help="hold the roofline's factors (ROOFLINE_ONLY) at engine_profiles/vllm.yaml's: the runs barely "
                             "pin them (moe_efficiency, timed only on Mixtral's 5 stages, lands anywhere from 0.2 to 0.9)")
    args = parser.parse_args()
    stages = pd.read_csv(args.data / "runs.csv")
    stages = stages[stages.include == 1].reset_index(drop=True)

    if args.fp8_only:
        fp8 = fit_fp8(load_engine(str(VLLM_YAML)), args)
        if args.write:
            write(None, fp8)
        return
    base = base_profile()
    fitted = fit_bf16(base, stages, args)
    print("fitted:", {n: float(f"{value(fitted, n):.4g}") for n in FACTORS}, flush=True)
    at_bound = fitted.fit["at_bound"]
    columns = {"fitted": predict(fitted, stages, args.data, args.jobs),
               "without curves": predict(fitted.model_copy(update={"kernel_curves": None}), stages, args.data, args.jobs)}
    if not args.no_cv:
        held = np.full_like(columns["fitted"], np.nan)
        for model in stages.model_arg.unique():
            out = (stages.model_arg == model).to_numpy()
            fold = fit(base, stages[~out].reset_index(drop=True), args.data, args.jobs, args.evaluations, OVERHEADS)
            held[out] = predict(fold, stages[out].reset_index(drop=True), args.data, args.jobs)
            print(f"held out {model}:", {n: float(f"{value(fold, n):.4g}") for n in OVERHEADS}, flush=True)
        columns["held out"] = held
    columns["lean"] = predict(load_engine("lean"), stages, args.data, args.jobs)
    print(f"\n{len(stages)} stages; MAPE % / median signed error %\n")
    print(rr.markdown(table(stages, columns)))
    fit_note = {
        "data": "../shared/data/real-runs (vLLM v0.15.1, H100; measured figures, not shipped)",
        "stages": len(stages),
        "folds": None if args.no_cv else "by model",
        "method": "bench/fit_vllm.py: each stage replayed as measured (bench/real_runs.py, prefix cache as the runs had it); "
                  "scipy least_squares, soft-L1 on log(predicted/measured) mean TTFT, TPOT and E2E; the operators timed by "
                  f"vLLM's measured kernel curves and the overheads ({', '.join(OVERHEADS)}) fitted within physical bounds"
                  + (f"; {', '.join(ROOFLINE_ONLY)} (for GPUs without curves, mape_pct.without_curves) held at the "
                     "profile's before (--keep-roofline: these runs barely pin them)" if args.keep_roofline else
                     f"; then, the overheads held, {', '.join(ROOFLINE_ONLY)} fitted without the curves, for GPUs that have "
                     "none (mape_pct.without_curves)") + "; compute_efficiency and kernel_launch_s fixed",
        "mape_pct": {"fitted": summary(stages, columns["fitted"]),
                     "without_curves": summary(stages, columns["without curves"])}
        | ({} if args.no_cv else {"held_out_by_model": summary(stages, columns["held out"])}),
        "at_bound": at_bound,
    }
    # The measured error distribution `optimize --confidence` reads: this profile's signed errors
    # per load band, in-sample (bench/real_runs.py --error-quantiles gives the same figures).
    replays = pd.DataFrame([rr.replay(fitted.model_copy(update={"fit": None}), args.data, row) for _, row in stages.iterrows()])
    fit_note["error_source"] = (f"bench/fit_vllm.py (as bench/real_runs.py --error-quantiles): the {len(stages)} load stages of "
                                "../shared/data/real-runs (vLLM v0.15.1, H100) replayed by this profile; in-sample, as the profile "
                                "was fitted on these stages (held out by model its mean errors are larger: mape_pct.held_out_by_model)")
    fit_note["error"] = rr.error_quantiles(replays)
    fitted = fitted.model_copy(update={"fit": fit_note})

    fp8 = None if args.no_fp8 else fit_fp8(fitted, args)
    if args.write:
        write(fitted, fp8)


def fit_bf16(base, stages: pd.DataFrame, args):
    """`base` with its overheads fitted to the stages, its operators timed by the curves; then the
    roofline's factors (ROOFLINE_ONLY) fitted without the curves, the overheads held; every factor
    that ended on a bound in `fit.at_bound`."""
    curved = fit(base, stages, args.data, args.jobs, args.evaluations, OVERHEADS)
    if args.keep_roofline:
        shipped = load_engine(str(VLLM_YAML))
        return with_values(curved, {n: value(shipped, n) for n in ROOFLINE_ONLY})
    roofline = fit(curved.model_copy(update={"kernel_curves": None}), stages, args.data, args.jobs, args.evaluations,
                   ROOFLINE_ONLY)
    fitted = with_values(curved, {n: value(roofline, n) for n in ROOFLINE_ONLY})
    return fitted.model_copy(update={"fit": {"at_bound": curved.fit["at_bound"] | roofline.fit["at_bound"]}})


def fit_fp8(fitted, args):
    """vllm-fp8: the bf16 profile `fitted` at fp8, timed by vLLM's kernel curves where a GPU has
    them; its compute and memory efficiency (the roofline's, for GPUs without curves) refitted to
    aiconfigurator's vLLM fp8 runs without the curves, within perf.bounds' bounds (compute at most
    the measured fp8 GEMM ceiling of the runs' machines); a factor that ends on a bound is printed
    and recorded."""
    runs, _ = dep.read_deployments(args.deployments)
    mine = runs[(runs.engine == "vllm") & (runs.precision == "fp8")].reset_index(drop=True)
    start = fitted.model_copy(update={
        "name": "vllm-fp8", "dtype": "fp8", "fit": None, "kernel_curves": None,
        "description": "vLLM (fp8 weights, KV and activations): the vllm profile at fp8, its operators timed by vLLM's "
                       "measured kernel curves where a GPU has them",
        "source": "bench/fit_vllm.py: vllm's overheads and scheduler; operators by NVIDIA aiconfigurator-core 0.12.0's "
                  "vLLM kernel tables (kernel_curves: vllm); compute and memory efficiency, for GPUs without those tables, "
                  "fitted to aiconfigurator_silicon_sample.csv (vLLM 0.11-0.19, fp8)"})
    run = partial(run_units, jobs=args.jobs)
    scalars = dep.fit_deployments(mine, start, max_evaluations=args.evaluations, run=run, factors=FP8_FACTORS)
    fp8 = scalars.model_copy(update={"kernel_curves": "vllm"})
    truth = mine[["ttft_ms", "tpot_ms"]].to_numpy(float)
    figures, by_model = {}, {}
    for tag, profile in (("curves", fp8), ("scalars_fitted", scalars)):
        err = (dep.predict(mine, profile, run) / truth - 1) * 100
        figures[tag] = _figures(err)
        by_model[tag] = {model: _figures(err[(mine.model == model).to_numpy()]) for model in sorted(mine.model.unique())}
    print(f"\nfp8 on {len(mine)} aiconfigurator vLLM runs:", {n: float(f"{value(fp8, n):.4g}") for n in FP8_FACTORS}, figures)
    print("per model:", by_model)
    for name, why in scalars.fit["at_bound"].items():
        print(f"  on its bound: {name}, {why}")
    return fp8.model_copy(update={"fit": {
        "data": "../shared/data/perf/aiconfigurator_silicon_sample.csv (vllm, fp8, aggregated)", "runs": len(mine),
        "method": "bench/fit_vllm.py: operators timed by vLLM's measured kernel curves where a GPU has them (on these runs' "
                  "H100, H200 and B200 every operator the efficiencies below would time: the profile's error on them is "
                  "out-of-sample, mape_pct.curves); each run replayed as a closed loop (sim.deployments); for GPUs without "
                  f"curves, {', '.join(FP8_FACTORS)} fitted without the curves (scipy least_squares, soft-L1 on log TTFT and "
                  "TPOT, within perf.bounds: compute_efficiency at most the measured fp8 GEMM ceiling of the runs' machines; "
                  "mape_pct.scalars_fitted, in-sample), the rest the vllm profile's",
        "mape_pct": figures, "at_bound": scalars.fit["at_bound"]}})


def _figures(err: np.ndarray) -> dict[str, float]:
    """MAPE and median signed error % of TTFT and TPOT from (n, 2) signed errors."""
    return {f"{m}_{k}_pct": round(float(f(err[:, j])), 1) for j, m in enumerate(("ttft", "tpot"))
            for k, f in (("mape", lambda e: np.nanmean(np.abs(e))), ("bias", np.nanmedian))}


def write(fitted, fp8) -> None:
    """engine_profiles/vllm.yaml (when refitted) and vllm-fp8.yaml (then run bench/deployment_errors.py --write
    for its measured error, fit.error)."""
    header = "Written by: python bench/fit_vllm.py --write (do not edit by hand; rerun it)"
    if fitted is not None:
        VLLM_YAML.write_text(engine_to_yaml(fitted, header))
    if fp8 is not None:
        (ROOT / "engine_profiles" / "vllm-fp8.yaml").write_text(engine_to_yaml(fp8, header))
    print("wrote " + " and ".join(f"engine_profiles/{n}.yaml" for n, p in (("vllm", fitted), ("vllm-fp8", fp8)) if p is not None))


if __name__ == "__main__":
    main()
