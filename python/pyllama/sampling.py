"""Samplers and sampler chains (pipeline step 15): turn one row of logits into a token.

Each sampler is llama.cpp's (src/llama-sampler.cpp): which ones sort, which keep
``min_keep``, which draw from the RNG and how many draws, in its float order. The classes
here hold the parameters and the llama.h-style interface (``apply`` / ``accept`` /
``reset`` / ``clone``); the math and the state (random number generator, mirostat's mu,
the penalty and DRY histories) live in Rust (``_core.SamplerState``,
rust/core/src/sampling/samplers.rs), once. A :class:`SamplerChain` whose samplers are all
built-ins runs in one Rust call per token; a chain with a sampler written in Python
(llama_sampler_init, a grammar) runs each maximal run of built-ins in one call and the
others in between.

Random numbers: llama.cpp draws from ``std::mt19937`` seeded with the 32-bit seed and turns
the draws into floats the way libstdc++ does (``generate_canonical``,
``discrete_distribution``); ``_core.StdRng`` is that generator, so a seed gives the same
draws here as in llama.cpp.
"""

from __future__ import annotations

import copy as _copy
import math
import os
import platform
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from . import _core

LLAMA_DEFAULT_SEED = 0xFFFFFFFF
LLAMA_TOKEN_NULL = -1

__all__ = [
    "LLAMA_DEFAULT_SEED",
    "TokenDataArray",
    "Sampler",
    "SamplerChain",
    "SamplerParams",
    "GreedySampler",
    "DistSampler",
    "TopKSampler",
    "TopPSampler",
    "MinPSampler",
    "TypicalSampler",
    "TempSampler",
    "TempExtSampler",
    "XTCSampler",
    "TopNSigmaSampler",
    "MirostatSampler",
    "MirostatV2Sampler",
    "AdaptivePSampler",
    "PenaltiesSampler",
    "DrySampler",
    "LogitBiasSampler",
    "EmptySampler",
]

# ----------------------------------------------------------------------------------------
# token data array


_ARANGE_CACHE: dict[int, np.ndarray] = {}
_ZEROS_CACHE: dict[int, np.ndarray] = {}


def _shared(cache: dict, n: int, make) -> np.ndarray:
    """A read-only array cached per length: the ids / p of a full-vocabulary array."""
    a = cache.get(n)
    if a is None:
        a = make(n)
        a.flags.writeable = False
        cache[n] = a
    return a


class TokenDataArray:
    """llama.cpp's ``llama_token_data_array``: the candidates a chain works on.

    ``ids`` int32 [size], ``logits`` float32 [size], ``p`` float32 [size] (probabilities,
    valid only after a sampler computed them), ``selected`` (index into the arrays, -1
    until a selecting sampler ran) and ``sorted`` (True when logits are in descending order).
    Samplers shrink, reorder or change the candidates by replacing the arrays, never by
    writing into them: ``ids`` may be a shared arange and ``logits`` a read-only view of
    the context's logits buffer.
    """

    __slots__ = ("ids", "logits", "p", "selected", "sorted")

    def __init__(self, ids, logits, p=None, selected: int = -1, sorted: bool = False):
        self.ids = np.asarray(ids, dtype=np.int32)
        self.logits = np.array(logits, dtype=np.float32)  # own copy
        if self.ids.shape != self.logits.shape or self.ids.ndim != 1:
            raise ValueError(
                f"TokenDataArray: ids {self.ids.shape} and logits {self.logits.shape} must be "
                "1-d arrays of the same length"
            )
        self.p = (
            np.zeros(self.logits.shape, np.float32) if p is None else np.array(p, dtype=np.float32)
        )
        if self.p.shape != self.logits.shape:
            raise ValueError(f"TokenDataArray: p {self.p.shape} must match logits {self.logits.shape}")
        self.selected = int(selected)
        self.sorted = bool(sorted)

    @classmethod
    def from_logits(cls, logits) -> "TokenDataArray":
        """All tokens of a vocabulary: ids 0..n-1 with one row of logits [n_vocab]."""
        row = np.asarray(logits)
        if row.ndim != 1:
            raise ValueError(f"from_logits: expected one row of logits [n_vocab], got shape {row.shape}")
        self = cls.__new__(cls)
        n = row.shape[0]
        self.ids = _shared(_ARANGE_CACHE, n, lambda n: np.arange(n, dtype=np.int32))
        # no copy: samplers never write in place, they replace the arrays; read-only makes sure
        logits = row.astype(np.float32, copy=False).view()
        logits.flags.writeable = False
        self.logits = logits
        self.p = _shared(_ZEROS_CACHE, n, lambda n: np.zeros(n, np.float32))
        self.selected = -1
        self.sorted = False
        return self

    @property
    def size(self) -> int:
        return int(self.logits.shape[0])

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"TokenDataArray(size={self.size}, selected={self.selected}, sorted={self.sorted})"

    def copy(self) -> "TokenDataArray":
        return TokenDataArray(self.ids.copy(), self.logits, self.p, self.selected, self.sorted)

    # -- the arrays to and from Rust ------------------------------------------------------

    def arrays(self) -> tuple:
        """(ids int32, logits float32, p float32, selected, sorted): the candidates as the
        Rust samplers (``_core.sampler_*``) take them."""
        return (np.asarray(self.ids, np.int32), np.asarray(self.logits, np.float32),
                np.asarray(self.p, np.float32), int(self.selected), bool(self.sorted))

    def assign(self, t: tuple) -> None:
        """Replace the candidates with ``t``, a tuple as :meth:`arrays` gives (what the
        Rust samplers return)."""
        self.ids, self.logits, self.p, self.selected, self.sorted = t

    def _softmax(self, do_sort: bool) -> None:
        """``llama_sampler_softmax_impl``: p = softmax(logits), sorted first if ``do_sort``."""
        self.assign(_core.sampler_softmax(*self.arrays(), bool(do_sort)))


