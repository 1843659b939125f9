"""Serving-engine profiles: what the software achieves on the hardware.

The chip's datasheet stays in `hardware_specs/`; everything the engine adds or
loses (achieved fractions of peak, launch and per-iteration overheads, collective
latency, memory reserved) lives here, so one profile predicts any GPU. A profile
may override factors for specific machine types (`hardware_overrides`) when
measurements show the engine behaves differently there; machines without an
override use the profile's defaults.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from splitplan.base.defaults import MAX_BATCH_TOKENS
from splitplan.base.errors import SpecError
from splitplan.base.inputs import excerpt
from splitplan.specs._load import load_named
from splitplan.specs.catalog import catalog_names, per_catalog
from splitplan.specs.hardware import KernelEngine, WeightPrecision

# The precisions weights and the KV cache may be stored in (--weights, --kv-cache).
KvPrecision = Literal["bf16", "fp8"]
WEIGHT_PRECISIONS: tuple[str, ...] = get_args(WeightPrecision)
KV_PRECISIONS: tuple[str, ...] = get_args(KvPrecision)

Frac = Annotated[float, Field(gt=0, le=1)]
Secs = Annotated[float, Field(ge=0, le=10)]


class EngineFactors(BaseModel):
    """The fitted or assumed factors. In `hardware_overrides` only the keys given
    replace the defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    compute_efficiency: Frac = 0.7
    attention_efficiency: Frac = 0.5
    memory_efficiency: Frac = 0.8
    gemm_half_tokens: Annotated[float, Field(ge=0, le=100_000)] = 0.0
    kernel_launch_s: Secs = 3e-6
    host_launch_s_per_layer: Secs = 0.0
    prefill_overhead_s: Secs = 0.0
    decode_overhead_s: Secs = 0.0
    sequence_overhead_s: Secs = 0.0
    prefill_sequence_overhead_s: Secs = 0.0
    # An engine whose all-reduces slow down past a pass size (eager 2023 vLLM: about 2k
    # tokens): traffic of tokens beyond `knee_tokens` in one pass moves (1 + knee_slowdown)
    # times slower. 0: no knee.
    knee_tokens: Annotated[float, Field(ge=0, le=1_000_000)] = 0.0
    knee_slowdown: Annotated[float, Field(ge=0, le=10)] = 0.0
    # The expert GEMMs of an MoE layer reach this fraction of what a dense GEMM of the same rows
    # reaches (`compute_efficiency`): a fused MoE kernel runs many small GEMMs, a few rows per
    # expert, padded to its tiles, the busiest expert setting the pace. 1: as dense.
    moe_efficiency: Frac = 1.0
    collective_latency_s: Secs = 10e-6
    link_efficiency: Frac = 0.8
    kv_transfer_latency_s: Secs = 5e-3


