"""Pool options -> sized options -> ILP or exhaustive grid -> a verified Plan.

1. Options are (machine type, parallel layout, role); those the model does not fit are kept
   with the reason. Each option is sized alone on the trace (capacity.pools):
   n*(o) instances, and the SLO line that decided n*.
2. The ILP (modelled in PuLP, solved by HiGHS or CBC) picks integer unit counts x_o (a unit: one machine, or the machines
   one instance spans): minimize cost or power
   subject to sum_o x_o * instances_per_unit_o / n*(o) >= 1 for the prompt and
   the token role (mixes within a pool allowed), budgets and availability.
   `grid` enumerates the same integer space exhaustively (the paper's method).
3. The chosen plan is evaluated on the trace as a whole (mixed pools, KV
   transfer, E2E); while a line fails, one machine is added to the role that
   line depends on (the option with the lowest cost per unit of capacity; a whole unit) and
   the plan is evaluated again. Pooling is not linear, so this repair is what
   makes the reported plan honest.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import NamedTuple, cast

import numpy as np

from splitplan.base.defaults import MAX_BATCH_TOKENS
from splitplan.base.errors import InfeasibleError, listed, with_details
from splitplan.capacity.pools import (
    MAX_INSTANCES,
    BatchTimes,
    busy_s,
    colocated_estimate,
    colocated_pool,
    decode_pool,
    prompt_queue_ttft_s,
    replay_prompts,
    smallest_count,
)
from splitplan.perf.roofline import Instance, kv_transfer_time_s
from splitplan.perf.slo import Gaps, Reference, achieved, alone_latencies, attainment_pct, meets
from splitplan.sim.metrics import energy_per_million_tokens, gpu_energy_j
from splitplan.sim.prefix_cache import PrefixModel
from splitplan.specs.layout import Layout
from splitplan.specs.roles import SPLIT, Pool, Role
from splitplan.specs.slo import METRICS, SloLine, SloProfile
from splitplan.workload.trace import Trace


class OptionKey(NamedTuple):
    """Which option: a role, a machine type and a parallel layout."""

    role: Role
    hardware: str
    layout: Layout


@dataclass(frozen=True)
class Option:
    """One pool option, sized alone on the trace."""

    role: Role
    inst: Instance
    instances: int | None  # n*: None when the option cannot meet the SLO at any size
    binding: str
    skipped: str = ""  # why the option is not usable
    simulated: bool = False  # co-located: sized by the simulator's replay (else by its estimate)

    @property
    def key(self) -> OptionKey:
        return OptionKey(self.role, self.inst.hardware.name, self.inst.layout)

    @property
    def needed(self) -> int:
        """n*, for an option that meets the SLO at some size (the only ones a plan uses)."""
        if self.instances is None:
            raise ValueError(f"{self.key} has no size: {self.skipped}")
        return self.instances

    @property
    def machines_alone(self) -> int:
        return self.inst.machines_for(self.needed)

    @property
    def price_usd_per_hour(self) -> float:
        return self.inst.hardware.price_usd_per_hour

    @property
    def power_kw(self) -> float:
        return self.inst.hardware.provisioned_power_w / 1e3


SHARED = "shared"  # the role of a machine holding prefill and decode instances together


class ComboKey(NamedTuple):
    """Which shared machine: one of `hardware` holding `prompt_instances` prompt instances in
    `prompt_layout` and `token_instances` token instances in `token_layout`."""

    role: str  # SHARED (first, so that keys of both kinds sort together)
    hardware: str
    prompt_layout: Layout
    prompt_instances: int
    token_layout: Layout
    token_instances: int


@dataclass(frozen=True)
class Combo:
    """Prefill and decode on one machine: a machine of the prompt option's type filled by
    `prompt_instances` of its instances and `token_instances` of the token option's (the same
    machine type), their KV over the machine's GPU links. Each machine covers prompt_instances /
    n*(prompt) of the prompt load and token_instances / n*(token) of the token load."""

    prompt: Option
    token: Option
    prompt_instances: int
    token_instances: int
    role = SHARED
    binding = ""
    skipped = ""
    simulated = False

    def part(self, role: Role) -> tuple[Option, int]:
        """The option of `role` (prompt or token) and its instances on one machine."""
        return (self.prompt, self.prompt_instances) if role == Role.PROMPT else (self.token, self.token_instances)

    @property
    def key(self) -> ComboKey:
        return ComboKey(SHARED, self.prompt.inst.hardware.name, self.prompt.inst.layout, self.prompt_instances,
                        self.token.inst.layout, self.token_instances)

    @property
    def inst(self):
        """The prompt instance: the machine type (and a whole machine per unit) is its."""
        return self.prompt.inst

    @property
    def instances(self) -> int:
        return self.prompt_instances + self.token_instances

    @property
    def machines_alone(self) -> int:
        """The most machines a plan could want: enough for either role alone."""
        return max(math.ceil(self.prompt.needed / self.prompt_instances),
                   math.ceil(self.token.needed / self.token_instances))

    @property
    def price_usd_per_hour(self) -> float:
        return self.prompt.price_usd_per_hour

    @property
    def power_kw(self) -> float:
        return self.prompt.power_kw


AnyKey = OptionKey | ComboKey  # a pool option's key, or a shared machine's
AnyOption = Option | Combo  # what the ILP counts machines of


def combos(options: list[Option]) -> list[Combo]:
    """Every way to fill one machine with instances of a usable prompt option and a usable token
    option of its type (each instance within the machine, at least one of each role, no GPU idle)."""
    usable = [o for o in options if o.instances and o.role in SPLIT and o.inst.layout.gpus < o.inst.hardware.gpus_per_machine]
    out = []
    for p in usable:
        for t in usable:
            if p.role != Role.PROMPT or t.role != Role.TOKEN or p.inst.hardware.name != t.inst.hardware.name:
                continue
            gpus, gp, gt = p.inst.hardware.gpus_per_machine, p.inst.layout.gpus, t.inst.layout.gpus
            out += [Combo(p, t, kp, (gpus - kp * gp) // gt) for kp in range(1, gpus // gp)
                    if (gpus - kp * gp) % gt == 0 and gpus - kp * gp >= gt]
    return out


@dataclass(frozen=True)
class SizedPool:
    """A pool of a plan, as the planner sized it: `machines` machines of `hardware` holding `instances` instances in `layout` (`gpus` GPUs
    bought); `utilization`, where predicted or simulated, is the busy fraction of its instances
    (time running an iteration / instances x the trace's first arrival to its last finish);
    `prefix_hit_rate`, with prefix caching, the share of its prompt tokens its caches held. A
    pool is the same pool whatever its utilization."""

    hardware: str
    layout: Layout
    machines: int
    instances: int = field(compare=False)
    gpus: int = field(compare=False)
    utilization: float | None = field(default=None, compare=False)
    prefix_hit_rate: float | None = field(default=None, compare=False)
    spare_instances: int = field(default=0, compare=False)  # instances beyond what the load needs (--spare, whole-machine rounding)
    # Machines shared with the other role's pool of the same number: `machines` is theirs too,
    # `instances` this pool's part of them and `gpus` that part's GPUs (None: machines of its own).
    shared: int | None = None

    @classmethod
    def of(cls, hardware: str, gpus_per_machine: int, layout: Layout, machines: int,
           utilization: float | None = None, prefix_hit_rate: float | None = None, spare_instances: int = 0) -> SizedPool:
        return cls(hardware, layout, machines, layout.instances_on(machines, gpus_per_machine),
                   machines * gpus_per_machine, utilization, prefix_hit_rate, spare_instances)

    @classmethod
    def part(cls, hardware: str, layout: Layout, machines: int, instances: int, shared: int,
             utilization: float | None = None, prefix_hit_rate: float | None = None, spare_instances: int = 0) -> SizedPool:
        """One role's part of `machines` shared machines: `instances` instances in `layout`."""
        return cls(hardware, layout, machines, instances, instances * layout.gpus, utilization, prefix_hit_rate,
                   spare_instances, shared)

    @property
    def tp(self) -> int:
        return self.layout.tp

    def pool(self, role: Role) -> Pool:
        """This pool, in `role`, as the simulator and exports take it."""
        return Pool(role, self.hardware, self.layout, self.machines, *((self.instances, self.shared) if self.shared is not None else ()))


@dataclass(frozen=True)
class Plan:
    prompt_pools: tuple[SizedPool, ...]
    token_pools: tuple[SizedPool, ...]
    mixed_pools: tuple[SizedPool, ...]
    cost_usd_per_hour: float
    power_kw: float
    predicted: dict = field(default_factory=dict)  # metric -> {p50, p90, p99} in ms
    slo: tuple = ()  # (line, achieved, met)
    binding: str = ""
    repairs: int = 0
    max_rate_rps: float | None = None  # on the Pareto frontier: the highest rate these machines serve
    max_rate_simulated: dict | None = None  # with --validate: the simulation at max_rate_rps (slo_met, slo)
    cost_usd_per_million_tokens: float | None = None  # prompt and output tokens, at the trace's rate
    cost_usd_per_million_output_tokens: float | None = None
    energy_kwh_per_million_tokens: float | None = None  # the GPUs' energy (sim.metrics' power model), at the trace's rate
    energy_kwh_per_million_output_tokens: float | None = None
    attainment_pct: tuple[float, ...] = ()  # per SLO line (as `slo`): the share of requests (ITL: gaps) within its limit
    cliff: tuple[dict, ...] = ()  # per pool: the SLO with one instance fewer in service (`cliff`); the chosen plan's only

    @property
    def pools(self) -> tuple[SizedPool, ...]:
        return self.prompt_pools + self.token_pools + self.mixed_pools

    @property
    def machines(self) -> int:
        return sum(p.machines for p in bought(self.pools))

    def by_role(self) -> list[tuple[Role, SizedPool]]:
        """Each pool with its role: prompt, token, then mixed."""
        return [(role, p) for role, pools in ((Role.PROMPT, self.prompt_pools), (Role.TOKEN, self.token_pools),
                                              (Role.MIXED, self.mixed_pools)) for p in pools]

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)


