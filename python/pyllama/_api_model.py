"""llama.h-style model functions (pipeline steps 1-6): backend init, model params, loading
(one file or splits), model properties and metadata.

Names and argument order follow llama-cpp-python's low-level ``llama_cpp`` module, so code
written for it ports by changing the import. Strings may be passed as bytes (as there) or
str; functions that return a C string return bytes. Failures return None / -1 and log the
reason on the ``pyllama`` logger. Buffer-style functions (``llama_model_meta_val_str``...)
write a NUL-terminated string into ``buf`` (bytearray, numpy uint8/int8 array, ctypes
char array), truncated to ``buf_size`` like snprintf, and return the full length.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional, Sequence, Union

from .errors import LoadCancelled, PyllamaError
from .model import LOAD_MODES, Model, _fspath

log = logging.getLogger("pyllama")

# enum llama_load_mode
LLAMA_LOAD_MODE_AUTO = -1
LLAMA_LOAD_MODE_NONE = 0
LLAMA_LOAD_MODE_MMAP = 1
LLAMA_LOAD_MODE_MLOCK = 2
LLAMA_LOAD_MODE_MMAP_MLOCK = 3
LLAMA_LOAD_MODE_DIRECT_IO = 4

# enum llama_split_mode
LLAMA_SPLIT_MODE_NONE = 0
LLAMA_SPLIT_MODE_LAYER = 1
LLAMA_SPLIT_MODE_ROW = 2

# enum llama_model_kv_override_type
LLAMA_KV_OVERRIDE_TYPE_INT = 0
LLAMA_KV_OVERRIDE_TYPE_FLOAT = 1
LLAMA_KV_OVERRIDE_TYPE_BOOL = 2
LLAMA_KV_OVERRIDE_TYPE_STR = 3

LLAMA_FTYPE_GUESSED = 1024

_MODE_BY_VALUE = {v: k for k, v in LOAD_MODES.items()}
_backend = {"initialized": False, "t_start_us": 0}


def llama_backend_init() -> None:
    """Start the timers and register the CPU backend (always available)."""
    _backend["initialized"] = True
    _backend["t_start_us"] = time.perf_counter_ns() // 1000


def llama_backend_free() -> None:
    _backend["initialized"] = False


def llama_time_us() -> int:
    return time.perf_counter_ns() // 1000


def llama_supports_mmap() -> bool:
    return True


def llama_supports_mlock() -> bool:
    return True


def llama_load_mode_name(load_mode: int) -> bytes:
    """b"auto", b"none", b"mmap", b"mlock", b"mmap+mlock" or b"dio"."""
    try:
        return _MODE_BY_VALUE[int(load_mode)].encode()
    except KeyError:
        raise ValueError(f"unknown load mode {load_mode}") from None


def llama_load_mode_from_str(s: Union[str, bytes]) -> int:
    """The llama_load_mode value of a name; ValueError for an unknown name (llama.cpp
    throws std::invalid_argument)."""
    name = s.decode() if isinstance(s, bytes) else s
    if name not in LOAD_MODES:
        raise ValueError(f"unknown load mode: {name}")
    return LOAD_MODES[name]


class llama_model_kv_override:
    """One metadata override: ``key`` and a value of kind ``tag`` (LLAMA_KV_OVERRIDE_TYPE_*)."""

    def __init__(self, key: Union[str, bytes] = b"", tag: int = 0, value: Any = None):
        self.key = key
        self.tag = tag
        self.val_i64 = int(value) if tag == LLAMA_KV_OVERRIDE_TYPE_INT and value is not None else 0
        self.val_f64 = float(value) if tag == LLAMA_KV_OVERRIDE_TYPE_FLOAT and value is not None else 0.0
        self.val_bool = bool(value) if tag == LLAMA_KV_OVERRIDE_TYPE_BOOL else False
        self.val_str = value if tag == LLAMA_KV_OVERRIDE_TYPE_STR and value is not None else b""


class llama_model_params:
    """llama.h's struct llama_model_params (the fields pyllama reads, plus those kept for
    compatibility: n_gpu_layers, split_mode, main_gpu, tensor_split)."""

    def __init__(self) -> None:
        self.devices = None
        self.tensor_buft_overrides = None
        self.n_gpu_layers: int = 0
        self.split_mode: int = LLAMA_SPLIT_MODE_LAYER
        self.load_mode: int = LLAMA_LOAD_MODE_AUTO
        self.main_gpu: int = 0
        self.tensor_split = None
        #: progress_callback(progress: float, user_data) -> bool; False cancels.
        self.progress_callback: Optional[Callable[[float, Any], Any]] = None
        self.progress_callback_user_data: Any = None
        #: dict key -> bool/int/float/str, or a sequence of llama_model_kv_override
        self.kv_overrides: Any = None
        self.vocab_only: bool = False
        self.check_tensors: bool = False
        self.use_extra_bufts: bool = True
        self.no_host: bool = False
        self.no_alloc: bool = False
        # Older llama.h spelled the load mode as two booleans; honoured when changed.
        self.use_mmap: bool = True
        self.use_mlock: bool = False

    def __repr__(self) -> str:
        return "llama_model_params(" + ", ".join(f"{k}={v!r}" for k, v in vars(self).items()) + ")"


def llama_model_default_params() -> llama_model_params:
    return llama_model_params()


def _mode_of(params: llama_model_params) -> str:
    mode = _MODE_BY_VALUE.get(int(params.load_mode))
    if mode is None:
        raise ValueError(f"unknown load_mode {params.load_mode}")
    if mode == "auto" and (not params.use_mmap or params.use_mlock):
        mode = {(True, True): "mmap+mlock", (False, True): "mlock", (False, False): "none"}[
            (bool(params.use_mmap), bool(params.use_mlock))
        ]
    return mode


def _overrides_of(params: llama_model_params) -> Optional[dict[str, Any]]:
    kv = params.kv_overrides
    if not kv:
        return None
    if isinstance(kv, dict):
        return {(k.decode() if isinstance(k, bytes) else k): v for k, v in kv.items()}
    out: dict[str, Any] = {}
    for o in kv:
        key = o.key.decode() if isinstance(o.key, bytes) else str(o.key)
        if not key:  # llama.h's list ends with an empty key
            break
        if o.tag == LLAMA_KV_OVERRIDE_TYPE_INT:
            out[key] = int(o.val_i64)
        elif o.tag == LLAMA_KV_OVERRIDE_TYPE_FLOAT:
            out[key] = float(o.val_f64)
        elif o.tag == LLAMA_KV_OVERRIDE_TYPE_BOOL:
            out[key] = bool(o.val_bool)
        elif o.tag == LLAMA_KV_OVERRIDE_TYPE_STR:
            v = o.val_str
            out[key] = v.decode() if isinstance(v, bytes) else str(v)
        else:
            raise ValueError(f"kv_override '{key}': unknown tag {o.tag}")
    return out


def _load(paths: list[str], params: llama_model_params) -> Optional[Model]:
    if not _backend["initialized"]:
        log.error("llama_model_load: no backend registered: call llama_backend_init() first")
        return None
    progress = None
    if params.progress_callback is not None:
        cb, ud = params.progress_callback, params.progress_callback_user_data

        def progress(p: float) -> bool:
            # As in llama.h the callback's bool is the answer: a falsy value cancels.
            return bool(cb(p, ud))

    try:
        model = Model.load(
            paths,
            load_mode=_mode_of(params),
            progress=progress,
            vocab_only=bool(params.vocab_only),
            check_tensors=bool(params.check_tensors),
            kv_overrides=_overrides_of(params),
        )
        if params.vocab_only:
            # The vocabulary is all such a load is for: surface its errors now. Otherwise
            # it is built on first use (llama_model_get_vocab), so loading stays light.
            model.vocab
        return model
    except LoadCancelled:
        log.info("llama_model_load: cancelled by the progress callback")
        return None
    except (PyllamaError, OSError, ValueError, TypeError) as e:
        log.error("llama_model_load: failed to load model: %s", e)
        return None


def llama_model_load_from_file(path_model: Union[str, bytes], params: llama_model_params) -> Optional[Model]:
    """Load a model (a split model's parts are found from its first part). None on failure."""
    return _load([_fspath(path_model)], params)


def llama_model_load_from_splits(paths: Sequence[Union[str, bytes]], *args: Any) -> Optional[Model]:
    """``llama_model_load_from_splits(paths, n_paths, params)`` as in llama.h (or
    ``(paths, params)``): every part of a split model, in order."""
    if len(args) == 2:
        n_paths, params = args
        paths = list(paths)[: int(n_paths)]
    elif len(args) == 1:
        (params,) = args
    else:
        raise TypeError("llama_model_load_from_splits(paths, n_paths, params)")
    if not paths:
        log.error("llama_model_load_from_splits: list of splits is empty")
        return None
    return _load([_fspath(p) for p in paths], params)


def llama_model_free(model: Optional[Model]) -> None:
    """Drop the model's reference to the weights (the mapping closes once no context or
    array uses them any more)."""
    if model is not None and hasattr(model, "_core"):
        model._metadata = None


def llama_model_n_ctx_train(model: Model) -> int:
    return model.n_ctx_train


def llama_model_n_embd(model: Model) -> int:
    return model.n_embd


def llama_model_n_layer(model: Model) -> int:
    return model.n_layer


def llama_model_n_head(model: Model) -> int:
    return model.n_head


def llama_model_n_head_kv(model: Model) -> int:
    return model.n_head_kv


def llama_model_n_params(model: Model) -> int:
    return model.n_params


def llama_model_size(model: Model) -> int:
    return model.size


def llama_model_ftype(model: Model) -> int:
    return model.ftype


def _write(buf: Any, buf_size: int, s: str) -> int:
    data = s.encode("utf-8")
    if buf is not None and buf_size > 0:
        mv = memoryview(buf).cast("B")
        n = min(len(data), int(buf_size) - 1, len(mv) - 1)
        if n >= 0:
            mv[:n] = data[:n]
            mv[n] = 0
    return len(data)


def llama_model_desc(model: Model, buf: Any = None, buf_size: int = 0) -> Union[int, str]:
    """Writes e.g. "llama 256M Q4_1" into buf and returns its length; without a buffer,
    returns the string."""
    if buf is None:
        return model.desc
    return _write(buf, buf_size, model.desc)


def _meta_items(model: Model) -> list[tuple[str, str]]:
    cache = getattr(model, "_meta_items", None)
    if cache is None:
        cache = list(model.meta().items())
        model._meta_items = cache  # type: ignore[attr-defined]
    return cache


def llama_model_meta_val_str(model: Model, key: Union[str, bytes], buf: Any, buf_size: int) -> int:
    """The value of a (non-array) metadata key as a string; -1 if absent."""
    k = key.decode() if isinstance(key, bytes) else key
    for kk, v in _meta_items(model):
        if kk == k:
            return _write(buf, buf_size, v)
    if buf is not None and buf_size > 0:
        memoryview(buf).cast("B")[0] = 0
    return -1


def llama_model_meta_count(model: Model) -> int:
    return len(_meta_items(model))


def llama_model_meta_key_by_index(model: Model, i: int, buf: Any, buf_size: int) -> int:
    items = _meta_items(model)
    if not 0 <= i < len(items):
        if buf is not None and buf_size > 0:
            memoryview(buf).cast("B")[0] = 0
        return -1
    return _write(buf, buf_size, items[i][0])


def llama_model_meta_val_str_by_index(model: Model, i: int, buf: Any, buf_size: int) -> int:
    items = _meta_items(model)
    if not 0 <= i < len(items):
        if buf is not None and buf_size > 0:
            memoryview(buf).cast("B")[0] = 0
        return -1
    return _write(buf, buf_size, items[i][1])


def llama_model_chat_template(model: Model, name: Optional[Union[str, bytes]]) -> Optional[bytes]:
    """The model's chat template (or the named one), or None."""
    n = name.decode() if isinstance(name, bytes) else name
    t = model.chat_template(n or None)
    return None if t is None else t.encode("utf-8")


__all__ = [n for n in dir() if n.startswith(("llama_", "LLAMA_"))]
