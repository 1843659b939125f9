"""Plan DeepSeek-V3 for a chat service on H200, B200 or GB200 NVL72, split and co-located (issue 17).

    python examples/deepseek_v3.py [--quick] [--rate RPS]

DeepSeek-V3 in fp8 has 671 GB of weights: an instance takes one 8-GPU H200 or B200 machine at
TP 8, or spreads its experts wider (DP 16 EP 16 over two machines, ...); on B200 and GB200 its
weights may also be fp4 (NVFP4). For each machine type and weight precision, the cheapest split
plan and the cheapest co-located plan under the `chat` SLO, at `--rate` requests per second
resampled from the embedded Azure code trace; the search picks each pool's layout (TP, wide
expert parallelism with data-parallel attention, instances over several machines).

Read the costs as lower bounds: held out on 753 measured DeepSeek and Qwen3-MoE runs
(bench/moe_accuracy.py), the shipped profiles predict TTFT about 35 % and TPOT about 15 % too
low (medians), so real deployments need more machines than these plans.
"""

from __future__ import annotations

import argparse

import splitplan
from splitplan.base.errors import InfeasibleError

CASES = [("h200-141gb", "trtllm-fp8"), ("b200-180gb", "trtllm-fp8"), ("b200-180gb", "trtllm-fp8@weights=fp4"),
         ("gb200-nvl72", "trtllm-fp8@weights=fp4")]


def pools(plan) -> str:
    parts = [(role, p) for role in ("prompt", "token", "mixed") for p in getattr(plan, f"{role}_pools")]
    return "; ".join(f"{role} {p.machines}x {p.hardware} {p.layout}" for role, p in parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a shorter resample, for tests")
    parser.add_argument("--rate", type=float, default=60.0)
    args = parser.parse_args()
    duration = 30 if args.quick else 120
    print(f"DeepSeek-V3, chat SLO, {args.rate:g} req/s (Poisson resample of the Azure code trace, {duration} s)\n")
    print(f"{'machine':<12} {'engine':<24} {'kind':<10} {'plan':<64} {'$/h':>8} {'kW':>7}")
    for hardware, engine in CASES:
        for split in (True, False):
            kind = "split" if split else "co-located"
            try:
                result = splitplan.plan(model="deepseek-v3", slo="chat", rate=args.rate, duration_s=duration,
                                        hardware=[hardware], engine=engine, mode="split" if split else "colocated")
            except InfeasibleError as exc:
                print(f"{hardware:<12} {engine:<24} {kind:<10} infeasible: {exc}")
                continue
            p = result.plan
            print(f"{hardware:<12} {engine:<24} {kind:<10} {pools(p):<64} {p.cost_usd_per_hour:>8.2f} {p.power_kw:>7.1f}")
    print("\nCosts are lower bounds: the model is optimistic for MoE (bench/moe_accuracy.py).")


if __name__ == "__main__":
    main()
