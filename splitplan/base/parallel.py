"""Run independent work units, on this machine's cores or on a Ray cluster.

A work unit is `fn(shared, item)`: a module-level (importable, picklable) function,
one large read-only input shared by all units (a trace, options), and the unit's
own small input (a design, a rate, a window; seeds travel inside). Results come
back in input order whichever executor ran them, so a study's output does not
depend on where it ran.

- local: forked worker processes (`jobs`), `shared` inherited through process
  memory; `jobs <= 1` runs in this process.
- ray: `ray_address` "auto" (a running cluster), an address ("ray://host:10001"),
  or None to start a local Ray instance for the call (`jobs` CPUs) and stop it
  after; `shared` is put in the object store once.

A unit that fails raises `WorkUnitError` naming the unit (no hang); a user error
(`SplitplanError`) inside a unit keeps its kind and exit code, prefixed with the unit.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import InvalidStateError, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from splitplan.base.errors import SpecError, SplitplanError
from splitplan.base.inputs import reason

EXECUTORS = ("local", "ray")
_SHARED: tuple | None = None  # (fn, shared, items, next unit's index), set just before the workers fork


class WorkUnitError(SplitplanError):
    """A work unit failed for a reason other than bad input."""

    exit_code = 1


def _guarded(fn, shared, item):
    """Run one unit; failures come back as values so that no executor hangs or loses them."""
    try:
        return True, fn(shared, item)
    except SplitplanError as exc:
        return False, (type(exc), str(exc), "")
    except Exception as exc:  # noqa: BLE001 - reported with its unit and traceback, then raised
        return False, (None, f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=4))


def _unwrap(outcome, index: int, total: int, items: Sequence, describe: Callable[[Any], str]):
    ok, value = outcome
    if ok:
        return value
    kind, message, trace = value
    where = f"work unit {index + 1} of {total} ({describe(items[index])})"
    if kind is not None:
        raise kind(f"{where}: {message}")
    raise WorkUnitError(f"{where} failed: {message}" + (f"\n{trace}" if trace else ""))


def run_units(fn: Callable[[Any, Any], Any], items: Sequence, shared: Any = None, jobs: int = 1,
              executor: str = "local", ray_address: str | None = None, progress: Callable[[], None] | None = None,
              describe: Callable[[Any], str] = repr) -> list:
    """`[fn(shared, item) for item in items]` on the chosen executor, results in input order;
    `progress()` is called as each unit finishes."""
    if executor not in EXECUTORS:
        raise SpecError(f"--executor {executor}: choose local or ray")
    tick = progress or (lambda: None)
    outcomes = (_ray_map(fn, items, shared, jobs, ray_address, tick) if executor == "ray"
                else _local_map(fn, items, shared, jobs, tick))
    return [_unwrap(o, k, len(items), items, describe) for k, o in enumerate(outcomes)]


def _die_with_parent(parent_pid: int) -> None:
    """In each forked worker: leave Ctrl-C to the parent, and end when the parent process ends,
    even by SIGKILL. On Linux the kernel sends SIGTERM then (prctl PR_SET_PDEATHSIG); a parent
    already gone before that was set is caught by the pid check."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
        except OSError:
            pass
    if os.getppid() != parent_pid:
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent handles it


def _quiet_cancelled_futures(hook):
    """`hook` (threading.excepthook), but silent on the InvalidStateError the pool's manager thread
    may raise on Ctrl-C, failing a future we just cancelled as the workers end (CPython 3.11)."""
    def quiet(args) -> None:
        if not issubclass(args.exc_type, InvalidStateError):
            hook(args)
    return quiet


_TORN_DOWN: list = []  # the process pools Ctrl-C ended in this process


def pool_torn_down() -> bool:
    """Whether Ctrl-C ended a process pool in this process (whose exit hooks would then fail: cli.common.main)."""
    return bool(_TORN_DOWN)


