"""RWKV's vocabulary (``tokenizer.ggml.model`` "rwkv"), as llama.cpp's llm_tokenizer_rwkv.

Token texts are escaped byte strings (``\\t``, ``\\n``, ``\\r``, ``\\xNN``, ``\\`` before any
other character stands for that character); a byte trie of the unescaped tokens cuts the
text greedily into the longest match at each position (a later token of the same bytes
wins, as llama.cpp's trie keeps the last insert). A byte that starts no token becomes the
unknown token. Pieces are the unescaped bytes.
"""

from __future__ import annotations

from typing import Callable, Sequence


def unescape(escaped: bytes) -> bytes:
    """llama.cpp's llama_unescape_rwkv_token, byte for byte (its char arithmetic included)."""
    out = bytearray()
    escaping = False
    hex_remaining = 0
    hex_acc = 0
    for c in escaped:
        if hex_remaining:
            sc = c - 256 if c >= 128 else c  # char is signed on x86
            value = (sc - 97 + 10) if sc >= 97 else (sc - 48)
            hex_acc = ((hex_acc << 4) + value) & 0xFF
            hex_remaining -= 1
            if hex_remaining == 0:
                out.append(hex_acc)
                hex_acc = 0
            continue
        if escaping:
            if c == 0x74:  # t
                out.append(9)
            elif c == 0x6E:  # n
                out.append(10)
            elif c == 0x72:  # r
                out.append(13)
            elif c == 0x78:  # x
                hex_remaining = 2
            else:
                out.append(c)
            escaping = False
            continue
        if c == 0x5C:  # backslash
            escaping = True
            continue
        out.append(c)
    return bytes(out)


class RwkvSession:
    """The trie of one vocabulary's unescaped tokens and the greedy longest-match cut."""

    def __init__(self, texts: Sequence[bytes], unk: Callable[[], int]):
        # a node: [token id or None, {byte: node}]
        self._root: dict = {}
        for tid, t in enumerate(texts):
            b = unescape(t)
            if not b:
                continue
            children = self._root
            node: list = []
            for c in b:
                node = children.setdefault(c, [None, {}])
                children = node[1]
            node[0] = tid
        self._unk = unk

    def tokenize(self, text: bytes, out: list[int]) -> None:
        pos, n = 0, len(text)
        root = self._root
        while pos < n:
            node = root.get(text[pos])
            if node is None:
                out.append(self._unk())
                pos += 1
                continue
            start = pos
            tid, end = 0, 0
            while node is not None:
                if node[0] is not None:
                    tid, end = node[0], pos + 1
                if pos + 1 >= n:
                    break
                pos += 1
                node = node[1].get(text[pos])
            if end == 0:
                # llama.cpp restarts from position 0 here and never ends
                raise ValueError(f"RWKV vocabulary: no token matches the text at byte {start} "
                                 "(its bytes only begin longer tokens)")
            out.append(tid)
            pos = end
