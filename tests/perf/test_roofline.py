"""Roofline limits computed by hand, monotonicity, and the physical effects."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitplan.perf.roofline import Instance, kv_transfer_time_s
from splitplan.specs.engine import EngineFactors, EngineProfile, load_engine
from splitplan.specs.hardware import load_hardware
from splitplan.specs.model import load_model

# An engine at the roofline: full efficiency, no overheads of any kind.
IDEAL = EngineProfile(
    name="ideal", description="test", source="test",
    defaults=EngineFactors(compute_efficiency=1, attention_efficiency=1, memory_efficiency=1, gemm_half_tokens=0,
                           kernel_launch_s=0, collective_latency_s=0, link_efficiency=1, kv_transfer_latency_s=0),
)
H100 = load_hardware("h100-80gb")


def test_decode_batch1_is_weight_reading_time():
    m = load_model("llama3.1-8b")
    inst = Instance(m, H100, IDEAL, 1)
    # batch 1, context 1: memory-bound; every weight read once (the input embedding
    # table only by one row), plus 1 token of KV and small activations.
    t = float(inst.decode_step_time_s(1, 1))
    weights_s = (m.total_params - m.vocab_size * m.hidden_size) * 2 / 3.35e12
    assert t == pytest.approx(weights_s, rel=0.01)
    assert inst.explain(decode_batch=1, decode_context_tokens=1).bound == "memory"


def test_prefill_long_prompt_is_flops_time():
    m = load_model("llama3.1-8b")
    inst = Instance(m, H100, IDEAL, 1)
    T = 8192
    flops = 2 * (m.total_params - m.embedding_params) * T + 2 * m.num_hidden_layers * T**2 * m.q_dim + 2 * m.hidden_size * m.vocab_size
    t = float(inst.prefill_time_s(T))
    assert t == pytest.approx(flops / (989e12 * H100.gpu.sustained_clock_fraction), rel=0.01)  # at the sustained clock
    assert inst.explain(prompt_tokens=[T]).bound == "compute"


def test_tp_all_reduce_time():
    m = load_model("llama2-70b")
    t1 = Instance(m, H100, IDEAL, 8)
    lat = t1.explain(prompt_tokens=[4096])
    # two ring all-reduces per layer of tokens x hidden x 2 bytes over 450 GB/s one-way
    expected = 2 * 80 * (2 * 7 / 8 * 4096 * 8192 * 2 / 450e9)
    assert lat.network_s == pytest.approx(expected, rel=1e-9)


def test_kv_capacity_by_hand():
    m = load_model("llama2-70b")
    inst = Instance(m, H100, load_engine("lean"), 8)
    usable = 81_559 * 2**20 * 0.9 - 2e9  # (the 81,559 MiB the driver reports of an H100 80GB, not 80e9 bytes)
    weights = m.total_params * 2 / 8
    assert inst.fit.kv_capacity_tokens == int((usable - weights) * 8 // 327_680)


def test_gqa_kv_heads_are_replicated_beyond_kv_heads():
    m = load_model("llama3.1-8b")  # 8 KV heads
    assert Instance(m, H100, IDEAL, 8).kv_bytes_per_token == m.kv_bytes_per_token(2)
    b200 = load_hardware("b200-180gb")
    m405 = load_model("llama3.1-405b")
    assert Instance(m405, b200, IDEAL, 8).kv_bytes_per_token == m405.kv_bytes_per_token(2)


def test_model_that_does_not_fit_says_why():
    inst = Instance(load_model("llama3.1-405b"), H100, load_engine("lean"), 8)
    assert not inst.fit.fits and "GB" in inst.fit.reason
    assert not Instance(load_model("llama2-70b"), H100, IDEAL, 3).fit.fits


def test_power_cap_slows_prefill_only():
    """A capped GPU holds its lower clock for the whole prefill pass: every GPU term (compute,
    memory, network) is slowed by it, the host's overhead is not, nor is decode (issue 27, item 13:
    Splitwise's capped H100 is 1.3x slower from 128 to 8,192 tokens)."""
    m = load_model("llama2-70b")
    eng = load_engine("lean")
    full, capped = Instance(m, H100, eng, 8), Instance(m, load_hardware("h100-80gb-cap70"), eng, 8)
    # (350 - 75) / (700 - 75) of the dynamic power: the cube root of it of the clock
    slowdown = ((350 - 75) / (700 - 75)) ** (-1 / 3)
    assert slowdown == pytest.approx(1.3148, abs=1e-4)
    a, b = full.explain([2048]), capped.explain([2048])
    assert (b.compute_s, b.memory_s, b.network_s) == pytest.approx(
        (slowdown * a.compute_s, slowdown * a.memory_s, slowdown * a.network_s), rel=1e-12)
    assert a.memory_s > 0 and a.network_s > 0
    assert b.overhead_s == pytest.approx(a.overhead_s, rel=1e-12)
    assert float(capped.decode_step_time_s(32, 1024)) == pytest.approx(float(full.decode_step_time_s(32, 1024)))


