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
import weakref
from typing import Any, Callable, Optional, Sequence, Union

from . import _api_check as _chk
from . import _core
from ._api_check import checked, describe, int32, opt_text, size, text
from .errors import LoadCancelled, PyllamaError
from . import gpu as _gpu
from ._api_system import NOT_SUPPORTED
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
    compatibility: devices, tensor_buft_overrides, use_extra_bufts, no_host). n_gpu_layers,
    split_mode, main_gpu and tensor_split place the GPU offload as llama.cpp does when the
    extension has the GPU backend (see pyllama.gpu and Model.load); pyllama's default for
    n_gpu_layers is 0 where llama.cpp's is -1, all."""

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
            # without the GPU backend n_gpu_layers stays a compatibility field (see below)
            n_gpu_layers=int(params.n_gpu_layers) if _gpu.built() and not params.vocab_only else 0,
            main_gpu=int(params.main_gpu),
            split_mode=params.split_mode,
            tensor_split=params.tensor_split,
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
        model.drop_metadata()
        _META_ITEMS.pop(model, None)
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


#: model -> its meta() items, read once for the llama_model_meta_*_by_index calls
_META_ITEMS: "weakref.WeakKeyDictionary[Model, list[tuple[str, str]]]" = weakref.WeakKeyDictionary()


def _meta_items(model: Model) -> list[tuple[str, str]]:
    cache = _META_ITEMS.get(model)
    if cache is None:
        cache = _META_ITEMS[model] = list(model.meta().items())
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



# -- deprecated llama.h names --------------------------------------------------------------

llama_load_model_from_file = _chk.alias(llama_model_load_from_file, "llama_load_model_from_file")
llama_free_model = _chk.alias(llama_model_free, "llama_free_model")
llama_n_ctx_train = _chk.alias(llama_model_n_ctx_train, "llama_n_ctx_train")
llama_n_embd = _chk.alias(llama_model_n_embd, "llama_n_embd")
llama_n_layer = _chk.alias(llama_model_n_layer, "llama_n_layer")
llama_n_head = _chk.alias(llama_model_n_head, "llama_n_head")


# -- introspection --------------------------------------------------------------------------

# enum llama_rope_type (llama.h; GGML_ROPE_TYPE_* values)
LLAMA_ROPE_TYPE_NONE = -1
LLAMA_ROPE_TYPE_NORM = 0
LLAMA_ROPE_TYPE_NEOX = 2
LLAMA_ROPE_TYPE_MROPE = 8
LLAMA_ROPE_TYPE_IMROPE = 40
LLAMA_ROPE_TYPE_VISION = 24

_ROPE_TYPES = {"none": LLAMA_ROPE_TYPE_NONE, "norm": LLAMA_ROPE_TYPE_NORM, "neox": LLAMA_ROPE_TYPE_NEOX,
               "mrope": LLAMA_ROPE_TYPE_MROPE, "imrope": LLAMA_ROPE_TYPE_IMROPE, "vision": LLAMA_ROPE_TYPE_VISION}

# llama-arch.cpp's llm_arch_is_recurrent / _hybrid / _diffusion and llama_model_has_encoder /
# _has_decoder, by GGUF architecture name (a vocab-only load of one pyllama does not run
# still answers as llama.cpp would)
_RECURRENT = {"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"}
_HYBRID = {"jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe",
           "qwen3next", "kimi-linear", "qwen35", "qwen35moe"}
_DIFFUSION = {"dream", "llada", "llada-moe", "rnd1"}
_ENCODER = {"t5", "t5encoder", "eagle3", "dflash"}


@checked(model=_MODEL)
def llama_model_rope_type(model: Model) -> int:
    """LLAMA_ROPE_TYPE_NORM (llama, mistral3), _NEOX (qwen2/3, phi2/3, gemma*), ... as
    llama.cpp's llama_model_rope_type gives for the architecture."""
    rt = model.hparams.get("rope_type", "none")
    try:
        return _ROPE_TYPES[rt]
    except KeyError:
        raise ValueError(f"llama_model_rope_type: {model.arch} has an unknown rope type {rt!r}") from None


