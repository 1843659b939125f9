"""A plan evaluated on the whole trace: per-request TTFT, inter-token gaps and E2E of its split
pools (the prompt replay, the decode fixed point, the KV transfer) or of its co-located pool (the
simulator's replay), and how those values meet the SLO's lines."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np

from splitplan.capacity.pools import (
    BatchTimes,
    Latencies,
    busy_s,
    colocated_pool,
    decode_pool,
    replay_prompts,
)
from splitplan.perf.roofline import Instance, kv_transfer_time_s
from splitplan.perf.slo import Gaps, achieved, attainment_pct, meets
from splitplan.search.types import SHARED, AnyKey, AnyOption, Combo, OptionKey, Problem
from splitplan.specs.roles import SPLIT, Role
from splitplan.specs.slo import METRICS, SloLine


def slo_lines(problem: Problem, metric: str) -> list[SloLine]:
    return [x for x in problem.slo.lines() if x.metric == metric]


def first_failing(problem: Problem, metric: str, values: np.ndarray | Gaps) -> SloLine | None:
    for line in slo_lines(problem, metric):
        if not meets(line, achieved(line, values, problem.reference)):
            return line
    return None


def decode_values(problem: Problem, inst: Instance, n: int, src: Instance, start_s: np.ndarray, idx=slice(None),
                   local: tuple[Instance, float] | None = None, step_alone_s: np.ndarray | None = None):
    """TBT, decode seconds (KV transfer included) and the decode pool's result of the requests
    `idx` on `n` token instances `inst`, their KV from `src`; with `local` (a prompt instance and a
    share), that share of them (spread deterministically) prefilled on their token instance's
    machine, their KV over its GPU links."""
    t = problem.trace
    p, o = t.prompt_tokens[idx], t.output_tokens[idx]
    result = decode_pool(start_s, p, o, inst, n, step_alone_s=step_alone_s)
    transfer = kv_transfer_time_s(src, inst, p)
    if local is not None:
        mine = (np.arange(len(p)) * 0.41421356237309503) % 1.0 < local[1]
        transfer = np.where(mine, kv_transfer_time_s(local[0], inst, p, local=True), transfer)
    decode_s = transfer + np.maximum(o - 1, 0) * result.step_s
    return decode_s / o, decode_s, result


def decode_gaps(o: np.ndarray, decode_s: np.ndarray, step_s: np.ndarray, busy: np.ndarray | float,
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


@dataclass(frozen=True)
class Evaluation(Latencies):
    """A plan evaluated on the whole trace: its latencies (`Latencies.of` a metric), and per pool
    (keyed as options are) its busy fraction and prefix hit rate; its GPUs' phases (hardware, GPUs
    per instance, instances, prefill s, decode s) and the span they cover."""
    utilization: dict = field(default_factory=dict)
    prefix_hit_rate: dict = field(default_factory=dict)
    phases: tuple = ()
    span_s: float = 0.0


def colocated_values(problem: Problem, key: OptionKey, inst: Instance, instances: int) -> Evaluation:
    """`evaluate`'s values of a co-located pool of `instances` instances: the simulator's replay."""
    pool = colocated_pool(problem.trace, inst, instances, problem.max_batch_tokens, problem.max_num_seqs, problem.prefix)
    return Evaluation(pool.ttft, pool.tbt, pool.itl, pool.tpot, pool.e2e, pool.kv_peak_fraction, {key: pool.utilization},
                      {key: pool.prefix_hit_rate}, pool.phases, pool.span_s)


def evaluate(problem: Problem, counts: dict[AnyKey, int], options: dict[AnyKey, AnyOption], memo: dict | None = None,
             fewer: tuple | None = None) -> Evaluation:
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
        return colocated_values(problem, key, inst, _less(key, inst.instances_on(machines), fewer))
    memo = {} if memo is None else memo
    prompt_parts, token_parts = (pool_parts(counts, options, role, fewer) for role in SPLIT)
    prompt_keys = [k for k, *_ in prompt_parts]
    prompt = [(o.inst, n) for _, o, n, _ in prompt_parts]
    token_keys = [k for k, *_ in token_parts]
    token = [(o.inst, n) for _, o, n, _ in token_parts]
    replayed = _prompt_replay(problem, prompt_parts, memo)
    ttft, prompt_busy_s, rates = replayed
    hits = dict(zip(prompt_keys, rates, strict=True)) if rates else {}  # (rates: with a prefix cache)
    src = max(prompt, key=lambda pair: pair[1])[0]
    kind = _token_kinds(token_parts, len(t))
    prompt_instances = sum(n for _, n in prompt)
    tbt, decode_s, step_s, kv_peak, token_busy_s = _token_pools(problem, token_parts, options, kind, src, t.arrival_s + ttft,
                                                                prompt_instances)
    e2e = ttft + decode_s
    span_s = max(float(np.max(t.arrival_s + e2e) - t.arrival_s[0]), 1e-9)  # as the simulator's utilization
    keys = prompt_keys + token_keys
    pool_busy_s = [*prompt_busy_s, *token_busy_s]
    utilization = {k: min(b / (span_s * n), 1.0) for k, b, (_, n) in zip(keys, pool_busy_s, prompt + token, strict=True)}
    token_busy = np.array([utilization[k] for k in token_keys])[kind]  # each request's token instance's
    itl, tpot = decode_gaps(t.output_tokens, decode_s, step_s, token_busy, src.engine.async_scheduling)
    return Evaluation(ttft, tbt, itl, tpot, e2e, kv_peak, utilization, hits,
                      tuple(_phases(prompt, prompt_busy_s, token, token_busy_s)), span_s)


def _token_kinds(token_parts: list[tuple], requests: int) -> np.ndarray:
    """Each request's token pool: in proportion to their capacity (a deterministic interleave)."""
    share = np.array([n / o.instances for _, o, n, _ in token_parts])
    cut = np.cumsum(share / share.sum())
    return np.minimum(np.searchsorted(cut, (np.arange(requests) * 0.6180339887498949) % 1.0, side="right"), len(token_parts) - 1)


