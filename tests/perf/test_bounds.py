"""Fitted factors stay under a sourced physical ceiling, and a fit that ends on a bound says so
(issue 54, item 5): compute_efficiency is at most the best GEMM throughput measured on the GPU."""

import pandas as pd
import pytest
from typer.testing import CliRunner

from splitplan import api
from splitplan.cli import app
from splitplan.perf.bounds import at_bounds, bounds
from splitplan.specs.hardware import load_hardware

TABLE = {"compute_efficiency": (0.05, 1.0, 1.0), "memory_efficiency": (0.5, 1.0, 1.0), "decode_overhead_s": (0.0, 0.2, 1e-2)}


def test_the_ceiling_is_the_measured_gemm_throughput_over_the_sustained_peak():
    h200 = load_hardware("h200-141gb")
    ceiling, why = h200.compute_efficiency_ceiling("fp8")
    assert ceiling == pytest.approx(1466 / (1979 * 0.8))  # (hand-computed: the hardware file's figures)
    assert "h200-141gb" in why and "aiconfigurator-core 0.12.0" in why
    assert load_hardware("mi300x-192gb").compute_efficiency_ceiling("fp8")[0] == 1.0  # (nothing measured: the peak)
    assert load_hardware("h100-80gb").compute_efficiency_ceiling("bf16")[0] == 1.0  # (measured above the sustained estimate)


def test_bounds_take_the_lowest_ceiling_of_the_machines_a_fit_covers():
    names = list(TABLE)
    lower, upper, why = bounds(TABLE, names, [load_hardware("h200-141gb"), load_hardware("h100-80gb")], "fp8")
    assert upper[0] == pytest.approx(min(1466 / (1979 * 0.8), 1377 / (1979 * 0.8))) and "h100-80gb" in why["compute_efficiency"]
    assert list(upper[1:]) == [1.0, 0.2] and list(lower) == [0.05, 0.5, 0.0]
    ended = at_bounds(names, [upper[0], 0.7, 0.0], lower, upper, why)
    assert set(ended) == {"compute_efficiency", "decode_overhead_s"}
    assert ended["compute_efficiency"].startswith("upper bound 0.8") and ended["decode_overhead_s"] == "lower bound 0"
    assert at_bounds(names, [0.5, 0.7, 0.01], lower, upper, why) == {}


def _too_fast(tmp_path):
    """fp8 prefill passes of Llama-3.1-8B on one H200 timed faster than the H200's measured fp8 GEMMs
    allow (lean-fp8's passes at 0.7 of their time), and its decode steps as lean-fp8 times them."""
    inst = api.instance("llama3.1-8b", "h200-141gb", 1, "lean-fp8")
    rows = []
    for t in (1024, 2048, 4096, 8192, 16384):
        fast = inst.prefill_time_s(t) * 0.7  # (well past the ceiling, so the fit presses on it)
        rows.append(("h200-141gb", "llama3.1-8b", 1, "prefill", 1, t, 0, float(fast) * 1e3))
    for b in (1, 8, 32):
        rows.append(("h200-141gb", "llama3.1-8b", 1, "decode", b, 0, 1024, float(inst.decode_step_time_s(b, 1024)) * 1e3))
    path = tmp_path / "measured.csv"
    pd.DataFrame(rows, columns=["hardware", "model", "tp", "phase", "batch", "prompt_tokens", "context_tokens",
                                "latency_ms"]).to_csv(path, index=False)
    return path


def test_a_fit_pressed_past_the_ceiling_stops_on_it_and_says_so(tmp_path):
    path = _too_fast(tmp_path)
    profile = api.calibrate(str(path), engine="lean-fp8", folds=0).profile
    ceiling = load_hardware("h200-141gb").compute_efficiency_ceiling("fp8")[0]
    for factors in [profile.defaults, *profile.hardware_overrides.values()]:
        assert factors.compute_efficiency <= ceiling * (1 + 1e-9)
    assert "h200-141gb's best measured fp8 GEMMs" in profile.fit["at_bound"]["defaults.compute_efficiency"]
    result = CliRunner().invoke(app, ["calibrate", "--perf-db", str(path), "--engine", "lean-fp8", "--folds", "0",
                                      "--output", str(tmp_path / "fitted.yaml")])
    assert result.exit_code == 0, result.output
    assert "warning: fitted factor compute_efficiency ended on its upper bound 0.926: h200-141gb's best measured fp8 GEMMs" in result.stderr
    assert "at_bound:" in (tmp_path / "fitted.yaml").read_text()
