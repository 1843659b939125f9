"""Today's MoE models from their real config.json (issue 17, first part): parameter counts
against the published ones, KV bytes per token for multi-head latent attention by hand, and
the roofline's MLA decode reading the latent once per GPU."""

import pytest

from splitplan import api
from splitplan.base.errors import SpecError
from splitplan.specs.model import load_model


@pytest.mark.parametrize("name,total_b,active_b", [
    # DeepSeek-V3 technical report (arXiv 2412.19437): 671B total, 37B activated; its weight notes
    # count 36.6B activated with the output head but not the input embedding (a lookup).
    ("deepseek-v3", 671, 36.6),
    ("qwen3-235b-a22b", 235, 22),  # Qwen3 model card (2025-04): 235B total, 22B activated
    # Meta (2025-04): 400B total, 17B active, met with both embeddings counted (17.2B; 16.1B without
    # the input embedding); every second layer MoE with one shared expert, dense layers 16,384 wide
    ("llama4-maverick", 400, 17),
])
def test_parameter_counts_match_the_published_ones(name, total_b, active_b):
    m = load_model(name)
    input_embedding = m.vocab_size * m.hidden_size
    assert m.total_params / 1e9 == pytest.approx(total_b, rel=0.005)
    assert (m.active_params - (input_embedding if name == "deepseek-v3" else 0)) / 1e9 == pytest.approx(active_b, rel=0.015)


def test_llama4_reads_its_text_config_and_interleaves_moe_layers():
    m = load_model("llama4-maverick")
    assert (m.num_hidden_layers, m.moe_layers, m.dense_layers, m.n_shared_experts) == (48, 24, 24, 1)
    assert m.dense_ffn_params == 3 * 5120 * 16384 and m.expert_params == 3 * 5120 * 8192


def test_mla_caches_the_latent_and_the_rope_key_per_layer():
    m = load_model("deepseek-v3")
    assert m.is_mla and m.kv_cache_elements_per_layer == 512 + 64
    assert m.kv_bytes_per_token(1) == 61 * 576  # 35,136 B per token in fp8, against 3.8 MB for 128 full KV heads
    assert 2 * 61 * 128 * 128 * 1 / m.kv_bytes_per_token(1) == pytest.approx(56.9, rel=1e-3)
    assert (m.moe_layers, m.dense_layers) == (58, 3)


def test_mla_decode_reads_the_whole_latent_on_every_gpu():
    inst = api.instance("deepseek-v3", "h200-141gb", 8, "lean-fp8")
    assert inst.kv_bytes_per_token == 61 * 576 * 8  # replicated on the 8 GPUs, not split by heads
    short, long = (inst.explain(decode_batch=4, decode_context_tokens=c) for c in (1000, 3000))
    assert long.bytes_per_gpu - short.bytes_per_gpu == pytest.approx(61 * 576 * 1 * 4 * 2000, rel=1e-9)
    # absorbed attention: 2 x heads/GPU x (576 + 512) FLOPs per context token and layer
    assert long.flops_per_gpu - short.flops_per_gpu == pytest.approx(61 * 2 * 16 * (576 + 512) * 4 * 2000, rel=1e-9)


def test_shared_experts_and_dense_layers_are_dense_work():
    """At one token, the bytes of a pass are the dense weights plus the 8 routed experts touched."""
    m = load_model("deepseek-v3")
    inst = api.instance(m, "h200-141gb", 8, "lean-fp8")
    one = inst.explain(decode_batch=1, decode_context_tokens=1)
    dense = 61 * m.attn_params_per_layer + 3 * m.dense_ffn_params + 58 * m.expert_params  # (1 shared expert per MoE layer)
    routed = 58 * 8 * m.expert_params * (1 - (1 - 8 / 256) ** 1) / (8 / 256)  # E (1 - (1 - k/E)^1) = k experts touched
    head = m.vocab_size * m.hidden_size
    weights = (dense + routed + head) / 8  # fp8: a byte per weight, split over TP 8
    assert weights < one.bytes_per_gpu < weights * 1.01  # (plus activations and one token of KV)


def test_gpt_oss_alternates_sliding_window_and_full_attention():
    m = load_model("gpt-oss-120b")
    assert m.is_moe and (m.num_local_experts, m.num_experts_per_tok, m.sliding_layers) == (128, 4, 18)
    assert m.total_params / 1e9 == pytest.approx(116.8, abs=0.05)  # published 117B
    per_layer = 2 * 8 * 64  # keys and values of 8 KV heads of 64
    assert m.kv_bytes_per_request(100, 1) == 36 * per_layer * 100  # within the window: every layer
    assert m.kv_bytes_per_request(4096, 1) == per_layer * (18 * 4096 + 18 * 128)
    assert m.kv_bytes_per_token(1) == 36 * per_layer  # what the planner counts: the upper bound


def test_layer_types_must_list_every_layer(tmp_path):
    spec = tmp_path / "m.yaml"
    spec.write_text("num_hidden_layers: 4\nhidden_size: 64\nnum_attention_heads: 4\nintermediate_size: 128\n"
                    "vocab_size: 100\nsliding_window: 8\nlayer_types: [sliding_attention, full_attention]\n")
    with pytest.raises(SpecError, match="layer_types lists 2 layers, num_hidden_layers is 4"):
        load_model(str(spec))
