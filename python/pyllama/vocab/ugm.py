"""Unigram (T5-style SentencePiece), as llama.cpp's llm_tokenizer_ugm_session (step 9).

Normalize the text (user-defined tokens kept as they are, the precompiled charsmap's
longest-prefix replacements, invalid UTF-8 -> U+FFFD, spaces escaped to U+2581 and
optionally merged / prefixed), then Viterbi: the tokenization with the highest sum of
scores, where a code point no token covers costs (lowest normal score - 10) as UNK and runs
of UNK collapse into one.
"""

from __future__ import annotations

import struct

import numpy as np

ATTR_UNUSED, ATTR_NORMAL, ATTR_USER_DEFINED = 1 << 1, 1 << 2, 1 << 4  # llama_token_attr bits

_SP = "\u2581".encode()


def _utf8_len(b: int) -> int:
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[b >> 4]


def _valid_cpt_len(data: bytes, off: int) -> int:
    """Length of the code point at ``off`` as unicode_cpt_from_utf8 accepts it, or 0."""
    b = data[off]
    n = len(data)
    if b < 0x80:
        return 1
    if not b & 0x40:
        return 0
    if not b & 0x20:
        ln = 2
    elif not b & 0x10:
        ln = 3
    elif not b & 0x08:
        ln = 4
    else:
        return 0
    if off + ln > n:
        return 0
    for k in range(1, ln):
        if data[off + k] & 0xC0 != 0x80:
            return 0
    return ln


class UgmSession:
    def __init__(self, vocab, charsmap: bytes | None):
        self.vocab = vocab
        attrs = vocab.attrs
        scores = vocab.scores
        normal = [i for i, a in enumerate(attrs) if a & ATTR_NORMAL]
        min_score = min((scores[i] for i in normal), default=float(np.finfo(np.float32).max))
        # float arithmetic in llama.cpp: (float) min_score - 10.0f
        self.unknown_score = float(np.float32(min_score) - np.float32(10.0))
        self.matcher: dict[bytes, int] = {}
        self.user_prefixes: set[bytes] = set()
        for i, b in enumerate(vocab.texts_bytes):
            a = attrs[i]
            if a & (ATTR_NORMAL | ATTR_USER_DEFINED | ATTR_UNUSED):
                self.matcher[b] = i
            if a & ATTR_USER_DEFINED:
                for k in range(1, len(b) + 1):
                    self.user_prefixes.add(b[:k])
        self.max_len = max((len(b) for b in self.matcher), default=0)
        self.xcda: tuple | None = None
        self.replacements = b""
        if charsmap:
            if len(charsmap) < 4:
                raise vocab._err("precompiled_charsmap too small for xcda_blob_size header!")
            (blob,) = struct.unpack_from("<I", charsmap, 0)
            if blob + 4 >= len(charsmap):
                raise vocab._err("Index out of array bounds in precompiled charsmap!")
            self.xcda = struct.unpack_from(f"<{blob // 4}I", charsmap, 4)
            self.replacements = charsmap[4 + blob :]

    # -- normalization -------------------------------------------------------------------
    def _xcda_match(self, data: bytes, off: int) -> tuple[int, int]:
        """(matched input length, replacement offset) of the charsmap's longest prefix."""
        arr = self.xcda
        size = len(arr)

        def node(i: int) -> int:
            if i >= size:
                raise self.vocab._err("Index out of array bounds in XCDA array!")
            return arr[i]

        def base(i: int) -> int:
            p = node(i)
            return (p >> 10) << ((p & (1 << 9)) >> 6)

        best_len = best_off = 0
        idx = base(0)
        for p in range(off, len(data)):
            c = data[p]
            if c == 0:
                break
            idx ^= c
            if node(idx) & ((1 << 31) | 0xFF) != c:
                break
            leaf = (node(idx) >> 8) & 1
            idx ^= base(idx)
            if leaf:
                best_len = p - off + 1
                best_off = node(idx) & ((1 << 31) - 1)
        return best_len, best_off

    def _normalize_prefix(self, data: bytes, off: int) -> tuple[bytes, int]:
        # a prefix of a user-defined token (llama.cpp's trie walk: the longest path, even
        # when it does not end on a token) passes unchanged
        k = 0
        up = self.user_prefixes
        while off + k < len(data) and data[off : off + k + 1] in up:
            k += 1
        if k:
            return data[off : off + k], k
        if self.xcda:
            ln, roff = self._xcda_match(data, off)
            if ln:
                rep = self.replacements
                if roff >= len(rep):
                    raise self.vocab._err("Index out of array bounds in precompiled charsmap!")
                end = rep.find(b"\x00", roff)
                if end == -1:
                    raise self.vocab._err("Unterminated string in precompiled charsmap!")
                return rep[roff:end], ln
        ln = _valid_cpt_len(data, off)
        if ln:
            return data[off : off + ln], ln
        return b"\xef\xbf\xbd", 1

    def normalize(self, data: bytes) -> bytes:
        v = self.vocab
        space = _SP if v.escape_whitespaces else b" "
        prepend = not v.treat_whitespace_as_suffix and v.add_space_prefix
        append = v.treat_whitespace_as_suffix and v.add_space_prefix
        merge = v.remove_extra_whitespaces
        out = bytearray()
        prepended = False
        non_ws = False
        off = 0
        n = len(data)
        while off < n:
            piece, used = self._normalize_prefix(data, off)
            for c in piece:
                if c != 0x20:
                    if not non_ws:
                        non_ws = True
                        if (prepend and not prepended) or merge:
                            out += space
                            prepended = True
                    out.append(c)
                else:
                    non_ws = False
                    if not merge:
                        out += space
            off += used
        if append:
            out += space
        return bytes(out)

    # -- Viterbi -------------------------------------------------------------------------
    def tokenize(self, text: bytes, out: list[int]) -> None:
        v = self.vocab
        norm = self.normalize(text)
        n = len(norm)
        if n == 0:
            return
        unk = v.unk
        neg = -float("inf")
        best_tok = [unk] * (n + 1)
        best_from = [0] * (n + 1)
        best_score = [neg] * (n + 1)
        best_score[0] = 0.0
        matcher = self.matcher
        scores = v.scores
        attrs = v.attrs
        max_len = self.max_len
        off = 0
        while off < n:
            cp_len = min(_utf8_len(norm[off]), n - off)
            cur = best_score[off]
            single = False
            for ln in range(1, min(max_len, n - off) + 1):
                tid = matcher.get(norm[off : off + ln])
                if tid is None:
                    continue
                if ln == cp_len:
                    single = True
                s = cur + (0.0 if attrs[tid] & ATTR_USER_DEFINED else scores[tid])
                end = off + ln
                if s > best_score[end]:
                    best_tok[end], best_from[end], best_score[end] = tid, off, s
            if not single:
                s = cur + self.unknown_score
                end = off + cp_len
                if s > best_score[end]:
                    best_tok[end], best_from[end], best_score[end] = unk, off, s
            off += cp_len
        rev = []
        prev_unk = False
        pos = n
        while True:
            tid = best_tok[pos]
            is_unk = tid == unk
            if not (prev_unk and is_unk):
                rev.append(tid)
            if best_from[pos] == 0:
                break
            prev_unk = is_unk
            pos = best_from[pos]
        out.extend(reversed(rev))