@checked(model=_MODEL)
def llama_model_n_embd_inp(model: Model) -> int:
    """Width of the input embeddings: n_embd (no deepstack/MTP inputs in pyllama's models)."""
    return model.n_embd


@checked(model=_MODEL)
def llama_model_n_embd_out(model: Model) -> int:
    """Width of the output embeddings: n_embd (no model pyllama runs projects them)."""
    return model.n_embd


@checked(model=_MODEL)
def llama_model_n_layer_nextn(model: Model) -> int:
    """Next-token-prediction (MTP) layers: 0 (pyllama loads none)."""
    return int(model.hparams.get("n_layer_nextn", 0))


@checked(model=_MODEL)
def llama_model_n_swa(model: Model) -> int:
    """The sliding-window size of the model's SWA layers, 0 when it has none."""
    return int(model.hparams.get("n_swa") or 0)


@checked(model=_MODEL)
def llama_model_rope_freq_scale_train(model: Model) -> float:
    """1 / ``{arch}.rope.scaling.factor`` (1.0 without scaling), as llama.cpp."""
    return float(model.hparams.get("rope_freq_scale", 1.0))


def _cls_labels(model: Model) -> list:
    v = model.meta_value(f"{model.arch}.classifier.output_labels")
    return list(v) if isinstance(v, list) else []


@checked(model=_MODEL)
def llama_model_n_cls_out(model: Model) -> int:
    """Classifier outputs: the number of ``{arch}.classifier.output_labels``, else 1 (llama.cpp's default)."""
    return len(_cls_labels(model)) or 1


def _uint32(v: Any, fn: str, name: str) -> int:
    v = _chk.integer(v, fn, name)
    if not 0 <= v < 2**32:
        raise ValueError(f"{fn}: {name} = {v} does not fit uint32 [0, {2**32 - 1}]")
    return v


@checked(model=_MODEL, i=_uint32)
def llama_model_cls_label(model: Model, i: int) -> Optional[bytes]:
    """Label ``i`` of ``{arch}.classifier.output_labels``, None when there is none."""
    labels = _cls_labels(model)
    if i >= len(labels):
        return None
    v = labels[i]
    return v if isinstance(v, bytes) else str(v).encode()


# enum llama_model_meta_key
_META_KEYS = ("general.sampling.sequence", "general.sampling.top_k", "general.sampling.top_p",
              "general.sampling.min_p", "general.sampling.xtc_probability", "general.sampling.xtc_threshold",
              "general.sampling.temp", "general.sampling.penalty_last_n", "general.sampling.penalty_repeat",
              "general.sampling.mirostat", "general.sampling.mirostat_tau", "general.sampling.mirostat_eta")
(LLAMA_MODEL_META_KEY_SAMPLING_SEQUENCE, LLAMA_MODEL_META_KEY_SAMPLING_TOP_K, LLAMA_MODEL_META_KEY_SAMPLING_TOP_P,
 LLAMA_MODEL_META_KEY_SAMPLING_MIN_P, LLAMA_MODEL_META_KEY_SAMPLING_XTC_PROBABILITY,
 LLAMA_MODEL_META_KEY_SAMPLING_XTC_THRESHOLD, LLAMA_MODEL_META_KEY_SAMPLING_TEMP,
 LLAMA_MODEL_META_KEY_SAMPLING_PENALTY_LAST_N, LLAMA_MODEL_META_KEY_SAMPLING_PENALTY_REPEAT,
 LLAMA_MODEL_META_KEY_SAMPLING_MIROSTAT, LLAMA_MODEL_META_KEY_SAMPLING_MIROSTAT_TAU,
 LLAMA_MODEL_META_KEY_SAMPLING_MIROSTAT_ETA) = range(len(_META_KEYS))


