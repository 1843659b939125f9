"""Issue 16: every input bounded, every failure clean. One property test (or more) per class of
failure: silent wrong answers, tracebacks, unbounded reads, output sets that are not atomic.
(Orphaned workers: tests/test_parallel.py.) bench/adversarial.py runs the same classes as whole
processes under a memory cap."""

import gzip
import inspect
import json
import os
import threading
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from splitplan.base import limits
from splitplan.base.errors import SpecError, TraceError
from splitplan.base.inputs import open_regular, parse_document, read_bounded
from splitplan.cli import app
from splitplan.cli.common import OPTION_BOUNDS
from splitplan.io import report
from splitplan.perf.measurements import read_measurements
from splitplan.specs.slo import load_slo
from splitplan.workload import trace as trace_module
from splitplan.workload.trace import load_trace
from tests.conftest import PERF_DB

HEAD = "arrival_timestamp,prompt_size,token_size\n"
ROWS = [f"{k},{100 + k},{10 + k}" for k in range(20)]
FILES = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def _one_error_line(result) -> str:
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) <= 400, result.stderr[:500]
    assert "Traceback" not in result.output
    return lines[0]


# --- silent wrong answers: refused, by line -------------------------------------------------


@FILES
@given(row=st.integers(0, len(ROWS) - 1), tokens=st.integers(limits.MAX_REQUEST_TOKENS + 1, 10 ** 30),
       column=st.sampled_from([1, 2]))
def test_token_counts_beyond_the_bound_are_refused_by_line(tmp_path, row, tokens, column):
    rows = [r.split(",") for r in ROWS]
    rows[row][column] = str(tokens)
    path = _write(tmp_path, "t.csv", HEAD + "\n".join(",".join(r) for r in rows) + "\n")
    with pytest.raises(TraceError, match=f"line {row + 2}: .*token counts must be whole numbers from 1 to 10,000,000"):
        load_trace(path)


@FILES
@given(row=st.integers(0, len(ROWS) - 1), extra=st.lists(st.integers(0, 99), min_size=1, max_size=3))
def test_a_row_with_more_fields_than_the_header_is_refused_by_line(tmp_path, row, extra):
    rows = list(ROWS)
    rows[row] += "".join(f",{x}" for x in extra)
    path = _write(tmp_path, "t.csv", HEAD + "\n".join(rows) + "\n")
    with pytest.raises(TraceError, match=f"line {row + 2}: {3 + len(extra)} fields, the header has 3"):
        load_trace(path)


@FILES
@given(row=st.integers(1, len(ROWS) - 1), factor=st.sampled_from([1.01, 1e3, 1e9, 1e290]))
def test_a_span_over_a_year_is_refused_with_the_unit_hint(tmp_path, row, factor):
    rows = [f"{k if k < row else k + limits.MAX_TRACE_SPAN_S * factor:.17g},100,10" for k in range(len(ROWS))]
    path = _write(tmp_path, "t.csv", HEAD + "\n".join(rows) + "\n")
    with pytest.raises(TraceError, match=f"line {row + 2}: arrival .* more than 366 days after the first; .*--time-unit"):
        load_trace(path)


def test_mixed_utc_offsets_are_read_as_utc(tmp_path):
    path = _write(tmp_path, "azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46+00:00,100,10\n"
                  "2023-11-16 23:15:50+05:00,100,10\n")
    assert load_trace(path).arrival_s.tolist() == [0.0, 4.0]


@FILES
@given(doc=st.sampled_from(["yaml", "json"]), key=st.sampled_from(["description", "ttft", "tbt"]))
def test_duplicate_keys_are_refused(tmp_path, doc, key):
    body = {"description": '"a"', "ttft": '{"p50": {"max_ms": 500}}', "tbt": '{"p50": {"max_ms": 50}}'}
    pairs = [f'"{k}": {v}' for k, v in body.items()] + [f'"{key}": {body[key]}']
    path = _write(tmp_path, f"s.{doc}", "{" + ", ".join(pairs) + "}")
    with pytest.raises(SpecError, match=f"duplicate key '{key}'; keep one"):
        load_slo(str(path))


