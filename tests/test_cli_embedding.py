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
