"""Bad sampling arguments get a clear TypeError / ValueError naming the parameter, and no
sampler raises on an empty or single-candidate array (whatever it was fed before).

Covers logit_bias (pyllama.Llama's create_completion / create_chat_completion, SamplerParams,
LogitBiasSampler, llama_sampler_init_logit_bias), stop (Llama.__call__ / create_completion /
create_chat_completion) and every sampler class on degenerate candidate arrays."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyllama import Llama
from pyllama import llama_api as L
from pyllama import sampling as S
from pyllama.sampling import TokenDataArray


@pytest.fixture(scope="module")
def tiny_llama_path(tmp_path_factory):
    """tests/data/make_tiny.py's tiny llama, plus one BPE merge (as in test_generate.py)."""
    import importlib.util

    import gguf

    spec = importlib.util.spec_from_file_location("make_tiny", Path(__file__).parents[1] / "data" / "make_tiny.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    orig = gguf.GGUFWriter.add_token_merges
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf.GGUFWriter, "add_token_merges", lambda self, merges: orig(self, list(merges) or ["< t"]))
        return mod.write_tiny("llama", tmp_path_factory.mktemp("tiny_args"))


@pytest.fixture(scope="module")
def llm(tiny_llama_path):
    return Llama(str(tiny_llama_path), n_ctx=64, seed=1)


PROMPT = [1, 40, 41, 42]
CHAT = [{"role": "user", "content": "hi"}]


# ---------------------------------------------------------------------------------------
# logit_bias


BAD_BIAS = [
    ({"a": 1.0}, ValueError, r"logit_bias: key 'a' is not a token id"),
    ({" ": 1.0}, ValueError, r"key ' ' is not a token id"),
    ({"1.5": 1.0}, ValueError, r"key '1.5' is not a token id"),
    ({1.5: 1.0}, TypeError, r"key 1.5 \(float\) is not a token id"),
    ({None: 1.0}, TypeError, r"key None \(NoneType\) is not a token id"),
    ({True: 1.0}, TypeError, r"key True \(bool\) is not a token id"),
    ({5: "x"}, TypeError, r"the bias of token 5 must be a number, got str 'x'"),
    ({"5": "1.0"}, TypeError, r"the bias of token 5 must be a number, got str"),
    ({5: None}, TypeError, r"the bias of token 5 must be a number, got NoneType"),
    ({5: [1.0]}, TypeError, r"the bias of token 5 must be a number"),
    ({5: math.nan}, ValueError, r"the bias of token 5 is NaN"),
    ({-1: 1.0}, ValueError, r"token id -1 is out of range"),
    ({"-3": 1.0}, ValueError, r"token id -3 is out of range"),
]


@pytest.mark.parametrize("bias,exc,msg", BAD_BIAS)
def test_llama_logit_bias_errors_name_the_entry(llm, bias, exc, msg):
    with pytest.raises(exc, match=msg):
        llm.create_completion(PROMPT, max_tokens=1, logit_bias=bias)
    with pytest.raises(exc, match=msg):
        llm(PROMPT, max_tokens=1, logit_bias=bias)
    with pytest.raises(exc, match=msg):  # before the chat template or the prompt is touched
        llm.create_chat_completion(CHAT, max_tokens=1, logit_bias=bias)
    with pytest.raises(exc, match=msg):  # stream=True checks at the call, not at next()
        llm.create_completion(PROMPT, max_tokens=1, logit_bias=bias, stream=True)


def test_llama_logit_bias_out_of_vocabulary_and_not_a_dict(llm):
    n = llm.n_vocab()
    with pytest.raises(ValueError, match=rf"token id {n} is out of range \(the vocabulary has {n} tokens"):
        llm.create_completion(PROMPT, max_tokens=1, logit_bias={n: 1.0})
    for bad in (5, "5", [(5, 1.0)], 1.0):
        with pytest.raises(TypeError, match=r"logit_bias must be a dict \{token_id: bias\}"):
            llm.create_completion(PROMPT, max_tokens=1, logit_bias=bad)


def test_llama_logit_bias_accepts_ints_digit_strings_and_infinities(llm):
    """JSON object keys are strings: '7' means token 7, as llama-cpp-python's int(key)."""
    def first(bias):
        out = llm.create_completion(PROMPT, max_tokens=1, temperature=0.0, logit_bias=bias)
        return out["choices"][0]["text"]

    forced = first({7: 1e4})
    assert first({"7": 1e4}) == first({" 7 ": 1e4}) == first({np.int64(7): 1e4}) == forced
    assert first({7: 1e4, 8: -math.inf}) == forced
    assert first(None) == first({})


