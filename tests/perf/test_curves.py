"""Measured kernel curves (perf.curves, hardware specs' `kernels:`): they reproduce a vendored sample of
NVIDIA's measured tables (tests/data/kernels, NOTICE), time monotonically, reach the pass formula,
and a GPU or an engine without them falls back to the roofline and says so."""

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from splitplan.perf import curves
from splitplan.perf.roofline import Instance
from splitplan.sim import deployments
from splitplan.specs.engine import load_engine
from splitplan.specs.hardware import load_hardware
from splitplan.specs.layout import parse_layout
from splitplan.specs.model import load_model

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "kernels"
BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5625}
# MAPE % the fit reaches held out over every measured shape serving produces (bench/fit_kernels.py), with a margin
# for a 60-row sample
TOLERANCE_PCT = {("gemm", "bf16"): 10, ("gemm", "fp8"): 18, ("gemm", "fp4"): 15, ("context_attention", "bf16"): 12,
                 ("context_attention", "fp8"): 12, ("generation_attention", "bf16"): 15, ("generation_attention", "fp8"): 15,
                 ("moe", "bf16"): 22, ("moe", "fp8"): 20, ("all_to_all", "low-latency"): 20, ("all_to_all", "high-throughput"): 15,
                 ("mla_generation", "bf16"): 14, ("mla_generation", "fp8"): 10, ("mla_context", "bf16"): 10,
                 ("mla_context", "fp8"): 10}


def _curved(name="vllm-fp8"):
    """An engine profile timed by vLLM's measured kernel curves (whether or not the shipped one names them)."""
    return load_engine(name).model_copy(update={"kernel_curves": "vllm"})


def _predict(hw, op: str, precision: str, f: pd.DataFrame, engine: str = "vllm") -> np.ndarray:
    k, bf16, bandwidth = hw.kernels[engine], hw.peak_flops_per_s("bf16"), hw.memory_bytes_per_s
    col = {c: f[c].to_numpy(float) for c in f.columns}
    if op == "gemm":
        return curves.gemm_s(k.gemm[precision], hw.peak_flops_per_s(precision), bandwidth, col["m"], col["n"], col["k"],
                             BYTES[precision])
    if op == "context_attention":
        return curves.context_attention_s(k.context_attention[precision], bf16, col["batch_size"], col["isl"],
                                          col["num_heads"], col["num_key_value_heads"], col["head_dim"])
    if op == "moe":
        return curves.moe_s(k.moe[precision], hw.peak_flops_per_s(precision), bandwidth, col["num_tokens"], col["hidden_size"],
                            col["inter_size"], col["num_experts"], col["topk"], col["moe_tp_size"], col["moe_ep_size"],
                            BYTES[precision], load=curves.table_load(col["num_tokens"], col["num_experts"], col["topk"],
                                                                     col["moe_ep_size"]))
    if op == "mla_context":  # (MHA heads of 192 and 128 dims)
        return curves.context_attention_s(k.mla_context[precision], bf16, col["batch_size"], col["isl"],
                                          col["num_heads"], col["num_heads"], 160.0)
    if op == "mla_generation":
        return curves.mla_generation_s(k.mla_generation[precision], hw.peak_flops_per_s(precision), bandwidth,
                                       col["batch_size"], col["isl"] + col["step"], col["num_heads"], 576.0, 512.0, BYTES[precision])
    if op == "all_to_all":  # (the kernel family in place of the precision; 8 GPUs, one machine)
        return curves.all_to_all_s(getattr(k.all_to_all_among(8), precision.replace("-", "_")), col["num_tokens"],
                                   col["hidden_size"], col["topk"], 8, precision == "low-latency")
    return curves.generation_attention_s(k.generation_attention[precision], bf16, bandwidth, col["batch_size"],
                                         col["isl"] + col["step"], col["num_heads"], col["num_key_value_heads"],
                                         col["head_dim"], BYTES[precision])


@pytest.mark.parametrize("path", sorted(SAMPLE.glob("**/*.csv")), ids=lambda p: str(p.relative_to(SAMPLE).with_suffix("")))
def test_curves_reproduce_the_measured_sample(path):
    """Each file of the sample within its class's tolerance: vLLM's curves, another engine's where the
    file lies in a folder of that engine's name (MLA's: vLLM's tables time the whole MLA module)."""
    gpu, _, rest = path.stem.partition("_")
    op, precision = rest.rsplit("_", 1)
    frame = pd.read_csv(path)
    engine = "vllm" if path.parent == SAMPLE else path.parent.name
    error = _predict(load_hardware(gpu), op, precision, frame, engine) / (frame.latency.to_numpy(float) * 1e-3) - 1
    assert len(frame) >= 50
    assert np.abs(error).mean() * 100 <= TOLERANCE_PCT[op, precision]
    assert abs(np.median(error)) * 100 <= 10  # no bias


def test_the_sample_is_what_the_catalog_gpus_were_fitted_on():
    assert {p.stem.partition("_")[0] for p in SAMPLE.glob("*.csv")} == {"h100-80gb", "h200-141gb", "b200-180gb"}
    assert "aiconfigurator-core 0.12.0" in load_hardware("h200-141gb").kernels["vllm"].source


def test_more_work_never_takes_less_time():
    hw = load_hardware("h200-141gb")
    k = hw.kernels["vllm"]
    rows = np.arange(1, 16385, dtype=float)
    for precision, curve in k.gemm.items():
        t = curves.gemm_s(curve, hw.peak_flops_per_s(precision), hw.memory_bytes_per_s, rows, 8192.0, 8192.0, BYTES[precision])
        assert (np.diff(t) >= 0).all()
    t = curves.context_attention_s(k.context_attention["bf16"], hw.peak_flops_per_s("bf16"), 1.0, rows, 64.0, 8.0, 128.0)
    assert (np.diff(t) > 0).all()
    inst = Instance(load_model("llama3.1-70b"), hw, _curved(), parse_layout("tp4", "x"))
    prompt = inst.pass_time_s(1, rows, rows**2)
    assert (np.diff(prompt) >= 0).all()
    batch = np.arange(1, 513, dtype=float)
    assert (np.diff(inst.pass_time_s(decode_seqs=batch, decode_context_tokens=batch * 2048)) >= 0).all()
    assert (np.diff(inst.pass_time_s(decode_seqs=64.0, decode_context_tokens=64 * rows)) >= 0).all()


def _with_curve(hw, op: str, precision: str | None, engine: str = "vllm", **change):
    """`hw` with `engine`'s `op` curve of `precision` (None: of every precision) changed (its other
    precisions and engines as they are)."""
    k = hw.kernels[engine]
    by_precision = getattr(k, op)
    changed = {p: c.model_copy(update=change) for p, c in by_precision.items() if precision in (None, p)}
    return hw.model_copy(update={"kernels": {**hw.kernels, engine: k.model_copy(update={op: {**by_precision, **changed}})}})


