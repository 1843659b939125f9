"""The compiled prompt replay (splitplan_core.prompt_replay) is the Python replay (tests/capacity/python_replay.py):
the same TTFT, passes and placement to the bit, over random traces and every rule it follows."""

import dataclasses

import numpy as np
import pytest
import splitplan_core as core
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from splitplan import api
from splitplan.capacity.pools import BatchTimes, prompt_queue_ttft_s, replay_prompts
from splitplan.perf.table import PerfDb
from splitplan.sim.prefix_cache import PrefixModel
from splitplan.specs.layout import Layout
from splitplan.workload.prefix import PrefixTree, synthetic
from splitplan.workload.trace import load_trace
from tests.capacity.python_replay import python_replay
from tests.conftest import DATA, PERF_DB

MOONCAKE = load_trace(DATA / "mooncake_conversation.jsonl.gz")
SMALL_KV = api.instance("llama3.1-8b", "h100-80gb", 1, "vllm")
SMALL_KV = dataclasses.replace(SMALL_KV, engine=SMALL_KV.engine.model_copy(update={"memory_usable_fraction": 0.28}))

# an async-scheduling engine (vLLM V1) and one without, dense and MoE
INSTANCES = {
    ("vllm", "llama2-70b"): (api.instance("llama2-70b", "h100-80gb", 8, "vllm"), api.instance("llama2-70b", "a100-80gb", 4, "vllm")),
    ("splitwise-sim", "llama2-70b"): (api.instance("llama2-70b", "h100-80gb", 8, "splitwise-sim"),
                                      api.instance("llama2-70b", "a100-80gb", 8, "splitwise-sim")),
    ("sglang-fp8", "mixtral-8x7b"): (api.instance("mixtral-8x7b", "h100-80gb", 2, "sglang-fp8"),
                                     api.instance("mixtral-8x7b", "a100-80gb", 4, "sglang-fp8")),
}


def _both(arrival, tokens, pools, budget, **kw):
    out = []
    for replay in (replay_prompts, python_replay):
        stats: list = []
        ttft, passes, placed = replay(arrival, tokens, pools, budget, cache_stats=stats, **kw)
        out.append((ttft, passes, placed.tolist(), stats))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(engine=st.sampled_from(sorted(INSTANCES)), n=st.integers(1, 250), rate=st.floats(1, 200), seed=st.integers(0, 2**16),
       counts=st.tuples(st.integers(1, 12), st.integers(0, 12)), budget=st.sampled_from([256, 2048, 8192]),
       chunked=st.booleans(), max_seqs=st.sampled_from([None, 1, 3, 256]), held=st.booleans(), decode=st.booleans(),
       ties=st.booleans(), prefixes=st.sampled_from([None, None, "mooncake", 3, 30]), offload_gb=st.sampled_from([0.0, 2.0, 50.0]),
       aware=st.booleans(), block=st.sampled_from([1, 16]), small_kv=st.booleans())
@example(engine=("vllm", "llama2-70b"), n=250, rate=100.0, seed=0, counts=(2, 0), budget=8192, chunked=False, max_seqs=None,
         held=False, decode=False, ties=False, prefixes=30, offload_gb=50.0, aware=False, block=16, small_kv=True)
@example(engine=("vllm", "llama2-70b"), n=250, rate=100.0, seed=1, counts=(2, 0), budget=2048, chunked=True, max_seqs=None,
         held=False, decode=False, ties=False, prefixes=30, offload_gb=50.0, aware=True, block=16, small_kv=True)
