"""Samplers and sampler chains (pipeline step 15): turn one row of logits into a token.

Semantics follow llama.cpp's src/llama-sampler.cpp sampler for sampler (which ones sort,
which keep ``min_keep``, which draw from the RNG and how many draws), so a chain built here
behaves like the same chain in llama.cpp. Everything is numpy on a :class:`TokenDataArray`
(three parallel arrays ``ids`` / ``logits`` / ``p`` plus ``selected`` and ``sorted``).

Speed: Gemma 3 has 262,144 tokens, so nothing in the usual chain sorts the whole row.
``top_k`` finds its candidates with a threshold estimated from a strided sample and
only then partitions/sorts the few survivors (see :func:`_top_indices`).

Random numbers: llama.cpp draws from ``std::mt19937`` seeded with the 32-bit seed and
turns the draws into floats the way libstdc++'s ``generate_canonical`` does. numpy's
MT19937 with legacy seeding is the same generator (same first outputs for the same seed),
and :class:`_StdRng` reproduces the float conversions, so a seed gives the same draws here
as in llama.cpp.
"""

from __future__ import annotations

import copy as _copy
import math
import os
import platform
import time
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
    "PenaltiesSampler",
    "DrySampler",
    "LogitBiasSampler",
    "EmptySampler",
]

# ----------------------------------------------------------------------------------------
# token data array


_ARANGE_CACHE: dict[int, np.ndarray] = {}
_ZEROS_CACHE: dict[int, np.ndarray] = {}


def _zeros(n: int) -> np.ndarray:
    """Read-only float32 [n] zeros, cached: the initial ``p`` of a full-vocabulary array."""
    a = _ZEROS_CACHE.get(n)
    if a is None:
        a = np.zeros(n, dtype=np.float32)
        a.flags.writeable = False
        _ZEROS_CACHE[n] = a
    return a


def _scratch(owner, src: np.ndarray) -> np.ndarray:
    """A writable copy of ``src`` in a buffer the sampler ``owner`` keeps between tokens.

    Samplers that change a few logits of the whole row (penalties, logit bias, DRY, top-n-
    sigma) need a writable row; a fresh 1 MB array per token costs page faults that exceed
    the rest of the chain, so each sampler reuses one. The previous token's array is dead
    by then (a chain never hands candidates from one sample to the next)."""
    buf = getattr(owner, "_buf", None)
    if buf is None or buf.shape != src.shape:
        buf = np.empty(src.shape, np.float32)
        owner._buf = buf
    np.copyto(buf, src)
    return buf


def _arange(n: int) -> np.ndarray:
    """Read-only int32 [n] 0..n-1, cached: every sample of an n-token vocabulary starts from it."""
    a = _ARANGE_CACHE.get(n)
    if a is None:
        a = np.arange(n, dtype=np.int32)
        a.flags.writeable = False
        _ARANGE_CACHE[n] = a
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
        self.logits = np.array(logits, dtype=np.float32)  # own copy: samplers write into it
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
        """All tokens of a vocabulary: ids 0..n-1 with a copy of one row of logits [n_vocab]."""
        row = np.asarray(logits)
        if row.ndim != 1:
            raise ValueError(f"from_logits: expected one row of logits [n_vocab], got shape {row.shape}")
        self = cls.__new__(cls)
        self.ids = _arange(row.shape[0])
        # No copy (a 1 MB copy of a Gemma row costs more than the whole default chain):
        # samplers never write in place, they replace the arrays; read-only makes sure.
        logits = row.astype(np.float32, copy=False).view()
        logits.flags.writeable = False
        self.logits = logits
        self.p = _zeros(row.shape[0])
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

    # -- helpers shared by the samplers (llama-sampler.cpp's *_impl functions) ----------

    def _take(self, idx) -> None:
        """Keep the candidates at positions ``idx`` (int array or slice), in that order."""
        self.ids = self.ids[idx]
        self.logits = self.logits[idx]
        self.p = self.p[idx]

    def _truncate(self, n: int) -> None:
        self._take(slice(0, n))

    def _sort(self, k: int | None = None) -> None:
        """``llama_token_data_array_partial_sort_inplace``: keep the k best, sorted descending."""
        n = self.size
        k = n if k is None else min(k, n)
        self._take(_top_indices(self.logits, k))
        self.sorted = True

    def _softmax(self, do_sort: bool) -> None:
        """``llama_sampler_softmax_impl``: p = softmax(logits) (float32, as expf does)."""
        if self.size == 0:
            raise ValueError("softmax of an empty candidate list")
        if do_sort and not self.sorted:
            self._sort()
        max_l = self.logits[0] if self.sorted else self.logits.max()
        p = _exp_shifted(self.logits, max_l)
        total = p.sum(dtype=np.float64)
        self.p = (p / np.float32(total)).astype(np.float32, copy=False)


def _exp_shifted(logits: np.ndarray, max_l) -> np.ndarray:
    """exp(logits - max) in float32 (expf), also when the maximum is not finite: +inf logits
    (a temperature near 0 overflows) share all the mass, all -inf gives a uniform draw
    (llama.cpp would produce NaN there)."""
    if math.isfinite(max_l):
        # the usual case, without errstate (it costs more than the exp of 40 values): every
        # exponent is <= 0, so nothing overflows; underflow to 0 is silent in numpy
        return np.exp(logits - max_l)
    if np.isposinf(max_l):
        return (logits == max_l).astype(np.float32)
    if np.isneginf(max_l) or np.isnan(max_l):
        return np.ones(logits.shape, np.float32)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        return np.exp(logits - max_l)


