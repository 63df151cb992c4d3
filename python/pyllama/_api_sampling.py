"""llama.h-style sampler functions (see llama_api.py): thin names over :mod:`pyllama.sampling`.

A ``llama_sampler *`` is a :class:`pyllama.sampling.Sampler`; a chain is a
:class:`pyllama.sampling.SamplerChain`; ``llama_token_data_array`` is
:class:`pyllama.sampling.TokenDataArray`. Misuse that llama.cpp would abort on (perf of a
non-chain, a chain that selects nothing) raises ``ValueError`` / ``RuntimeError`` here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from . import sampling as _s
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


def llama_sampler_chain_init(params: llama_sampler_chain_params | None = None) -> SamplerChain:
    params = params or llama_sampler_chain_default_params()
    return SamplerChain(no_perf=params.no_perf)


def _chain(chain, fn: str) -> SamplerChain:
    if not isinstance(chain, SamplerChain):
        raise ValueError(f"{fn}: invalid sampler passed - requires a sampler created with llama_sampler_chain_init()")
    return chain


def llama_sampler_chain_add(chain: SamplerChain, smpl: Sampler) -> None:
    _chain(chain, "llama_sampler_chain_add").add(smpl)


def llama_sampler_chain_get(chain, i: int):
    if not isinstance(chain, SamplerChain):
        return None
    if i == -1:
        return chain
    if i < 0 or i >= len(chain):
        return None
    return chain[i]


def llama_sampler_chain_n(chain: SamplerChain) -> int:
    return len(_chain(chain, "llama_sampler_chain_n"))


def llama_sampler_chain_remove(chain: SamplerChain, i: int):
    chain = _chain(chain, "llama_sampler_chain_remove")
    if i < 0 or i >= len(chain):
        return None
    return chain.remove(i)


def llama_sampler_name(smpl: Sampler) -> str:
    return smpl.name


def llama_sampler_accept(smpl: Sampler, token: int) -> None:
    smpl.accept(int(token))


def llama_sampler_apply(smpl: Sampler, cur_p: TokenDataArray) -> None:
    smpl.apply(cur_p)


def llama_sampler_reset(smpl: Sampler) -> None:
    smpl.reset()


def llama_sampler_clone(smpl: Sampler) -> Sampler:
    return smpl.clone()


def llama_sampler_free(smpl: Sampler | None) -> None:
    """Nothing to free in Python; kept so llama.h-style code ports unchanged."""


def llama_sampler_get_seed(smpl: Sampler) -> int:
    if isinstance(smpl, (_s.DistSampler, _s.MirostatSampler, _s.MirostatV2Sampler)):
        return smpl.seed_cur
    if isinstance(smpl, SamplerChain):
        for s in reversed(smpl.samplers):
            seed = llama_sampler_get_seed(s)
            if seed != LLAMA_DEFAULT_SEED:
                return seed
    return LLAMA_DEFAULT_SEED


def llama_sampler_sample(smpl: Sampler, ctx, idx: int) -> int:
    """Read logits row ``idx`` of ``ctx`` (``llama_get_logits_ith``), apply ``smpl``, accept
    and return the selected token."""
    from . import _api_context

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


def llama_sampler_init_grammar(vocab, grammar_str: str, grammar_root: str = "root"):
    raise NotImplementedError(
        "llama_sampler_init_grammar: GBNF grammars are not supported by pyllama yet"
    )


def llama_sampler_init_grammar_lazy_patterns(vocab, grammar_str: str, grammar_root: str = "root", *args):
    raise NotImplementedError(
        "llama_sampler_init_grammar_lazy_patterns: GBNF grammars are not supported by pyllama yet"
    )


# -- perf ---------------------------------------------------------------------------------

def llama_perf_sampler(chain: SamplerChain) -> llama_perf_sampler_data:
    d = _chain(chain, "llama_perf_sampler").perf()
    return llama_perf_sampler_data(d["t_sample_ms"], d["n_sample"])


def llama_perf_sampler_print(chain: SamplerChain) -> None:
    d = llama_perf_sampler(chain)
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


def llama_chat_apply_template(tmpl, chat, n_msg: int, add_ass: bool, buf, length: int) -> int:
    """llama.cpp's built-in chat formats (no Jinja, like llama.h): ``tmpl`` is a template
    text (the family is detected from it), a built-in name, or None for chatml. Writes at
    most ``length`` bytes into ``buf`` and returns the full formatted size; -1 when the
    template is not one of the built-in families (render it with pyllama.chat instead)."""
    from . import chat as _chat

    name = _chat.detect_builtin("chatml" if tmpl is None else _text(tmpl))
    if name is None:
        _log.warning("llama_chat_apply_template: template not supported by the built-in formats "
                     "(use pyllama.chat.ChatTemplate for Jinja templates)")
        return -1
    msgs = []
    for m in list(chat)[:n_msg]:
        if isinstance(m, dict):
            msgs.append({"role": _text(m["role"]), "content": _text(m.get("content", ""))})
        else:
            msgs.append({"role": _text(m.role), "content": _text(m.content)})
    out = _chat.apply_builtin(name, msgs, bool(add_ass)).encode("utf-8")
    if buf is not None and length > 0:
        n = min(length, len(out))
        mv = memoryview(buf).cast("B")
        mv[:n] = out[:n]
    return len(out)


def llama_chat_builtin_templates(output=None, len_: int = 0):
    """Names of the built-in chat formats: a list (called without arguments), or
    llama.h's form filling ``output`` and returning the count."""
    from .chat import BUILTIN_TEMPLATES

    names = list(BUILTIN_TEMPLATES)
    if output is None:
        return names
    for i in range(min(len_, len(names))):
        output[i] = names[i].encode()
    return len(names)


__all__ = [n for n in dir() if n.startswith(("llama_", "LLAMA_"))]
