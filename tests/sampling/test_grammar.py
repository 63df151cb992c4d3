"""GBNF grammars (pyllama.grammar) against llama.cpp's own grammar tests, carried over as
data (tests/data/grammar/llama_cpp_cases.json, from tools/extract_grammar_cases.py), plus
every grammar shipped in llama.cpp's grammars/, a parser fuzz, and generation on SmolLM2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyllama.grammar import (GRETYPE_NAMES, Grammar, GrammarError, decode_utf8, match_string,
                             parse_grammar)

DATA = Path(__file__).parents[1] / "data" / "grammar"
CASES = json.loads((DATA / "llama_cpp_cases.json").read_text())
GBNF_FILES = sorted(DATA.glob("*.gbnf"))
GRAMMAR_CASES = [c for c in CASES["integration"] if "grammar" in c]


def _items(segments) -> list[tuple[int, bytes]]:
    """test-grammar-integration's parse_tokens: token(N) -> (N, b"<[N]>"), text -> one
    (0, utf-8) item per code point; invalid UTF-8 bytes -> U+FFFD."""
    out = []
    for kind, val in segments:
        if kind == "token":
            out.append((val, f"<[{val}]>".encode()))
        elif kind == "text":
            out.extend((0, ch.encode("utf-8")) for ch in val)
        else:
            text = bytes.fromhex(val).decode("utf-8", "replace")
            out.extend((0, ch.encode("utf-8")) for ch in text)
    return out


@pytest.mark.parametrize("case", CASES["parser_ok"], ids=lambda c: c["grammar"].strip()[:40])
def test_parser_elements_equal_llama_cpp(case):
    symbols, rules = parse_grammar(case["grammar"])
    assert symbols == case["symbols"]
    flat = [[GRETYPE_NAMES[t], v] for rule in rules for t, v in rule]
    assert flat == case["elements"]


@pytest.mark.parametrize("text", CASES["parser_fail"], ids=lambda t: t.strip()[:40])
def test_parser_fails_where_llama_cpp_fails(text):
    with pytest.raises(GrammarError):
        parse_grammar(text)


@pytest.mark.parametrize("case", CASES["build_fail"], ids=lambda c: c["grammar"].strip()[:40])
def test_build_fails_where_llama_cpp_fails(case):
    with pytest.raises(GrammarError):
        Grammar(case["grammar"], case["root"])


@pytest.mark.parametrize("case", CASES["build_ok"], ids=lambda c: c["root"])
def test_build_with_custom_root(case):
    Grammar(case["grammar"], case["root"])


@pytest.mark.parametrize("case", GRAMMAR_CASES, ids=lambda c: c["desc"])
def test_integration_verdicts_equal_llama_cpp(case):
    g = Grammar(case["grammar"])
    wrong = [s for s in case["passing"] if not match_string(g, _items(s))]
    wrong += [s for s in case["failing"] if match_string(g, _items(s))]
    assert not wrong


def test_case_counts():
    """The extraction found every case (a changed llama.cpp test file shows up here)."""
    assert len(CASES["parser_ok"]) == 17 and len(CASES["parser_fail"]) == 7
    assert len(GRAMMAR_CASES) == 14 and len(CASES["integration"]) == 47
    assert len(CASES["build_fail"]) == 7 and len(CASES["build_ok"]) == 1


@pytest.mark.parametrize("path", GBNF_FILES, ids=lambda p: p.name)
def test_llama_cpp_grammar_files_parse(path):
    g = Grammar(path.read_text())
    assert g.start_stacks


def test_error_names_line_column_and_expected():
    with pytest.raises(GrammarError) as ei:
        parse_grammar('root ::= "a"\nfoo ::= ( "b" \n')
    e = ei.value
    assert (e.line, e.column, e.expected) == (3, 1, "')'")
    assert "line 3, column 1" in str(e)
    with pytest.raises(GrammarError, match="Undefined rule identifier 'numero'"):
        parse_grammar("root ::= numero\n")
    with pytest.raises(GrammarError, match="left recursion"):
        Grammar('root ::= root "a" | "a"')
    with pytest.raises(GrammarError, match="does not contain a 'root'"):
        Grammar('foo ::= "a"')


def test_empty_alternative_and_tokens():
    g = Grammar('root ::= "a" | ')  # llama.cpp accepts an empty alternative
    assert match_string(g, []) and match_string(g, [(0, b"a")])
    g = Grammar("root ::= <[5]> !<[5]>")
    assert match_string(g, [(5, b"x"), (6, b"y")])
    assert not match_string(g, [(5, b"x"), (5, b"x")])
    with pytest.raises(GrammarError, match="no vocab"):
        parse_grammar("root ::= <think>")


def test_partial_utf8():
    # a two-byte character split across tokens is accepted, a wrong continuation is not
    g = Grammar("root ::= [é] \"x\"")
    m = g.matcher()
    assert m.allows(1, b"\xc3")
    m.accept_token(1, b"\xc3")
    assert m.allows(2, b"\xa9x") and not m.allows(2, b"\xa8")
    m.accept_token(2, b"\xa9x")
    assert m.can_end
    assert decode_utf8(b"\xe2\x82") == ([], ((0x2 << 6) | 0x2, 1))
    assert decode_utf8(b"\x80")[1][1] == -1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.sampled_from(list('root::=|"ab\\[]^-(){}*+?.,<>!#0123456789 \n\txu')) | st.characters(),
               max_size=60))
def test_parser_fuzz_parse_or_grammar_error(text):
    try:
        Grammar(text)
    except GrammarError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_parser_fuzz_after_valid_prefix(tail):
    try:
        Grammar('root ::= "a" ' + tail)
    except GrammarError:
        pass


# -- the sampler on a real vocabulary ------------------------------------------------------

JSON_GBNF = (DATA / "json.gbnf").read_text()


@pytest.fixture(scope="module")
def smol_vocab(smollm2_path):
    from pyllama.model import Model

    return Model.load(str(smollm2_path), vocab_only=True).vocab


@pytest.fixture(scope="module")
def smol_llm(smollm2_path):
    from pyllama import Llama

    return Llama(str(smollm2_path), n_ctx=512, verbose=False)


def _per_candidate(gs) -> "np.ndarray":
    import numpy as np

    return np.array([gs.allows(t) for t in range(gs._trie.n_vocab)])


@pytest.mark.parametrize("grammar, prefixes", [
    (JSON_GBNF, ["", '{"', 'na', 'me":', ' "x', "y\\", 'u00e9", "n": [1, -2.5e']),
    ('root ::= "héllo" | [α-ω]+ "!" | "日本" .', ["", "\u03b1", "\u03b2\u03b3"]),
    ("root ::= <[28]> (!<[2]>)* <[2]>", [""]),
])
def test_trie_mask_equals_per_candidate_verdicts(smol_vocab, grammar, prefixes):
    """The trie walk gives llama.cpp's per-candidate verdict for every token of the vocabulary,
    after each of the (cumulative) prefixes."""
    from pyllama.grammar import GrammarSampler

    gs = GrammarSampler(smol_vocab, grammar)
    for text in prefixes:
        for t in smol_vocab.tokenize(text, add_special=False, parse_special=False):
            gs.accept(t)
        assert (gs.allowed_mask() == _per_candidate(gs)).all(), text


def test_partial_utf8_token_mask(smol_vocab):
    """After a token ending inside a UTF-8 sequence only continuations are allowed."""
    from pyllama.grammar import GrammarSampler

    gs = GrammarSampler(smol_vocab, 'root ::= "é" "x"')
    tr = gs._trie
    lead = next(t for t, p in enumerate(tr.pieces) if p == b"\xc3")
    gs.accept(lead)
    assert gs.matcher.partial[1] == 1
    mask = gs.allowed_mask()
    assert mask.any() and (mask == _per_candidate(gs)).all()
    assert all(tr.pieces[t].startswith(b"\xa9") for t in mask.nonzero()[0])


def test_sampler_in_a_chain(smol_vocab):
    import numpy as np

    from pyllama.llama_api import llama_sampler_init_grammar
    from pyllama.sampling import GreedySampler, SamplerChain

    gs = llama_sampler_init_grammar(smol_vocab, 'root ::= "ab" "c"*', "root")
    chain = SamplerChain([gs, GreedySampler()])
    rng = np.random.default_rng(0)
    text = b""
    for _ in range(4):
        tok = chain.sample(rng.standard_normal(len(smol_vocab)).astype(np.float32))
        assert not smol_vocab.is_eog(tok) or text.startswith(b"ab")
        if smol_vocab.is_eog(tok):
            break
        text += smol_vocab.token_to_piece(tok, special=True)
    assert text.startswith(b"ab"[:len(text)]) and set(text[2:]) <= {ord("c")}
    assert llama_sampler_init_grammar(smol_vocab, "root ::= (", "root") is None
    assert llama_sampler_init_grammar(smol_vocab, 'foo ::= "a"', "root") is None


def test_json_generation_parses(smol_llm):
    from pyllama.llama_grammar import LlamaGrammar

    g = LlamaGrammar.from_string(JSON_GBNF)
    r = smol_llm.create_completion("Describe a cat as a JSON object with name and age:\n", max_tokens=64,
                                   temperature=0.0, grammar=g)
    assert r["choices"][0]["finish_reason"] == "stop"
    json.loads(r["choices"][0]["text"])


def test_json_object_response_format(smol_llm):
    r = smol_llm.create_chat_completion([{"role": "user", "content": "Give me a JSON object with a name."}],
                                        max_tokens=64, temperature=0.0, response_format={"type": "json_object"})
    assert r["choices"][0]["finish_reason"] == "stop"
    assert isinstance(json.loads(r["choices"][0]["message"]["content"]), dict)


def test_grammar_admitting_the_greedy_text_changes_nothing(smol_llm):
    from pyllama.llama_grammar import LlamaGrammar

    prompt = "The capital of France is"
    free = smol_llm.create_completion(prompt, max_tokens=24, temperature=0.0)["choices"][0]["text"]
    lit = free.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    g = LlamaGrammar.from_string(f'root ::= "{lit}" .*')
    constrained = smol_llm.create_completion(prompt, max_tokens=24, temperature=0.0, grammar=g)
    assert constrained["choices"][0]["text"] == free


def test_llama_grammar_api(tmp_path):
    from pyllama.llama_grammar import LlamaGrammar

    f = tmp_path / "g.gbnf"
    f.write_text('root ::= "yes" | "no"\n')
    g = LlamaGrammar.from_file(f)
    assert g._root == "root" and "yes" in g._grammar
    with pytest.raises(GrammarError):
        LlamaGrammar.from_string("root ::= [a-")
    assert "root ::=" in LlamaGrammar.from_json_schema('{"type": "object"}')._grammar
    with pytest.raises(GrammarError, match="'pattern'"):
        LlamaGrammar.from_json_schema('{"type": "string", "pattern": "^(a+$"}')  # not a regex
    import pyllama.compat

    assert pyllama.compat.as_llama_cpp().llama_grammar.LlamaGrammar is LlamaGrammar


class _FakeVocab:
    """The little of a Vocab the grammar sampler reads: pieces, EOG ids, the size."""

    def __init__(self, pieces: list[bytes], eog=(0,)):
        self.pieces, self.eog_ids = pieces, set(eog)

    def __len__(self) -> int:
        return len(self.pieces)

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        return self.pieces[token]


_ATOMS = ['"a"', '"ab"', '[a-c]', '[^a]', '.', '"é"', '[α-ω]', '"日"', "<[3]>", "!<[4]>", "x", "(y | )"]
_PIECES = [b"a", b"b", b"c", b"ab", b"abc", b"ba", b"\xc3", b"\xa9", b"\xc3\xa9", b"\xce", b"\xb1a", b"\xe6\x97",
           b"\xa5", b"\xe6\x97\xa5", b"z", b"", b"\x00a", b"\x80", b"aa", b"\xff"]


@st.composite
def _grammars(draw):
    def seq():
        items = draw(st.lists(st.sampled_from(_ATOMS), min_size=1, max_size=4))
        return " ".join(i + draw(st.sampled_from(["", "*", "+", "?", "{1,2}"])) for i in items)

    root = " | ".join(seq() for _ in range(draw(st.integers(1, 3))))
    return f"root ::= {root}\nx ::= [a-b] x | \"c\"\ny ::= \"b\"+\n"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_grammars(), st.lists(st.integers(0, 1000), max_size=6))
def test_trie_mask_equals_per_candidate_on_random_grammars(grammar, choices):
    """Random grammars over a small vocabulary of whole, split and invalid UTF-8 pieces:
    after each accepted token the mask equals llama.cpp's per-candidate verdicts."""
    import numpy as np

    from pyllama.grammar import GrammarSampler

    try:
        gs = GrammarSampler(_FakeVocab(_PIECES), grammar)
    except GrammarError as e:  # e.g. (y | )*: llama.cpp sees left recursion there too
        assert "left recursion" in str(e)
        return
    for c in [*choices, None]:
        mask = gs.allowed_mask()
        ref = np.array([gs.allows(t) for t in range(len(_PIECES))])
        assert (mask == ref).all()
        allowed = np.nonzero(mask)[0]
        if c is None or not len(allowed):
            break
        try:
            gs.accept(int(allowed[c % len(allowed)]))
        except GrammarError:
            # llama.cpp's quirk, kept: a piece whose text leads into a token element (here
            # "ab" into "a" <[3]>, token 3 = "ab") passes the mask (the rest of a piece is
            # matched by id there) but accepting it by its text leaves no stack
            assert "<[" in grammar
            break


def test_text_token_references_use_the_vocabulary(smol_vocab):
    from pyllama.grammar import GrammarSampler

    g = Grammar('root ::= "hi" <|im_start|>', vocab=smol_vocab)
    im_start = smol_vocab.tokenize("<|im_start|>", add_special=False, parse_special=True)
    assert g.rules[0][-2] == (8, im_start[0])  # TOKEN
    with pytest.raises(GrammarError, match="exactly one token"):
        Grammar("root ::= <hello world>", vocab=smol_vocab)
    gs = GrammarSampler(smol_vocab, g)
    for t in smol_vocab.tokenize("hi", add_special=False):
        gs.accept(t)
    assert gs.allowed_mask().nonzero()[0].tolist() == im_start
