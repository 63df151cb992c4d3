"""llama.h-style context, memory, batch, decode and output functions (see llama_api.py).

Names, argument order and return conventions follow llama.h as llama-cpp-python's
``llama_cpp`` module exposes it: failures return None / integer codes and log the reason
through the ``pyllama`` logger. A ``llama_context`` is a :class:`pyllama.context.Context`;
a ``llama_batch`` is a :class:`pyllama.batch.Batch` whose pointer fields are numpy arrays;
``llama_get_logits`` returns a float32 [n_outputs, n_vocab] numpy view.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Callable, Optional

import numpy as np

from . import _api_check as _chk
from ._api_check import checked, describe, int32, integer, opt_int32
from .batch import LLAMA_MAX_SEQ, LLAMA_TOKEN_NULL, Batch, batch_get_one, batch_init
from .errors import Aborted, ContextFullError, DecodeError, InvalidBatchError
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
    _core_model_of,
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


# -- argument checkers (see _api_check): each names the function and the parameter


def _usable(c: Context, fn: str, name: str) -> Context:
    if c.freed:
        raise ValueError(f"{fn}: {name} has been freed (llama_free)")
    if _chk.is_freed(c.model):
        raise ValueError(f"{fn}: the model of {name} has been freed (llama_model_free); "
                         "free the context (llama_free) before its model")
    return c


def _CTX(v: Any, fn: str, name: str) -> Context:
    """A live llama_context (not freed, nor its model)."""
    if not isinstance(v, Context):
        raise TypeError(f"{fn}: {name} must be a llama_context, got {describe(v)}")
    return _usable(v, fn, name)


def _MEM(v: Any, fn: str, name: str) -> Optional[Context]:
    """A llama_memory_t (or the context itself): the live context it belongs to. NULL (None,
    what llama_get_memory gives for a vocab-only model's context) passes: llama.cpp's memory
    functions do nothing on it and return their neutral value."""
    if v is None:
        return None
    if isinstance(v, llama_memory_t):
        v = v.ctx
    elif not isinstance(v, Context):
        raise TypeError(f"{fn}: {name} must be a llama_memory_t (from llama_get_memory), got {describe(v)}")
    return _usable(v, fn, name)


_BATCH = _chk.instance(Batch, "a llama_batch (llama_batch_get_one / llama_batch_init)")
_PARAMS = _chk.instance(ContextParams, "a llama_context_params (llama_context_default_params())")


# ---------------------------------------------------------------------- params, init, free


def llama_context_default_params() -> ContextParams:
    """Default context parameters (llama.h's values; n_threads = available CPUs, capped)."""
    return ContextParams()


def llama_max_parallel_sequences() -> int:
    return LLAMA_MAX_SEQ


def _init(model, params: ContextParams, fn: str) -> Optional[Context]:
    if model is None:
        log.error("%s: model cannot be NULL", fn)
        return None
    try:
        _core_model_of(model)
    except TypeError:
        raise TypeError(f"{fn}: model must be a llama_model (llama_model_load_from_file), "
                        f"got {describe(model)}") from None
    if _chk.is_freed(model):
        log.error("%s: model has been freed (llama_model_free)", fn)
        return None
    try:
        ctx = Context(model, params)
        if params.samplers is not None and params.n_samplers:
            from ._api_batch_ext import init_samplers

            init_samplers(ctx, params)  # llama_sampler_seq_config entries
        return ctx
    except Exception as e:  # llama.h reports through the log and a null context
        log.error("%s: failed to initialize the context: %s", fn, e)
        return None


@checked(params=_PARAMS)
def llama_init_from_model(model, params: ContextParams) -> Optional[Context]:
    """Create a context: n_ctx 0 -> n_ctx_train, rounded up to a multiple of 256;
    n_batch <= n_ctx; n_ubatch <= n_batch; n_seq_max <= 256. KV cache and scratch are
    reserved now. None (with the reason logged) when the model is NULL or freed, or the
    parameters or memory do not allow it; TypeError for what is not a model or params.
    """
    return _init(model, params, "llama_init_from_model")


@checked(params=_PARAMS)
def llama_new_context_with_model(model, params: ContextParams) -> Optional[Context]:
    """Deprecated llama.h name of :func:`llama_init_from_model`."""
    return _init(model, params, "llama_new_context_with_model")


@checked(ctx=_chk.instance(Context, "a llama_context", none_ok=True))
def llama_free(ctx: Context) -> None:
    """Release the context's KV cache and buffers. NULL and an already freed context are
    no-ops (as Python's close()); any later use of the context is a ValueError."""
    if ctx is not None:
        ctx.close()


# ---------------------------------------------------------------------- getters / setters


@checked(ctx=_CTX)
def llama_n_ctx(ctx: Context) -> int:
    return ctx.n_ctx


@checked(ctx=_CTX)
def llama_n_ctx_seq(ctx: Context) -> int:
    return ctx.n_ctx_seq


@checked(ctx=_CTX)
def llama_n_batch(ctx: Context) -> int:
    return ctx.n_batch


@checked(ctx=_CTX)
def llama_n_ubatch(ctx: Context) -> int:
    return ctx.n_ubatch


@checked(ctx=_CTX)
def llama_n_seq_max(ctx: Context) -> int:
    return ctx.n_seq_max


@checked(ctx=_CTX)
def llama_get_model(ctx: Context):
    """The model object the context was created from."""
    return ctx.model


@checked(ctx=_CTX)
def llama_get_memory(ctx: Context) -> Optional[llama_memory_t]:
    """The context's memory (KV cache); None (NULL) for the context of a vocab-only model,
    which has none, as llama.cpp."""
    return None if ctx.vocab_only else llama_memory_t(ctx)


@checked(ctx=_CTX)
def llama_pooling_type(ctx: Context) -> int:
    return ctx.pooling_type


@checked(ctx=_CTX, n_threads=integer, n_threads_batch=integer)
def llama_set_n_threads(ctx: Context, n_threads: int, n_threads_batch: int) -> None:
    """Threads for single-token decodes and for batches (prompt processing)."""
    ctx.set_n_threads(n_threads, n_threads_batch)


@checked(ctx=_CTX)
def llama_n_threads(ctx: Context) -> int:
    return ctx.n_threads


@checked(ctx=_CTX)
def llama_n_threads_batch(ctx: Context) -> int:
    return ctx.n_threads_batch


@checked(ctx=_CTX, abort_callback=_chk.callback)
def llama_set_abort_callback(ctx: Context, abort_callback: Optional[Callable[[Any], bool]],
                             abort_callback_data: Any = None) -> None:
    """``abort_callback(abort_callback_data)`` is asked before each micro-batch of a
    decode; True stops it (llama_decode returns 2). None removes the callback; anything
    else that is not callable is a TypeError."""
    if abort_callback is None:
        ctx.set_abort_callback(None)
    else:
        ctx.set_abort_callback(lambda: bool(abort_callback(abort_callback_data)))


@checked(ctx=_CTX)
def llama_set_embeddings(ctx: Context, embeddings: bool) -> None:
    """Extract (final-normed) embeddings from the following decodes, or stop doing so."""
    ctx.set_embeddings(embeddings)


@checked(ctx=_CTX)
def llama_n_rs_seq(ctx: Context) -> int:
    """Recurrent-state snapshots per sequence for rollback: the context's ``n_rs_seq``,
    clamped to 0 (as llama.cpp) for architectures without recurrent rollback (all but
    lfm2, lfm2moe, qwen35 and qwen35moe)."""
    return ctx.n_rs_seq


@checked(ctx=_CTX)
def llama_get_causal_attn(ctx: Context) -> bool:
    """True: the decoder-only models pyllama runs attend causally (non-causal attention
    is not implemented)."""
    return ctx.causal_attn


@checked(ctx=_CTX)
def llama_set_causal_attn(ctx: Context, causal_attn: bool) -> None:
    """True keeps causal attention; False is a ValueError: pyllama's attention kernels
    are causal only, so non-causal attention (bidirectional embedding models) cannot be
    switched on."""
    if not isinstance(causal_attn, (bool, int, np.bool_)):
        raise TypeError(f"llama_set_causal_attn: causal_attn must be a bool, got {describe(causal_attn)}")
    if not causal_attn:
        raise ValueError(f"llama_set_causal_attn: causal_attn = False: non-causal attention is not supported "
                         f"(pyllama's attention for {ctx.arch} is causal only)")


@checked(ctx=_CTX)
def llama_set_warmup(ctx: Context, warmup: bool) -> None:
    """llama.cpp's warm-up mode changes nothing pyllama computes: accepted and ignored."""


@checked(ctx=_CTX)
def llama_synchronize(ctx: Context) -> None:
    """Decoding is synchronous in pyllama: nothing to wait for."""


# ---------------------------------------------------------------------- memory
# seq ids, positions and deltas are int32 (llama_seq_id, llama_pos): a non-integer is a
# TypeError, a value outside int32 a ValueError naming the parameter; within int32 the
# llama.h conventions hold (seq_id < 0 in seq_rm: every sequence, p0 < 0: 0, p1 < 0: inf).


@checked(mem=_MEM)
def llama_memory_clear(mem: llama_memory_t, data: bool = True) -> None:
    if mem is None:
        return None
    mem.memory_clear(data)


@checked(mem=_MEM)
def llama_memory_seq_rm(mem: llama_memory_t, seq_id: int, p0: int, p1: int) -> bool:
    """Remove positions [p0, p1) of ``seq_id`` (< 0: any sequence; p0 < 0: 0; p1 < 0: inf).
    False (nothing changed) where impossible: a recurrent or hybrid memory refuses a range
    that cuts a state and seq_id < 0; with ``n_rs_seq`` > 0 it can drop the last
    1..n_rs_seq positions once before the next decode (docs/architectures.md)."""
    if mem is None:
        return True
    return mem.seq_rm(seq_id, p0, p1, caller="llama_memory_seq_rm")


@checked(mem=_MEM)
def llama_memory_seq_cp(mem: llama_memory_t, seq_id_src: int, seq_id_dst: int, p0: int, p1: int) -> None:
    if mem is None:
        return None
    mem.seq_cp(seq_id_src, seq_id_dst, p0, p1, caller="llama_memory_seq_cp")


@checked(mem=_MEM)
def llama_memory_seq_keep(mem: llama_memory_t, seq_id: int) -> None:
    if mem is None:
        return None
    mem.seq_keep(seq_id, caller="llama_memory_seq_keep")


@checked(mem=_MEM)
def llama_memory_seq_add(mem: llama_memory_t, seq_id: int, p0: int, p1: int, delta: int) -> None:
    if mem is None:
        return None
    mem.seq_add(seq_id, p0, p1, delta, caller="llama_memory_seq_add")


@checked(mem=_MEM)
def llama_memory_seq_div(mem: llama_memory_t, seq_id: int, p0: int, p1: int, d: int) -> None:
    if mem is None:
        return None
    mem.seq_div(seq_id, p0, p1, d, caller="llama_memory_seq_div")


@checked(mem=_MEM)
def llama_memory_seq_pos_min(mem: llama_memory_t, seq_id: int) -> int:
    if mem is None:
        return -1
    return mem.seq_pos_min(seq_id, caller="llama_memory_seq_pos_min")


@checked(mem=_MEM)
def llama_memory_seq_pos_max(mem: llama_memory_t, seq_id: int) -> int:
    if mem is None:
        return -1
    return mem.seq_pos_max(seq_id, caller="llama_memory_seq_pos_max")


@checked(mem=_MEM)
def llama_memory_can_shift(mem: llama_memory_t) -> bool:
    """Whether positions can be shifted (seq_add/seq_div re-rope the cached keys): true,
    as in llama.cpp, for RoPE models and recurrent states (only a position moves); false
    for M-RoPE models (Qwen3.5), whose seq_add/seq_div llama.cpp cannot follow with a
    decode (pyllama refuses them)."""
    if mem is None:
        return False
    return mem.memory_can_shift


# ---------------------------------------------------------------------- batches


@checked(n_tokens=opt_int32)
def llama_batch_get_one(tokens, n_tokens: Optional[int] = None) -> Batch:
    """A batch of ``tokens`` (int32 numpy array, used in place; ctypes llama_token array;
    or a sequence of ints) for sequence 0, positions continuing the cache, logits for the
    last token only. ``n_tokens`` (llama.h's second argument) may restrict it to a prefix."""
    if tokens is None or isinstance(tokens, (str, bytes, bytearray, int, float)):
        raise TypeError(f"llama_batch_get_one: tokens must be an array of token ids, got {describe(tokens)}")
    b = batch_get_one(tokens)
    if n_tokens is not None:
        if n_tokens < 0 or n_tokens > b.n_tokens:
            raise ValueError(f"llama_batch_get_one: n_tokens = {n_tokens} outside [0, len(tokens) = {b.n_tokens}]")
        b.n_tokens = n_tokens
    return b


@checked(n_tokens=int32, embd=int32, n_seq_max=int32)
def llama_batch_init(n_tokens: int, embd: int, n_seq_max: int) -> Batch:
    """Room for ``n_tokens`` entries (``embd`` > 0: float32 embeddings of that width
    instead of token ids), each in up to ``n_seq_max`` sequences. ``n_tokens`` starts at 0.
    Sizes that do not fit in memory are a MemoryError naming them."""
    try:
        return batch_init(n_tokens, embd, n_seq_max)
    except (MemoryError, ValueError) as e:
        if not isinstance(e, MemoryError) and "too big" not in str(e):  # numpy: more than it can index
            raise
        per_entry = 4 * (2 + n_seq_max) + 1 + (4 * embd if embd else 4)
        raise MemoryError(f"llama_batch_init: n_tokens = {n_tokens}, embd = {embd}, n_seq_max = {n_seq_max} "
                          f"need {n_tokens * per_entry / 2**30:.1f} GiB") from None


@checked(batch=_BATCH)
def llama_batch_free(batch: Batch) -> None:
    """Drop the batch's arrays (numpy frees them when nothing else refers to them)."""
    for name in ("token", "embd", "pos", "n_seq_id", "seq_id", "logits"):
        setattr(batch, name, None)
    batch.n_tokens = 0


# ---------------------------------------------------------------------- decode / encode


#: llama_set_sampler's samplers, context -> {seq_id: chain}: a context with any decodes
#: through _api_batch_ext.decode_and_sample, which runs them on the outputs afterwards
_SEQ_SAMPLERS: "weakref.WeakKeyDictionary[Context, dict]" = weakref.WeakKeyDictionary()


def decode_status(ctx: Context, batch: Batch) -> int:
    """``ctx.decode(batch)`` as llama_decode's return code (the context has logged the
    reason of a failure):

    ======================  =====================================================
    Context.decode          code
    ======================  =====================================================
    returns                 0
    ContextFullError        1 (no KV slot; nothing changed)
    Aborted                 2 (the cache keeps the finished micro-batches)
    InvalidBatchError       -1 (nothing changed)
    DecodeError             its ``code`` (< -1; -3: the forward pass failed)
    ======================  =====================================================

    Other exceptions (a freed context, a TypeError) propagate."""
    try:
        ctx.decode(batch)
    except ContextFullError:
        return 1
    except Aborted:
        return 2
    except InvalidBatchError:
        return -1
    except DecodeError as e:
        return e.code
    return 0


@checked(ctx=_CTX, batch=_BATCH)
def llama_decode(ctx: Context, batch: Batch) -> int:
    """Process a batch with the decoder.

    Returns 0 on success; 1 when the KV cache has no room for the batch (nothing changed:
    free cells with llama_memory_seq_rm or use a smaller batch); 2 when the abort callback
    stopped it (the cache keeps the micro-batches finished before); -1 for an invalid batch
    (nothing changed); < -1 on a fatal error. The reason is logged. What is not a
    llama_batch (or a batch whose n_tokens is not an integer) is a TypeError.
    """
    integer(batch.n_tokens, "llama_decode", "batch.n_tokens")
    if _SEQ_SAMPLERS and ctx in _SEQ_SAMPLERS:
        from ._api_batch_ext import decode_and_sample

        return decode_and_sample(ctx, batch, "llama_decode")
    return decode_status(ctx, batch)


@checked(ctx=_CTX, batch=_BATCH)
def llama_encode(ctx: Context, batch: Batch) -> int:
    """Encoder pass of an encoder model (bert, nomic-bert, jina-bert-v2, ...): every token
    is an output (hidden states with ``embeddings=True``, pooled per sequence by the
    context's pooling), no KV cache, the whole batch in one micro-batch (n_tokens <=
    n_ubatch, else -1). Returns 0, -1 for an invalid batch, < -1 on a fatal error.
    A decoder-only model has no encoder: the reason is logged and -1 returned (llama.cpp
    cannot encode with those either)."""
    integer(batch.n_tokens, "llama_encode", "batch.n_tokens")
    if ctx.vocab_only or not ctx.is_encoder:
        log.error("llama_encode: %s is a decoder-only architecture with no encoder; use llama_decode", ctx.arch)
        return -1
    return decode_status(ctx, batch)


# ---------------------------------------------------------------------- outputs


@checked(ctx=_CTX)
def llama_get_logits(ctx: Context) -> np.ndarray:
    """float32 [n_outputs, n_vocab] view of the last decode's logits, in batch order."""
    return ctx.logits


@checked(ctx=_CTX, i=int32)
def llama_get_logits_ith(ctx: Context, i: int) -> Optional[np.ndarray]:
    """Logits row of batch entry ``i`` (mapped through the output ids); ``i < 0`` counts
    back from the last output row. None (reason logged) when that entry has no output."""
    try:
        return ctx.logits_ith(i)
    except IndexError as e:
        log.error("llama_get_logits_ith: invalid logits id %d, reason: %s", i, e)
        return None


@checked(ctx=_CTX)
def llama_get_embeddings(ctx: Context) -> Optional[np.ndarray]:
    """float32 [n_outputs, n_embd] per-token embeddings of the last decode (None without
    ``embeddings=True``)."""
    return ctx.embeddings


@checked(ctx=_CTX, i=int32)
def llama_get_embeddings_ith(ctx: Context, i: int) -> Optional[np.ndarray]:
    try:
        return ctx.embeddings_ith(i)
    except IndexError as e:
        log.error("llama_get_embeddings_ith: invalid embeddings id %d, reason: %s", i, e)
        return None


@checked(ctx=_CTX, seq_id=int32)
def llama_get_embeddings_seq(ctx: Context, seq_id: int) -> Optional[np.ndarray]:
    """Pooled embedding of ``seq_id`` (pooling mean/cls/last), None when there is none."""
    return ctx.embeddings_seq(seq_id)


# ---------------------------------------------------------------------- perf


def llama_perf_context(ctx: Context) -> PerfContextData:
    """The context's timings; zeros for NULL (as llama.cpp)."""
    if ctx is None:
        return PerfContextData()
    return _CTX(ctx, "llama_perf_context", "ctx").perf()


@checked(ctx=_CTX)
def llama_perf_context_print(ctx: Context) -> None:
    """Log load, prompt-eval and eval times as llama.cpp prints them (INFO level)."""
    for line in ctx.perf_text().splitlines():
        log.info("%s", line)


@checked(ctx=_CTX)
def llama_perf_context_reset(ctx: Context) -> None:
    ctx.perf_reset()


__all__ = [n for n in dir() if n.startswith(("llama_", "LLAMA_", "GGML_TYPE_"))]