def _select_k(vals: np.ndarray, k: int) -> np.ndarray:
    """Positions (ascending) of the k largest of ``vals``; on ties at the cut the lower
    positions win, so results do not depend on the partition algorithm."""
    n = vals.shape[0]
    if k >= n:
        return np.arange(n)
    kth = np.partition(vals, n - k)[n - k]
    above = np.flatnonzero(vals > kth)
    eq = np.flatnonzero(vals == kth)[: k - above.shape[0]]
    res = np.concatenate([above, eq])
    if res.shape[0] != k:  # NaN somewhere: fall back to a full ordering (NaN last)
        return np.sort(np.argsort(-vals, kind="stable")[:k])
    res.sort()
    return res


def _top_indices(logits: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest values of ``logits`` [n], largest first (ties: lower position
    first). Never sorts the whole row when k is small: a threshold from a strided sample
    selects a few hundred candidates in one vectorized pass, and only those are sorted."""
    n = logits.shape[0]
    if k <= 0:
        return np.zeros(0, np.intp)
    if k <= 1024 and logits.dtype == np.float32:
        # one pass in Rust, same order (the numpy path below is its reference)
        return _core.top_k_indices(logits, k)
    return _top_indices_np(logits, k)


def _top_indices_np(logits: np.ndarray, k: int) -> np.ndarray:
    """:func:`_top_indices` in numpy (any k, any float dtype)."""
    n = logits.shape[0]
    if k <= 0:
        return np.zeros(0, np.intp)
    if k < n and n > 4096 and k <= 1024:
        # The sample's (k_s)-th best is, in expectation, about the (k_s * stride)-th best of
        # the row; with k_s * stride >= 4k there are almost always >= k values above it.
        stride = 64
        sample = logits[::stride]
        k_s = min(sample.shape[0], max(4, (4 * k) // stride + 1))
        thr = np.partition(sample, sample.shape[0] - k_s)[sample.shape[0] - k_s]
        cand = np.flatnonzero(logits >= thr)
        if k <= cand.shape[0] <= 64 * k + 4096:
            vals = logits[cand]
            part = _select_k(vals, k)
            cand, vals = cand[part], vals[part]
            return cand[np.argsort(-vals, kind="stable")]
    part = _select_k(logits, k)
    return part[np.argsort(-logits[part], kind="stable")]


# ----------------------------------------------------------------------------------------
# random numbers as llama.cpp draws them


class _StdRng:
    """``std::mt19937`` plus libstdc++'s ``uniform_real_distribution`` conversions."""

    __slots__ = ("_bg",)

    def __init__(self, seed: int):
        self._bg = np.random.MT19937()
        self.seed(seed)

    def seed(self, seed: int) -> None:
        # legacy seeding is init_genrand(seed): exactly std::mt19937(seed)
        self._bg._legacy_seeding(int(seed) & 0xFFFFFFFF)

    def next_u32(self) -> int:
        return int(self._bg.random_raw())

    def uniform_double(self) -> float:
        """generate_canonical<double, 53>: two 32-bit draws, (r1 + r2 * 2^32) / 2^64."""
        r1, r2 = self._bg.random_raw(2)
        x = (float(r1) + float(r2) * 4294967296.0) / 18446744073709551616.0
        return x if x < 1.0 else math.nextafter(1.0, 0.0)

    def uniform_float(self) -> float:
        """generate_canonical<float, 24>: one draw, float(r) / 2^32 in float32."""
        x = np.float32(np.float32(int(self._bg.random_raw())) / np.float32(4294967296.0))
        return float(x) if x < 1.0 else float(np.nextafter(np.float32(1.0), np.float32(0.0)))

    def discrete(self, p: np.ndarray) -> int:
        """std::discrete_distribution<int>(p)(rng), as libstdc++ (bits/random.tcc) does it.

        Fewer than two weights: ``param_type::_M_initialize`` clears them and ``operator()``
        returns 0 *without drawing*, so a single candidate consumes no random numbers.
        Otherwise: the double weights are summed left to right (``std::accumulate``),
        divided by the sum, accumulated left to right (``std::partial_sum``), the last
        cumulative value is set to 1, and one uniform double picks by ``lower_bound``."""
        if p.shape[0] < 2:
            return 0
        w = p.astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):  # all-zero weights: NaN, index 0
            cp = np.cumsum(w / np.cumsum(w)[-1])  # cumsum: the sequential order of the C loops
        cp[-1] = 1.0
        return int(np.searchsorted(cp, self.uniform_double(), side="left"))

    def __deepcopy__(self, memo):
        other = _StdRng.__new__(_StdRng)
        other._bg = np.random.MT19937()
        other._bg.state = self._bg.state
        return other


def _rng_seed(seed: int) -> int:
    """``get_rng_seed``: LLAMA_DEFAULT_SEED means "pick one at random"."""
    seed = int(seed) & 0xFFFFFFFF
    if seed == LLAMA_DEFAULT_SEED:
        return int.from_bytes(os.urandom(4), "little")
    return seed


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


