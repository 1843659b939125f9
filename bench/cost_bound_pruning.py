"""Would a cost bound let `optimize` leave split pool options unsized? (issue 56's pruning, measured)

    python bench/cost_bound_pruning.py [--quick]

The bound, written here and not in the package (it is not shipped: see the last lines this
prints). A pool option's count n*(o) is bounded from below without sizing it:
- a prompt pool by the prefill work its TTFT lines leave it: per line, the shortest prompts of
  the fewest requests its percentile lets meet it, at the instance's fastest seconds per token
  (any pass of 16 to 1M tokens), within the first arrival to the latest deadline (arrival +
  limit). The trace's span alone is not a bound: a burst may queue past it (a 2-s burst of 60
  code-trace requests on Llama-2-70B, H100 TP 8, batch SLO: n* = 1, work / span = 2);
- a token pool by one instance.
The linear relaxation of search.solve's integer program over every option (the sized at n*, the
others at their bounds) then prices every plan using an option at least at the relaxation's
optimum plus the option's reduced cost (duality). The cheaper half of the options by their
bounds is sized first; the best split plan and the homogeneous candidates among them give the
thresholds; an option is left unsized when its plan bound is above the best plan's objective
and its homogeneous bound above the last homogeneous candidate's. A prompt option is kept where
a co-located option takes its count as a lower bound.

Prints, per case (traces x SLOs x settings), whether the plan and runner-ups equal the
unpruned search's (cost, power, machines, GPUs), the options pruned, and the time of the default
and conversation cases with and without pruning.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import math
import time

import numpy as np
from scipy.optimize import linprog

import splitplan.search.optimize as O
from splitplan.perf.roofline import Instance
from splitplan.search.solve import integer_program, solve_counts
from splitplan.search.types import SHARED, Option, combos
from splitplan.specs.roles import SPLIT, Role
from splitplan.workload.trace import load_workload

PASS_TOKENS = 2.0 ** np.arange(4, 21)
MARGIN = 1e-6
PRUNED = "not sized (cost bound)"
STATE: dict = {"on": False, "run": None}


def count_bound(problem, role, inst) -> int:
    if role != Role.PROMPT or not isinstance(inst, Instance) or inst.layout.pp > 1 or problem.prefix is not None:
        return 1
    t = problem.trace
    seqs = np.minimum(float(max(inst.layout.dp, 1)), PASS_TOKENS)
    per_token_s = float(np.min(np.minimum(inst.pass_time_s(1.0, PASS_TOKENS), inst.pass_time_s(seqs, PASS_TOKENS)) / PASS_TOKENS))
    shortest = np.cumsum(np.sort(np.asarray(t.prompt_tokens, float)))
    bound = 1
    for line in (x for x in problem.slo.lines() if x.metric == "ttft"):
        if line.max_ms is not None:
            limit_s = np.full(len(shortest), line.max_ms / 1e3)
        elif problem.reference is not None:
            limit_s = line.limit * np.asarray(problem.reference.ttft_s, float)
        else:
            continue
        within = math.floor(line.percentile / 100 * (len(shortest) - 1)) + 1  # (np.percentile's rank, linear)
        window_s = float(np.max(t.arrival_s + limit_s) - np.min(t.arrival_s))
        bound = max(bound, math.ceil(shortest[within - 1] * per_token_s / max(window_s, 1e-9) * (1 - MARGIN)))
    return bound


def split_options(run, sized):
    prompt_types = {run.machines[n].name for n in run.prompt_names}
    options = run.shaped([o for o in sized if o.role == Role.TOKEN or o.inst.hardware.name in prompt_types])
    return options + combos(options)


def uses(column, option) -> bool:
    if column.role == SHARED:
        column = column.prompt if option.role == Role.PROMPT else column.token
    return (column.role == option.role and column.inst.layout == option.inst.layout
            and column.inst.hardware.family == option.inst.hardware.family)


def bounds(problem, tasks, done, lower, run, value):
    at_bound = {k: done.get(k) or Option(role, inst, lower[k], "") for k, (role, inst, _) in enumerate(tasks) if k in done or k in lower}
    columns = split_options(run, [o for o in at_bound.values() if o.instances])
    program = integer_program(problem, columns)
    relaxed = linprog(program.objective, A_ub=-program.rows[: len(SPLIT)], b_ub=-program.row_lower[: len(SPLIT)], bounds=(0, None),
                      method="highs")
    if relaxed.status != 0:
        return {}, {}
    reduced = program.objective + relaxed.ineqlin.marginals @ program.rows[: len(SPLIT)]
    cheapest = {role: min((value(o) * o.machines_alone for o in columns if o.role == role), default=math.inf) for role in SPLIT}
    plan, alone = {}, {}
    for k, option in at_bound.items():
        if k in done:
            continue
        mine = [j for j, c in enumerate(columns) if uses(c, option)]
        plan[k] = float(relaxed.fun + min(reduced[j] for j in mine)) if mine else math.inf
        other = Role.TOKEN if option.role == Role.PROMPT else Role.PROMPT
        alone[k] = cheapest[other] + min((value(c) * c.machines_alone for c in columns if c.role == option.role and uses(c, option)),
                                         default=math.inf)
    return plan, alone


def staged(run, tasks, jobs):
    problem = run.problem
    colocated = {run.machines[n].name for n in run.mixed_names} if run.options.mode.sizes_colocated else set()
    lower = {k: count_bound(problem, role, inst) for k, (role, inst, _) in enumerate(tasks)
             if inst.fit.fits and role in SPLIT and not (role == Role.PROMPT and inst.hardware.name in colocated)}
    if not lower or run.options.pareto:
        return ORIGINAL(problem, tasks, jobs)
    value = functools.partial(O._objective, problem.objective)

    def least(k):
        return min(value(o) * o.machines_alone for o in run.shaped([Option(tasks[k][0], tasks[k][1], lower[k], "")]))
    first = []
    for role in SPLIT:
        mine = sorted((k for k in lower if tasks[k][0] == role), key=lambda k: (least(k), k))
        first += mine[: math.ceil(len(mine) / 2)]
    done = O._size(problem, tasks, jobs, {}, [k for k in range(len(tasks)) if k not in lower or k in first])
    columns = split_options(run, [done[k] for k in sorted(done)])
    by_key = {o.key: o for o in columns}
    try:
        best = sum(value(by_key[key]) * n for key, n in solve_counts(problem, columns, run.options.search).items())
    except O.InfeasibleError:
        return ORIGINAL(problem, tasks, jobs, done)
    pairs = O._homogeneous_pairs(problem, columns, run.options.alternatives)
    last = sum(value(by_key[key]) * n for key, n in pairs[-1].items()) if len(pairs) > run.options.alternatives else math.inf
    plan, alone = bounds(problem, tasks, done, lower, run, value)
    for k in plan:
        if plan[k] > best * (1 + MARGIN) and alone[k] > last * (1 + MARGIN):
            done[k] = Option(tasks[k][0], tasks[k][1], None, "", PRUNED)
    return ORIGINAL(problem, tasks, jobs, done)


ORIGINAL, PREPARE = O._size_all, O._prepare


def _prepare(*args):
    STATE["run"] = PREPARE(*args)
    return STATE["run"]


def _size_all(problem, tasks, jobs, done=None):
    run = STATE["run"]
    if STATE["on"] and done is None and run is not None and problem is run.problem and any(t[0] == Role.TOKEN for t in tasks):
        return staged(run, tasks, jobs)
    return ORIGINAL(problem, tasks, jobs, done)


O._prepare, O._size_all = _prepare, _size_all


def optimize(trace, slo, prune: bool, **settings):
    STATE["on"] = prune
    return O.optimize(trace, "llama2-70b", slo, options=O.OptimizeOptions(**settings))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the default trace only")
    args = parser.parse_args()
    settings = [{}, {"objective": "power"}, {"mode": "split"}, {"mode": "split-alone"}, {"alternatives": 2}, {"alternatives": 9},
                {"tp": 8}, {"max_cost_per_hour": 60.0}, {"hardware": ["h100-80gb", "a100-80gb", "l40s-48gb"]}]
    traces = [("azure-code", None)] + ([] if args.quick else [("azure-conv", 30.0), ("azure-code", 8.0)])
    same = total = pruned = options = broken = 0
    print("| trace | SLO | settings | pruned / split options | plans as unpruned |")
    print("|---|---|---|---|---|")
    for (name, rate), slo, extra in itertools.product(traces, ["chat", "batch", "splitwise"], settings):
        trace = load_workload(name, rate, 120.0)
        out = []
        for prune in (True, False):
            r = optimize(trace, slo, prune, jobs=2, **extra)
            out.append([(round(p.cost_usd_per_hour, 6), round(p.power_kw, 6), p.machines, p.gpus) for p in (r.plan, *r.alternatives)])
            if prune:
                cut = sum(o.skipped == PRUNED for o in r.options)
                split = sum(o.role in SPLIT for o in r.options)
            else:  # the bound holds: never above a sized prompt option's n*
                broken += sum(count_bound(r.problem, o.role, o.inst) > o.instances
                              for o in r.options if o.role == Role.PROMPT and o.instances)
        total, same, pruned, options = total + 1, same + (out[0] == out[1]), pruned + cut, options + split
        print(f"| {name}{f' {rate:g} req/s' if rate else ''} | {slo} | {extra or 'defaults'} | {cut} / {split} | "
              f"{'yes' if out[0] == out[1] else 'NO: ' + str(out[0]) + ' vs ' + str(out[1])} |")
    burst = load_workload("azure-code").take(np.arange(60))  # the counter-example to the span: 60 requests in 2 s
    burst = dataclasses.replace(burst, arrival_s=np.linspace(0.0, 2.0, 60))
    r = optimize(burst, "batch", False, hardware=["h100-80gb"], tp=8, mode="split-alone")
    for o in (o for o in r.options if o.role == Role.PROMPT and o.instances):
        work_s = float(np.sum(o.inst.prefill_time_s(burst.prompt_tokens)))
        print(f"burst: {o.inst.hardware.name} {o.inst.layout}: n* {o.instances}, count bound {count_bound(r.problem, o.role, o.inst)}, "
              f"prefill work / span {math.ceil(work_s / burst.span_s)}")
        broken += count_bound(r.problem, o.role, o.inst) > o.instances
    print(f"\n{same} of {total} cases report the unpruned plans; {pruned} of {options} split option rows pruned; "
          f"prompt count bounds above n*: {broken}")
    print("\n| case | jobs | unpruned s (best of 3) | pruned s (best of 3) |\n|---|---|---|---|")
    for name, rate in (("azure-code", None), ("azure-conv", 70.0)):
        trace = load_workload(name, rate, 120.0)
        for jobs in (1, 2):
            best = {}
            for prune in (False, True) * 3:
                start = time.perf_counter()
                optimize(trace, "chat", prune, jobs=jobs)
                best[prune] = min(best.get(prune, math.inf), time.perf_counter() - start)
            print(f"| {name}{f' {rate:g} req/s x 120 s' if rate else ''} | {jobs} | {best[False]:.3f} | {best[True]:.3f} |")


if __name__ == "__main__":
    main()
