"""Analytic (roofline) latency of one forward pass on one model instance.

An instance is a model at tensor-parallel degree `tp` on `tp` GPUs of one machine.
Per layer and per operator class (dense GEMMs, MoE experts, attention, LM head):

    time = max(flops / (peak * efficiency), bytes / (bandwidth * memory_efficiency))

plus two ring all-reduces per layer over the intra-node link
(`2 (t-1)/t * bytes / (link * link_efficiency) + collective_latency`), a GPU launch cost per kernel,
and the engine's per-iteration and per-sequence overheads. An eager engine issues
kernels from the host: the GPU work overlaps the host's launch time
(`host_launch_s_per_layer * layers`), so the pass takes the larger of the two.

Modelling assumptions (units: seconds, FLOPs and bytes per GPU):
- FLOPs and weight bytes divide evenly by `tp`; KV heads are replicated when
  `tp` exceeds them (GQA), which costs memory and bandwidth.
- Prefill attention is causal: 2 x T^2 x q_dim FLOPs per layer per prompt (QK^T
  and PV, halved), at `attention_efficiency` of peak (flash-style kernels reach
  more than 2023-era ones). An engine with `prefill_attention: packed` attends
  over the whole packed batch, (sum T)^2.
- Small GEMMs (decode) lose efficiency: eff(M) = eff * M / (M + gemm_half_tokens).
- An engine with a knee (`knee_tokens`, `knee_slowdown`) moves the all-reduce
  traffic of tokens beyond the knee in one pass (1 + knee_slowdown) times slower:
  the 2023 vLLM measurements slow down past about 2k tokens per pass, the more the
  larger the TP degree, which is where all-reduces weigh most.
- MoE: FLOPs for the k experts each token uses; bytes for the experts the batch
  touches, E (1 - (1 - k/E)^tokens); shared experts and the first dense layers of
  DeepSeek-style models count as dense GEMMs.
- MLA (multi-head latent attention): the KV cache is the compressed latent plus the
  shared RoPE key per token and layer, whole on every GPU of the instance (not split by
  heads). Prefill attends per head over the decompressed keys and values; decode attends
  over the latent itself (the up-projections absorbed), reading it once per step.
- Power-limited clocks: the compute-bound time of a pass that holds prefill work
  runs at the machine's `prefill_clock_fraction` of the datasheet-peak clock (the
  GPU's sustained clock under dense work, lowered by a power cap as the cube root
  of the dynamic power left; Splitwise's capped H100 comes out 1.31x slower, it
  measured about 1.3x). Decode draws well under the limit (137-300 W of 700 W on
  H200, arXiv 2605.11999) and keeps its bandwidth roofline.
- Mixed batches (prefill and decode in one iteration) are the same formula with
  both kinds of attention: the co-located baseline needs nothing else.

All functions are pure and accept numpy arrays, so the capacity search and the
simulator can evaluate thousands of passes at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from types import SimpleNamespace
from typing import ClassVar

import numpy as np

from splitplan.specs.engine import EngineFactors, EngineProfile
from splitplan.specs.hardware import HardwareSpec
from splitplan.specs.model import ModelSpec

BOUNDS = ("compute", "memory", "network", "overhead")


def _num(x):
    """Python numbers stay floats (fast scalar path); anything else becomes a float array."""
    return float(x) if isinstance(x, (int, float)) else np.asarray(x, float)


def _max(a, b):
    return max(a, b) if isinstance(a, float) and isinstance(b, float) else np.maximum(a, b)


@dataclass(frozen=True)
class Latency:
    """A predicted latency and what bound it. Breakdown terms sum to `time_s`."""

    time_s: float
    bound: str
    compute_s: float
    memory_s: float
    network_s: float
    overhead_s: float
    flops_per_gpu: float
    bytes_per_gpu: float


@dataclass(frozen=True)
class Fit:
    """Whether a model fits an instance, and the KV room left if it does."""

    fits: bool
    reason: str
    weights_bytes_per_gpu: float
    kv_capacity_tokens: int


class PassShortcuts:
    """Single-prompt prefill and uniform decode steps, in terms of `pass_time_s`
    (shared by the analytic and the measured instance)."""

    def prefill_time_s(self, prompt_tokens):
        """One prompt per element of `prompt_tokens`, each prefilled alone."""
        tokens = np.asarray(prompt_tokens, float)
        return self.pass_time_s(1, tokens, tokens**2)

    def decode_step_time_s(self, batch, context_tokens_per_request):
        """One decode iteration of `batch` requests each holding that many context tokens."""
        b = np.asarray(batch, float)
        return self.pass_time_s(decode_seqs=b, decode_context_tokens=b * np.asarray(context_tokens_per_request, float))


@dataclass(frozen=True)
class Instance(PassShortcuts):
    """One model instance: (model, machine type, TP degree) under an engine profile."""

    model: ModelSpec
    hardware: HardwareSpec
    engine: EngineProfile
    tp: int
    measured: ClassVar[bool] = False  # perf.model.PerfModel: analytic timing, nothing to count

    def record_decode_steps(self, batch, context_total) -> None:
        """Nothing to count: every step is computed (PerfModel)."""

    @cached_property
    def factors(self) -> EngineFactors:
        return self.engine.factors(self.hardware.name, self.tp, self.model.name)

    @property
    def instances_per_machine(self) -> int:
        return self.hardware.gpus_per_machine // self.tp

    # --- memory ---------------------------------------------------------------
    @cached_property
    def kv_heads_per_gpu(self) -> int:
        return math.ceil(self.model.kv_heads / self.tp)

    @cached_property
    def kv_bytes_per_token(self) -> float:
        """KV bytes one token occupies on this instance (all GPUs, replication included). MLA's
        latent is not split by heads: every GPU of the instance holds all of it."""
        m = self.model
        per_gpu = m.kv_cache_elements_per_layer if m.is_mla else 2 * self.kv_heads_per_gpu * m.head_dim_eff
        return m.num_hidden_layers * per_gpu * self.tp * self.engine.kv_bytes_per_element

    @cached_property
    def fit(self) -> Fit:
        hw, eng = self.hardware, self.engine
        weights = self.model.total_params * eng.weight_bytes_per_element / self.tp
        usable = hw.memory_bytes_per_gpu * eng.memory_usable_fraction - eng.activation_reserve_gb_per_gpu * 1e9
        room = usable - weights
        if not hw.has_tensor_cores(eng.weights):
            return Fit(False, f"{hw.name} has no {eng.weights} tensor cores; give --weights fp8 or bf16", weights, 0)
        if self.tp > hw.gpus_per_machine or hw.gpus_per_machine % self.tp:
            return Fit(False, f"TP {self.tp} does not divide the {hw.gpus_per_machine} GPUs of {hw.name}", weights, 0)
        if self.model.num_attention_heads % self.tp:
            return Fit(False, f"TP {self.tp} does not divide {self.model.num_attention_heads} attention heads", weights, 0)
        tokens = int(room * self.tp // self.kv_bytes_per_token) if room > 0 else 0
        if tokens < 1:
            return Fit(
                False,
                f"{self.model.name} weights need {weights / 1e9:.1f} GB per GPU at TP {self.tp}, "
                f"{hw.name} has {usable / 1e9:.1f} GB usable per GPU",
                weights,
                0,
            )
        return Fit(True, "", weights, tokens)

    # --- one forward pass -------------------------------------------------------
    @cached_property
    def _c(self) -> SimpleNamespace:
        """Per-instance constants of the pass formula (per GPU), computed once."""
        m, hw, f, t = self.model, self.hardware, self.factors, self.tp
        bpe, wbpe, kvbpe = self.engine.bytes_per_element, self.engine.weight_bytes_per_element, self.engine.kv_bytes_per_element
        # per layer on average: attention, dense FFNs (dense layers) and shared experts (MoE layers)
        dense_params = m.attn_params_per_layer + (m.dense_layers * m.dense_ffn_params
                                                  + m.moe_layers * m.n_shared_experts * m.expert_params) / m.num_hidden_layers
        kv_dim_gpu = m.kv_dim / t if m.is_mla else self.kv_heads_per_gpu * m.head_dim_eff
        heads_gpu = m.num_attention_heads / t
        if m.is_mla:  # prefill expands the latent per head; decode attends over the latent itself (absorbed)
            prefill_attn_flops = heads_gpu * (m.qk_head_dim + m.v_head_dim_eff)
            decode_flops = 2 * heads_gpu * (m.kv_cache_elements_per_layer + m.kv_lora_rank)
            decode_bytes = m.kv_cache_elements_per_layer * kvbpe
        else:
            prefill_attn_flops, decode_flops, decode_bytes = 2 * m.q_dim / t, 4 * m.q_dim / t, 2 * kv_dim_gpu * kvbpe
        return SimpleNamespace(
            L=m.num_hidden_layers, bpe=bpe, wbpe=wbpe, peak=hw.peak_flops_per_s(self.engine.dtype),
            gemm_peak=hw.peak_flops_per_s(self.engine.weights),
            bw=hw.memory_bytes_per_s * f.memory_efficiency, eff=f.compute_efficiency, half=f.gemm_half_tokens,
            dense_flops=2 * dense_params / t, dense_bytes=dense_params * wbpe / t,
            act_bytes=bpe * (4 * m.hidden_size + (2 * m.q_dim + 2 * m.kv_dim + (m.ffn_matrices + 1) * m.intermediate_size) / t),
            q_dim_gpu=m.q_dim / t, kv_dim_gpu=kv_dim_gpu, prefill_attn_flops=prefill_attn_flops,
            decode_flops_per_ctx=decode_flops, decode_bytes_per_ctx=decode_bytes,
            moe_share=m.moe_layers / m.num_hidden_layers,
            head_params=m.vocab_size * m.hidden_size / t,
            collective_s_per_token=(2 * (t - 1) / t * m.hidden_size * 2 / (hw.intra_node_bytes_per_s * f.link_efficiency)) if t > 1 else 0.0,
            collective_latency_s=f.collective_latency_s if t > 1 else 0.0,
            launch_s=m.num_hidden_layers * self.engine.kernels_per_layer * f.kernel_launch_s,
            host_s=f.host_launch_s_per_layer * m.num_hidden_layers,
            packed=self.engine.prefill_attention == "packed",
            clock_slowdown=1.0 / hw.prefill_clock_fraction,
        )

    def _terms(self, prefill_seqs, prefill_tokens, prefill_sq_tokens, decode_seqs, decode_context_tokens):
        """Time terms of one pass (floats or arrays): compute-bound, memory-bound,
        network, overhead, plus FLOPs and bytes per GPU. Plain arithmetic (no
        np.where) keeps Python floats as floats: the prompt-queue replay calls this
        once per batch."""
        m, f, c = self.model, self.factors, self._c
        L, peak = c.L, c.peak
        pre_tok = _num(prefill_tokens)
        n_tok = pre_tok + _num(decode_seqs)
        n_seq = _num(prefill_seqs) + _num(decode_seqs)
        has_prefill = pre_tok > 0

        def gemm_eff(rows):
            return c.eff * rows / (rows + c.half)

        safe_tok = _max(n_tok, 1.0)
        knee = 1.0 + f.knee_slowdown * _max(safe_tok - f.knee_tokens, 0.0) / safe_tok if f.knee_slowdown else 1.0  # all-reduces
        gemm_peak = c.gemm_peak  # weight GEMMs run at the weights' precision, attention at the activations'
        classes = [(n_tok * c.dense_flops, c.dense_bytes + n_tok * c.act_bytes, gemm_peak * gemm_eff(safe_tok))]
        if m.is_moe:
            E, k = m.num_local_experts, m.num_experts_per_tok
            touched = E * (1 - (1 - k / E) ** n_tok)
            rows = _max(n_tok * k / _max(touched, 1e-9), 1.0)
            share = c.moe_share / self.tp  # (routed experts in MoE layers only, on average per layer)
            classes.append((2 * n_tok * k * m.expert_params * share, touched * m.expert_params * c.wbpe * share,
                            gemm_peak * gemm_eff(rows)))
        pre_sq = pre_tok**2 if c.packed else _num(prefill_sq_tokens)
        ctx = _num(decode_context_tokens)
        classes.append((pre_sq * c.prefill_attn_flops, pre_tok * (2 * c.q_dim_gpu + 2 * c.kv_dim_gpu) * c.bpe, peak * f.attention_efficiency))
        classes.append((ctx * c.decode_flops_per_ctx, ctx * c.decode_bytes_per_ctx, peak * c.eff))
        # LM head: one row per sequence (the last prompt token, or the decoded token).
        classes.append((2 * n_seq * c.head_params / L, c.head_params * c.wbpe / L, gemm_peak * gemm_eff(_max(n_seq, 1.0))))

        compute_s = memory_s = flops = nbytes = 0.0
        for c_flops, c_bytes, c_peak in classes:
            tc = L * c_flops / c_peak
            tm = L * c_bytes / c.bw
            compute_s = compute_s + tc * (tc > tm)
            memory_s = memory_s + tm * (tc <= tm)
            flops = flops + L * c_flops
            nbytes = nbytes + L * c_bytes
        network_s = 2 * L * (n_tok * c.collective_s_per_token * knee + c.collective_latency_s)
        gpu_s = compute_s + memory_s + network_s + c.launch_s
        overhead_s = (
            f.decode_overhead_s + (f.prefill_overhead_s - f.decode_overhead_s) * has_prefill
            + f.sequence_overhead_s * n_seq
            + f.prefill_sequence_overhead_s * _num(prefill_seqs)
            + c.launch_s
            + _max(c.host_s - gpu_s, 0.0)  # waiting on the host's kernel launches
        )
        compute_s = compute_s * (1.0 + (c.clock_slowdown - 1.0) * has_prefill)
        return compute_s, memory_s, network_s, overhead_s, flops, nbytes

    def pass_time_s(self, prefill_seqs=0, prefill_tokens=0, prefill_sq_tokens=0, decode_seqs=0, decode_context_tokens=0):
        """Seconds for one forward pass (vectorized over numpy arrays)."""
        c, mem, net, ovh, _, _ = self._terms(prefill_seqs, prefill_tokens, prefill_sq_tokens, decode_seqs, decode_context_tokens)
        return c + mem + net + ovh

    def decode_line(self, batch: int) -> tuple[float, float, float]:
        """A decode step of `batch` requests as a function of their summed context C:
        `base + C * per_token + max(slack - C * per_token, 0)` seconds, exactly
        `pass_time_s(decode_seqs=batch, decode_context_tokens=C)` (the context enters
        only through decode attention, linear in C, and through the host-launch wait).
        The simulator evaluates one step per iteration with this."""
        c = self._c
        compute_s, memory_s, network_s, overhead_s, _, _ = self._terms(0.0, 0.0, 0.0, float(batch), 0.0)
        gpu_s = compute_s + memory_s + network_s + c.launch_s
        wait_s = max(c.host_s - gpu_s, 0.0)
        per_token = c.L * max(c.decode_flops_per_ctx / (c.peak * c.eff), c.decode_bytes_per_ctx / c.bw)
        return compute_s + memory_s + network_s + overhead_s - wait_s, per_token, c.host_s - gpu_s

    def explain(self, prompt_tokens: list[int] | None = None, decode_batch: int = 0, decode_context_tokens: int = 0) -> Latency:
        """A scalar pass with its breakdown: a batch of prompts, or a decode batch, or both."""
        prompts = np.asarray(prompt_tokens or [], float)
        terms = self._terms(len(prompts), prompts.sum(), (prompts**2).sum(), decode_batch, decode_batch * decode_context_tokens)
        c, mem, net, ovh, flops, nbytes = (float(x) for x in terms)
        parts = dict(zip(BOUNDS, (c, mem, net, ovh)))
        return Latency(c + mem + net + ovh, max(parts, key=parts.get), c, mem, net, ovh, flops, nbytes)


def kv_transfer_time_s(src: Instance, dst: Instance, prompt_tokens, prefill_s=None):
    """Seconds of KV transfer the request sees between a prompt and a token instance.

    Bandwidth is the smaller of the two instances' shares of their machines'
    scale-out NICs. Prompts shorter than the engine's `layerwise_transfer_min_tokens`
    are sent after the prefill (serialized: all bytes exposed); longer ones layer by
    layer during the prefill, leaving the last layer's share exposed (or more, when
    the network is slower than the prefill produces KV). The engine's
    `kv_transfer_latency_s` is added either way.
    """
    tokens = np.asarray(prompt_tokens, float)
    bw = min(
        src.hardware.scale_out_bytes_per_s * src.tp / src.hardware.gpus_per_machine,
        dst.hardware.scale_out_bytes_per_s * dst.tp / dst.hardware.gpus_per_machine,
    )
    total_s = tokens * src.model.kv_bytes_per_token(src.engine.kv_bytes_per_element) / bw
    layers = src.model.num_hidden_layers
    prefill = src.prefill_time_s(tokens) if prefill_s is None else np.asarray(prefill_s, float)
    layerwise_s = np.maximum(total_s / layers, total_s - prefill * (layers - 1) / layers)
    exposed = np.where(tokens < src.engine.layerwise_transfer_min_tokens, total_s, layerwise_s)
    return exposed + src.factors.kv_transfer_latency_s
