"""An engine profile's factors fitted to serving benchmarks replayed as they ran
(`splitplan calibrate --bench`; the replays: sim.bench_replay).

The fit (`fit`) is a maximum a posteriori estimate: the log ratio of predicted to measured
figures (each with its noise, `METRIC_NOISE`: how far the model is trusted on it) and, for each
factor (`BENCH_FACTORS`), a Gaussian prior at the starting profile's value, within physical
bounds. A factor the runs do not pin stays at the prior; how much of each factor the data pinned
is its `pinned` share: 1 - its posterior variance over its prior variance, from the fit's
Jacobian (0: the prior alone, 1: the data alone). One light-load run pins a decode step and the
overheads it adds to, not a whole profile; runs at several loads pin more.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from splitplan.perf.bounds import at_bounds
from splitplan.perf.bounds import bounds as fit_bounds
from splitplan.sim.bench_replay import Replay, predict
from splitplan.specs.engine import EngineProfile

# name: (lower, upper, share, floor): a factor's prior spread is `share` of its prior value, at
# least `floor` (the factor's unit). Bounds are physical (perf.bounds lowers compute's to the
# GPU's measured GEMM ceiling); the spreads say how far a team's engine build and machine
# plausibly sit from the shipped profile's: an efficiency within a quarter or a sixth of it, a
# step's host overheads within their own size (a build or host CPU that takes twice or half the
# shipped host time), the API front end within 5 ms. (Until 2026-12-07 the overheads' spreads were
# fixed, 2 ms a prefill pass, 1 ms a step, 20 us a request: beside `vllm`'s 0.5 ms, 0.6 ms and
# 6 us, one light run moved them far enough to overload the busier stages it did not see,
# docs/accuracy.md#calibration-from-benchmarks.)
BENCH_FACTORS = {
    "compute_efficiency": (0.1, 1.0, 0.25, 0.0),
    "memory_efficiency": (0.3, 0.95, 0.15, 0.0),
    "prefill_overhead_s": (0.0, 0.05, 1.0, 1e-4),
    "decode_overhead_s": (0.0, 0.02, 1.0, 1e-4),
    "sequence_overhead_s": (0.0, 2e-4, 1.0, 1e-6),
    "frontend_latency_s": (0.0, 0.05, 0.0, 5e-3),  # (engine-wide: the API server's, not the GPU's)
}


def prior_spread(name: str, prior: float) -> float:
    """The prior's standard deviation for factor `name` at value `prior` (BENCH_FACTORS)."""
    share, floor = BENCH_FACTORS[name][2:]
    return max(share * prior, floor)


# Spread of log(predicted / measured) each figure is trusted to: how far the model itself misses
# it, not only how well a benchmark repeats it (its means within a few %). The model's TTFT is
# its least certain figure (held out by model, the vllm profile's mean TTFT is off by 9 % where
# its TPOT is by 5 %, by 57 and 12 % before its kernel curves: docs/accuracy.md; on MoE
# deployments by 60 % and more), and tails less certain than means; a
# figure trusted beyond the model would move a factor far past physics to explain what the
# model leaves out (one closed loop's TTFT drove an fp8 GEMM efficiency from 0.72 to 0.32,
# and its busier runs' TPOT 35 % high: bench/bench_calibration.py).
METRIC_NOISE = {"ttft_mean": 0.25, "ttft_p50": 0.25, "ttft_p90": 0.35, "ttft_p99": 0.5, "tpot_mean": 0.05,
                "e2e_mean": 0.05, "e2e_p50": 0.05, "e2e_p90": 0.1, "e2e_p99": 0.2}
PINNED = 0.5  # a factor whose pinned share reaches this is said to be pinned by the data


def metric_noise(metric: str) -> float:
    return METRIC_NOISE[metric]


def factor_value(profile: EngineProfile, name: str, hardware: str, tp: int, model: str) -> float:
    """`name`'s value for this machine, TP and model (a profile field, or its factors there)."""
    if name in type(profile).model_fields:
        return float(getattr(profile, name))
    return float(getattr(profile.factors(hardware, tp, model), name))


