"""`splitplan calibrate`: fit an engine profile to measurements."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from splitplan.base.defaults import CALIBRATION_START
from splitplan.base.errors import SpecError
from splitplan.base.inputs import printable
from splitplan.cli.common import (
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


@app.command()
@user_errors
def calibrate(
    perf_db: Path | None = typer.Option(None, "--perf-db", help="Measured latencies: splitwise perf_model.csv or the generic CSV."),
    deployments: Path | None = typer.Option(None, "--deployments",
        help="Measured whole deployments (aiconfigurator silicon CSV: TTFT and TPOT of closed-loop runs), replayed by the simulator."),
    backend: str | None = typer.Option(None, "--backend",
        help="With --deployments: the serving engine whose runs to fit (vllm, sglang, trtllm)."),
    output: Path | None = typer.Option(None, "--output", help="Write the fitted engine profile (YAML) here."),
    engine: str | None = typer.Option(None, "--engine",
        help="Starting profile (and the 'before' reference); default lean, lean-fp8 with --deployments."),
    folds: int = typer.Option(5, "--folds",
        help="k of the k-fold cross-validation (0: none); with --deployments any k > 0 means held-out folds by machine (or band)."),
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
    if (perf_db is None) == (deployments is None):
        raise SpecError("give --perf-db (single forward passes) or --deployments (whole serving runs), one of them")
    if deployments is not None:
        _calibrate_deployments(deployments, backend, engine or "lean-fp8", folds, output, description, residuals, jobs, format)
        return
    if backend is not None:
        raise SpecError("--backend goes with --deployments")
    assert perf_db is not None  # (one of the two: checked above)
    engine = engine or CALIBRATION_START
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
        con.print("Left out of the file: " + "; ".join(f"{n} x {reason}" for reason, n in result.dropped.items()))


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
