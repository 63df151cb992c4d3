"""Extract llama.cpp's grammar test cases as data for tests/sampling/test_grammar.py.

Reads tests/test-grammar-parser.cpp and tests/test-grammar-integration.cpp of a llama.cpp
checkout and writes tests/data/grammar/llama_cpp_cases.json:

  parser_ok:       [{grammar, symbols: {name: id}, elements: [[TYPE, value], ...]}]
  parser_fail:     [grammar, ...]
  integration:     [{desc, grammar | schema, passing: [segments], failing: [segments]}]
                   segments: [["text", str] | ["hex", bytes as hex] | ["token", id], ...]
  build_fail:      [{grammar, root}]   (llama_grammar_init_impl returns nullptr)
  build_ok:        [{grammar, root}]

Usage: python tools/extract_grammar_cases.py [LLAMA_CPP_DIR] [OUT_JSON]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

DEFAULT_SRC = "/work/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp"
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "grammar" / "llama_cpp_cases.json"

_SIMPLE_ESC = {"n": b"\n", "t": b"\t", "r": b"\r", '"': b'"', "\\": b"\\", "'": b"'", "0": b"\0", "?": b"?"}


def lex(src: str, pos: int):
    """C++ tokens from pos: ('str', bytes) (adjacent literals joined), ('tok', id),
    ('num', int), ('name', str), ('chr', str) for punctuation; comments skipped."""
    n = len(src)
    while pos < n:
        c = src[pos]
        if c.isspace():
            pos += 1
        elif src.startswith("//", pos):
            pos = src.index("\n", pos)
        elif src.startswith("/*", pos):
            pos = src.index("*/", pos) + 2
        elif src.startswith('R"', pos):
            m = re.compile(r'R"([^(]*)\(').match(src, pos)
            delim = ")" + m.group(1) + '"'
            end = src.index(delim, m.end())
            yield ("str", src[m.end():end].encode("utf-8"))
            pos = end + len(delim)
        elif c == '"':
            pos += 1
            out = bytearray()
            while src[pos] != '"':
                if src[pos] == "\\":
                    e = src[pos + 1]
                    if e == "x":
                        m = re.compile(r"[0-9a-fA-F]+").match(src, pos + 2)
                        out.append(int(m.group(0), 16) & 0xFF)
                        pos = m.end()
                        continue
                    if e == "u":
                        out += chr(int(src[pos + 2:pos + 6], 16)).encode()
                        pos += 6
                        continue
                    out += _SIMPLE_ESC[e]
                    pos += 2
                else:
                    out += src[pos].encode("utf-8")
                    pos += 1
            pos += 1
            yield ("str", bytes(out))
        elif src.startswith("token(", pos):
            m = re.compile(r"token\((\d+)\)").match(src, pos)
            yield ("tok", int(m.group(1)))
            pos = m.end()
        elif c.isdigit():
            m = re.compile(r"\d+").match(src, pos)
            yield ("num", int(m.group(0)))
            pos = m.end()
        elif c.isalpha() or c == "_":
            m = re.compile(r"\w+").match(src, pos)
            yield ("name", m.group(0))
            pos = m.end()
        else:
            yield ("chr", c)
            pos += 1


class Stream:
    def __init__(self, src: str, pos: int):
        self.it = lex(src, pos)
        self.buf: list = []

    def peek(self):
        if not self.buf:
            self.buf.append(next(self.it))
        return self.buf[0]

    def next(self):
        t = self.peek()
        self.buf.pop(0)
        return t

    def expect(self, kind, value=None):
        t = self.next()
        if t[0] != kind or (value is not None and t[1] != value):
            raise SyntaxError(f"expected {kind} {value!r}, got {t!r}")
        return t

    def string(self) -> bytes:
        out = b""
        while self.peek()[0] == "str":
            out += self.next()[1]
        return out


def expr(st: Stream) -> list:
    """token(N) + "text" + ... -> segments."""
    segs: list = []
    while True:
        t = st.peek()
        if t[0] == "tok":
            st.next()
            segs.append(["token", t[1]])
        elif t[0] == "str":
            b = st.string()
            try:
                segs.append(["text", b.decode("utf-8")])
            except UnicodeDecodeError:
                segs.append(["hex", b.hex()])
        else:
            raise SyntaxError(f"unexpected {t!r} in a test string")
        if st.peek() == ("chr", "+"):
            st.next()
            continue
        return segs


def string_list(st: Stream) -> list:
    st.expect("chr", "{")
    items = []
    while st.peek() != ("chr", "}"):
        items.append(expr(st))
        if st.peek() == ("chr", ","):
            st.next()
    st.next()
    return items


def parser_cases(text: str) -> tuple[list, list]:
    ok, fail = [], []
    for m in re.finditer(r"\n\s*(verify_failure|verify_parsing)\(", text):
        st = Stream(text, m.end())
        grammar = st.string().decode()
        if m.group(1) == "verify_failure":
            fail.append(grammar)
            continue
        st.expect("chr", ",")
        st.expect("chr", "{")
        symbols = {}
        while st.peek() != ("chr", "}"):
            st.expect("chr", "{")
            name = st.string().decode()
            st.expect("chr", ",")
            symbols[name] = st.expect("num")[1]
            st.expect("chr", "}")
            if st.peek() == ("chr", ","):
                st.next()
        st.next()
        st.expect("chr", ",")
        st.expect("chr", "{")
        elements = []
        while st.peek() != ("chr", "}"):
            st.expect("chr", "{")
            typ = st.expect("name")[1].removeprefix("LLAMA_GRETYPE_")
            st.expect("chr", ",")
            t = st.next()
            if t == ("chr", "'"):
                # a char literal: the lexer sees ' x ' pieces; read them raw instead
                raise SyntaxError("char literal")
            elements.append([typ, t[1]])
            st.expect("chr", "}")
            if st.peek() == ("chr", ","):
                st.next()
        st.next()
        ok.append({"grammar": grammar, "symbols": symbols, "elements": elements})
    return ok, fail


def _char_literals_to_ints(text: str) -> str:
    """'a' / '\\n' -> the code point, so the lexer sees numbers."""
    esc = {"n": 10, "t": 9, "r": 13, "0": 0, "\\": 92, "'": 39, '"': 34}

    def rep(m):
        body = m.group(1)
        if body.startswith("\\"):
            return str(esc[body[1]])
        return str(ord(body))

    return re.sub(r"'(\\.|[^'\\])'", rep, text)


def integration_cases(text: str) -> tuple[list, list, list]:
    cases = []
    for m in re.finditer(r"\n\s*(test_grammar|test_schema)\(", text):
        st = Stream(text, m.end())
        desc = st.string().decode()
        st.expect("chr", ",")
        body = st.string().decode()
        st.expect("chr", ",")
        passing = string_list(st)
        st.expect("chr", ",")
        failing = string_list(st)
        key = "grammar" if m.group(1) == "test_grammar" else "schema"
        cases.append({"desc": desc, key: body, "passing": passing, "failing": failing})

    # the hand-written failure tests: named string constants and the roots they are built with
    consts = {}
    for m in re.finditer(r"const std::string (\w+)\s*=\s*", text):
        consts[m.group(1)] = Stream(text, m.end()).string().decode()
    build_fail = [{"grammar": consts[n], "root": "root"} for n in re.findall(r"test_build_grammar_fails\((\w+)\)", text)]
    build_ok = []
    for m in re.finditer(r"build_grammar_with_root\((\w+), \"(\w+)\"\);\s*assert\((\w+) (==|!=) nullptr\)", text):
        (build_fail if m.group(4) == "==" else build_ok).append({"grammar": consts[m.group(1)], "root": m.group(2)})
    # test_failure_missing_root: parses, but has no 'root' (so building fails)
    mr = re.search(r"test_failure_missing_root\(\) \{.*?grammar_str = ", text, re.S)
    build_fail.append({"grammar": Stream(text, mr.end()).string().decode(), "root": "root"})
    # test_failure_missing_reference: the parser itself fails
    mref = re.search(r"test_failure_missing_reference\(\) \{.*?grammar_str =\s*", text, re.S)
    parse_fail = [Stream(text, mref.end()).string().decode()]
    return cases, build_fail, build_ok + [], parse_fail


def main(argv: list[str]) -> None:
    src = Path(argv[1] if len(argv) > 1 else DEFAULT_SRC)
    out = Path(argv[2]) if len(argv) > 2 else DEFAULT_OUT
    ptext = _char_literals_to_ints((src / "tests" / "test-grammar-parser.cpp").read_text())
    itext = (src / "tests" / "test-grammar-integration.cpp").read_text()
    parser_ok, parser_fail = parser_cases(ptext)
    integration, build_fail, build_ok, parse_fail = integration_cases(itext)
    data = {
        "source": "llama.cpp tests/test-grammar-parser.cpp and tests/test-grammar-integration.cpp "
                  "(vendored in llama-cpp-python 0.3.36), extracted by tools/extract_grammar_cases.py",
        "parser_ok": parser_ok,
        "parser_fail": parser_fail + parse_fail,
        "integration": integration,
        "build_fail": build_fail,
        "build_ok": build_ok,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    n_strings = sum(len(c["passing"]) + len(c["failing"]) for c in integration)
    print(f"{out}: {len(parser_ok)} parser cases, {len(parser_fail) + len(parse_fail)} parser failures, "
          f"{len(integration)} integration cases ({n_strings} strings), {len(build_fail)} build failures, "
          f"{len(build_ok)} build successes")


if __name__ == "__main__":
    main(sys.argv)
