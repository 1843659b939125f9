"""Fit each GPU's operator curves to NVIDIA's measured kernels, and measure them held out.

    pip install --no-deps aiconfigurator-core==0.12.0 pyarrow   # (bench only: NVIDIA's measured tables, Apache-2.0)
    python bench/fit_kernels.py [--write] [--sample DIR]

aiconfigurator-core 0.12.0 ships, per GPU, engine and version, parquet tables of measured GEMMs,
context and generation attention and all-reduces. For every catalog GPU with tables and each
engine (vLLM 0.24, SGLang 0.5.14, TensorRT-LLM 1.3; A100: vLLM 0.14, SGLang 0.5.10, TensorRT-LLM
1.0) this fits the closed forms of `splitplan/perf/curves.py` (`scipy.optimize.least_squares`,
soft-L1 on the log ratio of predicted to measured latency, each parameter within its physical
range) on the shapes serving produces:
- GEMMs: m of 1 to 16,384 rows (tokens), n and k of at least 1,024, bf16 and fp8 weights;
- context attention: full attention, one beam, the heads the catalog's models hold on a GPU at TP 1
  to 8 (`SERVING_HEADS`: 4 or more query heads of at most 128 dims, at most 16 to a KV head), bf16
  and fp8 KV; its head-dim ramp (`half_dim`) where the table has 64- and 128-dim heads, else none;
  with each KV head's share of a query head's work (`kv_head_cost`) and a time per prompt and KV
  head (`s_per_kv_head`) since 2026-12-07, where the kernels ran narrow head groups slower than
  FLOPs alone say (vLLM's B200 fp8-KV table: an MHA layout -15 to -48 % fast, GQA groups of 16 +9
  to +37 % slow); and since 2026-12-08 a time per prompt and query head (`s_per_head`: at 16-token
  prompts every table takes about 20 ns per prompt and query head on B200) and the ramp of query
  tiles short of filling the SMs (`half_tiles`: in vLLM's B200 table one 2,048-token prompt over 8
  query heads, Llama-3.1-70B at TP 8, takes 3.8x a prompt's share of a batch of 64, over 32 heads
  1.6x; on H100 2.2x and 1.16x);
- generation attention: the same, context = isl + step;
- attention, as each engine serves it (`serving_kernels`): where a table times a shape with two
  kernels, the engine's default (SGLang's Blackwell tables time 833 shapes with both FlashInfer and
  trtllm_mha, FlashInfer's 1.38x slower at the median); vLLM's one-token prompts on FlashInfer
  backends, which its kernels time as decodes, are not prompts;
- MLA generation attention: DeepSeek's absorbed decode (a 576-element latent, its 512-rank part the
  values; the collectors measure DeepSeek-V3 only) per query heads a GPU holds, SGLang's and
  TensorRT-LLM's `generation_mla` kernels (vLLM's tables time the whole MLA module, projections
  included, which the model's GEMMs time apart: not fitted), bf16 and fp8 KV; since 2026-12-07
  with the cache read slower while few sequences fill the SMs (`half_sequences`: on Blackwell one
  sequence's 131,072 tokens take 1.2-2.1x the time per token of 64 sequences' 2,048, on Hopper
  1.0-1.2x), a time per sequence and query head (`s_per_head`: H100 TensorRT-LLM's 1,024 sequences
  of 2 tokens over 128 heads take 3x those over 16), and the compute of an fp8 cache at the fp8
  peak (TensorRT-LLM's B200 kernel decodes 128 heads over an fp8 latent faster than the bf16 peak
  allows);
- MLA prefill attention (since 2026-12-07): an uncached prompt attended as MHA over the expanded
  heads (192 query-key and 128 value dims, counted as heads of 160), the context form with one head
  group and one dim, on the `context_mla` tables of the kernels that time it so
  (`MLA_PREFILL_KERNELS`: TensorRT-LLM's, and SGLang's on Blackwell; SGLang's Hopper and L40S tables
  time the absorbed latent), bf16 and fp8 KV, held out by heads;
- all-reduce: bf16, the graph-captured kernel where the table has both (serving's decode and
  vLLM's piecewise graphs), per GPU count, as the faster of two lines (`fit_all_reduce`); the
  tables' message_size counts elements (the collector all-reduces a tensor of that many), so a
  message is 2 bytes per element;
- expert all-to-all: DeepEP's dispatch plus combine among the GPUs of one node (8; a GB200 tray's 4:
  the tables' only GPU count), bf16, of 1 to 16,384 tokens a GPU, its low-latency and high-throughput kernels
  each a line (vLLM 0.24 and TensorRT-LLM 1.3.0rc11 `moe_a2a_perf`, SGLang 0.5.12 `wideep_deepep_ll`
  and `_normal`: the versions that have them), the high-throughput time per shape the fastest over
  the SMs measured;
- MoE experts: gated (SwiGLU) fused MoE layers of 1 to 16,384 tokens on one GPU of each expert
  layout measured (moe_tp_size x moe_ep_size; the collectors give the GPU 1/ep of the routed rows),
  bf16, fp8 (block-scaled where the engine has it, else per-tensor) and NVFP4 weights, routed by
  NVIDIA's default power law (alpha 1.01, imbalanced as served); per shape the fastest kernel the
  engine offers (an engine picks its MoE backend per GPU and precision).

Held out by model shape: the GEMM shapes fall in five folds by their (n, k), the attention shapes
by their (heads, KV heads, head dim), MLA's by its heads, the MoE shapes by their (hidden, inter, experts, top-k), the
all-to-all shapes by their (hidden, top-k, experts);
each fold is predicted by a fit without it. Prints the MAPE % / median signed error % per engine,
GPU, operator class and precision (the target of issue 55: 10 % in every cell of more than 20
points), and flags any parameter fitted onto its bound.
`--write` writes the curves fitted on every shape into `hardware_specs/*.yaml` (`kernels:`; with
`--only OPERATOR ...`, those classes' curves alone, of `--engines` and into `--gpus` if given: the
context curves shipped since 2026-12-08 came from `--write --only context_attention`, SGLang's
Blackwell generation curves from `--write --only generation_attention --engines sglang --gpus
b200-180gb gb200-nvl72`, the MLA prefill curves from `--write --only mla_context`);
`--sample DIR` writes the small vendored sample the tests check the curves against.
"""

