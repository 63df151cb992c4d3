"""llama.h's extended batch (``llama_batch_ext_*``, ``llama_process``) and its per-sequence
("backend") sampling API (``llama_set_sampler``, ``llama_get_sampled_*_ith``), on top of
pyllama's decode and sampler chains (see llama_api.py).

Backend sampling, as llama.cpp does it (src/llama-context.cpp, llama-graph.cpp
build_sampling): a sampler chain attached to a sequence runs right after each decode on
every output row whose token's first sequence is that one. The chain's leading samplers
that llama.cpp can run on the backend (greedy, dist, top-k, top-p, min-p, temperature,
extended temperature, penalties, logit bias, and disabled ones) are applied there; the
results are kept per output row: the selected token (when the prefix ends in greedy/dist),
the surviving candidates' logits, their probabilities (after dist) and ids. The sampler's
state does not advance then: ``llama_sampler_sample(chain, ctx, i)`` returns the sampled
token and accepts it, or applies the rest of the chain to the kept candidates. pyllama
runs these samplers on the CPU with the same code as everywhere else, so the tokens are
the ones llama_sampler_sample would pick without a backend sampler; only the candidate
lists differ in form (min-p removes candidates where ggml masks them to -inf). With
n_outputs_max_per_seq > 1 every output row of a sequence draws at decode time, in batch
order; llama.cpp's dist sampler rolls back the draws of rows that are never accepted
(speculative decoding), pyllama's does not.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Optional

import numpy as np

from . import _api_check as _chk
from . import sampling as _s
from ._api_check import checked, describe, int32
from ._api_context import _CTX, _SEQ_SAMPLERS, decode_status, llama_encode
from .batch import LLAMA_TOKEN_NULL, Batch
from .context import Context

log = logging.getLogger("pyllama")

# enum llama_process_type
LLAMA_PROCESS_TYPE_ENCODE = 0
LLAMA_PROCESS_TYPE_DECODE = 1


class llama_sampler_seq_config:  # noqa: N801 (llama.h's type name)
    """llama_context_params.samplers entries: a sampler chain for one sequence."""

    def __init__(self, seq_id: int = 0, sampler: Any = None) -> None:
        self.seq_id = seq_id
        self.sampler = sampler

    def __repr__(self) -> str:
        return f"llama_sampler_seq_config(seq_id={self.seq_id}, sampler={self.sampler!r})"


class llama_embd:  # noqa: N801 (llama.h's type name)
    """llama.h's struct llama_embd: ``data`` float32 of ``n_rows * n_embd`` values."""

    def __init__(self, data: Any = None, n_rows: int = 1, n_embd: int = 0) -> None:
        self.data = data
        self.n_rows = n_rows
        self.n_embd = n_embd

    def __repr__(self) -> str:
        return f"llama_embd(n_rows={self.n_rows}, n_embd={self.n_embd})"


# ---------------------------------------------------------------------- llama_batch_ext


