"""Request traces: one `Trace` type, loaders per format, Poisson resampling, summary.

Formats are detected from the header (gzip by its magic bytes):
- Azure LLM inference 2023 CSV: `TIMESTAMP,ContextTokens,GeneratedTokens` (wall clock)
- splitwise-sim CSV: `arrival_timestamp,prompt_size,token_size` (seconds)
- Mooncake JSONL: `{"timestamp": ms, "input_length", "output_length", ...}`
- generic CSV: any header, with the three column names given (`Columns`)

Shared prefixes, where a trace records them (`workload.prefix`): a CSV's `prefix_id` and
`prefix_tokens` columns, its `session_id` (a conversation's turns), Mooncake's `hash_ids`.

Every row must have a finite arrival, prompt tokens >= 1 and output tokens >= 1,
and arrivals must not decrease (equal arrivals are fine: bursts). Errors name the
file and the line (1-based, header = line 1).
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import math
import re
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from splitplan.base.errors import InputWarning, SpecError, TraceError
from splitplan.base.inputs import csv_rows, excerpt, open_regular, reason
from splitplan.base.limits import (
    MAX_DURATION_S,
    MAX_GENERATED_REQUESTS,
    MAX_HEADROOM_PCT,
    MAX_RATE_RPS,
    MAX_REQUEST_TOKENS,
    MAX_TRACE_REQUESTS,
    MAX_TRACE_SPAN_S,
    TRACE_BLOCK_BYTES,
)
from splitplan.specs.catalog import data_dir
from splitplan.workload import prefix as prefixes
from splitplan.workload.prefix import PrefixTree

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Trace:
    """Requests sorted by arrival; arrival_s starts at 0. `cached_tokens`, where known (a replay
    of measured runs whose engine kept a prefix cache), is each request's leading prompt tokens
    that the engine's prefix cache holds when it arrives: the simulator prefills only the rest
    (their KV is still the request's). None: every prompt is computed whole."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str
    cached_tokens: np.ndarray | None = None
    prefix: PrefixTree | None = None  # shared prompt prefixes, where the trace records them (workload.prefix)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def span_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def mean_rate_rps(self) -> float:
        return len(self) / self.span_s if self.span_s > 0 else float("inf")

    def take(self, index, source: str | None = None) -> Trace:
        """The requests `index` picks (a mask, a slice or indices, in arrival order), every
        per-request field with them (cached tokens, prefixes), timed from the first one's arrival."""
        arrival = self.arrival_s[index]
        return Trace(arrival - arrival[0], self.prompt_tokens[index], self.output_tokens[index], source or self.source,
                     None if self.cached_tokens is None else self.cached_tokens[index], _take(self.prefix, index))

    def at_rate(self, rate_rps: float) -> Trace:
        """The same requests with the timestamps compressed (or stretched) to `rate_rps` on average."""
        return dataclasses.replace(self, arrival_s=self.arrival_s * (self.mean_rate_rps / rate_rps),
                                   source=f"{self.source} (timestamps scaled to {rate_rps:.3g} req/s)")


def with_headroom(trace: Trace, headroom_pct: float) -> Trace:
    """The same requests arriving (1 + headroom_pct / 100) times as fast: a load with that
    headroom over the trace's (0: the trace itself)."""
    if not 0 <= headroom_pct <= MAX_HEADROOM_PCT:
        raise SpecError(f"--headroom {headroom_pct:g}: must be from 0 to {MAX_HEADROOM_PCT:g} percent of the trace's load")
    if headroom_pct == 0:
        return trace
    factor = 1 + headroom_pct / 100
    return dataclasses.replace(trace, arrival_s=trace.arrival_s / factor,
                               source=f"{trace.source} (load x{factor:g}: {headroom_pct:g} % headroom)")


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
# Names a generic CSV's columns commonly have, each role's in order of preference; times are
# seconds unless the name says milliseconds, microseconds or nanoseconds (time_unit_of).
TIME_NAMES = ("arrival_s", "arrival_time", "arrival_time_s", "arrival_timestamp", "arrival", "timestamp", "time", "time_s",
              "arrival_ms", "arrival_time_ms", "timestamp_ms", "time_ms", "arrival_us", "timestamp_us")
PROMPT_NAMES = ("prompt_tokens", "input_tokens", "input_length", "prompt_length", "prompt_size", "prompt_len", "input_len",
                "num_prompt_tokens", "num_input_tokens", "isl", "context_tokens")
OUTPUT_NAMES = ("output_tokens", "output_length", "completion_tokens", "generated_tokens", "output_len", "token_size",
                "num_output_tokens", "num_completion_tokens", "osl", "response_tokens")


def detect_columns(header) -> Columns | None:
    """A generic CSV's columns from their names (case-insensitive; see TIME_NAMES, ...), or
    None when a role has no known name."""
    lower = {str(h).strip().lower(): str(h) for h in header}
    time, prompt, output = (next((lower[n] for n in names if n in lower), None) for names in (TIME_NAMES, PROMPT_NAMES, OUTPUT_NAMES))
    if time is None or prompt is None or output is None:
        return None
    return Columns(time, prompt, output, time_unit_of(time))


TIME_SUFFIXES = {"_ms": 1e-3, "_us": 1e-6, "_ns": 1e-9}


def time_unit_of(column: str) -> float:
    """Seconds per unit of a time column, by one rule for detected and named columns: its
    suffix (`_ms`, `_us`, `_ns`) sets the unit, else seconds."""
    name = str(column).strip().lower()
    return next((unit for suffix, unit in TIME_SUFFIXES.items() if name.endswith(suffix)), 1.0)


DEFAULT_TRACE = "azure_code_2023.csv"
# The traces shipped in the wheel (CC-BY-4.0, see NOTICE), by the short names --trace takes.
EMBEDDED = {"azure-code": DEFAULT_TRACE, "azure-conv": "azure_conv_2023.csv.gz"}
EMBEDDED_HELP = "azure-code (the default) or azure-conv, the embedded Azure 2023 code and conversation traces"


def default_trace_path() -> Path:
    """The embedded Azure code trace (CC-BY-4.0, see NOTICE)."""
    return data_dir("traces") / DEFAULT_TRACE


def embedded(trace) -> Path | None:
    """The embedded trace a short name (`azure-conv`) stands for, unless a file of that name exists."""
    name = str(trace)
    if name in EMBEDDED and not Path(name).exists():
        return data_dir("traces") / EMBEDDED[name]
    return None


def _open(path: Path):
    """The trace as a binary stream (gunzipped when it starts with gzip's magic bytes) and
    whether it is JSON lines, after checking it is a regular, non-empty text file."""
    raw = open_regular(path, "trace CSV, JSONL or .gz", TraceError)
    stream = gzip.GzipFile(fileobj=raw, mode="rb") if raw.peek(2)[:2] == b"\x1f\x8b" else raw
    try:
        head = stream.peek(4096)[:4096]
    except (OSError, EOFError, zlib.error) as exc:
        raw.close()
        raise TraceError(f"{path}: corrupt gzip ({excerpt(exc)}); re-compress or pass the plain file") from None
    if not head.strip():
        raw.close()
        raise TraceError(f"{path}: empty file; a trace needs a header and at least one request")
    if b"\x00" in head:
        raw.close()
        raise TraceError(f"{path}: binary data, not a CSV or JSONL trace")
    return raw, stream, head.lstrip()[:1] in (b"{", b"[")


def _numbers(path: Path, series: pd.Series, name: str, first_line: int) -> np.ndarray:
    """A column as floats; a cell that is not a finite number is an error naming its line."""
    import pandas as pd  # on first use: the CLI starts without it
    values = series.to_numpy(float) if pd.api.types.is_numeric_dtype(series) else \
        pd.to_numeric(series, errors="coerce").to_numpy(float)
    bad = ~np.isfinite(values)
    if bad.any():
        row = int(np.argmax(bad))
        raw = series.iloc[row]
        text = "is empty or not a number" if raw is None or (isinstance(raw, float) and not np.isfinite(raw)) or \
            str(raw).strip() == "" else f"has '{excerpt(raw)}', not a number"
        raise TraceError(f"{path}: line {first_line + row}: column {name} {text}; fix or remove the row")
    return values


def _blocks(path: Path, stream):
    """(first line number, bytes) of consecutive blocks of whole lines, each at most about
    TRACE_BLOCK_BYTES: the parser's memory is bounded by the block, whatever the trace's length."""
    rest, line = b"", 1
    while True:
        try:
            data = stream.read(TRACE_BLOCK_BYTES)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"{path}: cannot read past line {line} ({excerpt(exc)}); a corrupt gzip? "
                             "re-compress or pass the plain file") from None
        if not data:
            break
        buffer = rest + data
        cut = buffer.rfind(b"\n") + 1
        if cut == 0:
            if len(buffer) > TRACE_BLOCK_BYTES:
                raise TraceError(f"{path}: line {line} is longer than {TRACE_BLOCK_BYTES >> 20} MiB; a trace has one "
                                 "request per line")
            rest = buffer
            continue
        block, rest = buffer[:cut], buffer[cut:]
        yield line, block
        line += block.count(b"\n")
    if rest.strip():
        yield line, rest


