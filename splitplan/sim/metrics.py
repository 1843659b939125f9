"""From a SimResult to the numbers people check: percentiles, SLO attainment,
utilization and mean batch per pool, and an energy estimate.

Energy model (GPU power only, the part that changes with the design; `gpu_energy_j`, which
the planner uses too): a GPU draws its TDP in iterations that hold a prefill (its power cap
where the machine has one), `decode_w` in decode-only iterations (55 % of TDP when the catalog
has no figure), and `idle_w` otherwise, over the simulated span; host power is left out.
Energy per million tokens (`energy_per_million_tokens`) divides it by the tokens served.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from splitplan.base import csv_text
from splitplan.perf.slo import Reference, achieved, attainment_pct, meets
from splitplan.sim.cluster import PoolSpec, SimResult
from splitplan.specs.roles import Role
from splitplan.specs.slo import SloLine, SloProfile

PCTS = (50, 90, 99)


def percentiles_ms(values_s: np.ndarray) -> dict:
    finite = values_s[np.isfinite(values_s)]
    if not len(finite):
        return {f"p{q}": None for q in PCTS}
    return {f"p{q}": float(np.percentile(finite, q) * 1e3) for q in PCTS}


def benchmark_report(result: SimResult, pools: list[PoolSpec]) -> dict:
    """The figures a serving benchmark prints (vLLM benchmark_serving, genai-perf), so a run
    can be put beside one: mean, median and p99 of TTFT as the client receives the first token
    (`SimResult.client_ttft_s`: on split pools, after the KV transfer and the token instance's
    admission) and TPOT ((E2E - TTFT) / (output - 1), vLLM's definition; one-token answers left
    out) in ms, and throughput, per GPU too."""
    def stats(values_s):
        finite = values_s[np.isfinite(values_s)]
        if not len(finite):
            return {"mean": None, "median": None, "p99": None}
        return {"mean": float(finite.mean() * 1e3), "median": float(np.median(finite) * 1e3),
                "p99": float(np.percentile(finite, 99) * 1e3)}
    gpus = sum(pool_gpus(pool) for pool in pools)
    span = max(result.span_s, 1e-9)
    finished = int(np.isfinite(result.e2e_s).sum())
    measured = result.measured
    return {"ttft_ms": stats(result.client_ttft_s[measured]), "tpot_ms": stats(result.client_tpot_s[measured]), "gpus": gpus,
            "requests_per_s": finished / span, "output_tokens_per_s": result.tokens_out / span,
            "output_tokens_per_s_per_gpu": result.tokens_out / span / max(gpus, 1)}


@dataclass(frozen=True)
class SloLineResult:
    """One SLO line in a simulation: the line (its label, metric, percentile, target and unit),
    the value achieved (None where no request has one), whether it was met, and the share of
    requests (gaps, for ITL) within its limit."""

    line: str
    metric: str
    percentile: float
    target: float
    unit: str
    achieved: float | None
    met: bool
    attainment_pct: float | None  # (None: a plan predicted without it)

    @classmethod
    def of(cls, line: SloLine, achieved: float | None, met: bool, attainment_pct: float | None) -> SloLineResult:
        """The outcome of `line`: its label, metric, percentile, limit and unit, and what was reached."""
        return cls(line.label, line.metric, line.percentile, line.limit, line.unit, achieved, met, attainment_pct)

    @property
    def slo_line(self) -> SloLine:
        return SloLine.from_json(dataclasses.asdict(self))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def slo_report(result: SimResult, slo: SloProfile, reference: Reference | None) -> tuple[SloLineResult, ...]:
    """Per SLO line: target, achieved percentile, met, and the share of requests within it, over
    the requests the engine takes (those over its max_model_len are refused and reported apart,
    as the planner leaves them out). Rejected requests (KV never fits) count as misses."""
    values = {"ttft": result.ttft_s, "tbt": result.tbt_s, "itl": result.gaps_s, "tpot": result.tpot_s, "e2e": result.e2e_s}
    served = result.measured  # (past a closed loop's warm-up)
    out = []
    for line in slo.lines():
        keep = None if line.metric == "itl" else served  # (gaps, not requests)
        value = achieved(line, values[line.metric], reference, keep)
        out.append(SloLineResult.of(line, value if np.isfinite(value) else None, meets(line, value),
                                    attainment_pct(line, values[line.metric], reference, keep)))
    return tuple(out)


DECODE_SHARE_OF_TDP = 0.55  # a decode-only iteration's draw where the catalog has no figure (splitplan's assumption)


def gpu_energy_j(hw, gpus_per_instance: int, instance_s: float, prefill_s: float, decode_s: float) -> float:
    """Joules the GPUs of instances of `hw` draw over `instance_s` instance-seconds (instances x
    span) of which `prefill_s` run iterations that hold a prefill and `decode_s` decode-only
    ones: the power model above."""
    idle_s = max(instance_s - prefill_s - decode_s, 0.0)
    watts = power_w(hw)
    return gpus_per_instance * (prefill_s * watts["prefill"] + decode_s * watts["decode"] + idle_s * watts["idle"])


def power_w(hw) -> dict:
    """A GPU's draw by phase (W), as the energy model takes it."""
    return {"prefill": hw.gpu_power_limit_w, "decode": hw.gpu.decode_w or DECODE_SHARE_OF_TDP * hw.gpu.tdp_w,
            "idle": hw.gpu.idle_w}