def test_sampler_level_logit_bias_checks():
    chain = S.build_chain(S.SamplerParams(temp=0.0, logit_bias={"3": 50.0}), n_vocab=10)
    assert chain.sample(np.zeros(10, np.float32)) == 3
    with pytest.raises(ValueError, match=r"key 'a' is not a token id"):
        S.build_chain(S.SamplerParams(logit_bias={"a": 1}), n_vocab=10)
    with pytest.raises(ValueError, match=r"token id 10 is out of range"):
        S.LogitBiasSampler(10, {10: 1.0})
    with pytest.raises(TypeError, match=r"logit_bias\[0\] must be a \(token_id, bias\) pair"):
        S.LogitBiasSampler(10, [5])
    with pytest.raises(TypeError, match=r"logit_bias must be a dict"):
        S.LogitBiasSampler(10, 5)
    # a huge finite bias is float32 +inf, as C's conversion (no overflow warning)
    assert S.LogitBiasSampler(10, {1: 1e300}).logit_bias == [(1, math.inf)]
    with pytest.raises(ValueError, match=r"token id 12 is out of range"):
        L.llama_sampler_init_logit_bias(10, 1, [L.llama_logit_bias(12, 1.0)])
    with pytest.raises(TypeError, match=r"the bias of token 3 must be a number"):
        L.llama_sampler_init_logit_bias(10, 1, [(3, "x")])
    with pytest.raises(ValueError, match=r"the bias of token 3 is NaN"):
        L.llama_sampler_init_logit_bias(10, 1, [L.llama_logit_bias(3, math.nan)])
    # entries past n_logit_bias are not looked at (llama.h's count), as before
    s = L.llama_sampler_init_logit_bias(10, 1, [(2, 1.0), (99, 1.0)])
    assert s.logit_bias == [(2, 1.0)]


# ---------------------------------------------------------------------------------------
# stop


@pytest.mark.parametrize("stop,msg", [
    (5, r"stop must be a str or a list of str, got int 5"),
    (b"\n", r"stop must be a str or a list of str, got bytes"),
    ({"a"}, r"stop must be a str or a list of str, got set"),
    ([".", 5], r"stop\[1\] must be a str, got int 5"),
    (["a", None], r"stop\[1\] must be a str, got NoneType"),
    ([b"x"], r"stop\[0\] must be a str, got bytes"),
])
def test_stop_must_be_str_or_list_of_str(llm, stop, msg):
    with pytest.raises(TypeError, match=msg):
        llm(PROMPT, max_tokens=2, stop=stop)
    with pytest.raises(TypeError, match=msg):
        llm.create_completion(PROMPT, max_tokens=2, stop=stop)
    with pytest.raises(TypeError, match=msg):  # at the call, not at the first chunk
        llm.create_completion(PROMPT, max_tokens=2, stop=stop, stream=True)
    with pytest.raises(TypeError, match=msg):
        llm.create_chat_completion(CHAT, max_tokens=2, stop=stop)
    with pytest.raises(TypeError, match=msg):
        llm.create_chat_completion(CHAT, max_tokens=2, stop=stop, stream=True)


@pytest.mark.parametrize("stop", [None, "", "x", [], ["x", ""], ("x", "y")])
def test_valid_stop_forms_still_work(llm, stop):
    out = llm.create_completion(PROMPT, max_tokens=2, temperature=0.0, stop=stop)
    assert out["choices"][0]["finish_reason"] in ("stop", "length")


# ---------------------------------------------------------------------------------------
# DRY, penalties: fed token -1 (LLAMA_TOKEN_NULL) or ids beyond the array, then an empty one


def test_dry_with_token_null_in_its_history_on_an_empty_array():
    """Used to raise IndexError: the "position == id" shortcut indexed ids[-1] of an empty
    array."""
    dry = S.DrySampler(0.8, 1.75, 2, 64, {})
    for t in [1, 2, -1, 1, 2, -1, 1, 2]:
        L.llama_sampler_accept(dry, t)
    cur = TokenDataArray([], [])
    L.llama_sampler_apply(dry, cur)
    assert cur.size == 0
    # and on a real array the -1 repeat penalizes nothing (no token has id -1)
    cur = TokenDataArray(np.arange(5), np.zeros(5))
    dry.apply(cur)
    np.testing.assert_array_equal(cur.logits, np.zeros(5, np.float32))


def test_penalties_with_token_null_on_an_empty_array():
    pen = S.PenaltiesSampler(64, 1.3, 0.5, 0.5)
    pen.accept(-1)
    cur = TokenDataArray([], [])
    pen.apply(cur)
    assert cur.size == 0
    cur = TokenDataArray(np.arange(3), [1.0, 2.0, 3.0])
    pen.apply(cur)
    np.testing.assert_array_equal(cur.logits, np.array([1.0, 2.0, 3.0], np.float32))


