"""A plan's schedule (`optimize --window`'s windows.json) as KEDA ScaledObjects (keda.sh/v1alpha1,
the API of KEDA 2): each pool's replicas follow the windows through KEDA's cron scaler.

One ScaledObject per pool, one cron trigger per window with instances of it: from the window's
start, less the scale-up lead (instances it adds start that early), to its end, at the window's
instances. KEDA runs the largest count of the triggers active at a time, so during a lead a pool
runs the larger of two windows' counts, as the schedule's cost counts it; outside every trigger
it runs `minReplicaCount`, the pool's fewest instances in any window (0 with `outside` zero). In
the hours of a day no window covers, `outside` peak adds a trigger at the pool's most instances.
Cron triggers repeat daily: the schedule must lie within a day, in whole minutes, its windows in
order, from `start` (the clock time of the trace's first window) in `timezone` (an IANA zone).

What each scales: llm-d's Deployment (or LeaderWorkerSet, for instances over several nodes) of
the pool; Dynamo's DynamoGraphDeploymentScalingAdapter of the pool's component, which Dynamo
1.6.1 creates for a component with `scalingAdapter: {enabled: true}` and names
`<graph deployment>-<component, lowercased>` (its planner's Kubernetes connector scales the same
adapters).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from splitplan.base import limits
from splitplan.base.errors import SpecError
from splitplan.base.inputs import excerpt, parse_document, printable, read_text
from splitplan.deploy import Deployment, Group
from splitplan.specs.roles import pool_label

KEDA_API = "keda.sh/v1alpha1"
DAY_S = 86_400
_CLOCK = re.compile(r"^([01][0-9]|2[0-3]):([0-5][0-9])$")
_TIMEZONE = re.compile(r"^(UTC|[A-Z][A-Za-z_+-]{1,30}(/[A-Za-z0-9_+-]{1,30}){1,2})$")  # IANA names: Area/Location


class _Window(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, strict=True)
    start_s: Annotated[float, Field(ge=0, le=limits.MAX_TRACE_SPAN_S)]
    end_s: Annotated[float, Field(gt=0, le=limits.MAX_TRACE_SPAN_S)]
    instances: Annotated[list[Annotated[int, Field(ge=0, le=limits.MAX_MACHINES * 8)]], Field(max_length=limits.MAX_PLAN_POOLS)]


class _Schedule(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, strict=True)
    window_s: Annotated[float, Field(gt=0, le=limits.MAX_TRACE_SPAN_S)]
    scale_up_lead_s: Annotated[float, Field(ge=0, le=limits.MAX_TRACE_SPAN_S)]
    pools: Annotated[list[Annotated[str, Field(max_length=200)]], Field(max_length=limits.MAX_PLAN_POOLS)]
    windows: Annotated[list[_Window], Field(min_length=1, max_length=10_000)]


def read_schedule(path: Path) -> _Schedule:
    """The `schedule` of a windows.json (`optimize --window --output-dir`); SpecError naming the
    file and what is wrong otherwise."""
    where = printable(str(path))
    text = read_text(path, limits.MAX_SPEC_BYTES, "windows.json")
    try:
        doc = parse_document(text, path, as_json=True)  # (strict: no duplicate keys, bounded nesting)
    except SpecError as exc:
        raise SpecError(f"--schedule {exc}: give the windows.json `optimize --window --output-dir` wrote") from None
    if not isinstance(doc, dict) or "schedule" not in doc:
        raise SpecError(f"--schedule {where}: no `schedule`; give the windows.json `optimize --window --output-dir` wrote")
    try:
        schedule = _Schedule.model_validate(doc["schedule"])
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(k) for k in first["loc"])
        raise SpecError(f"--schedule {where}: schedule.{key}: {first['msg']}") from None
    for k, w in enumerate(schedule.windows):
        if len(w.instances) != len(schedule.pools) or w.end_s <= w.start_s:
            raise SpecError(f"--schedule {where}: schedule.windows.{k}: its instances do not match the schedule's "
                            f"{len(schedule.pools)} pools, or it ends before it starts")
        if k and w.start_s < schedule.windows[k - 1].end_s:
            raise SpecError(f"--schedule {where}: schedule.windows.{k} starts at {w.start_s:g} s, before window {k - 1} ends "
                            f"({schedule.windows[k - 1].end_s:g} s); windows run in order, one after another")
    if schedule.scale_up_lead_s >= DAY_S:
        raise SpecError(f"--schedule {where}: schedule.scale_up_lead_s {schedule.scale_up_lead_s:g} s is a day or more; cron "
                        "triggers repeat daily, so a lead must be shorter than a day (optimize --window --scale-up-lead)")
    if not any(n for w in schedule.windows for n in w.instances):
        raise SpecError(f"--schedule {where}: no window runs an instance of any pool; nothing to scale")
    return schedule


def known_timezone(name: str) -> bool:
    """Whether `name` is a time zone of the IANA database (zoneinfo, with the tzdata package pandas
    brings where the system has none); a well-formed name first, so nothing odd reaches a file lookup."""
    if not _TIMEZONE.fullmatch(name):
        return False
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


def label(g: Group) -> str:
    """A deployment group as the schedule names its pool."""
    return pool_label(g.role, g.hardware.name, g.layout, g.shared)


def _minutes(value_s: float, what: str) -> int:
    if value_s % 60:
        raise SpecError(f"--schedule: {what} {value_s:g} s is not a whole minute, which cron triggers need; plan windows "
                        "and a --scale-up-lead of whole minutes")
    return int(value_s // 60)


def _cron(minute_of_day: int) -> str:
    minute_of_day %= DAY_S // 60
    return f"{minute_of_day % 60} {minute_of_day // 60} * * *"


OUTSIDE = ("peak", "min", "zero")  # what a pool runs outside the schedule's windows (--outside-schedule)


def _span_s(schedule: _Schedule) -> float:
    """From the first window's start to the last one's end (read_schedule holds them in order)."""
    return schedule.windows[-1].end_s - schedule.windows[0].start_s


def uncovered_minutes(schedule: _Schedule) -> int:
    """Minutes of each day no window covers (the schedule's windows from a shorter trace)."""
    return max(DAY_S // 60 - math.ceil(_span_s(schedule) / 60), 0)


def outside_text(schedule: _Schedule, outside: str) -> str:
    """What each pool runs outside the schedule's windows, in words (EXPORT.md and a note on stderr)."""
    left = uncovered_minutes(schedule)
    if not left:
        return "the windows cover the whole day; between them each pool runs its fewest instances in any window (minReplicaCount)"
    what = {"peak": "its most instances in any window (the static peak plan: a cron trigger over those hours)",
            "min": "its fewest instances in any window (minReplicaCount)",
            "zero": "no instance (minReplicaCount 0: requests then find no server)"}[outside]
    return (f"the windows cover {DAY_S // 60 - left:,} of 1,440 minutes a day; for the other {left:,} each pool runs {what} "
            f"(--outside-schedule {outside}; choose peak, min or zero)")


def scaled_objects(dep: Deployment, schedule: _Schedule, start: str, timezone: str, target: str, dgd_name: str,
                   outside: str = "peak") -> list[dict]:
    """A ScaledObject per pool of `dep` that follows `schedule` (`target`: llm-d or dynamo, whose
    DynamoGraphDeployment is `dgd_name`), running `outside` (OUTSIDE) in the hours no window covers;
    SpecError where the schedule is not this plan's or cron triggers cannot express it."""
    first = _clock_minutes(start, timezone, outside)
    by_label = {label(g): g for g in dep.groups}
    if set(schedule.pools) != set(by_label):
        raise SpecError(f"--schedule: its pools ({', '.join(schedule.pools)}) are not this plan's ({', '.join(sorted(by_label))}); "
                        "export the plan.json written beside the schedule's windows.json")
    lead = _minutes(schedule.scale_up_lead_s, "the scale-up lead")
    window = _minutes(schedule.window_s, "the window")
    span = _minutes(_span_s(schedule), "the schedule's span")
    if span > DAY_S // 60 or window >= DAY_S // 60:
        raise SpecError(f"--schedule: {span / 60:g} hours in windows of {window / 60:g} h; KEDA's cron triggers repeat daily: "
                        "give a schedule within one day, in windows shorter than a day")
    out = []
    for column, name in enumerate(schedule.pools):
        g = by_label[name]
        counts = [w.instances[column] for w in schedule.windows]
        if not any(counts):
            raise SpecError(f"--schedule: pool {printable(name)} runs no instance in any window, which a ScaledObject cannot "
                            "follow; export the windows.json written beside this plan")
        labels = {"llm-d.ai/model": dep.name} if target == "llm-d" else {"app.kubernetes.io/part-of": dgd_name}  # (each target's own)
        out.append({"apiVersion": KEDA_API, "kind": "ScaledObject", "metadata": {"name": g.name, "labels": labels},
                    "spec": {"scaleTargetRef": _target(g, target, dgd_name), "minReplicaCount": 0 if outside == "zero" else min(counts),
                             "maxReplicaCount": max(counts),
                             "triggers": _triggers(schedule, counts, first, lead, timezone, outside)}})
    return out


def _clock_minutes(start: str, timezone: str, outside: str) -> int:
    """The schedule's first window as minutes after midnight, once the options that place it are checked."""
    if outside not in OUTSIDE:
        raise SpecError(f"--outside-schedule '{excerpt(outside)}': choose {', '.join(OUTSIDE)}")
    clock = _CLOCK.fullmatch(start)
    if clock is None:
        raise SpecError(f"--schedule-start '{excerpt(start)}': give the clock time of the schedule's first window as HH:MM")
    if not known_timezone(timezone):
        raise SpecError(f"--timezone '{excerpt(timezone)}': not an IANA time zone; give one such as UTC, Europe/Paris or "
                        "America/New_York")
    return int(clock.group(1)) * 60 + int(clock.group(2))


def _triggers(schedule: _Schedule, counts: list[int], first: int, lead: int, timezone: str, outside: str) -> list[dict]:
    """A pool's cron triggers: one per window with instances, from its start less the lead (the
    first too: before it, minReplicaCount) to its end; with `outside` peak, one at the pool's most
    instances from the last window's end to the first's lead, where the windows leave time."""
    def cron(name: str, begin: int, end: int, replicas: int) -> dict:
        return {"type": "cron", "name": name, "metadata": {"timezone": timezone, "start": _cron(first + begin),
                                                           "end": _cron(first + end), "desiredReplicas": str(replicas)}}
    out = [cron(f"window-{k}", _minutes(w.start_s, "a window's start") - lead, _minutes(w.end_s, "a window's end"), n)
           for k, (w, n) in enumerate(zip(schedule.windows, counts, strict=True)) if n]
    if outside == "peak" and uncovered_minutes(schedule) > lead:
        out.append(cron("outside-schedule", _minutes(schedule.windows[-1].end_s, "a window's end"),
                        _minutes(schedule.windows[0].start_s, "a window's start") - lead, max(counts)))
    return out


def _target(g: Group, target: str, dgd_name: str) -> dict:
    """What a pool's ScaledObject scales: Dynamo's scaling adapter of its component, or its llm-d workload."""
    if target == "dynamo":
        return {"apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeploymentScalingAdapter", "name": f"{dgd_name}-{g.name.lower()}"}
    if g.nodes_per_instance > 1:
        return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": g.name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": g.name}


def keda_yaml(objects: list[dict]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False, width=1000)


def mapping(schedule: _Schedule, start: str, timezone: str, target: str, outside: str = "peak") -> list[tuple[str, str]]:
    scaled = ("each component's DynamoGraphDeploymentScalingAdapter (scalingAdapter.enabled on the worker components)"
              if target == "dynamo" else "each pool's Deployment (LeaderWorkerSet for instances over several nodes)")
    return [("--schedule windows", f"keda.yaml: a KEDA ScaledObject ({KEDA_API}) per pool scaling {scaled}, a cron trigger "
             f"per window ({len(schedule.windows)} of {schedule.window_s / 60:g} min from {start} {timezone}, daily) at its "
             "instances"),
            ("--schedule scale_up_lead_s", f"each trigger starts {schedule.scale_up_lead_s / 60:g} min before its window; "
             "KEDA runs the largest count of the active triggers"),
            ("outside the schedule's windows", outside_text(schedule, outside))]
