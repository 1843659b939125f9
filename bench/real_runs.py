"""Measured vLLM serving runs replayed as they ran: where the model stands on today's engine.

    python bench/real_runs.py [--data DIR] [--profiles vllm,lean,splitwise-vllm] [--prefix-cache prompts|system|none|simulated]
                               [--prompts-per-system-prompt 5] [--jobs N] [--stages] [--error-quantiles]

`../shared/data/real-runs/` (README there; measured figures, used here and never copied into
the project) holds open-loop runs of vLLM v0.15.1 on one H100 server, one row per load stage.
Each stage is replayed as measured: its own requests (the run's request file, that stage's
rows, from the stage's first arrival), one co-located instance of the run's model and TP on
the run's machine, the run's scheduler (chunked prefill, its `max_num_batched_tokens` and
`max_num_seqs`, `max_model_len`) and memory fraction (`gpu_mem_util`), timed by each profile.
Stages marked `include=0` (reasoning stages where most requests timed out) are left out.

The prefix cache, as these runs had it (`--prefix-cache`, default `prompts`): the runs' requests
come from inference-perf's `shared_prefix` generator, which makes `n_system_prompts` x
`--prompts-per-system-prompt` distinct prompts (the campaign's `num_users_per_system_prompt`: 5)
and sends them over and over, so vLLM's prefix cache (on in every run, 16-token blocks) holds a
prompt's blocks once it has been computed: a request then prefills only the rest (at least its
last token). Requests of a run in order: the first `n_system_prompts` compute their whole prompt,
the rest of the first round skip the system prompt's blocks, and every later request (every one
of a later stage) skips all its full blocks but the last token's. `system`: only the system
prompt is ever skipped (the reading that every question is new); `none`: nothing is;
`simulated`: the same prompts as a prefix tree (`workload.prefix`), the hits decided by the
simulator's own cache (`simulate --prefix-caching on`: least recently used, in the KV memory the
running requests leave, a prompt cached once computed), cold at each stage's start (the runs'
later stages started warm).

Printed per profile: MAPE % and median signed error % of mean TTFT, TPOT ((mean E2E - mean
TTFT) / (output - 1), the runs' own definition), mean E2E and TTFT/E2E p90/p99, per model and
load band (requests in flight, by Little's law: achieved rate, else the stage's, x mean E2E) and over all stages;
and the stages predicted overloaded (TTFT p50 above 5 s) that were not. `--stages` adds a row
per stage. Not modelled yet: the CPU KV offload of some runs, and the load a run's previous
stage leaves.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import pandas as pd

from splitplan.base.parallel import run_units
from splitplan.perf.roofline import Instance
from splitplan.sim.cluster import PoolSpec, SimOptions, simulate
from splitplan.specs.engine import error_quantiles as engine_error_quantiles
from splitplan.specs.engine import load_engine
from splitplan.specs.hardware import load_hardware
from splitplan.specs.model import load_model
from splitplan.specs.roles import Role
from splitplan.workload.prefix import PrefixTree
from splitplan.workload.trace import Trace

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "real-runs"
BANDS = ((0, 16, "1-16"), (16, 48, "16-48"), (48, float("inf"), ">48"))
METRICS = ("ttft_mean", "tpot_mean", "e2e_mean", "ttft_p90", "ttft_p99", "e2e_p90", "e2e_p99")
COLLAPSE_S = 5.0  # a stage whose predicted TTFT p50 exceeds this is overloaded in the model


BLOCK_TOKENS = 16  # vLLM's KV block on GPUs: the prefix cache's unit
PREFIX_CACHE = ("prompts", "system", "none", "simulated")


def stage_trace(data: Path, row: pd.Series, prefix_cache: str = "prompts", prompts_per_system_prompt: int = 5) -> Trace:
    """The stage's requests from its first arrival, each with the prompt tokens the run's prefix
    cache held when it came (module docstring)."""
    requests = pd.read_csv(data / row.trace).sort_values("arrival_s", kind="stable").reset_index(drop=True)
    mine = requests[requests.stage == row.stage_index]
    arrival = mine.arrival_s.to_numpy(float)
    prompt = mine.prompt_tokens.to_numpy(np.int64)
    k = mine.index.to_numpy()  # the request's place in the whole run
    groups = int(row.n_system_prompts)
    system = int(row.system_prompt_tokens) // BLOCK_TOKENS * BLOCK_TOKENS
    whole = (prompt - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    if prefix_cache == "simulated":  # the prompts as a prefix tree; the simulator's cache decides the hits
        prompt_id = (k % groups) + groups * ((k // groups) % prompts_per_system_prompt)
        return Trace(arrival - arrival[0], prompt, mine.output_tokens.to_numpy(np.int64), f"{row.trace} stage {row.stage_index}",
                     prefix=_prompt_tree(prompt_id, prompt, groups, system))
    if prefix_cache == "none":
        cached = np.zeros_like(prompt)
    elif prefix_cache == "system":
        cached = np.where(k >= groups, system, 0)
    else:
        cached = np.where(k >= groups * prompts_per_system_prompt, whole, np.where(k >= groups, system, 0))
    return Trace(arrival - arrival[0], prompt, mine.output_tokens.to_numpy(np.int64), f"{row.trace} stage {row.stage_index}",
                 np.minimum(cached, whole).astype(np.int64))


def _prompt_tree(prompt_id: np.ndarray, prompt: np.ndarray, groups: int, system_tokens: int) -> PrefixTree:
    """inference-perf's shared_prefix prompts as a tree: a node per system prompt (its full
    blocks), below it a node per distinct prompt (the rest of its full blocks, as the stage's
    first request of that prompt has it)."""
    distinct = int(prompt_id.max()) + 1
    first = {int(p): int(t) for p, t in zip(prompt_id[::-1], prompt[::-1], strict=True)}  # (the first occurrence wins)
    rest = [max((first.get(d, system_tokens) - 1) // BLOCK_TOKENS * BLOCK_TOKENS - system_tokens, 1) for d in range(distinct)]
    parent = np.concatenate([np.full(groups, -1), np.arange(distinct) % groups])
    tokens = np.concatenate([np.full(groups, system_tokens), rest])
    return PrefixTree(parent.astype(np.int64), tokens.astype(np.int64), (groups + prompt_id).astype(np.int64),
                      np.full(len(prompt), -1, np.int64))


def replay(profile, data: Path, row: pd.Series, prefix_cache: str = "prompts", prompts_per_system_prompt: int = 5) -> dict:
    """One stage as measured, timed by `profile` (a name, a path or an EngineProfile): the
    predicted figures beside the measured."""
    base = load_engine(profile) if isinstance(profile, str) else profile
    engine = base.model_copy(update={"scheduler": "chunked", "memory_usable_fraction": float(row.gpu_mem_util)})
    inst = Instance(load_model(row.model_arg), load_hardware(row.gpu), engine, int(row.tp))
    trace = stage_trace(data, row, prefix_cache, prompts_per_system_prompt)
    options = SimOptions(max_batch_tokens=int(row.max_num_batched_tokens), max_num_seqs=int(row.max_num_seqs),
                         max_model_len=int(row.max_model_len), prefix_caching=prefix_cache == "simulated")
    result = simulate(trace, [PoolSpec(Role.MIXED, inst, 1, 1)], options)
    ttft, e2e = result.ttft_s * 1e3, result.e2e_s * 1e3
    done = np.isfinite(e2e)
    o = float(np.mean(trace.output_tokens[done]))
    predicted = {
        "ttft_mean": float(np.mean(ttft[done])), "e2e_mean": float(np.mean(e2e[done])),
        "ttft_p90": float(np.percentile(ttft[done], 90)), "ttft_p99": float(np.percentile(ttft[done], 99)),
        "e2e_p90": float(np.percentile(e2e[done], 90)), "e2e_p99": float(np.percentile(e2e[done], 99)),
    }
    predicted["tpot_mean"] = (predicted["e2e_mean"] - predicted["ttft_mean"]) / max(o - 1, 1)
    rate = row.achieved_rate_rps if pd.notna(row.achieved_rate_rps) else row.stage_rate_rps  # (not recorded in some runs)
    in_flight = float(rate) * float(row.e2e_mean_ms) / 1e3
    return {"profile": profile if isinstance(profile, str) else profile.name, "run": row.run_id, "model": row.model_arg,
            "tp": int(row.tp), "workload": row.workload,
            "stage": int(row.stage_index), "rate_rps": float(row.stage_rate_rps), "in_flight": in_flight,
            "band": next(label for lo, hi, label in BANDS if lo <= in_flight < hi),
            "collapsed": bool(np.percentile(ttft[done], 50) > COLLAPSE_S * 1e3) and not bool(row.overloaded),
            **{f"measured_{m}": float(row[f"{m}_ms"]) for m in METRICS},
            **{f"predicted_{m}": v for m, v in predicted.items()}}


def _unit(shared, item):
    data, prefix_cache, per_group = shared
    profile, row = item
    return replay(profile, data, row, prefix_cache, per_group)


def errors(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    rows = []
    for key, g in list(frame.groupby(keys, sort=False)) + [(("all",) * len(keys), frame)]:
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(keys, key, strict=True), stages=len(g))
        for m in METRICS:
            e = (g[f"predicted_{m}"] / g[f"measured_{m}"] - 1) * 100
            row[m] = f"{e.abs().mean():.0f} / {e.median():+.0f}"
        row["false collapses"] = int(g.collapsed.sum())
        rows.append(row)
    return pd.DataFrame(rows)


def error_quantiles(frame: pd.DataFrame) -> dict:
    """A profile's measured error distribution, as engine profiles carry it (`fit.error`): per
    load band and over all stages, the quantiles (specs.engine.ERROR_LEVELS) of the signed error
    (predicted / measured - 1) of mean TTFT, TPOT and E2E, in %."""
    out = {}
    for band, g in [*frame.groupby("band", sort=False), ("all", frame)]:
        out[str(band)] = {"stages": len(g), **{m: engine_error_quantiles((g[f"predicted_{m}"] / g[f"measured_{m}"] - 1) * 100)
                                               for m in ("ttft_mean", "tpot_mean", "e2e_mean")}}
    return out


def markdown(frame: pd.DataFrame) -> str:
    cells = [list(map(str, frame.columns))] + [[f"{v:,.1f}" if isinstance(v, float) else str(v) for v in row]
                                               for row in frame.itertuples(index=False)]
    return "\n".join("| " + " | ".join(r) + " |" for r in [cells[0], ["---"] * len(cells[0]), *cells[1:]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--profiles", default="vllm,lean,splitwise-vllm")
    parser.add_argument("--prefix-cache", choices=PREFIX_CACHE, default="prompts")
    parser.add_argument("--prompts-per-system-prompt", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--stages", action="store_true")
    parser.add_argument("--error-quantiles", action="store_true",
                        help="also print each profile's signed-error quantiles per load band, as fit.error in its YAML")
    args = parser.parse_args()
    runs = pd.read_csv(args.data / "runs.csv")
    runs = runs[runs.include == 1]
    items = [(p, row) for p in args.profiles.split(",") for _, row in runs.iterrows()]
    rows = run_units(_unit, items, (args.data, args.prefix_cache, args.prompts_per_system_prompt), args.jobs,
                     describe=lambda item: f"{item[0]} {item[1].run_id}")
    frame = pd.DataFrame(rows)
    print(f"{len(runs)} stages of {runs.run_id.str.rsplit('-s', n=1).str[0].nunique()} runs; cells: MAPE % / median signed error %\n")
    for profile, mine in frame.groupby("profile", sort=False):
        print(f"### {profile}\n")
        print(markdown(errors(mine, ["model", "band"])))
        print()
        if args.stages:
            measures = [f"{w}_{m}" for m in ("ttft_mean", "tpot_mean") for w in ("measured", "predicted")]
            cols = ["run", "stage", "rate_rps", "in_flight", *measures]
            print(markdown(mine[cols]))
            print()
        if args.error_quantiles:
            import yaml
            print(yaml.safe_dump({"error": error_quantiles(mine)}, sort_keys=False))


if __name__ == "__main__":
    main()
