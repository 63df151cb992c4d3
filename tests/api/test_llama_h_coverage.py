"""pyllama.llama_api covers llama.h: every ``LLAMA_API`` function of llama.cpp 0c1e570's
llama.h (tests/data/llama_h_functions.json, written by tests/data/make_llama_h_functions.py)
exists with llama.h's parameters in llama.h's order, the functions that raise
NotImplementedError are exactly README.md's table, and the functions added for issue 25
behave as llama.cpp's (values derived from llama.cpp's source, cited per test).

The parameter rule: the Python function's positional parameters carry llama.h's names in
llama.h's order and accept llama.h's argument count, except
- a name that is a Python builtin gets a different spelling (RENAMED);
- a function that also takes llama-cpp-python's shorter form keeps llama.h's leading
  parameters and takes the rest as ``*args`` (VARIADIC), still accepting llama.h's count.
"""

from __future__ import annotations

import ctypes
import inspect
import io
import json
import logging
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import pyllama.llama_api as L
from pyllama.sampling import SamplerChain, TokenDataArray
from pyllama.vocab import Vocab

DATA = Path(__file__).parents[1] / "data"
sys.path.insert(0, str(Path(__file__).parents[1]))
from test_tokenizer import suite_metadata  # noqa: E402

LLAMA_H = json.loads((DATA / "llama_h_functions.json").read_text())["functions"]

#: (function, llama.h name) -> Python name, where llama.h's name is a Python builtin
RENAMED = {("llama_load_mode_from_str", "str"): "s", ("llama_chat_builtin_templates", "len"): "len_"}
#: functions that also take llama-cpp-python's form: the leading llama.h parameters are
#: named, the rest arrive in *args
VARIADIC = {
    "llama_model_load_from_splits": "(paths, n_paths, params) as llama.h or (paths, params)",
    "llama_sampler_init_penalties": "(n_vocab, last_n, repeat, freq, present) as llama.h or without n_vocab",
}
#: functions not written yet (none: the LoRA ones are in python/pyllama/_api_adapter.py)
PENDING: set = set()


def test_the_list_is_llama_h():
    names = [f["name"] for f in LLAMA_H]
    assert len(names) == len(set(names)) == 255
    assert {"llama_decode", "llama_batch_ext_add_token", "llama_opt_epoch", "llama_log_set"} <= set(names)


@pytest.mark.parametrize("f", LLAMA_H, ids=lambda f: f["name"])
def test_every_llama_h_function_exists_in_llama_h_order(f):
    name, params = f["name"], f["params"]
    fn = getattr(L, name, None)
    if fn is None and name in PENDING:
        pytest.skip(f"{name}: LoRA part of issue 25, in another session")
    assert fn is not None and callable(fn), f"pyllama.llama_api has no {name}"
    sig = inspect.signature(fn)
    named = [p.name for p in sig.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    want = [RENAMED.get((name, p), p) for p in params]
    if name in VARIADIC:
        assert any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values())
        assert named == want[: len(named)], (name, named, want)
    else:
        assert named == want, f"{name}{tuple(named)}: llama.h has {tuple(want)}"
    sig.bind(*range(len(params)))  # llama.h's argument count is accepted


def _readme_not_supported() -> set[str]:
    text = (Path(__file__).parents[2] / "README.md").read_text()
    table = text[text.index("| llama.h function | why |"):]
    table = table[: table.index("\n\n")]
    names = set()
    for row in table.splitlines()[2:]:
        names |= set(re.findall(r"`(llama_\w+)`", row.split("|")[1]))
    return names


def test_not_supported_is_the_readme_table():
    assert set(L.NOT_SUPPORTED) == _readme_not_supported()
    for f in LLAMA_H:
        if f["name"] in L.NOT_SUPPORTED:
            with pytest.raises(NotImplementedError, match=rf"^{f['name']}: not supported by pyllama: .+"):
                getattr(L, f["name"])(*([None] * len(f["params"])))


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    L.llama_backend_init()
    cache = {}

    def get(arch):
        if arch not in cache:
            cache[arch] = L.llama_model_load_from_file(str(tiny_model_path(arch)).encode(),
                                                       L.llama_model_default_params())
        return cache[arch]

    return get


@pytest.fixture
def ctx(tiny):
    p = L.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max, p.n_threads, p.n_threads_batch = 256, 64, 64, 1, 1, 1
    c = L.llama_init_from_model(tiny("llama"), p)
    yield c
    L.llama_free(c)


@pytest.fixture(scope="module")
def gpt2():
    return Vocab.from_metadata(suite_metadata("gpt-2"), source="gpt-2")


# ---------------------------------------------------------------------- introspection

# llama-model.cpp llama_model_rope_type: LLAMA_ROPE_TYPE_NORM for llama, mistral3, smollm3, granite and glm4,
# _NEOX for qwen2, qwen3, qwen3moe, phi2, phi3, gemma, gemma2, gemma3, olmo2, starcoder2, exaone4
ROPE = {"llama": 0, "mistral3": 0, "smollm3": 0, "granite": 0, "glm4": 0, "qwen2": 2, "qwen3": 2, "qwen3moe": 2, "phi2": 2, "phi3": 2, "gemma": 2,
        "gemma2": 2, "gemma3": 2, "olmo2": 2, "starcoder2": 2, "exaone4": 2,
        # NORM: llama4, granitemoe, cohere2, deepseek2, mistral4; NEOX: phimoe, glm4moe, gpt-oss
        "llama4": 0, "granitemoe": 0, "cohere2": 0, "deepseek2": 0, "mistral4": 0, "phimoe": 2, "glm4moe": 2,
        "gpt-oss": 2}


