"""How much of the measured kernels' fixed latency do served steps pay? (issue 55, decision (a))

    python bench/latency_share.py [--shares 1,0.5,0.25,0]

NVIDIA's kernel tables time each kernel alone, so each curve's `latency_s` (and an all-reduce's
`large_latency_s`) holds a launch, ramp and tail that an engine replaying its steps as CUDA graphs,
each kernel starting before the last ends (programmatic dependent launch), may hide. Summed as
measured, SGLang's and TensorRT-LLM's decode kernels come to 19-20 % more than their runs' steps
(the composition gap). For each share s, this writes the shipped hardware specs with every kernel
curve's fixed latencies times s to a scratch catalog (SPLITPLAN_PATH, so the fits `bench/fidelity.py`
runs as `splitplan calibrate` see them too), runs `python bench/fidelity.py --start curves` (each
engine's profile timed by its measured curves, its overheads fitted, held out by machine) and
prints each engine's held-out TTFT and TPOT (MAPE % / median %) and the fitted factors that ended
on a bound. About a minute per share on 2 cores. Nothing here is shipped.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LATENCIES = ("latency_s", "large_latency_s")


def scaled(node, share: float):
    """`node` (a hardware spec's kernels) with every fixed latency times `share`."""
    if isinstance(node, dict):
        return {k: v * share if k in LATENCIES and isinstance(v, float) else scaled(v, share) for k, v in node.items()}
    if isinstance(node, list):
        return [scaled(item, share) for item in node]
    return node


def catalog(share: float, folder: Path) -> None:
    (folder / "hardware_specs").mkdir(parents=True)
    for path in sorted((ROOT / "hardware_specs").glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())
        if "kernels" in spec:
            spec["kernels"] = scaled(spec["kernels"], share)
        (folder / "hardware_specs" / path.name).write_text(yaml.safe_dump(spec, sort_keys=False))


def held_out(share: float) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Per engine, its held-out 'TTFT | TPOT' over all runs, and the in-sample fit's factors on a bound."""
    with tempfile.TemporaryDirectory() as tmp:
        catalog(share, Path(tmp) / "catalog")
        env = {**os.environ, "SPLITPLAN_PATH": str(Path(tmp) / "catalog")}
        out = subprocess.run([sys.executable, str(ROOT / "bench" / "fidelity.py"), "--start", "curves", "--write-profiles",
                              str(Path(tmp) / "profiles")], env=env, capture_output=True, text=True, check=True).stdout
        rows = {m.group(1): f"{m.group(2)} | {m.group(3)}"
                for m in re.finditer(r"^\| (\w+) \| all \| all \| \d+ \| ([^|]+?) \| ([^|]+?) \|", out, re.M)}
        bounds = {}
        for engine in rows:
            fit = yaml.safe_load((Path(tmp) / "profiles" / f"{engine}-fp8.yaml").read_text()).get("fit") or {}
            bounds[engine] = sorted(fit.get("at_bound") or {})
    return rows, bounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shares", default="1,0.5,0.25,0")
    args = parser.parse_args()
    print("| engine | share of the curves' fixed latency | TTFT held out | TPOT held out | fitted factors on a bound |")
    print("|---|---|---|---|---|")
    results = {float(s): held_out(float(s)) for s in args.shares.split(",")}
    for engine in ("sglang", "trtllm", "vllm"):
        for share, (rows, bounds) in results.items():
            print(f"| {engine} | {share:g} | {rows[engine]} | {', '.join(bounds[engine]) or 'none'} |")


if __name__ == "__main__":
    main()
