"""A measured perf model: piecewise-linear interpolation of a latency table.

Timing comes from measurements (the splitwise `perf_model.csv` format or the
generic CSV, medians per point); memory, KV capacity and KV transfer stay with the
analytic instance, because they are physical, not measured there.

- Prefill: latency vs prompt tokens (single-prompt points; a batch counts as one
  prompt of its summed tokens, as splitwise-sim does).
- Decode: latency vs batch size at the table's reference context (the context of
  its batch sweep), plus the cost of more or less context, linear in the summed
  context C: f(B, C) = g(B) + s x C with g(B) = f_batch(B) - s x B x c_ref. The slope
  s is the analytic instance's cost of reading one token's KV (bandwidth-bound
  attention), not the batch-1 context sweep's slope: that sweep rises 0.2-0.45 us
  per token in the Splitwise file, 13-18x the KV read, because a batch-1 attention
  kernel is latency-bound; scaled by a batch of 64 it would give steps far above
  anything measured (and its millisecond noise, multiplied by the batch, steps
  below). g is made non-decreasing, so f is monotone in batch and in context, and
  f never falls below the smallest decode step measured.
- Prefill: the single-prompt curve is made non-decreasing in tokens the same way.
- Mixed iterations (co-located): prefill of (prompt tokens + decode batch), as
  Splitwise approximated them.
- Power caps: a measured table already includes them (the splitwise file's
  `h100-80gb-pcap` rows), so no slowdown is applied.
- Outside the measured range the end segments are extended linearly, and every
  such query is counted in `extrapolated` (reported, never silent).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from splitplan.base.core import core
from splitplan.base.errors import SpecError
from splitplan.perf.roofline import Fit, Instance, Latency, PassShortcuts
from splitplan.specs.hardware import load_hardware
from splitplan.specs.layout import Layout
from splitplan.specs.model import load_model

if TYPE_CHECKING:
    import pandas as pd


def _interp(x, xs: np.ndarray, ys: np.ndarray):
    """np.interp with the end segments extended linearly; (values, outside-range mask)."""
    x = np.asarray(x, float)
    if len(xs) == 1:
        return np.full_like(x, ys[0]), x != xs[0]
    y = np.interp(x, xs, ys)
    lo, hi = x < xs[0], x > xs[-1]
    y = np.where(lo, ys[0] + (x - xs[0]) * (ys[1] - ys[0]) / (xs[1] - xs[0]), y)
    y = np.where(hi, ys[-1] + (x - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), y)
    return np.maximum(y, 0.0), lo | hi


class MeasuredInstance(PassShortcuts):
    """Quacks like `Instance` for the simulator, sizing and `perf`."""

    def __init__(self, analytic: Instance, rows: pd.DataFrame | None, source: str):
        self.analytic = analytic
        self.source = source
        self.extrapolated = {"prefill": 0, "decode": 0}
        self.queries = {"prefill": 0, "decode": 0}
        self.rows = rows
        if rows is None or rows.empty:
            return
        pre = rows[(rows.phase == "prefill") & (rows.batch == 1)].sort_values("prompt_tokens")
        dec = rows[rows.phase == "decode"]
        if pre.empty or dec.empty:
            raise SpecError(f"{source}: {analytic.model.name} on {analytic.hardware.name} TP {analytic.tp} needs "
                            "single-prompt prefill points and decode points")
        self.pre_x = pre.prompt_tokens.to_numpy(float)
        self.pre_y = np.maximum.accumulate(pre.latency_ms.to_numpy(float) / 1e3)
        ref = dec.groupby("context_tokens").batch.nunique().idxmax()  # the batch sweep's context
        by_batch = dec[dec.context_tokens == ref].sort_values("batch")
        by_ctx = dec[dec.batch == 1]
        self.ctx_x = np.sort(by_ctx.context_tokens.unique().astype(float))  # the context range measured
        self.ctx_slope = analytic.decode_line(1)[1]
        self.bat_x = by_batch.batch.to_numpy(float)
        self.bat_g = np.maximum.accumulate(by_batch.latency_ms.to_numpy(float) / 1e3 - self.ctx_slope * self.bat_x * ref)
        self.dec_floor = float(dec.latency_ms.min()) / 1e3

    measured = True  # perf.model.PerfModel: lookups outside the table are counted
    mixed_factor = 1.0  # a pass with prompt work and decodes: this times the table's prefill of their tokens

    # Memory, KV and what the instance is: the analytic instance's (physical, not measured).
    model = property(lambda self: self.analytic.model)
    hardware = property(lambda self: self.analytic.hardware)
    engine = property(lambda self: self.analytic.engine)
    tp = property(lambda self: self.analytic.tp)
    layout = property(lambda self: self.analytic.layout)
    factors = property(lambda self: self.analytic.factors)
    unit_machines = property(lambda self: self.analytic.unit_machines)
    unit_instances = property(lambda self: self.analytic.unit_instances)
    instances_on = property(lambda self: self.analytic.instances_on)
    machines_for = property(lambda self: self.analytic.machines_for)
    max_request_tokens = property(lambda self: self.fit.kv_capacity_tokens // self.layout.dp)
    kv_link_bytes_per_s = property(lambda self: self.analytic.kv_link_bytes_per_s)
    # what times a pass (as Instance.timing_sources): the measured table, every operator at once
    timing_sources = property(lambda self: {"passes": f"measured forward passes ({self.source})"})
    kv_bytes_per_token = property(lambda self: self.analytic.kv_bytes_per_token)

    @property
    def fit(self) -> Fit:
        if self.rows is None or self.rows.empty:
            a = self.analytic
            return Fit(False, f"no measurements for {a.model.name} on {a.hardware.name} TP {a.tp} in {self.source}",
                       a.fit.weights_bytes_per_gpu, 0)
        return self.analytic.fit

    def _count(self, phase: str, outside) -> None:
        outside = np.asarray(outside)
        self.counted(phase, int(outside.size), int(outside.sum()))

    def counted(self, phase: str, queries: int, outside: int) -> None:
        """`queries` lookups of `phase`, `outside` of them outside the measured range."""
        self.queries[phase] += queries
        self.extrapolated[phase] += outside

    def _prefill(self, tokens):
        y, out = _interp(tokens, self.pre_x, self.pre_y)
        self._count("prefill", out)
        return y

    def _decode(self, batch, context_total):
        b = np.maximum(np.asarray(batch, float), 1.0)
        context_total = np.asarray(context_total, float)
        base, _ = _interp(b, self.bat_x, self.bat_g)
        self.record_decode_steps(b, context_total)
        return np.maximum(base + self.ctx_slope * context_total, self.dec_floor)

    def record_decode_steps(self, batch, context_total) -> None:
        """Count decode steps taken (by `_decode`, or by the simulator through
        `decode_line`) and those outside the measured range."""
        self._count("decode", self.decode_outside(batch, context_total))

    @property
    def decode_ranges(self) -> tuple[float, float, float, float]:
        """(fewest, most decodes, least, most context per decode) measured (unbounded context: one point)."""
        if len(self.ctx_x) > 1:
            return self.bat_x[0], self.bat_x[-1], self.ctx_x[0], self.ctx_x[-1]
        return self.bat_x[0], self.bat_x[-1], -np.inf, np.inf

    def decode_outside(self, batch, context_total):
        """Which decode steps lie outside the measured batch or per-request context range."""
        b = np.maximum(np.asarray(batch, float), 1.0)
        per_request = np.asarray(context_total, float) / b
        fewest, most, least, longest = self.decode_ranges
        return (b < fewest) | (b > most) | (per_request < least) | (per_request > longest)

    @property
    def prefill_range(self) -> tuple[float, float]:
        """(fewest, most) prompt tokens measured (a pass's, its decodes counted as tokens)."""
        return self.pre_x[0], self.pre_x[-1]

    def _with_decodes(self, prefill_s, decode_seqs):
        """A pass with prompt work: the table's time for its tokens, `mixed_factor` times it where
        decodes ride along."""
        return prefill_s * np.where(np.asarray(decode_seqs) > 0, self.mixed_factor, 1.0)

    def pass_row(self, size: int, decode_seqs: float = 0.0) -> np.ndarray:
        """`pass_time_s(prefill_tokens=t, decode_seqs=decode_seqs)` for every t below `size`, not
        counted (the compiled loops count their lookups)."""
        return self._with_decodes(_interp(np.arange(size, dtype=float) + decode_seqs, self.pre_x, self.pre_y)[0], decode_seqs)

    def core_table(self, tokens: int) -> tuple[np.ndarray, tuple[float, ...]]:
        """For the compiled run (splitplan_core.run, MEASURED): a pass's time at each count of
        prompt and decode tokens below `tokens` (`pass_row`), and (MIXED_FACTOR ... CONTEXT_HI):
        `mixed_factor` and the ranges outside which a lookup is counted as extrapolated."""
        return self.pass_row(tokens), (self.mixed_factor, *self.prefill_range, *self.decode_ranges)

    def decode_line(self, batch):
        """As `Instance.decode_line` (a batch size or an array of them): the step is
        `max(g(B) + s x C, floor)`, exactly `pass_time_s(decode_seqs=batch, decode_context_tokens=C)`
        without the counting (the simulator counts its steps outside the measured range)."""
        base = _interp(np.maximum(np.asarray(batch, float), 1.0), self.bat_x, self.bat_g)[0]
        base = float(base) if np.ndim(base) == 0 else base
        return base, self.ctx_slope, self.dec_floor - base

    def pass_time_s(self, prefill_seqs=0, prefill_tokens=0, prefill_sq_tokens=0, decode_seqs=0, decode_context_tokens=0):
        """Measured tables already hold any power cap: no slowdown is applied here."""
        pre, dec, ctx = np.broadcast_arrays(np.asarray(prefill_tokens, float), np.asarray(decode_seqs, float),
                                            np.asarray(decode_context_tokens, float))
        out = np.empty(pre.shape)
        has_prefill = pre > 0
        if has_prefill.any():
            out[has_prefill] = self._with_decodes(self._prefill(pre[has_prefill] + dec[has_prefill]), dec[has_prefill])
        if (~has_prefill).any():
            out[~has_prefill] = self._decode(dec[~has_prefill], ctx[~has_prefill])
        return float(out) if out.ndim == 0 else out

    def explain(self, prompt_tokens=None, decode_batch: int = 0, decode_context_tokens: int = 0) -> Latency:
        before = sum(self.extrapolated.values())
        prompts = list(prompt_tokens or [])
        t = float(self.pass_time_s(len(prompts), float(sum(prompts)), float(sum(x * x for x in prompts)),
                                   decode_batch, decode_batch * decode_context_tokens))
        bound = "extrapolated" if sum(self.extrapolated.values()) > before else "measured"
        return Latency(t, bound, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


class SplitwiseSimInstance(MeasuredInstance):
    """splitwise-sim's reading of its own table (`performance_model=db`), for checking
    the simulator against it (`--perf-interp splitwise-sim`): one axis, the batch's
    token count, for both phases. A prefill of prompts totalling T tokens takes the
    median prompt time of the rows whose prompt_size x batch_size is T, interpolated;
    a decode step of B requests counts B tokens and takes the token time there, so
    neither the batch's context nor (below 128 requests, where that axis is
    extrapolated from its two smallest points) its size moves it; a mixed iteration
    takes 1.1x the prefill of its prompt tokens plus one per decoding request. Both
    curves are extended linearly past their ends, as splitwise-sim's interp1d."""

    mixed_factor = 1.1

    def __init__(self, analytic: Instance, rows: pd.DataFrame | None, source: str):
        self.analytic, self.source, self.rows = analytic, source, rows
        self.extrapolated = {"prefill": 0, "decode": 0}
        self.queries = {"prefill": 0, "decode": 0}
        if rows is None or rows.empty:
            return
        self.bt_x = self.pre_x = rows.batch_tokens.to_numpy(float)  # MeasuredInstance's prefill, on this axis
        self.pre_y = rows.prompt_ms.to_numpy(float) / 1e3
        self.token_y = rows.token_ms.to_numpy(float) / 1e3

    def _decode(self, batch, context_total):
        b = np.maximum(np.asarray(batch, float), 1.0)
        self.record_decode_steps(b, context_total)
        return _interp(b, self.bt_x, self.token_y)[0]

    @property
    def decode_ranges(self) -> tuple[float, float, float, float]:
        return self.bt_x[0], self.bt_x[-1], -np.inf, np.inf

    def decode_line(self, batch):
        step = _interp(np.maximum(np.asarray(batch, float), 1.0), self.bt_x, self.token_y)[0]
        return (float(step), 0.0, 0.0) if np.ndim(step) == 0 else (step, 0.0, np.zeros_like(step))



INTERPOLATIONS = {"splitplan": MeasuredInstance, "splitwise-sim": SplitwiseSimInstance}


def core_vectors(perfs) -> np.ndarray:
    """Per instance the pass formula's constants as the compiled core takes them (`pass_vector`);
    zeros for a measured instance, whose table times its passes instead."""
    return np.array([np.zeros(len(core.FIELDS)) if p.measured else p.pass_vector for p in perfs])


def _spec_names(column: pd.Series, load) -> pd.Series:
    """Catalog names and spec file paths as spec names (names of neither kept as they are)."""
    names = {}
    for value in column.unique():
        try:
            names[value] = load(value).name
        except SpecError:
            names[value] = value
    return column.map(names)


@functools.lru_cache(maxsize=8)
def load_perf_db(path: str) -> PerfDb:
    """The measurement file at `path`, read and reduced to medians once per process
    (a validation loop or a sweep simulates many times against the same file)."""
    return PerfDb(path)


class PerfDb:
    """A measurement file, read once, giving a MeasuredInstance per (model, machine, TP)."""

    def __init__(self, path: str | Path):
        from splitplan.perf.measurements import read_measurements  # (pandas, on first use: `import splitplan` skips it)
        self.path = str(path)
        points = read_measurements(path)
        # Rows may name catalog entries or spec files; instances are matched by spec name.
        self.points = points.assign(hardware=_spec_names(points.hardware, load_hardware), model=_spec_names(points.model, load_model))

    def groups(self) -> list[tuple[str, str, int]]:
        keys = self.points[["model", "hardware", "tp"]].drop_duplicates().itertuples(index=False)
        return sorted((m, h, int(t)) for m, h, t in keys)

    @functools.cached_property
    def batch_tokens(self) -> pd.DataFrame:
        from splitplan.perf.measurements import batch_token_medians
        table = batch_token_medians(self.path)
        return table.assign(hardware=_spec_names(table.hardware, load_hardware), model=_spec_names(table.model, load_model))

    def instance(self, analytic: Instance, interpolation: str = "splitplan") -> MeasuredInstance:
        """The (model, machine, TP) group of `analytic`, read as `interpolation` says:
        `splitplan` (MeasuredInstance) or `splitwise-sim` (SplitwiseSimInstance)."""
        if interpolation not in INTERPOLATIONS:
            raise SpecError(f"--perf-interp {interpolation}: choose {' or '.join(INTERPOLATIONS)}")
        pts = self.points if interpolation == "splitplan" else self.batch_tokens
        rows = pts[(pts.model == analytic.model.name) & (pts.hardware == analytic.hardware.family) & (pts.tp == analytic.tp)]
        if analytic.layout != Layout(analytic.tp):  # a perf-db measures TP layouts only
            rows = rows.iloc[:0]
        return INTERPOLATIONS[interpolation](analytic, rows.reset_index(drop=True) if len(rows) else None, self.path)

    def require(self, analytic: Instance, interpolation: str = "splitplan") -> MeasuredInstance:
        """The measured instance, or a SpecError naming what the file holds."""
        measured = self.instance(analytic, interpolation)
        if measured.rows is None:
            have = ", ".join(f"{m} on {h} TP {t}" for m, h, t in self.groups())
            raise SpecError(f"{self.path}: no measurements for {analytic.model.name} on {analytic.hardware.name} "
                            f"TP {analytic.tp}; the file has: {have}")
        return measured
