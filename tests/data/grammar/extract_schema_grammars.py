"""Extract llama.cpp's JSON-schema-to-GBNF cases (tests/test-json-schema-to-grammar.cpp:
schema, expected status and expected grammar text) as data for tests/sampling/test_json_schema.py.

Writes llama_cpp_schema_grammars.json next to this file:

  {"source": ..., "cases": [{"name", "status": "SUCCESS" | "FAILURE", "schema": str,
                              "grammar": str (trimmed as the C++ test trims it)}]}

Usage: python tests/data/grammar/extract_schema_grammars.py [LLAMA_CPP_DIR]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

DEFAULT_SRC = "/work/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp"
OUT = Path(__file__).resolve().parent / "llama_cpp_schema_grammars.json"

_STR = r'R"""\((?P<{0}raw>.*?)\)"""|"(?P<{0}plain>(?:[^"\\]|\\.)*)"'
_CASE = re.compile(
    r'test\(\{\s*(?P<status>SUCCESS|FAILURE),\s*"(?P<name>(?:[^"\\]|\\.)*)",\s*(?:'
    + _STR.format("s") + r'),\s*(?:' + _STR.format("g") + r')\s*\}\);', re.S)


def trim(s: str) -> str:
    """The C++ test's trim(): strip the ends, then each line's leading blanks."""
    return re.sub(r"(^|\n)[ \t]+", r"\1", s.strip(" \n\r\t"))


def main() -> None:
    src_dir = Path(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_SRC)
    text = (src_dir / "tests" / "test-json-schema-to-grammar.cpp").read_text(encoding="utf-8")
    body = text[text.index("static void test_all"):text.index("int main()")]
    cases = []
    for m in _CASE.finditer(body):
        schema = m.group("sraw") if m.group("sraw") is not None else json.loads('"' + m.group("splain") + '"')
        grammar = m.group("graw") if m.group("graw") is not None else json.loads('"' + m.group("gplain") + '"')
        cases.append({"name": m.group("name"), "status": m.group("status"), "schema": schema,
                      "grammar": trim(grammar)})
    n_tests = len(re.findall(r"^\s*test\(\{", body, re.M))
    assert len(cases) == n_tests, (len(cases), n_tests)
    OUT.write_text(json.dumps({
        "source": "llama.cpp tests/test-json-schema-to-grammar.cpp (vendored in llama-cpp-python 0.3.36), "
                  "extracted by tests/data/grammar/extract_schema_grammars.py",
        "cases": cases}, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(cases)} cases -> {OUT}")


if __name__ == "__main__":
    main()
