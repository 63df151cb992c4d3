"""Determinism, which llama.cpp does not offer (ggml-org/llama.cpp#4479, #7052): the logits
of a sequence are bit-identical whatever n_ubatch, n_batch and n_threads are, and whatever
other sequences share the batch or the cache. Checked on the tiny llama, gemma3
(sliding window 64, so the 100-token prompt crosses it), smollm3 (a NoPE layer),
olmo2 (post-norms only, whole-projection q/k norms), granite (embedding, residual and
logit scales; FFN biases), starcoder2 (LayerNorm, biases, GELU FFN), exaone4 (post-norms, per-head q/k norms), glm4
(pre- and post-norms, partial rope, fused gate+up), the MoE architectures llama4, phimoe,
granitemoe, glm4moe, gpt-oss (attention sinks), deepseek2 and mistral4 (MLA), cohere2
(parallel block, sliding window), gemma4 (two head sizes, KV sharing, per-layer
embeddings, experts), the recurrent mamba2, mamba, falcon-mamba, rwkv6, rwkv7, arwkv7 and
the hybrids lfm2, lfm2moe, qwen35, qwen35moe, qwen3next, falcon-h1 and granitehybrid
(recurrent states per sequence beside the KV cache), and on SmolLM2."""

from __future__ import annotations

import numpy as np
import pytest

from pyllama import _core
from pyllama.batch import batch_add, batch_init
from pyllama.context import Context

pytestmark = pytest.mark.skipif(not hasattr(_core, "Context"), reason="_core.Context (branch fwd) not built")

PROMPT = np.random.default_rng(3).integers(2, 2048, size=100).astype(np.int32)
OTHER = np.random.default_rng(4).integers(2, 2048, size=70).astype(np.int32)
# SmolLM2's tokens of reference prompt 2 (a ChatML question), from ../shared/reference
SMOL_PROMPT = np.array([1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 30, 2, 198, 1, 4093, 198, 1780,
                        314, 260, 16891, 1225, 282, 913, 281, 20590, 47, 2, 198, 1, 520, 9531, 198],
                       dtype=np.int32)


@pytest.fixture(scope="module", params=["llama", "gemma3", "smollm3", "olmo2", "granite", "starcoder2", "exaone4", "glm4",
                                            "llama4", "phimoe", "granitemoe", "glm4moe",
                                            "cohere2", "gpt-oss", "deepseek2", "mistral4",
                                            "mamba2", "lfm2", "qwen35", "qwen35moe", "qwen3next", "falcon-h1",
                                            "granitehybrid", "lfm2moe", "gemma4", "mamba", "falcon-mamba", "rwkv6", "rwkv7", "arwkv7", "rwkv6qwen2",
                                            "gemma3n"])
def tiny(request, tiny_model_path):
    return _core.Model([str(tiny_model_path(request.param))])


def all_logits(model, tokens, **kw):
    kw.setdefault("n_threads", 2)
    kw.setdefault("n_threads_batch", 2)
    ctx = Context(model, n_ctx=kw.pop("n_ctx", 256), **kw)
    ctx.decode(tokens, logits_all=True)
    return ctx.logits.copy()


def assert_same(a, b, what):
    assert a.shape == b.shape
    if not np.array_equal(a, b):
        bad = np.argwhere(a != b)
        raise AssertionError(f"{what}: {len(bad)} elements differ, first at {bad[0].tolist()}, "
                             f"max |diff| {np.abs(a - b).max():.3g}")


def test_ubatch_and_threads(tiny):
    ref = all_logits(tiny, PROMPT, n_ubatch=512)
    assert np.isfinite(ref).all()
    for n_ubatch in (1, 7, 64):
        assert_same(all_logits(tiny, PROMPT, n_ubatch=n_ubatch), ref, f"n_ubatch={n_ubatch}")
    assert_same(all_logits(tiny, PROMPT, n_threads=1, n_threads_batch=1), ref, "1 thread")
    # n_batch 32: the prompt goes in as four llama_decode calls
    ctx = Context(tiny, n_ctx=256, n_batch=32, n_threads=2, n_threads_batch=2)
    rows = []
    for i in range(0, len(PROMPT), 32):
        ctx.decode(PROMPT[i : i + 32], logits_all=True)
        rows.append(ctx.logits.copy())
    assert_same(np.concatenate(rows), ref, "n_batch=32")


def test_incremental_equals_one_batch(tiny):
    """Prompt in pieces (a chunk, then single tokens) gives the rows of the one-batch run."""
    ref = all_logits(tiny, PROMPT)
    ctx = Context(tiny, n_ctx=256, n_threads=2, n_threads_batch=2)
    ctx.decode(PROMPT[:37], logits_all=True)
    rows = [ctx.logits.copy()]
    for t in PROMPT[37:]:
        ctx.decode([int(t)])
        rows.append(ctx.logits.copy())
    assert_same(np.concatenate(rows), ref, "incremental")


@pytest.mark.parametrize("kv_unified", [True, False])
def test_other_sequences_in_batch(tiny, kv_unified):
    """Sequence 0 interleaved with two other sequences in one batch (and in the cache)."""
    ref = all_logits(tiny, PROMPT)
    ctx = Context(tiny, n_ctx=768, n_seq_max=3, kv_unified=kv_unified, n_ubatch=48,
                  n_threads=2, n_threads_batch=2)
    b = batch_init(len(PROMPT) + len(OTHER) + 20, 0, 1)
    rows0 = []
    j = 0
    for i, t in enumerate(PROMPT):
        rows0.append(b.n_tokens)
        batch_add(b, int(t), i, [0], True)
        if j < len(OTHER):
            batch_add(b, int(OTHER[j]), j, [1], j % 5 == 0)
            j += 1
        if i < 20:
            batch_add(b, int(OTHER[-1 - i]), i, [2], False)
    ctx.decode(b)
    got = np.stack([ctx.logits_ith(r) for r in rows0])
    assert_same(got, ref, f"shared batch (kv_unified={kv_unified})")


def test_smollm2(smollm2_path):
    """Fewer settings than on the tiny models: a real model costs far more per token."""
    model = _core.Model([str(smollm2_path)])
    prompt = SMOL_PROMPT[:12]
    ref = all_logits(model, prompt, n_ubatch=512)
    assert_same(all_logits(model, prompt, n_ubatch=5, n_threads=1, n_threads_batch=1), ref,
                "n_ubatch=5, 1 thread")
    # with another sequence sharing the batch
    ctx = Context(model, n_ctx=256, n_seq_max=2, n_ubatch=8, n_threads=2, n_threads_batch=2)
    b = batch_init(2 * len(prompt), 0, 1)
    for i, t in enumerate(prompt):
        batch_add(b, int(t), i, [0], True)
        batch_add(b, int(prompt[::-1][i]), i, [1], True)
    ctx.decode(b)
    assert_same(ctx.logits[0::2], ref, "two sequences")
