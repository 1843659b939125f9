"""Library facade: what the CLI calls, usable from capacity-planning scripts.

Each function takes names or paths (or loaded specs), makes one pass through the
pure layers and returns plain data.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
from dataclasses import asdict, dataclass, field

from typing import TYPE_CHECKING

from splitplan.errors import InfeasibleError, SpecError
from splitplan.perf.roofline import Instance
from splitplan.specs.engine import EngineProfile, load_engine
from splitplan.specs.hardware import HardwareSpec, load_hardware
from splitplan.specs.model import ModelSpec, load_model

if TYPE_CHECKING:
    from splitplan.search.plan import Plan, Problem
    from splitplan.sim.cluster import SimResult

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
    alternatives: tuple  # runner-ups, the best co-located plan among them
    options: tuple  # every evaluated Option, sized or skipped
    colocated: "Plan | None" = None  # the best co-located plan (None if none meets the SLO)
    max_rate_rps: float | None = None  # objective throughput: the highest rate served
    pareto: tuple = ()  # with pareto=True: plans no other plan beats on both cost and power
    unservable: dict | None = None  # requests no token instance can hold, left out of the sizing
    problem: "Problem | None" = field(default=None, repr=False, compare=False)  # what was solved (trace, SLO, budgets)
    closed_loop: dict | None = None  # optimize_closed_loop: the rounds, and the plan's simulated closed loop

    @property
    def split_saving_pct(self) -> float | None:
        """Cost saved against the best co-located plan, in % (negative: splitting loses)."""
        if self.colocated is None or self.plan.mixed_pools:
            return None
        return (1 - self.plan.cost_usd_per_hour / self.colocated.cost_usd_per_hour) * 100

    def to_json(self, inputs: dict | None = None) -> dict:
        """The document `splitplan optimize --format json` prints."""
        from splitplan.report import optimize_json, plan_json
        document = optimize_json(self, inputs or {})
        if self.pareto:
            document["pareto"] = [plan_json(p) for p in self.pareto]
        return document

    def to_frame(self):
        """One row per plan: the chosen one first, then the runner-ups."""
        import io

        import pandas as pd

        from splitplan.report import plans_csv
        return pd.read_csv(io.StringIO(plans_csv([self.plan, *self.alternatives])))


def optimize(trace, model: str, slo: str, hardware: list[str] | None = None, prompt_hardware: list[str] | None = None,
             token_hardware: list[str] | None = None, tp: int | None = None, objective: str = "cost",
             engine: str = DEFAULT_ENGINE, search: str = "ilp", max_cost_per_hour: float | None = None,
             max_power_kw: float | None = None, max_machines: dict[str, int] | None = None,
             max_batch_tokens: int = 2048, alternatives: int = 5, split: bool = True,
             with_colocated: bool = True, jobs: int = 1, perf_db: str | None = None,
             pareto: bool = False, solver: str = "highs") -> OptimizeResult:
    """The cheapest (or lowest-power) plan meeting every SLO line on `trace`: split
    prompt/token pools (default) or, with `split=False`, co-located machines."""
    from splitplan.capacity.pools import reference_latencies
    from splitplan.search.plan import Problem, colocated_plan
    from splitplan.specs.hardware import hardware_catalog
    from splitplan.specs.slo import load_slo

    from splitplan.perf.table import load_perf_db

    m, eng, profile = load_model(model), load_engine(engine), load_slo(slo)
    db = load_perf_db(perf_db) if perf_db else None
    if objective not in ("cost", "power"):
        raise SpecError(f"--objective {objective}: choose cost or power")
    names = hardware or [h.name for h in hardware_catalog()]
    machines = {n: load_hardware(n) for n in sorted(set(names) | set(prompt_hardware or []) | set(token_hardware or []))}
    for hw in (max_machines or {}):
        if hw not in machines:
            raise SpecError(f"--max-machines {hw}: not among the hardware considered ({', '.join(machines)})")
    trace, unservable = _servable(trace, m, eng, [machines[n] for n in (token_hardware or names)] if split
                                  else [machines[n] for n in names], tp)
    reference = None
    if profile.reference is not None:
        ref_inst = instance(m, profile.reference.hardware, profile.reference.tp, eng)
        if db and db.instance(ref_inst).rows is not None:
            ref_inst = db.instance(ref_inst)
        reference = reference_latencies(ref_inst, trace.prompt_tokens, trace.output_tokens)
    problem = Problem(trace, profile, reference, max_batch_tokens, objective, max_cost_per_hour, max_power_kw,
                      tuple(sorted((max_machines or {}).items())), solver)

    def make(hw, t):  # measured timing where --perf-db has the group; otherwise skipped with the reason
        inst = Instance(m, hw, eng, t)
        return db.instance(inst) if db else inst

    def tasks(role, allowed, lower=None):
        return [(role, make(machines[name], t), (lower or {}).get((name, t)) or 1)
                for name in sorted(set(allowed)) for t in ([tp] if tp else machines[name].tp_degrees())
                if t in machines[name].tp_degrees()]

    prompt_names = prompt_hardware or names
    first = _size_all(problem, tasks("prompt", set(names) | set(prompt_names))
                      + (tasks("token", token_hardware or names) if split else []), jobs)
    # A co-located pool carries the prompt load and more: the prompt pool's count of the
    # same (machine, TP) bounds its size from below, which shortens its search.
    lower = {(o.inst.hardware.name, o.inst.tp): o.instances for o in first if o.role == "prompt"}
    mixed = _size_all(problem, tasks("mixed", names, lower), jobs) if with_colocated or not split else []
    if not split:
        plan = colocated_plan(problem, mixed)
        others = []
        for name in sorted({o.inst.hardware.name for o in mixed} - {p.hardware for p in plan.mixed_pools}):
            try:  # the best co-located plan of each other machine type
                others.append(colocated_plan(problem, [o for o in mixed if o.inst.hardware.name == name]))
            except InfeasibleError:
                continue
        others.sort(key=lambda p: _plan_key(objective, p))
        return OptimizeResult(plan, tuple(others[:alternatives]), tuple(mixed), plan, unservable=unservable, problem=problem)
    prompt_types = {machines[n].name for n in prompt_names}  # names may be paths: compare the loaded names
    options = [o for o in first if o.role == "token" or o.inst.hardware.name in prompt_types]
    _raise_if_unreachable(problem, options)
    plan, alts = _best_split(problem, options, search, alternatives)
    try:
        colocated = colocated_plan(problem, mixed) if mixed else None
    except InfeasibleError:
        colocated = None
    shown = alts[: alternatives - 1] + ([colocated] if colocated else [])
    front = ()
    if pareto:
        by_key = {o.key: o for o in options + mixed}
        front = tuple(dataclasses.replace(p, max_rate_rps=_plan_max_rate(problem, p, by_key))
                      for p in _pareto(problem, options, [plan, *alts, *([colocated] if colocated else [])]))
    return OptimizeResult(plan, tuple(sorted(shown, key=lambda p: _plan_key(objective, p))), tuple(options + mixed),
                          colocated, pareto=front, unservable=unservable, problem=problem)


def _servable(trace, model, engine, token_machines, tp):
    """The trace without requests whose KV (prompt + output tokens) no token instance
    can hold, and a report of that request class (None when every request fits)."""
    best = None
    for hw in token_machines:
        for t in ([tp] if tp else hw.tp_degrees()):
            if t in hw.tp_degrees():
                fit = Instance(model, hw, engine, t).fit
                if fit.fits and (best is None or fit.kv_capacity_tokens > best[0]):
                    best = (fit.kv_capacity_tokens, hw.name, t)
    if best is None:
        return trace, None  # nothing fits at all: the sizing says why
    too_long = trace.prompt_tokens + trace.output_tokens > best[0]
    if not too_long.any():
        return trace, None
    report = {
        "requests": int(too_long.sum()),
        "share_pct": float(too_long.mean() * 100),
        "min_prompt_tokens": int(trace.prompt_tokens[too_long].min()),
        "max_prompt_tokens": int(trace.prompt_tokens[too_long].max()),
        "reason": f"prompt + output tokens exceed the KV capacity of every token instance considered "
                  f"(largest: {best[0]:,} tokens, {best[1]} at TP {best[2]}); they are left out of the sizing",
    }
    if too_long.all():
        raise InfeasibleError(f"no request fits: {report['reason']}")
    keep = ~too_long
    return dataclasses.replace(trace, arrival_s=trace.arrival_s[keep] - trace.arrival_s[keep][0],
                               prompt_tokens=trace.prompt_tokens[keep], output_tokens=trace.output_tokens[keep]), report


def _pareto(problem, options, seeds: list) -> tuple:
    """Cost against power: the epsilon-constraint method on the ILP (cheapest plan
    under a power cap, the cap lowered below each plan found until none is
    feasible), every plan verified and repaired on the whole trace; then the
    plans no other beats on both. `seeds` (plans already found, the co-located
    one among them) join the set."""
    from dataclasses import replace as _replace

    from splitplan.report import pareto as frontier
    from splitplan.search.plan import make_plan, repair, solve_counts

    by_key = {o.key: o for o in options}
    plans, memo = list(seeds), {}
    cost_problem = _replace(problem, objective="cost")
    cap = None
    for _ in range(50):
        try:
            counts = solve_counts(_replace(cost_problem, max_power_kw=cap) if cap is not None else cost_problem, options)
        except InfeasibleError:
            break
        try:
            counts, values, lines, repairs = repair(cost_problem, counts, by_key, memo=memo)
        except InfeasibleError:  # no repair verifies this mix: look below its power all the same
            next_cap = sum(by_key[k].power_kw * c for k, c in counts.items()) - 1e-6
        else:
            found = make_plan(cost_problem, counts, by_key, repairs, values, lines)
            plans.append(found)
            next_cap = found.power_kw - 1e-6
        if problem.max_power_kw is not None:
            next_cap = min(next_cap, problem.max_power_kw)
        if cap is not None and next_cap >= cap:
            break
        cap = next_cap
    unique = {(p.prompt_pools, p.token_pools, p.mixed_pools): p for p in plans}
    return tuple(frontier(list(unique.values())))


def _plan_max_rate(problem, plan, by_key) -> float | None:
    """The highest request rate these machines serve under the SLO: the trace's
    timestamps compressed (or stretched), bisected to 2 %, each rate checked with the
    whole-trace evaluation the plans were verified with."""
    from dataclasses import replace as _replace

    from splitplan.search.plan import check, evaluate, plan_counts

    trace = problem.trace
    counts = plan_counts(plan)
    if trace.span_s <= 0 or any(key not in by_key for key in counts) or (plan.mixed_pools and len(counts) != 1):
        return None
    base = trace.mean_rate_rps

    def serves(rate):
        scaled = _replace(problem, trace=_replace(trace, arrival_s=trace.arrival_s * (base / rate)))
        values = evaluate(scaled, counts, by_key)
        return values["kv_peak_fraction"] <= 1 and all(ok for _, _, ok in check(scaled, values))

    lo, hi = base, None
    for _ in range(12):  # bracket: double until a rate fails
        if not serves(lo * 2):
            hi = lo * 2
            break
        lo *= 2
    if hi is None:
        return lo
    while hi / lo > 1.02:
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if serves(mid) else (lo, mid)
    return lo


def _size_one(problem, task):
    from splitplan.search.plan import size_option
    return size_option(problem, *task)


def _size_all(problem, tasks: list, jobs: int) -> list:
    """Size every (role, instance, lower bound) task, in `jobs` processes."""
    from splitplan.parallel import run_units
    return run_units(_size_one, tasks, problem, jobs)


def max_rate(workload_at, base_rate_rps: float, model: str, slo: str, progress=None, **kwargs) -> OptimizeResult:
    """The highest request rate a plan within the budget serves under the SLO
    (Splitwise's iso-power / iso-cost scenarios), and the cheapest such plan.

    `workload_at(rate)` gives the trace at a rate (a Poisson resample, or the
    trace's timestamps compressed). The rate is bracketed by doubling or halving
    from `base_rate_rps`, then bisected to 2 %; each step asks whether a
    cost-minimal split plan exists within the budget. `progress(rate, ok)` is
    called after each step.
    """
    if kwargs.get("max_cost_per_hour") is None and kwargs.get("max_power_kw") is None and not kwargs.get("max_machines"):
        raise SpecError("--objective throughput needs a budget: --max-cost-per-hour, --max-power-kw or --max-machines TYPE=N")

    def attempt(rate):
        try:
            result = optimize(workload_at(rate), model, slo, alternatives=0, with_colocated=False, **kwargs)
        except InfeasibleError:
            result = None
        if progress:
            progress(rate, result is not None)
        return result

    rate = base_rate_rps
    result = attempt(rate)
    if result is not None:
        lo, lo_result, hi = rate, result, None
        while hi is None and rate < base_rate_rps * 4096:
            rate *= 2
            result = attempt(rate)
            if result is None:
                hi = rate
            else:
                lo, lo_result = rate, result
    else:
        hi, lo = rate, None
        while lo is None and rate > base_rate_rps / 4096:
            rate /= 2
            result = attempt(rate)
            if result is not None:
                lo, lo_result = rate, result
        if lo is None:
            raise InfeasibleError(f"no plan within the budget meets the SLO even at {rate:.3g} req/s")
    while hi is not None and hi / lo > 1.02:
        mid = (lo * hi) ** 0.5
        result = attempt(mid)
        if result is None:
            hi = mid
        else:
            lo, lo_result = mid, result
    plan = lo_result.plan
    if hi is not None:
        plan = dataclasses.replace(plan, binding=f"{plan.binding}; rate: at {hi:.3g} req/s no plan fits the budget")
    return OptimizeResult(plan, lo_result.alternatives, lo_result.options, None, lo)


def _plan_key(objective: str, plan) -> tuple:
    first, second = (plan.cost_usd_per_hour, plan.power_kw) if objective == "cost" else (plan.power_kw, plan.cost_usd_per_hour)
    return (first, second, plan.machines, repr(plan.prompt_pools + plan.token_pools + plan.mixed_pools))


def _best_split(problem, options, search: str, alternatives: int):
    """Candidates: the ILP's (or grid's) plan, and the best homogeneous plan of every
    (prompt, token) hardware pair; each is verified and repaired on the whole trace,
    and the best verified one wins. The rest are the runner-ups."""
    from splitplan.search.plan import make_plan, repair, solve_counts

    by_key = {o.key: o for o in options}
    candidates = [solve_counts(problem, options, search)]
    usable = [o for o in options if o.instances and o.role in ("prompt", "token")]
    pairs = sorted(
        ((p, t) for p in usable if p.role == "prompt" for t in usable if t.role == "token"),
        key=lambda pt: (_objective(problem.objective, pt[0]) * pt[0].machines_alone
                        + _objective(problem.objective, pt[1]) * pt[1].machines_alone, pt[0].key, pt[1].key),
    )
    seen_pairs = set()
    for p, t in pairs:
        pair = (p.inst.hardware.name, t.inst.hardware.name)
        if pair not in seen_pairs and len(seen_pairs) < alternatives + 1:
            seen_pairs.add(pair)
            candidates.append({p.key: p.machines_alone, t.key: t.machines_alone})
    plans, memo, failures = [], {}, []
    for counts in candidates:
        try:
            counts, values, lines, repairs = repair(problem, counts, by_key, memo=memo)
            plans.append(make_plan(problem, counts, by_key, repairs, values, lines))
        except InfeasibleError as exc:  # a candidate that no repair verifies is dropped
            failures.append(exc)
    if not plans:
        raise failures[0]
    plans.sort(key=lambda p: _plan_key(problem.objective, p))
    plan, alts = plans[0], []
    for other in plans[1:]:
        if other.prompt_pools + other.token_pools != plan.prompt_pools + plan.token_pools and other not in alts:
            alts.append(other)
    return plan, alts


def _objective(objective: str, option) -> float:
    return option.price_usd_per_hour if objective == "cost" else option.power_kw


def _raise_if_unreachable(problem, options) -> None:
    """Exit 3 naming the line no hardware can meet, the best value reachable and where."""
    from splitplan.capacity.pools import achieved, meets
    from splitplan.search.plan import alone_latencies
    for role, metric in (("prompt", "ttft"), ("token", "tbt")):
        fitting = [o for o in options if o.role == role and o.inst.fit.fits]
        if not fitting:
            reasons = "; ".join(sorted({o.skipped for o in options if o.role == role})) or "no option of that role"
            raise InfeasibleError(f"the model fits no {role} hardware considered: {reasons}")
        if any(o.instances for o in fitting):
            continue
        for line in (x for x in problem.slo.lines() if x.metric == metric):
            best = None
            for o in fitting:
                value = achieved(line, alone_latencies(o.inst, problem.trace)[metric], problem.reference)
                if best is None or value < best[0]:
                    best = (value, o)
            if best and not meets(line, best[0]):
                unit = " ms" if line.max_ms is not None else "x"
                raise InfeasibleError(
                    f"{line.label} {line.target} cannot be met: the best reachable is {best[0]:.3g}{unit} "
                    f"on {best[1].inst.hardware.name} at TP {best[1].inst.tp}, running requests alone")
        raise InfeasibleError(f"no {role} option meets the SLO: " + "; ".join(f"{o.inst.hardware.name} TP{o.inst.tp}: {o.skipped}" for o in fitting))


# --- simulate -------------------------------------------------------------------------

@dataclass(frozen=True)
class SimulateResult:
    result: "SimResult"
    summary: dict
    pools: tuple

    def to_json(self) -> dict:
        from splitplan.report import SCHEMA_VERSION
        return {"schema_version": SCHEMA_VERSION, "summary": self.summary}

    def to_frame(self):
        """One row per request (the `requests.csv` columns)."""
        import io

        import pandas as pd

        from splitplan.sim.metrics import requests_csv
        return pd.read_csv(io.StringIO(requests_csv(self.result, self.result.names)))


def pool_specs(pools: list[tuple[str, str, int, int]], model: str, engine: str = DEFAULT_ENGINE, perf_db: str | None = None,
               perf_interp: str = "splitplan"):
    """(role, hardware, tp, machines) -> PoolSpecs with analytic or measured instances
    (`perf_interp`: how the measured table is read, see perf.table.INTERPOLATIONS)."""
    from splitplan.perf.table import load_perf_db
    from splitplan.sim.cluster import PoolSpec
    db = load_perf_db(perf_db) if perf_db else None
    out = []
    for role, hw, tp, machines in pools:
        if machines < 1:
            raise SpecError(f"--{role}-pool {hw}:{tp}:{machines}: machines must be >= 1")
        inst = instance(model, hw, tp, engine)
        out.append(PoolSpec(role, db.require(inst, perf_interp) if db else inst, machines))
    return out


def simulate(trace, pools: list[tuple[str, str, int, int]], model: str, slo: str, engine: str = DEFAULT_ENGINE,
             perf_db: str | None = None, max_batch_tokens: int = 2048, routing: str = "jsq",
             borrow_threshold_tokens: int | None = None, perf_interp: str = "splitplan",
             concurrency: int | None = None) -> SimulateResult:
    """Replay `trace` through the cluster request by request (sim.cluster) and summarize.
    With `concurrency`, a closed loop of that many clients (workload.closed_loop_workload
    makes its requests); the trace's timestamps are ignored."""
    from splitplan.capacity.pools import reference_latencies
    from splitplan.sim.cluster import SimOptions, simulate as run
    from splitplan.sim.metrics import summarize_result
    from splitplan.specs.slo import load_slo

    roles = {r for r, *_ in pools}
    if not ({"prompt", "token"} <= roles or "mixed" in roles) or ("mixed" in roles and len(roles) > 1):
        raise SpecError("give prompt and token pools (split), or mixed pools (co-located), not a mix of both")
    if routing not in ("jsq", "round-robin"):
        raise SpecError(f"--routing {routing}: choose jsq or round-robin")
    profile = load_slo(slo)
    specs = pool_specs(pools, model, engine, perf_db, perf_interp)
    reference = None
    if profile.reference is not None:
        ref = instance(model, profile.reference.hardware, profile.reference.tp, engine)
        if perf_db:
            from splitplan.perf.table import load_perf_db
            measured = load_perf_db(perf_db).instance(ref, perf_interp)
            ref = measured if measured.rows is not None else ref
        reference = reference_latencies(ref, trace.prompt_tokens, trace.output_tokens)
    result = run(trace, specs, SimOptions(max_batch_tokens, routing, borrow_threshold_tokens, concurrency))
    return SimulateResult(result, summarize_result(result, specs, profile, reference), tuple(specs))


def plan_from_pools(pools: list[tuple[str, str, int, int]], **fields) -> "Plan":
    """A Plan holding these (role, hardware, tp, machines) pools, priced from the catalog."""
    from splitplan.search.plan import Plan, Pool
    by_role = {role: tuple(Pool(h, t, m) for r, h, t, m in pools if r == role) for role in ("prompt", "token", "mixed")}
    cost = sum(load_hardware(h).price_usd_per_hour * m for _, h, _, m in pools)
    power = sum(load_hardware(h).provisioned_power_w / 1e3 * m for _, h, _, m in pools)
    return Plan(by_role["prompt"], by_role["token"], by_role["mixed"], cost, power, **fields)


def plan_pools(plan) -> list[tuple[str, str, int, int]]:
    return ([("prompt", p.hardware, p.tp, p.machines) for p in plan.prompt_pools]
            + [("token", p.hardware, p.tp, p.machines) for p in plan.token_pools]
            + [("mixed", p.hardware, p.tp, p.machines) for p in plan.mixed_pools])


def validate(plan, trace, model: str, slo: str, engine: str = DEFAULT_ENGINE, perf_db: str | None = None,
             max_batch_tokens: int = 2048, limit: int = 30, planned: OptimizeResult | None = None):
    """Simulate the plan; while a line fails, grow the pool that binds (TTFT: prompt;
    TBT: token; E2E: the side with the larger median share; co-located: the mixed
    pool) by one machine of its cheapest-per-capacity type and simulate again.
    With `planned` (the OptimizeResult the plan came from), a grown plan carries the
    planner's prediction for its new machines, so the two stay comparable.
    Returns (plan, SimulateResult, machines added)."""
    pools = [list(p) for p in plan_pools(plan)]
    for added in range(limit + 1):
        sim = simulate(trace, [tuple(p) for p in pools], model, slo, engine, perf_db, max_batch_tokens)
        failed = [s for s in sim.summary["slo"] if not s["met"]]
        if not failed:
            break
        if added == limit:
            raise InfeasibleError(f"the simulated plan still misses {failed[0]['line']} after {limit} added machines")
        metric = failed[0]["line"].split()[0].lower()
        r = sim.result
        if any(p[0] == "mixed" for p in pools):
            role = "mixed"
        elif metric == "ttft":
            role = "prompt"
        elif metric == "tbt":
            role = "token"
        else:
            role = "prompt" if np.nanmedian(r.ttft_s) > np.nanmedian(r.e2e_s - r.ttft_s) else "token"
        grow = min((p for p in pools if p[0] == role), key=lambda p: (load_hardware(p[1]).price_usd_per_hour / p[2], p[1]))
        grow[3] += 1
    if added:
        plan = plan_from_pools([tuple(p) for p in pools], predicted=plan.predicted, slo=plan.slo, repairs=plan.repairs,
                               binding=f"{plan.binding}; simulation: {added} machine(s) added")
        if planned is not None and planned.problem is not None:
            from splitplan.search.plan import predict
            plan = predict(planned.problem, plan, {o.key: o for o in planned.options})
    return plan, sim, added


# --- calibrate ------------------------------------------------------------------------

@dataclass(frozen=True)
class CalibrateResult:
    profile: EngineProfile
    report: dict  # {"groups": [...], "overall": {...}}
    points: "object"  # DataFrame: every point used, with before_ms, fit_ms, cv_ms
    excluded: "object"  # DataFrame: points left out, with the reason

    def to_json(self) -> dict:
        return self.report

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.report["groups"])


