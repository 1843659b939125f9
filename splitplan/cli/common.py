"""Shared by the commands: the typer app, option enums, error handling, progress, parsing of\ncommon option values."""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import math
import os
import re
import sys
import warnings
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import typer

from splitplan.base import limits
from splitplan.base.errors import InputWarning, SpecError, SplitplanError
from splitplan.base.inputs import excerpt, printable
from splitplan.io import report
from splitplan.specs import catalog
from splitplan.specs.engine import engine_spec
from splitplan.specs.layout import Layout, parse_layout
from splitplan.specs.roles import Pool, Role


class _OnFirstUse:
    """A module imported when a command first uses one of its names, so `splitplan --help`
    and small commands start without pandas, SciPy and PuLP."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        import importlib
        return getattr(importlib.import_module(self._name), attr)


api = _OnFirstUse("splitplan.api")

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Provision phase-split (disaggregated) LLM serving clusters.")


hardware_app = typer.Typer(no_args_is_help=True, help="The hardware catalog.")


models_app = typer.Typer(no_args_is_help=True, help="The model catalog.")


trace_app = typer.Typer(no_args_is_help=True, help="Request traces.")


app.add_typer(hardware_app, name="hardware")


app.add_typer(models_app, name="models")


app.add_typer(trace_app, name="trace")


class Format(StrEnum):
    table = "table"
    json = "json"


class PlanFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


class Objective(StrEnum):
    cost = "cost"
    power = "power"
    throughput = "throughput"


class Search(StrEnum):
    ilp = "ilp"
    grid = "grid"


class Executor(StrEnum):
    local = "local"
    ray = "ray"


class Weights(StrEnum):  # (specs.engine.WEIGHT_PRECISIONS: a test keeps them the same)
    bf16 = "bf16"
    fp8 = "fp8"
    fp4 = "fp4"


class KvCache(StrEnum):  # (specs.engine.KV_PRECISIONS)
    bf16 = "bf16"
    fp8 = "fp8"


EXECUTOR_HELP = "Where work units run: local (forked processes, --jobs) or ray (--ray-address, or a local Ray instance)."


RAY_HELP = "Ray cluster: auto (the running one) or ray://HOST:10001; without it a local instance is started and stopped."


_DEBUG = {"on": False}
_CATALOG: dict[str, catalog.Catalog | None] = {"in effect": None}  # --catalog's, for the command the root callback precedes


def _print_version(value: bool) -> None:
    if value:
        from splitplan import __version__
        typer.echo(f"splitplan {__version__}")
        raise typer.Exit()


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
          version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print the version and exit."),
          catalog: list[str] = typer.Option([], "--catalog", help="A folder of your own catalog entries "
                                            "(hardware_specs/, model_specs/, engine_profiles/, slo_profiles/, designs/), "
                                            "searched before SPLITPLAN_PATH's and the shipped ones (repeatable)."),
          wide: bool = typer.Option(False, "--wide",
              help="Tables at full width (default: at most 120 columns, text cells wrapped).")) -> None:
    _DEBUG["on"] = debug
    report.set_wide(wide)
    from splitplan.specs.catalog import Catalog
    try:
        _CATALOG["in effect"] = Catalog.of(catalog)  # (checked here: exit 2 before any command)
    except SplitplanError as exc:
        echo_error(str(exc))
        raise typer.Exit(exc.exit_code) from None


class Bound(NamedTuple):
    low: float
    high: float
    unit: str = ""
    low_open: bool = False  # the value must exceed `low`


# Every numeric option's range, checked before a command runs; NaN and infinities never pass.
OPTION_BOUNDS = {
    "--rate": Bound(0, limits.MAX_RATE_RPS, "requests per second", True),
    "--duration": Bound(0, limits.MAX_DURATION_S, "seconds", True),
    "--seed": Bound(0, 2 ** 63 - 1),
    "--max-cost-per-hour": Bound(0, 1e9, "USD per hour", True),
    "--max-power-kw": Bound(0, 1e7, "kW", True),
    "--jobs": Bound(0, limits.MAX_JOBS, "processes"),
    "--concurrency": Bound(1, limits.MAX_CONCURRENCY, "clients"),
    "--isl": Bound(1, limits.MAX_REQUEST_TOKENS, "tokens"),
    "--osl": Bound(1, limits.MAX_REQUEST_TOKENS, "tokens"),
    "--num-requests": Bound(1, limits.MAX_CLOSED_LOOP_REQUESTS, "requests"),
    "--max-num-batched-tokens": Bound(16, limits.MAX_REQUEST_TOKENS, "tokens"),
    "--max-num-seqs": Bound(1, 1_000_000, "requests"),
    "--max-prefill-batch-tokens": Bound(1, limits.MAX_REQUEST_TOKENS, "tokens"),
    "--max-requests": Bound(1, limits.MAX_TRACE_REQUESTS, "requests"),
    "--mixed-pool-threshold": Bound(0, limits.MAX_REQUEST_TOKENS, "tokens"),
    "--tp": Bound(1, 1024, "GPUs"),
    "--folds": Bound(0, 1000, "folds (0: no cross-validation)"),
    "--shared-prefix-tokens": Bound(1, limits.MAX_REQUEST_TOKENS, "tokens"),
    "--prefix-groups": Bound(1, limits.MAX_TRACE_REQUESTS, "prefixes"),
    "--kv-offload-gb": Bound(0, 1e6, "GB of host memory per instance"),
    "--headroom": Bound(0, limits.MAX_HEADROOM_PCT, "percent of the trace's load"),
    "--spare": Bound(0, limits.MAX_SPARE_INSTANCES, "instances per pool"),
    "--confidence": Bound(0.5, 0.99, "(a quantile of the engine profile's measured error, e.g. 0.9)"),
}


# Where one command takes less than OPTION_BOUNDS: optimize plans a closed loop round by round
# (a plan and a simulation of the loop each), so more clients or requests run past a minute
# (bench/adversarial.py: 512 clients of the code trace's sizes take about 20 s); simulate runs
# one loop of up to MAX_CONCURRENCY clients.
COMMAND_BOUNDS = {
    "optimize": {"--concurrency": Bound(1, 512, "clients (larger loops: splitplan simulate --concurrency)"),
                 "--num-requests": Bound(1, 10_000, "requests (larger loops: splitplan simulate --concurrency)")},
}


def check_bounds(command: Callable, values: dict) -> None:
    """Each numeric option of `command` in `values` within its bound (COMMAND_BOUNDS, else
    OPTION_BOUNDS), and finite."""
    own = COMMAND_BOUNDS.get(command.__name__, {})
    for name, parameter in inspect.signature(command).parameters.items():
        value, flags = values.get(name), getattr(parameter.default, "param_decls", None) or ()
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not flags:
            continue
        if not math.isfinite(value):
            raise SpecError(f"{flags[0]} {value}: must be a finite number")
        bound = own.get(flags[0]) or OPTION_BOUNDS.get(flags[0])
        if bound is None:
            continue
        if not ((value > bound.low if bound.low_open else value >= bound.low) and value <= bound.high):
            low = f"> {_number(bound.low)}" if bound.low_open else f">= {_number(bound.low)}"
            raise SpecError(f"{flags[0]} {_number(value)}: must be {low} and <= {_number(bound.high)}"
                            + (f" {bound.unit}" if bound.unit else ""))


def _number(value: float) -> str:
    """A bound or value in a message: whole numbers with thousands separators (20,000,000, not 2e+07)."""
    return f"{int(value):,}" if float(value).is_integer() and abs(value) < 1e18 else f"{value:g}"


def user_errors(command: Callable) -> Callable:
    """Check the numeric options' bounds, then map SplitplanError to one `error: ...` line on
    stderr and its exit code (a failed write to stdout too: `error: cannot write output: ...`),
    and Ctrl-C to `error: interrupted` and exit code 130. The command runs with --catalog's folders
    in effect (catalog.Catalog.of); a plan.json it reads (`read_plan`) puts the plan's specs in
    effect for the rest of the command, not after it (a command run in a process, as tests and
    scripts do)."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        real = sys.stdout
        sys.stdout = _GuardedOutput(real)
        try:
            check_bounds(command, kwargs)
            with warnings.catch_warnings(), (_CATALOG["in effect"] or catalog.Catalog.of()).active():
                warnings.simplefilter("always", InputWarning)
                warnings.showwarning = _warn_line  # (restored on leaving: the library's warnings as one line each)
                result = command(*args, **kwargs)
            sys.stdout.flush()
            return result
        except SplitplanError as exc:
            if _DEBUG["on"]:
                for line in (getattr(exc, "details", None) or "").splitlines():
                    typer.echo(printable(line), err=True)
                raise
            if isinstance(exc, OutputError):
                _silence(real)
            echo_error(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:  # (typer would turn it into a silent exit 130)
            echo_error("interrupted")
            raise typer.Exit(130) from None
        finally:
            sys.stdout = real

    return wrapper


def _warn_line(message, category, filename, lineno, file=None, line=None) -> None:
    """An input warning (base.errors.InputWarning) as one `warning: ...` line on stderr; others as Python shows them."""
    if issubclass(category, InputWarning):
        typer.echo(f"warning: {printable(str(message))}", err=True)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def echo_error(message: str) -> None:
    """The one stderr line of a failed command: `error: ...`, on one line, control characters
    escaped (a name or a path from the user's input never reaches the terminal raw)."""
    typer.echo(f"error: {printable(' '.join(message.split()))}", err=True)


class OutputError(SpecError):
    """Standard output cannot be written (a full device, an I/O error)."""


class _GuardedOutput:
    """Standard output whose failed writes are `OutputError`, not a traceback at exit (a closed
    pipe, `splitplan ... | head`, is left to click: a quiet exit 1)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(f"cannot write output: {exc.strerror or exc}") from None

    def flush(self):
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(f"cannot write output: {exc.strerror or exc}") from None

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _silence(stream) -> None:
    """Point the standard output that failed at /dev/null, so what is still buffered in it is
    not written (and failed) again when the interpreter exits."""
    import os
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


def _emit_json(value) -> None:
    sys.stdout.write(report.to_json(value))


@contextlib.contextmanager
def _progress(title: str, total: int | None = None):
    """On a terminal, a rich progress bar on stderr counting `total` finished units
    (or a status line when the count is unknown); elsewhere (a log, CI), one line on
    stderr at most every PROGRESS_EVERY_S seconds while work lasts longer than that. Yields
    `step(message=None)`, to call as each unit finishes."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )
    err = Console(stderr=True)
    if not err.is_terminal:
        yield _periodic(title, total)
        return
    if total is None:
        with err.status(title) as status:
            yield lambda message=None: status.update(f"{title}: {message}" if message else title)
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(title, total=total)
        yield lambda message=None: bar.advance(task)


PROGRESS_EVERY_S = 10.0


def _periodic(title: str, total: int | None):
    """step(message=None) for a log: counts finished units and prints `title: 3/8 done, 25 s`
    when PROGRESS_EVERY_S seconds have passed since the start or the last line."""
    import time
    start = last = time.monotonic()
    done = 0

    def step(message=None):
        nonlocal last, done
        done += 1
        now = time.monotonic()
        if now - last >= PROGRESS_EVERY_S:
            last = now
            count = f"{done}/{total}" if total is not None else f"{done}"
            print(f"{title}: {count} done, {now - start:.0f} s" + (f" ({message})" if message else ""), file=sys.stderr, flush=True)
    return step


def _names(text: str | None, option: str) -> list[str] | None:
    """A comma-separated list of names, in order, each once; None when the option is not given.
    Given but empty (`--hardware ''`) is an error, not "everything"."""
    if text is None:
        return None
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise SpecError(f"{option} '{excerpt(text)}': name at least one, e.g. {option} h100-80gb (leave it out for all)")
    return names


def _limits(items: list[str], option: str = "--max-machines") -> dict[str, int]:
    out = {}
    for item in items:
        name, _, count = item.partition("=")
        if not name or not count.isdigit() or int(count) > limits.MAX_MACHINES:
            raise SpecError(f"{option} '{excerpt(item)}': expected TYPE=N with N from 0 to {limits.MAX_MACHINES:,}, "
                            "e.g. h100-80gb=40")
        out[name.strip()] = int(count)
    return out


def parse_duration(text: str, flag: str = "--window", zero: bool = False) -> float:
    """`90`, `90s`, `10m`, `1.5h` -> seconds (more than 0; `zero`: 0 too)."""
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$", text)
    if not match or float(match.group(1)) < 0 or (float(match.group(1)) == 0 and not zero):
        raise SpecError(f"{flag} '{text}': give a duration like 600, 600s, 10m or 1h")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SpecError("--plot needs matplotlib: pip install '.[plot]'") from None


def _plain_ticks(ax, which: str = "xy") -> None:
    """Tick labels as plain numbers: no offset and no scientific notation on linear axes,
    `10`, `100`, `1000` (not 10^k) on log axes."""
    from matplotlib.ticker import FuncFormatter, NullFormatter, ScalarFormatter
    for axis, scale in [(a, sc) for name, a, sc in (("x", ax.xaxis, ax.get_xscale()), ("y", ax.yaxis, ax.get_yscale()))
                        if name in which]:
        if scale == "log":
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        else:
            plain = ScalarFormatter(useOffset=False)
            plain.set_scientific(False)
            axis.set_major_formatter(plain)


def figure_png(fig) -> bytes:
    """The figure as PNG bytes, to write with the run's other files (`report.write_set`)."""
    import io

    import matplotlib.pyplot as plt
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


_POOL = re.compile(r"^([^:]+):([0-9a-zA-Z]+):(\d+)$")


def check_pool(where: str, layout: Layout, machines: int) -> None:
    """A pool's layout (each degree and the GPUs within --tp's bound) and machine count
    (`limits.MAX_MACHINES`) within bounds."""
    if not all(1 <= d <= OPTION_BOUNDS["--tp"].high for d in (*layout, layout.gpus)):
        raise SpecError(f"{where}: layout {layout.spec} must have 1 to {OPTION_BOUNDS['--tp'].high:g} GPUs")
    if not 1 <= machines <= limits.MAX_MACHINES:
        raise SpecError(f"{where}: {machines} machines; a pool has 1 to {limits.MAX_MACHINES:,}")


def parse_pool(text: str, role: str) -> Pool:
    match = _POOL.match(text.strip())
    where = f"--{role}-pool {excerpt(text)}"
    if not match:
        raise SpecError(f"--{role}-pool '{excerpt(text)}': expected HARDWARE:LAYOUT:MACHINES, e.g. h100-80gb:8:35 "
                        "(TP 8) or h200-141gb:dp16ep16:4")
    pool = Pool(Role(role), match.group(1), parse_layout(match.group(2), where), int(match.group(3)))
    check_pool(where, pool.layout, pool.machines)
    return pool


def read_plan(path: Path, option: str = "--plan") -> tuple[list[Pool], dict]:
    """Pools and inputs of a plan.json (plan_document.read: checked whole, its specs pinned);
    its notes (a catalog entry that changed since the plan was made) on stderr."""
    from splitplan.io import plan_document
    from splitplan.specs.catalog import activate
    plan = plan_document.read(path, option)
    activate(plan.catalog)  # (for the rest of the command: user_errors' catalog block ends it)
    for note in plan.notes:
        typer.echo(f"note: {printable(note)}", err=True)
    return plan.pools, plan.inputs


def plan_input(plan: Path | None, prompt_pool: list[str], token_pool: list[str],
               mixed_pool: list[str]) -> tuple[list[Pool], dict]:
    """The pools of `--plan plan.json` (with its input echo) or of the inline pool options."""
    pools = [parse_pool(x, "prompt") for x in prompt_pool] + [parse_pool(x, "token") for x in token_pool] \
        + [parse_pool(x, "mixed") for x in mixed_pool]
    if plan is None:
        return pools, {}
    if pools:
        raise SpecError("give --plan or inline pools (--prompt-pool/--token-pool/--mixed-pool), not both")
    return read_plan(plan)


# A closed loop's request sizes and length (optimize and simulate with --concurrency).
ISL = typer.Option(None, "--isl", help="With --concurrency: every request's input tokens (default: drawn from the trace).")
OSL = typer.Option(None, "--osl", help="With --concurrency: every request's output tokens (default: drawn from the trace).")
NUM_REQUESTS = typer.Option(None, "--num-requests", help="With --concurrency: requests in the run (default 10 per client, "
                            "at least 100).")

# The precision options of every command that takes --engine (one declaration, shared).
WEIGHTS = typer.Option(None, "--weights", help="Weight precision (default: the engine's): bf16, fp8, or fp4 (NVFP4; on GPUs "
                       "without fp4 tensor cores weight-only, GEMMs at bf16). Memory and GEMM speed follow.")
KV_CACHE = typer.Option(None, "--kv-cache", help="KV-cache precision (default: the engine's): bf16 or fp8.")
MAX_NUM_BATCHED_TOKENS = typer.Option(
    None, "--max-num-batched-tokens", "--max-batch-tokens",
    help="The scheduler's token budget per iteration, as vLLM's --max-num-batched-tokens: prompt tokens per "
         "prefill batch, or decodes and prompt chunks per chunked iteration (default: the engine profile's, else 2,048).")
MAX_NUM_SEQS = typer.Option(None, "--max-num-seqs", help="At most this many requests run on an instance at once, the rest "
                                                         "wait, as vLLM's --max-num-seqs (default: the engine profile's, else no cap).")


def with_precision(engine: str, weights: Weights | None, kv_cache: KvCache | None) -> str:
    """The engine profile with --weights and --kv-cache applied (`lean@weights=fp4`)."""
    return engine_spec(engine, *_precisions(weights, kv_cache))


def _precisions(weights: Weights | None, kv_cache: KvCache | None) -> tuple[str | None, str | None]:
    """--weights and --kv-cache as specs.engine.engine_spec takes them."""
    return weights.value if weights else None, kv_cache.value if kv_cache else None


# The trace-column options of every command that reads a trace (one declaration, shared).
TIME_COLUMN = typer.Option(None, "--time-column",
                           help="Trace CSV: the arrival time column (default: detected from common names such as arrival_time).")
PROMPT_COLUMN = typer.Option(None, "--prompt-column", help="Trace CSV: the prompt tokens column (default: detected, e.g. input_length).")
OUTPUT_COLUMN = typer.Option(None, "--output-column", help="Trace CSV: the output tokens column (default: detected, e.g. output_length).")
TIME_UNIT = typer.Option(None, "--time-unit",
                         help="Trace CSV: unit of the time column (s, ms, us, ns; default: the column name's suffix, _ms, _us or _ns, "
                              "else s).")


SHARED_PREFIX_TOKENS = typer.Option(None, "--shared-prefix-tokens", help="Give every prompt one of --prefix-groups shared "
                                    "prefixes of this many tokens (inference-perf's shared_prefix data; request i in group i mod K).")
PREFIX_GROUPS = typer.Option(None, "--prefix-groups", help="With --shared-prefix-tokens: how many distinct shared prefixes.")


PREFIX_CACHING = typer.Option(None, "--prefix-caching", help="on or off (default: the engine profile's; on for today's "
                              "engines): each instance keeps the prefixes the trace records (prefix_id, session_id, hash_ids, "
                              "--shared-prefix-tokens) in the KV memory its requests leave, least recently used evicted "
                              "first; a prefill skips what it holds, a KV transfer what its token instance holds.")
KV_OFFLOAD_GB = typer.Option(None, "--kv-offload-gb", help="With prefix caching: host memory (GB) per prefilling instance "
                             "that also keeps prefixes (written through, loaded back over its GPUs' host links at the "
                             "hardware spec's bandwidth), as vLLM's --kv-offloading-size (default 0: none).")


def shared_prefix(trace, shared_tokens: int | None, groups: int | None):
    """The trace with --shared-prefix-tokens N --prefix-groups K (both or neither)."""
    if shared_tokens is None and groups is None:
        return trace
    if shared_tokens is None or groups is None:
        raise SpecError("--shared-prefix-tokens and --prefix-groups go together: give both (e.g. --shared-prefix-tokens "
                        "100 --prefix-groups 9) or neither")
    from splitplan.workload.trace import with_shared_prefix
    return with_shared_prefix(trace, shared_tokens, groups)


def trace_columns(time_column: str | None, prompt_column: str | None, output_column: str | None,
                  time_unit: str | None):
    """The trace columns the user named (--time-column, --prompt-column, --output-column,
    --time-unit), or None to detect them."""
    from splitplan.workload.trace import Columns, time_unit_of
    if not (time_column or prompt_column or output_column or time_unit):
        return None
    default = Columns()
    time = time_column or default.time
    unit = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}.get(time_unit) if time_unit else time_unit_of(time)
    if unit is None:
        raise SpecError(f"--time-unit {excerpt(time_unit)}: choose s, ms, us or ns")
    return Columns(time, prompt_column or default.prompt, output_column or default.output, unit)


