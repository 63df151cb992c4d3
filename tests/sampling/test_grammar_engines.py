"""The Rust grammar engine (rust/core/src/grammar.rs) against the Python reference
(pyllama.grammar's GrammarMatcher and trie walk): the same full-vocabulary masks, bit for
bit, the same stacks, partial UTF-8 state and per-token verdicts, at many random points of
random accepted token sequences, for every grammar in tests/data/grammar, for JSON-schema
grammars, on SmolLM2's and Gemma 3's vocabularies."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyllama.grammar import Grammar, GrammarError, GrammarSampler, match_string
from pyllama.json_schema import json_schema_to_grammar

DATA = Path(__file__).parents[1] / "data" / "grammar"
GBNF = {p.stem: p.read_text() for p in sorted(DATA.glob("*.gbnf"))}
_SCHEMA_CASES = {c["name"]: c for c in json.loads((DATA / "llama_cpp_schema_grammars.json").read_text())["cases"]}
SCHEMAS = {
    "nested_schema": json.loads((DATA / "nested_schema.json").read_text()),
    **{name: _SCHEMA_CASES[name]["schema"] for name in [
        "regexp", "min -123 max 42", "string w/ min & max length", "N optional props",
        "mix of allOf, anyOf and $ref (similar to https://json.schemastore.org/tsconfig.json)",
        "empty schema (any value)",
    ]},
}
GRAMMARS = {**GBNF, **{f"schema:{k}": v for k, v in SCHEMAS.items()}}


def _grammar_text(name: str) -> str:
    if name.startswith("schema:"):
        return json_schema_to_grammar(SCHEMAS[name[len("schema:"):]])
    return GRAMMARS[name]


_VOCABS: dict = {}
_SAMPLERS: dict = {}


def _vocab(which: str, smollm2_path, gemma3_path):
    if which not in _VOCABS:
        from pyllama.model import Model

        path = smollm2_path if which == "smollm2" else gemma3_path
        _VOCABS[which] = Model.load(str(path), vocab_only=True).vocab
    return _VOCABS[which]


def _pair(which: str, name: str, vocab) -> tuple[GrammarSampler, GrammarSampler]:
    """(rust, python) samplers of one grammar in the start state (built once, cloned)."""
    key = (which, name)
    if key not in _SAMPLERS:
        g = Grammar(_grammar_text(name), vocab=vocab)
        _SAMPLERS[key] = (GrammarSampler(vocab, g, engine="rust"), GrammarSampler(vocab, g, engine="py"))
    rs, ps = _SAMPLERS[key]
    rs, ps = rs.clone(), ps.clone()
    rs.reset()
    ps.reset()
    return rs, ps


def _fresh_masks(rs: GrammarSampler, ps: GrammarSampler) -> tuple[np.ndarray, np.ndarray]:
    rs._masks.clear()  # computed now, not found in the per-state cache
    ps._masks.clear()
    return rs.allowed_mask(), ps.allowed_mask()


def _same_state(rs: GrammarSampler, ps: GrammarSampler) -> None:
    assert sorted(rs.matcher.stacks) == sorted(ps.matcher.stacks)
    assert rs.matcher.partial == ps.matcher.partial
    assert rs.matcher.can_end == ps.matcher.can_end


def _walk(which, name, vocab, seed: int, steps: int) -> None:
    """A random accepted token sequence: at each step the masks of both engines are equal
    (and so are the verdicts on a sample of single tokens), then both accept one allowed
    token, mostly a one-byte one so that the walk gets through the grammar's structure."""
    rng = random.Random(seed)
    rs, ps = _pair(which, name, vocab)
    tr = rs._trie
    short = np.array([len(p) == 1 for p in tr.pieces])
    for step in range(steps):
        mr, mp = _fresh_masks(rs, ps)
        diff = np.nonzero(mr != mp)[0]
        assert not len(diff), (name, step, [(int(t), tr.pieces[t], bool(mr[t])) for t in diff[:10]])
        for t in rng.sample(range(tr.n_vocab), 64):
            assert rs.allows(t) == ps.allows(t), (name, step, t, tr.pieces[t])
        allowed = np.nonzero(mr & ~tr.eog)[0]
        if not len(allowed):
            break
        pick = np.nonzero(mr & short)[0] if rng.random() < 0.75 else allowed
        if not len(pick):
            pick = allowed
        t = int(pick[rng.randrange(len(pick))])
        results = []
        for s in (rs, ps):
            try:
                s.accept(t)
                results.append(None)
            except GrammarError as e:
                results.append(str(e))
        assert results[0] == results[1], (name, step, t, results)
        if results[0] is not None:
            # llama.cpp's quirk: a piece that runs into a token element passes the mask
            break
        _same_state(rs, ps)