def _parse_error(path: Path, exc: Exception, first: int, block: bytes, is_json: bool) -> TraceError:
    """A parser's error as one line naming the file line it happened on."""
    if is_json:
        for k, text in enumerate(block.splitlines()):
            if text.strip():
                try:
                    json.loads(text)
                except ValueError as bad:
                    return TraceError(f"{path}: line {first + k}: not a JSON object ({excerpt(bad)}); fix or remove the line")
        return TraceError(f"{path}: not JSON lines ({excerpt(exc)})")
    return TraceError(f"{path}: not a readable CSV near line {first} ({reason(exc, 60)})")


def _known_columns(header: list) -> Columns:
    """A CSV's columns by its header: Azure's or splitwise-sim's, else by their names, else the defaults."""
    return next((k for k in (AZURE, SPLITWISE) if {k.time, k.prompt, k.output} <= set(header)), None) \
        or detect_columns(header) or Columns()


def _chunks(path: Path, columns: Columns | None):
    """(column mapping, wall-clock?, first line number of the chunk's first row, frame) per block."""
    import pandas as pd  # on first use: the CLI starts without it
    raw, stream, is_json = _open(path)
    with raw:
        blocks = _blocks(path, stream)
        cols, wall_clock, header = columns or MOONCAKE, False, None
        for first, block in blocks:
            if header is None and not is_json:
                end = block.find(b"\n") + 1 or len(block)
                try:
                    header = list(pd.read_csv(io.BytesIO(block[:end]), nrows=0, skipinitialspace=True).columns)
                except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
                    raise _parse_error(path, exc, first, block, False) from None
                if columns is None:
                    cols = _known_columns(header)
                    wall_clock = cols is AZURE
                _require(path, cols, header)
                block, first = block[end:], first + 1
                if not block.strip():
                    continue
            try:
                if is_json:
                    chunk = pd.read_json(io.BytesIO(block), lines=True, dtype=False)
                    _require(path, cols, chunk.columns)
                else:
                    assert header is not None  # (read from the first block)
                    chunk = csv_rows(block, header, first, path, TraceError, cols.time if wall_clock else None)
            except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
                raise _parse_error(path, exc, first, block, is_json) from None
            yield cols, wall_clock, first, chunk


