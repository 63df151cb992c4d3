"""llama.h's process-wide functions (see llama_api.py): version and system information,
logging, NUMA, thread pools, devices, split-file names, type names, quantization and
training entry points.

Logging: pyllama logs through the ``pyllama`` logger (Python logging). ``llama_log_set``
routes every record of it (and of its child loggers) to a llama.h-style callback
``callback(level, text, user_data)`` with ggml's levels (``GGML_LOG_LEVEL_*``) and ``text``
as bytes ending in a newline, as llama.cpp calls it; ``llama_log_set(None, None)`` gives
the records back to Python logging's handlers (pyllama's default, where llama.cpp's is a
print to stderr).

What pyllama cannot do raises ``NotImplementedError`` naming the reason (model
quantization, training); README.md lists those functions.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Any, Callable, Optional

from . import _api_check as _chk
from . import _core
from ._api_check import checked, describe, int32, integer, size

log = logging.getLogger("pyllama")

# ---------------------------------------------------------------------- version, system


def llama_version() -> bytes:
    """pyllama's version (llama.cpp returns its own build's version string)."""
    return _core.__version__.encode()


# (pyllama's feature name, llama.cpp's name) in the order ggml_backend_cpu_get_features
# lists them; AVX512_BW / AVX512_VL have no llama.cpp entry but pyllama's AVX-512 kernels
# need them, so they are listed too.
_FEATURE_NAMES = (
    ("sse3", "SSE3"), ("ssse3", "SSSE3"), ("avx", "AVX"), ("avxvnni", "AVX_VNNI"), ("avx2", "AVX2"),
    ("f16c", "F16C"), ("fma", "FMA"), ("avx512f", "AVX512"), ("avx512bw", "AVX512_BW"),
    ("avx512vl", "AVX512_VL"), ("avx512vnni", "AVX512_VNNI"), ("avx512bf16", "AVX512_BF16"),
    ("neon", "NEON"), ("fp16", "FP16_VA"), ("dotprod", "DOTPROD"),
)


def _cpu_features() -> dict[str, bool]:
    """The CPU features pyllama's kernel choice depends on, as the extension detected them
    (``_core.cpu_features``: the same probe ``pyllama info`` reports)."""
    feats, _vnni = _core.cpu_features()
    return dict(feats)


def llama_print_system_info() -> bytes:
    """llama.cpp's format: ``CPU : SSE3 = 1 | AVX = 1 | ... | `` listing the CPU features
    present that pyllama's kernels detect, then the kernel set in use."""
    feats = _cpu_features()
    s = "CPU : "
    for name, cname in _FEATURE_NAMES:
        if feats.get(name):
            s += f"{cname} = 1 | "
    s += f"KERNELS = {_core.kernel_set()} | "
    return s.encode()


def llama_max_devices() -> int:
    """llama.h's LLAMA_MAX_DEVICES: the most entries tensor_split may have (16); a model's
    layers are split over the usable GPU adapters (split_mode "layer")."""
    return 16


def llama_max_tensor_buft_overrides() -> int:
    """llama.cpp's fixed limit on tensor_buft_overrides entries (pyllama takes none)."""
    return 4096


def llama_supports_gpu_offload() -> bool:
    """True when the extension has the GPU backend (wgpu) and a usable adapter is there
    (a software one only with PYLLAMA_GPU=cpu-ok): see pyllama.gpu."""
    from . import gpu

    return gpu.available()


# ggml's device registry (ggml_backend_dev_*): the usable GPU adapters, then the CPU.
GGML_BACKEND_DEVICE_TYPE_CPU = 0
GGML_BACKEND_DEVICE_TYPE_GPU = 1
GGML_BACKEND_DEVICE_TYPE_ACCEL = 2
GGML_BACKEND_DEVICE_TYPE_IGPU = 3


class ggml_backend_dev:
    """One device of the registry: name, description, type (GGML_BACKEND_DEVICE_TYPE_*),
    memory (free, total) in bytes where known (wgpu reports no memory sizes: a GPU's
    total is its largest buffer, free 0), and for a GPU the adapter's wgpu report."""

    def __init__(self, name: str, description: str, type: int, memory: tuple[int, int],
                 info: Optional[dict] = None) -> None:
        self.name = name
        self.description = description
        self.type = type
        self.memory = memory
        self.info = info or {}

    def __repr__(self) -> str:
        return f"ggml_backend_dev({self.name!r}, {self.description!r}, type={self.type})"


