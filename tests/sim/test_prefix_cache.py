"""Issue 29, item 2: a prefix cache per instance (LRU over a trace's prefix tree), alone and in the simulator."""

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitplan.perf.roofline import Instance
from splitplan.sim.cluster import PoolSpec, SimOptions, _Cluster
from splitplan.sim.metrics import pool_report
from splitplan.specs.engine import load_engine
from splitplan.specs.hardware import load_hardware
from splitplan.specs.model import load_model
from splitplan.specs.roles import Role
from splitplan.workload.prefix import PrefixTree, infinite_cache_reuse
from splitplan.workload.trace import load_trace, with_shared_prefix
from tests.conftest import DATA
from tests.sim.python_prefix_cache import PrefixCache


def _tree(parent, tokens, request_node=()):
    n = len(request_node)
    return PrefixTree(np.array(parent), np.array(tokens), np.array(request_node, dtype=np.int64), np.full(n, -1))


def test_least_recently_used_leaves_go_first_and_pins_stay():
    # A(100) -> B(50); C(100)
    cache = PrefixCache(_tree([-1, 0, -1], [100, 50, 100]))
    cache.insert(1, now=1.0)  # A and B
    cache.insert(2, now=2.0)  # C
    assert (cache.resident_tokens, cache.free_tokens) == (250, 250)
    cache.evict(200)
    assert set(cache.last_use) == {0, 2}  # B, the oldest leaf (A is as old, but B hangs below it)
    cache.pin(2)
    cache.evict(0)
    assert set(cache.last_use) == {2} and cache.free_tokens == 0  # A went; C is in use
    assert cache.match(1, 1000) == (0, 0) and cache.match(2, 1000) == (100, 0) and cache.match(2, 60) == (59, 0)
    cache.unpin(2, now=3.0)
    cache.evict(0)
    assert (cache.resident_tokens, cache.free_tokens, cache.last_use, cache.pins) == (0, 0, {}, {})


def _brute_force(parent, tokens, depth, requests, capacity):
    """The same policy, the slow way: hit = deepest resident node on the path; then the path is
    resident and used now; then the least recently used leaf (the deeper on a tie) goes while
    the resident tokens exceed the capacity."""
    last_use, hits = {}, []
    for now, node in enumerate(requests):
        path, n = [], node
        while n >= 0:
            path.append(n)
            n = parent[n]
        hits.append(max((depth[n] for n in path if n in last_use), default=0))
        for n in path:
            last_use[n] = now
        while sum(tokens[n] for n in last_use) > capacity:
            inner = {parent[m] for m in last_use}
            leaves = [n for n in last_use if n not in inner]
            del last_use[min(leaves, key=lambda n: (last_use[n], -depth[n]))]
    return hits


def _replay(tree, requests, capacity, prompt=10**9):
    cache = PrefixCache(tree)
    hits = []
    for now, node in enumerate(requests):
        hits.append(cache.match(node, prompt)[0])
        cache.insert(node, float(now))
        cache.evict(capacity)
    return hits


def test_the_cache_replays_mooncake_as_a_brute_force_lru_does():
    """Exact against the reference implementation on the vendored Mooncake trace's first 150
    requests, at a cache a fifth of their distinct prefix tokens."""
    trace = load_trace(DATA / "mooncake_conversation.jsonl.gz")
    tree = trace.prefix
    requests = tree.request_node[:150].tolist()
    depth = tree.depth.tolist()
    capacity = 0.2 * sum(tree.tokens[: max(requests) + 1])
    fast = _replay(tree, requests, capacity)
    slow = _brute_force(tree.parent.tolist(), tree.tokens.tolist(), depth, requests, capacity)
    assert fast == slow and sum(fast) > 0


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_hits_grow_with_memory(data):
    nodes = data.draw(st.integers(1, 12))
    parent = [data.draw(st.integers(-1, k - 1)) for k in range(nodes)]
    tokens = [data.draw(st.integers(1, 50)) for _ in range(nodes)]
    requests = data.draw(st.lists(st.integers(0, nodes - 1), min_size=1, max_size=40))
    tree = _tree(parent, tokens)
    totals = [sum(_replay(tree, requests, capacity)) for capacity in (0, 20, 60, 150, 10**6)]
    assert totals == sorted(totals)
    unbounded = infinite_cache_reuse(_tree(parent, tokens, requests), np.full(len(requests), 10**9), np.ones(len(requests)))
    assert totals[-1] == unbounded["hit_tokens"].sum()


