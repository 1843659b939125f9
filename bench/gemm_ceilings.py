"""The measured GEMM ceilings of the catalog's GPUs: the sourced bound on `compute_efficiency`.

    pip install --no-deps aiconfigurator-core==0.12.0 pyarrow   # (bench only: NVIDIA's measured tables, Apache-2.0)
    python bench/gemm_ceilings.py

NVIDIA's aiconfigurator-core 0.12.0 ships measured GEMM latencies per GPU, engine and version
(`systems/data/<system>/gemm/<engine>/<version>/gemm_perf.parquet`: m, n, k, dtype, latency in ms)
over tens of thousands of shapes each. Per catalog GPU and precision this prints the dense GEMM
throughput (2 m n k / latency) that 99 % of the measured shapes stay under, for each engine's
kernels, and their maximum over engines: the best GEMM throughput the GPU sustains at that
precision, the 99th percentile rather than the single best point (a few points sit above any
plausible clock, timer noise). fp8 takes the better of per-tensor and block-scaled kernels, fp4
NVFP4. The figures go into each hardware file's `gpu.gemm_tflop_per_s` (with `gemm_source`),
which bounds every fitted `compute_efficiency` (specs.hardware.HardwareSpec.compute_efficiency_ceiling).
"""

from __future__ import annotations

from importlib import resources

import pandas as pd

# catalog hardware file -> aiconfigurator system (the same GPU; A100 40 GB computes as the 80 GB)
SYSTEMS = {"a100-40gb": "a100_sxm", "a100-80gb": "a100_sxm", "h100-80gb": "h100_sxm", "h100-80gb-cap70": "h100_sxm",
           "h200-141gb": "h200_sxm", "b200-180gb": "b200_sxm", "gb200-nvl72": "gb200", "l40s-48gb": "l40s"}
DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4"}
QUANTILE = 0.99


def ceilings(data) -> pd.DataFrame:
    """Per (system, precision, engine): the QUANTILE of measured GEMM TFLOP/s over every shape."""
    rows = []
    for system in sorted(set(SYSTEMS.values())):
        gemm = data / system / "gemm"
        for engine_dir in sorted(gemm.iterdir()):
            for version_dir in sorted(engine_dir.iterdir()):
                if not (version_dir / "gemm_perf.parquet").is_file():
                    continue
                table = pd.read_parquet(version_dir / "gemm_perf.parquet")
                tflops = 2 * table.m * table.n * table.k / (table.latency * 1e-3) / 1e12
                for dtype, values in tflops.groupby(table.gemm_dtype):
                    if dtype in DTYPES:
                        rows.append({"system": system, "precision": DTYPES[dtype], "engine": f"{engine_dir.name} {version_dir.name}",
                                     "kernel_dtype": dtype, "shapes": len(values), "tflop_per_s": float(values.quantile(QUANTILE))})
    return pd.DataFrame(rows)


def main() -> None:
    data = resources.files("aiconfigurator_core") / "systems" / "data"
    table = ceilings(data)
    pd.set_option("display.width", 200)
    print(table.to_string(index=False, float_format="%.0f"))
    best = table.groupby(["system", "precision"]).tflop_per_s.max()
    print("\nper hardware file (gpu.gemm_tflop_per_s):")
    for name, system in SYSTEMS.items():
        print(f"  {name}: " + "{" + ", ".join(f"{p}: {best[(system, p)]:.0f}" for p in ("bf16", "fp8", "fp4")
                                             if (system, p) in best) + "}")


if __name__ == "__main__":
    main()
