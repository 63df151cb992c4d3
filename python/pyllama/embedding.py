"""Embeddings from a context with ``embeddings=True``: pack inputs into batches (one sequence
each), decode, read the pooled vector per sequence (or every token's hidden state with pooling
none) and normalize as llama.cpp's ``common_embd_normalize``. ``Llama.embed``, ``pyllama
embedding`` and the server's embeddings routes use it.

Pooling (mean / cls / last over a sequence's tokens, or none) is the context's; a decoder
model (llama, qwen, gemma, ...) gives sentence embeddings with mean or last pooling, as
llama.cpp's llama-embedding does with ``--pooling``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .batch import batch_add, batch_init

__all__ = ["normalize", "embed_token_lists", "as_inputs", "POOLING_NAMES"]

POOLING_NAMES = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}


def normalize(v: np.ndarray, mode: int = 2) -> np.ndarray:
    """llama.cpp's ``common_embd_normalize`` (``--embd-normalize``): -1 none, 0 max
    absolute value (scaled to int16's range), 1 taxicab, 2 euclidean, > 2 p-norm. A zero
    vector stays zero. float32 in, float32 out (sums in float64, as llama.cpp)."""
    x = np.asarray(v, dtype=np.float32)
    if mode < 0:
        return x.copy()
    a = x.astype(np.float64)
    if mode == 0:
        s = np.max(np.abs(a)) / 32760.0 if a.size else 0.0
    elif mode == 1:
        s = np.sum(np.abs(a))
    elif mode == 2:
        s = np.sqrt(np.sum(a * a))
    else:
        s = np.sum(np.abs(a) ** mode) ** (1.0 / mode)
    norm = 1.0 / s if s > 0.0 else 0.0
    return (a * norm).astype(np.float32)


def embed_token_lists(ctx, inputs: Sequence[Sequence[int]], *, normalize_mode: int = -1) -> list:
    """One embedding per input token list: float32 [n_embd] with pooling, [n_tokens, n_embd]
    with pooling none. Inputs are packed into decodes of at most n_batch tokens and
    n_seq_max sequences; the cache is cleared before each decode and after the last."""
    n_batch = int(ctx.n_batch)
    n_seq = int(ctx.n_seq_max)
    pooled = int(ctx.pooling_type) != 0
    for i, toks in enumerate(inputs):
        if not toks:
            raise ValueError(f"input {i} is empty (it tokenizes to no tokens)")
        if len(toks) > n_batch:
            raise ValueError(f"input {i} is {len(toks)} tokens, more than the batch size n_batch = {n_batch}: "
                             "raise n_batch (and n_ubatch for non-causal models) or truncate it")
        if len(toks) > int(ctx.n_ctx_seq):
            raise ValueError(f"input {i} is {len(toks)} tokens, more than the context n_ctx = {int(ctx.n_ctx_seq)}")
    out: list = [None] * len(inputs)
    pending: list = []  # indices of the inputs in the batch being packed
    used = 0

    def flush():
        nonlocal pending, used
        if not pending:
            return
        b = batch_init(used, 0, 1)
        for s, i in enumerate(pending):
            for p, t in enumerate(inputs[i]):
                batch_add(b, int(t), p, (s,), True)
        ctx.memory_clear(True)
        ctx.decode(b)
        row = 0
        for s, i in enumerate(pending):
            n = len(inputs[i])
            if pooled:
                v = ctx.embeddings_seq(s)
                out[i] = normalize(v, normalize_mode)
            else:
                e = ctx.embeddings[row:row + n]
                out[i] = np.stack([normalize(r, normalize_mode) for r in e])
            row += n
        pending, used = [], 0

    for i, toks in enumerate(inputs):
        if used + len(toks) > n_batch or len(pending) >= n_seq:
            flush()
        pending.append(i)
        used += len(toks)
    flush()
    ctx.memory_clear(True)
    return out


def as_inputs(input) -> tuple:
    """(list of str-or-token-lists, whether one input was given) from OpenAI's ``input``:
    a string, a list of strings, a list of token ids or a list of token lists."""
    if isinstance(input, str):
        return [input], True
    if isinstance(input, list) and input and all(isinstance(t, int) and not isinstance(t, bool) for t in input):
        return [input], True
    if isinstance(input, list) and input and all(isinstance(x, str) or (isinstance(x, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in x)) for x in input):
        return list(input), False
    raise TypeError("input must be a string, a list of strings, a list of token ids or a list of token id lists")