def _require(path: Path, cols: Columns, found) -> None:
    missing = [c for c in (cols.time, cols.prompt, cols.output) if c not in found]
    if missing:
        shown = excerpt(", ".join(map(str, list(found)[:8])), 120)
        raise TraceError(
            f"{path}: missing column(s) {excerpt(', '.join(missing))} (found: {shown}); expected an Azure, splitwise-sim "
            "or Mooncake trace, or name the columns with --time-column/--prompt-column/--output-column"
        )


def load_trace(path: str | Path, columns: Columns | None = None) -> Trace:
    """Read a trace file; `columns` forces the generic CSV reader with those names.
    Parsed a block of lines at a time (TRACE_BLOCK_BYTES), so a trace of ten million requests
    needs little more memory than its three numeric columns; every bound of `splitplan.base.limits`
    (requests, tokens, span) is checked as it is read."""
    path = Path(path)
    arrivals, prompts, outputs = [], [], []
    extra = _PrefixColumns(path)
    origin_ns = origin = previous = None
    rows, wall_clock, cols = 0, False, Columns()
    for cols, wall_clock, first, chunk in _plain_chunks(path, columns) or _chunks(path, columns):
        if not len(chunk):
            continue
        rows += len(chunk)
        if rows > MAX_TRACE_REQUESTS:
            raise TraceError(f"{path}: more than {MAX_TRACE_REQUESTS:,} requests; cut the trace to the period to plan "
                             "(optimize sizes its busiest 100,000 consecutive requests anyway)")
        if isinstance(chunk, _Plain):
            time, prompt, output = chunk.time, chunk.prompt, chunk.output
        else:
            time, prompt, output = _frame_columns(path, cols, wall_clock, first, chunk)
        if wall_clock:
            origin_ns = time[0] if origin_ns is None else origin_ns
            arrival = (time - origin_ns) / 1e9
        else:
            arrival = time * cols.time_unit_s
        origin = arrival[0] if origin is None else origin
        _check_block(path, cols, first, chunk, arrival, prompt, output, previous, origin)
        previous = arrival[-1]
        extra.read(chunk, first, prompt)
        arrivals.append(arrival)
        prompts.append(prompt.astype(np.int64))
        outputs.append(output.astype(np.int64))
    if not arrivals or sum(len(a) for a in arrivals) == 0:
        raise TraceError(f"{path}: header only, no requests")
    arrival = np.concatenate(arrivals)
    prompt, output = np.concatenate(prompts), np.concatenate(outputs)
    if columns is None and not wall_clock:  # (times detected, not named: the unit is a guess)
        _warn_if_milliseconds(path, cols, arrival)
    return Trace(arrival - arrival[0], prompt, output, str(path), prefix=extra.tree(prompt, output))


