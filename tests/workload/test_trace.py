import contextlib
import gzip
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from splitplan.base.errors import InputWarning, TraceError
from splitplan.cli import app
from splitplan.specs.catalog import data_dir
from splitplan.workload.trace import (
    Columns,
    Trace,
    default_trace_path,
    load_trace,
    resample_poisson,
    summarize,
)
from tests.conftest import DATA


def _write(tmp_path, name, text, mode="w"):
    path = tmp_path / name
    if mode == "wb":
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_embedded_azure_code_trace_matches_published_facts():
    s = summarize(load_trace(default_trace_path()))
    assert s["requests"] == 8819
    assert s["span_s"] / 60 == pytest.approx(57, abs=1)
    assert s["mean_rate_rps"] == pytest.approx(2.57, abs=0.01)
    assert s["interarrival_cv"] == pytest.approx(13, abs=0.5)
    assert (s["prompt_tokens"]["p50"], s["output_tokens"]["p50"]) == (1469, 13)


def test_mooncake_and_conversation():
    moon = summarize(load_trace(DATA / "mooncake_conversation.jsonl.gz"))
    assert moon["requests"] == 12031 and moon["prompt_tokens"]["max"] == 126195
    assert moon["interarrival_cv"] == pytest.approx(3.0, abs=0.1)
    conv = summarize(load_trace(data_dir("traces") / "azure_conv_2023.csv.gz"))
    assert conv["mean_rate_rps"] == pytest.approx(5.53, abs=0.01)


def test_splitwise_generic_and_gzip(tmp_path):
    sw = _write(tmp_path, "sw.csv", "request_id,arrival_timestamp,prompt_size,token_size\n0,0.5,100,10\n1,1.5,200,20\n")
    t = load_trace(sw)
    assert t.arrival_s.tolist() == [0.0, 1.0] and t.prompt_tokens.tolist() == [100, 200]
    gen = _write(tmp_path, "g.csv", "t_ms,inp,out\n0,5,6\n250,7,8\n")
    t = load_trace(gen, Columns("t_ms", "inp", "out", 1e-3))
    assert t.arrival_s.tolist() == [0.0, 0.25] and t.output_tokens.tolist() == [6, 8]
    gz = _write(tmp_path, "sw.csv.gz", gzip.compress(sw.read_bytes()), "wb")
    assert load_trace(gz).prompt_tokens.tolist() == [100, 200]


@pytest.mark.parametrize("text,message", [
    ("arrival_timestamp,prompt_size,token_size\n0,10,5\n1,abc,5\n", "line 3: column prompt_size has 'abc'"),
    ("arrival_timestamp,prompt_size,token_size\n0,10,5\n1,0,5\n", "line 3: column prompt_size is 0"),
    ("arrival_timestamp,prompt_size,token_size\n0,10,-5\n", "line 2: column token_size is -5"),
    ("arrival_timestamp,prompt_size,token_size\n5,10,5\n1,10,5\n", "line 3: arrival goes back in time"),
    ("arrival_timestamp,prompt_size,token_size\n0,,5\n", "line 2: column prompt_size is empty"),
    ("arrival_timestamp,prompt_size,token_size\n0,nan,5\n", "line 2"),
    ("arrival_timestamp,prompt_size,token_size\n", "header only"),
    ("", "empty file"),
    ("when,prompt,out\n0,1,1\n", "missing column"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,2\nyesterday,10,2\n", "line 3: TIMESTAMP 'yesterday'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,2\n2023-13-45 25:61:00,10,2\n",
     "line 3: TIMESTAMP '2023-13-45 25:61:00' is not a date-time"),  # (well formed, out of range: issue 54, item 12)
    ('{"timestamp": 0, "input_length": 5, "output_length": 2}\n{"timestamp": 1, "input_length": 0, "output_length": 2}\n',
     "line 2: column input_length is 0"),
])
def test_bad_traces_name_the_line(tmp_path, text, message):
    with pytest.raises(TraceError, match=message):
        load_trace(_write(tmp_path, "bad.csv", text))


