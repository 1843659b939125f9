# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""splitplan's engine core, compiled when the package is built (Cython, by `pip install .`):
the pass formula, the prompt pools' FCFS replay, the simulator's compiled run and two helpers of
the decode fixed point. Nothing here compiles at run time.

Each function is the Python rule it stands in for, statement for statement and in the same order
of operations, so its floats equal the Python's to the bit (property tests run both):
- `pass_terms` and its kin: `perf.roofline.Instance._terms` (an instance's constants travel as
  one float64 vector, `FIELDS` names its entries, `Instance.pass_vector` packs it);
- `prompt_replay`: `capacity.pools.replay_prompts` without prefix caches on analytic instances;
- `run`: `sim.cluster`'s event loop on analytic instances, open or closed, shared machines and
  its event log included, without prefix caches, borrowing or recorded passes (that module's
  docstring states the rules);
- `ranks` and `running_peak`: NumPy's searchsorted and a running sum's peak, by cheaper routes.

Events come from one binary heap (`Heap`, apart from the models) keyed (time, then a second key:
a sequence number, or an instance), popped in the order Python's heapq pops the same tuples.
"""

from libc.math cimport INFINITY, pow
from libc.stdint cimport INT64_MAX, int64_t
from libc.stdlib cimport free, malloc, realloc

import numpy as np

cdef extern from *:
    # the SHA-256 of this file when it was compiled (setup.py defines it): a checkout's test
    # compares it with the source, so a core built from an older text is caught
    const char* SPLITPLAN_CORE_SHA256

SOURCE_SHA256 = SPLITPLAN_CORE_SHA256.decode()


# ---- the event heap ------------------------------------------------------------------------------

cdef struct Entry:
    double t  # the time (or, routing, the load)
    int64_t key  # ties: a sequence number, or an instance
    int64_t kind
    int64_t k
    int64_t i


cdef struct Heap:
    Entry* items
    Py_ssize_t size
    Py_ssize_t capacity


cdef inline bint _before(Entry* x, Entry* y) noexcept nogil:
    return x.t < y.t or (x.t == y.t and x.key < y.key)


cdef int heap_init(Heap* h, Py_ssize_t capacity) except -1:
    h.size, h.capacity = 0, max(capacity, 16)
    h.items = <Entry*> malloc(h.capacity * sizeof(Entry))
    if h.items == NULL:
        raise MemoryError()
    return 0


cdef void heap_free(Heap* h) noexcept:
    free(h.items)
    h.items = NULL


cdef int heap_push(Heap* h, double t, int64_t key, int64_t kind, int64_t k, int64_t i) except -1:
    cdef Entry* grown
    cdef Py_ssize_t pos = h.size, parent
    if h.size == h.capacity:
        grown = <Entry*> realloc(h.items, 2 * h.capacity * sizeof(Entry))
        if grown == NULL:
            raise MemoryError()
        h.items, h.capacity = grown, 2 * h.capacity
    cdef Entry e
    e.t, e.key, e.kind, e.k, e.i = t, key, kind, k, i
    while pos > 0:
        parent = (pos - 1) >> 1
        if not _before(&e, &h.items[parent]):
            break
        h.items[pos] = h.items[parent]
        pos = parent
    h.items[pos] = e
    h.size += 1
    return 0


cdef Entry heap_pop(Heap* h) noexcept:
    cdef Entry top = h.items[0], last
    cdef Py_ssize_t pos = 0, child
    h.size -= 1
    if h.size:
        last = h.items[h.size]
        while True:
            child = 2 * pos + 1
            if child >= h.size:
                break
            if child + 1 < h.size and _before(&h.items[child + 1], &h.items[child]):
                child += 1
            if not _before(&h.items[child], &last):
                break
            h.items[pos] = h.items[child]
            pos = child
        h.items[pos] = last
    return top


# ---- the pass formula ----------------------------------------------------------------------------

FIELDS = (
    "layers_per_stage", "act_bytes_per_element", "weight_bytes_per_element", "peak_flops_per_s", "gemm_peak_flops_per_s",
    "memory_bytes_per_s", "compute_efficiency", "gemm_half_tokens", "dense_flops_per_token", "dense_weight_bytes",
    "activation_bytes_per_token", "q_dim_per_gpu", "kv_dim_per_gpu", "prefill_attention_flops_per_sq_token",
    "decode_flops_per_context_token", "decode_bytes_per_context_token", "routed_expert_share", "lm_head_params",
    "collective_s_per_token", "collective_latency_s", "all_to_all_s_per_token", "all_to_all_latency_s",
    "hop_s_per_token", "hop_latency_s", "dp", "pp", "divides_pass", "gpu_launch_s", "host_launch_s",
    "packed_attention", "clock_slowdown", "capped_clock_slowdown",
    # measured kernel curves (perf.curves), or their roofline defaults (the same bandwidth, no extra time)
    "gemm_bytes_per_s", "gemm_pass_s_per_token", "gemm_latency_s", "prefill_attention_half_tokens",
    "prefill_attention_latency_s", "kv_bytes_per_s", "decode_attention_efficiency", "decode_attention_s_per_seq",
    "decode_attention_latency_s",
    # the engine's factors and the model's experts the formula reads
    "knee_slowdown", "knee_tokens", "moe_efficiency", "attention_efficiency", "decode_overhead_s", "prefill_overhead_s",
    "sequence_overhead_s", "prefill_sequence_overhead_s", "is_moe", "experts", "experts_per_token", "expert_params",
)

cdef enum:  # FIELDS' order
    LAYERS_PER_STAGE, ACT_BPE, WEIGHT_BPE, PEAK, GEMM_PEAK, MEMORY_BPS, COMPUTE_EFF, GEMM_HALF, DENSE_FLOPS, DENSE_BYTES,
    ACT_BYTES, Q_DIM, KV_DIM, PREFILL_ATTN_FLOPS, DECODE_FLOPS, DECODE_BYTES, EXPERT_SHARE, LM_HEAD, COLL_S_PER_TOKEN,
    COLL_LATENCY, A2A_S_PER_TOKEN, A2A_LATENCY, HOP_S_PER_TOKEN, HOP_LATENCY, DP, PP, DIVIDES, GPU_LAUNCH, HOST_LAUNCH,
    PACKED, CLOCK_SLOWDOWN, CAPPED_SLOWDOWN, GEMM_BPS, GEMM_PASS_S, GEMM_LATENCY, PREFILL_ATTN_HALF, PREFILL_ATTN_LATENCY,
    KV_BPS, DECODE_ATTN_EFF, DECODE_ATTN_S_PER_SEQ, DECODE_ATTN_LATENCY, KNEE_SLOWDOWN, KNEE_TOKENS, MOE_EFF, ATTN_EFF,
    DECODE_OVERHEAD, PREFILL_OVERHEAD, SEQ_OVERHEAD, PREFILL_SEQ_OVERHEAD, IS_MOE, EXPERTS, TOP_K, EXPERT_PARAMS,
    FIELD_COUNT

assert len(FIELDS) == FIELD_COUNT


cdef struct Terms:
    double compute_s
    double memory_s
    double network_s
    double overhead_s
    double flops
    double nbytes


cdef inline void _shares(const double* c, double prefill_seqs, double decode_seqs, double has_prefill,
                         double* micro, double* groups) noexcept nogil:
    """The share of a pass one pipeline micro-batch carries and over how many attention groups its
    requests spread (`Instance._shares`)."""
    cdef double pp = c[PP], dp = c[DP]
    micro[0] = 1.0 if pp == 1 else 1.0 / (pp - (pp - min(max(decode_seqs, 1.0), pp)) * (1 - has_prefill))
    groups[0] = 1.0 if dp == 1 else min(dp, max((prefill_seqs + decode_seqs) * micro[0], 1.0))


cdef inline double _gemm_efficiency(const double* c, double rows) noexcept nogil:
    return c[COMPUTE_EFF] * rows / (rows + c[GEMM_HALF])


cdef Terms _terms(const double* c, double prefill_seqs, double prefill_tokens, double prefill_sq_tokens,
                  double decode_seqs, double decode_context_tokens) noexcept nogil:
    """(compute_s, memory_s, network_s, overhead_s, flops, bytes) of one pass (`Instance._terms`)."""
    cdef double layers = c[LAYERS_PER_STAGE], peak = c[PEAK]
    cdef double has_prefill = 1.0 if prefill_tokens > 0 else 0.0
    cdef double micro, groups, stages
    if c[DIVIDES] > 0:
        _shares(c, prefill_seqs, decode_seqs, has_prefill, &micro, &groups)
        stages = c[PP] + (c[PP] - 1) * has_prefill
    else:
        micro = groups = stages = 1.0
    cdef double pre_tok = prefill_tokens * micro
    cdef double n_tok = pre_tok + decode_seqs * micro
    cdef double a_tok = n_tok / groups
    cdef double n_seq = (prefill_seqs + decode_seqs) * micro / groups

    cdef double safe_tok = max(a_tok, 1.0)
    cdef double knee = 1.0 + c[KNEE_SLOWDOWN] * max(safe_tok - c[KNEE_TOKENS], 0.0) / safe_tok if c[KNEE_SLOWDOWN] else 1.0
    cdef double gemm_peak = c[GEMM_PEAK]
    cdef double compute_s = 0.0, memory_s = 0.0, flops = 0.0, nbytes = 0.0
    cdef double bandwidth, fixed_s, extra_s, class_flops, class_bytes, class_peak, tc, tm
    cdef double experts, top_k, touched, rows, group_pre, pre_sq, ctx, group_decode
    cdef int k
    for k in range(5):  # operator classes: dense GEMMs, routed experts, prefill attention, decode attention, LM head
        # beside the roofline: fixed_s (kernel latency, per sequence) and extra_s (compute-side: activation passes, ramp)
        bandwidth, fixed_s, extra_s = c[GEMM_BPS], 0.0, 0.0
        if k == 0:
            class_flops, class_bytes = a_tok * c[DENSE_FLOPS], c[DENSE_BYTES] + a_tok * c[ACT_BYTES]
            class_peak = gemm_peak * _gemm_efficiency(c, safe_tok)
            fixed_s, extra_s = c[GEMM_LATENCY], a_tok * c[GEMM_PASS_S]
        elif k == 1:
            if not c[IS_MOE]:
                continue
            experts, top_k = c[EXPERTS], c[TOP_K]
            touched = experts * (1 - pow(1 - top_k / experts, n_tok))
            rows = max(n_tok * top_k / max(touched, 1e-9), 1.0)
            class_flops = 2 * n_tok * top_k * c[EXPERT_PARAMS] * c[EXPERT_SHARE]
            class_bytes = touched * c[EXPERT_PARAMS] * c[WEIGHT_BPE] * c[EXPERT_SHARE]
            class_peak = gemm_peak * _gemm_efficiency(c, rows) * c[MOE_EFF]
        elif k == 2:
            group_pre = pre_tok / groups
            pre_sq = group_pre * group_pre if c[PACKED] else prefill_sq_tokens * micro / groups
            class_flops = pre_sq * c[PREFILL_ATTN_FLOPS]
            class_bytes = group_pre * (2 * c[Q_DIM] + 2 * c[KV_DIM]) * c[ACT_BPE]
            class_peak, bandwidth = peak * c[ATTN_EFF], c[MEMORY_BPS]
            fixed_s = c[PREFILL_ATTN_LATENCY] * has_prefill
            extra_s = c[PREFILL_ATTN_HALF] * group_pre * c[PREFILL_ATTN_FLOPS] / class_peak  # the ramp over short prompts
        elif k == 3:
            ctx = decode_context_tokens * micro / groups
            class_flops, class_bytes, class_peak = ctx * c[DECODE_FLOPS], ctx * c[DECODE_BYTES], peak * c[DECODE_ATTN_EFF]
            bandwidth = c[KV_BPS]
            group_decode = decode_seqs * micro / groups
            fixed_s = c[DECODE_ATTN_S_PER_SEQ] * group_decode + c[DECODE_ATTN_LATENCY] * (1.0 if group_decode > 0 else 0.0)
        else:  # one row per sequence (the last prompt token, or the decoded token)
            class_flops, class_bytes = 2 * n_seq * c[LM_HEAD] / layers, c[LM_HEAD] * c[WEIGHT_BPE] / layers
            class_peak = gemm_peak * _gemm_efficiency(c, max(n_seq, 1.0))
        tc = layers * class_flops / class_peak + layers * (fixed_s + extra_s)
        tm = layers * class_bytes / bandwidth + layers * fixed_s
        compute_s = compute_s + tc * (tc > tm)
        memory_s = memory_s + tm * (tc <= tm)
        flops = flops + layers * class_flops
        nbytes = nbytes + layers * class_bytes
    cdef double network_s = 2 * layers * (a_tok * c[COLL_S_PER_TOKEN] * knee + c[COLL_LATENCY])
    if c[DIVIDES] > 0:  # expert all-to-alls (the busiest group sends) and pipeline hops
        network_s = (network_s + layers * (n_tok * c[A2A_S_PER_TOKEN] * c[DP] / groups + c[A2A_LATENCY])
                     + n_tok * c[HOP_S_PER_TOKEN] + c[HOP_LATENCY])
    cdef double gpu_s = compute_s + memory_s + network_s + c[GPU_LAUNCH]
    cdef double overhead_s = (
        c[DECODE_OVERHEAD] + (c[PREFILL_OVERHEAD] - c[DECODE_OVERHEAD]) * has_prefill
        + c[SEQ_OVERHEAD] * n_seq / micro
        + c[PREFILL_SEQ_OVERHEAD] * prefill_seqs / groups
        + c[GPU_LAUNCH] * stages
        + max(c[HOST_LAUNCH] - gpu_s, 0.0) * stages
    )
    compute_s = compute_s * (1.0 + (c[CLOCK_SLOWDOWN] - 1.0) * has_prefill)
    cdef double capped = 1.0 + (c[CAPPED_SLOWDOWN] - 1.0) * has_prefill
    memory_s, network_s = memory_s * capped, network_s * capped
    cdef Terms out
    out.compute_s, out.memory_s, out.network_s = compute_s * stages, memory_s * stages, network_s * stages
    out.overhead_s, out.flops, out.nbytes = overhead_s, flops / micro, nbytes / micro
    return out


cdef inline double _pass_time_s(const double* c, double prefill_seqs, double prefill_tokens, double prefill_sq_tokens,
                                double decode_seqs, double decode_context_tokens) noexcept nogil:
    cdef Terms t = _terms(c, prefill_seqs, prefill_tokens, prefill_sq_tokens, decode_seqs, decode_context_tokens)
    return t.compute_s + t.memory_s + t.network_s + t.overhead_s


cdef int _check_width(Py_ssize_t entries) except -1:
    """A pass vector holds FIELD_COUNT entries: any other width is refused (the formula would read past it)."""
    if entries != FIELD_COUNT:
        raise ValueError(f"a pass vector has {FIELD_COUNT} entries (FIELDS), not {entries}")
    return 0


cdef const double* _vector(const double[::1] c) except NULL:
    _check_width(c.shape[0])
    return &c[0]


cdef inline Py_ssize_t _least(const int64_t[:] load) noexcept:
    """The index of the least load, the lowest among equals (as np.argmin)."""
    cdef Py_ssize_t j, best = 0
    for j in range(1, load.shape[0]):
        if load[j] < load[best]:
            best = j
    return best


def pass_shares(const double[::1] c, double prefill_seqs, double decode_seqs, double has_prefill):
    """(micro, groups): the share of a pass one pipeline micro-batch carries and over how many
    attention groups its requests spread (`Instance._shares`)."""
    cdef double micro, groups
    _shares(_vector(c), prefill_seqs, decode_seqs, has_prefill, &micro, &groups)
    return micro, groups


def pass_terms(const double[::1] c, double prefill_seqs, double prefill_tokens, double prefill_sq_tokens,
               double decode_seqs, double decode_context_tokens):
    """(compute_s, memory_s, network_s, overhead_s, flops, bytes) of one pass (`Instance._terms`)."""
    cdef Terms t = _terms(_vector(c), prefill_seqs, prefill_tokens, prefill_sq_tokens, decode_seqs, decode_context_tokens)
    return t.compute_s, t.memory_s, t.network_s, t.overhead_s, t.flops, t.nbytes


def pass_time_s(const double[::1] c, double prefill_seqs, double prefill_tokens, double prefill_sq_tokens,
                double decode_seqs, double decode_context_tokens):
    """Seconds of one pass (the sum of `pass_terms`' four times)."""
    return _pass_time_s(_vector(c), prefill_seqs, prefill_tokens, prefill_sq_tokens, decode_seqs, decode_context_tokens)


def pass_terms_array(const double[::1] c, const double[:] prefill_seqs, const double[:] prefill_tokens,
                     const double[:] prefill_sq_tokens, const double[:] decode_seqs, const double[:] decode_context_tokens):
    """`pass_terms` of each element of five float64 arrays of one length: a (6, n) array."""
    cdef const double* v = _vector(c)
    cdef Py_ssize_t n = prefill_seqs.shape[0], i
    out = np.empty((6, n))
    cdef double[:, ::1] o = out
    cdef Terms t
    for i in range(n):
        t = _terms(v, prefill_seqs[i], prefill_tokens[i], prefill_sq_tokens[i], decode_seqs[i], decode_context_tokens[i])
        o[0, i], o[1, i], o[2, i], o[3, i], o[4, i], o[5, i] = (t.compute_s, t.memory_s, t.network_s, t.overhead_s,
                                                                t.flops, t.nbytes)
    return out


def pass_shares_array(const double[::1] c, const double[:] prefill_seqs, const double[:] decode_seqs, double has_prefill):
    """`pass_shares` of each element of two float64 arrays of one length: a (2, n) array."""
    cdef const double* v = _vector(c)
    cdef Py_ssize_t n = decode_seqs.shape[0], i
    out = np.empty((2, n))
    cdef double[:, ::1] o = out
    for i in range(n):
        _shares(v, prefill_seqs[i], decode_seqs[i], has_prefill, &o[0, i], &o[1, i])
    return out


# ---- the prompt pools' replay --------------------------------------------------------------------

cdef class _PromptReplay:
    """`prompt_replay`'s state. Per instance the queue is a linked list over the requests
    (`after`): a pass is the run of requests it took from the queue's head, so `run_first` and
    `run_count` name its members."""
    cdef const int64_t[:] tokens
    cdef const double[:, ::1] vectors
    cdef const int64_t[:] kind
    cdef const double[:, :] decode
    cdef int64_t max_batch_tokens, cap
    cdef bint chunked, deferring
    cdef double[:] finish_s
    cdef int64_t[:] load, first, last, after, done, tag
    # running, its first request, its requests, the prompt tokens it completes, passes begun (async
    # scheduling), whether the next pass was scheduled when the running one began
    cdef int64_t[:] running, run_first, run_count, run_whole, launch, fixed
    cdef double[:, ::1] busy
    cdef Py_ssize_t written
    cdef bint routing_heap
    cdef Heap ends  # (time, instance): a pass ends
    cdef Heap least  # (load, instance): routing past heap_past instances

    def __dealloc__(self):
        heap_free(&self.ends)
        heap_free(&self.least)

    cdef Py_ssize_t least_loaded(self) noexcept:
        """The instance of least load, the lowest index among equals (a scan, or the heap's top
        once stale entries are dropped)."""
        if not self.routing_heap:
            return _least(self.load)
        while self.least.items[0].t != self.load[self.least.items[0].key]:
            heap_pop(&self.least)
        return self.least.items[0].key

    cdef int add_load(self, Py_ssize_t j, int64_t tokens) except -1:
        """Instance j's load changes by `tokens` (and the routing heap, when there is one, learns it)."""
        self.load[j] += tokens
        if self.routing_heap:
            heap_push(&self.least, <double> self.load[j], j, 0, 0, 0)
        return 0

    cdef void take(self, Py_ssize_t j, int64_t* out) noexcept:
        """The next pass on instance j from its queue's head: (prompts it completes, prompts or
        chunks in it, its prompt tokens, their squares' sum as attention counts them, the completed
        prompts' tokens). Whole prompts up to the budget (at least one), or, `chunked`, the budget's
        tokens from the head, the last prompt split (`done` counts what earlier chunks prefilled:
        without prefix caches nothing else is); async scheduling holds back requests queued after
        the running pass's successor was scheduled."""
        cdef int64_t count = 0, seqs = 0, total = 0, sq = 0, whole = 0, room = self.max_batch_tokens, size, d, c
        cdef int64_t r = self.first[j]
        while r >= 0:
            size = self.tokens[r]
            if self.chunked:
                d = self.done[r]
                if room <= 0 or seqs >= self.cap or self.tag[r] >= self.launch[j]:
                    break
                c = min(size - d, room)
                total += c
                sq += (d + c) * (d + c) - d * d  # causal attention of c new tokens over d + c
                self.done[r] = d + c
                room -= c
                seqs += 1
                if d + c < size:
                    break
            else:
                if count and (self.tag[r] >= self.launch[j] or total + size > self.max_batch_tokens or count >= self.cap):
                    break
                total += size
                sq += size * size
                seqs += 1
            count += 1
            whole += size
            r = self.after[r]
        out[0], out[1], out[2], out[3], out[4] = count, seqs, total, sq, whole

    cdef int start(self, Py_ssize_t j, double now) except -1:
        """Instance j (idle, its queue not empty) begins its next pass at `now`."""
        cdef int64_t r
        cdef int64_t taken[5]
        if self.deferring and self.tag[self.first[j]] >= self.launch[j]:  # nothing was scheduled after all: all join now
            r = self.first[j]
            while r >= 0:
                self.tag[r] = -1
                r = self.after[r]
        self.take(j, taken)
        self.run_first[j], self.run_count[j], self.run_whole[j] = self.first[j], taken[0], taken[4]
        cdef int64_t m
        for m in range(taken[0]):
            self.first[j] = self.after[self.first[j]]
        if self.first[j] < 0:
            self.last[j] = -1
        cdef int64_t k = self.kind[j]
        cdef double duration = _pass_time_s(&self.vectors[k, 0], <double> taken[1], <double> taken[2], <double> taken[3],
                                            self.decode[k, 0], self.decode[k, 1])
        self.running[j] = 1
        if self.deferring:
            self.launch[j] += 1
            self.fixed[j] = self.first[j] >= 0
        self.busy[self.written, 0], self.busy[self.written, 1], self.busy[self.written, 2] = now, duration, j
        self.written += 1
        heap_push(&self.ends, now + duration, j, 0, 0, 0)
        return 0

    cdef int end_passes(self, double now) except -1:
        """Every pass that ends by `now` (one ending at an arrival's time before it is routed): its
        completed prompts get their first token, and its instance starts its next pass."""
        cdef Entry e
        cdef Py_ssize_t j
        cdef int64_t r, m
        while self.ends.size and self.ends.items[0].t <= now:
            e = heap_pop(&self.ends)
            j = e.key
            r = self.run_first[j]
            for m in range(self.run_count[j]):
                self.finish_s[r] = e.t
                r = self.after[r]
            self.add_load(j, -self.run_whole[j])
            self.running[j] = 0
            if self.first[j] >= 0:
                self.start(j, e.t)
        return 0


def prompt_replay(const double[:] arrival_s, const int64_t[:] tokens, const double[:, ::1] vectors, const int64_t[:] kind,
                  const double[:, :] decode, int64_t max_batch_tokens, bint chunked, int64_t cap, bint deferring,
                  const double[:] release_s, Py_ssize_t heap_past):
    """(each request's prefill end, the passes as (start, duration, instance) rows, each request's
    instance). Requests are routed at arrival to the instance of fewest pending prompt tokens (ties
    to the lowest index; from a heap past `heap_past` instances, as `sim.routing.LeastLoaded`), FCFS
    per instance in whole-prompt batches or, `chunked`, passes of the token budget; the engine's
    `max_num_seqs` (`cap`), its async scheduling (`deferring`) and the co-located estimate's held
    requests (`release_s`: empty, or when each request stops counting 1 in its instance's load).
    `vectors[k]` and `decode[k]` (decode requests and their context riding along in every pass) are
    instance type k's, `kind[j]` instance j's type."""
    _check_width(vectors.shape[1])
    cdef Py_ssize_t n_req = arrival_s.shape[0], n_inst = kind.shape[0], i, j
    cdef _PromptReplay s = _PromptReplay()
    s.tokens, s.vectors, s.kind, s.decode = tokens, vectors, kind, decode
    s.max_batch_tokens, s.chunked, s.cap, s.deferring = max_batch_tokens, chunked, cap, deferring
    finish_s, placed = np.zeros(n_req), np.zeros(n_req, np.int64)
    s.finish_s = finish_s
    cdef int64_t[:] where = placed
    s.load = np.zeros(n_inst, np.int64)  # pending prompt tokens (+ held requests)
    s.first, s.last, s.after = np.full(n_inst, -1), np.full(n_inst, -1), np.full(n_req, -1)
    s.running, s.run_first, s.run_count = np.zeros(n_inst, np.int64), np.zeros(n_inst, np.int64), np.zeros(n_inst, np.int64)
    s.run_whole, s.launch, s.fixed = np.zeros(n_inst, np.int64), np.zeros(n_inst, np.int64), np.zeros(n_inst, np.int64)
    # (chunked) prefilled so far, the pass a request arrived in when its successor was scheduled
    s.done, s.tag = np.zeros(n_req, np.int64), np.full(n_req, -1)
    # passes: at most one per prompt completed plus one per budget of tokens and one partial per prompt
    busy = np.zeros((2 * n_req + int(np.sum(tokens)) // max(max_batch_tokens, 1) + 1, 3))
    s.busy = busy
    heap_init(&s.ends, n_inst)
    heap_init(&s.least, n_inst)
    s.routing_heap = n_inst > heap_past
    if s.routing_heap:
        for j in range(n_inst):
            heap_push(&s.least, 0.0, j, 0, 0, 0)
    cdef Heap held  # (release time, instance) of requests counted in their instance's load
    heap_init(&held, 16)
    cdef bint any_held = release_s.shape[0] > 0
    cdef double now
    try:
        for i in range(n_req):
            now = arrival_s[i]
            if s.ends.size and s.ends.items[0].t <= now:
                s.end_passes(now)
            while held.size and held.items[0].t <= now:
                s.add_load(heap_pop(&held).key, -1)
            j = 0 if n_inst == 1 else s.least_loaded()
            if s.last[j] >= 0:  # queued on j
                s.after[s.last[j]] = i
            else:
                s.first[j] = i
            s.last[j] = i
            if deferring:
                s.tag[i] = s.launch[j] if s.running[j] and s.fixed[j] else s.launch[j] - 1
            s.add_load(j, tokens[i] + any_held)
            if any_held:
                heap_push(&held, release_s[i], j, 0, 0, 0)
            where[i] = j
            if not s.running[j]:
                s.start(j, now)
        s.end_passes(INFINITY)
    finally:
        heap_free(&held)
    return finish_s, busy[:s.written], placed


# ---- the decode fixed point's helpers ------------------------------------------------------------

def ranks(const double[:] sorted_values, const double[:] queries, const int64_t[:] order, bint right):
    """np.searchsorted(sorted_values, queries, side="right" if right else "left"): for each query,
    how many values lie below it (or at it, `right`), by one merge over the queries in ascending
    `order` rather than a binary search each (the decode fixed point counts the requests open at
    every request's midpoint this way)."""
    out = np.empty(queries.shape[0], np.int64)
    cdef int64_t[:] o = out
    cdef Py_ssize_t k = 0, n = sorted_values.shape[0], a, i
    cdef double x
    for a in range(order.shape[0]):
        i = order[a]
        x = queries[i]
        while k < n and (sorted_values[k] <= x if right else sorted_values[k] < x):
            k += 1
        o[i] = k
    return out


def running_peak(const double[:] times, const double[:] weights, int64_t[:] order):
    """The largest running sum of `weights` taken in time order, equal times by weight and then
    position, as np.max(np.cumsum(weights[np.lexsort((weights, times))])) gives it (the same
    additions in the same order): `order` sorts `times` (any order among equal times; reordered)."""
    cdef Py_ssize_t n = order.shape[0], i = 0, j, a, b
    cdef int64_t k
    while i < n:  # each run of equal times, by (weight, position)
        j = i + 1
        while j < n and times[order[j]] == times[order[i]]:
            j += 1
        for a in range(i + 1, j):  # (an insertion sort: runs are short)
            k, b = order[a], a
            while b > i and (weights[order[b - 1]] > weights[k] or (weights[order[b - 1]] == weights[k] and order[b - 1] > k)):
                order[b] = order[b - 1]
                b -= 1
            order[b] = k
        i = j
    cdef double total = 0.0, peak = -INFINITY
    for a in range(n):
        total += weights[order[a]]
        peak = max(peak, total)
    return peak


# ---- the simulator's run -------------------------------------------------------------------------
# State: per request (`req`, `times`: rows named below) and per instance (`inst`, `clock`). An
# instance's prompt queue, its requests waiting for KV room, those deferred by async scheduling and
# those its running pass prefills are linked lists over the requests (`NEXT`; a request is in one
# at most), its decode batch a doubly linked list in join order (`PREV`, `AFTER`). Decode-only
# iterations run one by one (the Python loop computes stretches of them at once, with the same sums
# in the same order), so `EVENTS` counts every iteration end.

cpdef enum:  # per-request integer rows
    NEXT, PREV, AFTER, FINISH_ITER, DEFERRED_AT, PLEN, BASE, DONE, RESUMED, JOIN_ITER, P_INST, T_INST, REJECTED, REFUSED,
    CACHED, REQUEST_ROWS

cpdef enum:  # per-request float rows
    TTFT, E2E, STALL, PREEMPTED_AT, REJOINED, PREFILL_START, KV_READY, JOIN_TIME, TIME_ROWS

cpdef enum:  # per-instance integer columns: four lists (head, tail, length), then the rest
    QUEUE = 0
    WAITING = 3
    DEFERRED = 6
    RUN = 9
    MEMBERS_HEAD = 12
    MEMBERS_TAIL, BATCH, CTX, KV_USED, ITERS, RUNNING, FIXED, LAUNCH, NEXT_FINISH, ROLE, POOL, P_POS, T_POS,
    NODE, INSTANCE_COLUMNS

cpdef enum:  # per-instance float columns
    PREFILL_S, DECODE_S, INTEGRAL, LINK_FREE

cpdef enum:  # per-pool integer settings, and float ones
    KV_CAP, MAX_REQUEST, CHUNKED, DEFERRING, LAYERWISE_MIN

cpdef enum:
    LINK_BPS, KV_LATENCY_S

cpdef enum:  # run-wide integer settings (CLOSED: a closed loop's clients, 0 for an open loop; LOG: keep the event log)
    MAX_BATCH_TOKENS, CAP, MAX_ITERATIONS, CONTEXT, LAYERS, ROUND_ROBIN, CLOSED, LOG, SETTINGS

cpdef enum:  # (RELEASED: requests whose arrival time is known; LOGGED: events in the log)
    ITERATIONS, TOKENS_OUT, PREEMPTIONS, EVENTS, ENDS, SEQ, TURN_P, TURN_T, RELEASED, LOGGED, COUNTERS

cpdef enum:  # in ROLES' order
    PROMPT, TOKEN, MIXED

ROLES = ("prompt", "token", "mixed")

cpdef enum:
    OK, TOO_MANY_ITERATIONS, BATCH_PAST_TABLE

cdef enum:  # how an instance is settled after an event (_Run.settle)
    START, ADMIT_THEN_START, AFTER_ITERATION

cpdef enum:  # what an event is (sim.types.Event's values; a heap entry's kind: ties go by sequence number, so this never orders)
    ARRIVAL = 1
    KV_ARRIVED = 2
    ITERATION_END = 3


def initial_state(prompt, cached, roles, pool, p_pos, t_pos, node):
    """(req, times, inst) for `run` before any event: per request (its prompt tokens, those a cache
    holds), per instance (role names, pool index, position among those that prefill and those that
    decode, -1 for none, and the machine it shares with the other role's instances, -1 for none)."""
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
    inst[:, POOL], inst[:, P_POS], inst[:, T_POS], inst[:, NODE] = pool, p_pos, t_pos, node
    return req, times, inst


cdef class _Run:
    cdef double[:] arrival  # (a closed loop writes each request's when a client sends it)
    cdef const int64_t[:] prompt, out
    cdef int64_t[:, :] req, inst, pools
    cdef double[:, :] times, clock
    cdef const double[:, :] pools_s, single, local_bps
    cdef const double[:, :, :] lines
    cdef const double[:, ::1] vectors
    cdef const int64_t[:] settings
    cdef double kv_bytes
    cdef int64_t[:] p_load, t_load, prompt_side, token_side, counters
    cdef double[:] ends_s
    cdef int64_t[:] ends_at
    cdef double[:] log_s
    cdef int64_t[:, :] log_at  # per event: its kind, instance and request (-1: none)
    cdef Heap heap

    def __dealloc__(self):
        heap_free(&self.heap)

    # -- the lists

    cdef inline void push(self, Py_ssize_t k, int lst, int64_t i) noexcept:
        self.req[NEXT, i] = -1
        if self.inst[k, lst + 1] < 0:
            self.inst[k, lst] = i
        else:
            self.req[NEXT, self.inst[k, lst + 1]] = i
        self.inst[k, lst + 1] = i
        self.inst[k, lst + 2] += 1

    cdef inline void push_front(self, Py_ssize_t k, int lst, int64_t i) noexcept:
        self.req[NEXT, i] = self.inst[k, lst]
        self.inst[k, lst] = i
        if self.inst[k, lst + 1] < 0:
            self.inst[k, lst + 1] = i
        self.inst[k, lst + 2] += 1

    cdef inline int64_t pop(self, Py_ssize_t k, int lst) noexcept:
        cdef int64_t i = self.inst[k, lst]
        self.inst[k, lst] = self.req[NEXT, i]
        if self.inst[k, lst] < 0:
            self.inst[k, lst + 1] = -1
        self.inst[k, lst + 2] -= 1
        return i

    cdef inline void unlink(self, Py_ssize_t k, int64_t i) noexcept:
        """Request i leaves instance k's decode batch (co-located instances keep it in join order)."""
        cdef int64_t before = self.req[PREV, i], after = self.req[AFTER, i]
        if before < 0:
            self.inst[k, MEMBERS_HEAD] = after
        else:
            self.req[AFTER, before] = after
        if after < 0:
            self.inst[k, MEMBERS_TAIL] = before
        else:
            self.req[PREV, after] = before

    # -- the rules

    cdef void join(self, Py_ssize_t k, int64_t i, double now) noexcept:
        """Request i (its KV held on k) joins the decode batch at this iteration boundary."""
        self.inst[k, BATCH] += 1
        self.inst[k, CTX] += self.prompt[i] + self.req[BASE, i]
        if self.req[RESUMED, i]:
            self.times[REJOINED, i] = now
        else:
            self.times[JOIN_TIME, i] = now
        self.req[JOIN_ITER, i] = self.inst[k, ITERS]
        self.req[FINISH_ITER, i] = self.inst[k, ITERS] + self.out[i] - self.req[BASE, i]
        self.inst[k, NEXT_FINISH] = min(self.inst[k, NEXT_FINISH], self.req[FINISH_ITER, i])
        cdef int64_t tail = self.inst[k, MEMBERS_TAIL]
        self.req[PREV, i], self.req[AFTER, i] = tail, -1
        if tail < 0:
            self.inst[k, MEMBERS_HEAD] = i
        else:
            self.req[AFTER, tail] = i
        self.inst[k, MEMBERS_TAIL] = i

    cdef inline void finish(self, int64_t i, double now) noexcept:
        self.times[E2E, i] = now - self.arrival[i]
        self.counters[TOKENS_OUT] += self.out[i]
        self.release_client(now)

    cdef inline void release_client(self, double now) noexcept:
        """A closed loop: a client is free again and sends the next request now."""
        if self.settings[CLOSED] and self.counters[RELEASED] < self.arrival.shape[0]:
            self.arrival[self.counters[RELEASED]] = now
            self.counters[RELEASED] += 1

    cdef inline void unassign(self, Py_ssize_t k, int64_t i) noexcept:
        """Request i no longer holds a decode place on k (finished or rejected)."""
        if self.inst[k, ROLE] == MIXED:
            self.p_load[self.inst[k, P_POS]] -= 1
        if self.inst[k, T_POS] >= 0:
            self.t_load[self.inst[k, T_POS]] -= self.out[i]

    cdef void preempt(self, Py_ssize_t k, double now) noexcept:
        """The newest decode is preempted (its KV freed) and waits at the head of the line to be
        recomputed, its prompt and output so far, then decodes on."""
        cdef int64_t v = self.inst[k, MEMBERS_TAIL]
        self.unlink(k, v)
        cdef int64_t have = self.req[BASE, v] + self.inst[k, ITERS] - self.req[JOIN_ITER, v]
        self.inst[k, BATCH] -= 1
        self.inst[k, CTX] -= self.prompt[v] + have
        self.req[PLEN, v], self.req[BASE, v], self.req[DONE, v] = self.prompt[v] + have, have, 0
        self.req[RESUMED, v] = 1
        self.times[PREEMPTED_AT, v] = now
        self.counters[PREEMPTIONS] += 1
        self.p_load[self.inst[k, P_POS]] += self.req[PLEN, v]
        self.push_front(k, WAITING, v)

    cdef void admit(self, Py_ssize_t k, double now) noexcept:
        """Waiting requests, in order, while their KV fits: a token instance reserves a request's
        whole KV and it joins the batch; a co-located one admits it to its prompt queue when its
        prompt (and first token) fits beside what is held. One that can never fit is rejected."""
        cdef bint mixed = self.inst[k, ROLE] == MIXED
        cdef int64_t kv_cap = self.pools[self.inst[k, POOL], KV_CAP], max_request = self.pools[self.inst[k, POOL], MAX_REQUEST]
        cdef int64_t cap = self.settings[CAP], i, need
        while self.inst[k, WAITING + 2]:
            i = self.inst[k, WAITING]
            need = self.prompt[i] + self.out[i]
            if need > max_request:
                self.pop(k, WAITING)
                self.req[REJECTED, i] = 1
                if mixed:
                    self.p_load[self.inst[k, P_POS]] -= self.prompt[i]
                self.unassign(k, i)
                self.release_client(now)
                continue
            if mixed:
                if (self.inst[k, KV_USED] + self.inst[k, CTX] + self.req[PLEN, i] + 1 > kv_cap
                        or self.inst[k, BATCH] + self.inst[k, QUEUE + 2] + self.inst[k, RUN + 2] >= cap):
                    break
                self.pop(k, WAITING)
                self.inst[k, KV_USED] += self.req[PLEN, i]
                self.push(k, QUEUE, i)
                continue
            if self.inst[k, KV_USED] + need > kv_cap or self.inst[k, BATCH] >= cap:
                break
            self.pop(k, WAITING)
            self.inst[k, KV_USED] += need
            self.join(k, i, now)

    cdef void release(self, Py_ssize_t k, int64_t before) noexcept:
        """Requests deferred by async scheduling that arrived in an iteration before `before` join
        the line they were headed for: a co-located or token instance's wait for KV room, a prompt
        instance's queue."""
        cdef int line = QUEUE if self.inst[k, ROLE] == PROMPT else WAITING
        while self.inst[k, DEFERRED + 2] and self.req[DEFERRED_AT, self.inst[k, DEFERRED]] < before:
            self.push(k, line, self.pop(k, DEFERRED))

    cdef void whole_prompts(self, Py_ssize_t k, double now, int64_t* taken) noexcept:
        """(prompts, tokens, squared tokens) of a whole-prompt pass: prompts from the queue's head
        up to the budget, at least one."""
        cdef int64_t count = 0, total = 0, sq = 0, h, i, d
        cdef int64_t max_batch_tokens = self.settings[MAX_BATCH_TOKENS], cap = self.settings[CAP]
        while self.inst[k, QUEUE + 2]:
            h = self.inst[k, QUEUE]
            if count and (total + self.req[PLEN, h] - self.req[DONE, h] > max_batch_tokens or count >= cap):
                break
            i = self.pop(k, QUEUE)
            self.push(k, RUN, i)
            count += 1
            d = self.req[DONE, i]
            total += self.req[PLEN, i] - d
            sq += self.req[PLEN, i] * self.req[PLEN, i] - d * d
            self.req[DONE, i] = self.req[PLEN, i]
            if not self.req[RESUMED, i]:
                self.times[PREFILL_START, i] = now
        taken[0], taken[1], taken[2] = count, total, sq

    cdef void chunks(self, Py_ssize_t k, double now, int64_t* taken) noexcept:
        """(prompts or chunks, tokens, squared tokens) of a chunked pass: the decodes first, then
        prompt tokens from the queue's head up to the budget, the last prompt split."""
        cdef int64_t total = 0, sq = 0, chunks = 0, i, d, c
        cdef int64_t room = self.settings[MAX_BATCH_TOKENS] - self.inst[k, BATCH], cap = self.settings[CAP]
        while room > 0 and chunks < cap and self.inst[k, QUEUE + 2]:
            i = self.inst[k, QUEUE]
            d = self.req[DONE, i]
            if d == self.req[CACHED, i] and not self.req[RESUMED, i]:
                self.times[PREFILL_START, i] = now
            c = min(self.req[PLEN, i] - d, room)
            total += c
            sq += (d + c) * (d + c) - d * d  # causal attention of c new tokens over d + c
            self.req[DONE, i] = d + c
            room -= c
            chunks += 1
            if self.req[DONE, i] < self.req[PLEN, i]:
                break
            self.push(k, RUN, self.pop(k, QUEUE))
        taken[0], taken[1], taken[2] = chunks, total, sq

    cdef double pass_s(self, Py_ssize_t k, int64_t chunks, int64_t total, int64_t sq) noexcept:
        """The time of instance k's pass (-1.0: its decode batch outgrew `lines`)."""
        cdef int64_t pool = self.inst[k, POOL], batch = self.inst[k, BATCH], first
        cdef double duration, base, per_token, slack, attention
        if chunks:
            first = self.inst[k, RUN]
            if chunks == 1 and batch == 0 and first >= 0 and total == self.prompt[first] and not self.req[RESUMED, first]:
                duration = self.single[pool, first]  # one whole prompt alone: its time is known
            else:
                duration = _pass_time_s(&self.vectors[pool, 0], <double> chunks, <double> total, <double> sq, <double> batch,
                                        <double> self.inst[k, CTX])
            self.clock[k, PREFILL_S] += duration
            return duration
        if batch >= self.lines.shape[1]:
            return -1.0
        base, per_token, slack = self.lines[pool, batch, 0], self.lines[pool, batch, 1], self.lines[pool, batch, 2]
        attention = self.inst[k, CTX] * per_token
        duration = base + attention + (slack - attention if slack > attention else 0.0)
        self.clock[k, DECODE_S] += duration
        return duration

    cdef int start(self, Py_ssize_t k, double now) except -1:
        """Begin instance k's next iteration, if it has work (BATCH_PAST_TABLE if its decode batch
        outgrew `lines`, else OK)."""
        cdef int64_t pool = self.inst[k, POOL], role = self.inst[k, ROLE], batch
        cdef int64_t taken[3]
        while (role == MIXED and self.inst[k, BATCH] > 1
               and self.inst[k, KV_USED] + self.inst[k, CTX] + self.inst[k, BATCH] > self.pools[pool, KV_CAP]):
            self.preempt(k, now)
        taken[0] = taken[1] = taken[2] = 0
        if role != TOKEN and self.inst[k, QUEUE + 2]:
            if self.pools[pool, CHUNKED]:
                self.chunks(k, now, taken)
            else:
                self.whole_prompts(k, now, taken)
        batch = self.inst[k, BATCH]
        if not taken[0] and not batch:
            self.inst[k, RUNNING] = 0
            return OK
        cdef double duration = self.pass_s(k, taken[0], taken[1], taken[2])
        if duration < 0.0:
            return BATCH_PAST_TABLE
        self.clock[k, INTEGRAL] += batch * duration
        self.inst[k, RUNNING] = 1
        if self.pools[pool, DEFERRING]:  # the next iteration is scheduled now if there is work beyond this one
            self.inst[k, LAUNCH] += 1
            self.inst[k, FIXED] = (batch > 0 or self.inst[k, QUEUE + 2] > 0 or self.inst[k, WAITING + 2] > 0
                                   or self.inst[k, DEFERRED + 2] > 0 or (self.inst[k, RUN + 2] > 0 and role == MIXED))
        self.counters[SEQ] += 1
        heap_push(&self.heap, now + duration, self.counters[SEQ], ITERATION_END, k, -1)
        return OK

    cdef int send_kv(self, Py_ssize_t k, Py_ssize_t tok, int64_t i, double now) except -1:
        """Request i's KV leaves prompt instance k for token instance tok over both links (FIFO):
        after the prefill when short, else layer by layer from the prefill's start; on one machine,
        over its GPU links, the NICs free."""
        cdef int64_t source = self.inst[k, POOL], destination = self.inst[tok, POOL]
        cdef bint local = self.inst[k, NODE] >= 0 and self.inst[k, NODE] == self.inst[tok, NODE]
        cdef double duration = self.prompt[i] * self.kv_bytes / (
            self.local_bps[source, destination] if local else min(self.pools_s[source, LINK_BPS], self.pools_s[destination, LINK_BPS]))
        cdef double busy_until = 0.0 if local else max(self.clock[k, LINK_FREE], self.clock[tok, LINK_FREE])  # both NICs carry the transfer
        cdef double begin, done
        if self.prompt[i] < self.pools[source, LAYERWISE_MIN]:
            begin = max(now, busy_until)
            done = begin + duration + self.pools_s[source, KV_LATENCY_S]
        else:
            begin = max(self.times[PREFILL_START, i], busy_until)
            done = max(begin + duration, now + duration / self.settings[LAYERS]) + self.pools_s[source, KV_LATENCY_S]
        if not local:
            self.clock[k, LINK_FREE] = self.clock[tok, LINK_FREE] = begin + duration
        self.counters[SEQ] += 1
        heap_push(&self.heap, done, self.counters[SEQ], KV_ARRIVED, tok, i)
        return 0

    cdef int prefill_done(self, Py_ssize_t k, int64_t i, double now) except -1:
        cdef Py_ssize_t tok
        if self.req[RESUMED, i]:  # recomputed after a preemption: its next token comes now
            self.times[STALL, i] = max(self.times[STALL, i], now - self.times[PREEMPTED_AT, i])
            self.inst[k, KV_USED] -= self.req[PLEN, i]
            self.req[BASE, i] += 1
            if self.req[BASE, i] == self.out[i]:  # that was its last token
                self.finish(i, now)
                self.unassign(k, i)
            else:
                self.join(k, i, now)
            self.req[RESUMED, i] = 0
            return 0
        self.times[TTFT, i] = now - self.arrival[i]
        tok = self.req[T_INST, i]
        if self.out[i] == 1:  # the first token was the whole answer
            self.finish(i, now)
            self.unassign(tok, i)
            return 0
        if tok == k:  # co-located: its KV held since admission, now counted in the batch's context
            self.times[KV_READY, i] = now
            self.inst[k, KV_USED] -= self.req[PLEN, i]
            self.join(k, i, now)
            return 0
        self.send_kv(k, tok, i, now)
        return 0

    cdef void finish_decodes(self, Py_ssize_t k, double now) noexcept:
        """The decodes whose last token this iteration gave leave the batch."""
        cdef int64_t iters = self.inst[k, ITERS], soonest = INT64_MAX, after
        cdef int64_t i = self.inst[k, MEMBERS_HEAD]
        while i >= 0:
            after = self.req[AFTER, i]
            if self.req[FINISH_ITER, i] == iters:
                self.unlink(k, i)
                if self.inst[k, ROLE] != MIXED:
                    self.inst[k, KV_USED] -= self.prompt[i] + self.out[i]
                self.inst[k, BATCH] -= 1
                self.inst[k, CTX] -= self.prompt[i] + self.out[i]
                self.unassign(k, i)
                self.finish(i, now)
            else:
                soonest = min(soonest, self.req[FINISH_ITER, i])
            i = after
        self.inst[k, NEXT_FINISH] = soonest

    cdef int settle(self, Py_ssize_t k, double now, int how) except -1:
        """The one place instances admit waiting requests and start iterations. After an iteration
        (AFTER_ITERATION): the deferred requests that arrived before it began join, waiting ones
        are admitted, the next iteration starts, and when none could be, the rest of the deferred
        join and it is tried again. After an arrival on a co-located instance, or a KV arrival on
        an idle instance (ADMIT_THEN_START): admit, then start if idle; after any other arrival
        (START): start if idle."""
        if how == AFTER_ITERATION and self.inst[k, DEFERRED + 2]:  # async scheduling: those that arrived before it began
            self.release(k, self.inst[k, LAUNCH])
        cdef int status = OK, attempt
        for attempt in range(2):
            if attempt:  # nothing was scheduled after an iteration: the deferred rest join now
                if how != AFTER_ITERATION or self.inst[k, RUNNING] or not self.inst[k, DEFERRED + 2]:
                    break
                self.release(k, INT64_MAX)
            if how != START:
                self.admit(k, now)
            if how == AFTER_ITERATION or not self.inst[k, RUNNING]:
                status = self.start(k, now)
            if status != OK:
                break
        return status

    cdef int iteration_end(self, Py_ssize_t k, double now) except -1:
        """Instance k's iteration is over: every decode has one more token (some finish), the
        prefills it carried have their first token (the caller then settles it: AFTER_ITERATION)."""
        cdef int64_t i, after
        if self.inst[k, BATCH]:
            self.inst[k, ITERS] += 1
            self.counters[ITERATIONS] += 1
            if self.counters[ITERATIONS] > self.settings[MAX_ITERATIONS]:
                return TOO_MANY_ITERATIONS
            if self.counters[ENDS] == self.ends_s.shape[0]:
                self.ends_s, self.ends_at = np.concatenate((self.ends_s, self.ends_s)), np.concatenate((self.ends_at, self.ends_at))
            self.ends_s[self.counters[ENDS]], self.ends_at[self.counters[ENDS]] = now, k
            self.counters[ENDS] += 1
            self.inst[k, CTX] += self.inst[k, BATCH]
            if self.inst[k, ITERS] >= self.inst[k, NEXT_FINISH]:
                self.finish_decodes(k, now)
        i = self.inst[k, RUN]
        while i >= 0:
            after = self.req[NEXT, i]
            self.p_load[self.inst[k, P_POS]] -= self.req[PLEN, i]  # a prompt stays pending on its instance until its prefill completes
            self.prefill_done(k, i, now)
            i = after
        self.inst[k, RUN], self.inst[k, RUN + 1], self.inst[k, RUN + 2] = -1, -1, 0
        return OK

    cdef bint kv_arrived(self, Py_ssize_t k, int64_t i, double now) noexcept:
        """Request i's KV reached token instance k: it waits to join the batch. Whether k is idle
        (then settled: ADMIT_THEN_START)."""
        self.times[KV_READY, i] = now
        if self.inst[k, RUNNING] and self.inst[k, FIXED]:  # async scheduling: the next iteration is already scheduled
            self.req[DEFERRED_AT, i] = self.inst[k, LAUNCH]
            self.push(k, DEFERRED, i)
            return False
        self.push(k, WAITING, i)
        return not self.inst[k, RUNNING]

    cdef void route(self, Py_ssize_t* src, Py_ssize_t* dst) noexcept:
        """(the instance that prefills a request, the one that decodes it): the least loaded of
        each side (ties to the lowest), or round-robin; a co-located instance does both."""
        if self.settings[ROUND_ROBIN]:
            src[0] = self.prompt_side[self.counters[TURN_P] % self.prompt_side.shape[0]]
            self.counters[TURN_P] += 1
        else:
            src[0] = self.prompt_side[_least(self.p_load)]
        if self.inst[src[0], ROLE] == MIXED:
            dst[0] = src[0]
            return
        if self.settings[ROUND_ROBIN]:
            dst[0] = self.token_side[self.counters[TURN_T] % self.token_side.shape[0]]
            self.counters[TURN_T] += 1
        else:
            dst[0] = self.token_side[_least(self.t_load)]

    cdef Py_ssize_t arrive(self, int64_t i, double now, int* how) noexcept:
        """Request i is routed, and refused (longer than max_model_len, or than a prompt instance's
        KV) or queued: the instance to settle (-1 for none), and how."""
        cdef Py_ssize_t src, dst
        self.route(&src, &dst)
        self.req[P_INST, i], self.req[T_INST, i] = src, dst
        how[0] = START
        if self.settings[CONTEXT] > 0 and self.prompt[i] + self.out[i] > self.settings[CONTEXT]:  # the engine refuses it at once
            self.req[REJECTED, i] = self.req[REFUSED, i] = 1
            self.release_client(now)
            return -1
        if self.inst[src, ROLE] == PROMPT and self.prompt[i] > self.pools[self.inst[src, POOL], MAX_REQUEST]:  # its prompt's KV never fits
            self.req[REJECTED, i] = 1
            self.release_client(now)
            return -1
        self.p_load[self.inst[src, P_POS]] += self.prompt[i] + (self.inst[src, ROLE] == MIXED)  # (a co-located one also counts the request held)
        if self.inst[dst, T_POS] >= 0:
            self.t_load[self.inst[dst, T_POS]] += self.out[i]
        if self.inst[src, RUNNING] and self.inst[src, FIXED]:  # async scheduling: the next iteration is already scheduled
            self.req[DEFERRED_AT, i] = self.inst[src, LAUNCH]
            self.push(src, DEFERRED, i)
            return src
        if self.inst[src, ROLE] == MIXED:  # prefilled once its KV is reserved
            self.push(src, WAITING, i)
            how[0] = ADMIT_THEN_START
            return src
        self.push(src, QUEUE, i)
        return src

    cdef int log(self, double now, int64_t kind, int64_t k, int64_t i) except -1:
        """One event in the log (grown as it fills)."""
        cdef int64_t at = self.counters[LOGGED]
        if at == self.log_s.shape[0]:
            self.log_s, self.log_at = np.concatenate((self.log_s, self.log_s)), np.concatenate((self.log_at, self.log_at))
        self.log_s[at] = now
        self.log_at[at, 0], self.log_at[at, 1], self.log_at[at, 2] = kind, k, i
        self.counters[LOGGED] += 1
        return 0

    cdef int loop(self, double front_s) except -1:
        cdef Py_ssize_t n = self.arrival.shape[0], r = 0, k
        cdef int status = OK, how
        cdef double now
        cdef Entry e
        while status == OK and (r < n or self.heap.size):
            if r < n and (not self.heap.size or self.arrival[r] + front_s < self.heap.items[0].t):
                now = self.arrival[r] + front_s
                k = self.arrive(r, now, &how)
                if self.settings[LOG]:
                    self.log(now, ARRIVAL, self.req[P_INST, r], r)
                r += 1
            else:
                e = heap_pop(&self.heap)
                now, k = e.t, e.k
                if self.settings[LOG]:
                    self.log(now, e.kind, k, e.i)
                if e.kind == KV_ARRIVED:
                    k, how = (k if self.kv_arrived(k, e.i, now) else -1), ADMIT_THEN_START
                else:
                    status = self.iteration_end(k, now)
                    how = AFTER_ITERATION
            self.counters[EVENTS] += 1
            if k >= 0 and status == OK:
                status = self.settle(k, now, how)
        return status


def run(double[:] arrival, double front_s, const int64_t[:] prompt, const int64_t[:] out, req, times, inst,
        pools, const double[:, :] pools_s, const double[:, :] local_bps, const int64_t[:] settings, double kv_bytes,
        const double[:, ::1] vectors, const double[:, :, :] lines, const double[:, :] single):
    """Run the requests (arrival times, prompt and output tokens) from `req`, `times` and `inst` as
    `initial_state` makes them. Per pool: `pools` (KV_CAP ... LAYERWISE_MIN), `pools_s` (LINK_BPS,
    KV_LATENCY_S), `local_bps[a, b]` KV bandwidth from an instance of pool a to one of pool b on its
    machine, `vectors` the pass formula's constants, `lines[pool, b]` a decode step of b requests as
    (base, per context token, slack) (Instance.decode_line), `single[pool]` each prompt's time alone;
    `settings` (MAX_BATCH_TOKENS ... LOG), `kv_bytes` per token. A closed loop's `arrival` holds the
    first clients' send times and infinity for the rest, each written when a client sends it.
    Fills `req`, `times`, `inst` (and `arrival`); returns (status, per-instance times, counters,
    iteration end times, their instances, the event log's times, and its kind, instance and
    request per event)."""
    _check_width(vectors.shape[1])
    if settings.shape[0] != SETTINGS:
        raise ValueError(f"settings: {settings.shape[0]} entries, the core reads {SETTINGS}")
    cdef _Run s = _Run()
    n, count = arrival.shape[0], len(inst)
    s.arrival, s.prompt, s.out, s.req, s.times, s.inst, s.pools = arrival, prompt, out, req, times, inst, pools
    s.pools_s, s.local_bps, s.settings, s.kv_bytes, s.vectors, s.lines, s.single = (pools_s, local_bps, settings, kv_bytes,
                                                                                    vectors, lines, single)
    s.prompt_side, s.token_side = np.flatnonzero(inst[:, P_POS] >= 0), np.flatnonzero(inst[:, T_POS] >= 0)
    s.p_load, s.t_load = np.zeros(len(s.prompt_side), np.int64), np.zeros(len(s.token_side), np.int64)
    clock, counters = np.zeros((count, 4)), np.zeros(COUNTERS, np.int64)
    counters[RELEASED] = min(settings[CLOSED], n) if settings[CLOSED] else n
    s.clock, s.counters = clock, counters
    s.ends_s, s.ends_at = np.empty(max(1024, 4 * n)), np.empty(max(1024, 4 * n), np.int64)
    logged = max(1024, 4 * n) if settings[LOG] else 0
    s.log_s, s.log_at = np.empty(logged), np.empty((logged, 3), np.int64)
    heap_init(&s.heap, count)
    status = s.loop(front_s)
    ends, events = int(counters[ENDS]), int(counters[LOGGED])
    return (int(status), clock, counters, np.asarray(s.ends_s)[:ends].copy(), np.asarray(s.ends_at)[:ends].copy(),
            np.asarray(s.log_s)[:events].copy(), np.asarray(s.log_at)[:events].copy())
