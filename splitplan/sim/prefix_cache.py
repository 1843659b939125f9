"""One instance's prefix cache: the nodes of a trace's PrefixTree whose KV it keeps, least recently
used evicted first, as vLLM's automatic prefix caching and SGLang's radix cache keep computed blocks.

What is resident is closed under ancestors (a node is kept only behind its whole prefix, and only
leaves are evicted), so a request's hit is the depth of the deepest resident node on its path. A
node some running request uses is pinned (its KV is that request's, counted with it) and cannot
be evicted; the rest (`free_tokens`) lives in the KV memory the running requests leave, and
`evict(limit)` drops least recently used leaves until it fits. A prefix is reused in whole blocks of
the engine's `block_tokens`, and never the prompt's last token (vLLM computes it to sample from).

An optional second tier in host memory (`cpu_tokens`, vLLM's `--kv-offloading-size`, SGLang's
HiCache) is written through, as vLLM's offloading connector stores each computed block: every
inserted node is copied there too, least recently used dropped when it is full. A lookup then hits
as deep as the path is held in either tier, the part beyond the GPU tier to be loaded over the
host link first (`match`'s second value). A cache knows nothing of time but the stamps it is given.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from splitplan.base.errors import SpecError
from splitplan.workload.prefix import PrefixTree


def host_link_bytes_per_s(hardware) -> float:
    """One GPU's link to host memory, each way (bytes/s): what prefixes kept in host memory are
    loaded back over. A hardware spec that does not give it: exit 2."""
    if hardware.gpu.host_link_gbyte_per_s is None:
        raise SpecError(f"--kv-offload-gb: hardware {hardware.name} gives no gpu.host_link_gbyte_per_s (its GPUs' link to "
                        "host memory): add it to its hardware spec, with its source, or leave the machine out")
    return hardware.gpu.host_link_gbyte_per_s * 1e9


@dataclass(frozen=True)
class PrefixModel:
    """The engine's prefix caching, as the simulator and the planner's prompt replay both keep it:
    the trace's prefixes, reused in blocks of `block_tokens`; `offload_gb` of host memory per
    prefilling instance (write-through; a hit there is loaded back over the instance's GPUs' host
    links, FIFO, the request out of its queue meanwhile); `prefix_aware` routing."""

    tree: PrefixTree
    block_tokens: int = 1
    offload_gb: float = 0.0
    prefix_aware: bool = False

    def cache(self, inst, host: bool = True) -> PrefixCache:
        """A cache for one instance (`inst`: perf.roofline.Instance); `host`: with the host tier."""
        return PrefixCache(self.tree, self.block_tokens, self.host_tokens(inst) if host else 0.0)

    def host_tokens(self, inst) -> float:
        """The tokens of KV one instance's host tier holds (0.0: none)."""
        offload = self.offload_gb * 1e9 / self.kv_bytes(inst) if self.offload_gb else 0.0
        if offload:
            host_link_bytes_per_s(inst.hardware)  # (refused before the run, not at its first load)
        return offload

    def host_tier(self, inst) -> tuple[float, float]:
        """(the tokens one instance's host tier holds, seconds to load one back): (0.0, 0.0) for none."""
        tokens = self.host_tokens(inst)
        return tokens, self.load_s_per_token(inst) if tokens else 0.0

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The tree as the compiled core reads it: parent, tokens and depth per node (int64)."""
        return tuple(np.asarray(a, np.int64) for a in (self.tree.parent, self.tree.tokens, self.tree.depth))  # type: ignore[return-value]

    def load_s_per_token(self, inst) -> float:
        """Seconds to load one token's KV from host memory over the instance's GPUs' host links."""
        return self.kv_bytes(inst) / (host_link_bytes_per_s(inst.hardware) * inst.layout.gpus)

    @staticmethod
    def kv_bytes(inst) -> float:
        return inst.model.kv_bytes_per_token(inst.engine.kv_bytes_per_element)


