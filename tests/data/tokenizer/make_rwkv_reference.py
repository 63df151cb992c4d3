"""llama.cpp's tokens for a synthetic RWKV vocabulary (``tokenizer.ggml.model`` "rwkv"):
rwkv.json beside this file (each prompt's bytes in base64 and llama.cpp's ids), checked by
tests/tokenizer/test_tokenizer.py.

The vocabulary (``write_vocab``, also used by the test): a control token ``<s>``, the 256
single bytes written as RWKV's converter escapes them (printable ASCII as is, ``\\\\``,
``\\t`` / ``\\n`` / ``\\r``, ``\\xNN``), multi-byte tokens (escaped, literal UTF-8, two texts
for the same bytes) and fillers up to the 2048 tokens of the tiny models. llama.cpp runs
it on tests/data/make_tiny.py's tiny-rwkv6 weights (it loads only the vocabulary):

    python tests/data/tokenizer/make_rwkv_reference.py [LLAMA_BUILD]
"""

from __future__ import annotations

import base64
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
N_VOCAB = 2048

PROMPTS = [
    b"hello world",
    b"hello\n\nworld\tab\r\n",
    "h\u00e9llo \u65e5\u672c\u8a9e".encode(),
    b"AB abc \\ x\x00\xff\x7f",
    b"",
    b"<s>hello",
    b"wor world worl hel he h",
    b" \\x41 zz12 zz1",
]


def _escape_byte(b: int) -> str:
    if b == 0x5C:
        return "\\\\"
    if b in (9, 10, 13):
        return {9: "\\t", 10: "\\n", 13: "\\r"}[b]
    if 0x20 <= b < 0x7F:
        return chr(b)
    return f"\\x{b:02x}"


def tokens() -> tuple[list[str], list[int]]:
    toks = ["<s>"] + [_escape_byte(b) for b in range(256)]
    toks += ["he", "hel", "hello", " world", "wor", "world", "\\n\\n", "ab\\x63", "h\u00e9llo", "\u65e5\u672c",
             "AB", "\\x41B", "\\\\x", " \\\\"]
    toks += [f"zz{i}" for i in range(N_VOCAB - len(toks))]
    types = [3] + [1] * (len(toks) - 1)
    return toks, types


def write_vocab(path: Path) -> Path:
    import gguf

    toks, types = tokens()
    w = gguf.GGUFWriter(str(path), "rwkv6")
    w.add_tokenizer_model("rwkv")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main() -> None:
    build = Path(sys.argv[1] if len(sys.argv) > 1 else Path.home() / ".cache/pyllama/llama.cpp/build-avx2")
    tmp = Path(tempfile.mkdtemp(prefix="pyllama-rwkv-vocab-"))
    spec = importlib.util.spec_from_file_location("make_tiny", HERE.parent / "make_tiny.py")
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    model = mk.write_tiny("rwkv6", tmp, "F32", tokenizer_from=write_vocab(tmp / "vocab.gguf"))
    cases = []
    for i, p in enumerate(PROMPTS):
        f = tmp / f"p{i}.txt"
        f.write_bytes(p)
        out = subprocess.run([str(build / "bin" / "llama-tokenize"), "-m", str(model), "-f", str(f), "--ids",
                              "--no-escape", "--log-disable"], check=True, capture_output=True).stdout.decode()
        cases.append({"prompt_b64": base64.b64encode(p).decode(), "ids": json.loads(out.strip().splitlines()[-1])})
    (HERE / "rwkv.json").write_text(json.dumps({"generator": "tests/data/tokenizer/make_rwkv_reference.py",
                                                "cases": cases}, indent=1) + "\n")
    print(len(cases), "cases written")


if __name__ == "__main__":
    main()