def test_dry_breakers_must_be_strings():
    with pytest.raises(TypeError, match=r"dry sequence breaker 1 must be a str, got int 5"):
        S.init_dry(None, 0.8, 1.75, 2, 64, ["\n", 5])
    with pytest.raises(TypeError, match=r"must be a list of str, got the single str"):
        S.init_dry(None, 0.8, 1.75, 2, 64, "\n")


# ---------------------------------------------------------------------------------------
# every sampler on empty and single-candidate arrays


def _all_samplers(d):
    """One of each sampler class with parameters drawn by hypothesis (``d`` = data())."""
    f = lambda lo, hi: d.draw(st.floats(lo, hi))  # noqa: E731
    i = lambda lo, hi: d.draw(st.integers(lo, hi))  # noqa: E731
    seed = i(0, 2**32 - 2)
    breakers = d.draw(st.dictionaries(st.integers(-2, 12), st.lists(st.lists(st.integers(-2, 12), max_size=3),
                                                                    max_size=2), max_size=3))
    return [
        S.GreedySampler(), S.DistSampler(seed), S.TopKSampler(i(-1, 5)),
        S.TopPSampler(f(0.0, 1.0), i(0, 3)), S.MinPSampler(f(0.0, 1.0), i(0, 3)),
        S.TypicalSampler(f(0.0, 1.0), i(0, 3)), S.TempSampler(f(0.0, 3.0)),
        S.TempExtSampler(f(0.0, 3.0), f(0.0, 1.0), f(0.0, 2.0)),
        S.XTCSampler(f(0.0, 1.0), f(0.0, 0.5), i(0, 3), seed), S.TopNSigmaSampler(f(-1.0, 3.0)),
        S.MirostatSampler(i(1, 20), seed, f(0.0, 10.0), f(0.0, 1.0), i(-1, 100)),
        S.MirostatV2Sampler(seed, f(0.0, 10.0), f(0.0, 1.0)),
        S.PenaltiesSampler(i(0, 64), f(0.5, 2.0), f(-1.0, 1.0), f(-1.0, 1.0)),
        S.DrySampler(f(0.0, 2.0), f(1.0, 3.0), i(0, 3), i(0, 64), breakers),
        S.LogitBiasSampler(i(12, 20), d.draw(st.dictionaries(st.integers(0, 11),
                                                             st.floats(allow_nan=False), max_size=3))),
        S.EmptySampler("?x"),
    ]


logit_values = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32),
                         st.sampled_from([0.0, 1e38, -1e38, math.inf, -math.inf, math.nan]))


@settings(max_examples=150, deadline=None)
@given(st.data(), st.lists(st.integers(-3, 40), max_size=12), st.integers(0, 1),
       st.lists(logit_values, min_size=1, max_size=1), st.integers(-2, 40))
def test_no_sampler_raises_on_empty_or_single_candidate_arrays(data, history, rounds, logit, tid):
    """Whatever was accepted before (token -1, ids beyond the array), applying any sampler to
    an empty array or a one-candidate array (any logit: NaN, +-inf, huge; any id) raises
    nothing (pytest turns numpy warnings into errors too) and leaves a valid selection."""
    for smpl in _all_samplers(data):
        for _ in range(rounds + 1):
            for t in history:
                L.llama_sampler_accept(smpl, t)
            for cur in (TokenDataArray([], []), TokenDataArray([tid], logit)):
                n = cur.size
                L.llama_sampler_apply(smpl, cur)
                assert cur.size <= n, smpl
                assert cur.selected == -1 or 0 <= cur.selected < cur.size, smpl
                if cur.size:
                    assert cur.ids[0] == tid
            L.llama_sampler_reset(smpl)
        smpl.clone()


@settings(max_examples=60, deadline=None)
@given(st.data(), st.lists(logit_values, min_size=0, max_size=1))
def test_chains_on_tiny_rows(data, row):
    """build_chain's chains on a 0- or 1-token row: one token comes back, or the documented
    RuntimeError says the chain selected none (an empty row has nothing to select)."""
    params = S.SamplerParams(
        seed=data.draw(st.integers(0, 2**32 - 2)), temp=data.draw(st.floats(0.0, 2.0)),
        top_k=data.draw(st.integers(0, 5)), mirostat=data.draw(st.integers(0, 2)),
        penalty_repeat=data.draw(st.floats(0.5, 2.0)), dry_multiplier=data.draw(st.floats(0.0, 1.0)),
        top_n_sigma=data.draw(st.floats(-1.0, 2.0)), xtc_probability=data.draw(st.floats(0.0, 1.0)),
        dynatemp_range=data.draw(st.floats(0.0, 1.0)))
    chain = S.build_chain(params, n_vocab=max(1, len(row)))
    logits = np.array(row, np.float32)
    for _ in range(3):
        if len(row) == 0:
            with pytest.raises(RuntimeError, match="selected no token"):
                chain.sample(logits)
        else:
            assert chain.sample(logits) == 0
