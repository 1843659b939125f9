"""Serving benchmarks replayed as they ran (`splitplan calibrate --bench`).

A `Replay` is one measured run (`workload.benchmarks.BenchRun`) made ready for the simulator:
its requests (sizes in send order; arrival times for an open loop), its load (a closed loop of
`concurrency` clients, or the arrivals), the warm-up the benchmark sent first and left out, the
one co-located instance it ran on, the engine's scheduler settings, and what it measured.
`predict` simulates it under a profile and computes each measured figure as the tool did: means
and percentiles over the measured requests, TPOT as a mean per request or, where the tool
derives it so (inference-perf), from the means. A closed loop's first wave has its outputs
graded so that its clients run out of phase (workload.trace.out_of_phase); where that wave is
measured (no warm-up before it), its TTFT counts and its E2E and TPOT do not.

Where the requests come from, in order: `--trace` (the run's own: arrivals, sizes, prefix
columns), the file's per-request record, the length distribution a summary keeps, its means. A
run refuses (SpecError naming the flag) where it lacks the model, machine, TP or sizes.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import numpy as np

from splitplan.base.errors import SpecError
from splitplan.base.inputs import excerpt
from splitplan.base.limits import MAX_CONCURRENCY, MAX_RATE_RPS
from splitplan.perf.roofline import Instance
from splitplan.sim.cluster import PoolSpec, simulate
from splitplan.sim.types import SimOptions
from splitplan.specs.engine import EngineProfile
from splitplan.specs.hardware import load_hardware
from splitplan.specs.layout import Layout
from splitplan.specs.model import catalog_name_of, load_model
from splitplan.specs.roles import Role
from splitplan.workload.trace import Trace, out_of_phase

MAX_REPLAY_REQUESTS = 6_000  # measured requests replayed per run (the first ones: a longer run's steady state repeats)


@dataclass(frozen=True)
class BenchSettings:
    """What `calibrate --bench` takes from flags where a benchmark file does not record it (or to
    override what it records): as `simulate` takes them."""

    model: str | None = None
    hardware: str | None = None
    tp: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    prefix_caching: bool | None = None
    kv_offload_gb: float = 0.0


@dataclass(frozen=True)
class Replay:
    """One measured run ready to simulate (module docstring)."""

    name: str
    trace: Trace  # the warm-up's requests first
    instance: Instance  # the run's instance (its model, machine, layout), under the starting profile as the run had it
    options: SimOptions
    warmup: int  # the trace's first requests, left out of the figures
    measured_ms: dict[str, float]
    tpot_of_means: bool = False
    memory_fraction: float | None = None  # the GPU memory the engine was given, where the run records it
    graded: int = 0  # the measured requests (after the warm-up) of a closed loop's graded first wave: TTFT only

    def under(self, profile: EngineProfile) -> Instance:
        return Instance(self.instance.model, self.instance.hardware, _as_run(profile, self.memory_fraction),
                        self.instance.layout)


def _as_run(profile: EngineProfile, memory_fraction: float | None) -> EngineProfile:
    """`profile` with the share of GPU memory the run gave the engine, where it records one."""
    return profile if memory_fraction is None else profile.model_copy(update={"memory_usable_fraction": memory_fraction})


def predict(replay: Replay, profile: EngineProfile) -> dict[str, float]:
    """The run's figures (ms, those it measured) simulated under `profile`; NaN where no
    measured request completed (or the instance cannot hold the model)."""
    inst = replay.under(profile)
    if not inst.fit.fits:
        return {m: float("nan") for m in replay.measured_ms}
    result = simulate(replay.trace, [PoolSpec(Role.MIXED, inst, inst.unit_machines, 1)],
                      dataclasses.replace(replay.options, inter_token_gaps=False))
    ttft, e2e = result.ttft_s[replay.warmup:] * 1e3, result.e2e_s[replay.warmup:] * 1e3
    outputs = replay.trace.output_tokens[replay.warmup:].astype(float)
    done = np.isfinite(e2e) & np.isfinite(ttft)
    if not done.any():
        return {m: float("nan") for m in replay.measured_ms}
    steady = done.copy()
    steady[:replay.graded] = False  # (their outputs graded: their E2E and TPOT are not the run's)
    steady = steady if steady.any() else done
    figures = {}
    for name, values in (("ttft", ttft[done]), ("e2e", e2e[steady])):
        figures[f"{name}_mean"] = float(np.mean(values))
        for q in (50, 90, 99):
            figures[f"{name}_p{q}"] = float(np.percentile(values, q))
    ttft, e2e, outputs = ttft[steady], e2e[steady], outputs[steady]
    if replay.tpot_of_means:
        figures["tpot_mean"] = (float(np.mean(e2e)) - float(np.mean(ttft))) / max(float(np.mean(outputs)) - 1, 1.0)
    else:
        many = outputs > 1
        figures["tpot_mean"] = float(np.mean((e2e[many] - ttft[many]) / (outputs[many] - 1))) if many.any() else float("nan")
    return {m: figures[m] for m in replay.measured_ms}


def _catalog_model(run, settings: BenchSettings) -> str:
    """--model, else the catalog model the run records (by name or Hugging Face repository); SpecError
    naming the flag where it records none the catalog knows."""
    if settings.model:
        return settings.model
    recorded = run.settings.get("model")
    named = catalog_name_of(recorded) if isinstance(recorded, str) and recorded else None
    if named is None:
        said = f" (it records {excerpt(recorded)})" if recorded else ""
        raise SpecError(f"{run.source}: no model the catalog knows{said}: give --model NAME (splitplan catalog lists them)")
    return named


def _check_precision(run, base: EngineProfile, settings: BenchSettings) -> None:
    """A run that served fp8 or fp4 weights (its model's repository says so) is fitted from a
    profile of that precision: a bf16 profile's factors would absorb the precision's speed."""
    recorded = "" if settings.model else str(run.settings.get("model") or "")
    found = re.search(r"(?<![a-z0-9])(?:nv)?(fp8|fp4)(?![a-z0-9])", recorded.lower())
    precision = run.settings.get("precision") or (found.group(1) if found else None)
    if precision and precision != base.weights:
        said = f"served {recorded}" if found and not run.settings.get("precision") else "records its precision"
        raise SpecError(f"{run.source}: the run {said} ({precision} weights) and --engine {base.name} has {base.weights} "
                        f"weights: start from a profile of that precision (e.g. --engine vllm-fp8 for fp8), or give --model")


def _check_load(run, timed: bool = False) -> None:
    """A run's rate and concurrency within splitplan.base.limits; and a run at a rate capped at a
    concurrency (vllm bench serve --request-rate with --max-concurrency) replays as an open loop
    only where the cap did not bind (by Little's law: requests in flight, rate x mean E2E, well
    under it) or its send times are recorded."""
    if run.rate_rps is not None and not 1e-6 <= run.rate_rps <= MAX_RATE_RPS:
        raise SpecError(f"{run.source}: a request rate of {run.rate_rps:g} req/s; expected 1e-06 to {MAX_RATE_RPS:g}")
    if run.concurrency is not None and run.concurrency > MAX_CONCURRENCY:
        raise SpecError(f"{run.source}: a concurrency of {run.concurrency:,}; at most {MAX_CONCURRENCY:,} clients")
    e2e_ms = run.measured_ms.get("e2e_mean")
    if run.rate_rps and run.concurrency and run.start_s is None and e2e_ms and not timed \
            and run.rate_rps * e2e_ms / 1e3 > 0.8 * run.concurrency:
        raise SpecError(f"{run.source}: {run.rate_rps:g} req/s capped at {run.concurrency} in flight, and about "
                        f"{run.rate_rps * e2e_ms / 1e3:.0f} were: the cap held requests back at times the file does not "
                        "record; rerun with --save-detailed (per-request start_times), or give --trace with the send times")


def _required(run, key: str, value, flag: str):
    if value is None:
        what = {"tp": "tensor-parallel degree", "hardware": "machine type"}[key]
        raise SpecError(f"{run.source}: the run records no {what}: give {flag}")
    return value


def _arrivals(run, n: int, seed: int = 0) -> np.ndarray:
    """Send times of `n` requests at the run's rate and arrival process, scaled to end at n / rate
    as vllm bench serve and inference-perf scale theirs; all at 0 without a rate."""
    if run.rate_rps is None:
        return np.zeros(n)
    rng = np.random.default_rng(seed)
    if run.arrival == "constant":
        gaps = np.ones(n)
    elif run.arrival == "gamma":
        gaps = rng.gamma(run.burstiness, 1.0 / run.burstiness, n)
    else:
        gaps = rng.exponential(1.0, n)
    times = np.concatenate(([0.0], np.cumsum(gaps)[:-1]))
    return times * (n / run.rate_rps) / max(float(np.sum(gaps)), 1e-12)


def _requests(run, trace):
    """The measured requests as a Trace: the --trace (its arrivals and sizes) over the file's, else
    the file's per-request record, else its mean sizes; at most MAX_REPLAY_REQUESTS."""
    if trace is not None:
        return trace.take(slice(0, MAX_REPLAY_REQUESTS)) if len(trace) > MAX_REPLAY_REQUESTS else trace
    if run.input_tokens is not None and run.output_tokens is not None and len(run.input_tokens):
        k = min(len(run.input_tokens), MAX_REPLAY_REQUESTS)
        arrival = run.start_s[:k] if run.start_s is not None and not run.closed_loop else _arrivals(run, k)
        prompt = np.maximum(run.input_tokens[:k], 1).astype(np.int64)
        cached = None if run.cached_tokens is None else np.minimum(run.cached_tokens[:k], prompt - 1).astype(np.int64)
        return Trace(arrival - arrival[0], prompt, np.maximum(run.output_tokens[:k], 1).astype(np.int64), run.source, cached)
    if run.isl_mean and run.osl_mean and run.requests:
        k = min(run.requests, MAX_REPLAY_REQUESTS)
        rng = np.random.default_rng(0)
        return Trace(_arrivals(run, k), _lengths(run.isl_quantiles, run.isl_mean, k, rng),
                     _lengths(run.osl_quantiles, run.osl_mean, k, rng), run.source)
    raise SpecError(f"{run.source}: the run records no request sizes (input and output lengths): give --trace FILE with "
                    "its requests")


def _lengths(quantiles: dict[float, float], mean: float, n: int, rng) -> np.ndarray:
    """`n` lengths drawn from the recorded quantiles (linear between them), scaled to the recorded
    mean; the mean every time where fewer than two quantiles are recorded. (Prompt and output
    lengths are drawn apart: a summary does not record how they go together.)"""
    if len(quantiles) < 2:
        return np.full(n, max(round(mean), 1), np.int64)
    levels, values = zip(*sorted(quantiles.items()), strict=True)
    drawn = np.interp(rng.random(n), levels, values)
    drawn *= mean / drawn.mean() if drawn.mean() > 0 else 1.0
    return np.maximum(np.round(drawn), 1).astype(np.int64)


def _within_context(run, trace, context: int | None):
    """The requests the engine took: those longer than its context window (prompt and output)
    were refused and are not among a run's measured ones."""
    if context is None:
        return trace
    fits = trace.prompt_tokens + trace.output_tokens <= context
    if not fits.any():
        raise SpecError(f"{run.source}: every request is longer than the model's {context:,}-token context; check the "
                        "request sizes (or --trace) and --model")
    return trace if fits.all() else trace.take(fits)


def _with_warmup(trace, warm: int):
    """`trace` after `warm` requests of its first ones' sizes, sent at its mean pace before it."""
    if not warm:
        return trace
    step = trace.span_s / (len(trace) - 1) if len(trace) > 1 else 0.0
    ahead = trace.take(np.concatenate([np.arange(warm), np.arange(len(trace))]))
    return dataclasses.replace(ahead, arrival_s=np.concatenate([np.arange(warm) * step, trace.arrival_s + warm * step]))


def bench_replay(run, settings: BenchSettings, base: EngineProfile, trace=None):
    """One BenchRun (workload.benchmarks) as a Replay: its requests (`trace`, a Trace,
    where given: the run's own), with the warm-up the tool sent first (the first requests' sizes
    again at the same pace), its instance and the engine's scheduler as it ran."""
    model = load_model(_catalog_model(run, settings))
    hardware = load_hardware(_required(run, "hardware", settings.hardware, "--hardware NAME"))
    tp = int(_required(run, "tp", settings.tp or run.settings.get("tp"), "--tp N"))
    if not run.measured_ms:
        raise SpecError(f"{run.source}: records no TTFT, TPOT or E2E figure to fit to")
    _check_load(run, timed=trace is not None)
    _check_precision(run, base, settings)
    fraction = run.settings.get("gpu_memory_utilization")
    inst = Instance(model, hardware, _as_run(base, fraction), Layout(tp))
    if not inst.fit.fits:
        raise SpecError(f"{run.source}: {model.name} at TP {tp} on {hardware.name}: {inst.fit.reason}; check --tp and --hardware")
    context = run.settings.get("max_model_len") or base.context_tokens(model)
    measured = _within_context(run, _requests(run, trace), context)
    warm = min(run.warmup_requests, len(measured))
    batch = settings.max_num_batched_tokens or run.settings.get("max_num_batched_tokens")
    seqs = settings.max_num_seqs or run.settings.get("max_num_seqs")
    caching = settings.prefix_caching if settings.prefix_caching is not None else run.settings.get("prefix_caching")
    options = SimOptions(base.batch_tokens(batch), concurrency=run.concurrency if run.closed_loop else None,
                         max_model_len=context, max_num_seqs=base.seqs_cap(seqs),
                         warmup_requests=warm, prefix_caching=base.caches_prefixes(caching, kv_offload_gb=settings.kv_offload_gb),
                         kv_offload_gb=settings.kv_offload_gb)
    trace, graded = _with_warmup(measured, warm), 0
    if run.closed_loop:  # (the first wave out of phase: workload.trace.out_of_phase)
        trace = dataclasses.replace(trace, output_tokens=out_of_phase(trace.output_tokens, run.concurrency))
        graded = max(min(run.concurrency, len(trace)) - warm, 0)
    return Replay(run.source, trace, inst, options, warm, dict(run.measured_ms), run.tpot_of_means, fraction, graded)


