"""Fitting engine profiles: to single forward passes (perf.calibrate) or to whole serving
runs (sim.deployments), with held-out error."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from splitplan.base.defaults import CALIBRATION_START
from splitplan.base.errors import SpecError
from splitplan.base.parallel import run_units
from splitplan.perf.roofline import Instance
from splitplan.sim.bench_replay import BenchSettings, bench_replay
from splitplan.specs.engine import EngineProfile, error_quantiles, load_engine
from splitplan.specs.hardware import load_hardware
from splitplan.specs.layout import Layout
from splitplan.specs.model import load_model


@dataclass(frozen=True)
class CalibrateResult:
    profile: EngineProfile
    report: dict  # {"groups": [...], "overall": {...}}
    points: object  # DataFrame: every point used, with before_ms, fit_ms, cv_ms
    excluded: object  # DataFrame: points left out, with the reason

    def to_json(self) -> dict:
        return self.report

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.report["groups"])


def calibrate(perf_db: str, engine: str = CALIBRATION_START, folds: int = 5, max_prefill_batch_tokens: int | None = None,
              keep_anomalies: bool = False, progress=None, jobs: int = 1) -> CalibrateResult:
    """Fit `engine`'s factors to the measurements in `perf_db`; report MAPE before,
    fitted and k-fold cross-validated. Non-physical points (see
    `measurements.flag_anomalies`) and, with `max_prefill_batch_tokens`, batched
    prefills beyond that size are left out and listed."""
    from splitplan.perf import calibrate as cal  # (on first use: `import splitplan` does not load pandas)
    from splitplan.perf.measurements import read_measurements
    if folds < 0 or folds == 1:
        raise SpecError(f"--folds {folds}: use 0 (no cross-validation) or k >= 2")
    base = load_engine(engine)
    points = read_measurements(perf_db)
    if points.empty:
        raise SpecError(f"{perf_db}: no measurement rows; add rows under the header")
    _check_fits(points, base, perf_db)
    used, excluded = _exclusions(points, keep_anomalies, max_prefill_batch_tokens)
    if used.empty:
        raise SpecError(f"{perf_db}: no points left to fit after exclusions")
    result = cal.calibrate(used, base, folds, progress, partial(run_units, jobs=jobs, progress=progress))
    summary = cal.report(result)
    provenance = {
        "data": str(perf_db),
        "points": len(used),
        "excluded": {reason: int(n) for reason, n in excluded.reason.value_counts().sort_index().items()},
        "method": "splitplan calibrate: scipy least_squares, soft-L1 on log(predicted/measured); all factors on all "
                  "points, then efficiencies and overheads per (model, machine, TP); physical bounds",
        "folds": folds,
        "mape_pct": {phase: {k: v for k, v in figures.items() if k != "points"} for phase, figures in summary["overall"].items()},
        "at_bound": (result.profile.fit or {}).get("at_bound", {}),
    }
    profile = result.profile.model_copy(update={"fit": provenance})
    return CalibrateResult(profile, summary, result.points, excluded)


def _check_fits(points, base: EngineProfile, perf_db: str) -> None:
    """Every (model, machine, TP) of the measurements holds the model under `base` (SpecError naming the rows)."""
    for model, hardware, tp in sorted(set(zip(points.model, points.hardware, points.tp, strict=True))):
        fit = Instance(load_model(model), load_hardware(hardware), base, Layout(int(tp))).fit  # unknown names fail here, with a suggestion
        if not fit.fits:
            raise SpecError(f"{perf_db}: rows of {model} on {hardware} at TP {tp}: {fit.reason}; fix or remove those rows"
                             + (", or start from an fp8 engine if the runs used fp8 (--engine lean-fp8)"
                                if "weights need" in fit.reason and base.dtype == "bf16" else ""))


def _exclusions(points, keep_anomalies: bool, max_prefill_batch_tokens: int | None) -> tuple:
    """(the points to fit, those left out with their reason): failed runs (faster than a smaller
    batch of their sweep) unless kept, batched prefills above `max_prefill_batch_tokens`."""
    import pandas as pd

    from splitplan.perf.measurements import flag_anomalies
    reasons = pd.Series("", index=points.index)
    if not keep_anomalies:
        reasons[flag_anomalies(points)] = "faster than a smaller batch of the same sweep (failed run)"
    if max_prefill_batch_tokens is not None:
        big = (points.phase == "prefill") & (points.batch > 1) & (points.batch * points.prompt_tokens > max_prefill_batch_tokens)
        reasons[big & (reasons == "")] = f"batched prefill above {max_prefill_batch_tokens} tokens"
    used = points[reasons == ""].reset_index(drop=True)
    excluded = points[reasons != ""].assign(reason=reasons[reasons != ""]).reset_index(drop=True)
    return used, excluded


@dataclass(frozen=True)
class DeploymentCalibration:
    profile: EngineProfile
    table: Any  # a DataFrame: per (machine, concurrency band) and overall, MAPE and median error %
    runs: Any  # a DataFrame: every run used, with fit and held-out predictions (ms)
    dropped: dict  # rows of the file left out, by reason

    def to_json(self) -> dict:
        return {"groups": self.table.to_dict("records"), "dropped": self.dropped, "fit": self.profile.fit}

    @property
    def left_out(self) -> str:
        """The file's rows left out, as one line ("N x reason; ...")."""
        return _left_out(self.dropped)


