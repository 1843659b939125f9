"""Serving benchmarks a team already ran, read by their documented output formats: each file
(or directory) becomes one `BenchRun` per measured run or load stage.

Formats, detected from content (`read_benchmarks(..., fmt=...)` forces one):
- `vllm`: `vllm bench serve --save-result` JSON (`benchmarks/serve.py`): `duration`, `completed`,
  `request_rate` ("inf": all at once), `burstiness` (gamma shape: 1 is Poisson), `max_concurrency`,
  `model_id`, the `mean_/median_/pNN_{ttft,tpot,e2el}_ms` aggregates, `total_input_tokens` and
  `total_output_tokens`, and with `--save-detailed` per request `input_lens`, `output_lens`,
  `ttfts`, `latencies`, `start_times` (s) and `errors`; `--metadata KEY=VALUE` pairs (tp=,
  max_num_batched_tokens=, ...) are top-level keys. `--append-result` files hold one run a line.
- `inference-perf`: a `stage_N_lifecycle_metrics.json` report (kubernetes-sigs/inference-perf
  reportgen): `load_summary` (`requested_rate`, `achieved_rate`, `send_duration`, `concurrency`),
  `successes` (`count`, `latency.{time_to_first_token,request_latency}` in seconds with
  `mean`/`median`/`pNN`, `prompt_len` or `prompt_tokens` and `output_len` distributions). A
  directory's `summary_lifecycle_metrics.json` (all stages at once) is skipped where stage
  reports exist. Its `time_per_output_token` counts streamed chunks in older versions, so TPOT is
  taken as (mean E2E - mean TTFT) / (mean output - 1), as the simulated one is.
- `guidellm`: a GuideLLM JSON report (`GenerativeBenchmarksReport`): one run per entry of
  `benchmarks`, its load from `config.strategy` (`synchronous`, `concurrent` with `streams`,
  `throughput`, `constant` or `poisson` with `rate`), its `metrics` (`time_to_first_token_ms`,
  `inter_token_latency_ms`: vLLM's TPOT, `request_latency` in s, `prompt_token_count`,
  `output_token_count`, each under `successful` with `mean`/`median`/`percentiles.pNN`) and, where
  kept, `requests.successful` (per request `prompt_tokens`, `output_tokens`,
  `request_start_time`, `time_to_first_token_ms`, `request_latency`).
- `aiperf`: NVIDIA AIPerf's `profile_export_aiperf.json` or genai-perf's
  `profile_export_genai_perf.json`: per metric (`time_to_first_token`, `inter_token_latency`,
  `request_latency` in ms, `input_sequence_length`, `output_sequence_length`) `avg`/`pNN`, the
  load in `input_config` (`loadgen.concurrency`, `loadgen.request_rate`,
  `loadgen.request_rate_mode`; genai-perf: top-level `concurrency`, `request_rate`), the model in
  `endpoint.model_names` (genai-perf: `model`); AIPerf's per-request `profile_export.jsonl` beside
  it (records of `metadata.request_start_ns` and `metrics.{input_sequence_length,
  output_sequence_length, time_to_first_token, request_latency}.value`) gives the requests.

Times are held in seconds, measured figures in ms (`BenchRun.measured_ms`: `ttft_mean`,
`ttft_p50`, `ttft_p90`, `ttft_p99`, `tpot_mean`, `e2e_mean`, `e2e_p50`, `e2e_p90`, `e2e_p99`, the
ones the file records). A file that is none of these, or whose key holds no number where one
belongs, is a TraceError naming the file and the key.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from splitplan.base.errors import TraceError
from splitplan.base.inputs import excerpt, read_text
from splitplan.base.limits import MAX_REQUEST_TOKENS

FORMATS = ("vllm", "inference-perf", "guidellm", "aiperf")
METRICS = ("ttft_mean", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_mean", "e2e_mean", "e2e_p50", "e2e_p90", "e2e_p99")
MAX_BENCH_BYTES = 512 << 20  # a --save-detailed file keeps every generated text: tens to hundreds of MB for long runs
SUFFIXES = (".json", ".jsonl")


@dataclass(frozen=True)
class BenchRun:
    """One measured run (or load stage) of a serving benchmark: its load, its requests where
    recorded, what it measured and the engine settings it records."""

    source: str  # the file, and the run within it
    tool: str  # one of FORMATS
    measured_ms: dict[str, float]  # of METRICS, those recorded
    requests: int  # successful requests measured
    rate_rps: float | None = None  # open loop at this rate; None: closed loop or all at once
    arrival: str = "poisson"  # poisson, gamma (shape `burstiness`), constant
    burstiness: float = 1.0
    concurrency: int | None = None  # closed loop of this many clients
    warmup_requests: int = 0  # sent before the measured ones at the same load, left out by the tool
    tpot_of_means: bool = False  # TPOT as (mean E2E - mean TTFT) / (mean output - 1), not a mean per request
    input_tokens: np.ndarray | None = None  # per measured request, in send order
    output_tokens: np.ndarray | None = None
    start_s: np.ndarray | None = None  # send times from the first
    isl_mean: float | None = None
    osl_mean: float | None = None
    stage: int | None = None  # inference-perf's load stage
    # model, tp, max_num_batched_tokens, max_num_seqs, max_model_len, gpu_memory_utilization, prefix_caching, precision
    settings: dict[str, Any] = field(default_factory=dict)
    sent: int | None = None  # requests sent, failed ones included (inference-perf's load_summary.count)
    cached_tokens: np.ndarray | None = None  # per measured request, prompt tokens the server's prefix cache held
    # Where only a summary is kept: the recorded quantiles of the prompt and output lengths (level: tokens).
    isl_quantiles: dict[float, float] = field(default_factory=dict)
    osl_quantiles: dict[float, float] = field(default_factory=dict)

    @property
    def closed_loop(self) -> bool:
        return self.concurrency is not None and self.rate_rps is None


def read_benchmarks(paths: list[str | Path], fmt: str | None = None) -> list[BenchRun]:
    """Every run in `paths` (files, or directories: their .json and .jsonl files, those that are
    no benchmark output skipped), in the order given."""
    if fmt is not None and fmt not in FORMATS:
        raise TraceError(f"--bench-format {excerpt(fmt)}: choose one of {', '.join(FORMATS)}")
    runs: list[BenchRun] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = _directory(path, fmt)
            if not found:
                raise TraceError(f"{path}: no benchmark output found (vllm bench serve, inference-perf, GuideLLM or AIPerf "
                                 "JSON); pass the result files or their directory")
            runs += found
        else:
            runs += _file(path, fmt, explicit=True)
    return runs


def _natural(path: Path) -> list:
    """A file name's sort key with its numbers as numbers (stage_2 before stage_10)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


