"""Design studies: Splitwise's provisioning scenarios across designs (compare), metrics
over a range of rates (sweep), and a plan per window of a long trace (plan_windows)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from splitplan.base.defaults import (
    DEFAULT_ENGINE,
    DEFAULT_MODEL,
    DEFAULT_SLO,
    STUDY_SLO,
)
from splitplan.base.errors import InfeasibleError, SpecError
from splitplan.base.parallel import run_units
from splitplan.io.report import SCHEMA_VERSION, plan_json, pools_text
from splitplan.search.accounting import usd_per_million_tokens
from splitplan.search.optimize import Mode, OptimizeOptions, optimize
from splitplan.search.outcomes import SimulatedOutcome
from splitplan.search.rate import max_rate
from splitplan.search.types import Plan
from splitplan.specs.design import Design, load_designs
from splitplan.specs.hardware import load_hardware, price_date_warning
from splitplan.specs.roles import Pool
from splitplan.specs.slo import METRICS
from splitplan.workflows.simulation import Setup, plan_from_pools, plan_pools, pool_specs
from splitplan.workload.trace import Trace, load_workload, resample_poisson, windows

SCENARIOS = ("iso-power", "iso-cost", "iso-throughput-cost", "iso-throughput-power")


@dataclass(frozen=True)
class DesignResult:
    design: str
    plan: Plan | None
    max_rate_rps: float | None
    error: str = ""
    simulated: SimulatedOutcome | None = None

    def row(self) -> dict:
        p = self.plan

        def machines(pools):
            return sum(x.machines for x in pools) if p else None

        return {
            "design": self.design,
            "prompt_machines": machines(p.prompt_pools) if p else None,
            "token_machines": machines(p.token_pools) if p else None,
            "mixed_machines": machines(p.mixed_pools) if p else None,
            "gpus": p.gpus if p else None,
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

    @property
    def warnings(self) -> list[str]:
        """Prices of the designs compared taken more than a year apart (iso-cost and the
        cost scenario compare prices)."""
        if self.scenario not in ("iso-cost", "iso-throughput-cost"):
            return []
        names = sorted({p.hardware for r in self.designs if r.plan is not None for p in r.plan.pools})
        warning = price_date_warning(load_hardware(name) for name in names)
        return [warning] if warning else []

    def to_json(self) -> dict:
        rows = [{**r.row(), "ratio_to_baseline": self.ratio(r),
                 **({"simulated": r.simulated.to_json()} if r.simulated is not None else {})} for r in self.designs]
        return {"schema_version": SCHEMA_VERSION, "scenario": self.scenario, "baseline": self.baseline,
                "budget": self.budget, "designs": rows, "warnings": self.warnings}

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame([{**r.row(), "ratio_to_baseline": self.ratio(r)} for r in self.designs])


@dataclass(frozen=True)
class _CompareJob:
    """What every design of a comparison shares (a work unit's shared input)."""

    scenario: str
    workload: Trace  # the trace, or its resample at --rate
    workload_at: Callable[[float], Trace]  # the trace's sizes resampled at a rate
    base_rate: float
    setup: Setup
    options: OptimizeOptions  # engine, perf_db, scheduler, budget
    validate: bool


def _design_unit(job: _CompareJob, design):
    """One design in one scenario (a picklable work unit)."""
    scenario, workload, workload_at, base_rate = job.scenario, job.workload, job.workload_at, job.base_rate
    model, slo, options = job.setup.model, job.setup.slo, _design_options(job.options, design)
    try:
        if scenario in ("iso-power", "iso-cost"):
            result = max_rate(workload_at, base_rate, model, slo, options=options)
            rate = result.max_rate_rps
            assert rate is not None  # (max_rate's results carry it)
            trace = workload_at(rate)
        else:
            objective = "cost" if scenario == "iso-throughput-cost" else "power"
            result = optimize(workload, model, slo, options=options, objective=objective)
            rate, trace = base_rate, workload  # the trace's own rate, or the --rate resampled at
    except InfeasibleError as exc:
        return DesignResult(design.name, None, None, str(exc))
    simulated = job.setup.simulate(trace, plan_pools(result.plan)).outcome() if job.validate else None
    return DesignResult(design.name, result.plan, rate, "", simulated)


def _design_options(base: OptimizeOptions, design) -> OptimizeOptions:
    """A design's search: its machines and TP degree, split plans only (or co-located ones), no runner-ups
    and no cliff (a study compares plans: what one instance fewer does is a plan's own report)."""
    return dataclasses.replace(base, hardware=design.hardware, prompt_hardware=[design.prompt] if design.prompt else None,
                               token_hardware=[design.token] if design.token else None, tp=design.tp, alternatives=0, cliff=False,
                               mode=Mode.SPLIT_ALONE if design.split else Mode.COLOCATED)


def compare(designs: str = "splitwise-designs", scenario: str = "iso-power", trace=None, model: str = DEFAULT_MODEL,
            slo: str = STUDY_SLO,
            engine: str = DEFAULT_ENGINE, budget_machines: dict[str, int] | None = None,
            max_power_kw: float | None = None, max_cost_per_hour: float | None = None, rate: float | None = None,
            duration_s: float = 120.0, seed: int = 0, baseline: str | None = None, validate: bool = False,
            perf_db: str | None = None, max_batch_tokens: int | None = None, jobs: int = 1, progress=None,
            executor: str = "local", ray_address: str | None = None, max_num_seqs: int | None = None) -> CompareResult:
    """Splitwise's provisioning study as one call: every design of `designs` (a designs file's
    name or path) in `scenario`, on `trace` (a path, a Trace, or None: the embedded Azure code trace).

    iso-power / iso-cost: the highest rate each design serves within the budget
    (`max_power_kw`, `max_cost_per_hour`, or `budget_machines` TYPE=N, read as the
    power or the cost of N such machines); every rate tried is a Poisson resample of
    the trace's sizes for `duration_s`. iso-throughput-cost / -power: the cheapest or
    lowest-power plan of each design at the trace's own rate (or its resample at `rate`).
    """

    if scenario not in SCENARIOS:
        raise SpecError(f"--scenario {scenario}: choose one of {', '.join(SCENARIOS)}")
    spec, trace = load_designs(designs), load_workload(trace)
    base_name = baseline or spec.designs[0].name
    spec.get(base_name)
    budget = _budget(scenario, budget_machines, max_power_kw, max_cost_per_hour) if scenario in ("iso-power", "iso-cost") else {}
    options = OptimizeOptions(engine=engine, perf_db=perf_db, max_batch_tokens=max_batch_tokens, max_num_seqs=max_num_seqs,
                              max_power_kw=budget.get("max_power_kw"), max_cost_per_hour=budget.get("max_cost_per_hour"))
    base_rate = rate or trace.mean_rate_rps
    workload = resample_poisson(trace, rate, duration_s, np.random.default_rng(seed)) if rate else trace
    workload_at = functools.partial(_resampled, trace, duration_s, seed)
    setup = Setup(model, slo, engine, perf_db, max_batch_tokens, max_num_seqs=max_num_seqs)
    job = _CompareJob(scenario, workload, workload_at, base_rate, setup, options, validate)
    results = run_units(_design_unit, list(spec.designs), job, jobs, executor, ray_address, progress,
                        describe=lambda d: f"design {d.name}")
    return CompareResult(scenario, tuple(results), base_name, budget)


def _budget(scenario: str, budget_machines: dict[str, int] | None, max_power_kw: float | None,
            max_cost_per_hour: float | None) -> dict[str, float | None]:
    """An iso-power or iso-cost study's one budget: the kW or USD/h given, or those of N machines of
    a type (`budget_machines`); SpecError unless exactly one is given."""
    given = [x for x in (budget_machines, max_power_kw, max_cost_per_hour) if x]
    if len(given) != 1:
        raise SpecError(f"--scenario {scenario} needs exactly one budget: --budget-machines TYPE=N, --max-power-kw or "
                        "--max-cost-per-hour")
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
        option = "--max-power-kw" if scenario == "iso-power" else "--max-cost-per-hour"
        raise SpecError(f"--scenario {scenario}: give the budget as {option} or --budget-machines")
    return {"max_power_kw": max_power_kw} if scenario == "iso-power" else {"max_cost_per_hour": max_cost_per_hour}


def _resampled(trace, duration_s, seed, rate):
    return resample_poisson(trace, rate, duration_s, np.random.default_rng(seed))


@dataclass(frozen=True)
class SweepResult:
    rows: tuple  # one dict per (design or plan, rate)
    mode: str  # "designs" (cheapest plan per rate, predicted) or "plan" (fixed plan, simulated)

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(list(self.rows))

    def to_json(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "mode": self.mode, "rows": list(self.rows)}


def _sweep_row(name, rate, plan, metrics: dict, trace, slo_met: bool, error: str = "") -> dict:
    row = {"design": name, "rate_rps": rate, "error": error or None}
    if plan is not None:
        cost = plan.cost_usd_per_hour
        per_million = usd_per_million_tokens(cost, trace)
        row.update({
            "prompt_machines": sum(p.machines for p in plan.prompt_pools),
            "token_machines": sum(p.machines for p in plan.token_pools),
            "mixed_machines": sum(p.machines for p in plan.mixed_pools),
            "prompt_gpus": sum(p.gpus for p in plan.prompt_pools), "token_gpus": sum(p.gpus for p in plan.token_pools),
            "mixed_gpus": sum(p.gpus for p in plan.mixed_pools),
            "cost_usd_per_hour": cost, "power_kw": plan.power_kw,
            "cost_per_million_tokens_usd": per_million["cost_usd_per_million_tokens"],
            "cost_per_million_output_tokens_usd": per_million["cost_usd_per_million_output_tokens"],
        })
    for metric in METRICS:
        for q in ("p50", "p90", "p99"):
            row[f"{metric}_{q}_ms"] = metrics.get(metric, {}).get(q) if metrics else None
    row["slo_met"] = slo_met if plan is not None else None
    return row


@dataclass(frozen=True)
class _SweepJob:
    """What every rate of a sweep shares (a work unit's shared input)."""

    base: Trace  # resampled at each rate
    duration_s: float
    seed: int
    setup: Setup
    options: OptimizeOptions  # optimize's (designs mode)
    pools: list | None  # the fixed plan (plan mode)


def _sweep_unit(job: _SweepJob, unit):
    name, design, rate = unit
    trace = _resampled(job.base, job.duration_s, job.seed, rate)
    if job.pools is not None:
        sim = job.setup.simulate(trace, job.pools)
        metrics = {m: sim.summary.latency_ms(m) for m in METRICS}
        return _sweep_row(name, rate, plan_from_pools(job.pools), metrics, trace, sim.slo_met)
    try:
        result = optimize(trace, job.setup.model, job.setup.slo, options=_design_options(job.options, design))
    except InfeasibleError as exc:
        return _sweep_row(name, rate, None, {}, trace, False, str(exc))
    return _sweep_row(name, rate, result.plan, result.plan.predicted, trace, all(ok for _, _, ok in result.plan.slo))


def sweep(rates: list[float], trace=None, model: str = DEFAULT_MODEL, slo: str = DEFAULT_SLO, designs: str | None = None,
          only: list[str] | None = None, pools: list[Pool] | None = None,
          engine: str = DEFAULT_ENGINE, objective: str = "cost", duration_s: float = 120.0, seed: int = 0,
          perf_db: str | None = None, max_batch_tokens: int | None = None, jobs: int = 1, progress=None,
          executor: str = "local", ray_address: str | None = None, max_num_seqs: int | None = None) -> SweepResult:
    """A load sweep. With `designs`: the cheapest (or lowest-power) plan of each design
    at each rate, with its predicted percentiles and cost per million tokens. With
    `pools`: one fixed plan simulated at each rate (latency against load). Every rate
    is a Poisson resample of the sizes of `trace` (a path, a Trace, or None: the embedded Azure
    code trace) for `duration_s`."""
    rates, trace = list(rates), load_workload(trace)
    if not rates or any(r <= 0 for r in rates):
        raise SpecError("--rates: give one or more rates > 0 (e.g. 5,10,20 or 5:80:16)")
    if (designs is None) == (pools is None):
        raise SpecError("sweep designs (--designs) or one plan (--plan / --prompt-pool ...), not both or neither")
    options = OptimizeOptions(engine=engine, perf_db=perf_db, max_batch_tokens=max_batch_tokens, max_num_seqs=max_num_seqs,
                              objective=objective)
    if designs is not None:
        spec = load_designs(designs)
        chosen = [spec.get(n) for n in only] if only else list(spec.designs)
        units: list[tuple[str, Design | None, float]] = [(d.name, d, r) for d in chosen for r in rates]
        mode = "designs"
    else:
        assert pools is not None  # (one of the two: checked above)
        pool_specs(pools, model, engine, perf_db)  # validate before forking
        units = [("plan", None, r) for r in rates]
        mode = "plan"
    job = _SweepJob(trace, duration_s, seed, Setup(model, slo, engine, perf_db, max_batch_tokens, max_num_seqs=max_num_seqs), options,
                    pools if mode == "plan" else None)
    rows = run_units(_sweep_unit, units, job, jobs, executor,
                     ray_address, progress, describe=lambda u: f"{u[0]} at {u[2]:g} req/s")
    return SweepResult(tuple(rows), mode)


@dataclass(frozen=True)
class WindowsResult:
    """One plan per window of a timestamped trace, and the plan for the peak window."""

    window_s: float
    rows: tuple  # dicts: window, start_s, end_s, requests, rate_rps, plan fields or error
    plans: tuple  # Plan or None per window

    @property
    def peak(self) -> int | None:
        """The window whose plan costs most; among equal costs, the busiest (most requests
        per second), so a quiet window never stands for the peak."""
        planned = [k for k, p in enumerate(self.plans) if p is not None]
        if not planned:
            return None
        return max(planned, key=lambda k: (self.plans[k].cost_usd_per_hour, self.rows[k]["rate_rps"] or 0.0,
                                           self.rows[k]["requests"], -k))

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(list(self.rows))

    def to_json(self) -> dict:
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
    try:  # as plain optimize: the better of split and co-located, or as the options' mode says
        plan = optimize(trace, model, slo, options=options, alternatives=0).plan
    except InfeasibleError as exc:
        return {**row, "error": str(exc)}, None
    return {**row, "prompt_pools": pools_text(plan.prompt_pools), "token_pools": pools_text(plan.token_pools),
            "mixed_pools": pools_text(plan.mixed_pools), "machines": plan.machines, "gpus": plan.gpus,
            "cost_usd_per_hour": plan.cost_usd_per_hour, "power_kw": plan.power_kw, "binding": plan.binding,
            "error": None}, plan


def plan_windows(window_s: float, trace=None, model: str = DEFAULT_MODEL, slo: str = DEFAULT_SLO, jobs: int = 1, executor: str = "local",
                 ray_address: str | None = None, progress=None, options: OptimizeOptions | None = None,
                 only: list[int] | None = None, **settings) -> WindowsResult:
    """Size each `window_s`-second window of a timestamped trace (a path, a Trace, or None: the
    embedded Azure code trace) on its own (a work unit each): how a cluster that follows the load
    compares with a static plan for the peak; options as `optimize` takes them.
    `only`: these windows (numbered as the result numbers them: the windows with requests)."""
    if window_s <= 0:
        raise SpecError(f"--window {window_s:g} s: must be > 0")
    units = [(k, start_s, part) for k, (start_s, part) in enumerate(windows(load_workload(trace), window_s))]
    if only is not None:
        units = [u for u in units if u[0] in set(only)]
    shared = (model, slo, dataclasses.replace(options or OptimizeOptions(), **settings, jobs=1, cliff=False))
    outcomes = run_units(_window_unit, units, shared, jobs, executor, ray_address, progress,
                         describe=lambda u: f"window {u[0]} from {u[1]:g} s")
    return WindowsResult(window_s, tuple(r for r, _ in outcomes), tuple(p for _, p in outcomes))
