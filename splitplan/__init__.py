"""splitplan: provision phase-split ("disaggregated") LLM serving clusters.

The Python API for capacity-planning scripts. Every function takes catalog names
or file paths (or loaded objects), and returns a typed result with `.to_frame()`
(pandas) and `.to_json()` (the same document the CLI prints):

    import splitplan
    result = splitplan.plan(model="llama2-70b", slo="splitwise", rate=20, duration_s=120)
    result.to_frame()                     # the plan and its runner-ups
    splitplan.simulate(result.plan, rate=20).to_json()["summary"]["ttft_ms"]
    splitplan.compare("splitwise-designs", "iso-power", budget_machines={"h100-80gb": 40})
    splitplan.sweep([5, 10, 20], designs="splitwise-designs")
    splitplan.export("out/plan.json", "llm-d", output="deploy")  # a plan.json as a deployment

See docs/API.md.
"""

from __future__ import annotations

__version__ = "0.1.0"

import os
from typing import TYPE_CHECKING

from splitplan.base.defaults import DEFAULT_MODEL, DEFAULT_SLO

# Imported here (numpy only) before `workload` below is defined: importing the subpackage
# later would rebind the name `splitplan.workload` to it.
from splitplan.workload.trace import Trace, load_trace, resample_poisson  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from splitplan.api import (
        BenchCalibration,
        BenchSettings,
        CalibrateResult,
        CompareResult,
        OptimizeResult,
        SimulateResult,
        SweepResult,
        calibrate,
        calibrate_bench,
        compare,
        plan_windows,
        sweep,
    )
    from splitplan.deploy import Export
    from splitplan.specs.catalog import Catalog

# Imported on first use, so `import splitplan` (and the CLI's --help) stays fast. The studies and
# calibration are the library's own functions (splitplan.api's), one signature each.
_LAZY = {"CalibrateResult": "splitplan.api", "CompareResult": "splitplan.api", "OptimizeResult": "splitplan.api",
         "SimulateResult": "splitplan.api", "SweepResult": "splitplan.api", "Export": "splitplan.deploy",
         "compare": "splitplan.api", "sweep": "splitplan.api", "plan_windows": "splitplan.api", "calibrate": "splitplan.api",
         "calibrate_bench": "splitplan.api", "BenchSettings": "splitplan.api", "BenchCalibration": "splitplan.api",
         "Catalog": "splitplan.specs.catalog"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'splitplan' has no attribute {name!r}")

__all__ = ["plan", "simulate", "compare", "sweep", "calibrate", "calibrate_bench", "BenchSettings", "BenchCalibration",
           "export", "plan_windows", "workload", "Trace", "load_trace",
           "resample_poisson", "OptimizeResult", "SimulateResult", "CompareResult", "SweepResult", "CalibrateResult", "Export",
           "Catalog"]


def workload(trace=None, rate: float | None = None, duration_s: float = 120.0, seed: int = 0) -> Trace:
    """A Trace: `trace` (a path, a Trace, or None for the embedded Azure code trace),
    or its Poisson resample at `rate` req/s for `duration_s` seconds."""
    from splitplan.workload.trace import load_workload
    return load_workload(trace, rate, duration_s, seed)


def plan(trace=None, model: str = DEFAULT_MODEL, slo: str = DEFAULT_SLO, rate: float | None = None,
         duration_s: float = 120.0, seed: int = 0, **options) -> OptimizeResult:
    """The cheapest (or lowest-power, `objective="power"`) plan meeting the SLO, as `splitplan
    optimize` finds it (`splitplan.api.plan_for`). Options: the fields of `splitplan.api.Planning`
    (validate, mixed_pool_threshold, throughput, concurrency, isl, osl, num_requests, max_requests,
    executor, ray_address) and of `splitplan.api.OptimizeOptions` (hardware, prompt_hardware,
    token_hardware, tp, objective, engine, search, max_cost_per_hour, max_power_kw, max_machines,
    mode, pareto, jobs, perf_db, ...), or `options=` one. A plan per window: `plan_windows`."""
    import dataclasses

    from splitplan import api
    asked = {f.name for f in dataclasses.fields(api.Planning)} - {"rate_rps", "duration_s", "seed", "window_s", "scale_up_lead_s"}
    planning = api.Planning(rate_rps=rate, duration_s=duration_s, seed=seed, **{k: options.pop(k) for k in asked & set(options)})
    search = dataclasses.replace(options.pop("options", None) or api.OptimizeOptions(), **options)
    result = api.plan_for(workload(trace), model, slo, search, planning).result
    assert result is not None  # (a plan per window is plan_windows')
    return result


def simulate(plan_or_pools, trace=None, model: str | None = None, slo: str | None = None, rate: float | None = None,
             duration_s: float | None = None, seed: int | None = None, **options) -> SimulateResult:
    """Simulate a Plan (from `plan()`) or a list of (role, hardware, tp, machines) (the defaults:
    DEFAULT_MODEL, DEFAULT_SLO, 120 s, seed 0); or a plan.json (a path) as `splitplan simulate --plan`
    does, with the settings it records, each replaced where given here (`simulate_plan`)."""
    from splitplan import api
    if isinstance(plan_or_pools, (str, os.PathLike)):
        from splitplan.workflows.plan_replay import simulate_plan
        return simulate_plan(plan_or_pools, trace, rate, duration_s, seed, model, slo, **options)
    pools = plan_or_pools if isinstance(plan_or_pools, list) else api.plan_pools(plan_or_pools)
    return api.simulate_pools(workload(trace, rate, 120.0 if duration_s is None else duration_s, seed or 0), pools,
                              model or DEFAULT_MODEL, slo or DEFAULT_SLO, **options)


def export(plan, to: str, output=None, **options) -> Export:
    """A plan.json (as `optimize --output-dir` writes it) as a deployment for `to`: dynamo, llm-d,
    vllm or sglang (`splitplan export`). Returns the Export: `.files` (name -> text, the main one
    first), `.report()` (EXPORT.md: the mapping), `.unexpressed` (what the target cannot say);
    with `output`, written into that folder as one set. Options: backend, model_id, image,
    node_selector (["KEY=VALUE", ...]), model_cache_pvc, schedule (a windows.json of `optimize
    --window`: keda.yaml too), schedule_start ("HH:MM"), timezone. A catalog entry that changed
    since the plan was made is a warning (the plan's copy is used)."""
    import warnings
    from pathlib import Path

    from splitplan.deploy import export_plan
    result, notes = export_plan(plan, to, option="plan", **options)
    for note in notes:
        warnings.warn(note, stacklevel=2)
    if output is not None:
        result.write(Path(output))
    return result