# Per-request records, read with the report beside them (not parsed on their own: they can be large).
RECORDS = ("per_request_lifecycle_metrics.json", "profile_export.jsonl")


def _directory(path: Path, fmt: str | None) -> list[BenchRun]:
    files = sorted((p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file() and p.name not in RECORDS),
                   key=_natural)
    names = {p.name for p in files}
    if any(re.fullmatch(r"stage_\d+_lifecycle_metrics\.json", n) for n in names):
        files = [p for p in files if p.name != "summary_lifecycle_metrics.json"]  # (every stage at once)
    out: list[BenchRun] = []
    for p in files:
        out += _file(p, fmt, explicit=False)
    records = path / "per_request_lifecycle_metrics.json"
    return _inference_perf_requests(records, out) if records.is_file() else out


def _documents(path: Path) -> list[Any]:
    text = read_text(path, MAX_BENCH_BYTES, "benchmark result", TraceError)
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        pass
    except RecursionError:
        raise TraceError(f"{path}: nested too deeply to be a benchmark result") from None
    docs = []
    for number, line in enumerate(text.splitlines(), 1):  # JSON lines (vllm --append-result, AIPerf records)
        if line.strip():
            try:
                docs.append(json.loads(line))
            except (json.JSONDecodeError, RecursionError):
                raise TraceError(f"{path}: line {number} is not valid JSON; pass the benchmark's JSON result file") from None
    return docs


