"""llama-cpp-python's object layer (its ``llama_cpp._internals``, 0.3.36): ``LlamaModel``,
``LlamaContext``, ``LlamaBatch``, ``LlamaTokenDataArray``, ``LlamaSampler``,
``CustomSampler``, ``LlamaSamplingParams`` / ``LlamaSamplingContext``, thin wrappers over
the llama.h-style functions of :mod:`pyllama.llama_api` (``pyllama.compat`` registers this
module as ``llama_cpp._internals``).

    >>> import pyllama.llama_api as C
    >>> from pyllama.internals import LlamaModel, LlamaContext, LlamaBatch, LlamaSampler
    >>> model = LlamaModel(path_model="model.gguf", params=C.llama_model_default_params())
    >>> ctx = LlamaContext(model=model, params=C.llama_context_default_params())
    >>> tokens = model.tokenize(b"Hello", add_bos=True, special=True)
    >>> batch = LlamaBatch(n_tokens=len(tokens), embd=0, n_seq_max=1)
    >>> batch.set_batch(tokens, n_past=0, logits_all=False); ctx.decode(batch)
    >>> sampler = LlamaSampler(); sampler.add_greedy(); sampler.sample(ctx, -1)

Where llama-cpp-python hands out ctypes pointers, these hand out pyllama's objects:
``get_logits`` / ``get_embeddings*`` return numpy views, ``model.model`` / ``model.vocab``
/ ``ctx.ctx`` / ``batch.batch`` / ``sampler.sampler`` are pyllama's llama_model /
llama_vocab / llama_context / llama_batch / sampler chain (what llama_api's functions
take), and a custom sampler's function gets a :class:`pyllama.sampling.TokenDataArray`
(``ids``, ``logits``, ``p``, ``selected``, ``sorted``), not a ctypes array. The methods
llama-cpp-python itself marks deprecated (``LlamaContext.sample_*``, ...) raise
NotImplementedError as they do there.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

from . import llama_api as C
from .llama_grammar import LlamaGrammar
from .sampling import TokenDataArray

__all__ = [
    "LlamaModel", "LlamaContext", "LlamaBatch", "LlamaTokenDataArray", "normalize_embedding",
    "LlamaSamplingParams", "LlamaSamplingContext", "CustomSampler", "LlamaSampler",
]

log = logging.getLogger("pyllama")


class _quiet:
    """verbose=False: pyllama's INFO / WARNING lines held back (llama-cpp-python silences
    llama.cpp's log the same way)."""

    def __init__(self, verbose: bool):
        self.verbose = verbose

    def __enter__(self):
        self.prev = log.level
        if not self.verbose:
            log.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        log.setLevel(self.prev)


_backend = {"started": False}


def _backend_init_once() -> None:
    """llama.cpp registers its CPU backend statically, so its LlamaModel loads without a
    llama_backend_init() call; pyllama's llama_api wants one: made once here (as
    llama-cpp-python's Llama does)."""
    if not _backend["started"]:
        C.llama_backend_init()
        _backend["started"] = True


def _closed(what: str) -> RuntimeError:
    return RuntimeError(f"{what} is closed")


# Python wrappers over llama.h structs


