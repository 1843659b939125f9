"""The gaps between a request's tokens, from the iterations its instance ran: the longest per
request (its range-maximum over its own iterations, all at once: `range_max`), and every gap
of every request (`all_gaps`, inter-token latency as serving benchmarks report it)."""

from __future__ import annotations

import numpy as np


def _stints(insts, o, t_inst, join_iter, first_token):
    """Per instance that ran iterations, the requests of its that decoded more than one token
    (`mine`), each one's first gap (`first_token` to the end of its first iteration), the
    instance's iteration durations (iteration k spans (ends[k-1], ends[k]]; k = 0 has no start:
    NaN) and each request's later iterations, [lo, hi) (its own, join + 1 .. join + o - 2)."""
    o_arr, ji, ti = np.asarray(o), np.asarray(join_iter), np.asarray(t_inst)
    for inst in insts:
        if not len(inst.ends):
            continue
        ends = np.frombuffer(inst.ends, dtype=np.float64)
        mine = np.flatnonzero((ti == inst.idx) & (ji >= 0) & (o_arr > 1))
        if len(mine):
            lo, hi = ji[mine] + 1, np.minimum(ji[mine] + o_arr[mine] - 1, len(ends))
            yield mine, ends[ji[mine]] - first_token[mine], np.diff(ends, prepend=np.nan), lo, hi


def tbt_max(insts, o, t_inst, join_iter, first_token) -> np.ndarray:
    """Longest gap between consecutive tokens of each request's last decode stint: from
    `first_token` (its first token, or its rejoining after a preemption) to the end of
    its first iteration, then each iteration it spent in; `o` counts the stint's tokens
    from that first one."""
    out = np.full(len(o), np.nan)
    out[np.asarray(o) == 1] = 0.0
    for mine, gap0, durations, lo, hi in _stints(insts, o, t_inst, join_iter, first_token):
        out[mine] = np.maximum(gap0, range_max(np.nan_to_num(durations, nan=0.0), lo, hi))
    return out


def all_gaps(insts, o, t_inst, join_iter, first_token) -> np.ndarray:
    """Every gap between consecutive tokens of each request's last decode stint (as `tbt_max`
    reads it), all requests together: o - 1 gaps a request. An iteration's duration counts
    once for every request in it past its first, found with a difference array over the
    requests' ranges: O(iterations + requests)."""
    out = []
    for _, gap0, durations, lo, hi in _stints(insts, o, t_inst, join_iter, first_token):
        cover = np.zeros(len(durations) + 1, dtype=np.int64)
        np.add.at(cover, lo, 1)
        np.add.at(cover, hi, -1)
        out += [gap0, np.repeat(durations, np.cumsum(cover[:-1]))]
    return np.concatenate(out) if out else np.zeros(0)


def range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo:hi]) per pair (0 for empty ranges), in O(len(values) + the ranges' lengths)
    time and O(len(values) + pairs) memory: one `np.maximum.reduceat` over the pairs sorted by
    start, where the stretches between one range's end and the next one's start are disjoint."""
    out = np.zeros(len(lo))
    hi = np.minimum(hi, len(values))
    ok = np.flatnonzero(hi > lo)
    if not len(ok):
        return out
    order = ok[np.argsort(lo[ok], kind="stable")]
    padded = np.append(values, 0.0)  # (a range may end at the last value)
    bounds = np.empty(2 * len(order), dtype=np.int64)
    bounds[0::2], bounds[1::2] = lo[order], hi[order]
    out[order] = np.maximum.reduceat(padded, bounds)[0::2]
    return out
