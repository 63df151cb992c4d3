"""Samplers against llama.cpp: the cases of llama.cpp's tests/test-sampling.cpp (same inputs,
same expected probabilities, same 1e-5 tolerance), the RNG stream against libstdc++, and
hypothesis properties of every sampler and of the default chain."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyllama import llama_api as L
from pyllama import sampling as S
from pyllama.sampling import TokenDataArray


# ---------------------------------------------------------------------------------------
# llama.cpp tests/test-sampling.cpp, case for case


def make_tester(probs):
    """sampler_tester(probs, ...): ids 0..n-1, logits log(p), p preset to probs."""
    probs = np.array(probs, np.float32)
    with np.errstate(divide="ignore"):
        return TokenDataArray(np.arange(len(probs)), np.log(probs), probs)


def check(cur, expected):
    assert cur.size == len(expected), (cur.p, expected)
    np.testing.assert_allclose(cur.p, np.array(expected, np.float32), atol=1e-5, rtol=0)


def run(probs, expected, *samplers, dist=True):
    cur = make_tester(probs)
    for s in samplers:
        L.llama_sampler_apply(s, cur)
    if dist:
        L.llama_sampler_apply(L.llama_sampler_init_dist(0), cur)
    check(cur, expected)
    return cur


P4 = [0.1, 0.2, 0.3, 0.4]


def test_dist_singleton_keeps_rng_aligned():
    singleton = L.llama_sampler_init_dist(4242)
    control = L.llama_sampler_init_dist(4242)

    def sample(smpl, logits):
        cur = TokenDataArray(np.arange(len(logits)), logits)
        L.llama_sampler_apply(smpl, cur)
        assert 0 <= cur.selected < cur.size
        return int(cur.ids[cur.selected])

    sample(singleton, [0.0])
    sample(control, [0.0, 0.0])
    logits = [0.0] * 256
    for _ in range(4):
        assert sample(singleton, logits) == sample(control, logits)


@pytest.mark.parametrize("temp,expected", [(1.0, P4), (0.0, [0, 0, 0, 1])])
def test_temp(temp, expected):
    run(P4, expected, L.llama_sampler_init_temp(temp))
    run(P4, expected, L.llama_sampler_init_temp_ext(temp, 0.0, 1.0))


@pytest.mark.parametrize("k,expected", [
    (1, [1.0]), (3, [0.44444, 0.33333, 0.22222]), (4, [0.4, 0.3, 0.2, 0.1]), (0, P4)])
def test_top_k(k, expected):
    run(P4, expected, L.llama_sampler_init_top_k(k))


@pytest.mark.parametrize("p,expected", [
    (0.0, [1.0]), (0.7, [0.571429, 0.428571]), (0.8, [0.44444, 0.33333, 0.22222]), (1.0, P4)])
def test_top_p(p, expected):
    run(P4, expected, L.llama_sampler_init_top_p(p, 0))


@pytest.mark.parametrize("p,expected", [
    (0.00, P4), (0.24, P4),
    (0.26, [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]), (0.49, [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
    (0.51, [0.3 / 0.7, 0.4 / 0.7]), (0.74, [0.3 / 0.7, 0.4 / 0.7]),
    (0.76, [1.0]), (1.00, [1.0]), (1.05, [1.0])])
def test_min_p(p, expected):
    run(P4, expected, L.llama_sampler_init_min_p(p, 0))


@pytest.mark.parametrize("t,expected", [
    (0.09, [0.1]), (0.19, [0.2, 0.1]), (0.29, [0.3, 0.2, 0.1]), (0.39, [0.4, 0.3, 0.2, 0.1])])
def test_xtc(t, expected):
    run([0.4, 0.3, 0.2, 0.1], expected, L.llama_sampler_init_xtc(0.99, t, 0, 0), dist=False)


@pytest.mark.parametrize("probs,expected", [
    ([0.97, 0.01, 0.01, 0.01], [0.97]), ([0.4, 0.2, 0.2, 0.2], [0.2, 0.2, 0.2])])
def test_typical(probs, expected):
    run(probs, expected, L.llama_sampler_init_typical(0.5, 0), dist=False)


@pytest.mark.parametrize("last,expected,rep,freq,pres", [
    ([0], [0, 0.25, 0.25, 0.25, 0.25], 50.0, 0.0, 0.0),
    ([0, 1, 2], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
    ([0, 1, 2, 0, 0], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
    ([0], [0.000011, 0.249997, 0.249997, 0.249997, 0.249997], 1.0, 5.0, 5.0),
    ([0, 1, 2], [0.000023, 0.000023, 0.000023, 0.499966, 0.499966], 1.0, 5.0, 5.0),
    ([0, 1, 2, 0, 0], [0.000000, 0.000023, 0.000023, 0.499977, 0.499977], 1.0, 5.0, 5.0)])
def test_penalties(last, expected, rep, freq, pres):
    s = L.llama_sampler_init_penalties(5, len(last), rep, freq, pres)
    for t in last:
        L.llama_sampler_accept(s, t)
    run([0.2] * 5, expected, s)


@pytest.mark.parametrize("probs,last,expected,mult,base,allowed,last_n,breakers", [
    ([0.25] * 4, [0, 1], [0.25] * 4, 1.0, 1.1, 2, 4, {}),
    ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], 1.0, 1.1, 2, 5, {}),
    ([0.2] * 5, [0, 1, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 2, 6, {3: [[]]}),
    ([0.2] * 5, [0, 1, 2, 0, 1], [0.241818, 0.241818, 0.032727, 0.241818, 0.241818], 2.0, 1.1, 2, 5, {}),
    ([0.2] * 5, [0, 1, 2, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 4, 7, {})])
def test_dry(probs, last, expected, mult, base, allowed, last_n, breakers):
    s = S.DrySampler(mult, base, allowed, last_n, breakers)
    for t in last:
        s.accept(t)
    run(probs, expected, s)


@pytest.mark.parametrize("n,expected", [
    (1.0, [0.0, 0.0, 0.428571, 0.571429]), (0.0, P4), (3.0, P4)])
def test_top_n_sigma(n, expected):
    run(P4, expected, L.llama_sampler_init_top_n_sigma(n))


def _queue(n_vocab, seq, top_k, top_p, min_p):
    """test_sampler_queue: logits log(id), so p(id) = id / sum."""
    with np.errstate(divide="ignore"):
        cur = TokenDataArray(np.arange(n_vocab), np.log(np.arange(n_vocab, dtype=np.float32)))
    min_token_id, max_token_id = 0, n_vocab - 1
    for s in seq:
        smpl = {"k": lambda: L.llama_sampler_init_top_k(top_k),
                "p": lambda: L.llama_sampler_init_top_p(top_p, 1),
                "m": lambda: L.llama_sampler_init_min_p(min_p, 1)}[s]()
        L.llama_sampler_apply(smpl, cur)
        L.llama_sampler_apply(L.llama_sampler_init_dist(0), cur)
        size = cur.size
        if s == "k":
            expected_size = min(size, top_k)
            min_token_id = max(min_token_id, n_vocab - top_k)
            assert size == expected_size
            assert cur.ids[0] == max_token_id and cur.ids[expected_size - 1] == min_token_id
        elif s == "p":
            divisor = n_vocab * (n_vocab - 1) // 2 - min_token_id * (min_token_id - 1) // 2
            target = math.ceil(np.float32(top_p) * np.float32(divisor))
            min_token_id, expected_size, cumsum = n_vocab, 0, 0
            while True:
                min_token_id -= 1
                expected_size += 1
                cumsum += min_token_id
                if cumsum >= target:
                    break
            if min_token_id == 1:
                min_token_id -= 1
                expected_size += 1
            assert size == expected_size
            assert not cur.sorted or cur.ids[0] == max_token_id
            assert not cur.sorted or cur.ids[expected_size - 1] == min_token_id
        else:
            expected_size = math.ceil((1.0 - np.float32(min_p)) * n_vocab)
            expected_size = min(max(expected_size, 1), size)
            min_token_id = math.floor(np.float32(min_p) * n_vocab)
            min_token_id = max(min_token_id, 1, n_vocab - size)
            min_token_id = min(min_token_id, n_vocab - 1)
            assert size == expected_size
            assert not cur.sorted or cur.ids[0] == max_token_id
            assert not cur.sorted or cur.ids[expected_size - 1] == min_token_id


@pytest.mark.parametrize("seq,k,p,m", [
    ("k", 10000, 1.0, 1.0), ("k", 1, 1.0, 1.0), ("p", 10000, 1.0, 1.0), ("p", 10000, 0.0, 1.0),
    ("m", 10000, 1.0, 1.0), ("m", 10000, 1.0, 1e-12), ("k", 100, 1.0, 1.0),
    ("p", 10000, 0.0003, 1.0), ("p", 10000, 0.8, 1.0), ("m", 10000, 1.0, 9997.9 / 9999.0),
    ("m", 10000, 1.0, 0.1), ("kp", 100, 0.8, 0.1), ("km", 100, 0.8, 0.1), ("pk", 100, 0.8, 0.1),
    ("pm", 100, 0.8, 0.1), ("mk", 100, 0.8, 0.1), ("mp", 100, 0.8, 9997.9 / 9999.0),
    ("mp", 100, 0.8, 0.1), ("kpm", 100, 0.8, 0.1), ("kmp", 100, 0.8, 0.1), ("pkm", 100, 0.8, 0.1),
    ("pmk", 100, 0.8, 0.1), ("mkp", 100, 0.8, 0.1), ("mpk", 100, 0.8, 0.1)])
def test_sampler_queue(seq, k, p, m):
    _queue(10000, seq, k, p, m)


# ---------------------------------------------------------------------------------------
# random numbers: the same stream as std::mt19937 + libstdc++ distributions
#
# Expected values printed by this C++ program (g++ / libstdc++, x86-64):
#   for seed in {0, 42, 1234, 4294967294}: std::mt19937 rng(seed);
#     3 x uniform_real_distribution<double>(0,1), 3 x uniform_real_distribution<float>(0,1),
#     8 x discrete_distribution<int>({0.1, 0.2, 0.05, 0.4, 0.25})   (all from the same rng)
LIBSTDCXX = {
    0: ([0.59284461651668263, 0.84426574425659828, 0.85794561998982988],
        [0.544883192, 0.847251713, 0.423654795], [3, 3, 4, 4, 3, 4, 3, 3]),
    42: ([0.79654298428784598, 0.18343478789336848, 0.77969099761266125],
        [0.598658502, 0.596850157, 0.156018645], [1, 0, 4, 3, 3, 0, 4, 4]),
    1234: ([0.49766366630595166, 0.81783844288953322, 0.61211189358442275],
        [0.785358608, 0.771359921, 0.779975832], [1, 1, 4, 4, 4, 3, 3, 3]),
    4294967294: ([0.10184899170898529, 0.94789751258733013, 0.82893340139475558],
        [0.607734799, 0.372329295, 0.560739458], [4, 4, 2, 0, 4, 0, 3, 4]),
}


@pytest.mark.parametrize("seed", sorted(LIBSTDCXX))
def test_rng_matches_libstdcxx(seed):
    d, f, k = LIBSTDCXX[seed]
    r = S._StdRng(seed)
    assert [r.uniform_double() for _ in range(3)] == d
    # %.9g round-trips a float32 exactly
    assert [np.float32(r.uniform_float()) for _ in range(3)] == [np.float32(x) for x in f]
    w = np.array([0.1, 0.2, 0.05, 0.4, 0.25], np.float32)
    assert [r.discrete(w) for _ in range(8)] == k


def test_rng_matches_mt19937_reference_outputs():
    # std::mt19937 with the default seed 5489: first output 3499211612, 10000th 4123659995
    # (the C++ standard requires the latter: [rand.predef]).
    r = S._StdRng(5489)
    assert r.next_u32() == 3499211612
    for _ in range(9998):
        r.next_u32()
    assert r.next_u32() == 4123659995


# ---------------------------------------------------------------------------------------
# properties

finite_logits = st.lists(
    st.floats(-30, 30, allow_nan=False, width=32), min_size=1, max_size=300
).map(lambda xs: np.array(xs, np.float32))


def _fresh(logits):
    return TokenDataArray.from_logits(logits)


@settings(max_examples=200, deadline=None)
@given(finite_logits)
def test_top_k_1_is_argmax(logits):
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(1))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(7))
    assert chain.sample(logits) == int(np.argmax(logits))
    greedy = S.SamplerChain([S.GreedySampler()])
    assert greedy.sample(logits) == int(np.argmax(logits))


@settings(max_examples=200, deadline=None)
@given(finite_logits, st.floats(0.0, 1.0), st.integers(0, 20),
       st.sampled_from(["top_p", "min_p", "typical"]))
def test_min_keep_honoured(logits, p, min_keep, kind):
    cur = _fresh(logits)
    smpl = {"top_p": S.TopPSampler, "min_p": S.MinPSampler, "typical": S.TypicalSampler}[kind](p, min_keep)
    smpl.apply(cur)
    assert cur.size >= min(max(min_keep, 1), len(logits))
    assert len(set(cur.ids.tolist())) == cur.size  # no token twice


@settings(max_examples=100, deadline=None)
@given(finite_logits, st.integers(0, 2**32 - 2), st.floats(0.0, 2.0), st.integers(0, 50),
       st.floats(0.5, 1.0), st.floats(0.0, 0.3))
def test_chain_returns_a_kept_token_and_probs_sum_to_one(logits, seed, temp, top_k, top_p, min_p):
    params = S.SamplerParams(seed=seed, temp=temp, top_k=top_k, top_p=top_p, min_p=min_p)
    chain = S.build_chain(params, n_vocab=len(logits))
    tok = chain.sample(logits)
    cur = chain.last
    assert tok in cur.ids.tolist()
    assert 0 <= tok < len(logits)
    if cur.size > 0 and temp > 0:
        assert abs(float(cur.p.sum(dtype=np.float64)) - 1.0) < 1e-5
    # the chosen token was not one top-k dropped
    if top_k > 0:
        rank = int((logits > logits[tok]).sum())
        assert rank < top_k


@settings(max_examples=50, deadline=None)
@given(finite_logits, st.integers(0, 2**32 - 2))
def test_seeded_runs_repeat(logits, seed):
    def run_chain():
        params = S.SamplerParams(seed=seed, penalty_repeat=1.1, xtc_probability=0.5,
                                 dynatemp_range=0.3)
        chain = S.build_chain(params, n_vocab=len(logits))
        return [chain.sample(logits) for _ in range(6)]

    assert run_chain() == run_chain()


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 3000), st.integers(1, 1200), st.integers(0, 2**31))
def test_top_indices_matches_full_sort(n, k, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    if seed % 3 == 0:
        x = np.round(x, 1)  # many ties
    got = S._top_indices(x, k)
    want = np.argsort(-x, kind="stable")[:k]
    np.testing.assert_array_equal(x[got], x[want])
    assert len(set(got.tolist())) == len(got)


def test_top_indices_large_row_with_ties_and_infs():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(262144).astype(np.float32)
    x[::7] = -np.inf
    x[100:140] = 9.0
    got = S._top_indices(x, 40)
    assert sorted(got.tolist()) == list(range(100, 140))
    np.testing.assert_array_equal(S._top_indices(x, 300), np.argsort(-x, kind="stable")[:300])


def test_mirostat_samplers_select_and_update_mu():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal(1000).astype(np.float32) * 3
    for smpl in (S.MirostatSampler(1000, 5, 5.0, 0.1, 100), S.MirostatV2Sampler(5, 5.0, 0.1)):
        chain = S.SamplerChain([S.TempSampler(0.8), smpl])
        toks = [chain.sample(logits) for _ in range(5)]
        assert all(0 <= t < 1000 for t in toks)
        assert smpl.mu != 10.0
        clone = chain.clone()
        assert [clone.sample(logits) for _ in range(3)] == [chain.sample(logits) for _ in range(3)]
        chain.reset()
        assert smpl.mu == 10.0


# ---------------------------------------------------------------------------------------
# the chain API


def test_chain_api_and_perf():
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_params(no_perf=False))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(10))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(0.5))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(1234))
    assert L.llama_sampler_chain_n(chain) == 3
    assert L.llama_sampler_name(L.llama_sampler_chain_get(chain, 0)) == "top-k"
    assert L.llama_sampler_chain_get(chain, -1) is chain
    assert L.llama_sampler_chain_get(chain, 3) is None
    assert L.llama_sampler_get_seed(chain) == 1234
    logits = np.linspace(0, 5, 100, dtype=np.float32)
    a = [chain.sample(logits) for _ in range(4)]
    perf = L.llama_perf_sampler(chain)
    assert perf.n_sample == 4 and perf.t_sample_ms > 0
    L.llama_perf_sampler_reset(chain)
    assert L.llama_perf_sampler(chain).n_sample == 0
    L.llama_sampler_reset(chain)
    assert [chain.sample(logits) for _ in range(4)] == a
    removed = L.llama_sampler_chain_remove(chain, 1)
    assert L.llama_sampler_name(removed) == "temp" and L.llama_sampler_chain_n(chain) == 2
    assert L.llama_sampler_chain_remove(chain, 5) is None
    L.llama_sampler_free(chain)
    with pytest.raises(ValueError, match="llama_sampler_chain_init"):
        L.llama_perf_sampler(L.llama_sampler_init_greedy())


def test_disabled_samplers_are_empty_and_named_like_llama_cpp():
    names = [L.llama_sampler_name(s) for s in (
        L.llama_sampler_init_top_k(0), L.llama_sampler_init_top_p(1.0, 1),
        L.llama_sampler_init_min_p(0.0, 1), L.llama_sampler_init_typical(1.0, 1),
        L.llama_sampler_init_temp(1.0), L.llama_sampler_init_penalties(64, 1.0, 0.0, 0.0),
        L.llama_sampler_init_xtc(0.0, 0.1, 1, 0), L.llama_sampler_init_top_n_sigma(-1.0),
        L.llama_sampler_init_logit_bias(10, 0, []))]
    assert names == ["?top-k", "?top-p", "?min-p", "?typical", "?temp", "?penalties", "?xtc",
                     "?top-n-sigma", "?logit-bias"]


def test_default_chain_matches_common_sampling_order():
    chain = S.build_chain(S.SamplerParams(), n_vocab=100)
    assert chain.describe() == ("logits -> ?penalties -> ?dry -> ?top-n-sigma -> top-k -> ?typical"
                                " -> top-p -> min-p -> ?xtc -> temp-ext -> dist")
    m = S.build_chain(S.SamplerParams(mirostat=2), n_vocab=100)
    assert m.describe() == "logits -> temp -> mirostat-v2"


def test_temp_zero_chain_is_greedy():
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = rng.standard_normal(5000).astype(np.float32)
        chain = S.build_chain(S.SamplerParams(temp=0.0), n_vocab=5000)
        assert chain.sample(logits) == int(np.argmax(logits))


def test_logit_bias():
    s = L.llama_sampler_init_logit_bias(4, 2, [L.llama_logit_bias(0, 10.0), (3, -math.inf)])
    chain = S.SamplerChain([s, S.GreedySampler()])
    assert chain.sample(np.array([0, 1, 2, 3], np.float32)) == 0
    cur = TokenDataArray([3, 2], [5.0, 1.0])  # shuffled ids: found by search
    s.apply(cur)
    assert cur.logits[0] == -np.inf


def test_grammar_needs_a_vocab():
    # the grammar sampler itself is tested in test_grammar.py
    with pytest.raises(TypeError, match="vocab"):
        L.llama_sampler_init_grammar(None, "root ::= 'a'", "root")


def test_bad_inputs_raise_clearly():
    with pytest.raises(ValueError, match="one row of logits"):
        TokenDataArray.from_logits(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="same length"):
        TokenDataArray([1, 2], [0.5])
    with pytest.raises(RuntimeError, match="selected no token"):
        S.SamplerChain([S.TopKSampler(3)]).sample(np.zeros(10, np.float32))
    with pytest.raises(ValueError, match="mirostat"):
        S.build_chain(S.SamplerParams(mirostat=3), n_vocab=10)
    with pytest.raises(ValueError, match="finite"):
        S.build_chain(S.SamplerParams(temp=math.nan), n_vocab=10)


def test_logits_row_is_not_modified():
    logits = np.arange(50, dtype=np.float32)
    before = logits.copy()
    params = S.SamplerParams(seed=1, penalty_repeat=1.3, penalty_freq=0.5, top_n_sigma=1.0,
                             logit_bias={3: 5.0})
    chain = S.build_chain(params, n_vocab=50)
    for _ in range(5):
        chain.sample(logits)
    np.testing.assert_array_equal(logits, before)


def test_dry_breakers_from_a_real_vocabulary(smollm2_path):
    from pyllama.generation import load_model, vocab_of

    vocab = vocab_of(load_model(smollm2_path))
    breakers = S.dry_breakers_from_strings(vocab, ["\n", ":"])
    nl = vocab.tokenize("\n", add_special=False, parse_special=False)
    assert len(nl) == 1 and [] in breakers[nl[0]]  # "\n" is a single-token breaker
    # every head token's text contains the breaker or ends with a prefix of it
    for tid in list(breakers)[:50]:
        text = vocab.token_to_piece(tid, True).decode("utf-8", "replace")
        assert "\n" in text or ":" in text
    chain = S.build_chain(S.SamplerParams(seed=1, dry_multiplier=0.8), n_vocab=len(vocab), vocab=vocab)
    assert "-> dry ->" in chain.describe()
    logits = np.zeros(len(vocab), np.float32)
    for t in [5, 6, 7, 5, 6]:
        chain.accept(t)
    # 5 6 7 5 6 -> the token after "5 6" (7) extends a repeat of length 2: penalized
    cur = TokenDataArray.from_logits(logits)
    chain.samplers[1].apply(cur)
    assert cur.logits[7] < 0 and cur.logits[8] == 0
