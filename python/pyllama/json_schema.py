"""JSON schema -> GBNF with llama.cpp's semantics (common/json-schema.cpp, which reads a
schema into nodes, and common/json-schema-to-grammar.cpp, which writes the rules; the
llama.cpp vendored in llama-cpp-python 0.3.36). For every schema in llama.cpp's
test-json-schema-to-grammar.cpp the grammar text is llama.cpp's, byte for byte (72 of
its 81 cases; the other 9 differ by the deviations listed at the end only, and its 33
integration cases give its verdict on every string); the rule names, their order and the
layout are the same (values carry no trailing whitespace; ``space`` sits after ``{``, ``[``, ``:``, ``,``
and before ``}`` / ``]``).

Supported, as llama.cpp does it:

* ``type`` (a string, or a list: one alternative per type), ``const``, ``enum`` (values
  written as compact JSON), ``anyOf`` / ``oneOf`` (both as a plain union: oneOf's
  exclusivity is not enforced), local ``$ref`` (``#/...`` pointers into the document,
  recursion included; ``#`` alone, the root, is a pyllama extension).
* Objects: ``properties`` (required ones first, then optional ones, each group in schema
  order), ``required``, ``additionalProperties`` false / true / a schema (extra key-value
  pairs after the declared ones, keys that are none of the declared names);
  ``{"type": "object"}`` alone is any object.
* ``allOf`` (used when the schema has no properties of its own and its type is none,
  object or string): the object properties of the members are merged (through ``$ref``);
  every property of a member is required, a property of a member's ``anyOf`` alternative
  is optional; the member's own ``required`` and ``additionalProperties`` are not read
  and the merged object takes no other keys. If the members have enums, the values
  common to all members are the result instead.
* Arrays: ``items`` (a schema, or a list: a tuple), ``prefixItems`` (``items`` wins when
  both are given), ``minItems`` / ``maxItems``.
* Strings: ``pattern``, ``format``, ``minLength`` / ``maxLength``. ``pattern`` wins over
  ``format``, which wins over the lengths (the losers are dropped, as in llama.cpp).
  Formats with a grammar: ``date``, ``time`` (with seconds and a zone), ``date-time``,
  ``uuid`` (and ``uuid1`` .. ``uuid5``); any other format is a plain string (with the
  length bounds, and a SchemaWarning). ``date`` checks month 01-12 and day 01-31 only, as llama.cpp.
* ``pattern``: llama.cpp's translation of the regex subset: the pattern must be anchored
  (``^...$``); literals, ``\\`` escapes of ``^$.[](){}|*+?``, the GBNF escapes ``\\x..``
  ``\\u....`` ``\\U........`` ``\\t`` ``\\r`` ``\\n`` ``\\\\`` ``\\"`` ``\\-``, ``.``, character
  classes ``[...]`` / ``[^...]`` (with the same escapes), groups ``(...)`` and
  ``(?:...)``, alternation ``|`` (a top-level ``^a|b$`` is ``a`` or ``b``, whole), and
  ``?`` ``*`` ``+`` ``{m}`` ``{m,}`` ``{m,n}``. A pattern outside the subset (unanchored,
  lookaround or named groups, ``\\d`` ``\\w`` ``\\s`` and other escapes, an anchor inside
  the pattern, nesting deeper than 100, malformed braces) gives any string, as llama.cpp
  does, with a :class:`SchemaWarning` naming the keyword, its path and the reason. A
  pattern that is not a regex at all (unbalanced parentheses, an unterminated class,
  nothing to repeat, a trailing backslash) raises :class:`GrammarError`.
* ``integer`` with ``minimum`` / ``maximum`` / ``exclusiveMinimum`` /
  ``exclusiveMaximum`` (llama.cpp's digit-range rules; ``minimum`` wins over
  ``exclusiveMinimum``, ``maximum`` over ``exclusiveMaximum``; a fractional bound is
  rounded inwards). On ``number`` the bounds are dropped, as llama.cpp drops them: any
  number is accepted (with a SchemaWarning).
* ``true`` as a schema (any value) is a pyllama extension (llama.cpp wants an object).
* Annotations are read by nobody and pass silently: ``$schema``, ``$id``, ``$comment``,
  ``title``, ``description``, ``default``, ``examples``, ``deprecated``, ``readOnly``,
  ``writeOnly``; ``$defs`` / ``definitions`` are read through ``$ref`` only.

Refused with :class:`GrammarError` (the JSON path in the message), as llama.cpp refuses
them: an unknown ``type`` or one that is not a string or a list, empty ``anyOf`` /
``oneOf`` / ``allOf`` / ``enum`` / ``type``, a non-local or unresolvable ``$ref``,
``minItems`` / ``maxItems`` / ``minLength`` / ``maxLength`` that are not non-negative
integers, non-numeric bounds, a ``pattern`` or ``format`` that is not a string,
``additionalProperties`` that is neither a boolean nor a schema, ``false`` (or anything
but an object or ``true``) as a schema, and a ``pattern`` that is not a regex (keyword
``'pattern'`` and its path named).

Not enforced, as in llama.cpp (so the grammar is llama.cpp's), but never silently: each
gives a :class:`SchemaWarning` naming the keyword and its path --

* keywords llama.cpp's converter does not read (``not``, ``if``, ``multipleOf``,
  ``uniqueItems``, ``patternProperties``, ``minProperties``, ``contains``, ...);
* keywords it reads and drops: number (non-integer) bounds; ``minLength`` /
  ``maxLength`` next to ``pattern`` or a known ``format``; an unknown ``format``;
  ``format`` next to ``pattern``; ``exclusiveMinimum`` next to ``minimum`` (and the
  maximum pair); ``minItems`` / ``maxItems`` on a tuple; ``prefixItems`` next to
  ``items``; ``required`` naming undeclared properties; sibling keywords (but ``type``) of
  ``$ref``, ``anyOf`` / ``oneOf``, ``const``, ``enum``; ``allOf`` next to properties or on another
  type than object / string; allOf members that are neither objects nor enums, and
  ``required`` inside an allOf's ``anyOf`` alternative;
* an unsupported ``pattern`` (any string instead, the one warning llama.cpp prints too).

A keyword of another type than the node's (``minLength`` on an integer) constrains no
value the grammar admits and passes silently. Also as in llama.cpp: ``oneOf`` is not
exclusive, and an additional property's key may not be a proper prefix of a declared
name (llama.cpp's exclusion trie), so some valid keys are not offered.

Deviations from llama.cpp's grammar text, each where llama.cpp's grammar is wrong (found
by tests/sampling/test_json_schema.py's differential and generation tests):

1. A pattern is matched against the JSON text between the quotes, so the translation
   keeps that text valid JSON for the string it stands for: a literal ``"`` or ``\\`` (or
   ``\\"``, ``\\\\``, ``\\x22``...) is written escaped (``\\"``, ``\\\\``), ``\\n`` ``\\r``
   ``\\t`` and other control characters as their JSON escapes; ``.`` is any character but
   ``"``, ``\\``, control characters, or the escapes ``\\"`` ``\\\\`` ``\\b`` ``\\f``
   ``\\t`` (llama.cpp: ``[^\\x0A\\x0D]``, which lets the model close the string early or
   write a bare control character); a character class that holds ``"``, ``\\`` or a
   control character (a negated class always does) has those replaced by their JSON
   escapes (``\\b \\f \\n \\r \\t`` and ``\\"`` ``\\\\``; other control characters are
   left out).
2. A quantifier after an escaped literal character repeats that character only
   (llama.cpp repeats the whole run of literals before it: ``^ab\\.+$`` became
   ``("ab.")+``).
3. A property named ``""`` at the top level gets its own rule (llama.cpp names its value
   rule ``root``, so the whole grammar became that property's value).
4. The additional-properties key rule (a string that is none of the declared names):
   where a key leaves every declared name it does so with a character the ``char`` rule
   admits (llama.cpp's ``[^"...]`` let a raw control character or a bare backslash in,
   so the model wrote invalid JSON); declared names are followed as their JSON text
   spells them (an escape for ``"``, ``\\`` and control characters) and escaped inside
   character classes (llama.cpp wrote ``]``, ``-``, ``\\`` and ``^`` raw there).
5. Integer bounds: a minimum whose digits after the first start with a zero keeps its
   width (llama.cpp's ``minimum: 100`` let ``10`` in, ``1005`` let ``15`` in); a
   not-leading digit position may hold 0 (``minimum: 1105`` shut ``10000``..``10999``
   out); no leading zero after the minus sign of a negative maximum (``maximum: -5``
   let ``-05`` in).
"""

