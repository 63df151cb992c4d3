"""llama.h-style sampler functions (see llama_api.py): thin names over :mod:`pyllama.sampling`.

A ``llama_sampler *`` is a :class:`pyllama.sampling.Sampler`; a chain is a
:class:`pyllama.sampling.SamplerChain`; ``llama_token_data_array`` is
:class:`pyllama.sampling.TokenDataArray`. Misuse that llama.cpp would abort on (perf of a
non-chain, a chain that selects nothing) raises ``ValueError`` / ``RuntimeError`` here.
"""

from __future__ import annotations

import logging
import re
import weakref
from dataclasses import dataclass

import numpy as np

from . import _api_check as _chk
from . import _core
from . import sampling as _s
from ._api_check import checked, describe, int32
from .sampling import LLAMA_DEFAULT_SEED, LLAMA_TOKEN_NULL, Sampler, SamplerChain, TokenDataArray

_log = logging.getLogger("pyllama")

llama_token_data_array = TokenDataArray


@dataclass
class llama_sampler_chain_params:
    no_perf: bool = True


@dataclass
class llama_logit_bias:
    token: int
    bias: float


@dataclass
class llama_perf_sampler_data:
    t_sample_ms: float
    n_sample: int


def llama_sampler_chain_default_params() -> llama_sampler_chain_params:
    return llama_sampler_chain_params(no_perf=True)


# -- argument checks (see _api_check): the object-typed parameters at function entry.
# A freed sampler (llama_sampler_free) is a ValueError wherever it is used again, as is
# adding a sampler to a second chain (llama.h: the chain takes ownership and frees it).

_in_a_chain: "weakref.WeakSet[Sampler]" = weakref.WeakSet()


def _SMPL(v, fn: str, name: str) -> Sampler:
    if not isinstance(v, Sampler):
        raise TypeError(f"{fn}: {name} must be a llama_sampler (llama_sampler_init_*), got {describe(v)}")
    if _chk.is_freed(v):
        raise ValueError(f"{fn}: {name} has been freed (llama_sampler_free)")
    return v


def _chain(chain, fn: str, name: str = "chain") -> SamplerChain:
    if not isinstance(chain, SamplerChain):
        raise ValueError(f"{fn}: invalid sampler passed - requires a sampler created with llama_sampler_chain_init()"
                         f" ({name} is {describe(chain)})")
    if _chk.is_freed(chain):
        raise ValueError(f"{fn}: {name} has been freed (llama_sampler_free)")
    return chain


_CUR_P = _chk.instance(TokenDataArray, "a llama_token_data_array (TokenDataArray)")


def llama_sampler_chain_init(params: llama_sampler_chain_params | None = None) -> SamplerChain:
    if params is not None and not isinstance(params, llama_sampler_chain_params):
        raise TypeError("llama_sampler_chain_init: params must be a llama_sampler_chain_params "
                        f"(llama_sampler_chain_default_params()), got {describe(params)}")
    params = params or llama_sampler_chain_default_params()
    return SamplerChain(no_perf=params.no_perf)


@checked(smpl=_SMPL)
def llama_sampler_chain_add(chain: SamplerChain, smpl: Sampler) -> None:
    """Append ``smpl``; the chain owns it from now on (llama_sampler_free of the chain
    frees it; adding it to a chain again is a ValueError)."""
    fn = "llama_sampler_chain_add"
    chain = _chain(chain, fn)
    if smpl is chain:
        raise ValueError(f"{fn}: cannot add a chain to itself")
    if smpl in _in_a_chain:
        raise ValueError(f"{fn}: smpl already belongs to a chain (the chain owns it; clone it with llama_sampler_clone)")
    chain.add(smpl)
    _in_a_chain.add(smpl)


@checked(i=int32)
def llama_sampler_chain_get(chain, i: int):
    """The i-th sampler (i == -1: the chain itself); None for a NULL or non-chain sampler
    or an index out of range, as llama.cpp."""
    if chain is not None and not isinstance(chain, Sampler):
        raise TypeError(f"llama_sampler_chain_get: chain must be a llama_sampler, got {describe(chain)}")
    if not isinstance(chain, SamplerChain):
        return None
    _chain(chain, "llama_sampler_chain_get")
    if i == -1:
        return chain
    if i < 0 or i >= len(chain):
        return None
    return chain[i]