def bought(pools) -> list:
    """The pools whose machines are bought: each with machines of its own, and one part of each
    group of shared machines (its parts list the same machines)."""
    return [p for p in pools if p.shared is None] + list({p.shared: p for p in pools if p.shared is not None}.values())


@dataclass(frozen=True)
class MachineCap:
    """--max-machines: at most `machines` machines of `hardware` (a machine type, whose smaller
    shapes count as their share of its GPUs, or one shape) are available."""

    hardware: str
    machines: int
    gpus_per_machine: int  # the named machine's

    def share(self, hw) -> float:
        """What one machine of `hw` (a HardwareSpec) takes of the cap, in machines of `hardware`."""
        named = hw.name == self.hardware or hw.family == self.hardware
        return hw.gpus_per_machine / self.gpus_per_machine if named else 0.0


@dataclass(frozen=True)
class Problem:
    trace: Trace
    slo: SloProfile
    reference: Reference | None
    max_batch_tokens: int = MAX_BATCH_TOKENS  # the scheduler's token budget
    objective: str = "cost"
    max_cost_per_hour: float | None = None
    max_power_kw: float | None = None
    max_machines: tuple[MachineCap, ...] = ()
    solver: str = "highs"  # the ILP's solver: highs (HiGHS as SciPy ships it) or cbc (the CBC PuLP 3 bundles)
    max_num_seqs: int | None = None  # requests running on one instance at once (None: no cap)
    chunked: bool = False  # the engine's scheduler: chunked prefill (else whole prompts first)
    prefix: PrefixModel | None = None  # the engine's prefix caching over the trace's prefixes (None: off, or none recorded)
    load_factor: float = 1.0  # the trace's load over the load it stands for (headroom): per-token figures at the latter
    spare_instances: int = 0  # instances each pool keeps beyond what the load needs


def _lines(problem: Problem, metric: str) -> list[SloLine]:
    return [x for x in problem.slo.lines() if x.metric == metric]


def _first_failing(problem: Problem, metric: str, values: np.ndarray | Gaps) -> SloLine | None:
    for line in _lines(problem, metric):
        if not meets(line, achieved(line, values, problem.reference)):
            return line
    return None


def _decode_values(problem: Problem, inst: Instance, n: int, src: Instance, start_s: np.ndarray, idx=slice(None),
                   local: tuple[Instance, float] | None = None):
    """TBT, decode seconds (KV transfer included) and the decode pool's result of the requests
    `idx` on `n` token instances `inst`, their KV from `src`; with `local` (a prompt instance and a
    share), that share of them (spread deterministically) prefilled on their token instance's
    machine, their KV over its GPU links."""
    t = problem.trace
    p, o = t.prompt_tokens[idx], t.output_tokens[idx]
    result = decode_pool(start_s, p, o, inst, n)
    transfer = kv_transfer_time_s(src, inst, p)
    if local is not None:
        mine = (np.arange(len(p)) * 0.41421356237309503) % 1.0 < local[1]
        transfer = np.where(mine, kv_transfer_time_s(local[0], inst, p, local=True), transfer)
    decode_s = transfer + np.maximum(o - 1, 0) * result.step_s
    return decode_s / o, decode_s, result


