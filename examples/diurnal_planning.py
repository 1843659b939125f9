"""Diurnal planning: size the cluster for each window of a timestamped trace, and for the peak.

    python examples/diurnal_planning.py [--trace PATH] [--window-min 10] [--quick]

A real trace's load moves through the day (the Azure code trace: 57 minutes, with
minutes of silence and bursts of 10 req/s). Planning for the mean under-provisions
the bursts; planning every window shows how much a scheduler that resizes pools
could save against a static plan for the peak window.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

import splitplan


def windows(trace: splitplan.Trace, minutes: float) -> list[splitplan.Trace]:
    edges = np.arange(0.0, trace.span_s + 1e-9, minutes * 60)
    out = []
    for start in edges:
        mask = (trace.arrival_s >= start) & (trace.arrival_s < start + minutes * 60)
        if mask.sum() >= 2:
            out.append(dataclasses.replace(trace, arrival_s=trace.arrival_s[mask] - trace.arrival_s[mask][0],
                                           prompt_tokens=trace.prompt_tokens[mask], output_tokens=trace.output_tokens[mask],
                                           source=f"{trace.source} [{start / 60:.0f}-{(start / 60 + minutes):.0f} min]"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=None)
    parser.add_argument("--window-min", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="two machine types, for tests")
    args = parser.parse_args()
    hardware = ["a100-80gb", "h100-80gb"] if args.quick else None
    trace = splitplan.workload(args.trace)
    print(f"{'window':<14}{'requests':>9}{'req/s':>8}{'prompt':>22}{'token':>22}{'$/h':>9}")
    costs, peak = [], None
    for part in windows(trace, args.window_min):
        result = splitplan.plan(part, hardware=hardware, tp=8 if args.quick else None)
        p = result.plan
        costs.append(p.cost_usd_per_hour)
        label = part.source.rsplit("[", 1)[1].rstrip("]")
        pools = lambda ps: " + ".join(f"{x.machines}x {x.hardware}" for x in ps)  # noqa: E731
        print(f"{label:<14}{len(part):>9}{part.mean_rate_rps:>8.2f}{pools(p.prompt_pools):>22}{pools(p.token_pools):>22}"
              f"{p.cost_usd_per_hour:>9.1f}")
        if peak is None or p.cost_usd_per_hour > peak[1]:
            peak = (label, p.cost_usd_per_hour)
    print(f"\nstatic plan for the peak window ({peak[0]}): ${peak[1]:.1f}/h; resizing every window averages "
          f"${np.mean(costs):.1f}/h ({(1 - np.mean(costs) / peak[1]) * 100:.0f} % less)")


if __name__ == "__main__":
    main()