class EngineProfile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    description: str
    source: str
    dtype: Literal["bf16", "fp8"] = "bf16"  # activations, and weights and KV unless set below
    weights_dtype: WeightPrecision | None = None
    kv_dtype: KvPrecision | None = None
    memory_usable_fraction: Frac = 0.9
    activation_reserve_gb_per_gpu: Annotated[float, Field(ge=0, le=1000)] = 2.0
    layerwise_transfer_min_tokens: Annotated[int, Field(ge=0)] = 512
    kernels_per_layer: Annotated[int, Field(ge=1, le=1000)] = 8
    # `per_prompt`: attention is block-diagonal, causal cost sum(T_i^2) (flash/varlen
    # kernels). `packed`: the engine attends over the whole packed batch with a mask,
    # cost (sum T_i)^2 -- what the 2023 vLLM measurements show (8 x 512 tokens take as
    # long as one 4,096-token prompt).
    prefill_attention: Literal["per_prompt", "packed"] = "per_prompt"
    # The scheduler, set as the engine is (`scheduler_source`: which engine and version):
    # - `chunked` (vLLM v1, SGLang, TensorRT-LLM by default): each iteration carries every running
    #   decode (one token each) and, up to `max_num_batched_tokens` tokens in all, the head of the
    #   prompt queue, a prompt split across iterations when it does not fit;
    # - `prefill-priority` (Splitwise, 2023 vLLM): a queued prompt batch (at most
    #   `max_num_batched_tokens` prompt tokens, always one prompt at least) runs whole, and the
    #   decodes wait for it.
    # At most `max_num_seqs` requests run at once on an instance (the rest wait); None: no cap.
    # `--max-num-batched-tokens` and `--max-num-seqs` override them; unset, the budget is 2,048.
    # A profile that does not say is today's engine: chunked.
    scheduler: Literal["chunked", "prefill-priority"] = "chunked"
    max_num_batched_tokens: Annotated[int, Field(ge=16, le=1_000_000)] | None = None
    max_num_seqs: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    scheduler_source: str = ""
    # Async scheduling (on by default in vLLM by v0.15, vllm-project/vllm#27614; SGLang's overlap scheduler): the engine
    # schedules an instance's next iteration while the current one runs, so a request that arrives
    # then joins the iteration after the next (the CPU's scheduling overlaps the GPU's work).
    async_scheduling: bool = False
    # What the engine's API front end adds to every request before its scheduler sees it (HTTP,
    # tokenization, the hop to the engine process, streaming the first token back): seconds added
    # to TTFT and E2E. vLLM runs its API server in a process of its own.
    frontend_latency_s: Annotated[float, Field(ge=0, le=1)] = 0.0
    # The longest request (prompt + output tokens) the engine takes, as vLLM's and SGLang's
    # --max-model-len / --context-length; longer ones are refused. None: the model's context window
    # (max_position_embeddings), those engines' default.
    max_model_len: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    # Automatic prefix caching: each instance keeps computed prompt prefixes in the KV memory its
    # requests leave and skips them (vLLM's `enable_prefix_caching`, SGLang's radix cache, TensorRT-LLM's
    # `enable_block_reuse`: on by default in each). A prefix is reused in whole blocks of
    # `kv_block_tokens` (vLLM: 16, SGLang: a page of 1, TensorRT-LLM: 32). `--prefix-caching on|off`
    # overrides it; a trace that records no prefixes shares none either way.
    prefix_caching: bool = False
    kv_block_tokens: Annotated[int, Field(ge=1, le=4096)] = 16
    prefix_caching_source: str = ""
    # Whose measured kernels time this engine's GEMMs, attention and all-reduces where a GPU's
    # hardware spec carries their curves (`kernels:`, fitted by bench/fit_kernels.py): those
    # operators then take the curves' efficiencies and latencies in place of compute_efficiency,
    # gemm_half_tokens, attention_efficiency, the memory_efficiency of weight and KV reads and the
    # collective terms. None, or a GPU without them: the roofline with the factors below.
    kernel_curves: KernelEngine | None = None
    # The kernels of the expert exchange (EP, DP attention): "deepep" where the engine is set to
    # DeepEP's (vLLM --all2all-backend deepep_high_throughput / deepep_low_latency, SGLang
    # --moe-a2a-backend deepep), which the kernel curves then time (`all_to_all`: the low-latency
    # kernels for decode-only passes, the high-throughput ones for prefill); None: the engines'
    # default all-gather and reduce-scatter, timed by the roofline with the collective terms.
    expert_all_to_all: Literal["deepep"] | None = None
    defaults: EngineFactors = EngineFactors()
    hardware_overrides: dict[str, EngineFactors] = {}
    # Where each machine type's factors come from (a measurement, or "estimate: ..."), by machine name.
    efficiency_sources: dict[str, str] = {}
    fit: dict[str, Any] | None = None

    @field_validator("fit")
    @classmethod
    def _measured_errors(cls, fit: dict[str, Any] | None) -> dict[str, Any] | None:
        """`fit.error` and `fit.moe_error`, which plans read, as error_quantiles writes them: per
        band, `runs` or `stages` (counts) and per figure its quantiles `qNN` (finite %)."""
        for key in ("error", "moe_error"):
            bands = (fit or {}).get(key)
            if bands is None:
                continue
            if not isinstance(bands, dict):
                raise ValueError(f"fit.{key}: a mapping of load bands, each with its error quantiles; regenerate it as "
                                 "bench/deployment_errors.py or calibrate --bench writes it")
            for band, figures in bands.items():
                for name, value in (figures.items() if isinstance(figures, dict) else [("", None)]):
                    if not _error_figure(name, value):
                        raise ValueError(f"fit.{key}.{band}{'.' + str(name) if name else ''}: runs or stages (a count), "
                                         "or a figure's quantiles (q01: -12.5, ..., finite %); regenerate it as "
                                         "bench/deployment_errors.py or calibrate --bench writes it")
        return fit

    def batch_tokens(self, given: int | None = None) -> int:
        """The scheduler's token budget per iteration: `given` (the command line's), else the
        profile's, else MAX_BATCH_TOKENS."""
        return given or self.max_num_batched_tokens or MAX_BATCH_TOKENS

    def caches_prefixes(self, given: bool | None, routing: str = "jsq", kv_offload_gb: float = 0.0) -> bool:
        """Whether instances keep prefix caches: `given` (--prefix-caching), else the profile's.
        Prefix-aware routing and a host-memory tier need them: exit 2 otherwise."""
        on = self.prefix_caching if given is None else given
        if not on and (routing == "prefix-aware" or kv_offload_gb):
            raise SpecError(f"{'--routing prefix-aware' if routing == 'prefix-aware' else '--kv-offload-gb'} works on "
                            f"the engine's prefix caches, which are off ({self.name}): add --prefix-caching on")
        return on

    def error_key(self, moe: bool = False) -> str:
        """Which measured error a model's plans take: `moe_error` (measured on MoE deployments) for
        a MoE model where the profile has one, else `error`."""
        return "moe_error" if moe and (self.fit or {}).get("moe_error") else "error"

    def measured_error(self, moe: bool = False) -> tuple[dict, str]:
        """(`fit.<error_key>`, `fit.<error_key>_source`): the measured error a model's plans take."""
        fit, key = self.fit or {}, self.error_key(moe)
        return fit.get(key) or {}, fit.get(f"{key}_source", "")

    def latency_factors(self, confidence: float, moe: bool = False) -> dict[str, float]:
        """How many times the predicted latencies the measured ones reach at `confidence`, per SLO
        metric, from the profile's measured error (`measured_error`, for a MoE model when `moe`:
        per load band, quantiles `qNN` of the signed error predicted / measured - 1 of mean TTFT,
        TPOT and E2E, in %): the error at quantile 1 - confidence (interpolated), the worst band's
        of those with at least MIN_BAND_SAMPLES measurements (`stages` or `runs`), as a factor
        1 / (1 + error) (1 where the model over-predicts, or where it has no error of that metric).
        ITL, TBT and TPOT lines take TPOT's error; E2E lines, where no E2E error was measured, the
        larger of TTFT's and TPOT's factors. SpecError for a profile without a measured error."""
        error, _ = self.measured_error(moe)
        if not error:
            measured = ", ".join(e.name for e in engine_catalog() if (e.fit or {}).get("error")) or "none"
            raise SpecError(f"--confidence {confidence:g}: engine profile {self.name} carries no measured error (fit.error); "
                            f"plan at a confidence with one that does ({measured})")
        most = max(_samples(band) for band in error.values())
        if most < MIN_BAND_SAMPLES:
            raise SpecError(f"--confidence {confidence:g}: engine profile {self.name} measured its error (fit.error) on {most} "
                            f"run(s), too few for its quantiles: calibrate it on at least {MIN_BAND_SAMPLES} runs or load stages "
                            "(splitplan calibrate --bench), or plan without --confidence")
        ttft, tpot, e2e = (_worst_factor(error, f"{metric}_mean", confidence) for metric in ("ttft", "tpot", "e2e"))
        e2e = e2e or max(ttft or 1.0, tpot or 1.0)  # (no E2E measured: the larger of the two)
        tpot = tpot or 1.0
        return {"ttft": ttft or 1.0, "tbt": tpot, "itl": tpot, "tpot": tpot, "e2e": e2e}

    def moe_warning(self, model: str) -> str | None:
        """What a plan for MoE `model` should say of this profile's error on measured MoE
        deployments (`fit.moe_error`), where its median TTFT or TPOT is off by 10 % or more."""
        fit = self.fit or {}
        error = (fit.get("moe_error") or {}).get("all")
        if not error or not error.get("runs"):
            return None
        ttft, tpot = (error.get(figure, {}).get("q50") for figure in ("ttft_mean", "tpot_mean"))
        if ttft is None or tpot is None or max(abs(ttft), abs(tpot)) < 10:
            return None
        source = str(fit.get("moe_error_source", "")).split(":")[0]  # (the script and its date)
        return (f"{model} is a mixture-of-experts model: {self.name} predicted the mean TTFT of {error['runs']} measured MoE "
                f"deployments at a median {ttft:+.0f} % ({'optimistic' if ttft < 0 else 'pessimistic'}) and their mean TPOT at "
                f"{tpot:+.0f} % ({source}); --confidence (for example 0.9) sizes the plan for that error")

    def seqs_cap(self, given: int | None = None) -> int | None:
        """The most requests an instance runs at once: `given`, else the profile's (None: no cap)."""
        return given or self.max_num_seqs

    @property
    def chunked(self) -> bool:
        return self.scheduler == "chunked"

    def context_tokens(self, model) -> int | None:
        """The longest request this engine takes for `model` (None: no limit known)."""
        return self.max_model_len or model.max_position_embeddings

    def factors(self, hardware_name: str, tp: int, model_name: str | None = None) -> EngineFactors:
        """Defaults, then the machine type's overrides (key `HW`), then those for this
        TP degree on it (`HW/tpN`), then those for this model there (`HW/tpN/MODEL`)."""
        factors = self.defaults
        keys = [hardware_name, f"{hardware_name}/tp{tp}"] + ([f"{hardware_name}/tp{tp}/{model_name}"] if model_name else [])
        for key in keys:
            override = self.hardware_overrides.get(key)
            if override is not None:
                factors = factors.model_copy(update=override.model_dump(include=override.model_fields_set))
        return factors

    @property
    def bytes_per_element(self) -> float:
        """Activations."""
        return BYTES[self.dtype]

    @property
    def weights(self) -> str:
        return self.weights_dtype or self.dtype

    @property
    def kv(self) -> str:
        return self.kv_dtype or self.dtype

    @property
    def weight_bytes_per_element(self) -> float:
        return BYTES[self.weights]

    @property
    def kv_bytes_per_element(self) -> float:
        return BYTES[self.kv]


