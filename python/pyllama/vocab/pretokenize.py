"""BPE pre-tokenizers: ``tokenizer.ggml.pre`` -> the regex list llama.cpp applies before
the merges (pipeline step 5; llama.cpp: llm_tokenizer_bpe and unicode_regex_split).

Each regex of the list refines the split of the previous one: it runs inside every piece
already cut, and the text between its matches stays a piece of its own. The regexes run on
the collapsed text (see _unicode.py) with llama.cpp's class rewriting, under Python's ``re``
in ASCII mode (ECMAScript ``\\s`` is ASCII whitespace; ``$`` means end of piece). The
hand-written splitters llama.cpp uses for the gpt2/llama3/qwen2/qwen3.5 regexes give the
same pieces as those regexes do, so one mechanism serves all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ._unicode import collapse, collapse_whitespace_only

# -- the regex sets (verbatim from llama-vocab.cpp) -------------------------------------------

_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
LLAMA3 = _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
QWEN2 = _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
QWEN35 = _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
_TEKKEN_WORD = (
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+%s"
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*%s"
)
TEKKEN = _TEKKEN_WORD % ("", "") + "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
GPT4O = _TEKKEN_WORD % (_CONTRACTIONS + "?", _CONTRACTIONS + "?") + "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
_CJK = "[一-龥ࠀ-一가-퟿]+"

REGEXES: dict[str, list[str]] = {
    "default": [
        "[\\p{P}\\$\\+<=>\\^~\\|]+",
        GPT2,
        "\\p{N}+",
        "[0-9][0-9][0-9]",
    ],
    "llama3": [LLAMA3],
    "dbrx": [LLAMA3],
    "deepseek-llm": [
        "[\r\n]",
        "\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
        "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
        "\\s+$",
        _CJK,
        "\\p{N}+",
    ],
    "deepseek-v3": [
        "\\p{N}{1,3}",
        "[一-龥぀-ゟ゠-ヿ]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ],
    "deepseek-coder": ["[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", _CJK, "\\p{N}"],
    "falcon": [
        "[\\p{P}\\$\\+<=>\\^~\\|`]+",
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
        "[0-9][0-9][0-9]",
    ],
    "starcoder": ["\\p{N}", GPT2],
    "gpt2": [GPT2],
    "qwen2": [QWEN2],
    "qwen35": [QWEN35],
    "bloom": [" ?[^(\\s|.,!?…。，、।۔،)]+"],
    "chatglm4": [LLAMA3],
    "viking": [" ?[^(\\s|.,!?…。，、।۔،)]+", "\\p{N}"],
    "tekken": [TEKKEN],
    "gpt4o": [GPT4O],
    "seed-coder": [_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"],
    "bailingmoe": ["'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"],
    "newlines": ["[^\\n]+|[\\n]+"],
    "whitespace": ["\\S+"],
}


@dataclass(frozen=True)
class PreConfig:
    """What a ``tokenizer.ggml.pre`` value selects in llama.cpp's vocab loader."""

    regexes: str  # key into REGEXES
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool | None = None  # None: leave the BPE default (False)
    byte_encode: bool = True
    escape_whitespaces: bool = False
    bos_null: bool = False
    add_sep: bool = False


