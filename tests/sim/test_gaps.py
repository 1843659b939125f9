"""Token gaps read from every instance at once (sim.gaps) are those read instance by instance."""

from array import array
from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from splitplan.sim import gaps


def _per_instance(insts, o, t_inst, join_iter, first_token):
    """The gaps as read one instance at a time (the plain form): (tbt_max, all_gaps)."""
    o, ji, ti = np.asarray(o), np.asarray(join_iter), np.asarray(t_inst)
    longest, every = np.full(len(o), np.nan), []
    longest[o == 1] = 0.0
    for inst in insts:
        ends = np.frombuffer(inst.ends, dtype=np.float64)
        mine = np.flatnonzero((ti == inst.idx) & (ji >= 0) & (o > 1))
        if not len(ends) or not len(mine):
            continue
        durations = np.diff(ends, prepend=np.nan)
        gap0 = ends[ji[mine]] - first_token[mine]
        for j, i in enumerate(mine):
            own = durations[ji[i] + 1:min(ji[i] + o[i] - 1, len(ends))]
            longest[i] = max(gap0[j], own.max(initial=0.0)) if np.isfinite(gap0[j]) else np.nan
        every.append(gap0)
        for step, duration in enumerate(durations):
            every.append(np.full(int(np.sum((ji[mine] + 1 <= step) & (step < ji[mine] + o[mine] - 1))), duration))
    return longest, (np.concatenate(every) if every else np.zeros(0))


@st.composite
def runs(draw):
    lengths = draw(st.lists(st.integers(0, 12), min_size=1, max_size=5))
    insts = [SimpleNamespace(idx=k, ends=array("d", np.cumsum(draw(st.lists(st.floats(0.001, 1.0), min_size=n, max_size=n)))))
             for k, n in enumerate(lengths)]
    n = draw(st.integers(0, 25))
    o, ti, ji, first = [], [], [], []
    for _ in range(n):
        k = draw(st.integers(-1, len(insts) - 1))
        ti.append(k)
        joined = k >= 0 and lengths[k] > 0 and draw(st.booleans())
        ji.append(draw(st.integers(0, lengths[k] - 1)) if joined else -1)
        o.append(draw(st.integers(1, 15)))
        first.append(draw(st.floats(-1.0, 0.0)) if joined else np.nan)
    return insts, np.array(o, np.int64), np.array(ti, np.int64), np.array(ji, np.int64), np.array(first, float)


@settings(max_examples=300, deadline=None)
@given(runs())
def test_gaps_are_those_read_instance_by_instance(run):
    insts, o, ti, ji, first = run
    longest, every = _per_instance(insts, o, ti, ji, first)
    np.testing.assert_array_equal(gaps.tbt_max(insts, o, ti, ji, first), longest)
    np.testing.assert_array_equal(gaps.all_gaps(insts, o, ti, ji, first), every)
