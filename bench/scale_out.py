"""Scale-out: one study of 200+ work units on 1 local process, 2 local processes and local Ray.

    python bench/scale_out.py [--rates 50] [--duration 30]

The study: `splitplan sweep` over N rates (default 50, 1 to 100 req/s) for four
designs (Splitwise-AA, -HH, -HA, Baseline-H100): 4 x N work units, each the
cheapest plan of one design at one rate (a Poisson resample of the Azure code
trace for --duration seconds). Each executor runs the same units, and the
outputs are checked identical. Per-unit overhead = (wall x workers - serial
wall) / units: what an executor adds to each unit beyond the work itself (Ray's
includes starting and stopping its local instance).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from splitplan import api
from splitplan.workload.trace import default_trace_path, load_trace

DESIGNS = ["Splitwise-AA", "Splitwise-HH", "Splitwise-HA", "Baseline-H100"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=int, default=50)
    parser.add_argument("--duration", type=float, default=30.0)
    args = parser.parse_args()
    trace = load_trace(default_trace_path())
    rates = [float(r) for r in np.linspace(1, 100, args.rates)]
    units = len(rates) * len(DESIGNS)
    runs = {"1 local process": dict(jobs=1), "2 local processes": dict(jobs=2),
            "local Ray (2 CPUs)": dict(jobs=2, executor="ray")}
    results, walls = {}, {}
    for name, options in runs.items():
        start = time.perf_counter()
        results[name] = api.sweep(rates, trace, designs="splitwise-designs", only=DESIGNS, duration_s=args.duration,
                                  **options).to_json()
        walls[name] = time.perf_counter() - start
    import ray  # a cluster that is already up, as with --ray-address auto: no start-up in the timing
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    runs["Ray already running (2 CPUs)"] = dict(jobs=2, executor="ray")
    start = time.perf_counter()
    results["Ray already running (2 CPUs)"] = api.sweep(rates, trace, designs="splitwise-designs", only=DESIGNS,
                                                        duration_s=args.duration, executor="ray", jobs=2).to_json()
    walls["Ray already running (2 CPUs)"] = time.perf_counter() - start
    ray.shutdown()
    same = all(r == results["1 local process"] for r in results.values())
    serial = walls["1 local process"]
    print(f"{units} work units ({len(DESIGNS)} designs x {len(rates)} rates, {args.duration:g} s resamples); "
          f"identical outputs: {same}\n")
    print("| executor | wall s | speed-up | overhead per unit ms |")
    print("|---|---|---|---|")
    for name, wall in walls.items():
        workers = runs[name]["jobs"]
        overhead = (wall * workers - serial) / units * 1e3
        print(f"| {name} | {wall:.1f} | {serial / wall:.2f}x | {overhead:.0f} |")


if __name__ == "__main__":
    main()
