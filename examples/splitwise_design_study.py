"""Reproducing Splitwise's design study on the Azure traces.

    python examples/splitwise_design_study.py [--conv PATH] [--quick]

The paper's four provisioning scenarios over its six designs (Baseline-A100/H100,
Splitwise-AA/HH/HA/HHcap): iso-power and iso-cost with the budget of 40 DGX-H100,
and the cheapest / lowest-power cluster at a fixed rate, on the coding trace (and
the conversation trace when given). Every rate is a Poisson resample of the
trace's sizes, as in the paper (2 minutes each; 30 s with --quick).
"""

from __future__ import annotations

import argparse
import os

import splitplan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conv", default=None, help="the Azure conversation trace (shared/data/traces/azure_conv_2023.csv)")
    parser.add_argument("--quick", action="store_true", help="one trace, shorter resamples, two scenarios")
    args = parser.parse_args()
    duration = 30.0 if args.quick else 120.0
    traces = {"code": None} | ({"conversation": args.conv} if args.conv and not args.quick else {})
    scenarios = {"iso-power": dict(budget_machines={"h100-80gb": 40}),
                 "iso-cost": dict(budget_machines={"h100-80gb": 40}),
                 "iso-throughput-cost": dict(rate=70.0),
                 "iso-throughput-power": dict(rate=70.0)}
    if args.quick:
        scenarios = {k: scenarios[k] for k in ("iso-power", "iso-throughput-cost")}
    for trace_name, path in traces.items():
        for scenario, options in scenarios.items():
            result = splitplan.compare("splitwise-designs", scenario, trace=path, duration_s=duration,
                                       jobs=os.cpu_count() or 1, **options)
            frame = result.to_frame()[["design", "prompt_machines", "token_machines", "mixed_machines",
                                       "cost_usd_per_hour", "power_kw", "max_rate_rps", "ratio_to_baseline"]]
            print(f"\n{trace_name} trace, {scenario} (ratio against {result.baseline})")
            print(frame.to_string(index=False, float_format=lambda x: f"{x:,.2f}"))


if __name__ == "__main__":
    main()