def _check_block(path: Path, cols: Columns, first: int, chunk, arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray,
                 previous: float | None, origin: float) -> None:
    """A block of `load_trace`'s rows (from line `first`) within bounds: whole token counts from 1 to
    MAX_REQUEST_TOKENS, arrivals in order (after `previous`, the last block's) and within
    MAX_TRACE_SPAN_S of the first (`origin`); TraceError naming the line otherwise."""
    for name, values in ((cols.prompt, prompt), (cols.output, output)):
        bad = (values < 1) | (values != np.floor(values)) | (values > MAX_REQUEST_TOKENS)
        if bad.any():
            row = int(np.argmax(bad))
            raise TraceError(f"{path}: line {first + row}: column {name} is {values[row]:g}; token counts must be "
                             f"whole numbers from 1 to {MAX_REQUEST_TOKENS:,}")
    steps = np.diff(arrival, prepend=arrival[0] if previous is None else previous)
    if (steps < 0).any():
        row = int(np.argmax(steps < 0))
        before = arrival[row - 1] if row else previous
        raise TraceError(f"{path}: line {first + row}: arrival goes back in time ({arrival[row]:g} s after "
                         f"{before:g} s); sort the trace by time")
    far = arrival - origin > MAX_TRACE_SPAN_S
    if far.any():
        row = int(np.argmax(far))
        raise TraceError(f"{path}: line {first + row}: arrival {excerpt(_cell(chunk, cols.time, row))} is more than "
                         f"{MAX_TRACE_SPAN_S / 86400:.0f} days after the first; are the times in ms, us or ns? (--time-unit)")


SLOWEST_PLAUSIBLE_RPS = 0.01  # whole-number times in seconds slower than this on average look like milliseconds


def _warn_if_milliseconds(path: Path, cols: Columns, arrival: np.ndarray) -> None:
    """Warn (InputWarning) when a detected time column of whole numbers, read as seconds (`arrival`:
    its values as read), makes the trace slower than one request per 100 s: they are likely milliseconds."""
    span = float(arrival[-1] - arrival[0])
    if (cols.time_unit_s != 1.0 or len(arrival) < 2 or span <= 0 or (len(arrival) - 1) / span >= SLOWEST_PLAUSIBLE_RPS
            or not np.all(arrival == np.floor(arrival))):
        return
    column = cols.time
    warnings.warn(InputWarning(
        f"{path}: column {column} holds whole numbers, read as seconds: {len(arrival):,} requests over {span:,.0f} s, "
        f"{(len(arrival) - 1) / span:.2g} req/s; if they are milliseconds, give --time-unit ms"), stacklevel=3)


def _frame_columns(path: Path, cols: Columns, wall_clock: bool, first: int, chunk: pd.DataFrame):
    """A block's times (seconds in the file's unit, or ns since the epoch for date-times), prompt
    and output tokens, as floats; a cell that is not one is an error naming its line."""
    import pandas as pd  # on first use: the CLI starts without it
    if wall_clock:
        stamps = pd.to_datetime(chunk[cols.time], format="ISO8601", errors="coerce", utc=True)
        bad = stamps.isna().to_numpy()
        if bad.any():
            row = int(np.argmax(bad))
            raise TraceError(f"{path}: line {first + row}: TIMESTAMP '{excerpt(chunk[cols.time].iloc[row])}' is not a date-time")
        time = stamps.dt.tz_localize(None).to_numpy("datetime64[ns]").astype(np.int64)
    else:
        time = _numbers(path, chunk[cols.time], cols.time, first)
    return time, _numbers(path, chunk[cols.prompt], cols.prompt, first), _numbers(path, chunk[cols.output], cols.output, first)


def _cell(chunk, column: str, row: int):
    return chunk.raw_time[row] if isinstance(chunk, _Plain) else chunk[column].iloc[row]


@dataclass(frozen=True)
class _Plain:
    """A block of a plain CSV trace read without pandas (`_plain_chunks`)."""

    columns: list
    raw_time: list  # the time column's cells, for messages
    time: np.ndarray
    prompt: np.ndarray
    output: np.ndarray

    def __len__(self) -> int:
        return len(self.prompt)


