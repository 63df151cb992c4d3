"""Vocab API, llama.h-style functions, streaming detokenizer, bad input and properties."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyllama import PyllamaError, UnsupportedModelError
from pyllama import llama_api as L
from pyllama.vocab import ATTR_CONTROL, ATTR_USER_DEFINED, VOCAB_TYPE_BPE, VOCAB_TYPE_SPM, Vocab

from test_tokenizer import suite_metadata


@pytest.fixture(scope="module")
def gpt2():
    return Vocab.from_metadata(suite_metadata("gpt-2"), source="gpt-2")


@pytest.fixture(scope="module")
def llama3():
    return Vocab.from_metadata(suite_metadata("llama-bpe"), source="llama-bpe")


@pytest.fixture(scope="module")
def spm():
    return Vocab.from_metadata(suite_metadata("llama-spm"), source="llama-spm")


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return Vocab.from_file(smollm2_path)


@pytest.fixture(scope="module")
def gemma3(gemma3_path):
    return Vocab.from_file(gemma3_path)


# -- loading ----------------------------------------------------------------------------------

def test_smollm2_special_ids(smollm2):
    v = smollm2
    assert v.type == VOCAB_TYPE_BPE and v.n_tokens == 49152
    assert (v.bos, v.eos, v.unk, v.pad) == (1, 2, 0, 2)
    assert not v.add_bos and not v.add_eos
    assert v.texts[v.eot] in ("<|im_end|>", "<|endoftext|>")
    # <|endoftext|> (0) and <|im_end|> (2) end generation; <|im_start|> (1) does not
    assert v.is_eog(0) and v.is_eog(2) and not v.is_eog(1)
    assert v.nl == v.tokenize("\n", add_special=False)[0]


def test_gemma3_special_ids(gemma3):
    v = gemma3
    assert v.type == VOCAB_TYPE_SPM and v.n_tokens == 262144
    assert (v.bos, v.eos, v.unk, v.pad) == (2, 1, 3, 0)
    assert v.add_bos and not v.add_eos and not v.add_space_prefix
    eot = v.text_to_id["<end_of_turn>"]
    assert v.eot == eot and v.is_eog(eot) and v.is_eog(1)
    assert v.texts[v.nl] == "<0x0A>"
    assert v.attrs[v.text_to_id["<start_of_turn>"]] & ATTR_CONTROL
    assert v.attrs[v.text_to_id["\n\n"]] & ATTR_USER_DEFINED


def test_llama_api_getters(smollm2):
    v = L.llama_model_get_vocab(smollm2)
    assert L.llama_vocab_type(v) == L.LLAMA_VOCAB_TYPE_BPE
    assert L.llama_vocab_n_tokens(v) == L.llama_n_vocab(v) == 49152
    assert L.llama_vocab_get_text(v, 2) == b"<|im_end|>"
    assert L.llama_vocab_get_attr(v, 2) & L.LLAMA_TOKEN_ATTR_CONTROL
    assert L.llama_vocab_is_control(v, 1) and not L.llama_vocab_is_control(v, 100)
    assert L.llama_vocab_get_score(v, 100) == 0.0
    assert (L.llama_vocab_bos(v), L.llama_vocab_eos(v), L.llama_vocab_pad(v)) == (1, 2, 2)
    assert L.llama_vocab_sep(v) == L.LLAMA_TOKEN_NULL
    assert L.llama_vocab_get_add_bos(v) is False and L.llama_vocab_get_add_eos(v) is False
    assert L.llama_vocab_is_eog(v, 2) and not L.llama_vocab_is_eog(v, 100)


def test_missing_pre_warns_and_falls_back(caplog):
    md = suite_metadata("gpt-2")
    del md["tokenizer.ggml.pre"]
    with caplog.at_level(logging.WARNING, logger="pyllama"):
        v = Vocab.from_metadata(md, source="x.gguf")
    assert v.pre_config.regexes == "default"
    assert "missing pre-tokenizer" in caplog.text


@pytest.mark.parametrize(
    "change, match",
    [
        ({"tokenizer.ggml.pre": "no-such-pre"}, "unknown pre-tokenizer type: 'no-such-pre'"),
        ({"tokenizer.ggml.model": "sentencepiece-v9"}, "unknown tokenizer model 'sentencepiece-v9'"),
        ({"tokenizer.ggml.model": "plamo2"}, "not supported yet"),
    ],
)
def test_unsupported_raises(change, match):
    md = suite_metadata("gpt-2")
    md.update(change)
    with pytest.raises(UnsupportedModelError, match=match):
        Vocab.from_metadata(md, source="x.gguf")


@pytest.mark.parametrize(
    "change, match",
    [
        ({"tokenizer.ggml.tokens": None}, "cannot find tokenizer vocab"),
        ({"tokenizer.ggml.merges": None}, "cannot find tokenizer merges"),
        ({"tokenizer.ggml.token_type": [1, 1]}, "Index out of array bounds for toktypes"),
        ({"tokenizer.ggml.model": 7}, "tokenizer.ggml.model must be a string"),
        ({"tokenizer.ggml.bos_token_id": "x"}, "bos_token_id must be an integer"),
    ],
)
def test_bad_metadata_raises_named_error(change, match):
    md = suite_metadata("gpt-2")
    for k, val in change.items():
        if val is None:
            md.pop(k, None)
        else:
            md[k] = val
    with pytest.raises(PyllamaError, match=match) as ei:
        Vocab.from_metadata(md, source="bad.gguf")
    assert "bad.gguf" in str(ei.value)


def test_out_of_range_special_id_is_disabled_with_warning(caplog):
    md = suite_metadata("gpt-2")
    md["tokenizer.ggml.eot_token_id"] = 10**6
    with caplog.at_level(logging.WARNING, logger="pyllama"):
        v = Vocab.from_metadata(md, source="x.gguf")
    assert v.eot == L.LLAMA_TOKEN_NULL or v.eot < v.n_tokens
    assert "bad special token" in caplog.text


# -- pieces and ids ---------------------------------------------------------------------------

def test_out_of_range_ids_raise_value_error_naming_range(gpt2):
    n = gpt2.n_tokens
    for bad in (-1, n, n + 10):
        with pytest.raises(ValueError, match=rf"valid ids are 0\.\.{n - 1}"):
            gpt2.token_to_piece(bad)
        with pytest.raises(ValueError, match=rf"0\.\.{n - 1}"):
            gpt2.detokenize([0, bad])
        with pytest.raises(ValueError, match=rf"0\.\.{n - 1}"):
            gpt2.detokenize_bytes([bad])
        with pytest.raises(ValueError, match=rf"0\.\.{n - 1}"):
            L.llama_token_to_piece(gpt2, bad, bytearray(8), 8, 0, False)
        with pytest.raises(ValueError, match=rf"0\.\.{n - 1}"):
            L.llama_vocab_get_text(gpt2, bad)


@pytest.mark.parametrize("fixture", ["gpt2", "spm", "llama3"])
def test_token_to_piece_of_every_id(fixture, request):
    v = request.getfixturevalue(fixture)
    for i in range(v.n_tokens):
        p = v.token_to_piece(i, special=True)
        assert isinstance(p, bytes)
        if v.attrs[i] & ATTR_CONTROL:
            assert v.token_to_piece(i, special=False) == b""


def test_token_to_piece_known_values(spm, gpt2):
    # SPM: U+2581 is a space, byte tokens are their byte
    assert spm.token_to_piece(spm.text_to_id["▁the"]) == b" the"
    assert spm.token_to_piece(spm.text_to_id["<0x0A>"]) == b"\n"
    assert spm.token_to_piece(spm.text_to_id["▁the"], lstrip=1) == b"the"
    assert spm.token_to_piece(spm.bos) == b"" and spm.token_to_piece(spm.bos, special=True) == b"<s>"
    # byte-level BPE: GPT-2's stand-in characters map back to bytes
    assert gpt2.token_to_piece(gpt2.text_to_id["Ġworld"]) == b" world"
    assert gpt2.token_to_piece(gpt2.text_to_id["Ċ"]) == b"\n"


def test_llama_token_to_piece_buffer(gpt2):
    tid = gpt2.text_to_id["Ġworld"]
    assert L.llama_token_to_piece(gpt2, tid, np.zeros(3, np.uint8), 3, 0, False) == -6
    buf = np.zeros(16, np.uint8)
    n = L.llama_token_to_piece(gpt2, tid, buf, 16, 0, False)
    assert bytes(buf[:n]) == b" world"
    n = L.llama_token_to_piece(gpt2, tid, buf, 16, 1, False)
    assert bytes(buf[:n]) == b"world"


def test_llama_detokenize_buffer(smollm2):
    ids = smollm2.tokenize("Hello, world! I'm here.", add_special=False)
    out = np.zeros(64, np.uint8)
    n = L.llama_detokenize(smollm2, np.array(ids, np.int32), len(ids), out, 64, False, False)
    assert bytes(out[:n]) == b"Hello, world! I'm here."
    assert L.llama_detokenize(smollm2, ids, len(ids), out, 5, False, False) == -n


def test_spm_detokenize_leading_space_rules(spm):
    """llama_detokenize strips the add_space_prefix space from the first piece only; when
    remove_special drops the BOS it keeps the space (llama.cpp sets remove_space = false),
    and a kept BOS is the first piece, so the space after it stays too."""
    ids = spm.tokenize("Hello world", add_special=True)
    assert ids[0] == spm.bos
    assert spm.decode(ids, remove_special=True) == " Hello world"
    assert spm.decode(ids) == " Hello world"
    assert spm.decode(ids, unparse_special=True) == "<s> Hello world"
    assert spm.decode(ids[1:]) == "Hello world"


def test_parse_special_and_user_defined(smollm2, gemma3):
    s = "<|im_start|>user\nhi<|im_end|>"
    with_special = smollm2.tokenize(s, add_special=False, parse_special=True)
    assert with_special[0] == 1 and with_special[-1] == 2
    assert 1 not in smollm2.tokenize(s, add_special=False, parse_special=False)
    # Gemma's user-defined tokens (whitespace runs) are matched even without parse_special
    ids = gemma3.tokenize("a\n\nb", add_special=False, parse_special=False)
    assert gemma3.text_to_id["\n\n"] in ids


# -- streaming detokenizer --------------------------------------------------------------------

@pytest.mark.parametrize("fixture", ["gpt2", "spm"])
def test_streaming_holds_back_incomplete_utf8(fixture, request):
    v = request.getfixturevalue(fixture)
    text = "Hi 🦙 ünïcödé 我想 🚀!"
    ids = v.tokenize(text, add_special=False)
    dec = v.streaming_decoder()
    parts = [dec.feed(t) for t in ids] + [dec.flush()]
    assert "".join(parts) == v.decode(ids)
    assert all("\ufffd" not in p for p in parts)
    # a 4-byte emoji split over byte tokens: nothing comes out until it is complete
    emoji_ids = v.tokenize("🦙", add_special=False)
    assert len(emoji_ids) > 1
    dec.reset()
    outs = [dec.feed(t) for t in emoji_ids]
    assert all(o in ("", " ") for o in outs[:-1]) and outs[-1].strip() == "🦙"


# -- properties -------------------------------------------------------------------------------

_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=60) | st.sampled_from(
    ["", " ", "\n\n", "  \t x", "I'm DON'T", "١٢٣ ٤", "e\u0301\u0301", "𝔘𝔫𝔦", "a\u200db", "<|im_start|>x<|im_end|>"])


# any str, lone surrogates included (encoded as llama.cpp would see their bytes)
_any_text = st.text(alphabet=st.characters(exclude_categories=()), max_size=60) | _text


@pytest.fixture(scope="module")
def wpm():
    return Vocab.from_metadata(suite_metadata("bert-bge"), source="bert-bge")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=_any_text, add=st.booleans(), parse=st.booleans())
def test_tokenize_never_raises_and_gives_valid_ids(gpt2, spm, llama3, wpm, s, add, parse):
    for v in (gpt2, spm, llama3, wpm):
        ids = v.tokenize(s, add_special=add, parse_special=parse)
        assert all(0 <= i < v.n_tokens for i in ids)
        assert isinstance(v.detokenize_bytes(ids), bytes) and isinstance(v.detokenize(ids), str)


@pytest.fixture(scope="module")
def qwen2():
    return Vocab.from_metadata(suite_metadata("qwen2"), source="qwen2")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=_text)
def test_byte_level_bpe_round_trips(llama3, qwen2, s):
    """Byte-level BPE is lossless: every byte has a token. Qwen2 (like SmolLM2) does not
    clean up spaces on detokenize; llama3 does (" ?" -> "?", as in llama.cpp), so for it
    the raw bytes are compared with the clean-up turned off."""
    ids = qwen2.tokenize(s, add_special=False, parse_special=False)
    assert qwen2.detokenize(ids, unparse_special=True) == s
    ids = llama3.tokenize(s, add_special=False, parse_special=False)
    assert llama3.detokenize_bytes(ids, unparse_special=True, clean_spaces=False) == s.encode()
    assert llama3.clean_spaces and llama3.detokenize(llama3.tokenize(" ?", add_special=False)) == "?"


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=40))
def test_tokenize_arbitrary_bytes(data):
    v = _bytes_vocab()
    ids = v.tokenize(data, add_special=True, parse_special=True)
    assert all(0 <= i < v.n_tokens for i in ids)


_CACHE = {}


def _bytes_vocab():
    if "v" not in _CACHE:
        _CACHE["v"] = Vocab.from_metadata(suite_metadata("qwen2"), source="qwen2")
    return _CACHE["v"]


def test_partition_with_many_specials_sharing_a_first_byte():
    """The candidate filter for big groups of special tokens (first 3 bytes) must still find
    short ones; the partition is llama.cpp's: longest special first, lstrip/rstrip."""
    plain = ["a", "b", "\u2581", "<", "x", "c", "t", "l", "7", ">"]
    toks = ["<unk>", "<s>", "</s>"] + [f"<ctl{i}>" for i in range(80)] + ["<x"] + plain
    md = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.scores": [0.0] * len(toks),
        "tokenizer.ggml.token_type": [2, 3, 3] + [3] * 80 + [4] + [1] * len(plain),
        "tokenizer.ggml.add_space_prefix": False,
    }
    v = Vocab.from_metadata(md, source="toy")
    x_id = toks.index("<x")
    ids = v.tokenize("a<xb<ctl7>", add_special=False, parse_special=True)
    assert ids == [toks.index("a"), x_id, toks.index("b"), toks.index("<ctl7>")]
    # without parse_special the control token is plain text (user-defined "<x" still splits)
    ids = v.tokenize("<ctl7>", add_special=False, parse_special=False)
    assert ids == [toks.index(c) for c in "<ctl7>"]
    # a byte with neither <0xXX> nor a one-byte token: a clear error (llama.cpp aborts)
    with pytest.raises(PyllamaError, match=r"toy: no token for byte 0x7A"):
        v.tokenize("z", add_special=False)


