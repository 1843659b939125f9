"""How figures read (issue 54, item 13): money in cents, figures to three significant digits
without exponents, factors of several sizes each legible, catalogs within the terminal, the
prompt queue as a queue, and no numpy types in what the API returns."""

import numpy as np
import pytest
from typer.testing import CliRunner

import splitplan
from splitplan import api
from splitplan.cli import app
from splitplan.io import report
from splitplan.specs.roles import Pool, Role
from splitplan.workload.trace import load_workload

runner = CliRunner()


@pytest.mark.parametrize(("value", "text"), [(0.018349, "0.0183"), (0.2, "0.200"), (14.43, "14.4"), (1234.5, "1,234"),
                                             (1004.2, "1,004"), (0.0, "0")])
def test_figures_have_three_significant_digits_and_no_exponent(value, text):
    assert report.significant(value) == text


def test_a_money_column_shows_cents_and_a_column_of_factors_keeps_each_legible():
    assert [report._column_format([152.0, 190.0], money=True)(v) for v in (152.0, 190.0)] == ["152.00", "190.00"]
    assert [report._column_format([152.0, 190.0])(v) for v in (152.0, 190.0)] == ["152", "190"]
    factors = report._column_format([0.75, 4.263e-06, 0.005])
    assert [factors(v) for v in (0.75, 4.263e-06, 0.005)] == ["0.75", "4.263e-06", "0.005"]


@pytest.mark.parametrize(("command", "left_out"), [(["hardware", "list"], "price date"), (["models", "list"], "FFN kind")])
def test_catalogs_fit_an_80_column_terminal_and_say_what_they_left_out(monkeypatch, command, left_out):
    wide = runner.invoke(app, command).stdout
    assert "left out" not in wide
    monkeypatch.setattr(report, "WIDTH", 80)
    narrow = runner.invoke(app, command).stdout
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert f"left out at this width: {left_out}" in " ".join(narrow.split())


def test_the_prompt_queue_starts_after_the_api_front_end():
    """At a light load nothing queues for a prefill: 0, not the vllm profile's 9.13 ms of front end."""
    trace = load_workload(None, 0.5, 60, 0)
    sim = api.simulate_pools(trace, [Pool(Role.PROMPT, "h100-80gb", 8, 2), Pool(Role.TOKEN, "h100-80gb", 8, 1)],
                                 "llama2-70b", "chat", "vllm")
    assert sim.summary.prompt_queue_ms["p50"] == 0
    served = ~sim.result.rejected  # (refused or never fitting: no prefill starts)
    assert served.sum() > 10 and np.all(sim.result.prompt_queue_s[served] >= 0)


def test_the_api_result_holds_python_numbers():
    result = splitplan.plan(rate=3, duration_s=30, hardware=["h100-80gb"], tp=8)
    assert "np." not in repr(result.plan) and "np." not in repr(result.alternatives)