def llama_sampler_chain_n(chain: SamplerChain) -> int:
    return len(_chain(chain, "llama_sampler_chain_n"))


@checked(i=int32)
def llama_sampler_chain_remove(chain: SamplerChain, i: int):
    """Take the i-th sampler out of the chain (the caller owns it again); None if out of range."""
    chain = _chain(chain, "llama_sampler_chain_remove")
    if i < 0 or i >= len(chain):
        return None
    smpl = chain.remove(i)
    _in_a_chain.discard(smpl)
    return smpl


@checked(smpl=_SMPL)
def llama_sampler_name(smpl: Sampler) -> str:
    return smpl.name


@checked(smpl=_SMPL, token=int32)
def llama_sampler_accept(smpl: Sampler, token: int) -> None:
    smpl.accept(token)


def _apply_rest(smpl: Sampler, cur_p: TokenDataArray) -> None:
    """A chain attached to a sequence (llama_set_sampler) skips the samplers that run
    after each decode, as llama.cpp's chain skips its backend samplers."""
    from ._api_batch_ext import BACKEND_N

    n = BACKEND_N.get(smpl, 0) if isinstance(smpl, SamplerChain) else 0
    if n:
        for s in smpl.samplers[n:]:
            s.apply(cur_p)
    else:
        smpl.apply(cur_p)


@checked(smpl=_SMPL, cur_p=_CUR_P)
def llama_sampler_apply(smpl: Sampler, cur_p: TokenDataArray) -> None:
    _apply_rest(smpl, cur_p)


@checked(smpl=_SMPL)
def llama_sampler_reset(smpl: Sampler) -> None:
    smpl.reset()


@checked(smpl=_SMPL)
def llama_sampler_clone(smpl: Sampler) -> Sampler:
    return smpl.clone()


@checked(smpl=_chk.instance(Sampler, "a llama_sampler", none_ok=True))
def llama_sampler_free(smpl: Sampler | None) -> None:
    """Mark the sampler (and, for a chain, the samplers it owns) freed: any later use
    through these functions is a ValueError, where llama.cpp would use freed memory. NULL
    and a second free are no-ops."""
    if smpl is None:
        return
    if isinstance(smpl, SamplerChain):
        for s in smpl.samplers:
            llama_sampler_free(s)
    elif callable(getattr(smpl, "free", None)):
        smpl.free()  # llama_sampler_init's iface.free
    _in_a_chain.discard(smpl)
    _chk.mark_freed(smpl)


@checked(smpl=_SMPL)
def llama_sampler_get_seed(smpl: Sampler) -> int:
    if isinstance(smpl, (_s.DistSampler, _s.MirostatSampler, _s.MirostatV2Sampler)):
        return smpl.seed_cur
    if isinstance(smpl, SamplerChain):
        for s in reversed(smpl.samplers):
            seed = llama_sampler_get_seed(s)
            if seed != LLAMA_DEFAULT_SEED:
                return seed
    return LLAMA_DEFAULT_SEED


@checked(smpl=_SMPL, idx=int32)
def llama_sampler_sample(smpl: Sampler, ctx, idx: int) -> int:
    """Read logits row ``idx`` of ``ctx`` (``llama_get_logits_ith``), apply ``smpl``, accept
    and return the selected token."""
    from . import _api_context

    _api_context._CTX(ctx, "llama_sampler_sample", "ctx")
    if _api_context._SEQ_SAMPLERS and ctx in _api_context._SEQ_SAMPLERS:  # llama_set_sampler
        from . import _api_batch_ext

        r = _api_batch_ext.sampled_row(ctx, idx, "llama_sampler_sample")
        if r is not None:
            return _sample_sampled(smpl, r)
    logits = _api_context.llama_get_logits_ith(ctx, idx)
    if logits is None:
        raise ValueError(f"llama_sampler_sample: no logits for output index {idx} (was logits[{idx}] requested in the batch?)")
    if isinstance(smpl, SamplerChain):
        return smpl.sample(logits)
    cur = TokenDataArray.from_logits(logits)
    smpl.apply(cur)
    if not (0 <= cur.selected < cur.size):
        raise RuntimeError(f"llama_sampler_sample: sampler {smpl.name!r} selected no token")
    token = int(cur.ids[cur.selected])
    smpl.accept(token)
    return token


