"""The simulator's compiled run (splitplan_core.run) against the Python event loop it stands in for:
every result the same, to the bit."""

import dataclasses

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from splitplan import api
from splitplan.base import limits
from splitplan.base.core import core
from splitplan.base.errors import SpecError
from splitplan.perf.roofline import Instance
from splitplan.perf.table import PerfDb
from splitplan.sim.cluster import PoolSpec, SimOptions, _Cluster, simulate
from splitplan.sim.prefix_cache import CacheState
from splitplan.specs.engine import load_engine
from splitplan.specs.hardware import load_hardware
from splitplan.specs.model import load_model
from splitplan.specs.roles import Role
from splitplan.workload.prefix import PrefixTree
from splitplan.workload.trace import Trace, default_trace_path, load_trace, resample_poisson
from tests.conftest import DATA, PERF_DB
from tests.sim.python_loop import PythonLoop, python_run
from tests.sim.python_prefix_cache import PrefixCache

TRACE = load_trace(default_trace_path())


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
       clients=st.sampled_from([None, None, 1, 4, 40]), log=st.booleans(), record=st.booleans())
@example(seed=1, engine="vllm", model="bloom-176b", instances=2, load=3.0, budget=8192, seqs=None, context=None,
         routing="jsq", cached=False, clients=None, log=False, record=True)  # (BLOOM's KV fills: preemptions)
@example(seed=2, engine="lean", model="bloom-176b", instances=1, load=3.0, budget=2048, seqs=3, context=2500,
         routing="round-robin", cached=True, clients=None, log=True, record=False)
@example(seed=3, engine="vllm", model="bloom-176b", instances=2, load=1.0, budget=2048, seqs=None, context=2500,
         routing="jsq", cached=False, clients=40, log=True, record=True)  # (a closed loop: refusals and rejections free their clients)
def test_compiled_run_is_the_python_run(seed, engine, model, instances, load, budget, seqs, context, routing, cached, clients,
                                        log, record):
    """Whole-prompt and chunked passes, async scheduling and a front-end latency (vllm), the
    sequence cap, refusals past max_model_len, rejections (a request longer than the KV),
    preemptions (BLOOM's small KV at high load), round-robin, join-shortest-queue past 16
    instances (the Python run's heap), prompts partly cached, open and closed loops (clients),
    the event log, every iteration's pass recorded: the same result, event count, log and passes
    included."""
    rng = np.random.default_rng(seed)
    trace = resample_poisson(TRACE, load * instances, 20.0, rng)
    if cached:
        trace = dataclasses.replace(trace, cached_tokens=rng.integers(0, 400, len(trace)))
    inst = api.instance(model, "h100-80gb", 8, engine)
    pools = [PoolSpec("mixed", inst, instances)]
    options = SimOptions(max_batch_tokens=budget, max_num_seqs=seqs, max_model_len=context, routing=routing,
                         concurrency=clients, warmup_requests=clients or 0, record_events=log, record_passes=record)
    compiled = simulate(trace, pools, options)
    assert_same(compiled, python_run(trace, pools, options))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), engine=st.sampled_from(["lean", "vllm", "sglang-fp8", "trtllm-fp8"]),
       prompt_types=st.sampled_from([("h100-80gb",), ("h100-80gb", "a100-80gb")]),
       token_types=st.sampled_from([("a100-80gb",), ("h100-80gb", "a100-80gb")]), tp=st.sampled_from([4, 8]),
       counts=st.tuples(st.integers(1, 3), st.integers(1, 3)), load=st.floats(0.5, 3.0),
       budget=st.sampled_from([512, 8192]), seqs=st.sampled_from([None, 4]), context=st.sampled_from([None, 2500]),
       routing=st.sampled_from(["jsq", "round-robin"]), clients=st.sampled_from([None, None, 2, 30]),
       shared=st.sampled_from([None, None, 1, 2]), log=st.booleans(), record=st.booleans())
@example(seed=0, engine="vllm", prompt_types=("h100-80gb",), token_types=("a100-80gb",), tp=4, counts=(3, 1), load=3.0,
         budget=8192, seqs=None, context=None, routing="jsq", clients=None, shared=None,
         log=False, record=True)  # (a100s at TP 4 hold few: decodes wait, long ones rejected)
@example(seed=1, engine="vllm", prompt_types=("h100-80gb",), token_types=("h100-80gb",), tp=4, counts=(3, 1), load=3.0,
         budget=8192, seqs=None, context=None, routing="jsq", clients=30, shared=2,
         log=True, record=False)  # (a closed loop on shared machines: transfers within a machine and between two)
