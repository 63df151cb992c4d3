"""The generation loop (pipeline steps 8-16 end to end) and what the CLI and ``Llama`` share.

:class:`Session` holds a model, its vocabulary and one context (sequence 0) and knows which
tokens are in the KV cache, so a new prompt that starts like the previous one only decodes
the new part (llama-cpp-python's prefix reuse). :meth:`Session.generate` is llama.cpp's
examples/simple-chat loop: decode the prompt, then sample, stop on end-of-generation or
the limit, feed the token back. :class:`TextStream` turns token pieces into text without
ever splitting a UTF-8 character.
"""

from __future__ import annotations

import codecs
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

from .sampling import SamplerChain

__all__ = ["Session", "TextStream", "StopText", "context_shift", "common_prefix", "GenerationStats", "load_model", "vocab_of", "progress_bar"]


def progress_bar(label: str = "loading", stream=None, width: int = 30) -> Callable[[float], bool]:
    """A ``progress(p)`` callback for model loading that draws ``label [#####     ]  42%``
    on stderr (only when it is a terminal, else a single line at the end)."""
    stream = stream or sys.stderr
    tty = hasattr(stream, "isatty") and stream.isatty()
    state = {"last": -1}

    def cb(p: float) -> bool:
        pct = int(max(0.0, min(1.0, float(p))) * 100)
        if pct == state["last"]:
            return True
        state["last"] = pct
        if tty:
            n = pct * width // 100
            stream.write(f"\r{label} [{'#' * n}{' ' * (width - n)}] {pct:3d}%")
            if pct >= 100:
                stream.write("\n")
            stream.flush()
        elif pct >= 100:
            stream.write(f"{label}: done\n")
            stream.flush()
        return True

    return cb


def load_model(path, *, load_mode: str = "auto", progress: Optional[Callable[[float], bool]] = None,
               n_gpu_layers: int = 0, split_mode: str = "layer", tensor_split: Optional[list] = None,
               main_gpu: int = 0):
    """Load a GGUF model (:class:`pyllama.model.Model`); ``n_gpu_layers`` (-ngl) offloads
    when the GPU backend is built (without it the CLI has already said it is ignored),
    placed by ``split_mode`` (-sm), ``tensor_split`` (-ts) and ``main_gpu`` (-mg) as
    :meth:`pyllama.model.Model.load` says."""
    from . import gpu
    from .model import Model

    return Model.load(path, load_mode=load_mode, progress=progress,
                      n_gpu_layers=n_gpu_layers if gpu.built() else 0, split_mode=split_mode,
                      tensor_split=tensor_split, main_gpu=main_gpu)


def vocab_of(model):
    """The model's :class:`pyllama.vocab.Vocab` (built once from its metadata and cached)."""
    v = getattr(model, "vocab", None)
    if v is not None and not callable(v):
        return v
    cached = getattr(model, "_pyllama_vocab", None)
    if cached is not None:
        return cached
    from .vocab import Vocab

    v = Vocab.from_metadata(model.metadata, source=str(getattr(model, "path", "<model>")))
    try:
        model._pyllama_vocab = v
    except AttributeError:
        pass
    return v


class TextStream:
    """Token ids in, text out as soon as it is complete UTF-8.

    Pieces are ``vocab.token_to_piece(id, special)`` bytes (what llama.cpp's examples print);
    a piece that ends inside a multi-byte character is held back until the next one
    completes it. ``flush()`` returns what is left (an incomplete tail becomes U+FFFD).
    """

    def __init__(self, vocab, special: bool = True):
        self.vocab = vocab
        self.special = special
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, token: int) -> str:
        return self._dec.decode(self.vocab.token_to_piece(int(token), self.special))

    def feed_bytes(self, data: bytes) -> str:
        return self._dec.decode(data)

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


