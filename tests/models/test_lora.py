"""LoRA adapters and control vectors against llama.cpp (issue 25).

The adapters and control vectors are random but deterministic, written at test time by
tests/data/lora/make_lora.py in convert_lora_to_gguf.py's layout for the tiny models of
tests/data/make_tiny.py; tests/data/lora/lora_reference.npz holds llama.cpp's logits with
them applied (its lora_logits.cpp: llama_adapter_lora_init + llama_set_adapters_lora,
common_control_vector_load + llama_set_adapter_cvec), the 20 highest at each of 16
positions and the whole last row. No llama.cpp is needed here.

Tolerances are test_logits.py's for tiny float-weight models (mean |diff| over the top 20
<= 0.03, p99 <= 0.15) and the top-1 token equal wherever llama.cpp's margin is > 0.25.
Measured when this was written (x86-64, AVX2): max |diff| 0.0021 (one adapter), 0.0028
(two, F32 + F16), 0 (Q8_0 model and adapter), 0.0070 (qwen3moe, BF16, experts, token_embd
and output), 0.0032 (gemma3, adapter + control vector on layers 2-4), 0.0049 (gemma3, two
control vectors), 0.0045 (phi3: fused attn_qkv and gate/up, F16, token_embd, output),
0.00014 (phi2: its own forward pass, adapter + control vector); top-1 equal at every
position. The adapters move the logits by up to 18.6 and change the top-1 token at 6-16
of the 16 positions, so matching llama.cpp's adapted logits is not matching the base
model's.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

from pyllama import llama_api as L
from pyllama.adapter import ControlVector, LoraAdapter
from pyllama.context import Context
from pyllama.errors import GGUFError, UnsupportedModelError
from pyllama.model import Model

DATA = Path(__file__).parents[1] / "data" / "lora"


def _load_make_lora():
    spec = importlib.util.spec_from_file_location("make_lora", DATA / "make_lora.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_lora"] = mod
    spec.loader.exec_module(mod)
    return mod


ML = _load_make_lora()
REF = np.load(DATA / "lora_reference.npz")
TOKENS = [int(t) for t in REF["tokens"]]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lora")


def logits_of(ctx: Context, tokens=TOKENS) -> np.ndarray:
    ctx.memory_clear(True)
    ctx.decode(tokens, logits_all=True)
    return np.array(ctx.logits, dtype=np.float32)


def new_context(model) -> Context:
    return Context(model, n_ctx=2048, n_batch=2048, n_ubatch=512, n_threads=2, n_threads_batch=2)


def case_context(case: str, work: Path):
    model_path, loras, cvecs, rng = ML.write_case(case, work)
    m = Model.load(str(model_path))
    ctx = new_context(m)
    adapters = [(LoraAdapter(m, p), s) for p, s in loras]
    ctx.set_lora_adapters(adapters)
    if cvecs:
        start, end = rng if rng is not None else (1, None)
        ctx.set_control_vector(ControlVector.load(cvecs), layer_start=start, layer_end=end)
    return m, ctx, adapters


def compare(case: str, lg: np.ndarray) -> dict:
    ids = REF[f"{case}_topk_ids"].astype(np.int64)
    vals = REF[f"{case}_topk_vals"]
    d = np.abs(np.take_along_axis(lg, ids, axis=1) - vals)
    margin = vals[:, 0] - vals[:, 1]
    sel = margin > 0.25
    return dict(max=float(max(d.max(), np.abs(lg[-1] - REF[f"{case}_last"]).max())), mean=float(d.mean()),
                p99=float(np.percentile(d, 99)), top1=float((lg.argmax(1) == ids[:, 0])[sel].mean()))


@pytest.mark.parametrize("case", list(ML.CASES))
def test_logits_match_llamacpp(case, work):
    _, ctx, _ = case_context(case, work)
    s = compare(case, logits_of(ctx))
    assert s["top1"] == 1.0, s
    assert s["mean"] <= 0.03, s
    assert s["p99"] <= 0.15, s


def test_removing_adapters_gives_the_base_logits_bit_for_bit(work):
    model_path, loras, cvecs, rng = ML.write_case("gemma3-lora-cvec", work)
    m = Model.load(str(model_path))
    base = logits_of(new_context(m))
    ctx = new_context(m)
    ctx.set_lora_adapters([(LoraAdapter(m, p), s) for p, s in loras])
    ctx.set_control_vector(ControlVector.load(cvecs), layer_start=2, layer_end=4)
    adapted = logits_of(ctx)
    assert np.abs(adapted - base).max() > 1.0
    ctx.set_lora_adapters([])
    ctx.set_control_vector(None)
    assert np.array_equal(logits_of(ctx), base)
    # zero scales are dropped (llama.cpp), and the llama.h spellings do the same
    a = LoraAdapter(m, loras[0][0])
    ctx.set_lora_adapters([(a, 0.0)])
    assert ctx.lora_adapters == []
    assert np.array_equal(logits_of(ctx), base)
    assert L.llama_set_adapters_lora(ctx, [a], 1, [0.8]) == 0
    cv = ControlVector.load(cvecs)
    assert L.llama_set_adapter_cvec(ctx, cv.data, len(cv.data), cv.n_embd, 2, 4) == 0
    assert np.array_equal(logits_of(ctx), adapted)
    assert L.llama_set_adapters_lora(ctx, None, 0, None) == 0
    assert L.llama_set_adapter_cvec(ctx, None, 0, 0, 0, 0) == 0
    assert np.array_equal(logits_of(ctx), base)


def test_scale_follows_alpha_over_rank(work):
    # alpha 16, rank 8: scale 0.5 is the same as ... the adapter written without alpha at
    # scale 1.0 (scale_eff = user scale when alpha is absent)
    m = Model.load(str(ML.model_path("llama", "F32", work)))
    with_alpha = ML.write_lora(work / "sa.gguf", ML.model_path("llama", "F32", work), "llama", seed=9, rank=8,
                               alpha=16.0, targets=["attn_q.weight"])
    no_alpha = ML.write_lora(work / "sn.gguf", ML.model_path("llama", "F32", work), "llama", seed=9, rank=8,
                             alpha=None, targets=["attn_q.weight"])
    ctx = new_context(m)
    ctx.set_lora_adapters([(LoraAdapter(m, with_alpha), 0.5)])
    a = logits_of(ctx)
    ctx.set_lora_adapters([(LoraAdapter(m, no_alpha), 1.0)])
    assert np.array_equal(logits_of(ctx), a)
    assert LoraAdapter(m, no_alpha).alpha == 0.0


def test_multiple_micro_batches_and_single_token_steps_agree(work):
    # the adapters' products go through the same kernels as the weights': a prompt split
    # into micro-batches of 3, or fed token by token, gives the batch's logits
    model_path, loras, _, _ = ML.write_case("qwen3moe-bf16", work)
    m = Model.load(str(model_path))
    ctx = new_context(m)
    ctx.set_lora_adapters([(LoraAdapter(m, p), s) for p, s in loras])
    full = logits_of(ctx)
    ctx.memory_clear(True)
    rows = []
    for t in TOKENS:
        ctx.decode([t])
        rows.append(np.array(ctx.logits[-1]))
    np.testing.assert_allclose(np.array(rows), full, atol=2e-4)
    small = Context(m, n_ctx=2048, n_batch=2048, n_ubatch=3, n_threads=2, n_threads_batch=2)
    small.set_lora_adapters([(LoraAdapter(m, p), s) for p, s in loras])
    np.testing.assert_allclose(logits_of(small), full, atol=2e-4)


# ---------------------------------------------------------------------- malformed adapters


@pytest.fixture(scope="module")
def llama_model(work):
    return Model.load(str(ML.model_path("llama", "F32", work)))


def _adapter(path: Path, arch="llama", tensors=(), kv=None, general_type="adapter", adapter_type="lora"):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    if general_type is not None:
        w.add_type(general_type)
    if adapter_type is not None:
        w.add_string("adapter.type", adapter_type)
    for k, v in (kv or {}).items():
        w.add_key_value(k, v[0], v[1], v[2] if len(v) > 2 else None)
    for name, a in tensors:
        w.add_tensor(name, np.asarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _pair(name, n_in, n_out, rank=2):
    return [(name + ".lora_a", np.ones((rank, n_in))), (name + ".lora_b", np.ones((n_out, rank)))]


BAD = {
    "wrong-arch": (dict(arch="gemma3", tensors=_pair("blk.0.attn_q.weight", 256, 256)),
                   UnsupportedModelError, "arch mismatch.*'gemma3'.*'llama'"),
    "base-model": (None, UnsupportedModelError, "general.type to be 'adapter', but got: 'model'"),
    "not-lora": (dict(adapter_type="control", tensors=_pair("blk.0.attn_q.weight", 256, 256)),
                 UnsupportedModelError, "adapter.type to be 'lora'"),
    "missing-tensor": (dict(tensors=_pair("blk.7.attn_q.weight", 256, 256)),
                       UnsupportedModelError, "'blk.7.attn_q.weight' does not exist in base model"),
    "wrong-shape": (dict(tensors=_pair("blk.0.attn_k.weight", 256, 256)),
                    UnsupportedModelError, "'blk.0.attn_k.weight' has incorrect shape"),
    "half-pair": (dict(tensors=_pair("blk.0.attn_q.weight", 256, 256)[:1]),
                  UnsupportedModelError, "pair for 'blk.0.attn_q.weight' is missing one component"),
    "bad-suffix": (dict(tensors=[("blk.0.attn_q.weight", np.ones((256, 256)))]),
                   UnsupportedModelError, "'blk.0.attn_q.weight' has unexpected suffix"),
    "not-transposed": (dict(tensors=[("blk.0.attn_q.weight.lora_a", np.ones((2, 256))),
                                     ("blk.0.attn_q.weight.lora_b", np.ones((256, 3)))]),
                       UnsupportedModelError, "lora_a tensor is not transposed"),
    "tied-token-embd": (dict(tensors=[("token_embd.weight.lora_a", np.ones((2048, 2))),
                                      ("token_embd.weight.lora_b", np.ones((256, 2)))]),
                        UnsupportedModelError, "ties its output"),
    "alpha-not-f32": (dict(tensors=_pair("blk.0.attn_q.weight", 256, 256),
                           kv={"adapter.lora.alpha": ("8", __import__("gguf").GGUFValueType.STRING)}),
                      UnsupportedModelError, "adapter.lora.alpha must be a float32"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_adapter_raises_naming_the_file(name, work, llama_model, caplog):
    spec, exc, match = BAD[name]
    path = ML.model_path("gemma3", "F32", work) if spec is None else _adapter(work / f"bad-{name}.gguf", **spec)
    with pytest.raises(exc, match=match) as ei:
        LoraAdapter(llama_model, path)
    assert str(path) in str(ei.value)
    # the llama.h form returns None and logs why
    with caplog.at_level(logging.ERROR, logger="pyllama"):
        assert L.llama_adapter_lora_init(llama_model, str(path)) is None
    assert str(path) in caplog.text


def test_truncated_or_missing_adapter_file(work, llama_model):
    good = ML.write_adapter("llama-a", work)
    cut = work / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:5000])
    with pytest.raises(GGUFError, match="cut.gguf"):
        LoraAdapter(llama_model, cut)
    with pytest.raises(FileNotFoundError):
        LoraAdapter(llama_model, work / "absent.gguf")


def test_failed_set_leaves_the_context_as_it_was(work, llama_model):
    ctx = new_context(llama_model)
    a = LoraAdapter(llama_model, ML.write_adapter("llama-a", work))
    ctx.set_lora_adapters([(a, 1.0)])
    cv = ControlVector(np.ones(64 * 5, np.float32), 64)
    ctx_before = logits_of(ctx)
    other = Model.load(str(ML.model_path("gemma3", "F32", work)))
    b = LoraAdapter(other, ML.write_adapter("gemma3-a", work))
    with pytest.raises(ValueError, match="loaded for another model"):
        ctx.set_lora_adapters([(a, 0.5), (b, 1.0)])
    with pytest.raises(TypeError, match="LoraAdapter"):
        ctx.set_lora_adapters([("adapter.gguf", 1.0)])
    with pytest.raises(ValueError, match="finite"):
        ctx.set_lora_adapters([(a, float("nan"))])
    with pytest.raises(ValueError, match="n_embd does not match model.*64.*256"):
        ctx.set_control_vector(cv)  # 64 values per layer; the model's n_embd is 256
    assert L.llama_set_adapter_cvec(ctx, cv.data, len(cv.data), 64, 1, 2) == -1
    assert L.llama_set_adapters_lora(ctx, [b], 1, [1.0]) == -1
    assert [(x.path, s) for x, s in ctx.lora_adapters] == [(a.path, 1.0)]
    assert np.array_equal(logits_of(ctx), ctx_before)


def test_control_vector_files(work):
    import gguf

    good = ML.write_control_vector("gemma3-cv", work)
    cv = ControlVector.load([(good, 2.0), ML.write_control_vector("gemma3-cv2", work)])
    assert cv.n_embd == 64 and cv.n_layers == 5
    r = gguf.GGUFReader(str(good))
    d1 = np.array(r.get_tensor(0).data, np.float32)  # direction.1
    np.testing.assert_array_equal(cv.data[:64], d1 * np.float32(2.0))

    def cvfile(name, tensors):
        w = gguf.GGUFWriter(str(work / name), "controlvector")
        for n, a in tensors:
            w.add_tensor(n, a)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return work / name

    cases = {
        "zero": ([("direction.0", np.ones(64, np.float32))], "zero"),
        "name": ([("token_embd.weight", np.ones(64, np.float32))], "direction.N"),
        "f16": ([("direction.1", np.ones(64, np.float16))], "F32"),
        "2d": ([("direction.1", np.ones((2, 32), np.float32))], "1-D"),
        "sizes": ([("direction.1", np.ones(64, np.float32)), ("direction.2", np.ones(32, np.float32))], "32 values"),
    }
    for k, (tensors, match) in cases.items():
        p = cvfile(f"cv-{k}.gguf", tensors)
        with pytest.raises(UnsupportedModelError, match=match) as ei:
            ControlVector.load([p])
        assert str(p) in str(ei.value)
    with pytest.raises(UnsupportedModelError, match="per direction"):
        ControlVector.load([good, cvfile("cv-32.gguf", [("direction.1", np.ones(32, np.float32))])])


def test_adapter_metadata_and_alora(work, llama_model):
    a = L.llama_adapter_lora_init(llama_model, str(ML.write_adapter("llama-alora", work)).encode())
    assert isinstance(a, LoraAdapter)
    assert L.llama_adapter_get_alora_n_invocation_tokens(a) == 3
    assert L.llama_adapter_get_alora_invocation_tokens(a).tolist() == [5, 733, 64]
    assert L.llama_adapter_get_alora_n_invocation_tokens(None) == 0
    # scalar keys only, sorted by key (llama.cpp keeps a std::map)
    keys = ["adapter.lora.alpha", "adapter.type", "general.architecture", "general.type"]
    assert L.llama_adapter_meta_count(a) == len(keys)
    buf = bytearray(64)
    for i, k in enumerate(keys):
        n = L.llama_adapter_meta_key_by_index(a, i, buf, len(buf))
        assert bytes(buf[:n]).decode() == k
    n = L.llama_adapter_meta_val_str(a, b"adapter.lora.alpha", buf, len(buf))
    assert bytes(buf[:n]) == b"4.000000"
    n = L.llama_adapter_meta_val_str_by_index(a, 2, buf, len(buf))
    assert bytes(buf[:n]) == b"llama"
    assert L.llama_adapter_meta_val_str(a, "absent", buf, len(buf)) == -1 and buf[0] == 0
    assert L.llama_adapter_meta_key_by_index(a, 99, buf, len(buf)) == -1
    with open(ML.write_adapter("llama-alora", work), "rb") as f:
        b = L.llama_adapter_lora_init_from_file_ptr(llama_model, f)
    assert b.alora_invocation_tokens == [5, 733, 64] and b.ranks == a.ranks
    L.llama_adapter_lora_free(a)
    with pytest.raises(ValueError, match="freed"):
        L.llama_adapter_meta_count(a)
    L.llama_adapter_lora_free(None)


# ---------------------------------------------------------------------- Llama and the CLI


@pytest.fixture(scope="module")
def smol_adapter(smollm2_path, work):
    return ML.write_lora(work / "smol-a.gguf", smollm2_path, "llama", seed=11, rank=4, alpha=8.0,
                         targets=["attn_q.weight", "attn_v.weight", "ffn_down.weight"])


def _greedy(llm, prompt, n=12):
    return llm.create_completion(prompt, max_tokens=n, temperature=0)["choices"][0]["text"]


def test_llama_lora_path_and_cli_agree(smollm2_path, smol_adapter):
    from typer.testing import CliRunner

    from pyllama.cli import app
    from pyllama.llama import Llama

    prompt = "The capital of France is"
    base = _greedy(Llama(str(smollm2_path), n_ctx=256, verbose=False), prompt)
    adapted = _greedy(Llama(str(smollm2_path), n_ctx=256, verbose=False, lora_path=str(smol_adapter)), prompt)
    assert adapted != base
    half = _greedy(Llama(str(smollm2_path), n_ctx=256, verbose=False, lora_path=str(smol_adapter),
                         lora_scale=0.25), prompt)
    runner = CliRunner()

    def cli(*flags):
        r = runner.invoke(app, ["generate", "-m", str(smollm2_path), "-p", prompt, "-n", "12", "--temp", "0",
                                "--no-perf", "--no-display-prompt", *flags])
        assert r.exit_code == 0, r.output
        return r.stdout[:-1]  # the final newline

    assert cli("--lora", str(smol_adapter)) == adapted
    assert cli("--lora-scaled", f"{smol_adapter}:0.25") == half
    assert cli("--lora-scaled", f"{smol_adapter}:0") == base
    r = runner.invoke(app, ["generate", "-m", str(smollm2_path), "-p", prompt, "-n", "4", "--lora-scaled",
                            str(smol_adapter)])
    assert r.exit_code == 2 and "FNAME:SCALE" in r.output


def test_llama_lora_base_and_vocab_only_refused(smollm2_path, smol_adapter):
    from pyllama.llama import Llama

    with pytest.raises(ValueError, match="lora_base"):
        Llama(str(smollm2_path), verbose=False, lora_base=str(smollm2_path), lora_path=str(smol_adapter))
    with pytest.raises(ValueError, match="vocab_only"):
        Llama(str(smollm2_path), verbose=False, vocab_only=True, lora_path=str(smol_adapter))


def test_cli_control_vector_and_errors(smollm2_path, work):
    from typer.testing import CliRunner

    from pyllama.cli import app
    from pyllama.llama import Llama

    cv = ML.write_cvec(work / "smol-cv.gguf", 576, list(range(1, 30)), seed=12)
    runner = CliRunner()
    base = ["generate", "-m", str(smollm2_path), "-p", "Once upon a time", "-n", "8", "--temp", "0", "--no-perf",
            "--no-display-prompt"]
    plain = runner.invoke(app, base)
    steered = runner.invoke(app, base + ["--control-vector-scaled", f"{cv}:4", "--control-vector-layer-range", "10",
                                         "20"])
    assert plain.exit_code == 0 and steered.exit_code == 0, steered.output
    # the API spelling of the same
    llm = Llama(str(smollm2_path), n_ctx=4096, verbose=False)
    llm.ctx.set_control_vector(ControlVector.load([(cv, 4.0)]), layer_start=10, layer_end=20)
    assert _greedy(llm, "Once upon a time", 8) == steered.stdout[:-1] != plain.stdout[:-1]
    bad = runner.invoke(app, base + ["--lora", str(ML.write_adapter("gemma3-a", work))])
    assert bad.exit_code == 1 and "arch mismatch" in bad.output
    wrong = ML.write_cvec(work / "cv-64.gguf", 64, [1], seed=1)
    bad = runner.invoke(app, base + ["--control-vector", str(wrong)])
    assert bad.exit_code == 1 and "n_embd does not match" in bad.output


def test_server_lora_adapters_route(smollm2_path, smol_adapter):
    # llama-server's GET / POST /lora-adapters: the listed scales, then POSTed ones (ids not
    # named get 0) used by the requests that follow; compared with Llama's greedy text
    pytest.importorskip("httpx")
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from test_server import Server

    from pyllama.llama import Llama

    prompt = "The capital of France is"
    want = {s: _greedy(Llama(str(smollm2_path), n_ctx=256, verbose=False, **({"lora_path": str(smol_adapter),
                                                                              "lora_scale": s} if s else {})), prompt)
            for s in (0.0, 0.25, 1.0)}
    srv = Server(smollm2_path, "-np", 2, "-c", 1024, "--lora", smol_adapter)
    try:
        def complete():
            r = srv.post("/completion", {"prompt": prompt, "n_predict": 12, "temperature": 0})
            assert r.status_code == 200, r.text
            return r.json()["content"]

        assert srv.http.get("/lora-adapters").json() == [
            {"id": 0, "path": str(smol_adapter), "scale": 1.0, "task_name": "", "prompt_prefix": ""}]
        assert complete() == want[1.0]
        assert srv.post("/lora-adapters", [{"id": 0, "scale": 0.25}]).json() == {"success": True}
        assert srv.http.get("/lora-adapters").json()[0]["scale"] == 0.25
        assert complete() == want[0.25]
        assert srv.post("/lora-adapters", []).json() == {"success": True}
        assert complete() == want[0.0]
        assert srv.post("/lora-adapters", [{"id": 0, "scale": 1}]).json() == {"success": True}
        assert complete() == want[1.0]
        bad = srv.post("/lora-adapters", {"id": 0, "scale": 1})
        assert bad.status_code == 400 and "must be an array" in bad.text
        bad = srv.post("/completion", {"prompt": prompt, "lora": [{"id": 0, "scale": 0.5}]})
        assert bad.status_code == 400 and "'lora'" in bad.text
    finally:
        srv.close()


def test_server_refuses_activated_lora(smollm2_path, work):
    # llama-server applies an aLoRA only from its invocation tokens on, per slot; pyllama's
    # engine sets adapters per context, so it says so instead of applying it everywhere
    pytest.importorskip("starlette")
    from pyllama.generation import vocab_of
    from pyllama.server.engine import Engine, EngineConfig

    alora = ML.write_lora(work / "smol-alora.gguf", smollm2_path, "llama", seed=3, rank=2, alpha=4.0,
                          targets=["attn_v.weight"], extra_kv={"adapter.alora.invocation_tokens": [1, 2]})
    m = Model.load(str(smollm2_path))
    with pytest.raises(ValueError, match="activated LoRA"):
        Engine(m, vocab_of(m), EngineConfig(n_ctx=256, n_parallel=1, loras=[(str(alora), 1.0)]))
