"""A schedule the cluster follows: windows on the peak plan's pools, instances started ahead, and
what following it costs against the static peak plan."""

import csv
import io
import json

import pytest
from typer.testing import CliRunner

from splitplan import api
from splitplan.base.errors import SpecError
from splitplan.cli import app
from splitplan.specs.hardware import load_hardware
from splitplan.specs.layout import Layout
from splitplan.specs.roles import Pool, Role
from splitplan.workflows.schedule import ENGINE_START_S, WEIGHT_LOAD_BYTES_PER_S, default_lead_s, follow
from splitplan.workflows.studies import WindowsResult


def _plan(prompt: int, token: int, token_hw: str = "h100-80gb"):
    return api.plan_from_pools([Pool(Role.PROMPT, "h100-80gb", Layout(8), prompt), Pool(Role.TOKEN, token_hw, Layout(8), token)])


def _windows(counts: dict[int, tuple[int, int]], window_s: float = 600.0) -> WindowsResult:
    rows, plans = [], []
    for n, (k, (prompt, token)) in enumerate(sorted(counts.items())):
        rows.append({"window": n, "start_s": k * window_s, "requests": 10, "rate_rps": 1.0, "error": None})
        plans.append(_plan(prompt, token))
    return WindowsResult(window_s, tuple(rows), tuple(plans))


def test_following_the_windows_costs_each_windows_machines_and_the_lead_of_those_it_adds():
    windows = _windows({0: (2, 1), 1: (3, 1), 2: (2, 1), 3: (1, 2)})
    schedule = follow(None, windows, "llama2-70b", "chat", api.OptimizeOptions(), lead_s=180)
    assert schedule.pools == ("prompt h100-80gb TP 8", "token h100-80gb TP 8")
    assert [r["instances"] for r in schedule.rows] == [[2, 1], [3, 1], [2, 1], [1, 2]]
    # window 1 adds a prompt machine and window 3 a token machine: each starts 180 s ahead
    assert [r["scale_up_from_s"] for r in schedule.rows] == [0, 420, 1200, 1620]
    price = load_hardware("h100-80gb").price_usd_per_hour
    machine_hours = (3 + 4 + 3 + 3) * 600 / 3600 + 2 * 180 / 3600
    assert schedule.followed["cost_usd"] == pytest.approx(machine_hours * price)
    assert schedule.followed["gpu_hours"] == pytest.approx(machine_hours * 8)
    assert schedule.followed["static_cost_usd"] == pytest.approx(4 * price * 4 * 600 / 3600)  # the peak: 4 machines
    assert schedule.followed["saving_pct"] == pytest.approx((1 - machine_hours / (4 * 4 * 600 / 3600)) * 100)


def test_a_window_without_requests_keeps_the_instances_before_it():
    schedule = follow(None, _windows({0: (2, 1), 2: (3, 1)}), "llama2-70b", "chat", api.OptimizeOptions(), lead_s=0)
    assert [(r["window"], r["start_s"], r["end_s"], r["instances"], r["source"]) for r in schedule.rows] == [
        (0, 0, 600, [2, 1], "planned"), (1, 600, 1200, [2, 1], "held: no requests"), (2, 1200, 1800, [3, 1], "planned")]
    frame = schedule.to_frame()
    assert list(frame.columns) == ["window", "start_s", "end_s", "prompt h100-80gb TP 8", "token h100-80gb TP 8", "machines",
                                   "gpus", "cost_usd_per_hour", "scale_up_from_s", "source"]


def test_a_lead_longer_than_a_window_is_refused_and_the_estimate_is_capped_at_one():
    with pytest.raises(SpecError, match="--scale-up-lead 700 s: must be from 0 to the window"):
        follow(None, _windows({0: (2, 1)}), "llama2-70b", "chat", api.OptimizeOptions(), lead_s=700)
    short = follow(None, _windows({0: (2, 1), 1: (3, 1)}, window_s=60), "llama2-70b", "chat", api.OptimizeOptions())
    assert short.lead_s == 60
    assert short.to_json()["scale_up_lead_source"] == "estimate (engine start and weight load), 180 s capped at the window"
    assert short.rows[1]["scale_up_from_s"] == 0


def test_the_default_lead_is_the_engine_start_and_the_weights_per_gpu_read_rounded_up_to_a_minute():
    plan = _plan(2, 1)
    weights = api.instance("llama2-70b", "h100-80gb", 8, "vllm").fit.weights_bytes_per_gpu  # 69B params x 2 bytes / 8
    assert 15e9 < weights < 20e9
    assert default_lead_s(plan, "llama2-70b", "vllm") == 180 == -(-(ENGINE_START_S + weights / WEIGHT_LOAD_BYTES_PER_S) // 60) * 60


def test_optimize_window_writes_the_schedule_and_its_cost(tmp_path):
    out = tmp_path / "w"
    args = ["optimize", "--window", "10m", "--hardware", "h100-80gb", "--tp", "8"]
    result = CliRunner().invoke(app, [*args, "--scale-up-lead", "2m", "--output-dir", str(out), "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    schedule = doc["schedule"]
    assert schedule["scale_up_lead_s"] == 120 and schedule["pools"] == ["prompt h100-80gb TP 8", "token h100-80gb TP 8"]
    rows = list(csv.DictReader(io.StringIO((out / "schedule.csv").read_text())))
    assert len(rows) == len(schedule["windows"]) == 6  # the embedded trace's hour in 10-minute windows
    assert json.loads((out / "windows.json").read_text())["schedule"] == schedule
    peak = max(float(r["cost_usd_per_hour"]) for r in rows)
    assert schedule["static_cost_usd"] == pytest.approx(peak * 6 * 600 / 3600)
    assert schedule["gpu_hours"] < schedule["static_gpu_hours"] and 0 < schedule["saving_pct"] < 100
    table = CliRunner().invoke(app, args).stdout
    assert "Schedule on the peak plan's pools" in table and "GPU-hours" in table and "180 s ahead" in table
    for bad, needle in ((["--scale-up-lead", "11m"], "--scale-up-lead 660 s: must be from 0 to the window"),
                        (["--scale-up-lead", "soon"], "--scale-up-lead 'soon': give a duration")):
        failed = CliRunner().invoke(app, [*args, *bad])
        assert failed.exit_code == 2 and needle in failed.output, failed.output
    failed = CliRunner().invoke(app, ["optimize", "--scale-up-lead", "60"])
    assert failed.exit_code == 2 and "--scale-up-lead times the schedule of a --window plan" in failed.output
