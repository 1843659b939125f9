"""Token counts that are not a multiple of 16: what NVIDIA's GEMM tables say they cost, held out.

    pip install --no-deps aiconfigurator-core==0.12.0 pyarrow   # (bench only)
    python bench/gemm_alignment.py [--gpu NAME ...] [--engine NAME ...]

aiconfigurator-core 0.12.0's GEMM tables time m (the tokens of a pass) at multiples of 16 and at the
row after (129, 257, 513, ...). On Hopper, vLLM's and SGLang's fp8 GEMMs take up to twice as long at
m + 1 as at m. Per engine, GPU and precision this fits `bench/fit_kernels.py`'s GEMM curve twice,
held out by model shape as there: as shipped (`perf.curves.gemm_s`), and with the rows of more than
128 tokens and m not a multiple of 16 at a fitted share of the curve's efficiency
(`unaligned_share`), and prints the MAPE % of each over all rows, the m + 1 rows and the aligned
rows. The curves the hardware files ship are the first: which residues pay (m mod 4 or mod 16)
the tables do not say. About 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import numpy as np
from fit_kernels import BYTES, FOLDS, GEMM, SYSTEMS, VERSIONS, _folds, fit, operator_frames

from splitplan.perf import curves
from splitplan.specs.hardware import load_hardware

UNALIGNED = {**GEMM, "unaligned_share": (0.8, 0.1, 1.0)}
SMALL_ROWS = 128  # at most this many rows the tables show no cost at m + 1 but at the size buckets' edges


def unaligned(m: np.ndarray) -> np.ndarray:
    return (m % 16 != 0) & (m > SMALL_ROWS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", nargs="*", default=["h100-80gb", "h200-141gb", "b200-180gb"])
    parser.add_argument("--engine", nargs="*", default=list(VERSIONS))
    args = parser.parse_args()
    print(f"Held out by model shape ({FOLDS} folds), MAPE %: as shipped / with the unaligned share\n")
    print("| engine | GPU | precision | all rows | m + 1 rows | aligned rows | unaligned share |\n|---|---|---|---|---|---|---|")
    for engine in args.engine:
        for gpu in args.gpu:
            hw = load_hardware(gpu)
            for (op, key), frame in operator_frames(SYSTEMS[gpu], engine).items():
                if op != "gemm" or hw.native_precision(key) != key:
                    continue
                peak, wbpe, m = hw.peak_flops_per_s(key), BYTES[key], frame.m.to_numpy(float)

                def shipped(c, f, peak=peak, wbpe=wbpe, bandwidth=hw.memory_bytes_per_s):
                    return curves.gemm_s(c, peak, bandwidth, f.m.to_numpy(float), f.n.to_numpy(float),
                                         f.k.to_numpy(float), wbpe)

                def shared(c, f, shipped=shipped):
                    share = np.where(unaligned(f.m.to_numpy(float)), c.unaligned_share, 1.0)
                    return shipped(SimpleNamespace(**{**vars(c), "efficiency": c.efficiency * share}), f)

                folds = _folds(frame.n, frame.k)
                _, before, _ = fit(shipped, GEMM, frame, folds)
                params, after, hit = fit(shared, UNALIGNED, frame, folds)
                cells = [" / ".join(f"{np.nanmean(np.abs(e[rows])):.1f}" for e in (before, after))
                         for rows in (np.ones(len(m), bool), unaligned(m), (m % 16 == 0) & (m > SMALL_ROWS))]
                bound = " (on its bound)" if "unaligned_share" in hit else ""
                print(f"| {engine} | {gpu} | {key} | {' | '.join(cells)} | {params['unaligned_share']:.2f}{bound} |")


if __name__ == "__main__":
    main()