class GreedySampler(Sampler):
    name = "greedy"

    def apply(self, cur: TokenDataArray) -> None:
        if cur.size == 0:
            cur.selected = -1
            return
        cur.selected = int(np.argmax(cur.logits))  # first maximum, as the C loop's strict >


class DistSampler(Sampler):
    """Softmax over the candidates, then one uniform double picks by cumulative mass."""

    name = "dist"

    def __init__(self, seed: int = LLAMA_DEFAULT_SEED):
        self.seed = int(seed) & 0xFFFFFFFF
        self.seed_cur = _rng_seed(self.seed)
        self.rng = _StdRng(self.seed_cur)

    def apply(self, cur: TokenDataArray) -> None:
        if cur.size == 0:
            cur.selected = -1
            return
        cur.selected = 0
        if cur.size == 1:
            self._draw()  # llama.cpp draws once even here, keep the stream aligned
            cur.p = np.ones(1, np.float32)
            return
        max_l = cur.logits[0] if cur.sorted else cur.logits.max()
        p = _exp_shifted(cur.logits, max_l)  # float32 like expf
        # sum_run in llama.cpp is a running double sum: cumsum in float64 is the same order
        cum = np.cumsum(p, dtype=np.float64)
        sum_cum = cum[-1]
        rnd = self._draw()
        sel = int(np.searchsorted(cum, sum_cum * rnd, side="left"))
        cur.selected = min(sel, cur.size - 1)
        cur.p = (p / sum_cum).astype(np.float32)

    def _draw(self) -> float:
        """The next uniform double, or the one the chain's fused path drew for this sample
        before it found the row needed the samplers (so the stream stays aligned)."""
        rnd = self.__dict__.pop("_pending", None)
        return self.rng.uniform_double() if rnd is None else rnd

    def reset(self) -> None:
        self.__dict__.pop("_pending", None)
        self.seed_cur = _rng_seed(self.seed)
        self.rng.seed(self.seed_cur)


class TopKSampler(Sampler):
    name = "top-k"

    def __init__(self, k: int):
        self.k = int(k)

    def apply(self, cur: TokenDataArray) -> None:
        _top_k_impl(cur, self.k)


def _top_k_impl(cur: TokenDataArray, k: int) -> None:
    if k <= 0:
        return
    k = min(k, cur.size)
    if not cur.sorted:
        cur._sort(k)
    cur._truncate(k)


class TopPSampler(Sampler):
    name = "top-p"

    def __init__(self, p: float, min_keep: int = 1):
        self.p = float(np.float32(p))
        self.min_keep = int(min_keep)

    def apply(self, cur: TokenDataArray) -> None:
        if self.p >= 1.0 or cur.size == 0:
            return
        cur._softmax(False)
        if not cur.sorted:
            # probabilities of the whole row are already right; sorting only orders them
            order = _top_indices(cur.logits, min(256, cur.size))
            probs = cur.p[order]
            last = _top_p_cut(probs, self.p, self.min_keep)
            if last is None:
                order = _top_indices(cur.logits, cur.size)
                last = _top_p_cut(cur.p[order], self.p, self.min_keep)
                if last is None:
                    last = cur.size
            cur._take(order[:last])
            cur.sorted = True
        else:
            last = _top_p_cut(cur.p, self.p, self.min_keep)
            cur._truncate(cur.size if last is None else last)


def _top_p_cut(probs: np.ndarray, p: float, min_keep: int) -> int | None:
    """First i+1 with cumsum[i] >= p and i+1 >= min_keep (float32 running sum), or None."""
    cum = np.cumsum(probs, dtype=np.float32)
    ok = cum >= np.float32(p)
    if min_keep > 1:
        ok[: min_keep - 1] = False
    hits = np.flatnonzero(ok)
    return int(hits[0]) + 1 if hits.shape[0] else None


class MinPSampler(Sampler):
    name = "min-p"

    def __init__(self, p: float, min_keep: int = 1):
        self.p = float(np.float32(p))
        self.min_keep = int(min_keep)

    def apply(self, cur: TokenDataArray) -> None:
        if self.p <= 0.0 or cur.size == 0:
            return
        log_p = np.float32(math.log(self.p))
        if not cur.sorted:
            min_logit = cur.logits.max() + log_p
            keep = np.flatnonzero(cur.logits >= min_logit)
            if keep.shape[0] and keep.shape[0] >= self.min_keep:
                cur._take(keep)
                return
            cur._sort()
        min_logit = cur.logits[0] + log_p
        below = cur.logits < min_logit
        below[: max(1, self.min_keep)] = False  # the first token always stays, and min_keep
        hits = np.flatnonzero(below)
        cur._truncate(int(hits[0]) if hits.shape[0] else cur.size)


class TypicalSampler(Sampler):
    name = "typical"

    def __init__(self, p: float, min_keep: int = 1):
        self.p = float(np.float32(p))
        self.min_keep = int(min_keep)

    def apply(self, cur: TokenDataArray) -> None:
        if self.p >= 1.0 or cur.size == 0:
            return
        cur._softmax(True)
        with np.errstate(divide="ignore", invalid="ignore"):
            logp = np.log(cur.p)
            entropy = np.float32(-np.nansum(cur.p * logp, dtype=np.float32))
            shifted = np.abs(-logp - entropy)
        order = np.argsort(shifted, kind="stable")
        cum = np.cumsum(cur.p[order], dtype=np.float32)
        ok = cum > np.float32(self.p)
        if self.min_keep > 1:
            ok[: self.min_keep - 1] = False
        hits = np.flatnonzero(ok)
        last = int(hits[0]) + 1 if hits.shape[0] else cur.size
        cur._take(order[:last])
        cur.sorted = False