def _sample_sampled(smpl: Sampler, r) -> int:
    """llama_sampler_sample on an output a sequence sampler already sampled: its token
    (accepted), or the rest of ``smpl`` applied to the candidates it kept."""
    if r.token != LLAMA_TOKEN_NULL:
        smpl.accept(r.token)
        return int(r.token)
    ids = r.ids if r.ids is not None else np.arange(r.logits.shape[0], dtype=np.int32)
    cur = TokenDataArray(ids, r.logits, r.probs)
    _apply_rest(smpl, cur)
    if not (0 <= cur.selected < cur.size):
        raise RuntimeError(f"llama_sampler_sample: sampler {smpl.name!r} selected no token")
    token = int(cur.ids[cur.selected])
    smpl.accept(token)
    return token


# -- constructors -------------------------------------------------------------------------

def llama_sampler_init_greedy() -> Sampler:
    return _s.GreedySampler()


def llama_sampler_init_dist(seed: int = LLAMA_DEFAULT_SEED) -> Sampler:
    return _s.DistSampler(seed)


def llama_sampler_init_top_k(k: int) -> Sampler:
    return _s.init_top_k(k)


def llama_sampler_init_top_p(p: float, min_keep: int = 1) -> Sampler:
    return _s.init_top_p(p, min_keep)


def llama_sampler_init_min_p(p: float, min_keep: int = 1) -> Sampler:
    return _s.init_min_p(p, min_keep)


def llama_sampler_init_typical(p: float, min_keep: int = 1) -> Sampler:
    return _s.init_typical(p, min_keep)


def llama_sampler_init_temp(t: float) -> Sampler:
    return _s.init_temp(t)


def llama_sampler_init_temp_ext(t: float, delta: float, exponent: float) -> Sampler:
    return _s.init_temp_ext(t, delta, exponent)


def llama_sampler_init_xtc(p: float, t: float, min_keep: int, seed: int) -> Sampler:
    return _s.init_xtc(p, t, min_keep, seed)


def llama_sampler_init_top_n_sigma(n: float) -> Sampler:
    return _s.init_top_n_sigma(n)


def llama_sampler_init_mirostat(n_vocab: int, seed: int, tau: float, eta: float, m: int) -> Sampler:
    return _s.MirostatSampler(n_vocab, seed, tau, eta, m)


def llama_sampler_init_mirostat_v2(seed: int, tau: float, eta: float) -> Sampler:
    return _s.MirostatV2Sampler(seed, tau, eta)


def llama_sampler_init_penalties(*args) -> Sampler:
    """``(penalty_last_n, repeat, freq, present)`` as llama-cpp-python, or llama.h's
    ``(n_vocab, penalty_last_n, repeat, freq, present)``."""
    if len(args) == 5:
        args = args[1:]
    if len(args) != 4:
        raise TypeError("llama_sampler_init_penalties([n_vocab,] penalty_last_n, penalty_repeat, penalty_freq, penalty_present)")
    return _s.init_penalties(*args)


def llama_sampler_init_dry(vocab, dry_multiplier: float, dry_base: float, dry_allowed_length: int,
                           dry_penalty_last_n: int, seq_breakers=(), num_breakers: int | None = None) -> Sampler:
    from .model import Model
    from .vocab import Vocab

    if not isinstance(vocab, (Vocab, Model)):
        raise TypeError(f"llama_sampler_init_dry: vocab must be a llama_vocab (llama_model_get_vocab), "
                        f"got {describe(vocab)}")
    seq = list(seq_breakers or ())
    if num_breakers is not None:
        seq = seq[:num_breakers]
    seq = [b.decode() if isinstance(b, bytes) else b for b in seq]
    for i, b in enumerate(seq):
        if not b:
            _log.warning("skipping null or empty DRY sequence breaker at index %d", i)
    return _s.init_dry(vocab, dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n,
                       [b for b in seq if b])


def llama_sampler_init_logit_bias(n_vocab: int, n_logit_bias: int, logit_bias) -> Sampler:
    items = []
    for lb in list(logit_bias)[:n_logit_bias]:
        if isinstance(lb, llama_logit_bias):
            items.append((lb.token, lb.bias))
        else:
            t, b = lb
            items.append((t, b))
    return _s.init_logit_bias(n_vocab, items)


