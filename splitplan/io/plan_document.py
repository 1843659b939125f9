"""plan.json, the one plan document: written by `optimize --output-dir` (the per-window plans of
`--window` too) and read by `simulate --plan`, `sweep --plan` and `export`.

Typed and checked whole before anything uses it: counts are integers (JSON `2.7` or `true` is
refused, never truncated), a pool's `tp/dp/ep/pp` agree with its `layout`, pools are unique per
(role, hardware, layout), a plan is split (prompt and token pools) or co-located (mixed pools),
never a mix, and `splitplan.base.limits` bounds it. A plan carries the specs it was made with (`specs`:
the resolved hardware, model, engine and SLO entries with their SHA-256), so it simulates and
exports without the `--catalog` it was made with; a catalog entry that changed since is reported
(`Plan.notes`) and the plan's copy is used.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from splitplan.base import limits
from splitplan.base.defaults import MAX_BATCH_TOKENS
from splitplan.base.errors import SpecError, SplitplanError
from splitplan.base.inputs import excerpt, parse_document, read_text
from splitplan.specs.catalog import Catalog, current
from splitplan.specs.layout import MAX_GPUS, Layout, parse_layout
from splitplan.specs.roles import Pool, Role

READS = (2, 3)
ROLES = ("prompt", "token", "mixed")

_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)
Count = Annotated[int, Field(ge=1, le=limits.MAX_MACHINES)]
Degree = Annotated[int, Field(ge=1, le=MAX_GPUS)]
Name = Annotated[str, Field(min_length=1, max_length=200)]


class PlanPool(BaseModel):
    """`machines` machines of `hardware`, instances in the layout `tp/dp/ep/pp` (= `layout`)."""

    model_config = _STRICT
    hardware: Name
    tp: Degree
    dp: Degree = 1
    ep: Degree = 1
    pp: Degree = 1
    layout: Annotated[str, Field(max_length=64)] | None = None
    machines: Count
    instances: Annotated[int, Field(ge=1, le=limits.MAX_MACHINES * MAX_GPUS)] | None = None  # (as planned)
    gpus: Annotated[int, Field(ge=1, le=limits.MAX_MACHINES * MAX_GPUS)] | None = None
    utilization: Annotated[float, Field(ge=0, le=1)] | None = None
    prefix_hit_rate: Annotated[float, Field(ge=0, le=1)] | None = None
    spare_instances: Annotated[int, Field(ge=0, le=limits.MAX_MACHINES * MAX_GPUS)] = 0  # beyond what the load needs
    # Machines shared with the other role's pool of the same number (`instances` its part of them).
    shared: Annotated[int, Field(ge=0, le=limits.MAX_PLAN_POOLS)] | None = None

    @property
    def parallel(self) -> Layout:
        return Layout(self.tp, self.dp, self.ep, self.pp)

    @model_validator(mode="after")
    def _agree(self) -> PlanPool:
        layout = self.parallel
        if layout.problem():
            raise ValueError(f"layout {layout.spec}: {layout.problem()}")
        if layout.gpus > MAX_GPUS:
            raise ValueError(f"layout {layout.spec} has {layout.gpus:,} GPUs; an instance has at most {MAX_GPUS:,}")
        if self.layout is not None:
            try:
                written = parse_layout(self.layout, "layout")
            except SpecError as exc:
                raise ValueError(str(exc)) from None
            if written != layout:
                raise ValueError(f"layout '{self.layout}' disagrees with tp {self.tp}, dp {self.dp}, ep {self.ep}, "
                                 f"pp {self.pp} ({layout.spec}); make them one layout")
        return self


class SloRow(BaseModel):
    model_config = _STRICT
    line: str
    metric: str
    percentile: float
    target: float
    unit: str
    achieved: float | None
    met: bool
    attainment_pct: Annotated[float, Field(ge=0, le=100)] | None = None  # (the share of requests within the limit)


class PlanBody(BaseModel):
    """One plan: its pools and what was predicted for it."""

    model_config = _STRICT
    prompt_pools: Annotated[list[PlanPool], Field(max_length=limits.MAX_PLAN_POOLS)] = []
    token_pools: Annotated[list[PlanPool], Field(max_length=limits.MAX_PLAN_POOLS)] = []
    mixed_pools: Annotated[list[PlanPool], Field(max_length=limits.MAX_PLAN_POOLS)] = []
    cost_usd_per_hour: Annotated[float, Field(ge=0)]
    power_kw: Annotated[float, Field(ge=0)]
    machines: Annotated[int, Field(ge=1, le=limits.MAX_MACHINES)]
    gpus: Annotated[int, Field(ge=1, le=limits.MAX_MACHINES * MAX_GPUS)] | None = None
    cost_usd_per_million_tokens: Annotated[float, Field(ge=0)] | None = None
    cost_usd_per_million_output_tokens: Annotated[float, Field(ge=0)] | None = None
    energy_kwh_per_million_tokens: Annotated[float, Field(ge=0)] | None = None
    energy_kwh_per_million_output_tokens: Annotated[float, Field(ge=0)] | None = None
    predicted: dict[str, dict[str, float | None]]
    slo: list[SloRow]
    binding: str
    max_rate_rps: float | None = None
    max_rate_simulated: dict[str, Any] | None = None  # (--pareto --validate)
    simulated: dict[str, Any] | None = None  # (--validate)
    cliff: Annotated[list[dict[str, Any]], Field(max_length=limits.MAX_PLAN_POOLS)] = []  # (one instance fewer per pool)

    def pools(self) -> list[tuple[str, PlanPool]]:
        return [(role, p) for role in ROLES for p in getattr(self, f"{role}_pools")]

    @model_validator(mode="after")
    def _one_plan(self) -> PlanBody:
        _check_kind(self)
        pools = self.pools()
        seen = set()
        for role, p in pools:
            key = (role, p.hardware, p.parallel, p.shared)
            if key in seen:
                raise ValueError(f"{role} pool {excerpt(p.hardware)}:{p.parallel.spec} is listed twice; "
                                 "give it once with all its machines")
            seen.add(key)
        groups = _shared_groups(pools)
        total = sum(p.machines for _, p in pools if p.shared is None) + sum(parts[0][1].machines for parts in groups.values())
        if total > limits.MAX_MACHINES:
            raise ValueError(f"{total:,} machines; a plan has at most {limits.MAX_MACHINES:,}")
        if total != self.machines:
            raise ValueError(f"machines is {self.machines:,} but its pools hold {total:,}")
        gpus = [p.gpus for _, p in pools if p.gpus is not None]
        if self.gpus is not None and len(gpus) == len(pools) and sum(gpus) != self.gpus:
            raise ValueError(f"gpus is {self.gpus:,} but its pools hold {sum(gpus):,}")
        return self


def _check_kind(body: PlanBody) -> None:
    """A plan is split (prompt and token pools) or co-located (mixed pools), with pools."""
    split, mixed = bool(body.prompt_pools) or bool(body.token_pools), bool(body.mixed_pools)
    if split and mixed:
        raise ValueError("a plan is split (prompt_pools and token_pools) or co-located (mixed_pools), not both")
    if not split and not mixed:
        raise ValueError("the plan has no pools")
    if split and not (body.prompt_pools and body.token_pools):
        missing = "token_pools" if body.prompt_pools else "prompt_pools"
        raise ValueError(f"a split plan needs prompt_pools and token_pools; {missing} is empty")


def _shared_groups(pools: list[tuple[str, PlanPool]]) -> dict[int, list]:
    """The pools by `shared` number, each group one prompt and one token pool on the same machines."""
    groups: dict[int, list] = {}
    for role, p in pools:
        if p.shared is not None:
            groups.setdefault(p.shared, []).append((role, p))
    for number, parts in groups.items():
        roles = sorted(role for role, _ in parts)
        if roles != ["prompt", "token"] or parts[0][1].hardware != parts[1][1].hardware \
                or parts[0][1].machines != parts[1][1].machines or None in (parts[0][1].instances, parts[1][1].instances):
            raise ValueError(f"shared {number}: machines shared by one prompt and one token pool, of one hardware "
                             "and machine count, each giving its instances")
    return groups


class MainPlan(PlanBody):
    alternatives: list[PlanBody] = []
    split_saving_pct: float | None = None
    unservable: dict[str, Any] | None = None
    closed_loop: dict[str, Any] | None = None
    confidence: dict[str, Any] | None = None  # (--confidence: the nominal plan beside it)
    nominal: PlanBody | None = None


class TraceColumns(BaseModel):
    """A generic CSV trace's columns as --time-column, --prompt-column, --output-column and --time-unit named them."""

    model_config = _STRICT
    time: Name
    prompt: Name
    output: Name
    time_unit_s: Annotated[float, Field(gt=0, le=1)]