def _run(trace, caching, instances=2, memory=None):
    engine = load_engine("vllm")
    if memory is not None:
        engine = engine.model_copy(update={"memory_usable_fraction": memory})
    inst = Instance(load_model("llama3.1-8b"), load_hardware("h100-80gb"), engine, 1)
    pool = PoolSpec(Role.MIXED, inst, 1, instances)
    cluster = _Cluster(trace, [pool], SimOptions(max_batch_tokens=8192, prefix_caching=caching))
    result = cluster.run()
    return cluster, result, pool_report(result, [pool])[0]


def _trace(requests=600, gap_s=4.0, prompt=None, output=None, prefix=True):
    """The vendored Mooncake trace's first requests, one every `gap_s` seconds (its own first
    timestamps are a burst), or requests of the sizes given."""
    trace = load_trace(DATA / "mooncake_conversation.jsonl.gz")
    keep = slice(0, requests)
    return dataclasses.replace(
        trace, arrival_s=np.arange(requests) * gap_s,
        prompt_tokens=trace.prompt_tokens[keep] if prompt is None else np.full(requests, prompt),
        output_tokens=trace.output_tokens[keep] if output is None else np.full(requests, output),
        prefix=trace.prefix.take(keep) if prefix else None)


def test_the_simulator_skips_what_its_caches_hold():
    mooncake = _trace()
    _, off, row_off = _run(mooncake, False)
    cluster, on, row_on = _run(mooncake, True)
    ceiling = infinite_cache_reuse(mooncake.prefix, mooncake.prompt_tokens, mooncake.output_tokens)["infinite_cache_hit_rate"]
    assert row_off["prefix_hit_rate"] is None
    assert 0.02 < row_on["prefix_hit_rate"] <= ceiling
    assert np.nanmean(on.ttft_s) < np.nanmean(off.ttft_s)
    assert on.tokens_out == off.tokens_out  # every request served either way
    for cache in cluster.caches.values():  # every request done: nothing pinned, the books balance
        assert cache.pins == {} and cache.free_tokens == cache.resident_tokens
        assert cache.resident_tokens == sum(int(mooncake.prefix.tokens[n]) for n in cache.last_use)
    again = _run(mooncake, True)[1]
    assert np.array_equal(on.ttft_s, again.ttft_s, equal_nan=True)  # deterministic


def test_inference_perfs_shared_prefix_groups_hit_after_their_first_use():
    """4 system prompts of 600 tokens, requests far enough apart not to overlap: every request
    after the first of its group skips the 592 of its 900 tokens that fill vLLM's 16-token blocks."""
    shared = with_shared_prefix(_trace(200, 0.5, 900, 20, prefix=False), 600, 4)
    _, result, row = _run(shared, True, instances=1)
    assert row["prefix_hit_rate"] == pytest.approx(592 * 196 / (900 * 200))


def test_less_memory_holds_fewer_prefixes():
    """50 system prompts of 2,000 tokens in turn: a cache of about 30 k tokens (a quarter of the
    GPU's memory) drops each before its turn comes again; one of 437 k keeps them all."""
    shared = with_shared_prefix(_trace(400, 0.5, 2500, 20, prefix=False), 2000, 50)
    small, large = (_run(shared, True, 1, memory)[2]["prefix_hit_rate"] for memory in (0.25, 0.9))
    assert small < 0.05 and large == pytest.approx(2000 * 350 / (2500 * 400))