def llama_sampler_init_grammar(vocab, grammar_str, grammar_root="root"):
    """A GBNF grammar sampler (pyllama.grammar.GrammarSampler) for a chain; None (and the
    reason logged) where llama.cpp returns nullptr: a grammar that does not parse, has no
    ``grammar_root`` rule or is left-recursive. An empty grammar gives an inactive sampler."""
    from .grammar import GrammarError, GrammarSampler
    from .model import Model
    from .vocab import Vocab

    if not isinstance(vocab, (Vocab, Model)):
        raise TypeError(f"llama_sampler_init_grammar: vocab must be a llama_vocab (llama_model_get_vocab), "
                        f"got {describe(vocab)}")
    if isinstance(grammar_str, bytes):
        grammar_str = grammar_str.decode("utf-8")
    if isinstance(grammar_root, bytes):
        grammar_root = grammar_root.decode("utf-8")
    if not grammar_str:
        return _s.EmptySampler("grammar")  # llama.cpp: no grammar, the sampler does nothing
    try:
        return GrammarSampler(vocab, grammar_str, grammar_root or "root")
    except GrammarError as e:
        _log.error("llama_sampler_init_grammar: %s", e)
        return None


def _strings(v, n, fn: str, name: str, n_name: str) -> list:
    """A ``const char **`` argument: a sequence of bytes/str, its first ``n`` (None: all)."""
    if v is None:
        v = ()
    if isinstance(v, (str, bytes)) or not hasattr(v, "__len__"):
        raise TypeError(f"{fn}: {name} must be a sequence of strings, got {describe(v)}")
    items = list(v)
    if n is not None:
        n = _chk.size(n, fn, n_name)
        if n > len(items):
            raise ValueError(f"{fn}: {name} holds {len(items)} strings but {n_name} = {n}")
        items = items[:n]
    out = []
    for i, x in enumerate(items):
        if not isinstance(x, (str, bytes)):
            raise TypeError(f"{fn}: {name}[{i}] must be bytes or str, got {describe(x)}")
        out.append(x.decode("utf-8") if isinstance(x, bytes) else x)
    return out


def _tokens(v, n, fn: str, name: str, n_name: str) -> list:
    if v is None:
        v = ()
    if n is None:
        n = len(v) if hasattr(v, "__len__") else 0
    return [int(t) for t in _chk.int_seq(v, fn, name, _chk.size(n, fn, n_name), n_name)]


def _lazy(fn: str, vocab, grammar_str, grammar_root, patterns: list, tokens: list):
    from .grammar import GrammarError, LazyGrammarSampler
    from .model import Model
    from .vocab import Vocab

    if not isinstance(vocab, (Vocab, Model)):
        raise TypeError(f"{fn}: vocab must be a llama_vocab (llama_model_get_vocab), got {describe(vocab)}")
    grammar_str = _chk.text(grammar_str, fn, "grammar_str")
    grammar_root = _chk.opt_text(grammar_root, fn, "grammar_root")
    if isinstance(grammar_str, bytes):
        grammar_str = grammar_str.decode("utf-8")
    if isinstance(grammar_root, bytes):
        grammar_root = grammar_root.decode("utf-8")
    if not grammar_str:
        return _s.EmptySampler("grammar")
    n_vocab = getattr(vocab, "n_tokens", None) or getattr(vocab, "n_vocab", 0)
    for i, t in enumerate(tokens):
        if not 0 <= t < n_vocab:
            raise ValueError(f"{fn}: trigger_tokens[{i}] = {t} out of range: valid ids are 0..{n_vocab - 1}")
    try:
        return LazyGrammarSampler(vocab, grammar_str, grammar_root or "root", patterns, tokens)
    except GrammarError as e:
        _log.error("%s: %s", fn, e)
        return None


def llama_sampler_init_grammar_lazy_patterns(vocab, grammar_str, grammar_root, trigger_patterns,
                                             num_trigger_patterns, trigger_tokens, num_trigger_tokens):
    """A lazy grammar (pyllama.grammar.LazyGrammarSampler): nothing is constrained until
    one of ``trigger_tokens`` is accepted (the grammar starts with it) or the output so
    far matches one of ``trigger_patterns`` (regular expressions; the grammar is fed the
    text from the first non-empty capture group on). None (reason logged) where
    llama.cpp returns nullptr: a grammar that does not parse, lacks the root rule, or a
    pattern that does not compile. ``num_*`` take the first that many (None: all)."""
    fn = "llama_sampler_init_grammar_lazy_patterns"
    return _lazy(fn, vocab, grammar_str, grammar_root,
                 _strings(trigger_patterns, num_trigger_patterns, fn, "trigger_patterns", "num_trigger_patterns"),
                 _tokens(trigger_tokens, num_trigger_tokens, fn, "trigger_tokens", "num_trigger_tokens"))


