"""Every perf model implements the PerfModel protocol the simulator and the search rely on."""

import numpy as np

from splitplan import api
from splitplan.perf.model import PerfModel
from splitplan.perf.table import load_perf_db
from tests.conftest import PERF_DB


def test_analytic_and_measured_models_are_perf_models():
    analytic = api.instance("llama2-70b", "h100-80gb", 8, "lean")
    db = load_perf_db(str(PERF_DB))
    measured, splitwise = db.instance(analytic), db.instance(analytic, "splitwise-sim")
    for perf in (analytic, measured, splitwise):
        assert isinstance(perf, PerfModel)
        assert (perf.model, perf.hardware, perf.tp) == (analytic.model, analytic.hardware, 8)
    assert not analytic.measured and measured.measured and splitwise.measured
    measured.record_decode_steps([1, 10_000], [600, 600 * 10_000])  # the second is outside the table: counted
    assert measured.queries["decode"] == 2 and measured.extrapolated["decode"] == 1
    for fresh in (db.instance(analytic), db.instance(analytic, "splitwise-sim")):  # counted from nothing
        assert fresh.queries == {"prefill": 0, "decode": 0} == fresh.extrapolated
        fresh.prefill_time_s([1000])
        assert fresh.queries["prefill"] == 1


def test_a_decode_step_is_outside_the_table_only_beyond_its_measured_corners():
    db = load_perf_db(str(PERF_DB))
    measured = db.instance(api.instance("llama2-70b", "h100-80gb", 8, "lean"))
    batch_lo, batch_hi = measured.bat_x[0], measured.bat_x[-1]  # 1 and 64 requests
    ctx_lo, ctx_hi = measured.ctx_x[0], measured.ctx_x[-1]  # 192 and 8,256 tokens a request
    inside = [(batch_lo, batch_lo * ctx_lo), (batch_hi, batch_hi * ctx_hi), (8, 8 * 1000)]  # the corners belong to it
    outside = [(batch_hi + 1, (batch_hi + 1) * 1000), (8, 8 * (ctx_lo - 1)), (8, 8 * (ctx_hi + 1))]
    batch, context = (np.array(column, float) for column in zip(*inside, *outside, strict=True))
    assert measured.decode_outside(batch, context).tolist() == [False] * 3 + [True] * 3


def test_a_perf_db_measures_tp_layouts_only():
    """A pipelined instance of a measured TP degree is not the measured one: no rows, analytic."""
    from splitplan.specs.layout import Layout
    db = load_perf_db(str(PERF_DB))
    plain = api.instance("llama2-70b", "h100-80gb", 8, "lean")
    piped = api.instance("llama2-70b", "h100-80gb", Layout(8, pp=2), "lean")
    assert db.instance(plain).rows is not None and db.instance(piped).rows is None


def test_a_perf_db_lists_its_model_machine_and_tp_groups_once_each():
    groups = load_perf_db(str(PERF_DB)).groups()
    assert groups == sorted(set(groups)) and len(groups) == 12
    assert ("llama2-70b", "h100-80gb", 8) in groups and ("bloom-176b", "a100-80gb", 8) in groups
