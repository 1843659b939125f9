"""`splitplan simulate`: parse, one library call, render."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from splitplan.base.errors import SpecError
from splitplan.cli.common import (
    ISL,
    KV_CACHE,
    KV_OFFLOAD_GB,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    NUM_REQUESTS,
    OSL,
    OUTPUT_COLUMN,
    PREFIX_CACHING,
    PREFIX_GROUPS,
    PROMPT_COLUMN,
    SHARED_PREFIX_TOKENS,
    TIME_COLUMN,
    TIME_UNIT,
    WEIGHTS,
    Format,
    KvCache,
    Weights,
    _emit_json,
    _precisions,
    api,
    app,
    plan_input,
    shared_prefix,
    trace_columns,
    user_errors,
)
from splitplan.io import report
from splitplan.specs.layout import Layout
from splitplan.specs.roles import Pool
from splitplan.workflows.plan_replay import cache_switch, plan_workload, replay_settings
from splitplan.workload.trace import EMBEDDED_HELP, check_closed_loop, check_request_sizes, closed_loop_workload, load_workload

if TYPE_CHECKING:
    from splitplan.sim.metrics import SimulationSummary


@app.command()
@user_errors
def simulate(
    plan: Path | None = typer.Option(None, "--plan", help="A plan.json from optimize --output-dir."),
    prompt_pool: list[str] = typer.Option([], "--prompt-pool", help="HARDWARE:LAYOUT:MACHINES (repeatable)."),
    token_pool: list[str] = typer.Option([], "--token-pool", help="HARDWARE:LAYOUT:MACHINES (repeatable)."),
    mixed_pool: list[str] = typer.Option([], "--mixed-pool", help="Co-located HARDWARE:LAYOUT:MACHINES (repeatable)."),
    trace: Path | None = typer.Option(None, "--trace", help=f"Request trace file, or {EMBEDDED_HELP}."),
    time_column: str | None = TIME_COLUMN,
    prompt_column: str | None = PROMPT_COLUMN,
    output_column: str | None = OUTPUT_COLUMN,
    time_unit: str | None = TIME_UNIT,
    rate: float | None = typer.Option(None, "--rate", help="Poisson resample of the trace's sizes at this rate (req/s; with "
                                      "--plan, default the plan's)."),
    duration: float | None = typer.Option(None, "--duration", help="Resample length in seconds (with --rate; default the "
                                          "plan's, else 120)."),
    seed: int | None = typer.Option(None, "--seed", help="Random seed for --rate (default the plan's, else 0)."),
    model: str | None = typer.Option(None, "--model", help="Model (default: the plan's, else llama2-70b)."),
    slo: str | None = typer.Option(None, "--slo", help="SLO profile (default: the plan's, else chat)."),
    engine: str | None = typer.Option(None, "--engine", help="Engine profile (default: the plan's, else vllm)."),
    weights: Weights | None = WEIGHTS,
    kv_cache: KvCache | None = KV_CACHE,
    perf_db: Path | None = typer.Option(None, "--perf-db", help="Measured latencies instead of the analytic model."),
    perf_interp: str = typer.Option("splitplan", "--perf-interp",
        help="How --perf-db is read: splitplan (monotone batch and context curves) or splitwise-sim (its one batch-tokens axis, to "
             "compare with that simulator)."),
    max_batch_tokens: int | None = MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int | None = MAX_NUM_SEQS,
    routing: str | None = typer.Option(None, "--routing",
        help="jsq (join-shortest-queue on pending tokens; the default, or the plan's), round-robin, or prefix-aware (with "
             "--prefix-caching on: the instance with the fewest prompt tokens to compute, pending ones plus the request's less what"
             " its cache holds)."),
    borrow_threshold: int | None = typer.Option(None, "--mixed-pool-threshold",
        help="Splitwise's mixed pool, both ways: prefill on a token machine when every prompt queue holds more than this many "
             "tokens; decode on a prompt machine when the token machine's KV is spoken for."),
    max_requests: int = typer.Option(1_000_000, "--max-requests",
        help="Longer traces are simulated on their busiest stretch of this many requests."),
    concurrency: int | None = typer.Option(None, "--concurrency",
        help="Closed loop, as serving benchmarks run: this many clients, each sending its next request when the last one finishes."),
    isl: int | None = ISL,
    osl: int | None = OSL,
    num_requests: int | None = NUM_REQUESTS,
    prefix_caching: str | None = PREFIX_CACHING,
    kv_offload_gb: float | None = KV_OFFLOAD_GB,
    shared_prefix_tokens: int | None = SHARED_PREFIX_TOKENS,
    prefix_groups: int | None = PREFIX_GROUPS,
    format: Format = typer.Option(Format.table, "--format", help="table or json"),
    output_dir: Path | None = typer.Option(None, "--output-dir", help="Write requests.csv and summary.json here."),
) -> None:
    """Replay a trace through a plan's machines request by request and check the SLO."""
    pools, echo = plan_input(plan, prompt_pool, token_pool, mixed_pool)
    if not pools:
        raise SpecError("nothing to simulate: give --plan plan.json or --prompt-pool and --token-pool (or --mixed-pool)")
    model, slo, engine, max_batch_tokens, max_num_seqs, caching, routing, kv_offload_gb = replay_settings(
        echo, model, slo, engine, *_precisions(weights, kv_cache), max_batch_tokens, max_num_seqs, cache_switch(prefix_caching),
        routing, kv_offload_gb)
    replay = plan_workload(echo, trace, trace_columns(time_column, prompt_column, output_column, time_unit), rate, duration, seed)
    workload, window = _workload(replay, max_requests, model, engine, rate, concurrency, isl, osl, num_requests)
    workload = shared_prefix(workload, shared_prefix_tokens, prefix_groups)
    sim = api.simulate_pools(workload, pools, model, slo, engine, str(perf_db) if perf_db else None, max_batch_tokens,
                             routing, borrow_threshold, perf_interp, concurrency, max_num_seqs,
                             prefix_caching=caching, kv_offload_gb=kv_offload_gb)
    workload = sim.result.trace
    inputs = {"trace": workload.source, "requests": len(workload), "rate_rps": replay.rate,
              "duration_s": replay.duration_s if replay.rate else None, "seed": replay.seed, "overridden": list(replay.overridden),
              "model": model, "slo": slo, "engine": engine, "perf_db": str(perf_db) if perf_db else None,
              "perf_interp": perf_interp if perf_db else None, "pools": [_pool_echo(p) for p in pools],
              "routing": routing, "max_batch_tokens": max_batch_tokens, "max_num_seqs": max_num_seqs,
              "mixed_pool_threshold": borrow_threshold,
              "window": window, "concurrency": concurrency, "isl": isl, "osl": osl,
              "prefix_caching": "on" if sim.pools[0].perf.engine.caches_prefixes(caching) else "off",
              "kv_offload_gb": kv_offload_gb}
    document = {"schema_version": report.SCHEMA_VERSION, "inputs": inputs, "summary": sim.summary.to_json()}
    if output_dir is not None:
        from splitplan.sim.metrics import requests_csv
        files = {"requests.csv": requests_csv(sim.result, sim.result.names), "summary.json": report.to_json(document)}
        report.write_set({output_dir / name: text for name, text in files.items()})
    if format is Format.json:
        _emit_json(document)
        return
    _render_simulation(sim.summary, workload, replay.note())


