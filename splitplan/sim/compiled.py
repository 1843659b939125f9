"""The simulator's run compiled (numba): `sim.cluster` in an open loop on analytic instances, without
prefix caches, borrowing, shared machines, event logs or recorded passes: one pool of co-located
instances, or prompt and token pools; the same result to the bit (a property test runs both over
random traces, engines and layouts). It is the planner's verdict on every co-located plan
(capacity.pools.colocated_pool) and `simulate`'s run of such clusters, at about 1 us an event
where the Python loop takes about 10.

Its rules are `sim.cluster`'s, statement for statement (that module's docstring states them):
join-shortest-queue (or round-robin) at arrival on pending prompt tokens (plus one per request held
on a co-located instance) and, for token instances, on output tokens assigned; KV admission in
arrival order; whole-prompt or chunked passes (with the running decodes, co-located);
`max_num_seqs`; async scheduling; preemption of the newest decode when a co-located instance's KV
cannot grow; KV transfers over the two instances' links, FIFO, serialized or layer by layer.
Events come from one heap keyed (time, sequence number) as there, and arrivals go first only when
strictly earlier, so equal times resolve as the Python loop resolves them. Decode-only iterations
are run one by one (the Python loop computes stretches of them at once, with the same sums in the
same order), so `events` counts every iteration end.

State: per request (`req`, `times`: rows named below) and per instance (`inst`, `clock`). An
instance's prompt queue, its requests waiting for KV room, those deferred by async scheduling and
those its running pass prefills are linked lists over the requests (`NEXT`; a request is in one
at most), its decode batch a doubly linked list in join order (`PREV`, `AFTER`).
"""

from __future__ import annotations

import heapq

import numpy as np

from splitplan.perf.kernels import inline, jit, pass_time_s
from splitplan.sim.types import Event

# numba keys a kernel's cached machine code on its own file alone, and these kernels compile in code
# and constants of the modules imported above: a hash of their text, which changes this file with
# them and so renews the cache (tests/test_kernel_caches.py names the new value when it is stale).
COMPILED_IN_SHA256 = "28c128a0c8fcf475"

# per-request integer rows
(NEXT, PREV, AFTER, FINISH_ITER, DEFERRED_AT, PLEN, BASE, DONE, RESUMED, JOIN_ITER, P_INST, T_INST, REJECTED, REFUSED,
 CACHED) = range(15)
REQUEST_ROWS = 15
# per-request float rows
TTFT, E2E, STALL, PREEMPTED_AT, REJOINED, PREFILL_START, KV_READY, JOIN_TIME = range(8)
TIME_ROWS = 8
# per-instance integer columns: four lists (head, tail, length), then the rest
QUEUE, WAITING, DEFERRED, RUN = 0, 3, 6, 9
(MEMBERS_HEAD, MEMBERS_TAIL, BATCH, CTX, KV_USED, ITERS, RUNNING, FIXED, LAUNCH, NEXT_FINISH, ROLE, POOL, P_POS,
 T_POS) = range(12, 26)
INSTANCE_COLUMNS = 26
# per-instance float columns
PREFILL_S, DECODE_S, INTEGRAL, LINK_FREE = range(4)
# per-pool integer settings, and float ones
KV_CAP, MAX_REQUEST, CHUNKED, DEFERRING, LAYERWISE_MIN = range(5)
LINK_BPS, KV_LATENCY_S = range(2)
# run-wide integer settings, and counters
MAX_BATCH_TOKENS, CAP, MAX_ITERATIONS, CONTEXT, LAYERS, ROUND_ROBIN = range(6)
ITERATIONS, TOKENS_OUT, PREEMPTIONS, EVENTS, ENDS, SEQ, TURN_P, TURN_T = range(8)
# roles (their order in ROLES) and heap events (sim.types.Event)
ROLES = ("prompt", "token", "mixed")
PROMPT, TOKEN, MIXED = range(3)
KV_ARRIVED, ITERATION_END = int(Event.KV_ARRIVED), int(Event.ITERATION_END)
# statuses, and how an instance is settled after an event (_settle)
OK, TOO_MANY_ITERATIONS, BATCH_PAST_TABLE = 0, 1, 2
START, ADMIT_THEN_START, AFTER_ITERATION = 0, 1, 2