class Window(BaseModel):
    """The stretch of the workload a plan was sized on: a --window plan's window (`start_s`), or
    the peak stretch of `requests` requests a long trace was cut to; the rest is echo."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)
    start_s: Annotated[float, Field(ge=0, le=limits.MAX_DURATION_S * 1e3)]
    requests: Annotated[int, Field(ge=1, le=limits.MAX_TRACE_REQUESTS)] | None = None


class Inputs(BaseModel):
    """What the plan was made for; the settings a reader uses are typed, the rest is the echo of
    the options it was made with. The workload (trace_file ... window) is what simulate --plan
    and sweep --plan replay unless options say otherwise."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)
    model: Name
    slo: Name
    engine: Name
    max_batch_tokens: Annotated[int, Field(ge=1, le=limits.MAX_REQUEST_TOKENS)] = MAX_BATCH_TOKENS
    max_num_seqs: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    prefix_caching: Literal["on", "off"] | None = None
    routing: Literal["jsq", "round-robin", "prefix-aware"] | None = None
    kv_offload_gb: Annotated[float, Field(ge=0, le=1e6)] | None = None
    trace_file: Annotated[str, Field(min_length=1, max_length=4096)] | None = None  # (None: the default embedded trace)
    trace_columns: TraceColumns | None = None
    rate_rps: Annotated[float, Field(gt=0, le=limits.MAX_RATE_RPS)] | None = None
    duration_s: Annotated[float, Field(gt=0, le=limits.MAX_DURATION_S)] | None = None
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    headroom_pct: Annotated[float, Field(ge=0, le=limits.MAX_HEADROOM_PCT)] | None = None
    window_s: Annotated[float, Field(gt=0, le=limits.MAX_DURATION_S)] | None = None
    window: Window | None = None


