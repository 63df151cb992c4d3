"""Write tests/data/llama_h_functions.json: every ``LLAMA_API`` function of llama.h (the
llama.cpp that llama-cpp-python 0.3.36 vendors, 0c1e570) with its parameter names in
order, for tests/api/test_llama_h_coverage.py (which must not need the sdist).

    python tests/data/make_llama_h_functions.py [path/to/llama.h]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

DEFAULT = Path("/work/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/include/llama.h")
OUT = Path(__file__).with_name("llama_h_functions.json")


def _split_params(s: str) -> list[str]:
    """Top-level comma split (function-pointer parameters keep their inner commas)."""
    out, depth, cur = [], 0, ""
    for c in s:
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        if c == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += c
    if cur.strip():
        out.append(cur)
    return [p.strip() for p in out]


def _param_name(p: str) -> str:
    m = re.search(r"\(\s*\*\s*(\w+)\s*\)", p)  # function pointer: ret (*name)(...)
    if m:
        return m.group(1)
    return re.findall(r"\w+", re.sub(r"\[.*?\]", "", p))[-1]


def parse(text: str) -> list[dict]:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    funcs, seen = [], set()
    for m in re.finditer(r"LLAMA_API\b([^;{]*?)\b(llama_\w+)\s*\(", text, re.S):
        name = m.group(2)
        # the parameter list: up to the matching parenthesis
        i, depth = m.end(), 1
        while depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        params = _split_params(text[m.end(): i - 1])
        if params == ["void"] or not params:
            names = []
        else:
            names = [_param_name(p) for p in params]
        if name in seen:
            continue
        seen.add(name)
        start = text.rfind("\n", 0, m.start()) + 1
        deprecated = text[start: m.start()].strip().startswith("DEPRECATED(")
        funcs.append({"name": name, "params": names, "deprecated": deprecated})
    return funcs


def main() -> None:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    funcs = parse(src.read_text())
    OUT.write_text(json.dumps({"source": "llama.cpp 0c1e570 include/llama.h (llama-cpp-python 0.3.36)",
                               "functions": funcs}, indent=1) + "\n")
    print(f"{OUT}: {len(funcs)} functions")


if __name__ == "__main__":
    main()
