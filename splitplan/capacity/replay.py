"""The prompt pools' FCFS replay compiled (numba): `capacity.pools.replay_prompts` without prefix
caches, on analytic instances, the same to the bit (a property test runs both over random traces),
at about 0.3 us a request instead of 5.

Its rules, statement for statement: requests routed at arrival to the instance of fewest pending
prompt tokens (ties to the lowest index; from a heap past `routing.HEAP_ROUTING_INSTANCES`
instances, as `routing.LeastLoaded`), FCFS per instance in whole-prompt batches or, `chunked`,
passes of the token budget; the engine's `max_num_seqs` (`cap`), its async scheduling (`deferring`)
and the co-located estimate's held requests (`release_s`). Per instance the queue is a linked list
over the requests (`after`): a pass is the run of requests it took from the queue's head, so
`run_first` and `run_count` name its members.

Each pass's time is the compiled pass formula (perf.kernels), which the Python model calls too.

Two helpers of the decode fixed point (capacity.pools.decode_pool) are here too, each NumPy's
result by a cheaper route: `ranks` (np.searchsorted by one merge) and `running_peak` (the KV peak's
running sum in np.lexsort's order).
"""

from __future__ import annotations

import heapq

import numpy as np

from splitplan.perf.kernels import jit, pass_time_s
from splitplan.sim.routing import HEAP_ROUTING_INSTANCES

# numba keys a kernel's cached machine code on its own file alone, and these kernels compile in code
# and constants of the modules imported above: a hash of their text, which changes this file with
# them and so renews the cache (tests/test_kernel_caches.py names the new value when it is stale).
COMPILED_IN_SHA256 = "7a00696125a7bb2b"


@jit
def _least_loaded(load, heap):
    """The instance of least load, the lowest index among equals (a scan, or the heap's top
    once stale entries are dropped)."""
    if len(heap) == 0:
        return np.argmin(load)
    while heap[0][0] != load[heap[0][1]]:
        heapq.heappop(heap)
    return heap[0][1]


@jit
def _take(j, first, after, tokens, done, tag, launch, max_batch_tokens, chunked, cap):
    """The next pass on instance j from its queue's head: (prompts it completes, prompts or chunks
    in it, its prompt tokens, their squares' sum as attention counts them, the completed prompts'
    tokens). Whole prompts up to the budget (at least one), or, `chunked`, the budget's tokens
    from the head, the last prompt split (`done` counts what earlier chunks prefilled: without
    prefix caches nothing else is); async scheduling holds back requests queued after the running
    pass's successor was scheduled."""
    count = seqs = total = sq = whole = 0
    room = max_batch_tokens
    r = first[j]
    while r >= 0:
        size = tokens[r]
        if chunked:
            d = done[r]
            if room <= 0 or seqs >= cap or tag[r] >= launch[j]:
                break
            c = min(size - d, room)
            total += c
            sq += (d + c) * (d + c) - d * d  # causal attention of c new tokens over d + c
            done[r] = d + c
            room -= c
            seqs += 1
            if d + c < size:
                break
        else:
            if count and (tag[r] >= launch[j] or total + size > max_batch_tokens or count >= cap):
                break
            total += size
            sq += size * size
            seqs += 1
        count += 1
        whole += size
        r = after[r]
    return count, seqs, total, sq, whole


@jit
def _start(j, now, queue, state, requests, vectors, kind, decode, options, busy, written, ends):
    """Instance j (idle, its queue not empty) begins its next pass at `now`."""
    first, last, after = queue
    running, run_first, run_count, run_whole, launch, fixed = state
    tokens, done, tag = requests
    max_batch_tokens, chunked, cap, deferring = options
    if deferring and tag[first[j]] >= launch[j]:  # nothing was scheduled after all: all join now
        r = first[j]
        while r >= 0:
            tag[r] = -1
            r = after[r]
    count, seqs, total, sq, whole = _take(j, first, after, tokens, done, tag, launch, max_batch_tokens, chunked, cap)
    run_first[j], run_count[j], run_whole[j] = first[j], count, whole
    for _ in range(count):
        first[j] = after[first[j]]
    if first[j] < 0:
        last[j] = -1
    k = kind[j]
    duration = pass_time_s(vectors[k], float(seqs), float(total), float(sq), decode[k, 0], decode[k, 1])
    running[j] = 1
    if deferring:
        launch[j] += 1
        fixed[j] = first[j] >= 0
    busy[written[0], 0], busy[written[0], 1], busy[written[0], 2] = now, duration, j
    written[0] += 1
    heapq.heappush(ends, (now + duration, j))


@jit
def _add_load(load, least, j, tokens):
    """Instance j's load changes by `tokens` (and the routing heap, when there is one, learns it)."""
    load[j] += tokens
    if len(least):
        heapq.heappush(least, (load[j], j))


@jit
def _end_passes(now, ends, finish_s, load, least, queue, state, requests, vectors, kind, decode, options, busy, written):
    """Every pass that ends by `now` (one ending at an arrival's time before it is routed): its
    completed prompts get their first token, and its instance starts its next pass."""
    first, after = queue[0], queue[2]
    running, run_first, run_count, run_whole = state[0], state[1], state[2], state[3]
    while len(ends) and ends[0][0] <= now:
        end, j = heapq.heappop(ends)
        r = run_first[j]
        for _ in range(run_count[j]):
            finish_s[r] = end
            r = after[r]
        _add_load(load, least, j, -run_whole[j])
        running[j] = 0
        if first[j] >= 0:
            _start(j, end, queue, state, requests, vectors, kind, decode, options, busy, written, ends)


