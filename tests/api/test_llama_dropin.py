"""pyllama.Llama as a drop-in for llama-cpp-python's Llama (issue 12): every entry point
takes exactly llama-cpp-python 0.3.36's parameters (an unknown keyword is a TypeError), a
parameter pyllama cannot honour yet raises NotImplementedError saying so, GPU-only ones log
a warning once, and the parameters that are implemented have an effect."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from pyllama import Llama
from pyllama.llama import LogitsProcessorList, MinTokensLogitsProcessor, StoppingCriteriaList

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def llm(smollm2_path):
    return Llama(str(smollm2_path), n_ctx=256, verbose=False)


@pytest.fixture(scope="module")
def llm_all(smollm2_path):
    return Llama(str(smollm2_path), n_ctx=256, logits_all=True, verbose=False)


def greedy(llm, prompt=PROMPT, n=6, **kw):
    return llm.create_completion(prompt, max_tokens=n, temperature=0.0, **kw)["choices"][0]


# -- unknown keywords ------------------------------------------------------------------------

ENTRY_POINTS = {
    "__call__": lambda m: m(PROMPT, max_tokens=1, n_probs=3),
    "create_completion": lambda m: m.create_completion(PROMPT, max_tokens=1, stop_sequences=["x"]),
    "create_chat_completion": lambda m: m.create_chat_completion(CHAT, max_tokens=1, add_generation_prompt=True),
    "generate": lambda m: m.generate([1, 2], temperature=0.0),
    "sample": lambda m: m.sample(temperature=0.0),
    "eval": lambda m: m.eval([1], logits_all=True),
    "tokenize": lambda m: m.tokenize(b"hi", add_eos=True),
    "detokenize": lambda m: m.detokenize([1], skip_special=True),
    "embed": lambda m: m.embed("hi", pooling="mean"),
    "create_embedding": lambda m: m.create_embedding("hi", normalize=True),
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_unknown_keyword_is_a_type_error(llm, name):
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        ENTRY_POINTS[name](llm)


@pytest.mark.parametrize("kw", [{"n_ctxx": 512}, {"n_probs": 5}, {"grammar": None}, {"temperature": 0.2}])
def test_unknown_constructor_keyword_is_a_type_error(smollm2_path, kw):
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        Llama(str(smollm2_path), verbose=False, **kw)


# -- refused until built ---------------------------------------------------------------------

REFUSED_INIT = [
    ({"spm_infill": True}, "fill-in-the-middle"),
    ({"yarn_ext_factor": 0.5}, "YaRN"),
    ({"yarn_orig_ctx": 4096}, "YaRN"),
]


@pytest.mark.parametrize("kw,why", REFUSED_INIT, ids=[next(iter(k)) + "-" + str(i) for i, (k, _) in enumerate(REFUSED_INIT)])
def test_refused_constructor_parameters_say_why(smollm2_path, kw, why):
    with pytest.raises(NotImplementedError, match=why):
        Llama(str(smollm2_path), verbose=False, **kw)


REFUSED_CALLS = {
    "completion-tfs_z": (lambda m: m.create_completion(PROMPT, tfs_z=0.9), "tail-free"),
    "chat-tfs_z": (lambda m: m.create_chat_completion(CHAT, tfs_z=0.5), "tail-free"),
    "sample-penalize_nl": (lambda m: m.sample(penalize_nl=False), "newlines"),
}


@pytest.mark.parametrize("name", sorted(REFUSED_CALLS))
def test_refused_call_parameters_say_why(llm, name):
    fn, why = REFUSED_CALLS[name]
    with pytest.raises(NotImplementedError, match=why):
        fn(llm)


BAD_GRAMMAR_CALLS = {
    "completion": lambda m: m.create_completion(PROMPT, grammar=object()),
    "completion-stream": lambda m: m.create_completion(PROMPT, stream=True, grammar=object()),
    "call": lambda m: m(PROMPT, grammar=object()),
    "chat": lambda m: m.create_chat_completion(CHAT, grammar=object()),
    "generate": lambda m: m.generate([1], grammar=object()),
}


@pytest.mark.parametrize("name", sorted(BAD_GRAMMAR_CALLS))
def test_grammar_must_be_a_llama_grammar(llm, name):
    with pytest.raises(TypeError, match="LlamaGrammar"):
        BAD_GRAMMAR_CALLS[name](llm)


def test_logprobs_without_logits_all_is_refused_as_in_llama_cpp_python(llm):
    with pytest.raises(ValueError, match="logits_all"):
        llm.create_completion(PROMPT, max_tokens=1, logprobs=3)


# -- defaults are silent; GPU-only parameters warn once --------------------------------------

def test_defaults_and_common_values_are_accepted_silently(smollm2_path, caplog, capfd):
    caplog.set_level(logging.DEBUG, logger="pyllama")
    m = Llama(str(smollm2_path), n_gpu_layers=-1, n_ctx=256, verbose=False, seed=-1, offload_kqv=True,
              use_mmap=True, use_mlock=False, last_n_tokens_size=64, chat_format=None, numa=False)
    m.create_completion(PROMPT, max_tokens=2, stop=[], stopping_criteria=None, logits_processor=None,
                        grammar=None, tfs_z=1.0)
    m.create_chat_completion(CHAT, max_tokens=2, tools=None, response_format={"type": "text"}, logprobs=False)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_gpu_only_parameters_log_a_warning_once(smollm2_path, caplog):
    import pyllama.llama as L

    L._warned.discard("n_gpu_layers")
    with caplog.at_level(logging.WARNING, logger="pyllama"):
        Llama(str(smollm2_path), n_gpu_layers=20, n_ctx=256, verbose=False)
        Llama(str(smollm2_path), n_gpu_layers=20, n_ctx=256, verbose=False)
    msgs = [r.getMessage() for r in caplog.records if "n_gpu_layers" in r.getMessage()]
    assert len(msgs) == 1 and "CPU" in msgs[0]


def test_verbose_true_reports_the_load_on_stderr(smollm2_path, capfd):
    Llama(str(smollm2_path), n_ctx=256, verbose=True)
    out, err = capfd.readouterr()
    assert out == "" and "loaded" in err


# -- implemented parameters have an effect ---------------------------------------------------

def test_logits_processor_banning_the_greedy_token_changes_the_output(llm):
    base = greedy(llm, n=1)["text"]
    first = llm.tokenize(base.encode(), add_bos=False)[0]
    seen = []

    def ban(input_ids, scores):
        assert input_ids.dtype == np.intc and scores.dtype == np.single and scores.shape == (llm.n_vocab(),)
        seen.append(len(input_ids))
        scores[first] = -np.inf
        return scores

    out = greedy(llm, n=1, logits_processor=LogitsProcessorList([ban]))["text"]
    assert out != base and seen == [len(llm.tokenize(PROMPT.encode()))]


def test_logits_processor_works_in_chat_completion(llm):
    base = llm.create_chat_completion(CHAT, max_tokens=1, temperature=0.0)["choices"][0]["message"]["content"]
    ban_all_but = llm.tokenize(b" banana", add_bos=False)[0]

    def only(input_ids, scores):
        keep = scores[ban_all_but]
        scores[:] = -np.inf
        scores[ban_all_but] = keep
        return scores

    r = llm.create_chat_completion(CHAT, max_tokens=1, temperature=0.0, logits_processor=LogitsProcessorList([only]))
    assert r["choices"][0]["message"]["content"] == " banana" != base


def test_stopping_criteria_stop_generation(llm):
    full = greedy(llm, n=8)
    n_prompt = len(llm.tokenize(PROMPT.encode()))
    calls = []

    def after_two(input_ids, logits):
        calls.append(len(input_ids))
        assert logits.shape == (llm.n_vocab(),)
        return len(input_ids) >= n_prompt + 2

    cut = greedy(llm, n=8, stopping_criteria=StoppingCriteriaList([after_two]))
    assert cut["finish_reason"] == "stop" and full["finish_reason"] == "length"
    assert full["text"].startswith(cut["text"]) and len(cut["text"]) < len(full["text"])
    assert llm.tokenize(cut["text"].encode(), add_bos=False) == llm.tokenize(full["text"].encode(), add_bos=False)[:2]
    assert calls == [n_prompt, n_prompt + 1, n_prompt + 2]


def test_min_tokens_logits_processor_forbids_eos(llm):
    proc = MinTokensLogitsProcessor(3, llm.token_eos())
    s = np.zeros(llm.n_vocab(), dtype=np.single)
    assert proc(np.arange(5, dtype=np.intc), s)[llm.token_eos()] == -np.inf
    assert proc(np.arange(8, dtype=np.intc), np.zeros_like(s))[llm.token_eos()] == 0.0


def test_seed_semantics(llm):
    kw = dict(max_tokens=8, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    a = llm(PROMPT, seed=7, **kw)["choices"][0]["text"]
    b = llm(PROMPT, seed=7, **kw)["choices"][0]["text"]
    assert a == b
    # without a seed each call draws the next seed from the current one: calls differ, and
    # set_seed replays the sequence
    llm.set_seed(1337)
    x1 = llm(PROMPT, **kw)["choices"][0]["text"]
    x2 = llm(PROMPT, **kw)["choices"][0]["text"]
    llm.set_seed(1337)
    x3 = llm(PROMPT, **kw)["choices"][0]["text"]
    assert x1 != x2 and x1 == x3


def test_logprobs_with_logits_all(llm_all):
    r = llm_all.create_completion(PROMPT, max_tokens=3, temperature=0.0, logprobs=2)["choices"][0]
    lp = r["logprobs"]
    assert "".join(lp["tokens"]) == r["text"]
    assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 3
    assert lp["text_offset"][0] == len(PROMPT)
    for tok, p, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert p <= 0.0 and 2 <= len(top) <= 3
        assert top[tok] == p == max(top.values())  # greedy: the chosen token is the most likely


def test_eval_sample_generate_match_create_completion(llm, llm_all):
    toks = llm.tokenize(PROMPT.encode())
    expected = llm.tokenize(greedy(llm, n=3)["text"].encode(), add_bos=False)
    llm.reset()
    llm.eval(toks)
    assert llm.n_tokens == len(toks) and llm.input_ids[: llm.n_tokens].tolist() == toks
    assert llm.sample(temp=0.0) == expected[0]
    out = []
    for t in llm.generate(toks, temp=0.0):  # the cached prompt is reused, not reset
        out.append(t)
        if len(out) == 3:
            break
    assert out == expected and llm.n_tokens == len(toks) + 2
    # with logits_all, every evaluated position has its logits in scores
    llm_all.reset()
    llm_all.eval(toks)
    assert np.argmax(llm_all.scores[len(toks) - 1]) == expected[0]
    assert llm_all.sample(temp=0.0, idx=len(toks) - 1) == expected[0]
    with pytest.raises(ValueError, match="logits_all"):
        llm.sample(temp=0.0, idx=0)


def test_vocab_only_tokenizes_and_refuses_to_generate(smollm2_path, llm):
    v = Llama(str(smollm2_path), vocab_only=True, verbose=False)
    assert v.tokenize(b"Hello world") == llm.tokenize(b"Hello world")
    assert v.detokenize(v.tokenize(b"Hello world", add_bos=False)) == b"Hello world"
    with pytest.raises(RuntimeError, match="vocab_only"):
        v.create_completion(PROMPT)


def test_chat_handler_is_called_with_llama_cpp_python_arguments(smollm2_path):
    got = {}

    def handler(**kw):
        got.update(kw)
        return "answer"

    m = Llama(str(smollm2_path), n_ctx=256, chat_handler=handler, verbose=False)
    assert m.create_chat_completion(CHAT, temperature=0.5) == "answer"
    assert got["llama"] is m and got["messages"] == CHAT and got["temperature"] == 0.5


def test_unknown_chat_format_is_an_error(smollm2_path):
    m = Llama(str(smollm2_path), n_ctx=256, chat_format="no-such-format", verbose=False)
    with pytest.raises(ValueError, match="unknown chat_format"):
        m.create_chat_completion(CHAT, max_tokens=1)
    m2 = Llama(str(smollm2_path), n_ctx=256, chat_format="llama-2", verbose=False)
    assert "[INST]" in m2._render_chat(CHAT)


def test_pickle_round_trip(llm):
    import pickle

    m = pickle.loads(pickle.dumps(llm))
    assert m.n_ctx() == llm.n_ctx() and greedy(m, n=3)["text"] == greedy(llm, n=3)["text"]


def test_chat_json_schema_response_format(llm):
    """A small schema through response_format (both shapes) gives json.loads-able output
    that fits it."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer"}}, "required": ["name", "age"]}
    for rf in ({"type": "json_object", "schema": schema}, {"type": "json_schema", "json_schema": {"schema": schema}}):
        out = llm.create_chat_completion(CHAT, response_format=rf, max_tokens=48, temperature=0.0)
        doc = json.loads(out["choices"][0]["message"]["content"])
        assert set(doc) == {"name", "age"} and isinstance(doc["age"], int) and isinstance(doc["name"], str)