from __future__ import annotations

import argparse
import re
from importlib import resources
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares

from splitplan.perf import curves
from splitplan.specs.engine import BYTES
from splitplan.specs.hardware import load_hardware
from splitplan.specs.model import load_model

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = {"a100-80gb": "a100_sxm", "h100-80gb": "h100_sxm", "h200-141gb": "h200_sxm", "b200-180gb": "b200_sxm",
           "gb200-nvl72": "gb200", "l40s-48gb": "l40s"}
VERSIONS = {"vllm": ("0.24.0", "0.14.0"), "sglang": ("0.5.14", "0.5.10"), "trtllm": ("1.3.0rc20", "1.0.0")}  # (others, A100)
DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
GEMM_DTYPES = {**DTYPES, "nvfp4": "fp4"}  # (weights: NVFP4's W4A4 GEMMs where the GPU has fp4 tensor cores)
FOLDS = 5
# name: (start, lower, upper) per curve parameter
GEMM = {"efficiency": (0.7, 0.05, 1.0), "half_tokens": (50.0, 0.0, 4096.0), "half_n": (100.0, 0.0, 1e5), "half_k": (100.0, 0.0, 1e5),
        "memory_efficiency": (0.8, 0.2, 1.0),
        "input_passes": (1.0, 0.0, 50.0), "output_passes": (1.0, 0.0, 50.0), "latency_s": (5e-6, 0.0, 1e-4)}
CONTEXT = {"efficiency": (0.5, 0.02, 1.0), "half_tokens": (100.0, 0.0, 1e5), "latency_s": (1e-5, 0.0, 1e-3),
           "half_dim": (10.0, 0.0, 1e4), "kv_head_cost": (0.5, 0.0, 20.0), "s_per_kv_head": (1e-7, 0.0, 1e-4),
           "s_per_head": (1e-8, 0.0, 1e-5), "half_tiles": (50.0, 0.0, 1e5)}
GENERATION = {"memory_efficiency": (0.7, 0.05, 1.0), "efficiency": (0.3, 0.01, 1.0), "s_per_sequence": (1e-7, 0.0, 1e-4),
              "s_per_kv_head": (1e-8, 0.0, 1e-4), "latency_s": (1e-5, 0.0, 1e-3)}
UNFITTED_GENERATION = {"half_sequences": 0.0, "s_per_head": 0.0}  # (MLA's terms: 0 in the heads' form, not fitted)
MLA_GENERATION = {**{name: GENERATION[name] for name in ("memory_efficiency", "efficiency", "s_per_sequence", "latency_s")},
                  "half_sequences": (1.0, 0.0, 1e4), "s_per_head": (1e-9, 0.0, 1e-5)}
DEEPSEEK = load_model("deepseek-v3")  # (the MLA collectors measure DeepSeek-V3's)
# its decode latent (kv_lora_rank + qk_rope_head_dim, 576) and its rank (kv_lora_rank, 512)
MLA_LATENT, MLA_RANK = float(DEEPSEEK.kv_cache_elements_per_layer), float(DEEPSEEK.mla.kv_lora_rank)
# MLA's prefill: the latent expanded to MHA heads (as many KV heads as query heads) of 192 query-key and 128
# value dims, attended as heads of their mean (perf.curves.context_attention_s counts 2 x dims FLOPs a score)
MLA_PREFILL_HEAD_DIM = DEEPSEEK.prefill_head_dim
# The MLA prefill kernels whose tables time it as the engine serves an uncached prompt (TensorRT-LLM's collector:
# MHA over the projected heads, all of them). SGLang's collector (aiconfigurator collector/sglang/collect_mla.py,
# read 2026-12) times Blackwell's trtllm_mla over projected heads too, but Hopper's FA3 (`flash_attention`) and
# L40S's Triton over the absorbed 576-dim latent, which SGLang serves only for decode and cached prefixes.
MLA_PREFILL_KERNELS = {"sglang": ("trtllm_mla",)}
UNFITTED_MLA_CONTEXT = {"half_dim": 0.0, "kv_head_cost": 0.0, "s_per_kv_head": 0.0}  # (one dim, one head group)
MLA_CONTEXT = {name: spec for name, spec in CONTEXT.items() if name not in UNFITTED_MLA_CONTEXT}
ALL_REDUCE = {"latency_s": (5e-6, 0.0, 1e-3), "bytes_per_s": (2e11, 1e8, 1e13),
              "large_latency_s": (5e-5, 0.0, 1e-2), "large_bytes_per_s": (3e11, 1e8, 1e13)}
