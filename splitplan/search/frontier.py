"""Cost against power: the plans no other plan beats on both."""

from __future__ import annotations

from dataclasses import replace

from splitplan.base.errors import InfeasibleError
from splitplan.search.accounting import make_plan
from splitplan.search.repair import repair
from splitplan.search.solve import solve_counts


def nondominated(plans) -> list:
    """Plans not beaten on both cost and power by another plan, cheapest first."""
    ordered = sorted(plans, key=lambda p: (p.cost_usd_per_hour, p.power_kw))
    front, best_power = [], float("inf")
    for p in ordered:
        if p.power_kw < best_power - 1e-9:
            front.append(p)
            best_power = p.power_kw
    return front


# How far below a plan's power the next cap lies: 1 W, far above the solver's feasibility tolerance
# (a cap 1e-6 kW below a reachable power left HiGHS at that tolerance's edge: "Solve error").
CAP_STEP_KW = 1e-3


def cost_power_frontier(problem, options, seeds: list) -> tuple:
    """Cost against power: the epsilon-constraint method on the ILP (cheapest plan
    under a power cap, the cap lowered below each plan found until none is
    feasible), every plan verified and repaired on the whole trace; then the
    plans no other beats on both. `seeds` (plans already found, the co-located
    one among them) join the set."""
    by_key = {o.key: o for o in options}
    plans: list = list(seeds)
    memo: dict = {}
    cost_problem = replace(problem, objective="cost")
    cap = None
    for _ in range(50):
        try:
            counts = solve_counts(replace(cost_problem, max_power_kw=cap) if cap is not None else cost_problem, options)
        except InfeasibleError:
            break
        try:
            counts, values, lines, repairs = repair(cost_problem, counts, by_key, memo=memo)
        except InfeasibleError:  # no repair verifies this mix: look below its power all the same
            next_cap = sum(by_key[k].power_kw * c for k, c in counts.items()) - CAP_STEP_KW
        else:
            found = make_plan(cost_problem, counts, by_key, repairs, values, lines)
            plans.append(found)
            next_cap = found.power_kw - CAP_STEP_KW
        if problem.max_power_kw is not None:
            next_cap = min(next_cap, problem.max_power_kw)
        if cap is not None and next_cap >= cap:
            break
        cap = next_cap
    unique = {(p.prompt_pools, p.token_pools, p.mixed_pools): p for p in plans}
    return tuple(nondominated(list(unique.values())))