def _top_indices(logits: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest values of ``logits`` [n] (float32), largest first (ties:
    lower position first, NaN last): the sort every sampler uses."""
    return _core.top_k_indices(logits, max(int(k), 0))


# ----------------------------------------------------------------------------------------
# random numbers as llama.cpp draws them

#: ``std::mt19937`` plus libstdc++'s ``uniform_real_distribution`` / ``discrete_distribution``
_StdRng = _core.StdRng


def _rng_seed(seed: int) -> int:
    """``get_rng_seed``: LLAMA_DEFAULT_SEED means "pick one at random"."""
    seed = int(seed) & 0xFFFFFFFF
    if seed == LLAMA_DEFAULT_SEED:
        return int.from_bytes(os.urandom(4), "little")
    return seed


# The C library's float functions as the samplers call them (Rust's f32 exp / ln / log2 /
# powf are libm's expf / logf / log2f / powf, as llama.cpp's), for tests and tools.

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i486", "i586", "i686", "x86")
_LIBM: dict | None = None


def _libm() -> dict:
    """The C library's expf / logf / log2f / powf through ctypes ({} when unavailable)."""
    global _LIBM
    if _LIBM is None:
        import ctypes
        import sys

        names = {"win32": ["ucrtbase", "msvcrt"], "darwin": ["libm.dylib", "libSystem.dylib"]}.get(
            sys.platform, ["libm.so.6", "libm.so"])
        found: dict = {}
        for name in names:
            try:
                lib = ctypes.CDLL(name)
                fns = {f: getattr(lib, f) for f in ("expf", "logf", "log2f", "powf")}
            except (OSError, AttributeError):
                continue
            for f, fn in fns.items():
                fn.restype = ctypes.c_float
                fn.argtypes = [ctypes.c_float] * (2 if f == "powf" else 1)
            found = fns
            break
        _LIBM = found
    return _LIBM


def _expf(x) -> np.ndarray:
    return _core.sampler_libm("expf", np.atleast_1d(np.asarray(x, np.float32)))


def _logf(x) -> np.ndarray:
    return _core.sampler_libm("logf", np.atleast_1d(np.asarray(x, np.float32)))


def _log2f(x) -> np.ndarray:
    return _core.sampler_libm("log2f", np.atleast_1d(np.asarray(x, np.float32)))


def _powf(x, y) -> np.float32:
    return np.float32(_core.sampler_powf(float(np.float32(x)), float(np.float32(y))))


def _mirostat_k(k, machine: str | None = None) -> int:
    """``std::max(int(k), 1)``: mirostat v1's top-k size. ``int(k)`` of NaN or an
    out-of-range k is what the CPU's conversion gives (x86-64's cvttss2si: INT_MIN, so 1;
    aarch64's fcvtzs saturates), as in llama.cpp there."""
    x86 = _X86 if machine is None else machine.lower() in ("x86_64", "amd64", "i386", "i686", "x86")
    return max(_core.sampler_c_int(float(np.float32(k)), x86), 1)


# ----------------------------------------------------------------------------------------
# samplers


class Sampler:
    """One sampler: ``apply`` edits a :class:`TokenDataArray`, ``accept`` sees each chosen
    token, ``reset`` returns to the freshly built state, ``clone`` copies the state."""

    name = "?"

    def apply(self, cur: TokenDataArray) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def accept(self, token: int) -> None:
        pass

    def reset(self) -> None:
        pass

    def clone(self) -> "Sampler":
        return _copy.deepcopy(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class EmptySampler(Sampler):
    """What a constructor returns when its parameters disable it (llama.cpp names it ``?name``)."""

    def __init__(self, name: str):
        self.name = name

    def apply(self, cur: TokenDataArray) -> None:
        pass


class _Builtin(Sampler):
    """A built-in sampler: its parameters here, its math and state in Rust (``self._r``,
    a ``_core.SamplerState``)."""

    _r: "_core.SamplerState"

    def apply(self, cur: TokenDataArray) -> None:
        cur.assign(self._r.apply(*cur.arrays()))

    def accept(self, token: int) -> None:
        self._r.accept(int(token))

    def reset(self) -> None:
        self._r.reset(0)


def _is_builtin(s: Sampler) -> bool:
    """Whether ``s`` is a built-in sampler used as built (apply / accept not overridden), so
    a chain can hand it to Rust with its neighbours."""
    t = type(s)
    return (isinstance(s, _Builtin) and t.apply is _Builtin.apply and t.accept is _Builtin.accept
            and "apply" not in s.__dict__ and "accept" not in s.__dict__)


class _Seeded(_Builtin):
    """A built-in sampler with a random number generator (seed, seed_cur as llama.cpp's)."""

    def _seed(self, seed: int) -> int:
        self.seed = int(seed) & 0xFFFFFFFF
        self.seed_cur = _rng_seed(self.seed)
        return self.seed_cur

    def reset(self) -> None:
        self.seed_cur = _rng_seed(self.seed)
        self._r.reset(self.seed_cur)


class GreedySampler(_Builtin):
    name = "greedy"

    def __init__(self) -> None:
        self._r = _core.SamplerState.greedy()


class DistSampler(_Seeded):
    """Softmax over the candidates, then one uniform double picks by cumulative mass."""

    name = "dist"

    def __init__(self, seed: int = LLAMA_DEFAULT_SEED):
        self._r = _core.SamplerState.dist(self._seed(seed))


class TopKSampler(_Builtin):
    name = "top-k"

    def __init__(self, k: int):
        self.k = int(k)
        self._r = _core.SamplerState.top_k(self.k)


class TopPSampler(_Builtin):
    name = "top-p"

    def __init__(self, p: float, min_keep: int = 1):
        self.p = float(np.float32(p))
        self.min_keep = int(min_keep)
        self._r = _core.SamplerState.top_p(self.p, self.min_keep)


class MinPSampler(_Builtin):
    name = "min-p"

    def __init__(self, p: float, min_keep: int = 1):
        self.p = float(np.float32(p))
        self.min_keep = int(min_keep)
        self._r = _core.SamplerState.min_p(self.p, self.min_keep)


class TypicalSampler(_Builtin):
    name = "typical"

    def __init__(self, p: float, min_keep: int = 1):
        self.p = float(np.float32(p))
        self.min_keep = int(min_keep)
        self._r = _core.SamplerState.typical(self.p, self.min_keep)


class TempSampler(_Builtin):
    name = "temp"

    def __init__(self, t: float):
        self.temp = float(np.float32(t))
        self._r = _core.SamplerState.temp(self.temp)


class TempExtSampler(_Builtin):
    """Dynamic temperature: entropy of the candidates maps into [temp - delta, temp + delta]."""

    name = "temp-ext"

    def __init__(self, t: float, delta: float, exponent: float):
        self.temp = float(np.float32(t))
        self.delta = float(np.float32(delta))
        self.exponent = float(np.float32(exponent))
        self._r = _core.SamplerState.temp_ext(self.temp, self.delta, self.exponent)


class XTCSampler(_Seeded):
    """Exclude top choices: with probability p, drop every candidate above the threshold but
    the least likely of them."""

    name = "xtc"

    def __init__(self, p: float, t: float, min_keep: int = 1, seed: int = LLAMA_DEFAULT_SEED):
        self.probability = float(np.float32(p))
        self.threshold = float(np.float32(t))
        self.min_keep = int(min_keep)
        self._r = _core.SamplerState.xtc(self.probability, self.threshold, self.min_keep, self._seed(seed))


class TopNSigmaSampler(_Builtin):
    """Keep logits within n standard deviations of the maximum (others become -inf)."""

    name = "top-n-sigma"

    def __init__(self, n: float):
        self.n = float(np.float32(n))
        self._r = _core.SamplerState.top_n_sigma(self.n)


class MirostatSampler(_Seeded):
    """Mirostat 1.0 (llama.cpp's ``llama_sampler_init_mirostat``): estimate the Zipf
    exponent from the ``m`` most likely tokens, keep the k tokens that give surprise ``mu``,
    draw one, move ``mu`` toward ``tau``. ``m <= 0`` uses every candidate (llama.cpp's loop
    bound is ``size_t(m - 1)``)."""

    name = "mirostat"

    def __init__(self, n_vocab: int, seed: int, tau: float, eta: float, m: int = 100):
        self.n_vocab = int(n_vocab)
        self.tau = np.float32(tau)
        self.eta = np.float32(eta)
        self.m = int(m)
        self._r = _core.SamplerState.mirostat(self.n_vocab, self._seed(seed), float(self.tau),
                                              float(self.eta), self.m)

    @property
    def mu(self) -> np.float32:
        return np.float32(self._r.mu)


class MirostatV2Sampler(_Seeded):
    """Mirostat 2.0 (``llama_sampler_init_mirostat_v2``): keep the candidates whose surprise
    -log2(p) is at most ``mu`` (at least one), draw one, move ``mu`` toward ``tau``."""

    name = "mirostat-v2"

    def __init__(self, seed: int, tau: float, eta: float):
        self.tau = np.float32(tau)
        self.eta = np.float32(eta)
        self._r = _core.SamplerState.mirostat_v2(self._seed(seed), float(self.tau), float(self.eta))

    @property
    def mu(self) -> np.float32:
        return np.float32(self._r.mu)


class AdaptivePSampler(_Seeded):
    """llama_sampler_init_adaptive_p: select tokens whose original probability is near
    ``target``, steering with an exponential moving average of the chosen tokens'
    probabilities (decay clamped to [0, 0.99]); a negative target samples the
    distribution as it is. It selects, so it ends a chain. The math is Rust's
    (``_core.SamplerState.adaptive_p``), float32 as llama.cpp; the draw is
    std::discrete_distribution over std::mt19937."""

    name = "adaptive-p"

    def __init__(self, target: float, decay: float, seed: int) -> None:
        self.target = np.float32(target)
        self.decay = np.float32(min(max(float(np.float32(decay)), 0.0), 0.99))
        self._r = _core.SamplerState.adaptive_p(float(self.target), float(self.decay), self._seed(seed))

    @property
    def weighted_sum(self) -> np.float32:
        return np.float32(self._r.ema[0])

    @property
    def total_weight(self) -> np.float32:
        return np.float32(self._r.ema[1])


class PenaltiesSampler(_Builtin):
    """Repeat / frequency / presence penalties over the last ``penalty_last_n`` accepted tokens."""

    name = "penalties"

    def __init__(self, penalty_last_n: int, penalty_repeat: float, penalty_freq: float,
                 penalty_present: float):
        self.penalty_last_n = max(int(penalty_last_n), 0)
        self.penalty_repeat = float(np.float32(penalty_repeat))
        self.penalty_freq = float(np.float32(penalty_freq))
        self.penalty_present = float(np.float32(penalty_present))
        self._r = _core.SamplerState.penalties(self.penalty_last_n, self.penalty_repeat,
                                               self.penalty_freq, self.penalty_present)

    @property
    def prev(self) -> list[int]:
        """The last ``penalty_last_n`` accepted tokens, oldest first."""
        return self._r.history

    @property
    def token_count(self) -> dict[int, int]:
        return dict(Counter(self._r.history))


def _bias_token(t, name: str, n_vocab: int) -> int:
    """A logit-bias key as a token id: an int, or a string of digits (JSON object keys are
    strings, so llama-cpp-python's int(key) accepts '15043'); 0 <= id < n_vocab when
    n_vocab > 0."""
    if isinstance(t, str):
        txt = t.strip()
        if not (txt[1:] if txt[:1] in "+-" else txt).isdigit() or not txt.isascii():
            raise ValueError(f"{name}: key {t!r} is not a token id (keys are token ids: ints "
                             "or strings of digits such as '15043')")
        tok = int(txt)
    elif isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_)):
        tok = int(t)
    else:
        raise TypeError(f"{name}: key {t!r} ({type(t).__name__}) is not a token id (keys are "
                        "token ids: ints or strings of digits such as '15043')")
    if tok < 0 or (n_vocab > 0 and tok >= n_vocab):
        raise ValueError(f"{name}: token id {tok} is out of range (the vocabulary has "
                         f"{n_vocab} tokens: ids 0..{n_vocab - 1})" if n_vocab > 0 else
                         f"{name}: token id {tok} is negative")
    return tok


