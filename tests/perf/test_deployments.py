"""Whole-deployment calibration: closed-loop runs replayed, a known engine recovered, bad files refused."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from splitplan import api
from splitplan.cli import app
from splitplan.sim import deployments as dep
from splitplan.specs.engine import load_engine

KNOWN = {"compute_efficiency": 0.55, "memory_efficiency": 0.62, "prefill_overhead_s": 0.004,
         "decode_overhead_s": 0.003, "sequence_overhead_s": 5e-5}


def _row(machine, model, tp, concurrency, isl, osl, ttft, tpot, **extra):
    row = {"backend": "vllm", "system": machine, "precision": "fp8", "mode": "agg", "model_path": model, "isl": isl,
           "osl": osl, "batch_size": concurrency, "tp_size": tp, "pp_size": 1, "attention_dp_size": 1, "moe_ep_size": 1,
           "silicon_ttft_ms": ttft, "silicon_tpot_ms": tpot}
    return row | extra


def _synthetic(tmp_path):
    """Runs 'measured' by simulating a known engine, plus rows the catalog cannot model."""
    truth = dep.with_factors(load_engine("lean-fp8"), KNOWN)
    rows = []
    for system, tp, conc, isl, osl in [("h100_sxm", 1, 1, 512, 32), ("h100_sxm", 1, 8, 1024, 32),
                                       ("h100_sxm", 2, 16, 512, 24), ("h200_sxm", 1, 4, 2048, 16),
                                       ("h200_sxm", 2, 32, 256, 32), ("b200_sxm", 1, 2, 1024, 24)]:
        run = {"model": "llama3.1-8b", "machine": dep.MACHINES[system], "tp": tp, "concurrency": conc, "isl": isl, "osl": osl}
        ttft, tpot = dep.replay(run, truth)
        rows.append(_row(system, "meta-llama/Llama-3.1-8B-Instruct", tp, conc, isl, osl, ttft, tpot))
    rows.append(_row("h100_sxm", "meta-llama/Llama-3.1-8B-Instruct", 1, 4, 512, 32, 50, 10, mode="disagg"))
    rows.append(_row("h100_sxm", "meta-llama/Llama-3.1-8B-Instruct", 1, 4, 512, 32, 50, 10, precision="fp4"))
    rows.append(_row("h100_sxm", "deepseek-ai/DeepSeek-R1", 8, 4, 512, 32, 50, 10))
    rows.append(_row("mi355x", "meta-llama/Llama-3.1-8B-Instruct", 1, 4, 512, 32, 50, 10))
    rows.append(_row("h100_sxm", "meta-llama/Llama-3.1-8B-Instruct", 1, 4, 512, 32, 50, 10, mode=None))
    path = tmp_path / "silicon.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_rows_the_catalog_cannot_model_are_counted_by_reason(tmp_path):
    runs, dropped = dep.read_deployments(_synthetic(tmp_path))
    assert len(runs) == 6
    assert dropped == {"disaggregated (not yet replayed)": 1, "precision other than bf16/fp8": 1,
                       "model not in the catalog or not dense": 1, "machine not in the catalog": 1,
                       "no mode recorded (agg or disagg)": 1}


def test_a_runs_prefill_share_at_the_datasheet_peak_is_hand_computed():
    # Llama-3.1-8B at TP 1: per layer 4096 x (4096 + 2 x 1024) + 4096 x 4096 + 2 x 14336 x 4096 + 14336 x 4096
    # = 218,103,808 weights, 32 layers, 2 FLOPs each a token at H100's 1,979 fp8 TFLOP/s (no curve for 'tgi');
    # 10 clients of 1,000-token prompts each finish one in 0.1 + 100 x 0.01 = 1.1 s
    run = {"engine": "tgi", "machine": "h100-80gb", "model": "llama3.1-8b", "precision": "fp8", "tp": 1,
           "concurrency": 10, "isl": 1000, "osl": 101, "ttft_ms": 100.0, "tpot_ms": 10.0}
    s_per_token = 2 * 218_103_808 * 32 / 1979e12
    assert dep.prefill_share(pd.DataFrame([run]))[0] == pytest.approx(10 * 1000 / 1.1 * s_per_token, rel=1e-9)
    # NVIDIA's measured GEMMs never beat the peak, and their attention comes on top: the same run's prompts take longer
    measured = dep.prefill_share(pd.DataFrame([run | {"engine": "vllm"}]))[0]
    assert 10 * 1000 / 1.1 * s_per_token < measured < 3 * 10 * 1000 / 1.1 * s_per_token


@pytest.mark.parametrize("engine,ratio", [("tgi", (2.0, 2.0)), ("vllm", (2.1, 2.6))])
def test_a_prompts_attention_grows_with_its_square(engine, ratio):
    # twice the prompt in the same time: twice the GEMM work, and causal attention four times (vLLM's measured
    # curves time it; without curves only the GEMMs are counted, at the peak)
    run = {"engine": engine, "machine": "h100-80gb", "model": "llama3.1-8b", "precision": "fp8", "tp": 1,
           "concurrency": 10, "isl": 4000, "osl": 101, "ttft_ms": 100.0, "tpot_ms": 10.0}
    short, long = dep.prefill_share(pd.DataFrame([run, run | {"isl": 8000}]))
    assert ratio[0] - 1e-9 <= long / short <= ratio[1] + 1e-9


def test_a_run_faster_than_its_prompts_can_be_prefilled_is_left_out_by_reason(tmp_path):
    # 64 clients of 8,000-token prompts done every 0.11 s: 4.7 M prompt tokens a second on one H100, whose GEMMs
    # pass at most 0.14 M at the peak: prompts served from a cache, not computed (one client of 500 tokens is kept)
    rows = [_row("h100_sxm", "meta-llama/Llama-3.1-8B-Instruct", 1, 64, 8000, 2, 100.0, 10.0),
            _row("h100_sxm", "meta-llama/Llama-3.1-8B-Instruct", 1, 1, 500, 2, 100.0, 10.0)]
    path = tmp_path / "silicon.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    runs, dropped = dep.read_deployments(path)
    assert len(runs) == 1 and runs.concurrency[0] == 1
    assert dropped == {dep.TOO_FAST: 1}


def test_prompts_served_from_the_prefix_cache_make_a_replayed_run_faster():
    run = {"model": "llama3.1-8b", "machine": "h100-80gb", "tp": 1, "concurrency": 8, "isl": 2048, "osl": 32}
    cold = dep.replay(run, load_engine("vllm-fp8"))
    cached = dep.replay(run, load_engine("vllm-fp8"), cached_tokens=2032)  # (all but the last 16-token block)
    assert cached[0] < 0.5 * cold[0] and cached[1] < cold[1]  # (prefills of 16 tokens instead of 2,048)


def _calibrate(tmp_path, frame: pd.DataFrame, output: str = "fitted.yaml"):
    """`splitplan calibrate --deployments` (no folds) of `frame` written as a deployments file."""
    path = tmp_path / "silicon.csv"
    frame.to_csv(path, index=False)
    return CliRunner().invoke(app, ["calibrate", "--deployments", str(path), "--backend", "vllm", "--folds", "0",
                                    "--output", str(tmp_path / output)])


def test_calibrate_deployments_says_which_runs_it_left_out_and_why(tmp_path):
    rows = [_row("h100_sxm", "meta-llama/Llama-3.1-8B-Instruct", 1, 2, 512, 16, 60.0, 8.0),
            _row("h100_sxm", "meta-llama/Llama-3.1-8B-Instruct", 1, 64, 8000, 2, 100.0, 10.0),  # (30x too fast)
            _row("h100_sxm", "deepseek-ai/DeepSeek-R1", 8, 4, 512, 32, 50, 10)]
    result = _calibrate(tmp_path, pd.DataFrame(rows))
    assert result.exit_code == 0, result.output
    left_out = " ".join(result.stdout.split())  # (the console wraps long lines)
    assert "1 x model not in the catalog or not dense" in left_out
    assert "1 x faster than its prompts can be prefilled (prompts served from a prefix cache, or shorter than recorded)" in left_out


def test_runs_no_instance_can_replay_as_recorded_are_left_out_by_reason():
    # each a kept catalog run that the replay cannot model: NaN predictions, which no fit can take
    run = {"model": "llama3.1-70b", "machine": "h200-141gb", "engine": "vllm", "precision": "fp8", "tp": 2,
           "concurrency": 4, "isl": 1024, "osl": 128, "ttft_ms": 100.0, "tpot_ms": 10.0}
    runs = pd.DataFrame([run, run | {"tp": 3}, run | {"machine": "l40s-48gb", "tp": 1}, run | {"isl": 131_000},
                         run | {"model": "llama3.1-8b", "tp": 1, "machine": "h100-80gb", "isl": 131_000, "osl": 72}])
    why = dep.unservable(runs, load_engine("lean-fp8"))
    assert why[0] == ""
    assert why[1] == "TP 3 does not divide the 8 GPUs of h200-141gb"
    assert why[2] == "llama3.1-70b weights need 70.6 GB per GPU at TP 1, l40s-48gb has 41.5 GB usable per GPU"
    assert why[3] == "requests longer than llama3.1-70b's context window (131,072 tokens)"
    assert why[4] == ""  # (131,072 tokens in all: exactly the window)
    assert all(math.isnan(dep.replay(r, load_engine("lean-fp8"))[1]) for r in runs.to_dict("records")[1:3])
    # an engine that leaves Llama-3.1-8B's weights (8 GB of fp8) about 0.5 GB of the GPU: some 7,000 tokens of KV
    tight = load_engine("lean-fp8").model_copy(update={"activation_reserve_gb_per_gpu": 68.5})
    small = run | {"model": "llama3.1-8b", "machine": "h100-80gb", "tp": 1}
    why = dep.unservable(pd.DataFrame([small, small | {"isl": 8000}]), tight)
    assert why[0] == "" and why[1] == "requests longer than the KV cache an instance holds (6,694 tokens)"


def test_calibrate_deployments_leaves_out_runs_it_cannot_replay_instead_of_failing(tmp_path):
    rows = [_row("h100_sxm", "meta-llama/Llama-3.1-8B-Instruct", 1, 2, 512, 16, 60.0, 8.0),
            _row("h200_sxm", "meta-llama/Llama-3.1-8B-Instruct", 3, 2, 512, 16, 60.0, 8.0),
            _row("h100_sxm", "meta-llama/Llama-3.1-70B", 1, 1, 30_000, 16, 6_000.0, 30.0),  # (27k tokens of KV)
            _row("h100_sxm", "meta-llama/Llama-3.1-8B-Instruct", 1, 1, 200_000, 16, 60_000.0, 8.0),
            _row("h100_sxm", "meta-llama/Llama-3.1-8B-Instruct", 1, 2, 512, 1, 60.0, 8.0)]
    result = _calibrate(tmp_path, pd.DataFrame(rows))
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    left_out = " ".join(result.stdout.split())
    assert "1 x fewer than 2 output tokens (no TPOT)" in left_out
    assert "1 x not servable as recorded under lean-fp8: TP 3 does not divide the 8 GPUs of h200-141gb" in left_out
    assert "1 x not servable as recorded under lean-fp8: requests longer than the KV cache an instance holds" in left_out
    assert "1 x not servable as recorded under lean-fp8: requests longer than llama3.1-8b's context window" in left_out
    # with none left that it can replay, the file is refused, naming why, and nothing is written
    result = _calibrate(tmp_path, pd.DataFrame(rows[1:]), "refused.yaml")
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    message = " ".join(result.stderr.split())
    assert "no run of backend 'vllm' that lean-fp8 can replay" in message and "TP 3 does not divide" in message
    assert not (tmp_path / "refused.yaml").exists()


def test_a_file_without_parallel_columns_whose_runs_are_all_left_out_is_refused_with_the_reasons(tmp_path):
    rows = [_row("h100_sxm", "deepseek-ai/DeepSeek-R1", 8, 4, 512, 32, 50, 10),
            _row("h100_sxm", "meta-llama/Llama-3.1-8B-Instruct", 1, 64, 8000, 2, 100.0, 10.0)]
    result = _calibrate(tmp_path, pd.DataFrame(rows).drop(columns=["pp_size", "attention_dp_size", "moe_ep_size"]))
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    message = " ".join(result.stderr.split())
    assert "no run of backend 'vllm'" in message and "1 x model not in the catalog or not dense" in message
    assert "1 x faster than its prompts can be prefilled" in message and not (tmp_path / "fitted.yaml").exists()


@pytest.mark.slow
def test_calibration_recovers_a_known_engine_from_whole_runs(tmp_path):
    path = _synthetic(tmp_path)
    result = api.calibrate_deployments(str(path), "vllm", "lean-fp8", folds=False)
    assert result.table.iloc[-1]["ttft_mape_fit_pct"] < 3 and result.table.iloc[-1]["tpot_mape_fit_pct"] < 3
    before = dep.error_table(result.runs, dep.predict(result.runs, load_engine("lean-fp8")), None).iloc[-1]
    assert before["tpot_mape_fit_pct"] > 10  # the data are far from the starting point: the fit did the work
    assert result.profile.defaults.memory_efficiency == pytest.approx(KNOWN["memory_efficiency"], rel=0.15)
    assert result.profile.fit["runs"] == 6 and result.profile.name == "vllm"


@pytest.mark.slow
def test_held_out_folds_by_machine_predict_every_run(tmp_path):
    runs, _ = dep.read_deployments(_synthetic(tmp_path))
    assert dep.fold_column(runs) == "machine"
    held = dep.cross_validate(runs, load_engine("lean-fp8"), "machine", max_evaluations=8)
    assert np.isfinite(held).all()


@pytest.mark.parametrize("args,needle", [
    (["--deployments", "X"], "needs --backend"),
    (["--deployments", "X", "--perf-db", "Y", "--backend", "vllm"], "one of them"),
    (["--perf-db", "tests/data/splitwise_perf_model.csv", "--backend", "vllm"], "--backend goes with --deployments"),
    (["--deployments", "X", "--backend", "tgi"], "no run of backend 'tgi'"),
    (["--deployments", "X", "--backend", "vllm", "--engine", "lean"], "start from a profile of that precision"),
    (["--deployments", "tests/data/splitwise_perf_model.csv", "--backend", "vllm"], "not a deployment file"),
])
def test_calibrate_deployments_failures(args, needle, tmp_path, monkeypatch):
    from pathlib import Path
    path = _synthetic(tmp_path)
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    args = [str(path) if a == "X" else a for a in args]
    result = CliRunner().invoke(app, ["calibrate", *args, "--folds", "0"])
    assert result.exit_code == 2 and needle in result.stderr, result.output


@pytest.mark.parametrize("row,column,value,needle", [
    (0, "tp_size", "two", "line 2: column tp_size has 'two', not a number"),
    (7, "silicon_ttft_ms", "fast", "line 9: column silicon_ttft_ms has 'fast', not a number"),  # (a row left out, still read)
    (1, "batch_size", "1e308", "line 3: column batch_size is 1e+308; expected a whole number from 1 to 100,000"),
    (2, "isl", "1.5", "line 4: column isl is 1.5; expected a whole number"),
    (3, "tp_size", "0", "line 5: column tp_size is 0; expected a whole number from 1 to 1,024"),
    (4, "silicon_tpot_ms", "inf", "line 6: column silicon_tpot_ms has 'inf', not a finite number"),
])
def test_a_cell_that_is_no_run_figure_is_refused_naming_its_line(tmp_path, row, column, value, needle):
    """Text where a number belongs (in a row the catalog cannot model too), a count that is not a
    whole number within its bound, an infinite latency: exit 2 naming the line, never a wrapped
    integer or a comparison of text with a number."""
    frame = pd.read_csv(_synthetic(tmp_path)).astype(object)
    frame.loc[row, column] = value
    frame.to_csv(tmp_path / "bad.csv", index=False)
    result = CliRunner().invoke(app, ["calibrate", "--deployments", str(tmp_path / "bad.csv"), "--backend", "vllm",
                                      "--folds", "0"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and needle in result.output, result.output


def test_one_client_replays_back_to_back_requests_in_milliseconds():
    """Concurrency 1 on a whole machine: no queueing, so the mean TTFT is one prefill and the
    mean TPOT one decode step over the request's context (both in ms, as the files give them)."""
    from splitplan.perf.roofline import Instance
    from splitplan.specs.hardware import load_hardware
    from splitplan.specs.model import load_model
    profile = load_engine("lean-fp8")
    run = {"model": "llama3.1-8b", "machine": "h100-80gb", "tp": 8, "concurrency": 1, "isl": 1000, "osl": 3}
    ttft_ms, tpot_ms = dep.replay(run, profile)
    inst = Instance(load_model("llama3.1-8b"), load_hardware("h100-80gb"), profile, 8)
    assert ttft_ms == pytest.approx(float(inst.prefill_time_s(1000)) * 1e3, rel=1e-9)
    steps = [float(inst.decode_step_time_s(1, 1000 + k)) for k in (1, 2)]  # the 2nd and 3rd token
    assert tpot_ms == pytest.approx(np.mean(steps) * 1e3, rel=1e-6)


