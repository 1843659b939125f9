"""Every command through typer's CliRunner, failures and exit codes included."""

import json
import re
from itertools import pairwise
from pathlib import Path

import pytest
from typer.testing import CliRunner

from splitplan.cli import app
from splitplan.specs.layout import Layout
from splitplan.workload.trace import load_workload
from tests.conftest import PERF_DB
from tests.test_plan_document import _error

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


def test_hardware_list_table_and_json():
    assert "h100-80gb-cap70" in run("hardware", "list").stdout
    data = json.loads(run("hardware", "list", "--format", "json").stdout)
    assert {"a100-80gb", "h100-80gb", "mi300x-192gb"} <= {d["name"] for d in data}


def test_models_list():
    assert "llama3.1-405b" in run("models", "list").stdout
    data = json.loads(run("models", "list", "--format", "json").stdout)
    assert {d["name"]: d["kv_bytes_per_token_bf16"] for d in data}["bloom-176b"] == 4_014_080


def test_trace_summarize(tmp_path):
    from splitplan.workload.trace import default_trace_path
    result = run("trace", "summarize", str(default_trace_path()), "--format", "json")
    assert result.exit_code == 0 and json.loads(result.stdout)["requests"] == 8819
    resampled = json.loads(run("trace", "summarize", str(default_trace_path()), "--rate", "10", "--duration", "60",
                               "--format", "json").stdout)
    assert 500 < resampled["requests"] < 700
    assert "inter-arrival CV" in run("trace", "summarize", str(default_trace_path())).stdout
    generic = tmp_path / "g.csv"
    generic.write_text("t,p,o\n0,10,2\n1,20,3\n")
    out = run("trace", "summarize", str(generic), "--time-column", "t", "--prompt-column", "p", "--output-column", "o", "--format", "json")
    assert json.loads(out.stdout)["requests"] == 2


def test_perf_json_contract():
    result = run("perf", "--model", "llama2-70b", "--hardware", "h100-80gb", "--tp", "8",
                 "--prefill", "512,2048,4x512", "--decode", "1x512,64x2048", "--format", "json")
    assert result.exit_code == 0, result.output
    points = json.loads(result.stdout)
    assert [(p["phase"], p["batch"]) for p in points] == [("prefill", 1), ("prefill", 1), ("prefill", 4), ("decode", 1), ("decode", 64)]
    assert points[1]["prompt_tokens"] == 2048 and points[4]["context_tokens"] == 2048
    assert all(p["latency_ms"] > 0 and p["bound"] in {"compute", "memory", "network", "overhead"} for p in points)
    assert points[1]["latency_ms"] > points[0]["latency_ms"]


def test_perf_default_tp_is_smallest_that_fits():
    table = run("perf", "--model", "llama3.1-70b", "--hardware", "h100-80gb")
    # 141 GB of weights: TP 1 cannot hold them; TP 2, 70.6 GB a GPU of the 75 GB vllm leaves of 81,559 MiB, can
    assert table.exit_code == 0 and "TP 2" in table.stdout
    text = " ".join(table.stdout.split())
    for term in ("compute (operator classes", "memory (classes", "network (tensor-parallel", "overhead (engine"):
        assert term in text  # the table explains its breakdown columns


def test_perf_accepts_model_file_and_engine(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
                               "intermediate_size": 512, "vocab_size": 1000}))
    result = run("perf", "--model", str(cfg), "--hardware", "l40s-48gb", "--engine", "splitwise-vllm", "--format", "json")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("args,code,needle", [
    (["perf", "--model", "llama2-70bb"], 2, "did you mean 'llama2-70b'"),
    (["perf", "--hardware", "h100"], 2, "unknown hardware 'h100'"),
    (["perf", "--tp", "3"], 2, "--tp 3: must divide the 8 GPUs"),
    (["perf", "--prefill", "4y512"], 2, "--prefill '4y512'"),
    (["perf", "--model", "llama3.1-405b", "--hardware", "a100-40gb", "--tp", "8"], 3, "does not fit a100-40gb at TP 8"),
    (["perf", "--model", "llama2-70b", "--hardware", "h100-80gb", "--tp", "1"], 3, "does not fit h100-80gb at TP 1"),
    (["perf", "--engine", "nope"], 2, "unknown engine profile 'nope'"),
    (["trace", "summarize", "/nonexistent.csv"], 2, "no such file"),
    (["trace", "summarize", "/tmp", "--rate", "-1"], 2, "--rate -1: must be > 0"),
])
def test_user_errors_are_one_line_with_exit_code(args, code, needle):
    result = run(*args)
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr
    assert "Traceback" not in result.output


def test_debug_shows_traceback():
    result = run("--debug", "perf", "--model", "nope")
    assert result.exit_code != 0 and result.exception is not None


