"""The simulator's rules (splitplan.sim.cluster's docstring) in Python, event by event and iteration
by iteration: the oracle the compiled run (splitplan_core.run) is held to, to the bit
(tests/sim/test_compiled.py), and whose state the tests read to check the rules by hand
(routing loads and KV given back: tests/sim/test_cluster.py)."""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from splitplan.capacity import pools as capacity_pools
from splitplan.perf.roofline import local_kv_bytes_per_s
from splitplan.sim.cluster import _Cluster
from splitplan.sim.types import MIXED, PROMPT, TOKEN, Event, InstanceState, PoolSpec, SimOptions, SimResult
from splitplan.workload.trace import Trace
from tests.sim.python_prefix_cache import cache_for


class LeastLoaded(list):
    """Per-instance loads (a list) that find the least-loaded instance in O(log n): every
    assignment pushes (load, index) on a heap, and entries whose load is no longer the
    instance's are dropped as they surface."""

    def __init__(self, loads):
        super().__init__(loads)
        self._heap = [(load, k) for k, load in enumerate(self)]
        heapq.heapify(self._heap)

    def __setitem__(self, k, load):
        super().__setitem__(k, load)
        heapq.heappush(self._heap, (load, k))

    def least(self) -> int:
        heap = self._heap
        while heap[0][0] != self[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0][1]


def loads(count: int) -> list:
    """Zero loads for `count` instances: a LeastLoaded past HEAP_ROUTING_INSTANCES (a plain list,
    faster to update, below: the same picks)."""
    return LeastLoaded([0] * count) if count > capacity_pools.HEAP_ROUTING_INSTANCES else [0] * count


def least_loaded(loads: list) -> int:
    """The instance of least load, the lowest index among equals."""
    return loads.least() if isinstance(loads, LeastLoaded) else loads.index(min(loads))


# plain ints on the hot path
_KV_ARRIVED, _ITERATION_END, _PREFIX_LOADED = int(Event.KV_ARRIVED), int(Event.ITERATION_END), int(Event.PREFIX_LOADED)


def python_run(trace: Trace, pools: list[PoolSpec], options: SimOptions = SimOptions()) -> SimResult:
    return PythonLoop(trace, pools, options).run()


class LoopInstance(InstanceState):
    """An instance's state in the Python loop: its lines and what it holds."""

    __slots__ = ("queue", "waiting", "kv_cap", "max_request", "kv_committed", "members", "finishing", "running", "host_free",
                 "kv_link_bytes_per_s", "run_prefill", "steps", "launch", "fixed", "deferred", "iters", "link_free")

    def __init__(self, idx, pool, role, perf, node=None):
        super().__init__(idx, pool, role, perf, node)
        self.queue: deque[int] = deque()
        self.waiting: deque[int] = deque()
        self.kv_cap = perf.fit.kv_capacity_tokens
        self.max_request = perf.max_request_tokens  # the longest request one instance holds (in one DP group), as the planner's
        self.members: list[int] = []  # mixed: the decode batch in join order (the newest is preempted first)
        self.kv_committed = 0  # KV of the requests routed here to decode and not finished (held, on its way or to come)
        self.finishing: dict[int, list[int]] = {}
        self.running = False
        self.iters = 0  # decode iterations run
        self.link_free = 0.0  # when its KV link is free
        self.host_free = 0.0  # when its host link is free (loads from host memory, FIFO)
        self.kv_link_bytes_per_s = perf.kv_link_bytes_per_s  # its KV link (a share of the machine's NICs)
        self.run_prefill: list[int] = []
        self.steps: list[tuple[int, int]] | None = [] if perf.measured else None  # measured: (batch, context)
        # async scheduling: iterations begun; whether the next one was scheduled when the running one
        # began; requests that arrived after that, with the iteration they arrived in
        self.launch = 0
        self.fixed = False
        self.deferred: deque = deque()


class PythonLoop(_Cluster):
    """One run's state, the event heap, and the handlers."""

    instance_type = LoopInstance
    insts: list[LoopInstance]  # type: ignore[assignment]
    prompt_side: list[LoopInstance]  # type: ignore[assignment]
    token_side: list[LoopInstance]  # type: ignore[assignment]

    def __init__(self, trace: Trace, pools: list[PoolSpec], options: SimOptions):
        super().__init__(trace, pools, options)
        self.log = [] if options.record_events else None
        self.passes = [] if options.record_passes else None
        self.prompt_load = loads(len(self.prompt_side))  # queued prompt tokens (+1 per request held: mixed)
        self.token_load = loads(len(self.token_side))  # output tokens assigned and not finished
        self.lines: dict[int, dict[int, tuple]] = {k: {} for k in range(len(self.pools))}  # decode steps by batch (filled as met)
        self.cap = self.options.max_num_seqs or math.inf  # requests running on one instance at once
        self.done = list(self.cached)
        if self.caching:  # (the run's caches, the Python class's)
            self.caches = {x.idx: cache_for(self.prefix, x.perf, host=x.role != TOKEN) for x in self.insts}  # type: ignore[misc]
        self._request_state()
        self.heap: list = []
        self.seq = 0
        self.tokens_out = 0
        self.iterations = 0  # decode iterations of every instance, bounded (max_iterations)
        self.round_robin = [0, 0]
        self.released = self.n if self.closed is None else min(self.closed, self.n)  # requests whose arrival time is known

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

    def run(self) -> SimResult:
        """Handle events in time order (heap events before arrivals at equal times) until
        every request is done; then the result."""
        next_arrival, log, n, heap, arrival, insts = 0, self.log, self.n, self.heap, self.arrival, self.insts
        pop, kv_arrived, iteration_end = heapq.heappop, self._kv_arrived, self._iteration_end
        front = self.front
        events = 0
        while next_arrival < n or heap:
            if next_arrival < n and (not heap or arrival[next_arrival] + front < heap[0][0]):
                i, now = next_arrival, arrival[next_arrival] + front
                next_arrival += 1
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
        for inst in insts:  # a measured table counts the decode steps it extrapolated
            if inst.steps:
                batch, context = np.array(inst.steps, float).T
                inst.perf.record_decode_steps(batch, context)
        return self._result()

    def _push(self, time, kind, a, b=None):
        self.seq += 1
        heapq.heappush(self.heap, (time, self.seq, kind, a, b))

    def _unassign(self, inst: LoopInstance, i: int):
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
        return least_loaded(loads)

    def _prefix_pick(self, i: int) -> LoopInstance:
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

    def _long_queue(self, inst: LoopInstance, i: int) -> bool:
        return bool(inst.queue) and self.prompt_load[self.p_pos[inst.idx]] + self.prompt_tokens[i] > self.options.borrow_threshold_tokens

    def _mixed_pool_prompt(self, i: int) -> LoopInstance:
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

    def _lend_prompt(self, need: int) -> LoopInstance | None:
        """The prompt machine to decode a request the token machines have no room for:
        one already lent with room (the fullest that fits, keeping the others whole),
        else the one with the fewest pending prompt tokens; None when none fits."""
        lent = [x for x in self.prompt_side if x.kv_committed and x.kv_committed + need <= x.kv_cap]
        if lent:
            return max(lent, key=lambda x: x.kv_committed)
        fresh = [x for x in self.prompt_side if not x.kv_committed and need <= x.kv_cap]
        return min(fresh, key=lambda x: self.prompt_load[self.p_pos[x.idx]]) if fresh else None

    def _route(self, i: int) -> tuple[LoopInstance, LoopInstance]:
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

    def _arrive(self, i: int, now: float) -> LoopInstance:
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

    def _release_client(self, now):
        """Closed loop: a client is free again and sends the next request now."""
        if self.closed is not None and self.released < self.n:
            self.arrival[self.released] = now
            self.released += 1

    def _finish(self, i, now):
        self.e2e[i] = now - self.arrival[i]
        self.tokens_out += self.output_tokens[i]
        self._release_client(now)

    def _start(self, inst: LoopInstance, now: float):
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
            duration = self._decode_pass(inst, now)
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

    def _whole_prompts(self, inst: LoopInstance, now: float) -> tuple[list[int], int, int, int]:
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

    def _chunks(self, inst: LoopInstance, now: float, budget: int) -> tuple[list[int], int, int, int]:
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

    def _prefill_pass_s(self, inst: LoopInstance, now: float, prefill: list[int], chunks: int, total: int, sq: int) -> float:
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

    def _decode_pass(self, inst: LoopInstance, now: float) -> float:
        """The time of a decode-only iteration, recorded."""
        line = self.lines[inst.pool].get(inst.batch)
        if line is None:
            line = self.lines[inst.pool][inst.batch] = inst.perf.decode_line(inst.batch)
        attention = inst.ctx * line[1]
        duration = line[0] + attention + (line[2] - attention if line[2] > attention else 0.0)
        inst.decode_s += duration
        if self.passes is not None:
            self.passes.append((0, 0, 0, inst.batch, inst.ctx, 1, now + duration))
        if inst.steps is not None:
            inst.steps.append((inst.batch, inst.ctx))
        return duration

    def _ready(self, inst: LoopInstance, now: float) -> bool:
        """Whether inst's prompt queue has a head to prefill now, its prefix looked up (`_lookup`)."""
        queue = inst.queue
        while queue and not self._lookup(inst, queue[0], now):
            queue.popleft()  # (back at the head once its prefix is loaded)
        return bool(queue)

    def _lookup(self, inst: LoopInstance, i: int, now: float) -> bool:
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

    def _prefix_loaded(self, inst: LoopInstance, i: int, now: float):
        """Request i's prefix is back from host memory: it rejoins the head of the prompt queue."""
        inst.queue.appendleft(i)
        if not inst.running:
            self._start(inst, now)

    def _pin(self, inst: LoopInstance, i: int) -> None:
        self.caches[inst.idx].pin(self.node[i])
        self.pinned[i] = inst.idx

    def _unpin(self, inst: LoopInstance, i: int, now: float) -> None:
        """Request i no longer uses its prefix on inst (its KV left the instance): evictable."""
        if self.pinned[i] == inst.idx:
            self.caches[inst.idx].unpin(self.node[i], now)
            self.pinned[i] = -1

    def _keep(self, inst: LoopInstance, i: int, now: float) -> None:
        """Request i's prompt KV is computed (or received) on inst: its cache keeps it."""
        cache = self.caches.get(inst.idx)
        if cache is not None and self.node[i] >= 0:
            cache.insert(self.node[i], now)

    def _cache_room(self, inst: LoopInstance) -> None:
        """The cache keeps what the running requests leave of the instance's KV memory (a prompt
        instance's running prefills hold their pinned prefixes; a token instance's requests the KV
        they reserved)."""
        cache = self.caches.get(inst.idx)
        if cache is not None:
            held = (inst.kv_used + inst.ctx if inst.role == MIXED else inst.kv_used if inst.role == TOKEN
                    else cache.resident_tokens - cache.free_tokens)
            if cache.free_tokens > inst.kv_cap - held:
                cache.evict(inst.kv_cap - held)

    def _admit(self, inst: LoopInstance, now: float):
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

    def _join(self, inst: LoopInstance, i: int, now: float):
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

    def _preempt(self, inst: LoopInstance, now: float):
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

    def _prefill_done(self, inst: LoopInstance, i: int, now: float):
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
            if inst.role == MIXED:  # (its prompt's KV, held since admission, freed)
                inst.kv_used -= self.plen[i]
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

    def _kv_arrived(self, inst: LoopInstance, i: int, now: float):
        """Request i's KV reached token instance inst: it waits to join the batch."""
        self.kv_ready[i] = now
        if inst.running and inst.fixed:  # async scheduling: the next iteration is already scheduled
            inst.deferred.append((inst.launch, i, inst.waiting))
            return
        inst.waiting.append(i)
        if not inst.running:
            self._admit(inst, now)
            self._start(inst, now)

    def _iteration_end(self, inst: LoopInstance, now: float):
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

    def _release(self, inst: LoopInstance, before: float):
        """Requests deferred by async scheduling that arrived in an iteration before `before`
        join the line they were headed for (a prompt queue, or the wait for KV room)."""
        while inst.deferred and inst.deferred[0][0] < before:
            _, i, line = inst.deferred.popleft()
            line.append(i)
