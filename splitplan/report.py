"""Rendering: rich tables and deterministic JSON. The only module (with the CLI)
that writes to the console or to files."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

from rich.console import Console
from rich.table import Table

SCHEMA_VERSION = 1


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


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` via a temporary file and a rename: never a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def table(title: str, columns: list[str], rows: Iterable[Iterable[Any]], caption: str | None = None) -> Table:
    t = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*(fmt(v) for v in row))
    return t


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


def console() -> Console:
    """The terminal's width on a terminal; wide enough for every table in a pipe or a file."""
    probe = Console()
    return probe if probe.is_terminal else Console(width=200)
