"""Byte-level BPE (GPT-2 style), as llama.cpp's llm_tokenizer_bpe_session (pipeline step 9).

A fragment of raw text is cut into words by the pre-tokenizer; each word's UTF-8 bytes are
mapped to printable stand-in characters (GPT-2's bytes_to_unicode), then adjacent symbols
are merged, lowest merge rank first (leftmost on ties), until no listed pair remains. Each
final symbol is a token; one that is not in the vocabulary falls back to its single-byte
tokens, and bytes without a token are dropped (llama.cpp does the same).

Words repeat a lot in real text, so the ids of each word are cached.
"""

from __future__ import annotations

from .pretokenize import PreTokenizer


def _bytes_to_unicode() -> list[str]:
    """byte -> stand-in char (llama.cpp's unicode_byte_to_utf8_map)."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = [""] * 256
    for b in keep:
        table[b] = chr(b)
    n = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_TO_CHAR: list[str] = _bytes_to_unicode()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
# latin-1 char -> stand-in: lets str.translate byte-encode a whole word at once
_LATIN1_TO_CHAR = {b: c for b, c in enumerate(BYTE_TO_CHAR)}

_CACHE_MAX = 1 << 16


class BpeSession:
    """Tokenizes raw-text fragments with one vocabulary's merges. Reusable and cached.

    The merge loop runs in Rust over the vocabulary's tables (``VocabStore.bpe_word``);
    this class pre-tokenizes, byte-encodes and caches the ids of each word.
    """

    def __init__(self, store, pre: PreTokenizer, *, byte_encode: bool, ignore_merges: bool,
                 gemma4_newlines: bool = False):
        self.store = store
        self.pre = pre
        self.byte_encode = byte_encode
        self.ignore_merges = ignore_merges
        self.gemma4_newlines = gemma4_newlines
        self._cache: dict[str, list[int]] = {}

    def encode_word(self, word: str) -> list[int]:
        """Ids for one (already byte-encoded) word."""
        return self.store.bpe_word(word, self.byte_encode, self.ignore_merges, self.gemma4_newlines)

    def tokenize(self, text: str, out: list[int]) -> None:
        cache = self._cache
        byte_encode = self.byte_encode
        bpe_word = self.store.bpe_word
        ignore_merges = self.ignore_merges
        newline_runs = self.gemma4_newlines
        for word in self.pre.split(text):
            ids = cache.get(word)
            if ids is None:
                enc = word
                if byte_encode:
                    enc = word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_LATIN1_TO_CHAR)
                ids = bpe_word(enc, byte_encode, ignore_merges, newline_runs)
                if len(cache) >= _CACHE_MAX:
                    cache.clear()
                cache[word] = ids
            out.extend(ids)
