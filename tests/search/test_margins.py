"""Plans a team can run: headroom, spare instances, and the GPU energy per token of a plan."""

import dataclasses
import json

import numpy as np
import pytest

from splitplan import api
from splitplan.base.errors import InfeasibleError, SpecError
from splitplan.cli import app
from splitplan.perf.roofline import Instance
from splitplan.search.accounting import with_spares
from splitplan.search.types import Option
from splitplan.specs.engine import load_engine
from splitplan.specs.hardware import load_hardware
from splitplan.specs.layout import Layout
from splitplan.specs.model import load_model
from splitplan.specs.roles import Pool, Role
from splitplan.workflows.simulation import in_service
from splitplan.workload.trace import default_trace_path, load_trace, resample_poisson, with_headroom

TRACE = resample_poisson(load_trace(default_trace_path()), 3.0, 120.0, np.random.default_rng(0))
H100_SPLIT = {"hardware": ["h100-80gb"], "tp": 8, "mode": "split"}


def _pools(plan):
    return [(p.hardware, p.layout, p.machines, p.instances) for p in plan.pools]


def test_headroom_plans_the_trace_arriving_that_much_faster_and_prices_tokens_at_the_trace_load():
    plan = api.optimize(TRACE, "llama2-70b", "chat", headroom_pct=900, **H100_SPLIT).plan
    faster = dataclasses.replace(TRACE, arrival_s=TRACE.arrival_s / 10)
    same = api.optimize(faster, "llama2-70b", "chat", **H100_SPLIT).plan
    nominal = api.optimize(TRACE, "llama2-70b", "chat", **H100_SPLIT).plan
    assert _pools(plan) == _pools(same) and plan.predicted == same.predicted
    assert plan.cost_usd_per_hour > nominal.cost_usd_per_hour  # (ten times the load needs a second prompt machine)
    # the same machines serve the trace's own load: its tokens an hour are a tenth of the planned load's
    assert plan.cost_usd_per_million_tokens == pytest.approx(10 * same.cost_usd_per_million_tokens, rel=1e-12)


def test_headroom_is_bounded():
    assert with_headroom(TRACE, 0) is TRACE
    for bad in (-1, 1e4, float("nan")):
        with pytest.raises(SpecError, match="--headroom"):
            with_headroom(TRACE, bad)


def test_spares_add_instances_beyond_the_need_and_keep_the_prediction_of_the_need():
    base = api.optimize(TRACE, "llama2-70b", "chat", **H100_SPLIT).plan
    spared = api.optimize(TRACE, "llama2-70b", "chat", spare_instances=1, **H100_SPLIT).plan
    for before, after in zip(base.pools, spared.pools, strict=True):  # (TP 8 on 8-GPU machines: a machine an instance)
        assert (after.machines, after.instances, after.spare_instances) == (before.machines + 1, before.instances + 1, 1)
    price = load_hardware("h100-80gb").price_usd_per_hour
    assert spared.cost_usd_per_hour == pytest.approx(base.cost_usd_per_hour + len(base.pools) * price)
    assert spared.predicted == base.predicted and spared.slo == base.slo  # (with the spares out of service)
    assert "spare instance(s) per pool" in spared.binding
    # the spares draw idle power: more energy per token, priced the same way
    assert spared.energy_kwh_per_million_tokens > base.energy_kwh_per_million_tokens


def test_a_spare_instance_the_whole_machine_rounding_already_holds_adds_no_machine():
    inst = Instance(load_model("llama2-70b"), load_hardware("h100-80gb"), load_engine("lean"), Layout(4))  # 2 a machine
    option = Option(Role.TOKEN, inst, 3, "TBT p99")  # 3 needed: 2 machines hold 4
    assert with_spares({option.key: 2}, {option.key: option}, 1) == {option.key: 2}
    assert with_spares({option.key: 2}, {option.key: option}, 2) == {option.key: 3}
    assert with_spares({option.key: 3}, {option.key: option}, 1) == {option.key: 4}  # (repaired past its size: all 6 needed)
    assert with_spares({option.key: 2}, {option.key: option}, 0) == {option.key: 2}


def test_a_plan_with_spares_is_simulated_with_them_out_of_service():
    pools = [Pool(Role.PROMPT, "h100-80gb", Layout(8), 4), Pool(Role.TOKEN, "h100-80gb", Layout(4), 2)]
    out = in_service(pools, {(Role.PROMPT, "h100-80gb", Layout(8)): 1, (Role.TOKEN, "h100-80gb", Layout(4)): 2})
    assert [(p.machines, p.instances) for p in out] == [(4, 3), (2, 2)]
    assert in_service(pools, {}) == pools


