"""Calibration: recovers a known engine, reports honest errors, stays physical."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from splitplan import api
from splitplan.cli import app
from splitplan.perf import calibrate as cal
from splitplan.perf.measurements import flag_anomalies, read_measurements
from splitplan.specs.engine import load_engine
from tests.conftest import PERF_DB


def _synthetic_csv(tmp_path, engine="lean", noise=0.0, seed=0):
    """Generic-format measurements made by a known profile (with optional noise and repeats)."""
    inst = api.instance("llama2-70b", "h100-80gb", 4, engine)
    rng = np.random.default_rng(seed)
    rows = []
    for _repeat in range(3):
        for t in (128, 256, 512, 1024, 2048, 4096):
            rows.append(("h100-80gb", "llama2-70b", 4, "prefill", 1, t, 0, float(inst.prefill_time_s(t)) * 1e3))
        for b in (1, 4, 16, 64):
            for c in (512, 2048):
                rows.append(("h100-80gb", "llama2-70b", 4, "decode", b, 0, c, float(inst.decode_step_time_s(b, c)) * 1e3))
    frame = pd.DataFrame(rows, columns=["hardware", "model", "tp", "phase", "batch", "prompt_tokens", "context_tokens", "latency_ms"])
    frame["latency_ms"] *= np.exp(rng.normal(0, noise, len(frame)))
    path = tmp_path / "measured.csv"
    frame.to_csv(path, index=False)
    return path


@pytest.mark.slow
def test_fit_recovers_a_known_engine_from_a_generic_csv(tmp_path):
    path = _synthetic_csv(tmp_path, "lean")
    result = api.calibrate(str(path), engine="splitwise-vllm", folds=3)
    for group in result.report["groups"]:
        assert group["points"] in (6, 8)  # repeats reduced to medians
        assert group["mape_before_pct"] > 10  # the starting profile is a different engine
        assert group["mape_fit_pct"] < 1.5 and group["mape_cv_pct"] < 5


def test_noise_gives_honest_cross_validation(tmp_path):
    result = api.calibrate(str(_synthetic_csv(tmp_path, "lean", noise=0.05)), folds=3)
    for figures in result.report["overall"].values():
        assert figures["mape_cv_pct"] >= figures["mape_fit_pct"] * 0.8  # held-out error is not flattered


def test_fitted_factors_stay_within_physical_bounds(tmp_path):
    profile = api.calibrate(str(_synthetic_csv(tmp_path, "lean", noise=0.1)), folds=0).profile
    from splitplan.perf.calibrate import FIT_BOUNDS
    for factors in [profile.defaults, *profile.hardware_overrides.values()]:
        for name, (lower, upper, _) in FIT_BOUNDS.items():  # the fit's own bounds, tighter than the schema's
            assert lower <= getattr(factors, name) <= upper, name


def test_anomalies_are_the_failed_runs():
    points = read_measurements(PERF_DB)
    flagged = points[flag_anomalies(points)]
    assert set(zip(flagged.model, flagged.tp, flagged.batch, strict=True)) == {("llama2-70b", 2, 64)}


@pytest.mark.slow
def test_calibrated_profile_predicts_unseen_hardware_and_models_better_than_defaults():
    """Fit on one machine (or model) of the Splitwise data; the other is predicted at
    least as well as by the uncalibrated `lean` defaults."""
    points = cal.transfer_points(read_measurements(PERF_DB))
    lean = load_engine("lean")
    for column, train, test in (("hardware", "a100-80gb", "h100-80gb"), ("model", "llama2-70b", "bloom-176b")):
        mape = cal.transfer_mape(points, column, train, test, lean)
        assert set(mape) == {"prefill", "decode"}
        for phase, (calibrated, default) in mape.items():
            assert calibrated <= default, (column, test, phase, calibrated, default)


def test_cli_json_contract_and_profile_round_trip(tmp_path):
    path = _synthetic_csv(tmp_path, "lean")
    out = tmp_path / "fitted.yaml"
    result = CliRunner().invoke(app, ["calibrate", "--perf-db", str(path), "--output", str(out), "--folds", "3",
                                      "--format", "json", "--residuals", str(tmp_path / "res.csv")])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc) >= {"groups", "overall"}
    assert set(doc["groups"][0]) == {"model", "hardware", "tp", "phase", "points", "mape_before_pct", "mape_fit_pct", "mape_cv_pct"}
    assert set(doc["overall"]) == {"prefill", "decode"}
    saved = yaml.safe_load(out.read_text())
    assert saved["fit"]["points"] == 14 and "mape_pct" in saved["fit"]
    perf = CliRunner().invoke(app, ["perf", "--engine", str(out), "--tp", "4", "--format", "json"])
    assert perf.exit_code == 0, perf.output
    assert pd.read_csv(tmp_path / "res.csv").columns.tolist()[-3:] == ["before_ms", "fit_ms", "cv_ms"]


def test_cli_table_and_failures(tmp_path):
    path = _synthetic_csv(tmp_path)
    table = CliRunner().invoke(app, ["calibrate", "--perf-db", str(path), "--folds", "2"])
    assert table.exit_code == 0 and "Largest residuals when held out (2-fold)" in table.stdout and "Fitted defaults" in table.stdout
    no_cv = CliRunner().invoke(app, ["calibrate", "--perf-db", str(path), "--folds", "0"])
    assert no_cv.exit_code == 0 and "Largest residuals" in no_cv.stdout and "held out" not in no_cv.stdout
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    header = "hardware,model,tp,phase,batch,prompt_tokens,context_tokens,latency_ms\n"
    tp0, tp3, tp1 = tmp_path / "tp0.csv", tmp_path / "tp3.csv", tmp_path / "tp1.csv"
    tp0.write_text(header + "h100-80gb,llama2-70b,0,prefill,1,512,0,50\n")
    tp3.write_text(header + "h100-80gb,llama2-70b,3,prefill,1,512,0,50\n")
    tp1.write_text(header + "h100-80gb,llama2-70b,1,prefill,1,512,0,50\n")
    (tmp_path / "empty.csv").write_text(header)
    for args, needle in ((["--perf-db", str(bad)], "unknown columns"),
                         (["--perf-db", str(tp0)], "line 2: phase must be prefill or decode, tp >= 1"),
                         (["--perf-db", str(tp3)], "TP 3 does not divide the 8 GPUs of h100-80gb; fix or remove those rows"),
                         (["--perf-db", str(tp1)], "--engine lean-fp8"),
                         (["--perf-db", str(tmp_path / "empty.csv")], "no measurement rows"),
                         (["--perf-db", str(tmp_path / "none.csv")], "no such file"),
                         (["--perf-db", str(path), "--folds", "1"], "--folds 1")):
        result = CliRunner().invoke(app, ["calibrate", *args, "--output", str(tmp_path / "x.yaml")])
        assert result.exit_code == 2 and needle in result.stderr, result.stderr
        assert not (tmp_path / "x.yaml").exists()
    renamed = tmp_path / "unknown.csv"
    renamed.write_text(path.read_text().replace("llama2-70b", "llama2-70bb"))
    result = CliRunner().invoke(app, ["calibrate", "--perf-db", str(renamed)])
    assert result.exit_code == 2 and "did you mean 'llama2-70b'" in result.stderr


def test_plot_written(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "fit.png"
    result = CliRunner().invoke(app, ["calibrate", "--perf-db", str(_synthetic_csv(tmp_path)), "--folds", "2", "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_machines_and_models_given_as_files(tmp_path):
    """A CSV naming a hardware and a model file: the fitted overrides are found under the
    specs' names, so the profile predicts those files as well as the fit did."""
    root = Path(__file__).resolve().parents[2]
    gpu, llm = tmp_path / "my-gpu.yaml", tmp_path / "my-llama.yaml"
    gpu.write_text((root / "hardware_specs" / "h100-80gb.yaml").read_text())
    llm.write_text((root / "model_specs" / "llama2-70b.yaml").read_text())
    truth = {4: api.instance("llama2-70b", "h100-80gb", 4, "lean"), 8: api.instance("llama2-70b", "h100-80gb", 8, "lean")}
    slower = {4: 1.4, 8: 0.9}  # the two TP degrees need different factors: only per-group overrides fit both
    rows = [(str(gpu), str(llm), tp, "prefill", 1, t, 0, float(inst.prefill_time_s(t)) * 1e3 * slower[tp])
            for tp, inst in truth.items() for t in (256, 1024, 4096)]
    rows += [(str(gpu), str(llm), tp, "decode", b, 0, 1024, float(inst.decode_step_time_s(b, 1024)) * 1e3 * slower[tp])
             for tp, inst in truth.items() for b in (1, 8, 64)]
    path = tmp_path / "measured.csv"
    pd.DataFrame(rows, columns=["hardware", "model", "tp", "phase", "batch", "prompt_tokens", "context_tokens",
                                "latency_ms"]).to_csv(path, index=False)
    result = api.calibrate(str(path), folds=0)
    assert "my-gpu/tp8/my-llama" in result.profile.hardware_overrides
    assert result.report["overall"]["prefill"]["mape_fit_pct"] < 3
    for tp, inst in truth.items():
        fitted = api.instance(str(llm), str(gpu), tp, result.profile)
        assert float(fitted.prefill_time_s(1024)) == pytest.approx(float(inst.prefill_time_s(1024)) * slower[tp], rel=0.05)