from __future__ import annotations

import json
import math
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

from .grammar import GrammarError

__all__ = ["json_schema_to_grammar", "SchemaWarning"]


class SchemaWarning(UserWarning):
    """A schema constraint the grammar cannot express (llama.cpp's conversion warning:
    an unsupported ``pattern`` becomes any string)."""


INT_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

SPACE_RULE = '| " " | "\\n"{1,2} [ \\t]{0,20}'

# name -> (content, deps): llama.cpp's PRIMITIVE_RULES and STRING_FORMAT_RULES
PRIMITIVE_RULES: dict[str, tuple[str, list[str]]] = {
    "boolean": ('("true" | "false")', []),
    "decimal-part": ("[0-9]{1,16}", []),
    "integral-part": ("[0] | [1-9] [0-9]{0,15}", []),
    "number": ('("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?',
               ["integral-part", "decimal-part"]),
    "integer": ('("-"? integral-part)', ["integral-part"]),
    "value": ("object | array | string | number | boolean | null",
              ["object", "array", "string", "number", "boolean", "null"]),
    "object": ('"{" space ( string ":" space value ("," space string ":" space value)* )? space "}"',
               ["string", "value"]),
    "array": ('"[" space ( value ("," space value)* )? space "]"', ["value"]),
    "uuid": ('"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} '
             '"-" [0-9a-fA-F]{12} "\\""', []),
    "char": ('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})', []),
    "string": ('"\\"" char* "\\""', ["char"]),
    "null": ('"null"', []),
}
STRING_FORMAT_RULES: dict[str, tuple[str, list[str]]] = {
    "date": ('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )', []),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? '
             '( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )', []),
    "date-time": ('date "T" time', ["date", "time"]),
    "date-string": ('"\\"" date "\\""', ["date"]),
    "time-string": ('"\\"" time "\\""', ["time"]),
    "date-time-string": ('"\\"" date-time "\\""', ["date-time"]),
}
RESERVED_NAMES = {"root"} | set(PRIMITIVE_RULES) | set(STRING_FORMAT_RULES)

# a JSON-safe '.': any character that needs no escape, or the escapes of '"', '\', and
# the control characters '.' matches (not \n, \r) -- deviation 1
DOT_RULE = '[^"\\\\\\x00-\\x1F] | [\\\\] (["\\\\bft])'

ANNOTATIONS = {"$schema", "$id", "$comment", "title", "description", "default", "examples",
               "deprecated", "readOnly", "writeOnly", "$defs", "definitions"}
KEYWORDS = {"$ref", "anyOf", "oneOf", "allOf", "type", "const", "enum", "properties", "required",
            "additionalProperties", "items", "prefixItems", "minItems", "maxItems", "pattern",
            "format", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
            "exclusiveMaximum"} | ANNOTATIONS