def test_the_compiled_replay_is_the_python_replay(engine, n, rate, seed, counts, budget, chunked, max_seqs, held, decode, ties,
                                                   prefixes, offload_gb, aware, block, small_kv):
    """Routing (least loaded, by heap past 16 instances, or prefix-aware), whole and chunked passes,
    the sequence cap, async scheduling, held requests, a decode load riding along, and the
    engine's prefix caches (Mooncake's prefix tree, or shared system prompts; blocks, pins,
    eviction as prefills need the KV, a host tier loaded back first, on instances of a small KV
    where evictions and loads are many): the same TTFT, passes, placement and cache hits, to the bit."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1 / rate, n))
    if ties:  # simultaneous arrivals, and arrivals when a pass ends
        arrival = np.round(arrival, 1)
    tokens = rng.integers(1, 12_000, n)
    first, second = INSTANCES[engine]
    pools = [(first, counts[0])] + ([(second, counts[1])] if counts[1] else [])  # (up to 24 instances: routing by heap past 16)
    kw = {"chunked": chunked, "max_seqs": max_seqs}
    if prefixes == "mooncake":  # (its requests' sizes and prefixes, at these arrival times)
        start = int(rng.integers(0, len(MOONCAKE) - n))
        sample = MOONCAKE.take(slice(start, start + n))
        tokens = np.minimum(sample.prompt_tokens, 30_000)
        kw["prefix"] = PrefixModel(sample.prefix, block, offload_gb, aware)
    elif prefixes:  # this many system prompts of 2,000 tokens (30: more than a small KV keeps, reloaded from the host tier)
        kw["prefix"] = PrefixModel(synthetic(n, 2000, prefixes), block, offload_gb, aware)
        tokens = tokens + 2000
    if prefixes and small_kv:  # (about 45,000 tokens of KV an instance)
        pools = [(SMALL_KV, counts[0] % 4 + 1)]
    if held:
        kw["held_s"] = rng.uniform(0, 3, n)
    if decode:  # a decode load riding along every pass (the co-located estimate's)
        kw["times"] = [BatchTimes(inst, 6.5, 900.0) for inst, _ in pools]
    (ttft, busy, placed, stats), (python_ttft, python_busy, python_placed, python_stats) = _both(arrival, tokens, pools,
                                                                                                  budget, **kw)
    assert np.array_equal(ttft, python_ttft)
    assert np.array_equal(busy, python_busy)
    assert placed == python_placed
    assert stats == python_stats


def test_one_pass_of_two_prompts_takes_the_formulas_time():
    """Two prompts arriving together on one idle instance: the first alone (it starts at once),
    the second after it, each pass as long as the compiled formula says (and the Python one)."""
    inst = INSTANCES[("splitwise-sim", "llama2-70b")][0]
    tokens = np.array([1000, 3000, 500])
    arrival = np.array([0.0, 0.0, 0.0])
    ttft = prompt_queue_ttft_s(arrival, tokens, [(inst, 1)], 8192)
    first = core.pass_time_s(inst.pass_vector, 1.0, 1000.0, 1e6, 0.0, 0.0)
    rest = core.pass_time_s(inst.pass_vector, 2.0, 3500.0, 3000.0**2 + 500.0**2, 0.0, 0.0)
    assert first == pytest.approx(float(inst.prefill_time_s(1000)), rel=1e-15)
    assert rest == pytest.approx(float(inst.pass_time_s(2, 3500, 3000**2 + 500**2)), rel=1e-15)
    assert ttft.tolist() == pytest.approx([first, first + rest, first + rest], rel=1e-15)


def test_the_compiled_formula_is_the_array_formula():
    """A pass evaluated alone (floats) and among others (arrays, broadcast) is the same number,
    for dense, MoE, MLA, DP-attention and pipelined instances."""
    rng = np.random.default_rng(7)
    for model, hardware, layout, engine in [("llama2-70b", "h100-80gb", 8, "vllm"), ("mixtral-8x7b", "a100-80gb", 2, "lean"),
                                            ("deepseek-v3", "h200-141gb", Layout(tp=8, dp=2, ep=16), "sglang-fp8"),
                                            ("llama3.1-70b", "h100-80gb-cap70", Layout(tp=4, pp=2), "vllm-fp8")]:
        inst = api.instance(model, hardware, layout, engine)
        seqs, tokens = rng.integers(0, 6, 40).astype(float), rng.integers(0, 9000, 40).astype(float)
        batch = rng.integers(0, 200, 40).astype(float)
        terms = inst._terms(seqs, tokens, tokens**2, batch, batch * 700.0)
        for k in range(40):
            assert inst._terms(seqs[k], tokens[k], tokens[k] ** 2, batch[k], batch[k] * 700.0) == tuple(t[k] for t in terms)


def test_a_pass_ending_at_an_arrival_ends_before_it_is_routed():
    """Two idle instances take a prompt each at 0 (the shorter on the second); a third prompt
    arrives exactly when the first instance's pass ends: both are free by then, so it goes to the
    lowest index (were the pass still counted, to the second)."""
    inst = INSTANCES[("splitwise-sim", "llama2-70b")][0]
    tokens = np.array([1000, 900, 400])
    arrival = np.array([0.0, 0.0, float(inst.prefill_time_s(1000))])
    (ttft, _, placed, _), (python_ttft, _, python_placed, _) = _both(arrival, tokens, [(inst, 2)], 8192)
    assert placed == python_placed == [0, 1, 0]
    assert np.array_equal(ttft, python_ttft)


def test_a_pass_ending_at_an_arrival_ends_before_it_is_routed_when_it_ends_first():
    """As above, with the pass that ends at the arrival the first to end: a fast instance holding
    more tokens than a slow one is free when the third prompt comes, which takes it (were its pass
    still counted, the slow one)."""
    fast, slow = INSTANCES[("vllm", "llama2-70b")]
    end_s = core.pass_time_s(fast.pass_vector, 1.0, 1000.0, 1000.0**2, 0.0, 0.0)
    assert end_s < core.pass_time_s(slow.pass_vector, 1.0, 900.0, 900.0**2, 0.0, 0.0)
    (ttft, _, placed, _), (python_ttft, _, python_placed, _) = _both(np.array([0.0, 0.0, end_s]), np.array([1000, 900, 400]),
                                                               [(fast, 1), (slow, 1)], 8192)
    assert placed == python_placed == [0, 1, 0]
    assert np.array_equal(ttft, python_ttft)


def test_whole_prompt_passes_hold_the_sequence_cap():
    """max_num_seqs 2, five short prompts at once: the first alone (the instance was idle), then
    two passes of two, however many the token budget would take."""
    inst = INSTANCES[("splitwise-sim", "llama2-70b")][0]
    (ttft, passes, *_), (python_ttft, python_passes, *_) = _both(np.zeros(5), np.full(5, 100), [(inst, 1)], 8192, max_seqs=2)
    assert len(passes) == 3 and ttft[1] == ttft[2] < ttft[3] == ttft[4]
    assert np.array_equal(ttft, python_ttft) and np.array_equal(passes, python_passes)


def test_async_scheduling_holds_back_a_prompt_that_came_after_the_next_pass_was_scheduled():
    """vLLM's async scheduling, whole prompts: a pass that leaves prompts queued has its successor
    scheduled as it starts, so a prompt arriving during it waits a pass more even where the budget
    had room: the third long prompt goes alone, the short one that came later after it."""
    inst = INSTANCES[("vllm", "llama2-70b")][0]
    assert inst.engine.async_scheduling
    first_s = core.pass_time_s(inst.pass_vector, 1.0, 100.0, 100.0**2, 0.0, 0.0)
    arrival = np.array([0.0, 1e-4, 2e-4, first_s + 0.01])  # (the last while the second pass runs)
    (ttft, passes, *_), (python_ttft, python_passes, *_) = _both(arrival, np.array([100, 8000, 8000, 100]), [(inst, 1)], 8192)
    assert len(passes) == 4 and ttft[3] + arrival[3] > ttft[2] + arrival[2]
    assert np.array_equal(ttft, python_ttft) and np.array_equal(passes, python_passes)


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 400), m=st.integers(1, 400), digits=st.integers(0, 2), seed=st.integers(0, 2**16))
def test_the_merged_searches_are_numpys(n, m, digits, seed):
    """capacity.pools' merged searches give np.searchsorted's positions (both sides), and the
    intervals open at each time its two searches' difference, ties included (values rounded)."""
    from splitplan.capacity.pools import _open_at, _searchsorted
    rng = np.random.default_rng(seed)
    values = np.sort(np.round(rng.random(n) * 10, digits))
    queries = np.round(rng.random(m) * 12 - 1, digits)
    for side in ("left", "right"):
        assert np.array_equal(_searchsorted(values, queries, side), np.searchsorted(values, queries, side=side))
    ends = np.sort(values + np.round(rng.random(n) * 3, digits))
    assert np.array_equal(_open_at(values, ends, queries),
                          np.searchsorted(values, queries, side="right") - np.searchsorted(ends, queries, side="right"))


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 600), digits=st.integers(0, 2), seed=st.integers(0, 2**16), whole=st.booleans())
def test_the_running_peak_is_numpys_to_the_bit(n, digits, seed, whole):
    """The KV peak's running sum (splitplan_core.running_peak) adds in np.lexsort's order, equal
    times by weight: the same float as NumPy's cumsum, with many requests starting or ending at once."""
    rng = np.random.default_rng(seed)
    start = np.round(rng.random(n) * 20, digits)
    end = start + np.round(rng.random(n) * 5, digits)
    size = np.round(rng.random(n) * 10) * 100.0 if whole else rng.random(n) * 1e4
    times, weights = np.concatenate([start, end]), np.concatenate([size, -size])
    expected = float(np.max(np.cumsum(weights[np.lexsort((weights, times))])))
    assert core.running_peak(times, weights, np.argsort(times)) == expected


