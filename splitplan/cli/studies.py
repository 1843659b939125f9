"""`splitplan compare` and `splitplan sweep`: design studies."""

from __future__ import annotations

import os
import sys
from enum import StrEnum
from pathlib import Path

import typer

from splitplan.base.defaults import DEFAULT_ENGINE, DEFAULT_MODEL, STUDY_SLO
from splitplan.base.errors import SpecError
from splitplan.cli.common import (
    EXECUTOR_HELP,
    KV_CACHE,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    OUTPUT_COLUMN,
    PROMPT_COLUMN,
    RAY_HELP,
    TIME_COLUMN,
    TIME_UNIT,
    WEIGHTS,
    Executor,
    KvCache,
    Objective,
    PlanFormat,
    Weights,
    _emit_json,
    _limits,
    _plain_ticks,
    _precisions,
    _progress,
    _require_matplotlib,
    api,
    app,
    figure_png,
    parse_rates,
    plan_input,
    trace_columns,
    user_errors,
    with_precision,
)
from splitplan.io import report
from splitplan.workflows.plan_replay import plan_workload, replay_settings, scheduler_settings
from splitplan.workload.trace import EMBEDDED_HELP, load_workload


class Scenario(StrEnum):
    iso_power = "iso-power"
    iso_cost = "iso-cost"
    iso_throughput_cost = "iso-throughput-cost"
    iso_throughput_power = "iso-throughput-power"


@app.command()
@user_errors
def compare(
    designs: str = typer.Option("splitwise-designs", "--designs", help="Designs YAML: a name from designs/ or a path."),
    scenario: Scenario = typer.Option(..., "--scenario", help="iso-power, iso-cost, iso-throughput-cost or iso-throughput-power."),
    budget_machines: list[str] = typer.Option([], "--budget-machines",
        help="Budget as the power (iso-power) or cost (iso-cost) of TYPE=N machines."),
    max_power_kw: float | None = typer.Option(None, "--max-power-kw", help="iso-power budget in provisioned kW."),
    max_cost_per_hour: float | None = typer.Option(None, "--max-cost-per-hour", help="iso-cost budget in USD per hour."),
    baseline: str | None = typer.Option(None, "--baseline", help="Design the ratios are taken against (default: the first)."),
    trace: Path | None = typer.Option(None, "--trace", help=f"Request trace file, or {EMBEDDED_HELP}."),
    time_column: str | None = TIME_COLUMN,
    prompt_column: str | None = PROMPT_COLUMN,
    output_column: str | None = OUTPUT_COLUMN,
    time_unit: str | None = TIME_UNIT,
    rate: float | None = typer.Option(None, "--rate",
        help="iso-throughput: resample at this rate; iso-power/cost: where the rate search starts."),
    duration: float = typer.Option(120.0, "--duration", help="Length in seconds of every Poisson resample."),
    seed: int = typer.Option(0, "--seed", help="Random seed of the resamples."),
    model: str = typer.Option(DEFAULT_MODEL, "--model", help="Catalog name or path to a config.json / YAML."),
    slo: str = typer.Option(STUDY_SLO, "--slo", help="SLO profile name or path (default: splitwise, the paper's slowdown profile)."),
    engine: str = typer.Option(DEFAULT_ENGINE, "--engine", help="Engine profile name or path."),
    weights: Weights | None = WEIGHTS,
    kv_cache: KvCache | None = KV_CACHE,
    perf_db: Path | None = typer.Option(None, "--perf-db", help="Measured latencies instead of the analytic model."),
    max_batch_tokens: int | None = MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int | None = MAX_NUM_SEQS,
    validate: bool = typer.Option(False, "--validate", help="Simulate each design's plan and report whether it holds."),
    jobs: int = typer.Option(0, "--jobs", help="Processes (or local Ray CPUs), one design each (0: one per core)."),
    executor: Executor = typer.Option(Executor.local, "--executor", help=EXECUTOR_HELP),
    ray_address: str | None = typer.Option(None, "--ray-address", help=RAY_HELP),
    plot: Path | None = typer.Option(None, "--plot", help="Bar chart of the designs (PNG; needs the plot extra)."),
    format: PlanFormat = typer.Option(PlanFormat.table, "--format", help="table, json or csv"),
) -> None:
    """Splitwise's design study: every design of a designs file in one provisioning scenario."""
    if plot is not None:
        _require_matplotlib()
    base = load_workload(trace, None, duration, seed, trace_columns(time_column, prompt_column, output_column, time_unit))
    engine = with_precision(engine, weights, kv_cache)
    max_batch_tokens, max_num_seqs = scheduler_settings(engine, max_batch_tokens, max_num_seqs)
    from splitplan.specs.design import load_designs
    with _progress(f"{scenario.value}: designs", total=len(load_designs(designs).designs)) as step:
        result = api.compare(designs, scenario.value, base, model, slo, engine, _limits(budget_machines, "--budget-machines") or None,
                             max_power_kw, max_cost_per_hour, rate, duration, seed, baseline, validate,
                             str(perf_db) if perf_db else None, max_batch_tokens, jobs=jobs if jobs > 0 else (os.cpu_count() or 1),
                             progress=step, executor=executor.value, ray_address=ray_address, max_num_seqs=max_num_seqs)
    document = result.to_json()
    if plot is not None:
        report.write_set({plot: _compare_plot(result, f"{model}, SLO {slo}, {base.source}" + (f", {rate:g} req/s" if rate else ""))})
    if format is PlanFormat.json:
        _emit_json(document)
    elif format is PlanFormat.csv:
        sys.stdout.write(result.to_frame().to_csv(index=False, float_format="%.6g"))
    else:
        metric = {"iso-power": "max rate", "iso-cost": "max rate", "iso-throughput-cost": "cost",
                  "iso-throughput-power": "power"}[result.scenario]
        rows = [(r["design"], r["prompt_machines"], r["token_machines"], r["mixed_machines"], r["gpus"], r["cost_usd_per_hour"],
                 r["power_kw"], r["max_rate_rps"], r["ratio_to_baseline"], r["error"] or r["binding"])
                for r in document["designs"]]
        budget = ", ".join(f"{k} {v:,.1f}" for k, v in result.budget.items()) or "none"
        report.console().print(report.table(
            f"{result.scenario} (budget: {budget}; {metric} ratio against {result.baseline})",
            ["design", "prompt", "token", "mixed", "GPUs", "$/h", "kW", "max req/s", "ratio", "binding / why not"], rows))
        for warning in result.warnings:
            report.console().print(f"[bold]warning:[/bold] {warning}.")


