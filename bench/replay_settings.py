"""What the scheduler settings of a replay do to the fp8 profiles' fidelity (issue 55).

    python bench/replay_settings.py [--data CSV] [--jobs N]

aiconfigurator's silicon sample does not record the token budget or sequence cap its runs were
served with, so `calibrate --deployments`, bench/fidelity.py and bench/fit_vllm.py replay every run
at the profile's own settings (the engine's defaults, as a plan runs them: vllm-fp8's 8,192 tokens
and 1,024 requests; before 2026-12-06 at 2,048 tokens and no cap). This replays each shipped fp8
profile's aggregated runs (in-sample: the profiles were fitted on them) under three settings and
prints the mean TTFT and TPOT MAPE and median signed error (predicted / measured - 1, %):
- 2048: 2,048 tokens, no cap (as the profiles were fitted before 2026-12-06);
- profile: the profile's `max_num_batched_tokens` and `max_num_seqs` (as they are fitted now and
  as `optimize` plans);
- generator: what aiconfigurator's generator writes for an aggregated worker of `bs` clients and
  `isl`-token prompts (src/aiconfigurator/generator/rule_plugin/*.rule, read 2026-12): a budget of
  bs + isl + 1,500 tokens, and a cap of max(512, 2 bs) (vLLM, TensorRT-LLM) or bs (SGLang). That
  the sample's runs were served so is an assumption: the rows name a config id, not the config.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from splitplan.base.parallel import run_units
from splitplan.sim import deployments as dep
from splitplan.specs.engine import load_engine

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "perf" / "aiconfigurator_silicon_sample.csv"
PROFILES = {"vllm": "vllm-fp8", "sglang": "sglang-fp8", "trtllm": "trtllm-fp8"}
NO_CAP = 1_000_000  # (more requests than any run holds)


def settings(runs: pd.DataFrame, engine: str, how: str) -> pd.DataFrame:
    """`runs` with the scheduler settings `how` gives them (none: the profile's own)."""
    out = runs.copy()
    if how == "2048":
        out["max_batch_tokens"], out["max_num_seqs"] = 2048, NO_CAP
    elif how == "profile":
        eng = load_engine(PROFILES[engine])
        out["max_batch_tokens"] = eng.batch_tokens()
        if eng.seqs_cap():
            out["max_num_seqs"] = eng.seqs_cap()
    elif how == "generator":
        out["max_batch_tokens"] = out.concurrency + out.isl + 1500
        out["max_num_seqs"] = out.concurrency if engine == "sglang" else np.maximum(512, 2 * out.concurrency)
    return out


def _replay(profile, run):
    return dep.replay(run, profile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    runs, _ = dep.read_deployments(args.data)
    runs = runs[runs.precision == "fp8"]
    print("| profile | runs | settings | TTFT MAPE % | TTFT median % | TPOT MAPE % | TPOT median % |\n|---|---|---|---|---|---|---|")
    for engine, profile in PROFILES.items():
        group = runs[runs.engine == engine].reset_index(drop=True)
        for how in ("2048", "profile", "generator"):
            replayed = settings(group, engine, how)
            predicted = np.array(run_units(_replay, replayed.to_dict("records"), load_engine(profile), jobs=args.jobs), float)
            err = (predicted / group[["ttft_ms", "tpot_ms"]].to_numpy(float) - 1) * 100
            err = err[np.isfinite(err[:, 0])]
            print(f"| {profile} | {len(err)} | {how} | {np.mean(np.abs(err[:, 0])):.0f} | {np.median(err[:, 0]):+.0f} | "
                  f"{np.mean(np.abs(err[:, 1])):.0f} | {np.median(err[:, 1]):+.0f} |", flush=True)


if __name__ == "__main__":
    main()