def test_simulate_takes_the_cache_from_the_command_line():
    from typer.testing import CliRunner

    from splitplan.cli import app
    runner = CliRunner()
    base = ["simulate", "--mixed-pool", "h100-80gb:tp1:1", "--model", "llama3.1-8b", "--trace", "azure-code",
            "--max-requests", "200", "--shared-prefix-tokens", "1000", "--prefix-groups", "4", "--format", "json"]
    runs = {}
    for switch in ("off", "on"):
        out = runner.invoke(app, [*base, "--prefix-caching", switch])
        assert out.exit_code == 0, out.output
        runs[switch] = json.loads(out.output)
    assert runs["on"]["inputs"]["prefix_caching"] == "on"
    assert runs["off"]["summary"]["pools"][0]["prefix_hit_rate"] is None
    assert 0.2 < runs["on"]["summary"]["pools"][0]["prefix_hit_rate"] < 1
    assert runs["on"]["summary"]["ttft_ms"]["p50"] < runs["off"]["summary"]["ttft_ms"]["p50"]
    bad = runner.invoke(app, [*base, "--prefix-caching", "maybe"])
    assert bad.exit_code == 2 and "error: --prefix-caching maybe: choose on or off" in bad.output


def test_prefix_aware_routing_raises_the_hit_rate():
    """Four instances: routing each request where the fewest prompt tokens are left to compute
    (its cached prefix taken off, the queue added) finds the prefixes JSQ scatters; on a fixed
    trace it never lowers the hit rate."""
    inst = Instance(load_model("llama3.1-8b"), load_hardware("h100-80gb"), load_engine("vllm"), 1)
    shared = with_shared_prefix(_trace(400, 0.2, 2500, 100, prefix=False), 2000, 50)
    for trace in (_trace(600, 1.0), shared):
        rates = {}
        for routing in ("jsq", "prefix-aware"):
            pool = PoolSpec(Role.MIXED, inst, 1, 4)
            result = _Cluster(trace, [pool], SimOptions(max_batch_tokens=8192, prefix_caching=True, routing=routing)).run()
            rates[routing] = pool_report(result, [pool])[0]["prefix_hit_rate"]
        assert rates["prefix-aware"] > rates["jsq"]
    assert rates["prefix-aware"] > 0.65  # (the shared trace: JSQ 0.60; 0.70 is 2,000 of 2,500 tokens on 7 requests of 8)


def test_prefix_aware_routing_needs_the_cache():
    from typer.testing import CliRunner

    from splitplan.cli import app
    for flags in (["--routing", "prefix-aware"], ["--kv-offload-gb", "100"]):
        out = CliRunner().invoke(app, ["simulate", "--mixed-pool", "h100-80gb:tp1:1", "--model", "llama3.1-8b",
                                       "--max-requests", "50", "--prefix-caching", "off", *flags])
        assert out.exit_code == 2 and "add --prefix-caching on" in out.output and flags[0] in out.output, out.output
        out = CliRunner().invoke(app, ["optimize", "--model", "llama3.1-8b", "--hardware", "h100-80gb", "--max-requests", "50",
                                       "--engine", "splitwise-vllm", *flags])  # (an engine without the cache)
        assert out.exit_code == 2 and "add --prefix-caching on" in out.output and flags[0] in out.output, out.output
    out = CliRunner().invoke(app, ["simulate", "--mixed-pool", "h100-80gb:tp1:1", "--model", "llama3.1-8b",
                                   "--kv-offload-gb", "-1"])
    assert out.exit_code == 2 and out.output.startswith("error: --kv-offload-gb -1: must be >= 0"), out.output


@pytest.mark.parametrize("memory, offload_gb", [(0.4, 0.0), (0.9, 0.0), (0.3, 20.0)])
@settings(max_examples=3, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([0.5, 1.5]), st.sampled_from([2048, 8192]), st.booleans(),
       st.sampled_from(["jsq", "prefix-aware"]))
