"""Argument checks for the llama.h-style functions (:mod:`pyllama.llama_api`) and the
idiomatic classes.

llama.h cannot check what C passes it; Python can, so misuse is an exception that says
what and where instead of a crash, an AttributeError from deep inside or a numpy casting
error. The rule everywhere:

- the wrong kind of object (None, 42 or "x" where a context, vocab, buffer or integer is
  expected) is a ``TypeError``;
- the right kind with a value llama.h's types cannot hold (an int32 parameter given 2**31,
  a buffer shorter than the length that comes with it, a read-only output buffer, a freed
  object) is a ``ValueError``;

and the message starts with the function's name and names the parameter:
``llama_decode: ctx must be a llama_context, got None``.

A checker is ``check(value, fn, name) -> value`` (the value converted where that helps,
e.g. a numpy integer to int); :func:`checked` applies checkers to a function's parameters.
Where llama.h defines the outcome of a value (NULL for the size query of llama_tokenize,
a negative count for a short buffer, seq_id < 0 for "every sequence"), the functions keep
it: these checks only reject what llama.h leaves undefined.
"""

from __future__ import annotations

import functools
import inspect
import operator
import weakref
from typing import Any, Callable

import numpy as np

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

Checker = Callable[[Any, str, str], Any]

#: objects released by llama_model_free / llama_sampler_free: using them again is an error
#: (llama.cpp would use freed memory), freeing them again is a no-op.
freed: "weakref.WeakSet[Any]" = weakref.WeakSet()


def describe(v: Any) -> str:
    """How a message names a wrong argument: None, int, numpy.ndarray, pyllama._core.Model."""
    if v is None:
        return "None"
    t = type(v)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def is_freed(obj: Any) -> bool:
    try:
        return obj in freed
    except TypeError:  # not hashable: never registered
        return False


def mark_freed(obj: Any) -> None:
    try:
        freed.add(obj)
    except TypeError:  # not weak-referenceable: nothing to remember
        pass


def instance(cls, what: str, *, none_ok: bool = False) -> Checker:
    """A checker accepting instances of ``cls`` (named ``what`` in the message)."""

    def check(v, fn, name):
        if isinstance(v, cls) or (none_ok and v is None):
            return v
        raise TypeError(f"{fn}: {name} must be {what}, got {describe(v)}")

    return check


def integer(v: Any, fn: str, name: str) -> int:
    """Any integer (int, numpy integer, bool); floats and strings are a TypeError."""
    if type(v) is int:
        return v
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{fn}: {name} must be an integer, got {describe(v)}") from None


def int32(v: Any, fn: str, name: str) -> int:
    """An integer that fits llama.h's int32_t (llama_token, llama_pos, llama_seq_id...)."""
    if type(v) is not int:
        v = integer(v, fn, name)
    if not INT32_MIN <= v <= INT32_MAX:
        raise ValueError(f"{fn}: {name} = {v} does not fit int32 [{INT32_MIN}, {INT32_MAX}]")
    return v


def opt_int32(v: Any, fn: str, name: str):
    return None if v is None else int32(v, fn, name)


def size(v: Any, fn: str, name: str) -> int:
    """A size_t argument: a non-negative integer."""
    v = integer(v, fn, name)
    if v < 0:
        raise ValueError(f"{fn}: {name} = {v} must be >= 0")
    return v


def text(v: Any, fn: str, name: str, *, none_ok: bool = False):
    """A C string argument: bytes (as llama-cpp-python passes) or str."""
    if isinstance(v, (bytes, str)) or (none_ok and v is None):
        return v
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"{fn}: {name} must be bytes or str, got {describe(v)}")


def opt_text(v: Any, fn: str, name: str):
    return text(v, fn, name, none_ok=True)


def callback(v: Any, fn: str, name: str):
    """A callable or None."""
    if v is None or callable(v):
        return v
    raise TypeError(f"{fn}: {name} must be callable or None, got {describe(v)}")