def _instance(engine, hardware="h200-141gb", tp=4, model="llama3.1-70b"):
    return Instance(load_model(model), load_hardware(hardware), engine, parse_layout(f"tp{tp}", "x"))


def test_the_pass_times_its_operators_from_the_curves():
    """A profile naming the curves times a pass otherwise than the roofline with its factors, each
    operator from the curve: a GEMM's fixed latency appears in a one-token pass, the TP all-reduce
    takes the measured latency of its GPU count."""
    engine = _curved()
    roofline = engine.model_copy(update={"kernel_curves": None})
    curved, plain = _instance(engine), _instance(roofline)
    assert curved.pass_time_s(1, 2048, 2048**2) != plain.pass_time_s(1, 2048, 2048**2)
    k = load_hardware("h200-141gb").kernels["vllm"]
    assert curved.constants.gemm_latency_s == pytest.approx(k.gemm["fp8"].latency_s * (4 + 1 / 80))
    assert plain.constants.gemm_latency_s == 0.0
    for tp in (2, 4, 8):
        assert _instance(engine, tp=tp).constants.collective_latency_s == k.all_reduce_among(tp).latency_s
    assert len({_instance(engine, tp=tp).constants.collective_latency_s for tp in (2, 4, 8)}) == 3
    # the curve's GEMM efficiency, lowered by the model's weight shapes, replaces the profile's
    assert curved.constants.compute_efficiency < k.gemm["fp8"].efficiency
    assert plain.constants.compute_efficiency == engine.defaults.compute_efficiency
    # measured kernels already ran at the clock the GPU holds: no sustained-clock slowdown on top
    assert curved.constants.clock_slowdown == 1.0 and plain.constants.clock_slowdown > 1.0


def test_a_gpu_without_curves_falls_back_to_the_roofline_and_says_so():
    engine = _curved()
    mi300x = _instance(engine, "mi300x-192gb")
    assert mi300x.kernel_curves is None
    assert set(mi300x.timing_sources.values()) == {"roofline: datasheet peak and bandwidth, vllm-fp8's factors"}
    roofline = _instance(engine.model_copy(update={"kernel_curves": None}), "mi300x-192gb")
    assert (mi300x.pass_vector == roofline.pass_vector).all()
    h200 = _instance(engine).timing_sources
    assert h200["GEMMs"] == h200["decode attention"] == h200["all-reduce"] == "measured vllm kernels on h200-141gb"
    # fp4 weights: B200's measured NVFP4 GEMMs time them; a GPU without fp4 tensor cores (H200: weight-only)
    # has no fp4 GEMM curve, so the roofline times them and the attention keeps its curves
    fp4 = engine.model_copy(update={"weights_dtype": "fp4"})
    b200 = _instance(fp4, "b200-180gb")
    assert b200.timing_sources["GEMMs"] == "measured vllm kernels on b200-180gb"
    assert b200.constants.gemm_latency_s == pytest.approx(b200.hardware.kernels["vllm"].gemm["fp4"].latency_s * (4 + 1 / 80))
    weight_only = _instance(fp4).timing_sources
    assert weight_only["GEMMs"].startswith("roofline") and weight_only["prefill attention"].startswith("measured")


def test_a_deployment_fit_leaves_what_the_curves_time():
    engine, h200 = _curved(), load_hardware("h200-141gb")
    assert deployments.timed_by_curves("compute_efficiency", engine, h200)
    assert not deployments.timed_by_curves("compute_efficiency", engine, load_hardware("mi300x-192gb"))
    assert not deployments.timed_by_curves("decode_overhead_s", engine, h200)
    assert not deployments.timed_by_curves("compute_efficiency", load_engine("lean"), h200)  # (a profile naming none)
    assert deployments.timed_by_curves("memory_efficiency", load_engine("vllm"), h200)  # (vllm's bf16 curves, since 2026-12-07)


def test_a_kernel_latency_adds_once_per_kernel_and_layer():
    """Raising the GEMM curve's fixed latency by d slows a decode step by d per GEMM: four per layer and the LM head."""
    hw, engine, model = load_hardware("h200-141gb"), _curved(), load_model("llama3.1-70b")
    k = hw.kernels["vllm"]
    slower = _with_curve(hw, "gemm", "fp8", latency_s=k.gemm["fp8"].latency_s + 1e-5)
    layout = parse_layout("tp4", "x")
    before, after = (Instance(model, h, engine, layout).pass_time_s(decode_seqs=8.0, decode_context_tokens=8 * 1024.0)
                     for h in (hw, slower))
    assert after - before == pytest.approx(1e-5 * (4 * 80 + 1), rel=1e-6)
    # and a per-sequence time of decode attention by d slows it by d per sequence and layer
    slower = _with_curve(hw, "generation_attention", "fp8", s_per_sequence=k.generation_attention["fp8"].s_per_sequence + 1e-6)
    after = Instance(model, slower, engine, layout).pass_time_s(decode_seqs=8.0, decode_context_tokens=8 * 1024.0)
    assert after - before == pytest.approx(1e-6 * 8 * 80, rel=1e-6)


def test_a_per_kv_head_cost_is_not_extrapolated_past_the_heads_its_table_measured():
    """NVIDIA's vLLM decode-attention tables time at most 8 KV heads a GPU (`max_kv_heads`): Llama-2-7B's
    32 at TP 1 pay the per-KV-head cost of 8, at TP 4 (8 a GPU) all of theirs; the KV they read is
    still all 32 heads'."""
    hw = load_hardware("h100-80gb")
    generation = hw.kernels["vllm"].generation_attention["bf16"]
    assert generation.max_kv_heads == 8 and generation.s_per_kv_head > 0
    for tp, heads in ((1, 8), (4, 8), (8, 4)):
        inst = _instance(_curved("vllm"), "h100-80gb", tp, "llama2-7b")
        assert inst.constants.decode_attention_s_per_seq == pytest.approx(
            generation.s_per_sequence + heads * generation.s_per_kv_head, rel=1e-12)
    args = (1e15, 3e12, np.array([64.0]), np.array([1000.0]), np.array([32.0]))
    wide, eight = (curves.generation_attention_s(generation, *args, np.array([h]), np.array([128.0]), 2.0) for h in (32.0, 8.0))
    kv_read = 2 * 24 * 128 * 64 * 1000 * 2.0 / (3e12 * generation.memory_efficiency)  # (24 more heads' KV, same terms else)
    assert wide[0] - eight[0] == pytest.approx(kv_read, rel=1e-9)
    unbounded = generation.model_copy(update={"max_kv_heads": None})
    assert curves.kv_heads_timed(unbounded, 32.0) == 32.0 and curves.kv_heads_timed(generation, 32.0) == 8