_values = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=5),
                    st.binary(max_size=5), st.lists(st.one_of(st.integers(-3, 70000), st.text(max_size=3),
                                                              st.binary(max_size=3), st.floats()), max_size=6))


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(["model", "pre", "tokens", "scores", "token_type", "merges", "bos_token_id", "eos_token_id",
                            "add_bos_token", "add_space_prefix", "padding_token_id", "eot_token_id"]),
       value=_values, base=st.sampled_from(["llama-spm", "gpt-2"]))
def test_mutated_metadata_loads_or_raises_pyllama_error(key, value, base):
    """Either a usable vocabulary or a PyllamaError: never another exception."""
    md = _small_md(base)
    if value is None:
        md.pop("tokenizer.ggml." + key, None)
    else:
        md["tokenizer.ggml." + key] = value
    try:
        v = Vocab.from_metadata(md, source="mut.gguf")
    except PyllamaError:
        return
    try:  # a broken vocabulary may lack what tokenizing needs (BOS, byte tokens): a clear error
        ids = v.tokenize("Hello world 12", add_special=True, parse_special=True)
    except PyllamaError:
        return
    assert all(0 <= i < v.n_tokens for i in ids)
    v.detokenize(ids)


def _small_md(base: str) -> dict:
    if base not in _CACHE:
        _CACHE[base] = suite_metadata(base)
    return dict(_CACHE[base])