def calibrate(perf_db: str, engine: str = DEFAULT_ENGINE, folds: int = 5, max_prefill_batch_tokens: int | None = None,
              keep_anomalies: bool = False, progress=None, jobs: int = 1) -> CalibrateResult:
    """Fit `engine`'s factors to the measurements in `perf_db`; report MAPE before,
    fitted and k-fold cross-validated. Non-physical points (see
    `measurements.flag_anomalies`) and, with `max_prefill_batch_tokens`, batched
    prefills beyond that size are left out and listed."""
    import pandas as pd

    from splitplan.errors import SpecError as _SpecError
    from splitplan.perf import calibrate as cal
    from splitplan.perf.measurements import flag_anomalies, read_measurements

    if folds < 0 or folds == 1:
        raise _SpecError(f"--folds {folds}: use 0 (no cross-validation) or k >= 2")
    base = load_engine(engine)
    points = read_measurements(perf_db)
    if points.empty:
        raise _SpecError(f"{perf_db}: no measurement rows; add rows under the header")
    for model, hardware, tp in sorted(set(zip(points.model, points.hardware, points.tp))):
        fit = Instance(load_model(model), load_hardware(hardware), base, int(tp)).fit  # unknown names fail here, with a suggestion
        if not fit.fits:
            raise _SpecError(f"{perf_db}: rows of {model} on {hardware} at TP {tp}: {fit.reason}; fix or remove those rows"
                             + (", or start from an fp8 engine if the runs used fp8 (--engine lean-fp8)"
                                if "weights need" in fit.reason and base.dtype == "bf16" else ""))
    reasons = pd.Series("", index=points.index)
    if not keep_anomalies:
        reasons[flag_anomalies(points)] = "faster than a smaller batch of the same sweep (failed run)"
    if max_prefill_batch_tokens is not None:
        big = (points.phase == "prefill") & (points.batch > 1) & (points.batch * points.prompt_tokens > max_prefill_batch_tokens)
        reasons[big & (reasons == "")] = f"batched prefill above {max_prefill_batch_tokens} tokens"
    used = points[reasons == ""].reset_index(drop=True)
    excluded = points[reasons != ""].assign(reason=reasons[reasons != ""]).reset_index(drop=True)
    if used.empty:
        raise _SpecError(f"{perf_db}: no points left to fit after exclusions")
    result = cal.calibrate(used, base, folds, progress, jobs)
    summary = cal.report(result)
    provenance = {
        "data": str(perf_db),
        "points": len(used),
        "excluded": {reason: int(n) for reason, n in excluded.reason.value_counts().sort_index().items()},
        "method": "splitplan calibrate: scipy least_squares, soft-L1 on log(predicted/measured); all factors on all "
                  "points, then efficiencies and overheads per (model, machine, TP); physical bounds",
        "folds": folds,
        "mape_pct": {phase: {k: v for k, v in figures.items() if k != "points"} for phase, figures in summary["overall"].items()},
    }
    profile = result.profile.model_copy(update={"fit": provenance})
    return CalibrateResult(profile, summary, result.points, excluded)


