"""Rate searches: the highest rate a plan or a budget serves (bracket and bisect)."""

from __future__ import annotations

import dataclasses

from splitplan.base.errors import InfeasibleError, SpecError
from splitplan.search.bracket import bracket_bisect
from splitplan.search.optimize import Mode, OptimizeOptions, OptimizeResult, optimize, with_cliff


def max_rate(workload_at, base_rate_rps: float, model: str, slo: str, progress=None, options: OptimizeOptions | None = None,
             **settings) -> OptimizeResult:
    """The highest request rate a plan within the budget serves under the SLO
    (Splitwise's iso-power / iso-cost scenarios), and the cheapest such plan.

    `workload_at(rate)` gives the trace at a rate (a Poisson resample, or the
    trace's timestamps compressed). The rate is bracketed by doubling or halving
    from `base_rate_rps`, then bisected to 2 %; each step asks whether a
    cost-minimal split plan exists within the budget. `progress(rate, ok)` is
    called after each step. `options` and `settings`: as `optimize` takes them, without runner-ups;
    split plans only, or co-located ones only with `Mode.COLOCATED` (a co-located design).
    """
    opts = dataclasses.replace(options or OptimizeOptions(), **settings)
    wanted = opts.cliff
    mode = Mode.COLOCATED if opts.mode is Mode.COLOCATED else Mode.SPLIT_ALONE
    opts = dataclasses.replace(opts, mode=mode, alternatives=0, cliff=False)  # (each rate's plan: the winner's cliff below)
    if opts.max_cost_per_hour is None and opts.max_power_kw is None and not opts.max_machines:
        raise SpecError("--objective throughput needs a budget: --max-cost-per-hour, --max-power-kw or --max-machines TYPE=N")

    def attempt(rate):
        try:
            result = optimize(workload_at(rate), model, slo, options=opts)
        except InfeasibleError:
            result = None
        if progress:
            progress(rate, result is not None)
        return result

    lo, lo_result, hi = bracket_bisect(attempt, base_rate_rps)
    if lo is None:
        raise InfeasibleError(f"no plan within the budget meets the SLO even at {hi:.3g} req/s")
    plan = with_cliff(lo_result, wanted).plan
    if hi is not None:
        plan = dataclasses.replace(plan, binding=f"{plan.binding}; rate: at {hi:.3g} req/s no plan fits the budget")
    return OptimizeResult(plan, lo_result.alternatives, lo_result.options, None, lo)
