"""The cheapest (or lowest-power) plan: every pool option sized alone on the trace, an ILP or
exhaustive grid over machine counts, candidates verified and repaired on the whole trace, the
best co-located plan beside it, and the cost-vs-power frontier."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import cast

import numpy as np

from splitplan.base.defaults import DEFAULT_ENGINE
from splitplan.base.errors import InfeasibleError, SpecError, listed, with_details
from splitplan.base.limits import MAX_SPARE_INSTANCES
from splitplan.base.parallel import run_units
from splitplan.perf.points import candidate_layouts, reference_instance, require_tp
from splitplan.perf.roofline import Instance
from splitplan.perf.slo import achieved, alone_latencies, meets, reference_for
from splitplan.perf.table import PerfDb, load_perf_db
from splitplan.search.accounting import make_plan
from splitplan.search.bracket import plan_max_rate
from splitplan.search.colocated import as_simulated, closest_fit, colocated_plan
from splitplan.search.documents import optimize_json, plan_json, plans_csv
from splitplan.search.evaluation import slo_lines
from splitplan.search.frontier import cost_power_frontier, nondominated
from splitplan.search.outcomes import ClosedLoop, Confidence, ConfidenceLine, SimulatedOutcome, Unservable, Validation
from splitplan.search.repair import cliff, repair
from splitplan.search.sizing import size_option
from splitplan.search.solve import solve_counts
from splitplan.search.types import AnyOption, MachineCap, Option, Plan, Problem, combos
from splitplan.sim.prefix_cache import PrefixModel, host_link_bytes_per_s
from splitplan.specs.engine import EngineProfile, load_engine
from splitplan.specs.hardware import HardwareSpec, hardware_catalog, load_hardware, load_machines, price_date_warning
from splitplan.specs.model import ModelSpec, load_model
from splitplan.specs.roles import SPLIT, Role
from splitplan.specs.slo import SloProfile, load_slo, tightened
from splitplan.workload.trace import with_headroom

NOT_SIZED = "not sized"  # the reason a co-located option left out by its cost bound starts with


@dataclass(frozen=True)
class OptimizeResult:
    plan: Plan  # the best plan under the objective, split or co-located
    alternatives: tuple[Plan, ...]  # runner-ups, the best co-located (or split) plan among them
    options: tuple[AnyOption, ...]  # every evaluated option, sized or skipped
    colocated: Plan | None = None  # the best co-located plan (None if none meets the SLO)
    max_rate_rps: float | None = None  # objective throughput: the highest rate served
    pareto: tuple[Plan, ...] = ()  # with pareto=True: plans no other plan beats on both cost and power
    unservable: Unservable | None = None  # requests no token instance can hold, left out of the sizing
    problem: Problem | None = field(default=None, repr=False, compare=False)  # what was solved (trace, SLO, budgets)
    closed_loop: ClosedLoop | None = None  # optimize_closed_loop: the rounds, and the plan's simulated closed loop
    simulated: Validation | None = None  # simulation.validate_result: the plan's simulation and the machines it added
    alternatives_simulated: tuple[SimulatedOutcome, ...] = ()  # simulation.validate_result: each runner-up's simulated outcome
    split: Plan | None = None  # the best split plan (None when none was planned or none meets the SLO)
    objective: str = "cost"  # what `plan` minimizes: cost or power
    notes: tuple[str, ...] = ()  # what else the reader should know (why no split plan was found)
    confidence: Confidence | None = None  # with a confidence: the quantile, the latency factors and each line's sized-for limit
    nominal: Plan | None = None  # with a confidence: the plan that meets the lines as predicted

    @property
    def frontier(self) -> tuple:
        """The cost-power frontier: with pareto=True the searched one, else the plans found."""
        return self.pareto or tuple(nondominated([self.plan, *self.alternatives]))

    @property
    def warnings(self) -> list[str]:
        """What the reader of this result should know: prices of the plans compared taken more
        than a year apart; for a MoE model planned without a confidence, the engine profile's
        error on measured MoE deployments (EngineProfile.moe_warning)."""
        machines = {o.inst.hardware.name: o.inst.hardware for o in self.options}
        used = {p.hardware for plan in (self.plan, *self.alternatives) for p in plan.pools}
        inst = self.options[0].inst if self.options else None
        warnings = [price_date_warning(machines[name] for name in sorted(used) if name in machines),
                    inst.engine.moe_warning(inst.model.name) if inst and inst.model.is_moe and self.confidence is None else None]
        return [*self.notes, *(w for w in warnings if w)]

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


class Mode(StrEnum):
    """Which plans `optimize` searches, and which one it recommends."""

    BEST = "best"  # split and co-located plans: the better under the objective wins (the default)
    SPLIT = "split"  # the best split plan; the best co-located one is still sized and compared (--split-only)
    SPLIT_ALONE = "split-alone"  # split plans only, nothing co-located sized (a study's designs, rate searches)
    COLOCATED = "colocated"  # co-located plans only (--no-split)

    @property
    def splits(self) -> bool:
        return self is not Mode.COLOCATED

    @property
    def sizes_colocated(self) -> bool:
        return self is not Mode.SPLIT_ALONE

    @property
    def recommends_split(self) -> bool:
        """The split plan is the answer, whatever a co-located plan would cost."""
        return self in (Mode.SPLIT, Mode.SPLIT_ALONE)


@dataclass(frozen=True, kw_only=True)
class OptimizeOptions:
    """How `optimize` searches: the machines, the engine's settings, the objective and budgets.

    Co-located plans use the machines named by `hardware`, else those of `prompt_hardware` and
    `token_hardware`, else the catalog. `max_batch_tokens` and `max_num_seqs` set the engine's
    scheduler (None: the profile's). `prefix_caching` (None: the engine profile's), `routing` (jsq
    or prefix-aware) and `kv_offload_gb` (host memory per prefilling instance): the engine's prefix
    caches, over the prefixes the trace records, in every pool's sizing (capacity.pools.PrefixModel).
    `perf_interp`: how `perf_db` is read (perf.table.INTERPOLATIONS; splitwise-sim to plan as that
    simulator times). `headroom_pct`: plan for the trace's load times (1 + headroom_pct / 100)
    (its timestamps compressed; per-token figures stay at the trace's load); `spare_instances`:
    instances each pool keeps beyond what the load needs (search.accounting.with_spares); `confidence`:
    every SLO line to hold when latencies are off by the engine profile's measured error at that
    quantile (`_at_confidence`)."""

    hardware: Sequence[str] | None = None
    prompt_hardware: Sequence[str] | None = None
    token_hardware: Sequence[str] | None = None
    tp: int | None = None
    objective: str = "cost"
    engine: str = DEFAULT_ENGINE
    search: str = "ilp"
    solver: str = "highs"
    max_cost_per_hour: float | None = None
    max_power_kw: float | None = None
    max_machines: Mapping[str, int] | None = None
    max_batch_tokens: int | None = None
    max_num_seqs: int | None = None
    prefix_caching: bool | None = None
    routing: str = "jsq"
    kv_offload_gb: float = 0.0
    perf_db: str | None = None
    perf_interp: str = "splitplan"
    mode: Mode = Mode.BEST
    alternatives: int = 5
    pareto: bool = False
    jobs: int = 1
    headroom_pct: float = 0.0
    spare_instances: int = 0
    confidence: float | None = None
    cliff: bool = True  # the plan's cliff (search.repair.cliff); off where plans are only compared (studies, rate searches)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))
        if not 0 <= self.spare_instances <= MAX_SPARE_INSTANCES or int(self.spare_instances) != self.spare_instances:
            raise SpecError(f"--spare {self.spare_instances}: must be a whole number of instances from 0 to {MAX_SPARE_INSTANCES}")
        if self.confidence is not None and not 0.5 <= self.confidence <= 0.99:
            raise SpecError(f"--confidence {self.confidence:g}: must be a quantile from 0.5 to 0.99 (e.g. 0.9)")

    def inputs(self) -> dict:
        """The settings a plan document echoes (`inputs`): all but the processes used, the
        measured-latency file and the search's extent; the mode as `split` and `split_only`."""
        hidden = {"jobs", "perf_db", "mode", "alternatives", "pareto", "cliff"}
        echo = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in hidden}
        return {**echo, "split": self.mode.splits, "split_only": self.mode is Mode.SPLIT}


