"""Read GGUF files: metadata, tensor index and raw tensor bytes (pipeline step 2)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from os import PathLike
from typing import Any

import numpy as np

from . import _core


#: GGUF metadata value type ids -> names (gguf.cpp's gguf_type_name).
VALUE_TYPE_NAMES = {
    0: "u8", 1: "i8", 2: "u16", 3: "i16", 4: "u32", 5: "i32", 6: "f32",
    7: "bool", 8: "str", 9: "arr", 10: "u64", 11: "i64", 12: "f64",
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: str
    #: numpy order (gguf-py's convention): the reverse of ggml's ne.
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class GGUFTensor:
    """One tensor of a GGUFFile: ``.info`` (name, type, shape, offset, nbytes), ``.raw``."""

    def __init__(self, file: "GGUFFile", info: TensorInfo):
        self._file = file
        self.info = info
        self.name = info.name
        self.type = info.type
        self.shape = info.shape

    @property
    def raw(self) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 array (no copy under mmap)."""
        return self._file._f.tensor_raw(self.info.name)

    def dequantize(self) -> np.ndarray:
        """The tensor as float32, shaped like gguf-py's (numpy order: row length last);
        bit-identical to ``gguf.quants.dequantize`` for every quantized type gguf-py
        decodes; F64 and the integer types come out as C's casts to float."""
        return _core.dequantize(self.raw, self.info.type, list(self.info.shape))


class GGUFFile:
    """An open GGUF file. ``load_mode`` is one of auto, none, mmap, mlock, mmap+mlock, dio."""

    def __init__(self, path: "str | PathLike[str]", load_mode: str = "auto"):
        self._f = _core.GGUFFile(path, load_mode)
        self.path = self._f.path
        self.version: int = self._f.version
        self.alignment: int = self._f.alignment
        self.data_offset: int = self._f.data_offset
        #: key -> Python value (int, float, bool, str; bytes for non-UTF-8 strings; list for arrays)
        self.metadata: dict[str, Any] = self._f.metadata()
        #: key -> GGUF type name: "u32", "str", "arr[str]" ... (what llama.cpp prints)
        self.types: dict[str, str] = {
            k: (f"arr[{VALUE_TYPE_NAMES.get(et, '?')}]" if t == 9 else VALUE_TYPE_NAMES.get(t, "?"))
            for k, (t, et) in self._f.metadata_types().items()
        }
        self.file_size: int = self._f.file_size
        self.is_mmap: bool = self._f.is_mmap
        for w in self._f.warnings:
            logging.getLogger("pyllama").warning("%s", w)
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