def _word_pattern(words: list) -> str:
    """llama.cpp's deprecated trigger words as one pattern: ``[\\s\\S]*?(w1|w2)[\\s\\S]*``
    with the regex metacharacters of each word escaped."""
    return "[\\s\\S]*?(" + "|".join(re.sub(r"[.^$|()*+?\[\]{}\\]", lambda m: "\\" + m.group(0), w)
                                   for w in words) + ")[\\s\\S]*"


def llama_sampler_init_grammar_lazy(vocab, grammar_str, grammar_root, trigger_words, num_trigger_words,
                                    trigger_tokens, num_trigger_tokens):
    """Deprecated form of llama_sampler_init_grammar_lazy_patterns: trigger *words*
    (literal text anywhere in the output) instead of patterns."""
    fn = "llama_sampler_init_grammar_lazy"
    words = _strings(trigger_words, num_trigger_words, fn, "trigger_words", "num_trigger_words")
    return _lazy(fn, vocab, grammar_str, grammar_root, [_word_pattern(words)] if words else [],
                 _tokens(trigger_tokens, num_trigger_tokens, fn, "trigger_tokens", "num_trigger_tokens"))


# -- samplers written in Python (llama_sampler_init) ------------------------------------------


class llama_sampler_i:  # noqa: N801 (llama.h's type name)
    """llama.h's struct llama_sampler_i: the callables of a user sampler, each taking the
    llama_sampler first as in C: ``name(smpl) -> bytes | str``, ``accept(smpl, token)``,
    ``apply(smpl, cur_p)`` (required; edits the llama_token_data_array), ``reset(smpl)``,
    ``clone(smpl) -> llama_sampler``, ``free(smpl)``. Any other object with these
    attributes works too. The backend_* members of llama.h have no role here."""

    def __init__(self, name=None, accept=None, apply=None, reset=None, clone=None, free=None):
        self.name, self.accept, self.apply, self.reset, self.clone, self.free = name, accept, apply, reset, clone, free


class UserSampler(Sampler):
    """A llama_sampler made by llama_sampler_init: ``iface`` (a llama_sampler_i) and
    ``ctx`` (the user's data), usable alone or inside a chain."""

    def __init__(self, iface, ctx) -> None:
        self.iface = iface
        self.ctx = ctx

    @property
    def name(self) -> str:  # type: ignore[override]
        f = getattr(self.iface, "name", None)
        if f is None:
            return "(null)"
        n = f(self)
        return n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n)

    def apply(self, cur: TokenDataArray) -> None:
        self.iface.apply(self, cur)

    def accept(self, token: int) -> None:
        f = getattr(self.iface, "accept", None)
        if f is not None:
            f(self, token)

    def reset(self) -> None:
        f = getattr(self.iface, "reset", None)
        if f is not None:
            f(self)

    def clone(self) -> Sampler:
        f = getattr(self.iface, "clone", None)
        if f is not None:
            c = f(self)
            if not isinstance(c, Sampler):
                raise TypeError(f"llama_sampler_clone: the clone callback of sampler {self.name!r} returned "
                                f"{describe(c)}, not a llama_sampler")
            return c
        if self.ctx is None:
            return UserSampler(self.iface, None)
        raise ValueError(f"llama_sampler_clone: sampler {self.name!r} does not support cloning "
                         "(its iface has no clone and its ctx is not None)")

    def free(self) -> None:
        f = getattr(self.iface, "free", None)
        if f is not None:
            f(self)

    def __repr__(self) -> str:
        return f"<UserSampler {self.name}>"