@inline
def _push(inst, k, lst, req, i):
    req[NEXT, i] = -1
    if inst[k, lst + 1] < 0:
        inst[k, lst] = i
    else:
        req[NEXT, inst[k, lst + 1]] = i
    inst[k, lst + 1] = i
    inst[k, lst + 2] += 1


@inline
def _push_front(inst, k, lst, req, i):
    req[NEXT, i] = inst[k, lst]
    inst[k, lst] = i
    if inst[k, lst + 1] < 0:
        inst[k, lst + 1] = i
    inst[k, lst + 2] += 1


@inline
def _pop(inst, k, lst, req):
    i = inst[k, lst]
    inst[k, lst] = req[NEXT, i]
    if inst[k, lst] < 0:
        inst[k, lst + 1] = -1
    inst[k, lst + 2] -= 1
    return i


@inline
def _unlink(inst, k, req, i):
    """Request i leaves instance k's decode batch (co-located instances keep it in join order)."""
    before, after = req[PREV, i], req[AFTER, i]
    if before < 0:
        inst[k, MEMBERS_HEAD] = after
    else:
        req[AFTER, before] = after
    if after < 0:
        inst[k, MEMBERS_TAIL] = before
    else:
        req[PREV, after] = before


@inline
def _join(inst, k, req, times, prompt, out, i, now):
    """Request i (its KV held on k) joins the decode batch at this iteration boundary."""
    inst[k, BATCH] += 1
    inst[k, CTX] += prompt[i] + req[BASE, i]
    if req[RESUMED, i]:
        times[REJOINED, i] = now
    else:
        times[JOIN_TIME, i] = now
    req[JOIN_ITER, i] = inst[k, ITERS]
    req[FINISH_ITER, i] = inst[k, ITERS] + out[i] - req[BASE, i]
    inst[k, NEXT_FINISH] = min(inst[k, NEXT_FINISH], req[FINISH_ITER, i])
    tail = inst[k, MEMBERS_TAIL]
    req[PREV, i], req[AFTER, i] = tail, -1
    if tail < 0:
        inst[k, MEMBERS_HEAD] = i
    else:
        req[AFTER, tail] = i
    inst[k, MEMBERS_TAIL] = i


@inline
def _finish(times, out, counters, arrival, i, now):
    times[E2E, i] = now - arrival[i]
    counters[TOKENS_OUT] += out[i]


@inline
def _unassign(inst, k, out, p_load, t_load, i):
    """Request i no longer holds a decode place on k (finished or rejected)."""
    if inst[k, ROLE] == MIXED:
        p_load[inst[k, P_POS]] -= 1
    if inst[k, T_POS] >= 0:
        t_load[inst[k, T_POS]] -= out[i]


@inline
def _preempt(inst, k, req, times, prompt, p_load, counters, now):
    """The newest decode is preempted (its KV freed) and waits at the head of the line to be
    recomputed, its prompt and output so far, then decodes on."""
    v = inst[k, MEMBERS_TAIL]
    _unlink(inst, k, req, v)
    have = req[BASE, v] + inst[k, ITERS] - req[JOIN_ITER, v]
    inst[k, BATCH] -= 1
    inst[k, CTX] -= prompt[v] + have
    req[PLEN, v], req[BASE, v], req[DONE, v] = prompt[v] + have, have, 0
    req[RESUMED, v] = 1
    times[PREEMPTED_AT, v] = now
    counters[PREEMPTIONS] += 1
    p_load[inst[k, P_POS]] += req[PLEN, v]
    _push_front(inst, k, WAITING, req, v)


