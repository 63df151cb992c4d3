"""Context parameters: llama.h's defaults and llama_context's resolution rules (n_ctx 0 ->
n_ctx_train, rounding to 256, n_batch <= n_ctx, n_ubatch <= n_batch, n_seq_max <= 256,
n_ctx_seq for a split cache), failures as None + a logged reason."""

from __future__ import annotations

import logging

import pytest

import pyllama.llama_api as L
from pyllama import _core
from pyllama.context import Context

needs_core = pytest.mark.skipif(not hasattr(_core, "Context"), reason="_core.Context (branch fwd) not built")


def test_default_params_match_llama_h():
    p = L.llama_context_default_params()
    assert (p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max) == (512, 2048, 512, 1)
    assert p.type_k == p.type_v == L.GGML_TYPE_F16 == 1
    assert p.flash_attn_type == L.LLAMA_FLASH_ATTN_TYPE_AUTO == -1
    assert p.pooling_type == L.LLAMA_POOLING_TYPE_UNSPECIFIED
    assert p.attention_type == L.LLAMA_ATTENTION_TYPE_UNSPECIFIED
    assert p.rope_scaling_type == L.LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED
    assert (p.rope_freq_base, p.rope_freq_scale) == (0.0, 0.0)
    assert (p.yarn_ext_factor, p.yarn_attn_factor, p.yarn_beta_fast, p.yarn_beta_slow) == (-1.0,) * 4
    assert p.yarn_orig_ctx == 0
    assert (p.embeddings, p.offload_kqv, p.no_perf, p.swa_full, p.kv_unified) == (False, True, True, True, False)
    assert p.abort_callback is None and p.abort_callback_data is None
    assert 1 <= p.n_threads <= 8 and p.n_threads_batch == p.n_threads
    # independent objects: changing one does not change the next default
    p.n_ctx = 9
    assert L.llama_context_default_params().n_ctx == 512


@pytest.fixture(scope="module")
def llama(tiny_model_path):
    return _core.Model([str(tiny_model_path("llama"))])


def init(model, **kw):
    p = L.llama_context_default_params()
    p.n_threads = p.n_threads_batch = 1
    for k, v in kw.items():
        setattr(p, k, v)
    return L.llama_init_from_model(model, p)


@needs_core
@pytest.mark.parametrize(
    "kw, n_ctx, n_batch, n_ubatch",
    [
        (dict(), 512, 512, 512),
        (dict(n_ctx=0), 2048, 2048, 512),  # n_ctx_train of the tiny model
        (dict(n_ctx=300), 512, 300, 300),  # n_batch is clamped before n_ctx is rounded
        (dict(n_ctx=1000, n_batch=64, n_ubatch=128), 1024, 64, 64),
        (dict(n_ctx=256, n_ubatch=0), 256, 256, 256),
    ],
)
def test_resolution(llama, kw, n_ctx, n_batch, n_ubatch):
    ctx = init(llama, **kw)
    assert ctx is not None
    assert (L.llama_n_ctx(ctx), L.llama_n_batch(ctx), L.llama_n_ubatch(ctx)) == (n_ctx, n_batch, n_ubatch)
    assert L.llama_n_seq_max(ctx) == 1
    assert L.llama_get_model(ctx) is llama
    L.llama_free(ctx)


@needs_core
def test_split_cache_per_sequence(llama, caplog):
    with caplog.at_level(logging.WARNING, logger="pyllama"):
        ctx = init(llama, n_ctx=1000, n_seq_max=3, kv_unified=False)
    assert L.llama_n_ctx_seq(ctx) == 512  # 1024 / 3 = 341, rounded up to 256s
    assert L.llama_n_ctx(ctx) == 1536
    assert "n_seq_max" in caplog.text
    ctx = init(llama, n_ctx=1000, n_seq_max=3, kv_unified=True)
    assert (L.llama_n_ctx(ctx), L.llama_n_ctx_seq(ctx)) == (1024, 1024)


