"""End to end through the llama.h-style API (llama_init_from_model, llama_batch_get_one,
llama_decode, llama_get_logits_ith): greedy continuations of "The capital of France is"
equal llama.cpp's, up to the first step whose reference margin (best minus second logit)
is below 0.5. The issue's accuracy bar (margin 0.25, where llama.cpp itself may flip) is
test_logits.py's business; this test checks the API plumbing (autofilled positions, output
rows, the cache growing one token per call), which a mistake would break at once.

Token ids and continuations are llama.cpp's own (../shared/reference/*.logits.json, prompt 0).
"""

from __future__ import annotations

import numpy as np
import pytest

import pyllama.llama_api as L
from pyllama import _core

pytestmark = pytest.mark.skipif(not hasattr(_core, "Context"), reason="_core.Context (branch fwd) not built")

CASES = {
    # prompt tokens, llama.cpp's greedy tokens up to the first margin < 0.5
    "smollm2": ([504, 3575, 282, 4649, 314], [7042, 30, 198, 198, 504]),
    "gemma3": ([2, 818, 5279, 529, 7001, 563], [506, 5279, 529, 506]),
}


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_greedy_matches_llama_cpp(name, request):
    path = request.getfixturevalue(f"{name}_path")
    prompt, want = CASES[name]
    model = _core.Model([str(path)])
    p = L.llama_context_default_params()
    p.n_ctx = 256
    p.n_threads = p.n_threads_batch = 2
    ctx = L.llama_init_from_model(model, p)
    assert ctx is not None
    assert L.llama_decode(ctx, L.llama_batch_get_one(np.array(prompt, dtype=np.int32))) == 0
    got = []
    for _ in range(len(want)):
        tok = int(np.argmax(L.llama_get_logits_ith(ctx, -1)))
        got.append(tok)
        assert L.llama_decode(ctx, L.llama_batch_get_one([tok])) == 0
    assert got == want
    mem = L.llama_get_memory(ctx)
    assert L.llama_memory_seq_pos_max(mem, 0) == len(prompt) + len(want) - 1
