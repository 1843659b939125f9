"""One pool option sized alone on the trace: the smallest instance count that meets every SLO line
the option's role answers for (capacity.pools), and the line that decided it."""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from typing import Any

import numpy as np

from splitplan.capacity.pools import (
    MAX_INSTANCES,
    BatchTimes,
    Latencies,
    colocated_estimate,
    decode_step_alone_s,
    kv_bound_guess,
    prompt_queue_ttft_s,
    smallest_count,
)
from splitplan.perf.roofline import Instance
from splitplan.perf.slo import achieved, alone_latencies, attainment_pct, meets
from splitplan.search.evaluation import colocated_values, decode_gaps, decode_values, first_failing, slo_lines
from splitplan.search.types import Option, Problem
from splitplan.specs.roles import Role
from splitplan.specs.slo import METRICS, SloLine
from splitplan.workload.trace import Trace


def _fails_alone(problem: Problem, role: Role, inst: Instance) -> tuple[SloLine, str] | None:
    """The first line an option misses even running requests alone and why (its value), or None."""
    alone = alone_latencies(inst, problem.trace.prompt_tokens, problem.trace.output_tokens)  # more instances only approach these
    for metric in ("tbt", "itl", "tpot") if role == Role.TOKEN else METRICS:
        for line in slo_lines(problem, metric):
            value = achieved(line, alone.value(metric), problem.reference)
            if not meets(line, value):
                return line, f"{line.label} not met even running requests alone ({line.text(value)} at best, target {line.target})"
    return None


def _busy_guess(inst: Instance, t: Trace) -> int:
    """Where the count search starts: the instances the prefill work keeps busy on
    average (a guess, not a bound: a short or bursty trace may need fewer or more)."""
    work = float(np.sum(inst.prefill_time_s(t.prompt_tokens)))
    return max(1, min(len(t), math.ceil(work / max(t.span_s, 1e-9))))


def stall_guess(problem: Problem, inst: Instance) -> int | None:
    """Where a co-located pool's count search starts under inter-token lines (None without one). Each
    prefill batch stretches one gap of every request decoding on its instance (`colocated_estimate`).
    At a rate r of requests with o outputs on average over n instances, B = r o step / n decode on
    each; join-shortest-queue sends a prompt to an instance holding the fewest, about half a request
    fewer. So a share q (B - 1/2) / o of the gaps is stretched past the line's limit, q the share of
    prompts whose prefill alone passes the limit less a step, and it must stay within the share
    a = 1 - p / 100 the line's percentile allows: n = q r o step / (q / 2 + a o), at each request's
    step alone (a guess, not a bound: batches carry several prompts, steps grow with the batch)."""
    t = problem.trace
    lines = slo_lines(problem, "itl")
    if not lines:
        return None
    step_s = decode_step_alone_s(inst, t.prompt_tokens, t.output_tokens)
    prefill_s = np.asarray(inst.prefill_time_s(t.prompt_tokens))
    rate, output, mean_step_s = len(t) / max(t.span_s, 1e-9), float(np.mean(t.output_tokens)), float(np.mean(step_s))
    need = []
    for line in lines:
        stretched = float(np.mean(prefill_s > line.limit / 1e3 - step_s))
        need.append(stretched * rate * output * mean_step_s / (stretched / 2 + (1 - line.percentile / 100) * output))
    return max(1, min(len(t), math.ceil(max(need))))  # (no more instances than requests, as `_busy_guess`)


def _guess(problem: Problem, role: Role, inst: Instance) -> int:
    """Where an option's count search starts: a token pool's instances whose KV holds its requests
    decoding alone, a co-located pool's `stall_guess`, else the instances the prefill work keeps busy."""
    t = problem.trace
    if role == Role.TOKEN:
        return kv_bound_guess(t.arrival_s, t.prompt_tokens, t.output_tokens, inst,
                              decode_step_alone_s(inst, t.prompt_tokens, t.output_tokens))
    stalls = stall_guess(problem, inst) if role == Role.MIXED else None
    return _busy_guess(inst, t) if stalls is None else stalls


def size_option(problem: Problem, role: Role, inst: Instance, lower: int = 1, guess: int | None = None) -> Option:
    """n*(o) for one option alone, and the line that decided it. `lower` is a known
    lower bound on n* (a co-located pool needs at least the prompt pool's count); `guess`, where
    the count search starts (None: `_guess`)."""
    refused = _refused(problem, role, inst)
    if refused is not None:
        return refused
    scores: dict[int, float] = {}  # (how far each count checked is from holding: where the search is aimed, smallest_count's score)
    check = {Role.PROMPT: _prompt_check, Role.TOKEN: _token_check}.get(role, _mixed_check)
    failing = functools.cache(check(problem, inst, scores))  # (the bisection has usually tried n - 1, which names the binding line)
    n = smallest_count(lambda k: failing(k) is None, lower, guess or _guess(problem, role, inst), score=scores.get)
    if n is None:
        missed = failing(MAX_INSTANCES)  # (the walk's last check: more instances only approach this)
        label = getattr(missed, "label", missed)
        return Option(role, inst, None, label, f"{label} not met at any size (checked up to {MAX_INSTANCES:,} instances)")
    binding = failing(n - 1) if n > 1 else None
    if binding is None and n > 1:  # n came from the lower bound: the bound is what binds
        binding = "prompt-pool size (lower bound)"
    label = binding if isinstance(binding, str) else (binding.label if binding else "minimum size (1 instance)")
    return Option(role, inst, n, label)


