"""Model loading (pipeline steps 2-6): load modes, zero-copy mmap, progress and
cancellation, check_tensors, kv_overrides, split models, typed errors, and the
llama.h-style model functions.

Expected numbers for the two real models are derived by hand from their tensor tables
and llama.cpp's rules (see test_real_model_numbers)."""

from __future__ import annotations

import gc
import logging
import os
import struct
from pathlib import Path

import numpy as np
import pytest

import pyllama
from gguf_build import STR, U32, Spec, Tensor, build, f32_data
from pyllama import GGUFError, GGUFFile, LoadCancelled, Model, UnsupportedModelError
from pyllama import llama_api as L

MODES = ["auto", "none", "mmap", "mlock", "mmap+mlock", "dio"]


def rss(kind: str = "VmRSS") -> int:
    """This process's resident memory (VmRSS), or one part of it (RssAnon: private
    memory; RssFile: mapped file pages), in bytes."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(kind + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {kind}")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- numbers llama.cpp prints -----------------------------------------------------------


def test_real_model_numbers(smollm2_path, gemma3_path):
    """llama.cpp's print_info for these files, derived by hand:
    SmolLM2: 30 layers x 9 tensors + token_embd + output_norm = 272 tensors; n_params =
    49152*576 (embd) + 576 + 30*(576*576*2 + 576*192*2 + 576*1536*3 + 2*576) = 134,515,008;
    general.file_type = 3 -> "Q4_1"; 30 layers -> LLM_TYPE_256M.
    Gemma 3 270M: 18 layers x 13 tensors + 2 = 236 tensors; n_params = 268,098,176;
    file_type 15 -> "Q4_K - Medium";
    18 layers -> LLM_TYPE_270M."""
    m = Model.load(smollm2_path)
    assert (m.arch, m.n_layer, m.n_embd, m.n_head, m.n_head_kv, m.n_vocab, m.n_ctx_train) == (
        "llama", 30, 576, 9, 3, 49152, 8192)
    assert len(m.tensors) == 272
    assert m.n_params == 49152 * 576 + 576 + 30 * (576 * 576 * 2 + 576 * 192 * 2 + 576 * 1536 * 3 + 2 * 576)
    assert m.ftype_name == "Q4_1" and m.ftype == 3
    assert m.desc == "llama 256M Q4_1"
    g = Model.load(gemma3_path)
    assert (g.arch, g.n_layer, g.n_embd, g.n_head, g.n_head_kv, g.n_vocab, g.n_ctx_train) == (
        "gemma3", 18, 640, 4, 1, 262144, 32768)
    assert len(g.tensors) == 236
    # q and output: 640 x (4 heads * 256); k and v: 640 x 256; FFN 3 x 640 x 2048;
    # 4 norms of 640 and the q/k norms of 256
    per_layer = 640 * 1024 * 2 + 640 * 256 * 2 + 640 * 2048 * 3 + 4 * 640 + 2 * 256
    assert g.n_params == 262144 * 640 + 640 + 18 * per_layer
    assert g.ftype_name == "Q4_K - Medium" and g.desc == "gemma3 270M Q4_K - Medium"
    assert g.size == sum(t.nbytes for t in g.tensors)


def test_type_guess_without_file_type(tmp_path, smollm2_path):
    """Without general.file_type, llama.cpp guesses from the most common tensor type and
    marks it "(guessed)" (SmolLM2: Q4_1 for most matrices)."""
    m = Model.load(smollm2_path, kv_overrides={"general.file_type": 0}, vocab_only=True)
    assert m.ftype_name == "all F32"  # the override itself is honoured
    core = m._core
    assert core.ftype() == (0, False)


# -- load modes -------------------------------------------------------------------------


def auto_reads(size: int) -> bool:
    """What load_mode "auto" does with a model of `size` bytes (storage::auto_reads): read
    it into memory on Linux with transparent huge pages when it fits in half the available
    memory, else map it."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            enabled = f.read()
        thp = "[always]" in enabled or "[madvise]" in enabled
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except OSError:
        return False
    return thp and size <= avail // 2