def _bias_value(b, name: str, tok: int) -> float:
    if isinstance(b, (bool, np.bool_)) or not isinstance(b, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: the bias of token {tok} must be a number, got "
                        f"{type(b).__name__} {b!r}")
    v = float(b)
    if math.isnan(v):
        raise ValueError(f"{name}: the bias of token {tok} is NaN (use -inf to ban a token)")
    with np.errstate(over="ignore"):  # beyond float32: +-inf, as C's float conversion
        return float(np.float32(v))


def normalize_logit_bias(logit_bias, n_vocab: int = 0, name: str = "logit_bias") -> list[tuple[int, float]]:
    """``logit_bias`` as checked (token, bias) pairs: a {token: bias} mapping or an iterable
    of (token, bias) pairs / objects with ``.token`` and ``.bias``. Token ids are ints or
    strings of digits, within 0..n_vocab-1 (when ``n_vocab`` > 0); biases are numbers, not
    NaN (+-inf allowed). Anything else raises TypeError / ValueError naming ``name``."""
    if logit_bias is None:
        return []
    if isinstance(logit_bias, (str, bytes)) or not hasattr(logit_bias, "__iter__"):
        raise TypeError(f"{name} must be a dict {{token_id: bias}} or (token_id, bias) pairs, "
                        f"got {type(logit_bias).__name__}")
    items = logit_bias.items() if hasattr(logit_bias, "items") else logit_bias
    out = []
    for i, item in enumerate(items):
        if hasattr(item, "token") and hasattr(item, "bias"):
            t, b = item.token, item.bias
        else:
            try:
                t, b = item
            except (TypeError, ValueError):
                raise TypeError(f"{name}[{i}] must be a (token_id, bias) pair, got {item!r}") from None
        tok = _bias_token(t, name, int(n_vocab))
        out.append((tok, _bias_value(b, name, tok)))
    return out


