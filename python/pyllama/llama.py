"""``pyllama.Llama``: the high-level class shaped like llama-cpp-python's ``llama_cpp.Llama``
(0.3.36), so code written for it runs by changing the import.

    >>> from pyllama import Llama
    >>> llm = Llama("model.gguf", n_ctx=2048, seed=42)
    >>> llm("The capital of France is", max_tokens=16)["choices"][0]["text"]
    >>> for chunk in llm.create_chat_completion(
    ...         [{"role": "user", "content": "Hi"}], stream=True):
    ...     print(chunk["choices"][0]["delta"].get("content", ""), end="")

Every method takes llama-cpp-python's parameters, by the same names and with the same
defaults, and nothing else: an unknown keyword is a TypeError. A parameter pyllama cannot
honour yet (spm_infill, YaRN overrides, ...) raises NotImplementedError when
given a non-default value, saying what is missing; one that only matters on a GPU logs a warning
once. Results are the same OpenAI-style dicts (``text_completion`` / ``chat.completion`` and
their ``...chunk`` stream forms). Prompt tokens already in the KV cache from the previous
call are not decoded again (longest common prefix), as llama-cpp-python does; with
``set_cache`` a prompt cache (pyllama.llama_cache) extends that across calls and instances.
"""

from __future__ import annotations

import logging
import random
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

from .chat import BUILTIN_TEMPLATES, ChatTemplate, apply_builtin
from .chat import special_text as _token_text
from .generation import Session, StopText, common_prefix, load_model
from .grammar import GrammarError
from .tool_calls import reply_message
from .llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding, draft_tokens
# names llama-cpp-python's llama module has as well (code imports them from llama_cpp.llama)
from .llama_cache import BaseLlamaCache, LlamaCache, LlamaDiskCache, LlamaRAMCache  # noqa: F401
from .llama_grammar import LlamaGrammar  # noqa: F401
from .llama_tokenizer import BaseLlamaTokenizer, LlamaTokenizer  # noqa: F401
from .sampling import LLAMA_DEFAULT_SEED, SamplerParams, TokenDataArray, build_chain, normalize_logit_bias

__all__ = [
    "Llama",
    "LogitsProcessor",
    "LogitsProcessorList",
    "StoppingCriteria",
    "StoppingCriteriaList",
    "MinTokensLogitsProcessor",
    "LlamaDraftModel",
    "LlamaPromptLookupDecoding",
]

log = logging.getLogger("pyllama")

# llama.h's enum values llama-cpp-python uses as defaults (pyllama.llama_api has them all)
LLAMA_SPLIT_MODE_LAYER = 1
LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED = -1
LLAMA_POOLING_TYPE_UNSPECIFIED = -1
LLAMA_ATTENTION_TYPE_UNSPECIFIED = -1

# chat format names for llama.cpp's built-in formats that llama_chat_format does not register
_CHAT_FORMAT_ALIASES = {"phi-3": "phi3"}


# -- logits processors and stopping criteria (llama-cpp-python's semantics) ------------------

LogitsProcessor = Callable[[np.ndarray, np.ndarray], np.ndarray]
StoppingCriteria = Callable[[np.ndarray, np.ndarray], bool]


class LogitsProcessorList(List[LogitsProcessor]):
    """Processors applied in order: each gets (input_ids: intc [n_tokens], scores: single
    [n_vocab]) and returns the new scores."""

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


class StoppingCriteriaList(List[StoppingCriteria]):
    """Generation stops when any criterion, given (input_ids, logits), returns True."""

    def __call__(self, input_ids: np.ndarray, logits: np.ndarray) -> bool:
        return any([criterion(input_ids, logits) for criterion in self])


class MinTokensLogitsProcessor:
    """Forbids ``token_eos`` until ``min_tokens`` tokens follow the prompt (the prompt is
    the input_ids of the first call)."""

    def __init__(self, min_tokens: int, token_eos: int):
        self.min_tokens = min_tokens
        self.token_eos = token_eos
        self.prompt_tokens: Optional[int] = None

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if self.prompt_tokens is None:
            self.prompt_tokens = len(input_ids)
        if len(input_ids) - self.prompt_tokens < self.min_tokens:
            scores[self.token_eos] = -np.inf
        return scores


class _ProcessedSampler:
    """A sampler chain behind llama-cpp-python's logits processors: they see the tokens in
    the KV cache (prompt + generated so far) and a copy of the raw logits row, in that
    order, before the chain (logit bias included) runs."""

    def __init__(self, chain, processors, session: Session):
        self.chain = chain
        self.processors = processors
        self.session = session
        self.upto: Optional[int] = None  # Llama.sample(idx): the tokens up to idx only (drafts after it)

    def sample(self, logits) -> int:
        ids = np.asarray(self.session.tokens[:self.upto], dtype=np.intc)
        scores = np.array(logits, dtype=np.single)
        for p in self.processors:
            scores = p(ids, scores)
        return self.chain.sample(np.ascontiguousarray(scores, dtype=np.float32))


class _GrammarFirstSampler:
    """A sampler chain under a grammar, as llama.cpp's common_sampler_sample: the chain
    picks a token from the raw logits; only when the grammar rejects it are the logits
    masked by the grammar (every token it rejects -> -inf) and the chain run again. The
    chain and the grammar accept only the token finally chosen."""

    def __init__(self, chain, grammar):
        self.chain = chain
        self.grammar = grammar  # pyllama.grammar.GrammarSampler

    def _pick(self, logits):
        cur = TokenDataArray.from_logits(logits)
        self.chain.apply(cur)
        if not (0 <= cur.selected < cur.size):
            raise RuntimeError(f"sampler chain {self.chain.describe()} selected no token")
        return cur, int(cur.ids[cur.selected])

    def sample(self, logits) -> int:
        cur, token = self._pick(logits)
        if not self.grammar.allows(token):
            mask = self.grammar.allowed_mask()
            if not mask.any():
                raise GrammarError("no token of the vocabulary can continue the grammar here "
                                   "(the grammar needs text no token spells)")
            masked = np.where(mask, np.asarray(logits, dtype=np.float32), np.float32(-np.inf)).astype(np.float32)
            cur, token = self._pick(masked)
            if not mask[token]:
                raise GrammarError(f"the sampler chain chose token {token}, which the grammar rejects")
        self.chain.last = cur
        self.chain.accept(token)
        self.grammar.accept(token)
        return token


def _grammar_arg(where: str, grammar: Any) -> Any:
    from .llama_grammar import LlamaGrammar

    if grammar is not None and not isinstance(grammar, LlamaGrammar):
        raise TypeError(f"{where}: grammar must be a LlamaGrammar (LlamaGrammar.from_string(gbnf)), "
                        f"got {type(grammar).__name__}")
    return grammar


def _response_format_grammar(where: str, response_format: Any, grammar: Any) -> Any:
    """llama-cpp-python's response_format: {"type": "json_object"} constrains the reply with
    llama.cpp's json.gbnf (unless a grammar is given); {"type": "json_object", "schema": S}
    (llama-cpp-python) and {"type": "json_schema", "json_schema": {"schema": S}} (OpenAI)
    constrain it with S converted by pyllama.json_schema."""
    if response_format is None:
        return grammar
    if not isinstance(response_format, dict):
        raise TypeError(f"{where}: response_format must be a dict such as {{'type': 'json_object'}}, "
                        f"got {type(response_format).__name__}")
    kind = response_format.get("type", "text")
    if kind == "text":
        return grammar
    schema = None
    if kind == "json_schema":
        js = response_format.get("json_schema")
        if not isinstance(js, dict) or "schema" not in js:
            raise ValueError(f"{where}: response_format type 'json_schema' needs "
                             "{'json_schema': {'schema': {...}}}")
        schema = js["schema"]
    elif kind == "json_object":
        schema = response_format.get("schema")
    else:
        raise ValueError(f"{where}: response_format type {kind!r} is not one of 'text', 'json_object', "
                         "'json_schema'")
    if grammar is not None:
        return grammar
    if schema is not None:
        from .llama_grammar import LlamaGrammar

        return LlamaGrammar.from_json_schema(schema)
    from .llama_grammar import JSON_GBNF, LlamaGrammar

    return LlamaGrammar.from_string(JSON_GBNF)


# -- refusing what is not built, warning about what this machine cannot do ---------------

_warned: set = set()


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning("%s", msg)


def _not_yet(where: str, param: str, value: Any, why: str) -> NotImplementedError:
    return NotImplementedError(f"{where}({param}={value!r}): {why}")


_TFS_WHY = ("tail-free sampling was removed from llama.cpp (llama-cpp-python accepts tfs_z and ignores it); "
            "pass tfs_z=1.0, or use top_p / min_p / typical_p")