@dataclass(frozen=True)
class _Search:
    """What every step of one `optimize` call shares: the loaded specs and the problem."""

    options: OptimizeOptions
    model: ModelSpec
    engine: EngineProfile
    db: PerfDb | None  # the measured latencies (--perf-db)
    machines: dict[str, HardwareSpec]  # every machine considered, by the name it was given as
    names: list[str]  # the machine types considered for every role (`hardware`, else the catalog)
    problem: Problem
    unservable: Unservable | None  # requests no instance can hold, left out of the sizing

    @property
    def prompt_names(self) -> list:
        return list(self.options.prompt_hardware or self.names)

    @property
    def token_names(self) -> list:
        return list(self.options.token_hardware or self.names)

    @property
    def mixed_names(self) -> list:
        o = self.options
        return list(o.hardware or sorted(set(o.prompt_hardware or []) | set(o.token_hardware or [])) or self.names)

    def instance(self, hw, layout):
        """The instance, with measured timing where --perf-db has its group (else skipped with the reason)."""
        inst = Instance(self.model, hw, self.engine, layout)
        return self.db.instance(inst, self.options.perf_interp) if self.db else inst

    def tasks(self, role: Role, allowed, lower: dict | None = None) -> list:
        """A sizing task (role, instance, lower bound on its count) per allowed machine and layout."""
        return [(role, self.instance(self.machines[name], layout), (lower or {}).get((name, layout)) or 1)
                for name in sorted(set(allowed)) for layout in candidate_layouts(self.model, self.machines[name], self.engine,
                                                                                  self.options.tp)]

    def shaped(self, options: list) -> list:
        """A machine type named without a shape is offered in every shape it is rented in: each sized
        option again on each smaller machine its layout tiles (the same instance: the same size)."""
        shapes = {self.machines[n].name: self.machines[n].shaped()[1:] for n in self.machines if "@" not in n}
        return options + [dataclasses.replace(o, inst=self.instance(hw, o.inst.layout)) for o in options if o.instances
                          for hw in shapes.get(o.inst.hardware.name, ()) if hw.gpus_per_machine % o.inst.layout.gpus == 0]


