"""Regenerate crosscheck-*.json.gz: random texts tokenized by llama.cpp itself.

The texts (seeded) mix pieces that stress pre-tokenizers and SPM (whitespace runs, CRLF,
contractions, numbers, scripts, combining marks, emoji sequences, private-use and
supplementary code points, special-token texts, stray U+2581) with random code points,
excerpts of text-gpl3.txt and, for the "bytes" set, invalid UTF-8. llama.cpp's results come
from harness.cpp (vocab-only llama_tokenize for the four add_special/parse_special
combinations, and llama_detokenize of the add0/parse1 ids) linked against libllama:

    cmake -S llama.cpp -B build -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TOOLS=OFF \\
          -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF
    cmake --build build --target llama
    g++ -O1 -std=c++17 harness.cpp -Illama.cpp/include -Illama.cpp/ggml/include build/src/libllama.a \\
        build/ggml/src/libggml.a build/ggml/src/libggml-cpu.a build/ggml/src/libggml-base.a -lpthread -ldl -o harness
    python make_crosscheck.py ./harness NAME=MODEL.gguf ... [--gpl text-gpl3.txt]

Recorded with llama.cpp 0c1e570 (the commit of ../shared/reference). llama.cpp aborts on
UTF-8 that decodes above U+10FFFF, so the bytes set leaves such sequences out.
"""

from __future__ import annotations

import base64
import gzip
import json
import random
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<filename>", "<gh_stars>", "<issue_start>",
            "<jupyter_code>", "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>",
            "<unused0>", "<unused42>", "<start_of_image>", "<end_of_image>", "[multimodal]", "<table>", "</table>",
            "<tr>", "<td>", "<h1>", "<br>", "<b>", "<0x0A>", "<0x41>", "<|im_start", "im_end|>", "<s>", "</s>"]
PIECES = ["Hello", "world", "I'm", "DON'T", "we've", "'ll", "'S", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r",
          "\u00a0", "\u3000", "\u2028", "\u200b", "\u200d", "\ufeff", "123", "4567890", "3.14", "-1e10", "0x1F",
          "é", "e\u0301", "ñ", "Привет", "мир", "Україна", "ї", "日本語", "中文字符", "한국어", "ﾊﾝｶｸ", "עברית", "العربية",
          "हिन्दी", "ไทย", "ქართული", "Ελληνικά", "😀", "🦙", "👨‍👩‍👧‍👦", "🏳️‍🌈", "✅", "→", "∑", "𝔘𝔫𝔦", "𝟙𝟚",
          "ﬁ", "Ⅻ", "½", "²", "①", "\x00", "\x01", "\x1f", "\x7f", "\x85", "\ud7ff", "\ue000", "\U0010fffd", "\U000e0001",
          "def f(x):\n    return x**2\n", "if (a < b && c > d) { x++; }", "<div class=\"a\">", "</div>", "> </", "a>  </b",
          "...", "!!!", "???", ",", ", ", " ,", " .", " 's", " ' ", "''", '"', "```", "---", "===", "___", "~~~", "$$", "\\",
          "http://example.com/a?b=c&d=e", "user@mail.com", "#include <stdio.h>", "λx.x", "ʼ", "’s", "‘quote’", "«»", "„“",
          "ǅ", "ß", "İ", "ı", "ﬀ", "Ａ", "ａ", "\u0300\u0301", "\u064b", "\u0e31", "\u093f", "\u1100\u1161", "\u3131",
          "\U0001f1fa\U0001f1e6", "ㄅ", "\u2581", "\u2581\u2581", "▁x", "Ġ", "Ċ", "<0xFF>", "\\n", "%d", "{{x}}", "[INST]"]
BAD_BYTES = [b"\xff", b"\xfe", b"\xc3", b"\xe2\x96", b"\xf0\x9f\xa6", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x96\x81",
             b" ", b"hello", b"\n", b"<|im_start|>", b"<start_of_turn>", b"\x80", b"\xbf", "é".encode(), b"123"]


def texts(n_text: int, n_bytes: int, gpl: str, seed: int = 1) -> list[bytes]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n_text):
        if gpl and rnd.random() < 0.15:
            i = rnd.randrange(len(gpl) - 400)
            t = gpl[i : i + rnd.randint(1, 400)]
        else:
            parts = []
            for _ in range(rnd.randint(1, 14)):
                r = rnd.random()
                if r < 0.15:
                    parts.append(rnd.choice(SPECIALS))
                elif r < 0.25:
                    parts.append("".join(chr(rnd.choice([rnd.randint(0x20, 0x7E), rnd.randint(0xA0, 0x2FFF),
                                                        rnd.randint(0x3000, 0xD7FF), rnd.randint(0xE000, 0xFFFF),
                                                        rnd.randint(0x10000, 0x10FFFF)])) for _ in range(rnd.randint(1, 6))))
                else:
                    parts.append(rnd.choice(PIECES))
            t = "".join(parts)
        out.append(t.encode("utf-8"))
    ok_bytes = [x for x in range(256) if x not in (0xF4, 0xF5, 0xF6, 0xF7)]
    for _ in range(n_bytes):
        out.append(b"".join(rnd.choice(BAD_BYTES) if rnd.random() < 0.8 else bytes([rnd.choice(ok_bytes)])
                            for _ in range(rnd.randint(1, 12))))
    return out


def run(harness: str, model: str, items: list[bytes]) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".bin") as fh:
        for b in items:
            fh.write(struct.pack("<I", len(b)) + b)
        fh.flush()
        res = subprocess.run([harness, model, fh.name], check=True, capture_output=True).stdout.decode()
    lines = res.split("\n")
    ids, detok = [], []
    for k in range(len(items)):
        blk = lines[5 * k : 5 * k + 5]
        ids.append([[int(x) for x in blk[j].split(":", 1)[1].split()] for j in range(4)])
        detok.append(base64.b64encode(bytes.fromhex(blk[4][2:])).decode())
    return {"texts_b64": [base64.b64encode(b).decode() for b in items], "ids": ids, "detok_b64": detok,
            "combos": "add_special,parse_special = (0,0) (0,1) (1,0) (1,1); detok of (0,1) ids"}


def main() -> None:
    args = sys.argv[1:]
    gpl = ""
    if "--gpl" in args:
        i = args.index("--gpl")
        gpl = Path(args[i + 1]).read_text(encoding="utf-8")
        del args[i : i + 2]
    harness, specs = args[0], args[1:]
    for spec in specs:
        name, model = spec.split("=", 1)
        n_text, n_bytes = (400, 200) if name in ("smollm2", "gemma3") else (150, 50)
        data = run(harness, model, texts(n_text, n_bytes, gpl))
        with gzip.open(HERE / f"crosscheck-{name}.json.gz", "wt", encoding="utf-8", compresslevel=9) as fh:
            json.dump(data, fh, separators=(",", ":"))


if __name__ == "__main__":
    main()
