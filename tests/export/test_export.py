"""`splitplan export` (issue 18): each target from a fixed plan against reviewed golden files, the
Dynamo manifest against the vendored Dynamo 1.6.1 templates, the llm-d manifests against the
Kubernetes API's schema (kubernetes-validate, strict), the files parsed, and bad input."""

import json
import math
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from splitplan.cli import app
from splitplan.deploy import TARGETS, deployment, export
from splitplan.deploy.dynamo import role_flags, template
from splitplan.specs.layout import Layout
from splitplan.specs.roles import Pool, Role


def _kubernetes():
    """kubernetes-validate (the integration extra; CI installs it), or the test is skipped."""
    return pytest.importorskip("kubernetes_validate", reason="needs the integration extra: pip install '.[integration]'")

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "export"
runner = CliRunner()


def _plan(tmp_path, pools: dict, model="deepseek-v3", engine="sglang-fp8", version=2, name="plan.json"):
    doc = {"schema_version": version, "inputs": {"model": model, "slo": "chat", "engine": engine, "max_batch_tokens": 2048},
           "plan": {**{f"{role}_pools": [{"hardware": hw, "tp": lay.tp, "dp": lay.dp, "ep": lay.ep, "pp": lay.pp,
                                          "layout": lay.spec, "machines": m} for hw, lay, m in items]
                       for role, items in pools.items()},
                    "machines": sum(m for items in pools.values() for _, _, m in items), "cost_usd_per_hour": 0.0,
                    "power_kw": 0.0, "predicted": {}, "slo": [], "binding": ""}}
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


VLLM_COLOCATED = {"model": "llama3.1-70b", "engine": "vllm-fp8"}
SGLANG_COLOCATED = {"model": "llama3.1-70b", "engine": "sglang-fp8"}
# Every target and backend, split and co-located (case: the golden folder under tests/data/export/).
GOLDEN_CASES = [
    ("dynamo-split", "dynamo", SPLIT, {}), ("dynamo-vllm-split", "dynamo", SPLIT, {"engine": "vllm-fp8"}),
    ("dynamo-colocated", "dynamo", COLOCATED, SGLANG_COLOCATED), ("dynamo-vllm-colocated", "dynamo", COLOCATED, VLLM_COLOCATED),
    ("sglang-split", "sglang", SPLIT, {}), ("sglang-colocated", "sglang", COLOCATED, SGLANG_COLOCATED),
    ("vllm-split", "vllm", SPLIT, {"engine": "vllm-fp8"}), ("vllm-colocated", "vllm", COLOCATED, VLLM_COLOCATED),
    ("llm-d-split", "llm-d", SPLIT, {"engine": "vllm-fp8"}), ("llm-d-colocated", "llm-d", COLOCATED, VLLM_COLOCATED),
]


