"""Vocabularies and tokenizers, token for token as llama.cpp (pipeline steps 5, 9 and 16).

``Vocab.from_file(path)`` / ``Vocab.from_metadata(md)`` build one from GGUF metadata;
``tokenize``, ``token_to_piece``, ``detokenize`` (str) / ``detokenize_bytes`` and
``streaming_decoder`` use it. Tokenizer models: ``llama`` (SPM, spm.py), ``gpt2`` and
``gemma4`` (BPE, bpe.py + pretokenize.py), ``bert`` (WPM, wpm.py), ``t5`` (UGM, ugm.py),
``rwkv`` (rwkv.py); ``plamo2`` and the rest raise UnsupportedModelError.
"""

from ._vocab import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_LSTRIP,
    ATTR_NORMAL,
    ATTR_NORMALIZED,
    ATTR_RSTRIP,
    ATTR_SINGLE_WORD,
    ATTR_UNDEFINED,
    ATTR_UNKNOWN,
    ATTR_UNUSED,
    ATTR_USER_DEFINED,
    LLAMA_TOKEN_NULL,
    VOCAB_TYPE_BPE,
    VOCAB_TYPE_NONE,
    VOCAB_TYPE_RWKV,
    VOCAB_TYPE_SPM,
    VOCAB_TYPE_UGM,
    VOCAB_TYPE_WPM,
    Vocab,
)
from .detok import StreamingDetokenizer

__all__ = [
    "ATTR_BYTE", "ATTR_CONTROL", "ATTR_LSTRIP", "ATTR_NORMAL", "ATTR_NORMALIZED", "ATTR_RSTRIP",
    "ATTR_SINGLE_WORD", "ATTR_UNDEFINED", "ATTR_UNKNOWN", "ATTR_UNUSED", "ATTR_USER_DEFINED",
    "LLAMA_TOKEN_NULL", "VOCAB_TYPE_BPE", "VOCAB_TYPE_NONE", "VOCAB_TYPE_RWKV", "VOCAB_TYPE_SPM",
    "VOCAB_TYPE_UGM", "VOCAB_TYPE_WPM", "StreamingDetokenizer", "Vocab",
]
