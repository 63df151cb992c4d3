"""llama_decode on a real (tiny, generated) model: the return codes and what each leaves
behind, the output-row mapping of llama_get_logits_ith, perf counters and the idiomatic
Context.decode exceptions."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import pyllama.llama_api as L
from pyllama import _core
from pyllama.batch import batch_add, batch_init
from pyllama.context import Context
from pyllama.errors import Aborted, ContextFullError, InvalidBatchError

pytestmark = pytest.mark.skipif(not hasattr(_core, "Context"), reason="_core.Context (branch fwd) not built")

RNG = np.random.default_rng(7)
TOKENS = RNG.integers(2, 2048, size=300).astype(np.int32)


@pytest.fixture(scope="module")
def llama(tiny_model_path):
    return _core.Model([str(tiny_model_path("llama"))])


def make_ctx(model, **kw):
    p = L.llama_context_default_params()
    p.n_threads = p.n_threads_batch = 2
    for k, v in kw.items():
        setattr(p, k, v)
    ctx = L.llama_init_from_model(model, p)
    assert ctx is not None
    return ctx


def state(ctx, n_seq=1):
    return [(L.llama_memory_seq_pos_min(L.llama_get_memory(ctx), s),
             L.llama_memory_seq_pos_max(L.llama_get_memory(ctx), s)) for s in range(n_seq)]


def test_get_one_continues_and_outputs_last(llama):
    ctx = make_ctx(llama)
    assert L.llama_decode(ctx, L.llama_batch_get_one(TOKENS[:10])) == 0
    assert state(ctx) == [(0, 9)]
    lg = L.llama_get_logits(ctx)
    assert lg.shape == (1, 2048) and lg.dtype == np.float32 and np.isfinite(lg).all()
    assert L.llama_decode(ctx, L.llama_batch_get_one(TOKENS[10:11])) == 0
    assert state(ctx) == [(0, 10)]
    assert np.array_equal(L.llama_get_logits_ith(ctx, -1), L.llama_get_logits(ctx)[0])


@pytest.mark.parametrize("what", ["token", "seq_id", "gap_to_cache", "overlap_cache", "gap_in_batch",
                                  "decreasing", "empty", "too_long"])
def test_invalid_batch_changes_nothing(llama, what, caplog):
    ctx = make_ctx(llama, n_seq_max=2, n_ctx=512, n_batch=256)
    assert L.llama_decode(ctx, L.llama_batch_get_one(TOKENS[:8])) == 0
    before_logits = L.llama_get_logits(ctx).copy()
    before = state(ctx, 2)
    b = batch_init(300, 0, 2)
    if what == "too_long":
        for i in range(257):
            batch_add(b, int(TOKENS[i % 300]), 8 + i, [0], i == 256)
    else:
        batch_add(b, int(TOKENS[8]), 8, [0], False)
        batch_add(b, int(TOKENS[9]), 9, [0], True)
        if what == "token":
            b.token[1] = 2048
        elif what == "seq_id":
            b.seq_id[1, 0] = 2
        elif what == "gap_to_cache":
            b.pos[:2] = [9, 10]
        elif what == "overlap_cache":
            b.pos[:2] = [7, 8]
        elif what == "gap_in_batch":
            b.pos[1] = 11
        elif what == "decreasing":
            b.pos[:2] = [9, 8]
        elif what == "empty":
            b.n_tokens = 0
    with caplog.at_level(logging.ERROR, logger="pyllama"):
        assert L.llama_decode(ctx, b) == -1
    assert any("llama_decode" in r.message for r in caplog.records)
    assert state(ctx, 2) == before
    assert np.array_equal(L.llama_get_logits(ctx), before_logits)
    # the context still works after the refusal
    assert L.llama_decode(ctx, L.llama_batch_get_one(TOKENS[8:10])) == 0
    assert state(ctx, 2) == [(0, 9), (-1, -1)]


def test_full_cache_returns_1_and_keeps_state(llama):
    ctx = make_ctx(llama, n_ctx=256, n_ubatch=32)
    assert L.llama_n_ctx(ctx) == 256
    assert L.llama_decode(ctx, L.llama_batch_get_one(TOKENS[:200])) == 0
    ref = L.llama_get_logits(ctx).copy()
    assert L.llama_decode(ctx, L.llama_batch_get_one(TOKENS[200:257])) == 1  # 57 > 56 free cells
    assert state(ctx) == [(0, 199)]
    assert np.array_equal(L.llama_get_logits(ctx), ref)
    # a batch that fits still goes through, and fills the cache exactly
    assert L.llama_decode(ctx, L.llama_batch_get_one(TOKENS[200:256])) == 0
    assert state(ctx) == [(0, 255)]
    assert L.llama_decode(ctx, L.llama_batch_get_one(TOKENS[256:257])) == 1
    assert state(ctx) == [(0, 255)]


def test_context_full_error(llama):
    ctx = Context(llama, n_ctx=256, n_threads=2, n_threads_batch=2)
    ctx.decode(TOKENS[:250])
    with pytest.raises(ContextFullError, match="memory slot"):
        ctx.decode(TOKENS[250:260])
    assert ctx.seq_pos_max(0) == 249


def test_abort_keeps_finished_ubatches(llama):
    ctx = make_ctx(llama, n_ubatch=4)
    calls = []

    def cb(data):
        calls.append(data)
        return len(calls) > 2  # let two micro-batches run, stop before the third

    L.llama_set_abort_callback(ctx, cb, "payload")
    assert L.llama_decode(ctx, L.llama_batch_get_one(TOKENS[:10])) == 2
    assert calls[0] == "payload"
    assert state(ctx) == [(0, 7)]  # exactly the two finished micro-batches of 4
    # resume from where it stopped: the result equals an uninterrupted run
    L.llama_set_abort_callback(ctx, None)
    assert L.llama_decode(ctx, L.llama_batch_get_one(TOKENS[8:10])) == 0
    resumed = L.llama_get_logits(ctx)[0].copy()
    fresh = make_ctx(llama, n_ubatch=4)
    assert L.llama_decode(fresh, L.llama_batch_get_one(TOKENS[:10])) == 0
    assert np.array_equal(resumed, L.llama_get_logits(fresh)[0])


def test_abort_before_first_ubatch_and_idiomatic(llama):
    ctx = Context(llama, n_ubatch=4, n_threads=2, n_threads_batch=2, abort_callback=lambda: True)
    with pytest.raises(Aborted, match="after 0 of 3 micro-batches") as ei:
        ctx.decode(TOKENS[:10])
    assert (ei.value.n_done, ei.value.n_ubatches) == (0, 3)
    assert ctx.seq_pos_max(0) == -1
    # how far it got: two of three micro-batches of 4
    calls = []
    ctx.set_abort_callback(lambda: calls.append(1) or len(calls) > 2)
    with pytest.raises(Aborted) as ei:
        ctx.decode(TOKENS[:10])
    assert (ei.value.n_done, ei.value.n_ubatches) == (2, 3)
    assert ctx.seq_pos_max(0) == 7 and ctx.n_outputs == 0
    ctx.memory_clear()

    def boom():
        raise RuntimeError("callback bug")

    ctx.set_abort_callback(boom)
    with pytest.raises(Aborted) as ei:
        ctx.decode(TOKENS[:3])
    assert isinstance(ei.value.__cause__, RuntimeError)
    assert ctx.seq_pos_max(0) == -1


def test_logits_ith_mapping(llama, caplog):
    ctx = make_ctx(llama, n_seq_max=2)
    b = batch_init(6, 0, 2)
    for i in range(3):
        batch_add(b, int(TOKENS[i]), i, [0], i in (0, 2))
    for i in range(3):
        batch_add(b, int(TOKENS[10 + i]), i, [1], i == 1)
    assert L.llama_decode(ctx, b) == 0
    lg = L.llama_get_logits(ctx)
    assert lg.shape == (3, 2048)
    assert np.array_equal(L.llama_get_logits_ith(ctx, 0), lg[0])
    assert np.array_equal(L.llama_get_logits_ith(ctx, 2), lg[1])
    assert np.array_equal(L.llama_get_logits_ith(ctx, 4), lg[2])
    assert np.array_equal(L.llama_get_logits_ith(ctx, -1), lg[2])
    assert np.array_equal(L.llama_get_logits_ith(ctx, -3), lg[0])
    with caplog.at_level(logging.ERROR, logger="pyllama"):
        assert L.llama_get_logits_ith(ctx, 1) is None
        assert L.llama_get_logits_ith(ctx, -4) is None
        assert L.llama_get_logits_ith(ctx, 10_000) is None
    assert "batch.logits[1] != true" in caplog.text
    # rows equal those of each sequence decoded alone
    solo = make_ctx(llama)
    b0 = batch_init(3, 0, 1)
    for i in range(3):
        batch_add(b0, int(TOKENS[i]), i, [0], i in (0, 2))
    assert L.llama_decode(solo, b0) == 0
    assert np.array_equal(L.llama_get_logits(solo), lg[:2])


def test_idiomatic_decode_errors(llama):
    ctx = Context(llama, n_threads=2, n_threads_batch=2)
    with pytest.raises(InvalidBatchError, match=r"invalid token\[1\] = 5000"):
        ctx.decode([1, 5000])
    with pytest.raises(InvalidBatchError, match=r"seq_id\[0\]\[0\] = 3 >= 1"):
        ctx.decode([1, 2], seq_id=3)
    ctx.decode([1, 2, 3], logits_all=True)
    assert ctx.logits.shape == (3, 2048) and ctx.n_outputs == 3


def test_perf_counters(llama, caplog):
    ctx = make_ctx(llama, no_perf=False)
    assert L.llama_decode(ctx, L.llama_batch_get_one(TOKENS[:12])) == 0
    for t in TOKENS[12:15]:
        assert L.llama_decode(ctx, L.llama_batch_get_one([int(t)])) == 0
    d = L.llama_perf_context(ctx)
    assert (d.n_p_eval, d.n_eval) == (12, 3)
    assert d.t_p_eval_ms > 0 and d.t_eval_ms > 0
    with caplog.at_level(logging.INFO, logger="pyllama"):
        L.llama_perf_context_print(ctx)
    assert "prompt eval time =" in caplog.text and "/    12 tokens" in caplog.text
    L.llama_perf_context_reset(ctx)
    d = L.llama_perf_context(ctx)
    assert (d.n_p_eval, d.n_eval, d.t_eval_ms) == (1, 1, 0.0)  # llama.cpp reports at least 1


def test_encode_not_supported(llama, caplog):
    ctx = make_ctx(llama)
    with caplog.at_level(logging.ERROR, logger="pyllama"):
        assert L.llama_encode(ctx, L.llama_batch_get_one([1, 2])) == -1
    assert "decoder-only" in caplog.text


def test_embedding_input_equals_token_input(llama, tiny_model_path):
    """A batch of input embeddings (rows of token_embd) gives the logits of the tokens."""
    import pyllama

    E = pyllama.GGUFFile(tiny_model_path("llama")).tensor("token_embd.weight").dequantize().reshape(2048, 256)
    a = Context(llama, n_threads=2, n_threads_batch=2)
    a.decode(TOKENS[:10], logits_all=True)
    b = Context(llama, n_threads=2, n_threads_batch=2)
    eb = L.llama_batch_init(10, 256, 1)
    eb.n_tokens = 10
    eb.embd[:] = E[TOKENS[:10]]
    eb.pos[:] = np.arange(10)
    eb.n_seq_id[:] = 1
    eb.logits[:] = 1
    assert L.llama_decode(b, eb) == 0
    assert np.array_equal(b.logits, a.logits)


def test_split_cache_limits_each_sequence(llama):
    """Without a unified cache each sequence has n_ctx_seq cells of its own."""
    ctx = make_ctx(llama, n_ctx=512, n_seq_max=2, kv_unified=False)
    assert L.llama_n_ctx_seq(ctx) == 256

    def on(seq, toks, p0):
        b = batch_init(len(toks), 0, 1)
        for i, t in enumerate(toks):
            batch_add(b, int(t), p0 + i, [seq], i == len(toks) - 1)
        return L.llama_decode(ctx, b)

    assert on(0, TOKENS[:250], 0) == 0
    assert on(0, TOKENS[250:260], 250) == 1
    assert on(1, TOKENS[250:260], 0) == 0
    assert state(ctx, 2) == [(0, 249), (0, 9)]


def test_random_batches_never_crash(llama):
    """Hypothesis: any batch (mostly valid, with occasional bad tokens, seq ids, positions)
    either decodes (0, the cache grows by exactly its positions) or is refused with -1 / 1
    and the cache untouched; never an exception."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    ctx = make_ctx(llama, n_ctx=256, n_seq_max=3, n_ubatch=5, kv_unified=True)
    codes = []

    @settings(max_examples=60, deadline=None, derandomize=True)
    @given(st.data())
    def run(data):
        if data.draw(st.integers(0, 4)) == 0:
            L.llama_memory_clear(L.llama_get_memory(ctx), False)
        before = state(ctx, 3)
        n = data.draw(st.integers(0, 12))
        b = batch_init(max(n, 1), 0, 3)
        nxt = {s: before[s][1] + 1 for s in range(3)}
        for i in range(n):
            sids = [data.draw(st.integers(0, 2))]
            if data.draw(st.integers(0, 7)) == 0:  # shared by two sequences (coupled)
                sids.append((sids[0] + 1) % 3)
            if data.draw(st.integers(0, 40)) == 0:
                sids[0] = data.draw(st.sampled_from([-1, 3, 7]))
            tok = data.draw(st.one_of(st.integers(0, 2047), st.sampled_from([-2, 2048])) if i == 7
                            else st.integers(0, 2047))
            p = max(nxt.get(s, 0) for s in sids) + data.draw(st.sampled_from([0] * 30 + [1, -1]))
            for s in sids:
                nxt[s] = p + 1
            b.token[i], b.pos[i], b.n_seq_id[i] = tok, p, len(sids)
            b.seq_id[i, : len(sids)] = sids
            b.logits[i] = data.draw(st.booleans())
            b.n_tokens += 1
        code = L.llama_decode(ctx, b)
        codes.append(code)
        assert code in (0, -1, 1)
        if code != 0:
            assert state(ctx, 3) == before
        else:
            assert L.llama_get_logits(ctx).shape == (int(b.logits[:n].astype(bool).sum()), 2048)
            for s in range(3):
                mine = [int(b.pos[i]) for i in range(n) if s in b.seq_id[i, : b.n_seq_id[i]]]
                if mine:
                    assert state(ctx, 3)[s][1] == max(mine)

    run()
    assert codes.count(0) >= 10 and codes.count(-1) >= 10, codes


def test_threads_share_a_context(llama):
    """Two Python threads decoding different sequences of one context: calls are
    serialized, results equal a serial run."""
    import threading

    ctx = Context(llama, n_seq_max=2, n_ctx=512, kv_unified=True, n_threads=1, n_threads_batch=1)
    out = {}

    def work(seq):
        rows = []
        for i in range(0, 40, 8):
            b = batch_init(8, 0, 1)
            for j in range(8):
                batch_add(b, int(TOKENS[seq * 50 + i + j]), i + j, [seq], j == 7)
            with ctx.lock:  # decode + read the logits as one step
                ctx.decode(b)
                rows.append(ctx.logits[0].copy())
        out[seq] = np.stack(rows)

    ts = [threading.Thread(target=work, args=(s,)) for s in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for seq in (0, 1):
        solo = Context(llama, n_ctx=512, n_threads=1, n_threads_batch=1)
        rows = []
        for i in range(0, 40, 8):
            solo.decode(TOKENS[seq * 50 + i: seq * 50 + i + 8])
            rows.append(solo.logits[0].copy())
        assert np.array_equal(out[seq], np.stack(rows))
