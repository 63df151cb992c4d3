"""The ctypes type names llama-cpp-python's low-level ``llama_cpp.llama_cpp`` module
exposes and code written for it uses (``llama_token``, ``llama_token_data``, the callback
types, the pointer type names), for :mod:`pyllama.compat` to offer beside
:mod:`pyllama.llama_api`'s functions.

pyllama's llama.h functions take numpy arrays, bytearrays, ctypes arrays and plain Python
objects, so these are what llama-cpp-python code builds its arguments with:

- ``(llama_token * n)()`` is a buffer llama_tokenize can fill, ``llama_token(5)`` a token;
- ``llama_log_callback(f)`` / ``llama_progress_callback(f)`` wrap a Python function as
  llama-cpp-python's decorators do (the result stays callable from Python, which is how
  pyllama calls it: ``(level, text: bytes, user_data)`` / ``(progress, user_data)``);
- the opaque handle types (``llama_model_p``, ``llama_context_p``, ...) are NewTypes, for
  type hints only, as there: the handles themselves are pyllama's objects.
"""

from __future__ import annotations

import ctypes
from typing import NewType

__all__ = [
    "llama_token", "llama_token_p", "llama_pos", "llama_seq_id", "llama_state_seq_flags",
    "llama_token_data", "llama_token_data_p", "llama_progress_callback", "llama_log_callback",
    "ggml_abort_callback", "llama_vocab_p", "llama_vocab_p_ctypes", "llama_model_p", "llama_model_p_ctypes",
    "llama_context_p", "llama_context_p_ctypes", "llama_memory_t_ctypes", "llama_kv_cache_p",
    "llama_kv_cache_p_ctypes", "llama_adapter_lora_p", "llama_adapter_lora_p_ctypes", "llama_sampler_context_t",
]

llama_pos = ctypes.c_int32
llama_token = ctypes.c_int32
llama_token_p = ctypes.POINTER(llama_token)
llama_seq_id = ctypes.c_int32
llama_state_seq_flags = ctypes.c_uint32


class llama_token_data(ctypes.Structure):  # noqa: N801 (llama.h's type name)
    """llama.h's llama_token_data: ``id`` (llama_token), ``logit``, ``p`` (float). pyllama's
    samplers work on :class:`pyllama.sampling.TokenDataArray` (llama_token_data_array),
    whose ``ids`` / ``logits`` / ``p`` arrays hold the same fields."""

    _fields_ = [("id", llama_token), ("logit", ctypes.c_float), ("p", ctypes.c_float)]


llama_token_data_p = ctypes.POINTER(llama_token_data)

# typedef bool (*llama_progress_callback)(float progress, void * user_data);
llama_progress_callback = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_float, ctypes.c_void_p)
# typedef void (*ggml_log_callback)(enum ggml_log_level level, const char * text, void * user_data);
llama_log_callback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
# typedef bool (*ggml_abort_callback)(void * data);
ggml_abort_callback = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p)

# opaque handles: names for type hints (llama-cpp-python's NewTypes)
llama_vocab_p = NewType("llama_vocab_p", int)
llama_vocab_p_ctypes = ctypes.c_void_p
llama_model_p = NewType("llama_model_p", int)
llama_model_p_ctypes = ctypes.c_void_p
llama_context_p = NewType("llama_context_p", int)
llama_context_p_ctypes = ctypes.c_void_p
llama_memory_t_ctypes = ctypes.c_void_p
llama_kv_cache_p = NewType("llama_kv_cache_p", int)
llama_kv_cache_p_ctypes = ctypes.c_void_p
llama_adapter_lora_p = ctypes.c_void_p
llama_adapter_lora_p_ctypes = ctypes.POINTER(ctypes.c_void_p)
llama_sampler_context_t = ctypes.c_void_p
