"""The capacity model's internals, computed by hand: the decode fixed point, KV peak,
the KV transfer in TBT, the split of requests over token types, and repair's choice."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitplan import api
from splitplan.capacity.pools import _decode_steps, decode_pool
from splitplan.perf.roofline import kv_transfer_time_s
from splitplan.search.evaluation import decode_values, evaluate
from splitplan.search.types import Option, Problem
from splitplan.search.types import OptionKey as K
from splitplan.specs.layout import Layout
from splitplan.specs.slo import load_slo
from splitplan.workload.trace import Trace
from tests.capacity.python_replay import python_replay

H100 = api.instance("llama2-70b", "h100-80gb", 8, "lean")
A100 = api.instance("llama2-70b", "a100-80gb", 8, "lean")


def test_identical_requests_decode_at_the_whole_batch_per_instance():
    n, instances, p, o = 12, 3, 1000, 50
    res = decode_pool(np.zeros(n), np.full(n, p), np.full(n, o), H100, instances)
    # all decode together: n / instances requests per instance, each at context p + o/2
    assert res.step_s == pytest.approx(np.full(n, float(H100.decode_step_time_s(n / instances, p + o / 2))), rel=1e-12)
    assert res.mean_batch == pytest.approx(n / instances)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=200), st.integers(1, 40), st.floats(1.0, 1e5))
def test_decode_steps_by_count_are_the_formula_per_request(active, instances, context):
    # the fixed point evaluates its step once per count of requests open, then indexes: the same floats
    active = np.array(active, np.int64)
    per_request = H100.decode_step_time_s(np.maximum(active / instances, 1.0), context)
    assert np.array_equal(_decode_steps(H100, active, instances, context), per_request)


def test_kv_peak_is_the_most_held_at_once_per_instance():
    cap = H100.fit.kv_capacity_tokens
    start = np.array([0.0, 0.0, 1000.0])  # the third starts long after the first two finished
    p, o = np.array([1000, 2000, 5000]), np.array([10, 10, 10])
    res = decode_pool(start, p, o, H100, 2)
    assert res.kv_peak_fraction == pytest.approx(max(1010 + 2010, 5010) / 2 / cap, rel=1e-12)


def _keyed(*options):
    return {o.key: o for o in options}


def _problem(trace, slo="splitwise"):
    profile = load_slo(slo)
    from splitplan.perf.slo import alone_latencies
    ref = api.instance("llama2-70b", profile.reference.hardware, profile.reference.tp, "lean") if profile.reference else None
    reference = alone_latencies(ref, trace.prompt_tokens, trace.output_tokens) if ref else None
    return Problem(trace, profile, reference)


def test_predicted_tbt_carries_the_kv_transfer():
    trace = Trace(np.array([0.0, 0.5, 1.0]), np.array([300, 3000, 6000]), np.array([20, 40, 80]), "t")
    problem = _problem(trace)
    start = trace.arrival_s + 0.2
    tbt, decode_s, res = decode_values(problem, A100, 2, H100, start)
    transfer = kv_transfer_time_s(H100, A100, trace.prompt_tokens)
    assert decode_s == pytest.approx(transfer + (trace.output_tokens - 1) * res.step_s, rel=1e-12)
    assert tbt == pytest.approx(decode_s / trace.output_tokens, rel=1e-12)


def test_requests_split_over_token_types_in_proportion_to_capacity():
    n = 2000
    trace = Trace(np.arange(n) * 0.01, np.full(n, 500), np.full(n, 20), "t")
    problem = _problem(trace)
    options = _keyed(Option("prompt", H100, 4, "t"),
                     Option("token", H100, 2, "t"),  # one machine: half of what the load needs
                     Option("token", A100, 4, "t"))  # three machines: 3/4 of it
    counts = {K("prompt", "h100-80gb", Layout(8)): 4, K("token", "h100-80gb", Layout(8)): 1, K("token", "a100-80gb", Layout(8)): 3}
    values = evaluate(problem, counts, options)
    # the H100 decodes 0.5 / (0.5 + 0.75) = 40 % of the requests: its shorter transfer-free decode
    # (H100 to H100 vs H100 to A100 steps differ) tells which requests went where
    alone_h = decode_pool(np.zeros(1), np.array([500]), np.array([20]), H100, 1).step_s[0]
    alone_a = decode_pool(np.zeros(1), np.array([500]), np.array([20]), A100, 1).step_s[0]
    assert alone_h < alone_a
    on_h100 = values.tbt < np.median([values.tbt.min(), values.tbt.max()])
    assert on_h100.mean() == pytest.approx(0.4, abs=0.01)


def test_repair_adds_the_machine_that_improves_the_failing_line_most_per_dollar():
    from splitplan.perf.slo import achieved
    from splitplan.search.evaluation import check
    from splitplan.search.repair import best_move
    rng = np.random.default_rng(0)
    n = 300
    trace = Trace(np.sort(rng.uniform(0, 30, n)), rng.integers(500, 4000, n), rng.integers(10, 200, n), "t")
    problem = _problem(trace)
    options = _keyed(Option("prompt", H100, 3, "t"), Option("prompt", A100, 5, "t"),
                     Option("token", H100, 2, "t"), Option("token", A100, 3, "t"))
    start = {K("prompt", "a100-80gb", Layout(8)): 1, K("token", "h100-80gb", Layout(8)): 2}  # too few prompt machines: TTFT fails
    line, value = next((line, v) for line, v, ok in check(problem, evaluate(problem, start, options)) if not ok)
    assert line.metric == "ttft"
    gain = {}  # TTFT moves only: one more prompt machine of either type, per dollar
    for key in (K("prompt", "h100-80gb", Layout(8)), K("prompt", "a100-80gb", Layout(8))):
        trial = {**start, key: start.get(key, 0) + 1}
        gain[key] = (value - achieved(line, evaluate(problem, trial, options).ttft, problem.reference)) / options[key].price_usd_per_hour
    assert len(set(gain.values())) == 2
    best = max(gain, key=gain.get)
    counts, values = best_move(problem, start, options, line, value)
    assert counts == {**start, best: start.get(best, 0) + 1}


def test_repair_grows_an_instance_over_two_machines_by_two_machines():
    """A TP 8 x PP 2 prompt instance spans two machines: one more machine would add no instance,
    so the move that helps is two."""
    from splitplan.search.evaluation import check
    from splitplan.search.repair import best_move
    rng = np.random.default_rng(1)
    n = 400
    trace = Trace(np.sort(rng.uniform(0, 10, n)), rng.integers(2000, 8000, n), rng.integers(10, 100, n), "t")
    problem = _problem(trace)
    pipelined = api.instance("llama2-70b", "h100-80gb", Layout(8, pp=2), "lean")
    assert pipelined.unit_machines == 2
    options = _keyed(Option("prompt", pipelined, 4, "t"), Option("token", H100, 2, "t"))
    start = {K("prompt", "h100-80gb", Layout(8, pp=2)): 2, K("token", "h100-80gb", Layout(8)): 2}
    line, value = next((line, v) for line, v, ok in check(problem, evaluate(problem, start, options)) if not ok)
    assert line.metric == "ttft"
    counts, _ = best_move(problem, start, options, line, value)
    assert counts[K("prompt", "h100-80gb", Layout(8, pp=2))] == 4


@pytest.mark.parametrize("held", [False, True])
def test_routing_from_a_heap_is_the_scan(monkeypatch, held):
    """Past pools.HEAP_ROUTING_INSTANCES the prompt replay picks the least-loaded instance from a heap; it
    places every request where the scan does (ties to the lowest index) and gives the same TTFT."""
    from splitplan.capacity import pools
    from splitplan.perf.roofline import Instance
    from splitplan.specs.engine import load_engine
    from splitplan.specs.hardware import load_hardware
    from splitplan.specs.model import load_model
    rng = np.random.default_rng(4)
    n = 3000
    arrival = np.cumsum(rng.exponential(1 / 400, n))
    prompt = rng.choice([100, 500, 500, 2000, 7000], n)  # (repeated sizes: equal loads, ties)
    inst = Instance(load_model("llama3.1-8b"), load_hardware("h100-80gb"), load_engine("vllm"), Layout(1))
    held_s = rng.uniform(0.5, 5.0, n) if held else None

    def replay(run):
        ttft, _, placed = run(arrival, prompt, [(inst, 24)], 8192, held_s=held_s, chunked=True)
        return ttft, placed.tolist()
    heap_ttft, heap_placed = replay(pools.replay_prompts)
    monkeypatch.setattr(pools, "HEAP_ROUTING_INSTANCES", 10_000)  # (the Python replay's scan)
    scan_ttft, scan_placed = replay(python_replay)
    assert heap_placed == scan_placed and len(set(scan_placed)) == 24
    np.testing.assert_array_equal(heap_ttft, scan_ttft)


def test_a_plans_values_do_not_depend_on_when_the_trace_starts():
    """Every arrival later by an hour: the same latencies and utilization (measured over the
    trace's own span, from its first arrival)."""
    n = 400
    trace = Trace(np.arange(n) * 0.05, np.full(n, 500), np.full(n, 20), "t")
    later = Trace(trace.arrival_s + 3600.0, trace.prompt_tokens, trace.output_tokens, "t")
    options = _keyed(Option("prompt", H100, 2, "t"), Option("token", H100, 2, "t"))
    counts = {K("prompt", "h100-80gb", Layout(8)): 2, K("token", "h100-80gb", Layout(8)): 2}
    now, then = (evaluate(_problem(t), counts, options) for t in (trace, later))
    assert now.utilization == pytest.approx(then.utilization, rel=1e-9)
    assert then.e2e == pytest.approx(now.e2e, rel=1e-9)
