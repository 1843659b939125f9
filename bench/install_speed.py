"""What a new user pays: `pip install .` and the first `splitplan optimize` after it, for this
checkout and a commit before it, each in a fresh virtualenv, in one run.

    python bench/install_speed.py [--base REV] [--runs N]

For each source (the commit `--base`, default HEAD~1, checked out with `git worktree`; then this
working tree): `pip wheel --no-deps` (the build: wall seconds, wheel size), `pip install` of that
wheel into a new virtualenv with its dependencies (from pip's cache where it has them; wall
seconds, the virtualenv's size), then from an empty directory the first `splitplan optimize --format
json` after the install (numba's cache empty, where the commit used numba) and the best of `--runs`
later ones (wall and CPU seconds, the process and what it started), and whether every run printed
the same plan as the first. Issue 56's target: the first run at most 2.5 s.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], cwd: Path | None = None, env: dict | None = None) -> tuple[float, float, bytes]:
    """(wall s, CPU s of the process and its children, stdout) of one run of `cmd`."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed")
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime, out


def size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def measure(name: str, source: Path, scratch: Path, runs: int) -> None:
    wheels, venv, home = scratch / "wheels", scratch / "venv", scratch / "home"
    home.mkdir(parents=True)
    build_s, _, _ = timed([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(source)])
    wheel = next(wheels.glob("*.whl"))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    install_s, _, _ = timed([*pip, str(wheel)])
    env = {**os.environ, "NUMBA_CACHE_DIR": str(scratch / "numba-cache"), "PYTHONPATH": ""}
    cmd = [str(venv / "bin" / "splitplan"), "optimize", "--format", "json"]
    first_wall, first_cpu, plan = timed(cmd, cwd=home, env=env)
    later = [timed(cmd, cwd=home, env=env) for _ in range(runs)]
    wall, cpu, _ = min(later)
    same = all(out == plan for _, _, out in later)
    print(f"| {name} | {build_s:.1f} | {wheel.stat().st_size / 1e6:.2f} | {install_s:.1f} | {size_mb(venv):.0f} | "
          f"{first_wall:.2f} / {first_cpu:.2f} | {wall:.2f} / {cpu:.2f} | {'yes' if same else 'NO'} | "
          f"{hashlib.sha256(plan).hexdigest()[:12]} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1", help="the commit to compare with (default HEAD~1)")
    parser.add_argument("--runs", type=int, default=3, help="later runs, the best of which is shown")
    args = parser.parse_args()
    print("| source | build s | wheel MB | install s | virtualenv MB | first optimize wall / CPU s | later (best) | "
          "same plan | plan sha256 |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder) / "base"
        rev = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, check=True, capture_output=True,
                             text=True).stdout.strip()
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(base), rev], cwd=ROOT, check=True)
        try:
            measure(rev, base, Path(folder) / "a", args.runs)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=True)
        measure("this checkout", ROOT, Path(folder) / "b", args.runs)


if __name__ == "__main__":
    main()