def _temp_impl(cur: TokenDataArray, temp: float) -> None:
    if cur.size == 0:
        return
    if temp <= 0.0:
        # greedy through temperature: every logit but the first maximum becomes -inf
        i = int(np.argmax(cur.logits))
        best = cur.logits[i]
        cur.logits = np.full(cur.size, -np.inf, np.float32)
        cur.logits[i] = best
        return
    if temp >= 1.0:  # dividing by >= 1 cannot overflow: skip errstate's cost
        cur.logits = cur.logits / np.float32(temp)
        return
    with np.errstate(over="ignore"):  # a tiny temperature overflows to +-inf, as in C
        cur.logits = cur.logits / np.float32(temp)


class TempSampler(Sampler):
    name = "temp"

    def __init__(self, t: float):
        self.temp = float(np.float32(t))

    def apply(self, cur: TokenDataArray) -> None:
        _temp_impl(cur, self.temp)


class TempExtSampler(Sampler):
    """Dynamic temperature: entropy of the candidates maps into [temp - delta, temp + delta]."""

    name = "temp-ext"

    def __init__(self, t: float, delta: float, exponent: float):
        self.temp = float(np.float32(t))
        self.delta = float(np.float32(delta))
        self.exponent = float(np.float32(exponent))

    def apply(self, cur: TokenDataArray) -> None:
        if self.delta <= 0:
            _temp_impl(cur, self.temp)
            return
        if cur.size <= 1:
            return
        min_temp = max(0.0, self.temp - self.delta)
        max_temp = self.temp + self.delta
        max_entropy = -math.log(1.0 / cur.size)
        cur._softmax(True)
        pos = cur.p[cur.p > 0]
        entropy = float(-(pos * np.log(pos)).sum(dtype=np.float32))
        dyn_temp = min_temp + (max_temp - min_temp) * (entropy / max_entropy) ** self.exponent
        _temp_impl(cur, dyn_temp)
        p = _exp_shifted(cur.logits.astype(np.float64), cur.logits.astype(np.float64).max())
        cur.p = (p / p.sum()).astype(np.float32)


class XTCSampler(Sampler):
    """Exclude top choices: with probability p, drop every candidate above the threshold but
    the least likely of them."""

    name = "xtc"

    def __init__(self, p: float, t: float, min_keep: int = 1, seed: int = LLAMA_DEFAULT_SEED):
        self.probability = float(np.float32(p))
        self.threshold = float(np.float32(t))
        self.min_keep = int(min_keep)
        self.seed = int(seed) & 0xFFFFFFFF
        self.seed_cur = _rng_seed(self.seed)
        self.rng = _StdRng(self.seed_cur)

    def apply(self, cur: TokenDataArray) -> None:
        if self.probability <= 0.0 or self.threshold > 0.5 or cur.size < 2:
            return
        if self.rng.uniform_float() > self.probability:
            return
        cur._softmax(True)
        below = np.flatnonzero(cur.p < np.float32(self.threshold))
        n_above = int(below[0]) if below.shape[0] else cur.size
        pos_last = max(0, n_above - 1)
        if cur.size - pos_last >= self.min_keep and pos_last > 0:
            cur._take(slice(pos_last, None))

    def reset(self) -> None:
        self.seed_cur = _rng_seed(self.seed)
        self.rng.seed(self.seed_cur)


class TopNSigmaSampler(Sampler):
    """Keep logits within n standard deviations of the maximum (others become -inf)."""

    name = "top-n-sigma"

    def __init__(self, n: float):
        self.n = float(np.float32(n))

    def apply(self, cur: TokenDataArray) -> None:
        if self.n <= 0.0 or cur.size <= 1:
            return
        valid = cur.logits != -np.inf
        vals = cur.logits[valid]
        # +inf / huge logits make the statistics inf or NaN (then nothing is cut), silently
        with np.errstate(over="ignore", invalid="ignore"):
            if vals.shape[0]:
                mx = max(float(cur.logits[0]), float(vals.max()))
                mean = float(vals.sum(dtype=np.float32)) / vals.shape[0]
                std = math.sqrt(float(((vals.astype(np.float64) - mean) ** 2).sum()) / vals.shape[0])
            else:
                mx, std = float(cur.logits[0]), 0.0
            cut = np.float32(mx - self.n * std)
        logits = _scratch(self, cur.logits)
        logits[logits < cut] = -np.inf
        cur.logits = logits


# -- mirostat: llama.cpp's float32 arithmetic, operation for operation ------------------
#
# llama.cpp computes mirostat in float: logf / powf / log2f / expf from the C library,
# float running sums, float division, then std::discrete_distribution. The float32 steps
# are done here in float32, in the same order. The C library's float functions are not
# correctly rounded (glibc's logf and log2f are up to 0.82 / 0.75 ulp off near 1, expf
# 0.502 ulp), and numpy's float32 SIMD exp / log2 disagree with them in the last bit for
# 10-40% of arguments, enough to move mirostat's k across an integer. So the values come
# from the same C functions llama.cpp calls (ctypes), vectorized: numpy's float64 value
# rounded to float32 decides wherever it cannot differ from libm's (far from a rounding
# midpoint, or far from a comparison threshold), and libm is called for the rest. Without
# a loadable libm the float64 value rounded to float32 is used (correctly rounded).

