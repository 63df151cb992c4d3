"""pyllama: run GGUF language models from Python.

llama.cpp's inference path with a Rust core (GGUF mapping, quantized kernels, KV cache,
forward passes) and a Python layer (tokenizers, samplers, batching, the llama.h-style
API in :mod:`pyllama.llama_api`, an idiomatic API and the ``pyllama`` CLI).
"""

from ._core import __version__
from .errors import (
    Aborted,
    ContextFullError,
    GGUFError,
    InvalidBatchError,
    LoadCancelled,
    PyllamaError,
    UnsupportedModelError,
)
from .gguf import GGUFFile
from .batch import Batch
from .context import Context
from .llama import Llama
from .sampling import SamplerChain, SamplerParams
from .model import Model
from .vocab import Vocab

__all__ = [
    "__version__",
    "Aborted",
    "Batch",
    "Context",
    "ContextFullError",
    "GGUFError",
    "GGUFFile",
    "Llama",
    "InvalidBatchError",
    "LoadCancelled",
    "Model",
    "PyllamaError",
    "SamplerChain",
    "SamplerParams",
    "UnsupportedModelError",
    "Vocab",
]
