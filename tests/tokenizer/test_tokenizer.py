"""Tokenizers against llama.cpp's own outputs: the reference corpus recorded with
llama_tokenize on the real models, and llama.cpp's tokenizer test suite
(tests/test-tokenizer-0.cpp: add_special=False, parse_special=False)."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

import pytest

from pyllama.vocab import Vocab

DATA = Path(__file__).parents[1] / "data" / "tokenizer"

REFERENCE = {"smollm2": "smollm2-135m-q4_1.tokenize.json", "gemma3": "gemma3-270m-q4_k_m.tokenize.json"}


@pytest.fixture(scope="module")
def smollm2_vocab(smollm2_path):
    return Vocab.from_file(smollm2_path)


@pytest.fixture(scope="module")
def gemma3_vocab(gemma3_path):
    return Vocab.from_file(gemma3_path)


def _cases(name):
    return json.loads((DATA / REFERENCE[name]).read_text())["cases"]


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_reference_corpus(name, request):
    v = request.getfixturevalue(f"{name}_vocab")
    cases = _cases(name)
    assert len(cases) == 50
    for c in cases:
        for add in (0, 1):
            for parse in (0, 1):
                got = v.tokenize(c["text"], add_special=bool(add), parse_special=bool(parse))
                assert got == c[f"ids_add{add}_parse{parse}"], (c["text"], add, parse)
        # llama_detokenize(ids, remove_special=False, unparse_special=False)
        assert v.decode(c["ids_add0_parse1"]) == c["detok_of_ids_add0_parse1"], c["text"]


def test_reference_corpus_via_llama_api(smollm2_vocab):
    """The same ids through the llama.h-style call with a numpy buffer."""
    import numpy as np

    from pyllama import llama_api as L

    for c in _cases("smollm2"):
        raw = c["text"].encode()
        exp = c["ids_add1_parse1"]
        buf = np.zeros(len(exp) + 3, dtype=np.int32)
        n = L.llama_tokenize(smollm2_vocab, raw, len(raw), buf, len(buf), True, True)
        assert n == len(exp) and buf[:n].tolist() == exp
        if exp:
            assert L.llama_tokenize(smollm2_vocab, raw, len(raw), buf, len(exp) - 1, True, True) == -len(exp)


# -- llama.cpp's vocab suite ------------------------------------------------------------------

SUITE = ["llama-spm", "phi-3", "gpt-2", "llama-bpe", "qwen2", "qwen35", "deepseek-llm", "deepseek-coder", "falcon",
         "starcoder", "mpt", "refact", "bert-bge"]
_SHARED = {"qwen35": ("qwen2", {"tokenizer.ggml.pre": "qwen35"})}


def _dec(v):
    if isinstance(v, dict) and "b64" in v:
        return base64.b64decode(v["b64"])
    if isinstance(v, list):
        return [_dec(x) for x in v]
    return v


def suite_metadata(name: str) -> dict:
    base, extra = _SHARED.get(name, (name, {}))
    with gzip.open(DATA / f"{base}.json.gz", "rt", encoding="utf-8") as fh:
        md = {k: _dec(v) for k, v in json.load(fh).items()}
    md.update(extra)
    return md


def suite_cases(name: str) -> list[tuple[str, list[int]]]:
    raw = (DATA / f"{name}.inp").read_bytes().decode("utf-8")
    outs = (DATA / f"{name}.out").read_text(encoding="utf-8").split("\n")
    sep = "\n__ggml_vocab_test__\n"
    inp, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(sep, pos)
        if nxt == -1:
            inp.append(raw[pos:])
            break
        inp.append(raw[pos:nxt])
        pos = nxt + len(sep)
    assert len(outs) >= len(inp)
    return [(s, [int(x) for x in o.split()]) for s, o in zip(inp, outs)]


@pytest.mark.parametrize("name", SUITE)
def test_llama_cpp_vocab_suite(name):
    v = Vocab.from_metadata(suite_metadata(name), source=name)
    cases = suite_cases(name)
    assert len(cases) >= 40
    for text, expected in cases:
        assert v.tokenize(text, add_special=False, parse_special=False) == expected, repr(text)


def _llama_cpp_models() -> Path | None:
    import os

    for cand in (os.environ.get("LLAMA_CPP_DIR"), Path(__file__).resolve().parents[3] / "llama.cpp"):
        if cand and (Path(cand) / "models" / "ggml-vocab-gemma-4.gguf").exists():
            return Path(cand) / "models"
    return None


def test_llama_cpp_vocab_suite_gemma4():
    """Gemma 4's BPE (raw UTF-8, U+2581 spaces, <0xXX> byte fallback): its vocabulary is
    4 MB even compressed, so it is read from a llama.cpp checkout when one is at hand."""
    models = _llama_cpp_models()
    if models is None:
        pytest.skip("llama.cpp checkout with models/ggml-vocab-gemma-4.gguf not found (set LLAMA_CPP_DIR)")
    f = models / "ggml-vocab-gemma-4.gguf"
    v = Vocab.from_file(f)
    raw = (models / "ggml-vocab-gemma-4.gguf.inp").read_bytes().decode("utf-8")
    outs = (models / "ggml-vocab-gemma-4.gguf.out").read_text(encoding="utf-8").split("\n")
    inp = raw.split("\n__ggml_vocab_test__\n")
    if inp and inp[-1] == "":
        inp.pop()
    assert len(inp) >= 40
    for text, o in zip(inp, outs):
        assert v.tokenize(text, add_special=False, parse_special=False) == [int(x) for x in o.split()], repr(text)


def test_qwen25_reference_corpus_with_suite_vocab():
    """Qwen2.5-Coder's reference ids, recorded by llama.cpp on the model file, reproduced
    with llama.cpp's qwen2 suite vocabulary (the same 151,936-token tokenizer): the qwen2
    pre-tokenizer and special tokens on all 50 texts without the 491 MB model."""
    v = Vocab.from_metadata(suite_metadata("qwen2"), source="qwen2")
    data = json.loads((DATA / "qwen2.5-coder-0.5b-q4_k_m.tokenize.json").read_text())
    assert data["n_vocab"] == v.n_tokens
    for c in data["cases"]:
        for add in (0, 1):
            for parse in (0, 1):
                assert v.tokenize(c["text"], bool(add), bool(parse)) == c[f"ids_add{add}_parse{parse}"], c["text"]
        assert v.decode(c["ids_add0_parse1"]) == c["detok_of_ids_add0_parse1"], c["text"]


# -- random texts tokenized by llama.cpp itself (crosscheck/make_crosscheck.py) --------------

CROSS = DATA / "crosscheck"


def _check_crosscheck(v: Vocab, name: str) -> None:
    with gzip.open(CROSS / f"crosscheck-{name}.json.gz", "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    texts = [base64.b64decode(t) for t in data["texts_b64"]]
    assert len(texts) >= 200
    for raw, ids4, det in zip(texts, data["ids"], data["detok_b64"]):
        for (add, parse), exp in zip(((0, 0), (0, 1), (1, 0), (1, 1)), ids4):
            assert v.tokenize(raw, add_special=bool(add), parse_special=bool(parse)) == exp, (raw, add, parse)
        assert v.detokenize_bytes(ids4[1]) == base64.b64decode(det), raw


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_crosscheck_real_models(name, request):
    """600 random texts (200 of them invalid UTF-8) per model, ids and detokenized bytes
    exactly as llama.cpp produced them."""
    _check_crosscheck(request.getfixturevalue(f"{name}_vocab"), name)


@pytest.mark.parametrize("name", SUITE)
def test_crosscheck_suite_vocabs(name):
    _check_crosscheck(Vocab.from_metadata(suite_metadata(name), source=name), name)


T5_USER = ["<ud>", "ab cd", "zqzq", "\u2581hello\u2581world\u2581"]


def t5_toy_metadata(add_space_prefix: bool, remove_extra_whitespaces: bool) -> dict:
    """crosscheck/make_t5_toy.py's vocabulary: llama-spm's tokens as a UGM vocabulary."""
    base = suite_metadata("llama-spm")
    md = {k: v for k, v in base.items() if not k.startswith("tokenizer.")}
    types = list(base["tokenizer.ggml.token_type"]) + [4] * len(T5_USER)
    types[500] = 5
    md.update({
        "tokenizer.ggml.model": "t5",
        "tokenizer.ggml.tokens": list(base["tokenizer.ggml.tokens"]) + T5_USER,
        "tokenizer.ggml.scores": list(base["tokenizer.ggml.scores"]) + [0.0] * len(T5_USER),
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_space_prefix": add_space_prefix,
        "tokenizer.ggml.remove_extra_whitespaces": remove_extra_whitespaces,
    })
    return md


@pytest.mark.parametrize("name, prefix, merge", [("t5-toy-a", True, True), ("t5-toy-b", False, False)])
def test_crosscheck_ugm(name, prefix, merge):
    """UGM (Viterbi over unigram scores, user-defined tokens, space prefix / merging),
    against llama.cpp on the same random texts. The precompiled charsmap (XCDA) path is
    checked with nomic-bert-moe's real vocabulary when a llama.cpp checkout is at hand."""
    _check_crosscheck(Vocab.from_metadata(t5_toy_metadata(prefix, merge), source=name), name)