def detect(doc: Any) -> str | None:
    """The format of one parsed document, from its keys (None: none of FORMATS)."""
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("benchmarks"), list):
        return "guidellm"
    if "load_summary" in doc and "successes" in doc:
        return "inference-perf"
    if "input_config" in doc or isinstance(doc.get("time_to_first_token"), dict):
        return "aiperf"
    if "completed" in doc and "duration" in doc:
        return "vllm"
    return None


def _file(path: Path, fmt: str | None, explicit: bool) -> list[BenchRun]:
    docs = _documents(path)
    kinds = {(fmt if isinstance(d, dict) else None) or detect(d) for d in docs}
    if len(kinds) != 1 or None in kinds:
        if not explicit:
            return []
        raise TraceError(f"{path}: not a benchmark result this tool reads (vllm bench serve --save-result, inference-perf "
                         "lifecycle report, GuideLLM JSON report, AIPerf or genai-perf profile export); "
                         "give --bench-format if it is one of them")
    kind = str(kinds.pop())
    if kind == "guidellm":
        return [run for d in docs for run in _guidellm(path, d)]
    reader = {"vllm": _vllm, "inference-perf": _inference_perf, "aiperf": _aiperf}[kind]
    return [reader(path if len(docs) == 1 else Path(f"{path} (line {k + 1})"), d) for k, d in enumerate(docs)]


# --- values, checked -------------------------------------------------------------------------


def _get(doc: Any, path: Path, keys: str, required: bool = True) -> Any:
    """doc[a][b]... for keys "a.b...", or None where absent and not required."""
    value = doc
    for key in keys.split("."):
        if not isinstance(value, dict) or value.get(key) is None:
            if required:
                raise TraceError(f"{path}: no {keys}; is this the benchmark's complete result file?")
            return None
        value = value[key]
    return value


def _section(doc: Any, path: Path, keys: str, required: bool = True) -> dict:
    """doc[a][b]... for keys "a.b..." where it must be an object ({} where absent and not required)."""
    value = _get(doc, path, keys, required)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TraceError(f"{path}: {keys} is {excerpt(repr(value))}; expected an object of the tool's report")
    return value


def _number(doc: Any, path: Path, keys: str, required: bool = True, positive: bool = False) -> float | None:
    value = _get(doc, path, keys, required)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        raise TraceError(f"{path}: {keys} is {excerpt(repr(value))}; expected a {'positive' if positive else 'non-negative'} "
                         "finite number")
    return float(value)


def _array(doc: Any, path: Path, key: str, n: int | None = None) -> np.ndarray | None:
    value = doc.get(key) if isinstance(doc, dict) else None
    if value is None:
        return None
    if not isinstance(value, list) or (n is not None and len(value) != n):
        raise TraceError(f"{path}: {key} is not a list of {n if n is not None else 'per-request'} numbers")
    try:
        out = np.array([np.nan if v is None else v for v in value], float)
    except (TypeError, ValueError):
        raise TraceError(f"{path}: {key} holds a value that is not a number") from None
    return out


STATS = ("mean", "p50", "p90", "p99")


def _keys(metric: str, pattern: str, names: tuple[str, ...]) -> dict[str, str]:
    """{metric_mean: key, metric_p50: key, ...}: `pattern` with each of the tool's names for STATS."""
    return {f"{metric}_{stat}": pattern.format(name) for stat, name in zip(STATS, names, strict=True)}


def _figures(doc: Any, path: Path, keys: dict[str, str], scale_ms: dict[str, float] | float = 1.0) -> dict[str, float]:
    """{figure: ms} of the `keys` (figure: dotted key) the document has, times `scale_ms` (one, or per
    figure's metric: ttft, tpot, e2e); a figure of 0 is none measured (vLLM writes a mean TPOT of 0
    when no request had a second token), left out."""
    out = {}
    for figure, key in keys.items():
        value = _number(doc, path, key, required=False)
        if value:
            scale = scale_ms if isinstance(scale_ms, float) else scale_ms[figure.split("_")[0]]
            out[figure] = value * scale
    return out