PREFIX_COLUMNS = ("prefix_id", "prefix_tokens", "session_id", "hash_ids")


def _plain_chunks(path: Path, columns: Columns | None) -> list | None:
    """The blocks of a plain CSV trace (a header, then rows of exactly its fields:
    numbers, or ISO 8601 date-times without a zone for Azure's TIMESTAMP; no prefix columns),
    read with the csv module and numpy, as `_chunks` yields them: pandas takes about half a
    second to import, more than reading such a trace takes. None for anything else (JSON
    lines, a quoted or odd cell, a short row, a bad number...): `_chunks` reads it then, and
    its messages name what is wrong."""
    import csv
    raw, stream, is_json = _open(path)
    if is_json:
        raw.close()
        return None
    out, header, cols, wall_clock = [], None, columns or MOONCAKE, False
    with raw:
        for first, block in _blocks(path, stream):
            try:
                lines = list(csv.reader(io.StringIO(block.decode("utf-8"), newline=""), skipinitialspace=True))
            except (UnicodeDecodeError, csv.Error):
                return None
            if header is None:
                header, lines, first = lines[0], lines[1:], first + 1
                if set(PREFIX_COLUMNS) & set(header):
                    return None
                if columns is None:
                    cols = _known_columns(header)
                    wall_clock = cols is AZURE
                if not {cols.time, cols.prompt, cols.output} <= set(header):
                    return None
            plain = _plain_block(header, lines, cols, wall_clock)
            if plain is None:
                return None
            out.append((cols, wall_clock, first, plain))
    return out if header is not None else None


_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?").fullmatch
_STAMP = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:\.\d{1,9})?)?").fullmatch


def _plain_block(header: list[str], lines: list[list[str]], cols: Columns, wall_clock: bool) -> _Plain | None:
    """A block of plain rows as numbers (None for anything else: `_plain_chunks`)."""
    if any(len(row) != len(header) for row in lines):
        return None  # (a short or long row, or a blank line: pandas' rules)
    at = [header.index(c) for c in (cols.time, cols.prompt, cols.output)]
    cells = [[row[k] for row in lines] for k in at]
    if not all(all(map(_NUMBER, column)) for column in cells[1:]) or \
            not all(map(_STAMP if wall_clock else _NUMBER, cells[0])):
        return None
    try:
        time = (np.array(cells[0], dtype="datetime64[ns]").astype(np.int64) if wall_clock
                else np.array(cells[0], dtype=float))
    except ValueError:  # (a date-time out of range, 2023-13-45: the checked path names its line)
        return None
    prompt, output = np.array(cells[1], dtype=float), np.array(cells[2], dtype=float)
    if not (np.isfinite(prompt).all() and np.isfinite(output).all() and np.isfinite(time).all()):
        return None
    return _Plain(header, cells[0], time, prompt, output)