def test_prefill_compute_runs_at_the_sustained_clock():
    m, eng = load_model("llama2-70b"), load_engine("lean")
    at_boost = H100.model_copy(update={"gpu": H100.gpu.model_copy(update={"sustained_clock_fraction": 1.0})})
    a, b = Instance(m, at_boost, eng, 8).explain([4096]), Instance(m, H100, eng, 8).explain([4096])
    assert b.compute_s == pytest.approx(a.compute_s / H100.gpu.sustained_clock_fraction, rel=1e-12)
    assert Instance(m, at_boost, eng, 8).decode_step_time_s(16, 2048) == Instance(m, H100, eng, 8).decode_step_time_s(16, 2048)


def test_moe_decode_reads_only_touched_experts():
    m = load_model("mixtral-8x7b")
    inst = Instance(m, H100, IDEAL, 1)
    one = inst.explain(decode_batch=1, decode_context_tokens=1).bytes_per_gpu
    many = inst.explain(decode_batch=256, decode_context_tokens=1).bytes_per_gpu
    L, h = m.num_hidden_layers, m.hidden_size
    expert_bytes = L * m.expert_params * 2
    # 255 more tokens: activations in and out of each GEMM, and one more KV entry read each.
    act_bytes = 255 * L * 2 * (4 * h + 2 * m.q_dim + 2 * m.kv_dim + 4 * m.intermediate_size)
    kv_bytes = 255 * L * 2 * m.kv_dim * 2
    touched = 8 * (1 - (1 - 2 / 8) ** 256) - 2  # experts touched at 256 minus at 1
    assert many - one == pytest.approx(touched * expert_bytes + act_bytes + kv_bytes, rel=1e-6)


def test_packed_attention_costs_more_than_per_prompt():
    m = load_model("llama2-70b")
    packed = IDEAL.model_copy(update={"prefill_attention": "packed"})
    args = dict(prefill_seqs=8, prefill_tokens=8 * 512, prefill_sq_tokens=8 * 512**2)
    assert float(Instance(m, H100, packed, 8).pass_time_s(**args)) > float(Instance(m, H100, IDEAL, 8).pass_time_s(**args))


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 32_000), st.integers(1, 4000), st.integers(1, 256), st.sampled_from(["lean", "splitwise-vllm"]))
def test_monotone_in_tokens_batch_and_context(tokens, extra, batch, engine):
    """More tokens, a bigger batch or more context never make a pass faster."""
    inst = Instance(load_model("llama2-70b"), H100, load_engine(engine), 8)
    # Non-decreasing (flat while the host's kernel launches bound the pass), up to rounding.
    def no_less(a, b):
        return float(a) >= float(b) * (1 - 1e-12)
    assert no_less(inst.prefill_time_s(tokens + extra), inst.prefill_time_s(tokens))
    assert no_less(inst.decode_step_time_s(batch + 1, tokens), inst.decode_step_time_s(batch, tokens))
    assert no_less(inst.decode_step_time_s(batch, tokens + extra), inst.decode_step_time_s(batch, tokens))


def test_kv_transfer_serialized_vs_layerwise():
    m = load_model("bloom-176b")
    eng = load_engine("lean")
    src, dst = Instance(m, H100, eng, 8), Instance(m, load_hardware("a100-80gb"), eng, 8)
    # BLOOM 2,048 tokens: 8.2 GB; the A100 side (200 GB/s per machine) is the bottleneck.
    total_s = 2048 * m.kv_bytes_per_token(2) / 200e9
    short = float(kv_transfer_time_s(src, dst, 256))
    assert short == pytest.approx(256 / 2048 * total_s + 5e-3)
    long = float(kv_transfer_time_s(src, dst, 2048))
    assert 5e-3 < long < total_s  # overlapped with the prefill: only part exposed


def test_vectorized_matches_scalar():
    inst = Instance(load_model("llama2-70b"), H100, load_engine("splitwise-vllm"), 4)
    tokens = np.array([100, 1000, 5000])
    vec = inst.prefill_time_s(tokens)
    assert np.allclose(vec, [inst.explain(prompt_tokens=[int(t)]).time_s for t in tokens])


# --- the measured table (perf.table) ------------------------------------------------------

def _measured(hardware):
    from splitplan import api
    from splitplan.perf.table import PerfDb
    from tests.conftest import PERF_DB
    return PerfDb(PERF_DB).require(api.instance("llama2-70b", hardware, 8))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["a100-80gb", "h100-80gb"]), st.integers(1, 63), st.integers(1, 8), st.integers(192, 8000),
       st.integers(1, 2000))
