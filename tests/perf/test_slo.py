"""SLO evaluation (splitplan.perf.slo): alone latencies, percentiles, limits, attainment."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitplan import api
from splitplan.perf.slo import achieved, alone_latencies, attainment_pct, meets
from splitplan.specs.slo import SloProfile, load_slo

H100 = api.instance("llama2-70b", "h100-80gb", 8, "lean")


def _line(**limits):
    profile = SloProfile(name="t", description="t", reference={"hardware": "h100-80gb", "tp": 8}, **limits)
    return profile.lines()[0]


def test_alone_is_prefill_then_batch_one_steps_at_the_mean_context():
    p, o = np.array([1000, 3000]), np.array([1, 201])
    ref = alone_latencies(H100, p, o)
    step = H100.decode_step_time_s(1, np.array([1000, 3100]))
    assert ref.ttft_s == pytest.approx(H100.prefill_time_s(p), rel=1e-12)
    assert ref.tbt_s == pytest.approx(step, rel=1e-12)
    assert ref.e2e_s == pytest.approx(ref.ttft_s + step * np.array([0, 200]), rel=1e-12)
    # TBT as measured, (E2E - TTFT) / output: 0 for a one-token answer, while the slowdown
    # denominator (one step) stays positive
    assert ref.value("tbt") == pytest.approx(step * np.array([0, 200 / 201]), rel=1e-12)
    assert ref.tbt_s[0] > 0


def test_achieved_is_the_percentile_in_the_line_unit():
    values = np.linspace(0.1, 1.0, 10)  # seconds
    absolute = _line(ttft={"p50": {"max_ms": 500}})
    assert achieved(absolute, values, None) == pytest.approx(np.percentile(values, 50) * 1e3)
    ref = alone_latencies(H100, np.full(10, 1000), np.full(10, 10))
    slow = _line(ttft={"p90": {"slowdown": 5}})
    assert achieved(slow, values, ref) == pytest.approx(np.percentile(values / ref.ttft_s, 90))


def test_meets_at_the_limit_and_not_beyond_nor_without_a_value():
    line = _line(tbt={"p99": {"max_ms": 50}})
    assert meets(line, 50.0)
    assert not meets(line, 50.01)
    assert not meets(line, float("inf"))
    assert not meets(line, float("nan"))


def test_rejected_requests_count_as_misses():
    line = _line(e2e={"p50": {"max_ms": 1000}})
    values = np.array([0.1, 0.2, np.nan, np.nan])
    assert attainment_pct(line, values, None) == pytest.approx(50.0)
    assert not meets(line, achieved(line, np.array([0.1, np.nan, np.nan]), None))


def test_a_users_slo_file_needs_no_description_and_a_bare_number_names_the_fix(tmp_path):
    """SLO files as users write them (issue 27): description optional; `p99: 2000` could be ms or a
    slowdown, so it is refused with both spellings; a misspelt key suggests the known one."""
    from splitplan.base.errors import SpecError
    from splitplan.specs.slo import load_slo
    plain = tmp_path / "plain.yaml"
    plain.write_text("ttft:\n  p99: {max_ms: 2000}\n")
    assert [line.label for line in load_slo(str(plain)).lines()] == ["TTFT p99"]
    bare = tmp_path / "bare.yaml"
    bare.write_text("ttft:\n  p99: 2000\n")
    with pytest.raises(SpecError, match=r"ttft.p99: write the limit as \{max_ms: 2000\} \(milliseconds\) or \{slowdown: 2000\}"):
        load_slo(str(bare))
    misspelt = tmp_path / "misspelt.yaml"
    misspelt.write_text("tfft:\n  p99: {max_ms: 2000}\n")
    with pytest.raises(SpecError, match="unknown key 'tfft'; did you mean 'ttft'"):
        load_slo(str(misspelt))


# --- inter-token latency (issue 28, item 2) ----------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.001, 1.0), st.integers(0, 5)), min_size=1, max_size=30), st.floats(0, 100))
def test_gaps_read_as_their_expanded_sample(pairs, q):
    from splitplan.perf.slo import Gaps
    values, weights = np.array([v for v, _ in pairs]), np.array([w for _, w in pairs], dtype=float)
    if weights.sum() == 0:
        return
    expanded = np.repeat(values, weights.astype(int))
    gaps = Gaps(values, weights)
    for each in (q, 50.0, 99.0, q):  # (one distribution read at several percentiles: it is sorted once)
        assert gaps.percentile(each) == pytest.approx(float(np.percentile(expanded, each)), rel=1e-12, abs=1e-15)
    assert Gaps(values, weights).share_within(float(np.median(values))) == pytest.approx(
        float(np.mean(expanded <= np.median(values))))


def test_itl_and_tpot_lines_are_absolute(tmp_path):
    from splitplan.base.errors import SpecError
    good = tmp_path / "today.yaml"
    good.write_text("name: today\nttft: {p99: {max_ms: 2000}}\nitl: {p99: {max_ms: 100}}\ntpot: {p50: {max_ms: 40}}\n")
    lines = [x.label for x in load_slo(str(good)).lines()]
    assert lines == ["TTFT p99", "ITL p99", "TPOT p50"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nreference: {hardware: a100-80gb, tp: 8}\nitl: {p99: {slowdown: 2}}\n")
    with pytest.raises(SpecError, match="itl limits are absolute"):
        load_slo(str(bad))


def test_an_itl_line_sees_the_stalls_a_per_request_tbt_hides(tmp_path):
    """A co-located plan (prefill priority) meets TBT p99 <= 100 ms while its inter-token gaps
    reach past it: with an ITL p99 line the planner sizes it for the gaps, its prediction is
    the simulator's (the replay), and the simulation meets the line."""
    from splitplan.workflows.simulation import Setup, plan_pools
    from splitplan.workload.trace import default_trace_path, load_trace, resample_poisson
    trace = resample_poisson(load_trace(default_trace_path()), 4.0, 60.0, np.random.default_rng(3))
    tbt = tmp_path / "chat-tbt.yaml"  # (chat's limits before it moved to ITL)
    tbt.write_text("name: chat-tbt\nttft: {p50: {max_ms: 500}, p99: {max_ms: 2000}}\ntbt: {p50: {max_ms: 50}, p99: {max_ms: 100}}\n")
    tbt_only = api.optimize(trace, "llama2-70b", str(tbt), ["a100-80gb", "h100-80gb"], tp=8, mode="colocated", engine="lean")
    sim = Setup("llama2-70b", str(tbt), "lean").simulate(tbt_only.problem.trace, plan_pools(tbt_only.plan)).summary
    assert sim.tbt_ms["p99"] <= 100 < sim.itl_ms["p99"]
    slo = tmp_path / "chat-itl.yaml"
    slo.write_text("name: chat-itl\nttft: {p99: {max_ms: 2000}}\nitl: {p99: {max_ms: 100}}\n")
    sized = api.optimize(trace, "llama2-70b", str(slo), ["a100-80gb", "h100-80gb"], tp=8, mode="colocated", engine="lean")
    again = Setup("llama2-70b", str(slo), "lean").simulate(sized.problem.trace, plan_pools(sized.plan)).summary
    assert sized.plan.predicted["itl"]["p99"] == pytest.approx(again.itl_ms["p99"], rel=1e-9)
    assert again.itl_ms["p99"] <= 100 and all(line.met for line in again.slo)
    assert sized.plan.cost_usd_per_hour > tbt_only.plan.cost_usd_per_hour


def test_a_split_plans_predicted_gaps_are_the_simulators_within_10_percent():
    """Split plans: the planner's gap distribution (each request's mean step, its first gap
    carrying the KV transfer and, as often as its token instance is busy, the wait for the
    running iteration) against the simulator's, on a busy token pool."""
    from splitplan.workflows.simulation import Setup, plan_pools
    from splitplan.workload.trace import load_workload, resample_poisson
    trace = resample_poisson(load_workload("azure-code"), 8.0, 60.0, np.random.default_rng(3))
    result = api.optimize(trace, "llama2-70b", "chat", ["h100-80gb", "a100-80gb"], tp=8, mode="split")
    simulated = Setup("llama2-70b", "chat").simulate(result.problem.trace, plan_pools(result.plan)).summary
    for q in ("p50", "p90", "p99"):
        assert result.plan.predicted["itl"][q] == pytest.approx(simulated.itl_ms[q], rel=0.10), q
