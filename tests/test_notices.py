"""A first run says that numba compiles the kernels (base.notices): once per process, on the
command line only, and what it says about the cache is true."""

import gc
import sys

import numba
import pytest

from splitplan.base import notices


@pytest.fixture
def heard(monkeypatch):
    told: list[bool] = []
    monkeypatch.setattr(notices, "listener", told.append)
    return told


def test_the_first_compile_of_a_process_is_told_once(heard, monkeypatch):
    from splitplan.perf import kernels
    monkeypatch.setattr(kernels, "_UNCACHED", [])

    @numba.njit
    def fresh(x):  # (never compiled before in this process: numba compiles it, no cache to load)
        return x + 1

    assert fresh(1) == 2 and heard == [True]

    @numba.njit
    def another(x):
        return x * 2

    assert another(2) == 4 and heard == [True]  # (told once)


def test_an_uncached_kernel_is_told_as_compiled_in_every_run(heard, monkeypatch):
    from splitplan.perf import kernels
    monkeypatch.setattr(kernels, "_UNCACHED", ["prompt_replay"])

    @numba.njit
    def fresh(x):
        return x - 1

    assert fresh(1) == 0 and heard == [False]


def test_the_console_script_prints_the_notice_and_the_library_does_not(monkeypatch, capsys):
    from splitplan.cli import common
    threshold = gc.get_threshold()
    monkeypatch.setattr(notices, "listener", None)
    notices.first_compile(True)  # (the library: no one to tell)
    assert capsys.readouterr().err == ""

    def run(standalone_mode):  # a command whose kernels numba compiles
        notices.first_compile(True)
        notices.first_compile(True)
        return 0
    monkeypatch.setattr(common, "app", run)
    monkeypatch.setattr(sys, "argv", ["splitplan"])
    try:
        with pytest.raises(SystemExit) as done:
            common.main()
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
    assert done.value.code == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("compiling splitplan's kernels") and "once after an install" in err
