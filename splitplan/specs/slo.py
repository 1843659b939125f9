"""SLO profiles: per metric and percentile (pXX), an absolute limit (`max_ms`) or a slowdown
factor against a reference (machine, TP) running the request alone (`slowdown`). Metrics:
`ttft`; `tbt`, Splitwise's per-request (E2E - TTFT) / output; `itl`, every gap between
consecutive tokens (percentiles over all gaps of all requests), and `tpot`, per request
(E2E - TTFT) / (output - 1), as serving benchmarks state them (absolute limits only); `e2e`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from splitplan.base.errors import SpecError
from splitplan.specs._load import load_named
from splitplan.specs.catalog import per_catalog
from splitplan.specs.hardware import load_hardware

_PCT = re.compile(r"^p(\d+(?:\.\d+)?)$")
METRICS = ("ttft", "tbt", "itl", "tpot", "e2e")
ABSOLUTE_ONLY = ("itl", "tpot")  # no alone-latency reference to divide by


class Limit(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    max_ms: Annotated[float, Field(gt=0)] | None = None
    slowdown: Annotated[float, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _one(self) -> Limit:
        if (self.max_ms is None) == (self.slowdown is None):
            raise ValueError("give exactly one of max_ms or slowdown")
        return self


class Reference(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    hardware: str
    tp: Annotated[int, Field(ge=1)]


class SloProfile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    description: str = ""
    reference: Reference | None = None
    ttft: dict[str, Limit] = {}
    tbt: dict[str, Limit] = {}
    itl: dict[str, Limit] = {}
    tpot: dict[str, Limit] = {}
    e2e: dict[str, Limit] = {}

    @model_validator(mode="before")
    @classmethod
    def _limits_are_mappings(cls, data):
        """A bare number (`ttft: {p99: 2000}`) could mean milliseconds or a slowdown: refused with
        the two ways to write it."""
        for metric in METRICS:
            limits = data.get(metric) if isinstance(data, dict) else None
            for key, value in (limits.items() if isinstance(limits, dict) else ()):
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    raise ValueError(f"{metric}.{key}: write the limit as {{max_ms: {value:g}}} (milliseconds) or "
                                     f"{{slowdown: {value:g}}} (against the profile's reference)")
        return data

    @model_validator(mode="after")
    def _percentiles(self) -> SloProfile:
        for metric in METRICS:
            for key, limit in getattr(self, metric).items():
                match = _PCT.match(key)
                if not match or not 0 < float(match.group(1)) < 100:
                    raise ValueError(f"{metric}.{key}: percentile keys look like p50, p99 or p99.9, strictly between 0 and 100")
                if limit.slowdown is not None and metric in ABSOLUTE_ONLY:
                    raise ValueError(f"{metric}.{key}: {metric} limits are absolute; write {{max_ms: N}}")
                if limit.slowdown is not None and self.reference is None:
                    raise ValueError(f"{metric}.{key}: a slowdown limit needs 'reference: {{hardware, tp}}'")
        if not self.lines():
            raise ValueError("no limits: give at least one of ttft, tbt, itl, tpot, e2e")
        return self

    def lines(self) -> list[SloLine]:
        out = []
        for metric in METRICS:
            for key, limit in getattr(self, metric).items():
                out.append(SloLine(metric, float(key[1:]), limit.max_ms, limit.slowdown))
        return sorted(out, key=lambda x: (METRICS.index(x.metric), x.percentile))


def tightened(profile: SloProfile, factors: dict[str, float]) -> SloProfile:
    """The profile with each metric's limits divided by its factor (>= 1): a plan meeting these
    meets the original when its latencies are that many times the predicted ones. (A slowdown
    may fall below 1: the result is not validated again.)"""
    def cut(limit: Limit, factor: float) -> Limit:
        return Limit.model_construct(max_ms=None if limit.max_ms is None else limit.max_ms / factor,
                                     slowdown=None if limit.slowdown is None else limit.slowdown / factor)
    return profile.model_copy(update={m: {k: cut(v, factors.get(m, 1.0)) for k, v in getattr(profile, m).items()} for m in METRICS})


@dataclass(frozen=True)
class SloLine:
    metric: str
    percentile: float
    max_ms: float | None
    slowdown: float | None

    @property
    def label(self) -> str:
        return f"{self.metric.upper()} p{self.percentile:g}"

    @property
    def limit(self) -> float:
        """The limit in the line's unit: milliseconds, or a factor of the reference."""
        limit = self.max_ms if self.max_ms is not None else self.slowdown
        assert limit is not None  # (a line sets exactly one of the two: checked when it is read)
        return limit

    @property
    def unit(self) -> str:
        """`ms` for an absolute limit; `x` (times the request's latency alone on the
        reference instance) for a slowdown."""
        return "ms" if self.max_ms is not None else "x"

    @property
    def target(self) -> str:
        """The limit as text: `<= 500 ms`, `<= 2x`."""
        return f"<= {self.limit:g} ms" if self.unit == "ms" else f"<= {self.limit:g}x"

    @classmethod
    def from_json(cls, entry: dict) -> SloLine:
        """The line of a JSON SLO entry (`metric`, `percentile`, `target`, `unit`)."""
        ms = entry["unit"] == "ms"
        return cls(entry["metric"], entry["percentile"], entry["target"] if ms else None, None if ms else entry["target"])

    def text(self, value: float | None) -> str:
        """An achieved value with its unit: `432 ms`, `1.43x` (`-` when there is none)."""
        if value is None:
            return "-"
        return f"{value:,.4g} ms" if self.unit == "ms" else f"{value:.3g}x"


@per_catalog(maxsize=256)
def load_slo(name_or_path: str) -> SloProfile:
    profile, path = load_named(SloProfile, "slo_profiles", name_or_path, "SLO profile")
    if profile.reference is not None:

        try:
            load_hardware(profile.reference.hardware)
        except SpecError as exc:
            raise SpecError(f"{path}: reference.hardware: {exc}") from None
    return profile

