"""Library facade: what the CLI calls, usable from capacity-planning scripts.

Each function takes names or paths (or loaded specs), makes one pass through the
pure layers and returns plain data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from splitplan.errors import InfeasibleError, SpecError
from splitplan.perf.roofline import Instance
from splitplan.specs.engine import EngineProfile, load_engine
from splitplan.specs.hardware import HardwareSpec, load_hardware
from splitplan.specs.model import ModelSpec, load_model

DEFAULT_ENGINE = "lean"


def instance(model: str | ModelSpec, hardware: str | HardwareSpec, tp: int | None = None,
             engine: str | EngineProfile = DEFAULT_ENGINE) -> Instance:
    """An instance that fits: at `tp`, or at the smallest TP degree that fits."""
    m = load_model(model) if isinstance(model, str) else model
    hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
    eng = load_engine(engine) if isinstance(engine, str) else engine
    if tp is not None:
        if tp < 1 or tp not in hw.tp_degrees():
            raise SpecError(f"--tp {tp}: must divide the {hw.gpus_per_machine} GPUs of {hw.name}; choose one of {hw.tp_degrees()}")
        inst = Instance(m, hw, eng, tp)
        if not inst.fit.fits:
            raise InfeasibleError(f"{m.name} does not fit {hw.name} at TP {tp}: {inst.fit.reason}")
        return inst
    reasons = []
    for t in hw.tp_degrees():
        inst = Instance(m, hw, eng, t)
        if inst.fit.fits:
            return inst
        reasons.append(inst.fit.reason)
    raise InfeasibleError(f"{m.name} does not fit {hw.name} at any TP degree: {reasons[-1]}")


def perf_points(inst: Instance, prefill: list[tuple[int, int]], decode: list[tuple[int, int]]) -> list[dict]:
    """Latency of each prefill batch (B prompts of T tokens) and decode step
    (B requests with C tokens of context), with what bound it."""
    out = []
    cap = inst.fit.kv_capacity_tokens
    for batch, tokens in prefill:
        lat = inst.explain(prompt_tokens=[tokens] * batch)
        out.append({"phase": "prefill", "batch": batch, "prompt_tokens": tokens, **_latency_fields(lat),
                    "kv_fits": batch * tokens <= cap})
    for batch, context in decode:
        lat = inst.explain(decode_batch=batch, decode_context_tokens=context)
        out.append({"phase": "decode", "batch": batch, "context_tokens": context, **_latency_fields(lat),
                    "kv_fits": batch * (context + 1) <= cap})
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
        "instances_per_machine": inst.instances_per_machine,
        "weights_gb_per_gpu": inst.fit.weights_bytes_per_gpu / 1e9,
        "kv_bytes_per_token": inst.kv_bytes_per_token,
        "kv_capacity_tokens": inst.fit.kv_capacity_tokens,
    }


# --- optimize -------------------------------------------------------------------------

@dataclass(frozen=True)
class OptimizeResult:
    plan: "Plan"
    alternatives: tuple
    options: tuple  # every evaluated Option, sized or skipped


def optimize(trace, model: str, slo: str, hardware: list[str] | None = None, prompt_hardware: list[str] | None = None,
             token_hardware: list[str] | None = None, tp: int | None = None, objective: str = "cost",
             engine: str = DEFAULT_ENGINE, search: str = "ilp", max_cost_per_hour: float | None = None,
             max_power_kw: float | None = None, max_machines: dict[str, int] | None = None,
             max_batch_tokens: int = 2048, alternatives: int = 5) -> OptimizeResult:
    """The cheapest (or lowest-power) split plan meeting every SLO line on `trace`."""
    from splitplan.capacity.pools import reference_latencies
    from splitplan.search.plan import Problem, make_plan, size_option, solve_counts
    from splitplan.specs.hardware import hardware_catalog
    from splitplan.specs.slo import load_slo

    m, eng, profile = load_model(model), load_engine(engine), load_slo(slo)
    if objective not in ("cost", "power"):
        raise SpecError(f"--objective {objective}: choose cost or power")
    names = hardware or [h.name for h in hardware_catalog()]
    machines = {n: load_hardware(n) for n in sorted(set(names) | set(prompt_hardware or []) | set(token_hardware or []))}
    for hw in (max_machines or {}):
        if hw not in machines:
            raise SpecError(f"--max-machines {hw}: not among the hardware considered ({', '.join(machines)})")
    reference = None
    if profile.reference is not None:
        ref_inst = instance(m, profile.reference.hardware, profile.reference.tp, eng)
        reference = reference_latencies(ref_inst, trace.prompt_tokens, trace.output_tokens)
    problem = Problem(trace, profile, reference, max_batch_tokens, objective, max_cost_per_hour, max_power_kw,
                      tuple(sorted((max_machines or {}).items())))
    options = []
    for role, allowed in (("prompt", prompt_hardware or names), ("token", token_hardware or names)):
        for name in sorted(set(allowed)):
            hw = machines[name]
            for t in ([tp] if tp else hw.tp_degrees()):
                if t not in hw.tp_degrees():
                    continue
                options.append(size_option(problem, role, Instance(m, hw, eng, t)))
    _raise_if_unreachable(problem, options)
    by_key = {o.key: o for o in options}
    # Candidates: the ILP's (or grid's) plan, and the best homogeneous plan of every
    # (prompt, token) hardware pair; each is verified and repaired on the whole trace,
    # and the best verified one wins. The rest are the runner-ups.
    candidates = [solve_counts(problem, options, search)]
    usable = [o for o in options if o.instances]
    pairs = sorted(
        ((p, t) for p in usable if p.role == "prompt" for t in usable if t.role == "token"),
        key=lambda pt: (_objective(objective, pt[0]) * pt[0].machines_alone + _objective(objective, pt[1]) * pt[1].machines_alone, pt[0].key, pt[1].key),
    )
    seen_pairs = set()
    for p, t in pairs:
        pair = (p.inst.hardware.name, t.inst.hardware.name)
        if pair not in seen_pairs and len(seen_pairs) < alternatives + 1:
            seen_pairs.add(pair)
            candidates.append({p.key: p.machines_alone, t.key: t.machines_alone})
    plans, memo = [], {}
    for counts in candidates:
        try:
            plans.append(make_plan(problem, *_repaired(problem, counts, by_key, memo)))
        except InfeasibleError:
            if not plans:  # the optimizer's own plan must verify; a runner-up may be dropped
                raise
    key = (lambda p: (p.cost_usd_per_hour, p.power_kw)) if objective == "cost" else (lambda p: (p.power_kw, p.cost_usd_per_hour))
    plans.sort(key=lambda p: (*key(p), p.machines, repr(p.prompt_pools), repr(p.token_pools)))
    plan, alts = plans[0], []
    for other in plans[1:]:
        if other.prompt_pools + other.token_pools != plan.prompt_pools + plan.token_pools and other not in alts:
            alts.append(other)
    return OptimizeResult(plan, tuple(alts[:alternatives]), tuple(options))


def _repaired(problem, counts, by_key, memo):
    from splitplan.search.plan import repair
    counts, values, lines, repairs = repair(problem, counts, by_key, memo=memo)
    return counts, by_key, repairs, values, lines


def _objective(objective: str, option) -> float:
    return option.price_usd_per_hour if objective == "cost" else option.power_kw


def _raise_if_unreachable(problem, options) -> None:
    """Exit 3 naming the line no hardware can meet, the best value reachable and where."""
    import numpy as np

    from splitplan.capacity.pools import achieved, meets
    t = problem.trace
    for role, metric in (("prompt", "ttft"), ("token", "tbt")):
        fitting = [o for o in options if o.role == role and o.inst.fit.fits]
        if not fitting:
            reasons = "; ".join(sorted({o.skipped for o in options if o.role == role}))
            raise InfeasibleError(f"the model fits no {role} hardware considered: {reasons}")
        if any(o.instances for o in fitting):
            continue
        for line in (l for l in problem.slo.lines() if l.metric == metric):
            best = None
            for o in fitting:
                alone = o.inst.prefill_time_s(t.prompt_tokens) if metric == "ttft" else o.inst.decode_step_time_s(1, t.prompt_tokens + t.output_tokens // 2)
                value = achieved(line, np.asarray(alone), problem.reference)
                if best is None or value < best[0]:
                    best = (value, o)
            if best and not meets(line, best[0]):
                unit = " ms" if line.max_ms is not None else "x"
                raise InfeasibleError(
                    f"{line.label} {line.target} cannot be met: the best reachable is {best[0]:.3g}{unit} "
                    f"on {best[1].inst.hardware.name} at TP {best[1].inst.tp}, running requests alone")
        raise InfeasibleError(f"no {role} option meets the SLO: " + "; ".join(f"{o.inst.hardware.name} TP{o.inst.tp}: {o.skipped}" for o in fitting))