def test_validation_keeps_the_spares_and_simulates_the_plan_without_them():
    result = api.optimize(TRACE, "llama2-70b", "chat", spare_instances=1, **H100_SPLIT)
    setup = api.setup_for("llama2-70b", "chat", api.OptimizeOptions(**H100_SPLIT))
    checked = api.validate_result(result, TRACE, setup)
    assert [p.spare_instances for p in checked.plan.pools] == [1, 1]
    alone = api.simulate_pools(TRACE, in_service(api.plan_pools(result.plan), {(Role.PROMPT, "h100-80gb", Layout(8)): 1,
                                                                       (Role.TOKEN, "h100-80gb", Layout(8)): 1}),
                         "llama2-70b", "chat")
    everything = api.simulate_pools(TRACE, api.plan_pools(result.plan), "llama2-70b", "chat")
    assert checked.simulated.machines_added == 0
    assert checked.simulated.ttft_ms == alone.summary.ttft_ms != everything.summary.ttft_ms


@pytest.mark.parametrize("options", [H100_SPLIT, {"hardware": ["a100-80gb", "h100-80gb"], "tp": 8, "mode": "split"},
                                     {"hardware": ["h100-80gb"], "mode": "colocated"}])
def test_planned_energy_per_token_is_the_simulators_within_two_percent(options):
    plan = api.optimize(TRACE, "llama2-70b", "chat", **options).plan
    sim = api.simulate_pools(TRACE, api.plan_pools(plan), "llama2-70b", "chat").summary
    for key in ("energy_kwh_per_million_tokens", "energy_kwh_per_million_output_tokens"):
        assert getattr(plan, key) == pytest.approx(getattr(sim, key), rel=0.02)


def test_energy_per_token_is_the_power_model_over_the_tokens_served():
    fits = TRACE.take(TRACE.prompt_tokens + TRACE.output_tokens <= 4096)  # (llama2-70b's context: every request served)
    sim = api.simulate_pools(fits, [Pool(Role.PROMPT, "h100-80gb", Layout(8), 2), Pool(Role.TOKEN, "h100-80gb", Layout(8), 1)],
                       "llama2-70b", "chat").summary
    assert sim.finished == sim.requests == len(fits) and sim.tokens_out == fits.output_tokens.sum()
    served = float(fits.prompt_tokens.sum() + fits.output_tokens.sum())
    assert sim.energy_kwh_per_million_tokens == pytest.approx(sim.energy_kwh * 1e6 / served, rel=1e-12)
    assert sim.energy_kwh_per_million_output_tokens == pytest.approx(sim.energy_kwh * 1e6 / sim.tokens_out, rel=1e-12)
    (h100,) = sim.power_sources
    assert (h100["prefill_w"], h100["decode_w"], h100["idle_w"]) == (700, 380, 75)
    assert "Splitwise" in h100["source"] and h100["source_date"] == "2023-11"


def test_optimize_headroom_and_spare_on_the_command_line(tmp_path):
    from typer.testing import CliRunner
    runner = CliRunner()
    args = ["optimize", "--rate", "3", "--duration", "60", "--hardware", "h100-80gb", "--tp", "8", "--split-only"]
    doc = json.loads(runner.invoke(app, [*args, "--headroom", "25", "--spare", "1", "--format", "json"]).stdout)
    assert (doc["inputs"]["headroom_pct"], doc["inputs"]["spare_instances"]) == (25, 1)
    assert all(p["spare_instances"] == 1 for p in doc["plan"]["prompt_pools"] + doc["plan"]["token_pools"])
    assert doc["plan"]["energy_kwh_per_million_tokens"] > 0
    table = runner.invoke(app, [*args, "--headroom", "25", "--spare", "1"]).stdout
    assert "1 spare" in table and "25 % headroom" in table and "kWh per million tokens" in table
    for bad, needle in ((["--headroom", "-5"], "--headroom -5: must be >= 0"), (["--spare", "100"], "--spare 100: must be"),
                        (["--headroom", "abc"], "--headroom")):
        result = runner.invoke(app, [*args, *bad])
        assert result.exit_code == 2 and needle in result.output, (bad, result.output)
    result = runner.invoke(app, ["optimize", "--concurrency", "8", "--headroom", "10"])
    assert result.exit_code == 2 and "drop --headroom (for headroom, raise --concurrency)" in result.output


def _with_error(engine: str, error: dict):
    from splitplan.specs.engine import load_engine
    eng = load_engine(engine)
    return eng.model_copy(update={"fit": {**(eng.fit or {}), "error": error}})