_F32_1 = np.float32(1.0)
_F32_2 = np.float32(2.0)
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i486", "i586", "i686", "x86")
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
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


def _near_midpoint(y: np.ndarray, tol: float) -> np.ndarray:
    """Where float64 ``y`` lies within ``tol`` float32 ulp of a midpoint between two float32
    values (a libm off by < 0.5 + tol ulp may round it either way): the 29 mantissa bits
    that rounding to float32 drops are within tol * 2^29 of 2^28. Results in float32's
    subnormal range (fewer bits kept) always count as near."""
    b = np.abs(y).view(np.uint64)
    low = b & np.uint64(0x1FFFFFFF)
    t = np.uint64(int(tol * (1 << 29)))
    half = np.uint64(1 << 28)
    near = (low > half - t) & (low < half + t)
    tiny = (b < np.uint64(0x3810000000000000)) & (b != np.uint64(0))  # 0 < |y| < 2^-126
    return near | tiny


def _libm_f32(name: str, f64, x, tol: float):
    """float32 ``name(x)`` as the C library computes it, for a float32 array or scalar."""
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        y = f64(x.astype(np.float64))
        c = y.astype(np.float32)
    fn = _libm().get(name)
    if fn is None:
        return c
    if c.ndim == 0:
        return np.float32(fn(float(x)))
    idx = np.flatnonzero(_near_midpoint(np.atleast_1d(y), tol))
    if idx.shape[0]:
        c[idx] = np.array([fn(v) for v in x[idx].tolist()], np.float32)
    return c


def _expf(x) -> np.ndarray:
    return _libm_f32("expf", np.exp, x, 0.004)  # glibc: < 0.502 ulp


def _logf(x) -> np.ndarray:
    return _libm_f32("logf", np.log, x, 0.5)  # up to 0.82 ulp near 1: always ask libm


def _log2f(x) -> np.float32:
    return _libm_f32("log2f", np.log2, x, 0.5)


def _powf(x, y) -> np.float32:
    fn = _libm().get("powf")
    if fn is not None:
        return np.float32(fn(float(np.float32(x)), float(np.float32(y))))
    with np.errstate(all="ignore"):
        return np.float32(np.power(np.float64(np.float32(x)), np.float64(np.float32(y))))


def _first_surprise_above(p: np.ndarray, mu: np.float32) -> int | None:
    """First i with -log2f(p[i]) > mu (libm's log2f), or None. numpy's float64 log2
    decides wherever it is more than 2 float32 ulp from mu; libm decides the rest."""
    with np.errstate(divide="ignore", invalid="ignore"):
        s = -np.log2(p.astype(np.float64))
        over = s > mu
        near = np.abs(s - mu) <= 2.0 * float(np.spacing(np.abs(mu)))
    if near.any() and _libm().get("log2f") is not None:
        fn = _libm()["log2f"]
        for i in np.flatnonzero(near).tolist():
            over[i] = np.float32(-fn(float(p[i]))) > mu
    elif near.any():
        over[near] = -_log2f(p[near]) > mu
    hits = np.flatnonzero(over)
    return int(hits[0]) if hits.shape[0] else None


def _c_int(k: np.float32, machine: str | None = None) -> int:
    """C's ``int(k)`` for a float k. In range it truncates; NaN and out-of-range values are
    undefined behaviour in C++ and give what the CPU's conversion instruction gives:
    x86's cvttss2si returns INT_MIN for all of them, aarch64's fcvtzs saturates (NaN -> 0)."""
    k = float(k)
    if math.isfinite(k) and -2147483649.0 < k < 2147483648.0:
        return int(k)
    x86 = _X86 if machine is None else machine.lower() in ("x86_64", "amd64", "i386", "i686", "x86")
    if x86:
        return _INT_MIN
    if math.isnan(k):
        return 0
    return _INT_MAX if k > 0 else _INT_MIN


def _mirostat_k(k: np.float32, machine: str | None = None) -> int:
    """``std::max(int(k), 1)``: mirostat v1's top-k size (a nearly flat row makes k
    overflow to inf: 1 on x86-64, every candidate on aarch64, as in llama.cpp there)."""
    return max(_c_int(k, machine), 1)


def _softmax_f32(cur: TokenDataArray) -> None:
    """``llama_sampler_softmax_impl(cur, true)`` as llama.cpp computes it: sort, p =
    expf(logit - max) (float32 subtraction), a float32 running sum, float32 division."""
    if cur.size == 0:
        raise ValueError("softmax of an empty candidate list")
    if not cur.sorted:
        cur._sort()
    max_l = cur.logits[0]
    if math.isfinite(max_l):
        p = _expf(cur.logits - max_l)  # float32 subtraction, then expf
    else:
        p = _exp_shifted(cur.logits, max_l)
    total = np.cumsum(p, dtype=np.float32)[-1]  # cum_sum += p, left to right in float
    with np.errstate(invalid="ignore", divide="ignore"):
        cur.p = p / total


def _mirostat_update(mu: np.float32, tau: np.float32, eta: np.float32, p: np.float32) -> np.float32:
    """mu - eta * (-log2f(p) - tau), in float."""
    with np.errstate(all="ignore"):
        e = np.float32(-_log2f(p)) - tau
        return np.float32(mu - np.float32(eta * e))


