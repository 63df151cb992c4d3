"""pyllama.internals (llama-cpp-python's ``llama_cpp._internals`` object layer) on real
models: llama-cpp-python's test_real_model with the local Qwen2.5-Coder's token ids, and
every wrapper method doing what its llama.h function does."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

import pyllama.llama_api as C
from pyllama import internals
from pyllama.llama_grammar import LlamaGrammar


def _cparams(n=16):
    p = C.llama_context_default_params()
    p.n_ctx = n
    p.n_batch = n
    p.n_ubatch = n
    return p


@pytest.fixture(scope="module")
def smol(smollm2_path):
    model = internals.LlamaModel(path_model=str(smollm2_path), params=C.llama_model_default_params(), verbose=False)
    yield model
    model.close()


def test_real_model_as_llama_cpp_python_tests_it(qwen25_path):
    """llama-cpp-python 0.3.36's tests/test_llama.py::test_real_model, Qwen2.5's ids."""
    params = C.llama_model_default_params()
    params.load_mode = C.LLAMA_LOAD_MODE_MMAP_MLOCK if C.llama_supports_mlock() else C.LLAMA_LOAD_MODE_MMAP
    params.check_tensors = False
    model = internals.LlamaModel(path_model=str(qwen25_path), params=params)
    cparams = _cparams(16)
    cparams.n_threads = multiprocessing.cpu_count()
    cparams.n_threads_batch = multiprocessing.cpu_count()
    cparams.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_ENABLED
    context = internals.LlamaContext(model=model, params=cparams)
    assert model.tokenize(b"Hello, world!", add_bos=True, special=True) == [9707, 11, 1879, 0]
    tokens = model.tokenize(b"The quick brown fox jumps over the lazy dog. The quick brown fox jumps ",
                            add_bos=True, special=True)
    n_prompt = len(tokens)
    batch = internals.LlamaBatch(n_tokens=len(tokens), embd=0, n_seq_max=1)
    sampler = internals.LlamaSampler()
    sampler.add_top_k(50)
    sampler.add_top_p(0.9, 1)
    sampler.add_temp(0.8)
    sampler.add_dist(1337)
    result = tokens
    n_eval = 0
    for _ in range(4):
        batch.set_batch(tokens, n_past=n_eval, logits_all=False)
        context.decode(batch)
        n_eval += len(tokens)
        tokens = [sampler.sample(context, -1)]
        result += tokens
    output = result[n_prompt:]
    assert len(output) == 4 and model.detokenize(output, special=True)
    model.close()
    assert context.ctx is None
    with pytest.raises(RuntimeError, match="closed"):
        context.n_ctx()


def test_model_methods(smol):
    v = smol.vocab
    assert smol.n_vocab() == C.llama_vocab_n_tokens(v) == 49152
    assert smol.vocab_type() == C.LLAMA_VOCAB_TYPE_BPE
    assert smol.n_ctx_train() == 8192 and smol.n_embd() == 576
    assert smol.desc().startswith("llama") and smol.size() > 0 and smol.n_params() > 100_000_000
    assert smol.token_eos() == C.llama_vocab_eos(v) and smol.token_bos() == C.llama_vocab_bos(v)
    assert smol.token_cls() == smol.token_bos()
    assert smol.token_get_text(smol.token_eos()) == "<|im_end|>"
    assert isinstance(smol.token_get_score(5), float) and isinstance(smol.token_get_attr(5), int)
    for f in (smol.token_sep, smol.token_nl, smol.token_prefix, smol.token_middle, smol.token_suffix,
              smol.token_eot):
        assert isinstance(f(), int)
    assert isinstance(smol.add_bos_token(), bool) and isinstance(smol.add_eos_token(), bool)
    toks = smol.tokenize(b"Hello world", add_bos=False, special=False)
    assert smol.detokenize(toks) == b"Hello world"
    assert smol.token_to_piece(toks[1]) == b" world"
    assert smol.token_to_piece(smol.token_eos()) == b"" and smol.token_to_piece(smol.token_eos(), True) == b"<|im_end|>"
    long = b"word " * 3000
    assert len(smol.tokenize(long, add_bos=False, special=False)) == 3001  # and the last space
    md = smol.metadata()
    assert md["general.architecture"] == "llama" and "tokenizer.ggml.tokens" not in md
    with pytest.raises(NotImplementedError):
        smol.get_tensor("output.weight")
    assert isinstance(internals.LlamaModel.default_params(), C.llama_model_params)


def test_missing_model_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        internals.LlamaModel(path_model=str(tmp_path / "nope.gguf"), params=C.llama_model_default_params())
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file")
    with pytest.raises(ValueError, match="Failed to load"):
        internals.LlamaModel(path_model=str(bad), params=C.llama_model_default_params(), verbose=False)


def test_context_batch_and_kv_cache(smol):
    p = _cparams(256)
    p.n_seq_max = 2
    ctx = internals.LlamaContext(model=smol, params=p, verbose=False)
    assert ctx.n_ctx() == C.llama_n_ctx(ctx.ctx) >= 256 and isinstance(ctx.pooling_type(), int)
    toks = smol.tokenize(b"The capital of France is", add_bos=True, special=False)
    batch = internals.LlamaBatch(n_tokens=2 * len(toks), embd=0, n_seq_max=2)
    batch.set_batch(toks, n_past=0, logits_all=True)
    assert batch.n_tokens() == len(toks)
    ctx.decode(batch)
    assert ctx.get_logits().shape == (len(toks), smol.n_vocab())
    last = ctx.get_logits_ith(-1).copy()
    # the same prompt as sequence 1 next to sequence 0's repeat: same logits (batch invariance)
    ctx.kv_cache_clear()
    batch.reset()
    batch.add_sequence(toks, 0, False)
    batch.add_sequence(toks, 1, False)
    assert batch.n_tokens() == 2 * len(toks)
    ctx.decode(batch)
    np.testing.assert_array_equal(ctx.get_logits_ith(len(toks) - 1), last)
    np.testing.assert_array_equal(ctx.get_logits_ith(2 * len(toks) - 1), last)
    mem = C.llama_get_memory(ctx.ctx)
    assert ctx.kv_cache_seq_rm(1, 2, -1)
    assert C.llama_memory_seq_pos_max(mem, 1) == 1
    ctx.kv_cache_seq_cp(0, 1, 0, -1)
    assert C.llama_memory_seq_pos_max(mem, 1) == len(toks) - 1
    ctx.kv_cache_seq_keep(0)
    assert C.llama_memory_seq_pos_max(mem, 0) == len(toks) - 1
    ctx.kv_cache_seq_shift(0, 0, -1, 3)
    assert C.llama_memory_seq_pos_max(mem, 0) == len(toks) - 1 + 3
    assert ctx.get_state_size() > 0
    ctx.set_n_threads(1, 1)
    ctx.reset_timings()
    assert ctx.get_embeddings() is None
    with pytest.raises(NotImplementedError, match="LlamaSampler"):
        ctx.sample_top_k(None, 40, 1)
    with pytest.raises(ValueError, match="do not fit"):
        batch.set_batch(toks * 3, n_past=0, logits_all=False)
    bad = internals.LlamaBatch(n_tokens=1, embd=0, n_seq_max=1)
    bad.set_batch([smol.n_vocab() + 5], n_past=0, logits_all=False)
    with pytest.raises(RuntimeError, match="llama_decode returned -1"):
        ctx.decode(bad)
    ctx.close()
    assert ctx.ctx is None


def test_sampler_chain_custom_grammar_clone(smol):
    ctx = internals.LlamaContext(model=smol, params=_cparams(64), verbose=False)
    toks = smol.tokenize(b"The capital of France is", add_bos=True, special=False)
    batch = internals.LlamaBatch(n_tokens=len(toks), embd=0, n_seq_max=1)
    batch.set_batch(toks, n_past=0, logits_all=False)
    ctx.decode(batch)
    row = ctx.get_logits_ith(-1)
    greedy = internals.LlamaSampler()
    greedy.add_greedy()
    assert greedy.sample(ctx, -1) == int(np.argmax(row))

    # a custom sampler banning the greedy token: the next best is picked
    best = int(np.argmax(row))
    seen = []

    def ban(cur):
        seen.append(cur.size)
        cur.logits[cur.ids == best] = -np.inf

    s = internals.LlamaSampler()
    s.add_custom(ban)
    s.add_greedy()
    assert s.sample(ctx, -1) == int(np.argsort(-row, kind="stable")[1]) and seen == [smol.n_vocab()]
    with pytest.raises(NotImplementedError, match="custom"):
        s.clone()

    g = internals.LlamaSampler()
    g.add_grammar(smol, LlamaGrammar.from_string('root ::= " Berlin"', verbose=False))
    g.add_greedy()
    piece = smol.token_to_piece(g.sample(ctx, -1))
    assert piece and b" Berlin".startswith(piece)

    d = internals.LlamaSampler()
    d.add_penalties(smol.n_vocab(), 64, 1.1, 0.0, 0.0)
    d.add_logit_bias(smol.n_vocab(), {best: -100.0})
    d.add_top_k(40)
    d.add_typical(1.0, 1)
    d.add_top_p(0.95, 1)
    d.add_min_p(0.05, 1)
    d.add_xtc(0.0, 0.1, 1, 7)
    d.add_top_n_sigma(-1.0)
    d.add_dry(smol, 0.0, 1.75, 2, -1, ["\n"])
    d.add_temp_ext(0.8, 0.0, 1.0)
    d.add_temp(1.0)
    d.add_dist(42)
    assert d.get_seed() == 42
    c = d.clone()
    t1, t2 = d.sample(ctx, -1), c.sample(ctx, -1)
    assert t1 == t2 != best
    d.accept(t1)
    d.reset()
    m = internals.LlamaSampler()
    m.add_mirostat_v2(3, 5.0, 0.1)
    assert 0 <= m.sample(ctx, -1) < smol.n_vocab()
    with pytest.warns(DeprecationWarning):
        m.add_softmax()
    m.close()
    assert m.sampler is None


def test_token_data_array_and_helpers(smol):
    n = smol.n_vocab()
    arr = internals.LlamaTokenDataArray(n_vocab=n)
    logits = np.linspace(-1, 1, n, dtype=np.single)
    arr.copy_logits(logits)
    assert arr.candidates.size == n and arr.candidates_data.logit[-1] == np.single(1)
    C.llama_sampler_apply(C.llama_sampler_init_greedy(), arr.candidates)
    assert int(arr.candidates.ids[arr.candidates.selected]) == n - 1
    with pytest.raises(ValueError, match="logits must be"):
        arr.copy_logits(logits[:5])
    assert internals.normalize_embedding([3.0, 4.0]) == [0.6, 0.8]
    sc = internals.LlamaSamplingContext()
    sc.accept(None, 5, False)
    assert sc.last() == 5 and sc.cp().prev == [5]
    with pytest.raises(NotImplementedError):
        sc.sample(None)


def test_compat_registers_internals_and_the_ctypes_names(smol):
    import ctypes

    import pyllama.compat
    from pyllama import llama_speculative

    pkg = pyllama.compat.as_llama_cpp()
    import llama_cpp._internals
    import llama_cpp.llama_cpp as LL
    import llama_cpp.llama_speculative

    assert llama_cpp._internals is internals and llama_cpp.llama_speculative is llama_speculative
    assert LL.llama_decode is C.llama_decode and pkg.llama_token is LL.llama_token is ctypes.c_int32
    assert "llama_token_data" in dir(LL) and "llama_decode" in LL.__all__
    with pytest.raises(AttributeError, match="no attribute 'llama_nonexistent'"):
        LL.llama_nonexistent  # noqa: B018
    d = LL.llama_token_data(id=5, logit=1.5, p=0.25)
    assert (d.id, d.logit, d.p) == (5, 1.5, 0.25)
    # a ctypes token buffer and a ctypes log callback, as llama-cpp-python code makes them
    buf = (LL.llama_token * 8)()
    n = LL.llama_tokenize(smol.vocab, b"Hello world", 11, buf, 8, False, False)
    assert list(buf[:n]) == smol.tokenize(b"Hello world", add_bos=False, special=False)
    seen = []

    @LL.llama_log_callback
    def on_log(level, text, user_data):
        seen.append((level, text))

    LL.llama_log_set(on_log, ctypes.c_void_p())
    try:
        assert LL.llama_model_load_from_file(b"/nonexistent/x.gguf", LL.llama_model_default_params()) is None
    finally:
        LL.llama_log_set(None, None)
    assert any(b"nonexistent" in t for _, t in seen)


def test_llama_ctx_is_a_view_of_its_context(smollm2_path):
    from pyllama import Llama

    llm = Llama(str(smollm2_path), n_ctx=256, verbose=False)
    view = llm._ctx
    assert view.ctx is llm.ctx and view is llm._ctx and view.n_ctx() == llm.n_ctx()
    toks = llm.tokenize(b"Hello there")
    llm.eval(toks)
    np.testing.assert_array_equal(view.get_logits_ith(-1), llm.ctx.logits_ith(-1))
    assert view.model.token_eos() == llm.token_eos() and view.model.n_vocab() == llm.n_vocab()
    view.close()  # the view only: the Llama goes on
    assert llm.create_completion("Hi", max_tokens=2, temperature=0.0)["usage"]["completion_tokens"] >= 1
    assert llm._ctx.ctx is llm.ctx
    # a vocab-only Llama has llama.cpp's empty context: parameters, no memory, no decode
    vo = Llama(str(smollm2_path), vocab_only=True, verbose=False)
    assert vo._ctx.ctx is vo.ctx and vo.ctx.vocab_only
    assert vo._ctx.n_ctx() == vo.ctx.n_ctx > 0
    assert C.llama_get_memory(vo.ctx) is None
    assert C.llama_decode(vo.ctx, C.llama_batch_get_one(np.array([1], np.int32))) == -1
    with pytest.raises(ValueError, match="vocab-only model"):
        vo.ctx.seq_pos_max(0)


def test_llama_tokenizer_module_and_llama_h_constants(smollm2_path):
    import pyllama.compat
    from pyllama import Llama
    from pyllama.llama_tokenizer import BaseLlamaTokenizer, LlamaTokenizer

    pkg = pyllama.compat.as_llama_cpp()
    import llama_cpp.llama_tokenizer

    assert pkg.LlamaTokenizer is LlamaTokenizer is llama_cpp.llama_tokenizer.LlamaTokenizer
    assert pkg.LLAMA_FTYPE_MOSTLY_Q4_K_M == 15 and pkg.llama_cpp.LLAMA_VOCAB_PRE_TYPE_SMOLLM == 21
    assert pkg.GGML_TYPE_Q4_K == C.GGML_TYPE_Q4_K  # llama_api's own names win
    tok = LlamaTokenizer.from_ggml_file(str(smollm2_path))
    assert isinstance(tok, BaseLlamaTokenizer)
    ids = tok.encode("Hello world")
    assert tok.decode(ids) == "Hello world" and tok.detokenize(ids[1:], prev_tokens=ids[:1]) == b" world"
    llm = Llama(str(smollm2_path), vocab_only=True, verbose=False, tokenizer=tok)
    assert llm.tokenizer_ is tok and llm.tokenize(b"Hello world") == ids
    with pytest.raises(TypeError):
        BaseLlamaTokenizer()