class SpecCopy(BaseModel):
    model_config = _STRICT
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    spec: dict[str, Any]


class Specs(BaseModel):
    """The specs a plan was made with, keyed as its pools and inputs name them (the engine by its
    base profile, before any `@weights=...` options)."""

    model_config = _STRICT
    hardware: dict[str, SpecCopy]
    model: dict[str, SpecCopy]
    engine: dict[str, SpecCopy]
    slo: dict[str, SpecCopy]


class PlanDocument(BaseModel):
    model_config = _STRICT
    schema_version: Literal[2, 3]
    inputs: Inputs
    plan: MainPlan
    warnings: list[str] = []
    pareto: list[PlanBody] = []
    power_sources: Annotated[list[dict[str, Any]], Field(max_length=limits.MAX_PLAN_POOLS)] = []  # (the energy figures')
    timed_from: Annotated[list[dict[str, Any]], Field(max_length=limits.MAX_PLAN_POOLS)] = []  # (the latencies': curves or roofline)
    specs: Specs | None = None

    @model_validator(mode="after")
    def _carries_specs(self) -> PlanDocument:
        if self.schema_version >= 3 and self.specs is None:
            raise ValueError("a plan of schema version 3 carries its specs ('specs'); run `splitplan optimize "
                             "--output-dir` again")
        if self.specs is None:
            return self
        named = {"hardware": {p.hardware for plan in (self.plan, *self.plan.alternatives, *self.pareto) for _, p in plan.pools()},
                 "model": {self.inputs.model}, "engine": {_base(self.inputs.engine)}, "slo": {self.inputs.slo}}
        for kind, names in named.items():
            missing = sorted(names - set(getattr(self.specs, kind)))
            if missing:
                raise ValueError(f"specs.{kind} has no copy of {excerpt(missing[0])}, which the plan names; "
                                 "run `splitplan optimize --output-dir` again")
        for name, copy in self.specs.hardware.items():
            if copy.spec.get("name") != name:
                raise ValueError(f"specs.hardware.{excerpt(name)} names itself {excerpt(copy.spec.get('name'))}; "
                                 "a copy is named as the plan names it")
        return self


# --- the kinds of spec a plan carries ------------------------------------------------------

KINDS = {"hardware": "hardware_specs", "model": "model_specs", "engine": "engine_profiles", "slo": "slo_profiles"}


def _loader(kind: str):
    from splitplan.specs.engine import load_engine
    from splitplan.specs.hardware import load_hardware
    from splitplan.specs.model import load_model
    from splitplan.specs.slo import load_slo
    return {"hardware": load_hardware, "model": load_model, "engine": load_engine, "slo": load_slo}[kind]


