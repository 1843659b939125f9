"""Machine counts per option: the ILP (HiGHS or CBC through PuLP) and the exhaustive grid
over the same integer space, minimizing cost or power under the linear capacity model
(each option's n*(o) from its sizing alone) and the budgets."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pulp

from splitplan.base.errors import InfeasibleError, SolverError, SpecError
from splitplan.search.plan import SHARED, AnyKey, AnyOption, Problem
from splitplan.specs.roles import SPLIT, Role


def solve_counts(problem: Problem, options: list[AnyOption], method: str = "ilp") -> dict[AnyKey, int]:
    """Machine counts per option key minimizing the objective under the linear model."""
    usable = [o for o in options if o.instances and o.role in SPLIT]
    for role in SPLIT:
        if not any(o.role == role for o in usable):
            raise InfeasibleError(f"no {role} option can meet the SLO (see the skipped options)")
    usable += [o for o in options if o.role == SHARED]
    if method == "grid":
        return _grid(problem, usable, *_objectives(problem))
    if problem.solver not in SOLVERS:
        raise SpecError(f"--solver {problem.solver}: choose {' or '.join(SOLVERS)}")
    lp, x = ilp_model(problem, usable)
    status = _solve_highs(lp) if problem.solver == "highs" else _solve_cbc(lp)
    if status == "Infeasible":
        raise InfeasibleError(_budget_message(problem, usable))
    if status != "Optimal":
        raise SolverError(f"{problem.solver} returned status {status}")
    unit = {o.key: o.inst.unit_machines for o in usable}
    return {k: int(round(v.value() or 0)) * unit[k] for k, v in x.items() if round(v.value() or 0) > 0}


SOLVERS = ("highs", "cbc")
COVER_TOLERANCE = 1e-9  # a role's load counts as covered at 1 - this (float shares: 3 x 1/3 < 1)


def _solve_highs(lp: pulp.LpProblem) -> str:
    """The PuLP model solved by HiGHS, as SciPy ships it (scipy.optimize.milp): no separate
    binary or package, nothing printed on stdout (the highspy package prints a banner there, which
    would break JSON output), no solver threads left behind in a process that forks workers."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    variables = lp.variables()
    index = {v.name: k for k, v in enumerate(variables)}
    c = np.zeros(len(variables))
    for v, coef in lp.objective.items():
        c[index[v.name]] = coef
    rows, lower, upper = [], [], []
    for con in lp.constraints.values():
        row = np.zeros(len(variables))
        for v, coef in con.items():
            row[index[v.name]] = coef
        rhs = -con.constant
        rows.append(row)
        lower.append(rhs if con.sense >= 0 else -np.inf)
        upper.append(rhs if con.sense <= 0 else np.inf)
    bounds = Bounds([v.lowBound if v.lowBound is not None else -np.inf for v in variables],
                    [v.upBound if v.upBound is not None else np.inf for v in variables])
    result = milp(c, constraints=LinearConstraint(np.array(rows), lower, upper) if rows else (),
                  integrality=np.array([v.cat == pulp.LpInteger for v in variables], int), bounds=bounds)
    if result.status == 0:
        for v, value in zip(variables, result.x, strict=True):
            v.varValue = float(value)
        return "Optimal"
    return "Infeasible" if result.status == 2 else result.message


def _solve_cbc(lp: pulp.LpProblem) -> str:
    """The CBC binary PuLP 3 bundles (PuLP 4 does not: there `cbc` needs a CBC on the PATH)."""
    solver = pulp.PULP_CBC_CMD(msg=False)
    if not solver.available():
        raise SolverError("the cbc solver is not available here (install CBC); try --solver highs")
    return pulp.LpStatus[lp.solve(solver)]


def _objectives(problem: Problem):
    """Per option: the objective's unit per machine, and the other objective's (the tie-break)."""
    cost, power = (lambda o: o.price_usd_per_hour), (lambda o: o.power_kw)
    return (cost, power) if problem.objective == "cost" else (power, cost)