@settings(max_examples=25, deadline=None)
@given(text=st.text(alphabet=", \t", max_size=6))
def test_an_empty_machine_list_is_an_error_not_the_whole_catalog(text):
    result = CliRunner().invoke(app, ["optimize", "--hardware", text, "--tp", "8"])
    assert result.exit_code == 2 and "--hardware" in _one_error_line(result)


def test_two_machines_under_one_name_are_refused(tmp_path):
    spec = (Path(__file__).resolve().parents[1] / "hardware_specs" / "h100-80gb.yaml").read_text()
    mine = _write(tmp_path, "mine.yaml", "name: h100-80gb\n" + spec.replace("price_usd_per_hour: 38.0", "price_usd_per_hour: 30.0"))
    result = CliRunner().invoke(app, ["optimize", "--hardware", f"h100-80gb,{mine}", "--tp", "8"])
    assert result.exit_code == 2 and "different machines both named 'h100-80gb'" in _one_error_line(result)
    same = CliRunner().invoke(app, ["optimize", "--rate", "3", "--duration", "20", "--hardware", "h100-80gb,h100-80gb",
                                    "--tp", "8", "--format", "json"])
    assert same.exit_code == 0 and json.loads(same.stdout)["plan"]  # the same entry twice counts once


@FILES
@given(row=st.integers(0, 50), value=st.sampled_from(["inf", "-inf", "nan", "two", ""]),
       column=st.sampled_from(["prompt_time", "token_time", "tensor_parallel", "batch_size"]))
def test_a_perf_db_cell_that_is_not_a_finite_number_names_its_line(tmp_path, row, value, column):
    lines = PERF_DB.read_text().splitlines()
    header = lines[0].split(",")
    cells = lines[row + 1].split(",")
    cells[header.index(column)] = value
    lines[row + 1] = ",".join(cells)
    path = _write(tmp_path, "db.csv", "\n".join(lines) + "\n")
    if value in ("", "nan"):  # an empty cell drops the row (splitwise-sim's file has incomplete rows)
        read_measurements(path)
        return
    with pytest.raises(TraceError, match=f"line {row + 2}: column {column} has '{value}', not a finite number"):
        read_measurements(path)


# --- tracebacks: every numeric option out of bounds is one error line -------------------------


def _numeric_options():
    """(command words, flag, int or float) of every int or float option of every command."""
    out = []

    def walk(group, words):
        for command in group.registered_commands:
            callback = inspect.unwrap(command.callback)
            hints = typing.get_type_hints(callback)
            for name, parameter in inspect.signature(callback).parameters.items():
                flags = getattr(parameter.default, "param_decls", None)
                kinds = {hints[name], *typing.get_args(hints[name])} & {int, float}
                if flags and kinds:
                    out.append(([*words, command.name or callback.__name__], flags[0], kinds.pop()))
        for sub in group.registered_groups:
            walk(sub.typer_instance, [*words, sub.name])
    walk(app, [])
    return out


NUMERIC = _numeric_options()
_TRACE = Path(__file__).resolve().parents[1] / "traces" / "azure_code_2023.csv"


def test_every_numeric_option_has_a_bound():
    assert NUMERIC and sorted({flag for _, flag, _ in NUMERIC} - set(OPTION_BOUNDS)) == []


def _outside(bound, is_int: bool):
    low = bound.low if bound.low_open else bound.low - 1
    values = st.one_of(st.integers(-10 ** 20, int(low)), st.integers(int(bound.high) + 1, 10 ** 20))
    if not is_int:
        values = st.one_of(values.map(float), st.sampled_from([float("nan"), float("inf"), float("-inf")]),
                           st.floats(bound.high * 1.001, 1e300))
    return values


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_numeric_options_outside_their_bounds_exit_2_with_one_line(data):
    command, flag, kind = data.draw(st.sampled_from(NUMERIC))
    value = data.draw(_outside(OPTION_BOUNDS[flag], kind is int))
    required = {"sweep": ["--rates", "2"], "compare": ["--scenario", "iso-power"], "trace": [str(_TRACE)]}
    result = CliRunner().invoke(app, [*command, *required.get(command[0], []), flag, str(value)])
    assert result.exit_code == 2, (command, flag, value, result.output)
    assert flag in _one_error_line(result)