def test_the_planners_prompt_replay_caches_as_the_simulator(memory, offload_gb, seed, gap_s, budget, chunked, routing):
    """Issue 29, item 3: the planner's prompt replay keeps a cache per instance as the simulator
    does (the same class, looked up, kept and evicted at the same moments, routed the same way,
    host-memory hits loaded first): the same TTFT, request by request, and the same hit rate, at
    a memory that evicts or not (Mooncake's first requests), and with a host tier (30 system
    prompts of 3,000 tokens in turn: more than the GPU tier holds, less than the host's; routed
    by prefix, an instance may hold its share of them and never load from the host)."""
    from splitplan.capacity.pools import prompt_queue_ttft_s
    from splitplan.sim.prefix_cache import PrefixModel
    rng = np.random.default_rng(seed)
    base = _trace(300, gap_s) if not offload_gb else with_shared_prefix(_trace(300, gap_s, 4000, 20, prefix=False), 3000, 30)
    trace = dataclasses.replace(base, arrival_s=np.sort(rng.uniform(0, 300 * gap_s * (1 if not offload_gb else 0.2), 300)))
    update = {"memory_usable_fraction": memory, "scheduler": "chunked" if chunked else "prefill-priority"}
    first, second = (Instance(load_model("llama3.1-8b"), load_hardware(hw), load_engine("vllm").model_copy(update=update), 1)
                     for hw in ("h100-80gb", "a100-80gb"))
    keep = trace.prompt_tokens + trace.output_tokens <= first.max_request_tokens  # (the planner leaves out the rest)
    trace = dataclasses.replace(trace, arrival_s=trace.arrival_s[keep], prompt_tokens=trace.prompt_tokens[keep],
                                output_tokens=trace.output_tokens[keep], prefix=trace.prefix.take(keep))
    pools = [PoolSpec(Role.PROMPT, first, 1, 2), PoolSpec(Role.PROMPT, second, 1, 1), PoolSpec(Role.TOKEN, first, 1, 4)]
    cluster = _Cluster(trace, pools, SimOptions(max_batch_tokens=budget, prefix_caching=True, routing=routing,
                                                kv_offload_gb=offload_gb))
    simulated = cluster.run()
    stats: list = []
    planned = prompt_queue_ttft_s(trace.arrival_s, trace.prompt_tokens, [(first, 2), (second, 1)], budget, chunked=chunked,
                                  prefix=PrefixModel(trace.prefix, 16, offload_gb, routing == "prefix-aware"), cache_stats=stats)
    assert np.allclose(planned, simulated.ttft_s, rtol=1e-12, atol=1e-12)
    caches = list(cluster.caches.values())[:3]
    assert stats == [(c.hit_tokens, c.lookup_tokens) for c in caches]
    loaded = sum(c.loaded_tokens for c in caches)
    assert sum(hit for hit, _ in stats) > 0
    if routing == "jsq" or not offload_gb:
        assert (loaded > 0) == (offload_gb > 0)


def test_the_planner_sizes_prompt_pools_with_the_hit_rate():
    """The shared-prefix trace needs fewer prompt instances with the cache than without, and the
    plan's prompt pool reports the hit rate its replay saw (the co-located plan, the simulator's)."""
    from splitplan import api
    trace = with_shared_prefix(_trace(400, 0.05, 6000, 30, prefix=False), 5000, 2)
    plans = {on: api.optimize(trace, "llama3.1-8b", "chat", hardware=["h100-80gb"], tp=1, prefix_caching=on,
                              mode="split") for on in (False, True)}
    off, on = plans[False], plans[True]
    prompt_instances = {k: [o.instances for o in r.options if o.role == Role.PROMPT] for k, r in plans.items()}
    assert prompt_instances[True][0] < prompt_instances[False][0], prompt_instances  # (sized alone, before whole machines)
    assert off.split.prompt_pools[0].prefix_hit_rate is None
    assert on.split.prompt_pools[0].prefix_hit_rate > 0.6  # (5,000 of 6,000 tokens, but for each group's first use per instance)
    assert on.colocated.mixed_pools[0].prefix_hit_rate > 0.5


