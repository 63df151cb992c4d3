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

from . import _api_check as _chk
from . import _core
from ._api_check import checked, describe, int32, opt_text, size, text
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


@checked(load_mode=int32)
def llama_load_mode_name(load_mode: int) -> bytes:
    """b"auto", b"none", b"mmap", b"mlock", b"mmap+mlock" or b"dio"."""
    try:
        return _MODE_BY_VALUE[load_mode].encode()
    except KeyError:
        raise ValueError(f"llama_load_mode_name: load_mode = {load_mode} is not a load mode "
                         f"(known: {sorted(_MODE_BY_VALUE)})") from None


@checked(s=text)
def llama_load_mode_from_str(s: Union[str, bytes]) -> int:
    """The llama_load_mode value of a name; ValueError for an unknown name (llama.cpp
    throws std::invalid_argument)."""
    name = s.decode("utf-8", "replace") if isinstance(s, bytes) else s
    if name not in LOAD_MODES:
        raise ValueError(f"llama_load_mode_from_str: s = {name!r} is not a load mode (known: {', '.join(LOAD_MODES)})")
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


# -- argument checkers (see _api_check): each names the function and the parameter

_PARAMS = _chk.instance(llama_model_params, "a llama_model_params (llama_model_default_params())")


def _MODEL(v: Any, fn: str, name: str) -> Model:
    """A loaded, not freed, llama_model."""
    if not isinstance(v, Model):
        hint = " (wrap a _core.Model with pyllama.Model(core))" if isinstance(v, _core.Model) else ""
        raise TypeError(f"{fn}: {name} must be a llama_model (llama_model_load_from_file), got {describe(v)}{hint}")
    if _chk.is_freed(v):
        raise ValueError(f"{fn}: {name} has been freed (llama_model_free)")
    return v


def _path(v: Any, fn: str, name: str):
    if isinstance(v, (str, bytes)) or hasattr(v, "__fspath__"):
        return v
    raise TypeError(f"{fn}: {name} must be a path (str, bytes or os.PathLike), got {describe(v)}")


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


@checked(path_model=_path, params=_PARAMS)
def llama_model_load_from_file(path_model: Union[str, bytes], params: llama_model_params) -> Optional[Model]:
    """Load a model (a split model's parts are found from its first part). None on failure."""
    return _load([_fspath(path_model)], params)


def llama_model_load_from_splits(paths: Sequence[Union[str, bytes]], *args: Any) -> Optional[Model]:
    """``llama_model_load_from_splits(paths, n_paths, params)`` as in llama.h (or
    ``(paths, params)``): every part of a split model, in order."""
    fn = "llama_model_load_from_splits"
    if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__"):
        raise TypeError(f"{fn}: paths must be a sequence of paths (a list, even for one part), got {describe(paths)}")
    try:
        paths = list(paths)
    except TypeError:
        raise TypeError(f"{fn}: paths must be a sequence of paths, got {describe(paths)}") from None
    if len(args) == 2:
        n_paths, params = args
        n_paths = int32(n_paths, fn, "n_paths")
        if not 0 <= n_paths <= len(paths):
            raise ValueError(f"{fn}: n_paths = {n_paths} outside [0, len(paths) = {len(paths)}]")
        paths = paths[:n_paths]
    elif len(args) == 1:
        (params,) = args
    else:
        raise TypeError(f"{fn}(paths, n_paths, params): got {1 + len(args)} arguments")
    _PARAMS(params, fn, "params")
    for i, p in enumerate(paths):
        _path(p, fn, f"paths[{i}]")
    if not paths:
        log.error("%s: list of splits is empty", fn)
        return None
    return _load([_fspath(p) for p in paths], params)


@checked(model=_chk.instance(Model, "a llama_model (llama_model_load_from_file)", none_ok=True))
def llama_model_free(model: Optional[Model]) -> None:
    """Drop the model's reference to the weights (the mapping closes once no context or
    array uses them any more). Any later use of the model, or of a context made from it,
    through these functions is a ValueError (llama.cpp would read freed memory); NULL and
    a second free are no-ops."""
    if model is not None:
        model._metadata = None
        _chk.mark_freed(model)


