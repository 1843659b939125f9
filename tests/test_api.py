"""The Python API documented in docs/API.md."""

import dataclasses
import re
from pathlib import Path

import pandas as pd
import pytest

import splitplan

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_docs_examples_run():
    code = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "API.md").read_text(), re.S)
    assert code
    for block in code:
        exec(compile(block.replace("duration_s=120", "duration_s=30").replace("duration_s=60", "duration_s=30"),
                     "docs/API.md", "exec"), {})


def test_results_have_frames_and_json():
    result = splitplan.plan(rate=4, duration_s=30, hardware=["h100-80gb"], tp=8)
    document = result.to_json()["plan"]
    assert isinstance(result.to_frame(), pd.DataFrame) and (document.get("prompt_pools") or document.get("mixed_pools"))
    sim = splitplan.simulate(result.plan, rate=4, duration_s=30)
    assert len(sim.to_frame()) == sim.summary.requests and "summary" in sim.to_json()
    sweep = splitplan.sweep([2, 4], pools=[("prompt", "h100-80gb", 8, 1), ("token", "h100-80gb", 8, 1)], duration_s=30)
    assert len(sweep.to_frame()) == 2 and sweep.to_json()["mode"] == "plan"


def test_optimize_closed_loop_keeps_only_plans_whose_closed_loop_met_the_slo(monkeypatch):
    from splitplan import api
    from splitplan.base.errors import InfeasibleError
    from splitplan.workload.trace import closed_loop_workload
    real = api.simulate_pools

    def missing(*args, **kwargs):  # the simulation misses one line: no plan may be returned
        out = real(*args, **kwargs)
        missed = dataclasses.replace(out.summary.slo[0], met=False)
        return dataclasses.replace(out, summary=dataclasses.replace(out.summary, slo=(missed, *out.summary.slo[1:])))

    work = closed_loop_workload(None, 8, None, 1024, 64)
    kwargs = dict(hardware=["h100-80gb"], engine="lean-fp8")
    ok = api.optimize_closed_loop(work, 8, "llama3.1-70b", "chat", **kwargs)
    assert ok.closed_loop.rounds[0].slo_met and ok.closed_loop.concurrency == 8
    import splitplan.workflows.simulation as simulation
    monkeypatch.setattr(simulation, "simulate_pools", missing)
    with pytest.raises(InfeasibleError, match="no plan met the SLO in a closed loop of 8 clients.*missed TTFT p50"):
        api.optimize_closed_loop(work, 8, "llama3.1-70b", "chat", **kwargs)


def test_export_writes_a_plan_as_the_cli_does(tmp_path):
    """Issue 32, item 6: splitplan.export is `splitplan export`: the same files, written as one set."""
    from typer.testing import CliRunner

    from splitplan.cli import app
    plan = ROOT / "examples" / "plans" / "deepseek-v3-h200.json"
    result = splitplan.export(plan, "vllm", output=tmp_path / "api")
    assert CliRunner().invoke(app, ["export", str(plan), "--to", "vllm", "--output", str(tmp_path / "cli")]).exit_code == 0
    written = sorted(p.name for p in (tmp_path / "api").iterdir())
    assert written == sorted([*result.files, "EXPORT.md"]) == sorted(p.name for p in (tmp_path / "cli").iterdir())
    for name in written:
        assert (tmp_path / "api" / name).read_text() == (tmp_path / "cli" / name).read_text()
    assert list(splitplan.export(plan, "dynamo").files) == ["dynamo.yaml"]
    with pytest.raises(splitplan.base.errors.SpecError, match="--to k8s: choose"):
        splitplan.export(plan, "k8s")


def test_a_plan_json_simulates_as_the_cli_simulates_it(tmp_path):
    """splitplan.simulate("plan.json") replays the plan as `simulate --plan` does: its workload (the
    rate it was made at), model, SLO and engine; an option given replaces the plan's."""
    import json

    from typer.testing import CliRunner

    from splitplan.cli import app
    from splitplan.io import report
    made = CliRunner().invoke(app, ["optimize", "--model", "llama3.1-8b", "--rate", "6", "--duration", "30", "--hardware",
                                    "h100-80gb", "--engine", "vllm", "--output-dir", str(tmp_path)])
    assert made.exit_code == 0, made.output
    plan = tmp_path / "plan.json"
    sim = splitplan.simulate(plan)
    assert sim.summary.requests == len(splitplan.workload(rate=6, duration_s=30))  # (the plan's own rate and duration)
    faster = splitplan.simulate(str(plan), rate=9)
    assert faster.summary.requests > sim.summary.requests
    cli = CliRunner().invoke(app, ["simulate", "--plan", str(plan), "--format", "json"])
    assert cli.exit_code == 0, cli.output
    assert json.loads(report.to_json(sim.summary.to_json())) == json.loads(cli.stdout)["summary"]
    fp8 = splitplan.simulate(plan, weights="fp8", kv="fp8")  # (the engine's precisions, as --weights and --kv-cache set them)
    cli = CliRunner().invoke(app, ["simulate", "--plan", str(plan), "--weights", "fp8", "--kv-cache", "fp8", "--format", "json"])
    assert cli.exit_code == 0, cli.output
    assert json.loads(report.to_json(fp8.summary.to_json())) == json.loads(cli.stdout)["summary"] != json.loads(
        report.to_json(sim.summary.to_json()))