def optimize(trace, model: str, slo: str | SloProfile, hardware: Sequence[str] | None = None, *, options: OptimizeOptions | None = None,
             **settings) -> OptimizeResult:
    """The cheapest (or lowest-power) plan meeting every SLO line on `trace`, searched as
    `options` says (`settings`: any of its fields, over `options` or the defaults): with
    `Mode.BEST`, the better of the best split plan (prompt/token pools) and the best co-located
    plan under the objective; `Mode.SPLIT`, the split plan (the co-located one still compared);
    `Mode.SPLIT_ALONE`, split plans only; `Mode.COLOCATED`, co-located machines only."""
    if hardware is not None:
        settings["hardware"] = hardware
    opts = dataclasses.replace(options or OptimizeOptions(), **settings)
    if opts.confidence is not None:
        return _at_confidence(trace, model, slo, opts)
    run = _prepare(trace, model, slo, opts)
    first = _size_all(run.problem, run.tasks(Role.PROMPT, set(run.names) | set(run.prompt_names))
                      + (run.tasks(Role.TOKEN, run.token_names) if opts.mode.splits else []), opts.jobs)
    # A co-located pool carries the prompt load and more: the prompt pool's count of the
    # same (machine, TP) bounds its size from below, which shortens its search.
    lower = {(o.inst.hardware.name, o.inst.layout): o.instances for o in first if o.role == Role.PROMPT}
    simulated: dict = {}  # co-located options sized by the simulator (colocated_plan)
    mixed = (_size_colocated(run.problem, run.tasks(Role.MIXED, run.mixed_names, lower), run.shaped, opts.jobs,
                             simulated if opts.mode.splits else None)
             if opts.mode.sizes_colocated else [])
    if not opts.mode.splits:
        return with_cliff(_colocated_only(run, mixed, simulated), opts.cliff)
    prompt_types = {run.machines[n].name for n in run.prompt_names}  # names may be paths: compare the loaded names
    split_options = run.shaped([o for o in first if o.role == Role.TOKEN or o.inst.hardware.name in prompt_types])
    split_options += combos(split_options)  # prefill and decode instances on one machine
    return with_cliff(_split_or_colocated(run, split_options, mixed, simulated), opts.cliff)


def with_cliff(result: OptimizeResult, wanted: bool = True) -> OptimizeResult:
    """The result with its plan's cliff (search.repair.cliff: one instance fewer per pool), where `wanted`."""
    if not wanted:
        return result
    assert result.problem is not None  # (optimize's results carry their problem)
    plan = dataclasses.replace(result.plan, cliff=cliff(result.problem, result.plan, {o.key: o for o in result.options}))
    def same(other: Plan | None) -> Plan | None:  # (the plan is the best split or co-located one: so is its copy)
        return plan if other is result.plan else other
    return dataclasses.replace(result, plan=plan, colocated=same(result.colocated), split=same(result.split))


