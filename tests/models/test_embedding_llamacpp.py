"""Embeddings bit for bit equal to llama.cpp's llama-embedding (no llama.cpp needed here).

tests/data/embedding_llamacpp.json holds llama.cpp's embeddings (tools/make_embedding_reference.py
over tools/llamacpp_embeddings.cpp: llama-embedding's settings, its AVX2 CPU backend) as a
sha256 of each prompt's float32 rows: every token's final-normed hidden state with pooling
none, the pooled vector with mean / cls / last, unnormalized. pyllama packs the same prompts
into the same decodes (pyllama.embedding.embed_token_lists, n_batch 4096, n_ubatch 512, up
to 256 sequences, unified KV cache) and must give the same bits:

- pooling none / last / cls: the hidden states, as in the generation references
  (tests/models/test_llamacpp_exact.py);
- mean: llama.cpp's pooling matmul in its float order (ggml_vec_dot_f32 for one sequence,
  llamafile's tinyBLAS for several when the micro-batch's token count is a multiple of 8).
  By default pyllama pools each sequence as llama.cpp pools one alone in a micro-batch (batch
  invariance): the "alone" case stores llama.cpp's result for each prompt run by itself and
  pyllama packs them into one decode. Under PYLLAMA_ORDER=llamacpp a packed sequence is
  pooled as llama.cpp pools it in its micro-batch. A prompt straddling a micro-batch
  boundary ("split") is pooled whole by pyllama, over its last part by llama.cpp: not compared;
- under PYLLAMA_ORDER=llamacpp, micro-batches of 64 tokens or more of several sequences:
  llama.cpp's tiled attention tiles the unified cache by cell, not by each sequence's positions.

The default order covers SmolLM2 in micro-batches under 64 tokens (where it is llama.cpp's
order); Gemma 3 and the long batches are checked under PYLLAMA_ORDER=llamacpp, in a child
process (the order is chosen once per process).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).parents[1] / "data" / "embedding_llamacpp.json"

pytestmark = pytest.mark.skipif(
    sys.platform == "darwin" or os.uname().machine not in ("x86_64", "AMD64"),
    reason="the references are llama.cpp's x86-64 AVX2 results",
)


def _cases(order: str) -> list:
    return [c for c in json.loads(DATA.read_text())["cases"] if c["order"] == order]


def mismatches(paths: dict, order: str) -> list:
    """(case, prompt index, n_tokens, max |diff| over the stored sample of its last row) for
    every prompt whose embedding rows differ from llama.cpp's in any bit."""
    from pyllama import Context, Model
    from pyllama.embedding import POOLING_NAMES, embed_token_lists

    sample = json.loads(DATA.read_text())["sample_idx"]
    models: dict = {}
    bad = []
    for c in _cases(order):
        if c["model"] not in models:
            models[c["model"]] = Model.load(paths[c["model"]])
        ctx = Context(models[c["model"]], n_ctx=4096, n_batch=4096, n_ubatch=512, n_seq_max=256, kv_unified=True,
                      embeddings=True, pooling_type=POOLING_NAMES[c["pooling"]], n_threads=2, n_threads_batch=2)
        got = embed_token_lists(ctx, [p["tokens"] for p in c["prompts"]], normalize_mode=-1)
        ctx.close()
        for i, (p, e) in enumerate(zip(c["prompts"], got)):
            if p.get("split") and c["pooling"] in ("mean", "cls"):
                continue  # llama.cpp pools the part in the last micro-batch only
            x = np.ascontiguousarray(e, dtype=np.float32)
            if hashlib.sha256(x.tobytes()).hexdigest() != p["sha256"]:
                last = x.reshape(-1, x.shape[-1])[-1]
                d = max(abs(float(last[j]) - v) for j, v in zip(sample, p["last_row_sample"]))
                bad.append((c["name"], i, len(p["tokens"]), d))
    return bad


def test_reference_data_covers_the_cases():
    cases = json.loads(DATA.read_text())["cases"]
    assert {c["pooling"] for c in cases} == {"none", "mean", "cls", "last"}
    assert {c["model"] for c in cases} == {"smollm2", "gemma3"}
    # a micro-batch of several sequences with a token count divisible by 8 (tinyBLAS) and not
    counts = {sum(len(p["tokens"]) for p in c["prompts"]) % 8 == 0 for c in cases
              if c["pooling"] == "mean" and len(c["prompts"]) > 1 and not c.get("alone") and c["order"] == "llamacpp"}
    assert counts == {True, False}
    # a long batch with a prompt across the micro-batch boundary, compared where it can be
    assert any(p.get("split") for c in cases if c["pooling"] == "none" for p in c["prompts"])


def test_smollm2_embeddings_bit_identical(smollm2_path):
    # the reported case first: 7 tokens, every token's hidden state
    assert mismatches({"smollm2": smollm2_path}, "default") == []


_CHILD = """
import sys, json
sys.path.insert(0, {tests!r})
from test_embedding_llamacpp import mismatches
print(json.dumps(mismatches({paths!r}, "llamacpp")))
"""


def test_llamacpp_order_embeddings_bit_identical(smollm2_path, gemma3_path):
    # Gemma 3 (batch-size dependent Q4_K / Q6_K kernels in llama.cpp) and batches of 592
    # tokens: two micro-batches of >= 64 queries, many sequences in one unified cache
    paths = {"smollm2": str(smollm2_path), "gemma3": str(gemma3_path)}
    code = _CHILD.format(tests=str(Path(__file__).parent), paths=paths)
    env = dict(os.environ, PYLLAMA_ORDER="llamacpp")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []
