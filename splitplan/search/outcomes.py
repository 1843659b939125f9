"""What an optimize result carries beside its plans, typed: the requests left out of the sizing,
the confidence a plan was sized at, its validation by simulation and its closed loop. Each
`to_json()` is the part of the optimize document it fills."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from splitplan.sim.metrics import SloLineResult


class _Document:
    def to_json(self) -> dict:
        return dataclasses.asdict(self)  # type: ignore[call-overload]  # (every subclass is a dataclass)


@dataclass(frozen=True)
class Unservable(_Document):
    """Requests no instance considered can serve (longer than the context window or any
    instance's KV), left out of the sizing: how many, their share and prompt sizes, and why."""

    requests: int
    share_pct: float
    min_prompt_tokens: int
    max_prompt_tokens: int
    reason: str


@dataclass(frozen=True)
class ConfidenceLine(_Document):
    """One SLO line at a confidence: its target, the latency factor and the limit sized for."""

    line: str
    target: float
    unit: str
    factor: float
    sized_for: float


@dataclass(frozen=True)
class Confidence(_Document):
    """A plan sized so every line holds with latencies `factors` (by metric) times the predicted
    ones: the engine profile's measured error at `quantile`, from `error_source`."""

    quantile: float
    engine: str
    factors: dict[str, float]
    lines: tuple[ConfidenceLine, ...]
    error_source: str


@dataclass(frozen=True)
class SimulatedOutcome(_Document):
    """A plan's simulation as a study keeps it: whether every line was met, and each SLO
    metric's percentiles (ms)."""

    slo_met: bool
    ttft_ms: dict
    tbt_ms: dict
    itl_ms: dict
    tpot_ms: dict
    e2e_ms: dict


@dataclass(frozen=True)
class Validation(_Document):
    """`--validate`: the plan's simulation (each SLO metric's percentiles, ms; each line's
    outcome) once it met the SLO, and the machines validation added (negative: removed by the
    mixed pool's trim)."""

    ttft_ms: dict
    tbt_ms: dict
    itl_ms: dict
    tpot_ms: dict
    e2e_ms: dict
    slo: tuple[SloLineResult, ...]
    machines_added: int


@dataclass(frozen=True)
class ClosedLoopRound(_Document):
    """A round of the closed-loop search: the rate planned, the plan, and its closed loop simulated."""

    planned_rate_rps: float
    plan: str
    cost_usd_per_hour: float
    power_kw: float
    simulated_rate_rps: float
    slo_met: bool


@dataclass(frozen=True)
class ClosedLoop(_Document):
    """A closed loop of `concurrency` clients: the search's rounds and the plan's simulated loop,
    as a serving benchmark reports it (`benchmark`, `slo`, `throughput_rps`, past
    `warmup_requests`), with the machines its trim removed."""

    concurrency: int
    rounds: tuple[ClosedLoopRound, ...]
    benchmark: dict
    slo: tuple[SloLineResult, ...]
    throughput_rps: float
    machines_removed: int
    warmup_requests: int
