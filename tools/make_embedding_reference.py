#!/usr/bin/env python3
"""Write tests/data/embedding_llamacpp.json: llama.cpp's embeddings (llama-embedding's
settings, via tools/llamacpp_embeddings.cpp) for the cases tests/models/test_embedding_llamacpp.py
checks pyllama against bit for bit.

    python tools/make_embedding_reference.py BIN [OUT]

BIN is tools/llamacpp_embeddings.cpp built against llama.cpp 0c1e570 (the llama-cpp-python
0.3.36 sdist) for the AVX2 backend pyllama follows (GGML_NATIVE=OFF GGML_AVX=ON GGML_AVX2=ON
GGML_FMA=ON GGML_F16C=ON GGML_BMI2=ON); a -march=native build on an AVX-512 CPU takes other
float paths (16-lane SwiGLU expf, flash attention's f16 dot products) and differs.

Per case (model, pooling, prompts, the PYLLAMA_ORDER it holds for, and "alone" where
llama.cpp embedded each prompt in a run of its own, though pyllama packs them into one
decode): per prompt its token ids, the sha256 of its float32 embedding rows (every token's
with pooling none, else the pooled vector; unnormalized), its last row's values at a few
indices (for the error message), and "split" where the prompt straddles a micro-batch
boundary (512 tokens) of the packed decode: llama.cpp then pools only the prompt's part in
the last micro-batch, which pyllama does not copy (pyllama.context._pool).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from pyllama import Model, _models
from pyllama.generation import vocab_of

SAMPLE = [0, 1, 7, 64, 100, 255, 300, 511, 575]
N_CTX = 4096

_TEXT = ("In the beginning the Universe was created. This has made a lot of people very angry and been "
         "widely regarded as a bad move. def fib(n): return n if n < 2 else fib(n-1) + fib(n-2)  # 12345 + "
         "67890 = 80235. Привіт, як справи? 日本語のテキスト。 The quick brown fox jumps over the lazy dog; "
         "pack my box with five dozen liquor jugs! ") * 4

SHORT = ["The cat sat on the mat.", "A second, somewhat longer sentence about dogs and their owners.",
         "x", "Hello world, how are you today?", "1 2 3 4 5 6 7 8 9 10", "Привіт"]


def _prefixes(model: str, lens: list) -> list:
    """Token prompts: the first n tokens of one long text, for each n."""
    full = _tokenize(model, [_TEXT])[0]
    assert max(lens) <= len(full), (max(lens), len(full))
    return [full[:n] for n in lens]


_MODELS: dict = {}


def _model(name: str):
    if name not in _MODELS:
        path = {"smollm2": _models.smollm2_path, "gemma3": _models.gemma3_path}[name]()
        m = Model.load(path)
        _MODELS[name] = (Path(path), vocab_of(m))
    return _MODELS[name]


def _tokenize(model: str, texts: list) -> list:
    v = _model(model)[1]
    return [list(map(int, v.tokenize(t, add_special=True, parse_special=True))) for t in texts]


# (name, model, pooling, order, prompts: texts or token lists[, alone])
def cases() -> list:
    long_lens = [3, 40, 17, 60, 25, 33, 8, 51, 12, 47, 29, 64, 5, 38, 21, 56, 30, 9, 44]  # 592 tokens
    return [
        # the reported case: every token's final-normed hidden state of a 7-token prompt
        ("smollm2_none_cat", "smollm2", "none", "default", ["The cat sat on the mat."]),
        ("smollm2_none_1", "smollm2", "none", "default", _prefixes("smollm2", [1])),
        ("smollm2_none_40", "smollm2", "none", "default", _prefixes("smollm2", [40])),
        # one sequence: ggml_vec_dot_f32 (32-token blocks, then 8 / 4 / FMA leftovers)
        ("smollm2_mean_63", "smollm2", "mean", "default", _prefixes("smollm2", [63])),
        ("smollm2_mean_one", "smollm2", "mean", "default", ["The cat sat on the mat."]),
        # by default pyllama pools every sequence as llama.cpp pools one alone in a micro-batch
        ("smollm2_mean_alone", "smollm2", "mean", "default", SHORT, True),
        # several sequences in one micro-batch, llama.cpp's order (PYLLAMA_ORDER=llamacpp):
        # tinyBLAS when n_tokens % 8 == 0, else vec_dot, lanes by place in the micro-batch
        ("smollm2_mean_packed", "smollm2", "mean", "llamacpp", SHORT),
        ("smollm2_mean_packed8", "smollm2", "mean", "llamacpp",
         _prefixes("smollm2", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1])),
        ("smollm2_last_packed", "smollm2", "last", "default", SHORT),
        ("smollm2_cls_packed", "smollm2", "cls", "default", SHORT),
        ("smollm2_none_packed", "smollm2", "none", "default", SHORT),
        # llama.cpp's order: 592 tokens in micro-batches of 512 + 80 (tiled attention over
        # KV cells, a sequence split across the two: pooled over its last part only)
        ("smollm2_none_long", "smollm2", "none", "llamacpp", _prefixes("smollm2", long_lens)),
        ("smollm2_mean_long", "smollm2", "mean", "llamacpp", _prefixes("smollm2", long_lens)),
        ("gemma3_none_short", "gemma3", "none", "llamacpp", SHORT),
        ("gemma3_mean_short", "gemma3", "mean", "llamacpp", SHORT),
        ("gemma3_none_long", "gemma3", "none", "llamacpp", _prefixes("gemma3", long_lens)),
        ("gemma3_last_long", "gemma3", "last", "llamacpp", _prefixes("gemma3", long_lens)),
    ]


def run(binary: str, model: str, pooling: str, toks: list) -> np.ndarray:
    path = _model(model)[0]
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "e.bin"
        subprocess.run([binary, str(path), pooling, str(out), "2", str(N_CTX)], check=True, text=True,
                       input="".join(" ".join(map(str, t)) + "\n" for t in toks))
        b = out.read_bytes()
    n, e = np.frombuffer(b[:8], np.int32)
    return np.frombuffer(b[8:], np.float32).reshape(int(n), int(e))


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    binary = sys.argv[1]
    default = Path(__file__).resolve().parent.parent / "tests/data/embedding_llamacpp.json"
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else default
    res = {"llama_cpp": "0c1e570 (llama-cpp-python 0.3.36 sdist), CPU backend built GGML_NATIVE=OFF "
                        "GGML_AVX2=ON GGML_FMA=ON GGML_F16C=ON, 2 threads",
           "settings": {"n_ctx": N_CTX, "n_batch": N_CTX, "n_ubatch": 512, "n_seq_max": 256, "kv_unified": True,
                        "flash_attn": "auto (on)"},
           "sample_idx": SAMPLE, "cases": []}
    for name, model, pooling, order, prompts, *alone in cases():
        alone = bool(alone and alone[0])
        toks = prompts if isinstance(prompts[0], list) else _tokenize(model, prompts)
        assert sum(map(len, toks)) <= N_CTX and len(toks) <= 256  # one decode, as pyllama's
        if alone:
            e = np.concatenate([run(binary, model, pooling, [t]) for t in toks])
        else:
            e = run(binary, model, pooling, toks)
        rows, r, start = [], 0, 0
        for t in toks:
            k = len(t) if pooling == "none" else 1
            x = np.ascontiguousarray(e[r:r + k])
            r += k
            row = {"tokens": t, "sha256": hashlib.sha256(x.tobytes()).hexdigest(),
                   "last_row_sample": [float(x[-1, i]) for i in SAMPLE if i < x.shape[1]]}
            if not alone and start // 512 != (start + len(t) - 1) // 512:
                row["split"] = True
            start += len(t)
            rows.append(row)
        assert r == len(e)
        c = {"name": name, "model": model, "pooling": pooling, "order": order}
        if alone:
            c["alone"] = True
        c["prompts"] = rows
        res["cases"].append(c)
        print(name, len(toks), "prompts", sum(map(len, toks)), "tokens", file=sys.stderr)
    # one line per prompt
    cases_json = ",\n".join(
        "  {" + ", ".join(f"{json.dumps(k)}: {json.dumps(c[k])}" for k in c if k != "prompts")
        + ', "prompts": [\n' + ",\n".join("   " + json.dumps(p) for p in c["prompts"]) + "]}"
        for c in res["cases"])
    head = "{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in res.items() if k != "cases")
    out.write_text(head + ',\n "cases": [\n' + cases_json + "\n ]\n}\n")
    json.loads(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
