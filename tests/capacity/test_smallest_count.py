"""The count search (capacity.pools.smallest_count): the smallest holding count wherever it starts,
with or without a score to aim it, and fewer checks when the score is good (issue 31, item 2)."""

import math

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from splitplan.capacity.pools import MAX_INSTANCES, smallest_count


def _search(answer: int, lower: int, guess: int | None, score):
    checked: list[int] = []

    def check(n: int) -> bool:
        assert n >= lower and n not in checked  # (a count is checked once, never below the bound)
        checked.append(n)
        return n >= answer
    return smallest_count(check, lower, guess, score=None if score is None else (lambda n: score(n, answer))), checked


def smooth(n: int, answer: int) -> float:
    """Like a pool's share of requests past a line: falls smoothly as instances are added."""
    return (answer - 0.5) ** 3 / n**3


def far(n: int, answer: int) -> float:
    """A smooth score that points far past the answer."""
    return 1e6 / n


def noisy(n: int, answer: int) -> float:
    """A score that lies: it rises and falls with n, and is not even 1 at the answer."""
    return 0.5 + ((n * 7919) % 13) / 5.0


@settings(max_examples=400, deadline=None)
@example(answer=2, lower=1, guess=None, score=smooth)  # (bracketed by the walk: nothing left to aim at)
@given(answer=st.integers(1, 3000), lower=st.integers(1, 3000), guess=st.one_of(st.none(), st.integers(1, 4000)),
       score=st.sampled_from([None, smooth, far, noisy, lambda n, a: math.nan, lambda n, a: 0.0, lambda n, a: math.inf]))
def test_the_smallest_holding_count_whatever_the_score(answer, lower, guess, score):
    found, checked = _search(answer, lower, guess, score)
    assert found == max(answer, lower)
    if found > lower:  # (the count below the answer was seen to fail)
        assert found - 1 in checked
    assert len(checked) <= 2 * len(_search(answer, lower, guess, None)[1]) + 4  # (a lying score costs a bounded detour)


def test_nothing_holds_below_the_cap():
    found, _ = _search(MAX_INSTANCES + 1, 1, 100, smooth)
    assert found is None


def test_a_score_that_barely_falls_aims_within_the_cap():
    """Issue 54, item 1: a line no count reaches whose score falls by a hair per count aims its
    walk past any float (the crossing of an almost flat line); the search ends at the cap."""
    found = smallest_count(lambda n: False, 1, 3, score=lambda n: 2.0 - 1e-12 * n)
    assert found is None


@pytest.mark.parametrize(("bias", "most"), [(0, 0.5), (-4, 0.8), (4, 0.8), (-15, 1.0), (15, 1.0)])
def test_a_good_score_takes_fewer_checks(bias, most):
    """From guesses well off, over many answers: aimed by a smooth score, the search checks about
    half as many counts as the plain walk and bisection, and no more when the score's
    answer is off by a few counts (`bias`)."""
    plain = aimed = 0
    for answer in range(40, 1000, 7):
        for guess in (answer // 3, answer * 2 // 3, answer * 5 // 4, answer * 3):
            plain += len(_search(answer, 1, guess, None)[1])
            aimed += len(_search(answer, 1, guess, lambda n, a: smooth(n, a + bias))[1])
    assert aimed < most * plain


def holding_liar(n: int, answer: int) -> float:
    """A score that says every count holds (below 1, falling): from a start below the answer, its
    aims point behind the walk up and below the bracket, so none is taken."""
    return 0.5 / n


@settings(max_examples=200, deadline=None)
@given(answer=st.integers(2, 3000), lower=st.integers(1, 3000), guess=st.one_of(st.none(), st.integers(1, 4000)))
def test_a_score_pointing_the_wrong_way_leaves_the_plain_search(answer, lower, guess):
    assume(max(lower, guess or lower) < answer)
    assert _search(answer, lower, guess, holding_liar)[1] == _search(answer, lower, guess, None)[1]


def one_count_away():
    """A score that, from the last two counts it scored, always puts the answer one count
    past the latest (a failing score, falling): aimed walks would crawl but for their minimum
    step of a quarter of the plain step."""
    logs: list[tuple[int, float]] = []

    def score(n: int, answer: int) -> float:
        if not logs:
            value = 2.0
        else:
            m, lm = logs[-1]
            value = math.exp(lm - lm * (math.log(n) - math.log(m)) / (math.log(n + 1) - math.log(m))) if n > m else 2.0
        logs.append((n, math.log(value)))
        return value
    return score


@pytest.mark.parametrize(("answer", "guess"), [(1000, 10), (3000, 1), (500, 100)])
def test_a_score_one_count_away_costs_a_bounded_detour(answer, guess):
    found, checked = _search(answer, 1, guess, one_count_away())
    assert found == answer
    assert len(checked) <= 2 * len(_search(answer, 1, guess, None)[1]) + 4