class llama_batch_ext:  # noqa: N801 (llama.h's type name)
    """llama.h's struct llama_batch_ext: entries added one at a time, each with a token id
    or an embedding, one or more sequences, an explicit position (0 until
    llama_batch_ext_set_pos) and an output flag (off until set)."""

    def __init__(self, ctx: Context) -> None:
        self.n_tokens_max = ctx.n_batch
        self.n_embd_inp = ctx.n_embd
        self.n_seq_max = ctx.n_seq_max
        self.n_vocab = ctx.n_vocab
        self.clear()

    def clear(self) -> None:
        self.ids: list[int] = []
        self.seqs: list[list[int]] = []
        self.pos: list[int] = []
        self.output: list[bool] = []
        self.embd: list[Optional[np.ndarray]] = []

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"llama_batch_ext(n_tokens={len(self)}, n_tokens_max={self.n_tokens_max})"

    def add(self, seq_id: int) -> int:
        if len(self.ids) >= self.n_tokens_max:
            return -1
        if not 0 <= seq_id < self.n_seq_max:
            return -3
        self.ids.append(LLAMA_TOKEN_NULL)
        self.seqs.append([seq_id])
        self.pos.append(0)
        self.output.append(False)
        self.embd.append(None)
        return len(self.ids) - 1

    def set_embd(self, idx: int, embd: Any, fn: str) -> bool:
        _EMBD(embd, fn, "embd")
        if not 0 <= idx < len(self.ids):
            return False
        if embd.data is None:
            return False
        n_rows = _chk.size(embd.n_rows, fn, "embd.n_rows")
        n_embd = _chk.size(embd.n_embd, fn, "embd.n_embd")
        try:
            data = np.asarray(embd.data, dtype=np.float32).reshape(-1)
        except (TypeError, ValueError):
            raise TypeError(f"{fn}: embd.data must be an array of floats, got {describe(embd.data)}") from None
        n_total = n_rows * n_embd
        if n_total != self.n_embd_inp:
            log.error("%s: embedding size mismatch, got %d rows x %d = %d, expected %d", fn, n_rows, n_embd, n_total,
                      self.n_embd_inp)
            return False
        if data.shape[0] < n_total:
            raise ValueError(f"{fn}: embd.data holds {data.shape[0]} floats but n_rows * n_embd = {n_total}")
        if self.embd[idx] is not None:
            log.error("%s: embedding for token %d is already set", fn, idx)
            return False
        self.embd[idx] = data[:n_total].copy()
        return True

    def to_batch(self) -> Batch:
        """The entries as a llama_batch (positions, sequences and outputs explicit);
        ValueError for an entry with both a token id and an embedding, or a batch mixing
        the two kinds (pyllama's models take one kind of input per batch)."""
        n = len(self.ids)
        has_embd = [e is not None for e in self.embd]
        has_tok = [t != LLAMA_TOKEN_NULL for t in self.ids]
        if any(a and b for a, b in zip(has_embd, has_tok)):
            raise ValueError("an entry has both a token id and an embedding, which pyllama's models cannot take "
                             "(one input per entry)")
        if len(set(has_tok)) > 1:
            raise ValueError("token ids and embeddings are mixed in one batch (every entry must have the same kind)")
        n_seq = max(len(s) for s in self.seqs)
        seq_id = np.zeros((n, n_seq), np.int32)
        for i, s in enumerate(self.seqs):
            seq_id[i, : len(s)] = s
        return Batch(
            n_tokens=n,
            token=np.array(self.ids, np.int32) if has_tok[0] else None,
            embd=np.stack(self.embd) if has_embd[0] else None,
            pos=np.array(self.pos, np.int32),
            n_seq_id=np.array([len(s) for s in self.seqs], np.int32),
            seq_id=seq_id,
            logits=np.array(self.output, np.int8),
        )


def _EMBD(v: Any, fn: str, name: str) -> llama_embd:
    if not isinstance(v, llama_embd):
        raise TypeError(f"{fn}: {name} must be a llama_embd (data, n_rows, n_embd), got {describe(v)}")
    return v


def _BX(v: Any, fn: str, name: str) -> llama_batch_ext:
    if not isinstance(v, llama_batch_ext):
        raise TypeError(f"{fn}: {name} must be a llama_batch_ext (llama_batch_ext_init), got {describe(v)}")
    if _chk.is_freed(v):
        raise ValueError(f"{fn}: {name} has been freed (llama_batch_ext_free)")
    return v


@checked(ctx=_CTX)
def llama_batch_ext_init(ctx: Context) -> llama_batch_ext:
    """An empty extended batch for ``ctx``: up to n_batch entries, seq ids < n_seq_max."""
    return llama_batch_ext(ctx)


@checked(batch=_chk.instance(llama_batch_ext, "a llama_batch_ext", none_ok=True))
def llama_batch_ext_free(batch: Optional[llama_batch_ext]) -> None:
    """Any later use of the batch is a ValueError; NULL and a second free are no-ops."""
    if batch is not None:
        batch.clear()
        _chk.mark_freed(batch)


@checked(batch=_BX)
def llama_batch_ext_clear(batch: llama_batch_ext) -> None:
    batch.clear()