def _decode_gaps(o: np.ndarray, decode_s: np.ndarray, step_s: np.ndarray, busy: np.ndarray | float,
                 deferred: bool = False) -> tuple[Gaps, np.ndarray]:
    """The predicted inter-token gaps and TPOT of decoding requests: the first gap carries the
    KV transfer (decode_s - (o - 2) steps) and, where the KV lands while its instance runs an
    iteration (the instance's busy fraction `busy` of the requests), the wait for that
    iteration's end (uniform over a step; both spread deterministically over the requests) and,
    with async scheduling (`deferred`), for the one already scheduled behind it;
    each later gap is the request's mean step (its variation within a request is not
    modelled). TPOT = decode_s / (o - 1), NaN for o = 1."""
    many = o > 1
    k = np.arange(len(o))
    waits = ((k * 0.7548776662466927) % 1.0 < busy) * ((k * 0.5698402909980532) % 1.0 + deferred) * step_s
    first = decode_s - np.maximum(o - 2, 0) * step_s + waits
    gaps = Gaps(np.concatenate([first[many], step_s[many]]), np.concatenate([np.ones(int(many.sum())), (o - 2)[many]]))
    with np.errstate(divide="ignore", invalid="ignore"):
        return gaps, np.where(many, decode_s / (o - 1), np.nan)


def _fails_alone(problem: Problem, role: Role, inst: Instance) -> tuple[SloLine, str] | None:
    """The first line an option misses even running requests alone and why (its value), or None."""
    alone = alone_latencies(inst, problem.trace.prompt_tokens, problem.trace.output_tokens)  # more instances only approach these
    for metric in ("tbt", "itl", "tpot") if role == Role.TOKEN else METRICS:
        for line in _lines(problem, metric):
            value = achieved(line, alone.value(metric), problem.reference)
            if not meets(line, value):
                return line, f"{line.label} not met even running requests alone ({line.text(value)} at best, target {line.target})"
    return None


def _busy_guess(inst: Instance, t: Trace) -> int:
    """Where the count search starts: the instances the prefill work keeps busy on
    average (a guess, not a bound: a short or bursty trace may need fewer or more)."""
    work = float(np.sum(inst.prefill_time_s(t.prompt_tokens)))
    return max(1, min(len(t), math.ceil(work / max(t.span_s, 1e-9))))


def size_option(problem: Problem, role: Role, inst: Instance, lower: int = 1, guess: int | None = None) -> Option:
    """n*(o) for one option alone, and the line that decided it. `lower` is a known
    lower bound on n* (a co-located pool needs at least the prompt pool's count); `guess`, where
    the count search starts (None: the instances the prefill work keeps busy)."""
    if not inst.fit.fits:
        return Option(role, inst, None, "", inst.fit.reason)
    t = problem.trace
    if role == Role.PROMPT and int(np.max(t.prompt_tokens)) > inst.max_request_tokens:  # (the simulator's rule too)
        return Option(role, inst, None, "KV memory", "the longest prompt's KV exceeds one instance's KV capacity"
                      + (" (of one attention DP group)" if inst.layout.dp > 1 else ""))
    if role == Role.PROMPT:
        batch_times = [BatchTimes(inst, t.prompt_tokens)]

        def failing(n):
            ttft = prompt_queue_ttft_s(t.arrival_s, t.prompt_tokens, [(inst, n)], problem.max_batch_tokens, batch_times,
                                       chunked=problem.chunked, max_seqs=problem.max_num_seqs, prefix=problem.prefix)
            scores[n] = _excess(problem, {"ttft": ttft})
            return _first_failing(problem, "ttft", ttft)
        alone = _first_failing(problem, "ttft", np.asarray(inst.prefill_time_s(t.prompt_tokens)) + inst.engine.frontend_latency_s)
        if alone is not None:
            return Option(role, inst, None, alone.label, f"{alone.label} not met even without queueing")
    elif int(np.max(t.prompt_tokens + t.output_tokens)) > inst.max_request_tokens:
        return Option(role, inst, None, "KV memory", "the longest request's KV exceeds one instance's KV capacity"
                      + (" (of one attention DP group)" if inst.layout.dp > 1 else ""))
    elif (alone_miss := _fails_alone(problem, role, inst)) is not None:
        return Option(role, inst, None, alone_miss[0].label, alone_miss[1])
    elif role == Role.TOKEN:
        def failing(n):
            tbt, decode_s, res = _decode_values(problem, inst, n, inst, t.arrival_s)
            itl, tpot = _decode_gaps(t.output_tokens, decode_s, res.step_s, min(res.mean_batch, 1.0), inst.engine.async_scheduling)
            reached = [(line, achieved(line, values, problem.reference))
                       for metric, values in (("tbt", tbt), ("itl", itl), ("tpot", tpot)) for line in _lines(problem, metric)]
            scores[n] = max([value / line.limit for line, value in reached]
                            + [res.kv_peak_fraction, res.batch_p99 / problem.max_num_seqs if problem.max_num_seqs else 0.0])
            missed = next((line for line, value in reached if not meets(line, value)), None)
            if missed is not None:
                return missed
            if res.kv_peak_fraction > 1:
                return "KV memory"
            return "max_num_seqs" if problem.max_num_seqs and res.batch_p99 > problem.max_num_seqs else None
    else:  # mixed: one pool runs both phases; estimated here, the best simulated (colocated_plan)
        memo: dict = {}

        def failing(n):
            values = colocated_estimate(t.arrival_s, t.prompt_tokens, t.output_tokens, inst, n, problem.max_batch_tokens, memo,
                                        problem.chunked, problem.max_num_seqs)
            scores[n] = _excess(problem, values)
            return _mixed_failing(problem, values)
    scores: dict[int, float] = {}  # (how far each count checked is from holding: where the search is aimed, smallest_count's score)
    failing = functools.cache(failing)  # (the bisection has usually tried n - 1, which names the binding line)
    n = smallest_count(lambda k: failing(k) is None, lower, guess or (_busy_guess(inst, t) if role != Role.TOKEN else None),
                       score=scores.get)
    if n is None:
        missed = failing(MAX_INSTANCES)  # (the walk's last check: more instances only approach this)
        label = getattr(missed, "label", missed)
        return Option(role, inst, None, label, f"{label} not met at any size (checked up to {MAX_INSTANCES:,} instances)")
    binding = failing(n - 1) if n > 1 else None
    if binding is None and n > 1:  # n came from the lower bound: the bound is what binds
        binding = "prompt-pool size (lower bound)"
    label = binding if isinstance(binding, str) else (binding.label if binding else "minimum size (1 instance)")
    return Option(role, inst, n, label)


