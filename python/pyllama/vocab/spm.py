"""SentencePiece-style BPE (llama.cpp's llm_tokenizer_spm_session, pipeline step 9).

Works on the fragment's UTF-8 bytes, spaces already escaped to U+2581: start from one symbol
per UTF-8 character, repeatedly merge the adjacent pair whose concatenation is a token with
the highest score (leftmost on ties), and emit each final symbol as its token or, when it is
not one, as byte tokens ``<0xXX>`` (byte fallback).
"""

from __future__ import annotations

import heapq


def _utf8_len(b: int) -> int:
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[b >> 4]


def spm_tokenize(text: bytes, bytes_to_id: dict, scores: list, byte_to_token, out: list[int]) -> None:
    n = len(text)
    if n == 0:
        return
    # symbols: start offset and byte length, with a doubly linked list over them
    starts: list[int] = []
    lens: list[int] = []
    off = 0
    while off < n:
        ln = min(_utf8_len(text[off]), n - off)
        starts.append(off)
        lens.append(ln)
        off += ln
    m = len(starts)
    prev = list(range(-1, m - 1))
    nxt = list(range(1, m + 1))
    nxt[-1] = -1

    heap: list = []
    get = bytes_to_id.get
    push = heapq.heappush

    def try_add(left: int, right: int) -> None:
        if left == -1 or right == -1:
            return
        s = starts[left]
        size = lens[left] + lens[right]
        tid = get(text[s : s + size])
        if tid is None:
            return
        # max-heap on score; ties: the smaller left index first
        push(heap, (-scores[tid], left, right, size))

    for i in range(1, m):
        try_add(i - 1, i)

    pop = heapq.heappop
    while heap:
        _, left, right, size = pop(heap)
        ll = lens[left]
        rl = lens[right]
        if ll == 0 or rl == 0 or ll + rl != size:
            continue
        lens[left] = size
        lens[right] = 0
        r_next = nxt[right]
        nxt[left] = r_next
        if r_next >= 0:
            prev[r_next] = left
        try_add(prev[left], left)
        try_add(left, r_next)

    i = 0
    append = out.append
    while i != -1:
        s = starts[i]
        piece = text[s : s + lens[i]]
        tid = get(piece)
        if tid is not None:
            append(tid)
        else:
            for b in piece:
                append(byte_to_token(b))
        i = nxt[i]
