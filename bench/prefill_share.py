"""Which measured deployments cannot have computed their prompts whole, and what a prefix cache would make of them.

    python bench/prefill_share.py [--data PATH] [--profile vllm-fp8]

Per engine and machine of aiconfigurator's silicon sample (../shared/data/perf, Apache-2.0; the
runs `bench/fidelity.py` replays), the share of each run's wall time its prompts' prefill alone
takes (`sim.deployments.prefill_share`: every prompt computed in full, its GEMMs in 16,384-token
passes and its attention, at the GPU's measured kernel curves for the run's engine).
`read_deployments` leaves out the runs above 1 (their replay computes every prompt: they cannot
have).

Then every run of `--profile`'s engine on a machine and model with a run above 1 is replayed twice
by the profile: as recorded (every prompt computed), and with every prompt but its last block
served from the engine's prefix cache (`Trace.cached_tokens`; vLLM keeps one by default, so a
benchmark that repeats its prompts hits it). A few seconds on 2 cores."""

from __future__ import annotations

import argparse

from fidelity import DEFAULT

from splitplan.sim import deployments as dep
from splitplan.specs.engine import load_engine

BLOCK_TOKENS = 16  # vLLM's KV block: a prompt's last, partial block is computed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=DEFAULT)
    parser.add_argument("--profile", default="vllm-fp8")
    args = parser.parse_args()
    runs, _ = dep.catalog_runs(args.data)
    runs = runs.assign(share=dep.prefill_share(runs))
    print("Share of each run's wall time its prompts' prefill alone takes, and runs above 1:\n")
    print("| engine | machine | runs | median | max | above 1 |\n|---|---|---|---|---|---|")
    for (engine, machine), g in runs.groupby(["engine", "machine"]):
        print(f"| {engine} | {machine} | {len(g)} | {g.share.median():.2f} | {g.share.max():.2f} | {(g.share > 1).sum()} |")
    profile = load_engine(args.profile)
    engine = args.profile.split("-")[0]
    mine = runs[runs.engine == engine]
    above = mine[mine.share > 1][["machine", "model"]].drop_duplicates()
    heavy = mine.merge(above, on=["machine", "model"]).sort_values(["osl", "share"])
    print(f"\n{engine}'s runs on a machine and model with a run above 1, replayed by {args.profile} "
          "(mean TTFT ms / mean TPOT ms):\n")
    print("| machine | model | TP | clients | ISL | OSL | share | measured | prompts computed | all but the last block cached |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for run in heavy.to_dict("records"):
        last_block = (run["isl"] - 1) // BLOCK_TOKENS * BLOCK_TOKENS  # (every prompt token but its last block)
        cold, cached = dep.replay(run, profile), dep.replay(run, profile, cached_tokens=last_block)
        print(f"| {run['machine']} | {run['model']} | {run['tp']} | {run['concurrency']} | {run['isl']} | {run['osl']} | "
              f"{run['share']:.2f} | {run['ttft_ms']:.0f} / {run['tpot_ms']:.1f} | {cold[0]:.0f} / {cold[1]:.1f} | "
              f"{cached[0]:.0f} / {cached[1]:.1f} |")


if __name__ == "__main__":
    main()