# Bytes per element. fp4 is NVFP4: 4-bit values with one fp8 scale per 16 (NVIDIA, "Introducing
# NVFP4", 2025-06), 0.5 + 1/16 bytes.
BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5625}
PRECISION_KEYS = {"weights": ("weights_dtype", WEIGHT_PRECISIONS), "kv": ("kv_dtype", KV_PRECISIONS)}


def engine_spec(engine: str, weights: str | None = None, kv: str | None = None) -> str:
    """`engine` with its weight and KV precisions set (`lean@weights=fp4,kv=fp8`): one string, so
    the choice travels with the engine's name through studies, workers and plan.json."""
    given = {k: v for k, v in (("weights", weights), ("kv", kv)) if v}
    if not given:
        return engine
    base, _, options = engine.partition("@")
    merged = dict(item.split("=", 1) for item in options.split(",") if "=" in item) | given
    return f"{base}@" + ",".join(f"{k}={v}" for k, v in sorted(merged.items()))


@per_catalog(maxsize=256)
def load_engine(name_or_path: str) -> EngineProfile:
    """A profile by name or path, with `@weights=...,kv=...` precisions applied (`engine_spec`)."""
    base, _, options = name_or_path.partition("@")
    profile = load_named(EngineProfile, "engine_profiles", base, "engine profile")[0]
    if not options:
        return profile
    update = {}
    for item in options.split(","):
        key, _, value = item.partition("=")
        field, allowed = PRECISION_KEYS.get(key, (None, ()))
        if field is None or value not in allowed:
            raise SpecError(f"engine '{excerpt(name_or_path)}': '{excerpt(item)}' is not a precision; give weights=bf16|fp8|fp4 "
                            "or kv=bf16|fp8 (--weights, --kv-cache)")
        if field in update:
            raise SpecError(f"engine '{excerpt(name_or_path)}': {key} is given twice; give each precision once")
        update[field] = value
    return profile.model_copy(update={**update, "name": name_or_path})