def _excess(problem: Problem, values: dict) -> float:
    """How far a pool's values (by metric, and its KV peak where known) are from holding every
    line, smooth in its count: the largest, over the lines, of the share of requests (or gaps)
    past the line's limit over the share its percentile allows (at most 1 where the line holds,
    near enough), and the KV peak over the KV held."""
    worst = float(values.get("kv_peak_fraction", 0.0))
    for line in problem.slo.lines():
        if line.metric in values:
            outside = 100.0 - attainment_pct(line, values[line.metric], problem.reference)
            worst = max(worst, outside / max(100.0 - line.percentile, 1e-3))
    return worst


def _mixed_failing(problem: Problem, values: dict):
    """The first line a co-located pool's values miss (or "KV memory"), None when all hold."""
    for metric in METRICS:
        line = _first_failing(problem, metric, values[metric])
        if line is not None:
            return line
    return "KV memory" if values["kv_peak_fraction"] > 1 else None


def _colocated_values(problem: Problem, key: OptionKey, inst: Instance, instances: int) -> dict:
    """`evaluate`'s values of a co-located pool of `instances` instances: the simulator's replay."""
    values = colocated_pool(problem.trace, inst, instances, problem.max_batch_tokens, problem.max_num_seqs, problem.prefix)
    return {**values, "utilization": {key: values["utilization"]}, "prefix_hit_rate": {key: values["prefix_hit_rate"]}}


def simulated_option(problem: Problem, option: Option, replays: dict | None = None) -> Option:
    """A co-located option sized by the simulator's replay (capacity.pools.colocated_pool),
    starting from its estimate: the count and binding line every co-located plan reports.
    With `replays` (a dict), the values of the count found go into it under the option's key,
    as (count, values), so a plan of that count need not be replayed again."""
    seen: dict = {}
    scores: dict[int, float] = {}  # (where the search is aimed: smallest_count's score)
    kept: list = [None, None]  # (count, values): the smallest count that met every line so far

    def failing(n):
        if n not in seen:
            values = _colocated_values(problem, option.key, option.inst, n)
            seen[n], scores[n] = _mixed_failing(problem, values), _excess(problem, values)
            if seen[n] is None and (kept[0] is None or n < kept[0]):
                kept[:] = n, values  # (only these values: a replay's arrays are large)
        return seen[n]
    n = smallest_count(lambda k: failing(k) is None, 1, option.instances, score=scores.get)  # (steps of 1/8 from the estimate)
    if n is None:
        label = getattr(seen[MAX_INSTANCES], "label", seen[MAX_INSTANCES])  # (the walk's last check)
        return replace(option, instances=None, binding=label,
                       skipped=f"{label} not met at any size (simulated up to {MAX_INSTANCES:,} instances)")
    if replays is not None:
        replays[option.key] = tuple(kept)
    binding = failing(n - 1) if n > 1 else None
    return replace(option, instances=n, binding=getattr(binding, "label", binding) or "minimum size (1 instance)",
                   simulated=True)


def evaluate(problem: Problem, counts: dict[AnyKey, int], options: dict[AnyKey, AnyOption], memo: dict | None = None,
             fewer: tuple | None = None) -> dict:
    """Per-request TTFT, TBT and E2E (seconds) of a plan on the trace: split pools,
    or one co-located (mixed) pool.

    `memo` (any dict, reused across calls on the same problem) keeps the prompt
    replay of each prompt-pool configuration and each option's batch times. `fewer`: (a pool's
    key as `_parts` keys it, n): that pool with n instances fewer in service."""
    t = problem.trace
    mixed = [(k, c) for k, c in counts.items() if isinstance(k, OptionKey) and k.role == Role.MIXED]
    if mixed:
        (key, machines), = mixed  # a co-located plan is one homogeneous pool
        inst = options[key].inst
        return _colocated_values(problem, key, inst, _less(key, inst.instances_on(machines), fewer))
    memo = {} if memo is None else memo
    prompt_parts, token_parts = (_parts(counts, options, role, fewer) for role in SPLIT)
    prompt_keys = [k for k, *_ in prompt_parts]
    prompt = [(o.inst, n) for _, o, n, _ in prompt_parts]
    token_keys = [k for k, *_ in token_parts]
    token = [(o.inst, n) for _, o, n, _ in token_parts]
    replayed = _prompt_replay(problem, prompt_parts, memo)
    ttft, prompt_busy_s, rates = replayed
    hits = dict(zip(prompt_keys, rates, strict=True)) if rates else {}  # (rates: with a prefix cache)
    src = max(prompt, key=lambda pair: pair[1])[0]
    # Requests go to token types in proportion to their capacity (a deterministic interleave).
    share = np.array([n / o.instances for _, o, n, _ in token_parts])
    prompt_instances = sum(n for _, n in prompt)
    cut = np.cumsum(share / share.sum())
    kind = np.minimum(np.searchsorted(cut, (np.arange(len(t)) * 0.6180339887498949) % 1.0, side="right"), len(token) - 1)
    tbt, decode_s, step_s = np.empty(len(t)), np.empty(len(t)), np.empty(len(t))
    kv_peak = 0.0
    start = t.arrival_s + ttft
    token_busy_s = np.zeros(len(token))
    for j, (_, option, n, combo) in enumerate(token_parts):
        inst, idx = option.inst, np.flatnonzero(kind == j)
        # on shared machines, a request's prompt instance is on its token instance's machine as
        # often as that machine's share of the prompt instances
        shared = None if combo is None else cast(Combo, options[combo])
        local = None if shared is None else (shared.prompt.inst, shared.prompt_instances / prompt_instances)
        if len(idx):
            tbt[idx], decode_s[idx], res = _decode_values(problem, inst, n, src, start[idx], idx, local)
            step_s[idx] = res.step_s
            kv_peak = max(kv_peak, res.kv_peak_fraction)
            steps_s = np.maximum(t.output_tokens[idx] - 1, 0) * res.step_s  # (after the KV transfer)
            token_busy_s[j] = busy_s(start[idx] + decode_s[idx] - steps_s, start[idx] + decode_s[idx], n)
    e2e = ttft + decode_s
    span_s = max(float(np.max(t.arrival_s + e2e) - t.arrival_s[0]), 1e-9)  # as the simulator's utilization
    keys = prompt_keys + token_keys
    pool_busy_s = [*prompt_busy_s, *token_busy_s]
    utilization = {k: min(b / (span_s * n), 1.0) for k, b, (_, n) in zip(keys, pool_busy_s, prompt + token, strict=True)}
    token_busy = np.array([utilization[k] for k in token_keys])[kind]  # each request's token instance's
    itl, tpot = _decode_gaps(t.output_tokens, decode_s, step_s, token_busy, src.engine.async_scheduling)
    return {"ttft": ttft, "tbt": tbt, "itl": itl, "tpot": tpot, "e2e": e2e, "kv_peak_fraction": kv_peak,
            "utilization": utilization, "prefix_hit_rate": hits, "phases": _phases(prompt, prompt_busy_s, token, token_busy_s),
            "span_s": span_s}


