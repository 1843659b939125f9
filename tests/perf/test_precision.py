"""Weight and KV precisions chosen separately (issue 17, item 3): memory and compute follow."""

import json

import pytest
from typer.testing import CliRunner

from splitplan import api
from splitplan.base.errors import SpecError
from splitplan.cli import app
from splitplan.specs.engine import engine_spec, load_engine


def test_weights_and_kv_precisions_are_separate():
    fp8 = api.instance("llama3.1-70b", "b200-180gb", 8, "lean-fp8")
    fp4 = api.instance("llama3.1-70b", "b200-180gb", 8, "lean-fp8@weights=fp4")
    kv16 = api.instance("llama3.1-70b", "b200-180gb", 8, "lean-fp8@kv=bf16")
    params = fp8.model.total_params
    assert fp8.fit.weights_bytes_per_gpu == pytest.approx(params * 1.0 / 8)
    assert fp4.fit.weights_bytes_per_gpu == pytest.approx(params * 0.5625 / 8)  # NVFP4: 4 bits + an fp8 scale per 16
    assert kv16.fit.weights_bytes_per_gpu == fp8.fit.weights_bytes_per_gpu
    assert fp4.kv_bytes_per_token == fp8.kv_bytes_per_token and kv16.kv_bytes_per_token == 2 * fp8.kv_bytes_per_token


def test_fp4_gemms_run_at_the_fp4_peak_and_attention_does_not():
    """A long prompt's weight GEMMs are compute-bound: fp4 halves their time on B200 (9 against
    4.5 PFLOP/s dense); the FLOPs are the same."""
    fp8 = api.instance("llama3.1-70b", "b200-180gb", 8, "lean-fp8")
    fp4 = api.instance("llama3.1-70b", "b200-180gb", 8, "lean-fp8@weights=fp4")
    a, b = (i.explain(prompt_tokens=[8192]) for i in (fp8, fp4))
    assert a.flops_per_gpu == b.flops_per_gpu and b.compute_s < a.compute_s
    attention_s = 80 * 2 * 8192 ** 2 * fp8.model.q_dim / 8 / (4500e12 * fp8.factors.attention_efficiency) * fp8.constants.clock_slowdown
    assert a.compute_s - attention_s == pytest.approx(2 * (b.compute_s - attention_s), rel=1e-9)


def test_fp4_needs_fp4_tensor_cores():
    from splitplan.perf.roofline import Instance
    from splitplan.specs.hardware import load_hardware
    from splitplan.specs.model import load_model
    fit = Instance(load_model("llama3.1-70b"), load_hardware("h200-141gb"), load_engine("lean-fp8@weights=fp4"), 8).fit
    assert not fit.fits and "h200-141gb has no fp4 tensor cores" in fit.reason


def test_engine_spec_strings_round_trip_and_refuse_unknown_precisions():
    assert engine_spec("lean-fp8", "fp4", None) == "lean-fp8@weights=fp4"
    assert engine_spec("lean-fp8@weights=fp4", None, "bf16") == "lean-fp8@kv=bf16,weights=fp4"
    assert load_engine("lean-fp8@kv=bf16,weights=fp4").name == "lean-fp8@kv=bf16,weights=fp4"
    for bad in ("lean@weights=fp2", "lean@kv=fp4", "lean@speed=fast"):
        with pytest.raises(SpecError, match="is not a precision"):
            load_engine(bad)


def test_optimize_with_fp4_weights_uses_only_fp4_machines_and_the_plan_keeps_the_precision(tmp_path):
    out = tmp_path / "plan"
    result = CliRunner().invoke(app, ["optimize", "--model", "llama3.1-70b", "--hardware", "h200-141gb,b200-180gb",
                                      "--engine", "lean-fp8", "--weights", "fp4", "--rate", "3", "--duration", "30",
                                      "--format", "json", "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    pools = [p for role in ("prompt", "token", "mixed") for p in doc["plan"].get(f"{role}_pools", [])]
    assert pools and {p["hardware"].partition("@")[0] for p in pools} == {"b200-180gb"}
    assert doc["inputs"]["engine"] == "lean-fp8@weights=fp4"
    sim = CliRunner().invoke(app, ["simulate", "--plan", str(out / "plan.json"), "--rate", "3", "--duration", "30",
                                   "--format", "json"])
    assert sim.exit_code == 0 and json.loads(sim.stdout)["inputs"]["engine"] == "lean-fp8@weights=fp4"
    bad = CliRunner().invoke(app, ["perf", "--weights", "fp2"])
    assert bad.exit_code == 2