def _local_map(fn, items, shared, jobs, tick) -> list:
    """`_guarded(fn, shared, item)` per item in input order: in this process, and where `jobs` > 1
    in `jobs` - 1 forked workers beside it, each (this one too) taking the next unit left until
    none is (a counter in shared memory), so no process waits while units remain."""
    global _SHARED
    if jobs <= 1 or len(items) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        out = []
        for item in items:
            out.append(_guarded(fn, shared, item))
            tick()
        return out
    context = multiprocessing.get_context("fork")
    _SHARED = (fn, shared, items, context.Value("q", 0))
    outcomes: list = [None] * len(items)
    try:
        forked = min(jobs, len(items)) - 1
        with ProcessPoolExecutor(forked, mp_context=context, initializer=_die_with_parent, initargs=(os.getpid(),)) as pool:
            try:
                workers = [pool.submit(_drain) for _ in range(forked)]
                for k, outcome in _drain():
                    outcomes[k] = outcome
                    tick()
                for worker in workers:
                    for k, outcome in _worker_units(worker):
                        outcomes[k] = outcome
                        tick()
            except KeyboardInterrupt:  # Ctrl-C: end the workers now instead of waiting for their units
                _TORN_DOWN.append(pool)
                threading.excepthook = _quiet_cancelled_futures(threading.excepthook)
                for process in list((getattr(pool, "_processes", None) or {}).values()):
                    process.terminate()
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    finally:
        _SHARED = None
    lost = (False, (None, "its worker process ended before it finished (killed, or out of memory?)", ""))
    return [lost if outcome is None else outcome for outcome in outcomes]


def _drain() -> list:
    """The units this process takes, one at a time from the shared counter, until none is left:
    (index, outcome) each."""
    assert _SHARED is not None  # (set before the workers fork)
    fn, shared, items, counter = _SHARED
    done: list[tuple[int, Any]] = []
    while True:
        with counter.get_lock():
            k = counter.value
            counter.value += 1
        if k >= len(items):
            return done
        done.append((k, _guarded(fn, shared, items[k])))


def _worker_units(worker) -> list:
    """A worker's (index, outcome) pairs; none where its process died (its units are then reported lost)."""
    try:
        return worker.result()
    except BrokenProcessPool:
        return []


@contextlib.contextmanager
def _folded_stderr():
    """Standard error (the file descriptor, so Ray's processes started meanwhile too) into a
    temporary file that is dropped: what Ray prints while it starts is not the command's output."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def _ray_map(fn, items, shared, jobs, address, tick) -> list:
    try:
        import ray
    except ImportError:
        raise SpecError("--executor ray needs Ray: pip install '.[ray]' (or pip install 'ray>=2.9')") from None
    started = not ray.is_initialized()
    if started:
        options: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            with _folded_stderr():  # Ray's start-up notices (token auth, ...): a command's stderr is its own
                if address:
                    ray.init(address=address, **options)
                else:
                    ray.init(num_cpus=max(jobs, 1), **options)
        except Exception as exc:  # noqa: BLE001 - Ray fails to start in many ways (timeouts, sockets, /dev/shm)
            ray.shutdown()  # whatever it started
            where = f"--ray-address {address}" if address else "a local Ray instance"
            raise SpecError(f"cannot start or reach {where}: {reason(exc, 160)}; start a "
                            "cluster with 'ray start --head', or drop --ray-address to run a local instance") from None
    try:
        remote = ray.remote(_guarded)
        shared_ref = ray.put(shared)
        futures = [remote.remote(fn, shared_ref, item) for item in items]
        pending = list(futures)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            tick()
        out = []
        for future in futures:
            try:
                out.append(ray.get(future))
            except Exception as exc:  # noqa: BLE001 - a worker that died: report the unit
                out.append((False, (None, f"the Ray worker failed: {type(exc).__name__}: {exc}", "")))
        return out
    finally:
        if started:
            ray.shutdown()
