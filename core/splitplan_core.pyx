# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""splitplan's engine core, compiled when the package is built (Cython, by `pip install .`):
the pass formula, the prompt pools' FCFS replay, the simulator's run and two helpers of the decode
fixed point. Nothing here compiles at run time. It is the scheduler's one implementation; the
tests hold each function to a Python statement of the same rule, statement for statement and in
the same order of operations, so its floats equal the Python's to the bit (property tests run both):
- `pass_terms` and its kin: `perf.roofline.Instance._terms` (an instance's constants travel as
  one float64 vector, `FIELDS` names its entries, `Instance.pass_vector` packs it);
- the prefix caches (`PrefixCache`, and per instance in the two below): the rules of
  `sim.prefix_cache`'s docstring, held to `tests/sim/python_prefix_cache.py`;
- `prompt_replay`: `capacity.pools.replay_prompts` (prefix caches and measured tables included),
  held to `tests/capacity/python_replay.py`;
- `run`: the simulator, every rule of `sim.cluster`'s docstring (open or closed loops, prefix caches
  and their host tier, shared machines, Splitwise's mixed pool, measured tables, the event log and
  recorded passes), held to `tests/sim/python_loop.py`;
- `ranks` and `running_peak`: NumPy's searchsorted and a running sum's peak, by cheaper routes.

Events come from one binary heap (`Heap`, apart from the models) keyed (time, then a second key:
a sequence number, or an instance), popped in the order Python's heapq pops the same tuples.
"""

from libc.math cimport INFINITY, pow, sqrt
from libc.stdint cimport INT64_MAX, INT64_MIN, int64_t
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
    return x.t < y.t or (x.t == y.t and (x.key < y.key or (x.key == y.key and x.i < y.i)))


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


# ---- the prefix caches --------------------------------------------------------------------------
# `sim.prefix_cache`'s rules (tests/sim/python_prefix_cache.py): one per instance, over a trace's prefix tree
# (parent, tokens, depth per node). A cache keeps a slot per node it holds in either tier or that a
# request pins (found by an open-addressing table; a slot freed when none of these holds, so a
# cache's memory follows what it holds, as the Python's dicts do): whether the node is resident,
# its last use, its resident children, the requests pinning it, and its place in the host tier's
# least-recently-used list. Eviction candidates sit on a heap keyed (last use, -depth, node),
# stale entries skipped, as the Python's.

cdef struct Slot:
    int64_t node
    double last_use
    int64_t kids
    int64_t pins
    int64_t cpu_prev  # the host tier's list (slots; -1: none)
    int64_t cpu_next  # (a free slot: the next free one)
    char resident
    char in_cpu


cdef struct Cache:
    int64_t* table  # node -> slot + 1 (0: empty), open addressing
    int64_t* table_node
    Py_ssize_t table_mask
    Slot* slots  # (a free slot's node is -1)
    Py_ssize_t used, capacity, live, free_head  # slots made, allocated, in the table; the first free one (-1: none)
    int64_t cpu_head, cpu_tail, cpu_count  # the host tier, least recently used first
    double cpu_cap
    int64_t cpu_used, free_tokens, resident_tokens, hit_tokens, lookup_tokens, loaded_tokens, evicted
    Heap heap


cdef int cache_init(Cache* c, double cpu_cap) except -1:
    c.table_mask, c.used, c.capacity, c.live, c.free_head = 63, 0, 32, 0, -1
    c.table, c.table_node = <int64_t*> malloc(64 * sizeof(int64_t)), <int64_t*> malloc(64 * sizeof(int64_t))
    c.slots = <Slot*> malloc(c.capacity * sizeof(Slot))
    if c.table == NULL or c.table_node == NULL or c.slots == NULL:
        raise MemoryError()
    cdef Py_ssize_t j
    for j in range(64):
        c.table[j] = 0
    c.cpu_head = c.cpu_tail = -1
    c.cpu_count = c.cpu_used = c.free_tokens = c.resident_tokens = c.hit_tokens = c.lookup_tokens = c.loaded_tokens = 0
    c.evicted = 0
    c.cpu_cap = cpu_cap
    heap_init(&c.heap, 16)
    return 0


cdef void cache_free(Cache* c) noexcept:
    free(c.table)
    free(c.table_node)
    free(c.slots)
    heap_free(&c.heap)


cdef inline Py_ssize_t _bucket(int64_t node, Py_ssize_t mask) noexcept nogil:
    return <Py_ssize_t> ((<unsigned long long> node * 11400714819323198485ULL) >> 20) & mask


cdef Py_ssize_t cache_find(Cache* c, int64_t node) noexcept:
    """The slot of `node`, -1 if the cache never met it."""
    cdef Py_ssize_t j = _bucket(node, c.table_mask)
    while c.table[j]:
        if c.table_node[j] == node:
            return c.table[j] - 1
        j = (j + 1) & c.table_mask
    return -1


cdef Py_ssize_t cache_slot(Cache* c, int64_t node) except -1:
    """The slot of `node`, made (not resident, no pins) if the cache never met it."""
    cdef Py_ssize_t found = cache_find(c, node), j, size, k
    if found >= 0:
        return found
    cdef int64_t* table
    cdef int64_t* nodes
    cdef Slot* grown
    if 2 * (c.live + 1) > c.table_mask + 1:  # (at most half full: the table doubles)
        size = 2 * (c.table_mask + 1)
        table, nodes = <int64_t*> malloc(size * sizeof(int64_t)), <int64_t*> malloc(size * sizeof(int64_t))
        if table == NULL or nodes == NULL:
            free(table)
            free(nodes)
            raise MemoryError()
        for j in range(size):
            table[j] = 0
        for k in range(c.used):
            if c.slots[k].node < 0:
                continue
            j = _bucket(c.slots[k].node, size - 1)
            while table[j]:
                j = (j + 1) & (size - 1)
            table[j], nodes[j] = k + 1, c.slots[k].node
        free(c.table)
        free(c.table_node)
        c.table, c.table_node, c.table_mask = table, nodes, size - 1
    if c.free_head >= 0:
        k = c.free_head
        c.free_head = c.slots[k].cpu_next
    else:
        if c.used == c.capacity:
            grown = <Slot*> realloc(c.slots, 2 * c.capacity * sizeof(Slot))
            if grown == NULL:
                raise MemoryError()
            c.slots, c.capacity = grown, 2 * c.capacity
        k = c.used
        c.used += 1
    j = _bucket(node, c.table_mask)
    while c.table[j]:
        j = (j + 1) & c.table_mask
    c.table[j], c.table_node[j] = k + 1, node
    c.slots[k].node, c.slots[k].last_use, c.slots[k].kids, c.slots[k].pins = node, 0.0, 0, 0
    c.slots[k].cpu_prev = c.slots[k].cpu_next = -1
    c.slots[k].resident = c.slots[k].in_cpu = 0
    c.live += 1
    return k


cdef void cache_release(Cache* c, Py_ssize_t s) noexcept:
    """Slot s's node is held in neither tier and pinned by none: the slot is freed (its table entry
    removed by shifting the entries after it back, as linear probing needs)."""
    if c.slots[s].resident or c.slots[s].in_cpu or c.slots[s].pins:
        return
    cdef Py_ssize_t mask = c.table_mask, i = _bucket(c.slots[s].node, c.table_mask), k, home
    while c.table[i] != s + 1:
        i = (i + 1) & mask
    k = i
    while True:
        c.table[i] = 0
        while True:
            k = (k + 1) & mask
            if not c.table[k]:
                c.slots[s].node, c.slots[s].cpu_next, c.free_head = -1, c.free_head, s
                c.live -= 1
                return
            home = _bucket(c.table_node[k], mask)
            if (home <= i or home > k) if i <= k else (home <= i and home > k):  # (its home not in (i, k]: it moves to i)
                break
        c.table[i], c.table_node[i] = c.table[k], c.table_node[k]
        i = k


cdef class _Tree:
    """A trace's prefix tree as the caches read it, and a buffer for a path walked root first."""
    cdef const int64_t[:] parent, tokens, depth
    cdef int64_t block
    cdef int64_t* path
    cdef Py_ssize_t path_length

    def __dealloc__(self):
        free(self.path)

    cdef int setup(self, const int64_t[:] parent, const int64_t[:] tokens, const int64_t[:] depth, int64_t block) except -1:
        self.parent, self.tokens, self.depth, self.block = parent, tokens, depth, block
        cdef Py_ssize_t n = parent.shape[0], node, longest = 1
        levels = np.zeros(n, np.int64)
        cdef int64_t[:] level = levels
        for node in range(n):  # (parents come before their children)
            level[node] = 1 + (level[parent[node]] if parent[node] >= 0 else 0)
            longest = max(longest, level[node])
        self.path = <int64_t*> malloc(longest * sizeof(int64_t))
        if self.path == NULL:
            raise MemoryError()
        return 0

    cdef Py_ssize_t walk(self, int64_t node) noexcept:
        """The path from `node` to the root into `path` (node first); its length."""
        cdef Py_ssize_t m = 0
        while node >= 0:
            self.path[m] = node
            m += 1
            node = self.parent[node]
        return m

    cdef int64_t gpu_depth(self, Cache* c, int64_t node) noexcept:
        cdef Py_ssize_t s
        while node >= 0:
            s = cache_find(c, node)
            if s >= 0 and c.slots[s].resident:
                return self.depth[node]
            node = self.parent[node]
        return 0

    cdef int64_t held(self, Cache* c, int64_t node) noexcept:
        """Tokens of the longest prefix of `node`'s path held in either tier."""
        if not c.cpu_count:
            return self.gpu_depth(c, node)
        cdef int64_t held = 0
        cdef Py_ssize_t m = self.walk(node), j, s
        for j in range(m - 1, -1, -1):
            s = cache_find(c, self.path[j])
            if s < 0 or not (c.slots[s].resident or c.slots[s].in_cpu):
                break
            held = self.depth[self.path[j]]
        return held

    cdef inline int64_t blocks(self, int64_t held, int64_t prompt) noexcept:
        return min(held, prompt - 1) // self.block * self.block

    cdef int64_t peek(self, Cache* c, int64_t node, int64_t prompt) noexcept:
        return self.blocks(self.held(c, node), prompt)

    cdef int64_t resident(self, Cache* c, int64_t node, int64_t prompt) noexcept:
        return self.blocks(self.gpu_depth(c, node), prompt)

    cdef int64_t match(self, Cache* c, int64_t node, int64_t prompt, int64_t* loaded) noexcept:
        """`peek`, counted in the hit rate, and into `loaded` those of its tokens in host memory."""
        cdef int64_t hit = self.peek(c, node, prompt)
        loaded[0] = max(hit - self.gpu_depth(c, node), 0)
        c.hit_tokens += hit
        c.lookup_tokens += prompt
        c.loaded_tokens += loaded[0]
        cdef Py_ssize_t m, j, s
        if loaded[0]:
            m = self.walk(node)
            for j in range(m - 1, -1, -1):  # (root first: the deepest is the most recently used)
                s = cache_find(c, self.path[j])
                if s >= 0 and c.slots[s].in_cpu:
                    cpu_unlink(c, s)
                    cpu_append(c, s)
        return hit

    cdef Py_ssize_t cheapest(self, Cache* caches, const int64_t[:] instance, const int64_t[:] load, int64_t node,
                             int64_t prompt) noexcept:
        """Prefix-aware routing, as KV-aware routers score instances: of the instances `instance[j]`
        (their caches), the position j with the fewest prompt tokens to prefill there, its pending
        `load[j]` and the prompt's less what its cache holds; ties to the lowest."""
        cdef Py_ssize_t j, best = 0
        cdef int64_t cost, best_cost = 0
        for j in range(load.shape[0]):
            cost = load[j] + prompt - self.peek(&caches[instance[j]], node, prompt)
            if j == 0 or cost < best_cost:
                best, best_cost = j, cost
        return best

    cdef int insert(self, Cache* c, int64_t node, double now) except -1:
        """The path to `node` is computed: resident, used at `now`."""
        cdef Py_ssize_t m = self.walk(node), j, s, up
        cdef int64_t n
        for j in range(m):
            n = self.path[j]
            s = cache_slot(c, n)
            if not c.slots[s].resident:
                c.slots[s].resident = 1
                c.resident_tokens += self.tokens[n]
                if self.parent[n] >= 0:
                    up = cache_slot(c, self.parent[n])
                    c.slots[up].kids += 1
                if not c.slots[s].pins:
                    c.free_tokens += self.tokens[n]
            c.slots[s].last_use = now
            if not c.slots[s].pins:  # (a node the inserting request pins is pushed when it lets go)
                self.candidate(c, s)
        if c.cpu_cap:
            self.write_through(c, node)
        return 0

    cdef int write_through(self, Cache* c, int64_t node) except -1:
        cdef Py_ssize_t m = self.walk(node), j, s
        cdef int64_t n
        for j in range(m - 1, -1, -1):  # (root first: the last one used is the deepest)
            n = self.path[j]
            s = cache_slot(c, n)
            if c.slots[s].in_cpu:
                cpu_unlink(c, s)
                cpu_append(c, s)
            elif self.tokens[n] <= c.cpu_cap:
                cpu_append(c, s)
                c.cpu_used += self.tokens[n]
        while c.cpu_used > c.cpu_cap:
            s = c.cpu_head
            cpu_unlink(c, s)
            c.cpu_used -= self.tokens[c.slots[s].node]
            cache_release(c, s)
        return 0

    cdef int pin(self, Cache* c, int64_t node) except -1:
        """A running request uses the (resident) path to `node`."""
        cdef Py_ssize_t m = self.walk(node), j, s
        for j in range(m):
            s = cache_slot(c, self.path[j])
            if c.slots[s].pins == 0 and c.slots[s].resident:
                c.free_tokens -= self.tokens[self.path[j]]
            c.slots[s].pins += 1
        return 0

    cdef int unpin(self, Cache* c, int64_t node, double now) except -1:
        cdef Py_ssize_t m = self.walk(node), j, s
        for j in range(m):
            s = cache_find(c, self.path[j])
            c.slots[s].pins -= 1
            if c.slots[s].pins:
                continue
            if c.slots[s].resident:
                c.free_tokens += self.tokens[self.path[j]]
                c.slots[s].last_use = now
                self.candidate(c, s)
            else:
                cache_release(c, s)
        return 0

    cdef int candidate(self, Cache* c, Py_ssize_t s) except -1:
        """The node may be evicted now (a leaf no request pins): on the heap, at its last use."""
        if not c.slots[s].kids and not c.slots[s].pins:
            heap_push(&c.heap, c.slots[s].last_use, -self.depth[c.slots[s].node], 0, 0, c.slots[s].node)
        return 0

    cdef int evict(self, Cache* c, int64_t limit_tokens) except -1:
        """Drop least recently used unpinned leaves until the unpinned tokens fit `limit_tokens`."""
        cdef Entry e
        cdef Py_ssize_t s, up
        cdef int64_t n
        while c.free_tokens > limit_tokens and c.heap.size:
            e = heap_pop(&c.heap)
            n = e.i
            s = cache_find(c, n)
            if s < 0 or not c.slots[s].resident or c.slots[s].last_use != e.t or c.slots[s].kids or c.slots[s].pins:
                continue  # stale, or not evictable now (it is pushed again when it becomes so)
            c.slots[s].resident = 0
            c.free_tokens -= self.tokens[n]
            c.resident_tokens -= self.tokens[n]
            c.evicted += 1
            cache_release(c, s)
            if self.parent[n] >= 0:
                up = cache_find(c, self.parent[n])
                c.slots[up].kids -= 1
                self.candidate(c, up)
        return 0