@pytest.mark.slow
def test_each_held_out_prediction_comes_from_a_fit_without_its_fold(tmp_path):
    points = read_measurements(_synthetic_csv(tmp_path, "lean", noise=0.1)).reset_index(drop=True)
    base = load_engine("splitwise-vllm")
    result = cal.calibrate(points, base, k=3)
    fold = cal.folds(points, 3)
    for f in range(3):
        held = fold == f
        alone = cal.predict_ms(points[held].reset_index(drop=True), cal.fit_profile(points[~held], base))
        assert result.points.cv_ms[held].to_numpy() == pytest.approx(alone, rel=1e-9)


@pytest.mark.slow
def test_every_group_of_the_splitwise_measurements_cross_validates_within_8_percent():
    """Issue 27, item 13: with the power-capped H100 slowed for its whole prefill pass and the
    per-prompt cost of a batched prefill fitted per group, the README's calibration holds out
    every (model, machine, TP, phase) group within 8 % (the capped TP 8 prefill was at 10.4 %)."""
    result = api.calibrate(str(PERF_DB), "lean", 5, max_prefill_batch_tokens=2048, jobs=2)
    worst = max(result.report["groups"], key=lambda g: g["mape_cv_pct"])
    assert worst["mape_cv_pct"] <= 8.0, worst
    capped = [g for g in result.report["groups"] if g["hardware"] == "h100-80gb-cap70" and g["phase"] == "prefill"]
    assert len(capped) == 4 and all(g["mape_cv_pct"] <= 8.0 for g in capped)
