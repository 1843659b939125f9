"""The ILP equals the exhaustive grid; plans hold on the trace; failures are precise."""

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from splitplan import api
from splitplan.base.errors import InfeasibleError
from splitplan.perf.roofline import Instance
from splitplan.search.solve import solve_counts
from splitplan.search.types import MachineCap, Option, Problem
from splitplan.specs.engine import load_engine
from splitplan.specs.hardware import load_hardware
from splitplan.specs.layout import Layout
from splitplan.specs.model import load_model
from splitplan.workload.trace import Trace, default_trace_path, load_trace, resample_poisson

MODEL, ENGINE = load_model("llama2-70b"), load_engine("lean")
CHOICES = [("a100-80gb", 8), ("h100-80gb", 4), ("h100-80gb", 8), ("mi300x-192gb", 2), ("h200-141gb", 4),
           ("a100-80gb", Layout(8, pp=2)), ("h100-80gb", Layout(8, pp=4)),  # (instances over 2 and 4 machines)
           ("h100-80gb@2", 2), ("h100-80gb@4", 4), ("h100-80gb@4", 2)]  # (smaller machines of a type: one cap)


def _cost(counts, options, attr):
    by_key = {o.key: o for o in options}
    return sum(getattr(by_key[k], attr) * c for k, c in counts.items())


@settings(max_examples=40, deadline=None)
# Shares that cover a role exactly (3 x 1/3), which CBC saw as short of 1 once written to 12 digits:
@example([("prompt", ("a100-80gb", 8), 1), ("token", ("h100-80gb", 4), 3), ("token", ("mi300x-192gb", 2), 12)],
         "cost", 71.0, None, "cbc")
@example([("prompt", ("a100-80gb", 8), 1), ("token", ("a100-80gb", 8), 4), ("token", ("mi300x-192gb", 2), 12)],
         "cost", 71.0, None, "cbc")
@given(
    st.lists(st.tuples(st.sampled_from(["prompt", "token"]), st.sampled_from(CHOICES), st.integers(1, 14)), min_size=2, max_size=5),
    st.sampled_from(["cost", "power"]),
    st.one_of(st.none(), st.floats(20, 400)),
    st.one_of(st.none(), st.integers(0, 6)),
    st.sampled_from(["highs", "cbc"]),
)
def test_ilp_optimum_equals_grid_optimum(specs, objective, max_cost, max_h100, solver):
    options, seen = [], set()
    for role, (hw, tp), n in specs:
        if (role, hw, tp) in seen:
            continue
        seen.add((role, hw, tp))
        options.append(Option(role, Instance(MODEL, load_hardware(hw), ENGINE, tp), n, "test"))
    problem = Problem(trace=None, slo=None, reference=None, objective=objective, max_cost_per_hour=max_cost,
                      max_machines=(MachineCap("h100-80gb", max_h100, 8),) if max_h100 is not None else (), solver=solver)
    _ilp_equals_grid(problem, options)


def _ilp_equals_grid(problem, options):
    """The ILP's optimum (its objective value) is the grid's, or both find none; the ILP's counts
    (None when infeasible)."""
    try:
        ilp = solve_counts(problem, options, "ilp")
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            solve_counts(problem, options, "grid")
        return None
    grid = solve_counts(problem, options, "grid")
    attr = "price_usd_per_hour" if problem.objective == "cost" else "power_kw"
    assert _cost(ilp, options, attr) == pytest.approx(_cost(grid, options, attr))
    return ilp


GOLDEN_LP = Path(__file__).resolve().parents[1] / "data" / "ilp_small.lp"


def _small_ilp_options():
    return [Option("prompt", Instance(MODEL, load_hardware("h100-80gb"), ENGINE, 8), 3, "test"),
            Option("prompt", Instance(MODEL, load_hardware("a100-80gb"), ENGINE, 4), 7, "test"),
            Option("token", Instance(MODEL, load_hardware("h100-80gb"), ENGINE, 4), 5, "test"),
            Option("token", Instance(MODEL, load_hardware("mi300x-192gb"), ENGINE, 2), 9, "test")]


def test_ilp_formulation_matches_the_reviewed_golden_file(tmp_path):
    """The integer program of a small case, written as an LP file and compared with the
    reviewed one (tests/data/ilp_small.lp): a change to the formulation shows up here."""
    from splitplan.search.solve import ilp_model
    problem = Problem(trace=None, slo=None, reference=None, objective="cost", max_cost_per_hour=300.0,
                      max_machines=(MachineCap("h100-80gb", 4, 8),))
    lp, _ = ilp_model(problem, _small_ilp_options())
    lp.writeLP(str(tmp_path / "small.lp"))
    assert (tmp_path / "small.lp").read_text() == GOLDEN_LP.read_text()


def test_an_unknown_solver_is_bad_input():
    from splitplan.base.errors import SpecError
    problem = Problem(trace=None, slo=None, reference=None, solver="gurobi")
    with pytest.raises(SpecError, match="--solver gurobi: choose highs or cbc"):
        solve_counts(problem, _small_ilp_options())


@pytest.fixture(scope="module")
def small_trace():
    return resample_poisson(load_trace(default_trace_path()), 4.0, 120.0, np.random.default_rng(3))


def test_plan_meets_every_line_and_explains_itself(small_trace):
    result = api.optimize(small_trace, "llama2-70b", "splitwise", ["a100-80gb", "h100-80gb"], mode="split")
    plan = result.plan
    assert plan.prompt_pools and plan.token_pools
    assert all(ok for _, _, ok in plan.slo) and len(plan.slo) == 9
    assert "prompt:" in plan.binding and "token:" in plan.binding
    assert plan.cost_usd_per_hour == pytest.approx(sum(
        p.machines * load_hardware(p.hardware).price_usd_per_hour for p in plan.prompt_pools + plan.token_pools))
    assert all(a.cost_usd_per_hour >= plan.cost_usd_per_hour - 1e-9 for a in result.alternatives if not a.mixed_pools)
    skipped = [o for o in result.options if o.skipped]
    assert any("weights need" in o.skipped for o in skipped)  # TP 1 does not fit: kept with its reason


