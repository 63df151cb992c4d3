"""llama.h-style context, memory, batch, decode and output functions (see llama_api.py).

Names, argument order and return conventions follow llama.h as llama-cpp-python's
``llama_cpp`` module exposes it: failures return None / integer codes and log the reason
through the ``pyllama`` logger. A ``llama_context`` is a :class:`pyllama.context.Context`;
a ``llama_batch`` is a :class:`pyllama.batch.Batch` whose pointer fields are numpy arrays;
``llama_get_logits`` returns a float32 [n_outputs, n_vocab] numpy view.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Union

import numpy as np

from .batch import LLAMA_MAX_SEQ, LLAMA_TOKEN_NULL, Batch, batch_get_one, batch_init
from .context import (  # noqa: F401  (re-exported constants)
    LLAMA_ATTENTION_TYPE_CAUSAL,
    LLAMA_ATTENTION_TYPE_NON_CAUSAL,
    LLAMA_ATTENTION_TYPE_UNSPECIFIED,
    LLAMA_FLASH_ATTN_TYPE_AUTO,
    LLAMA_FLASH_ATTN_TYPE_DISABLED,
    LLAMA_FLASH_ATTN_TYPE_ENABLED,
    LLAMA_POOLING_TYPE_CLS,
    LLAMA_POOLING_TYPE_LAST,
    LLAMA_POOLING_TYPE_MEAN,
    LLAMA_POOLING_TYPE_NONE,
    LLAMA_POOLING_TYPE_RANK,
    LLAMA_POOLING_TYPE_UNSPECIFIED,
    LLAMA_ROPE_SCALING_TYPE_LINEAR,
    LLAMA_ROPE_SCALING_TYPE_LONGROPE,
    LLAMA_ROPE_SCALING_TYPE_NONE,
    LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED,
    LLAMA_ROPE_SCALING_TYPE_YARN,
    Context,
    ContextParams,
    PerfContextData,
)

log = logging.getLogger("pyllama")

# ggml.h's type ids (type_k / type_v take these)
GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
GGML_TYPE_Q4_0 = 2
GGML_TYPE_Q4_1 = 3
GGML_TYPE_Q5_0 = 6
GGML_TYPE_Q5_1 = 7
GGML_TYPE_Q8_0 = 8
GGML_TYPE_Q8_1 = 9
GGML_TYPE_Q2_K = 10
GGML_TYPE_Q3_K = 11
GGML_TYPE_Q4_K = 12
GGML_TYPE_Q5_K = 13
GGML_TYPE_Q6_K = 14
GGML_TYPE_Q8_K = 15
GGML_TYPE_IQ4_NL = 20
GGML_TYPE_IQ4_XS = 23
GGML_TYPE_BF16 = 30

llama_context = Context
llama_context_params = ContextParams
llama_perf_context_data = PerfContextData
llama_batch = Batch


class llama_memory_t:  # noqa: N801 (llama.h's type name)
    """llama.h's memory handle: the KV cache of one context (``llama_get_memory``)."""

    __slots__ = ("ctx",)

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def __repr__(self) -> str:
        return f"llama_memory_t({self.ctx!r})"


def _mem_ctx(mem: Union[llama_memory_t, Context]) -> Context:
    if isinstance(mem, llama_memory_t):
        return mem.ctx
    if isinstance(mem, Context):
        return mem
    raise TypeError(f"expected a llama_memory_t (from llama_get_memory), got {type(mem).__name__}")


def _ctx(ctx: Context, fn: str) -> Context:
    if not isinstance(ctx, Context):
        raise TypeError(f"{fn}: expected a llama_context, got {type(ctx).__name__}")
    return ctx


# ---------------------------------------------------------------------- params, init, free


def llama_context_default_params() -> ContextParams:
    """Default context parameters (llama.h's values; n_threads = available CPUs, capped)."""
    return ContextParams()


def llama_max_parallel_sequences() -> int:
    return LLAMA_MAX_SEQ


def llama_init_from_model(model, params: ContextParams) -> Optional[Context]:
    """Create a context: n_ctx 0 -> n_ctx_train, rounded up to a multiple of 256;
    n_batch <= n_ctx; n_ubatch <= n_batch; n_seq_max <= 256. KV cache and scratch are
    reserved now. None (with the reason logged) when the parameters or memory do not allow it.
    """
    if model is None:
        log.error("llama_init_from_model: model cannot be NULL")
        return None
    try:
        return Context(model, params)
    except Exception as e:  # llama.h reports through the log and a null context
        log.error("llama_init_from_model: failed to initialize the context: %s", e)
        return None


def llama_new_context_with_model(model, params: ContextParams) -> Optional[Context]:
    """Deprecated llama.h name of :func:`llama_init_from_model`."""
    return llama_init_from_model(model, params)


