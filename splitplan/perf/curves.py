"""Operator times from measured kernel curves: one closed form per operator class, whose
parameters a GPU's hardware spec carries per serving engine and precision (`specs.hardware.KernelCurves`),
fitted to NVIDIA's measured kernel tables by `bench/fit_kernels.py`.

These are the forms the fit fits and `bench/kernels.py` checks, one kernel at a time; the pass
formula (`splitplan_core.pass_terms`) evaluates the same terms summed over a layer's operators
(`perf.roofline.Instance.constants` turns a curve into the pass vector's entries). Peaks and
bandwidths are the datasheet's (`peak_flops_per_s` at the datasheet clock); the measured kernels ran
in short bursts, so the pass formula still slows a prefill pass's compute to the GPU's sustained
clock. Every function takes floats or NumPy arrays.

- GEMM (m x k by k x n): the larger of 2 m n k FLOPs at the peak times `efficiency` ramped by each
  dimension, m / (m + half_tokens) n / (n + half_n) k / (k + half_k) (small matrices fill fewer of
  the GPU's tiles and pipeline stages), plus the activation passes the kernels around it add
  (`input_passes` reads of the m x k input, `output_passes` of the m x n output, as 2-byte
  elements at the datasheet bandwidth: fp8's per-token quantization, the epilogue), and the
  weights and activations read at `memory_efficiency` of the bandwidth; plus `latency_s`.
- Context attention (b prompts of p tokens, H query heads of d over H_kv KV heads): 2 H d b p
  (p + half_tokens) (1 + `kv_head_cost` H_kv / H) FLOPs at `efficiency` of the bf16 peak (causal
  QK^T and PV, halved, with an efficiency that ramps with the prompt, p / (p + half_tokens), quoted
  against the bf16 peak whatever the kernel attends in (most attend in bf16 over any cache; SGLang's
  trtllm_mha and fa3 prefill attend an fp8 cache in fp8); the kernels load K and V once per
  head group, so a head of a narrow group costs more than one of a wide group), `efficiency` being
  that of heads of 128 dims, ramped by the head dim, d / (d + half_dim), relative to 128's
  (`head_dim_share`; fitted where a table times both 64- and 128-dim heads), slowed while its
  query tiles do not fill the GPU's SMs: by (tiles + `half_tiles`) / tiles, tiles = b H (p /
  TILE_TOKENS + 1/2), a prompt's rows cut into tiles of 128 (a pass of prompts of many lengths counts
  its tokens and prompts the same way); plus b H `s_per_head` and b H_kv `s_per_kv_head` (the work
  each prompt's query heads and head groups start whatever their length: at 16-token prompts the
  kernels take about 20 ns per prompt and query head) and `latency_s`.
- Generation attention (b sequences over c tokens of context each, H query and H_kv KV heads):
  the larger of 2 H_kv d b c KV elements read at `memory_efficiency` of the bandwidth and 4 H d b c
  FLOPs at `efficiency` of the bf16 peak, plus b (`s_per_sequence` + H_kv `s_per_kv_head`) and
  `latency_s`, H_kv in that term at most `max_kv_heads`, the most the fitted table measured (NVIDIA's
  tables stop at 8 a GPU: a per-head cost fitted there is not extrapolated to a 32-head MHA model,
  `kv_heads_timed`).
- MLA generation attention (DeepSeek's absorbed decode: b sequences over c tokens of context, H
  query heads over one latent of L elements, a rank-R part of it the values): the larger of L b c
  KV elements read at `memory_efficiency` of the bandwidth, slowed while few sequences share the
  GPU by (b + `half_sequences`) / b (the kernels split a sequence's context over too few thread
  blocks to fill the SMs: in NVIDIA's Blackwell tables one sequence's 131,072 tokens take 1.2-2.1x
  the time per token of 64 sequences' 2,048; A100's kernel splits none), and 2 H (L + R) b c
  FLOPs at `efficiency` of the peak of the cache's precision (an fp8 cache is attended in fp8:
  TensorRT-LLM's B200 kernel decodes 128 heads over an fp8 latent faster than the bf16 peak
  allows), plus b (`s_per_sequence` + H `s_per_head`) (each query head's latent query and output)
  and `latency_s` (a generation-attention curve whose `s_per_kv_head` is 0: one latent per token).
  In the generation-attention form `half_sequences` and `s_per_head` are 0 (not fitted).
- All-reduce among g GPUs of S bytes (per GPU count measured): the faster of `latency_s` + S /
  `bytes_per_s` and `large_latency_s` + S / `large_bytes_per_s` (the engines switch algorithms as
  messages grow: one-shot for small ones, two-shot or NCCL's for large ones).
- Routed experts (one fused MoE layer on one GPU of an `ep` x `tp` expert layout: T tokens enter,
  each routed to k of E experts; the GPU holds E / ep of them, each a 1/tp slice of its
  `matrices` hidden x inter matrices): its R = T k / ep rows over the U = E / ep (1 - (1 - k/E)^T)
  experts they touch, 2 R matrices hidden inter / tp FLOPs at the weights' peak times
  `efficiency` ramped by the rows per touched expert, r / (r + half_rows), plus the activation
  traffic of the routing (`row_passes` 2-byte reads of each routed row, `token_passes` of each
  token's k copies, whichever GPU computes them: the permutes, the padding a grouped kernel
  walks), or the touched experts' weights read at `memory_efficiency` of the bandwidth, whichever
  is slower; plus `latency_s` and `s_per_expert` for each of the E / ep experts the GPU holds,
  touched or not (the grouped kernels' work per expert: TensorRT-LLM's fp8 kernels take about
  0.25 us each, so a few tokens over 256 experts take some 60 us more at EP 1 than at EP 8).
  NVIDIA's tables route as its collector does by default (read 2026-12): each expert's load drawn
  from a power law (`ROUTING_ALPHA`; between 1 and 0.8 T tokens where T k > E, else between 0.01
  and 2), scaled to T k in all, the busiest expert group timed. So
  the GPU is the busiest of ep groups of E / ep experts: `busiest_load` times the mean group's rows
  (from the power law's moments: the group's sum, mean plus the expected largest of ep normal
  deviates; at most all its experts' rows), its experts each seeing that many more tokens. The
  collector narrows its draw where T k passes E; serving keeps the busiest group at least the rows it
  had there, so more tokens never take less time (`busiest_load`; `table_load` is the tables' own).
- Expert all-to-all (dispatch and combine of T tokens a GPU holds, each routed to k of the
  experts spread over g GPUs), per kernel family: `latency_s` plus T copies x (`s_per_copy` +
  hidden x 2 bytes / `bytes_per_s`), where DeepEP's low-latency kernels send a copy per routed
  expert (k) and its high-throughput ones a copy per destination GPU (g (1 - (1 - 1/g)^k) of
  them: the GPUs k uniformly routed experts fall on). The engines run the low-latency kernels for
  decode batches and the high-throughput ones for prefill (SGLang's `--deepep-mode auto`).
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

ACTIVATION_BYTES = 2.0  # activations between kernels and all-reduced are bf16, whatever the weights
# NVIDIA aiconfigurator's default expert routing in its MoE tables: power-law loads of this exponent
# (its collector's `_generate_power_law_distribution`, read 2026-12; aiconfigurator-core 0.12.0's tables)
ROUTING_ALPHA = 1.01


def gemm_s(curve, peak_flops_per_s: float, memory_bytes_per_s: float, m, n, k, weight_bytes_per_element: float):
    """Seconds of GEMMs (m, n, k) with `curve` (a `GemmCurve`) on a GPU of the given peak and bandwidth."""
    ramp = m / (m + curve.half_tokens) * shape_efficiency(curve, n, k)
    compute = (2 * m * n * k / (peak_flops_per_s * curve.efficiency * ramp)
               + (curve.input_passes * m * k + curve.output_passes * m * n) * ACTIVATION_BYTES / memory_bytes_per_s)
    moved = n * k * weight_bytes_per_element + m * (n + k) * ACTIVATION_BYTES
    return np.maximum(compute, moved / (memory_bytes_per_s * curve.memory_efficiency)) + curve.latency_s


def layer_gemms(model, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """The (n, k) of a transformer layer's GEMMs on one GPU of a `tp`-way layout: the QKV and O
    projections, the FFN's gate-and-up (fused) and down."""
    shapes = np.array([((model.q_dim + 2 * model.kv_dim) / tp, model.hidden_size), (model.hidden_size, model.q_dim / tp),
                       ((model.ffn_matrices - 1) * model.intermediate_size / tp, model.hidden_size),
                       (model.hidden_size, model.intermediate_size / tp)])
    return shapes[:, 0], shapes[:, 1]