@checked(batch=_BX, seq_id=int32)
def llama_batch_ext_add(batch: llama_batch_ext, seq_id: int) -> int:
    """Add an entry for ``seq_id`` with no token id nor embedding yet; its index, or -1
    (batch full), -3 (seq_id outside [0, n_seq_max))."""
    return batch.add(seq_id)


@checked(batch=_BX, seq_id=int32, id=int32)
def llama_batch_ext_add_token(batch: llama_batch_ext, seq_id: int, id: int) -> int:  # noqa: A002 (llama.h's name)
    """Add token ``id`` for ``seq_id``: its index, or -1 (full), -2 (id outside the
    vocabulary; nothing added), -3 (bad seq_id). The position is 0 until set."""
    if not 0 <= id < batch.n_vocab and 0 <= seq_id < batch.n_seq_max and len(batch) < batch.n_tokens_max:
        # llama.cpp adds the entry and then fails to set its id: the entry stays, id-less
        batch.add(seq_id)
        return -2
    idx = batch.add(seq_id)
    if idx < 0:
        return idx
    batch.ids[idx] = id
    return idx


@checked(batch=_BX, seq_id=int32, embd=_EMBD)
def llama_batch_ext_add_embd(batch: llama_batch_ext, seq_id: int, embd: llama_embd) -> int:
    """Add an entry for ``seq_id`` holding embedding ``embd`` (n_rows * n_embd == the
    model's n_embd): its index, or -1 / -2 (bad embedding) / -3 as llama_batch_ext_add_token."""
    idx = batch.add(seq_id)
    if idx < 0:
        return idx
    if not batch.set_embd(idx, embd, "llama_batch_ext_add_embd"):
        return -2
    return idx


@checked(batch=_BX, idx=int32, seq_id=int32)
def llama_batch_ext_add_seq(batch: llama_batch_ext, idx: int, seq_id: int) -> bool:
    """Put entry ``idx`` in sequence ``seq_id`` too (same position); False for a bad idx or seq_id."""
    if not 0 <= idx < len(batch) or not 0 <= seq_id < batch.n_seq_max:
        return False
    if seq_id not in batch.seqs[idx]:
        batch.seqs[idx].append(seq_id)
    return True


@checked(batch=_BX, idx=int32, embd=_EMBD)
def llama_batch_ext_set_embd_token(batch: llama_batch_ext, idx: int, embd: llama_embd) -> bool:
    """Set the embedding of entry ``idx``; False (reason logged) on a size mismatch or
    when it already has one. An entry with both a token id and an embedding is refused
    by llama_process (pyllama's models take one input per entry)."""
    return batch.set_embd(idx, embd, "llama_batch_ext_set_embd_token")


@checked(batch=_BX, idx=int32, embd=_EMBD)
def llama_batch_ext_set_embd_state(batch: llama_batch_ext, idx: int, embd: llama_embd) -> bool:
    """False, as llama.cpp (not implemented there either: state embeddings are for MTP
    and deepstack models)."""
    return False


@checked(batch=_BX, idx=int32)
def llama_batch_ext_set_output_embd(batch: llama_batch_ext, idx: int, value: bool) -> bool:
    """Request (or not) the outputs of entry ``idx``; the same flag as _set_output_logits."""
    if not 0 <= idx < len(batch):
        return False
    batch.output[idx] = bool(value)
    return True


@checked(batch=_BX, idx=int32)
def llama_batch_ext_set_output_logits(batch: llama_batch_ext, idx: int, value: bool) -> bool:
    if not 0 <= idx < len(batch):
        return False
    batch.output[idx] = bool(value)
    return True