def test_a_run_is_replayed_with_the_scheduler_settings_it_records():
    """A run recording its token budget and sequence cap is replayed with them (bench/replay_settings.py);
    one recording none, at the profile's own (the engine's defaults: lean-fp8's 2,048 tokens and no
    cap, vllm-fp8's 8,192 tokens and 1,024 requests). Eight clients of 1,000-token prompts: the
    budget decides how many whole prompts a prefill batches; a cap of one request runs the
    requests one after another."""
    profile = load_engine("lean-fp8")
    run = {"model": "llama3.1-8b", "machine": "h100-80gb", "tp": 8, "concurrency": 8, "isl": 1000, "osl": 8}
    ttft_ms, tpot_ms = dep.replay(run, profile)
    assert dep.replay({**run, "max_batch_tokens": 2048}, profile) == (ttft_ms, tpot_ms)
    assert len({ttft_ms, *(dep.replay({**run, "max_batch_tokens": b}, profile)[0] for b in (1000, 4000))}) == 3
    assert dep.replay({**run, "max_num_seqs": 1}, profile)[0] > 2 * ttft_ms
    vllm = load_engine("vllm-fp8")
    assert dep.replay(run, vllm) == dep.replay({**run, "max_batch_tokens": 8192, "max_num_seqs": 1024}, vllm) \
        != dep.replay({**run, "max_batch_tokens": 2048}, vllm)