class MirostatSampler(Sampler):
    """Mirostat 1.0 (llama.cpp's ``llama_sampler_init_mirostat``): estimate the Zipf
    exponent from the ``m`` most likely tokens, keep the k tokens that give surprise ``mu``,
    draw one, move ``mu`` toward ``tau``. ``m <= 0`` uses every candidate (llama.cpp's loop
    bound is ``size_t(m - 1)``)."""

    name = "mirostat"

    def __init__(self, n_vocab: int, seed: int, tau: float, eta: float, m: int = 100):
        self.n_vocab = int(n_vocab)
        self.seed = int(seed) & 0xFFFFFFFF
        self.seed_cur = _rng_seed(self.seed)
        self.tau = np.float32(tau)
        self.eta = np.float32(eta)
        self.m = int(m)
        self.mu = np.float32(_F32_2 * self.tau)
        self.rng = _StdRng(self.seed_cur)
        self._t = np.zeros(0, np.float32)  # t_i = logf(float(i + 2) / float(i + 1)), cached

    def _t_i(self, n: int) -> np.ndarray:
        if self._t.shape[0] < n:
            i = np.arange(max(n, 2 * self._t.shape[0]), dtype=np.float32)
            self._t = _logf((i + _F32_2) / (i + _F32_1))
        return self._t[:n]

    def apply(self, cur: TokenDataArray) -> None:
        if cur.size == 0:
            cur.selected = -1
            return
        _softmax_f32(cur)
        n = cur.size - 1 if self.m <= 0 else min(self.m - 1, cur.size - 1)
        with np.errstate(all="ignore"):
            p = cur.p
            t = self._t_i(n)
            b = _logf(p[:n] / p[1:n + 1])
            # float running sums, as the C loop (no reassociation, no FMA)
            sum_ti_bi = np.cumsum(t * b, dtype=np.float32)[-1] if n else np.float32(0.0)
            sum_ti_sq = np.cumsum(t * t, dtype=np.float32)[-1] if n else np.float32(0.0)
            s_hat = np.float32(sum_ti_bi / sum_ti_sq)
            eps = np.float32(s_hat - _F32_1)
            num = np.float32(eps * _powf(_F32_2, self.mu))
            den = np.float32(_F32_1 - _powf(np.float32(self.n_vocab), -eps))
            k = _powf(np.float32(num / den), np.float32(_F32_1 / s_hat))
        _top_k_impl(cur, _mirostat_k(k))
        _softmax_f32(cur)
        idx = self.rng.discrete(cur.p)
        cur.selected = idx
        self.mu = _mirostat_update(self.mu, self.tau, self.eta, cur.p[idx])

    def reset(self) -> None:
        self.mu = np.float32(_F32_2 * self.tau)
        self.seed_cur = _rng_seed(self.seed)
        self.rng.seed(self.seed_cur)


class MirostatV2Sampler(Sampler):
    """Mirostat 2.0 (``llama_sampler_init_mirostat_v2``): keep the candidates whose surprise
    -log2(p) is at most ``mu`` (at least one), draw one, move ``mu`` toward ``tau``."""

    name = "mirostat-v2"

    def __init__(self, seed: int, tau: float, eta: float):
        self.seed = int(seed) & 0xFFFFFFFF
        self.seed_cur = _rng_seed(self.seed)
        self.tau = np.float32(tau)
        self.eta = np.float32(eta)
        self.mu = np.float32(_F32_2 * self.tau)
        self.rng = _StdRng(self.seed_cur)

    def apply(self, cur: TokenDataArray) -> None:
        if cur.size == 0:
            cur.selected = -1
            return
        _softmax_f32(cur)
        cut = _first_surprise_above(cur.p, self.mu)
        cur._truncate(max(1, cur.size if cut is None else cut))
        _softmax_f32(cur)
        idx = self.rng.discrete(cur.p)
        cur.selected = idx
        self.mu = _mirostat_update(self.mu, self.tau, self.eta, cur.p[idx])

    def reset(self) -> None:
        self.mu = np.float32(_F32_2 * self.tau)
        self.seed_cur = _rng_seed(self.seed)
        self.rng.seed(self.seed_cur)