def test_whole_number_times_too_slow_for_seconds_warn_and_name_the_unit(tmp_path):
    """Issue 54, item 12: a detected time column of whole numbers that, read as seconds, gives less
    than one request per 100 s is likely milliseconds: the trace reads, with a warning naming
    --time-unit ms (the command line prints it as one line); fractional or faster times do not warn."""
    slow = _write(tmp_path, "ms.csv", "timestamp,prompt_tokens,output_tokens\n" + "".join(
        f"{k * 470},10,2\n" for k in range(20)))
    with pytest.warns(InputWarning, match="column timestamp holds whole numbers.*give --time-unit ms"):
        load_trace(slow)
    result = CliRunner().invoke(app, ["trace", "summarize", str(slow)])
    assert result.exit_code == 0 and result.stderr.startswith("warning: ") and "--time-unit ms" in result.stderr
    assert "warning" not in CliRunner().invoke(app, ["trace", "summarize", str(slow), "--time-unit", "ms"]).stderr
    for text in ("".join(f"{k * 470 + 0.5},10,2\n" for k in range(20)), "".join(f"{k * 50},10,2\n" for k in range(20))):
        with warnings.catch_warnings():
            warnings.simplefilter("error", InputWarning)
            load_trace(_write(tmp_path, "s.csv", "timestamp,prompt_tokens,output_tokens\n" + text))


def test_directory_binary_and_missing(tmp_path):
    with pytest.raises(TraceError, match="is a directory"):
        load_trace(tmp_path)
    with pytest.raises(TraceError, match="binary"):
        load_trace(_write(tmp_path, "b.bin", b"\x00\x01\x02garbage", "wb"))
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "nope.csv")


def test_poisson_resample_rate_and_determinism():
    base = load_trace(default_trace_path())
    a = resample_poisson(base, 70.0, 120.0, np.random.default_rng(7))
    b = resample_poisson(base, 70.0, 120.0, np.random.default_rng(7))
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert len(a) == pytest.approx(70 * 120, rel=0.05)
    gaps = np.diff(a.arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # Poisson: CV 1
    assert set(a.prompt_tokens) <= set(base.prompt_tokens)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300) | st.text("0123456789,.-e\n{}[]\":abcnx ", max_size=300).map(str.encode)
       | st.builds(lambda body: b"arrival_timestamp,prompt_size,token_size\n" + body.encode(),
                   st.text("0123456789,.-e\ninfa ", max_size=200)))
