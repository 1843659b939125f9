"""Run independent work units on this machine's cores, results in input order.

Units are `fn(shared, item)`; `shared` (a large read-only input such as a trace)
is handed to forked workers through process memory instead of being pickled per
unit. Where fork is unavailable, or `jobs <= 1`, units run in this process. The
output never depends on `jobs`.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Sequence

_SHARED: tuple | None = None  # (fn, shared), set just before the workers fork


def _run(item):
    fn, shared = _SHARED
    return fn(shared, item)


def fork_map(fn: Callable[[Any, Any], Any], items: Sequence, jobs: int, shared: Any = None,
             progress: Callable[[], None] | None = None) -> list:
    """`[fn(shared, item) for item in items]`, in `jobs` processes; `progress()` is
    called as each unit's result is collected."""
    global _SHARED
    tick = progress or (lambda: None)
    if jobs <= 1 or len(items) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        out = []
        for item in items:
            out.append(fn(shared, item))
            tick()
        return out
    _SHARED = (fn, shared)
    try:
        with ProcessPoolExecutor(min(jobs, len(items)), mp_context=multiprocessing.get_context("fork")) as pool:
            out = []
            for result in pool.map(_run, items):
                out.append(result)
                tick()
            return out
    finally:
        _SHARED = None
