"""Comparing two price sheets: the same workload planned under two clouds' prices.

    python examples/price_sheets.py [--quick]

Hardware files hold datasheet figures and a price with its source and date; a price
sheet is just another set of files. Here: Splitwise's 2023 prices against the
2026-11 AWS on-demand quotes in REFERENCE.md (p4de A100 80GB $3.43, p5 H100 $6.88
per GPU-hour). The cheapest plan, and even its shape, can change with the sheet.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import yaml

import splitplan
from splitplan.specs.catalog import data_dir

AWS_2026_11 = {"a100-80gb": (8 * 3.43, "AWS p4de on-demand, $3.43 per GPU-hour"),
               "h100-80gb": (8 * 6.88, "AWS p5 on-demand, $6.88 per GPU-hour")}


def repriced(folder: Path) -> list[str]:
    paths = []
    for name, (price, source) in AWS_2026_11.items():
        spec = yaml.safe_load((data_dir("hardware_specs") / f"{name}.yaml").read_text())
        spec.update(price_usd_per_hour=price, price_source=source, price_date="2026-11")
        path = folder / f"{name}.yaml"  # same stem: the plans still name the machine types alike
        path.write_text(yaml.safe_dump(spec))
        paths.append(str(path))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a shorter trace, for tests")
    args = parser.parse_args()
    rate, duration = (20.0, 60.0) if args.quick else (40.0, 120.0)
    with tempfile.TemporaryDirectory() as tmp:
        sheets = {"Splitwise 2023 (CoreWeave-like)": ["a100-80gb", "h100-80gb"], "AWS 2026-11": repriced(Path(tmp))}
        for sheet, hardware in sheets.items():
            result = splitplan.plan(rate=rate, duration_s=duration, hardware=hardware, tp=8)
            p = result.plan
            print(f"{sheet:<34} prompt {' + '.join(f'{x.machines}x {x.hardware}' for x in p.prompt_pools):<16} "
                  f"token {' + '.join(f'{x.machines}x {x.hardware}' for x in p.token_pools):<16} "
                  f"${p.cost_usd_per_hour:,.1f}/h  {p.power_kw:.1f} kW")


if __name__ == "__main__":
    main()
