"""The one rate search: bracket by doubling or halving, then bisect geometrically."""

import pytest

from splitplan.search.bracket import bracket_bisect


def _counting(limit):
    calls = []

    def attempt(x):
        calls.append(x)
        return x if x <= limit else None
    return attempt, calls


def test_finds_the_highest_passing_value_within_tolerance_and_stops_doubling_at_the_first_failure():
    attempt, calls = _counting(10.0)
    lo, result, hi = bracket_bisect(attempt, 1.0)  # (the default: within 2 %, as max-rate reports)
    assert lo <= 10.0 < hi and hi / lo <= 1.02 and result == lo
    assert max(calls) == 16.0  # 1, 2, 4, 8, 16: the first failure ends the bracket
    assert len(calls) <= 5 + 6  # then bisection: log2(log(16 / 8) / log(1.02)) < 6 steps


def test_halves_when_the_start_fails_and_reports_nothing_below_the_span():
    attempt, calls = _counting(0.3)
    lo, _, hi = bracket_bisect(attempt, 1.0, tolerance=1.02)
    assert lo <= 0.3 < hi and hi / lo <= 1.02
    attempt, calls = _counting(-1.0)  # nothing passes
    lo, result, hi = bracket_bisect(attempt, 1.0, span=8.0)
    assert lo is None and result is None and hi == pytest.approx(1 / 8)
    assert min(calls) == pytest.approx(1 / 8)


def test_every_value_passing_up_to_the_span_leaves_hi_open():
    attempt, calls = _counting(1e9)
    lo, _, hi = bracket_bisect(attempt, 1.0, span=64.0)
    assert hi is None and lo == 64.0 and len(calls) == 7
