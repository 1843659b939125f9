"""How independent work units run, as the core sees it.

A runner is `run(fn, items, shared) -> [fn(shared, item) for item in items]`, results in
input order. The core (perf/, sim/) takes one and runs serially by default; the library
(calibration.py, studies.py, ...) passes `parallel.run_units` bound to the user's --jobs,
so the core never imports the process pool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Runner = Callable[[Callable[[Any, Any], Any], Sequence, Any], list]


def serial(fn: Callable[[Any, Any], Any], items: Sequence, shared: Any = None) -> list:
    return [fn(shared, item) for item in items]