def test_grid_and_ilp_give_the_same_plan_cost(small_trace):
    kwargs = dict(hardware=["a100-80gb", "h100-80gb"], tp=8)
    ilp = api.optimize(small_trace, "llama2-70b", "splitwise", search="ilp", **kwargs)
    grid = api.optimize(small_trace, "llama2-70b", "splitwise", search="grid", **kwargs)
    assert ilp.plan.cost_usd_per_hour == pytest.approx(grid.plan.cost_usd_per_hour)


def test_more_load_never_lowers_cost():
    base = load_trace(default_trace_path())
    costs = [api.optimize(resample_poisson(base, r, 60.0, np.random.default_rng(1)), "llama2-70b", "splitwise",
                          ["h100-80gb"], tp=8).plan.cost_usd_per_hour for r in (2.0, 8.0, 20.0)]
    assert costs == sorted(costs)


def test_tighter_slo_never_lowers_cost(small_trace, tmp_path):
    loose = tmp_path / "loose.yaml"
    loose.write_text("description: t\nttft:\n  p99: {max_ms: 4000}\ntbt:\n  p99: {max_ms: 200}\n")
    tight = tmp_path / "tight.yaml"
    tight.write_text("description: t\nttft:\n  p99: {max_ms: 1000}\ntbt:\n  p99: {max_ms: 60}\n")
    kw = dict(hardware=["a100-80gb", "h100-80gb"])
    assert api.optimize(small_trace, "llama2-70b", str(tight), **kw).plan.cost_usd_per_hour >= \
        api.optimize(small_trace, "llama2-70b", str(loose), **kw).plan.cost_usd_per_hour


def test_unreachable_slo_names_line_best_value_and_hardware(small_trace, tmp_path):
    slo = tmp_path / "impossible.yaml"
    slo.write_text("description: t\nttft:\n  p50: {max_ms: 1}\n")
    with pytest.raises(InfeasibleError, match=r"TTFT p50 <= 1 ms cannot be met: the best reachable is .* ms on h100-80gb"):
        api.optimize(small_trace, "llama2-70b", str(slo), ["a100-80gb", "h100-80gb"])


def _itl_slo(tmp_path, ms: float, metric: str = "itl", pct: str = "p99") -> str:
    slo = tmp_path / f"{metric}{ms}.yaml"
    slo.write_text(f"description: t\n{metric}:\n  {pct}: {{max_ms: {ms}}}\n")
    return str(slo)


def test_an_inter_token_line_one_option_cannot_reach_skips_it_and_plans_on_the_others(small_trace, tmp_path):
    """Issue 54, item 1: a line the A100 cannot reach even alone (its decode step is slower) skips
    that option with its reason; the plan comes from the H100."""
    result = api.optimize(small_trace, "llama2-70b", _itl_slo(tmp_path, 18), ["a100-80gb", "h100-80gb"], tp=8, mode="split")
    assert [p.hardware for p in result.plan.token_pools] == ["h100-80gb"]
    skipped = {o.key.hardware: o.skipped for o in result.options if o.role == "token"}
    assert skipped["h100-80gb"] == ""
    assert re.fullmatch(r"ITL p99 not met (even running requests alone \(.* ms at best, target <= 18 ms\)|at any size .*)",
                        skipped["a100-80gb"])


@pytest.mark.parametrize(("metric", "pct", "label"), [("itl", "p99", "ITL p99"), ("tpot", "p50", "TPOT p50")])
def test_an_inter_token_line_no_option_can_reach_names_the_best_value_and_where(small_trace, tmp_path, metric, pct, label):
    with pytest.raises(InfeasibleError, match=rf"{label} <= 0.5 ms cannot be met: the best reachable is [\d.]+ ms on h100-80gb at TP 8"):
        api.optimize(small_trace, "llama2-70b", _itl_slo(tmp_path, 0.5, metric, pct), ["a100-80gb", "h100-80gb"], tp=8)


def test_budget_too_small_is_infeasible_and_names_the_cheapest_homogeneous_cost(small_trace):
    sized = api.optimize(small_trace, "llama2-70b", "splitwise", ["h100-80gb"], tp=8).options
    need = sum(o.price_usd_per_hour * o.machines_alone for o in sized if o.role in ("prompt", "token"))
    with pytest.raises(InfeasibleError, match="within the budget") as failure:
        api.optimize(small_trace, "llama2-70b", "splitwise", ["h100-80gb"], tp=8, max_cost_per_hour=10)
    assert f"needs about ${need:,.1f}/h" in str(failure.value)


def test_colocated_baseline_beside_split(small_trace):
    result = api.optimize(small_trace, "llama2-70b", "splitwise", ["a100-80gb", "h100-80gb"], tp=8, mode="split")
    assert result.colocated is not None and result.colocated.mixed_pools
    assert not result.colocated.prompt_pools and all(ok for _, _, ok in result.colocated.slo)
    assert result.colocated in result.alternatives
    expected = (1 - result.plan.cost_usd_per_hour / result.colocated.cost_usd_per_hour) * 100
    assert result.split_saving_pct == pytest.approx(expected)


def test_no_split_plan_is_the_colocated_one(small_trace):
    split = api.optimize(small_trace, "llama2-70b", "splitwise", ["a100-80gb", "h100-80gb"], tp=8)
    mixed = api.optimize(small_trace, "llama2-70b", "splitwise", ["a100-80gb", "h100-80gb"], tp=8, mode="colocated")
    assert mixed.plan.mixed_pools and not mixed.plan.token_pools
    assert mixed.plan.cost_usd_per_hour == pytest.approx(split.colocated.cost_usd_per_hour)


def test_colocated_options_that_cannot_be_the_best_are_not_sized(small_trace):
    """With split plans searched, a co-located option whose prompt pool's count already costs more
    than the first co-located plan found is not sized; the co-located plan is the one sizing every
    option gives (--no-split sizes them all), and the least cost each option left out states is
    above that plan's and a true bound: its size, on any shape, costs at least that much."""
    machines = ["a100-80gb", "h100-80gb", "mi300x-192gb"]
    split = api.optimize(small_trace, "llama2-70b", "chat", machines)
    every = api.optimize(small_trace, "llama2-70b", "chat", machines, mode="colocated")
    best = every.plan.cost_usd_per_hour
    assert split.colocated.cost_usd_per_hour == pytest.approx(best)
    pruned = [o for o in split.options if o.role == "mixed" and o.skipped.startswith("not sized")]
    sized = [o for o in split.options if o.role == "mixed" and o.instances]
    assert pruned and sized
    for option in pruned:
        least = float(re.search(r"need at least \$([\d.,]+)/h", option.skipped)[1].replace(",", ""))
        assert least > best
        assert all(o.price_usd_per_hour * o.machines_alone >= least - 0.01 for o in every.options
                   if o.role == "mixed" and o.instances and (o.inst.hardware.family,
                                                             o.inst.layout) == (option.inst.hardware.family, option.inst.layout))
    assert not any(o.skipped.startswith("not sized") for o in split.options if not o.inst.fit.fits)


