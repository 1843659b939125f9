"""What a plan's machine counts come to: its pools (instances, spares, idle machines), cost per
token and energy per token, and the `Plan` they make."""

from __future__ import annotations

import math
from dataclasses import replace

from splitplan.search.evaluation import Evaluation, attainments, evaluate, percentiles_ms
from splitplan.search.types import SHARED, AnyKey, AnyOption, Combo, ComboKey, Option, OptionKey, Plan, Problem, SizedPool, bought
from splitplan.sim.metrics import energy_per_million_tokens, gpu_energy_j
from splitplan.specs.roles import SPLIT, Role
from splitplan.workload.trace import Trace


def usd_per_million_tokens(cost_usd_per_hour: float, trace: Trace, load_factor: float = 1.0) -> dict:
    """What these machines cost per million tokens of the trace's load, an hour's cost over an
    hour of its tokens: `cost_usd_per_million_tokens` (prompt and output) and
    `cost_usd_per_million_output_tokens`; None for a trace without a span. `load_factor`: the
    trace's load over the load it stands for (a trace compressed for headroom stands for a
    load that many times lighter, with as many times fewer tokens an hour)."""
    if trace.span_s <= 0:
        return {"cost_usd_per_million_tokens": None, "cost_usd_per_million_output_tokens": None}
    usd = cost_usd_per_hour * trace.span_s * load_factor / 3600 * 1e6
    output = float(trace.output_tokens.sum())
    return {"cost_usd_per_million_tokens": usd / (output + float(trace.prompt_tokens.sum())),
            "cost_usd_per_million_output_tokens": usd / max(output, 1.0)}


def energy_per_million(problem: Problem, counts: dict[AnyKey, int], options: dict[AnyKey, AnyOption], values: Evaluation,
                       idle_instances: list[tuple]) -> dict:
    """The GPU energy per million tokens of the load the trace stands for (sim.metrics' power
    model over the predicted busy time of each pool of `counts`, whose evaluation `values` is,
    its spare instances idle). With headroom (`problem.load_factor` > 1) the machines are evaluated
    again on the trace at the load it stands for (arrivals that many times further apart): the
    lighter batches of that load take longer per token than the compressed trace's. None where no
    busy time was predicted."""
    if problem.load_factor != 1:
        t = problem.trace
        problem = replace(problem, trace=replace(t, arrival_s=t.arrival_s * problem.load_factor), load_factor=1.0)
        values = evaluate(problem, counts, options)
    if not values.phases:
        return {}
    joules = sum(gpu_energy_j(hw, gpus, n * values.span_s, prefill_s, decode_s)
                 for hw, gpus, n, prefill_s, decode_s in values.phases)
    joules += sum(gpu_energy_j(hw, gpus, n * values.span_s, 0.0, 0.0) for hw, gpus, n in idle_instances)
    t = problem.trace
    return energy_per_million_tokens(joules / 3.6e6, float(t.prompt_tokens.sum()), float(t.output_tokens.sum()))


def _held(option: AnyOption, machines: int) -> dict[Role, int]:
    """Instances per role on `machines` machines of an option (both parts of shared machines)."""
    if isinstance(option, Combo):
        return {Role.PROMPT: machines * option.prompt_instances, Role.TOKEN: machines * option.token_instances}
    return {option.role: option.inst.instances_on(machines)}


def _needed(option: AnyOption, machines: int) -> dict[Role, int]:
    """Instances per role the load needs of a pool of `machines` machines: those held, less the
    ones a whole-machine rounding added to an option's size alone."""
    held = _held(option, machines)
    if isinstance(option, Option) and option.instances and machines == option.machines_alone:
        return {option.role: min(held[option.role], option.instances)}
    return held


def with_spares(counts: dict[AnyKey, int], options: dict[AnyKey, AnyOption], spare: int) -> dict[AnyKey, int]:
    """Machine counts that keep `spare` instances in each pool beyond what the load needs (a
    part of shared machines: each role's part)."""
    if not spare:
        return counts
    out = {}
    for k, c in counts.items():
        option, needed = options[k], _needed(options[k], c)
        if isinstance(option, Combo):
            out[k] = max(c, *(math.ceil((needed[role] + spare) / option.part(role)[1]) for role in SPLIT))
        else:
            out[k] = max(c, option.inst.machines_for(needed[option.role] + spare))
    return out


def sized_pools(counts: dict[AnyKey, int], options: dict[AnyKey, AnyOption], values: Evaluation,
           sized: dict[AnyKey, int] | None = None) -> dict[Role, tuple[SizedPool, ...]]:
    """The plan's pools per role, each with its instances, GPUs and predicted utilization; a group
    of shared machines is a part in each role's pools, numbered alike. `sized`: the counts the
    values are of, where `counts` keep spares beside them (the utilization of all instances,
    the spare ones counted)."""
    sized = sized or counts
    hits, busy = values.prefix_hit_rate, values.utilization

    def figures(k, role, key):
        held, needed = _held(options[k], counts[k])[role], _needed(options[k], sized[k])[role]
        u, hit = busy.get(key), hits.get(key)
        return (None if u is None else float(u * _held(options[k], sized[k])[role] / held)), \
            (None if hit is None else float(hit)), held - needed

    out = {role: [SizedPool.of(k.hardware, options[k].inst.hardware.gpus_per_machine, k.layout, c, *figures(k, role, k))
                  for k, c in sorted(counts.items()) if isinstance(k, OptionKey) and k.role == role] for role in Role}
    for number, (k, c) in enumerate(sorted((k, c) for k, c in counts.items() if isinstance(k, ComboKey))):
        for role, layout, per_machine in ((Role.PROMPT, k.prompt_layout, k.prompt_instances),
                                          (Role.TOKEN, k.token_layout, k.token_instances)):
            out[role].append(SizedPool.part(k.hardware, layout, c, c * per_machine, number, *figures(k, role, (k, role))))
    return {role: tuple(pools) for role, pools in out.items()}


