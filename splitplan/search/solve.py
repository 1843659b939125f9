"""Machine counts per option: the ILP (its matrices to HiGHS through highspy; CBC through PuLP,
which also writes the LP file the tests pin) and the exhaustive grid
over the same integer space, minimizing cost or power under the linear capacity model
(each option's n*(o) from its sizing alone) and the budgets."""

from __future__ import annotations

import itertools
import os
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from splitplan.base.errors import InfeasibleError, SolverError, SpecError
from splitplan.search.types import SHARED, AnyKey, AnyOption, Problem
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
    program = integer_program(problem, usable)
    units = _solve_highs(program) if problem.solver == "highs" else _solve_cbc(problem, usable)
    if units is None:
        raise InfeasibleError(_budget_message(problem, usable))
    return {o.key: int(round(n)) * o.inst.unit_machines for o, n in zip(usable, units, strict=True) if round(n) > 0}


SOLVERS = ("highs", "cbc")
COVER_TOLERANCE = 1e-9  # a role's load counts as covered at 1 - this (float shares: 3 x 1/3 < 1)


@dataclass(frozen=True)
class IntegerProgram:
    """min objective . x subject to row_lower <= rows x <= row_upper, 0 <= x <= upper, x integer;
    x: units per option (a unit: one machine, the machines one instance spans, or a shared
    machine), in the order of the options given."""

    objective: np.ndarray
    rows: np.ndarray  # one per constraint
    row_lower: np.ndarray
    row_upper: np.ndarray
    row_names: tuple[str, ...]
    upper: np.ndarray


