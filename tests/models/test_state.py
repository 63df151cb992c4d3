"""Saved context / sequence state (issue 15): round trips continue bit for bit as if never
saved, states that do not fit are StateErrors that leave the context unchanged, and no
truncation or byte flip crashes or half-loads."""

from __future__ import annotations

import ctypes
import logging

import numpy as np
import pytest

import pyllama
import pyllama.llama_api as L
from pyllama import StateError
from pyllama.context import Context

PROMPT = [1, 5, 9, 2, 7, 3, 11, 4, 6, 8, 10, 12]
NEXT = [13, 14, 15]


@pytest.fixture(scope="module")
def llama(tiny_model_path):
    return pyllama.Model.load(tiny_model_path("llama"))


@pytest.fixture(scope="module")
def gemma3(tiny_model_path):
    return pyllama.Model.load(tiny_model_path("gemma3"))


def ctx_of(model, **kw):
    kw.setdefault("n_ctx", 256)
    kw.setdefault("n_threads", 1)
    return Context(model, **kw)


def continue_logits(ctx, tokens=NEXT, seq_id=0):
    out = []
    for t in tokens:
        ctx.decode([t], seq_id=seq_id)
        out.append(ctx.logits_ith(-1).copy())
    return np.stack(out)


def reference(model, **kw):
    c = ctx_of(model, **kw)
    c.decode(PROMPT)
    return c, c.logits_ith(-1).copy(), continue_logits(c)


@pytest.mark.parametrize("kw", [{}, {"n_threads": 2}, {"n_ubatch": 5, "n_batch": 64}, {"n_ctx": 512, "n_threads": 3}])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_round_trip_continues_bit_identical(arch, kw, llama, gemma3):
    model = {"llama": llama, "gemma3": gemma3}[arch]
    src = ctx_of(model)
    src.decode(PROMPT)
    data = src.save_state()
    assert isinstance(data, bytes) and len(data) == src.state_size()
    _, last, ref = reference(model)
    dst = ctx_of(model, **kw)
    dst.decode([3, 3, 3])  # something to overwrite
    assert dst.load_state(data) == len(data)
    # the last logits come back with the cache
    np.testing.assert_array_equal(dst.logits_ith(-1), last)
    assert dst.n_outputs == 1
    np.testing.assert_array_equal(continue_logits(dst), ref)


def test_round_trip_with_shifted_and_shared_cells(llama):
    def run(c):
        c.decode(PROMPT)
        c.seq_cp(0, 1)
        c.seq_rm(0, 2, 4)
        c.seq_add(0, 4, -1, -2)  # a pending K-shift travels with the state

    a = ctx_of(llama, n_seq_max=2, kv_unified=True)
    run(a)
    data = a.save_state()
    ref = continue_logits(a)
    b = ctx_of(llama, n_seq_max=2, kv_unified=True)
    b.load_state(data)
    np.testing.assert_array_equal(continue_logits(b), ref)
    # positions belong to cells: seq 1 shares the shifted ones
    assert (b.seq_pos_min(1), b.seq_pos_max(1)) == (a.seq_pos_min(1), a.seq_pos_max(1))


@pytest.mark.parametrize("kv_unified", [False, True])
def test_seq_state_moves_to_another_sequence(llama, kv_unified):
    src = ctx_of(llama)
    src.decode(PROMPT)
    data = src.seq_save_state(0)
    assert len(data) == src.state_size(0)
    ref = continue_logits(src)
    dst = ctx_of(llama, n_seq_max=4, n_ctx=1024, kv_unified=kv_unified)
    dst.decode([2, 2], seq_id=1)  # another sequence is left alone
    dst.decode([4, 4, 4, 4], seq_id=3)  # dest's old cells are replaced
    assert dst.seq_load_state(data, 3) == len(data)
    assert (dst.seq_pos_min(3), dst.seq_pos_max(3)) == (0, len(PROMPT) - 1)
    assert dst.seq_pos_max(1) == 1
    np.testing.assert_array_equal(continue_logits(dst, seq_id=3), ref)


def test_session_file_round_trip(llama, tmp_path):
    src = ctx_of(llama)
    src.decode(PROMPT)
    path = tmp_path / "s.bin"
    n = src.save_state_file(path, tokens=PROMPT)
    assert n == path.stat().st_size
    ref = continue_logits(src)
    dst = ctx_of(llama)
    toks = dst.load_state_file(path)
    assert toks.tolist() == PROMPT
    np.testing.assert_array_equal(continue_logits(dst), ref)
    with pytest.raises(StateError, match="capacity"):
        ctx_of(llama).load_state_file(path, max_tokens=3)
    # a file holds exactly one state
    path.write_bytes(path.read_bytes() + b"x")
    with pytest.raises(StateError, match="follow"):
        ctx_of(llama).load_state_file(path)