@pytest.mark.parametrize("arch", sorted(ROPE))
def test_rope_type_per_architecture(tiny, arch):
    assert L.llama_model_rope_type(tiny(arch)) == ROPE[arch]


def test_model_introspection(tiny):
    m = tiny("llama")
    n_embd = L.llama_model_n_embd(m)
    assert L.llama_model_n_embd_inp(m) == L.llama_model_n_embd_out(m) == n_embd == 256
    assert L.llama_model_n_layer_nextn(m) == 0
    assert L.llama_model_n_swa(m) == 0
    # hparams.n_swa from {arch}.attention.sliding_window (tests/data/make_tiny.py: 64)
    assert L.llama_model_n_swa(tiny("gemma2")) == L.llama_model_n_swa(tiny("gemma3")) == 64
    assert L.llama_model_n_swa(tiny("phi3")) == 0  # models/phi3.cpp: "Phi SWA is currently disabled"
    # rope_freq_scale_train = 1 / {arch}.rope.scaling.factor (mistral3's tiny model: YaRN factor 16)
    assert L.llama_model_rope_freq_scale_train(m) == 1.0
    assert L.llama_model_rope_freq_scale_train(tiny("mistral3")) == pytest.approx(1 / 16)
    assert L.llama_model_n_cls_out(m) == 1  # hparams default without classifier labels
    assert L.llama_model_cls_label(m, 0) is None
    assert not L.llama_model_has_encoder(m) and L.llama_model_has_decoder(m)
    assert L.llama_model_decoder_start_token(m) == -1
    assert not (L.llama_model_is_recurrent(m) or L.llama_model_is_hybrid(m) or L.llama_model_is_diffusion(m))
    assert L.llama_model_meta_key_str(L.LLAMA_MODEL_META_KEY_SAMPLING_TOP_K) == b"general.sampling.top_k"
    assert L.llama_model_meta_key_str(L.LLAMA_MODEL_META_KEY_SAMPLING_MIROSTAT_ETA) == b"general.sampling.mirostat_eta"
    assert L.llama_model_meta_key_str(12) is None
    # the deprecated spellings
    assert L.llama_n_ctx_train(m) == L.llama_model_n_ctx_train(m) == 2048
    assert L.llama_n_embd(m) == n_embd and L.llama_n_layer(m) == 2 and L.llama_n_head(m) == 4
    with pytest.raises(ValueError, match="llama_model_cls_label: i = -1 does not fit uint32"):
        L.llama_model_cls_label(m, -1)


def test_context_introspection(ctx):
    assert L.llama_n_rs_seq(ctx) == 0  # clamped to 0 without recurrent rollback (llama-context.cpp)
    assert L.llama_get_causal_attn(ctx) is True
    L.llama_set_causal_attn(ctx, True)
    with pytest.raises(ValueError, match="llama_set_causal_attn: causal_attn = False: non-causal attention is not"):
        L.llama_set_causal_attn(ctx, False)
    assert L.llama_get_causal_attn(ctx) is True


def test_suppress_tokens(gpt2):
    """tokenizer.ggml.suppress_tokens, ids outside the vocabulary dropped (llama-vocab.cpp)."""
    assert L.llama_vocab_get_suppress_tokens(gpt2, None).tolist() == []
    md = dict(suite_metadata("gpt-2"))
    md["tokenizer.ggml.suppress_tokens"] = [5, 99999999, -1, 7]
    v = Vocab.from_metadata(md, source="gpt-2+suppress")
    n = ctypes.c_int32(-1)
    toks = L.llama_vocab_get_suppress_tokens(v, ctypes.byref(n))
    assert toks.dtype == np.int32 and toks.tolist() == [5, 7] and n.value == 2


def test_system_functions():
    assert re.fullmatch(rb"\d+\.\d+\.\d+\S*", L.llama_version())
    info = L.llama_print_system_info()
    assert re.fullmatch(rb"CPU : ([A-Z0-9_]+ = 1 \| )*KERNELS = \w+ \| ", info), info
    assert L.llama_supports_gpu_offload() is False and L.llama_supports_rpc() is False
    assert L.llama_max_devices() == 16 and L.llama_max_tensor_buft_overrides() == 4096
    for numa in range(5):
        L.llama_numa_init(numa)
    with pytest.raises(ValueError, match="llama_numa_init: numa = 5 is not a ggml_numa_strategy"):
        L.llama_numa_init(5)


