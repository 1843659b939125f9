"""Reading the user's files, bounded: regular files only (a FIFO never hangs, /dev/zero is never
read), at most a known number of bytes, YAML and JSON without duplicate keys, aliases or deep
nesting, and error messages that show at most a short excerpt of what the file holds.

Every reader of a user file (specs, plans, perf-dbs, deployments, traces) opens it here; the
bounds are in `splitplan.base.limits`."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import warnings
from pathlib import Path
from typing import Any

import yaml

from splitplan.base.errors import SpecError, SplitplanError
from splitplan.base.limits import EXCERPT_CHARS, MAX_NESTING, MAX_TABLE_BYTES

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


def printable(text: str) -> str:
    """`text` with every control character (terminal escapes, NUL, bidirectional overrides)
    written as an escape (`\\x1b`, `\\u202e`), so what a user's file or option holds never
    reaches a terminal raw."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", text)


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """`value` as text for an error message: one line, control characters escaped, at most
    `limit` characters."""
    text = printable(" ".join(str(value).split()))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def reason(exc: BaseException, limit: int = 120) -> str:
    """An exception's first line (its type where it has no text), as an excerpt."""
    text = str(exc)
    return excerpt(text.splitlines()[0] if text else type(exc).__name__, limit)


def open_regular(path: Path, what: str, error: type[SplitplanError] = SpecError) -> io.BufferedReader:
    """`path` opened for binary reading, if it is a regular file; else `error` naming it.
    Opened without blocking, so a FIFO with no writer is refused at once instead of hanging."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise error(f"{path}: no such file; pass a {what} file") from None
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror}); pass a readable {what} file") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "is a directory" if stat.S_ISDIR(mode) else "is not a regular file (a pipe, device or socket)"
        raise error(f"{path}: {kind}; pass a {what} file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bounded(path: Path, limit: int, what: str, error: type[SplitplanError] = SpecError) -> bytes:
    """The bytes of the regular file `path`, refused (`error`) beyond `limit` bytes."""
    with open_regular(path, what, error) as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise error(f"{path}: cannot read ({exc.strerror})") from None
    if len(data) > limit:
        raise error(f"{path}: larger than {limit >> 20} MiB; a {what} file is far smaller: is this the right file?")
    return data


def read_text(path: Path, limit: int, what: str, error: type[SplitplanError] = SpecError) -> str:
    try:
        return read_bounded(path, limit, what, error).decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{path}: not a text file (not UTF-8); pass a {what} file") from None


class _Refused(Exception):
    """A document that parses but that a spec may not be: the message says why."""


try:  # libyaml's parser: 7x faster than PyYAML's
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # (PyYAML built without libyaml)
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]


class _StrictLoader(_SafeLoader):
    """Safe YAML, refusing duplicate keys (YAML lets the last win: silently wrong). Aliases are
    refused after loading, where they show as shared objects (`_shape`)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)):
                if key in seen:
                    raise _Refused(f"line {key_node.start_mark.line + 1}: duplicate key {key_text(key)}; keep one")
                seen.add(key)
        return super().construct_mapping(node, deep)


def key_text(key: Any) -> str:
    """A key for a message: shown when it is a name (a spec's keys are), else not (a file that is
    no spec, /etc/shadow parsed as YAML, would show its content)."""
    return f"'{key}'" if isinstance(key, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,59}", key) else "(a key that is no name)"


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"duplicate key {key_text(key)}; keep one")
        out[key] = value
    return out


def _shape(value: Any) -> tuple[int, bool]:
    """How deeply `value` nests, and whether a container occurs twice in it (a YAML alias: an
    alias bomb expands exponentially once walked). Iterative, each container visited once."""
    deepest, seen, stack = 0, set(), [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            if id(item) in seen:
                return deepest, True
            seen.add(id(item))
            deepest = max(deepest, level)
            if deepest > MAX_NESTING:
                return deepest, False
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest, False


def _bracket_depth(text: str) -> int:
    """The deepest nesting of [ and { in `text` (brackets inside strings count too: a spec has
    none), without parsing it."""
    import numpy as np
    codes = np.frombuffer(text.encode("utf-8", "replace"), np.uint8)
    steps = np.isin(codes, (ord("["), ord("{"))).astype(np.int64) - np.isin(codes, (ord("]"), ord("}")))
    return int(np.cumsum(steps).max(initial=0))


def parse_document(text: str, path: Path, as_json: bool, error: type[SplitplanError] = SpecError) -> Any:
    """A YAML or JSON document, strictly (see `_StrictLoader`): no duplicate keys, no aliases,
    nested at most MAX_NESTING deep."""
    kind = "JSON" if as_json else "YAML"
    if _bracket_depth(text) > MAX_NESTING:  # before parsing: a deep document is slow to parse, then overflows the stack
        raise error(f"{path}: nested deeper than {MAX_NESTING} levels; a spec is a few levels deep")
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates) if as_json else yaml.load(text, Loader=_StrictLoader)
    except _Refused as exc:
        raise error(f"{path}: {exc}") from None
    except RecursionError:
        raise error(f"{path}: nested deeper than {MAX_NESTING} levels; a spec is a few levels deep") from None
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        line = line + 1 if line is not None else getattr(exc, "lineno", None)
        where = f" line {line}" if line else ""
        raise error(f"{path}:{where} is not valid {kind}; fix the syntax") from None
    depth, shared = _shape(data)
    if depth > MAX_NESTING:
        raise error(f"{path}: nested deeper than {MAX_NESTING} levels; a spec is a few levels deep")
    if shared:
        raise error(f"{path}: YAML aliases (*name) are not supported; write the value out")
    return data


