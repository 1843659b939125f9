"""How many instances of a pool option keep the SLO, from the trace itself.

Prompt pool (TTFT): the trace is replayed against n instances as the simulator
and Splitwise route it: at arrival, to the instance with the fewest pending prompt
tokens (queued or in a running prefill), then FCFS per instance; a free instance
takes its queued prompts up to `max_batch_tokens` (always at least one), runs the
batch for the perf model's time, and every request in it gets its first token
when the batch ends (Splitwise stamps TTFT at the end of the prefill). Queueing,
and so the bursts of a real trace, are in the TTFT percentiles; no mean-rate
formula is used. Cost: O(requests x (log n + n)) per evaluation. With the engine's prefix
caching (`PrefixModel`), each instance keeps a cache as the simulator's (sim.prefix_cache's rules,
compiled as the simulator's are, and the same moments: looked up when a prompt's prefill first comes up, kept when it
ends, evicted to what the running prefills leave of the KV memory), so a pool's prefill work is
the trace's less what its caches hold at its instance count and memory, routed as the simulator
routes (join-shortest-queue, or prefix-aware).

Token pool (TBT, KV memory): continuous batching. Request i decodes from its
start for `output_i` iterations; the batch on an instance is the number of
requests decoding at that moment divided by n (join-shortest-queue spreads them
evenly); the step time at that batch and the mean context sets the decode
duration, which sets the concurrency: a fixed point, iterated to convergence
(Little's law applied request by request over the replayed trace). TBT per
request is Splitwise's (E2E - TTFT) / output = (KV transfer + output x step) /
output. KV memory: the peak over time of the tokens (prompt + output) held by
the requests decoding on an instance must fit its KV capacity.

Co-located pool (every line): the simulator's replay (`colocated_pool`), after a fast
estimate (`colocated_estimate`) has ranked the options.

Whether a latency meets an SLO line is splitplan.perf.slo's to say.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import numpy as np

from splitplan.base.core import core
from splitplan.perf.roofline import Instance
from splitplan.perf.slo import Gaps
from splitplan.perf.table import MeasuredInstance, core_vectors
from splitplan.sim.cluster import PoolSpec, SimOptions, simulate
from splitplan.sim.metrics import pool_report
from splitplan.sim.prefix_cache import PrefixModel
from splitplan.specs.roles import Role
from splitplan.specs.slo import METRICS

MAX_INSTANCES = 4096
HEAP_ROUTING_INSTANCES = 16  # above this many instances the replay routes from a heap of loads, not a scan (the same picks)


class BatchTimes:
    """What times one instance type's passes: the instance, and `decode_batch` requests of
    `decode_context_tokens` context riding along in every pass (co-located mixed batching); for a
    measured instance, its pass times by prompt tokens (`measured_row`), kept across replays (e.g.
    while searching for the smallest instance count)."""

    def __init__(self, inst: Instance, decode_batch: float = 0.0, decode_context_tokens: float = 0.0):
        self.inst = inst
        self.decode = (float(decode_batch), float(decode_batch * decode_context_tokens))
        self.rows: dict[int, np.ndarray] = {}

    def measured_row(self, size: int) -> np.ndarray:
        """A measured instance's pass of t prompt tokens for every t below `size`, with the decodes
        (MeasuredInstance.pass_row, uncounted)."""
        row = self.rows.get(size)
        if row is None:
            row = self.rows[size] = cast(MeasuredInstance, self.inst).pass_row(size, self.decode[0])
        return row


class PromptReplay(NamedTuple):
    ttft_s: np.ndarray  # per request
    passes: np.ndarray  # (start s, duration s, instance) of every pass, in the order they began
    placed: np.ndarray  # per request, its instance


def prompt_queue_ttft_s(arrival_s: np.ndarray, prompt_tokens: np.ndarray, pools: list[tuple[Instance, int]],
                        max_batch_tokens: int, times: list[BatchTimes] | None = None, **options) -> np.ndarray:
    """TTFT of every request (`replay_prompts`)."""
    return replay_prompts(arrival_s, prompt_tokens, pools, max_batch_tokens, times, **options).ttft_s


def replay_prompts(arrival_s: np.ndarray, prompt_tokens: np.ndarray, pools: list[tuple[Instance, int]],
                   max_batch_tokens: int, times: list[BatchTimes] | None = None, held_s: np.ndarray | None = None,
                   chunked: bool = False, max_seqs: int | None = None, prefix: PrefixModel | None = None,
                   cache_stats: list | None = None) -> PromptReplay:
    """TTFT of every request on the given prompt instances (type, count), routed as
    the simulator and Splitwise route them: at arrival, to the instance with the
    fewest pending prompt tokens (queued or in a running prefill; ties to the lowest
    index), then FCFS per instance with batches of at most `max_batch_tokens`
    (always at least one prompt), or, `chunked` (the engine's scheduler), passes of
    `max_batch_tokens` tokens taken from the head of the queue, a prompt split over
    passes (its first token with its last chunk); at most `max_seqs` prompts in a
    pass (the engine's max_num_seqs); with every pass and every request's instance (PromptReplay).
    With `held_s` (co-located instances), request i also counts 1 in its
    instance's load for held_s[i] seconds from its arrival, as the simulator routes
    co-located instances (one per request held). With `prefix`, a prefix cache per instance
    (module docstring); with `cache_stats`, each instance's (hit, looked-up) prompt tokens. A
    measured instance counts each pass's lookup (and whether it lies outside its table).
    The replay is compiled (splitplan_core.prompt_replay); tests/capacity/python_replay.py states it
    in Python, the oracle the tests hold it to.

    A batch that ends at an arrival's time ends before the arrival is routed, as in
    the simulator, so both give the same TTFT. With the engine's async scheduling, a request that
    arrives while its instance runs a batch after which more was queued joins the batch after the
    next (the simulator's rule); the engine's front-end latency is added to every TTFT."""
    engine = pools[0][0].engine
    times = times or [BatchTimes(inst) for inst, _ in pools]
    decode = np.array([t.decode for t in times])
    release_s = np.empty(0) if held_s is None else np.asarray(arrival_s + held_s, float)
    finish_s, passes, where, stats, counts = core.prompt_replay(
        np.asarray(arrival_s, float), np.asarray(prompt_tokens, np.int64),
        core_vectors([inst for inst, _ in pools]),
        np.repeat(np.arange(len(pools)), [count for _, count in pools]), decode, int(max_batch_tokens), bool(chunked),
        int(max_seqs or len(arrival_s)), bool(engine.async_scheduling), release_s, HEAP_ROUTING_INSTANCES,
        _caches(prefix, pools), _measured(times, max(int(max_batch_tokens), int(prompt_tokens.max(initial=0))) + 1))
    if cache_stats is not None and stats:
        cache_stats.extend(stats)
    if counts is not None:  # (a measured table counts its lookups)
        for t, (lookups, outside) in zip(times, counts.tolist(), strict=True):
            if t.inst.measured:
                cast(MeasuredInstance, t.inst).counted("prefill", lookups, outside)
    return PromptReplay(finish_s - arrival_s + engine.frontend_latency_s, passes, where)


def _caches(prefix: PrefixModel | None, pools: list[tuple[Instance, int]]) -> tuple | None:
    """The compiled replay's prefix caches (None without): the tree, each request's node, the block,
    per instance type its KV capacity and host tier, and whether routing is prefix-aware."""
    if prefix is None:
        return None
    host = np.array([prefix.host_tier(inst) for inst, _ in pools], float).reshape(-1, 2)
    return (*prefix.arrays(), np.asarray(prefix.tree.request_node, np.int64), prefix.block_tokens,
            np.array([int(inst.fit.kv_capacity_tokens) for inst, _ in pools], np.int64), host[:, 0], host[:, 1],
            prefix.prefix_aware)


def _measured(times: list[BatchTimes], size: int) -> tuple | None:
    """The compiled replay's measured tables (None where every instance type is analytic): per type
    whether it is measured, its pass times up to `size` prompt tokens, the tokens plus decodes its
    table measured."""
    if not any(t.inst.measured for t in times):
        return None
    rows, ranges = np.zeros((len(times), size)), np.full((len(times), 2), np.nan)
    for k, t in enumerate(times):
        if t.inst.measured:
            rows[k], ranges[k] = t.measured_row(size), cast(MeasuredInstance, t.inst).prefill_range
    return np.array([t.inst.measured for t in times], np.int64), rows, ranges


def _searchsorted(sorted_values: np.ndarray, queries: np.ndarray, side: str = "left") -> np.ndarray:
    """np.searchsorted(sorted_values, queries, side) for as many queries as values, by a compiled
    merge over the queries sorted (splitplan_core.ranks): two to three times faster than a binary
    search each at thousands of requests."""
    return core.ranks(np.asarray(sorted_values, float), np.asarray(queries, float), np.argsort(queries), side == "right")


def _open_at(sorted_starts: np.ndarray, sorted_ends: np.ndarray, times: np.ndarray) -> np.ndarray:
    """How many [start, end) intervals are open at each of `times`: starts at or before it less
    ends at or before it (both sorted)."""
    order = np.argsort(times)
    return core.ranks(sorted_starts, times, order, True) - core.ranks(sorted_ends, times, order, True)


def _decode_steps(inst: Instance, active: np.ndarray, instances: int, context_tokens: float) -> np.ndarray:
    """`inst.decode_step_time_s(max(active / instances, 1), context_tokens)` per element of `active`
    (integer counts of requests decoding): on an analytic instance evaluated once per count up to the
    largest (hundreds, where requests number thousands), the same floats; a measured instance counts
    its queries (its extrapolated share), so it is asked once per element."""
    if not isinstance(inst, Instance):
        return np.asarray(inst.decode_step_time_s(np.maximum(active / instances, 1.0), context_tokens))
    counts = np.arange(int(active.max(initial=0)) + 1)
    return np.asarray(inst.decode_step_time_s(np.maximum(counts / instances, 1.0), context_tokens))[active]


@dataclass(frozen=True)
class Latencies:
    """A pool's (or a plan's) predicted latencies, per request in seconds, by the SLO metric a line
    reads (`of`); and the KV held at its peak over the capacity (0 where the simulator enforced KV
    memory itself, by admission and preemption)."""
    ttft: np.ndarray
    tbt: np.ndarray
    itl: np.ndarray | Gaps | None  # (None: the simulator recorded no gaps)
    tpot: np.ndarray
    e2e: np.ndarray
    kv_peak_fraction: float = 0.0

    def of(self, metric: str) -> Any:
        """The values of one of specs.slo.METRICS."""
        if metric not in METRICS:
            raise KeyError(metric)
        return getattr(self, metric)

    @property
    def by_metric(self) -> dict[str, Any]:
        """Each metric's values, by its name."""
        return {metric: getattr(self, metric) for metric in METRICS}


@dataclass(frozen=True)
class SimulatedPool(Latencies):
    """`colocated_pool`'s replay: its latencies, the pool's busy fraction and prefix hit rate, its
    GPUs' phases (hardware, GPUs per instance, instances, prefill s, decode s) and the span."""
    utilization: float = 0.0
    prefix_hit_rate: float | None = None
    phases: tuple = ()
    span_s: float = 0.0


@dataclass(frozen=True)
class DecodeResult:
    step_s: np.ndarray  # per request: mean decode step while it decodes
    kv_peak_fraction: float  # peak KV held per instance / its KV capacity (<= 1 fits)
    mean_batch: float
    context_tokens: float  # mean context of the requests decoding
    batch_p99: float  # the per-instance batch the requests see, 99th percentile (against max_num_seqs)


def decode_step_alone_s(inst: Instance, prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
    """Each request's decode step alone at its mean context (its prompt and half its output):
    where `decode_pool`'s fixed point starts, the same for every instance count."""
    return np.asarray(inst.decode_step_time_s(1, prompt_tokens.astype(float) + output_tokens.astype(float) / 2))


def kv_bound_guess(start_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray, inst: Instance,
                   step_alone_s: np.ndarray) -> int:
    """The token instances whose KV holds every request decoding at its step alone (`decode_step_alone_s`)
    from `start_s`: where a token pool's count search starts (a guess, not a bound: `decode_pool` steps
    at the pool's mean context, not each request's own)."""
    held = (prompt_tokens + output_tokens).astype(float)
    times = np.concatenate([start_s, start_s + output_tokens * step_alone_s])
    peak = core.running_peak(times, np.concatenate([held, -held]), np.argsort(times))
    return max(1, min(MAX_INSTANCES, math.ceil(peak / inst.fit.kv_capacity_tokens)))


def decode_pool(start_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray, inst: Instance,
                instances: int, max_iterations: int = 12, tolerance: float = 1e-2,
                step_alone_s: np.ndarray | None = None) -> DecodeResult:
    """Continuous-batching fixed point for `instances` identical token instances,
    iterated until no request's step time moves by more than `tolerance` (relative).
    `step_alone_s`: `decode_step_alone_s` of these requests, where a count search computed it once."""
    p = prompt_tokens.astype(float)
    o = output_tokens.astype(float)
    order_start = np.sort(start_s)
    step = decode_step_alone_s(inst, prompt_tokens, output_tokens) if step_alone_s is None else step_alone_s
    for _ in range(max_iterations):
        end = start_s + o * step
        mid = (start_s + end) / 2
        active = _open_at(order_start, np.sort(end), mid)
        duration = end - start_s
        context = float(np.sum((p + o / 2) * duration) / max(np.sum(duration), 1e-12))
        previous, step = step, _decode_steps(inst, active, instances, context)
        if np.max(np.abs(step - previous) / previous) < tolerance:
            break
    batch = np.maximum(active / instances, 1.0)
    end = start_s + o * step
    # KV tokens held: +(prompt + output) at start, released at end; peak of the running sum.
    times = np.concatenate([start_s, end])
    weights = np.concatenate([p + o, -(p + o)])
    peak = core.running_peak(times, weights, np.argsort(times)) / instances  # (releases before admissions at equal times)
    busy = float(np.sum(end - start_s))
    span = float(max(end.max() - start_s.min(), 1e-9))
    return DecodeResult(step, peak / inst.fit.kv_capacity_tokens, busy / span / instances, context,
                        float(np.percentile(batch, 99)))


def colocated_pool(trace, inst: Instance, instances: int, max_batch_tokens: int, max_num_seqs: int | None = None,
                   prefix: PrefixModel | None = None) -> SimulatedPool:
    """Per-request TTFT, TBT and E2E on `instances` co-located (non-split) instances: the
    simulator's own replay (sim.cluster), so a co-located plan's verdict is the one
    `simulate` gives it. Mixed batching feeds back on itself (prefills stall the decodes,
    the longer decodes grow the batch every prefill carries, KV admission queues prompts
    and preempts), which `colocated_estimate` follows only roughly. The replay runs compiled
    (splitplan_core.run): about 0.5 us an event on this project's 2-core machine, some 25 events a request
    (more with more, smaller instances, each iterating on its own). KV memory is the replay's to
    enforce (admission, preemption), so it shows in the latencies and `kv_peak_fraction` is 0.
    With `prefix`, the simulator's prefix caches."""
    pool = PoolSpec(Role.MIXED, inst, inst.machines_for(instances), instances)
    result = simulate(trace, [pool], SimOptions(max_batch_tokens=max_batch_tokens, max_num_seqs=max_num_seqs,
                                                routing="prefix-aware" if prefix is not None and prefix.prefix_aware else "jsq",
                                                prefix_caching=prefix is not None,
                                                kv_offload_gb=prefix.offload_gb if prefix is not None else 0.0))
    row = pool_report(result, [pool])[0]
    prefill_s, decode_s = sum(x.prefill_s for x in result.instances), sum(x.decode_s for x in result.instances)
    return SimulatedPool(result.ttft_s, result.tbt_s, result.itl_s, result.tpot_s, result.e2e_s, 0.0, row["utilization"],
                         row["prefix_hit_rate"], ((inst.hardware, inst.layout.gpus, instances, prefill_s, decode_s),),
                         result.span_s)


def busy_s(start_s: np.ndarray, end_s: np.ndarray, instances: int) -> float:
    """Instance-seconds spent running iterations by `instances` instances serving these
    [start, end) intervals, spread over them as join-shortest-queue spreads them: an instance
    is idle only while fewer intervals than instances are open (the integral of
    min(open, instances) over time)."""
    times = np.concatenate([start_s, end_s])
    steps = np.concatenate([np.ones(len(start_s)), -np.ones(len(end_s))])
    order = np.lexsort((steps, times))  # ends before starts at equal times
    open_ = np.cumsum(steps[order])[:-1]
    return float(np.sum(np.minimum(open_, instances) * np.diff(times[order])))


def colocated_estimate(arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray, inst: Instance,
                       instances: int, max_batch_tokens: int, memo: dict | None = None, chunked: bool = False,
                       max_seqs: int | None = None) -> Latencies:
    """A fast estimate of `colocated_pool`, to rank co-located options before the best are
    simulated: optimistic, by 5-25 % at moderate load and far more near saturation, where
    the feedback it leaves out takes over.

    Mixed continuous batching with prefill priority: a queued prompt batch runs in
    the next iteration together with the instance's decodes, so (a) each prefill
    iteration also carries the decode batch, and (b) every decode on that instance
    waits the whole iteration. A request's decode is stretched by the prefill
    work its own instance does while it decodes (requests routed as the simulator
    routes co-located instances, each held until about its finish). The decode load a prefill
    carries comes from a first decode pass that starts each request after its
    prefill alone; the prompts are then replayed once with that load. `memo` (a
    dict reused across calls on the same trace and instance) keeps batch times
    per decode load, rounded to 1/4 request and 64 tokens of context, and (under "alone") each
    request's prefill and decode step alone, which do not depend on the count. `chunked` and
    `max_seqs`: the engine's scheduler, as `prompt_queue_ttft_s` takes them.

    The inter-token gaps (`itl`, a `Gaps`): every prefill batch stretches one gap of each request
    decoding on its instance when it starts to the batch's duration; a request's other gaps are
    its decode step. `tpot`: per request, its decode time over its gaps (NaN for one token).
    """
    o = output_tokens.astype(float)
    memo = {} if memo is None else memo
    if "alone" not in memo:
        memo["alone"] = (inst.prefill_time_s(prompt_tokens), decode_step_alone_s(inst, prompt_tokens, output_tokens))
    alone_s, step_alone_s = memo["alone"]
    unstalled = decode_pool(arrival_s + alone_s, prompt_tokens, output_tokens, inst, instances, step_alone_s=step_alone_s)
    load = (round(unstalled.mean_batch * 4) / 4, round(unstalled.context_tokens / 64) * 64)
    if load not in memo:
        memo[load] = BatchTimes(inst, *load)
    prefill_share = min(float(np.sum(alone_s)) / instances / max(float(np.ptp(arrival_s)), 1e-9), 0.9)
    held_s = alone_s + o * unstalled.step_s / (1 - prefill_share)  # until it is about to finish
    replayed = replay_prompts(arrival_s, prompt_tokens, [(inst, instances)], max_batch_tokens, [memo[load]], held_s,
                              chunked=chunked, max_seqs=max_seqs)
    ttft = replayed.ttft_s
    start = arrival_s + ttft
    res = decode_pool(start, prompt_tokens, output_tokens, inst, instances, step_alone_s=step_alone_s)
    # Each request is stalled by its own instance's prefills: batches keyed by (instance, start).
    starts, durations, where = replayed.passes.T
    offset = float(np.max(starts + durations)) + 1.0  # past every batch
    keys = where * offset + starts
    order = np.argsort(keys, kind="stable")
    keys, cum = keys[order], np.concatenate([[0.0], np.cumsum(durations[order])])
    base = replayed.placed * offset
    gaps = np.maximum(o - 1, 0)
    decode_s = gaps * res.step_s
    for _ in range(2):  # the stall stretches the window, which may hold more prefills
        end = np.minimum(start + decode_s, offset - 0.5)  # (within its instance's keys)
        first, last = _searchsorted(keys, base + start, "left"), _searchsorted(keys, base + end, "right")
        decode_s = gaps * res.step_s + cum[last] - cum[first]
    stalled = np.minimum(last - first, gaps)  # gaps stretched by a prefill batch, per request
    decoding = _open_at(np.sort(base + start), np.sort(base + end), keys)  # requests decoding at each batch's start
    itl = Gaps(np.concatenate([durations[order], res.step_s]), np.concatenate([decoding, gaps - stalled]).astype(float))
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(gaps > 0, decode_s / gaps, np.nan)
    return Latencies(ttft, decode_s / o, itl, tpot, ttft + decode_s, res.kv_peak_fraction)


def smallest_count(check, lower: int = 1, guess: int | None = None, step_fraction: float = 0.125,
                   score=None) -> int | None:
    """Smallest n >= lower with check(n) true, assuming check is monotone in n;
    None past MAX_INSTANCES. `lower` must be a true lower bound; `guess` only
    says where to start: the search steps down or up from it, by `step_fraction` of it (at
    least one) and twice as far at each further step, until it brackets the answer, then
    bisects. A guess within that fraction of the answer costs three or four checks.

    With `score` (score(n) of a count already checked: how far from holding it is, above 1
    failing and at most 1 holding, smooth in n), the steps and the split are aimed (`_Aim`): a
    walk steps to where the line through the last two counts' log scores, over their log counts,
    crosses 0; a bracket is split once there, then counts 1, 2, 4, ... beyond that one toward the
    answer are checked until one brackets it, and the rest is halved. Only which counts are
    checked changes: for a monotone check the answer is the same."""
    aim = _Aim(score)
    n = min(max(lower, guess or lower, 1), MAX_INSTANCES)
    step = max(1, int(n * step_fraction))
    if aim.check(check, n):
        hi, lo = n, lower - 1
        while hi > lower:  # walk down until a count fails (or the lower bound is reached)
            down = max(aim.toward(hi, step, -1), lower)
            if aim.check(check, down):
                hi, step = down, step * 2
            else:
                lo = down
                break
    else:
        lo = n
        while True:
            if lo >= MAX_INSTANCES:
                return None
            up = min(aim.toward(lo, step, 1), MAX_INSTANCES)
            if aim.check(check, up):
                hi = up
                break
            lo, step = up, step * 2
    return aim.bisect(check, lo, hi)


class _Aim:
    """smallest_count's aimed steps and splits (`score`); plain steps and halves without one."""

    def __init__(self, score):
        self.score, self.logs = score, {}  # log score of each count checked and scored, in the order checked

    def check(self, check, n: int) -> bool:
        ok = check(n)
        if self.score is not None:
            value = float(self.score(n))
            if not math.isnan(value):
                self.logs[n] = math.log(min(max(value, 1e-6), 1e6))
        return ok

    def _crossing(self, a: int, b: int) -> float | None:
        """Where the line through the log scores of counts a and b over their logs crosses 0 (None
        if either is unscored, or the line does not fall as counts grow)."""
        if a not in self.logs or b not in self.logs or a == b or min(a, b) < 1 or (self.logs[a] - self.logs[b]) * (b - a) <= 0:
            return None
        log_x = math.log(a) + (math.log(b) - math.log(a)) * self.logs[a] / (self.logs[a] - self.logs[b])
        return math.exp(min(log_x, math.log(4 * MAX_INSTANCES)))  # (a line that barely falls crosses far out: capped)

    def toward(self, n: int, step: int, sign: int) -> int:
        """The next count of a walk from n (down: sign -1, up: +1): `step` away, or aimed a little
        past where the last two counts' scores cross (so that it brackets), between a quarter of
        a step and 8 steps away (the walk's steps double: a poor aim cannot make it crawl)."""
        last = list(self.logs)[-2:]  # (the last two counts scored)
        x = self._crossing(*last) if len(last) == 2 else None
        if x is None or (x - n) * sign <= 0:
            return n + sign * step
        distance = math.ceil(x * 1.02) - n if sign > 0 else n - math.floor(x * 0.98)
        return n + sign * min(max(distance, step // 4, 1), 8 * step)

    def bisect(self, check, lo: int, hi: int) -> int:
        """The smallest holding count in (lo, hi], lo failing (or below the lower bound) and hi
        holding: where lo and hi are scored as failing and holding, one aimed count, then counts
        1, 2, 4, ... beyond it toward the answer until one brackets it; halves for the rest."""
        scored = self.logs.get(lo, 0.0) > 0.0 >= self.logs.get(hi, 1.0)  # (lo scored failing, hi holding)
        x = self._crossing(lo, hi) if scored and hi - lo > 1 else None
        if x is not None:
            mid = min(max(math.ceil(x), lo + 1), hi - 1)
            side = self.check(check, mid)
            lo, hi = (lo, mid) if side else (mid, hi)
            gap = 1
            while hi - lo > 1:
                probe = min(max(mid - gap if side else mid + gap, lo + 1), hi - 1)
                ok = self.check(check, probe)
                lo, hi = (lo, probe) if ok else (probe, hi)
                if ok != side:
                    break
                mid, gap = probe, gap * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if self.check(check, mid) else (mid, hi)
        return hi