def _phases(prompt: list, prompt_busy_s, token: list, token_busy_s) -> list[tuple]:
    """(machine, GPUs per instance, instances, prefill seconds, decode seconds) per pool: a prompt
    pool's busy time prefills, a token pool's decodes (the energy model's phases)."""
    return ([(i.hardware, i.layout.gpus, n, b, 0.0) for (i, n), b in zip(prompt, prompt_busy_s, strict=True)]
            + [(i.hardware, i.layout.gpus, n, 0.0, b) for (i, n), b in zip(token, token_busy_s, strict=True)])


def _prompt_replay(problem: Problem, prompt_parts: list[tuple], memo: dict) -> tuple:
    """(per-request TTFT, busy seconds per prompt pool, prefix hit rate per pool) of the prompt
    pools replayed on the trace (memoized: by the pools' machine families, layouts and counts)."""
    t = problem.trace
    prompt = [(o.inst, n) for _, o, n, _ in prompt_parts]
    # (an instance is the same on every shape of its machine type: so is the replay of its pools)
    same = tuple((o.inst.hardware.family, o.inst.layout, n) for _, o, n, _ in prompt_parts)
    replayed = memo.get(("ttft", same))
    if replayed is None:
        for (family, layout, _), (_, o, _, _) in zip(same, prompt_parts, strict=True):
            if ("batch", family, layout) not in memo:
                memo["batch", family, layout] = BatchTimes(o.inst, t.prompt_tokens)
        batches = [memo["batch", family, layout] for family, layout, _ in same]
        stats: list = []
        ttft, passes, _ = replay_prompts(t.arrival_s, t.prompt_tokens, prompt, problem.max_batch_tokens, batches,
                                         chunked=problem.chunked, max_seqs=problem.max_num_seqs, prefix=problem.prefix,
                                         cache_stats=stats)
        _, durations, where = passes.T
        pool_of = np.repeat(np.arange(len(prompt)), [n for _, n in prompt])  # instance -> its pool
        rates = []
        if stats:  # each prompt pool's prefix hit rate: hit over looked-up tokens of its instances
            hit, looked = np.array(stats, float).T
            rates = [float(np.sum(hit[pool_of == m]) / max(np.sum(looked[pool_of == m]), 1.0)) for m in range(len(prompt))]
        replayed = memo[("ttft", same)] = ttft, np.bincount(pool_of[where.astype(int)], durations, len(prompt)), rates
    return replayed


def _parts(counts: dict, options: dict, role: Role, fewer: tuple | None = None) -> list[tuple]:
    """A split plan's instances of `role`: (key, option, instances, combo key or None) per pool,
    its own machines' (key: the option key) and each shared machine group's part (key: (combo
    key, role)), in a fixed order; `fewer` (key, n): that one with n instances fewer."""
    out = []
    for k, c in sorted(counts.items()):
        if k.role == role:
            out.append((k, options[k], options[k].inst.instances_on(c), None))
        elif k.role == SHARED:
            part, held = options[k].part(role)
            out.append(((k, role), part, c * held, k))
    return [(k, o, _less(k, n, fewer), c) for k, o, n, c in out]


def _less(key, instances: int, fewer: tuple | None) -> int:
    """A pool's instances, `fewer[1]` fewer where `fewer[0]` is its key."""
    return instances - fewer[1] if fewer is not None and key == fewer[0] else instances


def check(problem: Problem, values: dict) -> list[tuple[SloLine, float, bool]]:
    out = []
    for line in problem.slo.lines():
        value = achieved(line, values[line.metric], problem.reference)
        out.append((line, value, meets(line, value)))
    return out


def attainments(problem: Problem, values: dict) -> tuple[float, ...]:
    """Per SLO line (in `check`'s order), the share of requests (of gaps, for ITL) within its limit, %."""
    return tuple(attainment_pct(line, values[line.metric], problem.reference) for line in problem.slo.lines())


def cliff(problem: Problem, plan: Plan, options: dict[AnyKey, AnyOption], memo: dict | None = None) -> tuple[dict, ...]:
    """How close the plan is to failing: per pool, every SLO line predicted with one instance fewer
    in service than the plan's prediction has (its spares out too), the other pools as planned;
    `fails`: the first line it then misses (None: it still holds)."""
    counts, memo = plan_counts(plan), {} if memo is None else memo
    if plan.mixed_pools:
        keys = [(k, options[k], options[k].inst.instances_on(c)) for k, c in counts.items()]
    else:
        keys = [(k, o, n) for role in SPLIT for k, o, n, _ in _parts(counts, options, role)]
    out: list[dict] = []
    for key, option, held in keys:
        in_service = held - problem.spare_instances
        row = {"role": str(option.role), "hardware": option.inst.hardware.name, "layout": option.inst.layout.spec,
               "shared": not isinstance(key, OptionKey), "instances": in_service, "fewer": in_service - 1}
        if in_service <= 1:
            out.append({**row, "fails": "no instance left", "slo": []})
            continue
        values = evaluate(problem, counts, options, memo, (key, problem.spare_instances + 1))
        lines = check(problem, values)
        row["slo"] = [{"line": line.label, "achieved": v, "attainment_pct": a, "met": ok}
                      for (line, v, ok), a in zip(lines, attainments(problem, values), strict=True)]
        failed = [line.label for line, _, ok in lines if not ok] + (["KV memory"] if values.get("kv_peak_fraction", 0.0) > 1 else [])
        out.append({**row, "fails": failed[0] if failed else None})
    return tuple(out)