def _workload(replay, max_requests: int, model: str, engine: str, rate, concurrency, isl, osl, num_requests) -> tuple:
    """(the requests to simulate, the window of the trace they are, None for a closed loop): the
    trace (its busiest `max_requests`), or with `concurrency` a closed loop of its (or isl/osl) sizes."""
    check_closed_loop(concurrency, isl, osl, num_requests)
    if concurrency is None:
        return replay.load(max_requests)
    if rate is not None:
        raise SpecError("--concurrency runs a closed loop (clients send as requests finish); drop --rate")
    check_request_sizes(model, engine, isl, osl)
    loaded = load_workload(replay.trace, None, replay.duration_s, replay.seed, replay.columns)
    return closed_loop_workload(loaded, concurrency, num_requests, isl, osl, replay.seed), None


def _render_simulation(summary: SimulationSummary, workload, note: str = "") -> None:
    con = report.console()
    metrics = [("TTFT", summary.ttft_ms), ("TBT (E2E-TTFT)/output", summary.tbt_ms), ("TBT max gap", summary.tbt_max_ms),
               ("ITL (every gap)", summary.itl_ms), ("TPOT (E2E-TTFT)/(output-1)", summary.tpot_ms), ("E2E", summary.e2e_ms),
               ("prompt queue", summary.prompt_queue_ms), ("KV transfer", summary.transfer_ms),
               ("decode queue", summary.decode_queue_ms)]
    rate = workload.mean_rate_rps
    con.print(report.table(f"Simulated {summary.finished:,} of {summary.requests:,} requests from {workload.source} "
                           + (f"at {report.significant(rate)} req/s " if math.isfinite(rate) else "")
                           + f"over {summary.span_s:,.1f} s{note}", ["ms", "p50", "p90", "p99"],
                           [(name, p["p50"], p["p90"], p["p99"]) for name, p in metrics]))
    bench = summary.benchmark
    con.print(report.table("As a serving benchmark's client measures it (TTFT on split pools: past the KV transfer and "
                           "decode queue; TPOT = (E2E - TTFT) / (output - 1))",
                           ["ms", "mean", "median", "p99"],
                           [(name, bench[key]["mean"], bench[key]["median"], bench[key]["p99"])
                            for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"))],
                           caption=f"{report.significant(bench['requests_per_s'])} req/s, "
                                   f"{bench['output_tokens_per_s']:,.0f} output tokens/s, "
                                   f"{bench['output_tokens_per_s_per_gpu']:,.0f} per GPU ({bench['gpus']} GPUs)"))
    con.print(report.table("SLO", ["line", "target", "achieved", "attainment %", "met"],
                           report.slo_rows(summary.slo)))
    cached = any(x["prefix_hit_rate"] is not None for x in summary.pools)  # (--prefix-caching on)
    con.print(report.table("Pools", ["role", "hardware", "layout", "machines", "utilization", "mean batch", "energy kWh"]
                           + ["prefix hit %"] * cached,
                           [(x["role"], x["hardware"], str(Layout(x["tp"], x["dp"], x["ep"], x["pp"])), x["machines"],
                             f"{x['utilization']:.0%}", x["mean_batch"], x["energy_kwh"])
                            + ((f"{x['prefix_hit_rate']:.1%}" if x["prefix_hit_rate"] is not None else "",) if cached else ())
                            for x in summary.pools],
                           caption=f"tokens out {summary.tokens_out:,} of {summary.tokens_asked:,}; "
                                   f"{summary.rejected_kv} request(s) never fit an instance's KV"
                                   + (f", {summary.refused_context:,} longer than the model's context window were "
                                      "refused (left out of the SLO)" if summary.refused_context else "") + "; "
                                   f"GPU energy {report.significant(summary.energy_kwh)} kWh, "
                                   f"{report.significant(summary.energy_kwh_per_million_tokens)} kWh per million tokens "
                                   f"({report.significant(summary.energy_kwh_per_million_output_tokens)} per million output tokens; "
                                   f"power figures: {report.power_text(summary.power_sources)})"))
    moved = summary.borrowed
    if any(moved.values()):
        con.print(f"mixed pool: {moved['prefills_on_token_machines']:,} prefill(s) ran on token machines, "
                  f"{moved['decodes_on_prompt_machines']:,} decode(s) on prompt machines")
    if summary.extrapolated_pct is not None:
        e = summary.extrapolated_pct
        con.print(f"perf-db: {e['prefill']:.1f} % of prefill and {e['decode']:.1f} % of decode lookups extrapolated "
                  "beyond the measurements")


def _pool_echo(pool: Pool) -> dict:
    """A pool as the JSON's inputs echo it (instances and shared number on shared machines only)."""
    echo = {"role": pool.role, "hardware": pool.hardware, **pool.layout._asdict(), "layout": pool.layout.spec,
            "machines": pool.machines}
    return echo | ({"instances": pool.instances, "shared": pool.shared} if pool.shared is not None else {})
