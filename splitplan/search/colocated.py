"""The best co-located plan: co-located options ranked by their estimate, the best few sized by
the simulator's replay, the cheapest that meets every line within the budgets."""

from __future__ import annotations

from dataclasses import replace

from splitplan.base.errors import InfeasibleError, listed, with_details
from splitplan.search.accounting import make_plan
from splitplan.search.evaluation import check, evaluate
from splitplan.search.sizing import simulated_option
from splitplan.search.types import AnyKey, Option, Plan, Problem
from splitplan.specs.roles import Role


def closest_fit(option: Option) -> tuple:
    """Options in the order an error names them, the closest first: those that fit, then memory
    short of the weights before a layout the model cannot take, the most GPU memory per instance first."""
    inst = option.inst
    return (not inst.fit.fits, "weights need" not in (option.skipped or ""),
            -inst.hardware.memory_bytes_per_gpu * inst.layout.gpus, option.skipped or "")


def _sized_as(option: Option) -> tuple:
    """What an option's size depends on: its role and instance, whatever shape of its machine
    type holds the instance."""
    return option.role, option.inst.hardware.family, option.inst.layout


def as_simulated(simulated: dict, option: Option) -> Option:
    """`option` as `colocated_plan` simulated it (on any shape of its machine type), else itself."""
    found = simulated.get(_sized_as(option))
    return option if found is None else replace(found, inst=option.inst)


def _within_budget(problem: Problem, o: Option) -> bool:
    """A co-located option's plan (its machines alone) within the cost, power and machine budgets."""
    m = o.machines_alone
    return ((problem.max_cost_per_hour is None or o.price_usd_per_hour * m <= problem.max_cost_per_hour + 1e-9)
            and (problem.max_power_kw is None or o.power_kw * m <= problem.max_power_kw + 1e-9)
            and all(m * cap.share(o.inst.hardware) <= cap.machines + 1e-9 for cap in problem.max_machines))


def _colocated_rank(problem: Problem, o: Option) -> tuple:
    """As plans rank: the objective, the other one, fewer machines, a fixed order."""
    first, second = (o.price_usd_per_hour, o.power_kw) if problem.objective == "cost" else (o.power_kw, o.price_usd_per_hour)
    return first * o.machines_alone, second * o.machines_alone, o.machines_alone, o.key


def _best_colocated(problem: Problem, mixed: list[Option], simulated: dict) -> tuple:
    """(the best co-located option within the budgets or None, the replay of it: (count, values)),
    simulating options in the order of their estimate until the next cannot beat the best."""
    def rank(o: Option) -> tuple:
        return _colocated_rank(problem, o)

    def better(found: Option) -> bool:
        return bool(found.instances) and _within_budget(problem, found) and (best is None or rank(found) < rank(best))

    ranked = sorted((o for o in mixed if o.instances and _within_budget(problem, o)), key=rank)
    best: Option | None = None
    best_replay: tuple = (None, None)
    for found in (as_simulated(simulated, o) for o in ranked if _sized_as(o) in simulated):  # (simulated before: free)
        if better(found):
            best, best_replay = found, simulated.get(("replay", *_sized_as(found)), (None, None))
    for option in ranked:
        if best is not None and rank(option)[:2] >= rank(best)[:2]:
            break
        replays: dict = {}
        if _sized_as(option) not in simulated:
            simulated[_sized_as(option)] = simulated_option(problem, option, replays)
        found = as_simulated(simulated, option)
        if better(found):
            best, best_replay = found, replays.get(found.key, (None, None))  # (only the best's replay is kept)
    if best is not None and best_replay[0] is not None:
        simulated[("replay", *_sized_as(best))] = best_replay  # (for a later call, on any shape: one per call at most)
    return best, best_replay


def colocated_plan(problem: Problem, options: list[Option], simulated: dict | None = None) -> Plan:
    """The best homogeneous co-located plan (Splitwise's baselines) within the budgets.

    Options are ranked by their estimated size and simulated (`simulated_option`) in that
    order until the next one's estimate costs no less than the best simulated plan (the
    estimate is optimistic, so a later option rarely wins); options simulated by an earlier call
    count first. `simulated` (a dict by role, machine type and layout, reused across calls) keeps
    the options simulated, and the replay of each call's best, and gives them back."""
    simulated = {} if simulated is None else simulated
    mixed = [o for o in options if o.role == Role.MIXED]
    best, best_replay = _best_colocated(problem, mixed, simulated)
    if best is None:
        shown = [as_simulated(simulated, o) for o in mixed]
        short, whole = listed([f"{o.inst.hardware.name} {o.inst.layout}: {o.skipped or 'over budget'}"
                               for o in sorted(shown, key=closest_fit)])
        raise with_details(InfeasibleError(f"no co-located plan meets the SLO within the budget: {short}"), whole)
    counts: dict[AnyKey, int] = {best.key: best.machines_alone}
    held = best.inst.instances_on(best.machines_alone)
    count, values = best_replay
    if count != held:  # (rounded up to whole machines, or simulated by an earlier call)
        values = evaluate(problem, counts, {best.key: best})
    else:  # (the replay may be of another shape of its machine: the same instances, its pool's figures keyed anew)
        (busy,), (hits,) = values.utilization.values(), values.prefix_hit_rate.values()  # (one pool)
        values = replace(values, utilization={best.key: busy}, prefix_hit_rate={best.key: hits})
    return make_plan(problem, counts, {best.key: best}, 0, values, check(problem, values))