def test_type_names():
    # llama-model-loader.cpp llama_ftype_name and llama.cpp llama_flash_attn_type_name
    assert L.llama_ftype_name(0) == b"all F32"
    assert L.llama_ftype_name(15) == b"Q4_K - Medium"
    assert L.llama_ftype_name(15 | 1024) == b"(guessed) Q4_K - Medium"
    assert L.llama_ftype_name(27) == b"IQ3_S mix - 3.66 bpw"
    assert L.llama_ftype_name(4) == b"unknown, may not work"
    assert [L.llama_flash_attn_type_name(t) for t in (-1, 0, 1)] == [b"auto", b"disabled", b"enabled"]
    with pytest.raises(ValueError, match="llama_flash_attn_type_name: flash_attn_type = 2"):
        L.llama_flash_attn_type_name(2)


def test_split_path_and_prefix():
    """llama.h's own examples, snprintf's truncation, and the prefix only when split_no and
    split_count match (llama.cpp llama_split_path / llama_split_prefix)."""
    buf = bytearray(64)
    n = L.llama_split_path(buf, len(buf), b"/models/ggml-model-q4_0", 1, 4)
    assert n == 43 and bytes(buf[: n + 1]) == b"/models/ggml-model-q4_0-00002-of-00004.gguf\0"
    small = bytearray(10)
    assert L.llama_split_path(small, 10, b"/models/ggml-model-q4_0", 1, 4) == 0  # does not fit
    assert bytes(small) == b"/models/g\0"
    n = L.llama_split_prefix(buf, 64, b"/models/ggml-model-q4_0-00002-of-00004.gguf", 1, 4)
    assert n == 23 and bytes(buf[:24]) == b"/models/ggml-model-q4_0\0"
    assert L.llama_split_prefix(buf, 64, b"/models/ggml-model-q4_0-00002-of-00004.gguf", 2, 4) == 0
    assert L.llama_split_prefix(buf, 64, b"-00001-of-00001.gguf", 0, 1) == 0  # nothing before the postfix
    short = bytearray(5)
    assert L.llama_split_prefix(short, 5, "a/bcdefg-00001-of-00002.gguf", 0, 2) == 8
    assert bytes(short) == b"a/bc\0"


def test_quantize_params_defaults():
    # llama-quant.cpp llama_model_quantize_default_params
    p = L.llama_model_quantize_default_params()
    assert (p.nthread, p.ftype, p.output_tensor_type, p.token_embedding_type) == (0, 7, 43, 43)
    assert (p.allow_requantize, p.quantize_output_tensor, p.only_copy, p.pure, p.keep_split, p.dry_run) == \
        (False, True, False, False, False, False)
    assert p.max_buf_size == 8 << 30 and p.imatrix is None and p.kv_overrides is None
    # a missing input is a failure (1), as llama.cpp reports it; unsupported fields raise
    assert L.llama_model_quantize(b"/nonexistent/in.gguf", b"out.gguf", p) == 1
    p.kv_overrides = object()
    with pytest.raises(NotImplementedError, match="kv_overrides"):
        L.llama_model_quantize(b"in.gguf", b"out.gguf", p)


def test_model_quantize_writes_what_pyllama_quantize_writes(tmp_path):
    import hashlib
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "data"))
    import make_tiny

    src = make_tiny.write_tiny("llama", tmp_path)
    p = L.llama_model_quantize_default_params()
    p.ftype = 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    p.nthread = 2
    assert L.llama_model_quantize(str(src).encode(), str(tmp_path / "a.gguf").encode(), p) == 0
    from pyllama.imatrix import quantize

    quantize(src, tmp_path / "b.gguf", "Q4_K_M")
    assert hashlib.sha256((tmp_path / "a.gguf").read_bytes()).digest() == \
        hashlib.sha256((tmp_path / "b.gguf").read_bytes()).digest()
    p.dry_run = True  # computes the plan, writes nothing
    assert L.llama_model_quantize(str(src).encode(), str(tmp_path / "c.gguf").encode(), p) == 0
    assert not (tmp_path / "c.gguf").exists()


# ---------------------------------------------------------------------- save / load from file objects


def _logits(model, tokens):
    p = L.llama_context_default_params()
    p.n_ctx, p.n_threads, p.n_threads_batch = 256, 1, 1
    c = L.llama_init_from_model(model, p)
    assert L.llama_decode(c, L.llama_batch_get_one(np.array(tokens, np.int32))) == 0
    out = L.llama_get_logits_ith(c, -1).copy()
    L.llama_free(c)
    return out


def test_save_to_file_round_trip(tiny, tiny_model_path, tmp_path):
    m = tiny("gemma3")
    out = tmp_path / "saved.gguf"
    L.llama_model_save_to_file(m, str(out).encode())
    m2 = L.llama_model_load_from_file(str(out).encode(), L.llama_model_default_params())
    assert m2 is not None
    assert m2._core.metadata() == m._core.metadata()
    assert [t[:3] for t in m2._core.tensors()] == [t[:3] for t in m._core.tensors()]
    for name, *_ in m._core.tensors():
        assert bytes(m2._core.tensor_raw(name)) == bytes(m._core.tensor_raw(name)), name
    assert np.array_equal(_logits(m2, [1, 2, 3]), _logits(m, [1, 2, 3]))
    # the saved file is a plain GGUF: the original file's bytes exactly, for this generated model
    assert out.read_bytes() == Path(tiny_model_path("gemma3")).read_bytes()