class PrefixCache:
    def __init__(self, tree: PrefixTree, block_tokens: int = 1, cpu_tokens: float = 0.0):
        self.block = block_tokens
        self.cpu_cap = cpu_tokens
        self.cpu: OrderedDict[int, None] = OrderedDict()  # nodes held in host memory, least recently used first
        self.cpu_used = 0  # their tokens
        self.loaded_tokens = 0  # total of `match`'s tokens to load from host memory
        self._tree_path = tree.path  # (node, its parent, ..., the root)
        self.parent, self.tokens, self.depth = tree.lists  # (shared, read only)
        self.last_use: dict[int, float] = {}  # resident node -> last use
        self.kids: dict[int, int] = {}  # resident node -> its resident children
        self.pins: dict[int, int] = {}  # node -> running requests using it
        self.free_tokens = 0  # tokens of resident nodes no running request pins
        self.resident_tokens = 0  # tokens of resident nodes
        self.hit_tokens = self.lookup_tokens = 0  # totals of `match`, for the hit rate
        self._heap: list = []  # (last use, -depth, node): eviction candidates, stale entries skipped
        self.evicted = 0

    def restore(self, nodes, last_use, counts, cpu, totals) -> None:
        """This cache as the compiled run left it (splitplan_core.cache_state): per node it holds or a
        request pins, its last use, resident children, pins and whether resident; the host tier in LRU order; the
        totals. (The eviction heap is not kept: the run is over.)"""
        kids, pins, resident = counts.T.tolist()
        nodes, last_use = nodes.tolist(), last_use.tolist()
        self.last_use = {n: t for n, t, r in zip(nodes, last_use, resident, strict=True) if r}
        self.kids = {n: c for n, c, r in zip(nodes, kids, resident, strict=True) if r}
        self.pins = {n: c for n, c in zip(nodes, pins, strict=True) if c}
        self.cpu = OrderedDict.fromkeys(cpu.tolist())
        (self.cpu_used, self.free_tokens, self.resident_tokens, self.hit_tokens, self.lookup_tokens, self.loaded_tokens,
         self.evicted) = (int(v) for v in totals)
        self._heap = []

    def _gpu_depth(self, node: int) -> int:
        while node >= 0 and node not in self.last_use:
            node = self.parent[node]
        return self.depth[node] if node >= 0 else 0

    def _depth(self, node: int) -> int:
        """Tokens of the longest prefix of `node`'s path held in either tier."""
        if not self.cpu:
            return self._gpu_depth(node)
        held = 0
        for n in reversed(self._tree_path(node)):
            if n not in self.last_use and n not in self.cpu:
                break
            held = self.depth[n]
        return held

    def _blocks(self, held: int, prompt_tokens: int) -> int:
        """Of `held` cached tokens, those a prompt reuses: whole blocks, at most the prompt less one."""
        return min(held, prompt_tokens - 1) // self.block * self.block

    def peek(self, node: int, prompt_tokens: int) -> int:
        """Leading prompt tokens cached (either tier) for a request whose prefix ends at `node`."""
        return self._blocks(self._depth(node), prompt_tokens)

    def resident(self, node: int, prompt_tokens: int) -> int:
        """`peek` in the GPU tier alone (not counted in the hit rate)."""
        return self._blocks(self._gpu_depth(node), prompt_tokens)

    def match(self, node: int, prompt_tokens: int) -> tuple[int, int]:
        """`peek`, counted in the hit rate (a prefill begins), and how many of those tokens come
        from host memory (to be loaded before the prefill)."""
        hit = self.peek(node, prompt_tokens)
        loaded = max(hit - self._gpu_depth(node), 0)
        self.hit_tokens += hit
        self.lookup_tokens += prompt_tokens
        self.loaded_tokens += loaded
        if loaded:
            for n in reversed(self._tree_path(node)):  # (root first: the deepest is the most recently used)
                if n in self.cpu:
                    self.cpu.move_to_end(n)
        return hit, loaded

    def insert(self, node: int, now: float) -> None:
        """The path to `node` is computed: resident, used at `now`."""
        for n in self._tree_path(node):
            if n not in self.last_use:
                self.resident_tokens += self.tokens[n]
                self.kids.setdefault(n, 0)
                if self.parent[n] >= 0:
                    self.kids[self.parent[n]] = self.kids.get(self.parent[n], 0) + 1
                if not self.pins.get(n):
                    self.free_tokens += self.tokens[n]
            self.last_use[n] = now
            if not self.pins.get(n):  # (a node the inserting request pins is pushed when it lets go)
                self._candidate(n)
        if self.cpu_cap:
            self._write_through(node)

    def _write_through(self, node: int) -> None:
        for n in reversed(self._tree_path(node)):  # (root first: the last one used is the deepest)
            if n in self.cpu:
                self.cpu.move_to_end(n)
            elif self.tokens[n] <= self.cpu_cap:
                self.cpu[n] = None
                self.cpu_used += self.tokens[n]
        while self.cpu_used > self.cpu_cap:
            n, _ = self.cpu.popitem(last=False)
            self.cpu_used -= self.tokens[n]

    def pin(self, node: int) -> None:
        """A running request uses the (resident) path to `node`."""
        for n in self._tree_path(node):
            count = self.pins.get(n, 0)
            if count == 0 and n in self.last_use:
                self.free_tokens -= self.tokens[n]
            self.pins[n] = count + 1

    def unpin(self, node: int, now: float) -> None:
        for n in self._tree_path(node):
            count = self.pins[n] - 1
            if count:
                self.pins[n] = count
                continue
            del self.pins[n]
            if n in self.last_use:
                self.free_tokens += self.tokens[n]
                self.last_use[n] = now
                self._candidate(n)

    def _candidate(self, n: int) -> None:
        """n may be evicted now (a leaf no request pins): on the heap, at its last use."""
        if not self.kids[n] and not self.pins.get(n):
            heapq.heappush(self._heap, (self.last_use[n], -self.depth[n], n))

    def evict(self, limit_tokens: float) -> None:
        """Drop least recently used unpinned leaves until the unpinned tokens fit `limit_tokens`."""
        heap = self._heap
        while self.free_tokens > limit_tokens and heap:
            used, _, n = heapq.heappop(heap)
            if self.last_use.get(n) != used or self.kids[n] or self.pins.get(n):
                continue  # stale, or not evictable now (it is pushed again when it becomes so)
            del self.last_use[n]
            del self.kids[n]
            self.free_tokens -= self.tokens[n]
            self.resident_tokens -= self.tokens[n]
            self.evicted += 1
            up = self.parent[n]
            if up >= 0:
                self.kids[up] -= 1
                self._candidate(up)