@pytest.mark.parametrize("batch", [1, 16, 256])
def test_the_decode_line_is_the_pass_with_curves(batch):
    """The simulator's decode step (`decode_line`: base + per-token slope in the summed context) equals the
    pass formula with the curves' KV bandwidth, per-sequence time and latencies."""
    inst = _instance(_curved())
    base, per_token, slack = inst.decode_line(batch)
    for context in (0.0, 1e4, 3e6):
        line = base + context * per_token + max(slack - context * per_token, 0.0)
        assert line == pytest.approx(inst.pass_time_s(decode_seqs=float(batch), decode_context_tokens=context), rel=1e-12)


def test_prefill_attention_ramps_as_its_curve():
    """A prompt's attention takes 2 H d p (p + half_tokens) FLOPs at the curve's efficiency of the bf16 peak,
    slowed by (tiles + half_tiles) / tiles over its H (p / 128 + 1/2) query tiles: raising half_tokens by D
    slows a p-token prefill by 2 q_dim p D / (bf16 peak x efficiency) x that per layer."""
    hw, engine, model = load_hardware("h200-141gb"), _curved(), load_model("llama3.1-70b")
    k = hw.kernels["vllm"]
    context = k.context_attention["fp8"]
    slower = _with_curve(hw, "context_attention", "fp8", half_tokens=context.half_tokens + 500)
    layout, p = parse_layout("tp4", "x"), 2048.0
    before, after = (Instance(model, h, engine, layout).pass_time_s(1, p, p * p) for h in (hw, slower))
    efficiency = curves.context_efficiency(context, model.num_attention_heads / 4, model.num_key_value_heads / 4, 128.0)
    tiles = model.num_attention_heads / 4 * (p / 128 + 0.5)
    assert context.half_tiles > 0.1 * tiles  # (fitted: a prompt's 16 tiles over 16 heads do not fill an H200)
    per_layer = 2 * model.q_dim / 4 * p * 500 / (hw.peak_flops_per_s("bf16") * efficiency) * (1 + context.half_tiles / tiles)
    assert after - before == pytest.approx(80 * per_layer, rel=1e-6)


def test_prefill_attention_pays_for_its_kv_heads():
    """A context curve's KV-head terms (its kernels load K and V per head group): each KV head adds
    `kv_head_cost` of a query head's work, so a model of narrow groups (Llama-2-7B, MHA) attends at a
    lower share of the curve's efficiency than one of wide groups (Llama-3.1-8B, 4 query heads a KV
    head); and each prompt in a pass adds `s_per_kv_head` per KV head a layer."""
    hw, engine = load_hardware("h200-141gb"), _curved("vllm")
    k = hw.kernels["vllm"]
    context = k.context_attention["bf16"]
    assert context.kv_head_cost > 0 and context.s_per_kv_head > 0  # (fitted: vLLM's kernels run narrow groups slower)
    shares = {}
    for name in ("llama2-7b", "llama3.1-8b"):
        model = load_model(name)
        inst = Instance(model, hw, engine, parse_layout("tp1", "x"))
        share = inst.constants.attention_efficiency / (context.efficiency * curves.head_dim_share(context, 128.0))
        shares[name] = share
        assert share == pytest.approx(1 / (1 + context.kv_head_cost * model.num_key_value_heads / model.num_attention_heads))
        moved = _with_curve(hw, "context_attention", "bf16", s_per_kv_head=context.s_per_kv_head + 1e-6)
        before, after = (Instance(model, h, engine, parse_layout("tp1", "x")).pass_time_s(3, 3 * 512.0, 3 * 512.0**2)
                         for h in (hw, moved))
        assert after - before == pytest.approx(model.num_hidden_layers * 3 * model.num_key_value_heads * 1e-6, rel=1e-6)
    assert shares["llama2-7b"] < shares["llama3.1-8b"] < 1


def test_prefill_attention_times_its_query_heads_and_tiles_as_the_curve():
    """A context curve's per-query-head time and its ramp over query tiles short of filling the SMs
    reach the pass formula as `curves.context_attention_s` has them: a pass of b prompts of p tokens
    moves by the layers times the curve's own change, for prompts short and long (the ramp weighs
    most where few tiles run: one short prompt)."""
    hw, engine, model = load_hardware("h200-141gb"), _curved("vllm"), load_model("llama3.1-8b")
    k = hw.kernels["vllm"]
    context = k.context_attention["bf16"]
    heads, kv_heads = model.num_attention_heads / 2, model.num_key_value_heads / 2
    moved = _with_curve(hw, "context_attention", "bf16", s_per_head=context.s_per_head + 2e-8,
                        half_tiles=context.half_tiles + 300.0)
    changed = moved.kernels["vllm"].context_attention["bf16"]
    growth = []
    for b, p in ((1, 16.0), (3, 512.0), (1, 4096.0), (8, 4096.0)):
        before, after = (Instance(model, h, engine, parse_layout("tp2", "x")).pass_time_s(b, b * p, b * p * p)
                         for h in (hw, moved))
        curve = [curves.context_attention_s(c, hw.peak_flops_per_s("bf16"), b, p, heads, kv_heads, 128.0)
                 for c in (context, changed)]
        assert after - before == pytest.approx(model.num_hidden_layers * (curve[1] - curve[0]), rel=1e-6)
        growth.append(curve[1] / curve[0])
    assert growth[2] > growth[3] > 1  # (one long prompt fills fewer tiles than eight)


def test_prefill_attention_takes_its_head_dims_share():
    """A context curve's efficiency is that of 128-dim heads: a model of 128-dim heads takes it as it is
    whatever `half_dim`, one of 64-dim heads (gpt-oss) 64 / (64 + h) x (128 + h) / 128 of it: its prefill
    attention's efficiency moves with `half_dim`, the other's does not."""
    hw, engine = load_hardware("h200-141gb"), _curved()
    k = hw.kernels["vllm"]
    context = k.context_attention["fp8"]
    assert context.half_dim > 0  # (fitted: the tables' 64-dim heads run at a lower efficiency)
    assert curves.head_dim_share(context, 128.0) == pytest.approx(1.0, rel=1e-12)
    moved = _with_curve(hw, "context_attention", "fp8", half_dim=2 * context.half_dim)
    wider = moved.kernels["vllm"].context_attention["fp8"]
    for name, dim in (("llama3.1-70b", 128.0), ("gpt-oss-120b", 64.0)):
        model = load_model(name)
        assert model.head_dim_eff == dim
        heads, kv_heads = model.num_attention_heads / 4, model.num_key_value_heads / 4
        share = [Instance(model, h, engine, parse_layout("tp4", "x")).constants.attention_efficiency
                 / (curves.context_efficiency(context, heads, kv_heads, 128.0) * hw.peak_flops_per_s("bf16")
                    / hw.peak_flops_per_s(engine.dtype)) for h in (hw, moved)]
        assert share[0] == pytest.approx(float(curves.head_dim_share(context, dim)), rel=1e-9)
        assert share[1] == pytest.approx(float(curves.head_dim_share(wider, dim)), rel=1e-9)
        assert (share[0] == pytest.approx(1.0)) if dim == 128 else (share[1] < share[0] < 1.0)