def checked(**checks: Checker):
    """Decorator: run ``checks[name](value, fn, name)`` on the named parameters of each
    call (positional or keyword; defaults are not checked) and pass on what they return.
    ``fn`` is the function's name, so every message names it."""

    def deco(f):
        sig = inspect.signature(f).parameters
        assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in sig.values()), f.__name__
        params = list(sig)
        plan = tuple((params.index(n), n, c) for n, c in checks.items())
        fn = f.__name__

        def general(args, kwargs):
            n = len(args)
            args = list(args)
            for i, name, check in plan:
                if i < n:
                    args[i] = check(args[i], fn, name)
                elif name in kwargs:
                    kwargs[name] = check(kwargs[name], fn, name)
            return f(*args, **kwargs)

        # The per-token functions (llama_decode, llama_vocab_is_eog, llama_token_to_piece...)
        # are called positionally with every argument: a generated wrapper checks those
        # calls without building lists (about 1 us less per call than the general path).
        positional = [f"_c{i}(a{i}, _fn, {params[i]!r})" if any(i == j for j, _, _ in plan) else f"a{i}"
                      for i in range(len(params))]
        env = {"_f": f, "_fn": fn, "_general": general}
        env.update({f"_c{i}": c for i, _, c in plan})
        src = (f"def wrapper(*args, **kwargs):\n"
               f"    if kwargs or len(args) != {len(params)}:\n"
               f"        return _general(args, kwargs)\n"
               + (f"    {', '.join(f'a{i}' for i in range(len(params)))}, = args\n" if params else "")
               + f"    return _f({', '.join(positional)})\n")
        exec(src, env)
        wrapper = functools.wraps(f)(env["wrapper"])
        wrapper.__checks__ = checks
        return wrapper

    return deco


def alias(f, name: str):
    """``f`` (a :func:`checked` function) under another name (llama.h's deprecated
    spellings), its argument checks naming that name."""
    inner = f.__wrapped__
    g = functools.wraps(inner)(lambda *a, **k: inner(*a, **k))
    g.__name__ = g.__qualname__ = name
    return checked(**f.__checks__)(g)


# ---------------------------------------------------------------------- buffers

def _is_int32_format(mv: memoryview) -> bool:
    """A native-order 4-byte signed integer buffer ('i', or 'l' where long is 4 bytes)."""
    return mv.itemsize == 4 and mv.format.lstrip("@=<") in ("i", "l")


def int32_out(buf: Any, fn: str, name: str, n: int, n_name: str):
    """An output buffer of ``n`` llama_token (int32) values: a writable, contiguous 1-D
    int32 numpy array, ctypes ``(llama_token * n)()`` or array.array('i'), holding at
    least ``n`` entries. Returned as a numpy view of it. ``None`` passes when ``n <= 0``
    (llama.h's size query: nothing is written)."""
    if buf is None and n <= 0:
        return None
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.int32:
            raise TypeError(f"{fn}: {name} must be an int32 array, got dtype {buf.dtype}")
        if buf.ndim != 1:
            raise ValueError(f"{fn}: {name} must be 1-D, got shape {buf.shape}")
        if not buf.flags.writeable:
            raise ValueError(f"{fn}: {name} is read-only")
        if not buf.flags.c_contiguous:
            raise ValueError(f"{fn}: {name} must be contiguous (a C int32 buffer), got strides {buf.strides}")
        arr = buf
    else:
        try:
            mv = memoryview(buf)
        except TypeError:
            raise TypeError(f"{fn}: {name} must be a writable int32 buffer (numpy int32 array or ctypes "
                            f"llama_token array), got {describe(buf)}") from None
        if not _is_int32_format(mv):
            raise TypeError(f"{fn}: {name} must hold int32 values, got buffer format {mv.format!r}")
        if mv.readonly:
            raise ValueError(f"{fn}: {name} is read-only")
        if mv.ndim != 1 or not mv.c_contiguous:
            raise ValueError(f"{fn}: {name} must be a contiguous 1-D buffer")
        arr = np.frombuffer(mv, dtype=np.int32)
    if n > arr.shape[0]:
        raise ValueError(f"{fn}: {name} holds {arr.shape[0]} tokens but {n_name} = {n}")
    return arr