def test_colocated_tbt_suffers_from_prefill_stalls():
    from splitplan.capacity.pools import colocated_pool, decode_pool
    trace = resample_poisson(load_trace(default_trace_path()), 6.0, 120.0, np.random.default_rng(5))
    inst = Instance(MODEL, load_hardware("h100-80gb"), ENGINE, 8)
    mixed = colocated_pool(trace, inst, 4, 2048)
    alone = decode_pool(trace.arrival_s, trace.prompt_tokens, trace.output_tokens, inst, 4)
    plain_tbt = np.maximum(trace.output_tokens - 1, 0) * alone.step_s / trace.output_tokens
    assert np.mean(mixed.tbt) > np.mean(plain_tbt)
    assert np.all(mixed.e2e >= mixed.ttft)


def _scaled(base):
    import dataclasses
    return lambda r: dataclasses.replace(base, arrival_s=base.arrival_s * (base.mean_rate_rps / r))


def test_throughput_objective_and_bigger_budget_never_lowers_rate():
    base = resample_poisson(load_trace(default_trace_path()), 3.0, 60.0, np.random.default_rng(2))
    kw = dict(hardware=["h100-80gb"], tp=8)
    small = api.max_rate(_scaled(base), base.mean_rate_rps, "llama2-70b", "splitwise", max_machines={"h100-80gb": 3}, **kw)
    big = api.max_rate(_scaled(base), base.mean_rate_rps, "llama2-70b", "splitwise", max_machines={"h100-80gb": 6}, **kw)
    assert small.max_rate_rps > 0 and big.max_rate_rps >= small.max_rate_rps
    assert small.plan.machines <= 3 and big.plan.machines <= 6
    assert {c["role"] for c in small.plan.cliff} == {"prompt", "token"}  # (the winner's cliff, not each attempt's)
    # Just past the rate found, the budget no longer suffices.
    with pytest.raises(InfeasibleError):
        api.optimize(_scaled(base)(small.max_rate_rps * 1.1), "llama2-70b", "splitwise", max_machines={"h100-80gb": 3},
                     mode="split-alone", **kw)  # (max_rate asks for split plans)


def test_max_rate_searches_the_plans_its_mode_asks_for():
    """A rate search plans split pools, or co-located machines for a co-located design (compare's
    baselines): the mode the options give, never split plans for a co-located design."""
    base = resample_poisson(load_trace(default_trace_path()), 3.0, 60.0, np.random.default_rng(2))
    kw = dict(hardware=["h100-80gb"], tp=8, max_machines={"h100-80gb": 3})
    split = api.max_rate(_scaled(base), base.mean_rate_rps, "llama2-70b", "splitwise", **kw)
    mixed = api.max_rate(_scaled(base), base.mean_rate_rps, "llama2-70b", "splitwise", mode="colocated", **kw)
    assert split.plan.prompt_pools and split.plan.token_pools and not split.plan.mixed_pools
    assert mixed.plan.mixed_pools and not (mixed.plan.prompt_pools or mixed.plan.token_pools)
    assert mixed.plan.machines <= 3 and not mixed.alternatives


def test_throughput_needs_a_budget():
    from splitplan.base.errors import SpecError
    base = load_trace(default_trace_path())
    with pytest.raises(SpecError, match="needs a budget"):
        api.max_rate(_scaled(base), 1.0, "llama2-70b", "splitwise")


@pytest.mark.parametrize("method", ["ilp", "grid"])
def test_equal_cost_is_broken_by_power(method):
    """The capped H100 costs as much as the H100 and draws less: at equal capacity, a
    cost-minimal plan takes it, by the ILP and by the grid."""
    capped, full = (Instance(MODEL, load_hardware(h), ENGINE, 8) for h in ("h100-80gb-cap70", "h100-80gb"))
    assert capped.hardware.price_usd_per_hour == full.hardware.price_usd_per_hour
    assert capped.hardware.provisioned_power_w < full.hardware.provisioned_power_w
    options = [Option("prompt", full, 3, "test"), Option("prompt", capped, 3, "test"), Option("token", full, 2, "test")]
    counts = solve_counts(Problem(trace=None, slo=None, reference=None), options, method)
    assert counts == {("prompt", "h100-80gb-cap70", Layout(8)): 3, ("token", "h100-80gb", Layout(8)): 2}


@pytest.mark.parametrize("method", ["ilp", "grid"])
def test_instances_over_two_machines_are_counted_whole(method):
    """A TP 8 x PP 2 instance takes two machines: three of them are six machines, not three or twelve."""
    pipelined = Instance(MODEL, load_hardware("a100-80gb"), ENGINE, Layout(8, pp=2))
    options = [Option("prompt", pipelined, 3, "test"), Option("token", Instance(MODEL, load_hardware("h100-80gb"), ENGINE, 8), 2, "test")]
    problem = Problem(trace=None, slo=None, reference=None)
    assert solve_counts(problem, options, method) == {options[0].key: 6, options[1].key: 2}


def test_a_colocated_plan_reports_what_its_simulation_gives():
    """Issue 27, item 1: a co-located plan's verdict is the simulator's on the same trace and
    machines (no closed form beside it), so simulate accepts every co-located plan optimize makes."""
    from splitplan.workflows.simulation import Setup, plan_pools
    trace = resample_poisson(load_trace(default_trace_path()), 4.0, 60.0, np.random.default_rng(1))
    result = api.optimize(trace, "llama2-70b", "chat", ["h100-80gb", "h200-141gb"], mode="colocated")
    for plan in (result.plan, *result.alternatives):
        sim = Setup("llama2-70b", "chat").simulate(result.problem.trace, plan_pools(plan))
        assert sim.slo_met
        for line, value, _ in plan.slo:
            simulated = next(x.achieved for x in sim.summary.slo if x.line == line.label)
            assert value == pytest.approx(simulated, rel=1e-9), line.label
    chosen = next(o for o in result.options if o.key.hardware == result.plan.mixed_pools[0].hardware
                  and o.key.layout == result.plan.mixed_pools[0].layout)
    assert chosen.simulated


