"""llm-d: the model servers of a plan as Kubernetes manifests, in the shape llm-d 0.8's guides give
them (guides/pd-disaggregation and guides/wide-ep-lws of github.com/llm-d/llm-d), and values
that point llm-d's router chart at them.

Per pool, vLLM pods labelled for llm-d's router: `llm-d.ai/inference-serving`, `llm-d.ai/model`,
and `llm-d.ai/role` prefill or decode (co-located pods carry no role; the router's decode filter
takes pods without one). Decode pods run llm-d's routing sidecar in front of vLLM (the sidecar on
port 8000, vLLM on 8200), as the guides' decode pods do; prefill and decode exchange KV over NIXL.

An instance on one machine is one pod of its GPUs: a Deployment with one replica per instance.
An instance over several machines is a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) of that many
pods per group, one group per instance: with vLLM's data parallelism over the nodes when each
node holds whole ranks (`--data-parallel-hybrid-lb`, as the wide-EP guide runs DeepSeek), else
a Ray cluster over the group with vLLM on the leader.
"""

from __future__ import annotations

import yaml

from splitplan.deploy import (
    CPUS_PER_GPU,
    MEMORY_GIB_PER_GPU,
    VERSIONS,
    Deployment,
    Expand,
    Export,
    common_mapping,
    shell_words,
    storage_text,
)
from splitplan.deploy.engines import dp_ranks_per_node, parallel_args, pool_flags, role_args, setting_args, setting_mapping

SIDECAR_IMAGE = f"ghcr.io/llm-d/llm-d-router-disagg-sidecar:v{VERSIONS['llm-d']}"
IMAGE = f"vllm/vllm-openai:v{VERSIONS['vllm']}"
PORT = 8000  # what the router reaches on every serving pod (the sidecar's port on decode pods)
BEHIND_SIDECAR_PORT = 8200  # vLLM's port on decode pods (the sidecar's default target)
NIXL_PORT = 5600
LWS_API = "leaderworkerset.x-k8s.io/v1"
ROLE_LABELS = {"prompt": "prefill", "token": "decode"}  # mixed: no role label


def _labels(dep: Deployment, g, serving: bool) -> dict:
    labels = {"app.kubernetes.io/instance": g.name, "llm-d.ai/model": dep.name}
    if serving:
        labels["llm-d.ai/inference-serving"] = "true"
        if g.role in ROLE_LABELS:
            labels["llm-d.ai/role"] = ROLE_LABELS[g.role]
    return labels


def _serve(dep: Deployment, g, port: int) -> list[str]:
    where = f"{g.role} pool {g.hardware.name}:{g.layout.spec}"
    return (["vllm", "serve", dep.model_id, *parallel_args("vllm", g.layout, where), *role_args("vllm", g.role),
             *setting_args("vllm", dep, g.layout), "--port", str(port)])


