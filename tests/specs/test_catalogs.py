import json
import re
from pathlib import Path

import pytest

from splitplan.base.errors import SpecError
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
    text = Path(catalog_path("h100-80gb")).read_text().replace("price_usd_per_hour", "price_usd_per_hr", 1)
    with pytest.raises(SpecError, match=r"unknown key 'price_usd_per_hr'; did you mean 'price_usd_per_hour'"):
        load_hardware(_write(tmp_path, "x.yaml", text))


def catalog_path(name):
    from splitplan.specs.catalog import resolve
    return resolve("hardware_specs", name, "hardware")


def test_missing_and_negative_hardware_values(tmp_path):
    text = Path(catalog_path("a100-80gb")).read_text()
    with pytest.raises(SpecError, match="missing key 'price_source'"):
        load_hardware(_write(tmp_path, "a.yaml", "\n".join(x for x in text.splitlines() if not x.startswith("price_source"))))
    with pytest.raises(SpecError, match=r"gpu.memory_gb"):
        load_hardware(_write(tmp_path, "b.yaml", text.replace("memory_gb: 80", "memory_gb: -80")))


def test_kv_room_comes_from_the_memory_the_driver_reports_with_its_source(tmp_path):
    # an A100 80GB reports 81,920 MiB: 85.9e9 bytes, not the datasheet's 80e9; a GPU without the
    # figure counts its datasheet GB as 1e9 bytes each; the figure without its source is refused
    text = Path(catalog_path("a100-80gb")).read_text()
    assert load_hardware("a100-80gb").memory_bytes_per_gpu == 81_920 * 2**20
    bare = "\n".join(x for x in text.splitlines() if not x.lstrip().startswith("memory_reported"))
    assert load_hardware(_write(tmp_path, "a.yaml", bare)).memory_bytes_per_gpu == 80e9
    unsourced = "\n".join(x for x in text.splitlines() if not x.lstrip().startswith("memory_reported_source"))
    with pytest.raises(SpecError, match="memory_reported_mib needs its memory_reported_source"):
        load_hardware(_write(tmp_path, "b.yaml", unsourced))


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


def test_a_shape_is_its_machines_share_at_its_own_price():
    """Issue 30: `NAME@G` is the machine of G of the type's GPUs: its NICs and provisioned power
    pro rata, its own price and source; the instance on it is the same instance (engine factors
    and measurements of the type apply); `NAME@gpus_per_machine` is the whole machine."""
    from splitplan.perf.roofline import Instance
    from splitplan.specs.engine import load_engine
    from splitplan.specs.model import load_model
    whole, one = load_hardware("h100-80gb"), load_hardware("h100-80gb@1")
    assert load_hardware("h100-80gb@8") is whole and whole.shape_gpus == [1, 2, 4, 8]
    assert (one.name, one.family, one.gpus_per_machine, one.price_usd_per_hour) == ("h100-80gb@1", "h100-80gb", 1, 4.75)
    assert one.scale_out_bytes_per_s == pytest.approx(whole.scale_out_bytes_per_s / 8)
    assert one.provisioned_power_w == pytest.approx(whole.provisioned_power_w / 8) and one.gpu == whole.gpu
    assert "Lambda" in one.price_source and one.price_date
    model, engine = load_model("llama3.1-8b"), load_engine("vllm")
    a, b = Instance(model, whole, engine, 1), Instance(model, one, engine, 1)
    assert a.factors == b.factors and a.fit == b.fit and a.kv_link_bytes_per_s == b.kv_link_bytes_per_s
    assert a.prefill_time_s([3000]) == b.prefill_time_s([3000])
    with pytest.raises(SpecError, match=r"h100-80gb@3: h100-80gb is rented as machines of 1, 2, 4, 8 GPUs; choose "
                                        r"h100-80gb@1, h100-80gb@2, h100-80gb@4, h100-80gb"):
        load_hardware("h100-80gb@3")
    with pytest.raises(SpecError, match="h100-80gb-cap70 is rented as machines of 8 GPUs"):
        load_hardware("h100-80gb-cap70@1")


SHAPE = "  - gpus: {gpus}\n    price_usd_per_hour: 9.5\n    price_source: quote\n    price_date: 2026-12\n"