def test_optimize_json_contract_and_output_dir(tmp_path):
    out = tmp_path / "plan"
    result = run("optimize", "--rate", "3", "--duration", "60", "--hardware", "a100-80gb,h100-80gb", "--tp", "8",
                 "--split-only", "--format", "json", "--output-dir", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema_version"] == 3 and doc["inputs"]["model"] == "llama2-70b"
    plan = doc["plan"]
    for key in ("prompt_pools", "token_pools", "cost_usd_per_hour", "power_kw", "predicted", "binding", "alternatives"):
        assert key in plan
    assert set(plan["predicted"]) == {"ttft_ms", "tbt_ms", "itl_ms", "tpot_ms", "e2e_ms"}
    assert set(plan["predicted"]["ttft_ms"]) == {"p50", "p90", "p99"}
    assert {"hardware", "tp", "dp", "ep", "pp", "layout", "machines", "instances", "gpus", "utilization",
            "prefix_hit_rate", "spare_instances", "shared"} == set(plan["prompt_pools"][0])
    written = json.loads((out / "plan.json").read_text())
    assert {k: v for k, v in written.items() if k != "specs"} == doc and set(written["specs"]) == {"hardware", "model",
                                                                                                  "engine", "slo"}
    assert (out / "candidates.csv").read_text().startswith("kind,role,hardware")
    assert (out / "pareto.csv").read_text().startswith("rank,")
    again = run("optimize", "--rate", "3", "--duration", "60", "--hardware", "a100-80gb,h100-80gb", "--tp", "8",
                "--split-only", "--format", "json")
    assert again.stdout == result.stdout  # deterministic


def test_optimize_table_and_csv():
    table = run("optimize", "--rate", "3", "--duration", "60", "--hardware", "h100-80gb", "--tp", "8", "--slo", "chat")
    assert table.exit_code == 0 and "Predicted against the SLO" in table.stdout and "binding" in table.stdout
    assert "8 GPUs" in table.stdout and "busy)" in table.stdout and "per million output tokens" in table.stdout
    csv = run("optimize", "--rate", "3", "--duration", "60", "--hardware", "h100-80gb", "--tp", "8", "--format", "csv")
    header, first = csv.stdout.splitlines()[:2]
    assert header.startswith("rank,prompt_pools")
    row = dict(zip(header.split(","), first.split(","), strict=False))
    assert all(float(row[f"{m}_p99_ms"]) > 0 for m in ("ttft", "tbt", "itl", "tpot", "e2e"))  # (issue 54, item 8)


def test_every_output_with_tbt_carries_itl_and_tpot():
    """Issue 54, item 8: the sweep CSV and a runner-up's simulation carry ITL and TPOT beside TBT."""
    sweep = run("sweep", "--rates", "2", "--prompt-pool", "h100-80gb:8:1", "--token-pool", "h100-80gb:8:1", "--duration", "20")
    header = sweep.stdout.splitlines()[0].split(",")
    assert {f"{m}_{q}_ms" for m in ("itl", "tpot") for q in ("p50", "p90", "p99")} <= set(header)
    validated = run("optimize", "--rate", "4", "--duration", "30", "--hardware", "h100-80gb", "--tp", "8", "--validate",
                    "--format", "json")
    alternatives = json.loads(validated.stdout)["plan"]["alternatives"]
    assert alternatives and all({"itl_ms", "tpot_ms", "tbt_ms"} <= set(a["simulated"]) for a in alternatives)


@pytest.mark.parametrize("args,code,needle", [
    (["optimize", "--slo", "nope"], 2, "unknown SLO profile 'nope'"),
    (["optimize", "--max-machines", "h100-80gb"], 2, "expected TYPE=N"),
    (["optimize", "--rate", "0"], 2, "--rate 0: must be > 0"),
    (["optimize", "--rate", "3", "--duration", "30", "--hardware", "h100-80gb", "--max-cost-per-hour", "5"], 3, "within the budget"),
    (["optimize", "--model", "llama3.1-405b", "--hardware", "a100-40gb", "--tp", "8", "--slo", "chat"], 3, "fits no prompt hardware"),
    (["optimize", "--model", "llama3.1-405b", "--slo", "splitwise"], 2, "measures slowdown against a100-80gb at TP 8, which cannot serve"),
])
def test_optimize_failures(args, code, needle, tmp_path):
    result = run(*args, "--output-dir", str(tmp_path / "o"))
    assert result.exit_code == code, result.output
    assert result.stderr.startswith("error: ") and needle in result.stderr, result.stderr
    assert not (tmp_path / "o").exists()  # no partial output


def test_optimize_no_split_has_mixed_pools():
    result = run("optimize", "--rate", "3", "--duration", "60", "--hardware", "h100-80gb", "--tp", "8", "--no-split", "--format", "json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plan"]
    assert "mixed_pools" in plan and "prompt_pools" not in plan and plan["split_saving_pct"] is None


@pytest.mark.parametrize("objective,unit", [("cost", "cost_usd_per_hour"), ("power", "power_kw")])
def test_the_plan_is_the_best_of_split_and_colocated_under_the_objective(objective, unit):
    """At 3 req/s one co-located H100 serves what a split plan needs two for: it is the plan,
    the split one a runner-up, and the comparison is in the objective's unit."""
    args = ["optimize", "--rate", "3", "--duration", "60", "--hardware", "h100-80gb", "--tp", "8", "--objective", objective]
    plan = json.loads(run(*args, "--format", "json").stdout)["plan"]
    split = [a for a in plan["alternatives"] if "prompt_pools" in a]
    assert "mixed_pools" in plan and split and plan[unit] < split[0][unit]
    assert plan["split_saving_pct"] == pytest.approx((1 - split[0][unit] / plan[unit]) * 100, rel=1e-4)
    table = run(*args).stdout
    assert "vs best split" in table and f"splitting adds 100 % {objective}" in table
    forced = json.loads(run(*args, "--split-only", "--format", "json").stdout)["plan"]
    assert "prompt_pools" in forced and any("mixed_pools" in a for a in forced["alternatives"])
    assert forced["split_saving_pct"] == pytest.approx(plan["split_saving_pct"])
    assert run(*args, "--split-only", "--no-split").exit_code == 2


def test_optimize_throughput():
    result = run("optimize", "--objective", "throughput", "--hardware", "h100-80gb", "--tp", "8", "--max-machines",
                 "h100-80gb=4", "--rate", "3", "--duration", "60", "--format", "json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plan"]
    assert plan["max_rate_rps"] > 3 and plan["machines"] <= 4
    missing = run("optimize", "--objective", "throughput", "--hardware", "h100-80gb")
    assert missing.exit_code == 2 and "needs a budget" in missing.stderr


def test_optimize_heterogeneous_splitwise_ha_and_power_budget():
    result = run("optimize", "--rate", "3", "--duration", "60", "--prompt-hardware", "h100-80gb", "--token-hardware", "a100-80gb",
                 "--tp", "8", "--objective", "power", "--max-power-kw", "200", "--split-only", "--format", "json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plan"]
    assert {p["hardware"] for p in plan["prompt_pools"]} == {"h100-80gb"}
    assert {p["hardware"] for p in plan["token_pools"]} == {"a100-80gb"}
    assert plan["power_kw"] <= 200


def test_simulate_inline_json_contract_and_files(tmp_path):
    result = run("simulate", "--prompt-pool", "h100-80gb:8:2", "--token-pool", "h100-80gb:8:1", "--rate", "4",
                 "--duration", "30", "--format", "json", "--output-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["summary"]
    for key in ("ttft_ms", "tbt_ms", "e2e_ms"):
        assert set(summary[key]) == {"p50", "p90", "p99"}
    assert {"line", "target", "achieved", "met"} <= set(summary["slo"][0])
    # the code trace's requests beyond Llama 2's 4,096-token context are refused, the rest served whole
    assert summary["refused_context"] > 0 and summary["finished"] + summary["refused_context"] == summary["requests"]
    rows = (tmp_path / "requests.csv").read_text().splitlines()
    assert rows[0].startswith("request,arrival_s,prompt_tokens,output_tokens,ttft_ms") and len(rows) == summary["requests"] + 1
    assert json.loads((tmp_path / "summary.json").read_text())["summary"] == summary
    assert summary["preemptions"] == 0  # (given when none happened too)


def test_simulate_reports_every_pool_in_its_layout():
    """DP/EP pools print their layout and carry tp, dp, ep, pp and layout as numbers and text (issue 27)."""
    args = ["simulate", "--model", "deepseek-v3", "--engine", "sglang-fp8", "--prompt-pool", "h200-141gb:8:2",
            "--token-pool", "h200-141gb:dp16ep16:2", "--rate", "2", "--duration", "10"]
    doc = json.loads(run(*args, "--format", "json").stdout)
    expected = [{"tp": 8, "dp": 1, "ep": 1, "pp": 1, "layout": "tp8"}, {"tp": 1, "dp": 16, "ep": 16, "pp": 1, "layout": "dp16ep16"}]
    for pools in (doc["inputs"]["pools"], doc["summary"]["pools"]):
        assert [{k: p[k] for k in ("tp", "dp", "ep", "pp", "layout")} for p in pools] == expected
    assert "DP 16 EP 16" in run(*args).stdout


def test_simulate_plan_file_from_optimize(tmp_path):
    out = tmp_path / "o"
    assert run("optimize", "--rate", "3", "--duration", "30", "--hardware", "h100-80gb", "--tp", "8", "--slo", "chat",
               "--output-dir", str(out)).exit_code == 0
    result = run("simulate", "--plan", str(out / "plan.json"), "--rate", "3", "--duration", "30", "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["inputs"]["slo"] == "chat"  # taken from the plan's inputs
    assert "Pools" in run("simulate", "--plan", str(out / "plan.json"), "--rate", "3", "--duration", "30").stdout


def test_simulate_mixed_pool_and_round_robin():
    result = run("simulate", "--mixed-pool", "h100-80gb:8:2", "--routing", "round-robin", "--rate", "3", "--duration", "30",
                 "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["summary"]["pools"][0]["role"] == "mixed"


@pytest.mark.parametrize("args,needle", [
    (["simulate"], "nothing to simulate"),
    (["simulate", "--prompt-pool", "h100-80gb:8"], "expected HARDWARE:LAYOUT:MACHINES"),
    (["simulate", "--prompt-pool", "h100-80gb:8:1"], "give prompt and token pools"),
    (["simulate", "--prompt-pool", "h100-80gb:8:1", "--token-pool", "h100-80gb:8:0"], "0 machines; a pool has 1 to"),
    (["simulate", "--plan", "/nonexistent/plan.json"], "no such file"),
    (["simulate", "--prompt-pool", "h100-80gb:8:1", "--token-pool", "h100-80gb:8:1", "--routing", "random"],
     "choose jsq, round-robin or prefix-aware"),
    (["simulate", "--prompt-pool", "h100-80gb:8:1", "--token-pool", "b200-180gb:8:1", "--perf-db",
      "tests/data/splitwise_perf_model.csv"], "no measurements for llama2-70b on b200-180gb TP 8"),
    (["simulate", "--prompt-pool", "h100-80gb:8:1", "--token-pool", "h100-80gb:8:1", "--perf-db",
      "tests/data/splitwise_perf_model.csv", "--perf-interp", "cubic"], "choose splitplan or splitwise-sim"),
])
def test_simulate_failures(args, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    result = run(*args, "--output-dir", str(tmp_path / "o"))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and needle in result.stderr, result.stderr
    assert not (tmp_path / "o").exists()


def test_simulate_bad_plan_file(tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text('{"plan": {"prompt_pools": [{"hardware": "h100-80gb"}]}}')
    result = run("simulate", "--plan", str(bad))
    assert result.exit_code == 2 and "not a splitplan plan.json" in result.stderr


def test_optimize_validate_reports_simulated_beside_predicted():
    result = run("optimize", "--rate", "4", "--duration", "30", "--hardware", "h100-80gb", "--tp", "8", "--validate",
                 "--split-only", "--format", "json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plan"]
    assert set(plan["simulated"]["ttft_ms"]) == {"p50", "p90", "p99"}
    assert all(line["met"] for line in plan["simulated"]["slo"])
    predicted = {line["line"]: line["achieved"] for line in plan["slo"]}
    for line in plan["simulated"]["slo"]:  # the planner and the simulator tell the same story
        assert line["achieved"] == pytest.approx(predicted[line["line"]], rel=0.25), line


def test_perf_with_perf_db():
    result = run("perf", "--hardware", "a100-80gb", "--tp", "8", "--prefill", "2048,20000", "--decode", "64x576",
                 "--perf-db", str(PERF_DB), "--format", "json")
    points = json.loads(result.stdout)
    assert points[0]["bound"] == "measured" and abs(points[0]["latency_ms"] - 274.2) < 3
    assert points[1]["bound"] == "extrapolated"
    assert points[0]["timed_from"] == {"passes": f"measured forward passes ({PERF_DB})"}


def test_pareto_colocated_plans_report_their_max_rate():
    result = run("optimize", "--pareto", "--rate", "1", "--duration", "60", "--hardware", "h100-80gb@8", "--tp", "8",
                 "--format", "json")
    assert result.exit_code == 0, result.output
    front = json.loads(result.stdout)["pareto"]
    colocated = [p for p in front if p.get("mixed_pools")]
    assert colocated and all(p["max_rate_rps"] >= 1 * 0.95 for p in colocated)


def test_perf_db_naming_a_hardware_file(tmp_path):
    """Measurements may name the machine by its spec file, as `--hardware` does."""
    gpu = tmp_path / "my-gpu.yaml"
    gpu.write_text((Path(__file__).resolve().parents[1] / "hardware_specs" / "h100-80gb.yaml").read_text())
    db = tmp_path / "measured.csv"
    db.write_text("hardware,model,tp,phase,batch,prompt_tokens,context_tokens,latency_ms\n"
                  f"{gpu},llama2-70b,8,prefill,1,512,0,50\n{gpu},llama2-70b,8,prefill,1,2048,0,140\n"
                  f"{gpu},llama2-70b,8,decode,1,0,1024,20\n{gpu},llama2-70b,8,decode,8,0,1024,24\n")
    result = run("perf", "--hardware", str(gpu), "--tp", "8", "--prefill", "1024", "--perf-db", str(db), "--format", "json")
    assert result.exit_code == 0, result.output
    point = json.loads(result.stdout)[0]
    assert point["bound"] == "measured" and point["latency_ms"] == pytest.approx(80)


def test_optimize_pareto_frontier_and_plot(tmp_path):
    png = tmp_path / "pareto.png"
    result = run("optimize", "--pareto", "--rate", "6", "--duration", "30", "--hardware", "a100-80gb,h100-80gb,h200-141gb",
                 "--slo", "splitwise", "--format", "json", "--plot", str(png), "--output-dir", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    front = json.loads(result.stdout)["pareto"]
    assert front and all(all(line["met"] for line in p["slo"]) for p in front)
    workload = load_workload(None, 6, 30.0)  # the requests within llama2-70b's context window are planned
    kept = workload.arrival_s[workload.prompt_tokens + workload.output_tokens <= 4096]
    planned_rps = len(kept) / (kept[-1] - kept[0])
    assert all(p["max_rate_rps"] >= planned_rps * 0.999 for p in front)  # each serves at least the planned load
    for a in front:  # nobody on the frontier is beaten on both cost and power
        assert not any(b["cost_usd_per_hour"] <= a["cost_usd_per_hour"] and b["power_kw"] < a["power_kw"] - 1e-9
                       or b["cost_usd_per_hour"] < a["cost_usd_per_hour"] - 1e-9 and b["power_kw"] <= a["power_kw"]
                       for b in front)
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 5000
    assert len((tmp_path / "o" / "pareto.csv").read_text().splitlines()) == len(front) + 1
    assert run("optimize", "--plot", str(png)).exit_code == 2  # --plot needs --pareto


@pytest.mark.parametrize("argv,needle", [
    (["perf", "--tp", "abc"], "error: Invalid value for '--tp'"),
    (["perf", "--bogus"], "error: No such option: --bogus"),
    (["nosuch"], "error: No such command 'nosuch'"),
    (["compare"], "error: Missing option '--scenario'"),
    (["optimize", "--rate", "0"], "error: --rate 0: must be > 0"),
])
def test_console_script_usage_errors_are_one_line(argv, needle, monkeypatch, capsys):
    from splitplan.cli import main
    monkeypatch.setattr("sys.argv", ["splitplan", *argv])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(needle), err


def test_simulate_reads_a_table_as_splitwise_sim_does():
    args = ["simulate", "--model", "bloom-176b", "--prompt-pool", "h100-80gb:8:6", "--token-pool", "h100-80gb:8:2",
            "--rate", "15", "--duration", "20", "--perf-db", str(PERF_DB), "--format", "json"]
    ours = json.loads(run(*args).stdout)
    theirs = json.loads(run(*args, "--perf-interp", "splitwise-sim", "--engine", "splitwise-sim").stdout)
    assert theirs["inputs"]["perf_interp"] == "splitwise-sim" and ours["inputs"]["perf_interp"] == "splitplan"
    # splitwise-sim reads every decode step at the batch-1 time: TBT no longer grows with the batch
    assert theirs["summary"]["tbt_ms"]["p50"] < 36 < ours["summary"]["tbt_ms"]["p50"]


def test_simulate_closed_loop_reports_benchmark_figures():
    result = run("simulate", "--mixed-pool", "h100-80gb:8:1", "--concurrency", "8", "--isl", "1024", "--osl", "64",
                 "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["inputs"]["concurrency"] == 8 and doc["summary"]["requests"] == 100
    bench = doc["summary"]["benchmark"]
    assert set(bench["tpot_ms"]) == {"mean", "median", "p99"} and bench["gpus"] == 8
    assert bench["output_tokens_per_s_per_gpu"] == pytest.approx(bench["output_tokens_per_s"] / 8, abs=1e-3)  # (both rounded)


@pytest.mark.parametrize("args,needle", [
    (["--concurrency", "4", "--rate", "5"], "drop --rate"),
    (["--isl", "100"], "add --concurrency"),
    (["--concurrency", "0"], "--concurrency 0: must be >= 1 and <= 100,000 clients"),
    (["--concurrency", "2", "--osl", "0"], "--osl 0: must be >= 1"),
])
def test_simulate_closed_loop_failures(args, needle):
    result = run("simulate", "--mixed-pool", "h100-80gb:8:1", *args)
    assert result.exit_code == 2 and needle in result.stderr, result.output


def test_optimize_closed_loop_plans_the_rate_the_loop_runs_at():
    result = run("optimize", "--concurrency", "32", "--isl", "1024", "--osl", "256", "--model", "llama3.1-70b", "--slo", "chat",
                 "--hardware", "h100-80gb,h200-141gb", "--engine", "lean-fp8", "--format", "json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plan"]
    loop = plan["closed_loop"]
    rounds = loop["rounds"]
    # the first round plans the fastest rate the loop could run at; later ones the rate the last plan's loop ran at
    assert rounds[0]["planned_rate_rps"] > rounds[0]["simulated_rate_rps"]
    assert all(b["planned_rate_rps"] == pytest.approx(a["simulated_rate_rps"], rel=0.05) for a, b in pairwise(rounds))
    assert all(line["met"] for line in loop["slo"]) and loop["concurrency"] == 32
    cheapest_met = min(r["cost_usd_per_hour"] for r in rounds if r["slo_met"])  # (the plan: it, trimmed while its loop meets the SLO)
    assert plan["cost_usd_per_hour"] < cheapest_met if loop["machines_removed"] else plan["cost_usd_per_hour"] == cheapest_met
    pools = plan.get("prompt_pools", []) + plan.get("token_pools", []) + plan.get("mixed_pools", [])
    assert loop["benchmark"]["gpus"] == sum(p["gpus"] for p in pools) == plan["gpus"]


@pytest.mark.parametrize("args,code,needle", [
    (["--concurrency", "8", "--rate", "5"], 2, "drop --rate"),
    (["--concurrency", "8", "--pareto"], 2, "drop --pareto"),
    (["--osl", "64"], 2, "add --concurrency"),
    (["--concurrency", "0"], 2, "must be >= 1"),
    (["--concurrency", "8", "--isl", "1024", "--osl", "64", "--slo", "{slo}"], 3, "TTFT p50 <= 1 ms cannot be met"),
])
def test_optimize_closed_loop_failures(args, code, needle, tmp_path):
    slo = tmp_path / "tight.yaml"
    slo.write_text("description: impossible\nttft:\n  p50: {max_ms: 1}\n")
    result = run("optimize", "--hardware", "h100-80gb", *[a.replace("{slo}", str(slo)) for a in args])
    assert result.exit_code == code and needle in result.stderr, result.output


@pytest.mark.parametrize(("itl_ms", "code", "needle"), [
    (18, 0, "ITL p99 not met"),  # the A100 cannot reach it: skipped, the plan from the H100
    (0.5, 3, "error: ITL p99 <= 0.5 ms cannot be met: the best reachable is"),
])
def test_optimize_an_inter_token_line_some_or_no_hardware_reaches(tmp_path, itl_ms, code, needle):
    """Issue 54, item 1: tightening the pace line exits 0 with a plan or 3 naming the best value, never a traceback."""
    slo = tmp_path / "itl.yaml"
    slo.write_text(f"ttft:\n  p99: {{max_ms: 2000}}\nitl:\n  p99: {{max_ms: {itl_ms}}}\n")
    out = tmp_path / "out"
    result = run("optimize", "--rate", "4", "--duration", "120", "--hardware", "a100-80gb,h100-80gb", "--tp", "8",
                 "--split-only", "--slo", str(slo), "--output-dir", str(out))
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    if code:
        assert needle in result.stderr and not out.exists()
    else:
        assert needle in (out / "candidates.csv").read_text()


def test_json_on_stdout_is_only_json_in_a_real_process():
    """A solver printing from native code (highspy's banner) bypasses CliRunner's capture:
    only a real process shows what `| jq` would get."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "from splitplan.cli import main; main()", "optimize", "--rate", "4",
                          "--duration", "30", "--hardware", "h100-80gb", "--tp", "8", "--split-only", "--format", "json"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["plan"]["prompt_pools"]


def test_a_plan_says_what_timed_each_pools_operators(tmp_path):
    """A plan on a GPU with vLLM's measured kernel curves (H100) and one without (A100 40GB) says what
    each pool's latencies came from: in the table, the JSON and plan.json, which simulate reads back."""
    args = ["optimize", "--prompt-hardware", "a100-40gb", "--token-hardware", "h100-80gb", "--tp", "8", "--rate", "2",
            "--duration", "30", "--split-only"]
    runner = CliRunner()
    doc = json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)
    timed = {x["hardware"]: set(x["operators"].values()) for x in doc["timed_from"]}
    assert timed["h100-80gb"] == {"measured vllm kernels on h100-80gb"}
    assert timed["a100-40gb"] == {"roofline: datasheet peak and bandwidth, vllm's factors"}
    table = " ".join(runner.invoke(app, args).stdout.split())
    assert "Operators timed by: a100-40gb tp8: roofline: datasheet peak and bandwidth, vllm's factors (GEMMs," in table
    assert "h100-80gb tp8: measured vllm kernels on h100-80gb (GEMMs," in table
    assert runner.invoke(app, [*args, "--output-dir", str(tmp_path / "p")]).exit_code == 0
    assert json.loads((tmp_path / "p" / "plan.json").read_text())["timed_from"] == doc["timed_from"]
    assert runner.invoke(app, ["simulate", "--plan", str(tmp_path / "p" / "plan.json")]).exit_code == 0


def test_optimize_solves_its_program_without_scipy():
    """The integer program goes to HiGHS through highspy: planning loads no SciPy, whose
    optimizers take 0.3-0.4 s to import (a quarter of a default `optimize`)."""
    import subprocess
    import sys
    code = ("import sys\nfrom splitplan.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('scipy' in sys.modules, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code, "optimize", "--rate", "4", "--duration", "30", "--hardware", "h100-80gb",
                          "--split-only", "--format", "json"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["plan"]["prompt_pools"] and out.stderr.split()[-1] == "False"


def test_every_command_reading_a_plan_takes_its_model_slo_and_engine(tmp_path):
    """One rule for simulate and sweep: an option given wins, else the plan's own, else the default."""
    out = tmp_path / "p"
    made = run("optimize", "--model", "llama3.1-8b", "--slo", "chat", "--engine", "lean-fp8", "--hardware", "h100-80gb",
               "--tp", "1", "--rate", "4", "--duration", "30", "--split-only", "--output-dir", str(out))
    assert made.exit_code == 0, made.output
    plan = str(out / "plan.json")
    explicit = ["--model", "llama3.1-8b", "--slo", "chat", "--engine", "lean-fp8"]
    sweep = ["sweep", "--rates", "2,4", "--duration", "20"]
    assert run(*sweep, "--plan", plan).stdout == run(*sweep, "--plan", plan, *explicit).stdout
    assert run(*sweep, "--plan", plan).stdout != run(*sweep, "--plan", plan, "--engine", "lean").stdout
    simulate = ["simulate", "--rate", "3", "--duration", "20", "--format", "json"]
    assert run(*simulate, "--plan", plan).stdout == run(*simulate, "--plan", plan, *explicit).stdout


def test_default_slo_is_absolute_and_needs_no_reference_machine():
    """The 405B model fits no A100 at TP 8; the default (chat, in ms) plans it on H200 and B200."""
    result = run("optimize", "--model", "llama3.1-405b", "--hardware", "h200-141gb,b200-180gb", "--rate", "1",
                 "--duration", "30", "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["inputs"]["slo"] == "chat"
    for line in doc["plan"]["slo"]:  # targets are numbers with their unit
        assert isinstance(line["target"], float) and line["unit"] == "ms" and line["metric"] in ("ttft", "itl")
    table = run("optimize", "--model", "llama3.1-405b", "--hardware", "h200-141gb,b200-180gb", "--rate", "1", "--duration", "30")
    assert "<= 500 ms" in table.stdout and " ms │" in table.stdout  # achieved values carry their unit


def test_reports_warn_when_compared_prices_are_years_apart():
    args = ["optimize", "--rate", "3", "--duration", "30", "--hardware", "a100-80gb,h200-141gb", "--tp", "8"]
    doc = json.loads(run(*args, "--format", "json").stdout)
    assert len(doc["warnings"]) == 1 and "2023-11" in doc["warnings"][0] and "2026-09" in doc["warnings"][0]
    assert "warning: prices from 2023-11" in run(*args).stdout
    same_year = json.loads(run("optimize", "--rate", "3", "--duration", "30", "--hardware", "h200-141gb,b200-180gb",
                               "--tp", "8", "--format", "json").stdout)
    assert same_year["warnings"] == []


@pytest.mark.parametrize("hardware", [["--hardware", "h100-80gb"], []])
def test_a_tp_that_divides_no_named_machine_is_bad_input(hardware):
    result = run("optimize", *hardware, "--tp", "3", "--rate", "2", "--duration", "20")
    assert result.exit_code == 2 and "--tp 3: must divide the 8 GPUs" in result.stderr


def test_version():
    import splitplan
    result = run("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"splitplan {splitplan.__version__}"


def test_the_cli_starts_without_the_heavy_libraries():
    """--help and small commands must start fast (bench/startup.py times them): the CLI
    imports pandas, SciPy and PuLP only when a command uses them."""
    import subprocess
    import sys
    code = ("import sys, splitplan.cli; "
            "print(sorted(m for m in ('pandas', 'scipy', 'pulp', 'matplotlib') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    # every command's library (splitplan.api) leaves SciPy's optimizers to the commands that fit or solve,
    # and pandas to those that read tables (a plain CSV trace is read without it: tests/workload)
    code = "import sys, splitplan.api; print('scipy.optimize' in sys.modules, 'pandas' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() == ["False", "False"]


def _trace_csv(path, header, scale=1.0):
    rows = [f"{k * 0.5 * scale:g},{500 + 10 * k},{20 + k}" for k in range(40)]
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return str(path)


@pytest.mark.parametrize("command", [
    ["trace", "summarize"],
    ["optimize", "--hardware", "h100-80gb", "--tp", "8", "--trace"],
    ["simulate", "--mixed-pool", "h100-80gb:8:1", "--trace"],
    ["sweep", "--rates", "1", "--duration", "20", "--mixed-pool", "h100-80gb:8:1", "--trace"],
    ["compare", "--scenario", "iso-throughput-cost", "--trace"],
])
def test_every_command_reading_a_trace_takes_common_and_named_columns(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)  # short relative names: a long temporary path would wrap in the table
    detected = run(*command, _trace_csv(Path("a.csv"), "arrival_time,input_length,output_length"))
    assert detected.exit_code == 0, detected.output
    named = run(*command, _trace_csv(Path("b.csv"), "t,in,out", scale=1000), "--time-column", "t",
                "--prompt-column", "in", "--output-column", "out", "--time-unit", "ms")
    assert named.exit_code == 0, named.output
    if command[0] != "sweep":  # (a sweep resamples the sizes: the two traces' times do not show)
        assert detected.stdout.replace("a.csv", "x") == named.stdout.replace("b.csv", "x")
    missing = run(*command, _trace_csv(Path("c.csv"), "when,in,out"))
    assert missing.exit_code == 2 and "--time-column" in missing.stderr


def test_one_notation_for_a_pool_in_text():
    from splitplan.io import report
    from splitplan.search.types import SizedPool
    assert report.pools_text((SizedPool.of("h100-80gb", 8, Layout(8), 3), SizedPool.of("a100-80gb", 8, Layout(4),
                                                                             2))) == "3x h100-80gb TP 8 + 2x a100-80gb TP 4"


def test_long_work_reports_progress_in_a_log(monkeypatch, capsys):
    """Not on a terminal, progress is one line per interval on stderr (none for quick work)."""
    from splitplan.cli import common
    ticks = iter([0.0, 1.0, 11.0, 12.0, 30.0])
    monkeypatch.setattr("time.monotonic", lambda: next(ticks))
    with common._progress("compare: designs", total=4) as step:
        for _ in range(4):
            step()
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["compare: designs: 2/4 done, 11 s", "compare: designs: 4/4 done, 30 s"]


def test_a_user_catalog_is_searched_before_the_shipped_one(tmp_path, monkeypatch):
    """After a non-editable install the shipped catalog is inside the package: users add
    entries in their own folder, by --catalog DIR or SPLITPLAN_PATH."""
    from splitplan.specs.catalog import data_dir
    (tmp_path / "hardware_specs").mkdir()
    text = (data_dir("hardware_specs") / "h200-141gb.yaml").read_text()
    (tmp_path / "hardware_specs" / "my-h200.yaml").write_text(text.replace("price_usd_per_hour: 36.0", "price_usd_per_hour: 20.0"))
    listed = json.loads(run("--catalog", str(tmp_path), "hardware", "list", "--format", "json").stdout)
    assert {h["name"]: h["price_usd_per_hour"] for h in listed}["my-h200"] == 20.0
    assert run("hardware", "list", "--format", "json").stdout.count("my-h200") == 0  # only when asked
    monkeypatch.setenv("SPLITPLAN_PATH", str(tmp_path))
    plan = json.loads(run("optimize", "--hardware", "my-h200", "--tp", "8", "--rate", "2", "--duration", "20",
                          "--format", "json").stdout)["plan"]
    assert plan["cost_usd_per_hour"] == 20.0
    bad = run("--catalog", str(tmp_path / "nope"), "hardware", "list")
    assert bad.exit_code == 2 and "--catalog" in bad.stderr


@pytest.mark.parametrize("command,wider", [
    (["optimize", "--rate", "5", "--duration", "30", "--hardware", "a100-80gb,h100-80gb", "--tp", "8"], True),
    (["hardware", "list"], True), (["models", "list"], False), (["perf"], False),
    (["simulate", "--prompt-pool", "h100-80gb:8:2", "--token-pool", "h100-80gb:8:1", "--rate", "3", "--duration", "20"], False),
])
def test_tables_fit_120_columns_unless_wide(command, wider):
    narrow = run(*command)
    assert narrow.exit_code == 0 and max(map(len, narrow.stdout.splitlines())) <= 120
    wide = run("--wide", *command)
    widest = max(map(len, wide.stdout.splitlines()))
    assert wide.exit_code == 0 and (widest > 120 if wider else widest == max(map(len, narrow.stdout.splitlines())))


@pytest.mark.parametrize("width", [30, 80, 120])
def test_numbers_and_names_are_never_cut_at_any_width(width):
    """A table too wide for the terminal prints wider (the terminal wraps its lines) rather than cut
    a number or a name into `17.…`; only prose cells wrap (issue 27, item 8)."""
    import io

    from splitplan.io import report
    con = report._Console(file=io.StringIO(), width=width)
    rows = [("h100-80gb-cap70", 1_600.0, 17.6, "a long description that may wrap over several lines of the cell")]
    con.print(report.table("t", ["name", "net\nGbit/s", "$/h", "what"], rows))
    out = con.file.getvalue()
    assert "h100-80gb-cap70" in out and "1,600" in out and "17.60" in out and "Gbit/s" in out and "…" not in out
    assert con.width == width  # (restored after printing)


def test_one_number_format_per_column():
    from splitplan.io import report
    t = report.table("t", ["name", "GB", "TB/s", "$/h"], [("a", 40.0, 2.039, 17.6), ("b", 180.0, 0.864, 53.52)])
    cells = [[str(c._cells[k]) for c in t.columns] for k in range(2)]
    assert cells == [["a", "40", "2.039", "17.60"], ["b", "180", "0.864", "53.52"]]
    ratios = report.table("t", ["design", "ratio"], [("a", 1.0), ("b", 0.6), ("c", 0.535)])
    assert [str(c) for c in ratios.columns[1]._cells] == ["1.000", "0.600", "0.535"]  # one format (issue 27, item 8)


@pytest.mark.parametrize("width", [40, 60])
def test_a_caption_breaks_between_clauses_never_inside_a_figure(width):
    import io

    from splitplan.io import report
    con = report._Console(file=io.StringIO(), width=width)
    con.print(report.table("t", ["ms", "p50"], [("TTFT", 12.5)],
                           caption="3.75 req/s, 126 output tokens/s, 4 per GPU (16 GPUs); GPU energy 0.07 kWh"))
    lines = con.file.getvalue().splitlines()
    for clause in ("3.75 req/s,", "126 output tokens/s,", "4 per GPU (16 GPUs);", "GPU energy 0.07 kWh"):
        assert any(clause in line for line in lines), (clause, lines)


def _sweep_rows(ttft_ms):
    from splitplan.workflows.studies import SweepResult
    rows = [{"design": "plan", "rate_rps": r, "ttft_p99_ms": t, "tbt_p99_ms": 20.0, "slo_met": t < 2000}
            for r, t in zip((1.0, 2.0, 4.0), ttft_ms, strict=True)]
    return SweepResult(tuple(rows), "plan")


def test_sweep_plot_shows_the_slo_for_every_profile_with_log_scale_and_plain_ticks():
    pytest.importorskip("matplotlib")
    from splitplan.cli.studies import sweep_figure
    chat = sweep_figure(_sweep_rows([100.0, 900.0, 40_000.0]), "chat", "t")
    ttft = chat.axes[0]
    assert ttft.get_yscale() == "log"  # 100 ms to 40 s spans decades
    assert any(list(line.get_ydata()) == [2000, 2000] for line in ttft.get_lines())  # the p99 limit in ms
    assert len(ttft.collections) == 1  # the rate that missed the SLO, marked
    labels = [t.get_text() for t in ttft.get_yticklabels() if t.get_text()]
    assert labels and all("$" not in t and "e" not in t for t in labels)  # 100, 1000, not 10^2
    slowdown = sweep_figure(_sweep_rows([100.0, 120.0, 150.0]), "splitwise", "t").axes[0]
    assert slowdown.get_yscale() == "linear" and "TTFT p99 <= 6x" in slowdown.get_title()


def test_pareto_plot_numbers_its_points_and_lists_them_with_a_title():
    pytest.importorskip("matplotlib")
    from splitplan.cli.optimize import pareto_figure
    from splitplan.search.optimize import OptimizeResult
    from splitplan.search.types import Plan, SizedPool
    plans = [Plan((SizedPool.of("h100-80gb", 8, Layout(8), k),), (SizedPool.of("a100-80gb", 8, Layout(8), 1),), (), 30.0 + k, 20.0 - k,
                  max_rate_rps=5.0) for k in (1, 2, 3)]
    fig = pareto_figure(OptimizeResult(plans[0], tuple(plans[1:]), (), pareto=tuple(plans)), "llama2-70b at 6 req/s")
    ax = fig.axes[0]
    assert sorted(t.get_text() for t in ax.texts) == ["1", "2", "3"]  # short labels beside the points
    listed = fig.texts[0].get_text().splitlines()
    assert len(listed) == 3 and listed[0].startswith("1: prompt 3x h100-80gb TP 8")  # frontier sorted by power
    assert ax.get_title() == "llama2-70b at 6 req/s"


def test_a_named_ms_time_column_is_read_in_ms_as_a_detected_one_is(tmp_path):
    """One rule for named and detected time columns: the suffix sets the unit unless --time-unit
    says otherwise; titles echo the rate read (issue 27)."""
    rows = "".join(f"{k * 212},{100 + k},{10 + k}\n" for k in range(20))
    named = tmp_path / "named.csv"
    named.write_text("request_ts_ms,prompt_len,gen_len\n" + rows)
    detected = tmp_path / "detected.csv"
    detected.write_text("arrival_ms,prompt_tokens,output_tokens\n" + rows)
    columns = ["--time-column", "request_ts_ms", "--prompt-column", "prompt_len", "--output-column", "gen_len"]
    rate = json.loads(run("trace", "summarize", str(named), *columns, "--format", "json").stdout)["mean_rate_rps"]
    assert rate == pytest.approx(19 / 4.028 * 20 / 19, rel=1e-3)  # 20 requests over 4.028 s, not 4,028 s
    assert json.loads(run("trace", "summarize", str(detected), "--format", "json").stdout)["mean_rate_rps"] == rate
    as_seconds = json.loads(run("trace", "summarize", str(named), *columns, "--time-unit", "s", "--format", "json").stdout)
    assert as_seconds["mean_rate_rps"] == pytest.approx(rate / 1000)
    shown = " ".join(run("optimize", "--trace", str(named), *columns, "--hardware", "h100-80gb", "--tp", "8").stdout.split())
    assert f"(20 requests, {rate:.3g} req/s)" in shown


def test_windows_take_the_better_of_split_and_colocated_as_plain_optimize_does():
    """--window plans each window as optimize does (issue 27, item 3): split or co-located, whichever
    is cheaper; --no-split and --split-only are taken."""
    args = ["optimize", "--window", "30", "--rate", "1", "--duration", "60", "--hardware", "a100-80gb,h100-80gb", "--tp", "8",
            "--format", "json"]
    def kinds(*extra):
        result = run(*args, *extra)
        assert result.exit_code == 0, result.stderr
        rows = json.loads(result.stdout)["windows"]
        return {("mixed" if r["mixed_pools"] != "-" else "split") for r in rows if not r["error"]}
    assert kinds() == {"mixed"} == kinds("--no-split")  # at 1 req/s one co-located machine beats two
    assert kinds("--split-only") == {"split"}


def test_the_embedded_traces_go_by_short_names(tmp_path, monkeypatch):
    """--trace azure-conv and azure-code (issue 27, item 9): shipped in the wheel, listed in the help;
    a file of that name, where one exists, is read instead."""
    monkeypatch.chdir(tmp_path)
    conv = json.loads(run("trace", "summarize", "azure-conv", "--format", "json").stdout)
    code = json.loads(run("trace", "summarize", "azure-code", "--format", "json").stdout)
    assert conv["requests"] == 19366 and code["requests"] == 8819
    assert "azure-conv" in " ".join(run("trace", "summarize", "--help").stdout.split())
    (tmp_path / "azure-conv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,10,5\n")
    assert json.loads(run("trace", "summarize", "azure-conv", "--format", "json").stdout)["requests"] == 2


def test_pareto_validate_simulates_each_plan_at_its_max_rate():
    """Issue 27, item 1: max_rate_rps is a rate the plan's own verdict accepts, and --validate
    simulates every frontier plan there."""
    result = run("optimize", "--pareto", "--validate", "--rate", "4", "--duration", "30", "--hardware", "h100-80gb,h200-141gb",
                 "--format", "json")
    assert result.exit_code == 0, result.output
    front = json.loads(result.stdout)["pareto"]
    assert front and all(p["max_rate_simulated"]["slo_met"] for p in front)
    table = " ".join(run("optimize", "--pareto", "--validate", "--rate", "4", "--duration", "30", "--hardware",
                         "h100-80gb,h200-141gb").stdout.split())
    assert "simulated there" in table and "meets the SLO" in table


def test_figure_titles_name_the_trace_file_not_its_path():
    from splitplan.io.report import file_names
    assert file_names("/home/me/traces (2024)/conv.csv (Poisson 60 req/s, 120 s)") == "conv.csv (Poisson 60 req/s, 120 s)"
    assert file_names("azure_conv_2023.csv.gz (embedded)") == "azure_conv_2023.csv.gz (embedded)"


def test_planner_and_simulator_refuse_the_same_prompt_too_long_for_a_prompt_instance(tmp_path):
    """Issue 27, item 7: one rule in both. A prompt instance holds a prompt's KV while it
    prefills: a prompt longer than that (here 30,000 tokens against 26,053 on an a100-40gb at TP 1
    with half its memory usable) is refused by the simulator (counted as never fitting KV) and
    left out by the split planner, which says why; the token instances would have held it."""
    import yaml
    engine = yaml.safe_load(Path(__file__).parents[1].joinpath("engine_profiles", "lean.yaml").read_text())
    engine["memory_usable_fraction"] = 0.5
    (tmp_path / "small-kv.yaml").write_text(yaml.safe_dump(engine))
    trace = tmp_path / "long.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(
        f"{k * 0.5},{30_000 if k == 3 else 1_000},50\n" for k in range(20)))
    common = ["--model", "llama3.1-8b", "--engine", str(tmp_path / "small-kv.yaml"), "--trace", str(trace), "--slo", "batch"]
    sim = run("simulate", *common, "--prompt-pool", "a100-40gb:1:1", "--token-pool", "h100-80gb:1:1", "--format", "json")
    assert sim.exit_code == 0, sim.output
    summary = json.loads(sim.stdout)["summary"]
    assert summary["rejected_kv"] == 1 and summary["finished"] == 19
    plan = run("optimize", *common, "--prompt-hardware", "a100-40gb", "--token-hardware", "h100-80gb", "--tp", "1",
               "--split-only", "--format", "json")
    assert plan.exit_code == 0, plan.output
    unservable = json.loads(plan.stdout)["plan"]["unservable"]
    assert unservable["requests"] == 1 and unservable["max_prompt_tokens"] == 30_000
    assert "every prompt instance considered (largest: 26,053 tokens, a100-40gb at TP 1)" in unservable["reason"]
    out = tmp_path / "out"
    both = run("optimize", *common, "--prompt-hardware", "a100-40gb", "--token-hardware", "h100-80gb", "--tp", "1",
               "--output-dir", str(out))
    assert both.exit_code == 0, both.output  # no split plan holds every request: the co-located one does
    assert json.loads((out / "plan.json").read_text())["plan"]["mixed_pools"]
    assert "no split plan: no prompt option meets the SLO: a100-40gb TP 1: the longest prompt's KV exceeds" in both.stdout
    rows = (out / "candidates.csv").read_text()
    assert "prompt,a100-40gb,1,tp1,,,,,KV memory,the longest prompt's KV exceeds one instance's KV capacity" in rows


def test_optimize_plans_and_validates_on_the_simulators_terms():
    """Issue 27, item 12: optimize takes --perf-interp and, for its --validate, --mixed-pool-threshold,
    so its simulation is the one `simulate` gives with the same options."""
    table_read = ["--model", "bloom-176b", "--engine", "splitwise-sim", "--perf-db", str(PERF_DB), "--rate", "20", "--duration",
                  "30", "--slo", "splitwise", "--format", "json"]
    common = [*table_read, "--perf-interp", "splitwise-sim"]
    planned = run("optimize", *common, "--hardware", "h100-80gb", "--tp", "8", "--split-only", "--validate",
                  "--mixed-pool-threshold", "8192")
    assert planned.exit_code == 0, planned.output
    doc = json.loads(planned.stdout)
    assert doc["inputs"]["perf_interp"] == "splitwise-sim" and doc["inputs"]["mixed_pool_threshold"] == 8192
    plan = doc["plan"]
    pools = [a for role in ("prompt", "token") for p in plan[f"{role}_pools"]
             for a in (f"--{role}-pool", f"{p['hardware']}:{p['tp']}:{p['machines']}")]
    simulated = run("simulate", *common, *pools, "--mixed-pool-threshold", "8192")
    assert simulated.exit_code == 0, simulated.output
    summary = json.loads(simulated.stdout)["summary"]
    assert {m: plan["simulated"][f"{m}_ms"] for m in ("ttft", "tbt", "e2e")} == {m: summary[f"{m}_ms"] for m in ("ttft", "tbt", "e2e")}
    default = run("optimize", *table_read, "--hardware", "h100-80gb", "--tp", "8", "--split-only")
    assert json.loads(default.stdout)["plan"]["predicted"] != plan["predicted"]  # the reading of the table matters


@pytest.mark.parametrize("args,needle", [
    (["--perf-interp", "splitwise-sim"], "add --perf-db FILE"),
    (["--mixed-pool-threshold", "8192"], "add --validate"),
])
def test_simulator_options_of_optimize_say_what_they_need(args, needle):
    line = _error(run("optimize", "--rate", "2", "--duration", "10", *args))
    assert needle in line, line


def test_the_engines_scheduler_settings_on_the_command_line(tmp_path):
    """Issue 28, item 1: --max-num-batched-tokens (alias --max-batch-tokens) and --max-num-seqs
    on optimize, simulate, sweep and compare; a chunked engine's budget below its cap is refused
    as vLLM refuses it; a plan carries both, simulate --plan uses them and the export serves them."""
    import yaml
    engine = yaml.safe_load(Path(__file__).parents[1].joinpath("engine_profiles", "lean.yaml").read_text())
    engine.update(scheduler="chunked", max_num_batched_tokens=8192, max_num_seqs=256)
    (tmp_path / "today.yaml").write_text(yaml.safe_dump(engine))
    today = str(tmp_path / "today.yaml")
    line = _error(run("simulate", "--mixed-pool", "h100-80gb:8:1", "--engine", today, "--max-num-batched-tokens", "128",
                      "--rate", "2", "--duration", "10"))
    assert "--max-num-batched-tokens 128 is below --max-num-seqs 256" in line
    for command in (["optimize", "--hardware", "h100-80gb", "--tp", "8"], ["simulate", "--mixed-pool", "h100-80gb:8:1"],
                    ["sweep", "--rates", "2", "--mixed-pool", "h100-80gb:8:1"],
                    ["compare", "--scenario", "iso-throughput-cost", "--rate", "2"]):
        assert "--max-num-seqs 0: must be >= 1" in _error(run(*command, "--max-num-seqs", "0", "--duration", "10"))
    out = tmp_path / "plan"
    planned = run("optimize", "--hardware", "h100-80gb", "--tp", "8", "--engine", today, "--max-num-seqs", "64",
                  "--max-batch-tokens", "4096", "--rate", "2", "--duration", "20", "--no-split", "--output-dir", str(out),
                  "--format", "json")
    assert planned.exit_code == 0, planned.output
    inputs = json.loads(planned.stdout)["inputs"]
    assert (inputs["max_batch_tokens"], inputs["max_num_seqs"]) == (4096, 64)
    simulated = json.loads(run("simulate", "--plan", str(out / "plan.json"), "--rate", "2", "--duration", "20",
                               "--format", "json").stdout)["inputs"]
    assert (simulated["max_batch_tokens"], simulated["max_num_seqs"]) == (4096, 64)
    served = run("export", str(out / "plan.json"), "--to", "vllm", "--output", str(tmp_path / "deploy"))
    assert served.exit_code == 0, served.output
    launch = (tmp_path / "deploy" / "launch.sh").read_text()
    assert "--max-num-batched-tokens 4096" in launch and "--max-num-seqs 64" in launch
    default = json.loads(run("simulate", "--mixed-pool", "h100-80gb:8:1", "--engine", today, "--rate", "2", "--duration", "10",
                             "--format", "json").stdout)["inputs"]
    assert (default["max_batch_tokens"], default["max_num_seqs"]) == (8192, 256)  # the profile's


@pytest.mark.integration
def test_a_plan_on_shared_machines_reads_back_simulates_and_exports(tmp_path):
    """Issue 30, items 2-5: plan.json gives each role's part of shared machines (`shared`, its
    `instances`), counts the machines once, and simulate --plan and export run it as planned (the
    decode workers on the GPUs after the prefill workers of the same machine); a shared number
    that only one role names is refused (exit 2, naming it)."""
    out = tmp_path / "plan"
    made = run("optimize", "--model", "llama3.1-8b", "--hardware", "h100-80gb@8", "--rate", "1", "--duration", "60",
               "--split-only", "--output-dir", str(out), "--format", "json")
    assert made.exit_code == 0, made.output
    doc = json.loads((out / "plan.json").read_text())
    (prompt,), (token,) = doc["plan"]["prompt_pools"], doc["plan"]["token_pools"]
    assert prompt["shared"] == token["shared"] == 0 and doc["plan"]["machines"] == 1 and doc["plan"]["gpus"] == 8
    assert prompt["gpus"] + token["gpus"] == 8 and prompt["instances"] + token["instances"] == 8
    sim = run("simulate", "--plan", str(out / "plan.json"), "--rate", "1", "--duration", "60", "--format", "json")
    assert sim.exit_code == 0, sim.output
    pools = json.loads(sim.stdout)["summary"]["pools"]
    assert [(p["role"], p["instances"], p["shared"], p["gpus"]) for p in pools] == \
        [("prompt", prompt["instances"], 0, prompt["gpus"]), ("token", token["instances"], 0, token["gpus"])]
    script = run("export", str(out / "plan.json"), "--to", "vllm").stdout
    devices = [line.split("=")[1] for line in script.splitlines() if "CUDA_VISIBLE_DEVICES" in line]
    assert devices == [str(k) for k in range(8)]  # prefill on the first GPUs, decode on the rest: one machine
    exported = run("export", str(out / "plan.json"), "--to", "llm-d")
    assert "shared machines 0: the prefill and decode pods" in exported.stderr
    import yaml
    pods = {d["metadata"]["name"]: d["spec"]["template"] for d in yaml.safe_load_all(exported.stdout) if d["kind"] == "Deployment"}
    assert len(pods) == 2
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="needs the integration extra")
    for name, pod in pods.items():  # each role's pods prefer the node of the other's (a valid pod template)
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": pod},
                                     "1.34.0", strict=True)
        (term,) = pod["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["podAffinityTerm"]["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] in set(pods) - {name}
    del doc["plan"]["token_pools"][0]["shared"]
    doc["plan"]["machines"] = 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    refused = run("simulate", "--plan", str(bad))
    assert refused.exit_code == 2 and "shared 0: machines shared by one prompt and one token pool" in refused.stderr


def test_optimize_says_which_colocated_options_it_left_unsized(tmp_path):
    """Co-located options pruned by their cost bound are counted apart from those skipped, and
    candidates.csv gives each its bound; which are pruned does not depend on --jobs."""
    common = ["optimize", "--hardware", "mi300x-192gb,b200-180gb"]
    result = run(*common, "--jobs", "1", "--output-dir", str(tmp_path / "one"))
    assert result.exit_code == 0, result.output
    said = re.search(r"(\d+) option\(s\) skipped and (\d+) co-located option\(s\) not sized", " ".join(result.stdout.split()))
    rows = [line for line in (tmp_path / "one" / "candidates.csv").read_text().splitlines() if line.startswith("option,mixed,")]
    pruned = [row for row in rows if "not sized:" in row and "above the co-located plan found" in row]
    assert said and int(said[2]) == len(pruned) > 0
    assert run(*common, "--jobs", "2", "--output-dir", str(tmp_path / "two")).exit_code == 0
    for name in ("candidates.csv", "plan.json"):
        assert (tmp_path / "one" / name).read_text() == (tmp_path / "two" / name).read_text()


def test_the_precision_choices_are_the_engines():
    """`--weights` and `--kv-cache` offer exactly the precisions an engine profile takes."""
    from splitplan.cli.common import KvCache, Weights
    from splitplan.specs.engine import KV_PRECISIONS, WEIGHT_PRECISIONS
    assert tuple(Weights) == WEIGHT_PRECISIONS and tuple(KvCache) == KV_PRECISIONS


@pytest.fixture(scope="module")
def conv_plan(tmp_path_factory):
    """A plan made on another workload than simulate's defaults: the conversation trace at 3 req/s
    for 40 s with 25 % headroom (issue 54, item 3)."""
    out = tmp_path_factory.mktemp("conv") / "plan"
    made = run("optimize", "--trace", "azure-conv", "--rate", "3", "--duration", "40", "--seed", "2", "--headroom", "25",
               "--hardware", "h100-80gb", "--tp", "8", "--split-only", "--output-dir", str(out))
    assert made.exit_code == 0, made.output
    return out / "plan.json"


def test_simulate_plan_replays_the_workload_the_plan_was_made_for(conv_plan):
    inputs = json.loads(conv_plan.read_text())["inputs"]
    assert (inputs["trace_file"], inputs["rate_rps"], inputs["duration_s"], inputs["seed"]) == ("azure-conv", 3.0, 40.0, 2)
    own = json.loads(run("simulate", "--plan", str(conv_plan), "--format", "json").stdout)["inputs"]
    assert own["trace"].startswith("azure_conv_2023") and "25 % headroom" in own["trace"]
    assert (own["requests"], own["rate_rps"], own["duration_s"], own["seed"], own["overridden"]) == \
        (inputs["requests"], 3.0, 40.0, 2, [])
    table = run("simulate", "--plan", str(conv_plan), "--rate", "2").stdout
    assert "(the plan's workload but --rate 2)" in " ".join(table.split())
    again = json.loads(run("simulate", "--plan", str(conv_plan), "--rate", "2", "--format", "json").stdout)["inputs"]
    assert again["overridden"] == ["--rate 2"] and "headroom" not in again["trace"]


def test_sweep_plan_resamples_the_plans_trace(conv_plan):
    own = run("sweep", "--plan", str(conv_plan), "--rates", "2")
    same = run("sweep", "--plan", str(conv_plan), "--rates", "2", "--trace", "azure-conv", "--duration", "40")
    other = run("sweep", "--plan", str(conv_plan), "--rates", "2", "--trace", "azure-code")
    assert own.exit_code == same.exit_code == other.exit_code == 0, other.output
    assert own.stdout == same.stdout != other.stdout
    assert "note" not in own.stderr and "(the plan's workload but --trace " in other.stderr


def test_simulate_an_older_plan_made_on_another_trace_asks_for_it(conv_plan, tmp_path):
    doc = json.loads(conv_plan.read_text())
    for key in ("trace_file", "trace_columns"):
        del doc["inputs"][key]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    result = run("simulate", "--plan", str(old))
    assert result.exit_code == 2 and "give --trace" in result.stderr and "azure_conv_2023" in result.stderr
    assert run("simulate", "--plan", str(old), "--trace", "azure-conv", "--rate", "3").exit_code == 0


def test_simulate_a_window_plan_replays_its_window(tmp_path):
    out = tmp_path / "w"
    made = run("optimize", "--trace", "azure-conv", "--rate", "3", "--duration", "120", "--window", "60",
               "--hardware", "h100-80gb", "--tp", "8", "--split-only", "--output-dir", str(out))
    assert made.exit_code == 0, made.output
    window = json.loads((out / "plan.json").read_text())["inputs"]["window"]
    own = json.loads(run("simulate", "--plan", str(out / "plan.json"), "--format", "json").stdout)["inputs"]
    assert own["requests"] == window["requests"] and f"[window {window['window']}]" in own["trace"]


@pytest.mark.parametrize("flags,says", [
    (["--window", "10m", "--validate"], "--window plans each window by cost or power"),
    (["--window", "10m", "--pareto"], "--window plans each window by cost or power"),
    (["--window", "10m", "--objective", "throughput", "--max-machines", "h100-80gb=4"], "--window plans each window"),
    (["--pareto", "--no-split"], "--pareto compares split plans"),
    (["--pareto", "--objective", "throughput", "--max-machines", "h100-80gb=4"], "--pareto compares split plans"),
    (["--objective", "throughput", "--no-split", "--max-machines", "h100-80gb=4"], "--objective throughput plans split pools"),
])
def test_optimize_refuses_workflows_that_contradict_each_other(flags, says):
    """The workflow's own contradictions (api.Planning.check) are exit 2 with one line, before any sizing."""
    out = run("optimize", "--hardware", "h100-80gb", "--tp", "8", *flags)
    assert out.exit_code == 2 and says in out.stderr and out.stderr.count("\n") == 1, out.stderr


@pytest.mark.parametrize("command", [["optimize", "--hardware", "h100-80gb", "--tp", "8"], ["simulate", "--mixed-pool", "h100-80gb:8:1"]])
def test_a_closed_loop_of_requests_longer_than_the_context_window_is_refused(command):
    """--isl + --osl past the model's context window (Llama 2: 4,096 tokens) is refused before any
    work, naming both and the window, as the engine would refuse every request."""
    result = run(*command, "--concurrency", "4", "--isl", "4000", "--osl", "200")
    assert result.exit_code == 2 and "--isl 4,000 + --osl 200: requests of 4,200 tokens exceed" in result.stderr, result.output