class LlamaModel:
    """A loaded model (llama_model) and its vocabulary. ``params`` is a
    ``llama_model_params`` (``llama_model_default_params()``). For everyday use the
    :class:`pyllama.Llama` class is simpler."""

    def __init__(self, *, path_model: str, params: "C.llama_model_params", verbose: bool = True):
        import os

        self.path_model = path_model
        self.params = params
        self.verbose = verbose
        self._exit_stack = ExitStack()
        self.sampler = None  # llama-cpp-python's cleanup code expects these attributes
        self.custom_samplers: list = []
        self.model = None
        self.vocab = None
        if not os.path.exists(path_model):
            raise ValueError(f"Model path does not exist: {path_model}")
        _backend_init_once()
        with _quiet(verbose):
            model = C.llama_model_load_from_file(self.path_model.encode("utf-8"), self.params)
        if model is None:
            raise ValueError(f"Failed to load model from file: {path_model}")
        self.model = model
        self.vocab = C.llama_model_get_vocab(model)

        def free_model():
            if self.model is None:
                return
            C.llama_model_free(self.model)
            self.model = None

        self._exit_stack.callback(free_model)

    @classmethod
    def _view(cls, model, path_model: str, verbose: bool = False) -> "LlamaModel":
        """A LlamaModel over a model loaded elsewhere (a pyllama.Llama's): close() drops
        this object's reference and frees nothing."""
        self = cls.__new__(cls)
        self.path_model, self.params, self.verbose = path_model, None, verbose
        self._exit_stack = ExitStack()
        self.sampler, self.custom_samplers = None, []
        self.model, self.vocab = model, C.llama_model_get_vocab(model)

        def drop():
            self.model = None

        self._exit_stack.callback(drop)
        return self

    def close(self) -> None:
        """Free the model, and first every LlamaContext made from it."""
        self._exit_stack.close()

    def __del__(self):
        stack = getattr(self, "_exit_stack", None)
        if stack is not None:
            stack.close()

    def _m(self):
        if self.model is None:
            raise _closed("LlamaModel")
        return self.model

    def vocab_type(self) -> int:
        return C.llama_vocab_type(self.vocab)

    def n_vocab(self) -> int:
        return C.llama_vocab_n_tokens(self.vocab)

    def n_ctx_train(self) -> int:
        return C.llama_model_n_ctx_train(self._m())

    def n_embd(self) -> int:
        return C.llama_model_n_embd(self._m())

    def rope_freq_scale_train(self) -> float:
        return C.llama_model_rope_freq_scale_train(self._m())

    def desc(self) -> str:
        buf = bytearray(1024)
        n = C.llama_model_desc(self._m(), buf, len(buf))
        return bytes(buf[:max(0, min(n, len(buf)))]).decode("utf-8")

    def size(self) -> int:
        return C.llama_model_size(self._m())

    def n_params(self) -> int:
        return C.llama_model_n_params(self._m())

    def get_tensor(self, name: str):
        raise NotImplementedError("get_tensor is not implemented in llama.cpp")

    # Vocab

    def token_get_text(self, token: int) -> str:
        return C.llama_vocab_get_text(self.vocab, token).decode("utf-8")

    def token_get_score(self, token: int) -> float:
        return C.llama_vocab_get_score(self.vocab, token)

    def token_get_attr(self, token: int) -> int:
        return C.llama_vocab_get_attr(self.vocab, token)

    # Special tokens

    def token_bos(self) -> int:
        return C.llama_vocab_bos(self.vocab)

    def token_eos(self) -> int:
        return C.llama_vocab_eos(self.vocab)

    def token_cls(self) -> int:
        # llama.h: llama_vocab_cls is deprecated in favour of llama_vocab_bos (as upstream)
        return C.llama_vocab_bos(self.vocab)

    def token_sep(self) -> int:
        return C.llama_vocab_sep(self.vocab)

    def token_nl(self) -> int:
        return C.llama_vocab_nl(self.vocab)

    def token_prefix(self) -> int:
        return C.llama_vocab_fim_pre(self.vocab)

    def token_middle(self) -> int:
        return C.llama_vocab_fim_mid(self.vocab)

    def token_suffix(self) -> int:
        return C.llama_vocab_fim_suf(self.vocab)

    def token_eot(self) -> int:
        return C.llama_vocab_eot(self.vocab)

    def add_bos_token(self) -> bool:
        return C.llama_vocab_get_add_bos(self.vocab)

    def add_eos_token(self) -> bool:
        return C.llama_vocab_get_add_eos(self.vocab)

    # Tokenization

    def tokenize(self, text: bytes, add_bos: bool, special: bool) -> List[int]:
        """Token ids of ``text`` (``add_bos``: the model's BOS/EOS as it adds them;
        ``special``: control-token texts become those tokens)."""
        n_max = max(16, len(text) + 2)
        tokens = np.zeros(n_max, dtype=np.int32)
        n = C.llama_tokenize(self.vocab, text, len(text), tokens, n_max, add_bos, special)
        if n < 0:
            tokens = np.zeros(-n, dtype=np.int32)
            n = C.llama_tokenize(self.vocab, text, len(text), tokens, -n, add_bos, special)
            if n < 0:
                raise RuntimeError(f'Failed to tokenize: text="{text!r}" n_tokens={n}')
        return [int(t) for t in tokens[:n]]

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        """The token's bytes (its piece; control tokens are empty unless ``special``)."""
        buf = bytearray(32)
        n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = bytearray(-n)
            n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return bytes(buf[:n])

    def detokenize(self, tokens: List[int], special: bool = False) -> bytes:
        """The pieces of ``tokens`` joined; a space after a leading BOS is dropped (the
        space SPM models print at the start of a text), as llama-cpp-python does."""
        output = b"".join(self.token_to_piece(int(t), special) for t in tokens)
        if len(tokens) > 0 and tokens[0] == self.token_bos() and output[0:1] == b" ":
            return output[1:]
        return output

    # Extra

    def metadata(self) -> Dict[str, str]:
        """Every metadata key and its value as a string (arrays are left out, as in llama.h)."""
        out: Dict[str, str] = {}
        model = self._m()

        def read(f, i):
            size = 1024
            while True:
                buf = bytearray(size)
                n = f(model, i, buf, size)
                if n < size:
                    return bytes(buf[:max(n, 0)]).decode("utf-8")
                size = n + 1

        for i in range(C.llama_model_meta_count(model)):
            out[read(C.llama_model_meta_key_by_index, i)] = read(C.llama_model_meta_val_str_by_index, i)
        return out

    @staticmethod
    def default_params() -> "C.llama_model_params":
        """The default llama_model_params."""
        return C.llama_model_default_params()


