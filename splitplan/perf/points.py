"""Instances from names, and single-pass latencies with what bound them (`splitplan perf`)."""

from __future__ import annotations

from dataclasses import asdict

from splitplan.base.defaults import DEFAULT_ENGINE
from splitplan.base.errors import InfeasibleError, SpecError
from splitplan.perf.roofline import Instance
from splitplan.specs.engine import EngineProfile, load_engine
from splitplan.specs.hardware import HardwareSpec, load_hardware
from splitplan.specs.layout import Layout
from splitplan.specs.model import ModelSpec, load_model


def require_tp(hw: HardwareSpec, tp: int) -> None:
    """--tp must divide the machine's GPUs: bad input (exit 2) naming the degrees to choose."""
    if tp < 1 or tp not in hw.tp_degrees():
        raise SpecError(f"--tp {tp}: must divide the {hw.gpus_per_machine} GPUs of {hw.name}; choose one of "
                        f"{', '.join(map(str, hw.tp_degrees()))}")


def instance(model: str | ModelSpec, hardware: str | HardwareSpec, layout: int | Layout | None = None,
             engine: str | EngineProfile = DEFAULT_ENGINE) -> Instance:
    """An instance that fits: in `layout` (a whole layout, or a TP degree: TP alone), or in the
    candidate layout of fewest GPUs that fits (TP alone first)."""
    m = load_model(model) if isinstance(model, str) else model
    hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
    eng = load_engine(engine) if isinstance(engine, str) else engine
    if layout is not None:
        layout = layout if isinstance(layout, Layout) else Layout(layout)
        if layout == Layout(layout.tp):  # TP alone: a TP degree of the machine
            require_tp(hw, layout.tp)
        inst = Instance(m, hw, eng, layout)
        if not inst.fit.fits:
            raise InfeasibleError(f"{m.name} does not fit {hw.name} at {inst.layout}: {inst.fit.reason}")
        return inst
    reasons = []
    for layout in sorted(candidate_layouts(m, hw, eng), key=lambda lay: (lay.gpus, lay != Layout(lay.tp), lay)):
        inst = Instance(m, hw, eng, layout)
        if inst.fit.fits:
            return inst
        reasons.append(inst.fit.reason)
    raise InfeasibleError(f"{m.name} does not fit {hw.name} in any layout: {reasons[-1]}")


# Wide expert parallelism: instances of 8 to 64 GPUs, attention data-parallel over all of them.
WIDE_EP_GPUS = (8, 16, 32, 64)
PIPELINE_STAGES = (2, 4)


def candidate_layouts(model, hw, engine, tp: int | None = None) -> list[Layout]:
    """The layouts the search sizes on one machine type: TP alone within a machine (`tp` only,
    when given); for MoE models, wide EP over G GPUs (one machine or several: WIDE_EP_GPUS)
    with data-parallel attention on every GPU (DP G, EP G) or over TP groups of a machine's
    widest TP (TP 8, DP G/8, EP G); and, when the model fits no single machine, that TP times
    PIPELINE_STAGES stages. Layouts the model does not fit are kept: the sizing says why."""
    if tp:
        return [Layout(tp)] if tp in hw.tp_degrees() else []
    out = [Layout(t) for t in hw.tp_degrees()]
    widest = max((t for t in hw.tp_degrees() if t <= 8 and model.num_attention_heads % t == 0), default=1)
    if model.is_moe:
        out += _wide_ep_layouts(model, hw.gpus_per_machine, widest)
    if not any(Instance(model, hw, engine, layout).fit.fits for layout in out if layout.gpus <= hw.gpus_per_machine):
        out += [Layout(widest, pp=p) for p in PIPELINE_STAGES]
    return out


def _wide_ep_layouts(model, gpus_per_machine: int, widest: int) -> list[Layout]:
    """A MoE model's wide-EP layouts over WIDE_EP_GPUS that tile machines and split its experts:
    attention on every GPU (decode's), then on TP groups of `widest` (prefill's: a long prompt on TP GPUs)."""
    wide = [g for g in WIDE_EP_GPUS if (g % gpus_per_machine == 0 or gpus_per_machine % g == 0) and model.num_local_experts % g == 0]
    return [Layout(1, g, g) for g in wide] + [Layout(widest, g // widest, g) for g in wide if g > widest]


def reference_instance(model, hardware: str, tp: int, engine, db=None, interpolation: str = "splitplan"):
    """An SLO reference instance: analytic, or measured where the perf-db `db` has its
    (model, machine, TP) group."""
    inst = instance(model, hardware, tp, engine)
    measured = db.instance(inst, interpolation) if db is not None else None
    return measured if measured is not None and measured.rows is not None else inst


def perf_points(inst: Instance, prefill: list[tuple[int, int]], decode: list[tuple[int, int]]) -> list[dict]:
    """Latency of each prefill batch (B prompts of T tokens) and decode step
    (B requests with C tokens of context), with what bound it."""
    out = []
    cap = inst.fit.kv_capacity_tokens
    sources = inst.timing_sources
    for batch, tokens in prefill:
        lat = inst.explain(prompt_tokens=[tokens] * batch)
        out.append({"phase": "prefill", "batch": batch, "prompt_tokens": tokens, **_latency_fields(lat),
                    "kv_fits": batch * tokens <= cap, "timed_from": sources})
    for batch, context in decode:
        lat = inst.explain(decode_batch=batch, decode_context_tokens=context)
        out.append({"phase": "decode", "batch": batch, "context_tokens": context, **_latency_fields(lat),
                    "kv_fits": batch * (context + 1) <= cap, "timed_from": sources})
    return out



def _latency_fields(lat) -> dict:
    d = asdict(lat)
    return {
        "latency_ms": d["time_s"] * 1e3,
        "bound": d["bound"],
        "compute_ms": d["compute_s"] * 1e3,
        "memory_ms": d["memory_s"] * 1e3,
        "network_ms": d["network_s"] * 1e3,
        "overhead_ms": d["overhead_s"] * 1e3,
        "flops_per_gpu": d["flops_per_gpu"],
        "bytes_per_gpu": d["bytes_per_gpu"],
    }


def instance_facts(inst: Instance) -> dict:
    """What a capacity planner checks first: memory, KV room, machine share."""
    return {
        "model": inst.model.name,
        "hardware": inst.hardware.name,
        "engine": inst.engine.name,
        "tp": inst.tp,
        **({"layout": inst.layout.spec, "gpus_per_instance": inst.layout.gpus} if inst.layout != Layout(inst.tp) else {}),
        "instances_per_machine": inst.unit_instances if inst.unit_machines == 1 else inst.unit_instances / inst.unit_machines,
        "weights_gb_per_gpu": inst.fit.weights_bytes_per_gpu / 1e9,
        "kv_bytes_per_token": inst.kv_bytes_per_token,
        "kv_capacity_tokens": inst.fit.kv_capacity_tokens,
    }
