#!/usr/bin/env python3
"""Embedding throughput, pyllama vs llama.cpp, same model, same sentences, same run: 256
sentences of 8-64 tokens (random words of a WordPiece vocabulary) through a random-weight
bert of 6 layers of 384 (12 heads, n_ff 1536, CLS pooling; tests/data/make_tiny_encoders.py
writes it), in llama-embedding's batching (batches of at most 2048 tokens and 256
sequences, the whole batch in one micro-batch).

llama.cpp's side is benchmarks/embedding_llamacpp.cpp (llama-embedding's loop without its
printing), built here against the libllama of --build-dir (default the AVX2 build
~/.cache/pyllama/llama.cpp/build-avx2) and the sdist's headers; pyllama's is
``pyllama.embedding.embed_token_lists`` on a Context with the same settings. The rounds
alternate between the two; prints sentences/s of both (median and best round: on a shared
machine the best round is the least disturbed) and the ratios.

    python benchmarks/compare_embedding.py [-t 2] [--rounds 3] [--qtype F32|Q8_0]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "data"))
SRC = Path("/work/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp")


def sentences(n: int = 256, seed: int = 0) -> list:
    import make_tiny_encoders as mte

    rng = np.random.default_rng(seed)
    words = [w for w in mte.WORDS if not w.startswith("##")]
    # every word is one token: 6..62 words + [CLS] and [SEP] = 8..64 tokens
    return [" ".join(rng.choice(words, size=int(rng.integers(6, 63)))) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--qtype", default="F32", choices=["F32", "Q8_0"], help="weight type of the bert")
    ap.add_argument("--src", default=str(SRC), help="llama.cpp source (headers)")
    ap.add_argument("--build-dir", default=str(Path.home() / ".cache/pyllama/llama.cpp/build-avx2"))
    a = ap.parse_args()
    import make_tiny_encoders as mte
    from pyllama import Context, Model
    from pyllama.embedding import embed_token_lists

    tmp = Path(tempfile.mkdtemp(prefix="pyllama-embbench-"))
    model = mte.write("bert", tmp, a.qtype, n_layer=6, n_embd=384, n_head=12, n_ff=1536, tag="bench-bert-6x384")
    texts = sentences()
    (tmp / "texts.txt").write_text("\n".join(texts) + "\n")
    exe = tmp / "embedding_llamacpp"
    b = Path(a.build_dir).expanduser()
    subprocess.run(["g++", "-O2", "-std=c++17", str(ROOT / "benchmarks" / "embedding_llamacpp.cpp"),
                    f"-I{a.src}/include", f"-I{a.src}/ggml/include", f"-L{b}/bin", "-lllama", "-lggml",
                    "-lggml-base", f"-Wl,-rpath,{b}/bin", "-o", str(exe)], check=True)

    m = Model.load(str(model))
    ctx = Context(m, n_ctx=512, n_batch=2048, n_ubatch=2048, n_seq_max=256, kv_unified=True, embeddings=True,
                  n_threads=a.threads, n_threads_batch=a.threads)
    toks = [list(m.vocab.tokenize(t, add_special=True, parse_special=True)) for t in texts]
    n_tok = sum(len(t) for t in toks)
    assert min(len(t) for t in toks) >= 8 and max(len(t) for t in toks) <= 64
    embed_token_lists(ctx, toks[:8])  # warm-up
    py, cpp = [], []
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        embed_token_lists(ctx, toks)
        py.append(time.perf_counter() - t0)
        r = subprocess.run([str(exe), str(model), str(tmp / "texts.txt"), str(a.threads), "1"],
                           capture_output=True, text=True, check=True)
        cpp.append(float(r.stdout.split()[0]))
    n = len(texts)
    sp, sc = n / statistics.median(py), n / statistics.median(cpp)
    bp, bc = n / min(py), n / min(cpp)
    print(f"{n} sentences, {n_tok} tokens, bert 6 x 384 {a.qtype}, {a.threads} threads, {a.rounds} rounds")
    print(f"pyllama   : {sp:8.1f} sentences/s median, {bp:8.1f} best  (rounds {', '.join(f'{x:.2f}' for x in py)} s)")
    print(f"llama.cpp : {sc:8.1f} sentences/s median, {bc:8.1f} best  (rounds {', '.join(f'{x:.2f}' for x in cpp)} s)")
    print(f"ratio pyllama / llama.cpp: {sp / sc:.2f} (median), {bp / bc:.2f} (best round)")


if __name__ == "__main__":
    main()
