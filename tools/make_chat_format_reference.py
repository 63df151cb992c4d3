"""Write tests/data/chat_formats_llama_cpp_python.json: llama-cpp-python 0.3.36's own
named chat formats (its llama_chat_format.py, run from its sdist with pyllama standing in
for the llama_cpp package) applied to three conversations, for test_chat_formats.py to hold
pyllama.llama_chat_format's formatters to, character for character.

    python tools/make_chat_format_reference.py /path/to/llama_cpp_python-0.3.36/llama_cpp
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pyllama.compat

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello"}],
    "system_user": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
    "multi": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "How are you?"}],
}
OUT = Path(__file__).parent.parent / "tests" / "data" / "chat_formats_llama_cpp_python.json"


def main() -> None:
    sd = Path(sys.argv[1])
    pyllama.compat.as_llama_cpp()

    def load(name: str, file: str):
        spec = importlib.util.spec_from_file_location(name, sd / file)
        m = importlib.util.module_from_spec(spec)
        sys.modules[name] = m
        spec.loader.exec_module(m)
        return m

    load("llama_cpp._logger", "_logger.py")
    load("llama_cpp._utils", "_utils.py")
    up = load("llama_cpp.upstream_chat_format", "llama_chat_format.py")
    src = (sd / "llama_chat_format.py").read_text()
    expected = {}
    for name, fn in re.findall(r'@register_chat_format\("([^"]+)"\)\ndef (\w+)\(', src):
        expected[name] = {}
        for cname, msgs in CONVERSATIONS.items():
            r = getattr(up, fn)(messages=msgs)
            expected[name][cname] = {"prompt": r.prompt, "stop": r.stop, "added_special": r.added_special}
    OUT.write_text(json.dumps({"conversations": CONVERSATIONS, "expected": expected}, indent=1, sort_keys=True))
    print(f"{OUT}: {len(expected)} formats")


if __name__ == "__main__":
    main()