def _bpe_reference(word: str, rank, text_to_id) -> list[int]:
    """llama.cpp's BPE word loop written plainly (merge the lowest-ranked adjacent pair,
    leftmost on ties, until none is listed), without byte fallback."""
    symbols = list(word)
    while len(symbols) > 1:
        best = None
        for i in range(len(symbols) - 1):
            r = rank(symbols[i], symbols[i + 1])
            if r is not None and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            break
        i = best[1]
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    return [text_to_id[s] for s in symbols]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(word=st.text(alphabet="Ġabcdehilnorst", min_size=1, max_size=60))
def test_bpe_word_matches_plain_merge_loop(gpt2, word):
    """The Rust merge loop (a priority queue with stale entries, as llama.cpp's) gives the
    ids of the plain rescanning loop over the same merge ranks."""
    store = gpt2._store
    assert gpt2._bpe.encode_word(word) == _bpe_reference(word, store.rank, gpt2.text_to_id)


def test_long_words_merge_like_short_ones(gpt2):
    for w in ("Ġinternationalization", "abcabcabcabc", "ĠĠĠĠĠĠĠĠĠĠ", "thequickbrownfoxjumpsoverthelazydog" * 3):
        assert gpt2._bpe.encode_word(w) == _bpe_reference(w, gpt2._store.rank, gpt2.text_to_id)
    ids = gpt2.tokenize("x" + "ab" * 20000, add_special=False)
    assert gpt2.detokenize(ids) == "x" + "ab" * 20000


