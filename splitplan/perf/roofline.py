"""Analytic (roofline) latency of one forward pass on one model instance.

An instance is a model in a parallel layout (TP, data-parallel attention, EP, PP) on its GPUs,
of one machine or several.
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
- Sliding-window layers (gpt-oss) are planned as full attention: their KV, prefill and decode
  attention are upper bounds (the window caps what they keep at `sliding_window` tokens;
  `ModelSpec.kv_bytes_per_request` counts it), so a plan errs large, not small.
- Layouts (specs.layout): routed experts spread over a stage's TP x DP GPUs, the rest split by
  TP and replicated over DP groups, all over PP stages. Attention and dense FFNs see their DP
  group's share of the batch (the busiest group's when it has fewer requests than groups); MoE
  layers with EP or DP dispatch and combine tokens (an all-to-all) over NVLink within the NVLink
  domain and over the scale-out NICs beyond it; a pipelined pass takes pp stage times of a
  micro-batch (1/pp of it) when it only decodes, 2 pp - 1 with prefill (fill and drain).
- Power-limited clocks: the compute-bound time of a pass that holds prefill work
  runs at the machine's `prefill_clock_fraction` of the datasheet-peak clock (the
  GPU's sustained clock under dense work, lowered by a power cap as the cube root
  of the dynamic power left). A capped GPU holds that lower clock for the whole
  prefill pass, so the cap also slows its memory-bound and network time (not the
  host's overhead): Splitwise's capped H100 comes out 1.31x slower, it measured
  1.3x from 128 to 8,192 tokens. Decode draws well under the limit (137-300 W of
  700 W on H200, arXiv 2605.11999) and keeps its bandwidth roofline.
- Mixed batches (prefill and decode in one iteration) are the same formula with
  both kinds of attention: the co-located baseline needs nothing else.
- Measured kernel curves (perf.curves): where the engine profile names them (`kernel_curves`)
  and the GPU's file carries them, the dense GEMMs, prefill and decode attention, TP
  all-reduces and routed experts take the curves' efficiencies, bandwidths, fixed latencies and
  per-GPU-count collective terms in place of the profile's factors (`Instance._curves`), measured
  at the clock the GPU holds under load (only a power cap slows them further); where the profile
  also sets `expert_all_to_all: deepep`, so does the expert exchange among the GPU count the
  tables measured (DeepEP's low-latency kernels in decode-only passes, its high-throughput ones
  in passes with prompt work). `timing_sources` says which.

All functions are pure and accept numpy arrays, so the capacity search and the
simulator can evaluate thousands of passes at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any, ClassVar, overload

import numpy as np
from numpy.typing import ArrayLike

from splitplan.base.core import core
from splitplan.base.errors import SpecError
from splitplan.perf import curves
from splitplan.perf.model import FloatArray, PerfModel, Seconds
from splitplan.specs.engine import EngineFactors, EngineProfile
from splitplan.specs.hardware import HardwareSpec, KernelCurves
from splitplan.specs.layout import Layout
from splitplan.specs.model import ModelSpec

BOUNDS = ("compute", "memory", "network", "overhead")
# what kernel curves time
MEASURED_OPERATORS = ("GEMMs", "prefill attention", "decode attention", "all-reduce", "MoE experts", "all-to-all")


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


@dataclass(frozen=True, slots=True)
class PassConstants:
    """An instance's per-GPU constants of the pass formula (`Instance._terms`), computed once.
    Per layer of one pipeline stage unless named otherwise."""

    layers_per_stage: float
    act_bytes_per_element: float  # activations and KV written during prefill
    weight_bytes_per_element: float
    peak_flops_per_s: float  # at the activations' precision (attention)
    gemm_peak_flops_per_s: float  # at the weights' precision (weight GEMMs)
    memory_bytes_per_s: float  # achievable HBM bandwidth
    compute_efficiency: float
    gemm_half_tokens: float  # rows at which a weight GEMM reaches half its efficiency
    dense_flops_per_token: float  # attention projections, dense FFNs, shared experts
    dense_weight_bytes: float
    activation_bytes_per_token: float
    q_dim_per_gpu: float
    kv_dim_per_gpu: float
    prefill_attention_flops_per_sq_token: float  # causal attention, per squared prompt token
    decode_flops_per_context_token: float
    decode_bytes_per_context_token: float  # KV read per context token
    routed_expert_share: float  # routed experts: MoE layers' share of the layers, per GPU of the stage
    lm_head_params: float  # per GPU, 1/pp of it per stage time
    collective_s_per_token: float  # TP all-reduce
    collective_latency_s: float
    large_collective_s_per_token: float  # the large-message algorithm's (the same without a measured curve)
    large_collective_latency_s: float
    all_to_all_s_per_token: float  # expert dispatch and combine (EP or DP attention), in a pass with prompt work
    all_to_all_latency_s: float
    decode_all_to_all_s_per_token: float  # and in a decode-only pass (the same without a measured curve)
    decode_all_to_all_latency_s: float
    hop_s_per_token: float  # pipeline stage boundary
    hop_latency_s: float
    dp: float
    pp: int
    divides_pass: bool  # DP, PP or an expert exchange divides a pass (off the sizing's hot path otherwise)
    gpu_launch_s: float  # kernel launches on the GPU, per stage time
    host_launch_s: float  # the host's time to launch a stage's kernels
    packed_attention: bool  # prefill attention over the packed batch (one sequence) rather than per prompt
    clock_slowdown: float  # compute at the clock prefill holds (1 / prefill_clock_fraction)
    capped_clock_slowdown: float  # a power-capped GPU's clock during prefill (1 / cap_clock_fraction)
    # what measured kernel curves add (perf.curves; the roofline's own values without them)
    gemm_bytes_per_s: float  # weights and activations read by GEMMs
    gemm_pass_s_per_token: float  # activation passes around the GEMMs (quantization, epilogue)
    gemm_latency_s: float  # the dense GEMMs' and the LM head's fixed time
    attention_efficiency: float  # prefill attention's, of the activations' peak
    prefill_attention_half_tokens: float  # prompt tokens at which attention's efficiency is half its peak's
    prefill_attention_latency_s: float
    prefill_attention_s_per_seq: float  # per prompt (or chunk) in the pass
    prefill_attention_ramp_tokens: float  # tiled tokens at which its query tiles half fill the SMs (0: no ramp)
    prefill_attention_tile_tokens: float  # a prompt's tiled tokens: its tokens plus half this (rows cut into tiles)
    kv_bytes_per_s: float  # the KV cache read by decode attention
    decode_attention_half_seqs: float  # decoding sequences at which it is read at half that (0: no ramp)
    decode_attention_efficiency: float  # of the activations' peak, where decode attention is compute-bound
    decode_attention_s_per_seq: float
    decode_attention_latency_s: float
    moe_compute_efficiency: float  # routed experts': of the weights' peak, ramped by rows per touched expert
    moe_half_rows: float
    moe_bytes_per_s: float  # the touched experts' weights read
    moe_latency_s: float  # per layer on average (the MoE layers' share)
    moe_s_per_row: float  # activation passes per routed row
    moe_s_per_token: float  # and per token's top-k copies, per layer on average
    moe_load_spread: float  # the busiest expert group's, as a curve's tables route (perf.curves.load_spread); 0: the mean group
    moe_load_cap: float  # (perf.curves.load_cap)
    moe_routing_alpha: float  # (perf.curves.ROUTING_ALPHA)
    moe_efficiency: float  # the engine's factor on the above (1 where a curve times the experts)


class PassShortcuts:
    """Single-prompt prefill and uniform decode steps, in terms of `pass_time_s`
    (shared by the analytic and the measured instance)."""

    def prefill_time_s(self: PerfModel, prompt_tokens: ArrayLike) -> Seconds:
        """One prompt per element of `prompt_tokens`, each prefilled alone."""
        tokens = np.asarray(prompt_tokens, float)
        return self.pass_time_s(1, tokens, tokens**2)

    def decode_step_time_s(self: PerfModel, batch: ArrayLike, context_tokens_per_request: ArrayLike) -> Seconds:
        """One decode iteration of `batch` requests each holding that many context tokens."""
        b = np.asarray(batch, float)
        return self.pass_time_s(decode_seqs=b, decode_context_tokens=b * np.asarray(context_tokens_per_request, float))


@dataclass(frozen=True)
class Instance(PassShortcuts):
    """One model instance: (model, machine type, parallel layout) under an engine profile.
    `layout` may be given as an int: TP alone."""

    model: ModelSpec
    hardware: HardwareSpec
    engine: EngineProfile
    layout: Layout
    measured: ClassVar[bool] = False  # perf.model.PerfModel: analytic timing, nothing to count
    queries: ClassVar[Mapping[str, int]] = MappingProxyType({"prefill": 0, "decode": 0})
    extrapolated: ClassVar[Mapping[str, int]] = queries

    def __post_init__(self):
        if not isinstance(self.layout, Layout):
            object.__setattr__(self, "layout", Layout(int(self.layout)))

    def record_decode_steps(self, batch: ArrayLike, context_total: ArrayLike) -> None:
        """Nothing to count: every step is computed (PerfModel)."""

    @property
    def tp(self) -> int:
        return self.layout.tp

    @cached_property
    def factors(self) -> EngineFactors:
        return self.engine.factors(self.hardware.family, self.tp, self.model.name)

    # --- how instances fill machines ----------------------------------------------
    @property
    def unit_machines(self) -> int:
        """Machines of the smallest whole unit (Layout.unit)."""
        return self.layout.unit(self.hardware.gpus_per_machine)[0]

    @property
    def unit_instances(self) -> int:
        return self.layout.unit(self.hardware.gpus_per_machine)[1]

    @property
    def kv_link_bytes_per_s(self) -> float:
        """The scale-out bandwidth a request's KV crosses: the NIC share of the GPUs that hold it,
        its attention group's TP x PP (every GPU with DP 1; conservative with DP attention, where
        transfers of different groups could use their own NICs at once)."""
        hw = self.hardware
        return hw.scale_out_bytes_per_s * self.layout.tp * self.layout.pp / hw.gpus_per_machine

    def instances_on(self, machines: int) -> int:
        """Whole instances on `machines` machines."""
        return self.layout.instances_on(machines, self.hardware.gpus_per_machine)

    def machines_for(self, instances: int) -> int:
        """The fewest machines that hold `instances` instances (whole units)."""
        return math.ceil(instances / self.unit_instances) * self.unit_machines

    # --- memory ---------------------------------------------------------------
    @cached_property
    def kv_heads_per_gpu(self) -> int:
        return self.model.kv_heads_per_gpu(self.tp)

    @cached_property
    def kv_bytes_per_token(self) -> float:
        """KV bytes one token occupies on this instance (the GPUs of its attention group,
        replication included). MLA's latent is not split by heads: every GPU of the group
        holds all of it."""
        m = self.model
        per_gpu = m.kv_cache_elements_per_layer if m.is_mla else 2 * self.kv_heads_per_gpu * m.head_dim_eff
        return m.num_hidden_layers * per_gpu * self.tp * self.engine.kv_bytes_per_element

    @property
    def max_request_tokens(self) -> int:
        """The longest request (prompt + output tokens) one instance holds: a request's KV lives
        in one attention (DP) group."""
        return self.fit.kv_capacity_tokens // self.layout.dp

    def _layout_problem(self) -> str:
        m, hw, lay = self.model, self.hardware, self.layout
        gpm = hw.gpus_per_machine
        if lay.problem():
            return f"layout {lay}: {lay.problem()}"
        if lay == Layout(lay.tp) and lay.tp not in hw.tp_degrees():
            return f"TP {lay.tp} does not divide the {gpm} GPUs of {hw.name}"
        if (lay.gpus > gpm and lay.gpus % gpm) or (lay.gpus < gpm and gpm % lay.gpus):
            return f"{lay} ({lay.gpus} GPUs) neither tiles the {gpm} GPUs of {hw.name} nor fills whole machines"
        if m.num_attention_heads % lay.tp:
            return f"TP {lay.tp} does not divide {m.num_attention_heads} attention heads"
        if lay.ep > 1 and (not m.is_moe or m.num_local_experts % lay.ep):
            return f"EP {lay.ep} needs an MoE model whose experts it divides ({m.name} has {m.num_local_experts})"
        if lay.dp > 1 and not m.is_moe:
            return f"data-parallel attention serves MoE models; {m.name} is dense: {lay.dp} TP {lay.tp} instances do the same"
        if lay.pp > m.num_hidden_layers:
            return f"PP {lay.pp} exceeds the {m.num_hidden_layers} layers"
        return ""

    @cached_property
    def fit(self) -> Fit:
        hw, eng, m, lay = self.hardware, self.engine, self.model, self.layout
        # routed experts spread over a stage's GPUs; the rest is split by TP (replicated over DP groups)
        params_gpu = ((m.total_params - m.routed_params) / lay.tp + m.routed_params / lay.stage_gpus) / lay.pp
        weights = params_gpu * eng.weight_bytes_per_element
        usable = hw.memory_bytes_per_gpu * eng.memory_usable_fraction - eng.activation_reserve_gb_per_gpu * 1e9
        if usable <= 0:  # the profile contradicts the machine: no instance of any model runs
            raise SpecError(f"engine {eng.name}: activation_reserve_gb_per_gpu ({eng.activation_reserve_gb_per_gpu:,g} GB) "
                            f"is at least the {hw.memory_bytes_per_gpu * eng.memory_usable_fraction / 1e9:,.1f} GB that "
                            f"memory_usable_fraction ({eng.memory_usable_fraction:g}) leaves of each {hw.name} GPU; lower it")
        room = usable - weights
        problem = self._layout_problem()
        if problem:
            return Fit(False, problem, weights, 0)
        tokens = int(room * lay.gpus // self.kv_bytes_per_token) if room > 0 else 0
        if tokens < lay.dp:
            return Fit(
                False,
                f"{m.name} weights need {weights / 1e9:.1f} GB per GPU at {lay}, "
                f"{hw.name} has {usable / 1e9:.1f} GB usable per GPU",
                weights,
                0,
            )
        return Fit(True, "", weights, tokens)

    # --- one forward pass -------------------------------------------------------
    def _link_bytes_per_s(self, gpus: int, f: EngineFactors, off: float | None = None) -> float:
        """Bytes per second each GPU sends in a collective among `gpus` GPUs: over NVLink within
        the NVLink domain, and for the share `off` of the traffic that leaves it (by default the
        share of peers beyond it) over the GPU's share of the machine's scale-out NICs."""
        hw = self.hardware
        nvlink = hw.intra_node_bytes_per_s * f.link_efficiency
        if gpus <= hw.nvlink_domain:
            return nvlink
        nic = hw.scale_out_bytes_per_s * f.link_efficiency / hw.gpus_per_machine
        off = (gpus - hw.nvlink_domain) / gpus if off is None else off
        return 1 / ((1 - off) / nvlink + off / nic)

    @cached_property
    def constants(self) -> PassConstants:
        """Per-instance constants of the pass formula (per GPU), computed once."""
        m, hw, f, lay = self.model, self.hardware, self.factors, self.layout
        t, g = lay.tp, lay.stage_gpus
        bpe, wbpe, kvbpe = self.engine.bytes_per_element, self.engine.weight_bytes_per_element, self.engine.kv_bytes_per_element
        # per layer on average: attention, dense FFNs (dense layers) and shared experts (MoE layers)
        dense_params = m.attn_params_per_layer + (m.dense_layers * m.dense_ffn_params
                                                  + m.moe_layers * m.n_shared_experts * m.expert_params) / m.num_hidden_layers
        kv_dim_gpu = m.kv_dim / t if m.is_mla else self.kv_heads_per_gpu * m.head_dim_eff
        heads_gpu = m.num_attention_heads / t
        prefill_attn_flops = 2 * heads_gpu * m.prefill_head_dim  # (MLA: the latent expanded per head)
        if m.is_mla:  # decode attends over the latent itself (absorbed)
            decode_flops = 2 * heads_gpu * (m.kv_cache_elements_per_layer + m.mla.kv_lora_rank)
            decode_bytes = m.kv_cache_elements_per_layer * kvbpe
        else:
            decode_flops, decode_bytes = 4 * m.q_dim / t, 2 * kv_dim_gpu * kvbpe
        layers = m.num_hidden_layers / lay.pp
        curves = self._curves
        return PassConstants(
            layers_per_stage=layers, act_bytes_per_element=bpe, weight_bytes_per_element=wbpe,
            peak_flops_per_s=hw.peak_flops_per_s(self.engine.dtype), gemm_peak_flops_per_s=hw.peak_flops_per_s(self.engine.weights),
            memory_bytes_per_s=hw.memory_bytes_per_s * f.memory_efficiency, **curves,
            dense_flops_per_token=2 * dense_params / t, dense_weight_bytes=dense_params * wbpe / t,
            activation_bytes_per_token=bpe * (4 * m.hidden_size
                                              + (2 * m.q_dim + 2 * m.kv_dim + (m.ffn_matrices + 1) * m.intermediate_size) / t),
            q_dim_per_gpu=m.q_dim / t, kv_dim_per_gpu=kv_dim_gpu, prefill_attention_flops_per_sq_token=prefill_attn_flops,
            decode_flops_per_context_token=decode_flops, decode_bytes_per_context_token=decode_bytes,
            routed_expert_share=m.moe_layers / m.num_hidden_layers / g,  # routed experts, per layer on average, per GPU of the stage
            lm_head_params=m.vocab_size * m.hidden_size / t / lay.pp,  # (on the last stage: 1/pp of it per stage time)
            # pipeline: one hop per stage boundary, the activations split over the stage's GPUs
            hop_s_per_token=(m.hidden_size * bpe / g / self._link_bytes_per_s(2 * g, f, off=1.0)) if lay.pp > 1 else 0.0,
            hop_latency_s=f.collective_latency_s if lay.pp > 1 else 0.0,
            dp=float(lay.dp), pp=lay.pp, divides_pass=lay.dp > 1 or lay.pp > 1 or self._exchanges,
            gpu_launch_s=layers * self.engine.kernels_per_layer * f.kernel_launch_s,
            host_launch_s=f.host_launch_s_per_layer * layers,
            packed_attention=self.engine.prefill_attention == "packed",
            # measured kernels ran at the clock the GPU holds under their load: only a power cap slows them further
            clock_slowdown=1.0 / (hw.cap_clock_fraction if self._measured["GEMMs"] else hw.prefill_clock_fraction),
            capped_clock_slowdown=1.0 / hw.cap_clock_fraction,
        )

    @cached_property
    def _exchanges(self) -> bool:
        return self.layout.exchanges_experts(self.model.is_moe)

    @cached_property
    def kernel_curves(self) -> KernelCurves | None:
        """The measured kernel curves this engine's operators take on this GPU (`engine.kernel_curves`), if any."""
        return self.hardware.curves_for(self.engine.kernel_curves)

    @cached_property
    def _measured(self) -> dict[str, Any]:
        """Per operator class the curves time, its curve on this GPU at this instance's precisions and
        TP degree (None where there is none: the roofline times it)."""
        k, eng, t, mla = self.kernel_curves, self.engine, self.layout.tp, self.model.is_mla
        if k is None:
            return dict.fromkeys(MEASURED_OPERATORS)
        # MLA: its prefill (the latent expanded per head) and its absorbed decode have curves of their own
        return dict(zip(MEASURED_OPERATORS, (
            k.gemm.get(eng.weights), (k.mla_context if mla else k.context_attention).get(eng.kv),  # type: ignore[call-overload]
            (k.mla_generation if mla else k.generation_attention).get(eng.kv),  # type: ignore[call-overload]
            k.all_reduce_among(t) if 1 < t <= self.hardware.nvlink_domain else None,
            k.moe.get(eng.weights) if self.model.is_moe else None,  # type: ignore[call-overload]
            k.all_to_all_among(self.layout.stage_gpus) if self._exchanges and eng.expert_all_to_all == "deepep" else None),
            strict=True))

    @cached_property
    def timing_sources(self) -> dict[str, str]:
        """Per operator class, what times it: the engine's measured kernel curves on this GPU, or the
        roofline with the engine profile's factors (datasheet peaks and bandwidth)."""
        eng = self.engine
        out = {op: f"measured {eng.kernel_curves} kernels on {self.hardware.family}" if curve is not None
               else f"roofline: datasheet peak and bandwidth, {eng.name}'s factors" for op, curve in self._measured.items()}
        if self.layout.tp == 1:
            out["all-reduce"] = "none (TP 1)"
        if not self._exchanges:
            del out["all-to-all"]
        if not self.model.is_moe:
            del out["MoE experts"]
        elif self._measured["MoE experts"] is None:
            out["MoE experts"] = f"{'the GEMM curve' if self._measured['GEMMs'] else 'the roofline'} times {eng.name}'s moe_efficiency"
        return out

    @property
    def _curves(self) -> dict[str, float]:
        """The pass constants the kernel curves set (perf.curves), or the roofline's with the engine's factors."""
        m, hw, f, t = self.model, self.hardware, self.factors, self.layout.tp
        bandwidth = hw.memory_bytes_per_s
        # attention curves' efficiencies are of the bf16 peak (the engines attend in bf16), the pass's of the activations'
        of_bf16 = hw.peak_flops_per_s("bf16") / hw.peak_flops_per_s(self.engine.dtype)
        out = {"compute_efficiency": f.compute_efficiency, "gemm_half_tokens": f.gemm_half_tokens,
               "gemm_bytes_per_s": bandwidth * f.memory_efficiency, "gemm_pass_s_per_token": 0.0, "gemm_latency_s": 0.0,
               "attention_efficiency": f.attention_efficiency, "prefill_attention_half_tokens": 0.0,
               "prefill_attention_latency_s": 0.0, "prefill_attention_s_per_seq": 0.0, "prefill_attention_ramp_tokens": 0.0,
               "prefill_attention_tile_tokens": curves.TILE_TOKENS,
               "kv_bytes_per_s": bandwidth * f.memory_efficiency, "decode_attention_half_seqs": 0.0,
               "decode_attention_efficiency": f.compute_efficiency, "decode_attention_s_per_seq": 0.0, "decode_attention_latency_s": 0.0,
               "collective_s_per_token": (2 * (t - 1) / t * m.hidden_size * 2 / self._link_bytes_per_s(t, f)) if t > 1 else 0.0,
               "collective_latency_s": f.collective_latency_s if t > 1 else 0.0, "moe_latency_s": 0.0,
               "moe_s_per_row": 0.0, "moe_s_per_token": 0.0, "moe_load_spread": 0.0, "moe_load_cap": 1.0,
               "moe_routing_alpha": curves.ROUTING_ALPHA, "moe_efficiency": f.moe_efficiency}
        gemm, context, generation, reduce, moe, exchange = self._measured.values()
        heads, kv_heads = m.num_attention_heads / t, self.kv_heads_per_gpu
        if gemm is not None:
            n, k_in = curves.layer_gemms(m, t)
            work = n * k_in  # each GEMM's share of the FLOPs; its time at the shape's efficiency
            out |= {"compute_efficiency": gemm.efficiency * work.sum() / (work / curves.shape_efficiency(gemm, n, k_in)).sum(),
                    "gemm_half_tokens": gemm.half_tokens, "gemm_bytes_per_s": bandwidth * gemm.memory_efficiency,
                    "gemm_pass_s_per_token": (gemm.input_passes * k_in.sum() + gemm.output_passes * n.sum())
                    * curves.ACTIVATION_BYTES / bandwidth,
                    "gemm_latency_s": gemm.latency_s * (len(n) + 1 / m.num_hidden_layers)}  # the LM head once
        if context is not None:
            out |= {"attention_efficiency": curves.context_efficiency(context, heads, kv_heads, m.prefill_head_dim) * of_bf16,
                    "prefill_attention_half_tokens": context.half_tokens, "prefill_attention_latency_s": context.latency_s,
                    "prefill_attention_s_per_seq": heads * context.s_per_head + kv_heads * context.s_per_kv_head,
                    "prefill_attention_ramp_tokens": context.half_tiles * curves.TILE_TOKENS / heads}
        if generation is not None:  # (MLA's efficiency is of its cache precision's peak: perf.curves.mla_generation_s)
            of_peak = hw.peak_flops_per_s(self.engine.kv if m.is_mla else "bf16") / hw.peak_flops_per_s(self.engine.dtype)
            out |= {"kv_bytes_per_s": bandwidth * generation.memory_efficiency,
                    "decode_attention_half_seqs": generation.half_sequences,
                    "decode_attention_efficiency": generation.efficiency * of_peak,
                    "decode_attention_s_per_seq": generation.s_per_sequence
                    + curves.kv_heads_timed(generation, kv_heads) * generation.s_per_kv_head + heads * generation.s_per_head,
                    "decode_attention_latency_s": generation.latency_s}
        out |= {"large_collective_s_per_token": out["collective_s_per_token"],
                "large_collective_latency_s": out["collective_latency_s"]}
        if reduce is not None:  # two per layer, of the tokens' bf16 activations, by the faster algorithm
            (small_s, small_bytes_per_s), (large_s, large_bytes_per_s) = curves.all_reduce_lines(reduce)
            out |= {"collective_s_per_token": m.hidden_size * curves.ACTIVATION_BYTES / small_bytes_per_s,
                    "collective_latency_s": small_s,
                    "large_collective_s_per_token": m.hidden_size * curves.ACTIVATION_BYTES / large_bytes_per_s,
                    "large_collective_latency_s": large_s}
        # routed experts take the GEMMs' ramp and bandwidth unless their own curve times them
        out |= {"moe_compute_efficiency": out["compute_efficiency"], "moe_half_rows": out["gemm_half_tokens"],
                "moe_bytes_per_s": out["gemm_bytes_per_s"]}
        if moe is not None:  # (per layer on average: the MoE layers' share of the layers)
            moe_share, row_s = m.moe_layers / m.num_hidden_layers, m.hidden_size * curves.ACTIVATION_BYTES / bandwidth
            experts, ep = m.num_local_experts, self.layout.ep
            # a GPU passes the rows of its expert group (1/ep of them) where the formula's share is 1/(ep moe_tp),
            # the busiest group's as the curve's tables time it
            out |= {"moe_load_spread": float(curves.load_spread(experts, ep)),
                    "moe_load_cap": float(curves.load_cap(experts, m.num_experts_per_tok, ep)),
                    "moe_compute_efficiency": moe.efficiency, "moe_half_rows": moe.half_rows,
                    "moe_bytes_per_s": bandwidth * moe.memory_efficiency,
                    "moe_latency_s": curves.moe_fixed_s(moe, experts, ep) * moe_share,
                    "moe_s_per_row": moe.row_passes * row_s * self.layout.moe_tp,
                    "moe_s_per_token": moe.token_passes * row_s * moe_share,
                    "moe_efficiency": 1.0}
        return out | self._all_to_all(exchange)

    def _all_to_all(self, curve) -> dict[str, float]:
        """The pass constants of the expert all-to-all, per token of the micro-batch and per layer on
        average: dispatch and combine, each token to min(k, ep) expert groups of moe_tp GPUs (an
        all-gather and reduce-scatter when ep = 1) at the link's bandwidth, with two latencies per MoE
        layer; or, measured, a GPU's tokens (moe_tp / g of them) by the high-throughput kernels in a
        pass with prompt work and the low-latency ones in a decode-only pass (`curve`)."""
        m, f, lay, g = self.model, self.factors, self.layout, self.layout.stage_gpus
        if not self._exchanges:
            return dict.fromkeys(("all_to_all_s_per_token", "all_to_all_latency_s", "decode_all_to_all_s_per_token",
                                  "decode_all_to_all_latency_s"), 0.0)
        k = m.num_experts_per_tok
        if curve is None:
            copy_bytes = 2 * min(k, lay.ep) * lay.moe_tp / g * (g - 1) / g * m.hidden_size * self.engine.bytes_per_element
            per_token = copy_bytes / self._link_bytes_per_s(g, f) * m.moe_layers / m.num_hidden_layers
            latency = 2 * f.collective_latency_s * m.moe_layers / m.num_hidden_layers
            return {"all_to_all_s_per_token": per_token, "all_to_all_latency_s": latency,
                    "decode_all_to_all_s_per_token": per_token, "decode_all_to_all_latency_s": latency}
        out: dict[str, float] = {}
        share = m.moe_layers / m.num_hidden_layers
        for prefix, line, low in (("", curve.high_throughput, False), ("decode_", curve.low_latency, True)):
            per_copy = line.s_per_copy + m.hidden_size * curves.ACTIVATION_BYTES / line.bytes_per_s
            out |= {f"{prefix}all_to_all_s_per_token": lay.moe_tp / g * curves.all_to_all_copies(k, g, low) * per_copy * share,
                    f"{prefix}all_to_all_latency_s": line.latency_s * share}
        return out

    @cached_property
    def pass_vector(self) -> FloatArray:
        """`constants` with the engine factors and model figures the pass formula reads, as the
        float64 vector the compiled formula takes (splitplan_core.FIELDS names its entries)."""
        m, f, k = self.model, self.factors, self.constants
        known = {name: getattr(f, name) for name in core.FIELDS if name in type(f).model_fields}
        known |= {name: getattr(k, name) for name in k.__slots__}
        known |= {"is_moe": m.is_moe, "experts": m.num_local_experts if m.is_moe else 1,
                  "experts_per_token": m.num_experts_per_tok if m.is_moe else 0, "expert_params": m.expert_params if m.is_moe else 0}
        return np.array([float(known[name]) for name in core.FIELDS])  # (writable: the replay's rows are, one compiled type)

    def _terms(self, prefill_seqs, prefill_tokens, prefill_sq_tokens, decode_seqs, decode_context_tokens):
        """Time terms of one pass (floats, or arrays of the arguments' broadcast shape):
        compute-bound, memory-bound, network, overhead, plus FLOPs and bytes per GPU. The
        arithmetic is compiled (splitplan_core.pass_terms), which the prompt replay calls too.

        Per GPU of one pipeline stage on one micro-batch (1/pp of the pass): attention and
        dense FFNs see their DP group's share (1/dp), routed experts the whole micro-batch
        spread over the stage's GPUs. A pipelined pass takes pp stage times when it only
        decodes (every stage busy with a micro-batch) and 2 pp - 1 when it holds prefill work
        (the pipeline fills and drains). Per operator class (dense GEMMs with the attention
        projections, routed experts, prefill attention, decode attention, LM head) the larger of
        its compute and memory time; TP all-reduces (slower past the engine's knee), expert
        all-to-alls and pipeline hops; the engine's overheads, and the host's kernel launches
        where they outlast the GPU's work."""
        args = [_num(x) for x in (prefill_seqs, prefill_tokens, prefill_sq_tokens, decode_seqs, decode_context_tokens)]
        if all(isinstance(x, float) for x in args):
            return core.pass_terms(self.pass_vector, *args)
        arrays = np.broadcast_arrays(*args)
        out = core.pass_terms_array(self.pass_vector, *(a.reshape(-1) for a in arrays))  # (views: the core reads strides)
        return tuple(row.reshape(arrays[0].shape) for row in out)

    def _shares(self, prefill_seqs, decode_seqs, has_prefill):
        """How a pass divides: the share one pipeline micro-batch carries (1/pp of its prompts,
        chunked over the stages, and of its decode requests; a whole request when fewer than pp
        decode), and over how many attention groups a micro-batch's requests spread (DP, or
        fewer when it has fewer requests: one prompt is attended by one group)."""
        if isinstance(decode_seqs, float):
            return core.pass_shares(self.pass_vector, float(prefill_seqs), decode_seqs, float(has_prefill))
        decode = np.asarray(decode_seqs, float)
        out = core.pass_shares_array(self.pass_vector, np.full(decode.size, float(prefill_seqs)), decode.ravel(),
                                        float(has_prefill))
        return out[0].reshape(decode.shape), out[1].reshape(decode.shape)

    def pass_time_s(self, prefill_seqs: ArrayLike = 0, prefill_tokens: ArrayLike = 0, prefill_sq_tokens: ArrayLike = 0,
                    decode_seqs: ArrayLike = 0, decode_context_tokens: ArrayLike = 0) -> Seconds:
        """Seconds for one forward pass (vectorized over numpy arrays)."""
        compute_s, memory_s, network_s, overhead_s, _, _ = self._terms(prefill_seqs, prefill_tokens, prefill_sq_tokens, decode_seqs,
                                                                       decode_context_tokens)
        return compute_s + memory_s + network_s + overhead_s

    @overload
    def decode_line(self, batch: int) -> tuple[float, float, float]: ...

    @overload
    def decode_line(self, batch: np.ndarray) -> tuple[FloatArray, float, FloatArray]: ...

    def decode_line(self, batch):
        """A decode step of `batch` requests as a function of their summed context C:
        `base + C * per_token + max(slack - C * per_token, 0)` seconds, exactly
        `pass_time_s(decode_seqs=batch, decode_context_tokens=C)` (the context enters
        only through decode attention, linear in C, and through the host-launch wait).
        The simulator evaluates one step per iteration with this. (base, per_token, slack):
        floats for an int `batch`, arrays for an array of batches."""
        k = self.constants
        compute_s, memory_s, network_s, overhead_s, _, _ = self._terms(0.0, 0.0, 0.0, _num(batch), 0.0)
        gpu_s = compute_s + memory_s + network_s + k.gpu_launch_s * k.pp  # (all pp stage times)
        wait_s = _max(k.host_launch_s * k.pp - gpu_s, 0.0)
        micro, groups = self._shares(0.0, _num(batch), False)
        seqs = _max(_num(batch) * micro / groups, 1e-9)  # a group's decoding sequences, whose few read the cache slower
        read_s = k.decode_bytes_per_context_token / (k.kv_bytes_per_s * (seqs / (seqs + k.decode_attention_half_seqs)))
        per_token = k.layers_per_stage * _max(k.decode_flops_per_context_token / (k.peak_flops_per_s * k.decode_attention_efficiency),
                                              read_s) * micro / groups * k.pp
        return compute_s + memory_s + network_s + overhead_s - wait_s, per_token, k.host_launch_s * k.pp - gpu_s

    def explain(self, prompt_tokens: list[int] | None = None, decode_batch: int = 0, decode_context_tokens: int = 0) -> Latency:
        """A scalar pass with its breakdown: a batch of prompts, or a decode batch, or both."""
        prompts = np.asarray(prompt_tokens or [], float)
        terms = self._terms(len(prompts), prompts.sum(), (prompts**2).sum(), decode_batch, decode_batch * decode_context_tokens)
        compute_s, memory_s, network_s, overhead_s, flops, nbytes = (float(x) for x in terms)
        parts = dict(zip(BOUNDS, (compute_s, memory_s, network_s, overhead_s), strict=True))
        return Latency(compute_s + memory_s + network_s + overhead_s, max(parts, key=lambda bound: parts[bound]),
                       compute_s, memory_s, network_s, overhead_s, flops, nbytes)