@pytest.mark.parametrize("name", list(GRAMMARS))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_rust_masks_equal_python_smollm2(name, seed, smollm2_path, gemma3_path):
    _walk("smollm2", name, _vocab("smollm2", smollm2_path, gemma3_path), seed, 12)


@pytest.mark.parametrize("name", list(GRAMMARS))
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_rust_masks_equal_python_gemma3(name, seed, smollm2_path, gemma3_path):
    _walk("gemma3", name, _vocab("gemma3", smollm2_path, gemma3_path), seed, 8)


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_rust_masks_equal_python_along_real_documents(which, smollm2_path, gemma3_path):
    """Documents a model would write, tokenized by the vocabulary: equal masks after every
    token (strings, numbers, nesting, escapes, non-ASCII and split UTF-8 inside)."""
    vocab = _vocab(which, smollm2_path, gemma3_path)
    docs = [
        ("json", '{"name": "Zoë \\"Z\\" Ångström", "age": 36, "tags": ["日本語", "x\\u00e9"], '
                 '"nested": {"x": [1, 2.5e3, -7], "ok": true, "none": null}}'),
        ("schema:nested_schema", '{"name": "Ada Lovelace", "role": "admin", "orders": [{"id": 3, "sku": "ABC-1234", '
                                 '"status": "new", "size": {"w": 1.5, "h": 2}}], "tags": ["math", "poetry"]}'),
        ("arithmetic", "(1+2)*3-4/(5+x) = 7\n"),
        ("c", "int main(int argc){x = 3;return x*2;}"),
    ]
    for name, text in docs:
        rs, ps = _pair(which, name, vocab)
        for i, t in enumerate(vocab.tokenize(text, add_special=False, parse_special=False)):
            mr, mp = _fresh_masks(rs, ps)
            assert (mr == mp).all(), (name, i)
            assert mr[t], (name, i, vocab.token_to_piece(t))
            rs.accept(t)
            ps.accept(t)
            _same_state(rs, ps)
        assert rs.matcher.can_end and ps.matcher.can_end


def test_split_utf8_state_masks_equal(smollm2_path, gemma3_path):
    """After a token that ends inside a UTF-8 sequence (the per-candidate path)."""
    vocab = _vocab("smollm2", smollm2_path, gemma3_path)
    rs, ps = _pair("smollm2", "json", vocab)
    tr = rs._trie
    lead = next(t for t, p in enumerate(tr.pieces) if p == b"\xc3")
    for t in vocab.tokenize('{"a": "', add_special=False, parse_special=False) + [lead]:
        rs.accept(t)
        ps.accept(t)
    assert rs.matcher.partial == ps.matcher.partial and rs.matcher.partial[1] == 1
    mr, mp = _fresh_masks(rs, ps)
    assert mr.any() and (mr == mp).all()


@pytest.mark.parametrize("case", [c for c in json.loads((DATA / "llama_cpp_cases.json").read_text())["integration"]
                                  if "grammar" in c], ids=lambda c: c["desc"])
def test_rust_engine_integration_verdicts(case):
    """llama.cpp's test-grammar-integration verdicts on both engines."""
    from test_grammar import _items

    g = Grammar(case["grammar"])
    for engine in ("rust", "py"):
        assert all(match_string(g, _items(s), engine) for s in case["passing"]), engine
        assert not any(match_string(g, _items(s), engine) for s in case["failing"]), engine


def test_engine_selection(monkeypatch):
    from pyllama.grammar import GrammarMatcher, RustGrammarMatcher

    g = Grammar('root ::= "a"')
    assert isinstance(g.matcher(), RustGrammarMatcher)
    assert isinstance(g.matcher("py"), GrammarMatcher)
    monkeypatch.setenv("PYLLAMA_GRAMMAR", "py")
    assert isinstance(g.matcher(), GrammarMatcher)
    monkeypatch.setenv("PYLLAMA_GRAMMAR", "fast")
    with pytest.raises(ValueError, match="PYLLAMA_GRAMMAR"):
        g.matcher()