class LlamaContext:
    """A context (llama_context: the KV cache and the outputs) over a :class:`LlamaModel`.
    ``params`` is a context params object (``llama_context_default_params()``). Closing
    the model closes its contexts first."""

    def __init__(self, *, model: LlamaModel, params, verbose: bool = True):
        self.model = model
        self.params = params
        self.verbose = verbose
        self._exit_stack = ExitStack()
        self.ctx = None
        self.sampler = None  # llama-cpp-python's cleanup code expects this attribute
        with _quiet(verbose):
            ctx = C.llama_init_from_model(model._m(), params)
        if ctx is None:
            raise ValueError("Failed to create llama_context")
        self.ctx = ctx
        self.memory = C.llama_get_memory(ctx)

        def free_ctx():
            if self.ctx is None:
                return
            C.llama_free(self.ctx)
            self.ctx = None

        self._exit_stack.callback(free_ctx)
        # the context goes before its model
        model._exit_stack.callback(self.close)

    @classmethod
    def _view(cls, model: LlamaModel, ctx, verbose: bool = False) -> "LlamaContext":
        """A LlamaContext over a context made elsewhere (a pyllama.Llama's): close() drops
        this object's reference and frees nothing."""
        self = cls.__new__(cls)
        self.model, self.params, self.verbose = model, None, verbose
        self._exit_stack = ExitStack()
        self.sampler = None
        self.ctx, self.memory = ctx, C.llama_get_memory(ctx)

        def drop():
            self.ctx = None

        self._exit_stack.callback(drop)
        model._exit_stack.callback(self.close)
        return self

    def close(self) -> None:
        self._exit_stack.close()

    def __del__(self):
        stack = getattr(self, "_exit_stack", None)
        if stack is not None:
            stack.close()

    def _c(self):
        if self.ctx is None:
            raise _closed("LlamaContext")
        return self.ctx

    def n_ctx(self) -> int:
        return C.llama_n_ctx(self._c())

    def pooling_type(self) -> int:
        return C.llama_pooling_type(self._c())

    def kv_cache_clear(self) -> None:
        self._c()
        C.llama_memory_clear(self.memory, True)

    def kv_cache_seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        """Remove positions [p0, p1) of ``seq_id`` (seq_id < 0: sequence 0, as
        llama-cpp-python; p0 < 0: 0; p1 < 0: to the end)."""
        self._c()
        seq_id = seq_id if seq_id >= 0 else 0
        return C.llama_memory_seq_rm(self.memory, seq_id, p0, p1)

    def kv_cache_seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int, p1: int) -> None:
        self._c()
        C.llama_memory_seq_cp(self.memory, seq_id_src, seq_id_dst, p0, p1)

    def kv_cache_seq_keep(self, seq_id: int) -> None:
        self._c()
        C.llama_memory_seq_keep(self.memory, seq_id)

    def kv_cache_seq_shift(self, seq_id: int, p0: int, p1: int, shift: int) -> None:
        self._c()
        C.llama_memory_seq_add(self.memory, seq_id, p0, p1, shift)

    def get_state_size(self) -> int:
        return C.llama_state_get_size(self._c())

    def decode(self, batch: "LlamaBatch") -> None:
        """llama_decode; a nonzero return code raises RuntimeError (the reason is logged)."""
        rc = C.llama_decode(self._c(), batch._b())
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def encode(self, batch: "LlamaBatch") -> None:
        rc = C.llama_encode(self._c(), batch._b())
        if rc != 0:
            raise RuntimeError(f"llama_encode returned {rc}")

    def set_n_threads(self, n_threads: int, n_threads_batch: int) -> None:
        C.llama_set_n_threads(self._c(), n_threads, n_threads_batch)

    def get_logits(self) -> npt.NDArray[np.single]:
        """float32 [n_outputs, n_vocab] (a view the next decode overwrites)."""
        return C.llama_get_logits(self._c())

    def get_logits_ith(self, i: int) -> Optional[npt.NDArray[np.single]]:
        return C.llama_get_logits_ith(self._c(), i)

    def get_embeddings(self) -> Optional[npt.NDArray[np.single]]:
        return C.llama_get_embeddings(self._c())

    def get_embeddings_ith(self, i: int) -> Optional[npt.NDArray[np.single]]:
        return C.llama_get_embeddings_ith(self._c(), i)

    def get_embeddings_seq(self, seq_id: int) -> Optional[npt.NDArray[np.single]]:
        return C.llama_get_embeddings_seq(self._c(), seq_id)

    # Sampling functions: deprecated in llama-cpp-python too; use LlamaSampler

    def set_rng_seed(self, seed: int):
        raise NotImplementedError("set_rng_seed is deprecated, use LlamaSampler instead")

    def sample_repetition_penalties(self, candidates, last_tokens_data, penalty_last_n: int, penalty_repeat: float,
                                    penalty_freq: float, penalty_present: float):
        raise NotImplementedError("sample_repetition_penalties is deprecated, use LlamaSampler instead")

    def sample_softmax(self, candidates):
        raise NotImplementedError("sample_softmax is deprecated, use LlamaSampler instead")

    def sample_top_k(self, candidates, k: int, min_keep: int):
        raise NotImplementedError("sample_top_k is deprecated, use LlamaSampler instead")

    def sample_top_p(self, candidates, p: float, min_keep: int):
        raise NotImplementedError("sample_top_p is deprecated, use LlamaSampler instead")

    def sample_min_p(self, candidates, p: float, min_keep: int):
        raise NotImplementedError("sample_min_p is deprecated, use LlamaSampler instead")

    def sample_typical(self, candidates, p: float, min_keep: int):
        raise NotImplementedError("sample_typical is deprecated, use LlamaSampler instead")

    def sample_temp(self, candidates, temp: float):
        raise NotImplementedError("sample_temp is deprecated, use LlamaSampler instead")

    def sample_grammar(self, candidates, grammar: LlamaGrammar):
        raise NotImplementedError("sample_grammar is deprecated, use LlamaSampler instead")

    def sample_token_mirostat(self, candidates, tau: float, eta: float, m: int, mu) -> int:
        raise NotImplementedError("sample_token_mirostat is deprecated, use LlamaSampler instead")

    def sample_token_mirostat_v2(self, candidates, tau: float, eta: float, mu) -> int:
        raise NotImplementedError("sample_token_mirostat_v2 is deprecated, use LlamaSampler instead")

    def sample_token_greedy(self, candidates) -> int:
        raise NotImplementedError("sample_token_greedy is deprecated, use LlamaSampler instead")

    def sample_token(self, candidates) -> int:
        raise NotImplementedError("sample_token is deprecated, use LlamaSampler instead")

    def grammar_accept_token(self, grammar: LlamaGrammar, token: int):
        raise NotImplementedError("grammar_accept_token is deprecated, use LlamaSampler instead")

    def reset_timings(self) -> None:
        C.llama_perf_context_reset(self._c())

    def print_timings(self) -> None:
        C.llama_perf_context_print(self._c())

    @staticmethod
    def default_params():
        """The default llama_context_params."""
        return C.llama_context_default_params()


