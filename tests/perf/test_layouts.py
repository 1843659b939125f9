"""Parallel layouts (issue 17, item 2): TP, DP attention, EP, PP, instances over machines."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from splitplan.base.errors import SpecError
from splitplan.cli import app
from splitplan.perf.points import candidate_layouts
from splitplan.perf.roofline import Instance
from splitplan.specs.engine import load_engine
from splitplan.specs.hardware import load_hardware
from splitplan.specs.layout import Layout, parse_layout
from splitplan.specs.model import load_model

DSV3, LLAMA = load_model("deepseek-v3"), load_model("llama2-70b")
H200, H100 = load_hardware("h200-141gb"), load_hardware("h100-80gb")
FP8 = load_engine("sglang-fp8")


@pytest.mark.parametrize("text, layout, shown", [
    ("8", Layout(8), "TP 8"), ("tp8", Layout(8), "TP 8"), ("dp16ep16", Layout(1, 16, 16), "DP 16 EP 16"),
    ("TP4 DP2 EP8", Layout(4, 2, 8), "TP 4 DP 2 EP 8"), ("tp8pp2", Layout(8, pp=2), "TP 8 PP 2"), ("1", Layout(1), "TP 1"),
])
def test_layout_notation_round_trips(text, layout, shown):
    parsed = parse_layout(text, "x")
    assert parsed == layout and str(parsed) == shown and parse_layout(parsed.spec, "x") == parsed


@pytest.mark.parametrize("text, message", [
    ("tp8tp2", "is not one"), ("ep", "is not one"), ("dp16ep3", "EP 3 must divide the 16 GPUs"), ("tp0", "at least 1"),
])
def test_bad_layouts_are_refused(text, message):
    with pytest.raises(SpecError, match=message):
        parse_layout(text, "x")


def test_weights_per_gpu_follow_the_layout():
    routed, rest = DSV3.routed_params, DSV3.total_params - DSV3.routed_params
    cases = {Layout(8): DSV3.total_params / 8, Layout(1, 8, 8): rest + routed / 8,
             Layout(8, 2, 16): rest / 8 + routed / 16, Layout(8, pp=2): DSV3.total_params / 16}
    for layout, params in cases.items():
        assert Instance(DSV3, H200, FP8, layout).fit.weights_bytes_per_gpu == pytest.approx(params * 1.0)


def test_kv_capacity_counts_every_gpu_and_a_request_lives_in_one_dp_group():
    inst = Instance(DSV3, H200, FP8, Layout(1, 16, 16))
    usable = H200.memory_bytes_per_gpu * FP8.memory_usable_fraction - FP8.activation_reserve_gb_per_gpu * 1e9
    per_token = DSV3.num_hidden_layers * DSV3.kv_cache_elements_per_layer * FP8.kv_bytes_per_element  # MLA latent, TP 1
    assert inst.fit.kv_capacity_tokens == int((usable - inst.fit.weights_bytes_per_gpu) * 16 // per_token)
    assert inst.max_request_tokens == inst.fit.kv_capacity_tokens // 16


def test_instances_fill_whole_machines():
    wide = Instance(DSV3, H200, FP8, Layout(1, 16, 16))
    assert (wide.unit_machines, wide.unit_instances) == (2, 1)
    assert [wide.instances_on(m) for m in (1, 2, 3, 4, 5)] == [0, 1, 1, 2, 2]
    small = Instance(LLAMA, H100, FP8, Layout(2))
    assert (small.unit_machines, small.unit_instances, small.instances_on(3)) == (1, 4, 12)


@pytest.mark.parametrize("model, layout, reason", [
    (LLAMA, Layout(1, 8, 8), "EP 8 needs an MoE model"),
    (LLAMA, Layout(4, 2), "data-parallel attention serves MoE models"),
    (DSV3, Layout(1, 4, 4, 3), "neither tiles the 8 GPUs"),
    (DSV3, Layout(3), "TP 3 does not divide the 8 GPUs"),
])
def test_layouts_an_instance_cannot_take_say_why(model, layout, reason):
    fit = Instance(model, H200, FP8, layout).fit
    assert not fit.fits and reason in fit.reason


def test_tp_layout_is_the_plain_tp_instance():
    for t in (1, 2, 4, 8):
        a, b = Instance(LLAMA, H100, FP8, t), Instance(LLAMA, H100, FP8, Layout(t))
        assert a.pass_time_s(2, 3000, 5e6, 16, 16 * 900) == b.pass_time_s(2, 3000, 5e6, 16, 16 * 900)


@pytest.mark.parametrize("layout", [Layout(8), Layout(1, 8, 8), Layout(1, 16, 16), Layout(8, 2, 16), Layout(8, pp=2)])
def test_decode_line_is_exact_and_arrays_match_scalars(layout):
    inst = Instance(DSV3, H200, FP8, layout)
    for batch in (1, 3, 64, 512):
        base, per_token, slack = inst.decode_line(batch)
        for ctx in (100, 4000):
            c = batch * ctx
            assert base + c * per_token + max(slack - c * per_token, 0) == pytest.approx(inst.decode_step_time_s(batch, ctx), rel=1e-12)
    args = [np.array(x, float) for x in ([0, 1, 4], [0, 1000, 4000], [0, 1e6, 4e6], [5, 3, 0], [5000, 3000, 0])]
    assert np.allclose(inst.pass_time_s(*args), [inst.pass_time_s(*map(float, row)) for row in zip(*args, strict=True)])


def test_expert_parallel_exchange_crosses_machines_over_the_scale_out_network():
    """DP 16 EP 16 on two 8-GPU machines: half the dispatch leaves the machine, over the NICs;
    the same machine in a 16-GPU NVLink domain keeps it on NVLink and decodes faster."""
    domain = H200.model_copy(update={"nvlink_domain_gpus": 16})
    two, one = Instance(DSV3, H200, FP8, Layout(1, 16, 16)), Instance(DSV3, domain, FP8, Layout(1, 16, 16))
    a, b = two.explain(decode_batch=256, decode_context_tokens=2000), one.explain(decode_batch=256, decode_context_tokens=2000)
    assert a.network_s > 1.5 * b.network_s and a.compute_s == b.compute_s and a.memory_s == b.memory_s


def test_one_prompt_is_attended_by_one_dp_group_a_batch_by_all():
    inst = Instance(DSV3, H200, FP8, Layout(1, 8, 8))
    one, eight = inst.prefill_time_s(8192), inst.pass_time_s(8, 8 * 8192, 8 * 8192**2)
    assert eight < 2 * one  # eight prompts spread over the eight attention groups


def test_pipeline_decode_takes_pp_stage_times_of_a_micro_batch():
    """With at least pp requests each stage holds one micro-batch; with one request, the
    pipeline holds it whole and the step is no faster than TP alone on one stage."""
    pp2, tp8 = Instance(LLAMA, H100, FP8, Layout(8, pp=2)), Instance(LLAMA, H100, FP8, Layout(8))
    assert pp2.decode_step_time_s(1, 1000) >= tp8.decode_step_time_s(1, 1000) * 0.95
    assert pp2.decode_step_time_s(256, 1000) < tp8.decode_step_time_s(256, 1000)
    # one request is one micro-batch: each GPU reads its stage's weights once per step, not twice
    one = pp2.explain(decode_batch=1, decode_context_tokens=1000)
    # (the input embedding is not read)
    assert 0.95 * pp2.fit.weights_bytes_per_gpu < one.bytes_per_gpu < 1.1 * pp2.fit.weights_bytes_per_gpu


@pytest.mark.parametrize("prompts", [1, 2, 4])
def test_pipeline_prefill_fills_and_drains_the_pipeline(prompts):
    """A pass with prefill takes 2 pp - 1 stage times (the pipeline fills and drains), each stage
    half the layers on a micro-batch of half the prompt tokens: 3/4 of TP 8's pass on one stage's
    GPUs, plus the stage hops and fixed costs (where a decode-only pass takes pp stage times)."""
    pp2, tp8 = Instance(LLAMA, H100, FP8, Layout(8, pp=2)), Instance(LLAMA, H100, FP8, Layout(8))
    args = (prompts, prompts * 4096, prompts * 4096**2)
    assert 0.74 < pp2.pass_time_s(*args) / tp8.pass_time_s(*args) < 0.82


def test_search_adds_wide_ep_for_moe_and_pipelines_when_nothing_fits_one_machine():
    assert candidate_layouts(LLAMA, H100, FP8) == [Layout(t) for t in (1, 2, 4, 8)]
    layouts = candidate_layouts(DSV3, H200, FP8)
    assert Layout(1, 16, 16) in layouts and Layout(8, 2, 16) in layouts and Layout(8, pp=2) not in layouts
    assert Layout(8, pp=2) in candidate_layouts(DSV3, H100, FP8)  # 671 GB of fp8 weights: no 8x H100 holds them
    assert candidate_layouts(DSV3, H200, FP8, tp=8) == [Layout(8)]


def test_simulate_takes_a_layout_and_whole_instances(tmp_path):
    runner = CliRunner()
    base = ["simulate", "--model", "deepseek-v3", "--engine", "sglang-fp8", "--rate", "2", "--duration", "20", "--format", "json"]
    ok = runner.invoke(app, base + ["--prompt-pool", "h200-141gb:8:1", "--token-pool", "h200-141gb:dp16ep16:2"])
    assert ok.exit_code == 0, ok.stderr
    pools = json.loads(ok.stdout)["summary"]["pools"]
    assert [(p["layout"], p["machines"], p["instances"]) for p in pools] == [("tp8", 1, 1), ("dp16ep16", 2, 1)]
    bad = runner.invoke(app, base + ["--prompt-pool", "h200-141gb:8:1", "--token-pool", "h200-141gb:dp16ep16:3"])
    assert bad.exit_code == 2 and "spans 2 machines; give a multiple of 2" in bad.stderr


def test_plan_json_carries_the_layout_and_simulate_reads_it_back(tmp_path):
    runner = CliRunner()
    out = tmp_path / "o"
    args = ["optimize", "--model", "deepseek-v3", "--engine", "sglang-fp8", "--hardware", "h200-141gb", "--slo", "chat",
            "--rate", "2", "--duration", "30", "--output-dir", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    plan = json.loads((out / "plan.json").read_text())
    pools = [p for role in ("prompt", "token", "mixed") for p in plan["plan"].get(f"{role}_pools", [])]
    for p in pools:
        assert parse_layout(p["layout"], "x") == Layout(p["tp"], p["dp"], p["ep"], p["pp"])
    sim = runner.invoke(app, ["simulate", "--plan", str(out / "plan.json"), "--format", "json"])
    assert sim.exit_code == 0, sim.stderr
    assert [p["layout"] for p in json.loads(sim.stdout)["summary"]["pools"]] == [p["layout"] for p in pools]


def test_rack_scale_machine_keeps_wide_ep_on_nvlink():
    """A GB200 NVL72 tray is a 4-GPU machine in a 72-GPU NVLink domain: TP 8 spans two trays, and
    DP 32 EP 32 (eight trays) exchanges over NVLink, where eight-GPU B200 machines use their NICs."""
    gb200, b200 = load_hardware("gb200-nvl72"), load_hardware("b200-180gb")
    assert gb200.tp_degrees() == [1, 2, 4, 8] and gb200.nvlink_domain == 72
    rack, nodes = Instance(DSV3, gb200, FP8, Layout(1, 32, 32)), Instance(DSV3, b200, FP8, Layout(1, 32, 32))
    assert (rack.unit_machines, nodes.unit_machines) == (8, 4)
    nvlink = gb200.intra_node_bytes_per_s * rack.factors.link_efficiency
    assert rack._link_bytes_per_s(32, rack.factors) == nvlink
    assert nodes._link_bytes_per_s(32, nodes.factors) < nvlink / 10
    assert Instance(DSV3, gb200, FP8, Layout(8)).unit_machines == 2


def test_a_requests_kv_crosses_its_attention_groups_nics():
    """TP 8: the machine's NICs; DP 16 EP 16: one GPU's share (TP 1), however many machines."""
    assert Instance(DSV3, H200, FP8, Layout(8)).kv_link_bytes_per_s == H200.scale_out_bytes_per_s
    assert Instance(DSV3, H200, FP8, Layout(1, 16, 16)).kv_link_bytes_per_s == H200.scale_out_bytes_per_s / 8
    assert Instance(LLAMA, H100, FP8, Layout(8, pp=2)).kv_link_bytes_per_s == 2 * H100.scale_out_bytes_per_s


def test_expert_all_to_all_time_by_hand_and_no_pipeline_hop_without_stages():
    """DP 8 EP 8 on one 8-GPU H200 (one NVLink domain), a decode step of 64 requests (8 per
    attention group): no TP all-reduce (TP 1), no pipeline hop (PP 1); per MoE layer, dispatch and
    combine send each token to its 8 experts' GPUs, 7/8 of them elsewhere, over 450 GB/s, plus
    two collective latencies. By hand, from the model's and the machine's figures."""
    from splitplan.specs.engine import EngineFactors, EngineProfile
    latency_s = 10e-6
    engine = EngineProfile(name="links", description="test", source="test", dtype="bf16",
                           defaults=EngineFactors(link_efficiency=1, collective_latency_s=latency_s))
    inst = Instance(DSV3, H200, engine, Layout(1, 8, 8))
    batch = 64
    per_token_bytes = 2 * 8 * (7 / 8) / 8 * DSV3.hidden_size * 2  # 2 x min(k, ep) x moe_tp/g x (g-1)/g x hidden x bf16
    expected = DSV3.moe_layers * (batch * per_token_bytes / 450e9 + 2 * latency_s)
    assert inst.explain(decode_batch=batch, decode_context_tokens=1000).network_s == pytest.approx(expected, rel=1e-9)


def test_decode_attention_flops_by_hand():
    """`perf`'s FLOPs per GPU: decode attention reads each context token once per query head,
    4 x q_dim / TP FLOPs per token per layer (scores and the weighted sum); MLA attends over the
    latent with the up-projections absorbed, 2 x heads / TP x (latent + RoPE key + latent)."""
    for model, layout, per_token in ((LLAMA, Layout(8), 4 * LLAMA.q_dim / 8),
                                     (DSV3, Layout(8), 2 * DSV3.num_attention_heads / 8
                                      * (DSV3.kv_cache_elements_per_layer + DSV3.mla.kv_lora_rank))):
        inst = Instance(model, H200, FP8, layout)
        more, fewer = (inst.explain(decode_batch=16, decode_context_tokens=c) for c in (3000, 1000))  # (per request)
        assert more.flops_per_gpu - fewer.flops_per_gpu == pytest.approx(
            model.num_hidden_layers * 16 * 2000 * per_token, rel=1e-9)
