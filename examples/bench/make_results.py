"""Write the example benchmark results `splitplan calibrate --bench examples/bench` reads.

    python examples/bench/make_results.py

SIMULATED, NOT MEASURED: five `vllm bench serve --save-result --save-detailed` results (the
format of vllm's benchmarks/serve.py) for Llama-3.1-8B-Instruct at TP 1 on one H100, at 1 to 12
req/s (Poisson arrivals, 200 requests each, prompts of 200-2,000 tokens and outputs of 50-400),
whose figures are splitplan's own simulation of them under a known profile: the shipped `vllm`
profile (its operators timed by vLLM's measured kernel curves on H100) with a slower decode step
(2.2 ms of host work a step where it has 0.6) and a 14 ms front end where it has 7, each figure
then moved by up to 2 % as a measurement would. They exist so that the README's calibrate command runs on a fresh clone, and so that
anyone can see the fit find that profile again: bring your own results to calibrate for real.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from splitplan.sim import bench_fit
from splitplan.sim.bench_replay import BenchSettings, bench_replay, predict
from splitplan.specs.engine import load_engine
from splitplan.workload.benchmarks import METRICS, BenchRun

HERE = Path(__file__).resolve().parent
MODEL, HARDWARE = "meta-llama/Llama-3.1-8B-Instruct", "h100-80gb"
RATES = (1.0, 2.0, 4.0, 8.0, 12.0)
REQUESTS = 200


def truth():
    slow = bench_fit.with_factors(load_engine("vllm"), {"decode_overhead_s": 0.0022}, HARDWARE)
    return slow.model_copy(update={"frontend_latency_s": 0.014})


def result(rate: float, rng: np.random.Generator) -> dict:
    isl, osl = rng.integers(200, 2000, REQUESTS), rng.integers(50, 400, REQUESTS)
    start = np.concatenate([[0.0], np.cumsum(rng.exponential(1 / rate, REQUESTS))[:-1]])
    run = BenchRun("example", "vllm", dict.fromkeys(METRICS, 1.0), REQUESTS, rate, input_tokens=isl.astype(float),
                   output_tokens=osl.astype(float), start_s=start, settings={"model": MODEL, "tp": 1})
    figures = predict(bench_replay(run, BenchSettings(hardware=HARDWARE), truth()), truth())
    m = {k: v * (1 + rng.uniform(-0.02, 0.02)) for k, v in figures.items()}
    return {"date": "20261206-120000", "backend": "vllm", "label": "SIMULATED by examples/bench/make_results.py, not measured",
            "model_id": MODEL, "tokenizer_id": MODEL, "num_prompts": REQUESTS, "request_rate": rate, "burstiness": 1.0,
            "max_concurrency": None, "tp": "1", "duration": round(float(start[-1]) + m["e2e_mean"] / 1e3, 3),
            "completed": REQUESTS, "failed": 0, "total_input_tokens": int(isl.sum()), "total_output_tokens": int(osl.sum()),
            "mean_ttft_ms": m["ttft_mean"], "median_ttft_ms": m["ttft_p50"], "p90_ttft_ms": m["ttft_p90"],
            "p99_ttft_ms": m["ttft_p99"], "mean_tpot_ms": m["tpot_mean"], "mean_e2el_ms": m["e2e_mean"],
            "median_e2el_ms": m["e2e_p50"], "p90_e2el_ms": m["e2e_p90"], "p99_e2el_ms": m["e2e_p99"],
            "input_lens": isl.tolist(), "output_lens": osl.tolist(), "start_times": [round(t, 6) for t in start.tolist()],
            "errors": [""] * REQUESTS}


def main() -> None:
    rng = np.random.default_rng(2026)
    for rate in RATES:
        doc = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in result(rate, rng).items()}
        (HERE / f"vllm-{rate:g}qps-Llama-3.1-8B-Instruct.json").write_text(json.dumps(doc) + "\n")


if __name__ == "__main__":
    main()
