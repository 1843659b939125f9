"""LLM architectures, read from Hugging Face `config.json` keys.

A real `config.json` can be passed unchanged: keys splitplan does not use are
ignored, and a few GPT-style spellings (`n_layer`, `n_head`, `n_embd`, ...) are
mapped to the Llama-style names. The FFN is gated (SwiGLU, 3 matrices) when
`hidden_act` is a gated activation (silu/swish, the Llama default) and plain
(2 matrices, GELU as in BLOOM/GPT-3) otherwise; `ffn_gated` overrides.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from splitplan.base.errors import SpecError
from splitplan.base.inputs import excerpt
from splitplan.specs._load import load_spec, of_kind, read_entry, read_mapping
from splitplan.specs.catalog import catalog_names, is_path, per_catalog, pinned, resolve

_ALIASES = {
    "n_layer": "num_hidden_layers",
    "num_layers": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_embd": "hidden_size",
    "num_kv_heads": "num_key_value_heads",
    "n_inner": "intermediate_size",
    "ffn_hidden_size": "intermediate_size",
    "num_experts": "num_local_experts",
    "n_routed_experts": "num_local_experts",
}
_GATED_ACTS = {"silu", "swish", "swiglu", "geglu", "gelu_pytorch_tanh_gated"}

PosInt = Annotated[int, Field(ge=1, le=10_000_000)]


class MlaDims(NamedTuple):
    """Multi-head latent attention's widths (DeepSeek's config keys)."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


class ModelSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    name: str
    num_hidden_layers: Annotated[int, Field(ge=1, le=10_000)]
    hidden_size: PosInt
    num_attention_heads: Annotated[int, Field(ge=1, le=100_000)]
    num_key_value_heads: Annotated[int, Field(ge=1, le=100_000)] | None = None
    head_dim: Annotated[int, Field(ge=1, le=100_000)] | None = None
    intermediate_size: PosInt
    vocab_size: PosInt
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    ffn_gated: bool | None = None
    num_local_experts: Annotated[int, Field(ge=1, le=100_000)] = 1
    num_experts_per_tok: Annotated[int, Field(ge=1, le=100_000)] = 1
    max_position_embeddings: PosInt | None = None
    # DeepSeek-style MoE: expert FFN width, always-active shared experts, first dense layers
    moe_intermediate_size: PosInt | None = None
    n_shared_experts: Annotated[int, Field(ge=0, le=1_000)] = 0
    first_k_dense_replace: Annotated[int, Field(ge=0, le=10_000)] = 0
    interleave_moe_layer_step: Annotated[int, Field(ge=1, le=10_000)] = 1  # Llama 4: every k-th layer is MoE
    intermediate_size_mlp: PosInt | None = None  # Llama 4: the FFN width of its dense layers
    # Multi-head latent attention (DeepSeek-V2/V3): the KV cache holds one compressed latent
    # (kv_lora_rank) and one shared RoPE key (qk_rope_head_dim) per token and layer
    kv_lora_rank: PosInt | None = None
    q_lora_rank: PosInt | None = None
    qk_rope_head_dim: Annotated[int, Field(ge=0, le=100_000)] = 0
    qk_nope_head_dim: PosInt | None = None
    v_head_dim: PosInt | None = None
    # Sliding-window attention (gpt-oss): the layers `layer_types` names "sliding_attention" attend
    # to, and keep the KV of, the last `sliding_window` tokens only
    sliding_window: PosInt | None = None
    layer_types: tuple[str, ...] | None = None
    hf_repo: str | None = None  # (splitplan's key) the Hugging Face repository `splitplan export` serves
    hf_repo_weights: Literal["bf16", "fp8", "fp4"] = "bf16"  # (splitplan's key) the precision of that repository's weights

    @model_validator(mode="after")
    def _shapes(self) -> ModelSpec:
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) does not divide hidden_size "
                f"({self.hidden_size}); give head_dim explicitly if that is intended"
            )
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_key_value_heads ({self.kv_heads}) must divide num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_experts_per_tok > self.num_local_experts:
            raise ValueError("num_experts_per_tok exceeds num_local_experts")
        if self.kv_lora_rank is not None and (self.qk_nope_head_dim is None or self.v_head_dim is None):
            raise ValueError("an MLA model (kv_lora_rank) needs qk_nope_head_dim and v_head_dim")
        if self.first_k_dense_replace > self.num_hidden_layers:
            raise ValueError("first_k_dense_replace exceeds num_hidden_layers")
        if self.layer_types is not None and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types lists {len(self.layer_types)} layers, num_hidden_layers is {self.num_hidden_layers}")
        return self

    # Derived shapes -------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def mla(self) -> MlaDims:
        """An MLA model's dimensions (all given: checked when the spec is read)."""
        rank, nope, v = self.kv_lora_rank, self.qk_nope_head_dim, self.v_head_dim
        if rank is None or nope is None or v is None:
            raise ValueError(f"{self.name} has no multi-head latent attention")
        return MlaDims(rank, nope, self.qk_rope_head_dim, v)

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    def kv_heads_per_gpu(self, tp: int) -> int:
        """The KV heads one GPU of a `tp`-way layout holds: each its share, replicated where TP passes them."""
        return math.ceil(self.kv_heads / tp)

    @property
    def head_dim_eff(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def qk_head_dim(self) -> int:
        """Per-head width of queries and keys (MLA: the no-RoPE part plus the RoPE part)."""
        return self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim if self.is_mla else self.head_dim_eff

    @property
    def v_head_dim_eff(self) -> int:
        return self.mla.v_head_dim if self.is_mla else self.head_dim_eff

    @property
    def prefill_head_dim(self) -> float:
        """The mean of a head's query-key and value widths: causal prefill attention takes 2 x heads x
        this FLOPs per pair of tokens (MLA's prefill expands the latent to MHA heads of 192 and 128)."""
        return (self.qk_head_dim + self.v_head_dim_eff) / 2

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.qk_head_dim

    @property
    def kv_dim(self) -> int:
        """Keys plus values per token and layer, as attention reads them (MLA: decompressed per head)."""
        if self.is_mla:
            return self.num_attention_heads * (self.qk_head_dim + self.v_head_dim_eff) // 2
        return self.kv_heads * self.head_dim_eff

    @property
    def kv_cache_elements_per_layer(self) -> int:
        """Elements one token keeps in the KV cache per layer: keys and values of its KV heads, or
        (MLA) the compressed latent and the shared RoPE key."""
        return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim if self.is_mla else 2 * self.kv_dim

    @property
    def sliding_layers(self) -> int:
        """Layers whose attention (and KV) covers the last `sliding_window` tokens only."""
        return sum(t == "sliding_attention" for t in self.layer_types or ()) if self.sliding_window else 0

    def kv_bytes_per_request(self, tokens, bytes_per_element: float):
        """KV bytes of a request holding `tokens` tokens: every token in the full-attention layers,
        at most `sliding_window` of them in the sliding ones. (The planner and the simulator count
        every layer as full attention, an upper bound: see perf.roofline.)"""
        per_layer = self.kv_cache_elements_per_layer * bytes_per_element
        full = self.num_hidden_layers - self.sliding_layers
        return per_layer * (full * tokens + self.sliding_layers * np.minimum(tokens, self.sliding_window or 0))

    @property
    def gated(self) -> bool:
        return self.ffn_gated if self.ffn_gated is not None else self.hidden_act.lower() in _GATED_ACTS

    @property
    def ffn_matrices(self) -> int:
        return 3 if self.gated else 2

    @property
    def is_moe(self) -> bool:
        return self.num_local_experts > 1

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts (DeepSeek's first `first_k_dense_replace` are dense; in
        Llama 4 every `interleave_moe_layer_step`-th layer is MoE)."""
        return (self.num_hidden_layers - self.first_k_dense_replace) // self.interleave_moe_layer_step if self.is_moe else 0

    @property
    def dense_layers(self) -> int:
        return self.num_hidden_layers - self.moe_layers

    # Parameter counts (weights only; norms and biases are < 0.1 % and ignored) --
    @property
    def attn_params_per_layer(self) -> int:
        h, heads = self.hidden_size, self.num_attention_heads
        if not self.is_mla:
            return h * (2 * self.q_dim + 2 * self.kv_dim)
        q = h * self.q_dim if self.q_lora_rank is None else h * self.q_lora_rank + self.q_lora_rank * self.q_dim
        mla = self.mla
        kv = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        return q + kv + heads * mla.v_head_dim * h

    @property
    def dense_ffn_params(self) -> int:
        """The FFN of a dense layer."""
        return self.ffn_matrices * self.hidden_size * (self.intermediate_size_mlp or self.intermediate_size)

    @property
    def expert_params(self) -> int:
        """One expert's FFN (moe_intermediate_size wide where given); a dense layer's FFN otherwise."""
        return self.ffn_matrices * self.hidden_size * (self.moe_intermediate_size or self.intermediate_size)

    @property
    def routed_params(self) -> int:
        """All routed experts of all MoE layers (what expert parallelism spreads)."""
        return self.moe_layers * self.num_local_experts * self.expert_params

    @property
    def router_params_per_layer(self) -> int:
        return self.hidden_size * self.num_local_experts if self.is_moe else 0

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def _params(self, experts: int) -> int:
        moe = (experts + self.n_shared_experts) * self.expert_params + self.router_params_per_layer
        return (self.num_hidden_layers * self.attn_params_per_layer + self.dense_layers * self.dense_ffn_params
                + self.moe_layers * moe + self.embedding_params)

    @property
    def total_params(self) -> int:
        return self._params(self.num_local_experts)

    @property
    def active_params(self) -> int:
        """Parameters one token uses (the input embedding counted, as a lookup of its row)."""
        return self._params(self.num_experts_per_tok)

    def kv_bytes_per_token(self, bytes_per_element: float) -> float:
        return self.num_hidden_layers * self.kv_cache_elements_per_layer * bytes_per_element


def _canonical(data: dict[str, Any]) -> dict[str, Any]:
    out = dict(data)
    if isinstance(out.get("text_config"), dict):  # a multimodal config (Llama 4): plan its language model
        out = {**out, **out["text_config"]}
    if out.get("model_type") in ("llama4", "llama4_text"):  # every Llama 4 MoE layer has one shared expert
        out.setdefault("n_shared_experts", 1)
    for alias, key in _ALIASES.items():
        if alias in out and key not in out:
            out[key] = out[alias]
    return out


@per_catalog(maxsize=256)
def load_model(name_or_path: str) -> ModelSpec:
    held = pinned("model_specs", name_or_path)
    if held is not None:  # a spec a plan carries (as read: canonicalized below)
        path, raw = Path(held[1]), dict(held[0])
    else:
        path, raw = model_entry(name_or_path)
    text = raw.get("text_config")
    _consistent_keys(path, text if isinstance(text, dict) else raw)
    data = _canonical(raw)
    of_kind(ModelSpec, path, data, "model")
    _misspelt(path, data)
    return load_spec(ModelSpec, path, data)


def model_entry(name_or_path: str) -> tuple[Path, dict[str, Any]]:
    """The path and mapping of a model entry or config.json (named after its folder), as read."""
    if is_path(name_or_path):
        path = resolve("model_specs", name_or_path, "model")
        data = read_mapping(path)
        data.setdefault("name", path.stem if path.stem != "config" else path.parent.name or "config")
        return path, data
    return read_entry("model_specs", name_or_path, "model")


_MLA_KEYS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def _consistent_keys(path, data: dict) -> None:
    """Keys that only mean something together: multi-head latent attention's (some without the
    others would plan plain attention), and the expert count's names (two that disagree)."""
    given = [k for k in _MLA_KEYS if data.get(k) not in (None, 0)]
    if given and len(given) < len(_MLA_KEYS):
        missing = [k for k in _MLA_KEYS if k not in given]
        raise SpecError(f"{path}: multi-head latent attention needs {', '.join(_MLA_KEYS)}; it has {', '.join(given)} "
                        f"but not {', '.join(missing)}: add them (or remove the others for plain attention)")
    counts = {k: data[k] for k in _EXPERT_KEYS if data.get(k) is not None}
    if len(set(map(str, counts.values()))) > 1:
        raise SpecError(f"{path}: the expert count is given twice, differently ("
                        + ", ".join(f"{k}: {excerpt(v)}" for k, v in counts.items()) + "); keep one")