def integer_program(problem: Problem, usable: list[AnyOption]) -> IntegerProgram:
    """The integer program: units x_o per option, at most as many as the option needs alone;
    minimize the objective (the other one, scaled by 1e-6, breaks ties); each role's instances
    cover the load (sum of x_o * instances per unit / n*_o >= 1, a shared machine's part counting
    for its role); budgets."""
    primary, secondary = _objectives(problem)
    unit = np.array([o.inst.unit_machines for o in usable], float)
    objective = np.array([primary(o) + 1e-6 * secondary(o) for o in usable]) * unit
    rows = [np.array([_cover(o, role) for o in usable]) for role in SPLIT]
    # (>= 1 within the grid's tolerance: shares such as 3 x 1/3 are written to 12 digits for CBC)
    lower, upper, names = [1 - COVER_TOLERANCE] * len(SPLIT), [np.inf] * len(SPLIT), [f"cover_{role}" for role in SPLIT]
    for name, coefficients, limit in _budgets(problem, usable):
        rows.append(np.array(coefficients) * unit)
        lower.append(-np.inf)
        upper.append(limit)
        names.append(name)
    return IntegerProgram(objective, np.array(rows), np.array(lower), np.array(upper), tuple(names),
                          np.array([o.machines_alone // o.inst.unit_machines for o in usable], float))


def _solve_highs(program: IntegerProgram) -> np.ndarray | None:
    """Units per option from HiGHS through its own Python interface (highspy), None if
    infeasible: the model as scipy.optimize.milp passed it (which splitplan used before; highspy
    imports in about 10 ms where scipy.optimize takes 0.3-0.4 s, a quarter of a default
    `optimize`), nothing logged, solved to the exact optimum (HiGHS's default relative gap, 1e-4,
    could stop before the 1e-6 tie-break by the other objective decides)."""
    import highspy

    # HiGHS meets the columns in the order of their LP names (x0, x1, x10, x11, ..., x2: ilp_model's),
    # as when the program went through PuLP: among plans of equal objective, which one it returns
    # depends on that order, and splitplan's plans were set by it.
    order = np.array(sorted(range(len(program.objective)), key=str), int)
    rows = program.rows[:, order]
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = rows.shape[1], rows.shape[0]
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = program.objective[order], np.zeros(len(order)), program.upper[order]
    lp.row_lower_, lp.row_upper_ = program.row_lower, program.row_upper
    lp.integrality_ = [highspy.HighsVarType.kInteger] * len(order)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = lp.num_col_, lp.num_row_
    nonzero = rows.T != 0  # (column by column: the CSC form scipy passes)
    lp.a_matrix_.start_ = np.concatenate([[0], np.cumsum(nonzero.sum(axis=1))]).astype(np.int32)
    lp.a_matrix_.index_ = np.nonzero(nonzero)[1].astype(np.int32)
    lp.a_matrix_.value_ = rows.T[nonzero]
    with _stdout_to_devnull():  # (highspy 1.16 prints a banner on stdout when a solver is made; 1.12-1.15 do not)
        highs = highspy.Highs()
    highs.setOptionValue("log_to_console", False)
    highs.setOptionValue("mip_rel_gap", 0.0)
    highs.setOptionValue("mip_abs_gap", 0.0)
    highs.passModel(lp)
    highs.run()
    status = highs.getModelStatus()
    if status == highspy.HighsModelStatus.kOptimal:
        units = np.empty(len(order))
        units[order] = highs.getSolution().col_value
        return units
    if status in (highspy.HighsModelStatus.kInfeasible, highspy.HighsModelStatus.kUnboundedOrInfeasible):
        return None  # (every unit count is bounded: "unbounded or infeasible" is infeasible)
    raise SolverError(f"highs returned status {highs.modelStatusToString(status)}")


@contextmanager
def _stdout_to_devnull():
    """The process's standard output (the file descriptor C code writes to) sent to /dev/null."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # (no standard output open: nothing to guard)
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def ilp_model(problem: Problem, usable: list[AnyOption]):
    """The integer program (`integer_program`) as a PuLP model, for CBC and for the LP file the
    tests pin (tests/data/ilp_small.lp): (model, variables in the order of `usable`)."""
    import pulp

    program = integer_program(problem, usable)
    lp = pulp.LpProblem("splitplan", pulp.LpMinimize)
    x = [pulp.LpVariable(f"x{i}", lowBound=0, upBound=int(program.upper[i]), cat="Integer") for i in range(len(usable))]
    lp += pulp.lpSum(c * v for c, v in zip(program.objective, x, strict=True))
    for row, low, high, name in zip(program.rows, program.row_lower, program.row_upper, program.row_names, strict=True):
        terms = pulp.lpSum(c * v for c, v in zip(row, x, strict=True) if c)
        lp += (terms >= low if np.isfinite(low) else terms <= high), name
    return lp, x


def _solve_cbc(problem: Problem, usable: list[AnyOption]) -> list[float] | None:
    """Units per option from the CBC binary PuLP 3 bundles (PuLP 4 does not: there `cbc` needs a
    CBC on the PATH), None if infeasible."""
    import pulp

    solver = pulp.PULP_CBC_CMD(msg=False)
    if not solver.available():
        raise SolverError("the cbc solver is not available here (install CBC); try --solver highs")
    lp, x = ilp_model(problem, usable)
    status = pulp.LpStatus[lp.solve(solver)]
    if status == "Infeasible":
        return None
    if status != "Optimal":
        raise SolverError(f"cbc returned status {status}")
    return [v.value() or 0 for v in x]


def _objectives(problem: Problem):
    """Per option: the objective's unit per machine, and the other objective's (the tie-break)."""
    cost, power = (lambda o: o.price_usd_per_hour), (lambda o: o.power_kw)
    return (cost, power) if problem.objective == "cost" else (power, cost)


def _cover(option, role: str) -> float:
    """The share of `role`'s load one unit of `option` carries (its instances over n*), a shared
    machine's part for either role."""
    if option.role == SHARED:
        part, held = option.part(role)
        return held / part.instances
    return option.inst.unit_instances / option.instances if option.role == role else 0.0


def _budgets(problem: Problem, usable: list[AnyOption]) -> list[tuple[str, list[float], float]]:
    """(name, the budgeted quantity per machine of each option, limit) of each budget the problem sets."""
    out = []
    if problem.max_cost_per_hour is not None:
        out.append(("max_cost_per_hour", [o.price_usd_per_hour for o in usable], problem.max_cost_per_hour))
    if problem.max_power_kw is not None:
        out.append(("max_power_kw", [o.power_kw for o in usable], problem.max_power_kw))
    for cap in problem.max_machines:
        out.append((f"max_machines_{re.sub(r'[^0-9A-Za-z]', '_', cap.hardware)}",
                    [cap.share(o.inst.hardware) for o in usable], cap.machines))
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
    budgets = _budgets(problem, usable)

    def total(counts, per_machine) -> float:
        return sum(c * a for c, a in zip(counts, per_machine, strict=True))

    def feasible(counts) -> bool:
        covered = all(sum(c // o.inst.unit_machines * _cover(o, r) for c, o in zip(counts, usable, strict=True))
                      >= 1 - COVER_TOLERANCE for r in SPLIT)
        return covered and all(total(counts, per_machine) <= limit + 1e-9 for _, per_machine, limit in budgets)

    primaries, secondaries = [primary(o) for o in usable], [secondary(o) for o in usable]
    best, best_key = None, None
    for counts in filter(feasible, itertools.product(*ranges)):
        key = (round(total(counts, primaries), 9), round(total(counts, secondaries), 9))
        if best is None or key < best:
            best, best_key = key, counts
    if best_key is None:
        raise InfeasibleError(_budget_message(problem, usable))
    return {o.key: c for o, c in zip(usable, best_key, strict=True) if c > 0}
