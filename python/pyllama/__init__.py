"""pyllama: run GGUF language models from Python.

llama.cpp's inference path with a Rust core (GGUF mapping, quantized kernels, KV cache,
forward passes) and a Python layer (tokenizers, samplers, batching, the llama.h-style
API in :mod:`pyllama.llama_api`, an idiomatic API and the ``pyllama`` CLI).
"""

from ._core import __version__
from .errors import (
    Aborted,
    ContextFullError,
    DecodeError,
    GGUFError,
    InvalidBatchError,
    LoadCancelled,
    PyllamaError,
    StateError,
    UnsupportedModelError,
)

# The rest is imported on first use (PEP 562): a program that only loads a model and
# decodes does not pay for the vocabulary, sampling, chat and generation modules.
_LAZY = {
    "GGUFFile": ".gguf",
    "Batch": ".batch",
    "Context": ".context",
    "ControlVector": ".adapter",
    "LoraAdapter": ".adapter",
    "Llama": ".llama",
    "LogitsProcessorList": ".llama",
    "StoppingCriteriaList": ".llama",
    "SamplerChain": ".sampling",
    "SamplerParams": ".sampling",
    "Model": ".model",
    "Vocab": ".vocab",
}


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'pyllama' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "__version__",
    "Aborted",
    "Batch",
    "Context",
    "ContextFullError",
    "ControlVector",
    "DecodeError",
    "GGUFError",
    "GGUFFile",
    "Llama",
    "InvalidBatchError",
    "LoadCancelled",
    "LogitsProcessorList",
    "LoraAdapter",
    "Model",
    "PyllamaError",
    "SamplerChain",
    "SamplerParams",
    "StateError",
    "StoppingCriteriaList",
    "UnsupportedModelError",
    "Vocab",
]