@pytest.mark.parametrize("machine, tp", [("h100-80gb", 8), ("h200-141gb", 1), ("b200-180gb", 2)])
def test_vllm_fp8_runs_on_curved_gpus_do_not_read_its_fitted_efficiencies(machine, tp):
    """vllm-fp8's compute and memory efficiency are fitted to aiconfigurator's vLLM runs; on those
    runs' GPUs its kernel curves time every operator they would, so its error there is
    out-of-sample (bench/deployment_errors.py says so): moving them moves no prediction there."""
    shipped = load_engine("vllm-fp8")
    moved = shipped.model_copy(update={"defaults": shipped.defaults.model_copy(update={"compute_efficiency": 0.3,
                                                                                     "memory_efficiency": 0.4})})
    run = {"model": "llama3.1-70b", "machine": machine, "tp": tp, "concurrency": 8, "isl": 1024, "osl": 128}
    assert shipped.kernel_curves == "vllm" and dep.replay(run, moved) == dep.replay(run, shipped)
    plain = shipped.model_copy(update={"kernel_curves": None})
    assert dep.replay(run, plain.model_copy(update={"defaults": moved.defaults})) != dep.replay(run, plain)


def test_a_disaggregated_run_keeps_its_load_per_instance_on_whole_machines():
    """One TP-4 prefill worker (half an 8-GPU machine) and one DP-8 EP-8 decode worker: scaled by 2,
    two prefill instances fill one machine, two decode instances two machines, twice the clients."""
    run = {"model": "deepseek-v3", "machine": "b200-180gb", "concurrency": 16, "prefill_layout": "tp4",
           "prefill_workers": 1, "decode_layout": "dp8ep8", "decode_workers": 1}
    pools, clients = dep.run_pools(run, load_engine("sglang-fp8"))
    assert [(p.role, p.machines, p.instances) for p in pools] == [("prompt", 1, 2), ("token", 2, 2)] and clients == 32
    agg = {"model": "deepseek-v3", "machine": "h200-141gb", "concurrency": 8, "layout": "dp16ep16"}
    (pool,), clients = dep.run_pools(agg, load_engine("sglang-fp8"))
    assert (pool.role, pool.machines, pool.instances, clients) == ("mixed", 2, 1, 8)


