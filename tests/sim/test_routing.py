"""Join-shortest-queue from a heap: the same pick as the scan, in the simulator and the replay."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitplan import api
from splitplan.sim import routing
from splitplan.sim.cluster import PoolSpec, SimOptions, simulate
from splitplan.workload.trace import default_trace_path, load_trace, resample_poisson


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.lists(st.tuples(st.integers(0, 39), st.integers(-50, 50)), max_size=200))
def test_least_loaded_is_the_lowest_index_of_least_load(count, changes):
    loads, plain = routing.LeastLoaded([0] * count), [0] * count
    for k, delta in changes:
        k %= count
        loads[k] += delta
        plain[k] += delta
        assert loads.least() == plain.index(min(plain)) and loads == plain


@pytest.mark.parametrize("colocated", [False, True])
def test_the_simulator_routes_from_a_heap_as_it_scans(monkeypatch, colocated):
    """Pools past HEAP_ROUTING_INSTANCES: every request on the instances the scan picks, the same
    latencies."""
    trace = resample_poisson(load_trace(default_trace_path()), 60.0, 30.0, np.random.default_rng(2))
    inst = api.instance("llama3.1-8b", "h100-80gb", 1, "vllm")
    pools = ([PoolSpec("mixed", inst, 3)] if colocated
             else [PoolSpec("prompt", inst, 3), PoolSpec("token", inst, 3)])  # 24 instances a pool

    def run():
        result = simulate(trace, pools, SimOptions())
        return result.prompt_instance, result.token_instance, result.ttft_s, result.e2e_s
    heap = run()
    monkeypatch.setattr(routing, "HEAP_ROUTING_INSTANCES", 10_000)
    scan = run()
    assert len(set(scan[0].tolist())) > 8  # (the light load leaves the highest indices idle)
    for a, b in zip(heap, scan, strict=True):
        np.testing.assert_array_equal(a, b)