def _left_out(dropped: dict[str, int]) -> str:
    return "; ".join(f"{n} x {reason}" for reason, n in dropped.items())


def calibrate_deployments(path: str, backend: str, engine: str = "lean-fp8", folds: bool = True, jobs: int = 1,
                          progress=None) -> DeploymentCalibration:
    """Fit `engine`'s engine-wide factors to measured whole deployments of one serving
    engine (`backend`), each run replayed as a closed loop (sim.deployments); report
    TTFT and TPOT error per machine and concurrency band, fitted and held out (folds by
    machine, or by concurrency band when the runs hold one machine)."""
    from splitplan.sim import deployments as dep  # (on first use: it loads pandas)
    mine, base, dropped = _replayable_runs(path, backend, engine)
    run = partial(run_units, jobs=jobs)
    shared = dep.schedules(mine, base, run)  # (each run simulated once for every fit: sim.deployments.Schedule)
    fitted = dep.fit_deployments(mine, base, run=run, shared=shared)
    if progress:
        progress()
    predicted = dep.predict(mine, fitted, run)  # (simulated: the schedules' timing checked against it)
    if not np.allclose(dep.predict(mine, fitted, run, shared), predicted, rtol=1e-9, equal_nan=True):
        shared = [None] * len(mine)  # (a schedule the factors changed after all: every evaluation simulated)
        fitted = dep.fit_deployments(mine, base, run=run, shared=shared)
        predicted = dep.predict(mine, fitted, run)
    by = dep.fold_column(mine)
    held = dep.cross_validate(mine, base, by, run, progress, shared=shared) if folds else None
    table = dep.error_table(mine, predicted, held)
    overall = table.iloc[-1].to_dict()
    profile = fitted.model_copy(update={
        "name": backend, "description": f"{backend} ({base.dtype}) as measured in whole serving runs; fitted by splitplan "
                                        f"calibrate --deployments from {base.name}", "fit": {
            "data": str(path), "engine": backend, "runs": len(mine), "folds": f"by {by}" if folds else None,
            "method": "splitplan calibrate --deployments: each run replayed as a closed loop by the simulator; "
                      "scipy least_squares, soft-L1 on log(simulated/measured) mean TTFT and TPOT; engine-wide factors "
                      f"({', '.join(dep.DEPLOYMENT_FACTORS)}) within physical bounds",
            "mape_pct": {k: v for k, v in overall.items() if k.endswith("_pct")},
            "at_bound": (fitted.fit or {}).get("at_bound", {}),
        }})
    runs_out = mine.assign(fit_ttft_ms=predicted[:, 0], fit_tpot_ms=predicted[:, 1])
    if held is not None:
        runs_out = runs_out.assign(cv_ttft_ms=held[:, 0], cv_tpot_ms=held[:, 1])
    return DeploymentCalibration(profile, table, runs_out, dropped)


