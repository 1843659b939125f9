"""Every perf model implements the PerfModel protocol the simulator and the search rely on."""

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