@settings(max_examples=40, deadline=None)
@given(rates=st.one_of(st.sampled_from(["nan", "inf", "1e12", "0", "-1", "1:2:1000000000", "1:nan:3", ",", "x"]),
                       st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=4)
                       .filter(lambda r: not all(0 < x <= limits.MAX_RATE_RPS for x in r)).map(lambda r: ",".join(map(str, r)))))
def test_sweep_rates_outside_their_bounds_exit_2(rates):
    result = CliRunner().invoke(app, ["sweep", "--rates", rates, "--prompt-pool", "h100-80gb:8:1", "--token-pool", "h100-80gb:8:1"])
    assert result.exit_code == 2 and "--rates" in _one_error_line(result)


@settings(max_examples=30, deadline=None)
@given(option=st.sampled_from(["--prompt-pool", "--mixed-pool"]), tp=st.integers(0, 10 ** 12),
       machines=st.one_of(st.just(0), st.integers(limits.MAX_MACHINES + 1, 10 ** 30)))
def test_pools_of_absurd_sizes_exit_2(option, tp, machines):
    result = CliRunner().invoke(app, ["simulate", option, f"h100-80gb:{tp}:{machines}", "--token-pool", "h100-80gb:8:1"])
    assert result.exit_code == 2 and option in _one_error_line(result)


@settings(max_examples=20, deadline=None)
@given(batch=st.integers(0, 10 ** 15), tokens=st.integers(limits.MAX_REQUEST_TOKENS + 1, 10 ** 15),
       option=st.sampled_from(["--prefill", "--decode"]))
def test_perf_points_beyond_bounds_exit_2(batch, tokens, option):
    result = CliRunner().invoke(app, ["perf", option, f"{batch}x{tokens}"])
    assert result.exit_code == 2 and option in _one_error_line(result)


@FILES
@given(depth=st.one_of(st.integers(limits.MAX_NESTING + 1, 5_000), st.just(1_000_000)), as_json=st.booleans())
def test_deep_nesting_is_refused_without_a_recursion_error(tmp_path, depth, as_json):
    text = '{"a": ' + "[" * depth + "]" * depth + "}" if as_json else "a: " + "[" * depth + "]" * depth + "\n"
    with pytest.raises(SpecError, match="nested deeper than 32 levels"):
        parse_document(text, tmp_path / "x", as_json)


def test_nesting_within_the_bound_is_read():
    for as_json, text in ((True, '{"a": ' + "[" * 31 + "]" * 31 + "}"), (False, "a: " + "[" * 31 + "]" * 31 + "\n")):
        value = parse_document(text, Path("x"), as_json)["a"]
        for _ in range(30):
            value = value[0]
        assert value == []


def test_yaml_aliases_are_refused(tmp_path):
    with pytest.raises(SpecError, match="YAML aliases"):
        parse_document("a: &x [1, 2]\nb: *x\n", tmp_path / "x.yaml", False)
    laughs = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    laughs += [f"a{k}: &a{k} [" + ", ".join([f"*a{k - 1}"] * 9) + "]" for k in range(1, 10)]  # 9^10 once expanded
    with pytest.raises(SpecError, match="YAML aliases"):
        parse_document("\n".join(laughs) + "\n", tmp_path / "bomb.yaml", False)