def repair(problem: Problem, counts: dict[AnyKey, int], options: dict[AnyKey, AnyOption], limit: int = 100, memo: dict | None = None):
    """Grow the plan until every line holds on the whole-trace evaluation.

    Greedy: for the first failing line, try one more machine of each option of the
    role(s) that line depends on (TTFT: prompt; TBT and KV: token; E2E: both) that
    is in the plan or among the most capacity per dollar, keep the one that
    improves the line most per dollar (per kW for the power objective), and
    evaluate again."""
    counts = dict(counts)
    memo = {} if memo is None else memo

    def score(values):
        lines = check(problem, values)
        failed = [(line, value) for line, value, ok in lines if not ok]
        return lines, failed

    values = evaluate(problem, counts, options, memo)
    lines, failed = score(values)
    for step in range(limit + 1):
        kv_bad = values["kv_peak_fraction"] > 1
        if not failed and not kv_bad:
            return counts, values, lines, step
        line, value = failed[0] if failed else (None, values["kv_peak_fraction"])
        best = best_move(problem, counts, options, line, value, memo)
        if best is None:
            break
        counts, values = best
        lines, failed = score(values)
    what = failed[0][0].label if failed else "KV memory"
    raise InfeasibleError(f"no plan found that meets {what}: adding machines of any option stopped improving it "
                          f"(best {failed[0][0].text(failed[0][1])}, target {failed[0][0].target})" if failed else
                          "no plan found that fits the decode KV cache")


def best_move(problem: Problem, counts: dict, options: dict, line: SloLine | None, value: float, memo: dict | None = None):
    """Repair's step: of one more unit (a machine, or the machines one instance spans) of each
    option the failing `line` depends on (TTFT: prompt; TBT and KV memory, `line` None: token;
    E2E: both), the one that improves it most per dollar (per kW for the power objective):
    (counts, values), or None when no move improves it."""
    weight = (lambda o: o.price_usd_per_hour) if problem.objective == "cost" else (lambda o: o.power_kw)
    roles = {"ttft": (Role.PROMPT,), "tbt": (Role.TOKEN,), "itl": (Role.TOKEN,), "tpot": (Role.TOKEN,),
             "e2e": SPLIT}[line.metric if line else "tbt"]
    best = None
    for option in _repair_moves(counts, options, roles, weight):
        unit = option.inst.unit_machines
        trial = {**counts, option.key: counts.get(option.key, 0) + unit}
        trial_values = evaluate(problem, trial, options, memo)
        new = trial_values["kv_peak_fraction"] if line is None else achieved(line, trial_values[line.metric], problem.reference)
        gain = (value - new) / (weight(option) * unit)
        if gain > 0 and (best is None or gain > best[0]):
            best = (gain, trial, trial_values)
    return None if best is None else best[1:]


def _repair_moves(counts: dict, options: dict, roles: tuple, weight, extra: int = 3) -> list[AnyOption]:
    """Options worth one more machine: those already in the plan, and per role the
    `extra` with the lowest weight (cost or power) per unit of capacity."""
    moves = {k: options[k] for k in counts if k.role in roles}
    for role in roles:
        ranked = sorted((o for o in options.values() if o.role == role and o.instances),
                        key=lambda o: (weight(o) * o.instances * o.inst.unit_machines / o.inst.unit_instances, o.key))
        moves.update((o.key, o) for o in ranked[:extra])
    return [moves[k] for k in sorted(moves)]


def usd_per_million_tokens(cost_usd_per_hour: float, trace: Trace, load_factor: float = 1.0) -> dict:
    """What these machines cost per million tokens of the trace's load, an hour's cost over an
    hour of its tokens: `cost_usd_per_million_tokens` (prompt and output) and
    `cost_usd_per_million_output_tokens`; None for a trace without a span. `load_factor`: the
    trace's load over the load it stands for (a trace compressed for headroom stands for a
    load that many times lighter, with as many times fewer tokens an hour)."""
    if trace.span_s <= 0:
        return {"cost_usd_per_million_tokens": None, "cost_usd_per_million_output_tokens": None}
    usd = cost_usd_per_hour * trace.span_s * load_factor / 3600 * 1e6
    output = float(trace.output_tokens.sum())
    return {"cost_usd_per_million_tokens": usd / (output + float(trace.prompt_tokens.sum())),
            "cost_usd_per_million_output_tokens": usd / max(output, 1.0)}


def energy_per_million(problem: Problem, counts: dict[AnyKey, int], options: dict[AnyKey, AnyOption], values: dict,
                       idle_instances: list[tuple]) -> dict:
    """The GPU energy per million tokens of the load the trace stands for (sim.metrics' power
    model over the predicted busy time of each pool of `counts`, whose evaluation `values` is,
    its spare instances idle). With headroom (`problem.load_factor` > 1) the machines are evaluated
    again on the trace at the load it stands for (arrivals that many times further apart): the
    lighter batches of that load take longer per token than the compressed trace's. None where no
    busy time was predicted."""
    if problem.load_factor != 1:
        t = problem.trace
        problem = replace(problem, trace=replace(t, arrival_s=t.arrival_s * problem.load_factor), load_factor=1.0)
        values = evaluate(problem, counts, options)
    if "phases" not in values:
        return {}
    span_s = values["span_s"]
    joules = sum(gpu_energy_j(hw, gpus, n * span_s, prefill_s, decode_s) for hw, gpus, n, prefill_s, decode_s in values["phases"])
    joules += sum(gpu_energy_j(hw, gpus, n * span_s, 0.0, 0.0) for hw, gpus, n in idle_instances)
    t = problem.trace
    return energy_per_million_tokens(joules / 3.6e6, float(t.prompt_tokens.sum()), float(t.output_tokens.sum()))


def _held(option: AnyOption, machines: int) -> dict[Role, int]:
    """Instances per role on `machines` machines of an option (both parts of shared machines)."""
    if isinstance(option, Combo):
        return {Role.PROMPT: machines * option.prompt_instances, Role.TOKEN: machines * option.token_instances}
    return {option.role: option.inst.instances_on(machines)}


def _needed(option: AnyOption, machines: int) -> dict[Role, int]:
    """Instances per role the load needs of a pool of `machines` machines: those held, less the
    ones a whole-machine rounding added to an option's size alone."""
    held = _held(option, machines)
    if isinstance(option, Option) and option.instances and machines == option.machines_alone:
        return {option.role: min(held[option.role], option.instances)}
    return held


