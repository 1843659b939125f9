"""Machine types: one YAML per machine in `hardware_specs/`.

Data files use human units with the unit in the key (TFLOP/s, GB, TB/s, Gbit/s, W);
the properties below convert once to SI (`_flops_per_s`, `_bytes`, `_bytes_per_s`).
Every figure carries a source and a date.
"""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from splitplan.base.errors import SpecError
from splitplan.specs._load import load_named
from splitplan.specs.catalog import catalog_names, per_catalog, pinned

_STRICT = ConfigDict(frozen=True, extra="forbid")
Frac = Annotated[float, Field(gt=0, le=1)]
WeightPrecision = Literal["bf16", "fp8", "fp4"]
# Dynamic power grows about as the cube of the clock over the DVFS range (P ~ C V^2 f, with the
# voltage rising about linearly with f). Checked against Splitwise (ISCA 2024): an H100 capped to
# 350 W of its 700 W (75 W idle) is predicted ((350-75)/(700-75))^(1/3) = 0.76 of its clock, prefill
# 1.31x slower; Splitwise measured about 1.3x.
CLOCK_POWER_EXPONENT = 3.0


class GpuSpec(BaseModel):
    """One accelerator, dense (no sparsity) datasheet figures."""

    model_config = _STRICT
    name: str
    bf16_tflop_per_s: Annotated[float, Field(gt=0, le=100_000)]
    fp8_tflop_per_s: Annotated[float, Field(gt=0, le=100_000)] | None = None
    fp4_tflop_per_s: Annotated[float, Field(gt=0, le=100_000)] | None = None  # (Blackwell and later)
    memory_gb: Annotated[float, Field(gt=0, le=10_000)]
    # The memory the driver reports (nvidia-smi's memory.total), in MiB: what an engine sizes its KV
    # cache from (vLLM's gpu_memory_utilization is a fraction of it). The datasheet's "80 GB" is about
    # 80 GiB, 7 % more bytes than 80e9. None: the datasheet's memory_gb, as 1e9 bytes each.
    memory_reported_mib: Annotated[int, Field(gt=0, le=10_000_000)] | None = None
    memory_reported_source: str = ""
    memory_tb_per_s: Annotated[float, Field(gt=0, le=1_000)]
    tdp_w: Annotated[float, Field(gt=0, le=10_000)]
    idle_w: Annotated[float, Field(ge=0, le=10_000)]
    decode_w: Annotated[float, Field(gt=0, le=10_000)] | None = None
    intra_node_bidir_gbyte_per_s: Annotated[float, Field(gt=0, le=100_000)]
    # One GPU's link to host memory, each direction (PCIe, or NVLink-C2C on Grace systems): what
    # KV blocks kept in host memory (`--kv-offload-gb`) are loaded back over. None: not known.
    host_link_gbyte_per_s: Annotated[float, Field(gt=0, le=100_000)] | None = None
    host_link_source: str = ""
    source: str
    source_date: str
    # Power-limited clocks: under sustained dense tensor-core work (prefill) the GPU holds its
    # power limit by running below the clock its datasheet peak assumes. The sustained clock as
    # a fraction of that clock, and where the figure comes from ("estimate: ..." when no public
    # measurement exists).
    sustained_clock_fraction: Frac = 1.0
    clock_source: str = "none: datasheet clock assumed sustained"
    # The best dense GEMM throughput measured on this GPU per precision (bf16, fp8, fp4), and its
    # source: the ceiling no fitted compute_efficiency may pass (compute_efficiency_ceiling).
    gemm_tflop_per_s: dict[WeightPrecision, Annotated[float, Field(gt=0, le=100_000)]] = {}
    gemm_source: str = ""

    @model_validator(mode="after")
    def _power_order(self) -> GpuSpec:
        if self.memory_reported_mib and not self.memory_reported_source:
            raise ValueError("memory_reported_mib needs its memory_reported_source (where the reported memory comes from)")
        if self.gemm_tflop_per_s and not self.gemm_source:
            raise ValueError("gemm_tflop_per_s needs its gemm_source (where the measured throughput comes from)")
        if self.idle_w >= self.tdp_w:
            raise ValueError(f"idle_w ({self.idle_w}) must be below tdp_w ({self.tdp_w})")
        if self.decode_w is not None and not self.idle_w <= self.decode_w <= self.tdp_w:
            raise ValueError("decode_w must lie between idle_w and tdp_w")
        return self


