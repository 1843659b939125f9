"""The simulator's run of co-located instances compiled (numba): `sim.cluster` on one pool of mixed
instances in an open loop, without prefix caches, event logs or recorded passes, on an analytic
instance; the same result to the bit (a property test runs both over random traces and engines).
It is the planner's verdict on every co-located plan (capacity.pools.colocated_pool), at about
1 us a request-iteration where the Python run takes about 10.

Its rules are `sim.cluster`'s for a mixed instance, statement for statement (that module's
docstring states them): join-shortest-queue (or round-robin) at arrival on pending prompt tokens
plus one per request held, KV admission in arrival order, whole-prompt or chunked passes with the
running decodes, `max_num_seqs`, async scheduling, preemption of the newest decode when the KV
cannot grow. Co-located instances in an open loop touch only themselves between arrivals, so the
run advances each instance to the next arrival, then routes it (an iteration that ends at an
arrival's time ends first, as the event heap orders them). Decode-only iterations are run one by
one (the Python run computes stretches of them at once, with the same sums in the same order), so
`events` counts every iteration end.

State: per request (`req`, `times`: rows named below) and per instance (`inst`, `clock`). An
instance's prompt queue, its requests waiting for KV room, those deferred by async scheduling and
those its running pass prefills are linked lists over the requests (`NEXT`; a request is in one
at most), its decode batch a doubly linked list in join order (`PREV`, `AFTER`).
"""

from __future__ import annotations

import numpy as np

from splitplan.perf.kernels import jit, pass_time_s

# per-request integer rows
(NEXT, PREV, AFTER, FINISH_ITER, DEFERRED_AT, PLEN, BASE, DONE, RESUMED, JOIN_ITER, INSTANCE, REJECTED, REFUSED,
 CACHED) = range(14)
REQUEST_ROWS = 14
# per-request float rows
TTFT, E2E, STALL, PREEMPTED_AT, REJOINED, PREFILL_START, KV_READY, JOIN_TIME = range(8)
TIME_ROWS = 8
# per-instance integer columns: four lists (head, tail, length), then the rest
QUEUE, WAITING, DEFERRED, RUN = 0, 3, 6, 9
(MEMBERS_HEAD, MEMBERS_TAIL, BATCH, CTX, KV_USED, ITERS, RUNNING, FIXED, LAUNCH, NEXT_FINISH,
 LOAD) = range(12, 23)
INSTANCE_COLUMNS = 23
# per-instance float columns
END, PREFILL_S, DECODE_S, INTEGRAL = range(4)
# run-wide counters
ITERATIONS, TOKENS_OUT, PREEMPTIONS, EVENTS, ENDS = range(5)
# statuses
OK, TOO_MANY_ITERATIONS, BATCH_PAST_TABLE = 0, 1, 2


@jit
def _push(inst, k, lst, req, i):
    req[NEXT, i] = -1
    if inst[k, lst + 1] < 0:
        inst[k, lst] = i
    else:
        req[NEXT, inst[k, lst + 1]] = i
    inst[k, lst + 1] = i
    inst[k, lst + 2] += 1


@jit
def _push_front(inst, k, lst, req, i):
    req[NEXT, i] = inst[k, lst]
    inst[k, lst] = i
    if inst[k, lst + 1] < 0:
        inst[k, lst + 1] = i
    inst[k, lst + 2] += 1


@jit
def _pop(inst, k, lst, req):
    i = inst[k, lst]
    inst[k, lst] = req[NEXT, i]
    if inst[k, lst] < 0:
        inst[k, lst + 1] = -1
    inst[k, lst + 2] -= 1
    return i


@jit
def _unlink(inst, k, req, i):
    """Request i leaves instance k's decode batch."""
    before, after = req[PREV, i], req[AFTER, i]
    if before < 0:
        inst[k, MEMBERS_HEAD] = after
    else:
        req[AFTER, before] = after
    if after < 0:
        inst[k, MEMBERS_TAIL] = before
    else:
        req[PREV, after] = before