# the JSON type each validation keyword constrains; a keyword of another type than a node's
# loses nothing when it is not enforced
_FAMILY = {**dict.fromkeys(("pattern", "format", "minLength", "maxLength", "contentEncoding",
                            "contentMediaType"), "string"),
           **dict.fromkeys(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"), "number"),
           **dict.fromkeys(("items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains",
                            "minContains", "maxContains", "unevaluatedItems", "additionalItems"), "array"),
           **dict.fromkeys(("properties", "required", "additionalProperties", "patternProperties",
                            "propertyNames", "minProperties", "maxProperties", "dependentRequired",
                            "dependentSchemas", "dependencies", "unevaluatedProperties"), "object")}
_FAMILY_OF_KIND = {"string": "string", "integer": "number", "number": "number", "array": "array",
                   "tuple": "array", "object": "object", "boolean": "boolean", "null": "null"}
_INVALID_RULE_CHARS = re.compile(r"[^a-zA-Z0-9-]+")
_LITERAL_ESCAPES = {"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"}
_MAX_PATTERN_DEPTH = 100
_NON_LITERAL = set("|.()[]{}*+?^$")
_ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS = set("^$.[](){}|*+?")
_JSON_SHORT_ESCAPES = {0x22: '"', 0x5C: "\\", 0x08: "b", 0x0C: "f", 0x0A: "n", 0x0D: "r", 0x09: "t"}


def format_literal(literal: str) -> str:
    """A GBNF string literal for ``literal`` (llama.cpp's format_literal)."""
    return '"' + "".join(_LITERAL_ESCAPES.get(c, c) for c in literal) + '"'


def _dump(value: Any) -> str:
    """Compact JSON, as nlohmann's dump()."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def build_repetition(item: str, lo: int, hi: int = INT_MAX, sep: str = "") -> str:
    """llama.cpp's build_repetition (``hi`` INT_MAX: unbounded)."""
    has_max = hi != INT_MAX
    if hi == 0:
        return ""
    if lo == 0 and hi == 1:
        return item + "?"
    if not sep:
        if lo == 1 and not has_max:
            return item + "+"
        if lo == 0 and not has_max:
            return item + "*"
        return f"{item}{{{lo},{hi if has_max else ''}}}"
    res = item + " " + build_repetition(f"({sep} {item})", 0 if lo == 0 else lo - 1,
                                        hi - 1 if has_max else hi)
    return f"({res})?" if lo == 0 else res


def _int_range(lo: int | None, hi: int | None) -> str:
    """llama.cpp's build_min_max_int (digit-range rules); lo / hi None: unbounded."""
    out: list[str] = []
    w = out.append

    def dr(a, b):
        w(f"[{a}]" if a == b else f"[{a}-{b}]")

    def more(n, m=None):
        m = n if m is None else m
        w("[0-9]" if n == m == 1 else f"[0-9]{{{n}}}" if n == m else f"[0-9]{{{n},{m}}}")

    def uni(f: str, t: str):
        i = 0
        while i < len(f) and i < len(t) and f[i] == t[i]:
            i += 1
        if i > 0:
            w(f'"{f[:i]}"')
        if i < len(f) and i < len(t):
            if i > 0:
                w(" ")
            n = len(f) - i - 1
            if n > 0:
                fs, ts, z, nn = f[i + 1:], t[i + 1:], "0" * n, "9" * n
                reached = False
                w("(")
                if fs == z:
                    dr(f[i], chr(ord(t[i]) - 1)); w(" "); more(n)
                else:
                    w(f"[{f[i]}] ("); uni(fs, nn); w(")")
                    if ord(f[i]) < ord(t[i]) - 1:
                        w(" | ")
                        if ts == nn:
                            dr(chr(ord(f[i]) + 1), t[i]); reached = True
                        else:
                            dr(chr(ord(f[i]) + 1), chr(ord(t[i]) - 1))
                        w(" "); more(n)
                if not reached:
                    w(" | "); dr(t[i], t[i]); w(" "); uni(z, ts)
                w(")")
            else:
                w(f"[{f[i]}-{t[i]}]")

    def both(lo, hi):
        if lo < 0 and hi < 0:
            w('"-" ('); both(-hi, -lo); w(")")
            return
        if lo < 0:
            w('"-" ('); both(0, -lo); w(") | ")
            lo = 0
        ls, hs = str(lo), str(hi)
        for d in range(len(ls), len(hs)):
            uni(ls, "9" * d)
            ls = "1" + "0" * d
            w(" | ")
        uni(ls, hs)

    def gen(lo, hi, dec=16, top=True):
        if lo is not None and hi is not None:
            both(lo, hi)
            return
        less = max(dec - 1, 1)
        if lo is not None:
            if lo < 0:
                w('"-" ('); gen(None, -lo, dec, False); w(") | [0] | [1-9] "); more(0, dec - 1)
            elif lo == 0:
                if top:
                    w("[0] | [1-9] "); more(0, less)
                else:
                    more(1, dec)
            elif lo <= 9:
                c, start = str(lo), "1" if top else "0"
                if c > start:
                    dr(start, chr(ord(c) - 1)); w(" "); more(1, less); w(" | ")
                dr(c, "9"); w(" "); more(0, less)
            else:
                ms = str(lo)
                c = ms[0]
                if c > ("1" if top else "0"):  # deviation 5: llama.cpp's c > '1' lost 0 here
                    dr("1" if top else "0", chr(ord(c) - 1)); w(" "); more(len(ms), less); w(" | ")
                dr(c, c); w(" (")
                rest = ms[1:]
                if rest.startswith("0") and len(rest) > 1:
                    # deviation 5: the rest keeps its width (llama.cpp's int(rest) dropped
                    # the leading zeros, so minimum 100 let 10 in)
                    uni(rest, "9" * len(rest))
                    if len(rest) < less:
                        w(" | "); more(len(rest) + 1, less)
                else:
                    gen(int(rest), None, less, False)
                w(")")
                if c < "9":
                    w(" | "); dr(chr(ord(c) + 1), "9"); w(" "); more(len(ms) - 1, less)
            return
        if hi >= 0:
            if top:
                w('"-" [1-9] '); more(0, less); w(" | ")
            both(0, hi)
        else:
            # deviation 5: no leading zero after the sign (llama.cpp's top_level=false let "-05" in)
            w('"-" ('); gen(-hi, None, dec, True); w(")")

    gen(lo, hi)
    return "".join(out)


# ---------------------------------------------------------------------------------------
# schema nodes (llama.cpp's common_chat_schema_*), read from JSON with llama.cpp's rules


@dataclass(eq=False)
class _Node:
    kind: str                      # any ref anyOf allOf const enum null boolean number integer
    path: str = "#"                # string array tuple object
    children: list = field(default_factory=list)     # anyOf / allOf / tuple items
    value: Any = None              # const
    values: list = field(default_factory=list)       # enum
    ref: str = ""
    target: "_Node | None" = None
    minimum: int = INT64_MIN       # integer (inclusive)
    maximum: int = INT64_MAX
    pattern: str = ""              # string
    fmt: str = ""                  # "", uuid, date, time, date-time
    min_length: int = 0
    max_length: int = -1
    items: "_Node | None" = None   # array
    min_items: int = 0
    max_items: int = -1
    properties: list = field(default_factory=list)   # object: [(name, node, required)]
    additional: "_Node | None" = None                 # object: None when not allowed


def _warn(msg: str) -> None:
    warnings.warn(SchemaWarning("JSON schema: " + msg), stacklevel=3)


def _fail(path: str, msg: str) -> GrammarError:
    return GrammarError(f"JSON schema error at {path}: {msg}")


class _Builder:
    def __init__(self, root: Any):
        self.root = root
        self.refs: dict[str, _Node | None] = {}
        self.pending: list[_Node] = []

    def build(self) -> _Node:
        node = self.node(self.root, "#")
        for r in self.pending:
            r.target = self.refs[r.ref]
        return node

    @staticmethod
    def count(s: dict, key: str, path: str, default: int) -> int:
        if key not in s:
            return default
        v = s[key]
        if not _is_int(v) or v < 0:
            raise _fail(path, f"{key} must be a non-negative integer")
        return v

    @staticmethod
    def bound(s: dict, key: str, path: str, round_up: bool) -> int:
        v = s[key]
        if _is_int(v):
            return v
        if not _is_num(v) or not math.isfinite(v):
            raise _fail(path, f"{key} must be a number")
        return math.ceil(v) if round_up else math.floor(v)

    @staticmethod
    def fmt(s: dict, path: str) -> str:
        if "format" not in s:
            return ""
        f = s["format"]
        if not isinstance(f, str):
            raise _fail(path, "format must be a string")
        if f in ("date", "time", "date-time"):
            return f
        if f == "uuid" or (len(f) == 5 and f.startswith("uuid") and "1" <= f[4] <= "5"):
            return "uuid"
        return ""

    def resolve(self, ref: str, path: str) -> Any:
        target = self.root
        for sel in ref[1:].split("/")[1:]:
            if isinstance(target, dict) and sel in target:
                target = target[sel]
            elif isinstance(target, list):
                idx = int(sel) if sel.isdigit() else len(target)
                if idx >= len(target):
                    raise _fail(path, f"cannot resolve $ref {ref}, {sel} is out of range")
                target = target[idx]
            else:
                raise _fail(path, f"cannot resolve $ref {ref}, {sel} not found")
        return target

    def build_ref(self, ref: Any, path: str) -> _Node:
        if not isinstance(ref, str):
            raise _fail(path, "$ref must be a string")
        if not (ref.startswith("#/") or ref == "#"):
            raise _fail(path, f"unsupported $ref {ref}, only references into the same document are supported")
        if ref not in self.refs:
            self.refs[ref] = None  # a cycle back to this $ref stops here
            self.refs[ref] = self.node(self.resolve(ref, path), ref)
        node = _Node("ref", path, ref=ref)
        self.pending.append(node)
        return node

    def alternatives(self, kind: str, alts: Any, path: str) -> _Node:
        if not isinstance(alts, list):
            raise _fail(path, "must be an array of schemas")
        if not alts:
            raise _fail(path, "must not be empty")
        return _Node(kind, path, children=[self.node(a, f"{path}/{i}") for i, a in enumerate(alts)])

    def obj(self, s: dict, path: str, used: set) -> _Node:
        node = _Node("object", path)
        used.update({"properties", "additionalProperties"} & s.keys())
        req = s.get("required")
        required = {n for n in req if isinstance(n, str)} if isinstance(req, list) else set()
        if "properties" in s:
            props = s["properties"]
            if not isinstance(props, dict):
                raise _fail(path, "properties must be an object")
            for name, prop in props.items():
                node.properties.append((name, self.node(prop, f"{path}/properties/{name}"), name in required))
            if "required" in s and isinstance(req, list) and all(n in props for n in req):
                used.add("required")
        if "additionalProperties" in s:
            ap = s["additionalProperties"]
            if isinstance(ap, bool):
                if ap:
                    node.additional = _Node("any", f"{path}/additionalProperties")
            elif isinstance(ap, dict):
                node.additional = self.node(ap, f"{path}/additionalProperties")
            else:
                raise _fail(path, "additionalProperties must be a boolean or a schema")
        elif "properties" not in s:
            node.additional = _Node("any", path)  # {"type": "object"} alone: any object
        return node

    def array(self, s: dict, path: str, used: set) -> _Node:
        if "items" in s or "prefixItems" in s:
            key = "items" if "items" in s else "prefixItems"
            used.add(key)
            items = s[key]
            if isinstance(items, list):
                return _Node("tuple", path, children=[self.node(x, f"{path}/{key}/{i}") for i, x in enumerate(items)])
            it = self.node(items, f"{path}/{key}")
        else:
            it = _Node("any", path)
        used.update({"minItems", "maxItems"} & s.keys())
        return _Node("array", path, items=it, min_items=self.count(s, "minItems", path, 0),
                     max_items=self.count(s, "maxItems", path, -1))

    def string(self, s: dict, path: str, used: set) -> _Node:
        node = _Node("string", path)
        if "pattern" in s:
            if not isinstance(s["pattern"], str):
                raise _fail(path, "pattern must be a string")
            node.pattern = s["pattern"]
        node.fmt = self.fmt(s, path)
        node.min_length = self.count(s, "minLength", path, 0)
        node.max_length = self.count(s, "maxLength", path, -1)
        # what the converter writes: the pattern, else the format, else the lengths
        if node.pattern:
            used.add("pattern")
        elif node.fmt:
            used.add("format")
        else:
            used.update({"minLength", "maxLength"} & s.keys())
        return node

    def integer(self, s: dict, path: str, used: set) -> _Node:
        node = _Node("integer", path)
        if "minimum" in s:
            node.minimum = self.bound(s, "minimum", path, True)
            used.add("minimum")
        elif "exclusiveMinimum" in s:
            node.minimum = self.bound(s, "exclusiveMinimum", path, False) + 1
            used.add("exclusiveMinimum")
        if "maximum" in s:
            node.maximum = self.bound(s, "maximum", path, False)
            used.add("maximum")
        elif "exclusiveMaximum" in s:
            node.maximum = self.bound(s, "exclusiveMaximum", path, True) - 1
            used.add("exclusiveMaximum")
        return node

    def node(self, s: Any, path: str) -> _Node:
        """The node for schema s; a SchemaWarning for each of its keywords that the
        grammar will not enforce."""
        if s is True:
            return _Node("any", path)  # pyllama extension: llama.cpp wants an object
        if not isinstance(s, dict):
            raise _fail(path, "schema must be an object")
        used = {"type"}
        node = self._node(s, path, used)
        typed = node.kind in _FAMILY_OF_KIND
        for k in s:
            if k in used or k in ANNOTATIONS:
                continue
            fam = _FAMILY.get(k)
            if typed and fam is not None and fam != _FAMILY_OF_KIND[node.kind]:
                continue  # a keyword for another type: no value the grammar admits is constrained by it
            what = "llama.cpp's converter does not read it" if k not in KEYWORDS else "llama.cpp ignores it here"
            warnings.warn(SchemaWarning(f"JSON schema: keyword {k!r} at {path}/{k} is not enforced by the grammar "
                                        f"({what})"), stacklevel=2)
        return node

    def _node(self, s: dict, path: str, used: set) -> _Node:
        if "$ref" in s:
            used.add("$ref")
            return self.build_ref(s["$ref"], path)
        if "oneOf" in s or "anyOf" in s:
            key = "oneOf" if "oneOf" in s else "anyOf"
            used.add(key)
            return self.alternatives("anyOf", s[key], f"{path}/{key}")
        t = s.get("type")
        if isinstance(t, list):
            if not t:
                raise _fail(path, "type must not be empty")
            used.update(s)  # each alternative reads (and warns about) the keywords
            return _Node("anyOf", path, children=[self.node({**s, "type": x}, path) for x in t])
        if "const" in s:
            used.add("const")
            return _Node("const", path, value=s["const"])
        if "enum" in s:
            used.add("enum")
            vals = s["enum"]
            if not isinstance(vals, list) or not vals:
                raise _fail(path, "enum must be a non-empty array")
            return _Node("enum", path, values=list(vals))
        if t is not None and not isinstance(t, str):
            raise _fail(path, "type must be a string or an array of strings")
        has_properties = "properties" in s or ("additionalProperties" in s and s["additionalProperties"] is not True)
        if t is None:
            if has_properties:
                return self.obj(s, path, used)
            if "allOf" in s:
                used.add("allOf")
                return self.alternatives("allOf", s["allOf"], f"{path}/allOf")
            if "items" in s or "prefixItems" in s:
                return self.array(s, path, used)
            if "pattern" in s or "minLength" in s or "maxLength" in s or self.fmt(s, path):
                return self.string(s, path, used)
            return _Node("any", path)
        if t == "object":
            if not has_properties and "allOf" in s:
                used.add("allOf")
                return self.alternatives("allOf", s["allOf"], f"{path}/allOf")
            return self.obj(s, path, used)
        if t == "string":
            if "allOf" in s:
                used.add("allOf")
                return self.alternatives("allOf", s["allOf"], f"{path}/allOf")
            return self.string(s, path, used)
        if t == "array":
            return self.array(s, path, used)
        if t == "integer":
            return self.integer(s, path, used)
        if t in ("number", "boolean", "null"):
            return _Node(t, path)
        raise _fail(path, f"unrecognized type {t}")


# ---------------------------------------------------------------------------------------
# pattern -> GBNF (llama.cpp's _pattern_to_rule, with deviations 1 and 2)


class _Unsupported(Exception):
    """A valid regex with no grammar equivalent."""


class _Invalid(Exception):
    """Not a regex."""


def _gbnf_escape_length(p: str, pos: int) -> int:
    """llama.cpp's gbnf_escape_length: the length of the GBNF escape at pos, 0 if none."""
    if pos + 1 >= len(p) or p[pos] != "\\":
        return 0
    e = p[pos + 1]
    if e in 'trn\\"[]-':
        return 2
    n_hex = {"x": 2, "u": 4, "U": 8}.get(e)
    if n_hex is None or pos + 2 + n_hex > len(p):
        return 0
    if not all(h in "0123456789abcdefABCDEF" for h in p[pos + 2:pos + 2 + n_hex]):
        return 0
    return 2 + n_hex


def _escape_value(esc: str) -> int:
    """The code point of a GBNF escape (as _gbnf_escape_length measured it)."""
    e = esc[1]
    if e in "xuU":
        return int(esc[2:], 16)
    return {"t": 9, "r": 13, "n": 10}.get(e, ord(e))


def _json_text(cp: int) -> str:
    """How code point cp is written inside a JSON string (decoded text)."""
    if cp in _JSON_SHORT_ESCAPES:
        return "\\" + _JSON_SHORT_ESCAPES[cp]
    if cp < 0x20:
        return f"\\u{cp:04x}"
    return chr(cp)


def _needs_json_escape(cp: int) -> bool:
    return cp < 0x20 or cp in (0x22, 0x5C)


def _class_char(cp: int) -> str:
    """cp written inside a GBNF character class."""
    c = chr(cp)
    if c in "\\]-":
        return "\\" + c
    if c == "^" or cp < 0x20 or cp == 0x7F:
        return f"\\x{cp:02X}"
    return c


def _class_range(a: int, b: int) -> str:
    return _class_char(a) if a == b else f"{_class_char(a)}-{_class_char(b)}"


def _parse_class(body: str) -> tuple[bool, list[tuple[int, int]]]:
    """A GBNF character class body (between '[' and ']') as llama.cpp's parser reads it:
    (negated, [(lo, hi), ...])."""
    i, neg, ranges = 0, False, []
    if body.startswith("^"):
        neg, i = True, 1

    def char(i):
        n = _gbnf_escape_length(body, i)
        if n:
            return _escape_value(body[i:i + n]), i + n
        return ord(body[i]), i + 1

    while i < len(body):
        lo, i = char(i)
        hi = lo
        if i + 1 < len(body) and body[i] == "-":
            hi, i = char(i + 1)
        ranges.append((lo, hi))
    return neg, ranges


_FORBIDDEN = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]


