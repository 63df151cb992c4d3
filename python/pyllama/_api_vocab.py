"""llama.h-style vocabulary functions (pipeline steps 8-9 and 16), argument order as
llama-cpp-python's low-level module. ``vocab`` is a :class:`pyllama.vocab.Vocab` (what
``llama_model_get_vocab(model)`` returns). Buffers are numpy arrays (int32 for tokens,
uint8 for text), bytearrays, or anything else with a writable buffer; ``text`` is bytes
(str is accepted and encoded as UTF-8). Token ids outside the vocabulary raise ValueError
naming the valid range, where llama.cpp would read out of bounds.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from . import _api_check as _chk
from . import _core
from ._api_check import checked, describe, int32
from .model import Model
from .vocab import (
    ATTR_BYTE as LLAMA_TOKEN_ATTR_BYTE,
    ATTR_CONTROL as LLAMA_TOKEN_ATTR_CONTROL,
    ATTR_LSTRIP as LLAMA_TOKEN_ATTR_LSTRIP,
    ATTR_NORMAL as LLAMA_TOKEN_ATTR_NORMAL,
    ATTR_NORMALIZED as LLAMA_TOKEN_ATTR_NORMALIZED,
    ATTR_RSTRIP as LLAMA_TOKEN_ATTR_RSTRIP,
    ATTR_SINGLE_WORD as LLAMA_TOKEN_ATTR_SINGLE_WORD,
    ATTR_UNDEFINED as LLAMA_TOKEN_ATTR_UNDEFINED,
    ATTR_UNKNOWN as LLAMA_TOKEN_ATTR_UNKNOWN,
    ATTR_UNUSED as LLAMA_TOKEN_ATTR_UNUSED,
    ATTR_USER_DEFINED as LLAMA_TOKEN_ATTR_USER_DEFINED,
    LLAMA_TOKEN_NULL,
    VOCAB_TYPE_BPE as LLAMA_VOCAB_TYPE_BPE,
    VOCAB_TYPE_NONE as LLAMA_VOCAB_TYPE_NONE,
    VOCAB_TYPE_RWKV as LLAMA_VOCAB_TYPE_RWKV,
    VOCAB_TYPE_SPM as LLAMA_VOCAB_TYPE_SPM,
    VOCAB_TYPE_UGM as LLAMA_VOCAB_TYPE_UGM,
    VOCAB_TYPE_WPM as LLAMA_VOCAB_TYPE_WPM,
    Vocab,
)

# llama_token_type (GGUF tokenizer.ggml.token_type values)
LLAMA_TOKEN_TYPE_UNDEFINED = 0
LLAMA_TOKEN_TYPE_NORMAL = 1
LLAMA_TOKEN_TYPE_UNKNOWN = 2
LLAMA_TOKEN_TYPE_CONTROL = 3
LLAMA_TOKEN_TYPE_USER_DEFINED = 4
LLAMA_TOKEN_TYPE_UNUSED = 5
LLAMA_TOKEN_TYPE_BYTE = 6


_VOCABS: "weakref.WeakKeyDictionary[Any, Vocab]" = weakref.WeakKeyDictionary()

_VOCAB = _chk.instance(Vocab, "a llama_vocab (llama_model_get_vocab)")


def _token_id(vocab: Vocab, token: int, fn: str) -> int:
    """``token`` (already an int32) as an id of ``vocab``; ValueError naming the range."""
    return vocab.check_id(token, f"{fn}: token")


def llama_model_get_vocab(model: Any) -> Vocab:
    """The model's vocabulary: its ``vocab`` attribute when it has one, else built once from
    its metadata and kept for the model's lifetime (a Vocab passes through unchanged)."""
    if isinstance(model, Vocab):
        return model
    if not isinstance(model, (Model, _core.Model)):
        raise TypeError(f"llama_model_get_vocab: model must be a llama_model (llama_model_load_from_file), "
                        f"got {describe(model)}")
    if _chk.is_freed(model):
        raise ValueError("llama_model_get_vocab: model has been freed (llama_model_free)")
    v = getattr(model, "vocab", None)
    if isinstance(v, Vocab):
        return v
    try:
        return _VOCABS[model]
    except (KeyError, TypeError):
        pass
    md = model.metadata
    if callable(md):
        md = md()
    v = Vocab.from_metadata(md, source=str(getattr(model, "path", None) or getattr(model, "paths", ["<model>"])[0]))
    try:
        _VOCABS[model] = v
    except TypeError:  # not weak-referenceable: the caller keeps the Vocab
        pass
    return v


@checked(vocab=_VOCAB)
def llama_vocab_type(vocab: Vocab) -> int:
    return vocab.type


@checked(vocab=_VOCAB)
def llama_vocab_n_tokens(vocab: Vocab) -> int:
    return vocab.n_tokens


@checked(vocab=_VOCAB)
def llama_n_vocab(vocab: Vocab) -> int:
    return vocab.n_tokens


@checked(vocab=_VOCAB, token=int32)
def llama_vocab_get_text(vocab: Vocab, token: int) -> bytes:
    """The token's text as stored in the file (bytes, like llama.h's const char *)."""
    return vocab.texts_bytes[_token_id(vocab, token, "llama_vocab_get_text")]


