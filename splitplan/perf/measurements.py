"""Measured latencies: the splitwise-sim `perf_model.csv` format and a generic CSV.

Both are reduced to one row per distinct point with the median latency:
`hardware, model, tp, phase, batch, prompt_tokens, context_tokens, latency_ms, repeats`.
In the splitwise format a row holds a prefill (`prompt_time`: `batch_size` prompts
of `prompt_size` tokens) and a decode step (`token_time`: `batch_size` requests;
the context grows from `prompt_size` over `token_size` outputs, so its mean,
`prompt_size + token_size / 2`, is the context used).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from splitplan.base.errors import TraceError
from splitplan.base.inputs import finite_columns, read_table

SPLITWISE_COLUMNS = ["model", "hardware", "prompt_size", "batch_size", "token_size", "prompt_time", "token_time", "tensor_parallel"]
SPLITWISE_NUMBERS = ["prompt_size", "batch_size", "token_size", "prompt_time", "token_time", "tensor_parallel"]
GENERIC_COLUMNS = ["hardware", "model", "tp", "phase", "batch", "prompt_tokens", "context_tokens", "latency_ms"]
POINT_KEYS = ["model", "hardware", "tp", "phase", "batch", "prompt_tokens", "context_tokens"]

# Names used in splitwise-sim's file for machines of our catalog.
HARDWARE_ALIASES = {"h100-80gb-pcap": "h100-80gb-cap70"}


def read_measurements(path: str | Path) -> pd.DataFrame:
    """Medians per point, with `repeats` counting the raw rows behind each."""
    path = Path(path)
    raw = read_table(path, "perf_model.csv or generic latency CSV", TraceError)
    if set(SPLITWISE_COLUMNS) <= set(raw.columns):
        raw = finite_columns(raw.dropna(subset=SPLITWISE_COLUMNS), SPLITWISE_NUMBERS, path, TraceError)
        base = pd.DataFrame({
            "model": raw["model"],
            "hardware": raw["hardware"].replace(HARDWARE_ALIASES),
            "tp": raw["tensor_parallel"].astype(int),
            "batch": raw["batch_size"].astype(int),
        })
        prefill = base.assign(phase="prefill", prompt_tokens=raw["prompt_size"].astype(int), context_tokens=0,
                              latency_ms=raw["prompt_time"].astype(float))
        decode = base.assign(phase="decode", prompt_tokens=0,
                             context_tokens=(raw["prompt_size"] + raw["token_size"] // 2).astype(int),
                             latency_ms=raw["token_time"].astype(float))
        points = pd.concat([prefill, decode], ignore_index=True)
    elif set(GENERIC_COLUMNS) <= set(raw.columns):
        points = finite_columns(raw[GENERIC_COLUMNS], ["tp", "batch", "prompt_tokens", "context_tokens", "latency_ms"],
                                path, TraceError)
        points["hardware"] = points["hardware"].replace(HARDWARE_ALIASES)
    else:
        raise TraceError(
            f"{path}: unknown columns; expected the splitwise perf_model.csv header "
            f"({','.join(SPLITWISE_COLUMNS)}) or {','.join(GENERIC_COLUMNS)}"
        )
    tokens = points["prompt_tokens"].where(points["phase"] == "prefill", points["context_tokens"])
    bad = points[~points["phase"].isin(["prefill", "decode"]) | (points["latency_ms"] <= 0) | (points["batch"] < 1)
                 | (points["tp"] < 1) | (tokens < 1)]
    if len(bad):
        raise TraceError(f"{path}: line {int(bad.index[0]) % len(raw) + 2}: phase must be prefill or decode, tp >= 1, batch >= 1, "
                         "prompt tokens (prefill) or context tokens (decode) >= 1, latency > 0")
    grouped = points.groupby(POINT_KEYS, sort=True)["latency_ms"]
    return grouped.median().to_frame().assign(repeats=grouped.size()).reset_index()


def batch_token_medians(path: str | Path) -> pd.DataFrame:
    """splitwise-sim's view of its own file (`DatabasePerformanceModel`): per (model,
    hardware, TP) and per batch token count (`prompt_size x batch_size`), the median
    prompt and token time over every row with that count, whatever its batch or
    output length. Only the splitwise format has this view."""
    path = Path(path)
    raw = read_table(path, "perf_model.csv", TraceError)
    if not set(SPLITWISE_COLUMNS) <= set(raw.columns):
        raise TraceError(f"{path}: the splitwise-sim interpolation needs splitwise-sim's perf_model.csv columns "
                         f"({','.join(SPLITWISE_COLUMNS)})")
    raw = finite_columns(raw.dropna(subset=SPLITWISE_COLUMNS), SPLITWISE_NUMBERS, path, TraceError)
    table = pd.DataFrame({
        "model": raw["model"], "hardware": raw["hardware"].replace(HARDWARE_ALIASES), "tp": raw["tensor_parallel"].astype(int),
        "batch_tokens": (raw["prompt_size"] * raw["batch_size"]).astype(int),
        "prompt_ms": raw["prompt_time"].astype(float), "token_ms": raw["token_time"].astype(float),
    })
    return table.groupby(["model", "hardware", "tp", "batch_tokens"], sort=True)[["prompt_ms", "token_ms"]].median().reset_index()


def flag_anomalies(points: pd.DataFrame, drop_pct: float = 5.0) -> pd.Series:
    """Points that are not physical: in a batch sweep (same model, machine, TP, phase,
    prompt and context), a latency more than `drop_pct` % below the next smaller
    batch's (more work finishing sooner: a failed or truncated run). Returns a
    boolean Series aligned with `points`."""
    flagged = pd.Series(False, index=points.index)
    keys = ["model", "hardware", "tp", "phase", "prompt_tokens", "context_tokens"]
    for _, sweep in points.groupby(keys, sort=False):
        sweep = sweep.sort_values("batch")
        best = None
        for idx, latency in zip(sweep.index, sweep["latency_ms"], strict=True):
            if best is not None and latency < best * (1 - drop_pct / 100):
                flagged[idx] = True
            else:
                best = latency if best is None else max(best, latency)
    return flagged