def test_the_colocated_estimate_ranks_but_the_simulation_sizes():
    """The fast estimate that ranks co-located options is optimistic near saturation (it missed the
    collapse of one b200-180gb at TP 1 at 100 req/s); the option's count is the simulated one."""
    from splitplan.capacity.pools import colocated_estimate, colocated_pool
    from splitplan.search.sizing import simulated_option
    from splitplan.specs.slo import load_slo
    trace = resample_poisson(load_trace(default_trace_path()), 8.0, 60.0, np.random.default_rng(3))
    inst = Instance(MODEL, load_hardware("h100-80gb"), ENGINE, 8)
    problem = Problem(trace, load_slo("chat"), None)
    option = simulated_option(problem, Option("mixed", inst, 1, "estimate"))
    n = option.instances
    assert n and option.simulated
    def meets(values):
        from splitplan.search.sizing import _mixed_failing
        return _mixed_failing(problem, values) is None
    assert meets(colocated_pool(trace, inst, n, 2048))
    assert n == 1 or not meets(colocated_pool(trace, inst, n - 1, 2048))
    estimate = colocated_estimate(trace.arrival_s, trace.prompt_tokens, trace.output_tokens, inst, n, 2048)
    assert np.all(estimate.e2e >= estimate.ttft)


def test_the_colocated_estimate_predicts_the_gaps_prefills_stretch():
    """The estimate that ranks co-located options and seeds their simulated count predicts the
    inter-token gaps (without them it was 5-8x optimistic wherever ITL p99 binds, and the
    search simulated a hundred replays on the conversation trace): a prefill batch stretches a
    gap of every request decoding beside it. Its ITL p99 follows the simulator's, stalls and
    all, and falls to the decode step once few gaps hold a prefill."""
    from splitplan.capacity.pools import colocated_estimate, colocated_pool
    trace = resample_poisson(load_trace(default_trace_path()), 8.0, 60.0, np.random.default_rng(3))
    inst = Instance(MODEL, load_hardware("h100-80gb"), load_engine("vllm"), 4)
    p99 = {}
    for n in (4, 8):
        estimate = colocated_estimate(trace.arrival_s, trace.prompt_tokens, trace.output_tokens, inst, n, 8192,
                                      chunked=True, max_seqs=1024)
        simulated = np.percentile(colocated_pool(trace, inst, n, 8192, 1024).itl, 99)
        p99[n] = estimate.itl.percentile(99)
        assert p99[n] == pytest.approx(simulated, rel=0.2), n  # (15 % high at 4 instances, 2026-12-07)
        many = trace.output_tokens > 1
        decode_s = (estimate.e2e - estimate.ttft)[many]
        assert np.allclose(estimate.tpot[many], decode_s / (trace.output_tokens[many] - 1))
    assert p99[4] > 5 * inst.decode_step_time_s(1, 1000)  # stalled by prefills
    assert p99[8] < 1.1 * estimate.itl.percentile(50)  # few gaps hold one


def test_binding_says_when_whole_machines_decided_the_size():
    """Issue 27, item 5: a pool of TP 1 instances on an 8-GPU machine that needs fewer than 8 is
    decided by rounding up to a whole machine, and the line that binds at the count needed is named."""
    trace = resample_poisson(load_trace(default_trace_path()), 2.0, 60.0, np.random.default_rng(4))
    result = api.optimize(trace, "llama3.1-8b", "chat", ["h100-80gb@8"], tp=1, mode="colocated")
    needed = next(o.instances for o in result.options if o.key.layout == Layout(1))
    assert needed < 8 and result.plan.mixed_pools[0].machines == 1
    assert f"mixed: rounded up to whole machines ({needed} of 8 instances needed" in result.plan.binding


def test_a_machine_type_rented_in_shapes_buys_the_gpus_the_load_needs():
    """Issue 30: H100s are rented by 1, 2, 4 and 8 (the catalog's shapes): the load that needs
    fewer than 8 TP 1 instances buys that many GPUs in the cheapest shapes, at the same per-GPU
    rate, not a whole 8-GPU machine; `h100-80gb@8` still buys whole machines."""
    trace = resample_poisson(load_trace(default_trace_path()), 2.0, 60.0, np.random.default_rng(4))
    whole = api.optimize(trace, "llama3.1-8b", "chat", ["h100-80gb@8"], tp=1, mode="colocated").plan
    shaped = api.optimize(trace, "llama3.1-8b", "chat", ["h100-80gb"], tp=1, mode="colocated").plan
    (pool,) = whole.mixed_pools
    needed = shaped.gpus
    assert needed < 8 and pool.gpus == 8 and shaped.cost_usd_per_hour == pytest.approx(38.0 / 8 * needed)
    assert {load_hardware(p.hardware).family for p in shaped.pools} == {"h100-80gb"}
    assert sum(p.instances for p in shaped.pools) == needed


