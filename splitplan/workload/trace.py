"""Request traces: one `Trace` type, loaders per format, Poisson resampling, summary.

Formats are detected from the header (gzip by its magic bytes):
- Azure LLM inference 2023 CSV: `TIMESTAMP,ContextTokens,GeneratedTokens` (wall clock)
- splitwise-sim CSV: `arrival_timestamp,prompt_size,token_size` (seconds)
- Mooncake JSONL: `{"timestamp": ms, "input_length", "output_length", ...}`
- generic CSV: any header, with the three column names given (`Columns`)

Every row must have a finite arrival, prompt tokens >= 1 and output tokens >= 1,
and arrivals must not decrease (equal arrivals are fine: bursts). Errors name the
file and the line (1-based, header = line 1).
"""

from __future__ import annotations

import gzip
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from splitplan.errors import TraceError
from splitplan.specs.catalog import data_dir


@dataclass(frozen=True)
class Trace:
    """Requests sorted by arrival; arrival_s starts at 0."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def span_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def mean_rate_rps(self) -> float:
        return len(self) / self.span_s if self.span_s > 0 else float("inf")


@dataclass(frozen=True)
class Columns:
    """Column names of a generic CSV, and the unit of its time column."""

    time: str = "arrival_s"
    prompt: str = "prompt_tokens"
    output: str = "output_tokens"
    time_unit_s: float = 1.0


AZURE = Columns("TIMESTAMP", "ContextTokens", "GeneratedTokens")
SPLITWISE = Columns("arrival_timestamp", "prompt_size", "token_size")
MOONCAKE = Columns("timestamp", "input_length", "output_length", 1e-3)
DEFAULT_TRACE = "azure_code_2023.csv"


def default_trace_path() -> Path:
    """The embedded Azure code trace (CC-BY-4.0, see NOTICE)."""
    return data_dir("traces") / DEFAULT_TRACE


def _read_bytes(path: Path) -> bytes:
    if not path.exists():
        raise TraceError(f"{path}: no such file; pass a trace CSV, JSONL or .gz")
    if path.is_dir():
        raise TraceError(f"{path}: is a directory; pass a trace file")
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise TraceError(f"{path}: corrupt gzip ({exc}); re-compress or pass the plain file") from None
    if not data.strip():
        raise TraceError(f"{path}: empty file; a trace needs a header and at least one request")
    if b"\x00" in data[:4096]:
        raise TraceError(f"{path}: binary data, not a CSV or JSONL trace")
    return data


def _frame(path: Path, data: bytes, columns: Columns | None) -> tuple[pd.DataFrame, Columns, bool]:
    """Raw frame, its column mapping, and whether the time column is wall-clock text."""
    text_start = data.lstrip()[:1]
    if text_start in (b"{", b"["):
        try:
            frame = pd.read_json(io.BytesIO(data), lines=text_start == b"{", dtype=False)
        except ValueError as exc:
            raise TraceError(f"{path}: not valid JSON lines ({str(exc).splitlines()[0]})") from None
        return frame, columns or MOONCAKE, False
    try:
        frame = pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False, skipinitialspace=True)
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None
    if columns is None:
        header = set(frame.columns)
        for known in (AZURE, SPLITWISE):
            if {known.time, known.prompt, known.output} <= header:
                return frame, known, known is AZURE
        columns = Columns()
    return frame, columns, False


def _numeric(path: Path, frame: pd.DataFrame, name: str) -> np.ndarray:
    values = pd.to_numeric(frame[name], errors="coerce").to_numpy(float)
    bad = ~np.isfinite(values)
    if bad.any():
        row = int(np.argmax(bad))
        raise TraceError(f"{path}: line {row + 2}: column {name} has '{frame[name].iloc[row]}', not a number; fix or remove the row")
    return values


def load_trace(path: str | Path, columns: Columns | None = None) -> Trace:
    """Read a trace file; `columns` forces the generic CSV reader with those names."""
    path = Path(path)
    data = _read_bytes(path)
    frame, cols, wall_clock = _frame(path, data, columns)
    missing = [c for c in (cols.time, cols.prompt, cols.output) if c not in frame.columns]
    if missing:
        found = ", ".join(map(str, frame.columns[:8]))
        raise TraceError(
            f"{path}: missing column(s) {', '.join(missing)} (found: {found}); expected an Azure, splitwise-sim "
            "or Mooncake trace, or name the columns with --time-column/--prompt-column/--output-column"
        )
    if len(frame) == 0:
        raise TraceError(f"{path}: header only, no requests")
    if wall_clock:
        stamps = pd.to_datetime(frame[cols.time], format="ISO8601", errors="coerce")
        bad = stamps.isna().to_numpy()
        if bad.any():
            row = int(np.argmax(bad))
            raise TraceError(f"{path}: line {row + 2}: TIMESTAMP '{frame[cols.time].iloc[row]}' is not a date-time")
        arrival = (stamps - stamps.iloc[0]).dt.total_seconds().to_numpy(float)
    else:
        arrival = _numeric(path, frame, cols.time) * cols.time_unit_s
    prompt = _numeric(path, frame, cols.prompt)
    output = _numeric(path, frame, cols.output)
    for name, values in ((cols.prompt, prompt), (cols.output, output)):
        bad = (values < 1) | (values != np.floor(values))
        if bad.any():
            row = int(np.argmax(bad))
            raise TraceError(f"{path}: line {row + 2}: column {name} is {values[row]:g}; token counts must be whole numbers >= 1")
    back = np.diff(arrival) < 0
    if back.any():
        row = int(np.argmax(back)) + 1
        raise TraceError(f"{path}: line {row + 2}: arrival goes back in time ({arrival[row]:g} s after {arrival[row - 1]:g} s); sort the trace by time")
    arrival = arrival - arrival[0]
    return Trace(arrival, prompt.astype(np.int64), output.astype(np.int64), str(path))


def resample_poisson(trace: Trace, rate_rps: float, duration_s: float, rng: np.random.Generator) -> Trace:
    """Splitwise's method: Poisson arrivals at `rate_rps` for `duration_s`, with
    (prompt, output) pairs drawn i.i.d. (with replacement) from `trace`."""
    if rate_rps <= 0 or duration_s <= 0:
        raise TraceError(f"rate ({rate_rps}) and duration ({duration_s}) must be > 0")
    expected = rate_rps * duration_s
    gaps = rng.exponential(1.0 / rate_rps, size=int(expected + 10 * np.sqrt(expected) + 10))
    arrival = np.cumsum(gaps) - gaps[0]
    arrival = arrival[arrival < duration_s]
    pick = rng.integers(0, len(trace), size=len(arrival))
    source = f"{trace.source} (Poisson {rate_rps:g} req/s, {duration_s:g} s)"
    return Trace(arrival, trace.prompt_tokens[pick], trace.output_tokens[pick], source)


def summarize(trace: Trace) -> dict:
    """Rows, span, rates, burstiness and token percentiles, as plain numbers."""
    gaps = np.diff(trace.arrival_s)
    cv = float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else 0.0
    per_minute = np.bincount((trace.arrival_s // 60).astype(np.int64))
    def pct(values):
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(values.mean()), "max": int(values.max())}
    return {
        "source": trace.source,
        "requests": len(trace),
        "span_s": trace.span_s,
        "mean_rate_rps": trace.mean_rate_rps if trace.span_s > 0 else None,
        "peak_minute_rate_rps": float(per_minute.max() / 60),
        "interarrival_cv": cv,
        "prompt_tokens": pct(trace.prompt_tokens),
        "output_tokens": pct(trace.output_tokens),
    }