@pytest.mark.parametrize("layout", ["tp8", "tp8ep8"])
def test_routed_experts_take_their_curve(layout):
    """With an MoE curve, a layer's routed experts cost its fixed latency once per MoE layer and its
    time per expert for each expert the GPU holds, its token passes per token's top-k copies on
    every GPU, and its row passes per routed row of the busiest GPU's expert group (all of them at
    EP 1; at EP 8 an eighth times the busiest group's load, as the curve's tables route): each term
    checked by moving it (DeepSeek-V3: 58 of its 61 layers are MoE layers)."""
    hw, engine, model = load_hardware("h200-141gb"), _curved(), load_model("deepseek-v3")
    lay = parse_layout(layout, "x")
    tokens, k, moe_layers, experts = 4096.0, model.num_experts_per_tok, model.moe_layers, model.num_local_experts
    load = curves.busiest_load(tokens, experts, k, lay.ep)
    assert load == 1.0 if lay.ep == 1 else 1.2 < load < 1.6
    row_s = model.hidden_size * curves.ACTIVATION_BYTES / hw.memory_bytes_per_s

    def prefill(h):
        return Instance(model, h, engine, lay).pass_time_s(1, tokens, tokens**2)

    base = hw.kernels["vllm"].moe["fp8"]
    before = prefill(hw)
    assert prefill(_with_curve(hw, "moe", "fp8", latency_s=base.latency_s + 1e-5)) - before == pytest.approx(1e-5 * moe_layers, rel=1e-6)
    assert (prefill(_with_curve(hw, "moe", "fp8", token_passes=base.token_passes + 1)) - before
            == pytest.approx(moe_layers * tokens * k * row_s, rel=1e-6))
    rows = tokens * k / lay.ep * load
    assert (prefill(_with_curve(hw, "moe", "fp8", row_passes=base.row_passes + 1)) - before
            == pytest.approx(moe_layers * rows * row_s, rel=1e-6))
    # the time per expert counts the experts the GPU holds (all 256 at EP 1, 32 at EP 8), touched or not
    assert (prefill(_with_curve(hw, "moe", "fp8", s_per_expert=base.s_per_expert + 1e-7)) - before
            == pytest.approx(1e-7 * experts / lay.ep * moe_layers, rel=1e-6))
    # the efficiency ramps by rows per touched expert: half_rows + D costs each FLOP D / rows more
    c = Instance(model, hw, engine, lay).constants
    touched = experts * (1 - (1 - k / experts) ** (tokens * load))
    flops = c.layers_per_stage * 2 * tokens * load * k * model.expert_params * c.routed_expert_share
    expected = flops / (c.gemm_peak_flops_per_s * base.efficiency) * 100 / (tokens * load * k / touched)
    assert prefill(_with_curve(hw, "moe", "fp8", half_rows=base.half_rows + 100)) - before == pytest.approx(expected, rel=1e-6)
    # a one-token step reads its k experts' weights at the curve's bandwidth: half of it doubles that read
    def step(h):
        return Instance(model, h, engine, lay).pass_time_s(decode_seqs=1.0, decode_context_tokens=1024.0)

    one = curves.busiest_load(1.0, experts, k, lay.ep)  # (its k experts, the busiest group's share of them)
    read = (c.layers_per_stage * experts * (1 - (1 - k / experts) ** one) * model.expert_params
            * engine.weight_bytes_per_element * c.routed_expert_share / (hw.memory_bytes_per_s * base.memory_efficiency))
    assert step(_with_curve(hw, "moe", "fp8", memory_efficiency=base.memory_efficiency / 2)) - step(hw) == pytest.approx(read, rel=1e-6)


def test_tensorrt_llms_expert_kernels_take_a_time_per_expert_held():
    """TensorRT-LLM's fp8 MoE kernels on H200 (the vendored sample, NOTICE) take about 0.25 us for each
    expert the GPU holds, touched or not: its curve meets the sample within 10 %, and without that
    term a few tokens over 64 or more experts a GPU come out some 40 % fast."""
    hw = load_hardware("h200-141gb")
    frame = pd.read_csv(SAMPLE / "trtllm" / "h200-141gb_moe_fp8.csv")
    measured = frame.latency.to_numpy(float) * 1e-3
    few_tokens_many_experts = ((frame.num_tokens <= 16) & (frame.num_experts / frame.moe_ep_size >= 64)).to_numpy()
    assert few_tokens_many_experts.sum() >= 4
    error = _predict(hw, "moe", "fp8", frame, "trtllm") / measured - 1
    without = _predict(_with_curve(hw, "moe", "fp8", "trtllm", s_per_expert=0.0), "moe", "fp8", frame, "trtllm") / measured - 1
    assert np.abs(error).mean() <= 0.10
    assert abs(np.median(error[few_tokens_many_experts])) <= 0.10
    assert np.median(without[few_tokens_many_experts]) < -0.25


def test_past_the_tables_routing_switch_the_busiest_group_keeps_its_rows():
    """DeepSeek-V3 (256 experts, top-8) at EP 8: at 33 tokens the tables' routing gives the busiest
    group fewer rows than at 32; the pass formula, like curves.busiest_load, keeps the 32's
    (the row-pass term, moved by a pass per row, counts them; the experts' weights read as good as
    free, so that the compute side binds at so few tokens)."""
    hw, engine, model, lay = load_hardware("h200-141gb"), _curved(), load_model("deepseek-v3"), parse_layout("tp8ep8", "x")
    tokens, k, experts = 33.0, model.num_experts_per_tok, model.num_local_experts
    assert 33 * curves.table_load(33.0, experts, k, 8) < 32 * curves.table_load(32.0, experts, k, 8)
    assert 33 * curves.busiest_load(33.0, experts, k, 8) == pytest.approx(32 * curves.table_load(32.0, experts, k, 8))
    row_s = model.hidden_size * curves.ACTIVATION_BYTES / hw.memory_bytes_per_s
    base = hw.kernels["vllm"].moe["fp8"]

    def prefill(**change):
        moved = _with_curve(hw, "moe", "fp8", memory_efficiency=1e6, **change)
        return Instance(model, moved, engine, lay).pass_time_s(1, tokens, tokens**2)

    more = prefill(row_passes=base.row_passes + 1) - prefill()
    assert more == pytest.approx(model.moe_layers * tokens * k / 8 * curves.busiest_load(tokens, experts, k, 8) * row_s,
                                 rel=1e-6)