Positive = Annotated[float, Field(ge=0, le=1e6)]
Seconds = Annotated[float, Field(ge=0, le=1.0)]
KernelEngine = Literal["vllm", "sglang", "trtllm"]  # the engines whose kernels NVIDIA's tables measure


class GemmCurve(BaseModel):
    """A dense GEMM's time on this GPU at one precision (`perf.curves.gemm_s`), fitted to measured kernels."""

    model_config = _STRICT
    efficiency: Frac  # of the dense peak at the datasheet clock, approached as the rows grow
    half_tokens: Positive  # rows at which the efficiency is half that
    half_n: Positive  # and the weight's outputs and inputs at which it is (perf.curves.shape_efficiency)
    half_k: Positive
    memory_efficiency: Frac  # of the datasheet bandwidth, reading weights and activations
    input_passes: Positive  # the input's and output's extra traffic (quantization, epilogue), in 2-byte reads
    output_passes: Positive
    latency_s: Seconds  # a kernel's fixed time


class ContextAttentionCurve(BaseModel):
    """Causal prefill attention (`perf.curves.context_attention_s`)."""

    model_config = _STRICT
    efficiency: Frac  # of the bf16 peak at the datasheet clock for heads of 128 dims, approached as prompts grow
    half_tokens: Positive  # prompt tokens at which it is half that
    latency_s: Seconds
    half_dim: Positive = 0.0  # head dims at which the efficiency is half its asymptote (perf.curves.head_dim_share)
    # each KV head's share of a query head's work (K and V loaded per head group: an MHA head costs
    # 1 + kv_head_cost of a wide GQA group's), and a fixed time per prompt and KV head, and per prompt and query head
    kv_head_cost: Positive = 0.0
    s_per_kv_head: Seconds = 0.0
    s_per_head: Seconds = 0.0
    half_tiles: Positive = 0.0  # query tiles (heads x 128-row blocks) at which the SMs are half filled


class GenerationAttentionCurve(BaseModel):
    """One decode step's attention (`perf.curves.generation_attention_s`)."""

    model_config = _STRICT
    memory_efficiency: Frac  # of the datasheet bandwidth, reading the KV cache
    efficiency: Frac  # of the bf16 peak (where many query heads share a KV head)
    s_per_sequence: Seconds
    s_per_kv_head: Seconds  # per sequence and KV head
    latency_s: Seconds
    # the most KV heads per GPU the fitted table measured: more are timed as that many in the
    # per-KV-head term (perf.curves.kv_heads_timed; None: no bound, the term grows with them)
    max_kv_heads: Annotated[int, Field(ge=1, le=1024)] | None = None
    # MLA's (0 in the heads' form): sequences at which the cache is read at half the bandwidth (the
    # SMs a few sequences fill), and a time per sequence and query head
    half_sequences: Positive = 0.0
    s_per_head: Seconds = 0.0


class AllReduceCurve(BaseModel):
    """An all-reduce among `gpus` GPUs of one machine (`perf.curves.all_reduce_s`): the faster of
    two algorithms, as the engines switch from a one-shot kernel to a bandwidth-bound one (two-shot,
    NCCL) as messages grow; without the second, the first alone."""

    model_config = _STRICT
    gpus: Annotated[int, Field(ge=2, le=72)]
    latency_s: Seconds
    bytes_per_s: Annotated[float, Field(gt=0, le=1e14)]  # message bytes per second
    large_latency_s: Seconds | None = None  # the large-message algorithm's
    large_bytes_per_s: Annotated[float, Field(gt=0, le=1e14)] | None = None

    @model_validator(mode="after")
    def _both_or_neither(self) -> AllReduceCurve:
        if (self.large_latency_s is None) != (self.large_bytes_per_s is None):
            raise ValueError("large_latency_s and large_bytes_per_s come together")
        return self


