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

The run is compiled (splitplan_core.run, every rule above); `tests/sim/python_loop.py` states the
same rules in Python, event by event, the oracle the tests hold the compiled run to, to the bit.
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from typing import cast

import numpy as np

from splitplan.base import limits
from splitplan.base.core import core
from splitplan.base.errors import SpecError
from splitplan.perf.roofline import Instance, local_kv_bytes_per_s
from splitplan.perf.table import MeasuredInstance, core_vectors
from splitplan.sim import gaps
from splitplan.sim.prefix_cache import CacheState, PrefixModel
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


class _Cluster:
    """One simulation run: the cluster's instances and settings, run by the compiled core, and the
    result read back from its state."""

    instance_type = InstanceState  # (the tests' Python loop keeps more per instance)

    def __init__(self, trace: Trace, pools: list[PoolSpec], options: SimOptions):
        self.trace, self.pools, self.options = trace, pools, options
        self.log: list | None = None  # with options.record_events, the run's
        self.passes: np.ndarray | list | None = None  # with options.record_passes, the run's
        self.n = len(self.trace)
        self.closed = self.options.concurrency
        if self.closed is not None and self.closed < 1:
            raise ValueError("concurrency must be >= 1")
        self._arrivals()
        self.prompt_tokens = self.trace.prompt_tokens.tolist()
        self.output_tokens = self.trace.output_tokens.tolist()
        self.insts: list[InstanceState] = []
        self.max_iterations = limits.MAX_SIM_ITERATIONS  # decode iterations of every instance, at most
        self._place_instances()
        self.model = self.pools[0].perf.model
        self.context = self.options.max_model_len  # a longer request is refused at arrival (None: no limit)
        self.kv_bytes = self.model.kv_bytes_per_token(self.pools[0].perf.engine.kv_bytes_per_element)
        self.layers = self.model.num_hidden_layers
        self.max_tokens = self.options.max_batch_tokens
        self._pool_tables()
        # prompt tokens prefilled so far: a prefix the engine's cache holds counts as done
        self.cached = [0] * self.n if trace.cached_tokens is None else np.minimum(trace.cached_tokens, trace.prompt_tokens - 1).tolist()
        # the engine's prefix cache, per instance (where the trace records prefixes): a prefilling one
        # skips what it holds (with --kv-offload-gb, also what its host memory holds, loaded back
        # first); a token instance receives only the KV it does not hold
        self.caching = bool(options.prefix_caching and trace.prefix is not None)
        self.caches: dict[int, CacheState] = {}  # (after the run)
        if self.caching:
            self._prefix_caches(trace.prefix)
        self.front = self.pools[0].perf.engine.frontend_latency_s  # a request reaches the engine this long after it is sent
        self.events = 0

    def _arrivals(self) -> None:
        """Arrival times: the trace's, or in a closed loop, the first `closed` requests at once and
        each later one when a client frees (unknown until then)."""
        closed = self.closed
        if closed is None:
            self.arrival = self.trace.arrival_s.tolist()
        else:
            self.arrival = [0.0] * min(closed, self.n) + [math.inf] * max(self.n - closed, 0)

    def _place_instances(self) -> None:
        """Every pool's instances, numbered in pool order (a shared pool's on its shared machines),
        those that prefill and those that decode."""
        for k, pool in enumerate(self.pools):
            per_machine = -(-pool.instances // pool.machines)
            for j in range(pool.instances):
                node = None if pool.shared is None else (pool.shared, j // per_machine)
                self.insts.append(self.instance_type(len(self.insts), k, pool.role, pool.perf, node))
        self.prompt_side = [i for i in self.insts if i.role in (PROMPT, MIXED)]
        self.token_side = [i for i in self.insts if i.role in (TOKEN, MIXED)]
        if not self.prompt_side or not self.token_side:
            raise ValueError("a cluster needs prompt and token instances, or mixed ones")
        self.p_pos = {inst.idx: k for k, inst in enumerate(self.prompt_side)}
        self.t_pos = {inst.idx: k for k, inst in enumerate(self.token_side)}

    def _pool_tables(self) -> None:
        """Per pool: each prompt's time alone, the chunked token budget (None: whole prompts), whether
        the engine schedules asynchronously."""
        self.single = {k: np.asarray(pool.perf.prefill_time_s(self.trace.prompt_tokens)).tolist() for k, pool in enumerate(self.pools)}
        self.chunked = {k: self.max_tokens if pool.perf.engine.chunked else None for k, pool in enumerate(self.pools)}
        self.deferring = {k: pool.perf.engine.async_scheduling for k, pool in enumerate(self.pools)}

    def _prefix_caches(self, tree) -> None:
        """The engine's prefix caches (one per instance: host tiers on those that prefill), over the trace's prefix tree."""
        self.prefix = PrefixModel(tree, self.pools[0].perf.engine.kv_block_tokens, self.options.kv_offload_gb)
        self.node = tree.request_node.tolist()

    def run(self) -> SimResult:
        """The run, by the compiled core (splitplan_core.run): this run's instances and pools as its
        arrays, its state back into this run's, then the result."""
        perfs = [cast(Instance, pool.perf) for pool in self.pools]
        prompt, out = self.trace.prompt_tokens.astype(np.int64), self.trace.output_tokens.astype(np.int64)
        req, times, inst = self._core_state(prompt)
        arrival = np.asarray(self.arrival, float)
        lines = self._decode_lines(perfs, prompt)
        tables = self._measured_tables(perfs, prompt + out, lines.shape[1])
        status, clock, counters, ends_s, ends_at, log_s, log_at, caches, passes, counts = core.run(
            arrival, float(self.front), prompt, out, req, times, inst, *self._core_pools(perfs, tables), self._core_settings(),
            float(self.kv_bytes), core_vectors(perfs), lines, np.array([self.single[k] for k in range(len(perfs))], float), tables[0],
            self.prefix.arrays() if self.caching else None)
        self.arrival = arrival  # (a closed loop's: the times the clients sent each request)
        if status == core.TOO_MANY_ITERATIONS:
            raise self._too_many_iterations()
        lost = int(np.count_nonzero(np.isnan(times[core.E2E]) & (req[core.REJECTED] == 0)))
        if status != core.OK or lost:  # (every request finishes or is rejected: none may vanish from the statistics)
            raise RuntimeError(f"the compiled run stopped (status {status}, {lost} requests neither finished nor "
                               "rejected): a bug, please report it")
        self._take_compiled(req, times, inst, clock, counters, ends_s, ends_at)
        self._take_records(perfs, caches, counts, log_s, log_at)
        if self.options.record_passes:
            self.passes = passes
        return self._result()

    def _core_state(self, prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The core's state before any event (splitplan_core.initial_state): per request and per instance."""
        machines = {node: m for m, node in enumerate(dict.fromkeys(x.node for x in self.insts if x.node is not None))}
        return core.initial_state(prompt, self.cached, self.node if self.caching else -1, [str(x.role) for x in self.insts],
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
        size = max(self.max_tokens, int(request_tokens.max(initial=0))) + lines + 1 if any(p.measured for p in perfs) else 0
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
        host = [self.prefix.host_tier(perf) if self.caching and pool.role != TOKEN else (0.0, 0.0)  # (a prefilling pool's host tier)
                for pool, perf in zip(self.pools, perfs, strict=True)]
        pools_s = np.array([[perf.kv_link_bytes_per_s, perf.factors.kv_transfer_latency_s, *host[k], *tables[1][k]]
                            for k, perf in enumerate(perfs)])
        return pools, pools_s, np.array([[local_kv_bytes_per_s(a, b) for b in perfs] for a in perfs])

    def _core_settings(self) -> np.ndarray:
        """The core's run-wide settings (MAX_BATCH_TOKENS ... BORROW)."""
        caching = self.caching
        return np.array([self.max_tokens, self._cap(), self.max_iterations, self.context or 0, self.layers,
                         self.options.routing == "round-robin", self.closed or 0, self.options.record_events, caching,
                         self.prefix.block_tokens if caching else 1, self.options.routing == "prefix-aware" and caching,
                         self.options.record_passes, -1 if (borrow := self.options.borrow_threshold_tokens) is None else borrow], np.int64)

    def _take_records(self, perfs: list[Instance], caches: list, counts: np.ndarray, log_s: np.ndarray, log_at: np.ndarray) -> None:
        """The compiled run's caches, measured tables' lookups and event log as this run's."""
        self.caches = {k: CacheState.from_core(*state) for k, state in enumerate(caches)}
        for perf, (prefill, prefill_out, decode, decode_out) in zip(perfs, counts.tolist(), strict=True):
            if perf.measured:  # (a measured table counts its lookups, and those it extrapolated)
                table = cast(MeasuredInstance, perf)
                table.counted("prefill", prefill, prefill_out)
                table.counted("decode", decode, decode_out)
        if self.options.record_events:
            self.log = [(t, Event(kind), k, None if i < 0 else i) for t, (kind, k, i) in zip(log_s.tolist(), log_at.tolist(), strict=True)]

    def _take_compiled(self, req, times, inst, clock, counters, ends_s, ends_at) -> None:
        """The compiled run's state as this run's: per request, per instance, the counters."""
        self.ttft, self.e2e, self.stall, self.rejoined = times[core.TTFT], times[core.E2E], times[core.STALL], times[core.REJOINED]
        self.prefill_start, self.kv_ready, self.join_time = times[core.PREFILL_START], times[core.KV_READY], times[core.JOIN_TIME]
        self.base, self.join_iter, self.p_inst, self.t_inst = req[core.BASE], req[core.JOIN_ITER], req[core.P_INST], req[core.T_INST]
        self.rejected, self.refused = req[core.REJECTED] > 0, req[core.REFUSED] > 0
        self.tokens_out, self.preemptions = int(counters[core.TOKENS_OUT]), int(counters[core.PREEMPTIONS])
        self.events = int(counters[core.EVENTS])
        small = np.uint16 if len(self.insts) <= np.iinfo(np.uint16).max else np.int64  # (NumPy radix-sorts 16-bit keys)
        order = np.argsort(ends_at.astype(small), kind="stable")
        bounds = np.searchsorted(ends_at[order], np.arange(len(self.insts) + 1))
        for k, x in enumerate(self.insts):
            x.ends = array("d", ends_s[order[bounds[k]:bounds[k + 1]]].tobytes())
            x.batch, x.ctx, x.kv_used = (int(v) for v in inst[k, [core.BATCH, core.CTX, core.KV_USED]])
            x.prefill_s, x.decode_s, x.batch_integral = (float(v) for v in clock[k, [core.PREFILL_S, core.DECODE_S, core.INTEGRAL]])

    def _too_many_iterations(self) -> SpecError:
        return SpecError(f"the simulation passed {self.max_iterations:,} decode iterations (one a token of "
                         "the requests decoding at once): simulate fewer requests (--max-requests, "
                         "--num-requests) or shorter outputs (--osl)")

    def _result(self) -> SimResult:
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
