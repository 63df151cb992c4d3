"""Draft models for speculative decoding (llama-cpp-python 0.3.36's ``llama_speculative``).

A draft model guesses the tokens that come next; ``Llama(draft_model=...)`` decodes the
guesses together with the last sampled token in one batch and keeps the longest prefix the
sampler itself picks (pyllama.generation.Session.generate, Llama.generate). The output is
the same as without a draft model, only produced in fewer decode calls when the guesses are
good: pyllama's logits are batch-invariant (a token's logits do not depend on the other
tokens of its batch), so verifying a draft in one batch samples from the very logits
one-by-one decoding gives. (Under ``PYLLAMA_ORDER=llamacpp`` that guarantee is given up, as
llama.cpp gives it up; the output may then differ in the last bits, as llama.cpp's does.)

    >>> from pyllama import Llama
    >>> from pyllama.llama_speculative import LlamaPromptLookupDecoding
    >>> llm = Llama("model.gguf", draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["LlamaDraftModel", "LlamaPromptLookupDecoding"]


class LlamaDraftModel(abc.ABC):
    """A draft model: called with every token so far (intc [n], the prompt, the generated
    tokens and the one just sampled), returns the tokens it guesses follow (intc [k], k >= 0;
    an empty array means no guess). Guesses beyond the room left in the context or batch are
    cut off."""

    @abc.abstractmethod
    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        raise NotImplementedError()


class LlamaPromptLookupDecoding(LlamaDraftModel):
    """Prompt lookup decoding (https://github.com/apoorvumang/prompt-lookup-decoding): guess
    that the text continues as it did after the first earlier occurrence of its final n-gram
    (n from ``max_ngram_size`` down to 1), up to ``num_pred_tokens`` tokens. Costs no model
    call; pays off on output that repeats its input (code edits, quoting, summaries)."""

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10):
        for name, v in (("max_ngram_size", max_ngram_size), ("num_pred_tokens", num_pred_tokens)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"LlamaPromptLookupDecoding: {name} must be an int >= 1, got {v!r}")
        self.max_ngram_size = int(max_ngram_size)
        self.num_pred_tokens = int(num_pred_tokens)

    @staticmethod
    def find_candidate_pred_tokens(input_ids: npt.NDArray[np.intc], max_ngram_size: int,
                                   num_pred_tokens: int) -> npt.NDArray[np.intc]:
        """Up to ``num_pred_tokens`` tokens that followed the first earlier match of the last
        n tokens (n from ``max_ngram_size`` down to 1); empty when nothing matches."""
        ids = np.asarray(input_ids)
        n_ids = ids.shape[0]
        for n in range(min(max_ngram_size, n_ids - 1), 0, -1):
            tail = ids[-n:]
            windows = np.lib.stride_tricks.sliding_window_view(ids, (n,))  # (n_ids - n + 1, n)
            for start in np.flatnonzero(np.all(windows == tail, axis=1)):
                begin = start + n
                end = min(begin + num_pred_tokens, n_ids)
                if begin < end:
                    return ids[begin:end]
        return np.array([], dtype=np.intc)

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        if kwargs:
            raise TypeError(f"LlamaPromptLookupDecoding() got an unexpected keyword argument {next(iter(kwargs))!r}")
        return self.find_candidate_pred_tokens(input_ids, self.max_ngram_size, self.num_pred_tokens)


def draft_tokens(draft_model: LlamaDraftModel, input_ids: np.ndarray, n_max: int, n_vocab: int) -> list[int]:
    """The draft model's guess after ``input_ids``, cut to ``n_max`` tokens and checked
    (every id in [0, n_vocab): a bad guess is the draft model's bug, reported as such)."""
    if n_max <= 0:
        return []
    guess = np.asarray(draft_model(input_ids))
    if guess.ndim != 1:
        raise ValueError(f"draft model {type(draft_model).__name__} returned an array of shape {guess.shape}; "
                         "expected a 1-D array of token ids")
    if guess.size and not np.issubdtype(guess.dtype, np.integer):
        raise TypeError(f"draft model {type(draft_model).__name__} returned {guess.dtype} values; "
                        "expected integer token ids")
    out = [int(t) for t in guess[:n_max]]
    for t in out:
        if not 0 <= t < n_vocab:
            raise ValueError(f"draft model {type(draft_model).__name__} guessed token {t}, "
                             f"not a valid id (n_vocab = {n_vocab})")
    return out
