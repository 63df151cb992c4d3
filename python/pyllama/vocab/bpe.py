"""Byte-level BPE (GPT-2 style), as llama.cpp's llm_tokenizer_bpe_session (pipeline step 9).

A fragment of raw text is cut into words by the pre-tokenizer; each word's UTF-8 bytes are
mapped to printable stand-in characters (GPT-2's bytes_to_unicode), then adjacent symbols
are merged, lowest merge rank first (leftmost on ties), until no listed pair remains. Each
final symbol is a token; one that is not in the vocabulary falls back to its single-byte
tokens, and bytes without a token are dropped (llama.cpp does the same).

Words repeat a lot in real text, so the ids of each word are cached.
"""

from __future__ import annotations

import heapq

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
    """Tokenizes raw-text fragments with one vocabulary's merges. Reusable and cached."""

    def __init__(self, text_to_id: dict, ranks: dict, pre: PreTokenizer, *, byte_encode: bool,
                 ignore_merges: bool, gemma4_newlines: bool = False):
        self.text_to_id = text_to_id
        self.ranks = ranks
        self.pre = pre
        self.byte_encode = byte_encode
        self.ignore_merges = ignore_merges
        self.gemma4_newlines = gemma4_newlines
        self._cache: dict[str, list[int]] = {}

    def encode_word(self, word: str) -> list[int]:
        """Ids for one (already byte-encoded) word."""
        text_to_id = self.text_to_id
        if self.ignore_merges:
            tid = text_to_id.get(word)
            if tid is not None:
                return [tid]
        if self.gemma4_newlines and word and word.strip("\n") == "":
            # llama.cpp (Gemma 4): a run of newlines that is a token stays whole
            tid = text_to_id.get(word)
            if tid is not None:
                return [tid]
        symbols = list(word)
        if len(symbols) > 48:
            symbols = _merge_heap(symbols, self.ranks)
        elif len(symbols) > 1:
            ranks = self.ranks
            # llama.cpp's queue pops the lowest rank, leftmost first; for short words merging
            # one pair at a time with a rescan gives the same result, with less overhead
            while True:
                best = None
                best_i = -1
                for i in range(len(symbols) - 1):
                    r = ranks.get((symbols[i], symbols[i + 1]))
                    if r is not None and (best is None or r < best):
                        best = r
                        best_i = i
                if best is None:
                    break
                symbols[best_i : best_i + 2] = [symbols[best_i] + symbols[best_i + 1]]
                if len(symbols) == 1:
                    break
        out = []
        for s in symbols:
            tid = text_to_id.get(s)
            if tid is not None:
                out.append(tid)
                continue
            for b in s.encode("utf-8", "surrogatepass"):
                if self.byte_encode:
                    t = text_to_id.get(chr(b)) if b < 0x80 else text_to_id.get(bytes([b]))
                else:
                    t = text_to_id.get("<0x%02X>" % b)
                if t is not None:
                    out.append(t)
        return out

    def tokenize(self, text: str, out: list[int]) -> None:
        cache = self._cache
        byte_encode = self.byte_encode
        for word in self.pre.split(text):
            ids = cache.get(word)
            if ids is None:
                enc = word
                if byte_encode:
                    enc = word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_LATIN1_TO_CHAR)
                ids = self.encode_word(enc)
                if len(cache) >= _CACHE_MAX:
                    cache.clear()
                cache[word] = ids
            out.extend(ids)


def _merge_heap(symbols: list[str], ranks: dict) -> list[str]:
    """llama.cpp's merge loop as it is (priority queue of bigrams, stale entries skipped):
    O(n log n), for long words where rescanning would be quadratic."""
    n = len(symbols)
    text = symbols[:]  # current text of each symbol ("" once merged into its left neighbour)
    prev = list(range(-1, n - 1))
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    heap: list = []
    get = ranks.get

    def add(left: int, right: int) -> None:
        if left == -1 or right == -1:
            return
        r = get((text[left], text[right]))
        if r is not None:
            heapq.heappush(heap, (r, left, right, text[left] + text[right]))

    for i in range(1, n):
        add(i - 1, i)
    while heap:
        _, left, right, merged = heapq.heappop(heap)
        lt, rt = text[left], text[right]
        if not lt or not rt or lt + rt != merged:
            continue
        text[left] = merged
        text[right] = ""
        nx = nxt[right]
        nxt[left] = nx
        if nx >= 0:
            prev[nx] = left
        add(prev[left], left)
        add(left, nx)
    return [t for t in text if t]