@pytest.mark.parametrize("shapes,needle", [
    ([3], r"shapes\[0\].gpus: 3 does not divide the 8 GPUs of the machine"),
    ([2, 2], r"shapes\[1\].gpus: shapes\[0\] is already a machine of 2 GPUs"),
    ([8], r"shapes\[0\].gpus: gpus_per_machine is already a machine of 8 GPUs"),
    ([16], r"shapes\[0\].gpus: 16 does not divide"),
    ("no price", r"missing key 'shapes.0.price_usd_per_hour'"),
])
def test_bad_shapes_name_the_file_and_key(tmp_path, shapes, needle):
    """Bad input (issue 30): a shape whose GPU count does not divide the machine's, two shapes of
    one GPU count (the whole machine's included), a shape without a price: SpecError (exit 2)
    naming the file and the key."""
    text = "\n".join(x for x in Path(catalog_path("h100-80gb")).read_text().split("\nshapes:")[0].splitlines())
    if shapes == "no price":
        block = SHAPE.format(gpus=1).replace("    price_usd_per_hour: 9.5\n", "")
    else:
        block = "".join(SHAPE.format(gpus=g) for g in shapes)
    path = _write(tmp_path, "x.yaml", f"{text}\nshapes:\n{block}")
    with pytest.raises(SpecError, match=rf"x.yaml: .*{needle}"):
        load_hardware(path)


def test_shape_counts_must_pack(tmp_path):
    """Shapes of 2 and 3 GPUs on a 6-GPU machine: instances of one would not tile the other."""
    text = Path(catalog_path("h100-80gb")).read_text().split("\nshapes:")[0].replace("gpus_per_machine: 8", "gpus_per_machine: 6")
    path = _write(tmp_path, "six.yaml", text + "\nshapes:\n" + SHAPE.format(gpus=2) + SHAPE.format(gpus=3))
    with pytest.raises(SpecError, match="six.yaml: shapes: machines of 2 and 3 GPUs; each shape's GPU count must divide"):
        load_hardware(path)
    text = Path(catalog_path("gb200-nvl72")).read_text()
    with pytest.raises(SpecError, match="rack-scale machine"):
        load_hardware(_write(tmp_path, "rack.yaml", text + "\nshapes:\n" + SHAPE.format(gpus=2)))


def test_a_catalog_is_a_value_in_effect_only_where_it_is_active(tmp_path):
    """Issue 56, item 4: a user folder whose entry has a shipped entry's name takes its place only
    inside `with catalog.active():` (nested blocks restore the outer one; another thread sees the
    shipped catalog meanwhile), and each catalog's loads are cached apart."""
    import threading

    from splitplan.specs.catalog import Catalog, current, data_dir
    (tmp_path / "hardware_specs").mkdir()
    text = (data_dir("hardware_specs") / "h100-80gb.yaml").read_text()
    (tmp_path / "hardware_specs" / "h100-80gb.yaml").write_text(text.replace("price_usd_per_hour: 38.0", "price_usd_per_hour: 1.0"))
    shipped = load_hardware("h100-80gb").price_usd_per_hour
    mine = Catalog.of([tmp_path])
    seen = []
    with mine.active():
        assert load_hardware("h100-80gb").price_usd_per_hour == 1.0 and current() == mine
        with Catalog.of().active():
            assert load_hardware("h100-80gb").price_usd_per_hour == shipped
        assert load_hardware("h100-80gb").price_usd_per_hour == 1.0
        other = threading.Thread(target=lambda: seen.append(load_hardware("h100-80gb").price_usd_per_hour))
        other.start()
        other.join()
    assert seen == [shipped] and load_hardware("h100-80gb").price_usd_per_hour == shipped
    pinned = mine.with_pins([("hardware_specs", "h100-80gb", {**load_hardware("h100-80gb").model_dump(mode="json"),
                                                                 "price_usd_per_hour": 2.0}, "a plan")])
    with pinned.active():  # (a plan's copy in place of the folder's entry)
        assert load_hardware("h100-80gb").price_usd_per_hour == 2.0


def test_a_catalogs_pins_add_up_and_are_listed_as_entries():
    """A second plan's specs are added to the first's (a name both carry takes the later copy), and
    a carried entry is listed with the folders' (suggestions, the catalog of machines)."""
    from splitplan.specs.catalog import Catalog
    spec = load_hardware("h100-80gb").model_dump(mode="json")
    first = Catalog().with_pins([("hardware_specs", "gpu-a", {**spec, "name": "gpu-a"}, "plan 1"),
                                 ("hardware_specs", "gpu-c", {**spec, "name": "gpu-c"}, "plan 1")])
    both = first.with_pins([("hardware_specs", "gpu-b", {**spec, "name": "gpu-b"}, "plan 2"),
                            ("hardware_specs", "gpu-a", {**spec, "name": "gpu-a", "price_usd_per_hour": 1.0}, "plan 2")])
    assert both.pinned("hardware_specs", "gpu-b")[1] == "plan 2" and both.pinned("hardware_specs", "gpu-c")[1] == "plan 1"
    assert both.pinned("hardware_specs", "gpu-a") == ({**spec, "name": "gpu-a", "price_usd_per_hour": 1.0}, "plan 2")
    assert {"gpu-a", "gpu-b", "h100-80gb"} <= set(both.names("hardware_specs"))
    with both.active():
        assert {"gpu-a", "gpu-b"} <= {h.name for h in hardware_catalog()}
