"""Rate searches: the highest rate a plan or a budget serves (bracket and bisect), and the
plan for a closed loop of clients (Little's law, checked by simulation)."""

from __future__ import annotations

import dataclasses

import numpy as np

from splitplan.defaults import DEFAULT_ENGINE
from splitplan.errors import InfeasibleError, SpecError
from splitplan.perf.roofline import Instance
from splitplan.report import plan_text
from splitplan.search.bracket import bracket_bisect
from splitplan.search.optimize import OptimizeResult, _plan_key, optimize
from splitplan.search.plan import predict
from splitplan.simulation import Setup, plan_from_pools, plan_pools, trim
from splitplan.slo import alone_latencies
from splitplan.specs.engine import load_engine
from splitplan.specs.hardware import hardware_catalog, load_hardware
from splitplan.specs.layout import Layout
from splitplan.specs.model import load_model


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

    lo, lo_result, hi = bracket_bisect(attempt, base_rate_rps)
    if lo is None:
        raise InfeasibleError(f"no plan within the budget meets the SLO even at {hi:.3g} req/s")
    plan = lo_result.plan
    if hi is not None:
        plan = dataclasses.replace(plan, binding=f"{plan.binding}; rate: at {hi:.3g} req/s no plan fits the budget")
    return OptimizeResult(plan, lo_result.alternatives, lo_result.options, None, lo)


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

    m, eng = load_model(model), load_engine(kwargs.get("engine", DEFAULT_ENGINE))
    names = kwargs.get("hardware") or [h.name for h in hardware_catalog()]
    alone = [float(np.mean(alone_latencies(inst, workload.prompt_tokens, workload.output_tokens).e2e_s))
             for hw in map(load_hardware, names) for t in hw.tp_degrees()
             for inst in [Instance(m, hw, eng, Layout(t))] if inst.fit.fits]
    if not alone:
        raise InfeasibleError(f"{m.name} fits no instance of {', '.join(names)}")
    rate, rounds_out, best = concurrency / min(alone), [], None
    key = kwargs.get("objective", "cost")
    for k in range(rounds):
        gaps = np.random.default_rng(seed + k).exponential(1 / rate, len(workload))
        open_loop = dataclasses.replace(workload, arrival_s=np.cumsum(gaps) - gaps[0],
                                        source=f"{workload.source} (open loop at {rate:.3g} req/s)")
        result = optimize(open_loop, model, slo, **kwargs)
        setup = Setup(model, slo, kwargs.get("engine", DEFAULT_ENGINE), kwargs.get("perf_db"), kwargs.get("max_batch_tokens"),
                      kwargs.get("perf_interp", "splitplan"), max_num_seqs=kwargs.get("max_num_seqs"),
                      prefix_caching=kwargs.get("prefix_caching"), routing=kwargs.get("routing", "jsq"),
                      kv_offload_gb=kwargs.get("kv_offload_gb", 0.0))
        sim = setup.simulate(workload, plan_pools(result.plan), concurrency)
        met = sim.slo_met
        rounds_out.append({"planned_rate_rps": rate, "plan": plan_text(result.plan), "cost_usd_per_hour": result.plan.cost_usd_per_hour,
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
    # The rounds stop at a self-consistent plan, sized for an open loop: whole units go while the
    # closed loop still meets every line, so the plan is the cheapest the loop accepts this way.
    pools, sim, removed = trim(workload, plan_pools(result.plan), sim, setup, 30, concurrency)
    if removed:
        assert result.problem is not None  # (optimize's results carry their problem)
        plan = plan_from_pools(pools, predicted=result.plan.predicted, slo=result.plan.slo, repairs=result.plan.repairs,
                               binding=f"{result.plan.binding}; closed loop: {removed} machine(s) removed by simulation")
        result = dataclasses.replace(result, plan=predict(result.problem, plan, {o.key: o for o in result.options}))
    closed = {"concurrency": concurrency, "rounds": rounds_out, "benchmark": sim.summary["benchmark"],
              "slo": sim.summary["slo"], "throughput_rps": sim.summary["throughput_rps"], "machines_removed": removed,
              "warmup_requests": sim.summary["warmup_requests"]}
    return dataclasses.replace(result, closed_loop=closed)