def test_parser_raises_only_trace_error_on_arbitrary_bytes(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "x.csv"
    path.write_bytes(data)
    with contextlib.suppress(TraceError):
        load_trace(path)


def test_chunked_reading_gives_the_same_trace_and_line_numbers(tmp_path, monkeypatch):
    import importlib
    trace_module = importlib.import_module("splitplan.workload.trace")
    whole = load_trace(default_trace_path())
    monkeypatch.setattr(trace_module, "TRACE_BLOCK_BYTES", 4096)  # blocks of about 150 lines
    chunked = load_trace(default_trace_path())
    assert np.array_equal(whole.arrival_s, chunked.arrival_s) and np.array_equal(whole.prompt_tokens, chunked.prompt_tokens)
    rows = "".join(f"{t},10,5\n" for t in [*range(1500), 1498.5, 1600])  # goes back at line 1502, in a later block
    with pytest.raises(TraceError, match="line 1502: arrival goes back in time"):
        load_trace(_write(tmp_path, "x.csv", "arrival_timestamp,prompt_size,token_size\n" + rows))


def test_peak_window_is_the_busiest_stretch():
    from splitplan.workload.trace import peak_window
    t = Trace(np.array([0.0, 10, 20, 20.5, 21, 40]), np.array([1] * 6), np.array([1] * 6), "t")
    window, info = peak_window(t, 3)
    assert window.arrival_s.tolist() == [0.0, 0.5, 1.0] and info["start_s"] == 20.0 and info["of"] == 6
    assert peak_window(t, 10) == (t, None)


def _both(path):
    """load_trace's result (or error) with and without the plain-CSV reader."""
    import importlib
    trace_module = importlib.import_module("splitplan.workload.trace")
    out = []
    for plain in (trace_module._plain_chunks, lambda *a: None):
        original, trace_module._plain_chunks = trace_module._plain_chunks, plain
        try:
            t = load_trace(path)
            out.append((t.arrival_s.tolist(), t.prompt_tokens.tolist(), t.output_tokens.tolist(), t.prompt_tokens.dtype))
        except TraceError as exc:
            out.append(str(exc))
        finally:
            trace_module._plain_chunks = original
    return out


CELLS = st.sampled_from(["1", "7", "12.0", "1e2", "+3", " 4", '"6"', ".5", "2."] * 5
                        + ["0", "5 ", "", "1_0", "nan", "inf", "0x10", "-2", '"1,0"'])
STAMPS = st.sampled_from(["2023-11-16 18:17:03.9799600", "2023-11-16T18:17:04", "2023-11-16 18:17:05.5", " 2023-11-16 18:17:09"] * 5
                         + ["2023-11-16 18:17:06Z", "2023-11-16 18:17:07+01:00", "2023-11-16", "12345", "2023-11-16 18:17:08.1234567891"])


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["arrival_timestamp,prompt_size,token_size", "TIMESTAMP,ContextTokens,GeneratedTokens",
                        "arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens", "arrival_s, prompt_tokens ,output_tokens",
                        "arrival_s,arrival_s,prompt_tokens,output_tokens"]),
       st.lists(st.tuples(st.integers(0, 3), CELLS, CELLS, STAMPS, st.booleans()), min_size=1, max_size=6))
def test_plain_csv_reading_is_pandas_reading(tmp_path_factory, header, rows):
    """Traces read without pandas (the common plain CSV) give what the pandas reader gives,
    trace or error, whatever the cells; anything odd goes to the pandas reader."""
    lines, t = [header], 0
    for step, prompt, output, stamp, blank in rows:
        t += step
        first = stamp if header.startswith("TIMESTAMP") else str(t)
        width = header.count(",") + 1
        cells = [first, prompt, output, "", ""][:width] if "arrival_s,arrival_s" not in header else [first, first, prompt, output]
        lines.append(",".join(cells) if not blank else "")
    path = tmp_path_factory.mktemp("plain") / "t.csv"
    path.write_text("\n".join(lines) + "\n")
    plain, frames = _both(path)
    assert plain == frames


def test_a_plain_csv_trace_is_read_without_pandas():
    import subprocess
    import sys
    code = ("import sys; from splitplan.workload.trace import load_trace, default_trace_path; t = load_trace(default_trace_path()); "
            "print(len(t), 'pandas' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() == ["8819", "False"]


def test_a_closed_loops_warm_up_outputs_are_graded_so_its_clients_run_out_of_phase():
    """Every client sends its warm-up at once; their outputs, 1/N, 2/N, ... of their length for N
    clients, free the clients spread over a request's life (rounded, at least one token); every
    later request keeps its own size."""
    from splitplan.workload.trace import closed_loop_workload
    work = closed_loop_workload(None, 4, 40, 1000, 10)
    assert work.output_tokens.tolist() == [2, 5, 8, 10] + [10] * 36
    assert (work.prompt_tokens == 1000).all() and (work.arrival_s == 0).all()
    drawn = closed_loop_workload(None, 3, 30, None, None, seed=2)
    raw = closed_loop_workload(None, 1, 30, None, None, seed=2)  # (the same draws; one client's warm-up is all of its output)
    assert drawn.output_tokens[3:].tolist() == raw.output_tokens[3:].tolist()
    assert drawn.output_tokens[:3].tolist() == np.maximum(1, np.round(raw.output_tokens[:3] * np.arange(1, 4) / 3)).tolist()
    assert closed_loop_workload(None, 8, 16, 64, 1).output_tokens.tolist() == [1] * 16