def power_sources(machines) -> list[dict]:
    """Each machine type's per-phase GPU power, with where each figure comes from."""
    out = []
    for hw in sorted({hw.name: hw for hw in machines}.values(), key=lambda h: h.name):
        g, watts = hw.gpu, power_w(hw)
        capped = hw.gpu_power_cap_w is not None
        out.append({"hardware": hw.name, "prefill_w": watts["prefill"], "decode_w": watts["decode"], "idle_w": watts["idle"],
                    "source": g.source, "source_date": g.source_date,
                    "prefill_w_from": "the machine's GPU power cap (gpu_power_cap_w)" if capped else "TDP (tdp_w)",
                    "decode_w_from": "the catalog (decode_w)" if g.decode_w else
                    f"{DECODE_SHARE_OF_TDP:.0%} of TDP (splitplan's assumption: the catalog has no decode_w)"})
    return out


def energy_per_million_tokens(energy_kwh: float, prompt_tokens: float, output_tokens: float) -> dict:
    """`energy_kwh_per_million_tokens` (prompt and output) and `..._per_million_output_tokens`."""
    return {"energy_kwh_per_million_tokens": float(energy_kwh * 1e6 / max(prompt_tokens + output_tokens, 1.0)),
            "energy_kwh_per_million_output_tokens": float(energy_kwh * 1e6 / max(output_tokens, 1.0))}


def pool_report(result: SimResult, pools: list[PoolSpec]) -> list[dict]:
    span = max(result.span_s, 1e-9)
    out = []
    for k, pool in enumerate(pools):
        mine = [x for x in result.instances if x.pool == k]
        prefill = sum(x.prefill_s for x in mine)
        decode = sum(x.decode_s for x in mine)
        batch_time = sum(x.batch_integral for x in mine)
        hw = pool.perf.hardware
        joules = gpu_energy_j(hw, pool.perf.layout.gpus, span * len(mine), prefill, decode)
        out.append({
            "role": pool.role, "hardware": hw.name, **pool.perf.layout._asdict(), "layout": pool.perf.layout.spec,
            "machines": pool.machines, "gpus": pool_gpus(pool), "shared": pool.shared,
            "instances": len(mine), "utilization": (prefill + decode) / (span * max(len(mine), 1)),
            "mean_batch": batch_time / max(prefill + decode, 1e-12) if pool.role != Role.PROMPT else None,
            "energy_kwh": joules / 3.6e6,
            "prefix_hit_rate": (sum(x.prefix_hit_tokens for x in mine) / lookups
                                if (lookups := sum(x.prefix_lookup_tokens for x in mine)) else None),
        })
    return out


def borrowed(result: SimResult) -> dict:
    """Requests the mixed pool moved: prefilled on a token machine, decoded on a prompt machine."""
    roles = np.array([str(x.role) for x in result.instances])
    return {"prefills_on_token_machines": int(np.sum(roles[result.prompt_instance] == Role.TOKEN)),
            "decodes_on_prompt_machines": int(np.sum(roles[result.token_instance] == Role.PROMPT))}