def _at_confidence(trace, model: str, slo: str | SloProfile, opts: OptimizeOptions) -> OptimizeResult:
    """The plan whose every SLO line holds when the latencies are as many times the predicted
    ones as the engine profile's measured error reaches at quantile `opts.confidence`
    (EngineProfile.latency_factors: each line's limit divided by its factor), with the nominal
    plan beside it."""
    eng, moe = load_engine(opts.engine), load_model(model).is_moe
    factors = eng.latency_factors(cast(float, opts.confidence), moe)
    profile = slo if isinstance(slo, SloProfile) else load_slo(slo)
    plain = dataclasses.replace(opts, confidence=None)
    nominal = optimize(trace, model, profile, options=plain)
    tight = tightened(profile, factors)
    try:
        result = optimize(trace, model, tight, options=plain)
    except InfeasibleError as exc:  # (a line the user did not write: say where it comes from)
        raise with_details(InfeasibleError(
            f"{exc}; at --confidence {opts.confidence:g} each line is divided by {eng.name}'s measured error"
            f"{' on MoE deployments' if eng.error_key(moe) == 'moe_error' else ''} (TTFT {factors['ttft']:.2f}x, "
            f"TPOT {factors['tpot']:.2f}x): plan without it or at a lower confidence"), getattr(exc, "details", "")) from None
    lines = tuple(ConfidenceLine(line.label, line.limit, line.unit, factors[line.metric], t.limit)
                  for line, t in zip(profile.lines(), tight.lines(), strict=True))
    return dataclasses.replace(result, nominal=nominal.plan, confidence=Confidence(
        cast(float, opts.confidence), eng.name, factors, lines, eng.measured_error(moe)[1]))


def _prepare(trace, model: str, slo: str | SloProfile, opts: OptimizeOptions) -> _Search:
    """The specs loaded and checked, the trace without the requests no instance can serve, and
    the problem every pool option is sized on."""
    m, eng, profile = load_model(model), load_engine(opts.engine), slo if isinstance(slo, SloProfile) else load_slo(slo)
    db = load_perf_db(opts.perf_db) if opts.perf_db else None
    if opts.objective not in ("cost", "power"):
        raise SpecError(f"--objective {opts.objective}: choose cost or power")
    names, named, machines = _hardware(opts)
    caps = _caps(opts.max_machines or {}, machines)
    if opts.tp is not None:
        _check_tp(opts.tp, [machines[n] for n in sorted(named)], list(machines.values()))
    token_names = opts.token_hardware or names if opts.mode.splits else names
    prompt_names = opts.prompt_hardware or names if opts.mode.recommends_split else ()
    trace, unservable = _servable(trace, m, eng, [machines[n] for n in token_names], opts.tp, [machines[n] for n in prompt_names])
    trace, load_factor = with_headroom(trace, opts.headroom_pct), 1 + opts.headroom_pct / 100
    reference = reference_for(profile, lambda hw, t: reference_instance(m, hw, t, eng, db, opts.perf_interp), trace.prompt_tokens,
                              trace.output_tokens)
    prefixes = prefix_model(trace, eng, opts.prefix_caching, opts.routing, opts.kv_offload_gb,
                            [machines[n] for n in sorted(set(names) | set(opts.prompt_hardware or []))])
    problem = Problem(trace, profile, reference, eng.batch_tokens(opts.max_batch_tokens), opts.objective, opts.max_cost_per_hour,
                      opts.max_power_kw, caps, opts.solver, eng.seqs_cap(opts.max_num_seqs), eng.chunked, prefixes, load_factor,
                      opts.spare_instances)
    return _Search(opts, m, eng, db, machines, names, problem, unservable)


def _hardware(opts: OptimizeOptions) -> tuple[list[str], set[str], dict]:
    """(the machine types considered: --hardware or the catalog, every type named by a hardware
    option, and each of both loaded by name)."""
    names = list(opts.hardware or [h.name for h in hardware_catalog()])
    named = set(opts.hardware or []) | set(opts.prompt_hardware or []) | set(opts.token_hardware or [])
    return names, named, load_machines(sorted(set(names) | named))