@needs_core
@pytest.mark.parametrize(
    "kw, reason",
    [
        (dict(n_seq_max=257), "n_seq_max must be <= 256"),
        (dict(n_batch=0, n_ubatch=0), "cannot both be zero"),
        (dict(type_k=99), "type_k = 99"),
        (dict(pooling_type=L.LLAMA_POOLING_TYPE_RANK), "pooling_type"),
        (dict(attention_type=L.LLAMA_ATTENTION_TYPE_NON_CAUSAL), "non-causal"),
        (dict(n_ctx=-1), "n_ctx = -1"),
    ],
)
def test_init_failures_return_none(llama, kw, reason, caplog):
    with caplog.at_level(logging.ERROR, logger="pyllama"):
        assert init(llama, **kw) is None
    assert reason in caplog.text


def test_init_null_model(caplog):
    with caplog.at_level(logging.ERROR, logger="pyllama"):
        assert L.llama_init_from_model(None, L.llama_context_default_params()) is None
    assert "model cannot be NULL" in caplog.text


@needs_core
def test_idiomatic_context(llama):
    with Context(llama, n_ctx=256, n_threads=1, n_threads_batch=1, type_k="f16") as ctx:
        assert ctx.n_ctx == 256 and ctx.n_batch == 256
        ctx.set_n_threads(2, 2)
        assert (ctx.n_threads, ctx.n_threads_batch) == (2, 2)
        with pytest.raises(ValueError, match="n_threads"):
            ctx.set_n_threads(0, 1)
    with pytest.raises(ValueError, match="freed"):
        ctx.decode([1])
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_ctxx'"):
        Context(llama, n_ctxx=5)
    with pytest.raises(ValueError, match="n_seq_max must be <= 256"):
        Context(llama, n_seq_max=1000)
    with pytest.raises(TypeError, match="expected a pyllama model"):
        Context("model.gguf")


@needs_core
@pytest.mark.parametrize("pooling", ["none", "mean", "cls", "last"])
def test_embeddings_and_pooling(llama, pooling, caplog):
    import numpy as np

    from pyllama.batch import batch_add, batch_init

    ptype = getattr(L, f"LLAMA_POOLING_TYPE_{pooling.upper()}")
    ctx = init(llama, embeddings=True, pooling_type=ptype, n_seq_max=2)
    assert L.llama_pooling_type(ctx) == ptype
    b = batch_init(7, 0, 1)
    for i in range(4):
        batch_add(b, 10 + i, i, [0], False)
    for i in range(3):
        batch_add(b, 50 + i, i, [1], False)
    with caplog.at_level(logging.WARNING, logger="pyllama"):
        assert L.llama_decode(ctx, b) == 0
    assert "overriding" in caplog.text  # embeddings make every token an output
    e = L.llama_get_embeddings(ctx)
    assert e.shape == (7, 256) and np.isfinite(e).all()
    assert L.llama_get_logits(ctx).shape == (7, 2048)
    assert np.array_equal(L.llama_get_embeddings_ith(ctx, 5), e[5])
    s0, s1 = L.llama_get_embeddings_seq(ctx, 0), L.llama_get_embeddings_seq(ctx, 1)
    if pooling == "none":
        assert s0 is None and s1 is None
    else:
        want = {"mean": (e[:4].mean(0), e[4:].mean(0)), "cls": (e[0], e[4]), "last": (e[3], e[6])}[pooling]
        np.testing.assert_allclose(s0, want[0], rtol=1e-6)
        np.testing.assert_allclose(s1, want[1], rtol=1e-6)
    # the hidden state of a token does not depend on the other sequence in the batch
    solo = init(llama, embeddings=True)
    b0 = batch_init(4, 0, 1)
    for i in range(4):
        batch_add(b0, 10 + i, i, [0], True)
    assert L.llama_decode(solo, b0) == 0
    assert np.array_equal(L.llama_get_embeddings(solo), e[:4])