def _devices() -> list[ggml_backend_dev]:
    from . import gpu

    out = []
    for i, d in enumerate(gpu.usable()):
        kind = GGML_BACKEND_DEVICE_TYPE_IGPU if d["type"] == "integrated" else GGML_BACKEND_DEVICE_TYPE_GPU
        out.append(ggml_backend_dev(f"WGPU{i}", f"{d['name']} ({d['backend']}, {d['type']})", kind,
                                    (0, int(d["max_buffer_size"])), d))
    import platform

    out.append(ggml_backend_dev("CPU", platform.processor() or platform.machine(), GGML_BACKEND_DEVICE_TYPE_CPU,
                                (0, 0)))
    return out


def ggml_backend_dev_count() -> int:
    """Devices in the registry: the usable GPU adapters, then the CPU."""
    return len(_devices())


@checked(index=size)
def ggml_backend_dev_get(index: int) -> ggml_backend_dev:
    devs = _devices()
    if index >= len(devs):
        raise IndexError(f"ggml_backend_dev_get: index {index} out of range (there are {len(devs)} devices)")
    return devs[index]


def ggml_backend_dev_name(dev: ggml_backend_dev) -> bytes:
    return dev.name.encode()


def ggml_backend_dev_description(dev: ggml_backend_dev) -> bytes:
    return dev.description.encode()


def ggml_backend_dev_type(dev: ggml_backend_dev) -> int:
    return dev.type


def ggml_backend_dev_memory(dev: ggml_backend_dev) -> tuple[int, int]:
    """(free, total) bytes: (0, largest buffer) for a GPU (wgpu reports no memory sizes),
    (0, 0) for the CPU."""
    return dev.memory


def llama_supports_rpc() -> bool:
    """False: no RPC backend."""
    return False


# ---------------------------------------------------------------------- logging

GGML_LOG_LEVEL_NONE = 0
GGML_LOG_LEVEL_DEBUG = 1
GGML_LOG_LEVEL_INFO = 2
GGML_LOG_LEVEL_WARN = 3
GGML_LOG_LEVEL_ERROR = 4
GGML_LOG_LEVEL_CONT = 5


def _ggml_level(levelno: int) -> int:
    if levelno >= logging.ERROR:
        return GGML_LOG_LEVEL_ERROR
    if levelno >= logging.WARNING:
        return GGML_LOG_LEVEL_WARN
    if levelno >= logging.INFO:
        return GGML_LOG_LEVEL_INFO
    return GGML_LOG_LEVEL_DEBUG


class _CallbackHandler(logging.Handler):
    """Hands each record of the ``pyllama`` logger to the llama_log_set callback."""

    def __init__(self, callback: Callable[[int, bytes, Any], Any], user_data: Any) -> None:
        super().__init__(logging.DEBUG)
        self.callback = callback
        self.user_data = user_data

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:
            self.handleError(record)
            return
        # llama.cpp's messages end in a newline; a callback that prints them relies on it
        self.callback(_ggml_level(record.levelno), (text + "\n").encode("utf-8", "replace"), self.user_data)


_log_state: dict[str, Any] = {"handler": None, "level": logging.NOTSET, "propagate": True}


def llama_log_set(log_callback: Optional[Callable[[int, bytes, Any], Any]], user_data: Any = None) -> None:
    """Send every message pyllama logs to ``log_callback(level, text, user_data)`` (level:
    GGML_LOG_LEVEL_DEBUG/INFO/WARN/ERROR; text: bytes ending in a newline) instead of
    Python logging's handlers, at every level down to DEBUG, as llama.cpp does. None
    gives the messages back to Python logging. Global, like llama.cpp's logger state."""
    _chk.callback(log_callback, "llama_log_set", "log_callback")
    old = _log_state["handler"]
    if old is not None:
        log.removeHandler(old)
        log.setLevel(_log_state["level"])
        log.propagate = _log_state["propagate"]
        _log_state["handler"] = None
    if log_callback is None:
        return
    h = _CallbackHandler(log_callback, user_data)
    _log_state.update(handler=h, level=log.level, propagate=log.propagate)
    log.addHandler(h)
    log.setLevel(logging.DEBUG)
    log.propagate = False


def _store(out: Any, value: Any, fn: str, name: str) -> None:
    """A C out-pointer argument: a one-element list (or None: nothing stored)."""
    if out is None:
        return
    if isinstance(out, list) and out:
        out[0] = value
        return
    raise TypeError(f"{fn}: {name} must be a one-element list to store into, or None, got {describe(out)}")


