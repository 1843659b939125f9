import json
import re

import pytest

from splitplan.errors import SpecError
from splitplan.specs.catalog import catalog_names
from splitplan.specs.engine import engine_catalog, load_engine
from splitplan.specs.hardware import hardware_catalog, load_hardware
from splitplan.specs.model import load_model, model_catalog


def test_every_bundled_spec_loads():
    assert len(hardware_catalog()) >= 7
    assert len(model_catalog()) >= 7
    assert {e.name for e in engine_catalog()} >= {"lean", "splitwise-vllm"}


@pytest.mark.parametrize("name", ["a100-80gb", "h100-80gb", "h100-80gb-cap70", "h200-141gb", "b200-180gb", "l40s-48gb", "mi300x-192gb"])
def test_required_hardware_present_with_provenance(name):
    hw = load_hardware(name)
    assert hw.price_source and hw.price_date and hw.gpu.source and hw.gpu.source_date
    assert hw.gpu.clock_source.startswith(("estimate", "http", "measured")) and hw.gpu.sustained_clock_fraction < 1


def test_splitwise_machine_constants():
    a, h, cap = load_hardware("a100-80gb"), load_hardware("h100-80gb"), load_hardware("h100-80gb-cap70")
    assert (a.price_usd_per_hour, a.provisioned_power_w) == (17.6, 6500)
    assert (h.price_usd_per_hour, h.provisioned_power_w) == (38.0, 10200)
    assert cap.provisioned_power_w == pytest.approx(0.7 * h.provisioned_power_w)
    # Splitwise's capped H100 (50 % per GPU): prefill about 1.3x slower, from the clock model
    assert h.prefill_clock_fraction / cap.prefill_clock_fraction == pytest.approx(1.3, rel=0.02)
    assert h.scale_out_bytes_per_s == pytest.approx(8 * 400e9 / 8)  # 8 x 400 Gbit/s in bytes/s
    assert h.intra_node_bytes_per_s == pytest.approx(450e9)  # one direction of 900 GB/s


# REFERENCE.md section 4: parameters (billions) and KV bytes per token in bf16.
@pytest.mark.parametrize("name,params_b,kv_bytes", [
    ("llama2-7b", 6.74, 524_288), ("llama2-13b", 13.0, 819_200), ("llama2-70b", 69.0, 327_680),
    ("llama3.1-8b", 8.03, 131_072), ("llama3.1-70b", 70.6, 327_680), ("llama3.1-405b", 405.9, 516_096),
    ("qwen2.5-72b", 72.7, 327_680), ("mixtral-8x7b", 46.7, 131_072), ("bloom-176b", 176.2, 4_014_080),
    ("gpt3-175b", 174.6, 4_718_592),
])
def test_model_params_and_kv_match_reference(name, params_b, kv_bytes):
    m = load_model(name)
    assert m.total_params / 1e9 == pytest.approx(params_b, rel=0.01)
    assert m.kv_bytes_per_token(2) == kv_bytes


def test_moe_active_params_and_ffn_kinds():
    mixtral = load_model("mixtral-8x7b")
    assert mixtral.active_params / 1e9 == pytest.approx(12.9, rel=0.01)
    assert load_model("bloom-176b").ffn_matrices == 2
    assert load_model("llama2-70b").ffn_matrices == 3


def test_real_hf_config_passes_unchanged(tmp_path):
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
        "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "vocab_size": 128256, "rope_scaling": {"factor": 8.0},
        "torch_dtype": "bfloat16", "hidden_act": "silu", "tie_word_embeddings": False,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    m = load_model(str(path))
    assert m.total_params == load_model("llama3.1-8b").total_params


def test_gpt_style_aliases(tmp_path):
    path = tmp_path / "bloom.json"
    path.write_text(json.dumps({"n_layer": 70, "n_head": 112, "hidden_size": 14336, "n_inner": 57344,
                                "vocab_size": 250880, "hidden_act": "gelu", "tie_word_embeddings": True}))
    assert load_model(str(path)).total_params == load_model("bloom-176b").total_params


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_unknown_hardware_key_suggests(tmp_path):
    text = open(catalog_path("h100-80gb")).read().replace("price_usd_per_hour", "price_usd_per_hr")
    with pytest.raises(SpecError, match=r"unknown key 'price_usd_per_hr'; did you mean 'price_usd_per_hour'"):
        load_hardware(_write(tmp_path, "x.yaml", text))


