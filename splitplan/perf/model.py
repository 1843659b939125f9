"""What the capacity model, the search and the simulator need from a perf model: the
analytic roofline (`perf.roofline.Instance`) and the measured tables
(`perf.table.MeasuredInstance`, `SplitwiseSimInstance`) implement it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from splitplan.perf.roofline import Fit, Latency
    from splitplan.specs.engine import EngineFactors, EngineProfile
    from splitplan.specs.hardware import HardwareSpec
    from splitplan.specs.layout import Layout
    from splitplan.specs.model import ModelSpec


@runtime_checkable
class PerfModel(Protocol):
    """One model instance (a model in a parallel layout on `layout.gpus` GPUs, of one machine
    or several): its memory facts and the time of any forward pass. Times take numpy arrays."""

    model: ModelSpec
    hardware: HardwareSpec
    engine: EngineProfile
    tp: int
    measured: bool  # timing from measurements: lookups outside them are counted

    @property
    def fit(self) -> Fit: ...

    @property
    def factors(self) -> EngineFactors: ...

    layout: Layout

    @property
    def instances_per_machine(self) -> float: ...

    @property
    def unit_machines(self) -> int: ...

    @property
    def unit_instances(self) -> int: ...

    @property
    def max_request_tokens(self) -> int: ...

    @property
    def kv_link_bytes_per_s(self) -> float: ...

    def instances_on(self, machines) -> int: ...

    def machines_for(self, instances: int) -> int: ...

    def prefill_time_s(self, prompt_tokens): ...

    def decode_step_time_s(self, batch, context_tokens_per_request): ...

    def pass_time_s(self, prefill_seqs=0, prefill_tokens=0, prefill_sq_tokens=0, decode_seqs=0, decode_context_tokens=0): ...

    def decode_line(self, batch: int) -> tuple[float, float, float]: ...

    def explain(self, prompt_tokens=None, decode_batch: int = 0, decode_context_tokens: int = 0) -> Latency: ...

    def record_decode_steps(self, batch, context_total) -> None: ...
