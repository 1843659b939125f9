"""One instance's prefix cache in Python (the rules of splitplan.sim.prefix_cache's docstring): the oracle
the engine core's cache (splitplan_core.PrefixCache, which every compiled run keeps per instance) is
held to operation by operation (tests/sim/test_compiled.py), and the tests' Python loops' cache."""

from __future__ import annotations

import heapq
from collections import OrderedDict

from splitplan.sim.prefix_cache import PrefixModel
from splitplan.workload.prefix import PrefixTree


def cache_for(prefix: PrefixModel, inst, host: bool = True) -> PrefixCache:
    """A cache for one instance (`inst`: perf.roofline.Instance) under `prefix`; `host`: with the host tier."""
    return PrefixCache(prefix.tree, prefix.block_tokens, prefix.host_tokens(inst) if host else 0.0)


class PrefixCache:
    def __init__(self, tree: PrefixTree, block_tokens: int = 1, cpu_tokens: float = 0.0):
        self.block = block_tokens
        self.cpu_cap = cpu_tokens
        self.cpu: OrderedDict[int, None] = OrderedDict()  # nodes held in host memory, least recently used first
        self.cpu_used = 0  # their tokens
        self.loaded_tokens = 0  # total of `match`'s tokens to load from host memory
        self.parent, self.tokens, self.depth = tree.parent.tolist(), tree.tokens.tolist(), tree.depth.tolist()
        self._paths: dict[int, tuple[int, ...]] = {}
        self.last_use: dict[int, float] = {}  # resident node -> last use
        self.kids: dict[int, int] = {}  # resident node -> its resident children
        self.pins: dict[int, int] = {}  # node -> running requests using it
        self.free_tokens = 0  # tokens of resident nodes no running request pins
        self.resident_tokens = 0  # tokens of resident nodes
        self.hit_tokens = self.lookup_tokens = 0  # totals of `match`, for the hit rate
        self._heap: list = []  # (last use, -depth, node): eviction candidates, stale entries skipped
        self.evicted = 0

    def _tree_path(self, node: int) -> tuple[int, ...]:
        """The nodes from `node` up to the root (remembered per node)."""
        path = self._paths.get(node)
        if path is None:
            walk, n = [], node
            while n >= 0:
                walk.append(n)
                n = self.parent[n]
            path = self._paths[node] = tuple(walk)
        return path

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