@checked(batch=_BX, idx=int32)
def llama_batch_ext_set_pos(batch: llama_batch_ext, idx: int, pos: Any) -> bool:
    """Position of entry ``idx``: ``pos`` is an int or an array whose first value is used
    (one position per token; pyllama has no M-RoPE models). False for a bad idx or None."""
    if not 0 <= idx < len(batch) or pos is None:
        return False
    if isinstance(pos, (int, np.integer)):
        p = int32(pos, "llama_batch_ext_set_pos", "pos")
    else:
        try:
            p = int32(np.asarray(pos).reshape(-1)[0], "llama_batch_ext_set_pos", "pos[0]")
        except IndexError:
            raise ValueError("llama_batch_ext_set_pos: pos is empty") from None
    batch.pos[idx] = p
    return True


@checked(ctx=_CTX, type=int32, batch=_BX)
def llama_process(ctx: Context, type: int, batch: llama_batch_ext) -> int:  # noqa: A002 (llama.h's name)
    """Run ``batch`` through the decoder (LLAMA_PROCESS_TYPE_DECODE) or the encoder
    (_ENCODE: pyllama's models have none, -1 as llama_encode). Return codes as llama_decode.
    A batch made for another context of the same model works (the decode validates token
    ids, sequence ids and the size against this context)."""
    if type == LLAMA_PROCESS_TYPE_ENCODE:
        return llama_encode(ctx, Batch(n_tokens=0))
    if type != LLAMA_PROCESS_TYPE_DECODE:
        log.error("llama_process: unknown process type %d", type)
        return -1
    if len(batch) == 0:
        log.error("llama_process: n_tokens == 0")
        return -1
    if any(t == LLAMA_TOKEN_NULL and e is None for t, e in zip(batch.ids, batch.embd)):
        log.error("llama_process: an entry has neither a token id nor an embedding")
        return -1
    try:
        b = batch.to_batch()
    except ValueError as e:
        log.error("llama_process: %s", e)
        return -1
    if ctx in _SEQ_SAMPLERS:
        return decode_and_sample(ctx, b, "llama_process")
    return decode_status(ctx, b)


# ---------------------------------------------------------------------- backend sampling

# samplers llama.cpp can run on the backend (those with backend_init in llama-sampler.cpp)
_BACKEND_OK = (_s.GreedySampler, _s.DistSampler, _s.TopKSampler, _s.TopPSampler, _s.MinPSampler,
               _s.TempSampler, _s.TempExtSampler, _s.PenaltiesSampler, _s.LogitBiasSampler, _s.EmptySampler)


def backend_prefix(chain: _s.SamplerChain) -> int:
    """How many leading samplers of ``chain`` llama.cpp runs on the backend."""
    n = 0
    for smpl in chain.samplers:
        if type(smpl) not in _BACKEND_OK:
            break
        n += 1
    return n


class _Sampled:
    """Per output row of the last decode: token (or LLAMA_TOKEN_NULL), logits, probs and
    candidate ids (None when not produced), as llama.cpp's sampling buffers."""

    __slots__ = ("token", "logits", "probs", "ids")

    def __init__(self, token: int, logits, probs, ids) -> None:
        self.token, self.logits, self.probs, self.ids = token, logits, probs, ids


#: context -> {output row: _Sampled} of the last decode
_RESULTS: "weakref.WeakKeyDictionary[Context, dict]" = weakref.WeakKeyDictionary()

#: chain attached to a sequence -> how many of its leading samplers run after each decode
#: (backend_prefix); llama_sampler_sample then runs only the rest
BACKEND_N: "weakref.WeakKeyDictionary[_s.SamplerChain, int]" = weakref.WeakKeyDictionary()


def set_seq_sampler(ctx: Context, seq_id: int, smpl: Any, fn: str) -> bool:
    samplers = _SEQ_SAMPLERS.get(ctx, {})
    if smpl is None:
        samplers.pop(seq_id, None)
    elif isinstance(smpl, _s.SamplerChain) and len(smpl) > 0:
        samplers[seq_id] = smpl
        BACKEND_N[smpl] = backend_prefix(smpl)
        log.debug("%s: seq_id = %d, sampler = %s", fn, seq_id, smpl.describe())
    else:
        name = getattr(smpl, "name", "?")
        log.warning("%s: sampler '%s' for seq_id = %d, cannot be offloaded to the backend", fn, name, seq_id)
        samplers.pop(seq_id, None)
        if samplers:
            _SEQ_SAMPLERS[ctx] = samplers
        else:
            _SEQ_SAMPLERS.pop(ctx, None)
        return False
    if samplers:
        _SEQ_SAMPLERS[ctx] = samplers
    else:
        _SEQ_SAMPLERS.pop(ctx, None)
        _RESULTS.pop(ctx, None)
    return True


def _first_seqs(batch: Batch, n: int) -> np.ndarray:
    if batch.seq_id is None:
        return np.zeros(n, np.int32)
    return np.asarray(batch.seq_id, dtype=np.int64).reshape(n, -1)[:, 0] if n else np.zeros(0, np.int32)


def decode_and_sample(ctx: Context, batch: Batch, fn: str) -> int:
    """llama_decode for a context with sequence samplers: refuse a batch with more outputs
    for such a sequence than n_outputs_max_per_seq (-1, as llama.cpp), decode, then run
    each sequence's backend prefix on its output rows."""
    samplers = _SEQ_SAMPLERS.get(ctx, {})
    n = int(batch.n_tokens)
    limit = max(1, int(getattr(ctx.params, "n_outputs_max_per_seq", 1) or 1))
    try:
        firsts = _first_seqs(batch, n)
    except ValueError:
        firsts = None  # malformed: the decode's own checks report it
    if firsts is not None and n:
        if ctx.embeddings_enabled:
            out = np.ones(n, bool)
        elif batch.logits is None:
            out = np.zeros(n, bool)
            out[-1] = True
        else:
            out = np.asarray(batch.logits)[:n] != 0
        for seq_id in samplers:
            count = int(np.count_nonzero(out & (firsts == seq_id)))
            if count > limit:
                log.error("%s: backend sampling supports at most %d outputs per sequence (seq_id %d had %d)",
                          fn, limit, seq_id, count)
                return -1
    code = decode_status(ctx, batch)
    results: dict = {}
    _RESULTS[ctx] = results
    if code != 0 or firsts is None:
        return code
    out_ids = ctx.output_ids[:n]
    for i in np.flatnonzero(out_ids >= 0):
        chain = samplers.get(int(firsts[i]))
        if chain is None:
            continue
        row = int(out_ids[i])
        cur = _s.TokenDataArray.from_logits(ctx.logits[row])
        probs = False
        for smpl in chain.samplers[: BACKEND_N.get(chain, 0)]:
            smpl.apply(cur)
            probs = probs or isinstance(smpl, _s.DistSampler)
        identity = cur.size == ctx.n_vocab and bool(np.array_equal(cur.ids, np.arange(cur.size)))
        token = int(cur.ids[cur.selected]) if 0 <= cur.selected < cur.size else LLAMA_TOKEN_NULL
        results[row] = _Sampled(token, np.array(cur.logits, np.float32), np.array(cur.p, np.float32) if probs else None,
                                None if identity else np.array(cur.ids, np.int32))
    return code


@checked(ctx=_CTX, seq_id=int32)
def llama_set_sampler(ctx: Context, seq_id: int, smpl: Any) -> bool:
    """Attach sampler chain ``smpl`` to ``seq_id`` (None detaches): after each decode it
    samples that sequence's outputs (see the module docstring). False (and a warning) when
    ``smpl`` is not a non-empty sampler chain, as llama.cpp cannot offload it."""
    from ._api_sampling import _SMPL

    if smpl is not None:
        _SMPL(smpl, "llama_set_sampler", "smpl")
    if not 0 <= seq_id < ctx.n_seq_max:
        raise ValueError(f"llama_set_sampler: seq_id = {seq_id} outside [0, n_seq_max = {ctx.n_seq_max})")
    return set_seq_sampler(ctx, seq_id, smpl, "llama_set_sampler")


def init_samplers(ctx: Context, params: Any) -> None:
    """llama_context_params.samplers / n_samplers: attach each chain (RuntimeError for a
    sampler that is not a chain, as llama.cpp throws and the context is not created)."""
    configs = params.samplers
    n = int(params.n_samplers or 0)
    if configs is None or n <= 0:
        return
    for i in range(n):
        c = configs[i]
        smpl = getattr(c, "sampler", None)
        if not isinstance(smpl, _s.SamplerChain):
            raise RuntimeError("the backend samplers must be of type llama_sampler_chain "
                               f"(samplers[{i}].sampler is {describe(smpl)})")
        seq_id = int32(getattr(c, "seq_id", None), "llama_init_from_model", f"params.samplers[{i}].seq_id")
        if set_seq_sampler(ctx, seq_id, smpl, "llama_init_from_model"):
            log.info("llama_context: setting backend sampler for seq_id %d (n = %d)", seq_id, len(smpl))


def sampled_row(ctx: Context, i: int, fn: str) -> Optional[_Sampled]:
    res = _RESULTS.get(ctx)
    if res is None:
        return None
    try:
        row = ctx.output_row(i)
    except IndexError as e:
        log.error("%s: invalid backend sampled id %d, reason: %s", fn, i, e)
        return None
    return res.get(row)


@checked(ctx=_CTX, i=int32)
def llama_get_sampled_token_ith(ctx: Context, i: int) -> int:
    """The token the sequence sampler selected for batch entry ``i`` (i < 0 counts back
    from the last output), LLAMA_TOKEN_NULL when none was."""
    r = sampled_row(ctx, i, "llama_get_sampled_token_ith")
    return LLAMA_TOKEN_NULL if r is None else r.token


@checked(ctx=_CTX, i=int32)
def llama_get_sampled_probs_ith(ctx: Context, i: int) -> Optional[np.ndarray]:
    """float32 probabilities of the kept candidates (after a dist sampler), else None."""
    r = sampled_row(ctx, i, "llama_get_sampled_probs_ith")
    return None if r is None else r.probs


@checked(ctx=_CTX, i=int32)
def llama_get_sampled_probs_count_ith(ctx: Context, i: int) -> int:
    r = sampled_row(ctx, i, "llama_get_sampled_probs_count_ith")
    return 0 if r is None or r.probs is None else int(r.probs.shape[0])


@checked(ctx=_CTX, i=int32)
def llama_get_sampled_logits_ith(ctx: Context, i: int) -> Optional[np.ndarray]:
    """float32 logits of the candidates the sequence sampler kept, else None."""
    r = sampled_row(ctx, i, "llama_get_sampled_logits_ith")
    return None if r is None else r.logits


@checked(ctx=_CTX, i=int32)
def llama_get_sampled_logits_count_ith(ctx: Context, i: int) -> int:
    """How many sampled logits entry ``i`` has (0 when its sequence has no sampler);
    n_vocab when the context has no sequence sampler at all (llama.cpp: the raw logits
    are the candidates then)."""
    if ctx not in _SEQ_SAMPLERS:
        return ctx.n_vocab
    r = sampled_row(ctx, i, "llama_get_sampled_logits_count_ith")
    return 0 if r is None else int(r.logits.shape[0])


@checked(ctx=_CTX, i=int32)
def llama_get_sampled_candidates_ith(ctx: Context, i: int) -> np.ndarray:
    """int32 token ids of the sampled logits/probs; every id 0..n_vocab-1 when the
    sampler kept the whole vocabulary in order (llama.cpp's fallback)."""
    r = sampled_row(ctx, i, "llama_get_sampled_candidates_ith")
    if r is not None and r.ids is not None:
        return r.ids
    return np.arange(ctx.n_vocab, dtype=np.int32)


@checked(ctx=_CTX, i=int32)
def llama_get_sampled_candidates_count_ith(ctx: Context, i: int) -> int:
    """How many candidate ids entry ``i`` has (0: the whole vocabulary, in order)."""
    r = sampled_row(ctx, i, "llama_get_sampled_candidates_count_ith")
    return 0 if r is None or r.ids is None else int(r.ids.shape[0])


__all__ = [n for n in dir() if n.startswith(("llama_", "LLAMA_"))]
