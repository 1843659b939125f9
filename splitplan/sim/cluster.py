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
With an engine's `chunked_prefill_tokens` (chunked prefill, today's engines), an
iteration of any role instead carries every decoding request plus, up to that
many tokens in all, the head of the prompt queue, a prompt split over iterations
when it does not fit (its causal attention counted chunk by chunk); its first
token comes with its last chunk.

KV transfer (split pools) occupies the source's and the destination's NIC shares,
each shared FIFO by concurrent transfers, at the smaller of the two bandwidths.
Prompts shorter than the engine's `layerwise_transfer_min_tokens` are sent after
the prefill (serialized); longer ones layer by layer from the prefill's start, so
only the last layer's share (or what the link could not keep up with) is exposed.
The engine's `kv_transfer_latency_s` is added either way.

Routing at arrival: join-shortest-queue on pending tokens (prompt instances:
prompt tokens queued or in a running prefill, so a busy machine never ties with
an idle one; token instances: output tokens of the requests assigned and not yet
finished), ties to the lowest index; or round-robin. The planner's prompt replay
(capacity.pools.prompt_queue_ttft_s) routes the same way.
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
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from splitplan.workload.trace import Trace

PROMPT, TOKEN, MIXED = "prompt", "token", "mixed"


@dataclass(frozen=True)
class PoolSpec:
    """`machines` machines of one type, each holding gpus/tp instances of `perf`."""

    role: str
    perf: object  # Instance or MeasuredInstance
    machines: int

    @property
    def instances(self) -> int:
        return self.machines * self.perf.instances_per_machine


@dataclass(frozen=True)
class SimOptions:
    max_batch_tokens: int = 2048
    routing: str = "jsq"  # or "round-robin"
    borrow_threshold_tokens: int | None = None
    # Closed loop (as vLLM benchmark_serving, genai-perf and aiconfigurator measure): this many
    # clients, each sending its next request when its previous one finishes; the trace gives the
    # requests' sizes in order and its timestamps are ignored. None: open loop, the trace's times.
    concurrency: int | None = None


class _Inst:
    __slots__ = ("idx", "pool", "role", "perf", "can_prefill", "queue",
                 "waiting", "kv_cap", "kv_used", "kv_committed", "members", "batch", "ctx", "iters", "ends", "finishing", "running", "link_free",
                 "bw", "prefill_s", "decode_s", "batch_integral", "run_prefill", "steps")

    def __init__(self, idx, pool, role, perf, bw):
        self.idx, self.pool, self.role, self.perf = idx, pool, role, perf
        self.can_prefill = role in (PROMPT, MIXED)
        self.queue = deque()
        self.waiting = deque()
        self.kv_cap = perf.fit.kv_capacity_tokens
        self.kv_used = 0  # token: KV reserved whole; mixed: KV of the admitted requests not yet decoding
        self.members: list[int] = []  # mixed: the decode batch in join order (the newest is preempted first)
        self.kv_committed = 0  # KV of the requests routed here to decode and not finished (held, on its way or to come)
        self.batch = 0
        self.ctx = 0
        self.iters = 0
        self.ends: list[float] = []  # end time of each decode iteration
        self.finishing: dict[int, list[int]] = {}
        self.running = False
        self.link_free = 0.0
        self.bw = bw
        self.prefill_s = 0.0  # time in iterations that hold a prefill
        self.decode_s = 0.0  # time in decode-only iterations
        self.batch_integral = 0.0  # decode batch x time
        self.run_prefill: list[int] = []
        self.steps: list[tuple[int, int]] | None = [] if hasattr(perf, "record_decode_steps") else None  # measured: (batch, context)