@checked(vocab=_VOCAB, token=int32)
def llama_vocab_get_score(vocab: Vocab, token: int) -> float:
    return vocab.score(_token_id(vocab, token, "llama_vocab_get_score"))


@checked(vocab=_VOCAB, token=int32)
def llama_vocab_get_attr(vocab: Vocab, token: int) -> int:
    return vocab.attr(_token_id(vocab, token, "llama_vocab_get_attr"))


@checked(vocab=_VOCAB, token=int32)
def llama_vocab_is_eog(vocab: Vocab, token: int) -> bool:
    """False for ids outside the vocabulary, as llama.cpp (an int32 is required)."""
    return vocab.is_eog(token)


@checked(vocab=_VOCAB, token=int32)
def llama_vocab_is_control(vocab: Vocab, token: int) -> bool:
    return vocab.is_control(_token_id(vocab, token, "llama_vocab_is_control"))


@checked(vocab=_VOCAB)
def llama_vocab_bos(vocab: Vocab) -> int:
    return vocab.bos


@checked(vocab=_VOCAB)
def llama_vocab_eos(vocab: Vocab) -> int:
    return vocab.eos


@checked(vocab=_VOCAB)
def llama_vocab_eot(vocab: Vocab) -> int:
    return vocab.eot


@checked(vocab=_VOCAB)
def llama_vocab_sep(vocab: Vocab) -> int:
    return vocab.sep


@checked(vocab=_VOCAB)
def llama_vocab_nl(vocab: Vocab) -> int:
    return vocab.nl


@checked(vocab=_VOCAB)
def llama_vocab_pad(vocab: Vocab) -> int:
    return vocab.pad


@checked(vocab=_VOCAB)
def llama_vocab_mask(vocab: Vocab) -> int:
    return vocab.mask


@checked(vocab=_VOCAB)
def llama_vocab_cls(vocab: Vocab) -> int:
    return vocab.bos  # llama.cpp: deprecated alias of BOS


@checked(vocab=_VOCAB)
def llama_vocab_fim_pre(vocab: Vocab) -> int:
    return vocab.fim_pre


@checked(vocab=_VOCAB)
def llama_vocab_fim_suf(vocab: Vocab) -> int:
    return vocab.fim_suf


@checked(vocab=_VOCAB)
def llama_vocab_fim_mid(vocab: Vocab) -> int:
    return vocab.fim_mid


@checked(vocab=_VOCAB)
def llama_vocab_fim_pad(vocab: Vocab) -> int:
    return vocab.fim_pad


@checked(vocab=_VOCAB)
def llama_vocab_fim_rep(vocab: Vocab) -> int:
    return vocab.fim_rep


@checked(vocab=_VOCAB)
def llama_vocab_fim_sep(vocab: Vocab) -> int:
    return vocab.fim_sep


@checked(vocab=_VOCAB)
def llama_vocab_get_add_bos(vocab: Vocab) -> bool:
    return vocab.add_bos


@checked(vocab=_VOCAB)
def llama_vocab_get_add_eos(vocab: Vocab) -> bool:
    return vocab.add_eos


@checked(vocab=_VOCAB)
def llama_vocab_get_add_sep(vocab: Vocab) -> bool:
    return vocab.add_sep


@checked(vocab=_VOCAB)
def llama_vocab_get_suppress_tokens(vocab: Vocab, n_suppress_tokens: Any = None) -> np.ndarray:
    """int32 array of ``tokenizer.ggml.suppress_tokens`` (ids outside the vocabulary
    dropped, as llama.cpp; empty without the key). llama.h's out-count
    ``n_suppress_tokens`` may be a ctypes.c_int32 (or byref of one) or a one-element
    list, which receives the count; None stores nothing."""
    toks = np.array(vocab.suppress_tokens, dtype=np.int32)
    if n_suppress_tokens is not None:
        from ._api_state import _size_out

        _size_out(n_suppress_tokens, "llama_vocab_get_suppress_tokens", "n_suppress_tokens")(int(toks.shape[0]))
    return toks


# deprecated llama.h names, kept because llama-cpp-python code still calls them
llama_token_get_text = _chk.alias(llama_vocab_get_text, "llama_token_get_text")
llama_token_get_score = _chk.alias(llama_vocab_get_score, "llama_token_get_score")
llama_token_get_attr = _chk.alias(llama_vocab_get_attr, "llama_token_get_attr")
llama_token_is_eog = _chk.alias(llama_vocab_is_eog, "llama_token_is_eog")
llama_token_is_control = _chk.alias(llama_vocab_is_control, "llama_token_is_control")
llama_token_bos = _chk.alias(llama_vocab_bos, "llama_token_bos")
llama_token_eos = _chk.alias(llama_vocab_eos, "llama_token_eos")
llama_token_eot = _chk.alias(llama_vocab_eot, "llama_token_eot")
llama_token_cls = _chk.alias(llama_vocab_cls, "llama_token_cls")
llama_token_sep = _chk.alias(llama_vocab_sep, "llama_token_sep")
llama_token_nl = _chk.alias(llama_vocab_nl, "llama_token_nl")
llama_token_pad = _chk.alias(llama_vocab_pad, "llama_token_pad")
llama_add_bos_token = _chk.alias(llama_vocab_get_add_bos, "llama_add_bos_token")
llama_add_eos_token = _chk.alias(llama_vocab_get_add_eos, "llama_add_eos_token")
llama_token_fim_pre = _chk.alias(llama_vocab_fim_pre, "llama_token_fim_pre")
llama_token_fim_suf = _chk.alias(llama_vocab_fim_suf, "llama_token_fim_suf")
llama_token_fim_mid = _chk.alias(llama_vocab_fim_mid, "llama_token_fim_mid")
llama_token_fim_pad = _chk.alias(llama_vocab_fim_pad, "llama_token_fim_pad")
llama_token_fim_rep = _chk.alias(llama_vocab_fim_rep, "llama_token_fim_rep")
llama_token_fim_sep = _chk.alias(llama_vocab_fim_sep, "llama_token_fim_sep")