@jit
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


@jit
def _finish(times, out, counters, arrival, i, now):
    times[E2E, i] = now - arrival[i]
    counters[TOKENS_OUT] += out[i]


@jit
def _preempt(inst, k, req, times, prompt, out, counters, now):
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
    inst[k, LOAD] += req[PLEN, v]
    _push_front(inst, k, WAITING, req, v)


@jit
def _admit(inst, k, req, prompt, out, kv_cap, max_request, cap):
    """Waiting requests, in order, to the prompt queue while their prompt (and first token) fits
    beside the KV held; one that can never fit is rejected."""
    while inst[k, WAITING + 2]:
        i = inst[k, WAITING]
        if prompt[i] + out[i] > max_request:
            _pop(inst, k, WAITING, req)
            req[REJECTED, i] = 1
            inst[k, LOAD] -= prompt[i] + 1
            continue
        if (inst[k, KV_USED] + inst[k, CTX] + req[PLEN, i] + 1 > kv_cap
                or inst[k, BATCH] + inst[k, QUEUE + 2] + inst[k, RUN + 2] >= cap):
            break
        _pop(inst, k, WAITING, req)
        inst[k, KV_USED] += req[PLEN, i]
        _push(inst, k, QUEUE, req, i)


@jit
def _release(inst, k, req, before):
    """Requests deferred by async scheduling that arrived in an iteration before `before` join
    the wait for KV room."""
    while inst[k, DEFERRED + 2] and req[DEFERRED_AT, inst[k, DEFERRED]] < before:
        _push(inst, k, WAITING, req, _pop(inst, k, DEFERRED, req))


@jit
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


@jit
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


@jit
def _start(inst, clock, k, req, times, prompt, out, counters, now, engine, vector, lines, single):
    """Begin instance k's next iteration, if it has work (BATCH_PAST_TABLE if its decode batch
    outgrew `lines`, else OK)."""
    kv_cap, max_batch_tokens, cap, chunked, deferring = engine[0], engine[2], engine[3], engine[4], engine[5]
    while inst[k, BATCH] > 1 and inst[k, KV_USED] + inst[k, CTX] + inst[k, BATCH] > kv_cap:
        _preempt(inst, k, req, times, prompt, out, counters, now)
    chunks = total = sq = 0
    if inst[k, QUEUE + 2]:
        if chunked:
            chunks, total, sq = _chunks(inst, k, req, times, now, max_batch_tokens, cap)
        else:
            chunks, total, sq = _whole_prompts(inst, k, req, times, now, max_batch_tokens, cap)
    batch = inst[k, BATCH]
    if chunks:
        first = inst[k, RUN]
        if chunks == 1 and batch == 0 and first >= 0 and total == prompt[first] and not req[RESUMED, first]:
            duration = single[first]  # one whole prompt alone: its time is known
        else:
            duration = pass_time_s(vector, float(chunks), float(total), float(sq), float(batch), float(inst[k, CTX]))
        clock[k, PREFILL_S] += duration
    elif batch:
        if batch >= len(lines):
            return BATCH_PAST_TABLE
        attention = inst[k, CTX] * lines[batch, 1]
        duration = lines[batch, 0] + attention + (lines[batch, 2] - attention if lines[batch, 2] > attention else 0.0)
        clock[k, DECODE_S] += duration
    else:
        inst[k, RUNNING] = 0
        clock[k, END] = np.inf
        return OK
    clock[k, INTEGRAL] += batch * duration
    inst[k, RUNNING] = 1
    if deferring:  # the next iteration is scheduled now if there is work beyond this one
        inst[k, LAUNCH] += 1
        inst[k, FIXED] = int(batch > 0 or inst[k, QUEUE + 2] > 0 or inst[k, WAITING + 2] > 0
                             or inst[k, DEFERRED + 2] > 0 or inst[k, RUN + 2] > 0)
    clock[k, END] = now + duration
    return OK