def _caps(max_machines: Mapping[str, int], machines: dict) -> tuple:
    """--max-machines TYPE=N as machine caps, each type among the hardware considered (or a shape of one)."""
    capped = {hw: machines.get(hw) or load_hardware(hw) for hw in max_machines}
    for hw, spec in capped.items():
        if hw not in machines and spec.family not in {m.name for m in machines.values()}:
            raise SpecError(f"--max-machines {hw}: not among the hardware considered ({', '.join(machines)})")
    return tuple(MachineCap(capped[hw].name, n, capped[hw].gpus_per_machine) for hw, n in sorted(max_machines.items()))


def _colocated_only(run: _Search, mixed: list, simulated: dict) -> OptimizeResult:
    """Mode.COLOCATED: the best co-located plan, and the best of each other machine type beside it."""
    problem = run.problem
    plan = colocated_plan(problem, mixed, simulated)
    others = []
    chosen = {load_hardware(p.hardware).family for p in plan.mixed_pools}
    for family in sorted({o.inst.hardware.family for o in mixed} - chosen):
        try:  # the best co-located plan of each other machine type
            others.append(colocated_plan(problem, [o for o in mixed if o.inst.hardware.family == family], simulated))
        except InfeasibleError:
            continue
    others.sort(key=lambda p: plan_key(problem.objective, p))
    return OptimizeResult(plan, tuple(others[: run.options.alternatives]), tuple(as_simulated(simulated, o) for o in mixed), plan,
                          unservable=run.unservable, problem=problem, objective=problem.objective)


def _split_or_colocated(run: _Search, options: list, mixed: list, simulated: dict) -> OptimizeResult:
    """The best split plan and the best co-located one (when sized); the better under the
    objective wins, unless the mode recommends the split plan. A trace no split plan serves
    falls back on the co-located plan where one was sized."""
    problem, opts = run.problem, run.options
    try:
        _raise_if_unreachable(problem, options)
        split_plan, alts = _best_split(problem, options, opts.search, opts.alternatives)
        no_split = None
    except InfeasibleError as exc:  # a co-located plan may still serve the trace
        if opts.mode.recommends_split or not mixed:
            raise
        split_plan, alts, no_split = None, [], exc
    try:
        colocated = colocated_plan(problem, mixed, simulated) if mixed else None
    except InfeasibleError:
        if no_split is not None:
            raise no_split from None
        colocated = None
    mixed = [as_simulated(simulated, o) for o in mixed]
    best = _better(problem, opts, split_plan, colocated)
    found = [p for p in (split_plan, colocated) if p is not None]
    shown = alts[: opts.alternatives - 1] + [p for p in found if p is not best]
    front = _frontier(problem, options, mixed, [*alts, *found]) if opts.pareto else ()
    notes = () if no_split is None else (f"no split plan: {no_split}; the plan is co-located",)
    return OptimizeResult(best, tuple(sorted(shown, key=lambda p: plan_key(problem.objective, p))), tuple(options + mixed),
                          colocated, pareto=front, unservable=run.unservable, problem=problem, split=split_plan,
                          objective=problem.objective, notes=notes)


def _better(problem, opts: OptimizeOptions, split_plan, colocated):
    """The split plan where the mode recommends it or it is no worse under the objective (or no
    co-located plan was sized), else the co-located one."""
    split_wins = split_plan is not None and (opts.mode.recommends_split or colocated is None
                                             or plan_key(problem.objective, split_plan) <= plan_key(problem.objective, colocated))
    best = split_plan if split_wins else colocated
    assert best is not None  # (with neither a split nor a co-located plan, one of them raised before)
    return best