def llama_log_get(log_callback: Any = None, user_data: Any = None) -> tuple:
    """The callback and user data set with llama_log_set, as ``(callback, user_data)``
    (``(None, None)``: Python logging's handlers); llama.h's out-pointers may be passed as
    one-element lists, which receive them."""
    h = _log_state["handler"]
    cb, ud = (h.callback, h.user_data) if h is not None else (None, None)
    _store(log_callback, cb, "llama_log_get", "log_callback")
    _store(user_data, ud, "llama_log_get", "user_data")
    return cb, ud


# ---------------------------------------------------------------------- NUMA

GGML_NUMA_STRATEGY_DISABLED = 0
GGML_NUMA_STRATEGY_DISTRIBUTE = 1
GGML_NUMA_STRATEGY_ISOLATE = 2
GGML_NUMA_STRATEGY_NUMACTL = 3
GGML_NUMA_STRATEGY_MIRROR = 4
GGML_NUMA_STRATEGY_COUNT = 5


def _numa_nodes() -> int:
    try:
        return sum(1 for n in os.listdir("/sys/devices/system/node") if n.startswith("node") and n[4:].isdigit())
    except OSError:
        return 1


@checked(numa=int32)
def llama_numa_init(numa: int) -> None:
    """pyllama does no NUMA placement of its own: on a machine with one NUMA node (where
    ggml does nothing either) every strategy is a no-op; on several nodes a strategy
    other than DISABLED logs a warning that it is not applied (use numactl to place the
    process). A value outside enum ggml_numa_strategy is a ValueError."""
    if not 0 <= numa < GGML_NUMA_STRATEGY_COUNT:
        raise ValueError(f"llama_numa_init: numa = {numa} is not a ggml_numa_strategy "
                         f"(0..{GGML_NUMA_STRATEGY_COUNT - 1})")
    if numa != GGML_NUMA_STRATEGY_DISABLED and _numa_nodes() > 1:
        log.warning("llama_numa_init: pyllama does not place threads or memory per NUMA node; strategy %d is "
                    "not applied (run under numactl to bind the process)", numa)


# ---------------------------------------------------------------------- thread pools

GGML_SCHED_PRIO_LOW = -1
GGML_SCHED_PRIO_NORMAL = 0
GGML_SCHED_PRIO_MEDIUM = 1
GGML_SCHED_PRIO_HIGH = 2
GGML_SCHED_PRIO_REALTIME = 3


class ggml_threadpool_params:  # noqa: N801 (ggml's type name)
    """ggml.h's struct ggml_threadpool_params. pyllama's pool (rust/core threadpool.rs)
    takes its size from here; it spins briefly then parks (ggml's default poll = 50) and
    does not pin or reprioritise threads, so other values of ``prio``, ``poll``,
    ``cpumask`` and ``strict_cpu`` are refused by :func:`ggml_threadpool_new`."""

    def __init__(self, n_threads: int = 4) -> None:
        self.cpumask = None  # None / all-False: the default affinity
        self.n_threads = n_threads
        self.prio = GGML_SCHED_PRIO_NORMAL
        self.poll = 50
        self.strict_cpu = False
        self.paused = False

    def __repr__(self) -> str:
        return "ggml_threadpool_params(" + ", ".join(f"{k}={v!r}" for k, v in vars(self).items()) + ")"


@checked(n_threads=int32)
def ggml_threadpool_params_default(n_threads: int) -> ggml_threadpool_params:
    return ggml_threadpool_params(n_threads)


class ggml_threadpool:  # noqa: N801 (ggml's type name)
    """A thread pool handle: the number of threads a context uses while it is attached
    (llama_attach_threadpool). pyllama's contexts own their worker threads; attaching
    sizes them to the pool's ``n_threads``."""

    __slots__ = ("n_threads", "paused", "__weakref__")

    def __init__(self, n_threads: int, paused: bool) -> None:
        self.n_threads = n_threads
        self.paused = paused

    def __repr__(self) -> str:
        return f"ggml_threadpool(n_threads={self.n_threads})"


