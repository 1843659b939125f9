"""Fitting engine profiles: to single forward passes (perf.calibrate) or to whole serving
runs (sim.deployments), with held-out error."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from splitplan.base.defaults import CALIBRATION_START
from splitplan.base.errors import SpecError
from splitplan.base.parallel import run_units
from splitplan.perf.roofline import Instance
from splitplan.specs.engine import EngineProfile, load_engine
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


def calibrate_deployments(path: str, backend: str, engine: str = "lean-fp8", folds: bool = True, jobs: int = 1,
                          progress=None) -> DeploymentCalibration:
    """Fit `engine`'s engine-wide factors to measured whole deployments of one serving
    engine (`backend`), each run replayed as a closed loop (sim.deployments); report
    TTFT and TPOT error per machine and concurrency band, fitted and held out (folds by
    machine, or by concurrency band when the runs hold one machine)."""
    from splitplan.sim import deployments as dep  # (on first use: it loads pandas)
    runs, dropped = dep.read_deployments(path)
    mine = runs[runs.engine == backend].reset_index(drop=True)
    if mine.empty:
        raise SpecError(f"{path}: no run of backend '{backend}' that the catalog can model; "
                        f"the file has: {', '.join(sorted(runs.engine.unique())) or 'none'}")
    base = load_engine(engine)
    if set(mine.precision) != {base.dtype}:
        raise SpecError(f"{path}: the {backend} runs are {', '.join(sorted(set(mine.precision)))} and --engine {engine} is "
                        f"{base.dtype}; start from a profile of that precision (e.g. --engine lean-fp8)")
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