class LlamaState:
    """What Llama.save_state returns (llama-cpp-python's class, same fields)."""

    def __init__(self, input_ids: np.ndarray, scores: np.ndarray, n_tokens: int, llama_state: bytes,
                 llama_state_size: int, seed: int):
        self.input_ids = input_ids
        self.scores = scores
        self.n_tokens = n_tokens
        self.llama_state = llama_state
        self.llama_state_size = llama_state_size
        self.seed = seed


@contextmanager
def _quiet(verbose: bool):
    """verbose=False: pyllama's own INFO / WARNING log lines are held back while loading (as
    llama-cpp-python silences llama.cpp's log)."""
    if verbose:
        yield
        return
    prev = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(prev)


class _Tokenizer:
    """llama-cpp-python's LlamaTokenizer over the model's vocabulary."""

    def __init__(self, llama: "Llama"):
        self._vocab = llama._vocab

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return list(self._vocab.tokenize(text, add_special=add_bos, parse_special=special))

    def detokenize(self, tokens: Sequence[int], prev_tokens: Optional[Sequence[int]] = None,
                   special: bool = False) -> bytes:
        if prev_tokens is None:
            return self._pieces(tokens, special)
        prev = self._pieces(prev_tokens, special)
        return self._pieces(list(prev_tokens) + list(tokens), special)[len(prev):]

    def _pieces(self, tokens: Sequence[int], special: bool) -> bytes:
        # llama-cpp-python: the pieces joined, less the leading space SPM models print after BOS
        v = self._vocab
        out = b"".join(v.token_to_piece(int(t), special) for t in tokens)
        if len(tokens) > 0 and int(tokens[0]) == v.bos and out[:1] == b" ":
            return out[1:]
        return out

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos=add_bos, special=special)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")