GUIDELLM_LEVELS = {"p001": 0.001, "p01": 0.01, "p05": 0.05, "p10": 0.1, "p25": 0.25, "p50": 0.5, "p75": 0.75, "p90": 0.9,
                   "p95": 0.95, "p99": 0.99, "p999": 0.999}


def _quantiles(doc: Any, path: Path, key: str) -> dict[float, float]:
    """The quantiles (level: tokens) of the length distribution at `key`: `min`, `median`, `max`
    and `pNN` (NN percent: inference-perf's p90 and p99.9, AIPerf's p1 to p99) at its top level,
    GuideLLM's under `percentiles` (its p001 is 0.1 %, p999 99.9 %)."""
    dist = _get(doc, path, key, required=False)
    if not isinstance(dist, dict):
        return {}
    named = {"min": 0.0, "median": 0.5, "max": 1.0}
    levels = {name: named[name] if name in named else _percent(name) for name in dist}
    if isinstance(dist.get("percentiles"), dict):
        levels |= {f"percentiles.{name}": GUIDELLM_LEVELS.get(name) for name in dist["percentiles"]}
    out = {}
    for name, level in levels.items():
        tokens = _number(doc, path, f"{key}.{name}", required=False) if level is not None else None
        if tokens is not None and level is not None:
            out[level] = min(tokens, float(MAX_REQUEST_TOKENS))
    return out


def _percent(name: str) -> float | None:
    found = re.fullmatch(r"p(\d+(?:\.\d+)?)", name)
    return float(found.group(1)) / 100 if found and float(found.group(1)) <= 100 else None


def _int_setting(value: Any) -> int | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if math.isfinite(number) and number == int(number) and number > 0 else None


SETTINGS = {"tp": (("tp", "tensor_parallel_size", "tp_size"), 1024),
            "max_num_batched_tokens": (("max_num_batched_tokens",), 10_000_000), "max_num_seqs": (("max_num_seqs",), 1_000_000),
            "max_model_len": (("max_model_len",), MAX_REQUEST_TOKENS)}


def _fraction(value: Any) -> float | None:
    """A share in (0, 1] as a file records it (a number or its text), else None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if 0 < number <= 1 else None


def _settings(doc: dict, path: Path | None = None) -> dict[str, Any]:
    """The engine settings a result records (vllm --metadata KEY=VALUE pairs, a tool's model key)."""
    out: dict[str, Any] = {}
    for key, (names, most) in SETTINGS.items():
        name = next((n for n in names if _int_setting(doc.get(n)) is not None), None)
        if name is not None:
            out[key] = _int_setting(doc.get(name))
            if out[key] > most:
                raise TraceError(f"{path}: {name} is {out[key]:,}; at most {most:,}")
    fraction = _fraction(doc.get("gpu_memory_utilization"))
    if fraction is not None:
        out["gpu_memory_utilization"] = fraction
    precision = str(doc.get("quantization") or doc.get("precision") or "").lower()
    if precision in ("fp8", "fp4", "nvfp4", "mxfp4", "bf16", "fp16"):
        out["precision"] = "fp4" if "fp4" in precision else "bf16" if precision == "fp16" else precision
    caching = str(doc.get("prefix_caching", doc.get("enable_prefix_caching", ""))).lower()
    if caching in ("true", "on", "1", "false", "off", "0"):
        out["prefix_caching"] = caching in ("true", "on", "1")
    return out


# --- the four formats ------------------------------------------------------------------------


def _vllm(path: Path, doc: dict) -> BenchRun:
    completed = int(_number(doc, path, "completed") or 0)
    rate = doc.get("request_rate")
    unlimited = rate in ("inf", None) or (isinstance(rate, float) and math.isinf(rate))
    burstiness = _number(doc, path, "burstiness", required=False, positive=True) or 1.0
    names = ("mean", "median", "p90", "p99")
    measured = _figures(doc, path, _keys("ttft", "{}_ttft_ms", names) | _keys("e2e", "{}_e2el_ms", names)
                        | {"tpot_mean": "mean_tpot_ms"})
    inputs, outputs, starts = _vllm_requests(doc, path)
    total_in = _number(doc, path, "total_input_tokens", required=False)
    total_out = _number(doc, path, "total_output_tokens", required=False)
    return BenchRun(
        str(path), "vllm", measured, completed, None if unlimited else _number(doc, path, "request_rate", positive=True),
        "gamma" if burstiness != 1.0 else "poisson", burstiness, _int_setting(doc.get("max_concurrency")), 0, False,
        inputs, outputs, starts, total_in / completed if total_in and completed else None,
        total_out / completed if total_out and completed else None, None, {"model": doc.get("model_id")} | _settings(doc, path))


Requests = tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]  # sizes in and out, send times


