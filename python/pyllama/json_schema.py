"""JSON schema -> GBNF, following llama.cpp's common/json-schema-to-grammar (a subset:
types and type lists, enum/const, objects with properties/required (llama.cpp's order:
required then optional, each in schema order) and additionalProperties false, arrays with
items/prefixItems/minItems/maxItems, string minLength/maxLength, integer bounds, anyOf/oneOf,
local $ref). Not built yet: format, pattern, allOf, number (non-integer) bounds,
additionalProperties true/schema. Anything else raises GrammarError naming the
keyword and its JSON path; nothing is ignored silently."""

from __future__ import annotations

import json
from typing import Any

from .grammar import GrammarError

__all__ = ["json_schema_to_grammar"]

SPACE = '| " " | "\\n"{1,2} [ \\t]{0,20}'
PRIMITIVES = {
    "boolean": '("true" | "false") space',
    "decimal-part": "[0-9]{1,16}",
    "integral-part": "[0] | [1-9] [0-9]{0,15}",
    "number": '("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)? space',
    "integer": '("-"? integral-part) space',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" space ( string ":" space value ("," space string ":" space value)* )? "}" space',
    "array": '"[" space ( value ("," space value)* )? "]" space',
    "char": '[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})',
    "string": '"\\"" char* "\\"" space',
    "null": '"null" space',
}
DEPS = {"number": ["integral-part", "decimal-part"], "integer": ["integral-part"],
        "value": ["object", "array", "string", "number", "boolean", "null"],
        "object": ["string", "value"], "array": ["value"], "string": ["char"]}
IGNORED = {"$schema", "$id", "title", "description", "default", "examples", "$comment"}


def _lit(v: str) -> str:
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'


def _rep(item: str, lo: int, hi: int | None, sep: str) -> str:
    """llama.cpp's build_repetition."""
    if not sep:
        if lo == 0 and hi == 1:
            return f"{item}?"
        return f"{item}{{{lo},{'' if hi is None else hi}}}" if (lo, hi) != (0, None) else f"{item}*"
    if hi == 0:
        return ""
    lo1 = max(lo - 1, 0)
    inner = f"( {sep} {item} )" + (f"{{{lo1},{'' if hi is None else hi - 1}}}")
    res = f"{item} {inner}"
    return f"( {res} )?" if lo == 0 else res


def _int_range(lo, hi) -> str:
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
                if c > "1":
                    dr("1" if top else "0", chr(ord(c) - 1)); w(" "); more(len(ms), less); w(" | ")
                dr(c, c); w(" ("); gen(int(ms[1:]), None, less, False); w(")")
                if c < "9":
                    w(" | "); dr(chr(ord(c) + 1), "9"); w(" "); more(len(ms) - 1, less)
            return
        if hi >= 0:
            if top:
                w('"-" [1-9] '); more(0, less); w(" | ")
            both(0, hi)
        else:
            w('"-" ('); gen(-hi, None, dec, False); w(")")

    gen(lo, hi)
    return "".join(out)


