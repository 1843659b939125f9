"""Every script in examples/ runs (in its quick form) and prints its table."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPECT = {
    "deepseek_v3.py": "Costs are lower bounds",
    "diurnal_planning.py": "static plan for the peak window",
    "price_sheets.py": "AWS 2026-11",
    "slo_whatif.py": "TTFT p99 limit",
    "splitwise_design_study.py": "iso-power",
}


def test_every_example_is_listed():
    assert sorted(p.name for p in (ROOT / "examples").glob("*.py")) == sorted(EXPECT)


@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.slow) if s == "splitwise_design_study.py" else s
                                    for s in sorted(EXPECT)])
def test_example_runs(script):
    result = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--quick"], capture_output=True, text=True,
                            timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert EXPECT[script] in result.stdout
