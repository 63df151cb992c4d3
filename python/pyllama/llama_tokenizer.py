"""llama-cpp-python's ``llama_cpp.llama_tokenizer`` (0.3.36): the tokenizer interface
``Llama(tokenizer=...)`` takes, the model's own (:class:`LlamaTokenizer`) and one over a
Hugging Face tokenizer (:class:`LlamaHFTokenizer`, needs transformers)."""

from __future__ import annotations

import abc
from typing import Any, List, Optional

__all__ = ["BaseLlamaTokenizer", "LlamaTokenizer", "LlamaHFTokenizer"]


class BaseLlamaTokenizer(abc.ABC):
    @abc.abstractmethod
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> List[int]:
        """The token ids of the UTF-8 ``text`` (``add_bos``: with the model's BOS;
        ``special``: control-token texts become those tokens)."""
        raise NotImplementedError

    @abc.abstractmethod
    def detokenize(self, tokens: List[int], prev_tokens: Optional[List[int]] = None, special: bool = False) -> bytes:
        """The bytes of ``tokens``; with ``prev_tokens``, only what they add after those."""
        raise NotImplementedError


class LlamaTokenizer(BaseLlamaTokenizer):
    """The model's own vocabulary, as a :class:`pyllama.Llama` tokenizes."""

    def __init__(self, llama: Any):
        from .llama import _Tokenizer

        self._impl = _Tokenizer(llama)

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> List[int]:
        return self._impl.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: List[int], prev_tokens: Optional[List[int]] = None, special: bool = False) -> bytes:
        return self._impl.detokenize(tokens, prev_tokens=prev_tokens, special=special)

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> List[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos=add_bos, special=special)

    def decode(self, tokens: List[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")

    @classmethod
    def from_ggml_file(cls, path: str) -> "LlamaTokenizer":
        from .llama import Llama

        return cls(Llama(model_path=path, vocab_only=True, verbose=False))


class LlamaHFTokenizer(BaseLlamaTokenizer):
    """A ``transformers`` tokenizer (``encode`` / ``decode``) as a Llama tokenizer."""

    def __init__(self, hf_tokenizer: Any):
        self.hf_tokenizer = hf_tokenizer

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> List[int]:
        # as llama-cpp-python: the HF tokenizer's add_special_tokens follows `special`
        return self.hf_tokenizer.encode(text.decode("utf-8", errors="ignore"), add_special_tokens=special)

    def detokenize(self, tokens: List[int], prev_tokens: Optional[List[int]] = None, special: bool = False) -> bytes:
        skip = not special
        if prev_tokens is not None:
            text = self.hf_tokenizer.decode(list(prev_tokens) + list(tokens), skip_special_tokens=skip)
            prev = self.hf_tokenizer.decode(list(prev_tokens), skip_special_tokens=skip)
            return text.encode("utf-8", errors="ignore")[len(prev.encode("utf-8", errors="ignore")):]
        return self.hf_tokenizer.decode(tokens, skip_special_tokens=skip).encode("utf-8", errors="ignore")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str) -> "LlamaHFTokenizer":
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise ImportError("LlamaHFTokenizer needs the transformers package (pip install transformers)") from None
        return cls(AutoTokenizer.from_pretrained(pretrained_model_name_or_path=pretrained_model_name_or_path))
