"""`splitplan export`: a plan.json as a deployment (parse, one library call, write)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from splitplan.base.errors import SpecError
from splitplan.base.inputs import printable
from splitplan.cli.common import app, user_errors


@app.command("export")
@user_errors
def export_command(
    plan: Path = typer.Argument(..., help="A plan.json written by `splitplan optimize --output-dir DIR`."),
    to: str = typer.Option(..., "--to", help="dynamo (a DynamoGraphDeployment), llm-d (Kubernetes manifests and "
                           "router values), vllm or sglang (launch.sh and docker-compose.yaml)."),
    output: Path | None = typer.Option(None, "--output", help="Folder for the files and EXPORT.md (the mapping); "
                                          "without it the main file goes to stdout and the notes to stderr."),
    backend: str | None = typer.Option(None, "--backend", help="Dynamo's backend, vllm or sglang (default: the "
                                          "plan's engine, when it is one of them)."),
    model_id: str | None = typer.Option(None, "--model-id", help="The Hugging Face repository to serve (default: "
                                           "the model spec's hf_repo), e.g. an fp8 or fp4 checkpoint."),
    image: str | None = typer.Option(None, "--image", help="Container image instead of the target's default."),
    node_selector: list[str] | None = typer.Option(None, "--node-selector", help="KEY=VALUE (repeat for more): the "
                                                      "node labels every serving pod is placed by, in place of the "
                                                      "hardware files' kubernetes_node_labels (dynamo, llm-d)."),
    model_cache_pvc: str | None = typer.Option(None, "--model-cache-pvc", help="A PersistentVolumeClaim (ReadWriteMany) "
                                                  "every serving pod reads and caches the weights in, so that pods do "
                                                  "not each download them (dynamo, llm-d)."),
    schedule: Path | None = typer.Option(None, "--schedule", help="The windows.json `optimize --window --output-dir` wrote "
                                         "beside this plan: keda.yaml, KEDA ScaledObjects whose cron triggers scale each "
                                         "pool to its windows (dynamo, llm-d)."),
    schedule_start: str = typer.Option("00:00", "--schedule-start", help="With --schedule: the clock time (HH:MM) of the "
                                       "schedule's first window; the triggers repeat daily."),
    timezone: str = typer.Option("UTC", "--timezone", help="With --schedule: the IANA time zone of --schedule-start."),
    outside_schedule: str = typer.Option("peak", "--outside-schedule", help="With --schedule: what each pool runs in the "
                                         "hours no window covers: peak (its most instances in any window), min (its "
                                         "fewest) or zero."),
) -> None:
    """Write a plan as a deployment for Dynamo, llm-d, vLLM or SGLang: every worker group with its replicas,
    GPUs and parallel flags; what the target cannot express is listed."""
    from splitplan.deploy import export_plan

    if schedule is None and (schedule_start != "00:00" or timezone != "UTC" or outside_schedule != "peak"):
        raise SpecError("--schedule-start, --timezone and --outside-schedule place a --schedule's windows: add --schedule "
                        "D/windows.json")
    result, notes = export_plan(plan, to, backend, model_id, image, node_selector, model_cache_pvc, schedule=schedule,
                                schedule_start=schedule_start, timezone=timezone, outside=outside_schedule)
    for note in notes:
        typer.echo(f"note: {printable(note)}", err=True)
    if output is None:
        sys.stdout.write(next(iter(result.files.values())))
        others = list(result.files)[1:]
        notes = [f"written for {result.version}"] + [f"not expressed: {u}" for u in result.unexpressed] + (
            [f"also: {', '.join(others)} (give --output DIR)"] if others else [])
        for line in notes:
            typer.echo(f"note: {printable(line)}", err=True)
        return
    written = result.write(output)
    typer.echo(printable(f"wrote {', '.join(str(p) for p in written)} for {result.version}"))
    for line in result.unexpressed:
        typer.echo(f"not expressed: {printable(line)}")