@pytest.mark.parametrize("name", ["nomic-bert-moe", "gemma-4", "command-r"])
def test_crosscheck_vocabs_from_llama_cpp_checkout(name):
    """Vocabularies too big to keep here (3-4 MB compressed), read from a llama.cpp checkout
    when one is at hand: nomic-bert-moe is a real UGM vocabulary with a precompiled charsmap
    (XLM-RoBERTa's), gemma-4 the raw-UTF-8 BPE, command-r a 256k BPE."""
    models = _llama_cpp_models()
    if models is None:
        pytest.skip("llama.cpp checkout with models/ggml-vocab-*.gguf not found (set LLAMA_CPP_DIR)")
    _check_crosscheck(Vocab.from_file(models / f"ggml-vocab-{name}.gguf"), name)


def _attrhash(v: Vocab) -> int:
    h = 0
    for a in v.attrs:
        h = (h * 31 + a) % 1000000007
    return h


def _check_special_ids(v: Vocab, name: str) -> None:
    exp = json.loads((CROSS / "special_ids.json").read_text())[name]
    got = {"bos": v.bos, "eos": v.eos, "eot": v.eot, "sep": v.sep, "nl": v.nl, "pad": v.pad, "mask": v.mask,
           "add_bos": int(v.add_bos), "add_eos": int(v.add_eos), "add_sep": int(v.add_sep),
           "fim": [v.fim_pre, v.fim_suf, v.fim_mid, v.fim_pad, v.fim_rep, v.fim_sep],
           "eog": sorted(v.eog_ids), "attrhash": _attrhash(v)}
    if name == "smollm2":
        # llama.cpp takes the first EOT-looking text in std::unordered_map order, which
        # depends on the C++ library: here <|endoftext|> (0); pyllama takes <|im_end|> (2),
        # the chat template's end of turn. Both are end-of-generation tokens either way.
        assert exp["eot"] == 0 and got["eot"] == 2 and {0, 2} <= set(got["eog"])
        got["eot"] = exp["eot"]
    assert got == exp


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_special_ids_real_models(name, request):
    """Special ids, add_* flags, the EOG set and every token's attributes as llama.cpp loads them."""
    _check_special_ids(request.getfixturevalue(f"{name}_vocab"), name)