def test_a_disaggregated_run_reports_the_first_token_as_its_clients_got_it():
    """A disaggregated benchmark's clients get the first token from a decode worker: the replay's
    mean TTFT takes the KV transfer and the decode worker's admission, and its TPOT what is left."""
    run = {"model": "llama3.1-8b", "machine": "h100-80gb", "concurrency": 8, "isl": 2048, "osl": 64,
           "prefill_layout": "tp1", "prefill_workers": 1, "decode_layout": "tp1", "decode_workers": 1}
    result = dep._replay(run, load_engine("vllm"))[0]
    later = np.nan_to_num(result.transfer_s + result.decode_queue_s)  # (NaN: a one-token answer of the graded first wave)
    assert np.mean(later > 0) > 0.9
    ttft_ms, tpot_ms = dep.replay(run, load_engine("vllm"))
    assert ttft_ms == pytest.approx(np.mean(result.ttft_s + later) * 1e3, rel=1e-12)
    expected_tpot = (result.e2e_s - result.ttft_s - later) / (run["osl"] - 1)
    assert tpot_ms == pytest.approx(np.mean(expected_tpot[result.measured]) * 1e3, rel=1e-12)


def test_a_run_whose_instance_cannot_hold_the_model_is_not_predicted():
    run = {"model": "deepseek-v3", "machine": "h100-80gb", "concurrency": 4, "layout": "tp8", "isl": 512, "osl": 16}
    assert all(np.isnan(dep.replay(run, load_engine("sglang-fp8"))))