def engine_catalog() -> list[EngineProfile]:
    return [load_engine(n) for n in catalog_names("engine_profiles")]


def engine_to_yaml(profile: EngineProfile, header: str = "") -> str:
    """The profile as an `engine_profiles/` YAML file (round-trips through `load_engine`)."""
    import yaml

    def rounded(value):  # 4 significant digits: the fit is not more precise than that
        if isinstance(value, float):
            return float(f"{value:.4g}")
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items()}
        return value

    data = rounded(profile.model_dump(exclude={"name"} | ({"efficiency_sources"} if not profile.efficiency_sources else set()),
                                      exclude_none=True))
    # an override holds the keys it sets, no more (the others stay the defaults')
    data["hardware_overrides"] = {k: rounded(v.model_dump(exclude_unset=True)) for k, v in profile.hardware_overrides.items()}
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    return comment + yaml.safe_dump(data, sort_keys=False, width=120)


MIN_BAND_SAMPLES = 5  # a load band's measurements below which its quantiles are too few to size on (its runs count in `all`)
ERROR_LEVELS = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)  # the quantiles a measured error (fit.error) records


def error_quantiles(signed_pct) -> dict[str, float]:
    """One figure's measured error as `fit.error` records it: the quantiles (ERROR_LEVELS) of its
    signed error in % (predicted / measured - 1), keyed `q01`, `q05`, ..., to a tenth."""
    return {f"q{round(q * 100):02d}": round(float(np.quantile(signed_pct, q)), 1) for q in ERROR_LEVELS}


