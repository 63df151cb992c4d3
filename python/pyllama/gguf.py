"""Read GGUF files: metadata, tensor index and raw tensor bytes (pipeline step 2)."""

from __future__ import annotations

from dataclasses import dataclass
from os import PathLike
from typing import Any

import numpy as np

from . import _core


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: str
    #: numpy order (gguf-py's convention): the reverse of ggml's ne.
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class GGUFTensor:
    def __init__(self, file: "GGUFFile", info: TensorInfo):
        self._file = file
        self.info = info

    @property
    def raw(self) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 array (no copy under mmap)."""
        return self._file._f.tensor_raw(self.info.name)

    def dequantize(self) -> np.ndarray:
        """The tensor as float32, shaped like gguf-py's (numpy order: row length last);
        bit-identical to ``gguf.quants.dequantize``. Raises UnsupportedModelError for
        types pyllama cannot decode (IQ1/IQ2/IQ3, TQ, MXFP4, ...)."""
        return _core.dequantize(self.raw, self.info.type, list(self.info.shape))


class GGUFFile:
    """An open GGUF file. ``load_mode`` is one of auto, none, mmap, mlock, mmap+mlock, dio."""

    def __init__(self, path: str | PathLike, load_mode: str = "auto"):
        self._f = _core.GGUFFile(path, load_mode)
        self.path = self._f.path
        self.version: int = self._f.version
        self.alignment: int = self._f.alignment
        self.data_offset: int = self._f.data_offset
        self.metadata: dict[str, Any] = self._f.metadata()
        self.tensors: list[TensorInfo] = [
            TensorInfo(name, ty, tuple(reversed(ne)), off, nb) for name, ty, ne, off, nb in self._f.tensors()
        ]
        self._by_name = {t.name: t for t in self.tensors}

    def tensor(self, name: str) -> GGUFTensor:
        try:
            return GGUFTensor(self, self._by_name[name])
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None

    def __repr__(self) -> str:
        return f"GGUFFile({self.path!r}, version={self.version}, {len(self.metadata)} keys, {len(self.tensors)} tensors)"
