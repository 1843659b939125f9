"""Wall and CPU time of `splitplan optimize` as whole processes (import included).

    python bench/optimize_speed.py [--aiconfigurator PATH]

Cases: the whole catalog on the embedded Azure code trace (defaults), the Azure conversation
trace resampled at 70 req/s for 120 s, the defaults on one core (`--jobs 1`), and the one-ISL/OSL
question a user put to NVIDIA aiconfigurator (Llama-3.1-70B fp8 on H100, ISL 4,000 / OSL 500,
10 req/s, TTFT 2 s and TPOT 50 ms as medians; bench/shapes_study.py): splitplan on a Poisson trace
of 1,200 such requests, and, when aiconfigurator is installed (`pip install aiconfigurator`, its
`aiconfigurator` on the PATH or given by --aiconfigurator), `aiconfigurator cli default` on the same
question with 16 GPUs. Targets (issue 31): the default case at most 1.0 s wall and 1.5 CPU s, the
conversation case at most 2.5 CPU s. Prints one markdown row per case: the best of 3 runs' wall
time, that run's CPU seconds (the process and the processes it started, user and system) and the
largest peak RSS of one process of the 3 runs. Nothing compiles at run time (the engine core is
compiled by `pip install .`): bench/install_speed.py times the first run after an install.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CONV = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "azure_conv_2023.csv"
FIRST = "embedded Azure code trace, whole catalog"
CASES = {
    FIRST: ["splitplan", "optimize", "--format", "json"],
    "Azure conversation, 70 req/s x 120 s, whole catalog": ["splitplan", "optimize", "--trace", str(CONV), "--rate", "70",
                                                              "--duration", "120", "--format", "json"],
    "embedded Azure code trace, whole catalog, --jobs 1": ["splitplan", "optimize", "--format", "json", "--jobs", "1"],
}


def run(cmd: list[str], env: dict | None = None) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MB) of one run of `cmd` (its own rusage, by wait4: the CPU of the
    processes it waited for included)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def question(folder: Path) -> list[str]:
    """splitplan's command for aiconfigurator's question, its trace and SLO written to `folder`."""
    rng = np.random.default_rng(1)
    arrivals = np.cumsum(rng.exponential(1 / 10.0, 1200))
    trace, slo = folder / "isl4000-osl500-10rps.csv", folder / "aic-p50.yaml"
    with open(trace, "w") as f:
        f.write("arrival_timestamp,prompt_size,token_size\n")
        f.writelines(f"{t - arrivals[0]:.6f},4000,500\n" for t in arrivals)
    slo.write_text("description: aiconfigurator's question, as medians\nttft:\n  p50: {max_ms: 2000}\ntpot:\n  p50: {max_ms: 50}\n")
    return ["splitplan", "optimize", "--trace", str(trace), "--model", "llama3.1-70b", "--engine", "vllm-fp8",
            "--hardware", "h100-80gb", "--slo", str(slo), "--format", "json"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aiconfigurator", default=shutil.which("aiconfigurator"), help="its executable (default: on the PATH)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        cases = {**CASES, "aiconfigurator's question (Llama-3.1-70B fp8, ISL 4,000 / OSL 500, 10 req/s, H100)": question(Path(folder))}
        if args.aiconfigurator:
            cases["the same question to aiconfigurator (cli default, vLLM, 16 GPUs)"] = [
                args.aiconfigurator, "cli", "default", "--model-path", "nvidia/Llama-3.1-70B-Instruct-FP8", "--total-gpus", "16",
                "--system", "h100_sxm", "--backend", "vllm", "--isl", "4000", "--osl", "500", "--ttft", "2000", "--tpot", "50",
                "--target-request-rate", "10", "--save-dir", str(Path(folder) / "aiconfigurator")]
        print("| case | wall s (best of 3) | CPU s (that run) | peak RSS MB |")
        print("|---|---|---|---|")
        for name, cmd in cases.items():
            runs = [run(cmd) for _ in range(3)]
            wall, cpu, _ = min(runs)
            print(f"| {name} | {wall:.2f} | {cpu:.2f} | {max(r[2] for r in runs):.0f} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
