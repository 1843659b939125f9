"""SLO evaluation, one home for the planner, the simulator and the reports: each request's
latencies alone on an idle instance (what a slowdown limit divides by), a line's achieved
percentile, whether it meets its limit, and the share of requests within it.

A request alone: its prefill, then one decode step per further output token at batch 1,
each at the request's mean context (prompt + output / 2). TTFT is the prefill; the TBT
reference is one such step (a slowdown's denominator must be positive, also for one-token
answers); E2E = TTFT + step x (output - 1). TBT as measured, (E2E - TTFT) / output, is
`measured_tbt_s`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from splitplan.base.errors import InfeasibleError, SpecError
from splitplan.perf.model import PerfModel
from splitplan.specs.slo import SloLine, SloProfile


@dataclass(frozen=True)
class Reference:
    """Each request's latencies alone on one instance (seconds)."""

    ttft_s: np.ndarray
    tbt_s: np.ndarray  # one decode step at batch 1 and the request's mean context
    e2e_s: np.ndarray
    output_tokens: np.ndarray

    @property
    def measured_tbt_s(self) -> np.ndarray:
        """TBT as the metric defines it, (E2E - TTFT) / output, for the request alone."""
        return self.tbt_s * np.maximum(self.output_tokens - 1, 0) / self.output_tokens

    def value(self, metric: str) -> np.ndarray | Gaps:
        """The requests' alone latencies in `metric`, as measured: per request for ttft, tbt, tpot
        (NaN for one-token answers, which have no gap) and e2e; for itl, every gap (a `Gaps`: one
        step each after the first token)."""
        if metric == "tbt":
            return self.measured_tbt_s
        gaps = np.maximum(self.output_tokens - 1, 0)
        if metric == "itl":
            return Gaps(self.tbt_s, gaps.astype(float))
        if metric == "tpot":
            return np.where(gaps > 0, self.tbt_s, np.nan)
        return getattr(self, f"{metric}_s")


def alone_latencies(inst: PerfModel, prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> Reference:
    p, o = np.asarray(prompt_tokens), np.asarray(output_tokens)
    ttft = np.asarray(inst.prefill_time_s(p))
    step = np.asarray(inst.decode_step_time_s(1, p + o // 2))
    return Reference(ttft, step, ttft + step * np.maximum(o - 1, 0), o)


def reference_for(profile: SloProfile, make: Callable[[str, int], PerfModel], prompt_tokens: np.ndarray,
                  output_tokens: np.ndarray) -> Reference | None:
    """The slowdown reference of `profile` (None for absolute profiles); `make(hardware, tp)`
    gives the reference instance's perf model (analytic, or measured with --perf-db)."""
    if profile.reference is None:
        return None
    hardware, tp = profile.reference.hardware, profile.reference.tp
    try:
        inst = make(hardware, tp)
    except InfeasibleError as exc:
        raise SpecError(f"SLO profile '{profile.name}' measures slowdown against {hardware} at TP {tp}, which cannot "
                        f"serve the model ({exc}); use an absolute profile (--slo chat, code-completion or batch) or "
                        f"give the profile a reference that holds the model") from None
    return alone_latencies(inst, prompt_tokens, output_tokens)


@dataclass(frozen=True)
class Gaps:
    """A distribution of inter-token gaps, compactly: `values_s` each counted `weights` times
    (the planner's prediction: each request's mean decode step, once per gap it has), read as
    the expanded sample would be (`percentile`, `share_within`)."""

    values_s: np.ndarray
    weights: np.ndarray

    @functools.cached_property
    def _sorted(self) -> tuple[np.ndarray, np.ndarray]:
        """The values of positive weight in ascending order, and their cumulative weights (sorted
        once: a profile's inter-token lines read several percentiles of one distribution). The
        order among equal values does not matter: a rank inside a run of them reads the run's value,
        and the weights (gap counts) sum exactly in any order; so the faster unstable sort."""
        ok = self.weights > 0
        v, w = self.values_s[ok], self.weights[ok]
        order = np.argsort(v)
        return v[order], np.cumsum(w[order])

    def percentile(self, q: float) -> float:
        """np.percentile (linear) of the expanded sample, without expanding it."""
        v, cum = self._sorted
        if not len(v):
            return float("nan")
        pos = (cum[-1] - 1) * q / 100
        lo, hi = int(np.floor(pos)), int(np.ceil(pos))
        at = np.searchsorted(cum, [lo + 1, hi + 1])  # the value holding rank lo, and rank hi
        return float(v[at[0]] + (v[at[1]] - v[at[0]]) * (pos - lo))

    def share_within(self, limit_s: float) -> float:
        return float(np.sum(self.weights[self.values_s <= limit_s]) / max(np.sum(self.weights), 1))


def scaled(line: SloLine, values_s: np.ndarray, reference: Reference | None) -> np.ndarray:
    """Per request, the value in the line's unit: milliseconds for an absolute limit, a factor
    of the reference for a slowdown. Requests without a value (rejected) are infinite."""
    v = np.asarray(values_s, float)
    out = v * 1e3 if line.max_ms is not None else v / getattr(reference, f"{line.metric}_s")
    return np.where(np.isfinite(out), out, np.inf)


def _kept(line: SloLine, values_s: np.ndarray, reference: Reference | None, keep: np.ndarray | None) -> np.ndarray:
    """`scaled` values of the requests `keep` marks (all when None)."""
    values = scaled(line, values_s, reference)
    return values if keep is None else values[keep]


def achieved(line: SloLine, values_s: np.ndarray | Gaps, reference: Reference | None, keep: np.ndarray | None = None) -> float:
    """The line's percentile, in its unit (infinite when that percentile has no value), over the
    requests `keep` marks (all by default); over every gap for an inter-token line (`Gaps`, or
    the gaps as an array)."""
    if isinstance(values_s, Gaps):
        value = values_s.percentile(line.percentile) * 1e3
        return value if np.isfinite(value) else float("inf")
    values = _kept(line, values_s, reference, keep)
    if not len(values):
        return float("inf")
    with np.errstate(invalid="ignore"):  # between two missing values: inf - inf
        value = float(np.percentile(values, line.percentile))
    return value if not np.isnan(value) else float("inf")


def meets(line: SloLine, value: float) -> bool:
    return bool(np.isfinite(value)) and value <= line.limit * (1 + 1e-9)


def attainment_pct(line: SloLine, values_s: np.ndarray | Gaps, reference: Reference | None, keep: np.ndarray | None = None) -> float:
    """The share of requests (of those `keep` marks) within the line's limit, in %; of gaps for
    an inter-token line."""
    if isinstance(values_s, Gaps):
        return values_s.share_within(line.limit * (1 + 1e-9) / 1e3) * 100
    values = _kept(line, values_s, reference, keep)
    return float(np.mean(values <= line.limit * (1 + 1e-9)) * 100) if len(values) else 0.0