@inline
def _admit(inst, k, req, times, prompt, out, p_load, t_load, pools, cap, now):
    """Waiting requests, in order, while their KV fits: a token instance reserves a request's whole
    KV and it joins the batch; a co-located one admits it to its prompt queue when its prompt (and
    first token) fits beside what is held. One that can never fit is rejected."""
    mixed = inst[k, ROLE] == MIXED
    kv_cap, max_request = pools[inst[k, POOL], KV_CAP], pools[inst[k, POOL], MAX_REQUEST]
    while inst[k, WAITING + 2]:
        i = inst[k, WAITING]
        need = prompt[i] + out[i]
        if need > max_request:
            _pop(inst, k, WAITING, req)
            req[REJECTED, i] = 1
            if mixed:
                p_load[inst[k, P_POS]] -= prompt[i]
            _unassign(inst, k, out, p_load, t_load, i)
            continue
        if mixed:
            if (inst[k, KV_USED] + inst[k, CTX] + req[PLEN, i] + 1 > kv_cap
                    or inst[k, BATCH] + inst[k, QUEUE + 2] + inst[k, RUN + 2] >= cap):
                break
            _pop(inst, k, WAITING, req)
            inst[k, KV_USED] += req[PLEN, i]
            _push(inst, k, QUEUE, req, i)
            continue
        if inst[k, KV_USED] + need > kv_cap or inst[k, BATCH] >= cap:
            break
        _pop(inst, k, WAITING, req)
        inst[k, KV_USED] += need
        _join(inst, k, req, times, prompt, out, i, now)


@inline
def _release(inst, k, req, before):
    """Requests deferred by async scheduling that arrived in an iteration before `before` join
    the line they were headed for: a co-located or token instance's wait for KV room, a prompt
    instance's queue."""
    line = QUEUE if inst[k, ROLE] == PROMPT else WAITING
    while inst[k, DEFERRED + 2] and req[DEFERRED_AT, inst[k, DEFERRED]] < before:
        _push(inst, k, line, req, _pop(inst, k, DEFERRED, req))


@inline
def _whole_prompts(inst, k, req, times, now, max_batch_tokens, cap):
    """(prompts, tokens, squared tokens) of a whole-prompt pass: prompts from the queue's head up
    to the budget, at least one."""
    count = total = sq = 0
    while inst[k, QUEUE + 2]:
        h = inst[k, QUEUE]
        if count and (total + req[PLEN, h] - req[DONE, h] > max_batch_tokens or count >= cap):
            break
        i = _pop(inst, k, QUEUE, req)
        _push(inst, k, RUN, req, i)
        count += 1
        d = req[DONE, i]
        total += req[PLEN, i] - d
        sq += req[PLEN, i] * req[PLEN, i] - d * d
        req[DONE, i] = req[PLEN, i]
        if not req[RESUMED, i]:
            times[PREFILL_START, i] = now
    return count, total, sq


@inline
def _chunks(inst, k, req, times, now, budget, cap):
    """(prompts or chunks, tokens, squared tokens) of a chunked pass: the decodes first, then
    prompt tokens from the queue's head up to the budget, the last prompt split."""
    total = sq = chunks = 0
    room = budget - inst[k, BATCH]
    while room > 0 and chunks < cap and inst[k, QUEUE + 2]:
        i = inst[k, QUEUE]
        d = req[DONE, i]
        if d == req[CACHED, i] and not req[RESUMED, i]:
            times[PREFILL_START, i] = now
        c = min(req[PLEN, i] - d, room)
        total += c
        sq += (d + c) * (d + c) - d * d  # causal attention of c new tokens over d + c
        req[DONE, i] = d + c
        room -= c
        chunks += 1
        if req[DONE, i] < req[PLEN, i]:
            break
        _push(inst, k, RUN, req, _pop(inst, k, QUEUE, req))
    return chunks, total, sq


