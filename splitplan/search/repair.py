"""A plan repaired until every line holds on the whole trace (one machine at a time, to the role
the failing line depends on), its prediction, and its cliff: each pool with one instance fewer."""

from __future__ import annotations

from dataclasses import replace

from splitplan.base.errors import InfeasibleError
from splitplan.perf.slo import achieved
from splitplan.search.accounting import energy_per_million, plan_counts, sized_pools, usd_per_million_tokens
from splitplan.search.evaluation import attainments, check, evaluate, percentiles_ms, pool_parts
from splitplan.search.types import AnyKey, AnyOption, OptionKey, Plan, Problem
from splitplan.specs.roles import SPLIT, Role
from splitplan.specs.slo import SloLine


def cliff(problem: Problem, plan: Plan, options: dict[AnyKey, AnyOption], memo: dict | None = None) -> tuple[dict, ...]:
    """How close the plan is to failing: per pool, every SLO line predicted with one instance fewer
    in service than the plan's prediction has (its spares out too), the other pools as planned;
    `fails`: the first line it then misses (None: it still holds)."""
    counts, memo = plan_counts(plan), {} if memo is None else memo
    if plan.mixed_pools:
        keys = [(k, options[k], options[k].inst.instances_on(c)) for k, c in counts.items()]
    else:
        keys = [(k, o, n) for role in SPLIT for k, o, n, _ in pool_parts(counts, options, role)]
    out: list[dict] = []
    for key, option, held in keys:
        in_service = held - problem.spare_instances
        row = {"role": str(option.role), "hardware": option.inst.hardware.name, "layout": option.inst.layout.spec,
               "shared": not isinstance(key, OptionKey), "instances": in_service, "fewer": in_service - 1}
        if in_service <= 1:
            out.append({**row, "fails": "no instance left", "slo": []})
            continue
        values = evaluate(problem, counts, options, memo, (key, problem.spare_instances + 1))
        lines = check(problem, values)
        row["slo"] = [{"line": line.label, "achieved": v, "attainment_pct": a, "met": ok}
                      for (line, v, ok), a in zip(lines, attainments(problem, values), strict=True)]
        failed = [line.label for line, _, ok in lines if not ok] + (["KV memory"] if values.kv_peak_fraction > 1 else [])
        out.append({**row, "fails": failed[0] if failed else None})
    return tuple(out)


def repair(problem: Problem, counts: dict[AnyKey, int], options: dict[AnyKey, AnyOption], limit: int = 100, memo: dict | None = None):
    """Grow the plan until every line holds on the whole-trace evaluation.

    Greedy: for the first failing line, try one more machine of each option of the
    role(s) that line depends on (TTFT: prompt; TBT and KV: token; E2E: both) that
    is in the plan or among the most capacity per dollar, keep the one that
    improves the line most per dollar (per kW for the power objective), and
    evaluate again."""
    counts = dict(counts)
    memo = {} if memo is None else memo

    def score(values):
        lines = check(problem, values)
        failed = [(line, value) for line, value, ok in lines if not ok]
        return lines, failed

    values = evaluate(problem, counts, options, memo)
    lines, failed = score(values)
    for step in range(limit + 1):
        kv_bad = values.kv_peak_fraction > 1
        if not failed and not kv_bad:
            return counts, values, lines, step
        line, value = failed[0] if failed else (None, values.kv_peak_fraction)
        best = best_move(problem, counts, options, line, value, memo)
        if best is None:
            break
        counts, values = best
        lines, failed = score(values)
    what = failed[0][0].label if failed else "KV memory"
    raise InfeasibleError(f"no plan found that meets {what}: adding machines of any option stopped improving it "
                          f"(best {failed[0][0].text(failed[0][1])}, target {failed[0][0].target})" if failed else
                          "no plan found that fits the decode KV cache")


def best_move(problem: Problem, counts: dict, options: dict, line: SloLine | None, value: float, memo: dict | None = None):
    """Repair's step: of one more unit (a machine, or the machines one instance spans) of each
    option the failing `line` depends on (TTFT: prompt; TBT and KV memory, `line` None: token;
    E2E: both), the one that improves it most per dollar (per kW for the power objective):
    (counts, values), or None when no move improves it."""
    weight = (lambda o: o.price_usd_per_hour) if problem.objective == "cost" else (lambda o: o.power_kw)
    roles = {"ttft": (Role.PROMPT,), "tbt": (Role.TOKEN,), "itl": (Role.TOKEN,), "tpot": (Role.TOKEN,),
             "e2e": SPLIT}[line.metric if line else "tbt"]
    best = None
    for option in _repair_moves(counts, options, roles, weight):
        unit = option.inst.unit_machines
        trial = {**counts, option.key: counts.get(option.key, 0) + unit}
        trial_values = evaluate(problem, trial, options, memo)
        new = trial_values.kv_peak_fraction if line is None else achieved(line, trial_values.of(line.metric), problem.reference)
        gain = (value - new) / (weight(option) * unit)
        if gain > 0 and (best is None or gain > best[0]):
            best = (gain, trial, trial_values)
    return None if best is None else best[1:]


def _repair_moves(counts: dict, options: dict, roles: tuple, weight, extra: int = 3) -> list[AnyOption]:
    """Options worth one more machine: those already in the plan, and per role the
    `extra` with the lowest weight (cost or power) per unit of capacity."""
    moves = {k: options[k] for k in counts if k.role in roles}
    for role in roles:
        ranked = sorted((o for o in options.values() if o.role == role and o.instances),
                        key=lambda o: (weight(o) * o.instances * o.inst.unit_machines / o.inst.unit_instances, o.key))
        moves.update((o.key, o) for o in ranked[:extra])
    return [moves[k] for k in sorted(moves)]


def predict(problem: Problem, plan: Plan, options: dict[AnyKey, AnyOption]) -> Plan:
    """The plan with the planner's whole-trace prediction of its own machines (after
    machines were added to it, e.g. by a simulation)."""
    counts = plan_counts(plan)
    values = evaluate(problem, counts, options)
    pools = sized_pools(counts, options, values)
    plan = replace(plan, prompt_pools=pools[Role.PROMPT], token_pools=pools[Role.TOKEN], mixed_pools=pools[Role.MIXED],
                   predicted=percentiles_ms(values), slo=tuple(check(problem, values)), attainment_pct=attainments(problem, values),
                   **usd_per_million_tokens(plan.cost_usd_per_hour, problem.trace, problem.load_factor),
                   **energy_per_million(problem, counts, options, values, []))
    return replace(plan, cliff=cliff(problem, plan, options))