def _as_bytes(text: Any, text_len: int, fn: str) -> bytes:
    if isinstance(text, str):
        text = text.encode("utf-8", "surrogatepass")
    elif not isinstance(text, bytes):
        try:
            text = bytes(memoryview(text).cast("B"))
        except TypeError:
            raise TypeError(f"{fn}: text must be bytes (or str), got {describe(text)}") from None
    if text_len < 0 or text_len > len(text):
        raise ValueError(f"{fn}: text_len = {text_len} outside [0, len(text) = {len(text)}]")
    return text[:text_len]


# Output buffers (see _api_check.int32_out / bytes_out): llama-cpp-python passes ctypes
# arrays (``(llama_token * n)()``, ``create_string_buffer(n)``); numpy int32 / uint8 arrays
# and bytearrays work too. A buffer is checked against the length that comes with it
# before anything is done, as a C caller's buffer must hold that many: shorter is a
# ValueError naming both lengths; the wrong element type, read-only or strided a
# TypeError / ValueError naming the buffer. NULL (None) is accepted with length <= 0, the
# size query.


@checked(vocab=_VOCAB, text_len=int32, n_tokens_max=int32)
def llama_tokenize(vocab: Vocab, text: bytes, text_len: int, tokens: Any, n_tokens_max: int, add_special: bool,
                   parse_special: bool) -> int:
    """Tokenize ``text[:text_len]`` into ``tokens`` (int32 buffer of at least
    ``n_tokens_max`` entries). Returns the count, or minus the needed count when
    ``n_tokens_max`` is too small (``tokens`` untouched)."""
    fn = "llama_tokenize"
    out = _chk.int32_out(tokens, fn, "tokens", n_tokens_max, "n_tokens_max")
    ids = vocab.tokenize(_as_bytes(text, text_len, fn), bool(add_special), bool(parse_special))
    n = len(ids)
    if n_tokens_max < n:
        return -n
    if n:
        out[:n] = ids
    return n


@checked(vocab=_VOCAB, token=int32, length=int32, lstrip=int32)
def llama_token_to_piece(vocab: Vocab, token: int, buf: Any, length: int, lstrip: int, special: bool) -> int:
    """Write the token's piece into ``buf`` (no NUL; at least ``length`` bytes). Returns its
    size, or minus the needed size when ``length`` is too small; control/unknown tokens
    are empty unless ``special``."""
    fn = "llama_token_to_piece"
    mv = _chk.bytes_out(buf, fn, "buf", length, "length")
    piece = vocab.token_to_piece(_token_id(vocab, token, fn), bool(special), lstrip)
    n = len(piece)
    if length < n:
        return -n
    if n:
        mv[:n] = piece
    return n


@checked(vocab=_VOCAB, n_tokens=int32, text_len_max=int32)
def llama_detokenize(vocab: Vocab, tokens: Any, n_tokens: int, text: Any, text_len_max: int, remove_special: bool,
                     unparse_special: bool) -> int:
    """Write the text of ``tokens[:n_tokens]`` into ``text`` (at least ``text_len_max``
    bytes). Returns its size, or minus the needed size (before llama.cpp's space clean-up)
    when ``text_len_max`` is too small."""
    fn = "llama_detokenize"
    ids = _chk.int_seq(tokens, fn, "tokens", n_tokens, "n_tokens")
    mv = _chk.bytes_out(text, fn, "text", text_len_max, "text_len_max")
    bad = np.flatnonzero((ids < 0) | (ids >= vocab.n_tokens))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{fn}: tokens[{i}] = {int(ids[i])} out of range: valid ids are 0..{vocab.n_tokens - 1}")
    toks = ids.tolist()
    raw = vocab.detokenize_bytes(toks, bool(remove_special), bool(unparse_special), clean_spaces=False)
    if len(raw) > text_len_max:
        return -len(raw)
    out = vocab.detokenize_bytes(toks, bool(remove_special), bool(unparse_special)) if vocab.clean_spaces else raw
    if out:
        mv[: len(out)] = out
    return len(out)


__all__ = [n for n in dir() if n.startswith(("llama_", "LLAMA_"))]