def test_blocks_and_the_host_memory_tier():
    """Hits come in whole blocks; with a host tier, what the GPU tier evicted is still hit, the part
    beyond the GPU tier to be loaded; the host tier drops its least recently used when full."""
    tree = _tree([-1, 0, -1], [100, 50, 100])  # A(100) -> B(50); C(100)
    cache = PrefixCache(tree, block_tokens=16, cpu_tokens=200)
    cache.insert(1, now=1.0)
    assert cache.match(1, 1000) == (144, 0)  # 150 tokens held: 9 whole blocks
    cache.evict(100)  # the GPU tier drops B
    assert cache.match(1, 1000) == (144, 44) and cache.loaded_tokens == 44  # A on the GPU, B loaded back
    cache.insert(2, now=2.0)  # C: the host tier (200 tokens) drops its oldest, A
    assert list(cache.cpu) == [1, 2] and cache.cpu_used == 150
    cache.evict(0)
    assert cache.peek(1, 1000) == 0  # B alone in host memory is no prefix without A
    assert cache.match(2, 1000) == (96, 96)
    no_host = PrefixCache(tree, block_tokens=16)
    no_host.insert(1, now=1.0)
    no_host.evict(0)
    assert no_host.match(1, 1000) == (0, 0)


def _split(trace, memory=0.9, offload_gb=0.0, routing="jsq"):
    engine = load_engine("vllm").model_copy(update={"memory_usable_fraction": memory})
    inst = Instance(load_model("llama3.1-8b"), load_hardware("h100-80gb"), engine, 1)
    pools = [PoolSpec(Role.PROMPT, inst, 1, 2), PoolSpec(Role.TOKEN, inst, 1, 2)]
    cluster = _Cluster(trace, pools, SimOptions(max_batch_tokens=8192, prefix_caching=True, kv_offload_gb=offload_gb,
                                                routing=routing))
    result = cluster.run()
    return cluster, result, pool_report(result, pools)


def test_the_host_tier_hits_what_the_gpu_tier_lost_and_loads_it_first():
    """Little KV memory: a host tier per prompt instance raises the hit rate; its loads cross the
    host link (64 GB/s per H100) before the prefill; every block is unpinned and accounted at the end."""
    trace = _trace(300, 2.0)
    keep = trace.prompt_tokens + trace.output_tokens < 40_000
    trace = dataclasses.replace(trace, arrival_s=trace.arrival_s[keep], prompt_tokens=trace.prompt_tokens[keep],
                                output_tokens=trace.output_tokens[keep], prefix=trace.prefix.take(keep))
    gpu, gpu_result, gpu_rows = _split(trace, memory=0.3)
    host, host_result, host_rows = _split(trace, memory=0.3, offload_gb=200)
    assert host_rows[0]["prefix_hit_rate"] > gpu_rows[0]["prefix_hit_rate"] + 0.02, (host_rows[0], gpu_rows[0])
    loaded = sum(c.loaded_tokens for c in host.caches.values())
    assert loaded > 0 and sum(c.loaded_tokens for c in gpu.caches.values()) == 0
    assert sum(x.prefix_loaded_tokens for x in host_result.instances) == loaded
    for cluster in (gpu, host):  # block accounting back to zero: nothing pinned, everything resident is free
        for cache in cluster.caches.values():
            assert cache.pins == {} and cache.free_tokens == cache.resident_tokens
            assert (cache.resident_tokens > 0) == (cache.lookup_tokens > 0)  # (an instance no request reached holds nothing)
    assert np.isfinite(host_result.ttft_s).all() and host_result.tokens_out == gpu_result.tokens_out


