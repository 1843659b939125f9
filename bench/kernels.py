"""Op-level accuracy: the model's time for one operator against NVIDIA's measured kernels.

    pip install --no-deps aiconfigurator-core==0.12.0 pyarrow   # (bench only: NVIDIA's measured tables, Apache-2.0)
    python bench/kernels.py

A baseline for issue 55's op-level table: the engine-wide factors, before per-GPU curves
(`bench/fit_kernels.py` fits the curves and measures them held out). aiconfigurator-core ships vLLM
0.24 tables (A100: 0.14) per catalog GPU; each measured shape is timed as the pass formula times
its operator class (core/splitplan_core.pyx, `pass_terms`), nothing fitted here:
- dense GEMMs (class 0), shapes (m, n, k) with m from 1 to 16,384 tokens and n, k of at least
  1,024 (serving's projections and FFN matrices): the larger of 2 m n k over the GEMM peak at the
  weights' precision times compute_efficiency times the token ramp m / (m + gemm_half_tokens),
  slowed to the sustained clock, and the weights and activations read at the achieved bandwidth;
- context attention (class 2), a batch of b prompts of p tokens over H query and H_kv KV heads of
  d: 2 H d b p^2 FLOPs at the activations' peak times attention_efficiency (sustained clock), or
  b p (2 H d + 2 H_kv d) activation bytes, whichever is slower;
- generation attention (class 3), b requests over a context of c tokens: 4 H d b c FLOPs at the
  activations' peak times compute_efficiency, or 2 H_kv d b c KV bytes, whichever is slower;
  both on the heads serving produces (fit_kernels.SERVING_HEADS: the rows the curves are fitted on).
- MoE experts (class 1), one fused layer on one GPU of each measured expert layout (the tables
  fit_kernels.py reads: power-law routing, the fastest kernel per shape): the routed rows' FLOPs at
  the weights' peak times compute_efficiency x moe_efficiency ramped by rows per touched expert, or
  the touched experts' weights at the achieved bandwidth (perf.curves.moe_s without its passes
  and latency), with `vllm`, `vllm-fp8` and `vllm-fp8@weights=fp4`.
- MLA generation attention (class 3 for an MLA model), SGLang 0.5.14's `generation_mla` tables
  (vLLM's time the whole MLA module): the latent's 576 elements read per context token at the
  achieved bandwidth, or 2 H (576 + 512) FLOPs per context token at the peak times
  compute_efficiency, whichever is slower, with `sglang-fp8` (its KV at the table's precision);
- MLA prefill attention (class 2 for an MLA model), TensorRT-LLM 1.3's `context_mla` tables (the
  kernels that time it as served, fit_kernels.MLA_PREFILL_KERNELS): context attention over MHA heads
  of 160 dims (192 query-key, 128 value: fit_kernels.MLA_PREFILL_HEAD_DIM), with `trtllm-fp8` (its
  KV at the table's precision);
- expert all-to-all, DeepEP's dispatch plus combine of t tokens a GPU holds among one node's g
  GPUs (fit_kernels.py's tables, each kernel family apart): 2 t min(k, g) (g - 1) / g hidden bf16
  bytes over NVLink at link_efficiency, plus two collective latencies (the pass formula's
  roofline all-to-all), with `vllm`.
bf16 GEMMs and bf16-KV attention with the `vllm` profile, fp8 GEMMs and fp8-KV attention with
`vllm-fp8` (which also computes attention at fp8, as the model does), NVFP4 GEMMs (B200, GB200)
with `vllm-fp8@weights=fp4`, each with its factors for that machine. Prints MAPE % / median signed
error % of the model against the measured latency per operator class, GPU, precision and size band;
the target of issue 55 is 10 % in every cell of more than 20 points.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
from fit_kernels import (  # (this folder: one reading of the tables)
    CONTEXT_BANDS,
    MLA_LATENT,
    MLA_PREFILL_HEAD_DIM,
    MLA_RANK,
    MOE_SHAPE,
    SYSTEMS,
    TOKEN_BANDS,
    node_gpus,
    operator_frames,
)

from splitplan.perf import curves
from splitplan.specs.engine import BYTES, load_engine
from splitplan.specs.hardware import load_hardware

PROFILES = {"bf16": "vllm", "fp8": "vllm-fp8", "fp4": "vllm-fp8@weights=fp4"}  # GEMMs and attention at the tables' precision
BANDS = {"GEMM": TOKEN_BANDS,  # m, tokens
         "context attention": CONTEXT_BANDS,  # prompt tokens
         "generation attention": CONTEXT_BANDS,  # context tokens
         "MoE experts": TOKEN_BANDS,  # tokens entering the layer
         "MLA generation": CONTEXT_BANDS,  # context tokens
         "MLA context": CONTEXT_BANDS,  # prompt tokens
         "all-to-all": TOKEN_BANDS}  # tokens a GPU dispatches


def gemm_s(hw, engine, m, n, k) -> np.ndarray:
    """The pass formula's time for GEMMs (m, n, k) on `hw` with `engine` (its factors for that machine)."""
    f = engine.factors(hw.name, 1)
    ramp = m / (m + f.gemm_half_tokens)
    compute = 2 * m * n * k / (hw.peak_flops_per_s(engine.weights) * f.compute_efficiency * ramp) / hw.prefill_clock_fraction
    moved = n * k * engine.weight_bytes_per_element + m * (n + k) * engine.bytes_per_element
    return np.maximum(compute, moved / (hw.memory_bytes_per_s * f.memory_efficiency))