@checked(key=int32)
def llama_model_meta_key_str(key: int) -> Optional[bytes]:
    """The GGUF key of a llama_model_meta_key (b"general.sampling.top_k"...), None for another value."""
    return _META_KEYS[key].encode() if 0 <= key < len(_META_KEYS) else None


@checked(model=_MODEL)
def llama_model_has_encoder(model: Model) -> bool:
    return model.arch in _ENCODER


@checked(model=_MODEL)
def llama_model_has_decoder(model: Model) -> bool:
    return model.arch != "t5encoder"


@checked(model=_MODEL)
def llama_model_decoder_start_token(model: Model) -> int:
    """-1 (LLAMA_TOKEN_NULL): only encoder-decoder models (T5) have one; pyllama runs none."""
    return -1


@checked(model=_MODEL)
def llama_model_is_recurrent(model: Model) -> bool:
    return model.arch in _RECURRENT


@checked(model=_MODEL)
def llama_model_is_hybrid(model: Model) -> bool:
    return model.arch in _HYBRID


@checked(model=_MODEL)
def llama_model_is_diffusion(model: Model) -> bool:
    return model.arch in _DIFFUSION


# -- loading from a file object, saving, building from user data ------------------------------


def _FILE(v: Any, fn: str, name: str):
    if not callable(getattr(v, "read", None)) or isinstance(v, (str, bytes)):
        raise TypeError(f"{fn}: {name} must be a binary file object open for reading (open(path, 'rb'), "
                        f"io.BytesIO), got {describe(v)}")
    return v


@checked(file=_FILE, params=_PARAMS)
def llama_model_load_from_file_ptr(file: Any, params: llama_model_params) -> Optional[Model]:
    """llama.h's FILE * form: ``file`` is a Python binary file object (``open(path, "rb")``,
    ``io.BytesIO``...) and the GGUF is read from its current position, so it may sit inside
    a larger file. A file at position 0 of a file on disk is loaded from its path (every
    load mode works, mmap included); otherwise the GGUF from the current position is first
    copied to a temporary file (every load mode works on it too), which is removed when the
    model is garbage-collected. None (reason logged) on failure."""
    import os
    import shutil
    import tempfile

    fn = "llama_model_load_from_file_ptr"
    try:
        pos = file.tell()
    except (OSError, AttributeError, ValueError):
        pos = None
    name = getattr(file, "name", None)
    if pos == 0 and isinstance(name, (str, bytes)) and os.path.isfile(name):
        return _load([_fspath(name)], params)
    fd, tmp = tempfile.mkstemp(suffix=".gguf", prefix="pyllama-")
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                shutil.copyfileobj(file, out, 1 << 20)
            except (OSError, ValueError, TypeError) as e:
                log.error("%s: cannot read the GGUF from file: %s", fn, e)
                model = None
            else:
                model = True
        if model:
            model = _load([tmp], params)
    except BaseException:
        _unlink(tmp)
        raise
    if model is None:
        _unlink(tmp)
    else:
        # the contexts re-check the mapped file by its name: keep it as long as the model
        weakref.finalize(model, _unlink, tmp)
    return model


def _unlink(path: str) -> None:
    import os

    try:
        os.unlink(path)
    except OSError:
        pass


# ggml type ids by name (ggml.h enum ggml_type), for the tensor infos of a saved file
_GGML_TYPE_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q8_1": 9,
                  "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q8_K": 15, "IQ2_XXS": 16,
                  "IQ2_XS": 17, "IQ3_XXS": 18, "IQ1_S": 19, "IQ4_NL": 20, "IQ3_S": 21, "IQ2_S": 22, "IQ4_XS": 23,
                  "I8": 24, "I16": 25, "I32": 26, "I64": 27, "F64": 28, "IQ1_M": 29, "BF16": 30, "TQ1_0": 34,
                  "TQ2_0": 35, "MXFP4": 39, "NVFP4": 40, "Q1_0": 41, "Q2_0": 42}
