"""The cheapest (or lowest-power) plan: every pool option sized alone on the trace, an ILP or
exhaustive grid over machine counts, candidates verified and repaired on the whole trace, the
best co-located plan beside it, and the cost-vs-power frontier."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from splitplan.defaults import DEFAULT_ENGINE
from splitplan.errors import InfeasibleError, SpecError, listed, with_details
from splitplan.parallel import run_units
from splitplan.perf.points import candidate_layouts, reference_instance, require_tp
from splitplan.perf.roofline import Instance
from splitplan.perf.table import load_perf_db
from splitplan.roles import SPLIT, Role
from splitplan.search.bracket import plan_max_rate
from splitplan.search.documents import optimize_json, plan_json, plans_csv
from splitplan.search.frontier import cost_power_frontier, nondominated
from splitplan.search.plan import (
    MachineCap,
    Option,
    Plan,
    Problem,
    as_simulated,
    closest_fit,
    colocated_plan,
    combos,
    make_plan,
    repair,
    size_option,
)
from splitplan.search.solve import solve_counts
from splitplan.sim.prefix_cache import PrefixModel, host_link_bytes_per_s
from splitplan.slo import achieved, alone_latencies, meets, reference_for
from splitplan.specs.engine import load_engine
from splitplan.specs.hardware import hardware_catalog, load_hardware, load_machines, price_date_warning
from splitplan.specs.model import load_model
from splitplan.specs.slo import load_slo

NOT_SIZED = "not sized"  # the reason a co-located option left out by its cost bound starts with


@dataclass(frozen=True)
class OptimizeResult:
    plan: Plan  # the best plan under the objective, split or co-located
    alternatives: tuple  # runner-ups, the best co-located (or split) plan among them
    options: tuple  # every evaluated Option, sized or skipped
    colocated: Plan | None = None  # the best co-located plan (None if none meets the SLO)
    max_rate_rps: float | None = None  # objective throughput: the highest rate served
    pareto: tuple = ()  # with pareto=True: plans no other plan beats on both cost and power
    unservable: dict | None = None  # requests no token instance can hold, left out of the sizing
    problem: Problem | None = field(default=None, repr=False, compare=False)  # what was solved (trace, SLO, budgets)
    closed_loop: dict | None = None  # optimize_closed_loop: the rounds, and the plan's simulated closed loop
    simulated: dict | None = None  # simulation.validate_result: the plan's simulation and the machines it added
    alternatives_simulated: tuple = ()  # simulation.validate_result: each runner-up's simulated outcome
    split: Plan | None = None  # the best split plan (None when none was planned or none meets the SLO)
    objective: str = "cost"  # what `plan` minimizes: cost or power
    notes: tuple = ()  # what else the reader should know (why no split plan was found)

    @property
    def frontier(self) -> tuple:
        """The cost-power frontier: with pareto=True the searched one, else the plans found."""
        return self.pareto or tuple(nondominated([self.plan, *self.alternatives]))

    @property
    def warnings(self) -> list[str]:
        """What the reader of this result should know: prices of the plans compared taken more
        than a year apart."""
        machines = {o.inst.hardware.name: o.inst.hardware for o in self.options}
        used = {p.hardware for plan in (self.plan, *self.alternatives) for p in plan.pools}
        warning = price_date_warning(machines[name] for name in sorted(used) if name in machines)
        return [*self.notes, *([warning] if warning else [])]

    @property
    def split_saving_pct(self) -> float | None:
        """What the best split plan saves against the best co-located plan, in % of the
        objective (cost or power; negative: splitting loses, and the plan is co-located)."""
        if self.colocated is None or self.split is None:
            return None
        return (1 - objective_value(self.objective, self.split) / objective_value(self.objective, self.colocated)) * 100

    def to_json(self, inputs: dict | None = None) -> dict:
        """The document `splitplan optimize --format json` prints."""
        document = optimize_json(self, inputs or {})
        if self.pareto:
            document["pareto"] = [plan_json(p) for p in self.pareto]
        return document

    def to_frame(self):
        """One row per plan: the chosen one first, then the runner-ups."""
        import io

        import pandas as pd

        return pd.read_csv(io.StringIO(plans_csv([self.plan, *self.alternatives])))


def optimize(trace, model: str, slo: str, hardware: list[str] | None = None, prompt_hardware: list[str] | None = None,
             token_hardware: list[str] | None = None, tp: int | None = None, objective: str = "cost",
             engine: str = DEFAULT_ENGINE, search: str = "ilp", max_cost_per_hour: float | None = None,
             max_power_kw: float | None = None, max_machines: dict[str, int] | None = None,
             max_batch_tokens: int | None = None, alternatives: int = 5, split: bool = True,
             with_colocated: bool = True, jobs: int = 1, perf_db: str | None = None,
             pareto: bool = False, solver: str = "highs", split_only: bool = False,
             perf_interp: str = "splitplan", max_num_seqs: int | None = None, prefix_caching: bool | None = None,
             routing: str = "jsq", kv_offload_gb: float = 0.0) -> OptimizeResult:
    """The cheapest (or lowest-power) plan meeting every SLO line on `trace`: the better of
    the best split plan (prompt/token pools) and the best co-located plan under the objective
    (`split_only`: the split plan, the co-located one still compared); with `split=False`,
    co-located machines only. Co-located plans use the machines named by `hardware`, else
    those of `prompt_hardware` and `token_hardware`, else the catalog. `perf_interp`: how
    `perf_db` is read (perf.table.INTERPOLATIONS; splitwise-sim to plan as that simulator times).
    `max_batch_tokens` and `max_num_seqs` set the engine's scheduler (None: the profile's).
    `prefix_caching` (None: the engine profile's), `routing` (jsq or prefix-aware) and `kv_offload_gb`
    (host memory per prefilling instance): the engine's prefix caches, over the prefixes the trace
    records, in every pool's sizing (capacity.pools.PrefixModel)."""


    m, eng, profile = load_model(model), load_engine(engine), load_slo(slo)
    db = load_perf_db(perf_db) if perf_db else None
    if objective not in ("cost", "power"):
        raise SpecError(f"--objective {objective}: choose cost or power")
    names = hardware or [h.name for h in hardware_catalog()]
    machines = load_machines(sorted(set(names) | set(prompt_hardware or []) | set(token_hardware or [])))
    capped = {hw: machines.get(hw) or load_hardware(hw) for hw in (max_machines or {})}
    for hw, spec in capped.items():
        if hw not in machines and spec.family not in {m.name for m in machines.values()}:
            raise SpecError(f"--max-machines {hw}: not among the hardware considered ({', '.join(machines)})")
    caps = tuple(MachineCap(capped[hw].name, n, capped[hw].gpus_per_machine) for hw, n in sorted((max_machines or {}).items()))
    if tp is not None:
        _check_tp(tp, [machines[n] for n in sorted(set(hardware or []) | set(prompt_hardware or []) | set(token_hardware or []))],
                  list(machines.values()))
    trace, unservable = _servable(trace, m, eng, [machines[n] for n in (token_hardware or names)] if split
                                  else [machines[n] for n in names], tp,
                                  [machines[n] for n in (prompt_hardware or names)] if split_only else ())
    reference = reference_for(profile, lambda hw, t: reference_instance(m, hw, t, eng, db, perf_interp), trace.prompt_tokens,
                              trace.output_tokens)
    problem = Problem(trace, profile, reference, eng.batch_tokens(max_batch_tokens), objective, max_cost_per_hour, max_power_kw,
                      caps, solver, eng.seqs_cap(max_num_seqs), eng.chunked,
                      prefix_model(trace, eng, prefix_caching, routing, kv_offload_gb,
                                   [machines[n] for n in sorted(set(names) | set(prompt_hardware or []))]))

    def make(hw, t):  # measured timing where --perf-db has the group; otherwise skipped with the reason
        inst = Instance(m, hw, eng, t)
        return db.instance(inst, perf_interp) if db else inst

    def tasks(role, allowed, lower=None):
        return [(role, make(machines[name], layout), (lower or {}).get((name, layout)) or 1)
                for name in sorted(set(allowed)) for layout in candidate_layouts(m, machines[name], eng, tp)]

    # A machine type named without a shape is offered in every shape it is rented in: each sized
    # option again on each smaller machine its layout tiles (the same instance: the same size).
    shapes = {machines[n].name: machines[n].shaped()[1:] for n in machines if "@" not in n}

    def shaped(options):
        return options + [dataclasses.replace(o, inst=make(hw, o.inst.layout)) for o in options if o.instances
                          for hw in shapes.get(o.inst.hardware.name, ()) if hw.gpus_per_machine % o.inst.layout.gpus == 0]

    prompt_names = prompt_hardware or names
    first = _size_all(problem, tasks(Role.PROMPT, set(names) | set(prompt_names))
                      + (tasks(Role.TOKEN, token_hardware or names) if split else []), jobs)
    # A co-located pool carries the prompt load and more: the prompt pool's count of the
    # same (machine, TP) bounds its size from below, which shortens its search.
    lower = {(o.inst.hardware.name, o.inst.layout): o.instances for o in first if o.role == Role.PROMPT}
    mixed_names = hardware or sorted(set(prompt_hardware or []) | set(token_hardware or [])) or names
    simulated: dict = {}  # co-located options sized by the simulator (colocated_plan)
    mixed = (_size_colocated(problem, tasks(Role.MIXED, mixed_names, lower), shaped, jobs, simulated if split else None)
             if with_colocated or not split else [])
    if not split:
        plan = colocated_plan(problem, mixed, simulated)
        others = []
        chosen = {load_hardware(p.hardware).family for p in plan.mixed_pools}
        for family in sorted({o.inst.hardware.family for o in mixed} - chosen):
            try:  # the best co-located plan of each other machine type
                others.append(colocated_plan(problem, [o for o in mixed if o.inst.hardware.family == family], simulated))
            except InfeasibleError:
                continue
        others.sort(key=lambda p: plan_key(objective, p))
        return OptimizeResult(plan, tuple(others[:alternatives]), tuple(as_simulated(simulated, o) for o in mixed), plan,
                              unservable=unservable, problem=problem, objective=objective)
    prompt_types = {machines[n].name for n in prompt_names}  # names may be paths: compare the loaded names
    options = shaped([o for o in first if o.role == Role.TOKEN or o.inst.hardware.name in prompt_types])
    options += combos(options)  # prefill and decode instances on one machine
    try:
        _raise_if_unreachable(problem, options)
        split_plan, alts = _best_split(problem, options, search, alternatives)
        no_split = None
    except InfeasibleError as exc:  # a co-located plan may still serve the trace
        if split_only or not mixed:
            raise
        split_plan, alts, no_split = None, [], exc
    try:
        colocated = colocated_plan(problem, mixed, simulated) if mixed else None
    except InfeasibleError:
        if no_split is not None:
            raise no_split from None
        colocated = None
    mixed = [as_simulated(simulated, o) for o in mixed]
    best = split_plan if split_plan is not None and (split_only or colocated is None or
                                                     plan_key(objective, split_plan) <= plan_key(objective, colocated)) else colocated
    shown = alts[: alternatives - 1] + [p for p in (split_plan, colocated) if p is not None and p is not best]
    front = ()
    if pareto:
        by_key = {o.key: o for o in options + mixed}
        front = tuple(dataclasses.replace(p, max_rate_rps=plan_max_rate(problem, p, by_key))
                      for p in cost_power_frontier(problem, options, [*alts, *(p for p in (split_plan, colocated) if p)]))
    notes = () if no_split is None else (f"no split plan: {no_split}; the plan is co-located",)
    assert best is not None  # (with neither a split nor a co-located plan, one of them raised above)
    return OptimizeResult(best, tuple(sorted(shown, key=lambda p: plan_key(objective, p))), tuple(options + mixed),
                          colocated, pareto=front, unservable=unservable, problem=problem, split=split_plan, objective=objective,
                          notes=notes)


def prefix_model(trace, engine, prefix_caching: bool | None, routing: str, kv_offload_gb: float, machines: list) -> PrefixModel | None:
    """The engine's prefix caching as the planner and the simulator model it, checked: None when it
    is off (`prefix_caching`, else the engine profile's) or the trace records no prefixes."""
    if routing not in ("jsq", "prefix-aware"):
        raise SpecError(f"--routing {routing}: choose jsq or prefix-aware")
    on = engine.caches_prefixes(prefix_caching, routing, kv_offload_gb)
    if kv_offload_gb < 0:
        raise SpecError(f"--kv-offload-gb {kv_offload_gb:g}: must be >= 0 GB")
    if kv_offload_gb:
        for hw in machines:
            host_link_bytes_per_s(hw)
    if not on or trace.prefix is None:
        return None
    return PrefixModel(trace.prefix, engine.kv_block_tokens, kv_offload_gb, routing == "prefix-aware")


def _check_tp(tp: int, named: list, catalog: list) -> None:
    """--tp must be a TP degree of every machine the user named, or of at least one catalog
    machine when none was named: bad input, exit 2."""
    wrong = [hw for hw in (named or catalog) if tp not in hw.tp_degrees()]
    if wrong and (named or len(wrong) == len(catalog)):
        require_tp(wrong[0], tp)


def _largest_request(model, engine, machines, tp):
    """(tokens, machine, layout): the longest request one instance of these machines holds."""
    best = None
    for hw in machines:
        for layout in candidate_layouts(model, hw, engine, tp):
            inst = Instance(model, hw, engine, layout)
            if inst.fit.fits and (best is None or inst.max_request_tokens > best[0]):
                best = (inst.max_request_tokens, hw.name, layout)
    return best


def _servable(trace, model, engine, token_machines, tp, prompt_machines=()):
    """The trace without requests that cannot be served: longer (prompt + output tokens) than the
    model's context window, which the engine refuses, or than the KV any token instance holds, or
    with a prompt longer than any prompt instance (`prompt_machines`, split plans) holds while it
    prefills; and a report of that request class (None when every request is served)."""
    best = _largest_request(model, engine, token_machines, tp)
    context = engine.context_tokens(model)
    if context is not None and (best is None or context <= best[0]):
        where = "the engine's max_model_len" if engine.max_model_len else f"{model.name}'s context window"
        limit, reason = context, (f"prompt + output tokens exceed {where} ({context:,} tokens), which the engine "
                                  "refuses; they are left out of the sizing")
    elif best is not None:
        limit, reason = best[0], (f"prompt + output tokens exceed the KV capacity of every token instance considered "
                                  f"(largest: {best[0]:,} tokens, {best[1]} at {best[2]}); they are left out of the sizing")
    else:
        return trace, None  # nothing fits at all: the sizing says why
    too_long = trace.prompt_tokens + trace.output_tokens > limit
    prompt_best = _largest_request(model, engine, prompt_machines, tp)
    if prompt_best is not None and (~too_long & (trace.prompt_tokens > prompt_best[0])).any():
        too_long |= trace.prompt_tokens > prompt_best[0]
        reason = (f"{reason.removesuffix('; they are left out of the sizing')}, or their prompt exceeds the KV capacity of "
                  f"every prompt instance considered (largest: {prompt_best[0]:,} tokens, {prompt_best[1]} at "
                  f"{prompt_best[2]}); they are left out of the sizing")
    if not too_long.any():
        return trace, None
    report = {
        "requests": int(too_long.sum()),
        "share_pct": float(too_long.mean() * 100),
        "min_prompt_tokens": int(trace.prompt_tokens[too_long].min()),
        "max_prompt_tokens": int(trace.prompt_tokens[too_long].max()),
        "reason": reason,
    }
    if too_long.all():
        raise InfeasibleError(f"no request can be served: {report['reason']}")
    keep = ~too_long
    return trace.take(keep), report


def _size_one(problem, task):
    return size_option(problem, *task)


PAIR = 2  # co-located options are sized a pair at a time, whatever `jobs` is (the output does not depend on it)


def _size_all(problem, tasks: list, jobs: int, done: dict | None = None) -> list:
    """Every (role, instance, lower bound) task sized (`_size`), but those `done` (by index) already."""
    done = _size(problem, tasks, jobs, dict(done or {}), range(len(tasks)))
    return [done[k] for k in range(len(tasks))]


def _size(problem, tasks: list, jobs: int, done: dict, ks) -> dict:
    """`done` (options by task index) with the tasks `ks` sized too, in `jobs` processes. A prompt
    or co-located pool's size follows the prefill work it carries, so each such role's count
    searches start from a sized one's count (the first of the role sized, else, when there are
    more than a pair of tasks, the first of `ks` that fits, sized first), scaled by their prefill
    work against its (a guess: the search still finds the smallest count that holds). What is
    sized, and from which guess, does not depend on `jobs`."""
    ks = [k for k in ks if k not in done]
    work = {k: float(np.sum(inst.prefill_time_s(problem.trace.prompt_tokens))) for k, (role, inst, _) in enumerate(tasks)
            if (k in done or k in ks) and role != Role.TOKEN and inst.fit.fits}
    pilots = {}
    for role in (Role.PROMPT, Role.MIXED):
        sized = [k for k in work if tasks[k][0] == role and k in done and done[k].instances]
        first = sized[0] if sized else next((k for k in ks if k in work and tasks[k][0] == role), None)
        if first is not None and first not in done:
            if len(ks) <= PAIR:  # (a pair is sized in parallel where two processes run: sizing one first would wait)
                continue
            done[first] = size_option(problem, *tasks[first])
        if first is not None and done[first].instances:
            pilots[role] = first
    rest = [k for k in ks if k not in done]
    guesses = {k: max(tasks[k][2], math.ceil(done[pilot].instances * work[k] / work[pilot]))
               for k in rest if k in work and (pilot := pilots.get(tasks[k][0])) is not None}
    done.update(zip(rest, run_units(_size_one, [(*tasks[k], guesses.get(k)) for k in rest], problem, jobs), strict=True))
    return done


def _size_colocated(problem, tasks: list, shaped, jobs: int, simulated: dict | None = None) -> list:
    """Co-located options sized (`_size_all`) and copied onto the smaller shapes of their machines
    (`shaped`). With `simulated` (split plans are searched too, so only the best co-located plan is
    compared), options are pruned by a lower bound on their cost, their prompt pool's count (a
    lower bound on their own) on their cheapest shape: they are sized in the order of their
    bounds until the next bound is above the best size found, the best co-located plan among them
    is found (`colocated_plan`, which keeps its simulations in `simulated`), and an option whose
    bound is above that plan's cost is not sized, as the plan it would give cannot be the best."""
    if simulated is None:
        return shaped(_size_all(problem, tasks, jobs))

    def cheapest(option) -> float:  # its objective on the cheapest shape of its machine
        return min(_objective(problem.objective, o) * o.machines_alone for o in shaped([option]))
    least = [cheapest(Option(role, inst, lower, "")) if inst.fit.fits else math.inf for role, inst, lower in tasks]
    order = sorted((k for k in range(len(tasks)) if least[k] < math.inf), key=lambda k: (least[k], k))
    done: dict = {}
    best = math.inf
    while order and least[order[0]] <= best + 1e-9:  # (a pair at a time)
        batch, order = order[:PAIR], order[PAIR:]
        done = _size(problem, tasks, jobs, done, batch)
        best = min([best, *(cheapest(done[k]) for k in batch if done[k].instances)])
    try:
        upper = objective_value(problem.objective, colocated_plan(problem, shaped(list(done.values())), simulated))
    except InfeasibleError:  # (none within the budgets: nothing to compare against)
        upper = math.inf
    for k, (role, inst, lower) in enumerate(tasks):
        if k not in done and upper + 1e-9 < least[k] < math.inf:
            done[k] = Option(role, inst, None, "", f"{NOT_SIZED}: {lower}+ instances (its prompt pool's count) need at least "
                             f"{_objective_text(problem.objective, least[k])}, above the co-located plan found "
                             f"({_objective_text(problem.objective, upper)})")
    return shaped(_size_all(problem, tasks, jobs, done))


def _objective_text(objective: str, value: float) -> str:
    return f"${value:,.2f}/h" if objective == "cost" else f"{value:,.1f} kW"


def objective_value(objective: str, plan) -> float:
    """A plan's value under the objective: $/h for cost, provisioned kW for power."""
    return plan.cost_usd_per_hour if objective == "cost" else plan.power_kw


def plan_key(objective: str, plan) -> tuple:
    """Best first: the objective, then the other one, then fewer machines, then a fixed order."""
    other = "power" if objective == "cost" else "cost"
    return (objective_value(objective, plan), objective_value(other, plan), plan.machines,
            repr(plan.prompt_pools + plan.token_pools + plan.mixed_pools))


def _best_split(problem, options, search: str, alternatives: int):
    """Candidates: the ILP's (or grid's) plan, and the best homogeneous plan of every
    (prompt, token) hardware pair; each is verified and repaired on the whole trace,
    and the best verified one wins. The rest are the runner-ups."""

    by_key = {o.key: o for o in options}
    candidates = [solve_counts(problem, options, search)]
    usable = [o for o in options if o.instances and o.role in SPLIT]
    pairs = sorted(
        ((p, t) for p in usable if p.role == Role.PROMPT for t in usable if t.role == Role.TOKEN),
        key=lambda pt: (_objective(problem.objective, pt[0]) * pt[0].machines_alone
                        + _objective(problem.objective, pt[1]) * pt[1].machines_alone, pt[0].key, pt[1].key),
    )
    seen_pairs: set[tuple[str, str]] = set()
    for p, t in pairs:
        pair = (p.inst.hardware.family, t.inst.hardware.family)  # (its cheapest shapes)
        if pair not in seen_pairs and len(seen_pairs) < alternatives + 1:
            seen_pairs.add(pair)
            candidates.append({p.key: p.machines_alone, t.key: t.machines_alone})
    plans: list[Plan] = []
    memo: dict = {}
    failures: list = []
    for counts in candidates:
        try:
            counts, values, lines, repairs = repair(problem, counts, by_key, memo=memo)
            plans.append(make_plan(problem, counts, by_key, repairs, values, lines))
        except InfeasibleError as exc:  # a candidate that no repair verifies is dropped
            failures.append(exc)
    if not plans:
        raise failures[0]
    plans.sort(key=lambda p: plan_key(problem.objective, p))
    plan, alts = plans[0], []
    for other in plans[1:]:
        if other.prompt_pools + other.token_pools != plan.prompt_pools + plan.token_pools and other not in alts:
            alts.append(other)
    return plan, alts


def _objective(objective: str, option) -> float:
    return option.price_usd_per_hour if objective == "cost" else option.power_kw


def _raise_if_unreachable(problem, options) -> None:
    """Exit 3 naming the line no hardware can meet, the best value reachable and where."""
    for role, metric in ((Role.PROMPT, "ttft"), (Role.TOKEN, "tbt")):
        fitting = [o for o in options if o.role == role and o.inst.fit.fits]
        if not fitting:
            mine = sorted((o for o in options if o.role == role), key=closest_fit)
            short, whole = listed([f"{o.inst.hardware.name} {o.inst.layout}: {o.skipped}" for o in mine])
            raise with_details(InfeasibleError(f"the model fits no {role} hardware considered; closest: {short}"), whole)
        if any(o.instances for o in fitting):
            continue
        for line in (x for x in problem.slo.lines() if x.metric == metric):
            best = None
            for o in fitting:
                alone = alone_latencies(o.inst, problem.trace.prompt_tokens, problem.trace.output_tokens)
                value = achieved(line, alone.value(metric), problem.reference)
                if best is None or value < best[0]:
                    best = (value, o)
            if best and not meets(line, best[0]):
                unit = " ms" if line.max_ms is not None else "x"
                raise InfeasibleError(
                    f"{line.label} {line.target} cannot be met: the best reachable is {best[0]:.3g}{unit} "
                    f"on {best[1].inst.hardware.name} at {best[1].inst.layout}, running requests alone")
        short, whole = listed([f"{o.inst.hardware.name} {o.inst.layout}: {o.skipped}" for o in fitting])
        raise with_details(InfeasibleError(f"no {role} option meets the SLO: {short}"), whole)
