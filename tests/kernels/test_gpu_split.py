"""split_mode, tensor_split and main_gpu (issue 17): the offloaded layers placed as
llama.cpp's llama_model::load_tensors places them, on real wgpu devices.

This machine (and CI) has one adapter, Mesa's lavapipe. wgpu lets one adapter be opened as
several devices, and ``PYLLAMA_GPU_REPEAT=N`` lists every usable adapter N times, each
entry its own device (own queue, buffers, pipelines): a split across them is a real
multi-device split, the residual stream leaving one device and entering the next once per
border, each device holding its layers' weights and (with offload_kqv) KV cache.

What is held:
- the placement is llama.cpp's formula (layer il of the ngl offloaded units, the output
  layer counting as unit n_layer, goes to the first device whose cumulative normalized
  share exceeds (il - first) / ngl), derived by hand below for each case;
- the logits of a split agree with llama.cpp's reference and the CPU path within
  tests/kernels/test_gpu.py's tolerances, and are bit-identical to the same layers on one
  device (every kernel and its inputs are the same; the activations cross devices as
  exact f32 copies);
- what llama.cpp refuses is refused: split_mode row / tensor (its Vulkan backend has no
  split buffers), main_gpu past the adapters; tensor_split longer than llama_max_devices,
  negative or not finite; entries past the adapter count are not read (as llama.cpp).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_gpu import _compare, _need_gpu
from test_logits import DATA, N_THREADS, decode_all, load_ref, tiny_path

from pyllama import _core

def _logits(m: _core.Model, prefix, offload_kqv: bool) -> np.ndarray:
    """test_gpu._first_prompt_logits with the context's offload_kqv set."""
    ref, _ = load_ref(prefix)
    toks = np.array(ref["prompts"][0]["tokens"], dtype=np.int32)
    ctx = _core.Context(m, n_ctx=2048, n_seq_max=1, n_ubatch=512, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                        offload_kqv=offload_kqv)
    return decode_all(ctx, toks, ref["n_vocab"])


def _load(path, ngl: int, **kw) -> _core.Model:
    return _core.Model([str(path)], n_gpu_layers=ngl, gpu_allow_software=True, **kw)


# (model, n_gpu_layers, devices, tensor_split, expected description parts)
# tiny-gemma3 has 6 layers: 7 units with the output layer.
#  ts 1,2,1 over 3 devices, all offloaded: shares cum [.25, .75, 1]; unit u -> u/7 =
#    0, .14 | .29, .43, .57, .71 | .86: layers 0-1 on 0, 2-5 on 1, the output on 2
#  equal over 2, ngl 4 (layers 3, 4, 5 and the output): cum [.5, 1]; u/4 = 0, .25 | .5, .75:
#    layers 3-4 on 0, layer 5 and the output on 1
#  ts 3,1 over 2, all: cum [.75, 1]; u/7 = 0 .. .71 | .86: layers 0-5 on 0, the output on 1
# tiny-llama has 2 layers: equal over 2, all: u/3 = 0, .33 | .67: layers 0-1, output apart
SPLITS = [
    ("tiny-gemma3-F32", 99, 3, [1, 2, 1], ["adapter 0 {n}: layers 0-1,", "adapter 1 {n}: layers 2-5,",
                                           "adapter 2 {n}: the output layer,"]),
    ("tiny-gemma3-F32", 4, 2, None, ["adapter 0 {n}: layers 3-4,", "adapter 1 {n}: layer 5 and the output layer,"]),
    ("tiny-gemma3-F32", 99, 2, [3, 1], ["adapter 0 {n}: layers 0-5,", "adapter 1 {n}: the output layer,"]),
    ("tiny-llama-F32", 99, 2, [0, 0], ["adapter 0 {n}: layers 0-1,", "adapter 1 {n}: the output layer,"]),
]


