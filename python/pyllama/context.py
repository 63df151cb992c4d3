"""The inference context (pipeline steps 7 and 10-14): parameters, KV cache, decode, outputs.

:class:`Context` owns a Rust ``_core.Context`` (KV cache, scratch, threads, the forward
pass) and everything around it that llama.cpp's ``llama_context`` does in C++: resolving
the context parameters, running the batch allocator (:mod:`pyllama.batch`), splitting
into micro-batches, the output buffers (logits [n_outputs, n_vocab], embeddings) with the
batch-index -> output-row map, pooled sequence embeddings and the perf counters.

One coarse call into Rust per ``decode``: Python hands over the whole validated batch and
its micro-batch split; Rust reserves KV cells for every micro-batch before computing any
and writes the logits straight into this object's numpy buffer.

Rust reports what a decode did as a typed outcome (``_core.DecodeOutcome``: ok, no slot,
aborted after n_done micro-batches, invalid batch; a fatal error is an exception);
:meth:`Context.decode` raises :class:`~pyllama.errors.InvalidBatchError`,
:class:`~pyllama.errors.ContextFullError`, :class:`~pyllama.errors.Aborted` or
:class:`~pyllama.errors.DecodeError` from it, and the llama.h-style functions in
:mod:`pyllama._api_context` turn those exceptions into llama.h's return codes, using only
this class's public methods.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from . import _core
from .batch import (
    LLAMA_MAX_SEQ,
    AllocatedBatch,
    Batch,
    allocate,
    batch_get_one,
    split_equal,
    split_seq,
    split_simple,
)
from ._api_check import describe as _describe, int32 as _int32, integer as _integer
from .errors import Aborted, ContextFullError, DecodeError, InvalidBatchError

log = logging.getLogger("pyllama")

# enum values exactly as llama.h / llama_cpp define them
LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED = -1
LLAMA_ROPE_SCALING_TYPE_NONE = 0
LLAMA_ROPE_SCALING_TYPE_LINEAR = 1
LLAMA_ROPE_SCALING_TYPE_YARN = 2
LLAMA_ROPE_SCALING_TYPE_LONGROPE = 3

LLAMA_POOLING_TYPE_UNSPECIFIED = -1
LLAMA_POOLING_TYPE_NONE = 0
LLAMA_POOLING_TYPE_MEAN = 1
LLAMA_POOLING_TYPE_CLS = 2
LLAMA_POOLING_TYPE_LAST = 3
LLAMA_POOLING_TYPE_RANK = 4

LLAMA_ATTENTION_TYPE_UNSPECIFIED = -1
LLAMA_ATTENTION_TYPE_CAUSAL = 0
LLAMA_ATTENTION_TYPE_NON_CAUSAL = 1

LLAMA_FLASH_ATTN_TYPE_AUTO = -1
LLAMA_FLASH_ATTN_TYPE_DISABLED = 0
LLAMA_FLASH_ATTN_TYPE_ENABLED = 1

LLAMA_CONTEXT_TYPE_DEFAULT = 0

# ggml.h's type ids for the K/V cache types (the names are what _core.Context takes)
GGML_TYPE_NAMES = {
    0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0",
    20: "iq4_nl", 30: "bf16",
}
GGML_DEFAULT_N_THREADS = 4

_POOLING_NAMES = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}


def default_n_threads() -> int:
    """CPUs this process may run on, capped at 8: token generation is memory-bound and
    more threads than that only add synchronisation cost on typical machines."""
    try:
        n = len(os.sched_getaffinity(0))  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        n = os.cpu_count() or GGML_DEFAULT_N_THREADS
    return max(1, min(n, 8))


GGML_MAX_N_THREADS = 512  # ggml's limit on a compute thread pool


def _clamp_threads(n: int, name: str) -> int:
    """``n`` capped at GGML_MAX_N_THREADS, with a warning when it was more: 100,000
    threads would make each token take seconds, and llama.cpp cannot start more either."""
    if n > GGML_MAX_N_THREADS:
        import warnings

        warnings.warn(f"{name} = {n} is more than the maximum of {GGML_MAX_N_THREADS} threads; "
                      f"using {GGML_MAX_N_THREADS}", RuntimeWarning, stacklevel=3)
        return GGML_MAX_N_THREADS
    return n


def _time_us() -> int:
    return time.perf_counter_ns() // 1000


@dataclass
class ContextParams:
    """llama.h's ``llama_context_params``: the same fields, order and defaults
    (``llama_context_default_params()``), except ``n_threads``/``n_threads_batch`` which
    default to the CPUs available (capped) instead of a fixed 4.

    Fields pyllama accepts but does not act on (GPU/offload, MTP, cb_eval) are kept for
    source compatibility. ``samplers`` / ``n_samplers`` (llama_sampler_seq_config) are
    attached by ``llama_init_from_model`` and run by ``llama_decode`` / ``llama_process``
    (pyllama._api_batch_ext). ``abort_callback(abort_callback_data) -> bool`` is a
    Python callable.
    """

    n_ctx: int = 512
    n_batch: int = 2048
    n_ubatch: int = 512
    n_seq_max: int = 1
    n_rs_seq: int = 0
    n_outputs_max: int = 0
    n_outputs_max_per_seq: int = 1
    n_threads: int = field(default_factory=default_n_threads)
    n_threads_batch: int = field(default_factory=default_n_threads)
    ctx_type: int = LLAMA_CONTEXT_TYPE_DEFAULT
    rope_scaling_type: int = LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED
    pooling_type: int = LLAMA_POOLING_TYPE_UNSPECIFIED
    attention_type: int = LLAMA_ATTENTION_TYPE_UNSPECIFIED
    flash_attn_type: int = LLAMA_FLASH_ATTN_TYPE_AUTO
    rope_freq_base: float = 0.0
    rope_freq_scale: float = 0.0
    yarn_ext_factor: float = -1.0
    yarn_attn_factor: float = -1.0
    yarn_beta_fast: float = -1.0
    yarn_beta_slow: float = -1.0
    yarn_orig_ctx: int = 0
    defrag_thold: float = -1.0
    cb_eval: Any = None
    cb_eval_user_data: Any = None
    type_k: int = 1  # GGML_TYPE_F16
    type_v: int = 1
    abort_callback: Optional[Callable[[Any], bool]] = None
    abort_callback_data: Any = None
    embeddings: bool = False
    offload_kqv: bool = True
    no_perf: bool = True
    op_offload: bool = True
    swa_full: bool = True
    kv_unified: bool = False
    samplers: Any = None
    n_samplers: int = 0
    ctx_other: Any = None


@dataclass
class PerfContextData:
    """llama.h's ``llama_perf_context_data`` (times in ms; counts are at least 1, as there)."""

    t_start_ms: float = 0.0
    t_load_ms: float = 0.0
    t_p_eval_ms: float = 0.0
    t_eval_ms: float = 0.0
    n_p_eval: int = 0
    n_eval: int = 0
    n_reused: int = 0


def _serialized(method):
    """Run ``method`` under the context's lock: one KV cache, one caller at a time (decode
    releases the GIL while it computes, so another thread could otherwise reach the
    cache mid-batch)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


def _core_model_of(model) -> "_core.Model":
    """The ``_core.Model`` behind whatever model object the caller holds (the Rust class
    itself, or the Python ``Model`` wrapper that keeps one)."""
    if isinstance(model, _core.Model):
        return model
    for name in ("_core", "_core_model", "_model", "core", "inner"):
        inner = getattr(model, name, None)
        if isinstance(inner, _core.Model):
            return inner
    raise TypeError(f"Context: model: expected a pyllama model (pyllama.Model, from Model.load or "
                    f"llama_model_load_from_file), got {_describe(model)}")


def _n_vocab_of(hparams: dict) -> int:
    """Logits width: the output matrix's rows, which is what the forward pass writes and
    what llama.cpp's vocab.n_tokens() equals for every well-formed model."""
    return int(hparams["n_vocab"])


# llama.cpp's llm_arch_supports_rs_rollback, of the architectures pyllama runs
_RS_ROLLBACK_ARCHS = ("lfm2", "lfm2moe", "qwen35", "qwen35moe")

_INT_PARAMS = ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_rs_seq", "n_threads", "n_threads_batch",
               "rope_scaling_type", "attention_type", "flash_attn_type", "yarn_orig_ctx")
_FLOAT_PARAMS = ("rope_freq_base", "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor",
                 "yarn_beta_fast", "yarn_beta_slow", "defrag_thold")


def _check_param_types(p: "ContextParams") -> None:
    """The kinds of the parameters the context reads: integers (no floats or strings,
    which int() would quietly truncate or parse), numbers, and int-or-name for the cache
    types and pooling. TypeError naming the parameter; the values are checked later."""
    for name in _INT_PARAMS:
        _integer(getattr(p, name), "Context", name)
    for name in _FLOAT_PARAMS:
        v = getattr(p, name)
        if isinstance(v, (bool, str, bytes)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"Context: {name} must be a number, got {_describe(v)}")
    for name in ("rope_freq_base", "rope_freq_scale"):  # 0: the model's value; NaN or < 0 poison every logit
        v = float(getattr(p, name))
        if not (0.0 <= v < float("inf")):
            raise ValueError(f"Context: {name} = {v} must be finite and >= 0 (0: the model's own)")
    for name in ("type_k", "type_v", "pooling_type"):
        v = getattr(p, name)
        if not isinstance(v, str):
            _integer(v, "Context", name)