class PenaltiesSampler(Sampler):
    """Repeat / frequency / presence penalties over the last ``penalty_last_n`` accepted tokens."""

    name = "penalties"

    def __init__(self, penalty_last_n: int, penalty_repeat: float, penalty_freq: float,
                 penalty_present: float):
        self.penalty_last_n = max(int(penalty_last_n), 0)
        self.penalty_repeat = float(np.float32(penalty_repeat))
        self.penalty_freq = float(np.float32(penalty_freq))
        self.penalty_present = float(np.float32(penalty_present))
        self.prev: list[int] = []  # ring buffer of at most penalty_last_n tokens
        self.token_count: dict[int, int] = {}

    def accept(self, token: int) -> None:
        if self.penalty_last_n == 0:
            return
        token = int(token)
        self.token_count[token] = self.token_count.get(token, 0) + 1
        if len(self.prev) >= self.penalty_last_n:
            old = self.prev.pop(0)
            self.token_count[old] -= 1
            if self.token_count[old] == 0:
                del self.token_count[old]
        self.prev.append(token)

    def apply(self, cur: TokenDataArray) -> None:
        if self.penalty_last_n == 0 or (
            self.penalty_repeat == 1.0 and self.penalty_freq == 0.0 and self.penalty_present == 0.0
        ):
            return
        if not self.token_count:
            cur.sorted = False
            return
        toks = np.fromiter(self.token_count.keys(), np.int64, len(self.token_count))
        counts = np.fromiter(self.token_count.values(), np.float32, len(self.token_count))
        n = cur.size
        if toks.min() >= 0 and n > toks.max() and np.array_equal(cur.ids[toks], toks):
            pos = toks  # untouched full-vocabulary array: position == id
            cnt = counts
        else:
            where = {int(t): i for i, t in enumerate(cur.ids.tolist())}
            sel = [(where[int(t)], c) for t, c in zip(toks, counts) if int(t) in where]
            pos = np.array([s[0] for s in sel], np.int64)
            cnt = np.array([s[1] for s in sel], np.float32)
        if pos.shape[0]:
            logits = _scratch(self, cur.logits)
            v = logits[pos]
            v = np.where(v <= 0, v * np.float32(self.penalty_repeat), v / np.float32(self.penalty_repeat))
            v = v - (cnt * np.float32(self.penalty_freq) + np.float32(self.penalty_present))
            logits[pos] = v.astype(np.float32)
            cur.logits = logits
        cur.sorted = False

    def reset(self) -> None:
        self.prev.clear()
        self.token_count.clear()


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


class LogitBiasSampler(Sampler):
    name = "logit-bias"

    def __init__(self, n_vocab: int, logit_bias: Iterable):
        """``logit_bias``: (token, bias) pairs or a {token: bias} mapping (checked by
        :func:`normalize_logit_bias`: bad keys, values or ids raise TypeError / ValueError)."""
        self.n_vocab = int(n_vocab)
        self.logit_bias = normalize_logit_bias(logit_bias, self.n_vocab)

    def apply(self, cur: TokenDataArray) -> None:
        if not self.logit_bias:
            return
        logits = _scratch(self, cur.logits)
        for tok, bias in self.logit_bias:
            if 0 <= tok < cur.size and cur.ids[tok] == tok:
                logits[tok] += np.float32(bias)
            else:
                hit = np.flatnonzero(cur.ids == tok)
                if hit.shape[0]:
                    logits[hit[0]] += np.float32(bias)
        cur.logits = logits


