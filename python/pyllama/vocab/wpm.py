"""WordPiece (BERT), as llama.cpp's llm_tokenizer_wpm_session (pipeline step 9).

Normalize (optional NFD-base accent stripping and lower-casing with llama.cpp's tables),
split on whitespace and around punctuation / ASCII symbols / CJK ideographs, then cut each
word, prefixed with U+2581, greedily into the longest vocabulary entries; a word that does
not cut completely becomes the unknown token.
"""

from __future__ import annotations

from ._unicode import ACCENT_MARK, CONTROL, PUNCTUATION, SYMBOL, WS, cpt_flags, nfd_base, tolower

_SP = "\u2581".encode()


def _is_chinese_char(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B920 <= cp <= 0x2CEAF  # llama.cpp (and HF): 0x2B920, not 0x2B820
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def preprocess(text: str, lowercase: bool, strip_accents: bool) -> list[str]:
    words = [""]
    for ch in text:
        cp = ord(ch)
        if strip_accents:
            cp = nfd_base(cp)
        f = cpt_flags(cp)
        if f & WS:
            if words[-1]:
                words.append("")
            continue
        if cp == 0 or cp == 0xFFFD or f & CONTROL:
            continue
        if strip_accents and f & ACCENT_MARK:
            continue
        s = chr(tolower(cp) if lowercase else cp)
        if f & PUNCTUATION or (cp < 0x7F and f & SYMBOL) or _is_chinese_char(cp):
            if words[-1]:
                words.append("")
            words[-1] = s
            words.append("")
        else:
            words[-1] += s
    if not words[-1]:
        words.pop()
    return words


class WpmSession:
    def __init__(self, vocab):
        self.vocab = vocab

    def tokenize(self, text: str, out: list[int]) -> None:
        v = self.vocab
        get = v.bytes_to_id.get
        max_len = v.max_token_len
        for word in preprocess(text, v.normalizer_lowercase, v.normalizer_strip_accents):
            if not word:
                continue
            w = _SP + word.encode("utf-8", "surrogatepass")
            n = len(w)
            start = len(out)
            i = 0
            while i < n:
                for j in range(min(n, i + max_len + 1), i, -1):
                    tid = get(w[i:j])
                    if tid is not None:
                        out.append(tid)
                        i = j
                        break
                else:
                    del out[start:]  # no match here: the whole word becomes UNK
                    break
            if len(out) == start:
                out.append(v.unk)