def test_measured_decode_is_monotone_and_never_below_its_smallest_measurement(hw, batch, more, context, extra):
    """Batch-1 context noise once made a batch-64 step at 1,500 tokens of context fall to 28.6 ms,
    below every measured step: a measured table is monotone in batch and in context, and stays at
    or above its smallest decode measurement."""
    m = _measured(hw)
    step = float(m.decode_step_time_s(batch, context))
    assert float(m.decode_step_time_s(batch + more, context)) >= step
    assert float(m.decode_step_time_s(batch, context + extra)) >= step
    assert step >= m.dec_floor
    decode = m.rows[m.rows.phase == "decode"]
    assert step * 1e3 >= decode.latency_ms.min() - 1e-9
    assert step * 1e3 <= decode.latency_ms.max() * 1.25  # within the batch and context measured: no blow-up


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["a100-80gb", "h100-80gb"]), st.integers(128, 8000), st.integers(1, 4000))
def test_measured_prefill_is_monotone(hw, tokens, extra):
    m = _measured(hw)
    assert float(m.prefill_time_s(tokens + extra)) >= float(m.prefill_time_s(tokens))


def test_flops_of_a_prompt_batch_are_each_prompt_s_including_its_lm_head_row():
    m = load_model("llama3.1-8b")
    inst = Instance(m, H100, IDEAL, 1)
    one, four = inst.explain(prompt_tokens=[1000]), inst.explain(prompt_tokens=[1000] * 4)
    assert four.flops_per_gpu == pytest.approx(4 * one.flops_per_gpu, rel=1e-12)  # per-prompt attention, one head row per prompt
    head = 2 * m.vocab_size * m.hidden_size
    both = inst.explain(prompt_tokens=[1000], decode_batch=3, decode_context_tokens=500)
    decode = inst.explain(decode_batch=3, decode_context_tokens=500)
    assert both.flops_per_gpu == pytest.approx(one.flops_per_gpu + decode.flops_per_gpu, rel=1e-12)
    assert decode.flops_per_gpu >= 3 * head  # every decoded token goes through the LM head


@pytest.mark.parametrize("tokens", [2048, 8192])  # (compute-bound expert GEMMs: fewer tokens are bound by reading the experts)
def test_expert_gemms_run_at_the_efficiency_of_their_rows_per_touched_expert(tokens):
    """Each touched expert multiplies only the tokens routed to it: tokens x top-k / touched rows,
    at the GEMM efficiency of that many rows (rows / (rows + gemm_half_tokens)). Isolated as the
    extra compute at a quarter of the MoE efficiency: 3x the expert GEMMs at that efficiency."""
    m = load_model("mixtral-8x7b")
    half = IDEAL.defaults.model_copy(update={"gemm_half_tokens": 8.0})
    engines = [IDEAL.model_copy(update={"defaults": half.model_copy(update={"moe_efficiency": e})}) for e in (1.0, 0.25)]
    full, quarter = (Instance(m, H100, eng, 2).explain([tokens]) for eng in engines)
    experts, top_k = m.num_local_experts, m.num_experts_per_tok
    rows = tokens * top_k / (experts * (1 - (1 - top_k / experts) ** tokens))
    expert_s = tokens * 2 * top_k * m.expert_params * m.num_hidden_layers / 2 / H100.peak_flops_per_s("bf16")
    expected = 3 * expert_s / H100.prefill_clock_fraction * (rows + 8) / rows
    assert quarter.compute_s - full.compute_s == pytest.approx(expected, rel=1e-6)


def test_moe_efficiency_slows_the_expert_gemms_of_a_prefill_not_a_decode():
    """At a quarter of the dense GEMM efficiency, the expert GEMMs of an 8,192-token Mixtral
    prefill take 4x their ideal compute time (the rest unchanged); a batch-1 decode, bound by
    reading the experts it touches, does not move."""
    m = load_model("mixtral-8x7b")
    slow = IDEAL.model_copy(update={"defaults": IDEAL.defaults.model_copy(update={"moe_efficiency": 0.25})})
    ideal, quarter = Instance(m, H100, IDEAL, 2), Instance(m, H100, slow, 2)
    expert_s = 8192 * 2 * m.num_experts_per_tok * m.expert_params * m.num_hidden_layers / 2 / H100.peak_flops_per_s("bf16")
    pre = ideal.explain([8192]), quarter.explain([8192])
    assert pre[1].compute_s - pre[0].compute_s == pytest.approx(3 * expert_s / H100.prefill_clock_fraction, rel=1e-6)
    assert quarter.explain(decode_batch=1, decode_context_tokens=100).time_s == ideal.explain(decode_batch=1,
                                                                                              decode_context_tokens=100).time_s