def test_load_from_file_object(tiny, tiny_model_path):
    path = Path(tiny_model_path("llama"))
    with open(path, "rb") as f:  # a file at position 0: loaded from its path
        m = L.llama_model_load_from_file_ptr(f, L.llama_model_default_params())
    assert m is not None and m.desc == tiny("llama").desc
    data = b"prefix!!" + path.read_bytes()
    bio = io.BytesIO(data)
    bio.seek(8)  # read from the current position: the GGUF inside a larger file
    m = L.llama_model_load_from_file_ptr(bio, L.llama_model_default_params())
    assert m is not None and np.array_equal(_logits(m, [5, 6]), _logits(tiny("llama"), [5, 6]))
    assert L.llama_model_load_from_file_ptr(io.BytesIO(b"not a gguf"), L.llama_model_default_params()) is None
    with pytest.raises(TypeError, match="llama_model_load_from_file_ptr: file must be a binary file object"):
        L.llama_model_load_from_file_ptr(str(path), L.llama_model_default_params())


# ---------------------------------------------------------------------- logging


def test_log_callback_sees_pyllama_messages_with_ggml_levels(tiny):
    seen = []
    assert L.llama_log_get() == (None, None)
    L.llama_log_set(lambda level, text, ud: seen.append((level, text, ud)), "ud")
    try:
        cb, ud = [None], [None]
        L.llama_log_get(cb, ud)
        assert callable(cb[0]) and ud[0] == "ud"
        p = L.llama_context_default_params()
        p.n_ctx, p.n_seq_max, p.n_threads, p.n_threads_batch = 768, 2, 1, 1
        c = L.llama_init_from_model(tiny("llama"), p)  # INFO summary + WARN n_ctx rounding
        chain = L.llama_sampler_chain_init(None)
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
        L.llama_set_sampler(c, 0, chain)  # DEBUG
        assert L.llama_decode(c, L.llama_batch_get_one(np.array([1 << 20], np.int32))) == -1  # ERROR
        L.llama_free(c)
    finally:
        L.llama_log_set(None, None)
    levels = {lvl for lvl, _, _ in seen}
    assert {L.GGML_LOG_LEVEL_DEBUG, L.GGML_LOG_LEVEL_INFO, L.GGML_LOG_LEVEL_WARN, L.GGML_LOG_LEVEL_ERROR} <= levels
    assert all(isinstance(t, bytes) and t.endswith(b"\n") and ud == "ud" for _, t, ud in seen)
    assert any(lvl == L.GGML_LOG_LEVEL_WARN and b"n_ctx is not divisible by n_seq_max" in t for lvl, t, _ in seen)
    n = len(seen)
    logging.getLogger("pyllama").warning("after unset")
    assert len(seen) == n and L.llama_log_get() == (None, None)


# ---------------------------------------------------------------------- threads


def test_threadpool_attach_and_detach(ctx):
    L.llama_set_n_threads(ctx, 1, 1)
    tp = L.ggml_threadpool_new(L.ggml_threadpool_params_default(2))
    tpb = L.ggml_threadpool_new(L.ggml_threadpool_params_default(3))
    L.llama_attach_threadpool(ctx, tp, tpb)
    assert (L.llama_n_threads(ctx), L.llama_n_threads_batch(ctx)) == (2, 3)
    assert L.llama_decode(ctx, L.llama_batch_get_one(np.array([1, 2, 3], np.int32))) == 0
    L.llama_attach_threadpool(ctx, tp, None)  # no batch pool: the same pool for both
    assert (L.llama_n_threads(ctx), L.llama_n_threads_batch(ctx)) == (2, 2)
    L.llama_detach_threadpool(ctx)
    assert (L.llama_n_threads(ctx), L.llama_n_threads_batch(ctx)) == (1, 1)
    L.llama_detach_threadpool(ctx)  # none attached: no-op
    params = L.ggml_threadpool_params_default(2)
    params.prio = L.GGML_SCHED_PRIO_HIGH
    with pytest.raises(ValueError, match="ggml_threadpool_new: params.prio = 2: pyllama does not change thread"):
        L.ggml_threadpool_new(params)
    params = L.ggml_threadpool_params_default(2)
    params.poll = 0
    with pytest.raises(ValueError, match="params.poll = 0"):
        L.ggml_threadpool_new(params)
    with pytest.raises(TypeError, match="llama_attach_threadpool: threadpool must be a ggml_threadpool"):
        L.llama_attach_threadpool(ctx, 4, None)


# ---------------------------------------------------------------------- samplers


class BanToken:
    """A llama_sampler_i written in Python: bans one token, counts accepts and resets."""

    def __init__(self, banned):
        self.banned, self.accepted, self.resets, self.freed = banned, [], 0, 0

    def name(self, smpl):
        return b"ban"

    def apply(self, smpl, cur_p):
        logits = np.array(cur_p.logits)
        logits[cur_p.ids == self.banned] = -np.inf
        cur_p.logits = logits

    def accept(self, smpl, token):
        self.accepted.append(token)

    def reset(self, smpl):
        self.resets += 1

    clone = None

    def free(self, smpl):
        self.freed += 1


