"""`splitplan calibrate`: fit an engine profile to measurements."""

from __future__ import annotations

import os
from pathlib import Path
from typing import cast

import typer

from splitplan.base.defaults import CALIBRATION_START
from splitplan.base.errors import SpecError
from splitplan.base.inputs import printable
from splitplan.cli.common import (
    KV_OFFLOAD_GB,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    PREFIX_CACHING,
    Format,
    _emit_json,
    _progress,
    _require_matplotlib,
    api,
    app,
    figure_png,
    user_errors,
)
from splitplan.io import report
from splitplan.workflows.plan_replay import cache_switch


@app.command()
@user_errors
def calibrate(
    perf_db: Path | None = typer.Option(None, "--perf-db", help="Measured latencies: splitwise perf_model.csv or the generic CSV."),
    deployments: Path | None = typer.Option(None, "--deployments",
        help="Measured whole deployments (aiconfigurator silicon CSV: TTFT and TPOT of closed-loop runs), replayed by the simulator."),
    backend: str | None = typer.Option(None, "--backend",
        help="With --deployments: the serving engine whose runs to fit (vllm, sglang, trtllm)."),
    bench: list[Path] | None = typer.Option(None, "--bench", metavar="PATH",
        help="Serving benchmark results (files or directories; repeatable): vllm bench serve --save-result JSON, inference-perf "
             "stage reports, a GuideLLM JSON report or an AIPerf/genai-perf profile export, each run replayed as it ran."),
    bench_format: str | None = typer.Option(None, "--bench-format",
        help="With --bench: vllm, inference-perf, guidellm or aiperf (default: detected from each file's content)."),
    trace: list[Path] | None = typer.Option(None, "--trace", metavar="PATH",
        help="With --bench: the run's own requests (arrivals, sizes, prefix columns), where the results do not record them; "
             "one for every run, or one per --bench."),
    model: str | None = typer.Option(None, "--model", help="With --bench: the model (default: the one a result records)."),
    hardware: str | None = typer.Option(None, "--hardware", help="With --bench: the machine type the runs ran on."),
    tp: int | None = typer.Option(None, "--tp", help="With --bench: the tensor-parallel degree (default: the one a result records)."),
    max_batch_tokens: int | None = MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int | None = MAX_NUM_SEQS,
    prefix_caching: str | None = PREFIX_CACHING,
    kv_offload_gb: float | None = KV_OFFLOAD_GB,
    output: Path | None = typer.Option(None, "--output", help="Write the fitted engine profile (YAML) here."),
    engine: str | None = typer.Option(None, "--engine",
        help="Starting profile (and the 'before' reference); default lean, lean-fp8 with --deployments, vllm with --bench."),
    folds: int = typer.Option(5, "--folds",
        help="k of the k-fold cross-validation (0: none); with --deployments any k > 0 means held-out folds by machine (or band), "
             "with --bench each run held out in turn."),
    max_prefill_batch_tokens: int | None = typer.Option(None, "--max-prefill-batch-tokens",
        help="Leave out batched prefills above this many tokens."),
    keep_anomalies: bool = typer.Option(False, "--keep-anomalies", help="Fit points that are faster than a smaller batch too."),
    description: str | None = typer.Option(None, "--description", help="Description written into the profile."),
    residuals: Path | None = typer.Option(None, "--residuals", help="Write every point with its predictions (CSV)."),
    plot: Path | None = typer.Option(None, "--plot", help="Predicted vs measured (PNG; needs the plot extra)."),
    jobs: int = typer.Option(0, "--jobs", help="Processes for the cross-validation fits (0: one per core)."),
    format: Format = typer.Option(Format.table, "--format", help="table or json"),
) -> None:
    """Fit an engine profile to measurements and report its error, in-sample and cross-validated."""
    if len([x for x in (perf_db, deployments, bench) if x]) != 1:
        raise SpecError("give --bench (your serving benchmarks), --perf-db (single forward passes) or --deployments "
                        "(aiconfigurator's measured deployments), one of them")
    if bench:
        settings = api.BenchSettings(model, hardware, tp, max_batch_tokens, max_num_seqs, cache_switch(prefix_caching),
                                     kv_offload_gb or 0.0)
        _calibrate_bench(bench, bench_format, trace or [], settings, engine or "vllm", folds, output, description, residuals,
                         plot, jobs, format)
        return
    _without_bench({"--bench-format": bench_format, "--trace": trace, "--model": model, "--hardware": hardware, "--tp": tp,
                    "--max-num-batched-tokens": max_batch_tokens, "--max-num-seqs": max_num_seqs,
                    "--prefix-caching": prefix_caching, "--kv-offload-gb": kv_offload_gb})
    if deployments is not None:
        _calibrate_deployments(deployments, backend, engine or "lean-fp8", folds, output, description, residuals, jobs, format)
    elif backend is not None:
        raise SpecError("--backend goes with --deployments")
    else:
        _calibrate_passes(cast(Path, perf_db), engine or CALIBRATION_START, folds, max_prefill_batch_tokens, keep_anomalies, output,
                          description, residuals, plot, jobs, format)