@pytest.mark.parametrize("engine,tp,concurrency,isl,osl", [("lean-fp8", 1, 8, 512, 16), ("vllm-fp8", 2, 16, 3000, 24),
                                                           ("sglang-fp8", 4, 5, 1024, 12)])
def test_an_aggregated_run_replays_one_instance_as_its_whole_machine(engine, tp, concurrency, isl, osl):
    """The replay simulates one of the machine's instances with its clients: the whole machine
    (8 / TP instances, join-shortest-queue, every client at once, each instance's first wave graded
    as the replayed one's) gives the same means."""
    from splitplan.sim.cluster import SimOptions, simulate
    from splitplan.workload.trace import closed_loop_workload
    run = {"model": "llama3.1-8b", "machine": "h100-80gb", "tp": tp, "concurrency": concurrency, "isl": isl, "osl": osl}
    profile = load_engine(engine)
    pools, clients = dep.run_pools(run, profile)
    assert pools[0].instances == 8 // tp and clients == concurrency * 8 // tp
    work = closed_loop_workload(None, clients, dep.REQUESTS_PER_CLIENT * clients, isl, osl)
    one = closed_loop_workload(None, concurrency, dep.REQUESTS_PER_CLIENT * concurrency, isl, osl)
    work.output_tokens[:clients] = np.repeat(one.output_tokens[:concurrency], pools[0].instances)  # (each instance's first wave
    # graded as the one replayed: join-shortest-queue gives request k to instance k mod instances)
    whole = simulate(work, pools, SimOptions(profile.batch_tokens(), concurrency=clients, max_num_seqs=profile.seqs_cap(),
                                             warmup_requests=clients))  # (the profile's settings: the runs record none)
    expected = (np.nanmean(whole.ttft_s) * 1e3, np.nanmean(whole.tpot_s[clients:]) * 1e3)
    assert dep.replay(run, profile) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=15, deadline=None)
