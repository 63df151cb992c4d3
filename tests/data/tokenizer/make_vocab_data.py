"""Regenerate this folder from llama.cpp's tokenizer test suite (models/ggml-vocab-*.gguf
with .inp/.out) and the shared reference corpus. GGUF files are not tracked, so each
vocabulary is stored as its tokenizer.* metadata in gzipped JSON (non-UTF-8 strings as
{"b64": ...}); pyllama builds a Vocab from that dict exactly as from the file.

    python tests/data/tokenizer/make_vocab_data.py /path/to/llama.cpp [/path/to/shared/reference]
"""

from __future__ import annotations

import base64
import gzip
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).parent
SUITE = ["llama-spm", "phi-3", "gpt-2", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "falcon",
         "starcoder", "mpt", "refact", "bert-bge"]
# qwen35 differs from qwen2 only in tokenizer.ggml.pre: the tests reuse qwen2.json.gz for it
SHARED = {"qwen35": "qwen2"}


def _enc(v):
    if isinstance(v, bytes):
        return {"b64": base64.b64encode(v).decode()}
    if isinstance(v, list):
        return [_enc(x) for x in v]
    return v


def main(llama_cpp: str, reference: str | None) -> None:
    from pyllama import _core

    models = Path(llama_cpp) / "models"
    for name in SUITE:
        f = models / f"ggml-vocab-{name}.gguf"
        md = _core.GGUFFile(str(f), "auto").metadata()
        keep = {k: _enc(v) for k, v in md.items()
                if k.startswith("tokenizer.") and k not in ("tokenizer.chat_template", "tokenizer.huggingface.json")
                or k in ("general.name", "general.architecture")}
        with gzip.open(HERE / f"{name}.json.gz", "wt", encoding="utf-8", compresslevel=9) as fh:
            json.dump(keep, fh, ensure_ascii=False, separators=(",", ":"))
        for ext in ("inp", "out"):
            shutil.copy(models / f"ggml-vocab-{name}.gguf.{ext}", HERE / f"{name}.{ext}")
    for name in SHARED:
        for ext in ("inp", "out"):
            shutil.copy(models / f"ggml-vocab-{name}.gguf.{ext}", HERE / f"{name}.{ext}")
    if reference:
        for p in Path(reference).glob("*.tokenize.json"):
            shutil.copy(p, HERE / p.name)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