def test_chat_tools(llm):
    """tools= with llama.cpp's generic format on SmolLM2 (its template has no tool support):
    tool_choice "required" gives a parsed call, streamed as one tool_calls delta too."""
    import json

    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}]
    msgs = [{"role": "user", "content": "What time is it in Rome?"}]
    r = llm.create_chat_completion(msgs, tools=tools, tool_choice="required", max_tokens=60, temperature=0)
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_time" and set(json.loads(call["function"]["arguments"])) == {"city"}
    chunks = list(llm.create_chat_completion(msgs, tools=tools, tool_choice="required", max_tokens=60,
                                             temperature=0, stream=True))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert [c["function"]["arguments"] for c in calls] == [call["function"]["arguments"]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    with pytest.raises(ValueError, match="names no function"):
        llm.create_chat_completion(msgs, tools=tools, tool_choice={"type": "function", "function": {"name": "x"}})


def test_chat_legacy_functions(llm):
    """functions= / function_call= (OpenAI's legacy shape) as tools / tool_choice, as
    llama-cpp-python converts them: a forced call comes back as tool_calls and function_call."""
    fn = {"name": "get_time", "parameters": {"type": "object", "properties": {"city": {"type": "string",
                                                                                      "maxLength": 20}},
                                             "required": ["city"]}}
    msgs = [{"role": "user", "content": "What time is it in Rome?"}]
    r = llm.create_chat_completion(msgs, functions=[fn], function_call={"name": "get_time"}, max_tokens=60,
                                   temperature=0)
    m = r["choices"][0]["message"]
    assert r["choices"][0]["finish_reason"] == "tool_calls"
    assert m["function_call"] == m["tool_calls"][0]["function"] and m["function_call"]["name"] == "get_time"
    same = llm.create_chat_completion(msgs, tools=[{"type": "function", "function": fn}],
                                      tool_choice={"type": "function", "function": {"name": "get_time"}},
                                      max_tokens=60, temperature=0)
    assert same["choices"][0]["message"]["tool_calls"][0]["function"] == m["function_call"]
    with pytest.raises(ValueError, match="not both"):
        llm.create_chat_completion(msgs, functions=[fn], tools=[{"type": "function", "function": fn}])
    with pytest.raises(ValueError, match="needs functions"):
        llm.create_chat_completion(msgs, function_call="auto")
    with pytest.raises(ValueError, match="function_call must be"):
        llm.create_chat_completion(msgs, functions=[fn], function_call="always")


def test_embed_needs_embedding_mode(llm):
    with pytest.raises(RuntimeError, match="embedding=True"):
        llm.embed("hi")


def test_embed_and_create_embedding(smollm2_path):
    """Llama(embedding=True): per-token vectors with the decoder's pooling (none), pooled
    with pooling_type; several inputs packed in one decode give what each gives alone."""
    import numpy as np

    from pyllama import Context, Model
    from pyllama.generation import vocab_of

    e = Llama(str(smollm2_path), embedding=True, pooling_type=1, verbose=False, n_ctx=512)
    one = e.embed("Hello world")
    assert isinstance(one, list) and len(one) == e.n_embd()
    many = e.embed(["Hello world", "A second, longer sentence to embed.", "x"], normalize=True)
    assert np.allclose(np.asarray(many[0]), np.asarray(one) / np.linalg.norm(one), atol=1e-6)
    assert all(abs(np.linalg.norm(v) - 1) < 1e-5 for v in many)
    # the same as pooling by hand over an embeddings context's per-token hidden states
    m = Model.load(smollm2_path)
    toks = vocab_of(m).tokenize("A second, longer sentence to embed.", add_special=True)
    ctx = Context(m, n_ctx=512, embeddings=True)
    ctx.decode(toks)
    want = ctx.embeddings.mean(axis=0)
    got = np.asarray(e.embed("A second, longer sentence to embed."))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    r = e.create_embedding(["a", "b c"])
    assert [d["index"] for d in r["data"]] == [0, 1] and r["usage"]["prompt_tokens"] > 0
    none = Llama(str(smollm2_path), embedding=True, verbose=False, n_ctx=512)
    per_token = none.embed("Hello world")
    assert len(per_token) == len(none.tokenize(b"Hello world"))
    assert len(per_token[0]) == none.n_embd()


@pytest.mark.parametrize("kind", ["ram", "disk"])
def test_prompt_cache(smollm2_path, tmp_path, kind, caplog):
    """A second Llama sharing the cache starts from the first one's saved state (load_state
    called, only the new tokens decoded) and completes exactly as a fresh Llama does."""
    from pyllama.llama_cache import LlamaDiskCache, LlamaRAMCache

    make = (lambda: LlamaRAMCache()) if kind == "ram" else (lambda: LlamaDiskCache(str(tmp_path / "c")))
    prompt = "The history of the Roman Empire begins with"
    more = prompt + " the founding of Rome, when"
    fresh = Llama(str(smollm2_path), n_ctx=256, verbose=False, n_threads=2)
    want = fresh.create_completion(more, max_tokens=8, temperature=0)["choices"][0]["text"]
    writer = Llama(str(smollm2_path), n_ctx=256, verbose=False, n_threads=2)
    writer.set_cache(make())
    writer.create_completion(prompt, max_tokens=4, temperature=0)
    reader = Llama(str(smollm2_path), n_ctx=256, verbose=False, n_threads=2)
    cache = make()  # the disk cache reopened from its directory
    reader.set_cache(cache if kind == "disk" else writer.cache)
    loads = []
    orig = reader.load_state
    reader.load_state = lambda st: (loads.append(st.n_tokens), orig(st))
    got = reader.create_completion(more, max_tokens=8, temperature=0)["choices"][0]["text"]
    assert got == want and len(loads) == 1 and loads[0] > 5
    assert reader._session.stats.n_reused >= len(reader.tokenize(prompt.encode())) - 1
    with pytest.raises(TypeError):
        reader.set_cache(object())
    if kind == "disk":
        files = list((tmp_path / "c").glob("*.pyllama-cache"))
        assert len(files) == 2
        for f in files:  # a damaged file is dropped, never loaded
            f.write_bytes(f.read_bytes()[:-10] + b"0123456789")
        reader.load_state = orig
        with pytest.raises(KeyError):
            cache[reader.tokenize(more.encode())]
        assert "damaged" in caplog.text and not list((tmp_path / "c").glob("*.pyllama-cache"))
    else:
        small = LlamaRAMCache(capacity_bytes=1)
        small[[1, 2]] = writer.save_state()
        assert len(small.cache_state) == 0  # over capacity: dropped