class StopText:
    """Generated tokens in, text that is safe to show out: never half a UTF-8 character and
    never text that is, or may still become, part of a stop string (llama-server's partial
    stop hold-back). ``Llama`` and the server both stream through it.

    ``feed(token)`` returns the new safe text; once a stop string appears, ``stopped`` turns
    true and the text ends where the stop string began (the stop string is not shown).
    ``finish()`` returns what was held back at the end of generation (cut at a stop string).
    ``text`` is everything shown so far.
    """

    def __init__(self, vocab, stops: Sequence[str] = (), special: bool = False):
        self._stream = TextStream(vocab, special=special)
        self.stops = [s for s in stops if s]
        self._buf = ""   # decoded text not shown yet
        self.text = ""   # shown text
        self.stopped = False
        self.stop_word = ""  # the stop string that ended the text
        self.cut = False     # truncate() shortened the text after it was shown

    def _take(self, final: bool) -> str:
        buf = self._buf
        hit = None
        for s in self.stops:
            i = buf.find(s)
            if i != -1 and (hit is None or i < hit):
                hit = i
        if hit is not None:
            self.stopped = True
            self.stop_word = next(s for s in self.stops if buf.find(s) == hit)
            out, self._buf = buf[:hit], ""
        else:
            keep = 0 if final else _partial_stop_len(buf, self.stops)
            out, self._buf = buf[:len(buf) - keep], buf[len(buf) - keep:]
        self.text += out
        return out

    def feed(self, token: int) -> str:
        if self.stopped or self.cut:
            return ""
        self._buf += self._stream.feed(token)
        return self._take(False)

    def truncate(self, n: int) -> None:
        """End the text at ``n`` characters (text already shown beyond that is taken back:
        a caller that has not streamed it leaves it out); nothing more comes."""
        self.text = self.text[:n]
        self._buf = ""
        self.cut = True

    def finish(self) -> str:
        if self.stopped or self.cut:
            return ""
        self._buf += self._stream.flush()
        return self._take(True)


