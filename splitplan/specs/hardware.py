"""Machine types: one YAML per machine in `hardware_specs/`.

Data files use human units with the unit in the key (TFLOP/s, GB, TB/s, Gbit/s, W);
the properties below convert once to SI (`_flops_per_s`, `_bytes`, `_bytes_per_s`).
Every figure carries a source and a date.
"""

from __future__ import annotations

import functools
import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from splitplan.errors import SpecError
from splitplan.specs._load import load_named
from splitplan.specs.catalog import catalog_names

_STRICT = ConfigDict(frozen=True, extra="forbid")
Frac = Annotated[float, Field(gt=0, le=1)]
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

    @model_validator(mode="after")
    def _power_order(self) -> "GpuSpec":
        if self.idle_w >= self.tdp_w:
            raise ValueError(f"idle_w ({self.idle_w}) must be below tdp_w ({self.tdp_w})")
        if self.decode_w is not None and not self.idle_w <= self.decode_w <= self.tdp_w:
            raise ValueError("decode_w must lie between idle_w and tdp_w")
        return self


class HardwareSpec(BaseModel):
    """A machine type: GPUs, network, price and power."""

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

    @model_validator(mode="after")
    def _cap_consistent(self) -> "HardwareSpec":
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
    def peak_flops_per_s(self, dtype: str) -> float:
        """Dense peak per GPU for `dtype` (bf16, fp8 or fp4); fp8 falls back to bf16 if absent
        (fp8 then runs at bf16 speed), fp4 has no fallback (see `has_tensor_cores`)."""
        tflops = {"fp8": self.gpu.fp8_tflop_per_s, "fp4": self.gpu.fp4_tflop_per_s}.get(dtype) or self.gpu.bf16_tflop_per_s
        return tflops * 1e12

    def has_tensor_cores(self, dtype: str) -> bool:
        """Whether the GPU computes in `dtype` natively (fp4 needs them: no fallback is modelled)."""
        return dtype != "fp4" or self.gpu.fp4_tflop_per_s is not None

    @property
    def memory_bytes_per_gpu(self) -> float:
        return self.gpu.memory_gb * 1e9

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


@functools.lru_cache(maxsize=256)
def load_hardware(name_or_path: str) -> HardwareSpec:
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
