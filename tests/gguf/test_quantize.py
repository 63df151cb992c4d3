"""`pyllama quantize` / `pyllama imatrix` against llama.cpp's llama-quantize / llama-imatrix.

- Every reference case (tests/data/quantize/reference.json, made by
  make_quantize_reference.py from llama-quantize's output) is quantized by pyllama and must
  give the same bytes (SHA-256): every imatrix-free type pyllama implements on five models
  (tiny ones, MoE, fused QKV, shape fallbacks, and a 512-wide llama with planted edge
  cases), every IQ type with an importance matrix, the switches (--pure, --leave-output-tensor, --output/--token-embedding-type,
  --keep-split, --tensor-type with regular expressions and NVFP4, --override-kv, --prune-layers), and the imatrix-weighted searches with llama-imatrix's matrix.
- The per-tensor type choice equals llama.cpp's snapshots (test-quant-type-selection.cpp)
  for five real models rebuilt from their hyperparameters.
- pyllama's importance matrix agrees with llama-imatrix's within float tolerance.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from pyllama import _core
from pyllama.imatrix import compute_imatrix, quantize, save_imatrix

DATA = Path(__file__).parents[1] / "data" / "quantize"
sys.path.insert(0, str(DATA))

import models  # noqa: E402

REF = json.loads((DATA / "reference.json").read_text())
CASES = REF["cases"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("quantize")


@pytest.fixture(scope="module")
def model_paths(workdir):
    cache: dict = {}

    def get(name: str) -> Path:
        if name not in cache:
            cache[name] = models.write_model(name, workdir / "models")
        return cache[name]

    return get


@pytest.fixture(scope="module")
def text_imatrix(workdir) -> Path:
    """llama-imatrix's matrix for the text model: rebuilt from its .npz, and checked to be
    the bytes llama-imatrix wrote (imatrix_npz.to_gguf raises otherwise)."""
    import make_quantize_reference as mk

    return mk.imatrix_npz.to_gguf(DATA / REF["imatrix"]["file"], workdir / "imatrix-text-llama.gguf")


@pytest.fixture(scope="module")
def imatrix_files(workdir, model_paths, text_imatrix):
    """The text model's matrix as llama-imatrix wrote it; the wide model's synthetic one."""
    import make_quantize_reference as mk

    wide = workdir / "imatrix-wide-llama.gguf"
    mk.synthetic_imatrix(wide, model_paths("wide-llama"))
    return {"text-llama": text_imatrix, "wide-llama": wide}


def _kwargs(args: list[str]) -> dict:
    kw: dict = {}
    it = iter(args)
    for a in it:
        if a == "--pure":
            kw["pure"] = True
        elif a == "--leave-output-tensor":
            kw["leave_output_tensor"] = True
        elif a == "--keep-split":
            kw["keep_split"] = True
        elif a == "--output-tensor-type":
            kw["output_tensor_type"] = next(it)
        elif a == "--token-embedding-type":
            kw["token_embedding_type"] = next(it)
        elif a == "--tensor-type":
            from pyllama.cli.quantize import parse_tensor_type

            kw.setdefault("tensor_types", []).append(parse_tensor_type(next(it)))
        elif a == "--override-kv":
            from pyllama.cli.quantize import parse_override_kv

            kw.setdefault("kv_overrides", []).append(parse_override_kv(next(it)))
        elif a == "--prune-layers":
            from pyllama.cli.quantize import parse_prune_layers

            kw["prune_layers"] = parse_prune_layers(next(it))
        else:
            raise AssertionError(a)
    return kw


_SLOW = os.environ.get("PYLLAMA_SLOW") == "1"
# The 512-wide model's cases beyond these take a few seconds each: behind -m slow.
_WIDE_FAST = {"Q4_0", "Q8_0", "Q2_K", "Q3_K_S", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_XS", "TQ1_0", "MXFP4_MOE", "BF16"}
_WIDE_FAST_IMATRIX = {"Q2_K_S", "Q3_K_M", "Q4_K_M", "IQ4_XS", "Q5_0"}


def _marks(c: dict):
    fast = (c["model"] != "wide-llama" or c["args"]
            or c["type"] in (_WIDE_FAST_IMATRIX if c.get("imatrix") else _WIDE_FAST))
    return () if fast else (pytest.mark.slow, pytest.mark.skipif(not _SLOW, reason="slow: run with PYLLAMA_SLOW=1"))


@pytest.mark.parametrize("case", [pytest.param(k, id=k, marks=_marks(CASES[k])) for k in sorted(CASES)])
def test_same_bytes_as_llama_quantize(case, workdir, model_paths, imatrix_files, monkeypatch):
    c = CASES[case]
    src = model_paths(c["model"])
    run = workdir / "run"
    run.mkdir(exist_ok=True)
    monkeypatch.chdir(run)  # the imatrix path is recorded as given: "imatrix.gguf", as the reference ran
    kw = _kwargs(c["args"])
    if c.get("imatrix"):
        (run / "imatrix.gguf").write_bytes(imatrix_files[c["imatrix"]].read_bytes())
        kw["imatrix"] = "imatrix.gguf"
    s = quantize(src, run / "out.gguf", c["type"], n_threads=2, **kw)
    out = run / c["output"]
    assert [Path(p).name for p in s["outputs"]] == [c["output"]]
    data = out.read_bytes()
    out.unlink()
    assert len(data) == c["size"]
    assert hashlib.sha256(data).hexdigest() == c["sha256"]


def test_thread_count_does_not_change_bytes(workdir, model_paths):
    src = model_paths("wide-llama")
    c = CASES["wide-llama Q4_K_M"]
    for n in (1, 3):
        out = workdir / f"t{n}.gguf"
        quantize(src, out, "Q4_K_M", n_threads=n)
        assert hashlib.sha256(out.read_bytes()).hexdigest() == c["sha256"]


def test_progress_and_summary(workdir, model_paths):
    src = model_paths("tiny-llama")
    seen = []
    s = quantize(src, workdir / "p.gguf", "q4_k_m", progress=seen.append)  # names are case-insensitive
    assert [d["index"] for d in seen] == list(range(1, s["n_tensors"] + 1))
    assert s["size_before"] == sum(d["src_bytes"] for d in seen) and s["size_after"] == sum(d["dst_bytes"] for d in seen)
    assert s["size_after"] < s["size_before"] / 5
    norm = next(d for d in seen if d["name"] == "output_norm.weight")
    assert norm["src_type"] == norm["dst_type"] == "F32"


def test_progress_exception_stops(workdir, model_paths):
    src = model_paths("tiny-llama")

    def boom(d):
        raise KeyError("stop here")

    with pytest.raises(KeyError, match="stop here"):
        quantize(src, workdir / "x.gguf", "Q8_0", progress=boom)


def test_errors(workdir, model_paths):
    src = model_paths("tiny-llama")
    with pytest.raises(ValueError, match="requires an importance matrix"):
        quantize(src, workdir / "e.gguf", "IQ2_XXS")
    with pytest.raises(ValueError, match="invalid ftype"):
        quantize(src, workdir / "e.gguf", "Q9_9")
    with pytest.raises(ValueError, match="unknown ggml type"):
        quantize(src, workdir / "e.gguf", "Q4_0", output_tensor_type="q7")
    with pytest.raises(_core.UnsupportedModelError, match="cannot quantize to Q8_K"):  # ggml has no quantizer either
        quantize(src, workdir / "e.gguf", "Q4_0", token_embedding_type="q8_k")
    with pytest.raises(ValueError, match="IQ2_XXS needs an importance matrix and there is none for tensor token_embd"):
        quantize(src, workdir / "e.gguf", "Q4_0", token_embedding_type="iq2_xxs")
    with pytest.raises(ValueError, match=r"invalid regular expression 'attn\('"):
        quantize(src, workdir / "e.gguf", "Q4_0", tensor_types=[("attn(", "q8_0")])
    with pytest.raises(ValueError, match="unknown ggml type 'q9'"):
        quantize(src, workdir / "e.gguf", "Q4_0", tensor_types=[("attn", "q9")])
    with pytest.raises(ValueError, match="same"):
        quantize(src, src, "Q8_0")
    with pytest.raises(FileNotFoundError):
        quantize(workdir / "nope.gguf", workdir / "e.gguf", "Q8_0")
    # requantizing needs --allow-requantize, as in llama-quantize
    q8 = workdir / "q8.gguf"
    quantize(src, q8, "Q8_0")
    with pytest.raises(ValueError, match="requantizing from type Q8_0 is disabled"):
        quantize(q8, workdir / "e.gguf", "Q4_0")
    quantize(q8, workdir / "rq.gguf", "Q4_0", allow_requantize=True)


# ---------------------------------------------------------------- type choice (snapshots)

def _schema(name: str):
    text = gzip.decompress((DATA / "snapshots" / f"{name}.schema.gz").read_bytes()).decode()
    head = dict(re.findall(r"(\w+)=(\d+)", text.splitlines()[1]))
    sections, cur = [], None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            ft, default = re.match(r"\[(\w+)\] (\w+)", line).groups()
            cur = (ft, default, {})
            sections.append(cur)
        else:
            n, t = line.rsplit(" ", 1)
            cur[2][n] = t
    return {k: int(v) for k, v in head.items()}, sections


# (schema, arch, head_dim, untied output)
SNAPSHOTS = [("qwen3-0.6b", "qwen3", 128), ("qwen3-14b", "qwen3", 128), ("gemma-3-4b-it", "gemma3", 256),
             ("meta-llama-3.1-70b-instruct", "llama", 128), ("gpt-oss-120b", "gpt-oss", 64)]


def _tensors(h: dict, hd: int, untied: bool):
    e, f, n_vocab = h["n_embd"], h["n_ff"], max(h["n_vocab"], 1000)
    nq, nkv = h["n_head"] * hd, h["n_head_kv"] * hd
    t = [("token_embd.weight", [e, n_vocab], "F32")]
    if untied:
        t.append(("output.weight", [e, n_vocab], "F32"))
    for i in range(h["n_layer"]):
        b = f"blk.{i}."
        t += [(b + "attn_q.weight", [e, nq], "F32"), (b + "attn_k.weight", [e, nkv], "F32"),
              (b + "attn_v.weight", [e, nkv], "F32"), (b + "attn_output.weight", [nq, e], "F32")]
        if h.get("n_expert"):
            x = h["n_expert"]
            t += [(b + "ffn_gate_exps.weight", [e, f, x], "F32"), (b + "ffn_up_exps.weight", [e, f, x], "F32"),
                  (b + "ffn_down_exps.weight", [f, e, x], "F32"), (b + "ffn_gate_inp.weight", [e, x], "F32")]
        else:
            t += [(b + "ffn_gate.weight", [e, f], "F32"), (b + "ffn_up.weight", [e, f], "F32"),
                  (b + "ffn_down.weight", [f, e], "F32")]
        t.append((b + "attn_norm.weight", [e], "F32"))
    t.sort(key=lambda x: (int(x[0].split(".")[1]) if x[0].startswith("blk.") else -1, x[0]))
    return t


@pytest.mark.parametrize("name,arch,hd", SNAPSHOTS, ids=[s[0] for s in SNAPSHOTS])
def test_type_choice_matches_llama_cpp_snapshots(name, arch, hd):
    h, sections = _schema(name)
    untied = any("output.weight" in s[2] for s in sections)
    tensors = _tensors(h, hd, untied)
    names = [t[0] for t in tensors]
    checked = 0
    for ft, default, overrides in sections:
        if ft == "NVFP4":  # no default type in llama_ftype_get_default_type: llama-quantize refuses it
            continue
        got = _core.quantize_types(tensors, ft, arch=arch, n_layer=h["n_layer"], n_head=h["n_head"],
                                   n_head_kv=h["n_head_kv"], n_expert=h.get("n_expert", 0))
        for n, g, (_, shape, _) in zip(names, got, tensors):
            if len(shape) < 2 or n.endswith("ffn_gate_inp.weight"):
                assert g == "F32", n  # not quantized at all
                continue
            want = overrides.get(n, default)
            assert g.lower() == want.lower(), f"[{ft}] {n}: pyllama {g}, llama.cpp {want}"
            checked += 1
    assert checked > 1000


# ---------------------------------------------------------------- imatrix

def test_imatrix_matches_llama_imatrix(workdir, model_paths, text_imatrix):
    from pyllama.generation import Session, load_model

    r = REF["imatrix"]
    text = models.text().rstrip("\n")  # llama-imatrix's -f drops the trailing newline
    m = load_model(model_paths("text-llama"))
    n_seq = r["batch"] // r["ctx"]
    s = Session(m, n_ctx=r["ctx"] * n_seq, n_batch=r["batch"], n_ubatch=r["batch"], n_seq_max=n_seq,
                n_threads=2, n_threads_batch=2)
    toks = s.tokenize(text, add_special=True, parse_special=False)
    entries, n_chunk = compute_imatrix(s.ctx, toks, r["ctx"], r["batch"], r["chunks"], add_bos=bool(s.vocab.add_bos),
                                       bos=int(s.vocab.bos), n_seq=n_seq)
    assert n_chunk == r["chunks"]
    out = workdir / "ours.imatrix.gguf"
    save_imatrix(out, entries, datasets=[r["text"]], chunk_count=n_chunk, chunk_size=r["ctx"])
    ours = _core.load_imatrix(out)
    ref = _core.load_imatrix(text_imatrix)
    assert ours["datasets"] == ref["datasets"] == [r["text"]]
    assert ours["chunk_count"] == ref["chunk_count"] and ours["chunk_size"] == ref["chunk_size"]
    assert sorted(ours["weights"]) == sorted(ref["weights"])
    for n, w in ref["weights"].items():
        # per-column mean squared activations; llama.cpp's attention rounds differently
        # (f16 KV, its own kernels), which the tiny random model amplifies to ~1e-3
        np.testing.assert_allclose(ours["weights"][n], w, rtol=5e-3, err_msg=n)
    # the same counts: every token of the 4 chunks went through every layer
    raw = {k: v[1] for k, v in entries.items()}
    assert set(map(tuple, raw.values())) == {(r["chunks"] * r["ctx"],)}


def test_imatrix_collection_is_per_thread():
    with pytest.raises(ValueError, match="no importance-matrix collection"):
        _core.imatrix_end()
    _core.imatrix_begin()
    assert _core.imatrix_end() == {}


def test_cli_quantize(workdir, model_paths, tmp_path):
    import subprocess

    src = model_paths("tiny-llama")
    out = tmp_path / "cli.gguf"
    r = subprocess.run([sys.executable, "-m", "pyllama", "quantize", str(src), str(out), "q4_k_m", "2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "converting to q4_k" in r.stderr and "quant size" in r.stderr
    assert hashlib.sha256(out.read_bytes()).hexdigest() == CASES["tiny-llama Q4_K_M"]["sha256"]
    r = subprocess.run([sys.executable, "-m", "pyllama", "quantize", str(src), str(out), "Q9"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "invalid ftype 'Q9'" in r.stderr
    r = subprocess.run([sys.executable, "-m", "pyllama", "quantize", "--dry-run", str(src), "q4_k_m"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "calculating quantization size" in r.stderr and "MiB (q4_k)" in r.stderr and "quant size" in r.stderr
    assert not (src.parent / "ggml-model-Q4_K_M.gguf").exists() and "wrote" not in r.stdout
    # the pattern is lowercased (as llama-quantize does): ATTN= gives attn='s bytes
    r = subprocess.run([sys.executable, "-m", "pyllama", "quantize", str(src), str(out), "Q8_0", "--tensor-type",
                        "ATTN=Q4_0", "--tensor-type", "attn_q=q5_1"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    want = CASES["tiny-llama Q8_0 --tensor-type attn=q4_0 --tensor-type attn_q=q5_1"]["sha256"]
    assert hashlib.sha256(out.read_bytes()).hexdigest() == want
    for bad, msg in (("attn_q", "malformed tensor type"), ("=q8_0", "missing tensor name"),
                     ("attn_q=", "missing quantization type"), ("attn_q=q9", "invalid quantization type 'q9'"),
                     ("attn[=q8_0", "invalid regular expression")):
        r = subprocess.run([sys.executable, "-m", "pyllama", "quantize", str(src), str(out), "Q8_0", "--tensor-type",
                            bad], capture_output=True, text=True)
        assert r.returncode == 2 and msg in r.stderr, (bad, r.stderr)


def test_cli_tensor_type_file(workdir, model_paths, tmp_path):
    """--tensor-type-file: llama-quantize reads each whitespace-separated word of the file as
    one --tensor-type, so a file with a reference case's --tensor-type values gives that
    case's bytes (llama-quantize's output)."""
    import subprocess

    src = model_paths("tiny-llama")
    out = tmp_path / "cli.gguf"
    tt = tmp_path / "types.txt"
    tt.write_text("  ATTN_Q=q8_0\n\n\tffn_down=Q5_0 \n")
    r = subprocess.run([sys.executable, "-m", "pyllama", "quantize", "--tensor-type-file", str(tt), str(src), str(out),
                        "Q4_K_M", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    want = CASES["tiny-llama Q4_K_M --tensor-type attn_q=q8_0 --tensor-type ffn_down=q5_0"]["sha256"]
    assert hashlib.sha256(out.read_bytes()).hexdigest() == want
    tt.write_text("attn=q4_0 attn_q=q5_1")  # the order of the file is the order of the matches
    r = subprocess.run([sys.executable, "-m", "pyllama", "quantize", str(src), str(out), "Q8_0", "--tensor-type-file",
                        str(tt)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    want = CASES["tiny-llama Q8_0 --tensor-type attn=q4_0 --tensor-type attn_q=q5_1"]["sha256"]
    assert hashlib.sha256(out.read_bytes()).hexdigest() == want
    for content, extra, msg in (("attn_q=q8_0 ffn_down", [], "malformed tensor type 'ffn_down'"),
                                ("attn_q=q9", [], "invalid quantization type 'q9'"),
                                ("attn_q=q8_0", ["--tensor-type", "ffn_up=q4_0"], "not both"),
                                (None, [], "failed to open file")):
        if content is None:
            tt.unlink()
        else:
            tt.write_text(content)
        r = subprocess.run([sys.executable, "-m", "pyllama", "quantize", str(src), str(out), "Q8_0",
                            "--tensor-type-file", str(tt), *extra], capture_output=True, text=True)
        assert r.returncode == 2 and msg in r.stderr, (content, r.stderr)


def test_parse_override_kv_as_llama_cpp():
    import typer
    from pyllama.cli.quantize import parse_override_kv as p

    assert p("a.b=int:-12x") == ("a.b", "int", -12)  # atol: the number prefix
    assert p("a=int:x") == ("a", "int", 0)
    assert p("a=float: 2.5e1y") == ("a", "float", 25.0)
    assert p("a=bool:false") == ("a", "bool", False)
    assert p("a=str:x=y:z") == ("a", "str", "x=y:z")
    for bad, msg in (("a", "malformed"), ("=int:1", "malformed"), ("k" * 128 + "=int:1", "malformed"),
                     ("a=i32:1", "invalid type"), ("a=bool:yes", "invalid boolean"),
                     ("a=str:" + "x" * 128, "cannot exceed 127")):
        with pytest.raises(typer.BadParameter, match=msg):
            p(bad)


def test_parse_prune_layers_as_llama_cpp():
    import typer
    from pyllama.cli.quantize import parse_prune_layers as p

    assert p("4,1, 3,1") == [1, 3, 4]  # std::stoi per item, then sorted and unique
    assert p("2x") == [2]
    for bad in ("-1", "x", "1,,2", ""):
        with pytest.raises(typer.BadParameter, match="invalid layer id"):
            p(bad)


def test_dry_run_plans_what_a_run_writes(workdir, model_paths):
    """--dry-run reports, tensor by tensor, the names, types and sizes the real run writes
    (whose bytes are llama-quantize's, above), and writes nothing."""
    src = model_paths("tiny-gemma3")
    kw = dict(tensor_types=[("attn_v", "q8_0")], prune_layers=[1, 4], kv_overrides=[("x.y", "int", 3)])
    plan, done = [], []
    out = workdir / "dry.gguf"
    s = quantize(src, out, "Q4_K_M", dry_run=True, progress=plan.append, **kw)
    assert not out.exists() and s["outputs"] == []
    r = quantize(src, out, "Q4_K_M", progress=done.append, **kw)
    key = lambda d: (d["name"], d["src_type"], d["dst_type"], d["src_bytes"], d["dst_bytes"])  # noqa: E731
    assert [key(d) for d in plan] == [key(d) for d in done]
    assert any(d["name"] == "blk.3.attn_v.weight" and d["dst_type"] == "Q8_0" for d in plan)  # blk.5 renumbered
    assert (s["size_before"], s["size_after"], s["n_tensors"]) == (r["size_before"], r["size_after"], r["n_tensors"])
    out.unlink()
    # no quantizer runs: a type that needs an importance matrix only warns, as in llama-quantize
    s = quantize(model_paths("tiny-llama"), out, "IQ2_XXS", dry_run=True)
    assert not out.exists()
    assert s["warnings"][-1].startswith("dry run completed successfully, but actually completing this quantization "
                                        "will require an imatrix")
