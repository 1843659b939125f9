"""`splitplan export` (issue 18): each target from a fixed plan against reviewed golden files, the
Dynamo manifest against the vendored Dynamo 1.6.1 templates, the files parsed, and bad input."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from splitplan.cli import app
from splitplan.export import deployment, export
from splitplan.export.dynamo import template
from splitplan.specs.layout import Layout

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "export"
runner = CliRunner()


def _plan(tmp_path, pools: dict, model="deepseek-v3", engine="sglang-fp8", version=2, name="plan.json"):
    doc = {"schema_version": version, "inputs": {"model": model, "engine": engine, "max_batch_tokens": 2048},
           "plan": {f"{role}_pools": [{"hardware": hw, "tp": lay.tp, "dp": lay.dp, "ep": lay.ep, "pp": lay.pp,
                                       "layout": lay.spec, "machines": m} for hw, lay, m in items]
                    for role, items in pools.items()}}
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


SPLIT = {"prompt": [("h200-141gb", Layout(8), 2)], "token": [("h200-141gb", Layout(1, 16, 16), 2)]}
COLOCATED = {"mixed": [("h100-80gb", Layout(4), 1)]}


def _files(tmp_path, target, pools, **plan):
    out = tmp_path / f"out-{target}"
    result = runner.invoke(app, ["export", str(_plan(tmp_path, pools, **plan)), "--to", target, "--output", str(out)])
    assert result.exit_code == 0, result.stderr
    return {p.name: p.read_text() for p in sorted(out.iterdir())}


@pytest.mark.parametrize("target, pools, plan", [
    ("dynamo", SPLIT, {}), ("sglang", SPLIT, {}), ("vllm", SPLIT, {"engine": "vllm-fp8"}),
    ("vllm", COLOCATED, {"model": "llama3.1-70b", "engine": "vllm-fp8"}),
])
def test_exports_match_the_reviewed_golden_files(tmp_path, target, pools, plan):
    files = {n: t.replace(str(tmp_path), "TMP") for n, t in _files(tmp_path, target, pools, **plan).items()}
    case = f"{target}-{'split' if pools is SPLIT else 'colocated'}"
    if os.environ.get("SPLITPLAN_UPDATE_GOLDEN"):
        (GOLDEN / case).mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (GOLDEN / case / name).write_text(text)
    expected = {p.name: p.read_text() for p in sorted((GOLDEN / case).iterdir())}
    assert files == expected


def _paths(node, prefix=""):
    """Every key path of a YAML document (list items as [])."""
    if isinstance(node, dict):
        out = set()
        for k, v in node.items():
            out |= {f"{prefix}.{k}"} | _paths(v, f"{prefix}.{k}")
        return out
    if isinstance(node, list):
        return set().union(*(_paths(v, prefix + "[]") for v in node)) if node else set()
    return set()


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
@pytest.mark.parametrize("pools", [SPLIT, COLOCATED])
def test_dynamo_manifest_has_the_structure_of_the_dynamo_templates(tmp_path, backend, pools):
    dep = deployment([(role, hw, lay, m) for role, items in pools.items() for hw, lay, m in items],
                     {"model": "deepseek-v3", "engine": f"{backend}-fp8"}, "plan.json")
    doc = yaml.safe_load(export(dep, "dynamo", backend).files["dynamo.yaml"])
    reference = template(backend, pools is SPLIT)
    assert (doc["apiVersion"], doc["kind"]) == ("nvidia.com/v1beta1", "DynamoGraphDeployment") == \
        (reference["apiVersion"], reference["kind"])
    assert _paths(doc) - _paths(reference) <= {".spec.components[].multinode", ".spec.components[].multinode.nodeCount"}
    types = [c["type"] for c in doc["spec"]["components"]]
    assert types == (["frontend", "prefill", "decode"] if pools is SPLIT else ["frontend", "worker"])
    for c in doc["spec"]["components"][1:]:
        assert isinstance(c["replicas"], int) and c["replicas"] >= 1
        assert c["podTemplate"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] in ("4", "8")


def test_an_instance_over_two_machines_is_one_replica_of_two_nodes(tmp_path):
    doc = yaml.safe_load(_files(tmp_path, "dynamo", SPLIT)["dynamo.yaml"])
    prefill, decode = doc["spec"]["components"][1:]
    assert (prefill["replicas"], prefill.get("multinode")) == (2, None)
    assert (decode["replicas"], decode["multinode"]) == (1, {"nodeCount": 2})
    args = decode["podTemplate"]["spec"]["containers"][0]["args"]
    assert " ".join(args).count("--tp 16 --dp 16 --enable-dp-attention --ep 16") == 1
    assert args[args.index("--disaggregation-mode") + 1] == "decode"


def test_launch_files_parse_and_name_every_node(tmp_path):
    files = _files(tmp_path, "sglang", SPLIT)
    subprocess.run(["bash", "-n"], input=files["launch.sh"], text=True, check=True)
    compose = yaml.safe_load(files["docker-compose.yaml"])["services"]
    assert sorted(compose) == ["decode-h200-141gb-dp16ep16-0-node0", "decode-h200-141gb-dp16ep16-0-node1",
                               "prefill-h200-141gb-tp8-0", "prefill-h200-141gb-tp8-1", "router"]
    assert all(s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == [str(k) for k in range(8)]
               for n, s in compose.items() if n != "router")
    assert "--node-rank 1" in compose["decode-h200-141gb-dp16ep16-0-node1"]["command"][2]
    assert "EXPORT.md" in files and "hardware: the machine type is not selected" in files["EXPORT.md"]


def test_without_output_the_main_file_goes_to_stdout_and_notes_to_stderr(tmp_path):
    result = runner.invoke(app, ["export", str(_plan(tmp_path, SPLIT)), "--to", "dynamo"])
    assert result.exit_code == 0, result.stderr
    assert yaml.safe_load(result.stdout)["kind"] == "DynamoGraphDeployment"
    assert "note: written for NVIDIA Dynamo 1.6.1" in result.stderr and "note: not expressed:" in result.stderr


@pytest.mark.parametrize("args, plan, message", [
    (["--to", "kserve"], {}, "--to kserve: choose dynamo, vllm, sglang"),
    (["--to", "dynamo"], {"version": 1}, "schema_version 1"),
    (["--to", "vllm"], {"pools": {"prompt": [("h200-141gb", Layout(4, 2, 4), 1)], "token": [("h200-141gb", Layout(8), 1)]}},
     "vLLM cannot run TP 4 DP 2 EP 4"),
    (["--to", "vllm", "--backend", "sglang"], {}, "--backend is for --to dynamo"),
    (["--to", "dynamo"], {"engine": "trtllm-fp8"}, "give --backend vllm or sglang"),
    (["--to", "dynamo"], {"model": "gpt3-175b", "pools": COLOCATED}, "give --model-id"),
    (["--to", "dynamo"], {"pools": {"prompt": [("h200-141gb", Layout(8), 1)], "token": [("h200-141gb", Layout(1, 16, 16), 3)]}},
     "give a multiple of 2"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, args, plan, message):
    pools = plan.pop("pools", SPLIT)
    result = runner.invoke(app, ["export", str(_plan(tmp_path, pools, **plan)), *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and message in result.stderr and result.stderr.count("\n") == 1


def test_workers_sharing_a_machine_take_their_own_gpus_and_ports(tmp_path):
    script = _files(tmp_path, "vllm", COLOCATED, model="llama3.1-70b", engine="vllm-fp8")["launch.sh"]
    assert "export CUDA_VISIBLE_DEVICES=0,1,2,3" in script and "export CUDA_VISIBLE_DEVICES=4,5,6,7" in script
    assert "--port 8100" in script and "--port 8101" in script
    assert '--worker-urls "http://${WORKER_H100_80GB_TP4_0_HOST}:8100" "http://${WORKER_H100_80GB_TP4_1_HOST}:8101"' in script


def test_a_plan_sized_for_another_engine_says_so(tmp_path):
    result = runner.invoke(app, ["export", str(_plan(tmp_path, SPLIT, engine="sglang-fp8")), "--to", "vllm"])
    assert result.exit_code == 0 and "re-plan with --engine vllm-fp8" in result.stderr
