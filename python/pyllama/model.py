"""The idiomatic model object (pipeline steps 2-6): load a GGUF model (one file or a split
model), with its hyperparameters, metadata, size and type, raising typed exceptions.

    model = pyllama.Model.load("model.gguf", load_mode="mmap")
    model.hparams["n_layer"], model.desc, model.chat_template()

The weights stay in Rust (``model._core``, a ``pyllama._core.Model``); under mmap they
are used in place, never copied.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping as MappingABC, Sequence as SequenceABC
from dataclasses import dataclass
from os import PathLike
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from . import _core
from ._api_check import describe as _describe
from .errors import LoadCancelled  # noqa: F401  (re-exported for callers of Model.load)

log = logging.getLogger("pyllama")

PathArg = Union[str, bytes, "PathLike[str]"]

#: llama.h's load modes, in its enum order (auto = -1 ... dio = 4).
LOAD_MODES: dict[str, int] = dict(_core.load_mode_names())


def _int_arg(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"Model.load: {name} must be an int, got {_describe(v)}")
    if not -(2**31) <= v < 2**31:
        raise ValueError(f"Model.load: {name} = {v} is out of range")
    return v


#: llama.h's enum llama_split_mode, by value
SPLIT_MODES = ("none", "layer", "row", "tensor")


def split_mode_name(v: Any, where: str = "Model.load") -> str:
    """``split_mode`` as the extension takes it: llama.h's value (0 none, 1 layer, 2 row,
    3 tensor) or its name."""
    if isinstance(v, str) and v.lower() in SPLIT_MODES:
        return v.lower()
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(SPLIT_MODES):
        return SPLIT_MODES[v]
    if isinstance(v, (str, int)) and not isinstance(v, bool):
        raise ValueError(f"{where}: split_mode = {v!r} is not one of 0/'none', 1/'layer', 2/'row', 3/'tensor'")
    raise TypeError(f"{where}: split_mode must be an int or a str, got {_describe(v)}")


def tensor_split_list(v: Any, where: str = "Model.load") -> Optional[list[float]]:
    """``tensor_split`` as a list of floats (None stays None); the extension checks the
    values (at most 16, each finite and >= 0)."""
    if v is None:
        return None
    try:
        items = None if isinstance(v, (str, bytes, MappingABC)) else list(v)  # a ctypes float array too
    except TypeError:
        items = None
    if items is None:
        raise TypeError(f"{where}: tensor_split must be a sequence of numbers or None, got {_describe(v)}")
    out = []
    for i, x in enumerate(items):
        if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
            raise TypeError(f"{where}: tensor_split[{i}] must be a number, got {_describe(x)}")
        out.append(float(x))
    return out


def _fspath(p: PathArg) -> str:
    if isinstance(p, bytes):
        return p.decode("utf-8", "surrogateescape")
    return str(p.__fspath__() if hasattr(p, "__fspath__") else p)


def meta_value_str(v: Any) -> str:
    """A metadata value as llama.cpp's gguf_kv_to_str writes it (floats with %f, bools
    as true/false, arrays as [a, b] with quoted strings)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:f}"
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list):
        parts = []
        for x in v:
            if isinstance(x, (str, bytes)):
                s = x if isinstance(x, str) else x.decode("utf-8", "replace")
                parts.append('"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"')
            elif isinstance(x, list):
                parts.append("???")
            else:
                parts.append(meta_value_str(x))
        return "[" + ", ".join(parts) + "]"
    return str(v)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: str
    #: numpy order (gguf-py's convention): the reverse of ggml's ne.
    shape: tuple[int, ...]
    #: offset inside its file's data section
    offset: int
    nbytes: int