def llama_free(ctx: Context) -> None:
    """Release the context's KV cache and buffers."""
    if ctx is not None:
        _ctx(ctx, "llama_free").close()


# ---------------------------------------------------------------------- getters / setters


def llama_n_ctx(ctx: Context) -> int:
    return _ctx(ctx, "llama_n_ctx").n_ctx


def llama_n_ctx_seq(ctx: Context) -> int:
    return _ctx(ctx, "llama_n_ctx_seq").n_ctx_seq


def llama_n_batch(ctx: Context) -> int:
    return _ctx(ctx, "llama_n_batch").n_batch


def llama_n_ubatch(ctx: Context) -> int:
    return _ctx(ctx, "llama_n_ubatch").n_ubatch


def llama_n_seq_max(ctx: Context) -> int:
    return _ctx(ctx, "llama_n_seq_max").n_seq_max


def llama_get_model(ctx: Context):
    """The model object the context was created from."""
    return _ctx(ctx, "llama_get_model").model


def llama_get_memory(ctx: Context) -> llama_memory_t:
    return llama_memory_t(_ctx(ctx, "llama_get_memory"))


def llama_pooling_type(ctx: Context) -> int:
    return _ctx(ctx, "llama_pooling_type").pooling_type


def llama_set_n_threads(ctx: Context, n_threads: int, n_threads_batch: int) -> None:
    """Threads for single-token decodes and for batches (prompt processing)."""
    _ctx(ctx, "llama_set_n_threads").set_n_threads(n_threads, n_threads_batch)


def llama_n_threads(ctx: Context) -> int:
    return _ctx(ctx, "llama_n_threads").n_threads


def llama_n_threads_batch(ctx: Context) -> int:
    return _ctx(ctx, "llama_n_threads_batch").n_threads_batch


def llama_set_abort_callback(ctx: Context, abort_callback: Optional[Callable[[Any], bool]],
                             abort_callback_data: Any = None) -> None:
    """``abort_callback(abort_callback_data)`` is asked before each micro-batch of a
    decode; True stops it (llama_decode returns 2). None removes the callback."""
    c = _ctx(ctx, "llama_set_abort_callback")
    if abort_callback is None:
        c.set_abort_callback(None)
    else:
        c.set_abort_callback(lambda: bool(abort_callback(abort_callback_data)))


def llama_set_embeddings(ctx: Context, embeddings: bool) -> None:
    """Extract (final-normed) embeddings from the following decodes, or stop doing so."""
    _ctx(ctx, "llama_set_embeddings").set_embeddings(embeddings)


def llama_set_warmup(ctx: Context, warmup: bool) -> None:
    """llama.cpp's warm-up mode changes nothing pyllama computes: accepted and ignored."""
    _ctx(ctx, "llama_set_warmup")


def llama_synchronize(ctx: Context) -> None:
    """Decoding is synchronous in pyllama: nothing to wait for."""
    _ctx(ctx, "llama_synchronize")


# ---------------------------------------------------------------------- memory


def llama_memory_clear(mem: llama_memory_t, data: bool = True) -> None:
    _mem_ctx(mem).memory_clear(data)


def llama_memory_seq_rm(mem: llama_memory_t, seq_id: int, p0: int, p1: int) -> bool:
    """Remove positions [p0, p1) of ``seq_id`` (< 0: any sequence; p0 < 0: 0; p1 < 0: inf)."""
    return _mem_ctx(mem).seq_rm(seq_id, p0, p1)


def llama_memory_seq_cp(mem: llama_memory_t, seq_id_src: int, seq_id_dst: int, p0: int, p1: int) -> None:
    _mem_ctx(mem).seq_cp(seq_id_src, seq_id_dst, p0, p1)


def llama_memory_seq_keep(mem: llama_memory_t, seq_id: int) -> None:
    _mem_ctx(mem).seq_keep(seq_id)


def llama_memory_seq_add(mem: llama_memory_t, seq_id: int, p0: int, p1: int, delta: int) -> None:
    _mem_ctx(mem).seq_add(seq_id, p0, p1, delta)


def llama_memory_seq_div(mem: llama_memory_t, seq_id: int, p0: int, p1: int, d: int) -> None:
    _mem_ctx(mem).seq_div(seq_id, p0, p1, d)


def llama_memory_seq_pos_min(mem: llama_memory_t, seq_id: int) -> int:
    return _mem_ctx(mem).seq_pos_min(seq_id)


def llama_memory_seq_pos_max(mem: llama_memory_t, seq_id: int) -> int:
    return _mem_ctx(mem).seq_pos_max(seq_id)


def llama_memory_can_shift(mem: llama_memory_t) -> bool:
    """RoPE models can shift positions (seq_add/seq_div re-rope K)."""
    _mem_ctx(mem)
    return True