def test_compiled_split_run_is_the_python_run(seed, engine, prompt_types, token_types, tp, counts, load, budget, seqs,
                                              context, routing, clients, shared, log, record):
    """Prompt and token pools of one or two machine types: KV transfers serialized and layer by
    layer over both instances' links (FIFO), token instances' KV admission and rejections,
    whole-prompt and chunked prefill, async scheduling, the sequence cap, refusals, round-robin,
    open and closed loops, the first prompt and token pools' instances sharing `shared` machines
    (a transfer within one over its GPU links, the NICs free), the event log, the passes: the same
    result, event count, log and passes included."""
    rng = np.random.default_rng(seed)
    trace = resample_poisson(TRACE, load * counts[0], 20.0, rng)
    pools = ([PoolSpec("prompt", api.instance("llama2-70b", hw, tp, engine), counts[0]) for hw in prompt_types]
             + [PoolSpec("token", api.instance("llama2-70b", hw, tp, engine), counts[1]) for hw in token_types])
    if shared is not None and prompt_types[0] == token_types[0]:  # (one machine type: its instances share machines)
        first = (0, len(prompt_types))
        pools = [dataclasses.replace(p, machines=shared, instances_given=p.instances, shared=0) if k in first else p
                 for k, p in enumerate(pools)]
    options = SimOptions(max_batch_tokens=budget, max_num_seqs=seqs, max_model_len=context, routing=routing,
                         concurrency=clients, warmup_requests=clients or 0, record_events=log, record_passes=record)
    compiled = simulate(trace, pools, options)
    assert_same(compiled, python_run(trace, pools, options))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), interpolation=st.sampled_from(["splitplan", "splitwise-sim"]), split=st.booleans(),
       model=st.sampled_from(["llama2-70b", "bloom-176b"]), machine=st.sampled_from(["a100-80gb", "h100-80gb"]),
       engine=st.sampled_from(["lean", "vllm"]), load=st.floats(0.5, 4.0), budget=st.sampled_from([512, 8192]),
       clients=st.sampled_from([None, None, 16]), record=st.booleans())
@example(seed=0, interpolation="splitplan", split=False, model="bloom-176b", machine="a100-80gb", engine="vllm", load=4.0,
         budget=8192, clients=None, record=True)  # (BLOOM's KV fills: preemptions, recomputed passes past the table)
def test_compiled_measured_tables_are_the_python_ones(seed, interpolation, split, model, machine, engine, load, budget, clients,
                                                     record):
    """Passes timed from a measured table (the vendored Splitwise file, read either way): prompt
    work at the table's time for its tokens plus the decodes (1.1x with decodes, splitwise-sim's
    reading), decode steps from its lines; the same result to the bit, and the same lookups
    counted and extrapolated ones (short prompts and large batches lie outside the table)."""
    rng = np.random.default_rng(seed)
    trace = resample_poisson(TRACE, load, 20.0, rng)
    db = PerfDb(PERF_DB)
    options = SimOptions(max_batch_tokens=budget, concurrency=clients, warmup_requests=clients or 0, record_passes=record)

    def pools():  # (a measured instance counts its lookups: fresh ones for each run)
        measured = db.require(api.instance(model, machine, 8, engine), interpolation)
        return [PoolSpec("prompt", measured, 1), PoolSpec("token", measured, 1)] if split else [PoolSpec("mixed", measured, 2)]

    compiled_pools, python_pools = pools(), pools()
    assert_same(simulate(trace, compiled_pools, options), python_run(trace, python_pools, options))
    compiled, python = compiled_pools[0].perf, python_pools[0].perf
    assert (compiled.queries, compiled.extrapolated) == (python.queries, python.extrapolated)
    assert compiled.queries["decode"] > 0


def test_compiled_measured_tables_count_what_they_extrapolate():
    """Prompts shorter than the table's first point (60 tokens: it starts at 128), longer than its
    last (9,000 beside running decodes: it ends at 8,192), a context per decode past its last:
    counted as extrapolated, as the Python loop counts them."""
    short, long = np.full(40, 60), np.full(4, 9000)
    trace = Trace(np.concatenate((np.linspace(0.0, 0.5, 40), np.linspace(1.0, 1.3, 4))), np.concatenate((short, long)),
                  np.concatenate((np.full(40, 9000), np.full(4, 10))), "short prompts, long answers")
    counted = []
    for run in (simulate, python_run):
        measured = PerfDb(PERF_DB).require(api.instance("llama2-70b", "h100-80gb", 8, "lean"))
        run(trace, [PoolSpec("mixed", measured, 1)], SimOptions())
        counted.append((measured.queries, measured.extrapolated))
    assert counted[0] == counted[1]
    assert counted[0][1]["prefill"] > 0 and counted[0][1]["decode"] > 0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), engine=st.sampled_from(["lean", "vllm", "sglang-fp8"]),
       token_type=st.sampled_from(["a100-80gb", "h100-80gb"]), counts=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       load=st.floats(1.0, 8.0), threshold=st.sampled_from([0, 512, 4096, 20_000]), budget=st.sampled_from([512, 8192]),
       routing=st.sampled_from(["jsq", "round-robin"]), clients=st.sampled_from([None, None, 30]), record=st.booleans())