def test_routed_experts_without_their_curve_keep_the_gemms_and_the_factor():
    hw, model = load_hardware("h200-141gb"), load_model("qwen3-235b-a22b")
    curved = Instance(model, hw, _curved(), parse_layout("tp4", "x"))
    plain = Instance(model, hw, load_engine("vllm-fp8").model_copy(update={"kernel_curves": None}), parse_layout("tp4", "x"))
    c, p = curved.constants, plain.constants
    assert c.moe_efficiency == 1.0 and c.moe_compute_efficiency == hw.kernels["vllm"].moe["fp8"].efficiency
    assert p.moe_efficiency == plain.factors.moe_efficiency
    assert (p.moe_compute_efficiency, p.moe_half_rows, p.moe_bytes_per_s) == (
        p.compute_efficiency, p.gemm_half_tokens, p.gemm_bytes_per_s)
    assert p.moe_latency_s == p.moe_s_per_row == p.moe_s_per_token == 0.0
    assert curved.timing_sources["MoE experts"] == "measured vllm kernels on h200-141gb"
    assert plain.timing_sources["MoE experts"] == "the roofline times vllm-fp8's moe_efficiency"
    assert "MoE experts" not in _instance(_curved()).timing_sources  # a dense model has none


@pytest.mark.parametrize("experts, top_k", [(128.0, 8.0), (256.0, 8.0), (128.0, 1.0)])
@pytest.mark.parametrize("ep", [1.0, 8.0, 64.0])
def test_more_tokens_never_take_the_experts_less_time(experts, top_k, ep):
    """Also where the tables' routing narrows its spread (T k passes E: the busiest group's load drops
    from 2.5 to 2.0 times the mean group's at 256 experts of top-8 over 64 groups)."""
    hw = load_hardware("h200-141gb")
    tokens = np.arange(1, 16385, dtype=float)
    for precision, curve in hw.kernels["vllm"].moe.items():
        t = curves.moe_s(curve, hw.peak_flops_per_s(precision), hw.memory_bytes_per_s, tokens, 4096.0, 1536.0, experts, top_k,
                         1.0, ep, BYTES[precision])
        assert (np.diff(t) >= 0).all()


@pytest.mark.parametrize("model, layout", [("deepseek-v3", "dp64ep64"), ("qwen3-235b-a22b", "tp8dp2ep16"),
                                           ("llama4-maverick", "dp8ep8"), ("gpt-oss-120b", "dp8ep8")])
def test_a_bigger_moe_pass_never_takes_less_time(model, layout):
    """The compiled pass formula with vLLM's expert curves: prefills by tokens and decode steps by
    batch, through where each model's T k passes its E (32, 16, 128 and 32 tokens)."""
    inst = Instance(load_model(model), load_hardware("b200-180gb"), load_engine("vllm"), parse_layout(layout, "x"))
    tokens = np.arange(1, 600, dtype=float)
    assert (np.diff(inst.prefill_time_s(tokens)) >= 0).all()
    assert (np.diff(inst.decode_step_time_s(tokens, np.full_like(tokens, 1024.0))) >= 0).all()


