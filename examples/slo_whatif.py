"""What if the SLO tightens? The cost of the cheapest plan as the TTFT p99 limit shrinks.

    python examples/slo_whatif.py [--quick]

SLO profiles are data: this writes one per limit (TTFT p99 from 4 s down to 0.25 s,
TBT p99 fixed at 100 ms) and plans each.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import splitplan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer limits and machine types, for tests")
    args = parser.parse_args()
    limits = [4000, 1000, 500] if args.quick else [4000, 2000, 1000, 500, 250]
    hardware = ["a100-80gb", "h100-80gb"] if args.quick else None
    print(f"{'TTFT p99 limit':>15}  {'plan':<60}{'$/h':>9}  binding")
    with tempfile.TemporaryDirectory() as tmp:
        for limit in limits:
            path = Path(tmp) / f"ttft-{limit}.yaml"
            path.write_text(f"description: what-if\nttft:\n  p99: {{max_ms: {limit}}}\ntbt:\n  p99: {{max_ms: 100}}\n")
            try:
                p = splitplan.plan(slo=str(path), rate=30, duration_s=60 if args.quick else 120, hardware=hardware).plan
            except splitplan.api.InfeasibleError as exc:
                print(f"{limit:>13} ms  infeasible: {exc}")
                continue
            text = "prompt " + " + ".join(f"{x.machines}x {x.hardware}/tp{x.tp}" for x in p.prompt_pools) + \
                "; token " + " + ".join(f"{x.machines}x {x.hardware}/tp{x.tp}" for x in p.token_pools)
            print(f"{limit:>13} ms  {text:<60}{p.cost_usd_per_hour:>9.1f}  {p.binding}")


if __name__ == "__main__":
    main()