class AllToAllLine(BaseModel):
    """One kernel family's expert dispatch and combine (`perf.curves.all_to_all_s`)."""

    model_config = _STRICT
    latency_s: Seconds
    bytes_per_s: Annotated[float, Field(gt=0, le=1e14)]  # of the copies' activations, as bf16
    s_per_copy: Seconds  # per token copy sent, whatever its size


class AllToAllCurve(BaseModel):
    """The expert all-to-all among `gpus` GPUs of one NVLink domain, as DeepEP's kernels measure
    it: `low_latency` (a copy per routed expert, for decode batches) and `high_throughput` (a copy
    per destination GPU, for prefill)."""

    model_config = _STRICT
    gpus: Annotated[int, Field(ge=2, le=72)]
    low_latency: AllToAllLine
    high_throughput: AllToAllLine


class MoeCurve(BaseModel):
    """A fused MoE layer's routed experts on one GPU (`perf.curves.moe_s`)."""

    model_config = _STRICT
    efficiency: Frac  # of the weights' dense peak at the datasheet clock, approached as rows per expert grow
    half_rows: Positive  # rows per touched expert at which it is half that
    memory_efficiency: Frac  # of the datasheet bandwidth, reading the touched experts' weights
    row_passes: Positive  # 2-byte reads of each routed row (permutes, quantization, the epilogue)
    token_passes: Positive  # and of each token's top-k copies, whichever GPU computes them
    latency_s: Seconds
    s_per_expert: Seconds = 0.0  # per expert the GPU holds, touched or not (the grouped kernels' per-expert work)


Precision = Literal["bf16", "fp8"]


class KernelCurves(BaseModel):
    """One engine's measured kernels on this GPU as curves: GEMMs and MoE experts per weight
    precision, attention (and MLA's) per KV-cache precision, all-reduces and expert all-to-alls per
    GPU count. What they leave out the engine profile's factors time, as on a GPU with no curves."""

    model_config = _STRICT
    source: str
    gemm: dict[WeightPrecision, GemmCurve] = {}
    context_attention: dict[Precision, ContextAttentionCurve] = {}
    generation_attention: dict[Precision, GenerationAttentionCurve] = {}
    # MLA's prefill, the latent expanded to a KV head per query head (perf.curves.context_attention_s of
    # heads of its query-key and value dims' mean), and its absorbed decode (perf.curves.mla_generation_s)
    mla_context: dict[Precision, ContextAttentionCurve] = {}
    mla_generation: dict[Precision, GenerationAttentionCurve] = {}
    all_reduce: tuple[AllReduceCurve, ...] = ()
    moe: dict[WeightPrecision, MoeCurve] = {}
    all_to_all: tuple[AllToAllCurve, ...] = ()
    # held-out MAPE % per operator class and precision (bench/fit_kernels.py), for the record
    mape_pct: dict[str, float] = {}

    def all_reduce_among(self, gpus: int) -> AllReduceCurve | None:
        return next((c for c in self.all_reduce if c.gpus == gpus), None)

    def all_to_all_among(self, gpus: int) -> AllToAllCurve | None:
        return next((c for c in self.all_to_all if c.gpus == gpus), None)


class ShapeSpec(BaseModel):
    """A smaller rental of a machine type: `gpus` of its GPUs, with their share of its NICs and
    provisioned power, at a price of its own (clouds rent H100s by 1, 2, 4 and 8)."""

    model_config = _STRICT
    gpus: Annotated[int, Field(ge=1, le=72)]
    price_usd_per_hour: Annotated[float, Field(gt=0, le=10_000)]
    price_source: str
    price_date: str