def _type_name(t: Union[int, str], what: str) -> str:
    if isinstance(t, str):
        return t.lower()
    name = GGML_TYPE_NAMES.get(int(t))
    if name is None:
        raise ValueError(f"{what} = {t} is not a supported KV cache type "
                         f"(supported: {', '.join(sorted(GGML_TYPE_NAMES.values()))})")
    return name


#: llama.cpp's quantized -ctk/-ctv types (ggml_is_quantized): a V cache of one of these
#: needs flash attention.
QUANTIZED_KV_TYPES = frozenset({"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"})


_ENCODER_FA_WARNED = False


def _warn_encoder_fa() -> None:
    """flash_attn_type enabled on an encoder: said once per process (encoders attend in f32,
    as llama.cpp with flash attention off; its flash kernel casts K and V to f16)."""
    global _ENCODER_FA_WARNED
    if not _ENCODER_FA_WARNED:
        _ENCODER_FA_WARNED = True
        log.warning("flash_attn_type = enabled: pyllama's encoders (bert, ...) attend in f32 without flash "
                    "attention (llama.cpp's -fa off); their embeddings are those of -fa off")


def _resolve_flash_attn(flash_attn_type: int, type_v: str) -> bool:
    """llama_init_from_model's flash-attention rules on the CPU: auto resolves to enabled
    (the CPU backend runs FLASH_ATTN_EXT); a quantized V cache needs it, so with auto it
    is enabled and with disabled the context is refused (llama.cpp: "quantized V cache
    requires flash_attn to be enabled"). Any other value counts as enabled, as there."""
    if type_v in QUANTIZED_KV_TYPES and flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED:
        raise ValueError(f"quantized V cache (type_v = {type_v}, -ctv {type_v}) requires flash attention: "
                         "flash_attn_type must be enabled or auto (-fa on / auto), not disabled (-fa off)")
    if type_v in QUANTIZED_KV_TYPES and flash_attn_type == LLAMA_FLASH_ATTN_TYPE_AUTO:
        log.info("llama_init_from_model: enabling flash_attn since it is required for quantized V cache")
    return flash_attn_type != LLAMA_FLASH_ATTN_TYPE_DISABLED


