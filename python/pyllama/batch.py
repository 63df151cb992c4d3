"""Batches and the batch allocator (pipeline steps 10-11).

A :class:`Batch` is llama.h's ``llama_batch`` with numpy arrays for its pointers. Before a
batch reaches the Rust forward pass, :func:`allocate` does what llama.cpp's
``llama_batch_compat::init`` + ``llama_batch_allocr::init`` do (src/llama-batch.cpp):

1. validate: content types (token ids or embeddings, the same for every entry), token ids in
   ``[0, n_vocab)``, seq ids in ``[0, n_seq_max)``, positions that continue the cache
   (``Y = X + 1`` where X is the cache's last position of the sequence), no gaps, no
   decreasing positions, no sequence in incompatible sequence sets, coupled sequences that
   have not diverged;
2. fill what the caller left out: positions from ``seq_pos_max(s) + 1`` (per first seq id),
   sequence 0, and an output (logits) only for the last token.

Anything invalid raises :class:`~pyllama.errors.InvalidBatchError` whose message follows
llama.cpp's log line; ``llama_decode`` turns it into ``-1`` before anything has changed.

Then :func:`split_simple` / :func:`split_equal` cut the batch into micro-batches (lists of
batch indices, each at most ``n_ubatch`` long) the way llama.cpp's allocator does.
Everything here is pure Python/numpy over small int arrays; the heavy work is in Rust.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from .errors import InvalidBatchError

# llama.h: LLAMA_MAX_SEQ (the most sequences a context can hold), LLAMA_TOKEN_NULL.
LLAMA_MAX_SEQ = 256
LLAMA_TOKEN_NULL = -1


class Batch:
    """llama.h's ``llama_batch``: parallel arrays over ``n_tokens`` entries.

    Fields (``None`` where llama.h has a null pointer):

    - ``token``: int32 [n_alloc] token ids (``None`` for an embedding batch)
    - ``embd``: float32 [n_alloc, n_embd] input embeddings (``None`` for a token batch)
    - ``pos``: int32 [n_alloc] positions (``None``: filled from the cache)
    - ``n_seq_id``: int32 [n_alloc] how many entries of ``seq_id[i]`` are valid
    - ``seq_id``: int32 [n_alloc, n_seq_max] sequence ids of each entry (``None``: sequence 0)
    - ``logits``: int8 [n_alloc] nonzero where an output is wanted (``None``: the last entry)
    - ``n_tokens``: how many entries are in use (the caller sets it, as in C)
    """

    __slots__ = ("n_tokens", "token", "embd", "pos", "n_seq_id", "seq_id", "logits")

    def __init__(
        self,
        n_tokens: int = 0,
        token: Optional[np.ndarray] = None,
        embd: Optional[np.ndarray] = None,
        pos: Optional[np.ndarray] = None,
        n_seq_id: Optional[np.ndarray] = None,
        seq_id: Optional[np.ndarray] = None,
        logits: Optional[np.ndarray] = None,
    ) -> None:
        self.n_tokens = n_tokens
        self.token = token
        self.embd = embd
        self.pos = pos
        self.n_seq_id = n_seq_id
        self.seq_id = seq_id
        self.logits = logits

    def __repr__(self) -> str:
        kind = "embd" if self.embd is not None else "token"
        return f"Batch(n_tokens={self.n_tokens}, kind={kind})"


def batch_init(n_tokens_alloc: int, embd: int = 0, n_seq_max: int = 1) -> Batch:
    """``llama_batch_init``: room for ``n_tokens_alloc`` entries, zero-filled, ``n_tokens = 0``.

    With ``embd > 0`` the batch carries float32 [n_tokens_alloc, embd] embeddings and no
    token ids, as in llama.cpp. Each entry can belong to up to ``n_seq_max`` sequences.
    """
    if n_tokens_alloc < 0:
        raise ValueError(f"llama_batch_init: n_tokens_alloc = {n_tokens_alloc} must be >= 0")
    if embd < 0:
        raise ValueError(f"llama_batch_init: embd = {embd} must be >= 0")
    if n_seq_max < 1:
        raise ValueError(f"llama_batch_init: n_seq_max = {n_seq_max} must be >= 1")
    return Batch(
        n_tokens=0,
        token=None if embd else np.zeros(n_tokens_alloc, dtype=np.int32),
        embd=np.zeros((n_tokens_alloc, embd), dtype=np.float32) if embd else None,
        pos=np.zeros(n_tokens_alloc, dtype=np.int32),
        n_seq_id=np.zeros(n_tokens_alloc, dtype=np.int32),
        seq_id=np.zeros((n_tokens_alloc, n_seq_max), dtype=np.int32),
        logits=np.zeros(n_tokens_alloc, dtype=np.int8),
    )


def batch_get_one(tokens) -> Batch:
    """``llama_batch_get_one``: a batch of the given token ids, everything else filled later
    (positions continue sequence 0, only the last token gets logits).

    An int32 numpy array is used in place (no copy), as the C version keeps the pointer.
    """
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"llama_batch_get_one: tokens must be 1-D, got shape {arr.shape}")
    if arr.dtype != np.int32:
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"llama_batch_get_one: tokens must be integers, got dtype {arr.dtype}")
        if arr.size and (arr.min() < -(2**31) or arr.max() >= 2**31):
            i = int(np.argmax((arr < -(2**31)) | (arr >= 2**31)))
            raise ValueError(f"llama_batch_get_one: tokens[{i}] = {int(arr[i])} does not fit int32")
        arr = arr.astype(np.int32)
    return Batch(n_tokens=int(arr.shape[0]), token=arr)


def batch_add(batch: Batch, token: int, pos: int, seq_ids: Sequence[int], logits: bool) -> None:
    """Append one entry (common.h's ``common_batch_add``): a convenience for filling a
    :func:`batch_init` batch without index arithmetic."""
    i = batch.n_tokens
    if batch.token is None or i >= batch.token.shape[0]:
        raise ValueError(f"batch_add: batch is full ({i} entries allocated) or carries no token ids")
    if batch.seq_id is None or len(seq_ids) > batch.seq_id.shape[1]:
        raise ValueError(f"batch_add: {len(seq_ids)} seq ids do not fit (batch n_seq_max = "
                         f"{None if batch.seq_id is None else batch.seq_id.shape[1]})")
    batch.token[i] = token
    batch.pos[i] = pos
    batch.n_seq_id[i] = len(seq_ids)
    batch.seq_id[i, : len(seq_ids)] = seq_ids
    batch.logits[i] = 1 if logits else 0
    batch.n_tokens = i + 1


@dataclass
class AllocatedBatch:
    """A validated, filled-in batch: what the micro-batch split and the Rust call consume.

    - ``token``: int32 [n] or None; ``embd``: float32 [n, n_embd] or None
    - ``pos``: int32 [n]
    - ``seq_ids``: per entry, the sorted tuple of its distinct sequence ids
    - ``seq_mask``: per entry, the same set as a bitmask (bit s = sequence s)
    - ``output``: bool [n]; ``n_outputs`` its count
    - ``seq_pos``: sequence id -> (min, max) position of that sequence in this batch
    - ``has_cpl``: some entry belongs to more than one sequence
    """

    n_tokens: int
    token: Optional[np.ndarray]
    embd: Optional[np.ndarray]
    pos: np.ndarray
    seq_ids: list
    seq_mask: list
    output: np.ndarray
    n_outputs: int
    seq_pos: dict
    has_cpl: bool

    def seq_id_array(self, n_seq_max: int) -> tuple[np.ndarray, np.ndarray]:
        """(n_seq_id int32 [n], seq_id int32 [n, n_seq_max]) for the Rust boundary."""
        n = self.n_tokens
        seq_id = np.zeros((n, max(n_seq_max, 1)), dtype=np.int32)
        if self.seq_pos.keys() == {0} and not self.has_cpl:  # every entry in sequence 0 only
            return np.ones(n, dtype=np.int32), seq_id
        n_seq_id = np.fromiter((len(s) for s in self.seq_ids), dtype=np.int32, count=n)
        if n and int(n_seq_id.max()) == 1:
            seq_id[:, 0] = [s[0] for s in self.seq_ids]
        else:
            for i, s in enumerate(self.seq_ids):
                seq_id[i, : len(s)] = s
        return n_seq_id, seq_id


def _field(batch: Batch, name: str, n: int, dtype, ndim: int) -> Optional[np.ndarray]:
    """The first ``n`` entries of a batch field as a numpy array of ``dtype``, checking
    that it is long enough (a C caller would read past the end; we say so instead)."""
    arr = getattr(batch, name)
    if arr is None:
        return None
    try:
        arr = np.asarray(arr)
    except ValueError as e:  # ragged nested lists
        raise InvalidBatchError(f"batch.{name} is not a rectangular array: {e}") from None
    if arr.ndim != ndim:
        raise InvalidBatchError(f"batch.{name} must be {ndim}-D, got shape {arr.shape}")
    if arr.shape[0] < n:
        raise InvalidBatchError(
            f"batch.n_tokens = {n} but batch.{name} holds only {arr.shape[0]} entries")
    arr = arr[:n]
    if arr.dtype != dtype:
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise InvalidBatchError(f"batch.{name} must hold integers, got dtype {arr.dtype}")
        info = np.iinfo(dtype)
        bad = np.flatnonzero((arr.reshape(arr.shape[0], -1) < info.min).any(axis=1)
                             | (arr.reshape(arr.shape[0], -1) > info.max).any(axis=1)) if arr.size else []
        if len(bad):
            i = int(bad[0])
            raise InvalidBatchError(f"batch.{name}[{i}] = {arr[i].tolist()} does not fit {np.dtype(dtype).name}")
        arr = arr.astype(dtype)
    return arr


_POS_MAX = 2**31 - 1  # llama_pos is int32


def allocate(
    batch: Batch,
    *,
    n_vocab: int,
    n_embd: int,
    n_seq_max: int,
    seq_pos_min: Callable[[int], int],
    seq_pos_max: Callable[[int], int],
    output_all: bool = False,
    warn: Optional[Callable[[str], None]] = None,
    kv_unified: bool = True,
    mrope: bool = False,
) -> AllocatedBatch:
    """Validate ``batch`` against the cache and fill in what it leaves out.

    ``seq_pos_min/max(s)`` report the cache's first/last position of sequence ``s`` (-1 when
    empty). ``output_all`` (embeddings contexts) marks every entry as an output.
    ``kv_unified=False`` (one KV stream per sequence) refuses entries shared by several
    sequences, as llama.cpp does without ``-kvu``. ``mrope`` (M-RoPE models: Qwen3.5)
    takes llama.cpp's rule for them instead of consecutive positions: a sequence's tokens
    must start after its last cached position (X < Y; X <= Y for embeddings), gaps
    allowed. Raises
    :class:`InvalidBatchError` with a message modelled on llama.cpp's, naming the entry.
    """
    n = int(batch.n_tokens)
    if n <= 0:
        raise InvalidBatchError(f"n_tokens == {n}: the batch is empty")
    if n_seq_max > LLAMA_MAX_SEQ:
        raise InvalidBatchError(f"n_seq_max = {n_seq_max} > {LLAMA_MAX_SEQ}")

    if (batch.embd is None and batch.pos is None and batch.seq_id is None and batch.n_seq_id is None
            and batch.logits is None and n_seq_max >= 1):
        fast = _allocate_get_one(batch, n, n_vocab, seq_pos_max, output_all, warn)
        if fast is not None:
            return fast

    token = _field(batch, "token", n, np.int32, 1)
    embd = batch.embd
    if embd is not None:
        try:
            embd = np.asarray(embd)
        except ValueError as e:
            raise InvalidBatchError(f"batch.embd is not a rectangular array: {e}") from None
        if not (np.issubdtype(embd.dtype, np.floating) or np.issubdtype(embd.dtype, np.integer)):
            raise InvalidBatchError(f"batch.embd must hold real numbers, got dtype {embd.dtype}")
        if embd.ndim == 1 and n_embd > 0 and embd.shape[0] >= n * n_embd:
            embd = embd[: n * n_embd].reshape(n, n_embd)  # a flat C-style buffer
        if embd.ndim != 2:
            raise InvalidBatchError(f"batch.embd must be [n_tokens, n_embd], got shape {embd.shape}")
        if embd.shape[0] < n:
            raise InvalidBatchError(f"batch.n_tokens = {n} but batch.embd holds only {embd.shape[0]} rows")
        if embd.shape[1] != n_embd:
            raise InvalidBatchError(
                f"embd row width {embd.shape[1]} does not match the decoder input {n_embd}")
        embd = np.ascontiguousarray(embd[:n], dtype=np.float32)

    # content types: every entry must carry the same kind of input (llama.cpp: the token id
    # LLAMA_TOKEN_NULL means "no token" for that entry)
    has_token_i = token != LLAMA_TOKEN_NULL if token is not None else np.zeros(n, dtype=bool)
    has_token = bool(has_token_i[0])
    if token is not None and not np.all(has_token_i == has_token):
        raise InvalidBatchError("all entries in the batch must have the same content types "
                                f"(entry {int(np.argmax(has_token_i != has_token))} differs from entry 0)")
    has_embd = embd is not None
    if not has_token and not has_embd:
        raise InvalidBatchError("batch has neither token ids nor embeddings")
    if has_token and has_embd:
        raise InvalidBatchError("batch mixes token ids and embeddings: give one or the other")
    if has_token:
        bad = np.flatnonzero((token < 0) | (token >= n_vocab))
        if bad.size:
            i = int(bad[0])
            raise InvalidBatchError(f"invalid token[{i}] = {int(token[i])} (n_vocab = {n_vocab})")
    else:
        token = None

    # sequence ids: llama.cpp keeps a set per entry (duplicates collapse, sorted order)
    n_seq_id = _field(batch, "n_seq_id", n, np.int32, 1)
    seq_id_arr = _field(batch, "seq_id", n, np.int32, 2)
    if (n_seq_id is None) != (seq_id_arr is None):
        raise InvalidBatchError("batch.n_seq_id and batch.seq_id must be given together")
    if seq_id_arr is None:
        seq_ids = [(0,)] * n
        if n_seq_max < 1:
            raise InvalidBatchError(f"invalid seq_id[0][0] = 0 >= {n_seq_max}")
    else:
        width = seq_id_arr.shape[1]
        seq_ids = []
        for i in range(n):
            k = int(n_seq_id[i])
            if k < 1 or k > width:
                raise InvalidBatchError(
                    f"invalid n_seq_id[{i}] = {k}: must be in [1, {width}] (the batch's seq_id width)")
            row = seq_id_arr[i, :k]
            for s in range(k):
                v = int(row[s])
                if v < 0 or v >= n_seq_max:
                    raise InvalidBatchError(f"invalid seq_id[{i}][{s}] = {v} >= {n_seq_max}")
            sids = tuple(sorted(set(row.tolist()))) if k > 1 else (int(row[0]),)
            if len(sids) > 1 and not kv_unified:
                raise InvalidBatchError(
                    f"entry {i} belongs to sequences {list(sids)}: tokens shared by several sequences "
                    "need a unified KV cache (kv_unified=True)")
            seq_ids.append(sids)

    # positions: given, or continuing each entry's first sequence in the cache
    pos = _field(batch, "pos", n, np.int32, 1)
    if pos is None:
        pos = np.empty(n, dtype=np.int32)
        nxt: dict = {}
        for i in range(n):
            s0 = seq_ids[i][0]
            p = nxt.get(s0)
            if p is None:
                p = seq_pos_max(s0) + 1
            if p > _POS_MAX:
                raise InvalidBatchError(
                    f"entry {i}: sequence {s0} would continue at position {p}, past the largest "
                    f"position {_POS_MAX} (positions are int32)")
            pos[i] = p
            nxt[s0] = p + 1
    else:
        pos = np.array(pos, dtype=np.int32)  # our own copy: the caller may reuse the batch
        bad = np.flatnonzero(pos < 0)
        if bad.size:
            i = int(bad[0])
            raise InvalidBatchError(f"invalid pos[{i}] = {int(pos[i])}: positions must be >= 0")

    # outputs: given, or only the last entry; embeddings contexts output everything
    lg = _field(batch, "logits", n, np.int8, 1)
    if lg is None:
        output = np.zeros(n, dtype=bool)
        output[-1] = True
    else:
        output = lg != 0
    if output_all and not output.all():
        if warn is not None:
            warn("embeddings required but some input tokens were not marked as outputs -> overriding")
        output = np.ones(n, dtype=bool)

    # per-sequence position sets and coupling
    seq_posset: dict = {}
    cpl: set = set()  # (s1, s0): s1 shares an entry with its first sequence s0
    masks = []
    for i in range(n):
        sids = seq_ids[i]
        m = 0
        p = int(pos[i])
        for s in sids:
            m |= 1 << s
            st = seq_posset.get(s)
            if st is None:
                seq_posset[s] = {p}
            else:
                st.add(p)
        if len(sids) > 1:
            for s in sids[1:]:
                cpl.add((s, sids[0]))
        masks.append(m)
    seq_pos = {s: (min(st), max(st)) for s, st in seq_posset.items()}

    for s in sorted(seq_posset):
        p0 = seq_pos_max(s)
        pmin, pmax = seq_pos[s]
        if mrope:
            if p0 >= 0 and (p0 >= pmin if token is not None else p0 > pmin):
                raise InvalidBatchError(
                    f"the tokens of sequence {s} in the input batch have inconsistent sequence positions:\n"
                    f" - the last position stored in the memory module of the context (i.e. the KV cache) "
                    f"for sequence {s} is X = {p0}\n"
                    f" - the tokens for sequence {s} in the input batch have a starting position of Y = {pmin}\n"
                    f" for M-RoPE, it is required that the position satisfies: X {'<' if token is not None else '<='} Y")
            continue
        if p0 >= 0 and pmin != p0 + 1:
            raise InvalidBatchError(
                f"the tokens of sequence {s} in the input batch have inconsistent sequence positions:\n"
                f" - the last position stored in the memory module of the context (i.e. the KV cache) "
                f"for sequence {s} is X = {p0}\n"
                f" - the tokens for sequence {s} in the input batch have a starting position of Y = {pmin}\n"
                f" it is required that the sequence positions remain consecutive: Y = X + 1")
        if pmax - pmin + 1 > len(seq_posset[s]):
            raise InvalidBatchError(f"sequence {s} positions are not continuous "
                                    f"(positions {pmin}..{pmax} with gaps)")

    for s1, s0 in sorted(cpl):
        if seq_pos_min(s0) != seq_pos_min(s1) or seq_pos_max(s0) != seq_pos_max(s1):
            raise InvalidBatchError(
                f"sequence {s1} is coupled to {s0} in the input batch, but they have diverged "
                f"in the cache (positions [{seq_pos_min(s1)}, {seq_pos_max(s1)}] vs "
                f"[{seq_pos_min(s0)}, {seq_pos_max(s0)}])")

    # no partial sequence sub-sets, no decreasing positions within a sequence
    all_bits = (1 << n_seq_max) - 1
    cur_set: dict = {}
    cur_pos: dict = {}
    for i in range(n):
        p = int(pos[i])
        for s in seq_ids[i]:
            cs = cur_set.get(s, all_bits) & masks[i]
            if cs == 0:
                raise InvalidBatchError(f"sequence {s} belongs to incompatible sequence sets (not allowed): "
                                        f"entry {i} has seq ids {list(seq_ids[i])}")
            cur_set[s] = cs
            if p < cur_pos.get(s, -1):
                raise InvalidBatchError(f"sequence {s} positions are decreasing (not allowed): "
                                        f"pos[{i}] = {p} after {cur_pos[s]}")
            cur_pos[s] = p

    return AllocatedBatch(
        n_tokens=n,
        token=np.ascontiguousarray(token) if token is not None else None,
        embd=embd,
        pos=pos,
        seq_ids=seq_ids,
        seq_mask=masks,
        output=output,
        n_outputs=int(output.sum()),
        seq_pos=seq_pos,
        has_cpl=bool(cpl),
    )


def _allocate_get_one(batch: Batch, n: int, n_vocab: int, seq_pos_max, output_all: bool,
                      warn) -> Optional[AllocatedBatch]:
    """The per-token generation case (``llama_batch_get_one``: token ids only, everything
    else filled in) without the general machinery: its positions continue sequence 0 by
    construction, so only the token ids need checking. None: take the general path (which
    also produces the error message)."""
    token = batch.token
    if not isinstance(token, np.ndarray) or token.dtype != np.int32 or token.ndim != 1 or token.shape[0] < n:
        return None
    token = token[:n]
    if n == 1:
        t = int(token[0])
        if t < 0 or t >= n_vocab:
            return None
    elif int(token.min()) < 0 or int(token.max()) >= n_vocab:
        return None
    p0 = seq_pos_max(0) + 1
    if p0 + n - 1 > _POS_MAX:
        return None
    output = np.zeros(n, dtype=bool)
    output[-1] = True
    if output_all:
        if n > 1 and warn is not None:
            warn("embeddings required but some input tokens were not marked as outputs -> overriding")
        output[:] = True
    return AllocatedBatch(
        n_tokens=n,
        token=np.ascontiguousarray(token),
        embd=None,
        pos=np.arange(p0, p0 + n, dtype=np.int32),
        seq_ids=[(0,)] * n,
        seq_mask=[1] * n,
        output=output,
        n_outputs=n if output_all else 1,
        seq_pos={0: (p0, p0 + n - 1)},
        has_cpl=False,
    )


def split_simple(n_tokens: int, n_ubatch: int) -> list[np.ndarray]:
    """llama.cpp's ``split_simple``: consecutive runs of at most ``n_ubatch`` entries, in
    batch order. Used for a unified cache, whatever the sequences."""
    if n_ubatch < 1:
        raise ValueError(f"n_ubatch = {n_ubatch} must be >= 1")
    idx = np.arange(n_tokens, dtype=np.int32)
    return [idx[i : i + n_ubatch] for i in range(0, n_tokens, n_ubatch)]


def split_seq(ab: AllocatedBatch, n_ubatch: int) -> list[np.ndarray]:
    """llama.cpp's ``split_seq`` (recurrent and hybrid memories when every token is an
    output): each micro-batch follows one sequence set from its first unused entry, taking
    the later entries whose sequence set is a subset of the last one taken, up to
    ``n_ubatch`` entries."""
    if n_ubatch < 1:
        raise ValueError(f"n_ubatch = {n_ubatch} must be >= 1")
    n = ab.n_tokens
    used = np.zeros(n, dtype=bool)
    out: list[np.ndarray] = []
    start = 0
    while True:
        while start < n and used[start]:
            start += 1
        if start >= n:
            return out
        cur = start
        cur_set = ab.seq_mask[cur]
        idxs = []
        while True:
            idxs.append(cur)
            used[cur] = True
            if len(idxs) >= n_ubatch:
                break
            cur += 1
            while cur < n and (used[cur] or (cur_set & ab.seq_mask[cur]) != ab.seq_mask[cur]):
                cur += 1
            if cur == n:
                break
            cur_set = ab.seq_mask[cur]
        out.append(np.array(idxs, dtype=np.int32))


def split_equal(ab: AllocatedBatch, n_ubatch: int, sequential: bool = False,
                n_keep_tail: int = 0) -> list[np.ndarray]:
    """llama.cpp's ``split_equal``: each micro-batch takes the same number of entries from
    each of several non-overlapping sequence sets (entries of a set in batch order), so
    that per-sequence streams stay aligned. One difference: llama.cpp may admit
    ``n_ubatch + 1`` sets into a micro-batch; here a micro-batch never exceeds ``n_ubatch``.
    ``sequential`` additionally requires consecutive first sequence ids (and no coupling).
    ``n_keep_tail`` > 0 (recurrent rollback snapshots: n_rs_seq + 1) keeps the last
    ``n_keep_tail`` entries of every set in one micro-batch: a micro-batch keeps the longest
    prefix of its sets that either end in it or leave at least that many entries; when the
    first set does neither, it alone is extended to its end (if that fits in ``n_ubatch``)
    or cut back until ``n_keep_tail`` entries remain.
    """
    if n_ubatch < 1:
        raise ValueError(f"n_ubatch = {n_ubatch} must be >= 1")
    if n_keep_tail > 0 and n_ubatch <= n_keep_tail:
        raise ValueError(f"n_ubatch = {n_ubatch} must be larger than n_keep_tail = {n_keep_tail}")
    if sequential and ab.has_cpl:
        raise InvalidBatchError("sequential split is not supported when there are coupled sequences "
                                "in the input batch")
    n = ab.n_tokens
    by_set: dict = {}
    for i, m in enumerate(ab.seq_mask):
        by_set.setdefault(m, []).append(i)
    used = np.zeros(n, dtype=bool)
    n_used = 0
    cur_idx = {m: 0 for m in by_set}
    out: list[np.ndarray] = []
    while n_used < n:
        sets: list = []
        last_seq = -1
        for i in range(n):
            if used[i]:
                continue
            m = ab.seq_mask[i]
            if any(m & c for c in sets):
                continue
            if sequential and sets and ab.seq_ids[i][0] != last_seq + 1:
                continue
            sets.append(m)
            last_seq = ab.seq_ids[i][0]
            if len(sets) >= n_ubatch:
                break
        per_set: list = [[] for _ in sets]
        while True:
            if any(cur_idx[m] >= len(by_set[m]) for m in sets):
                break
            for k, m in enumerate(sets):
                j = by_set[m][cur_idx[m]]
                per_set[k].append(j)
                used[j] = True
                n_used += 1
                cur_idx[m] += 1
            if (len(per_set[0]) + 1) * len(sets) > n_ubatch:
                break
        if n_keep_tail > 0:
            left = [len(by_set[m]) - cur_idx[m] for m in sets]
            n_keep = 0
            while n_keep < len(sets) and not (0 < left[n_keep] < n_keep_tail):
                n_keep += 1
            if n_keep == 0:
                m, lst = sets[0], per_set[0]
                if len(lst) + left[0] <= n_ubatch:  # the first set to its end
                    for j in by_set[m][cur_idx[m]:]:
                        lst.append(j)
                        used[j] = True
                    n_used += left[0]
                    cur_idx[m] = len(by_set[m])
                else:  # or back until n_keep_tail entries remain
                    while len(by_set[m]) - cur_idx[m] < n_keep_tail:
                        used[lst.pop()] = False
                        n_used -= 1
                        cur_idx[m] -= 1
                n_keep = 1
            for m, lst in zip(sets[n_keep:], per_set[n_keep:]):  # the others wait
                for j in lst:
                    used[j] = False
                n_used -= len(lst)
                cur_idx[m] -= len(lst)
            per_set = per_set[:n_keep]
        out.append(np.array([j for lst in per_set for j in lst], dtype=np.int32))
    return out