def _refused(problem: Problem, role: Role, inst: Instance) -> Option | None:
    """The option unsized, and why, where no count can hold: the model does not fit, the longest
    prompt's (prompt pool) or request's KV exceeds one instance's, or a line fails with one request alone."""
    if not inst.fit.fits:
        return Option(role, inst, None, "", inst.fit.reason)
    t = problem.trace
    group = " (of one attention DP group)" if inst.layout.dp > 1 else ""
    if role == Role.PROMPT:
        if int(np.max(t.prompt_tokens)) > inst.max_request_tokens:  # (the simulator's rule too)
            return Option(role, inst, None, "KV memory", "the longest prompt's KV exceeds one instance's KV capacity" + group)
        alone = first_failing(problem, "ttft", np.asarray(inst.prefill_time_s(t.prompt_tokens)) + inst.engine.frontend_latency_s)
        return None if alone is None else Option(role, inst, None, alone.label, f"{alone.label} not met even without queueing")
    if int(np.max(t.prompt_tokens + t.output_tokens)) > inst.max_request_tokens:
        return Option(role, inst, None, "KV memory", "the longest request's KV exceeds one instance's KV capacity" + group)
    alone_miss = _fails_alone(problem, role, inst)
    return None if alone_miss is None else Option(role, inst, None, alone_miss[0].label, alone_miss[1])


def _prompt_check(problem: Problem, inst: Instance, scores: dict):
    """A prompt pool of n instances: the TTFT line it misses (None: none), its score in `scores`."""
    t = problem.trace
    batch_times = [BatchTimes(inst)]

    def failing(n):
        ttft = prompt_queue_ttft_s(t.arrival_s, t.prompt_tokens, [(inst, n)], problem.max_batch_tokens, batch_times,
                                   chunked=problem.chunked, max_seqs=problem.max_num_seqs, prefix=problem.prefix)
        scores[n] = _excess(problem, {"ttft": ttft})  # (the one metric a prompt pool answers for)
        return first_failing(problem, "ttft", ttft)
    return failing


def _token_check(problem: Problem, inst: Instance, scores: dict):
    """A token pool of n instances: the TBT, ITL or TPOT line it misses, or "KV memory" or
    "max_num_seqs" (None: none), its score in `scores`."""
    t = problem.trace
    step_alone_s = decode_step_alone_s(inst, t.prompt_tokens, t.output_tokens)  # (the same for every count)

    def failing(n):
        tbt, decode_s, res = decode_values(problem, inst, n, inst, t.arrival_s, step_alone_s=step_alone_s)
        itl, tpot = decode_gaps(t.output_tokens, decode_s, res.step_s, min(res.mean_batch, 1.0), inst.engine.async_scheduling)
        reached = [(line, achieved(line, values, problem.reference))
                   for metric, values in (("tbt", tbt), ("itl", itl), ("tpot", tpot)) for line in slo_lines(problem, metric)]
        scores[n] = max([value / line.limit for line, value in reached]
                        + [res.kv_peak_fraction, res.batch_p99 / problem.max_num_seqs if problem.max_num_seqs else 0.0])
        missed = next((line for line, value in reached if not meets(line, value)), None)
        if missed is not None:
            return missed
        if res.kv_peak_fraction > 1:
            return "KV memory"
        return "max_num_seqs" if problem.max_num_seqs and res.batch_p99 > problem.max_num_seqs else None
    return failing


def _mixed_check(problem: Problem, inst: Instance, scores: dict):
    """A co-located pool of n instances, estimated (the best is simulated: colocated_plan): the line
    it misses (None: none), its score in `scores`."""
    t = problem.trace
    memo: dict = {}

    def failing(n):
        values = colocated_estimate(t.arrival_s, t.prompt_tokens, t.output_tokens, inst, n, problem.max_batch_tokens, memo,
                                    problem.chunked, problem.max_num_seqs)
        scores[n] = _excess(problem, values.by_metric, values.kv_peak_fraction)
        return _mixed_failing(problem, values)
    return failing


def _excess(problem: Problem, predicted: dict[str, Any], kv_peak_fraction: float = 0.0) -> float:
    """How far a pool's values (by metric, and its KV peak where known) are from holding every
    line, smooth in its count: the largest, over the lines, of the share of requests (or gaps)
    past the line's limit over the share its percentile allows (at most 1 where the line holds,
    near enough), and the KV peak over the KV held."""
    worst = float(kv_peak_fraction)
    for line in problem.slo.lines():
        if line.metric in predicted:
            outside = 100.0 - attainment_pct(line, predicted[line.metric], problem.reference)
            worst = max(worst, outside / max(100.0 - line.percentile, 1e-3))
    return worst


def _mixed_failing(problem: Problem, values: Latencies):
    """The first line a co-located pool's values miss (or "KV memory"), None when all hold."""
    for metric in METRICS:
        line = first_failing(problem, metric, values.of(metric))
        if line is not None:
            return line
    return "KV memory" if values.kv_peak_fraction > 1 else None


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
            values = colocated_values(problem, option.key, option.inst, n)
            seen[n], scores[n] = _mixed_failing(problem, values), _excess(problem, values.by_metric, values.kv_peak_fraction)
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
