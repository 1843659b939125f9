"""What the capacity model, the search and the simulator need from a perf model: the
analytic roofline (`perf.roofline.Instance`) and the measured tables
(`perf.table.MeasuredInstance`, `SplitwiseSimInstance`) implement it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

if TYPE_CHECKING:
    from splitplan.perf.roofline import Fit, Latency
    from splitplan.specs.engine import EngineFactors, EngineProfile
    from splitplan.specs.hardware import HardwareSpec
    from splitplan.specs.layout import Layout
    from splitplan.specs.model import ModelSpec

FloatArray: TypeAlias = NDArray[np.float64]
# A time in seconds: a float for scalar arguments, an array of one per element for array arguments.
Seconds: TypeAlias = float | FloatArray


@runtime_checkable
class PerfModel(Protocol):
    """One model instance (a model in a parallel layout on `layout.gpus` GPUs, of one machine
    or several): its memory facts and the time of any forward pass. Times take numpy arrays
    (or floats) and return the same shape."""

    @property
    def model(self) -> ModelSpec: ...

    @property
    def hardware(self) -> HardwareSpec: ...

    @property
    def engine(self) -> EngineProfile: ...

    @property
    def layout(self) -> Layout: ...

    @property
    def tp(self) -> int: ...

    @property
    def measured(self) -> bool:
        """Timing from measurements: lookups outside them are counted (`queries`, `extrapolated`)."""

    @property
    def queries(self) -> Mapping[str, int]:
        """Lookups per phase ("prefill", "decode"); always empty counts for an analytic model."""

    @property
    def extrapolated(self) -> Mapping[str, int]:
        """Of those, the lookups outside the measurements."""

    @property
    def fit(self) -> Fit: ...

    @property
    def factors(self) -> EngineFactors: ...

    @property
    def unit_machines(self) -> int: ...

    @property
    def unit_instances(self) -> int: ...

    @property
    def max_request_tokens(self) -> int: ...

    @property
    def kv_link_bytes_per_s(self) -> float: ...

    @property
    def kv_bytes_per_token(self) -> float: ...

    def instances_on(self, machines: int) -> int: ...

    def machines_for(self, instances: int) -> int: ...

    def prefill_time_s(self, prompt_tokens: ArrayLike) -> Seconds: ...

    def decode_step_time_s(self, batch: ArrayLike, context_tokens_per_request: ArrayLike) -> Seconds: ...

    def pass_time_s(self, prefill_seqs: ArrayLike = 0, prefill_tokens: ArrayLike = 0, prefill_sq_tokens: ArrayLike = 0,
                    decode_seqs: ArrayLike = 0, decode_context_tokens: ArrayLike = 0) -> Seconds: ...

    def decode_line(self, batch: int) -> tuple[float, float, float]:
        """A decode step of `batch` requests as `base + C * per_token + max(slack - C * per_token, 0)`
        seconds of their summed context C: (base, per_token, slack)."""

    def explain(self, prompt_tokens: list[int] | None = None, decode_batch: int = 0, decode_context_tokens: int = 0) -> Latency: ...

    def record_decode_steps(self, batch: ArrayLike, context_total: ArrayLike) -> None: ...