class Llama:
    """A model and one context (sequence 0), with llama-cpp-python's methods."""

    def __init__(
        self,
        model_path: Union[str, Path],
        *,
        # model
        n_gpu_layers: int = 0,
        split_mode: int = LLAMA_SPLIT_MODE_LAYER,
        main_gpu: int = 0,
        tensor_split: Optional[List[float]] = None,
        vocab_only: bool = False,
        use_mmap: bool = True,
        use_mlock: bool = False,
        kv_overrides: Optional[Dict[str, Union[bool, int, float, str]]] = None,
        # context
        seed: int = LLAMA_DEFAULT_SEED,
        n_ctx: int = 512,
        n_batch: int = 512,
        n_ubatch: int = 512,
        n_threads: Optional[int] = None,
        n_threads_batch: Optional[int] = None,
        rope_scaling_type: Optional[int] = LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED,
        pooling_type: int = LLAMA_POOLING_TYPE_UNSPECIFIED,
        attention_type: int = LLAMA_ATTENTION_TYPE_UNSPECIFIED,
        rope_freq_base: float = 0.0,
        rope_freq_scale: float = 0.0,
        yarn_ext_factor: float = -1.0,
        yarn_attn_factor: float = 1.0,
        yarn_beta_fast: float = 32.0,
        yarn_beta_slow: float = 1.0,
        yarn_orig_ctx: int = 0,
        logits_all: bool = False,
        embedding: bool = False,
        offload_kqv: bool = True,
        flash_attn: bool = False,
        op_offload: Optional[bool] = None,
        swa_full: Optional[bool] = None,
        # sampling
        no_perf: bool = False,
        last_n_tokens_size: int = 64,
        # LoRA
        lora_base: Optional[str] = None,
        lora_scale: float = 1.0,
        lora_path: Optional[str] = None,
        # backend
        numa: Union[bool, int] = False,
        # chat
        chat_format: Optional[str] = None,
        chat_handler: Optional[Callable[..., Any]] = None,
        # speculative decoding
        draft_model: Optional[Any] = None,
        tokenizer: Optional[Any] = None,
        # KV cache types: a GGML_TYPE id, or a name ("f16", "q8_0", ...)
        type_k: Optional[Union[int, str]] = None,
        type_v: Optional[Union[int, str]] = None,
        spm_infill: bool = False,
        # pyllama's: llama.cpp's context shift when a completion fills the context
        context_shift: bool = False,
        n_keep: int = 0,
        verbose: bool = True,
    ):
        """Load ``model_path`` and create a context of ``n_ctx`` tokens (0 = the model's
        training context). ``chat_format``: a name registered in pyllama.llama_chat_format
        (llama-cpp-python's formats and prompt text: chatml, llama-2, llama-3, alpaca, vicuna,
        mistral-instruct, gemma, qwen, zephyr, ...), one of llama.cpp's built-ins pyllama
        renders (phi-3, mistral-v7, llama2-sys, ...), "chat_template.default" /
        "chat_template.NAME" (the model's templates) or a Jinja template text; None chooses
        as llama-cpp-python does (the model's template, or the registered format it is word
        for word; "llama-2" with a warning when the GGUF has none). ``vocab_only`` loads only
        the vocabulary (tokenize / detokenize work; generation does not). ``logits_all`` keeps
        the logits of every token :meth:`eval` decodes in ``scores`` (and is required for
        ``logprobs``, as in llama-cpp-python). ``draft_model`` (a
        :class:`~pyllama.llama_speculative.LlamaDraftModel`) turns on speculative decoding:
        the same output, fewer decode calls when its guesses are right. ``context_shift``
        (pyllama's, off by default as in llama-cpp-python): a completion that fills the
        context goes on as llama.cpp's ``--context-shift`` does (the first ``n_keep`` tokens
        kept, half of the rest dropped, the remaining cells moved down and their keys
        re-rotated); ``max_tokens`` None or <= 0 then means until the end of generation.
        ``n_gpu_layers``, ``split_mode``, ``main_gpu`` and ``tensor_split`` place the GPU
        offload as llama.cpp does (see :meth:`pyllama.model.Model.load`: "layer" spreads the
        offloaded layers over the usable adapters by ``tensor_split``, "none" uses adapter
        ``main_gpu``, "row" is refused); without the GPU backend they have nothing to place.
        """
        where = "Llama"
        # refused: not built yet
        if lora_base is not None:
            # llama.cpp applies an adapter on top of the loaded weights at run time (no
            # merge), so there is no separate base to compute with; llama-cpp-python 0.3.36
            # stores lora_base and never reads it
            raise ValueError(f"{where}: lora_base={lora_base!r} is not used by llama.cpp (adapters are applied at "
                             "run time on top of the loaded model's weights); load the model you want the adapter "
                             "applied to as model_path and leave lora_base None")
        if lora_path is not None and vocab_only:
            raise ValueError(f"{where}: lora_path needs the model's weights, but vocab_only=True loads none")
        if draft_model is not None and not callable(draft_model):
            raise TypeError(f"{where}: draft_model must be a LlamaDraftModel (such as "
                            f"LlamaPromptLookupDecoding()) or None, got {type(draft_model).__name__}")
        if not isinstance(context_shift, bool):
            raise TypeError(f"{where}: context_shift must be True or False, got {context_shift!r}")
        if isinstance(n_keep, bool) or not isinstance(n_keep, int) or n_keep < -1:
            raise ValueError(f"{where}: n_keep must be an integer >= -1 (-1: the whole prompt), got {n_keep!r}")
        if context_shift and draft_model is not None:
            raise ValueError(f"{where}: context_shift and draft_model cannot be combined (a shift moves the cells "
                             "a speculative step verifies)")
        self._context_shift, self._n_keep = context_shift, n_keep
        if spm_infill:
            raise _not_yet(where, "spm_infill", spm_infill, "fill-in-the-middle prompts (prefix/suffix/middle "
                           "tokens) are not implemented in pyllama yet")
        yarn = {"yarn_ext_factor": (yarn_ext_factor, -1.0), "yarn_attn_factor": (yarn_attn_factor, 1.0),
                "yarn_beta_fast": (yarn_beta_fast, 32.0), "yarn_beta_slow": (yarn_beta_slow, 1.0),
                "yarn_orig_ctx": (yarn_orig_ctx, 0)}
        for name, (v, default) in yarn.items():
            if v != default:
                raise _not_yet(where, name, v, "YaRN overrides are not supported by pyllama yet (the model's "
                               "own rope scaling is used); leave the yarn_* parameters at their defaults")
        # not possible on this machine: a warning, once
        from . import gpu as _gpu

        # a GPU runs the layers only when the backend is built and an adapter is usable; then
        # -1 (llama-cpp-python's "all") offloads everything; otherwise -1 is silent (as a CPU
        # build of llama.cpp) and a positive count warns once
        gpu_ok = bool(n_gpu_layers) and not vocab_only and _gpu.available()
        if n_gpu_layers is not None and n_gpu_layers > 0 and not gpu_ok:
            _warn_once("n_gpu_layers", f"Llama(n_gpu_layers={n_gpu_layers}): {_gpu.why_not()}; every layer "
                       "runs on the CPU")
        if numa:
            _warn_once("numa", f"Llama(numa={numa!r}): pyllama sets no NUMA policy; threads are not pinned")

        self.verbose = verbose
        self.model_path = str(model_path)
        if not Path(self.model_path).exists():
            raise ValueError(f"Model path does not exist: {model_path}")
        self._init_kwargs = dict(
            n_gpu_layers=n_gpu_layers, split_mode=split_mode, main_gpu=main_gpu, tensor_split=tensor_split,
            vocab_only=vocab_only, use_mmap=use_mmap, use_mlock=use_mlock, kv_overrides=kv_overrides,
            seed=seed, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads,
            n_threads_batch=n_threads_batch, rope_scaling_type=rope_scaling_type, pooling_type=pooling_type,
            attention_type=attention_type, rope_freq_base=rope_freq_base, rope_freq_scale=rope_freq_scale,
            logits_all=logits_all, offload_kqv=offload_kqv, flash_attn=flash_attn, op_offload=op_offload,
            swa_full=swa_full, no_perf=no_perf, last_n_tokens_size=last_n_tokens_size, numa=numa,
            chat_format=chat_format, chat_handler=chat_handler, type_k=type_k, type_v=type_v, verbose=verbose,
            lora_base=lora_base, lora_scale=lora_scale, lora_path=lora_path,
            draft_model=draft_model)
        load_mode = "mmap+mlock" if (use_mmap and use_mlock) else (
            "mlock" if use_mlock else ("mmap" if use_mmap else "none"))
        t0 = time.perf_counter()
        with _quiet(verbose):
            from .model import Model

            # with the GPU backend built, the load itself says (once) when no adapter is usable
            ngl = int(n_gpu_layers or 0) if gpu_ok else 0
            self._model = Model.load(self.model_path, load_mode=load_mode, vocab_only=vocab_only,
                                     kv_overrides=kv_overrides, n_gpu_layers=ngl, main_gpu=int(main_gpu),
                                     split_mode=split_mode, tensor_split=tensor_split)
            from .generation import vocab_of

            self._vocab = vocab_of(self._model)
            self._session: Optional[Session] = None
            self.n_batch = min(n_ctx, n_batch) if n_ctx else n_batch
            if not vocab_only:
                cparams: dict[str, Any] = {"n_ctx": n_ctx, "n_batch": self.n_batch,
                                           "n_ubatch": min(n_ubatch, self.n_batch), "no_perf": no_perf,
                                           "pooling_type": pooling_type, "attention_type": attention_type,
                                           "rope_freq_base": rope_freq_base, "rope_freq_scale": rope_freq_scale,
                                           "rope_scaling_type": (LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED
                                                                 if rope_scaling_type is None else rope_scaling_type),
                                           "offload_kqv": offload_kqv}
                if n_threads is not None:
                    cparams["n_threads"] = n_threads
                if n_threads_batch is not None or n_threads is not None:
                    cparams["n_threads_batch"] = n_threads_batch if n_threads_batch is not None else n_threads
                if type_k is not None:
                    cparams["type_k"] = type_k
                if type_v is not None:
                    cparams["type_v"] = type_v
                if flash_attn:
                    cparams["flash_attn_type"] = 1
                if swa_full is not None:
                    cparams["swa_full"] = swa_full
                if op_offload is not None:
                    cparams["op_offload"] = op_offload
                if embedding:
                    # embed() packs several inputs (one sequence each) into a decode; one
                    # unified cache lets each use the whole context
                    cparams.update(embeddings=True, n_seq_max=64, kv_unified=True)
                self._session = Session(self._model, **cparams)
                if lora_path is not None:
                    # as llama-cpp-python: one adapter, lora_scale, set before any decode
                    from .adapter import LoraAdapter

                    self._lora_adapter = LoraAdapter(self._model, lora_path)
                    self._session.ctx.set_lora_adapters([(self._lora_adapter, lora_scale)])
            else:
                # llama.cpp gives a vocab-only model a context too: no KV cache, no decode
                from .context import Context

                self._vocab_ctx = Context(self._model, n_ctx=n_ctx, n_batch=self.n_batch)
        if verbose:
            n = self._session.n_ctx if self._session else 0
            print(f"pyllama: loaded {self.model_path} ({self._model.desc}) in "
                  f"{time.perf_counter() - t0:.2f} s, n_ctx = {n}, n_vocab = {len(self._vocab)}", file=sys.stderr)
        self.n_gpu_layers = n_gpu_layers
        self._embedding = bool(embedding)
        self._seed = seed or LLAMA_DEFAULT_SEED
        self._logits_all = bool(logits_all)
        self.last_n_tokens_size = last_n_tokens_size
        self.chat_format = chat_format
        self.chat_handler = chat_handler
        self._chat_fallback = False  # no template in the GGUF: "llama-2" was chosen (warned at first use)
        if chat_format is None and chat_handler is None:
            # llama-cpp-python's choice: a known template word for word -> its registered
            # format, another template -> the template itself, none -> "llama-2"
            from .llama_chat_format import guess_chat_format_from_gguf_metadata

            tmpl = self._model.chat_template()
            if tmpl:
                self.chat_format = (guess_chat_format_from_gguf_metadata({"tokenizer.chat_template": tmpl})
                                    or "chat_template.default")
            else:
                self.chat_format, self._chat_fallback = "llama-2", True
            if verbose:
                print(f"pyllama: chat format {self.chat_format}" + (" (the GGUF has no chat template)"
                                                                    if self._chat_fallback else ""), file=sys.stderr)
        self.draft_model = draft_model
        self.cache = None
        self.lora_base, self.lora_scale, self.lora_path = lora_base, lora_scale, lora_path
        self.spm_infill = spm_infill
        self.tokenizer_ = tokenizer or _Tokenizer(self)
        self._chat_template: Optional[ChatTemplate] = None
        self._sampler = None  # the chain of a running generate()
        self._requires_eval = True  # the context's last logits are not those of input_ids[-1]
        self._rows_at: Optional[int] = None  # position of ctx.logits[0] after an all-rows _eval
        # every architecture pyllama runs is a transformer (no recurrent state)
        self._is_recurrent = False
        self._is_hybrid = False
        self._n_vocab = len(self._vocab)
        self._n_ctx = self._session.n_ctx if self._session else 0
        self.scores: np.ndarray = np.ndarray(
            ((self._n_ctx if logits_all else self.n_batch) if self._session else 0, self._n_vocab),
            dtype=np.single)
        self.metadata = {k: str(v) for k, v in self._model.metadata.items() if not isinstance(v, (list, tuple))}

    # -- the model and its vocabulary -------------------------------------------------

    @property
    def model(self):
        """The :class:`pyllama.Model`."""
        return self._model

    @property
    def ctx(self):
        """The :class:`pyllama.Context` (for a vocab_only model an empty one, as llama.cpp
        makes: it has no KV cache and cannot decode)."""
        return self._session.ctx if self._session else self._vocab_ctx

    @property
    def _ctx(self):
        """llama-cpp-python's ``Llama._ctx``: a :class:`pyllama.internals.LlamaContext` over
        this Llama's context (``_ctx.ctx`` is :attr:`ctx`; closing it frees nothing)."""
        ctx = self.ctx
        view = getattr(self, "_ctx_view", None)
        if view is None or view.ctx is not ctx:
            from .internals import LlamaContext, LlamaModel

            view = LlamaContext._view(LlamaModel._view(self._model, self.model_path), ctx)
            self._ctx_view = view
        return view

    def _sess(self) -> Session:
        if self._session is None:
            raise RuntimeError("this Llama was created with vocab_only=True: it can tokenize and detokenize "
                               "but has no context to decode with")
        return self._session

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> List[int]:
        """Token ids of ``text`` (BOS first when ``add_bos`` and the model adds one)."""
        return self.tokenizer_.tokenize(text, add_bos, special)

    def detokenize(self, tokens: List[int], prev_tokens: Optional[List[int]] = None,
                   special: bool = False) -> bytes:
        """The bytes of ``tokens``; with ``prev_tokens``, only what ``tokens`` adds after them."""
        return self.tokenizer_.detokenize(tokens, prev_tokens=prev_tokens, special=special)

    def tokenizer(self) -> "LlamaTokenizer":
        return LlamaTokenizer(self)

    def n_ctx(self) -> int:
        return self._n_ctx

    def n_vocab(self) -> int:
        return self._n_vocab

    def n_embd(self) -> int:
        return int(self._model.n_embd)

    def token_eos(self) -> int:
        return int(self._vocab.eos)

    def token_bos(self) -> int:
        return int(self._vocab.bos)

    def token_nl(self) -> int:
        return int(self._vocab.nl)

    def pooling_type(self) -> int:
        return int(self._sess().ctx.pooling_type)

    # -- state ------------------------------------------------------------------------

    @property
    def n_tokens(self) -> int:
        """Tokens in the KV cache (sequence 0)."""
        return len(self._session.tokens) if self._session else 0

    @property
    def input_ids(self) -> np.ndarray:
        """intc [n_ctx]: the tokens in the KV cache, then zeros (a copy)."""
        out = np.zeros(self._n_ctx, dtype=np.intc)
        if self._session:
            out[: len(self._session.tokens)] = self._session.tokens
        return out

    @property
    def _input_ids(self) -> np.ndarray:
        return np.asarray(self._session.tokens if self._session else [], dtype=np.intc)

    @property
    def _scores(self) -> np.ndarray:
        return self.scores[: self.n_tokens, :]

    @property
    def eval_tokens(self):
        from collections import deque

        return deque(self._input_ids.tolist(), maxlen=self._n_ctx)

    def reset(self) -> None:
        """Forget the KV cache (the next call decodes its whole prompt)."""
        if self._session:
            self._session.reset()
        self._requires_eval = True
        self._rows_at = None

    def set_seed(self, seed: int) -> None:
        """The seed of the next sampling call that gives none (each such call then draws the
        following one from it, as llama-cpp-python does)."""
        self._seed = seed

    def set_cache(self, cache) -> None:
        """Use a prompt cache (:class:`pyllama.llama_cache.LlamaRAMCache` or
        ``LlamaDiskCache``), or None for none: each completion starts from the cached state
        sharing the longest prefix with its prompt and stores its own state afterwards."""
        from .llama_cache import BaseLlamaCache

        if cache is not None and not isinstance(cache, BaseLlamaCache):
            raise TypeError(f"Llama.set_cache: cache must be a LlamaRAMCache / LlamaDiskCache or None, "
                            f"got {type(cache).__name__}")
        self.cache = cache

    def _cache_lookup(self, prompt_tokens: list) -> None:
        """Load the cached state that shares more of the prompt than the context holds."""
        if self.cache is None:
            return
        try:
            item = self.cache[prompt_tokens]
        except KeyError:
            if self.verbose:
                print("Llama._create_completion: cache miss", file=sys.stderr)
            return
        ids = np.asarray(item.input_ids)[: int(item.n_tokens)].tolist()
        if Llama.longest_token_prefix(ids, prompt_tokens) > Llama.longest_token_prefix(self._sess().tokens,
                                                                                       prompt_tokens):
            self.load_state(item)
            if self.verbose:
                print("Llama._create_completion: cache hit", file=sys.stderr)

    def _cache_store(self) -> None:
        if self.cache is None or self._session is None or not self._session.tokens:
            return
        if self.verbose:
            print("Llama._create_completion: cache save", file=sys.stderr)
        self.cache[list(self._session.tokens)] = self.save_state()

    def save_state(self) -> "LlamaState":
        """The KV cache, the last logits, the cached tokens and the seed, for load_state
        (llama-cpp-python's LlamaState)."""
        ctx = self._sess().ctx
        data = ctx.save_state()
        if self.verbose:
            print(f"Llama.save_state: saving {len(data)} bytes of llama state", file=sys.stderr)
        return LlamaState(input_ids=self.input_ids.copy(), scores=self._scores.copy(), n_tokens=self.n_tokens,
                          llama_state=data, llama_state_size=len(data), seed=self._seed)

    def load_state(self, state: "LlamaState") -> None:
        """Restore a save_state() result. A state from another model or context layout
        raises RuntimeError (from pyllama.StateError) and changes nothing."""
        from .errors import StateError

        sess = self._sess()
        try:
            n_tokens = int(state.n_tokens)
            ids = np.asarray(state.input_ids)
            scores = np.asarray(state.scores, dtype=np.single)
            data = bytes(state.llama_state)[: int(state.llama_state_size)]
        except (AttributeError, TypeError, ValueError) as e:
            raise TypeError(f"Llama.load_state: state must be a LlamaState (from save_state), got "
                            f"{type(state).__name__} ({e})") from None
        if not 0 <= n_tokens <= min(self._n_ctx, ids.shape[0] if ids.ndim == 1 else -1):
            raise ValueError(f"Llama.load_state: n_tokens = {n_tokens} does not fit input_ids / n_ctx = {self._n_ctx}")
        if scores.ndim != 2 or scores.shape[1] != self._n_vocab:
            raise ValueError(f"Llama.load_state: scores must be [n, n_vocab = {self._n_vocab}], got {scores.shape}")
        try:
            sess.ctx.load_state(data)
        except StateError as e:
            raise RuntimeError(f"Failed to set llama state data: {e}") from e
        # the context took it: now the Python side (nothing above changed it)
        n_sc = min(scores.shape[0], self.scores.shape[0])
        self.scores[:n_sc, :] = scores[:n_sc]
        rest = self.scores[n_sc:, :]
        rest[rest > 0] = 0.0
        sess.tokens = [int(t) for t in ids[:n_tokens]]
        self._requires_eval = True
        self._rows_at = None
        self._seed = state.seed

    def close(self) -> None:
        if self._session is not None:
            close = getattr(self._session.ctx, "close", None)
            if close:
                close()

    def __enter__(self) -> "Llama":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self):
        return {"model_path": self.model_path, **self._init_kwargs, "seed": self._seed}

    def __setstate__(self, state):
        self.__init__(**state)

    # -- low-level loop: eval / sample / generate ---------------------------------------

    def eval(self, tokens: Sequence[int]) -> None:
        """Decode ``tokens`` after the cached ones (in n_batch pieces); with logits_all the
        logits of each land in ``scores``."""
        self._eval(tokens, self._logits_all)

    def _truncate(self, sess, keep: int) -> None:
        """Make the cache hold the first ``keep`` tokens. A recurrent state cannot lose its
        last tokens (seq_rm returns false, as llama.cpp's): it is rebuilt from them."""
        if sess.ctx.seq_rm(0, keep, -1):
            del sess.tokens[keep:]
        else:
            hist = sess.tokens[:keep]
            sess.reset()
            self._eval(hist, False)
        self._requires_eval = True

    def _eval(self, tokens: Sequence[int], all_rows: bool) -> None:
        """eval(); ``all_rows`` keeps the last piece's logits for every token in the context
        (a draft's verification reads them through _row) even without logits_all."""
        sess = self._sess()
        toks = [int(t) for t in tokens]
        for i, t in enumerate(toks):
            if not 0 <= t < self._n_vocab:
                raise ValueError(f"token {i} = {t} is not a valid id (n_vocab = {self._n_vocab})")
        n = self.n_tokens
        if n + len(toks) > self._n_ctx:
            from .errors import ContextFullError

            raise ContextFullError(f"{n} cached + {len(toks)} new tokens exceed n_ctx = {self._n_ctx}")
        for i in range(0, len(toks), self.n_batch):
            chunk = np.asarray(toks[i:i + self.n_batch], dtype=np.int32)
            self._rows_at = None
            sess.ctx.decode(chunk, logits_all=all_rows or self._logits_all)
            if self._logits_all:
                self.scores[n:n + len(chunk)] = sess.ctx.logits
            if all_rows:
                self._rows_at = n  # ctx.logits[j] belongs to position n + j
            sess.tokens.extend(int(t) for t in chunk)
            n += len(chunk)
            self._requires_eval = False

    def _chain(self, *, top_k=40, top_p=0.95, min_p=0.05, typical_p=1.0, temp=0.80, repeat_penalty=1.0,
               frequency_penalty=0.0, presence_penalty=0.0, tfs_z=1.0, mirostat_mode=0, mirostat_eta=0.1,
               mirostat_tau=5.0, penalize_nl=True, logits_processor=None, grammar=None, logit_bias=None,
               where="Llama.sample"):
        grammar = _grammar_arg(where, grammar)
        if tfs_z != 1.0:
            raise _not_yet(where, "tfs_z", tfs_z, _TFS_WHY)
        if not penalize_nl:
            raise _not_yet(where, "penalize_nl", penalize_nl, "llama.cpp's penalties sampler no longer exempts "
                           "newlines (llama-cpp-python ignores it); use logit_bias on token_nl() instead")
        sess = self._sess()
        params = SamplerParams(
            seed=self._seed, temp=temp, top_p=top_p, top_k=top_k, min_p=min_p, typ_p=typical_p,
            penalty_last_n=self.last_n_tokens_size, penalty_repeat=repeat_penalty,
            penalty_freq=frequency_penalty, penalty_present=presence_penalty, mirostat=mirostat_mode,
            mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta,
            logit_bias=dict(_check_logit_bias(logit_bias, self._n_vocab)), no_perf=True)
        chain = build_chain(params, n_vocab=self._n_vocab, vocab=self._vocab)
        if grammar is not None:
            chain = _GrammarFirstSampler(chain, grammar.sampler(self._vocab))
        if logits_processor:
            if not all(callable(p) for p in logits_processor):
                raise TypeError("logits_processor must be a list of callables (input_ids, scores) -> scores")
            return _ProcessedSampler(chain, list(logits_processor), sess)
        return chain

    def _row(self, idx: Optional[int]) -> np.ndarray:
        sess = self._sess()
        if self.n_tokens == 0:
            raise RuntimeError("nothing decoded yet: call eval(tokens) before sample()")
        if idx is None or idx == self.n_tokens - 1:
            if self._requires_eval:
                raise RuntimeError("the context's logits are stale (reset or truncated): eval() first")
            return sess.ctx.logits_ith(-1)
        if self._logits_all and 0 <= idx < self.n_tokens:
            return self.scores[idx]
        if self._rows_at is not None and self._rows_at <= idx < self.n_tokens:
            return sess.ctx.logits[idx - self._rows_at]
        raise ValueError(f"sample(idx={idx}): only the last decoded token ({self.n_tokens - 1}) has logits; "
                         "create the Llama with logits_all=True to sample at earlier positions")

    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
               presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
               mirostat_eta: float = 0.1, mirostat_tau: float = 5.0, penalize_nl: bool = True,
               logits_processor: Optional[LogitsProcessorList] = None, grammar: Optional[Any] = None,
               idx: Optional[int] = None) -> int:
        """Sample a token from the logits at position ``idx`` (default: the last decoded)."""
        sampler = self._sampler or self._chain(
            top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p, temp=temp, repeat_penalty=repeat_penalty,
            frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, tfs_z=tfs_z,
            mirostat_mode=mirostat_mode, mirostat_eta=mirostat_eta, mirostat_tau=mirostat_tau,
            penalize_nl=penalize_nl, logits_processor=logits_processor, grammar=grammar)
        if isinstance(sampler, _ProcessedSampler):
            # the processors see the tokens up to the one sampled after (not a draft's guesses)
            sampler.upto = None if idx is None else idx + 1
        return sampler.sample(self._row(idx))

    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor: Optional[LogitsProcessorList] = None,
                 stopping_criteria: Optional[StoppingCriteriaList] = None, grammar: Optional[Any] = None):
        """Yield sampled tokens after ``tokens`` without end (the caller stops; end-of-generation
        tokens are yielded too). ``send(list_of_tokens)`` appends tokens after the yielded one.
        With ``reset``, the cached prefix shared with ``tokens`` is kept and the rest dropped.
        With a ``draft_model``, each sampled token is decoded together with the draft's guess
        after it; guesses are kept while the sampler picks them and the rest are removed from
        the KV cache, so the tokens yielded are the same as without the draft."""
        chain = self._chain(
            top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p, temp=temp, repeat_penalty=repeat_penalty,
            frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, tfs_z=tfs_z,
            mirostat_mode=mirostat_mode, mirostat_eta=mirostat_eta, mirostat_tau=mirostat_tau,
            penalize_nl=penalize_nl, logits_processor=logits_processor, grammar=grammar, where="Llama.generate")
        return self._generate(list(tokens), chain, reset, stopping_criteria)

    def _generate(self, tokens: list, chain, reset: bool, stopping_criteria):
        sess = self._sess()
        if reset and self.n_tokens > 0:
            prefix = Llama.longest_token_prefix(sess.tokens, tokens)
            if prefix == len(tokens) == self.n_tokens and not self._requires_eval:
                reset, tokens = False, []  # the whole prompt is cached with its logits
            else:
                keep = prefix - 1 if prefix == len(tokens) else prefix
                # a recurrent state cannot drop its last tokens (seq_rm returns false, as
                # llama.cpp's): then the whole prompt is decoded again
                if keep > 0 and sess.ctx.seq_rm(0, keep, -1):
                    del sess.tokens[keep:]
                    self._requires_eval = True
                    reset, tokens = False, tokens[keep:]
        if reset:
            self.reset()
        sample_idx = self.n_tokens + len(tokens) - 1
        self._sampler = chain
        draft = self.draft_model
        verifying = False  # the prompt needs its last row only; a draft needs every row
        last = None  # the last token yielded
        try:
            while True:
                self._eval(tokens, self._logits_all or verifying)
                while sample_idx < self.n_tokens:
                    token = self.sample(idx=sample_idx)
                    row = self._row(sample_idx)
                    sample_idx += 1
                    if stopping_criteria is not None and stopping_criteria(self._input_ids[:sample_idx], row):
                        return
                    last = token
                    more = yield token
                    tokens = [token] + (list(more) if more is not None else [])
                    # a guess the sampler did not pick (or tokens sent after one it did):
                    # drop the guesses from here on
                    if sample_idx < self.n_tokens and (token != sess.tokens[sample_idx] or len(tokens) > 1):
                        self._truncate(sess, sample_idx)
                        break
                if draft is not None:
                    n_max = min(self._n_ctx - self.n_tokens, self.n_batch) - len(tokens)
                    hist = np.asarray(sess.tokens + tokens, dtype=np.intc)
                    tokens.extend(draft_tokens(draft, hist, n_max, self._n_vocab))
                    verifying = True
        finally:
            self._sampler = None
            if draft is not None and sample_idx < self.n_tokens:
                # closed while verifying: keep the guesses up to the last token yielded only
                keep = sample_idx + 1 if sess.tokens[sample_idx] == last else sample_idx
                if keep < self.n_tokens:
                    self._truncate(sess, keep)

    # -- completion ------------------------------------------------------------------

    def _next_seed(self, seed: Optional[int]) -> None:
        """llama-cpp-python: an explicit seed becomes the Llama's seed; otherwise the next
        seed is drawn from the current one (so calls differ, reproducibly)."""
        if seed is not None:
            self.set_seed(seed)
        else:
            self.set_seed(random.Random(self._seed).randint(0, 2**32))

    def _completion_tokens(self, prompt: Union[str, bytes, Sequence[int]], add_bos: bool = True,
                           special: bool = True) -> list[int]:
        if isinstance(prompt, (str, bytes)):
            return self.tokenize(prompt if isinstance(prompt, bytes) else prompt.encode("utf-8"),
                                 add_bos=add_bos, special=special)
        return [int(t) for t in prompt]

    def _stream_text(self, prompt_tokens: list[int], max_tokens: Optional[int], stop, sampler,
                     stopping_criteria=None, record=None) -> Iterator[tuple[str, Optional[str]]]:
        """Yield (text, finish_reason) pieces: text is safe to show (never part of a stop
        string or a split UTF-8 character); the last item carries the finish reason.
        ``record(token, logits_row)`` sees each generated token kept in the output."""
        sess = self._sess()
        if max_tokens is None or max_tokens <= 0:
            max_tokens = -1 if self._context_shift else sess.n_ctx - len(prompt_tokens)
        if len(prompt_tokens) >= sess.n_ctx:
            raise ValueError(f"Requested tokens ({len(prompt_tokens)}) exceed context window of {sess.n_ctx}")
        out = StopText(sess.vocab, _check_stop(stop))
        self._cache_lookup(prompt_tokens)
        self._requires_eval = True
        self._rows_at = None
        n_keep = len(prompt_tokens) if self._n_keep == -1 else self._n_keep
        gen = sess.generate(prompt_tokens, sampler, max_tokens, draft=self.draft_model,
                            shift=self._context_shift, n_keep=n_keep)
        criterion_hit = False
        try:
            for tok in gen:
                if stopping_criteria is not None or record is not None:
                    row = sess.logits()
                    # llama-cpp-python asks after sampling, before the token is kept
                    if stopping_criteria is not None and stopping_criteria(
                            np.asarray(sess.tokens, dtype=np.intc), row):
                        criterion_hit = True
                        break
                    if record is not None:
                        record(tok, row)
                piece = out.feed(tok)
                if piece:
                    yield piece, None
                if out.stopped:
                    break
        finally:
            gen.close()
        self._cache_store()
        piece = out.finish()
        if piece:
            yield piece, None
        finish = "stop" if (out.stopped or criterion_hit or sess.stats.stop_reason == "eog") else "length"
        yield "", finish

    def _check_completion_args(self, where, *, tfs_z, grammar, logprobs, echo, stream, stop, logit_bias,
                               stopping_criteria, logits_processor, suffix):
        _grammar_arg(where, grammar)
        if tfs_z != 1.0:
            raise _not_yet(where, "tfs_z", tfs_z, _TFS_WHY)
        if logprobs is not None:
            # llama-cpp-python: a draft model turns logits_all on
            if not self._logits_all and self.draft_model is None:
                raise ValueError("logprobs is not supported for models created with logits_all=False")
            if isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 0:
                raise TypeError(f"logprobs must be an int >= 0 (the number of top tokens) or None, got {logprobs!r}")
            if echo or stream:
                raise _not_yet(where, "logprobs", logprobs, "logprobs together with echo=True or stream=True "
                               "is not implemented in pyllama yet; use echo=False, stream=False")
        if suffix is not None and not isinstance(suffix, str):
            raise TypeError(f"suffix must be a str or None, got {type(suffix).__name__}")
        for name, v in (("stopping_criteria", stopping_criteria), ("logits_processor", logits_processor)):
            if v is not None and not all(callable(c) for c in v):
                raise TypeError(f"{name} must be a list of callables (input_ids, scores) -> ...")
        _check_stop(stop)
        _check_logit_bias(logit_bias, self._n_vocab)

    def create_completion(
        self,
        prompt: Union[str, List[int]],
        suffix: Optional[str] = None,
        max_tokens: Optional[int] = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        logprobs: Optional[int] = None,
        echo: bool = False,
        stop: Optional[Union[str, List[str]]] = [],
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        top_k: int = 40,
        stream: bool = False,
        seed: Optional[int] = None,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: Optional[str] = None,
        stopping_criteria: Optional[StoppingCriteriaList] = None,
        logits_processor: Optional[LogitsProcessorList] = None,
        grammar: Optional[Any] = None,
        logit_bias: Optional[Dict[int, float]] = None,
    ):
        """Complete ``prompt``; a ``text_completion`` dict, or an iterator of chunks with
        ``stream=True``. ``max_tokens`` None or <= 0 generates until the context is full.
        ``logprobs=N`` (needs logits_all=True) adds each generated token's log-probability
        and the N most likely alternatives (from the model's logits, before sampling)."""
        # argument checks here, before any work (a stream=True call is a generator: checks
        # in it would only fail at the first next())
        self._check_completion_args("Llama.create_completion", tfs_z=tfs_z, grammar=grammar, logprobs=logprobs,
                                    echo=echo, stream=stream, stop=stop, logit_bias=logit_bias,
                                    stopping_criteria=stopping_criteria, logits_processor=logits_processor,
                                    suffix=suffix)
        self._sess()
        prompt_tokens = self._completion_tokens(prompt)
        self._next_seed(seed)
        sampler = self._chain(
            temp=temperature, top_p=top_p, top_k=top_k, min_p=min_p, typical_p=typical_p,
            repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty, mirostat_mode=mirostat_mode,
            mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, logit_bias=logit_bias,
            logits_processor=logits_processor, grammar=grammar, where="Llama.create_completion")
        cid = f"cmpl-{uuid.uuid4()}"
        created = int(time.time())
        model_name = model or self.model_path
        prompt_text = prompt if isinstance(prompt, str) else (
            prompt.decode("utf-8", "replace") if isinstance(prompt, bytes)
            else self.detokenize(prompt_tokens).decode("utf-8", "replace"))
        recorded: list = []
        record = None if logprobs is None else self._logprob_recorder(logprobs, recorded)
        pieces = self._stream_text(prompt_tokens, max_tokens, stop, sampler, stopping_criteria, record)

        def usage():
            n = self._session.stats.n_gen
            return {"prompt_tokens": len(prompt_tokens), "completion_tokens": n,
                    "total_tokens": len(prompt_tokens) + n}

        def chunk(text, finish):
            return {"id": cid, "object": "text_completion", "created": created, "model": model_name,
                    "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}

        if stream:
            def gen():
                if echo:
                    yield chunk(prompt_text, None)
                for text, finish in pieces:
                    if finish is None:
                        yield chunk(text, None)
                    else:
                        c = chunk(text, finish)
                        c["usage"] = usage()
                        yield c
            return gen()
        out, finish = [], None
        for text, f in pieces:
            out.append(text)
            finish = f if f is not None else finish
        text = "".join(out)
        if echo:
            text = prompt_text + text
        if suffix:
            text += suffix
        c = chunk(text, finish)
        if logprobs is not None:
            c["choices"][0]["logprobs"] = self._logprobs_dict(prompt_tokens, recorded, len(prompt_text))
        c["usage"] = usage()
        return c

    @staticmethod
    def _logprob_recorder(n_top: int, recorded: list):
        """A _stream_text ``record``: appends (token, its log-probability, the ``n_top``
        most likely (token, log-probability)) to ``recorded``, from the model's logits."""
        def record(tok, row):
            lp = Llama.logits_to_logprobs(row)
            top = np.argsort(-lp, kind="stable")[:n_top]
            recorded.append((int(tok), float(lp[tok]), [(int(i), float(lp[i])) for i in top]))
        return record

    def _logprobs_dict(self, prompt_tokens, recorded, text_offset) -> dict:
        """llama-cpp-python's CompletionLogprobs for the generated tokens."""
        tokens, offsets, token_lp, top_lp = [], [], [], []
        prev = list(prompt_tokens)
        pos = text_offset
        for tok, lp, top in recorded:
            s = self.detokenize([tok], prev_tokens=prev).decode("utf-8", errors="ignore")
            tokens.append(s)
            offsets.append(pos)
            token_lp.append(lp)
            d = {self.detokenize([i], prev_tokens=prev).decode("utf-8", errors="ignore"): v for i, v in top}
            d[s] = lp
            top_lp.append(d)
            pos += len(s)
            prev.append(tok)
        return {"tokens": tokens, "text_offset": offsets, "token_logprobs": token_lp, "top_logprobs": top_lp}

    def __call__(
        self,
        prompt: str,
        suffix: Optional[str] = None,
        max_tokens: Optional[int] = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        logprobs: Optional[int] = None,
        echo: bool = False,
        stop: Optional[Union[str, List[str]]] = [],
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        top_k: int = 40,
        stream: bool = False,
        seed: Optional[int] = None,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: Optional[str] = None,
        stopping_criteria: Optional[StoppingCriteriaList] = None,
        logits_processor: Optional[LogitsProcessorList] = None,
        grammar: Optional[Any] = None,
        logit_bias: Optional[Dict[int, float]] = None,
    ):
        """:meth:`create_completion`."""
        return self.create_completion(
            prompt=prompt, suffix=suffix, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
            min_p=min_p, typical_p=typical_p, logprobs=logprobs, echo=echo, stop=stop,
            frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
            repeat_penalty=repeat_penalty, top_k=top_k, stream=stream, seed=seed, tfs_z=tfs_z,
            mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, model=model,
            stopping_criteria=stopping_criteria, logits_processor=logits_processor, grammar=grammar,
            logit_bias=logit_bias)

    # -- embeddings ------------------------------------------------------------------

    def create_embedding(self, input: Union[str, List[str]], model: Optional[str] = None):
        """OpenAI's embeddings response for ``input`` (a string or a list of strings): one
        entry per input, pooled (a vector) or, with pooling none, one vector per token, not
        normalized (llama-cpp-python's behaviour)."""
        data, n = self.embed(input, return_count=True)
        if isinstance(input, str):
            data = [data]
        return {"object": "list", "model": model or self.model_path,
                "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(data)],
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    def embed(self, input: Union[str, List[str]], normalize: bool = False, truncate: bool = True,
              return_count: bool = False):
        """Embeddings of ``input`` (a string or a list of strings) with the context's pooling
        (``pooling_type``, by default the file's: encoders such as bert say mean or cls,
        decoder models usually none, so each token gets a vector): a list of floats per
        input (a list of such lists with pooling none; the classifier's scores with rank),
        euclidean-normalized with ``normalize``; inputs longer than n_batch (n_ubatch for
        encoders) are cut with ``truncate``, refused without. Needs
        ``Llama(..., embedding=True)``."""
        from .embedding import embed_token_lists

        if not self._embedding:
            raise RuntimeError("Llama model must be created with embedding=True to call this method")
        if isinstance(input, str):
            texts, one = [input], True
        elif isinstance(input, list) and all(isinstance(t, str) for t in input):
            texts, one = list(input), False
        else:
            raise TypeError(f"Llama.embed: input must be a string or a list of strings, got {type(input).__name__}")
        sess = self._sess()
        toks = [self.tokenize(t.encode("utf-8")) for t in texts]
        limit = self.n_batch
        if sess.ctx.is_encoder:  # an encoder takes a whole input in one micro-batch
            limit = min(limit, int(sess.ctx.n_ubatch))
        if truncate:
            toks = [t[:limit] for t in toks]
        for i, t in enumerate(toks):
            if len(t) > limit:
                raise ValueError(f"Requested tokens ({len(t)}) exceed batch size of {limit} (input {i})")
        out = embed_token_lists(sess.ctx, toks, normalize_mode=2 if normalize else -1)
        self.reset()
        data = [e.tolist() for e in out]
        result = data[0] if one else data
        return (result, sum(len(t) for t in toks)) if return_count else result

    def rerank(self, query: str, documents: List[str]) -> List[float]:
        """Relevance scores of ``documents`` for ``query`` with a reranker GGUF (a classifier
        head, rank pooling: the file's pooling_type, or ``pooling_type=4``), one float per
        document in order. Each pair is built as llama-server's /v1/rerank builds it (the
        model's rerank template, else [BOS] query [EOS] [SEP] document [EOS]; see
        :func:`pyllama.embedding.rerank_tokens`). Needs ``Llama(..., embedding=True)``."""
        from .embedding import rerank

        if not self._embedding:
            raise RuntimeError("Llama model must be created with embedding=True to call this method")
        if not isinstance(query, str):
            raise TypeError(f"Llama.rerank: query must be a string, got {type(query).__name__}")
        if isinstance(documents, str) or not isinstance(documents, list) or not all(
                isinstance(d, str) for d in documents):
            raise TypeError("Llama.rerank: documents must be a list of strings")
        sess = self._sess()
        try:
            return rerank(sess.ctx, query, documents, model=self._model)
        finally:
            self.reset()

    # -- chat ------------------------------------------------------------------------

    def _chat_format_kind(self):
        """How ``chat_format`` renders: ("template", Jinja text) for the model's template
        (None, "chat_template.default", "chat_template.NAME") or a template text given as
        chat_format, ("formatter", f) for a name registered in pyllama.llama_chat_format
        (llama-cpp-python's prompt text), ("handler", h) for a name registered with
        register_chat_completion_handler only, ("builtin", name) for llama.cpp's built-in
        formats pyllama renders (llama2-sys, mistral-v7, phi3 / phi-3, ...). A GGUF without
        a chat template gets llama-cpp-python's fallback, the "llama-2" format, with a
        warning naming it (once per Llama)."""
        from . import llama_chat_format as lcf

        fmt = self.chat_format
        if fmt is None or fmt == "chat_template.default":
            src = self._model.chat_template()
            if src:
                return "template", src
            self._chat_fallback = True
            fmt = "llama-2"
        if self._chat_fallback and fmt == "llama-2":
            self._chat_fallback = False  # warn once
            log.warning("%s has no chat template (tokenizer.chat_template): chat completions use "
                        "llama-cpp-python's fallback chat format 'llama-2'; pass chat_format= to choose one",
                        Path(self.model_path).name)
        if fmt.startswith("chat_template."):
            src = self._model.metadata.get(f"tokenizer.{fmt}")
            if not isinstance(src, str):
                raise ValueError(f"chat_format {fmt!r}: the model has no tokenizer.{fmt} template")
            return "template", src
        if fmt in lcf._FORMATS:
            return "formatter", lcf._FORMATS[fmt]
        try:
            return "handler", lcf.get_chat_completion_handler(fmt)
        except lcf.LlamaChatCompletionHandlerNotFoundException:
            pass
        builtin = _CHAT_FORMAT_ALIASES.get(fmt, fmt)
        if builtin in BUILTIN_TEMPLATES:
            return "builtin", builtin
        if "{{" in fmt or "{%" in fmt:
            return "template", fmt
        raise ValueError(f"unknown chat_format {fmt!r}: expected a name registered in llama_chat_format "
                         f"({', '.join(sorted(lcf._FORMATS))}), a llama.cpp built-in "
                         f"({', '.join(sorted(set(BUILTIN_TEMPLATES) | set(_CHAT_FORMAT_ALIASES)))}), "
                         "'chat_template.default' (or another chat_template.NAME of the model), None or a "
                         "Jinja template text")

    def _template_source(self) -> str:
        """The chat template's text (or format name) that renders this Llama's chats."""
        kind, what = self._chat_format_kind()
        return what if kind in ("template", "builtin") else str(self.chat_format)

    def _render_chat(self, messages, add_generation_prompt=True, **extra) -> str:
        return self._chat_render(messages, add_generation_prompt, **extra)[0]

    def _chat_render(self, messages, add_generation_prompt=True, **extra):
        """(prompt text, stop strings, stopping criteria, whether the text holds BOS)."""
        kind, what = self._chat_format_kind()
        v = self._vocab
        bos_text = _token_text(v, v.bos)
        if kind == "formatter":
            if not add_generation_prompt:
                raise ValueError(f"chat format {self.chat_format!r} always ends with the assistant's turn "
                                 "(llama-cpp-python's formatters have no add_generation_prompt)")
            r = what(messages=messages, **extra)
            stops = [r.stop] if isinstance(r.stop, str) else list(r.stop or [])
            return r.prompt, stops, r.stopping_criteria, bool(r.added_special)
        if kind == "builtin":
            if extra:
                raise ValueError(f"the built-in {what} chat format takes no template variables ({', '.join(extra)})")
            text = apply_builtin(what, messages, add_generation_prompt)
        else:
            if self._chat_template is None or self._chat_template.source != what:
                self._chat_template = ChatTemplate(
                    what, bos_token=bos_text, eos_token=_token_text(v, v.eos),
                    name=f"{Path(self.model_path).name}: chat template")
            text = self._chat_template.render(messages, add_generation_prompt, **extra)
        # templates usually print BOS themselves; add it only when they do not
        return text, [], None, bool(bos_text) and text.startswith(bos_text)

    def _chat_prompt_tokens(self, messages, **extra) -> list[int]:
        return self._chat_prompt(messages, **extra)[0]

    def _chat_prompt(self, messages, **extra):
        """(prompt tokens, the format's stop strings, its stopping criteria)."""
        text, stops, criteria, has_bos = self._chat_render(messages, True, **extra)
        return self.tokenize(text.encode("utf-8"), add_bos=not has_bos, special=True), stops, criteria

    def create_chat_completion(
        self,
        messages: List[Dict[str, Any]],
        functions: Optional[List[Dict[str, Any]]] = None,
        function_call: Optional[Any] = None,
        tools: Optional[List[Dict[str, Any]]] = None,
        tool_choice: Optional[Any] = None,
        temperature: float = 0.2,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        stream: bool = False,
        stop: Optional[Union[str, List[str]]] = [],
        seed: Optional[int] = None,
        response_format: Optional[Dict[str, Any]] = None,
        max_tokens: Optional[int] = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: Optional[str] = None,
        logits_processor: Optional[LogitsProcessorList] = None,
        grammar: Optional[Any] = None,
        logit_bias: Optional[Dict[int, float]] = None,
        logprobs: Optional[bool] = None,
        top_logprobs: Optional[int] = None,
    ):
        """Answer ``messages`` with the chat format (or ``chat_handler``); a ``chat.completion``
        dict, or an iterator of ``chat.completion.chunk`` dicts with ``stream=True``. A
        ``chat_format`` registered in llama_chat_format gives llama-cpp-python's prompt text
        and stop strings (see :meth:`_chat_format_kind`). ``logprobs=True`` (with
        ``top_logprobs=N`` alternatives) adds OpenAI's log-probabilities of the reply's tokens;
        as in llama-cpp-python it needs ``logits_all=True`` (not with ``stream=True`` yet)."""
        handler = self.chat_handler
        if handler is None and self.chat_format is not None:
            kind, what = self._chat_format_kind()
            handler = what if kind == "handler" else None
        if handler is not None:
            return handler(
                llama=self, messages=messages, functions=functions, function_call=function_call, tools=tools,
                tool_choice=tool_choice, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                typical_p=typical_p, logprobs=logprobs, top_logprobs=top_logprobs, stream=stream, stop=stop,
                seed=seed, response_format=response_format, max_tokens=max_tokens,
                presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                repeat_penalty=repeat_penalty, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
                mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, model=model,
                logits_processor=logits_processor, grammar=grammar, logit_bias=logit_bias)
        where = "Llama.create_chat_completion"
        # OpenAI's legacy functions / function_call: as tools / tool_choice (llama-cpp-python's
        # conversion); a call comes back as tool_calls and, for these callers, function_call
        legacy = functions is not None or function_call is not None
        if legacy:
            if tools is not None or tool_choice is not None:
                raise ValueError(f"{where}: pass functions / function_call or tools / tool_choice, not both")
            if functions is None:
                raise ValueError(f"{where}: function_call={function_call!r} needs functions=")
            if function_call is not None and function_call not in ("none", "auto") and not (
                    isinstance(function_call, dict) and isinstance(function_call.get("name"), str)):
                raise ValueError(f"{where}: function_call must be 'none', 'auto' or {{'name': ...}}, "
                                 f"got {function_call!r}")
            if not isinstance(functions, list):
                raise TypeError(f"{where}: functions must be a list of {{'name', 'parameters'}} dicts")
            from .llama_chat_format import _tools_of

            tools, tool_choice = _tools_of(functions, function_call, None, None)
        tc = None
        if tools is not None:
            from .tool_calls import ToolCalls

            tc = ToolCalls(self._template_source(), tools, tool_choice)
        elif tool_choice not in (None, "none", "auto"):
            raise ValueError(f"{where}: tool_choice={tool_choice!r} needs tools=")
        grammar = _response_format_grammar(where, response_format, grammar)
        extra: dict = {}
        if tc is not None:
            if tc.grammar is not None:
                if grammar is not None:
                    raise ValueError(f"{where}: tools constrain the reply with their own grammar; "
                                     "pass no grammar / response_format with them")
                from .llama_grammar import LlamaGrammar

                grammar = (LlamaGrammar.lazy(tc.grammar, tc.grammar_triggers) if tc.grammar_triggers
                           else LlamaGrammar.from_string(tc.grammar, verbose=False))
            messages = tc.messages(messages)
            extra = tc.template_vars()
        else:
            from .tool_calls import with_object_arguments

            messages = with_object_arguments(messages)
        # OpenAI's shape: logprobs=True adds each token's log-probability, top_logprobs=N the N
        # most likely alternatives; as in llama-cpp-python the Llama needs logits_all=True
        n_top = None
        if top_logprobs is not None and not logprobs:
            raise ValueError(f"{where}: top_logprobs={top_logprobs!r} needs logprobs=True")
        if logprobs:
            n_top = 0 if top_logprobs is None else top_logprobs
        self._check_completion_args(where, tfs_z=tfs_z, grammar=grammar, logprobs=n_top, echo=False,
                                    stream=stream, stop=stop, logit_bias=logit_bias, stopping_criteria=None,
                                    logits_processor=logits_processor, suffix=None)
        self._sess()
        prompt_tokens, format_stops, criteria = self._chat_prompt(messages, **extra)
        if format_stops:
            stop = _check_stop(stop) + format_stops
        self._next_seed(seed)
        sampler = self._chain(
            temp=temperature, top_p=top_p, top_k=top_k, min_p=min_p, typical_p=typical_p,
            repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty, mirostat_mode=mirostat_mode,
            mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, logit_bias=logit_bias,
            logits_processor=logits_processor, grammar=grammar, where=where)
        cid = f"chatcmpl-{uuid.uuid4()}"
        created = int(time.time())
        model_name = model or self.model_path
        recorded: list = []
        record = None if n_top is None else self._logprob_recorder(n_top, recorded)
        pieces = self._stream_text(prompt_tokens, max_tokens, stop, sampler, criteria, record)

        def usage():
            n = self._session.stats.n_gen
            return {"prompt_tokens": len(prompt_tokens), "completion_tokens": n,
                    "total_tokens": len(prompt_tokens) + n}

        if stream:
            def gen():
                base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model_name}
                yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                            "finish_reason": None}]}
                held = []
                for text, finish in pieces:
                    if text and tc is not None:  # a reply that may be a tool call is sent whole
                        held.append(text)
                    elif text:
                        yield {**base, "choices": [{"index": 0, "delta": {"content": text},
                                                    "logprobs": None, "finish_reason": None}]}
                    if finish is not None:
                        if tc is not None:
                            msg, fin = reply_message("".join(held), tc)
                            finish = fin or finish
                            if legacy and msg.get("tool_calls"):
                                msg["function_call"] = msg["tool_calls"][0]["function"]
                            delta = {k: v for k, v in msg.items() if k != "role" and v}
                            if "tool_calls" in delta:
                                delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(delta["tool_calls"])]
                            if delta:
                                yield {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                            "finish_reason": None}]}
                        yield {**base, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                                    "finish_reason": finish}], "usage": usage()}
            return gen()
        out, finish = [], None
        for text, f in pieces:
            out.append(text)
            finish = f if f is not None else finish
        msg, fin = reply_message("".join(out), tc)
        if legacy and msg.get("tool_calls"):
            msg["function_call"] = msg["tool_calls"][0]["function"]
        lps = None
        if n_top is not None:
            from .llama_chat_format import _convert_text_completion_logprobs_to_chat

            lps = _convert_text_completion_logprobs_to_chat(self._logprobs_dict(prompt_tokens, recorded, 0))
        return {
            "id": cid, "object": "chat.completion", "created": created, "model": model_name,
            "choices": [{"index": 0, "message": msg, "logprobs": lps, "finish_reason": fin or finish}],
            "usage": usage(),
        }

    def create_chat_completion_openai_v1(self, *args: Any, **kwargs: Any):
        """:meth:`create_chat_completion` as the ``openai`` package's types."""
        try:
            from openai.types.chat import ChatCompletion, ChatCompletionChunk
        except ImportError:
            raise ImportError("create_chat_completion_openai_v1 needs the openai package (pip install openai)")
        if kwargs.get("stream", False):
            return (ChatCompletionChunk(**c) for c in self.create_chat_completion(*args, **kwargs))
        return ChatCompletion(**self.create_chat_completion(*args, **kwargs))

    # -- helpers ---------------------------------------------------------------------

    @staticmethod
    def logits_to_logprobs(logits, axis: int = -1) -> np.ndarray:
        """log_softmax in float32 (infinite maxima treated as 0, as llama-cpp-python does)."""
        mx = np.amax(logits, axis=axis, keepdims=True)
        if mx.ndim > 0:
            mx[~np.isfinite(mx)] = 0
        elif not np.isfinite(mx):
            mx = 0
        shifted = np.subtract(logits, mx, dtype=np.single)
        with np.errstate(divide="ignore"):
            return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))

    @staticmethod
    def longest_token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
        return common_prefix(a, b)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: Optional[str], additional_files: Optional[List] = None,
                        local_dir: Optional[str] = None, local_dir_use_symlinks: Any = "auto",
                        cache_dir: Optional[str] = None, **kwargs: Any) -> "Llama":
        """Fetch ``filename`` (a glob that must match exactly one file of the repo) from the
        Hugging Face Hub and load it, as llama-cpp-python does (needs ``huggingface_hub``).
        ``additional_files`` (globs; the other parts of a split model) are fetched too.
        Files go to the Hub cache (``cache_dir``, default HF_HUB_CACHE), or are copied into
        ``local_dir``; offline (HF_HUB_OFFLINE=1 or no network) the cached snapshot is used.
        ``local_dir_use_symlinks``: huggingface_hub >= 0.23 always copies real files into
        ``local_dir``, so "auto" and False are honoured and True raises ValueError."""
        from .hub import HubError, _hub, pretrained_path

        try:
            _hub()
        except HubError:
            raise ImportError("Llama.from_pretrained requires the huggingface-hub package. "
                              "You can install it with `pip install huggingface-hub`.") from None
        if local_dir_use_symlinks not in ("auto", False):
            raise ValueError(f"local_dir_use_symlinks={local_dir_use_symlinks!r}: huggingface_hub no longer "
                             "symlinks files into local_dir (it copies them); use 'auto' or False")
        if filename is None:
            raise ValueError("filename is required: a file name or glob such as '*Q4_K_M.gguf'")
        path = pretrained_path(repo_id, filename, additional_files, local_dir=local_dir, cache_dir=cache_dir)
        return cls(model_path=str(path), **kwargs)


def _check_stop(stop) -> list[str]:
    """``stop`` as a list of non-empty strings: None, a str, or a list / tuple of str
    (llama-cpp-python's forms); anything else is a TypeError naming what was wrong."""
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop] if stop else []
    if not isinstance(stop, (list, tuple)):
        raise TypeError(f"stop must be a str or a list of str, got {type(stop).__name__} {stop!r}")
    for i, s in enumerate(stop):
        if not isinstance(s, str):
            raise TypeError(f"stop[{i}] must be a str, got {type(s).__name__} {s!r}")
    return [s for s in stop if s]


def _check_logit_bias(logit_bias, n_vocab: int) -> list[tuple[int, float]]:
    """``logit_bias`` as llama-cpp-python takes it ({token_id: bias}, ids may be strings of
    digits as JSON keys are), checked: TypeError / ValueError say which entry is wrong."""
    if logit_bias is not None and not hasattr(logit_bias, "items"):
        raise TypeError(f"logit_bias must be a dict {{token_id: bias}}, got {type(logit_bias).__name__}")
    return normalize_logit_bias(logit_bias, n_vocab, "logit_bias")



