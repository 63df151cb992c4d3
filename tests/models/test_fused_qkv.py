"""One `attn_qkv` matrix or three `attn_q/k/v` ones: llama.cpp's create_tensor_qkv takes
either in every architecture that calls it (llama, qwen2, gemma3, olmo2, cohere2, phi2,
phi3, starcoder2, lfm2, granitehybrid, ...), with the fused bias or the three biases. pyllama
binds both through one loader call (`models::graph::Qkv::load`).

The check: a tiny random-weight model rewritten with its q, k and v rows stacked into one
matrix (and its biases into one vector, or kept as three) gives the same logits as the
file it came from. F32 rows are bytes copied, so each output element is the same dot
product in the same order: equal to the bit, not within a tolerance.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parents[1] / "data"))
from gguf_build import ARR, Spec, Tensor, build  # noqa: E402

from pyllama import Context, Model  # noqa: E402

gguf = pytest.importorskip("gguf")

PROMPT = [1, 5, 9, 13, 2, 7, 11, 3, 17, 4]


def _fields(reader) -> list:
    kvs = []
    for f in reader.fields.values():
        if f.name.startswith("GGUF."):
            continue
        t = int(f.types[0])
        if t == ARR:
            kvs.append((f.name, ARR, (int(f.types[1]), list(f.contents()))))
        else:
            kvs.append((f.name, t, f.contents()))
    return kvs


def fuse_qkv(src: Path, dst: Path, fuse_bias: bool = True) -> Path:
    """`src` with every layer's attn_q/k/v.weight replaced by one attn_qkv.weight (rows q,
    then k, then v) and, when `fuse_bias`, the biases by attn_qkv.bias."""
    r = gguf.GGUFReader(str(src))
    ts = {t.name: t for t in r.tensors}
    out: list[Tensor] = []
    for t in r.tensors:
        name = t.name
        if not (name.endswith("attn_q.weight") or name.endswith("attn_q.bias")):
            if any(name.endswith(f"attn_{x}.{k}") for x in "kv" for k in ("weight", "bias")):
                if name.endswith(".weight") or fuse_bias:
                    continue
            out.append(Tensor(name, [int(n) for n in t.shape], int(t.tensor_type), bytes(t.data.tobytes())))
            continue
        kind = "weight" if name.endswith(".weight") else "bias"
        if kind == "bias" and not fuse_bias:
            out.append(Tensor(name, [int(n) for n in t.shape], int(t.tensor_type), bytes(t.data.tobytes())))
            continue
        pre = name[: -len(f"attn_q.{kind}")]
        parts = [ts[f"{pre}attn_{x}.{kind}"] for x in "qkv"]
        assert all(int(p.tensor_type) == 0 for p in parts), "F32 only"
        data = b"".join(bytes(p.data.tobytes()) for p in parts)
        if kind == "weight":
            ne = [int(parts[0].shape[0]), sum(int(p.shape[1]) for p in parts)]
        else:
            ne = [sum(int(p.shape[0]) for p in parts)]
        out.append(Tensor(f"{pre}attn_qkv.{kind}", ne, 0, data))
    blob, _ = build(Spec(kvs=_fields(r), tensors=out, alignment=int(r.alignment)))
    dst.write_bytes(blob)
    return dst


def split_qkv(src: Path, dst: Path) -> Path:
    """`src` with every attn_qkv.weight / .bias cut into attn_q, attn_k and attn_v (the
    widths from the file's head counts)."""
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    kv = {f.name: f.contents() for f in r.fields.values() if not f.name.startswith("GGUF.")}
    n_head = kv[f"{arch}.attention.head_count"]
    n_kv = kv.get(f"{arch}.attention.head_count_kv", n_head)
    hd = kv.get(f"{arch}.attention.key_length", kv[f"{arch}.embedding_length"] // n_head)
    widths = [n_head * hd, n_kv * hd, n_kv * hd]
    out: list[Tensor] = []
    for t in r.tensors:
        raw = bytes(t.data.tobytes())
        if ".attn_qkv." not in t.name:
            out.append(Tensor(t.name, [int(n) for n in t.shape], int(t.tensor_type), raw))
            continue
        assert int(t.tensor_type) == 0, "F32 only"
        row = int(t.shape[0]) * 4 if t.name.endswith(".weight") else 4
        at = 0
        for x, w in zip("qkv", widths):
            ne = [int(t.shape[0]), w] if t.name.endswith(".weight") else [w]
            out.append(Tensor(t.name.replace("attn_qkv", f"attn_{x}"), ne, 0, raw[at : at + w * row]))
            at += w * row
        assert at == len(raw)
    blob, _ = build(Spec(kvs=_fields(r), tensors=out, alignment=int(r.alignment)))
    dst.write_bytes(blob)
    return dst


def _logits(path: Path) -> np.ndarray:
    model = Model.load(str(path))
    with Context(model, n_ctx=64, n_threads=1) as ctx:
        ctx.decode(PROMPT, logits_all=True)
        return np.array(ctx.logits, copy=True)


# decoders of the shared Decoder (llama, qwen2 with biases, gemma3), own files (olmo2,
# cohere2, phi2, starcoder2) and a hybrid's attention layers (lfm2)
ARCHS = ["llama", "qwen2", "gemma3", "olmo2", "cohere2", "starcoder2", "lfm2"]


@pytest.mark.parametrize("arch", ["phi2", "phi3"])
def test_split_qkv_equals_fused(arch, tiny_model_path, tmp_path):
    """phi2's and phi3's files carry one attn_qkv; three matrices are as good."""
    src = Path(tiny_model_path(arch))
    assert "blk.0.attn_qkv.weight" in [t.name for t in gguf.GGUFReader(str(src)).tensors]
    split = split_qkv(src, tmp_path / "split.gguf")
    assert "blk.0.attn_q.weight" in [t.name for t in gguf.GGUFReader(str(split)).tensors]
    np.testing.assert_array_equal(_logits(split), _logits(src))


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_qkv_equals_split(arch, tiny_model_path, tmp_path):
    src = Path(tiny_model_path(arch))
    names = [t.name for t in gguf.GGUFReader(str(src)).tensors]
    assert any(n.endswith(".attn_q.weight") for n in names)  # lfm2: not in layer 0
    fused = fuse_qkv(src, tmp_path / "fused.gguf")
    assert not any(t.name.endswith(".attn_q.weight") for t in gguf.GGUFReader(str(fused)).tensors)
    np.testing.assert_array_equal(_logits(fused), _logits(src))


@pytest.mark.parametrize("arch", ["qwen2", "starcoder2"])
def test_fused_weight_with_separate_biases(arch, tiny_model_path, tmp_path):
    """llama.cpp: a fused weight may come with the three q/k/v biases (legacy files)."""
    src = Path(tiny_model_path(arch))
    names = [t.name for t in gguf.GGUFReader(str(src)).tensors]
    assert "blk.0.attn_q.bias" in names, f"{arch}'s fixture should carry q/k/v biases"
    fused = fuse_qkv(src, tmp_path / "fused-w.gguf", fuse_bias=False)
    got = [t.name for t in gguf.GGUFReader(str(fused)).tensors]
    assert "blk.0.attn_qkv.weight" in got and "blk.0.attn_q.bias" in got
    np.testing.assert_array_equal(_logits(fused), _logits(src))