def _json_safe_class(text: str) -> str:
    """A pattern's character class ``[...]`` as GBNF over the JSON text: unchanged when it
    holds no '"', '\\' or control character, else those become their JSON escapes
    (deviation 1)."""
    neg, ranges = _parse_class(text[1:-1])

    def inside(cp):
        return any(lo <= cp <= hi for lo, hi in ranges)

    special = [cp for lo, hi in _FORBIDDEN for cp in range(lo, hi + 1)]
    allowed_special = [cp for cp in special if inside(cp) != neg]
    if not neg and not allowed_special:
        return text
    if neg:
        cls = "[^" + "".join(_class_range(a, b) for a, b in ranges) + '"\\\\\\x00-\\x1F]'
    else:
        # the class's ranges less the forbidden code points
        out, cuts = [], sorted(special)
        for lo, hi in sorted(ranges):
            cur = lo
            for cp in cuts:
                if cur <= cp <= hi:
                    if cur < cp:
                        out.append((cur, cp - 1))
                    cur = cp + 1
            if cur <= hi:
                out.append((cur, hi))
        cls = "[" + "".join(_class_range(a, b) for a, b in out) + "]" if out else ""
    esc = [_JSON_SHORT_ESCAPES[cp] for cp in sorted(allowed_special) if cp in _JSON_SHORT_ESCAPES]
    alts = [cls] if cls else []
    if esc:
        alts.append("[\\\\] [" + "".join("\\" + c if c in '\\"' else c for c in esc) + "]")
    if not alts:
        raise _Unsupported(f"character class {text} matches no character a JSON string can hold")
    return alts[0] if alts == [cls] else "(" + " | ".join(alts) + ")"