@pytest.mark.parametrize("mode", MODES)
def test_every_load_mode_gives_the_same_bytes(real_model_path, mode):
    ref = GGUFFile(real_model_path, "none")
    m = Model.load(real_model_path, load_mode=mode)
    assert m.load_mode == mode
    auto_mapped = not auto_reads(os.path.getsize(real_model_path))
    assert m._core.is_mmap == (mode in ("mmap", "mmap+mlock") or (mode == "auto" and auto_mapped))
    for t in ref.tensors[:: max(1, len(ref.tensors) // 12)]:
        assert np.array_equal(m.tensor_raw(t.name), ref.tensor(t.name).raw), t.name


def test_repacked_weights_read_back_as_the_file(smollm2_path):
    """Where the AVX-512 VNNI kernels run and the weights are read into memory, the layers'
    Q4_1 projections are repacked at load into the single-token kernels' x4 layout (the
    same results, tested in the kernel and matmul suites); `tensor_raw` still gives the
    file's bytes. A memory map is never repacked."""
    ref = GGUFFile(smollm2_path, "none")
    m = Model.load(smollm2_path, load_mode="none")
    want = sorted(t.name for t in ref.tensors
                  if t.name.startswith("blk.") and t.name.split(".")[2] in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
                  and t.type == "Q4_1")
    fast = pyllama._core.kernel_set() == "avx512" and os.environ.get("PYLLAMA_NO_REPACK", "0") == "0"
    assert m._core.repacked == (want if fast else []), m._core.repacked[:4]
    for name in want[:: max(1, len(want) // 8)]:
        assert np.array_equal(m.tensor_raw(name), ref.tensor(name).raw), name
    assert Model.load(smollm2_path, load_mode="mmap")._core.repacked == []
    # layers asked of a GPU where none takes them (llama-bench's -ngl 99 on a CPU machine)
    m2 = Model.load(smollm2_path, load_mode="none", n_gpu_layers=99)
    if m2._core.offload is None:
        assert m2._core.repacked == m._core.repacked


def smaps_field(addr: int, field: str) -> int:
    """`field` (kB) of the mapping of this process that holds address `addr`."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no mapping holds {addr:#x}")


def test_auto_reads_the_weights_onto_huge_pages(smollm2_path):
    """Where transparent huge pages can be had (always / madvise) load_mode "auto" reads the
    file into memory advised for 2 MiB pages (the single-token kernels stream those
    faster); elsewhere it maps the file."""
    m = Model.load(smollm2_path)
    if not auto_reads(os.path.getsize(smollm2_path)):
        assert m._core.is_mmap
        return
    assert not m._core.is_mmap
    a = m.tensor_raw("token_embd.weight")
    assert smaps_field(a.ctypes.data, "THPeligible") == 1
    # "mmap" still maps
    assert Model.load(smollm2_path, load_mode="mmap")._core.is_mmap


def test_load_mode_names():
    assert [L.llama_load_mode_name(v) for v in range(-1, 5)] == [
        b"auto", b"none", b"mmap", b"mlock", b"mmap+mlock", b"dio"]
    for v in range(-1, 5):
        assert L.llama_load_mode_from_str(L.llama_load_mode_name(v)) == v
        assert L.llama_load_mode_from_str(L.llama_load_mode_name(v).decode()) == v
    with pytest.raises(ValueError):
        L.llama_load_mode_from_str("mmap+dio")
    with pytest.raises(ValueError, match="load mode"):
        Model.load("x.gguf", load_mode="fast")


def test_mmap_is_zero_copy(gemma3_path):
    """Loading Gemma 3 with mmap maps the weights in place: private memory grows by far less
    than the file (the 20% budget covers the parsed metadata: 262144 tokenizer strings),
    while the map's pages are all resident at once (populated at load, as llama.cpp's
    MAP_POPULATE: no page faults in the first forward pass)."""
    size = os.path.getsize(gemma3_path)
    gc.collect()
    before, before_file = rss("RssAnon"), rss("RssFile")
    m = Model.load(gemma3_path, load_mode="mmap")
    grown = rss("RssAnon") - before
    assert m._core.is_mmap
    assert grown < 0.2 * size, f"private memory grew by {grown / 2**20:.1f} MiB for a {size / 2**20:.1f} MiB file"
    mapped = rss("RssFile") - before_file
    assert mapped > 0.9 * size, f"only {mapped / 2**20:.1f} MiB of the {size / 2**20:.1f} MiB map are resident"
    # The llama.h metadata functions and the chat template do not convert the tokenizer
    # arrays to Python either.
    L.llama_model_meta_count(m)
    m.chat_template()
    assert m._metadata is None
    assert rss("RssAnon") - before < 0.2 * size
    # The weights are views of the mapping, not copies.
    a = m.tensor_raw("blk.0.ffn_down.weight")
    assert not a.flags.owndata and not a.flags.writeable


def test_none_mode_reads_the_file(smollm2_path):
    size = os.path.getsize(smollm2_path)
    gc.collect()
    before = rss()
    m = Model.load(smollm2_path, load_mode="none")
    assert not m._core.is_mmap
    assert rss() - before > 0.9 * size  # really read into memory
    del m


def test_mlock_locks_or_warns(smollm2_path, caplog):
    with caplog.at_level(logging.WARNING, logger="pyllama"):
        m = Model.load(smollm2_path, load_mode="mmap+mlock")
    # Either the pages are locked, or the reason (RLIMIT_MEMLOCK) was logged.
    assert m._core.is_locked or any("mlock" in r.getMessage() for r in caplog.records)


# -- progress and cancellation ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["mmap", "none", "dio"])
def test_progress_monotonic_once_per_tensor(smollm2_path, mode):
    seen: list[float] = []
    m = Model.load(smollm2_path, load_mode=mode, progress=lambda p: seen.append(p) or True)
    assert seen[0] == 0.0 and seen[-1] == 1.0
    assert all(b >= a for a, b in zip(seen, seen[1:]))
    assert all(0.0 <= p <= 1.0 for p in seen)
    assert len(seen) >= len(m.tensors)


@pytest.mark.parametrize("mode", ["mmap", "none"])
@pytest.mark.parametrize("stop_after", [1, 5, 200])
def test_progress_false_cancels_and_leaks_nothing(smollm2_path, mode, stop_after):
    gc.collect()
    fds = open_fds()
    name = os.path.basename(smollm2_path)
    # what other tests may still hold is not this load's leak: compare against it
    maps_before = [l for l in Path("/proc/self/maps").read_text().splitlines() if name in l]
    calls = []

    def cb(p):
        calls.append(p)
        return len(calls) < stop_after

    with pytest.raises(LoadCancelled):
        Model.load(smollm2_path, load_mode=mode, progress=cb)
    assert len(calls) == stop_after
    gc.collect()
    assert open_fds() == fds
    maps_after = [l for l in Path("/proc/self/maps").read_text().splitlines() if name in l]
    assert maps_after == maps_before


def test_progress_callback_exception_propagates(smollm2_path):
    def cb(p):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        Model.load(smollm2_path, progress=cb)


def test_c_style_cancel_returns_none(smollm2_path, caplog):
    L.llama_backend_init()
    p = L.llama_model_default_params()
    p.progress_callback = lambda prog, ud: prog < 0.5
    with caplog.at_level(logging.INFO, logger="pyllama"):
        assert L.llama_model_load_from_file(str(smollm2_path).encode(), p) is None
    assert any("cancel" in r.getMessage() for r in caplog.records)


# -- check_tensors ----------------------------------------------------------------------


def tiny_llama(tmp_path: Path, name: str = "tiny.gguf", poison: bytes | None = None, ty: int = 0) -> Path:
    """A complete 1-layer llama (n_embd 4, 2 heads, n_ff 8, 8 tokens) in F32 with
    arbitrary finite weights; `poison` replaces the first 4 bytes of blk.0.attn_q."""
    n_embd, n_ff, n_vocab = 4, 8, 8
    rng = np.random.default_rng(0)

    def t(name, ne):
        n = int(np.prod(ne))
        return Tensor(name, ne, 0, f32_data(rng.standard_normal(n).astype(np.float32).tolist()))

    tensors = [
        t("token_embd.weight", [n_embd, n_vocab]),
        t("output_norm.weight", [n_embd]),
        t("blk.0.attn_norm.weight", [n_embd]),
        t("blk.0.attn_q.weight", [n_embd, n_embd]),
        t("blk.0.attn_k.weight", [n_embd, n_embd]),
        t("blk.0.attn_v.weight", [n_embd, n_embd]),
        t("blk.0.attn_output.weight", [n_embd, n_embd]),
        t("blk.0.ffn_norm.weight", [n_embd]),
        t("blk.0.ffn_gate.weight", [n_embd, n_ff]),
        t("blk.0.ffn_down.weight", [n_ff, n_embd]),
        t("blk.0.ffn_up.weight", [n_embd, n_ff]),
    ]
    if poison is not None:
        q = tensors[3]
        q.data = poison + q.data[len(poison) :]
    spec = Spec(
        kvs=[
            ("general.architecture", STR, "llama"),
            ("llama.block_count", U32, 1),
            ("llama.embedding_length", U32, n_embd),
            ("llama.feed_forward_length", U32, n_ff),
            ("llama.attention.head_count", U32, 2),
            ("llama.context_length", U32, 64),
        ],
        tensors=tensors,
    )
    p = tmp_path / name
    p.write_bytes(build(spec)[0])
    return p


def test_tiny_llama_loads(tmp_path):
    m = Model.load(tiny_llama(tmp_path), check_tensors=True)
    assert (m.n_layer, m.n_embd, m.n_head, m.n_head_kv, m.n_vocab) == (1, 4, 2, 2, 8)
    assert m.desc == "llama ?B (guessed) all F32"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_check_tensors_finds_nan_inf(tmp_path, bad):
    p = tiny_llama(tmp_path, poison=struct.pack("<f", bad))
    Model.load(p)  # not checked by default
    with pytest.raises(GGUFError, match="blk.0.attn_q.weight.*invalid data"):
        Model.load(p, check_tensors=True)


def test_check_tensors_real_models_clean(real_model_path):
    Model.load(real_model_path, check_tensors=True, load_mode="mmap")


def test_check_tensors_quant_scale(tmp_path, smollm2_path):
    """An f16 NaN written into the scale (d) of one Q4_1 block of a real model is found."""
    f = GGUFFile(smollm2_path)
    t = next(t for t in f.tensors if t.type == "Q4_1")
    raw = bytearray(Path(smollm2_path).read_bytes())
    at = f.data_offset + t.offset + 20 * 3  # block 3's d
    raw[at : at + 2] = struct.pack("<H", 0x7E00)
    p = tmp_path / "nan_scale.gguf"
    p.write_bytes(bytes(raw))
    del raw
    with pytest.raises(GGUFError, match=f"{t.name}.*nan at block 3"):
        Model.load(p, check_tensors=True)


# -- kv_overrides -------------------------------------------------------------------------


def test_kv_overrides(tmp_path):
    p = tiny_llama(tmp_path)
    m = Model.load(p, kv_overrides={"llama.context_length": 1234, "general.name": "renamed"})
    assert m.n_ctx_train == 1234 and m.metadata["general.name"] == "renamed"
    with pytest.raises(ValueError, match="llama.context_length"):
        Model.load(p, kv_overrides={"llama.context_length": "long"})
    with pytest.raises(ValueError, match="fit"):
        Model.load(p, kv_overrides={"llama.context_length": -1})
    L.llama_backend_init()
    params = L.llama_model_default_params()
    params.kv_overrides = [
        L.llama_model_kv_override(b"llama.context_length", L.LLAMA_KV_OVERRIDE_TYPE_INT, 99),
        L.llama_model_kv_override(b"", 0, None),
    ]
    assert L.llama_model_n_ctx_train(L.llama_model_load_from_file(str(p), params)) == 99


# -- errors ---------------------------------------------------------------------------------


def test_unknown_architecture(tmp_path):
    spec = Spec(kvs=[("general.architecture", STR, "mamba9")])
    p = tmp_path / "u.gguf"
    p.write_bytes(build(spec)[0])
    with pytest.raises(UnsupportedModelError, match="unknown model architecture 'mamba9'") as ei:
        Model.load(p)
    assert str(p) in str(ei.value)


def test_missing_tensor_and_wrong_shape(tmp_path):
    p = tiny_llama(tmp_path)
    f = GGUFFile(p)
    spec_md = [(k, STR if isinstance(v, str) else U32, v) for k, v in f.metadata.items()]
    tensors = [Tensor(t.name, list(reversed(t.shape)), 0, f.tensor(t.name).raw.tobytes()) for t in f.tensors]
    del f
    q = tmp_path / "missing.gguf"
    q.write_bytes(build(Spec(kvs=spec_md, tensors=[t for t in tensors if t.name != "blk.0.ffn_up.weight"]))[0])
    with pytest.raises(UnsupportedModelError, match="missing tensor 'blk.0.ffn_up.weight'"):
        Model.load(q)
    Model.load(q, vocab_only=True)  # the vocabulary alone does not need it
    tensors[1] = Tensor("output_norm.weight", [2], 0, f32_data([1, 2]))
    r = tmp_path / "shape.gguf"
    r.write_bytes(build(Spec(kvs=spec_md, tensors=tensors))[0])
    with pytest.raises(UnsupportedModelError, match="output_norm.weight' has wrong shape"):
        Model.load(r)


def test_missing_file():
    with pytest.raises(FileNotFoundError):
        Model.load("/nonexistent/model.gguf")


def test_c_style_failure_returns_none_and_logs(tmp_path, caplog):
    L.llama_backend_init()
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGUF\x01\x00\x00\x00")
    with caplog.at_level(logging.ERROR, logger="pyllama"):
        assert L.llama_model_load_from_file(str(p).encode(), L.llama_model_default_params()) is None
    assert any("version 1" in r.getMessage() for r in caplog.records)


def test_load_without_backend_init_fails_clearly(smollm2_path, caplog):
    L.llama_backend_free()
    try:
        with caplog.at_level(logging.ERROR, logger="pyllama"):
            assert L.llama_model_load_from_file(str(smollm2_path), L.llama_model_default_params()) is None
        assert any("llama_backend_init" in r.getMessage() for r in caplog.records)
    finally:
        L.llama_backend_init()


# -- split models ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_split(tmp_path_factory, smollm2_path):
    """SmolLM2 written again by gguf-py's GGUFWriter as 3 split files (at most 100 tensors
    each): the metadata copied field by field, the tensors byte for byte."""
    gguf = pytest.importorskip("gguf")
    r = gguf.GGUFReader(str(smollm2_path))
    out = tmp_path_factory.mktemp("split") / "smol.gguf"
    w = gguf.GGUFWriter(str(out), "llama", split_max_tensors=100)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), vt, sub)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)  # data shape: numpy order (bytes per row for quants)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    parts = sorted(out.parent.glob("smol-*-of-*.gguf"))
    assert [p.name for p in parts] == [f"smol-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    return parts


def test_split_first_part_finds_the_others(smollm2_split, smollm2_path):
    whole = Model.load(smollm2_path)
    m = Model.load(smollm2_split[0])
    assert m.paths == [str(p) for p in smollm2_split]
    assert m._core.n_files() == 3
    assert m.n_params == whole.n_params and m.size == whole.size and m.desc == whole.desc
    assert m.hparams == whole.hparams
    assert sorted(t.name for t in m.tensors) == sorted(t.name for t in whole.tensors)
    for t in whole.tensors:
        assert np.array_equal(m.tensor_raw(t.name), whole.tensor_raw(t.name)), t.name


def test_split_from_list_and_c_api(smollm2_split):
    L.llama_backend_init()
    params = L.llama_model_default_params()
    m = L.llama_model_load_from_splits([str(p).encode() for p in smollm2_split], 3, params)
    assert m is not None and L.llama_model_n_layer(m) == 30
    assert Model.load(smollm2_split, load_mode="none").n_params == m.n_params
    # a wrong count or a non-first part is an error
    assert L.llama_model_load_from_splits([str(smollm2_split[0])], params) is not None
    with pytest.raises(GGUFError, match="split.count is 3"):
        Model.load(smollm2_split[:2])
    with pytest.raises(GGUFError, match="first split"):
        Model.load(smollm2_split[1])


def test_split_missing_part(tmp_path, smollm2_split):
    for p in smollm2_split:
        (tmp_path / p.name).symlink_to(p)
    (tmp_path / smollm2_split[2].name).unlink()
    with pytest.raises(FileNotFoundError, match="split 3 of 3"):
        Model.load(tmp_path / smollm2_split[0].name)


def test_split_name_parsing():
    from pyllama import _core

    assert _core.split_prefix("/a/b/model-00002-of-00010.gguf") == ("/a/b/model", 1, 10)
    assert _core.split_prefix("model.gguf") is None
    assert _core.split_prefix("m-00000-of-00003.gguf") is None
    assert _core.split_path("/x/m", 0, 3) == "/x/m-00001-of-00003.gguf"


# -- llama.h-style model functions ----------------------------------------------------------


def test_llama_api_model_functions(smollm2_path):
    L.llama_backend_init()
    params = L.llama_model_default_params()
    assert params.n_gpu_layers == 0 and params.load_mode == L.LLAMA_LOAD_MODE_AUTO
    assert params.vocab_only is False and params.check_tensors is False and params.kv_overrides is None
    m = L.llama_model_load_from_file(str(smollm2_path).encode(), params)
    assert isinstance(m, pyllama.Model) and m._core is not None and isinstance(m.metadata, dict)
    assert L.llama_model_n_ctx_train(m) == 8192 and L.llama_model_n_embd(m) == 576
    assert L.llama_model_n_layer(m) == 30 and L.llama_model_n_head(m) == 9 and L.llama_model_n_head_kv(m) == 3
    assert L.llama_model_size(m) == m.size and L.llama_model_n_params(m) == m.n_params
    buf = np.zeros(128, np.uint8)
    n = L.llama_model_desc(m, buf, 128)
    assert bytes(buf[:n]) == b"llama 256M Q4_1" and buf[n] == 0
    # snprintf semantics: truncated to buf_size - 1, full length returned
    small = bytearray(6)
    assert L.llama_model_desc(m, small, 6) == 15 and bytes(small) == b"llama\0"
    assert L.llama_model_meta_val_str(m, b"general.architecture", buf, 128) == 5
    assert bytes(buf[:6]) == b"llama\0"
    assert L.llama_model_meta_val_str(m, b"llama.rope.freq_base", buf, 128) == len("100000.000000")
    assert L.llama_model_meta_val_str(m, b"no.such.key", buf, 128) == -1
    count = L.llama_model_meta_count(m)
    keys = []
    for i in range(count):
        n = L.llama_model_meta_key_by_index(m, i, buf, 128)
        keys.append(bytes(buf[:n]).decode())
    # llama.cpp keeps non-array keys in a std::map: sorted, arrays left out
    assert keys == sorted(keys) and "tokenizer.ggml.tokens" not in keys and "general.name" in keys
    i = keys.index("llama.block_count")
    n = L.llama_model_meta_val_str_by_index(m, i, buf, 128)
    assert bytes(buf[:n]) == b"30"
    assert L.llama_model_meta_key_by_index(m, count, buf, 128) == -1
    tmpl = L.llama_model_chat_template(m, None)
    assert tmpl is not None and tmpl.startswith(b"{% for message in messages %}")
    assert L.llama_model_chat_template(m, b"tool_use") is None
    vocab = L.llama_model_get_vocab(m)
    assert vocab is m.vocab and vocab.n_tokens == 49152
    L.llama_model_free(m)


def test_vocab_only_needs_no_schema(tmp_path, smollm2_path):
    """llama.cpp reads no hyperparameters for vocab-only loads (llama.cpp's own
    ggml-vocab-*.gguf files carry none), and the tokenizer does not depend on the
    architecture: such loads work for any architecture name; full loads name it."""
    f = GGUFFile(smollm2_path)
    md = f.metadata
    kvs = [("general.architecture", STR, "jamba")]
    kvs += [(k, STR, v) for k, v in md.items() if k in ("tokenizer.ggml.model", "tokenizer.ggml.pre")]
    kvs.append(("tokenizer.ggml.tokens", 9, (8, md["tokenizer.ggml.tokens"][:300])))
    kvs.append(("tokenizer.ggml.merges", 9, (8, md["tokenizer.ggml.merges"][:40])))
    p = tmp_path / "vocab-jamba.gguf"
    p.write_bytes(build(Spec(kvs=kvs))[0])
    m = Model.load(p, vocab_only=True)
    assert m.arch == "jamba" and m.n_vocab == 300 and m.n_layer == 0 and m.n_head == 0
    with pytest.raises(UnsupportedModelError, match="unknown model architecture 'jamba'"):
        Model.load(p)
    L.llama_backend_init()
    params = L.llama_model_default_params()
    params.vocab_only = True
    lm = L.llama_model_load_from_file(str(p), params)
    assert lm is not None and L.llama_model_get_vocab(lm).n_tokens == 300


def test_c_style_load_modes(smollm2_path):
    """load_mode as llama.h's enum; the older use_mmap/use_mlock booleans still work."""
    L.llama_backend_init()
    for value, name in [(L.LLAMA_LOAD_MODE_NONE, "none"), (L.LLAMA_LOAD_MODE_DIRECT_IO, "dio"),
                        (L.LLAMA_LOAD_MODE_MMAP_MLOCK, "mmap+mlock")]:
        p = L.llama_model_default_params()
        p.load_mode = value
        assert L.llama_model_load_from_file(str(smollm2_path), p).load_mode == name
    p = L.llama_model_default_params()
    p.use_mmap = False
    assert L.llama_model_load_from_file(str(smollm2_path), p).load_mode == "none"
    p.use_mlock = True
    assert L.llama_model_load_from_file(str(smollm2_path), p).load_mode == "mlock"
    p = L.llama_model_default_params()
    p.load_mode = 17
    assert L.llama_model_load_from_file(str(smollm2_path), p) is None
