"""Gemma 3n's KV reuse and fixed sizes on the tiny fixture (tests/data/make_tiny.py: 22
layers, so layers 20 and 21 read layers 18's and 19's cache). Its logits, greedy path and
sequence operations are held to llama.cpp's in tests/models/test_logits.py and
tests/models/test_recurrent.py."""

from __future__ import annotations

import numpy as np
import pytest

import pyllama
from pyllama import _core

PROMPT = np.array([17, 300, 5, 901, 44, 1203, 8, 77, 999, 3, 1500, 62], dtype=np.int32)


@pytest.fixture(scope="module")
def path(tiny_model_path):
    return tiny_model_path("gemma3n")


def _ctx(model, **kw):
    kw.setdefault("n_ctx", 256)
    return _core.Context(model, n_seq_max=kw.pop("n_seq_max", 1), n_ubatch=512, n_threads=2, n_threads_batch=2, **kw)


def _decode(ctx, toks, start=0, seq=0):
    n = len(toks)
    logits = np.zeros((n, 2048), np.float32)
    out = ctx.decode(np.asarray(toks, np.int32), None, np.arange(start, start + n, dtype=np.int32),
                     np.ones(n, np.int32), np.full((n, 1), seq, np.int32), [np.arange(n, dtype=np.int32)],
                     np.arange(n, dtype=np.int32), logits, None, None)
    assert out.kind == "ok"
    return logits


def test_reused_layers_keep_no_cache(path):
    m = _core.Model([str(path)])
    hp = m.hparams()
    ctx = _ctx(m, type_k="f16", type_v="f16")
    # 20 cached layers of n_head_kv (2) x 32 f16 keys and values per cell, none for layers 20-21
    per_cell_layer = 2 * (hp["n_head_kv"][0] if isinstance(hp["n_head_kv"], list) else hp["n_head_kv"]) * 32 * 2
    assert ctx.kv_bytes() == 20 * per_cell_layer * ctx.n_ctx


def test_state_round_trip_and_rebuilt_cells(path):
    # the reused layers read whatever the cached layers hold for the cells: a state reload,
    # or positions removed and decoded again, give the logits of an uninterrupted run
    m = _core.Model([str(path)])
    ctx = _ctx(m)
    _decode(ctx, PROMPT)
    saved = ctx.state_save()
    want = _decode(ctx, [42], start=len(PROMPT))
    ctx.memory_clear()
    ctx.state_load(np.frombuffer(saved, np.uint8), n_batch=512)
    assert np.array_equal(_decode(ctx, [42], start=len(PROMPT)), want)
    assert ctx.seq_rm(0, 6, -1)
    assert ctx.seq_pos_max(0) == 5
    again = _decode(ctx, list(PROMPT[6:]) + [42], start=6)
    assert np.array_equal(again[-1], want[-1])


@pytest.mark.parametrize("key, value", [
    ("gemma3n.attention.shared_kv_layers", 3),
    ("gemma3n.embedding_length_per_layer_input", 128),
    ("gemma3n.altup.num_inputs", 2),
    ("gemma3n.altup.active_idx", 1),
])
def test_fixed_sizes_must_agree(path, key, value):
    # llama.cpp does not read these keys and runs its fixed sizes: a file that says otherwise
    # describes another model, and is refused, naming the key
    with pytest.raises(pyllama.UnsupportedModelError, match=key.replace(".", r"\.")):
        _core.Model([str(path)], kv_overrides={key: value})


@pytest.mark.parametrize("pattern, want", [(0, [True] * 6), (3, [True, True, False] * 2), (6, [True] * 5 + [False])])
def test_gemma3_swa_pattern_as_llamacpp(tiny_model_path, pattern, want):
    # (gemma3, beside: llama.cpp's set_swa_pattern, where 0 makes every layer slide)
    m = _core.Model([str(tiny_model_path("gemma3"))], kv_overrides={"gemma3.attention.sliding_window_pattern": pattern})
    assert m.hparams()["swa_layers"] == want