def _partial_stop_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    n = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                n = max(n, k)
                break
    return n


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (prompt-cache reuse: Session, the
    server's slots, Llama's prompt caches)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def context_shift(ctx, seq_id: int, tokens: list, n_keep: int = 0, n_discard: int = 0) -> int:
    """llama.cpp's context shift for a full sequence: keep its first ``n_keep`` tokens, drop
    the ``n_discard`` oldest of the rest (0: half of them; at most all but one) and move the
    remainder down (K is re-roped, so attention sees them at their new positions).
    ``tokens`` (what the sequence holds) is cut to match. Returns how many tokens were
    dropped (0 when nothing can be)."""
    n_past = len(tokens)
    n_keep = min(max(int(n_keep), 0), n_past - 1)
    n_left = n_past - n_keep
    n_discard = min(max(int(n_discard) if n_discard else n_left // 2, 0), max(0, n_left - 1))
    if n_discard <= 0:
        return 0
    ctx.seq_rm(seq_id, n_keep, n_keep + n_discard)
    ctx.seq_add(seq_id, n_keep + n_discard, n_past, -n_discard)
    del tokens[n_keep:n_keep + n_discard]
    return n_discard


@dataclass
class GenerationStats:
    n_prompt: int = 0          # prompt tokens decoded (after prefix reuse)
    n_reused: int = 0          # prompt tokens found in the KV cache already
    n_gen: int = 0             # tokens sampled and returned
    t_prompt_s: float = 0.0
    t_gen_s: float = 0.0
    stop_reason: str = ""      # "eog", "length", "ctx" (context full) or "stop" (caller)
    n_shifted: int = 0         # tokens dropped by context shifts during generation
    n_drafted: int = 0         # draft tokens decoded for verification (speculative decoding)
    n_accepted: int = 0        # of them, those the sampler picked too (kept in the cache)


class Session:
    """A model + vocabulary + context on sequence 0, and the tokens its KV cache holds.

    ``context_params`` are :class:`pyllama.context.Context` keyword arguments
    (n_ctx, n_batch, n_ubatch, n_threads, n_threads_batch, type_k, type_v, ...).
    """

    def __init__(self, model, **context_params):
        from .context import Context

        self.model = model
        self.vocab = vocab_of(model)
        self.ctx = Context(model, **context_params)
        self.tokens: list[int] = []  # what sequence 0 of the KV cache holds, in order
        self.stats = GenerationStats()
        self._n_ctx = int(self.ctx.n_ctx)  # fixed for the context's life; read per token
        self._one = np.zeros(1, dtype=np.int32)  # the generation step's batch, reused
        self._row: Optional[np.ndarray] = None  # speculative decoding: the row last sampled from

    # -- sizes / tokens ------------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def n_vocab(self) -> int:
        return len(self.vocab)

    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return list(self.vocab.tokenize(text, add_special=add_special, parse_special=parse_special))

    def is_eog(self, token: int) -> bool:
        return bool(self.vocab.is_eog(int(token)))

    def reset(self) -> None:
        """Forget the KV cache (next prompt is decoded from scratch)."""
        self.ctx.memory_clear(True)
        self.tokens = []

    def _drop_cached_after(self, n: int) -> None:
        """Make the cache hold the first ``n`` positions of sequence 0 only. A recurrent
        state cannot lose its last tokens (seq_rm returns false, as llama.cpp's): it is
        rebuilt from ``self.tokens[:n]`` instead."""
        if not self.ctx.seq_rm(0, n, -1):
            keep = self.tokens[:n]
            self.ctx.seq_rm(0, -1, -1)
            self.tokens = []
            self._decode(keep)

    # -- decoding ------------------------------------------------------------------------

    def _decode(self, toks: Sequence[int]) -> None:
        """Decode ``toks`` after what the cache holds, in n_batch pieces (llama_decode takes
        at most n_batch tokens); logits are kept for the last token only."""
        from .errors import ContextFullError

        if len(self.tokens) + len(toks) > self.n_ctx:
            raise ContextFullError(
                f"prompt + generated tokens ({len(self.tokens) + len(toks)}) exceed the context "
                f"size n_ctx = {self.n_ctx}; use a larger -c / n_ctx"
            )
        n_batch = max(1, int(self.ctx.n_batch))
        arr = np.asarray(toks, dtype=np.int32)
        for i in range(0, arr.shape[0], n_batch):
            self.ctx.decode(arr[i:i + n_batch])
            self.tokens.extend(int(t) for t in arr[i:i + n_batch])

    def _decode_one(self, tok: int) -> None:
        """``_decode([tok])`` for the generation step, without the list/array round trip
        (the caller has checked that the context has room)."""
        one = self._one
        one[0] = tok
        self.ctx.decode(one)
        self.tokens.append(tok)

    def eval_prompt(self, prompt_tokens: Sequence[int]) -> None:
        """Bring the cache to exactly ``prompt_tokens`` with logits for its last token,
        reusing the longest common prefix with what is cached."""
        prompt_tokens = [int(t) for t in prompt_tokens]
        if not prompt_tokens:
            raise ValueError("empty prompt: nothing to decode (pass at least one token)")
        n_vocab = self.n_vocab
        for i, t in enumerate(prompt_tokens):
            if not 0 <= t < n_vocab:
                raise ValueError(f"prompt token {i} = {t} is not a valid id (n_vocab = {n_vocab})")
        common = common_prefix(self.tokens, prompt_tokens)
        if common == len(prompt_tokens):
            common -= 1  # re-decode the last token: its logits are needed
        if common < len(self.tokens):
            if not self.ctx.seq_rm(0, common, -1):
                # a recurrent state cannot drop its last tokens (llama.cpp's seq_rm refuses
                # it too): decode the whole prompt again
                self.ctx.seq_rm(0, -1, -1)
                common = 0
            del self.tokens[common:]
        t0 = time.perf_counter()
        self._decode(prompt_tokens[common:])
        self.stats = GenerationStats(n_prompt=len(prompt_tokens) - common, n_reused=common,
                                     t_prompt_s=time.perf_counter() - t0)

    def logits(self) -> np.ndarray:
        """float32 [n_vocab]: the logits the last token was sampled from, which are those
        after the last decoded token (with a draft model, those of its place in the batch)."""
        if self._row is not None:
            return self._row
        return self.ctx.logits_ith(-1)

    def generate(self, prompt_tokens: Sequence[int], sampler: SamplerChain, max_tokens: int = -1,
                 *, ignore_eos: bool = False, decode_last: bool = True, shift: bool = False,
                 n_keep: int = 0, draft=None) -> Iterator[int]:
        """Decode the prompt, then yield sampled tokens until an end-of-generation token
        (not yielded), ``max_tokens`` (< 0: until the context is full) or a full context.
        ``self.stats`` tells which. Closing the iterator early stops cleanly. With ``shift``
        a full context is shifted (:func:`context_shift`, keeping ``n_keep`` tokens) and
        generation goes on; ``max_tokens < 0`` then means until end of generation.

        ``decode_last``: also decode the last returned token at the end, so the cache holds
        prompt + output and a follow-up prompt reuses all of it (llama-simple skips it).

        ``draft``: a :class:`~pyllama.llama_speculative.LlamaDraftModel`; see
        :meth:`_generate_draft`. The tokens yielded are the same as without it."""
        if draft is not None:
            if shift:
                raise ValueError("Session.generate: a draft model and context shifting cannot be combined "
                                 "(pass shift=False or draft=None)")
            yield from self._generate_draft(prompt_tokens, sampler, max_tokens, draft,
                                            ignore_eos=ignore_eos, decode_last=decode_last)
            return
        self.eval_prompt(prompt_tokens)
        stats = self.stats
        t0 = time.perf_counter()
        pending: Optional[int] = None
        try:
            while max_tokens < 0 or stats.n_gen < max_tokens:
                if pending is not None:
                    if len(self.tokens) >= self._n_ctx:
                        dropped = context_shift(self.ctx, 0, self.tokens, n_keep) if shift else 0
                        if not dropped:
                            stats.stop_reason = "ctx"
                            return
                        stats.n_shifted += dropped
                    self._decode_one(pending)
                    pending = None
                tok = sampler.sample(self.logits())
                if not ignore_eos and self.is_eog(tok):
                    stats.stop_reason = "eog"
                    return
                stats.n_gen += 1
                pending = tok
                yield tok
            stats.stop_reason = "length"
        finally:
            if not stats.stop_reason:
                stats.stop_reason = "stop"
            stats.t_gen_s = time.perf_counter() - t0
            if decode_last and pending is not None and len(self.tokens) < self.n_ctx:
                # keep the cache equal to prompt + everything returned, so the next prompt
                # that continues this text reuses all of it
                try:
                    self._decode([pending])
                except Exception:  # context full or aborted: the cache simply stays shorter
                    pass


    def _generate_draft(self, prompt_tokens: Sequence[int], sampler: SamplerChain, max_tokens: int, draft,
                        *, ignore_eos: bool, decode_last: bool) -> Iterator[int]:
        """Speculative decoding: each step decodes the last sampled token and the draft
        model's guess after it in one batch, with logits for every row, then samples row
        by row while the sampled token equals the next guess; the first token that differs
        ends the step and the unused guesses are removed from the KV cache (seq_rm). The
        sampler sees exactly the rows and the tokens one-by-one decoding gives it (batch
        invariance), accepts only the tokens it picked, and draws its random numbers in the
        same order, so the yielded tokens equal :meth:`generate`'s without a draft."""
        from .llama_speculative import draft_tokens

        self.eval_prompt(prompt_tokens)
        stats = self.stats
        t0 = time.perf_counter()
        n_batch = max(1, int(self.ctx.n_batch))
        n_vocab = self.n_vocab
        rows = self.ctx.logits_ith(-1)[None, :]  # (n_rows, n_vocab): rows[j] predicts batch[j + 1]
        batch: list[int] = []  # the tokens rows were computed for; batch[0] is in self.tokens
        pending: Optional[int] = None  # sampled, yielded, not decoded yet
        held: Optional[int] = None  # a guess picked and being yielded: decoded, joins self.tokens after
        try:
            while max_tokens < 0 or stats.n_gen < max_tokens:
                if pending is not None:
                    if len(self.tokens) >= self._n_ctx:
                        stats.stop_reason = "ctx"
                        return
                    # guesses only where they could still be used: room in the context and the
                    # batch, and no more than the tokens still to generate after `pending`
                    n_max = min(self._n_ctx - len(self.tokens), n_batch) - 1
                    if max_tokens >= 0:
                        n_max = min(n_max, max_tokens - stats.n_gen - 1)
                    hist = np.asarray(self.tokens + [pending], dtype=np.intc)
                    batch = [pending] + draft_tokens(draft, hist, n_max, n_vocab)
                    self._row = None
                    self.ctx.decode(np.asarray(batch, dtype=np.int32), logits_all=True)
                    rows = self.ctx.logits
                    self.tokens.append(pending)  # the guesses join self.tokens once accepted
                    stats.n_drafted += len(batch) - 1
                    pending = None
                for j in range(rows.shape[0]):
                    self._row = rows[j]
                    tok = sampler.sample(rows[j])
                    if not ignore_eos and self.is_eog(tok):
                        stats.stop_reason = "eog"
                        return
                    stats.n_gen += 1
                    if j + 1 < len(batch) and tok == batch[j + 1]:
                        # a guess the sampler picked: already decoded; like a pending token it
                        # is not in self.tokens while the caller looks at it
                        stats.n_accepted += 1
                        held = tok
                        yield tok
                        self.tokens.append(tok)
                        held = None
                        if 0 <= max_tokens <= stats.n_gen:
                            break
                    else:
                        pending = tok
                        yield tok
                        break
                # drop the guesses not used (the cache then holds exactly self.tokens)
                if self.ctx.seq_pos_max(0) >= len(self.tokens):
                    self._drop_cached_after(len(self.tokens))
            stats.stop_reason = "length"
        finally:
            if not stats.stop_reason:
                stats.stop_reason = "stop"
            stats.t_gen_s = time.perf_counter() - t0
            if held is not None:
                self.tokens.append(held)
            if self.ctx.seq_pos_max(0) >= len(self.tokens):
                self._drop_cached_after(len(self.tokens))
            self._row = None
            if decode_last and pending is not None and len(self.tokens) < self.n_ctx:
                try:
                    self._decode([pending])
                except Exception:  # context full or aborted: the cache simply stays shorter
                    pass


def resolve_model_path(model: Optional[str | Path], progress: bool = True) -> Path:
    """-m as given, or the default model (fetched once) when None."""
    if model is None:
        from ._models import default_model_path

        return default_model_path(progress=progress)
    p = Path(model)
    if not p.exists():
        raise FileNotFoundError(f"model file not found: {p}")
    return p