class HardwareSpec(BaseModel):
    """A machine type: GPUs, network, price and power. Its `shapes`, where given, are the smaller
    machines it is also rented as; `name@G` (e.g. `h100-80gb@1`) names the machine of G GPUs
    (`shape`), and the whole machine is `name` (or `name@gpus_per_machine`)."""

    model_config = _STRICT
    name: str
    description: str
    gpu: GpuSpec
    gpus_per_machine: Annotated[int, Field(ge=1, le=72)]
    # Rack-scale systems (GB200 NVL72): the NVLink domain spans several machines (compute trays);
    # GPUs within it exchange over NVLink, beyond it over the scale-out network. Default: one machine.
    nvlink_domain_gpus: Annotated[int, Field(ge=1, le=576)] | None = None
    scale_out_gbit_per_s: Annotated[float, Field(gt=0, le=100_000)]
    price_usd_per_hour: Annotated[float, Field(gt=0, le=10_000)]
    price_source: str
    price_date: str
    provisioned_power_w: Annotated[float, Field(gt=0, le=1_000_000)]
    power_cap_fraction: Annotated[float, Field(gt=0, le=1)] | None = None  # of provisioned machine power
    gpu_power_cap_w: Annotated[float, Field(gt=0, le=10_000)] | None = None  # each GPU's power limit, if below its TDP
    shapes: tuple[ShapeSpec, ...] = ()
    # Kubernetes: the labels that select nodes of this machine type (NVIDIA's GPU Feature
    # Discovery sets nvidia.com/gpu.product and nvidia.com/gpu.count; a shape's count is its own)
    # and the extended resource its GPUs are requested as. `splitplan export --node-selector`
    # replaces the labels for a cluster labelled otherwise.
    kubernetes_node_labels: dict[str, str] = {}
    kubernetes_gpu_resource: str = "nvidia.com/gpu"
    # Operator curves fitted to an engine's measured kernels on this GPU (bench/fit_kernels.py), by
    # engine: what an engine profile naming them (`kernel_curves`) times its GEMMs, attention and
    # all-reduces with. None here: the roofline with the profile's factors.
    kernels: dict[KernelEngine, KernelCurves] = {}

    def curves_for(self, engine: str | None) -> KernelCurves | None:
        """The measured kernel curves of `engine` (a profile's `kernel_curves`) on this GPU, if it has them."""
        return self.kernels.get(engine) if engine else None  # type: ignore[call-overload]

    @model_validator(mode="after")
    def _shapes_tile(self) -> HardwareSpec:
        """Each shape a divisor of the machine's GPUs, one per GPU count, every count dividing
        the next (so that instances of the layouts one shape takes also tile the larger ones)."""
        gpm = self.gpus_per_machine
        seen: dict[int, int] = {}  # GPU count -> the shape's index
        for i, shape in enumerate(self.shapes):
            if shape.gpus == gpm or shape.gpus in seen:
                first = f"shapes[{seen[shape.gpus]}]" if shape.gpus in seen else "gpus_per_machine"
                raise ValueError(f"shapes[{i}].gpus: {first} is already a machine of {shape.gpus} GPUs; give each GPU "
                                 "count once (the whole machine's price is price_usd_per_hour)")
            if shape.gpus > gpm or gpm % shape.gpus:
                raise ValueError(f"shapes[{i}].gpus: {shape.gpus} does not divide the {gpm} GPUs of the machine; a shape "
                                 f"is a part of it that whole instances fill (choose from {_divisors(gpm)[:-1]})")
            seen[shape.gpus] = i
        counts = sorted(seen)
        for small, large in pairwise(counts):
            if large % small:
                raise ValueError(f"shapes: machines of {small} and {large} GPUs; each shape's GPU count must divide the "
                                 "next larger one's (1, 2, 4, 8 do), or instances would not pack")
        for key, value in self.kubernetes_node_labels.items():
            if not (label_key_ok(key) and label_value_ok(value)):
                raise ValueError(f"kubernetes_node_labels: '{key}: {value}' is not a Kubernetes label (KEY: [PREFIX/]NAME, "
                                 "VALUE: up to 63 letters, digits, '-', '_', '.')")
        if not label_key_ok(self.kubernetes_gpu_resource):
            raise ValueError(f"kubernetes_gpu_resource: '{self.kubernetes_gpu_resource}' is not a resource name "
                             "(DOMAIN/NAME, e.g. nvidia.com/gpu)")
        if self.shapes and self.nvlink_domain_gpus is not None:
            raise ValueError("shapes: a rack-scale machine (nvlink_domain_gpus) is rented as whole machines; remove shapes")
        return self

    @property
    def family(self) -> str:
        """The machine type a shape belongs to (its own name for a whole machine): engine factors
        and measurements apply to every shape of it."""
        return self.name.partition("@")[0]

    def shape(self, gpus: int) -> HardwareSpec:
        """The machine of `gpus` of this type's GPUs, named `name@gpus`, with its price and its
        share of the NICs and provisioned power (the whole machine itself for gpus_per_machine)."""
        if gpus == self.gpus_per_machine:
            return self
        shape = next((s for s in self.shapes if s.gpus == gpus), None)
        if shape is None:
            named = [f"{self.name}@{g}" for g in self.shape_gpus if g != self.gpus_per_machine]
            raise SpecError(f"hardware {self.name}@{gpus}: {self.name} is rented as machines of "
                            f"{', '.join(str(g) for g in self.shape_gpus)} GPUs; choose "
                            f"{', '.join(named + [self.name])} (the whole machine)")
        share = gpus / self.gpus_per_machine
        return self.model_copy(update={
            "name": f"{self.name}@{gpus}", "description": f"{gpus} of the {self.gpus_per_machine} GPUs of: {self.description}",
            "gpus_per_machine": gpus, "scale_out_gbit_per_s": self.scale_out_gbit_per_s * share,
            "price_usd_per_hour": shape.price_usd_per_hour, "price_source": shape.price_source,
            "price_date": shape.price_date, "provisioned_power_w": self.provisioned_power_w * share, "shapes": (),
            "kubernetes_node_labels": {k: str(gpus) if k == GPU_COUNT_LABEL else v for k, v in self.kubernetes_node_labels.items()}})

    @property
    def shape_gpus(self) -> list[int]:
        """The GPU counts this machine type is rented in, the whole machine's included."""
        return sorted([s.gpus for s in self.shapes] + [self.gpus_per_machine])

    def shaped(self) -> list[HardwareSpec]:
        """The machine and each of its shapes, the whole machine first."""
        return [self] + [self.shape(g) for g in self.shape_gpus if g != self.gpus_per_machine]

    @model_validator(mode="after")
    def _cap_consistent(self) -> HardwareSpec:
        if self.nvlink_domain_gpus is not None and self.nvlink_domain_gpus % self.gpus_per_machine:
            raise ValueError(f"nvlink_domain_gpus must be a multiple of gpus_per_machine ({self.gpus_per_machine})")
        if self.gpu_power_cap_w is not None and not self.gpu.idle_w < self.gpu_power_cap_w <= self.gpu.tdp_w:
            raise ValueError(f"gpu_power_cap_w must lie above idle_w ({self.gpu.idle_w}) and at most tdp_w ({self.gpu.tdp_w})")
        return self

    @property
    def gpu_power_limit_w(self) -> float:
        return self.gpu_power_cap_w or self.gpu.tdp_w

    @property
    def prefill_clock_fraction(self) -> float:
        """Clock of sustained dense (prefill) work as a fraction of the datasheet-peak clock:
        the sustained clock at TDP, lowered by a power cap as the cube root of the dynamic
        power left (CLOCK_POWER_EXPONENT). Memory-bound decode draws well under the cap
        and keeps its bandwidth."""
        return self.gpu.sustained_clock_fraction * self.cap_clock_fraction

    @property
    def cap_clock_fraction(self) -> float:
        """What a power cap leaves of the sustained clock (1 uncapped): the cube root of the
        dynamic power left (CLOCK_POWER_EXPONENT)."""
        g = self.gpu
        dynamic = (self.gpu_power_limit_w - g.idle_w) / (g.tdp_w - g.idle_w)
        return dynamic ** (1 / CLOCK_POWER_EXPONENT)

    # SI views, converted once here so no other module sees human units.
    def native_precision(self, dtype: str) -> str:
        """The precision the GPU computes `dtype` at: its own where the datasheet gives its peak, else
        bf16 (fp4 weights on a GPU without fp4 tensor cores run weight-only: held at 4 bits, widened
        to bf16 for the GEMMs, as vLLM's FP4 Marlin kernels and gpt-oss's MXFP4 kernels on Hopper)."""
        return dtype if {"fp8": self.gpu.fp8_tflop_per_s, "fp4": self.gpu.fp4_tflop_per_s}.get(dtype) else "bf16"

    def peak_flops_per_s(self, dtype: str) -> float:
        """Dense peak per GPU for `dtype` (bf16, fp8 or fp4) at its native precision: fp8 and fp4 fall
        back to bf16 where the GPU has no tensor cores of theirs (they then run at bf16 speed)."""
        g = self.gpu
        tflops = {"bf16": g.bf16_tflop_per_s, "fp8": g.fp8_tflop_per_s, "fp4": g.fp4_tflop_per_s}[self.native_precision(dtype)]
        return (tflops or g.bf16_tflop_per_s) * 1e12  # (never None: native_precision names a peak the datasheet gives)

    def compute_efficiency_ceiling(self, dtype: str) -> tuple[float, str]:
        """The largest compute_efficiency (of the dense peak at the sustained clock) that physics
        allows a GEMM of `dtype` on this GPU, and why: the best measured GEMM throughput
        (gpu.gemm_tflop_per_s) over that peak, at most 1; 1 where nothing was measured."""
        native = self.native_precision(dtype)
        measured = self.gpu.gemm_tflop_per_s.get(native)  # type: ignore[call-overload]
        if measured is None:
            return 1.0, "the dense peak at the sustained clock (no measured GEMM ceiling)"
        sustained = self.peak_flops_per_s(dtype) / 1e12 * self.gpu.sustained_clock_fraction
        ceiling = min(1.0, measured / sustained)
        return ceiling, (f"{self.name}'s best measured {native} GEMMs, {measured:,.0f} TFLOP/s of {sustained:,.0f} at the "
                         f"sustained clock ({self.gpu.gemm_source})")

    def has_tensor_cores(self, dtype: str) -> bool:
        """False only for fp4 on a GPU without fp4 tensor cores (run weight-only, priced at bf16; the
        export refuses such a plan for SGLang): fp8 on a GPU without fp8 tensor cores counts as served
        (`native_precision` gives the precision each dtype is computed at)."""
        return dtype != "fp4" or self.gpu.fp4_tflop_per_s is not None

    @property
    def memory_bytes_per_gpu(self) -> float:
        reported = self.gpu.memory_reported_mib
        return reported * 2**20 if reported else self.gpu.memory_gb * 1e9

    @property
    def memory_bytes_per_s(self) -> float:
        return self.gpu.memory_tb_per_s * 1e12

    @property
    def intra_node_bytes_per_s(self) -> float:
        """One direction of the GPU's intra-node link (the datasheet figure is bidirectional)."""
        return self.gpu.intra_node_bidir_gbyte_per_s * 1e9 / 2

    @property
    def scale_out_bytes_per_s(self) -> float:
        return self.scale_out_gbit_per_s * 1e9 / 8

    @property
    def nvlink_domain(self) -> int:
        """GPUs that reach each other over NVLink: one machine, or a rack-scale domain."""
        return self.nvlink_domain_gpus or self.gpus_per_machine

    def tp_degrees(self) -> list[int]:
        """TP degrees that tile a machine exactly (one or more instances per machine), and in a
        rack-scale NVLink domain those up to 8 that fill whole machines (TP 8 over two 4-GPU trays)."""
        gpm = self.gpus_per_machine
        return [t for t in range(1, gpm + 1) if gpm % t == 0] + [t for t in (8,) if gpm < t <= self.nvlink_domain and t % gpm == 0]


