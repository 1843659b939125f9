"""Hostile inputs to catalogs, model configs, options and outputs (issue 26): each is exit 2 (or 3)
with one `error: ...` line that names what to fix, shows nothing of a file that is not a spec,
and sends no control character to the terminal; bounded work at the bounds."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from splitplan.cli import app
from splitplan.sim.gaps import range_max

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
SIM = ["--prompt-pool", "h100-80gb:8:1", "--token-pool", "h100-80gb:8:1"]


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line(result, code=2) -> str:
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert result.exit_code == code and len(lines) == 1 and lines[0].startswith("error: "), (result.exit_code, result.stderr)
    assert "\x1b" not in result.stderr and "\x00" not in result.stderr
    return lines[0]


def _catalog(tmp_path: Path, kind="hardware_specs") -> Path:
    folder = tmp_path / "cat" / kind
    folder.mkdir(parents=True)
    return folder


# --- catalogs as strict as files -------------------------------------------------------------

def test_a_catalog_entry_linking_to_a_device_is_an_error_not_skipped(tmp_path):
    (_catalog(tmp_path) / "h100-80gb.yaml").symlink_to("/dev/zero")
    line = one_line(run("--catalog", tmp_path / "cat", "perf", "--hardware", "h100-80gb"))
    assert "h100-80gb.yaml" in line and "not a regular file" in line


def test_a_fifo_in_a_catalog_is_an_error_naming_it(tmp_path):
    os.mkfifo(_catalog(tmp_path) / "myfifo.yaml")
    for args in (["perf", "--hardware", "myfifo"], ["hardware", "list"], ["perf", "--hardware", "nothing-like-it"]):
        assert "myfifo.yaml" in one_line(run("--catalog", tmp_path / "cat", *args))


def test_an_unreadable_catalog_folder_is_an_error_naming_it(tmp_path, monkeypatch):
    folder = _catalog(tmp_path)
    real = Path.iterdir

    def denied(self):
        if self == folder:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)
    monkeypatch.setattr(Path, "iterdir", denied)
    line = one_line(run("--catalog", tmp_path / "cat", "hardware", "list"))
    assert str(folder) in line and "Permission denied" in line


def test_an_entry_is_named_after_its_file(tmp_path):
    spec = yaml.safe_load((ROOT / "hardware_specs" / "h100-80gb.yaml").read_text())
    (_catalog(tmp_path) / "mine.yaml").write_text(yaml.safe_dump({**spec, "name": "a100-80gb"}))
    line = one_line(run("--catalog", tmp_path / "cat", "hardware", "list"))
    assert "mine.yaml: names itself 'a100-80gb'" in line


@pytest.mark.parametrize("kind, option", [("hardware", "--hardware"), ("model", "--model"), ("engine", "--engine"),
                                          ("slo", "--slo")])
def test_a_file_that_is_not_a_spec_is_named_but_never_shown(tmp_path, kind, option):
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secrethash:20228:0:99999:7:::\nbin: hunter2-password\n")
    args = ["optimize", option, secret] if kind == "slo" else ["perf", option, secret]
    line = one_line(run(*args))
    assert str(secret) in line and "secrethash" not in line and "hunter2" not in line and "root:" not in line
    assert "file: none of its keys is one of" in line  # (said what it is not, rather than which key is unknown)


def test_control_characters_are_escaped_in_messages_and_tables(tmp_path):
    line = one_line(run("perf", "--hardware", "h100\x1b[2Jx"))
    assert "\\x1b[2Jx" in line
    spec = yaml.safe_load((ROOT / "hardware_specs" / "h100-80gb.yaml").read_text())
    name = "evil\x1b[31m[red]x"
    (_catalog(tmp_path) / f"{name}.yaml").write_text(yaml.safe_dump({**spec, "name": name}))
    listed = run("--catalog", tmp_path / "cat", "--wide", "hardware", "list")
    assert listed.exit_code == 0 and "\x1b" not in listed.stdout and "evil\\x1b[31m[red]x" in listed.stdout


# --- model configs, layouts, engine options --------------------------------------------------

def _model(tmp_path, edit) -> Path:
    data = yaml.safe_load((ROOT / "model_specs" / "deepseek-v3.yaml").read_text())
    data.pop("name", None)
    edit(data)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_an_mla_config_missing_one_key_names_it(tmp_path):
    line = one_line(run("perf", "--model", _model(tmp_path, lambda d: d.pop("kv_lora_rank")), "--hardware", "h200-141gb"))
    assert "not kv_lora_rank" in line


def test_conflicting_expert_counts_name_both_keys(tmp_path):
    line = one_line(run("perf", "--model", _model(tmp_path, lambda d: d.update(num_local_experts=128)),
                        "--hardware", "h200-141gb"))
    assert "num_local_experts: 128" in line and "n_routed_experts: 256" in line


@pytest.mark.parametrize("layout, needle", [("tp99999999999999999999", "a degree above 1,024"),
                                            ("tp64dp64", "4,096 GPUs"), ("tp8tp8", "is not one")])
def test_a_layout_has_its_own_message(layout, needle):
    line = one_line(run("perf", "--layout", layout))
    assert "--layout" in line and needle in line and "--tp" not in line


def test_an_engine_option_given_twice_is_refused():
    assert "weights is given twice" in one_line(run("perf", "--engine", "lean@weights=fp4,weights=fp8"))


def test_a_memory_reserve_above_the_gpu_is_a_spec_error_naming_the_key(tmp_path):
    engine = tmp_path / "reserve.yaml"
    engine.write_text((ROOT / "engine_profiles" / "lean.yaml").read_text() + "\n")
    data = yaml.safe_load(engine.read_text())
    engine.write_text(yaml.safe_dump({**data, "activation_reserve_gb_per_gpu": 1000}))
    line = one_line(run("optimize", "--engine", engine, "--hardware", "a100-40gb"))
    assert "activation_reserve_gb_per_gpu" in line and len(line) < 300


@pytest.mark.parametrize("error, needle", [
    ({"error": {"all": 5}}, "fit.error.all: runs or stages"),
    ({"error": {"all": {"runs": 30, "ttft_mean": {"qq": 1.0}}}}, "fit.error.all.ttft_mean:"),
    ({"error": {"all": {"runs": -1}}}, "fit.error.all.runs:"),
    ({"moe_error": {"all": {"ttft_mean": {"q50": float("nan")}}}}, "fit.moe_error.all.ttft_mean:"),
    ({"moe_error": "x"}, "fit.moe_error: a mapping of load bands"),
])
def test_a_measured_error_plans_read_is_checked_when_the_profile_loads(tmp_path, error, needle):
    """`fit.error` and `fit.moe_error` size --confidence plans and word a MoE plan's warning: a malformed
    one is refused (exit 2, naming the entry) before a plan reads it, not a traceback after."""
    engine = tmp_path / "measured.yaml"
    data = yaml.safe_load((ROOT / "engine_profiles" / "sglang-fp8.yaml").read_text())
    engine.write_text(yaml.safe_dump({**data, "fit": error}))
    line = one_line(run("optimize", "--model", "deepseek-v3", "--engine", engine, "--hardware", "h200-141gb", "--rate", "2",
                        "--duration", "20", "--split-only"))
    assert needle in line and "regenerate it" in line


def test_an_infeasibility_names_the_closest_candidate_and_counts_the_rest(tmp_path):
    data = yaml.safe_load((ROOT / "model_specs" / "llama3.1-405b.yaml").read_text())
    data.update(name="huge", num_hidden_layers=5000)
    (tmp_path / "huge.yaml").write_text(yaml.safe_dump(data))
    for split in ([], ["--no-split"]):
        line = one_line(run("optimize", "--model", tmp_path / "huge.yaml", *split), code=3)
        assert len(line) < 300 and "gb200-nvl72 TP 8 PP 4" in line and "more (--debug lists them all)" in line
    debug = run("--debug", "optimize", "--model", tmp_path / "huge.yaml", "--no-split")
    assert debug.exit_code != 0 and "a100-40gb TP 1: huge weights need" in debug.stderr


# --- bounds of the closed loop ---------------------------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (["simulate", *SIM, "--concurrency", "100001"], "--concurrency 100,001: must be >= 1 and <= 100,000"),
    (["simulate", *SIM, "--concurrency", "1", "--num-requests", "20000000"], "<= 1,000,000 requests"),
    (["optimize", "--concurrency", "513"], "<= 512 clients"),
    (["optimize", "--concurrency", "8", "--num-requests", "10001"], "<= 10,000 requests"),
    (["simulate", *SIM, "--concurrency", "2", "--isl", "8192"], "exceed llama2-70b's context window (4,096 tokens)"),
    (["optimize", "--concurrency", "2", "--isl", "4000", "--osl", "200"], "4,200 tokens exceed"),
])
def test_closed_loop_bounds(args, needle):
    assert needle in one_line(run(*args))


@pytest.mark.parametrize("requests, output_tokens", [
    (5, 400),  # long decodes: the iterations are counted in stretches
    (1_200, 2),  # one decode iteration a request: counted one by one, never in a stretch
])
def test_a_simulation_past_its_iteration_bound_stops_with_one_line(monkeypatch, requests, output_tokens):
    from splitplan.base import limits
    monkeypatch.setattr(limits, "MAX_SIM_ITERATIONS", 1_000)
    line = one_line(run("simulate", *SIM, "--concurrency", "1", "--num-requests", str(requests), "--isl", "10",
                        "--osl", str(output_tokens)))
    assert "passed 1,000 decode iterations" in line


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=40),
       st.lists(st.tuples(st.integers(0, 45), st.integers(0, 45)), min_size=1, max_size=30))
def test_range_max_is_the_brute_force_maximum(values, pairs):
    v = np.array(values)
    lo, hi = np.array([a for a, _ in pairs]), np.array([b for _, b in pairs])
    want = [max(v[a:min(b, len(v))], default=0.0) if b > a else 0.0 for a, b in pairs]
    assert range_max(v, lo, hi).tolist() == want


# --- output ----------------------------------------------------------------------------------

def test_full_device_through_the_console_script(tmp_path):
    import subprocess
    import sys
    for args in (["hardware", "list"], ["export", str(ROOT / "examples" / "plans" / "deepseek-v3-h200.json"), "--to", "vllm"]):
        with open("/dev/full", "w") as full:
            done = subprocess.run([sys.executable, "-c", "from splitplan.cli import main; main()", *args], stdout=full,
                                  stderr=subprocess.PIPE, text=True, timeout=60)
        assert done.returncode == 2 and done.stderr == "error: cannot write output: No space left on device\n", done.stderr


def test_simulate_json_counts_the_refused(tmp_path):
    result = run("simulate", *SIM, "--rate", "3", "--duration", "30", "--format", "json")
    summary = json.loads(result.stdout)["summary"]
    assert summary["refused_context"] > 0 and summary["rejected_kv"] == 0
