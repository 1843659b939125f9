"""vLLM and SGLang without an orchestrator: the launch command of every worker and the router, as a
shell script (`launch.sh WORKER` on the machine that runs it) and a docker-compose file (one
service per worker and node: `docker compose up SERVICE` on that machine).

Workers are numbered per pool (`prefill-h100-80gb-tp8-0`, ...). A worker over several nodes gets
one entry per node: SGLang's `--nnodes/--node-rank/--dist-init-addr` on each; vLLM's data-parallel
ranks over nodes (`--data-parallel-size-local`, `--data-parallel-address`, `--headless` on the
others) when every node holds whole ranks, else a Ray cluster (`--distributed-executor-backend
ray`). Each worker's address is a variable (`${PREFILL_H100_80GB_TP8_0_HOST}`, set it to the
machine's address); the router reaches every worker there. Routers: vllm-router 0.1.17 and
sglang-router 0.3.2 (PyPI), prefill/decode-aware.
"""

from __future__ import annotations

import re
import shlex

import yaml

from splitplan.base import limits
from splitplan.base.errors import SpecError
from splitplan.base.inputs import printable
from splitplan.deploy import VERSIONS, Deployment, Expand, Export, Group, common_mapping, shell_words
from splitplan.deploy.engines import (
    dp_ranks_per_node,
    model_args,
    parallel_args,
    pool_flags,
    role_args,
    setting_args,
    setting_mapping,
)

PORT = 8100  # a worker's HTTP port (the router listens on 8000)
IMAGES = {"vllm": f"vllm/vllm-openai:v{VERSIONS['vllm']}", "sglang": f"lmsysorg/sglang:v{VERSIONS['sglang']}"}
ROUTERS = {"vllm": "vllm-router 0.1.17", "sglang": "sglang-router 0.3.2"}
SGLANG_BOOTSTRAP_PORT = 8998  # SGLang's default disaggregation bootstrap port


def _host_var(worker: str) -> str:
    return re.sub(r"[^A-Z0-9]+", "_", worker.upper()) + "_HOST"


def _node_commands(engine: str, dep: Deployment, g: Group, worker: str, slot: int) -> list[list[list[str]]]:
    """Per node of one worker, the commands it runs in order (one, or a Ray node's start and then
    vLLM on the head); `slot` numbers the workers that share a machine (their GPUs, HTTP port and
    bootstrap port)."""
    base = (model_args(engine, dep.model_id) + parallel_args(engine, g.layout, f"{g.role} pool {g.hardware.name}")
            + role_args(engine, g.role) + setting_args(engine, dep, g.layout))
    head = f"${{{_host_var(worker)}}}"  # (a name of [A-Z0-9_]: the worker's name is a slug)
    nodes = g.nodes_per_instance
    if engine == "sglang":
        cmd = ["python3", "-m", "sglang.launch_server", *base, "--host", "0.0.0.0", "--port", str(PORT + slot)]
        if g.role != "mixed":
            cmd += ["--disaggregation-bootstrap-port", str(SGLANG_BOOTSTRAP_PORT + slot)]
        if nodes == 1:
            return [[cmd]]
        return [[cmd + ["--nnodes", str(nodes), "--node-rank", str(r), "--dist-init-addr", Expand(f"{head}:5000")]]
                for r in range(nodes)]
    cmd = ["vllm", "serve", dep.model_id, *base[2:], "--host", "0.0.0.0", "--port", str(PORT + slot)]  # (the model first, not --model)
    if nodes == 1:
        return [[cmd]]
    ranks_per_node = dp_ranks_per_node(g.layout, g.gpus_per_node)
    if ranks_per_node:
        dp = ["--data-parallel-size-local", str(ranks_per_node), "--data-parallel-address", Expand(head),
              "--data-parallel-rpc-port", "13345"]
        return [[cmd + dp]] + [[cmd + dp + ["--headless", "--data-parallel-start-rank", str(r * ranks_per_node)]]
                               for r in range(1, nodes)]
    return [[["ray", "start", "--head", "--port", "6379"], cmd + ["--distributed-executor-backend", "ray"]],
            *([["ray", "start", "--address", Expand(f"{head}:6379"), "--block"]] for _ in range(1, nodes))]


