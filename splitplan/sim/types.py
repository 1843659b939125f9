"""The simulator's data: pool specs, options, the events of a run and its result."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from splitplan.base.defaults import MAX_BATCH_TOKENS
from splitplan.perf.model import PerfModel
from splitplan.specs.roles import Role
from splitplan.workload.trace import Trace

PROMPT, TOKEN, MIXED = Role.PROMPT, Role.TOKEN, Role.MIXED


class Event(IntEnum):
    """What happens in a run. Arrivals come from the trace (or freed clients); the other
    two from the event heap, keyed (time, sequence number)."""

    ARRIVAL = 1  # a request arrives and is routed
    KV_ARRIVED = 2  # a request's KV reached its token instance
    ITERATION_END = 3  # an instance finished an iteration
    PREFIX_LOADED = 4  # a request's cached prefix came back from host memory (--kv-offload-gb)


@dataclass(frozen=True)
class PoolSpec:
    """A pool (`roles.Pool`) as the simulator runs it: `machines` machines of one type holding
    whole instances timed by `perf` (several per machine, or one over several machines)."""

    role: Role  # (a role's text, "prompt", is taken as its Role)
    perf: PerfModel  # Instance or MeasuredInstance
    machines: int
    instances_given: int | None = None  # instances, when fewer than the machines hold (the planner sizing a pool)
    # Machines shared with the pool(s) of the other role of the same `shared` number: each of the
    # `machines` holds instances / machines of this pool's instances beside theirs, and KV between
    # instances on one machine moves over its GPU links, not the NICs.
    shared: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", Role(self.role))

    @property
    def instances(self) -> int:
        return self.perf.instances_on(self.machines) if self.instances_given is None else self.instances_given


@dataclass(frozen=True)
class SimOptions:
    max_batch_tokens: int = MAX_BATCH_TOKENS  # the scheduler's token budget (engine max_num_batched_tokens)
    routing: str = "jsq"  # or "round-robin", or "prefix-aware" (with prefix_caching)
    borrow_threshold_tokens: int | None = None
    # Closed loop (as vLLM benchmark_serving, genai-perf and aiconfigurator measure): this many
    # clients, each sending its next request when its previous one finishes; the trace gives the
    # requests' sizes in order and its timestamps are ignored. None: open loop, the trace's times.
    concurrency: int | None = None
    record_events: bool = False  # keep every event (time, Event, instance, request) in SimResult.event_log
    # The engine's max_model_len: a longer request (prompt + output tokens) is refused at arrival,
    # counted as rejected. vLLM and SGLang default it to the model's context window, as
    # simulation.simulate does (the planner leaves such requests out by the same rule); None: no limit.
    max_model_len: int | None = None
    # The engine's max_num_seqs: at most this many requests run on an instance at once (decoding,
    # or admitted to prefill on a co-located one; prompts in one prefill iteration); the rest wait.
    max_num_seqs: int | None = None
    # Closed loop: the first this many requests sent are a warm-up, run but left out of every
    # statistic (as genai-perf's and AIPerf's --warmup-request-count), so the burst of every
    # client starting at once does not set the tail. simulation.simulate sends one per client.
    warmup_requests: int = 0
    # A prefix cache per prefilling instance (sim.prefix_cache), where the trace records shared
    # prefixes (Trace.prefix): the engine's automatic prefix caching.
    prefix_caching: bool = False
    # With prefix caching, each prefilling instance also keeps prefixes in this much host memory (GB),
    # written through and loaded back over its GPUs' host links (hardware gpu.host_link_gbyte_per_s).
    kv_offload_gb: float = 0.0
    # SimResult.itl_s, every gap between tokens (8 bytes a token); off where only means are read
    # (sim.deployments' replays): itl_s is then None.
    inter_token_gaps: bool = True
    # SimResult.passes: every iteration as it ran (sim.deployments shares a replay's across a fit).
    record_passes: bool = False


class InstanceState:
    """One model instance during a run: what it is, and what the run leaves of it (its decode
    iterations' end times and count, its batch, context and KV at the end, its time by kind)."""

    __slots__ = ("idx", "pool", "role", "perf", "node", "kv_used", "batch", "ctx", "ends", "prefill_s",
                 "decode_s", "batch_integral")

    def __init__(self, idx, pool, role, perf, node=None):
        self.idx, self.pool, self.role, self.perf = idx, pool, role, perf
        self.node = node  # (shared number, machine) on machines shared with the other role, else None
        self.kv_used = 0  # token: KV reserved whole; mixed: KV of the admitted requests not yet decoding
        self.batch = 0
        self.ctx = 0
        self.ends = array("d")  # end time of each decode iteration (8 bytes each: runs reach millions)
        self.prefill_s = 0.0  # time in iterations that hold a prefill
        self.decode_s = 0.0  # time in decode-only iterations
        self.batch_integral = 0.0  # decode batch x time


@dataclass(frozen=True)
class InstanceStats:
    """One instance's time in a run (seconds)."""

    pool: int  # index into the run's pools
    role: Role
    prefill_s: float  # busy in iterations that carried prompt tokens
    decode_s: float  # busy in decode-only iterations
    batch_integral: float  # decode batch size integrated over busy time (request-seconds)
    prefix_hit_tokens: int = 0  # prompt tokens its prefix cache held when their prefill began
    prefix_lookup_tokens: int = 0  # prompt tokens of the prefills it looked up (0: no cache)
    prefix_loaded_tokens: int = 0  # of the hit tokens, those loaded from host memory (--kv-offload-gb)


@dataclass
class SimResult:
    """Per-request arrays (seconds; NaN for requests that could not be served) and
    per-instance counters."""

    trace: Trace
    ttft_s: np.ndarray
    e2e_s: np.ndarray
    tbt_max_s: np.ndarray
    prompt_queue_s: np.ndarray  # from reaching the engine (the API front end passed) to the prefill's start
    transfer_s: np.ndarray
    decode_queue_s: np.ndarray
    prompt_instance: np.ndarray
    token_instance: np.ndarray
    rejected: np.ndarray  # bool: KV never fits the assigned token instance
    tokens_out: int
    span_s: float
    instances: list[InstanceStats] = field(default_factory=list)
    events: int = 0
    names: list = field(default_factory=list)  # instance index -> "role:hardware:tpN:k"
    preemptions: int = 0  # co-located decodes preempted for KV memory and recomputed
    event_log: list | None = None  # with SimOptions.record_events: (time, Event, instance, request) in order
    refused: np.ndarray | None = None  # bool: longer than SimOptions.max_model_len, refused at arrival (also rejected)
    itl_s: np.ndarray | None = None  # every gap between consecutive tokens of every request (inter-token latency)
    warmup: np.ndarray | None = None  # bool: a closed loop's warm-up requests, left out of the statistics
    # With SimOptions.record_passes, per iteration in the order they began (of every instance):
    # prompt sequences, prompt tokens, their squares' sum (pass_time_s's arguments), decode batch,
    # its summed context, iterations (1: the column lets a reader merge a stretch of them into one
    # row, the context that of the first: sim.deployments), end time of the last.
    passes: np.ndarray | None = None

    @property
    def gaps_s(self) -> np.ndarray:
        """`itl_s`, which the reports read: a run that did not record the gaps cannot be reported."""
        if self.itl_s is None:
            raise ValueError("this run did not record its inter-token gaps (SimOptions.inter_token_gaps)")
        return self.itl_s

    @property
    def measured(self) -> np.ndarray:
        """The requests the statistics cover: those served, past the warm-up."""
        return self.served & ~self.warmup if self.warmup is not None else self.served

    @property
    def served(self) -> np.ndarray:
        """The requests the engine takes: all but those over its max_model_len (the SLO's population)."""
        return ~self.refused if self.refused is not None else np.ones(len(self.trace), bool)

    @property
    def tpot_s(self) -> np.ndarray:
        """TPOT as vLLM's benchmark_serving defines it: (E2E - TTFT) / (output tokens - 1);
        NaN for one-token answers."""
        return self._tpot_s(self.ttft_s)

    @property
    def client_ttft_s(self) -> np.ndarray:
        """TTFT as a benchmark client measures it: on split pools the first token reaches the
        client from the decode worker (vLLM's P/D proxy and Dynamo, SGLang's router, TensorRT-LLM's
        disaggregated server all stream the answer from it), so it comes with the KV transfer and
        the wait for the token instance to admit the request (`ttft_s`, Splitwise's, stamps it
        at the prefill's end); where one instance prefilled and decodes a request (co-located, or
        Splitwise's borrowing) the two are one. vLLM's decode worker computes that token in its
        first iteration, one step later still: not modelled."""
        later = np.where(self.prompt_instance != self.token_instance, self.transfer_s + self.decode_queue_s, 0.0)
        return np.where(np.isfinite(later), self.ttft_s + later, self.ttft_s)  # (a one-token answer ends at its prefill)

    @property
    def client_tpot_s(self) -> np.ndarray:
        """TPOT from `client_ttft_s`: what a benchmark client reports."""
        return self._tpot_s(self.client_ttft_s)

    def _tpot_s(self, ttft_s: np.ndarray) -> np.ndarray:
        o = self.trace.output_tokens.astype(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(o > 1, (self.e2e_s - ttft_s) / (o - 1), np.nan)

    @property
    def tbt_s(self) -> np.ndarray:
        """Splitwise's per-request TBT: (E2E - TTFT) / output tokens."""
        return (self.e2e_s - self.ttft_s) / self.trace.output_tokens