class LogitBiasSampler(_Builtin):
    name = "logit-bias"

    def __init__(self, n_vocab: int, logit_bias: Iterable):
        """``logit_bias``: (token, bias) pairs or a {token: bias} mapping (checked by
        :func:`normalize_logit_bias`: bad keys, values or ids raise TypeError / ValueError)."""
        self.n_vocab = int(n_vocab)
        self.logit_bias = normalize_logit_bias(logit_bias, self.n_vocab)
        self._r = _core.SamplerState.logit_bias(self.logit_bias)


class DrySampler(_Builtin):
    """DRY ("don't repeat yourself"): penalize tokens that would extend a repetition of the
    recent context, except across sequence breakers (llama.cpp's Z-algorithm version).

    ``breakers`` maps a head token to the tail token sequences that complete a breaker
    (empty tail = single-token breaker), as llama.cpp's ``dry_processed_breakers``.
    """

    name = "dry"

    def __init__(self, dry_multiplier: float, dry_base: float, dry_allowed_length: int,
                 dry_penalty_last_n: int, breakers: dict[int, list[list[int]]] | None = None):
        self.dry_multiplier = float(np.float32(dry_multiplier))
        self.dry_base = float(np.float32(dry_base))
        self.dry_allowed_length = int(dry_allowed_length)
        self.dry_penalty_last_n = max(int(dry_penalty_last_n), 0)
        self.breakers: dict[int, list[list[int]]] = breakers or {}
        self._r = _core.SamplerState.dry(self.dry_multiplier, self.dry_base, self.dry_allowed_length,
                                         self.dry_penalty_last_n, self.breakers)

    @property
    def last_tokens(self) -> list[int]:
        """The last ``dry_penalty_last_n`` accepted tokens, oldest first."""
        return self._r.history


