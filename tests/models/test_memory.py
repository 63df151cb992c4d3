"""KV-cache operations through llama.h's llama_memory_* functions and Context methods:
their effect on seq_pos_min/max and on what later decodes compute."""

from __future__ import annotations

import numpy as np
import pytest

import pyllama.llama_api as L
from pyllama import _core
from pyllama.batch import batch_add, batch_init
from pyllama.context import Context

pytestmark = pytest.mark.skipif(not hasattr(_core, "Context"), reason="_core.Context (branch fwd) not built")

TOKENS = np.random.default_rng(11).integers(2, 2048, size=64).astype(np.int32)


@pytest.fixture(scope="module")
def llama(tiny_model_path):
    return _core.Model([str(tiny_model_path("llama"))])


def ctx_for(model, **kw):
    kw.setdefault("n_threads", 2)
    kw.setdefault("n_threads_batch", 2)
    return Context(model, **kw)


def decode_seq(ctx, tokens, seq, p0):
    """Decode ``tokens`` on sequence ``seq`` at positions p0.., logits for the last one."""
    b = batch_init(len(tokens), 0, 1)
    for i, t in enumerate(tokens):
        batch_add(b, int(t), p0 + i, [seq], i == len(tokens) - 1)
    ctx.decode(b)
    return ctx.logits[0].copy()


def test_clear_and_pos(llama):
    ctx = ctx_for(llama, n_seq_max=2)
    mem = L.llama_get_memory(ctx)
    assert L.llama_memory_seq_pos_max(mem, 0) == -1 and L.llama_memory_seq_pos_min(mem, 0) == -1
    first = decode_seq(ctx, TOKENS[:10], 0, 0)
    assert (L.llama_memory_seq_pos_min(mem, 0), L.llama_memory_seq_pos_max(mem, 0)) == (0, 9)
    L.llama_memory_clear(mem, True)
    assert L.llama_memory_seq_pos_max(mem, 0) == -1
    assert np.array_equal(decode_seq(ctx, TOKENS[:10], 0, 0), first)


def test_seq_rm_then_redecode_is_identical(llama):
    ctx = ctx_for(llama)
    full = decode_seq(ctx, TOKENS[:20], 0, 0)
    assert ctx.seq_rm(0, 12, -1)
    assert ctx.seq_pos_max(0) == 11
    assert np.array_equal(decode_seq(ctx, TOKENS[12:20], 0, 12), full)
    assert ctx.seq_rm(-1, -1, -1)  # any sequence, all positions
    assert ctx.seq_pos_max(0) == -1


def test_seq_rm_middle_and_pos_min(llama):
    ctx = ctx_for(llama)
    decode_seq(ctx, TOKENS[:10], 0, 0)
    ctx.seq_rm(0, 0, 3)
    assert (ctx.seq_pos_min(0), ctx.seq_pos_max(0)) == (3, 9)


def test_seq_cp_shares_prefix(llama):
    ctx = ctx_for(llama, n_seq_max=3, kv_unified=True)
    decode_seq(ctx, TOKENS[:16], 0, 0)
    L.llama_memory_seq_cp(L.llama_get_memory(ctx), 0, 1, -1, -1)
    assert (ctx.seq_pos_min(1), ctx.seq_pos_max(1)) == (0, 15)
    a = decode_seq(ctx, TOKENS[16:18], 1, 16)
    b = decode_seq(ctx, TOKENS[16:18], 0, 16)
    assert np.array_equal(a, b)
    # the copy is independent of later changes to the source
    ctx.seq_rm(0, 8, -1)
    assert ctx.seq_pos_max(0) == 7 and ctx.seq_pos_max(1) == 17
    # seq_keep drops every other sequence
    ctx.seq_cp(1, 2, 0, 4)
    assert (ctx.seq_pos_min(2), ctx.seq_pos_max(2)) == (0, 3)
    L.llama_memory_seq_keep(L.llama_get_memory(ctx), 1)
    assert ctx.seq_pos_max(0) == -1 and ctx.seq_pos_max(2) == -1 and ctx.seq_pos_max(1) == 17


def test_seq_cp_split_cache(llama):
    """Without a unified cache each sequence has its own cells: llama.cpp copies whole
    sequences only (a partial range aborts there; here it raises)."""
    ctx = ctx_for(llama, n_seq_max=2, n_ctx=512)
    a = decode_seq(ctx, TOKENS[:16], 0, 0)
    with pytest.raises(ValueError, match="whole sequences"):
        ctx.seq_cp(0, 1, 0, 8)
    assert ctx.seq_pos_max(1) == -1
    ctx.seq_cp(0, 1, -1, -1)
    assert (ctx.seq_pos_min(1), ctx.seq_pos_max(1)) == (0, 15)
    assert np.array_equal(decode_seq(ctx, TOKENS[16:17], 1, 16), decode_seq(ctx, TOKENS[16:17], 0, 16))
    assert a.shape == (2048,)


def test_seq_add_rerotates_keys(llama):
    """A gap opened with seq_add changes the next logits (K is re-roped: relative positions
    really change), and closing it again restores them up to the rounding of re-roping
    the F16 keys twice. Without re-roping, both shifts would leave the logits unchanged."""
    def run(shift):
        ctx = ctx_for(llama, n_ctx=256, kv_unified=True)
        decode_seq(ctx, TOKENS[:24], 0, 0)
        if not shift:
            return decode_seq(ctx, TOKENS[24:25], 0, 24), None
        L.llama_memory_seq_add(L.llama_get_memory(ctx), 0, 12, -1, 10)
        assert (ctx.seq_pos_min(0), ctx.seq_pos_max(0)) == (0, 33)
        gap = decode_seq(ctx, TOKENS[24:25], 0, 34)
        ctx.seq_rm(0, 34, -1)
        ctx.seq_add(0, 22, -1, -10)
        assert ctx.seq_pos_max(0) == 23
        return decode_seq(ctx, TOKENS[24:25], 0, 24), gap

    plain, _ = run(False)
    back, gap = run(True)
    # logits std is about 3 on these models
    assert np.abs(gap - plain).max() > 0.5
    assert np.abs(back - plain).max() < 0.05, np.abs(back - plain).max()


def test_seq_rm_shifted_cells_are_removed(llama):
    ctx = ctx_for(llama, kv_unified=True)
    decode_seq(ctx, TOKENS[:10], 0, 0)
    ctx.seq_add(0, 0, 5, -3)  # positions 0..2 would become negative: removed
    assert (ctx.seq_pos_min(0), ctx.seq_pos_max(0)) == (0, 9)
    ctx.seq_rm(0, 5, -1)
    assert (ctx.seq_pos_min(0), ctx.seq_pos_max(0)) == (0, 1)


def test_seq_div(llama):
    ctx = ctx_for(llama)
    decode_seq(ctx, TOKENS[:10], 0, 0)
    L.llama_memory_seq_div(L.llama_get_memory(ctx), 0, 4, -1, 2)
    assert (ctx.seq_pos_min(0), ctx.seq_pos_max(0)) == (0, 4)  # 4..9 -> 2..4


def test_bad_seq_ids_raise(llama):
    ctx = ctx_for(llama, n_seq_max=2)
    for fn, args in [(ctx.seq_pos_max, (2,)), (ctx.seq_pos_min, (-1,)), (ctx.seq_cp, (0, 5, -1, -1)),
                     (ctx.seq_keep, (9,)), (ctx.seq_add, (2, 0, -1, 1)), (ctx.seq_div, (0, 0, -1, 0))]:
        with pytest.raises(ValueError):
            fn(*args)