def _vllm_requests(doc: dict, path: Path) -> Requests:
    """--save-detailed's per-request sizes and send times (from the first), failed requests left out."""
    inputs, outputs = _array(doc, path, "input_lens"), _array(doc, path, "output_lens")
    if inputs is None or outputs is None:
        return None, None, None
    n = len(inputs)
    if len(outputs) != n:
        raise TraceError(f"{path}: output_lens has {len(outputs)} entries and input_lens {n}; one per request each")
    starts, errors = _array(doc, path, "start_times", n), doc.get("errors")
    ok = np.array([not e for e in errors], bool) if isinstance(errors, list) and len(errors) == n else np.ones(n, bool)
    ok &= ~(outputs == 0)  # (vllm writes 0 for a failed request)
    for key, values, low, high in (("input_lens", inputs, 1, MAX_REQUEST_TOKENS), ("output_lens", outputs, 1, MAX_REQUEST_TOKENS),
                                   ("start_times", starts, -np.inf, np.inf)):
        if values is not None:
            _within(path, key, values, ok, low, high)
    # (the lists follow the order the requests were made, not when each began)
    return _in_send_order(inputs[ok], outputs[ok], None if starts is None else starts[ok])


def _in_send_order(inputs: np.ndarray, outputs: np.ndarray, starts: np.ndarray | None) -> Requests:
    """The requests' sizes and send times sorted by send time, the times from the first (none: as given)."""
    if starts is None or not len(starts):
        return inputs, outputs, None
    order = np.argsort(starts, kind="stable")
    return inputs[order], outputs[order], starts[order] - starts[order][0]


def _within(path: Path, key: str, values: np.ndarray, ok: np.ndarray, low: float, high: float) -> None:
    """Every kept per-request value finite and within [low, high]; else TraceError naming the first."""
    bad = np.flatnonzero(ok & ~(np.isfinite(values) & (values >= low) & (values <= high)))
    if len(bad):
        raise TraceError(f"{path}: {key}[{bad[0]}] is {values[bad[0]]:g}; expected a finite number"
                         + (f" from {low:g} to {high:g}" if np.isfinite(low) else ""))


def _inference_perf(path: Path, doc: dict) -> BenchRun:
    successes = _section(doc, path, "successes")
    latency = _section(doc, path, "successes.latency")
    names = ("mean", "median", "p90", "p99")
    measured = _figures(latency, path, _keys("ttft", "time_to_first_token.{}", names)
                        | _keys("e2e", "request_latency.{}", names), 1e3)
    prompt = successes.get("prompt_len") or successes.get("prompt_tokens") or {}
    osl = _number(successes, path, "output_len.mean", required=False)
    if osl is not None and osl > 1 and "ttft_mean" in measured and "e2e_mean" in measured:
        measured["tpot_mean"] = (measured["e2e_mean"] - measured["ttft_mean"]) / (osl - 1)
    load = _section(doc, path, "load_summary")
    concurrency = _int_setting(load.get("concurrency"))
    rate = None if concurrency else _number(load, path, "requested_rate", required=False, positive=True)
    stage = re.fullmatch(r"stage_(\d+)_lifecycle_metrics\.json", path.name)
    return BenchRun(str(path), "inference-perf", measured, int(_number(successes, path, "count") or 0), rate,
                    _config_type(path), 1.0, concurrency, 0, True, isl_mean=_number(prompt, path, "mean", required=False),
                    osl_mean=osl, stage=int(stage.group(1)) if stage else None,
                    sent=int(_number(load, path, "count", required=False) or 0),
                    isl_quantiles=_quantiles(doc, path, "successes.prompt_len" if "prompt_len" in successes
                                             else "successes.prompt_tokens"),
                    osl_quantiles=_quantiles(doc, path, "successes.output_len"))