class LlamaBatch:
    """A llama_batch with room for ``n_tokens`` entries (``embd`` > 0: embeddings of that
    width instead of token ids), each in up to ``n_seq_max`` sequences."""

    def __init__(self, *, n_tokens: int, embd: int, n_seq_max: int, verbose: bool = True):
        self._n_tokens = n_tokens
        self.embd = embd
        self.n_seq_max = n_seq_max
        self.verbose = verbose
        self._exit_stack = ExitStack()
        self.sampler = None  # llama-cpp-python's cleanup code expects this attribute
        self.batch = C.llama_batch_init(self._n_tokens, self.embd, self.n_seq_max)

        def free_batch():
            if self.batch is None:
                return
            C.llama_batch_free(self.batch)
            self.batch = None

        self._exit_stack.callback(free_batch)

    def close(self) -> None:
        self._exit_stack.close()

    def __del__(self):
        stack = getattr(self, "_exit_stack", None)
        if stack is not None:
            stack.close()

    def _b(self):
        if self.batch is None:
            raise _closed("LlamaBatch")
        return self.batch

    def n_tokens(self) -> int:
        return self._b().n_tokens

    def reset(self) -> None:
        self._b().n_tokens = 0

    def _room(self, n0: int, n: int) -> None:
        if n <= 0:
            raise ValueError("LlamaBatch: no tokens given")
        if n0 + n > self._n_tokens:
            raise ValueError(f"LlamaBatch: {n0} + {n} tokens do not fit its {self._n_tokens} entries")
        if self.batch.token is None:
            raise ValueError("LlamaBatch: this is an embeddings batch (embd > 0); it takes no token ids")

    def set_batch(self, batch: Sequence[int], n_past: int, logits_all: bool) -> None:
        """Sequence 0: ``batch`` at positions n_past, n_past + 1, ...; logits for every
        entry with ``logits_all``, else for the last one."""
        b = self._b()
        n = len(batch)
        self._room(0, n)
        b.n_tokens = n
        b.token[:n] = np.asarray(batch, dtype=np.int32)
        b.pos[:n] = np.arange(n_past, n_past + n, dtype=np.int32)
        b.seq_id[:n, 0] = 0
        b.n_seq_id[:n] = 1
        b.logits[:n] = bool(logits_all)
        b.logits[n - 1] = True

    def add_sequence(self, batch: Sequence[int], seq_id: int, logits_all: bool) -> None:
        """Append ``batch`` as sequence ``seq_id`` at positions 0, 1, ...; logits for every
        entry with ``logits_all``, else for its last one."""
        b = self._b()
        n = len(batch)
        n0 = b.n_tokens
        self._room(n0, n)
        b.n_tokens = n0 + n
        b.token[n0:n0 + n] = np.asarray(batch, dtype=np.int32)
        b.pos[n0:n0 + n] = np.arange(n, dtype=np.int32)
        b.seq_id[n0:n0 + n, 0] = seq_id
        b.n_seq_id[n0:n0 + n] = 1
        b.logits[n0:n0 + n] = bool(logits_all)
        b.logits[n0 + n - 1] = True