@FILES
@given(name=st.sampled_from(["plan.json", "deep.json", "huge.json"]))
def test_malformed_plans_exit_2(tmp_path, name):
    text = {"plan.json": '{"plan": {"prompt_pools": [{"hardware": "h100-80gb", "tp": "eight", "machines": 1}]}}',
            "deep.json": '{"plan": ' + "[" * 50_000 + "]" * 50_000 + "}",
            "huge.json": '{"plan": {"prompt_pools": [{"hardware": "h100-80gb", "tp": 8, "machines": 100000000}]}}'}[name]
    result = CliRunner().invoke(app, ["simulate", "--plan", str(_write(tmp_path, name, text))])
    assert result.exit_code == 2 and "--plan" in _one_error_line(result)


def test_a_malformed_jsonl_line_is_named(tmp_path):
    path = _write(tmp_path, "t.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                  '{"timestamp": 1, "input_length": 10, "output_length": 5}\n{"timestamp": 2, "input_length": \n')
    with pytest.raises(TraceError, match="line 3: not a JSON object"):
        load_trace(path)


# --- unbounded reads --------------------------------------------------------------------------


def test_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "trace.csv"
    os.mkfifo(fifo)
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(CliRunner().invoke(app, ["trace", "summarize", str(fifo)])),
                              daemon=True)
    worker.start()
    worker.join(20)
    if worker.is_alive():  # unblock the reader so the test run can end, then fail
        with open(fifo, "w"):
            pass
        pytest.fail("reading a FIFO hung")
    assert outcome[0].exit_code == 2 and "not a regular file" in _one_error_line(outcome[0])
    with pytest.raises(SpecError, match="not a regular file"):
        open_regular(fifo, "spec")


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
@pytest.mark.parametrize("args", [["perf", "--hardware", "/dev/zero"], ["optimize", "--slo", "/dev/zero"],
                                  ["trace", "summarize", "/dev/zero"], ["perf", "--perf-db", "/dev/zero"]])
def test_devices_are_never_read(args):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "not a regular file" in _one_error_line(result)


@FILES
@given(extra=st.integers(1, 5000))
def test_files_read_whole_are_bounded(tmp_path, extra):
    path = _write(tmp_path, "big.yaml", b"#" * (4096 + extra))
    with pytest.raises(SpecError, match="larger than"):
        read_bounded(path, 4096, "spec")
    assert len(read_bounded(path, 4096 + extra, "spec")) == 4096 + extra


def test_a_gzip_bomb_stops_at_the_request_bound(tmp_path, monkeypatch):
    """The bound on requests stops a decompression bomb after that many rows; memory is the
    block's plus the rows' (bench/adversarial.py: a 1.8 GB bomb under a 3 GB cap)."""
    monkeypatch.setattr(trace_module, "MAX_TRACE_REQUESTS", 5_000)
    monkeypatch.setattr(trace_module, "TRACE_BLOCK_BYTES", 8192)
    path = tmp_path / "bomb.csv.gz"
    with gzip.open(path, "wb") as z:
        z.write(HEAD.encode() + b"1,100,10\n" * 50_000)
    with pytest.raises(TraceError, match="more than 5,000 requests"):
        load_trace(path)


def test_a_line_longer_than_a_block_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_module, "TRACE_BLOCK_BYTES", 4096)
    path = _write(tmp_path, "t.csv", HEAD + "0,100,10\n1," + "9" * 10_000 + ",10\n")
    with pytest.raises(TraceError, match="line 3 is longer than"):
        load_trace(path)


@FILES
@given(cell=st.text(st.characters(exclude_characters=',\n\r"', exclude_categories=("Cs",)), min_size=200, max_size=5000)
       .map(lambda s: "x" + s))
def test_error_messages_show_only_an_excerpt_of_a_cell(tmp_path, cell):
    path = _write(tmp_path, "t.csv", HEAD + f"0,100,10\n1,{cell},10\n")
    result = CliRunner().invoke(app, ["trace", "summarize", str(path)])
    assert result.exit_code == 2
    assert len(_one_error_line(result)) < 400 + len(str(path))