def ggml_threadpool_new(params: ggml_threadpool_params) -> ggml_threadpool:
    """A pool of ``params.n_threads`` threads. A paused pool resumes on its first use,
    as ggml's does. Priority, polling level, CPU mask and strict placement other than the
    defaults are a ValueError: pyllama cannot honour them."""
    fn = "ggml_threadpool_new"
    if not isinstance(params, ggml_threadpool_params):
        raise TypeError(f"{fn}: params must be a ggml_threadpool_params (ggml_threadpool_params_default(n)), "
                        f"got {describe(params)}")
    n = int32(params.n_threads, fn, "params.n_threads")
    if n < 1:
        raise ValueError(f"{fn}: params.n_threads = {n} must be >= 1")
    if integer(params.prio, fn, "params.prio") != GGML_SCHED_PRIO_NORMAL:
        raise ValueError(f"{fn}: params.prio = {params.prio}: pyllama does not change thread priorities "
                         "(only GGML_SCHED_PRIO_NORMAL)")
    if integer(params.poll, fn, "params.poll") != 50:
        raise ValueError(f"{fn}: params.poll = {params.poll}: pyllama's pool always spins briefly then parks "
                         "(ggml's default poll = 50); other polling levels are not supported")
    if params.cpumask is not None and any(params.cpumask):
        raise ValueError(f"{fn}: params.cpumask: pyllama does not pin threads to CPUs (use os.sched_setaffinity "
                         "or taskset on the process)")
    if params.strict_cpu:
        raise ValueError(f"{fn}: params.strict_cpu: pyllama does not pin threads to CPUs")
    return ggml_threadpool(n, bool(params.paused))


def ggml_threadpool_free(threadpool: Optional[ggml_threadpool]) -> None:
    if threadpool is not None and not isinstance(threadpool, ggml_threadpool):
        raise TypeError(f"ggml_threadpool_free: threadpool must be a ggml_threadpool, got {describe(threadpool)}")


def _pool(v: Any, fn: str, name: str, none_ok: bool) -> Optional[ggml_threadpool]:
    if v is None and none_ok:
        return None
    if not isinstance(v, ggml_threadpool):
        raise TypeError(f"{fn}: {name} must be a ggml_threadpool (ggml_threadpool_new)"
                        f"{' or None' if none_ok else ''}, got {describe(v)}")
    return v


#: context -> (n_threads, n_threads_batch) from before llama_attach_threadpool
_detached: "weakref.WeakKeyDictionary[Any, tuple[int, int]]" = weakref.WeakKeyDictionary()


def llama_attach_threadpool(ctx, threadpool: ggml_threadpool, threadpool_batch: Optional[ggml_threadpool]) -> None:
    """Run the context's single-token decodes on ``threadpool``'s thread count and its
    batches on ``threadpool_batch``'s (None: ``threadpool``'s), as llama.cpp does; the
    counts from before come back with llama_detach_threadpool."""
    from ._api_context import _CTX

    fn = "llama_attach_threadpool"
    ctx = _CTX(ctx, fn, "ctx")
    tp = _pool(threadpool, fn, "threadpool", none_ok=False)
    tpb = _pool(threadpool_batch, fn, "threadpool_batch", none_ok=True) or tp
    _detached.setdefault(ctx, (ctx.n_threads, ctx.n_threads_batch))
    ctx.set_n_threads(tp.n_threads, tpb.n_threads)
    tp.paused = tpb.paused = False


def llama_detach_threadpool(ctx) -> None:
    """Back to the thread counts the context had before llama_attach_threadpool (no-op
    when none is attached)."""
    from ._api_context import _CTX

    ctx = _CTX(ctx, "llama_detach_threadpool", "ctx")
    old = _detached.pop(ctx, None)
    if old is not None:
        ctx.set_n_threads(*old)


# ---------------------------------------------------------------------- names, splits


@checked(flash_attn_type=int32)
def llama_flash_attn_type_name(flash_attn_type: int) -> bytes:
    """b"auto", b"disabled" or b"enabled"; ValueError for another value (llama.cpp aborts)."""
    names = {-1: b"auto", 0: b"disabled", 1: b"enabled"}
    if flash_attn_type not in names:
        raise ValueError(f"llama_flash_attn_type_name: flash_attn_type = {flash_attn_type} is not a "
                         "llama_flash_attn_type (-1 auto, 0 disabled, 1 enabled)")
    return names[flash_attn_type]


