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


def llama_model_get_vocab(model: Any) -> Vocab:
    """The model's vocabulary: its ``vocab`` attribute when it has one, else built once from
    its metadata and kept for the model's lifetime (a Vocab passes through unchanged)."""
    if isinstance(model, Vocab):
        return model
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


def llama_vocab_type(vocab: Vocab) -> int:
    return vocab.type


def llama_vocab_n_tokens(vocab: Vocab) -> int:
    return vocab.n_tokens


def llama_n_vocab(vocab: Vocab) -> int:
    return vocab.n_tokens


def llama_vocab_get_text(vocab: Vocab, token: int) -> bytes:
    """The token's text as stored in the file (bytes, like llama.h's const char *)."""
    return vocab.texts_bytes[vocab.check_id(token)]


def llama_vocab_get_score(vocab: Vocab, token: int) -> float:
    return vocab.score(token)


def llama_vocab_get_attr(vocab: Vocab, token: int) -> int:
    return vocab.attr(token)


def llama_vocab_is_eog(vocab: Vocab, token: int) -> bool:
    return vocab.is_eog(token)


def llama_vocab_is_control(vocab: Vocab, token: int) -> bool:
    return vocab.is_control(token)


def llama_vocab_bos(vocab: Vocab) -> int:
    return vocab.bos


def llama_vocab_eos(vocab: Vocab) -> int:
    return vocab.eos


def llama_vocab_eot(vocab: Vocab) -> int:
    return vocab.eot


def llama_vocab_sep(vocab: Vocab) -> int:
    return vocab.sep


def llama_vocab_nl(vocab: Vocab) -> int:
    return vocab.nl


def llama_vocab_pad(vocab: Vocab) -> int:
    return vocab.pad


def llama_vocab_mask(vocab: Vocab) -> int:
    return vocab.mask


def llama_vocab_cls(vocab: Vocab) -> int:
    return vocab.bos  # llama.cpp: deprecated alias of BOS


def llama_vocab_fim_pre(vocab: Vocab) -> int:
    return vocab.fim_pre


def llama_vocab_fim_suf(vocab: Vocab) -> int:
    return vocab.fim_suf


def llama_vocab_fim_mid(vocab: Vocab) -> int:
    return vocab.fim_mid


def llama_vocab_fim_pad(vocab: Vocab) -> int:
    return vocab.fim_pad


def llama_vocab_fim_rep(vocab: Vocab) -> int:
    return vocab.fim_rep


def llama_vocab_fim_sep(vocab: Vocab) -> int:
    return vocab.fim_sep


def llama_vocab_get_add_bos(vocab: Vocab) -> bool:
    return vocab.add_bos


def llama_vocab_get_add_eos(vocab: Vocab) -> bool:
    return vocab.add_eos


def llama_vocab_get_add_sep(vocab: Vocab) -> bool:
    return vocab.add_sep


# deprecated llama.h names, kept because llama-cpp-python code still calls them
llama_token_get_text = llama_vocab_get_text
llama_token_get_score = llama_vocab_get_score
llama_token_get_attr = llama_vocab_get_attr
llama_token_is_eog = llama_vocab_is_eog
llama_token_is_control = llama_vocab_is_control
llama_token_bos = llama_vocab_bos
llama_token_eos = llama_vocab_eos
llama_token_eot = llama_vocab_eot
llama_token_cls = llama_vocab_cls
llama_token_sep = llama_vocab_sep
llama_token_nl = llama_vocab_nl
llama_token_pad = llama_vocab_pad
llama_add_bos_token = llama_vocab_get_add_bos
llama_add_eos_token = llama_vocab_get_add_eos
llama_token_fim_pre = llama_vocab_fim_pre
llama_token_fim_suf = llama_vocab_fim_suf
llama_token_fim_mid = llama_vocab_fim_mid
llama_token_fim_pad = llama_vocab_fim_pad
llama_token_fim_rep = llama_vocab_fim_rep
llama_token_fim_sep = llama_vocab_fim_sep


def _as_bytes(text: Any, text_len: int, what: str) -> bytes:
    if isinstance(text, str):
        text = text.encode("utf-8", "surrogatepass")
    b = bytes(memoryview(text).cast("B")) if not isinstance(text, bytes) else text
    if text_len < 0 or text_len > len(b):
        raise ValueError(f"{what}: text_len {text_len} out of range 0..{len(b)}")
    return b[:text_len]


def _writable(buf: Any, what: str) -> memoryview:
    mv = memoryview(buf)
    if mv.readonly:
        raise ValueError(f"{what}: the output buffer is read-only")
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def llama_tokenize(vocab: Vocab, text: bytes, text_len: int, tokens: Any, n_tokens_max: int, add_special: bool,
                   parse_special: bool) -> int:
    """Tokenize ``text[:text_len]`` into ``tokens`` (int32 array). Returns the count, or
    minus the needed count when ``n_tokens_max`` is too small (``tokens`` untouched)."""
    ids = vocab.tokenize(_as_bytes(text, text_len, "llama_tokenize"), bool(add_special), bool(parse_special))
    n = len(ids)
    if n_tokens_max < n:
        return -n
    if n:
        try:
            tokens[:n] = ids
        except TypeError:
            for i, t in enumerate(ids):
                tokens[i] = t
    return n


def llama_token_to_piece(vocab: Vocab, token: int, buf: Any, length: int, lstrip: int, special: bool) -> int:
    """Write the token's piece into ``buf`` (no NUL). Returns its size, or minus the needed
    size when ``length`` is too small; control/unknown tokens are empty unless ``special``."""
    piece = vocab.token_to_piece(token, bool(special), int(lstrip))
    n = len(piece)
    if length < n:
        return -n
    if n:
        mv = _writable(buf, "llama_token_to_piece")
        if len(mv) < n:
            raise ValueError(f"llama_token_to_piece: buffer holds {len(mv)} bytes but length says {length}")
        mv[:n] = piece
    return n


def llama_detokenize(vocab: Vocab, tokens: Any, n_tokens: int, text: Any, text_len_max: int, remove_special: bool,
                     unparse_special: bool) -> int:
    """Write the text of ``tokens[:n_tokens]`` into ``text``. Returns its size, or minus the
    needed size (before llama.cpp's space clean-up) when ``text_len_max`` is too small."""
    if n_tokens < 0:
        raise ValueError(f"llama_detokenize: n_tokens {n_tokens} is negative")
    toks = [int(t) for t in tokens[:n_tokens]]
    raw = vocab.detokenize_bytes(toks, bool(remove_special), bool(unparse_special), clean_spaces=False)
    if len(raw) > text_len_max:
        return -len(raw)
    out = vocab.detokenize_bytes(toks, bool(remove_special), bool(unparse_special)) if vocab.clean_spaces else raw
    if out:
        mv = _writable(text, "llama_detokenize")
        if len(mv) < len(out):
            raise ValueError(f"llama_detokenize: buffer holds {len(mv)} bytes but text_len_max says {text_len_max}")
        mv[: len(out)] = out
    return len(out)


__all__ = [n for n in dir() if n.startswith(("llama_", "LLAMA_"))]