@dataclass(frozen=True)
class DeploymentCalibration:
    profile: EngineProfile
    table: "object"  # DataFrame: per (machine, concurrency band) and overall, MAPE and median error %
    runs: "object"  # DataFrame: every run used, with fit and held-out predictions (ms)
    dropped: dict  # rows of the file left out, by reason

    def to_json(self) -> dict:
        return {"groups": self.table.to_dict("records"), "dropped": self.dropped, "fit": self.profile.fit}


def calibrate_deployments(path: str, backend: str, engine: str = "lean-fp8", folds: bool = True, jobs: int = 1,
                          progress=None) -> DeploymentCalibration:
    """Fit `engine`'s engine-wide factors to measured whole deployments of one serving
    engine (`backend`), each run replayed as a closed loop (perf.deployments); report
    TTFT and TPOT error per machine and concurrency band, fitted and held out (folds by
    machine, or by concurrency band when the runs hold one machine)."""
    from splitplan.perf import deployments as dep

    runs, dropped = dep.read_deployments(path)
    mine = runs[runs.engine == backend].reset_index(drop=True)
    if mine.empty:
        raise SpecError(f"{path}: no run of backend '{backend}' that the catalog can model; "
                        f"the file has: {', '.join(sorted(runs.engine.unique())) or 'none'}")
    base = load_engine(engine)
    if set(mine.precision) != {base.dtype}:
        raise SpecError(f"{path}: the {backend} runs are {', '.join(sorted(set(mine.precision)))} and --engine {engine} is "
                        f"{base.dtype}; start from a profile of that precision (e.g. --engine lean-fp8)")
    fitted = dep.fit_deployments(mine, base, jobs=jobs)
    if progress:
        progress()
    predicted = dep.predict(mine, fitted, jobs)
    by = dep.fold_column(mine)
    held = dep.cross_validate(mine, base, by, jobs, progress) if folds else None
    table = dep.error_table(mine, predicted, held)
    overall = table.iloc[-1].to_dict()
    profile = fitted.model_copy(update={
        "name": backend, "description": f"{backend} ({base.dtype}) as measured in whole serving runs; fitted by splitplan "
                                        f"calibrate --deployments from {base.name}", "fit": {
            "data": str(path), "engine": backend, "runs": len(mine), "folds": f"by {by}" if folds else None,
            "method": "splitplan calibrate --deployments: each run replayed as a closed loop by the simulator; "
                      "scipy least_squares, soft-L1 on log(simulated/measured) mean TTFT and TPOT; engine-wide factors "
                      f"({', '.join(dep.DEPLOYMENT_FACTORS)}) within physical bounds",
            "mape_pct": {k: v for k, v in overall.items() if k.endswith("_pct")},
        }})
    runs_out = mine.assign(fit_ttft_ms=predicted[:, 0], fit_tpot_ms=predicted[:, 1])
    if held is not None:
        runs_out = runs_out.assign(cv_ttft_ms=held[:, 0], cv_tpot_ms=held[:, 1])
    return DeploymentCalibration(profile, table, runs_out, dropped)


