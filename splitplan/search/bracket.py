"""One rate search for every question of the form "the highest rate that still passes"."""

from __future__ import annotations

import dataclasses

from splitplan.search.accounting import plan_counts
from splitplan.search.evaluation import check, evaluate

SPAN = 4096.0  # bracket at most this factor above or below the starting rate
TOLERANCE = 1.02  # bisect until the bracket is within 2 %


def bracket_bisect(attempt, start: float, known=None, span: float = SPAN, tolerance: float = TOLERANCE):
    """The highest x at which `attempt(x)` gives a result (not None), assuming it passes
    below any x where it passes: bracketed by doubling from `start` (or halving, when
    `start` fails; `known` is `start`'s result if already computed), then bisected
    geometrically until hi / lo <= `tolerance`. Returns (lo, its result, hi): hi is None
    when every x up to start x `span` passes; lo is None (and hi the lowest x tried)
    when nothing passes down to start / `span`."""
    x = start
    result = known if known is not None else attempt(start)
    if result is not None:
        lo, lo_result, hi = start, result, None
        while hi is None and x < start * span:
            x *= 2
            result = attempt(x)
            if result is None:
                hi = x
            else:
                lo, lo_result = x, result
    else:
        hi, lo, lo_result = start, None, None
        while lo is None and x > start / span:
            x /= 2
            result = attempt(x)
            if result is not None:
                lo, lo_result = x, result
        if lo is None:
            return None, None, x
    assert lo is not None  # (bracketed above)
    while hi is not None and hi / lo > tolerance:
        mid = (lo * hi) ** 0.5
        result = attempt(mid)
        if result is None:
            hi = mid
        else:
            lo, lo_result = mid, result
    return lo, lo_result, hi


def plan_max_rate(problem, plan, by_key) -> float | None:
    """The highest request rate these machines serve under the SLO: the trace's
    timestamps compressed (or stretched), bracketed and bisected to 2 %, each rate
    checked with the whole-trace evaluation the plans were verified with (the trace's
    own rate is known to pass)."""
    trace = problem.trace
    counts = plan_counts(plan)
    if trace.span_s <= 0 or any(key not in by_key for key in counts) or (plan.mixed_pools and len(counts) != 1):
        return None
    base = trace.mean_rate_rps

    def serves(rate):
        scaled = dataclasses.replace(problem, trace=trace.at_rate(rate))
        values = evaluate(scaled, counts, by_key)
        return True if values.kv_peak_fraction <= 1 and all(ok for _, _, ok in check(scaled, values)) else None

    return bracket_bisect(serves, base, known=True)[0]
