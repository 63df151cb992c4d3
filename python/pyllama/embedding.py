"""Embeddings from a context with ``embeddings=True``: pack inputs into batches (one sequence
each), decode, read the pooled vector per sequence (or every token's hidden state with pooling
none) and normalize as llama.cpp's ``common_embd_normalize``. ``Llama.embed``, ``pyllama
embedding`` and the server's embeddings routes use it.

Pooling (mean / cls / last over a sequence's tokens, none, or rank: a reranker's
classifier score) is the context's, by default the model's ``{arch}.pooling_type``.
Encoder models (bert, nomic-bert, jina-bert-v2, modern-bert, gemma-embedding, t5encoder)
run each batch in one micro-batch, so their inputs are packed into at most n_ubatch
tokens; a decoder model (llama, qwen, gemma, ...) gives sentence embeddings with mean or
last pooling (Qwen3-Embedding files say last), as llama.cpp's llama-embedding does.

``rerank(ctx, query, documents)`` scores documents for a query with a reranker (rank
pooling), each pair built as llama-server's ``format_prompt_rerank`` builds it
(``rerank_tokens``); the server's /v1/rerank calls it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .batch import batch_add, batch_init

__all__ = ["normalize", "embed_token_lists", "as_inputs", "POOLING_NAMES", "rerank", "rerank_tokens"]

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
    if getattr(ctx, "is_encoder", False):
        # an encoder runs the whole batch in one micro-batch (llama.cpp's encode)
        n_batch = min(n_batch, int(ctx.n_ubatch))
    n_seq = int(ctx.n_seq_max)
    pooled = int(ctx.pooling_type) != 0
    for i, toks in enumerate(inputs):
        if not toks:
            raise ValueError(f"input {i} is empty (it tokenizes to no tokens)")
        if len(toks) > n_batch:
            raise ValueError(f"input {i} is {len(toks)} tokens, more than the batch size n_batch = {n_batch} "
                             "(n_ubatch for encoders): "
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


def rerank_tokens(model, query: str, document: str) -> list:
    """The token ids of one (query, document) pair as llama-server's ``format_prompt_rerank``
    builds them: the model's ``tokenizer.chat_template.rerank`` with ``{query}`` and
    ``{document}`` replaced, tokenized with special-token parsing and no added BOS/EOS;
    without that template, [BOS] query [EOS] [SEP] document [EOS], each special token where
    the vocabulary adds it (EOS falls back to SEP when the vocabulary has none)."""
    if not isinstance(query, str) or not isinstance(document, str):
        raise TypeError("rerank_tokens: query and document must be strings")
    vocab = model.vocab
    tmpl = model.chat_template("rerank")
    if tmpl is not None:
        prompt = tmpl.replace("{query}", query).replace("{document}", document)
        return list(vocab.tokenize(prompt, add_special=False, parse_special=True))
    q = list(vocab.tokenize(query, add_special=False, parse_special=False))
    d = list(vocab.tokenize(document, add_special=False, parse_special=False))
    eos = vocab.eos if vocab.eos >= 0 else vocab.sep
    out: list = []
    if vocab.add_bos:
        out.append(vocab.bos)
    out += q
    if vocab.add_eos:
        out.append(eos)
    if vocab.add_sep:
        out.append(vocab.sep)
    out += d
    if vocab.add_eos:
        out.append(eos)
    return out


def rerank(ctx, query: str, documents: Sequence[str], *, model=None) -> list:
    """Relevance scores (float, the classifier's first output) of ``documents`` for
    ``query`` with a reranker context (``embeddings=True`` and rank pooling, which a
    reranker GGUF's pooling_type gives by default). Pairs are built by
    :func:`rerank_tokens` and packed into batches as embeddings are. ``model``: the
    pyllama Model (default ``ctx.model``)."""
    if int(ctx.pooling_type) != POOLING_NAMES["rank"]:
        raise ValueError(f"rerank needs a context with rank pooling (pooling_type 4), not {int(ctx.pooling_type)}")
    if isinstance(documents, str) or not all(isinstance(d, str) for d in documents):
        raise TypeError("rerank: documents must be a list of strings")
    m = model if model is not None else ctx.model
    toks = [rerank_tokens(m, query, d) for d in documents]
    if not toks:
        return []
    out = embed_token_lists(ctx, toks, normalize_mode=-1)
    return [float(v[0]) for v in out]
