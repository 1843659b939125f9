"""Diurnal planning: size the cluster for each window of a timestamped trace, and for the peak.

    python examples/diurnal_planning.py [--trace PATH] [--window-min 10] [--quick]

A real trace's load moves through the day (the Azure code trace: 57 minutes, with
minutes of silence and bursts of 10 req/s). Planning for the mean under-provisions
the bursts; planning every window (`splitplan optimize --window 10m`) shows how much
a scheduler that resizes pools could save against a static plan for the peak window.
"""

from __future__ import annotations

import argparse
import os

import splitplan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=None)
    parser.add_argument("--window-min", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="two machine types, for tests")
    args = parser.parse_args()
    options = dict(hardware=["a100-80gb", "h100-80gb"], tp=8) if args.quick else {}
    result = splitplan.plan_windows(args.window_min * 60, args.trace, jobs=os.cpu_count() or 1, **options)
    frame = result.to_frame()
    print(frame[["window", "start_s", "requests", "rate_rps", "prompt_pools", "token_pools", "cost_usd_per_hour"]]
          .to_string(index=False, float_format=lambda x: f"{x:,.2f}"))
    peak = result.plans[result.peak]
    mean = result.to_json()["mean_cost_usd_per_hour"]
    print(f"\nstatic plan for the peak window ({result.peak}): ${peak.cost_usd_per_hour:.1f}/h; resizing every window "
          f"averages ${mean:.1f}/h ({(1 - mean / peak.cost_usd_per_hour) * 100:.0f} % less)")


if __name__ == "__main__":
    main()