class DrySampler(Sampler):
    """DRY ("don't repeat yourself"): penalize tokens that would extend a repetition of the
    recent context, except across sequence breakers. Port of llama.cpp's Z-algorithm version.

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
        self.last_tokens: list[int] = []

    def _enabled(self) -> bool:
        return self.dry_multiplier != 0.0 and self.dry_base >= 1.0 and self.dry_penalty_last_n != 0

    def accept(self, token: int) -> None:
        if not self._enabled():
            return
        self.last_tokens.append(int(token))
        if len(self.last_tokens) > self.dry_penalty_last_n:
            del self.last_tokens[0]

    def reset(self) -> None:
        self.last_tokens.clear()

    def apply(self, cur: TokenDataArray) -> None:
        if not self._enabled():
            return
        n = min(len(self.last_tokens), self.dry_penalty_last_n)
        if n <= self.dry_allowed_length:
            return
        lt = self.last_tokens

        def rat(i: int) -> int:  # i-th token from the end
            return lt[len(lt) - 1 - i]

        # step 1: the nearest restart (breaker) sequence limits the repetition length
        rep_limit = n
        for i in range(n):
            tails = self.breakers.get(rat(i))
            if tails is None:
                continue
            longest = -1
            for tail in tails:
                sl = len(tail)
                if longest < sl <= i and all(tail[o] == rat(i - o - 1) for o in range(sl)):
                    longest = sl
            if longest >= 0:
                rep_limit = i - longest
                break
        if rep_limit < self.dry_allowed_length:
            return

        # step 2: reverse Z-algorithm: repeat[last - k] = length of the suffix repeated at k
        repeat = [0] * n
        last = n - 1
        rt = lt_ = 0
        for k in range(1, n):
            if k > rt:
                m = 0
                while m + k < n and rat(m) == rat(m + k):
                    m += 1
                repeat[last - k] = min(m, rep_limit)
                if m > 0:
                    lt_, rt = k, k + m - 1
            else:
                p = k - lt_
                right_len = rt - k + 1
                if repeat[last - p] < right_len:
                    repeat[last - k] = min(repeat[last - p], rep_limit)
                else:
                    i = rt + 1
                    while i < n and rat(i) == rat(i - k):
                        i += 1
                    repeat[last - k] = min(i - k, rep_limit)
                    lt_, rt = k, i - 1

        # step 3: the token after each repeat would extend it
        max_rep: dict[int, int] = {}
        for i in range(n - 1):
            rl = repeat[i]
            if rl >= self.dry_allowed_length:
                tok = rat(n - 2 - i)
                if max_rep.get(tok, -1) < rl:
                    max_rep[tok] = rl
        if not max_rep:
            cur.sorted = False
            return

        # step 4: penalties, exponent clamped so base**exp stays a finite float
        max_exp = int(88.7228391 / math.log(self.dry_base)) if self.dry_base > 1.000001 else 0
        logits = _scratch(self, cur.logits)
        ids = cur.ids
        for tok, rl in max_rep.items():
            if any(len(t) == 0 for t in self.breakers.get(tok, ())):
                continue
            hit = [tok] if 0 <= tok < cur.size and ids[tok] == tok else np.flatnonzero(ids == tok)
            if len(hit) == 0:
                continue
            e = rl - self.dry_allowed_length
            if max_exp > 0 and e > max_exp:
                e = max_exp
            pen = np.float32(self.dry_multiplier * self.dry_base**e)
            logits[hit[0]] -= pen
        cur.logits = logits
        cur.sorted = False


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
    it, so penalties and mirostat see it). Timing is kept unless ``no_perf``.
    """

    name = "chain"

    def __init__(self, samplers: Iterable[Sampler] = (), *, no_perf: bool = True):
        self.samplers: list[Sampler] = list(samplers)
        self.no_perf = bool(no_perf)
        self.t_sample_us = 0.0
        self.n_sample = 0
        # candidates after the last sample (their p are the final probabilities); valid
        # until the next sample, which may reuse its buffers
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
        """(samplers whose apply does something, samplers whose accept does something),
        recomputed when ``samplers`` changes: the default chain is 11 samplers of which 5
        are disabled, and a method call per disabled sampler per token adds up."""
        key = tuple(self.samplers)
        plan = self.__dict__.get("_plan_cache")
        if plan is None or plan[0] != key:
            applies = tuple(s for s in key if not isinstance(s, EmptySampler) or "apply" in s.__dict__)
            accepts = tuple(s for s in key if type(s).accept is not Sampler.accept or "accept" in s.__dict__)
            plan = self._plan_cache = (key, applies, accepts, _default_tail_of(applies))
        return plan

    def apply(self, cur: TokenDataArray) -> None:
        t0 = time.perf_counter() if not self.no_perf else 0.0
        for s in self._plan()[1]:
            s.apply(cur)
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

    def sample(self, logits) -> int:
        """Apply the chain to one row of logits [n_vocab], accept and return the token."""
        tail = self._plan()[3]
        if tail is not None and isinstance(logits, np.ndarray) and logits.dtype == np.float32 and logits.ndim == 1:
            token = self._sample_tail(logits, tail)
            if token is not None:
                return token
        cur = TokenDataArray.from_logits(logits)
        self.apply(cur)
        if not (0 <= cur.selected < cur.size):
            raise RuntimeError(
                f"sampler chain {self.describe()} selected no token (selected={cur.selected}, "
                f"{cur.size} candidates left): end the chain with a selecting sampler "
                "(greedy, dist, mirostat)"
            )
        token = int(cur.ids[cur.selected])
        self.last = cur
        self.accept(token)
        return token

    def _sample_tail(self, logits: np.ndarray, tail: tuple):
        """The default chain (top-k -> top-p -> min-p -> temperature -> dist) in one Rust
        call instead of ~25 numpy calls on the 40 survivors, which cost more than the
        whole forward pass of a small model's output layer once its caches are cold. Same
        steps, same float32/float64 operations and the same draw; None when the row needs
        the samplers (a non-finite candidate), with the draw handed to the dist sampler."""
        k, top_p, log_min_p, temp, dist = tail
        t0 = time.perf_counter() if not self.no_perf else 0.0
        rnd = dist._draw()
        r = _core.sample_default_tail(logits, k, top_p, log_min_p, temp, rnd)
        if r is not None and not math.isfinite(r[1][0]):
            # a tiny temperature overflowed the best logit to +inf: the Rust tail's softmax
            # would give NaN; the samplers' give that token all the mass
            r = None
        if r is None:
            dist._pending = rnd
            return None
        ids, lg, probs, sel = r
        cur = TokenDataArray.__new__(TokenDataArray)
        cur.ids, cur.logits, cur.p, cur.selected, cur.sorted = ids, lg, probs, sel, True
        token = int(ids[sel])
        self.last = cur
        if not self.no_perf:
            self.t_sample_us += (time.perf_counter() - t0) * 1e6
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


def _default_tail_of(applies: tuple):
    """(k, top_p, log_min_p, temp, dist) when the active samplers are exactly llama.cpp's
    default chain shape: top-k (1..128) [-> top-p] [-> min-p] [-> temperature > 0] -> dist,
    min_keep <= 1, none of them patched; else None (the samplers run one by one)."""
    if len(applies) < 2 or any("apply" in s.__dict__ for s in applies):
        return None
    first, dist = applies[0], applies[-1]
    if type(first) is not TopKSampler or not 1 <= first.k <= 128 or type(dist) is not DistSampler:
        return None
    top_p, log_min_p, temp = np.float32(1.0), None, 1.0
    order = 0
    for s in applies[1:-1]:
        t = type(s)
        if t is TopPSampler and order < 1 and s.min_keep <= 1:
            top_p, order = np.float32(s.p), 1
        elif t is MinPSampler and order < 2 and s.min_keep <= 1 and s.p > 0.0:
            log_min_p, order = np.float32(math.log(s.p)), 2
        elif t is TempExtSampler and order < 3 and s.delta <= 0 and s.temp > 0.0:
            temp, order = s.temp, 3
        elif t is TempSampler and order < 3 and s.temp > 0.0:
            temp, order = s.temp, 3
        else:
            return None
    return first.k, float(top_p), None if log_min_p is None else float(log_min_p), float(np.float32(temp)), dist


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