_SPM_PIECES = ["> </", ">", " ", "  ", "</", "div", "hello", "world", "é", "🦙", "a", "<", ">  </", "x> </y", "\t", "▁"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.sampled_from(_SPM_PIECES), min_size=1, max_size=12))
def test_spm_word_cache_equals_whole_fragment(gemma3, parts):
    """SpmSession cuts fragments before U+2581 runs and caches words; Gemma 3 has a token
    with U+2581 inside (">▁</") that a cut must not split. Same ids as the uncut merge."""
    from pyllama.vocab.spm import spm_tokenize

    text = "".join(parts).replace(" ", "\u2581").encode()
    cut: list[int] = []
    gemma3._spm.tokenize(text, cut)
    whole: list[int] = []
    spm_tokenize(text, gemma3._store, gemma3.byte_to_token, whole)
    assert cut == whole


def test_llama_model_get_vocab_from_vocab_only_model(smollm2_path):
    """The llama.h path: load with vocab_only, get the vocab, tokenize."""
    L.llama_backend_init()
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(str(smollm2_path).encode(), params)
    assert model is not None
    vocab = L.llama_model_get_vocab(model)
    assert L.llama_model_get_vocab(model) is vocab  # built once per model
    buf = np.zeros(8, np.int32)
    n = L.llama_tokenize(vocab, b"Hello world", 11, buf, 8, True, False)
    assert buf[:n].tolist() == [19556, 905]  # the reference corpus' first case


