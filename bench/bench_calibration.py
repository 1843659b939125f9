"""`splitplan calibrate --bench` on measured runs: fitted on a run's lightest load stage alone,
how well are its other stages predicted?

    python bench/bench_calibration.py [--data DIR] [--engines held-out,vllm,lean] [--jobs N] [--evaluations N]
                                      [--deployments CSV | --no-closed-loops]

`../shared/data/real-runs/` (README there; measured figures, used here and never copied into
the project) holds open-loop vLLM v0.15.1 runs on one H100 server, driven by inference-perf, one
row per load stage. Each stage is written out as the inference-perf stage report it came from
(`stage_N_lifecycle_metrics.json`: load_summary, successes with TTFT and E2E mean/median/p90/p99
in seconds, prompt and output lengths) in a temporary directory, with the stage's own requests
as `--trace` (arrivals, sizes, and the prompt blocks vLLM's prefix cache held, as
bench/real_runs.py replays them). For each run, `calibrate_bench` (the command's library call)
fits the starting profile to the lightest stage's report alone; every other stage of the run is
then replayed under the fitted profile and its mean TPOT and TTFT compared with the measured.
Target (issue 57): within 5 % on mean TPOT and 15 % on mean TTFT, and no stage the engine served
predicted to collapse (TTFT p50 above 5 s).

Closed loops too (`--deployments`, default `../shared/data/perf/aiconfigurator_silicon_sample.csv`;
measured figures, used here and never copied): NVIDIA's aggregated runs at fixed ISL/OSL, a
concurrency each (per instance), mean TTFT and TPOT. Every series of one engine, machine, model,
precision, TP and ISL/OSL measured at three concurrencies or more is written out as `vllm bench
serve` summaries (`max_concurrency`, rate `inf`, the token totals and the two means: what a team
keeps without `--save-detailed`), fitted on its lowest concurrency alone from the engine's shipped
fp8 profile (`trtllm-fp8`, fitted to this sample, so its "before" is in-sample engine-wide;
`vllm-fp8`, timed there by vLLM's measured kernel curves and fitted to none of it), and its other
concurrencies predicted.

Starting profiles (`--engines`): `held-out`, the realistic case, is the shipped `vllm` profile as
bench/fit_vllm.py fits it but without the run's model (its held-out-by-model fold: the profile
has never seen this model's runs, as a team's own cluster is new to the shipped one); `vllm` is
the shipped profile, which was fitted on these very runs (so its "before" is in-sample); `lean`
is the datasheet profile, not a vLLM one. Printed per starting profile: per stage, the error
before (the starting profile) and after; the MAPE over the held-out stages; the fitted factors
with the share the light stage pinned.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fit_vllm  # noqa: E402
import real_runs as rr  # noqa: E402

from splitplan.base.parallel import run_units  # noqa: E402
from splitplan.sim.bench_replay import BenchSettings, bench_replay, predict
from splitplan.specs.engine import load_engine  # noqa: E402
from splitplan.workflows.calibration import calibrate_bench  # noqa: E402
from splitplan.workload.benchmarks import read_benchmarks  # noqa: E402

COLLAPSE_MS = 5_000.0
DEPLOYMENTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "perf" / "aiconfigurator_silicon_sample.csv"
FP8_PROFILES = {"vllm": "vllm-fp8", "trtllm": "trtllm-fp8", "sglang": "sglang-fp8"}
SERIES = ["engine", "machine", "model", "precision", "tp", "isl", "osl"]


def stage_report(row: pd.Series, isl_mean: float) -> dict:
    """The stage as inference-perf's stage report has it (the fields calibrate --bench reads; a
    figure the row lacks is left out, as the tool leaves out what it did not measure)."""
    def seconds(metric: str) -> dict:
        pairs = {"mean": "mean", "median": "p50", "p90": "p90", "p99": "p99"}
        return {k: row[f"{metric}_{v}_ms"] / 1e3 for k, v in pairs.items() if pd.notna(row[f"{metric}_{v}_ms"])}
    planned = round(float(row.stage_rate_rps) * float(row.stage_duration_s))
    ok = int(row.requests_ok) if pd.notna(row.requests_ok) else planned
    return {"load_summary": {"count": int(row.requests_sent) if pd.notna(row.requests_sent) else planned,
                             "requested_rate": float(row.stage_rate_rps), "send_duration": float(row.stage_duration_s)},
            "successes": {"count": ok, "latency": {"time_to_first_token": seconds("ttft"), "request_latency": seconds("e2e")},
                          "prompt_len": {"mean": isl_mean}, "output_len": {"mean": float(row.osl_max_tokens)}},
            "failures": {"count": int(row.requests_failed) if pd.notna(row.requests_failed) else 0}}


def settings(row: pd.Series) -> BenchSettings:
    return BenchSettings(model=row.model_arg, hardware=row.gpu, tp=int(row.tp),
                         max_num_batched_tokens=int(row.max_num_batched_tokens), max_num_seqs=int(row.max_num_seqs),
                         prefix_caching=True)


def one_run(shared, item) -> list[dict]:
    data, folder, engine, starts = shared
    run_id, stages = item
    stages = stages.sort_values("stage_rate_rps")
    base = starts[stages.model_arg.iloc[0]].model_copy(update={"memory_usable_fraction": float(stages.gpu_mem_util.iloc[0]),
                                                  "scheduler": "chunked", "max_model_len": int(stages.max_model_len.iloc[0])})
    paths = {}
    for _, row in stages.iterrows():
        path = folder / run_id / f"stage_{int(row.stage_index)}_lifecycle_metrics.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stage_report(row, float(np.mean(rr.stage_trace(data, row).prompt_tokens)))))
        paths[int(row.stage_index)] = path
    light = stages.iloc[0]
    start = time.perf_counter()
    result = calibrate_bench([str(paths[int(light.stage_index)])], settings(light), base,
                             traces=[rr.stage_trace(data, light)], folds=False)
    seconds = time.perf_counter() - start
    out = []
    for _, row in stages.iterrows():
        run = read_benchmarks([paths[int(row.stage_index)]])[0]
        replay = bench_replay(run, settings(row), base, rr.stage_trace(data, row))
        before, after = predict(replay, base), predict(replay, result.profile)
        out.append({"engine": engine, "run": run_id, "model": row.model_arg, "tp": int(row.tp), "stage": int(row.stage_index),
                    "rate_rps": float(row.stage_rate_rps), "fitted_on": bool(row.stage_index == light.stage_index),
                    "fit_s": seconds, **{f"measured_{m}": run.measured_ms[m] for m in ("ttft_mean", "tpot_mean")},
                    **{f"before_{m}": before[m] for m in ("ttft_mean", "tpot_mean")},
                    **{f"after_{m}": after[m] for m in ("ttft_mean", "tpot_mean")},
                    "collapsed": bool(predict(replay, result.profile).get("ttft_p50", 0) > COLLAPSE_MS)
                    and not bool(row.overloaded),
                    "factors": result.factors.to_dict("records")})
    return out


def held_out(runs: pd.DataFrame, model: str, args):
    """bench/fit_vllm.py's fit of the `vllm` profile on every stage but `model`'s."""
    others = runs[runs.model_arg != model].reset_index(drop=True)
    start = time.perf_counter()
    fold = fit_vllm.fit(fit_vllm.base_profile(), others, args.data, args.jobs, args.evaluations, fit_vllm.OVERHEADS)
    print(f"vllm without {model} ({len(others)} stages, {time.perf_counter() - start:.0f} s): "
          + ", ".join(f"{n} {fit_vllm.value(fold, n):.4g}" for n in fit_vllm.OVERHEADS), flush=True)
    return fold.model_copy(update={"fit": None})


def vllm_summary(run: dict) -> dict:
    """A closed-loop run as `vllm bench serve --max-concurrency C --save-result` keeps it without
    --save-detailed: ten requests a client (sim.deployments.REQUESTS_PER_CLIENT), its means."""
    n = 10 * int(run["concurrency"])
    return {"backend": run["engine"], "model_id": run["model"], "request_rate": "inf", "burstiness": 1.0,
            "max_concurrency": int(run["concurrency"]), "completed": n, "duration": 1.0, "tp": str(int(run["tp"])),
            "total_input_tokens": n * int(run["isl"]), "total_output_tokens": n * int(run["osl"]),
            "mean_ttft_ms": float(run["ttft_ms"]), "mean_tpot_ms": float(run["tpot_ms"])}


def one_series(shared, item) -> list[dict]:
    folder, = shared
    key, series = item
    series = series.sort_values("concurrency").to_dict("records")
    where = folder / "-".join(map(str, key))
    where.mkdir(parents=True, exist_ok=True)
    paths = []
    for run in series:
        paths.append(where / f"c{int(run['concurrency'])}.json")
        paths[-1].write_text(json.dumps(vllm_summary(run)))
    base = load_engine(FP8_PROFILES[series[0]["engine"]])
    settings_ = BenchSettings(model=series[0]["model"], hardware=series[0]["machine"], tp=int(series[0]["tp"]))
    result = calibrate_bench([str(paths[0])], settings_, base, folds=False)
    out = []
    for run, path in zip(series, paths, strict=True):
        replay = bench_replay(read_benchmarks([path])[0], settings_, base)
        before, after = predict(replay, base), predict(replay, result.profile)
        out.append({"engine": run["engine"], "series": str(key), "concurrency": int(run["concurrency"]),
                    "fitted_on": path == paths[0], "measured_ttft_mean": run["ttft_ms"], "measured_tpot_mean": run["tpot_ms"],
                    **{f"before_{m}": before[m] for m in ("ttft_mean", "tpot_mean")},
                    **{f"after_{m}": after[m] for m in ("ttft_mean", "tpot_mean")}})
    return out


def closed_loops(args) -> None:
    from splitplan.sim.deployments import read_deployments
    runs, _ = read_deployments(args.deployments)
    runs = runs[runs.engine.isin(list(FP8_PROFILES)) & (runs.precision == "fp8")]
    series = [(key, g) for key, g in runs.groupby(SERIES, sort=True) if g.concurrency.nunique() >= 3]
    with tempfile.TemporaryDirectory() as tmp:
        rows = [r for part in run_units(one_series, series, (Path(tmp),), args.jobs, describe=lambda item: str(item[0]))
                for r in part]
    frame = pd.DataFrame(rows)
    held = frame[~frame.fitted_on]
    print(f"\n### closed loops: {len(series)} series of aiconfigurator's fp8 runs, each fitted on its lowest concurrency\n")
    table = []
    for engine, g in [*held.groupby("engine", sort=True), ("all", held)]:
        row = {"engine": engine, "series": g.series.nunique(), "predicted runs": len(g)}
        for metric in ("ttft_mean", "tpot_mean"):
            for when in ("before", "after"):
                err = (g[f"{when}_{metric}"] / g[f"measured_{metric}"] - 1) * 100
                row[f"{metric} {when}"] = f"{err.abs().mean():.1f} / {err.median():+.1f} (worst {err.abs().max():.0f})"
        table.append(row)
    print(rr.markdown(pd.DataFrame(table)))
    print("\ncells: MAPE % / median signed error % (worst absolute %)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=rr.DATA)
    parser.add_argument("--engines", default="held-out,vllm,lean")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--evaluations", type=int, default=12, help="least-squares steps of each held-out fold's fit")
    parser.add_argument("--deployments", type=Path, default=DEPLOYMENTS)
    parser.add_argument("--no-closed-loops", action="store_true")
    parser.add_argument("--closed-loops-only", action="store_true")
    args = parser.parse_args()
    if args.closed_loops_only:
        closed_loops(args)
        return
    runs = pd.read_csv(args.data / "runs.csv")
    runs = runs[runs.include == 1]
    models = sorted(runs.model_arg.unique())
    groups = [(run_id, g) for run_id, g in runs.groupby(runs.run_id.str.rsplit("-s", n=1).str[0], sort=True) if len(g) > 1]
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for engine in args.engines.split(","):
            starts = {m: held_out(runs, m, args) if engine == "held-out" else load_engine(engine) for m in models}
            for part in run_units(one_run, groups, (args.data, Path(tmp) / engine, engine, starts), args.jobs,
                                  describe=lambda item: item[0]):
                rows += part
    frame = pd.DataFrame(rows)
    print(f"{len(groups)} runs with several load stages; each fitted on its lightest stage alone\n")
    for engine, mine in frame.groupby("engine", sort=False):
        print(f"### starting from {engine}\n")
        show = mine.assign(**{f"{w}_{m}_err_pct": (mine[f"{w}_{m}"] / mine[f"measured_{m}"] - 1) * 100
                              for w in ("before", "after") for m in ("ttft_mean", "tpot_mean")})
        cols = ["run", "stage", "rate_rps", "fitted_on", "measured_ttft_mean", "before_ttft_mean_err_pct",
                "after_ttft_mean_err_pct", "measured_tpot_mean", "before_tpot_mean_err_pct", "after_tpot_mean_err_pct"]
        print(rr.markdown(show[cols]))
        held = show[~show.fitted_on]
        print(f"\nheld-out stages: {len(held)}; mean TTFT MAPE {held.after_ttft_mean_err_pct.abs().mean():.1f} % "
              f"(before {held.before_ttft_mean_err_pct.abs().mean():.1f} %), worst {held.after_ttft_mean_err_pct.abs().max():.1f} %; "
              f"mean TPOT MAPE {held.after_tpot_mean_err_pct.abs().mean():.1f} % "
              f"(before {held.before_tpot_mean_err_pct.abs().mean():.1f} %), worst {held.after_tpot_mean_err_pct.abs().max():.1f} %; "
              f"false collapses {int(held.collapsed.sum())}; fit {np.mean(mine.groupby('run').fit_s.first()):.1f} s a run\n")
        for run_id, g in mine.groupby("run", sort=True):
            factors = ", ".join(f"{f['factor']} {f['prior']:.4g} -> {f['fitted']:.4g} ({f['pinned_pct']:.0f} % pinned)"
                                for f in g.factors.iloc[0])
            print(f"- {run_id}: {factors}")
        print()
    if not args.no_closed_loops:
        closed_loops(args)


if __name__ == "__main__":
    main()