@dataclass(frozen=True)
class SimulationSummary:
    """A simulation's figures (`summarize_result`); `to_json()` is the document's `summary`.
    Latencies are percentiles (`percentiles_ms`: p50, p90, p99 and the mean, ms) over the
    requests the statistics cover (all but the refused and a closed loop's warm-up)."""

    requests: int
    finished: int
    rejected_kv: int  # requests whose KV never fit an instance
    refused_context: int  # longer than max_model_len, refused at arrival
    preemptions: int  # co-located decodes preempted for KV memory (0: none)
    tokens_asked: int
    tokens_out: int
    span_s: float
    throughput_rps: float
    warmup_requests: int  # a closed loop's, left out of the statistics
    ttft_ms: dict
    tbt_ms: dict
    tbt_max_ms: dict
    itl_ms: dict  # every gap between consecutive tokens, all requests
    tpot_ms: dict  # per request: (E2E - TTFT) / (output - 1)
    e2e_ms: dict
    prompt_queue_ms: dict
    transfer_ms: dict
    decode_queue_ms: dict
    benchmark: dict  # benchmark_report's
    slo: tuple[SloLineResult, ...]  # per line (slo_report): its value, limit and whether it was met
    pools: list[dict]  # pool_report's rows
    borrowed: dict  # the mixed pool's moves
    energy_kwh: float
    energy_kwh_per_million_tokens: float
    energy_kwh_per_million_output_tokens: float
    power_sources: list[dict]
    events: int
    extrapolated_pct: dict | None = None  # measured tables: the share of lookups outside them, per phase

    def latency_ms(self, metric: str) -> dict:
        """The percentiles of an SLO metric (ttft, tbt, itl, tpot, e2e)."""
        return getattr(self, f"{metric}_ms")

    @property
    def slo_met(self) -> bool:
        return all(line.met for line in self.slo)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        if self.extrapolated_pct is None:
            del out["extrapolated_pct"]
        return out


def summarize_result(result: SimResult, pools: list[PoolSpec], slo: SloProfile, reference: Reference | None) -> SimulationSummary:
    t = result.trace
    finished = np.isfinite(result.e2e_s)
    pool_rows = pool_report(result, pools)
    energy_kwh = sum(r["energy_kwh"] for r in pool_rows)
    m = result.measured  # the requests the statistics cover (all but the refused and a closed loop's warm-up)
    measured = [pool.perf for pool in pools if pool.perf.measured]
    extrapolated = {phase: 100.0 * sum(m.extrapolated[phase] for m in measured) / max(sum(m.queries[phase] for m in measured), 1)
                    for phase in ("prefill", "decode")} if measured else None
    return SimulationSummary(
        len(t), int(finished.sum()), int(result.rejected.sum() - (~result.served).sum()), int((~result.served).sum()),
        int(result.preemptions), int(t.output_tokens.sum()), int(result.tokens_out), result.span_s,
        float(finished.sum() / max(result.span_s, 1e-9)), int(result.warmup.sum()) if result.warmup is not None else 0,
        percentiles_ms(result.ttft_s[m]), percentiles_ms(result.tbt_s[m]), percentiles_ms(result.tbt_max_s[m]),
        percentiles_ms(result.gaps_s), percentiles_ms(result.tpot_s[m]), percentiles_ms(result.e2e_s[m]),
        percentiles_ms(result.prompt_queue_s[m]), percentiles_ms(result.transfer_s[m]), percentiles_ms(result.decode_queue_s[m]),
        benchmark_report(result, pools), slo_report(result, slo, reference), pool_rows, borrowed(result), energy_kwh,
        **energy_per_million_tokens(energy_kwh, float(t.prompt_tokens[np.isfinite(result.ttft_s)].sum()), float(result.tokens_out)),
        power_sources=power_sources(pool.perf.hardware for pool in pools), events=result.events, extrapolated_pct=extrapolated)


def requests_csv(result: SimResult, names: list[str]) -> str:
    """One row per request: its sizes, latencies (ms, 3 decimals; empty where it has none) and
    instances. Written column-wise from the arrays (`base.csv_text`): the bytes Python's
    formatting would write row by row, about 25 ms for 42k requests where that took 0.25 s."""
    t, r = result.trace, result
    latencies = (r.ttft_s, r.tbt_s, r.tbt_max_s, r.e2e_s, r.prompt_queue_s, r.transfer_s, r.decode_queue_s)
    columns = [csv_text.integers(np.arange(len(t))), csv_text.fixed(t.arrival_s, 6), csv_text.integers(t.prompt_tokens),
               csv_text.integers(t.output_tokens), *(csv_text.fixed(v, 3, 1e3) for v in latencies),
               csv_text.labels(names, r.prompt_instance), csv_text.labels(names, r.token_instance),
               csv_text.integers(r.rejected)]
    header = ["request", "arrival_s", "prompt_tokens", "output_tokens", "ttft_ms", "tbt_ms", "tbt_max_ms", "e2e_ms",
              "prompt_queue_ms", "transfer_ms", "decode_queue_ms", "prompt_instance", "token_instance", "rejected_kv"]
    return csv_text.csv_text(header, columns, len(t))


def pool_gpus(pool) -> int:
    """GPUs a pool holds: its machines', or on machines shared with the other role its instances'."""
    return pool.instances * pool.perf.layout.gpus if pool.shared is not None else pool.machines * pool.perf.hardware.gpus_per_machine