def shape_efficiency(curve, n, k):
    """The share of a GEMM curve's efficiency an n x k weight reaches."""
    return n / (n + curve.half_n) * k / (k + curve.half_k)


REFERENCE_HEAD_DIM = 128.0  # the head dim a context curve's `efficiency` is quoted at


def head_dim_share(curve, head_dim):
    """The share of a context curve's efficiency heads of `head_dim` dims reach: 1 at 128 dims, more
    for wider heads (never past the peak)."""
    share = head_dim / (head_dim + curve.half_dim) * (REFERENCE_HEAD_DIM + curve.half_dim) / REFERENCE_HEAD_DIM
    return np.minimum(share, 1.0 / curve.efficiency)


TILE_TOKENS = 128.0  # the query rows a prefill attention kernel's thread block takes (FlashAttention's tile)


def context_attention_s(curve, bf16_flops_per_s: float, batch, prompt_tokens, heads, kv_heads, head_dim):
    """Seconds of causal attention over `batch` prompts of `prompt_tokens` each."""
    flops = 2 * heads * head_dim * batch * prompt_tokens * (prompt_tokens + curve.half_tokens)
    tiles = heads * batch * (prompt_tokens / TILE_TOKENS + 0.5)
    return (flops / (bf16_flops_per_s * context_efficiency(curve, heads, kv_heads, head_dim)) * (1 + curve.half_tiles / tiles)
            + batch * (heads * curve.s_per_head + kv_heads * curve.s_per_kv_head) + curve.latency_s)