def with_spares(counts: dict[AnyKey, int], options: dict[AnyKey, AnyOption], spare: int) -> dict[AnyKey, int]:
    """Machine counts that keep `spare` instances in each pool beyond what the load needs (a
    part of shared machines: each role's part)."""
    if not spare:
        return counts
    out = {}
    for k, c in counts.items():
        option, needed = options[k], _needed(options[k], c)
        if isinstance(option, Combo):
            out[k] = max(c, *(math.ceil((needed[role] + spare) / option.part(role)[1]) for role in SPLIT))
        else:
            out[k] = max(c, option.inst.machines_for(needed[option.role] + spare))
    return out


def _pools(counts: dict[AnyKey, int], options: dict[AnyKey, AnyOption], values: dict,
           sized: dict[AnyKey, int] | None = None) -> dict[Role, tuple[SizedPool, ...]]:
    """The plan's pools per role, each with its instances, GPUs and predicted utilization; a group
    of shared machines is a part in each role's pools, numbered alike. `sized`: the counts the
    values are of, where `counts` keep spares beside them (the utilization of all instances,
    the spare ones counted)."""
    sized = sized or counts
    hits, busy = values.get("prefix_hit_rate", {}), values["utilization"]

    def figures(k, role, key):
        held, needed = _held(options[k], counts[k])[role], _needed(options[k], sized[k])[role]
        u, hit = busy.get(key), hits.get(key)
        return (None if u is None else float(u * _held(options[k], sized[k])[role] / held)), \
            (None if hit is None else float(hit)), held - needed

    out = {role: [SizedPool.of(k.hardware, options[k].inst.hardware.gpus_per_machine, k.layout, c, *figures(k, role, k))
                  for k, c in sorted(counts.items()) if isinstance(k, OptionKey) and k.role == role] for role in Role}
    for number, (k, c) in enumerate(sorted((k, c) for k, c in counts.items() if isinstance(k, ComboKey))):
        for role, layout, per_machine in ((Role.PROMPT, k.prompt_layout, k.prompt_instances),
                                          (Role.TOKEN, k.token_layout, k.token_instances)):
            out[role].append(SizedPool.part(k.hardware, layout, c, c * per_machine, number, *figures(k, role, (k, role))))
    return {role: tuple(pools) for role, pools in out.items()}


def _idle(counts: dict[AnyKey, int], sized: dict[AnyKey, int], options: dict[AnyKey, AnyOption]) -> list[tuple]:
    """Instances the spares add, as (machine, GPUs per instance, instances): idle in the energy model."""
    out = []
    for k, c in counts.items():
        option = options[k]
        for role, n in _held(option, c).items():
            inst = option.part(role)[0].inst if isinstance(option, Combo) else option.inst
            if n > (held := _held(option, sized[k])[role]):
                out.append((inst.hardware, inst.layout.gpus, n - held))
    return out


def make_plan(problem: Problem, counts: dict[AnyKey, int], options: dict[AnyKey, AnyOption], repairs: int,
              values: dict, lines) -> Plan:
    """The plan of these machine counts (sized on the trace: `values`, the SLO `lines`), with
    `problem.spare_instances` more instances per pool: its cost and power count the spares, its
    predicted latencies and SLO are with the spares out of service."""
    sized, counts = counts, with_spares(counts, options, problem.spare_instances)
    cost = sum(options[k].price_usd_per_hour * c for k, c in counts.items())
    power = sum(options[k].power_kw * c for k, c in counts.items())
    predicted = _percentiles_ms(values)
    bindings = []
    for role in (Role.PROMPT, Role.TOKEN, Role.MIXED):
        used: list[tuple[Option, int | None]] = [(o, c) for k, c in sized.items()
                                                 if isinstance(o := options[k], Option) and o.role == role]
        used += [(o.part(role)[0], None) for k in sized if isinstance(o := options[k], Combo) and role in SPLIT]
        if used:
            bindings.append(f"{role}: {', '.join(sorted({_binding_text(o, c) for o, c in used}))}")
    if repairs:
        bindings.append(f"{repairs} machine(s) added on whole-trace evaluation")
    if counts != sized:
        bindings.append(f"spares: {sum(counts.values()) - sum(sized.values())} machine(s) added for "
                        f"{problem.spare_instances} spare instance(s) per pool")
    bindings += _tight_budgets(problem, counts, options, cost, power)
    pools = _pools(counts, options, values, sized)
    return Plan(pools[Role.PROMPT], pools[Role.TOKEN], pools[Role.MIXED], cost, power, predicted,
                tuple(lines), "; ".join(bindings), repairs,
                **usd_per_million_tokens(cost, problem.trace, problem.load_factor),
                **energy_per_million(problem, sized, options, values, _idle(counts, sized, options)),
                attainment_pct=attainments(problem, values))


def _binding_text(option: Option, machines: int | None) -> str:
    """What decided a pool's size: its binding line, or, where the machines hold more instances
    than the option needs alone, the rounding (and the line that binds at the count needed).
    `machines` None: the pool's part of shared machines (its line)."""
    if machines is None:
        return option.binding
    held = option.inst.instances_on(machines)
    if option.instances and machines == option.machines_alone and held > option.instances:
        after = "" if option.binding.startswith("minimum size") else f"; next to bind: {option.binding}"
        return f"rounded up to whole machines ({option.instances} of {held} instances needed{after})"
    return option.binding


def _percentiles_ms(values: dict) -> dict:
    def pct(v, q):
        return v.percentile(q) if isinstance(v, Gaps) else float(np.nanpercentile(v, q))
    return {m: {f"p{q}": pct(values[m], q) * 1e3 for q in (50, 90, 99)} for m in METRICS
            if m in values}