# -- the vocabulary built straight from a GGUF file (Rust tables, no Python lists) -------------

def _vocab_file(tmp_path, kvs, name="v.gguf"):
    from gguf_build import ARR, STR, Spec, build

    base = [("general.architecture", STR, "llama"), ("tokenizer.ggml.model", STR, "gpt2"),
            ("tokenizer.ggml.pre", STR, "gpt-2")]
    keys = {k for k, _, _ in kvs}
    data, _ = build(Spec(kvs=[kv for kv in base if kv[0] not in keys] + kvs))
    p = tmp_path / name
    p.write_bytes(data)
    return p


_TOKS = ["a", "b", "c", "ab", "abc", "Ġ", "Ġa", "<|endoftext|>"]
_MERGES = ["a b", "ab c", "Ġ a"]


def _good_kvs():
    from gguf_build import ARR, F32, I32, STR

    return [("tokenizer.ggml.tokens", ARR, (STR, _TOKS)),
            ("tokenizer.ggml.scores", ARR, (F32, [0.0] * len(_TOKS))),
            ("tokenizer.ggml.token_type", ARR, (I32, [1] * 7 + [3])),
            ("tokenizer.ggml.merges", ARR, (STR, _MERGES))]


def test_vocab_from_file_equals_vocab_from_lists(tmp_path):
    from pyllama import GGUFFile

    p = _vocab_file(tmp_path, _good_kvs())
    direct = Vocab.from_file(p)
    lists = Vocab.from_metadata(GGUFFile(p).metadata, source=str(p))
    for text in ("abc", "ab a", " abcab", "cba", "<|endoftext|>x"):
        assert direct.tokenize(text, parse_special=True) == lists.tokenize(text, parse_special=True)
    # "abc": a+b (rank 0), then ab+c (1); "Ġab": a+b (rank 0) beats Ġ+a (2), leaving Ġ, ab
    assert direct.tokenize("abc ab") == [4, 5, 3]
    assert list(direct.texts) == _TOKS and direct.texts_bytes[3] == b"ab"
    assert direct.text_to_id["Ġa"] == 6 and "zz" not in direct.text_to_id
    assert direct.attrs == lists.attrs and list(direct.scores) == list(lists.scores)