@given(st.sampled_from([("llama3.1-8b", "h100-80gb", 1), ("llama3.1-70b", "h200-141gb", 4), ("qwen3-32b", "b200-180gb", 2)]),
       st.integers(1, 48), st.sampled_from([256, 1024, 3000]), st.sampled_from([2, 40, 300]),
       st.sampled_from(["lean-fp8", "chunked-async"]), st.fixed_dictionaries(
           {k: st.floats(lo, hi) for k, (lo, hi, _) in dep.DEPLOYMENT_FACTORS.items()}))
def test_a_recorded_schedule_times_a_run_as_its_replay_does_under_any_factors(where, concurrency, isl, osl, engine, factors):
    """A run simulated once (sim.deployments.record) and timed under other factors gives the
    replay's means under those factors: the scheduler's decisions depend on counts alone."""
    model, machine, tp = where
    base = load_engine("lean-fp8")
    if engine == "chunked-async":  # (vLLM's scheduling, without its front-end latency; small decodes wait on the host)
        base = base.model_copy(update={"scheduler": "chunked", "async_scheduling": True, "max_num_seqs": 16,
                                       "defaults": base.defaults.model_copy(update={"host_launch_s_per_layer": 3e-4})})
    run = {"model": model, "machine": machine, "tp": tp, "concurrency": concurrency, "isl": isl, "osl": osl}
    schedule = dep.record(run, dep.with_factors(base, {}))
    assert schedule is not None
    trial = dep.with_factors(base, factors)
    timed = schedule.means(dep.run_pools(run, trial)[0][0].perf)
    assert timed == pytest.approx(dep.replay(run, trial), rel=1e-9)