@example(seed=0, engine="vllm", token_type="a100-80gb", counts=(1, 1), load=6.0, threshold=512, budget=8192, routing="jsq",
         clients=None, record=False)  # (long queues and a full token instance: lent both ways, under async scheduling)
@example(seed=0, engine="lean", token_type="a100-80gb", counts=(2, 1), load=4.0, threshold=4096, budget=8192, routing="jsq",
         clients=None, record=True)  # (two prompt instances, one lent)
def test_compiled_mixed_pool_is_the_python_one(seed, engine, token_type, counts, load, threshold, budget, routing, clients,
                                              record):
    """Splitwise's mixed pool: a request whose KV would overfill its token instance goes to the
    one with most room, else is decoded on a prompt instance (one lent with room, else the least
    loaded), which takes new prompts only when every other queue is long; a prompt that finds
    every prompt queue long is prefilled on its token instance; under whole-prompt and chunked
    passes, async scheduling (requests deferred to the line they were headed for), open and
    closed loops: the same result to the bit."""
    rng = np.random.default_rng(seed)
    trace = resample_poisson(TRACE, load * counts[0], 20.0, rng)
    pools = [PoolSpec("prompt", api.instance("bloom-176b", "h100-80gb", 8, engine), counts[0]),  # (BLOOM's KV fills)
             PoolSpec("token", api.instance("bloom-176b", token_type, 8, engine), counts[1])]
    options = SimOptions(max_batch_tokens=budget, routing=routing, borrow_threshold_tokens=threshold, concurrency=clients,
                         warmup_requests=clients or 0, record_passes=record)
    compiled = simulate(trace, pools, options)
    assert_same(compiled, python_run(trace, pools, options))


def _mixed_pool_run(run, prompt, output, tokens: int, threshold: int):
    """(prefilling, decoding instance per request) of requests 1 ms apart on one BLOOM prompt
    instance (index 0) and `tokens` token instances (1 ...: 61,603 KV tokens each), whole prompts."""
    n = len(prompt)
    trace = Trace(np.arange(n) * 1e-3, np.array(prompt), np.array(output), "hand-made")
    inst = api.instance("bloom-176b", "h100-80gb", 8, "lean")
    result = run(trace, [PoolSpec("prompt", inst, 1), PoolSpec("token", inst, tokens)],
                 SimOptions(borrow_threshold_tokens=threshold))
    return result.prompt_instance.tolist(), result.token_instance.tolist()


@pytest.mark.parametrize("run", [simulate, python_run])
def test_mixed_pool_borrows_a_token_instance_past_the_threshold_not_at_it(run):
    """Request 0 is prefilling (its 1,000 tokens pending), 1 waits in the queue (1,000 more); 2's
    500 make 2,500 pending on a queue that is not empty: long past a threshold of 2,499, not at 2,500."""
    prompt, output = [1000, 1000, 500], [10, 10, 10]
    assert _mixed_pool_run(run, prompt, output, 1, 2500)[0] == [0, 0, 0]
    assert _mixed_pool_run(run, prompt, output, 1, 2499)[0] == [0, 0, 1]


@pytest.mark.parametrize("run", [simulate, python_run])
def test_mixed_pool_sends_a_request_short_of_kv_to_the_first_roomiest_token_instance(run):
    """Request 0 commits 40,010 KV tokens on token instance 1 with 10 output tokens, 1 and 2 1,100
    each on instances 2 and 3: request 3 (25,005) goes by join-shortest-queue (output tokens) to 1,
    does not fit there, and goes to the one with most room, the first of two equal ones: 2."""
    placed = _mixed_pool_run(run, [40_000, 100, 100, 25_000], [10, 1000, 1000, 5], 3, 10**9)[1]
    assert placed == [1, 2, 3, 2]