def catalog_path(name):
    from splitplan.specs.catalog import resolve
    return resolve("hardware_specs", name, "hardware")


def test_missing_and_negative_hardware_values(tmp_path):
    text = open(catalog_path("a100-80gb")).read()
    with pytest.raises(SpecError, match="missing key 'price_source'"):
        load_hardware(_write(tmp_path, "a.yaml", "\n".join(x for x in text.splitlines() if not x.startswith("price_source"))))
    with pytest.raises(SpecError, match=r"gpu.memory_gb"):
        load_hardware(_write(tmp_path, "b.yaml", text.replace("memory_gb: 80", "memory_gb: -80")))


def test_model_heads_must_divide_hidden(tmp_path):
    path = _write(tmp_path, "m.yaml", "num_hidden_layers: 2\nhidden_size: 100\nnum_attention_heads: 3\n"
                  "intermediate_size: 400\nvocab_size: 1000\n")
    with pytest.raises(SpecError, match="does not divide hidden_size"):
        load_model(path)


def test_unknown_names_suggest():
    with pytest.raises(SpecError, match="did you mean 'h100-80gb'"):
        load_hardware("h100-80g")
    with pytest.raises(SpecError, match="unknown model 'gpt5'"):
        load_model("gpt5")


def test_bad_yaml_names_line(tmp_path):
    with pytest.raises(SpecError, match="line 2"):
        load_engine(_write(tmp_path, "e.yaml", "description: x\nsource: a: b\n"))


def test_engine_overrides_layer_by_hardware_tp_and_model():
    eng = load_engine("splitwise-vllm")
    assert eng.factors("a100-80gb", 8, "llama2-70b") == eng.hardware_overrides["a100-80gb/tp8/llama2-70b"]
    assert eng.factors("a100-80gb", 8, "mixtral-8x7b") == eng.hardware_overrides["a100-80gb/tp8"]  # model not measured
    assert eng.factors("a100-80gb", 1) == eng.hardware_overrides["a100-80gb"]  # TP not measured
    assert eng.factors("b200-180gb", 8) == eng.defaults  # machine not measured
    assert all(f.compute_efficiency <= 1 and f.memory_efficiency <= 1 for f in eng.hardware_overrides.values())


def test_catalog_names_are_file_stems():
    assert "llama2-70b" in catalog_names("model_specs")


def test_misspelt_model_key_suggests(tmp_path):
    path = _write(tmp_path, "m.yaml", "num_hiden_layers: 2\nhidden_size: 128\nnum_attention_heads: 4\n"
                  "intermediate_size: 256\nvocab_size: 1000\nsome_other_hf_key: 3\n")
    with pytest.raises(SpecError, match="unknown key 'num_hiden_layers'; did you mean 'num_hidden_layers'"):
        load_model(path)


@pytest.mark.parametrize("text,needle", [
    ("description: x\nttft:\n  p100: {max_ms: 5}\n", "strictly between 0 and 100"),
    ("description: x\nttft:\n  p99: {slowdown: 2}\n", "needs 'reference"),
    ("description: x\nttft:\n  p99: {max_ms: 5, slowdown: 2}\n", "exactly one of max_ms or slowdown"),
    ("description: x\nttft:\n  p99: {max_ms: -5}\n", "ttft.p99.max_ms"),
    ("description: x\ntfft:\n  p99: {max_ms: 5}\n", "did you mean 'ttft'"),
])
def test_bad_slo_profiles(tmp_path, text, needle):
    from splitplan.specs.slo import load_slo
    with pytest.raises(SpecError, match=re.escape(needle)):
        load_slo(_write(tmp_path, "s.yaml", text))


@pytest.mark.parametrize("engine", ["lean", "lean-fp8"])
def test_datasheet_profiles_source_every_machines_efficiency(engine):
    from splitplan.specs.engine import load_engine
    from splitplan.specs.hardware import hardware_catalog
    profile = load_engine(engine)
    assert set(profile.efficiency_sources) == {h.name for h in hardware_catalog()}
    assert set(profile.hardware_overrides) <= set(profile.efficiency_sources)
    assert profile.factors("mi300x-192gb", 8).compute_efficiency < profile.factors("h100-80gb", 8).compute_efficiency
