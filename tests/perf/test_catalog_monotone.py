"""Every shipped profile, model, GPU and candidate layout that fits: a bigger pass never takes less
time (more prompt tokens, more requests in a decode step, more context), from a token to a 16,384-
token prompt and from one request to 512 at up to 32,768 tokens of context, through the compiled
pass formula and every measured curve a profile names; and a pass of prompts and decode requests
together (chunked prefill, co-located) takes no less time with more context or more prompt tokens,
nor, without DP attention, with one more decode request or one more prompt of the pass's
root-mean-square size (a pass knows its prompts' sum and sum of squares, not the longest). Left
out: adding the first prompt to a decode step (it changes the pass's kind, and each kind's fitted
host overhead is its own), and one more request in a pass with DP attention, whose requests spread
over min(DP, requests) groups as the engines' balancing of their DP ranks is modelled: a request
more spreads a prompt over a group more (docs/accuracy.md, DP attention)."""

from __future__ import annotations

import numpy as np
import pytest

from splitplan.perf.points import candidate_layouts
from splitplan.perf.roofline import Instance
from splitplan.specs.catalog import catalog_names
from splitplan.specs.engine import load_engine
from splitplan.specs.hardware import load_hardware
from splitplan.specs.model import load_model

# powers of two and their neighbours: where kernels and routing change regime
TOKENS = np.unique([n + d for n in 2 ** np.arange(15) for d in (-1, 0, 1) if n + d >= 1] + [16384]).astype(float)
BATCHES = TOKENS[TOKENS <= 512]
CONTEXTS = np.array([1, 16, 128, 512, 1024, 2048, 4096, 8192, 16384, 32768], float)


def _decreases(times) -> bool:
    return bool((np.diff(np.asarray(times, float)) < -1e-12).any())


def _mixed_passes(count: int = 64):
    """Passes of 1-7 prompts (1-2,047 tokens each) beside 0-255 decode requests (1-8,191 tokens each)."""
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, 8, count).astype(float)
    sizes = rng.integers(1, 2048, (count, 7)) * (np.arange(7) < prompts[:, None])
    decode = rng.integers(0, 256, count).astype(float)
    return prompts, sizes.sum(1).astype(float), (sizes.astype(float) ** 2).sum(1), decode, decode * rng.integers(1, 8192, count)


MIXED = _mixed_passes()


def _mixed_decreases(inst) -> list[str]:
    """Which of the bigger mixed passes take less time than MIXED's."""
    prompts, tokens, squares, decode, context = MIXED
    rms = np.ceil(np.sqrt(squares / prompts))
    base = inst.pass_time_s(*MIXED)
    bigger = {"more context": (prompts, tokens, squares, decode, context + 100 * decode),
              "more prompt tokens": (prompts, tokens + 10 * prompts, squares + 20 * tokens + 100 * prompts, decode, context)}
    if inst.layout.dp == 1:
        bigger |= {"one more decode request": (prompts, tokens, squares, decode + 1, context + context / np.maximum(decode, 1) + 1),
                   "one more prompt of the root-mean-square size": (prompts + 1, tokens + rms, squares + rms**2, decode, context)}
    # (to 3e-5: an operator class that turns from compute- to memory-bound as the pass grows trades a
    # prefill pass's slower clock for its bandwidth; the sweep's one such case is 1.4 us of 42 ms)
    return [name for name, args in bigger.items() if (inst.pass_time_s(*args) < base * (1 - 1e-4)).any()]


@pytest.mark.parametrize("engine", catalog_names("engine_profiles"))
def test_no_bigger_pass_takes_less_time(engine):
    eng, found = load_engine(engine), []
    for model_name in catalog_names("model_specs"):
        model = load_model(model_name)
        for hw in map(load_hardware, catalog_names("hardware_specs")):
            for layout in candidate_layouts(model, hw, eng):
                inst = Instance(model, hw, eng, layout)
                if not inst.fit.fits:
                    continue
                where = f"{model_name} on {hw.name} at {layout}"
                if _decreases(inst.prefill_time_s(TOKENS)):
                    found.append(f"{where}: prefill by tokens")
                for context in CONTEXTS:
                    if _decreases(inst.decode_step_time_s(BATCHES, np.full_like(BATCHES, context))):
                        found.append(f"{where}: decode by batch at {context:.0f} tokens of context")
                for batch in (1.0, 16.0, 512.0):
                    if _decreases(inst.decode_step_time_s(np.full_like(CONTEXTS, batch), CONTEXTS)):
                        found.append(f"{where}: decode by context at batch {batch:.0f}")
                found += [f"{where}: a mixed pass with {what}" for what in _mixed_decreases(inst)]
    assert not found, f"{len(found)} passes faster when bigger, first: {found[:5]}"