@dataclass
class SimResult:
    """Per-request arrays (seconds; NaN for requests that could not be served) and
    per-instance counters."""

    trace: Trace
    ttft_s: np.ndarray
    e2e_s: np.ndarray
    tbt_max_s: np.ndarray
    prompt_queue_s: np.ndarray
    transfer_s: np.ndarray
    decode_queue_s: np.ndarray
    prompt_instance: np.ndarray
    token_instance: np.ndarray
    rejected: np.ndarray  # bool: KV never fits the assigned token instance
    tokens_out: int
    span_s: float
    instances: list = field(default_factory=list)  # (pool index, role, prefill_s, decode_s, batch_integral)
    events: int = 0
    names: list = field(default_factory=list)  # instance index -> "role:hardware:tpN:k"
    preemptions: int = 0  # co-located decodes preempted for KV memory and recomputed

    @property
    def tpot_s(self) -> np.ndarray:
        """TPOT as vLLM's benchmark_serving defines it: (E2E - TTFT) / (output tokens - 1);
        NaN for one-token answers."""
        o = self.trace.output_tokens.astype(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(o > 1, (self.e2e_s - self.ttft_s) / (o - 1), np.nan)

    @property
    def tbt_s(self) -> np.ndarray:
        """Splitwise's per-request TBT: (E2E - TTFT) / output tokens."""
        return (self.e2e_s - self.ttft_s) / self.trace.output_tokens


def simulate(trace: Trace, pools: list[PoolSpec], options: SimOptions = SimOptions()) -> SimResult:
    n = len(trace)
    closed = options.concurrency
    if closed is not None and closed < 1:
        raise ValueError("concurrency must be >= 1")
    # closed loop: the first `closed` requests start at once; each later one when a client frees
    arrival = trace.arrival_s.tolist() if closed is None else [0.0] * min(closed, n) + [math.inf] * max(n - closed, 0)
    released = min(closed or n, n)  # requests whose arrival time is known
    p = trace.prompt_tokens.tolist()
    o = trace.output_tokens.tolist()
    insts: list[_Inst] = []
    nic = {}
    for k, pool in enumerate(pools):
        hw = pool.perf.hardware
        share = hw.scale_out_bytes_per_s * pool.perf.tp / hw.gpus_per_machine
        for _ in range(pool.instances):
            insts.append(_Inst(len(insts), k, pool.role, pool.perf, share))
        nic[k] = share
    prompt_side = [i for i in insts if i.role in (PROMPT, MIXED)]
    token_side = [i for i in insts if i.role in (TOKEN, MIXED)]
    if not prompt_side or not token_side:
        raise ValueError("a cluster needs prompt and token instances, or mixed ones")
    single = {k: pool.perf.prefill_time_s(trace.prompt_tokens).tolist() for k, pool in enumerate(pools)}
    lines: dict[int, dict[int, tuple]] = {k: {} for k in range(len(pools))}  # decode steps per batch size
    model = pools[0].perf.model
    kv_bytes = model.kv_bytes_per_token(pools[0].perf.engine.bytes_per_element)
    layers = model.num_hidden_layers
    max_tokens = options.max_batch_tokens
    chunked = {k: pool.perf.engine.chunked_prefill_tokens for k, pool in enumerate(pools)}
    done = [0] * n  # prompt tokens prefilled so far (chunked prefill)
    plen = list(p)  # tokens to prefill: the prompt, or prompt and output so far when preempted
    base = [1] * n  # tokens the request had when it (last) joined a decode batch
    resumed = [False] * n  # preempted and to be recomputed: its next prefill gives no TTFT
    stall = [0.0] * n  # longest wait from a preemption to the next token
    preempted_at = [0.0] * n
    rejoined = [np.nan] * n  # when a preempted request last rejoined its decode batch
    preemptions = 0

    ttft = [np.nan] * n
    e2e = [np.nan] * n
    prefill_start = [0.0] * n
    kv_ready = [np.nan] * n
    join_time = [np.nan] * n
    join_iter = [-1] * n
    p_inst = [-1] * n
    t_inst = [-1] * n
    rejected = [False] * n
    heap: list = []
    seq = 0
    tokens_out = 0
    rr = [0, 0]
    events = 0

    def push(time, kind, a, b=None):
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (time, seq, kind, a, b))

    # Loads for join-shortest-queue, kept in lists so the choice is two C-level passes.
    prompt_load = [0] * len(prompt_side)  # queued prompt tokens
    token_load = [0] * len(token_side)  # output tokens assigned and not finished
    p_pos = {inst.idx: k for k, inst in enumerate(prompt_side)}
    t_pos = {inst.idx: k for k, inst in enumerate(token_side)}

    def unassign(inst: _Inst, i: int):
        """Request i no longer holds a decode place on inst (finished or rejected)."""
        inst.kv_committed -= p[i] + o[i]
        if inst.idx in t_pos:
            token_load[t_pos[inst.idx]] -= o[i]

    def pick(loads, which):
        if options.routing == "round-robin":
            rr[which] += 1
            return (rr[which] - 1) % len(loads)
        return loads.index(min(loads))

    def long_queue(inst: _Inst, i: int) -> bool:
        return bool(inst.queue) and prompt_load[p_pos[inst.idx]] + p[i] > options.borrow_threshold_tokens

    def mixed_pool_prompt(i: int) -> _Inst:
        """Join-shortest-queue among the prompt machines not lent to decoding; a lent one
        (holding KV of borrowed decodes) only when every other queue is long."""
        own = [x for x in prompt_side if not x.kv_committed]
        best = min(own, key=lambda x: prompt_load[p_pos[x.idx]]) if own else None
        if best is None or long_queue(best, i):
            lent = [x for x in prompt_side if x.kv_committed]
            other = min(lent, key=lambda x: prompt_load[p_pos[x.idx]]) if lent else None
            if other is not None and (best is None or not long_queue(other, i)):
                best = other
        return best

    def lend_prompt(need: int) -> _Inst | None:
        """The prompt machine to decode a request the token machines have no room for:
        one already lent with room (the fullest that fits, keeping the others whole),
        else the one with the fewest pending prompt tokens; None when none fits."""
        lent = [x for x in prompt_side if x.kv_committed and x.kv_committed + need <= x.kv_cap]
        if lent:
            return max(lent, key=lambda x: x.kv_committed)
        fresh = [x for x in prompt_side if not x.kv_committed and need <= x.kv_cap]
        return min(fresh, key=lambda x: prompt_load[p_pos[x.idx]]) if fresh else None

    def release_client(now):
        """Closed loop: a client is free again and sends the next request now."""
        nonlocal released
        if closed is not None and released < n:
            arrival[released] = now
            released += 1

    def finish(i, now):
        nonlocal tokens_out
        e2e[i] = now - arrival[i]
        tokens_out += o[i]
        release_client(now)

    def start(inst: _Inst, now: float):
        """Begin the instance's next iteration, if it has work."""
        if inst.role == MIXED:
            while inst.batch > 1 and inst.kv_used + inst.ctx + inst.batch > inst.kv_cap:
                preempt(inst, now)
        prefill = []  # requests whose prefill ends with this iteration
        chunks = 0  # prompts (whole or in part) in it
        budget = chunked[inst.pool]
        if inst.can_prefill and inst.queue:
            total = sq = 0
            if budget is None:  # whole prompts, batched up to max_tokens
                while inst.queue and (not prefill or total + plen[inst.queue[0]] <= max_tokens):
                    i = inst.queue.popleft()
                    prefill.append(i)
                    total += plen[i]
                    sq += plen[i] * plen[i]
                    if not resumed[i]:
                        prefill_start[i] = now
                chunks = len(prefill)
            else:  # chunked: the decodes first, then prompt tokens up to the budget
                room = budget - inst.batch
                while inst.queue and room > 0:
                    i = inst.queue[0]
                    d = done[i]
                    if d == 0 and not resumed[i]:
                        prefill_start[i] = now
                    c = min(plen[i] - d, room)
                    total += c
                    sq += (d + c) * (d + c) - d * d  # causal attention of c new tokens over d + c
                    done[i] = d + c
                    room -= c
                    chunks += 1
                    if done[i] < plen[i]:
                        break
                    inst.queue.popleft()
                    prefill.append(i)
        if chunks:
            if budget is None and chunks == 1 and inst.batch == 0 and not resumed[prefill[0]]:
                duration = single[inst.pool][prefill[0]]
            else:
                duration = float(inst.perf.pass_time_s(float(chunks), float(total), float(sq),
                                                       float(inst.batch), float(inst.ctx)))
            inst.prefill_s += duration
        elif inst.batch:
            line = lines[inst.pool].get(inst.batch)
            if line is None:
                line = lines[inst.pool][inst.batch] = inst.perf.decode_line(inst.batch)
            attention = inst.ctx * line[1]
            duration = line[0] + attention + (line[2] - attention if line[2] > attention else 0.0)
            inst.decode_s += duration
            if inst.steps is not None:
                inst.steps.append((inst.batch, inst.ctx))
        else:
            inst.running = False
            return
        inst.batch_integral += inst.batch * duration
        inst.run_prefill = prefill
        inst.running = True
        push(now + duration, 3, inst.idx)

    def admit(inst: _Inst, now: float):
        """Take waiting requests, in order, while their KV fits.
        A token instance reserves a request's whole KV (prompt + output tokens) once it has
        arrived: it joins the decode batch. A co-located instance allocates KV as engines
        with paged KV do: a request is admitted, to its prompt queue, when its prompt (plus
        its first token) fits beside what the admitted and decoding requests hold now; the
        batch's growth is met by preempting (see `preempt`)."""
        mixed = inst.role == MIXED
        while inst.waiting:
            i = inst.waiting[0]
            need = p[i] + o[i]
            if need > inst.kv_cap:  # can never fit: report, do not block the queue
                inst.waiting.popleft()
                rejected[i] = True
                if mixed:
                    prompt_load[p_pos[inst.idx]] -= p[i]
                unassign(inst, i)
                release_client(now)
                continue
            if mixed:
                need = plen[i] + 1
                if inst.kv_used + inst.ctx + need > inst.kv_cap:
                    break
                inst.waiting.popleft()
                inst.kv_used += plen[i]
                inst.queue.append(i)
                continue
            if inst.kv_used + need > inst.kv_cap:
                break
            inst.waiting.popleft()
            inst.kv_used += need
            join(inst, i, now)

    def join(inst: _Inst, i: int, now: float):
        """Request i (its KV held on inst) joins the decode batch at this iteration boundary."""
        inst.batch += 1
        inst.ctx += p[i] + base[i]
        if resumed[i]:
            rejoined[i] = now
        else:
            join_time[i] = now
        join_iter[i] = inst.iters
        inst.finishing.setdefault(inst.iters + o[i] - base[i], []).append(i)
        if inst.role == MIXED:
            inst.members.append(i)

    def preempt(inst: _Inst, now: float):
        """A co-located instance whose KV cannot hold one more token per decoding request
        preempts the newest one, as vLLM does by default: its KV is freed and it waits at the
        head of the queue to be recomputed (prompt and output so far prefilled again), then
        decodes on."""
        nonlocal preemptions
        v = inst.members.pop()
        have = base[v] + inst.iters - join_iter[v]
        inst.finishing[join_iter[v] + o[v] - base[v]].remove(v)
        inst.batch -= 1
        inst.ctx -= p[v] + have
        plen[v], base[v], done[v] = p[v] + have, have, 0
        resumed[v] = True
        preempted_at[v] = now
        preemptions += 1
        prompt_load[p_pos[inst.idx]] += plen[v]
        inst.waiting.appendleft(v)

    def prefill_done(inst: _Inst, i: int, now: float):
        if resumed[i]:  # recomputed after a preemption: its next token comes now
            stall[i] = max(stall[i], now - preempted_at[i])
            inst.kv_used -= plen[i]
            base[i] += 1
            if base[i] == o[i]:  # that was its last token
                finish(i, now)
                unassign(inst, i)
            else:
                join(inst, i, now)
            resumed[i] = False
            return
        ttft[i] = now - arrival[i]
        if o[i] == 1:  # the first token was the whole answer
            finish(i, now)
            unassign(insts[t_inst[i]], i)
            return
        tok = insts[t_inst[i]]
        if tok is inst:  # co-located: decode here, its KV held since admission
            kv_ready[i] = now
            inst.kv_used -= plen[i]  # now counted in the batch's context
            join(inst, i, now)
            return
        bw = min(inst.bw, tok.bw)
        duration = p[i] * kv_bytes / bw
        latency = inst.perf.factors.kv_transfer_latency_s
        busy_until = max(inst.link_free, tok.link_free)  # both NICs carry the transfer
        if p[i] < inst.perf.engine.layerwise_transfer_min_tokens:
            begin = max(now, busy_until)
            done = begin + duration + latency
        else:
            begin = max(prefill_start[i], busy_until)
            done = max(begin + duration, now + duration / layers) + latency
        inst.link_free = tok.link_free = begin + duration
        push(done, 2, tok.idx, i)

    next_arrival = 0
    while next_arrival < n or heap:
        if next_arrival < n and (not heap or arrival[next_arrival] < heap[0][0]):
            i = next_arrival
            now = arrival[i]
            next_arrival += 1
            events += 1
            if options.borrow_threshold_tokens is None or prompt_side[0].role == MIXED:
                src = prompt_side[pick(prompt_load, 0)]
            else:
                src = mixed_pool_prompt(i)
            if src.role == MIXED:
                dst = src
            else:
                dst = token_side[pick(token_load, 1)]
                if options.borrow_threshold_tokens is not None:
                    need = p[i] + o[i]
                    if dst.kv_committed + need > dst.kv_cap:  # short of KV memory: the token machine with most room,
                        dst = max(token_side, key=lambda x: x.kv_cap - x.kv_committed)
                        if dst.kv_committed + need > dst.kv_cap:  # else decode it on a prompt machine
                            dst = lend_prompt(need) or dst
                    if dst.role == TOKEN and long_queue(src, i):
                        src = dst  # every prompt machine's queue is long: borrow the token machine to prefill it
                        src.can_prefill = True
            p_inst[i], t_inst[i] = src.idx, dst.idx
            if src.idx in p_pos:
                prompt_load[p_pos[src.idx]] += p[i]
            dst.kv_committed += p[i] + o[i]
            if dst.idx in t_pos:
                token_load[t_pos[dst.idx]] += o[i]
            if src.role == MIXED:  # prefilled once its KV is reserved
                src.waiting.append(i)
                admit(src, now)
            else:
                src.queue.append(i)
            if not src.running:
                start(src, now)
            continue
        now, _, kind, a, b = heapq.heappop(heap)
        events += 1
        if kind == 2:  # KV arrived at token instance a for request b
            inst = insts[a]
            kv_ready[b] = now
            inst.waiting.append(b)
            if not inst.running:
                admit(inst, now)
                start(inst, now)
            continue
        inst = insts[a]  # kind 3: iteration over
        if inst.batch:  # every decoding request got one more token
            inst.iters += 1
            inst.ends.append(now)
            inst.ctx += inst.batch
            for i in inst.finishing.pop(inst.iters, ()):
                if inst.role == MIXED:
                    inst.members.remove(i)
                else:
                    inst.kv_used -= p[i] + o[i]
                inst.batch -= 1
                inst.ctx -= p[i] + o[i]
                unassign(inst, i)
                finish(i, now)
        k = p_pos.get(inst.idx)
        for i in inst.run_prefill:
            if k is not None:  # a prompt stays pending on its machine until its prefill completes
                prompt_load[k] -= plen[i]
            prefill_done(inst, i, now)
        if inst.role == TOKEN and not inst.queue:
            inst.can_prefill = False  # a borrowed machine returns to its pool
        admit(inst, now)
        start(inst, now)

    for inst in insts:  # a measured table counts the decode steps it extrapolated
        if inst.steps:
            batch, context = np.array(inst.steps, float).T
            inst.perf.record_decode_steps(batch, context)
    if closed is not None:  # the arrival times the clients produced
        trace = dataclasses.replace(trace, arrival_s=np.array(arrival), source=f"{trace.source} (closed loop, {closed} clients)")
    first_token = np.array(arrival) + np.array(ttft)
    stint = np.where(np.array(base) > 1, np.array(rejoined), first_token)  # a resumed request: from its rejoining
    tbt_max = _tbt_max(insts, np.array(o) - np.array(base) + 1, t_inst, join_iter, stint)
    tbt_max = np.where(np.array(stall) > 0, np.fmax(tbt_max, np.array(stall)), tbt_max)
    done = trace.arrival_s + np.array(e2e)
    span = float(np.nanmax(done) - arrival[0]) if tokens_out else 0.0
    return SimResult(
        trace, np.array(ttft), np.array(e2e), tbt_max, np.array(prefill_start) - trace.arrival_s,
        np.array(kv_ready) - (trace.arrival_s + np.array(ttft)), np.array(join_time) - np.array(kv_ready),
        np.array(p_inst), np.array(t_inst), np.array(rejected), tokens_out, span,
        [(x.pool, x.role, x.prefill_s, x.decode_s, x.batch_integral) for x in insts], events,
        [f"{x.role}:{x.perf.hardware.name}:tp{x.perf.tp}:{x.idx}" for x in insts], preemptions,
    )


