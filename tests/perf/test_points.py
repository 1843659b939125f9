"""`splitplan perf`'s rows and instance facts, and the layout `instance` picks when none is given."""

import pytest

from splitplan.perf.points import instance, instance_facts, perf_points
from splitplan.perf.roofline import Instance
from splitplan.specs.layout import Layout

PARTS = ("compute", "memory", "network", "overhead")


def test_perf_rows_are_the_pass_in_milliseconds_part_by_part():
    inst = instance("llama2-70b", "h100-80gb", 8, "vllm")
    prefill, decode, too_big = perf_points(inst, [(2, 1000)], [(8, 1000), (10_000, 4000)])
    passes = (inst.explain(prompt_tokens=[1000, 1000]), inst.explain(decode_batch=8, decode_context_tokens=1000))
    for row, lat in zip((prefill, decode), passes, strict=True):
        parts = {part: row[f"{part}_ms"] for part in PARTS}
        for part in PARTS:
            assert parts[part] == pytest.approx(getattr(lat, f"{part}_s") * 1e3)
        assert row["latency_ms"] == pytest.approx(sum(parts.values()))
        assert row["bound"] == max(parts, key=parts.__getitem__)
    assert decode["latency_ms"] == pytest.approx(inst.decode_step_time_s(8, 1000) * 1e3)
    assert prefill["overhead_ms"] > 0 and decode["overhead_ms"] > 0  # (a step's fixed cost is part of the sum)
    assert prefill["kv_fits"] and decode["kv_fits"] and not too_big["kv_fits"]  # 40 M tokens > 1.3 M


def test_instance_prefers_the_fewest_gpus_and_tp_alone_among_equals():
    # Llama 4 Maverick on a B200 machine fits TP 8 and DP 8 EP 8, both 8 GPUs: TP alone is picked
    inst = instance("llama4-maverick", "b200-180gb")
    assert inst.layout == Layout(8)
    assert Instance(inst.model, inst.hardware, inst.engine, Layout(1, 8, 8)).fit.fits
    assert instance("llama2-70b", "h100-80gb").layout == Layout(2)  # the fewest GPUs that hold it


def test_instance_facts_name_a_layout_only_beyond_tp_alone():
    plain = instance_facts(instance("llama2-70b", "h100-80gb", 8, "vllm"))
    assert "layout" not in plain and plain["instances_per_machine"] == 1
    assert instance_facts(instance("llama2-70b", "h100-80gb", 2, "vllm"))["instances_per_machine"] == 4
    wide = instance_facts(instance("deepseek-v3", "h200-141gb", None, "vllm"))
    assert (wide["layout"], wide["gpus_per_instance"], wide["instances_per_machine"]) == ("dp16ep16", 16, 0.5)
