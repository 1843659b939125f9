"""The pass formula compiled (numba): one scalar function the Python perf model and the compiled
prompt replay (capacity.replay) both evaluate, so the two cannot drift apart.

`Instance._terms` documents the formula; this module holds its arithmetic, in the same order of
operations (a pass computed here equals, to the bit, what the NumPy formula it replaced gave).
An instance's constants travel as one float64 vector (`FIELDS` names its entries), which
`Instance.pass_vector` packs.

numba compiles each function on its first call and caches the machine code beside this file (or,
where that is not writable, in the user's cache directory), so only the first run after an install
pays the compile, about 7 s (bench/optimize_speed.py times that first run). Later runs pay numba's
start: about 0.8 s, 0.4 s of it SciPy's linear algebra, which numba loads to look for BLAS and
`optimize` loads anyway for its ILP; only commands that time passes import numba.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.core import event

from splitplan.base import notices

_UNCACHED: list[str] = []  # the kernels numba found no writable place to cache


def jit(function, **options):
    """`function` compiled by numba, its machine code cached where numba finds a writable place; in
    none (a read-only install and home directory), compiled in every process instead."""
    try:
        return njit(cache=True, **options)(function)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        _UNCACHED.append(function.__qualname__)
        return njit(**options)(function)


class _FirstCompile(event.Listener):
    """numba's compile events (a compile, not a load from its cache): the first of a process is
    told (`base.notices`)."""

    def on_start(self, ev: event.Event) -> None:
        notices.first_compile(not _UNCACHED)

    def on_end(self, ev: event.Event) -> None:
        pass


event.register("numba:compile", _FirstCompile())


def inline(function):
    """`jit`, compiled into each function that calls it (numba's inline="always"): for the small
    helpers of a compiled loop, whose calls would otherwise pass every array they take (and count
    its references) once per event."""
    return jit(function, inline="always")


FIELDS = (
    "layers_per_stage", "act_bytes_per_element", "weight_bytes_per_element", "peak_flops_per_s", "gemm_peak_flops_per_s",
    "memory_bytes_per_s", "compute_efficiency", "gemm_half_tokens", "dense_flops_per_token", "dense_weight_bytes",
    "activation_bytes_per_token", "q_dim_per_gpu", "kv_dim_per_gpu", "prefill_attention_flops_per_sq_token",
    "decode_flops_per_context_token", "decode_bytes_per_context_token", "routed_expert_share", "lm_head_params",
    "collective_s_per_token", "collective_latency_s", "all_to_all_s_per_token", "all_to_all_latency_s",
    "hop_s_per_token", "hop_latency_s", "dp", "pp", "divides_pass", "gpu_launch_s", "host_launch_s",
    "packed_attention", "clock_slowdown", "capped_clock_slowdown",
    # measured kernel curves (perf.curves), or their roofline defaults (the same bandwidth, no extra time)
    "gemm_bytes_per_s", "gemm_pass_s_per_token", "gemm_latency_s", "prefill_attention_half_tokens",
    "prefill_attention_latency_s", "kv_bytes_per_s", "decode_attention_efficiency", "decode_attention_s_per_seq",
    "decode_attention_latency_s",
    # the engine's factors and the model's experts the formula reads
    "knee_slowdown", "knee_tokens", "moe_efficiency", "attention_efficiency", "decode_overhead_s", "prefill_overhead_s",
    "sequence_overhead_s", "prefill_sequence_overhead_s", "is_moe", "experts", "experts_per_token", "expert_params",
)
(LAYERS, ACT_BPE, WEIGHT_BPE, PEAK, GEMM_PEAK, MEMORY_BPS, COMPUTE_EFF, GEMM_HALF, DENSE_FLOPS, DENSE_BYTES,
 ACT_BYTES, Q_DIM, KV_DIM, PREFILL_ATTN_FLOPS, DECODE_FLOPS, DECODE_BYTES, EXPERT_SHARE, LM_HEAD, COLL_S_PER_TOKEN,
 COLL_LATENCY, A2A_S_PER_TOKEN, A2A_LATENCY, HOP_S_PER_TOKEN, HOP_LATENCY, DP, PP, DIVIDES, GPU_LAUNCH, HOST_LAUNCH,
 PACKED, CLOCK_SLOWDOWN, CAPPED_SLOWDOWN, GEMM_BPS, GEMM_PASS_S, GEMM_LATENCY, PREFILL_ATTN_HALF, PREFILL_ATTN_LATENCY,
 KV_BPS, DECODE_ATTN_EFF, DECODE_ATTN_S_PER_SEQ, DECODE_ATTN_LATENCY, KNEE_SLOWDOWN, KNEE_TOKENS, MOE_EFF, ATTN_EFF,
 DECODE_OVERHEAD, PREFILL_OVERHEAD, SEQ_OVERHEAD, PREFILL_SEQ_OVERHEAD, IS_MOE, EXPERTS, TOP_K, EXPERT_PARAMS) = range(len(FIELDS))


@jit
def pass_shares(c, prefill_seqs, decode_seqs, has_prefill):
    """(micro, groups): the share of a pass one pipeline micro-batch carries and over how many
    attention groups its requests spread (`Instance._shares`)."""
    pp, dp = c[PP], c[DP]
    micro = 1.0 if pp == 1 else 1.0 / (pp - (pp - min(max(decode_seqs, 1.0), pp)) * (1 - has_prefill))
    groups = 1.0 if dp == 1 else min(dp, max((prefill_seqs + decode_seqs) * micro, 1.0))
    return micro, groups


@jit
def _gemm_efficiency(c, rows):
    return c[COMPUTE_EFF] * rows / (rows + c[GEMM_HALF])


@jit
def pass_terms(c, prefill_seqs, prefill_tokens, prefill_sq_tokens, decode_seqs, decode_context_tokens):
    """(compute_s, memory_s, network_s, overhead_s, flops, bytes) of one pass (`Instance._terms`)."""
    layers, peak = c[LAYERS], c[PEAK]
    has_prefill = 1.0 if prefill_tokens > 0 else 0.0
    if c[DIVIDES] > 0:
        micro, groups = pass_shares(c, prefill_seqs, decode_seqs, has_prefill)
        stages = c[PP] + (c[PP] - 1) * has_prefill
    else:
        micro = groups = stages = 1.0
    pre_tok = prefill_tokens * micro
    n_tok = pre_tok + decode_seqs * micro
    a_tok = n_tok / groups
    n_seq = (prefill_seqs + decode_seqs) * micro / groups

    safe_tok = max(a_tok, 1.0)
    knee = 1.0 + c[KNEE_SLOWDOWN] * max(safe_tok - c[KNEE_TOKENS], 0.0) / safe_tok if c[KNEE_SLOWDOWN] else 1.0
    gemm_peak = c[GEMM_PEAK]
    compute_s = memory_s = flops = nbytes = 0.0
    for k in range(5):  # operator classes: dense GEMMs, routed experts, prefill attention, decode attention, LM head
        # beside the roofline: fixed_s (kernel latency, per sequence) and extra_s (compute-side: activation passes, ramp)
        bandwidth, fixed_s, extra_s = c[GEMM_BPS], 0.0, 0.0
        if k == 0:
            class_flops, class_bytes = a_tok * c[DENSE_FLOPS], c[DENSE_BYTES] + a_tok * c[ACT_BYTES]
            class_peak = gemm_peak * _gemm_efficiency(c, safe_tok)
            fixed_s, extra_s = c[GEMM_LATENCY], a_tok * c[GEMM_PASS_S]
        elif k == 1:
            if not c[IS_MOE]:
                continue
            experts, top_k = c[EXPERTS], c[TOP_K]
            touched = experts * (1 - (1 - top_k / experts) ** n_tok)
            rows = max(n_tok * top_k / max(touched, 1e-9), 1.0)
            class_flops = 2 * n_tok * top_k * c[EXPERT_PARAMS] * c[EXPERT_SHARE]
            class_bytes = touched * c[EXPERT_PARAMS] * c[WEIGHT_BPE] * c[EXPERT_SHARE]
            class_peak = gemm_peak * _gemm_efficiency(c, rows) * c[MOE_EFF]
        elif k == 2:
            group_pre = pre_tok / groups
            pre_sq = group_pre**2 if c[PACKED] else prefill_sq_tokens * micro / groups
            class_flops = pre_sq * c[PREFILL_ATTN_FLOPS]
            class_bytes = group_pre * (2 * c[Q_DIM] + 2 * c[KV_DIM]) * c[ACT_BPE]
            class_peak, bandwidth = peak * c[ATTN_EFF], c[MEMORY_BPS]
            fixed_s = c[PREFILL_ATTN_LATENCY] * has_prefill
            extra_s = c[PREFILL_ATTN_HALF] * group_pre * c[PREFILL_ATTN_FLOPS] / class_peak  # the ramp over short prompts
        elif k == 3:
            ctx = decode_context_tokens * micro / groups
            class_flops, class_bytes, class_peak = ctx * c[DECODE_FLOPS], ctx * c[DECODE_BYTES], peak * c[DECODE_ATTN_EFF]
            bandwidth = c[KV_BPS]
            group_decode = decode_seqs * micro / groups
            fixed_s = c[DECODE_ATTN_S_PER_SEQ] * group_decode + c[DECODE_ATTN_LATENCY] * (1.0 if group_decode > 0 else 0.0)
        else:  # one row per sequence (the last prompt token, or the decoded token)
            class_flops, class_bytes = 2 * n_seq * c[LM_HEAD] / layers, c[LM_HEAD] * c[WEIGHT_BPE] / layers
            class_peak = gemm_peak * _gemm_efficiency(c, max(n_seq, 1.0))
        tc = layers * class_flops / class_peak + layers * (fixed_s + extra_s)
        tm = layers * class_bytes / bandwidth + layers * fixed_s
        compute_s = compute_s + tc * (tc > tm)
        memory_s = memory_s + tm * (tc <= tm)
        flops = flops + layers * class_flops
        nbytes = nbytes + layers * class_bytes
    network_s = 2 * layers * (a_tok * c[COLL_S_PER_TOKEN] * knee + c[COLL_LATENCY])
    if c[DIVIDES] > 0:  # expert all-to-alls (the busiest group sends) and pipeline hops
        network_s = (network_s + layers * (n_tok * c[A2A_S_PER_TOKEN] * c[DP] / groups + c[A2A_LATENCY])
                     + n_tok * c[HOP_S_PER_TOKEN] + c[HOP_LATENCY])
    gpu_s = compute_s + memory_s + network_s + c[GPU_LAUNCH]
    overhead_s = (
        c[DECODE_OVERHEAD] + (c[PREFILL_OVERHEAD] - c[DECODE_OVERHEAD]) * has_prefill
        + c[SEQ_OVERHEAD] * n_seq / micro
        + c[PREFILL_SEQ_OVERHEAD] * prefill_seqs / groups
        + c[GPU_LAUNCH] * stages
        + max(c[HOST_LAUNCH] - gpu_s, 0.0) * stages
    )
    compute_s = compute_s * (1.0 + (c[CLOCK_SLOWDOWN] - 1.0) * has_prefill)
    capped = 1.0 + (c[CAPPED_SLOWDOWN] - 1.0) * has_prefill
    memory_s, network_s = memory_s * capped, network_s * capped
    return compute_s * stages, memory_s * stages, network_s * stages, overhead_s, flops / micro, nbytes / micro


@jit
def pass_time_s(c, prefill_seqs, prefill_tokens, prefill_sq_tokens, decode_seqs, decode_context_tokens):
    """Seconds of one pass (the sum of `pass_terms`' four times)."""
    compute_s, memory_s, network_s, overhead_s, _, _ = pass_terms(c, prefill_seqs, prefill_tokens, prefill_sq_tokens,
                                                                  decode_seqs, decode_context_tokens)
    return compute_s + memory_s + network_s + overhead_s


@jit
def pass_terms_array(c, prefill_seqs, prefill_tokens, prefill_sq_tokens, decode_seqs, decode_context_tokens):
    """`pass_terms` of each element of five float64 arrays of one length: a (6, n) array."""
    out = np.empty((6, len(prefill_seqs)))
    for i in range(len(prefill_seqs)):
        terms = pass_terms(c, prefill_seqs[i], prefill_tokens[i], prefill_sq_tokens[i], decode_seqs[i],
                           decode_context_tokens[i])
        for k in range(6):
            out[k, i] = terms[k]
    return out


@jit
def pass_shares_array(c, prefill_seqs, decode_seqs, has_prefill):
    """`pass_shares` of each element of two float64 arrays of one length: a (2, n) array."""
    out = np.empty((2, len(decode_seqs)))
    for i in range(len(decode_seqs)):
        out[0, i], out[1, i] = pass_shares(c, prefill_seqs[i], decode_seqs[i], has_prefill)
    return out