MOE = {"efficiency": (0.5, 0.02, 1.0), "half_rows": (50.0, 0.0, 1e4), "memory_efficiency": (0.6, 0.05, 1.0),
       "row_passes": (2.0, 0.0, 100.0), "token_passes": (1.0, 0.0, 100.0), "latency_s": (2e-5, 0.0, 1e-3),
       "s_per_expert": (1e-7, 0.0, 1e-4)}
# a weight precision's MoE tables, the first the engine has: DeepSeek's and Qwen3's fp8 checkpoints are block-scaled
MOE_DTYPES = {"bf16": ("bfloat16",), "fp8": ("fp8_block", "fp8"), "fp4": ("nvfp4",)}
MOE_ROUTING = "power_law_1.01"  # aiconfigurator's default routing (imbalanced, as served), not the balanced rows
MOE_SHAPE = ["num_tokens", "hidden_size", "inter_size", "num_experts", "topk", "moe_tp_size", "moe_ep_size"]  # curves.moe_s's order
ALL_TO_ALL = {"latency_s": (5e-5, 0.0, 1e-2), "bytes_per_s": (2e11, 1e8, 1e13), "s_per_copy": (1e-8, 0.0, 1e-5)}
A2A_VERSIONS = {"vllm": "0.24.0", "sglang": "0.5.12", "trtllm": "1.3.0rc11"}  # (the versions with all-to-all tables)
A2A_SHAPE = ["num_tokens", "hidden_size", "topk", "num_experts"]
NODE_GPUS = {"gb200": 4}  # the all-to-all tables' one node (8 GPUs; a GB200 compute tray, 4): their only GPU count
CONTEXT_BANDS = [(1, 512), (513, 4096), (4097, 1 << 30)]  # attention's context (or prompt) tokens
# The attention heads serving produces: the catalog's models at TP 1 to 8 hold 4 to 128 query heads a GPU,
# of 64 or 128 dims, at most 16 to a KV head (Llama-3.1-405B's and Qwen3-235B-A22B's groups; MLA has its
# own tables). The tables also time dims to 512 and groups to 128, which no catalog model serves.
SERVING_HEADS = {"min_heads": 4, "max_head_dim": 128, "max_group": 16}
# Where a table times a shape with more than one attention kernel, the one the engine serves with by default:
# SGLang's default for models without MLA is trtllm_mha on Blackwell, fa3 on Hopper, else flashinfer, else triton
# (server_args `_get_default_attn_backend`, read 2026-12). Kernels not listed rank after those listed.
SERVING_KERNELS = {"sglang": ("trtllm_mha", "fa3", "flashinfer", "triton")}
ATTENTION_SHAPE = ["batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype"]


def _table_load(f: pd.DataFrame) -> np.ndarray:
    """The busiest expert group's load as NVIDIA's collector routed the MoE rows `f` (curves.table_load)."""
    return curves.table_load(*(f[col].to_numpy(float) for col in ("num_tokens", "num_experts", "topk", "moe_ep_size")))


def node_gpus(system: str) -> int:
    return NODE_GPUS.get(system, 8)


def table(system: str, kind: str, engine: str, name: str, version: str | None = None) -> pd.DataFrame:
    version = version or VERSIONS[engine][system == "a100_sxm"]
    path = resources.files("aiconfigurator_core") / "systems" / "data" / system / kind / engine / version / name
    return pd.read_parquet(path) if path.is_file() else pd.DataFrame()


def fit(form, spec: dict, frame: pd.DataFrame, groups: np.ndarray | None):
    """(parameters fitted on every row, held-out relative errors %, parameters on a bound) of
    `form(params, frame)` against frame.latency (ms)."""
    names = list(spec)
    start, lower, upper = (np.array([spec[n][i] for n in names]) for i in range(3))
    scale = np.where(start > 0, start, 1.0)
    measured = frame.latency.to_numpy(float) * 1e-3

    def solve(rows):
        def residuals(x):
            return np.log(form(SimpleNamespace(**dict(zip(names, x * scale, strict=True))), frame[rows]) / measured[rows])
        x = least_squares(residuals, start / scale, bounds=(lower / scale, upper / scale), loss="soft_l1", f_scale=0.05).x
        return dict(zip(names, (float(v) for v in x * scale), strict=True))

    params = solve(np.ones(len(frame), bool))
    errors = np.full(len(frame), np.nan)
    if groups is not None:
        for fold in range(FOLDS):
            held = groups == fold
            if held.any() and (~held).any():
                part = solve(~held)
                errors[held] = (form(SimpleNamespace(**part), frame[held]) / measured[held] - 1) * 100
    on_bound = [n for n in names if np.isclose(params[n], spec[n][1], rtol=1e-3, atol=1e-12) and spec[n][1] > 0
                or np.isclose(params[n], spec[n][2], rtol=1e-3, atol=0.0)]
    return params, errors, on_bound


