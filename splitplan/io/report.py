"""Rendering: rich tables and deterministic JSON. The only module (with the CLI)
that writes to the console or to files."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from splitplan.base.defaults import SCHEMA_VERSION  # noqa: E402,F401 - (one version for every document)
from splitplan.base.errors import SpecError
from splitplan.base.inputs import printable
from splitplan.search.documents import (  # noqa: F401 - (the plans' forms, where the reports read them)
    optimize_json,
    plan_json,
    plan_text,
    plans_csv,
    pool_text,
    pools_json,
    pools_text,
)


def clean(value: Any, digits: int = 6) -> Any:
    """JSON-safe and stable: floats rounded to `digits` significant digits, NaN -> null."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {str(k): clean(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v, digits) for v in value]
    if hasattr(value, "item"):  # numpy scalars
        return clean(value.item(), digits)
    return value


def to_json(value: Any) -> str:
    return json.dumps(clean(value), indent=2, sort_keys=True) + "\n"


def write_set(files: dict[Path, str | bytes], executable: frozenset[str] = frozenset()) -> None:
    """Write one run's output files as a set: each goes to a temporary file beside it, and all
    are renamed into place only once every one was written, with their folders locked (flock)
    so that two runs into one folder cannot mix their files. A failure leaves the files that
    were there as they were, and no temporary file. A path that cannot be written (a folder in
    the way, a file where a folder should be, no permission, a full disk) is bad input. Files
    whose name is in `executable` get the execute bits (as the umask allows)."""
    files = {Path(path): content for path, content in files.items()}
    temps: dict[Path, str] = {}
    with contextlib.ExitStack() as locks:
        try:
            for folder in sorted({path.parent for path in files}):
                folder.mkdir(parents=True, exist_ok=True)
                locks.enter_context(_locked(folder))
            for path, content in files.items():
                if path.is_dir():
                    raise IsADirectoryError(errno.EISDIR, "a folder is in the way", str(path))
                temps[path] = _write_temp(path, content, path.name in executable)
            for path, tmp in temps.items():
                os.replace(tmp, path)
        except OSError as exc:
            where = exc.filename or next(iter(files))
            raise SpecError(f"{where}: cannot write ({exc.strerror or exc}); choose another output path") from None
        finally:
            for tmp in temps.values():
                Path(tmp).unlink(missing_ok=True)


@contextlib.contextmanager
def _locked(folder: Path):
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_temp(path: Path, content: str | bytes, executable: bool = False) -> str:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content.encode("utf-8") if isinstance(content, str) else content)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, (0o777 if executable else 0o666) & ~umask)  # as open() would create it (mkstemp: owner-only)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def table(title: str, columns: list[str], rows: Iterable[Iterable[Any]], caption: str | None = None) -> Table:
    """A table: numbers right-aligned (never wrapped), text left-aligned and wrapped when the
    console is narrower than the table (see `console`)."""
    table_rows = [list(row) for row in rows]
    formats = [_column_format([r[i] for r in table_rows], money="$" in col) for i, col in enumerate(columns)]
    cells = [[f(v) for f, v in zip(formats, row, strict=True)] for row in table_rows]
    t = _Table()
    t.heading, t.footnote = title, caption or ""
    for i, col in enumerate(columns):
        _add_column(t, col, [r[i] for r in cells], numeric_ok=i > 0)
    for row in cells:  # as plain text: a name holding `[red]` or a terminal escape shows as written
        t.add_row(*(Text(printable(c)) for c in row))
    return t


def _add_column(t: Table, col: str, values: list[str], numeric_ok: bool) -> None:
    """A column of `table`: right-aligned when every value is a number (never the first column),
    wrapped only when it holds long text."""
    numeric = numeric_ok and all(_NUMBER.match(v) for v in values)
    prose = not numeric and any(len(v) > 24 for v in values)  # only long text wraps; names and numbers never
    whole = max([len(v) for v in values] + [len(line) for line in col.split("\n")], default=1)
    t.add_column(col, justify="right" if numeric else "left", no_wrap=not prose, min_width=min(whole, 16) if prose else whole)


class _Table(Table):
    """A table whose title (`heading`, above it) and caption (`footnote`, below it) are printed
    at the console's width (at most WIDTH, even with --wide), not the table's, and broken only
    between clauses (after `; ` or `, `): a figure and its unit ("4 per GPU") are never split
    across lines."""

    heading = footnote = ""

    def __rich_console__(self, console, options):
        width = min(options.max_width, WIDTH)
        if self.heading:
            yield Text("\n".join(_clause_lines(self.heading, width)), style="italic")
        yield from super().__rich_console__(console, options)
        if self.footnote:
            yield Text("\n".join(_clause_lines(self.footnote, width)))


