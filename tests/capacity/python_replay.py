"""The planner's prompt replay (capacity.pools.replay_prompts) in Python, event by event: the oracle
the compiled replay (splitplan_core.prompt_replay) is held to, to the bit (tests/capacity/test_replay.py)."""

from __future__ import annotations

import heapq
from collections import deque
from functools import cached_property

import numpy as np

from splitplan.capacity.pools import BatchTimes, PromptReplay
from splitplan.perf.roofline import Instance
from splitplan.sim.prefix_cache import PrefixModel
from tests.sim.python_loop import least_loaded, loads
from tests.sim.python_prefix_cache import PrefixCache, cache_for


class PassTimes:
    """A BatchTimes' passes as the perf model times them: every prompt alone at once, other passes
    as they appear (cached)."""

    def __init__(self, times: BatchTimes, prompt_tokens: np.ndarray):
        self.inst, self.decode, self.prompt_tokens = times.inst, times.decode, prompt_tokens
        self.cache: dict = {}

    @cached_property
    def single(self) -> list[float]:
        p = self.prompt_tokens.astype(float)
        return np.asarray(self.inst.pass_time_s(1.0, p, p * p, *self.decode)).tolist()

    def pass_s(self, seqs: int, tokens: float, sq_tokens: float) -> float:
        key = (seqs, tokens, sq_tokens)
        duration = self.cache.get(key)
        if duration is None:
            duration = self.cache[key] = float(self.inst.pass_time_s(float(seqs), float(tokens), float(sq_tokens), *self.decode))
        return duration


def _prefix_caches(prefix: PrefixModel | None, instances: list[Instance]) -> tuple[list[PrefixCache], list[int]]:
    """(a prefix cache per instance, each request's prefix node), both empty without prefix caching."""
    if prefix is None:
        return [], []
    return [cache_for(prefix, inst) for inst in instances], prefix.tree.request_node.tolist()