def test_user_sampler_in_a_chain(ctx):
    assert L.llama_decode(ctx, L.llama_batch_get_one(np.array([1, 2, 3], np.int32))) == 0
    best = int(np.argmax(L.llama_get_logits_ith(ctx, -1)))
    iface = BanToken(best)
    smpl = L.llama_sampler_init(iface, None)
    assert L.llama_sampler_name(smpl) == "ban"
    chain = L.llama_sampler_chain_init(None)
    L.llama_sampler_chain_add(chain, smpl)
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
    tok = L.llama_sampler_sample(chain, ctx, -1)
    logits = L.llama_get_logits_ith(ctx, -1).copy()
    logits[best] = -np.inf
    assert tok == int(np.argmax(logits)) != best
    assert iface.accepted == [tok]
    L.llama_sampler_reset(chain)
    assert iface.resets == 1
    clone = L.llama_sampler_clone(smpl)  # no clone callback, ctx None: a new sampler, same iface
    assert clone is not smpl and clone.iface is iface
    with pytest.raises(ValueError, match="does not support cloning"):
        L.llama_sampler_clone(L.llama_sampler_init(iface, {"state": 1}))
    L.llama_sampler_free(chain)
    assert iface.freed == 1
    with pytest.raises(TypeError, match="llama_sampler_init: iface must have a callable apply"):
        L.llama_sampler_init(object(), None)


def test_sampler_copy():
    rows = np.random.default_rng(0).normal(size=(4, 32)).astype(np.float32)
    src, dst = L.llama_sampler_init_dist(7), L.llama_sampler_init_dist(99)
    for r in rows[:2]:
        cur = TokenDataArray.from_logits(r)
        L.llama_sampler_apply(src, cur)
    L.llama_sampler_copy(src, dst)
    for r in rows[2:]:
        a, b = TokenDataArray.from_logits(r), TokenDataArray.from_logits(r)
        L.llama_sampler_apply(src, a)
        L.llama_sampler_apply(dst, b)
        assert a.selected == b.selected
    ca, cb = L.llama_sampler_chain_init(None), L.llama_sampler_chain_init(None)
    L.llama_sampler_chain_add(ca, L.llama_sampler_init_dist(1))
    keep = L.llama_sampler_init_dist(2)
    L.llama_sampler_chain_add(cb, keep)
    L.llama_sampler_copy(ca, cb)
    assert L.llama_sampler_chain_get(cb, 0) is keep  # the chain keeps its own samplers
    assert ca.sample(rows[0]) == cb.sample(rows[0])
    with pytest.raises(ValueError, match="llama_sampler_copy: cannot copy between different sampler types"):
        L.llama_sampler_copy(L.llama_sampler_init_greedy(), L.llama_sampler_init_dist(1))
    L.llama_sampler_copy(None, dst)  # NULL: nothing


def _cur(ids, probs):
    return TokenDataArray(np.array(ids, np.int32), np.log(np.array(probs, np.float32)))


def test_infill_merges_prefixes_and_drops_low_probabilities(gpt2):
    """llama.h's example: hel 0.5, hell 0.2, hello 0.1 merge into hel (0.8); the other token
    (0.1 < 0.2) is dropped; the result is renormalised."""
    hel, hell, hello, b = 2978, 12758, 31373, 65
    smpl = L.llama_sampler_init_infill(gpt2)
    cur = _cur([hel, hell, hello, b], [0.5, 0.2, 0.1, 0.2 - 1e-3])
    L.llama_sampler_apply(smpl, cur)
    assert cur.ids.tolist() == [hel] and cur.p.tolist() == [1.0]


def test_infill_picks_eog_when_likely_and_eot_when_nothing_is_left(gpt2):
    eos = L.llama_vocab_eos(gpt2)
    smpl = L.llama_sampler_init_infill(gpt2)
    # 3 * p_eog * n = 3 * 0.1 * 3 = 0.9 > p_txt = 0.9 - ulp: only the EOG tokens stay
    cur = _cur([64, 65, eos], [0.5, 0.4 - 1e-3, 0.1])
    L.llama_sampler_apply(smpl, cur)
    assert cur.ids.tolist() == [eos] and cur.p.tolist() == [1.0]
    # no text token reaches 0.2 and no EOG: the single candidate is EOT (gpt-2: EOS's id)
    ids = list(range(100, 110))
    cur = _cur(ids, [0.1] * 10)
    L.llama_sampler_apply(smpl, cur)
    assert cur.ids.tolist() == [L.llama_vocab_eot(gpt2)] and cur.logits.tolist() == [1.0]


def test_infill_second_threshold_drops_text_tokens_under_one_over_n_plus_one(gpt2):
    """After the 0.2 cut and renormalising, llama.cpp drops the text tokens under
    1 / (n_text + 1): with 3 text tokens 0.5, 0.28, 0.22 that is 0.25, so 0.22 goes and the
    other two are renormalised."""
    smpl = L.llama_sampler_init_infill(gpt2)
    cur = _cur([64, 65, 66], [0.5, 0.28, 0.22])  # "a", "b", "c": no piece prefixes another
    L.llama_sampler_apply(smpl, cur)
    assert cur.ids.tolist() == [64, 65]
    np.testing.assert_allclose(cur.p, [0.5 / 0.78, 0.28 / 0.78], rtol=1e-5)