def test_unknown_keys_are_shown_only_as_excerpts(tmp_path):
    path = _write(tmp_path, "s.yaml", "a" * 5000 + ": 1\n")
    with pytest.raises(SpecError) as info:
        load_slo(str(path))
    assert len(str(info.value)) < 200 + len(str(path))


# --- output sets: all or nothing, never mixed ---------------------------------------------------


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blocked=st.sampled_from(["plan.json", "candidates.csv", "pareto.csv"]))
def test_a_failed_output_set_leaves_the_old_set_whole(tmp_path_factory, blocked):
    out = tmp_path_factory.mktemp("out")
    args = ["optimize", "--rate", "3", "--duration", "20", "--hardware", "h100-80gb", "--tp", "8", "--output-dir", str(out)]
    assert CliRunner().invoke(app, args).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (out / blocked).unlink()
    (out / blocked).mkdir()  # a folder in the way of one file of the set
    failed = CliRunner().invoke(app, [*args[:-2], "--seed", "5", "--output-dir", str(out)])
    assert failed.exit_code == 2 and "cannot write" in _one_error_line(failed)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == {k: v for k, v in before.items() if k != blocked}
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left


@pytest.mark.parametrize("where", ["file", "under_file", "proc"])
def test_output_paths_that_cannot_be_written_exit_2(tmp_path, where):
    a_file = _write(tmp_path, "f", "x")
    target = {"file": a_file, "under_file": a_file / "out", "proc": Path("/proc/splitplan-out")}[where]
    result = CliRunner().invoke(app, ["simulate", "--prompt-pool", "h100-80gb:8:1", "--token-pool", "h100-80gb:8:1",
                                      "--rate", "2", "--duration", "10", "--output-dir", str(target)])
    assert result.exit_code == 2 and "cannot write" in _one_error_line(result)


def test_concurrent_output_sets_never_mix(tmp_path):
    """Two writers of the same set into one folder: each set is written whole under the folder's
    lock, so the folder ends as one writer's set, never a mix."""
    names = [f"f{k}.txt" for k in range(20)]
    errors = []

    def writer(tag: str):
        try:
            for _ in range(30):
                report.write_set({tmp_path / n: f"{tag}\n" * 2000 for n in names})
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=writer, args=(tag,)) for tag in ("a", "b")]
    for t in threads:
        t.start()
    seen = set()
    for _ in range(200):  # read the set while the writers run, under the same lock
        with report._locked(tmp_path):
            contents = {(tmp_path / n).read_text() for n in names if (tmp_path / n).exists()}
        assert len(contents) <= 1, "a mixed set"
        seen |= contents
    for t in threads:
        t.join()
    assert not errors and len({(tmp_path / n).read_text() for n in names}) == 1


def test_a_full_disk_is_bad_output_and_leaves_nothing(tmp_path, monkeypatch):
    import errno
    (tmp_path / "a.csv").write_text("old")
    real = report._write_temp
    written = []

    def fills_up(path, content, executable=False):
        if written:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        written.append(real(path, content, executable))
        return written[-1]
    monkeypatch.setattr(report, "_write_temp", fills_up)
    with pytest.raises(SpecError, match="cannot write .No space left on device"):
        report.write_set({tmp_path / "a.csv": "new", tmp_path / "b.csv": "new"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv"] and (tmp_path / "a.csv").read_text() == "old"


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capfd):
    import sys

    from splitplan.cli import catalog, main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(catalog, "api", type("Api", (), {"__getattr__": lambda self, name: interrupted})())
    monkeypatch.setattr(sys, "argv", ["splitplan", "perf"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 130 and capfd.readouterr().err == "error: interrupted\n"


@settings(max_examples=15, deadline=None)
@given(rate=st.sampled_from([float("nan"), float("inf"), -1.0, 0.0, 1e12]),
       duration=st.sampled_from([float("nan"), 10.0, 1e15]))
def test_the_library_refuses_the_same_values(rate, duration):
    import splitplan
    with pytest.raises(SpecError):
        splitplan.plan(rate=rate, duration_s=duration, hardware=["h100-80gb"], tp=8)