def test_a_plan_says_what_it_buys(small_trace):
    """Issue 27, item 4: per pool its instances, GPUs and predicted utilization (the simulator's
    busy fraction: the same figure for a co-located pool, close to it for split pools, whose
    decode side is the planner's fixed point); per plan its GPUs and cost per million tokens."""
    from splitplan.search.accounting import usd_per_million_tokens
    from splitplan.workflows.simulation import Setup, plan_pools
    split = api.optimize(small_trace, "llama2-70b", "chat", ["a100-80gb", "h100-80gb"], tp=8, mode="split")
    colocated = api.optimize(small_trace, "llama3.1-8b", "chat", ["h100-80gb@8"], tp=1, mode="colocated")
    for model, result, tolerance in (("llama2-70b", split, 0.05), ("llama3.1-8b", colocated, 1e-9)):
        plan, trace = result.plan, result.problem.trace
        simulated = Setup(model, "chat").simulate(trace, plan_pools(plan))
        for pool, row in zip(plan.pools, simulated.summary.pools, strict=True):
            gpus_per_machine = load_hardware(pool.hardware).gpus_per_machine
            assert pool.gpus == pool.machines * gpus_per_machine
            assert pool.instances == row["instances"] == pool.machines * gpus_per_machine // pool.layout.gpus
            assert pool.utilization == pytest.approx(row["utilization"], abs=tolerance), (pool, row)
            assert 0 < pool.utilization <= 1
        assert plan.gpus == sum(p.gpus for p in plan.pools)
        tokens_per_hour = (trace.prompt_tokens.sum() + trace.output_tokens.sum()) / trace.span_s * 3600
        assert plan.cost_usd_per_million_tokens == pytest.approx(plan.cost_usd_per_hour / tokens_per_hour * 1e6)
        output_per_hour = trace.output_tokens.sum() / trace.span_s * 3600
        assert plan.cost_usd_per_million_output_tokens == pytest.approx(plan.cost_usd_per_hour / output_per_hour * 1e6)
    assert colocated.plan.mixed_pools[0].instances == 8 * colocated.plan.mixed_pools[0].machines  # TP 1 on 8 GPUs
    one = Trace(small_trace.arrival_s[:1], small_trace.prompt_tokens[:1], small_trace.output_tokens[:1], "one request")
    assert set(usd_per_million_tokens(10.0, one).values()) == {None}  # no span: no rate


def test_a_sequence_cap_sizes_the_token_pool():
    """Issue 28, item 1: with the engine's max_num_seqs, a token pool holds no more running
    requests per instance than the cap (the 99th percentile of the batch its requests see);
    the cap binds where the SLO alone would take fewer instances."""
    from splitplan.search.sizing import size_option
    from splitplan.specs.slo import load_slo
    trace = resample_poisson(load_trace(default_trace_path()), 20.0, 60.0, np.random.default_rng(5))
    inst = Instance(MODEL, load_hardware("h100-80gb"), ENGINE, 8)
    free = size_option(Problem(trace, load_slo("batch"), None), "token", inst)
    capped = size_option(Problem(trace, load_slo("batch"), None, max_num_seqs=2), "token", inst)
    assert capped.instances > free.instances and capped.binding == "max_num_seqs"


@pytest.mark.parametrize(("role", "max_num_seqs"), [("prompt", None), ("token", None), ("token", 8), ("mixed", None)])
def test_an_aimed_count_search_sizes_as_a_scan_of_every_count(monkeypatch, role, max_num_seqs):
    """A pool's count search is aimed by how far each count is from holding (smallest_count's
    score): it finds the count a scan upward from 1 finds, whatever binds, in no more checks than
    the same search without the score."""
    from splitplan.search import sizing as plan
    from splitplan.specs.slo import load_slo
    trace = resample_poisson(load_trace(default_trace_path()), 150.0, 20.0, np.random.default_rng(5))
    problem = Problem(trace, load_slo("chat"), None, max_num_seqs=max_num_seqs)
    aimed, checks = plan.smallest_count, {"aimed": 0, "plain": 0}

    def scan(check, lower=1, guess=None, step_fraction=0.125, score=None):
        return next(n for n in range(lower, 500) if check(n))

    def counted(kind):
        def search(check, lower=1, guess=None, step_fraction=0.125, score=None):
            assert score is not None
            def counted_check(n):
                checks[kind] += 1
                return check(n)
            return aimed(counted_check, lower, guess, step_fraction, score if kind == "aimed" else None)
        return search
    sized = set()
    for hw, tp in (("h100-80gb", 4), ("h100-80gb", 8), ("a100-80gb", 4), ("l40s-48gb", 8)):
        inst = Instance(MODEL, load_hardware(hw), ENGINE, tp)
        found = {}
        for kind, search in (("aimed", counted("aimed")), ("plain", counted("plain")), ("scan", scan)):
            monkeypatch.setattr(plan, "smallest_count", search)
            option = plan.size_option(problem, role, inst)
            found[kind] = (option.instances, option.binding)
        assert found["aimed"] == found["plain"] == found["scan"]
        sized.add(found["aimed"][0])
    assert len(sized) >= 3  # (not one case four times)
    assert checks["aimed"] <= checks["plain"]


def test_an_option_names_what_sized_it_at_one_instance_and_at_its_lower_bound():
    """A light load one instance serves: sized at the minimum, and at a lower bound (a co-located
    pool needs the prompt pool's count) the bound is what binds, not a line it already meets."""
    from splitplan.search.sizing import size_option
    from splitplan.specs.slo import load_slo
    trace = resample_poisson(load_trace(default_trace_path()), 0.5, 60.0, np.random.default_rng(5))
    inst = Instance(MODEL, load_hardware("h100-80gb"), ENGINE, 8)
    problem = Problem(trace, load_slo("batch"), None)
    for role in ("prompt", "token"):
        alone, bounded = size_option(problem, role, inst), size_option(problem, role, inst, lower=3)
        assert (alone.instances, alone.binding) == (1, "minimum size (1 instance)")
        assert (bounded.instances, bounded.binding) == (3, "prompt-pool size (lower bound)")


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([(2, 2), (2, 4), (4, 2), (1, 4)]), st.integers(1, 6), st.integers(1, 6), st.sampled_from(["cost", "power"]),
       st.one_of(st.none(), st.integers(1, 3)))
def test_shared_machines_ilp_equals_grid(layouts, n_prompt, n_token, objective, cap):
    """Issue 30, item 2: a machine may hold prefill and decode instances together (every filling
    of an 8-GPU machine by the two options); the ILP's optimum with them equals the exhaustive
    grid's, and a plan of one machine type never costs more than with dedicated machines alone."""
    from splitplan.search.types import combos
    prompt = Option("prompt", Instance(MODEL, load_hardware("h100-80gb"), ENGINE, Layout(layouts[0])), n_prompt, "test")
    token = Option("token", Instance(MODEL, load_hardware("h100-80gb"), ENGINE, Layout(layouts[1])), n_token, "test")
    shared = combos([prompt, token])
    assert shared and all(c.prompt_instances * layouts[0] + c.token_instances * layouts[1] == 8 for c in shared)
    options = [prompt, token, *shared]
    problem = Problem(trace=None, slo=None, reference=None, objective=objective,
                      max_machines=(MachineCap("h100-80gb", cap, 8),) if cap is not None else ())
    ilp = _ilp_equals_grid(problem, options)
    if ilp is None:
        return
    attr = "price_usd_per_hour" if objective == "cost" else "power_kw"
    try:
        alone = solve_counts(problem, [prompt, token], "grid")
    except InfeasibleError:
        return
    assert _cost(ilp, options, attr) <= _cost(alone, [prompt, token], attr) + 1e-9