def _frontier(problem, options: list, mixed: list, plans: list) -> tuple:
    """--pareto: the plans no other plan beats on both cost and power, each with the highest rate it serves."""
    by_key = {o.key: o for o in options + mixed}
    return tuple(dataclasses.replace(p, max_rate_rps=plan_max_rate(problem, p, by_key))
                 for p in cost_power_frontier(problem, options, plans))


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
    report = Unservable(int(too_long.sum()), float(too_long.mean() * 100), int(trace.prompt_tokens[too_long].min()),
                        int(trace.prompt_tokens[too_long].max()), reason)
    if too_long.all():
        raise InfeasibleError(f"no request can be served: {report.reason}")
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
    work against its (a guess: the search still finds the smallest count that holds); under an
    inter-token line a co-located pool's follows the gaps its prefills stall instead
    (`sizing.stall_guess`). What is sized, and from which guess, does not depend on `jobs`."""
    ks = [k for k in ks if k not in done]
    work = {k: float(np.sum(inst.prefill_time_s(problem.trace.prompt_tokens))) for k, (role, inst, _) in enumerate(tasks)
            if (k in done or k in ks) and role != Role.TOKEN and inst.fit.fits}
    pilots = _pilots(problem, tasks, work, done, ks)
    rest = [k for k in ks if k not in done]
    guesses = {k: max(tasks[k][2], math.ceil(done[pilot].instances * work[k] / work[pilot]))
               for k in rest if k in work and (pilot := pilots.get(tasks[k][0])) is not None}
    done.update(zip(rest, run_units(_size_one, [(*tasks[k], guesses.get(k)) for k in rest], problem, jobs), strict=True))
    return done


def _pilots(problem, tasks: list, work: dict, done: dict, ks: list) -> dict:
    """Per prompt or co-located role (not the latter under an inter-token line: `_size`), the task
    whose count the role's other searches start from (sized into `done` first where it was not yet)."""
    pilots = {}
    for role in (Role.PROMPT, Role.MIXED) if not slo_lines(problem, "itl") else (Role.PROMPT,):
        sized = [k for k in work if tasks[k][0] == role and k in done and done[k].instances]
        first = sized[0] if sized else next((k for k in ks if k in work and tasks[k][0] == role), None)
        if first is None:
            continue
        if first not in done:
            if len(ks) <= PAIR:  # (a pair is sized in parallel where two processes run: sizing one first would wait)
                continue
            done[first] = size_option(problem, *tasks[first])
        if done[first].instances:
            pilots[role] = first
    return pilots


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
    candidates = [solve_counts(problem, options, search), *_homogeneous_pairs(problem, options, alternatives)]
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


def _homogeneous_pairs(problem, options, alternatives: int) -> list[dict]:
    """The counts of the best homogeneous plan of each (prompt, token) machine pair, cheapest
    first (by each option's count alone), at most `alternatives` + 1 pairs."""
    usable = [o for o in options if o.instances and o.role in SPLIT]
    pairs = sorted(
        ((p, t) for p in usable if p.role == Role.PROMPT for t in usable if t.role == Role.TOKEN),
        key=lambda pt: (_objective(problem.objective, pt[0]) * pt[0].machines_alone
                        + _objective(problem.objective, pt[1]) * pt[1].machines_alone, pt[0].key, pt[1].key),
    )
    seen_pairs: set[tuple[str, str]] = set()
    candidates = []
    for p, t in pairs:
        pair = (p.inst.hardware.family, t.inst.hardware.family)  # (its cheapest shapes)
        if pair not in seen_pairs and len(seen_pairs) < alternatives + 1:
            seen_pairs.add(pair)
            candidates.append({p.key: p.machines_alone, t.key: t.machines_alone})
    return candidates


def _objective(objective: str, option) -> float:
    return option.price_usd_per_hour if objective == "cost" else option.power_kw


def _raise_if_unreachable(problem, options) -> None:
    """Exit 3 naming the line no hardware can meet, the best value reachable and where."""
    for role, metrics in ((Role.PROMPT, ("ttft",)), (Role.TOKEN, ("tbt", "itl", "tpot"))):
        fitting = [o for o in options if o.role == role and o.inst.fit.fits]
        if not fitting:
            mine = sorted((o for o in options if o.role == role), key=closest_fit)
            short, whole = listed([f"{o.inst.hardware.name} {o.inst.layout}: {o.skipped}" for o in mine])
            raise with_details(InfeasibleError(f"the model fits no {role} hardware considered; closest: {short}"), whole)
        if any(o.instances for o in fitting):
            continue
        for line in (x for x in problem.slo.lines() if x.metric in metrics):
            _raise_if_line_unreachable(problem, line, fitting)
        short, whole = listed([f"{o.inst.hardware.name} {o.inst.layout}: {o.skipped}" for o in fitting])
        raise with_details(InfeasibleError(f"no {role} option meets the SLO: {short}"), whole)


def _raise_if_line_unreachable(problem, line, fitting: list) -> None:
    """Exit 3 when no option meets `line` even running each request alone, naming the best."""
    best = None
    for o in fitting:
        alone = alone_latencies(o.inst, problem.trace.prompt_tokens, problem.trace.output_tokens)
        value = achieved(line, alone.value(line.metric), problem.reference)
        if best is None or value < best[0]:
            best = (value, o)
    if best and not meets(line, best[0]):
        raise InfeasibleError(
            f"{line.label} {line.target} cannot be met: the best reachable is {line.text(best[0])} "
            f"on {best[1].inst.hardware.name} at {best[1].inst.layout}, running requests alone")