def _inference_perf_requests(path: Path, runs: list[BenchRun]) -> list[BenchRun]:
    """`runs` with inference-perf's stages (in order) given their requests from its per-request
    records (`per_request_lifecycle_metrics.json`: `start_time`, `info` with the prompt and output
    tokens, `error`; older versions `info.input_tokens`/`info.output_tokens`, newer
    `info.request_metrics.text.input_tokens`/`info.response_metrics.output_tokens`, with the
    prompt tokens the server's prefix cache held in `server_usage.prompt_tokens_details`). The
    records carry no stage: stages ran one after another, so each takes the next
    `load_summary.count` records by send time, and the counts must add up."""
    from dataclasses import replace
    stages = sorted((r for r in runs if r.tool == "inference-perf" and r.stage is not None), key=lambda r: r.stage or 0)
    if not stages:
        return runs
    (records,) = _documents(path)
    if not isinstance(records, list):
        raise TraceError(f"{path}: not a list of per-request records")
    rows = np.array(sorted(_record(r, Path(f"{path} (record {k})")) for k, r in enumerate(records)), float).reshape(-1, 5)
    ends = np.cumsum([r.sent or 0 for r in stages])
    if ends[-1] != len(rows):
        raise TraceError(f"{path}: {len(rows):,} records, and the stage reports beside it sent {ends[-1]:,} requests; keep "
                         "each run's reports in a directory of its own")
    given = {}
    for run, table in zip(stages, np.split(rows, ends[:-1]), strict=True):
        table = table[table[:, 4] > 0]
        given[id(run)] = replace(run, input_tokens=table[:, 1], output_tokens=table[:, 2],
                                 start_s=table[:, 0] - table[0, 0] if len(table) else None,
                                 cached_tokens=None if np.isnan(table[:, 3]).any() else table[:, 3])
    return [given.get(id(r), r) for r in runs]


def _record(record: Any, where: Path) -> tuple[float, float, float, float, float]:
    """(send time, prompt tokens, output tokens, cached prompt tokens or NaN, 1 if it succeeded)."""
    if not isinstance(record, dict):
        raise TraceError(f"{where}: not a per-request record")
    info = record.get("info") or {}
    prompt = _number(info, where, "input_tokens", required=False)
    if prompt is None:
        prompt = float(_number(info, where, "request_metrics.text.input_tokens") or 0.0)
    output = _number(info, where, "output_tokens", required=False)
    if output is None:
        output = _number(info, where, "response_metrics.output_tokens", required=False) or 0.0
    cached = _number(info, where, "response_metrics.server_usage.prompt_tokens_details.cached_tokens", required=False)
    for key, value in (("input tokens", prompt), ("output tokens", output)):
        if value > MAX_REQUEST_TOKENS:
            raise TraceError(f"{where}: {key} {value:,.0f}; at most {MAX_REQUEST_TOKENS:,}")
    ok = record.get("error") is None and output > 0
    return (_number(record, where, "start_time") or 0.0, prompt, output, np.nan if cached is None else min(cached, prompt),
            float(ok))


def _config_type(path: Path) -> str:
    """inference-perf's `load.type` from the config.yaml beside a report (poisson where none)."""
    config = path.parent / "config.yaml"
    if config.is_file():
        text = read_text(config, 1 << 20, "inference-perf config", TraceError)
        found = re.search(r"^\s*type:\s*['\"]?(constant|poisson)", text, re.MULTILINE)
        if found:
            return found.group(1)
    return "poisson"


