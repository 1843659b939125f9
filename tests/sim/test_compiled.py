"""The simulator's compiled run (splitplan_core.run) against the Python event loop it stands in for:
every result the same, to the bit."""

import dataclasses

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import splitplan.sim.cluster as cluster
from splitplan import api
from splitplan.base import limits
from splitplan.base.errors import SpecError
from splitplan.perf.table import PerfDb
from splitplan.sim.cluster import PoolSpec, SimOptions, simulate
from splitplan.workload.trace import Trace, default_trace_path, load_trace, resample_poisson
from tests.conftest import PERF_DB

TRACE = load_trace(default_trace_path())


def python_run(trace, pools, options):
    """The Python event loop, iteration by iteration (so its event count is the compiled run's)."""
    cluster.COMPILED, cluster.FUSE_DECODE_STRETCHES = False, False
    try:
        return simulate(trace, pools, options)
    finally:
        cluster.COMPILED, cluster.FUSE_DECODE_STRETCHES = True, True


def assert_same(a, b) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "trace":
            assert np.array_equal(x.arrival_s, y.arrival_s)
        elif isinstance(x, np.ndarray):
            assert np.array_equal(x, y, equal_nan=True), f.name
        else:
            assert x == y, f.name


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), engine=st.sampled_from(["lean", "vllm", "sglang-fp8", "trtllm-fp8"]),
       model=st.sampled_from(["llama2-70b", "bloom-176b"]), instances=st.sampled_from([1, 2, 5, 18]),
       load=st.floats(0.5, 3.0), budget=st.sampled_from([512, 2048, 8192]), seqs=st.sampled_from([None, 3, 64]),
       context=st.sampled_from([None, 2500]), routing=st.sampled_from(["jsq", "round-robin"]), cached=st.booleans(),
       clients=st.sampled_from([None, None, 1, 4, 40]), log=st.booleans())
@example(seed=1, engine="vllm", model="bloom-176b", instances=2, load=3.0, budget=8192, seqs=None, context=None,
         routing="jsq", cached=False, clients=None, log=False)  # (BLOOM's KV fills: preemptions)
@example(seed=2, engine="lean", model="bloom-176b", instances=1, load=3.0, budget=2048, seqs=3, context=2500,
         routing="round-robin", cached=True, clients=None, log=True)
@example(seed=3, engine="vllm", model="bloom-176b", instances=2, load=1.0, budget=2048, seqs=None, context=2500,
         routing="jsq", cached=False, clients=40, log=True)  # (a closed loop: refusals and rejections free their clients)
def test_compiled_run_is_the_python_run(seed, engine, model, instances, load, budget, seqs, context, routing, cached, clients,
                                        log):
    """Whole-prompt and chunked passes, async scheduling and a front-end latency (vllm), the
    sequence cap, refusals past max_model_len, rejections (a request longer than the KV),
    preemptions (BLOOM's small KV at high load), round-robin, join-shortest-queue past 16
    instances (the Python run's heap), prompts partly cached, open and closed loops (clients),
    the event log: the same result, event count and log included."""
    rng = np.random.default_rng(seed)
    trace = resample_poisson(TRACE, load * instances, 20.0, rng)
    if cached:
        trace = dataclasses.replace(trace, cached_tokens=rng.integers(0, 400, len(trace)))
    inst = api.instance(model, "h100-80gb", 8, engine)
    pools = [PoolSpec("mixed", inst, instances)]
    options = SimOptions(max_batch_tokens=budget, max_num_seqs=seqs, max_model_len=context, routing=routing,
                         concurrency=clients, warmup_requests=clients or 0, record_events=log)
    compiled = simulate(trace, pools, options)
    assert_same(compiled, python_run(trace, pools, options))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), engine=st.sampled_from(["lean", "vllm", "sglang-fp8", "trtllm-fp8"]),
       prompt_types=st.sampled_from([("h100-80gb",), ("h100-80gb", "a100-80gb")]),
       token_types=st.sampled_from([("a100-80gb",), ("h100-80gb", "a100-80gb")]), tp=st.sampled_from([4, 8]),
       counts=st.tuples(st.integers(1, 3), st.integers(1, 3)), load=st.floats(0.5, 3.0),
       budget=st.sampled_from([512, 8192]), seqs=st.sampled_from([None, 4]), context=st.sampled_from([None, 2500]),
       routing=st.sampled_from(["jsq", "round-robin"]), clients=st.sampled_from([None, None, 2, 30]),
       shared=st.sampled_from([None, None, 1, 2]), log=st.booleans())
