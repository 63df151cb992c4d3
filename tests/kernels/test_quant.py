"""Quantized formats: dequantize/quantize bit-exactness against gguf-py (which mirrors
ggml's reference code), the unsupported-type errors, and the matmul against numpy.

The expected values come from gguf-py's independent numpy implementation of each block
format (``gguf.quants``), never from pyllama itself."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES  # noqa: E402

from pyllama import _core  # noqa: E402
from pyllama.gguf import GGUFFile  # noqa: E402

SUPPORTED = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
             "Q6_K", "IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
             "TQ1_0", "TQ2_0", "MXFP4", "NVFP4"]
# gguf-py has no dequantize for these two activation-only formats; checked by hand below.
ACT_ONLY = ["Q8_1", "Q8_K"]
# dequantize only (as a C cast to float); no matmul takes them
INTEGER = {"I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64, "F64": np.float64}
GGUF_QUANTIZE = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]


def assert_bits_equal(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    """Equal bit for bit (so -0.0 != 0.0), NaN only where the other has NaN."""
    assert ours.shape == theirs.shape, what
    assert ours.dtype == np.float32 and theirs.dtype == np.float32, what
    nan = np.isnan(ours)
    assert np.array_equal(nan, np.isnan(theirs)), f"{what}: NaN positions differ"
    a, b = ours.view(np.uint32)[~nan], theirs.view(np.uint32)[~nan]
    bad = np.flatnonzero(a != b)
    assert bad.size == 0, f"{what}: {bad.size} values differ, first at flat {bad[0]}: {a[bad[0]]:#x} vs {b[bad[0]]:#x}"


def gguf_dequantize(raw: np.ndarray, type_name: str, n_per_row: int) -> np.ndarray:
    qt = QT[type_name]
    _, type_size = GGML_QUANT_SIZES[qt]
    rb = n_per_row // GGML_QUANT_SIZES[qt][0] * type_size
    return gguf.quants.dequantize(np.ascontiguousarray(raw).reshape(-1, rb), qt).reshape(-1, n_per_row)


# ------------------------------------------------------------------ real models

CHUNK_ELEMS = 1 << 22  # compare big tensors in slices of rows to bound memory


def test_every_tensor_of_the_real_models_dequantizes_like_gguf_py(real_model_path):
    f = GGUFFile(real_model_path)
    seen = set()
    for info in f.tensors:
        t = f.tensor(info.name)
        n_per_row = info.shape[-1]
        n_rows = int(np.prod(info.shape[:-1], dtype=np.int64))
        raw = t.raw
        if n_rows * n_per_row <= CHUNK_ELEMS:
            ours = t.dequantize()
            assert ours.shape == info.shape
            theirs = gguf_dequantize(raw, info.type, n_per_row).reshape(info.shape)
            assert_bits_equal(ours, theirs, info.name)
        else:
            rb = raw.size // n_rows
            step = max(1, CHUNK_ELEMS // n_per_row)
            for r0 in range(0, n_rows, step):
                r1 = min(n_rows, r0 + step)
                chunk = raw[r0 * rb:r1 * rb]
                ours = _core.dequantize(chunk, info.type, [r1 - r0, n_per_row])
                assert_bits_equal(ours, gguf_dequantize(chunk, info.type, n_per_row), f"{info.name} rows {r0}:{r1}")
        seen.add(info.type)
    assert seen & {"Q4_1", "Q4_K", "Q6_K", "Q5_0", "Q8_0"}


# ------------------------------------------------------------------ random blocks


def random_blocks(type_name: str, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes for n_blocks blocks; f16 scale fields are made finite (random bytes
    would be NaN/inf 1/32 of the time, which tells nothing about the format)."""
    qt = QT[type_name]
    bs, ts = GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    f16_fields = {
        "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "IQ4_NL": [0],
        "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_XS": [0],
        "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0], "IQ1_S": [0],
        "TQ1_0": [52], "TQ2_0": [64],
    }.get(type_name, [])
    for off in f16_fields:
        vals = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
        raw[:, off:off + 2] = vals.view(np.uint8).reshape(n_blocks, 2)
    if type_name == "MXFP4":
        raw[:, 0] = rng.integers(100, 150, n_blocks)  # E8M0 exponents of everyday scales
    if type_name == "IQ1_M":
        # the f16 scale lives in the top nibbles of the 4 u16 scale words (bytes 48..56)
        d = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16).view(np.uint16).astype(np.uint16)
        words = raw[:, 48:56].copy().view(np.uint16)
        for k in range(4):
            words[:, k] = (words[:, k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12)
        raw[:, 48:56] = words.view(np.uint8)
    if type_name in ("F16", "BF16", "F32"):
        raw = rng.standard_normal(n_blocks * bs).astype(np.float32)
        raw = gguf.quants.quantize(raw, QT[type_name]) if type_name != "F32" else raw
        raw = np.ascontiguousarray(raw).view(np.uint8)
    return raw.reshape(-1)


@pytest.mark.parametrize("type_name", SUPPORTED)
def test_random_blocks_dequantize_like_gguf_py(type_name):
    rng = np.random.default_rng(list(QT.__members__).index(type_name))
    bs = GGML_QUANT_SIZES[QT[type_name]][0]
    n_per_row = bs * 3 if bs > 1 else 96
    n_rows = 40
    raw = random_blocks(type_name, n_rows * n_per_row // bs, rng)
    ours = _core.dequantize(raw, type_name, [n_rows, n_per_row])
    assert_bits_equal(ours, gguf_dequantize(raw, type_name, n_per_row), type_name)


def test_random_raw_bytes_with_any_scale_bits_match_gguf_py():
    # Unsanitized bytes: inf/NaN/subnormal f16 scales must decode exactly as gguf-py does.
    rng = np.random.default_rng(7)
    for type_name in ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q5_0", "Q3_K", "Q2_K", "Q5_K", "IQ4_XS", "IQ2_XXS",
                      "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4"]:
        qt = QT[type_name]
        bs, ts = GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, size=64 * ts, dtype=np.uint8)
        with np.errstate(invalid="ignore", over="ignore"):
            theirs = gguf_dequantize(raw, type_name, bs * 4)
        ours = _core.dequantize(raw, type_name, [16, bs * 4])
        assert_bits_equal(ours, theirs, type_name)


