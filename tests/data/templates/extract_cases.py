"""Write llama_cpp_cases.json: the test cases of llama.cpp's tests/test-chat-template.cpp
(template text, the built-in renderer's expected output, the Jinja expected output, bos/eos)
and the conversation they all render. Run: python extract_cases.py /path/to/llama.cpp"""

import ast
import json
import re
import sys
from pathlib import Path

src = (Path(sys.argv[1]) / "tests" / "test-chat-template.cpp").read_text()
body = src[src.index("std::vector<TestCase> test_cases {"):]
body = body[: body.index("\n    };\n")]

# C string literals (optionally u8-prefixed, adjacent ones concatenated) after each field marker
lit = r'((?:\s*(?:u8|U8C\()?"(?:[^"\\]|\\.)*"\)?)+)'


def c_str(s: str) -> str:
    parts = re.findall(r'(?:u8)?"((?:[^"\\]|\\.)*)"', s)
    out = ""
    for p in parts:
        out += ast.literal_eval('"' + p + '"')  # C escapes used here (\n, \", \\) match Python's
    return out


cases = []
for block in re.split(r"\n        \{\n", body)[1:]:
    case = {}
    for field in ("name", "template_str", "expected_output", "expected_output_jinja", "bos_token", "eos_token"):
        m = re.search(r"/\* \.%s= \*/%s" % (field, lit), block)
        case[field] = c_str(m.group(1)) if m else ""
    m = re.search(r"/\* \.supported_with_jinja= \*/\s*(true|false)", block)
    case["supported_with_jinja"] = (m.group(1) == "true") if m else True
    case["has_extra_conversation"] = "extra_conversation" in block
    cases.append(case)

conversation = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "Who are you"},
    {"role": "assistant", "content": "   I am an assistant   "},
    {"role": "user", "content": "Another question"},
]
out = Path(__file__).with_name("llama_cpp_cases.json")
out.write_text(json.dumps({"source": "llama.cpp tests/test-chat-template.cpp", "conversation": conversation,
                           "cases": cases}, ensure_ascii=False, indent=1))
print(len(cases), "cases ->", out)
