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

These rules are the engine core's (splitplan_core.PrefixCache, kept per instance by the compiled run
and replay); tests/sim/python_prefix_cache.py states them in Python, the oracle the core is held to.
This module holds what the planner and the simulator set up (PrefixModel) and read back (CacheState).
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class CacheState:
    """What one instance's prefix cache held when a run ended, as the compiled run leaves it
    (splitplan_core.cache_state): per resident node its last use and resident children, per pinned
    node its pins, the host tier in LRU order, and the totals (`match`'s hit, looked-up and loaded
    tokens, the host tier's and the unpinned and resident tokens, the evictions)."""

    last_use: dict[int, float]
    kids: dict[int, int]
    pins: dict[int, int]
    cpu: list[int]
    cpu_used: int
    free_tokens: int
    resident_tokens: int
    hit_tokens: int
    lookup_tokens: int
    loaded_tokens: int
    evicted: int

    @classmethod
    def from_core(cls, nodes, last_use, counts, cpu, totals) -> CacheState:
        """From `cache_state`'s arrays: per node held or pinned, its last use, (resident children, pins,
        whether resident); the host tier; the totals."""
        kids, pins, resident = counts.T.tolist()
        nodes, last_use = nodes.tolist(), last_use.tolist()
        return cls({n: t for n, t, r in zip(nodes, last_use, resident, strict=True) if r},
                   {n: c for n, c, r in zip(nodes, kids, resident, strict=True) if r},
                   {n: c for n, c in zip(nodes, pins, strict=True) if c}, cpu.tolist(), *(int(v) for v in totals))