_P = PreConfig
_NOCLEAN = dict(clean_spaces=False)
#: tokenizer.ggml.pre value -> configuration (llama_vocab::impl::load).
PRE_TYPES: dict[str, PreConfig] = {
    "default": _P("default"),
    **{k: _P("llama3", ignore_merges=True, add_bos=True)
       for k in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano")},
    "deepseek-llm": _P("deepseek-llm", **_NOCLEAN),
    "deepseek-coder": _P("deepseek-coder", **_NOCLEAN),
    "deepseek-v3": _P("deepseek-v3", **_NOCLEAN),
    "falcon": _P("falcon"),
    "mpt": _P("gpt2"),
    "starcoder": _P("starcoder"),
    **{k: _P("gpt2") for k in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
                               "a.x-4.0", "mellum", "modern-bert", "exaone4", "olmo", "jais", "trillion", "granite-docling")},
    **{k: _P("gpt2", add_sep=True) for k in ("jina-v1-en", "jina-v2-code", "roberta-bpe")},
    "refact": _P("starcoder"),
    "command-r": _P("starcoder", **_NOCLEAN),
    **{k: _P("qwen2", **_NOCLEAN) for k in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open")},
    "megrez": _P("qwen2"),
    "qwen35": _P("qwen35", **_NOCLEAN),
    "stablelm2": _P("qwen2"),
    "dbrx": _P("dbrx"),
    "smaug-bpe": _P("dbrx"),
    "poro-chat": _P("bloom", **_NOCLEAN),
    "bloom": _P("bloom"),
    "gpt3-finnish": _P("bloom"),
    "chatglm-bpe": _P("chatglm4", bos_null=True),
    "glm4": _P("chatglm4", bos_null=True, ignore_merges=True),
    "glm5": _P("chatglm4", bos_null=True, ignore_merges=True),
    "viking": _P("viking", **_NOCLEAN),
    "tekken": _P("tekken", clean_spaces=False, ignore_merges=True, add_bos=True),
    "smollm": _P("starcoder", **_NOCLEAN),
    "codeshell": _P("starcoder"),
    "exaone": _P("starcoder"),
    "minerva-7b": _P("starcoder"),
    "mellum2": _P("starcoder"),
    **{k: _P("gpt4o", **_NOCLEAN) for k in ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2")},
    "trillion": _P("gpt2", **_NOCLEAN),
    "granite-docling": _P("gpt2", **_NOCLEAN),
    **{k: _P("bailingmoe", **_NOCLEAN) for k in ("bailingmoe", "bailingmoe2", "llada-moe")},
    "seed-coder": _P("seed-coder", **_NOCLEAN),
    "whitespace": _P("whitespace", byte_encode=False),
    # SPM-style BPE on raw UTF-8 with spaces escaped to U+2581, split only at newlines
    "gemma4": _P("newlines", byte_encode=False, escape_whitespaces=True),
    "granite-embed-multi-311m": _P("newlines", byte_encode=False, escape_whitespaces=True),
    "sarvam-moe": _P("newlines", clean_spaces=False, byte_encode=False, escape_whitespaces=True),
}

# -- llama.cpp's collapsed-regex rewriting ----------------------------------------------------

_UCAT = {  # \p{..} -> category stand-in + its ASCII members (k_ucat_cpt / k_ucat_map)
    "\\p{N}": "\xd1" + "0-9",
    "\\p{L}": "\xd2" + "A-Za-z",
    "\\p{P}": "\xd3" + "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}",
    "\\p{M}": "\xd4",
    "\\p{S}": "\xd5" + "\\$\\+<->\\^`\\|\\~",
    "\\p{Lu}": "\xd2A-Za-z",
    "\\p{Ll}": "\xd2A-Za-z",
    "\\p{Lt}": "\xd2A-Za-z",
    "\\p{Lm}": "\xd2A-Za-z",
    "\\p{Lo}": "\xd2A-Za-z",
}


def _uses_categories(rx: str) -> bool:
    return any(k in rx for k in _UCAT)


def _collapse_regex(rx: str) -> str:
    """The Python regex for one llama.cpp regex, as unicode_regex_split rewrites it."""
    out = []
    inside = False
    i = 0
    while i < len(rx):
        c = rx[i]
        if c == "[" and (i == 0 or rx[i - 1] != "\\"):
            out.append("[")
            inside = True
            i += 1
            continue
        if inside and c == "]" and rx[i - 1] != "\\":
            out.append("]")
            inside = False
            i += 1
            continue
        if rx.startswith("\\p{", i):
            j = rx.find("}", i + 3)
            if j != -1:
                pat = rx[i : j + 1]
                if pat in _UCAT:
                    out.append(_UCAT[pat] if inside else "[" + _UCAT[pat] + "]")
                    i = j + 1
                    continue
        if c == "$" and not inside and (i == 0 or rx[i - 1] != "\\"):
            # ECMAScript: end of input only (Python's $ also matches before a final \n)
            out.append("\\Z")
            i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


class PreTokenizer:
    """Splits text into the words that the BPE merges then work on."""

    def __init__(self, name: str):
        self.name = name
        self._steps: list[tuple[re.Pattern, bool]] = []
        for rx in REGEXES[name]:
            cat = _uses_categories(rx)
            self._steps.append((re.compile(_collapse_regex(rx), re.ASCII), cat))

    def split(self, text: str) -> list[str]:
        """Words of ``text`` (str of code points), in order; they concatenate to ``text``."""
        if not text:
            return []
        steps = self._steps
        collapsed = wsonly = None
        bounds = [(0, len(text))]
        for rx, cat in steps:
            if cat:
                if collapsed is None:
                    collapsed = collapse(text)
                src = collapsed
            else:
                if wsonly is None:
                    wsonly = collapse_whitespace_only(text)
                src = wsonly
            new = []
            append = new.append
            for start, end in bounds:
                prev = start
                for m in rx.finditer(src, start, end):
                    s, e = m.span()
                    if s > prev:
                        append((prev, s))
                    if e > s:
                        append((s, e))
                    prev = e
                if prev < end:
                    append((prev, end))
            bounds = new
        return [text[s:e] for s, e in bounds]
