"""The gaps between a request's tokens, from the iterations its instance ran: the longest per
request (its range-maximum over its own iterations, all at once: `range_max`), and every gap
of every request (`all_gaps`, inter-token latency as serving benchmarks report it)."""

from __future__ import annotations

import numpy as np


def _stints(insts, o, t_inst, join_iter, first_token):
    """Every instance's iterations end to end (instance by instance, in order), as durations
    (iteration k of an instance spans (ends[k-1], ends[k]]; its first has no start), and the
    requests that decoded more than one token (`mine`: grouped by instance in that order, each
    instance's in request order), each one's first gap (`first_token` to the end of its first
    iteration) and its later iterations as [lo, hi) in that sequence (its own, join + 1 .. join
    + o - 2), and where its instance's iterations begin in that sequence. One pass over the
    requests and the iterations, whatever the count of instances."""
    o_arr, ji, ti = np.asarray(o), np.asarray(join_iter), np.asarray(t_inst)
    lengths = np.array([len(inst.ends) for inst in insts], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ends = np.concatenate([np.frombuffer(inst.ends, dtype=np.float64) for inst in insts] or [np.zeros(0)])
    durations = np.diff(ends, prepend=np.nan)  # (an instance's first is the gap from the one before: never in a range)
    mine = np.flatnonzero((ti >= 0) & (ji >= 0) & (o_arr > 1))
    mine = mine[lengths[ti[mine]] > 0]
    mine = mine[np.argsort(ti[mine], kind="stable")]
    k, join = ti[mine], ji[mine]
    base = offsets[k]
    lo, hi = base + join + 1, base + np.minimum(join + o_arr[mine] - 1, lengths[k])
    return mine, ends[base + join] - first_token[mine], durations, lo, hi, base


def tbt_max(insts, o, t_inst, join_iter, first_token) -> np.ndarray:
    """Longest gap between consecutive tokens of each request's last decode stint: from
    `first_token` (its first token, or its rejoining after a preemption) to the end of
    its first iteration, then each iteration it spent in; `o` counts the stint's tokens
    from that first one."""
    out = np.full(len(o), np.nan)
    out[np.asarray(o) == 1] = 0.0
    mine, gap0, durations, lo, hi, _ = _stints(insts, o, t_inst, join_iter, first_token)
    out[mine] = np.maximum(gap0, range_max(np.nan_to_num(durations, nan=0.0), lo, hi))
    return out


def all_gaps(insts, o, t_inst, join_iter, first_token) -> np.ndarray:
    """Every gap between consecutive tokens of each request's last decode stint (as `tbt_max`
    reads it), all requests together, instance by instance (its requests' first gaps, then the
    rest): o - 1 gaps a request. An iteration's duration counts once for every request in it
    past its first, found with a difference array over the requests' ranges: O(iterations +
    requests)."""
    _, gap0, durations, lo, hi, base = _stints(insts, o, t_inst, join_iter, first_token)
    size = len(durations) + 1
    counts = np.cumsum(np.bincount(lo, minlength=size) - np.bincount(hi, minlength=size))[:-1]
    starts = np.concatenate([[0], np.cumsum(counts)])
    return np.insert(np.repeat(durations, counts), starts[base], gap0)  # (each instance's first gaps before its others)


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