_GGUF_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                12: "<d"}


def _gguf_value(t: int, elem: Optional[int], v: Any, key: str) -> bytes:
    import struct

    if t == 8:
        b = v if isinstance(v, bytes) else str(v).encode("utf-8")
        return struct.pack("<Q", len(b)) + b
    if t == 9:
        if elem is None or elem == 9:
            raise ValueError(f"metadata key {key!r}: nested arrays cannot be written")
        return struct.pack("<IQ", elem, len(v)) + b"".join(_gguf_value(elem, None, x, key) for x in v)
    return struct.pack(_GGUF_SCALAR[t], v)


def _save_gguf(model: Model, path: str) -> None:
    """The model as one GGUF v3 file: its metadata (after kv_overrides; a split model's
    ``split.*`` keys dropped) and every tensor's bytes as loaded, aligned as
    ``general.alignment`` says (32 when absent)."""
    import struct

    core = model.core
    md = core.metadata()
    types = core.metadata_types()
    items = [(k, v) for k, v in md.items() if not k.startswith("split.")]
    align = int(md.get("general.alignment", 32) or 32)
    tensors = core.tensors()
    if core.n_files() == 1:
        tensors = sorted(tensors, key=lambda t: t[3])  # the file's order
    head = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(items))]
    for k, v in items:
        t, elem = types[k]
        kb = k.encode("utf-8")
        head.append(struct.pack("<Q", len(kb)) + kb + struct.pack("<I", t) + _gguf_value(t, elem, v, k))
    offset = 0
    offsets = []
    for name, ty, ne, _off, nbytes in tensors:
        if ty not in _GGML_TYPE_IDS:
            raise ValueError(f"tensor {name!r}: type {ty} has no ggml type id")
        nb = name.encode("utf-8")
        head.append(struct.pack("<Q", len(nb)) + nb + struct.pack("<I", len(ne))
                    + b"".join(struct.pack("<Q", d) for d in ne) + struct.pack("<IQ", _GGML_TYPE_IDS[ty], offset))
        offsets.append(offset)
        offset += -(-nbytes // align) * align
    header = b"".join(head)
    with open(path, "wb") as f:
        f.write(header)
        f.write(b"\0" * (-len(header) % align))
        for (name, _ty, _ne, _off, nbytes), off in zip(tensors, offsets):
            raw = core.tensor_raw(name)
            f.write(memoryview(raw))
            f.write(b"\0" * (-nbytes % align))


@checked(model=_MODEL, path_model=_path)
def llama_model_save_to_file(model: Model, path_model: Union[str, bytes]) -> None:
    """Write the model as one GGUF file (metadata after kv_overrides, tensors as loaded).
    A model loaded with vocab_only has no tensors to write: ValueError. I/O errors raise
    OSError (llama.cpp throws)."""
    if model.vocab_only:
        raise ValueError("llama_model_save_to_file: model was loaded with vocab_only: it has no tensors to save")
    _save_gguf(model, _fspath(path_model))


def llama_model_init_from_user(metadata: Any, set_tensor_data: Any, set_tensor_data_ud: Any,
                               params: llama_model_params) -> Optional[Model]:
    """Not supported: see NOT_SUPPORTED["llama_model_init_from_user"]."""
    raise NotImplementedError(f"llama_model_init_from_user: not supported by pyllama: "
                              f"{NOT_SUPPORTED['llama_model_init_from_user']}")


NOT_SUPPORTED["llama_model_init_from_user"] = (
    "it builds a model from a gguf_context and fills ggml tensors through a callback; pyllama has neither "
    "(write a GGUF file, e.g. with gguf-py's GGUFWriter, and load it with llama_model_load_from_file)")


__all__ = [n for n in dir() if n.startswith(("llama_", "LLAMA_"))]
