"""Batch invariance when several sequences decode together (a server's steps, llama-batched-
bench's TG phase): every matmul then runs over K = 1..16 tokens, through the multi-row,
packed (partial last group) and leftover-token kernels, none of which may change a bit of
any sequence's logits. Checked on the real models: SmolLM2 (Q4_1, Q8_0 output), Gemma 3
(Q5_0, Q8_0, Q4_K, Q6_K, the 262k-row Q8_0 output) and Qwen2.5-Coder (Q5_0, Q4_K, Q6_K)."""

from __future__ import annotations

import numpy as np
import pytest

from pyllama import _core
from pyllama.batch import batch_add, batch_init
from pyllama.context import Context

pytestmark = pytest.mark.skipif(not hasattr(_core, "Context"), reason="_core.Context not built")

N_SEQ = 10
N_PROMPT = 5
N_GEN = 6
# how many sequences advance in each step: every count from 1 to N_SEQ (the K of the
# matmuls: 1 -> multi-row kernels, 2..7 -> one partial packed group / leftover kernels,
# 8 -> one full group, 9, 10 -> a full group and a partial one)
STEPS = [10, 3, 7, 2, 9, 5, 1, 8, 4, 6, 10, 2, 7, 3, 9, 6, 5, 8, 4, 1]


def _tokens(n_vocab: int) -> np.ndarray:  # every model here has more than 30000 tokens
    rng = np.random.default_rng(22)
    return rng.integers(2, min(n_vocab, 30000), size=(N_SEQ, N_PROMPT + N_GEN)).astype(np.int32)


def _alone(model, toks: np.ndarray, n_gen: int) -> list[np.ndarray]:
    """Logits of each of the sequence's tokens after the prompt, decoding it alone, one token
    per step (the prompt in one batch)."""
    ctx = Context(model, n_ctx=256, n_threads=2, n_threads_batch=2)
    ctx.decode(toks[:N_PROMPT])
    out = [ctx.logits[-1].copy()]
    for t in toks[N_PROMPT:N_PROMPT + n_gen - 1]:
        ctx.decode([int(t)])
        out.append(ctx.logits[-1].copy())
    return out


@pytest.fixture(params=["smollm2", "gemma3", "qwen25"])
def real_model(request):
    return request.getfixturevalue(f"{request.param}_path")


def test_sequences_decoding_together_equal_each_alone(real_model):
    model = _core.Model([str(real_model)])
    toks = _tokens(30000)
    # the schedule: which sequences advance in each step, until each has N_GEN outputs
    done = [0] * N_SEQ  # outputs collected per sequence
    sched = []
    k = 0
    while min(done) < N_GEN:
        want = STEPS[k % len(STEPS)]
        k += 1
        seqs = [s for s in sorted(range(N_SEQ), key=lambda s: (done[s], s)) if done[s] < N_GEN][:want]
        sched.append(seqs)
        for s in seqs:
            done[s] += 1
    ctx = Context(model, n_ctx=N_SEQ * 64, n_seq_max=N_SEQ, n_threads=2, n_threads_batch=2)
    got: list[list[np.ndarray]] = [[] for _ in range(N_SEQ)]
    pos = [0] * N_SEQ
    for seqs in sched:
        b = batch_init(N_SEQ * N_PROMPT, 0, 1)
        rows = []
        for s in seqs:
            if pos[s] == 0:  # the sequence's prompt, output for its last token
                for i in range(N_PROMPT):
                    batch_add(b, int(toks[s, i]), i, [s], i == N_PROMPT - 1)
                pos[s] = N_PROMPT
            else:
                batch_add(b, int(toks[s, pos[s]]), pos[s], [s], True)
                pos[s] += 1
            rows.append(b.n_tokens - 1)
        ctx.decode(b)
        for s, r in zip(seqs, rows):
            got[s].append(ctx.logits_ith(r).copy())
    sizes = sorted({len(s) for s in sched})
    assert sizes[0] == 1 and sizes[-1] == N_SEQ, sizes
    for s in range(N_SEQ):
        ref = _alone(model, toks[s], N_GEN)
        for j, (a, b) in enumerate(zip(got[s], ref)):
            if not np.array_equal(a, b):
                bad = np.argwhere(a != b)
                raise AssertionError(f"{real_model.name}: sequence {s} output {j}: {len(bad)} logits differ, "
                                     f"max |diff| {np.abs(a - b).max():.3g}")