class LlamaTokenDataArray:
    """All ``n_vocab`` candidates of one logits row: ``candidates_data`` is the (id, logit,
    p) record array, ``candidates`` the llama_token_data_array samplers take
    (:class:`pyllama.sampling.TokenDataArray`). pyllama's samplers replace the arrays of
    ``candidates`` instead of writing into them, so read the result from ``candidates``
    (``ids[selected]``, ...), not from ``candidates_data``."""

    def __init__(self, *, n_vocab: int):
        self.n_vocab = n_vocab
        self.candidates_data = np.recarray(
            (self.n_vocab,), dtype=np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True))
        self.default_candidates_data_id = np.arange(self.n_vocab, dtype=np.intc)
        self.default_candidates_data_p = np.zeros(self.n_vocab, dtype=np.single)
        self.candidates_data.id[:] = self.default_candidates_data_id
        self.candidates_data.logit[:] = 0.0
        self.candidates_data.p[:] = 0.0
        self.candidates = TokenDataArray(self.default_candidates_data_id, self.candidates_data.logit)
        self.sampler = None  # llama-cpp-python's cleanup code expects this attribute

    def copy_logits(self, logits: npt.NDArray[np.single]) -> None:
        """Reset the candidates to every token with ``logits`` (float32 [n_vocab])."""
        logits = np.asarray(logits, dtype=np.single)
        if logits.shape != (self.n_vocab,):
            raise ValueError(f"LlamaTokenDataArray.copy_logits: logits must be [{self.n_vocab}], got {logits.shape}")
        self.candidates_data.id[:] = self.default_candidates_data_id
        self.candidates_data.logit[:] = logits
        self.candidates_data.p[:] = self.default_candidates_data_p
        self.candidates = TokenDataArray(self.default_candidates_data_id, logits)


