"""Run code written for llama-cpp-python on pyllama: :func:`as_llama_cpp` registers a
``llama_cpp`` package in ``sys.modules`` whose modules are pyllama's.

    >>> import pyllama.compat
    >>> pyllama.compat.as_llama_cpp()
    >>> from llama_cpp import Llama          # pyllama.Llama
    >>> import llama_cpp.llama_cpp as C      # pyllama.llama_api (llama.h names)

What maps where:

    llama_cpp                     Llama, LogitsProcessorList, ..., the llama_types, the
                                  llama.h functions and constants, __version__
    llama_cpp.llama               pyllama.llama
    llama_cpp.llama_cpp           pyllama.llama_api's functions and constants, and the ctypes
                                  type names (llama_token, llama_token_data, llama_log_callback,
                                  ...: pyllama._ctypes_compat)
    llama_cpp.llama_types         pyllama.llama_types
    llama_cpp.llama_chat_format   pyllama.llama_chat_format
    llama_cpp.llama_speculative   pyllama.llama_speculative (LlamaDraftModel,
                                  LlamaPromptLookupDecoding)
    llama_cpp.llama_grammar       LlamaGrammar (GBNF, JSON schemas)
    llama_cpp.llama_cache         LlamaRAMCache, LlamaDiskCache (pyllama.llama_cache)
    llama_cpp.llama_tokenizer     pyllama.llama_tokenizer (LlamaTokenizer, LlamaHFTokenizer)
    llama_cpp._internals          pyllama.internals (LlamaModel, LlamaContext, LlamaBatch,
                                  LlamaSampler, ... over the llama.h-style functions)
"""

from __future__ import annotations

import sys
import types
from typing import Any

from .llama_grammar import LlamaGrammar

__all__ = ["as_llama_cpp", "LlamaGrammar", "LlamaRAMCache", "LlamaDiskCache"]

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # the llama-cpp-python release whose API this follows


from .llama_cache import BaseLlamaCache, LlamaCache, LlamaDiskCache, LlamaRAMCache  # noqa: E402


def _module(name: str, doc: str, **attrs: Any) -> types.ModuleType:
    m = types.ModuleType(name, doc)
    m.__dict__.update(attrs)
    return m


def _low_level_module(llama_api) -> types.ModuleType:
    """``llama_cpp.llama_cpp``: every name of pyllama.llama_api (looked up there on each
    access, so it stays pyllama's), then the ctypes type names of pyllama._ctypes_compat."""
    from . import _ctypes_compat

    m = types.ModuleType("llama_cpp.llama_cpp", "llama-cpp-python's low-level module on pyllama: "
                         "pyllama.llama_api's llama.h functions and constants, and the ctypes type names "
                         "of pyllama._ctypes_compat")
    api_names = [k for k in dir(llama_api) if not k.startswith("_")]
    m.__all__ = sorted(set(api_names) | set(_ctypes_compat.__all__))  # type: ignore[attr-defined]

    def __getattr__(name: str):
        try:
            return getattr(llama_api, name)
        except AttributeError:
            pass
        if name in _ctypes_compat.__all__:
            return getattr(_ctypes_compat, name)
        raise AttributeError(f"module 'llama_cpp.llama_cpp' (pyllama.llama_api) has no attribute {name!r}")

    m.__getattr__ = __getattr__  # type: ignore[attr-defined]
    m.__dir__ = lambda: list(m.__all__)  # type: ignore[attr-defined]
    return m


def as_llama_cpp() -> types.ModuleType:
    """Register ``llama_cpp`` and its submodules (see the module docstring) in
    ``sys.modules``, replacing a llama-cpp-python imported before; return the package."""
    from . import internals
    from . import llama as llama_mod
    from . import llama_api, llama_chat_format, llama_types
    from . import llama_cache as cache
    from . import llama_grammar as grammar
    from . import llama_speculative as speculative
    from . import llama_tokenizer as tokenizer

    pkg = _module("llama_cpp", "llama-cpp-python's API on pyllama (pyllama.compat.as_llama_cpp)")
    pkg.__path__ = []  # a package: its submodules come from sys.modules
    for mod in (llama_api, llama_types):
        pkg.__dict__.update({k: getattr(mod, k) for k in getattr(mod, "__all__", [k for k in dir(mod) if not k.startswith("_")])})
    pkg.__dict__.update({k: getattr(llama_mod, k) for k in llama_mod.__all__})
    pkg.__dict__.update(LlamaGrammar=LlamaGrammar, BaseLlamaCache=BaseLlamaCache, LlamaCache=LlamaCache,
                        LlamaRAMCache=LlamaRAMCache, LlamaDiskCache=LlamaDiskCache,
                        LlamaDraftModel=llama_mod.LlamaDraftModel,
                        LlamaPromptLookupDecoding=llama_mod.LlamaPromptLookupDecoding,
                        BaseLlamaTokenizer=tokenizer.BaseLlamaTokenizer, LlamaTokenizer=tokenizer.LlamaTokenizer)
    from . import __version__

    pkg.__version__ = __version__
    low = _low_level_module(llama_api)
    pkg.__dict__.update({k: getattr(low, k) for k in low.__all__ if k not in pkg.__dict__})
    subs = {"llama": llama_mod, "llama_cpp": low, "llama_types": llama_types,
            "llama_chat_format": llama_chat_format, "llama_speculative": speculative, "llama_grammar": grammar,
            "llama_cache": cache, "llama_tokenizer": tokenizer, "_internals": internals}
    for k in [k for k in sys.modules if k == "llama_cpp" or k.startswith("llama_cpp.")]:
        del sys.modules[k]
    sys.modules["llama_cpp"] = pkg
    for name, mod in subs.items():
        sys.modules[f"llama_cpp.{name}"] = mod
        setattr(pkg, name, mod)
    return pkg