_FTYPE_NAMES = {
    0: "all F32", 1: "F16", 32: "BF16", 40: "Q1_0", 41: "Q2_0", 2: "Q4_0", 3: "Q4_1", 8: "Q5_0", 9: "Q5_1",
    7: "Q8_0", 38: "MXFP4 MoE", 39: "NVFP4", 10: "Q2_K - Medium", 21: "Q2_K - Small", 11: "Q3_K - Small",
    12: "Q3_K - Medium", 13: "Q3_K - Large", 14: "Q4_K - Small", 15: "Q4_K - Medium", 16: "Q5_K - Small",
    17: "Q5_K - Medium", 18: "Q6_K", 36: "TQ1_0 - 1.69 bpw ternary", 37: "TQ2_0 - 2.06 bpw ternary",
    19: "IQ2_XXS - 2.0625 bpw", 20: "IQ2_XS - 2.3125 bpw", 28: "IQ2_S - 2.5 bpw", 29: "IQ2_M - 2.7 bpw",
    22: "IQ3_XS - 3.3 bpw", 23: "IQ3_XXS - 3.0625 bpw", 24: "IQ1_S - 1.5625 bpw", 31: "IQ1_M - 1.75 bpw",
    25: "IQ4_NL - 4.5 bpw", 30: "IQ4_XS - 4.25 bpw", 26: "IQ3_S - 3.4375 bpw", 27: "IQ3_S mix - 3.66 bpw",
}
LLAMA_FTYPE_GUESSED = 1024


@checked(ftype=int32)
def llama_ftype_name(ftype: int) -> bytes:
    """llama.cpp's name of a llama_ftype ("Q4_K - Medium"; "(guessed) " in front when
    LLAMA_FTYPE_GUESSED is set; "unknown, may not work" for other values)."""
    name = _FTYPE_NAMES.get(ftype & ~LLAMA_FTYPE_GUESSED, "unknown, may not work")
    return (("(guessed) " if ftype & LLAMA_FTYPE_GUESSED else "") + name).encode()


def _c_bytes(v: Any, fn: str, name: str) -> bytes:
    v = _chk.text(v, fn, name)
    return v.encode("utf-8", "surrogateescape") if isinstance(v, str) else bytes(v)


def _snprintf(mv, maxlen: int, data: bytes) -> None:
    """snprintf's effect on the buffer: the prefix that fits, NUL-terminated."""
    if mv is not None and maxlen > 0:
        n = min(len(data), maxlen - 1)
        mv[:n] = data[:n]
        mv[n] = 0


@checked(maxlen=size, split_no=int32, split_count=int32)
def llama_split_path(split_path: Any, maxlen: int, path_prefix: Any, split_no: int, split_count: int) -> int:
    """Write ``"%s-%05d-of-%05d.gguf" % (path_prefix, split_no + 1, split_count)`` into
    ``split_path`` (a writable byte buffer of at least ``maxlen`` bytes) as snprintf does and
    return its length, or 0 when it does not fit in ``maxlen`` (NUL included)."""
    fn = "llama_split_path"
    mv = _chk.bytes_out(split_path, fn, "split_path", maxlen, "maxlen")
    data = _c_bytes(path_prefix, fn, "path_prefix") + b"-%05d-of-%05d.gguf" % (split_no + 1, split_count)
    _snprintf(mv, maxlen, data)
    return 0 if len(data) >= maxlen else len(data)


@checked(maxlen=size, split_no=int32, split_count=int32)
def llama_split_prefix(split_prefix: Any, maxlen: int, split_path: Any, split_no: int, split_count: int) -> int:
    """If ``split_path`` ends in ``-%05d-of-%05d.gguf`` for (split_no + 1, split_count), write
    what comes before into ``split_prefix`` (truncated to ``maxlen`` with its NUL) and
    return its full length; otherwise 0 and nothing written."""
    fn = "llama_split_prefix"
    mv = _chk.bytes_out(split_prefix, fn, "split_prefix", maxlen, "maxlen")
    path = _c_bytes(split_path, fn, "split_path")
    postfix = b"-%05d-of-%05d.gguf" % (split_no + 1, split_count)
    if len(path) <= len(postfix) or not path.endswith(postfix):
        return 0
    n = len(path) - len(postfix)
    _snprintf(mv, min(n + 1, maxlen), path)
    return n


# ---------------------------------------------------------------------- quantization


class llama_model_quantize_params:  # noqa: N801 (llama.h's type name)
    """llama.h's struct llama_model_quantize_params with llama.cpp's defaults."""

    def __init__(self) -> None:
        self.nthread = 0
        self.ftype = 7  # LLAMA_FTYPE_MOSTLY_Q8_0
        self.output_tensor_type = 43  # GGML_TYPE_COUNT: not set
        self.token_embedding_type = 43
        self.allow_requantize = False
        self.quantize_output_tensor = True
        self.only_copy = False
        self.pure = False
        self.keep_split = False
        self.dry_run = False
        self.imatrix = None
        self.kv_overrides = None
        self.tt_overrides = None
        self.prune_layers = None
        self.max_buf_size = 8 * 1024 * 1024 * 1024  # LLAMA_QUANT_MAX_BUF_SIZE

    def __repr__(self) -> str:
        return "llama_model_quantize_params(" + ", ".join(f"{k}={v!r}" for k, v in vars(self).items()) + ")"