def context_efficiency(curve, heads, kv_heads, head_dim):
    """A context curve's share of the bf16 peak for H query heads of `head_dim` over H_kv KV heads."""
    return curve.efficiency * head_dim_share(curve, head_dim) / (1 + curve.kv_head_cost * kv_heads / heads)


def kv_heads_timed(curve, kv_heads):
    """The KV heads a generation curve's per-KV-head term counts: at most the most its table
    measured (`max_kv_heads`; a fit's trial curve, without one, all of them)."""
    bound = getattr(curve, "max_kv_heads", None)
    return kv_heads if bound is None else np.minimum(kv_heads, bound)


def decode_attention_s(curve, peak_flops_per_s: float, memory_bytes_per_s: float, batch, kv_bytes, flops, per_sequence_s):
    """Seconds of one decode step's attention over `kv_bytes` of cache with `flops` of work for `batch`
    sequences (`per_sequence_s` each): the two decode forms' one rule."""
    read_s = kv_bytes / (memory_bytes_per_s * curve.memory_efficiency) * (batch + curve.half_sequences) / np.maximum(batch, 1e-9)
    return np.maximum(read_s, flops / (peak_flops_per_s * curve.efficiency)) + batch * per_sequence_s + curve.latency_s


def generation_attention_s(curve, bf16_flops_per_s: float, memory_bytes_per_s: float, batch, context_tokens, heads,
                           kv_heads, head_dim, kv_bytes_per_element: float):
    """Seconds of one decode step's attention for `batch` sequences of `context_tokens` each."""
    return decode_attention_s(curve, bf16_flops_per_s, memory_bytes_per_s, batch,
                              2 * kv_heads * head_dim * batch * context_tokens * kv_bytes_per_element,
                              4 * heads * head_dim * batch * context_tokens,
                              curve.s_per_sequence + kv_heads_timed(curve, kv_heads) * curve.s_per_kv_head + heads * curve.s_per_head)


def mla_generation_s(curve, cache_flops_per_s: float, memory_bytes_per_s: float, batch, context_tokens, heads,
                     latent: float, rank: float, kv_bytes_per_element: float):
    """Seconds of one decode step's MLA attention for `batch` sequences of `context_tokens` each
    (`cache_flops_per_s`: the peak of the cache's precision)."""
    return decode_attention_s(curve, cache_flops_per_s, memory_bytes_per_s, batch,
                              latent * batch * context_tokens * kv_bytes_per_element,
                              2 * heads * (latent + rank) * batch * context_tokens,
                              curve.s_per_sequence + heads * curve.s_per_head)


def all_reduce_s(curve, message_bytes):
    """Seconds of an all-reduce of `message_bytes` among the curve's GPUs (`curve` an `AllReduceCurve`)."""
    (small_s, small_bytes_per_s), (large_s, large_bytes_per_s) = all_reduce_lines(curve)
    return np.minimum(small_s + message_bytes / small_bytes_per_s, large_s + message_bytes / large_bytes_per_s)


def all_reduce_lines(curve) -> tuple[tuple[float, float], tuple[float, float]]:
    """(latency_s, bytes_per_s) of the small- and the large-message algorithm (the small one's twice
    where the curve has one)."""
    small = (curve.latency_s, curve.bytes_per_s)
    return small, small if curve.large_latency_s is None else (curve.large_latency_s, curve.large_bytes_per_s)