def test_q1_0_and_q2_0_of_hand_values():
    # gguf-py has neither; derived by hand from ggml-common.h / dequantize_row_q{1,2}_0.
    # Q1_0: 128 elements, d (f16) then bit j of qs: +d, else -d
    raw = np.zeros(18, np.uint8)
    raw[0:2] = np.array([0x3800], np.uint16).view(np.uint8)  # d = 0.5
    raw[2] = 0b00000101  # elements 0 and 2 positive
    raw[17] = 0x80  # element 127 positive
    out = _core.dequantize(raw, "Q1_0", [128])
    want = np.full(128, -0.5, np.float32)
    want[[0, 2, 127]] = 0.5
    assert out.tolist() == want.tolist()
    # Q2_0: 64 elements, d then 2 bits each (low bits first), value (q - 1) * d
    raw = np.zeros(18, np.uint8)
    raw[0:2] = np.array([0x4000], np.uint16).view(np.uint8)  # d = 2
    raw[2] = 0b11100100  # elements 0..3: q = 0, 1, 2, 3
    raw[17] = 0b10 << 6  # element 63: q = 2
    out = _core.dequantize(raw, "Q2_0", [64])
    want = np.full(64, -2.0, np.float32)
    want[:4] = [-2.0, 0.0, 2.0, 4.0]
    want[63] = 2.0
    assert out.tolist() == want.tolist()


def test_q8_0_of_hand_values():
    # d = 0.5 (f16 0x3800), qs = -3, 0, 7, ... -> -1.5, 0, 3.5 (derived by hand from the layout).
    raw = np.zeros(34, np.uint8)
    raw[0:2] = np.array([0x3800], np.uint16).view(np.uint8)
    raw[2:5] = np.array([-3, 0, 7], np.int8).view(np.uint8)
    out = _core.dequantize(raw, "Q8_0", [32])
    assert out[:4].tolist() == [-1.5, 0.0, 3.5, 0.0]


