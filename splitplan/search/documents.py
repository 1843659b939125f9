"""A plan's own forms: its JSON document (plan.json's `plan`, and optimize's whole document),
its one-line text and its CSV row; every report, file and the API's `to_json` write these."""

from __future__ import annotations

from splitplan.base.defaults import SCHEMA_VERSION
from splitplan.specs.slo import METRICS


def pools_json(pools) -> list[dict]:
    return [{"hardware": p.hardware, **p.layout._asdict(), "layout": p.layout.spec, "machines": p.machines,
             "instances": p.instances, "gpus": p.gpus, "utilization": p.utilization, "prefix_hit_rate": p.prefix_hit_rate,
             "spare_instances": p.spare_instances, "shared": p.shared} for p in pools]


def pool_text(p) -> str:
    """`3x h100-80gb TP 8`; a part of shared machines `2x TP 2 on 1x h100-80gb (shared #0)`."""
    if p.shared is not None:
        return f"{p.instances}x {p.layout} on {p.machines}x {p.hardware} (shared #{p.shared})"
    return f"{p.machines}x {p.hardware} {p.layout}"


def pools_text(pools) -> str:
    """Pools in text, one notation everywhere: `3x h100-80gb TP 8 + 4x h200-141gb DP 16 EP 16` (in
    options and files a pool is `h100-80gb:8:3`, `h200-141gb:dp16ep16:4`); machines shared by
    prefill and decode instances as `pool_text` gives them."""
    return " + ".join(pool_text(p) for p in pools) or "-"

def plan_text(plan) -> str:
    if plan.mixed_pools:
        return f"co-located {pools_text(plan.mixed_pools)}"
    return f"prompt {pools_text(plan.prompt_pools)}; token {pools_text(plan.token_pools)}"


def plan_json(plan) -> dict:
    from splitplan.sim.metrics import SloLineResult  # (each SLO line's row, as a simulation writes it)
    pools = ({"mixed_pools": pools_json(plan.mixed_pools)} if plan.mixed_pools else
             {"prompt_pools": pools_json(plan.prompt_pools), "token_pools": pools_json(plan.token_pools)})
    return {
        **pools,
        "cost_usd_per_hour": plan.cost_usd_per_hour,
        "power_kw": plan.power_kw,
        "machines": plan.machines,
        "gpus": plan.gpus,
        "cost_usd_per_million_tokens": plan.cost_usd_per_million_tokens,
        "cost_usd_per_million_output_tokens": plan.cost_usd_per_million_output_tokens,
        "energy_kwh_per_million_tokens": plan.energy_kwh_per_million_tokens,
        "energy_kwh_per_million_output_tokens": plan.energy_kwh_per_million_output_tokens,
        "predicted": {f"{m}_ms": v for m, v in plan.predicted.items()},
        "slo": [SloLineResult.of(line, v, ok, a).to_json()
                for (line, v, ok), a in zip(plan.slo, plan.attainment_pct or [None] * len(plan.slo), strict=True)],
        "binding": plan.binding,
        **({"cliff": list(plan.cliff)} if plan.cliff else {}),
        **({"max_rate_rps": plan.max_rate_rps} if plan.max_rate_rps is not None else {}),
        **({"max_rate_simulated": plan.max_rate_simulated} if plan.max_rate_simulated is not None else {}),
    }

def optimize_json(result, inputs: dict) -> dict:
    body = plan_json(result.plan)
    body["alternatives"] = [plan_json(a) for a in result.alternatives]
    body["split_saving_pct"] = result.split_saving_pct
    body["unservable"] = None if result.unservable is None else result.unservable.to_json()
    if result.max_rate_rps is not None:
        body["max_rate_rps"] = result.max_rate_rps
    if result.closed_loop is not None:
        body["closed_loop"] = result.closed_loop.to_json()
    if result.confidence is not None:
        body["confidence"] = result.confidence.to_json()
        body["nominal"] = plan_json(result.nominal)
    if result.simulated is not None:
        body["simulated"] = result.simulated.to_json()
        for alternative, outcome in zip(body["alternatives"], result.alternatives_simulated, strict=True):
            alternative["simulated"] = outcome.to_json()
    return {"schema_version": SCHEMA_VERSION, "inputs": inputs, "plan": body, "power_sources": power_sources_of(result),
            "timed_from": timing_sources_of(result), "warnings": result.warnings}


def power_sources_of(result) -> list[dict]:
    """The per-phase GPU power, with its source, of each machine type the plan and its runner-ups use."""
    from splitplan.sim.metrics import power_sources
    machines = {o.inst.hardware.name: o.inst.hardware for o in result.options}
    used = {p.hardware for plan in (result.plan, *result.alternatives) for p in plan.pools}
    return power_sources(machines[name] for name in sorted(used) if name in machines)


def timing_sources_of(result) -> list[dict]:
    """What timed each operator class of each machine type and layout the plan and its runner-ups
    use: the engine profile's measured kernel curves on that GPU, or the roofline with its factors
    (Instance.timing_sources)."""
    insts = {(o.inst.hardware.name, o.inst.layout): o.inst for o in result.options}
    used = {(p.hardware, p.layout) for plan in (result.plan, *result.alternatives) for p in plan.pools}
    return [{"hardware": hw, "layout": layout.spec, "operators": insts[hw, layout].timing_sources}
            for hw, layout in sorted(used) if (hw, layout) in insts]


def _p99(predicted: dict, metric: str) -> str:
    """A predicted p99 (ms) as a CSV cell; empty where there is none (ITL and TPOT of plans made from a perf-db)."""
    value = predicted.get(metric, {}).get("p99")
    return "" if value is None or value != value else f"{value:.3f}"


def plans_csv(plans) -> str:
    import csv
    import io
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["rank", "prompt_pools", "token_pools", "mixed_pools", "machines", "cost_usd_per_hour", "power_kw",
                *(f"{m}_p99_ms" for m in METRICS), "all_slo_met", "binding", "max_rate_rps", "gpus",
                "cost_usd_per_million_tokens", "cost_usd_per_million_output_tokens", "energy_kwh_per_million_tokens",
                "energy_kwh_per_million_output_tokens"])
    for i, p in enumerate(plans):
        w.writerow([i, pools_text(p.prompt_pools), pools_text(p.token_pools), pools_text(p.mixed_pools), p.machines,
                    f"{p.cost_usd_per_hour:.4f}",
                    f"{p.power_kw:.4f}", *(_p99(p.predicted, m) for m in METRICS), all(ok for _, _, ok in p.slo), p.binding,
                    "" if p.max_rate_rps is None else f"{p.max_rate_rps:.4f}", p.gpus,
                    *("" if v is None else f"{v:.6g}" for v in (p.cost_usd_per_million_tokens, p.cost_usd_per_million_output_tokens,
                                                                p.energy_kwh_per_million_tokens,
                                                                p.energy_kwh_per_million_output_tokens))])
    return out.getvalue()