def test_runs_whose_timing_changes_their_schedule_have_none():
    """A front-end latency puts arrivals inside iterations: how long those take decides what
    joins which one, so such a run is simulated at every evaluation."""
    run = {"model": "llama3.1-8b", "machine": "h100-80gb", "tp": 1, "concurrency": 8, "isl": 512, "osl": 16}
    assert dep.record(run, load_engine("lean-fp8")) is not None
    assert dep.record(run, load_engine("vllm-fp8")) is None  # (9 ms of front-end latency)
    assert dep.record({**run, "model": "deepseek-v3", "tp": 8}, load_engine("sglang-fp8")) is None  # (does not fit)


def test_calibration_falls_back_to_simulating_every_evaluation_if_a_schedule_disagrees(tmp_path, monkeypatch):
    path = _synthetic(tmp_path)
    honest = api.calibrate_deployments(str(path), "vllm", "lean-fp8", folds=False)
    monkeypatch.setattr(dep.Schedule, "means", lambda self, inst: (1.0, 1.0))
    checked = api.calibrate_deployments(str(path), "vllm", "lean-fp8", folds=False)
    for name in dep.DEPLOYMENT_FACTORS:  # (as fitted on the schedules, to their rounding)
        assert getattr(checked.profile.defaults, name) == pytest.approx(getattr(honest.profile.defaults, name), rel=1e-6)


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-4, 0.05), st.floats(1e-9, 1e-6), st.floats(-0.01, 0.05), st.integers(1, 256), st.integers(0, 10**6),
       st.integers(1, 3000))
def test_a_decode_stretch_in_closed_form_is_the_sum_of_its_steps(base, per_token, slack, batch, context, iterations):
    steps = [base + max((context + j * batch) * per_token, slack) for j in range(iterations)]
    assert float(dep.stretch_s(base, per_token, slack, batch, context, iterations)) == pytest.approx(math.fsum(steps), rel=1e-12)


def test_error_table_is_signed_percent_error_by_machine_band_and_overall():
    runs = pd.DataFrame({"machine": ["h100-80gb", "h100-80gb", "h200-141gb"], "band": ["1-4", "1-4", "5-16"],
                         "ttft_ms": [100.0, 200.0, 50.0], "tpot_ms": [10.0, 20.0, 5.0]})
    predicted = np.array([[110.0, 9.0], [180.0, 22.0], [50.0, 6.0]])  # TTFT +10, -10, 0 %; TPOT -10, +10, +20 %
    table = dep.error_table(runs, predicted, None).set_index(["machine", "band"])
    h100, everything = table.loc[("h100-80gb", "1-4")], table.loc[("all", "all")]
    assert (h100["runs"], h100["ttft_mape_fit_pct"], h100["tpot_bias_fit_pct"]) == (2, pytest.approx(10), pytest.approx(0))
    assert everything["ttft_bias_fit_pct"] == pytest.approx(0) and everything["tpot_bias_fit_pct"] == pytest.approx(10)
    assert everything["tpot_mape_fit_pct"] == pytest.approx(40 / 3)


def test_the_factors_scales_let_fourteen_evaluations_recover_a_known_engine(tmp_path):
    """The fit steps each factor on its own scale (DEPLOYMENT_FACTORS: an efficiency moves by
    tenths, a per-sequence overhead by tens of microseconds), so a few evaluations recover all
    five factors from the base profile, well within the 25 `calibrate --deployments` spends per
    fit (8 did before compute_efficiency's upper bound came down to B200's measured fp8 GEMM
    ceiling, 0.835: the trust region's steps shrink near a bound; 10 did before the replayed clients
    ran out of phase, 14 since)."""
    runs, _ = dep.read_deployments(_synthetic(tmp_path))
    fitted = dep.fit_deployments(runs, load_engine("lean-fp8"), max_evaluations=14)
    for name, value in KNOWN.items():
        assert getattr(fitted.defaults, name) == pytest.approx(value, rel=0.01), name