class Model:
    """A loaded model. Create with :meth:`Model.load`."""

    def __init__(self, core: "_core.Model"):
        if not isinstance(core, _core.Model):
            raise TypeError(f"Model: core must be a pyllama._core.Model (load a file with Model.load(path)), "
                            f"got {_describe(core)}")
        self._core = core
        self.arch: str = core.arch
        self.paths: list[str] = core.paths
        self.path: str = self.paths[0]
        self.hparams: dict[str, Any] = core.hparams()
        self._metadata: Optional[dict[str, Any]] = None
        self._vocab: Any = None
        for w in core.warnings:
            log.warning("%s", w)
        if core.offload:
            log.info("%s", core.offload)

    @property
    def offload(self) -> Optional[str]:
        """What runs on the GPU (``n_gpu_layers``), one line; None when nothing does."""
        return self._core.offload

    @classmethod
    def load(
        cls,
        path: Union[PathArg, Sequence[PathArg]],
        *,
        load_mode: str = "auto",
        progress: Optional[Callable[[float], Any]] = None,
        vocab_only: bool = False,
        check_tensors: bool = False,
        kv_overrides: Optional[Mapping[str, Union[bool, int, float, str]]] = None,
        n_gpu_layers: int = 0,
        main_gpu: int = 0,
        gpu_allow_software: bool = False,
        split_mode: Union[str, int] = "layer",
        tensor_split: Optional[Sequence[float]] = None,
    ) -> "Model":
        """Load a model from a GGUF file, the first part of a split model
        (``name-00001-of-00003.gguf``: the other parts are found next to it), or a list of
        all parts.

        ``load_mode``: auto, none, mmap, mlock, mmap+mlock or dio (auto: read into memory
        on 2 MiB pages where Linux has transparent huge pages and the model fits in half the
        available memory, else mapped; see the README). ``progress(p)`` is
        called with 0.0 ... 1.0 (monotonic, at least once per tensor); returning False
        cancels and raises :class:`LoadCancelled`. ``check_tensors`` scans the data for
        NaN/Inf (floats and quantization scales). ``kv_overrides`` replaces metadata
        values before the hyperparameters are read. ``n_gpu_layers`` puts the matmuls of the
        top N layers (the output layer counts as the topmost, as in llama.cpp: 1 is the
        output layer alone, n_layer + 1 or a negative value everything) on the GPU
        adapters of :func:`pyllama.gpu.usable`, the weights uploaded once here, as llama.cpp
        places them: ``split_mode`` "layer" (1, the default) spreads the offloaded layers over
        every usable adapter in proportion to ``tensor_split`` (one share per adapter,
        entries past the adapter count are not read; None or all zero: equal shares, as
        wgpu reports no free memory), each layer's KV cache with it; "none" (0) puts them
        all on adapter ``main_gpu`` (which must be 0 under "layer"); "row" (2) and "tensor"
        (3) split single matrices, which the wgpu backend cannot (a ValueError, as
        llama.cpp's Vulkan backend refuses them). ``gpu_allow_software`` admits a software
        adapter (lavapipe). Without the GPU backend or a usable adapter a warning says so
        and the CPU runs every layer (``Model.offload`` says what runs where).

        Raises GGUFError (malformed file), UnsupportedModelError (well-formed but not
        runnable), LoadCancelled, FileNotFoundError / OSError, ValueError (bad argument).
        """
        def is_path(p) -> bool:
            return isinstance(p, (str, bytes)) or hasattr(p, "__fspath__")

        if is_path(path):
            paths = [_fspath(path)]  # type: ignore[arg-type]
        elif isinstance(path, SequenceABC):
            for i, p in enumerate(path):
                if not is_path(p):
                    raise TypeError(f"Model.load: path[{i}] must be a path (str, bytes or os.PathLike), got {_describe(p)}")
            paths = [_fspath(p) for p in path]
        else:
            raise TypeError(f"Model.load: path must be a path (str, bytes or os.PathLike) or a list of the parts "
                            f"of a split model, got {_describe(path)}")
        if not isinstance(load_mode, str) or load_mode not in LOAD_MODES:
            raise ValueError(f"Model.load: unknown load mode {load_mode!r} (expected one of {', '.join(LOAD_MODES)})")
        if progress is not None and not callable(progress):
            raise TypeError(f"Model.load: progress must be callable or None, got {_describe(progress)}")
        if kv_overrides is not None and not isinstance(kv_overrides, MappingABC):
            raise TypeError(f"Model.load: kv_overrides must be a mapping of key -> value, got {_describe(kv_overrides)}")
        core = _core.Model(
            paths,
            load_mode,
            vocab_only=vocab_only,
            check_tensors=check_tensors,
            progress=progress,
            kv_overrides=dict(kv_overrides) if kv_overrides else None,
            n_gpu_layers=_int_arg("n_gpu_layers", n_gpu_layers),
            main_gpu=_int_arg("main_gpu", main_gpu),
            gpu_allow_software=bool(gpu_allow_software),
            split_mode=split_mode_name(split_mode),
            tensor_split=tensor_split_list(tensor_split),
        )
        return cls(core)

    # -- metadata ---------------------------------------------------------------------

    @property
    def metadata(self) -> dict[str, Any]:
        """All metadata of the first file (after kv_overrides) as Python values. Built on
        first use: the tokenizer arrays are large, and loading should not pay for them."""
        if self._metadata is None:
            self._metadata = self._core.metadata()
        return self._metadata

    @property
    def vocab(self) -> Any:
        """The model's :class:`pyllama.Vocab` (tokenizer), built on first use from the
        ``tokenizer.ggml.*`` metadata (what llama_model_get_vocab returns)."""
        if self._vocab is None:
            from .vocab import Vocab
            from .vocab._vocab import _small_metadata

            # the token tables go from the file to Rust directly, never through Python lists
            self._vocab = Vocab.from_metadata(_small_metadata(self._core), source=self.path,
                                              store_factory=self._core.vocab_store)
        return self._vocab

    def meta(self) -> dict[str, str]:
        """llama.cpp's model->gguf_kv: every non-array key, value as a string, sorted."""
        md = self._metadata if self._metadata is not None else self._core.metadata(arrays=False)
        types = self._core.metadata_types()
        return {k: meta_value_str(md[k]) for k in sorted(md) if types[k][0] != 9}

    def meta_value(self, key: str) -> Any:
        """The value of metadata ``key`` (None when absent), without reading every key
        the way :attr:`metadata` does."""
        return self._metadata.get(key) if self._metadata is not None else self._core.meta_value(key)

    def drop_metadata(self) -> None:
        """Forget the metadata read so far (:attr:`metadata` reads it again when asked):
        llama_model_free lets its arrays (tokens, merges) go."""
        self._metadata = None

    @property
    def core(self) -> "_core.Model":
        """The Rust model (``pyllama._core.Model``): weights, metadata and tensor index."""
        return self._core

    def chat_template(self, name: Optional[str] = None) -> Optional[str]:
        """The chat template (``tokenizer.chat_template`` or ``tokenizer.chat_template.<name>``),
        or None. Untrusted input: render it only in jinja2's sandbox."""
        if name is not None and not isinstance(name, str):
            raise TypeError(f"Model.chat_template: name must be a str or None, got {_describe(name)}")
        key = "tokenizer.chat_template" + (f".{name}" if name else "")
        v = self.meta_value(key)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        return v if isinstance(v, str) else None

    # -- size and type ----------------------------------------------------------------

    @property
    def n_params(self) -> int:
        return self._core.n_params()

    @property
    def size(self) -> int:
        """Bytes of all tensors."""
        return self._core.size()

    @property
    def bpw(self) -> float:
        """Bits per weight over all tensors."""
        return self.size * 8 / max(self.n_params, 1)

    @property
    def ftype(self) -> int:
        """llama.h's llama_ftype (LLAMA_FTYPE_GUESSED, 1024, added when guessed)."""
        ft, guessed = self._core.ftype()
        return ft | 1024 if guessed else ft

    @property
    def ftype_name(self) -> str:
        """The type guess as llama.cpp names it: "Q4_1", "Q4_K - Medium"."""
        return self._core.ftype_name()

    @property
    def type_name(self) -> str:
        """llama.cpp's size class ("270M"; "?B" when unknown)."""
        return self._core.type_name()

    @property
    def desc(self) -> str:
        """llama_model_desc: "gemma3 270M Q4_K - Medium"."""
        return self._core.desc()

    @property
    def load_mode(self) -> str:
        return self._core.load_mode

    @property
    def vocab_only(self) -> bool:
        return self._core.vocab_only

    # -- hyperparameters ----------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return self.hparams["n_vocab"]

    @property
    def n_ctx_train(self) -> int:
        return self.hparams["n_ctx_train"]

    @property
    def n_embd(self) -> int:
        return self.hparams["n_embd"]

    @property
    def n_layer(self) -> int:
        return self.hparams["n_layer"]

    @property
    def n_head(self) -> int:
        """Heads of layer 0 (llama_model_n_head); per layer in hparams["n_head"]."""
        return (self.hparams["n_head"] or [0])[0]

    @property
    def n_head_kv(self) -> int:
        return (self.hparams["n_head_kv"] or [0])[0]

    # -- tensors ------------------------------------------------------------------------

    @property
    def tensors(self) -> list[TensorInfo]:
        return [TensorInfo(n, t, tuple(reversed(ne)), off, nb) for n, t, ne, off, nb in self._core.tensors()]

    def tensor_raw(self, name: str) -> np.ndarray:
        """A tensor's bytes as a read-only uint8 array (no copy under mmap)."""
        if not isinstance(name, str):
            raise TypeError(f"Model.tensor_raw: name must be a str, got {_describe(name)}")
        a = self._core.tensor_raw(name)
        if a is None:
            raise KeyError(f"{self.path}: no tensor named {name!r}")
        return a

    def __repr__(self) -> str:
        return f"Model({self.path!r}, {self.desc!r}, {self.n_params} params, load_mode={self.load_mode!r})"


__all__ = ["LOAD_MODES", "Model", "TensorInfo", "meta_value_str"]
