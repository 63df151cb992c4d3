"""The KV cache of GPU-offloaded layers on the device, attention there (issue 17,
``offload_kqv``): tiny models, every layer or half of them offloaded, against the CPU path.

Each scenario runs the same calls on a CPU-only context and on a context of the offloaded
model, and compares every logit they produce: the tiny float models' tolerances of
test_gpu.py (mean |diff| <= 0.03, p99 <= 0.15, top-1 equal where the margin > 0.25). Scenarios: a prompt in
micro-batches, two sequences in one batch (one stream, and a stream each followed by a
cross-stream seq_cp), seq_rm then a re-decode, a saved state loaded
into a fresh context, a position shift (seq_add: the K-shift rewrites the host cache,
which must reach the device). The device really held the cache (``kv_gpu_bytes``), and
the logits differ from ``offload_kqv=False`` (attention on the CPU) while agreeing with it.
lavapipe is slow: a few dozen tokens per scenario.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_gpu import _need_gpu
from test_logits import N_THREADS, tiny_path

from pyllama import _core

TOKS = [1, 15, 27, 300, 44, 91, 7, 2, 150, 61, 33, 210, 5, 88, 19, 240, 77, 12, 3, 130, 9, 66, 111, 4]


def _ctx(m, **kw) -> _core.Context:
    kw.setdefault("n_ubatch", 8)
    return _core.Context(m, n_ctx=128, n_seq_max=2, n_threads=N_THREADS, n_threads_batch=N_THREADS, **kw)


def _decode(ctx, toks, pos, seqs) -> np.ndarray:
    """One batch: tokens at positions `pos` of sequences `seqs`, every row an output,
    micro-batches of n_ubatch; returns the logits [n, n_vocab]."""
    n = len(toks)
    nu = ctx.n_ubatch
    ubs = [np.arange(s, min(s + nu, n), dtype=np.int32) for s in range(0, n, nu)]
    logits = np.zeros((n, ctx.n_vocab), dtype=np.float32)
    r = ctx.decode(np.asarray(toks, np.int32), None, np.asarray(pos, np.int32), np.ones(n, np.int32),
                           np.asarray(seqs, np.int32).reshape(n, 1), ubs, np.arange(n, dtype=np.int32), logits,
                           None, None)
    assert (r.kind, r.n_done) == ("ok", len(ubs))
    return logits


def _prompt(ctx):
    return [_decode(ctx, TOKS[:20], range(20), [0] * 20), _decode(ctx, TOKS[20:22], [20, 21], [0, 0])]


def _two_seqs(ctx):
    # seq 0 and seq 1 interleaved in one batch, then one token each
    toks = TOKS[:12]
    pos = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    seqs = [0, 1] * 6
    return [_decode(ctx, toks, pos, seqs), _decode(ctx, [8, 9], [6, 6], [0, 1])]


def _seq_rm(ctx):
    out = [_decode(ctx, TOKS[:16], range(16), [0] * 16)]
    assert ctx.seq_rm(0, 10, -1)
    out.append(_decode(ctx, TOKS[16:22], range(10, 16), [0] * 6))
    return out


def _shift(ctx):
    out = [_decode(ctx, TOKS[:16], range(16), [0] * 16)]
    assert ctx.seq_rm(0, 4, 8)
    ctx.seq_add(0, 8, -1, -4)  # positions 8..15 -> 4..11: their keys are re-roped
    out.append(_decode(ctx, TOKS[16:20], range(12, 16), [0] * 4))
    return out


def _state(ctx, fresh):
    out = [_decode(ctx, TOKS[:14], range(14), [0] * 14)]
    data = ctx.state_save()
    ctx2 = fresh()
    ctx2.state_load(np.frombuffer(data, np.uint8), n_batch=64)
    out.append(_decode(ctx2, TOKS[14:20], range(14, 20), [0] * 6))
    # and the first context goes on after the save
    out.append(_decode(ctx, TOKS[14:16], range(14, 16), [0] * 2))
    return out


def _two_streams(ctx):
    # kv_unified=False: one stream per sequence; then seq_cp copies stream 0 into stream 1
    # (the host cache's bytes, which must reach the device) and seq 1 goes on from there
    out = _two_seqs(ctx)
    ctx.seq_cp(0, 1, -1, -1)
    out.append(_decode(ctx, [10, 11], [7, 7], [0, 1]))
    return out


SCEN = {"prompt": _prompt, "two_seqs": _two_seqs, "seq_rm": _seq_rm, "shift": _shift, "state": None,
        "two_streams": _two_streams}


def _run(m, name, **kw):
    if name == "two_streams":
        kw["kv_unified"] = False
    ctx = _ctx(m, **kw)
    if name == "state":
        out = _state(ctx, lambda: _ctx(m, **kw))
    else:
        out = SCEN[name](ctx)
    return np.concatenate(out), ctx


def _close(a, b, what):
    d = np.abs(a - b)
    mean, p99 = float(d.mean()), float(np.percentile(d, 99))
    # top-1 equal where the first logits' margin over the second exceeds 0.25 (test_logits' rule)
    srt = np.sort(a, axis=1)
    clear = (srt[:, -1] - srt[:, -2]) > 0.25
    same = a.argmax(1) == b.argmax(1)
    print(f"{what}: max |diff| {d.max():.2e} mean {mean:.2e} p99 {p99:.2e} top1 {same.mean():.2f}")
    assert mean <= 0.03 and p99 <= 0.15, (what, mean, p99, float(d.max()))
    assert same[clear].all(), (what, np.flatnonzero(clear & ~same))
    return float(d.max())


CASES = [("tiny-llama-F32", False, "f16", s) for s in SCEN] + [
    ("tiny-llama-F32", True, "f16", "prompt"),
    ("tiny-llama-F32", True, "f16", "state"),
    ("tiny-llama-F32", False, "f32", "seq_rm"),
    ("tiny-gemma3-F32", False, "f16", "prompt"),  # sliding-window layers
    ("tiny-gemma3-F32", True, "f16", "seq_rm"),
    ("tiny-gemma2-F32", False, "f16", "two_seqs"),  # attention logit softcap
    ("tiny-qwen3-F32", False, "f16", "shift"),  # q/k norms, neox rope
]


@pytest.mark.parametrize("name,half,ctype,scen", CASES,
                         ids=[f"{n}-{'half' if h else 'all'}-{c}-{s}" for n, h, c, s in CASES])
def test_kv_on_device_matches_cpu(name, half, ctype, scen):
    _need_gpu()
    path = tiny_path(name)
    cpu = _core.Model([str(path)])
    n_layer = int(cpu.hparams()["n_layer"])
    ngl = n_layer // 2 + 1 if half else n_layer + 1
    gm = _core.Model([str(path)], n_gpu_layers=ngl, gpu_allow_software=True)
    assert gm.offload is not None, gm.warnings
    want, _ = _run(cpu, scen, type_k=ctype, type_v=ctype)
    got, ctx = _run(gm, scen, type_k=ctype, type_v=ctype)
    assert ctx.offload_kqv and ctx.kv_gpu_bytes() > 0, "the KV cache did not go to the device"
    _close(want, got, f"{name} {scen} vs CPU")
    # attention on the CPU (llama.cpp's --no-kv-offload split) agrees too, and differs
    nokv, ctx2 = _run(gm, scen, type_k=ctype, type_v=ctype, offload_kqv=False)
    assert ctx2.kv_gpu_bytes() == 0 and not ctx2.offload_kqv
    _close(nokv, got, f"{name} {scen} vs offload_kqv=False")
    assert not np.array_equal(nokv, got), "identical logits: attention did not run on the device"


def test_other_cache_types_stay_on_the_cpu():
    # q8_0 K/V: no device attention kernel; the cache stays on the CPU and decode works
    _need_gpu()
    path = tiny_path("tiny-llama-F32")
    gm = _core.Model([str(path)], n_gpu_layers=99, gpu_allow_software=True)
    cpu = _core.Model([str(path)])
    got, ctx = _run(gm, "prompt", type_k="q8_0", type_v="q8_0")
    assert ctx.kv_gpu_bytes() == 0
    want, _ = _run(cpu, "prompt", type_k="q8_0", type_v="q8_0")
    _close(want, got, "q8_0 cache")