def _byte_view(buf: Any, fn: str, name: str, n: int, n_name: str, writable: bool) -> memoryview:
    """``buf``'s bytes as a 'B' memoryview after the checks both byte buffers share: a
    buffer of one-byte items, contiguous, writable when ``writable``, at least ``n`` long."""
    kinds = ("a writable byte buffer (bytearray, numpy uint8 array, ctypes.create_string_buffer)" if writable
             else "a byte buffer (bytes, numpy uint8 array, ctypes uint8 array)")
    if buf is None or isinstance(buf, str):
        raise TypeError(f"{fn}: {name} must be {kinds}, got {describe(buf)}")
    try:
        mv = memoryview(buf)
    except TypeError:
        raise TypeError(f"{fn}: {name} must be {kinds}, got {describe(buf)}") from None
    if mv.itemsize != 1:
        raise TypeError(f"{fn}: {name} must hold bytes, got items of {mv.itemsize} bytes (format {mv.format!r})")
    if writable and mv.readonly:
        raise ValueError(f"{fn}: {name} is read-only")
    if not mv.c_contiguous:
        raise ValueError(f"{fn}: {name} must be a contiguous buffer")
    mv = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
    if n > len(mv):
        raise ValueError(f"{fn}: {name} holds {len(mv)} bytes but {n_name} = {n}")
    return mv


def bytes_out(buf: Any, fn: str, name: str, n: int, n_name: str):
    """An output buffer of ``n`` bytes: bytearray, numpy uint8/int8 array, ctypes char
    array (``create_string_buffer``) or anything else with a writable, contiguous
    one-byte-per-item buffer, holding at least ``n`` bytes. Returned as a 'B' memoryview.
    ``None`` passes when ``n <= 0`` (nothing is written)."""
    if buf is None and n <= 0:
        return None
    return _byte_view(buf, fn, name, n, n_name, writable=True)


def bytes_in(buf: Any, fn: str, name: str, n: int, n_name: str) -> np.ndarray:
    """An input buffer of at least ``n`` bytes (bytes, bytearray, numpy uint8 array, ctypes
    uint8 array): its first ``n`` bytes as a uint8 view (no copy)."""
    return np.frombuffer(_byte_view(buf, fn, name, n, n_name, writable=False), dtype=np.uint8, count=n)


def int_seq(tokens: Any, fn: str, name: str, n: int, n_name: str) -> np.ndarray:
    """An input array of at least ``n`` integers (numpy integer array, ctypes llama_token
    array, list or tuple of ints): its first ``n`` as int64 (for range checks)."""
    if n < 0:
        raise ValueError(f"{fn}: {n_name} = {n} must be >= 0")
    if tokens is None:
        if n == 0:
            return np.zeros(0, np.int64)
        raise TypeError(f"{fn}: {name} must be an array of token ids, got None")
    if isinstance(tokens, (str, bytes, bytearray)):
        raise TypeError(f"{fn}: {name} must be an array of token ids, got {describe(tokens)}")
    if not isinstance(tokens, np.ndarray):
        try:
            mv = memoryview(tokens)
        except TypeError:
            mv = None
        if mv is not None:
            tokens = np.frombuffer(mv, dtype=np.dtype(mv.format)) if mv.ndim == 1 else np.asarray(mv)
    if not isinstance(tokens, (np.ndarray, list, tuple)):
        raise TypeError(f"{fn}: {name} must be an array of token ids, got {describe(tokens)}")
    if n > len(tokens):
        raise ValueError(f"{fn}: {name} holds {len(tokens)} tokens but {n_name} = {n}")
    head = tokens[:n]
    if isinstance(head, np.ndarray):
        if head.ndim != 1:
            raise ValueError(f"{fn}: {name} must be 1-D, got shape {tokens.shape}")
        if head.size and not np.issubdtype(head.dtype, np.integer):
            raise TypeError(f"{fn}: {name} must hold integers, got dtype {head.dtype}")
        return head.astype(np.int64, copy=False)
    out = np.empty(n, np.int64)
    for i, t in enumerate(head):
        out[i] = int32(t, fn, f"{name}[{i}]")
    return out