def _misspelt(path, data: dict) -> None:
    """Unknown keys are ignored (a real config.json has dozens), but one that looks
    like a key splitplan needs and lacks is a typo: say so."""
    import difflib

    fields = set(ModelSpec.model_fields) | set(_ALIASES)
    missing = [f for f, info in ModelSpec.model_fields.items() if info.is_required() and f not in data]
    for key in data:
        if key in fields:
            continue
        close = difflib.get_close_matches(key, missing, n=1, cutoff=0.8)
        if close:
            raise SpecError(f"{path}: unknown key '{key}'; did you mean '{close[0]}'?")


def model_catalog() -> list[ModelSpec]:
    return [load_model(n) for n in catalog_names("model_specs")]


def _model_key(name: str) -> str:
    """A model's name as a repository or catalog spells it, reduced to what tells models apart:
    meta-llama/Llama-3.1-8B-Instruct and llama3.1-8b are both llama318b."""
    import re
    base = re.sub(r"[-_]v\d+(\.\d+)*(?=$|[-_])", "", name.lower().rstrip("/").rsplit("/", 1)[-1])
    words = re.split(r"[-_.\s]+", base)
    kept = [w for w in words if w not in ("instruct", "hf", "chat", "it", "base", "fp8", "fp4", "bf16")]
    return re.sub(r"[^a-z0-9]", "", "".join(kept))


def catalog_name_of(recorded: str) -> str | None:
    """The catalog model a benchmark's model name means (a catalog name or a Hugging Face
    repository, its instruct/chat/-hf and precision suffixes aside), None where none or several do."""
    named = sorted({s.name for s in model_catalog()
                    if _model_key(recorded) in (_model_key(s.name), _model_key(s.hf_repo or s.name))})
    return named[0] if len(named) == 1 else None
