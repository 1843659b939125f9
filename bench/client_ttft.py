"""Split plans' TTFT as the SLO stamps it (the prefill's end) and as a benchmark client sees it.

    python bench/client_ttft.py [--quick]

splitplan's SLO `ttft` is Splitwise's: stamped when the prefill ends, the KV transfer and the wait
for the token instance's admission left to the first gap. Today's disaggregated stacks stream the
whole answer from the decode worker (vLLM's P/D proxy and Dynamo, SGLang's router, TensorRT-LLM's
disaggregated server), so a benchmark client gets its first token only after both
(`SimResult.client_ttft_s`, `summary.benchmark`). For split plans (`optimize --split-only`, H100
TP 8, default engine and model) over traces, rates and SLO profiles, this plans, simulates the
plan on the same requests (as `simulate --plan` does), and prints per TTFT line the value the SLO stamps
beside the client's, and whether the line would hold on the client's: what the plans would lose
if the SLO's TTFT were the client's. About 10 s on 2 cores.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import yaml

import splitplan

ROOT = Path(__file__).resolve().parents[1]
TRACES = {"code": None, "conversation": ROOT.parent / "shared" / "data" / "traces" / "azure_conv_2023.csv"}
RATES = (5, 20, 70)
SLOS = ("chat", "code-completion")


def run(*args: str) -> str:
    return subprocess.run(["splitplan", *args], check=True, capture_output=True, text=True).stdout


def ttft_lines(slo: str) -> dict[str, float]:
    """The profile's TTFT lines, percentile -> limit in ms."""
    lines = yaml.safe_load((ROOT / "slo_profiles" / f"{slo}.yaml").read_text())["ttft"]
    return {p: float(v["max_ms"]) for p, v in lines.items()}


def case(trace: Path | None, rate: float, slo: str, scratch: Path) -> list[dict] | None:
    out = scratch / f"{rate}-{slo}"
    source = ["--trace", str(trace)] if trace else []
    try:
        run("optimize", *source, "--rate", str(rate), "--duration", "120", "--slo", slo, "--hardware", "h100-80gb",
            "--tp", "8", "--split-only", "--output-dir", str(out), "--format", "json")
    except subprocess.CalledProcessError:
        return None  # (no split plan meets the SLO)
    result = splitplan.simulate(out / "plan.json").result  # (as `simulate --plan` replays it)
    served = np.isfinite(result.ttft_s)
    stamped_ms, client_ms = result.ttft_s[served] * 1e3, result.client_ttft_s[served] * 1e3
    out_rows = []
    for p, limit in ttft_lines(slo).items():
        q = float(p[1:])
        stamped, seen = float(np.percentile(stamped_ms, q)), float(np.percentile(client_ms, q))
        out_rows.append({"rate": rate, "slo": slo, "line": f"TTFT {p} <= {limit:g}",
                         "stamped_ms": stamped, "client_ms": seen, "added_ms": seen - stamped,
                         "holds_stamped": stamped <= limit, "holds_client": seen <= limit})
    return out_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the embedded trace at 20 req/s only")
    args = parser.parse_args()
    traces = {"code": None} if args.quick else {k: v for k, v in TRACES.items() if v is None or v.exists()}
    rates = (20,) if args.quick else RATES
    print("| trace | rate | SLO | line | stamped (prefill end) ms | client ms | added ms | holds stamped / client |")
    print("|---|---|---|---|---|---|---|---|")
    added, lost, lines = [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, trace in traces.items():
            for rate in rates:
                for slo in SLOS:
                    rows = case(trace, rate, slo, Path(tmp) / name)
                    if rows is None:
                        print(f"| {name} | {rate} | {slo} | no split plan | | | | |")
                        continue
                    for r in rows:
                        lines += 1
                        added.append(r["added_ms"])
                        lost += r["holds_stamped"] and not r["holds_client"]
                        print(f"| {name} | {rate} | {slo} | {r['line']} | {r['stamped_ms']:.1f} | {r['client_ms']:.1f} | "
                              f"{r['added_ms']:+.1f} | {'yes' if r['holds_stamped'] else 'no'} / "
                              f"{'yes' if r['holds_client'] else 'no'} |")
    print(f"\n{lines} TTFT lines of split plans: the client's TTFT adds {min(added):.1f}-{max(added):.1f} ms "
          f"(median {np.median(added):.1f}); {lost} line(s) that hold as stamped would fail on the client's.")


if __name__ == "__main__":
    main()
