"""llama.h-style LoRA adapter and control-vector functions (see llama_api.py).

A ``llama_adapter_lora`` is a :class:`pyllama.adapter.LoraAdapter`. As in llama.h,
``llama_adapter_lora_init`` returns None (the reason logged on the ``pyllama`` logger) when
the file cannot be used; the metadata functions write into a caller's buffer and return
the length, or -1; ``llama_set_adapter_cvec`` returns 0 or -1.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Union

import numpy as np

from . import _api_check as _chk
from ._api_check import checked, describe, int32, size, text
from ._api_context import _CTX
from ._api_model import _out, _write, _write_empty
from .adapter import LoraAdapter
from .context import Context, _core_model_of

log = logging.getLogger("pyllama")

llama_adapter_lora = LoraAdapter


def _ADAPTER(v: Any, fn: str, name: str) -> LoraAdapter:
    if not isinstance(v, LoraAdapter):
        raise TypeError(f"{fn}: {name} must be a llama_adapter_lora (llama_adapter_lora_init), got {describe(v)}")
    if _chk.is_freed(v):
        raise ValueError(f"{fn}: {name} has been freed (llama_adapter_lora_free)")
    return v


def _model_or_none(model: Any, fn: str):
    if model is None:
        log.error("%s: model cannot be NULL", fn)
        return None
    try:
        _core_model_of(model)
    except TypeError:
        raise TypeError(f"{fn}: model must be a llama_model (llama_model_load_from_file), got {describe(model)}") from None
    if _chk.is_freed(model):
        log.error("%s: model has been freed (llama_model_free)", fn)
        return None
    return model


def llama_adapter_lora_init(model, path_lora: Union[str, bytes]) -> Optional[LoraAdapter]:
    """Load a LoRA adapter for ``model``; None (the reason logged) when the file is missing,
    malformed, or not an adapter for this model."""
    fn = "llama_adapter_lora_init"
    path = text(path_lora, fn, "path_lora")
    path = path.decode("utf-8", "surrogateescape") if isinstance(path, bytes) else path
    if _model_or_none(model, fn) is None:
        return None
    try:
        return LoraAdapter(model, path)
    except Exception as e:  # llama.h reports through the log and a null adapter
        log.error("%s: failed to load lora adapter from '%s': %s", fn, path, e)
        return None


def llama_adapter_lora_init_from_file_ptr(model, file: Any) -> Optional[LoraAdapter]:
    """Load a LoRA adapter from an open binary file object, reading from its current
    position to its end (llama.h takes a ``FILE *``; here any object with ``read()``)."""
    fn = "llama_adapter_lora_init_from_file_ptr"
    if file is None:
        log.error("%s: file is NULL", fn)
        return None
    if not callable(getattr(file, "read", None)):
        raise TypeError(f"{fn}: file must be a binary file object (open(path, 'rb')), got {describe(file)}")
    if _model_or_none(model, fn) is None:
        return None
    name = str(getattr(file, "name", "<file>"))
    try:
        data = file.read()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"{fn}: file.read() returned {describe(data)}, not bytes (open the file in 'rb' mode)")
        return LoraAdapter.from_bytes(model, bytes(data), name)
    except TypeError:
        raise
    except Exception as e:
        log.error("%s: failed to load lora adapter from '%s': %s", fn, name, e)
        return None


@checked(adapter=_chk.instance(LoraAdapter, "a llama_adapter_lora", none_ok=True))
def llama_adapter_lora_free(adapter: Optional[LoraAdapter]) -> None:
    """Free an adapter (None is a no-op). A context that still has it set keeps applying
    it (the data lives until the context drops it); any other use of it is an error."""
    if adapter is not None:
        _chk.mark_freed(adapter)


@checked(adapter=_ADAPTER, key=text, buf_size=size)
def llama_adapter_meta_val_str(adapter: LoraAdapter, key: Union[str, bytes], buf: Any, buf_size: int) -> int:
    """A scalar metadata value of the adapter as a string; -1 when the key is absent."""
    mv = _out(buf, buf_size, "llama_adapter_meta_val_str")
    k = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
    v = adapter.metadata.get(k)
    return _write_empty(mv, buf_size) if v is None else _write(mv, buf_size, v)


@checked(adapter=_ADAPTER)
def llama_adapter_meta_count(adapter: LoraAdapter) -> int:
    return len(adapter.metadata)


@checked(adapter=_ADAPTER, i=int32, buf_size=size)
def llama_adapter_meta_key_by_index(adapter: LoraAdapter, i: int, buf: Any, buf_size: int) -> int:
    mv = _out(buf, buf_size, "llama_adapter_meta_key_by_index")
    keys = list(adapter.metadata)
    return _write(mv, buf_size, keys[i]) if 0 <= i < len(keys) else _write_empty(mv, buf_size)


@checked(adapter=_ADAPTER, i=int32, buf_size=size)
def llama_adapter_meta_val_str_by_index(adapter: LoraAdapter, i: int, buf: Any, buf_size: int) -> int:
    mv = _out(buf, buf_size, "llama_adapter_meta_val_str_by_index")
    vals = list(adapter.metadata.values())
    return _write(mv, buf_size, vals[i]) if 0 <= i < len(vals) else _write_empty(mv, buf_size)


@checked(adapter=_chk.instance(LoraAdapter, "a llama_adapter_lora", none_ok=True))
def llama_adapter_get_alora_n_invocation_tokens(adapter: Optional[LoraAdapter]) -> int:
    """How many invocation tokens an activated LoRA has (0 for None or a plain LoRA)."""
    return 0 if adapter is None else len(adapter.alora_invocation_tokens)


@checked(adapter=_ADAPTER)
def llama_adapter_get_alora_invocation_tokens(adapter: LoraAdapter) -> np.ndarray:
    """The invocation tokens of an activated LoRA, as an int32 array (empty otherwise)."""
    return np.array(adapter.alora_invocation_tokens, dtype=np.int32)


@checked(ctx=_CTX)
def llama_set_adapters_lora(ctx: Context, adapters: Any, n_adapters: int, scales: Any) -> int:
    """Set the context's LoRA adapters: the first ``n_adapters`` of ``adapters`` with the
    matching ``scales`` (n_adapters 0 removes them all: the plain model's logits again).
    Returns 0, or -1 (the reason logged) when an adapter was loaded for another model."""
    fn = "llama_set_adapters_lora"
    n = size(n_adapters, fn, "n_adapters")
    if n == 0:
        ctx.set_lora_adapters([])
        return 0
    if adapters is None or scales is None:
        raise ValueError(f"{fn}: adapters and scales cannot be NULL with n_adapters = {n}")
    try:
        ads, sc = list(adapters)[:n], [float(s) for s in list(scales)[:n]]
    except TypeError:
        raise TypeError(f"{fn}: adapters and scales must be sequences, got {describe(adapters)} and "
                        f"{describe(scales)}") from None
    if len(ads) < n or len(sc) < n:
        raise ValueError(f"{fn}: n_adapters = {n} but {len(ads)} adapters and {len(sc)} scales were given")
    for i, a in enumerate(ads):
        _ADAPTER(a, fn, f"adapters[{i}]")
    try:
        ctx.set_lora_adapters(list(zip(ads, sc)))
    except ValueError as e:
        log.error("%s: %s", fn, e)
        return -1
    return 0


@checked(ctx=_CTX)
def llama_set_adapter_cvec(ctx: Context, data: Any, len: int, n_embd: int, il_start: int, il_end: int) -> int:  # noqa: A002
    """Apply a control vector: ``data`` float32 holding ``len`` values, n_embd per layer
    from layer 1, added to the output of layers il_start..il_end (both inclusive); data
    None clears it. Returns 0, or -1 (logged) when n_embd is not the model's."""
    fn = "llama_set_adapter_cvec"
    n = size(len, fn, "len")
    n_embd = int32(n_embd, fn, "n_embd")
    il_start = int32(il_start, fn, "il_start")
    il_end = int32(il_end, fn, "il_end")
    arr = None
    if data is not None:
        arr = np.ascontiguousarray(data, dtype=np.float32).ravel()
        if arr.size < n:
            raise ValueError(f"{fn}: len = {n} but data holds {arr.size} values")
        arr = arr[:n]
    try:
        ctx.set_cvec(arr, n_embd, il_start, il_end)
    except ValueError as e:
        log.error("%s: %s", fn, e)
        return -1
    return 0


__all__ = [n for n in dir() if n.startswith(("llama_", "LLAMA_"))]
