"""Write small GGUF files byte by byte, so tests can corrupt any single field.

The layout (little endian) is the GGUF v3 spec's: magic, u32 version, u64 n_tensors,
u64 n_kv, the key/values, the tensor infos, padding to the alignment, the data section.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Optional

# GGUF value type ids
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
        BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}


def gstr(s: bytes | str) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def value(t: int, v: Any) -> bytes:
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(value(et, x) for x in items)
    return struct.pack(_FMT[t], v)


@dataclass
class Tensor:
    name: str
    ne: list[int]
    ty: int = 0  # F32
    data: bytes = b""
    offset: Optional[int] = None  # None: computed (aligned, contiguous)


@dataclass
class Spec:
    kvs: list[tuple[str, int, Any]] = field(default_factory=list)
    tensors: list[Tensor] = field(default_factory=list)
    version: int = 3
    alignment: int = 32


def build(spec: Spec) -> tuple[bytes, dict[str, int]]:
    """The file's bytes and the byte offset of every field ("n_tensors", "kv0.key",
    "kv0.type", "kv0.value", "t0.name", "t0.n_dims", "t0.ne0", "t0.type", "t0.offset",
    "data")."""
    out = bytearray(b"GGUF")
    where: dict[str, int] = {"version": 4}
    out += struct.pack("<I", spec.version)
    where["n_tensors"] = len(out)
    out += struct.pack("<Q", len(spec.tensors))
    where["n_kv"] = len(out)
    out += struct.pack("<Q", len(spec.kvs))
    for i, (k, t, v) in enumerate(spec.kvs):
        where[f"kv{i}.key"] = len(out)
        out += gstr(k)
        where[f"kv{i}.type"] = len(out)
        out += struct.pack("<I", t)
        where[f"kv{i}.value"] = len(out)
        out += value(t, v)
    a = spec.alignment
    off = 0
    offsets = []
    for t in spec.tensors:
        o = off if t.offset is None else t.offset
        offsets.append(o)
        off = (o + len(t.data) + a - 1) // a * a
    for i, t in enumerate(spec.tensors):
        where[f"t{i}.name"] = len(out)
        out += gstr(t.name)
        where[f"t{i}.n_dims"] = len(out)
        out += struct.pack("<I", len(t.ne))
        for j, d in enumerate(t.ne):
            where[f"t{i}.ne{j}"] = len(out)
            out += struct.pack("<q", d) if d < 0 else struct.pack("<Q", d)
        where[f"t{i}.type"] = len(out)
        out += struct.pack("<I", t.ty)
        where[f"t{i}.offset"] = len(out)
        out += struct.pack("<Q", offsets[i])
    if spec.tensors:
        out += b"\0" * ((-len(out)) % a)
    where["data"] = len(out)
    data = bytearray()
    for t, o in zip(spec.tensors, offsets):
        if len(data) < o:
            data += b"\0" * (o - len(data))
        data[o : o + len(t.data)] = t.data
    if spec.tensors:
        data += b"\0" * ((-len(data)) % a)
    return bytes(out + data), where


def f32_data(vals: list[float]) -> bytes:
    return struct.pack(f"<{len(vals)}f", *vals)


def small_spec() -> Spec:
    """A small valid file: every scalar value type, a string array, a nested array and
    three tensors (F32, F16, Q8_0)."""
    return Spec(
        kvs=[
            ("general.architecture", STR, "llama"),
            ("general.name", STR, "tiny"),
            ("t.u8", U8, 7),
            ("t.i8", I8, -7),
            ("t.u16", U16, 700),
            ("t.i16", I16, -700),
            ("t.u32", U32, 70000),
            ("t.i32", I32, -70000),
            ("t.f32", F32, 0.5),
            ("t.bool", BOOL, 1),
            ("t.u64", U64, 2**40),
            ("t.i64", I64, -(2**40)),
            ("t.f64", F64, 0.25),
            ("t.strs", ARR, (STR, ["a", "bc", ""])),
            ("t.ints", ARR, (I32, [1, -2, 3])),
            ("t.nested", ARR, (ARR, [(U8, [1, 2]), (U8, [])])),
        ],
        tensors=[
            Tensor("a.weight", [4, 2], 0, f32_data([1, 2, 3, 4, 5, 6, 7, 8])),
            Tensor("b.weight", [3], 1, struct.pack("<3e", 1.0, -2.0, 0.5)),
            Tensor("c.weight", [32], 8, struct.pack("<e", 0.25) + bytes(range(32))),
        ],
    )