@pytest.mark.parametrize("name,ngl,n_dev,ts,parts", SPLITS, ids=[f"{s[0]}-ngl{s[1]}-{s[2]}dev-{s[3]}" for s in SPLITS])
def test_layer_split_across_devices(monkeypatch, name, ngl, n_dev, ts, parts):
    _need_gpu()
    path = tiny_path(name)
    monkeypatch.setenv("PYLLAMA_GPU_REPEAT", str(n_dev))
    m = _load(path, ngl, split_mode="layer", tensor_split=ts)
    desc = m.offload
    assert desc is not None and desc.startswith(f"GPU offload split by layer over {n_dev} devices"), desc
    adapter = "'" + desc.split("'")[1] + "'"
    for p in parts:
        assert p.format(n=adapter) in desc, (p, desc)
    # the same layers on one device (split_mode none, main_gpu 0)
    one = _load(path, ngl, split_mode="none")
    assert one.offload is not None and "split" not in one.offload, one.offload
    cpu = _core.Model([str(path)])
    prefix = DATA / "tiny" / name
    for kqv in (True, False):
        split, single, ref = _logits(m, prefix, kqv), _logits(one, prefix, kqv), _logits(cpu, prefix, kqv)
        assert np.array_equal(split, single), (kqv, float(np.abs(split - single).max()))
        d = np.abs(split - ref)
        # test_gpu.py's float tolerances against the CPU path
        assert float(d.mean()) <= 0.03 and float(np.percentile(d, 99)) <= 0.15, (kqv, d.mean(), d.max())
        assert not np.array_equal(split, ref), "identical to the CPU: was anything offloaded?"
    # and against llama.cpp's reference, as test_gpu holds the single-device offload
    s = _compare(m, prefix, n_prompts=1)
    assert s["mean"] <= 0.03 and s["p99"] <= 0.15 and s["top1"] >= 0.99, s


def test_kv_cache_lives_on_each_layers_device(monkeypatch):
    # with offload_kqv, each device holds the KV cache of its own layers only: the bytes
    # on the devices are the same as with one device (no layer's cache twice)
    _need_gpu()
    path = tiny_path("tiny-gemma3-F32")
    toks = np.arange(1, 9, dtype=np.int32)

    def kv_bytes(m):
        ctx = _core.Context(m, n_ctx=256, n_seq_max=1, n_ubatch=512, n_threads=2, n_threads_batch=2)
        decode_all(ctx, toks, int(m.hparams()["n_vocab"]))
        return ctx.kv_gpu_bytes()

    monkeypatch.setenv("PYLLAMA_GPU_REPEAT", "3")
    split = kv_bytes(_load(path, 99, tensor_split=[1, 2, 1]))
    one = kv_bytes(_load(path, 99, split_mode="none"))
    assert split == one > 0, (split, one)


def test_tensor_split_entries_past_the_devices_are_not_read(monkeypatch):
    # llama.cpp reads tensor_split[0 .. n_devices): with one device, [0, 1] is [0] = the
    # default (everything on device 0), not "nothing on device 0"
    _need_gpu()
    monkeypatch.delenv("PYLLAMA_GPU_REPEAT", raising=False)
    from pyllama import gpu

    if len(gpu.usable(allow_software=True)) != 1:
        pytest.skip("needs exactly one usable adapter")
    path = tiny_path("tiny-llama-F32")
    for ts in ([0, 1], [1, 0, 5], [0.0] * 16):
        m = _load(path, 99, tensor_split=ts)
        assert m.offload is not None and m.offload.startswith("GPU offload: 2 of the repeating layers and the output"), m.offload


def test_refused_as_llama_cpp_refuses(monkeypatch):
    _need_gpu()
    path = tiny_path("tiny-llama-F32")
    monkeypatch.setenv("PYLLAMA_GPU_REPEAT", "2")
    for sm in ("row", "tensor", 2, 3):
        with pytest.raises(ValueError, match="cannot split a tensor across adapters"):
            _load(path, 99, split_mode=sm if isinstance(sm, str) else ("none", "layer", "row", "tensor")[sm])
    # main_gpu picks the adapter of split_mode none only
    with pytest.raises(ValueError, match="main_gpu = 1: main_gpu picks the adapter of split_mode 'none'"):
        _load(path, 99, main_gpu=1)
    m = _load(path, 99, main_gpu=1, split_mode="none")
    assert m.offload is not None and "split" not in m.offload
    with pytest.raises(ValueError, match="main_gpu = 2: there are 2 usable GPU adapters"):
        _load(path, 99, main_gpu=2, split_mode="none")
    # without layers to offload nothing is placed (as a CPU build of llama.cpp): no error
    assert _load(path, 0, split_mode="row").offload is None


def test_bad_tensor_split_and_split_mode():
    # checked on every load, GPU or not
    path = str(tiny_path("tiny-llama-F32"))
    with pytest.raises(ValueError, match="tensor_split has 17 entries: at most 16"):
        _core.Model([path], tensor_split=[1.0] * 17)
    with pytest.raises(ValueError, match=r"tensor_split\[1\] = -1: each share must be a finite number >= 0"):
        _core.Model([path], tensor_split=[1.0, -1.0])
    with pytest.raises(ValueError, match=r"tensor_split\[0\] = NaN"):
        _core.Model([path], tensor_split=[float("nan")])
    with pytest.raises(ValueError, match="split_mode must be 'none', 'layer', 'row' or 'tensor'"):
        _core.Model([path], split_mode="rows")
    from pyllama.model import Model

    with pytest.raises(ValueError, match="split_mode = 4"):
        Model.load(path, split_mode=4)
    with pytest.raises(TypeError, match="split_mode must be an int or a str"):
        Model.load(path, split_mode=1.0)
    with pytest.raises(TypeError, match="tensor_split must be a sequence"):
        Model.load(path, tensor_split="3,1")
    with pytest.raises(TypeError, match=r"tensor_split\[1\] must be a number"):
        Model.load(path, tensor_split=[1, "1"])


