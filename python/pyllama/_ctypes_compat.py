"""The ctypes type names llama-cpp-python's low-level ``llama_cpp.llama_cpp`` module
exposes and code written for it uses (``llama_token``, ``llama_token_data``, the callback
types, the pointer type names), and the llama.h enum values it defines that
:mod:`pyllama.llama_api` does not (file types, pre-tokenizer types, more GGML types: values
as llama.h's, for code that names them; pyllama need not run every one), for
:mod:`pyllama.compat` to offer beside :mod:`pyllama.llama_api` (whose own names win).

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
]  # + the constants at the end

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

# llama.h enum values (llama-cpp-python 0.3.36's llama_cpp.py)
GGML_TYPE_IQ2_XXS = 16
GGML_TYPE_IQ2_XS = 17
GGML_TYPE_IQ3_XXS = 18
GGML_TYPE_IQ1_S = 19
GGML_TYPE_IQ3_S = 21
GGML_TYPE_IQ2_S = 22
GGML_TYPE_I8 = 24
GGML_TYPE_I16 = 25
GGML_TYPE_I32 = 26
GGML_TYPE_I64 = 27
GGML_TYPE_F64 = 28
GGML_TYPE_IQ1_M = 29
GGML_TYPE_MXFP4 = 39
GGML_TYPE_NVFP4 = 40
GGML_TYPE_Q1_0 = 41
GGML_TYPE_Q2_0 = 42
GGML_TYPE_COUNT = 43

LLAMA_VOCAB_TYPE_PLAMO2 = 6
LLAMA_VOCAB_TYPE_TEST = 7

LLAMA_VOCAB_PRE_TYPE_DEFAULT = 0
LLAMA_VOCAB_PRE_TYPE_LLAMA3 = 1
LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM = 2
LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_CODER = 3
LLAMA_VOCAB_PRE_TYPE_FALCON = 4
LLAMA_VOCAB_PRE_TYPE_MPT = 5
LLAMA_VOCAB_PRE_TYPE_STARCODER = 6
LLAMA_VOCAB_PRE_TYPE_GPT2 = 7
LLAMA_VOCAB_PRE_TYPE_REFACT = 8
LLAMA_VOCAB_PRE_TYPE_COMMAND_R = 9
LLAMA_VOCAB_PRE_TYPE_STABLELM2 = 10
LLAMA_VOCAB_PRE_TYPE_QWEN2 = 11
LLAMA_VOCAB_PRE_TYPE_OLMO = 12
LLAMA_VOCAB_PRE_TYPE_DBRX = 13
LLAMA_VOCAB_PRE_TYPE_SMAUG = 14
LLAMA_VOCAB_PRE_TYPE_PORO = 15
LLAMA_VOCAB_PRE_TYPE_CHATGLM3 = 16
LLAMA_VOCAB_PRE_TYPE_CHATGLM4 = 17
LLAMA_VOCAB_PRE_TYPE_VIKING = 18
LLAMA_VOCAB_PRE_TYPE_JAIS = 19
LLAMA_VOCAB_PRE_TYPE_TEKKEN = 20
LLAMA_VOCAB_PRE_TYPE_SMOLLM = 21
LLAMA_VOCAB_PRE_TYPE_CODESHELL = 22
LLAMA_VOCAB_PRE_TYPE_BLOOM = 23
LLAMA_VOCAB_PRE_TYPE_GPT3_FINNISH = 24
LLAMA_VOCAB_PRE_TYPE_EXAONE = 25
LLAMA_VOCAB_PRE_TYPE_CHAMELEON = 26
LLAMA_VOCAB_PRE_TYPE_MINERVA = 27
LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM = 28
LLAMA_VOCAB_PRE_TYPE_GPT4O = 29
LLAMA_VOCAB_PRE_TYPE_SUPERBPE = 30
LLAMA_VOCAB_PRE_TYPE_TRILLION = 31
LLAMA_VOCAB_PRE_TYPE_BAILINGMOE = 32
LLAMA_VOCAB_PRE_TYPE_LLAMA4 = 33
LLAMA_VOCAB_PRE_TYPE_PIXTRAL = 34
LLAMA_VOCAB_PRE_TYPE_SEED_CODER = 35

LLAMA_FTYPE_ALL_F32 = 0
LLAMA_FTYPE_MOSTLY_F16 = 1
LLAMA_FTYPE_MOSTLY_Q4_0 = 2
LLAMA_FTYPE_MOSTLY_Q4_1 = 3
LLAMA_FTYPE_MOSTLY_Q8_0 = 7
LLAMA_FTYPE_MOSTLY_Q5_0 = 8
LLAMA_FTYPE_MOSTLY_Q5_1 = 9
LLAMA_FTYPE_MOSTLY_Q2_K = 10
LLAMA_FTYPE_MOSTLY_Q3_K_S = 11
LLAMA_FTYPE_MOSTLY_Q3_K_M = 12
LLAMA_FTYPE_MOSTLY_Q3_K_L = 13
LLAMA_FTYPE_MOSTLY_Q4_K_S = 14
LLAMA_FTYPE_MOSTLY_Q4_K_M = 15
LLAMA_FTYPE_MOSTLY_Q5_K_S = 16
LLAMA_FTYPE_MOSTLY_Q5_K_M = 17
LLAMA_FTYPE_MOSTLY_Q6_K = 18
LLAMA_FTYPE_MOSTLY_IQ2_XXS = 19
LLAMA_FTYPE_MOSTLY_IQ2_XS = 20
LLAMA_FTYPE_MOSTLY_Q2_K_S = 21
LLAMA_FTYPE_MOSTLY_IQ3_XS = 22
LLAMA_FTYPE_MOSTLY_IQ3_XXS = 23
LLAMA_FTYPE_MOSTLY_IQ1_S = 24
LLAMA_FTYPE_MOSTLY_IQ4_NL = 25
LLAMA_FTYPE_MOSTLY_IQ3_S = 26
LLAMA_FTYPE_MOSTLY_IQ3_M = 27
LLAMA_FTYPE_MOSTLY_IQ2_S = 28
LLAMA_FTYPE_MOSTLY_IQ2_M = 29
LLAMA_FTYPE_MOSTLY_IQ4_XS = 30
LLAMA_FTYPE_MOSTLY_IQ1_M = 31
LLAMA_FTYPE_MOSTLY_BF16 = 32
LLAMA_FTYPE_MOSTLY_TQ1_0 = 36
LLAMA_FTYPE_MOSTLY_TQ2_0 = 37
LLAMA_FTYPE_MOSTLY_MXFP4_MOE = 38
LLAMA_FTYPE_MOSTLY_NVFP4 = 39
LLAMA_FTYPE_MOSTLY_Q1_0 = 40
LLAMA_FTYPE_MOSTLY_Q2_0 = 41

__all__ += [n for n in list(globals()) if n.startswith(("LLAMA_", "GGML_"))]