@jit
def _prefill_done(inst, k, req, times, prompt, out, counters, arrival, i, now):
    if req[RESUMED, i]:  # recomputed after a preemption: its next token comes now
        times[STALL, i] = max(times[STALL, i], now - times[PREEMPTED_AT, i])
        inst[k, KV_USED] -= req[PLEN, i]
        req[BASE, i] += 1
        if req[BASE, i] == out[i]:  # that was its last token
            _finish(times, out, counters, arrival, i, now)
            inst[k, LOAD] -= 1
        else:
            _join(inst, k, req, times, prompt, out, i, now)
        req[RESUMED, i] = 0
        return
    times[TTFT, i] = now - arrival[i]
    if out[i] == 1:  # the first token was the whole answer
        _finish(times, out, counters, arrival, i, now)
        inst[k, LOAD] -= 1
        return
    times[KV_READY, i] = now
    inst[k, KV_USED] -= req[PLEN, i]
    _join(inst, k, req, times, prompt, out, i, now)


@jit
def _finish_decodes(inst, k, req, times, prompt, out, counters, arrival, now):
    """The decodes whose last token this iteration gave leave the batch."""
    iters = inst[k, ITERS]
    soonest = np.iinfo(np.int64).max
    i = inst[k, MEMBERS_HEAD]
    while i >= 0:
        after = req[AFTER, i]
        if req[FINISH_ITER, i] == iters:
            _unlink(inst, k, req, i)
            inst[k, BATCH] -= 1
            inst[k, CTX] -= prompt[i] + out[i]
            inst[k, LOAD] -= 1
            _finish(times, out, counters, arrival, i, now)
        else:
            soonest = min(soonest, req[FINISH_ITER, i])
        i = after
    inst[k, NEXT_FINISH] = soonest


@jit
def _iteration_end(inst, clock, k, req, times, prompt, out, counters, arrival, now, engine, vector, lines, single,
                   ends_s, ends_at):
    """Instance k's iteration is over: every decode has one more token (some finish), the prefills
    it carried have their first token; admit and start the next one."""
    kv_cap, max_request, cap, max_iterations = engine[0], engine[1], engine[3], engine[6]
    if inst[k, BATCH]:
        inst[k, ITERS] += 1
        counters[ITERATIONS] += 1
        if counters[ITERATIONS] > max_iterations:
            return TOO_MANY_ITERATIONS
        ends_s[counters[ENDS]], ends_at[counters[ENDS]] = now, k
        counters[ENDS] += 1
        inst[k, CTX] += inst[k, BATCH]
        if inst[k, ITERS] >= inst[k, NEXT_FINISH]:
            _finish_decodes(inst, k, req, times, prompt, out, counters, arrival, now)
    i = inst[k, RUN]
    while i >= 0:
        after = req[NEXT, i]
        inst[k, LOAD] -= req[PLEN, i]  # a prompt stays pending on its instance until its prefill completes
        _prefill_done(inst, k, req, times, prompt, out, counters, arrival, i, now)
        i = after
    inst[k, RUN], inst[k, RUN + 1], inst[k, RUN + 2] = -1, -1, 0
    if inst[k, DEFERRED + 2]:  # async scheduling: those that arrived before this iteration began may join
        _release(inst, k, req, inst[k, LAUNCH])
    _admit(inst, k, req, prompt, out, kv_cap, max_request, cap)
    status = _start(inst, clock, k, req, times, prompt, out, counters, now, engine, vector, lines, single)
    if status == OK and not inst[k, RUNNING] and inst[k, DEFERRED + 2]:  # nothing was scheduled: the rest join now
        _release(inst, k, req, np.iinfo(np.int64).max)
        _admit(inst, k, req, prompt, out, kv_cap, max_request, cap)
        status = _start(inst, clock, k, req, times, prompt, out, counters, now, engine, vector, lines, single)
    return status