def test_adaptive_p_transform_and_ema():
    """llama-sampler.cpp adaptive-p: logit = 5 - 10 d^2 / (1 + d), d = |p - target'| / 0.3,
    target' = 2 target - EMA; the EMA takes the chosen token's original probability."""
    smpl = L.llama_sampler_init_adaptive_p(0.5, 0.9, 1234)
    p = np.array([0.5, 0.3, 0.2], np.float32)
    cur = _cur([10, 11, 12], p)
    L.llama_sampler_apply(smpl, cur)
    p0 = np.exp(np.log(p)) / np.exp(np.log(p)).sum()
    d = np.abs((p0 - 0.5) / 0.3)
    want = np.exp(5 - 10 * d * d / (1 + d))
    np.testing.assert_allclose(cur.p, want / want.sum(), rtol=1e-5)
    tok = int(cur.ids[cur.selected])
    ws, tw = smpl.weighted_sum, smpl.total_weight
    assert ws == pytest.approx(0.5 / 0.1) and tw == pytest.approx(1 / 0.1)
    L.llama_sampler_accept(smpl, tok)
    assert smpl.weighted_sum == pytest.approx(p0[cur.selected] + 0.9 * ws, rel=1e-6)
    assert smpl.total_weight == pytest.approx(1 + 0.9 * tw, rel=1e-6)
    L.llama_sampler_reset(smpl)
    assert smpl.weighted_sum == pytest.approx(5.0) and smpl.total_weight == pytest.approx(10.0)
    # the same seed draws the same tokens; a negative target samples the distribution as is
    a, b = L.llama_sampler_init_adaptive_p(-1.0, 0.5, 3), L.llama_sampler_init_adaptive_p(-1.0, 0.5, 3)
    for _ in range(5):
        ca, cb = _cur([1, 2, 3], p), _cur([1, 2, 3], p)
        L.llama_sampler_apply(a, ca)
        L.llama_sampler_apply(b, cb)
        assert ca.selected == cb.selected and np.allclose(ca.p, p0)


def _allowed(smpl, ids):
    cur = TokenDataArray(np.array(ids, np.int32), np.zeros(len(ids), np.float32))
    L.llama_sampler_apply(smpl, cur)
    return [int(t) for t, l in zip(cur.ids, cur.logits) if l != -np.inf]


def test_lazy_grammar_waits_for_a_pattern(gpt2):
    """Nothing is constrained until the output matches the trigger pattern; then the grammar
    is fed the text from the pattern's group on and constrains what follows."""
    lb, rb, a, one = 90, 92, 64, 16
    smpl = L.llama_sampler_init_grammar_lazy_patterns(gpt2, b'root ::= "{" [a-z]* "}"', b"root",
                                                      [rb"[\s\S]*?(\{)[\s\S]*"], 1, [], 0)
    assert _allowed(smpl, [lb, rb, a, one]) == [lb, rb, a, one]
    for t in gpt2.tokenize(b"hello ", False, False):
        L.llama_sampler_accept(smpl, t)
    assert _allowed(smpl, [lb, rb, a, one]) == [lb, rb, a, one]
    L.llama_sampler_accept(smpl, lb)  # "{": triggered, the grammar has seen "{"
    assert _allowed(smpl, [lb, rb, a, one]) == [rb, a]
    L.llama_sampler_reset(smpl)  # waits again
    assert _allowed(smpl, [lb, rb, a, one]) == [lb, rb, a, one]


def test_lazy_grammar_trigger_token_and_words(gpt2):
    lt, tool, gt, a = 27, 25981, 29, 64
    smpl = L.llama_sampler_init_grammar_lazy_patterns(gpt2, b'root ::= "<" [a-z]+ ">"', b"root", [], 0, [lt], 1)
    L.llama_sampler_accept(smpl, 16)
    assert _allowed(smpl, [lt, a, gt]) == [lt, a, gt]
    L.llama_sampler_accept(smpl, lt)  # the trigger token starts the grammar
    assert _allowed(smpl, [lt, a, gt]) == [a]
    # deprecated trigger words: literal text, regex characters escaped ("a.b" does not match "axb")
    smpl = L.llama_sampler_init_grammar_lazy(gpt2, b'root ::= "<tool>" [a-z]*', b"root", [b"<tool>"], 1, [], 0)
    for t in (lt, tool):
        L.llama_sampler_accept(smpl, t)
    assert smpl.awaiting_trigger
    L.llama_sampler_accept(smpl, gt)
    assert not smpl.awaiting_trigger
    assert _allowed(smpl, [lt, a, gt]) == [a]
    assert L.llama_sampler_init_grammar_lazy_patterns(gpt2, b"root ::= (", b"root", [], 0, [], 0) is None
    assert L.llama_sampler_init_grammar_lazy_patterns(gpt2, b'root ::= "a"', b"root", ["("], 1, [], 0) is None


# ---------------------------------------------------------------------- backend (sequence) sampling


def _chain(*samplers):
    c = L.llama_sampler_chain_init(None)
    for s in samplers:
        L.llama_sampler_chain_add(c, s)
    return c