def dry_breakers_from_strings(vocab, seq_breakers: Sequence[str], max_char_len: int = 40,
                              max_seq_len: int = 20) -> dict[int, list[list[int]]]:
    """llama.cpp's ``get_overlapping_token_sequences`` for each breaker string: every token
    whose text contains the breaker is a single-token breaker; a token whose text ends with
    a prefix of the breaker starts one whose tail is the tokenization of the rest.

    ``vocab`` needs ``n_tokens``, ``token_to_piece(id) -> str`` (special tokens rendered) and
    ``tokenize(text) -> list[int]`` (no BOS, no special parsing); see :func:`_vocab_adapter`.
    """
    n_tokens, piece, tokenize = _vocab_adapter(vocab)
    words = [piece(t) for t in range(n_tokens)]
    out: dict[int, list[list[int]]] = {}
    for s in seq_breakers:
        if not s:
            continue
        s = s[:max_char_len]
        for tid, word in enumerate(words):
            if s in word:
                out.setdefault(tid, [])
                if [] not in out[tid]:
                    out[tid].append([])
                continue
            pos = word.find(s[0])
            while pos != -1:
                i = 1
                match = True
                while i < len(s) and i + pos < len(word):
                    if word[pos + i] != s[i]:
                        match = False
                        break
                    i += 1
                if match:
                    toks = list(tokenize(s[i:]))[:max_seq_len]
                    lst = out.setdefault(tid, [])
                    if toks not in lst:
                        lst.append(toks)
                pos = word.find(s[0], pos + 1)
    return out