def _guidellm(path: Path, report: dict) -> list[BenchRun]:
    if not report["benchmarks"]:
        raise TraceError(f"{path}: benchmarks is empty; pass a GuideLLM report of at least one run")
    runs = []
    for k, bench in enumerate(report["benchmarks"]):
        where = Path(f"{path} (benchmarks[{k}])")
        if not isinstance(bench, dict):
            raise TraceError(f"{where}: not a benchmark object")
        metrics = _section(bench, where, "metrics")
        names = ("mean", "percentiles.p50", "percentiles.p90", "percentiles.p99")
        measured = _figures(metrics, where, _keys("ttft", "time_to_first_token_ms.successful.{}", names)
                            | _keys("e2e", "request_latency.successful.{}", names)
                            | {"tpot_mean": "inter_token_latency_ms.successful.mean"},
                            {"ttft": 1.0, "tpot": 1.0, "e2e": 1e3})  # (request_latency in seconds)
        rate, arrival, concurrency = _guidellm_load(bench, where)
        requests = _get(bench, where, "requests.successful", required=False) or []
        count = int(_number(metrics, where, "request_totals.successful", required=False) or len(requests))
        warmup = _guidellm_warmup(bench, where, count, rate, concurrency, measured.get("e2e_mean"))
        inputs, outputs, starts = _guidellm_requests(requests, where)
        runs.append(BenchRun(
            str(where), "guidellm", measured, count, rate, arrival, 1.0, concurrency, warmup, False, inputs, outputs, starts,
            _number(metrics, where, "prompt_token_count.successful.mean", required=False),
            _number(metrics, where, "output_token_count.successful.mean", required=False),
            None, {"model": _get(bench, where, "config.backend.model", required=False)},
            isl_quantiles=_quantiles(metrics, where, "prompt_token_count.successful"),
            osl_quantiles=_quantiles(metrics, where, "output_token_count.successful")))
    return runs


def _guidellm_load(bench: dict, where: Path) -> tuple[float | None, str, int | None]:
    """(rate, arrival process, concurrency) of GuideLLM's strategy: synchronous is one client,
    concurrent `streams` clients, throughput everything at once (up to its max_concurrency)."""
    strategy = _section(bench, where, "config.strategy", required=False) or _section(bench, where, "args.strategy")
    kind = str(strategy.get("type_", ""))
    if kind in ("constant", "poisson"):
        return _number(strategy, where, "rate", positive=True), kind, None
    clients = {"synchronous": 1, "concurrent": strategy.get("streams"), "throughput": strategy.get("max_concurrency")}
    if kind not in clients:
        raise TraceError(f"{where}: config.strategy.type_ {excerpt(repr(kind))} is not one of synchronous, concurrent, "
                         "throughput, constant, poisson")
    return None, "poisson", _int_setting(clients[kind])


def _guidellm_requests(requests: Any, where: Path) -> Requests:
    """The successful requests' sizes and send times (from the first), in send order."""
    rows = [r for r in requests if isinstance(r, dict)] if isinstance(requests, list) else []
    if not rows:
        return None, None, None
    inputs = np.array([_number(r, where, "prompt_tokens") for r in rows], float)
    outputs = np.array([_number(r, where, "output_tokens") for r in rows], float)
    for key, values in (("requests.successful[].prompt_tokens", inputs), ("requests.successful[].output_tokens", outputs)):
        _within(where, key, values, np.ones(len(values), bool), 0, MAX_REQUEST_TOKENS)
    first = [_number(r, where, "request_start_time", required=False) for r in rows]
    return _in_send_order(inputs, outputs, None if any(v is None for v in first) else np.array(first, float))