def test_a_light_load_on_whole_machines_shares_one_machine(small_trace):
    """Issue 30, item 2: with whole 8-GPU machines, a split plan whose pools each need a few GPUs
    puts prefill and decode instances on one machine (one machine's price, not two); the plan
    says which instances share it, the simulator runs them there (KV over the machine's GPU
    links), and the planner's prediction holds in the simulation."""
    from splitplan.workflows.simulation import Setup, plan_pools
    result = api.optimize(small_trace, "llama3.1-8b", "chat", ["h100-80gb@8"], mode="split")
    plan = result.plan
    (prompt,), (token,) = plan.prompt_pools, plan.token_pools
    assert prompt.shared == token.shared == 0 and prompt.machines == token.machines == 1
    assert plan.machines == 1 and plan.gpus == prompt.gpus + token.gpus == 8 and plan.cost_usd_per_hour == 38.0
    sim = Setup("llama3.1-8b", "chat").simulate(result.problem.trace, plan_pools(plan))
    rows = sim.summary.pools
    assert [(r["role"], r["instances"], r["shared"]) for r in rows] == [("prompt", prompt.instances, 0), ("token", token.instances, 0)]
    for line in sim.summary.slo:
        assert line.met, line
    for metric in ("ttft", "itl", "e2e"):  # the planner's local KV share, as the simulator's
        assert plan.predicted[metric]["p50"] == pytest.approx(sim.summary.latency_ms(metric)["p50"], rel=0.1), metric


def test_kv_between_instances_on_one_machine_moves_over_its_gpu_links(small_trace):
    """A prompt and a token instance sharing a machine: the KV takes NVLink's 450 GB/s per GPU,
    not the NIC share (50 GB/s per GPU on an H100 machine): the first token gap shrinks by the
    difference, the simulator's as the planner's formula."""
    import numpy as np

    from splitplan.perf.roofline import kv_transfer_time_s
    from splitplan.workflows.simulation import Pool, Setup
    setup = Setup("llama3.1-70b", "chat", "vllm")
    trace = small_trace
    apart = setup.simulate(trace, [Pool("prompt", "h100-80gb@4", Layout(4), 1), Pool("token", "h100-80gb@4", Layout(4), 1)])
    shared = setup.simulate(trace, [Pool("prompt", "h100-80gb", Layout(4), 1, 1, 0),
                                    Pool("token", "h100-80gb", Layout(4), 1, 1, 0)])
    inst = Instance(load_model("llama3.1-70b"), load_hardware("h100-80gb"), load_engine("vllm"), Layout(4))
    p = trace.prompt_tokens
    gain = kv_transfer_time_s(inst, inst, p) - kv_transfer_time_s(inst, inst, p, local=True)
    assert np.all(gain > 0)
    assert np.array_equal(apart.result.ttft_s, shared.result.ttft_s)  # (prefill is the same)
    # decode starts earlier on the shared machine by about the transfer saved
    saved = np.nanmean((apart.result.e2e_s - apart.result.ttft_s) - (shared.result.e2e_s - shared.result.ttft_s))
    assert saved > 0.5 * float(np.mean(gain))


@pytest.mark.parametrize("share", [0.0, 0.25, 1.0])
def test_the_planner_sends_its_local_share_of_kv_over_gpu_links(small_trace, share):
    """The planner's decode side on shared machines: that share of the requests (spread evenly)
    have their KV over the machine's GPU links, the rest over the NICs; nothing else changes."""
    import numpy as np

    from splitplan.perf.roofline import kv_transfer_time_s
    from splitplan.search.evaluation import decode_values
    inst = Instance(load_model("llama3.1-70b"), load_hardware("h100-80gb"), load_engine("vllm"), Layout(4))
    problem = Problem(trace=small_trace, slo=None, reference=None)
    start = small_trace.arrival_s + 0.1
    _, remote, _ = decode_values(problem, inst, 2, inst, start)
    _, mixed, _ = decode_values(problem, inst, 2, inst, start, local=(inst, share))
    p = small_trace.prompt_tokens
    gain = kv_transfer_time_s(inst, inst, p) - kv_transfer_time_s(inst, inst, p, local=True)
    saved = remote - mixed
    local = saved > 0
    assert np.allclose(saved[local], gain[local]) and np.all(saved[~local] == 0)
    assert local.mean() == pytest.approx(share, abs=0.02)


def test_a_plan_on_shared_machines_is_the_same_plan_with_its_kv_local(small_trace):
    """evaluate: one prompt and one token TP 4 instance sharing an 8-GPU machine predict what the
    same instances on two 4-GPU machines do, but every request's KV over the machine's GPU links
    (its prompt instance is always on its token instance's machine)."""
    import numpy as np

    from splitplan.perf.roofline import kv_transfer_time_s
    from splitplan.search.evaluation import evaluate
    from splitplan.search.types import Combo, OptionKey
    model, engine = load_model("llama3.1-70b"), load_engine("vllm")
    whole, half = (Instance(model, load_hardware(h), engine, Layout(4)) for h in ("h100-80gb", "h100-80gb@4"))
    combo = Combo(Option("prompt", whole, 1, "t"), Option("token", whole, 1, "t"), 1, 1)
    apart = {OptionKey("prompt", "h100-80gb@4", Layout(4)): Option("prompt", half, 1, "t"),
             OptionKey("token", "h100-80gb@4", Layout(4)): Option("token", half, 1, "t")}
    problem = Problem(trace=small_trace, slo=None, reference=None)
    shared = evaluate(problem, {combo.key: 1}, {combo.key: combo})
    separate = evaluate(problem, dict.fromkeys(apart, 1), apart)
    p = small_trace.prompt_tokens
    gain = kv_transfer_time_s(whole, whole, p) - kv_transfer_time_s(whole, whole, p, local=True)
    assert np.array_equal(shared.ttft, separate.ttft)
    assert np.allclose(separate.e2e - shared.e2e, gain)


