"""numba keys a kernel's cached machine code on the kernel's own file alone: a kernel that compiles
in code or constants from another file keeps them as they were compiled until its own file
changes (checked on numba 0.68). So each module of kernels carries COMPILED_IN_SHA256, a hash of
the text of the splitplan modules it imports from: this test fails when one of them changes,
naming the new value, and the module's change on updating it renews its cache."""

import ast
import hashlib
from pathlib import Path

import pytest

from splitplan.capacity import replay
from splitplan.sim import compiled

PACKAGE = Path(replay.__file__).resolve().parents[1]


def compiled_in(module) -> list[Path]:
    """The files of the splitplan modules `module` imports from (at its top)."""
    tree = ast.parse(Path(module.__file__).read_text())
    names = sorted(node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.module
                   and node.module.startswith("splitplan."))
    return [PACKAGE.joinpath(*name.split(".")[1:]).with_suffix(".py") for name in names]


def digest(files: list[Path]) -> str:
    h = hashlib.sha256()
    for path in files:
        h.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@pytest.mark.parametrize("module", [replay, compiled], ids=lambda m: m.__name__)
def test_a_kernel_module_changes_with_what_it_compiles_in(module):
    files = compiled_in(module)
    assert PACKAGE / "perf" / "kernels.py" in files
    want = digest(files)
    assert want == module.COMPILED_IN_SHA256, (
        f"{module.__name__} compiles in {', '.join(p.relative_to(PACKAGE).as_posix() for p in files)}, which changed: "
        f"set its COMPILED_IN_SHA256 to {want!r}, so that numba's cache of its kernels is renewed")