def _clause_lines(text: str, width: int) -> list[str]:
    """`text`'s paragraphs in lines of at most `width`, broken after a clause's `; ` or `, `
    (within a clause only when the clause alone is longer than a line: prose, at a space)."""
    import textwrap
    lines = []
    for paragraph in text.split("\n"):
        line = ""
        for clause in re.split(r"(?<=[;,]) ", paragraph):
            if line and len(line) + 1 + len(clause) > width:
                lines.append(line)
                line = ""
            line = f"{line} {clause}" if line else clause
            if len(line) > width:
                *full, line = textwrap.wrap(line, width)
                lines += full
        lines.append(line)
    return lines


_NUMBER = re.compile(r"^(-|[+-]?[\d,]*\.?\d+(e[+-]?\d+)?%?)$")


def _column_format(values: list, money: bool = False) -> Callable[[Any], str]:
    """One number format per column (a quantity): whole numbers when every value is whole (money,
    a `$` column: cents), else two decimals when every value is at least 1, else as many decimals
    as give the smallest value three significant digits (`1.000`, `0.600`, `0.535`); where that
    takes more than 6 (a column of factors of several sizes, 4.263e-06 beside 0.75), each value
    with four significant digits; text as is."""
    floats = [v for v in values if isinstance(v, float) and math.isfinite(v)]
    if not floats or any(v is not None and not isinstance(v, (int, float)) for v in values):
        return fmt
    spec = _number_spec(floats, money)

    def one(value: Any) -> str:
        if isinstance(value, float) and math.isfinite(value):
            return "0" if value == 0 else format(value, spec)
        return fmt(value)
    return one


def _number_spec(floats: list[float], money: bool) -> str:
    """`_column_format`'s format of a column of finite floats."""
    smallest = min((abs(v) for v in floats if v), default=1.0)
    decimals = 2 - math.floor(math.log10(smallest))
    if money and smallest >= 0.01:
        return ",.2f"
    if all(v == int(v) for v in floats):
        return ",.0f"
    if smallest >= 1:
        return ",.2f"
    return ".4g" if decimals > 6 else f",.{decimals}f"


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:,.2f}"
        return f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


WIDTH = 120  # columns a table fits in a pipe or a file (text cells wrap); `--wide` lifts it
_WIDE = {"on": False}


def set_wide(wide: bool) -> None:
    _WIDE["on"] = wide


class _Console(Console):
    """A console that prints a table wider than itself at the table's own minimum width (the
    terminal wraps the lines) rather than cut a number or a name: only prose cells wrap."""

    def print(self, *objects, **kwargs):
        if "width" not in kwargs:
            need = max((_minimum_width(self, o) for o in objects if isinstance(o, Table)), default=0)
            if need > self.width:  # (print's own width may only narrow)
                width, self.width = self.width, need
                try:
                    return super().print(*objects, **kwargs)
                finally:
                    self.width = width
        super().print(*objects, **kwargs)


def _minimum_width(con: Console, t: Table) -> int:
    """The narrowest `t` prints without cutting a number or a name (measured unbounded: a
    measurement is clamped to the width it is given)."""
    from rich.measure import Measurement
    return Measurement.get(con, con.options.update_width(1 << 16), t).minimum


def narrowed(con: Console, title: str, columns: list[str], rows: list[tuple], optional: list[str]) -> Table:
    """`table`, leaving out as many of the `optional` columns (in that order) as it takes to fit
    the console's width, and saying which in its caption (a catalog on an 80-column terminal)."""
    t, left_out = table(title, columns, rows), []
    for name in optional:
        if _minimum_width(con, t) <= con.width:
            break
        k = columns.index(name)
        columns, rows = columns[:k] + columns[k + 1:], [row[:k] + row[k + 1:] for row in rows]
        left_out.append(name.replace("\n", " "))
        t = table(title, columns, rows, f"left out at this width: {', '.join(left_out)} (--wide, or --format json)")
    return t


def console() -> Console:
    """The terminal's width on a terminal (at most WIDTH unless --wide); WIDTH in a pipe or a
    file, or wide enough for every table unwrapped with --wide. A table that cannot be narrowed
    to it without cutting a number or a name is printed wider (`_Console`)."""
    probe = Console()
    if _WIDE["on"]:
        return _Console(width=max(probe.width, 400)) if not probe.is_terminal else _Console()
    return _Console(width=min(probe.width, WIDTH)) if probe.is_terminal else _Console(width=WIDTH)


# --- plans (their JSON and CSV forms: search.documents) ------------------------------

def pools_detail(pools) -> str:
    """Pools as pools_text gives them, each with what it buys: `2x h100-80gb TP 8 (2 instances,
    1 spare, 16 GPUs, 64 % busy, 37 % of its prompt tokens cached)` (spare: instances beyond what
    the load needs, where some are; busy: the predicted utilization, where there is one; cached:
    the share of the pool's own prompt tokens its prefix caches held, with prefix caching: of its
    requests, so a pool routed the most reused ones may pass the trace's never-evicting bound,
    which is of every prompt token)."""
    def one(p) -> str:
        busy = "" if p.utilization is None else f", {p.utilization:.0%} busy"
        busy += "" if p.prefix_hit_rate is None else f", {p.prefix_hit_rate:.0%} of its prompt tokens cached"
        spare = f", {p.spare_instances:,} spare" if p.spare_instances else ""
        return f"{pool_text(p)} ({p.instances:,} instance{'s' * (p.instances != 1)}{spare}, {p.gpus:,} GPUs{busy})"
    return " + ".join(one(p) for p in pools) or "-"