cdef object cache_state(Cache* c):
    """A cache's state as arrays, for `sim.prefix_cache.CacheState.from_core`: per node it holds or a
    request pins (node, last use, resident children, pins, resident), the host tier's nodes least
    recently used first, and (cpu_used, free, resident, hit, looked-up, loaded tokens, evicted)."""
    nodes, last_use = np.empty(c.live, np.int64), np.empty(c.live)
    counts = np.empty((c.live, 3), np.int64)
    cdef Py_ssize_t k, m = 0
    for k in range(c.used):
        if c.slots[k].node < 0:
            continue
        nodes[m], last_use[m] = c.slots[k].node, c.slots[k].last_use
        counts[m, 0], counts[m, 1], counts[m, 2] = c.slots[k].kids, c.slots[k].pins, c.slots[k].resident
        m += 1
    cpu = np.empty(c.cpu_count, np.int64)
    cdef int64_t at = c.cpu_head
    k = 0
    while at >= 0:
        cpu[k] = c.slots[at].node
        k += 1
        at = c.slots[at].cpu_next
    return (nodes, last_use, counts, cpu, (c.cpu_used, c.free_tokens, c.resident_tokens, c.hit_tokens, c.lookup_tokens,
                                           c.loaded_tokens, c.evicted))


cdef class PrefixCache:
    """One cache alone over a prefix tree (parent, tokens, depth per node), as `sim.prefix_cache.
    PrefixCache` is called: the rules the simulator's compiled run keeps per instance, held to
    that class operation by operation (tests/sim/test_compiled.py)."""
    cdef _Tree tree
    cdef Cache c
    cdef bint ready

    def __cinit__(self, const int64_t[:] parent, const int64_t[:] tokens, const int64_t[:] depth, int64_t block_tokens=1,
                  double cpu_tokens=0.0):
        self.tree = _Tree()
        self.tree.setup(parent, tokens, depth, block_tokens)
        cache_init(&self.c, cpu_tokens)
        self.ready = True

    def __dealloc__(self):
        if self.ready:
            cache_free(&self.c)

    def insert(self, int64_t node, double now):
        self.tree.insert(&self.c, node, now)

    def match(self, int64_t node, int64_t prompt_tokens):
        cdef int64_t loaded
        cdef int64_t hit = self.tree.match(&self.c, node, prompt_tokens, &loaded)
        return hit, loaded

    def peek(self, int64_t node, int64_t prompt_tokens):
        return self.tree.peek(&self.c, node, prompt_tokens)

    def resident(self, int64_t node, int64_t prompt_tokens):
        return self.tree.resident(&self.c, node, prompt_tokens)

    def pin(self, int64_t node):
        self.tree.pin(&self.c, node)

    def unpin(self, int64_t node, double now):
        self.tree.unpin(&self.c, node, now)

    def evict(self, int64_t limit_tokens):
        self.tree.evict(&self.c, limit_tokens)

    def state(self):
        """`cache_state`: what `sim.prefix_cache.CacheState.from_core` takes."""
        return cache_state(&self.c)