# --- design studies -------------------------------------------------------------------

SCENARIOS = ("iso-power", "iso-cost", "iso-throughput-cost", "iso-throughput-power")


@dataclass(frozen=True)
class DesignResult:
    design: str
    plan: "Plan | None"
    max_rate_rps: float | None
    error: str = ""
    simulated: dict | None = None

    def row(self) -> dict:
        p = self.plan

        def machines(pools):
            return sum(x.machines for x in pools) if p else None

        return {
            "design": self.design,
            "prompt_machines": machines(p.prompt_pools) if p else None,
            "token_machines": machines(p.token_pools) if p else None,
            "mixed_machines": machines(p.mixed_pools) if p else None,
            "cost_usd_per_hour": p.cost_usd_per_hour if p else None,
            "power_kw": p.power_kw if p else None,
            "max_rate_rps": self.max_rate_rps,
            "binding": p.binding if p else None,
            "error": self.error or None,
        }


@dataclass(frozen=True)
class CompareResult:
    scenario: str
    designs: tuple  # DesignResult, in the designs file's order
    baseline: str
    budget: dict

    def ratio(self, result: DesignResult) -> float | None:
        """Against the baseline: max rate (throughput scenarios), cost or power (iso-throughput)."""
        base = next(r for r in self.designs if r.design == self.baseline)
        if result.plan is None or base.plan is None:
            return None
        if self.scenario in ("iso-power", "iso-cost"):
            return result.max_rate_rps / base.max_rate_rps
        attr = "cost_usd_per_hour" if self.scenario == "iso-throughput-cost" else "power_kw"
        return getattr(result.plan, attr) / getattr(base.plan, attr)

    def to_json(self) -> dict:
        from splitplan.report import SCHEMA_VERSION
        rows = [{**r.row(), "ratio_to_baseline": self.ratio(r),
                 **({"simulated": r.simulated} if r.simulated is not None else {})} for r in self.designs]
        return {"schema_version": SCHEMA_VERSION, "scenario": self.scenario, "baseline": self.baseline,
                "budget": self.budget, "designs": rows}

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame([{**r.row(), "ratio_to_baseline": self.ratio(r)} for r in self.designs])


