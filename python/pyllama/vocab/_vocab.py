"""The vocabulary: tokens, attributes, special ids and the tokenizers (pipeline steps 5, 9, 16).

Built from a GGUF file's ``tokenizer.ggml.*`` metadata exactly as llama.cpp's
``llama_vocab::impl::load`` builds it, so that tokenize / token_to_piece / detokenize give
llama.cpp's results id for id and byte for byte.
"""

from __future__ import annotations

import logging
import re
from array import array
from os import PathLike
from typing import Iterable, Sequence

from ..errors import PyllamaError, UnsupportedModelError
from .bpe import CHAR_TO_BYTE, BpeSession
from .pretokenize import PRE_TYPES, PreConfig, PreTokenizer
from .spm import SpmSession
from ._store import TokenBytes, TokenIndex, TokenTexts
from ._unicode import decode_utf8_like_llama

log = logging.getLogger("pyllama")

LLAMA_TOKEN_NULL = -1

# llama_vocab_type
VOCAB_TYPE_NONE, VOCAB_TYPE_SPM, VOCAB_TYPE_BPE, VOCAB_TYPE_WPM, VOCAB_TYPE_UGM, VOCAB_TYPE_RWKV = 0, 1, 2, 3, 4, 5

# llama_token_attr bits
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_NORMALIZED = 1 << 6
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8
ATTR_SINGLE_WORD = 1 << 9

# GGUF token_type -> attribute (LLAMA_TOKEN_TYPE_*)
_TYPE_TO_ATTR = {0: ATTR_UNDEFINED, 1: ATTR_NORMAL, 2: ATTR_UNKNOWN, 3: ATTR_CONTROL, 4: ATTR_USER_DEFINED,
                 5: ATTR_UNUSED, 6: ATTR_BYTE}

_K = "tokenizer.ggml."

_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
              "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
))

_C_SPACE = b" \t\n\v\f\r"  # C isspace() in the "C" locale


def _core():
    from .. import _core as core

    return core


def _small_metadata(f) -> dict:
    """A GGUF file's (or model's) metadata without its arrays, plus the one small array
    the vocabulary reads (UGM's precompiled_charsmap)."""
    md = dict(f.metadata(arrays=False))
    for key in ("precompiled_charsmap", "suppress_tokens"):
        v = f.meta_value(_K + key)
        if v is not None:
            md[_K + key] = v
    return md


