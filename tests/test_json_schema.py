"""JSON schema -> GBNF (pyllama.json_schema): llama.cpp's carried-over schema cases give
the same verdicts; unsupported keywords are refused by name and path; generated
documents for simple schemas are accepted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyllama.grammar import Grammar, GrammarError, match_string
from pyllama.json_schema import json_schema_to_grammar
from pyllama.llama_grammar import LlamaGrammar

CASES = [c for c in json.loads((Path(__file__).parent / "data" / "grammar" / "llama_cpp_cases.json")
                               .read_text(encoding="utf-8"))["integration"] if c.get("schema")]
REFUSED_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "pattern",
                    "format", "prefixItems", "items", "additionalProperties", "allOf")


def _items(s):
    return [(0, p[1].encode("utf-8")) for p in s]


def test_case_count():
    assert len(CASES) == 33


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["desc"] or "blank")
def test_schema_cases_equal_llama_cpp(case):
    try:
        g = Grammar(json_schema_to_grammar(case["schema"]))
    except GrammarError as e:
        assert any(repr(k) in str(e) for k in REFUSED_KEYWORDS), e
        pytest.skip(f"refused: {e}")
    wrong = [s for s in case["passing"] if not match_string(g, _items(s))]
    wrong += [s for s in case["failing"] if match_string(g, _items(s))]
    assert not wrong


def test_refusal_names_keyword_and_path():
    with pytest.raises(GrammarError, match=r"'pattern' at #/properties/a/pattern"):
        json_schema_to_grammar({"type": "object", "properties": {"a": {"type": "string", "pattern": "x+"}}})


def test_from_json_schema():
    g = LlamaGrammar.from_json_schema('{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}')
    assert match_string(g._compiled, [(0, b'{"a": 12}')])
    assert not match_string(g._compiled, [(0, b'{"a": "x"}')])


def test_local_ref():
    sch = {"$defs": {"n": {"type": "integer"}}, "type": "array", "items": {"$ref": "#/$defs/n"}}
    g = Grammar(json_schema_to_grammar(sch))
    assert match_string(g, [(0, b"[1, 2]")]) and not match_string(g, [(0, b'["a"]')])


def _text(max_size):
    return st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=max_size)


_PRIM = st.sampled_from([("string", _text(max_size=8)), ("integer", st.integers(-10**6, 10**6)),
                         ("boolean", st.booleans()), ("null", st.none())])


@st.composite
def _schema_and_doc(draw, depth=0):
    kind = draw(st.sampled_from(["prim", "enum", "array", "object"] if depth < 2 else ["prim", "enum"]))
    if kind == "prim":
        t, vals = draw(_PRIM)
        return {"type": t}, draw(vals)
    if kind == "enum":
        vals = draw(st.lists(st.one_of(_text(max_size=5), st.integers(-99, 99)), min_size=1, max_size=4))
        return {"enum": vals}, draw(st.sampled_from(vals))
    if kind == "array":
        sub, _ = draw(_schema_and_doc(2))  # items: a primitive or enum
        n = draw(st.integers(0, 3))
        docs = [draw(_doc_for(sub)) for _ in range(n)]
        return {"type": "array", "items": sub}, docs
    names = draw(st.lists(st.text("abcxyz", min_size=1, max_size=4), unique=True, max_size=3))
    props, doc, req = {}, {}, []
    for k in names:
        sub, v = draw(_schema_and_doc(depth + 1))
        props[k] = sub
        if draw(st.booleans()):
            req.append(k)
            doc[k] = v
        elif draw(st.booleans()):
            doc[k] = v
    return {"type": "object", "properties": props, "required": req}, doc


def _doc_for(sub):
    if "enum" in sub:
        return st.sampled_from(sub["enum"])
    return {"string": _text(max_size=5), "integer": st.integers(-99, 99), "boolean": st.booleans(),
            "null": st.none()}.get(sub.get("type"), st.just([] if sub.get("type") == "array" else {}))


def _ordered(schema, doc):
    """The document in llama.cpp's property order: required properties, then optional ones,
    each in the schema's order."""
    if schema.get("type") == "object":
        props = schema["properties"]
        keys = [k for k in props if k in schema["required"]] + [k for k in props if k not in schema["required"]]
        return {k: _ordered(props[k], doc[k]) for k in keys if k in doc}
    return doc


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_schema_and_doc())
def test_generated_documents_accepted(sd):
    schema, doc = sd
    doc = _ordered(schema, doc)
    g = Grammar(json_schema_to_grammar(schema))
    text = json.dumps(doc, ensure_ascii=False)
    assert match_string(g, [(0, text.encode("utf-8"))]), (schema, text)
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.validate(doc, schema)


def test_prefix_items_tuple():
    g = Grammar(json_schema_to_grammar({"prefixItems": [{"type": "integer"}, {"type": "string"}]}))
    assert match_string(g, [(0, b'[1, "a"]')])
    assert not match_string(g, [(0, b'["a", 1]')]) and not match_string(g, [(0, b"[1]")])
