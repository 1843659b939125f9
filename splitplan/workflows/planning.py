"""`splitplan optimize`'s workflows, chosen in one place: a plan for a trace (its busiest stretch
where it is long), the highest rate a budget serves (`throughput`), a closed loop of
clients (`concurrency`), a plan per window with the schedule that follows it (`window_s`), each
plan optionally validated by simulation (`validate`). The CLI parses into `Planning` and renders
the `Planned` it gets back (`plan_for`); `splitplan.plan` is the same call."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from splitplan.base.errors import SpecError
from splitplan.search.optimize import Mode, OptimizeOptions, OptimizeResult, optimize
from splitplan.search.rate import max_rate
from splitplan.workflows.schedule import Schedule, follow
from splitplan.workflows.simulation import optimize_closed_loop, setup_for, validate_result
from splitplan.workflows.studies import WindowsResult, plan_windows
from splitplan.workload.trace import (
    Trace,
    check_closed_loop,
    check_request_sizes,
    closed_loop_workload,
    load_workload,
    peak_window,
    resample_poisson,
)


@dataclass(frozen=True, kw_only=True)
class Planning:
    """What is planned, beside how the search runs (OptimizeOptions): with `throughput`, the highest
    rate a plan within the budget serves (else the plan for the trace's load); the workload (the trace
    resampled at `rate_rps` for `duration_s` with `seed`, or as it is; its busiest `max_requests`
    when longer), a closed loop of `concurrency` clients (requests of `isl`/`osl` tokens, or the
    trace's sizes; `num_requests` of them), a plan per `window_s`-second window (instances added
    `scale_up_lead_s` ahead; None: estimated), and `validate` (simulate the plan and grow it until
    the simulation meets the SLO; with `mixed_pool_threshold`, Splitwise's mixed pool, trimmed)."""

    throughput: bool = False
    rate_rps: float | None = None
    duration_s: float = 120.0
    seed: int = 0
    max_requests: int = 100_000
    validate: bool = False
    mixed_pool_threshold: int | None = None
    concurrency: int | None = None
    isl: int | None = None
    osl: int | None = None
    num_requests: int | None = None
    window_s: float | None = None
    scale_up_lead_s: float | None = None
    executor: str = "local"  # where --validate's and --window's work units run (base.parallel)
    ray_address: str | None = None

    def __post_init__(self) -> None:
        check_closed_loop(self.concurrency, self.isl, self.osl, self.num_requests)
        if self.mixed_pool_threshold is not None and not self.validate:
            raise SpecError("--mixed-pool-threshold is Splitwise's mixed pool in the simulator, which the planner does not "
                            "model: add --validate (the plan is simulated with it and trimmed while it meets the SLO)")
        if self.window_s is None and self.scale_up_lead_s is not None:
            raise SpecError("--scale-up-lead times the schedule of a --window plan: add --window")

    def check(self, options: OptimizeOptions) -> None:
        """Exit 2 where `options` contradict this planning's workflow."""
        if self.concurrency is not None:
            given = {"--rate": self.rate_rps is not None, "--window": self.window_s is not None, "--pareto": options.pareto,
                     "--validate": self.validate, "--objective throughput": self.throughput,
                     "--headroom (for headroom, raise --concurrency)": options.headroom_pct > 0}
            if any(given.values()):
                raise SpecError(f"--concurrency plans a closed loop (its rate follows from its latency, checked by simulation); "
                                f"drop {', '.join(flag for flag, on in given.items() if on)}")
        if self.window_s is not None and (self.validate or options.pareto or self.throughput):
            raise SpecError("--window plans each window by cost or power; drop --validate/--pareto/throughput")
        colocated = options.mode is Mode.COLOCATED
        if options.pareto and (colocated or self.throughput):
            raise SpecError("--pareto compares split plans by cost and power: drop --no-split / --objective throughput")
        if self.throughput and colocated:
            raise SpecError("--objective throughput plans split pools; drop --no-split")


@dataclass(frozen=True)
class Planned:
    """What `plan_for` found: the plan (`result`) and the workload it was sized on (`workload`, with
    `stretch`: the busiest stretch taken from a longer trace, else None); or, with a window, the
    plan per window and the schedule on the peak plan's pools (`result` None)."""

    workload: Trace
    result: OptimizeResult | None = None
    stretch: dict | None = None
    windows: WindowsResult | None = None
    schedule: Schedule | None = None


@contextlib.contextmanager
def quiet(title: str, total: int | None = None):
    """Progress that says nothing: `plan_for`'s default (the CLI shows a bar)."""
    yield lambda message=None: None


def plan_for(trace: Trace, model: str, slo: str, options: OptimizeOptions, planning: Planning, progress=quiet) -> Planned:
    """The workflow `planning` asks for, on `trace` (as read: resampled here at `planning.rate_rps`).
    `progress(title, total)`: a context manager per long step, yielding `step(message=None)`, called
    as each unit of it finishes."""
    planning.check(options)
    if planning.concurrency is not None:
        check_request_sizes(model, options.engine, planning.isl, planning.osl)
        workload = closed_loop_workload(trace, planning.concurrency, planning.num_requests, planning.isl, planning.osl,
                                        planning.seed)
        with progress("closed loop: plan at the rate Little's law gives, simulate, replan") as step:
            result = optimize_closed_loop(workload, planning.concurrency, model, slo, planning.seed, progress=lambda r: step(),
                                          options=options)
        return Planned(workload, result)
    resampled = load_workload(trace, planning.rate_rps, planning.duration_s, planning.seed)
    if planning.window_s is not None:
        return _windows(resampled, model, slo, options, planning, progress)
    workload, stretch = peak_window(resampled, planning.max_requests)
    if planning.throughput:
        result, workload = _highest_rate(peak_window(trace, planning.max_requests)[0], planning,
                                         planning.rate_rps or workload.mean_rate_rps, model, slo, options, progress)
    else:
        result = optimize(workload, model, slo, options=options)
    if planning.validate:
        setup = setup_for(model, slo, options, planning.mixed_pool_threshold)
        with progress("validating the runner-ups and the plan by simulation", len(result.alternatives) + 1) as step:
            result = validate_result(result, workload, setup, options.jobs, planning.executor, planning.ray_address, step)
    return Planned(workload, result, stretch)


def _highest_rate(base: Trace, planning: Planning, start_rps: float, model: str, slo: str, options: OptimizeOptions, progress):
    """The result at the highest rate served, and the workload at that rate: `base` resampled at
    each rate (Poisson) where a rate was given, else its timestamps compressed."""
    def workload_at(r):
        if planning.rate_rps is not None:
            return resample_poisson(base, r, planning.duration_s, np.random.default_rng(planning.seed))
        return base.at_rate(r)

    with progress("searching the highest rate") as step:
        result = max_rate(workload_at, start_rps, model, slo, options=options,
                          progress=lambda r, ok: step(f"{r:.3g} req/s: {'served' if ok else 'not served'}"))
    return result, workload_at(result.max_rate_rps)


def _windows(workload: Trace, model: str, slo: str, options: OptimizeOptions, planning: Planning, progress) -> Planned:
    """A plan per window, and the schedule on the peak plan's pools."""
    window_s = planning.window_s
    assert window_s is not None  # (plan_for's branch)
    count = int(np.unique(np.floor(workload.arrival_s / window_s)).size) if window_s > 0 else None
    run = (options.jobs, planning.executor, planning.ray_address)
    with progress("planning windows", count) as step:
        windows = plan_windows(window_s, workload, model, slo, *run, step, options=options)
    with progress("the schedule on the peak plan's pools") as step:
        schedule = follow(workload, windows, model, slo, options, planning.scale_up_lead_s, *run, step)
    return Planned(workload, windows=windows, schedule=schedule)
