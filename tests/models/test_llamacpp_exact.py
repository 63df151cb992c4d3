"""Bit-for-bit agreement with llama.cpp's logits (beyond issue 5's tolerances).

pyllama's kernels and ops reproduce the float operations of llama.cpp 0c1e570's x86 AVX2
CPU backend (the summation orders of its quantized dot products, GCC's FMA contractions
in rope / GELU / the attention sum, ggml's vector expf in SwiGLU). Where llama.cpp's own
order depends on the batch (Q4_K: gemv vs repacked gemm rows; Q6_K: vec_dot below 8 rows,
tiled at 8 or more), pyllama uses the batch order for every token count so that its
results do not depend on n_ubatch. llama.cpp also switches its attention to a tiled f32
kernel for micro-batches of 64 or more queries; pyllama's default keeps its one kernel, so
the default-mode check below covers the prompts under 64 tokens. ``PYLLAMA_ORDER=llamacpp``
makes both choices per micro-batch as llama.cpp does: then every position of every
reference prompt, the 850-token ones included, is bit-identical on all three models.
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


def mismatches(model_path: Path, prefix: Path, prompts=SHORT) -> list:
    """(prompt, n_rows, rows whose 20 reference logits differ from ours in any bit)."""
    ref, z = load_ref(prefix)
    m = _core.Model([str(model_path)])
    out = []
    for i in (range(len(ref["prompts"])) if prompts is None else prompts):
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
print(json.dumps(mismatches(Path({model!r}), Path({prefix!r}), prompts=None)))
"""


@pytest.mark.parametrize("which", ["smollm2", "gemma3", "qwen25"])
def test_llamacpp_order_bit_identical(which, request):
    # all reference prompts, the ~850-token one (two micro-batches of >= 64 queries) included
    fixture, name = {"smollm2": ("smollm2_path", "smollm2-135m-q4_1"), "gemma3": ("gemma3_path", "gemma3-270m-q4_k_m"),
                     "qwen25": ("qwen25_path", "qwen2.5-coder-0.5b-q4_k_m")}[which]
    path = request.getfixturevalue(fixture)
    prefix = DATA / "reference" / name
    code = _CHILD.format(tests=str(Path(__file__).parent), model=str(path), prefix=str(prefix))
    env = dict(os.environ, PYLLAMA_ORDER="llamacpp")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert all(bad == 0 for _, _, bad in res), res


@pytest.mark.parametrize("qtype", ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0",
                                   "TQ2_0", "MXFP4", "Q1_0", "Q2_0", "NVFP4"])
def test_tiny_iq_bit_identical_to_llamacpp(qtype, tiny_iq_model):
    # tiny-iq-<T> (tests/data/tiny/make_tiny_iq.py): every weight of that type (llama-quantize
    # --pure; IQ1/IQ2: a Q8_0 token embedding), made here by pyllama quantize, byte for byte
    # llama-quantize's file (NVFP4, which llama-quantize makes only with --tensor-type: its
    # tensors byte for byte). Prompts of 8, 33 and 63 tokens: llama.cpp runs its tiled matmul
    # for the grid types (pyllama's order for them at every batch size), its AVX2 vec_dot for
    # TQ1_0 / TQ2_0 / MXFP4 / Q1_0 / NVFP4, its generic Q2_0 loop (FMA-contracted), and its
    # one attention kernel; every position's 20 reference logits and the last row are
    # bit-identical.
    model = tiny_iq_model(qtype)
    prefix = DATA / "tiny" / f"tiny-iq-{qtype}"
    res = mismatches(model, prefix, prompts=None)
    assert all(bad == 0 for _, _, bad in res), res
    ref, z = load_ref(prefix)
    m = _core.Model([str(model)])
    for i, p in enumerate(ref["prompts"]):
        ctx = _core.Context(m, n_ctx=2048, n_seq_max=1, n_ubatch=512, n_threads=2, n_threads_batch=2)
        last = decode_all(ctx, np.array(p["tokens"], np.int32), ref["n_vocab"])[-1]  # every row, as the reference
        assert np.array_equal(last.view(np.uint32), z[f"p{i}_last_logits"].view(np.uint32)), (qtype, i)


# tiny F32 models whose every matmul is a plain weight x activations product: llama.cpp runs
# llamafile's tinyBLAS for them from 2 tokens on (ops/sgemm.rs sums in its order); the MoE
# expert products (mul_mat_id: ggml_vec_dot_f32), MLA and the recurrent layers take other
# orders of llama.cpp's, so those models agree within tolerance only (tests/models/test_logits.py)
TINY_F32_EXACT = ["cohere2", "exaone4", "gemma", "gemma2", "gemma3", "glm4", "granite", "lfm2", "llama",
                  "mistral3", "olmo2", "phi2", "phi3", "qwen2", "qwen3", "smollm3", "starcoder2"]


@pytest.mark.parametrize("arch", TINY_F32_EXACT)
def test_tiny_f32_prefill_bit_identical(arch):
    # the prompts under 64 tokens (8 and 46: longer ones switch llama.cpp's attention to its
    # tiled kernel, which PYLLAMA_ORDER=llamacpp follows), every position's 20 logits
    from test_logits import tiny_path

    name = f"tiny-{arch}-F32"
    res = mismatches(tiny_path(name), DATA / "tiny" / name, prompts=range(2))
    assert all(bad == 0 for _, _, bad in res), res
