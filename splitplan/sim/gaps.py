"""The longest gap between a request's tokens, from the iterations its instance ran:
a sparse table answers each request's range-maximum over its own iterations at once."""

from __future__ import annotations

import numpy as np


def tbt_max(insts, o, t_inst, join_iter, first_token) -> np.ndarray:
    """Longest gap between consecutive tokens of each request's last decode stint: from
    `first_token` (its first token, or its rejoining after a preemption) to the end of
    its first iteration, then each iteration it spent in; `o` counts the stint's tokens
    from that first one."""
    n = len(o)
    out = np.full(n, np.nan)
    o_arr = np.asarray(o)
    ji = np.asarray(join_iter)
    ti = np.asarray(t_inst)
    out[o_arr == 1] = 0.0
    for inst in insts:
        if not inst.ends:
            continue
        ends = np.asarray(inst.ends)
        starts_ = np.concatenate([[np.nan], ends[:-1]])
        durations = ends - starts_  # iteration k spans (ends[k-1], ends[k]]; k=0 has no start
        mine = np.flatnonzero((ti == inst.idx) & (ji >= 0) & (o_arr > 1))
        if not len(mine):
            continue
        first_end = ends[ji[mine]]
        gap0 = first_end - first_token[mine]
        # later gaps: iterations join+1 .. join+o-2 (the request's own iterations)
        lo, hi = ji[mine] + 1, ji[mine] + o_arr[mine] - 1
        table = _sparse_max(np.nan_to_num(durations, nan=0.0))
        out[mine] = np.maximum(gap0, _range_max(table, lo, hi))
    return out


def _sparse_max(values: np.ndarray) -> list[np.ndarray]:
    table = [values]
    k = 1
    while 2 * k <= len(values):
        prev = table[-1]
        table.append(np.maximum(prev[:-k], prev[k:]))
        k *= 2
    return table


def _range_max(table: list[np.ndarray], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo:hi]) per pair (0 for empty ranges)."""
    length = hi - lo
    out = np.zeros(len(lo))
    ok = length > 0
    if not ok.any():
        return out
    level = np.floor(np.log2(np.maximum(length[ok], 1))).astype(int)
    width = 1 << level
    a = np.array([table[k][s] for k, s in zip(level, lo[ok])])
    b = np.array([table[k][e - w] for k, e, w in zip(level, hi[ok], width)])
    out[ok] = np.maximum(a, b)
    return out
