"""Whole machines against GPUs (issue 30, item 6): the split-or-not verdict, and one question put
to aiconfigurator.

    python bench/shapes_study.py [--rates 1,10,100] [--models llama3.1-8b,llama3.1-70b] [--duration 60]
                                 [--no-aiconfigurator]

1. For each model and rate, the Azure 2023 code trace embedded in splitplan, Poisson-resampled
   at that rate for `--duration` seconds (seed 1), SLO `chat`, engine `vllm` (the defaults),
   planned by `splitplan optimize` on H100s twice: as whole 8-GPU machines (`h100-80gb@8`, what
   splitplan bought before machine shapes) and in every shape the catalog rents them in
   (`h100-80gb`: 1, 2, 4 and 8 GPUs at one rate per GPU). Printed per row: the best split plan
   and the best co-located plan (GPUs, $/h) and the verdict (what splitting saves or adds).
2. The question a user put to NVIDIA aiconfigurator 0.12 and to splitplan: Llama-3.1-70B in fp8
   (engine `vllm-fp8`), every request 4,000 prompt and 500 output tokens, 10 req/s (Poisson,
   120 s), H100, TTFT 2 s and TPOT 50 ms. aiconfigurator answers with typical latencies of a
   steady state, so the SLO is put as medians (TTFT p50, TPOT p50); the run is repeated at p90.
   aiconfigurator's answer (12 GPUs: 6 co-located TP 2 workers) is the user's report (issue 30);
   it is not rerun here.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from splitplan import api  # noqa: E402
from splitplan.base.errors import InfeasibleError  # noqa: E402
from splitplan.io.report import pools_text  # noqa: E402
from splitplan.workload.trace import Trace, default_trace_path, load_trace, resample_poisson  # noqa: E402

SHAPES = {"whole 8-GPU machines (h100-80gb@8)": "h100-80gb@8", "shapes of 1, 2, 4, 8 GPUs (h100-80gb)": "h100-80gb"}


def _side(plan) -> str:
    if plan is None:
        return "none meets the SLO"
    pools = (f"{pools_text(plan.prompt_pools)} / {pools_text(plan.token_pools)}" if plan.prompt_pools
             else pools_text(plan.mixed_pools))
    return f"{pools} ({plan.gpus} GPUs, ${plan.cost_usd_per_hour:,.2f}/h)"


def verdicts(models: list[str], rates: list[float], duration_s: float) -> None:
    base = load_trace(default_trace_path())
    print("| model | req/s | machines | best split plan | best co-located plan | verdict | planned in |")
    print("|---|---|---|---|---|---|---|")
    for model in models:
        for rate in rates:
            trace = resample_poisson(base, rate, duration_s, np.random.default_rng(1))
            for label, hardware in SHAPES.items():
                started = time.perf_counter()
                result = api.optimize(trace, model, "chat", [hardware])
                saving = result.split_saving_pct
                verdict = ("-" if saving is None else f"split {'saves' if saving > 0 else 'adds'} {abs(saving):.0f} %")
                print(f"| {model} | {rate:g} | {label} | {_side(result.split)} | {_side(result.colocated)} | {verdict} "
                      f"| {time.perf_counter() - started:.0f} s |", flush=True)


SLO = "description: aiconfigurator's question (issue 30), as {q}\nttft:\n  {q}: {{max_ms: 2000}}\ntpot:\n  {q}: {{max_ms: 50}}\n"


def aiconfigurator_question() -> None:
    rng = np.random.default_rng(1)
    n = 1200
    arrivals = np.cumsum(rng.exponential(1 / 10.0, n))
    trace = Trace(arrivals - arrivals[0], np.full(n, 4000), np.full(n, 500), "ISL 4,000 / OSL 500, Poisson 10 req/s")
    print("\n| SLO | hardware | recommended plan | GPUs | $/h | best split | best co-located |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for q in ("p50", "p90"):
            slo = Path(folder) / f"aic-{q}.yaml"
            slo.write_text(SLO.format(q=q))
            for label, hardware in SHAPES.items():
                try:
                    result = api.optimize(trace, "llama3.1-70b", str(slo), [hardware], engine="vllm-fp8")
                except InfeasibleError as exc:
                    print(f"| TTFT {q} 2 s, TPOT {q} 50 ms | {label} | infeasible: {exc} | | | | |")
                    continue
                plan = result.plan
                kind = "split" if plan.prompt_pools else "co-located"
                print(f"| TTFT {q} 2 s, TPOT {q} 50 ms | {label} | {kind}: {_side(plan)} | {plan.gpus} | "
                      f"{plan.cost_usd_per_hour:,.2f} | {_side(result.split)} | {_side(result.colocated)} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="1,10,100")
    parser.add_argument("--models", default="llama3.1-8b,llama3.1-70b")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--no-aiconfigurator", action="store_true")
    args = parser.parse_args()
    verdicts(args.models.split(","), [float(r) for r in args.rates.split(",")], args.duration)
    if not args.no_aiconfigurator:
        aiconfigurator_question()


if __name__ == "__main__":
    main()
