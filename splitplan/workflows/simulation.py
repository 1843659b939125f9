"""Simulating plans: pools from names, a summarized run, and validating a plan by growing
it until the simulation meets the SLO."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from splitplan.base.defaults import (
    DEFAULT_ENGINE,
    DEFAULT_MODEL,
    DEFAULT_SLO,
)
from splitplan.base.errors import InfeasibleError, SpecError
from splitplan.base.parallel import run_units
from splitplan.io.report import SCHEMA_VERSION, plan_text
from splitplan.perf.points import instance, reference_instance
from splitplan.perf.roofline import Instance
from splitplan.perf.slo import alone_latencies, reference_for
from splitplan.perf.table import load_perf_db
from splitplan.search.outcomes import ClosedLoop, ClosedLoopRound, SimulatedOutcome, Validation
from splitplan.search.repair import predict
from splitplan.search.types import Plan, SizedPool, bought
from splitplan.sim.cluster import PoolSpec, SimOptions
from splitplan.sim.cluster import simulate as run
from splitplan.sim.metrics import SimulationSummary, requests_csv, summarize_result
from splitplan.specs.engine import load_engine
from splitplan.specs.hardware import hardware_catalog, load_hardware
from splitplan.specs.layout import Layout, as_layout
from splitplan.specs.model import load_model
from splitplan.specs.roles import SPLIT, Pool, Role
from splitplan.specs.slo import METRICS, load_slo
from splitplan.workload.trace import with_headroom

if TYPE_CHECKING:
    from splitplan.search.optimize import OptimizeOptions, OptimizeResult
    from splitplan.sim.cluster import SimResult


@dataclass(frozen=True)
class SimulateResult:
    result: SimResult
    summary: SimulationSummary
    pools: tuple

    @property
    def slo_met(self) -> bool:
        return self.summary.slo_met

    def outcome(self) -> SimulatedOutcome:
        """What a study keeps of a simulation: whether every SLO line was met, and the
        percentiles (ms) of every metric a line can name (TTFT, TBT, ITL, TPOT, E2E)."""
        return SimulatedOutcome(self.slo_met, **{f"{m}_ms": self.summary.latency_ms(m) for m in METRICS})

    def to_json(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "summary": self.summary.to_json()}

    def to_frame(self):
        """One row per request (the `requests.csv` columns)."""
        import io

        import pandas as pd

        return pd.read_csv(io.StringIO(requests_csv(self.result, self.result.names)))


@dataclass(frozen=True)
class Setup:
    """What every simulation of one study shares: the model, the SLO profile, and how the
    passes are timed (engine profile or measured perf-db, prefill batch size)."""

    model: str = DEFAULT_MODEL
    slo: str = DEFAULT_SLO
    engine: str = DEFAULT_ENGINE
    perf_db: str | None = None
    max_batch_tokens: int | None = None  # the scheduler's token budget (None: the engine profile's)
    perf_interp: str = "splitplan"  # how perf_db is read
    borrow_threshold_tokens: int | None = None  # Splitwise's mixed pool (--mixed-pool-threshold)
    max_num_seqs: int | None = None  # requests running on an instance at once (None: the profile's)
    prefix_caching: bool | None = None  # the engine's prefix caches (None: the profile's)
    routing: str = "jsq"
    kv_offload_gb: float = 0.0  # host memory per prefilling instance, for its prefix cache

    def simulate(self, trace, pools: list[Pool], concurrency: int | None = None) -> SimulateResult:
        return simulate_pools(trace, pools, self.model, self.slo, self.engine, self.perf_db, self.max_batch_tokens, self.routing,
                              borrow_threshold_tokens=self.borrow_threshold_tokens, perf_interp=self.perf_interp,
                              concurrency=concurrency, max_num_seqs=self.max_num_seqs, prefix_caching=self.prefix_caching,
                              kv_offload_gb=self.kv_offload_gb)


def setup_for(model: str, slo: str, options: OptimizeOptions, borrow_threshold_tokens: int | None = None) -> Setup:
    """The simulations of plans searched with `options`: the same engine, scheduler and caches."""
    return Setup(model, slo, options.engine, options.perf_db, options.max_batch_tokens, options.perf_interp,
                 borrow_threshold_tokens, options.max_num_seqs, options.prefix_caching, options.routing, options.kv_offload_gb)


def pool_specs(pools: list[Pool], model: str, engine: str = DEFAULT_ENGINE, perf_db: str | None = None,
               perf_interp: str = "splitplan"):
    """(role, hardware, layout, machines) -> PoolSpecs with analytic or measured instances
    (`perf_interp`: how the measured table is read, see perf.table.INTERPOLATIONS)."""
    db = load_perf_db(perf_db) if perf_db else None
    out = []
    for role, hw, layout, machines, count, shared in map(lambda p: Pool(*p), pools):
        layout = as_layout(layout, f"{role} pool {hw}")
        if role not in set(Role):
            raise SpecError(f"pool role '{role}': choose {', '.join(Role)}")
        if machines < 1:
            raise SpecError(f"--{role}-pool {hw}:{layout.spec}:{machines}: machines must be >= 1")
        inst = instance(model, hw, layout, engine)
        layout.require_whole(machines, inst.hardware.gpus_per_machine, f"--{role}-pool {hw}:{layout.spec}:{machines}")
        out.append(PoolSpec(Role(role), db.require(inst, perf_interp) if db else inst, machines, count, shared))
    for number in {p.shared for p in out if p.shared is not None}:
        _check_shared(number, [p for p in out if p.shared == number])
    return out


def _check_shared(number: int, parts: list[PoolSpec]) -> None:
    """The pools on shared machines `number` fill them alike (SpecError otherwise)."""
    held = sum(p.instances * p.perf.layout.gpus for p in parts)
    machine = parts[0].perf.hardware
    if any(p.instances % p.machines for p in parts) or held > parts[0].machines * machine.gpus_per_machine:
        held_text = " and ".join(f"{p.instances} {p.role} instance(s) in {p.perf.layout}" for p in parts)
        raise SpecError(f"shared machines {number}: {held_text} "
                        f"do not fill {parts[0].machines} {machine.name} machine(s) alike ({machine.gpus_per_machine} GPUs each)")


def simulate_pools(trace, pools: list[Pool], model: str, slo: str, engine: str = DEFAULT_ENGINE,
                   perf_db: str | None = None, max_batch_tokens: int | None = None, routing: str = "jsq",
                   borrow_threshold_tokens: int | None = None, perf_interp: str = "splitplan",
                   concurrency: int | None = None, max_num_seqs: int | None = None,
                   warmup_requests: int | None = None, prefix_caching: bool | None = None,
                   kv_offload_gb: float = 0.0) -> SimulateResult:
    """Replay `trace` through the cluster request by request (sim.cluster) and summarize.
    With `concurrency`, a closed loop of that many clients (workload.closed_loop_workload
    makes its requests); the trace's timestamps are ignored, and the first `warmup_requests`
    sent (default: one per client, the burst of all clients starting at once) are a warm-up
    left out of the statistics, as genai-perf's --warmup-request-count. `max_batch_tokens` and
    `max_num_seqs` set the engine's scheduler (None: the engine profile's). `prefix_caching` (None:
    the engine profile's): a prefix cache per instance over the prefixes the trace records
    (sim.prefix_cache), with `kv_offload_gb` of host memory per prefilling instance."""

    roles = {r for r, *_ in pools}
    if not (set(SPLIT) <= roles or Role.MIXED in roles) or (Role.MIXED in roles and len(roles) > 1):
        raise SpecError("give prompt and token pools (split), or mixed pools (co-located), not a mix of both")
    if routing not in ("jsq", "round-robin", "prefix-aware"):
        raise SpecError(f"--routing {routing}: choose jsq, round-robin or prefix-aware")
    profile = load_slo(slo)
    specs = pool_specs(pools, model, engine, perf_db, perf_interp)
    eng = specs[0].perf.engine
    prefix_caching = eng.caches_prefixes(prefix_caching, routing, kv_offload_gb)
    db = load_perf_db(perf_db) if perf_db else None
    reference = reference_for(profile, lambda hw, t: reference_instance(model, hw, t, engine, db, perf_interp),
                              trace.prompt_tokens, trace.output_tokens)
    result = run(trace, specs, SimOptions(eng.batch_tokens(max_batch_tokens), routing, borrow_threshold_tokens, concurrency,
                                          max_model_len=eng.context_tokens(specs[0].perf.model),
                                          max_num_seqs=eng.seqs_cap(max_num_seqs),
                                          warmup_requests=(concurrency or 0) if warmup_requests is None else warmup_requests,
                                          prefix_caching=prefix_caching, kv_offload_gb=kv_offload_gb))
    return SimulateResult(result, summarize_result(result, specs, profile, reference), tuple(specs))


def plan_from_pools(pools: list[Pool], **fields) -> Plan:
    """A Plan holding these (role, hardware, layout, machines) pools, priced from the catalog."""
    pools = [Pool(*p) for p in pools]

    def pool(p: Pool) -> SizedPool:
        layout = as_layout(p.layout, f"{p.role} pool {p.hardware}")
        if p.shared is not None:
            if p.instances is None:
                raise SpecError(f"{p.role} pool {p.hardware} on shared machines {p.shared}: give its instances")
            return SizedPool.part(p.hardware, layout, p.machines, p.instances, p.shared)
        return SizedPool.of(p.hardware, load_hardware(p.hardware).gpus_per_machine, layout, p.machines)
    by_role = {role: tuple(pool(p) for p in pools if p.role == role) for role in Role}
    cost = sum(load_hardware(p.hardware).price_usd_per_hour * p.machines for p in bought(pools))
    power = sum(load_hardware(p.hardware).provisioned_power_w / 1e3 * p.machines for p in bought(pools))
    return Plan(by_role[Role.PROMPT], by_role[Role.TOKEN], by_role[Role.MIXED], cost, power, **fields)


def plan_pools(plan) -> list[Pool]:
    """A plan's pools, each in its role."""
    return [p.pool(role) for role, p in plan.by_role()]


def _spares(plan) -> dict[tuple, int]:
    """The spare instances of each pool of machines of its own, by (role, hardware, layout)."""
    return {(role, p.hardware, p.layout): p.spare_instances for role, p in plan.by_role() if p.spare_instances and p.shared is None}


def in_service(pools: list[Pool], spares: dict[tuple, int]) -> list[Pool]:
    """The pools with their spare instances out of service (`_spares`): the state a plan with
    spares promises to meet the SLO in. (A part of shared machines keeps all its instances.)"""
    out = []
    for p in pools:
        spare = spares.get((p.role, p.hardware, p.layout), 0) if p.shared is None else 0
        held = p.layout.instances_on(p.machines, load_hardware(p.hardware).gpus_per_machine) if spare else 0
        out.append(p._replace(instances=held - spare) if spare and held > spare else p)
    return out


def _with_spares(plan: Plan, spares: dict[tuple, int]) -> Plan:
    """The plan's pools marked with their spare instances again (after validation rebuilt it)."""
    def mark(role, pools):
        return tuple(dataclasses.replace(p, spare_instances=spares.get((role, p.hardware, p.layout), p.spare_instances))
                     for p in pools)
    return dataclasses.replace(plan, prompt_pools=mark(Role.PROMPT, plan.prompt_pools), token_pools=mark(Role.TOKEN, plan.token_pools),
                               mixed_pools=mark(Role.MIXED, plan.mixed_pools))


def validate(plan, trace, model: str, slo: str, engine: str = DEFAULT_ENGINE, perf_db: str | None = None,
             max_batch_tokens: int | None = None, limit: int = 30, planned: OptimizeResult | None = None,
             setup: Setup | None = None):
    """Simulate the plan; while a line fails, grow the pool that binds (TTFT: prompt;
    TBT: token; E2E: the side with the larger median share; co-located: the mixed
    pool) by one machine of its cheapest-per-capacity type and simulate again.
    With Splitwise's mixed pool (`setup.borrow_threshold_tokens`), which the planner does
    not model (prompt and token machines lend each other work), the plan is then trimmed:
    while it still meets the SLO without one whole unit of some pool (the dearest first),
    that unit goes. `setup` (else one from the arguments) says how to simulate.
    With `planned` (the OptimizeResult the plan came from), a changed plan carries the
    planner's prediction for its machines, so the two stay comparable.
    A plan with spare instances (`optimize --spare`) is simulated with them out of service,
    and keeps them.
    Returns (plan, SimulateResult, machines added; negative: removed)."""
    setup = setup or Setup(model, slo, engine, perf_db, max_batch_tokens)
    pools, spares = plan_pools(plan), _spares(plan)
    for added in range(limit + 1):
        sim = setup.simulate(trace, in_service(pools, spares))
        failed = [s for s in sim.summary.slo if not s.met]
        if not failed:
            break
        if added == limit:
            raise InfeasibleError(f"the simulated plan still misses {failed[0].line} after {limit} added machines")
        _grow(pools, _role_to_grow(pools, failed[0].metric, sim.result))
    removed = 0
    if setup.borrow_threshold_tokens is not None and not added and all(p.role != Role.MIXED for p in pools):
        pools, sim, removed = trim(trace, pools, sim, setup, limit, spares=spares)
    if added or removed:
        plan = _changed_plan(plan, pools, spares, planned, f"{added} machine(s) added" if added
                             else f"{removed} machine(s) removed (mixed pool)")
    return plan, sim, added - removed


def _changed_plan(plan, pools: list[Pool], spares, planned: OptimizeResult | None, what: str):
    """The plan of the pools simulation left (`what` changed, in its binding), with the planner's
    prediction for them where `planned` gives it, and its spares."""
    plan = plan_from_pools(pools, predicted=plan.predicted, slo=plan.slo, repairs=plan.repairs,
                           binding=f"{plan.binding}; simulation: {what}")
    if planned is not None and planned.problem is not None:
        plan = predict(planned.problem, plan, {o.key: o for o in planned.options})
    return _with_spares(plan, spares)


def _role_to_grow(pools: list[Pool], metric: str, result) -> Role:
    """The pool a failed line grows: co-located, else TTFT the prompt pool, TBT, ITL and TPOT
    the token pool, E2E the side with the larger median share of it."""
    if any(p.role == Role.MIXED for p in pools):
        return Role.MIXED
    if metric == "ttft":
        return Role.PROMPT
    if metric in ("tbt", "itl", "tpot"):
        return Role.TOKEN
    return Role.PROMPT if np.nanmedian(result.ttft_s) > np.nanmedian(result.e2e_s - result.ttft_s) else Role.TOKEN


def _grow(pools: list[Pool], role: Role) -> None:
    """One unit more of `role`'s cheapest-per-GPU pool, in place."""
    grow = min((p for p in pools if p.role == role), key=lambda p: (load_hardware(p.hardware).price_usd_per_hour / p.layout.gpus,
                                                                      p.shared is not None, p.hardware))
    own = next((p for p in pools if p.shared is None and p[:3] == grow[:3]), None)
    if own is None:  # (a part of shared machines: the machines it adds are its own)
        pools.append(Pool(grow.role, grow.hardware, grow.layout, _unit(grow)))
    else:
        pools[pools.index(own)] = own._replace(machines=own.machines + _unit(own))


def _unit(pool: Pool) -> int:
    """Machines of a pool's smallest whole unit (whole instances)."""
    return pool.layout.unit(load_hardware(pool.hardware).gpus_per_machine)[0]


def trim(trace, pools: list[Pool], sim: SimulateResult, setup: Setup, limit: int, concurrency: int | None = None,
         spares: dict[tuple, int] | None = None):
    """Remove whole units, the dearest first, while the simulation (a closed loop of
    `concurrency` clients, if given; `spares` out of service) still meets the SLO; every role
    keeps a unit. Returns (pools, the last simulation that met it, machines removed)."""
    removed = 0
    for _ in range(limit):
        cuts = sorted((p for p in pools if p.shared is None and sum(q.machines for q in pools if q.role == p.role) > _unit(p)),
                      key=lambda p: (-load_hardware(p.hardware).price_usd_per_hour * _unit(p), p.role, p.hardware))
        for pool in cuts:
            trial = [q._replace(machines=q.machines - _unit(q)) if q == pool else q for q in pools]
            trial = [q for q in trial if q.machines > 0]
            trial_sim = setup.simulate(trace, in_service(trial, spares or {}), concurrency)
            if trial_sim.slo_met:
                pools, sim, removed = trial, trial_sim, removed + _unit(pool)
                break
        else:
            break
    return pools, sim, removed


def _simulate_unit(shared, pools):
    trace, setup = shared
    return setup.simulate(trace, pools).outcome()


def validate_result(result: OptimizeResult, trace, setup: Setup, jobs: int = 1, executor: str = "local",
                    ray_address: str | None = None, progress=None) -> OptimizeResult:
    """`optimize --validate`: every runner-up simulated (a work unit each), then the plan
    grown until its simulation meets the SLO (`validate`); the result carries both.
    `progress()` is called per runner-up and once for the plan."""
    problem = result.problem
    assert problem is not None  # (optimize's results carry their problem)
    if problem.load_factor != 1:  # (--headroom: the load the plan was sized for)
        trace = with_headroom(trace, (problem.load_factor - 1) * 100)
    runner_ups = simulate_plans(result.alternatives, trace, setup.model, setup.slo, setup.engine, setup.perf_db,
                                setup.max_batch_tokens, jobs, executor, ray_address, progress, setup=setup)
    plan, sim, added = validate(result.plan, trace, setup.model, setup.slo, planned=result, setup=setup)
    if progress:
        progress()
    simulated = Validation(**{f"{m}_ms": sim.summary.latency_ms(m) for m in METRICS}, slo=sim.summary.slo, machines_added=added)
    return dataclasses.replace(result, plan=plan, simulated=simulated, alternatives_simulated=tuple(runner_ups),
                               pareto=tuple(_at_max_rate(p, problem.trace, setup) for p in result.pareto))


def _at_max_rate(plan, trace, setup: Setup):
    """A frontier plan with its simulation at its own max_rate_rps (the planned trace's
    timestamps scaled to it, as the planner's rate search scales them)."""
    if plan.max_rate_rps is None:
        return plan
    sim = setup.simulate(trace.at_rate(plan.max_rate_rps), plan_pools(plan))
    return dataclasses.replace(plan, max_rate_simulated={"slo_met": sim.slo_met, "slo": [x.to_json() for x in sim.summary.slo]})


def simulate_plans(plans, trace, model: str, slo: str, engine: str = DEFAULT_ENGINE, perf_db: str | None = None,
                   max_batch_tokens: int | None = None, jobs: int = 1, executor: str = "local", ray_address: str | None = None,
                   progress=None, setup: Setup | None = None) -> list[SimulatedOutcome]:
    """Simulate several plans on the same trace (a work unit each; spare instances out of
    service); `setup`, else one from the arguments, says how."""
    setup = setup or Setup(model, slo, engine, perf_db, max_batch_tokens)
    return run_units(_simulate_unit, [in_service(plan_pools(p), _spares(p)) for p in plans], (trace, setup),
                     jobs, executor, ray_address, progress, describe=lambda pools: f"plan {pools}")


def optimize_closed_loop(workload, concurrency: int, model: str, slo: str, seed: int = 0, progress=None,
                         rounds: int = 4, options: OptimizeOptions | None = None, **settings) -> OptimizeResult:
    """The cheapest (or lowest-power) plan meeting the SLO in a closed loop of `concurrency`
    clients (each sending its next request of `workload` when its last one finishes), as
    serving benchmarks load a deployment.

    A closed loop runs at the rate its latency allows: by Little's law `concurrency / mean
    E2E`. The search starts at the highest such rate, every request as fast as the fastest
    instance serves it alone, so the first plan is large enough; it then plans an open loop
    (Poisson, the same requests) at `concurrency / E2E` of the last plan's simulated closed
    loop (its warm-up left out), and keeps the best plan whose closed-loop simulation met every
    SLO line. Each round is recorded (`closed_loop` in the result)."""
    from splitplan.search.optimize import OptimizeOptions, optimize, plan_key

    opts = dataclasses.replace(options or OptimizeOptions(), **settings)
    rate, rounds_out, best = concurrency / _fastest_mean_e2e_s(workload, model, opts), [], None
    setup = setup_for(model, slo, opts)
    for k in range(rounds):
        gaps = np.random.default_rng(seed + k).exponential(1 / rate, len(workload))
        open_loop = dataclasses.replace(workload, arrival_s=np.cumsum(gaps) - gaps[0],
                                        source=f"{workload.source} (open loop at {rate:.3g} req/s)")
        result = optimize(open_loop, model, slo, options=opts)
        sim = setup.simulate(workload, in_service(plan_pools(result.plan), _spares(result.plan)), concurrency)
        met = sim.slo_met
        rounds_out.append(ClosedLoopRound(rate, plan_text(result.plan), result.plan.cost_usd_per_hour, result.plan.power_kw,
                                          sim.summary.throughput_rps, met))
        if progress:
            progress(rounds_out[-1])
        if met and (best is None or plan_key(opts.objective, result.plan) < plan_key(opts.objective, best[0].plan)):
            best = (result, sim)
        mean_e2e_s = float(np.nanmean(sim.result.e2e_s[sim.result.measured]))  # (past the warm-up, whose outputs are graded)
        following = concurrency / mean_e2e_s if np.isfinite(mean_e2e_s) and mean_e2e_s > 0 else rate
        if not met or abs(following - rate) <= 0.02 * rate:
            break
        rate = following
    if best is None:
        missed = ", ".join(line.line for line in sim.summary.slo if not line.met)
        raise InfeasibleError(f"no plan met the SLO in a closed loop of {concurrency} clients: the plan for "
                              f"{rounds_out[0].planned_rate_rps:.3g} req/s ({rounds_out[0].plan}) missed {missed}")
    return _trimmed_closed_loop(workload, concurrency, *best, rounds_out, setup)


def _fastest_mean_e2e_s(workload, model: str, options: OptimizeOptions) -> float:
    """The mean E2E of the workload's requests, each run alone on the fastest instance considered."""
    m, eng = load_model(model), load_engine(options.engine)
    names = options.hardware or [h.name for h in hardware_catalog()]
    alone = [float(np.mean(alone_latencies(inst, workload.prompt_tokens, workload.output_tokens).e2e_s))
             for hw in map(load_hardware, names) for t in hw.tp_degrees()
             for inst in [Instance(m, hw, eng, Layout(t))] if inst.fit.fits]
    if not alone:
        raise InfeasibleError(f"{m.name} fits no instance of {', '.join(names)}")
    return min(alone)


def _trimmed_closed_loop(workload, concurrency: int, result: OptimizeResult, sim: SimulateResult, rounds_out: list,
                         setup: Setup) -> OptimizeResult:
    """The closed loop's best plan, trimmed while its closed loop still meets the SLO, with its rounds."""
    # The rounds stop at a self-consistent plan, sized for an open loop: whole units go while the
    # closed loop still meets every line, so the plan is the cheapest the loop accepts this way.
    spares = _spares(result.plan)
    pools, sim, removed = trim(workload, plan_pools(result.plan), sim, setup, 30, concurrency, spares)
    if removed:
        assert result.problem is not None  # (optimize's results carry their problem)
        plan = plan_from_pools(pools, predicted=result.plan.predicted, slo=result.plan.slo, repairs=result.plan.repairs,
                               binding=f"{result.plan.binding}; closed loop: {removed} machine(s) removed by simulation")
        plan = _with_spares(predict(result.problem, plan, {o.key: o for o in result.options}), spares)
        result = dataclasses.replace(result, plan=plan)
    closed = ClosedLoop(concurrency, tuple(rounds_out), sim.summary.benchmark, sim.summary.slo, sim.summary.throughput_rps,
                        removed, sim.summary.warmup_requests)
    return dataclasses.replace(result, closed_loop=closed)