def fit_all_reduce(frame: pd.DataFrame, message_bytes: np.ndarray):
    """`fit` of the two-algorithm all-reduce (in-sample errors %), started from straight lines through
    the smaller and the larger messages split at each of seven sizes, the best fit kept (one start
    finds a local minimum where one line serves all sizes)."""
    measured_s = frame.latency.to_numpy(float) * 1e-3
    order, best = np.argsort(message_bytes), None
    for share in np.linspace(0.2, 0.8, 7):
        cut = int(share * len(order))
        lines = [np.polyfit(message_bytes[part], measured_s[part], 1) for part in (order[:cut], order[cut:])]
        starts = [max(line[1], 1e-6) for line in lines], [1 / max(line[0], 1e-13) for line in lines]
        spec = {name: (float(np.clip(start, lo * 1.01 + 1e-12, hi / 1.01)), lo, hi) for (name, (_, lo, hi)), start
                in zip(ALL_REDUCE.items(), (starts[0][0], starts[1][0], starts[0][1], starts[1][1]), strict=True)}
        params, _, hit = fit(lambda c, f: curves.all_reduce_s(c, f.message_size.to_numpy(float) * curves.ACTIVATION_BYTES),
                             spec, frame, None)
        if params["bytes_per_s"] > params["large_bytes_per_s"]:  # (the large-message line is the higher bandwidth)
            swap = dict(zip(ALL_REDUCE, ("large_latency_s", "large_bytes_per_s", "latency_s", "bytes_per_s"), strict=True))
            params, hit = {name: params[swap[name]] for name in ALL_REDUCE}, [swap[name] for name in hit]
        err = (curves.all_reduce_s(SimpleNamespace(**params), message_bytes) / measured_s - 1) * 100
        if best is None or np.abs(err).mean() < np.abs(best[1]).mean():
            best = params, err, hit
    assert best is not None
    return best


def _folds(*columns) -> np.ndarray:
    key = np.zeros(len(columns[0]), np.int64)
    for c in columns:
        key = key * 1_000_003 + np.asarray(c, np.int64)
    _, index = np.unique(key, return_inverse=True)
    return (index * 7919) % FOLDS  # shapes spread over the folds, the same every run


def serving_attention(frame: pd.DataFrame) -> pd.DataFrame:
    """An attention table's rows of the shapes serving produces: full attention, one beam (older
    tables have neither column: all are), and heads as the catalog's models hold them on a GPU at TP 1
    to 8 (SERVING_HEADS)."""
    if frame.empty:
        return frame
    keep = ((frame.head_dim <= SERVING_HEADS["max_head_dim"]) & (frame.num_heads >= SERVING_HEADS["min_heads"])
            & (frame.num_heads <= SERVING_HEADS["max_group"] * frame.num_key_value_heads)).to_numpy(copy=True)
    for column, value in (("window_size", 0), ("beam_width", 1)):
        if column in frame:
            keep &= (frame[column] == value).to_numpy()
    return frame[keep]


def serving_kernels(frame: pd.DataFrame, engine: str, context: bool) -> pd.DataFrame:
    """An attention table's rows as the engine serves them: per shape and KV precision, the kernel it
    runs by default (SERVING_KERNELS), attending in bf16 where that kernel was timed both ways (an fp8
    cache is attended in fp8 only where the kernel has no bf16 path: SGLang's trtllm_mha on
    Blackwell, its fa3 prefill on Hopper); and of a context table, the prompts its prefill kernel
    times. vLLM's FlashInfer backends serve a query of one token as a decode (`reorder_batch_threshold`
    1), so its collector's one-token prompts are timed by the decode kernel (`kernel_source`
    ...decode) and are left out."""
    if frame.empty:
        return frame
    if context:
        frame = frame[~frame.kernel_source.str.contains("decode")]
    order = SERVING_KERNELS.get(engine, ())
    rank = 2 * frame.kernel_source.map(lambda k: order.index(k) if k in order else len(order)) + (frame.attn_dtype != "bfloat16")
    shape = [frame[c] for c in ATTENTION_SHAPE if c in frame]
    return frame[rank == rank.groupby(shape, dropna=False).transform("min")]


def serving_mla_prefill(frame: pd.DataFrame, engine: str) -> pd.DataFrame:
    """A `context_mla` table's rows as the engine serves an uncached prompt: of the kernels that time
    it so (MLA_PREFILL_KERNELS), bf16 MLA, the heads serving produces (SERVING_HEADS' least), a shape
    timed twice by its median."""
    if frame.empty:
        return frame
    frame = frame[(frame.num_heads >= SERVING_HEADS["min_heads"]) & (frame.mla_dtype == "bfloat16")
                  & frame.kernel_source.isin(MLA_PREFILL_KERNELS.get(engine, frame.kernel_source.unique()))]
    return frame.groupby(["kv_cache_dtype", "batch_size", "isl", "num_heads"], as_index=False).latency.median()


