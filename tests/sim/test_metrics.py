"""The simulator's reports: units, throughput and the per-request CSV."""

import io

import numpy as np
import pandas as pd
import pytest

from splitplan import api
from splitplan.sim.cluster import PoolSpec, SimOptions, simulate
from splitplan.sim.metrics import benchmark_report, percentiles_ms, requests_csv
from splitplan.workload.trace import Trace

H100 = api.instance("llama2-70b", "h100-80gb", 8, "lean")


def test_percentiles_are_milliseconds_over_served_requests():
    out = percentiles_ms(np.array([0.1, 0.2, 0.3, np.nan]))
    assert out["p50"] == pytest.approx(200.0) and out["p99"] == pytest.approx(np.percentile([100, 200, 300], 99))
    assert percentiles_ms(np.array([np.nan]))["p50"] is None


def _run():
    trace = Trace(np.array([0.0, 0.5, 4.0]), np.array([500, 2000, 800]), np.array([20, 5, 40]), "t")
    pools = [PoolSpec("prompt", H100, 1), PoolSpec("token", H100, 1)]
    return simulate(trace, pools, SimOptions()), pools


def test_benchmark_figures_are_per_second_of_the_run_and_per_gpu():
    result, pools = _run()
    report = benchmark_report(result, pools)
    assert report["gpus"] == 16
    assert report["output_tokens_per_s"] == pytest.approx(65 / result.span_s)
    assert report["requests_per_s"] == pytest.approx(3 / result.span_s)
    assert report["output_tokens_per_s_per_gpu"] == pytest.approx(65 / result.span_s / 16)
    # (split pools: the client gets its first token from the token instance, past the transfer)
    client_ttft = result.ttft_s + result.transfer_s + result.decode_queue_s
    assert report["ttft_ms"]["mean"] == pytest.approx(np.mean(client_ttft) * 1e3)
    assert report["ttft_ms"]["mean"] > np.mean(result.ttft_s) * 1e3
    tpot = (result.e2e_s - client_ttft) / (result.trace.output_tokens - 1)
    assert report["tpot_ms"]["mean"] == pytest.approx(np.mean(tpot) * 1e3)
    assert report["tpot_ms"]["mean"] < np.mean(result.tpot_s) * 1e3


def test_requests_csv_rows_are_the_result_in_milliseconds():
    result, _ = _run()
    rows = pd.read_csv(io.StringIO(requests_csv(result, result.names)))
    assert len(rows) == 3 and rows.request.tolist() == [0, 1, 2]
    for column, values in (("ttft_ms", result.ttft_s), ("e2e_ms", result.e2e_s), ("tbt_ms", result.tbt_s)):
        assert rows[column].to_numpy() == pytest.approx(values * 1e3, abs=1e-3)


def test_requests_csv_is_the_row_by_row_text():
    """requests.csv is built column by column (issue 31, item 4): the same bytes as formatting
    each request's row in turn, a rejected request's empty latencies and instances included."""
    trace = Trace(np.array([0.0, 0.25, 0.5, 4.0]), np.array([500, 2000, 800, 2_000_000]), np.array([20, 1, 40, 3]), "t")
    pools = [PoolSpec("prompt", H100, 1), PoolSpec("token", H100, 1)]
    result = simulate(trace, pools, SimOptions())
    assert result.rejected.any()  # (the 2M-token prompt fits no instance)

    def ms(x):
        return "" if not np.isfinite(x) else f"{x * 1e3:.3f}"
    names, r = result.names, result
    rows = [f"{i},{trace.arrival_s[i]:.6f},{trace.prompt_tokens[i]},{trace.output_tokens[i]},{ms(r.ttft_s[i])},{ms(r.tbt_s[i])},"
            f"{ms(r.tbt_max_s[i])},{ms(r.e2e_s[i])},{ms(r.prompt_queue_s[i])},{ms(r.transfer_s[i])},{ms(r.decode_queue_s[i])},"
            f"{names[r.prompt_instance[i]]},{names[r.token_instance[i]]},{int(r.rejected[i])}" for i in range(len(trace))]
    text = requests_csv(result, names)
    assert text.splitlines()[1:] == rows and text.endswith("\n")