@pytest.mark.parametrize("case, target, pools, plan", GOLDEN_CASES, ids=[c[0] for c in GOLDEN_CASES])
def test_exports_match_the_reviewed_golden_files(tmp_path, case, target, pools, plan):
    files = {n: t.replace(str(tmp_path), "TMP") for n, t in _files(tmp_path, target, pools, **plan).items()}
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


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["vllm", "sglang"])
@pytest.mark.parametrize("pools", [SPLIT, COLOCATED])
def test_dynamo_manifest_has_the_structure_of_the_dynamo_templates(tmp_path, backend, pools):
    kubernetes_validate = _kubernetes()
    dep = deployment([Pool(Role(role), hw, lay, m) for role, items in pools.items() for hw, lay, m in items],
                     {"model": "deepseek-v3", "engine": f"{backend}-fp8"}, "plan.json")
    doc = yaml.safe_load(export(dep, "dynamo", backend).files["dynamo.yaml"])
    reference = template(backend, pools is SPLIT)
    assert (doc["apiVersion"], doc["kind"]) == ("nvidia.com/v1beta1", "DynamoGraphDeployment") == \
        (reference["apiVersion"], reference["kind"])
    pod = ".spec.components[].podTemplate.spec"  # (a Kubernetes PodTemplateSpec: placement and the cache are its fields)
    placement = {f"{pod}.{k}" for k in ("nodeSelector", "nodeSelector.nvidia.com/gpu.product", "nodeSelector.nvidia.com/gpu.count",
                                        "tolerations", "tolerations[].key", "tolerations[].operator", "tolerations[].effect")}
    storage = {f".spec.components[].podTemplate.spec.containers[].resources.requests{k}" for k in ("", ".ephemeral-storage")}
    assert _paths(doc) - _paths(reference) <= {".spec.components[].multinode", ".spec.components[].multinode.nodeCount",
                                               *placement, *storage}  # (vLLM's templates request storage, SGLang's do not)
    for c in doc["spec"]["components"]:
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                      "template": c["podTemplate"]}, KUBERNETES, strict=True)
    types = [c["type"] for c in doc["spec"]["components"]]
    assert types == (["frontend", "prefill", "decode"] if pools is SPLIT else ["frontend", "worker"])
    assert [c["replicas"] for c in doc["spec"]["components"][1:]] == ([2, 1] if pools is SPLIT else [2])
    for c in doc["spec"]["components"][1:]:
        assert c["podTemplate"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] in ("4", "8")


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
@pytest.mark.parametrize("pools", [SPLIT, COLOCATED], ids=["split", "colocated"])
def test_dynamo_workers_carry_their_templates_role_flags(tmp_path, backend, pools):
    """Issue 54, item 2: each worker runs its role as the vendored Dynamo 1.6.1 template's worker of
    that role does (dynamo.vllm's prefill and decode by --disaggregation-mode, not vLLM's kv_both
    connector; an aggregated worker with none), so the deployment is the split that was priced."""
    plan = {"engine": f"{backend}-fp8"} if pools is SPLIT else {"model": "llama3.1-70b", "engine": f"{backend}-fp8"}
    doc = yaml.safe_load(_files(tmp_path, "dynamo", pools, **plan)["dynamo.yaml"])
    reference = {c["type"]: role_flags(c) for c in template(backend, pools is SPLIT)["spec"]["components"] if c["type"] != "frontend"}
    ours = {c["type"]: role_flags(c) for c in doc["spec"]["components"] if c["type"] != "frontend"}
    assert ours == reference
    if pools is SPLIT:
        assert ours["prefill"][0] == "--disaggregation-mode prefill" and ours["decode"][0] == "--disaggregation-mode decode"
        assert not any("kv_both" in f for flags in ours.values() for f in flags)


FLAGS = {"vllm": ("--max-num-batched-tokens", "--max-num-seqs", "--data-parallel-size"),
         "sglang": ("--chunked-prefill-size", "--max-running-requests", "--dp-size")}


@pytest.mark.parametrize("plan, engine, prefill, decode", [
    ({"engine": "vllm-fp8"}, "vllm", (2048, 1024), (128, 64)),
    ({"engine": "sglang-fp8"}, "sglang", (2048, None), (2048, None)),
    ({"engine": "sglang-fp8"}, "vllm", (2048, None), (128, 128)),
])
def test_each_rank_gets_what_the_plan_priced_per_instance(tmp_path, plan, engine, prefill, decode):
    """A plan prices the token budget and sequence cap per instance (vllm-fp8's cap 1,024 where the
    plan names none, as simulate --plan replays it). SGLang divides both over its DP attention ranks
    itself; each vLLM DP rank schedules alone, so the DP16 decode instance gets 2,048 / 16 tokens
    and 1,024 / 16 sequences a rank, and, planned without a cap, its rank's budget as the cap (vLLM
    refuses a cap above the budget)."""
    tokens_flag, seqs_flag, dp_flag = FLAGS[engine]
    seen = set()
    for line in _files(tmp_path, engine, SPLIT, **plan)["launch.sh"].splitlines():
        words = line.split()
        if tokens_flag in words:
            limits = tuple(int(words[words.index(f) + 1]) if f in words else None for f in (tokens_flag, seqs_flag))
            seen.add((dp_flag in words, limits))
    assert seen == {(False, prefill), (True, decode)}