@example(seed=0, engine="vllm", prompt_types=("h100-80gb",), token_types=("a100-80gb",), tp=4, counts=(3, 1), load=3.0,
         budget=8192, seqs=None, context=None, routing="jsq", clients=None, shared=None,
         log=False)  # (a100s at TP 4 hold few: decodes wait, long ones rejected)
@example(seed=1, engine="vllm", prompt_types=("h100-80gb",), token_types=("h100-80gb",), tp=4, counts=(3, 1), load=3.0,
         budget=8192, seqs=None, context=None, routing="jsq", clients=30, shared=2,
         log=True)  # (a closed loop on shared machines: transfers within a machine and between two)
def test_compiled_split_run_is_the_python_run(seed, engine, prompt_types, token_types, tp, counts, load, budget, seqs,
                                              context, routing, clients, shared, log):
    """Prompt and token pools of one or two machine types: KV transfers serialized and layer by
    layer over both instances' links (FIFO), token instances' KV admission and rejections,
    whole-prompt and chunked prefill, async scheduling, the sequence cap, refusals, round-robin,
    open and closed loops, the first prompt and token pools' instances sharing `shared` machines
    (a transfer within one over its GPU links, the NICs free), the event log: the same result,
    event count and log included."""
    rng = np.random.default_rng(seed)
    trace = resample_poisson(TRACE, load * counts[0], 20.0, rng)
    pools = ([PoolSpec("prompt", api.instance("llama2-70b", hw, tp, engine), counts[0]) for hw in prompt_types]
             + [PoolSpec("token", api.instance("llama2-70b", hw, tp, engine), counts[1]) for hw in token_types])
    if shared is not None and prompt_types[0] == token_types[0]:  # (one machine type: its instances share machines)
        first = (0, len(prompt_types))
        pools = [dataclasses.replace(p, machines=shared, instances_given=p.instances, shared=0) if k in first else p
                 for k, p in enumerate(pools)]
    options = SimOptions(max_batch_tokens=budget, max_num_seqs=seqs, max_model_len=context, routing=routing,
                         concurrency=clients, warmup_requests=clients or 0, record_events=log)
    compiled = simulate(trace, pools, options)
    assert_same(compiled, python_run(trace, pools, options))


def test_preemptions():
    """BLOOM's KV (about 52k tokens an instance) fills at this load: decodes are preempted and
    recomputed, some twice (the longer stall is the one kept); both runs agree."""
    trace = resample_poisson(TRACE, 12.0, 30.0, np.random.default_rng(1))
    trace = Trace(trace.arrival_s, trace.prompt_tokens, trace.output_tokens * 8, "t")
    pools = [PoolSpec("mixed", api.instance("bloom-176b", "h100-80gb", 8, "vllm"), 2)]
    compiled = simulate(trace, pools)
    assert compiled.preemptions > 20
    assert_same(compiled, python_run(trace, pools, SimOptions()))


def test_edge_cases_of_routing_and_batching():
    """Whole prompts (lean) that fill the token budget exactly share a pass; a request that
    arrives as an iteration ends is routed after it (to the instance it freed); a request
    larger than the KV is rejected and leaves its instance's routing load as it was (in a closed
    loop, its client sends the next)."""
    inst = api.instance("llama2-70b", "h100-80gb", 8, "lean")
    options = SimOptions(max_batch_tokens=2048)
    one, two = [PoolSpec("mixed", inst, 1)], [PoolSpec("mixed", inst, 2)]
    full = Trace(np.array([0.0, 0.001, 0.001]), np.array([500, 1000, 1048]), np.array([1, 1, 1]), "t")
    at_end = Trace(np.array([0.0, float(inst.prefill_time_s(1000))]), np.array([1000, 500]), np.array([1, 1]), "t")
    too_long = Trace(np.array([0.0, 1.0]), np.array([inst.max_request_tokens, 500]), np.array([10, 10]), "t")
    for trace, pools, check in [
            (full, one, lambda r: r.ttft_s[1] == r.ttft_s[2]),
            (at_end, two, lambda r: r.prompt_instance.tolist() == [0, 0]),
            (too_long, two, lambda r: r.rejected.tolist() == [True, False] and r.prompt_instance.tolist() == [0, 0])]:
        compiled = simulate(trace, pools, options)
        assert check(compiled)
        assert_same(compiled, python_run(trace, pools, options))
    closed = SimOptions(max_batch_tokens=2048, concurrency=1)  # (the rejected request frees its client for the next)
    compiled = simulate(too_long, one, closed)
    assert compiled.rejected.tolist() == [True, False] and np.isfinite(compiled.e2e_s[1])
    assert_same(compiled, python_run(too_long, one, closed))


