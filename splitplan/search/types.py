"""The search's types: pool options (a machine type, a parallel layout and a role) sized alone,
shared machines (`Combo`), the sized pools of a plan, the `Plan`, and the `Problem` every stage
reads. The search runs through the modules beside this one, each a stage:

1. sizing: each option is sized alone on the trace (capacity.pools): n*(o) instances, and the SLO
   line that decided n*; those the model does not fit are kept with the reason.
2. solve: the ILP (PuLP, solved by HiGHS or CBC) picks integer unit counts x_o (a unit: one
   machine, or the machines one instance spans), minimizing cost or power subject to
   sum_o x_o * instances_per_unit_o / n*(o) >= 1 for the prompt and the token role (mixes within a
   pool allowed), budgets and availability; `grid` enumerates the same space exhaustively.
3. evaluation and repair: the chosen plan is evaluated on the trace as a whole (mixed pools, KV
   transfer, E2E); while a line fails, one machine is added to the role that line depends on (the
   option with the lowest cost per unit of capacity; a whole unit) and the plan is evaluated again.
   Pooling is not linear, so this repair is what makes the reported plan honest.
4. accounting: the plan's pools, spares, cost and energy per token; colocated: the best co-located
   plan, sized by the simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from splitplan.base.defaults import MAX_BATCH_TOKENS
from splitplan.perf.roofline import Instance
from splitplan.perf.slo import Reference
from splitplan.sim.prefix_cache import PrefixModel
from splitplan.specs.layout import Layout
from splitplan.specs.roles import SPLIT, Pool, Role
from splitplan.specs.slo import SloProfile
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