def test_a_commands_plan_pins_end_with_the_command(tmp_path):
    """`simulate --plan` uses the plan's own copy of its specs while it runs; after it, in the same
    process, the catalog's entries are as they were (no spec of the plan stays pinned)."""
    from typer.testing import CliRunner

    from splitplan.cli import app
    from splitplan.specs import catalog
    made = CliRunner().invoke(app, ["optimize", "--model", "llama3.1-8b", "--rate", "4", "--duration", "30", "--hardware",
                                    "h100-80gb", "--output-dir", str(tmp_path)])
    assert made.exit_code == 0, made.output
    assert CliRunner().invoke(app, ["simulate", "--plan", str(tmp_path / "plan.json")]).exit_code == 0
    assert catalog.pinned("model_specs", "llama3.1-8b") is None and catalog.pinned("hardware_specs", "h100-80gb") is None


def test_plan_runs_optimizes_workflows_as_the_cli_does():
    """splitplan.plan is `splitplan optimize`'s one workflow choice (api.plan_for): with validate=True
    the plan is simulated and grown as `--validate` does, and a closed loop is planned with
    concurrency=; contradicting options are refused as the CLI refuses them."""
    import json

    from typer.testing import CliRunner

    from splitplan.base.errors import SpecError
    from splitplan.cli import app
    from splitplan.io import report
    args = dict(model="llama3.1-8b", rate=6, duration_s=30, hardware=["h100-80gb"], engine="vllm", jobs=1)
    checked = splitplan.plan(validate=True, **args)
    assert checked.simulated is not None and len(checked.alternatives_simulated) == len(checked.alternatives)
    cli = CliRunner().invoke(app, ["optimize", "--model", "llama3.1-8b", "--rate", "6", "--duration", "30", "--hardware",
                                   "h100-80gb", "--engine", "vllm", "--jobs", "1", "--validate", "--format", "json"])
    assert cli.exit_code == 0, cli.output
    assert json.loads(report.to_json(checked.to_json()))["plan"] == json.loads(cli.stdout)["plan"]
    loop = splitplan.plan(model="llama3.1-8b", concurrency=4, isl=512, osl=64, hardware=["h100-80gb"], engine="vllm", jobs=1)
    assert loop.closed_loop.concurrency == 4
    with pytest.raises(SpecError, match="--mixed-pool-threshold .* add --validate"):
        splitplan.plan(mixed_pool_threshold=4096, **args)
    with pytest.raises(SpecError, match="--concurrency plans a closed loop.*drop --validate"):
        splitplan.plan(model="llama3.1-8b", concurrency=4, validate=True)


def test_one_entry_layer_a_name_is_one_function():
    """A name both splitplan and splitplan.api export is one object: the top level adds functions
    of its own (plan, simulate, export, workload), never a second signature for the same name."""
    from splitplan import api
    shared = set(splitplan.__all__) & set(api.__all__)
    assert {"compare", "sweep", "calibrate", "plan_windows", "OptimizeResult"} <= shared
    assert all(getattr(splitplan, name) is getattr(api, name) for name in shared)


def test_loaded_specs_are_taken_where_names_are():
    """A model, SLO profile and engine profile loaded (from any file) are passed as they are where
    a catalog name is taken: the same plan and simulation as by name."""
    from splitplan import api
    from splitplan.specs.engine import load_engine
    from splitplan.specs.model import load_model
    from splitplan.specs.slo import load_slo
    trace = splitplan.workload(rate=4, duration_s=30)
    by_name = api.optimize(trace, "llama3.1-8b", "chat", ["h100-80gb"], engine="vllm", jobs=1)
    loaded = dict(model=load_model("llama3.1-8b"), slo=load_slo("chat"), engine=load_engine("vllm"))
    by_spec = api.optimize(trace, loaded["model"], loaded["slo"], ["h100-80gb"], engine=loaded["engine"], jobs=1)
    assert by_spec.plan == by_name.plan
    assert (splitplan.simulate(by_spec.plan, trace, **loaded).summary
            == splitplan.simulate(by_name.plan, trace, "llama3.1-8b", "chat", engine="vllm").summary)


def test_the_highest_rate_is_searched_on_resamples_when_a_rate_is_given():
    """optimize --objective throughput --rate R --duration D: each rate tried is a Poisson resample
    of D seconds (the plan's workload spans D seconds at the rate found); without --rate, the
    trace's own timestamps compressed (the same requests, a shorter span)."""
    from splitplan import api
    trace = splitplan.workload()
    options = api.OptimizeOptions(hardware=["h100-80gb"], tp=8, max_machines={"h100-80gb": 4}, jobs=1)
    resampled = api.plan_for(trace, "llama2-70b", "chat", options, api.Planning(throughput=True, rate_rps=5, duration_s=30))
    rate = resampled.result.max_rate_rps
    assert resampled.workload.span_s == pytest.approx(30, rel=0.15) and len(resampled.workload) == pytest.approx(rate * 30, rel=0.2)
    compressed = api.plan_for(trace.take(slice(0, 300)), "llama2-70b", "chat", options, api.Planning(throughput=True))
    assert len(compressed.workload) == 300


def test_a_simulations_outcome_says_whether_every_line_was_met():
    """What a study and --validate keep of a simulation (SimulateResult.outcome): met for a plan
    large enough, not met for one prompt and one token machine at ten times the load."""
    from splitplan import api
    pools = [("prompt", "h100-80gb", 8, 1), ("token", "h100-80gb", 8, 1)]
    light = api.simulate_pools(splitplan.workload(rate=1, duration_s=30), pools, "llama2-70b", "chat")
    heavy = api.simulate_pools(splitplan.workload(rate=40, duration_s=30), pools, "llama2-70b", "chat")
    assert light.outcome().slo_met is light.slo_met is True
    assert heavy.outcome().slo_met is heavy.slo_met is False
    assert heavy.outcome().ttft_ms == heavy.summary.ttft_ms
