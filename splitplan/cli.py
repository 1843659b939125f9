"""The `splitplan` command: parse, make one library call, render. Thin by design."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import sys
from enum import Enum
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import typer

from splitplan import api, report
from splitplan.errors import SplitplanError, SpecError
from splitplan.specs.hardware import hardware_catalog
from splitplan.specs.model import model_catalog
from splitplan.workload.trace import Columns, closed_loop_workload, load_workload, peak_window, resample_poisson, summarize

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Provision phase-split (disaggregated) LLM serving clusters.")
hardware_app = typer.Typer(no_args_is_help=True, help="The hardware catalog.")
models_app = typer.Typer(no_args_is_help=True, help="The model catalog.")
trace_app = typer.Typer(no_args_is_help=True, help="Request traces.")
app.add_typer(hardware_app, name="hardware")
app.add_typer(models_app, name="models")
app.add_typer(trace_app, name="trace")


class Format(str, Enum):
    table = "table"
    json = "json"


class PlanFormat(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


class Objective(str, Enum):
    cost = "cost"
    power = "power"
    throughput = "throughput"


class Search(str, Enum):
    ilp = "ilp"
    grid = "grid"


class Executor(str, Enum):
    local = "local"
    ray = "ray"


EXECUTOR_HELP = "Where work units run: local (forked processes, --jobs) or ray (--ray-address, or a local Ray instance)."
RAY_HELP = "Ray cluster: auto (the running one) or ray://HOST:10001; without it a local instance is started and stopped."


_DEBUG = {"on": False}


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors.")) -> None:
    _DEBUG["on"] = debug


def user_errors(command: Callable) -> Callable:
    """Map SplitplanError to one `error: ...` line on stderr and its exit code."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except SplitplanError as exc:
            if _DEBUG["on"]:
                raise
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from None

    return wrapper


def _emit_json(value) -> None:
    sys.stdout.write(report.to_json(value))


# --- catalogs -----------------------------------------------------------------

@hardware_app.command("list")
@user_errors
def hardware_list(format: Format = typer.Option(Format.table, "--format", help="table or json")) -> None:
    """Machine types with their GPUs, price and power."""
    machines = hardware_catalog()
    if format is Format.json:
        _emit_json([m.model_dump() for m in machines])
        return
    rows = [
        (m.name, f"{m.gpus_per_machine}x {m.gpu.name}", m.gpu.bf16_tflop_per_s, m.gpu.fp8_tflop_per_s, m.gpu.memory_gb,
         m.gpu.memory_tb_per_s, m.gpu.intra_node_bidir_gbyte_per_s, m.scale_out_gbit_per_s, m.price_usd_per_hour,
         m.provisioned_power_w / 1e3, m.price_date)
        for m in machines
    ]
    cols = ["name", "GPUs", "bf16 TFLOP/s", "fp8 TFLOP/s", "GB", "TB/s", "link GB/s", "net Gbit/s", "$/h", "kW", "price date"]
    report.console().print(report.table("Hardware catalog (per-GPU figures; price and power per machine; sources: --format json)", cols, rows))


@models_app.command("list")
@user_errors
def models_list(format: Format = typer.Option(Format.table, "--format", help="table or json")) -> None:
    """Models with their shapes, parameter counts and KV bytes per token."""
    models = model_catalog()
    data = [
        {**m.model_dump(exclude_none=True), "total_params": m.total_params, "active_params": m.active_params,
         "kv_bytes_per_token_bf16": m.kv_bytes_per_token(2)}
        for m in models
    ]
    if format is Format.json:
        _emit_json(data)
        return
    rows = [
        (m.name, m.num_hidden_layers, m.hidden_size, m.num_attention_heads, m.kv_heads, m.intermediate_size,
         "SwiGLU" if m.gated else "2-matrix", f"{m.num_local_experts}/top{m.num_experts_per_tok}" if m.is_moe else "-",
         m.total_params / 1e9, m.active_params / 1e9, int(m.kv_bytes_per_token(2)))
        for m in models
    ]
    cols = ["name", "layers", "hidden", "heads", "KV heads", "FFN", "FFN kind", "experts", "params B", "active B", "KV B/token"]
    report.console().print(report.table("Model catalog (Hugging Face config keys; bf16)", cols, rows))


# --- traces ---------------------------------------------------------------------

def _columns(time_column: Optional[str], prompt_column: Optional[str], output_column: Optional[str], time_unit: str) -> Columns | None:
    if not (time_column or prompt_column or output_column):
        return None
    unit = {"s": 1.0, "ms": 1e-3, "us": 1e-6}.get(time_unit)
    if unit is None:
        raise SpecError(f"--time-unit {time_unit}: choose s, ms or us")
    default = Columns()
    return Columns(time_column or default.time, prompt_column or default.prompt, output_column or default.output, unit)


@trace_app.command("summarize")
@user_errors
def trace_summarize(
    path: Path = typer.Argument(..., help="Azure 2023 CSV, splitwise-sim CSV, Mooncake JSONL, or a generic CSV (.gz ok)."),
    rate: Optional[float] = typer.Option(None, "--rate", help="Resample: Poisson arrivals at this many requests/s."),
    duration: float = typer.Option(120.0, "--duration", help="Resample length in seconds (with --rate)."),
    seed: int = typer.Option(0, "--seed", help="Random seed for --rate."),
    time_column: Optional[str] = typer.Option(None, "--time-column", help="Generic CSV: arrival time column."),
    prompt_column: Optional[str] = typer.Option(None, "--prompt-column", help="Generic CSV: prompt tokens column."),
    output_column: Optional[str] = typer.Option(None, "--output-column", help="Generic CSV: output tokens column."),
    time_unit: str = typer.Option("s", "--time-unit", help="Generic CSV: unit of the time column (s, ms, us)."),
    format: Format = typer.Option(Format.table, "--format", help="table or json"),
) -> None:
    """Rows, span, rates, burstiness and token percentiles of a trace."""
    workload = load_workload(path, rate, duration, seed, _columns(time_column, prompt_column, output_column, time_unit))
    s = summarize(workload)
    if format is Format.json:
        _emit_json(s)
        return
    rows = [
        ("requests", s["requests"]), ("span s", s["span_s"]), ("mean rate req/s", s["mean_rate_rps"]),
        ("peak minute req/s", s["peak_minute_rate_rps"]), ("inter-arrival CV", s["interarrival_cv"]),
    ]
    for key in ("prompt_tokens", "output_tokens"):
        p = s[key]
        rows.append((f"{key.replace('_', ' ')} p50 / p90 / p99 / max", f"{p['p50']:,.0f} / {p['p90']:,.0f} / {p['p99']:,.0f} / {p['max']:,}"))
    report.console().print(report.table(f"Trace {s['source']}", ["metric", "value"], rows))


# --- perf -----------------------------------------------------------------------

_POINT = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*)?(\d+)\s*$")


def parse_points(text: str, option: str) -> list[tuple[int, int]]:
    """`512,4x512` -> [(1, 512), (4, 512)]: batch x tokens; a bare number is batch 1."""
    points = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        match = _POINT.match(item)
        if not match or int(match.group(2)) < 1 or (match.group(1) is not None and int(match.group(1)) < 1):
            raise SpecError(f"{option} '{item}': expected TOKENS or BATCHxTOKENS with whole numbers >= 1, e.g. 512,4x512")
        points.append((int(match.group(1) or 1), int(match.group(2))))
    return points