def test_llama_h_and_llama_cpp_python_surfaces(monkeypatch):
    # llama_model_params.split_mode / tensor_split / main_gpu and Llama(...) reach the load
    _need_gpu()
    monkeypatch.setenv("PYLLAMA_GPU", "cpu-ok")
    monkeypatch.setenv("PYLLAMA_GPU_REPEAT", "2")
    path = str(tiny_path("tiny-gemma3-F32"))
    from pyllama import llama_api as L

    L.llama_backend_init()
    p = L.llama_model_default_params()
    p.n_gpu_layers = 99
    p.split_mode = L.LLAMA_SPLIT_MODE_LAYER
    import ctypes

    p.tensor_split = (ctypes.c_float * 16)(1, 2)  # llama-cpp-python's array of llama_max_devices
    m = L.llama_model_load_from_file(path.encode(), p)
    # 7 units, cum [1/3, 1]: u/7 = 0, .14, .29 | .43 ..: layers 0-2 on 0, 3-5 and the output on 1
    assert "layers 0-2," in m.offload and "layers 3-5 and the output layer," in m.offload, m.offload
    L.llama_model_free(m)
    p.split_mode = L.LLAMA_SPLIT_MODE_ROW
    assert L.llama_model_load_from_file(path.encode(), p) is None  # logged, as llama.cpp
    assert L.llama_max_devices() == 16

    from pyllama import Llama

    with pytest.raises(ValueError, match="split_mode 'row'"):
        Llama(path, n_gpu_layers=-1, split_mode=2, verbose=False)
    llm = Llama(path, n_gpu_layers=-1, split_mode=1, tensor_split=[1, 1], verbose=False, n_ctx=64)
    assert "split by layer over 2 devices" in llm._model.offload


def test_gpu_notes_go_to_the_pyllama_logger():
    # the core's run-time notes (here: a bf16 KV cache stays on the CPU) are records of
    # the `pyllama` logger, one line each, not raw stderr
    _need_gpu()
    code = textwrap.dedent(f"""
        import logging, sys
        import numpy as np
        sys.path.insert(0, {str(DATA.parent / "models")!r})
        records = []
        class H(logging.Handler):
            def emit(self, r):
                records.append((r.levelname, r.getMessage()))
        logging.getLogger("pyllama").addHandler(H())
        from pyllama import _core
        m = _core.Model([{str(tiny_path("tiny-llama-F32"))!r}], n_gpu_layers=99, gpu_allow_software=True)
        from test_logits import decode_all
        for _ in range(2):  # two contexts: still one note
            ctx = _core.Context(m, n_ctx=256, n_seq_max=1, n_ubatch=512, n_threads=2, n_threads_batch=2,
                                type_k="bf16", type_v="bf16")
            decode_all(ctx, np.arange(1, 6, dtype=np.int32), int(m.hparams()["n_vocab"]))
        notes = [r for r in records if "stays on the CPU" in r[1]]
        print("NOTES", notes)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONWARNINGS": ""})
    assert r.returncode == 0, r.stderr
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("NOTES")][0]
    assert line.count("stays on the CPU") == 1 and "WARNING" in line and "bf16/bf16" in line, line
    assert "stays on the CPU" not in r.stderr, r.stderr


def test_serve_no_kv_offload_reaches_the_context():
    # pyllama serve -nkvo: the engine's context keeps the KV cache of the GPU layers on the CPU
    _need_gpu()
    from pyllama.generation import vocab_of
    from pyllama.model import Model
    from pyllama.server.engine import Engine, EngineConfig

    m = Model.load(str(tiny_path("tiny-llama-F32")), n_gpu_layers=99, gpu_allow_software=True)
    toks = np.arange(1, 6, dtype=np.int32)
    got = {}
    for kqv in (True, False):
        e = Engine(m, vocab_of(m), EngineConfig(n_ctx=256, n_parallel=1, offload_kqv=kqv))
        assert e.ctx.params.offload_kqv is kqv
        decode_all(e.ctx._core, toks, int(m._core.hparams()["n_vocab"]))
        got[kqv] = e.ctx._core.kv_gpu_bytes()
    assert got[True] > 0 and got[False] == 0, got
