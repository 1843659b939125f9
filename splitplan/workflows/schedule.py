"""A schedule a cluster follows: each window of a trace on the peak plan's pools, with the lead
new instances need to start, and what following it costs against a static peak plan.

The windows are planned on their own first (`studies.plan_windows`); a cluster that follows the
load keeps its machine types and layouts (one Deployment per pool, its replicas changing), so a
window whose own plan uses other pools is planned again on the peak plan's machine types (its
mode and TP), and where that still differs it runs the peak plan. A window with no requests
keeps the instances of the window before it (the cluster does not scale to zero).

Instances a window adds start `lead_s` before it (their node, container and engine start, and
their weights load): during that lead the pool runs the larger of the two counts, which the
cost of following counts. The default lead is an estimate (`default_lead_s`), at most a window."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from splitplan.base.errors import SpecError
from splitplan.search.optimize import Mode, OptimizeOptions
from splitplan.search.types import Plan, SizedPool, bought
from splitplan.specs.hardware import load_hardware
from splitplan.specs.roles import Role, pool_label
from splitplan.workflows.studies import WindowsResult, plan_windows

# Estimates, not measurements (docs/cli.md says so; --scale-up-lead sets the lead): a pod on a
# node already in the cluster starts its container, loads the engine and captures its CUDA graphs
# in about two minutes; each GPU's process then reads its share of the weights at about 1 GB/s
# (a model cache on local NVMe; network storage is slower). A node that must be provisioned first
# adds minutes more.
ENGINE_START_S = 120.0
WEIGHT_LOAD_BYTES_PER_S = 1e9


def default_lead_s(plan: Plan, model: str, engine: str) -> float:
    """ENGINE_START_S plus the slowest pool's weights per GPU at WEIGHT_LOAD_BYTES_PER_S,
    rounded up to a whole minute."""
    from splitplan.perf.points import instance
    weights = max(instance(model, p.hardware, p.layout, engine).fit.weights_bytes_per_gpu for p in plan.pools)
    return math.ceil((ENGINE_START_S + weights / WEIGHT_LOAD_BYTES_PER_S) / 60) * 60


def _label(role: Role, pool: SizedPool) -> str:
    return pool_label(role, pool.hardware, pool.layout, pool.shared)


def _labels(plan: Plan) -> set[str]:
    return {_label(role, p) for role, p in plan.by_role()}


@dataclass(frozen=True)
class Schedule:
    """Per window (`rows`): start and end (s), the instances of each pool (`pools`, in that
    order), the machines, GPUs and cost of the window's plan, when its added instances start
    (`scale_up_from_s`) and where its counts come from; `followed`: the GPU-hours and cost of
    following it against the static peak plan over the same windows."""

    window_s: float
    lead_s: float
    pools: tuple[str, ...]
    rows: tuple[dict, ...]
    followed: dict
    lead_source: str = "--scale-up-lead"  # the option, or the estimate (capped at a window where longer)

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame([{k: v for k, v in r.items() if k != "instances"} | dict(zip(self.pools, r["instances"], strict=True))
                             for r in self.rows])[["window", "start_s", "end_s", *self.pools, "machines", "gpus",
                                                   "cost_usd_per_hour", "scale_up_from_s", "source"]]

    def to_json(self) -> dict:
        return {"window_s": self.window_s, "scale_up_lead_s": self.lead_s, "scale_up_lead_source": self.lead_source,
                "pools": list(self.pools),
                "windows": [dict(r) for r in self.rows], **self.followed}


def follow(trace, windows: WindowsResult, model: str, slo: str, options: OptimizeOptions, lead_s: float | None = None,
           jobs: int = 1, executor: str = "local", ray_address: str | None = None, progress=None) -> Schedule:
    """The schedule of `windows` (planned on `trace`) on its peak plan's pools, instances added
    `lead_s` seconds ahead (None: `default_lead_s`)."""
    peak_index = windows.peak
    if peak_index is None:
        raise SpecError("no window has a plan: there is no schedule to follow")
    peak = windows.plans[peak_index]
    if lead_s is None:  # (the estimate, at most a window: a cluster can follow no faster)
        estimate = default_lead_s(peak, model, options.engine)
        lead_s = min(estimate, windows.window_s)
        source = "estimate (engine start and weight load)" + (f", {estimate:g} s capped at the window" if estimate > lead_s else "")
    elif not 0 <= lead_s <= windows.window_s:
        raise SpecError(f"--scale-up-lead {lead_s:g} s: must be from 0 to the window ({windows.window_s:g} s); instances that take "
                        "longer to start than a window lasts cannot follow it: plan longer windows")
    else:
        source = "--scale-up-lead"
    labels = _labels(peak)
    plans = list(windows.plans)
    redo = [k for k, p in enumerate(plans) if p is None or not _labels(p) <= labels]
    if redo:
        again = plan_windows(windows.window_s, trace, model, slo, jobs, executor, ray_address, progress,
                             options=_on_pools_of(peak, options), only=[windows.rows[k]["window"] for k in redo])
        for k, plan in zip(redo, again.plans, strict=True):
            plans[k] = plan if plan is not None and _labels(plan) <= labels else None
    order = sorted(_labels(peak))
    rows = _rows(windows, plans, peak, order)
    return Schedule(windows.window_s, float(lead_s), tuple(order), tuple(rows), _followed(rows, peak, windows.window_s, lead_s),
                    source)


def _on_pools_of(peak: Plan, options: OptimizeOptions) -> OptimizeOptions:
    """The options restricted to the peak plan's machine types, its mode and (where its pools
    share one) its TP degree."""
    tps = {p.layout.tp for p in peak.pools}
    if peak.mixed_pools:
        return dataclasses.replace(options, hardware=sorted({p.hardware for p in peak.mixed_pools}), mode=Mode.COLOCATED,
                                   tp=tps.pop() if len(tps) == 1 else None)
    return dataclasses.replace(options, prompt_hardware=sorted({p.hardware for p in peak.prompt_pools}),
                               token_hardware=sorted({p.hardware for p in peak.token_pools}), mode=Mode.SPLIT_ALONE,
                               tp=tps.pop() if len(tps) == 1 else None)


def _rows(windows: WindowsResult, plans: list, peak: Plan, order: list[str]) -> list[dict]:
    """A row per window from the first to the last (those without requests keep the last counts)."""
    by_index = {int(round(r["start_s"] / windows.window_s)): (r, plan) for r, plan in zip(windows.rows, plans, strict=True)}
    rows: list[dict] = []
    for k in range(max(by_index) + 1):
        row, plan = by_index.get(k, (None, None))
        if row is None:
            source, plan = "held: no requests", rows[-1]["plan"]
        elif plan is None:
            source, plan = "peak plan: no plan on its pools" if row.get("error") is None else f"peak plan: {row['error']}", peak
        else:
            source = "planned"
        held = {_label(role, p): p.instances for role, p in plan.by_role()}
        rows.append({"window": k, "start_s": k * windows.window_s, "end_s": (k + 1) * windows.window_s,
                     "instances": [held.get(label, 0) for label in order], "machines": plan.machines, "gpus": plan.gpus,
                     "cost_usd_per_hour": plan.cost_usd_per_hour, "scale_up_from_s": k * windows.window_s, "source": source,
                     "plan": plan})
    return rows


def _machines(plan: Plan) -> dict[str, tuple[int, float, int]]:
    """Machines, their price per hour and GPUs, per bought pool of a plan (shared machines once)."""
    out = {}
    for p in bought(plan.pools):
        role = next(role for role, q in plan.by_role() if q is p)
        hw = load_hardware(p.hardware)
        out[_label(role, p)] = (p.machines, hw.price_usd_per_hour, hw.gpus_per_machine)
    return out


def _followed(rows: list[dict], peak: Plan, window_s: float, lead_s: float) -> dict:
    """The GPU-hours and cost of following the schedule (each window's machines for the window,
    and the machines a window adds for `lead_s` before it) against the peak plan for them all;
    each row's `scale_up_from_s` set, and its plan dropped."""
    gpu_hours = cost = 0.0
    before: dict = {}
    for row in rows:
        plan = row.pop("plan")
        now = _machines(plan)
        gpu_hours += plan.gpus * window_s / 3600
        cost += plan.cost_usd_per_hour * window_s / 3600
        added = {label: (n - before.get(label, (0,))[0], price, gpus) for label, (n, price, gpus) in now.items()}
        added = {label: v for label, v in added.items() if v[0] > 0}
        if before and added:
            row["scale_up_from_s"] = row["start_s"] - lead_s
            gpu_hours += sum(n * gpus for n, _, gpus in added.values()) * lead_s / 3600
            cost += sum(n * price for n, price, _ in added.values()) * lead_s / 3600
        before = now
    hours = len(rows) * window_s / 3600
    static_cost, static_gpu_hours = peak.cost_usd_per_hour * hours, peak.gpus * hours
    return {"gpu_hours": gpu_hours, "cost_usd": cost, "static_gpu_hours": static_gpu_hours, "static_cost_usd": static_cost,
            "saving_pct": (1 - cost / static_cost) * 100 if static_cost > 0 else None}