def _token_pools(problem: Problem, token_parts: list[tuple], options: dict, kind: np.ndarray, src: Instance, start: np.ndarray,
                 prompt_instances: int) -> tuple:
    """(per request TBT, decode seconds and step seconds, the largest KV peak fraction, busy seconds
    per token pool) of the token pools, request i on pool kind[i] from start[i] (its first token)."""
    t = problem.trace
    tbt, decode_s, step_s = np.empty(len(t)), np.empty(len(t)), np.empty(len(t))
    kv_peak = 0.0
    token_busy_s = np.zeros(len(token_parts))
    for j, (_, option, n, combo) in enumerate(token_parts):
        inst, idx = option.inst, np.flatnonzero(kind == j)
        # on shared machines, a request's prompt instance is on its token instance's machine as
        # often as that machine's share of the prompt instances
        shared = None if combo is None else cast(Combo, options[combo])
        local = None if shared is None else (shared.prompt.inst, shared.prompt_instances / prompt_instances)
        if len(idx):
            tbt[idx], decode_s[idx], res = decode_values(problem, inst, n, src, start[idx], idx, local)
            step_s[idx] = res.step_s
            kv_peak = max(kv_peak, res.kv_peak_fraction)
            steps_s = np.maximum(t.output_tokens[idx] - 1, 0) * res.step_s  # (after the KV transfer)
            token_busy_s[j] = busy_s(start[idx] + decode_s[idx] - steps_s, start[idx] + decode_s[idx], n)
    return tbt, decode_s, step_s, kv_peak, token_busy_s


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
                memo["batch", family, layout] = BatchTimes(o.inst)
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


def pool_parts(counts: dict, options: dict, role: Role, fewer: tuple | None = None) -> list[tuple]:
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


def check(problem: Problem, values: Latencies) -> list[tuple[SloLine, float, bool]]:
    out = []
    for line in problem.slo.lines():
        value = achieved(line, values.of(line.metric), problem.reference)
        out.append((line, value, meets(line, value)))
    return out


def attainments(problem: Problem, values: Latencies) -> tuple[float, ...]:
    """Per SLO line (in `check`'s order), the share of requests (of gaps, for ITL) within its limit, %."""
    return tuple(attainment_pct(line, values.of(line.metric), problem.reference) for line in problem.slo.lines())


def percentiles_ms(values: Latencies) -> dict:
    def pct(v, q):
        return v.percentile(q) if isinstance(v, Gaps) else float(np.nanpercentile(v, q))
    return {m: {f"p{q}": pct(values.of(m), q) * 1e3 for q in (50, 90, 99)} for m in METRICS}