def _without_bench(flags: dict) -> None:
    """The options that only --bench takes, refused without it (exit 2, naming the first given)."""
    given = [flag for flag, value in flags.items() if value not in (None, [])]
    if given:
        raise SpecError(f"{given[0]} goes with --bench")


def _calibrate_passes(perf_db: Path, engine: str, folds: int, max_prefill_batch_tokens, keep_anomalies: bool, output,
                      description, residuals, plot, jobs: int, format) -> None:
    if plot is not None:
        _require_matplotlib()
    with _progress("calibrate: fit and cross-validation folds", total=1 + (folds if folds >= 2 else 0)) as step:
        result = api.calibrate(str(perf_db), engine, folds, max_prefill_batch_tokens, keep_anomalies,
                               progress=step, jobs=jobs if jobs > 0 else (os.cpu_count() or 1))
    header = (f"Engine profile fitted by: splitplan calibrate --perf-db {perf_db.name}"
              + (f" --max-prefill-batch-tokens {max_prefill_batch_tokens}" if max_prefill_batch_tokens else "")
              + f" --engine {engine} --folds {folds}\nFit error (MAPE %, cross-validated) is under fit.mape_pct.")
    profile = _write_calibration(result.profile, description, output, header, f"splitplan calibrate on {perf_db.name}",
                                 residuals, result.points, {plot: _calibration_plot(result.points)} if plot else {})
    if format is Format.json:
        _emit_json(result.report)
        return
    _render_calibration(result, profile, folds)


def _render_calibration(result, profile, folds: int) -> None:
    """The fit's error by group and overall, its largest residuals, and the fitted defaults."""
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


def _say_at_bound(profile) -> None:
    """A warning on stderr for each fitted factor that ended on a bound (fit.at_bound): what the
    data pushed past physics or could not pin, to report, not to take as measured."""
    ended = (profile.fit or {}).get("at_bound") or {}
    engine_wide = {k: v for k, v in ended.items() if "/" not in k}
    for name, why in engine_wide.items():
        typer.echo(f"warning: fitted factor {name.removeprefix('defaults.')} ended on its {printable(why)}; the data cannot "
                   "place it within physics: a finding to report, not a measured value", err=True)
    if len(ended) > len(engine_wide):
        typer.echo(f"warning: {len(ended) - len(engine_wide)} per-machine factor(s) ended on a bound (fit.at_bound lists them)",
                   err=True)


def _write_calibration(profile, description, output, header: str, source: str, residuals, frame, plots=None):
    """The fitted profile (with --description) written to --output, the residual table to
    --residuals and the `plots` ({path: PNG bytes}), as one set; returns the profile as shown."""
    from splitplan.specs.engine import engine_to_yaml
    if description:
        profile = profile.model_copy(update={"description": description})
    files = dict(plots or {})
    if output is not None:
        files[output] = engine_to_yaml(profile.model_copy(update={"source": source}), header)
    if residuals is not None:
        files[residuals] = frame.to_csv(index=False, float_format="%.4f")
    report.write_set(files)
    _say_at_bound(profile)
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
        row = [r["machine"], r["band"], r["runs"], r["ttft_mape_fit_pct"], r["ttft_bias_fit_pct"], r["tpot_mape_fit_pct"],
               r["tpot_bias_fit_pct"]]
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
        con.print("Left out of the file: " + result.left_out)


