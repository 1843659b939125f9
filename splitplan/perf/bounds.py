"""The bounds a fitted engine factor must stay within, and which factors a fit left on one.

A factor's bounds are physical: an efficiency is at most 1 and an overhead at least 0
(each fit's own table), and `compute_efficiency` at most the best GEMM throughput measured
on the slowest-to-peak GPU the fit covers at the profile's weight precision
(specs.hardware.HardwareSpec.compute_efficiency_ceiling). A factor that ends on a bound is
what the data pushed past physics, or what it could not pin: a finding to report with the
profile (its `fit.at_bound`), not physics to ship silently.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from splitplan.specs.hardware import HardwareSpec

AT_BOUND = 1e-3  # within this share of a factor's range from a bound counts as on it


def bounds(table: dict[str, tuple], names: list[str], hardware: Iterable[HardwareSpec], dtype: str):
    """Lower and upper bounds (arrays in `names` order) from `table` (name: (lower, upper, ...)),
    compute_efficiency's upper one lowered to the measured GEMM ceiling of every GPU in
    `hardware` at `dtype`; and why each upper bound is what it is (name: reason), where not the table's."""
    lower = np.array([table[n][0] for n in names], float)
    upper = np.array([table[n][1] for n in names], float)
    why: dict[str, str] = {}
    if "compute_efficiency" in names:
        k = names.index("compute_efficiency")
        for hw in hardware:
            ceiling, reason = hw.compute_efficiency_ceiling(dtype)
            if ceiling < upper[k]:
                upper[k], why["compute_efficiency"] = max(ceiling, lower[k]), reason
    return lower, upper, why


def at_bounds(names: list[str], values, lower, upper, why: dict[str, str] | None = None) -> dict[str, str]:
    """The factors (of `names`, fitted to `values`) that ended on a bound: name -> which and why."""
    out = {}
    for name, x, lo, hi in zip(names, values, lower, upper, strict=True):
        tolerance = AT_BOUND * max(hi - lo, 1e-12)
        if x >= hi - tolerance:
            out[name] = f"upper bound {hi:.4g}" + (f": {why[name]}" if why and name in why else "")
        elif x <= lo + tolerance:
            out[name] = f"lower bound {lo:.4g}"
    return out