def _vocab_adapter(vocab):
    """(n_tokens, piece(id) -> str, tokenize(str) -> ids) from a pyllama Vocab or a Model."""
    v = getattr(vocab, "vocab", vocab)
    n = getattr(v, "n_tokens", None)
    n = n() if callable(n) else n
    if n is None:
        n = len(v)

    def piece(t: int) -> str:
        if hasattr(v, "token_to_piece"):
            r = v.token_to_piece(t, special=True)
        else:
            r = v.detokenize([t], special=True)
        return r.decode("utf-8", "replace") if isinstance(r, (bytes, bytearray)) else r

    def tokenize(text: str):
        return v.tokenize(text, add_special=False, parse_special=False)

    return int(n), piece, tokenize


# ----------------------------------------------------------------------------------------
# chains


class SamplerChain(Sampler):
    """An ordered list of samplers applied one after the other; the last one selects.

    ``sample(logits)`` takes one row [n_vocab] and returns the chosen token id (and accepts
    it, so penalties and mirostat see it). Timing is kept unless ``no_perf``. Consecutive
    built-in samplers run in one Rust call; a chain of only built-ins samples a row (apply
    and accept) in one call.
    """

    name = "chain"

    def __init__(self, samplers: Iterable[Sampler] = (), *, no_perf: bool = True):
        self.samplers: list[Sampler] = list(samplers)
        self.no_perf = bool(no_perf)
        self.t_sample_us = 0.0
        self.n_sample = 0
        # candidates after the last sample (their p are the final probabilities)
        self.last: TokenDataArray | None = None

    # list-like
    def add(self, smpl: Sampler) -> "SamplerChain":
        if not isinstance(smpl, Sampler):
            raise TypeError(f"SamplerChain.add: expected a Sampler, got {type(smpl).__name__}")
        self.samplers.append(smpl)
        return self

    def __len__(self) -> int:
        return len(self.samplers)

    def __getitem__(self, i: int) -> Sampler:
        return self.samplers[i]

    def remove(self, i: int) -> Sampler:
        return self.samplers.pop(i)

    def __repr__(self) -> str:
        return "SamplerChain(" + " -> ".join(s.name for s in self.samplers) + ")"

    def describe(self) -> str:
        """``logits -> top-k -> ... -> dist``, the way llama.cpp prints a chain."""
        return " -> ".join(["logits"] + [s.name for s in self.samplers])

    # sampler interface
    def _plan(self) -> tuple:
        """(key, samplers whose apply does something, samplers whose accept does something,
        steps, all-built-in run), recomputed when ``samplers`` changes. A step is a list of
        consecutive built-in samplers (one Rust call) or one other sampler; the last item
        is that list when it is the only step and every accept is a built-in's (the chain
        then samples a row in one call), else None."""
        key = tuple(self.samplers)
        plan = self.__dict__.get("_plan_cache")
        if plan is None or plan[0] != key:
            applies = tuple(s for s in key if not isinstance(s, EmptySampler) or "apply" in s.__dict__)
            accepts = tuple(s for s in key if type(s).accept is not Sampler.accept or "accept" in s.__dict__)
            steps: list = []
            for s in applies:
                if not _is_builtin(s):
                    steps.append(s)
                elif steps and isinstance(steps[-1], list):
                    steps[-1].append(s)
                else:
                    steps.append([s])
            whole = None
            if len(steps) <= 1 and all(_is_builtin(s) for s in accepts) and (
                    not steps or isinstance(steps[0], list)):
                whole = steps[0] if steps else []
            plan = self._plan_cache = (key, applies, accepts, steps, whole)
        return plan

    def apply(self, cur: TokenDataArray) -> None:
        t0 = time.perf_counter() if not self.no_perf else 0.0
        for step in self._plan()[3]:
            if isinstance(step, list):
                cur.assign(_core.sampler_chain_apply([s._r for s in step], *cur.arrays()))
            else:
                step.apply(cur)
        if not self.no_perf:
            self.t_sample_us += (time.perf_counter() - t0) * 1e6

    def accept(self, token: int) -> None:
        t0 = time.perf_counter() if not self.no_perf else 0.0
        for s in self._plan()[2]:
            s.accept(token)
        self.n_sample += 1
        if not self.no_perf:
            self.t_sample_us += (time.perf_counter() - t0) * 1e6

    def reset(self) -> None:
        for s in self.samplers:
            s.reset()

    def clone(self) -> "SamplerChain":
        return SamplerChain([s.clone() for s in self.samplers], no_perf=self.no_perf)

    def _no_token(self, cur: TokenDataArray) -> RuntimeError:
        return RuntimeError(
            f"sampler chain {self.describe()} selected no token (selected={cur.selected}, "
            f"{cur.size} candidates left): end the chain with a selecting sampler "
            "(greedy, dist, mirostat)"
        )

    def sample(self, logits) -> int:
        """Apply the chain to one row of logits [n_vocab], accept and return the token."""
        whole = self._plan()[4]
        if (whole is not None and isinstance(logits, np.ndarray) and logits.dtype == np.float32
                and logits.ndim == 1 and logits.flags.c_contiguous):
            t0 = time.perf_counter() if not self.no_perf else 0.0
            token, r = _core.sampler_chain_sample([s._r for s in whole], logits)
            cur = TokenDataArray.__new__(TokenDataArray)
            cur.assign(r)
            if token < 0:
                raise self._no_token(cur)
            self.last = cur
            self.n_sample += 1
            if not self.no_perf:
                self.t_sample_us += (time.perf_counter() - t0) * 1e6
            return int(token)
        cur = TokenDataArray.from_logits(logits)
        self.apply(cur)
        if not (0 <= cur.selected < cur.size):
            raise self._no_token(cur)
        token = int(cur.ids[cur.selected])
        self.last = cur
        self.accept(token)
        return token

    # perf
    def perf(self) -> dict:
        return {"t_sample_ms": 1e-3 * self.t_sample_us, "n_sample": max(0, self.n_sample)}

    def perf_reset(self) -> None:
        self.t_sample_us = 0.0
        self.n_sample = 0

    @classmethod
    def from_params(cls, params: "SamplerParams | None" = None, *, n_vocab: int,
                    vocab=None, no_perf: bool | None = None) -> "SamplerChain":
        """The chain llama.cpp's common/sampling.cpp builds for these parameters."""
        params = params or SamplerParams()
        return build_chain(params, n_vocab=n_vocab, vocab=vocab, no_perf=no_perf)