@needs_core
def test_accepts_python_model_wrapper(tiny_model_path):
    """pyllama.Model (and what llama_model_load_from_file returns) works like _core.Model."""
    import numpy as np

    import pyllama

    m = pyllama.Model.load(tiny_model_path("llama"))
    ctx = init(m, n_ctx=256)
    assert ctx is not None and L.llama_get_model(ctx) is m
    assert L.llama_decode(ctx, L.llama_batch_get_one([5, 6, 7])) == 0
    direct = init(_core.Model([str(tiny_model_path("llama"))]), n_ctx=256)
    assert L.llama_decode(direct, L.llama_batch_get_one([5, 6, 7])) == 0
    assert np.array_equal(L.llama_get_logits(ctx), L.llama_get_logits(direct))


@needs_core
def test_set_embeddings_toggle(llama):
    import numpy as np

    ctx = init(llama)
    assert L.llama_decode(ctx, L.llama_batch_get_one([3, 4, 5])) == 0
    assert L.llama_get_embeddings(ctx) is None and L.llama_get_logits(ctx).shape == (1, 2048)
    L.llama_set_embeddings(ctx, True)
    assert L.llama_decode(ctx, L.llama_batch_get_one([6, 7])) == 0
    assert L.llama_get_embeddings(ctx).shape == (2, 256) and L.llama_get_logits(ctx).shape == (2, 2048)
    ref = init(llama, embeddings=True)
    assert L.llama_decode(ref, L.llama_batch_get_one([3, 4, 5, 6, 7])) == 0
    assert np.array_equal(L.llama_get_embeddings(ref)[3:], L.llama_get_embeddings(ctx))
    L.llama_set_embeddings(ctx, False)
    assert L.llama_decode(ctx, L.llama_batch_get_one([8, 9])) == 0
    assert L.llama_get_embeddings(ctx) is None and L.llama_get_logits(ctx).shape == (1, 2048)


@needs_core
def test_cache_types(llama, caplog):
    import numpy as np

    ref = init(llama)
    assert L.llama_decode(ref, L.llama_batch_get_one(list(range(3, 40)))) == 0
    for tk, tv in [(L.GGML_TYPE_Q8_0, L.GGML_TYPE_Q8_0), (L.GGML_TYPE_F32, L.GGML_TYPE_F32)]:
        ctx = init(llama, type_k=tk, type_v=tv)
        assert ctx is not None
        assert L.llama_decode(ctx, L.llama_batch_get_one(list(range(3, 40)))) == 0
        # a different rounding of K/V: close to the F16 cache (logits std ~3), not equal
        assert np.abs(L.llama_get_logits(ctx) - L.llama_get_logits(ref)).max() < 0.5
    # outside llama.cpp's -ctk/-ctv set (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1)
    with caplog.at_level(logging.ERROR, logger="pyllama"):
        assert init(llama, type_k=L.GGML_TYPE_Q4_K) is None
    assert "not a supported KV cache type" in caplog.text


def test_n_parallel_regions_counts_the_pool_runs(tiny_model_path):
    """Context.n_parallel_regions: 0 on a new context, grows with each decode by the same
    count for the same single-token step, back to 0 after set_n_threads (new pools)."""
    from pyllama import Context, Model

    model = Model.load(tiny_model_path("llama"))
    with Context(model, n_ctx=64, n_threads=2, n_threads_batch=2) as ctx:
        assert ctx.n_parallel_regions == 0
        ctx.decode([1, 2, 3])
        a = ctx.n_parallel_regions
        assert a > 0
        ctx.decode([4])
        b = ctx.n_parallel_regions
        ctx.decode([5])
        c = ctx.n_parallel_regions
        assert b > a and c - b == b - a
        ctx.set_n_threads(1, 1)
        assert ctx.n_parallel_regions == 0