# ---------------------------------------------------------------------------------------
# nodes -> rules (llama.cpp's common_chat_schema_converter)


class _Converter:
    def __init__(self) -> None:
        self.rules: dict[str, str] = {"space": SPACE_RULE}
        self.refs_being_resolved: set[str] = set()

    def add_rule(self, name: str, rule: str) -> str:
        esc = _INVALID_RULE_CHARS.sub("-", name)
        if esc not in self.rules or self.rules[esc] == rule:
            self.rules[esc] = rule
            return esc
        i = 0
        while f"{esc}{i}" in self.rules and self.rules[f"{esc}{i}"] != rule:
            i += 1
        key = f"{esc}{i}"
        self.rules[key] = rule
        return key

    def add_primitive(self, name: str, rule: tuple[str, list[str]]) -> str:
        n = self.add_rule(name, rule[0])
        for dep in rule[1]:
            dep_rule = PRIMITIVE_RULES.get(dep) or STRING_FORMAT_RULES[dep]
            if dep not in self.rules:
                self.add_primitive(dep, dep_rule)
        return n

    def visit_primitive(self, rule_name: str, t: str) -> str:
        return self.add_primitive("root" if rule_name == "root" else t, PRIMITIVE_RULES[t])

    def union(self, name: str, alts: list[_Node]) -> str:
        return " | ".join(self.visit(a, name + ("alternative-" if not name else "-") + str(i))
                          for i, a in enumerate(alts))

    # -- pattern

    def visit_pattern(self, node: _Node, name: str) -> str:
        snapshot = dict(self.rules)
        try:
            return self.pattern_to_rule(node.pattern, name)
        except _Unsupported as e:
            self.rules = snapshot
            warnings.warn(SchemaWarning(
                f"JSON schema: keyword 'pattern' at {node.path}/pattern: {node.pattern!r} is not supported "
                f"({e}), accepting any string"), stacklevel=4)
            return self.add_rule(name, self.add_primitive("string", PRIMITIVE_RULES["string"]))
        except _Invalid as e:
            raise GrammarError(f"JSON schema: keyword 'pattern' at {node.path}/pattern: invalid pattern "
                               f"{node.pattern!r}: {e}") from None

    def pattern_to_rule(self, pattern: str, name: str) -> str:
        if len(pattern) < 2 or pattern[0] != "^" or pattern[-1] != "$":
            raise _Unsupported("not anchored with '^' and '$'")
        sub = pattern[1:-1]
        n = len(sub)
        sub_rule_ids: dict[str, str] = {}
        st = {"i": 0, "depth": 0}

        def to_rule(ls):
            s, is_literal = ls
            return f'"{s}"' if is_literal else s

        def literal_piece(cp: int, text: str) -> str:
            """text (a GBNF escape or raw character for cp) as it goes into a GBNF literal
            over the JSON text (deviation 1)."""
            if _needs_json_escape(cp):
                return "".join(_LITERAL_ESCAPES.get(c, c) for c in _json_text(cp))
            return text

        def transform():
            seq: list[tuple[str, bool]] = []

            def join_seq():
                ret, literal = [], ""
                for s, is_lit in seq:
                    if is_lit:
                        literal += s
                    else:
                        if literal:
                            ret.append((literal, True))
                            literal = ""
                        ret.append((s, False))
                if literal:
                    ret.append((literal, True))
                return " ".join(to_rule(x) for x in ret), False

            while st["i"] < n:
                i = st["i"]
                c = sub[i]
                if c == ".":
                    seq.append((self.add_rule("dot", DOT_RULE), False))
                    st["i"] += 1
                elif c == "(":
                    st["i"] += 1
                    i = st["i"]
                    if i < n and sub[i] == "?":
                        if i + 1 < n and sub[i + 1] == ":":
                            st["i"] += 2
                        else:
                            raise _Unsupported("unsupported group syntax")
                    st["depth"] += 1
                    if st["depth"] > _MAX_PATTERN_DEPTH:
                        raise _Unsupported("pattern nesting too deep")
                    seq.append(("(" + to_rule(transform()) + ")", False))
                elif c == ")":
                    st["i"] += 1
                    if st["depth"] == 0:
                        raise _Invalid("unbalanced parentheses")
                    st["depth"] -= 1
                    return join_seq()
                elif c in "^$":
                    raise _Unsupported("anchor inside the pattern")
                elif c == "[":
                    sq = "["
                    i += 1
                    while i < n and sub[i] != "]":
                        if sub[i] == "\\":
                            el = _gbnf_escape_length(sub, i)
                            if el == 0:
                                raise _Unsupported("unsupported escape in character class: " + sub[i:i + 2])
                            sq += sub[i:i + el]
                            i += el
                        else:
                            sq += sub[i]
                            i += 1
                    if i >= n:
                        raise _Invalid("unterminated character class")
                    st["i"] = i + 1
                    seq.append((_json_safe_class(sq + "]"), False))
                elif c == "|":
                    seq.append(("|", False))
                    st["i"] += 1
                elif c in "*+?":
                    if not seq:
                        raise _Invalid("nothing to repeat")
                    seq[-1] = (to_rule(seq[-1]) + c, False)
                    st["i"] += 1
                elif c == "{":
                    j = i + 1
                    while j < n and sub[j] != "}":
                        j += 1
                    if j >= n:
                        raise _Unsupported("unterminated curly brackets")
                    nums = sub[i + 1:j].split(",")
                    st["i"] = j + 1
                    lo, hi = 0, INT_MAX
                    if len(nums) not in (1, 2):
                        raise _Unsupported("wrong number of values in curly brackets")
                    try:
                        if len(nums) == 1:
                            lo = hi = _stoi(nums[0])
                        else:
                            if nums[0]:
                                lo = _stoi(nums[0])
                            if nums[1]:
                                hi = _stoi(nums[1])
                    except ValueError:
                        raise _Unsupported("invalid number in curly brackets") from None
                    if not seq:
                        raise _Invalid("nothing to repeat")
                    s, is_lit = seq[-1]
                    if not is_lit:
                        if s not in sub_rule_ids:
                            sub_rule_ids[s] = ""
                            sub_rule_ids[s] = self.add_rule(f"{name}-{len(sub_rule_ids)}", s)
                        s = sub_rule_ids[s]
                    seq[-1] = (build_repetition(f'"{s}"' if is_lit else s, lo, hi), False)
                else:
                    literal = ""
                    while i < n:
                        if sub[i] == "\\":
                            if i == n - 1:
                                raise _Invalid("trailing backslash")
                            nxt = sub[i + 1]
                            if nxt in _ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS:
                                piece, end = nxt, i + 2
                            else:
                                el = _gbnf_escape_length(sub, i)
                                if el == 0:
                                    raise _Unsupported("unsupported escape: " + sub[i:i + 2])
                                piece, end = sub[i:i + el], i + el
                                piece = literal_piece(_escape_value(piece), piece)
                            # deviation 2: a quantifier after the escape repeats it alone
                            if literal and end < n and sub[end] in "*+?{":
                                break
                            literal += piece
                            i = end
                        elif sub[i] == '"':
                            if literal and i + 1 < n and sub[i + 1] in "*+?{":
                                break
                            literal += literal_piece(0x22, '\\"')
                            i += 1
                        elif sub[i] not in _NON_LITERAL and (
                                i == n - 1 or not literal or sub[i + 1] == "." or sub[i + 1] not in _NON_LITERAL):
                            literal += literal_piece(ord(sub[i]), sub[i])
                            i += 1
                        else:
                            break
                    st["i"] = i
                    if not literal:
                        raise _Unsupported("unsupported character: " + c)
                    seq.append((literal, True))
            return join_seq()

        rule = to_rule(transform())
        if st["depth"] != 0:
            raise _Invalid("unbalanced parentheses")
        return self.add_rule(name, '"\\"" (' + rule + ') "\\""')

    # -- objects

    def not_strings(self, strings: list[str]) -> str:
        """A JSON string that is none of ``strings`` (llama.cpp's _not_strings over a trie
        of code points, children in code point order; deviation 4)."""
        trie: list[dict] = [{"children": {}, "end": False}]
        for s in strings:
            cur = 0
            for ch in s:
                nxt = trie[cur]["children"].get(ch)
                if nxt is None:
                    trie.append({"children": {}, "end": False})
                    nxt = trie[cur]["children"][ch] = len(trie) - 1
                cur = nxt
            trie[cur]["end"] = True
        char_rule = self.add_primitive("char", PRIMITIVE_RULES["char"])
        out: list[str] = ['["] ( ']

        def visit(idx):
            children = sorted(trie[idx]["children"].items())
            rejects = ""
            for k, (ch, child) in enumerate(children):
                if k:
                    out.append(" | ")
                if _needs_json_escape(ord(ch)):  # deviation 4: as the JSON text spells it
                    out.append(format_literal(_json_text(ord(ch))))
                else:
                    c = _class_char(ord(ch))  # deviation 4: escaped in the class
                    rejects += c
                    out.append(f"[{c}]")
                if trie[child]["children"]:
                    out.append(" (")
                    visit(child)
                    out.append(")")
                else:
                    out.append(f" {char_rule}+")
            if children:
                # deviation 4: what may differ is a character char admits (llama.cpp's
                # [^"...] let a raw control character or a bare backslash in)
                out.append(f' | [^"\\\\\\x7F\\x00-\\x1F{rejects}] {char_rule}*')

        visit(0)
        out.append(" )")
        if not trie[0]["end"]:
            out.append("?")
        out.append(' ["]')
        return "".join(out)

    def resolve_ref(self, node: _Node) -> str:
        frag = node.ref[node.ref.index("#") + 1:] if "#" in node.ref else node.ref
        ref_name = "ref" + _INVALID_RULE_CHARS.sub("-", frag)
        if ref_name not in self.rules and node.ref not in self.refs_being_resolved:
            self.refs_being_resolved.add(node.ref)
            ref_name = self.visit(node.target, ref_name)
            self.refs_being_resolved.discard(node.ref)
        return ref_name

    def object_rule(self, properties: list[tuple[str, _Node]], required: set[str], name: str,
                    additional: _Node | None) -> str:
        req, opt, kv, names = [], [], {}, []
        pre = name + ("-" if name else "")
        for pname, pnode in properties:
            # deviation 3: llama.cpp visits a top-level "" property as "" (the root)
            rn = self.visit(pnode, pre + pname if pre + pname else "-")
            kv[pname] = self.add_rule(f"{pre}{pname}-kv", f"{format_literal(_dump(pname))} space \":\" space {rn}")
            (req if pname in required else opt).append(pname)
            names.append(pname)
        if additional is not None:
            sub = pre + "additional"
            value = (self.visit(additional, sub + "-value") if additional.kind != "any"
                     else self.add_primitive("value", PRIMITIVE_RULES["value"]))
            key = (self.add_primitive("string", PRIMITIVE_RULES["string"]) if not names
                   else self.add_rule(sub + "-k", self.not_strings(names)))
            kv["*"] = self.add_rule(sub + "-kv", f'{key} ":" space {value}')
            opt.append("*")
        if not req and not opt:
            return '"{" space "}"'
        rule = '"{" space ' + ' "," space '.join(kv[k] for k in req)
        if opt:
            rule += " ("
            if req:
                rule += ' "," space ( '

            def rec(ks: list[str], first_is_optional: bool) -> str:
                if not ks:
                    return ""
                k = ks[0]
                comma = f'( "," space {kv[k]} )'
                if first_is_optional:
                    res = comma + ("*" if k == "*" else "?")
                else:
                    res = kv[k] + (" " + comma + "*" if k == "*" else "")
                if len(ks) > 1:
                    res += " " + self.add_rule(f"{pre}{k}-rest", rec(ks[1:], True))
                return res

            rule += " | ".join(rec(opt[i:], False) for i in range(len(opt)))
            if req:
                rule += " )"
            rule += " )?"
        return rule + ' space "}"'

    def visit_all_of(self, node: _Node, name: str, rule_name: str) -> str:
        required: set[str] = set()
        properties: list[tuple[str, _Node]] = []
        enum_values: dict[str, int] = {}

        def add(comp: _Node, is_required: bool):
            if comp.kind == "ref":
                if comp.target is not None:
                    add(comp.target, is_required)
            elif comp.kind == "object":
                if not is_required and any(r for _, _, r in comp.properties):
                    _warn(f"'required' at {comp.path}/required (in an anyOf inside allOf) is not enforced: "
                          "llama.cpp makes those properties optional")
                for pname, pnode, _ in comp.properties:
                    properties.append((pname, pnode))
                    if is_required:
                        required.add(pname)
            elif comp.kind not in ("enum", "any"):
                _warn(f"the allOf member at {comp.path} ({comp.kind}) is not enforced: llama.cpp merges "
                      "object properties and enums only")
            elif comp.kind == "enum":
                for v in comp.values:
                    lit = format_literal(_dump(v))
                    enum_values[lit] = enum_values.get(lit, 0) + 1

        for child in node.children:
            if child.kind == "anyOf":
                for alt in child.children:
                    add(alt, False)
            else:
                add(child, True)
        if enum_values:
            common = [v for v in sorted(enum_values) if enum_values[v] == len(node.children)]
            if common:
                return self.add_rule(rule_name, "(" + " | ".join(common) + ")")
        return self.add_rule(rule_name, self.object_rule(properties, required, name, None))

    def visit(self, node: _Node, name: str) -> str:
        rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
        sub_name = name + ("-" if name else "")
        k = node.kind
        if k == "ref":
            return self.add_rule(rule_name, self.resolve_ref(node))
        if k == "anyOf":
            return self.add_rule(rule_name, self.union(name, node.children))
        if k == "allOf":
            return self.visit_all_of(node, name, rule_name)
        if k == "const":
            return self.add_rule(rule_name, format_literal(_dump(node.value)))
        if k == "enum":
            return self.add_rule(rule_name, "(" + " | ".join(format_literal(_dump(v)) for v in node.values) + ")")
        if k == "object":
            if not node.properties and node.additional is not None and node.additional.kind == "any":
                return self.add_rule(rule_name, self.add_primitive("object", PRIMITIVE_RULES["object"]))
            return self.add_rule(rule_name, self.object_rule(
                [(p, n) for p, n, _ in node.properties], {p for p, _, r in node.properties if r},
                name, node.additional))
        if k == "tuple":
            parts = [self.visit(x, f"{sub_name}tuple-{i}") for i, x in enumerate(node.children)]
            return self.add_rule(rule_name, '"[" space ' + ' "," space '.join(parts) + ' space "]"')
        if k == "array":
            if node.items.kind == "any" and node.min_items == 0 and node.max_items < 0:
                return self.visit_primitive(rule_name, "array")
            item = self.visit(node.items, sub_name + "item")
            hi = INT_MAX if node.max_items < 0 else node.max_items
            return self.add_rule(rule_name, '"[" space ' + build_repetition(item, node.min_items, hi, '"," space')
                                 + ' space "]"')
        if k == "string":
            if node.pattern:
                return self.visit_pattern(node, rule_name)
            if node.fmt == "uuid":
                return self.visit_primitive(rule_name, "uuid")
            if node.fmt:
                prim = node.fmt + "-string"
                return self.add_rule(rule_name, self.add_primitive(prim, STRING_FORMAT_RULES[prim]))
            if node.min_length > 0 or node.max_length >= 0:
                ch = self.add_primitive("char", PRIMITIVE_RULES["char"])
                hi = INT_MAX if node.max_length < 0 else node.max_length
                return self.add_rule(rule_name, '"\\"" ' + build_repetition(ch, node.min_length, hi) + ' "\\""')
            return self.visit_primitive(rule_name, "string")
        if k == "integer":
            if node.minimum == INT64_MIN and node.maximum == INT64_MAX:
                return self.visit_primitive(rule_name, "integer")
            lo = None if node.minimum == INT64_MIN else node.minimum
            hi = None if node.maximum == INT64_MAX else node.maximum
            return self.add_rule(rule_name, f"({_int_range(lo, hi)})")
        if k in ("number", "boolean", "null"):
            return self.visit_primitive(rule_name, k)
        return self.add_rule(rule_name, self.add_primitive("value", PRIMITIVE_RULES["value"]))


def _stoi(s: str) -> int:
    """std::stoi: optional blanks and sign, then digits; what follows is ignored."""
    m = re.match(r"[ \t\n\r\f\v]*([+-]?[0-9]+)", s)
    if not m:
        raise ValueError(s)
    v = int(m.group(1))
    if not -(2**31) <= v <= INT_MAX:
        raise ValueError(s)
    return v


def json_schema_to_grammar(schema: Any) -> str:
    """GBNF text (root rule ``root``) accepting the JSON documents llama.cpp's grammar for
    ``schema`` (a dict or a JSON string) accepts; see the module docstring."""
    if isinstance(schema, str):
        schema = json.loads(schema)
    root = _Builder(schema).build()
    conv = _Converter()
    conv.visit(root, "")
    return "".join(f"{k} ::= {v}\n" for k, v in sorted(conv.rules.items()))