# Embedding functions


def normalize_embedding(embedding):
    norm = float(np.linalg.norm(embedding))
    if norm == 0.0:
        return embedding
    return [v / norm for v in embedding]


# Python wrappers over common/sampling structs


@dataclass
class LlamaSamplingParams:
    n_prev: int = 64
    n_probs: int = 0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    tfs_z: float = 1.00
    typical_p: float = 1.00
    temp: float = 0.80
    penalty_last_n: int = 64
    penalty_repeat: float = 1.0
    penalty_freq: float = 0.00
    penalty_present: float = 0.00
    mirostat: int = 0
    mirostat_tau: float = 5.00
    mirostat_eta: float = 0.10
    penalize_nl: bool = True

    grammar: str = ""

    cfg_negative_prompt: str = ""
    cfg_scale: float = 1.00

    logit_bias: dict = field(default_factory=dict)


@dataclass
class LlamaSamplingContext:
    """llama-cpp-python's record of sampling state (its ``sample`` is deprecated there
    and raises here too; use :class:`LlamaSampler`)."""

    params: LlamaSamplingParams = field(default_factory=LlamaSamplingParams)
    mirostat_mu: float = 0.0
    grammar: Optional[LlamaGrammar] = None
    prev: list = field(default_factory=list)
    cur: list = field(default_factory=list)

    def reset(self) -> None:
        self.prev = []
        self.cur = []
        if self.grammar is not None:
            self.grammar.reset()

    def cp(self) -> "LlamaSamplingContext":
        return LlamaSamplingContext(params=self.params, mirostat_mu=self.mirostat_mu, grammar=self.grammar,
                                    prev=self.prev.copy(), cur=self.cur.copy())

    def last(self) -> Optional[int]:
        return self.prev[-1] if self.prev else None

    def prev_str(self, ctx_main: LlamaContext, n: int) -> str:
        return ctx_main.model.detokenize(self.prev[-n:]).decode("utf-8")

    def sample(self, ctx_main: LlamaContext, idx: int = 0, logits_array=None):
        raise NotImplementedError("LlamaSamplingContext.sample is deprecated, use LlamaSampler instead")

    def accept(self, ctx_main: LlamaContext, id: int, apply_grammar: bool) -> None:
        self.prev.append(id)


