"""Engine flags for a layout, a role and the plan's settings (vLLM 0.31, SGLang 0.5.21: the
versions Dynamo 1.6.1 pins). Each flag is one the engine defines under that name, not an
abbreviation: bench/export_flags.py checks them against SGLang's parser and vLLM's argument
definitions of those versions."""

from __future__ import annotations

import json

from splitplan.base.errors import SpecError
from splitplan.specs.layout import Layout

VLLM_KV_CONNECTOR = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
BATCH_TOKENS_FLAG = {"vllm": "--max-num-batched-tokens", "sglang": "--chunked-prefill-size"}  # the prefill batch cap
SEQS_FLAG = {"vllm": "--max-num-seqs", "sglang": "--max-running-requests"}  # requests running at once


def parallel_args(engine: str, layout: Layout, where: str) -> list[str]:
    """The parallel flags of one instance. vLLM spreads experts over all TP x DP GPUs when expert
    parallel (EP = TP x DP) or over none; SGLang takes its TP as the instance's GPUs per stage,
    DP attention over `dp` groups and EP over `ep` of them."""
    tp, dp, ep, pp = layout
    if engine == "vllm":
        if ep not in (1, tp * dp):
            raise SpecError(f"{where}: vLLM cannot run {layout}: its expert parallelism spans all TP x DP = {tp * dp} GPUs "
                            f"(EP {tp * dp}) or none (EP 1)")
        args = ["--tensor-parallel-size", str(tp)]
        args += ["--pipeline-parallel-size", str(pp)] if pp > 1 else []
        args += ["--data-parallel-size", str(dp)] if dp > 1 else []
        return args + (["--enable-expert-parallel"] if ep > 1 else [])
    args = ["--tp-size", str(tp * dp)]
    args += ["--pp-size", str(pp)] if pp > 1 else []
    args += ["--dp-size", str(dp), "--enable-dp-attention"] if dp > 1 else []
    return args + (["--ep-size", str(ep)] if ep > 1 else [])


def pool_flags(engine: str, groups) -> str:
    """Each pool's parallel flags, for an export's mapping: `NAME: FLAGS, ...`."""
    return ", ".join(f"{g.name}: {' '.join(parallel_args(engine, g.layout, g.name))}" for g in groups)


def dp_ranks_per_node(layout: Layout, gpus_per_node: int) -> int:
    """The data-parallel ranks each node of a multi-node vLLM instance holds when every node holds
    whole ranks (vLLM runs data parallelism over nodes itself), else 0: a rank spans nodes, and
    vLLM needs a Ray cluster over them."""
    ranks, rest = divmod(gpus_per_node, layout.tp * layout.pp)
    return ranks if rest == 0 else 0


def role_args(engine: str, role: str) -> list[str]:
    """Disaggregation flags: NIXL KV transfer between prefill and decode workers."""
    if role == "mixed":
        return []
    if engine == "vllm":
        return ["--kv-transfer-config", json.dumps(VLLM_KV_CONNECTOR, separators=(",", ":"))]
    return ["--disaggregation-mode", "prefill" if role == "prompt" else "decode", "--disaggregation-transfer-backend", "nixl"]


def setting_args(engine: str, dep) -> list[str]:
    """The deployment's online weight quantization (where the checkpoint holds wider weights than
    planned), KV-cache precision, token budget and, where it has one, its sequence cap."""
    args = ["--quantization", dep.quantization] if dep.quantization else []
    args += ["--kv-cache-dtype", "fp8" if engine == "vllm" else "fp8_e4m3"] if dep.engine.kv == "fp8" else []
    return (args + [BATCH_TOKENS_FLAG[engine], str(dep.max_batch_tokens)]
            + ([SEQS_FLAG[engine], str(dep.max_num_seqs)] if dep.max_num_seqs else []))


def model_args(engine: str, model_id: str) -> list[str]:
    return ["--model", model_id] if engine == "vllm" else ["--model-path", model_id, "--served-model-name", model_id]
