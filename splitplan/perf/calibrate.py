"""Fit an engine profile's factors to measured latencies, and say how accurate it is.

The hardware stays datasheet; only engine factors move, each within physical
bounds (perf.bounds: no efficiency above 1 nor compute above the GPU's measured GEMM
ceiling, no negative overhead); a factor that ends on one is reported (`fit.at_bound`). Residuals are log-ratios
(so a 10 % miss weighs the same at 30 ms and at 3 s) under a robust soft-L1 loss,
so a few anomalous measurements cannot drag the fit.

Two stages keep the fit general (the same profile predicts machines and models
outside the data) and cross-validation honest:
1. every factor is fitted once on all points: the profile's defaults;
2. for each measured (model, machine, TP), only `LOCAL` factors (two efficiencies
   and four overheads) are refitted from those defaults: overrides `HW/tpN/MODEL`. Each
   machine also gets `HW/tpN` and `HW` overrides, medians of its groups, used for
   models or TP degrees it was not measured with.
Cross-validation: each (model, machine, TP, phase) sweep is dealt into k folds in
order; for each fold both stages are refitted without it and it is predicted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from splitplan.base.runner import Runner, serial
from splitplan.perf.bounds import at_bounds, bounds
from splitplan.perf.measurements import flag_anomalies
from splitplan.perf.roofline import Instance
from splitplan.specs.engine import EngineFactors, EngineProfile
from splitplan.specs.hardware import load_hardware
from splitplan.specs.layout import Layout
from splitplan.specs.model import load_model

# name: (lower, upper, scale) -- the scale keeps the optimizer's steps comparable.
FIT_BOUNDS = {
    "compute_efficiency": (0.05, 1.0, 1.0),
    "attention_efficiency": (0.01, 1.0, 1.0),
    "memory_efficiency": (0.5, 1.0, 1.0),  # a decode reads weights at 65-90 % of datasheet bandwidth
    "gemm_half_tokens": (0.0, 512.0, 100.0),
    "host_launch_s_per_layer": (0.0, 2e-3, 1e-3),
    "prefill_overhead_s": (0.0, 0.2, 1e-2),
    "decode_overhead_s": (0.0, 0.2, 1e-2),
    "sequence_overhead_s": (0.0, 5e-3, 1e-3),
    "prefill_sequence_overhead_s": (0.0, 0.1, 1e-2),
    "collective_latency_s": (0.0, 5e-5, 1e-5),  # NCCL small-message all-reduce: tens of us
    "link_efficiency": (0.05, 1.0, 1.0),
    "knee_tokens": (256.0, 16384.0, 1000.0),
    "knee_slowdown": (0.0, 10.0, 1.0),  # the fit lands near 4.3; 10 is the profile schema's limit
}
# Refitted per (model, machine, TP). Few on purpose: a sweep of nine prefill points
# cannot pin more, and cross-validation got worse with more (attention efficiency,
# knee, decode per-sequence and link factors stay engine-wide). The per-prompt cost of a
# batched prefill is local: A100 at TP 2 and 4 pays 40-55 ms a prompt where H100 pays
# nearly none (5-fold CV of prefill 7.4 -> 5.8 %, worst group 10.4 -> 6.8 %).
LOCAL = ("compute_efficiency", "memory_efficiency", "prefill_overhead_s", "decode_overhead_s", "host_launch_s_per_layer",
         "prefill_sequence_overhead_s")
GROUP = ["model", "hardware", "tp"]


def predict_ms(points: pd.DataFrame, profile: EngineProfile) -> np.ndarray:
    """Predicted latency for every measured point (same order as `points`)."""
    out = np.empty(len(points))
    positions = np.arange(len(points))
    for (model, hardware, tp), idx in points.groupby(GROUP, sort=False).indices.items():
        inst = Instance(load_model(model), load_hardware(hardware), profile, Layout(int(tp)))
        rows = points.iloc[idx]
        pre = rows["phase"].to_numpy() == "prefill"
        b = rows["batch"].to_numpy(float)
        p = rows["prompt_tokens"].to_numpy(float)
        c = rows["context_tokens"].to_numpy(float)
        t = np.where(
            pre,
            inst.pass_time_s(prefill_seqs=b, prefill_tokens=b * p, prefill_sq_tokens=b * p * p),
            inst.pass_time_s(decode_seqs=b, decode_context_tokens=b * c),
        )
        out[positions[idx]] = t * 1e3
    return out


def ape_pct(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(predicted - measured) / measured * 100


def _fit(points: pd.DataFrame, base: EngineProfile, start: EngineFactors, names) -> tuple[EngineFactors, dict[str, str]]:
    """`start` with `names` moved to minimize the robust log-error on `points`
    (predicted with `base`'s other settings and these factors as its defaults), within
    perf.bounds' bounds for the points' machines; and the factors that ended on a bound."""
    names = list(names)
    lo, hi, why = bounds(FIT_BOUNDS, names, [load_hardware(h) for h in sorted(set(points.hardware))], base.weights)
    scale = np.array([FIT_BOUNDS[n][2] for n in names])
    x0 = np.clip([getattr(start, n) for n in names], lo, hi)
    measured = points["latency_ms"].to_numpy(float)
    plain = base.model_copy(update={"hardware_overrides": {}})

    def residuals(x):
        factors = start.model_copy(update=dict(zip(names, map(float, x), strict=True)))
        return np.log(predict_ms(points, plain.model_copy(update={"defaults": factors})) / measured)

    from scipy.optimize import least_squares  # (on first use: every command loads this module, few fit)
    result = least_squares(residuals, x0, bounds=(lo, hi), x_scale=scale, loss="soft_l1", f_scale=0.05, max_nfev=300)
    fitted = EngineFactors(**{**start.model_dump(), **dict(zip(names, map(float, result.x), strict=True))})  # every field explicit
    return fitted, at_bounds(names, result.x, lo, hi, why)


def fit_profile(points: pd.DataFrame, base: EngineProfile) -> EngineProfile:
    """`base` with its factors refit to `points` (medians from `read_measurements`)."""
    points = points.reset_index(drop=True)
    defaults, ended = _fit(points, base, base.defaults, FIT_BOUNDS)
    on_bounds = {f"defaults.{n}": why for n, why in ended.items()}
    with_defaults = base.model_copy(update={"defaults": defaults, "hardware_overrides": {}})
    local: dict[tuple, EngineFactors] = {}
    for (model, hw, tp), rows in points.groupby(GROUP, sort=True):
        # Keyed by the specs' names, as `Instance` looks them up (the data may name a file).
        hw, model = load_hardware(hw).name, load_model(model).name
        start = EngineFactors(**{**defaults.model_dump(), **_kept(base, hw, int(tp))})
        local[(model, hw, int(tp))], ended = _fit(rows.reset_index(drop=True), with_defaults, start, LOCAL)
        on_bounds |= {f"{hw}/tp{int(tp)}/{model}.{n}": why for n, why in ended.items()}
    # the fitted factors replace the base's, and with them the base's sources for its factors
    return base.model_copy(update={"defaults": defaults, "hardware_overrides": _overrides(local), "efficiency_sources": {},
                                   "fit": {"at_bound": on_bounds}})


def _overrides(local: dict[tuple, EngineFactors]) -> dict[str, EngineFactors]:
    """A profile's overrides from factors fitted per (model, machine, TP): per machine and per
    (machine, TP) their medians, per (machine, TP, model) the fit, in sorted order."""
    def median(factors: list[EngineFactors]) -> EngineFactors:
        values = {n: float(np.median([getattr(f, n) for f in factors])) for n in FIT_BOUNDS}
        return EngineFactors(**{**factors[0].model_dump(), **values})

    overrides: dict[str, EngineFactors] = {}
    for hw in sorted({h for _, h, _ in local}):
        overrides[hw] = median([f for (_, h, _), f in local.items() if h == hw])
        for tp in sorted({t for _, h, t in local if h == hw}):
            overrides[f"{hw}/tp{tp}"] = median([f for (_, h, t), f in local.items() if h == hw and t == tp])
            overrides |= {f"{hw}/tp{tp}/{model}": f for (model, h, t), f in sorted(local.items()) if h == hw and t == tp}
    return overrides


def _kept(base: EngineProfile, hw: str, tp: int) -> dict:
    """Factors the base profile sets for this machine that the fit does not move
    (e.g. a measured KV transfer latency)."""
    factors = base.factors(hw, tp)
    return {n: getattr(factors, n) for n in EngineFactors.model_fields if n not in FIT_BOUNDS}


def transfer_points(points: pd.DataFrame) -> pd.DataFrame:
    """The sweeps a transfer check compares across machines and models: TP 8,
    single-prompt prefills, no failed runs."""
    points = points[~flag_anomalies(points) & (points.tp == 8)]
    return points[~((points.phase == "prefill") & (points.batch > 1))].reset_index(drop=True)


def transfer_mape(points: pd.DataFrame, column: str, train: str, test: str, base: EngineProfile) -> dict:
    """Fit on the points whose `column` is `train`, predict those whose `column` is
    `test`: {phase: (MAPE % of the fit, MAPE % of `base` unfitted)}."""
    fitted = fit_profile(points[points[column] == train].reset_index(drop=True), base)
    held = points[points[column] == test].reset_index(drop=True)
    out = {}
    for phase, rows in held.groupby("phase", sort=True):
        rows = rows.reset_index(drop=True)
        out[phase] = (float(ape_pct(predict_ms(rows, fitted), rows.latency_ms).mean()),
                      float(ape_pct(predict_ms(rows, base), rows.latency_ms).mean()))
    return out


def folds(points: pd.DataFrame, k: int) -> np.ndarray:
    """Fold of each point: every (model, machine, TP, phase) sweep dealt in order."""
    order = points.sort_values(GROUP + ["phase", "batch", "prompt_tokens", "context_tokens"]).index
    rank = points.loc[order].groupby(GROUP + ["phase"]).cumcount()
    return rank.reindex(points.index).to_numpy() % k


@dataclass(frozen=True)
class Calibration:
    profile: EngineProfile
    points: pd.DataFrame  # with before_ms, fit_ms, cv_ms columns
    folds: int


def _fold_fit(shared, held):
    """Predictions for the held-out points of one fold (a work unit)."""
    points, base = shared
    profile = fit_profile(points[~held], base)
    return predict_ms(points[held].reset_index(drop=True), profile)


def calibrate(points: pd.DataFrame, base: EngineProfile, k: int = 5, progress=None, run: Runner = serial) -> Calibration:
    """Fit, and measure the error before (base profile), in-sample, and k-fold (the k fold
    fits are work units for `run`, which reports each fold's end)."""
    points = points.reset_index(drop=True)
    fitted = fit_profile(points, base)
    if progress:
        progress()
    cv = np.full(len(points), np.nan)
    if k >= 2:
        fold = folds(points, k)
        masks = [fold == f for f in range(k) if (fold == f).any() and (fold != f).any()]
        for held, predicted in zip(masks, run(_fold_fit, masks, (points, base)), strict=True):
            cv[held] = predicted
    table = points.assign(before_ms=predict_ms(points, base), fit_ms=predict_ms(points, fitted), cv_ms=cv)
    return Calibration(fitted, table, k)


def report(cal: Calibration) -> dict:
    """MAPE before, fitted and cross-validated, per (model, hardware, TP, phase) and per phase."""
    t = cal.points
    errors = t.assign(before=ape_pct(t.before_ms, t.latency_ms), fit=ape_pct(t.fit_ms, t.latency_ms),
                      cv=ape_pct(t.cv_ms, t.latency_ms))
    groups = []
    for (model, hw, tp, phase), rows in errors.groupby(GROUP + ["phase"], sort=True):
        groups.append({"model": model, "hardware": hw, "tp": int(tp), "phase": phase, "points": len(rows),
                       "mape_before_pct": float(rows.before.mean()), "mape_fit_pct": float(rows.fit.mean()),
                       "mape_cv_pct": float(rows.cv.mean()) if rows.cv.notna().all() else None})
    overall = {}
    for phase, rows in errors.groupby("phase", sort=True):
        overall[phase] = {"points": len(rows), "mape_before_pct": float(rows.before.mean()),
                          "mape_fit_pct": float(rows.fit.mean()),
                          "mape_cv_pct": float(rows.cv.mean()) if rows.cv.notna().all() else None}
    return {"groups": groups, "overall": overall}
