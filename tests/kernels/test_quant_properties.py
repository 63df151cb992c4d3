"""Property tests (hypothesis): bad sizes and types give exactly a ValueError or an
UnsupportedModelError (never a crash), and quantization errors stay within each format's
rounding step."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pyllama import _core

TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
         "Q6_K", "Q8_K", "IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ1_M", "TQ2_0", "MXFP4", "I8", "F64"]


@settings(max_examples=300, deadline=None)
@given(type_name=st.sampled_from(TYPES), n_bytes=st.integers(0, 2000),
       shape=st.lists(st.integers(0, 600), min_size=1, max_size=3))
def test_dequantize_succeeds_or_raises_a_clear_error(type_name, n_bytes, shape):
    raw = np.zeros(n_bytes, np.uint8)
    try:
        out = _core.dequantize(raw, type_name, shape)
    except _core.UnsupportedModelError as e:
        assert f"unsupported tensor type {type_name}" in str(e)
    except ValueError as e:
        assert str(e)  # size/shape mismatch, named in the message
    else:
        assert out.shape == tuple(shape) and out.dtype == np.float32


@settings(max_examples=100, deadline=None)
@given(type_name=st.sampled_from(TYPES), shape=st.lists(st.integers(0, 300), min_size=1, max_size=2),
       n_in=st.integers(1, 600), n_tokens=st.integers(0, 3))
def test_matmul_succeeds_or_raises_a_clear_error(type_name, shape, n_in, n_tokens):
    raw = np.zeros(1024, np.uint8)
    x = np.zeros((n_tokens, n_in), np.float32)
    try:
        out = _core.matmul(raw, type_name, shape, x)
    except (_core.UnsupportedModelError, ValueError) as e:
        assert str(e)
    else:
        assert out.shape == (n_tokens, shape[0] if len(shape) == 2 else 1)


finite = st.floats(-1e4, 1e4, allow_nan=False, width=32)


@settings(max_examples=200, deadline=None)
@given(x=hnp.arrays(np.float32, st.sampled_from([32, 64, 256]), elements=finite),
       activation=st.booleans())
def test_q8_round_trip_within_half_a_step(x, activation):
    # Q8_0/Q8_1: each value is within half a quantization step (amax/127) of the original,
    # plus the f16 rounding of the scale (relative 2^-11 of the value), plus, where the scale
    # is an f16 subnormal or underflows to 0, its absolute rounding 2^-25 times |q| <= 127.
    for type_name in ("Q8_0", "Q8_1"):
        q = _core.quantize(x, type_name, activation=activation)
        y = _core.dequantize(q, type_name, [x.size])
        amax = np.repeat(np.abs(x).reshape(-1, 32).max(axis=1), 32).astype(np.float64)
        bound = 0.5 * amax / 127 * (1 + 2.0 ** -10) + np.abs(x) * 2.0 ** -10 + 127 * 2.0 ** -25
        assert np.all(np.abs(y.astype(np.float64) - x) <= bound)
    if x.size % 256 == 0:
        q = _core.quantize(x, "Q8_K", activation=activation)
        y = _core.dequantize(q, "Q8_K", [x.size])
        amax = np.repeat(np.abs(x).reshape(-1, 256).max(axis=1), 256).astype(np.float64)
        assert np.all(np.abs(y.astype(np.float64) - x) <= 0.5 * amax / 127 * (1 + 1e-5) + 1e-30)


@settings(max_examples=200, deadline=None)
@given(x=hnp.arrays(np.float32, st.sampled_from([32, 96]), elements=finite))
def test_activation_and_reference_quantizers_differ_only_on_rounding_ties(x):
    # llama.cpp's x86 activation quantizer vs ggml's reference one: same scale, and each
    # quant differs by at most 1 (127/amax vs 1/(amax/127), half-even vs half-away).
    a = _core.quantize(x, "Q8_0", activation=True).reshape(-1, 34)
    r = _core.quantize(x, "Q8_0").reshape(-1, 34)
    assert np.array_equal(a[:, :2], r[:, :2])
    # Below amax = 127 * FLT_MIN the inverse scale overflows and both give garbage quants
    # (times an f16 scale of 0): not a rounding question.
    amax = np.abs(x).reshape(-1, 32).max(axis=1)
    keep = (amax == 0) | (amax >= 1e-30)
    a, r = a[keep], r[keep]
    diff = np.abs(a[:, 2:].view(np.int8).astype(int) - r[:, 2:].view(np.int8).astype(int))
    assert diff.max(initial=0) <= 1


def test_nan_free_sizes_zero():
    assert _core.dequantize(np.zeros(0, np.uint8), "Q4_K", [0, 256]).shape == (0, 256)
    with pytest.raises(ValueError):
        _core.dequantize(np.zeros(0, np.uint8), "Q4_K", [1, 256])