@jit
def prompt_replay(arrival_s, tokens, vectors, kind, decode, max_batch_tokens, chunked, cap, deferring, release_s):
    """(each request's prefill end, the passes as (start, duration, instance) rows, each request's
    instance). `vectors[k]` and `decode[k]` (decode requests and their context riding along in
    every pass) are instance type k's, `kind[j]` instance j's type; `release_s` is empty, or when
    each request stops counting 1 in its instance's load."""
    n_req, n_inst = len(arrival_s), len(kind)
    finish_s = np.zeros(n_req)
    placed = np.zeros(n_req, np.int64)
    load = np.zeros(n_inst, np.int64)  # pending prompt tokens (+ held requests)
    queue = (np.full(n_inst, -1), np.full(n_inst, -1), np.full(n_req, -1))  # each queue's head, tail; each request's successor
    # running, its first request, its requests, the prompt tokens it completes, passes begun (async
    # scheduling), whether the next pass was scheduled when the running one began
    state = (np.zeros(n_inst, np.int64), np.zeros(n_inst, np.int64), np.zeros(n_inst, np.int64),
             np.zeros(n_inst, np.int64), np.zeros(n_inst, np.int64), np.zeros(n_inst, np.int64))
    # tokens, (chunked) prefilled so far, the pass a request arrived in when its successor was scheduled
    requests = (tokens, np.zeros(n_req, np.int64), np.full(n_req, -1))
    options = (max_batch_tokens, chunked, cap, deferring)
    # passes: at most one per prompt completed plus one per budget of tokens and one partial per prompt
    busy = np.zeros((2 * n_req + int(np.sum(tokens)) // max(max_batch_tokens, 1) + 1, 3))
    written = np.zeros(1, np.int64)
    ends = [(0.0, 0)]  # (time, instance): a pass ends (seeded for numba's typing, then emptied)
    ends.pop()
    held = [(0.0, 0)]  # (release time, instance) of requests counted in their instance's load
    held.pop()
    least = [(0, j) for j in range(n_inst)]  # (load, instance): routing past HEAP_ROUTING_INSTANCES instances
    if n_inst <= HEAP_ROUTING_INSTANCES:
        least.clear()
    any_held = len(release_s) > 0
    first, last, after = queue
    running, launch, fixed, tag = state[0], state[4], state[5], requests[2]
    for i in range(n_req):
        now = arrival_s[i]
        if len(ends) and ends[0][0] <= now:
            _end_passes(now, ends, finish_s, load, least, queue, state, requests, vectors, kind, decode, options, busy, written)
        while len(held) and held[0][0] <= now:
            _add_load(load, least, heapq.heappop(held)[1], -1)
        j = 0 if n_inst == 1 else _least_loaded(load, least)
        if last[j] >= 0:  # queued on j
            after[last[j]] = i
        else:
            first[j] = i
        last[j] = i
        if deferring:
            tag[i] = launch[j] if running[j] and fixed[j] else launch[j] - 1
        _add_load(load, least, j, tokens[i] + any_held)
        if any_held:
            heapq.heappush(held, (release_s[i], j))
        placed[i] = j
        if not running[j]:
            _start(j, now, queue, state, requests, vectors, kind, decode, options, busy, written, ends)
    _end_passes(np.inf, ends, finish_s, load, least, queue, state, requests, vectors, kind, decode, options, busy, written)
    return finish_s, busy[:written[0]], placed


@jit
def ranks(sorted_values, queries, order, right):
    """np.searchsorted(sorted_values, queries, side="right" if right else "left"): for each query,
    how many values lie below it (or at it, `right`), by one merge over the queries in ascending
    `order` rather than a binary search each (the decode fixed point counts the requests open at
    every request's midpoint this way)."""
    out = np.empty(len(queries), np.int64)
    k, n = 0, len(sorted_values)
    for i in order:
        x = queries[i]
        while k < n and (sorted_values[k] <= x if right else sorted_values[k] < x):
            k += 1
        out[i] = k
    return out


@jit
def running_peak(times, weights, order):
    """The largest running sum of `weights` taken in time order, equal times by weight and then
    position, as np.max(np.cumsum(weights[np.lexsort((weights, times))])) gives it (the same
    additions in the same order): `order` sorts `times` (any order among equal times)."""
    n = len(order)
    i = 0
    while i < n:  # each run of equal times, by (weight, position)
        j = i + 1
        while j < n and times[order[j]] == times[order[i]]:
            j += 1
        for a in range(i + 1, j):  # (an insertion sort: runs are short, and it compiles in a fraction of np.argsort's time)
            k, b = order[a], a
            while b > i and (weights[order[b - 1]] > weights[k] or (weights[order[b - 1]] == weights[k] and order[b - 1] > k)):
                order[b] = order[b - 1]
                b -= 1
            order[b] = k
        i = j
    total, peak = 0.0, -np.inf
    for k in order:
        total += weights[k]
        peak = max(peak, total)
    return peak
