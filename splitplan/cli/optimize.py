"""`splitplan optimize`: parse, one library call, render."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import typer

from splitplan.base.defaults import (
    DEFAULT_ENGINE,
    DEFAULT_MODEL,
    DEFAULT_SLO,
)
from splitplan.base.errors import SpecError
from splitplan.cli.common import (
    EXECUTOR_HELP,
    ISL,
    KV_CACHE,
    KV_OFFLOAD_GB,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    NUM_REQUESTS,
    OSL,
    OUTPUT_COLUMN,
    PREFIX_CACHING,
    PROMPT_COLUMN,
    RAY_HELP,
    TIME_COLUMN,
    TIME_UNIT,
    WEIGHTS,
    Executor,
    KvCache,
    Objective,
    PlanFormat,
    Search,
    Weights,
    _emit_json,
    _limits,
    _names,
    _plain_ticks,
    _progress,
    _require_matplotlib,
    api,
    app,
    figure_png,
    parse_duration,
    trace_columns,
    user_errors,
    with_precision,
)
from splitplan.io import plan_document, report
from splitplan.search.documents import power_sources_of, timing_sources_of
from splitplan.specs.engine import load_engine
from splitplan.specs.slo import METRICS
from splitplan.workflows.plan_replay import cache_switch, scheduler_settings, trace_record
from splitplan.workload.trace import (
    EMBEDDED_HELP,
    load_workload,
)

if TYPE_CHECKING:
    from splitplan.search.optimize import Mode, OptimizeOptions


@app.command()
@user_errors
def optimize(
    trace: Path | None = typer.Option(None, "--trace", help=f"Request trace file, or {EMBEDDED_HELP}."),
    time_column: str | None = TIME_COLUMN,
    prompt_column: str | None = PROMPT_COLUMN,
    output_column: str | None = OUTPUT_COLUMN,
    time_unit: str | None = TIME_UNIT,
    rate: float | None = typer.Option(None, "--rate", help="Poisson resample of the trace's sizes at this rate (req/s)."),
    duration: float = typer.Option(120.0, "--duration", help="Resample length in seconds (with --rate)."),
    seed: int = typer.Option(0, "--seed", help="Random seed for --rate."),
    model: str = typer.Option(DEFAULT_MODEL, "--model", help="Catalog name or path to a config.json / YAML."),
    slo: str = typer.Option(DEFAULT_SLO, "--slo",
        help="SLO profile name or path (chat, code-completion, batch: absolute ms; splitwise: slowdown against A100 TP 8)."),
    hardware: str | None = typer.Option(None, "--hardware", help="Machine types to consider, comma-separated (default: all)."),
    prompt_hardware: str | None = typer.Option(None, "--prompt-hardware", help="Restrict prompt machines to these types."),
    token_hardware: str | None = typer.Option(None, "--token-hardware", help="Restrict token machines to these types."),
    tp: int | None = typer.Option(None, "--tp", help="Only this TP degree (default: every degree that fits)."),
    objective: Objective = typer.Option(Objective.cost, "--objective", help="Minimize cost (USD/h) or power (provisioned kW)."),
    engine: str = typer.Option(DEFAULT_ENGINE, "--engine", help="Engine profile name or path."),
    weights: Weights | None = WEIGHTS,
    kv_cache: KvCache | None = KV_CACHE,
    search: Search = typer.Option(Search.ilp, "--search", help="ilp (integer program) or grid (exhaustive)."),
    solver: str = typer.Option("highs", "--solver", help="The integer program's solver: highs (HiGHS, default) or cbc."),
    max_cost_per_hour: float | None = typer.Option(None, "--max-cost-per-hour", help="Budget in USD per hour."),
    max_power_kw: float | None = typer.Option(None, "--max-power-kw", help="Budget in provisioned kW."),
    max_machines: list[str] = typer.Option([], "--max-machines", help="Availability, TYPE=N (repeatable)."),
    max_batch_tokens: int | None = MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int | None = MAX_NUM_SEQS,
    prefix_caching: str | None = PREFIX_CACHING,
    routing: str = typer.Option("jsq", "--routing",
        help="How prompts are routed: jsq (join-shortest-queue on pending prompt tokens) or prefix-aware (with prefix caching: the "
             "instance with the fewest prompt tokens to compute, as KV-aware routers route)."),
    kv_offload_gb: float | None = KV_OFFLOAD_GB,
    no_split: bool = typer.Option(False, "--no-split", help="Plan co-located machines (mixed batching), not split pools."),
    split_only: bool = typer.Option(False, "--split-only",
        help="Recommend the best split plan even where a co-located one is better under the objective (it is still compared)."),
    jobs: int = typer.Option(0, "--jobs", help="Processes for sizing pool options (0: one per core)."),
    validate: bool = typer.Option(False, "--validate", help="Simulate the plan; grow the binding pool until the simulation meets the SLO."),
    pareto: bool = typer.Option(False, "--pareto", help="Also find the cost-vs-power Pareto frontier across hardware mixes."),
    max_requests: int = typer.Option(100_000, "--max-requests",
        help="Longer traces are sized on their busiest stretch of this many requests."),
    window: str | None = typer.Option(None, "--window", help="Plan each window of the trace (e.g. 10m, 1h) and the peak one."),
    executor: Executor = typer.Option(Executor.local, "--executor", help=EXECUTOR_HELP + " Used by --window and --validate."),
    ray_address: str | None = typer.Option(None, "--ray-address", help=RAY_HELP),
    plot: Path | None = typer.Option(None, "--plot", help="With --pareto: the frontier (PNG; needs the plot extra)."),
    perf_db: Path | None = typer.Option(None, "--perf-db", help="Plan from measured latencies (options without measurements are skipped)."),
    perf_interp: str = typer.Option("splitplan", "--perf-interp",
        help="How --perf-db is read: splitplan (monotone batch and context curves) or splitwise-sim (its one batch-tokens axis, to "
             "plan as that simulator times)."),
    borrow_threshold: int | None = typer.Option(None, "--mixed-pool-threshold",
        help="With --validate: simulate Splitwise's mixed pool (prefill on a token machine when every prompt queue holds more than "
             "this many tokens; decode on a prompt machine when the token machines' KV is spoken for) and trim the plan while it "
             "still meets the SLO."),
    concurrency: int | None = typer.Option(None, "--concurrency",
        help="Plan for a closed loop, as serving benchmarks load a deployment: this many clients, each sending its next request "
             "when the last one finishes (checked by simulation)."),
    isl: int | None = ISL,
    osl: int | None = OSL,
    num_requests: int | None = NUM_REQUESTS,
    format: PlanFormat = typer.Option(PlanFormat.table, "--format", help="table, json or csv"),
    output_dir: Path | None = typer.Option(None, "--output-dir", help="Write plan.json, candidates.csv, pareto.csv here."),
    headroom: float = typer.Option(0.0, "--headroom",
        help="Plan for the trace's load times (1 + PCT/100): its requests arriving that much faster (per-token figures stay at "
             "the trace's load)."),
    scale_up_lead: str | None = typer.Option(None, "--scale-up-lead",
        help="With --window: instances a window adds start this long before it (e.g. 180, 3m; default: an estimate from the "
             "model's load time, see docs/cli.md)."),
    confidence: float | None = typer.Option(None, "--confidence",
        help="Size the plan so every SLO line holds when latencies are off by the engine profile's measured error at this "
             "quantile (e.g. 0.9); the nominal plan is shown beside it."),
    spare: int = typer.Option(0, "--spare",
        help="Instances each pool keeps beyond what the load needs (N+1 is --spare 1); predicted latencies are with them out."),
) -> None:
    """The cheapest (or lowest-power) prompt/token machine plan meeting every SLO line on the trace."""
    _check_flags(split_only, no_split, perf_interp, perf_db, plot, pareto)
    planning = api.Planning(
        throughput=objective is Objective.throughput, rate_rps=rate, duration_s=duration, seed=seed, max_requests=max_requests,
        validate=validate, mixed_pool_threshold=borrow_threshold, concurrency=concurrency, isl=isl, osl=osl,
        num_requests=num_requests, window_s=None if window is None else parse_duration(window),
        scale_up_lead_s=None if scale_up_lead is None else parse_duration(scale_up_lead, "--scale-up-lead", zero=True),
        executor=executor.value, ray_address=ray_address)
    columns = trace_columns(time_column, prompt_column, output_column, time_unit)
    loaded = load_workload(trace, None, duration, seed, columns)  # read once
    recorded = {**trace_record(trace, columns), "rate_rps": rate, "duration_s": duration if rate else None, "seed": seed}
    engine = with_precision(engine, weights, kv_cache)
    max_batch_tokens, max_num_seqs = scheduler_settings(engine, max_batch_tokens, max_num_seqs)
    options = api.OptimizeOptions(
        hardware=_names(hardware, "--hardware"), prompt_hardware=_names(prompt_hardware, "--prompt-hardware"),
        token_hardware=_names(token_hardware, "--token-hardware"), tp=tp,
        objective="cost" if objective is Objective.throughput else objective.value, engine=engine, search=search.value,
        solver=solver, max_cost_per_hour=max_cost_per_hour, max_power_kw=max_power_kw, max_machines=_limits(max_machines),
        max_batch_tokens=max_batch_tokens, max_num_seqs=max_num_seqs, prefix_caching=cache_switch(prefix_caching), routing=routing,
        kv_offload_gb=kv_offload_gb or 0.0, perf_db=str(perf_db) if perf_db else None, perf_interp=perf_interp,
        mode=_mode(no_split, split_only), pareto=pareto, jobs=_jobs(jobs), headroom_pct=headroom, spare_instances=spare,
        confidence=confidence)
    planned = api.plan_for(loaded, model, slo, options, planning, progress=_progress)
    workload, result = planned.workload, planned.result
    if result is None:
        _emit_windows(planned, model, slo, format, output_dir, options, recorded)
        return
    if concurrency is not None:
        inputs = {"trace": workload.source, "requests": len(workload), "concurrency": concurrency, "isl": isl, "osl": osl,
                  "seed": seed, "model": model, "slo": slo, **options.inputs(), "perf_db": options.perf_db}
    else:
        inputs = {"trace": workload.source, "requests": len(workload), **recorded, "model": model, "slo": slo,
                  "window": planned.stretch, "validate": validate, "mixed_pool_threshold": borrow_threshold, **options.inputs(),
                  "objective": objective.value, "prefix_caching": "on" if _caching(options) else "off"}
    _emit_plan(result, workload, inputs, format, output_dir, plot, pareto)


def _mode(no_split: bool, split_only: bool) -> Mode:
    return api.Mode.COLOCATED if no_split else api.Mode.SPLIT if split_only else api.Mode.BEST


def _jobs(jobs: int) -> int:
    """--jobs N, 0 for one per core."""
    return jobs if jobs > 0 else os.cpu_count() or 1


def _check_flags(split_only: bool, no_split: bool, perf_interp: str, perf_db, plot, pareto: bool) -> None:
    """Flags that contradict each other, or need another one: exit 2 (the workflows' own in api.Planning)."""
    if split_only and no_split:
        raise SpecError("--split-only and --no-split ask for opposite plans: keep one")
    if perf_interp != "splitplan" and perf_db is None:
        raise SpecError(f"--perf-interp {perf_interp} says how --perf-db is read: add --perf-db FILE")
    if plot is not None:
        if not pareto:
            raise SpecError("--plot draws the Pareto frontier: add --pareto")
        _require_matplotlib()


def _caching(options: OptimizeOptions) -> bool:
    """Whether the engine's prefix caches are on: --prefix-caching, else the engine profile's."""
    return load_engine(options.engine).caches_prefixes(options.prefix_caching)


def _emit_plan(result, workload, inputs: dict, format, output_dir, plot, pareto: bool) -> None:
    """An optimize result as JSON, CSV or tables, and its files."""
    document = result.to_json(inputs)
    plans = [result.plan, *result.alternatives]
    files: dict[Path, str | bytes] = {}
    if output_dir is not None:
        files = {output_dir / "plan.json": report.to_json(plan_document.with_specs(document)),
                 output_dir / "candidates.csv": report.candidates_csv(result),
                 output_dir / "pareto.csv": report.plans_csv(list(result.frontier))}
    if plot is not None:
        files[plot] = figure_png(pareto_figure(result, f"Plans meeting {inputs['slo']} for {inputs['model']}: cost against "
                                               f"power\n{report.file_names(workload.source)}, {len(workload):,} requests"))
    report.write_set(files)
    if format is PlanFormat.json:
        _emit_json(document)
    elif format is PlanFormat.csv:
        sys.stdout.write(report.plans_csv(list(result.pareto) if pareto else plans))
    else:
        _render_plan(result, workload)
        if pareto:
            checked = result.simulated is not None  # --validate: each plan simulated at its max rate
            report.console().print(report.table(
                "Pareto frontier: cost against provisioned power (max rate: the most these machines serve)",
                ["plan", "$/h", "kW", "machines", "max req/s", *(["simulated there"] if checked else []), "binding"],
                [(report.plan_text(p), p.cost_usd_per_hour, p.power_kw, p.machines, p.max_rate_rps,
                  *([_met_text(p.max_rate_simulated)] if checked else []), p.binding) for p in result.pareto]))


def _met_text(simulated: dict | None) -> str:
    if simulated is None:
        return "-"
    missed = [line["line"] for line in simulated["slo"] if not line["met"]]
    return "meets the SLO" if not missed else f"misses {', '.join(missed)}"


def pareto_figure(result, title: str):
    """Cost against power: the evaluated plans, the frontier numbered along it, and the
    numbered plans listed below the axes (long labels beside points overlap)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    front = sorted(result.pareto, key=lambda p: p.power_kw)
    fig, ax = plt.subplots(figsize=(7, 4.2 + 0.22 * len(front)))
    others = [result.plan, *result.alternatives]
    ax.scatter([p.power_kw for p in others], [p.cost_usd_per_hour for p in others], color="grey", s=18, label="evaluated plans")
    ax.plot([p.power_kw for p in front], [p.cost_usd_per_hour for p in front], marker="o", color="#3b75af", label="Pareto frontier")
    for k, p in enumerate(front, 1):
        ax.annotate(str(k), (p.power_kw, p.cost_usd_per_hour), fontsize=8, xytext=(4, 4), textcoords="offset points")
    legend = "\n".join(f"{k}: {report.plan_text(p)}, ${p.cost_usd_per_hour:,.2f}/h, {p.power_kw:,.1f} kW"
                       + (f", max {report.significant(p.max_rate_rps)} req/s" if p.max_rate_rps else "") for k, p in enumerate(front, 1))
    fig.text(0.01, 0.01, legend, fontsize=7, va="bottom", ha="left", family="monospace")
    ax.set(xlabel="provisioned power (kW)", ylabel="cost (USD/h)")
    ax.set_title("\n".join(textwrap.fill(part, 72) for part in title.split("\n")), fontsize=9)
    _plain_ticks(ax)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout(rect=(0, 0.06 + 0.035 * len(front), 1, 1))
    return fig


def _emit_windows(planned, model: str, slo: str, format, output_dir, options: OptimizeOptions, recorded: dict) -> None:
    """A plan per window and its schedule as JSON, CSV or tables, and their files."""
    result, schedule, workload = planned.windows, planned.schedule, planned.workload
    window_s = result.window_s
    document = {**result.to_json(), "schedule": schedule.to_json()}
    if output_dir is not None:
        files = {"windows.csv": result.to_frame().to_csv(index=False, float_format="%.6g"), "windows.json": report.to_json(document),
                 "schedule.csv": schedule.to_frame().to_csv(index=False, float_format="%.6g")}
        if result.peak is not None:
            files["plan.json"] = report.to_json(plan_document.with_specs({
                "schema_version": report.SCHEMA_VERSION, "plan": report.plan_json(result.plans[result.peak]),
                "inputs": {"model": model, "slo": slo, "engine": options.engine,
                           "max_batch_tokens": options.max_batch_tokens, "max_num_seqs": options.max_num_seqs,
                           **recorded, "headroom_pct": options.headroom_pct, "window_s": window_s,
                           "window": result.rows[result.peak]}}))
        report.write_set({output_dir / name: text for name, text in files.items()})
    if format is PlanFormat.json:
        _emit_json(document)
        return
    if format is PlanFormat.csv:
        sys.stdout.write(result.to_frame().to_csv(index=False, float_format="%.6g"))
        return
    rows = [(r["window"], r["start_s"], r["requests"], r["rate_rps"],
             report.plan_text(result.plans[k]) if result.plans[k] is not None else "-",
             r.get("cost_usd_per_hour"), r.get("error") or r.get("binding")) for k, r in enumerate(result.rows)]
    con = report.console()
    con.print(report.table(f"A plan per {window_s:g}-second window of {workload.source}",
                           ["window", "start s", "requests", "req/s", "plan", "$/h", "binding / why not"], rows))
    if result.peak is not None:
        peak = result.plans[result.peak]
        mean = document["mean_cost_usd_per_hour"]
        con.print(f"Static plan for the peak window ({result.peak}): {report.plan_text(peak)} at ${peak.cost_usd_per_hour:,.2f}/h; "
                  f"following the load averages ${mean:,.2f}/h ({(1 - mean / peak.cost_usd_per_hour) * 100:.0f} % less).")
        _render_schedule(con, schedule)


def _render_schedule(con, schedule) -> None:
    """The schedule on the peak plan's pools, and what following it costs."""
    f = schedule.followed
    con.print(report.table(f"Schedule on the peak plan's pools (instances; added ones start {schedule.lead_s:g} s ahead)",
                           ["window", "start s", *schedule.pools, "$/h", "scale up from s", "source"],
                           [(r["window"], r["start_s"], *r["instances"], r["cost_usd_per_hour"], r["scale_up_from_s"], r["source"])
                            for r in schedule.rows]))
    con.print(f"Following it: {f['gpu_hours']:,.1f} GPU-hours, ${f['cost_usd']:,.2f}; the static peak plan: "
              f"{f['static_gpu_hours']:,.1f} GPU-hours, ${f['static_cost_usd']:,.2f} ({f['saving_pct']:.0f} % saved).")


def _pct(line, attainment: float | None) -> str:
    """A line's attainment beside the share its percentile allows to miss (99.06 against 99)."""
    return "" if attainment is None else f"{attainment:.2f} (of {line.percentile:g})"


def _cliff_rows(plan) -> list[tuple]:
    """Per pool: its instances in service, and with one fewer the first line it misses (or the
    tightest line, holding), that line's achieved value and attainment."""
    by_label = {line.label: line for line, _, _ in plan.slo}
    rows = []
    for c in plan.cliff:
        pool = f"{c['role']} {c['hardware']} {c['layout']}" + (" (shared machines)" if c["shared"] else "")
        count = f"{c['instances']} -> {c['fewer']}"
        if not c["slo"]:
            rows.append((pool, count, c["fails"], "", ""))
            continue
        worst = next((x for x in c["slo"] if x["line"] == c["fails"]), None) or min(
            c["slo"], key=lambda x: x["attainment_pct"] - by_label[x["line"]].percentile)
        line = by_label[worst["line"]]
        rows.append((pool, count, c["fails"] or f"none (tightest: {line.label})", line.text(worst["achieved"]),
                     _pct(line, worst["attainment_pct"])))
    return rows


def _render_plan(result, workload) -> None:
    plan = result.plan
    con = report.console()
    con.print(report.table(f"Plan for {workload.source} ({len(workload):,} requests{_rate_read(workload)})", ["", "value"],
                           _summary_rows(result)))
    sources = power_sources_of(result)
    if plan.energy_kwh_per_million_tokens is not None and sources:
        con.print(f"GPU power in the energy figures: {report.power_text(sources)}.")
    con.print(f"Operators timed by: {report.timing_text(timing_sources_of(result))}.")
    attained = plan.attainment_pct or (None,) * len(plan.slo)
    con.print(report.table("Predicted against the SLO", ["line", "target", "achieved", "attainment %", "met"],
                           [(line.label, line.target, line.text(v), _pct(line, a), "yes" if ok else "NO")
                            for (line, v, ok), a in zip(plan.slo, attained, strict=True)]))
    if plan.cliff:
        con.print(report.table("One instance fewer (how close the plan is to failing)",
                               ["pool", "instances", "first line missed", "achieved", "attainment %"], _cliff_rows(plan)))
    if result.simulated is not None:
        _render_simulated(con, plan, result.simulated)
    if result.closed_loop is not None:
        _render_closed_loop(con, result.closed_loop)
    value = api.objective_value
    alt_rows = [(report.plan_text(a), a.gpus, a.cost_usd_per_hour, a.cost_usd_per_million_tokens, a.power_kw,
                 f"{value(result.objective, a) / value(result.objective, plan) - 1:+.0%}", a.binding) for a in result.alternatives]
    if alt_rows:
        con.print(report.table("Runner-up plans", ["plan", "GPUs", "$/h", "$/M tokens", "kW", f"{result.objective} vs plan",
                                                   "binding"], alt_rows))
    _render_warnings(con, result)


def _summary_rows(result) -> list[tuple[str, str]]:
    """The plan table: its pools, size, rate, cost, power, what binds it and the other kind of plan."""
    plan = result.plan
    if plan.mixed_pools:
        rows = [("co-located machines", report.pools_detail(plan.mixed_pools))]
    else:
        rows = [("prompt machines", report.pools_detail(plan.prompt_pools)), ("token machines", report.pools_detail(plan.token_pools))]
    rows.append(("in all", f"{plan.machines:,} machine{'s' * (plan.machines != 1)}, {plan.gpus:,} GPUs"))
    if result.max_rate_rps is not None:
        rows.append(("max rate", f"{report.significant(result.max_rate_rps)} req/s within the budget"))
    per_million = report.per_million_text(plan)
    energy = report.energy_text(plan)
    rows += [("cost", f"${plan.cost_usd_per_hour:,.2f}/h" + (f"; {per_million}" if per_million else "")),
             ("power", f"{plan.power_kw:,.2f} kW provisioned" + (f"; GPU energy {energy}" if energy else "")),
             ("binding", plan.binding)]
    if result.problem is not None and (result.problem.load_factor != 1 or result.problem.spare_instances):
        rows.append(("margins", _margins_text(result.problem)))
    if result.confidence is not None:
        rows.append(("confidence", _confidence_text(result)))
    if result.split_saving_pct is not None:
        other, label = (result.colocated, "vs best co-located") if plan is not result.colocated else (result.split, "vs best split")
        saving = result.split_saving_pct
        rows.append((label, f"{report.plan_text(other)} at {_in_objective(result.objective, other)}: splitting "
                            f"{'saves' if saving >= 0 else 'adds'} {abs(saving):.0f} % {result.objective}"))
    elif not plan.mixed_pools and result.max_rate_rps is None:
        rows.append(("vs best co-located", "no co-located plan meets the SLO"))
    return rows


def _render_simulated(con, plan, simulated) -> None:
    """--validate: predicted against simulated percentiles, and the simulation against the SLO."""
    compared = [(f"{m.upper()} {q}", plan.predicted[m][q], getattr(simulated, f"{m}_ms")[q])
                for m in METRICS for q in ("p50", "p90", "p99")]
    changed = simulated.machines_added
    what = f"{changed} machine(s) added" if changed >= 0 else f"{-changed} machine(s) removed (mixed pool)"
    con.print(report.table(f"Predicted vs simulated, ms ({what} by validation)",
                           ["percentile", "predicted", "simulated"], compared))
    con.print(report.table("Simulated against the SLO", ["line", "target", "achieved", "attainment %", "met"],
                           report.slo_rows(simulated.slo)))


def _render_closed_loop(con, loop) -> None:
    """--concurrency: the rounds of the closed-loop search and the plan's simulated benchmark."""
    con.print(report.table(f"Closed loop of {loop.concurrency} clients: each round plans the rate the last plan's "
                           "simulation ran at (Little's law)", ["planned req/s", "plan", "$/h", "simulated req/s", "SLO met"],
                           [(r.planned_rate_rps, r.plan, r.cost_usd_per_hour, r.simulated_rate_rps,
                             "yes" if r.slo_met else "NO") for r in loop.rounds]))
    bench = loop.benchmark
    con.print(report.table("The plan's simulated closed loop, as a serving benchmark reports it", ["ms", "mean", "median", "p99"],
                           [(name, bench[key]["mean"], bench[key]["median"], bench[key]["p99"])
                            for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"))],
                           caption=f"{report.significant(bench['requests_per_s'])} req/s, "
                                   f"{bench['output_tokens_per_s_per_gpu']:,.0f} output tokens/s per GPU ({bench['gpus']} GPUs)"))


def _render_warnings(con, result) -> None:
    """Requests left out, the result's warnings, and how many options were skipped or not sized."""
    if result.unservable:
        u = result.unservable
        con.print(f"[bold]warning:[/bold] {u.requests:,} request(s) ({u.share_pct:.2f} %, prompts of "
                  f"{u.min_prompt_tokens:,}-{u.max_prompt_tokens:,} tokens) cannot be served: {u.reason}.")
    for warning in result.warnings:
        con.print(f"[bold]warning:[/bold] {warning}.")
    from splitplan.search.optimize import NOT_SIZED  # (loaded with the search it ran)
    skipped = {f"{o.role} {o.inst.hardware.name} {o.inst.layout}": o.skipped for o in result.options if o.skipped}
    pruned = sum(reason.startswith(NOT_SIZED) for reason in skipped.values())
    if skipped:
        con.print(f"{len(skipped) - pruned} option(s) skipped" + (f" and {pruned} co-located option(s) not sized (they cannot "
                  "cost less than the co-located plan found)" if pruned else "") + "; see candidates.csv (--output-dir) for the reasons.")


def _rate_read(workload) -> str:
    """The rate the trace was read at, for titles (a wrong time unit shows here first); none for
    requests that all arrive at once (a closed loop's sizes)."""
    rate = workload.mean_rate_rps
    return f", {report.significant(rate)} req/s" if np.isfinite(rate) else ""


def _in_objective(objective: str, plan) -> str:
    """A plan's value in the objective's unit."""
    return f"${plan.cost_usd_per_hour:,.2f}/h" if objective == "cost" else f"{plan.power_kw:,.2f} kW"


def _margins_text(problem) -> str:
    """--headroom and --spare as the plan table states them."""
    parts = []
    if problem.load_factor != 1:
        parts.append(f"sized for {problem.load_factor:g}x the trace's load ({(problem.load_factor - 1) * 100:g} % headroom; "
                     "per-token figures at the trace's load)")
    if problem.spare_instances:
        parts.append(f"{problem.spare_instances} spare instance(s) per pool beyond the load's need (the predicted "
                     "latencies are with them out of service)")
    return "; ".join(parts)


def _confidence_text(result) -> str:
    """--confidence as the plan table states it, with the nominal plan."""
    c, nominal = result.confidence, result.nominal
    f = c.factors
    return (f"sized so every line holds at the {c.quantile:.0%} quantile of {c.engine}'s measured error: latencies up to "
            f"{f['ttft']:.2f}x (TTFT), {f['tpot']:.2f}x (TPOT, ITL, TBT), {f['e2e']:.2f}x (E2E) the predicted; nominal plan: "
            f"{report.plan_text(nominal)} at {_in_objective(result.objective, nominal)}")