class _Conv:
    def __init__(self, root: Any):
        self.root = root
        self.rules: dict[str, str] = {"space": SPACE}
        self.refs: dict[str, str] = {}

    def prim(self, name: str) -> str:
        if name not in self.rules:
            self.rules[name] = PRIMITIVES[name]
            for d in DEPS.get(name, []):
                self.prim(d)
        return name

    def add(self, name: str, body: str) -> str:
        base = "".join(c if c.isalnum() or c == "-" else "-" for c in name) or "root"
        n, i = base, 0
        while n in self.rules and self.rules[n] != body:
            i += 1
            n = f"{base}{i}"
        self.rules[n] = body
        return n

    def refuse(self, kw: str, path: str) -> GrammarError:
        return GrammarError(f"JSON schema: keyword {kw!r} at {path} is not supported by pyllama's converter")

    def visit(self, s: Any, name: str, path: str) -> str:
        if s is True or s == {}:
            return self.add(name, self.prim("value"))
        if not isinstance(s, dict):
            raise GrammarError(f"JSON schema: {path} is not a schema object")
        handled = {"type", "properties", "required", "additionalProperties", "items", "enum",
                   "const", "anyOf", "oneOf", "$ref", "$defs", "definitions", "minLength", "maxLength",
                   "minItems", "maxItems", "prefixItems", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} | IGNORED
        for k in s:
            if k not in handled:
                raise self.refuse(k, f"{path}/{k}")
        if "$ref" in s:
            ref = s["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#"):
                raise self.refuse("$ref", f"{path}/$ref ({ref!r}: only local refs)")
            if ref not in self.refs:
                target: Any = self.root
                for part in ref[1:].split("/")[1:] if ref != "#" else []:
                    if not isinstance(target, dict) or part not in target:
                        raise GrammarError(f"JSON schema: unresolved $ref {ref!r} at {path}")
                    target = target[part]
                rn = self.add("ref" + ref[1:].replace("/", "-"), "")
                self.refs[ref] = rn
                self.rules[rn] = self.visit(target, rn + "-body", ref)
            return self.add(name, self.refs[ref]) if name == "root" else self.refs[ref]
        if "anyOf" in s or "oneOf" in s:
            kw = "anyOf" if "anyOf" in s else "oneOf"
            alts = [self.visit(a, f"{name}-{i}", f"{path}/{kw}/{i}") for i, a in enumerate(s[kw])]
            return self.add(name, " | ".join(alts))
        if "const" in s:
            return self.add(name, _lit(json.dumps(s["const"], ensure_ascii=False)) + " space")
        if "enum" in s:
            return self.add(name, "(" + " | ".join(_lit(json.dumps(v, ensure_ascii=False)) for v in s["enum"]) + ") space")
        t = s.get("type")
        if isinstance(t, list):
            alts = [self.visit({**s, "type": x}, f"{name}-{x}", path) for x in t]
            return self.add(name, " | ".join(alts))
        if t == "object" or (t is None and "properties" in s):
            return self.obj(s, name, path)
        tup = s.get("prefixItems", s.get("items") if isinstance(s.get("items"), list) else None)
        if (t == "array" or t is None) and isinstance(tup, list):
            parts = [self.visit(x, f"{name}-tuple-{i}", f"{path}/prefixItems/{i}") for i, x in enumerate(tup)]
            return self.add(name, '"[" space ' + ' "," space '.join(parts) + ' "]" space')
        if t == "array" or (t is None and "items" in s):
            items = s.get("items")
            if items is None and "minItems" not in s and "maxItems" not in s:
                return self.add(name, self.prim("array"))
            if items is None:
                items = {}
            if not isinstance(items, dict):
                raise self.refuse("items", f"{path}/items (tuple form)")
            it = self.visit(items, f"{name}-item", f"{path}/items")
            rep = _rep(it, s.get("minItems", 0), s.get("maxItems"), '"," space')
            return self.add(name, f'"[" space {rep} "]" space')
        if t == "string" and ("minLength" in s or "maxLength" in s):
            ch = self.prim("char")
            return self.add(name, '"\\"" ' + _rep(ch, s.get("minLength", 0), s.get("maxLength"), "") + ' "\\"" space')
        bounds = [k for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in s]
        if bounds:
            lo = s.get("minimum", s["exclusiveMinimum"] + 1 if "exclusiveMinimum" in s else None)
            hi = s.get("maximum", s["exclusiveMaximum"] - 1 if "exclusiveMaximum" in s else None)
            if t != "integer" or not all(isinstance(s[k], int) and not isinstance(s[k], bool) for k in bounds):
                raise self.refuse(bounds[0], f"{path}/{bounds[0]} (only integer types with integer bounds)")
            return self.add(name, f"({_int_range(lo, hi)}) space")
        if t in ("string", "number", "integer", "boolean", "null"):
            return self.add(name, self.prim(t)) if name == "root" else self.prim(t)
        if t is None:
            return self.add(name, self.prim("value"))
        raise GrammarError(f"JSON schema: unknown type {t!r} at {path}/type")

    def obj(self, s: dict, name: str, path: str) -> str:
        props = s.get("properties", {})
        ap = s.get("additionalProperties", None)
        if ap not in (None, False) or ("properties" not in s and ap is None):
            if not props and ap in (None, True):
                return self.add(name, self.prim("object"))
            raise self.refuse("additionalProperties", f"{path}/additionalProperties")
        required = set(s.get("required", []))
        kv = {}
        for k, v in props.items():
            vr = self.visit(v, f"{name}-{k}", f"{path}/properties/{k}")
            kv[k] = self.add(f"{name}-{k}-kv", f'{_lit(json.dumps(k, ensure_ascii=False))} space ":" space {vr}')
        req = [k for k in props if k in required]
        opt = [k for k in props if k not in required]
        rule = '"{" space ' + ' "," space '.join(kv[k] for k in req)
        if opt:
            def rec(ks, first_opt):
                k, rest = ks[0], ks[1:]
                res = f'( "," space {kv[k]} )?' if first_opt else kv[k]
                if rest:
                    res += " " + self.add(f"{name}-{k}-rest", rec(rest, True))
                return res
            rule += " ("
            if req:
                rule += ' "," space ( '
            rule += " | ".join(rec(opt[i:], False) for i in range(len(opt)))
            if req:
                rule += " )"
            rule += " )?"
        rule += ' "}" space'
        return self.add(name, rule)


def json_schema_to_grammar(schema: Any) -> str:
    """GBNF text (root rule ``root``) accepting JSON documents fitting ``schema`` (a dict
    or a JSON string)."""
    if isinstance(schema, str):
        schema = json.loads(schema)
    c = _Conv(schema)
    r = c.visit(schema, "root", "#")
    if r != "root":
        c.rules["root"] = r
    return "".join(f"{k} ::= {v}\n" for k, v in sorted(c.rules.items()))