GPU_COUNT_LABEL = "nvidia.com/gpu.count"
_LABEL_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^(?:{_LABEL_NAME})?$")


def label_key_ok(key: str) -> bool:
    """A Kubernetes label key (or extended resource name): [PREFIX/]NAME, PREFIX a DNS subdomain
    of at most 253 characters, NAME at most 63 letters, digits, '-', '_', '.'."""
    return bool(_LABEL_KEY.match(key)) and len(key.rpartition("/")[0]) <= 253


def label_value_ok(value: str) -> bool:
    """A Kubernetes label value: empty, or at most 63 letters, digits, '-', '_', '.' starting
    and ending with a letter or digit."""
    return bool(_LABEL_VALUE.match(value))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


_SHAPE = re.compile(r"^(.+)@(\d{1,4})$")


@per_catalog(maxsize=256)
def load_hardware(name_or_path: str) -> HardwareSpec:
    """A machine type by catalog name or path; `NAME@G` is its shape of G GPUs (a plan's copy of
    a shape, where a plan is read, is used as it is)."""
    shape = _SHAPE.match(name_or_path)
    if shape and pinned("hardware_specs", name_or_path) is None:
        return load_hardware(shape.group(1)).shape(int(shape.group(2)))
    return load_named(HardwareSpec, "hardware_specs", name_or_path, "hardware")[0]


