"""SentencePiece-style BPE (llama.cpp's llm_tokenizer_spm_session, pipeline step 9).

Works on the fragment's UTF-8 bytes, spaces already escaped to U+2581: start from one symbol
per UTF-8 character, repeatedly merge the adjacent pair whose concatenation is a token with
the highest score (leftmost on ties), and emit each final symbol as its token or, when it is
not one, as byte tokens ``<0xXX>`` (byte fallback).
"""

from __future__ import annotations

import re


def spm_tokenize(text: bytes, store, byte_to_token, out: list[int]) -> None:
    """The merge loop, in Rust (``VocabStore.spm``); a byte without a token raises
    ``byte_to_token``'s error."""
    try:
        out.extend(store.spm(text))
    except LookupError as e:
        byte_to_token(e.args[0])  # raises PyllamaError naming the byte
        raise


_SPACE_RUN = re.compile("(?:\u2581)+".encode())
_CACHE_MAX = 1 << 16


class SpmSession:
    """spm_tokenize with a cache per word.

    No merge can join two symbols across the start of a run of U+2581 unless the merged
    token itself has U+2581 after another character (a "bridge" token; Gemma 3 has one,
    ``>▁</``, LLaMA none). So, cut before every such run that no bridge-token occurrence
    straddles, the pieces tokenize independently and the result is the same as for the
    whole fragment; words repeat, so their ids are cached. Invalid UTF-8 takes the plain
    path, because there llama.cpp's symbols can swallow bytes of the following character.
    """

    def __init__(self, store, byte_to_token):
        self.store = store
        self.byte_to_token = byte_to_token
        self._bridges = store.bridge_tokens()  # tokens with U+2581 after another character
        self._cache: dict[bytes, list[int]] = {}

    def _cuts(self, text: bytes) -> list[int]:
        cuts = [m.start() for m in _SPACE_RUN.finditer(text) if m.start() > 0]
        if cuts and self._bridges:
            blocked = set()
            for b in self._bridges:
                i = text.find(b)
                while i != -1:
                    blocked.update(range(i + 1, i + len(b)))
                    i = text.find(b, i + 1)
            if blocked:
                cuts = [c for c in cuts if c not in blocked]
        return cuts

    def tokenize(self, text: bytes, out: list[int]) -> None:
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            spm_tokenize(text, self.store, self.byte_to_token, out)
            return
        cache = self._cache
        prev = 0
        for c in self._cuts(text) + [len(text)]:
            piece = text[prev:c]
            prev = c
            ids = cache.get(piece)
            if ids is None:
                ids = []
                spm_tokenize(piece, self.store, self.byte_to_token, ids)
                if len(cache) >= _CACHE_MAX:
                    cache.clear()
                cache[piece] = ids
            out.extend(ids)