def plan_counts(plan: Plan) -> dict[AnyKey, int]:
    """The plan's machine counts keyed as options are (shared machines by their combo key)."""
    counts: dict[AnyKey, int] = {OptionKey(role, p.hardware, p.layout): p.machines for role, p in plan.by_role()
                                 if p.shared is None}
    for group in (g for g in bought(plan.pools) if g.shared is not None):
        machines = group.machines
        (p,), (t,) = ([x for x in pools if x.shared == group.shared] for pools in (plan.prompt_pools, plan.token_pools))
        counts[ComboKey(SHARED, p.hardware, p.layout, p.instances // machines, t.layout, t.instances // machines)] = machines
    return counts


def predict(problem: Problem, plan: Plan, options: dict[AnyKey, AnyOption]) -> Plan:
    """The plan with the planner's whole-trace prediction of its own machines (after
    machines were added to it, e.g. by a simulation)."""
    counts = plan_counts(plan)
    values = evaluate(problem, counts, options)
    pools = _pools(counts, options, values)
    plan = replace(plan, prompt_pools=pools[Role.PROMPT], token_pools=pools[Role.TOKEN], mixed_pools=pools[Role.MIXED],
                   predicted=_percentiles_ms(values), slo=tuple(check(problem, values)), attainment_pct=attainments(problem, values),
                   **usd_per_million_tokens(plan.cost_usd_per_hour, problem.trace, problem.load_factor),
                   **energy_per_million(problem, counts, options, values, []))
    return replace(plan, cliff=cliff(problem, plan, options))


def _tight_budgets(problem: Problem, counts: dict[AnyKey, int], options: dict[AnyKey, AnyOption], cost: float,
                   power: float) -> list[str]:
    """Budget and availability limits the plan reaches: they, not the SLO, shape it."""
    tight = []
    if problem.max_cost_per_hour is not None and cost >= problem.max_cost_per_hour * (1 - 1e-6) - 1e-9:
        tight.append(f"budget: cost at --max-cost-per-hour {problem.max_cost_per_hour:g}")
    if problem.max_power_kw is not None and power >= problem.max_power_kw * (1 - 1e-6) - 1e-9:
        tight.append(f"budget: power at --max-power-kw {problem.max_power_kw:g}")
    for cap in problem.max_machines:
        if sum(c * cap.share(options[k].inst.hardware) for k, c in counts.items()) >= cap.machines - 1e-9:
            tight.append(f"availability: all {cap.machines} {cap.hardware} machines used")
    return tight


def closest_fit(option: Option) -> tuple:
    """Options in the order an error names them, the closest first: those that fit, then memory
    short of the weights before a layout the model cannot take, the most GPU memory per instance first."""
    inst = option.inst
    return (not inst.fit.fits, "weights need" not in (option.skipped or ""),
            -inst.hardware.memory_bytes_per_gpu * inst.layout.gpus, option.skipped or "")


def _sized_as(option: Option) -> tuple:
    """What an option's size depends on: its role and instance, whatever shape of its machine
    type holds the instance."""
    return option.role, option.inst.hardware.family, option.inst.layout


def as_simulated(simulated: dict, option: Option) -> Option:
    """`option` as `colocated_plan` simulated it (on any shape of its machine type), else itself."""
    found = simulated.get(_sized_as(option))
    return option if found is None else replace(found, inst=option.inst)


def _within_budget(problem: Problem, o: Option) -> bool:
    """A co-located option's plan (its machines alone) within the cost, power and machine budgets."""
    m = o.machines_alone
    return ((problem.max_cost_per_hour is None or o.price_usd_per_hour * m <= problem.max_cost_per_hour + 1e-9)
            and (problem.max_power_kw is None or o.power_kw * m <= problem.max_power_kw + 1e-9)
            and all(m * cap.share(o.inst.hardware) <= cap.machines + 1e-9 for cap in problem.max_machines))


def _colocated_rank(problem: Problem, o: Option) -> tuple:
    """As plans rank: the objective, the other one, fewer machines, a fixed order."""
    first, second = (o.price_usd_per_hour, o.power_kw) if problem.objective == "cost" else (o.power_kw, o.price_usd_per_hour)
    return first * o.machines_alone, second * o.machines_alone, o.machines_alone, o.key


def _best_colocated(problem: Problem, mixed: list[Option], simulated: dict) -> tuple:
    """(the best co-located option within the budgets or None, the replay of it: (count, values)),
    simulating options in the order of their estimate until the next cannot beat the best."""
    def rank(o: Option) -> tuple:
        return _colocated_rank(problem, o)

    def better(found: Option) -> bool:
        return bool(found.instances) and _within_budget(problem, found) and (best is None or rank(found) < rank(best))

    ranked = sorted((o for o in mixed if o.instances and _within_budget(problem, o)), key=rank)
    best: Option | None = None
    best_replay: tuple = (None, None)
    for found in (as_simulated(simulated, o) for o in ranked if _sized_as(o) in simulated):  # (simulated before: free)
        if better(found):
            best, best_replay = found, simulated.get(("replay", *_sized_as(found)), (None, None))
    for option in ranked:
        if best is not None and rank(option)[:2] >= rank(best)[:2]:
            break
        replays: dict = {}
        if _sized_as(option) not in simulated:
            simulated[_sized_as(option)] = simulated_option(problem, option, replays)
        found = as_simulated(simulated, option)
        if better(found):
            best, best_replay = found, replays.get(found.key, (None, None))  # (only the best's replay is kept)
    if best is not None and best_replay[0] is not None:
        simulated[("replay", *_sized_as(best))] = best_replay  # (for a later call, on any shape: one per call at most)
    return best, best_replay


def colocated_plan(problem: Problem, options: list[Option], simulated: dict | None = None) -> Plan:
    """The best homogeneous co-located plan (Splitwise's baselines) within the budgets.

    Options are ranked by their estimated size and simulated (`simulated_option`) in that
    order until the next one's estimate costs no less than the best simulated plan (the
    estimate is optimistic, so a later option rarely wins); options simulated by an earlier call
    count first. `simulated` (a dict by role, machine type and layout, reused across calls) keeps
    the options simulated, and the replay of each call's best, and gives them back."""
    simulated = {} if simulated is None else simulated
    mixed = [o for o in options if o.role == Role.MIXED]
    best, best_replay = _best_colocated(problem, mixed, simulated)
    if best is None:
        shown = [as_simulated(simulated, o) for o in mixed]
        short, whole = listed([f"{o.inst.hardware.name} {o.inst.layout}: {o.skipped or 'over budget'}"
                               for o in sorted(shown, key=closest_fit)])
        raise with_details(InfeasibleError(f"no co-located plan meets the SLO within the budget: {short}"), whole)
    counts: dict[AnyKey, int] = {best.key: best.machines_alone}
    held = best.inst.instances_on(best.machines_alone)
    count, values = best_replay
    if count != held:  # (rounded up to whole machines, or simulated by an earlier call)
        values = evaluate(problem, counts, {best.key: best})
    else:  # (the replay may be of another shape of its machine: the same instances, its pool's figures keyed anew)
        values = {**values, **{name: {best.key: figure} for name in ("utilization", "prefix_hit_rate")
                               for figure in values[name].values()}}
    return make_plan(problem, counts, {best.key: best}, 0, values, check(problem, values))
