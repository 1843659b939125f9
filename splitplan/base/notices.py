"""Who is told when numba starts compiling splitplan's kernels in this process: after an install
(or an upgrade) the first command that times passes compiles them, about 30 s on 2 cores, and
caches the machine code; later processes load it. `perf.kernels` calls `first_compile` at the
first compile of a process. The library tells no one (`listener` None); the command line prints
one line on standard error, so that a first run is not 30 silent seconds."""

from __future__ import annotations

from collections.abc import Callable

listener: Callable[[bool], None] | None = None  # called once, with whether the machine code will be cached


def first_compile(cached: bool) -> None:
    """Tell the listener (once per process) that numba starts compiling, and whether what it
    compiles is cached for later processes."""
    global listener
    told, listener = listener, None
    if told is not None:
        told(cached)