def llama_sampler_init(iface, ctx) -> Sampler:
    """A sampler implemented in Python: ``iface`` has the llama_sampler_i callables
    (``apply`` required, the others may be None), ``ctx`` is the user's data (the
    sampler's ``.ctx``). It works alone (llama_sampler_apply / _sample) and inside a
    chain; llama_sampler_free calls ``iface.free``."""
    fn = "llama_sampler_init"
    if iface is None or not callable(getattr(iface, "apply", None)):
        raise TypeError(f"{fn}: iface must have a callable apply(smpl, cur_p) (a llama_sampler_i), got {describe(iface)}")
    for m in ("name", "accept", "reset", "clone", "free"):
        f = getattr(iface, m, None)
        if f is not None and not callable(f):
            raise TypeError(f"{fn}: iface.{m} must be callable or None, got {describe(f)}")
    return UserSampler(iface, ctx)


def llama_sampler_copy(src, dst) -> None:
    """Copy ``src``'s mutable state (RNG, history, grammar position...) into ``dst``, a
    sampler of the same kind and configuration (a chain: the same samplers, copied one by
    one); ``dst`` stays the same object (a chain keeps it). None or src is dst: no-op;
    different kinds: ValueError (llama.cpp asserts)."""
    fn = "llama_sampler_copy"
    if src is None or dst is None or src is dst:
        return
    src = _SMPL(src, fn, "src")
    dst = _SMPL(dst, fn, "dst")
    if type(src) is not type(dst) or (isinstance(src, UserSampler) and src.iface is not dst.iface):
        raise ValueError(f"{fn}: cannot copy between different sampler types ({src.name!r} -> {dst.name!r})")
    if isinstance(src, SamplerChain):
        if len(src) != len(dst):
            raise ValueError(f"{fn}: chains of different lengths ({len(src)} -> {len(dst)})")
        for a, b in zip(src.samplers, dst.samplers):
            llama_sampler_copy(a, b)
        dst.no_perf, dst.t_sample_us, dst.n_sample = src.no_perf, src.t_sample_us, src.n_sample
        return
    tmp = src.clone()
    if isinstance(dst, UserSampler):
        dst.free()
        dst.ctx = tmp.ctx
        return
    dst.__dict__.clear()
    dst.__dict__.update(tmp.__dict__)


# -- infill and adaptive-p (llama-sampler.cpp) ------------------------------------------------


class InfillSampler(Sampler):
    """llama_sampler_init_infill, as llama.cpp: softmax (sorted); when 3 * p(EOG) * n >
    p(text) keep only the end-of-generation tokens; otherwise merge the probability of each
    token into a token whose piece it prefixes (the likelier of the two keeps it), drop
    non-EOG tokens under p = 0.2, renormalise and drop those under 1 / (n_text + 1); when no
    text token is left, the single candidate is EOT (EOS without one). The math is Rust's
    (``_core.sampler_infill``); the vocabulary gives the pieces and the EOG tokens."""

    name = "infill"

    def __init__(self, vocab) -> None:
        self.vocab = vocab

    def apply(self, cur: TokenDataArray) -> None:
        v = self.vocab
        ids, logits, p, selected, srt = cur.arrays()
        pieces = {int(t): v.token_to_piece(int(t), False, 0) for t in ids.tolist()}
        eot = v.eot if v.eot != LLAMA_TOKEN_NULL else v.eos
        cur.assign(_core.sampler_infill(ids, logits, p, selected, srt, v.eog_ids, pieces, int(eot)))

    def clone(self) -> "InfillSampler":
        return InfillSampler(self.vocab)

    def __deepcopy__(self, memo):
        return self.clone()


def llama_sampler_init_infill(vocab) -> Sampler:
    """llama.cpp's fill-in-the-middle sampler (use it after top-k / top-p)."""
    from .model import Model
    from .vocab import Vocab

    if isinstance(vocab, Model):
        vocab = vocab.vocab
    if not isinstance(vocab, Vocab):
        raise TypeError(f"llama_sampler_init_infill: vocab must be a llama_vocab (llama_model_get_vocab), "
                        f"got {describe(vocab)}")
    return InfillSampler(vocab)


def llama_sampler_init_adaptive_p(target: float, decay: float, seed: int) -> Sampler:
    return _s.AdaptivePSampler(target, decay, seed)


# -- perf ---------------------------------------------------------------------------------

def llama_perf_sampler(chain: SamplerChain) -> llama_perf_sampler_data:
    d = _chain(chain, "llama_perf_sampler").perf()
    return llama_perf_sampler_data(d["t_sample_ms"], d["n_sample"])