def _guidellm_warmup(bench: dict, where: Path, count: int, rate: float | None, concurrency: int | None,
                     e2e_ms: float | None) -> int:
    """Requests GuideLLM sent in its warm-up (`config.warmup`: a share of the run, a request
    count, or seconds) and left out of its statistics; at most the run's own count, as many as
    the replay sends before it."""
    warmup = _section(bench, where, "config.warmup", required=False)
    percent = _number(warmup, where, "percent", required=False)
    value = _number(warmup, where, "value", required=False) or 0.0
    if percent:
        requests = count * min(percent, 0.99) / (1 - min(percent, 0.99))
    elif str(warmup.get("mode", "prefer_duration")) in ("requests", "prefer_requests"):
        requests = value
    elif rate:
        requests = value * rate  # (seconds at the run's rate)
    elif concurrency and e2e_ms:
        requests = value * concurrency / (e2e_ms / 1e3)  # (seconds of a closed loop: clients / latency a second)
    else:
        requests = 0.0
    return round(min(requests, count))


def _aiperf(path: Path, doc: dict) -> BenchRun:
    config = _section(doc, path, "input_config", required=False)
    loadgen = _section(doc, path, "input_config.loadgen", required=False) or config
    names = ("avg", "p50", "p90", "p99")
    measured = _figures(doc, path, _keys("ttft", "time_to_first_token.{}", names) | _keys("e2e", "request_latency.{}", names)
                        | {"tpot_mean": "inter_token_latency.avg"},
                        {m: _unit_ms(doc, path, key) for m, key in (("ttft", "time_to_first_token"), ("e2e", "request_latency"),
                                                                     ("tpot", "inter_token_latency"))})
    rate = _number(loadgen, path, "request_rate", required=False, positive=True)
    models = _get(config, path, "endpoint.model_names", required=False) or config.get("model")
    records = path.parent / "profile_export.jsonl"
    inputs, outputs, starts = _aiperf_records(records) if path.name == "profile_export_aiperf.json" and records.is_file() \
        else (None, None, None)
    count = _number(doc, path, "request_count.avg", required=False)
    return BenchRun(str(path), "aiperf", measured, int(count) if count else (len(inputs) if inputs is not None else 0),
                    rate, "constant" if str(loadgen.get("request_rate_mode", "")).lower() == "constant" else "poisson", 1.0,
                    None if rate else _int_setting(loadgen.get("concurrency")),
                    int(_number(loadgen, path, "warmup_request_count", required=False) or 0), False, inputs, outputs, starts,
                    _number(doc, path, "input_sequence_length.avg", required=False),
                    _number(doc, path, "output_sequence_length.avg", required=False),
                    None, {"model": models[0] if isinstance(models, list) and models else models} | _settings(config, path),
                    isl_quantiles=_quantiles(doc, path, "input_sequence_length"),
                    osl_quantiles=_quantiles(doc, path, "output_sequence_length"))


def _unit_ms(doc: dict, path: Path, key: str) -> float:
    section = doc.get(key)
    unit = str(section.get("unit", "ms") if isinstance(section, dict) else "ms").lower()
    factors = {"ms": 1.0, "s": 1e3, "sec": 1e3, "us": 1e-3, "ns": 1e-6}
    if unit not in factors:
        raise TraceError(f"{path}: {key}.unit is {excerpt(unit)}; expected ms, s, us or ns")
    return factors[unit]


def _aiperf_records(path: Path) -> Requests:
    rows = []
    for k, rec in enumerate(_documents(path)):
        where = Path(f"{path} (line {k + 1})")
        if not isinstance(rec, dict) or rec.get("error") or "metrics" not in rec:
            continue
        phase = _get(rec, where, "metadata.benchmark_phase", required=False)
        if phase not in (None, "profiling"):
            continue  # (warm-up requests)
        rows.append((_number(rec, where, "metadata.request_start_ns"), _number(rec, where, "metrics.input_sequence_length.value"),
                     _number(rec, where, "metrics.output_sequence_length.value")))
    if not rows:
        raise TraceError(f"{path}: no successful profiling record")
    table = np.array(sorted(rows), float)
    for column, key in ((1, "input_sequence_length"), (2, "output_sequence_length")):
        _within(path, f"metrics.{key}.value", table[:, column], np.ones(len(table), bool), 0, MAX_REQUEST_TOKENS)
    return table[:, 1], table[:, 2], (table[:, 0] - table[0, 0]) / 1e9
