"""Fit an engine profile's factors to measured latencies.

The hardware stays datasheet; only engine factors move, each within physical
bounds (no efficiency above 1, no negative overhead). Residuals are log-ratios
(so a 10 % miss weighs the same at 30 ms and at 3 s) under a robust soft-L1 loss,
so a few anomalous measurements cannot drag the fit.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from splitplan.perf.roofline import Instance
from splitplan.specs.engine import EngineFactors, EngineProfile
from splitplan.specs.hardware import load_hardware
from splitplan.specs.model import load_model

# name: (lower, upper, scale) -- the scale keeps the optimizer's steps comparable.
FIT_BOUNDS = {
    "compute_efficiency": (0.05, 1.0, 1.0),
    "attention_efficiency": (0.01, 1.0, 1.0),
    "memory_efficiency": (0.3, 1.0, 1.0),
    "gemm_half_tokens": (0.0, 512.0, 100.0),
    "host_launch_s_per_layer": (0.0, 2e-3, 1e-3),
    "prefill_overhead_s": (0.0, 0.2, 1e-2),
    "decode_overhead_s": (0.0, 0.2, 1e-2),
    "sequence_overhead_s": (0.0, 5e-3, 1e-3),
    "collective_latency_s": (0.0, 5e-5, 1e-5),  # NCCL small-message all-reduce: tens of us
    "link_efficiency": (0.05, 1.0, 1.0),
}


def predict_ms(points: pd.DataFrame, profile: EngineProfile) -> np.ndarray:
    """Predicted latency for every measured point (same order as `points`)."""
    out = np.empty(len(points))
    for (model, hardware, tp), idx in points.groupby(["model", "hardware", "tp"]).groups.items():
        inst = Instance(load_model(model), load_hardware(hardware), profile, int(tp))
        rows = points.loc[idx]
        pre = rows["phase"].to_numpy() == "prefill"
        b = rows["batch"].to_numpy(float)
        p = rows["prompt_tokens"].to_numpy(float)
        c = rows["context_tokens"].to_numpy(float)
        t = np.where(
            pre,
            inst.pass_time_s(prefill_seqs=b, prefill_tokens=b * p, prefill_sq_tokens=b * p * p),
            inst.pass_time_s(decode_seqs=b, decode_context_tokens=b * c),
        )
        out[points.index.get_indexer(idx)] = t * 1e3
    return out


def mape_pct(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - measured) / measured) * 100)


def _fit_factors(points: pd.DataFrame, base: EngineProfile, start: EngineFactors) -> EngineFactors:
    """Factors (as `base`'s defaults) minimizing the robust log-error on `points`."""
    names = list(FIT_BOUNDS)
    lo = np.array([FIT_BOUNDS[n][0] for n in names])
    hi = np.array([FIT_BOUNDS[n][1] for n in names])
    scale = np.array([FIT_BOUNDS[n][2] for n in names])
    x0 = np.clip([getattr(start, n) for n in names], lo, hi)
    measured = points["latency_ms"].to_numpy(float)

    def profile_for(x):
        return base.model_copy(update={"defaults": start.model_copy(update=dict(zip(names, map(float, x))))})

    def residuals(x):
        return np.log(predict_ms(points, profile_for(x)) / measured)

    result = least_squares(residuals, x0, bounds=(lo, hi), x_scale=scale, loss="soft_l1", f_scale=0.05, max_nfev=400)
    return start.model_copy(update=dict(zip(names, map(float, result.x))))


def fit_profile(points: pd.DataFrame, base: EngineProfile, per_group: bool = True) -> EngineProfile:
    """`base` with its factors refit to `points` (medians from `read_measurements`).

    With `per_group`, each (machine type, TP) in the data gets its own factors
    (override key `HW/tpN`); each machine type gets the median of its TP fits
    (key `HW`, used at TP degrees not measured); the defaults become the median of
    all fits (used for machines not measured).
    """
    points = points.reset_index(drop=True)
    plain = base.model_copy(update={"hardware_overrides": {}})
    if not per_group:
        return plain.model_copy(update={"defaults": _fit_factors(points, plain, base.defaults)})
    fits: dict[tuple[str, int], EngineFactors] = {}
    for (hw, tp), rows in points.groupby(["hardware", "tp"], sort=True):
        fits[(hw, int(tp))] = _fit_factors(rows.reset_index(drop=True), plain, base.factors(hw, int(tp)))

    def median(start: EngineFactors, factors: list[EngineFactors]) -> EngineFactors:
        values = {n: float(np.median([getattr(f, n) for f in factors])) for n in FIT_BOUNDS}
        return EngineFactors(**{**start.model_dump(), **values})  # every field explicit

    overrides: dict[str, EngineFactors] = {}
    for hw in sorted({hw for hw, _ in fits}):
        overrides[hw] = median(base.factors(hw, 0), [f for (h, _), f in fits.items() if h == hw])
        for (h, tp), f in fits.items():
            if h == hw:
                overrides[f"{hw}/tp{tp}"] = EngineFactors(**f.model_dump())
    return plain.model_copy(update={"defaults": median(base.defaults, list(fits.values())), "hardware_overrides": overrides})
