"""Speculative decoding (Llama(draft_model=...), pyllama.llama_speculative): the output is
the same as without the draft model, greedy or seeded, through create_completion, streaming
and Llama.generate; guesses the sampler does not pick leave the KV cache; bad draft models
fail clearly."""

from __future__ import annotations

import numpy as np
import pytest

from pyllama import Llama
from pyllama.llama import StoppingCriteriaList
from pyllama.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding

TEXT = ("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a "
        "single step. All that glitters is not gold. ")
PROMPT = f"{TEXT}\n{TEXT}\n"


def _pair(path, **kw):
    plain = Llama(str(path), n_ctx=512, verbose=False, **kw)
    spec = Llama(str(path), n_ctx=512, verbose=False, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=4), **kw)
    return plain, spec


def _cache_matches_tokens(llm: Llama) -> bool:
    sess = llm._session
    return sess.ctx.seq_pos_max(0) == len(sess.tokens) - 1


@pytest.fixture(scope="module")
def smollm2_pair(smollm2_path):
    return _pair(smollm2_path)


def test_greedy_output_is_identical_and_drafts_are_used(real_model_path):
    plain, spec = _pair(real_model_path)
    a = plain.create_completion(PROMPT, max_tokens=48, temperature=0.0)
    b = spec.create_completion(PROMPT, max_tokens=48, temperature=0.0)
    assert b["choices"][0]["text"] == a["choices"][0]["text"]
    assert b["usage"] == a["usage"]
    assert b["choices"][0]["finish_reason"] == a["choices"][0]["finish_reason"]
    st = spec._session.stats
    assert st.n_drafted > 0 and 0 < st.n_accepted <= st.n_drafted
    assert spec._session.tokens == plain._session.tokens
    assert _cache_matches_tokens(spec)


def test_seeded_sampling_is_identical(smollm2_pair):
    plain, spec = smollm2_pair
    kw = dict(max_tokens=40, temperature=0.9, top_k=40, top_p=0.95, seed=1234, repeat_penalty=1.1)
    assert spec(PROMPT, **kw)["choices"][0]["text"] == plain(PROMPT, **kw)["choices"][0]["text"]
    assert _cache_matches_tokens(spec)


def test_stream_stopped_early_leaves_a_consistent_cache(smollm2_pair):
    plain, spec = smollm2_pair
    want = plain.create_completion(PROMPT, max_tokens=30, temperature=0.0)["choices"][0]["text"]
    got = "".join(c["choices"][0]["text"] for c in spec.create_completion(PROMPT, max_tokens=30, temperature=0.0,
                                                                          stream=True))
    assert got == want
    it = spec.create_completion(PROMPT, max_tokens=30, temperature=0.0, stream=True)
    for _, _ in zip(range(5), it):
        pass
    it.close()
    assert _cache_matches_tokens(spec)


def test_stop_and_logits_processor_and_stopping_criteria_behave_the_same(smollm2_pair):
    plain, spec = smollm2_pair
    ban = plain.tokenize(b" lazy", add_bos=False)[0]

    def proc(ids, scores):
        scores[ban] = -np.inf
        return scores

    seen = {"plain": [], "spec": []}

    def crit(name):
        def f(ids, logits):
            seen[name].append((len(ids), int(np.argmax(logits))))
            return len(seen[name]) >= 25
        return f

    kw = dict(max_tokens=40, temperature=0.0, stop=["glitters"], logits_processor=[proc])
    a = plain.create_completion(PROMPT, stopping_criteria=StoppingCriteriaList([crit("plain")]), **kw)["choices"][0]
    b = spec.create_completion(PROMPT, stopping_criteria=StoppingCriteriaList([crit("spec")]), **kw)["choices"][0]
    assert (b["text"], b["finish_reason"]) == (a["text"], a["finish_reason"])
    assert seen["spec"] == seen["plain"]


