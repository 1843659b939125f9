"""`hardware list`, `models list`, `trace summarize`, `perf`: the catalogs and single passes."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from splitplan.base.defaults import DEFAULT_ENGINE, DEFAULT_MODEL
from splitplan.base.errors import SpecError
from splitplan.base.inputs import excerpt
from splitplan.base.limits import MAX_BATCH, MAX_REQUEST_TOKENS
from splitplan.cli.common import (
    KV_CACHE,
    OUTPUT_COLUMN,
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
    api,
    app,
    hardware_app,
    models_app,
    shared_prefix,
    trace_app,
    trace_columns,
    user_errors,
    with_precision,
)
from splitplan.io import report
from splitplan.specs.hardware import hardware_catalog
from splitplan.specs.layout import parse_layout
from splitplan.specs.model import model_catalog
from splitplan.workload.trace import EMBEDDED_HELP, load_workload, summarize


@hardware_app.command("list")
@user_errors
def hardware_list(format: Format = typer.Option(Format.table, "--format", help="table or json")) -> None:
    """Machine types with their GPUs, price and power."""
    machines = hardware_catalog()
    if format is Format.json:
        _emit_json([m.model_dump() for m in machines])
        return
    rows = [
        (m.name, f"{m.gpus_per_machine}x {m.gpu.name}" + (f" (or {', '.join(str(s.gpus) for s in m.shapes)})" if m.shapes else ""),
         m.gpu.bf16_tflop_per_s, m.gpu.fp8_tflop_per_s, m.gpu.memory_gb,
         m.gpu.memory_tb_per_s, m.gpu.intra_node_bidir_gbyte_per_s, m.scale_out_gbit_per_s, m.price_usd_per_hour,
         m.provisioned_power_w / 1e3, m.price_date)
        for m in machines
    ]
    cols = ["name", "GPUs", "bf16\nTFLOP/s", "fp8\nTFLOP/s", "GB", "TB/s", "link\nGB/s", "net\nGbit/s", "$/h", "kW", "price\ndate"]
    title = ("Hardware catalog (per-GPU figures; price and power per whole machine; (or 1, 2): also rented as NAME@1, NAME@2; "
             "sources: --format json)")
    con = report.console()
    con.print(report.narrowed(con, title, cols, rows, ["price\ndate", "link\nGB/s", "net\nGbit/s", "kW", "TB/s", "fp8\nTFLOP/s"]))


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
    cols = ["name", "layers", "hidden", "heads", "KV\nheads", "FFN", "FFN\nkind", "experts", "params\nB", "active\nB",
            "KV B/\ntoken"]
    con = report.console()
    con.print(report.narrowed(con, "Model catalog (Hugging Face config keys; bf16)", cols, rows,
                              ["FFN\nkind", "hidden", "FFN", "KV\nheads", "heads", "layers"]))


@trace_app.command("summarize")
@user_errors
def trace_summarize(
    path: Path = typer.Argument(..., help="Azure 2023 CSV, splitwise-sim CSV, Mooncake JSONL, or a generic CSV (.gz ok); "
                                f"or {EMBEDDED_HELP}."),
    rate: float | None = typer.Option(None, "--rate", help="Resample: Poisson arrivals at this many requests/s."),
    duration: float = typer.Option(120.0, "--duration", help="Resample length in seconds (with --rate)."),
    seed: int = typer.Option(0, "--seed", help="Random seed for --rate."),
    time_column: str | None = TIME_COLUMN,
    prompt_column: str | None = PROMPT_COLUMN,
    output_column: str | None = OUTPUT_COLUMN,
    time_unit: str | None = TIME_UNIT,
    shared_prefix_tokens: int | None = SHARED_PREFIX_TOKENS,
    prefix_groups: int | None = PREFIX_GROUPS,
    format: Format = typer.Option(Format.table, "--format", help="table or json"),
) -> None:
    """Rows, span, rates, burstiness and token percentiles of a trace, and the prefix reuse a cache
    that never evicts would see (where the trace records prefixes, or with --shared-prefix-tokens)."""
    workload = load_workload(path, rate, duration, seed, trace_columns(time_column, prompt_column, output_column, time_unit))
    s = summarize(shared_prefix(workload, shared_prefix_tokens, prefix_groups))
    if format is Format.json:
        _emit_json(s)
        return
    rows = [
        ("requests", s["requests"]), ("span s", s["span_s"]), ("mean rate req/s", s["mean_rate_rps"]),
        ("peak minute req/s", s["peak_minute_rate_rps"]), ("inter-arrival CV", s["interarrival_cv"]),
    ]
    for key in ("prompt_tokens", "output_tokens"):
        p = s[key]
        rows.append((f"{key.replace('_', ' ')} p50 / p90 / p99 / max",
                     f"{p['p50']:,.0f} / {p['p90']:,.0f} / {p['p99']:,.0f} / {p['max']:,}"))
    if (reuse := s["prefix_reuse"]) is not None:
        rows += [("prefix cache hits at most (one never-evicting cache)",
                  f"{reuse['infinite_cache_hit_rate']:.1%} of all the trace's prompt tokens"),
                 ("requests with a hit", f"{reuse['requests_with_a_hit']:.1%}"),
                 ("hit tokens p50 / p90", f"{reuse['hit_tokens_p50']:,.0f} / {reuse['hit_tokens_p90']:,.0f}")]
    report.console().print(report.table(f"Trace {s['source']}", ["metric", "value"], rows))


_POINT = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*)?(\d+)\s*$")


def parse_points(text: str, option: str) -> list[tuple[int, int]]:
    """`512,4x512` -> [(1, 512), (4, 512)]: batch x tokens; a bare number is batch 1."""
    points = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        match = _POINT.match(item)
        batch, tokens = (int(match.group(1) or 1), int(match.group(2))) if match else (0, 0)
        if not (1 <= batch <= MAX_BATCH and 1 <= tokens <= MAX_REQUEST_TOKENS):
            raise SpecError(f"{option} '{excerpt(item)}': expected TOKENS or BATCHxTOKENS, a batch of 1 to {MAX_BATCH:,} "
                            f"and 1 to {MAX_REQUEST_TOKENS:,} tokens, e.g. 512,4x512")
        points.append((batch, tokens))
    return points


@app.command()
@user_errors
def perf(
    model: str = typer.Option(DEFAULT_MODEL, "--model", help="Catalog name or path to a Hugging Face config.json / YAML."),
    hardware: str = typer.Option("h100-80gb", "--hardware", help="Catalog name or path to a hardware YAML."),
    tp: int | None = typer.Option(None, "--tp", help="Tensor-parallel degree (default: the smallest that fits)."),
    layout: str | None = typer.Option(None, "--layout", help="A whole parallel layout instead of --tp: tp8, dp16ep16, "
                                         "tp8dp2ep16, tp8pp2 (TP, data-parallel attention, EP, PP; may span machines)."),
    prefill: str = typer.Option("512,2048", "--prefill", help="Prefill batches: T (one prompt) or BxT (B prompts of T tokens)."),
    decode: str = typer.Option("1x512,64x2048", "--decode", help="Decode steps: BxC (B requests, C context tokens each)."),
    engine: str = typer.Option(DEFAULT_ENGINE, "--engine", help="Engine profile name or path (vllm, lean, splitwise-vllm, ...)."),
    weights: Weights | None = WEIGHTS,
    kv_cache: KvCache | None = KV_CACHE,
    perf_db: Path | None = typer.Option(None, "--perf-db",
        help="Measured latencies (splitwise perf_model.csv or generic CSV) instead of the analytic model."),
    format: Format = typer.Option(Format.table, "--format", help="table or json"),
) -> None:
    """Predicted prefill and decode-step latency of one model instance, and what bounds it."""
    pre, dec = parse_points(prefill, "--prefill"), parse_points(decode, "--decode")
    if layout is not None and tp is not None:
        raise SpecError("give --tp or --layout, not both")
    inst = api.instance(model, hardware, parse_layout(layout, "--layout") if layout else tp, with_precision(engine, weights, kv_cache))
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
    share = (f"{facts['instances_per_machine']} instance(s) per machine" if inst.unit_machines == 1 else
             f"one instance over {inst.unit_machines} machines ({inst.layout.gpus} GPUs)")
    caption = (f"{share}; weights {facts['weights_gb_per_gpu']:.1f} GB/GPU; "
               f"KV {facts['kv_bytes_per_token']:,.0f} B/token; KV capacity {facts['kv_capacity_tokens']:,} tokens per instance.\n"
               "tokens: prompt tokens (prefill) or context tokens per request (decode). The latency is the sum of: compute "
               "(operator classes bound by FLOP/s, at the achieved efficiency and sustained clock), memory (classes bound by "
               "bytes: weights, KV, activations), network (tensor-parallel all-reduces, expert-parallel all-to-alls and "
               "pipeline hops, over NVLink within the NVLink domain and the NICs beyond it) and overhead "
               "(engine and kernel-launch time per pass); bound names the largest. KV fits: the batch's KV within capacity.\n"
               "Timed from: " + "; ".join(f"{op}: {how}" for op, how in inst.timing_sources.items()))
    cols = ["phase", "batch", "tokens", "latency ms", "bound", "compute ms", "memory ms", "network ms", "overhead ms", "KV fits"]
    title = f"{inst.model.name} on {inst.hardware.name}, {inst.layout}, engine {inst.engine.name}"
    report.console().print(report.table(title, cols, rows, caption))