def test_latency_factors_take_the_worst_bands_error_at_one_minus_the_confidence():
    quiet = {"q10": -20.0, "q50": 0.0, "q90": 10.0}
    busy = {"q10": -50.0, "q50": -10.0, "q90": 5.0}
    eng = _with_error("vllm", {"1-16": {"ttft_mean": quiet, "tpot_mean": quiet, "e2e_mean": quiet},
                               ">48": {"ttft_mean": busy, "tpot_mean": {"q10": 1.0, "q90": 9.0}, "e2e_mean": quiet}})
    at90 = eng.latency_factors(0.9)  # the 10th percentile: -50 % TTFT in the busy band (latencies twice the predicted)
    assert at90["ttft"] == pytest.approx(2.0) and at90["tpot"] == at90["itl"] == at90["tbt"] == pytest.approx(1 / 0.8)
    assert at90["e2e"] == pytest.approx(1 / 0.8)
    at70 = eng.latency_factors(0.7)  # between q10 and q50: -50 + (0.3 - 0.1) / 0.4 * 40 = -30 %
    assert at70["ttft"] == pytest.approx(1 / 0.7)
    over = _with_error("vllm", {"all": {"ttft_mean": {"q10": 5.0, "q90": 20.0}}})
    assert over.latency_factors(0.9)["ttft"] == 1.0  # (a model that over-predicts never loosens a line)
    few = _with_error("vllm", {"all": {"stages": 20, "ttft_mean": quiet}, "busy": {"stages": 2, "ttft_mean": busy}})
    assert few.latency_factors(0.9)["ttft"] == pytest.approx(1 / 0.8)  # (a band of 2 stages is too few to size on)
    no_e2e = _with_error("vllm", {"all": {"ttft_mean": busy, "tpot_mean": quiet}})
    assert no_e2e.latency_factors(0.9)["e2e"] == pytest.approx(2.0)  # (no E2E measured: the larger of TTFT's and TPOT's)


def test_a_moe_model_takes_the_error_measured_on_moe_deployments():
    dense, moe = {"q10": -20.0, "q50": 0.0}, {"q10": -60.0, "q50": -40.0}
    eng = _with_error("sglang-fp8", {"all": {"runs": 40, "ttft_mean": dense, "tpot_mean": dense}})
    eng = eng.model_copy(update={"fit": {**eng.fit, "moe_error_source": "bench/x.py (2026-12): MoE runs",
                                         "moe_error": {"all": {"runs": 30, "ttft_mean": moe, "tpot_mean": dense}}}})
    assert eng.latency_factors(0.9)["ttft"] == pytest.approx(1 / 0.8)  # (a dense model: the dense runs' error)
    assert eng.latency_factors(0.9, moe=True)["ttft"] == pytest.approx(1 / 0.4)  # (-60 % at the 10th percentile)
    assert eng.measured_error(moe=True)[1] == "bench/x.py (2026-12): MoE runs"
    warning = eng.moe_warning("deepseek-v3")
    assert "30 measured MoE deployments at a median -40 % (optimistic)" in warning and "(bench/x.py (2026-12))" in warning
    close = eng.model_copy(update={"fit": {**eng.fit, "moe_error": {"all": {"runs": 30, "ttft_mean": {"q50": 5.0},
                                                                            "tpot_mean": {"q50": -9.0}}}}})
    assert close.moe_warning("deepseek-v3") is None  # (within 10 % either way: nothing to say)
    without = _with_error("sglang-fp8", {"all": {"runs": 40, "ttft_mean": dense}})
    without = without.model_copy(update={"fit": {k: v for k, v in without.fit.items() if not k.startswith("moe_error")}})
    assert without.latency_factors(0.9, moe=True)["ttft"] == pytest.approx(1 / 0.8) and without.moe_warning("m") is None
    empty = without.model_copy(update={"fit": {**without.fit, "moe_error": None}})  # (YAML's `moe_error:` with nothing)
    assert empty.moe_warning("m") is None and empty.error_key(moe=True) == "error"


def test_a_plan_for_a_moe_model_says_how_its_engine_did_on_measured_moe_deployments():
    from splitplan.workload.trace import load_workload
    trace = load_workload("azure-code", 2.0, 30.0)
    plain = api.optimize(trace, "deepseek-v3", "chat", hardware=["h200-141gb"], engine="sglang-fp8", mode="split")
    assert any("deepseek-v3 is a mixture-of-experts model: sglang-fp8 predicted the mean TTFT of" in w for w in plain.warnings)
    assert plain.to_json()["warnings"] == plain.warnings
    dense = api.optimize(trace, "llama3.1-70b", "chat", hardware=["h200-141gb"], engine="sglang-fp8", mode="split")
    assert not any("mixture-of-experts" in w for w in dense.warnings)
    # at 0.9 the MoE runs' error divides TTFT p50's 500 ms by 7.75: no option meets it, and the refusal says why
    with pytest.raises(InfeasibleError, match=r"TTFT p50 not met.*; at --confidence 0.9 each line is divided by "
                                              r"sglang-fp8's measured error on MoE deployments \(TTFT 7.75x"):
        api.optimize(trace, "deepseek-v3", "chat", hardware=["h200-141gb"], engine="sglang-fp8", mode="split", confidence=0.9)