def _calibrate_bench(paths: list[Path], bench_format, traces: list[Path], settings, engine: str, folds: int, output,
                     description, residuals, plot, jobs: int, format) -> None:
    if plot is not None:
        _require_matplotlib()
    with _progress("calibrate: fit and held-out runs") as step:
        result = api.calibrate_bench([str(p) for p in paths], settings, engine, bench_format, [str(t) for t in traces],
                                     folds != 0, jobs if jobs > 0 else (os.cpu_count() or 1), step)
    command = _bench_command(paths, traces, bench_format, settings, engine)
    header = (f"Engine profile fitted by: {printable(command)}\nFit error (MAPE %, before, fitted and held out) is under "
              "fit.mape_pct; fit.error is what optimize --confidence sizes with.")
    profile = _write_calibration(result.profile, description, output, header, printable(command), residuals, result.runs,
                                 {plot: _bench_plot(result.runs)} if plot else {})
    if format is Format.json:
        _emit_json(result.to_json())
        return
    con = report.console()
    con.print(report.table("Error % per run and figure (predicted / measured - 1)",
                           ["run", "figure", "measured ms", "before", "fitted", "held out"],
                           [(printable(r["run"]), r["metric"], r["measured_ms"], _pct(r["before_ms"], r["measured_ms"]),
                             _pct(r["fitted_ms"], r["measured_ms"]), _pct(r["held_out_ms"], r["measured_ms"]))
                            for r in result.runs.to_dict("records")]))
    con.print(report.table("MAPE % per figure", ["figure", "runs", "before", "fitted", "held out"],
                           [(m, v["runs"], *(_one(v[k]) for k in ("before", "fitted", "held_out")))
                            for m, v in result.summary.items()]))
    _print_factors(con, result.factors, profile, engine)


def _print_factors(con, factors, profile, engine: str) -> None:
    """The fitted factors' table, and those the profile's kernel curves time (left out of the fit)."""
    con.print(report.table(f"Factors on {profile.fit['machine']} (pinned: the share the runs fixed; the rest is the prior, "
                           f"{printable(engine)})", ["factor", "prior", "fitted", "pinned %", "from"],
                           [(f["factor"], f["prior"], f["fitted"], _one(f["pinned_pct"]), f["source"])
                            for f in factors.to_dict("records")]))
    if profile.fit["timed_by_curves"]:
        con.print(f"Not fitted: {', '.join(profile.fit['timed_by_curves'])}; {profile.kernel_curves}'s measured kernel curves "
                  f"time what they would on {profile.fit['machine']}")


def _bench_command(paths: list[Path], traces: list[Path], bench_format, settings, engine: str) -> str:
    """The calibrate --bench command as given (the profile's source)."""
    flags = (("--bench-format", bench_format), ("--model", settings.model), ("--hardware", settings.hardware),
             ("--tp", settings.tp), ("--max-num-batched-tokens", settings.max_num_batched_tokens),
             ("--max-num-seqs", settings.max_num_seqs), ("--kv-offload-gb", settings.kv_offload_gb or None),
             ("--prefix-caching", {True: "on", False: "off"}.get(settings.prefix_caching)), ("--engine", engine))
    return " ".join(["splitplan calibrate", *(f"--bench {p}" for p in paths), *(f"--trace {t}" for t in traces),
                     *(f"{flag} {value}" for flag, value in flags if value is not None)])


def _one(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _pct(value: float, measured: float) -> str:
    return "" if value != value else f"{(value / measured - 1) * 100:+.1f}"


def _bench_plot(runs) -> bytes:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figures = [m for m in ("ttft_mean", "tpot_mean", "e2e_mean") if (runs.metric == m).any()]
    fig, axes = plt.subplots(1, len(figures), figsize=(4.5 * len(figures), 4.5), squeeze=False)
    for ax, metric in zip(axes[0], figures, strict=True):
        rows = runs[runs.metric == metric]
        for column, marker in (("before_ms", "o"), ("fitted_ms", "s"), ("held_out_ms", "x")):
            if rows[column].notna().any():
                ax.scatter(rows.measured_ms, rows[column], marker=marker, label=column.removesuffix("_ms").replace("_", " "))
        lo, hi = rows.measured_ms.min() * 0.8, rows.measured_ms.max() * 1.25
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel="measured ms", ylabel="predicted ms", title=metric.replace("_", " "))
        ax.legend(fontsize=7)
    fig.tight_layout()
    return figure_png(fig)


def _calibration_plot(points) -> bytes:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, phase in zip(axes, ("prefill", "decode"), strict=True):
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
    return figure_png(fig)