def parse_rates(text: str) -> list[float]:
    """`5,10,20` or `START:STOP:COUNT` (evenly spaced, both ends included); at most MAX_RATES
    rates, each in the bounds of --rate."""
    bound = OPTION_BOUNDS["--rate"]
    try:
        if ":" in text:
            start, stop, count = text.split(":")
            n = int(count)
            if not 1 <= n <= limits.MAX_RATES:
                raise ValueError
            rates = [float(x) for x in np.linspace(float(start), float(stop), n)]
        else:
            rates = [float(x) for x in text.split(",") if x.strip()]
        if not rates or len(rates) > limits.MAX_RATES or not all(bound.low < r <= bound.high for r in rates):
            raise ValueError
    except ValueError:
        raise SpecError(f"--rates '{excerpt(text)}': give 1 to {limits.MAX_RATES:,} rates, each > 0 and <= "
                        f"{bound.high:g} req/s, like 5,10,20 or START:STOP:COUNT like 5:80:16") from None
    return rates


def _exit_at_once(code: int) -> None:
    """Exit without the interpreter's exit hooks: concurrent.futures' would wake the manager thread
    of a process pool an interrupt just tore down, through a pipe already closed ("Exception
    ignored ... Bad file descriptor" after the one line; base.parallel ended the workers, and
    output sets are only renamed into place once whole)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    """The console script: like `app()`, but a usage error (a bad option value, an
    unknown option) is one `error: ...` line too, with exit code 2."""
    # typer ships click (or vendors it); its UsageError is a base of the public BadParameter.
    usage_error: Any = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")  # (its class: not public)
    # The modules imported so far are never garbage: frozen, collections skip them. A plan allocates
    # few reference cycles and many small containers (each NumPy call's): collecting every 20,000
    # allocations rather than 700 spends 0.06 s where 0.2 s went on the conversation trace's plan.
    gc.freeze()
    gc.set_threshold(20_000, 10, 10)
    try:
        code = app(standalone_mode=False)
    except usage_error as exc:
        message = " ".join(exc.format_message().split())
        if message:  # (no arguments at all: the help was shown, nothing to add)
            where = f"splitplan {exc.ctx.info_name} --help" if exc.ctx and exc.ctx.parent else "splitplan --help"
            echo_error(f"{message} (see {where})")
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("error: interrupted", err=True)
        _exit_at_once(130)
    if code == 130:  # a command's Ctrl-C, which user_errors told
        from splitplan.base import parallel

        if parallel.pool_torn_down():
            _exit_at_once(130)
    # The interpreter's exit would run full collections over every object the run left (the specs,
    # the trace, SciPy's modules; 0.3-0.4 s of a 2.5 s plan when numba's were among them, issue 31).
    # Frozen, they are freed by their reference counts alone; the exit hooks still run.
    gc.freeze()
    sys.exit(code or 0)