def _router(engine: str, dep: Deployment, workers: dict) -> list[str]:
    urls = {role: [(Expand(f"http://${{{_host_var(w)}}}:{PORT + slot}"), slot) for w, (g, slot) in workers.items() if g.role == role]
            for role in ("prompt", "token", "mixed")}
    if not dep.split:
        head = ["vllm-router"] if engine == "vllm" else ["python3", "-m", "sglang_router.launch_router"]
        return head + ["--worker-urls", *(u for u, _ in urls["mixed"]), "--host", "0.0.0.0", "--port", "8000"]
    if engine == "vllm":
        cmd = ["vllm-router", "--vllm-pd-disaggregation"]
        cmd += [x for u, _ in urls["prompt"] for x in ("--prefill", u)]
    else:
        cmd = ["python3", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
        cmd += [x for u, slot in urls["prompt"] for x in ("--prefill", u, str(SGLANG_BOOTSTRAP_PORT + slot))]
    return cmd + [x for u, _ in urls["token"] for x in ("--decode", u)] + ["--host", "0.0.0.0", "--port", "8000"]


def _compose_command(cmds: list[list[str]]) -> list[str]:
    """A compose service's entrypoint (in place of the image's: vllm/vllm-openai's is `vllm serve`):
    one command as its argument list (no shell; compose expands the host variables, a literal `$`
    is `$$`), several as one `bash -c` line of quoted words."""
    if len(cmds) == 1:
        return [str(w) if isinstance(w, Expand) else w.replace("$", "$$") for w in cmds[0]]
    return ["bash", "-c", " && ".join(shell_words(c, compose=True) for c in cmds)]


def _entries(engine: str, dep: Deployment, workers: dict) -> dict[str, tuple]:
    """Entry name -> (its commands, its GPU ids, its worker): one per worker and node of it."""
    entries: dict[str, tuple] = {}
    for worker, (g, slot) in workers.items():
        nodes = _node_commands(engine, dep, g, worker, slot)
        first = g.first_gpu + (slot - g.first_slot) * g.gpus_per_node
        gpus = [str(k) for k in range(first, first + g.gpus_per_node)]
        for r, cmds in enumerate(nodes):
            entries[worker if len(nodes) == 1 else f"{worker}-node{r}"] = (cmds, gpus, worker)
    return entries


def _script(engine: str, dep: Deployment, entries: dict[str, tuple], router: list) -> list[str]:
    """launch.sh's lines: a case per entry (its GPUs, its commands) and the router's."""
    script = ["#!/usr/bin/env bash",
              f"# splitplan export --to {engine}: {dep.model_id}, written for {engine} {VERSIONS[engine]} and {ROUTERS[engine]}.",
              f"# Plan: {printable(dep.source)}. Run `./launch.sh NAME` on the machine of each entry below, and `./launch.sh router`.",
              "# Set each *_HOST variable to that worker's (first) machine address first.",
              "set -euo pipefail", "", 'case "${1:-}" in']
    for name, (cmds, gpus, worker) in entries.items():
        script.append(f"  {shlex.quote(name)})  # GPUs {','.join(gpus)} of its machine; worker {worker}")
        script.append(f"    export CUDA_VISIBLE_DEVICES={','.join(gpus)}")
        script += [f"    {shell_words(c)}" for c in cmds]
        script.append("    ;;")
    return script + ["  router)", f"    {shell_words(router)}", "    ;;",
                     "  *)", f"    echo \"usage: $0 {{{'|'.join([*entries, 'router'])}}}\" >&2", "    exit 2", "    ;;", "esac", ""]


def launch(dep: Deployment, engine: str, image: str | None) -> Export:
    # worker -> (its pool, its slot on a machine shared with the pool's other workers)
    count = sum(g.instances for g in dep.groups)
    if count > limits.MAX_LAUNCH_WORKERS:
        raise SpecError(f"{printable(dep.source)}: {count:,} workers; launch.sh lists each (at most {limits.MAX_LAUNCH_WORKERS:,}): "
                        "export to dynamo or llm-d, which count replicas")
    workers = {f"{g.name}-{i}": (g, g.first_slot + i % g.instances_per_machine)
               for g in dep.groups for i in range(g.instances)}
    entries = _entries(engine, dep, workers)
    router = _router(engine, dep, workers)
    image = image or IMAGES[engine]
    script = _script(engine, dep, entries, router)
    services = {}
    for name, (cmds, gpus, _) in entries.items():
        services[name] = {"image": image, "network_mode": "host", "ipc": "host",
                          "entrypoint": _compose_command(cmds),
                          "environment": ["HF_TOKEN"],
                          "deploy": {"resources": {"reservations": {"devices": [
                              {"driver": "nvidia", "device_ids": gpus, "capabilities": ["gpu"]}]}}}}
    services["router"] = {"image": image, "network_mode": "host", "entrypoint": _compose_command([router])}
    compose = yaml.safe_dump({"services": services}, sort_keys=False, width=1000)
    mapping, unexpressed = common_mapping(dep, engine)
    mapping += [
        ("pool layout", "each worker's parallel flags (" + pool_flags(engine, dep.groups) + ")"),
        ("pool instances", "one launch.sh entry and compose service per worker and node"),
        ("inputs.engine", f"KV cache {dep.engine.kv}"),
        *setting_mapping(engine, dep),
        ("prompt/token pools" if dep.split else "mixed pool", f"the {ROUTERS[engine]} command"
         + (" in prefill/decode mode, KV over NIXL" if dep.split else "")),
    ]
    unexpressed.append("machine addresses: the *_HOST variables; a plan does not know the hosts")
    return Export(engine, f"{engine} {VERSIONS[engine]} with {ROUTERS[engine]} (docker image {image})",
                  {"launch.sh": "\n".join(script), "docker-compose.yaml": compose}, mapping, unexpressed)