@dataclass
class SamplerParams:
    """common_params_sampling's sampling fields with llama.cpp's defaults."""

    seed: int = LLAMA_DEFAULT_SEED
    min_keep: int = 0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.10
    typ_p: float = 1.0
    temp: float = 0.80
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    penalty_last_n: int = 64
    penalty_repeat: float = 1.0
    penalty_freq: float = 0.0
    penalty_present: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    mirostat: int = 0
    top_n_sigma: float = -1.0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.10
    no_perf: bool = False
    dry_sequence_breakers: list = field(default_factory=lambda: ["\n", ":", '"', "*"])
    samplers: list = field(default_factory=lambda: [
        "penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
        "temperature",
    ])
    logit_bias: dict = field(default_factory=dict)


def build_chain(params: SamplerParams, *, n_vocab: int, vocab=None,
                no_perf: bool | None = None) -> SamplerChain:
    """common_sampler_init's chain: logit bias, then the configured samplers, then dist (or
    temperature + mirostat). ``temp <= 0`` makes the temperature step keep only the best
    token, so the result is greedy."""
    p = params
    for name in ("temp", "top_p", "min_p", "typ_p", "penalty_repeat", "penalty_freq", "penalty_present"):
        if not math.isfinite(getattr(p, name)):
            raise ValueError(f"sampling parameter {name} must be finite, got {getattr(p, name)}")
    chain = SamplerChain(no_perf=p.no_perf if no_perf is None else no_perf)
    if p.logit_bias:
        chain.add(LogitBiasSampler(n_vocab, p.logit_bias))
    if p.mirostat == 0:
        for name in p.samplers:
            if name == "penalties":
                s = init_penalties(p.penalty_last_n, p.penalty_repeat, p.penalty_freq, p.penalty_present)
            elif name == "dry":
                s = init_dry(vocab, p.dry_multiplier, p.dry_base, p.dry_allowed_length,
                             p.dry_penalty_last_n, p.dry_sequence_breakers)
            elif name == "top_n_sigma":
                s = init_top_n_sigma(p.top_n_sigma)
            elif name == "top_k":
                s = init_top_k(p.top_k)
            elif name in ("typ_p", "typical", "typical_p"):
                s = init_typical(p.typ_p, p.min_keep)
            elif name == "top_p":
                s = init_top_p(p.top_p, p.min_keep)
            elif name == "min_p":
                s = init_min_p(p.min_p, p.min_keep)
            elif name == "xtc":
                s = init_xtc(p.xtc_probability, p.xtc_threshold, p.min_keep, p.seed)
            elif name in ("temperature", "temp"):
                s = init_temp_ext(p.temp, p.dynatemp_range, p.dynatemp_exponent)
            else:
                raise ValueError(f"unknown sampler {name!r} in SamplerParams.samplers")
            chain.add(s)
        chain.add(DistSampler(p.seed))
    elif p.mirostat == 1:
        chain.add(init_temp(p.temp))
        chain.add(MirostatSampler(n_vocab, p.seed, p.mirostat_tau, p.mirostat_eta, 100))
    elif p.mirostat == 2:
        chain.add(init_temp(p.temp))
        chain.add(MirostatV2Sampler(p.seed, p.mirostat_tau, p.mirostat_eta))
    else:
        raise ValueError(f"unknown mirostat version {p.mirostat} (expected 0, 1 or 2)")
    return chain