def test_a_profile_without_a_measured_error_refuses_a_confidence():
    from splitplan.specs.engine import load_engine
    with pytest.raises(SpecError, match=r"engine profile splitwise-vllm carries no measured error .*"
                                        r"\(lean, lean-fp8, sglang-fp8, trtllm-fp8, vllm, vllm-fp8\)"):
        load_engine("splitwise-vllm").latency_factors(0.9)


def test_tightened_limits_are_the_lines_divided_by_their_factor():
    from splitplan.specs.slo import load_slo, tightened
    chat = load_slo("chat")
    tight = tightened(chat, {"ttft": 2.0, "itl": 1.25})
    assert [(a.label, a.limit, b.limit) for a, b in zip(chat.lines(), tight.lines(), strict=True)] == [
        (a.label, a.limit, a.limit / {"ttft": 2.0, "itl": 1.25}[a.metric]) for a in chat.lines()]


def test_a_plan_at_a_confidence_meets_each_line_divided_by_its_factor_beside_the_nominal_plan():
    trace, a100 = load_trace(default_trace_path()), {"hardware": ["a100-80gb"], "tp": 8, "mode": "split"}
    result = api.optimize(trace, "llama2-70b", "chat", confidence=0.9, **a100)
    nominal = api.optimize(trace, "llama2-70b", "chat", **a100).plan
    assert result.nominal == nominal and result.plan.cost_usd_per_hour > nominal.cost_usd_per_hour
    assert all(met for _, _, met in nominal.slo)  # (as predicted, the nominal plan meets every line)
    for row, (line, achieved, met) in zip(result.confidence.lines, result.plan.slo, strict=True):
        assert row.sized_for == pytest.approx(row.target / row.factor) == pytest.approx(line.limit)
        assert met and achieved * row.factor <= row.target * (1 + 1e-9)  # (each line holds at its factor)
    factors = result.confidence.factors
    assert any(achieved * factors[line.metric] > line.limit for line, achieved, _ in nominal.slo)  # (the nominal would not)
    assert result.confidence.quantile == 0.9 and "in-sample" in result.confidence.error_source


def test_optimize_confidence_on_the_command_line(tmp_path):
    from typer.testing import CliRunner
    runner = CliRunner()
    args = ["optimize", "--hardware", "a100-80gb", "--tp", "8", "--split-only"]
    result = runner.invoke(app, [*args, "--confidence", "0.9", "--format", "json", "--output-dir", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    plan = doc["plan"]
    assert doc["inputs"]["confidence"] == 0.9 and plan["confidence"]["quantile"] == 0.9
    assert plan["nominal"]["cost_usd_per_hour"] < plan["cost_usd_per_hour"]
    assert {row["line"] for row in plan["confidence"]["lines"]} == {row["line"] for row in plan["slo"]}
    assert runner.invoke(app, ["export", str(tmp_path / "p" / "plan.json"), "--to", "vllm"]).exit_code == 0  # (reads back)
    table = runner.invoke(app, ["--wide", *args, "--confidence", "0.9"]).stdout
    assert "90% quantile of vllm's measured error" in table and "nominal plan: prompt 5x a100-80gb TP 8" in table
    for bad, needle in ((["--confidence", "0.3"], "--confidence 0.3: must be >= 0.5"),
                        (["--confidence", "1"], "--confidence 1: must be >= 0.5 and <= 0.99"),
                        (["--confidence", "0.9", "--engine", "splitwise-vllm"], "carries no measured error")):
        failed = runner.invoke(app, [*args, *bad])
        assert failed.exit_code == 2 and needle in failed.output, failed.output


def test_validation_simulates_the_load_with_its_headroom():
    from typer.testing import CliRunner
    args = ["optimize", "--rate", "3", "--duration", "60", "--hardware", "h100-80gb", "--tp", "8", "--split-only", "--validate",
            "--format", "json"]
    plain, faster = (json.loads(CliRunner().invoke(app, [*args, "--headroom", h]).stdout)["plan"] for h in ("0", "300"))
    assert [p["machines"] for p in plain["prompt_pools"]] == [p["machines"] for p in faster["prompt_pools"]]  # (the same machines)
    for plan in (plain, faster):  # (the simulation replays the load the plan was sized for)
        assert plan["simulated"]["ttft_ms"]["p99"] == pytest.approx(plan["predicted"]["ttft_ms"]["p99"], rel=0.05)
    assert faster["simulated"]["ttft_ms"]["p99"] > 1.5 * plain["simulated"]["ttft_ms"]["p99"]  # (4x the load: 1.9x the p99)
