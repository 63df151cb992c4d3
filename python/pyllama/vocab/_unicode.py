"""Code-point classes exactly as llama.cpp's src/unicode.cpp sees them (pipeline step 5).

llama.cpp runs its pre-tokenizer regexes on a "collapsed" copy of the text: every code point
>= 128 becomes one stand-in byte for its category (0xD1 number, 0xD2 letter, 0xD3
punctuation, 0xD4 accent mark, 0xD5 symbol, 0xD0 anything else, 0x0B whitespace), ASCII stays
as it is, and ``\\p{L}``-style classes in the regex are rewritten to name those stand-ins
plus their ASCII members. Doing the same here, with llama.cpp's own category tables, gives
the same split points as llama.cpp whatever Unicode version Python ships.
"""

from __future__ import annotations

from bisect import bisect_right

from ._unicode_data import FLAG_STARTS, FLAG_VALUES, LOWERCASE, NFD_RANGES, WHITESPACE

UNDEFINED = 0x0001
NUMBER = 0x0002
LETTER = 0x0004
SEPARATOR = 0x0008
ACCENT_MARK = 0x0010
PUNCTUATION = 0x0020
SYMBOL = 0x0040
CONTROL = 0x0080
WS = 0x0100  # helper bit: in llama.cpp's whitespace set

_MAX_CP = 0x110000


def cpt_flags(cp: int) -> int:
    """Category bits of one code point (plus WS for whitespace), as unicode_cpt_flags_from_cpt."""
    if cp >= _MAX_CP:
        return UNDEFINED
    f = FLAG_VALUES[bisect_right(FLAG_STARTS, cp) - 1]
    if cp in WHITESPACE:
        f |= WS
    return f


_COLLAPSE_BY_CATEGORY = {NUMBER: "\xd1", LETTER: "\xd2", PUNCTUATION: "\xd3", ACCENT_MARK: "\xd4", SYMBOL: "\xd5"}


class _CollapseTable(dict):
    """str.translate table: non-ASCII code point -> its one-char stand-in (filled lazily)."""

    def __missing__(self, cp: int) -> str:
        f = cpt_flags(cp)
        if f & WS:
            s = "\x0b"
        else:
            s = _COLLAPSE_BY_CATEGORY.get(f & 0xFF, "\xd0")
        self[cp] = s
        return s


_COLLAPSE = _CollapseTable({i: chr(i) for i in range(128)})


class _WsTable(dict):
    """str.translate table for regexes without categories: non-ASCII whitespace -> 0x0B
    (llama.cpp does this because std::wregex's \\s only knows ASCII whitespace)."""

    def __missing__(self, cp: int):
        r = "\x0b" if cp >= 128 and cp in WHITESPACE else chr(cp)
        self[cp] = r
        return r


_WS_ONLY = _WsTable()


def collapse(text: str) -> str:
    """The collapsed copy of ``text``: same length, one stand-in char per code point."""
    if text.isascii():
        return text
    return text.translate(_COLLAPSE)


def collapse_whitespace_only(text: str) -> str:
    if text.isascii():
        return text
    return text.translate(_WS_ONLY)


_LOWER = dict(LOWERCASE)


def tolower(cp: int) -> int:
    return _LOWER.get(cp, cp)


_NFD_STARTS = [r[0] for r in NFD_RANGES]


def nfd_base(cp: int) -> int:
    """llama.cpp's unicode_cpts_normalize_nfd for one code point (its table keeps only the base)."""
    i = bisect_right(_NFD_STARTS, cp) - 1
    if i >= 0:
        first, last, base = NFD_RANGES[i]
        if first <= cp <= last:
            return base
    return cp


def decode_utf8_like_llama(data: bytes) -> str:
    """Decode bytes the way unicode_cpts_from_utf8 does: each byte that does not start a
    valid sequence becomes one U+FFFD. Valid UTF-8 (the usual case) takes the fast path."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    out = []
    i, n = 0, len(data)
    while i < n:
        b = data[i]
        if b < 0x80:
            out.append(chr(b))
            i += 1
            continue
        if b & 0xE0 == 0xC0:
            ln = 2
        elif b & 0xF0 == 0xE0:
            ln = 3
        elif b & 0xF8 == 0xF0:
            ln = 4
        else:
            out.append("\ufffd")
            i += 1
            continue
        if i + ln > n or any(data[i + k] & 0xC0 != 0x80 for k in range(1, ln)):
            out.append("\ufffd")
            i += 1
            continue
        if ln == 2:
            cp = ((b & 0x1F) << 6) | (data[i + 1] & 0x3F)
        elif ln == 3:
            cp = ((b & 0x0F) << 12) | ((data[i + 1] & 0x3F) << 6) | (data[i + 2] & 0x3F)
        else:
            cp = ((b & 0x07) << 18) | ((data[i + 1] & 0x3F) << 12) | ((data[i + 2] & 0x3F) << 6) | (data[i + 3] & 0x3F)
        # llama.cpp accepts overlong forms and surrogates; Python str can hold neither a
        # code point above U+10FFFF, so those (never produced by real encoders) become U+FFFD.
        out.append(chr(cp) if cp < _MAX_CP else "\ufffd")
        i += ln
    return "".join(out)