class CustomSampler:
    """A sampler running ``apply_func(cur_p)`` on the candidates, a
    :class:`pyllama.sampling.TokenDataArray` (change ``cur_p.logits`` in place, or replace
    its arrays)."""

    def __init__(self, apply_func: Callable[[TokenDataArray], None]):
        if not callable(apply_func):
            raise TypeError(f"CustomSampler: apply_func must be callable, got {type(apply_func).__name__}")
        self.apply_func = apply_func

        def apply_wrapper(sampler, cur_p):
            # a chain's candidates may view shared, read-only arrays (the context's logits,
            # one arange of ids); llama-cpp-python's custom samplers write in place
            for name in ("ids", "logits", "p"):
                a = getattr(cur_p, name)
                if not a.flags.writeable:
                    setattr(cur_p, name, a.copy())
            self.apply_func(cur_p)

        self._apply_wrapper_ref = apply_wrapper
        self.sampler = C.llama_sampler_init(C.llama_sampler_i(name=lambda s: "custom", apply=apply_wrapper), None)

    def get_sampler(self):
        return self.sampler


class LlamaSampler:
    """A sampler chain (llama_sampler_chain_init) built with the ``add_*`` methods, in the
    order they are called; ``sample(ctx, idx)`` samples logits row ``idx`` of a
    :class:`LlamaContext` and accepts the token."""

    def __init__(self):
        self.sampler = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        self.custom_samplers: List[Tuple[int, CustomSampler]] = []
        self._exit_stack = ExitStack()

        def free_sampler():
            if self.sampler is not None:
                C.llama_sampler_free(self.sampler)
                self.sampler = None

        self._exit_stack.callback(free_sampler)

    def close(self) -> None:
        self._exit_stack.close()

    def __del__(self):
        stack = getattr(self, "_exit_stack", None)
        if stack is not None:
            stack.close()

    def _add(self, smpl) -> None:
        if self.sampler is None:
            raise _closed("LlamaSampler")
        if smpl is None:  # llama_api returned NULL and logged why (a bad grammar, ...)
            raise ValueError("LlamaSampler: the sampler could not be created (see the pyllama log for why)")
        C.llama_sampler_chain_add(self.sampler, smpl)

    def add_greedy(self) -> None:
        self._add(C.llama_sampler_init_greedy())

    def add_dist(self, seed: int) -> None:
        self._add(C.llama_sampler_init_dist(seed))

    def add_softmax(self) -> None:
        import warnings

        warnings.warn("add_softmax is deprecated; llama_sampler_init_dist now samples directly from logits",
                      DeprecationWarning, stacklevel=2)

    def add_top_k(self, k: int) -> None:
        self._add(C.llama_sampler_init_top_k(k))

    def add_top_p(self, p: float, min_keep: int = 1) -> None:
        self._add(C.llama_sampler_init_top_p(p, min_keep))

    def add_min_p(self, p: float, min_keep: int = 1) -> None:
        self._add(C.llama_sampler_init_min_p(p, min_keep))

    def add_typical(self, p: float, min_keep: int = 1) -> None:
        self._add(C.llama_sampler_init_typical(p, min_keep))

    def add_temp(self, temp: float) -> None:
        self._add(C.llama_sampler_init_temp(temp))

    def add_temp_ext(self, t: float, delta: float, exponent: float) -> None:
        self._add(C.llama_sampler_init_temp_ext(t, delta, exponent))

    def add_xtc(self, p: float, t: float, min_keep: int, seed: int) -> None:
        self._add(C.llama_sampler_init_xtc(p, t, min_keep, seed))

    def add_top_n_sigma(self, n: float) -> None:
        self._add(C.llama_sampler_init_top_n_sigma(n))

    def add_mirostat(self, n_vocab: int, seed: int, tau: float, eta: float, m: int) -> None:
        self._add(C.llama_sampler_init_mirostat(n_vocab, seed, tau, eta, m))

    def add_mirostat_v2(self, seed: int, tau: float, eta: float) -> None:
        self._add(C.llama_sampler_init_mirostat_v2(seed, tau, eta))

    def add_grammar(self, model: LlamaModel, grammar: LlamaGrammar) -> None:
        self._add(C.llama_sampler_init_grammar(model.vocab, grammar._grammar.encode("utf-8"),
                                               grammar._root.encode("utf-8")))

    def add_grammar_lazy_patterns(self, model: LlamaModel, grammar: LlamaGrammar, trigger_patterns: List[str],
                                  trigger_tokens: List[int]) -> None:
        self._add(C.llama_sampler_init_grammar_lazy_patterns(
            model.vocab, grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8"),
            [p.encode("utf-8") for p in trigger_patterns], len(trigger_patterns),
            list(trigger_tokens), len(trigger_tokens)))

    def add_penalties(self, n_vocab: int, penalty_last_n: int, penalty_repeat: float, penalty_freq: float,
                      penalty_present: float) -> None:
        self._add(C.llama_sampler_init_penalties(n_vocab, penalty_last_n, penalty_repeat, penalty_freq,
                                                 penalty_present))

    def add_dry(self, model: LlamaModel, dry_multiplier: float, dry_base: float, dry_allowed_length: int,
                dry_penalty_last_n: int, seq_breakers: List[str]) -> None:
        self._add(C.llama_sampler_init_dry(model.vocab, dry_multiplier, dry_base, dry_allowed_length,
                                           dry_penalty_last_n, [s.encode("utf-8") for s in seq_breakers],
                                           len(seq_breakers)))

    def add_logit_bias(self, n_vocab: int, logit_bias: Dict[int, float]) -> None:
        biases = [C.llama_logit_bias(token=int(t), bias=float(b)) for t, b in logit_bias.items()]
        self._add(C.llama_sampler_init_logit_bias(n_vocab, len(biases), biases))

    def add_infill(self, model: LlamaModel) -> None:
        self._add(C.llama_sampler_init_infill(model.vocab))

    def add_custom(self, apply_func: Callable[[TokenDataArray], None]) -> None:
        """A :class:`CustomSampler` running ``apply_func(cur_p)`` at this place of the chain."""
        custom = CustomSampler(apply_func)
        self._add(custom.get_sampler())
        self.custom_samplers.append((C.llama_sampler_chain_n(self.sampler) - 1, custom))

    def get_seed(self) -> int:
        return C.llama_sampler_get_seed(self.sampler)

    def sample(self, ctx: LlamaContext, idx: int = -1) -> int:
        """Sample from logits row ``idx`` of ``ctx`` (< 0: from the last output row) and
        accept the token."""
        return C.llama_sampler_sample(self.sampler, ctx._c(), idx)

    def accept(self, token: int) -> None:
        C.llama_sampler_accept(self.sampler, token)

    def reset(self) -> None:
        C.llama_sampler_reset(self.sampler)

    def clone(self) -> "LlamaSampler":
        """A copy of the chain in its current state (not of one with custom samplers, as
        llama-cpp-python)."""
        if self.custom_samplers:
            raise NotImplementedError("Cannot clone LlamaSampler that contains custom samplers")
        new = LlamaSampler.__new__(LlamaSampler)
        new.sampler = C.llama_sampler_clone(self.sampler)
        new.custom_samplers = []
        new._exit_stack = ExitStack()

        def free_sampler():
            if new.sampler is not None:
                C.llama_sampler_free(new.sampler)
                new.sampler = None

        new._exit_stack.callback(free_sampler)
        return new
