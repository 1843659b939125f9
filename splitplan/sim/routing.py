"""Join-shortest-queue's pick: the least-loaded instance, ties to the lowest index."""

from __future__ import annotations

import heapq

HEAP_ROUTING_INSTANCES = 16  # above this many instances the least-loaded one comes from a heap, not a scan


class LeastLoaded(list):
    """Per-instance loads (a list) that find the least-loaded instance in O(log n): every
    assignment pushes (load, index) on a heap, and entries whose load is no longer the
    instance's are dropped as they surface."""

    def __init__(self, loads):
        super().__init__(loads)
        self._heap = [(load, k) for k, load in enumerate(self)]
        heapq.heapify(self._heap)

    def __setitem__(self, k, load):
        super().__setitem__(k, load)
        heapq.heappush(self._heap, (load, k))

    def least(self) -> int:
        heap = self._heap
        while heap[0][0] != self[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0][1]


def loads(count: int) -> list:
    """Zero loads for `count` instances: a LeastLoaded past HEAP_ROUTING_INSTANCES (a plain list,
    faster to update, below)."""
    return LeastLoaded([0] * count) if count > HEAP_ROUTING_INSTANCES else [0] * count


def least_loaded(loads: list) -> int:
    """The instance of least load, the lowest index among equals."""
    return loads.least() if isinstance(loads, LeastLoaded) else loads.index(min(loads))