def test_an_instance_over_two_machines_is_one_replica_of_two_nodes(tmp_path):
    doc = yaml.safe_load(_files(tmp_path, "dynamo", SPLIT)["dynamo.yaml"])
    prefill, decode = doc["spec"]["components"][1:]
    assert (prefill["replicas"], prefill.get("multinode")) == (2, None)
    assert (decode["replicas"], decode["multinode"]) == (1, {"nodeCount": 2})
    args = decode["podTemplate"]["spec"]["containers"][0]["args"]
    assert " ".join(args).count("--tp-size 16 --dp-size 16 --enable-dp-attention --ep-size 16") == 1
    assert args[args.index("--disaggregation-mode") + 1] == "decode"


def test_launch_files_parse_and_name_every_node(tmp_path):
    files = _files(tmp_path, "sglang", SPLIT)
    subprocess.run(["bash", "-n"], input=files["launch.sh"], text=True, check=True)
    compose = yaml.safe_load(files["docker-compose.yaml"])["services"]
    assert sorted(compose) == ["decode-h200-141gb-dp16ep16-0-node0", "decode-h200-141gb-dp16ep16-0-node1",
                               "prefill-h200-141gb-tp8-0", "prefill-h200-141gb-tp8-1", "router"]
    assert all(s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == [str(k) for k in range(8)]
               for n, s in compose.items() if n != "router")
    assert "--node-rank 1" in " ".join(compose["decode-h200-141gb-dp16ep16-0-node1"]["entrypoint"])
    assert "EXPORT.md" in files and "hardware: the machine type is not selected" in files["EXPORT.md"]


def _router_command(script: str) -> list[str]:
    lines = script.splitlines()
    return shlex.split(lines[lines.index("  router)") + 1])


@pytest.mark.integration
@pytest.mark.parametrize("engine, pools", [("vllm", SPLIT), ("sglang", SPLIT), ("vllm", COLOCATED), ("sglang", COLOCATED)])
def test_the_router_commands_parse_with_the_routers_own_parsers(tmp_path, engine, pools):
    """launch.sh's router command through the argument parser and checks of the router version it
    names (vllm-router 0.1.17, sglang-router 0.3.2: test dependencies at those versions)."""
    router = pytest.importorskip(f"{engine}_router.launch_router", reason="needs the integration extra: pip install '.[integration]'")
    from importlib.metadata import version
    assert version(f"{engine}-router") == {"vllm": "0.1.17", "sglang": "0.3.2"}[engine]
    cmd = _router_command(_files(tmp_path, engine, pools, model="llama3.1-70b", engine=f"{engine}-fp8")["launch.sh"])
    args = router.parse_router_args(cmd[1:] if engine == "vllm" else cmd[3:])
    args._validate_router_args()
    if pools is SPLIT:
        assert args.prefill_urls == [(f"http://${{PREFILL_H200_141GB_TP8_{i}_HOST}}:8100", None if engine == "vllm" else 8998)
                                     for i in range(2)]
        assert args.decode_urls == ["http://${DECODE_H200_141GB_DP16EP16_0_HOST}:8100"]
        assert (args.vllm_pd_disaggregation if engine == "vllm" else args.pd_disaggregation) is True
    else:
        assert args.worker_urls == ["http://${WORKER_H100_80GB_TP4_0_HOST}:8100", "http://${WORKER_H100_80GB_TP4_1_HOST}:8101"]
    assert (args.host, args.port) == ("0.0.0.0", 8000)


def test_without_output_the_main_file_goes_to_stdout_and_notes_to_stderr(tmp_path):
    result = runner.invoke(app, ["export", str(_plan(tmp_path, SPLIT)), "--to", "dynamo"])
    assert result.exit_code == 0, result.stderr
    assert yaml.safe_load(result.stdout)["kind"] == "DynamoGraphDeployment"
    assert "note: written for NVIDIA Dynamo 1.6.1" in result.stderr and "note: not expressed:" in result.stderr


