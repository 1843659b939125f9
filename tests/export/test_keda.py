"""`splitplan export --schedule`: a schedule of windows as KEDA ScaledObjects with cron triggers,
for llm-d's Deployments and LeaderWorkerSets and Dynamo's scaling adapters; KEDA's API types
(@kubernetes-models/keda, generated from KEDA's Go API) check them where CI installed it; bad
schedules refused."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from splitplan.cli import app

runner = CliRunner()
POOLS = {"prompt": [("h100-80gb", 8, 3)], "token": [("h100-80gb", 8, 1)]}
LABELS = ["prompt h100-80gb TP 8", "token h100-80gb TP 8"]


def _plan(tmp_path, pools=POOLS, model="llama2-70b", engine="vllm") -> Path:
    doc = {"schema_version": 2, "inputs": {"model": model, "slo": "chat", "engine": engine, "max_batch_tokens": 2048},
           "plan": {**{f"{role}_pools": [{"hardware": hw, "tp": tp, "machines": m} for hw, tp, m in items]
                       for role, items in pools.items()},
                    "machines": sum(m for items in pools.values() for *_, m in items), "cost_usd_per_hour": 0.0,
                    "power_kw": 0.0, "predicted": {}, "slo": [], "binding": ""}}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return path


def _schedule(tmp_path, counts, window_s=600.0, lead_s=180.0, pools=LABELS, name="windows.json") -> Path:
    windows = [{"window": k, "start_s": k * window_s, "end_s": (k + 1) * window_s, "instances": list(c)}
               for k, c in enumerate(counts)]
    path = tmp_path / name
    path.write_text(json.dumps({"schedule": {"window_s": window_s, "scale_up_lead_s": lead_s, "pools": pools,
                                             "windows": windows}}))
    return path


def _export(tmp_path, *extra, plan=None, to="llm-d"):
    out = tmp_path / "out"
    result = runner.invoke(app, ["export", str(plan or _plan(tmp_path)), "--to", to, "--output", str(out), *extra])
    return result, out


def test_each_pool_follows_its_windows_with_a_cron_trigger_started_a_lead_early(tmp_path):
    result, out = _export(tmp_path, "--schedule", str(_schedule(tmp_path, [(2, 1), (3, 1), (1, 2)])),
                          "--schedule-start", "09:00", "--timezone", "Europe/Paris", "--outside-schedule", "min")
    assert result.exit_code == 0, result.output
    prefill, decode = yaml.safe_load_all((out / "keda.yaml").read_text())
    workloads = {d["metadata"]["name"]: d for d in yaml.safe_load_all((out / "llm-d.yaml").read_text()) if d["kind"] == "Deployment"}
    assert prefill["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "prefill-h100-80gb-tp8"}
    assert set(workloads) == {prefill["spec"]["scaleTargetRef"]["name"], decode["spec"]["scaleTargetRef"]["name"]}
    assert (prefill["spec"]["minReplicaCount"], prefill["spec"]["maxReplicaCount"]) == (1, 3)
    # 10-minute windows from 09:00 in Paris, each trigger 3 minutes ahead (the first from 08:57)
    assert [(t["metadata"]["start"], t["metadata"]["end"], t["metadata"]["desiredReplicas"]) for t in prefill["spec"]["triggers"]] == [
        ("57 8 * * *", "10 9 * * *", "2"), ("7 9 * * *", "20 9 * * *", "3"), ("17 9 * * *", "30 9 * * *", "1")]
    assert {t["type"] for t in decode["spec"]["triggers"]} == {"cron"}
    assert {t["metadata"]["timezone"] for t in decode["spec"]["triggers"]} == {"Europe/Paris"}
    assert [t["metadata"]["desiredReplicas"] for t in decode["spec"]["triggers"]] == ["1", "1", "2"]
    report = (out / "EXPORT.md").read_text()
    assert "keda.yaml" in report and "kubectl apply -n NS -f keda.yaml" in report


def test_a_whole_day_wraps_midnight_and_a_window_without_instances_has_no_trigger(tmp_path):
    counts = [(1, 1)] * 23 + [(0, 1)]
    result, out = _export(tmp_path, "--schedule", str(_schedule(tmp_path, counts, window_s=3600, lead_s=300)))
    assert result.exit_code == 0, result.output
    prefill, _ = yaml.safe_load_all((out / "keda.yaml").read_text())
    triggers = prefill["spec"]["triggers"]
    assert len(triggers) == 23 and prefill["spec"]["minReplicaCount"] == 0
    assert (triggers[0]["metadata"]["start"], triggers[0]["metadata"]["end"]) == ("55 23 * * *", "0 1 * * *")


def test_instances_over_several_nodes_scale_their_leader_worker_set(tmp_path):
    plan = _plan(tmp_path, {"mixed": [("h100-80gb", 16, 2)]})
    result, out = _export(tmp_path, "--schedule", str(_schedule(tmp_path, [(1,), (2,)], pools=["mixed h100-80gb TP 16"])),
                          plan=plan)
    assert result.exit_code == 0, result.output
    (scaled,) = yaml.safe_load_all((out / "keda.yaml").read_text())
    assert scaled["spec"]["scaleTargetRef"] == {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                                                "name": "worker-h100-80gb-tp16"}


def test_dynamo_scaled_objects_carry_no_llm_d_label(tmp_path):
    result, out = _export(tmp_path, "--schedule", str(_schedule(tmp_path, [(2, 1), (3, 1)])), to="dynamo")
    assert result.exit_code == 0, result.output
    labels = [d["metadata"]["labels"] for d in yaml.safe_load_all((out / "keda.yaml").read_text())]
    assert labels == [{"app.kubernetes.io/part-of": "splitplan-llama2-70b"}] * 2


def test_dynamo_components_opt_into_their_scaling_adapters_which_the_objects_scale(tmp_path):
    result, out = _export(tmp_path, "--schedule", str(_schedule(tmp_path, [(2, 1), (3, 1)])), to="dynamo")
    assert result.exit_code == 0, result.output
    dgd = yaml.safe_load((out / "dynamo.yaml").read_text())
    workers = [c for c in dgd["spec"]["components"] if c["type"] != "frontend"]
    assert all(c["scalingAdapter"] == {"enabled": True} for c in workers)
    assert all("scalingAdapter" not in c for c in dgd["spec"]["components"] if c["type"] == "frontend")
    refs = [d["spec"]["scaleTargetRef"] for d in yaml.safe_load_all((out / "keda.yaml").read_text())]
    assert refs == [{"apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeploymentScalingAdapter",
                     "name": f"{dgd['metadata']['name']}-{c['name']}"} for c in workers]


@pytest.mark.parametrize(("outside", "minimum", "extra"), [
    ("peak", (1, 1), [("30 9 * * *", "57 8 * * *", ("3", "2"))]),  # (from the last window's end to the first's lead)
    ("min", (1, 1), []), ("zero", (0, 0), []),
])
def test_what_runs_outside_a_shorter_schedule_is_chosen_and_said(tmp_path, outside, minimum, extra):
    """Issue 54, item 10: 30 minutes of windows leave 1,410 a day uncovered; each pool then runs its
    peak (the default), its fewest or no instance, and EXPORT.md and stderr say which."""
    result, out = _export(tmp_path, "--schedule", str(_schedule(tmp_path, [(2, 1), (3, 1), (1, 2)])),
                          "--schedule-start", "09:00", "--outside-schedule", outside)
    assert result.exit_code == 0, result.output
    objects = list(yaml.safe_load_all((out / "keda.yaml").read_text()))
    assert tuple(o["spec"]["minReplicaCount"] for o in objects) == minimum
    outside_triggers = [[t for t in o["spec"]["triggers"] if t["name"] == "outside-schedule"] for o in objects]
    if extra:
        (start, end, peaks), = extra
        assert [(t["metadata"]["start"], t["metadata"]["end"]) for ts in outside_triggers for t in ts] == [(start, end)] * 2
        assert tuple(t["metadata"]["desiredReplicas"] for ts in outside_triggers for t in ts) == peaks
    else:
        assert outside_triggers == [[], []]
    said = "cover 30 of 1,440 minutes a day; for the other 1,410 each pool runs"
    assert said in (out / "EXPORT.md").read_text() and said in result.stderr and f"--outside-schedule {outside}" in result.stderr


def test_a_whole_day_schedule_says_nothing_is_outside_it(tmp_path):
    result, out = _export(tmp_path, "--schedule", str(_schedule(tmp_path, [(1, 1)] * 24, window_s=3600, lead_s=300)))
    assert result.exit_code == 0 and "the windows cover the whole day" in result.stderr
    assert all(t["name"] != "outside-schedule" for o in yaml.safe_load_all((out / "keda.yaml").read_text())
               for t in o["spec"]["triggers"])


def _reordered(tmp_path) -> Path:
    """Two windows 47 hours apart listed last first: its span read from the ends it once folded onto a day."""
    path = _schedule(tmp_path, [(1, 1), (2, 1)])
    doc = json.loads(path.read_text())
    late = dict(doc["schedule"]["windows"][1], start_s=47 * 3600.0, end_s=47 * 3600.0 + 600)
    doc["schedule"]["windows"] = [late, doc["schedule"]["windows"][0]]
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("case,needle", [
    ("out of order", "schedule.windows.1 starts at 0 s, before window 0 ends"),
    ("lead of two days", "scale_up_lead_s 172800 s is a day or more"),
    ("deep", "nested deeper than"),
    ("idle pool", "pool prompt h100-80gb TP 8 runs no instance in any window"),
    ("other plan", "its pools (prompt a100-80gb TP 8, token h100-80gb TP 8) are not this plan's"),
    ("seconds", "the window 90 s is not a whole minute"),
    ("two days", "KEDA's cron triggers repeat daily"),
    ("not json", "is not valid JSON"),
    ("no schedule", "no `schedule`"),
    ("negative", "schedule.windows.0.instances.0"),
    ("short row", "its instances do not match the schedule's 2 pools"),
])
def test_bad_schedules_are_refused_with_one_line(tmp_path, case, needle):
    path = {"other plan": lambda: _schedule(tmp_path, [(1, 1)], pools=["prompt a100-80gb TP 8", LABELS[1]]),
            "seconds": lambda: _schedule(tmp_path, [(1, 1)], window_s=90, lead_s=0),
            "two days": lambda: _schedule(tmp_path, [(1, 1)] * 49, window_s=3600, lead_s=0),
            "negative": lambda: _schedule(tmp_path, [(-1, 1)]),
            "short row": lambda: _schedule(tmp_path, [(1,)]),
            "out of order": lambda: _reordered(tmp_path),
            "lead of two days": lambda: _schedule(tmp_path, [(1, 1)], lead_s=2 * 86400.0),
            "idle pool": lambda: _schedule(tmp_path, [(0, 1), (0, 2)])}.get(case)
    if path is not None:
        schedule = path()
    else:
        schedule = tmp_path / "w.json"
        schedule.write_text({"not json": "{", "deep": "[" * 10_000 + "]" * 10_000}.get(case, "{\"windows\": []}"))
    result, out = _export(tmp_path, "--schedule", str(schedule))
    assert result.exit_code == 2 and needle in result.output, result.output
    assert result.output.count("\n") == 1 and not out.exists()


@pytest.mark.parametrize("args,needle", [
    (["--schedule-start", "25:00"], "--schedule-start '25:00': give the clock time"),
    (["--timezone", "UTC\nkind: Secret"], "--timezone 'UTC kind: Secret': not an IANA time zone"),
    (["--timezone", "UTC\n"], "not an IANA time zone"),
    (["--schedule-start", "09:00\n"], "give the clock time"),
    (["--timezone", "Europe/Paris; rm -rf /"], "not an IANA time zone"),
    (["--timezone", "Mars/Base"], "--timezone 'Mars/Base': not an IANA time zone"),  # (well formed, but no such zone)
    (["--outside-schedule", "always"], "--outside-schedule 'always': choose peak, min, zero"),
])
def test_clock_and_time_zone_are_checked_before_they_reach_a_manifest(tmp_path, args, needle):
    result, _ = _export(tmp_path, "--schedule", str(_schedule(tmp_path, [(1, 1)])), *args)
    assert result.exit_code == 2 and needle in result.output, result.output


def test_schedule_options_need_a_kubernetes_target_and_a_schedule(tmp_path):
    result, _ = _export(tmp_path, "--schedule", str(_schedule(tmp_path, [(1, 1)])), to="vllm")
    assert result.exit_code == 2 and "--schedule scales Kubernetes workloads with KEDA" in result.output
    result, _ = _export(tmp_path, "--timezone", "Europe/Paris")
    assert result.exit_code == 2 and "add --schedule D/windows.json" in result.output


def _keda_models() -> Path:
    """@kubernetes-models/keda's folder (KEDA_MODELS: the node_modules CI installs it into), or skip."""
    where = os.environ.get("KEDA_MODELS")
    if not where or shutil.which("node") is None:
        pytest.skip("needs node and @kubernetes-models/keda (KEDA_MODELS=node_modules folder; CI installs it)")
    return Path(where)


