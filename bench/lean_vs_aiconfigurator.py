"""The uncalibrated `lean-fp8` profile against measured modern deployments.

    python bench/lean_vs_aiconfigurator.py [--data PATH]

NVIDIA aiconfigurator's silicon sample (shared/data/perf, Apache-2.0) holds measured
serving runs of Llama-3.1-70B in fp8 (TensorRT-LLM and vLLM, 2026) on H100, H200 and
B200: fixed input/output lengths, a concurrency, and the measured mean TPOT. The
bench compares that TPOT with the datasheet-only decode step of `lean-fp8` at batch =
concurrency and the mean context (input + output / 2). Caveats: the runs are
aggregated (prefill interleaves with decode, which raises measured TPOT), and TPOT
is a mean over a run, not one step. Nothing here was fitted to these data.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from splitplan import api
from splitplan.sim.deployments import MACHINES  # aiconfigurator system names -> catalog machines

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "perf" / "aiconfigurator_silicon_sample.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT)
    args = parser.parse_args()
    runs = pd.read_csv(args.data)
    runs = runs[(runs["mode"] == "agg") & (runs.precision == "fp8") & (runs.model_path == "meta-llama/Llama-3.1-70B")
                & runs.system.isin(list(MACHINES)) & (runs.pp_size == 1)]
    predicted = []
    for r in runs.itertuples():
        inst = api.instance("llama3.1-70b", MACHINES[r.system], int(r.tp_size), "lean-fp8")
        predicted.append(float(inst.decode_step_time_s(r.batch_size, r.isl + r.osl / 2)) * 1e3)
    runs = runs.assign(predicted_ms=predicted, error_pct=(np.array(predicted) / runs.silicon_tpot_ms - 1) * 100)
    runs["batch"] = pd.cut(runs.batch_size, [0, 4, 32, 10_000], labels=["1-4", "5-32", ">32"])
    print("| machine | engine | concurrency | runs | MAPE % | median error % |")
    print("|---|---|---|---|---|---|")
    for (system, backend, batch), rows in runs.groupby(["system", "backend", "batch"], observed=True):
        print(f"| {MACHINES[system]} | {backend} | {batch} | {len(rows)} | {rows.error_pct.abs().mean():.1f} "
              f"| {rows.error_pct.median():+.1f} |")
    print(f"| all | | | {len(runs)} | {runs.error_pct.abs().mean():.1f} | {runs.error_pct.median():+.1f} |")


if __name__ == "__main__":
    main()
