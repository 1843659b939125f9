"""The measured error distribution of the fp8 engine profiles, as `optimize --confidence` reads it.

    python bench/deployment_errors.py [--data CSV] [--jobs N] [--profile NAME ...] [--write]

Each shipped fp8 profile (vllm-fp8, sglang-fp8, trtllm-fp8 and the uncalibrated lean-fp8)
predicts NVIDIA aiconfigurator's measured aggregated runs of its engine (../shared/data/perf,
Apache-2.0; the runs `splitplan calibrate --deployments` replays, see bench/fidelity.py; lean-fp8
all of them) as closed loops; printed per profile and concurrency band: the quantiles of the
signed error (predicted / measured - 1, %) of mean TTFT and TPOT, as `fit.error`. The engine
profiles were fitted on these runs (lean-fp8 on none), so theirs are in-sample; bench/fidelity.py
gives the held-out MAPE. `--write` adds them to engine_profiles/*.yaml (fit.error,
fit.error_source). The runs record no E2E: a profile's E2E lines take the larger of its TTFT and
TPOT factors (EngineProfile.latency_factors).

Beside them, the error on the same engine's aggregated MoE runs with fp8 weights (DeepSeek-R1/V3,
Qwen3-235B-A22B: bench/moe_accuracy.py's, in the layouts they recorded), as `fit.moe_error`: every
profile is fitted on dense runs only, so this one is out-of-sample. `optimize` reads it for MoE
models (its warning, and --confidence).
"""

from __future__ import annotations

import argparse
import os
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from moe_accuracy import runs_of as moe_runs

from splitplan.base.parallel import run_units
from splitplan.sim import deployments as dep
from splitplan.specs.engine import error_quantiles, load_engine
from splitplan.specs.hardware import load_hardware

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT.parent / "shared" / "data" / "perf" / "aiconfigurator_silicon_sample.csv"
PROFILES = {"vllm-fp8": "vllm", "sglang-fp8": "sglang", "trtllm-fp8": "trtllm", "lean-fp8": None}
# The factors each profile's command fitted to these runs (bench/fit_vllm.py; calibrate --deployments; none)
FITTED = {"vllm-fp8": ("compute_efficiency", "memory_efficiency"), "sglang-fp8": tuple(dep.DEPLOYMENT_FACTORS),
          "trtllm-fp8": tuple(dep.DEPLOYMENT_FACTORS), "lean-fp8": ()}


def quantiles(frame: pd.DataFrame, predicted: np.ndarray) -> dict:
    """Per concurrency band and over all runs: the signed-error quantiles of mean TTFT and TPOT (%)."""
    err = predicted / frame[["ttft_ms", "tpot_ms"]].to_numpy(float) - 1
    out = {}
    for band, idx in [*frame.groupby("band", sort=False).indices.items(), ("all", np.arange(len(frame)))]:
        e = err[idx]
        keep = np.isfinite(e).all(axis=1)
        out[str(band)] = {"runs": int(keep.sum()), **{m: error_quantiles(e[keep, j] * 100)
                                                         for j, m in enumerate(("ttft_mean", "tpot_mean"))}}
    return out


def _sample_role(name: str, profile, runs: pd.DataFrame) -> str:
    """Whether the profile's error on `runs` is in-sample: whether a factor its command fitted to them
    times them (not where its measured kernel curves time every operator those factors would)."""
    machines = [load_hardware(m) for m in sorted(set(runs.machine))]
    if not FITTED[name]:
        return "out-of-sample: the profile was fitted to none of them"
    if all(dep.timed_by_curves(k, profile, hw) for k in FITTED[name] for hw in machines):
        return (f"out-of-sample: its measured kernel curves time every operator that its factors fitted to them "
                f"({', '.join(FITTED[name])}) would on these runs' GPUs")
    return "in-sample, as the profile was fitted on them (held out by machine: bench/fidelity.py)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--write", action="store_true", help="add fit.error to engine_profiles/*.yaml (replacing an earlier one)")
    parser.add_argument("--profile", action="append", choices=sorted(PROFILES), help="only these profiles (repeatable)")
    args = parser.parse_args()
    runs, _ = dep.read_deployments(args.data)
    runs = runs[runs.precision == "fp8"].reset_index(drop=True)
    moe, _ = moe_runs(args.data, max_concurrency=64)
    moe = moe[(moe["mode"] == "agg") & (moe.weights == "fp8")].reset_index(drop=True)
    moe["band"] = pd.cut(moe.concurrency, dep.BANDS, labels=dep.BAND_LABELS).astype(str)
    for name, engine in PROFILES.items():
        if args.profile and name not in args.profile:
            continue
        run = partial(run_units, jobs=args.jobs)
        mine = runs if engine is None else runs[runs.engine == engine].reset_index(drop=True)
        profile = load_engine(name)
        error = quantiles(mine, dep.predict(mine, profile, run))
        whose = engine or "vLLM, SGLang and TensorRT-LLM"
        source = (f"bench/deployment_errors.py (2026-12): {len(mine)} measured aggregated fp8 runs of "
                  f"{whose} in aiconfigurator's silicon sample replayed by this profile as "
                  "closed loops, their clients out of phase after the first wave, at the profile's own token budget and "
                  "sequence cap (the runs record neither: sim.deployments); " + _sample_role(name, profile, mine))
        theirs = moe if engine is None else moe[moe.engine == engine].reset_index(drop=True)
        moe_error = quantiles(theirs, dep.predict(theirs, load_engine(name), run))
        moe_source = (f"bench/deployment_errors.py (2026-12): {moe_error['all']['runs']} measured aggregated MoE runs of {whose} "
                      "with fp8 weights (DeepSeek-R1/V3, Qwen3-235B-A22B) in aiconfigurator's silicon sample, in the layouts they "
                      "recorded, replayed alike (bench/moe_accuracy.py); out-of-sample: the profile was fitted on dense runs")
        measured = {"error_source": source, "error": error, "moe_error_source": moe_source, "moe_error": moe_error}
        print(f"### {name}\n\n" + yaml.safe_dump(measured, sort_keys=False, width=130), flush=True)
        if args.write:
            path = ROOT / "engine_profiles" / f"{name}.yaml"
            text = path.read_text().rstrip("\n") + "\n"
            if "\n  error_source:" in text:  # (written last by an earlier run: replaced, not repeated)
                text = text[: text.index("\n  error_source:") + 1]
            block = yaml.safe_dump(measured, sort_keys=False, width=130)
            indented = "".join("  " + line + "\n" for line in block.splitlines())
            path.write_text(text + (indented if "\nfit:\n" in text else "fit:\n" + indented))


if __name__ == "__main__":
    main()
