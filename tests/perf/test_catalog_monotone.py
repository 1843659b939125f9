"""Every shipped profile, model, GPU and candidate layout that fits: a bigger pass never takes less
time (more prompt tokens, more requests in a decode step, more context), from a token to a 16,384-
token prompt and from one request to 512 at up to 32,768 tokens of context, through the compiled
pass formula and every measured curve a profile names."""

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
    assert not found, f"{len(found)} passes faster when bigger, first: {found[:5]}"
