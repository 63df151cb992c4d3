"""Every KV cache type of llama.cpp's -ctk / -ctv set against llama.cpp run with the same
types (issue 15): f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1 for K and V, with
flash attention on, off and auto as llama.cpp allows; the combinations llama.cpp refuses
(a quantized V cache without flash attention) refused with an error naming the flag; the
CLI's -ctk / -ctv; saved states with a quantized cache.

References: tests/data/kv_types/kv_reference.npz, made by make_kv_reference.py beside it
with llama.cpp built from the llama-cpp-python 0.3.36 sdist (kv_logits.cpp): the 20
highest logits at every position (and, for tiny-llama, the whole last row) per (model,
type_k, type_v, flash_attn) case.

Tolerances are those of tests/models/test_logits.py (issue 5): tiny random models, float K/V
mean <= 0.03 / p99 <= 0.15, quantized mean <= 0.15 / p99 <= 0.6; real models top-20 mean
<= 0.3, p99 <= 1.2; top-1 equal at >= 99% of positions whose margin is > 0.25. pyllama
runs llama.cpp's own float order for every case (ops/attention.rs: the flash-attention
kernel for the type pair, or with flash attention off llama.cpp's mul_mat / soft_max /
mul_mat path with tinyBLAS's and ggml_v_expf's order) on the same cache bytes (rows
written by ggml's from_float after llama.cpp's Hadamard rotation), so the tiny model must
also agree far closer than that bar (mean <= 0.005, p99 <= 0.02: what is left is
upstream float order), and SmolLM2 agrees to the printed digit.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import numpy as np
import pytest

import pyllama
import pyllama.llama_api as L
from pyllama import _core, _models
from pyllama.context import QUANTIZED_KV_TYPES, Context

from test_logits import decode_all, tiny_path

DATA = Path(__file__).parents[1] / "data" / "kv_types"
REF = np.load(DATA / "kv_reference.npz")
TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
FA = {"auto": -1, "off": 0, "on": 1}


def parse(case: str) -> tuple[str, str, str, str]:
    """'smollm2_q4_0_f16_off' -> ('smollm2', 'q4_0', 'f16', 'off')."""
    model, rest = case.split("_", 1)
    rest, fa = rest.rsplit("_", 1)
    tk = next(t for t in TYPES if rest.startswith(t + "_") and rest[len(t) + 1:] in TYPES)
    return model, tk, rest[len(tk) + 1:], fa


def cases(model: str) -> list[str]:
    return [str(c) for c in REF[f"{model}_cases"]]


@functools.lru_cache(maxsize=None)
def core_model(model: str) -> _core.Model:
    if model == "tiny":
        path = tiny_path("tiny-llama-F32")
    else:
        path = {"smollm2": _models.smollm2_path, "smollm2one": _models.smollm2_path,
                "gemma3": _models.gemma3_path}[model]()
        if path is None:
            pytest.skip(f"reference model {model} is not installed")
    return _core.Model([str(path)])


def make(model: str, tk: str, tv: str, fa: str) -> Context:
    return Context(core_model(model), n_ctx=2048, n_batch=2048, n_ubatch=512, n_threads=2, n_threads_batch=2,
                   type_k=tk, type_v=tv, flash_attn_type=FA[fa])


def compare(case: str) -> dict:
    model, tk, tv, fa = parse(case)
    ctx = make(model, tk, tv, fa)
    toks = REF[f"{model}_tokens"]
    if model.endswith("one"):  # one decode per token: the token-generation kernels
        rows = []
        for t in toks:
            ctx.decode([int(t)])
            rows.append(ctx.logits_ith(-1).copy())
        logits = np.stack(rows)
    else:
        logits = decode_all(ctx._core, toks, ctx.n_vocab)
    ids, vals = REF[f"{case}_topk_ids"], REF[f"{case}_topk_vals"]
    d = np.abs(np.take_along_axis(logits, ids.astype(np.int64), axis=1) - vals)
    sure = (vals[:, 0] - vals[:, 1]) > 0.25
    top1 = float((logits.argmax(1) == ids[:, 0])[sure].mean()) if sure.any() else 1.0
    s = {"max": float(d.max()), "mean": float(d.mean()), "p99": float(np.percentile(d, 99)), "top1": top1}
    if f"{case}_last" in REF.files:
        s["last_max"] = float(np.abs(logits[-1] - REF[f"{case}_last"]).max())
    return s


def accepted(model: str) -> list[str]:
    return [c for c in cases(model) if f"{c}_refused" not in REF.files]


@pytest.mark.parametrize("case", accepted("tiny"))
def test_tiny_llama_every_type_matches_llamacpp(case):
    _, tk, tv, fa = parse(case)
    s = compare(case)
    quantized = tk in QUANTIZED_KV_TYPES or tv in QUANTIZED_KV_TYPES
    mean_tol, p99_tol = (0.15, 0.6) if quantized else (0.03, 0.15)
    assert s["mean"] <= mean_tol and s["p99"] <= p99_tol and s["top1"] >= 0.99, s
    # llama.cpp's own kernels on the same cache bytes
    assert s["mean"] <= 0.005 and s["p99"] <= 0.02, s


@pytest.mark.parametrize("case", accepted("smollm2") + accepted("gemma3") + accepted("smollm2one"))
def test_real_models_every_type_matches_llamacpp(case):
    s = compare(case)
    assert s["mean"] <= 0.3 and s["p99"] <= 1.2 and s["top1"] >= 0.99, s
    if case.startswith("smollm2"):
        assert s["max"] <= 1e-3, s  # the same float order end to end


@pytest.mark.parametrize("case", [c for m in ("tiny", "smollm2", "gemma3", "smollm2one") for c in cases(m)
                                  if f"{c}_refused" in REF.files])
def test_refused_where_llamacpp_refuses(case):
    model, tk, tv, fa = parse(case)
    assert tv in QUANTIZED_KV_TYPES and fa == "off"
    with pytest.raises(ValueError, match=rf"quantized V cache \(type_v = {tv}, -ctv {tv}\) requires flash attention"):
        make(model, tk, tv, fa)


def test_quantized_v_rules(caplog):
    m = core_model("tiny")
    # auto turns flash attention on for a quantized V (llama.cpp logs the same)
    with caplog.at_level(logging.INFO, logger="pyllama"):
        ctx = Context(m, n_ctx=256, n_threads=1, type_k="q4_0", type_v="q4_0", flash_attn_type=-1)
    assert ctx.flash_attn and "required for quantized V cache" in caplog.text
    # a quantized K alone needs nothing
    assert not Context(m, n_ctx=256, n_threads=1, type_k="q4_0", type_v="f16", flash_attn_type=0).flash_attn
    # the llama.h layer: NULL with the reason logged
    p = L.llama_context_default_params()
    p.n_ctx, p.type_k, p.type_v, p.flash_attn_type = 256, L.GGML_TYPE_F16, L.GGML_TYPE_Q5_1, 0
    model = pyllama.Model.load(tiny_path("tiny-llama-F32"))
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="pyllama"):
        assert L.llama_init_from_model(model, p) is None
    assert "type_v = q5_1" in caplog.text and "flash attention" in caplog.text
    # the Rust layer refuses it too
    with pytest.raises(ValueError, match="requires flash attention"):
        _core.Context(m, n_ctx=256, n_seq_max=1, n_ubatch=8, n_threads=1, n_threads_batch=1, type_v="iq4_nl",
                      flash_attn=False)
    # a type outside llama.cpp's set names the set
    with pytest.raises(ValueError, match="supported: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1"):
        Context(m, n_ctx=256, n_threads=1, type_k="q4_k")


def test_memory_per_token_is_llamacpps():
    # llama.cpp's llama_kv_cache size line: per cell and layer, ggml_row_size(type, n_embd_k_gqa)
    # + ggml_row_size(type, n_embd_v_gqa); tiny-llama: 2 layers, 2 KV heads of 64
    per_row = {"f32": 512, "f16": 256, "bf16": 256, "q8_0": 136, "q4_0": 72, "q4_1": 80, "iq4_nl": 72,
               "q5_0": 88, "q5_1": 96}
    m = core_model("tiny")
    for t, rb in per_row.items():
        ctx = Context(m, n_ctx=512, n_threads=1, type_k=t, type_v=t)
        assert ctx._core.kv_bytes() == 2 * 2 * 512 * rb, t


@pytest.mark.parametrize("tk,tv", [("q4_0", "q4_0"), ("iq4_nl", "q5_1"), ("bf16", "q8_0"), ("q4_1", "f16")])
def test_state_round_trip_with_quantized_cache(tk, tv):
    model = pyllama.Model.load(tiny_path("tiny-llama-F32"))
    prompt, nxt = [1, 5, 9, 2, 7, 3, 11, 4, 6, 8, 10, 12], [13, 14, 15]

    def cont(c):
        out = []
        for t in nxt:
            c.decode([t])
            out.append(c.logits_ith(-1).copy())
        return np.stack(out)

    src = Context(model, n_ctx=256, n_threads=1, type_k=tk, type_v=tv)
    src.decode(prompt)
    data = src.save_state()
    ref = cont(src)
    dst = Context(model, n_ctx=256, n_threads=2, type_k=tk, type_v=tv)
    dst.decode([3, 3, 3])
    assert dst.load_state(data) == len(data)
    np.testing.assert_array_equal(cont(dst), ref)
    # the fingerprint carries the types: another V type does not fit
    other = Context(model, n_ctx=256, n_threads=1, type_k=tk, type_v="f16" if tv != "f16" else "q8_0")
    with pytest.raises(pyllama.StateError, match="type_v"):
        other.load_state(data)


def test_cli_cache_types(smollm2_path):
    from typer.testing import CliRunner

    from pyllama.cli import app

    runner = CliRunner()
    base = ["generate", "-m", str(smollm2_path), "-p", "The capital of France is", "-n", "4", "--temp", "0",
            "-c", "256", "-t", "1"]
    for tk, tv in [("q4_0", "iq4_nl"), ("bf16", "q5_1"), ("q4_1", "f32")]:
        r = runner.invoke(app, base + ["-ctk", tk, "-ctv", tv])
        assert r.exit_code == 0, r.output
    # llama.cpp's refusal, naming the flag and the type
    r = runner.invoke(app, base + ["-ctv", "q5_0", "-fa", "off"])
    assert r.exit_code != 0 and "-ctv q5_0" in r.output and "flash attention" in r.output
    # a name outside llama.cpp's set is a usage error listing the set
    r = runner.invoke(app, base + ["-ctk", "q4_k"])
    assert r.exit_code != 0 and "'-ctk'" in r.output and "iq4_nl" in r.output
    # pyllama bench: -ctk / -ctv lists of the new types, one row per combination
    r = runner.invoke(app, ["bench", "-m", str(smollm2_path), "-p", "4", "-n", "0", "-r", "1", "-t", "1",
                            "-ctk", "bf16,q5_1", "-ctv", "q4_0", "-o", "jsonl"])
    assert r.exit_code == 0, r.output
    import json

    rows = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert [(x["type_k"], x["type_v"]) for x in rows] == [("bf16", "q4_0"), ("q5_1", "q4_0")]
    # -fa off runs llama.cpp's unfused path; with a quantized V the context is refused, as llama-bench does
    r = runner.invoke(app, ["bench", "-m", str(smollm2_path), "-p", "4", "-n", "0", "-r", "1", "-t", "1",
                            "-ctk", "q8_0", "-fa", "off"])
    assert r.exit_code == 0 and "q8_0" in r.stdout, r.output
    r = runner.invoke(app, ["bench", "-m", str(smollm2_path), "-p", "4", "-n", "0", "-r", "1", "-t", "1",
                            "-ctv", "q4_0", "-fa", "off"])
    assert r.exit_code != 0 and "failed to create a context" in r.output and "-ctv q4_0" in r.output