@pytest.mark.parametrize("run", [simulate, python_run])
def test_a_co_located_answer_of_one_token_frees_its_kv(run):
    """A co-located instance reserves a prompt's KV when it admits it and frees it when the request
    decodes or ends: thirty 10,000-token prompts answered in one token each, 2 s apart on one BLOOM
    instance (61,603 KV tokens), all finish and leave none reserved (they leaked, and the sixth on
    waited for KV forever, missing from every statistic)."""
    trace = Trace(np.arange(30) * 2.0, np.full(30, 10_000), np.ones(30, int), "one-token answers")
    pools = [PoolSpec("mixed", api.instance("bloom-176b", "h100-80gb", 8, "lean"), 1)]
    cluster = PythonLoop(trace, pools, SimOptions()) if run is python_run else _Cluster(trace, pools, SimOptions())
    result = cluster.run()
    assert np.isfinite(result.e2e_s).all()
    assert cluster.insts[0].kv_used == 0


def test_a_request_lost_by_the_core_fails_the_run(monkeypatch):
    """A request neither finished nor rejected would vanish from every statistic: the run fails
    loudly instead (a core that loses the first request, as one leaking KV did)."""
    run = core.run

    def losing(*args):
        out = run(*args)
        args[5][core.E2E, 0] = np.nan  # (times)
        return out

    monkeypatch.setattr(core, "run", losing)
    trace = Trace(np.arange(3) * 1.0, np.full(3, 100), np.full(3, 5), "three")
    with pytest.raises(RuntimeError, match="1 requests neither finished nor rejected"):
        simulate(trace, [PoolSpec("mixed", api.instance("llama2-70b", "h100-80gb", 8, "lean"), 1)])


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


def test_the_event_log_holds_every_event():
    trace = resample_poisson(TRACE, 2.0, 20.0, np.random.default_rng(0))
    inst = api.instance("llama2-70b", "a100-80gb", 8, "vllm")
    split = [PoolSpec("prompt", inst, 1), PoolSpec("token", inst, 1)]
    logged = simulate(trace, split, SimOptions(record_events=True))
    assert len(logged.event_log) == logged.events == simulate(trace, split).events


def test_event_kinds_are_the_simulators():
    from splitplan.sim.types import Event

    assert (core.ARRIVAL, core.KV_ARRIVED, core.ITERATION_END) == (Event.ARRIVAL, Event.KV_ARRIVED, Event.ITERATION_END)


MOONCAKE = load_trace(DATA / "mooncake_conversation.jsonl.gz")


def cache_state(cache) -> tuple:
    return (cache.last_use, cache.kids, cache.pins, list(cache.cpu), cache.cpu_used, cache.free_tokens, cache.resident_tokens,
            cache.hit_tokens, cache.lookup_tokens, cache.loaded_tokens, cache.evicted)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), engine=st.sampled_from(["vllm", "sglang-fp8", "lean"]), split=st.booleans(),
       instances=st.sampled_from([1, 2, 3]), gap_s=st.sampled_from([0.05, 0.5, 2.0]), memory=st.sampled_from([0.3, 0.9]),
       offload_gb=st.sampled_from([0.0, 0.0, 0.5, 200.0]), routing=st.sampled_from(["jsq", "prefix-aware", "round-robin"]),
       clients=st.sampled_from([None, None, 8]), budget=st.sampled_from([2048, 8192]), block=st.sampled_from([1, 16, 512]))
@example(seed=0, engine="vllm", split=False, instances=1, gap_s=0.05, memory=0.3, offload_gb=200.0, routing="jsq",
         clients=None, budget=8192, block=16)  # (a small KV: preemptions, evictions, loads from the host tier)
@example(seed=1, engine="vllm", split=True, instances=2, gap_s=0.5, memory=0.3, offload_gb=0.5, routing="prefix-aware",
         clients=8, budget=2048, block=16)