def csv_rows(block: bytes, header: list, first: int, path: Path, error: type[SplitplanError] = SpecError,
             text_column: str | None = None):
    """CSV rows (no header line) under `header`, the first being line `first` of `path`. A row
    with more fields than the header is an error naming its line (pandas would shift the first
    such row's fields into an index, or drop them); a row with fewer leaves its cells empty."""
    import io

    import numpy as np
    import pandas as pd  # on first use: the CLI starts without it
    width = len(header)
    text = {header.index(text_column): str} if text_column in header else None
    try:  # one column more than the header: a longer row lands there (or fails the parser) instead of shifting
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)  # the first row is longer still: pandas would cut it
            chunk = pd.read_csv(io.BytesIO(block), header=None, names=list(range(width + 1)), index_col=False,
                                skipinitialspace=True, dtype=text)
    except pd.errors.ParserWarning:
        fields = len(block.split(b"\n", 1)[0].split(b","))
        raise error(f"{path}: line {first}: {fields} fields, the header has {width}; fix or remove the row") from None
    except pd.errors.EmptyDataError:
        return pd.DataFrame(columns=header)
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        counted = re.search(r"fields in line (\d+), saw (\d+)", str(exc))
        if counted:
            raise error(f"{path}: line {first + int(counted.group(1)) - 1}: {counted.group(2)} fields, the header has "
                        f"{width}; fix or remove the row") from None
        raise error(f"{path}: not a readable CSV near line {first} ({reason(exc)})") from None
    longer = chunk[width].notna().to_numpy()
    if longer.any():
        raise error(f"{path}: line {first + int(np.argmax(longer))}: {width + 1} fields, the header has {width}; "
                    "fix or remove the row")
    return chunk.drop(columns=width).set_axis(header, axis=1)


def read_table(path: Path, what: str, error: type[SplitplanError] = SpecError):
    """A CSV file with a header line (at most MAX_TABLE_BYTES) as a DataFrame, its rows read by
    `csv_rows`."""
    import io

    import pandas as pd  # on first use: the CLI starts without it
    data = read_bounded(path, MAX_TABLE_BYTES, what, error)
    end = data.find(b"\n") + 1 or len(data)
    try:
        header = list(pd.read_csv(io.BytesIO(data[:end]), nrows=0).columns)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
        raise error(f"{path}: not a readable {what} ({reason(exc)})") from None
    return csv_rows(data[end:], header, 2, path, error)


def finite_columns(frame, columns: list[str], path: Path, error: type[SplitplanError] = SpecError):
    """`frame` with `columns` as numbers; a cell that is not a finite number is an error naming
    its line (header = line 1)."""
    import numpy as np
    import pandas as pd  # on first use: the CLI starts without it
    out = frame.copy()
    for col in columns:
        values = pd.to_numeric(out[col], errors="coerce")
        bad = ~np.isfinite(values.to_numpy(float))
        if bad.any():
            row = int(np.argmax(bad))
            raise error(f"{path}: line {int(out.index[row]) + 2}: column {col} has '{excerpt(out[col].iloc[row])}', "
                        "not a finite number; fix or remove the row")
        out[col] = values
    return out


def number_column(frame, col: str, path: Path, error: type[SplitplanError] = SpecError):
    """`frame[col]` as floats, an empty cell NaN; text that is not a number is an error naming its
    line (header = line 1)."""
    import numpy as np
    import pandas as pd  # on first use: the CLI starts without it
    values = pd.to_numeric(frame[col], errors="coerce")
    bad = (values.isna() & frame[col].notna()).to_numpy()
    if bad.any():
        row = int(np.argmax(bad))
        raise error(f"{path}: line {int(frame.index[row]) + 2}: column {col} has '{excerpt(frame[col].iloc[row])}', "
                    "not a number; fix or remove the row")
    return values.astype(float)


def whole_columns(frame, caps: dict[str, int], path: Path, error: type[SplitplanError] = SpecError) -> None:
    """Every value of each column in `caps` a whole number from 1 to its cap; else an error naming
    the first line (header = line 1)."""
    import numpy as np
    for col, cap in caps.items():
        values = frame[col].to_numpy(float)
        bad = ~((values >= 1) & (values <= cap) & (values == np.floor(values)))
        if bad.any():
            row = int(np.argmax(bad))
            raise error(f"{path}: line {int(frame.index[row]) + 2}: column {col} is {values[row]:g}; "
                        f"expected a whole number from 1 to {cap:,}")