def test_sequence_sampler_samples_after_decode(ctx):
    chain = _chain(L.llama_sampler_init_top_k(5), L.llama_sampler_init_dist(42))
    twin = _chain(L.llama_sampler_init_top_k(5), L.llama_sampler_init_dist(42))
    assert L.llama_set_sampler(ctx, 0, chain) is True
    assert L.llama_decode(ctx, L.llama_batch_get_one(np.array([1, 2, 3], np.int32))) == 0
    logits = L.llama_get_logits_ith(ctx, -1).copy()
    tok = L.llama_get_sampled_token_ith(ctx, -1)
    assert tok == twin.sample(logits)  # the token the chain picks on the CPU
    top5 = set(np.argsort(-logits)[:5].tolist())
    assert set(L.llama_get_sampled_candidates_ith(ctx, -1).tolist()) == top5
    assert L.llama_get_sampled_candidates_count_ith(ctx, -1) == L.llama_get_sampled_logits_count_ith(ctx, -1) == 5
    assert L.llama_get_sampled_probs_count_ith(ctx, -1) == 5
    assert L.llama_get_sampled_probs_ith(ctx, -1).sum() == pytest.approx(1.0)
    assert L.llama_get_sampled_token_ith(ctx, 2) == tok  # batch index 2 is the output
    assert L.llama_get_sampled_token_ith(ctx, 0) == L.LLAMA_TOKEN_NULL  # no output there
    n = chain.n_sample
    assert L.llama_sampler_sample(chain, ctx, -1) == tok  # returned and accepted, no new draw
    assert chain.n_sample == n + 1
    # next step: the chain's RNG advanced once per sample, like the CPU twin's
    assert L.llama_decode(ctx, L.llama_batch_get_one(np.array([tok], np.int32))) == 0
    assert L.llama_get_sampled_token_ith(ctx, -1) == twin.sample(L.llama_get_logits_ith(ctx, -1))
    # detach: no sampled outputs any more
    assert L.llama_set_sampler(ctx, 0, None) is True
    assert L.llama_decode(ctx, L.llama_batch_get_one(np.array([7], np.int32))) == 0
    assert L.llama_get_sampled_token_ith(ctx, -1) == L.LLAMA_TOKEN_NULL
    assert L.llama_get_sampled_logits_ith(ctx, -1) is None


def test_sequence_sampler_leaves_the_cpu_part_to_llama_sampler_sample(ctx):
    """typical has no backend implementation in llama.cpp: the chain's backend part ends
    before it, the rest runs in llama_sampler_sample on the kept candidates."""
    chain = _chain(L.llama_sampler_init_top_k(3), L.llama_sampler_init_typical(0.5, 1), L.llama_sampler_init_greedy())
    assert L.llama_set_sampler(ctx, 0, chain)
    assert L.llama_decode(ctx, L.llama_batch_get_one(np.array([4, 5], np.int32))) == 0
    assert L.llama_get_sampled_token_ith(ctx, -1) == L.LLAMA_TOKEN_NULL
    assert L.llama_get_sampled_logits_count_ith(ctx, -1) == 3
    assert L.llama_get_sampled_probs_ith(ctx, -1) is None
    assert L.llama_sampler_sample(chain, ctx, -1) == int(np.argmax(L.llama_get_logits_ith(ctx, -1)))
    # llama_sampler_apply on the attached chain skips the backend part too
    cur = TokenDataArray.from_logits(L.llama_get_sampled_logits_ith(ctx, -1))
    L.llama_sampler_apply(chain, cur)
    assert cur.size <= 3 and cur.selected >= 0
    # more outputs for the sequence than n_outputs_max_per_seq (1): -1, as llama.cpp
    b = L.llama_batch_init(2, 0, 1)
    b.n_tokens = 2
    b.token[:2], b.pos[:2], b.n_seq_id[:2], b.seq_id[:2, 0], b.logits[:2] = [6, 7], [2, 3], 1, 0, 1
    assert L.llama_decode(ctx, b) == -1
    # not a chain: not attached (llama.cpp: cannot be offloaded)
    assert L.llama_set_sampler(ctx, 0, L.llama_sampler_init_greedy()) is False


def test_context_params_samplers(tiny):
    chain = _chain(L.llama_sampler_init_greedy())
    p = L.llama_context_default_params()
    p.n_ctx, p.n_threads, p.n_threads_batch = 256, 1, 1
    p.samplers, p.n_samplers = [L.llama_sampler_seq_config(0, chain)], 1
    c = L.llama_init_from_model(tiny("llama"), p)
    assert L.llama_decode(c, L.llama_batch_get_one(np.array([1, 2], np.int32))) == 0
    assert L.llama_get_sampled_token_ith(c, -1) == int(np.argmax(L.llama_get_logits_ith(c, -1)))
    L.llama_free(c)
    p.samplers = [L.llama_sampler_seq_config(0, L.llama_sampler_init_greedy())]
    assert L.llama_init_from_model(tiny("llama"), p) is None  # must be chains: no context


# ---------------------------------------------------------------------- llama_batch_ext / llama_process