def llama_perf_sampler_print(chain: SamplerChain) -> None:
    d = llama_perf_sampler(_chain(chain, "llama_perf_sampler_print"))
    _log.info("%s:    samplers time = %10.2f ms / %5d runs", "llama_perf_sampler_print", d.t_sample_ms, d.n_sample)


def llama_perf_sampler_reset(chain: SamplerChain) -> None:
    _chain(chain, "llama_perf_sampler_reset").perf_reset()


# -- chat templates (llama.h puts them beside the samplers' neighbours; they live here) -----

@dataclass
class llama_chat_message:
    role: "str | bytes"
    content: "str | bytes"


def _text(x) -> str:
    return x.decode("utf-8", "replace") if isinstance(x, (bytes, bytearray)) else str(x)


def _message(m, fn: str, i: int) -> dict:
    """One llama_chat_message (or {"role", "content"} dict) as str role/content."""
    if isinstance(m, dict):
        if "role" not in m:
            raise ValueError(f"{fn}: chat[{i}] has no 'role'")
        role, content = m["role"], m.get("content", "")
    elif isinstance(m, llama_chat_message):
        role, content = m.role, m.content
    else:
        raise TypeError(f"{fn}: chat[{i}] must be a llama_chat_message, got {describe(m)}")
    for what, v in (("role", role), ("content", content)):
        if not isinstance(v, (str, bytes, bytearray)):
            raise TypeError(f"{fn}: chat[{i}].{what} must be bytes or str, got {describe(v)}")
    return {"role": _text(role), "content": _text(content)}


@checked(tmpl=_chk.opt_text, n_msg=int32, length=int32)
def llama_chat_apply_template(tmpl, chat, n_msg: int, add_ass: bool, buf, length: int) -> int:
    """llama.cpp's built-in chat formats (no Jinja, like llama.h): ``tmpl`` is a template
    text (the family is detected from it), a built-in name, or None for chatml. Writes at
    most ``length`` bytes into ``buf`` (None: only measure) and returns the full formatted
    size; -1 when the template is not one of the built-in families (render it with
    pyllama.chat instead). ``chat`` holds at least ``n_msg`` llama_chat_message."""
    from . import chat as _chat

    fn = "llama_chat_apply_template"
    if isinstance(chat, (str, bytes, bytearray)) or not hasattr(chat, "__len__") or not hasattr(chat, "__getitem__"):
        raise TypeError(f"{fn}: chat must be a sequence of llama_chat_message, got {describe(chat)}")
    if not 0 <= n_msg <= len(chat):
        raise ValueError(f"{fn}: n_msg = {n_msg} outside [0, len(chat) = {len(chat)}]")
    mv = None if buf is None else _chk.bytes_out(buf, fn, "buf", length, "length")
    msgs = [_message(chat[i], fn, i) for i in range(n_msg)]
    name = _chat.detect_builtin("chatml" if tmpl is None else _text(tmpl))
    if name is None:
        _log.warning("llama_chat_apply_template: template not supported by the built-in formats "
                     "(use pyllama.chat.ChatTemplate for Jinja templates)")
        return -1
    out = _chat.apply_builtin(name, msgs, bool(add_ass)).encode("utf-8")
    if mv is not None and length > 0:
        n = min(length, len(out))
        mv[:n] = out[:n]
    return len(out)


@checked(len_=int32)
def llama_chat_builtin_templates(output=None, len_: int = 0):
    """Names of the built-in chat formats: a list (called without arguments), or
    llama.h's form filling ``output`` (a list or ctypes c_char_p array of at least
    ``len_`` entries) and returning the count."""
    from .chat import BUILTIN_TEMPLATES

    names = list(BUILTIN_TEMPLATES)
    if output is None:
        return names
    fn = "llama_chat_builtin_templates"
    if isinstance(output, (str, bytes, bytearray)) or not hasattr(output, "__setitem__") or not hasattr(output, "__len__"):
        raise TypeError(f"{fn}: output must be a writable array of strings, got {describe(output)}")
    if len_ > len(output):
        raise ValueError(f"{fn}: output holds {len(output)} entries but len = {len_}")
    for i in range(min(len_, len(names))):
        output[i] = names[i].encode()
    return len(names)


__all__ = [n for n in dir() if n.startswith(("llama_", "LLAMA_"))]