def _container(dep: Deployment, g, image: str, name: str, script: str, serving_port: int | None) -> dict:
    """A vLLM (or Ray worker) container of `g.gpus_per_node` GPUs; `serving_port` for one that serves."""
    env = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "llm-d-hf-token", "key": "HF_TOKEN", "optional": True}}}]
    if dep.split:
        env.append({"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    cache_env, cache_mounts = dep.container_cache()
    gpus = {g.hardware.kubernetes_gpu_resource: str(g.gpus_per_node)}
    c = {"name": name, "image": image, "command": ["/bin/bash", "-c"], "args": [script], "env": env + cache_env,
         "resources": {"limits": dict(gpus), "requests": {**dep.pod_requests(g), **gpus}},
         "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}] + cache_mounts}
    if serving_port is not None:
        c["ports"] = [{"name": "modelserver", "containerPort": serving_port, "protocol": "TCP"}] + (
            [{"name": "nixl", "containerPort": NIXL_PORT, "protocol": "TCP"}] if dep.split else [])
        # weights load for minutes (an hour at most here); then ready once the model is listed
        c["startupProbe"] = {"httpGet": {"path": "/health", "port": "modelserver"}, "periodSeconds": 30, "failureThreshold": 120}
        c["readinessProbe"] = {"httpGet": {"path": "/v1/models", "port": "modelserver"}, "periodSeconds": 10}
        c["livenessProbe"] = {"httpGet": {"path": "/health", "port": "modelserver"}, "periodSeconds": 30}
    return c


def _sidecar() -> dict:
    """llm-d's routing sidecar (a native sidecar: an init container that keeps running), as its
    recipe guides/recipes/modelserver/base/single-host/pd/vllm/patch-sidecar.yaml starts it."""
    return {"name": "routing-proxy", "image": SIDECAR_IMAGE, "restartPolicy": "Always",
            "args": [f"--port={PORT}", "--kv-connector=nixlv2", "--secure-serving=false", "--zap-log-level=1"],
            "ports": [{"name": "sidecar", "containerPort": PORT, "protocol": "TCP"}],
            "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True}}


def _beside(dep: Deployment, g) -> dict:
    """On machines shared with the other role: a preferred pod affinity to that pool's pods on the
    same node (kubernetes.io/hostname), so that the scheduler packs them as the plan does."""
    others = [o for o in dep.groups if o.shared is not None and o.shared == g.shared and o is not g]
    if not others:
        return {}
    term = {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {
        "matchLabels": {"app.kubernetes.io/instance": others[0].name}}}}
    return {"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}}


def _pod(dep: Deployment, g, container: dict, serving: bool) -> dict:
    placement = {**dep.pod_spec(g), **_beside(dep, g)}
    spec = {"serviceAccountName": dep.name, "containers": [container], **placement,
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}] + placement.get("volumes", [])}
    if serving and g.role == "token":
        spec["initContainers"] = [_sidecar()]
    return {"metadata": {"labels": _labels(dep, g, serving)}, "spec": spec}


def _workload(dep: Deployment, g, image: str) -> dict:
    """The pods of one pool (LWS sets LWS_LEADER_ADDRESS, LWS_WORKER_INDEX and LWS_GROUP_SIZE in
    every pod of a group)."""
    port = BEHIND_SIDECAR_PORT if g.role == "token" else PORT
    serve = _serve(dep, g, port)

    def serving(script: str) -> dict:
        return _pod(dep, g, _container(dep, g, image, "modelserver", script, port), True)

    meta = {"name": g.name, "labels": _labels(dep, g, False)}
    if g.nodes_per_instance == 1:
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                "spec": {"replicas": g.instances, "selector": {"matchLabels": {"app.kubernetes.io/instance": g.name}},
                         "template": serving("exec " + shell_words(serve))}}
    group: dict = {"size": g.nodes_per_instance}
    ranks = dp_ranks_per_node(g.layout, g.gpus_per_node)
    if ranks:  # every pod serves its node's ranks
        serve += ["--data-parallel-hybrid-lb", "--data-parallel-size-local", str(ranks),
                  "--data-parallel-address", Expand("$LWS_LEADER_ADDRESS"), "--data-parallel-rpc-port", "5555",
                  "--data-parallel-start-rank", Expand(f"$((LWS_WORKER_INDEX*{ranks}))")]
        group["workerTemplate"] = serving("exec " + shell_words(serve))
    else:  # a Ray cluster over the group; the leader serves once every pod has joined
        group["leaderTemplate"] = serving("\n".join([
            "set -e", "ray start --head --port=6379",
            "until [ \"$(python3 -c 'import ray; ray.init(address=\"auto\"); print(sum(n[\"Alive\"] for n in ray.nodes()))')\""
            " = \"$LWS_GROUP_SIZE\" ]; do sleep 5; done",
            "exec " + shell_words([*serve, "--distributed-executor-backend", "ray"])]))
        worker = "exec ray start --address=$LWS_LEADER_ADDRESS:6379 --block"
        group["workerTemplate"] = _pod(dep, g, _container(dep, g, image, "ray-worker", worker, None), False)
    return {"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": meta,
            "spec": {"replicas": g.instances, "leaderWorkerTemplate": group}}


def llmd(dep: Deployment, image: str | None) -> Export:
    image = image or IMAGE
    docs = [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": dep.name}}]
    docs += [_workload(dep, g, image) for g in dep.groups]
    manifests = yaml.safe_dump_all(docs, sort_keys=False, width=1000)
    guide_values = ["guides/recipes/router/base.values.yaml"] + (
        ["guides/pd-disaggregation/router/pd-disaggregation.values.yaml"] if dep.split else [])
    values = (f"# llm-d {VERSIONS['llm-d']} router chart values: layer after the guide's own, e.g.\n"
              f"#   {' '.join(f'-f {v}' for v in guide_values)} -f router.values.yaml\n"
              "# Selects this plan's pods (and drops the guide's own pod selector).\n"
              + yaml.safe_dump({"router": {"modelServers": {"matchLabels": {"llm-d.ai/guide": None,
                                                                             "llm-d.ai/model": dep.name}}}},
                               sort_keys=False))
    apply = "\n".join([
        f"git clone --branch v{VERSIONS['llm-d']} https://github.com/llm-d/llm-d.git  # the router values above",
        "kubectl create namespace NS",
        "kubectl create secret generic llm-d-hf-token --from-literal=HF_TOKEN=... -n NS  # for gated models",
        "kubectl apply -n NS -f llm-d.yaml  # LeaderWorkerSets need the LWS controller (sigs.k8s.io/lws)",
        f"helm install {dep.name} oci://ghcr.io/llm-d/charts/llm-d-router-standalone -n NS \\",
        *(f"    -f llm-d/{v} \\" for v in guide_values),
        "    -f router.values.yaml"])
    mapping, unexpressed = common_mapping(dep, "vllm", kubernetes=True)
    mapping += [
        ("pool layout", "each pool's vLLM parallel flags (" + pool_flags("vllm", dep.groups) + ")"),
        ("pool instances", "Deployment replicas, one pod of the instance's GPUs each; an instance over several "
                           "nodes: LeaderWorkerSet replicas with size = its nodes"),
        ("inputs.engine", f"KV cache {dep.engine.kv}"),
        ("pod requests", f"{CPUS_PER_GPU} CPUs and {MEMORY_GIB_PER_GPU} Gi of memory per GPU (as llm-d's P/D guide requests "
                         "for its decode pods), and ephemeral-storage for " + storage_text(dep)),
        *setting_mapping("vllm", dep),
        ("prompt/token pools" if dep.split else "mixed pool",
         "pods labelled llm-d.ai/role prefill and decode, KV over NIXL, llm-d's routing sidecar on decode pods"
         if dep.split else "pods without llm-d.ai/role (the router's decode filter takes them for both phases)"),
        ("inputs.model", f"router.values.yaml: the router selects pods labelled llm-d.ai/model={dep.name} "
                         + ("with the P/D guide's scheduling" if dep.split else "with llm-d's default scheduling")),
    ]
    return Export("llm-d", f"llm-d {VERSIONS['llm-d']} (routing sidecar {SIDECAR_IMAGE}, router chart "
                  f"llm-d-router-standalone) with vLLM {VERSIONS['vllm']} (image {image})",
                  {"llm-d.yaml": manifests, "router.values.yaml": values}, mapping, unexpressed, apply)