def significant(value: float, digits: int = 3) -> str:
    """A figure to `digits` significant digits, never in exponent form: 0.0183, 14.4, 1,004."""
    if not math.isfinite(value) or value == 0:
        return fmt(value)
    return f"{value:,.{max(digits - 1 - math.floor(math.log10(abs(value))), 0)}f}"


def per_million_text(plan) -> str:
    """`$1.23 per million tokens ($4.56 per million output tokens)`, or '' without a rate."""
    if plan.cost_usd_per_million_tokens is None:
        return ""
    return (f"${significant(plan.cost_usd_per_million_tokens)} per million tokens "
            f"(${significant(plan.cost_usd_per_million_output_tokens)} per million output tokens)")


def energy_text(plan) -> str:
    """`0.28 kWh per million tokens (14.4 per million output tokens)`, or '' without a figure."""
    if plan.energy_kwh_per_million_tokens is None:
        return ""
    return (f"{significant(plan.energy_kwh_per_million_tokens)} kWh per million tokens "
            f"({significant(plan.energy_kwh_per_million_output_tokens)} per million output tokens)")


def power_text(sources: list[dict]) -> str:
    """Each machine's GPU watts by phase and their source, for captions."""
    def one(x: dict) -> str:
        assumed = "" if x["decode_w_from"].startswith("the catalog") else f"; decode {x['decode_w_from']}"
        return (f"{x['hardware']} {x['prefill_w']:.0f}/{x['decode_w']:.0f}/{x['idle_w']:.0f} W prefill/decode/idle "
                f"({x['source']}, {x['source_date']}{assumed})")
    return "; ".join(one(x) for x in sources)


def timing_text(sources: list[dict]) -> str:
    """What timed each machine type and layout's operators, grouped by source, for captions."""
    def one(x: dict) -> str:
        by_source: dict[str, list[str]] = {}
        for operator, source in x["operators"].items():
            by_source.setdefault(source, []).append(operator)
        return f"{x['hardware']} {x['layout']}: " + "; ".join(f"{s} ({', '.join(ops)})" for s, ops in by_source.items())
    return " | ".join(one(x) for x in sources)


def file_names(source: str) -> str:
    """A trace's description (its path, then what was done to it in parentheses) with the path
    cut to the file's name: a title names the file, and an absolute path runs off a figure. The
    path ends at the first " (" after which no "/" stands outside parentheses."""
    from pathlib import PurePath
    at = source.find(" (")
    while at != -1:
        depth, outside = 0, False
        for ch in source[at + 1:]:
            depth += (ch == "(") - (ch == ")")
            outside = outside or (ch == "/" and depth == 0)
        if not outside:
            break
        at = source.find(" (", at + 1)
    path, rest = (source, "") if at == -1 else (source[:at], source[at:])
    return PurePath(path).name + rest


def slo_rows(lines) -> list[tuple]:
    """Table rows of a simulated SLO report (SloLineResult): line, target and achieved with their
    unit, attainment, met."""
    return [(x.line, x.slo_line.target, x.slo_line.text(x.achieved), x.attainment_pct, "yes" if x.met else "NO") for x in lines]


def candidates_csv(result) -> str:
    import csv
    import io
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["kind", "role", "hardware", "tp", "layout", "instances", "machines", "cost_usd_per_hour", "power_kw", "binding",
                "skipped_reason", "plan", "sized_by", "gpus"])
    for o in result.options:
        machines = o.machines_alone if o.instances else ""
        sized_by = "" if not o.instances else "simulation" if o.simulated else "estimate" if o.role == "mixed" else "model"
        if o.role == "shared":  # a machine of prompt and token instances (their sizes are the options' rows)
            layout, tp, sized_by = (f"{o.prompt_instances}x{o.prompt.inst.layout.spec}+{o.token_instances}x"
                                    f"{o.token.inst.layout.spec}"), "", "options"
        else:
            layout, tp = o.inst.layout.spec, o.inst.tp
        w.writerow(["option", o.role, o.inst.hardware.name, tp, layout, o.instances or "", machines,
                    f"{o.price_usd_per_hour * machines:.4f}" if machines else "", f"{o.power_kw * machines:.4f}" if machines else "",
                    o.binding, o.skipped, "", sized_by, machines * o.inst.hardware.gpus_per_machine if machines else ""])
    for p in (result.plan, *result.alternatives):
        w.writerow(["plan", "", "", "", "", sum(x.instances for x in p.pools), p.machines, f"{p.cost_usd_per_hour:.4f}",
                    f"{p.power_kw:.4f}", p.binding, "", plan_text(p), "", p.gpus])
    return out.getvalue()
