"""Streaming detokenizer: feed ids one at a time, get text as soon as it is complete UTF-8.

A token can end in the middle of a multi-byte character (byte-fallback and byte-level BPE
tokens often do); the incomplete tail is held back until the next tokens complete it, so the
concatenation of everything returned equals ``vocab.detokenize(all_ids)`` for valid UTF-8,
except that, like piece-by-piece output with llama_token_to_piece, it does not apply the
clean-up of spaces some BPE models ask llama_detokenize for (" ," -> ",").
"""

from __future__ import annotations

import codecs


class StreamingDetokenizer:
    def __init__(self, vocab, special: bool = False):
        self.vocab = vocab
        self.special = special
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")
        self._first = True

    def feed(self, token: int) -> str:
        """Text newly completed by ``token`` (may be "")."""
        v = self.vocab
        lstrip = 1 if (self._first and v.add_space_prefix) else 0
        self._first = False
        return self._dec.decode(v.token_to_piece(token, self.special, lstrip))

    def flush(self) -> str:
        """Whatever is still held back (an incomplete sequence becomes U+FFFD)."""
        return self._dec.decode(b"", final=True)

    def reset(self) -> None:
        self._dec.reset()
        self._first = True
