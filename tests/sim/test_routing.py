"""Join-shortest-queue from a heap (the tests' Python loops past HEAP_ROUTING_INSTANCES): the same pick
as the scan."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sim.python_loop import LeastLoaded


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.lists(st.tuples(st.integers(0, 39), st.integers(-50, 50)), max_size=200))
def test_least_loaded_is_the_lowest_index_of_least_load(count, changes):
    loads, plain = LeastLoaded([0] * count), [0] * count
    for k, delta in changes:
        k %= count
        loads[k] += delta
        plain[k] += delta
        assert loads.least() == plain.index(min(plain)) and loads == plain