def ilp_model(problem: Problem, usable: list[AnyOption]) -> tuple[pulp.LpProblem, dict]:
    """The integer program: units x_o per option (a unit: one machine, or the machines one
    instance spans; a shared machine, holding both roles, is an option too), at most as many as
    the option needs alone; minimize the objective (the other one, scaled by 1e-6, breaks ties);
    each role's instances cover the load (sum of x_o * instances per unit / n*_o >= 1, a shared
    machine's part counting for its role); budgets."""
    primary, secondary = _objectives(problem)
    lp = pulp.LpProblem("splitplan", pulp.LpMinimize)
    x = {o.key: pulp.LpVariable(f"x{i}", lowBound=0, upBound=o.machines_alone // o.inst.unit_machines, cat="Integer")
         for i, o in enumerate(usable)}

    def machines(o):
        return o.inst.unit_machines * x[o.key]
    lp += pulp.lpSum((primary(o) + 1e-6 * secondary(o)) * machines(o) for o in usable)
    for role in SPLIT:  # (>= 1 within the grid's tolerance: shares such as 3 x 1/3 are written to 12 digits for CBC)
        lp += pulp.lpSum(x[o.key] * _cover(o, role) for o in usable if _cover(o, role)) >= 1 - COVER_TOLERANCE, f"cover_{role}"
    for name, terms, limit in _budgets(problem, usable, machines):
        lp += pulp.lpSum(terms) <= limit, name
    return lp, x


def _cover(option, role: str) -> float:
    """The share of `role`'s load one unit of `option` carries (its instances over n*), a shared
    machine's part for either role."""
    if option.role == SHARED:
        part, held = option.part(role)
        return held / part.instances
    return option.inst.unit_instances / option.instances if option.role == role else 0.0


def _budgets(problem: Problem, usable: list[AnyOption], var) -> list[tuple[str, list, float]]:
    """(name, terms summing to the budgeted quantity, limit) of each budget the problem sets."""
    out = []
    if problem.max_cost_per_hour is not None:
        out.append(("max_cost_per_hour", [o.price_usd_per_hour * var(o) for o in usable], problem.max_cost_per_hour))
    if problem.max_power_kw is not None:
        out.append(("max_power_kw", [o.power_kw * var(o) for o in usable], problem.max_power_kw))
    for cap in problem.max_machines:
        out.append((f"max_machines_{re.sub(r'[^0-9A-Za-z]', '_', cap.hardware)}",
                    [cap.share(o.inst.hardware) * var(o) for o in usable if cap.share(o.inst.hardware)], cap.machines))
    return out


def _budget_message(problem: Problem, usable: list[AnyOption]) -> str:
    cheapest = min(o.price_usd_per_hour * o.machines_alone for o in usable if o.role == Role.PROMPT) + \
        min(o.price_usd_per_hour * o.machines_alone for o in usable if o.role == Role.TOKEN)
    return (f"no plan meets the SLO within the budget (--max-cost-per-hour {problem.max_cost_per_hour}, "
            f"--max-power-kw {problem.max_power_kw}, --max-machines {({c.hardware: c.machines for c in problem.max_machines}) or '-'}); "
            f"the cheapest homogeneous plan needs about ${cheapest:,.1f}/h: raise the budget or loosen the SLO")


def _grid(problem: Problem, usable: list[AnyOption], primary, secondary) -> dict[AnyKey, int]:
    """Exhaustive enumeration of the same integer space as the ILP."""
    ranges = [range(0, o.machines_alone + 1, o.inst.unit_machines) for o in usable]  # machines, in whole units
    best, best_key = None, None
    for counts in itertools.product(*ranges):
        ok = all(sum(c // o.inst.unit_machines * _cover(o, r) for c, o in zip(counts, usable,
                                                                              strict=True)) >= 1 - COVER_TOLERANCE for r in SPLIT)
        if not ok:
            continue
        if not all(sum(terms) <= limit + 1e-9 for _, terms, limit in _budgets(problem, usable, lambda o,
                                                                              counts=counts: counts[usable.index(o)])):
            continue
        key = (round(sum(c * primary(o) for c, o in zip(counts, usable, strict=True)), 9), round(sum(c * secondary(o) for c,
                                                                                                     o in zip(counts, usable,
                                                                                                              strict=True)), 9))
        if best is None or key < best:
            best, best_key = key, counts
    if best_key is None:
        raise InfeasibleError(_budget_message(problem, usable))
    return {o.key: c for o, c in zip(usable, best_key, strict=True) if c > 0}
