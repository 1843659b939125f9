"""Does the simulator accept the planner's plans, and do their percentiles agree?

    python bench/validate_agreement.py [--quick] [--layouts | --only-layouts]

For each case (trace x rate x machine set x SLO profile; TP 8, llama2-70b, lean engine,
Poisson resample of 120 s), plan with `optimize`, then `validate` (simulate; grow the
binding pool while a line fails). Reports per case: the plan, machines the simulation
added, and for every SLO line the planner's value beside the simulator's on the final
plan, with the relative difference. Target (issue 12): the simulator accepts every plan,
and every line agrees within 25 %.

Traces: the embedded Azure code trace, and `../shared/data/traces/azure_conv_2023.csv`
when present.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from splitplan import api
from splitplan.base.errors import InfeasibleError
from splitplan.io.report import plan_text
from splitplan.workload.trace import default_trace_path, load_trace, load_workload, resample_poisson

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
RATES = (10, 40, 70)
HARDWARE = ("a100-80gb", "h100-80gb", "h200-141gb")
SLOS = ("splitwise", "chat", "code-completion", "batch")
TOLERANCE = 0.25


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


# Issue 27, item 1: co-located plans, TP 1/2/4 and MoE layouts (the layout the planner picks where
# none is named), llama and MoE models, on the conversation trace with the chat SLO.
# (label, model, engine, hardware, tp, split)
LAYOUT_CASES = (
    ("co-located TP 8", "llama2-70b", "lean", ("h100-80gb",), 8, False),
    ("co-located, any TP", "llama3.1-70b", "lean-fp8", ("h200-141gb", "b200-180gb"), None, False),
    ("split TP 1", "llama3.1-8b", "lean", ("h100-80gb",), 1, True),
    ("split TP 2", "llama3.1-70b", "lean-fp8", ("h100-80gb",), 2, True),
    ("split TP 4", "qwen3-32b", "lean", ("a100-80gb",), 4, True),
    ("MoE split, any layout", "mixtral-8x7b", "lean", ("h100-80gb",), None, True),
    ("MoE co-located, any layout", "gpt-oss-120b", "lean-fp8", ("h200-141gb",), None, False),
    # issue 28: the default engine (vLLM's chunked scheduler with async scheduling and its front end)
    ("vllm co-located TP 8", "llama2-70b", "vllm", ("h100-80gb",), 8, False),
    ("vllm split TP 1", "llama3.1-8b", "vllm", ("h100-80gb",), 1, True),
    ("vllm split TP 4", "llama2-70b", "vllm", ("h100-80gb",), 4, True),
    ("vllm MoE split, any layout", "mixtral-8x7b", "vllm", ("h100-80gb",), None, True),
)
LAYOUT_RATES = (20, 60)


def run_case(trace, label, rate, hardware, slo, model="llama2-70b", engine="lean", tp=8, split=True) -> dict:
    workload = resample_poisson(trace, rate, 120.0, np.random.default_rng(0))
    start = time.perf_counter()
    try:
        result = api.optimize(workload, model, slo, hardware=list(hardware), tp=tp, engine=engine,
                              mode="split-alone" if split else "colocated")
        plan, sim, added = api.validate(result.plan, result.problem.trace, model, slo, engine, planned=result)
    except InfeasibleError as exc:
        return {"case": (label, rate, "+".join(hardware), slo), "error": str(exc), "seconds": time.perf_counter() - start}
    predicted = {line.label: value for line, value, _ in plan.slo}
    lines = []
    for row in sim.summary.slo:
        p, s = predicted.get(row.line), row.achieved
        lines.append((row.line, p, s, row.met, None if p is None or s is None else relative(p, s)))
    return {"case": (label, rate, "+".join(hardware), slo), "plan": plan_text(plan), "added": added,
            "lines": lines, "seconds": time.perf_counter() - start}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one rate and one SLO per trace")
    ap.add_argument("--layouts", action="store_true", help="also co-located plans, TP 1/2/4 and MoE layouts (issue 27)")
    ap.add_argument("--only-layouts", action="store_true", help="those cases alone")
    ap.add_argument("--match", default="", help="with --layouts or --only-layouts: the layout cases whose label has TEXT")
    args = ap.parse_args()
    traces = [("code", load_trace(default_trace_path()))]
    if (SHARED / "traces" / "azure_conv_2023.csv").is_file():
        traces.append(("conv", load_trace(SHARED / "traces" / "azure_conv_2023.csv")))
    rates = (40,) if args.quick else RATES
    slos = ("splitwise",) if args.quick else SLOS
    machine_sets = [(h,) for h in HARDWARE] + [HARDWARE]
    rows = [run_case(trace, label, rate, hw, slo) for label, trace in traces for rate in rates
            for hw in machine_sets for slo in slos]
    if args.layouts or args.only_layouts:
        conv = load_workload("azure-conv")
        extra = [run_case(conv, f"conv, {case}: {model}", rate, hw, "chat", model, engine, tp, split)
                 for case, model, engine, hw, tp, split in LAYOUT_CASES if args.match in case
                 for rate in ((60,) if args.quick else LAYOUT_RATES)]
        rows = extra if args.only_layouts else rows + extra
    print("| trace | req/s | hardware | SLO | plan | added | worst line (planner / simulator) | worst diff | sim meets | s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    accepted = agree = total = 0
    for r in rows:
        label, rate, hw, slo = r["case"]
        if "error" in r:
            print(f"| {label} | {rate} | {hw} | {slo} | infeasible: {r['error'][:60]} | | | | | {r['seconds']:.1f} |")
            continue
        total += 1
        worst = max(r["lines"], key=lambda x: x[4] if x[4] is not None else np.inf)
        meets = all(x[3] for x in r["lines"])
        accepted += meets
        within = all(x[4] is not None and x[4] <= TOLERANCE for x in r["lines"])
        agree += within
        print(f"| {label} | {rate} | {hw} | {slo} | {r['plan']} | {r['added']} | {worst[0]}: {worst[1]:.3g} / {worst[2]:.3g} "
              f"| {worst[4] * 100:.0f} % | {'yes' if meets else 'NO'} | {r['seconds']:.1f} |")
    print(f"\nplans the simulator accepts: {accepted}/{total}; every line within {TOLERANCE:.0%}: {agree}/{total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
