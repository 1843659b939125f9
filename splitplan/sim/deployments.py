"""Whole-deployment measurements: serving benchmarks replayed as closed loops, and an
engine profile fitted to them.

A row is one measured run, as NVIDIA aiconfigurator's silicon sample records it: an
engine (`backend`: vllm, sglang, trtllm), a machine (`system`), a precision, fixed input
and output lengths (`isl`, `osl`), a concurrency (`batch_size` for aggregated runs), a
layout (`tp_size`, ...) and the run's mean TTFT and mean TPOT (`silicon_ttft_ms`,
`silicon_tpot_ms`). Rows the catalog can model are kept: aggregated, TP only (no PP,
attention DP or EP), a catalog machine and a dense catalog model, bf16 or fp8, that ran no
faster than its prompts can be prefilled (`prefill_share`: a run that did cannot have computed its
prompts whole); the others are counted by reason.

A run is predicted by simulating it as the benchmark ran it: a co-located instance with
`concurrency` clients, each sending its next request when the last finishes
(sim.cluster, SimOptions.concurrency). One 8-GPU machine holds 8/TP instances, so it runs
concurrency x 8/TP clients: the same load per instance. Predictions are the simulated
mean TTFT and mean TPOT ((E2E - TTFT) / (output - 1), vLLM's definition) over
`REQUESTS_PER_CLIENT` requests per client.

Every client sends its first request at once, and the clients then run out of phase (the
first wave's outputs graded: workload.trace.out_of_phase), as real engines' runs show.
The first wave's TTFT counts, as the benchmark's mean holds it (its prefills do not depend
on the outputs); its TPOT does not (the replay's warm-up: its outputs are not the run's).

The fit (`fit_deployments`) moves a few engine-wide factors (`DEPLOYMENT_FACTORS`) of a
base profile within physical bounds, minimizing log-ratio residuals of TTFT and TPOT
under a soft-L1 loss. Engine-wide only: the profile must predict machines it was not
fitted on, which the cross-validation (folds by machine and by concurrency band) checks.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from splitplan.base.errors import TraceError
from splitplan.base.inputs import finite_columns, number_column, read_table, whole_columns
from splitplan.base.limits import MAX_CONCURRENCY, MAX_REQUEST_TOKENS
from splitplan.base.runner import Runner, serial
from splitplan.perf import curves
from splitplan.perf.bounds import at_bounds
from splitplan.perf.bounds import bounds as fit_bounds
from splitplan.perf.roofline import Instance
from splitplan.sim.cluster import PoolSpec, SimOptions, simulate
from splitplan.specs.engine import BYTES, EngineProfile
from splitplan.specs.hardware import load_hardware
from splitplan.specs.layout import MAX_GPUS, Layout, parse_layout
from splitplan.specs.model import load_model
from splitplan.specs.roles import Role
from splitplan.workload.trace import closed_loop_workload

COLUMNS = ["backend", "system", "precision", "mode", "model_path", "isl", "osl", "batch_size", "tp_size",
           "silicon_ttft_ms", "silicon_tpot_ms"]
MACHINES = {"h100_sxm": "h100-80gb", "h200_sxm": "h200-141gb", "b200_sxm": "b200-180gb"}
MODELS = {"meta-llama/Llama-3.1-70B": "llama3.1-70b", "meta-llama/Llama-3.1-8B-Instruct": "llama3.1-8b",
          "nvidia/Llama-3.1-8B-Instruct-FP8": "llama3.1-8b", "Qwen/Qwen3-32B": "qwen3-32b"}
# A kept run's whole-number columns and their caps, and every column read as a number.
WHOLE = {"tp_size": MAX_GPUS, "batch_size": MAX_CONCURRENCY, "isl": MAX_REQUEST_TOKENS, "osl": MAX_REQUEST_TOKENS}
NUMBERS = (*WHOLE, "pp_size", "attention_dp_size", "moe_ep_size", "silicon_ttft_ms", "silicon_tpot_ms")
BANDS = (0, 4, 16, 32, 64, 1_000_000)
BAND_LABELS = ("1-4", "5-16", "17-32", "33-64", ">64")
# name: (lower, upper, scale)
DEPLOYMENT_FACTORS = {
    "compute_efficiency": (0.1, 1.0, 1.0),
    "memory_efficiency": (0.3, 1.0, 1.0),
    "prefill_overhead_s": (0.0, 0.2, 1e-2),
    "decode_overhead_s": (0.0, 0.05, 1e-3),
    "sequence_overhead_s": (0.0, 1e-3, 1e-4),  # per request in an iteration: what batch adds beyond the roofline
}
# The files do not say how many requests each run sent. NVIDIA's AIPerf examples for Dynamo
# send ten per client (`--concurrency 10 --request-count 100`); the first wave, every client at
# once, is then a tenth of the run, as it would be.
REQUESTS_PER_CLIENT = 10


def read_deployments(path: str | Path) -> tuple[pd.DataFrame, dict[str, int]]:
    """Runs the catalog can model, as `machine, model, engine, precision, tp, concurrency,
    isl, osl, ttft_ms, tpot_ms`, and how many rows were left out, by reason: `catalog_runs` without
    those that ran faster than their prompts can be prefilled (TOO_FAST)."""
    runs, dropped = catalog_runs(path)
    too_fast = prefill_share(runs) > 1
    if too_fast.any():
        dropped[TOO_FAST] = int(too_fast.sum())
    return runs[~too_fast].reset_index(drop=True), dropped


def catalog_runs(path: str | Path) -> tuple[pd.DataFrame, dict[str, int]]:
    """The rows of a deployments file the catalog can model, and how many it cannot, by reason."""
    path = Path(path)
    raw = read_table(path, "deployments CSV", TraceError)
    missing = [c for c in COLUMNS if c not in raw.columns]
    if missing:
        raise TraceError(f"{path}: not a deployment file (aiconfigurator silicon format); missing {', '.join(missing)}")
    raw = raw.assign(**{col: number_column(raw, col, path, TraceError) for col in NUMBERS if col in raw})
    one = pd.Series(1.0, index=raw.index)  # (a file without a parallel-size column: 1)
    reasons = {
        "no mode recorded (agg or disagg)": raw["mode"].isna(),
        "disaggregated (not yet replayed)": raw["mode"] != "agg",
        "precision other than bf16/fp8": ~raw.precision.isin(["bf16", "fp8"]),
        "model not in the catalog or not dense": ~raw.model_path.isin(list(MODELS)),
        "machine not in the catalog": ~raw.system.isin(list(MACHINES)),
        "pipeline, attention-DP or expert parallel": (raw.get("pp_size", one).fillna(1) != 1)
        | (raw.get("attention_dp_size", one).fillna(1) != 1) | (raw.get("moe_ep_size", one).fillna(1) > 1),
        "missing or non-positive latency": ~((raw.silicon_ttft_ms > 0) & (raw.silicon_tpot_ms > 0)),
        "fewer than 2 output tokens (no TPOT)": raw.osl < 2,
    }
    dropped, out = {}, pd.Series(False, index=raw.index)
    for reason, mask in reasons.items():
        new = mask & ~out
        if new.any():
            dropped[reason] = int(new.sum())
        out |= mask
    kept = finite_columns(raw[~out], [*WHOLE, "silicon_ttft_ms", "silicon_tpot_ms"], path, TraceError)
    whole_columns(kept, WHOLE, path, TraceError)
    runs = pd.DataFrame({
        "machine": kept.system.map(MACHINES), "model": kept.model_path.map(MODELS), "engine": kept.backend,
        "precision": kept.precision, "tp": kept.tp_size.astype(int), "concurrency": kept.batch_size.astype(int),
        "isl": kept.isl.astype(int), "osl": kept.osl.astype(int),
        "ttft_ms": kept.silicon_ttft_ms.astype(float), "tpot_ms": kept.silicon_tpot_ms.astype(float),
    }).reset_index(drop=True)
    runs["band"] = pd.cut(runs.concurrency, BANDS, labels=BAND_LABELS).astype(str)
    return runs, dropped


# A run is left out where its prompts' prefill alone (prefill_share) would take longer than it ran:
# it cannot have computed its prompts whole, which is what its replay does.
TOO_FAST = "faster than its prompts can be prefilled (prompts served from a prefix cache, or shorter than recorded)"
FASTEST_PASS_TOKENS = 16_384  # GEMMs speed up with their rows: a pass this long, the largest the kernel tables time


def prefill_share(runs: pd.DataFrame) -> np.ndarray:
    """Per run, the share of its wall time its prompts' prefill alone takes, each prompt computed in
    full: its clients finish `concurrency` / E2E requests a second (E2E = TTFT + (osl - 1) TPOT), each
    prompt passing every layer's GEMMs (perf.curves.layer_gemms) in passes of FASTEST_PASS_TOKENS and
    its causal attention, at the GPU's measured kernel curves for the run's engine (GEMMs at the run's
    precision, attention at the faster of its KV precisions), or at the datasheet peak where the GPU
    has no such curve (attention then left out). The decode steps and every overhead come on top, so a
    run above 1 cannot have prefilled its prompts (vLLM, SGLang and TensorRT-LLM keep a prefix cache by
    default: a benchmark that repeats its prompts hits it)."""
    out = np.zeros(len(runs))
    for i, run in enumerate(runs.to_dict("records")):
        model, hw, tp, isl = load_model(run["model"]), load_hardware(run["machine"]), int(run["tp"]), float(run["isl"])
        n, k = curves.layer_gemms(model, tp)
        peak, m = hw.peak_flops_per_s(run["precision"]), FASTEST_PASS_TOKENS
        kernels = hw.curves_for(run["engine"])
        curve = kernels.gemm.get(run["precision"]) if kernels else None
        gemm_s = (curves.gemm_s(curve, peak, hw.memory_bytes_per_s, m, n, k, BYTES[run["precision"]]) if curve
                  else 2 * m * n * k / peak).sum() / m * isl
        heads, kv_heads = model.num_attention_heads / tp, model.kv_heads_per_gpu(tp)
        attention_s = min((float(curves.context_attention_s(c, hw.peak_flops_per_s("bf16"), 1, isl, heads, kv_heads,
                                                              model.head_dim_eff))
                           for c in (kernels.context_attention.values() if kernels else ())), default=0.0)
        e2e_s = (run["ttft_ms"] + (run["osl"] - 1) * run["tpot_ms"]) * 1e-3
        out[i] = run["concurrency"] / e2e_s * (gemm_s + attention_s) * model.num_hidden_layers
    return out


def unservable(runs: pd.DataFrame, profile: EngineProfile) -> list[str]:
    """Per run, why `profile` cannot replay it as it was recorded ("" where it can): an instance of
    its layout cannot hold the model on its machine (`Instance.fit`), or a request, prompt and output,
    is longer than the context window the engine takes for the model (`EngineProfile.context_tokens`)
    or than the KV cache one instance holds."""
    out = []
    for run in runs.to_dict("records"):
        pools, _ = run_pools(run, profile)
        why = next((p.perf.fit.reason for p in pools if not p.perf.fit.fits), "")
        tokens, context = run["isl"] + run["osl"], profile.context_tokens(load_model(run["model"]))
        held = min(p.perf.max_request_tokens for p in pools)
        if not why and context is not None and tokens > context:
            why = f"requests longer than {run['model']}'s context window ({context:,} tokens)"
        elif not why and tokens > held:
            why = f"requests longer than the KV cache an instance holds ({held:,} tokens)"
        out.append(why)
    return out


def _layout(run: dict, key: str) -> Layout | None:
    value = run.get(key)
    return parse_layout(value, key) if isinstance(value, str) and value else None


def _required_layout(run: dict, key: str) -> Layout:
    layout = _layout(run, key)
    if layout is None:
        raise TraceError(f"a disaggregated run without its {key}: {run.get('model')} on {run.get('machine')}")
    return layout


def run_pools(run: dict, profile: EngineProfile) -> tuple[list[PoolSpec], int]:
    """The pools a run had, and its clients, at the same load per instance: an aggregated run
    (`layout`, or `tp`) as one co-located unit (one machine or the machines one instance spans,
    `concurrency` clients per instance); a disaggregated one (`prefill_layout` x
    `prefill_workers`, `decode_layout` x `decode_workers`) as prompt and token pools scaled by
    the smallest factor that fills whole machines, with its `concurrency` scaled alike."""
    model, hw = load_model(run["model"]), load_hardware(run["machine"])
    decode = _layout(run, "decode_layout")
    if decode is None:
        inst = Instance(model, hw, profile, _layout(run, "layout") or Layout(int(run["tp"])))
        return [PoolSpec(Role.MIXED, inst, inst.unit_machines)], int(run["concurrency"]) * inst.unit_instances
    sides = [(Role.PROMPT, Instance(model, hw, profile, _required_layout(run, "prefill_layout")), int(run["prefill_workers"])),
             (Role.TOKEN, Instance(model, hw, profile, decode), int(run["decode_workers"]))]
    scale = math.lcm(*(inst.unit_instances // math.gcd(workers, inst.unit_instances) for _, inst, workers in sides))
    pools = [PoolSpec(role, inst, workers * scale // inst.unit_instances * inst.unit_machines) for role, inst, workers in sides]
    return pools, int(run["concurrency"]) * scale


def replay(run: dict, profile: EngineProfile, requests_per_client: int = REQUESTS_PER_CLIENT,
           cached_tokens: int = 0) -> tuple[float, float]:
    """Simulated mean TTFT and mean TPOT (ms) of one run under `profile`: `requests_per_client`
    requests per client (at least 8 in all), every client sending its first at once and the
    clients out of phase after it (workload.trace.out_of_phase), and the means over all of them
    (TPOT: but the first wave's), as a benchmark reports them (a disaggregated run's first token
    as its client got it, from a decode worker: `SimResult.client_ttft_s`). NaN where an instance
    cannot hold the model.

    An aggregated run's machine is replayed as one of its instances with its share of the
    clients: identical instances fed identical requests by join-shortest-queue (each first wave
    graded alike) run in lockstep with each other, so each sees what one alone sees (the means
    agree to rounding; a test holds both to it), at 1/instances of the cost.

    `cached_tokens`: the leading prompt tokens each request finds in the engine's prefix cache (a
    benchmark that sends its prompts again; `Trace.cached_tokens`), 0 as the rows record none."""
    replayed = _replay(run, profile, requests_per_client, cached_tokens=cached_tokens)
    if replayed is None:
        return float("nan"), float("nan")
    result = replayed[0]
    return float(np.nanmean(result.client_ttft_s) * 1e3), float(np.nanmean(result.client_tpot_s[result.measured]) * 1e3)


def _replay(run: dict, profile: EngineProfile, requests_per_client: int = REQUESTS_PER_CLIENT,
            record_passes: bool = False, cached_tokens: int = 0):
    """(the simulation's result, its pools) of `replay`; None where an instance cannot hold the model."""
    pools, clients = run_pools(run, profile)
    if not all(p.perf.fit.fits for p in pools):
        return None
    if len(pools) == 1 and pools[0].instances > 1:  # one instance of the machine's, with its clients (see below)
        clients //= pools[0].instances
        pools = [dataclasses.replace(pools[0], instances_given=1)]
    work = closed_loop_workload(None, clients, max(requests_per_client * clients, 8), int(run["isl"]), int(run["osl"]))
    if cached_tokens:
        work = dataclasses.replace(work, cached_tokens=np.full(len(work), cached_tokens))
    # the scheduler settings the run records (`max_batch_tokens`, `max_num_seqs`), else the profile's: the
    # engine's defaults, which a benchmark that sets none runs (the aiconfigurator sample records none)
    options = SimOptions(profile.batch_tokens(run.get("max_batch_tokens")), concurrency=clients, inter_token_gaps=False,
                         record_passes=record_passes, max_num_seqs=profile.seqs_cap(run.get("max_num_seqs")),
                         warmup_requests=clients)  # (the first wave, its outputs graded)
    return simulate(work, pools, options), pools


@dataclass(frozen=True)
class Schedule:
    """A replay's iterations, which the fitted factors do not change, so that a fit simulates
    each run once (`record`) and times its iterations under each trial profile (`means`).

    With one instance and no front-end latency, every decision of the simulator is made at an
    iteration's end from counts alone (requests, tokens, KV blocks; a closed loop's client
    sends its next request the moment the last finishes), never from how long an iteration
    took; the factors (DEPLOYMENT_FACTORS) change the iterations' durations only. The means
    agree with `replay`'s to rounding (a test holds them to it for random factors); runs
    that are not so (several pools, front-end latency, a prefix cache) have no schedule and
    are simulated at every evaluation."""

    prefill: np.ndarray  # (n, 5): the iterations with prompt work, as pass_time_s's arguments
    decode: np.ndarray  # (m, 3): decode-only stretches: batch, summed context at the first's start, iterations
    is_prefill: np.ndarray  # per step (a prompt iteration or a decode stretch), in order
    sent: np.ndarray  # per request: the step at whose end it was sent (-1: at the start)
    first: np.ndarray  # the step at whose end its first token came
    finish: np.ndarray  # the step at whose end it finished
    outputs: np.ndarray
    measured: np.ndarray  # per request: whether its TPOT counts (SimResult.measured: past the first wave, `replay`)

    def means(self, inst: Instance) -> tuple[float, float]:
        """Mean TTFT and mean TPOT (ms) of the run when `inst` times the iterations."""
        steps = np.empty(len(self.is_prefill))
        steps[self.is_prefill] = inst.pass_time_s(*self.prefill.T)
        batch, context, k = self.decode.T
        base, per_token, slack = inst.decode_line(batch)
        steps[~self.is_prefill] = stretch_s(base, per_token, slack, batch, context, k)
        ends = np.concatenate(([0.0], np.cumsum(steps)))  # (index 0: the start)
        start = ends[self.sent + 1]
        ttft, e2e = ends[self.first + 1] - start, ends[self.finish + 1] - start
        with np.errstate(divide="ignore", invalid="ignore"):
            tpot = np.where(self.outputs > 1, (e2e - ttft) / (self.outputs - 1), np.nan)
        return float(np.mean(ttft) * 1e3), float(np.nanmean(tpot[self.measured]) * 1e3)


def stretch_s(base, per_token, slack, batch, context, iterations):
    """Seconds of `iterations` decode steps of `batch` requests from a summed `context`, each
    `base + max(context x per_token, slack)` (Instance.decode_line) with the context `batch`
    more each step: the first `waiting` steps are at the slack (the host launches bound them),
    the rest grow linearly; in closed form, elementwise."""
    waiting = np.clip(np.ceil((slack / per_token - context) / batch), 0, iterations)
    growing = iterations * (iterations - 1) - waiting * (waiting - 1)  # twice the sum of j over the rest
    return iterations * base + waiting * slack + per_token * ((iterations - waiting) * context + batch * growing / 2)


def record(run: dict, profile: EngineProfile) -> Schedule | None:
    """The run's `Schedule`, replayed under `profile`; None where it has none (see Schedule)."""
    replayed = _replay(run, profile, record_passes=True)
    if replayed is None:
        return None
    result, pools = replayed
    if len(pools) > 1 or pools[0].perf.engine.frontend_latency_s or result.rejected.any() \
            or any(s.prefix_lookup_tokens for s in result.instances):
        return None
    passes = _stretches(result.passes)
    ends = passes[:, 6]
    arrival = result.trace.arrival_s

    def step(times: np.ndarray) -> np.ndarray | None:  # the step whose end each time is, -1 for 0
        at = np.clip(np.searchsorted(ends, times), 1, len(ends) - 1)
        at -= np.abs(ends[at - 1] - times) < np.abs(ends[at] - times)  # (the nearer: a time may be an ulp off)
        near = np.abs(ends[at] - times) <= 1e-9 * np.maximum(1.0, np.abs(times))
        at = np.where(times == 0, -1, at)
        return at if (near | (times == 0)).all() else None

    sent, first, finish = step(arrival), step(arrival + result.ttft_s), step(arrival + result.e2e_s)
    if sent is None or first is None or finish is None:
        return None
    prompt = passes[:, 0] > 0
    decode = passes[~prompt]
    return Schedule(passes[prompt, :5], decode[:, [3, 4, 5]], prompt, sent, first, finish,
                    result.trace.output_tokens.astype(float), result.measured)


def _stretches(passes: np.ndarray) -> np.ndarray:
    """One instance's passes (SimResult.passes) with each run of decode-only iterations of one
    batch, its context growing by the batch each, as one row: nothing joined or left the batch
    between them, so no request was sent, had its first token or finished inside it."""
    decode = passes[:, 0] == 0
    batch, context, count = passes[:, 3], passes[:, 4], passes[:, 5]
    goes_on = np.zeros(len(passes), bool)  # a row that continues the one before
    goes_on[1:] = decode[1:] & decode[:-1] & (batch[1:] == batch[:-1]) & (context[1:] == context[:-1] + batch[:-1] * count[:-1])
    first = np.flatnonzero(~goes_on)
    merged = passes[first].copy()
    merged[:, 5] = np.add.reduceat(count, first) if len(first) else count[first]
    merged[:, 6] = passes[np.append(first[1:], len(passes)) - 1, 6]  # (the end of its last iteration)
    return merged


def _record_unit(profile, run):
    return record(run, profile)


def _replay_unit(profile, run):
    return replay(run, profile)


def predict(runs: pd.DataFrame, profile: EngineProfile, run: Runner = serial,
            shared: list[Schedule | None] | None = None) -> np.ndarray:
    """(n, 2) array of simulated mean TTFT and TPOT (ms), in `runs` order; each run a work unit for
    `run`, or, with `shared` (a schedule or None per row, `record`ed under a profile that differs
    from this one in DEPLOYMENT_FACTORS only), its schedule timed under `profile`."""
    records = runs.to_dict("records")
    shared = shared or [None] * len(records)
    out = np.full((len(records), 2), np.nan)
    rest = [k for k, s in enumerate(shared) if s is None]
    if rest:
        out[rest] = np.array(run(_replay_unit, [records[k] for k in rest], profile), float).reshape(-1, 2)
    for k, schedule in enumerate(shared):
        if schedule is not None:
            out[k] = schedule.means(cast(Instance, run_pools(records[k], profile)[0][0].perf))  # (analytic: shared)
    return out


def with_factors(base: EngineProfile, values: dict) -> EngineProfile:
    return base.model_copy(update={"defaults": base.defaults.model_copy(update=values), "hardware_overrides": {},
                                   "efficiency_sources": {}})


# The factors measured kernel curves replace where a machine has them (Instance._curves): compute
# and memory efficiency then time nothing these runs hold (dense fp8 and bf16 GEMMs, attention).
CURVE_FACTORS = ("compute_efficiency", "memory_efficiency")


def timed_by_curves(factor: str, profile: EngineProfile, hw) -> bool:
    """Whether `factor` of `profile` is replaced on `hw` by its measured kernel curves (so the data cannot pin it)."""
    curves = hw.curves_for(profile.kernel_curves)
    return factor in CURVE_FACTORS and curves is not None and profile.weights in curves.gemm


def schedules(runs: pd.DataFrame, base: EngineProfile, run: Runner = serial) -> list[Schedule | None]:
    """Every run's `Schedule` (or None), recorded once for every fit from `base` (as its trials
    are, without its per-machine overrides: they too change durations only)."""
    return run(_record_unit, runs.to_dict("records"), with_factors(base, {}))


def fit_deployments(runs: pd.DataFrame, base: EngineProfile, max_evaluations: int = 25, run: Runner = serial,
                    factors: tuple[str, ...] = tuple(DEPLOYMENT_FACTORS),
                    shared: list[Schedule | None] | None = None, table: dict | None = None) -> EngineProfile:
    """`base` with `factors` (of `table`, name: (lower, upper, scale); DEPLOYMENT_FACTORS by default)
    refitted to the runs (engine-wide defaults; the base's per-machine overrides are dropped, they
    came from other data). Each run is simulated once and its schedule timed at every evaluation
    where it has one (`shared`: `schedules(runs, base)`, recorded here when not given)."""
    table = table or DEPLOYMENT_FACTORS
    machines = [load_hardware(m) for m in sorted(set(runs.machine))]
    names = [k for k in factors if not all(timed_by_curves(k, base, hw) for hw in machines)]
    lower, upper, why = fit_bounds(table, names, machines, base.weights)
    scale = np.array([table[k][2] for k in names])
    start = np.clip([getattr(base.defaults, k) for k in names], lower, upper)
    measured = np.log(runs[["ttft_ms", "tpot_ms"]].to_numpy(float))
    shared = schedules(runs, base, run) if shared is None else shared

    def residuals(x):
        profile = with_factors(base, dict(zip(names, (float(v) for v in x), strict=True)))
        return (np.log(predict(runs, profile, run, shared)) - measured).ravel()

    from scipy.optimize import least_squares  # (on first use: every command loads this module, few fit)
    result = least_squares(residuals, start, bounds=(lower, upper), x_scale=scale, loss="soft_l1", f_scale=0.1,
                           diff_step=1e-2, max_nfev=max_evaluations)
    fitted = with_factors(base, dict(zip(names, (float(v) for v in result.x), strict=True)))
    return fitted.model_copy(update={"fit": {"at_bound": at_bounds(names, result.x, lower, upper, why)}})


def fold_column(runs: pd.DataFrame) -> str:
    """Held-out folds by machine (fit without H200, predict H200, ...) when the runs span
    several machines, else by concurrency band."""
    return "machine" if runs.machine.nunique() > 1 else "band"


def cross_validate(runs: pd.DataFrame, base: EngineProfile, by: str, run: Runner = serial, progress=None,
                   max_evaluations: int = 25, shared: list[Schedule | None] | None = None) -> np.ndarray:
    """Held-out predictions (n, 2): each value of `by` is predicted by a profile fitted
    without its runs (`shared`: `schedules(runs, base)`, recorded here when not given)."""
    out = np.full((len(runs), 2), np.nan)
    shared = schedules(runs, base, run) if shared is None else shared
    for value in sorted(runs[by].unique()):
        held = (runs[by] == value).to_numpy()
        if held.all():
            break
        fitted = fit_deployments(runs[~held], base, max_evaluations, run,
                                 shared=[s for s, h in zip(shared, held, strict=True) if not h])
        out[held] = predict(runs[held], fitted, run, [s for s, h in zip(shared, held, strict=True) if h])
        if progress:
            progress()
    return out


def error_table(runs: pd.DataFrame, predicted: np.ndarray, held_out: np.ndarray | None) -> pd.DataFrame:
    """Per (machine, concurrency band), and overall: runs, MAPE % and median signed error %
    of TTFT and TPOT, fitted and (when given) held out."""
    measured = runs[["ttft_ms", "tpot_ms"]].to_numpy(float)
    cols = {"fit": predicted} | ({"cv": held_out} if held_out is not None else {})
    frame = runs[["machine", "band"]].copy()
    for tag, values in cols.items():
        err = (values / measured - 1) * 100
        frame[f"ttft_{tag}"], frame[f"tpot_{tag}"] = err[:, 0], err[:, 1]
    rows = []
    for key, group in list(frame.groupby(["machine", "band"])) + [(("all", "all"), frame)]:
        row = {"machine": key[0], "band": key[1], "runs": len(group)}
        for tag in cols:
            for metric in ("ttft", "tpot"):
                e = group[f"{metric}_{tag}"].dropna()
                row[f"{metric}_mape_{tag}_pct"] = float(e.abs().mean()) if len(e) else None
                row[f"{metric}_bias_{tag}_pct"] = float(e.median()) if len(e) else None
        rows.append(row)
    return pd.DataFrame(rows)
