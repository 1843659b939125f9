"""Discrete-event simulation of a serving cluster, request by request.

Machines are split into model instances (machine GPUs / TP). Every instance runs
one iteration at a time; what an iteration holds depends on the instance's role:
- prompt: a prefill batch (FCFS from its queue, at most `max_batch_tokens` prompt
  tokens, at least one prompt). When it ends, each request has its first token
  (TTFT) and its KV cache is sent to the token instance chosen at arrival.
- token: continuous batching. Requests whose KV has arrived join at an iteration
  boundary when their KV (prompt + output tokens, reserved whole) fits the
  instance's KV capacity, in arrival order; each iteration gives every request in
  the batch one token; its time is the perf model's at the batch size and the
  summed context, which grows by one token per request per iteration.
- mixed (co-located baselines): both. A request's KV (prompt + output tokens) is
  reserved before its prefill, as engines allocate a prompt's KV blocks before
  computing it, so a request that does not fit waits, in arrival order, and the
  wait is part of its TTFT. A queued prefill batch goes into the next iteration
  together with the decode batch (prefill priority), so decodes stall while a
  prompt runs; finished prefills join the instance's own decode batch.
With an engine whose `scheduler` is `chunked` (chunked prefill, today's engines), an
iteration of any role instead carries every decoding request plus, up to the token
budget (`max_batch_tokens`, the engine's max_num_batched_tokens) in all, the head of the
prompt queue, a prompt split over iterations when it does not fit (its causal
attention counted chunk by chunk); its first token comes with its last chunk.
With `max_num_seqs`, at most that many requests run on an instance at once (decoding,
or admitted to prefill on a co-located one; prompts in one prefill iteration), as
vLLM's and SGLang's schedulers cap them; the rest wait in arrival order.

KV transfer (split pools) occupies the source's and the destination's NIC shares,
each shared FIFO by concurrent transfers, at the smaller of the two bandwidths; between
a prompt and a token instance on one machine (pools sharing machines) it moves over the
machine's GPU links instead, leaving the NICs free.
Prompts shorter than the engine's `layerwise_transfer_min_tokens` are sent after
the prefill (serialized); longer ones layer by layer from the prefill's start, so
only the last layer's share (or what the link could not keep up with) is exposed.
The engine's `kv_transfer_latency_s` is added either way.

Routing at arrival: join-shortest-queue on pending tokens (prompt instances:
prompt tokens queued or in a running prefill, so a busy machine never ties with
an idle one; token instances: output tokens of the requests assigned and not yet
finished; co-located instances: prompt tokens pending plus one per request held,
as splitwise-sim's token_jsq counts them, so idle instances share the decodes), ties
to the lowest index; or round-robin; or, with prefix caches, prefix-aware (the prefilling
instance with the fewest prompt tokens to compute, its pending ones plus the request's less
what its cache holds, as KV-aware routers score them). The planner's prompt replay
(capacity.pools.prompt_queue_ttft_s) routes prompt pools the same way.
Splitwise's mixed pool, both ways, with `borrow_threshold_tokens`, only when a
resource is short (join-shortest-queue routing then):
- KV memory: a request whose KV would overfill its token instance (counting the
  KV committed there: requests routed there and not finished, as splitwise-sim
  counts it; counting only prefilled ones over-commits and queues decodes) goes
  to the token instance with the most room; only when none has room is it
  decoded on a prompt instance: one already lent with room, else the one with the
  fewest pending prompt tokens. A lent prompt instance (one holding such
  decodes) takes new prompts only when every other prompt queue is long, so the
  decodes it runs are not stalled by prefills; it returns when they finish.
- Prompt queues: a prompt that finds every prompt instance with a queue and more
  pending tokens than the threshold is prefilled on its token instance, which
  decodes it there.
A borrowed instance runs mixed iterations (prefill priority).

Determinism: one event heap keyed on (time, sequence number); the counter
belongs to the run, so equal times resolve the same way every run.

A run without borrowing runs compiled (splitplan_core.run: these rules, prefix caches and host
tier, closed loops, shared machines, the event log, recorded passes and measured tables
included), the same result to the bit.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
from array import array
from typing import cast

import numpy as np

from splitplan.base import limits
from splitplan.base.core import core
from splitplan.base.errors import SpecError
from splitplan.perf.roofline import Instance, local_kv_bytes_per_s
from splitplan.perf.table import MeasuredInstance
from splitplan.sim import gaps, routing
from splitplan.sim.prefix_cache import PrefixCache, PrefixModel
from splitplan.sim.types import (  # noqa: F401  (re-exported)
    MIXED,
    PROMPT,
    TOKEN,
    Event,
    InstanceState,
    InstanceStats,
    PoolSpec,
    SimOptions,
    SimResult,
)
from splitplan.specs.roles import Role
from splitplan.workload.trace import Trace


def simulate(trace: Trace, pools: list[PoolSpec], options: SimOptions = SimOptions()) -> SimResult:
    return _Cluster(trace, pools, options).run()


# Decode-only iterations that nothing can interrupt are computed at once (_decode_stretch);
# off only to check that it changes nothing.
FUSE_DECODE_STRETCHES = True
# A run without borrowing runs compiled (splitplan_core.run, the same result); off only to
# compare the two.
COMPILED = True
# plain ints on the hot path
_KV_ARRIVED, _ITERATION_END, _PREFIX_LOADED = int(Event.KV_ARRIVED), int(Event.ITERATION_END), int(Event.PREFIX_LOADED)


class _Cluster:
    """One simulation run: the cluster's state, the event heap, and the handlers."""

    def __init__(self, trace: Trace, pools: list[PoolSpec], options: SimOptions):
        self.trace, self.pools, self.options = trace, pools, options
        self.log: list | None = [] if options.record_events else None
        self.n = len(self.trace)
        self.closed = self.options.concurrency
        if self.closed is not None and self.closed < 1:
            raise ValueError("concurrency must be >= 1")
        self._arrivals()
        self.prompt_tokens = self.trace.prompt_tokens.tolist()
        self.output_tokens = self.trace.output_tokens.tolist()
        self.insts: list[InstanceState] = []
        self.iterations = 0  # decode iterations of every instance, bounded (limits.MAX_SIM_ITERATIONS)
        self.max_iterations = limits.MAX_SIM_ITERATIONS  # (read once: the check runs every iteration)
        self._place_instances()
        self.model = self.pools[0].perf.model
        self.context = self.options.max_model_len  # a longer request is refused at arrival (None: no limit)
        self.kv_bytes = self.model.kv_bytes_per_token(self.pools[0].perf.engine.kv_bytes_per_element)
        self.layers = self.model.num_hidden_layers
        self.max_tokens = self.options.max_batch_tokens
        self._pool_tables()
        self.cap = self.options.max_num_seqs or math.inf  # requests running on one instance at once
        # prompt tokens prefilled so far: a prefix the engine's cache holds counts as done
        self.cached = [0] * self.n if trace.cached_tokens is None else np.minimum(trace.cached_tokens, trace.prompt_tokens - 1).tolist()
        self.done = list(self.cached)
        # the engine's prefix cache, per instance (where the trace records prefixes): a prefilling one
        # skips what it holds (with --kv-offload-gb, also what its host memory holds, loaded back
        # first); a token instance receives only the KV it does not hold
        self.caches: dict[int, PrefixCache] = {}
        if options.prefix_caching and trace.prefix is not None:
            self._prefix_caches(trace.prefix)
        self._request_state()
        self.heap: list = []
        self.seq = 0
        self.next_arrival = 0  # the next request to arrive (run's)
        self.fuse = FUSE_DECODE_STRETCHES and self.log is None  # (an event log has every iteration)
        self.passes: list | None = [] if options.record_passes else None
        self.isolated = self.closed is None and all(x.role == MIXED for x in self.insts)  # (see _quiet_until)
        self.front = self.pools[0].perf.engine.frontend_latency_s  # a request reaches the engine this long after it is sent
        self.tokens_out = 0
        self.round_robin = [0, 0]
        self.events = 0

    def _arrivals(self) -> None:
        """Arrival times: the trace's, or in a closed loop, the first `closed` requests at once and
        each later one when a client frees (unknown until then)."""
        closed = self.closed
        if closed is None:
            self.arrival = self.trace.arrival_s.tolist()
            self.released = self.n  # requests whose arrival time is known
            return
        self.arrival = [0.0] * min(closed, self.n) + [math.inf] * max(self.n - closed, 0)
        self.released = min(closed, self.n)

    def _place_instances(self) -> None:
        """Every pool's instances, numbered in pool order (a shared pool's on its shared machines),
        those that prefill and those that decode, and their routing loads."""
        for k, pool in enumerate(self.pools):
            share = pool.perf.kv_link_bytes_per_s
            per_machine = -(-pool.instances // pool.machines)
            for j in range(pool.instances):
                node = None if pool.shared is None else (pool.shared, j // per_machine)
                self.insts.append(InstanceState(len(self.insts), k, pool.role, pool.perf, share, node))
        self.prompt_side = [i for i in self.insts if i.role in (PROMPT, MIXED)]
        self.token_side = [i for i in self.insts if i.role in (TOKEN, MIXED)]
        if not self.prompt_side or not self.token_side:
            raise ValueError("a cluster needs prompt and token instances, or mixed ones")
        self.prompt_load = routing.loads(len(self.prompt_side))  # queued prompt tokens (+1 per request held: mixed)
        self.token_load = routing.loads(len(self.token_side))  # output tokens assigned and not finished
        self.p_pos = {inst.idx: k for k, inst in enumerate(self.prompt_side)}
        self.t_pos = {inst.idx: k for k, inst in enumerate(self.token_side)}

    def _pool_tables(self) -> None:
        """Per pool: each prompt's time alone, decode steps by batch size (filled as met), the
        chunked token budget (None: whole prompts), whether the engine schedules asynchronously."""
        self.single = {k: np.asarray(pool.perf.prefill_time_s(self.trace.prompt_tokens)).tolist() for k, pool in enumerate(self.pools)}
        self.lines: dict[int, dict[int, tuple]] = {k: {} for k in range(len(self.pools))}
        self.chunked = {k: self.max_tokens if pool.perf.engine.chunked else None for k, pool in enumerate(self.pools)}
        self.deferring = {k: pool.perf.engine.async_scheduling for k, pool in enumerate(self.pools)}

    def _prefix_caches(self, tree) -> None:
        """The engine's prefix cache per instance, over the trace's prefix tree."""
        self.prefix = PrefixModel(tree, self.pools[0].perf.engine.kv_block_tokens, self.options.kv_offload_gb)
        self.caches = {x.idx: self.prefix.cache(x.perf, host=x.role != TOKEN) for x in self.insts}
        self.node = tree.request_node.tolist()

    def _request_state(self) -> None:
        """Per request: its scheduling state and what the run records of it."""
        self.looked = [False] * self.n  # its prefill has begun and looked its prefix up
        self.pinned = [-1] * self.n  # the instance whose cache it pins a prefix in (-1: none)
        self.plen = list(self.prompt_tokens)  # tokens to prefill: the prompt, or prompt and output so far when preempted
        self.base = [1] * self.n  # tokens the request had when it (last) joined a decode batch
        self.resumed = [False] * self.n  # preempted and to be recomputed: its next prefill gives no TTFT
        self.stall = [0.0] * self.n  # longest wait from a preemption to the next token
        self.preempted_at = [0.0] * self.n
        self.rejoined = [np.nan] * self.n  # when a preempted request last rejoined its decode batch
        self.preemptions = 0
        self.ttft = [np.nan] * self.n
        self.e2e = [np.nan] * self.n
        self.prefill_start = [0.0] * self.n
        self.kv_ready = [np.nan] * self.n
        self.join_time = [np.nan] * self.n
        self.join_iter = [-1] * self.n
        self.p_inst = [-1] * self.n
        self.t_inst = [-1] * self.n
        self.rejected = [False] * self.n
        self.refused = [False] * self.n

    def _push(self, time, kind, a, b=None):
        self.seq += 1
        heapq.heappush(self.heap, (time, self.seq, kind, a, b))

    def _unassign(self, inst: InstanceState, i: int):
        """Request i no longer holds a decode place on inst (finished or rejected)."""
        inst.kv_committed -= self.prompt_tokens[i] + self.output_tokens[i]
        if inst.role == MIXED:  # it no longer counts in the instance's routing load
            self.prompt_load[self.p_pos[inst.idx]] -= 1
        if inst.idx in self.t_pos:
            self.token_load[self.t_pos[inst.idx]] -= self.output_tokens[i]

    def _pick(self, loads, which):
        if self.options.routing == "round-robin":
            self.round_robin[which] += 1
            return (self.round_robin[which] - 1) % len(loads)
        return routing.least_loaded(loads)

    def _prefix_pick(self, i: int) -> InstanceState:
        """Prefix-aware routing, as KV-aware routers score instances (Dynamo's: the prompt
        tokens an instance would compute, less what its cache holds, plus its load): the fewest
        prompt tokens to prefill there, its pending ones included; ties to the lowest index."""
        best, best_cost = None, math.inf
        for k, inst in enumerate(self.prompt_side):
            cost = self.prompt_load[k] + self.prompt_tokens[i] - self.caches[inst.idx].peek(self.node[i], self.prompt_tokens[i])
            if cost < best_cost:
                best, best_cost = inst, cost
        assert best is not None  # (a cluster has prompt instances: checked at the start)
        return best

    def _long_queue(self, inst: InstanceState, i: int) -> bool:
        return bool(inst.queue) and self.prompt_load[self.p_pos[inst.idx]] + self.prompt_tokens[i] > self.options.borrow_threshold_tokens

    def _mixed_pool_prompt(self, i: int) -> InstanceState:
        """Join-shortest-queue among the prompt machines not lent to decoding; a lent one
        (holding KV of borrowed decodes) only when every other queue is long."""
        own = [x for x in self.prompt_side if not x.kv_committed]
        best = min(own, key=lambda x: self.prompt_load[self.p_pos[x.idx]]) if own else None
        if best is None or self._long_queue(best, i):
            lent = [x for x in self.prompt_side if x.kv_committed]
            other = min(lent, key=lambda x: self.prompt_load[self.p_pos[x.idx]]) if lent else None
            if other is not None and (best is None or not self._long_queue(other, i)):
                best = other
        assert best is not None  # (own or lent: a cluster has prompt instances)
        return best

    def _lend_prompt(self, need: int) -> InstanceState | None:
        """The prompt machine to decode a request the token machines have no room for:
        one already lent with room (the fullest that fits, keeping the others whole),
        else the one with the fewest pending prompt tokens; None when none fits."""
        lent = [x for x in self.prompt_side if x.kv_committed and x.kv_committed + need <= x.kv_cap]
        if lent:
            return max(lent, key=lambda x: x.kv_committed)
        fresh = [x for x in self.prompt_side if not x.kv_committed and need <= x.kv_cap]
        return min(fresh, key=lambda x: self.prompt_load[self.p_pos[x.idx]]) if fresh else None

    def _release_client(self, now):
        """Closed loop: a client is free again and sends the next request now."""
        if self.closed is not None and self.released < self.n:
            self.arrival[self.released] = now
            self.released += 1

    def _finish(self, i, now):
        self.e2e[i] = now - self.arrival[i]
        self.tokens_out += self.output_tokens[i]
        self._release_client(now)

    def _start(self, inst: InstanceState, now: float):
        """Begin the instance's next iteration, if it has work."""
        if inst.role == MIXED:
            while inst.batch > 1 and inst.kv_used + inst.ctx + inst.batch > inst.kv_cap:
                self._preempt(inst, now)
        prefill: list[int] = []  # requests whose prefill ends with this iteration
        chunks = 0  # prompts (whole or in part) in it
        if inst.queue:  # (a token instance's only while lent to prefill)
            budget = self.chunked[inst.pool]
            prefill, chunks, total, sq = self._whole_prompts(inst, now) if budget is None else self._chunks(inst, now, budget)
        if chunks:
            duration = self._prefill_pass_s(inst, now, prefill, chunks, total, sq)
        elif inst.batch:
            now, duration = self._decode_pass(inst, now)
        else:
            inst.running = False
            return
        inst.batch_integral += inst.batch * duration
        inst.run_prefill = prefill
        inst.running = True
        if self.deferring[inst.pool]:  # the next iteration is scheduled now if there is work beyond this one
            inst.launch += 1
            inst.fixed = bool(inst.batch or inst.queue or inst.waiting or inst.deferred or (prefill and inst.role == MIXED))
        self.seq += 1
        heapq.heappush(self.heap, (now + duration, self.seq, _ITERATION_END, inst.idx, None))

    def _whole_prompts(self, inst: InstanceState, now: float) -> tuple[list[int], int, int, int]:
        """(prompts, their count, tokens, squared tokens) of a whole-prompt prefill: whole prompts
        (less what the prefix cache holds), batched up to max_tokens."""
        prefill: list[int] = []
        total = sq = 0
        while (self._ready(inst, now) if self.caches else inst.queue) and (
                not prefill or (total + self.plen[inst.queue[0]] - self.done[inst.queue[0]] <= self.max_tokens
                                and len(prefill) < self.cap)):
            i = inst.queue.popleft()
            prefill.append(i)
            d = self.done[i]
            total += self.plen[i] - d
            sq += self.plen[i] * self.plen[i] - d * d
            self.done[i] = self.plen[i]
            if not self.resumed[i]:
                self.prefill_start[i] = now
        return prefill, len(prefill), total, sq

    def _chunks(self, inst: InstanceState, now: float, budget: int) -> tuple[list[int], int, int, int]:
        """(prompts whose prefill ends, prompts in the pass, tokens, squared tokens) of a chunked
        pass: the decodes first, then prompt tokens up to the budget."""
        prefill: list[int] = []
        total = sq = chunks = 0
        room = budget - inst.batch
        while room > 0 and chunks < self.cap and (self._ready(inst, now) if self.caches else inst.queue):
            i = inst.queue[0]
            d = self.done[i]
            if d == self.cached[i] and not self.resumed[i]:
                self.prefill_start[i] = now
            c = min(self.plen[i] - d, room)
            total += c
            sq += (d + c) * (d + c) - d * d  # causal attention of c new tokens over d + c
            self.done[i] = d + c
            room -= c
            chunks += 1
            if self.done[i] < self.plen[i]:
                break
            inst.queue.popleft()
            prefill.append(i)
        return prefill, chunks, total, sq

    def _prefill_pass_s(self, inst: InstanceState, now: float, prefill: list[int], chunks: int, total: int, sq: int) -> float:
        """The time of a pass with prompt tokens (and the running decodes), recorded."""
        if chunks == 1 and inst.batch == 0 and prefill and total == self.prompt_tokens[prefill[0]] and not self.resumed[prefill[0]]:
            duration = self.single[inst.pool][prefill[0]]  # one whole prompt alone: its time is known
        else:
            duration = float(inst.perf.pass_time_s(float(chunks), float(total), float(sq),
                                                   float(inst.batch), float(inst.ctx)))
        inst.prefill_s += duration
        if self.passes is not None:
            self.passes.append((chunks, total, sq, inst.batch, inst.ctx, 1, now + duration))
        return duration

    def _decode_pass(self, inst: InstanceState, now: float) -> tuple[float, float]:
        """(start, duration) of a decode-only iteration, or of a stretch of them fused at once
        where nothing can change the instance meanwhile (_decode_stretch), recorded."""
        line = self.lines[inst.pool].get(inst.batch)
        if line is None:
            line = self.lines[inst.pool][inst.batch] = inst.perf.decode_line(inst.batch)
        attention = inst.ctx * line[1]
        duration = line[0] + attention + (line[2] - attention if line[2] > attention else 0.0)
        if self.fuse and not (inst.queue or inst.waiting or inst.deferred or self.caches):
            quiet = self._quiet_until()
            if now + duration < quiet:
                now, duration = self._decode_stretch(inst, now, line, duration, quiet)
        inst.decode_s += duration
        if self.passes is not None:
            self.passes.append((0, 0, 0, inst.batch, inst.ctx, 1, now + duration))
        if inst.steps is not None:
            inst.steps.append((inst.batch, inst.ctx))
        return now, duration

    def _quiet_until(self) -> float:
        """A time before which no event can change an instance that only decodes: the next
        arrival when every instance is co-located in an open loop (an instance's events touch
        only itself and its own load, and only an arrival is routed to it), else the next event
        of the cluster (a later one is made at or after the time of the event that makes it: a
        KV transfer, a closed loop's next request)."""
        nxt = self.next_arrival
        arrival = self.arrival[nxt] + self.front if nxt < self.n else math.inf
        if self.isolated or not self.heap:
            return arrival
        return min(self.heap[0][0], arrival)

    def _decode_stretch(self, inst: InstanceState, now: float, line: tuple, duration: float,
                        quiet: float) -> tuple[float, float]:
        """Decode-only iterations that end before `quiet` (_quiet_until), at once: until the
        next one in which a request finishes, or a co-located instance would preempt, the
        iterations differ only in their context (`batch` more tokens each), so the ends and step
        times are computed at once (a short loop, or arrays), as the iteration-by-iteration loop
        adds them (the same floating-point sums in the same order: results are identical), and
        their bookkeeping done in bulk. Returns the last iteration's start and duration, which
        `_start` schedules as usual; (now, duration) when no iteration can be skipped. (The event and launch
        counters are only compared with later values of themselves: they need not count the
        skipped iterations.)"""
        b = inst.batch
        reach = (quiet - now) / duration + 1  # (each step takes at least the first's time: no more end before `quiet`)
        k = min(inst.finishing) - inst.iters  # up to the next iteration in which one finishes
        if inst.role == MIXED and b > 1:  # and while the KV holds a token more per request (no preemption)
            k = min(k, int((inst.kv_cap - inst.kv_used - inst.ctx) // b))
        if reach < k:
            k = int(reach)
        if k < 2:
            return now, duration
        base, per_token, slack = line
        if k <= 64:  # (a loop is faster than numpy for a few)
            steps, ends, t = [], [], now
            for c in range(inst.ctx, inst.ctx + b * k, b):
                attention = c * per_token
                steps.append(base + attention + (slack - attention if slack > attention else 0.0))
                t += steps[-1]
                ends.append(t)
        else:
            attention = (inst.ctx + b * np.arange(k)) * per_token
            step_array = base + attention + np.where(slack > attention, slack - attention, 0.0)
            steps, ends = step_array.tolist(), np.add.accumulate(np.concatenate(([now], step_array)))[1:].tolist()
        skipped = bisect.bisect_left(ends, quiet, 0, k - 1)  # the skipped ones end before the next event
        if skipped < 1:
            return now, duration
        inst.iters += skipped
        self.iterations += skipped
        if self.iterations > self.max_iterations:
            raise self._too_many_iterations()
        inst.ends.extend(ends[:skipped])
        if self.passes is not None:
            self.passes.append((0, 0, 0, b, inst.ctx, skipped, ends[skipped - 1]))
        if inst.steps is not None:
            inst.steps.extend((b, inst.ctx + b * j) for j in range(skipped))
        inst.ctx += skipped * b
        decode_s, integral = inst.decode_s, inst.batch_integral
        for step in steps[:skipped]:
            decode_s += step
            integral += b * step
        inst.decode_s, inst.batch_integral = decode_s, integral
        return ends[skipped - 1], steps[skipped]

    def _too_many_iterations(self) -> SpecError:
        return SpecError(f"the simulation passed {self.max_iterations:,} decode iterations (one a token of "
                         "the requests decoding at once): simulate fewer requests (--max-requests, "
                         "--num-requests) or shorter outputs (--osl)")

    def _ready(self, inst: InstanceState, now: float) -> bool:
        """Whether inst's prompt queue has a head to prefill now, its prefix looked up (`_lookup`)."""
        queue = inst.queue
        while queue and not self._lookup(inst, queue[0], now):
            queue.popleft()  # (back at the head once its prefix is loaded)
        return bool(queue)

    def _lookup(self, inst: InstanceState, i: int, now: float) -> bool:
        """When request i's prefill first comes up on a prefix-caching instance, the leading tokens
        its cache holds count as prefilled, and it keeps them (pinned). False when some of them are
        in host memory: they are loaded over the instance's host link (FIFO) first, and the request
        returns to the head of the queue when they are (an event). A request recomputed after a
        preemption skips what the GPU tier still holds of its prompt (not counted in the hit rate)."""
        if self.looked[i]:
            return True
        self.looked[i] = True
        cache = self.caches.get(inst.idx)
        if cache is None or self.node[i] < 0:
            return True
        if self.resumed[i]:
            self.done[i] = cache.resident(self.node[i], self.prompt_tokens[i])
            self._pin(inst, i)
            return True
        hit, loaded = cache.match(self.node[i], self.prompt_tokens[i])
        self.cached[i] = self.done[i] = hit
        self._pin(inst, i)
        if not loaded:
            return True
        inst.host_free = max(now, inst.host_free) + loaded * self.prefix.load_s_per_token(inst.perf)
        self._push(inst.host_free, _PREFIX_LOADED, inst.idx, i)
        return False

    def _prefix_loaded(self, inst: InstanceState, i: int, now: float):
        """Request i's prefix is back from host memory: it rejoins the head of the prompt queue."""
        inst.queue.appendleft(i)
        if not inst.running:
            self._start(inst, now)

    def _pin(self, inst: InstanceState, i: int) -> None:
        self.caches[inst.idx].pin(self.node[i])
        self.pinned[i] = inst.idx

    def _unpin(self, inst: InstanceState, i: int, now: float) -> None:
        """Request i no longer uses its prefix on inst (its KV left the instance): evictable."""
        if self.pinned[i] == inst.idx:
            self.caches[inst.idx].unpin(self.node[i], now)
            self.pinned[i] = -1

    def _keep(self, inst: InstanceState, i: int, now: float) -> None:
        """Request i's prompt KV is computed (or received) on inst: its cache keeps it."""
        cache = self.caches.get(inst.idx)
        if cache is not None and self.node[i] >= 0:
            cache.insert(self.node[i], now)

    def _cache_room(self, inst: InstanceState) -> None:
        """The cache keeps what the running requests leave of the instance's KV memory (a prompt
        instance's running prefills hold their pinned prefixes; a token instance's requests the KV
        they reserved)."""
        cache = self.caches.get(inst.idx)
        if cache is not None:
            held = (inst.kv_used + inst.ctx if inst.role == MIXED else inst.kv_used if inst.role == TOKEN
                    else cache.resident_tokens - cache.free_tokens)
            if cache.free_tokens > inst.kv_cap - held:
                cache.evict(inst.kv_cap - held)

    def _admit(self, inst: InstanceState, now: float):
        """Take waiting requests, in order, while their KV fits.
        A token instance reserves a request's whole KV (prompt + output tokens) once it has
        arrived: it joins the decode batch. A co-located instance allocates KV as engines
        with paged KV do: a request is admitted, to its prompt queue, when its prompt (plus
        its first token) fits beside what the admitted and decoding requests hold now; the
        batch's growth is met by preempting (see `preempt`)."""
        mixed = inst.role == MIXED
        while inst.waiting:
            i = inst.waiting[0]
            need = self.prompt_tokens[i] + self.output_tokens[i]
            if need > inst.max_request:  # can never fit: report, do not block the queue
                inst.waiting.popleft()
                self.rejected[i] = True
                if mixed:
                    self.prompt_load[self.p_pos[inst.idx]] -= self.prompt_tokens[i]
                self._unpin(inst, i, now)
                self._unassign(inst, i)
                self._release_client(now)
                continue
            if mixed:
                need = self.plen[i] + 1
                if (inst.kv_used + inst.ctx + need > inst.kv_cap
                        or inst.batch + len(inst.queue) + len(inst.run_prefill) >= self.cap):  # (running: decoding or prefilling)
                    break
                inst.waiting.popleft()
                inst.kv_used += self.plen[i]
                inst.queue.append(i)
                continue
            if inst.kv_used + need > inst.kv_cap or inst.batch >= self.cap:
                break
            inst.waiting.popleft()
            inst.kv_used += need
            self._join(inst, i, now)

    def _join(self, inst: InstanceState, i: int, now: float):
        """Request i (its KV held on inst) joins the decode batch at this iteration boundary."""
        inst.batch += 1
        inst.ctx += self.prompt_tokens[i] + self.base[i]
        if self.resumed[i]:
            self.rejoined[i] = now
        else:
            self.join_time[i] = now
        self.join_iter[i] = inst.iters
        inst.finishing.setdefault(inst.iters + self.output_tokens[i] - self.base[i], []).append(i)
        if inst.role == MIXED:
            inst.members.append(i)

    def _preempt(self, inst: InstanceState, now: float):
        """A co-located instance whose KV cannot hold one more token per decoding request
        preempts the newest one, as vLLM does by default: its KV is freed and it waits at the
        head of the queue to be recomputed (prompt and output so far prefilled again), then
        decodes on."""
        v = inst.members.pop()
        have = self.base[v] + inst.iters - self.join_iter[v]
        inst.finishing[self.join_iter[v] + self.output_tokens[v] - self.base[v]].remove(v)
        inst.batch -= 1
        inst.ctx -= self.prompt_tokens[v] + have
        self.plen[v], self.base[v], self.done[v] = self.prompt_tokens[v] + have, have, 0
        self.resumed[v] = True
        self._unpin(inst, v, now)  # (its prefix stays cached, evictable, until it is recomputed)
        self.looked[v] = False
        self.preempted_at[v] = now
        self.preemptions += 1
        self.prompt_load[self.p_pos[inst.idx]] += self.plen[v]
        inst.waiting.appendleft(v)

    def _prefill_done(self, inst: InstanceState, i: int, now: float):
        if self.resumed[i]:  # recomputed after a preemption: its next token comes now
            self.stall[i] = max(self.stall[i], now - self.preempted_at[i])
            self._keep(inst, i, now)
            inst.kv_used -= self.plen[i]
            self.base[i] += 1
            if self.base[i] == self.output_tokens[i]:  # that was its last token
                self._finish(i, now)
                self._unassign(inst, i)
                self._unpin(inst, i, now)
            else:
                self._join(inst, i, now)
            self.resumed[i] = False
            return
        self.ttft[i] = now - self.arrival[i]
        self._keep(inst, i, now)  # (in use while it decodes here)
        if self.output_tokens[i] == 1 or self.t_inst[i] != inst.idx:
            self._unpin(inst, i, now)
        if self.output_tokens[i] == 1:  # the first token was the whole answer
            self._finish(i, now)
            self._unassign(self.insts[self.t_inst[i]], i)
            return
        tok = self.insts[self.t_inst[i]]
        if tok is inst:
            self.kv_ready[i] = now
            if inst.role == MIXED:  # co-located: its KV held since admission, now counted in the batch's context
                inst.kv_used -= self.plen[i]
                self._join(inst, i, now)
            else:  # a token machine lent to prefill it (the mixed pool): its KV is here, admitted as an arrival's
                inst.waiting.append(i)  # (the iteration's end admits it: _iteration_end)
            return
        sent = self.prompt_tokens[i]
        if tok.idx in self.caches and self.node[i] >= 0:  # the blocks the token instance holds are not sent
            sent -= self.caches[tok.idx].match(self.node[i], self.prompt_tokens[i])[0]
            self._pin(tok, i)
        local = inst.node is not None and inst.node == tok.node  # one machine: over its GPU links, the NICs free
        link_bytes_per_s = local_kv_bytes_per_s(inst.perf, tok.perf) if local else min(inst.kv_link_bytes_per_s, tok.kv_link_bytes_per_s)
        duration = sent * self.kv_bytes / link_bytes_per_s
        latency = inst.perf.factors.kv_transfer_latency_s
        busy_until = 0.0 if local else max(inst.link_free, tok.link_free)  # both NICs carry the transfer
        if self.prompt_tokens[i] < inst.perf.engine.layerwise_transfer_min_tokens:
            begin = max(now, busy_until)
            done = begin + duration + latency
        else:
            begin = max(self.prefill_start[i], busy_until)
            done = max(begin + duration, now + duration / self.layers) + latency
        if not local:
            inst.link_free = tok.link_free = begin + duration
        self._push(done, _KV_ARRIVED, tok.idx, i)

    def run(self) -> SimResult:
        """Handle events in time order (heap events before arrivals at equal times) until
        every request is done; then the result. A run without borrowing runs compiled."""
        if COMPILED:
            return self._run_compiled()
        next_arrival, log, n, heap, arrival, insts = 0, self.log, self.n, self.heap, self.arrival, self.insts
        pop, kv_arrived, iteration_end = heapq.heappop, self._kv_arrived, self._iteration_end
        front = self.front
        events = 0
        while next_arrival < n or heap:
            if next_arrival < n and (not heap or arrival[next_arrival] + front < heap[0][0]):
                i, now = next_arrival, arrival[next_arrival] + front
                next_arrival = self.next_arrival = next_arrival + 1
                events += 1
                inst = self._arrive(i, now)
                if log is not None:
                    log.append((now, Event.ARRIVAL, inst.idx, i))
                continue
            now, _, kind, a, b = pop(heap)
            events += 1
            if log is not None:
                log.append((now, Event(kind), a, b))
            if kind == _ITERATION_END:
                iteration_end(insts[a], now)
            elif kind == _KV_ARRIVED:
                kv_arrived(insts[a], b, now)
            else:
                self._prefix_loaded(insts[a], b, now)
        self.events = events
        return self._result()

    def _run_compiled(self) -> SimResult:
        """`run` by the compiled loop (splitplan_core.run): this run's instances and pools as its
        arrays, its state back into this run's, then the result."""
        perfs = [cast(Instance, pool.perf) for pool in self.pools]
        prompt, out = self.trace.prompt_tokens.astype(np.int64), self.trace.output_tokens.astype(np.int64)
        req, times, inst = self._core_state(prompt)
        arrival = np.asarray(self.arrival, float)
        lines = self._decode_lines(perfs, prompt)
        tables = self._measured_tables(perfs, prompt + out, lines.shape[1])
        vectors = np.array([np.zeros(len(core.FIELDS)) if p.measured else p.pass_vector for p in perfs])  # (a table times a measured one)
        status, clock, counters, ends_s, ends_at, log_s, log_at, caches, passes, counts = core.run(
            arrival, float(self.front), prompt, out, req, times, inst, *self._core_pools(perfs, tables), self._core_settings(),
            float(self.kv_bytes), vectors, lines, np.array([self.single[k] for k in range(len(perfs))], float), tables[0],
            self.prefix.arrays() if self.caches else None)
        self.arrival = arrival  # (a closed loop's: the times the clients sent each request)
        if status == core.TOO_MANY_ITERATIONS:
            raise self._too_many_iterations()
        if status != core.OK:
            raise RuntimeError(f"the compiled run stopped (status {status}): a bug, please report it")
        self._take_compiled(req, times, inst, clock, counters, ends_s, ends_at)
        self._take_records(perfs, caches, counts, log_s, log_at)
        result = self._result()
        return result if self.passes is None else dataclasses.replace(result, passes=passes)

    def _core_state(self, prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The core's state before any event (splitplan_core.initial_state): per request and per instance."""
        machines = {node: m for m, node in enumerate(dict.fromkeys(x.node for x in self.insts if x.node is not None))}
        return core.initial_state(prompt, self.cached, self.node if self.caches else -1, [str(x.role) for x in self.insts],
                                  [x.pool for x in self.insts], [self.p_pos.get(x.idx, -1) for x in self.insts],
                                  [self.t_pos.get(x.idx, -1) for x in self.insts], [machines.get(x.node, -1) for x in self.insts])

    def _cap(self) -> int:
        return int(self.options.max_num_seqs or self.n + 1)

    def _decode_lines(self, perfs: list[Instance], prompt: np.ndarray) -> np.ndarray:
        """Per pool, `lines[pool, b]`: Instance.decode_line(b) up to the largest decode batch (one
        request, or requests of at least (shortest prompt + 1) tokens each within the KV capacity: a
        co-located instance preempts past it)."""
        kv_cap = max(int(p.fit.kv_capacity_tokens) for p in perfs)
        most = max(1, min(self.n, self._cap(), kv_cap // (int(prompt.min() if self.n else 1) + 1)))
        lines = np.zeros((len(perfs), most + 1, 3))
        for k, perf in enumerate(perfs):
            lines[k, 1:, 0], lines[k, 1:, 1], lines[k, 1:, 2] = perf.decode_line(np.arange(1, most + 1))
        return lines

    def _measured_tables(self, perfs: list[Instance], request_tokens: np.ndarray, lines: int) -> tuple[np.ndarray, list[tuple]]:
        """Per pool, a measured one's pass times by tokens (MeasuredInstance.core_table: up to the
        longest pass, a whole request recomputed or the budget, beside the largest decode batch), and
        its (MIXED_FACTOR ... CONTEXT_HI); zeros for an analytic pool."""
        measured = [cast(MeasuredInstance, p) for p in perfs if p.measured]
        size = max(self.max_tokens, int(request_tokens.max(initial=0))) + lines + 1 if measured else 0
        rows, ranges = np.zeros((len(perfs), size)), []
        for k, perf in enumerate(perfs):
            if perf.measured:
                rows[k], ranged = cast(MeasuredInstance, perf).core_table(size)
                ranges.append(ranged)
            else:
                ranges.append((1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0))
        return rows, ranges

    def _core_pools(self, perfs: list[Instance], tables: tuple[np.ndarray, list[tuple]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The core's per-pool settings: integers (KV_CAP ... MEASURED), floats (LINK_BPS ...
        CONTEXT_HI: a prefilling pool's host tier, a measured pool's ranges), and the KV
        bandwidth between two pools' instances on one machine."""
        pools = np.array([[int(perf.fit.kv_capacity_tokens), perf.max_request_tokens, self.chunked[k] is not None, self.deferring[k],
                           perf.engine.layerwise_transfer_min_tokens, perf.measured] for k, perf in enumerate(perfs)], np.int64)
        host = [self.prefix.host_tier(perf) if self.caches and pool.role != TOKEN else (0.0, 0.0)  # (as _prefix_caches gives them)
                for pool, perf in zip(self.pools, perfs, strict=True)]
        pools_s = np.array([[perf.kv_link_bytes_per_s, perf.factors.kv_transfer_latency_s, *host[k], *tables[1][k]]
                            for k, perf in enumerate(perfs)])
        return pools, pools_s, np.array([[local_kv_bytes_per_s(a, b) for b in perfs] for a in perfs])

    def _core_settings(self) -> np.ndarray:
        """The core's run-wide settings (MAX_BATCH_TOKENS ... PREFIX_AWARE)."""
        caching = bool(self.caches)
        return np.array([self.max_tokens, self._cap(), self.max_iterations, self.context or 0, self.layers,
                         self.options.routing == "round-robin", self.closed or 0, self.log is not None, caching,
                         self.prefix.block_tokens if caching else 1, self.options.routing == "prefix-aware" and caching,
                         self.passes is not None, -1 if (borrow := self.options.borrow_threshold_tokens) is None else borrow], np.int64)

    def _take_records(self, perfs: list[Instance], caches: list, counts: np.ndarray, log_s: np.ndarray, log_at: np.ndarray) -> None:
        """The compiled run's caches, measured tables' lookups and event log as this run's."""
        for k, state in enumerate(caches):
            self.caches[k].restore(*state)
        for perf, (prefill, prefill_out, decode, decode_out) in zip(perfs, counts.tolist(), strict=True):
            if perf.measured:  # (a measured table counts its lookups, and those it extrapolated)
                table = cast(MeasuredInstance, perf)
                table.counted("prefill", prefill, prefill_out)
                table.counted("decode", decode, decode_out)
        if self.log is not None:
            self.log = [(t, Event(kind), k, None if i < 0 else i) for t, (kind, k, i) in zip(log_s.tolist(), log_at.tolist(), strict=True)]

    def _take_compiled(self, req, times, inst, clock, counters, ends_s, ends_at) -> None:
        """The compiled run's state as this run's: per request, per instance, the counters."""
        self.ttft, self.e2e, self.stall, self.rejoined = times[core.TTFT], times[core.E2E], times[core.STALL], times[core.REJOINED]
        self.prefill_start, self.kv_ready, self.join_time = times[core.PREFILL_START], times[core.KV_READY], times[core.JOIN_TIME]
        self.base, self.join_iter, self.p_inst, self.t_inst = req[core.BASE], req[core.JOIN_ITER], req[core.P_INST], req[core.T_INST]
        self.rejected, self.refused = req[core.REJECTED] > 0, req[core.REFUSED] > 0
        self.tokens_out, self.preemptions = int(counters[core.TOKENS_OUT]), int(counters[core.PREEMPTIONS])
        self.events, self.iterations = int(counters[core.EVENTS]), int(counters[core.ITERATIONS])
        small = np.uint16 if len(self.insts) <= np.iinfo(np.uint16).max else np.int64  # (NumPy radix-sorts 16-bit keys)
        order = np.argsort(ends_at.astype(small), kind="stable")
        bounds = np.searchsorted(ends_at[order], np.arange(len(self.insts) + 1))
        for k, x in enumerate(self.insts):
            x.ends = array("d", ends_s[order[bounds[k]:bounds[k + 1]]].tobytes())
            x.iters, x.batch, x.ctx, x.kv_used = (int(v) for v in inst[k, [core.ITERS, core.BATCH, core.CTX, core.KV_USED]])
            x.prefill_s, x.decode_s, x.batch_integral, x.link_free = (
                float(v) for v in clock[k, [core.PREFILL_S, core.DECODE_S, core.INTEGRAL, core.LINK_FREE]])

    def _route(self, i: int) -> tuple[InstanceState, InstanceState]:
        """(the instance that prefills request i, the one that decodes it)."""
        if self.options.routing == "prefix-aware" and self.caches and self.node[i] >= 0:
            src = self._prefix_pick(i)
        elif self.options.borrow_threshold_tokens is None or self.prompt_side[0].role == MIXED:
            src = self.prompt_side[self._pick(self.prompt_load, 0)]
        else:
            src = self._mixed_pool_prompt(i)
        if src.role == MIXED:
            dst = src
        else:
            dst = self.token_side[self._pick(self.token_load, 1)]
            if self.options.borrow_threshold_tokens is not None:
                need = self.prompt_tokens[i] + self.output_tokens[i]
                if dst.kv_committed + need > dst.kv_cap:  # short of KV memory: the token machine with most room,
                    dst = max(self.token_side, key=lambda x: x.kv_cap - x.kv_committed)
                    if dst.kv_committed + need > dst.kv_cap:  # else decode it on a prompt machine
                        dst = self._lend_prompt(need) or dst
                if dst.role == TOKEN and self._long_queue(src, i):
                    src = dst  # every prompt machine's queue is long: borrow the token machine to prefill it
        return src, dst

    def _arrive(self, i: int, now: float) -> InstanceState:
        """Route request i at its arrival (join-shortest-queue or round-robin, with the mixed
        pool's borrowing) and queue it; the instance that prefills it."""
        src, dst = self._route(i)
        self.p_inst[i], self.t_inst[i] = src.idx, dst.idx
        if self.context is not None and self.prompt_tokens[i] + self.output_tokens[i] > self.context:  # the engine refuses it at once
            self.rejected[i] = self.refused[i] = True
            self._release_client(now)
            return src
        if src.role == PROMPT and self.prompt_tokens[i] > src.max_request:  # its prompt's KV never fits while it prefills
            self.rejected[i] = True
            self._release_client(now)
            return src
        if src.idx in self.p_pos:  # a co-located instance also counts 1 per request it holds
            self.prompt_load[self.p_pos[src.idx]] += self.prompt_tokens[i] + (src.role == MIXED)
        dst.kv_committed += self.prompt_tokens[i] + self.output_tokens[i]
        if dst.idx in self.t_pos:
            self.token_load[self.t_pos[dst.idx]] += self.output_tokens[i]
        if src.running and src.fixed:  # async scheduling: the next iteration is already scheduled
            src.deferred.append((src.launch, i, src.waiting if src.role == MIXED else src.queue))
        elif src.role == MIXED:  # prefilled once its KV is reserved
            src.waiting.append(i)
            self._admit(src, now)
        else:
            src.queue.append(i)
        if not src.running:
            self._start(src, now)
        return src

    def _kv_arrived(self, inst: InstanceState, i: int, now: float):
        """Request i's KV reached token instance inst: it waits to join the batch."""
        self.kv_ready[i] = now
        if inst.running and inst.fixed:  # async scheduling: the next iteration is already scheduled
            inst.deferred.append((inst.launch, i, inst.waiting))
            return
        inst.waiting.append(i)
        if not inst.running:
            self._admit(inst, now)
            self._start(inst, now)

    def _iteration_end(self, inst: InstanceState, now: float):
        """inst's iteration is over: every decoding request has one more token (some finish),
        the prefills it carried have their first token; admit and start the next one."""
        p, o = self.prompt_tokens, self.output_tokens
        if inst.batch:
            inst.iters += 1
            self.iterations += 1
            if self.iterations > self.max_iterations:
                raise self._too_many_iterations()
            inst.ends.append(now)
            inst.ctx += inst.batch
            for i in inst.finishing.pop(inst.iters, ()):
                if inst.role == MIXED:
                    inst.members.remove(i)
                else:
                    inst.kv_used -= p[i] + o[i]
                    self._keep(inst, i, now)  # (a token instance: the prompt it received)
                self._unpin(inst, i, now)
                inst.batch -= 1
                inst.ctx -= p[i] + o[i]
                self._unassign(inst, i)
                self._finish(i, now)
        k = self.p_pos.get(inst.idx)
        for i in inst.run_prefill:
            if k is not None:  # a prompt stays pending on its machine until its prefill completes
                self.prompt_load[k] -= self.plen[i]
            self._prefill_done(inst, i, now)
        inst.run_prefill = []
        if inst.deferred:  # async scheduling: those that arrived before this iteration began may join
            self._release(inst, inst.launch)
        self._admit(inst, now)
        if self.caches:
            self._cache_room(inst)
        self._start(inst, now)
        if not inst.running and inst.deferred:  # nothing was scheduled after all: the rest join now
            self._release(inst, math.inf)
            self._admit(inst, now)
            self._start(inst, now)

    def _release(self, inst: InstanceState, before: float):
        """Requests deferred by async scheduling that arrived in an iteration before `before`
        join the line they were headed for (a prompt queue, or the wait for KV room)."""
        while inst.deferred and inst.deferred[0][0] < before:
            _, i, line = inst.deferred.popleft()
            line.append(i)

    def _result(self) -> SimResult:
        for inst in self.insts:  # a measured table counts the decode steps it extrapolated
            if inst.steps:
                batch, context = np.array(inst.steps, float).T
                inst.perf.record_decode_steps(batch, context)
        if self.closed is not None:  # the arrival times the clients produced
            self.trace = dataclasses.replace(self.trace, arrival_s=np.array(self.arrival),
                                             source=f"{self.trace.source} (closed loop, {self.closed} clients)")
        first_token = np.array(self.arrival) + np.array(self.ttft)
        stint = np.where(np.array(self.base) > 1, np.array(self.rejoined), first_token)  # a resumed request: from its rejoining
        stint_tokens = np.array(self.output_tokens) - np.array(self.base) + 1
        tbt_max = gaps.tbt_max(self.insts, stint_tokens, self.t_inst, self.join_iter, stint)
        stall = np.array(self.stall)
        tbt_max = np.where(stall > 0, np.fmax(tbt_max, stall), tbt_max)
        warmup = np.zeros(self.n, bool)
        warmup[:min(self.options.warmup_requests, self.n)] = self.closed is not None  # (request order is send order)
        stint_tokens[warmup] = 0  # (no gaps of the warm-up)
        itl = (np.concatenate([gaps.all_gaps(self.insts, stint_tokens, self.t_inst, self.join_iter, stint), stall[(stall > 0) & ~warmup]])
               if self.options.inter_token_gaps else None)
        finished_at = self.trace.arrival_s + np.array(self.e2e)
        span = float(np.nanmax(finished_at) - self.arrival[0]) if self.tokens_out else 0.0
        return SimResult(
            self.trace, np.array(self.ttft), np.array(self.e2e), tbt_max,
            _queue_s(np.array(self.prefill_start) - self.trace.arrival_s - self.front),  # (from past the API front end)
            np.array(self.kv_ready) - (self.trace.arrival_s + np.array(self.ttft)), np.array(self.join_time) - np.array(self.kv_ready),
            np.array(self.p_inst), np.array(self.t_inst), np.array(self.rejected), self.tokens_out, span,
            [InstanceStats(x.pool, Role(x.role), x.prefill_s, x.decode_s, x.batch_integral,
                           *((c.hit_tokens, c.lookup_tokens, c.loaded_tokens) if (c := self.caches.get(x.idx)) else (0, 0, 0)))
             for x in self.insts], self.events,
            [f"{x.role}:{x.perf.hardware.name}:{x.perf.layout.spec}:{x.idx}" for x in self.insts], self.preemptions, self.log,
            np.array(self.refused), itl, warmup,
            None if self.passes is None else np.array(self.passes, float).reshape(-1, 7),
        )


def _queue_s(waits: np.ndarray) -> np.ndarray:
    """Waits in seconds, less than a nanosecond read as none (what subtracting the front end
    from its sum with an arrival leaves in floating point)."""
    return np.where(np.abs(waits) < 1e-9, 0.0, waits)
