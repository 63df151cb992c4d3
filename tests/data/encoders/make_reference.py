"""llama.cpp's outputs for the tiny encoders of tests/data/make_tiny_encoders.py, stored in
reference.json beside this script (tests/test_encoders.py reads it; no llama.cpp needed
there).

For every model (F32 and Q8_0) llama-embedding (the AVX2 build of the llama.cpp version
pyllama follows) embeds PROMPTS as one batch of sequences (--embd-separator), with the
file's pooling (rank for the rerankers: the classifier's score), unnormalized, flash
attention off (llama.cpp's f32 attention), and its --verbose-prompt token ids (WPM / UGM
tokenization) are kept with each vector.

t5encoder: llama.cpp 0c1e570's llama-embedding output for these files is not what its
own T5 encoder graph (src/models/t5.cpp) computes: a single token matches, and for two
tokens it equals the graph with every off-diagonal attention score at -inf, but longer
inputs match neither that nor the graph (not understood yet). The stored vectors are
``t5_reference``, a float64 numpy transcription of that graph, over llama.cpp's tokens (the
UGM tokenization is llama.cpp's); llama.cpp's vectors are kept as "llamacpp_embedding".

    python tests/data/encoders/make_reference.py [LLAMA_CPP_BIN_DIR]
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import make_tiny_encoders as mte  # noqa: E402

PROMPTS = [
    "hello world",
    "the quick brown fox jumped over the lazy dog",
    "What is the capital of France? Paris!",
    "machine learning embeddings for sentence search and document query",
    "Café naïve déjà vu, unbelievable",
    "a",
    "how are you? i am fine, thankful for the rainy day and the good data science question",
]
SEP = "<#sep#>"


def run_llamacpp(bin_dir: Path, model: Path, prompts: list, pooling: str | None = None) -> list:
    cmd = [str(bin_dir / "llama-embedding"), "-m", str(model), "-p", SEP.join(prompts), "--embd-separator", SEP,
           "--embd-normalize", "-1", "--embd-output-format", "json", "-fa", "off", "-t", "2", "--verbose-prompt"]
    if pooling:
        cmd += ["--pooling", pooling]
    for _ in range(10):  # llama-embedding's asynchronous log sometimes loses its tail at exit: retry
        p = subprocess.run(cmd, capture_output=True, text=True, check=True)
        if p.stdout.rstrip().endswith("}"):
            break
    else:
        raise RuntimeError(f"llama-embedding's output stayed truncated: {cmd}")
    # stdout: each prompt's "   id -> 'piece'" lines (blank lines between prompts), then the JSON
    head, _, body = p.stdout.partition("\n{")
    data = json.loads("{" + body)["data"]
    toks: list = [[]]
    for line in head.splitlines():
        m = re.match(r"^\s+(\d+) -> '", line)
        if m:
            toks[-1].append(int(m.group(1)))
        elif not line.strip() and toks[-1]:
            toks.append([])
    toks = [t for t in toks if t]
    assert len(toks) == len(prompts) == len(data), (len(toks), len(prompts), len(data))
    return [{"text": t, "tokens": k, "embedding": [float(x) for x in d["embedding"]]}
            for t, k, d in zip(prompts, toks, data)]


def t5_reference(path: Path, tokens: list, self_only: bool = False, rows: bool = False) -> np.ndarray:
    """Mean-pooled T5 encoder output (llama.cpp's graph in float64) of one token list."""
    import gguf

    r = gguf.GGUFReader(str(path))
    T = {}
    for t in r.tensors:
        a = np.array(t.data)
        if t.tensor_type == gguf.GGMLQuantizationType.Q8_0:
            a = gguf.quants.dequantize(a, t.tensor_type)
        T[t.name] = a.astype(np.float64).reshape([int(x) for x in reversed(t.shape)])
    kv = {f.name: f for f in r.fields.values()}
    nh = int(kv["t5encoder.attention.head_count"].parts[-1][0])
    hd = int(kv["t5encoder.attention.key_length"].parts[-1][0])
    nl = int(kv["t5encoder.block_count"].parts[-1][0])
    nbk = int(kv["t5encoder.attention.relative_buckets_count"].parts[-1][0])
    eps = float(kv["t5encoder.attention.layer_norm_rms_epsilon"].parts[-1][0])

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def bucket(x, y):
        nb, me = nbk // 2, nbk // 4
        d = x - y
        b = nb if d > 0 else 0
        d = abs(d)
        if d < me:
            return b + d
        return b + min(int(np.floor(me + np.log(d / me) * (nb - me) / np.log(128 / me))), nb - 1)

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(0.7978845608028654 * x * (1 + 0.044715 * x * x)))

    n = len(tokens)
    x = T["token_embd.weight"][tokens]
    rel = T["enc.blk.0.attn_rel_b.weight"]
    for il in range(nl):
        b = f"enc.blk.{il}."
        cur = rms(x, T[b + "attn_norm.weight"])
        q, k, v = (cur @ T[b + f"attn_{p}.weight"].T for p in "qkv")
        rb = T.get(b + "attn_rel_b.weight", rel)
        out = np.zeros((n, nh * hd))
        for t in range(n):
            for h in range(nh):
                s = np.array([q[t, h * hd:(h + 1) * hd] @ k[u, h * hd:(h + 1) * hd] + rb[bucket(u, t), h]
                              for u in range(n)])
                if self_only:
                    s = np.where(np.arange(n) == t, s, -np.inf)
                p = np.exp(s - s.max())
                p /= p.sum()
                out[t, h * hd:(h + 1) * hd] = p @ v[:, h * hd:(h + 1) * hd]
        x = x + out @ T[b + "attn_o.weight"].T
        c = rms(x, T[b + "ffn_norm.weight"])
        if b + "ffn_gate.weight" in T:
            f = gelu(c @ T[b + "ffn_gate.weight"].T) * (c @ T[b + "ffn_up.weight"].T)
        else:
            f = np.maximum(c @ T[b + "ffn_up.weight"].T, 0)
        x = x + f @ T[b + "ffn_down.weight"].T
    y = rms(x, T["enc.output_norm.weight"])
    return y if rows else y.mean(0)


def main() -> None:
    bin_dir = Path(sys.argv[1] if len(sys.argv) > 1 else Path.home() / ".cache/pyllama/llama.cpp/build-avx2/bin")
    out: dict = {"prompts": PROMPTS, "models": {}}
    with tempfile.TemporaryDirectory() as d:
        for name in mte.SPECS:
            for q in ("F32", "Q8_0"):
                path = mte.write(name, Path(d), q)
                rows = run_llamacpp(bin_dir, path, PROMPTS)
                if name == "t5encoder":
                    for r in rows:
                        r["llamacpp_embedding"] = r["embedding"]
                        r["embedding"] = [float(v) for v in t5_reference(path, r["tokens"])]
                entry = {"pooling": int(mte.SPECS[name]["pooling"]), "rows": rows}
                if name == "bert" and q == "F32":
                    # pooling overrides: mean / last over the same batch, and none (every token)
                    entry["mean"] = run_llamacpp(bin_dir, path, PROMPTS, "mean")
                    entry["last"] = run_llamacpp(bin_dir, path, PROMPTS, "last")
                out["models"][f"{name}-{q}"] = entry
                print(name, q, len(rows))
    (HERE / "reference.json").write_text(json.dumps(out, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
