"""Plans a team can run: headroom, spare instances, and the GPU energy per token of a plan."""

import dataclasses
import json

import numpy as np
import pytest

from splitplan import api
from splitplan.base.errors import SpecError
from splitplan.cli import app
from splitplan.perf.roofline import Instance
from splitplan.search.plan import Option, with_spares
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
    alone = api.simulate(TRACE, in_service(api.plan_pools(result.plan), {(Role.PROMPT, "h100-80gb", Layout(8)): 1,
                                                                       (Role.TOKEN, "h100-80gb", Layout(8)): 1}),
                         "llama2-70b", "chat")
    everything = api.simulate(TRACE, api.plan_pools(result.plan), "llama2-70b", "chat")
    assert checked.simulated["machines_added"] == 0
    assert checked.simulated["ttft_ms"] == alone.summary["ttft_ms"] != everything.summary["ttft_ms"]


@pytest.mark.parametrize("options", [H100_SPLIT, {"hardware": ["a100-80gb", "h100-80gb"], "tp": 8, "mode": "split"},
                                     {"hardware": ["h100-80gb"], "mode": "colocated"}])
def test_planned_energy_per_token_is_the_simulators_within_two_percent(options):
    plan = api.optimize(TRACE, "llama2-70b", "chat", **options).plan
    sim = api.simulate(TRACE, api.plan_pools(plan), "llama2-70b", "chat").summary
    for key in ("energy_kwh_per_million_tokens", "energy_kwh_per_million_output_tokens"):
        assert getattr(plan, key) == pytest.approx(sim[key], rel=0.02)


def test_energy_per_token_is_the_power_model_over_the_tokens_served():
    fits = TRACE.take(TRACE.prompt_tokens + TRACE.output_tokens <= 4096)  # (llama2-70b's context: every request served)
    sim = api.simulate(fits, [Pool(Role.PROMPT, "h100-80gb", Layout(8), 2), Pool(Role.TOKEN, "h100-80gb", Layout(8), 1)],
                       "llama2-70b", "chat").summary
    assert sim["finished"] == sim["requests"] == len(fits) and sim["tokens_out"] == fits.output_tokens.sum()
    served = float(fits.prompt_tokens.sum() + fits.output_tokens.sum())
    assert sim["energy_kwh_per_million_tokens"] == pytest.approx(sim["energy_kwh"] * 1e6 / served, rel=1e-12)
    assert sim["energy_kwh_per_million_output_tokens"] == pytest.approx(sim["energy_kwh"] * 1e6 / sim["tokens_out"], rel=1e-12)
    (h100,) = sim["power_sources"]
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