def context_s(hw, engine, b, p, heads, kv_heads, d) -> np.ndarray:
    f = engine.factors(hw.name, 1)
    compute = 2 * heads * d * b * p**2 / (hw.peak_flops_per_s(engine.dtype) * f.attention_efficiency) / hw.prefill_clock_fraction
    moved = b * p * (2 * heads * d + 2 * kv_heads * d) * engine.bytes_per_element
    return np.maximum(compute, moved / (hw.memory_bytes_per_s * f.memory_efficiency))


def generation_s(hw, engine, b, c, heads, kv_heads, d) -> np.ndarray:
    f = engine.factors(hw.name, 1)
    compute = 4 * heads * d * b * c / (hw.peak_flops_per_s(engine.dtype) * f.compute_efficiency)
    moved = 2 * kv_heads * d * b * c * engine.kv_bytes_per_element
    return np.maximum(compute, moved / (hw.memory_bytes_per_s * f.memory_efficiency))


def moe_s(hw, engine, f: pd.DataFrame) -> np.ndarray:
    """The pass formula's routed experts on one GPU with the profile's factors: the GEMMs' efficiency and ramp
    times moe_efficiency, the touched experts' weights at the achieved bandwidth (perf.curves.moe_s without
    the measured passes and latency, and the mean expert group's rows: the roofline knows no routing)."""
    x = engine.factors(hw.name, 1)
    factors = SimpleNamespace(efficiency=x.compute_efficiency * x.moe_efficiency, half_rows=x.gemm_half_tokens,
                              memory_efficiency=x.memory_efficiency, row_passes=0.0, token_passes=0.0, latency_s=0.0,
                              s_per_expert=0.0)
    peak = hw.peak_flops_per_s(engine.weights) * hw.prefill_clock_fraction
    return curves.moe_s(factors, peak, hw.memory_bytes_per_s, *(f[c].to_numpy(float) for c in MOE_SHAPE),
                        engine.weight_bytes_per_element, load=1.0)


def mla_generation_s(hw, engine, b, c, heads) -> np.ndarray:
    f = engine.factors(hw.name, 1)
    compute = 2 * heads * (MLA_LATENT + MLA_RANK) * b * c / (hw.peak_flops_per_s(engine.dtype) * f.compute_efficiency)
    moved = MLA_LATENT * b * c * engine.kv_bytes_per_element
    return np.maximum(compute, moved / (hw.memory_bytes_per_s * f.memory_efficiency))