def _replayable_runs(path: str, backend: str, engine: str) -> tuple[Any, EngineProfile, dict[str, int]]:
    """(the file's runs of `backend` that `engine` can replay, that profile, the rows left out by reason)."""
    from splitplan.sim import deployments as dep
    runs, dropped = dep.read_deployments(path)
    mine = runs[runs.engine == backend].reset_index(drop=True)
    if mine.empty:
        raise SpecError(f"{path}: no run of backend '{backend}' that the catalog can model; "
                        f"the file has: {', '.join(sorted(runs.engine.unique())) or 'none'}"
                        + (f" (left out: {_left_out(dropped)})" if dropped else ""))
    base = load_engine(engine)
    if set(mine.precision) != {base.dtype}:
        raise SpecError(f"{path}: the {backend} runs are {', '.join(sorted(set(mine.precision)))} and --engine {engine} is "
                        f"{base.dtype}; start from a profile of that precision (e.g. --engine lean-fp8)")
    why = dep.unservable(mine, base)
    for reason, count in Counter(w for w in why if w).items():
        dropped[f"not servable as recorded under {base.name}: {reason}"] = count
    mine = mine[[not w for w in why]].reset_index(drop=True)
    if mine.empty:
        raise SpecError(f"{path}: no run of backend '{backend}' that {base.name} can replay (left out: {_left_out(dropped)})")
    return mine, base, dropped


# --- calibrate --bench: serving benchmarks a team already ran -------------------------------

SUMMARY_METRICS = ("ttft_mean", "tpot_mean", "e2e_mean")


@dataclass(frozen=True)
class BenchCalibration:
    profile: EngineProfile
    runs: Any  # DataFrame: a row per run and measured figure: measured, before, fitted and held-out ms
    factors: Any  # DataFrame: a row per fitted factor: prior, fitted, pinned share
    summary: dict  # per figure: MAPE % before, fitted, held out

    def to_json(self) -> dict:
        return {"runs": self.runs.to_dict("records"), "factors": self.factors.to_dict("records"), "mape_pct": self.summary,
                "fit": self.profile.fit}


def _fold_unit(shared, held: int):
    from splitplan.sim import bench_fit
    replays, base = shared
    fold = bench_fit.fit([r for k, r in enumerate(replays) if k != held], base)
    return bench_fit.predict(replays[held], fold.profile)


def calibrate_bench(paths: list[str], settings: BenchSettings | None = None, engine: str | EngineProfile = "vllm",
                    bench_format: str | None = None, traces: list | None = None, folds: bool = True, jobs: int = 1,
                    progress=None) -> BenchCalibration:
    """Fit `engine`'s factors for the runs' model and machine to serving benchmarks (vllm bench
    serve, inference-perf, GuideLLM, AIPerf: workload.benchmarks), each run replayed as it ran
    (sim.bench_fit); report each run's error before and after, and held out (each run predicted by
    a fit without it) when there are several, and write that error into the profile (`fit.error`)
    for `optimize --confidence`. `traces`: one trace (a path or a Trace) for every run, or one per
    path, in order."""
    from splitplan.sim import bench_fit
    base = engine if isinstance(engine, EngineProfile) else load_engine(engine)
    replays = bench_replays(paths, settings or BenchSettings(), base, bench_format, traces or [])
    result = bench_fit.fit(replays, base)
    if progress:
        progress()
    held = None
    if folds and len(replays) > 1:
        held = run_units(_fold_unit, list(range(len(replays))), (replays, base), jobs, progress=progress)
    predicted = {"before": [bench_fit.predict(r, base) for r in replays],
                 "fitted": [bench_fit.predict(r, result.profile) for r in replays], "held_out": held}
    table, factors = _bench_frames(replays, predicted, result)
    summary = _bench_summary(table)
    profile = _calibrated(base, result, replays, paths, {
        "factors": {f["factor"]: {k: v for k, v in f.items() if k != "factor"} for f in factors.to_dict("records")},
        "mape_pct": summary, "at_bound": result.at_bound,
        "timed_by_curves": result.timed_by_curves,
        "error_source": ("held out: each run predicted by a fit without it" if held else
                         "in-sample (one run, or --folds 0): the error of the fitted runs themselves"),
        "error": _error_quantiles(table, "held_out_ms" if held else "fitted_ms")})
    return BenchCalibration(profile, table, factors, summary)


