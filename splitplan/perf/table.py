"""A measured perf model: piecewise-linear interpolation of a latency table.

Timing comes from measurements (the splitwise `perf_model.csv` format or the
generic CSV, medians per point); memory, KV capacity and KV transfer stay with the
analytic instance, because they are physical, not measured there.

- Prefill: latency vs prompt tokens (single-prompt points; a batch counts as one
  prompt of its summed tokens, as splitwise-sim does).
- Decode: latency vs batch size at the table's reference context (the context of
  its batch sweep), plus, per request, the change with context measured at batch 1:
  f(B, C) = f_batch(B) + B x (f_ctx(C / B) - f_ctx(c_ref)), C the summed context.
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

import numpy as np
import pandas as pd

from splitplan.errors import SpecError
from splitplan.perf.measurements import read_measurements
from splitplan.perf.roofline import Fit, Instance, Latency, PassShortcuts
from splitplan.specs.hardware import load_hardware
from splitplan.specs.model import load_model


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

    decode_line = None  # a table is not linear in context: the simulator calls pass_time_s

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
        self.pre_y = pre.latency_ms.to_numpy(float) / 1e3
        ref = dec.groupby("context_tokens").batch.nunique().idxmax()  # the batch sweep's context
        by_batch = dec[dec.context_tokens == ref].sort_values("batch")
        self.ctx_ref = float(ref)
        self.bat_x = by_batch.batch.to_numpy(float)
        self.bat_y = by_batch.latency_ms.to_numpy(float) / 1e3
        by_ctx = dec[dec.batch == 1].sort_values("context_tokens")
        if len(by_ctx) >= 2:
            self.ctx_x = by_ctx.context_tokens.to_numpy(float)
            self.ctx_y = by_ctx.latency_ms.to_numpy(float) / 1e3
        else:  # no context sweep: context does not change the step time
            self.ctx_x, self.ctx_y = np.array([self.ctx_ref]), np.array([0.0])

    def __getattr__(self, name):  # memory, KV, transfer, hardware, model, engine: the analytic instance's
        return getattr(self.analytic, name)

    def __getstate__(self):
        return self.__dict__

    def __setstate__(self, state):
        self.__dict__.update(state)

    @property
    def fit(self) -> Fit:
        if self.rows is None or self.rows.empty:
            a = self.analytic
            return Fit(False, f"no measurements for {a.model.name} on {a.hardware.name} TP {a.tp} in {self.source}",
                       a.fit.weights_bytes_per_gpu, 0)
        return self.analytic.fit

    def _count(self, phase: str, outside) -> None:
        outside = np.asarray(outside)
        self.queries[phase] += int(outside.size)
        self.extrapolated[phase] += int(outside.sum())

    def _prefill(self, tokens):
        y, out = _interp(tokens, self.pre_x, self.pre_y)
        self._count("prefill", out)
        return y

    def _decode(self, batch, context_total):
        b = np.maximum(np.asarray(batch, float), 1.0)
        base, out_b = _interp(b, self.bat_x, self.bat_y)
        per_request = np.asarray(context_total, float) / b
        at, out_c = _interp(per_request, self.ctx_x, self.ctx_y)
        ref, _ = _interp(self.ctx_ref, self.ctx_x, self.ctx_y)
        self._count("decode", out_b | (out_c & (len(self.ctx_x) > 1)))
        return np.maximum(base + b * (at - ref), 0.0)

    def pass_time_s(self, prefill_seqs=0, prefill_tokens=0, prefill_sq_tokens=0, decode_seqs=0, decode_context_tokens=0):
        """Measured tables already hold any power cap: no slowdown is applied here."""
        pre, dec, ctx = np.broadcast_arrays(np.asarray(prefill_tokens, float), np.asarray(decode_seqs, float),
                                            np.asarray(decode_context_tokens, float))
        out = np.empty(pre.shape)
        has_prefill = pre > 0
        if has_prefill.any():
            out[has_prefill] = self._prefill(pre[has_prefill] + dec[has_prefill])
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
def load_perf_db(path: str) -> "PerfDb":
    """The measurement file at `path`, read and reduced to medians once per process
    (a validation loop or a sweep simulates many times against the same file)."""
    return PerfDb(path)


class PerfDb:
    """A measurement file, read once, giving a MeasuredInstance per (model, machine, TP)."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        points = read_measurements(path)
        # Rows may name catalog entries or spec files; instances are matched by spec name.
        self.points = points.assign(hardware=_spec_names(points.hardware, load_hardware), model=_spec_names(points.model, load_model))

    def groups(self) -> list[tuple[str, str, int]]:
        keys = self.points[["model", "hardware", "tp"]].drop_duplicates().itertuples(index=False)
        return sorted((m, h, int(t)) for m, h, t in keys)

    def instance(self, analytic: Instance) -> MeasuredInstance:
        pts = self.points
        rows = pts[(pts.model == analytic.model.name) & (pts.hardware == analytic.hardware.name) & (pts.tp == analytic.tp)]
        return MeasuredInstance(analytic, rows.reset_index(drop=True) if len(rows) else None, self.path)

    def require(self, analytic: Instance) -> MeasuredInstance:
        """The measured instance, or a SpecError naming what the file holds."""
        measured = self.instance(analytic)
        if measured.rows is None:
            have = ", ".join(f"{m} on {h} TP {t}" for m, h, t in self.groups())
            raise SpecError(f"{self.path}: no measurements for {analytic.model.name} on {analytic.hardware.name} "
                            f"TP {analytic.tp}; the file has: {have}")
        return measured