@inline
def _pass_s(inst, clock, k, req, prompt, chunks, total, sq, vectors, lines, single):
    """The time of instance k's pass (-1.0: its decode batch outgrew `lines`)."""
    pool, batch = inst[k, POOL], inst[k, BATCH]
    if chunks:
        first = inst[k, RUN]
        if chunks == 1 and batch == 0 and first >= 0 and total == prompt[first] and not req[RESUMED, first]:
            duration = single[pool, first]  # one whole prompt alone: its time is known
        else:
            duration = pass_time_s(vectors[pool], float(chunks), float(total), float(sq), float(batch), float(inst[k, CTX]))
        clock[k, PREFILL_S] += duration
        return duration
    if batch >= lines.shape[1]:
        return -1.0
    base, per_token, slack = lines[pool, batch, 0], lines[pool, batch, 1], lines[pool, batch, 2]
    attention = inst[k, CTX] * per_token
    duration = base + attention + (slack - attention if slack > attention else 0.0)
    clock[k, DECODE_S] += duration
    return duration


@inline
def _start(inst, clock, k, req, times, prompt, p_load, counters, heap, now, pools, settings, vectors, lines, single):
    """Begin instance k's next iteration, if it has work (BATCH_PAST_TABLE if its decode batch
    outgrew `lines`, else OK)."""
    pool, role, cap = inst[k, POOL], inst[k, ROLE], settings[CAP]
    while role == MIXED and inst[k, BATCH] > 1 and inst[k, KV_USED] + inst[k, CTX] + inst[k, BATCH] > pools[pool, KV_CAP]:
        _preempt(inst, k, req, times, prompt, p_load, counters, now)
    chunks = total = sq = 0
    if role != TOKEN and inst[k, QUEUE + 2]:
        if pools[pool, CHUNKED]:
            chunks, total, sq = _chunks(inst, k, req, times, now, settings[MAX_BATCH_TOKENS], cap)
        else:
            chunks, total, sq = _whole_prompts(inst, k, req, times, now, settings[MAX_BATCH_TOKENS], cap)
    batch = inst[k, BATCH]
    if not chunks and not batch:
        inst[k, RUNNING] = 0
        return OK
    duration = _pass_s(inst, clock, k, req, prompt, chunks, total, sq, vectors, lines, single)
    if duration < 0.0:
        return BATCH_PAST_TABLE
    clock[k, INTEGRAL] += batch * duration
    inst[k, RUNNING] = 1
    if pools[pool, DEFERRING]:  # the next iteration is scheduled now if there is work beyond this one
        inst[k, LAUNCH] += 1
        inst[k, FIXED] = int(batch > 0 or inst[k, QUEUE + 2] > 0 or inst[k, WAITING + 2] > 0
                             or inst[k, DEFERRED + 2] > 0 or (inst[k, RUN + 2] > 0 and role == MIXED))
    counters[SEQ] += 1
    heapq.heappush(heap, (now + duration, counters[SEQ], ITERATION_END, k, -1))
    return OK


@inline
def _send_kv(inst, clock, k, tok, req, times, prompt, counters, heap, i, now, pools, pools_s, settings, kv_bytes):
    """Request i's KV leaves prompt instance k for token instance tok over both links (FIFO):
    after the prefill when short, else layer by layer from the prefill's start."""
    source, destination = inst[k, POOL], inst[tok, POOL]
    duration = prompt[i] * kv_bytes / min(pools_s[source, LINK_BPS], pools_s[destination, LINK_BPS])
    busy_until = max(clock[k, LINK_FREE], clock[tok, LINK_FREE])  # both NICs carry the transfer
    if prompt[i] < pools[source, LAYERWISE_MIN]:
        begin = max(now, busy_until)
        done = begin + duration + pools_s[source, KV_LATENCY_S]
    else:
        begin = max(times[PREFILL_START, i], busy_until)
        done = max(begin + duration, now + duration / settings[LAYERS]) + pools_s[source, KV_LATENCY_S]
    clock[k, LINK_FREE] = clock[tok, LINK_FREE] = begin + duration
    counters[SEQ] += 1
    heapq.heappush(heap, (done, counters[SEQ], KV_ARRIVED, tok, i))