def _idle(counts: dict[AnyKey, int], sized: dict[AnyKey, int], options: dict[AnyKey, AnyOption]) -> list[tuple]:
    """Instances the spares add, as (machine, GPUs per instance, instances): idle in the energy model."""
    out = []
    for k, c in counts.items():
        option = options[k]
        for role, n in _held(option, c).items():
            inst = option.part(role)[0].inst if isinstance(option, Combo) else option.inst
            if n > (held := _held(option, sized[k])[role]):
                out.append((inst.hardware, inst.layout.gpus, n - held))
    return out


def make_plan(problem: Problem, counts: dict[AnyKey, int], options: dict[AnyKey, AnyOption], repairs: int,
              values: Evaluation, lines) -> Plan:
    """The plan of these machine counts (sized on the trace: `values`, the SLO `lines`), with
    `problem.spare_instances` more instances per pool: its cost and power count the spares, its
    predicted latencies and SLO are with the spares out of service."""
    sized, counts = counts, with_spares(counts, options, problem.spare_instances)
    cost = sum(options[k].price_usd_per_hour * c for k, c in counts.items())
    power = sum(options[k].power_kw * c for k, c in counts.items())
    predicted = percentiles_ms(values)
    bindings = []
    for role in (Role.PROMPT, Role.TOKEN, Role.MIXED):
        used: list[tuple[Option, int | None]] = [(o, c) for k, c in sized.items()
                                                 if isinstance(o := options[k], Option) and o.role == role]
        used += [(o.part(role)[0], None) for k in sized if isinstance(o := options[k], Combo) and role in SPLIT]
        if used:
            bindings.append(f"{role}: {', '.join(sorted({_binding_text(o, c) for o, c in used}))}")
    if repairs:
        bindings.append(f"{repairs} machine(s) added on whole-trace evaluation")
    if counts != sized:
        bindings.append(f"spares: {sum(counts.values()) - sum(sized.values())} machine(s) added for "
                        f"{problem.spare_instances} spare instance(s) per pool")
    bindings += _tight_budgets(problem, counts, options, cost, power)
    pools = sized_pools(counts, options, values, sized)
    return Plan(pools[Role.PROMPT], pools[Role.TOKEN], pools[Role.MIXED], cost, power, predicted,
                tuple(lines), "; ".join(bindings), repairs,
                **usd_per_million_tokens(cost, problem.trace, problem.load_factor),
                **energy_per_million(problem, sized, options, values, _idle(counts, sized, options)),
                attainment_pct=attainments(problem, values))


def _binding_text(option: Option, machines: int | None) -> str:
    """What decided a pool's size: its binding line, or, where the machines hold more instances
    than the option needs alone, the rounding (and the line that binds at the count needed).
    `machines` None: the pool's part of shared machines (its line)."""
    if machines is None:
        return option.binding
    held = option.inst.instances_on(machines)
    if option.instances and machines == option.machines_alone and held > option.instances:
        after = "" if option.binding.startswith("minimum size") else f"; next to bind: {option.binding}"
        return f"rounded up to whole machines ({option.instances} of {held} instances needed{after})"
    return option.binding


def plan_counts(plan: Plan) -> dict[AnyKey, int]:
    """The plan's machine counts keyed as options are (shared machines by their combo key)."""
    counts: dict[AnyKey, int] = {OptionKey(role, p.hardware, p.layout): p.machines for role, p in plan.by_role()
                                 if p.shared is None}
    for group in (g for g in bought(plan.pools) if g.shared is not None):
        machines = group.machines
        (p,), (t,) = ([x for x in pools if x.shared == group.shared] for pools in (plan.prompt_pools, plan.token_pools))
        counts[ComboKey(SHARED, p.hardware, p.layout, p.instances // machines, t.layout, t.instances // machines)] = machines
    return counts


def _tight_budgets(problem: Problem, counts: dict[AnyKey, int], options: dict[AnyKey, AnyOption], cost: float,
                   power: float) -> list[str]:
    """Budget and availability limits the plan reaches: they, not the SLO, shape it."""
    tight = []
    if problem.max_cost_per_hour is not None and cost >= problem.max_cost_per_hour * (1 - 1e-6) - 1e-9:
        tight.append(f"budget: cost at --max-cost-per-hour {problem.max_cost_per_hour:g}")
    if problem.max_power_kw is not None and power >= problem.max_power_kw * (1 - 1e-6) - 1e-9:
        tight.append(f"budget: power at --max-power-kw {problem.max_power_kw:g}")
    for cap in problem.max_machines:
        if sum(c * cap.share(options[k].inst.hardware) for k, c in counts.items()) >= cap.machines - 1e-9:
            tight.append(f"availability: all {cap.machines} {cap.hardware} machines used")
    return tight
