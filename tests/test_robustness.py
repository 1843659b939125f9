"""The extreme but valid, and properties that must hold for any input (issue 7)."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from splitplan import api
from splitplan.base.errors import InfeasibleError
from splitplan.cli import app
from splitplan.workload.trace import (
    Trace,
    default_trace_path,
    load_trace,
    resample_poisson,
    summarize,
)

ROOT = Path(__file__).resolve().parents[1]
BASE = load_trace(default_trace_path())
H = ["a100-80gb", "h100-80gb"]


def test_one_request_trace(tmp_path):
    one = Trace(np.array([0.0]), np.array([1500]), np.array([40]), "one")
    result = api.optimize(one, "llama2-70b", "splitwise", H, tp=8)
    assert result.plan.machines == 1 and result.split.machines == 2 and all(ok for _, _, ok in result.plan.slo)
    assert summarize(one)["mean_rate_rps"] is None
    sim = api.simulate_pools(one, api.plan_pools(result.plan), "llama2-70b", "splitwise")
    assert sim.summary.finished == 1
    path = tmp_path / "one.csv"
    path.write_text("arrival_timestamp,prompt_size,token_size\n5.0,1500,40\n")
    assert CliRunner().invoke(app, ["optimize", "--trace", str(path), "--hardware", "h100-80gb", "--tp", "8"]).exit_code == 0


def test_two_hour_gap_changes_nothing_but_the_span():
    part = resample_poisson(BASE, 5.0, 60.0, np.random.default_rng(4))
    gap = dataclasses.replace(part, arrival_s=np.where(np.arange(len(part)) >= len(part) // 2, part.arrival_s + 7200, part.arrival_s))
    a = api.optimize(part, "llama2-70b", "splitwise", H, tp=8)
    b = api.optimize(gap, "llama2-70b", "splitwise", H, tp=8)
    assert b.plan.cost_usd_per_hour <= a.plan.cost_usd_per_hour  # the gap can only relieve the queues
    sim = api.simulate_pools(gap, api.plan_pools(b.plan), "llama2-70b", "splitwise")
    assert sim.summary.finished + sim.summary.refused_context == len(gap)  # (beyond Llama 2's context: refused)


def test_prompt_longer_than_any_kv_is_reported_as_a_class_not_a_crash(tmp_path):
    trace = resample_poisson(BASE, 3.0, 60.0, np.random.default_rng(5))
    long = dataclasses.replace(trace, prompt_tokens=np.minimum(trace.prompt_tokens, 3500))
    long.prompt_tokens[::50] = 200_000  # far beyond an L40S pair's KV room for Llama-2-13B
    engine = tmp_path / "long-context.yaml"  # (an engine taking requests past Llama 2's 4,096-token context)
    engine.write_text((ROOT / "engine_profiles" / "lean.yaml").read_text() + "\nmax_model_len: 1000000\n")
    result = api.optimize(long, "llama2-13b", "batch", ["l40s-48gb"], tp=2, engine=str(engine))
    u = result.unservable
    assert u.requests == len(long.prompt_tokens[::50]) and u.min_prompt_tokens == 200_000
    assert "exceed the KV capacity" in u.reason
    everything = dataclasses.replace(long, prompt_tokens=np.full(len(long), 200_000))
    with pytest.raises(InfeasibleError, match="no request can be served"):
        api.optimize(everything, "llama2-13b", "batch", ["l40s-48gb"], tp=2, engine=str(engine))


def test_a_request_beyond_the_context_window_is_left_out_by_the_planner_and_refused_by_the_simulator():
    trace = resample_poisson(BASE, 3.0, 60.0, np.random.default_rng(5))
    beyond = trace.prompt_tokens + trace.output_tokens > 4096  # Llama 2's context
    assert beyond.any()
    result = api.optimize(trace, "llama2-70b", "chat", ["h100-80gb"], tp=8)
    u = result.unservable
    assert u.requests == int(beyond.sum()) and "context window (4,096 tokens)" in u.reason
    sim = api.simulate_pools(trace, api.plan_pools(result.plan), "llama2-70b", "chat")
    assert sim.summary.refused_context == int(beyond.sum()) and sim.summary.rejected_kv == 0
    assert np.isnan(sim.result.ttft_s[beyond]).all() and np.isfinite(sim.result.e2e_s[~beyond]).all()
    assert all(line.met for line in sim.summary.slo)  # the refused are reported apart, as the planner leaves them out


def test_slo_only_one_machine_type_meets(tmp_path):
    trace = resample_poisson(BASE, 2.0, 60.0, np.random.default_rng(6))
    machines = ["a100-80gb", "h100-80gb", "b200-180gb"]
    alone = {hw: float(np.percentile(api.instance("llama2-70b", hw, 8, "lean").prefill_time_s(trace.prompt_tokens), 50)) * 1e3
             for hw in machines}
    fastest, second = sorted(alone, key=alone.get)[:2]
    limit = (alone[fastest] + alone[second]) / 2
    slo = tmp_path / "tight.yaml"
    slo.write_text(f"description: t\nttft:\n  p50: {{max_ms: {limit:.3f}}}\ntbt:\n  p99: {{max_ms: 200}}\n")
    result = api.optimize(trace, "llama2-70b", str(slo), machines, tp=8)
    assert {p.hardware for p in result.split.prompt_pools} == {fastest}
    assert result.colocated is None or {p.hardware for p in result.colocated.mixed_pools} == {fastest}


def test_model_that_fits_nowhere_exits_3():
    result = CliRunner().invoke(app, ["optimize", "--model", "llama3.1-405b", "--hardware", "a100-40gb,l40s-48gb", "--tp", "8",
                                      "--slo", "chat"])
    assert result.exit_code == 3 and "fits no prompt hardware" in result.stderr


@settings(max_examples=6, deadline=None)
@given(st.floats(1.0, 10.0), st.floats(1.2, 3.0), st.integers(0, 1000))
def test_more_load_never_lowers_cost(rate, factor, seed):
    low = resample_poisson(BASE, rate, 40.0, np.random.default_rng(seed))
    # the same requests, arriving `factor` times faster
    high = dataclasses.replace(low, arrival_s=low.arrival_s / factor)
    a = api.optimize(low, "llama2-70b", "chat", H, tp=8).plan.cost_usd_per_hour
    b = api.optimize(high, "llama2-70b", "chat", H, tp=8).plan.cost_usd_per_hour
    assert b >= a - 1e-9


@settings(max_examples=6, deadline=None)
@given(st.floats(300, 3000), st.floats(0.3, 0.9), st.integers(0, 1000))
def test_tighter_slo_never_lowers_cost(tmp_path_factory, limit_ms, tighten, seed):
    trace = resample_poisson(BASE, 4.0, 40.0, np.random.default_rng(seed))
    folder = tmp_path_factory.mktemp("slo")
    costs = []
    for limit in (limit_ms, limit_ms * tighten):
        path = folder / f"s{limit:.3f}.yaml"
        path.write_text(f"description: t\nttft:\n  p99: {{max_ms: {limit:.3f}}}\ntbt:\n  p99: {{max_ms: 150}}\n")
        try:
            costs.append(api.optimize(trace, "llama2-70b", str(path), H, tp=8).plan.cost_usd_per_hour)
        except InfeasibleError:
            costs.append(float("inf"))
    assert costs[1] >= costs[0] - 1e-9


@settings(max_examples=5, deadline=None)
@given(st.integers(0, 10_000))
def test_same_seed_same_output(seed):
    args = ["optimize", "--rate", "3", "--duration", "20", "--seed", str(seed), "--hardware", "h100-80gb", "--tp", "8",
            "--format", "json"]
    first, second = CliRunner().invoke(app, args), CliRunner().invoke(app, args)
    assert first.exit_code == 0 and first.stdout == second.stdout
    assert json.loads(first.stdout)["inputs"]["seed"] == seed


def test_output_files_are_never_partial(tmp_path):
    good = tmp_path / "out"
    assert CliRunner().invoke(app, ["optimize", "--rate", "3", "--duration", "20", "--hardware", "h100-80gb", "--tp", "8",
                                    "--output-dir", str(good)]).exit_code == 0
    before = {p.name: p.read_bytes() for p in good.iterdir()}
    bad = CliRunner().invoke(app, ["optimize", "--rate", "3", "--duration", "20", "--hardware", "h100-80gb", "--tp", "8",
                                   "--max-cost-per-hour", "1", "--output-dir", str(good)])
    assert bad.exit_code == 3
    assert {p.name: p.read_bytes() for p in good.iterdir()} == before  # the good files survive a failed run
    assert not list(good.glob(".*tmp*"))


def test_output_files_get_the_usual_permissions(tmp_path):
    from splitplan.io.report import write_set
    write_set({tmp_path / "a.json": "{}"})
    (tmp_path / "b.json").write_text("{}")
    assert (tmp_path / "a.json").stat().st_mode == (tmp_path / "b.json").stat().st_mode


def test_written_files_get_the_users_umask(tmp_path):
    import os
    import stat

    from splitplan.io import report
    old = os.umask(0o022)
    try:
        report.write_set({tmp_path / "plan.json": "{}"})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "plan.json").stat().st_mode) == 0o644  # not mkstemp's 0600