cdef inline void cpu_unlink(Cache* c, Py_ssize_t s) noexcept:
    cdef int64_t before = c.slots[s].cpu_prev, after = c.slots[s].cpu_next
    if before < 0:
        c.cpu_head = after
    else:
        c.slots[before].cpu_next = after
    if after < 0:
        c.cpu_tail = before
    else:
        c.slots[after].cpu_prev = before
    c.slots[s].in_cpu = 0
    c.cpu_count -= 1


cdef inline void cpu_append(Cache* c, Py_ssize_t s) noexcept:
    c.slots[s].cpu_prev, c.slots[s].cpu_next = c.cpu_tail, -1
    if c.cpu_tail < 0:
        c.cpu_head = s
    else:
        c.slots[c.cpu_tail].cpu_next = s
    c.cpu_tail = s
    c.slots[s].in_cpu = 1
    c.cpu_count += 1


# ---- the pass formula ----------------------------------------------------------------------------

FIELDS = (
    "layers_per_stage", "act_bytes_per_element", "weight_bytes_per_element", "peak_flops_per_s", "gemm_peak_flops_per_s",
    "memory_bytes_per_s", "compute_efficiency", "gemm_half_tokens", "dense_flops_per_token", "dense_weight_bytes",
    "activation_bytes_per_token", "q_dim_per_gpu", "kv_dim_per_gpu", "prefill_attention_flops_per_sq_token",
    "decode_flops_per_context_token", "decode_bytes_per_context_token", "routed_expert_share", "lm_head_params",
    "collective_s_per_token", "collective_latency_s", "large_collective_s_per_token", "large_collective_latency_s",
    "all_to_all_s_per_token", "all_to_all_latency_s", "decode_all_to_all_s_per_token", "decode_all_to_all_latency_s",
    "hop_s_per_token", "hop_latency_s", "dp", "pp", "divides_pass", "gpu_launch_s", "host_launch_s",
    "packed_attention", "clock_slowdown", "capped_clock_slowdown",
    # measured kernel curves (perf.curves), or their roofline defaults (the same bandwidth, no extra time)
    "gemm_bytes_per_s", "gemm_pass_s_per_token", "gemm_latency_s", "prefill_attention_half_tokens",
    "prefill_attention_latency_s", "prefill_attention_s_per_seq", "prefill_attention_ramp_tokens",
    "prefill_attention_tile_tokens", "kv_bytes_per_s", "decode_attention_half_seqs", "decode_attention_efficiency",
    "decode_attention_s_per_seq", "decode_attention_latency_s", "moe_compute_efficiency", "moe_half_rows", "moe_bytes_per_s",
    "moe_latency_s", "moe_s_per_row", "moe_s_per_token", "moe_load_spread", "moe_load_cap", "moe_routing_alpha",
    # the engine's factors and the model's experts the formula reads
    "knee_slowdown", "knee_tokens", "moe_efficiency", "attention_efficiency", "decode_overhead_s", "prefill_overhead_s",
    "sequence_overhead_s", "prefill_sequence_overhead_s", "is_moe", "experts", "experts_per_token", "expert_params",
)

cdef enum:  # FIELDS' order
    LAYERS_PER_STAGE, ACT_BPE, WEIGHT_BPE, PEAK, GEMM_PEAK, MEMORY_BPS, COMPUTE_EFF, GEMM_HALF, DENSE_FLOPS, DENSE_BYTES,
    ACT_BYTES, Q_DIM, KV_DIM, PREFILL_ATTN_FLOPS, DECODE_FLOPS, DECODE_BYTES, EXPERT_SHARE, LM_HEAD, COLL_S_PER_TOKEN,
    COLL_LATENCY, LARGE_COLL_S_PER_TOKEN, LARGE_COLL_LATENCY, A2A_S_PER_TOKEN, A2A_LATENCY, DECODE_A2A_S_PER_TOKEN,
    DECODE_A2A_LATENCY, HOP_S_PER_TOKEN, HOP_LATENCY, DP, PP, DIVIDES, GPU_LAUNCH, HOST_LAUNCH,
    PACKED, CLOCK_SLOWDOWN, CAPPED_SLOWDOWN, GEMM_BPS, GEMM_PASS_S, GEMM_LATENCY, PREFILL_ATTN_HALF, PREFILL_ATTN_LATENCY,
    PREFILL_ATTN_S_PER_SEQ, PREFILL_ATTN_RAMP, PREFILL_ATTN_TILE, KV_BPS, DECODE_ATTN_HALF, DECODE_ATTN_EFF, DECODE_ATTN_S_PER_SEQ,
    DECODE_ATTN_LATENCY, MOE_COMPUTE_EFF, MOE_HALF, MOE_BPS, MOE_LATENCY, MOE_S_PER_ROW, MOE_S_PER_TOKEN, MOE_LOAD_SPREAD,
    MOE_LOAD_CAP, MOE_ROUTING_ALPHA, KNEE_SLOWDOWN, KNEE_TOKENS, MOE_EFF, ATTN_EFF,
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


cdef inline double _ramped(double efficiency, double half, double rows) noexcept nogil:
    """An efficiency ramped by the rows a GEMM has: efficiency x rows / (rows + half)."""
    return efficiency * rows / (rows + half)


cdef inline double _power_integral(double lo, double hi, double e) noexcept nogil:
    """The integral of x^(e - 1) from lo to hi (e != 0): the power-law loads' moments, unnormalized."""
    return (pow(hi, e) - pow(lo, e)) / e


cdef inline double _table_load(const double* c, double tokens) noexcept nogil:
    """The rows the busiest expert group gets over the mean group's, routed as NVIDIA's MoE tables
    are (perf.curves.table_load)."""
    cdef double alpha = c[MOE_ROUTING_ALPHA], lo = 0.01, hi = 2.0
    if tokens * c[TOP_K] > c[EXPERTS]:
        lo, hi = 1.0, 0.8 * tokens
    hi = max(hi, lo)
    cdef double scale = _power_integral(lo, hi, 1 - alpha), first = _power_integral(lo, hi, 2 - alpha)
    cdef double second = _power_integral(lo, hi, 3 - alpha)
    cdef double variation = sqrt(max(second * scale / max(first * first, 1e-300) - 1, 0.0))
    return min(1 + c[MOE_LOAD_SPREAD] * variation, c[MOE_LOAD_CAP])