def test_a_tp_degree_no_named_machine_takes_is_bad_input_naming_the_machine():
    """--tp must divide every named machine's GPUs, or at least one catalog machine's."""
    from splitplan.base.errors import SpecError
    from splitplan.search.optimize import _check_tp
    h100, mi300x = load_hardware("h100-80gb"), load_hardware("mi300x-192gb")
    with pytest.raises(SpecError, match=r"--tp 3: must divide the 8 GPUs of h100-80gb"):
        _check_tp(3, [h100], [])
    with pytest.raises(SpecError, match="h100-80gb"):  # the first named machine it does not divide
        _check_tp(3, [h100, mi300x], [])
    _check_tp(8, [h100], [])  # (a degree of the machine: nothing to say)
    _check_tp(8, [], [h100, h100.shape(4)])  # no machine named: one catalog machine that takes it is enough
    with pytest.raises(SpecError, match="h100-80gb"):
        _check_tp(3, [], [h100])


def test_a_frontier_plan_has_a_highest_rate_only_where_the_trace_has_a_span():
    """--pareto gives each frontier plan the highest rate it serves; a trace of one request has no
    rate to scale (its span is 0): none is given rather than a made-up one."""
    import dataclasses
    base = resample_poisson(load_trace(default_trace_path()), 3.0, 60.0, np.random.default_rng(2))
    one = dataclasses.replace(base, arrival_s=base.arrival_s[:1], prompt_tokens=base.prompt_tokens[:1],
                              output_tokens=base.output_tokens[:1])
    for trace, has_rate in ((base, True), (one, False)):
        front = api.optimize(trace, "llama2-70b", "splitwise", ["h100-80gb"], tp=8, pareto=True).pareto
        assert front and all((p.max_rate_rps is not None and p.max_rate_rps > 1) == has_rate for p in front)


def test_a_plan_does_not_depend_on_when_the_trace_starts():
    """Shifting every arrival by the same time changes nothing: counts, utilization, latencies."""
    import dataclasses
    base = resample_poisson(load_trace(default_trace_path()), 3.0, 60.0, np.random.default_rng(2))
    later = dataclasses.replace(base, arrival_s=base.arrival_s + 3600.0)
    plans = [api.optimize(t, "llama2-70b", "splitwise", ["h100-80gb"], tp=8, mode="split").plan for t in (base, later)]
    pools = [p.prompt_pools + p.token_pools for p in plans]
    assert [(q.machines, q.instances) for q in pools[0]] == [(q.machines, q.instances) for q in pools[1]]
    assert [q.utilization for q in pools[0]] == pytest.approx([q.utilization for q in pools[1]], rel=1e-6)
    assert [v for _, v, _ in plans[0].slo] == pytest.approx([v for _, v, _ in plans[1].slo], rel=1e-6)


def test_requests_longer_than_any_token_instance_holds_are_left_out_with_the_largest_named():
    """Qwen3-32B on one H100 (TP 1) holds 36,033 tokens of KV, under its 40,960-token window: a
    longer request is left out of the sizing, and the report names the largest instance."""
    from splitplan.search.optimize import _servable
    from splitplan.specs.model import load_model
    trace = Trace(np.array([0.0, 1.0, 2.0]), np.array([1000, 38_000, 2000]), np.array([100, 100, 100]), "t")
    kept, report = _servable(trace, load_model("qwen3-32b"), load_engine("vllm"), [load_hardware("h100-80gb")], 1)
    assert kept.prompt_tokens.tolist() == [1000, 2000]
    assert (report.requests, report.min_prompt_tokens) == (1, 38_000)
    assert "(largest: 36,033 tokens, h100-80gb at TP 1)" in report.reason


def test_a_split_plan_no_repair_can_verify_is_infeasible_naming_the_line(tmp_path):
    """H100 prompt machines meet an E2E p50 of 4.5 s alone (3.3 s), but the A100 token machines'
    decode makes every split plan's E2E 5.4 s, and more machines do not shorten a decode: exit 3
    naming the line, its best value and its target."""
    n = 40
    trace = Trace(np.arange(n) * 2.0, np.full(n, 1000), np.full(n, 300), "t")
    slo = tmp_path / "e2e.yaml"
    slo.write_text("description: E2E only\ne2e:\n  p50: {max_ms: 4500}\n")
    with pytest.raises(InfeasibleError, match=r"no plan found that meets E2E p50: .* target <= 4500 ms"):
        api.optimize(trace, "llama2-70b", str(slo), prompt_hardware=["h100-80gb"], token_hardware=["a100-40gb"], tp=8,
                     mode="split", engine="vllm")


def test_a_plan_says_how_close_it_is_to_failing(small_trace):
    """Issue 54, item 7: every line's attainment (the share of requests within its limit) beside its
    percentile, and per pool the SLO with one instance fewer: for a co-located pool the simulator's
    own verdict on that many instances (the replay that sized it)."""
    from splitplan.specs.roles import Pool, Role
    result = api.optimize(small_trace, "llama2-70b", "chat", ["h100-80gb@2"], tp=2, mode="colocated")
    plan = result.plan
    assert len(plan.attainment_pct) == len(plan.slo)
    for (line, _, ok), attained in zip(plan.slo, plan.attainment_pct, strict=True):
        assert ok and line.percentile <= attained <= 100  # (a line that holds has at least its percentile within)
    (edge,) = plan.cliff
    (pool,) = plan.mixed_pools
    as_planned = api.simulate_pools(small_trace, [Pool(Role.MIXED, "h100-80gb@2", Layout(2), pool.machines)], "llama2-70b", "chat")
    assert list(plan.attainment_pct) == pytest.approx([x.attainment_pct for x in as_planned.summary.slo], rel=1e-9)
    assert (edge["instances"], edge["fewer"]) == (pool.instances, pool.instances - 1)
    fewer = api.simulate_pools(small_trace, [Pool(Role.MIXED, "h100-80gb@2", Layout(2), pool.machines - 1)], "llama2-70b", "chat")
    simulated = {x.line: x.to_json() for x in fewer.summary.slo}
    for row in edge["slo"]:
        assert row["achieved"] == pytest.approx(simulated[row["line"]]["achieved"], rel=1e-6)
        assert row["met"] == simulated[row["line"]]["met"]
        assert row["attainment_pct"] == pytest.approx(simulated[row["line"]]["attainment_pct"], rel=1e-9)
    assert edge["fails"] == next((x.line for x in fewer.summary.slo if not x.met), None)
    split = api.optimize(small_trace, "llama2-70b", "chat", ["h100-80gb@2"], tp=2, mode="split").plan
    assert {(c["role"], c["instances"]) for c in split.cliff} == {(r, p.instances) for r, p in split.by_role()}
    assert all(c["fails"] == "no instance left" for c in split.cliff if c["instances"] == 1)