class Context:
    """An inference session on a model: KV cache for up to ``n_seq_max`` sequences,
    ``decode`` and its outputs.

    >>> ctx = Context(model, n_ctx=2048)
    >>> ctx.decode([1, 2, 3])            # positions 0..2 of sequence 0, logits for the last
    >>> ctx.logits.shape                 # (1, n_vocab)
    >>> ctx.decode([4])                  # position 3
    >>> ctx.logits_ith(-1)               # the last output row

    Keyword arguments are :class:`ContextParams` fields (``n_ctx``, ``n_batch``,
    ``n_ubatch``, ``n_seq_max``, ``n_threads``, ``type_k`` ("f16", "q8_0", ... or a
    GGML_TYPE id), ``embeddings``, ``pooling_type`` ("mean" or an id), ``kv_unified``,
    ...). ``abort_callback`` here takes no argument. Invalid parameters raise ValueError.
    """

    def __init__(self, model, params: Optional[ContextParams] = None, **kwargs) -> None:
        if params is not None and not isinstance(params, ContextParams):
            raise TypeError(f"Context: params must be a ContextParams (llama_context_default_params()), "
                            f"got {_describe(params)}")
        p = ContextParams() if params is None else ContextParams(**{f.name: getattr(params, f.name) for f in fields(ContextParams)})
        abort = kwargs.pop("abort_callback", None)
        names = {f.name for f in fields(ContextParams)}
        for k, v in kwargs.items():
            if k not in names:
                raise TypeError(f"Context() got an unexpected keyword argument '{k}'")
            setattr(p, k, v)
        if isinstance(p.pooling_type, str):
            if p.pooling_type.lower() not in _POOLING_NAMES:
                raise ValueError(f"pooling_type = {p.pooling_type!r}: expected one of {sorted(_POOLING_NAMES)}")
            p.pooling_type = _POOLING_NAMES[p.pooling_type.lower()]
        _check_param_types(p)
        if p.abort_callback is not None and not callable(p.abort_callback):
            raise TypeError(f"Context: abort_callback must be callable or None, got {_describe(p.abort_callback)}")
        self._core = None
        self._freed = False
        self._vocab_only = False
        self._lock = threading.RLock()
        self._init(model, p)
        if abort is not None:
            self.set_abort_callback(abort)

    # ------------------------------------------------------------------ construction

    def _init(self, model, params: ContextParams) -> None:
        """Resolve parameters the way ``llama_context::llama_context`` does, then reserve
        everything (KV cache, scratch) in Rust."""
        t0 = _time_us()
        core_model = _core_model_of(model)
        hp = core_model.hparams()
        self.model = model
        self._core_model = core_model
        self.params = params

        if params.n_batch == 0 and params.n_ubatch == 0:
            raise ValueError("n_batch and n_ubatch cannot both be zero")
        n_ctx_train = int(hp["n_ctx_train"])
        if params.n_ctx == 0 and n_ctx_train == 0:
            raise ValueError("n_ctx and the model's n_ctx_train cannot both be zero")
        for name in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_rs_seq", "n_threads", "n_threads_batch"):
            if int(getattr(params, name)) < 0:
                raise ValueError(f"{name} = {getattr(params, name)} must be >= 0")
        n_seq_max = max(1, int(params.n_seq_max))
        if n_seq_max > LLAMA_MAX_SEQ:
            raise ValueError(f"n_seq_max must be <= {LLAMA_MAX_SEQ} (got {n_seq_max})")
        # encoders (bert, ...) write {arch}.attention.causal = false; llama.cpp encodes
        # them without a KV cache, the whole batch in one micro-batch
        causal = bool(hp.get("causal_attn", True))
        if params.attention_type == LLAMA_ATTENTION_TYPE_NON_CAUSAL and causal:
            raise ValueError(f"non-causal attention is not supported for the decoder-only {core_model.arch}")
        if params.attention_type == LLAMA_ATTENTION_TYPE_CAUSAL and not causal:
            raise ValueError(f"causal attention is not supported for the encoder {core_model.arch}")
        pooling = params.pooling_type
        if pooling == LLAMA_POOLING_TYPE_UNSPECIFIED:
            pooling = int(hp.get("pooling_type", LLAMA_POOLING_TYPE_NONE))  # {arch}.pooling_type
        if pooling not in (LLAMA_POOLING_TYPE_NONE, LLAMA_POOLING_TYPE_MEAN,
                           LLAMA_POOLING_TYPE_CLS, LLAMA_POOLING_TYPE_LAST, LLAMA_POOLING_TYPE_RANK):
            raise ValueError(f"pooling_type = {params.pooling_type} is not supported "
                             "(none, mean, cls, last and rank are)")
        if pooling == LLAMA_POOLING_TYPE_RANK and causal and core_model.arch != "qwen3":
            raise ValueError(f"pooling_type = rank needs a reranker with a classifier head; "
                             f"{core_model.arch} rerankers are not supported (qwen3's are)")
        rope_freq_scale = float(params.rope_freq_scale)
        if params.rope_scaling_type == LLAMA_ROPE_SCALING_TYPE_NONE:
            rope_freq_scale = 1.0  # llama.cpp: never scale if the scaling type is none
        elif params.rope_scaling_type in (LLAMA_ROPE_SCALING_TYPE_YARN, LLAMA_ROPE_SCALING_TYPE_LONGROPE):
            raise ValueError(f"rope_scaling_type = {params.rope_scaling_type} (YaRN/LongRoPE) "
                             "overrides are not supported")
        if (params.yarn_ext_factor >= 0 or params.yarn_attn_factor >= 0 or params.yarn_beta_fast >= 0
                or params.yarn_beta_slow >= 0 or params.yarn_orig_ctx != 0):
            log.warning("llama_init_from_model: yarn_* overrides are not supported and are ignored")
        # llama.cpp keeps n_rs_seq recurrent-state snapshots per sequence (seq_rm can then
        # remove the last n_rs_seq positions) for the architectures whose graphs write them
        # (lfm2, lfm2moe, qwen35, qwen35moe), and clamps the request to 0 for the others
        n_rs_seq = int(params.n_rs_seq)
        if n_rs_seq > 0 and core_model.arch not in _RS_ROLLBACK_ARCHS:
            log.debug("llama_init_from_model: n_rs_seq = %d requested but %s does not support recurrent partial "
                      "rollback; clamping to 0", n_rs_seq, core_model.arch)
            n_rs_seq = 0
        type_k = _type_name(params.type_k, "type_k")
        type_v = _type_name(params.type_v, "type_v")
        flash_attn = _resolve_flash_attn(int(params.flash_attn_type), type_v)
        if not causal and int(params.flash_attn_type) == LLAMA_FLASH_ATTN_TYPE_ENABLED:
            _warn_encoder_fa()

        n_ctx = int(params.n_ctx) if params.n_ctx else n_ctx_train
        # with causal attention the batch size is limited by the context size
        n_batch = min(n_ctx, int(params.n_batch)) if causal else int(params.n_batch)
        n_ubatch = min(n_batch, int(params.n_ubatch) if params.n_ubatch else int(params.n_batch))
        if n_rs_seq > 0 and n_ubatch <= n_rs_seq + 1:
            # llama.cpp's split keeps a sequence's last n_rs_seq + 1 tokens in one micro-batch
            # and asserts n_ubatch > n_rs_seq + 1 (an abort at the first decode)
            raise ValueError(f"n_rs_seq = {n_rs_seq} needs n_ubatch > n_rs_seq + 1 (n_ubatch is {n_ubatch}): "
                             "the last n_rs_seq + 1 tokens of a sequence stay in one micro-batch")
        n_ctx = -(-n_ctx // 256) * 256
        kv_unified = bool(params.kv_unified)
        if kv_unified:
            n_ctx_seq = n_ctx
        else:
            n_ctx_seq = -(-(n_ctx // n_seq_max) // 256) * 256
            if n_ctx_seq == 0:
                raise ValueError("n_ctx_seq == 0")
            if n_ctx != n_ctx_seq * n_seq_max:
                n_ctx = n_ctx_seq * n_seq_max
                log.warning("llama_context: n_ctx is not divisible by n_seq_max - rounding to %d", n_ctx)
        n_threads = _clamp_threads(int(params.n_threads) or default_n_threads(), "n_threads")
        n_threads_batch = _clamp_threads(int(params.n_threads_batch) or n_threads, "n_threads_batch")

        self._n_ctx_seq = n_ctx_seq
        self._flash_attn = flash_attn
        self._n_batch = n_batch
        self._n_threads = n_threads
        self._n_threads_batch = n_threads_batch
        self._kv_unified = kv_unified
        self._pooling = pooling
        self._pooling_cls = int(hp.get("pooling_type_cls", 0))
        self._embeddings = bool(params.embeddings)
        self._causal = causal
        self.n_vocab = _n_vocab_of(hp)
        self.n_embd = int(hp["n_embd"])

        log.info("llama_context: n_seq_max = %d, n_ctx = %d, n_ctx_seq = %d, n_batch = %d, n_ubatch = %d, "
                 "kv_unified = %s, type_k = %s, type_v = %s", n_seq_max, n_ctx, n_ctx_seq, n_batch,
                 n_ubatch, kv_unified, type_k, type_v)
        if n_ctx_seq > n_ctx_train:
            log.warning("llama_context: n_ctx_seq (%d) > n_ctx_train (%d) -- possible training context overflow",
                        n_ctx_seq, n_ctx_train)

        if core_model.vocab_only:
            # llama.cpp makes such a context too: no backends, no memory (KV cache), nothing
            # to decode with; its parameters are there and the vocabulary is usable
            self._vocab_only = True
            self._vocab_only_dims = (n_ctx, n_ubatch, n_seq_max)
            log.info("llama_context: the model is vocab-only: no KV cache, this context cannot decode")
        else:
            self._core = _core.Context(
                core_model, n_ctx=n_ctx, n_seq_max=n_seq_max, n_ubatch=n_ubatch, n_threads=n_threads,
                n_threads_batch=n_threads_batch, n_rs_seq=n_rs_seq, type_k=type_k, type_v=type_v, kv_unified=kv_unified,
                swa_full=bool(params.swa_full), embeddings=self._embeddings,
                rope_freq_base=float(params.rope_freq_base), rope_freq_scale=rope_freq_scale, flash_attn=flash_attn,
                offload_kqv=bool(params.offload_kqv))
        # "kv", "recurrent" or "hybrid" (llama.cpp's llama_kv_cache / _memory_recurrent /
        # _memory_hybrid): decides how batches are split into micro-batches
        self._memory_kind = "kv" if self._core is None else str(self._core.memory_kind)
        # M-RoPE models (Qwen3.5; the only ones whose cache cannot shift positions) take
        # llama.cpp's M-RoPE position rule for batches
        self._mrope = self._core is not None and not bool(self._core.can_shift)

        # outputs of the last successful decode. llama.cpp keeps room for at least
        # n_seq_max rows and grows the buffer when a batch asks for more.
        self._logits_buf = np.zeros((n_seq_max, self.n_vocab), dtype=np.float32)
        self._embd_buf = np.zeros((n_seq_max, self.n_embd), dtype=np.float32) if self._embeddings else None
        self._n_outputs = 0
        self._output_ids = np.full(n_batch, -1, dtype=np.int32)  # batch index -> output row
        self._embd_seq: dict = {}

        self._abort: Optional[Callable[[], bool]] = None
        if params.abort_callback is not None:
            cb, data = params.abort_callback, params.abort_callback_data
            self._abort = lambda: bool(cb(data))

        # perf (llama.cpp: t_start/t_load come from the model; the load time is refined on
        # the first evaluation)
        self._no_perf = bool(params.no_perf)
        self._t_start_us = int(getattr(model, "t_start_us", t0))
        self._t_load_us = int(getattr(model, "t_load_us", _time_us() - t0))
        self._has_evaluated_once = False
        self._t_p_eval_us = 0
        self._t_eval_us = 0
        self._n_p_eval = 0
        self._n_eval = 0

    # ------------------------------------------------------------------ getters

    def _live(self) -> "_core.Context":
        if self._core is None:
            if self._vocab_only and not self._freed:
                raise ValueError("this context belongs to a vocab-only model (loaded with vocab_only=True): it has "
                                 "no weights and no KV cache, so it cannot decode or hold state")
            raise ValueError("this context has been freed")
        return self._core

    @property
    def freed(self) -> bool:
        """Whether :meth:`close` (``llama_free``) has released this context."""
        return self._freed

    @property
    def vocab_only(self) -> bool:
        """Whether this is the empty context of a vocab-only model (no KV cache, no decode)."""
        return self._vocab_only

    @property
    def n_ctx(self) -> int:
        if self._vocab_only:
            return self._vocab_only_dims[0]
        return int(self._live().n_ctx)

    @property
    def n_ctx_seq(self) -> int:
        return self._n_ctx_seq

    @property
    def n_batch(self) -> int:
        return self._n_batch

    @property
    def n_ubatch(self) -> int:
        if self._vocab_only:
            return self._vocab_only_dims[1]
        return int(self._live().n_ubatch)

    @property
    def n_seq_max(self) -> int:
        if self._vocab_only:
            return self._vocab_only_dims[2]
        return int(self._live().n_seq_max)

    @property
    def n_rs_seq(self) -> int:
        """Recurrent-state rollback snapshots per sequence (llama.cpp's ``n_rs_seq``): 0 unless
        requested, and 0 for models without them (the request is clamped)."""
        if self._vocab_only:
            return 0
        return int(self._live().n_rs_seq)

    @property
    def n_threads(self) -> int:
        return self._n_threads

    @property
    def n_threads_batch(self) -> int:
        return self._n_threads_batch

    @property
    def n_parallel_regions(self) -> int:
        """Parallel regions (one fork/join of the thread pool each) run since the context was
        made or its thread counts were set; benchmarks/bandwidth.py divides by tokens to price
        the pool's per-region cost against a token's time."""
        return int(self._core.pool_regions)

    @property
    def pooling_type(self) -> int:
        return self._pooling

    @property
    def kv_unified(self) -> bool:
        return self._kv_unified

    @property
    def memory_kind(self) -> str:
        """What the context's memory is: "kv" (a KV cache), "recurrent" (a state per
        sequence: mamba2) or "hybrid" (both: lfm2, qwen35, falcon-h1, ...)."""
        return self._memory_kind

    @property
    def memory_can_shift(self) -> bool:
        """Whether cached cells can move to other positions (``seq_add`` / ``seq_div``
        re-rope K, a recurrent state moves its position): llama_memory_can_shift. False
        for the M-RoPE models (qwen35, qwen35moe), as llama.cpp."""
        return self._core is None or bool(self._core.can_shift)

    @property
    def flash_attn(self) -> bool:
        """Whether flash attention is on, as llama.cpp resolves ``flash_attn_type`` (auto:
        on, as on llama.cpp's CPU backend). pyllama's attention reproduces llama.cpp's
        flash-attention kernel in both cases."""
        return self._flash_attn

    @_serialized
    def set_n_threads(self, n_threads: int, n_threads_batch: int) -> None:
        n_threads = _integer(n_threads, "Context.set_n_threads", "n_threads")
        n_threads_batch = _integer(n_threads_batch, "Context.set_n_threads", "n_threads_batch")
        if n_threads < 1 or n_threads_batch < 1:
            raise ValueError(f"n_threads = {n_threads}, n_threads_batch = {n_threads_batch}: both must be >= 1")
        n_threads = _clamp_threads(int(n_threads), "n_threads")
        n_threads_batch = _clamp_threads(int(n_threads_batch), "n_threads_batch")
        self._live().set_n_threads(n_threads, n_threads_batch)
        self._n_threads, self._n_threads_batch = n_threads, n_threads_batch

    @property
    def lock(self) -> "threading.RLock":
        """The re-entrant lock every cache operation and decode takes. Threads sharing a
        context hold it around a decode and the reading of its outputs."""
        return self._lock

    @property
    def embeddings_enabled(self) -> bool:
        return self._embeddings

    @_serialized
    def set_embeddings(self, embeddings: bool) -> None:
        """Turn hidden-state extraction on or off for the following decodes (as llama.cpp's
        ``llama_set_embeddings``; with it on, every token of a batch is an output)."""
        self._live()
        self._embeddings = bool(embeddings)
        if self._embeddings and self._embd_buf is None:
            self._embd_buf = np.zeros((max(self._logits_buf.shape[0], 1), self.n_embd), dtype=np.float32)

    def set_abort_callback(self, callback: Optional[Callable[[], bool]]) -> None:
        """``callback()`` is asked before each micro-batch; True stops ``decode`` (the cache
        keeps the micro-batches already finished)."""
        if callback is not None and not callable(callback):
            raise TypeError(f"Context.set_abort_callback: callback must be callable or None, got {_describe(callback)}")
        self._abort = callback

    # ------------------------------------------------------------------ adapters

    @_serialized
    def set_lora_adapters(self, adapters) -> None:
        """Apply LoRA adapters to the following decodes (``llama_set_adapters_lora``):
        ``[(LoraAdapter, scale), ...]`` (a bare adapter means scale 1.0; a dict
        adapter -> scale works too). Each adapted weight W computes
        ``W x + sum of scale * alpha / rank * B (A x)`` (``scale`` as is when the adapter
        has no alpha); zero scales are dropped; ``[]`` or None removes every adapter and
        gives the plain model's logits exactly. The KV cache is kept as is (as llama.cpp).
        Raises TypeError / ValueError for a bad list or an adapter loaded for another
        model; the adapters set before stay then."""
        from .adapter import _lora_list

        items = _lora_list(adapters, "Context.set_lora_adapters")
        core = self._live()
        for a, _ in items:
            if a._core.model is not self._core_model:
                raise ValueError(f"Context.set_lora_adapters: adapter {a.path} was loaded for another model "
                                 f"({a._core.model.paths[0]}), not this context's ({self._core_model.paths[0]})")
        items = [(a, s) for a, s in items if s != 0.0]
        core.set_loras([(a._core, s) for a, s in items])
        self._loras = items

    @property
    def lora_adapters(self) -> list:
        """The adapters set, as [(LoraAdapter, scale), ...] (zero scales dropped)."""
        return list(getattr(self, "_loras", []))

    @_serialized
    def set_control_vector(self, cvec, *, layer_start: int = 1, layer_end: Optional[int] = None) -> None:
        """Add a :class:`~pyllama.adapter.ControlVector`'s direction for layer il to the
        output of every layer il in [layer_start, layer_end] (both inclusive; layer_end None
        = the last layer; layer 0 never has one), as llama.cpp's ``--control-vector`` with
        ``--control-vector-layer-range``. None removes it. Raises ValueError when the
        vector's n_embd is not the model's (nothing changes then)."""
        from .adapter import ControlVector

        if cvec is None:
            self.set_cvec(None, 0, -1, -1)
            return
        if not isinstance(cvec, ControlVector):
            raise TypeError(f"Context.set_control_vector: expected a ControlVector (ControlVector.load(...)) or "
                            f"None, got {_describe(cvec)}")
        n_layer = int(self._core_model.hparams()["n_layer"])
        start = _int32(layer_start, "Context.set_control_vector", "layer_start")
        end = n_layer if layer_end is None else _int32(layer_end, "Context.set_control_vector", "layer_end")
        self.set_cvec(cvec.data, cvec.n_embd, start, end)

    @_serialized
    def set_cvec(self, data, n_embd: int, il_start: int, il_end: int) -> None:
        """``llama_set_adapter_cvec``: ``data`` float32 [k * n_embd] holds the directions of
        layers 1..k (None disables the control vector); applied to layers il_start..il_end.
        Raises ValueError on a wrong n_embd (the context is unchanged)."""
        fn = "Context.set_cvec"
        n_embd = _int32(n_embd, fn, "n_embd")
        il_start = _int32(il_start, fn, "il_start")
        il_end = _int32(il_end, fn, "il_end")
        arr = None if data is None else np.ascontiguousarray(data, dtype=np.float32).ravel()
        self._live().set_cvec(arr, n_embd, il_start, il_end)

    @_serialized
    def close(self) -> None:
        """Release the KV cache and scratch now (``llama_free``); the object is unusable after."""
        self._core = None
        self._freed = True
        self._logits_buf = np.zeros((0, self.n_vocab), dtype=np.float32)
        self._embd_buf = None
        self._n_outputs = 0

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ memory (KV cache)

    # Sequence ids, positions and deltas are llama.h's int32 llama_seq_id / llama_pos: a
    # non-integer is a TypeError and a value outside int32 a ValueError, naming the
    # parameter. Within int32, llama.h's conventions hold (seq_id < 0 in seq_rm: every
    # sequence; p0 < 0: 0; p1 < 0: infinity). Messages start with ``caller``: the method's
    # own name by default, a wrapper's (llama_memory_seq_rm, ...) when it passes one.

    def _check_seq(self, seq_id: int, fn: str, name: str = "seq_id", allow_any: bool = False) -> int:
        s = _int32(seq_id, fn, name)
        if allow_any and s < 0:
            return -1
        if s < 0 or s >= self.n_seq_max:
            raise ValueError(f"{fn}: {name} = {s} is outside [0, n_seq_max = {self.n_seq_max})")
        return s

    @_serialized
    def memory_clear(self, data: bool = True) -> None:
        """Empty the cache (all sequences). ``data`` also zeroes the stored K/V."""
        self._live().memory_clear(bool(data))

    @_serialized
    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1, *, caller: str = "Context.seq_rm") -> bool:
        """Remove positions [p0, p1) of ``seq_id`` (< 0: every sequence); p0 < 0 means 0,
        p1 < 0 means infinity. Returns False only where a partial removal is impossible: a
        recurrent state cannot lose its last positions (except the last 1..``n_rs_seq`` once,
        with rollback snapshots) and, as in llama.cpp, a recurrent or hybrid memory refuses
        ``seq_id`` < 0. ``caller``: the name error messages start with."""
        s = self._check_seq(seq_id, caller, allow_any=True)
        p0, p1 = _int32(p0, caller, "p0"), _int32(p1, caller, "p1")
        return bool(self._live().seq_rm(s, p0, p1))

    @_serialized
    def seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int = -1, p1: int = -1, *,
               caller: str = "Context.seq_cp") -> None:
        """Make the cells of ``seq_id_src`` in [p0, p1) also belong to ``seq_id_dst``
        (without a unified cache, only whole sequences: p0 = p1 = -1)."""
        src = self._check_seq(seq_id_src, caller, "seq_id_src")
        dst = self._check_seq(seq_id_dst, caller, "seq_id_dst")
        p0, p1 = _int32(p0, caller, "p0"), _int32(p1, caller, "p1")
        if not self._kv_unified and src != dst:
            # separate cells per sequence: like llama.cpp, only whole sequences are copied
            # (its rule for a "full" range, which it asserts)
            size = self._n_ctx_seq
            if (0 < p0 and p0 + 1 < size) or (0 < p1 and p1 + 1 < size):
                raise ValueError(f"{caller}({src}, {dst}, {p0}, {p1}): without a unified KV cache only "
                                 "whole sequences can be copied (p0 = p1 = -1)")
        self._live().seq_cp(src, dst, p0, p1)

    @_serialized
    def seq_keep(self, seq_id: int, *, caller: str = "Context.seq_keep") -> None:
        """Remove every sequence except ``seq_id``."""
        self._live().seq_keep(self._check_seq(seq_id, caller))

    @_serialized
    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int, *, caller: str = "Context.seq_add") -> None:
        """Shift positions [p0, p1) of ``seq_id`` by ``delta`` (K is re-roped, as llama.cpp
        does); cells whose position would become negative are removed."""
        s = self._check_seq(seq_id, caller)
        p0, p1, delta = _int32(p0, caller, "p0"), _int32(p1, caller, "p1"), _int32(delta, caller, "delta")
        self._live().seq_add(s, p0, p1, delta)

    @_serialized
    def seq_div(self, seq_id: int, p0: int, p1: int, d: int, *, caller: str = "Context.seq_div") -> None:
        """Integer-divide positions [p0, p1) of ``seq_id`` by ``d`` (> 0)."""
        s = self._check_seq(seq_id, caller)
        p0, p1, d = _int32(p0, caller, "p0"), _int32(p1, caller, "p1"), _int32(d, caller, "d")
        if d < 1:
            raise ValueError(f"{caller}: d = {d} must be >= 1")
        self._live().seq_div(s, p0, p1, d)

    @_serialized
    def seq_pos_min(self, seq_id: int, *, caller: str = "Context.seq_pos_min") -> int:
        """Smallest position of ``seq_id`` in the cache, -1 if it holds none."""
        return int(self._live().seq_pos_min(self._check_seq(seq_id, caller)))

    @_serialized
    def seq_pos_max(self, seq_id: int, *, caller: str = "Context.seq_pos_max") -> int:
        """Largest position of ``seq_id`` in the cache, -1 if it holds none."""
        return int(self._live().seq_pos_max(self._check_seq(seq_id, caller)))

    # ------------------------------------------------------------------ decode

    def _split(self, ab: AllocatedBatch, n_ubatch: int, equal: bool) -> list:
        if not equal:
            return split_simple(ab.n_tokens, n_ubatch)
        return split_equal(ab, n_ubatch, sequential=False)

    @_serialized
    def _run(self, batch: Batch) -> None:
        """Run ``batch`` (see :meth:`decode` for what it raises). Logs the reason of every
        failure as llama_decode does."""
        if self._vocab_only and not self._freed:
            msg = "the model is vocab-only: it has no weights to decode with"
            log.error("llama_decode: %s (load it without vocab_only)", msg)
            raise InvalidBatchError(msg)
        core = self._live()
        if not self._causal:
            return self._encode(core, batch)
        if (batch.n_tokens == 1 and batch.embd is None and batch.pos is None and batch.seq_id is None
                and batch.n_seq_id is None and batch.logits is None and self._abort is None
                and not self._embeddings):
            tok = batch.token
            if (isinstance(tok, np.ndarray) and tok.dtype == np.int32 and tok.ndim == 1 and tok.shape[0] >= 1
                    and 0 <= int(tok[0]) < self.n_vocab):
                return self._decode_one(core, tok)
        n_seq_max = int(core.n_seq_max)
        try:
            if int(batch.n_tokens) > self._n_batch:
                raise InvalidBatchError(f"n_tokens_all = {batch.n_tokens} > n_batch = {self._n_batch}: "
                                        "split the batch or raise n_batch")
            ab = allocate(
                batch, n_vocab=self.n_vocab, n_embd=self.n_embd, n_seq_max=n_seq_max,
                seq_pos_min=lambda s: int(core.seq_pos_min(s)),
                seq_pos_max=lambda s: int(core.seq_pos_max(s)),
                output_all=self._embeddings,
                warn=lambda m: log.warning("llama_decode: %s", m),
                kv_unified=self._kv_unified, mrope=self._mrope)
        except InvalidBatchError as e:
            log.error("llama_decode: failed to initialize batch: %s", e)
            raise
        self._decode_allocated(core, ab, n_seq_max)

    def _encode(self, core: "_core.Context", batch: Batch) -> None:
        """llama.cpp's ``encode`` (which its ``decode`` calls for models without memory):
        every token an output, positions from 0 where the batch has none, no KV cache, the
        whole batch in one micro-batch (llama.cpp asserts n_ubatch >= n_tokens; here it is
        an invalid batch)."""
        n_seq_max = int(core.n_seq_max)
        try:
            if int(batch.n_tokens) > self._n_batch:
                raise InvalidBatchError(f"n_tokens_all = {batch.n_tokens} > n_batch = {self._n_batch}: "
                                        "split the batch or raise n_batch")
            ab = allocate(
                batch, n_vocab=self.n_vocab, n_embd=self.n_embd, n_seq_max=n_seq_max,
                seq_pos_min=lambda s: -1, seq_pos_max=lambda s: -1, output_all=True,
                warn=lambda m: log.warning("llama_encode: %s", m), kv_unified=True)
            if ab.n_tokens > int(core.n_ubatch):
                raise InvalidBatchError(
                    f"the encoder needs the whole batch in one micro-batch: n_tokens = {ab.n_tokens} > "
                    f"n_ubatch = {int(core.n_ubatch)} (raise n_ubatch to n_batch)")
        except InvalidBatchError as e:
            log.error("llama_encode: failed to initialize batch: %s", e)
            raise
        n = ab.n_tokens
        n_seq_id, seq_id = ab.seq_id_array(n_seq_max)
        out_rows = np.arange(n, dtype=np.int32)
        embd_buf = self._embd_buf if self._embeddings else None
        if embd_buf is not None and embd_buf.shape[0] < n:
            embd_buf = np.zeros((max(n, n_seq_max), self.n_embd), dtype=np.float32)
        hidden = embd_buf[:n] if embd_buf is not None else None
        no_logits = np.zeros((0, self.n_vocab), dtype=np.float32)  # encoders have no output layer
        ubatches = [np.arange(n, dtype=np.int32)]
        t0 = _time_us()
        try:
            core.decode(ab.token, ab.embd, ab.pos, n_seq_id, seq_id, ubatches, out_rows, no_logits, hidden, None)
            if embd_buf is not None and self._pooling != LLAMA_POOLING_TYPE_NONE:
                embd_seq = _pool(ab, embd_buf[:n], self._pooling, ubatches, core=core,
                                 pooling_cls=self._pooling_cls)
                if embd_seq and self._pooling != LLAMA_POOLING_TYPE_RANK:
                    # llama.cpp's build_dense_out: the model's dense projections (EmbeddingGemma's
                    # dense_2 / dense_3) on the pooled vectors
                    seqs = sorted(embd_seq)
                    d = core.dense_out(np.ascontiguousarray(np.stack([embd_seq[s] for s in seqs]), dtype=np.float32))
                    if d is not None:
                        embd_seq = {s: d[k].copy() for k, s in enumerate(seqs)}
            else:
                if embd_buf is not None:
                    # pooling none: on every token's row
                    d = core.dense_out(np.ascontiguousarray(embd_buf[:n]))
                    if d is not None:
                        embd_buf[:n] = d
                embd_seq = {}
        except Exception as e:  # fatal: Rust failed mid-way
            raise self._fatal(e) from e
        t1 = _time_us()
        if embd_buf is not None:
            self._embd_buf = embd_buf
        self._logits_buf = no_logits
        self._output_ids.fill(-1)
        self._output_ids[:n] = out_rows
        self._n_outputs = n
        self._embd_seq = embd_seq
        if not self._has_evaluated_once:
            self._t_load_us = _time_us() - self._t_start_us
            self._has_evaluated_once = True
        self._n_p_eval += n
        if not self._no_perf:
            self._t_p_eval_us += t1 - t0

    @property
    def is_encoder(self) -> bool:
        """Whether the model is an encoder (bert, ...): non-causal, no KV cache."""
        return not self._causal

    @property
    def arch(self) -> str:
        """The model's architecture (``general.architecture``: "llama", "gemma3", ...)."""
        return str(self._core_model.arch)

    @property
    def causal_attn(self) -> bool:
        """Whether the model attends causally (decoder-only models; False for encoders)."""
        return self._causal

    def _fatal(self, e: Exception) -> DecodeError:
        """A failure inside the forward pass: no outputs left; logged, returned as a
        DecodeError to raise from ``e``."""
        self._n_outputs = 0
        self._output_ids.fill(-1)
        msg = f"{type(e).__name__}: {e}"
        log.error("llama_decode: fatal error while computing the batch: %s", msg)
        return DecodeError(f"decode failed: {msg}")

    def _no_slot(self, n: int, core: "_core.Context", detail: str = "") -> ContextFullError:
        msg = detail or f"failed to find a memory slot for batch of size {n} (n_ctx = {int(core.n_ctx)})"
        log.warning("llama_decode: %s", msg)
        return ContextFullError(msg)

    def _decode_one(self, core: "_core.Context", tok: np.ndarray) -> None:
        """``_run`` for the token-generation step: one valid token id continuing sequence
        0, logits for it, no abort callback, no embeddings. Same effects and exceptions as
        the general path, which it skips (allocation, split and output map are constant
        here), and one Rust call with two scalars and the logits row instead of eight arrays."""
        t0 = _time_us()
        try:
            out = core.decode_one(int(tok[0]), self._logits_buf[0])
        except Exception as e:  # fatal: Rust failed mid-way
            raise self._fatal(e) from e
        t1 = _time_us()
        kind = out.kind
        if kind != "ok":
            if kind == "invalid_batch":
                log.error("llama_decode: failed to initialize batch: %s", out.reason)
                raise InvalidBatchError(out.reason)
            if kind == "no_slot":
                raise self._no_slot(1, core)
            raise RuntimeError(f"decode_one: unexpected outcome {out!r}")  # a pyllama bug
        if self._n_outputs != 1 or self._output_ids[0] != 0:
            self._output_ids.fill(-1)
            self._output_ids[0] = 0
        if self._embd_seq:
            self._embd_seq = {}
        self._n_outputs = 1
        if not self._has_evaluated_once:
            self._t_load_us = _time_us() - self._t_start_us
            self._has_evaluated_once = True
        self._n_eval += 1
        if not self._no_perf:
            self._t_eval_us += t1 - t0

    def _decode_allocated(self, core: "_core.Context", ab: AllocatedBatch, n_seq_max: int) -> None:
        n = ab.n_tokens
        n_outputs = ab.n_outputs
        n_ubatch = int(core.n_ubatch)
        # outputs go to rows in batch order, so llama_get_logits needs no reordering
        if n_outputs == n:
            out_rows = np.arange(n, dtype=np.int32)
        else:
            out_rows = np.full(n, -1, dtype=np.int32)
            if n_outputs == 1 and ab.output[-1]:
                out_rows[-1] = 0
            else:
                out_rows[ab.output] = np.arange(n_outputs, dtype=np.int32)
        n_seq_id, seq_id = ab.seq_id_array(n_seq_max)

        # grow the output buffers (new arrays: when nothing changed the old outputs stay intact)
        logits_buf = self._logits_buf
        if logits_buf.shape[0] < n_outputs:
            logits_buf = np.zeros((max(n_outputs, n_seq_max), self.n_vocab), dtype=np.float32)
        embd_buf = self._embd_buf if self._embeddings else None
        if embd_buf is not None and embd_buf.shape[0] < n_outputs:
            embd_buf = np.zeros((max(n_outputs, n_seq_max), self.n_embd), dtype=np.float32)
        hidden = embd_buf[:n_outputs] if embd_buf is not None else None

        cb_error: list = []
        abort = None
        if self._abort is not None:
            user_cb = self._abort

            def abort() -> bool:
                try:
                    return bool(user_cb())
                except BaseException as e:  # a failing callback stops the decode
                    cb_error.append(e)
                    return True

        multi_set = len(ab.seq_pos) > 1 or ab.has_cpl
        kind = self._memory_kind
        if kind == "kv":
            ubatches = self._split(ab, n_ubatch, equal=not self._kv_unified and multi_set)
        else:
            # llama_memory_recurrent / _hybrid::init_batch: by sequence set when every token
            # is an output (embeddings), else equal parts per sequence, with consecutive
            # sequence ids for a recurrent memory (and a hybrid one with separate KV streams)
            try:
                if self._embeddings:
                    ubatches = split_seq(ab, n_ubatch)
                else:
                    # with rollback snapshots, a sequence's last n_rs_seq + 1 tokens stay together
                    n_rs = int(core.n_rs_seq)
                    ubatches = split_equal(ab, n_ubatch, sequential=kind == "recurrent" or not self._kv_unified,
                                           n_keep_tail=n_rs + 1 if n_rs else 0)
            except InvalidBatchError as e:  # no split: llama.cpp's failed prepare, no slot
                raise self._no_slot(n, core, f"failed to find a memory slot for batch of size {n}: {e}") from None

        t0 = _time_us()
        try:
            out = core.decode(ab.token, ab.embd, ab.pos, n_seq_id, seq_id, ubatches, out_rows,
                              logits_buf[:n_outputs], hidden, abort)
            if out.kind == "no_slot" and self._kv_unified and multi_set and kind == "kv":
                # as llama.cpp's SWA cache: if the simple split finds no slot, try equal split
                ubatches = split_equal(ab, n_ubatch)
                out = core.decode(ab.token, ab.embd, ab.pos, n_seq_id, seq_id, ubatches, out_rows,
                                  logits_buf[:n_outputs], hidden, abort)
        except Exception as e:  # fatal: Rust failed mid-way
            raise self._fatal(e) from e
        t1 = _time_us()

        if out.kind == "no_slot":
            raise self._no_slot(n, core)
        if out.kind == "invalid_batch":  # Python's allocator lets none through: kept for completeness
            log.error("llama_decode: failed to initialize batch: %s", out.reason)
            raise InvalidBatchError(out.reason)

        # from here on the old outputs are replaced
        self._logits_buf = logits_buf
        if embd_buf is not None:
            self._embd_buf = embd_buf
        self._output_ids.fill(-1)
        self._embd_seq = {}

        if out.kind == "aborted":
            self._n_outputs = 0
            msg = (f"aborted by the abort callback after {out.n_done} of {len(ubatches)} "
                   "micro-batches; the cache keeps the finished ones")
            if cb_error:
                msg += f" (the callback raised {cb_error[0]!r})"
            log.warning("llama_decode: %s", msg)
            err = Aborted(msg)
            err.n_done, err.n_ubatches = int(out.n_done), len(ubatches)
            if cb_error:
                raise err from cb_error[0]
            raise err

        self._n_outputs = n_outputs
        self._output_ids[:n] = out_rows
        # embd_buf, not self._embeddings: an abort callback may switch embeddings on mid-decode
        if embd_buf is not None and self._pooling != LLAMA_POOLING_TYPE_NONE and n_outputs:
            self._embd_seq = _pool(ab, embd_buf[:n_outputs], self._pooling, ubatches, core=core,
                                   pooling_cls=self._pooling_cls, causal=True)

        if not self._has_evaluated_once:
            self._t_load_us = _time_us() - self._t_start_us
            self._has_evaluated_once = True
        if n == 1:
            self._n_eval += 1
            if not self._no_perf:
                self._t_eval_us += t1 - t0
        else:
            self._n_p_eval += n
            if not self._no_perf:
                self._t_p_eval_us += t1 - t0

    def decode(self, tokens_or_batch: Union[Batch, Sequence[int], np.ndarray], *, seq_id: int = 0,
               logits_all: bool = False) -> None:
        """Run a batch through the model and keep its outputs.

        A sequence of token ids continues sequence ``seq_id`` (positions from the cache's
        last one + 1) and produces logits for the last token, or for every token with
        ``logits_all``. A :class:`~pyllama.batch.Batch` is used as given. An encoder
        model's context encodes the batch (every token an output, no KV cache).

        Raises :class:`InvalidBatchError` (nothing changed), :class:`ContextFullError`
        (no room in the KV cache; nothing changed), :class:`Aborted` (the abort callback
        stopped it; the cache keeps the first ``n_done`` micro-batches; an exception the
        callback raised is its ``__cause__``) or :class:`DecodeError` (a fatal error in
        the forward pass: no outputs; the cause is its ``__cause__``). llama_decode's
        codes for these are -1, 1, 2 and ``DecodeError.code`` (< -1).
        """
        if isinstance(tokens_or_batch, Batch):
            batch = tokens_or_batch
            _integer(batch.n_tokens, "Context.decode", "batch.n_tokens")
        elif tokens_or_batch is None or isinstance(tokens_or_batch, (str, bytes, int, float)):
            raise TypeError("Context.decode: tokens_or_batch must be a Batch or a sequence of token ids, "
                            f"got {_describe(tokens_or_batch)}")
        else:
            seq_id = _int32(seq_id, "Context.decode", "seq_id")
            batch = batch_get_one(tokens_or_batch)
            if seq_id != 0 or logits_all:
                n = batch.n_tokens
                batch.n_seq_id = np.ones(n, dtype=np.int32)
                batch.seq_id = np.full((n, 1), int(seq_id), dtype=np.int32)
                if logits_all:
                    batch.logits = np.ones(n, dtype=np.int8)
        self._run(batch)

    # ------------------------------------------------------------------ outputs

    @property
    def n_outputs(self) -> int:
        """Output rows of the last decode (0 after an abort or a fatal error)."""
        return self._n_outputs

    @property
    def logits(self) -> np.ndarray:
        """float32 [n_outputs, n_vocab]: one row per output of the last decode, in batch
        order. A view: the next decode overwrites it."""
        return self._logits_buf[: self._n_outputs]

    @property
    def output_ids(self) -> np.ndarray:
        """int32 [n_batch], read-only: the output row of each batch entry of the last
        decode (-1: the entry asked for no output). A view: the next decode rewrites it."""
        v = self._output_ids.view()
        v.flags.writeable = False
        return v

    def output_row(self, i: int) -> int:
        """llama.cpp's ``output_resolve_row``: batch index -> output row of the last decode
        (a row of :attr:`logits`); negative counts back from the last output row. Raises
        IndexError with llama.cpp's reason when entry ``i`` has no output."""
        i = int(i)
        if i < 0:
            j = self._n_outputs + i
            if j < 0:
                raise IndexError(f"negative index out of range [0, {self._n_outputs})")
        elif i >= self._output_ids.shape[0]:
            raise IndexError(f"out of range [0, {self._output_ids.shape[0]})")
        else:
            j = int(self._output_ids[i])
        if j < 0:
            raise IndexError(f"batch.logits[{i}] != true")
        if j >= self._n_outputs:
            raise IndexError(f"corrupt output buffer (j={j}, n_outputs={self._n_outputs})")
        return j

    def logits_ith(self, i: int) -> np.ndarray:
        """float32 [n_vocab] logits of batch entry ``i`` (i < 0: output row n_outputs + i)."""
        i = _int32(i, "Context.logits_ith", "i")
        self._live()
        return self._logits_buf[self.output_row(i)]

    @property
    def embeddings(self) -> Optional[np.ndarray]:
        """float32 [n_outputs, n_embd] final-normed hidden states of the last decode (every
        token is an output in an embeddings context), or None without ``embeddings=True``."""
        if self._embd_buf is None or not self._embeddings:
            return None
        return self._embd_buf[: self._n_outputs]

    def embeddings_ith(self, i: int) -> np.ndarray:
        i = _int32(i, "Context.embeddings_ith", "i")
        self._live()
        if self._embd_buf is None or not self._embeddings:
            raise IndexError("no embeddings (create the context with embeddings=True)")
        return self._embd_buf[self.output_row(i)]

    def embeddings_seq(self, seq_id: int) -> Optional[np.ndarray]:
        """float32 [n_embd] pooled embedding of ``seq_id`` over its tokens in the last batch
        (pooling mean/cls/last; with rank pooling the classifier's n_cls_out scores), or None
        when there is none."""
        seq_id = _int32(seq_id, "Context.embeddings_seq", "seq_id")
        self._live()
        return self._embd_seq.get(seq_id)

    # ------------------------------------------------------------------ perf / debug

    def perf(self) -> PerfContextData:
        return PerfContextData(
            t_start_ms=1e-3 * self._t_start_us,
            t_load_ms=1e-3 * self._t_load_us,
            t_p_eval_ms=1e-3 * self._t_p_eval_us,
            t_eval_ms=1e-3 * self._t_eval_us,
            n_p_eval=max(1, self._n_p_eval),
            n_eval=max(1, self._n_eval),
            n_reused=0,
        )

    def perf_reset(self) -> None:
        self._t_start_us = _time_us()
        self._t_eval_us = self._n_eval = 0
        self._t_p_eval_us = self._n_p_eval = 0

    def perf_text(self) -> str:
        """llama_perf_context_print's lines, in its format."""
        d = self.perf()
        t_end_ms = 1e-3 * _time_us()
        f = "llama_perf_context_print"

        def rate(t, n):
            return 1e3 / t * n if t > 0 else float("inf")

        return "\n".join([
            f"{f}:        load time = {d.t_load_ms:10.2f} ms",
            f"{f}: prompt eval time = {d.t_p_eval_ms:10.2f} ms / {d.n_p_eval:5d} tokens "
            f"({d.t_p_eval_ms / d.n_p_eval:8.2f} ms per token, {rate(d.t_p_eval_ms, d.n_p_eval):8.2f} tokens per second)",
            f"{f}:        eval time = {d.t_eval_ms:10.2f} ms / {d.n_eval:5d} runs   "
            f"({d.t_eval_ms / d.n_eval:8.2f} ms per token, {rate(d.t_eval_ms, d.n_eval):8.2f} tokens per second)",
            f"{f}:       total time = {t_end_ms - d.t_start_ms:10.2f} ms / {d.n_p_eval + d.n_eval:5d} tokens",
            f"{f}:    graphs reused = {d.n_reused:10d}",
        ])

    @_serialized
    def set_debug_dump(self, names: Optional[Sequence[str]]) -> None:
        """Ask the forward pass to keep the named intermediates (e.g. "blk.7.attn_out")."""
        if names is not None and (not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names)):
            raise TypeError(f"Context.set_debug_dump: names must be a list of str or None, got {_describe(names)}")
        self._live().set_debug_dump(list(names) if names is not None else None)

    @_serialized
    def debug_dump(self) -> dict:
        """The intermediates kept by the last decode: name -> numpy array."""
        return dict(self._live().debug_dump())

    # ------------------------------------------------------------------ saved state
    #
    # The KV cache and the last decode's outputs (logits, embeddings, which batch entry
    # each output row belongs to) in one checked blob (rust/core/src/state.rs). Loading
    # validates everything first: a state that does not fit raises StateError and the
    # context is exactly as before.

    def _state_outputs(self) -> dict:
        n = self._n_outputs
        if n == 0:
            return {}
        ids = self._output_ids
        batch_idx = np.nonzero(ids >= 0)[0]
        rows = np.full(n, -1, dtype=np.int32)
        rows[ids[batch_idx]] = batch_idx
        out = {"out_rows": rows, "logits": self._logits_buf[:n]}
        if self._embd_buf is not None and self._embeddings:
            out["embd"] = self._embd_buf[:n]
        return out

    @staticmethod
    def _tokens_arg(tokens, fn: str) -> Optional[np.ndarray]:
        if tokens is None:
            return None
        t = np.asarray(tokens)
        if t.ndim != 1 or (t.size and not np.issubdtype(t.dtype, np.integer)):
            raise TypeError(f"{fn}: tokens must be a 1-D sequence of token ids, got {_describe(tokens)}")
        return np.ascontiguousarray(t, dtype=np.int32) if t.size else np.zeros(0, np.int32)

    def _check_tokens(self, t: Optional[np.ndarray], fn: str) -> None:
        if t is not None and t.size and (int(t.min()) < 0 or int(t.max()) >= self.n_vocab):
            raise ValueError(f"{fn}: tokens hold ids outside [0, n_vocab = {self.n_vocab})")

    @staticmethod
    def _bytes_arg(data, fn: str) -> np.ndarray:
        if isinstance(data, np.ndarray):
            if data.dtype not in (np.uint8, np.int8) or data.ndim != 1:
                raise TypeError(f"{fn}: data must be bytes or a 1-D uint8 array, got {data.dtype} {data.shape}")
            return np.ascontiguousarray(data).view(np.uint8)
        try:
            mv = memoryview(data)
        except TypeError:
            raise TypeError(f"{fn}: data must be bytes (from save_state), got {_describe(data)}") from None
        if not mv.c_contiguous:
            mv = memoryview(mv.tobytes())
        return np.frombuffer(mv.cast("B") if (mv.format != "B" or mv.ndim != 1) else mv, dtype=np.uint8)

    def _state_seq(self, seq_id, fn: str) -> Optional[int]:
        return None if seq_id is None else self._check_seq(seq_id, fn)

    @_serialized
    def state_size(self, seq_id: Optional[int] = None, *, tokens=None, flags: int = 0) -> int:
        """Bytes of the saved state of the whole context (or of sequence ``seq_id``)."""
        s = self._state_seq(seq_id, "Context.state_size")
        out = self._state_outputs() if s is None else {}
        return int(self._live().state_size(seq_id=s, flags=int(flags), tokens=self._tokens_arg(tokens, "Context.state_size"), **out))

    @_serialized
    def save_state_into(self, dst: np.ndarray, *, seq_id: Optional[int] = None, tokens=None, flags: int = 0,
                        caller: str = "Context.save_state_into") -> int:
        """Write the state of the whole context (or of sequence ``seq_id``) into the uint8
        array ``dst`` without allocating; returns the bytes written. StateError when
        ``dst`` is smaller than :meth:`state_size`. ``caller``: the name error messages
        start with."""
        fn = caller
        s = self._state_seq(seq_id, fn)
        out = self._state_outputs() if s is None else {}
        t = self._tokens_arg(tokens, fn)
        self._check_tokens(t, fn)
        return int(self._live().state_save(seq_id=s, flags=int(flags), tokens=t, dst=dst, **out))

    @_serialized
    def save_state(self, *, tokens=None) -> bytes:
        """The whole context's state (KV cache, the last decode's logits and embeddings) as
        bytes for :meth:`load_state`; ``tokens`` (the ids behind the cache) travel with it."""
        t = self._tokens_arg(tokens, "Context.save_state")
        self._check_tokens(t, "Context.save_state")
        return self._live().state_save(tokens=t, **self._state_outputs())

    @_serialized
    def seq_save_state(self, seq_id: int, *, tokens=None, flags: int = 0) -> bytes:
        """The KV cells of one sequence as bytes for :meth:`seq_load_state`."""
        s = self._check_seq(seq_id, "Context.seq_save_state")
        t = self._tokens_arg(tokens, "Context.seq_save_state")
        self._check_tokens(t, "Context.seq_save_state")
        return self._live().state_save(seq_id=s, flags=int(flags), tokens=t)

    @_serialized
    def restore_state(self, data, *, dest_seq_id: Optional[int] = None, max_tokens: Optional[int] = None,
                      apply: bool = True, whole: bool = False, caller: str = "Context.restore_state") -> tuple:
        """Check and (with ``apply``) load a state from :meth:`save_state` (``dest_seq_id``
        None) or :meth:`seq_save_state` (into ``dest_seq_id``); returns (bytes read, its
        tokens). Raises StateError, the context unchanged, when it does not fit, holds more
        than ``max_tokens`` tokens or (``whole``: the data must be exactly one state, as a
        file) has bytes after it. ``apply=False`` only checks. ``caller``: the name error
        messages start with. :meth:`load_state` and the ``*_file`` methods are this."""
        fn = caller
        arr = self._bytes_arg(data, fn)
        dest = self._state_seq(dest_seq_id, fn)
        if whole and arr.shape[0] >= 28:
            total = int(arr[20:28].view("<u8")[0])  # the header's total_len (state.rs)
            if total < arr.shape[0]:
                from .errors import StateError

                raise StateError(f"{fn}: {arr.shape[0] - total} bytes follow the state")
        n_read, tokens, rows, logits, embd = self._live().state_load(
            arr, n_batch=self._n_batch, dest_seq_id=dest, max_tokens=max_tokens, apply=apply)
        if apply and dest is None:
            n = int(rows.shape[0])
            if n:
                if self._logits_buf.shape[0] < n:
                    self._logits_buf = np.zeros((max(n, self.n_seq_max), self.n_vocab), dtype=np.float32)
                if logits is not None:
                    self._logits_buf[:n] = logits
                else:
                    self._logits_buf[:n] = 0.0
                if embd is not None:
                    if self._embd_buf is None or self._embd_buf.shape[0] < n:
                        self._embd_buf = np.zeros((max(n, self.n_seq_max), self.n_embd), dtype=np.float32)
                    self._embd_buf[:n] = embd
            self._output_ids.fill(-1)
            self._output_ids[rows] = np.arange(n, dtype=np.int32)
            self._n_outputs = n
            self._embd_seq = {}
        return n_read, tokens

    def load_state(self, data) -> int:
        """Restore a state from :meth:`save_state` (bytes, bytearray or uint8 array);
        returns the bytes read. A state from another model, KV type or layout, one with more
        cells than this context holds, or a truncated or corrupted one raises
        :class:`~pyllama.StateError` and leaves the context as it was."""
        return self.restore_state(data, caller="Context.load_state")[0]

    def seq_load_state(self, data, dest_seq_id: int, *, flags: int = 0) -> int:
        """Put a sequence state from :meth:`seq_save_state` into ``dest_seq_id`` (its
        current cells are replaced); returns the bytes read. Raises StateError as
        :meth:`load_state`, also when the cells do not fit."""
        self._check_seq(dest_seq_id, "Context.seq_load_state")
        return self.restore_state(data, dest_seq_id=dest_seq_id, caller="Context.seq_load_state")[0]

    @staticmethod
    def _read_file(path, fn: str) -> bytes:
        with open(os.fspath(path), "rb") as f:
            return f.read()


    def _load_file(self, path, dest: Optional[int], fn: str, max_tokens: Optional[int]) -> tuple:
        return self.restore_state(self._read_file(path, fn), dest_seq_id=dest, max_tokens=max_tokens, whole=True,
                                  caller=fn)

    def save_state_file(self, path, tokens=None) -> int:
        """Write :meth:`save_state` (with ``tokens``) to ``path``; returns the bytes written."""
        data = self.save_state(tokens=tokens)
        with open(os.fspath(path), "wb") as f:
            f.write(data)
        return len(data)

    def load_state_file(self, path, *, max_tokens: Optional[int] = None) -> np.ndarray:
        """Restore a state file from :meth:`save_state_file`; returns its tokens (int32).
        More than ``max_tokens`` tokens is a StateError."""
        return self._load_file(path, None, "Context.load_state_file", max_tokens)[1]

    def seq_save_state_file(self, path, seq_id: int, tokens=None) -> int:
        """Write :meth:`seq_save_state` (with ``tokens``) to ``path``; returns the bytes written."""
        data = self.seq_save_state(seq_id, tokens=tokens)
        with open(os.fspath(path), "wb") as f:
            f.write(data)
        return len(data)

    def seq_load_state_file(self, path, dest_seq_id: int, *, max_tokens: Optional[int] = None) -> np.ndarray:
        """Load a sequence state file into ``dest_seq_id``; returns its tokens."""
        self._check_seq(dest_seq_id, "Context.seq_load_state_file")
        return self._load_file(path, dest_seq_id, "Context.seq_load_state_file", max_tokens)[1]

    def __repr__(self) -> str:
        if self._freed:
            return "Context(freed)"
        if self._vocab_only:
            return f"Context(vocab-only, n_ctx={self.n_ctx})"
        return (f"Context(n_ctx={self.n_ctx}, n_batch={self.n_batch}, n_ubatch={self.n_ubatch}, "
                f"n_seq_max={self.n_seq_max})")