def all_to_all_frames(system: str, engine: str) -> dict[tuple[str, str], pd.DataFrame]:
    """("all_to_all", kernels): dispatch plus combine (ms) per shape among one machine's GPUs."""
    version = A2A_VERSIONS[engine]
    if engine == "sglang":
        frames = {}
        for kernels, name, parts in (("low-latency", "ll", ("dispatch_avg_t_us", "combine_avg_t_us")),
                                     ("high-throughput", "normal", ("dispatch_transmit_us", "dispatch_notify_us",
                                                                    "combine_transmit_us", "combine_notify_us"))):
            t = table(system, "comm", engine, f"wideep_deepep_{name}_perf.parquet", version)
            if not t.empty:
                t = t[t.node_num == 1].rename(columns={"num_token": "num_tokens", "num_topk": "topk"})
                frames[kernels] = t.assign(latency=sum(t[c] for c in parts) * 1e-3)
    else:
        t = table(system, "comm", engine, "moe_a2a_perf.parquet", version)
        t = t[(t.node_num == 1) & (t.ep_size == node_gpus(system)) & t.comm_dtype.isin(["bfloat16", "default"])] if len(t) else t
        if t.empty:
            return {}
        t = t.pivot_table(index=[*A2A_SHAPE, "comm_backend", "sms"], columns="phase", values="latency").dropna().reset_index()
        t["latency"] = (t["dispatch"] + t["combine"]) * 1e-3
        frames = {kernels: t[t.comm_backend.str.endswith(suffix)] for kernels, suffix in (("low-latency", "_ll"),
                                                                                          ("high-throughput", "_ht"))}
    return {("all_to_all", kernels): f[f.num_tokens <= 16384].groupby(A2A_SHAPE, as_index=False).latency.min()
            for kernels, f in frames.items() if len(f)}


def operator_frames(system: str, engine: str) -> dict[tuple[str, str], pd.DataFrame]:
    """(operator class, precision): the measured rows serving's shapes produce."""
    out = {}
    gemm = table(system, "gemm", engine, "gemm_perf.parquet")
    if not gemm.empty:
        gemm = gemm[(gemm.m <= 16384) & (gemm.n >= 1024) & (gemm.k >= 1024)]
        for dtype, precision in GEMM_DTYPES.items():
            out["gemm", precision] = gemm[gemm.gemm_dtype == dtype]
    for op in ("context", "generation"):
        frame = serving_kernels(serving_attention(table(system, "attention", engine, f"{op}_attention_perf.parquet")), engine,
                                op == "context")
        if not frame.empty:
            for dtype, precision in DTYPES.items():
                out[f"{op}_attention", precision] = frame[frame.kv_cache_dtype == dtype]
    mla = table(system, "mla", engine, "generation_mla_perf.parquet")
    if not mla.empty:
        for dtype, precision in DTYPES.items():
            out["mla_generation", precision] = mla[(mla.kv_cache_dtype == dtype) & (mla.mla_dtype == "bfloat16")]
    mla = serving_mla_prefill(table(system, "mla", engine, "context_mla_perf.parquet"), engine)
    if not mla.empty:
        for dtype, precision in DTYPES.items():
            out["mla_context", precision] = mla[mla.kv_cache_dtype == dtype]
    moe = table(system, "moe", engine, "moe_perf.parquet")
    if not moe.empty:  # gated experts, tokens as for GEMMs; per shape the fastest kernel the engine has
        moe = moe[(moe.distribution == MOE_ROUTING) & (moe.num_tokens <= 16384) & ~moe.kernel_source.str.contains("nongated")]
        for precision, dtypes in MOE_DTYPES.items():
            dtype = next((d for d in dtypes if (moe.moe_dtype == d).any()), None)
            if dtype is not None:
                out["moe", precision] = moe[moe.moe_dtype == dtype].groupby(MOE_SHAPE, as_index=False).latency.min()
    out |= all_to_all_frames(system, engine)
    reduce = table(system, "comm", engine, "custom_allreduce_perf.parquet")
    if not reduce.empty:
        reduce = reduce[reduce.allreduce_dtype == "bfloat16"]
        if "backend" in reduce and reduce.backend.str.contains("graph").any():
            reduce = reduce[reduce.backend.str.contains("graph")]
        for gpus, part in reduce.groupby("num_gpus"):
            out["all_reduce", str(gpus)] = part
    return {key: frame for key, frame in out.items() if len(frame)}


