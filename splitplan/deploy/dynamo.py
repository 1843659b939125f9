"""NVIDIA Dynamo: a DynamoGraphDeployment (nvidia.com/v1beta1) for Dynamo 1.6.1.

Built from the DGD templates ai-dynamo 1.6.1 ships (dynamo/profiler/templates/dgd/, vendored under
reference/dynamo-1.6.1/ with their Apache-2.0 license): its Frontend as it is, and per pool one
component copied from the template's worker of that role (prefill, decode, or the aggregated
worker) with the pool's replicas, GPUs per pod, `multinode.nodeCount` for instances over several
nodes, and the backend's model, parallel, disaggregation and setting flags in place of the
template's.
"""

from __future__ import annotations

import copy
from importlib import resources

import yaml

from splitplan.deploy import ROLE_NAMES, VERSIONS, Deployment, Export, common_mapping, storage_text
from splitplan.deploy.engines import model_args, parallel_args, pool_flags, setting_args, setting_mapping

# The template flags splitplan sets itself (each takes a value), removed before its own are added. A
# worker's role flags (--disaggregation-mode, the KV transfer backend or connector) are the
# template's own for that role, kept as they are: Dynamo's backends take them in their own form
# (dynamo.vllm's prefill and decode workers by --disaggregation-mode, not vLLM's kv_both connector).
_OURS = {"--model", "--model-path", "--served-model-name", "--tp", "--tp-size", "--tensor-parallel-size", "--dp",
         "--dp-size", "--data-parallel-size", "--ep", "--ep-size", "--pipeline-parallel-size", "--pp-size"}


def template(backend: str, split: bool) -> dict:
    """The vendored Dynamo 1.6.1 DGD template of `backend`, disaggregated or aggregated."""
    name = f"{backend}-{'disagg' if split else 'agg'}.yaml"
    return yaml.safe_load(resources.files("splitplan.deploy").joinpath("reference", "dynamo-1.6.1", name).read_text())


def role_flags(component: dict) -> list[str]:
    """A worker component's role flags with their values (--disaggregation-*, --kv-transfer-config)."""
    args = component["podTemplate"]["spec"]["containers"][0]["args"]
    return [f"{a} {args[k + 1]}" for k, a in enumerate(args[:-1]) if a.startswith("--disaggregation-") or a == "--kv-transfer-config"]


def _role_flags(doc: dict) -> str:
    return "; ".join(f"{c['name']}: {' '.join(role_flags(c))}" for c in doc["spec"]["components"] if c["type"] != "frontend")


def _strip(args: list[str]) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in _OURS:
            skip = True
        else:
            out.append(a)
    return out


def dynamo(dep: Deployment, backend: str, image: str | None, scaled: bool = False) -> Export:
    """The DGD of the deployment; `scaled`: each worker component with `scalingAdapter: {enabled:
    true}`, so an autoscaler (deploy.schedule's KEDA objects) sets its replicas through the
    DynamoGraphDeploymentScalingAdapter Dynamo 1.6.1 then creates."""
    doc = template(backend, dep.split)
    by_type = {c["type"]: c for c in doc["spec"]["components"]}
    components = [by_type["frontend"]]
    for g in dep.groups:
        c = copy.deepcopy(by_type[ROLE_NAMES[g.role]])  # (the templates' component types)
        where = f"{g.role} pool {g.hardware.name}:{g.layout.spec}"
        container = c["podTemplate"]["spec"]["containers"][0]
        container["args"] = (model_args(backend, dep.model_id) + parallel_args(backend, g.layout, where)
                             + setting_args(backend, dep, g.layout)
                             + _strip(container["args"]))
        del container["resources"]["limits"]["nvidia.com/gpu"]
        container["resources"]["limits"][g.hardware.kubernetes_gpu_resource] = str(g.gpus_per_node)
        # (the template's 2Gi, "increase this value for larger models": sized from the weights)
        container["resources"].setdefault("requests", {})["ephemeral-storage"] = dep.pod_requests(g)["ephemeral-storage"]
        cache_env, cache_mounts = dep.container_cache()
        if cache_env:
            container["env"] = container.get("env", []) + cache_env
            container["volumeMounts"] = container.get("volumeMounts", []) + cache_mounts
        c["podTemplate"]["spec"].update(dep.pod_spec(g))
        if image:
            container["image"] = image
        c["name"], c["replicas"] = g.name, g.instances
        if g.nodes_per_instance > 1:
            c["multinode"] = {"nodeCount": g.nodes_per_instance}
        if scaled:
            c["scalingAdapter"] = {"enabled": True}
        components.append(c)
    if image:
        components[0]["podTemplate"]["spec"]["containers"][0]["image"] = image
    doc["metadata"]["name"] = dep.name
    doc["spec"]["components"] = components
    mapping, unexpressed = common_mapping(dep, backend, kubernetes=True)
    mapping += [
        ("inputs.engine", f"the Dynamo {backend} backend (`python3 -m dynamo.{backend}`), KV cache {dep.engine.kv}"),
        ("pool layout", "the backend's parallel flags per component (" + pool_flags(backend, dep.groups) + ")"),
        ("pool instances", "components[].replicas; GPUs per pod in resources.limits (nvidia.com/gpu, or the hardware "
                           "file's kubernetes_gpu_resource); "
                           "instances over several nodes in multinode.nodeCount"),
        ("the model's weights", f"resources.requests.ephemeral-storage {dep.pod_requests(dep.groups[0])['ephemeral-storage']} "
                                "per pod: " + storage_text(dep)),
        *setting_mapping(backend, dep),
    ]
    if dep.split:
        mapping.append(("prompt/token pools", "prefill and decode components, each with its role's flags as the Dynamo "
                                              f"{backend}-disagg template gives them (" + _role_flags(doc) + ")"))
    text = yaml.safe_dump(doc, sort_keys=False, width=1000)
    return Export("dynamo", f"NVIDIA Dynamo {VERSIONS['dynamo']} (DynamoGraphDeployment nvidia.com/v1beta1, "
                  f"{backend} {VERSIONS[backend]})", {"dynamo.yaml": text}, mapping, unexpressed)