def _drawn_busiest_load(rng, tokens, experts, top_k, ep, draws=400):
    """The busiest of ep expert groups' rows over the mean group's, drawn as NVIDIA's collector routes
    its MoE tables (per-expert power-law loads scaled to T k, none above T; not rounded)."""
    lo, hi = (1.0, 0.8 * tokens) if tokens * top_k > experts else (0.01, 2.0)
    a = 1 - curves.ROUTING_ALPHA
    x = ((hi**a - lo**a) * rng.random((draws, experts)) + lo**a) ** (1 / a)
    loads = np.minimum(x / x.sum(1, keepdims=True) * tokens * top_k, tokens)
    return loads.reshape(draws, ep, experts // ep).sum(2).max(1).mean() / (tokens * top_k / ep)


@pytest.mark.parametrize("shape", [(2, 256, 8, 8), (64, 256, 8, 2), (256, 256, 8, 8), (4096, 256, 8, 8), (4096, 256, 8, 32),
                                   (1024, 128, 8, 16), (16384, 160, 8, 32), (4096, 8, 2, 4)])
def test_the_busiest_expert_group_is_as_the_tables_route(shape):
    """The closed form of the busiest group's load (the mean group's plus the expected largest of ep
    normal deviates) is within 20 % of drawing the routing (it reads low at EP 32, where a group's few
    heavy-tailed loads are not yet normal); 1 at EP 1, and at most every row of the group's experts."""
    assert curves.table_load(*shape) == pytest.approx(_drawn_busiest_load(np.random.default_rng(0), *shape), rel=0.2)
    tokens, experts, top_k, _ = shape
    assert curves.table_load(tokens, experts, top_k, 1) == 1.0
    tokens = np.geomspace(1, 16384, 50)
    for ep in (2.0, 4.0, 8.0):  # (8 experts of top-2: at EP 8 a group is one expert, whose rows are at most all tokens)
        load = curves.busiest_load(tokens, 8.0, 2.0, ep)
        assert (load >= 1).all() and (load <= curves.load_cap(8.0, 2.0, ep)).all()
    assert (curves.busiest_load(tokens, 8.0, 8.0, 4.0) == 1.0).all()  # every token takes every expert: groups are equal


def test_an_all_reduce_takes_the_faster_algorithm_for_its_message():
    """A decode step's small all-reduces take the small-message line, a long prefill's the large-message
    one: doubling the large-message bandwidth takes half its bytes' time off the prefill and leaves the
    one-token step as it was."""
    hw, engine, model = load_hardware("h200-141gb"), _curved(), load_model("llama3.1-70b")
    k = hw.kernels["vllm"]
    reduce = k.all_reduce_among(4)
    assert reduce.large_latency_s is not None and reduce.large_bytes_per_s is not None
    small, large = 4096.0, 8192 * model.hidden_size * curves.ACTIVATION_BYTES
    assert curves.all_reduce_s(reduce, small) == reduce.latency_s + small / reduce.bytes_per_s
    assert curves.all_reduce_s(reduce, large) == reduce.large_latency_s + large / reduce.large_bytes_per_s
    slower_reduce = reduce.model_copy(update={"large_bytes_per_s": reduce.large_bytes_per_s * 2})
    slower = hw.model_copy(update={"kernels": {"vllm": k.model_copy(update={
        "all_reduce": tuple(slower_reduce if c.gpus == 4 else c for c in k.all_reduce)})}})
    layout = parse_layout("tp4", "x")
    prefill, step = zip(*[(Instance(model, h, engine, layout).pass_time_s(1, 8192.0, 8192.0**2),
                           Instance(model, h, engine, layout).pass_time_s(decode_seqs=1.0, decode_context_tokens=1024.0))
                          for h in (hw, slower)], strict=True)
    assert step[1] == step[0]
    assert prefill[1] - prefill[0] == pytest.approx(-80 * large / reduce.large_bytes_per_s, rel=1e-6)


def test_an_all_reduce_of_one_algorithm_is_its_line():
    """A curve written before the two-algorithm form (a plan's saved hardware) still reads: one line."""
    from splitplan.specs.hardware import AllReduceCurve

    one = AllReduceCurve(gpus=8, latency_s=1e-5, bytes_per_s=1e11)
    assert curves.all_reduce_s(one, np.array([0.0, 1e9])).tolist() == [1e-5, 1e-5 + 1e-2]
    with pytest.raises(ValueError, match="come together"):
        AllReduceCurve(gpus=8, latency_s=1e-5, bytes_per_s=1e11, large_latency_s=1e-4)


def _deepseek(hw, layout="dp8ep8", exchange="deepep"):
    """DeepSeek-V3 timed by vLLM's curves, its experts exchanged by DeepEP's kernels (or the engine's default)."""
    engine = _curved().model_copy(update={"expert_all_to_all": exchange})
    return Instance(load_model("deepseek-v3"), hw, engine, parse_layout(layout, "x"))


def test_expert_all_to_alls_take_their_kernels_by_pass():
    """With curves, an EP-8 instance's dispatch and combine are DeepEP's as measured: a decode-only
    step by the low-latency kernels, a pass with prompt work by the high-throughput ones. Raising
    one family's latency by d slows only its passes, a decode step by d per MoE layer (58 of
    DeepSeek-V3's 61)."""
    hw = load_hardware("h200-141gb")
    k = hw.kernels["vllm"]
    a2a = k.all_to_all_among(8)

    def passes(h):
        inst = _deepseek(h)
        return inst.pass_time_s(decode_seqs=64.0, decode_context_tokens=64 * 2048.0), inst.pass_time_s(8, 8 * 2048.0, 8 * 2048.0**2)

    before = passes(hw)
    for family, moved in (("low_latency", 0), ("high_throughput", 1)):
        line = getattr(a2a, family)
        slower_a2a = a2a.model_copy(update={family: line.model_copy(update={"latency_s": line.latency_s + 1e-4})})
        after = passes(hw.model_copy(update={"kernels": {"vllm": k.model_copy(update={"all_to_all": (slower_a2a,)})}}))
        assert after[1 - moved] == before[1 - moved]
        assert after[moved] > before[moved]
        if family == "low_latency":
            assert after[0] - before[0] == pytest.approx(58 * 1e-4, rel=1e-6)


def test_a_copy_per_expert_or_per_gpu():
    """Low-latency kernels send a token to each of its k experts; high-throughput ones once to each GPU
    its experts fall on: 8 (1 - (7/8)^8) = 5.25 of 8 GPUs for DeepSeek's top 8, one for a top 1."""
    assert curves.all_to_all_copies(8, 8, True) == 8
    assert curves.all_to_all_copies(8, 8, False) == pytest.approx(5.2511, abs=1e-4)
    assert curves.all_to_all_copies(1, 8, False) == pytest.approx(1.0)
    line = load_hardware("h200-141gb").kernels["vllm"].all_to_all_among(8).high_throughput
    tokens = np.arange(1, 16385, dtype=float)
    assert (np.diff(curves.all_to_all_s(line, tokens, 7168.0, 8.0, 8, False)) > 0).all()


def test_an_all_to_all_the_tables_did_not_measure_is_the_roofline():
    """The tables measure DeepEP among one node's 8 GPUs: a DP-16 EP-16 instance over two H200 machines
    keeps the roofline's all-to-all (and says so), an EP-8 one takes the curve, an engine left at its
    default exchange (all-gather and reduce-scatter, not DeepEP) the roofline; a dense model has none."""
    hw = load_hardware("h200-141gb")
    wide, node = _deepseek(hw, "dp16ep16"), _deepseek(hw, "dp8ep8")
    assert wide.timing_sources["all-to-all"].startswith("roofline")
    default = _deepseek(hw, "dp8ep8", exchange=None)
    assert default.timing_sources["all-to-all"].startswith("roofline")
    assert default.constants.all_to_all_latency_s == default.constants.decode_all_to_all_latency_s
    assert node.timing_sources["all-to-all"] == "measured vllm kernels on h200-141gb"
    roofline = Instance(wide.model, hw, _curved().model_copy(update={"kernel_curves": None}), wide.layout)
    for name in ("all_to_all_s_per_token", "all_to_all_latency_s", "decode_all_to_all_s_per_token", "decode_all_to_all_latency_s"):
        assert getattr(wide.constants, name) == getattr(roofline.constants, name) > 0
    assert node.constants.decode_all_to_all_latency_s != node.constants.all_to_all_latency_s
    assert "all-to-all" not in _instance(_curved()).timing_sources


def _mla_instance(hw, layout="tp8", engine_name="sglang"):
    """DeepSeek-V3 at `layout` on `hw`, timed by the engine's (SGLang's) curves."""
    engine = load_engine(f"{engine_name}-fp8").model_copy(update={"kernel_curves": engine_name})
    return Instance(load_model("deepseek-v3"), hw, engine, parse_layout(layout, "x"))


def test_mla_decode_takes_its_own_curve():
    """DeepSeek-V3 timed by SGLang's curves: its absorbed decode attention by the MLA curve (a step of
    64 sequences slows by 64 x 61 layers x d when the curve's per-sequence time grows by d; the heads'
    generation-attention curve moves nothing), and `perf` says so."""
    hw = load_hardware("h200-141gb")
    k = hw.kernels["sglang"]

    def step(h):
        return _mla_instance(h).pass_time_s(decode_seqs=64.0, decode_context_tokens=64 * 2048.0)

    inst, before = _mla_instance(hw), step(hw)
    assert inst.timing_sources["decode attention"] == "measured sglang kernels on h200-141gb"
    assert inst.constants.kv_bytes_per_s == hw.memory_bytes_per_s * k.mla_generation["fp8"].memory_efficiency
    slower = step(_with_curve(hw, "mla_generation", "fp8", engine="sglang", s_per_sequence=k.mla_generation["fp8"].s_per_sequence + 1e-6))
    assert slower - before == pytest.approx(64 * 61 * 1e-6, rel=1e-6)
    same = step(_with_curve(hw, "generation_attention", None, engine="sglang", s_per_sequence=1e-5))
    assert same == before


def test_mla_prefill_takes_its_own_curve_of_expanded_heads():
    """DeepSeek-V3 at TP 8 timed by TensorRT-LLM's curves: its prefill attention is the MLA context
    curve's (the latent expanded to 16 MHA heads a GPU, a KV head each, of 192 query-key and 128 value
    dims: heads of 160 as `curves.context_attention_s` counts them), a pass of b prompts of p tokens
    moving by the 61 layers times the curve's own change; the heads' context curve moves nothing. SGLang
    has no Hopper MLA prefill curve (its tables time the absorbed latent): the roofline's. `perf` says so."""
    hw = load_hardware("h200-141gb")
    k = hw.kernels["trtllm"]
    context = k.mla_context["fp8"]
    assert _mla_instance(hw, engine_name="trtllm").timing_sources["prefill attention"] == "measured trtllm kernels on h200-141gb"
    assert _mla_instance(hw).timing_sources["prefill attention"].startswith("roofline")
    moved = _with_curve(hw, "mla_context", "fp8", engine="trtllm", efficiency=context.efficiency / 2,
                        s_per_head=context.s_per_head + 2e-8, half_tiles=context.half_tiles + 300.0,
                        half_dim=50.0, kv_head_cost=0.5, s_per_kv_head=1e-8)  # (0 as fitted: set, to be counted)
    changed = moved.kernels["trtllm"].mla_context["fp8"]
    others = _with_curve(hw, "context_attention", None, engine="trtllm", efficiency=0.1)
    for b, p in ((1, 128.0), (1, 8192.0), (4, 2048.0)):
        before, after, same = (_mla_instance(h, engine_name="trtllm").pass_time_s(b, b * p, b * p * p) for h in (hw, moved, others))
        curve = [curves.context_attention_s(c, hw.peak_flops_per_s("bf16"), b, p, 16.0, 16.0, 160.0) for c in (context, changed)]
        assert after - before == pytest.approx(61 * (curve[1] - curve[0]), rel=1e-6)
        assert same == before


def test_mla_decode_reads_slower_over_few_sequences_and_pays_per_query_head():
    """Hand-computed: b sequences of c tokens over H heads read L b c cache bytes at the bandwidth's
    `memory_efficiency`, slowed by (b + half_sequences) / b, or compute 2 H (L + R) b c FLOPs at
    `efficiency` of the cache precision's peak, whichever is slower; plus b (s_per_sequence + H
    s_per_head) and the latency."""
    curve = load_hardware("h200-141gb").kernels["sglang"].mla_generation["fp8"].model_copy(update={
        "memory_efficiency": 0.8, "efficiency": 0.5, "half_sequences": 3.0, "s_per_sequence": 1e-7, "s_per_head": 1e-9,
        "latency_s": 1e-5})
    peak, bandwidth = 2e15, 4e12
    one = curves.mla_generation_s(curve, peak, bandwidth, 1.0, 131072.0, 16.0, 576.0, 512.0, 1.0)
    assert one == pytest.approx(576 * 131072 / (4e12 * 0.8) * 4 + 1e-7 + 16e-9 + 1e-5, rel=1e-12)
    many = curves.mla_generation_s(curve, peak, bandwidth, 64.0, 2048.0, 128.0, 576.0, 512.0, 1.0)  # compute-bound
    assert many == pytest.approx(2 * 128 * 1088 * 64 * 2048 / (2e15 * 0.5) + 64 * (1e-7 + 128e-9) + 1e-5, rel=1e-12)
    # the same tokens, few sequences: more time per token read
    assert one / 131072 > curves.mla_generation_s(curve, peak, bandwidth, 64.0, 2048.0, 16.0, 576.0, 512.0, 1.0) / (64 * 2048)


@pytest.mark.parametrize("layout", ["tp8", "tp1dp8ep8"])
def test_the_pass_reads_mla_cache_as_its_curve(layout):
    """The pass formula's decode attention moves as `curves.mla_generation_s` does, per layer: a larger
    `half_sequences` slows a step of few sequences by the layers times the curve's own change (over a
    DP group's sequences where attention is data-parallel), and a time per query head by the heads a GPU
    holds; the compute is quoted against the cache precision's peak (fp8)."""
    hw = load_hardware("h200-141gb")
    base = hw.kernels["sglang"].mla_generation["fp8"]
    inst = _mla_instance(hw, layout)
    groups = 8.0 if "dp8" in layout else 1.0
    heads = 128 / inst.layout.tp
    assert inst.constants.decode_attention_efficiency == pytest.approx(
        base.efficiency * hw.peak_flops_per_s("fp8") / hw.peak_flops_per_s(inst.engine.dtype), rel=1e-12)
    seqs, context = 2.0 * groups, 65536.0
    step = inst.pass_time_s(decode_seqs=seqs, decode_context_tokens=seqs * context)
    ramped = _with_curve(hw, "mla_generation", "fp8", engine="sglang", half_sequences=base.half_sequences + 5.0)
    slower = _mla_instance(ramped, layout).pass_time_s(decode_seqs=seqs, decode_context_tokens=seqs * context)
    peak, bandwidth = hw.peak_flops_per_s("fp8"), hw.memory_bytes_per_s
    per_group = [curves.mla_generation_s(h.kernels["sglang"].mla_generation["fp8"], peak, bandwidth, seqs / groups, context, heads,
                                         576.0, 512.0, 1.0) for h in (hw, ramped)]
    assert slower - step == pytest.approx(61 * (per_group[1] - per_group[0]), rel=1e-9)
    headed = _mla_instance(_with_curve(hw, "mla_generation", "fp8", engine="sglang", s_per_head=base.s_per_head + 1e-9), layout)
    later = headed.pass_time_s(decode_seqs=seqs, decode_context_tokens=seqs * context)
    assert later - step == pytest.approx(61 * seqs / groups * heads * 1e-9, rel=1e-6)


@pytest.mark.parametrize("layout", ["tp8", "tp1dp8ep8"])
@pytest.mark.parametrize("batch", [1, 5, 64])
def test_the_decode_line_is_the_pass_with_mla_curves(layout, batch):
    """The simulator's decode step equals the pass formula where the cache is read slower over few
    sequences (`half_sequences`): the slope in the summed context depends on the batch."""
    inst = _mla_instance(load_hardware("h200-141gb"), layout)
    assert inst.constants.decode_attention_half_seqs > 0
    base, per_token, slack = inst.decode_line(batch)
    for context in (0.0, 1e4, 3e6):
        line = base + context * per_token + max(slack - context * per_token, 0.0)
        assert line == pytest.approx(inst.pass_time_s(decode_seqs=float(batch), decode_context_tokens=context), rel=1e-12)
    lines = inst.decode_line(np.array([batch, 2 * batch]))
    assert lines[1][0] == pytest.approx(per_token, rel=1e-15)
    assert lines[1][1] < per_token if layout == "tp8" else lines[1][1] <= per_token  # (128 heads a GPU: compute binds)


def _fit_kernels():
    """bench/fit_kernels.py as a module (the fitting step: it reads NVIDIA's tables only when run)."""
    spec = importlib.util.spec_from_file_location("fit_kernels", Path(__file__).resolve().parents[2] / "bench" / "fit_kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_attention_is_fitted_on_the_kernels_the_engine_serves_with():
    """Per shape and KV precision the kernel the engine runs by default (SGLang: trtllm_mha before
    FlashInfer), attending in bf16 where that kernel was timed so, else in fp8; a context table's
    one-token prompts timed by a decode kernel are not prompts."""
    shape = {"batch_size": 4, "step": 0, "num_heads": 32, "num_key_value_heads": 8, "head_dim": 128}
    rows = [(16, "flashinfer", "bfloat16", "bfloat16", 1.4), (16, "trtllm_mha", "bfloat16", "bfloat16", 1.0),
            (16, "flashinfer", "bfloat16", "fp8", 1.3), (16, "trtllm_mha", "fp8", "fp8", 0.9),
            (1, "vllm_flashinfer_trtllmdecode", "bfloat16", "bfloat16", 0.1)]
    frame = pd.DataFrame([{**shape, "isl": isl, "kernel_source": k, "attn_dtype": a, "kv_cache_dtype": kv, "latency": t}
                          for isl, k, a, kv, t in rows])
    fk = _fit_kernels()
    served = fk.serving_kernels(frame, "sglang", context=True)
    assert sorted(zip(served.kernel_source, served.attn_dtype, served.kv_cache_dtype, strict=True)) == [
        ("trtllm_mha", "bfloat16", "bfloat16"), ("trtllm_mha", "fp8", "fp8")]
    # an engine with no preference keeps every kernel's shapes, bf16 attention first; decodes only out of context tables
    kept = fk.serving_kernels(frame, "vllm", context=False)
    assert len(kept) == 4 and set(kept[kept.kv_cache_dtype == "fp8"].attn_dtype) == {"bfloat16"}
    assert (fk.serving_kernels(frame, "vllm", context=True).isl > 1).all()


def test_mla_prefill_is_fitted_on_the_kernels_that_time_it_as_served():
    """SGLang's Hopper collector times MLA's prefill over the absorbed latent (`flash_attention`), its
    Blackwell one over the projected heads (`trtllm_mla`), as served: SGLang's curve takes the second
    alone; TensorRT-LLM's tables all; a shape timed twice counts once, at its median; fewer than 4 heads
    a GPU, which no catalog model serves, are left out."""
    shape = {"mla_dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "batch_size": 1, "isl": 4096}
    rows = [("flash_attention", 16, 7.8), ("trtllm_mla", 16, 1.0), ("trtllm_mla", 16, 1.2), ("trtllm_mla", 16, 1.1),
            ("trtllm_mla", 2, 0.1), ("default", 16, 2.3)]
    frame = pd.DataFrame([{**shape, "kernel_source": k, "num_heads": h, "latency": t} for k, h, t in rows])
    fk = _fit_kernels()
    served = fk.serving_mla_prefill(frame[frame.kernel_source != "default"], "sglang")
    assert served[["num_heads", "latency"]].to_dict("records") == [{"num_heads": 16, "latency": 1.1}]
    assert fk.serving_mla_prefill(frame[frame.kernel_source == "default"], "trtllm").latency.tolist() == [2.3]


def test_a_refit_of_some_precisions_keeps_the_others(tmp_path, monkeypatch):
    """`fit_kernels --write --only gemm --precisions fp4` adds the fp4 curve and its error and keeps the
    shipped bf16 and fp8 ones as they are (a rerun moves parameters the tables barely pin); without
    --precisions the class is replaced whole."""
    fk = _fit_kernels()
    (tmp_path / "hardware_specs").mkdir()
    shipped = {"source": "s", "gemm": {"bf16": {"efficiency": 0.7}, "fp8": {"efficiency": 0.8}},
               "mape_pct": {"gemm_bf16": 6.0, "gemm_fp8": 11.0}}
    (tmp_path / "hardware_specs" / "x.yaml").write_text(yaml.safe_dump({"name": "x", "kernels": {"vllm": shipped}}))
    monkeypatch.setattr(fk, "ROOT", tmp_path)
    fitted = {"vllm": {"source": "s", "gemm": {"bf16": {"efficiency": 0.71}, "fp8": {"efficiency": 0.79},
                                               "fp4": {"efficiency": 0.67}},
                       "mape_pct": {"gemm_bf16": 6.1, "gemm_fp8": 11.2, "gemm_fp4": 10.3}}}
    some = fk.keep_others("x", fitted, ["gemm"], None, ["fp4"])["vllm"]
    assert some["gemm"] == {"bf16": {"efficiency": 0.7}, "fp8": {"efficiency": 0.8}, "fp4": {"efficiency": 0.67}}
    assert some["mape_pct"] == {"gemm_bf16": 6.0, "gemm_fp8": 11.0, "gemm_fp4": 10.3}
    assert fk.keep_others("x", fitted, ["gemm"])["vllm"] == fitted["vllm"]


def test_the_fit_counts_the_cells_within_ten_percent(capsys):
    """bench/fit_kernels.py's closing count, which the README's op-level row quotes: a cell of more
    than 20 points counts, and meets the target at a held-out MAPE of 10 % or less."""
    def cell(gpu, op, errors):
        return pd.DataFrame({"engine": "vllm", "gpu": gpu, "op": op, "key": "bf16", "size": np.arange(1.0, len(errors) + 1),
                             "error_pct": errors})

    fk = _fit_kernels()
    fk.report(pd.concat([cell("a", "gemm", [5.0] * 21), cell("b", "gemm", [-15.0] * 21), cell("c", "moe", [10.0] * 21),
                         cell("d", "moe", [50.0] * 20)], ignore_index=True))
    assert "\n2 of 3 cells of more than 20 points within 10 % (**: not): gemm 1 of 2, moe 1 of 1\n" in capsys.readouterr().out
