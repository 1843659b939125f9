"""What prefix caching does to the plan (issue 29, item 4): hit rate, prefill instances and cost.

    python bench/prefix_study.py [--mooncake-model llama3.1-8b] [--azure-model llama3.1-70b] [--hardware h100-80gb]
                                 [--slo chat] [--speedup 12] [--offload-gb 500] [--max-requests 4000] [--quick]

Workloads:
- Mooncake's conversation trace (`../shared/data/traces/mooncake_conversation.jsonl`): its own
  prefixes, `hash_ids` as chains of 512-token blocks, its timestamps compressed `--speedup` times
  (at its own 3.4 req/s the model fills two machines: too few for a plan to move), planned for
  `--mooncake-model` (its prompts, 27k tokens at p90, miss chat's TTFT p99 on a 70B model alone);
- the Azure 2023 conversation trace (`../shared/data/traces/azure_conv_2023.csv`), which records
  no prefixes: as is (nothing to reuse), and with a shared system prompt of 1,000 tokens, one of
  8 (`--shared-prefix-tokens 1000 --prefix-groups 8`: an assumption, labelled as one), planned for
  `--azure-model`.
Each on its busiest stretch of `--max-requests` requests, planned by `splitplan optimize` four
ways: the cache off; on (join-shortest-queue routing); on with prefix-aware routing; and that with
a host-memory tier of `--offload-gb` GB per prefilling instance. Printed per row: the prompt
pool's hit rate as the planner's replay saw it, the prompt instances each prompt layout needs
alone (before whole machines), the best split plan, its cost, and the recommended plan
(split or co-located) with its cost; `--validate` is not run (see the simulator's agreement in
tests/sim/test_prefix_cache.py, exact for prompt pools).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from splitplan import api  # noqa: E402
from splitplan.io.report import pools_text  # noqa: E402
from splitplan.specs.roles import Role  # noqa: E402
from splitplan.workload.trace import load_trace, peak_window, with_shared_prefix  # noqa: E402

TRACES = ROOT.parent / "shared" / "data" / "traces"


def workloads(max_requests: int, speedup: float):
    mooncake = load_trace(TRACES / "mooncake_conversation.jsonl")
    mooncake = peak_window(mooncake.at_rate(mooncake.mean_rate_rps * speedup), max_requests)[0]
    azure = peak_window(load_trace(TRACES / "azure_conv_2023.csv"), max_requests)[0]
    return [("Mooncake conversation (hash_ids)", mooncake, "mooncake"), ("Azure conversation (no prefixes recorded)", azure, "azure"),
            ("Azure conversation + 1,000-token system prompt, 8 of them (assumed)", with_shared_prefix(azure, 1000, 8), "azure")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mooncake-model", default="llama3.1-8b")
    parser.add_argument("--azure-model", default="llama3.1-70b")
    parser.add_argument("--hardware", default="h100-80gb")
    parser.add_argument("--slo", default="chat")
    parser.add_argument("--speedup", type=float, default=12.0)
    parser.add_argument("--offload-gb", type=float, default=500.0)
    parser.add_argument("--max-requests", type=int, default=4000)
    parser.add_argument("--quick", action="store_true", help="Mooncake only, cache off and on")
    args = parser.parse_args()
    ways = [("off", dict(prefix_caching=False)), ("on, jsq", dict(prefix_caching=True)),
            ("on, prefix-aware", dict(prefix_caching=True, routing="prefix-aware")),
            (f"on, prefix-aware, {args.offload_gb:g} GB host tier", dict(prefix_caching=True, routing="prefix-aware",
                                                                      kv_offload_gb=args.offload_gb))]
    loads = workloads(args.max_requests, args.speedup)
    if args.quick:
        loads, ways = loads[:1], ways[:2]
    print(f"{args.hardware}, SLO {args.slo}\n")
    print("| workload | cache | prompt hit % | prompt instances needed alone | split plan | split $/h | plan | $/h | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, trace, source in loads:
        model = args.mooncake_model if source == "mooncake" else args.azure_model
        for way, options in ways:
            start = time.perf_counter()
            result = api.optimize(trace, model, args.slo, hardware=[args.hardware], jobs=2, **options)
            seconds = time.perf_counter() - start
            split = result.split
            hits = [p.prefix_hit_rate for p in split.prompt_pools if p.prefix_hit_rate is not None] if split else []
            alone = ", ".join(sorted({f"{o.inst.layout}: {o.instances}" for o in result.options
                                      if o.role == Role.PROMPT and o.instances}))  # (each prompt layout sized alone, on any shape)
            plan = result.plan
            kind = "co-located " if plan.mixed_pools else ""
            head = f"| {name}, {model} ({len(trace):,} requests, {trace.mean_rate_rps:.2g} req/s) | {way} |"
            print(f"{head} {hits[0] * 100:.1f} |" if hits else f"{head} - |", end="")
            print(f" {alone} | {pools_text(split.prompt_pools) + ' / ' + pools_text(split.token_pools) if split else '-'} | "
                  f"{split.cost_usd_per_hour:,.0f} |" if split else " - | - | - |", end="")
            print(f" {kind}{pools_text(plan.pools)} | {plan.cost_usd_per_hour:,.0f} | {seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