def _error_figure(name: Any, value: Any) -> bool:
    """Whether one entry of a measured-error band is as error_quantiles writes it."""
    if name in ("runs", "stages"):
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return (isinstance(value, dict) and bool(value) and all(
        re.fullmatch(r"q\d\d", str(k)) and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        for k, v in value.items()))


def _samples(band: dict) -> int:
    """How many measurements a band of `fit.error` holds (its `stages` or `runs`; enough where it does not say)."""
    return band.get("stages", band.get("runs", MIN_BAND_SAMPLES))


def _quantile(quantiles: dict[str, float], level: float) -> float:
    """The signed error (%) at `level` from quantiles keyed `q01`, `q05`, ... (linear between them,
    the nearest outside)."""
    levels, values = zip(*sorted((int(k[1:]) / 100, float(v)) for k, v in quantiles.items()), strict=True)
    return float(np.interp(level, levels, values))


def _worst_factor(error: dict, measured: str, confidence: float) -> float | None:
    """`latency_factors`' factor of one measured mean (None where no band measured it)."""
    errors = [_quantile(band[measured], 1 - confidence) for band in error.values()
              if measured in band and _samples(band) >= MIN_BAND_SAMPLES]
    if not errors:
        return None
    return 1 / (1 + min(errors) / 100) if min(errors) < 0 else 1.0