def _design_unit(shared, design):
    """One design in one scenario (a picklable work unit)."""
    scenario, workload, workload_at, base_rate, model, slo, kwargs, validate_plans = shared
    common = dict(hardware=design.hardware, prompt_hardware=[design.prompt] if design.prompt else None,
                  token_hardware=[design.token] if design.token else None, tp=design.tp, split=design.split, **kwargs)
    try:
        if scenario in ("iso-power", "iso-cost"):
            result = max_rate(workload_at, base_rate, model, slo, **common)
            rate, trace = result.max_rate_rps, workload_at(result.max_rate_rps)
        else:
            objective = "cost" if scenario == "iso-throughput-cost" else "power"
            result = optimize(workload, model, slo, objective=objective, alternatives=0, with_colocated=False, **common)
            rate, trace = base_rate, workload  # the trace's own rate, or the --rate resampled at
    except InfeasibleError as exc:
        return DesignResult(design.name, None, None, str(exc))
    simulated = None
    if validate_plans:
        sim = simulate(trace, plan_pools(result.plan), model, slo, kwargs.get("engine", DEFAULT_ENGINE),
                       kwargs.get("perf_db"), kwargs.get("max_batch_tokens", 2048))
        simulated = {"slo_met": all(x["met"] for x in sim.summary["slo"]),
                     **{k: sim.summary[k] for k in ("ttft_ms", "tbt_ms", "e2e_ms")}}
    return DesignResult(design.name, result.plan, rate, "", simulated)


