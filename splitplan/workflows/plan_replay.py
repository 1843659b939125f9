"""A plan.json re-checked with the settings it records: the rules `simulate --plan` and `sweep --plan`
(and `splitplan.simulate` given a plan.json) share. Each setting is the option given, else the plan's
own (its `inputs`), else the default; `simulate_plan` runs one such simulation."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from splitplan.base.defaults import DEFAULT_ENGINE, DEFAULT_MODEL, DEFAULT_SLO
from splitplan.base.errors import SpecError
from splitplan.base.inputs import excerpt, printable

if TYPE_CHECKING:
    from splitplan.workflows.simulation import SimulateResult


def scheduler_settings(engine: str, max_num_batched_tokens: int | None, max_num_seqs: int | None,
                       echo: dict | None = None) -> tuple[int, int | None]:
    """The token budget and sequence cap a run uses: the options given, else the plan's (its
    `inputs`, `echo`), else the engine profile's. A chunked iteration carries every running
    decode, so a budget below the cap is refused, as vLLM refuses it (max_num_batched_tokens
    must be >= max_num_seqs): exit 2."""
    from splitplan.specs.engine import load_engine
    eng, echo = load_engine(engine), echo or {}
    budget = eng.batch_tokens(max_num_batched_tokens or echo.get("max_batch_tokens"))
    cap = eng.seqs_cap(max_num_seqs or echo.get("max_num_seqs"))
    if eng.chunked and cap is not None and budget < cap:
        raise SpecError(f"--max-num-batched-tokens {budget:,} is below --max-num-seqs {cap:,} (engine {eng.name}, chunked "
                        f"prefill): every running request takes a token of each iteration; give at least {cap:,} tokens "
                        "or fewer sequences")
    return budget, cap


def cache_switch(value: str | None) -> bool | None:
    """--prefix-caching on|off (None: the engine profile's)."""
    if value not in (None, "on", "off"):
        raise SpecError(f"--prefix-caching {value}: choose on or off")
    return None if value is None else value == "on"


def cache_settings(echo: dict, prefix_caching: bool | None, routing: str | None,
                   kv_offload_gb: float | None) -> tuple[bool | None, str, float]:
    """Prefix caching (None: the engine profile's), routing and host-memory tier of a run: the
    options given, else the plan's (its `inputs`, typed by plan_document.Inputs), else the defaults."""
    caching = prefix_caching if prefix_caching is not None else cache_switch(echo.get("prefix_caching"))
    offload = kv_offload_gb if kv_offload_gb is not None else echo.get("kv_offload_gb")
    return caching, routing or echo.get("routing") or "jsq", float(offload or 0.0)


def trace_record(trace: Path | None, columns) -> dict:
    """--trace and its column options as a plan records them (inputs.trace_file, trace_columns),
    so that simulate --plan and sweep --plan replay the same requests: an embedded trace by its
    short name, a file by its absolute path, None for the default embedded trace."""
    from splitplan.workload.trace import embedded
    name = None if trace is None else str(trace) if embedded(trace) is not None else str(Path(trace).resolve())
    return {"trace_file": name, "trace_columns": None if columns is None else {
        "time": columns.time, "prompt": columns.prompt, "output": columns.output, "time_unit_s": columns.time_unit_s}}


class PlanWorkload(NamedTuple):
    """The workload a command re-checking a plan replays, each setting by plan_settings' rule:
    the option given, else the plan's recorded one (its `inputs`: trace_file, trace_columns,
    rate_rps, duration_s, seed, headroom_pct, max_requests, and a --window plan's window_s and
    window), else the default. `overridden`: the options given where the plan records its own."""

    trace: str | Path | None
    columns: Any
    rate: float | None
    duration_s: float
    seed: int
    headroom_pct: float = 0.0
    window: tuple[float, float] | None = None  # a --window plan's (window seconds, its start)
    max_requests: int | None = None  # the plan's peak stretch
    overridden: tuple[str, ...] = ()

    def load(self, max_requests: int):
        """The requests, as optimize made them: the trace, resampled at the rate, the plan's
        window or peak stretch of it, with the plan's headroom; and the stretch (peak_window's)."""
        from splitplan.workload.trace import load_workload, peak_window, windows, with_headroom
        workload = load_workload(load_workload(self.trace, None, self.duration_s, self.seed, self.columns), self.rate,
                                 self.duration_s, self.seed)
        if self.window is not None:
            window_s, start_s = self.window
            found = [part for start, part in windows(workload, window_s) if math.isclose(start, start_s, abs_tol=1e-6)]
            if not found:
                raise SpecError(f"the plan's window at {start_s:g} s holds no request of {workload.source}: give --trace")
            workload = found[0]
        workload, stretch = peak_window(workload, self.max_requests or max_requests)
        return with_headroom(workload, self.headroom_pct), stretch

    def note(self) -> str:
        """What the title says of a plan's workload replaced by options (empty when none is)."""
        return f" (the plan's workload but {', '.join(self.overridden)})" if self.overridden else ""


def plan_workload(echo: dict, trace: Path | None, columns, rate: float | None, duration_s: float | None,
                  seed: int | None) -> PlanWorkload:
    """simulate's and sweep's workload for a plan (`echo`, its inputs; {} without one): see PlanWorkload."""
    from splitplan.workload.trace import Columns
    if not echo:
        return PlanWorkload(trace, columns, rate, _first(duration_s, 120.0), _first(seed, 0))
    _check_recorded_trace(echo, trace)
    given = {"--trace": trace_record(trace, None)["trace_file"] if trace is not None else None, "--rate": rate,
             "--duration": duration_s, "--seed": seed}
    theirs = {"--trace": echo.get("trace_file"), "--rate": echo.get("rate_rps"), "--duration": echo.get("duration_s"),
              "--seed": echo.get("seed")}
    changed = [flag for flag, value in given.items() if value is not None and value != theirs[flag]]
    other_trace = "--trace" in changed  # (the plan's rate resampled its own trace, not this one)
    stored = echo.get("trace_columns")
    headroom, window, stretch = (0.0, None, None) if changed else _own_requests(echo)
    return PlanWorkload(
        trace if other_trace else theirs["--trace"],
        columns if columns is not None or other_trace else Columns(**stored) if stored else None,
        _first(rate, None if other_trace else theirs["--rate"]), _first(duration_s, theirs["--duration"], 120.0),
        _first(seed, theirs["--seed"], 0), headroom, window, stretch,
        overridden=tuple(f"{flag} {given[flag]:g}" if isinstance(given[flag], float) else f"{flag} {printable(str(given[flag]))}"
                         for flag in changed))


def _first(*values):
    """The first of `values` that is not None (the option given, else the plan's, else the default)."""
    return next((v for v in values if v is not None), None)


def _check_recorded_trace(echo: dict, trace: Path | None) -> None:
    """An older plan.json records its trace by description only: refused unless --trace names it."""
    from splitplan.workload.trace import default_trace_path
    made_on = str(echo.get("trace") or "")
    if trace is None and echo.get("trace_file") is None and made_on and not made_on.startswith(default_trace_path().name):
        raise SpecError(f"the plan was made on {excerpt(made_on)}, which it does not record as a file (an older "
                        "plan.json): give --trace (and --rate, --duration, --seed as it was made)")


def _own_requests(echo: dict) -> tuple[float, tuple[float, float] | None, int | None]:
    """What makes a plan's own requests of its workload: its headroom, and its --window plan's window
    or its peak stretch (PlanWorkload's headroom_pct, window and max_requests)."""
    window = echo.get("window") or {}
    return (float(echo.get("headroom_pct") or 0.0),
            (float(echo["window_s"]), float(window["start_s"])) if window and echo.get("window_s") else None,
            int(window["requests"]) if window.get("requests") and not echo.get("window_s") else None)


def plan_settings(echo: dict, model: str | None, slo: str | None, engine: str | None) -> tuple[str, str, str]:
    """Model, SLO profile and engine profile, by one rule for every command that reads a
    plan: the option given on the command line, else the plan's own (its `inputs`), else the
    default."""
    return (model or echo.get("model") or DEFAULT_MODEL, slo or echo.get("slo") or DEFAULT_SLO,
            engine or echo.get("engine") or DEFAULT_ENGINE)


class ReplaySettings(NamedTuple):
    """A run's model, SLO, engine (with its precisions), scheduler and prefix-cache settings, each
    the option given, else the plan's (its `inputs`), else the default (`replay_settings`)."""

    model: str
    slo: str
    engine: str
    max_batch_tokens: int
    max_num_seqs: int | None
    prefix_caching: bool | None
    routing: str
    kv_offload_gb: float


def replay_settings(echo: dict, model: str | None = None, slo: str | None = None, engine: str | None = None,
                    weights: str | None = None, kv: str | None = None, max_batch_tokens: int | None = None,
                    max_num_seqs: int | None = None, prefix_caching: bool | None = None, routing: str | None = None,
                    kv_offload_gb: float | None = None) -> ReplaySettings:
    """The settings of a run re-checking a plan (`echo`: its inputs; {} for inline pools), in the
    order they depend on each other: model, SLO and engine (plan_settings), the engine's weight and
    KV precisions (specs.engine.engine_spec), its scheduler (scheduler_settings, checked against
    that engine) and prefix caches (cache_settings)."""
    from splitplan.specs.engine import engine_spec
    model, slo, engine = plan_settings(echo, model, slo, engine)
    engine = engine_spec(engine, weights, kv)
    budget, cap = scheduler_settings(engine, max_batch_tokens, max_num_seqs, echo)
    return ReplaySettings(model, slo, engine, budget, cap, *cache_settings(echo, prefix_caching, routing, kv_offload_gb))


def simulate_plan(plan: str | os.PathLike, trace=None, rate: float | None = None, duration_s: float | None = None,
                  seed: int | None = None, model: str | None = None, slo: str | None = None, engine: str | None = None,
                  max_requests: int = 100_000, max_batch_tokens: int | None = None, max_num_seqs: int | None = None,
                  prefix_caching: bool | None = None, routing: str | None = None, kv_offload_gb: float | None = None,
                  weights: str | None = None, kv: str | None = None, **options) -> SimulateResult:
    """A plan.json simulated as `splitplan simulate --plan` simulates it: its pools, with its own
    specs (the catalog is as it was afterwards), on its own workload (`PlanWorkload`: its trace,
    rate, window or peak stretch, headroom) and its model, SLO, engine (`weights`, `kv`: its
    precisions), scheduler and prefix-cache settings (replay_settings), each unless given here;
    `options` as `simulate_pools` takes them (perf_db, concurrency, ...). The plan's notes (a
    catalog entry that changed since it was made) are InputWarnings."""
    import warnings

    from splitplan.base.errors import InputWarning
    from splitplan.io import plan_document
    from splitplan.workflows.simulation import simulate_pools
    document = plan_document.read(Path(plan), "plan")
    with document.catalog.active():  # (the plan's specs while it is simulated)
        for note in document.notes:
            warnings.warn(note, InputWarning, stacklevel=2)
        echo = document.inputs
        s = replay_settings(echo, model, slo, engine, weights, kv, max_batch_tokens, max_num_seqs, prefix_caching, routing,
                            kv_offload_gb)
        workload, _ = plan_workload(echo, trace, None, rate, duration_s, seed).load(max_requests)
        return simulate_pools(workload, document.pools, s.model, s.slo, s.engine, max_batch_tokens=s.max_batch_tokens,
                              routing=s.routing, max_num_seqs=s.max_num_seqs, prefix_caching=s.prefix_caching,
                              kv_offload_gb=s.kv_offload_gb, **options)
