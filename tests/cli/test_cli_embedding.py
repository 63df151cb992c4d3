"""`pyllama embedding` (llama.cpp's llama-embedding): output formats, pooling, normalization."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

TEXT = "The cat sat on the mat.\nStock markets fell today."


def run(*args):
    return subprocess.run([sys.executable, "-m", "pyllama", "embedding", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def test_json_matches_llama_embed(smollm2_path):
    from pyllama import Llama

    r = run("-m", smollm2_path, "-p", TEXT, "--pooling", "mean", "--embd-output-format", "json", "-t", 2)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    got = np.array([d["embedding"] for d in doc["data"]], dtype=np.float32)
    llm = Llama(str(smollm2_path), embedding=True, pooling_type=1, n_ctx=512, verbose=False, n_threads=2)
    want = np.array(llm.embed(TEXT.split("\n"), normalize=True), dtype=np.float32)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7 + 1e-6)  # printed with 7 decimals


def test_formats_and_pooling_none(smollm2_path):
    r = run("-m", smollm2_path, "-p", "Hello world", "--embd-output-format", "raw", "--embd-normalize", -1)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 2  # pooling none (a decoder's default): one vector per token ("Hello", " world")
    assert all(len(ln.split()) == 576 for ln in lines)
    r = run("-m", smollm2_path, "-p", TEXT, "--pooling", "last")
    assert r.returncode == 0 and "embedding 1:" in r.stdout and "cosine similarity matrix" in r.stdout
    r = run("-m", smollm2_path, "-p", TEXT, "--pooling", "cls", "--embd-output-format", "array",
            "--embd-normalize", 0)
    arr = json.loads(r.stdout)
    assert len(arr) == 2 and max(abs(x) for x in arr[0]) == pytest.approx(32760, abs=1)


def test_bad_flags(smollm2_path):
    assert run("-m", smollm2_path, "-p", "x", "--pooling", "rank").returncode == 2
    assert run("-m", smollm2_path, "-p", "x", "--embd-output-format", "xml").returncode == 2
    r = run("-m", smollm2_path, "-p", "x " * 3000, "--pooling", "mean", "-c", 512, "-b", 512)
    assert r.returncode == 1 and "n_batch" in r.stderr


def test_encoder_embeddings_and_rerank_scores(tmp_path):
    """An encoder (bert, CLS pooling from the file) and a bert reranker (rank pooling, tab-
    separated pairs) against llama.cpp's values (tests/data/encoders/reference.json)."""
    pytest.importorskip("gguf")
    from pathlib import Path

    data = Path(__file__).parents[1] / "data"
    sys.path.insert(0, str(data))
    import make_tiny_encoders as mte

    ref = json.loads((data / "encoders" / "reference.json").read_text())["models"]
    bert = mte.write("bert", tmp_path, "F32")
    rows = ref["bert-F32"]["rows"][:3]
    r = run("-m", bert, "-p", "\n".join(x["text"] for x in rows), "--embd-output-format", "json",
            "--embd-normalize", -1, "-t", 2)
    assert r.returncode == 0, r.stderr
    got = np.array([d["embedding"] for d in json.loads(r.stdout)["data"]])
    np.testing.assert_allclose(got, np.array([x["embedding"] for x in rows]), rtol=0, atol=2e-6)
    rank = mte.write("bert-rank", tmp_path, "F32")
    pairs = ref["bert-rank-F32"]["pairs"]
    r = run("-m", rank, "-p", "\n".join(f"{p['query']}\t{p['document']}" for p in pairs), "-t", 2)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines == [f"rerank score {j}: {p['embedding'][0]:8.3f}" for j, p in enumerate(pairs)]
