"""The compiled engine core (core/splitplan_core.pyx): built from this checkout's source, and
refusing what would make it read past an array."""

import hashlib
from pathlib import Path

import numpy as np
import pytest
import splitplan_core as core  # (the module itself: the guard is splitplan.base.core)

from splitplan import api

SOURCE = Path(__file__).resolve().parents[1] / "core" / "splitplan_core.pyx"


def test_the_installed_core_is_built_from_this_source():
    """A core compiled from an older text (the checkout changed since `pip install .`) is caught
    here rather than by every test it would fail: reinstall to rebuild it."""
    want = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    assert want == core.SOURCE_SHA256, "the compiled core is older than core/splitplan_core.pyx: run pip install . again"


def test_a_pass_vector_of_another_length_is_refused():
    vector = api.instance("llama3.1-8b", "h100-80gb", 1, "vllm").pass_vector
    assert len(vector) == len(core.FIELDS)
    assert core.pass_time_s(vector, 1.0, 512.0, 512.0**2, 0.0, 0.0) > 0
    for wrong in (vector[:-1], np.append(vector, 1.0)):
        with pytest.raises(ValueError, match="FIELDS"):
            core.pass_time_s(wrong, 1.0, 512.0, 512.0**2, 0.0, 0.0)
        with pytest.raises(ValueError, match="FIELDS"):
            core.prompt_replay(np.zeros(1), np.ones(1, np.int64), wrong[None, :].copy(), np.zeros(1, np.int64),
                               np.zeros((1, 2)), 8192, False, 1, False, np.empty(0), 16)


def test_without_the_built_core_the_package_says_to_install_it():
    """A checkout run without `pip install .` (no splitplan_core) names the command that builds the core."""
    import subprocess
    import sys
    code = "import sys; sys.modules['splitplan_core'] = None; import splitplan.perf.roofline"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=SOURCE.parents[1])
    assert run.returncode == 1
    assert "engine core (the module splitplan_core) is not built" in run.stderr.splitlines()[-1]
    assert "pip install ." in run.stderr.splitlines()[-1]