@app.command()
@user_errors
def perf(
    model: str = typer.Option("llama2-70b", "--model", help="Catalog name or path to a Hugging Face config.json / YAML."),
    hardware: str = typer.Option("h100-80gb", "--hardware", help="Catalog name or path to a hardware YAML."),
    tp: Optional[int] = typer.Option(None, "--tp", help="Tensor-parallel degree (default: the smallest that fits)."),
    prefill: str = typer.Option("512,2048", "--prefill", help="Prefill batches: T (one prompt) or BxT (B prompts of T tokens)."),
    decode: str = typer.Option("1x512,64x2048", "--decode", help="Decode steps: BxC (B requests, C context tokens each)."),
    engine: str = typer.Option(api.DEFAULT_ENGINE, "--engine", help="Engine profile name or path (lean, splitwise-vllm)."),
    perf_db: Optional[Path] = typer.Option(None, "--perf-db", help="Measured latencies (splitwise perf_model.csv or generic CSV) instead of the analytic model."),
    format: Format = typer.Option(Format.table, "--format", help="table or json"),
) -> None:
    """Predicted prefill and decode-step latency of one model instance, and what bounds it."""
    pre, dec = parse_points(prefill, "--prefill"), parse_points(decode, "--decode")
    inst = api.instance(model, hardware, tp, engine)
    if perf_db is not None:
        from splitplan.perf.table import load_perf_db
        inst = load_perf_db(str(perf_db)).require(inst)
    points = api.perf_points(inst, pre, dec)
    if format is Format.json:
        _emit_json(points)
        return
    facts = api.instance_facts(inst)
    rows = [
        (p["phase"], p["batch"], p.get("prompt_tokens", p.get("context_tokens")), p["latency_ms"], p["bound"],
         p["compute_ms"], p["memory_ms"], p["network_ms"], p["overhead_ms"], "yes" if p["kv_fits"] else "NO")
        for p in points
    ]
    caption = (f"{facts['instances_per_machine']} instance(s) per machine; weights {facts['weights_gb_per_gpu']:.1f} GB/GPU; "
               f"KV {facts['kv_bytes_per_token']:,.0f} B/token; KV capacity {facts['kv_capacity_tokens']:,} tokens per instance")
    cols = ["phase", "batch", "tokens", "latency ms", "bound", "compute ms", "memory ms", "network ms", "overhead ms", "KV fits"]
    title = f"{inst.model.name} on {inst.hardware.name}, TP {inst.tp}, engine {inst.engine.name}"
    report.console().print(report.table(title, cols, rows, caption))


# --- optimize ---------------------------------------------------------------------

def _names(text: Optional[str]) -> list[str] | None:
    return [n.strip() for n in text.split(",") if n.strip()] if text else None