def test_batch_ext_process_equals_decode(tiny, ctx):
    b = L.llama_batch_ext_init(ctx)
    for i, t in enumerate([3, 4, 5]):
        idx = L.llama_batch_ext_add_token(b, 0, t)
        assert idx == i and L.llama_batch_ext_set_pos(b, idx, np.array([i], np.int32))
    assert L.llama_batch_ext_set_output_logits(b, 2, True)
    assert L.llama_process(ctx, L.LLAMA_PROCESS_TYPE_DECODE, b) == 0
    assert np.array_equal(L.llama_get_logits_ith(ctx, 2), _logits(tiny("llama"), [3, 4, 5]))
    assert L.llama_get_logits_ith(ctx, 0) is None
    # error codes of llama_batch_ext_add_token: -3 bad seq id, -2 bad token, -1 full
    L.llama_batch_ext_clear(b)
    assert L.llama_batch_ext_add_token(b, 1, 3) == -3
    assert L.llama_batch_ext_add_token(b, 0, 1 << 20) == -2
    L.llama_batch_ext_clear(b)
    for _ in range(L.llama_n_batch(ctx)):
        assert L.llama_batch_ext_add_token(b, 0, 3) >= 0
    assert L.llama_batch_ext_add_token(b, 0, 3) == -1
    assert not L.llama_batch_ext_add_seq(b, 0, 1) and not L.llama_batch_ext_set_pos(b, 10**6, 0)
    n_embd = L.llama_model_n_embd(tiny("llama"))
    assert not L.llama_batch_ext_set_embd_state(b, 0, L.llama_embd(np.zeros(n_embd, np.float32), 1, n_embd))
    L.llama_batch_ext_clear(b)
    assert L.llama_process(ctx, L.LLAMA_PROCESS_TYPE_DECODE, b) == -1  # empty
    assert L.llama_process(ctx, L.LLAMA_PROCESS_TYPE_ENCODE, b) == -1  # no encoder
    L.llama_batch_ext_free(b)
    with pytest.raises(ValueError, match="llama_batch_ext_clear: batch has been freed"):
        L.llama_batch_ext_clear(b)


def test_batch_ext_embeddings(tiny, ctx):
    """An entry holding an embedding row decodes like that row in a llama_batch."""
    n_embd = L.llama_model_n_embd(tiny("llama"))
    row = np.random.default_rng(1).normal(size=n_embd).astype(np.float32)
    b = L.llama_batch_ext_init(ctx)
    assert L.llama_batch_ext_add_embd(b, 0, L.llama_embd(row, 1, n_embd - 1)) == -2  # wrong size (logged)
    L.llama_batch_ext_clear(b)
    idx = L.llama_batch_ext_add_embd(b, 0, L.llama_embd(row, 1, n_embd))
    assert idx == 0 and L.llama_batch_ext_set_output_embd(b, 0, True)
    assert L.llama_process(ctx, L.LLAMA_PROCESS_TYPE_DECODE, b) == 0
    got = L.llama_get_logits_ith(ctx, 0).copy()
    L.llama_memory_clear(L.llama_get_memory(ctx), True)
    eb = L.llama_batch_init(1, n_embd, 1)
    eb.n_tokens = 1
    eb.embd[0], eb.pos[0], eb.n_seq_id[0], eb.seq_id[0, 0], eb.logits[0] = row, 0, 1, 0, 1
    assert L.llama_decode(ctx, eb) == 0
    assert np.array_equal(got, L.llama_get_logits_ith(ctx, 0))


def test_batch_ext_from_another_context(tiny, ctx):
    """llama_batch_ext carries limits, not its context: another context of the model runs it."""
    b = L.llama_batch_ext_init(ctx)
    idx = L.llama_batch_ext_add_token(b, 0, 9)
    assert L.llama_batch_ext_set_pos(b, idx, 0) and L.llama_batch_ext_set_output_logits(b, idx, True)
    p = L.llama_context_default_params()
    p.n_ctx, p.n_threads, p.n_threads_batch = 256, 1, 1
    other = L.llama_init_from_model(tiny("llama"), p)
    assert L.llama_process(other, L.LLAMA_PROCESS_TYPE_DECODE, b) == 0
    assert np.array_equal(L.llama_get_logits_ith(other, 0), _logits(tiny("llama"), [9]))
    L.llama_free(other)


def test_save_to_file_writes_the_overridden_metadata(tiny_model_path, tmp_path):
    """As llama.cpp's saver writes the loaded model: kv_overrides are in the saved file."""
    params = L.llama_model_default_params()
    params.kv_overrides = {"llama.context_length": 1024}
    m = L.llama_model_load_from_file(str(tiny_model_path("llama")).encode(), params)
    out = tmp_path / "overridden.gguf"
    L.llama_model_save_to_file(m, str(out))
    m2 = L.llama_model_load_from_file(str(out).encode(), L.llama_model_default_params())
    assert L.llama_model_n_ctx_train(m2) == 1024


def test_save_to_file_refuses_a_vocab_only_model(smollm2_path, tmp_path):
    params = L.llama_model_default_params()
    params.vocab_only = True
    v = L.llama_model_load_from_file(str(smollm2_path).encode(), params)
    with pytest.raises(ValueError, match="llama_model_save_to_file: model was loaded with vocab_only"):
        L.llama_model_save_to_file(v, str(tmp_path / "v.gguf"))
    assert not (tmp_path / "v.gguf").exists()
