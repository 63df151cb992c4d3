"""LoRA adapters and control vectors (llama.cpp's llama_adapter_lora / llama_adapter_cvec).

    model = pyllama.Model.load("base.gguf")
    ctx = pyllama.Context(model)
    lora = LoraAdapter(model, "adapter.gguf")          # checked against the model now
    ctx.set_lora_adapters([(lora, 1.0)])               # y = W x + scale * B (A x)
    cv = ControlVector.load([("happy.gguf", 0.8)])     # llama.cpp's control-vector files
    ctx.set_control_vector(cv, layer_start=10, layer_end=20)

Adapters are applied at run time on top of the model's weights, which stay as loaded
(memory-mapped, possibly quantized); ``ctx.set_lora_adapters([])`` gives the plain model's
logits back exactly. The arithmetic is in the Rust core (pyllama_core::adapter).
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

import numpy as np

from . import _core
from ._api_check import describe as _describe

PathArg = Union[str, bytes, "os.PathLike[str]"]


def _fspath(p: PathArg, what: str) -> str:
    if isinstance(p, bytes):
        return p.decode("utf-8", "surrogateescape")
    if isinstance(p, str) or hasattr(p, "__fspath__"):
        return os.fspath(p)  # type: ignore[arg-type]
    raise TypeError(f"{what}: expected a file path, got {_describe(p)}")


class LoraAdapter:
    """A LoRA adapter in GGUF (as llama.cpp's convert_lora_to_gguf.py writes it), loaded for
    one model. Loading checks what llama.cpp checks: ``general.type`` is ``adapter`` and
    ``adapter.type`` is ``lora``, ``general.architecture`` is the model's, every tensor is a
    ``<weight>.lora_a`` / ``<weight>.lora_b`` pair of a weight the model has, with matching
    shapes. A problem raises :class:`~pyllama.errors.UnsupportedModelError` (or
    ``GGUFError`` for a malformed file, ``FileNotFoundError``) naming the file and what was
    wrong."""

    def __init__(self, model: Any, path: PathArg) -> None:
        from .context import _core_model_of

        self.model = model
        core_model = _core_model_of(model)
        self.path = _fspath(path, "LoraAdapter")
        self._core = _core.LoraAdapter(core_model, self.path)
        self._meta: Optional[dict[str, str]] = None

    @classmethod
    def from_bytes(cls, model: Any, data: bytes, name: str = "<bytes>") -> "LoraAdapter":
        """An adapter from the bytes of a GGUF file (``name`` is used in messages)."""
        from .context import _core_model_of

        self = cls.__new__(cls)
        self.model = model
        self.path = name
        self._core = _core.LoraAdapter.from_bytes(_core_model_of(model), bytes(data), name)
        self._meta = None
        return self

    @property
    def alpha(self) -> float:
        """``adapter.lora.alpha``; 0 when absent (the scale is then used as given, not
        multiplied by alpha / rank)."""
        return float(self._core.alpha)

    @property
    def alora_invocation_tokens(self) -> list[int]:
        """``adapter.alora.invocation_tokens`` of an activated LoRA ([] otherwise)."""
        return list(self._core.alora_invocation_tokens)

    @property
    def ranks(self) -> dict[str, int]:
        """Adapted base weight -> the adapter's rank there."""
        return dict(self._core.ranks())

    @property
    def metadata(self) -> dict[str, str]:
        """The file's scalar metadata as llama.cpp's llama_adapter_meta_* functions give
        it: sorted by key, values as gguf_kv_to_str writes them (arrays left out)."""
        if self._meta is None:
            from .model import meta_value_str

            self._meta = {k: meta_value_str(v) for k, v in sorted(self._core.metadata(False).items())}
        return self._meta

    def __repr__(self) -> str:
        return f"LoraAdapter({self.path!r}, alpha={self.alpha:g}, {len(self.ranks)} weights)"


def _lora_list(adapters: Any, fn: str) -> list[tuple["LoraAdapter", float]]:
    """[(LoraAdapter, scale), ...] from a list of pairs or bare adapters (scale 1), or a
    mapping adapter -> scale."""
    if adapters is None:
        return []
    items = list(adapters.items()) if isinstance(adapters, dict) else list(adapters)
    out = []
    for i, it in enumerate(items):
        if isinstance(it, LoraAdapter):
            a, s = it, 1.0
        elif isinstance(it, (tuple, list)) and len(it) == 2:
            a, s = it
        else:
            raise TypeError(f"{fn}: adapters[{i}] must be a LoraAdapter or a (LoraAdapter, scale) pair, "
                            f"got {_describe(it)}")
        if not isinstance(a, LoraAdapter):
            raise TypeError(f"{fn}: adapters[{i}] must be a LoraAdapter, got {_describe(a)}")
        if isinstance(s, bool) or not isinstance(s, (int, float, np.floating, np.integer)):
            raise TypeError(f"{fn}: the scale of adapters[{i}] must be a number, got {_describe(s)}")
        if not np.isfinite(float(s)):
            raise ValueError(f"{fn}: the scale of adapters[{i}] ({a.path}) must be finite, got {s}")
        out.append((a, float(s)))
    return out


class ControlVector:
    """Per-layer directions to add to the layer outputs, in llama.cpp's format: a GGUF file
    (``general.architecture = controlvector``) of F32 1-D tensors ``direction.N`` for
    layers N >= 1.

    ``data`` is float32 [n_layers * n_embd] holding layers 1, 2, ... (layer 0 never has a
    direction), as ``llama_set_adapter_cvec`` takes it."""

    def __init__(self, data: Any, n_embd: int) -> None:
        a = np.ascontiguousarray(data, dtype=np.float32).ravel()
        if isinstance(n_embd, bool) or not isinstance(n_embd, (int, np.integer)) or n_embd <= 0:
            raise ValueError(f"ControlVector: n_embd must be a positive integer, got {n_embd!r}")
        if len(a) % int(n_embd):
            raise ValueError(f"ControlVector: data has {len(a)} values, not a whole number of layers of {n_embd}")
        self.data = a
        self.n_embd = int(n_embd)

    @property
    def n_layers(self) -> int:
        """Layers 1..n_layers have a direction (zeros where a file gave none)."""
        return len(self.data) // self.n_embd

    @classmethod
    def load(cls, files: Sequence[Union[PathArg, tuple[PathArg, float]]]) -> "ControlVector":
        """Load and sum control-vector files, each scaled by its strength (a bare path:
        1.0), as llama.cpp's common_control_vector_load does. Where llama.cpp skips a bad
        file with a message, this raises :class:`~pyllama.errors.UnsupportedModelError`
        naming the file and the tensor."""
        from .errors import UnsupportedModelError

        if isinstance(files, (str, bytes)) or hasattr(files, "__fspath__"):
            files = [files]  # type: ignore[list-item]
        n_embd = -1
        total = np.zeros(0, np.float32)
        for item in files:
            if isinstance(item, tuple):
                if len(item) != 2:
                    raise TypeError(f"ControlVector.load: expected a path or a (path, strength) pair, got {item!r}")
                p, strength = item
            else:
                p, strength = item, 1.0
            path = _fspath(p, "ControlVector.load")
            if isinstance(strength, bool) or not isinstance(strength, (int, float, np.floating, np.integer)):
                raise TypeError(f"ControlVector.load: the strength of {path} must be a number, got {_describe(strength)}")
            f = _core.GGUFFile(path, "none")
            ne, data = -1, np.zeros(0, np.float32)
            tensors = f.tensors()
            if not tensors:
                raise UnsupportedModelError(f"control vector {path}: no direction tensors found")
            for name, ty, shape, _off, _nb in tensors:
                head, _, tail = name.partition(".")
                il = int(tail) if head == "direction" and tail.isdigit() else -1
                if il < 0:
                    raise UnsupportedModelError(f"control vector {path}: tensor '{name}': invalid/unparsable direction "
                                                "tensor layer index (expected direction.N)")
                if il == 0:
                    raise UnsupportedModelError(f"control vector {path}: tensor '{name}': invalid (zero) direction "
                                                "tensor layer index (layer 0 has no direction)")
                if ty != "F32":
                    raise UnsupportedModelError(f"control vector {path}: tensor '{name}' is {ty}; directions must be F32")
                dims = [int(d) for d in shape]
                if len(dims) != 1:
                    raise UnsupportedModelError(f"control vector {path}: tensor '{name}' has shape {dims}; directions "
                                                "must be 1-D")
                if ne == -1:
                    ne = dims[0]
                elif dims[0] != ne:
                    raise UnsupportedModelError(f"control vector {path}: tensor '{name}' has {dims[0]} values, the "
                                                f"file's other directions {ne}")
                if len(data) < ne * il:
                    data = np.concatenate([data, np.zeros(ne * il - len(data), np.float32)])
                v = np.frombuffer(bytes(f.tensor_raw(name)), dtype="<f4")
                # float32 strength and sum, as llama.cpp's `dst[j] += src[j] * strength`
                data[ne * (il - 1):ne * il] += v * np.float32(strength)
            if n_embd != -1 and ne != n_embd:
                raise UnsupportedModelError(f"control vector {path}: {ne} values per direction, the earlier files "
                                            f"have {n_embd}")
            n_embd = ne
            if len(total) < len(data):
                total = np.concatenate([total, np.zeros(len(data) - len(total), np.float32)])
            total[:len(data)] += data
        if n_embd == -1:
            raise ValueError("ControlVector.load: no control vector files given")
        return cls(total, n_embd)

    def __repr__(self) -> str:
        return f"ControlVector(n_embd={self.n_embd}, layers 1..{self.n_layers})"


__all__ = ["ControlVector", "LoraAdapter"]
