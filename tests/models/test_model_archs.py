"""The architecture registry: every tiny fixture of ../shared/tiny (files llama.cpp loads
and runs) is rebuilt from its header (tests/data/tiny_headers.json: metadata and tensor
table, zero weights) and must pass pyllama's schema, with the hparams llama.cpp derives
(see ../shared/tiny/README.md: SWA patterns, YaRN, head sizes). Unknown architectures
(phi2, qwen3moe have no schema yet) raise UnsupportedModelError naming them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gguf_build import ARR, STR, Spec, Tensor, build
from pyllama import Model, UnsupportedModelError

HEADERS = json.loads((Path(__file__).parents[1] / "data" / "tiny_headers.json").read_text())
TYPE_IDS = {"F32": 0, "F16": 1, "Q8_0": 8}
TYPE_BYTES = {"F32": 4, "F16": 2}


def rebuild(tmp_path: Path, name: str) -> Path:
    h = HEADERS[name]
    kvs = []
    for key, t, et, v in h["kvs"]:
        if t == ARR:
            kvs.append((key, ARR, (et, v)))
        elif t == STR:
            kvs.append((key, STR, v))
        else:
            kvs.append((key, t, v))
    tensors = []
    for tname, ty, ne in h["tensors"]:
        n = 1
        for d in ne:
            n *= d
        nbytes = n // 32 * 34 if ty == "Q8_0" else n * TYPE_BYTES[ty]  # Q8_0: 34 bytes per 32
        tensors.append(Tensor(tname, ne, TYPE_IDS[ty], bytes(nbytes)))
    p = tmp_path / name
    p.write_bytes(build(Spec(kvs=kvs, tensors=tensors))[0])
    return p


SUPPORTED = sorted(HEADERS)  # every architecture of ../shared/tiny has a schema now


@pytest.mark.parametrize("name", SUPPORTED)
def test_tiny_fixture_schema(tmp_path, name):
    p = rebuild(tmp_path, name)
    m = Model.load(p, check_tensors=True)
    md = m.metadata
    arch = md["general.architecture"]
    assert m.arch == arch
    hp = m.hparams
    assert hp["n_layer"] == md[f"{arch}.block_count"] and hp["n_embd"] == md[f"{arch}.embedding_length"]
    assert hp["n_head"] == [md[f"{arch}.attention.head_count"]] * m.n_layer  # per layer
    assert m.n_head_kv == md[f"{arch}.attention.head_count_kv"]
    assert hp["n_embd_head_k"] == md.get(f"{arch}.attention.key_length", m.n_embd // m.n_head)
    assert hp["n_vocab"] == 2048 or "fullvocab" in name
    assert m.desc.startswith(f"{arch} ?B ")  # llama.cpp classifies every tiny model as "?B"


def load_tiny(tmp_path, arch):
    return Model.load(rebuild(tmp_path, f"tiny-{arch}-F32.gguf"))


def test_tiny_hparams_llama_cpp_derives(tmp_path):
    g2 = load_tiny(tmp_path, "gemma2").hparams
    assert g2["n_swa"] == 64 and g2["swa_layers"] == [True, False]  # default pattern 2
    assert g2["f_attn_logit_softcapping"] == 50 and g2["f_final_logit_softcapping"] == 30
    assert g2["f_attention_scale"] == pytest.approx(1 / 32**0.5)
    g3 = load_tiny(tmp_path, "gemma3").hparams
    assert g3["swa_layers"] == [True] * 5 + [False] and g3["rope_freq_base_swa"] == 10000
    assert load_tiny(tmp_path, "phi3").hparams["n_swa"] == 0  # llama.cpp disables Phi SWA
    assert load_tiny(tmp_path, "qwen3").hparams["n_embd_head_k"] == 32
    assert load_tiny(tmp_path, "qwen2").hparams["rope_type"] == "neox"
    m3 = load_tiny(tmp_path, "mistral3").hparams
    assert m3["rope_type"] == "norm" and m3["rope_scaling_type"] == "yarn"
    assert m3["rope_freq_scale"] == pytest.approx(1 / 16) and m3["n_ctx_orig_yarn"] == 128
    assert m3["yarn_beta_fast"] == 32 and m3["yarn_beta_slow"] == 1 and m3["rope_yarn_log_mul"] == 1
    assert m3["f_attn_temp_scale"] == pytest.approx(0.1) and m3["n_attn_temp_floor_scale"] == 128


@pytest.mark.parametrize("arch", ["falcon", "jamba"])
def test_unregistered_architecture_named(tmp_path, arch):
    # tiny-phi2's header relabelled as an architecture pyllama has no schema for
    h = HEADERS["tiny-phi2-F32.gguf"]
    kvs = []
    for key, t, et, v in h["kvs"]:
        if key == "general.architecture":
            v = arch
        kvs.append([key.replace("phi2.", f"{arch}.", 1) if key.startswith("phi2.") else key, t, et, v])
    name = f"tiny-{arch}-F32.gguf"
    HEADERS[name] = {"kvs": kvs, "tensors": h["tensors"]}
    try:
        with pytest.raises(UnsupportedModelError, match=f"unknown model architecture '{arch}'"):
            Model.load(rebuild(tmp_path, name))
        from pyllama import GGUFFile  # the file itself is fine

        assert GGUFFile(rebuild(tmp_path, name)).metadata["general.architecture"] == arch
    finally:
        del HEADERS[name]


def test_schema_rejects_a_wrong_fused_shape(tmp_path):
    h = HEADERS["tiny-phi3-F32.gguf"]
    h2 = {"kvs": h["kvs"], "tensors": [[n, t, ([64, 100] if n == "blk.0.attn_qkv.weight" else ne)] for n, t, ne in h["tensors"]]}
    HEADERS["tiny-phi3-bad.gguf"] = h2
    try:
        with pytest.raises(UnsupportedModelError, match="blk.0.attn_qkv.weight' has wrong shape"):
            Model.load(rebuild(tmp_path, "tiny-phi3-bad.gguf"))
    finally:
        del HEADERS["tiny-phi3-bad.gguf"]


TINY = Path("/work/shared/tiny/models")


@pytest.mark.skipif(not TINY.exists(), reason="../shared/tiny not present")
def test_every_real_tiny_file_loads_or_names_its_architecture():
    for p in sorted(TINY.glob("*.gguf")):
        try:
            m = Model.load(p, check_tensors=True)
        except UnsupportedModelError as e:
            assert "phi2" in str(e) or "qwen3moe" in str(e), (p, e)
            continue
        assert m.n_params > 0, p


# ---- issue 21's architectures: the variants llama.cpp runs that pyllama refuses, by name

@pytest.mark.parametrize("arch, override, message", [
    ("glm4", {"glm4.rope.dimension_sections": 8}, "M-RoPE"),  # GLM-4.1V / GLM-OCR
    ("glm4", {"glm4.nextn_predict_layers": 1}, "NextN"),
    ("exaone4", {"exaone4.nextn_predict_layers": 1}, "NextN"),
    ("granite", {"granite.logit_scale": 0.0}, "logit_scale"),
    ("glm4moe", {"glm4moe.rope.dimension_sections": 8}, "M-RoPE"),
    ("llama4", {"llama4.attention.sliding_window": 0}, "sliding_window"),  # llama.cpp aborts on it
    ("deepseek2", {"deepseek2.attention.key_length_mla": 0}, "pre-MLA"),  # the attn_kv_b layout
    ("deepseek2", {"deepseek2.attention.key_length": 40}, "MLA needs key_length"),
    ("deepseek2", {"deepseek2.expert_group_used_count": 4}, "groups"),
    ("gemma4", {"gemma4.attention.shared_kv_layers": 5}, "fewer than 2"),  # llama.cpp asserts
    ("gemma4", {"gemma4.attention.shared_kv_layers": 3}, "not of its kind"),  # layer 3 (full) -> 2 (window)
    ("lfm2moe", {"lfm2moe.expert_gating_func": 0}, "gating function"),  # llama.cpp aborts on it
])
def test_unsupported_variants_are_refused_by_name(tiny_model_path, arch, override, message):
    with pytest.raises(UnsupportedModelError, match=message):
        Model.load(tiny_model_path(arch), kv_overrides=override)


def test_gemma4_refuses_a_quantized_kv_cache(tiny_model_path):
    # its sliding-window (head 16) and full (head 32) layers would need llama.cpp's two
    # caches, each with its own Hadamard rotation; f16 / f32 caches run
    from pyllama import Context

    m = Model.load(tiny_model_path("gemma4"))
    with pytest.raises(ValueError, match="quantized KV cache"):
        Context(m, n_ctx=64, n_threads=1, type_k="q8_0", type_v="f16")
    with Context(m, n_ctx=64, n_threads=1, type_k="f32", type_v="f32") as ctx:
        ctx.decode([5, 6, 7], logits_all=True)


def test_granite_rope_finetuned_false_turns_rope_off(tiny_model_path):
    # llama.cpp's granite reads rope.scaling.finetuned (default true) as its switch for rope
    import numpy as np

    from pyllama import Context

    def logits(**kw):
        with Context(Model.load(tiny_model_path("granite"), **kw), n_ctx=64, n_threads=1, n_threads_batch=1) as ctx:
            ctx.decode([5, 6, 7, 8], logits_all=True)
            return ctx.logits.copy()

    base = logits()
    assert np.array_equal(base, logits(kv_overrides={"granite.rope.scaling.finetuned": True}))
    off = logits(kv_overrides={"granite.rope.scaling.finetuned": False})
    assert np.array_equal(base[0], off[0])  # position 0: rope is the identity
    assert not np.array_equal(base[1:], off[1:])


def test_nextn_layers_are_counted_and_skipped(tiny_model_path):
    # tiny-glm4moe has 4 blocks, the last a NextN (MTP) block: llama.cpp's n_layer() is 3 and
    # llama_model_n_layer_nextn 1; the trunk's forward pass never reads block 3
    from pyllama import _api_model as A

    m = Model.load(tiny_model_path("glm4moe"))
    assert m.hparams["n_layer"] == 3 and m.hparams["n_layer_nextn"] == 1
    assert A.llama_model_n_layer_nextn(m) == 1
    assert m.hparams["n_ff_shexp"] == m.hparams["n_ff_exp"] == 64