def test_edge_cases_of_split_pools():
    """Two transfers to one token instance at once queue on its link; a prompt of exactly the
    engine's layer-wise threshold goes layer by layer; a request whose KV fills a token instance
    exactly is admitted, and its KV freed whole for the next; a prompt longer than a prompt
    instance holds is rejected at arrival."""
    inst = api.instance("llama2-70b", "a100-80gb", 8, "vllm")
    cap, threshold = inst.fit.kv_capacity_tokens, inst.engine.layerwise_transfer_min_tokens
    pools = [PoolSpec("prompt", inst, 2), PoolSpec("token", inst, 1)]
    same_time = Trace(np.array([0.0, 0.0]), np.array([300, 300]), np.array([5, 5]), "t")
    at_threshold = Trace(np.array([0.0, 5.0]), np.array([threshold - 1, threshold]), np.array([5, 5]), "t")
    full = Trace(np.array([0.0, 0.1]), np.array([cap - 10, cap - 10]), np.array([10, 10]), "t")
    too_long = Trace(np.array([0.0, 1.0]), np.array([inst.max_request_tokens + 1, 500]), np.array([2, 2]), "t")
    for trace, check in [
            (same_time, lambda r: r.transfer_s[1] > r.transfer_s[0]),
            (at_threshold, lambda r: r.transfer_s[1] < r.transfer_s[0]),  # (only the last layer's share exposed)
            (full, lambda r: np.isfinite(r.e2e_s).all()),
            (too_long, lambda r: r.rejected.tolist() == [True, False] and np.isnan(r.ttft_s[0]))]:
        compiled = simulate(trace, pools)
        assert check(compiled)
        assert_same(compiled, python_run(trace, pools, SimOptions()))


def test_the_iteration_limit_fails_as_the_python_run(monkeypatch):
    trace = resample_poisson(TRACE, 2.0, 10.0, np.random.default_rng(0))
    pools = [PoolSpec("mixed", api.instance("llama2-70b", "h100-80gb", 8, "vllm"), 1)]
    monkeypatch.setattr(limits, "MAX_SIM_ITERATIONS", 50)
    with pytest.raises(SpecError, match="passed 50 decode iterations"):
        simulate(trace, pools)
    with pytest.raises(SpecError, match="passed 50 decode iterations"):
        python_run(trace, pools, SimOptions())


def test_what_runs_in_python():
    """Measured tables, the mixed pool's borrowing and recorded passes run in the Python loop
    (decode stretches fused: fewer events than iterations); closed loops, pools sharing machines
    and event logs run compiled (every iteration an event, as the unfused Python loop counts)."""
    trace = resample_poisson(TRACE, 2.0, 20.0, np.random.default_rng(0))
    inst, half = api.instance("llama2-70b", "a100-80gb", 8, "vllm"), api.instance("llama2-70b", "a100-80gb", 4, "vllm")
    split = [PoolSpec("prompt", inst, 1), PoolSpec("token", inst, 1)]
    compiled = simulate(trace, split)
    for pools, options in [([PoolSpec("mixed", PerfDb(PERF_DB).require(inst), 1)], SimOptions()),
                           (split, SimOptions(borrow_threshold_tokens=4096)), (split, SimOptions(record_passes=True))]:
        assert simulate(trace, pools, options).events < python_run(trace, pools, options).events
    for pools, options in [([PoolSpec("mixed", inst, 1)], SimOptions(concurrency=4)),
                           ([PoolSpec("prompt", half, 1, shared=1), PoolSpec("token", half, 1, shared=1)], SimOptions()),
                           (split, SimOptions(record_events=True))]:
        assert simulate(trace, pools, options).events == python_run(trace, pools, options).events
    logged = simulate(trace, split, SimOptions(record_events=True))
    assert len(logged.event_log) == logged.events == compiled.events


def test_event_kinds_are_the_simulators():
    from splitplan.base.core import core
    from splitplan.sim.types import Event

    assert (core.ARRIVAL, core.KV_ARRIVED, core.ITERATION_END) == (Event.ARRIVAL, Event.KV_ARRIVED, Event.ITERATION_END)
