"""Bit-for-bit agreement with llama.cpp's logits (beyond issue 5's tolerances).

pyllama's kernels and ops reproduce the float operations of llama.cpp 0c1e570's x86 AVX2
CPU backend (the summation orders of its quantized dot products, GCC's FMA contractions
in rope / GELU / the attention sum, ggml's vector expf in SwiGLU). Where llama.cpp's own
order depends on the batch (Q4_K: gemv vs repacked gemm rows; Q6_K: vec_dot below 8 rows,
tiled at 8 or more), pyllama uses the batch order for every token count so that its
results do not depend on n_ubatch; ``PYLLAMA_ORDER=llamacpp`` switches to llama.cpp's
batch-dependent choice. llama.cpp also switches its attention to a tiled f32 kernel for
micro-batches of 64 or more queries, which pyllama does not follow: the 850-token
reference prompt is excluded here (issue 5's tolerances cover it in test_logits.py).
The references were computed on an AVX2 + FMA machine; these tests need the same.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test_logits import DATA, decode_all, load_ref

from pyllama import _core

SHORT = range(7)  # prompts under 64 tokens

pytestmark = pytest.mark.skipif(
    sys.platform == "darwin" or os.uname().machine not in ("x86_64", "AMD64"),
    reason="the references are llama.cpp's x86-64 AVX2 results",
)


def mismatches(model_path: Path, prefix: Path) -> list:
    """(prompt, n_rows, rows whose 20 reference logits differ from ours in any bit)."""
    ref, z = load_ref(prefix)
    m = _core.Model([str(model_path)])
    out = []
    for i in SHORT:
        toks = np.array(ref["prompts"][i]["tokens"], dtype=np.int32)
        ctx = _core.Context(m, n_ctx=2048, n_seq_max=1, n_ubatch=512, n_threads=2, n_threads_batch=2)
        lg = decode_all(ctx, toks, ref["n_vocab"])
        ours = np.take_along_axis(lg, z[f"p{i}_topk_ids"].astype(np.int64), axis=1)
        bad = int((ours != z[f"p{i}_topk_vals"]).any(axis=1).sum())
        out.append((i, len(toks), bad))
    return out


def test_smollm2_bit_identical_to_llamacpp(smollm2_path):
    # Q4_1 / Q8_0 / F32 only: no batch-dependent kernel in llama.cpp, so the default order
    # is already llama.cpp's, at every position of every short prompt.
    res = mismatches(smollm2_path, DATA / "reference" / "smollm2-135m-q4_1")
    assert all(bad == 0 for _, _, bad in res), res


_CHILD = """
import sys, json
sys.path.insert(0, {tests!r})
from pathlib import Path
from test_llamacpp_exact import mismatches
print(json.dumps(mismatches(Path({model!r}), Path({prefix!r}))))
"""


@pytest.mark.parametrize("which", ["gemma3", "qwen25"])
def test_llamacpp_order_bit_identical(which, request):
    path = request.getfixturevalue("gemma3_path" if which == "gemma3" else "qwen25_path")
    prefix = DATA / "reference" / ("gemma3-270m-q4_k_m" if which == "gemma3" else "qwen2.5-coder-0.5b-q4_k_m")
    code = _CHILD.format(tests=str(Path(__file__).parent), model=str(path), prefix=str(prefix))
    env = dict(os.environ, PYLLAMA_ORDER="llamacpp")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert all(bad == 0 for _, _, bad in res), res