def python_replay(arrival_s: np.ndarray, prompt_tokens: np.ndarray, pools: list[tuple[Instance, int]],
                  max_batch_tokens: int, times: list[BatchTimes] | None = None, held_s: np.ndarray | None = None,
                  chunked: bool = False, max_seqs: int | None = None, prefix: PrefixModel | None = None,
                  cache_stats: list | None = None) -> PromptReplay:
    """`replay_prompts` in Python."""
    n_req = len(arrival_s)
    finish_at = [0.0] * n_req
    times = [PassTimes(t, prompt_tokens) for t in times or [BatchTimes(inst) for inst, _ in pools]]
    kind = [k for k, (_, count) in enumerate(pools) for _ in range(count)]
    load = loads(len(kind))  # pending prompt tokens per instance
    queues: list[deque[int]] = [deque() for _ in kind]
    running: list = [None] * len(kind)  # (requests, tokens) of the batch in flight
    heap: list = []  # (time, instance, -1): a batch ends; (time, instance, request): its prefix is loaded
    busy: list = []  # (start, duration, instance) of every pass
    placed: list = []  # each request's instance
    arrival = arrival_s.tolist()
    tokens = prompt_tokens.tolist()

    cap = max_seqs or n_req
    done = [0] * n_req  # (chunked) prompt tokens prefilled so far
    engine = pools[0][0].engine
    deferring = engine.async_scheduling
    launch = [0] * len(kind)  # async scheduling: batches begun per instance
    fixed = [False] * len(kind)  # whether the next batch was scheduled when the running one began
    tag = [-1] * n_req  # the batch a request arrived in when that one's successor was scheduled
    caches, node = _prefix_caches(prefix, [pools[k][0] for k in kind])
    looked = [False] * n_req
    host_free = [0.0] * len(kind)  # when the instance's host link is free (loads from host memory)
    kv_cap = [pools[k][0].fit.kv_capacity_tokens for k in kind]

    def ready(j: int, i: int, now: float) -> bool:
        """Request i's prefill comes up on instance j: its cache's hit counts as prefilled (pinned).
        False when part of it is in host memory: it leaves the queue until that is loaded."""
        looked[i] = True
        assert prefix is not None  # (called with caches only)
        if node[i] < 0:
            return True
        done[i], loaded = caches[j].match(node[i], tokens[i])
        caches[j].pin(node[i])
        if not loaded:
            return True
        host_free[j] = max(now, host_free[j]) + loaded * prefix.load_s_per_token(pools[kind[j]][0])
        heapq.heappush(heap, (host_free[j], j, i))
        queues[j].popleft()
        return False

    def chunked_batch(j: int, now: float, queue: deque) -> tuple | None:
        """As the simulator's chunked iteration on an instance with no decodes: (members, the
        prompt tokens pending on the instance until they are prefilled, duration), None if empty."""
        members, total, sq, seqs, room, whole = [], 0, 0, 0, max_batch_tokens, 0
        while queue and room > 0 and seqs < cap and tag[queue[0]] < launch[j]:
            i = queue[0]
            if caches and not looked[i] and not ready(j, i, now):
                continue
            d, size = done[i], tokens[i]
            c = min(size - d, room)
            total += c
            sq += (d + c) * (d + c) - d * d  # causal attention of c new tokens over d + c
            done[i] = d + c
            room -= c
            seqs += 1
            if d + c < size:
                break
            members.append(queue.popleft())
            whole += size
        if not seqs:  # (every head went to load its prefix)
            return None
        one_whole_prompt = seqs == 1 and total == whole  # (its time is known)
        return members, whole, times[kind[j]].single[members[0]] if one_whole_prompt else times[kind[j]].pass_s(seqs, total, sq)

    def whole_batch(j: int, now: float, queue: deque) -> tuple | None:
        """Whole prompts (less what a cache holds), as the simulator batches them: (members,
        their prompt tokens, duration), None if empty."""
        members: list[int] = []
        total, sq, whole = 0, 0, 0
        while queue:
            i = queue[0]
            if members and tag[i] >= launch[j]:  # (not yet in the simulator's queue)
                break
            if caches and not looked[i] and not ready(j, i, now):
                continue
            if members and not (total + tokens[i] - done[i] <= max_batch_tokens and len(members) < cap):
                break
            members.append(queue.popleft())
            total += tokens[i] - done[i]
            sq += tokens[i] * tokens[i] - done[i] * done[i]
            whole += tokens[i]
        if not members:
            return None
        return members, whole, (times[kind[j]].single[members[0]] if total == whole == tokens[members[0]]
                                else times[kind[j]].pass_s(len(members), total, sq))

    batch = chunked_batch if chunked else whole_batch

    def start(j: int, now: float) -> None:
        queue = queues[j]
        if deferring and queue and tag[queue[0]] >= launch[j]:  # nothing was scheduled after all: all join now
            for i in queue:
                tag[i] = -1
        formed = batch(j, now, queue)
        if formed is None:
            return idle(j, now)
        members, total, duration = formed
        running[j] = (members, total)
        if deferring:
            launch[j] += 1
            fixed[j] = bool(queue)
        busy.append((now, duration, j))
        heapq.heappush(heap, (now + duration, j, -1))

    def idle(j: int, now: float) -> None:
        """Nothing to run on j now; requests held back by async scheduling join at once."""
        if deferring and queues[j]:
            start(j, now)

    def finish_until(now: float) -> None:
        while heap and heap[0][0] <= now:
            end, j, loaded = heapq.heappop(heap)
            if loaded >= 0:  # its prefix is back from host memory: at the head of the queue
                queues[j].appendleft(loaded)
                tag[loaded] = -1
                if running[j] is None:
                    start(j, end)
                continue
            members, total = running[j]
            for i in members:
                finish_at[i] = end
            if caches:  # computed: kept, and no longer in use (its KV leaves for its token instance)
                cache = caches[j]
                for i in members:
                    if node[i] >= 0:
                        cache.insert(node[i], end)
                        cache.unpin(node[i], end)
                room = kv_cap[j] - (cache.resident_tokens - cache.free_tokens)
                if cache.free_tokens > room:
                    cache.evict(room)
            load[j] -= total
            running[j] = None
            if queues[j]:
                start(j, end)

    held: list = []  # (release time, instance) of requests counted in their instance's load
    several = len(kind) > 1
    prefix_aware = prefix is not None and prefix.prefix_aware

    def route(i: int) -> int:
        if prefix_aware and node[i] >= 0:  # as the simulator's _prefix_pick
            costs = [load[k] + tokens[i] - caches[k].peek(node[i], tokens[i]) for k in range(len(kind))]
            return costs.index(min(costs))
        return least_loaded(load) if several else 0

    release = None if held_s is None else (arrival_s + held_s).tolist()

    def arrive(i: int, now: float) -> None:
        """Request i routed and queued (and counted in its instance's load); its instance starts if idle."""
        j = route(i)
        queues[j].append(i)
        if deferring:
            tag[i] = launch[j] if running[j] is not None and fixed[j] else launch[j] - 1
        load[j] += tokens[i]
        if release is not None:
            load[j] += 1
            heapq.heappush(held, (release[i], j))
        placed.append(j)
        if running[j] is None:
            start(j, now)

    for i in range(n_req):
        now = arrival[i]
        if heap and heap[0][0] <= now:
            finish_until(now)
        while held and held[0][0] <= now:
            load[heapq.heappop(held)[1]] -= 1
        arrive(i, now)
    finish_until(float("inf"))
    if cache_stats is not None and caches:
        cache_stats.extend((c.hit_tokens, c.lookup_tokens) for c in caches)
    return PromptReplay(np.asarray(finish_at) - arrival_s + engine.frontend_latency_s, np.array(busy, float).reshape(-1, 3),
                        np.array(placed, np.int64))