def compare(trace, designs: str, scenario: str, model: str = "llama2-70b", slo: str = "splitwise",
            engine: str = DEFAULT_ENGINE, budget_machines: dict[str, int] | None = None,
            max_power_kw: float | None = None, max_cost_per_hour: float | None = None, rate: float | None = None,
            duration_s: float = 120.0, seed: int = 0, baseline: str | None = None, validate: bool = False,
            perf_db: str | None = None, max_batch_tokens: int = 2048, jobs: int = 1, progress=None,
            executor: str = "local", ray_address: str | None = None) -> CompareResult:
    """Splitwise's provisioning study as one call: every design of `designs` in `scenario`.

    iso-power / iso-cost: the highest rate each design serves within the budget
    (`max_power_kw`, `max_cost_per_hour`, or `budget_machines` TYPE=N, read as the
    power or the cost of N such machines); every rate tried is a Poisson resample of
    the trace's sizes for `duration_s`. iso-throughput-cost / -power: the cheapest or
    lowest-power plan of each design at the trace's own rate (or its resample at `rate`).
    """
    from splitplan.parallel import run_units
    from splitplan.specs.design import load_designs
    from splitplan.workload.trace import resample_poisson

    if scenario not in SCENARIOS:
        raise SpecError(f"--scenario {scenario}: choose one of {', '.join(SCENARIOS)}")
    spec = load_designs(designs)
    base_name = baseline or spec.designs[0].name
    spec.get(base_name)
    budget = {}
    if scenario in ("iso-power", "iso-cost"):
        given = [x for x in (budget_machines, max_power_kw, max_cost_per_hour) if x]
        if len(given) != 1:
            raise SpecError(f"--scenario {scenario} needs exactly one budget: --budget-machines TYPE=N, --max-power-kw or --max-cost-per-hour")
        if budget_machines:
            if len(budget_machines) != 1:
                raise SpecError("--budget-machines takes one TYPE=N (the budget is the power or cost of N such machines)")
            (hw, n), = budget_machines.items()
            spec_hw = load_hardware(hw)
            if scenario == "iso-power":
                max_power_kw = n * spec_hw.provisioned_power_w / 1e3
            else:
                max_cost_per_hour = n * spec_hw.price_usd_per_hour
        if scenario == "iso-power" and max_power_kw is None or scenario == "iso-cost" and max_cost_per_hour is None:
            raise SpecError(f"--scenario {scenario}: give the budget as {'--max-power-kw' if scenario == 'iso-power' else '--max-cost-per-hour'} or --budget-machines")
        budget = {"max_power_kw": max_power_kw} if scenario == "iso-power" else {"max_cost_per_hour": max_cost_per_hour}
    kwargs = dict(engine=engine, perf_db=perf_db, max_batch_tokens=max_batch_tokens, **budget)
    base_rate = rate or trace.mean_rate_rps
    workload = resample_poisson(trace, rate, duration_s, np.random.default_rng(seed)) if rate else trace
    workload_at = functools.partial(_resampled, trace, duration_s, seed)
    shared = (scenario, workload, workload_at, base_rate, model, slo, kwargs, validate)
    results = run_units(_design_unit, list(spec.designs), shared, jobs, executor, ray_address, progress,
                        describe=lambda d: f"design {d.name}")
    return CompareResult(scenario, tuple(results), base_name, budget)


def _resampled(trace, duration_s, seed, rate):
    from splitplan.workload.trace import resample_poisson
    return resample_poisson(trace, rate, duration_s, np.random.default_rng(seed))


