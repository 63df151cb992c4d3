"""``pyllama.Llama``: the high-level class shaped like llama-cpp-python's ``llama_cpp.Llama``,
so code written for it runs by changing the import.

    >>> from pyllama import Llama
    >>> llm = Llama("model.gguf", n_ctx=2048, seed=42)
    >>> llm("The capital of France is", max_tokens=16)["choices"][0]["text"]
    >>> for chunk in llm.create_chat_completion(
    ...         [{"role": "user", "content": "Hi"}], stream=True):
    ...     print(chunk["choices"][0]["delta"].get("content", ""), end="")

Results are the same OpenAI-style dicts (``text_completion`` / ``chat.completion`` and
their ``...chunk`` stream forms). Prompt tokens already in the KV cache from the previous
call are not decoded again (longest common prefix), as llama-cpp-python does.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

from .chat import BUILTIN_TEMPLATES, ChatTemplate, apply_builtin
from .generation import Session, TextStream, load_model
from .sampling import LLAMA_DEFAULT_SEED, SamplerParams, build_chain, normalize_logit_bias

__all__ = ["Llama"]


class Llama:
    def __init__(
        self,
        model_path: Union[str, Path],
        *,
        n_ctx: int = 512,
        n_batch: int = 512,
        n_ubatch: int = 512,
        n_threads: Optional[int] = None,
        n_threads_batch: Optional[int] = None,
        n_gpu_layers: int = 0,
        seed: int = LLAMA_DEFAULT_SEED,
        chat_format: Optional[str] = None,
        type_k: Optional[Union[int, str]] = None,
        type_v: Optional[Union[int, str]] = None,
        flash_attn: bool = False,
        use_mmap: bool = True,
        use_mlock: bool = False,
        verbose: bool = False,
        **_ignored: Any,
    ):
        """Load ``model_path`` and create a context of ``n_ctx`` tokens (0 = the model's
        training context). ``chat_format``: None (the model's own template, else chatml), a
        built-in name (chatml, llama3, gemma, phi3, zephyr, mistral-v7, llama2) or a Jinja
        template text. ``n_gpu_layers`` is accepted for compatibility (CPU only here).
        """
        self.model_path = str(model_path)
        self.verbose = verbose
        load_mode = "mlock" if use_mlock else ("mmap" if use_mmap else "none")
        if use_mlock and use_mmap:
            load_mode = "mmap+mlock"
        self._model = load_model(self.model_path, load_mode=load_mode)
        cparams: dict[str, Any] = {"n_ctx": n_ctx, "n_batch": n_batch, "n_ubatch": min(n_ubatch, n_batch)}
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
        self._session = Session(self._model, **cparams)
        self.n_gpu_layers = n_gpu_layers
        self._seed = seed
        self.chat_format = chat_format
        self._chat_template: Optional[ChatTemplate] = None

    # -- llama-cpp-python's small API ------------------------------------------------

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of ``text`` (BOS first when ``add_bos`` and the model adds one)."""
        return self._session.tokenize(text, add_special=add_bos, parse_special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Optional[Sequence[int]] = None,
                   special: bool = False) -> bytes:
        v = self._session.vocab
        if prev_tokens is None:
            return b"".join(v.token_to_piece(int(t), special) for t in tokens)
        full = b"".join(v.token_to_piece(int(t), special) for t in list(prev_tokens) + list(tokens))
        prev = b"".join(v.token_to_piece(int(t), special) for t in prev_tokens)
        return full[len(prev):]

    def n_ctx(self) -> int:
        return self._session.n_ctx

    def n_vocab(self) -> int:
        return self._session.n_vocab

    def n_embd(self) -> int:
        return int(self._model.n_embd)

    def token_eos(self) -> int:
        return int(self._session.vocab.eos)

    def token_bos(self) -> int:
        return int(self._session.vocab.bos)

    def token_nl(self) -> int:
        return int(self._session.vocab.nl)

    def reset(self) -> None:
        """Forget the KV cache (the next call decodes its whole prompt)."""
        self._session.reset()

    def set_seed(self, seed: int) -> None:
        self._seed = seed

    @property
    def metadata(self) -> dict:
        return {k: str(v) for k, v in self._model.metadata.items() if not isinstance(v, (list, tuple))}

    def close(self) -> None:
        close = getattr(self._session.ctx, "close", None)
        if close:
            close()

    def __enter__(self) -> "Llama":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- completion ------------------------------------------------------------------

    def _sampler(self, *, temperature, top_p, top_k, min_p, typical_p, repeat_penalty,
                 frequency_penalty, presence_penalty, seed, mirostat_mode, mirostat_tau,
                 mirostat_eta, logit_bias):
        params = SamplerParams(
            seed=self._seed if seed is None else seed, temp=temperature, top_p=top_p, top_k=top_k,
            min_p=min_p, typ_p=typical_p, penalty_repeat=repeat_penalty, penalty_freq=frequency_penalty,
            penalty_present=presence_penalty, mirostat=mirostat_mode, mirostat_tau=mirostat_tau,
            mirostat_eta=mirostat_eta, logit_bias=dict(_check_logit_bias(logit_bias, self._session.n_vocab)),
            no_perf=True,
        )
        return build_chain(params, n_vocab=self._session.n_vocab, vocab=self._session.vocab)

    def _completion_tokens(self, prompt: Union[str, bytes, Sequence[int]], add_bos: bool = True,
                           special: bool = True) -> list[int]:
        if isinstance(prompt, (str, bytes)):
            return self.tokenize(prompt if isinstance(prompt, bytes) else prompt.encode("utf-8"),
                                 add_bos=add_bos, special=special)
        return [int(t) for t in prompt]

    def _stream_text(self, prompt_tokens: list[int], max_tokens: Optional[int], stop, sampler,
                     ) -> Iterator[tuple[str, Optional[str]]]:
        """Yield (text, finish_reason) pieces: text is safe to show (never part of a stop
        string or a split UTF-8 character); the last item carries the finish reason."""
        sess = self._session
        if max_tokens is None or max_tokens <= 0:
            max_tokens = sess.n_ctx - len(prompt_tokens)
        if len(prompt_tokens) >= sess.n_ctx:
            raise ValueError(f"Requested tokens ({len(prompt_tokens)}) exceed context window of {sess.n_ctx}")
        stops = _check_stop(stop)
        stream = TextStream(sess.vocab, special=False)
        text = ""
        sent = 0
        gen = sess.generate(prompt_tokens, sampler, max_tokens)
        finish = None
        try:
            for tok in gen:
                text += stream.feed(tok)
                hit = _first_stop(text, stops, sent)
                if hit is not None:
                    if hit > sent:
                        yield text[sent:hit], None
                    sent = hit
                    finish = "stop"
                    break
                # hold back a tail that could still become a stop string
                safe = len(text) - _partial_stop_len(text, stops)
                if safe > sent:
                    yield text[sent:safe], None
                    sent = safe
        finally:
            gen.close()
        if finish is None:
            text += stream.flush()
            hit = _first_stop(text, stops, sent)
            end = hit if hit is not None else len(text)
            if end > sent:
                yield text[sent:end], None
            finish = "stop" if (hit is not None or sess.stats.stop_reason == "eog") else "length"
        yield "", finish

    def create_completion(
        self,
        prompt: Union[str, bytes, Sequence[int]],
        suffix: Optional[str] = None,
        max_tokens: Optional[int] = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        logprobs: Optional[int] = None,
        echo: bool = False,
        stop: Optional[Union[str, list[str]]] = None,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        top_k: int = 40,
        stream: bool = False,
        seed: Optional[int] = None,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: Optional[str] = None,
        logit_bias: Optional[dict[int, float]] = None,
        **_ignored: Any,
    ):
        """Complete ``prompt``; a ``text_completion`` dict, or an iterator of chunks with
        ``stream=True``. ``max_tokens`` None or <= 0 generates until the context is full."""
        if logprobs:
            raise NotImplementedError("create_completion(logprobs=...) is not supported by pyllama yet")
        # argument checks here, before any work (a stream=True call is a generator: checks
        # in it would only fail at the first next())
        _check_stop(stop)
        _check_logit_bias(logit_bias, self._session.n_vocab)
        prompt_tokens = self._completion_tokens(prompt)
        sampler = self._sampler(
            temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, typical_p=typical_p,
            repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty, seed=seed, mirostat_mode=mirostat_mode,
            mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, logit_bias=logit_bias)
        cid = f"cmpl-{uuid.uuid4()}"
        created = int(time.time())
        model_name = model or self.model_path
        prompt_text = prompt if isinstance(prompt, str) else (
            prompt.decode("utf-8", "replace") if isinstance(prompt, bytes)
            else self.detokenize(prompt_tokens).decode("utf-8", "replace"))
        pieces = self._stream_text(prompt_tokens, max_tokens, stop, sampler)

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
        c["usage"] = usage()
        return c

    def __call__(self, prompt, **kwargs):
        return self.create_completion(prompt, **kwargs)

    # -- chat ------------------------------------------------------------------------

    def _render_chat(self, messages, add_generation_prompt=True, **extra) -> str:
        fmt = self.chat_format
        v = self._session.vocab
        if fmt in BUILTIN_TEMPLATES:
            return apply_builtin(fmt, messages, add_generation_prompt)
        if self._chat_template is None:
            src = fmt if fmt else self._model.chat_template()
            if not src:
                return apply_builtin("chatml", messages, add_generation_prompt)
            self._chat_template = ChatTemplate(
                src, bos_token=_token_text(v, v.bos), eos_token=_token_text(v, v.eos),
                name=f"{Path(self.model_path).name}: chat template")
        return self._chat_template.render(messages, add_generation_prompt, **extra)

    def _chat_prompt_tokens(self, messages, **extra) -> list[int]:
        text = self._render_chat(messages, True, **extra)
        v = self._session.vocab
        bos_text = _token_text(v, v.bos)
        # templates usually print BOS themselves; add it only when they do not
        add_bos = not (bos_text and text.startswith(bos_text))
        return self.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)

    def create_chat_completion(
        self,
        messages: list[dict],
        temperature: float = 0.2,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        stream: bool = False,
        stop: Optional[Union[str, list[str]]] = None,
        seed: Optional[int] = None,
        max_tokens: Optional[int] = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: Optional[str] = None,
        logit_bias: Optional[dict[int, float]] = None,
        **template_kwargs: Any,
    ):
        """Answer ``messages`` with the model's chat template; a ``chat.completion`` dict, or
        an iterator of ``chat.completion.chunk`` dicts with ``stream=True``."""
        for k in ("tools", "tool_choice", "functions", "function_call", "response_format"):
            if template_kwargs.get(k):
                raise NotImplementedError(f"create_chat_completion({k}=...) is not supported by pyllama yet")
        extra = {k: v for k, v in template_kwargs.items()
                 if k not in ("tools", "tool_choice", "functions", "function_call", "response_format", "logprobs", "top_logprobs")}
        _check_stop(stop)
        _check_logit_bias(logit_bias, self._session.n_vocab)
        prompt_tokens = self._chat_prompt_tokens(messages, **extra)
        sampler = self._sampler(
            temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, typical_p=typical_p,
            repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty, seed=seed, mirostat_mode=mirostat_mode,
            mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, logit_bias=logit_bias)
        cid = f"chatcmpl-{uuid.uuid4()}"
        created = int(time.time())
        model_name = model or self.model_path
        pieces = self._stream_text(prompt_tokens, max_tokens, stop, sampler)

        def usage():
            n = self._session.stats.n_gen
            return {"prompt_tokens": len(prompt_tokens), "completion_tokens": n,
                    "total_tokens": len(prompt_tokens) + n}

        if stream:
            def gen():
                base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model_name}
                yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                            "finish_reason": None}]}
                for text, finish in pieces:
                    if finish is None:
                        if text:
                            yield {**base, "choices": [{"index": 0, "delta": {"content": text},
                                                        "logprobs": None, "finish_reason": None}]}
                    else:
                        if text:
                            yield {**base, "choices": [{"index": 0, "delta": {"content": text},
                                                        "logprobs": None, "finish_reason": None}]}
                        yield {**base, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                                    "finish_reason": finish}], "usage": usage()}
            return gen()
        out, finish = [], None
        for text, f in pieces:
            out.append(text)
            finish = f if f is not None else finish
        return {
            "id": cid, "object": "chat.completion", "created": created, "model": model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(out)},
                         "logprobs": None, "finish_reason": finish}],
            "usage": usage(),
        }


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


def _token_text(vocab, token: int) -> str:
    if token is None or token < 0:
        return ""
    return vocab.token_to_piece(int(token), True).decode("utf-8", "replace")


def _first_stop(text: str, stops: list[str], start: int) -> Optional[int]:
    """Index in ``text`` where the earliest stop string begins at or after ``start``
    (searching a little before ``start`` is unnecessary: text before it was already shown
    only if it could not begin a stop string)."""
    best = None
    for s in stops:
        i = text.find(s, max(0, start))
        if i != -1 and (best is None or i < best):
            best = i
    return best


def _partial_stop_len(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    n = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                n = max(n, k)
                break
    return n
