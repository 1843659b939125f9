"""SLO evaluation (splitplan.slo): alone latencies, percentiles, limits, attainment."""

import numpy as np
import pytest

from splitplan import api
from splitplan.slo import achieved, alone_latencies, attainment_pct, meets
from splitplan.specs.slo import SloProfile

H100 = api.instance("llama2-70b", "h100-80gb", 8)


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
    from splitplan.errors import SpecError
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