@checked(model=_MODEL)
def llama_model_n_ctx_train(model: Model) -> int:
    return model.n_ctx_train


@checked(model=_MODEL)
def llama_model_n_embd(model: Model) -> int:
    return model.n_embd


@checked(model=_MODEL)
def llama_model_n_layer(model: Model) -> int:
    return model.n_layer


@checked(model=_MODEL)
def llama_model_n_head(model: Model) -> int:
    return model.n_head


@checked(model=_MODEL)
def llama_model_n_head_kv(model: Model) -> int:
    return model.n_head_kv


@checked(model=_MODEL)
def llama_model_n_params(model: Model) -> int:
    return model.n_params


@checked(model=_MODEL)
def llama_model_size(model: Model) -> int:
    return model.size


@checked(model=_MODEL)
def llama_model_ftype(model: Model) -> int:
    return model.ftype


def _out(buf: Any, buf_size: int, fn: str):
    """``buf`` as a writable byte view of at least ``buf_size`` bytes (None: no buffer,
    allowed with buf_size 0, llama.h's size query)."""
    return _chk.bytes_out(buf, fn, "buf", buf_size, "buf_size")


def _write(mv: Optional[memoryview], buf_size: int, s: str) -> int:
    """snprintf(buf, buf_size, "%s", s): the NUL-terminated prefix that fits; the full length."""
    data = s.encode("utf-8")
    if mv is not None and buf_size > 0:
        n = min(len(data), buf_size - 1)
        mv[:n] = data[:n]
        mv[n] = 0
    return len(data)


def _write_empty(mv: Optional[memoryview], buf_size: int) -> int:
    if mv is not None and buf_size > 0:
        mv[0] = 0
    return -1


@checked(model=_MODEL, buf_size=size)
def llama_model_desc(model: Model, buf: Any = None, buf_size: int = 0) -> Union[int, str]:
    """Writes e.g. "llama 256M Q4_1" into buf and returns its length; without a buffer,
    returns the string."""
    if buf is None and buf_size == 0:
        return model.desc
    return _write(_out(buf, buf_size, "llama_model_desc"), buf_size, model.desc)


def _meta_items(model: Model) -> list[tuple[str, str]]:
    cache = getattr(model, "_meta_items", None)
    if cache is None:
        cache = list(model.meta().items())
        model._meta_items = cache  # type: ignore[attr-defined]
    return cache


@checked(model=_MODEL, key=text, buf_size=size)
def llama_model_meta_val_str(model: Model, key: Union[str, bytes], buf: Any, buf_size: int) -> int:
    """The value of a (non-array) metadata key as a string; -1 if absent."""
    mv = _out(buf, buf_size, "llama_model_meta_val_str")
    k = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
    for kk, v in _meta_items(model):
        if kk == k:
            return _write(mv, buf_size, v)
    return _write_empty(mv, buf_size)


@checked(model=_MODEL)
def llama_model_meta_count(model: Model) -> int:
    return len(_meta_items(model))


@checked(model=_MODEL, i=int32, buf_size=size)
def llama_model_meta_key_by_index(model: Model, i: int, buf: Any, buf_size: int) -> int:
    mv = _out(buf, buf_size, "llama_model_meta_key_by_index")
    items = _meta_items(model)
    if not 0 <= i < len(items):
        return _write_empty(mv, buf_size)
    return _write(mv, buf_size, items[i][0])


@checked(model=_MODEL, i=int32, buf_size=size)
def llama_model_meta_val_str_by_index(model: Model, i: int, buf: Any, buf_size: int) -> int:
    mv = _out(buf, buf_size, "llama_model_meta_val_str_by_index")
    items = _meta_items(model)
    if not 0 <= i < len(items):
        return _write_empty(mv, buf_size)
    return _write(mv, buf_size, items[i][1])


@checked(model=_MODEL, name=opt_text)
def llama_model_chat_template(model: Model, name: Optional[Union[str, bytes]]) -> Optional[bytes]:
    """The model's chat template (or the named one), or None."""
    n = name.decode("utf-8", "replace") if isinstance(name, bytes) else name
    t = model.chat_template(n or None)
    return None if t is None else t.encode("utf-8")


__all__ = [n for n in dir() if n.startswith(("llama_", "LLAMA_"))]