def _fma32(a: np.ndarray, b, c: np.ndarray) -> np.ndarray:
    """float32 ``a * b + c`` rounded once, as the FMA instruction (elementwise). The product
    of two float32 is exact in float64; the float64 sum is rounded to odd (its lowest bit
    set where it is inexact), which makes the final rounding to float32 the correct one."""
    p = a.astype(np.float64) * np.float64(b)
    c = c.astype(np.float64)
    s = p + c
    t = s - p
    err = (p - (s - t)) + (c - t)  # s + err == p + c exactly (TwoSum)
    fix = (err != 0) & ((s.view(np.uint64) & 1) == 0)
    if fix.any():
        s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def _hsum8_tinyblas(acc: np.ndarray) -> np.ndarray:
    """llamafile's ``hsum(__m256)`` over 8 lane rows: high half + low half, then
    (l0 + l2) + (l1 + l3)."""
    t = acc[4:8] + acc[0:4]
    return (t[0] + t[2]) + (t[1] + t[3])


def _mean_pool(x: np.ndarray, js: list, w: np.float32, tinyblas: bool) -> np.ndarray:
    """One sequence's mean over a micro-batch exactly as llama.cpp's AVX2 CPU backend
    computes ``ggml_mul_mat(ggml_cont(ggml_transpose(t_embd)), inp_mean)`` for it: the dot
    product, over the micro-batch's tokens, of each hidden-state column with the weights
    (1/n at the sequence's n tokens, 0 elsewhere). ``x``: the micro-batch's hidden states
    [n_tokens, n_embd] in micro-batch order; ``js``: the sequence's rows in it (ascending).
    Zero weights add exact zeros, so only the sequence's rows are visited, in their lanes.

    ``tinyblas``: llamafile_sgemm's tinyBLAS<8> f32 path (llama.cpp takes it for 2 or more
    sequences when n_tokens % 8 == 0 and n_embd % 4 == 0): one 8-lane FMA accumulator,
    then ``hsum``. Else ``ggml_vec_dot_f32``: 4 accumulators of 8 lanes over the first
    n_tokens & ~31 tokens (FMA), reduced as ((a0 + a2) + (a1 + a3)), high + low half, hadd,
    hadd; then the remaining tokens one by one into that float sum as GCC 12 -O3 compiles
    the scalar loop: runs of 8, then of 4, multiplied as vectors (product rounded) and
    added in order, the last 1-3 with scalar FMAs."""
    n, ne = x.shape
    js = np.asarray(js, dtype=np.int64)
    if tinyblas:
        acc = np.zeros((8, ne), dtype=np.float32)
        for b in np.unique(js // 8):
            sel = js[(js >= 8 * b) & (js < 8 * b + 8)]
            acc[sel % 8] = _fma32(x[sel], w, acc[sel % 8])
        return _hsum8_tinyblas(acc)
    np_ = n & ~31
    acc = np.zeros((32, ne), dtype=np.float32)
    head = js[js < np_]
    for b in np.unique(head // 32):
        sel = head[(head >= 32 * b) & (head < 32 * b + 32)]
        acc[sel % 32] = _fma32(x[sel], w, acc[sel % 32])
    v = (acc[0:8] + acc[16:24]) + (acc[8:16] + acc[24:32])
    t = v[4:8] + v[0:4]
    s = (t[0] + t[1]) + (t[2] + t[3])
    left = n - np_
    unfused = (left // 8) * 8  # leftovers [0, unfused) are multiplied then added
    r = left - unfused
    if r >= 4:
        unfused += 4
    for j in js[js >= np_]:
        if j - np_ < unfused:
            s = s + x[j] * w
        else:
            s = _fma32(x[j], w, s)
    return s


@functools.lru_cache(maxsize=1)
def _llamacpp_order() -> bool:
    """``PYLLAMA_ORDER=llamacpp``, read once as the Rust core reads it."""
    return os.environ.get("PYLLAMA_ORDER", "").lower() == "llamacpp"


def _pool(ab: AllocatedBatch, hidden: np.ndarray, pooling: int, ubatches: Optional[list] = None, *,
          core=None, pooling_cls: int = 0, causal: bool = False) -> dict:
    """Per-sequence pooled embeddings over all of a sequence's tokens in the batch, as
    llama.cpp's mean / CLS (first position) / LAST (last position) pooling; an entry in
    several sequences counts for each. hidden: [n_tokens, n_embd] (all tokens are outputs);
    ubatches: the micro-batches the batch was decoded in (batch indices, micro-batch order).

    Mean is llama.cpp's pooling matmul (``ggml_mul_mat`` of the transposed hidden states and
    the 1/n weights) in its float order (:func:`_mean_pool`). That order depends on the
    micro-batch (one sequence or several, its token count, where the sequence sits in it);
    by default each sequence is pooled as llama.cpp pools a sequence alone in a micro-batch
    (so a vector does not depend on the other sequences in the batch, and a prompt embedded
    alone is llama.cpp's bit for bit). Under ``PYLLAMA_ORDER=llamacpp`` a sequence within
    one micro-batch is pooled as llama.cpp pools it there. A sequence split across
    micro-batches is pooled over all its tokens as if alone, in both modes: llama.cpp keeps
    only its last micro-batch's part (``embd_seq`` is overwritten per micro-batch), which
    depends on where the batch was cut, and that is not copied."""
    if pooling == LLAMA_POOLING_TYPE_RANK:
        # llama.cpp's build_pooling: the CLS row (the last one for a causal model, as
        # Qwen3-Reranker; the mean where the classifier pools by mean), then the model's
        # classifier head; n_cls_out scores per sequence
        base = _pool(ab, hidden, LLAMA_POOLING_TYPE_MEAN if pooling_cls == LLAMA_POOLING_TYPE_MEAN
                     else LLAMA_POOLING_TYPE_LAST if causal else LLAMA_POOLING_TYPE_CLS, ubatches)
        if not base:
            return {}
        seqs = sorted(base)
        scores = core.classify(np.ascontiguousarray(np.stack([base[s] for s in seqs]), dtype=np.float32))
        return {s: scores[k].copy() for k, s in enumerate(seqs)}
    members: dict = {}
    for i, sids in enumerate(ab.seq_ids):
        for s in sids:
            members.setdefault(s, []).append(i)
    out = {}
    if pooling == LLAMA_POOLING_TYPE_MEAN:
        ne = hidden.shape[1]
        where: dict = {}  # batch index -> (micro-batch, index in it)
        n_unq: list = []
        if _llamacpp_order() and ubatches is not None:
            for u, ub in enumerate(ubatches):
                for j, i in enumerate(ub):
                    where[int(i)] = (u, j)
                n_unq.append(len({s for i in ub for s in ab.seq_ids[int(i)]}))
        for s, idx in members.items():
            w = np.float32(1.0) / np.float32(len(idx))
            us = {where[i][0] for i in idx} if where else set()
            if len(us) == 1:
                u = us.pop()
                ub = [int(i) for i in ubatches[u]]
                tinyblas = n_unq[u] >= 2 and len(ub) % 8 == 0 and ne % 4 == 0
                out[s] = _mean_pool(hidden[ub], sorted(where[i][1] for i in idx), w, tinyblas)
            else:
                out[s] = _mean_pool(hidden[idx], list(range(len(idx))), w, False)
        return out
    for s, idx in members.items():
        p = ab.pos[idx]
        if pooling == LLAMA_POOLING_TYPE_CLS:
            k = idx[int(np.argmin(p))]  # first of the smallest position
        else:
            k = idx[len(idx) - 1 - int(np.argmax(p[::-1]))]  # last of the largest position
        out[s] = hidden[k].copy()
    return out