def test_generate_yields_the_same_tokens_and_trims_rejected_guesses(smollm2_pair):
    plain, spec = smollm2_pair
    toks = plain.tokenize(PROMPT.encode())

    def take(llm, n):
        out = []
        for t in llm.generate(toks, temp=0.0):
            out.append(t)
            if len(out) == n:
                break
        return out

    a, b = take(plain, 40), take(spec, 40)
    assert a == b
    # the cache holds the prompt and the generated tokens (the last one yielded may be in
    # it when it was a guess), nothing the sampler did not pick
    n = spec.n_tokens
    assert n in (len(toks) + 39, len(toks) + 40)
    assert list(spec._input_ids) == (toks + b)[:n]
    assert _cache_matches_tokens(spec)
    # and generation continues correctly from there
    assert take(spec, 10) == take(plain, 10)


def test_max_tokens_is_exact_with_long_drafts(smollm2_path):
    spec = Llama(str(smollm2_path), n_ctx=512, verbose=False,
                 draft_model=LlamaPromptLookupDecoding(num_pred_tokens=30))
    for n in (1, 2, 7):
        r = spec.create_completion(PROMPT, max_tokens=n, temperature=0.0)
        assert r["usage"]["completion_tokens"] == n
        assert _cache_matches_tokens(spec)


class _Bad(LlamaDraftModel):
    def __init__(self, out):
        self.out = out

    def __call__(self, input_ids, /, **kwargs):
        return self.out


@pytest.mark.parametrize("out,exc,match", [
    (np.array([10**7]), ValueError, "not a valid id"),
    (np.array([-1]), ValueError, "not a valid id"),
    (np.array([[1, 2]]), ValueError, "1-D"),
    (np.array([0.5]), TypeError, "integer"),
])
def test_bad_draft_output_is_a_clear_error(smollm2_path, out, exc, match):
    llm = Llama(str(smollm2_path), n_ctx=256, verbose=False, draft_model=_Bad(out))
    with pytest.raises(exc, match=match):
        llm.create_completion(PROMPT, max_tokens=4, temperature=0.0)


def test_draft_model_must_be_callable(smollm2_path):
    with pytest.raises(TypeError, match="draft_model"):
        Llama(str(smollm2_path), n_ctx=256, verbose=False, draft_model=object())


def test_draft_model_is_abstract_and_lookup_checks_its_parameters():
    with pytest.raises(TypeError):
        LlamaDraftModel()
    with pytest.raises(ValueError, match="num_pred_tokens"):
        LlamaPromptLookupDecoding(num_pred_tokens=0)
    with pytest.raises(TypeError, match="unexpected keyword"):
        LlamaPromptLookupDecoding()(np.array([1, 2, 1], dtype=np.intc), foo=1)
    got = LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=3)(np.array([5, 6, 7, 8, 5, 6], dtype=np.intc))
    assert got.tolist() == [7, 8, 5]


def test_logprobs_with_a_draft_model_match_logits_all(smollm2_path):
    """llama-cpp-python turns logits_all on with a draft model, so logprobs= works; the
    log-probabilities are those of the rows each token was sampled from."""
    plain = Llama(str(smollm2_path), n_ctx=512, verbose=False, logits_all=True)
    spec = Llama(str(smollm2_path), n_ctx=512, verbose=False, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=4))
    a = plain.create_completion(PROMPT, max_tokens=20, temperature=0.0, logprobs=3)["choices"][0]["logprobs"]
    b = spec.create_completion(PROMPT, max_tokens=20, temperature=0.0, logprobs=3)["choices"][0]["logprobs"]
    assert spec._session.stats.n_accepted > 0
    assert b == a


def test_generate_logits_processors_see_the_same_input_ids(smollm2_pair):
    plain, spec = smollm2_pair
    toks = plain.tokenize(PROMPT.encode())
    from pyllama.llama import LogitsProcessorList

    def run(llm):
        seen = []

        def proc(ids, scores):
            seen.append(len(ids))
            return scores

        out = []
        for t in llm.generate(toks, temp=0.0, logits_processor=LogitsProcessorList([proc])):
            out.append(t)
            if len(out) == 25:
                break
        return out, seen

    a, b = run(plain), run(spec)
    assert a == b and b[1] == list(range(len(toks), len(toks) + 25))