def test_rust_rules_refuse_bad_arrays():
    """The Rust engine checks what it is handed (clear errors, never a panic)."""
    from pyllama import _core

    END, ALT, RULE_REF, CHAR, CHAR_RNG_UPPER = 0, 1, 2, 3, 5
    bad = [
        ([CHAR], [97], [0], 0, "END"),                          # a rule without END
        ([RULE_REF, END], [5, 0], [0], 0, "undefined rule"),
        ([CHAR_RNG_UPPER, END], [97, 0], [0], 0, "must follow a char"),
        ([CHAR, END], [97, 0], [0], 3, "root rule"),
        ([RULE_REF, CHAR, END], [0, 97, 0], [0], 0, "left recursion"),
        ([CHAR, END], [97], [0], 0, "values"),
        ([42, END], [0, 0], [0], 0, "unknown type"),
        ([], [], [], 0, "empty grammar"),
    ]
    for types, values, starts, root, msg in bad:
        with pytest.raises(ValueError, match=msg):
            _core.GrammarRules(types, values, starts, root)
    with pytest.raises(OverflowError):
        _core.GrammarRules([CHAR, END], [-1, 0], [0], 0)
    rules = _core.GrammarRules([CHAR, ALT, END], [97, 0, 0], [0], 0)
    s = _core.GrammarState(rules)
    assert not s.accept_token(1, b"b") and s.stacks == [[0], []]  # unchanged
    assert s.accept_token(1, b"a") and s.can_end
    trie = _core.TokenTrie([b"a", b"", b"\x00", b"\xff", b"b"], [1, 99])
    assert s.mask(trie).tolist() == [False, True, False, False, False]


def test_lazy_grammar_on_the_rust_engine(smollm2_path, gemma3_path):
    """LazyGrammarSampler runs on either engine with the same result."""
    from pyllama.grammar import LazyGrammarSampler

    vocab = _vocab("smollm2", smollm2_path, gemma3_path)
    text = 'Sure. <tool_call>{"a": 1}'
    toks = vocab.tokenize(text, add_special=False, parse_special=False)
    out = {}
    for engine in ("rust", "py"):
        lz = LazyGrammarSampler(vocab, GBNF["json"], trigger_patterns=["<tool_call>(\\{)"], engine=engine)
        states = []
        for t in toks:
            assert lz.allows(t)
            lz.accept(t)
            states.append((lz.awaiting_trigger, sorted(lz.matcher.stacks)))
        out[engine] = (states, lz.allowed_mask().copy())
    assert out["rust"][0] == out["py"][0] and not out["rust"][0][-1][0]
    assert (out["rust"][1] == out["py"][1]).all()


@settings(max_examples=300, deadline=None)
@given(types=st.lists(st.integers(0, 11), max_size=12), values=st.lists(st.integers(0, 300), max_size=12),
       starts=st.lists(st.integers(0, 12), min_size=0, max_size=4), root=st.integers(0, 4),
       pieces=st.lists(st.binary(max_size=4), min_size=1, max_size=6), token=st.integers(0, 5))
def test_rust_engine_survives_any_arrays(types, values, starts, root, pieces, token):
    """Any rule arrays: a ValueError, or a grammar whose states accept, allow and mask any
    token without crashing (left recursion, dangling references, bad char classes, ...)."""
    from pyllama import _core

    try:
        rules = _core.GrammarRules(types, values, starts, root)
    except ValueError:
        return
    s = _core.GrammarState(rules)
    trie = _core.TokenTrie(pieces, [0])
    tok = token % len(pieces)
    m = s.mask(trie)
    assert len(m) == len(pieces)
    assert m[tok] == (s.can_end if tok == 0 else s.allows(tok, pieces[tok]))
    s.accept_token(tok, pieces[tok])
    s.accept_bytes(pieces[tok])
    s.mask(trie)


def test_invalid_utf8_state_masks_equal_verdicts():
    """A token with invalid UTF-8 accepted by a char loop leaves n_remain -1: the next masks
    still equal the per-candidate verdicts (llama.cpp decodes on from a fresh start there)."""
    from test_grammar import _FakeVocab

    pieces = [b"</s>", b"a", b"\x80", b"ab", b"\xc3", b"\xa9", b"\"", b"\xc3\xa9"]
    for engine in ("rust", "py"):
        gs = GrammarSampler(_FakeVocab(pieces), 'root ::= [^"]* "\\""', engine=engine)
        gs.matcher.accept_token(2, b"\x80")
        assert gs.matcher.partial == (0, -1)
        mask = gs.allowed_mask()
        assert mask.tolist() == [gs.allows(t) if t else gs.matcher.can_end for t in range(len(pieces))], engine
        assert mask[1] and mask[6]