def test_a_prefix_loaded_from_host_memory_leaves_the_queue_meanwhile():
    """One small-KV instance with a host tier: a system prompt P is computed, evicted from the GPU by
    five long prefixes (its copy in host memory stays), then asked for again: that request leaves
    the (otherwise empty) queue while P loads, a request arriving meanwhile is queued and run, and
    the first returns to the head when P is back; whole-prompt and chunked passes, both replays alike."""
    tree = PrefixTree(np.full(6, -1, np.int64), np.array([2000] + [10_000] * 5, np.int64),
                      np.array([0, 1, 2, 3, 4, 5, 0, -1], np.int64), np.full(8, -1, np.int64))
    prefix = PrefixModel(tree, 16, 50.0)
    arrival = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 10.001])
    tokens = np.array([2100, 10_100, 10_100, 10_100, 10_100, 10_100, 2100, 100])
    for chunked in (False, True):
        (ttft, passes, placed, stats), python = _both(arrival, tokens, [(SMALL_KV, 1)], 8192, prefix=prefix, chunked=chunked)
        assert np.array_equal(ttft, python[0]) and np.array_equal(passes, python[1]) and stats == python[3]
        load_s = 2000 * prefix.load_s_per_token(SMALL_KV)
        assert ttft[6] > load_s and ttft[7] < ttft[6]  # (the later request ran while the earlier one's prefix loaded)
        assert stats[0][0] == 2000  # (P hit once, from host memory)