def llama_model_quantize_default_params() -> llama_model_quantize_params:
    return llama_model_quantize_params()


NOT_SUPPORTED: dict[str, str] = {}


def _not_supported(fn: str, reason: str) -> None:
    raise NotImplementedError(f"{fn}: not supported by pyllama: {reason}")


_GGML_TYPE_COUNT = 43


def llama_model_quantize(fname_inp: Any, fname_out: Any, params: llama_model_quantize_params) -> int:
    """Quantize a GGUF model file as llama.cpp does (pyllama's quantizer writes the same
    bytes as llama-quantize). Returns 0 on success, 1 on failure (the reason is logged,
    as llama.cpp does; ``dry_run`` writes nothing). ``imatrix``, ``kv_overrides``,
    ``tt_overrides`` and ``prune_layers`` (C arrays here) are not supported: set, they raise
    NotImplementedError (use ``pyllama quantize --imatrix/--override-kv/--tensor-type/
    --prune-layers`` or :func:`pyllama.imatrix.quantize`)."""
    import logging
    import os

    from . import _core

    for field in ("imatrix", "kv_overrides", "tt_overrides", "prune_layers"):
        if getattr(params, field, None) is not None:
            _not_supported(f"llama_model_quantize({field}=...)",
                           "pass an importance matrix as a file to pyllama.imatrix.quantize; "
                           "for metadata overrides, tensor-type patterns and layer pruning use "
                           "pyllama.imatrix.quantize(kv_overrides=, tensor_types=, prune_layers=)")

    def path(v: Any) -> str:
        return os.fsdecode(v) if isinstance(v, (bytes, bytearray)) else os.fspath(v)

    def type_name(t: int) -> Optional[str]:
        if t is None or int(t) >= _GGML_TYPE_COUNT or int(t) < 0:
            return None
        from . import _api_context as C

        names = {v: k[len("GGML_TYPE_"):] for k, v in vars(C).items() if k.startswith("GGML_TYPE_") and isinstance(v, int)}
        if int(t) not in names:
            raise ValueError(f"unknown ggml type {t}")
        return names[int(t)]

    try:
        names = {i: n for n, i in _core.quantize_ftypes()}
        if int(params.ftype) not in names:
            raise ValueError(f"invalid output file type {params.ftype}")
        ftype = "COPY" if params.only_copy else names[int(params.ftype)]
        n = int(params.nthread) if int(params.nthread) > 0 else (os.cpu_count() or 1)
        _core.quantize_model(path(fname_inp), path(fname_out), ftype, n_threads=n,
                             allow_requantize=bool(params.allow_requantize),
                             leave_output_tensor=not params.quantize_output_tensor, pure=bool(params.pure),
                             output_tensor_type=type_name(params.output_tensor_type),
                             token_embedding_type=type_name(params.token_embedding_type),
                             keep_split=bool(params.keep_split), dry_run=bool(params.dry_run))
    except Exception as e:  # llama.cpp logs the error and returns 1
        logging.getLogger("pyllama").error("llama_model_quantize: failed to quantize: %s", e)
        return 1
    return 0


# ---------------------------------------------------------------------- training

_TRAINING = "training (ggml-opt) is out of pyllama's scope: it runs inference only"
NOT_SUPPORTED.update(llama_opt_param_filter_all=_TRAINING, llama_opt_init=_TRAINING, llama_opt_epoch=_TRAINING)


def llama_opt_param_filter_all(tensor: Any, userdata: Any) -> bool:
    """Not supported: training is out of scope."""
    _not_supported("llama_opt_param_filter_all", _TRAINING)


def llama_opt_init(lctx: Any, model: Any, lopt_params: Any) -> None:
    """Not supported: training is out of scope."""
    _not_supported("llama_opt_init", _TRAINING)


def llama_opt_epoch(lctx: Any, dataset: Any, result_train: Any, result_eval: Any, idata_split: Any,
                    callback_train: Any, callback_eval: Any) -> None:
    """Not supported: training is out of scope."""
    _not_supported("llama_opt_epoch", _TRAINING)


__all__ = [n for n in dir() if n.startswith(("llama_", "LLAMA_", "GGML_", "ggml_"))] + ["NOT_SUPPORTED"]