@pytest.mark.integration
def test_the_scaled_objects_are_valid_for_kedas_api(tmp_path):
    modules = _keda_models()
    _, out = _export(tmp_path, "--schedule", str(_schedule(tmp_path, [(2, 1), (3, 1), (1, 2)])))
    _, dynamo_out = _export(tmp_path / "d", "--schedule", str(_schedule(tmp_path, [(2, 1), (3, 1)])), to="dynamo",
                            plan=_plan(tmp_path))
    docs = [*yaml.safe_load_all((out / "keda.yaml").read_text()), *yaml.safe_load_all((dynamo_out / "keda.yaml").read_text())]
    broken = json.loads(json.dumps(docs[0]))
    broken["spec"]["triggers"][0]["metadata"]["desiredReplicas"] = 2  # (cron metadata are strings)
    script = (Path(__file__).parent / "keda_validate.mjs").read_text()
    run = subprocess.run(["node", "--input-type=module", "-e", script], input=json.dumps([*docs, broken]), text=True,
                         capture_output=True, env={**os.environ, "NODE_PATH": str(modules)}, cwd=modules.parent, timeout=60)
    assert run.returncode == 0, run.stderr
    verdicts = run.stdout.split("\n")[:-1]
    assert verdicts[:-1] == ["ok"] * len(docs) and verdicts[-1].startswith("invalid"), verdicts