@jit
def _arrive(inst, clock, k, req, times, prompt, out, counters, arrival, i, now, engine, vector, lines, single):
    """Request i, routed to instance k, is refused (longer than max_model_len) or queued."""
    kv_cap, max_request, cap, context = engine[0], engine[1], engine[3], engine[7]
    req[INSTANCE, i] = k
    if context > 0 and prompt[i] + out[i] > context:  # the engine refuses it at once
        req[REJECTED, i] = req[REFUSED, i] = 1
        return OK
    inst[k, LOAD] += prompt[i] + 1  # its prompt tokens pending, and one for the request held
    if inst[k, RUNNING] and inst[k, FIXED]:  # async scheduling: the next iteration is already scheduled
        req[DEFERRED_AT, i] = inst[k, LAUNCH]
        _push(inst, k, DEFERRED, req, i)
    else:
        _push(inst, k, WAITING, req, i)
        _admit(inst, k, req, prompt, out, kv_cap, max_request, cap)
    if not inst[k, RUNNING]:
        return _start(inst, clock, k, req, times, prompt, out, counters, now, engine, vector, lines, single)
    return OK


@jit
def colocated_run(arrival, front_s, prompt, out, req, times, instances, engine, vector, lines, single, round_robin):
    """Run the requests (arrival times, prompt and output tokens) on `instances` co-located
    instances. `engine`: KV capacity, longest request, token budget, sequence cap, chunked,
    async scheduling, iteration limit, max_model_len (0: none), all in tokens or counts; `vector`
    the pass formula's constants; `lines[b]` a decode step of b requests as (base, per context
    token, slack) (Instance.decode_line); `single` each prompt's time alone. Fills `req` and
    `times` (initialized by the caller); returns (status, per-instance integer state, per-instance
    times, counters, iteration end times, their instances)."""
    n = len(arrival)
    inst = np.zeros((instances, INSTANCE_COLUMNS), np.int64)
    for lst in (QUEUE, WAITING, DEFERRED, RUN):
        inst[:, lst], inst[:, lst + 1] = -1, -1
    inst[:, MEMBERS_HEAD], inst[:, MEMBERS_TAIL] = -1, -1
    inst[:, NEXT_FINISH] = np.iinfo(np.int64).max
    clock = np.zeros((instances, 4))
    clock[:, END] = np.inf
    counters = np.zeros(5, np.int64)
    ends_s, ends_at = np.empty(max(1024, 4 * n)), np.empty(max(1024, 4 * n), np.int64)
    turn = 0
    for r in range(n + 1):
        now = arrival[r] + front_s if r < n else np.inf
        for k in range(instances):  # each instance up to the arrival (an iteration ending at it first)
            while inst[k, RUNNING] and clock[k, END] <= now:
                if counters[ENDS] == len(ends_s):
                    ends_s, ends_at = np.concatenate((ends_s, ends_s)), np.concatenate((ends_at, ends_at))
                counters[EVENTS] += 1
                status = _iteration_end(inst, clock, k, req, times, prompt, out, counters, arrival, clock[k, END], engine,
                                        vector, lines, single, ends_s, ends_at)
                if status != OK:
                    return status, inst, clock, counters, ends_s[:0], ends_at[:0]
        if r == n:
            break
        counters[EVENTS] += 1
        if round_robin:
            k, turn = turn % instances, turn + 1
        else:
            k = int(np.argmin(inst[:, LOAD]))  # join-shortest-queue, ties to the lowest index
        status = _arrive(inst, clock, k, req, times, prompt, out, counters, arrival, r, now, engine, vector, lines, single)
        if status != OK:
            return status, inst, clock, counters, ends_s[:0], ends_at[:0]
    return OK, inst, clock, counters, ends_s[:counters[ENDS]].copy(), ends_at[:counters[ENDS]].copy()
