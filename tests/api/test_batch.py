"""The batch allocator (pyllama.batch) on its own: validation messages, autofill and the
micro-batch splits. The cache state it checks against is given as explicit
seq -> (pos_min, pos_max) tables; the same rules against a real KV cache are in
test_decode_codes.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyllama.batch import (
    Batch,
    allocate,
    batch_add,
    batch_get_one,
    batch_init,
    split_equal,
    split_simple,
)
from pyllama.errors import InvalidBatchError

N_VOCAB = 100
N_EMBD = 8


def alloc(batch, cache=None, n_seq_max=4, output_all=False):
    cache = cache or {}
    return allocate(
        batch, n_vocab=N_VOCAB, n_embd=N_EMBD, n_seq_max=n_seq_max,
        seq_pos_min=lambda s: cache.get(s, (-1, -1))[0],
        seq_pos_max=lambda s: cache.get(s, (-1, -1))[1],
        output_all=output_all)


def make(entries, n_seq_max=4):
    """entries: (token, pos, seq_ids, logits)"""
    b = batch_init(len(entries), 0, n_seq_max)
    for tok, pos, sids, lg in entries:
        batch_add(b, tok, pos, sids, lg)
    return b


def test_batch_init_fields():
    b = batch_init(5, 0, 3)
    assert b.n_tokens == 0 and b.embd is None
    assert b.token.shape == (5,) and b.token.dtype == np.int32
    assert b.pos.dtype == np.int32 and b.n_seq_id.dtype == np.int32
    assert b.seq_id.shape == (5, 3) and b.seq_id.dtype == np.int32
    assert b.logits.dtype == np.int8
    e = batch_init(4, 16, 1)
    assert e.token is None and e.embd.shape == (4, 16) and e.embd.dtype == np.float32


def test_get_one_keeps_int32_array():
    a = np.array([3, 4, 5], dtype=np.int32)
    b = batch_get_one(a)
    assert b.token is a and b.n_tokens == 3 and b.pos is None and b.logits is None


def test_autofill_positions_seq0_last_logit():
    ab = alloc(batch_get_one([1, 2, 3]), cache={0: (0, 6)})
    assert ab.pos.tolist() == [7, 8, 9]
    assert ab.seq_ids == [(0,)] * 3
    assert ab.output.tolist() == [False, False, True] and ab.n_outputs == 1


def test_autofill_per_first_seq():
    b = batch_get_one([1, 2, 3, 4])
    b.n_seq_id = np.array([1, 1, 1, 1], dtype=np.int32)
    b.seq_id = np.array([[1], [0], [1], [0]], dtype=np.int32)
    ab = alloc(b, cache={1: (0, 9)})
    assert ab.pos.tolist() == [10, 0, 11, 1]


def test_output_all_overrides():
    msgs = []
    b = batch_get_one([1, 2])
    ab = allocate(b, n_vocab=N_VOCAB, n_embd=N_EMBD, n_seq_max=1, seq_pos_min=lambda s: -1,
                  seq_pos_max=lambda s: -1, output_all=True, warn=msgs.append)
    assert ab.output.all() and msgs and "overriding" in msgs[0]


def test_duplicate_seq_ids_collapse_sorted():
    b = make([(1, 0, [2, 0, 2], True)])
    ab = alloc(b)
    assert ab.seq_ids == [(0, 2)] and ab.has_cpl


@pytest.mark.parametrize(
    "entries, cache, match",
    [
        ([(N_VOCAB, 0, [0], True)], {}, r"invalid token\[0\] = 100"),
        ([(1, 0, [0], False), (-7, 1, [0], True)], {}, r"invalid token\[1\] = -7"),
        ([(1, 0, [0], False), (2, 1, [4], True)], {}, r"invalid seq_id\[1\]\[0\] = 4 >= 4"),
        ([(1, 0, [-1], True)], {}, r"invalid seq_id\[0\]\[0\] = -1"),
        ([(1, 5, [0], True)], {0: (0, 3)}, r"(?s)X = 3.*Y = 5.*Y = X \+ 1"),
        ([(1, 3, [0], True)], {0: (0, 3)}, r"(?s)X = 3.*Y = 3\n"),
        ([(1, 0, [0], False), (2, 2, [0], True)], {}, r"sequence 0 positions are not continuous"),
        ([(1, 1, [0], False), (2, 0, [0], True)], {}, r"sequence 0 positions are decreasing"),
        ([(1, 5, [0, 1], True)], {0: (0, 4), 1: (2, 4)}, r"sequence 1 is coupled to 0.*diverged"),
        ([(1, -2, [0], True)], {}, r"invalid pos\[0\] = -2"),
    ],
)
def test_invalid(entries, cache, match):
    with pytest.raises(InvalidBatchError, match=match):
        alloc(make(entries), cache)


def test_invalid_shapes_and_kinds():
    with pytest.raises(InvalidBatchError, match="n_tokens == 0"):
        alloc(batch_get_one(np.zeros(0, dtype=np.int32)))
    b = batch_init(2, 0, 1)
    b.n_tokens = 3
    with pytest.raises(InvalidBatchError, match="holds only 2"):
        alloc(b)
    b = Batch(n_tokens=2)
    with pytest.raises(InvalidBatchError, match="neither token ids nor embeddings"):
        alloc(b)
    b = Batch(n_tokens=2, token=np.array([1, 2], np.int32), embd=np.zeros((2, N_EMBD), np.float32))
    with pytest.raises(InvalidBatchError, match="mixes token ids and embeddings"):
        alloc(b)
    b = Batch(n_tokens=2, token=np.array([1, -1], np.int32))
    with pytest.raises(InvalidBatchError, match="same content types"):
        alloc(b)
    b = Batch(n_tokens=1, embd=np.zeros((1, N_EMBD + 1), np.float32))
    with pytest.raises(InvalidBatchError, match="row width 9 does not match the decoder input 8"):
        alloc(b)
    b = make([(1, 0, [0], True)])
    b.n_seq_id[0] = 0
    with pytest.raises(InvalidBatchError, match=r"invalid n_seq_id\[0\] = 0"):
        alloc(b)


def test_embedding_batch_ok():
    b = batch_init(3, N_EMBD, 1)
    b.n_tokens = 3
    b.pos[:] = [0, 1, 2]
    b.n_seq_id[:] = 1
    b.logits[:] = [0, 1, 1]
    ab = alloc(b)
    assert ab.token is None and ab.embd.shape == (3, N_EMBD) and ab.n_outputs == 2


def test_start_anywhere_on_empty_seq_and_duplicates_allowed():
    # llama.cpp accepts any start for an empty sequence, and repeated positions
    ab = alloc(make([(1, 5, [0], False), (2, 5, [0], False), (3, 6, [0], True)]))
    assert ab.seq_pos[0] == (5, 6)


def test_split_simple():
    parts = split_simple(10, 4)
    assert [p.tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_split_equal_interleaved_sequences():
    # seq 0: entries 0,2,4,6 ; seq 1: entries 1,3,5 ; seq 2: entry 7
    entries = [(1, 0, [0], 1), (1, 0, [1], 1), (1, 1, [0], 1), (1, 1, [1], 1),
               (1, 2, [0], 1), (1, 2, [1], 1), (1, 3, [0], 1), (1, 0, [2], 1)]
    ab = alloc(make(entries))
    parts = [p.tolist() for p in split_equal(ab, 6)]
    # first: three sets, 2 tokens each would be 6 but seq 2 has 1 -> 1 each, then grow
    flat = sorted(i for p in parts for i in p)
    assert flat == list(range(8))
    assert all(len(p) <= 6 for p in parts)
    assert parts[0] == [0, 1, 7]
    # within each micro-batch, each set contributes equally
    for p in parts:
        counts = {}
        for i in p:
            counts[ab.seq_mask[i]] = counts.get(ab.seq_mask[i], 0) + 1
        assert len(set(counts.values())) == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40), st.integers(1, 9))
def test_split_equal_covers_in_order(seqs, n_ubatch):
    """Every entry exactly once, each micro-batch <= n_ubatch, and within a sequence the
    entries keep batch order across micro-batches."""
    nxt = {}
    entries = []
    for s in seqs:
        entries.append((1, nxt.get(s, 0), [s], 1))
        nxt[s] = nxt.get(s, 0) + 1
    ab = alloc(make(entries))
    parts = split_equal(ab, n_ubatch)
    flat = [i for p in parts for i in p.tolist()]
    assert sorted(flat) == list(range(len(entries)))
    assert all(0 < len(p) <= n_ubatch for p in parts)
    for s in set(seqs):
        order = [i for i in flat if seqs[i] == s]
        assert order == sorted(order)


def test_split_equal_keeps_the_tail_together():
    # llama.cpp's split_equal with n_keep_tail (recurrent rollback: n_rs_seq + 1), by hand:
    # seq 0 entries 0..7, seq 1 entries 8..13, n_ubatch 4, sequential
    entries = [(1, p, [0], 1) for p in range(8)] + [(1, p, [1], 1) for p in range(6)]
    ab = alloc(make(entries))
    parts = lambda n_keep_tail: [p.tolist() for p in split_equal(ab, 4, True, n_keep_tail)]  # noqa: E731
    assert parts(0) == [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7]]
    # 2 of seq 1 would be left: it waits; then seq 0 would leave 2: it is taken to its end
    assert parts(3) == [[0, 1, 8, 9], [2, 3], [4, 5, 6, 7], [10, 11, 12, 13]]
    # one sequence of 6: 4 would leave 2, so the first micro-batch is cut back to 3
    ab = alloc(make([(1, p, [0], 1) for p in range(6)]))
    assert [p.tolist() for p in split_equal(ab, 4, n_keep_tail=3)] == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="n_keep_tail"):
        split_equal(ab, 3, n_keep_tail=3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40), st.integers(1, 4), st.integers(0, 4))
def test_split_equal_tail_property(seqs, n_keep_tail, extra):
    """With n_keep_tail, every entry still comes once and in order, and the last
    min(len, n_keep_tail) entries of each sequence share a micro-batch."""
    n_ubatch = n_keep_tail + 1 + extra
    nxt = {}
    entries = []
    for s in seqs:
        entries.append((1, nxt.get(s, 0), [s], 1))
        nxt[s] = nxt.get(s, 0) + 1
    parts = [p.tolist() for p in split_equal(alloc(make(entries)), n_ubatch, n_keep_tail=n_keep_tail)]
    flat = [i for p in parts for i in p]
    assert sorted(flat) == list(range(len(entries)))
    assert all(0 < len(p) <= n_ubatch for p in parts)
    for s in set(seqs):
        mine = [i for i in flat if seqs[i] == s]
        assert mine == sorted(mine)
        tail = mine[-n_keep_tail:]
        assert any(set(tail) <= set(p) for p in parts)


def test_out_of_int32_values():
    b = batch_get_one(np.array([1, 2], dtype=np.int64))
    assert b.token.dtype == np.int32
    with pytest.raises(ValueError, match=r"tokens\[1\] = 4294967297 does not fit int32"):
        batch_get_one(np.array([1, 2**32 + 1], dtype=np.int64))
    b = Batch(n_tokens=2, token=np.array([1, 2], np.int32), pos=np.array([0, 2**40], np.int64))
    with pytest.raises(InvalidBatchError, match=r"batch.pos\[1\] = 1099511627776 does not fit int32"):
        alloc(b)
    b = Batch(n_tokens=1, token=np.array([1.5]))
    with pytest.raises(InvalidBatchError, match="must hold integers"):
        alloc(b)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-3, N_VOCAB + 2), min_size=1, max_size=8), st.integers(-1, 20), st.booleans())
def test_get_one_fast_path_equals_general_path(tokens, p_max, output_all):
    """llama_batch_get_one batches take a shortcut; it must agree with the general path
    (same fields, or the same error)."""
    cache = {0: (0, p_max)} if p_max >= 0 else {}
    fast = batch_get_one(tokens)
    general = batch_get_one(tokens)
    n = len(tokens)
    general.n_seq_id = np.ones(n, dtype=np.int32)  # explicit sequence 0 disables the shortcut
    general.seq_id = np.zeros((n, 1), dtype=np.int32)
    res = []
    for b in (fast, general):
        try:
            ab = alloc(b, cache, output_all=output_all)
            res.append((ab.pos.tolist(), ab.output.tolist(), ab.n_outputs, ab.seq_ids, ab.seq_pos,
                        ab.token.tolist(), [a.tolist() for a in ab.seq_id_array(4)]))
        except InvalidBatchError as e:
            res.append(str(e))
    assert res[0] == res[1]