def fit_gpu(name: str, engine: str):
    """(curves as the hardware spec's `kernels.<engine>` mapping, rows of held-out errors, bounds hit)."""
    hw = load_hardware(name)
    bf16, bandwidth = hw.peak_flops_per_s("bf16"), hw.memory_bytes_per_s
    curves_out: dict = {"gemm": {}, "context_attention": {}, "generation_attention": {}, "mla_context": {}, "mla_generation": {},
                        "all_reduce": [], "moe": {}}
    errors, bounds, mape, lines = [], [], {}, {}
    for (op, key), frame in operator_frames(SYSTEMS[name], engine).items():
        if op == "gemm":
            if hw.native_precision(key) != key:  # (a precision the GPU computes at another: no curve of its own)
                continue
            peak, wbpe = hw.peak_flops_per_s(key), BYTES[key]
            params, err, hit = fit(lambda c, f, peak=peak, wbpe=wbpe: curves.gemm_s(
                c, peak, bandwidth, f.m.to_numpy(float), f.n.to_numpy(float), f.k.to_numpy(float), wbpe), GEMM, frame,
                _folds(frame.n, frame.k))
            size = frame.m.to_numpy(float)
        elif op == "moe":
            if not hw.has_tensor_cores(key):
                continue
            peak, wbpe = hw.peak_flops_per_s(key), BYTES[key]
            params, err, hit = fit(lambda c, f, peak=peak, wbpe=wbpe: curves.moe_s(
                c, peak, bandwidth, *(f[col].to_numpy(float) for col in MOE_SHAPE), wbpe, load=_table_load(f)), MOE, frame,
                _folds(frame.hidden_size, frame.inter_size, frame.num_experts, frame.topk))
            size = frame.num_tokens.to_numpy(float)
        elif op == "context_attention":
            params, err, hit = fit(lambda c, f: curves.context_attention_s(
                c, bf16, f.batch_size.to_numpy(float), f.isl.to_numpy(float), f.num_heads.to_numpy(float),
                f.num_key_value_heads.to_numpy(float), f.head_dim.to_numpy(float)), CONTEXT, frame,
                _folds(frame.num_heads, frame.num_key_value_heads, frame.head_dim))
            if frame.head_dim.nunique() == 1:  # (heads of one dim, 128: no ramp to fit, none assumed)
                params["half_dim"], hit = 0.0, [p for p in hit if p != "half_dim"]
            size = frame.isl.to_numpy(float)
        elif op == "mla_context":
            params, err, hit = fit(lambda c, f: curves.context_attention_s(
                SimpleNamespace(**vars(c), **UNFITTED_MLA_CONTEXT), bf16, f.batch_size.to_numpy(float), f.isl.to_numpy(float),
                f.num_heads.to_numpy(float), f.num_heads.to_numpy(float), MLA_PREFILL_HEAD_DIM), MLA_CONTEXT, frame,
                _folds(frame.num_heads))
            params |= UNFITTED_MLA_CONTEXT
            size = frame.isl.to_numpy(float)
        elif op == "generation_attention":
            kvb = BYTES[key]
            params, err, hit = fit(lambda c, f, kvb=kvb: curves.generation_attention_s(
                SimpleNamespace(**vars(c), **UNFITTED_GENERATION), bf16, bandwidth, f.batch_size.to_numpy(float),
                (f.isl + f.step).to_numpy(float), f.num_heads.to_numpy(float), f.num_key_value_heads.to_numpy(float),
                f.head_dim.to_numpy(float), kvb), GENERATION, frame,
                _folds(frame.num_heads, frame.num_key_value_heads, frame.head_dim))
            params["max_kv_heads"] = int(frame.num_key_value_heads.max())  # (the per-KV-head term's measured range)
            size = (frame.isl + frame.step).to_numpy(float)
        elif op == "mla_generation":
            kvb, cache_peak = BYTES[key], hw.peak_flops_per_s(key)
            params, err, hit = fit(lambda c, f, kvb=kvb, cache_peak=cache_peak: curves.mla_generation_s(
                c, cache_peak, bandwidth, f.batch_size.to_numpy(float), (f.isl + f.step).to_numpy(float), f.num_heads.to_numpy(float),
                MLA_LATENT, MLA_RANK, kvb), MLA_GENERATION, frame, _folds(frame.num_heads))
            params["s_per_kv_head"] = 0.0  # (one latent per token: a generation-attention curve of one KV head)
            size = (frame.isl + frame.step).to_numpy(float)
        elif op == "all_to_all":
            gpus = node_gpus(SYSTEMS[name])
            params, err, hit = fit(lambda c, f, low=key == "low-latency", gpus=gpus: curves.all_to_all_s(
                c, f.num_tokens.to_numpy(float), f.hidden_size.to_numpy(float), f.topk.to_numpy(float), gpus, low),
                ALL_TO_ALL, frame, _folds(frame.hidden_size, frame.topk, frame.num_experts))
            size = frame.num_tokens.to_numpy(float)
        else:  # all-reduce: too few shapes to hold out; the error is in-sample
            size = frame.message_size.to_numpy(float) * curves.ACTIVATION_BYTES
            params, err, hit = fit_all_reduce(frame, size)
        label = f"{op} {key}" if op != "all_reduce" else f"all_reduce {key} GPUs"
        bounds += [f"{engine} {name} {label}: {p}" for p in hit]
        errors.append(pd.DataFrame({"engine": engine, "gpu": name, "op": op, "key": key, "size": size, "error_pct": err}))
        mape[label.replace(" ", "_")] = round(float(np.nanmean(np.abs(err))), 1)
        rounded = {k: v if isinstance(v, int) else float(f"{v:.4g}") for k, v in params.items()}
        if op == "all_reduce":
            curves_out["all_reduce"].append({"gpus": int(key), **rounded})
        elif op == "all_to_all":
            lines[key.replace("-", "_")] = rounded
        else:
            curves_out[op][key] = rounded
    if len(lines) == 2:  # (a curve needs both kernel families)
        curves_out["all_to_all"] = [{"gpus": node_gpus(SYSTEMS[name]), "low_latency": lines["low_latency"],
                                     "high_throughput": lines["high_throughput"]}]
    version = VERSIONS[engine][name == "a100-80gb"]
    curves_out = {k: v for k, v in curves_out.items() if v}
    if not curves_out:
        return None, errors, bounds
    a2a = f" (all-to-all: {A2A_VERSIONS[engine]})" if "all_to_all" in curves_out and A2A_VERSIONS[engine] != version else ""
    source = (f"NVIDIA aiconfigurator-core 0.12.0 (Apache-2.0), measured {engine} {version}{a2a} kernel tables of "
              f"{SYSTEMS[name]}; fitted by python bench/fit_kernels.py --write, 2026-12")
    return {"source": source, **curves_out, "mape_pct": mape}, errors, bounds


