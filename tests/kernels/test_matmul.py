"""matmul: agreement with numpy on the dequantized weights, and determinism (each output
element is bit-identical whatever the batch size, the thread count or the tiling)."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES  # noqa: E402

from pyllama import _core  # noqa: E402
from pyllama.gguf import GGUFFile  # noqa: E402
from test_quant import SUPPORTED, random_blocks  # noqa: E402

# the SIMD sets this CPU runs: "avx512" implies the AVX2 and AVX-512 BW kernels run too
KERNELS = ["ref"] + {"ref": [], "avx2": ["avx2"], "avx512bw": ["avx2", "avx512bw"],
                     "avx512": ["avx2", "avx512", "avx512bw"]}[_core.kernel_set()]


def numpy_reference(raw: np.ndarray, type_name: str, n_out: int, n_in: int, x: np.ndarray):
    """float64 product of the dequantized weight with the activations exactly as the kernel
    sees them (rounded through vec_dot_type by the same activation quantizer), plus the
    bound |W| @ |x| used to scale the float32-summation tolerance."""
    w = _core.dequantize(raw, type_name, [n_out, n_in]).astype(np.float64)
    vdt = _core.vec_dot_type(type_name)
    if vdt == "F32":
        xq = x.astype(np.float64)
    else:
        xb = _core.quantize(x, vdt, activation=True)
        xq = _core.dequantize(xb, vdt, list(x.shape)).astype(np.float64)
    if vdt == "Q8_1":
        # Q4_1/Q5_1: ggml uses the block's f16-rounded s = d*sum(q) for the min term, not
        # sum of the dequantized activations; build the reference the same way.
        ts = GGML_QUANT_SIZES[QT[type_name]][1]
        m = raw.reshape(n_out, -1, ts)[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float64)
        s = xb.reshape(x.shape[0], -1, 36)[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float64)
        w_nomin = w - np.repeat(m, 32, axis=1)
        ref = xq @ w_nomin.T + s @ m.T
    else:
        ref = xq @ w.T
    bound = np.abs(xq) @ np.abs(w).T
    return ref, bound


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("type_name", SUPPORTED)
def test_matmul_matches_numpy_on_random_weights(type_name, kernels):
    rng = np.random.default_rng(100 + SUPPORTED.index(type_name))
    bs = GGML_QUANT_SIZES[QT[type_name]][0]
    n_in = 512 if bs == 256 else 5 * bs  # 2 super-blocks / 5 blocks: odd block counts too
    n_out, n_tokens = 37, 5
    raw = random_blocks(type_name, n_out * n_in // bs, rng)
    x = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    out = _core.matmul(raw, type_name, [n_out, n_in], x, n_threads=2, kernels=kernels)
    ref, bound = numpy_reference(raw, type_name, n_out, n_in, x)
    # float32 accumulation over n_in terms: each partial sum is rounded at most once per
    # block (relative 2^-24), so the error is far below 1e-5 of sum |w x|.
    assert np.all(np.abs(out - ref) <= 1e-5 * bound + 1e-30), np.max(np.abs(out - ref) / (bound + 1e-30))


@pytest.mark.parametrize("kernels", KERNELS)
def test_matmul_close_to_unquantized_activations(kernels):
    # The q8 rounding of the activations costs at most 0.5/127 of each block's max |x|
    # per element: bound the difference to numpy on the raw f32 activations by that.
    rng = np.random.default_rng(5)
    n_in, n_out = 512, 64
    raw = random_blocks("Q4_K", n_out * n_in // 256, rng)
    x = rng.standard_normal((3, n_in)).astype(np.float32)
    w = _core.dequantize(raw, "Q4_K", [n_out, n_in]).astype(np.float64)
    out = _core.matmul(raw, "Q4_K", [n_out, n_in], x, kernels=kernels)
    exact = x.astype(np.float64) @ w.T
    step = np.repeat(np.abs(x).reshape(3, -1, 256).max(axis=2), 256, axis=1) / 127  # q8_K step
    bound = (0.5 * step + 1e-6 * np.abs(x)) @ np.abs(w).T
    assert np.all(np.abs(out - exact) <= bound)


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("type_name", ["Q4_1", "Q4_K", "Q6_K", "Q5_0", "Q8_0", "F32", "F16", "IQ4_XS"])
def test_each_output_is_bit_identical_whatever_the_batch_and_threads(type_name, kernels):
    rng = np.random.default_rng(9)
    bs = GGML_QUANT_SIZES[QT[type_name]][0]
    n_in = 768 if bs == 256 else 96 * 3
    n_out, n_tokens = 53, 19
    raw = random_blocks(type_name, n_out * n_in // bs, rng)
    x = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    full = _core.matmul(raw, type_name, [n_out, n_in], x, n_threads=1, kernels=kernels)
    for nt in (2, 3):
        assert np.array_equal(full.view(np.uint32), _core.matmul(raw, type_name, [n_out, n_in], x, n_threads=nt,
                                                                  kernels=kernels).view(np.uint32))
    for t0, t1 in [(0, 1), (3, 4), (5, 9), (9, 19), (18, 19)]:
        part = _core.matmul(raw, type_name, [n_out, n_in], np.ascontiguousarray(x[t0:t1]), n_threads=2,
                            kernels=kernels)
        assert np.array_equal(part.view(np.uint32), full[t0:t1].view(np.uint32)), (t0, t1)


@pytest.mark.parametrize("kernels", KERNELS)
def test_matmul_on_real_model_weights(real_model_path, kernels):
    f = GGUFFile(real_model_path)
    rng = np.random.default_rng(11)
    done = set()
    for info in f.tensors:
        if len(info.shape) != 2 or info.type in done:
            continue
        done.add(info.type)
        n_out, n_in = info.shape
        x = rng.standard_normal((4, n_in)).astype(np.float32)
        raw = f.tensor(info.name).raw
        if n_out > 4096:  # token_embd: the first 4096 rows are plenty
            raw, n_out = raw[: raw.size // n_out * 4096], 4096
        out = _core.matmul(raw, info.type, [n_out, n_in], x, n_threads=2, kernels=kernels)
        ref, bound = numpy_reference(raw, info.type, n_out, n_in, x)
        assert np.all(np.abs(out - ref) <= 1e-5 * bound + 1e-30), info.name
    assert len(done) >= 2