class _PrefixColumns:
    """A trace's prefix columns, checked as each block of rows is read (errors name the line)."""

    def __init__(self, path: Path):
        self.path = path
        self.ids: list | None = None
        self.tokens: list | None = None
        self.sessions: list | None = None
        self.hashes: list | None = None
        self.first_use: dict = {}  # prefix_id -> (prefix_tokens, line)

    def _fail(self, line: int, text: str):
        raise TraceError(f"{self.path}: line {line}: {text}")

    def read(self, chunk: pd.DataFrame, first: int, prompt: np.ndarray) -> None:
        columns = set(chunk.columns)
        if "prefix_tokens" in columns and "prefix_id" not in columns:
            raise TraceError(f"{self.path}: column prefix_tokens without a prefix_id column; add prefix_id (requests "
                             "with one id share their first prefix_tokens tokens)")
        if "prefix_id" in columns:
            if "prefix_tokens" not in columns:
                raise TraceError(f"{self.path}: column prefix_id without a prefix_tokens column; add prefix_tokens "
                                 "(how many leading prompt tokens the requests of an id share)")
            self._prefix_ids(chunk, first, prompt)
        if "session_id" in columns:
            self.sessions = self.sessions if self.sessions is not None else []
            self.sessions.extend(_key(key) for key in chunk["session_id"].tolist())
        if "hash_ids" in columns:
            self._hash_ids(chunk, first)

    def _prefix_ids(self, chunk: pd.DataFrame, first: int, prompt: np.ndarray) -> None:
        """prefix_id and prefix_tokens: both or neither per row, whole tokens within the prompt, one length per id."""
        self.ids = self.ids if self.ids is not None else []
        self.tokens = self.tokens if self.tokens is not None else []
        for k, (key, count) in enumerate(zip(chunk["prefix_id"].tolist(), chunk["prefix_tokens"].tolist(), strict=True)):
            line = first + k
            key, count = _key(key), _key(count)
            if key is None and (count is None or _is_zero(count)):  # (no prefix: both empty, or no id and 0 tokens)
                self.ids.append(None)
                self.tokens.append(0)
                continue
            if key is None or count is None:
                self._fail(line, "a prefix_id needs a prefix_tokens and the other way round; fill both or neither")
            self.ids.append(key)
            self.tokens.append(self._prefix_length(line, key, count, prompt[k]))

    def _prefix_length(self, line: int, key, count, prompt_tokens: float) -> int:
        """A row's prefix_tokens, checked: a whole number within its prompt, the same for every row of its id."""
        try:
            value = float(count)
        except ValueError:
            value = float("nan")
        if not (math.isfinite(value) and value >= 0 and value == int(value)):
            self._fail(line, f"prefix_tokens '{excerpt(count)}' is not a whole number of tokens >= 0")
        if value > prompt_tokens:
            self._fail(line, f"prefix_tokens {value:g} is above the request's {prompt_tokens:g} prompt tokens; "
                       "a prefix is part of the prompt")
        known = self.first_use.setdefault(key, (int(value), line))
        if known[0] != int(value):
            self._fail(line, f"prefix_id '{excerpt(key)}' has prefix_tokens {value:g}, line {known[1]} gave it "
                       f"{known[0]}; one id is one shared prefix (give the longer one another id)")
        return int(value)

    def _hash_ids(self, chunk: pd.DataFrame, first: int) -> None:
        """hash_ids: a list of integers per row (Mooncake's block ids), empty where missing."""
        self.hashes = self.hashes if self.hashes is not None else []
        for k, blocks in enumerate(chunk["hash_ids"].tolist()):
            if isinstance(blocks, float) and np.isnan(blocks):
                blocks = []
            if not isinstance(blocks, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in blocks):
                self._fail(first + k, f"hash_ids '{excerpt(blocks)}' is not a list of integers (Mooncake's 512-token "
                           "block ids); fix or remove the row")
            self.hashes.append(blocks)

    def tree(self, prompt: np.ndarray, output: np.ndarray) -> PrefixTree | None:
        if self.ids is None and self.sessions is None and self.hashes is None:
            return None
        for name, values in (("prefix_id", self.ids), ("session_id", self.sessions), ("hash_ids", self.hashes)):
            if values is not None and len(values) != len(prompt):  # (a column in some blocks only: JSON lines)
                raise TraceError(f"{self.path}: {name} is missing on some rows; give it on every row (empty for none)")
        return prefixes.from_columns(prompt, output, self.ids, self.tokens, self.sessions, self.hashes)


def _is_zero(text: str) -> bool:
    try:
        return float(text) == 0
    except ValueError:
        return False


def _key(value):
    """A cell as an id: None when empty, integral floats as integers ('7', not '7.0')."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return str(int(value))
    text = str(value).strip()
    return text or None


def load_workload(trace: str | Path | Trace | None = None, rate: float | None = None, duration_s: float = 120.0,
                  seed: int = 0, columns: Columns | None = None) -> Trace:
    """A trace (a path, a Trace, an embedded trace's short name, or None for the embedded Azure
    code trace), or its Poisson resample at `rate` req/s for `duration_s` seconds."""
    if rate is not None and not 0 < rate <= MAX_RATE_RPS:  # (NaN fails too)
        raise SpecError(f"--rate {rate:g}: must be > 0 and <= {MAX_RATE_RPS:,g} requests per second")
    if not 0 < duration_s <= MAX_DURATION_S:
        raise SpecError(f"--duration {duration_s:g}: must be > 0 and <= {MAX_DURATION_S:,g} seconds")
    if isinstance(trace, Trace):
        loaded = trace
    elif (path := default_trace_path() if trace is None else embedded(trace)) is not None:
        loaded = dataclasses.replace(load_trace(path, columns), source=f"{path.name} (embedded)")
    else:
        loaded = load_trace(cast(str | Path, trace), columns)  # (a file: not None, or it would be the embedded trace)
    if rate is None:
        return loaded
    return resample_poisson(loaded, rate, duration_s, np.random.default_rng(seed))


def closed_loop_workload(trace: str | Path | Trace | None, concurrency: int, num_requests: int | None = None,
                         isl: int | None = None, osl: int | None = None, seed: int = 0,
                         columns: Columns | None = None) -> Trace:
    """The requests of a closed-loop run (`concurrency` clients, as serving benchmarks
    measure): `num_requests` (default 10 per client, at least 100) sizes, each input
    `isl` tokens and output `osl` tokens when given, else drawn i.i.d. from the trace's
    (prompt, output) pairs with `seed`; more than `concurrency`, whose first requests are the
    warm-up. Arrival times are left at 0: the simulator sets them as clients free up.

    Every client sends its warm-up request at once, its outputs graded (`out_of_phase`)."""
    if concurrency < 1:
        raise SpecError(f"--concurrency {concurrency}: must be >= 1 client")
    for flag, value in (("--isl", isl), ("--osl", osl), ("--num-requests", num_requests)):
        if value is not None and value < 1:
            raise SpecError(f"{flag} {value}: must be >= 1")
    n = num_requests or max(10 * concurrency, 100)
    if n <= concurrency:
        raise SpecError(f"--num-requests {n:,}: the first {concurrency:,} (one per client) are the run's warm-up, left out "
                        f"of the statistics; give more than {concurrency:,}")
    tree = None
    if isl is not None and osl is not None:
        prompt, output, source = np.full(n, isl), np.full(n, osl), f"ISL {isl} / OSL {osl}"
    else:
        base = load_workload(trace, columns=columns)
        pick = np.random.default_rng(seed).integers(0, len(base), n)
        prompt = np.full(n, isl) if isl is not None else base.prompt_tokens[pick]
        output = np.full(n, osl) if osl is not None else base.output_tokens[pick]
        source = f"sizes of {base.source}" + (f", ISL {isl}" if isl else "") + (f", OSL {osl}" if osl else "")
        tree = _take(base.prefix, pick) if isl is None else None
    return Trace(np.zeros(n), prompt.astype(np.int64), out_of_phase(output, concurrency), f"{source}; {n} requests", prefix=tree)


def out_of_phase(output_tokens: np.ndarray, clients: int) -> np.ndarray:
    """A closed loop's output lengths with its first wave's (one request per client, all sent at
    once) graded, 1/N, 2/N, ... of their length for N clients, so that the clients free up spread
    over a request's life and run out of phase from then on. Without it a simulation of identical
    requests keeps lockstep groups for ever (requests that finish in one iteration send their next
    ones together, which prefill together and finish together again), which real engines do not
    keep (timing noise breaks them, presumably: the runs do not show how): measured vLLM TTFT
    grows with concurrency far more slowly than lockstep groups queue (Llama-3.1-70B fp8, 4
    clients on H100 TP 8: 70 ms, where a lockstep replay timed by NVIDIA's measured kernels gives
    129 ms and one out of phase 74 ms; aiconfigurator's silicon sample), as aiconfigurator's own
    vLLM model finds (a factor 1 + log2(clients) / 8 on one prefill). The first wave's prefills do
    not depend on its outputs: its TTFT is the burst's; its E2E and TPOT are not the run's."""
    graded = np.asarray(output_tokens, np.int64).copy()
    wave = min(clients, len(graded))
    graded[:wave] = np.maximum(1, np.round(graded[:wave] * np.arange(1, wave + 1) / clients))
    return graded


def check_closed_loop(concurrency: int | None, isl: int | None, osl: int | None, num_requests: int | None) -> None:
    """--isl, --osl and --num-requests size a closed loop's requests: refused without --concurrency."""
    if concurrency is None and any(x is not None for x in (isl, osl, num_requests)):
        raise SpecError("--isl, --osl and --num-requests describe a closed-loop run: add --concurrency N")


def check_request_sizes(model: str, engine: str, isl: int | None, osl: int | None) -> None:
    """--isl and --osl of a closed loop within what the engine takes for the model (its
    max_model_len: the model's context window unless the profile says otherwise)."""
    if isl is None and osl is None:
        return
    from splitplan.specs.engine import load_engine
    from splitplan.specs.model import load_model
    m = load_model(model)
    context = load_engine(engine).context_tokens(m)
    longest = (isl or 1) + (osl or 1)
    if context is not None and longest > context:
        given = " + ".join(f"{flag} {v:,}" for flag, v in (("--isl", isl), ("--osl", osl)) if v is not None)
        raise SpecError(f"{given}: requests of {longest:,} tokens exceed {excerpt(m.name)}'s context window "
                        f"({context:,} tokens), which the engine refuses; give shorter ones")


def windows(trace: Trace, window_s: float) -> list[tuple[float, Trace]]:
    """The trace's `window_s`-second windows that hold requests, in order: each one's start
    (seconds into the trace) and its requests, timed from the first one's arrival."""
    index = np.floor(trace.arrival_s / window_s).astype(np.int64)
    return [(float(k * window_s), trace.take(index == k, f"{trace.source} [window {k}]")) for k in np.unique(index)]


def peak_window(trace: Trace, max_requests: int) -> tuple[Trace, dict | None]:
    """The busiest stretch of `max_requests` consecutive requests (the shortest
    span), for traces too long to size or simulate whole; (trace, None) if it fits.
    Percentiles over the peak are no better than over the whole trace, so a plan
    sized on it is conservative."""
    if len(trace) <= max_requests:
        return trace, None
    spans = trace.arrival_s[max_requests - 1:] - trace.arrival_s[: len(trace) - max_requests + 1]
    start = int(np.argmin(spans))
    stop = start + max_requests
    window = trace.take(slice(start, stop), f"{trace.source} (peak window of {max_requests:,} requests)")
    info = {"requests": max_requests, "of": len(trace), "start_s": float(trace.arrival_s[start]),
            "end_s": float(trace.arrival_s[stop - 1]), "rate_rps": window.mean_rate_rps}
    return window, info


def resample_poisson(trace: Trace, rate_rps: float, duration_s: float, rng: np.random.Generator) -> Trace:
    """Splitwise's method: Poisson arrivals at `rate_rps` for `duration_s`, with
    (prompt, output) pairs drawn i.i.d. (with replacement) from `trace`."""
    if not (rate_rps > 0 and duration_s > 0):  # (NaN fails too; infinities fail the bound below)
        raise TraceError(f"rate ({rate_rps}) and duration ({duration_s}) must be > 0")
    expected = rate_rps * duration_s
    if expected > MAX_GENERATED_REQUESTS:
        raise SpecError(f"--rate {rate_rps:g} for --duration {duration_s:g} s is {expected:,.0f} requests; at most "
                        f"{MAX_GENERATED_REQUESTS:,}: shorten the duration")
    gaps = rng.exponential(1.0 / rate_rps, size=int(expected + 10 * np.sqrt(expected) + 10))
    arrival = np.cumsum(gaps) - gaps[0]
    arrival = arrival[arrival < duration_s]
    pick = rng.integers(0, len(trace), size=len(arrival))
    source = f"{trace.source} (Poisson {rate_rps:g} req/s, {duration_s:g} s)"
    return Trace(arrival, trace.prompt_tokens[pick], trace.output_tokens[pick], source, prefix=_take(trace.prefix, pick))


def _take(tree: PrefixTree | None, index) -> PrefixTree | None:
    return None if tree is None else tree.take(index)


def with_shared_prefix(trace: Trace, shared_tokens: int, groups: int) -> Trace:
    """The trace with inference-perf's `shared_prefix` data (`--shared-prefix-tokens N --prefix-groups K`):
    `groups` system prompts of `shared_tokens` tokens, request i in group i mod `groups` (its prompt
    starts with it; a prompt shorter than it shares what it has)."""
    if not 1 <= shared_tokens <= MAX_REQUEST_TOKENS:
        raise SpecError(f"--shared-prefix-tokens {shared_tokens}: must be 1 to {MAX_REQUEST_TOKENS:,} tokens")
    if not 1 <= groups <= max(len(trace), 1):
        raise SpecError(f"--prefix-groups {groups}: must be 1 to the trace's {len(trace):,} requests")
    if trace.prefix is not None:
        raise SpecError("--shared-prefix-tokens: the trace records its own prefixes (prefix_id, session_id or hash_ids); "
                        "drop the option or the columns")
    return dataclasses.replace(trace, prefix=prefixes.synthetic(len(trace), shared_tokens, groups),
                               source=f"{trace.source}; {groups} shared prefixes of {shared_tokens} tokens")


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
        "prefix_reuse": None if trace.prefix is None else prefix_reuse(trace),
    }


def prefix_reuse(trace: Trace) -> dict:
    """The reuse a prefix cache that never evicts would see on the trace (workload.prefix)."""
    if trace.prefix is None:
        raise ValueError(f"{trace.source} records no prefixes")
    reuse = prefixes.infinite_cache_reuse(trace.prefix, trace.prompt_tokens, trace.output_tokens)
    hit = reuse["hit_tokens"]
    return {"infinite_cache_hit_rate": reuse["infinite_cache_hit_rate"], "requests_with_a_hit": reuse["requests_with_a_hit"],
            "hit_tokens_p50": float(np.percentile(hit, 50)), "hit_tokens_p90": float(np.percentile(hit, 90)),
            "distinct_prefix_nodes": int(len(trace.prefix.parent))}