def test_a_token_instance_receives_only_the_kv_it_does_not_hold():
    """Requests that share a long prefix, one at a time: once a token instance holds the prefix,
    their KV transfer carries only the rest, so it takes a fraction of the first one's."""
    shared = with_shared_prefix(_trace(40, 2.0, 8000, 20, prefix=False), 7000, 1)
    cluster, result, rows = _split(shared)
    transfer = result.transfer_s - cluster.pools[0].perf.factors.kv_transfer_latency_s  # (the bytes' part)
    assert rows[1]["prefix_hit_rate"] > 0.8  # the token pool's: the share of prompt tokens not sent
    assert np.median(transfer[4:]) < 0.2 * transfer[0], transfer[:6]


def test_a_plan_carries_its_cache_settings_to_simulate(tmp_path):
    """optimize --routing prefix-aware --kv-offload-gb writes them in the plan's inputs; simulate --plan
    runs with them (the options still win); a plan whose values are not the options' exits 2."""
    from typer.testing import CliRunner

    from splitplan.cli import app
    runner = CliRunner()
    trace = ["--trace", str(DATA / "mooncake_conversation.jsonl.gz"), "--max-requests", "200", "--model", "llama3.1-8b"]
    out = runner.invoke(app, ["optimize", *trace, "--hardware", "h100-80gb", "--routing", "prefix-aware", "--kv-offload-gb",
                              "50", "--output-dir", str(tmp_path), "--format", "json"])
    assert out.exit_code == 0, out.output
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert {k: plan["inputs"][k] for k in ("prefix_caching", "routing", "kv_offload_gb")} == {
        "prefix_caching": "on", "routing": "prefix-aware", "kv_offload_gb": 50.0}
    pools = [p for key in ("prompt_pools", "mixed_pools") for p in plan["plan"].get(key, [])]
    assert pools
    assert all(p["prefix_hit_rate"] is not None for p in pools)
    out = runner.invoke(app, ["simulate", "--plan", str(tmp_path / "plan.json"), *trace, "--format", "json"])
    assert out.exit_code == 0, out.output
    inputs = json.loads(out.output)["inputs"]
    assert (inputs["prefix_caching"], inputs["routing"], inputs["kv_offload_gb"]) == ("on", "prefix-aware", 50.0)
    out = runner.invoke(app, ["simulate", "--plan", str(tmp_path / "plan.json"), *trace, "--format", "json",
                              "--routing", "jsq", "--kv-offload-gb", "0"])
    inputs = json.loads(out.output)["inputs"]
    assert (inputs["routing"], inputs["kv_offload_gb"]) == ("jsq", 0.0)
    for key, bad in (("routing", "$(reboot)"), ("kv_offload_gb", -5), ("prefix_caching", True)):
        hostile = json.loads((tmp_path / "plan.json").read_text())
        hostile["inputs"][key] = bad
        (tmp_path / "bad.json").write_text(json.dumps(hostile))
        out = runner.invoke(app, ["simulate", "--plan", str(tmp_path / "bad.json"), *trace])
        assert out.exit_code == 2 and out.output.startswith("error:") and key in out.output, out.output


def test_a_preempted_request_lets_go_of_its_prefix_and_finds_it_again():
    """A co-located instance short of KV memory preempts decodes: each lets go of its prefix (the
    cache may evict it) and, recomputed, skips what is still held; at the end nothing is pinned and
    every resident block is free, and every request finishes."""
    shared = with_shared_prefix(_trace(60, 0.05, 6000, 2500, prefix=False), 5000, 3)
    cluster, result, row = _run(shared, True, instances=1, memory=0.28)
    assert result.preemptions > 0
    cache, = cluster.caches.values()
    assert cache.pins == {} and cache.free_tokens == cache.resident_tokens > 0
    assert result.tokens_out == int(shared.output_tokens.sum())
    assert row["prefix_hit_rate"] > 0.5