# Constructors with llama.cpp's "disabled -> empty sampler" rules (the llama_sampler_init_*
# functions in _api_sampling.py are these under their llama.h names).

def init_top_k(k: int) -> Sampler:
    return EmptySampler("?top-k") if k <= 0 else TopKSampler(k)


def init_top_p(p: float, min_keep: int = 1) -> Sampler:
    return EmptySampler("?top-p") if p >= 1.0 else TopPSampler(p, min_keep)


def init_min_p(p: float, min_keep: int = 1) -> Sampler:
    return EmptySampler("?min-p") if p <= 0.0 else MinPSampler(p, min_keep)


def init_typical(p: float, min_keep: int = 1) -> Sampler:
    return EmptySampler("?typical") if p >= 1.0 else TypicalSampler(p, min_keep)


def init_temp(t: float) -> Sampler:
    return EmptySampler("?temp") if t == 1.0 else TempSampler(t)


def init_temp_ext(t: float, delta: float, exponent: float) -> Sampler:
    if t == 1.0 and delta <= 0.0:
        return EmptySampler("?temp-ext")
    return TempExtSampler(t, delta, exponent)


def init_xtc(p: float, t: float, min_keep: int = 1, seed: int = LLAMA_DEFAULT_SEED) -> Sampler:
    return EmptySampler("?xtc") if (p <= 0.0 or t > 0.5) else XTCSampler(p, t, min_keep, seed)


def init_top_n_sigma(n: float) -> Sampler:
    return EmptySampler("?top-n-sigma") if n <= 0.0 else TopNSigmaSampler(n)


def init_penalties(last_n: int, repeat: float, freq: float, present: float) -> Sampler:
    last_n = max(int(last_n), 0)
    if last_n == 0 or (repeat == 1.0 and freq == 0.0 and present == 0.0):
        return EmptySampler("?penalties")
    return PenaltiesSampler(last_n, repeat, freq, present)


def init_dry(vocab, multiplier: float, base: float, allowed_length: int, penalty_last_n: int,
             seq_breakers: Sequence[str] = ()) -> Sampler:
    if isinstance(seq_breakers, (str, bytes)):
        raise TypeError(f"dry sequence breakers must be a list of str, got the single "
                        f"{type(seq_breakers).__name__} {seq_breakers!r} (wrap it in a list)")
    for i, b in enumerate(seq_breakers or ()):
        if not isinstance(b, str):
            raise TypeError(f"dry sequence breaker {i} must be a str, got {type(b).__name__} {b!r}")
    penalty_last_n = max(int(penalty_last_n), 0)
    if not (multiplier != 0.0 and base >= 1.0 and penalty_last_n != 0):
        return EmptySampler("?dry")
    breakers = dry_breakers_from_strings(vocab, seq_breakers) if (vocab is not None and seq_breakers) else {}
    return DrySampler(multiplier, base, allowed_length, penalty_last_n, breakers)


def init_logit_bias(n_vocab: int, logit_bias) -> Sampler:
    lb = LogitBiasSampler(n_vocab, logit_bias)
    return EmptySampler("?logit-bias") if not lb.logit_bias else lb