def load_machines(names) -> dict[str, HardwareSpec]:
    """The machine types `names` (catalog names or paths), by the name given; two entries that
    are different machines under one `name` are an error (reports and limits go by name)."""
    machines = {n: load_hardware(n) for n in names}
    by_name: dict[str, str] = {}
    for given, hw in machines.items():
        other = by_name.setdefault(hw.name, given)
        if other != given and machines[other] != hw:
            raise SpecError(f"--hardware: {other} and {given} are different machines both named '{hw.name}'; "
                            "give one a name of its own (its file name or a `name:` key)")
    return machines


def hardware_catalog() -> list[HardwareSpec]:
    return [load_hardware(n) for n in catalog_names("hardware_specs")]


_MONTH = re.compile(r"^(\d{4})-(\d{2})")


def price_date_warning(machines) -> str | None:
    """A warning when the prices of `machines` (HardwareSpecs) were taken more than a year
    apart (their `price_date`s): on-demand prices fall fast, so an old price beside a new one
    biases a cost comparison. None when they are within a year (or undated)."""
    dated = {}
    for hw in machines:
        match = _MONTH.match(hw.price_date)
        if match:
            dated[hw.name] = (int(match.group(1)) * 12 + int(match.group(2)) - 1, hw.price_date)
    if len(dated) < 2:
        return None
    old = min(dated.values())
    new = max(dated.values())
    if new[0] - old[0] <= 12:
        return None
    names = {date: sorted(n for n, (_, d) in dated.items() if d == date) for _, date in (old, new)}
    return (f"prices from {old[1]} ({', '.join(names[old[1]])}) and {new[1]} ({', '.join(names[new[1]])}) are compared: "
            f"on-demand prices have fallen since; give current prices (price_usd_per_hour, price_date in a hardware file) "
            f"or compare by power")