@dataclass(frozen=True)
class SweepResult:
    rows: tuple  # one dict per (design or plan, rate)
    mode: str  # "designs" (cheapest plan per rate, predicted) or "plan" (fixed plan, simulated)

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(list(self.rows))

    def to_json(self) -> dict:
        from splitplan.report import SCHEMA_VERSION
        return {"schema_version": SCHEMA_VERSION, "mode": self.mode, "rows": list(self.rows)}


def _sweep_row(name, rate, plan, metrics: dict, trace, slo_met: bool, error: str = "") -> dict:
    hours = max(trace.span_s, 1e-9) / 3600
    out_tokens = float(trace.output_tokens.sum())
    all_tokens = out_tokens + float(trace.prompt_tokens.sum())
    row = {"design": name, "rate_rps": rate, "error": error or None}
    if plan is not None:
        cost = plan.cost_usd_per_hour
        row.update({
            "prompt_machines": sum(p.machines for p in plan.prompt_pools),
            "token_machines": sum(p.machines for p in plan.token_pools),
            "mixed_machines": sum(p.machines for p in plan.mixed_pools),
            "cost_usd_per_hour": cost, "power_kw": plan.power_kw,
            "cost_per_million_tokens_usd": cost * hours / all_tokens * 1e6,
            "cost_per_million_output_tokens_usd": cost * hours / out_tokens * 1e6,
        })
    for metric in ("ttft", "tbt", "e2e"):
        for q in ("p50", "p90", "p99"):
            row[f"{metric}_{q}_ms"] = metrics.get(metric, {}).get(q) if metrics else None
    row["slo_met"] = slo_met if plan is not None else None
    return row


def _sweep_unit(shared, unit):
    mode, base, duration_s, seed, model, slo, kwargs, pools = shared
    name, design, rate = unit
    trace = _resampled(base, duration_s, seed, rate)
    if mode == "plan":
        sim = simulate(trace, pools, model, slo, kwargs.get("engine", DEFAULT_ENGINE), kwargs.get("perf_db"),
                       kwargs.get("max_batch_tokens", 2048))
        plan = plan_from_pools(pools)
        metrics = {m: sim.summary[f"{m}_ms"] for m in ("ttft", "tbt", "e2e")}
        return _sweep_row(name, rate, plan, metrics, trace, all(x["met"] for x in sim.summary["slo"]))
    try:
        result = optimize(trace, model, slo, hardware=design.hardware, prompt_hardware=[design.prompt] if design.prompt else None,
                          token_hardware=[design.token] if design.token else None, tp=design.tp, split=design.split,
                          alternatives=0, with_colocated=False, **kwargs)
    except InfeasibleError as exc:
        return _sweep_row(name, rate, None, {}, trace, False, str(exc))
    return _sweep_row(name, rate, result.plan, result.plan.predicted, trace, all(ok for _, _, ok in result.plan.slo))


def sweep(trace, rates: list[float], model: str = "llama2-70b", slo: str = "splitwise", designs: str | None = None,
          only: list[str] | None = None, pools: list[tuple[str, str, int, int]] | None = None,
          engine: str = DEFAULT_ENGINE, objective: str = "cost", duration_s: float = 120.0, seed: int = 0,
          perf_db: str | None = None, max_batch_tokens: int = 2048, jobs: int = 1, progress=None,
          executor: str = "local", ray_address: str | None = None) -> SweepResult:
    """A load sweep. With `designs`: the cheapest (or lowest-power) plan of each design
    at each rate, with its predicted percentiles and cost per million tokens. With
    `pools`: one fixed plan simulated at each rate (latency against load). Every rate
    is a Poisson resample of the trace's sizes for `duration_s`."""
    from splitplan.parallel import run_units
    from splitplan.specs.design import load_designs
    if not rates or any(r <= 0 for r in rates):
        raise SpecError("--rates: give one or more rates > 0 (e.g. 5,10,20 or 5:80:16)")
    if (designs is None) == (pools is None):
        raise SpecError("sweep designs (--designs) or one plan (--plan / --prompt-pool ...), not both or neither")
    kwargs = dict(engine=engine, perf_db=perf_db, max_batch_tokens=max_batch_tokens)
    if designs is not None:
        spec = load_designs(designs)
        chosen = [spec.get(n) for n in only] if only else list(spec.designs)
        units = [(d.name, d, r) for d in chosen for r in rates]
        kwargs["objective"] = objective
        mode = "designs"
    else:
        pool_specs(pools, model, engine, perf_db)  # validate before forking
        units = [("plan", None, r) for r in rates]
        mode = "plan"
    rows = run_units(_sweep_unit, units, (mode, trace, duration_s, seed, model, slo, kwargs, pools), jobs, executor,
                     ray_address, progress, describe=lambda u: f"{u[0]} at {u[2]:g} req/s")
    return SweepResult(tuple(rows), mode)


# --- per-window planning and parallel validation ----------------------------------------

@dataclass(frozen=True)
class WindowsResult:
    """One plan per window of a timestamped trace, and the plan for the peak window."""

    window_s: float
    rows: tuple  # dicts: window, start_s, end_s, requests, rate_rps, plan fields or error
    plans: tuple  # Plan or None per window

    @property
    def peak(self) -> int | None:
        costs = [p.cost_usd_per_hour if p else -1 for p in self.plans]
        return int(np.argmax(costs)) if any(c >= 0 for c in costs) else None

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(list(self.rows))

    def to_json(self) -> dict:
        from splitplan.report import SCHEMA_VERSION, plan_json
        planned = [p.cost_usd_per_hour for p in self.plans if p]
        peak = self.peak
        return {"schema_version": SCHEMA_VERSION, "window_s": self.window_s, "windows": list(self.rows),
                "peak_window": peak, "peak_plan": plan_json(self.plans[peak]) if peak is not None else None,
                "mean_cost_usd_per_hour": float(np.mean(planned)) if planned else None}


def _window_unit(shared, unit):
    model, slo, options = shared
    index, start_s, trace = unit
    row = {"window": index, "start_s": start_s, "end_s": start_s + float(trace.arrival_s[-1]),
           "requests": len(trace), "rate_rps": trace.mean_rate_rps if trace.span_s > 0 else None}
    try:
        plan = optimize(trace, model, slo, alternatives=0, with_colocated=False, **options).plan
    except InfeasibleError as exc:
        return {**row, "error": str(exc)}, None
    return {**row, "prompt_pools": " + ".join(f"{p.machines}x {p.hardware}/tp{p.tp}" for p in plan.prompt_pools),
            "token_pools": " + ".join(f"{p.machines}x {p.hardware}/tp{p.tp}" for p in plan.token_pools),
            "machines": plan.machines, "cost_usd_per_hour": plan.cost_usd_per_hour, "power_kw": plan.power_kw,
            "binding": plan.binding, "error": None}, plan