@pytest.mark.parametrize("name", SUITE)
def test_special_ids_suite_vocabs(name):
    _check_special_ids(Vocab.from_metadata(suite_metadata(name), source=name), name)


def test_special_ids_t5_toy():
    _check_special_ids(Vocab.from_metadata(t5_toy_metadata(True, True), source="t5"), "t5-toy-a")


# -- RWKV's vocabulary (llama.cpp's LLAMA_VOCAB_TYPE_RWKV) --------------------------------------


@pytest.fixture(scope="module")
def rwkv_maker():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_rwkv_reference", DATA / "make_rwkv_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def rwkv_vocab(rwkv_maker, tmp_path_factory):
    return Vocab.from_file(str(rwkv_maker.write_vocab(tmp_path_factory.mktemp("rwkv") / "vocab.gguf")))


def test_rwkv_tokenize_as_llama_cpp(rwkv_vocab):
    # tests/data/tokenizer/make_rwkv_reference.py: llama-tokenize on the same vocabulary
    # (greedy longest match over escaped, literal and duplicate texts; no BOS)
    ref = json.loads((DATA / "rwkv.json").read_text())
    assert len(ref["cases"]) == 8
    for c in ref["cases"]:
        raw = base64.b64decode(c["prompt_b64"])
        assert rwkv_vocab.tokenize(raw, add_special=True, parse_special=False) == c["ids"], raw
    assert rwkv_vocab.nl == 11 and not rwkv_vocab.add_bos and rwkv_vocab.bos == -1


def test_rwkv_pieces_are_the_unescaped_bytes(rwkv_vocab):
    ids = rwkv_vocab.tokenize(b"x\\\x00\xffhello\n\nAB")
    assert rwkv_vocab.detokenize_bytes(ids) == b"x\\\x00\xffhello\n\nAB"
    assert rwkv_vocab.token_to_piece(268) == b"AB" and rwkv_vocab.token_to_piece(269) == b"\\x"
    assert rwkv_vocab.token_to_piece(0) == b"" and rwkv_vocab.token_to_piece(0, special=True) == b"<s>"


def test_rwkv_unescape_follows_llama_cpp():
    from pyllama.vocab.rwkv import unescape

    assert unescape(b"a\\tb\\n\\r\\\\\\x41\\x7f\\q") == b"a\tb\n\r\\A\x7fq"
    # upper-case hex digits: 'F' < 'a', so llama.cpp reads them as c - '0' (22), in uint8
    assert unescape(b"\\xFF") == bytes([((22 << 4) + 22) & 0xFF]) == b"v"


def test_rwkv_without_a_matching_token_raises(tmp_path):
    # a byte no token starts: llama.cpp pushes its unknown id (none here), so pyllama
    # raises; bytes that only begin longer tokens would make llama.cpp loop forever
    import gguf

    from pyllama.errors import PyllamaError

    w = gguf.GGUFWriter(str(tmp_path / "v.gguf"), "rwkv6")
    w.add_tokenizer_model("rwkv")
    w.add_token_list(["\\n", "ab", "c"])
    w.add_token_types([1, 1, 1])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    v = Vocab.from_file(str(tmp_path / "v.gguf"))
    assert v.tokenize(b"abc\n") == [1, 2, 0]
    with pytest.raises(PyllamaError, match="UNK"):
        v.tokenize(b"z")
    with pytest.raises(PyllamaError, match="no token matches"):
        v.tokenize(b"ac")