def test_llama_h_functions(llama, tmp_path):
    src = ctx_of(llama)
    src.decode(PROMPT)
    n = L.llama_state_get_size(src)
    buf = (ctypes.c_uint8 * n)()  # llama-cpp-python's buffers
    assert L.llama_state_get_data(src, buf, n) == n
    assert L.llama_state_get_data(src, bytearray(n - 1), n - 1) == 0  # too small
    ref = continue_logits(src)
    dst = ctx_of(llama)
    assert L.llama_state_set_data(dst, buf, n) == n
    np.testing.assert_array_equal(continue_logits(dst), ref)
    assert L.llama_state_set_data(ctx_of(llama), bytes(buf)[:-1], n - 1) == 0

    src = ctx_of(llama)
    src.decode(PROMPT)
    path = str(tmp_path / "sess.bin").encode()
    toks = (ctypes.c_int32 * len(PROMPT))(*PROMPT)
    assert L.llama_state_save_file(src, path, toks, len(PROMPT))
    assert L.llama_save_session_file(src, path, toks, len(PROMPT))
    out = (ctypes.c_int32 * 64)()
    count = ctypes.c_size_t(0)
    dst = ctx_of(llama)
    assert L.llama_state_load_file(dst, path, out, 64, ctypes.byref(count))
    assert count.value == len(PROMPT) and list(out[: count.value]) == PROMPT
    assert not L.llama_load_session_file(ctx_of(llama), path, out, 3, ctypes.byref(count))  # capacity

    # one sequence, through the plain and the _ext forms and a file
    n = L.llama_state_seq_get_size(src, 0)
    assert n == L.llama_state_seq_get_size_ext(src, 0, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
    arr = np.zeros(n, np.uint8)
    assert L.llama_state_seq_get_data_ext(src, arr, n, 0, 0) == n
    dst = ctx_of(llama, n_seq_max=4, n_ctx=1024)
    assert L.llama_state_seq_set_data(dst, arr, n, 2) == n
    assert dst.seq_pos_max(2) == len(PROMPT) - 1
    assert L.llama_state_seq_set_data_ext(dst, arr, n, 9, 0) == 0  # bad dest_seq_id
    fpath = str(tmp_path / "seq.bin")
    wrote = L.llama_state_seq_save_file(src, fpath, 0, toks, len(PROMPT))
    assert wrote > 0
    count = ctypes.c_size_t(0)
    assert L.llama_state_seq_load_file(dst, fpath, 1, None, 0, ctypes.byref(count)) == 0  # count only
    assert count.value == len(PROMPT) and dst.seq_pos_max(1) == -1
    assert L.llama_state_seq_load_file(dst, fpath, 1, out, 64, ctypes.byref(count)) == wrote
    assert dst.seq_pos_max(1) == len(PROMPT) - 1


def test_llama_h_argument_checks(llama):
    c = ctx_of(llama)
    with pytest.raises(TypeError, match="llama_state_get_data: dst"):
        L.llama_state_get_data(c, 42, 10)
    with pytest.raises(ValueError, match="llama_state_set_data: src holds 3 bytes but size = 10"):
        L.llama_state_set_data(c, b"abc", 10)
    with pytest.raises(TypeError, match="llama_state_get_size: ctx"):
        L.llama_state_get_size(None)


def _probe_logits(ctx):
    """What the context would compute next, without changing it: a copy's continuation."""
    snap = ctx.save_state()
    probe = ctx_of(ctx.model, n_ctx=ctx.n_ctx, n_seq_max=ctx.n_seq_max, kv_unified=ctx.kv_unified,
                   type_k=ctx.params.type_k)
    probe.load_state(snap)
    return snap, continue_logits(probe, NEXT[:1])


def assert_unchanged(ctx, before_state, before_logits, last):
    assert ctx.save_state() == before_state
    np.testing.assert_array_equal(ctx.logits_ith(-1), last)
    np.testing.assert_array_equal(continue_logits(ctx, NEXT[:1]), before_logits)


def test_refused_states_leave_the_context_unchanged(llama, gemma3, caplog):
    c = ctx_of(llama)
    c.decode(PROMPT)
    last = c.logits_ith(-1).copy()
    state, logits = _probe_logits(c)

    other_model = ctx_of(gemma3)
    other_model.decode(PROMPT)
    q8 = ctx_of(llama, type_k="q8_0")
    q8.decode(PROMPT)
    big = ctx_of(llama, n_ctx=512)
    big.decode(list(range(1, 17)) * 20)  # 320 cells > 256
    multi = ctx_of(llama, n_seq_max=2, n_ctx=512)
    multi.decode(PROMPT)
    cases = {
        "architecture": other_model.save_state(),
        "type_k": q8.save_state(),
        "more than": big.save_state(),
        "KV streams": multi.save_state(),
        "one sequence": c.seq_save_state(0),
        "not a pyllama state": b"GGUF" + bytes(100),
    }
    for why, data in cases.items():
        with pytest.raises(StateError, match=why):
            c.load_state(data)
        # llama.h: 0, the reason logged
        with caplog.at_level(logging.ERROR, logger="pyllama"):
            assert L.llama_state_set_data(c, data, len(data)) == 0
        assert why in caplog.text
    # a sequence state that does not fit the destination
    with pytest.raises(StateError, match="more than"):
        c.seq_load_state(big.seq_save_state(0), 0)
    assert issubclass(StateError, pyllama.PyllamaError)
    assert_unchanged(c, state, logits, last)


def test_every_truncation_and_byte_flips_are_refused(llama):
    src = ctx_of(llama, n_ctx=256)
    src.decode(PROMPT[:4])
    data = src.save_state(tokens=PROMPT[:4])
    seq = src.seq_save_state(0)
    c = ctx_of(llama)
    c.decode(PROMPT)
    last = c.logits_ith(-1).copy()
    state, logits = _probe_logits(c)
    n_refused = 0
    for blob in (data, seq):
        load = c.load_state if blob is data else (lambda d: c.seq_load_state(d, 0))
        # every truncation point
        for n in range(len(blob)):
            with pytest.raises(StateError):
                load(blob[:n])
            n_refused += 1
        # 1000 random single-byte flips (any flip: header, fingerprint, payload, checksum)
        rng = np.random.default_rng(15)
        for _ in range(500):
            b = bytearray(blob)
            i = int(rng.integers(len(b)))
            b[i] ^= int(rng.integers(1, 256))
            with pytest.raises(StateError):
                load(bytes(b))
            n_refused += 1
    assert n_refused == len(data) + len(seq) + 1000
    assert_unchanged(c, state, logits, last)


def test_outputs_and_embeddings_travel(llama):
    src = ctx_of(llama, embeddings=True)
    src.decode(PROMPT, logits_all=True)
    data = src.save_state()
    dst = ctx_of(llama, embeddings=True)
    dst.load_state(data)
    assert dst.n_outputs == len(PROMPT)
    for i in range(len(PROMPT)):
        np.testing.assert_array_equal(dst.logits_ith(i), src.logits_ith(i))
        np.testing.assert_array_equal(dst.embeddings_ith(i), src.embeddings_ith(i))
    # a state with more outputs than the destination's n_batch
    small = ctx_of(llama, n_batch=8)
    with pytest.raises(StateError, match="n_batch"):
        small.load_state(data)


def test_llama_save_state_load_state(smollm2_path):
    from pyllama.llama import Llama, LlamaState

    m = Llama(str(smollm2_path), n_ctx=256, verbose=False, seed=7)
    PROMPT = m.tokenize(b"The capital of France is")
    m.eval(PROMPT)
    st = m.save_state()
    assert isinstance(st, LlamaState) and st.n_tokens == len(PROMPT) and st.seed == 7
    expected = m.sample(temp=0.0)
    m.reset()
    m.eval([3, 3])
    m.load_state(st)
    assert m.n_tokens == len(PROMPT) and m.input_ids[: len(PROMPT)].tolist() == PROMPT
    toks = []
    for t in m.generate(PROMPT, temp=0.0):
        toks.append(t)
        break
    assert toks == [expected]
    bad = LlamaState(st.input_ids, st.scores, st.n_tokens, st.llama_state[:-1], st.llama_state_size - 1, 7)
    with pytest.raises(RuntimeError, match="Failed to set llama state data"):
        m.load_state(bad)


def test_round_trip_separate_streams(llama):
    """kv_unified=False: one stream per sequence, each restored in place."""
    a = ctx_of(llama, n_seq_max=2, n_ctx=512)
    a.decode(PROMPT, seq_id=0)
    a.decode(PROMPT[:5], seq_id=1)
    data = a.save_state()
    b = ctx_of(llama, n_seq_max=2, n_ctx=512, n_threads=2)
    b.load_state(data)
    for s in (0, 1):
        np.testing.assert_array_equal(continue_logits(b, seq_id=s), continue_logits(a, seq_id=s))


def test_partial_only_flag_on_a_sliding_window_model(gemma3):
    """LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: pyllama's SWA layers share the full cache's
    cells, so the partial state is the whole sequence and restores the same thing."""
    src = ctx_of(gemma3)
    src.decode(PROMPT)
    n = L.llama_state_seq_get_size_ext(src, 0, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
    buf = np.zeros(n, np.uint8)
    assert L.llama_state_seq_get_data_ext(src, buf, n, 0, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) == n
    ref = continue_logits(src)
    dst = ctx_of(gemma3, n_seq_max=4, n_ctx=1024)
    assert L.llama_state_seq_set_data_ext(dst, buf, n, 2, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) == n
    np.testing.assert_array_equal(continue_logits(dst, seq_id=2), ref)