@pytest.mark.parametrize("args, plan, message", [
    (["--to", "kserve"], {}, "--to kserve: choose dynamo, llm-d, vllm, sglang"),
    (["--to", "llm-d", "--backend", "sglang"], {}, "--to llm-d runs vllm; --backend is for --to dynamo"),
    (["--to", "llm-d"], {"pools": {"prompt": [("h200-141gb", Layout(8), 1)], "token": [("h200-141gb", Layout(8, 2, 8), 2)]}},
     "vLLM cannot run TP 8 DP 2 EP 8"),
    (["--to", "dynamo"], {"version": 1}, "schema_version 1"),
    (["--to", "llm-d", "--node-selector", "gpu=a b"], {}, "--node-selector 'gpu=a b': not KEY=VALUE of a Kubernetes label"),
    (["--to", "llm-d", "--node-selector", "pool"], {}, "--node-selector 'pool': not KEY=VALUE"),
    (["--to", "dynamo", "--model-cache-pvc", "Weights;rm"], {}, "--model-cache-pvc 'Weights;rm': not a PersistentVolumeClaim name"),
    (["--to", "vllm", "--model-cache-pvc", "weights"], {}, "--model-cache-pvc: --to vllm writes a launch script"),
    (["--to", "sglang", "--node-selector", "a=b"], {}, "--node-selector: --to sglang writes a launch script"),
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


KUBERNETES = "1.34.0"  # the API version the llm-d manifests are checked against
# Instances on one machine, sharing one, over two by data parallelism, and over two as one
# TP 8 (GB200 trays of 4) or TP 8 x PP 2 rank (Ray).
LLMD = {"prompt": [("gb200-nvl72", Layout(8), 2), ("h100-80gb", Layout(8, 1, 1, 2), 2), ("h100-80gb", Layout(2), 1)],
        "token": [("h200-141gb", Layout(1, 16, 16), 2), ("h200-141gb", Layout(8, 2, 16), 4), ("h200-141gb", Layout(8), 1)]}


def _llmd(tmp_path, pools):
    files = _files(tmp_path, "llm-d", pools, engine="vllm-fp8")
    return list(yaml.safe_load_all(files["llm-d.yaml"])), files


def _pod_templates(doc):
    if doc["kind"] == "ServiceAccount":
        return {}
    if doc["kind"] == "Deployment":
        return {"template": doc["spec"]["template"]}
    group = doc["spec"]["leaderWorkerTemplate"]
    return {k: group[k] for k in ("leaderTemplate", "workerTemplate") if k in group}


@pytest.mark.integration
@pytest.mark.parametrize("pools", [SPLIT, COLOCATED, LLMD])
def test_llmd_manifests_are_valid_kubernetes_objects(tmp_path, pools):
    kubernetes_validate = _kubernetes()
    docs, _ = _llmd(tmp_path, pools)
    assert [d["kind"] for d in docs][0] == "ServiceAccount"
    for doc in docs:
        if doc["kind"] == "LeaderWorkerSet":
            # The LWS CRD is on no registry this project reaches: its pods are checked as Kubernetes pod
            # templates, its own fields against the ones llm-d's wide-EP guide sets.
            assert doc["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
            assert set(doc["spec"]) == {"replicas", "leaderWorkerTemplate"}
            assert set(doc["spec"]["leaderWorkerTemplate"]) <= {"size", "leaderTemplate", "workerTemplate"}
        else:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        for pod in _pod_templates(doc).values():
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                          "template": pod}, KUBERNETES, strict=True)
            for c in pod["spec"]["containers"]:
                subprocess.run(["bash", "-n"], input=c["args"][0], text=True, check=True)


@pytest.mark.integration
def test_the_kubernetes_schema_check_catches_a_misspelt_field(tmp_path):
    kubernetes_validate = _kubernetes()
    deployment_doc = _llmd(tmp_path, SPLIT)[0][1]
    deployment_doc["spec"]["replica"] = deployment_doc["spec"].pop("replicas")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment_doc, KUBERNETES, strict=True)