TOKEN_BANDS = [(1, 16), (17, 256), (257, 4096), (4097, 16384)]
BANDS = {"gemm": TOKEN_BANDS, "moe": TOKEN_BANDS, "all_to_all": TOKEN_BANDS, "context_attention": CONTEXT_BANDS,
         "generation_attention": CONTEXT_BANDS, "mla_context": CONTEXT_BANDS, "mla_generation": CONTEXT_BANDS, "all_reduce": [(0, 1 << 40)]}


def report(frame: pd.DataFrame) -> None:
    print("| engine | GPU | operator | precision / GPUs | points | held-out MAPE % / median % | worst size band |")
    print("|---|---|---|---|---|---|---|")
    cells: dict[str, list[bool]] = {}  # per class, whether each cell of more than 20 points meets 10 %
    for (engine, gpu, op, key), part in frame.groupby(["engine", "gpu", "op", "key"], sort=True):
        err = part.error_pct.dropna()
        bands = [(lo, hi, part[(part["size"] >= lo) & (part["size"] <= hi)].error_pct.dropna()) for lo, hi in BANDS[op]]
        lo, hi, worst = max(bands, key=lambda b: b[2].abs().mean() if len(b[2]) > 20 else -1)
        judged = len(err) > 20
        if judged:
            cells.setdefault(op, []).append(err.abs().mean() <= 10)
        flag = " **" if judged and not cells[op][-1] else ""
        band = f"{lo:,}-{hi:,}: {worst.abs().mean():.0f}" if len(worst) else "-"
        print(f"| {engine} | {gpu} | {op.replace('_', ' ')} | {key} | {len(err):,} | "
              f"{err.abs().mean():.1f} / {err.median():+.1f}{flag} | {band} |")
    met = sum(sum(v) for v in cells.values())
    print(f"\n{met} of {sum(len(v) for v in cells.values())} cells of more than 20 points within 10 % (**: not): "
          + ", ".join(f"{op.replace('_', ' ')} {sum(v)} of {len(v)}" for op, v in sorted(cells.items())))
    alignment(frame[frame.op == "gemm"])


def alignment(gemm: pd.DataFrame) -> None:
    """The GEMM tables time m > 256 in pairs, a multiple of 16 and the row after it (m + 1), and
    Hopper's fp8 kernels run the second far slower: held-out error % on each half, which a curve
    smooth in m splits between them."""
    print("\nGEMMs of m > 256 rows, held-out MAPE % / median %: m a multiple of 16 | the row after one (m + 1)\n")
    print("| engine | GPU | precision | m a multiple of 16 | m + 1 |")
    print("|---|---|---|---|---|")
    for (engine, gpu, key), part in gemm[gemm["size"] > 256].groupby(["engine", "gpu", "key"], sort=True):
        cells = [part[part["size"] % 16 == rest].error_pct.dropna() for rest in (0, 1)]
        print(f"| {engine} | {gpu} | {key} | " + " | ".join(f"{e.abs().mean():.1f} / {e.median():+.1f} ({len(e):,})" for e in cells) + " |")


OPERATORS = ("gemm", "context_attention", "generation_attention", "mla_context", "mla_generation", "all_reduce", "all_to_all",
             "moe")


