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


def _ranks_schedule_alone(engine: str, layout: Layout) -> bool:
    """Whether each DP rank of `layout` takes the scheduler flags' values for itself (vLLM)."""
    return engine == "vllm" and layout.dp > 1


def rank_limits(engine: str, layout: Layout, dep) -> tuple[int, int | None]:
    """The token budget and sequence cap to give each instance of `layout`: the plan prices them
    per instance. SGLang takes them so and divides them over its DP attention ranks itself
    (`--chunked-prefill-size // dp`, `--max-running-requests // dp`: server_args and the
    scheduler); each vLLM DP rank is an engine core that schedules alone with the flags' values
    (docs: serving/data_parallel_deployment), so a DP layout gets the plan's values over its
    ranks (at least 1), never more in all than was priced. A vLLM rank's budget below its
    sequence cap fails to start (max_num_batched_tokens >= max_num_seqs): with no cap in the plan
    its ranks get their budget as the cap, what a chunked pass can carry."""
    seqs = dep.max_num_seqs
    if not _ranks_schedule_alone(engine, layout):
        return dep.max_batch_tokens, seqs
    per_rank = max(1, dep.max_batch_tokens // layout.dp)
    return per_rank, max(1, seqs // layout.dp) if seqs else per_rank


def setting_args(engine: str, dep, layout: Layout) -> list[str]:
    """The deployment's online weight quantization (where the checkpoint holds wider weights than
    planned), KV-cache precision, token budget and, where it has one, its sequence cap
    (`rank_limits`)."""
    args = ["--quantization", dep.quantization] if dep.quantization else []
    args += ["--kv-cache-dtype", "fp8" if engine == "vllm" else "fp8_e4m3"] if dep.engine.kv == "fp8" else []
    tokens, seqs = rank_limits(engine, layout, dep)
    return args + [BATCH_TOKENS_FLAG[engine], str(tokens)] + ([SEQS_FLAG[engine], str(seqs)] if seqs else [])


def setting_mapping(engine: str, dep) -> list[tuple[str, str]]:
    """The export's mapping rows of the token budget and sequence cap."""
    ranks = sorted({g.layout.dp for g in dep.groups if _ranks_schedule_alone(engine, g.layout)})
    per_rank = (f" per data-parallel rank: the plan's value over the ranks (DP {', '.join(map(str, ranks))}), each vLLM "
                "DP rank scheduling alone") if ranks else ""
    rows = [("inputs.max_batch_tokens", BATCH_TOKENS_FLAG[engine] + per_rank)]
    if dep.max_num_seqs:
        rows.append(("inputs.max_num_seqs", SEQS_FLAG[engine] + per_rank))
    elif ranks:
        rows.append(("inputs.max_num_seqs (none)", f"{SEQS_FLAG[engine]} of the data-parallel pools: their rank's budget, "
                                                   "as vLLM refuses a cap above it"))
    return rows


def model_args(engine: str, model_id: str) -> list[str]:
    return ["--model", model_id] if engine == "vllm" else ["--model-path", model_id, "--served-model-name", model_id]