def test_compiled_prefix_caches_are_the_python_ones(seed, engine, split, instances, gap_s, memory, offload_gb, routing,
                                                    clients, budget, block):
    """A prefix cache per instance over Mooncake's prefix tree (the vendored sample): hits in
    whole blocks, pins, LRU eviction as running requests need the KV, the host tier written
    through and loaded back (a request out of its queue meanwhile), prefix-aware routing, token
    instances receiving only what their cache lacks, preemptions letting go of a prefix and
    finding it again, open and closed loops, whole-prompt and chunked passes: the same result to
    the bit, and every cache's end state (resident nodes and their last use, children, pins, the
    host tier in LRU order, the totals) the same."""
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.choice(len(MOONCAKE), 150, replace=False))
    trace = dataclasses.replace(MOONCAKE.take(keep), arrival_s=np.cumsum(rng.exponential(gap_s, 150)))
    update = {"memory_usable_fraction": memory, "kv_block_tokens": block}
    inst = Instance(load_model("llama3.1-8b"), load_hardware("h100-80gb"), load_engine(engine).model_copy(update=update), 1)
    trace = trace.take(trace.prompt_tokens + trace.output_tokens <= inst.max_request_tokens)
    pools = ([PoolSpec(Role.PROMPT, inst, 1, instances), PoolSpec(Role.TOKEN, inst, 1, 2)] if split
             else [PoolSpec(Role.MIXED, inst, 1, instances)])
    options = SimOptions(max_batch_tokens=budget, prefix_caching=True, kv_offload_gb=offload_gb, routing=routing,
                         concurrency=clients, warmup_requests=clients or 0)
    compiled, python = _Cluster(trace, pools, options), PythonLoop(trace, pools, options)
    python_result = python.run()
    assert_same(compiled.run(), python_result)
    assert [cache_state(c) for c in compiled.caches.values()] == [cache_state(c) for c in python.caches.values()]


@st.composite
def prefix_trees(draw):
    """A prefix tree (parents before children), its nodes of a few lengths (equal depths: ties); up to
    200 nodes, so that a cache's table grows."""
    n = draw(st.integers(1, 200))
    parent = [-1] + [draw(st.integers(-1, k - 1)) for k in range(1, n)]
    tokens = [draw(st.sampled_from([16, 32, 48])) for _ in range(n)]
    return PrefixTree(np.array(parent, np.int64), np.array(tokens, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))


@settings(max_examples=300, deadline=None)
@given(tree=prefix_trees(), block=st.sampled_from([1, 16]), cpu_tokens=st.sampled_from([0.0, 40.0, 100.0, 1e9]),
       ops=st.lists(st.tuples(st.sampled_from(["insert", "match", "peek", "resident", "pin", "unpin", "evict"]),
                              st.integers(0, 1000), st.integers(0, 300)), max_size=150))
def test_the_cores_prefix_cache_is_the_python_one(tree, block, cpu_tokens, ops):
    """The compiled cache (splitplan_core.PrefixCache, the one the compiled run keeps per instance)
    against sim.prefix_cache.PrefixCache, operation by operation over random trees: every answer
    and the whole state after each operation the same (resident nodes and last uses, children,
    pins, the host tier in LRU order, the totals), LRU ties (equal times and depths) included."""
    python = PrefixCache(tree, block, cpu_tokens)
    compiled = core.PrefixCache(tree.parent, tree.tokens, tree.depth, block, cpu_tokens)
    now, pinned = 0.0, []
    for op, x, y in ops:
        node, now = x % len(tree.parent), now + x % 2
        if op in ("match", "peek", "resident"):
            assert getattr(compiled, op)(node, y + 1) == getattr(python, op)(node, y + 1), op
        elif op == "insert":
            compiled.insert(node, now), python.insert(node, now)
        elif op == "pin":
            compiled.pin(node), python.pin(node)
            pinned.append(node)
        elif op == "unpin" and pinned:
            node = pinned.pop(x % len(pinned))
            compiled.unpin(node, now), python.unpin(node, now)
        elif op == "evict":
            compiled.evict(y - 100), python.evict(y - 100)
        assert cache_state(CacheState.from_core(*compiled.state())) == cache_state(python), op


def test_the_cores_cache_table_keeps_colliding_nodes_findable():
    """White box: nodes whose table buckets collide (the core's hash, `_bucket`, for its first
    64-entry table) fill interleaved probe chains that wrap past the table's end; evicting some of
    them (LRU, each freeing its slot) must leave every other one findable, as the Python cache's
    dicts do."""
    def bucket(node: int) -> int:
        return ((node * 11400714819323198485) % 2**64 >> 20) & 63
    nodes = [n for n in range(20_000) if bucket(n) in (61, 62, 63, 0)][:24]
    tree = PrefixTree(np.full(20_000, -1, np.int64), np.full(20_000, 16, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    order = np.random.default_rng(0).permutation(nodes).tolist()
    python, compiled = PrefixCache(tree), core.PrefixCache(tree.parent, tree.tokens, tree.depth)
    for t, node in enumerate(order):
        python.insert(node, float(t)), compiled.insert(node, float(t))
    for keep in (20, 13, 7, 2, 0):
        python.evict(16 * keep), compiled.evict(16 * keep)
        assert [compiled.peek(n, 100) for n in nodes] == [python.peek(n, 100) for n in nodes]
        assert sum(compiled.peek(n, 100) > 0 for n in nodes) == keep
        assert cache_state(CacheState.from_core(*compiled.state())) == cache_state(python)
