"""The build's two steps beyond pyproject.toml: splitplan's engine core compiled ahead of time
(core/splitplan_core.pyx, Cython, into the top-level module `splitplan_core`), and the catalogs
shipped inside the package (under splitplan/_data/, where an installed tool finds them).

The core is a module of its own, beside the package, so that a source checkout's `splitplan/`
(which the tests import) uses the core `pip install .` compiled. It is compiled without fused
multiply-adds (-ffp-contract=off), so its floats are the Python oracles' to the bit on every CPU.
"""

import hashlib
import shutil
import sys
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
CORE = Path("core") / "splitplan_core.pyx"
CATALOGS = ("hardware_specs", "model_specs", "engine_profiles", "slo_profiles", "traces", "designs")


class BuildPyWithCatalogs(build_py):
    """build_py, then the catalogs and NOTICE copied into splitplan/_data/ (an editable install
    reads them from the checkout instead)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        data = Path(self.build_lib) / "splitplan" / "_data"
        for name in CATALOGS:
            shutil.copytree(ROOT / name, data / name, dirs_exist_ok=True)
        shutil.copy2(ROOT / "NOTICE", data / "NOTICE")


source_sha256 = hashlib.sha256((ROOT / CORE).read_bytes()).hexdigest()[:16]
core = Extension(
    "splitplan_core", [str(CORE)],
    define_macros=[("SPLITPLAN_CORE_SHA256", f'"{source_sha256}"')],
    extra_compile_args=[] if sys.platform == "win32" else ["-ffp-contract=off", "-g0"],  # (no debug symbols: a smaller wheel)
)
setup(ext_modules=cythonize([core], build_dir="build/cython", language_level=3, quiet=True),
      cmdclass={"build_py": BuildPyWithCatalogs})