def keep_others(name: str, fitted: dict[str, dict], only: list[str], engines: list[str] | None = None,
                precisions: list[str] | None = None) -> dict[str, dict]:
    """A GPU's `kernels:` block as its hardware file has it, with the `only` operator classes' curves
    (and their errors in `mape_pct`) replaced by those just fitted (of every engine, or of `engines`;
    of every precision, or of `precisions`: the other precisions' curves of a class kept)."""
    shipped = yaml.safe_load((ROOT / "hardware_specs" / f"{name}.yaml").read_text()).get("kernels") or {}
    out = {}
    for engine, block in fitted.items():
        kept = dict(shipped.get(engine) or block)
        for op in only if engines is None or engine in engines else ():
            if op in block:
                kept[op] = block[op] if precisions is None else {
                    **kept.get(op, {}), **{p: curve for p, curve in block[op].items() if p in precisions}}
            fitted_now = {k: v for k, v in block["mape_pct"].items()
                          if k.startswith(op) and (precisions is None or k.rsplit("_", 1)[1] in precisions)}
            kept["mape_pct"] = {**kept.get("mape_pct", {}), **fitted_now}
        out[engine] = {op: kept[op] for op in [*block, *kept] if op in kept}  # (in the fitted block's order)
    return out


def write(fitted: dict[str, dict]) -> None:
    """Each GPU's `kernels:` block written into its hardware spec (replacing the one there)."""
    for name, by_engine in fitted.items():
        path = ROOT / "hardware_specs" / f"{name}.yaml"
        text = re.sub(r"\n# Operator curves fitted.*\Z", "\n", path.read_text(), flags=re.S).rstrip("\n") + "\n"
        block = yaml.safe_dump({"kernels": by_engine}, sort_keys=False, width=130)
        path.write_text(text + "# Operator curves fitted to NVIDIA's measured kernels, per engine (written by python "
                        "bench/fit_kernels.py --write;\n# rerun it, do not edit): perf/curves.py gives each form.\n" + block)
        print(f"wrote {path.relative_to(ROOT)}")


def sample(out: Path) -> None:
    """A small sample of the measured tables for the tests (vLLM on H100 and H200, and its NVFP4 GEMMs
    on B200; MLA's decode and prefill, which vLLM's tables time only as a whole module: SGLang's and
    TensorRT-LLM's on H200; and TensorRT-LLM's fp8 MoE experts on H200), with its license. Another
    engine's tables than vLLM's go in a folder of that engine's name."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    frames = [("vllm", name, op, key, frame) for name in ("h100-80gb", "h200-141gb")
              for (op, key), frame in operator_frames(SYSTEMS[name], "vllm").items() if op != "all_reduce"]
    frames += [(engine, "h200-141gb", op, key, frame) for engine, mla in (("sglang", "mla_generation"), ("trtllm", "mla_context"))
               for (op, key), frame in operator_frames("h200_sxm", engine).items() if op == mla]
    # (the later operators last: the others' draws as before)
    later = {"moe": 1, "all_to_all": 2, "mla_generation": 3, "mla_context": 4}
    nvfp4 = ("vllm", "b200-180gb", "gemm", "fp4", operator_frames("b200_sxm", "vllm")["gemm", "fp4"])  # (Blackwell's)
    trtllm_moe = ("trtllm", "h200-141gb", "moe", "fp8", operator_frames("h200_sxm", "trtllm")["moe", "fp8"])
    for engine, name, op, key, frame in [*sorted(frames, key=lambda f: later.get(f[2], 0)), nvfp4, trtllm_moe]:
        part = frame.iloc[np.sort(rng.choice(len(frame), size=min(60, len(frame)), replace=False))]
        columns = [c for c in ("m", "n", "k", "batch_size", "isl", "step", "num_heads", "num_key_value_heads",
                               "head_dim", *MOE_SHAPE, "latency") if c in part]
        path = (out if engine == "vllm" else out / engine) / f"{name}_{op}_{key}.csv"
        path.parent.mkdir(exist_ok=True)
        part[columns].to_csv(path, index=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the curves into hardware_specs/*.yaml")
    parser.add_argument("--only", nargs="+", metavar="OPERATOR", choices=OPERATORS,
                        help="with --write, write these operator classes' curves and keep the files' others (a fit "
                             "rerun elsewhere moves parameters the tables barely pin)")
    parser.add_argument("--engines", nargs="+", choices=list(VERSIONS), help="with --only, of these engines only")
    parser.add_argument("--gpus", nargs="+", choices=list(SYSTEMS), help="with --only, into these GPUs' files only")
    parser.add_argument("--precisions", nargs="+", choices=["bf16", "fp8", "fp4"],
                        help="with --only, these precisions' curves only (of the classes with a curve per precision)")
    parser.add_argument("--sample", type=Path, help="write the tests' sample of the tables here")
    args = parser.parse_args()
    fitted: dict[str, dict] = {}
    errors, bounds = [], []
    for name in SYSTEMS:
        for engine in VERSIONS:
            block, err, hit = fit_gpu(name, engine)
            errors += err
            bounds += hit
            if block:
                fitted.setdefault(name, {})[engine] = block
    report(pd.concat(errors, ignore_index=True))
    print("\nparameters on a bound:" if bounds else "\nno parameter on a bound")
    for line in bounds:
        print(f"- {line}")
    if args.write:
        write(fitted if not args.only else {name: keep_others(name, blocks, args.only, args.engines, args.precisions)
                                            for name, blocks in fitted.items() if args.gpus is None or name in args.gpus})
    if args.sample:
        sample(args.sample)


if __name__ == "__main__":
    main()