def all_to_all_s(hw, engine, gpus: int, f: pd.DataFrame) -> np.ndarray:
    """The pass formula's roofline all-to-all (dispatch and combine) of a GPU's tokens among `gpus` GPUs."""
    x = engine.factors(hw.name, 1)
    copy_bytes = 2 * np.minimum(f.topk, gpus) * (gpus - 1) / gpus * f.hidden_size * engine.bytes_per_element
    return (f.num_tokens * copy_bytes / (hw.intra_node_bytes_per_s * x.link_efficiency)).to_numpy(float) + 2 * x.collective_latency_s


def _errors(op: str, gpu: str, precision: str, size, predicted_s, measured_ms) -> pd.DataFrame:
    return pd.DataFrame({"op": op, "gpu": gpu, "dtype": precision, "size": size,
                         "error_pct": (predicted_s / (np.asarray(measured_ms, float) * 1e-3) - 1) * 100})


ATTENTION = {"context_attention": "context attention", "generation_attention": "generation attention"}


def rows() -> pd.DataFrame:
    out = []
    for name, system in SYSTEMS.items():
        hw = load_hardware(name)
        for (op, precision), part in operator_frames(system, "vllm").items():
            if precision in BYTES and hw.native_precision(precision) != precision:  # (keys of all-to-alls: kernels)
                continue
            if op == "gemm":
                m, n, k = (part[c].to_numpy(float) for c in ("m", "n", "k"))
                out.append(_errors("GEMM", name, precision, m, gemm_s(hw, load_engine(PROFILES[precision]), m, n, k), part.latency))
            elif op in ATTENTION:
                decode = op == "generation_attention"  # (over the prompt and the steps so far)
                b, heads, kv_heads, d = (part[c].to_numpy(float) for c in ("batch_size", "num_heads", "num_key_value_heads", "head_dim"))
                tokens = (part.isl + part.step if decode else part.isl).to_numpy(float)
                timed = (generation_s if decode else context_s)(hw, load_engine(PROFILES[precision]), b, tokens, heads, kv_heads, d)
                out.append(_errors(ATTENTION[op], name, precision, tokens, timed, part.latency))
            elif op == "moe" and hw.has_tensor_cores(precision):
                engine = load_engine({"bf16": "vllm", "fp8": "vllm-fp8"}.get(precision, f"vllm-fp8@weights={precision}"))
                out.append(_errors("MoE experts", name, precision, part.num_tokens, moe_s(hw, engine, part), part.latency))
            elif op == "all_to_all":
                timed = all_to_all_s(hw, load_engine("vllm"), node_gpus(system), part)
                out.append(_errors("all-to-all", name, precision, part.num_tokens, timed, part.latency))
        for (op, precision), part in operator_frames(system, "sglang").items():
            if op == "mla_generation":
                b, c, heads = part.batch_size.to_numpy(float), (part.isl + part.step).to_numpy(float), part.num_heads.to_numpy(float)
                timed = mla_generation_s(hw, load_engine(f"sglang-fp8@kv={precision}"), b, c, heads)
                out.append(_errors("MLA generation", name, precision, c, timed, part.latency))
        for (op, precision), part in operator_frames(system, "trtllm").items():
            if op == "mla_context":
                b, p, heads = part.batch_size.to_numpy(float), part.isl.to_numpy(float), part.num_heads.to_numpy(float)
                timed = context_s(hw, load_engine(f"trtllm-fp8@kv={precision}"), b, p, heads, heads, MLA_PREFILL_HEAD_DIM)
                out.append(_errors("MLA context", name, precision, p, timed, part.latency))
    return pd.concat(out, ignore_index=True)


def main() -> None:
    frame = rows()
    print("| operator | GPU | precision | size | points | MAPE % / median signed error % |\n|---|---|---|---|---|---|")
    for (op, gpu, dtype), group in frame.groupby(["op", "gpu", "dtype"], sort=True):
        for lo, hi in [*BANDS[op], (1, 1 << 20)]:
            part = group[(group["size"] >= lo) & (group["size"] <= hi)].error_pct
            if len(part):
                band = "all" if (lo, hi) == (1, 1 << 20) else f"{lo:,}-{hi:,}" if hi < 1 << 20 else f"{lo:,}+"
                print(f"| {op} | {gpu} | {dtype} | {band} | {len(part):,} | {part.abs().mean():.0f} / {part.median():+.0f} |")


if __name__ == "__main__":
    main()