def test_the_replayed_clients_run_out_of_phase_after_their_first_wave():
    """Identical requests that finish in one iteration send their next ones together, which
    prefill together and finish together again: a simulation keeps such lockstep groups for
    ever, which measured runs do not show. The replay grades the first wave's outputs
    (workload.trace.out_of_phase), so the clients free up spread over a request's life: on
    Llama-3.1-70B, H100 TP 8, four clients of 1,024-token prompts queue behind each other's
    prefills far less than in lockstep (measured: 70 ms)."""
    from splitplan.sim.cluster import SimOptions, simulate
    from splitplan.workload.trace import closed_loop_workload
    run = {"model": "llama3.1-70b", "machine": "h100-80gb", "tp": 8, "concurrency": 4, "isl": 1024, "osl": 256}
    profile = load_engine("vllm-fp8")
    pools, clients = dep.run_pools(run, profile)
    work = closed_loop_workload(None, clients, dep.REQUESTS_PER_CLIENT * clients, 1024, 256)
    work.output_tokens[:clients] = 256  # (the first wave ungraded: lockstep)
    lockstep = simulate(work, pools,
                        SimOptions(profile.batch_tokens(), concurrency=clients, max_num_seqs=profile.seqs_cap()))
    ttft_ms, tpot_ms = dep.replay(run, profile)
    assert ttft_ms < 0.75 * np.mean(lockstep.ttft_s) * 1e3
    assert tpot_ms == pytest.approx(np.nanmean(lockstep.tpot_s) * 1e3, rel=0.05)  # (the decodes batch alike)


HOSTILE_VALUES = st.one_of(st.none(), st.sampled_from(["", "x", "agg", "disagg", "fp8", "bf16", "fp4", "h100_sxm", "b200_sxm",
                                                         "mi355x", "meta-llama/Llama-3.1-70B", "Qwen/Qwen3-32B", "vllm"]),
                           st.integers(-3, 20), st.sampled_from([1_000_000, 10**9]), st.floats(allow_nan=True, allow_infinity=True))
SIZES = {"tp_size": st.sampled_from([1, 2, 3, 4, 6, 8, 16]), "isl": st.sampled_from([1, 200, 130_000, 200_000]),
         "osl": st.sampled_from([1, 2, 8]), "batch_size": st.sampled_from([1, 4, 64])}


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_hostile_deployments_files_fail_as_bad_input_never_as_a_crash(tmp_path_factory, data):
    """Any cell of a small deployments file holding any value, and its runs any size a catalog row
    can have: the file is fitted, or refused as bad input (exit 2's errors); never another exception
    (runs that cannot be replayed are left out, by reason)."""
    from splitplan.base.errors import SplitplanError
    rows = [_row("h100_sxm", "meta-llama/Llama-3.1-8B-Instruct", 1, 2, 512, 16, 60.0, 8.0),
            _row("h200_sxm", "meta-llama/Llama-3.1-8B-Instruct", 2, 4, 1024, 8, 70.0, 6.0),
            _row("b200_sxm", "meta-llama/Llama-3.1-70B", 4, 1, 256, 8, 90.0, 9.0)]
    frame = pd.DataFrame(rows).astype(object)
    row = data.draw(st.integers(0, 2))
    for column, sizes in SIZES.items():
        frame.at[row, column] = data.draw(sizes)
    for _ in range(data.draw(st.integers(0, 2))):
        frame.at[data.draw(st.integers(0, 2)), data.draw(st.sampled_from(list(frame.columns)))] = data.draw(HOSTILE_VALUES)
    path = tmp_path_factory.mktemp("hostile") / "silicon.csv"
    frame.to_csv(path, index=False)
    try:
        result = api.calibrate_deployments(str(path), "vllm", "lean-fp8", folds=False)
    except SplitplanError:
        return
    assert np.isfinite(result.runs[["fit_ttft_ms", "fit_tpot_ms"]].to_numpy(float)).all()
