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


def test_fp4_weights_without_fp4_tensor_cores_run_weight_only():
    """On H200, which has no fp4 tensor cores, fp4 weights are held at 4 bits and widened to bf16 for
    the GEMMs, as vLLM serves NVFP4 (FP4 Marlin) and gpt-oss's MXFP4 on Hopper: the memory and a
    decode step's weight reads are fp4's, a long prompt's GEMMs run at the bf16 peak, as bf16
    weights run them (where fp8 weights run at the fp8 peak)."""
    fp4, bf16, fp8 = (api.instance("llama3.1-70b", "h200-141gb", 8, f"lean-fp8@weights={w}") for w in ("fp4", "bf16", "fp8"))
    assert fp4.fit.fits and fp4.fit.weights_bytes_per_gpu == pytest.approx(fp4.model.total_params * 0.5625 / 8)
    assert fp4.constants.gemm_peak_flops_per_s == bf16.constants.gemm_peak_flops_per_s == 989e12
    assert fp8.constants.gemm_peak_flops_per_s == 1979e12
    a, b = (i.explain(prompt_tokens=[8192]) for i in (fp4, bf16))
    assert a.compute_s == pytest.approx(b.compute_s, rel=1e-9)
    assert fp4.decode_step_time_s(1, 1024) < fp8.decode_step_time_s(1, 1024) < bf16.decode_step_time_s(1, 1024)


def test_gpt_oss_fits_one_h100_with_its_mxfp4_experts():
    """gpt-oss-120b as its checkpoint holds it (4-bit experts: 65.7 GB priced as NVFP4) on one H100
    80GB, as it is served; at bf16 (234 GB) it needs four."""
    assert api.instance("gpt-oss-120b", "h100-80gb", 1, "vllm@weights=fp4").fit.fits
    assert api.instance("gpt-oss-120b", "h100-80gb", None, "vllm").layout.tp == 4


def test_engine_spec_strings_round_trip_and_refuse_unknown_precisions():
    assert engine_spec("lean-fp8", "fp4", None) == "lean-fp8@weights=fp4"
    assert engine_spec("lean-fp8@weights=fp4", None, "bf16") == "lean-fp8@kv=bf16,weights=fp4"
    assert load_engine("lean-fp8@kv=bf16,weights=fp4").name == "lean-fp8@kv=bf16,weights=fp4"
    for bad in ("lean@weights=fp2", "lean@kv=fp4", "lean@speed=fast"):
        with pytest.raises(SpecError, match="is not a precision"):
            load_engine(bad)


def test_optimize_with_fp4_weights_keeps_the_precision_in_the_plan(tmp_path):
    out = tmp_path / "plan"
    result = CliRunner().invoke(app, ["optimize", "--model", "llama3.1-70b", "--hardware", "h200-141gb,b200-180gb",
                                      "--engine", "lean-fp8", "--weights", "fp4", "--rate", "3", "--duration", "30",
                                      "--format", "json", "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [p for role in ("prompt", "token", "mixed") for p in doc["plan"].get(f"{role}_pools", [])]
    assert doc["inputs"]["engine"] == "lean-fp8@weights=fp4"
    sim = CliRunner().invoke(app, ["simulate", "--plan", str(out / "plan.json"), "--rate", "3", "--duration", "30",
                                   "--format", "json"])
    assert sim.exit_code == 0 and json.loads(sim.stdout)["inputs"]["engine"] == "lean-fp8@weights=fp4"
    bad = CliRunner().invoke(app, ["perf", "--weights", "fp2"])
    assert bad.exit_code == 2