class Vocab:
    """A model's vocabulary and tokenizer. Build with :meth:`from_metadata` or :meth:`from_file`.

    Ids are ints in ``range(n_tokens)``; pieces are bytes (a token may hold part of a UTF-8
    character); text in and out is ``str`` (bytes accepted where llama.h takes ``char *``).
    """

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_file(cls, path: str | PathLike) -> "Vocab":
        from .. import _core

        f = _core.GGUFFile(str(path), "auto")
        return cls.from_metadata(_small_metadata(f), source=str(path), store_factory=f.vocab_store)

    @classmethod
    def from_metadata(cls, md: dict, source: str = "<metadata>", store_factory=None) -> "Vocab":
        """Build from GGUF metadata as a dict. The token tables come from ``md``'s
        ``tokenizer.ggml.tokens`` / ``scores`` / ``token_type`` / ``merges`` lists, or, when
        ``store_factory`` is given (``Model`` and ``from_file`` pass the file's
        ``vocab_store``), straight from the file without Python lists."""
        v = cls.__new__(cls)
        v._load(md, source, store_factory)
        return v

    def _err(self, what: str) -> PyllamaError:
        return PyllamaError(f"{self.source}: {what}")

    def _load(self, md: dict, source: str, store_factory=None) -> None:
        self.source = source
        model = md.get(_K + "model")
        if model is None:
            raise self._err(f"missing metadata key {_K}model (no tokenizer in this file)")
        if not isinstance(model, str):
            raise self._err(f"{_K}model must be a string, got {type(model).__name__}")
        pre = md.get(_K + "pre")
        if pre is not None and not isinstance(pre, str):
            raise self._err(f"{_K}pre must be a string, got {type(pre).__name__}")
        self.tokenizer_model = model
        self.tokenizer_pre = pre or ""
        sup = md.get(_K + "suppress_tokens")
        if sup is not None and (not isinstance(sup, list) or not all(type(t) is int for t in sup)):
            raise self._err(f"invalid gguf type for {_K}suppress_tokens (an array of int32)")
        self._suppress_raw = sup or []

        # defaults, llama_vocab::impl
        self.bos = 1
        self.eos = 2
        self.eot = self.eom = LLAMA_TOKEN_NULL
        self.unk = 0
        self.sep = self.pad = self.mask = LLAMA_TOKEN_NULL
        self.nl = 13
        self.fim_pre = self.fim_suf = self.fim_mid = self.fim_pad = self.fim_rep = self.fim_sep = LLAMA_TOKEN_NULL
        self.add_space_prefix = False
        self.add_bos = self.add_eos = self.add_sep = False
        self.ignore_merges = False
        self.clean_spaces = False
        self.remove_extra_whitespaces = False
        self.escape_whitespaces = True
        self.treat_whitespace_as_suffix = False
        self.pre_config: PreConfig | None = None
        merges = None

        if model in ("no_vocab", "none"):
            self.type = VOCAB_TYPE_NONE
            self.bos = self.eos = self.unk = self.sep = self.pad = self.mask = self.nl = LLAMA_TOKEN_NULL
            n = md.get("general.vocab_size") or 0  # llama.cpp: LLM_KV_VOCAB_SIZE
            self._set_tokens(_core().VocabStore.from_lists([""] * int(n)))
            self.eog_ids = frozenset()
            self._special_cache = []
            return
        if model == "llama":
            self.type = VOCAB_TYPE_SPM
        elif model == "bert":
            self.type = VOCAB_TYPE_WPM
            self.bos, self.eos, self.unk, self.sep, self.pad, self.mask = 101, LLAMA_TOKEN_NULL, 100, 102, 0, 103
            self.add_sep = True
        elif model in ("gpt2", "gemma4"):
            self.type = VOCAB_TYPE_BPE
            if store_factory is None:
                merges = md.get(_K + "merges")
                if merges is None:
                    raise self._err("cannot find tokenizer merges (tokenizer.ggml.merges) in model file")
                if not isinstance(merges, list):
                    raise self._err(f"{_K}merges must be an array of strings")
            self.bos = self.eos = 11
            self.unk = LLAMA_TOKEN_NULL
            if model == "gemma4":
                self.bos = self.eos = LLAMA_TOKEN_NULL
                self.sep = self.pad = self.mask = LLAMA_TOKEN_NULL
                pre = self.tokenizer_pre = "gemma4"
        elif model == "t5":
            self.type = VOCAB_TYPE_UGM
            self.bos, self.eos, self.unk, self.sep, self.pad, self.mask = LLAMA_TOKEN_NULL, 1, 2, LLAMA_TOKEN_NULL, 0, LLAMA_TOKEN_NULL
            cm = md.get(_K + "precompiled_charsmap")
            if cm is not None:
                if isinstance(cm, (bytes, bytearray)):
                    cm = bytes(cm)
                elif isinstance(cm, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in cm):
                    cm = bytes(x & 0xFF for x in cm)
                else:
                    raise self._err(f"invalid gguf type for {_K}precompiled_charsmap (want an int8/uint8 array)")
            self._charsmap = cm
        elif model == "rwkv":
            self.type = VOCAB_TYPE_RWKV
            self.bos = self.eos = self.unk = self.sep = self.pad = LLAMA_TOKEN_NULL
        elif model in ("plamo2", "hybriddna", "whitespace", "test"):
            raise UnsupportedModelError(f"{source}: tokenizer model {model!r} is not supported yet")
        else:
            raise UnsupportedModelError(f"{source}: unknown tokenizer model {model!r}")

        if self.type == VOCAB_TYPE_BPE:
            self.add_space_prefix = False
            self.escape_whitespaces = False
            self.clean_spaces = True
            if not pre:
                log.warning("%s: missing pre-tokenizer type (tokenizer.ggml.pre), using 'default'", source)
                pre = "default"
            cfg = PRE_TYPES.get(pre)
            if cfg is None:
                raise UnsupportedModelError(f"{source}: unknown pre-tokenizer type: {pre!r}")
            self.pre_config = cfg
            self.clean_spaces = cfg.clean_spaces
            self.ignore_merges = cfg.ignore_merges
            if cfg.add_bos is not None:
                self.add_bos = cfg.add_bos
            if cfg.bos_null:
                self.bos = LLAMA_TOKEN_NULL
            if cfg.add_sep:
                self.add_sep = True
            self.escape_whitespaces = cfg.escape_whitespaces
        elif self.type == VOCAB_TYPE_SPM:
            self.add_space_prefix = True
            self.clean_spaces = False
            self.add_bos = True
            self.add_eos = False
        elif self.type == VOCAB_TYPE_WPM:
            self.clean_spaces = True
            self.add_bos = True
            self.add_eos = False
            self.add_sep = True
        elif self.type == VOCAB_TYPE_UGM:
            self.add_bos = False
            self.add_eos = True
        elif self.type == VOCAB_TYPE_RWKV:
            self.add_space_prefix = False
            self.clean_spaces = False
            self.add_bos = False
            self.add_eos = False
        self.add_space_prefix = bool(self._get_bool(md, "add_space_prefix", self.add_space_prefix))
        self.remove_extra_whitespaces = bool(self._get_bool(md, "remove_extra_whitespaces", False))

        if store_factory is not None:
            try:
                store = store_factory(self.type == VOCAB_TYPE_BPE)
            except ValueError as e:
                raise self._err(str(e)) from None
        else:
            store = self._store_from_lists(md, merges)
        self._set_tokens(store)
        n = self.n_tokens

        # newline token
        if self.type == VOCAB_TYPE_SPM:
            try:
                self.nl = self.byte_to_token(10)
            except PyllamaError:
                self.nl = self.pad
        elif self.type == VOCAB_TYPE_WPM:
            self.nl = self.pad
        self._init_tokenizer()
        if self.type not in (VOCAB_TYPE_SPM, VOCAB_TYPE_WPM):
            # llama.cpp: the first id of tokenize("\n"), taken before the special ids and
            # the special-token cache are loaded (so with the type's default ids)
            ids = self._tokenize_fragments([b"\n"], False, False)
            self.nl = ids[0] if ids else self.pad

        # special token ids from metadata (out-of-range defaults and values disabled, with a warning)
        for key, attr in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("eot_token_id", "eot"),
                          ("eom_token_id", "eom"), ("unknown_token_id", "unk"), ("seperator_token_id", "sep"),
                          ("padding_token_id", "pad"), ("mask_token_id", "mask"), ("fim_pre_token_id", "fim_pre"),
                          ("fim_suf_token_id", "fim_suf"), ("fim_mid_token_id", "fim_mid"),
                          ("fim_pad_token_id", "fim_pad"), ("fim_rep_token_id", "fim_rep"),
                          ("fim_sep_token_id", "fim_sep"), ("prefix_token_id", "fim_pre"),
                          ("suffix_token_id", "fim_suf"), ("middle_token_id", "fim_mid")):
            cur = getattr(self, attr)
            if cur >= 0 and cur >= n:
                log.warning("%s: default special token '%s%s' = %d out of vocab range, disabling", source, _K, key, cur)
                cur = LLAMA_TOKEN_NULL
                setattr(self, attr, cur)
            new = md.get(_K + key)
            if new is None:
                continue
            if isinstance(new, bool) or not isinstance(new, int):
                raise self._err(f"{_K}{key} must be an integer, got {type(new).__name__}")
            if new < 0 or new >= n:
                log.warning("%s: bad special token: '%s%s' = %d (vocab has %d tokens), using default id %d",
                            source, _K, key, new, n, cur)
            else:
                setattr(self, attr, new)
        # BertNormalizer options (WPM); strip_accents follows lowercase unless given
        self.normalizer_lowercase = bool(self._get_bool(md, "normalizer.lowercase", True))
        self.normalizer_strip_accents = bool(self._get_bool(md, "normalizer.strip_accents", self.normalizer_lowercase))
        self.add_bos = bool(self._get_bool(md, "add_bos_token", self.add_bos))
        self.add_eos = bool(self._get_bool(md, "add_eos_token", self.add_eos))
        self.add_sep = bool(self._get_bool(md, "add_sep_token", self.add_sep))
        if self.tokenizer_pre in ("gemma4", "granite-embed-multi-311m") and self.type == VOCAB_TYPE_BPE and not self.add_bos:
            log.warning("%s: override '%sadd_bos_token' to 'true' for Gemma4", source, _K)
            self.add_bos = True

        self._find_special_by_text()
        self._build_eog()
        self._build_special_cache()
        self._apply_model_attrs(md)
        self._piece_cache: dict[int, bytes] = {}

    def _get_bool(self, md: dict, key: str, default):
        v = md.get(_K + key)
        if v is None:
            return default
        if not isinstance(v, (bool, int)):
            raise self._err(f"{_K}{key} must be a bool, got {type(v).__name__}")
        return bool(v)

    def _store_from_lists(self, md: dict, merges):
        tokens = md.get(_K + "tokens")
        if tokens is None:
            raise self._err("cannot find tokenizer vocab (tokenizer.ggml.tokens) in model file")
        if not isinstance(tokens, list):
            raise self._err(f"{_K}tokens must be an array of strings")
        n = len(tokens)
        # GGUF allows float32 or int32 scores; anything else is a broken file
        scores = self._numbers(md, "scores", "scores", n, {float, int}, "float32 or int32")
        toktypes = self._numbers(md, "token_type", "toktypes", n, {int}, "int32")
        try:
            return _core().VocabStore.from_lists(tokens, scores, toktypes, merges)
        except (TypeError, OverflowError) as e:
            raise self._err(f"{_K}{e}") from None
        except ValueError as e:  # a broken table (e.g. a BYTE token that names no byte)
            raise self._err(str(e)) from None

    def _numbers(self, md: dict, key: str, what: str, n: int, types: set, type_name: str):
        """The first ``n`` entries of the number array ``tokenizer.ggml.<key>`` (None if
        absent), with the checks and messages of the Rust ``store_from_metadata``."""
        v = md.get(_K + key)
        if v is None:
            return None
        if not isinstance(v, list):
            raise self._err(f"{_K}{key} must be an array")
        if len(v) < n:
            raise self._err(f"Index out of array bounds for {what} ({len(v)} < {n})")
        v = v[:n]
        if set(map(type, v)) - types:
            raise self._err(f"{_K}{key} must be an array of {type_name}")
        return v

    def _set_tokens(self, store) -> None:
        """Take the token tables from ``store`` (a ``_core.VocabStore``)."""
        self._store = store
        for i in store.empty_ids():
            log.warning("%s: empty token at index %d", self.source, i)
        self.texts = TokenTexts(store)
        self.texts_bytes = TokenBytes(store)
        # one index serves both: str keys are matched by their UTF-8 (surrogateescape) bytes
        self.text_to_id = self.bytes_to_id = TokenIndex(store)
        self.n_tokens = len(store)
        self.scores = array("f")
        self.scores.frombytes(store.scores_bytes())
        tta = _TYPE_TO_ATTR
        self.attrs = [tta.get(t, ATTR_UNDEFINED) for t in store.types()]
        self.max_token_len = store.max_token_len

    def _find_special_by_text(self) -> None:
        t2i = self.text_to_id
        attrs = self.attrs

        def mark(tid: int) -> None:
            if not attrs[tid] & ATTR_CONTROL:
                log.warning("%s: control-looking token %d %r was not control-type; overriding", self.source, tid,
                            self.texts[tid])
                attrs[tid] |= ATTR_CONTROL

        # llama.cpp walks an unordered_map here, so with several candidates the pick is
        # arbitrary; we take the first listed text present (all of them end up EOG anyway).
        if self.eot == LLAMA_TOKEN_NULL:
            for s in _EOT_TEXTS:
                if s in t2i:
                    self.eot = t2i[s]
                    mark(self.eot)
                    break
        if self.eom == LLAMA_TOKEN_NULL:
            for s in _EOM_TEXTS:
                if s in t2i:
                    self.eom = t2i[s]
                    mark(self.eom)
                    break
        for attr, texts in _FIM_TEXTS.items():
            if getattr(self, attr) == LLAMA_TOKEN_NULL:
                for s in texts:
                    if s in t2i:
                        setattr(self, attr, t2i[s])
                        mark(t2i[s])
                        break
        # control tokens whose text says "unused"
        for i, a in enumerate(attrs):
            if a & ATTR_CONTROL and not a & ATTR_UNUSED and "unused" in self.texts[i]:
                attrs[i] = a | ATTR_UNUSED

    def _build_eog(self) -> None:
        attrs = self.attrs
        eog: set[int] = set()
        for tid in (self.fim_pad, self.fim_rep, self.fim_sep):
            if tid != LLAMA_TOKEN_NULL:
                eog.add(tid)
        t2i = self.text_to_id
        for s in _EOG_TEXTS:
            tid = t2i.get(s)
            if tid is not None:
                eog.add(tid)
                attrs[tid] |= ATTR_CONTROL
        for s in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
            tid = t2i.get(s)
            if tid is not None:
                attrs[tid] = ATTR_USER_DEFINED
        for tid in (self.eos, self.eot, self.eom):
            if tid != LLAMA_TOKEN_NULL:
                eog.add(tid)
        texts = {self.texts[t]: t for t in eog if 0 <= t < self.n_tokens}
        if "<|end|>" in texts and (("<|return|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))
                                   or (("<|call|>" in texts or "<|calls|>" in texts) and "<|flush|>" in texts)):
            end_id = texts["<|end|>"]
            eog.discard(end_id)
            attrs[end_id] = ATTR_USER_DEFINED
        if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            s_id = texts["</s>"]
            eog.discard(s_id)
            attrs[s_id] = ATTR_NORMAL
        self.eog_ids = frozenset(eog)

    def _build_special_cache(self) -> None:
        want = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN
        ids = [i for i, a in enumerate(self.attrs) if a & want]
        # llama.cpp: longest text first (std::sort, ties unspecified; we keep id order)
        ids.sort(key=lambda i: -len(self.texts_bytes[i]))
        self._special_cache = ids
        # first byte -> [(order, id, text)]: [0] without control/unknown tokens, [1] all
        plain: dict = {}
        every: dict = {}
        for order, tid in enumerate(ids):
            b = self.texts_bytes[tid]
            every.setdefault(b[:1], []).append((order, tid, b))
            if not self.attrs[tid] & (ATTR_CONTROL | ATTR_UNKNOWN):
                plain.setdefault(b[:1], []).append((order, tid, b))
        self._special_index = (plain, every)

    def _apply_model_attrs(self, md: dict) -> None:
        name = str(md.get("general.name") or "").lower()
        pre = self.tokenizer_pre
        arch = str(md.get("general.architecture") or "")
        t2i = self.text_to_id
        if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
                s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
            if "<mask>" in t2i:
                self.attrs[t2i["<mask>"]] |= ATTR_LSTRIP
        elif "phi-3" in name or "phi3" in name:
            for i in self._special_cache:
                self.attrs[i] |= ATTR_RSTRIP
            for s, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                if s in t2i:
                    if on:
                        self.attrs[t2i[s]] |= ATTR_RSTRIP
                    else:
                        self.attrs[t2i[s]] &= ~ATTR_RSTRIP
        elif "modern-bert" in name:
            if "[MASK]" in t2i:
                self.attrs[t2i["[MASK]"]] |= ATTR_LSTRIP

    def _init_tokenizer(self) -> None:
        if self.type == VOCAB_TYPE_SPM:
            self._spm = SpmSession(self._store, self.byte_to_token)
        elif self.type == VOCAB_TYPE_BPE:
            cfg = self.pre_config
            self._bpe = BpeSession(self._store, PreTokenizer(cfg.regexes),
                                   byte_encode=cfg.byte_encode, ignore_merges=self.ignore_merges,
                                   gemma4_newlines=self.tokenizer_pre in ("gemma4", "granite-embed-multi-311m"))
        elif self.type == VOCAB_TYPE_WPM:
            from .wpm import WpmSession

            self._wpm = WpmSession(self)
        elif self.type == VOCAB_TYPE_UGM:
            from .ugm import UgmSession

            self._ugm = UgmSession(self, self._charsmap)
        elif self.type == VOCAB_TYPE_RWKV:
            from .rwkv import RwkvSession

            self._rwkv = RwkvSession(self.texts_bytes, self._rwkv_unk)

    # ------------------------------------------------------------------ attributes
    def __len__(self) -> int:
        return self.n_tokens

    def __repr__(self) -> str:
        kind = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV"}.get(self.type, "?")
        pre = f", pre={self.tokenizer_pre!r}" if self.type == VOCAB_TYPE_BPE else ""
        return f"Vocab({kind}{pre}, n_tokens={self.n_tokens})"

    def check_id(self, token: int, what: str = "token id") -> int:
        """Raise ValueError unless ``token`` is a valid id of this vocabulary."""
        if isinstance(token, bool) or not isinstance(token, int):
            try:
                import numpy as np

                if isinstance(token, np.integer):
                    token = int(token)
                else:
                    raise TypeError
            except TypeError:
                raise TypeError(f"{what} must be an int, got {type(token).__name__}") from None
        if not 0 <= token < self.n_tokens:
            raise ValueError(f"{what} {token} out of range: valid ids are 0..{self.n_tokens - 1}")
        return token

    def text(self, token: int) -> str:
        return self.texts[self.check_id(token)]

    def score(self, token: int) -> float:
        return self.scores[self.check_id(token)]

    def attr(self, token: int) -> int:
        return self.attrs[self.check_id(token)]

    @property
    def suppress_tokens(self) -> list[int]:
        """``tokenizer.ggml.suppress_tokens``, ids outside the vocabulary dropped (llama.cpp)."""
        return [t for t in getattr(self, "_suppress_raw", ()) if 0 <= t < self.n_tokens]

    def is_eog(self, token: int) -> bool:
        return token != LLAMA_TOKEN_NULL and token in self.eog_ids

    def is_control(self, token: int) -> bool:
        return bool(self.attrs[self.check_id(token)] & ATTR_CONTROL)

    def byte_to_token(self, ch: int) -> int:
        """Token of one byte (SPM: ``<0xXX>``, else the single-byte text); KeyError if none."""
        if self.type == VOCAB_TYPE_SPM or self.type == VOCAB_TYPE_UGM:
            tid = self.text_to_id.get("<0x%02X>" % ch)
            if tid is not None:
                return tid
            tid = self.bytes_to_id.get(bytes([ch]))
            if tid is None:
                # llama.cpp throws std::out_of_range here (and the program aborts)
                raise PyllamaError(f"{self.source}: no token for byte 0x{ch:02X} (neither <0x{ch:02X}> nor the "
                                   f"byte itself is in the vocabulary), needed for byte fallback")
            return tid
        from .bpe import BYTE_TO_CHAR

        return self.text_to_id[BYTE_TO_CHAR[ch]]

    # ------------------------------------------------------------------ tokenize
    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``, as llama_tokenize. ``add_special`` adds BOS/EOS/SEP as the
        model asks; ``parse_special`` turns control-token texts (``<|im_start|>``) into their
        ids (user-defined tokens are always matched)."""
        if isinstance(text, str):
            raw = text.encode("utf-8", "surrogatepass")
        elif isinstance(text, (bytes, bytearray, memoryview)):
            raw = bytes(text)
        else:
            raise TypeError(f"text must be str or bytes, got {type(text).__name__}")
        if self.type == VOCAB_TYPE_NONE:
            raise PyllamaError(f"{self.source}: this model has no vocabulary (tokenizer.ggml.model = {self.tokenizer_model!r})")
        fragments = self._partition(raw, parse_special) if raw else []
        return self._tokenize_fragments(fragments, add_special, True)

    def _special_candidates(self, raw: bytes, parse_special: bool) -> list[int]:
        """The special tokens (in partition order) whose text occurs in ``raw``: the others
        cannot match any fragment, and skipping them keeps the partition cheap when a
        vocabulary has thousands of control tokens."""
        idx = self._special_index[1 if parse_special else 0]
        found = []
        for first, entries in idx.items():
            if raw.find(first) == -1:
                continue
            if len(entries) > 64:
                # many tokens share this first byte: only those whose first 3 bytes occur
                grams = {first + g for g in re.findall(re.escape(first) + b"(?=(.{0,2}))", raw, re.S)}
                for order, tid, b in entries:
                    if (len(b) < 3 or b[:3] in grams) and b in raw:
                        found.append((order, tid))
            else:
                for order, tid, b in entries:
                    if b in raw:
                        found.append((order, tid))
        found.sort()
        return [tid for _, tid in found]

    def _partition(self, raw: bytes, parse_special: bool) -> list:
        """tokenizer_st_partition: split ``raw`` into bytes fragments and special-token ids."""
        frags: list = [(0, len(raw))]  # (offset, length) for raw text, int for a token
        attrs = self.attrs
        for tid in self._special_candidates(raw, parse_special):
            tb = self.texts_bytes[tid]
            tl = len(tb)
            a = attrs[tid]
            new: list = []
            for fr in frags:
                if isinstance(fr, int):
                    new.append(fr)
                    continue
                base, length = fr
                while True:
                    match = raw.find(tb, base, base + length)
                    if match == -1:
                        new.append((base, length))
                        break
                    if match > base:
                        left_len = match - base
                        if a & ATTR_LSTRIP:
                            while left_len > 0 and raw[base + left_len - 1] in _C_SPACE:
                                left_len -= 1
                        if left_len > 0:
                            new.append((base, left_len))
                    new.append(tid)
                    end = base + length
                    if match + tl < end:
                        r_off = match + tl
                        r_len = end - r_off
                        if a & ATTR_RSTRIP:
                            while r_len > 0 and raw[r_off] in _C_SPACE:
                                r_off += 1
                                r_len -= 1
                        if r_len <= 0:
                            break
                        base, length = r_off, r_len
                    else:
                        break
            frags = new
        return [raw[f[0] : f[0] + f[1]] if isinstance(f, tuple) else f for f in frags]

    def _tokenize_fragments(self, fragments: list, add_special: bool, _loaded: bool) -> list[int]:
        out: list[int] = []
        t = self.type
        if t == VOCAB_TYPE_SPM:
            is_prev_special = True
            if add_special and self.add_bos:
                self._need(self.bos, "BOS")
                out.append(self.bos)
            for fr in fragments:
                if isinstance(fr, bytes):
                    text = (b" " + fr) if (self.add_space_prefix and is_prev_special) else fr
                    text = text.replace(b" ", "\u2581".encode())
                    self._spm.tokenize(text, out)
                    is_prev_special = False
                else:
                    out.append(fr)
                    is_prev_special = True
            if add_special and self.add_bos and len(out) >= 2 and out[1] == self.bos:
                log.warning("Added a BOS token to the prompt as specified by the model but the prompt also starts "
                            "with a BOS token. So now the final prompt starts with 2 BOS tokens.")
            if add_special and self.add_eos:
                self._need(self.eos, "EOS")
                out.append(self.eos)
        elif t == VOCAB_TYPE_BPE:
            if add_special and self.add_bos:
                self._need(self.bos, "BOS")
                out.append(self.bos)
            for fr in fragments:
                if isinstance(fr, bytes):
                    s = decode_utf8_like_llama(fr)
                    if self.escape_whitespaces:
                        s = s.replace(" ", "\u2581")
                    self._bpe.tokenize(s, out)
                else:
                    out.append(fr)
            if add_special and self.add_eos:
                self._need(self.eos, "EOS")
                out.append(self.eos)
        elif t == VOCAB_TYPE_WPM:
            if add_special:
                self._need(self.bos, "BOS")
                out.append(self.bos)
            for fr in fragments:
                if isinstance(fr, bytes):
                    self._wpm.tokenize(decode_utf8_like_llama(fr), out)
                else:
                    out.append(fr)
            if add_special:
                self._need(self.sep, "SEP")
                out.append(self.sep)
        elif t == VOCAB_TYPE_UGM:
            if add_special and self.add_bos:
                self._need(self.bos, "BOS")
                out.append(self.bos)
            for fr in fragments:
                if isinstance(fr, bytes):
                    self._ugm.tokenize(fr, out)
                else:
                    out.append(fr)
            if add_special and self.add_bos and len(out) >= 2 and out[1] == self.bos:
                log.warning("Added a BOS token to the prompt as specified by the model but the prompt also starts "
                            "with a BOS token. So now the final prompt starts with 2 BOS tokens.")
            if add_special and self.add_eos:
                self._need(self.eos, "EOS")
                out.append(self.eos)
        elif t == VOCAB_TYPE_RWKV:
            if add_special and self.add_bos:
                self._need(self.bos, "BOS")
                out.append(self.bos)
            for fr in fragments:
                if isinstance(fr, bytes):
                    try:
                        self._rwkv.tokenize(fr, out)
                    except ValueError as e:
                        raise PyllamaError(f"{self.source}: {e}") from None
                else:
                    out.append(fr)
            if add_special and self.add_eos:
                self._need(self.eos, "EOS")
                out.append(self.eos)
        else:
            raise UnsupportedModelError(f"{self.source}: tokenizing with {self.tokenizer_model!r} is not supported yet")
        return out

    def _rwkv_unk(self) -> int:
        # llama.cpp pushes its unknown id, LLAMA_TOKEN_NULL unless the file sets one
        self._need(self.unk, "UNK")
        return self.unk

    def _need(self, tid: int, what: str) -> None:
        if tid == LLAMA_TOKEN_NULL:
            raise PyllamaError(f"{self.source}: the model asks for a {what} token but defines none")

    # ------------------------------------------------------------------ pieces
    def token_to_piece(self, token: int, special: bool = False, lstrip: int = 0) -> bytes:
        """The bytes of one token, as llama_token_to_piece. Control and unknown tokens give
        b"" unless ``special``; ``lstrip`` drops up to that many leading spaces."""
        token = self.check_id(token)
        a = self.attrs[token]
        if not special and a & (ATTR_UNKNOWN | ATTR_CONTROL):
            return b""
        piece = self._piece_cache.get(token)
        if piece is None:
            piece = self._piece(token, a)
            self._piece_cache[token] = piece
        if lstrip:
            k = 0
            while k < lstrip and k < len(piece) and piece[k] == 0x20:
                k += 1
            piece = piece[k:]
        return piece

    def _piece(self, token: int, a: int) -> bytes:
        t = self.type
        if t == VOCAB_TYPE_RWKV:  # every token, whatever its type: its unescaped bytes
            from .rwkv import unescape

            return unescape(self.texts_bytes[token])
        text = self.texts[token]
        if a & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED):
            return self.texts_bytes[token]
        if t in (VOCAB_TYPE_SPM, VOCAB_TYPE_WPM, VOCAB_TYPE_UGM) or (t == VOCAB_TYPE_BPE and self.escape_whitespaces):
            if a & ATTR_NORMAL:
                return self.texts_bytes[token].replace("\u2581".encode(), b" ")
        elif t == VOCAB_TYPE_BPE:
            if a & ATTR_NORMAL:
                out = bytearray()
                for ch in text:
                    b = CHAR_TO_BYTE.get(ch)
                    if b is not None:
                        out.append(b)
                    else:
                        enc = ch.encode("utf-8", "surrogateescape")
                        out += b"[UNK_BYTE_0x" + enc.hex().encode() + self.texts_bytes[token] + b"]"
                return bytes(out)
        if a & ATTR_BYTE:
            return bytes([int(text[3:5], 16)])
        return b""

    def detokenize_bytes(self, tokens: Iterable[int], remove_special: bool = False,
                         unparse_special: bool = False, clean_spaces: bool | None = None) -> bytes:
        """The bytes of a token sequence, as llama_detokenize writes them. ``clean_spaces``
        None follows the model (clean_up_tokenization_spaces)."""
        toks = [self.check_id(t) for t in tokens]
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and toks and toks[0] == self.bos:
            remove_space = False
            toks = toks[1:]
        if remove_special and self.add_eos and toks and toks[-1] == self.eos:
            toks = toks[:-1]
        parts = []
        for t in toks:
            parts.append(self.token_to_piece(t, unparse_special, 1 if remove_space else 0))
            remove_space = False
        text = b"".join(parts)
        if (self.clean_spaces if clean_spaces is None else clean_spaces) and text:
            text = _clean_spaces(text)
        return text

    def detokenize(self, tokens: Iterable[int], remove_special: bool = False, unparse_special: bool = False,
                   errors: str = "replace") -> str:
        """The text of a token sequence, as llama_detokenize, decoded as UTF-8 (bytes that do
        not form valid UTF-8 become U+FFFD unless ``errors`` says otherwise)."""
        return self.detokenize_bytes(tokens, remove_special, unparse_special).decode("utf-8", errors)

    decode = detokenize

    def streaming_decoder(self, special: bool = False) -> "StreamingDetokenizer":
        from .detok import StreamingDetokenizer

        return StreamingDetokenizer(self, special)


def _clean_spaces(text: bytes) -> bytes:
    """llama_detokenize's three clean-up passes (clean_up_tokenization_spaces)."""
    b = bytearray(text)
    # pass 1: " ?", " !", " .", " ," lose the space
    out = bytearray(b[:1])
    for i in range(1, len(b)):
        x = b[i]
        if b[i - 1] == 0x20 and x in b"?!.,":
            out.pop()
        out.append(x)
    b = out
    # pass 2: " ' " -> "'"
    out = bytearray(b[:1])
    i = 1
    n = len(b)
    while i < n:
        x = b[i]
        if x == 0x27 and i + 1 < n and b[i - 1] == 0x20 and b[i + 1] == 0x20:
            out.pop()
            b[i + 1] = 0  # llama.cpp writes a NUL over the next space and skips it
            out.append(x)
            i += 2
            continue
        out.append(x)
        i += 1
    b = out
    # pass 3: " 's", " 'm", " 're", " 've" lose the space
    out = bytearray(b[:1])
    n = len(b)
    for i in range(1, n):
        x = b[i]
        if b[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = b[i + 1]
            if x1 in b"sm":
                out.pop()
            elif x1 not in b"td" and i + 2 < n:
                x2 = b[i + 2]
                if (x1 == 0x72 and x2 == 0x65) or (x1 == 0x76 and x2 == 0x65):
                    out.pop()
        out.append(x)
    return bytes(out)