# ---------------------------------------------------------------------- batches


def llama_batch_get_one(tokens, n_tokens: Optional[int] = None) -> Batch:
    """A batch of ``tokens`` for sequence 0, positions continuing the cache, logits for
    the last token only. ``n_tokens`` (llama.h's second argument) may restrict it to a prefix."""
    b = batch_get_one(tokens)
    if n_tokens is not None:
        if n_tokens < 0 or n_tokens > b.n_tokens:
            raise ValueError(f"llama_batch_get_one: n_tokens = {n_tokens} outside [0, {b.n_tokens}]")
        b.n_tokens = int(n_tokens)
    return b


def llama_batch_init(n_tokens: int, embd: int, n_seq_max: int) -> Batch:
    """Room for ``n_tokens`` entries (``embd`` > 0: float32 embeddings of that width
    instead of token ids), each in up to ``n_seq_max`` sequences. ``n_tokens`` starts at 0."""
    return batch_init(n_tokens, embd, n_seq_max)


def llama_batch_free(batch: Batch) -> None:
    """Drop the batch's arrays (numpy frees them when nothing else refers to them)."""
    for name in ("token", "embd", "pos", "n_seq_id", "seq_id", "logits"):
        setattr(batch, name, None)
    batch.n_tokens = 0


# ---------------------------------------------------------------------- decode / encode


def llama_decode(ctx: Context, batch: Batch) -> int:
    """Process a batch with the decoder.

    Returns 0 on success; 1 when the KV cache has no room for the batch (nothing changed:
    free cells with llama_memory_seq_rm or use a smaller batch); 2 when the abort callback
    stopped it (the cache keeps the micro-batches finished before); -1 for an invalid batch
    (nothing changed); < -1 on a fatal error. The reason is logged.
    """
    return _ctx(ctx, "llama_decode")._decode_code(batch)


def llama_encode(ctx: Context, batch: Batch) -> int:
    """Encoder pass (encoder-decoder and non-causal embedding models). The architectures
    pyllama runs are decoder-only: this logs why and returns -1; use llama_decode (with
    ``embeddings=True`` for hidden states)."""
    c = _ctx(ctx, "llama_encode")
    arch = getattr(c._core_model, "arch", "?")
    log.error("llama_encode: %s is a decoder-only architecture with no encoder; use llama_decode", arch)
    return -1


# ---------------------------------------------------------------------- outputs


def llama_get_logits(ctx: Context) -> np.ndarray:
    """float32 [n_outputs, n_vocab] view of the last decode's logits, in batch order."""
    return _ctx(ctx, "llama_get_logits").logits


def llama_get_logits_ith(ctx: Context, i: int) -> Optional[np.ndarray]:
    """Logits row of batch entry ``i`` (mapped through the output ids); ``i < 0`` counts
    back from the last output row. None (reason logged) when that entry has no output."""
    c = _ctx(ctx, "llama_get_logits_ith")
    try:
        return c.logits_ith(i)
    except IndexError as e:
        log.error("llama_get_logits_ith: invalid logits id %d, reason: %s", i, e)
        return None


def llama_get_embeddings(ctx: Context) -> Optional[np.ndarray]:
    """float32 [n_outputs, n_embd] per-token embeddings of the last decode (None without
    ``embeddings=True``)."""
    return _ctx(ctx, "llama_get_embeddings").embeddings


def llama_get_embeddings_ith(ctx: Context, i: int) -> Optional[np.ndarray]:
    c = _ctx(ctx, "llama_get_embeddings_ith")
    try:
        return c.embeddings_ith(i)
    except IndexError as e:
        log.error("llama_get_embeddings_ith: invalid embeddings id %d, reason: %s", i, e)
        return None


def llama_get_embeddings_seq(ctx: Context, seq_id: int) -> Optional[np.ndarray]:
    """Pooled embedding of ``seq_id`` (pooling mean/cls/last), None when there is none."""
    return _ctx(ctx, "llama_get_embeddings_seq").embeddings_seq(seq_id)


# ---------------------------------------------------------------------- perf


def llama_perf_context(ctx: Context) -> PerfContextData:
    if ctx is None:
        return PerfContextData()
    return _ctx(ctx, "llama_perf_context").perf()


def llama_perf_context_print(ctx: Context) -> None:
    """Log load, prompt-eval and eval times as llama.cpp prints them (INFO level)."""
    for line in _ctx(ctx, "llama_perf_context_print").perf_text().splitlines():
        log.info("%s", line)


def llama_perf_context_reset(ctx: Context) -> None:
    _ctx(ctx, "llama_perf_context_reset").perf_reset()


__all__ = [n for n in dir() if n.startswith(("llama_", "LLAMA_", "GGML_TYPE_"))]