def plan_windows(trace, window_s: float, model: str, slo: str, jobs: int = 1, executor: str = "local",
                 ray_address: str | None = None, progress=None, **options) -> WindowsResult:
    """Size each `window_s`-second window of a timestamped trace on its own (a work unit
    each): how a cluster that follows the load compares with a static plan for the peak."""
    from splitplan.parallel import run_units
    from splitplan.workload.trace import Trace
    if window_s <= 0:
        raise SpecError(f"--window {window_s:g} s: must be > 0")
    index = np.floor(trace.arrival_s / window_s).astype(np.int64)
    units = []
    for k in np.unique(index):
        mask = index == k
        arrival = trace.arrival_s[mask]
        units.append((len(units), float(k * window_s), Trace(arrival - arrival[0], trace.prompt_tokens[mask],
                                                               trace.output_tokens[mask], f"{trace.source} [window {k}]")))
    outcomes = run_units(_window_unit, units, (model, slo, options), jobs, executor, ray_address, progress,
                         describe=lambda u: f"window {u[0]} from {u[1]:g} s")
    return WindowsResult(window_s, tuple(r for r, _ in outcomes), tuple(p for _, p in outcomes))


def _simulate_unit(shared, pools):
    trace, model, slo, engine, perf_db, max_batch_tokens = shared
    summary = simulate(trace, pools, model, slo, engine, perf_db, max_batch_tokens).summary
    return {"slo_met": all(x["met"] for x in summary["slo"]), **{k: summary[k] for k in ("ttft_ms", "tbt_ms", "e2e_ms")}}


def optimize_closed_loop(workload, concurrency: int, model: str, slo: str, seed: int = 0, progress=None,
                         rounds: int = 4, **kwargs) -> OptimizeResult:
    """The cheapest (or lowest-power) plan meeting the SLO in a closed loop of `concurrency`
    clients (each sending its next request of `workload` when its last one finishes), as
    serving benchmarks load a deployment.

    A closed loop runs at the rate its latency allows: by Little's law `concurrency / mean
    E2E`. The search starts at the highest such rate, every request as fast as the fastest
    instance serves it alone, so the first plan is large enough; it then plans an open loop
    (Poisson, the same requests) at `concurrency / E2E` of the last plan's simulated closed
    loop, and keeps the best plan whose closed-loop simulation met every SLO line. Each
    round is recorded (`closed_loop` in the result)."""
    from splitplan.specs.hardware import hardware_catalog

    m, eng = load_model(model), load_engine(kwargs.get("engine", DEFAULT_ENGINE))
    names = kwargs.get("hardware") or [h.name for h in hardware_catalog()]
    p, o = workload.prompt_tokens.astype(float), workload.output_tokens.astype(float)
    alone = [float(np.mean(inst.prefill_time_s(p) + (o - 1) * inst.decode_step_time_s(1, p + o / 2)))
             for hw in map(load_hardware, names) for t in hw.tp_degrees()
             for inst in [Instance(m, hw, eng, t)] if inst.fit.fits]
    if not alone:
        raise InfeasibleError(f"{m.name} fits no instance of {', '.join(names)}")
    rate, rounds_out, best = concurrency / min(alone), [], None
    key = kwargs.get("objective", "cost")
    for k in range(rounds):
        gaps = np.random.default_rng(seed + k).exponential(1 / rate, len(workload))
        open_loop = dataclasses.replace(workload, arrival_s=np.cumsum(gaps) - gaps[0],
                                        source=f"{workload.source} (open loop at {rate:.3g} req/s)")
        result = optimize(open_loop, model, slo, **kwargs)
        sim = simulate(workload, plan_pools(result.plan), model, slo, kwargs.get("engine", DEFAULT_ENGINE),
                       kwargs.get("perf_db"), kwargs.get("max_batch_tokens", 2048), concurrency=concurrency)
        met = all(line["met"] for line in sim.summary["slo"])
        rounds_out.append({"planned_rate_rps": rate, "plan": _plan_label(result.plan), "cost_usd_per_hour": result.plan.cost_usd_per_hour,
                           "power_kw": result.plan.power_kw, "simulated_rate_rps": sim.summary["throughput_rps"], "slo_met": met})
        if progress:
            progress(rounds_out[-1])
        if met and (best is None or _plan_key(key, result.plan) < _plan_key(key, best[0].plan)):
            best = (result, sim)
        mean_e2e_s = float(np.nanmean(sim.result.e2e_s))
        following = concurrency / mean_e2e_s if np.isfinite(mean_e2e_s) and mean_e2e_s > 0 else rate
        if not met or abs(following - rate) <= 0.02 * rate:
            break
        rate = following
    if best is None:
        missed = ", ".join(line["line"] for line in sim.summary["slo"] if not line["met"])
        raise InfeasibleError(f"no plan met the SLO in a closed loop of {concurrency} clients: the plan for "
                              f"{rounds_out[0]['planned_rate_rps']:.3g} req/s ({rounds_out[0]['plan']}) missed {missed}")
    result, sim = best
    closed = {"concurrency": concurrency, "rounds": rounds_out, "benchmark": sim.summary["benchmark"],
              "slo": sim.summary["slo"], "throughput_rps": sim.summary["throughput_rps"]}
    return dataclasses.replace(result, closed_loop=closed)


def _plan_label(plan) -> str:
    from splitplan.report import plan_text
    return plan_text(plan)


def simulate_plans(plans, trace, model: str, slo: str, engine: str = DEFAULT_ENGINE, perf_db: str | None = None,
                   max_batch_tokens: int = 2048, jobs: int = 1, executor: str = "local", ray_address: str | None = None,
                   progress=None) -> list[dict]:
    """Simulate several plans on the same trace (a work unit each)."""
    from splitplan.parallel import run_units
    return run_units(_simulate_unit, [plan_pools(p) for p in plans], (trace, model, slo, engine, perf_db, max_batch_tokens),
                     jobs, executor, ray_address, progress, describe=lambda pools: f"plan {pools}")