def digest(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _dump(kind: str, name: str) -> dict:
    """The spec of that kind and name as a plan carries it (what reads back to the same spec)."""
    return _loader(kind)(name).model_dump(mode="json", exclude_defaults=True)


def _copy(kind: str, name: str) -> dict:
    spec = _dump(kind, name)
    return {"sha256": digest(spec), "spec": spec}


def specs_of(inputs: dict, hardware: list[str]) -> dict:
    """The `specs` of a plan made with `inputs` (model, engine, SLO by name or path) on these
    machine types (and the SLO's reference machine)."""
    from splitplan.specs.slo import load_slo
    slo = load_slo(inputs["slo"])
    machines = sorted(set(hardware) | ({slo.reference.hardware} if slo.reference else set()))
    return {"hardware": {h: _copy("hardware", h) for h in machines}, "model": {inputs["model"]: _copy("model", inputs["model"])},
            "engine": {_base(inputs["engine"]): _copy("engine", _base(inputs["engine"]))},
            "slo": {inputs["slo"]: _copy("slo", inputs["slo"])}}


def _base(engine: str) -> str:
    return engine.partition("@")[0]


def with_specs(doc: dict) -> dict:
    """A plan document (`report.optimize_json`, or a window's plan) as plan.json: carrying its
    specs, checked as a reader will check it."""
    plans = (doc["plan"], *doc["plan"].get("alternatives", []), *doc.get("pareto", []))
    hardware = [p["hardware"] for plan in plans for role in ROLES for p in plan.get(f"{role}_pools", [])]
    out = {**doc, "specs": specs_of(doc["inputs"], hardware)}
    try:
        PlanDocument.model_validate(json.loads(json.dumps(out)))  # (as a reader parses it)
    except ValidationError as exc:  # a bug: what optimize writes must read back
        raise AssertionError(f"plan.json would not read back: {exc}") from None
    return out


# --- reading -------------------------------------------------------------------------------

class Plan:
    """A plan.json as read: its pools `(role, hardware, layout, machines, instances, shared)` (the
    last two None but on shared machines), its inputs, notes on the specs it carries (a catalog
    entry that differs from the plan's copy) and the catalog its pools resolve in (the one it was
    read in, with the plan's copies of its specs: `with plan.catalog.active():`)."""

    def __init__(self, doc: PlanDocument, notes: list[str], catalog: Catalog):
        self.document = doc
        self.catalog = catalog
        self.pools = [Pool(Role(role), p.hardware, p.parallel, p.machines,
                                  *((p.instances, p.shared) if p.shared is not None else ()))
                      for role, p in doc.plan.pools()]
        self.inputs = doc.inputs.model_dump()
        self.notes = notes


def read(path: Path, option: str = "--plan") -> Plan:
    """The plan at `path`, checked whole, with the catalog in effect plus the specs it carries
    (`Plan.catalog`: they are used in place of the entries of the same names where it is active).
    SpecError naming `option`, the file and the key."""
    from splitplan.specs._load import validation_message
    where = f"{option} {excerpt(path, 200)}"
    try:
        raw = parse_document(read_text(path, limits.MAX_SPEC_BYTES, "plan.json (splitplan optimize --output-dir DIR)"),
                             path, as_json=True)
    except SpecError as exc:
        raise SpecError(f"{option} {exc}") from None
    missing = [k for k in ("schema_version", "plan") if k not in raw] if isinstance(raw, dict) else ["plan"]
    if missing:
        raise SpecError(f"{where}: not a splitplan plan.json (no '{missing[0]}' key); write one with "
                        "`splitplan optimize --output-dir DIR`")
    version = raw.get("schema_version")
    if type(version) is not int or version not in READS:
        raise SpecError(f"{where}: schema_version {excerpt(version)}; this splitplan reads plans of schema version "
                        f"{' or '.join(map(str, READS))}: run `splitplan optimize --output-dir` again")
    try:
        doc = PlanDocument.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(f"{where}: {validation_message(PlanDocument, exc)}") from None
    return Plan(doc, *_pinned(doc.specs, where)) if doc.specs else Plan(doc, [], current())


def _pinned(specs: Specs, where: str) -> tuple[list[str], Catalog]:
    """Check each carried spec (its SHA-256, that it loads), note where the catalog's entry of
    that name differs; the catalog in effect with the copies in place of its entries."""
    notes, held = [], []
    for kind, copies in specs.model_dump().items():
        for name, copy in copies.items():
            key = f"specs.{kind}.{excerpt(name)}"
            if digest(copy["spec"]) != copy["sha256"]:
                raise SpecError(f"{where}: {key}: the spec is not the one its sha256 names (edited since written); "
                                "run `splitplan optimize --output-dir` again")
            try:
                entry = digest(_dump(kind, name))
            except SplitplanError:
                entry = None  # not in this catalog: the plan's copy is all there is
            if entry is not None and entry != copy["sha256"]:
                notes.append(f"{kind} {excerpt(name)} differs in the catalog from the copy the plan was made with; "
                             "using the plan's copy (re-plan to use the catalog's)")
            spec = copy["spec"]
            if kind == "engine" and "scheduler" not in spec:  # written before schedulers were named: whole prompts first
                spec = {**spec, "scheduler": "prefill-priority"}
            held.append((kind, name, spec, f"{where}#{key}"))
    with current().with_pins([(KINDS[kind], name, spec, origin) for kind, name, spec, origin in held]).active() as pins:
        for kind, name, _, _ in held:
            _loader(kind)(name)
    return notes, pins
