"""Op-level accuracy, dense GEMMs: the model's time for one GEMM against NVIDIA's measured kernels.

    pip install --no-deps aiconfigurator-core==0.12.0 pyarrow   # (bench only: NVIDIA's measured tables, Apache-2.0)
    python bench/kernels.py

The first row of issue 55's op-level table, a baseline before per-GPU curves: for each catalog GPU
that aiconfigurator-core ships vLLM 0.24 GEMM tables for (A100: 0.14), each measured shape (m, n, k)
with m from 1 to 16,384 tokens and n, k of at least 1,024 (the projections and FFN matrices of
serving) is timed as the pass formula times a layer's dense GEMMs (perf/kernels.py, operator class
0): the larger of 2 m n k over the GEMM peak at the weights' precision times compute_efficiency
times the token ramp m / (m + gemm_half_tokens), slowed to the sustained clock, and the weights
and activations read at the achieved bandwidth. bf16 shapes with the `vllm` profile, fp8 with
`vllm-fp8`, each with its factors for that machine. Prints MAPE % / median signed error % of the
model against the measured latency per GPU, precision and band of m, and overall; the target of
issue 55 is 10 % in every cell of more than 20 points. Nothing is fitted here.
"""

from __future__ import annotations

from importlib import resources

import numpy as np
import pandas as pd

from splitplan.specs.engine import load_engine
from splitplan.specs.hardware import load_hardware

SYSTEMS = {"a100-80gb": ("a100_sxm", "0.14.0"), "h100-80gb": ("h100_sxm", "0.24.0"), "h200-141gb": ("h200_sxm", "0.24.0"),
           "b200-180gb": ("b200_sxm", "0.24.0"), "gb200-nvl72": ("gb200", "0.24.0"), "l40s-48gb": ("l40s", "0.24.0")}
PROFILES = {"bfloat16": ("bf16", "vllm"), "fp8": ("fp8", "vllm-fp8")}
BANDS = [(1, 16), (17, 256), (257, 4096), (4097, 16384)]


def model_s(hw, engine, m, n, k) -> np.ndarray:
    """The pass formula's time for GEMMs (m, n, k) on `hw` with `engine` (its factors for that machine)."""
    f = engine.factors(hw.name, 1)
    ramp = m / (m + f.gemm_half_tokens)
    compute = 2 * m * n * k / (hw.peak_flops_per_s(engine.weights) * f.compute_efficiency * ramp) / hw.prefill_clock_fraction
    moved = n * k * engine.weight_bytes_per_element + m * (n + k) * engine.bytes_per_element
    memory = moved / (hw.memory_bytes_per_s * f.memory_efficiency)
    return np.maximum(compute, memory)


def rows() -> pd.DataFrame:
    data = resources.files("aiconfigurator_core") / "systems" / "data"
    out = []
    for name, (system, version) in SYSTEMS.items():
        table = pd.read_parquet(data / system / "gemm" / "vllm" / version / "gemm_perf.parquet")
        table = table[(table.m <= 16384) & (table.n >= 1024) & (table.k >= 1024)]
        hw = load_hardware(name)
        for dtype, (precision, profile) in PROFILES.items():
            part = table[table.gemm_dtype == dtype]
            if part.empty or not hw.has_tensor_cores(precision) or (precision == "fp8" and not hw.gpu.fp8_tflop_per_s):
                continue
            m, n, k = (part[c].to_numpy(float) for c in ("m", "n", "k"))
            predicted = model_s(hw, load_engine(profile), m, n, k)
            out.append(pd.DataFrame({"gpu": name, "dtype": precision, "m": m,
                                     "error_pct": (predicted / (part.latency.to_numpy(float) * 1e-3) - 1) * 100}))
    return pd.concat(out, ignore_index=True)


def main() -> None:
    frame = rows()
    print("| GPU | precision | m | points | MAPE % / median signed error % |\n|---|---|---|---|---|")
    for (gpu, dtype), group in frame.groupby(["gpu", "dtype"], sort=True):
        for lo, hi in [*BANDS, (1, 16384)]:
            part = group[(group.m >= lo) & (group.m <= hi)].error_pct
            if len(part):
                band = "all" if (lo, hi) == (1, 16384) else f"{lo}-{hi}"
                print(f"| {gpu} | {dtype} | {band} | {len(part):,} | {part.abs().mean():.0f} / {part.median():+.0f} |")


if __name__ == "__main__":
    main()