def _limits(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        name, _, count = item.partition("=")
        if not name or not count.isdigit():
            raise SpecError(f"--max-machines '{item}': expected TYPE=N, e.g. h100-80gb=40")
        out[name.strip()] = int(count)
    return out


@app.command()
@user_errors
def optimize(
    trace: Optional[Path] = typer.Option(None, "--trace", help="Request trace (default: the embedded Azure 2023 code trace)."),
    rate: Optional[float] = typer.Option(None, "--rate", help="Poisson resample of the trace's sizes at this rate (req/s)."),
    duration: float = typer.Option(120.0, "--duration", help="Resample length in seconds (with --rate)."),
    seed: int = typer.Option(0, "--seed", help="Random seed for --rate."),
    model: str = typer.Option("llama2-70b", "--model", help="Catalog name or path to a config.json / YAML."),
    slo: str = typer.Option("splitwise", "--slo", help="SLO profile name or path (splitwise, chat, code-completion, batch)."),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="Machine types to consider, comma-separated (default: all)."),
    prompt_hardware: Optional[str] = typer.Option(None, "--prompt-hardware", help="Restrict prompt machines to these types."),
    token_hardware: Optional[str] = typer.Option(None, "--token-hardware", help="Restrict token machines to these types."),
    tp: Optional[int] = typer.Option(None, "--tp", help="Only this TP degree (default: every degree that fits)."),
    objective: Objective = typer.Option(Objective.cost, "--objective", help="Minimize cost (USD/h) or power (provisioned kW)."),
    engine: str = typer.Option(api.DEFAULT_ENGINE, "--engine", help="Engine profile name or path."),
    search: Search = typer.Option(Search.ilp, "--search", help="ilp (integer program) or grid (exhaustive)."),
    solver: str = typer.Option("highs", "--solver", help="The integer program's solver: highs (HiGHS, default) or cbc."),
    max_cost_per_hour: Optional[float] = typer.Option(None, "--max-cost-per-hour", help="Budget in USD per hour."),
    max_power_kw: Optional[float] = typer.Option(None, "--max-power-kw", help="Budget in provisioned kW."),
    max_machines: list[str] = typer.Option([], "--max-machines", help="Availability, TYPE=N (repeatable)."),
    max_batch_tokens: int = typer.Option(2048, "--max-batch-tokens", help="Prompt tokens per prefill batch."),
    no_split: bool = typer.Option(False, "--no-split", help="Plan co-located machines (mixed batching), not split pools."),
    jobs: int = typer.Option(0, "--jobs", help="Processes for sizing pool options (0: one per core)."),
    validate: bool = typer.Option(False, "--validate", help="Simulate the plan; grow the binding pool until the simulation meets the SLO."),
    pareto: bool = typer.Option(False, "--pareto", help="Also find the cost-vs-power Pareto frontier across hardware mixes."),
    max_requests: int = typer.Option(100_000, "--max-requests", help="Longer traces are sized on their busiest stretch of this many requests."),
    window: Optional[str] = typer.Option(None, "--window", help="Plan each window of the trace (e.g. 10m, 1h) and the peak one."),
    executor: Executor = typer.Option(Executor.local, "--executor", help=EXECUTOR_HELP + " Used by --window and --validate."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help=RAY_HELP),
    plot: Optional[Path] = typer.Option(None, "--plot", help="With --pareto: the frontier (PNG; needs the plot extra)."),
    perf_db: Optional[Path] = typer.Option(None, "--perf-db", help="Plan from measured latencies (options without measurements are skipped)."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", help="Plan for a closed loop, as serving benchmarks load a deployment: this many clients, each sending its next request when the last one finishes (checked by simulation)."),
    isl: Optional[int] = typer.Option(None, "--isl", help="With --concurrency: every request's input tokens (default: drawn from the trace)."),
    osl: Optional[int] = typer.Option(None, "--osl", help="With --concurrency: every request's output tokens (default: drawn from the trace)."),
    num_requests: Optional[int] = typer.Option(None, "--num-requests", help="With --concurrency: requests in the run (default 10 per client, at least 100)."),
    format: PlanFormat = typer.Option(PlanFormat.table, "--format", help="table, json or csv"),
    output_dir: Optional[Path] = typer.Option(None, "--output-dir", help="Write plan.json, candidates.csv, pareto.csv here."),
) -> None:
    """The cheapest (or lowest-power) prompt/token machine plan meeting every SLO line on the trace."""
    if tp is not None and tp < 1:
        raise SpecError(f"--tp {tp}: must be >= 1")
    if max_batch_tokens < 1:
        raise SpecError(f"--max-batch-tokens {max_batch_tokens}: must be >= 1")
    if max_requests < 1:
        raise SpecError(f"--max-requests {max_requests}: must be >= 1")
    jobs_n = jobs if jobs > 0 else (os.cpu_count() or 1)
    loaded = load_workload(trace, None, duration, seed)  # read once; resampled or windowed below
    common = dict(hardware=_names(hardware), prompt_hardware=_names(prompt_hardware), token_hardware=_names(token_hardware),
                  tp=tp, engine=engine, search=search.value, solver=solver, max_cost_per_hour=max_cost_per_hour, max_power_kw=max_power_kw,
                  max_machines=_limits(max_machines), max_batch_tokens=max_batch_tokens,
                  jobs=jobs_n, perf_db=str(perf_db) if perf_db else None)
    if concurrency is None and (isl is not None or osl is not None or num_requests is not None):
        raise SpecError("--isl, --osl and --num-requests describe a closed-loop run: add --concurrency N")
    if concurrency is not None:
        clash = [flag for flag, on in (("--rate", rate is not None), ("--window", window is not None), ("--pareto", pareto),
                                       ("--validate", validate), ("--objective throughput", objective is Objective.throughput)) if on]
        if clash:
            raise SpecError(f"--concurrency plans a closed loop (its rate follows from its latency, checked by simulation); "
                            f"drop {', '.join(clash)}")
        workload = closed_loop_workload(loaded, concurrency, num_requests, isl, osl, seed)
        with _progress("closed loop: plan at the rate Little's law gives, simulate, replan") as step:
            result = api.optimize_closed_loop(workload, concurrency, model, slo, seed, split=not no_split,
                                              objective=objective.value, progress=lambda r: step(), **common)
        _emit_plan(result, workload, None, {"trace": workload.source, "requests": len(workload), "concurrency": concurrency,
                                            "isl": isl, "osl": osl, "seed": seed, "model": model, "slo": slo,
                                            "objective": objective.value, **{k: v for k, v in common.items() if k != "jobs"}},
                   format, output_dir, None, False)
        return
    if window is not None:
        if validate or pareto or no_split or objective is Objective.throughput:
            raise SpecError("--window plans each window by cost or power; drop --validate/--pareto/--no-split/throughput")
        options = {k: v for k, v in common.items() if k != "jobs"}
        _plan_windows(load_workload(loaded, rate, duration, seed), parse_duration(window), model, slo, format, output_dir,
                      {**options, "objective": objective.value}, jobs_n, executor.value, ray_address)
        return
    workload, stretch = peak_window(load_workload(loaded, rate, duration, seed), max_requests)
    if plot is not None:
        if not pareto:
            raise SpecError("--plot draws the Pareto frontier: add --pareto")
        _require_matplotlib()
    if pareto and (no_split or objective is Objective.throughput):
        raise SpecError("--pareto compares split plans by cost and power: drop --no-split / --objective throughput")
    if objective is Objective.throughput:
        if no_split:
            raise SpecError("--objective throughput plans split pools; drop --no-split")
        base = peak_window(loaded, max_requests)[0]

        def workload_at(r):  # Poisson resample when --rate was given, else the trace's timestamps compressed
            if rate is not None:
                return resample_poisson(base, r, duration, np.random.default_rng(seed))
            return dataclasses.replace(base, arrival_s=base.arrival_s * (base.mean_rate_rps / r),
                                       source=f"{base.source} (timestamps scaled to {r:.3g} req/s)")

        with _progress("searching the highest rate") as step:
            result = api.max_rate(workload_at, rate or workload.mean_rate_rps, model, slo,
                                  progress=lambda r, ok: step(f"{r:.3g} req/s: {'served' if ok else 'not served'}"), **common)
        workload = workload_at(result.max_rate_rps)
    else:
        result = api.optimize(workload, model, slo, objective=objective.value, split=not no_split, pareto=pareto, **common)
    inputs = {
        "trace": workload.source, "requests": len(workload), "rate_rps": rate, "duration_s": duration if rate else None,
        "seed": seed, "model": model, "slo": slo, "hardware": _names(hardware), "prompt_hardware": _names(prompt_hardware),
        "token_hardware": _names(token_hardware), "tp": tp, "objective": objective.value, "engine": engine,
        "search": search.value, "solver": solver, "max_cost_per_hour": max_cost_per_hour, "max_power_kw": max_power_kw,
        "max_machines": _limits(max_machines), "max_batch_tokens": max_batch_tokens, "split": not no_split,
        "window": stretch,
    }
    simulated, runner_ups = None, None
    if validate:
        with _progress("validating the runner-ups by simulation", total=len(result.alternatives)) as step:
            runner_ups = api.simulate_plans(result.alternatives, workload, model, slo, engine, common["perf_db"],
                                            max_batch_tokens, jobs_n, executor.value, ray_address, step)
        with _progress("validating the plan by simulation"):
            plan, sim, added = api.validate(result.plan, workload, model, slo, engine, common["perf_db"], max_batch_tokens,
                                            planned=result)
        result = dataclasses.replace(result, plan=plan)
        simulated = {**{k: sim.summary[k] for k in ("ttft_ms", "tbt_ms", "e2e_ms", "slo")}, "machines_added": added}
    inputs["validate"] = validate
    _emit_plan(result, workload, simulated, inputs, format, output_dir, plot, pareto, runner_ups)


def _emit_plan(result, workload, simulated, inputs: dict, format, output_dir, plot, pareto: bool, runner_ups=None) -> None:
    """An optimize result as JSON, CSV or tables, and its files."""
    document = report.optimize_json(result, inputs)
    if simulated is not None:
        document["plan"]["simulated"] = simulated
        for alternative, outcome in zip(document["plan"]["alternatives"], runner_ups):
            alternative["simulated"] = outcome
    if pareto:
        document["pareto"] = [report.plan_json(p) for p in result.pareto]
    plans = [result.plan, *result.alternatives]
    if output_dir is not None:
        files = {
            "plan.json": report.to_json(document),
            "candidates.csv": report.candidates_csv(result),
            "pareto.csv": report.plans_csv(list(result.pareto) if pareto else report.pareto(plans)),
        }
        for name, text in files.items():
            report.write_atomic(output_dir / name, text)
    if plot is not None:
        _pareto_plot(result, plot)
    if format is PlanFormat.json:
        _emit_json(document)
    elif format is PlanFormat.csv:
        sys.stdout.write(report.plans_csv(list(result.pareto) if pareto else plans))
    else:
        _render_plan(result, workload, simulated)
        if pareto:
            report.console().print(report.table(
                "Pareto frontier: cost against provisioned power (max rate: the most these machines serve)",
                ["plan", "$/h", "kW", "machines", "max req/s", "binding"],
                [(report.plan_text(p), p.cost_usd_per_hour, p.power_kw, p.machines, p.max_rate_rps, p.binding)
                 for p in result.pareto]))


def _pareto_plot(result, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    others = [result.plan, *result.alternatives]
    ax.scatter([p.power_kw for p in others], [p.cost_usd_per_hour for p in others], color="grey", s=18, label="evaluated plans")
    front = sorted(result.pareto, key=lambda p: p.power_kw)
    ax.plot([p.power_kw for p in front], [p.cost_usd_per_hour for p in front], marker="o", color="#3b75af", label="Pareto frontier")
    for p in front:
        rate = f"\nmax {p.max_rate_rps:.3g} req/s" if p.max_rate_rps else ""
        ax.annotate(report.plan_text(p).replace("; ", "\n") + rate, (p.power_kw, p.cost_usd_per_hour), fontsize=6,
                    xytext=(4, 4), textcoords="offset points")
    ax.set(xlabel="provisioned power (kW)", ylabel="cost (USD/h)", title="Plans meeting the SLO: cost against power")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _save_figure(fig, path)


def parse_duration(text: str) -> float:
    """`90`, `90s`, `10m`, `1.5h` -> seconds."""
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$", text)
    if not match or float(match.group(1)) <= 0:
        raise SpecError(f"--window '{text}': give a duration like 600, 600s, 10m or 1h")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def _plan_windows(workload, window_s, model, slo, format, output_dir, options, jobs, executor, ray_address) -> None:
    count = int(np.unique(np.floor(workload.arrival_s / window_s)).size)
    with _progress("planning windows", total=count) as step:
        result = api.plan_windows(workload, window_s, model, slo, jobs, executor, ray_address, step, **options)
    document = result.to_json()
    if output_dir is not None:
        files = {"windows.csv": result.to_frame().to_csv(index=False, float_format="%.6g"), "windows.json": report.to_json(document)}
        if result.peak is not None:
            files["plan.json"] = report.to_json({"schema_version": report.SCHEMA_VERSION, "inputs": {"model": model, "slo": slo,
                                                 "engine": options["engine"], "window": result.rows[result.peak]},
                                                 "plan": report.plan_json(result.plans[result.peak])})
        for name, text in files.items():
            report.write_atomic(output_dir / name, text)
    if format is PlanFormat.json:
        _emit_json(document)
        return
    if format is PlanFormat.csv:
        sys.stdout.write(result.to_frame().to_csv(index=False, float_format="%.6g"))
        return
    rows = [(r["window"], r["start_s"], r["requests"], r["rate_rps"], r.get("prompt_pools"), r.get("token_pools"),
             r.get("cost_usd_per_hour"), r.get("error") or r.get("binding")) for r in result.rows]
    con = report.console()
    con.print(report.table(f"A plan per {window_s:g}-second window of {workload.source}",
                           ["window", "start s", "requests", "req/s", "prompt", "token", "$/h", "binding / why not"], rows))
    if result.peak is not None:
        peak = result.plans[result.peak]
        mean = document["mean_cost_usd_per_hour"]
        con.print(f"Static plan for the peak window ({result.peak}): {report.plan_text(peak)} at ${peak.cost_usd_per_hour:,.2f}/h; "
                  f"following the load averages ${mean:,.2f}/h ({(1 - mean / peak.cost_usd_per_hour) * 100:.0f} % less).")


@contextlib.contextmanager
def _progress(title: str, total: int | None = None):
    """On a terminal, a rich progress bar on stderr counting `total` finished units
    (or a status line when the count is unknown); elsewhere nothing. Yields
    `step(message=None)`, to call as each unit finishes."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    err = Console(stderr=True)
    if not err.is_terminal:
        yield lambda message=None: None
        return
    if total is None:
        with err.status(title) as status:
            yield lambda message=None: status.update(f"{title}: {message}" if message else title)
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(title, total=total)
        yield lambda message=None: bar.advance(task)


def _render_plan(result, workload, simulated=None) -> None:
    plan = result.plan
    con = report.console()
    if plan.mixed_pools:
        rows = [("co-located machines", report.pools_text(plan.mixed_pools))]
    else:
        rows = [("prompt machines", report.pools_text(plan.prompt_pools)), ("token machines", report.pools_text(plan.token_pools))]
    if result.max_rate_rps is not None:
        rows.append(("max rate", f"{result.max_rate_rps:,.3g} req/s within the budget"))
    rows += [("cost", f"${plan.cost_usd_per_hour:,.2f}/h"), ("power", f"{plan.power_kw:,.2f} kW provisioned"),
             ("binding", plan.binding)]
    if result.split_saving_pct is not None:
        rows.append(("vs best co-located", f"{report.plan_text(result.colocated)} at ${result.colocated.cost_usd_per_hour:,.2f}/h: "
                     f"splitting {'saves' if result.split_saving_pct >= 0 else 'costs'} {abs(result.split_saving_pct):.0f} %"))
    elif not plan.mixed_pools and result.max_rate_rps is None:
        rows.append(("vs best co-located", "no co-located plan meets the SLO"))
    con.print(report.table(f"Plan for {workload.source} ({len(workload):,} requests)", ["", "value"], rows))
    con.print(report.table("Predicted against the SLO", ["line", "target", "achieved", "met"],
                           [(line.label, line.target, v, "yes" if ok else "NO") for line, v, ok in plan.slo]))
    if simulated is not None:
        rows = [(f"{m.upper()} {q}", plan.predicted[m][q], simulated[f"{m}_ms"][q])
                for m in ("ttft", "tbt", "e2e") for q in ("p50", "p90", "p99")]
        con.print(report.table(f"Predicted vs simulated, ms ({simulated['machines_added']} machine(s) added by validation)",
                               ["percentile", "predicted", "simulated"], rows))
        con.print(report.table("Simulated against the SLO", ["line", "target", "achieved", "attainment %", "met"],
                               [(x["line"], x["target"], x["achieved"], x["attainment_pct"], "yes" if x["met"] else "NO")
                                for x in simulated["slo"]]))
    if result.closed_loop is not None:
        loop = result.closed_loop
        con.print(report.table(f"Closed loop of {loop['concurrency']} clients: each round plans the rate the last plan's "
                               "simulation ran at (Little's law)", ["planned req/s", "plan", "$/h", "simulated req/s", "SLO met"],
                               [(r["planned_rate_rps"], r["plan"], r["cost_usd_per_hour"], r["simulated_rate_rps"],
                                 "yes" if r["slo_met"] else "NO") for r in loop["rounds"]]))
        bench = loop["benchmark"]
        con.print(report.table("The plan's simulated closed loop, as a serving benchmark reports it", ["ms", "mean", "median", "p99"],
                               [(name, bench[key]["mean"], bench[key]["median"], bench[key]["p99"])
                                for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"))],
                               caption=f"{bench['requests_per_s']:.3g} req/s, {bench['output_tokens_per_s_per_gpu']:,.0f} output "
                                       f"tokens/s per GPU ({bench['gpus']} GPUs)"))
    alt_rows = [(report.plan_text(a), a.cost_usd_per_hour, a.power_kw, f"{a.cost_usd_per_hour / plan.cost_usd_per_hour - 1:+.0%}",
                 a.binding) for a in result.alternatives]
    con.print(report.table("Runner-up plans", ["plan", "$/h", "kW", "vs plan", "binding"], alt_rows))
    if result.unservable:
        u = result.unservable
        con.print(f"[bold]warning:[/bold] {u['requests']:,} request(s) ({u['share_pct']:.2f} %, prompts of "
                  f"{u['min_prompt_tokens']:,}-{u['max_prompt_tokens']:,} tokens) cannot be served: {u['reason']}.")
    skipped = sorted({f"{o.role} {o.inst.hardware.name} TP{o.inst.tp}: {o.skipped}" for o in result.options if o.skipped})
    if skipped:
        con.print(f"{len(skipped)} option(s) skipped; see candidates.csv (--output-dir) for the reasons.")


# --- simulate ---------------------------------------------------------------------

_POOL = re.compile(r"^([^:]+):(\d+):(\d+)$")


def parse_pool(text: str, role: str) -> tuple[str, str, int, int]:
    match = _POOL.match(text.strip())
    if not match:
        raise SpecError(f"--{role}-pool '{text}': expected HARDWARE:TP:MACHINES, e.g. h100-80gb:8:35")
    return role, match.group(1), int(match.group(2)), int(match.group(3))


def read_plan(path: Path) -> tuple[list[tuple[str, str, int, int]], dict]:
    """Pools and input echo of a plan.json written by `optimize --output-dir`."""
    import json
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        plan = doc["plan"]
        pools = [(role, p["hardware"], int(p["tp"]), int(p["machines"]))
                 for role in ("prompt", "token", "mixed") for p in plan.get(f"{role}_pools", [])]
    except FileNotFoundError:
        raise SpecError(f"--plan {path}: no such file; write one with splitplan optimize --output-dir DIR") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"--plan {path}: not valid JSON ({exc})") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise SpecError(f"--plan {path}: not a splitplan plan.json (missing or bad key {exc})") from None
    if not pools:
        raise SpecError(f"--plan {path}: the plan has no pools")
    return pools, doc.get("inputs", {})


def plan_input(plan: Optional[Path], prompt_pool: list[str], token_pool: list[str],
               mixed_pool: list[str]) -> tuple[list[tuple[str, str, int, int]], dict]:
    """The pools of `--plan plan.json` (with its input echo) or of the inline pool options."""
    pools = [parse_pool(x, "prompt") for x in prompt_pool] + [parse_pool(x, "token") for x in token_pool] \
        + [parse_pool(x, "mixed") for x in mixed_pool]
    if plan is None:
        return pools, {}
    if pools:
        raise SpecError("give --plan or inline pools (--prompt-pool/--token-pool/--mixed-pool), not both")
    return read_plan(plan)


@app.command()
@user_errors
def simulate(
    plan: Optional[Path] = typer.Option(None, "--plan", help="A plan.json from optimize --output-dir."),
    prompt_pool: list[str] = typer.Option([], "--prompt-pool", help="HARDWARE:TP:MACHINES (repeatable)."),
    token_pool: list[str] = typer.Option([], "--token-pool", help="HARDWARE:TP:MACHINES (repeatable)."),
    mixed_pool: list[str] = typer.Option([], "--mixed-pool", help="Co-located HARDWARE:TP:MACHINES (repeatable)."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Request trace (default: the embedded Azure 2023 code trace)."),
    rate: Optional[float] = typer.Option(None, "--rate", help="Poisson resample of the trace's sizes at this rate (req/s)."),
    duration: float = typer.Option(120.0, "--duration", help="Resample length in seconds (with --rate)."),
    seed: int = typer.Option(0, "--seed", help="Random seed for --rate."),
    model: Optional[str] = typer.Option(None, "--model", help="Model (default: the plan's, else llama2-70b)."),
    slo: Optional[str] = typer.Option(None, "--slo", help="SLO profile (default: the plan's, else splitwise)."),
    engine: Optional[str] = typer.Option(None, "--engine", help="Engine profile (default: the plan's, else lean)."),
    perf_db: Optional[Path] = typer.Option(None, "--perf-db", help="Measured latencies instead of the analytic model."),
    perf_interp: str = typer.Option("splitplan", "--perf-interp", help="How --perf-db is read: splitplan (monotone batch and context curves) or splitwise-sim (its one batch-tokens axis, to compare with that simulator)."),
    max_batch_tokens: int = typer.Option(2048, "--max-batch-tokens", help="Prompt tokens per prefill batch."),
    routing: str = typer.Option("jsq", "--routing", help="jsq (join-shortest-queue on pending tokens) or round-robin."),
    borrow_threshold: Optional[int] = typer.Option(None, "--mixed-pool-threshold", help="Splitwise's mixed pool, both ways: prefill on a token machine when every prompt queue holds more than this many tokens; decode on a prompt machine when the token machine's KV is spoken for."),
    max_requests: int = typer.Option(1_000_000, "--max-requests", help="Longer traces are simulated on their busiest stretch of this many requests."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", help="Closed loop, as serving benchmarks run: this many clients, each sending its next request when the last one finishes."),
    isl: Optional[int] = typer.Option(None, "--isl", help="With --concurrency: every request's input tokens (default: drawn from the trace)."),
    osl: Optional[int] = typer.Option(None, "--osl", help="With --concurrency: every request's output tokens (default: drawn from the trace)."),
    num_requests: Optional[int] = typer.Option(None, "--num-requests", help="With --concurrency: requests in the run (default 10 per client, at least 100)."),
    format: Format = typer.Option(Format.table, "--format", help="table or json"),
    output_dir: Optional[Path] = typer.Option(None, "--output-dir", help="Write requests.csv and summary.json here."),
) -> None:
    """Replay a trace through a plan's machines request by request and check the SLO."""
    pools, echo = plan_input(plan, prompt_pool, token_pool, mixed_pool)
    if not pools:
        raise SpecError("nothing to simulate: give --plan plan.json or --prompt-pool and --token-pool (or --mixed-pool)")
    model = model or echo.get("model") or "llama2-70b"
    slo = slo or echo.get("slo") or "splitwise"
    engine = engine or echo.get("engine") or api.DEFAULT_ENGINE
    if max_batch_tokens < 1:
        raise SpecError(f"--max-batch-tokens {max_batch_tokens}: must be >= 1")
    if max_requests < 1:
        raise SpecError(f"--max-requests {max_requests}: must be >= 1")
    if concurrency is None:
        if isl is not None or osl is not None or num_requests is not None:
            raise SpecError("--isl, --osl and --num-requests describe a closed-loop run: add --concurrency N")
        workload, window = peak_window(load_workload(trace, rate, duration, seed), max_requests)
    else:
        if rate is not None:
            raise SpecError("--concurrency runs a closed loop (clients send as requests finish); drop --rate")
        workload, window = closed_loop_workload(trace, concurrency, num_requests, isl, osl, seed), None
    sim = api.simulate(workload, pools, model, slo, engine, str(perf_db) if perf_db else None, max_batch_tokens,
                       routing, borrow_threshold, perf_interp, concurrency)
    workload = sim.result.trace
    inputs = {"trace": workload.source, "requests": len(workload), "rate_rps": rate, "duration_s": duration if rate else None,
              "seed": seed, "model": model, "slo": slo, "engine": engine, "perf_db": str(perf_db) if perf_db else None,
              "perf_interp": perf_interp if perf_db else None, "pools": [{"role": r, "hardware": h, "tp": t, "machines": m} for r, h, t, m in pools],
              "routing": routing, "max_batch_tokens": max_batch_tokens, "mixed_pool_threshold": borrow_threshold,
              "window": window, "concurrency": concurrency, "isl": isl, "osl": osl}
    document = {"schema_version": report.SCHEMA_VERSION, "inputs": inputs, "summary": sim.summary}
    if output_dir is not None:
        from splitplan.sim.metrics import requests_csv
        files = {"requests.csv": requests_csv(sim.result, sim.result.names), "summary.json": report.to_json(document)}
        for name, text in files.items():
            report.write_atomic(output_dir / name, text)
    if format is Format.json:
        _emit_json(document)
        return
    _render_simulation(sim.summary, workload)


def _render_simulation(summary: dict, workload) -> None:
    con = report.console()
    metrics = [("TTFT", "ttft_ms"), ("TBT (E2E-TTFT)/output", "tbt_ms"), ("TBT max gap", "tbt_max_ms"), ("E2E", "e2e_ms"),
               ("prompt queue", "prompt_queue_ms"), ("KV transfer", "transfer_ms"), ("decode queue", "decode_queue_ms")]
    con.print(report.table(f"Simulated {summary['finished']:,} of {summary['requests']:,} requests from {workload.source} "
                           f"over {summary['span_s']:,.1f} s", ["ms", "p50", "p90", "p99"],
                           [(name, summary[key]["p50"], summary[key]["p90"], summary[key]["p99"]) for name, key in metrics]))
    bench = summary["benchmark"]
    con.print(report.table("As a serving benchmark reports it (TPOT = (E2E - TTFT) / (output - 1))",
                           ["ms", "mean", "median", "p99"],
                           [(name, bench[key]["mean"], bench[key]["median"], bench[key]["p99"])
                            for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"))],
                           caption=f"{bench['requests_per_s']:.3g} req/s, {bench['output_tokens_per_s']:,.0f} output tokens/s, "
                                   f"{bench['output_tokens_per_s_per_gpu']:,.0f} per GPU ({bench['gpus']} GPUs)"))
    con.print(report.table("SLO", ["line", "target", "achieved", "attainment %", "met"],
                           [(x["line"], x["target"], x["achieved"], x["attainment_pct"], "yes" if x["met"] else "NO")
                            for x in summary["slo"]]))
    con.print(report.table("Pools", ["role", "hardware", "TP", "machines", "utilization", "mean batch", "energy kWh"],
                           [(x["role"], x["hardware"], x["tp"], x["machines"], f"{x['utilization']:.0%}", x["mean_batch"],
                             x["energy_kwh"]) for x in summary["pools"]],
                           caption=f"tokens out {summary['tokens_out']:,} of {summary['tokens_asked']:,}; "
                                   f"{summary['rejected_kv']} request(s) never fit a token instance's KV; "
                                   f"GPU energy {summary['energy_kwh']:.2f} kWh"))
    moved = summary["borrowed"]
    if any(moved.values()):
        con.print(f"mixed pool: {moved['prefills_on_token_machines']:,} prefill(s) ran on token machines, "
                  f"{moved['decodes_on_prompt_machines']:,} decode(s) on prompt machines")
    if "extrapolated_pct" in summary:
        e = summary["extrapolated_pct"]
        con.print(f"perf-db: {e['prefill']:.1f} % of prefill and {e['decode']:.1f} % of decode lookups extrapolated beyond the measurements")


# --- compare --------------------------------------------------------------------------

class Scenario(str, Enum):
    iso_power = "iso-power"
    iso_cost = "iso-cost"
    iso_throughput_cost = "iso-throughput-cost"
    iso_throughput_power = "iso-throughput-power"


@app.command()
@user_errors
def compare(
    designs: str = typer.Option("splitwise-designs", "--designs", help="Designs YAML: a name from designs/ or a path."),
    scenario: Scenario = typer.Option(..., "--scenario", help="iso-power, iso-cost, iso-throughput-cost or iso-throughput-power."),
    budget_machines: list[str] = typer.Option([], "--budget-machines", help="Budget as the power (iso-power) or cost (iso-cost) of TYPE=N machines."),
    max_power_kw: Optional[float] = typer.Option(None, "--max-power-kw", help="iso-power budget in provisioned kW."),
    max_cost_per_hour: Optional[float] = typer.Option(None, "--max-cost-per-hour", help="iso-cost budget in USD per hour."),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="Design the ratios are taken against (default: the first)."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Request trace (default: the embedded Azure 2023 code trace)."),
    rate: Optional[float] = typer.Option(None, "--rate", help="iso-throughput: resample at this rate; iso-power/cost: where the rate search starts."),
    duration: float = typer.Option(120.0, "--duration", help="Length in seconds of every Poisson resample."),
    seed: int = typer.Option(0, "--seed", help="Random seed of the resamples."),
    model: str = typer.Option("llama2-70b", "--model", help="Catalog name or path to a config.json / YAML."),
    slo: str = typer.Option("splitwise", "--slo", help="SLO profile name or path."),
    engine: str = typer.Option(api.DEFAULT_ENGINE, "--engine", help="Engine profile name or path."),
    perf_db: Optional[Path] = typer.Option(None, "--perf-db", help="Measured latencies instead of the analytic model."),
    validate: bool = typer.Option(False, "--validate", help="Simulate each design's plan and report whether it holds."),
    jobs: int = typer.Option(0, "--jobs", help="Processes (or local Ray CPUs), one design each (0: one per core)."),
    executor: Executor = typer.Option(Executor.local, "--executor", help=EXECUTOR_HELP),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help=RAY_HELP),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Bar chart of the designs (PNG; needs the plot extra)."),
    format: PlanFormat = typer.Option(PlanFormat.table, "--format", help="table, json or csv"),
) -> None:
    """Splitwise's design study: every design of a designs file in one provisioning scenario."""
    if plot is not None:
        _require_matplotlib()
    base = load_workload(trace, None, duration, seed)
    if rate is not None and rate <= 0:
        raise SpecError(f"--rate {rate:g}: must be > 0 requests per second")
    from splitplan.specs.design import load_designs
    with _progress(f"{scenario.value}: designs", total=len(load_designs(designs).designs)) as step:
        result = api.compare(base, designs, scenario.value, model, slo, engine, _limits(budget_machines) or None,
                             max_power_kw, max_cost_per_hour, rate, duration, seed, baseline, validate,
                             str(perf_db) if perf_db else None, jobs=jobs if jobs > 0 else (os.cpu_count() or 1),
                             progress=step, executor=executor.value, ray_address=ray_address)
    document = result.to_json()
    if plot is not None:
        _compare_plot(result, plot)
    if format is PlanFormat.json:
        _emit_json(document)
    elif format is PlanFormat.csv:
        sys.stdout.write(result.to_frame().to_csv(index=False, float_format="%.6g"))
    else:
        metric = {"iso-power": "max rate", "iso-cost": "max rate", "iso-throughput-cost": "cost",
                  "iso-throughput-power": "power"}[result.scenario]
        rows = [(r["design"], r["prompt_machines"], r["token_machines"], r["mixed_machines"], r["cost_usd_per_hour"],
                 r["power_kw"], r["max_rate_rps"], r["ratio_to_baseline"], r["error"] or r["binding"])
                for r in document["designs"]]
        budget = ", ".join(f"{k} {v:,.1f}" for k, v in result.budget.items()) or "none"
        report.console().print(report.table(
            f"{result.scenario} (budget: {budget}; {metric} ratio against {result.baseline})",
            ["design", "prompt", "token", "mixed", "$/h", "kW", "max req/s", "ratio", "binding / why not"], rows))


def _compare_plot(result, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    frame = result.to_frame()
    column, label = {"iso-power": ("max_rate_rps", "max rate (req/s)"), "iso-cost": ("max_rate_rps", "max rate (req/s)"),
                     "iso-throughput-cost": ("cost_usd_per_hour", "cost (USD/h)"),
                     "iso-throughput-power": ("power_kw", "provisioned power (kW)")}[result.scenario]
    fig, ax = plt.subplots(figsize=(8, 4))
    bars = ax.bar(frame.design, frame[column].fillna(0), color=["#999999" if m else "#3b75af" for m in frame.mixed_machines.fillna(0)])
    for bar, ratio in zip(bars, frame.ratio_to_baseline):
        if ratio == ratio and ratio is not None:
            ax.annotate(f"{ratio:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set(ylabel=label, title=f"{result.scenario} (grey: co-located; ratios against {result.baseline})")
    ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    _save_figure(fig, path)


def _save_figure(fig, path: Path) -> None:
    """Atomically: a failed run leaves no partial PNG."""
    import matplotlib.pyplot as plt
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


# --- sweep ----------------------------------------------------------------------------

def parse_rates(text: str) -> list[float]:
    """`5,10,20` or `START:STOP:COUNT` (evenly spaced, both ends included)."""
    try:
        if ":" in text:
            start, stop, count = text.split(":")
            n = int(count)
            if n < 1:
                raise ValueError
            return [float(x) for x in np.linspace(float(start), float(stop), n)]
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecError(f"--rates '{text}': give rates like 5,10,20 or START:STOP:COUNT like 5:80:16") from None


@app.command()
@user_errors
def sweep(
    rates: str = typer.Option(..., "--rates", help="Request rates: 5,10,20 or START:STOP:COUNT."),
    designs: Optional[str] = typer.Option(None, "--designs", help="Designs YAML (name or path): cheapest plan per design and rate."),
    design: list[str] = typer.Option([], "--design", help="Only these designs of the file (repeatable)."),
    plan: Optional[Path] = typer.Option(None, "--plan", help="A plan.json: simulate this fixed plan at every rate."),
    prompt_pool: list[str] = typer.Option([], "--prompt-pool", help="Fixed plan, HARDWARE:TP:MACHINES (repeatable)."),
    token_pool: list[str] = typer.Option([], "--token-pool", help="Fixed plan, HARDWARE:TP:MACHINES (repeatable)."),
    mixed_pool: list[str] = typer.Option([], "--mixed-pool", help="Fixed co-located plan, HARDWARE:TP:MACHINES."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Request trace whose sizes are resampled."),
    duration: float = typer.Option(120.0, "--duration", help="Length in seconds of every resample."),
    seed: int = typer.Option(0, "--seed", help="Random seed of the resamples."),
    model: str = typer.Option("llama2-70b", "--model", help="Catalog name or path to a config.json / YAML."),
    slo: str = typer.Option("splitwise", "--slo", help="SLO profile name or path."),
    engine: str = typer.Option(api.DEFAULT_ENGINE, "--engine", help="Engine profile name or path."),
    objective: Objective = typer.Option(Objective.cost, "--objective", help="Designs mode: minimize cost or power."),
    perf_db: Optional[Path] = typer.Option(None, "--perf-db", help="Measured latencies instead of the analytic model."),
    jobs: int = typer.Option(0, "--jobs", help="Processes (or local Ray CPUs), one (design, rate) each (0: one per core)."),
    executor: Executor = typer.Option(Executor.local, "--executor", help=EXECUTOR_HELP),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help=RAY_HELP),
    output: Optional[Path] = typer.Option(None, "--output", help="Write the CSV here instead of standard output."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Latency against load with the SLO lines (PNG)."),
) -> None:
    """A load sweep as CSV: throughput against TTFT/TBT/E2E percentiles and cost per million tokens."""
    if plot is not None:
        _require_matplotlib()
    if objective is Objective.throughput:
        raise SpecError("--objective throughput does not apply to a sweep; use cost or power")
    pools, _ = plan_input(plan, prompt_pool, token_pool, mixed_pool)
    if duration <= 0:
        raise SpecError(f"--duration {duration:g}: must be > 0 seconds")
    base = load_workload(trace, None, duration, seed)
    rate_list = parse_rates(rates)
    if designs is not None:
        from splitplan.specs.design import load_designs
        units = len(rate_list) * (len(design) or len(load_designs(designs).designs))
    else:
        units = len(rate_list)
    with _progress("sweep: (design, rate) units", total=units) as step:
        result = api.sweep(base, rate_list, model, slo, designs, design or None, pools or None, engine,
                           objective.value, duration, seed, str(perf_db) if perf_db else None,
                           jobs=jobs if jobs > 0 else (os.cpu_count() or 1), progress=step,
                           executor=executor.value, ray_address=ray_address)
    text = result.to_frame().to_csv(index=False, float_format="%.6g")
    if plot is not None:
        _sweep_plot(result, slo, plot)
    if output is not None:
        report.write_atomic(output, text)
    else:
        sys.stdout.write(text)


def _sweep_plot(result, slo: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from splitplan.specs.slo import load_slo
    lines = load_slo(slo).lines()
    frame = result.to_frame()
    panels = [("ttft", "TTFT p99 (ms)"), ("tbt", "TBT p99 (ms)")] + ([("cost", "cost per million tokens (USD)")] if result.mode == "designs" else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8))
    for ax, (metric, label) in zip(axes, panels):
        column = "cost_per_million_tokens_usd" if metric == "cost" else f"{metric}_p99_ms"
        for name, part in frame.groupby("design", sort=False):
            ax.plot(part.rate_rps, part[column], marker="o", ms=3, label=name)
        for line in lines:
            if line.metric == metric and line.percentile == 99 and line.max_ms is not None:
                ax.axhline(line.max_ms, ls="--", color="red", lw=1, label=f"SLO {line.label}")
        ax.set(xlabel="request rate (req/s)", ylabel=label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{'cheapest plan per design' if result.mode == 'designs' else 'fixed plan, simulated'} against load", fontsize=10)
    fig.tight_layout()
    _save_figure(fig, path)


# --- calibrate --------------------------------------------------------------------

@app.command()
@user_errors
def calibrate(
    perf_db: Optional[Path] = typer.Option(None, "--perf-db", help="Measured latencies: splitwise perf_model.csv or the generic CSV."),
    deployments: Optional[Path] = typer.Option(None, "--deployments", help="Measured whole deployments (aiconfigurator silicon CSV: TTFT and TPOT of closed-loop runs), replayed by the simulator."),
    backend: Optional[str] = typer.Option(None, "--backend", help="With --deployments: the serving engine whose runs to fit (vllm, sglang, trtllm)."),
    output: Optional[Path] = typer.Option(None, "--output", help="Write the fitted engine profile (YAML) here."),
    engine: Optional[str] = typer.Option(None, "--engine", help="Starting profile (and the 'before' reference); default lean, lean-fp8 with --deployments."),
    folds: int = typer.Option(5, "--folds", help="k of the k-fold cross-validation (0: none); with --deployments any k > 0 means held-out folds by machine (or band)."),
    max_prefill_batch_tokens: Optional[int] = typer.Option(None, "--max-prefill-batch-tokens", help="Leave out batched prefills above this many tokens."),
    keep_anomalies: bool = typer.Option(False, "--keep-anomalies", help="Fit points that are faster than a smaller batch too."),
    description: Optional[str] = typer.Option(None, "--description", help="Description written into the profile."),
    residuals: Optional[Path] = typer.Option(None, "--residuals", help="Write every point with its predictions (CSV)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Predicted vs measured (PNG; needs the plot extra)."),
    jobs: int = typer.Option(0, "--jobs", help="Processes for the cross-validation fits (0: one per core)."),
    format: Format = typer.Option(Format.table, "--format", help="table or json"),
) -> None:
    """Fit an engine profile to measurements and report its error, in-sample and cross-validated."""
    if (perf_db is None) == (deployments is None):
        raise SpecError("give --perf-db (single forward passes) or --deployments (whole serving runs), one of them")
    if deployments is not None:
        _calibrate_deployments(deployments, backend, engine or "lean-fp8", folds, output, description, residuals, jobs, format)
        return
    if backend is not None:
        raise SpecError("--backend goes with --deployments")
    engine = engine or api.DEFAULT_ENGINE
    if plot is not None:
        _require_matplotlib()
    with _progress("calibrate: fit and cross-validation folds", total=1 + (folds if folds >= 2 else 0)) as step:
        result = api.calibrate(str(perf_db), engine, folds, max_prefill_batch_tokens, keep_anomalies,
                               progress=step, jobs=jobs if jobs > 0 else (os.cpu_count() or 1))
    header = (f"Engine profile fitted by: splitplan calibrate --perf-db {perf_db.name}"
              + (f" --max-prefill-batch-tokens {max_prefill_batch_tokens}" if max_prefill_batch_tokens else "")
              + f" --engine {engine} --folds {folds}\nFit error (MAPE %, cross-validated) is under fit.mape_pct.")
    profile = _write_calibration(result.profile, description, output, header, f"splitplan calibrate on {perf_db.name}",
                                 residuals, result.points)
    if plot is not None:
        _calibration_plot(result.points, plot)
    if format is Format.json:
        _emit_json(result.report)
        return
    con = report.console()
    cv_column = f"{folds}-fold CV" if folds else "CV (off)"
    con.print(report.table(f"MAPE % by group ({len(result.points)} points; {len(result.excluded)} left out)",
                           ["model", "hardware", "TP", "phase", "points", "before", "fitted", cv_column],
                           [(g["model"], g["hardware"], g["tp"], g["phase"], g["points"], g["mape_before_pct"],
                             g["mape_fit_pct"], g["mape_cv_pct"]) for g in result.report["groups"]]))
    con.print(report.table("Overall MAPE %", ["phase", "points", "before", "fitted", cv_column],
                           [(k, v["points"], v["mape_before_pct"], v["mape_fit_pct"], v["mape_cv_pct"])
                            for k, v in result.report["overall"].items()]))
    held_out = bool(folds) and result.points.cv_ms.notna().all()
    t = result.points.assign(fit_err=(result.points.fit_ms / result.points.latency_ms - 1) * 100,
                             cv_err=(result.points.cv_ms / result.points.latency_ms - 1) * 100)
    worst = t.reindex((t.cv_err if held_out else t.fit_err).abs().sort_values(ascending=False).index).head(10)
    con.print(report.table("Largest residuals" + (f" when held out ({folds}-fold)" if held_out else ""),
                           ["model", "hardware", "TP", "phase", "batch", "tokens", "measured ms", "fitted ms", "error %"]
                           + (["held out ms", "error %"] if held_out else []),
                           [(r.model, r.hardware, r.tp, r.phase, r.batch, r.prompt_tokens or r.context_tokens, r.latency_ms,
                             r.fit_ms, f"{r.fit_err:+.1f}") + ((r.cv_ms, f"{r.cv_err:+.1f}") if held_out else ())
                            for r in worst.itertuples()]))
    d = profile.defaults
    con.print(report.table("Fitted defaults (machines and models outside the data)", ["factor", "value"],
                           [(name, getattr(d, name)) for name in type(d).model_fields]))
    if len(result.excluded):
        con.print("Left out: " + "; ".join(f"{n} x {reason}" for reason, n in result.excluded.reason.value_counts().sort_index().items()))


def _write_calibration(profile, description, output, header: str, source: str, residuals, frame):
    """The fitted profile (with --description) written to --output, and the residual table
    to --residuals, each atomically; returns the profile as shown."""
    from splitplan.specs.engine import engine_to_yaml
    if description:
        profile = profile.model_copy(update={"description": description})
    files = {}
    if output is not None:
        files[output] = engine_to_yaml(profile.model_copy(update={"source": source}), header)
    if residuals is not None:
        files[residuals] = frame.to_csv(index=False, float_format="%.4f")
    for target, text in files.items():
        report.write_atomic(target, text)
    return profile


def _calibrate_deployments(path: Path, backend: str | None, engine: str, folds: int, output, description, residuals,
                           jobs: int, format) -> None:
    if backend is None:
        raise SpecError("--deployments needs --backend: the serving engine whose runs to fit (vllm, sglang, trtllm)")
    folds_on = folds != 0
    with _progress("calibrate: closed-loop fit and held-out folds") as step:
        result = api.calibrate_deployments(str(path), backend, engine, folds_on, jobs if jobs > 0 else (os.cpu_count() or 1), step)
    header = (f"Engine profile fitted by: splitplan calibrate --deployments {path.name} --backend {backend} --engine {engine}"
              + ("" if folds_on else " --folds 0") + "\nFit error (MAPE %, fitted and held out) is under fit.mape_pct.")
    profile = _write_calibration(result.profile, description, output, header,
                                 f"splitplan calibrate on {path.name} ({backend} runs)", residuals, result.runs)
    if format is Format.json:
        _emit_json(result.to_json())
        return
    t = result.table
    held = "ttft_mape_cv_pct" in t
    columns = ["machine", "concurrency", "runs", "TTFT MAPE fit", "TTFT median err fit", "TPOT MAPE fit", "TPOT median err fit"]
    if held:
        columns += ["TTFT MAPE held out", "TTFT median err held out", "TPOT MAPE held out", "TPOT median err held out"]
    rows = []
    for r in t.to_dict("records"):
        row = [r["machine"], r["band"], r["runs"], r["ttft_mape_fit_pct"], r["ttft_bias_fit_pct"], r["tpot_mape_fit_pct"], r["tpot_bias_fit_pct"]]
        if held:
            row += [r["ttft_mape_cv_pct"], r["ttft_bias_cv_pct"], r["tpot_mape_cv_pct"], r["tpot_bias_cv_pct"]]
        rows.append(row)
    con = report.console()
    con.print(report.table(f"{backend}: error % of simulated mean TTFT and TPOT ({len(result.runs)} runs; held out: "
                           f"{profile.fit['folds'] or 'off'})", columns, rows))
    d = profile.defaults
    con.print(report.table("Fitted engine-wide factors", ["factor", "value"],
                           [(name, getattr(d, name)) for name in type(d).model_fields]))
    if result.dropped:
        con.print("Left out of the file: " + "; ".join(f"{n} x {reason}" for reason, n in result.dropped.items()))


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SpecError("--plot needs matplotlib: pip install '.[plot]'") from None


def _calibration_plot(points, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, phase in zip(axes, ("prefill", "decode")):
        rows = points[points.phase == phase]
        for hw, part in rows.groupby("hardware"):
            ax.scatter(part.latency_ms, part.fit_ms, s=12, label=f"{hw} (fitted)")
        if rows.cv_ms.notna().any():
            ax.scatter(rows.latency_ms, rows.cv_ms, s=8, marker="x", color="grey", label="cross-validated")
        lo, hi = rows.latency_ms.min() * 0.8, rows.latency_ms.max() * 1.2
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel="measured ms", ylabel="predicted ms", title=phase)
        ax.legend(fontsize=7)
    fig.tight_layout()
    _save_figure(fig, path)


def main() -> None:
    """The console script: like `app()`, but a usage error (a bad option value, an
    unknown option) is one `error: ...` line too, with exit code 2."""
    # typer ships click (or vendors it); its UsageError is a base of the public BadParameter.
    usage_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
    try:
        code = app(standalone_mode=False)
    except usage_error as exc:
        message = " ".join(exc.format_message().split())
        if message:  # (no arguments at all: the help was shown, nothing to add)
            where = f"splitplan {exc.ctx.info_name} --help" if exc.ctx and exc.ctx.parent else "splitplan --help"
            typer.echo(f"error: {message} (see {where})", err=True)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("error: interrupted", err=True)
        sys.exit(130)
    sys.exit(code or 0)