def with_factors(profile: EngineProfile, values: dict[str, float], hardware: str) -> EngineProfile:
    """`profile` with `values` set: engine-wide ones (a profile field) on the profile, the rest as
    the machine's overrides (`hardware_overrides[hardware]`), its narrower keys (`HW/tpN...`,
    fitted to other data) dropped so that these apply at every TP and model there."""
    values = dict(values)
    top = {k: values.pop(k) for k in list(values) if k in type(profile).model_fields}
    overrides = {k: v for k, v in profile.hardware_overrides.items() if not k.startswith(f"{hardware}/")}
    mine = overrides.get(hardware)
    merged = {**(mine.model_dump(exclude_unset=True) if mine else {}), **values}
    overrides[hardware] = type(profile.defaults).model_validate(merged)
    return profile.model_copy(update={**top, "hardware_overrides": overrides})


@dataclass(frozen=True)
class BenchFit:
    profile: EngineProfile
    names: tuple[str, ...]  # the factors fitted
    prior: dict[str, float]
    fitted: dict[str, float]
    pinned: dict[str, float]  # share of each factor the data pinned (module docstring)
    at_bound: dict[str, str]

    @property
    def timed_by_curves(self) -> list[str]:
        """The factors left out: those the profile's measured kernel curves time on the runs' machine."""
        return [k for k in BENCH_FACTORS if k not in self.names]


def fitted_names(base: EngineProfile, replays: list[Replay]) -> list[str]:
    """The factors of BENCH_FACTORS these runs can move: all but the efficiencies measured kernel
    curves replace on their machine (sim.deployments.timed_by_curves)."""
    from splitplan.sim.deployments import timed_by_curves
    hw = replays[0].instance.hardware
    return [k for k in BENCH_FACTORS if not timed_by_curves(k, base, hw)]


def fit(replays: list[Replay], base: EngineProfile, max_evaluations: int = 40) -> BenchFit:
    """`base` with BENCH_FACTORS fitted to the runs (all on one machine type), as the module
    docstring says; every run is simulated at every evaluation."""
    from scipy.optimize import least_squares  # (on first use)
    inst = replays[0].instance
    hardware, tp, model = inst.hardware.name, inst.layout.tp, inst.model.name
    names = fitted_names(base, replays)
    lower, upper, why = fit_bounds({k: BENCH_FACTORS[k] for k in names}, names, [inst.hardware], base.weights)
    prior = np.clip([factor_value(base, k, hardware, tp, model) for k in names], lower, upper)
    spread = np.array([prior_spread(k, p) for k, p in zip(names, prior, strict=True)])
    measured = [(r, m, v) for r in replays for m, v in r.measured_ms.items()]
    target = np.log([v for _, _, v in measured])
    noise = np.array([metric_noise(m) for _, m, _ in measured])

    def profile_at(u) -> EngineProfile:  # (u - 1: each factor's distance from its prior, in prior spreads)
        return with_factors(base, dict(zip(names, (float(v) for v in prior + (u - 1) * spread), strict=True)), hardware)

    def residuals(u):
        profile = profile_at(u)
        predicted = {r.name: predict(r, profile) for r in replays}
        values = np.array([predicted[r.name][m] for r, m, _ in measured])
        data = np.where(np.isfinite(values) & (values > 0), (np.log(np.maximum(values, 1e-12)) - target) / noise, 1e3)
        return np.concatenate([data, u - 1])

    # in prior spreads, every factor moves on one scale: the finite-difference step (a tenth of a
    # spread) is a change the simulator resolves, and the Jacobian is per spread as the posterior
    # wants it; the prior sits at 1, not 0 (the trust region starts as large as the start vector)
    result = least_squares(residuals, np.ones(len(names)), bounds=(1 + (lower - prior) / spread, 1 + (upper - prior) / spread),
                           diff_step=0.1, max_nfev=max_evaluations)
    jac = np.asarray(result.jac)[: len(measured)]
    posterior = np.linalg.inv(jac.T @ jac + np.eye(len(names)))
    pinned = {k: float(np.clip(1 - posterior[i, i], 0, 1)) for i, k in enumerate(names)}
    x = prior + (result.x - 1) * spread
    ended = at_bounds(names, x, lower, upper, why)
    return BenchFit(profile_at(result.x), tuple(names), dict(zip(names, map(float, prior), strict=True)),
                    dict(zip(names, map(float, x), strict=True)), pinned, ended)