# ------------------------------------------------------------------ quantize


def random_rows(rng: np.random.Generator, n_rows: int, n_per_row: int) -> np.ndarray:
    x = rng.standard_normal((n_rows, n_per_row)).astype(np.float32)
    x *= np.exp(rng.uniform(-6, 6, size=(n_rows, 1))).astype(np.float32)  # varied magnitudes
    x[0, :] = 0.0  # an all-zero row: the d == 0 paths
    x[1, ::2] = 1.0  # ties and repeated maxima
    x[1, 1::2] = -1.0
    x[2, :] = np.round(x[2, :] * 4) / 4  # values that land on .5 after scaling
    return x


@pytest.mark.parametrize("type_name", GGUF_QUANTIZE)
def test_quantize_matches_gguf_py(type_name):
    rng = np.random.default_rng(1 + GGUF_QUANTIZE.index(type_name))
    x = random_rows(rng, 64, 256)
    ours = _core.quantize(x, type_name)
    theirs = np.ascontiguousarray(gguf.quants.quantize(x, QT[type_name])).view(np.uint8).reshape(ours.shape)
    if type_name in ("Q4_0", "Q5_0"):
        # The one place gguf-py and ggml disagree: an all-zero block. ggml starts from
        # max = 0.0f and keeps it, so d = 0.0f / -8 = -0.0 (f16 0x8000); gguf-py takes the
        # first element, which may be -0.0, giving +0.0. We follow ggml (llama-quantize).
        bs, ts = GGML_QUANT_SIZES[QT[type_name]]
        zero_blocks = np.all(x.reshape(-1, bs) == 0, axis=1)
        assert zero_blocks.any()
        ob, tb = ours.reshape(-1, ts), theirs.reshape(-1, ts).copy()
        assert np.all(ob[zero_blocks, 0:2].view(np.uint16) == 0x8000)
        tb[zero_blocks, 0:2] = ob[zero_blocks, 0:2]
        theirs = tb.reshape(ours.shape)
    if type_name in ("Q4_1", "Q5_1"):
        # Same story for min/max: on ties between -0.0 and +0.0 ggml keeps the first
        # occurrence (`if (v < min) min = v`), numpy's min/max may return either. Re-derive
        # the d and m fields with ggml's rule, then everything must agree.
        bs, ts = GGML_QUANT_SIZES[QT[type_name]]
        xb = x.reshape(-1, bs)
        rows = np.arange(xb.shape[0])
        mn = xb[rows, np.argmin(xb, axis=1)]  # argmin/argmax return the first occurrence
        mx = xb[rows, np.argmax(xb, axis=1)]
        d = ((mx - mn) / np.float32(2 ** (4 if type_name == "Q4_1" else 5) - 1)).astype(np.float16)
        tb = theirs.reshape(-1, ts).copy()
        tb[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
        tb[:, 2:4] = mn.astype(np.float16).view(np.uint8).reshape(-1, 2)
        theirs = tb.reshape(ours.shape)
    bad = np.argwhere(ours != theirs)
    assert bad.size == 0, f"{type_name}: {len(bad)} bytes differ, first at {bad[0]}"


# ggml's tests/test-quantize-fns.cpp budget for quantize -> dequantize of its synthetic data.
MAX_QUANTIZATION_TOTAL_ERROR = 0.002


def test_quantize_roundtrip_error_within_ggml_budget():
    # test-quantize-fns.cpp's data: 0.1 + 2*cos(i + offset), RMSE-like mean abs error budget.
    n = 4096
    x = (0.1 + 2 * np.cos(np.arange(n, dtype=np.float32) + 0.0)).astype(np.float32)
    for type_name, budget in [("Q8_0", MAX_QUANTIZATION_TOTAL_ERROR), ("Q8_1", MAX_QUANTIZATION_TOTAL_ERROR),
                              ("Q8_K", MAX_QUANTIZATION_TOTAL_ERROR), ("Q4_0", MAX_QUANTIZATION_TOTAL_ERROR),
                              ("Q4_1", MAX_QUANTIZATION_TOTAL_ERROR), ("Q5_0", MAX_QUANTIZATION_TOTAL_ERROR),
                              ("Q5_1", MAX_QUANTIZATION_TOTAL_ERROR), ("IQ4_NL", MAX_QUANTIZATION_TOTAL_ERROR),
                              ("F16", MAX_QUANTIZATION_TOTAL_ERROR), ("BF16", MAX_QUANTIZATION_TOTAL_ERROR)]:
        q = _core.quantize(x, type_name)
        y = _core.dequantize(q, type_name, [n])
        # test-quantize-fns computes sqrt(sum((x-y)^2)) / n
        err = float(np.sqrt(np.sum((x.astype(np.float64) - y) ** 2)) / n)
        assert err < budget, (type_name, err)


def test_q8_k_layout_by_hand():
    # One block: x = 0..255 scaled so max |x| = 127 at the last element -> iscale = -127/max.
    x = np.arange(256, dtype=np.float32) - 128.0  # max |x| = 128 at index 0 (value -128)
    q = _core.quantize(x, "Q8_K")
    assert q.shape == (292,)
    d = q[0:4].view(np.float32)[0]
    qs = q[4:260].view(np.int8).astype(np.int32)
    bsums = q[260:292].view(np.int16).astype(np.int32)
    iscale = np.float32(-127.0) / np.float32(-128.0)
    assert d == np.float32(1.0) / iscale
    expect = np.minimum(127, np.round(iscale * x).astype(np.int32))  # round half even, as nearest_int
    assert np.array_equal(qs, expect)
    assert np.array_equal(bsums, qs.reshape(16, 16).sum(axis=1))


def test_activation_quantizers_are_llama_cpp_x86_ones():
    # x86 llama.cpp: id = 127/amax, round half to even; differs from the _ref quantizer on
    # exact ties. With amax = 127 and x = 2.5, 127/127 = 1 -> 2.5 rounds to 2 (even), while
    # the reference roundf gives 3.
    x = np.zeros(32, np.float32)
    x[0] = 127.0
    x[1] = 2.5
    x[2] = -3.5
    act = _core.quantize(x, "Q8_0", activation=True)
    ref = _core.quantize(x, "Q8_0")
    assert act[2:5].view(np.int8).tolist() == [127, 2, -4]
    assert ref[2:5].view(np.int8).tolist() == [127, 3, -4]


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("type_name", list(INTEGER))
def test_integer_and_f64_types_dequantize_and_refuse_matmul(type_name):
    rng = np.random.default_rng(5)
    dt = INTEGER[type_name]
    if dt == np.float64:
        vals = rng.standard_normal(64) * np.exp(rng.uniform(-80, 80, 64))
    else:
        info = np.iinfo(dt)
        vals = rng.integers(info.min, info.max, size=64, dtype=dt, endpoint=True)
    vals = vals.astype(dt)
    out = _core.dequantize(vals.view(np.uint8), type_name, [4, 16])
    assert_bits_equal(out, vals.astype(np.float32).reshape(4, 16), type_name)  # C's cast: round to nearest even
    with pytest.raises(_core.UnsupportedModelError, match=f"unsupported tensor type {type_name}"):
        _core.matmul(vals.view(np.uint8), type_name, [4, 16], np.zeros((1, 16), np.float32))


def test_bad_sizes_raise_value_errors():
    with pytest.raises(ValueError, match="needs 68 bytes, got 34"):
        _core.dequantize(np.zeros(34, np.uint8), "Q8_0", [2, 32])
    with pytest.raises(ValueError, match="not a multiple of the Q4_K block size 256"):
        _core.dequantize(np.zeros(144, np.uint8), "Q4_K", [128])
    with pytest.raises(ValueError, match="unknown tensor type 'Q9_9'"):
        _core.quantize(np.zeros(32, np.float32), "Q9_9")
    with pytest.raises(ValueError, match="rows of 64"):
        _core.matmul(np.zeros(34, np.uint8), "Q8_0", [1, 32], np.zeros((1, 64), np.float32))
    with pytest.raises(_core.UnsupportedModelError, match="quantize"):
        _core.quantize(np.zeros(256, np.float32), "Q4_K")