@pytest.mark.parametrize(
    "key, kv, match",
    [
        ("tokenizer.ggml.tokens", ("I32", [1, 2, 3]), "tokenizer.ggml.tokens must be an array of strings"),
        ("tokenizer.ggml.tokens", ("STR1", "abc"), "tokenizer.ggml.tokens must be an array of strings"),
        ("tokenizer.ggml.scores", ("STR", ["x"] * 8), "scores must be an array of float32 or int32"),
        ("tokenizer.ggml.scores", ("F32", [0.0] * 3), r"Index out of array bounds for scores \(3 < 8\)"),
        ("tokenizer.ggml.token_type", ("F32", [1.0] * 8), "token_type must be an array of int32"),
        ("tokenizer.ggml.merges", ("I32", [1]), "tokenizer.ggml.merges must be an array of strings"),
        ("tokenizer.ggml.merges", None, "cannot find tokenizer merges"),
        ("tokenizer.ggml.tokens", None, "cannot find tokenizer vocab"),
    ],
)
def test_bad_tokenizer_arrays_in_a_file_raise_named_errors(tmp_path, key, kv, match):
    import gguf_build as G

    kvs = [x for x in _good_kvs() if x[0] != key]
    if kv is not None:
        ty, val = kv
        kvs.append((key, G.STR, val) if ty == "STR1" else (key, G.ARR, (getattr(G, ty), val)))
    p = _vocab_file(tmp_path, kvs)
    with pytest.raises(PyllamaError, match=match) as ei:
        Vocab.from_file(p)
    assert str(p) in str(ei.value)


@settings(max_examples=60, deadline=None)
@given(toks=st.lists(st.text(alphabet="abcĠé\x00", min_size=0, max_size=4), min_size=1, max_size=30),
       pairs=st.lists(st.tuples(st.integers(0, 29), st.integers(0, 29)), max_size=20),
       text=st.text(alphabet="abc é", max_size=20))
def test_file_and_list_vocabularies_agree_on_any_tables(tmp_path_factory, toks, pairs, text):
    """Whatever the tables (duplicates, empty tokens, merges of non-tokens), the vocabulary
    read from the file and the one built from Python lists hold the same texts and ids and
    tokenize alike."""
    from gguf_build import ARR, STR

    from pyllama import GGUFFile

    merges = [f"{toks[a % len(toks)]} {toks[b % len(toks)]}" for a, b in pairs]
    p = _vocab_file(tmp_path_factory.mktemp("v"), [("tokenizer.ggml.tokens", ARR, (STR, toks)),
                                                   ("tokenizer.ggml.merges", ARR, (STR, merges))])
    try:
        direct = Vocab.from_file(p)
    except PyllamaError as e:
        with pytest.raises(PyllamaError) as e2:
            Vocab.from_metadata(GGUFFile(p).metadata, source=str(p))
        assert str(e2.value) == str(e)
        return
    lists = Vocab.from_metadata(GGUFFile(p).metadata, source=str(p))
    assert list(direct.texts) == list(lists.texts)
    assert [direct.text_to_id.get(t) for t in toks] == [lists.text_to_id.get(t) for t in toks]
    assert direct.tokenize(text) == lists.tokenize(text)


def test_vocab_deep_copy_shares_the_immutable_tables(gpt2):
    import copy

    v = copy.deepcopy(gpt2)
    assert v._store is gpt2._store
    assert v.tokenize("Hello world") == gpt2.tokenize("Hello world")
    v.attrs[0] = 0  # the mutable parts are copies
    assert gpt2.attrs[0] != 0 or v.attrs is not gpt2.attrs