@inline
def _prefill_done(inst, clock, k, req, times, prompt, out, p_load, t_load, counters, arrival, heap, i, now, pools, pools_s,
                  settings, kv_bytes):
    if req[RESUMED, i]:  # recomputed after a preemption: its next token comes now
        times[STALL, i] = max(times[STALL, i], now - times[PREEMPTED_AT, i])
        inst[k, KV_USED] -= req[PLEN, i]
        req[BASE, i] += 1
        if req[BASE, i] == out[i]:  # that was its last token
            _finish(times, out, counters, arrival, i, now)
            _unassign(inst, k, out, p_load, t_load, i)
        else:
            _join(inst, k, req, times, prompt, out, i, now)
        req[RESUMED, i] = 0
        return
    times[TTFT, i] = now - arrival[i]
    tok = req[T_INST, i]
    if out[i] == 1:  # the first token was the whole answer
        _finish(times, out, counters, arrival, i, now)
        _unassign(inst, tok, out, p_load, t_load, i)
        return
    if tok == k:  # co-located: its KV held since admission, now counted in the batch's context
        times[KV_READY, i] = now
        inst[k, KV_USED] -= req[PLEN, i]
        _join(inst, k, req, times, prompt, out, i, now)
        return
    _send_kv(inst, clock, k, tok, req, times, prompt, counters, heap, i, now, pools, pools_s, settings, kv_bytes)


@inline
def _finish_decodes(inst, k, req, times, prompt, out, p_load, t_load, counters, arrival, now):
    """The decodes whose last token this iteration gave leave the batch."""
    iters = inst[k, ITERS]
    soonest = np.iinfo(np.int64).max
    i = inst[k, MEMBERS_HEAD]
    while i >= 0:
        after = req[AFTER, i]
        if req[FINISH_ITER, i] == iters:
            _unlink(inst, k, req, i)
            if inst[k, ROLE] != MIXED:
                inst[k, KV_USED] -= prompt[i] + out[i]
            inst[k, BATCH] -= 1
            inst[k, CTX] -= prompt[i] + out[i]
            _unassign(inst, k, out, p_load, t_load, i)
            _finish(times, out, counters, arrival, i, now)
        else:
            soonest = min(soonest, req[FINISH_ITER, i])
        i = after
    inst[k, NEXT_FINISH] = soonest


@inline
def _settle(inst, clock, k, req, times, prompt, out, p_load, t_load, counters, heap, now, pools, settings, vectors, lines,
            single, how):
    """The one place instances admit waiting requests and start iterations. After an iteration
    (AFTER_ITERATION): the deferred requests that arrived before it began join, waiting ones are
    admitted, the next iteration starts, and when none could be, the rest of the deferred join
    and it is tried again. After an arrival on a co-located instance, or a KV arrival on an idle
    instance (ADMIT_THEN_START): admit, then start if idle; after any other arrival (START): start
    if idle."""
    if how == AFTER_ITERATION and inst[k, DEFERRED + 2]:  # async scheduling: those that arrived before it began
        _release(inst, k, req, inst[k, LAUNCH])
    status = OK
    for attempt in range(2):
        if attempt:  # nothing was scheduled after an iteration: the deferred rest join now
            if how != AFTER_ITERATION or inst[k, RUNNING] or not inst[k, DEFERRED + 2]:
                break
            _release(inst, k, req, np.iinfo(np.int64).max)
        if how != START:
            _admit(inst, k, req, times, prompt, out, p_load, t_load, pools, settings[CAP], now)
        if how == AFTER_ITERATION or not inst[k, RUNNING]:
            status = _start(inst, clock, k, req, times, prompt, p_load, counters, heap, now, pools, settings, vectors, lines,
                            single)
        if status != OK:
            break
    return status