def load_spread(experts, ep):
    """How far the busiest of `ep` expert groups lies above the mean group, in the power-law
    loads' coefficients of variation: the expected largest of ep standard normal deviates (Blom's
    approximation) times the group sum's share of the spread, sqrt((1 - 1/ep) / (E / ep)) (its E / ep
    loads, drawn from a whole that sums to T k). 0 for one group."""
    ep = np.asarray(ep, float)
    groups, index = np.unique(ep, return_inverse=True)
    z = np.array([NormalDist().inv_cdf((g - 0.375) / (g + 0.25)) if g > 1 else 0.0 for g in groups])[index].reshape(ep.shape)
    return z * np.sqrt((1 - 1 / ep) * ep / experts)


def load_cap(experts, top_k, ep):
    """The busiest group's load at most: all rows of its E / ep experts (a token takes each expert once)."""
    return np.minimum(top_k, experts / ep) * ep / top_k


def table_load(tokens, experts, top_k, ep, alpha: float = ROUTING_ALPHA):
    """The rows the busiest of `ep` expert groups gets over the mean group's (T k / ep), routed by the
    power law of NVIDIA's tables: what their measurements saw (bench/fit_kernels.py fits to it)."""
    many = tokens * top_k > experts  # (the collector draws loads between 1 and 0.8 T, else between 0.01 and 2)
    lo = np.where(many, 1.0, 0.01)
    hi = np.maximum(np.where(many, 0.8 * tokens, 2.0), lo)
    # the loads' integrals of x^(n-1) x^-alpha, n = 1, 2, 3: their sum, mean and second moment unnormalized
    scale, first, second = ((hi ** (n - alpha) - lo ** (n - alpha)) / (n - alpha) for n in (1.0, 2.0, 3.0))
    variation = np.sqrt(np.maximum(second * scale / np.maximum(first * first, 1e-300) - 1, 0.0))
    return np.minimum(1 + load_spread(experts, ep) * variation, load_cap(experts, top_k, ep))


def busiest_load(tokens, experts, top_k, ep):
    """`table_load` in serving (`moe_s`; the compiled pass formula computes the same, _busiest_load):
    the tables' routing narrows its spread where T k passes E, so past there the busiest group keeps
    at least the rows it had at T k = E (more tokens never lighten it)."""
    switch = experts / top_k
    load = table_load(tokens, experts, top_k, ep)
    return np.where(tokens > switch, np.maximum(load, table_load(switch, experts, top_k, ep) * switch / np.maximum(tokens, 1.0)),
                    load)


def moe_s(curve, peak_flops_per_s: float, memory_bytes_per_s: float, tokens, hidden, inter, experts, top_k, tp, ep,
          weight_bytes_per_element: float, matrices: float = 3.0, load=None):
    """Seconds of one fused MoE layer's routed experts on the busiest GPU (`curve` a `MoeCurve`;
    `load`: its group's rows over the mean group's, `busiest_load` unless given)."""
    load = busiest_load(tokens, experts, top_k, ep) if load is None else load
    rows = tokens * top_k / ep * load
    touched = experts / ep * (1 - (1 - top_k / experts) ** (tokens * load))
    per_expert = np.maximum(rows / np.maximum(touched, 1e-9), 1.0)
    params = matrices * hidden * inter / tp
    compute = (2 * rows * params / (peak_flops_per_s * curve.efficiency * per_expert / (per_expert + curve.half_rows))
               + (rows * curve.row_passes + tokens * top_k * curve.token_passes) * hidden * ACTIVATION_BYTES / memory_bytes_per_s)
    moved = touched * params * weight_bytes_per_element
    return np.maximum(compute, moved / (memory_bytes_per_s * curve.memory_efficiency)) + moe_fixed_s(curve, experts, ep)


def moe_fixed_s(curve, experts, ep):
    """The seconds an MoE layer's routed experts take whatever their rows: `latency_s` and
    `s_per_expert` for each of the E / ep experts the GPU holds."""
    return curve.latency_s + curve.s_per_expert * experts / ep


def all_to_all_copies(top_k, gpus: int, low_latency: bool):
    """The copies of a token an all-to-all among `gpus` GPUs sends: one per routed expert
    (low-latency kernels), or one per GPU its `top_k` experts fall on (high-throughput)."""
    return top_k if low_latency else gpus * (1 - (1 - 1 / gpus) ** top_k)


def all_to_all_s(line, tokens, hidden, top_k, gpus: int, low_latency: bool):
    """Seconds of one dispatch and combine of `tokens` tokens a GPU holds (`line` an `AllToAllLine`)."""
    copies = all_to_all_copies(top_k, gpus, low_latency)
    return line.latency_s + tokens * copies * (line.s_per_copy + hidden * ACTIVATION_BYTES / line.bytes_per_s)