def test_energy_per_token_stays_at_the_traces_load_whatever_the_headroom(small_trace):
    """Issue 54, item 9: headroom sizes for a heavier load, but the same machines serving the trace's
    own load use as much energy per token (with it, the compressed trace's fuller batches made
    25 and 100 % headroom report 4 and 13 % less)."""
    from splitplan.search.repair import predict
    results = {h: api.optimize(small_trace, "llama2-70b", "chat", ["h100-80gb"], tp=8, mode="split", headroom_pct=h)
               for h in (0, 25, 100)}
    base = results[0].plan
    for r in results.values():
        same = predict(r.problem, base, {o.key: o for o in r.options})
        assert same.energy_kwh_per_million_tokens == pytest.approx(base.energy_kwh_per_million_tokens, rel=1e-6)
        assert same.cost_usd_per_million_tokens == pytest.approx(base.cost_usd_per_million_tokens, rel=1e-9)


def test_plans_only_compared_carry_no_cliff(small_trace):
    """The cliff (one more evaluation per pool) is the reported plan's: a study's designs, a rate
    search's attempts and windows compare plans and leave it out (OptimizeOptions.cliff)."""
    kw = dict(hardware=["h100-80gb"], tp=8, mode="split")
    assert api.optimize(small_trace, "llama2-70b", "chat", **kw).plan.cliff
    assert api.optimize(small_trace, "llama2-70b", "chat", cliff=False, **kw).plan.cliff == ()
    windows = api.plan_windows(60.0, small_trace, "llama2-70b", "chat", hardware=["h100-80gb"], tp=8)
    assert all(p is None or p.cliff == () for p in windows.plans)


def test_a_token_pools_count_search_starts_where_its_kv_holds_the_requests_decoding_alone(monkeypatch):
    """A token pool's count search starts at the instances whose KV holds every request decoding
    at its step alone (capacity.pools.kv_bound_guess): where KV memory binds, it checks that count
    and its neighbour, not the counts from 1 up."""
    from types import SimpleNamespace

    from splitplan.capacity.pools import kv_bound_guess
    from splitplan.search import sizing
    from splitplan.specs.slo import load_slo
    small = SimpleNamespace(fit=SimpleNamespace(kv_capacity_tokens=150))
    prompt, output, step = np.array([100, 100]), np.array([10, 10]), np.array([0.1, 0.1])
    assert kv_bound_guess(np.array([0.0, 0.5]), prompt, output, small, step) == 2  # 220 tokens held at once
    assert kv_bound_guess(np.array([0.0, 1.0]), prompt, output, small, step) == 1  # the first ends as the second starts
    trace = resample_poisson(load_trace(default_trace_path()), 40.0, 30.0, np.random.default_rng(5))
    aimed, checked = sizing.smallest_count, []
    monkeypatch.setattr(sizing, "smallest_count", lambda check, *a, **k: aimed(lambda n: checked.append(n) or check(n), *a, **k))
    for hw, answer in (("h100-80gb", 4), ("a100-80gb", 5)):
        checked.clear()
        option = sizing.size_option(Problem(trace, load_slo("chat"), None), "token", Instance(MODEL, load_hardware(hw), ENGINE, 2))
        assert (option.instances, option.binding) == (answer, "KV memory")
        assert checked == [answer, answer - 1]


def test_a_colocated_pools_count_search_starts_from_the_gaps_its_prefills_stall(monkeypatch):
    """Under an inter-token line a co-located pool's count search starts at `sizing.stall_guess`:
    the instances over which the gaps its prompts' prefills stretch past the limit stay within the
    share the line's percentile allows, with join-shortest-queue sending each prompt where the fewest
    requests decode. A guess: from 0.6 to 1.25 times the count sized where ITL binds, at most one
    instance a request; none without an inter-token line. `optimize` leaves every co-located search to it (no first sized
    option's count scaled by prefill work)."""
    from splitplan.search import optimize as search
    from splitplan.search.sizing import size_option, stall_guess
    from splitplan.specs.slo import load_slo
    trace = resample_poisson(load_trace(default_trace_path()), 40.0, 30.0, np.random.default_rng(5))
    chat = Problem(trace, load_slo("chat"), None)
    for model, hw, tp in ((MODEL, "h100-80gb", 2), (MODEL, "h100-80gb", 8), (MODEL, "a100-80gb", 4), (MODEL, "mi300x-192gb", 2),
                          (load_model("llama3.1-8b"), "h100-80gb", 1)):  # (the last: most prefills stay within the limit)
        inst = Instance(model, load_hardware(hw), ENGINE, tp)
        option = size_option(chat, "mixed", inst)
        assert option.binding == "ITL p99"
        assert 0.6 * option.instances <= stall_guess(chat, inst) <= 1.25 * option.instances
    assert stall_guess(Problem(trace, load_slo("batch"), None), inst) is None
    longest = slice(k := int(np.argmax(trace.prompt_tokens)), k + 1)  # (a prompt whose prefill passes the limit)
    one = Trace(trace.arrival_s[longest], trace.prompt_tokens[longest], trace.output_tokens[longest], "one request")
    assert stall_guess(Problem(one, load_slo("chat"), None), inst) == 1  # (no span: no more instances than requests)
    tasks: list = []
    sized = search._size_one
    monkeypatch.setattr(search, "_size_one", lambda problem, task: tasks.append(task) or sized(problem, task))
    api.optimize(trace, "llama2-70b", "chat", ["a100-80gb", "h100-80gb", "mi300x-192gb"], mode="colocated")
    mixed = [task for task in tasks if task[0] == "mixed"]
    assert len(mixed) >= 3 and all(task[-1] is None for task in mixed)  # (role, instance, lower bound, guess)