@inline
def _iteration_end(inst, clock, k, req, times, prompt, out, p_load, t_load, counters, arrival, heap, now, pools, pools_s,
                   settings, kv_bytes, ends_s, ends_at):
    """Instance k's iteration is over: every decode has one more token (some finish), the prefills
    it carried have their first token (the caller then settles it: AFTER_ITERATION)."""
    if inst[k, BATCH]:
        inst[k, ITERS] += 1
        counters[ITERATIONS] += 1
        if counters[ITERATIONS] > settings[MAX_ITERATIONS]:
            return TOO_MANY_ITERATIONS
        ends_s[counters[ENDS]], ends_at[counters[ENDS]] = now, k
        counters[ENDS] += 1
        inst[k, CTX] += inst[k, BATCH]
        if inst[k, ITERS] >= inst[k, NEXT_FINISH]:
            _finish_decodes(inst, k, req, times, prompt, out, p_load, t_load, counters, arrival, now)
    i = inst[k, RUN]
    while i >= 0:
        after = req[NEXT, i]
        p_load[inst[k, P_POS]] -= req[PLEN, i]  # a prompt stays pending on its instance until its prefill completes
        _prefill_done(inst, clock, k, req, times, prompt, out, p_load, t_load, counters, arrival, heap, i, now, pools,
                      pools_s, settings, kv_bytes)
        i = after
    inst[k, RUN], inst[k, RUN + 1], inst[k, RUN + 2] = -1, -1, 0
    return OK


@inline
def _kv_arrived(inst, k, req, times, i, now):
    """Request i's KV reached token instance k: it waits to join the batch. Whether k is idle (then
    settled: ADMIT_THEN_START)."""
    times[KV_READY, i] = now
    if inst[k, RUNNING] and inst[k, FIXED]:  # async scheduling: the next iteration is already scheduled
        req[DEFERRED_AT, i] = inst[k, LAUNCH]
        _push(inst, k, DEFERRED, req, i)
        return False
    _push(inst, k, WAITING, req, i)
    return not inst[k, RUNNING]


@inline
def _route(inst, p_load, t_load, prompt_side, token_side, counters, settings):
    """(the instance that prefills a request, the one that decodes it): the least loaded of each
    side (ties to the lowest), or round-robin; a co-located instance does both."""
    if settings[ROUND_ROBIN]:
        src = prompt_side[counters[TURN_P] % len(prompt_side)]
        counters[TURN_P] += 1
    else:
        src = prompt_side[np.argmin(p_load)]
    if inst[src, ROLE] == MIXED:
        return src, src
    if settings[ROUND_ROBIN]:
        dst = token_side[counters[TURN_T] % len(token_side)]
        counters[TURN_T] += 1
    else:
        dst = token_side[np.argmin(t_load)]
    return src, dst


@inline
def _arrive(inst, req, prompt, out, p_load, t_load, counters, i, prompt_side, token_side, pools, settings):
    """Request i is routed, and refused (longer than max_model_len, or than a prompt instance's
    KV) or queued: (the instance to settle, -1 for none; how)."""
    src, dst = _route(inst, p_load, t_load, prompt_side, token_side, counters, settings)
    req[P_INST, i], req[T_INST, i] = src, dst
    if settings[CONTEXT] > 0 and prompt[i] + out[i] > settings[CONTEXT]:  # the engine refuses it at once
        req[REJECTED, i] = req[REFUSED, i] = 1
        return -1, START
    if inst[src, ROLE] == PROMPT and prompt[i] > pools[inst[src, POOL], MAX_REQUEST]:  # its prompt's KV never fits
        req[REJECTED, i] = 1
        return -1, START
    p_load[inst[src, P_POS]] += prompt[i] + (inst[src, ROLE] == MIXED)  # (a co-located one also counts the request held)
    if inst[dst, T_POS] >= 0:
        t_load[inst[dst, T_POS]] += out[i]
    if inst[src, RUNNING] and inst[src, FIXED]:  # async scheduling: the next iteration is already scheduled
        req[DEFERRED_AT, i] = inst[src, LAUNCH]
        _push(inst, src, DEFERRED, req, i)
        return src, START
    if inst[src, ROLE] == MIXED:  # prefilled once its KV is reserved
        _push(inst, src, WAITING, req, i)
        return src, ADMIT_THEN_START
    _push(inst, src, QUEUE, req, i)
    return src, START