def local_kv_bytes_per_s(src: Instance, dst: Instance) -> float:
    """KV bandwidth between a prompt and a token instance on one machine: over NVLink (or the
    machine's GPU link), each GPU of the smaller instance one link's direction."""
    return min(src.layout.gpus, dst.layout.gpus) * src.hardware.intra_node_bytes_per_s


def kv_transfer_time_s(src: Instance, dst: Instance, prompt_tokens, prefill_s=None, local: bool = False):
    """Seconds of KV transfer the request sees between a prompt and a token instance.

    Bandwidth is the smaller of the two instances' KV links (`Instance.kv_link_bytes_per_s`),
    or, for instances on one machine (`local`), their GPU links (`local_kv_bytes_per_s`).
    Prompts shorter than the engine's `layerwise_transfer_min_tokens`
    are sent after the prefill (serialized: all bytes exposed); longer ones layer by
    layer during the prefill, leaving the last layer's share exposed (or more, when
    the network is slower than the prefill produces KV). The engine's
    `kv_transfer_latency_s` is added either way.
    """
    tokens = np.asarray(prompt_tokens, float)
    bw = local_kv_bytes_per_s(src, dst) if local else min(src.kv_link_bytes_per_s, dst.kv_link_bytes_per_s)
    total_s = tokens * src.model.kv_bytes_per_token(src.engine.kv_bytes_per_element) / bw
    layers = src.model.num_hidden_layers
    prefill = src.prefill_time_s(tokens) if prefill_s is None else np.asarray(prefill_s, float)
    layerwise_s = np.maximum(total_s / layers, total_s - prefill * (layers - 1) / layers)
    exposed = np.where(tokens < src.engine.layerwise_transfer_min_tokens, total_s, layerwise_s)
    return exposed + src.factors.kv_transfer_latency_s