def _bench_frames(replays: list, predicted: dict, result) -> tuple:
    """(a row per run and figure: measured and predicted ms; a row per factor: prior, fitted, pinned)."""
    import pandas as pd

    from splitplan.sim.bench_fit import PINNED
    table = pd.DataFrame([{"run": r.name, "metric": metric, "measured_ms": value,
                           **{f"{k}_ms": v[i][metric] if v else float("nan") for k, v in predicted.items()}}
                          for i, r in enumerate(replays) for metric, value in r.measured_ms.items()])
    factors = pd.DataFrame([{"factor": k, "prior": result.prior[k], "fitted": result.fitted[k],
                             "pinned_pct": round(100 * result.pinned[k], 1),
                             "source": "runs" if result.pinned[k] >= PINNED else "prior"} for k in result.names])
    return table, factors


def _calibrated(base: EngineProfile, result, replays: list, paths: list[str], fit: dict) -> EngineProfile:
    """The fitted profile as written: named for its base, its machine's source and `fit` saying how."""
    machine, models = replays[0].instance.hardware.name, ", ".join(sorted({r.instance.model.name for r in replays}))
    return result.profile.model_copy(update={
        "name": f"{base.name}-calibrated",
        "description": f"{base.description}; calibrated on {len(replays)} measured run(s) of {models} on {machine}",
        "source": f"splitplan calibrate --bench {' '.join(map(str, paths))} --engine {base.name}",
        "efficiency_sources": {**base.efficiency_sources,
                               machine: f"calibrated (splitplan calibrate --bench) on {len(replays)} measured run(s)"},
        "fit": {"data": [str(p) for p in paths], "runs": len(replays), "machine": machine, "model": models,
                "method": "splitplan calibrate --bench: each run replayed as it ran by the simulator; maximum a posteriori "
                          "fit (scipy least_squares) of log(simulated/measured) figures with a Gaussian prior at the "
                          f"starting profile ({base.name}) per factor, within physical bounds", **fit}})


def bench_replays(paths: list[str], settings: BenchSettings, base: EngineProfile, bench_format: str | None,
                  traces: list) -> list:
    """Every run of `paths` as a sim.bench_replay.Replay, each with its trace (`traces`: one for all,
    or one per path of one run each); all on --hardware's machine type (no tool records it)."""
    from splitplan.workload.benchmarks import read_benchmarks
    from splitplan.workload.trace import Trace, load_trace
    by_path = [read_benchmarks([Path(p)], bench_format) for p in paths]
    if len(traces) not in (0, 1, len(paths)):
        raise SpecError(f"--trace given {len(traces)} times for {len(paths)} --bench: give one for all, or one per --bench")
    if len(traces) > 1 and any(len(group) > 1 for group in by_path):
        raise SpecError("a --bench with several runs cannot share one --trace per path: give each run its own file")
    loaded = [t if isinstance(t, Trace) else load_trace(t) for t in traces]
    return [bench_replay(run, settings, base, loaded[0] if len(loaded) == 1 else (loaded[k] if loaded else None))
            for k, group in enumerate(by_path) for run in group]


def _bench_summary(table) -> dict:
    """Per measured figure: runs, MAPE % before, fitted and held out."""
    out = {}
    for metric, group in table.groupby("metric", sort=False):
        row: dict[str, Any] = {"runs": len(group)}
        for column in ("before", "fitted", "held_out"):
            err = (group[f"{column}_ms"] / group.measured_ms - 1).abs() * 100
            row[column] = round(float(err.mean()), 1) if err.notna().any() else None
        out[metric] = row
    return out


def _error_quantiles(table, column: str) -> dict:
    """fit.error as engine profiles carry it (specs.engine.EngineProfile.latency_factors): over
    all runs, quantiles of the signed error of mean TTFT, TPOT and E2E, in %."""
    band: dict[str, Any] = {"runs": int(table.run.nunique())}
    for metric in SUMMARY_METRICS:
        rows = table[table.metric == metric]
        err = ((rows[column] / rows.measured_ms - 1) * 100).dropna()
        if len(err):
            band[metric] = error_quantiles(err)
    return {"all": band}
