"""The per-token fast paths of generation give exactly what the general paths give.

- ``_core.top_k_indices`` (Rust, one pass) against a full stable sort: same positions in
  the same order, also with ties, NaN and infinities.
- ``Context._decode_one`` (single-token decode without the batch allocator) against the
  general ``Context.decode`` path fed an explicit batch: same logits, positions, output map,
  perf counts and return codes, on a real (tiny, generated) model.
- ``SamplerChain``'s skip of disabled samplers: same tokens as applying every sampler.
- a chain of built-in samplers in one Rust call: the same tokens, candidates and
  probabilities as its samplers applied one by one.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyllama.llama_api as L
from pyllama import _core
from pyllama import sampling as S
from pyllama.batch import batch_add, batch_init
from pyllama.context import Context


def _row(n: int, seed: int, mode: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    if mode == 1:
        x = np.round(x, 1)  # many ties
    elif mode == 2:
        x[rng.integers(0, n, size=max(1, n // 50))] = rng.choice(
            np.array([np.nan, np.inf, -np.inf], np.float32), size=max(1, n // 50))
    elif mode == 3:
        x = np.sort(x)  # ascending: every entry displaces the k-th best (the scan gives up)
    return x


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6000), st.integers(1, 1100), st.integers(0, 2**31), st.integers(0, 3))
def test_rust_top_k_equals_full_sort(n, k, seed, mode):
    x = _row(n, seed, mode)
    got = _core.top_k_indices(x, k)
    assert got.dtype == np.int64
    # the definition: stable descending sort with NaN last (argsort(-x) puts NaN last)
    np.testing.assert_array_equal(got, np.argsort(-x, kind="stable")[:k])


def test_rust_top_k_on_gemma_sized_row_and_views():
    x = _row(262144, 3, 0)
    np.testing.assert_array_equal(_core.top_k_indices(x, 40), np.argsort(-x, kind="stable")[:40])
    strided = x[::3]  # not contiguous: copied, same answer
    np.testing.assert_array_equal(_core.top_k_indices(strided, 40), np.argsort(-strided, kind="stable")[:40])
    ro = x.view()
    ro.flags.writeable = False  # the sampler hands over a read-only view of the logits buffer
    np.testing.assert_array_equal(_core.top_k_indices(ro, 7), np.argsort(-x, kind="stable")[:7])
    assert _core.top_k_indices(x, 0).shape == (0,)
    assert _core.top_k_indices(np.zeros(0, np.float32), 5).shape == (0,)
    with pytest.raises(TypeError):
        _core.top_k_indices(x.astype(np.float64), 5)


def test_chain_skipping_disabled_samplers_samples_the_same_tokens():
    rng = np.random.default_rng(5)
    rows = [rng.standard_normal(49152).astype(np.float32) * 3 for _ in range(20)]
    fast = S.build_chain(S.SamplerParams(seed=11, penalty_repeat=1.1), n_vocab=49152)
    slow = S.build_chain(S.SamplerParams(seed=11, penalty_repeat=1.1), n_vocab=49152)

    def apply_all(cur):  # the old loop: every sampler, disabled ones included
        for s in slow.samplers:
            s.apply(cur)

    def accept_all(tok):
        for s in slow.samplers:
            s.accept(tok)

    slow.apply = apply_all
    slow.accept = accept_all
    assert any(isinstance(s, S.EmptySampler) for s in fast.samplers)
    assert [fast.sample(r) for r in rows] == [slow.sample(r) for r in rows]
    # changing the list (in place) is seen at once
    fast.samplers[:] = [S.EmptySampler("?x"), S.GreedySampler()]
    assert fast.sample(rows[0]) == int(np.argmax(rows[0]))
    fast.samplers.insert(0, S.LogitBiasSampler(49152, {5: 1000.0}))
    assert fast.sample(rows[0]) == 5


@pytest.fixture(scope="module")
def llama(tiny_model_path):
    return _core.Model([str(tiny_model_path("llama"))])


def _general_batch(tok: int, pos: int):
    """The same single-token step as an explicit batch: takes the general path."""
    b = batch_init(1, 0, 1)
    batch_add(b, tok, pos, [0], True)
    return b


def test_single_token_fast_path_equals_general_path(llama):
    toks = np.random.default_rng(1).integers(2, 2048, size=40).astype(np.int32)
    fast = Context(llama, n_ctx=256, n_threads=2, n_threads_batch=2, no_perf=False)
    slow = Context(llama, n_ctx=256, n_threads=2, n_threads_batch=2, no_perf=False)
    fast.decode(toks[:8])
    slow.decode(toks[:8])
    calls = []
    real = fast._decode_one
    fast._decode_one = lambda *a: calls.append(1) or real(*a)
    for i in range(8, 40):
        fast.decode(toks[i:i + 1])
        b = _general_batch(int(toks[i]), i)
        slow.decode(b)
        np.testing.assert_array_equal(fast.logits, slow.logits)
        np.testing.assert_array_equal(fast.logits_ith(0), slow.logits_ith(0))
        np.testing.assert_array_equal(fast.logits_ith(-1), slow.logits_ith(-1))
        with pytest.raises(IndexError):
            fast.logits_ith(1)
    assert len(calls) == 32
    assert fast.seq_pos_max(0) == slow.seq_pos_max(0) == 39
    assert fast.n_outputs == slow.n_outputs == 1
    assert fast.perf().n_eval == slow.perf().n_eval == 32
    assert fast.perf().n_p_eval == 8


def test_single_token_after_multi_output_batch_resets_the_output_map(llama):
    ctx = Context(llama, n_ctx=256, n_threads=2, n_threads_batch=2)
    ctx.decode(np.arange(5, 10, dtype=np.int32), logits_all=True)
    assert ctx.n_outputs == 5
    ctx.decode(np.array([11], np.int32))
    assert ctx.n_outputs == 1
    ctx.logits_ith(0)
    for i in range(1, 5):
        with pytest.raises(IndexError):
            ctx.logits_ith(i)


def test_single_token_fast_path_codes(llama, caplog):
    p = L.llama_context_default_params()
    p.n_ctx = 256
    p.n_threads = p.n_threads_batch = 2
    ctx = L.llama_init_from_model(llama, p)
    # bad token id: the general path's message and code, nothing changed
    assert L.llama_decode(ctx, L.llama_batch_get_one(np.array([5000], np.int32))) == -1
    assert L.llama_memory_seq_pos_max(L.llama_get_memory(ctx), 0) == -1
    # fill the cache, then one more token finds no slot: code 1, the last logits stay
    assert L.llama_decode(ctx, L.llama_batch_get_one(np.full(255, 7, np.int32))) == 0
    assert L.llama_decode(ctx, L.llama_batch_get_one(np.array([8], np.int32))) == 0
    before = L.llama_get_logits_ith(ctx, -1).copy()
    assert L.llama_decode(ctx, L.llama_batch_get_one(np.array([9], np.int32))) == 1
    np.testing.assert_array_equal(L.llama_get_logits_ith(ctx, -1), before)
    assert L.llama_memory_seq_pos_max(L.llama_get_memory(ctx), 0) == 255


def test_core_decode_one_rejects_bad_input_with_exceptions(llama):
    ctx = Context(llama, n_ctx=256, n_threads=1, n_threads_batch=1)
    core = ctx._core
    row = np.zeros(ctx.n_vocab, np.float32)
    with pytest.raises(Exception, match="outside"):
        core.decode_one(ctx.n_vocab, row)  # token id out of range: an error, no crash
    with pytest.raises(Exception, match="outside"):
        core.decode_one(-1, row)
    with pytest.raises(ValueError, match="C-contiguous"):
        core.decode_one(3, np.zeros(2 * ctx.n_vocab, np.float32)[::2])
    with pytest.raises(Exception):
        core.decode_one(3, np.zeros(ctx.n_vocab - 1, np.float32))  # row too short
    assert core.seq_pos_max(0) == -1  # nothing was decoded
    out = core.decode_one(3, row)
    assert (out.kind, out.n_done, out.reason) == ("ok", 1, "")
    assert core.seq_pos_max(0) == 0 and np.isfinite(row).all()


def _tokens(chain, rows):
    out = []
    for r in rows:
        out.append(chain.sample(r))
        last = chain.last
        out.append((last.ids.tolist(), last.selected, last.sorted, last.p.tobytes(), last.logits.tobytes()))
    return out


@pytest.mark.parametrize("params", [
    dict(),                                              # llama.cpp's defaults: top-k 40, top-p .95, min-p .05, temp .8
    dict(top_k=5, top_p=0.5, min_p=0.2, temp=1.5),
    dict(top_k=128, top_p=1.0, min_p=0.0, temp=1.0),     # only top-k -> dist
    dict(top_k=1),
    dict(top_k=40, top_p=0.9, min_p=0.1, min_keep=3),
    dict(top_k=40, temp=0.0),                            # greedy through temperature
    dict(penalty_repeat=1.3, penalty_freq=0.2, penalty_present=0.1, dry_multiplier=0.8,
         dry_penalty_last_n=32, dry_allowed_length=1),    # penalties + DRY before top-k
    dict(top_k=0, top_p=0.9, typ_p=0.95, xtc_probability=0.5, xtc_threshold=0.1,
         dynatemp_range=0.4, top_n_sigma=2.0),           # everything on the full row
    dict(mirostat=1, temp=0.9),
    dict(mirostat=2, temp=0.9),
])
def test_one_call_chain_equals_the_samplers_one_by_one(monkeypatch, params):
    """A chain of built-ins sampled in one Rust call picks the same tokens, keeps the same
    candidates with the same probabilities and draws the same random numbers as its
    samplers applied (and accepted) one by one."""
    rng = np.random.default_rng(3)
    rows = [rng.standard_normal(4096).astype(np.float32) * s for s in (0.5, 1, 2, 4, 8) for _ in range(8)]
    rows[7][123] = np.inf          # non-finite candidates
    rows[9][:] = -np.inf
    rows[9][:3] = (1.0, 2.0, 3.0)  # only 3 finite logits: -inf among the top 40
    rows[11] = np.round(rows[11])  # ties
    with monkeypatch.context() as m:
        m.setattr(S, "_is_builtin", lambda s: False)
        slow = S.build_chain(S.SamplerParams(seed=9, **params), n_vocab=4096)
        want = _tokens(slow, rows)
        assert slow._plan()[4] is None
    fast = S.build_chain(S.SamplerParams(seed=9, **params), n_vocab=4096)
    got = _tokens(fast, rows)
    assert fast._plan()[4] is not None  # the one-call path did run
    assert got == want


def test_one_call_chain_on_a_gemma_sized_row(monkeypatch):
    row = (np.random.default_rng(4).standard_normal(262144) * 3).astype(np.float32)
    with monkeypatch.context() as m:
        m.setattr(S, "_is_builtin", lambda s: False)
        slow = S.build_chain(S.SamplerParams(seed=1), n_vocab=len(row))
        t_slow = slow.sample(row)
    fast = S.build_chain(S.SamplerParams(seed=1), n_vocab=len(row))
    assert fast.sample(row) == t_slow
    np.testing.assert_array_equal(fast.last.ids, slow.last.ids)
    np.testing.assert_array_equal(fast.last.logits, slow.last.logits)
    np.testing.assert_array_equal(fast.last.p, slow.last.p)


def test_python_sampler_inside_a_chain_of_built_ins(monkeypatch):
    """A sampler written in Python splits the chain: the built-ins around it still run in
    Rust (one call per run of them) and see what it did; same tokens as every sampler one
    by one."""
    class BanBest(S.Sampler):  # sets the best logit to -inf
        name = "ban-best"

        def apply(self, cur):
            lg = np.array(cur.logits, np.float32)
            lg[int(np.argmax(lg))] = -np.inf
            cur.logits = lg
            cur.sorted = False

    rng = np.random.default_rng(8)
    rows = [rng.standard_normal(3000).astype(np.float32) * 2 for _ in range(30)]

    def chain():
        return S.SamplerChain([S.PenaltiesSampler(16, 1.5, 0.0, 0.0), BanBest(), S.TopKSampler(5),
                               S.TempSampler(0.7), S.DistSampler(3)])

    fast = chain()
    steps = fast._plan()[3]
    assert [type(s).__name__ if not isinstance(s, list) else len(s) for s in steps] == [1, "BanBest", 3]
    assert fast._plan()[4] is None
    got = [fast.sample(r) for r in rows]
    with monkeypatch.context() as m:
        m.setattr(S, "_is_builtin", lambda s: False)
        slow = chain()
        want = [slow.sample(r) for r in rows]
    assert got == want