@settings(max_examples=30, deadline=None)
@given(interpolation=st.sampled_from(["splitplan", "splitwise-sim"]), n=st.integers(1, 200), rate=st.floats(1, 50),
       seed=st.integers(0, 2**16), count=st.integers(1, 5), budget=st.sampled_from([256, 2048, 8192]), chunked=st.booleans(),
       decode=st.booleans())
def test_the_compiled_replay_times_measured_passes_as_the_python_replay(interpolation, n, rate, seed, count, budget, chunked,
                                                                        decode):
    """Passes timed from a measured table (the vendored Splitwise file, read either way; with a
    decode load riding along, 1.1x in splitwise-sim's reading): the same TTFT, passes and placement;
    every pass counted as one lookup, those outside the table's tokens as extrapolated."""
    rng = np.random.default_rng(seed)
    arrival, tokens = np.cumsum(rng.exponential(1 / rate, n)), rng.integers(1, 12_000, n)
    measured = PerfDb(PERF_DB).require(api.instance("llama2-70b", "h100-80gb", 8, "lean"), interpolation)
    kw = {"chunked": chunked, "times": [BatchTimes(measured, 6.5 if decode else 0.0, 900.0)]}
    (ttft, busy, placed, _), (python_ttft, python_busy, python_placed, _) = _both(arrival, tokens, [(measured, count)], budget,
                                                                                  **kw)
    assert np.array_equal(ttft, python_ttft) and np.array_equal(busy, python_busy) and placed == python_placed
    counted = PerfDb(PERF_DB).require(api.instance("llama2-70b", "h100-80gb", 8, "lean"), interpolation)
    _, passes, _ = replay_prompts(arrival, tokens, [(counted, count)], budget, chunked=chunked,
                                  times=[BatchTimes(counted, 6.5 if decode else 0.0, 900.0)])
    assert counted.queries["prefill"] == len(passes)


def test_the_compiled_replay_counts_the_passes_a_measured_table_extrapolates():
    """A 60-token prompt (the table starts at 128), a 9,000-token one (it ends at 8,192), a 1,000-token
    one: three passes, two extrapolated."""
    measured = PerfDb(PERF_DB).require(api.instance("llama2-70b", "h100-80gb", 8, "lean"))
    replay_prompts(np.array([0.0, 10.0, 20.0]), np.array([60, 9000, 1000]), [(measured, 1)], 8192)
    assert (measured.queries["prefill"], measured.extrapolated["prefill"]) == (3, 2)