def _compare_plot(result, subtitle: str) -> bytes:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    frame = result.to_frame()
    column, label = {"iso-power": ("max_rate_rps", "max rate (req/s)"), "iso-cost": ("max_rate_rps", "max rate (req/s)"),
                     "iso-throughput-cost": ("cost_usd_per_hour", "cost (USD/h)"),
                     "iso-throughput-power": ("power_kw", "provisioned power (kW)")}[result.scenario]
    fig, ax = plt.subplots(figsize=(8, 4))
    bars = ax.bar(frame.design, frame[column].fillna(0), color=["#999999" if m else "#3b75af" for m in frame.mixed_machines.fillna(0)])
    for bar, ratio in zip(bars, frame.ratio_to_baseline, strict=True):
        if ratio == ratio and ratio is not None:
            ax.annotate(f"{ratio:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set(ylabel=label, title=f"{result.scenario} (grey: co-located; ratios against {result.baseline})\n{subtitle}")
    ax.title.set_fontsize(9)
    _plain_ticks(ax, "y")  # x: the design names
    ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    return figure_png(fig)


@app.command()
@user_errors
def sweep(
    rates: str = typer.Option(..., "--rates", help="Request rates: 5,10,20 or START:STOP:COUNT."),
    designs: str | None = typer.Option(None, "--designs", help="Designs YAML (name or path): cheapest plan per design and rate."),
    design: list[str] = typer.Option([], "--design", help="Only these designs of the file (repeatable)."),
    plan: Path | None = typer.Option(None, "--plan",
        help="A plan.json: simulate this fixed plan at every rate (with the plan's model, SLO and engine unless given)."),
    prompt_pool: list[str] = typer.Option([], "--prompt-pool", help="Fixed plan, HARDWARE:LAYOUT:MACHINES (repeatable)."),
    token_pool: list[str] = typer.Option([], "--token-pool", help="Fixed plan, HARDWARE:LAYOUT:MACHINES (repeatable)."),
    mixed_pool: list[str] = typer.Option([], "--mixed-pool", help="Fixed co-located plan, HARDWARE:LAYOUT:MACHINES."),
    trace: Path | None = typer.Option(None, "--trace", help="Request trace whose sizes are resampled."),
    time_column: str | None = TIME_COLUMN,
    prompt_column: str | None = PROMPT_COLUMN,
    output_column: str | None = OUTPUT_COLUMN,
    time_unit: str | None = TIME_UNIT,
    duration: float | None = typer.Option(None, "--duration", help="Length in seconds of every resample (default: the plan's, "
                                          "else 120)."),
    seed: int | None = typer.Option(None, "--seed", help="Random seed of the resamples (default: the plan's, else 0)."),
    model: str | None = typer.Option(None, "--model", help="Model (default: the plan's, else llama2-70b)."),
    slo: str | None = typer.Option(None, "--slo", help="SLO profile (default: the plan's, else chat)."),
    engine: str | None = typer.Option(None, "--engine", help="Engine profile (default: the plan's, else vllm)."),
    weights: Weights | None = WEIGHTS,
    kv_cache: KvCache | None = KV_CACHE,
    objective: Objective = typer.Option(Objective.cost, "--objective", help="Designs mode: minimize cost or power."),
    perf_db: Path | None = typer.Option(None, "--perf-db", help="Measured latencies instead of the analytic model."),
    max_batch_tokens: int | None = MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int | None = MAX_NUM_SEQS,
    jobs: int = typer.Option(0, "--jobs", help="Processes (or local Ray CPUs), one (design, rate) each (0: one per core)."),
    executor: Executor = typer.Option(Executor.local, "--executor", help=EXECUTOR_HELP),
    ray_address: str | None = typer.Option(None, "--ray-address", help=RAY_HELP),
    output: Path | None = typer.Option(None, "--output", help="Write the CSV here instead of standard output."),
    plot: Path | None = typer.Option(None, "--plot", help="Latency against load with the SLO lines (PNG)."),
) -> None:
    """A load sweep as CSV: throughput against TTFT/TBT/E2E percentiles and cost per million tokens."""
    if plot is not None:
        _require_matplotlib()
    if objective is Objective.throughput:
        raise SpecError("--objective throughput does not apply to a sweep; use cost or power")
    pools, echo = plan_input(plan, prompt_pool, token_pool, mixed_pool)
    model, slo, engine, max_batch_tokens, max_num_seqs, *_ = replay_settings(echo, model, slo, engine,
                                                                            *_precisions(weights, kv_cache), max_batch_tokens,
                                                                            max_num_seqs)
    replay = plan_workload(echo, trace, trace_columns(time_column, prompt_column, output_column, time_unit), None, duration, seed)
    duration, seed = replay.duration_s, replay.seed
    base = load_workload(replay.trace, None, duration, seed, replay.columns)
    if replay.overridden:
        typer.echo(f"note: sweeping{replay.note()}", err=True)
    rate_list = parse_rates(rates)
    if designs is not None:
        from splitplan.specs.design import load_designs
        units = len(rate_list) * (len(design) or len(load_designs(designs).designs))
    else:
        units = len(rate_list)
    with _progress("sweep: (design, rate) units", total=units) as step:
        result = api.sweep(rate_list, base, model, slo, designs, design or None, pools or None, engine,
                           objective.value, duration, seed, str(perf_db) if perf_db else None, max_batch_tokens,
                           jobs=jobs if jobs > 0 else (os.cpu_count() or 1), progress=step,
                           executor=executor.value, ray_address=ray_address, max_num_seqs=max_num_seqs)
    text = result.to_frame().to_csv(index=False, float_format="%.6g")
    files = {output: text} if output is not None else {}
    if plot is not None:
        what = 'cheapest plan per design' if result.mode == 'designs' else 'fixed plan, simulated'
        files[plot] = figure_png(sweep_figure(result, slo, f"{what} against load: {model}, SLO {slo}\n{base.source}, Poisson "
                                              f"resamples of {duration:g} s at {rate_list[0]:g}-{rate_list[-1]:g} req/s{replay.note()}"))
    report.write_set(files)
    if output is None:
        sys.stdout.write(text)


def sweep_figure(result, slo: str, title: str):
    """p99 TTFT and TBT (and cost per million tokens for designs) against the rate, with the
    SLO: a line at an absolute limit; for a slowdown limit (per request, against its latency
    alone: no fixed ms) a note, and the rates whose SLO check failed marked. Log scale where
    a panel spans more than 30x."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from splitplan.specs.slo import load_slo
    lines = load_slo(slo).lines()
    frame = result.to_frame()
    panels = [("ttft", "TTFT p99 (ms)"), ("tbt", "TBT p99 (ms)")]
    if result.mode == "designs":
        panels.append(("cost", "cost per million tokens (USD)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.9))
    for ax, (metric, label) in zip(axes, panels, strict=True):
        column = "cost_per_million_tokens_usd" if metric == "cost" else f"{metric}_p99_ms"
        for name, part in frame.groupby("design", sort=False):
            ax.plot(part.rate_rps, part[column], marker="o", ms=3, label=name)
            missed = part[part.slo_met == False]  # noqa: E712  (a pandas mask: None means no plan)
            if metric != "cost" and len(missed):
                ax.scatter(missed.rate_rps, missed[column], marker="x", color="red", zorder=3,
                           label="SLO missed" if name == frame.design.iloc[0] else None)
        for line in lines:
            if line.metric != metric or line.percentile != 99:
                continue
            if line.max_ms is not None:
                ax.axhline(line.max_ms, ls="--", color="red", lw=1, label=f"SLO {line.label} {line.target}")
            else:
                ax.set_title(f"SLO {line.label} {line.target} (per request, against its latency alone)", fontsize=7)
        values = frame[column].dropna()
        values = values[values > 0]
        if len(values) and values.max() / values.min() > 30:
            ax.set_yscale("log")
        ax.set(xlabel="request rate (req/s)", ylabel=label)
        _plain_ticks(ax)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig
