"""llama.h's ``llama_state_*`` functions (and the deprecated session-file spellings):
save and restore a context's KV cache and last outputs, whole or one sequence, in memory
or in a file. Buffers are numpy uint8 arrays, bytearray, bytes (inputs) or ctypes arrays
as llama-cpp-python passes them; the format is pyllama's own (rust/core/src/state.rs),
versioned, fingerprinted and checksummed.

Return conventions as llama.h: sizes in bytes, 0 / False on failure with the reason
logged through the ``pyllama`` logger; a refused state leaves the context unchanged.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Any, Optional

import numpy as np

from . import _api_check as _chk
from ._api_check import checked, describe, int32, integer
from ._api_context import _CTX
from .context import Context
from .errors import StateError

log = logging.getLogger("pyllama")

LLAMA_STATE_SEQ_FLAGS_NONE = 0
LLAMA_STATE_SEQ_FLAGS_SWA_ONLY = 1
LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY = 1
LLAMA_STATE_SEQ_FLAGS_ON_DEVICE = 2


def _flags(v: Any, fn: str, name: str) -> int:
    """llama_state_seq_flags (uint32). pyllama's sliding-window layers share the cells of
    the full cache, so a partial (SWA-only) state is the whole sequence, which restores the
    same thing; ON_DEVICE has no device buffers to keep here. Both are accepted."""
    f = integer(v, fn, name)
    if not 0 <= f < 2**32:
        raise ValueError(f"{fn}: {name} = {f} does not fit uint32")
    return f


def _path(v: Any, fn: str, name: str) -> str:
    if isinstance(v, (bytes, bytearray)):
        return os.fsdecode(bytes(v))
    if isinstance(v, (str, os.PathLike)):
        return os.fspath(v)
    raise TypeError(f"{fn}: {name} must be a path (bytes or str), got {describe(v)}")


def _size_out(out: Any, fn: str, name: str):
    """A ``size_t *`` output: ctypes.c_size_t (or byref / pointer of one), a numpy integer
    array or a list of at least one element; returns a setter. None: nothing is stored."""
    if out is None:
        return lambda value: None
    target = getattr(out, "_obj", out)  # ctypes.byref(x) -> x
    if isinstance(target, ctypes._Pointer):
        target = target.contents
    if isinstance(target, ctypes._SimpleCData) and isinstance(target.value, int):
        return lambda value: setattr(target, "value", value)
    if isinstance(target, np.ndarray) and target.size >= 1 and np.issubdtype(target.dtype, np.integer) \
            and target.flags.writeable:
        return lambda value: target.flat.__setitem__(0, value)
    if isinstance(target, list) and target:
        return lambda value: target.__setitem__(0, value)
    raise TypeError(f"{fn}: {name} must be a size_t pointer (ctypes.c_size_t, byref or pointer of one), "
                    f"got {describe(out)}")


def _tokens_in(tokens: Any, n: int, fn: str) -> np.ndarray:
    return _chk.int_seq(tokens, fn, "tokens", n, "n_token_count").astype(np.int32)


def _fail(fn: str, e: Exception) -> None:
    log.error("%s: %s", fn, e)


# ---------------------------------------------------------------------- whole context

@checked(ctx=_CTX)
def llama_state_get_size(ctx: Context) -> int:
    """Bytes llama_state_get_data writes now (logits, embeddings and the KV cache)."""
    return ctx.state_size()


def _get_data(ctx: Context, dst, size, seq_id: Optional[int], flags: int, fn: str) -> int:
    size = _chk.size(size, fn, "size")
    view = _chk.bytes_out(dst, fn, "dst", size, "size")
    if view is None:
        return 0
    arr = np.frombuffer(view, dtype=np.uint8, count=size)
    try:
        return ctx.save_state_into(arr, seq_id=seq_id, flags=flags, caller=fn)
    except StateError as e:
        _fail(fn, e)
        return 0


@checked(ctx=_CTX)
def llama_state_get_data(ctx: Context, dst, size: int) -> int:
    """Copy the state into ``dst`` (at least ``size`` bytes); returns the bytes written,
    0 when ``size`` is too small."""
    return _get_data(ctx, dst, size, None, 0, "llama_state_get_data")


def _set_data(ctx: Context, src, size, dest: Optional[int], fn: str) -> int:
    size = _chk.size(size, fn, "size")
    data = _chk.bytes_in(src, fn, "src", size, "size")
    try:
        return ctx.restore_state(data, dest_seq_id=dest, caller=fn)[0]
    except StateError as e:
        _fail(fn, e)
        return 0


@checked(ctx=_CTX)
def llama_state_set_data(ctx: Context, src, size: int) -> int:
    """Restore a state from ``src``; returns the bytes read, 0 (context unchanged, reason
    logged) when it does not fit this context or is truncated or corrupted."""
    return _set_data(ctx, src, size, None, "llama_state_set_data")


def _load_file(ctx: Context, path_session, tokens_out, n_token_capacity, n_token_count_out,
               dest: Optional[int], fn: str) -> int:
    path = _path(path_session, fn, "path_session" if dest is None else "filepath")
    cap = _chk.size(n_token_capacity, fn, "n_token_capacity")
    out = _chk.int32_out(tokens_out, fn, "tokens_out", cap, "n_token_capacity") if tokens_out is not None else None
    set_count = _size_out(n_token_count_out, fn, "n_token_count_out")
    try:
        with open(path, "rb") as f:
            data = f.read()
        # without tokens_out (sequence files) only the count is asked for: check, don't load
        apply = out is not None or dest is None
        n_read, tokens = ctx.restore_state(data, dest_seq_id=dest, max_tokens=cap if apply else None,
                                           apply=apply, whole=True, caller=fn)
    except (OSError, StateError) as e:
        _fail(fn, e)
        return 0
    n = int(tokens.shape[0])
    if out is not None:
        out[:n] = tokens
    set_count(n)
    return n_read if apply else 0


def _save_file(ctx: Context, path, tokens, n_token_count, seq_id: Optional[int], fn: str) -> int:
    path = _path(path, fn, "path_session" if seq_id is None else "filepath")
    n = _chk.size(n_token_count, fn, "n_token_count")
    toks = _tokens_in(tokens, n, fn)
    if toks.size and (int(toks.min()) < 0 or int(toks.max()) >= ctx.n_vocab):
        raise ValueError(f"{fn}: tokens hold ids outside [0, n_vocab = {ctx.n_vocab})")
    try:
        data = ctx.save_state(tokens=toks) if seq_id is None else ctx.seq_save_state(seq_id, tokens=toks)
        with open(path, "wb") as f:
            f.write(data)
    except (OSError, StateError) as e:
        _fail(fn, e)
        return 0
    return len(data)


@checked(ctx=_CTX)
def llama_state_load_file(ctx: Context, path_session, tokens_out, n_token_capacity: int,
                          n_token_count_out) -> bool:
    """Restore a session file from llama_state_save_file: its tokens go to ``tokens_out``
    (False when there are more than ``n_token_capacity``) and their count through
    ``n_token_count_out``. False, context unchanged, on any failure."""
    return _load_file(ctx, path_session, tokens_out, n_token_capacity, n_token_count_out, None,
                      "llama_state_load_file") > 0


@checked(ctx=_CTX)
def llama_state_save_file(ctx: Context, path_session, tokens, n_token_count: int) -> bool:
    """Write the state and the first ``n_token_count`` of ``tokens`` to a session file."""
    return _save_file(ctx, path_session, tokens, n_token_count, None, "llama_state_save_file") > 0


@checked(ctx=_CTX)
def llama_load_session_file(ctx: Context, path_session, tokens_out, n_token_capacity: int,
                            n_token_count_out) -> bool:
    """Deprecated spelling of llama_state_load_file."""
    return _load_file(ctx, path_session, tokens_out, n_token_capacity, n_token_count_out, None,
                      "llama_load_session_file") > 0


@checked(ctx=_CTX)
def llama_save_session_file(ctx: Context, path_session, tokens, n_token_count: int) -> bool:
    """Deprecated spelling of llama_state_save_file."""
    return _save_file(ctx, path_session, tokens, n_token_count, None, "llama_save_session_file") > 0


@checked(ctx=_CTX)
def llama_get_state_size(ctx: Context) -> int:
    """Deprecated spelling of llama_state_get_size."""
    return ctx.state_size()


# ---------------------------------------------------------------------- one sequence

def _seq(ctx: Context, seq_id, fn: str, name: str) -> Optional[int]:
    s = int32(seq_id, fn, name)
    if s < 0 or s >= ctx.n_seq_max:
        log.error("%s: %s = %d is outside [0, n_seq_max = %d)", fn, name, s, ctx.n_seq_max)
        return None
    return s


@checked(ctx=_CTX, flags=_flags)
def llama_state_seq_get_size_ext(ctx: Context, seq_id: int, flags: int) -> int:
    """Bytes llama_state_seq_get_data_ext writes for ``seq_id`` (0 for a bad seq_id)."""
    s = _seq(ctx, seq_id, "llama_state_seq_get_size_ext", "seq_id")
    return 0 if s is None else ctx.state_size(s, flags=flags)


@checked(ctx=_CTX)
def llama_state_seq_get_size(ctx: Context, seq_id: int) -> int:
    """Bytes llama_state_seq_get_data writes for ``seq_id``."""
    s = _seq(ctx, seq_id, "llama_state_seq_get_size", "seq_id")
    return 0 if s is None else ctx.state_size(s)


@checked(ctx=_CTX, flags=_flags)
def llama_state_seq_get_data_ext(ctx: Context, dst, size: int, seq_id: int, flags: int) -> int:
    """Copy the state of ``seq_id`` into ``dst``; returns the bytes written (0: too small)."""
    fn = "llama_state_seq_get_data_ext"
    s = _seq(ctx, seq_id, fn, "seq_id")
    return 0 if s is None else _get_data(ctx, dst, size, s, flags, fn)


@checked(ctx=_CTX)
def llama_state_seq_get_data(ctx: Context, dst, size: int, seq_id: int) -> int:
    """Copy the state of ``seq_id`` into ``dst``; returns the bytes written (0: too small)."""
    fn = "llama_state_seq_get_data"
    s = _seq(ctx, seq_id, fn, "seq_id")
    return 0 if s is None else _get_data(ctx, dst, size, s, 0, fn)


@checked(ctx=_CTX, flags=_flags)
def llama_state_seq_set_data_ext(ctx: Context, src, size: int, dest_seq_id: int, flags: int) -> int:
    """Put a sequence state into ``dest_seq_id`` (its cells replaced); returns the bytes
    read, 0 (nothing changed, reason logged) when it does not fit."""
    fn = "llama_state_seq_set_data_ext"
    s = _seq(ctx, dest_seq_id, fn, "dest_seq_id")
    return 0 if s is None else _set_data(ctx, src, size, s, fn)


@checked(ctx=_CTX)
def llama_state_seq_set_data(ctx: Context, src, size: int, dest_seq_id: int) -> int:
    """Put a sequence state into ``dest_seq_id``; returns the bytes read, 0 on failure."""
    fn = "llama_state_seq_set_data"
    s = _seq(ctx, dest_seq_id, fn, "dest_seq_id")
    return 0 if s is None else _set_data(ctx, src, size, s, fn)


@checked(ctx=_CTX)
def llama_state_seq_save_file(ctx: Context, filepath, seq_id: int, tokens, n_token_count: int) -> int:
    """Write the state of ``seq_id`` and ``tokens`` to a file; returns the bytes written."""
    fn = "llama_state_seq_save_file"
    s = _seq(ctx, seq_id, fn, "seq_id")
    return 0 if s is None else _save_file(ctx, filepath, tokens, n_token_count, s, fn)


@checked(ctx=_CTX)
def llama_state_seq_load_file(ctx: Context, filepath, dest_seq_id: int, tokens_out, n_token_capacity: int,
                              n_token_count_out) -> int:
    """Load a sequence state file into ``dest_seq_id``; returns the bytes read (0 on
    failure). With ``tokens_out`` None only the token count is reported and nothing is
    loaded."""
    fn = "llama_state_seq_load_file"
    s = _seq(ctx, dest_seq_id, fn, "dest_seq_id")
    if s is None:
        return 0
    return _load_file(ctx, filepath, tokens_out, n_token_capacity, n_token_count_out, s, fn)


@checked(ctx=_CTX)
def llama_copy_state_data(ctx: Context, dst) -> int:
    """Deprecated: llama_state_get_data with ``dst`` assumed large enough."""
    fn = "llama_copy_state_data"
    return _get_data(ctx, dst, ctx.state_size(), None, 0, fn)


@checked(ctx=_CTX)
def llama_set_state_data(ctx: Context, src) -> int:
    """Deprecated: llama_state_set_data reading as much as the state says."""
    fn = "llama_set_state_data"
    try:
        n = memoryview(src).nbytes
    except TypeError:
        n = 0  # bytes_in names the wrong type
    return _set_data(ctx, src, n, None, fn)


__all__ = [n for n in dir() if n.startswith(("llama_", "LLAMA_STATE_"))]