def _tbt_max(insts, o, t_inst, join_iter, first_token) -> np.ndarray:
    """Longest gap between consecutive tokens of each request's last decode stint: from
    `first_token` (its first token, or its rejoining after a preemption) to the end of
    its first iteration, then each iteration it spent in; `o` counts the stint's tokens
    from that first one."""
    n = len(o)
    out = np.full(n, np.nan)
    o_arr = np.asarray(o)
    ji = np.asarray(join_iter)
    ti = np.asarray(t_inst)
    out[o_arr == 1] = 0.0
    for inst in insts:
        if not inst.ends:
            continue
        ends = np.asarray(inst.ends)
        starts_ = np.concatenate([[np.nan], ends[:-1]])
        durations = ends - starts_  # iteration k spans (ends[k-1], ends[k]]; k=0 has no start
        mine = np.flatnonzero((ti == inst.idx) & (ji >= 0) & (o_arr > 1))
        if not len(mine):
            continue
        first_end = ends[ji[mine]]
        gap0 = first_end - first_token[mine]
        # later gaps: iterations join+1 .. join+o-2 (the request's own iterations)
        lo, hi = ji[mine] + 1, ji[mine] + o_arr[mine] - 1
        table = _sparse_max(np.nan_to_num(durations, nan=0.0))
        out[mine] = np.maximum(gap0, _range_max(table, lo, hi))
    return out


def _sparse_max(values: np.ndarray) -> list[np.ndarray]:
    table = [values]
    k = 1
    while 2 * k <= len(values):
        prev = table[-1]
        table.append(np.maximum(prev[:-k], prev[k:]))
        k *= 2
    return table


def _range_max(table: list[np.ndarray], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo:hi]) per pair (0 for empty ranges)."""
    length = hi - lo
    out = np.zeros(len(lo))
    ok = length > 0
    if not ok.any():
        return out
    level = np.floor(np.log2(np.maximum(length[ok], 1))).astype(int)
    width = 1 << level
    a = np.array([table[k][s] for k, s in zip(level, lo[ok])])
    b = np.array([table[k][e - w] for k, e, w in zip(level, hi[ok], width)])
    out[ok] = np.maximum(a, b)
    return out
