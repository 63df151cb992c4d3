"""Malformed GGUF files: every one raises GGUFError naming the file and the offset or
tensor; none crashes the interpreter. The cases follow the checks of llama.cpp's
ggml/src/gguf.cpp (gguf_init_from_reader) one by one."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gguf_build import ARR, BOOL, F32, I32, STR, U8, U32, U64, Spec, Tensor, build, f32_data, small_spec
from pyllama import GGUFError, GGUFFile, UnsupportedModelError, _core


def write(tmp_path: Path, data: bytes, name: str = "m.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def expect_error(path: Path, *needles: str) -> str:
    with pytest.raises(GGUFError) as ei:
        GGUFFile(path)
    msg = str(ei.value)
    assert str(path) in msg, msg
    for n in needles:
        assert n in msg, msg
    return msg


def patch(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new) :]


# -- the valid file -------------------------------------------------------------------


def test_small_file_reads_back(tmp_path):
    data, _ = build(small_spec())
    f = GGUFFile(write(tmp_path, data))
    md = f.metadata
    assert md["t.u8"] == 7 and md["t.i8"] == -7 and md["t.i16"] == -700 and md["t.i64"] == -(2**40)
    assert md["t.f32"] == 0.5 and md["t.f64"] == 0.25 and md["t.bool"] is True
    assert md["t.strs"] == ["a", "bc", ""] and md["t.ints"] == [1, -2, 3]
    assert md["t.nested"] == [[1, 2], []]
    assert f.types["t.u32"] == "u32" and f.types["t.strs"] == "arr[str]" and f.types["t.bool"] == "bool"
    assert [t.name for t in f.tensors] == ["a.weight", "b.weight", "c.weight"]
    assert f.tensors[0].shape == (2, 4) and f.tensors[0].type == "F32"
    a = np.frombuffer(f.tensor("a.weight").raw, np.float32)
    assert a.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert np.frombuffer(f.tensor("b.weight").raw, np.float16).tolist() == [1.0, -2.0, 0.5]
    assert f.tensor("c.weight").raw.nbytes == 34
    assert not f.tensor("a.weight").raw.flags.writeable


def test_gguf_py_writer_file_reads_back(tmp_path):
    """A file written by gguf-py's GGUFWriter (llama.cpp's own Python writer) parses, and
    the reader agrees with gguf-py's reader field by field."""
    gguf = pytest.importorskip("gguf")
    p = tmp_path / "w.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_uint32("x.u32", 5)
    w.add_float32("x.f32", 1.5)
    w.add_string("x.s", "héllo")
    w.add_array("x.arr", [1, 2, 3])
    w.add_bool("x.b", False)
    w.add_tensor("w", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("h", np.ones(40, dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = GGUFFile(p)
    r = gguf.GGUFReader(str(p))
    assert f.metadata["x.u32"] == 5 and f.metadata["x.s"] == "héllo" and f.metadata["x.b"] is False
    assert f.metadata["x.arr"] == [1, 2, 3]
    for t in r.tensors:
        mine = f.tensor(t.name)
        assert mine.raw.tobytes() == t.data.tobytes()
        assert f.data_offset + mine.info.offset == t.data_offset


# -- header ---------------------------------------------------------------------------


def test_wrong_magic(tmp_path):
    data, _ = build(small_spec())
    expect_error(write(tmp_path, b"GGUG" + data[4:]), "offset 0", "magic")


def test_empty_file(tmp_path):
    expect_error(write(tmp_path, b""), "offset 0")


@pytest.mark.parametrize("version", [0, 1, 4, 0x03000000, 0xFFFFFFFF])
def test_bad_versions(tmp_path, version):
    spec = small_spec()
    spec.version = version
    data, _ = build(spec)
    msg = expect_error(write(tmp_path, data), "offset 4")
    if version == 0x03000000:
        assert "byte-swapped" in msg


def test_version_2_accepted(tmp_path):
    spec = small_spec()
    spec.version = 2
    data, _ = build(spec)
    assert GGUFFile(write(tmp_path, data)).version == 2


@pytest.mark.parametrize("field", ["n_tensors", "n_kv"])
@pytest.mark.parametrize("count", [2**63, 2**64 - 1, 2**40])
def test_huge_counts(tmp_path, field, count):
    data, where = build(small_spec())
    expect_error(write(tmp_path, patch(data, where[field], struct.pack("<Q", count))), "count")


def test_huge_string_length(tmp_path):
    data, where = build(small_spec())
    bad = patch(data, where["kv1.key"], struct.pack("<Q", 2**63))
    expect_error(write(tmp_path, bad), f"offset {where['kv1.key']}", "string length")


def test_huge_array_length(tmp_path):
    data, where = build(small_spec())
    i = [k for k, *_ in small_spec().kvs].index("t.strs")
    at = where[f"kv{i}.value"] + 4  # after the element type
    for n in (2**63, 2**30 + 1, 10**6):
        expect_error(write(tmp_path, patch(data, at, struct.pack("<Q", n))), "t.strs", "array")


# -- key/value pairs ------------------------------------------------------------------


def test_empty_key(tmp_path):
    spec = small_spec()
    spec.kvs.append(("", U32, 1))
    expect_error(write(tmp_path, build(spec)[0]), "empty")


def test_duplicate_key(tmp_path):
    spec = small_spec()
    spec.kvs.append(("t.u8", U8, 1))
    expect_error(write(tmp_path, build(spec)[0]), "duplicate", "t.u8")


@pytest.mark.parametrize("t", [13, 99, 2**31])
def test_invalid_value_type(tmp_path, t):
    data, where = build(small_spec())
    expect_error(write(tmp_path, patch(data, where["kv2.type"], struct.pack("<I", t))), "t.u8", f"{t}")


def test_invalid_array_element_type(tmp_path):
    data, where = build(small_spec())
    i = [k for k, *_ in small_spec().kvs].index("t.ints")
    expect_error(write(tmp_path, patch(data, where[f"kv{i}.value"], struct.pack("<I", 77))), "t.ints", "77")


def test_deeply_nested_arrays(tmp_path):
    v: tuple = (U8, [])
    for _ in range(40):
        v = (ARR, [v])
    spec = Spec(kvs=[("deep", ARR, v)])
    expect_error(write(tmp_path, build(spec)[0]), "deep", "nested")


@pytest.mark.parametrize(
    "kv, needle",
    [
        (("general.alignment", U32, 0), "power of two"),
        (("general.alignment", U32, 13), "power of two"),
        (("general.alignment", I32, 32), "u32"),
        (("general.alignment", STR, "32"), "u32"),
    ],
)
def test_bad_alignment(tmp_path, kv, needle):
    spec = small_spec()
    spec.kvs.append(kv)
    data, where = build(spec)
    at = where[f"kv{len(spec.kvs) - 1}.type"]
    expect_error(write(tmp_path, data), "general.alignment", needle, f"offset {at}")


def test_custom_alignment_accepted(tmp_path):
    spec = small_spec()
    spec.kvs.append(("general.alignment", U32, 64))
    spec.alignment = 64
    f = GGUFFile(write(tmp_path, build(spec)[0]))
    assert f.alignment == 64 and f.data_offset % 64 == 0
    assert np.frombuffer(f.tensor("a.weight").raw, np.float32)[7] == 8


def test_bool_like_llama_cpp(tmp_path):
    """gguf.cpp reads a bool as int8 and takes any non-zero byte as true."""
    spec = Spec(kvs=[("b", BOOL, 2)])
    assert GGUFFile(write(tmp_path, build(spec)[0])).metadata["b"] is True


# -- tensor infos ---------------------------------------------------------------------


def test_n_dims_5(tmp_path):
    data, where = build(small_spec())
    expect_error(write(tmp_path, patch(data, where["t0.n_dims"], struct.pack("<I", 5))), "a.weight", "n_dims")


def test_negative_dim(tmp_path):
    data, where = build(small_spec())
    expect_error(write(tmp_path, patch(data, where["t0.ne1"], struct.pack("<q", -2))), "a.weight", "negative")


@pytest.mark.parametrize("dims", [[2**62, 4], [2**32, 2**32], [2**63 - 1, 2]])
def test_overflowing_dims(tmp_path, dims):
    spec = small_spec()
    spec.tensors[0].ne = dims
    expect_error(write(tmp_path, build(spec)[0]), "a.weight")


@pytest.mark.parametrize("ty", [43, 4, 5, 31, 2**31])
def test_invalid_or_removed_type(tmp_path, ty):
    data, where = build(small_spec())
    expect_error(write(tmp_path, patch(data, where["t0.type"], struct.pack("<I", ty))), "a.weight", "type")


def test_row_not_multiple_of_block(tmp_path):
    spec = small_spec()
    spec.tensors[2].ne = [31]  # Q8_0 blocks hold 32
    expect_error(write(tmp_path, build(spec)[0]), "c.weight", "block size")


def test_long_tensor_name(tmp_path):
    spec = small_spec()
    spec.tensors[0].name = "x" * 64
    expect_error(write(tmp_path, build(spec)[0]), "63")


def test_duplicate_tensor_names(tmp_path):
    spec = small_spec()
    spec.tensors[1].name = "a.weight"
    expect_error(write(tmp_path, build(spec)[0]), "duplicate tensor name 'a.weight'")


@pytest.mark.parametrize("delta", [-32, 32, 1, 2**63])
def test_offsets_that_overlap_gap_or_misalign(tmp_path, delta):
    data, where = build(small_spec())
    (off,) = struct.unpack_from("<Q", data, where["t1.offset"])
    bad = patch(data, where["t1.offset"], struct.pack("<Q", (off + delta) % 2**64))
    expect_error(write(tmp_path, bad), "b.weight", f"offset {where['t1.offset']}")


def test_data_one_byte_short(tmp_path):
    spec = Spec(tensors=[Tensor("w", [8], 0, f32_data(list(range(8))))])
    data, _ = build(spec)
    expect_error(write(tmp_path, data[:-1]), "'w'", "past the end")


def test_zero_element_tensor_ok(tmp_path):
    spec = Spec(tensors=[Tensor("e", [0, 4]), Tensor("w", [2], 0, f32_data([1, 2]))])
    f = GGUFFile(write(tmp_path, build(spec)[0]))
    assert f.tensor("e").raw.nbytes == 0 and f.tensor("w").raw.nbytes == 8


def test_no_tensors_ok(tmp_path):
    f = GGUFFile(write(tmp_path, build(Spec(kvs=[("k", U64, 1)]))[0]))
    assert f.tensors == [] and f.metadata == {"k": 1}


# -- every truncation, random corruption ----------------------------------------------


def test_truncation_at_every_offset(tmp_path):
    data, _ = build(small_spec())
    p = tmp_path / "t.gguf"
    p.write_bytes(data)
    full = GGUFFile(p)
    last = full.tensors[-1]
    # Every byte up to the end of the last tensor's data is needed (the padding after
    # it is not: llama.cpp accepts files that end there).
    end = full.data_offset + last.offset + last.nbytes
    del full  # its mapping must not outlive the rewrites of the file below
    assert end < len(data)
    p.write_bytes(data[:end])
    GGUFFile(p)
    for n in range(end):
        p.write_bytes(data[:n])
        with pytest.raises(GGUFError) as ei:
            GGUFFile(p)
        msg = str(ei.value)
        assert str(p) in msg and ("offset" in msg or "tensor" in msg), (n, msg)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_byte_flips(tmp_path, data):
    raw, _ = build(small_spec())
    buf = bytearray(raw)
    n = data.draw(st.integers(1, 8))
    for _ in range(n):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    p = tmp_path / "flip.gguf"
    p.write_bytes(bytes(buf))
    try:
        f = GGUFFile(p)
    except GGUFError as e:
        assert str(p) in str(e)
        return
    for t in f.tensors:  # whatever parsed must be readable in bounds
        assert f.tensor(t.name).raw.nbytes == t.nbytes


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_random_bytes_after_magic(tmp_path, tail):
    p = tmp_path / "rnd.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<I", 3) + tail)
    try:
        GGUFFile(p)
    except GGUFError as e:
        assert str(p) in str(e)


# -- a real model's header, mutated ---------------------------------------------------


@pytest.fixture(scope="module")
def real_copy(tmp_path_factory, real_model_path):
    dst = tmp_path_factory.mktemp("mut") / Path(real_model_path).name
    dst.write_bytes(Path(real_model_path).read_bytes())
    f = GGUFFile(dst)
    n = f.data_offset
    del f
    return dst, n


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_real_model_header_mutations(real_copy, data):
    """Any mutation of the header of a real model (both of them) either loads or raises
    GGUFError / UnsupportedModelError; never a crash."""
    path, header_len = real_copy
    edits = []
    with open(path, "r+b") as fh:
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, header_len - 1))
            fh.seek(i)
            old = fh.read(1)
            edits.append((i, old))
            fh.seek(i)
            fh.write(bytes([data.draw(st.integers(0, 255))]))
    try:
        _core.Model([str(path)], "mmap")
    except (GGUFError, UnsupportedModelError) as e:
        assert str(path) in str(e)
    finally:
        with open(path, "r+b") as fh:
            for i, old in reversed(edits):
                fh.seek(i)
                fh.write(old)


def test_real_model_file_truncated(tmp_path, smollm2_path):
    raw = Path(smollm2_path).read_bytes()
    for n in (10, 1000, 100_000, len(raw) // 2, len(raw) - 1):
        p = write(tmp_path, raw[:n], f"cut{n}.gguf")
        with pytest.raises(GGUFError) as ei:
            _core.Model([str(p)])
        assert str(p) in str(ei.value)