def initial_state(prompt, cached, roles, pool, p_pos, t_pos):
    """(req, times, inst) for `run` before any event: per request (its prompt tokens, those a cache
    holds), per instance (role names, pool index, position among those that prefill and those that
    decode, -1 for none)."""
    n = len(prompt)
    req = np.zeros((REQUEST_ROWS, n), np.int64)
    req[PLEN], req[BASE], req[DONE], req[CACHED] = prompt, 1, cached, cached
    req[JOIN_ITER], req[P_INST], req[T_INST] = -1, -1, -1
    times = np.zeros((TIME_ROWS, n))
    times[[TTFT, E2E, REJOINED, KV_READY, JOIN_TIME]] = np.nan
    inst = np.zeros((len(roles), INSTANCE_COLUMNS), np.int64)
    inst[:, [lst + end for lst in (QUEUE, WAITING, DEFERRED, RUN) for end in (0, 1)]] = -1  # (empty lists)
    inst[:, [MEMBERS_HEAD, MEMBERS_TAIL]] = -1
    inst[:, NEXT_FINISH] = np.iinfo(np.int64).max
    inst[:, ROLE] = [ROLES.index(role) for role in roles]
    inst[:, POOL], inst[:, P_POS], inst[:, T_POS] = pool, p_pos, t_pos
    return req, times, inst


@jit
def run(arrival, front_s, prompt, out, req, times, inst, pools, pools_s, settings, kv_bytes, vectors, lines, single):
    """Run the requests (arrival times, prompt and output tokens) from `req`, `times` and `inst` as
    `initial_state` makes them. Per pool: `pools` (KV_CAP ... LAYERWISE_MIN), `pools_s` (LINK_BPS,
    KV_LATENCY_S), `vectors` the pass formula's constants, `lines[pool, b]` a decode step of b
    requests as (base, per context token, slack) (Instance.decode_line), `single[pool]` each
    prompt's time alone; `settings` (MAX_BATCH_TOKENS ... ROUND_ROBIN), `kv_bytes` per token.
    Fills `req`, `times` and `inst`; returns (status, per-instance times, counters, iteration end
    times, their instances)."""
    n, count = len(arrival), len(inst)
    prompt_side = np.flatnonzero(inst[:, P_POS] >= 0)
    token_side = np.flatnonzero(inst[:, T_POS] >= 0)
    p_load, t_load = np.zeros(len(prompt_side), np.int64), np.zeros(len(token_side), np.int64)
    clock = np.zeros((count, 4))
    counters = np.zeros(8, np.int64)
    ends_s, ends_at = np.empty(max(1024, 4 * n)), np.empty(max(1024, 4 * n), np.int64)
    heap = [(0.0, 0, 0, 0, 0)]
    heap.pop()
    r, status = 0, OK
    while status == OK and (r < n or len(heap)):
        if r < n and (not heap or arrival[r] + front_s < heap[0][0]):
            now = arrival[r] + front_s
            k, how = _arrive(inst, req, prompt, out, p_load, t_load, counters, r, prompt_side, token_side, pools, settings)
            r += 1
        else:
            now, _, kind, k, i = heapq.heappop(heap)
            if kind == KV_ARRIVED:
                k, how = (k if _kv_arrived(inst, k, req, times, i, now) else -1), ADMIT_THEN_START
            else:
                if counters[ENDS] == len(ends_s):
                    ends_s, ends_at = np.concatenate((ends_s, ends_s)), np.concatenate((ends_at, ends_at))
                status = _iteration_end(inst, clock, k, req, times, prompt, out, p_load, t_load, counters, arrival, heap, now,
                                        pools, pools_s, settings, kv_bytes, ends_s, ends_at)
                how = AFTER_ITERATION
        counters[EVENTS] += 1
        if k >= 0 and status == OK:
            status = _settle(inst, clock, k, req, times, prompt, out, p_load, t_load, counters, heap, now, pools, settings,
                             vectors, lines, single, how)
    return status, clock, counters, ends_s[:counters[ENDS]].copy(), ends_at[:counters[ENDS]].copy()
