"""Design studies: compare (four scenarios) and sweep, through the API and the CLI."""

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from splitplan import api
from splitplan.base.errors import SpecError
from splitplan.cli import app
from splitplan.specs.design import load_designs
from splitplan.specs.layout import Layout
from splitplan.workload.trace import default_trace_path, load_trace

DESIGNS = """description: small study
designs:
  - {name: Base-H, mixed: h100-80gb, tp: 8}
  - {name: Split-HH, prompt: h100-80gb, token: h100-80gb, tp: 8}
  - {name: Split-HA, prompt: h100-80gb, token: a100-80gb, tp: 8}
"""


@pytest.fixture
def designs(tmp_path):
    path = tmp_path / "designs.yaml"
    path.write_text(DESIGNS)
    return str(path)


@pytest.fixture(scope="module")
def trace():
    return load_trace(default_trace_path())


def test_shipped_splitwise_designs():
    spec = load_designs("splitwise-designs")
    assert [d.name for d in spec.designs] == ["Baseline-A100", "Baseline-H100", "Splitwise-AA", "Splitwise-HH",
                                             "Splitwise-HA", "Splitwise-HHcap"]
    assert not spec.get("Baseline-A100").split and spec.get("Splitwise-HA").token == "a100-80gb"


def test_iso_power_rates_within_budget_and_ratio(designs, trace):
    result = api.compare(designs, "iso-power", trace, budget_machines={"h100-80gb": 6}, duration_s=30)
    budget_kw = 6 * 10.2
    assert result.budget == {"max_power_kw": pytest.approx(budget_kw)}
    for r in result.designs:
        assert r.plan is not None and r.plan.power_kw <= budget_kw + 1e-9 and r.max_rate_rps > 0
    base = next(r for r in result.designs if r.design == result.baseline)
    other = next(r for r in result.designs if r.design != result.baseline)
    assert result.ratio(other) == pytest.approx(other.max_rate_rps / base.max_rate_rps)
    frame = result.to_frame()
    assert list(frame.design) == ["Base-H", "Split-HH", "Split-HA"]
    doc = result.to_json()
    assert set(doc) >= {"schema_version", "scenario", "designs"}
    assert set(doc["designs"][0]) >= {"design", "prompt_machines", "token_machines", "mixed_machines",
                                      "cost_usd_per_hour", "power_kw", "max_rate_rps"}


def test_iso_throughput_cost_reports_the_traces_rate_and_a_bigger_budget_never_lowers_rate(designs, trace):
    result = api.compare(designs, "iso-throughput-cost", trace, rate=8.0, duration_s=30)
    assert all(r.max_rate_rps == 8.0 and r.plan is not None for r in result.designs)
    small = api.compare(designs, "iso-cost", trace, max_cost_per_hour=120, duration_s=30)
    big = api.compare(designs, "iso-cost", trace, max_cost_per_hour=240, duration_s=30)
    for a, b in zip(small.designs, big.designs, strict=True):
        assert b.max_rate_rps >= a.max_rate_rps


def test_jobs_do_not_change_the_answer(designs, trace):
    one = api.compare(designs, "iso-throughput-power", trace, rate=6.0, duration_s=30, jobs=1).to_json()
    two = api.compare(designs, "iso-throughput-power", trace, rate=6.0, duration_s=30, jobs=2).to_json()
    assert one == two


def test_budget_errors(designs, trace):
    with pytest.raises(SpecError, match="exactly one budget"):
        api.compare(designs, "iso-power", trace)
    with pytest.raises(SpecError, match="choose one of"):
        api.compare(designs, "iso-speed", trace)
    with pytest.raises(SpecError, match="design 'nope'"):
        api.compare(designs, "iso-throughput-cost", trace, baseline="nope")


def test_compare_cli_json_csv_plot(designs, tmp_path):
    runner = CliRunner()
    args = ["compare", "--designs", designs, "--scenario", "iso-throughput-cost", "--rate", "5", "--duration", "30"]
    doc = json.loads(runner.invoke(app, args + ["--format", "json"]).stdout)
    assert doc["scenario"] == "iso-throughput-cost" and len(doc["designs"]) == 3
    csv = runner.invoke(app, args + ["--format", "csv"]).stdout
    assert csv.splitlines()[0].startswith("design,prompt_machines,token_machines,mixed_machines")
    table = runner.invoke(app, args + ["--plot", str(tmp_path / "c.png")])
    assert table.exit_code == 0 and "Split-HA" in table.stdout
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG" and (tmp_path / "c.png").stat().st_size > 5000
    bad = runner.invoke(app, ["compare", "--designs", designs, "--scenario", "iso-power"])
    assert bad.exit_code == 2 and "exactly one budget" in bad.stderr


def test_bad_designs_file(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text("designs:\n  - {name: X, prompt: h100-80gb}\n")
    with pytest.raises(SpecError, match="needs both prompt and token"):
        load_designs(str(path))
    path2 = tmp_path / "e.yaml"
    path2.write_text("designs:\n  - {name: X, mixed: h100-80gbb}\n")
    with pytest.raises(SpecError, match="did you mean 'h100-80gb'"):
        load_designs(str(path2))


def test_sweep_designs_and_plan(designs, trace, tmp_path):
    result = api.sweep([3.0, 12.0], trace, designs=designs, only=["Split-HH"], duration_s=30)
    frame = result.to_frame()
    assert list(frame.rate_rps) == [3.0, 12.0] and (frame.cost_per_million_tokens_usd > 0).all()
    assert frame.cost_usd_per_hour.is_monotonic_increasing
    fixed = api.sweep([2.0, 20.0], trace, pools=[("prompt", "h100-80gb", 8, 1), ("token", "h100-80gb", 8, 1)],
                      slo="chat", duration_s=30).to_frame()
    assert fixed.ttft_p99_ms.iloc[1] > fixed.ttft_p99_ms.iloc[0]  # more load, longer queues
    out = tmp_path / "sweep.csv"
    result = CliRunner().invoke(app, ["sweep", "--rates", "2:8:2", "--designs", designs, "--design", "Base-H",
                                      "--duration", "30", "--output", str(out), "--plot", str(tmp_path / "s.png")])
    assert result.exit_code == 0, result.output
    assert len(pd.read_csv(out)) == 2 and (tmp_path / "s.png").stat().st_size > 5000
    bad = CliRunner().invoke(app, ["sweep", "--rates", "a,b", "--designs", designs])
    assert bad.exit_code == 2 and "--rates 'a,b'" in bad.stderr


def test_peak_window_is_the_busiest_among_equal_costs():
    from splitplan.search.types import Plan, SizedPool
    from splitplan.workflows.studies import WindowsResult
    same = Plan((SizedPool.of("h100-80gb", 8, Layout(8), 1),), (SizedPool.of("h100-80gb", 8, Layout(8), 1),), (), 76.0, 20.4)
    rows = ({"rate_rps": 0.5, "requests": 30}, {"rate_rps": 4.0, "requests": 240}, {"rate_rps": 1.0, "requests": 60})
    assert WindowsResult(600, rows, (same, same, same)).peak == 1
    cheaper = Plan((SizedPool.of("a100-80gb", 8, Layout(8), 1),), (SizedPool.of("a100-80gb", 8, Layout(8), 1),), (), 35.2, 13.0)
    assert WindowsResult(600, rows, (same, cheaper, None)).peak == 0  # cost first
    assert WindowsResult(600, rows, (None, None, None)).peak is None
