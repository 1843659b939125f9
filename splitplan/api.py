"""Library facade: what the CLI calls, usable from capacity-planning scripts.

Each function takes names or paths (or loaded specs), makes one pass through the
pure layers and returns plain data. The work lives where its idea does:
`perf.points` (instances and single passes), `search.optimize` (plans), `search.rate` (rate
searches), `planning` (optimize's workflows chosen: a plan, the highest rate, a closed loop,
windows, each validated or not), `simulation` (simulating and validating plans, closed loops),
`calibration` (fitting engine profiles), `studies` (compare, sweep, windows).
"""

from splitplan.base.defaults import (
    DEFAULT_ENGINE,
    DEFAULT_MODEL,
    DEFAULT_SLO,
    MAX_BATCH_TOKENS,
)
from splitplan.perf.points import instance, instance_facts, perf_points
from splitplan.search.optimize import Mode, OptimizeOptions, OptimizeResult, objective_value, optimize
from splitplan.search.rate import max_rate
from splitplan.workflows.calibration import (
    BenchCalibration,
    BenchSettings,
    CalibrateResult,
    DeploymentCalibration,
    calibrate,
    calibrate_bench,
    calibrate_deployments,
)
from splitplan.workflows.planning import Planned, Planning, plan_for
from splitplan.workflows.schedule import Schedule, follow
from splitplan.workflows.simulation import (
    Setup,
    SimulateResult,
    optimize_closed_loop,
    plan_from_pools,
    plan_pools,
    pool_specs,
    setup_for,
    simulate_plans,
    simulate_pools,
    validate,
    validate_result,
)
from splitplan.workflows.studies import (
    SCENARIOS,
    CompareResult,
    DesignResult,
    SweepResult,
    WindowsResult,
    compare,
    plan_windows,
    sweep,
)

__all__ = [
    "DEFAULT_ENGINE", "DEFAULT_MODEL", "DEFAULT_SLO", "MAX_BATCH_TOKENS", "SCENARIOS",
    "instance", "instance_facts", "perf_points",
    "Mode", "OptimizeOptions", "OptimizeResult", "objective_value", "optimize", "max_rate", "optimize_closed_loop",
    "Setup", "SimulateResult", "simulate_plans", "simulate_pools", "validate", "validate_result", "pool_specs", "plan_from_pools",
    "plan_pools", "setup_for",
    "CalibrateResult", "DeploymentCalibration", "calibrate", "calibrate_deployments", "BenchCalibration", "BenchSettings",
    "calibrate_bench",
    "CompareResult", "DesignResult", "SweepResult", "WindowsResult", "compare", "sweep", "plan_windows",
    "Schedule", "follow", "Planning", "Planned", "plan_for",
]