cdef inline double _busiest_load(const double* c, double tokens) noexcept nogil:
    """The tables' load in serving, never fewer rows than at T k = E (perf.curves.busiest_load); 1
    where no curve times the experts (a spread of 0)."""
    if c[MOE_LOAD_SPREAD] == 0:
        return 1.0
    cdef double switch = c[EXPERTS] / c[TOP_K], load = _table_load(c, tokens)
    if tokens > switch:
        load = max(load, _table_load(c, switch) * switch / max(tokens, 1.0))
    return load


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
    cdef double experts, top_k, load_tok, touched, rows, group_pre, group_prompts, pre_sq, ctx, group_decode, tiled
    cdef int k
    for k in range(5):  # operator classes: dense GEMMs, routed experts, prefill attention, decode attention, LM head
        # beside the roofline: fixed_s (kernel latency, per sequence) and extra_s (compute-side: activation passes, ramp)
        bandwidth, fixed_s, extra_s = c[GEMM_BPS], 0.0, 0.0
        if k == 0:
            class_flops, class_bytes = a_tok * c[DENSE_FLOPS], c[DENSE_BYTES] + a_tok * c[ACT_BYTES]
            class_peak = gemm_peak * _ramped(c[COMPUTE_EFF], c[GEMM_HALF], safe_tok)
            fixed_s, extra_s = c[GEMM_LATENCY], a_tok * c[GEMM_PASS_S]
        elif k == 1:
            if not c[IS_MOE]:
                continue
            # the busiest expert group's tokens: its experts see `load` times the mean group's
            experts, top_k, load_tok = c[EXPERTS], c[TOP_K], n_tok * _busiest_load(c, n_tok)
            touched = experts * (1 - pow(1 - top_k / experts, load_tok))
            rows = max(load_tok * top_k / max(touched, 1e-9), 1.0)
            class_flops = 2 * load_tok * top_k * c[EXPERT_PARAMS] * c[EXPERT_SHARE]
            class_bytes = touched * c[EXPERT_PARAMS] * c[WEIGHT_BPE] * c[EXPERT_SHARE]
            class_peak = gemm_peak * _ramped(c[MOE_COMPUTE_EFF], c[MOE_HALF], rows) * c[MOE_EFF]
            bandwidth, fixed_s = c[MOE_BPS], c[MOE_LATENCY]
            extra_s = load_tok * top_k * (c[EXPERT_SHARE] * c[MOE_S_PER_ROW]) + a_tok * top_k * c[MOE_S_PER_TOKEN]
        elif k == 2:
            group_pre = pre_tok / groups
            pre_sq = group_pre * group_pre if c[PACKED] else prefill_sq_tokens * micro / groups
            class_flops = pre_sq * c[PREFILL_ATTN_FLOPS]
            class_bytes = group_pre * (2 * c[Q_DIM] + 2 * c[KV_DIM]) * c[ACT_BPE]
            class_peak, bandwidth = peak * c[ATTN_EFF], c[MEMORY_BPS]
            group_prompts = prefill_seqs * micro / groups
            fixed_s = c[PREFILL_ATTN_LATENCY] * has_prefill + c[PREFILL_ATTN_S_PER_SEQ] * group_prompts
            extra_s = c[PREFILL_ATTN_HALF] * group_pre * c[PREFILL_ATTN_FLOPS] / class_peak  # the ramp over short prompts
            # query tiles short of filling the SMs (perf.curves.context_attention_s), counted in tokens
            tiled = group_pre + group_prompts * c[PREFILL_ATTN_TILE] / 2
            if tiled > 0:
                extra_s = extra_s + (class_flops / class_peak + extra_s) * c[PREFILL_ATTN_RAMP] / tiled
        elif k == 3:
            ctx = decode_context_tokens * micro / groups
            class_flops, class_bytes, class_peak = ctx * c[DECODE_FLOPS], ctx * c[DECODE_BYTES], peak * c[DECODE_ATTN_EFF]
            group_decode = decode_seqs * micro / groups
            bandwidth = c[KV_BPS]  # (read slower while few sequences fill the SMs: perf.curves.decode_attention_s)
            if group_decode > 0:
                bandwidth = bandwidth * (group_decode / (group_decode + c[DECODE_ATTN_HALF]))
            fixed_s = c[DECODE_ATTN_S_PER_SEQ] * group_decode + c[DECODE_ATTN_LATENCY] * (1.0 if group_decode > 0 else 0.0)
        else:  # one row per sequence (the last prompt token, or the decoded token)
            class_flops, class_bytes = 2 * n_seq * c[LM_HEAD] / layers, c[LM_HEAD] * c[WEIGHT_BPE] / layers
            class_peak = gemm_peak * _ramped(c[COMPUTE_EFF], c[GEMM_HALF], max(n_seq, 1.0))
        tc = layers * class_flops / class_peak + layers * (fixed_s + extra_s)
        tm = layers * class_bytes / bandwidth + layers * fixed_s
        compute_s = compute_s + tc * (tc > tm)
        memory_s = memory_s + tm * (tc <= tm)
        flops = flops + layers * class_flops
        nbytes = nbytes + layers * class_bytes
    # two TP all-reduces per layer, each by the faster of the engine's small- and large-message algorithms
    cdef double network_s = 2 * layers * min(a_tok * c[COLL_S_PER_TOKEN] * knee + c[COLL_LATENCY],
                                             a_tok * c[LARGE_COLL_S_PER_TOKEN] * knee + c[LARGE_COLL_LATENCY])
    # expert all-to-alls (the busiest group sends; a decode-only pass by the engine's decode kernels) and pipeline hops
    cdef double a2a_s = c[A2A_S_PER_TOKEN] if has_prefill > 0 else c[DECODE_A2A_S_PER_TOKEN]
    cdef double a2a_latency_s = c[A2A_LATENCY] if has_prefill > 0 else c[DECODE_A2A_LATENCY]
    if c[DIVIDES] > 0:
        network_s = (network_s + layers * (n_tok * a2a_s * c[DP] / groups + a2a_latency_s)
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


cdef inline void _count_lookup(int64_t[:, :] counts, Py_ssize_t k, double x, double lowest, double highest) noexcept:
    """A measured table's lookup at `x` (counts[k, 0]), and whether it lies outside the measured
    [lowest, highest] (counts[k, 1]: extrapolated)."""
    counts[k, 0] += 1
    counts[k, 1] += x < lowest or x > highest


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
    cdef Heap ends  # (time, instance, -1): a pass ends; (time, instance, request): the request's prefix is loaded
    cdef Heap least  # (load, instance): routing past heap_past instances
    # with prefix caches: the tree, a cache per instance, each request's node and whether it was
    # looked up, per instance type its KV capacity and host loads' seconds per token, per instance
    # when its host link is free
    cdef _Tree tree
    cdef Cache* caches
    cdef Py_ssize_t cache_count
    cdef const int64_t[:] node, kv_cap, instances  # (instances: 0, 1, ..., each its cache's index)
    cdef const double[:] load_s_per_token
    cdef int64_t[:] looked
    cdef double[:] host_free
    cdef bint prefix_aware
    # with measured types: per type whether it is, its pass's time by prompt tokens (its decodes riding
    # along), the measured range of the table's tokens, and its lookups and those outside it
    cdef const int64_t[:] is_measured
    cdef const double[:, :] measured, measured_range
    cdef int64_t[:, :] counts

    def __dealloc__(self):
        heap_free(&self.ends)
        heap_free(&self.least)
        cdef Py_ssize_t j
        for j in range(self.cache_count):
            cache_free(&self.caches[j])
        free(self.caches)

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

    cdef int ready(self, Py_ssize_t j, int64_t r, int64_t before, double now) except -1:
        """Request r's prefill comes up on instance j (after `before` in its queue, -1 for the head):
        its cache's hit counts as prefilled (pinned); 0 when part of it is in host memory: it leaves
        the queue until that is loaded (a heap entry)."""
        self.looked[r] = 1
        if self.node[r] < 0:
            return 1
        cdef int64_t loaded
        self.done[r] = self.tree.match(&self.caches[j], self.node[r], self.tokens[r], &loaded)
        self.tree.pin(&self.caches[j], self.node[r])
        if not loaded:
            return 1
        self.host_free[j] = max(now, self.host_free[j]) + loaded * self.load_s_per_token[self.kind[j]]
        heap_push(&self.ends, self.host_free[j], j, 0, 0, r)
        if before < 0:  # (out of the queue)
            self.first[j] = self.after[r]
        else:
            self.after[before] = self.after[r]
        if self.last[j] == r:
            self.last[j] = before
        return 0

    cdef int take(self, Py_ssize_t j, double now, int64_t* out) except -1:
        """The next pass on instance j from its queue's head: (prompts it completes, prompts or
        chunks in it, its prompt tokens, their squares' sum as attention counts them, the completed
        prompts' tokens). Whole prompts (less what a prefix cache holds) up to the budget (at least
        one), or, `chunked`, the budget's tokens from the head, the last prompt split (`done` counts
        what earlier chunks prefilled and a cache held); async scheduling holds back requests queued
        after the running pass's successor was scheduled. A head whose prefix is in host memory
        leaves the queue (`ready`)."""
        cdef int64_t count = 0, seqs = 0, total = 0, sq = 0, whole = 0, room = self.max_batch_tokens, size, d, c, nxt
        cdef int64_t r = self.first[j], before = -1
        while r >= 0:
            size = self.tokens[r]
            if ((room <= 0 or seqs >= self.cap or self.tag[r] >= self.launch[j]) if self.chunked
                    else (count and self.tag[r] >= self.launch[j])):
                break
            if self.cache_count and not self.looked[r]:
                nxt = self.after[r]
                if not self.ready(j, r, before, now):
                    r = nxt
                    continue
            d = self.done[r]
            if self.chunked:
                c = min(size - d, room)
                total += c
                sq += (d + c) * (d + c) - d * d  # causal attention of c new tokens over d + c
                self.done[r] = d + c
                room -= c
                seqs += 1
                if d + c < size:
                    break
            else:
                if count and (total + size - d > self.max_batch_tokens or count >= self.cap):
                    break
                total += size - d
                sq += size * size - d * d
                seqs += 1
            count += 1
            whole += size
            before = r
            r = self.after[r]
        out[0], out[1], out[2], out[3], out[4] = count, seqs, total, sq, whole
        return 0

    cdef double measured_pass_s(self, int64_t k, int64_t tokens) except -1.0:
        """A measured type's pass of `tokens` prompt tokens (its decodes riding along), counted."""
        if tokens >= self.measured.shape[1]:
            raise ValueError(f"a pass of {tokens} prompt tokens is past the measured table's {self.measured.shape[1]}")
        _count_lookup(self.counts, k, tokens + self.decode[k, 0], self.measured_range[k, 0], self.measured_range[k, 1])
        return self.measured[k, tokens]

    cdef int start(self, Py_ssize_t j, double now) except -1:
        """Instance j (idle, its queue not empty) begins its next pass at `now`, if one forms (every
        head may go to load its prefix; requests held back by async scheduling then join at once)."""
        cdef int64_t r
        cdef int64_t taken[5]
        if self.deferring and self.tag[self.first[j]] >= self.launch[j]:  # nothing was scheduled after all: all join now
            r = self.first[j]
            while r >= 0:
                self.tag[r] = -1
                r = self.after[r]
        self.take(j, now, taken)
        if not taken[1]:
            if self.deferring and self.first[j] >= 0:
                return self.start(j, now)
            return 0
        self.run_first[j], self.run_count[j], self.run_whole[j] = self.first[j], taken[0], taken[4]
        cdef int64_t m
        for m in range(taken[0]):
            self.first[j] = self.after[self.first[j]]
        if self.first[j] < 0:
            self.last[j] = -1
        cdef int64_t k = self.kind[j]
        cdef double duration
        if self.is_measured.shape[0] and self.is_measured[k]:
            duration = self.measured_pass_s(k, taken[2])
        else:
            duration = _pass_time_s(&self.vectors[k, 0], <double> taken[1], <double> taken[2], <double> taken[3],
                                    self.decode[k, 0], self.decode[k, 1])
        self.running[j] = 1
        if self.deferring:
            self.launch[j] += 1
            self.fixed[j] = self.first[j] >= 0
        self.busy[self.written, 0], self.busy[self.written, 1], self.busy[self.written, 2] = now, duration, j
        self.written += 1
        heap_push(&self.ends, now + duration, j, 0, 0, -1)
        return 0

    cdef int end_passes(self, double now) except -1:
        """Every pass that ends by `now` (one ending at an arrival's time before it is routed): its
        completed prompts get their first token, and its instance starts its next pass."""
        cdef Entry e
        cdef Py_ssize_t j
        cdef int64_t r, m
        cdef Cache* c
        cdef int64_t room
        while self.ends.size and self.ends.items[0].t <= now:
            e = heap_pop(&self.ends)
            j = e.key
            if e.i >= 0:  # a request's prefix is back from host memory: at the head of the queue
                self.after[e.i], self.first[j], self.tag[e.i] = self.first[j], e.i, -1
                if self.last[j] < 0:
                    self.last[j] = e.i
                if not self.running[j]:
                    self.start(j, e.t)
                continue
            r = self.run_first[j]
            for m in range(self.run_count[j]):
                self.finish_s[r] = e.t
                r = self.after[r]
            if self.cache_count:  # computed: kept, and no longer in use (its KV leaves for its token instance)
                c = &self.caches[j]
                r = self.run_first[j]
                for m in range(self.run_count[j]):
                    if self.node[r] >= 0:
                        self.tree.insert(c, self.node[r], e.t)
                        self.tree.unpin(c, self.node[r], e.t)
                    r = self.after[r]
                room = self.kv_cap[self.kind[j]] - (c.resident_tokens - c.free_tokens)
                if c.free_tokens > room:
                    self.tree.evict(c, room)
            self.add_load(j, -self.run_whole[j])
            self.running[j] = 0
            if self.first[j] >= 0:
                self.start(j, e.t)
        return 0


def prompt_replay(const double[:] arrival_s, const int64_t[:] tokens, const double[:, ::1] vectors, const int64_t[:] kind,
                  const double[:, :] decode, int64_t max_batch_tokens, bint chunked, int64_t cap, bint deferring,
                  const double[:] release_s, Py_ssize_t heap_past, prefix=None, measured=None):
    """(each request's prefill end, the passes as (start, duration, instance) rows, each request's
    instance, with `prefix` each cache's (hit, looked-up) tokens, else None, with `measured` each
    type's (lookups, outside the measured range), else None). Requests are routed at arrival to the instance of fewest pending prompt tokens (ties
    to the lowest index; from a heap past `heap_past` instances: the same picks), FCFS
    per instance in whole-prompt batches or, `chunked`, passes of the token budget; the engine's
    `max_num_seqs` (`cap`), its async scheduling (`deferring`) and the co-located estimate's held
    requests (`release_s`: empty, or when each request stops counting 1 in its instance's load).
    `vectors[k]` and `decode[k]` (decode requests and their context riding along in every pass) are
    instance type k's, `kind[j]` instance j's type. `prefix`: None, or the engine's prefix caches as
    (parent, tokens, depth per node of the trace's prefix tree, each request's node, the block
    tokens, per instance type its KV capacity, host tier (tokens) and host loads' seconds per
    token, prefix-aware routing). `measured`: None, or per instance type (whether a measured table
    times its passes, the table's pass time by prompt tokens with the type's decodes, the (least,
    most) tokens plus decodes measured)."""
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
    if prefix is not None:
        parent, node_tokens, depth, s.node, block, s.kv_cap, cpu_tokens, s.load_s_per_token, s.prefix_aware = prefix
        s.tree = _Tree()
        s.tree.setup(parent, node_tokens, depth, block)
        s.looked, s.host_free, s.instances = np.zeros(n_req, np.int64), np.zeros(n_inst), np.arange(n_inst, dtype=np.int64)
        s.caches = <Cache*> malloc(n_inst * sizeof(Cache))
        if s.caches == NULL:
            raise MemoryError()
        for j in range(n_inst):
            cache_init(&s.caches[j], cpu_tokens[kind[j]])
            s.cache_count += 1
    counts = None
    if measured is not None:
        s.is_measured, s.measured, s.measured_range = measured
        counts = np.zeros((len(s.is_measured), 2), np.int64)
        s.counts = counts
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
            if s.prefix_aware and s.node[i] >= 0:
                j = s.tree.cheapest(s.caches, s.instances, s.load, s.node[i], tokens[i])
            else:
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
    stats = None if prefix is None else [(s.caches[j].hit_tokens, s.caches[j].lookup_tokens) for j in range(n_inst)]
    return finish_s, busy[:s.written], placed, stats, counts


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
# iterations run one by one, so `EVENTS` counts every iteration end.

cpdef enum:  # per-request integer rows (DEFERRED_TO: the list a request deferred by async scheduling joins)
    NEXT, PREV, AFTER, FINISH_ITER, DEFERRED_AT, DEFERRED_TO, PLEN, BASE, DONE, RESUMED, JOIN_ITER, P_INST, T_INST, REJECTED,
    REFUSED, CACHED, LOOKED, PINNED, PREFIX_NODE, REQUEST_ROWS

cpdef enum:  # per-request float rows
    TTFT, E2E, STALL, PREEMPTED_AT, REJOINED, PREFILL_START, KV_READY, JOIN_TIME, TIME_ROWS

cpdef enum:  # per-instance integer columns: four lists (head, tail, length), then the rest
    QUEUE = 0
    WAITING = 3
    DEFERRED = 6
    RUN = 9
    MEMBERS_HEAD = 12
    MEMBERS_TAIL, BATCH, CTX, KV_USED, KV_COMMITTED, ITERS, RUNNING, FIXED, LAUNCH, NEXT_FINISH, ROLE, POOL, P_POS,
    T_POS, NODE, INSTANCE_COLUMNS

cpdef enum:  # per-instance float columns
    PREFILL_S, DECODE_S, INTEGRAL, LINK_FREE, HOST_FREE, CLOCK_COLUMNS

cpdef enum:  # per-pool integer settings (MEASURED: its passes with prompt work timed from `measured`, not the formula)
    KV_CAP, MAX_REQUEST, CHUNKED, DEFERRING, LAYERWISE_MIN, MEASURED

cpdef enum:  # per-pool float settings (CPU_TOKENS: the host tier of a prefilling instance's prefix cache;
    # LOAD_S_PER_TOKEN: loading from it; with MEASURED: MIXED_FACTOR, a pass's time with decodes in it over the
    # table's, and the measured ranges: the passes' tokens, decode batches and context per decode, outside
    # which a table's value is extrapolated, and counted)
    LINK_BPS, KV_LATENCY_S, CPU_TOKENS, LOAD_S_PER_TOKEN, MIXED_FACTOR, TOKENS_LO, TOKENS_HI, BATCH_LO, BATCH_HI,
    CONTEXT_LO, CONTEXT_HI

cpdef enum:  # per measured pool, what its tables were asked, and how often outside their ranges (the prefill's
    # first: _count_lookup's columns)
    PREFILL_QUERIES, PREFILL_OUTSIDE, DECODE_QUERIES, DECODE_OUTSIDE, MEASURED_COUNTS

cpdef enum:  # run-wide integer settings (CLOSED: a closed loop's clients, 0 for an open loop; LOG: keep the event log;
    # CACHING: a prefix cache per instance, reused in blocks of BLOCK tokens; PREFIX_AWARE: routing by it;
    # RECORD: keep every iteration's pass, `passes`; BORROW: the mixed pool's threshold in prompt tokens, -1 for none)
    MAX_BATCH_TOKENS, CAP, MAX_ITERATIONS, CONTEXT, LAYERS, ROUND_ROBIN, CLOSED, LOG, CACHING, BLOCK, PREFIX_AWARE, RECORD,
    BORROW, SETTINGS

cpdef enum:  # (RELEASED: requests whose arrival time is known; LOGGED: events in the log; RECORDED: passes kept)
    ITERATIONS, TOKENS_OUT, PREEMPTIONS, EVENTS, ENDS, SEQ, TURN_P, TURN_T, RELEASED, LOGGED, RECORDED, COUNTERS

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
    PREFIX_LOADED = 4


def initial_state(prompt, cached, prefix_node, roles, pool, p_pos, t_pos, node):
    """(req, times, inst) for `run` before any event: per request (its prompt tokens, those a cache
    holds, the node its prefix ends at in the trace's prefix tree, -1 for none), per instance (role
    names, pool index, position among those that prefill and those that decode, -1 for none, and
    the machine it shares with the other role's instances, -1 for none)."""
    n = len(prompt)
    req = np.zeros((REQUEST_ROWS, n), np.int64)
    req[PLEN], req[BASE], req[DONE], req[CACHED] = prompt, 1, cached, cached
    req[JOIN_ITER], req[P_INST], req[T_INST], req[PINNED], req[PREFIX_NODE] = -1, -1, -1, -1, prefix_node
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
    cdef const double[:, :] pools_s, single, local_bps, measured
    cdef int64_t[:, :] counts  # per pool, MEASURED_COUNTS
    cdef const double[:, :, :] lines
    cdef const double[:, ::1] vectors
    cdef const int64_t[:] settings
    cdef double kv_bytes
    cdef int64_t[:] p_load, t_load, prompt_side, token_side, counters
    cdef double[:] ends_s
    cdef int64_t[:] ends_at
    cdef double[:] log_s
    cdef int64_t[:, :] log_at  # per event: its kind, instance and request (-1: none)
    cdef double[:, :] passes  # with RECORD, per iteration: prompts, their tokens, squares, decode batch, context, 1, end
    cdef Heap heap
    cdef _Tree tree  # with CACHING: the prefix tree, and a cache per instance
    cdef Cache* caches
    cdef Py_ssize_t cache_count

    def __dealloc__(self):
        heap_free(&self.heap)
        cdef Py_ssize_t k
        for k in range(self.cache_count):
            cache_free(&self.caches[k])
        free(self.caches)

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
        self.inst[k, KV_COMMITTED] -= self.prompt[i] + self.out[i]
        if self.inst[k, ROLE] == MIXED:
            self.p_load[self.inst[k, P_POS]] -= 1
        if self.inst[k, T_POS] >= 0:
            self.t_load[self.inst[k, T_POS]] -= self.out[i]

    cdef int preempt(self, Py_ssize_t k, double now) except -1:
        """The newest decode is preempted (its KV freed) and waits at the head of the line to be
        recomputed, its prompt and output so far, then decodes on."""
        cdef int64_t v = self.inst[k, MEMBERS_TAIL]
        self.unlink(k, v)
        cdef int64_t have = self.req[BASE, v] + self.inst[k, ITERS] - self.req[JOIN_ITER, v]
        self.inst[k, BATCH] -= 1
        self.inst[k, CTX] -= self.prompt[v] + have
        self.req[PLEN, v], self.req[BASE, v], self.req[DONE, v] = self.prompt[v] + have, have, 0
        self.req[RESUMED, v] = 1
        self.unpin(k, v, now)  # (its prefix stays cached, evictable, until it is recomputed)
        self.req[LOOKED, v] = 0
        self.times[PREEMPTED_AT, v] = now
        self.counters[PREEMPTIONS] += 1
        self.p_load[self.inst[k, P_POS]] += self.req[PLEN, v]
        self.push_front(k, WAITING, v)
        return 0

    cdef int admit(self, Py_ssize_t k, double now) except -1:
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
                self.unpin(k, i, now)
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
        return 0

    cdef void release(self, Py_ssize_t k, int64_t before) noexcept:
        """Requests deferred by async scheduling that arrived in an iteration before `before` join
        the line they were headed for (DEFERRED_TO): the wait for KV room, or the prompt queue."""
        cdef int64_t i
        while self.inst[k, DEFERRED + 2] and self.req[DEFERRED_AT, self.inst[k, DEFERRED]] < before:
            i = self.pop(k, DEFERRED)
            self.push(k, self.req[DEFERRED_TO, i], i)

    cdef void defer(self, Py_ssize_t k, int64_t i, int line) noexcept:
        """Async scheduling: k's next iteration is already scheduled; request i joins `line` after it."""
        self.req[DEFERRED_AT, i], self.req[DEFERRED_TO, i] = self.inst[k, LAUNCH], line
        self.push(k, DEFERRED, i)

    cdef int whole_prompts(self, Py_ssize_t k, double now, int64_t* taken) except -1:
        """(prompts, tokens, squared tokens) of a whole-prompt pass: prompts from the queue's head
        (less what the prefix cache holds) up to the budget, at least one."""
        cdef int64_t count = 0, total = 0, sq = 0, h, i, d
        cdef int64_t max_batch_tokens = self.settings[MAX_BATCH_TOKENS], cap = self.settings[CAP]
        while self.ready(k, now) if self.settings[CACHING] else self.inst[k, QUEUE + 2]:
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
        return 0

    cdef int chunks(self, Py_ssize_t k, double now, int64_t* taken) except -1:
        """(prompts or chunks, tokens, squared tokens) of a chunked pass: the decodes first, then
        prompt tokens from the queue's head up to the budget, the last prompt split."""
        cdef int64_t total = 0, sq = 0, chunks = 0, i, d, c
        cdef int64_t room = self.settings[MAX_BATCH_TOKENS] - self.inst[k, BATCH], cap = self.settings[CAP]
        while room > 0 and chunks < cap and (self.ready(k, now) if self.settings[CACHING] else self.inst[k, QUEUE + 2]):
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
        return 0

    cdef double pass_s(self, Py_ssize_t k, int64_t chunks, int64_t total, int64_t sq) noexcept:
        """The time of instance k's pass (-1.0: it outgrew `lines` or `measured`)."""
        cdef int64_t pool = self.inst[k, POOL], batch = self.inst[k, BATCH], first
        cdef double duration, base, per_token, slack, attention
        if chunks:
            first = self.inst[k, RUN]
            if chunks == 1 and batch == 0 and first >= 0 and total == self.prompt[first] and not self.req[RESUMED, first]:
                duration = self.single[pool, first]  # one whole prompt alone: its time is known
            elif self.pools[pool, MEASURED]:
                duration = self.measured_pass_s(pool, total, batch)
                if duration < 0.0:
                    return -1.0
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
        if self.pools[pool, MEASURED]:
            self.count_decode(pool, batch, self.inst[k, CTX])
        self.clock[k, DECODE_S] += duration
        return duration

    cdef double measured_pass_s(self, int64_t pool, int64_t total, int64_t batch) noexcept:
        """A measured pool's pass of `total` prompt tokens beside `batch` decodes: the table's time at
        their sum (as a prompt of that many tokens), counted (-1.0 past the table)."""
        cdef int64_t x = total + batch
        if x >= self.measured.shape[1]:
            return -1.0
        _count_lookup(self.counts, pool, <double> x, self.pools_s[pool, TOKENS_LO], self.pools_s[pool, TOKENS_HI])  # (PREFILL_QUERIES, PREFILL_OUTSIDE)
        return self.measured[pool, x] * (self.pools_s[pool, MIXED_FACTOR] if batch > 0 else 1.0)

    cdef void count_decode(self, int64_t pool, int64_t batch, int64_t ctx) noexcept:
        """A measured pool's decode step, counted outside the measured batches or context per decode."""
        cdef double b = <double> batch, per_request = <double> ctx / <double> batch
        self.counts[pool, DECODE_QUERIES] += 1
        self.counts[pool, DECODE_OUTSIDE] += (b < self.pools_s[pool, BATCH_LO] or b > self.pools_s[pool, BATCH_HI]
                                              or per_request < self.pools_s[pool, CONTEXT_LO]
                                              or per_request > self.pools_s[pool, CONTEXT_HI])

    cdef int start(self, Py_ssize_t k, double now) except -1:
        """Begin instance k's next iteration, if it has work (BATCH_PAST_TABLE if its pass outgrew
        `lines` or `measured`, else OK)."""
        cdef int64_t pool = self.inst[k, POOL], role = self.inst[k, ROLE], batch
        cdef int64_t taken[3]
        while (role == MIXED and self.inst[k, BATCH] > 1
               and self.inst[k, KV_USED] + self.inst[k, CTX] + self.inst[k, BATCH] > self.pools[pool, KV_CAP]):
            self.preempt(k, now)
        taken[0] = taken[1] = taken[2] = 0
        if self.inst[k, QUEUE + 2]:  # (a token instance's only while lent to prefill: BORROW)
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
        if self.settings[RECORD]:
            self.record(taken, batch, self.inst[k, CTX], now + duration)
        self.inst[k, RUNNING] = 1
        if self.pools[pool, DEFERRING]:  # the next iteration is scheduled now if there is work beyond this one
            self.inst[k, LAUNCH] += 1
            self.inst[k, FIXED] = (batch > 0 or self.inst[k, QUEUE + 2] > 0 or self.inst[k, WAITING + 2] > 0
                                   or self.inst[k, DEFERRED + 2] > 0 or (self.inst[k, RUN + 2] > 0 and role == MIXED))
        self.counters[SEQ] += 1
        heap_push(&self.heap, now + duration, self.counters[SEQ], ITERATION_END, k, -1)
        return OK

    cdef int send_kv(self, Py_ssize_t k, Py_ssize_t tok, int64_t i, int64_t sent, double now) except -1:
        """Request i's KV leaves prompt instance k for token instance tok over both links (FIFO):
        after the prefill when short, else layer by layer from the prefill's start; on one machine,
        over its GPU links, the NICs free. `sent`: the prompt's tokens the token instance's cache lacks."""
        cdef int64_t source = self.inst[k, POOL], destination = self.inst[tok, POOL]
        cdef bint local = self.inst[k, NODE] >= 0 and self.inst[k, NODE] == self.inst[tok, NODE]
        cdef double duration = sent * self.kv_bytes / (
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
            self.keep(k, i, now)
            self.inst[k, KV_USED] -= self.req[PLEN, i]
            self.req[BASE, i] += 1
            if self.req[BASE, i] == self.out[i]:  # that was its last token
                self.finish(i, now)
                self.unassign(k, i)
                self.unpin(k, i, now)
            else:
                self.join(k, i, now)
            self.req[RESUMED, i] = 0
            return 0
        self.times[TTFT, i] = now - self.arrival[i]
        tok = self.req[T_INST, i]
        self.keep(k, i, now)  # (in use while it decodes here)
        if self.out[i] == 1 or tok != k:
            self.unpin(k, i, now)
        if self.out[i] == 1:  # the first token was the whole answer
            if self.inst[k, ROLE] == MIXED:  # (its prompt's KV, held since admission, freed)
                self.inst[k, KV_USED] -= self.req[PLEN, i]
            self.finish(i, now)
            self.unassign(tok, i)
            return 0
        if tok == k:
            self.times[KV_READY, i] = now
            if self.inst[k, ROLE] == MIXED:  # co-located: its KV held since admission, now counted in the batch's context
                self.inst[k, KV_USED] -= self.req[PLEN, i]
                self.join(k, i, now)
            else:  # an instance lent to the other role (BORROW): its KV is here, admitted as an arrival's
                self.push(k, WAITING, i)
            return 0
        cdef int64_t sent = self.prompt[i], loaded
        if self.settings[CACHING] and self.req[PREFIX_NODE, i] >= 0:  # the blocks the token instance holds are not sent
            sent -= self.tree.match(&self.caches[tok], self.req[PREFIX_NODE, i], self.prompt[i], &loaded)
            self.pin(tok, i)
        self.send_kv(k, tok, i, sent, now)
        return 0

    cdef int finish_decodes(self, Py_ssize_t k, double now) except -1:
        """The decodes whose last token this iteration gave leave the batch."""
        cdef int64_t iters = self.inst[k, ITERS], soonest = INT64_MAX, after
        cdef int64_t i = self.inst[k, MEMBERS_HEAD]
        while i >= 0:
            after = self.req[AFTER, i]
            if self.req[FINISH_ITER, i] == iters:
                self.unlink(k, i)
                if self.inst[k, ROLE] != MIXED:
                    self.inst[k, KV_USED] -= self.prompt[i] + self.out[i]
                    self.keep(k, i, now)  # (a token instance: the prompt it received)
                self.unpin(k, i, now)
                self.inst[k, BATCH] -= 1
                self.inst[k, CTX] -= self.prompt[i] + self.out[i]
                self.unassign(k, i)
                self.finish(i, now)
            else:
                soonest = min(soonest, self.req[FINISH_ITER, i])
            i = after
        self.inst[k, NEXT_FINISH] = soonest
        return 0

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
            if how == AFTER_ITERATION and not attempt and self.settings[CACHING]:
                self.cache_room(k)
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
            if self.inst[k, P_POS] >= 0:  # a prompt stays pending on its instance until its prefill completes
                self.p_load[self.inst[k, P_POS]] -= self.req[PLEN, i]
            self.prefill_done(k, i, now)
            i = after
        self.inst[k, RUN], self.inst[k, RUN + 1], self.inst[k, RUN + 2] = -1, -1, 0
        return OK

    cdef bint kv_arrived(self, Py_ssize_t k, int64_t i, double now) noexcept:
        """Request i's KV reached token instance k: it waits to join the batch. Whether k is idle
        (then settled: ADMIT_THEN_START)."""
        self.times[KV_READY, i] = now
        if self.inst[k, RUNNING] and self.inst[k, FIXED]:  # async scheduling: the next iteration is already scheduled
            self.defer(k, i, WAITING)
            return False
        self.push(k, WAITING, i)
        return not self.inst[k, RUNNING]

    # -- the prefix caches (with CACHING)

    cdef int keep(self, Py_ssize_t k, int64_t i, double now) except -1:
        """Request i's prompt KV is computed (or received) on k: its cache keeps it."""
        if self.settings[CACHING] and self.req[PREFIX_NODE, i] >= 0:
            self.tree.insert(&self.caches[k], self.req[PREFIX_NODE, i], now)
        return 0

    cdef int pin(self, Py_ssize_t k, int64_t i) except -1:
        self.tree.pin(&self.caches[k], self.req[PREFIX_NODE, i])
        self.req[PINNED, i] = k
        return 0

    cdef int unpin(self, Py_ssize_t k, int64_t i, double now) except -1:
        """Request i no longer uses its prefix on k (its KV left the instance): evictable."""
        if self.req[PINNED, i] == k:
            self.tree.unpin(&self.caches[k], self.req[PREFIX_NODE, i], now)
            self.req[PINNED, i] = -1
        return 0

    cdef int lookup(self, Py_ssize_t k, int64_t i, double now) except -1:
        """When request i's prefill first comes up, the leading tokens k's cache holds count as
        prefilled, pinned (1); 0 when some are in host memory, loaded over the host link (FIFO)
        first (a PREFIX_LOADED event). A recomputed request skips what the GPU tier still holds."""
        if self.req[LOOKED, i]:
            return 1
        self.req[LOOKED, i] = 1
        cdef int64_t node = self.req[PREFIX_NODE, i], hit, loaded
        if node < 0:
            return 1
        if self.req[RESUMED, i]:
            self.req[DONE, i] = self.tree.resident(&self.caches[k], node, self.prompt[i])
            self.pin(k, i)
            return 1
        hit = self.tree.match(&self.caches[k], node, self.prompt[i], &loaded)
        self.req[CACHED, i] = self.req[DONE, i] = hit
        self.pin(k, i)
        if not loaded:
            return 1
        self.clock[k, HOST_FREE] = (max(now, self.clock[k, HOST_FREE])
                                    + loaded * self.pools_s[self.inst[k, POOL], LOAD_S_PER_TOKEN])
        self.counters[SEQ] += 1
        heap_push(&self.heap, self.clock[k, HOST_FREE], self.counters[SEQ], PREFIX_LOADED, k, i)
        return 0

    cdef int ready(self, Py_ssize_t k, double now) except -1:
        """Whether k's prompt queue has a head to prefill now, its prefix looked up (`lookup`)."""
        while self.inst[k, QUEUE + 2]:
            if self.lookup(k, self.inst[k, QUEUE], now):
                return 1
            self.pop(k, QUEUE)  # (back at the head once its prefix is loaded)
        return 0

    cdef int cache_room(self, Py_ssize_t k) except -1:
        """k's cache keeps what the running requests leave of its KV memory."""
        cdef Cache* c = &self.caches[k]
        cdef int64_t role = self.inst[k, ROLE], held
        held = (self.inst[k, KV_USED] + self.inst[k, CTX] if role == MIXED else self.inst[k, KV_USED] if role == TOKEN
                else c.resident_tokens - c.free_tokens)
        cdef int64_t limit = self.pools[self.inst[k, POOL], KV_CAP] - held
        if c.free_tokens > limit:
            self.tree.evict(c, limit)
        return 0

    cdef void route(self, int64_t i, Py_ssize_t* src, Py_ssize_t* dst) noexcept:
        """(the instance that prefills a request, the one that decodes it): the least loaded of
        each side (ties to the lowest), or round-robin; a co-located instance does both; with BORROW,
        the mixed pool's choices (`mixed_pool_prompt`, `borrow`)."""
        cdef bint borrowing = self.settings[BORROW] >= 0
        if self.settings[PREFIX_AWARE] and self.req[PREFIX_NODE, i] >= 0:
            src[0] = self.prompt_side[self.tree.cheapest(self.caches, self.prompt_side, self.p_load, self.req[PREFIX_NODE, i],
                                                         self.prompt[i])]
        elif borrowing and self.inst[self.prompt_side[0], ROLE] != MIXED:
            src[0] = self.mixed_pool_prompt(i)
        elif self.settings[ROUND_ROBIN]:
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
        if borrowing:
            self.borrow(i, src, dst)

    # -- Splitwise's mixed pool (with BORROW): an instance lent to the other role when a resource is short

    cdef inline bint fits(self, Py_ssize_t k, int64_t need) noexcept:
        """Whether `need` more KV tokens fit beside what is committed to decode on k."""
        return self.inst[k, KV_COMMITTED] + need <= self.pools[self.inst[k, POOL], KV_CAP]

    cdef inline bint long_queue(self, Py_ssize_t k, int64_t i) noexcept:
        return self.inst[k, QUEUE + 2] > 0 and self.p_load[self.inst[k, P_POS]] + self.prompt[i] > self.settings[BORROW]

    cdef Py_ssize_t least_prompt(self, bint lent) noexcept:
        """The prompt instance with the fewest pending prompt tokens among those lent to decoding
        (holding KV committed) or those not; -1 for none."""
        cdef Py_ssize_t best = -1, j, x
        for j in range(self.prompt_side.shape[0]):
            x = self.prompt_side[j]
            if (self.inst[x, KV_COMMITTED] != 0) == lent and (best < 0 or self.p_load[j] < self.p_load[self.inst[best, P_POS]]):
                best = x
        return best

    cdef Py_ssize_t mixed_pool_prompt(self, int64_t i) noexcept:
        """Join-shortest-queue among the prompt instances not lent to decoding; a lent one only
        when every other queue is long."""
        cdef Py_ssize_t best = self.least_prompt(False), other
        if best < 0 or self.long_queue(best, i):
            other = self.least_prompt(True)
            if other >= 0 and (best < 0 or not self.long_queue(other, i)):
                best = other
        return best

    cdef Py_ssize_t lend_prompt(self, int64_t need) noexcept:
        """The prompt instance to decode a request no token instance has room for: one already lent
        with room (the fullest), else the one not lent with the fewest pending prompt tokens that
        could hold it; -1 for none."""
        cdef Py_ssize_t best = -1, j, x
        for j in range(self.prompt_side.shape[0]):
            x = self.prompt_side[j]
            if self.inst[x, KV_COMMITTED] and self.fits(x, need) and (best < 0 or self.inst[x, KV_COMMITTED] > self.inst[best, KV_COMMITTED]):
                best = x
        if best >= 0:
            return best
        for j in range(self.prompt_side.shape[0]):
            x = self.prompt_side[j]
            if (not self.inst[x, KV_COMMITTED] and need <= self.pools[self.inst[x, POOL], KV_CAP]
                    and (best < 0 or self.p_load[j] < self.p_load[self.inst[best, P_POS]])):
                best = x
        return best

    cdef void borrow(self, int64_t i, Py_ssize_t* src, Py_ssize_t* dst) noexcept:
        """Short of KV memory: the token instance with the most room, else a prompt instance lent to
        decode it; every prompt queue long: its token instance prefills it."""
        cdef int64_t need = self.prompt[i] + self.out[i], room, most = INT64_MIN
        cdef Py_ssize_t j, x, lent
        if not self.fits(dst[0], need):
            for j in range(self.token_side.shape[0]):
                x = self.token_side[j]
                room = self.pools[self.inst[x, POOL], KV_CAP] - self.inst[x, KV_COMMITTED]
                if room > most:
                    dst[0], most = x, room
            if not self.fits(dst[0], need):
                lent = self.lend_prompt(need)
                if lent >= 0:
                    dst[0] = lent
        if self.inst[dst[0], ROLE] == TOKEN and self.long_queue(src[0], i):
            src[0] = dst[0]

    cdef Py_ssize_t arrive(self, int64_t i, double now, int* how) noexcept:
        """Request i is routed, and refused (longer than max_model_len, or than a prompt instance's
        KV) or queued: the instance to settle (-1 for none), and how."""
        cdef Py_ssize_t src, dst
        self.route(i, &src, &dst)
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
        if self.inst[src, P_POS] >= 0:  # (a co-located one also counts the request held; a lent token instance, nothing)
            self.p_load[self.inst[src, P_POS]] += self.prompt[i] + (self.inst[src, ROLE] == MIXED)
        self.inst[dst, KV_COMMITTED] += self.prompt[i] + self.out[i]
        if self.inst[dst, T_POS] >= 0:
            self.t_load[self.inst[dst, T_POS]] += self.out[i]
        cdef int line = WAITING if self.inst[src, ROLE] == MIXED else QUEUE  # (co-located: prefilled once its KV is reserved)
        if self.inst[src, RUNNING] and self.inst[src, FIXED]:  # async scheduling: the next iteration is already scheduled
            self.defer(src, i, line)
            return src
        if line == WAITING:
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

    cdef int record(self, int64_t* taken, int64_t batch, int64_t ctx, double end) except -1:
        """One iteration's pass in `passes` (grown as it fills), as SimResult.passes holds it."""
        cdef int64_t at = self.counters[RECORDED]
        if at == self.passes.shape[0]:
            self.passes = np.concatenate((self.passes, self.passes))
        self.passes[at, 0], self.passes[at, 1], self.passes[at, 2] = taken[0], taken[1], taken[2]
        self.passes[at, 3], self.passes[at, 4], self.passes[at, 5], self.passes[at, 6] = batch, ctx, 1.0, end
        self.counters[RECORDED] += 1
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
                elif e.kind == PREFIX_LOADED:  # its prefix is back from host memory: it rejoins the head of the queue
                    self.push_front(k, QUEUE, e.i)
                    how = START
                else:
                    status = self.iteration_end(k, now)
                    how = AFTER_ITERATION
            self.counters[EVENTS] += 1
            if k >= 0 and status == OK:
                status = self.settle(k, now, how)
        return status


def run(double[:] arrival, double front_s, const int64_t[:] prompt, const int64_t[:] out, req, times, inst,
        pools, const double[:, :] pools_s, const double[:, :] local_bps, const int64_t[:] settings, double kv_bytes,
        const double[:, ::1] vectors, const double[:, :, :] lines, const double[:, :] single, const double[:, :] measured,
        tree):
    """Run the requests (arrival times, prompt and output tokens) from `req`, `times` and `inst` as
    `initial_state` makes them. Per pool: `pools` (KV_CAP ... LAYERWISE_MIN), `pools_s` (LINK_BPS,
    KV_LATENCY_S), `local_bps[a, b]` KV bandwidth from an instance of pool a to one of pool b on its
    machine, `vectors` the pass formula's constants, `lines[pool, b]` a decode step of b requests as
    (base, per context token, slack) (Instance.decode_line), `single[pool]` each prompt's time alone,
    `measured[pool, x]` a MEASURED pool's pass of x prompt and decode tokens (perf.table);
    `settings` (MAX_BATCH_TOKENS ... PREFIX_AWARE), `kv_bytes` per token; `tree` (parent, tokens,
    depth per node: the trace's prefix tree) with CACHING. A closed loop's `arrival` holds the
    first clients' send times and infinity for the rest, each written when a client sends it.
    Fills `req`, `times`, `inst` (and `arrival`); returns (status, per-instance times, counters,
    iteration end times, their instances, the event log's times, its kind, instance and request
    per event, with CACHING each instance's cache state, `cache_state`'s, with RECORD every
    iteration's pass, and per pool MEASURED_COUNTS)."""
    _check_width(vectors.shape[1])
    if settings.shape[0] != SETTINGS:
        raise ValueError(f"settings: {settings.shape[0]} entries, the core reads {SETTINGS}")
    cdef _Run s = _Run()
    n, count = arrival.shape[0], len(inst)
    s.arrival, s.prompt, s.out, s.req, s.times, s.inst, s.pools = arrival, prompt, out, req, times, inst, pools
    s.pools_s, s.local_bps, s.settings, s.kv_bytes, s.vectors, s.lines, s.single = (pools_s, local_bps, settings, kv_bytes,
                                                                                    vectors, lines, single)
    s.measured, counts = measured, np.zeros((len(pools), MEASURED_COUNTS), np.int64)
    s.counts = counts
    s.prompt_side, s.token_side = np.flatnonzero(inst[:, P_POS] >= 0), np.flatnonzero(inst[:, T_POS] >= 0)
    s.p_load, s.t_load = np.zeros(len(s.prompt_side), np.int64), np.zeros(len(s.token_side), np.int64)
    clock, counters = np.zeros((count, CLOCK_COLUMNS)), np.zeros(COUNTERS, np.int64)
    counters[RELEASED] = min(settings[CLOSED], n) if settings[CLOSED] else n
    s.clock, s.counters = clock, counters
    s.ends_s, s.ends_at = np.empty(max(1024, 4 * n)), np.empty(max(1024, 4 * n), np.int64)
    logged = max(1024, 4 * n) if settings[LOG] else 0
    s.log_s, s.log_at = np.empty(logged), np.empty((logged, 3), np.int64)
    s.passes = np.empty((max(1024, 4 * n) if settings[RECORD] else 0, 7))
    heap_init(&s.heap, count)
    cdef Py_ssize_t k
    if settings[CACHING]:
        s.tree = _Tree()
        s.tree.setup(tree[0], tree[1], tree[2], settings[BLOCK])
        s.caches = <Cache*> malloc(count * sizeof(Cache))
        if s.caches == NULL:
            raise MemoryError()
        for k in range(count):
            cache_init(&s.caches[k], pools_s[inst[k, POOL], CPU_TOKENS])
            s.cache_count += 1
    status = s.loop(front_s)
    caches = [cache_state(&s.caches[k]) for k in range(s.cache_count)]
    ends, events, passes = int(counters[ENDS]), int(counters[LOGGED]), int(counters[RECORDED])
    return (int(status), clock, counters, np.asarray(s.ends_s)[:ends].copy(), np.asarray(s.ends_at)[:ends].copy(),
            np.asarray(s.log_s)[:events].copy(), np.asarray(s.log_at)[:events].copy(), caches,
            np.asarray(s.passes)[:passes].copy(), counts)