def test_llmd_runs_each_instance_as_pods_of_its_gpus(tmp_path):
    docs, files = _llmd(tmp_path, LLMD)
    by_name = {d["metadata"]["name"]: d for d in docs[1:]}
    shape = {n: (d["kind"], d["spec"]["replicas"], d["spec"].get("leaderWorkerTemplate", {}).get("size", 1),
                 sorted(_pod_templates(d)),
                 [t["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for t in _pod_templates(d).values()])
             for n, d in by_name.items()}
    assert shape == {
        "prefill-gb200-nvl72-tp8": ("LeaderWorkerSet", 1, 2, ["leaderTemplate", "workerTemplate"], ["4", "4"]),
        "prefill-h100-80gb-tp8pp2": ("LeaderWorkerSet", 1, 2, ["leaderTemplate", "workerTemplate"], ["8", "8"]),
        "prefill-h100-80gb-tp2": ("Deployment", 4, 1, ["template"], ["2"]),
        "decode-h200-141gb-dp16ep16": ("LeaderWorkerSet", 1, 2, ["workerTemplate"], ["8"]),
        "decode-h200-141gb-tp8dp2ep16": ("LeaderWorkerSet", 2, 2, ["workerTemplate"], ["8"]),
        "decode-h200-141gb-tp8": ("Deployment", 1, 1, ["template"], ["8"]),
    }
    wide = by_name["decode-h200-141gb-dp16ep16"]["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    script = wide["spec"]["containers"][0]["args"][0]
    assert "--data-parallel-size 16 --enable-expert-parallel" in script
    assert '--data-parallel-size-local 8 --data-parallel-address "$LWS_LEADER_ADDRESS"' in script
    assert script.endswith('--data-parallel-start-rank "$((LWS_WORKER_INDEX*8))"')
    pipeline = by_name["prefill-h100-80gb-tp8pp2"]["spec"]["leaderWorkerTemplate"]
    assert "--tensor-parallel-size 8 --pipeline-parallel-size 2" in pipeline["leaderTemplate"]["spec"]["containers"][0]["args"][0]
    assert pipeline["leaderTemplate"]["spec"]["containers"][0]["args"][0].endswith("--distributed-executor-backend ray")
    assert pipeline["workerTemplate"]["spec"]["containers"][0]["args"] == ["exec ray start --address=$LWS_LEADER_ADDRESS:6379 --block"]
    # the router sees serving pods only: a Ray worker pod carries no llm-d serving labels
    assert "llm-d.ai/inference-serving" not in pipeline["workerTemplate"]["metadata"]["labels"]
    assert "To apply:" in files["EXPORT.md"] and "kubectl apply -n NS -f llm-d.yaml" in files["EXPORT.md"]


def test_llmd_labels_roles_and_puts_the_routing_sidecar_before_decode(tmp_path):
    docs, files = _llmd(tmp_path, SPLIT)
    prefill, decode = (_pod_templates(d) for d in docs[1:])
    p, d = prefill["template"], decode["workerTemplate"]
    assert p["metadata"]["labels"]["llm-d.ai/role"] == "prefill" and d["metadata"]["labels"]["llm-d.ai/role"] == "decode"
    assert "initContainers" not in p["spec"]
    (sidecar,) = d["spec"]["initContainers"]
    assert sidecar["restartPolicy"] == "Always" and sidecar["ports"][0]["containerPort"] == 8000
    assert d["spec"]["containers"][0]["ports"][0]["containerPort"] == 8200 == p["spec"]["containers"][0]["ports"][0]["containerPort"] + 200
    values = yaml.safe_load(files["router.values.yaml"])
    assert values == {"router": {"modelServers": {"matchLabels": {"llm-d.ai/guide": None, "llm-d.ai/model": "splitplan-deepseek-v3"}}}}
    colocated = _pod_templates(_llmd(tmp_path, COLOCATED)[0][1])["template"]
    assert "llm-d.ai/role" not in colocated["metadata"]["labels"] and "initContainers" not in colocated["spec"]


def test_the_export_names_the_repository_it_serves_and_asks_for_a_checkpoint_only_when_needed(tmp_path):
    """Chat models serve their instruct checkpoint. An fp8 plan of a bf16 repository is served with
    the engine's --quantization fp8 where its instances hold the bf16 weights while they load, and
    refused naming --model-id where they do not (issue 54, item 4: it crash-looped); DeepSeek-V3 is
    fp8 already, and --model-id names a checkpoint of the plan's precision."""
    script = _files(tmp_path, "vllm", COLOCATED, model="llama3.1-70b", engine="vllm-fp8")["launch.sh"]
    assert "vllm serve meta-llama/Llama-3.1-70B-Instruct " in script and "--quantization fp8" in script
    given = runner.invoke(app, ["export", str(_plan(tmp_path, COLOCATED, model="llama3.1-70b", engine="vllm-fp8")), "--to", "vllm",
                                "--model-id", "org/llama-fp8"])
    assert given.exit_code == 0 and "vllm serve org/llama-fp8 " in given.stdout and "--quantization" not in given.stdout
    native = _files(tmp_path, "vllm", SPLIT, engine="vllm-fp8")["launch.sh"]
    assert "--quantization" not in native
    one_gpu = {"mixed": [("h200-141gb@1", Layout(1), 2)]}
    for target in TARGETS:
        refused = runner.invoke(app, ["export", str(_plan(tmp_path, one_gpu, model="llama3.1-70b", engine="vllm-fp8")), "--to", target,
                                      "--output", str(tmp_path / f"refused-{target}")])
        assert refused.exit_code == 2 and not (tmp_path / f"refused-{target}").exists()
        assert "bf16 weights" in refused.stderr and "give --model-id with an fp8 checkpoint" in refused.stderr, refused.stderr
    fp4 = runner.invoke(app, ["export", str(_plan(tmp_path, COLOCATED, model="llama3.1-70b", engine="vllm-fp8@weights=fp4")),
                              "--to", "vllm"])
    assert fp4.exit_code == 2 and "give --model-id with an fp4 checkpoint" in fp4.stderr, fp4.stderr


def test_gpt_oss_serves_its_own_mxfp4_checkpoint_and_fp4_on_hopper_is_exported_for_vllm(tmp_path):
    """gpt-oss-120b's repository holds its experts in MXFP4 (hf_repo_weights fp4): an fp8 or fp4
    plan serves it as it is, where an fp8 plan was refused as if it held bf16 weights. fp4 weights
    on H100, which has no fp4 tensor cores, are priced weight-only, as vLLM serves them: exported
    for vLLM, refused for SGLang (whose fp4 path needs fp4 tensor cores), no file written."""
    for engine in ("vllm-fp8", "vllm@weights=fp4"):
        script = _files(tmp_path, "vllm", COLOCATED, model="gpt-oss-120b", engine=engine)["launch.sh"]
        assert "vllm serve openai/gpt-oss-120b " in script and "--quantization" not in script
    plan = _plan(tmp_path, COLOCATED, model="gpt-oss-120b", engine="vllm@weights=fp4")
    for args in (["--to", "sglang"], ["--to", "dynamo", "--backend", "sglang"]):
        refused = runner.invoke(app, ["export", str(plan), *args, "--output", str(tmp_path / "refused")])
        assert refused.exit_code == 2 and "h100-80gb, which has no fp4 tensor cores" in refused.stderr, refused.stderr
        assert not (tmp_path / "refused").exists()
    assert runner.invoke(app, ["export", str(plan), "--to", "dynamo"]).exit_code == 0  # (the plan's engine: vLLM)
    a100_fp8 = _plan(tmp_path, {"mixed": [("a100-80gb", Layout(4), 1)]}, model="llama3.1-70b", engine="sglang-fp8")
    assert runner.invoke(app, ["export", str(a100_fp8), "--to", "sglang"]).exit_code == 0  # (fp8 without fp8 tensor cores)


def test_pods_request_storage_for_the_weights_cpus_and_memory(tmp_path):
    """Issue 54, item 4: Dynamo's template asks 2Gi of ephemeral storage, llm-d's pods nothing but
    GPUs; each pod now requests the checkpoint it downloads (Llama-3.1-70B: 141 GB of bf16) and
    llm-d's pods CPUs and memory per GPU; the Dynamo KEDA objects carry no llm-d label."""
    plan = _plan(tmp_path, COLOCATED, model="llama3.1-70b", engine="vllm-fp8")
    need = math.ceil(70.55e9 * 2 * 1.1 / 2**30) + 10
    dynamo_doc = yaml.safe_load(runner.invoke(app, ["export", str(plan), "--to", "dynamo"]).stdout)
    worker = dynamo_doc["spec"]["components"][1]["podTemplate"]["spec"]["containers"][0]
    assert abs(int(worker["resources"]["requests"]["ephemeral-storage"].removesuffix("Gi")) - need) <= 2
    pods = [d for d in yaml.safe_load_all(runner.invoke(app, ["export", str(plan), "--to", "llm-d"]).stdout) if d["kind"] == "Deployment"]
    requests = pods[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert (requests["cpu"], requests["memory"], requests["nvidia.com/gpu"]) == ("16", "64Gi", "4")
    cached = runner.invoke(app, ["export", str(plan), "--to", "llm-d", "--model-cache-pvc", "weights"]).stdout
    assert "ephemeral-storage: 10Gi" in cached


@pytest.mark.integration
@pytest.mark.parametrize("target", ["llm-d", "dynamo"])
def test_pods_land_on_the_machines_the_plan_bought_and_share_one_copy_of_the_weights(tmp_path, target):
    """Issue 30, item 5: each serving pod is selected onto its machine type and shape (the hardware
    file's GPU Feature Discovery labels, the shape's GPU count; or --node-selector in their place),
    tolerates its GPUs' taint, requests the GPU resource of its hardware (amd.com/gpu on MI300X),
    and with --model-cache-pvc reads the weights from one claim (HF_HOME); a valid pod template."""
    kubernetes_validate = _kubernetes()
    pools = {"prompt": [("h100-80gb@2", Layout(2), 3)], "token": [("mi300x-192gb@1", Layout(1), 2)]}
    plan = _plan(tmp_path, pools, model="llama3.1-8b", engine="vllm-fp8")

    def pods(*args):
        out = tmp_path / f"out-{len(args)}"
        result = runner.invoke(app, ["export", str(plan), "--to", target, "--output", str(out), *args])
        assert result.exit_code == 0, result.output
        docs = list(yaml.safe_load_all((out / ("llm-d.yaml" if target == "llm-d" else "dynamo.yaml")).read_text()))
        found = ([d["spec"]["template"] for d in docs if d["kind"] == "Deployment"] if target == "llm-d" else
                 [c["podTemplate"] for c in docs[0]["spec"]["components"] if c["type"] != "frontend"])
        for pod in found:
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                          "template": pod}, KUBERNETES, strict=True)
        return found, (out / "EXPORT.md").read_text()

    (prefill, decode), notes = pods()
    assert prefill["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "2"}
    assert prefill["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert prefill["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert decode["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"] == "1"
    assert "nodeSelector" not in decode["spec"] and decode["spec"]["tolerations"][0]["key"] == "amd.com/gpu"
    assert "token_pools[mi300x-192gb@1].hardware: the machine type is not selected" in notes
    assert "every pod downloads them; give --model-cache-pvc" in notes
    (prefill, decode), notes = pods("--node-selector", "cloud.google.com/gke-accelerator=nvidia-h100-80gb",
                                    "--node-selector", "pool=serving", "--model-cache-pvc", "hf-cache")
    for pod in (prefill, decode):
        assert pod["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb", "pool": "serving"}
        assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}} in pod["spec"]["volumes"]
        container = pod["spec"]["containers"][0]
        assert {"name": "HF_HOME", "value": "/model-cache"} in container["env"]
        assert {"name": "model-cache", "mountPath": "/model-cache"} in container["volumeMounts"]
    assert "not selected" not in notes and "mounts the claim hf-cache" in notes


def _entries(script: str) -> dict[str, list[list[str]]]:
    """launch.sh's entries: name -> its commands (after `export CUDA_VISIBLE_DEVICES`), as words."""
    lines, out, name = script.splitlines(), {}, None
    for line in lines[lines.index('case "${1:-}" in') + 1:]:
        text = line.strip()
        if text == "*)":  # (the usage message)
            break
        if text.endswith(")") or ")  #" in text:
            name = text.split(")")[0]
            out[name] = []
        elif text == ";;" or text == "esac":
            name = None
        elif name is not None and not text.startswith("export "):
            out[name].append(shlex.split(text))
    return out


def test_sglang_prefill_workers_on_one_machine_take_their_own_bootstrap_ports(tmp_path):
    """Two TP 4 prefill workers on one 8-GPU machine: each its GPUs, HTTP port and disaggregation
    bootstrap port (SGLang's 8998, then 8999), and the router names each prefill by both."""
    pools = {"prompt": [("h100-80gb", Layout(4), 1)], "token": [("h100-80gb", Layout(8), 1)]}
    entries = _entries(_files(tmp_path, "sglang", pools, model="llama3.1-70b", engine="sglang-fp8")["launch.sh"])
    prefill = {name: cmds[0] for name, cmds in entries.items() if name.startswith("prefill")}
    ports = {name: (cmd[cmd.index("--port") + 1], cmd[cmd.index("--disaggregation-bootstrap-port") + 1])
             for name, cmd in prefill.items()}
    assert ports == {"prefill-h100-80gb-tp4-0": ("8100", "8998"), "prefill-h100-80gb-tp4-1": ("8101", "8999")}
    router = entries["router"][0]
    named = [router[k + 1:k + 3] for k, word in enumerate(router) if word == "--prefill"]
    assert named == [["http://${PREFILL_H100_80GB_TP4_0_HOST}:8100", "8998"], ["http://${PREFILL_H100_80GB_TP4_1_HOST}:8101", "8999"]]


@pytest.mark.parametrize("machines", [2, 4])
def test_a_vllm_instance_whose_ranks_span_nodes_runs_on_a_ray_cluster_of_its_nodes(tmp_path, machines):
    """TP 8 x PP 2 on 8-GPU machines (a rank spans two nodes: vLLM needs Ray there): per instance,
    its first node starts the Ray head and vLLM on the Ray backend, the other node joins the head
    and blocks; one entry per node, every node of every instance."""
    pools = {"mixed": [("h100-80gb", Layout(8, 1, 1, 2), machines)]}
    entries = _entries(_files(tmp_path, "vllm", pools, model="llama3.1-405b", engine="vllm-fp8")["launch.sh"])
    workers = [f"worker-h100-80gb-tp8pp2-{k}" for k in range(machines // 2)]
    assert sorted(entries) == sorted([f"{w}-node{r}" for w in workers for r in range(2)] + ["router"])
    for k, w in enumerate(workers):
        head, other = entries[f"{w}-node0"], entries[f"{w}-node1"]
        assert head[0] == ["ray", "start", "--head", "--port", "6379"]
        assert head[1][:2] == ["vllm", "serve"] and head[1][-2:] == ["--distributed-executor-backend", "ray"]
        assert head[1][head[1].index("--pipeline-parallel-size") + 1] == "2"
        assert other == [["ray", "start", "--address", f"${{WORKER_H100_80GB_TP8PP2_{k}_HOST}}:6379", "--block"]]


def test_a_plan_priced_on_deepep_kernels_is_refused(tmp_path):
    """An engine profile timing the expert exchange by DeepEP's kernels (expert_all_to_all) priced a
    deployment whose engine flags export does not write: a plan of exchanging pools is refused (exit
    2, nothing written); dense or TP-only pools export as before."""
    profile = tmp_path / "deepep.yaml"
    shipped = yaml.safe_load((Path(__file__).resolve().parents[2] / "engine_profiles" / "sglang-fp8.yaml").read_text())
    profile.write_text(yaml.safe_dump({**shipped, "expert_all_to_all": "deepep"}))
    out = tmp_path / "out"
    result = runner.invoke(app, ["export", str(_plan(tmp_path, SPLIT, engine=str(profile))), "--to", "sglang", "--output", str(out)])
    assert result.exit_code == 2 and "expert_all_to_all" in result.stderr and not out.exists()
    tp_only = {"prompt": [("h200-141gb", Layout(8), 1)], "token": [("h200-141gb", Layout(8), 1)]}
    assert "launch.sh" in _files(tmp_path, "sglang", tp_only, engine=str(profile))
