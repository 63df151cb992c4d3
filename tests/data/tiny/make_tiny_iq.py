"""tiny-iq: a one-layer random-weight llama quantized to every grid / ternary / MXFP4 type
(and Q1_0, Q2_0, NVFP4),
with llama.cpp's logits for each (tiny-iq-<T>.logits.json / .npz beside this file, the
format of the other tiny references). tests/models/test_logits.py holds pyllama to them with the
tiny-model tolerances, tests/models/test_llamacpp_exact.py bit for bit.

No .gguf is tracked in git: the tests rebuild every file (``build(out_dir, type)``): the F32
model from SEED with the gguf package, the importance matrix from tiny-iq-imatrix.npz
(llama-imatrix's, rebuilt byte for byte), and each quantized model with ``pyllama
quantize``, whose output must have the SHA-256 of llama-quantize's (tiny-iq-quantize.json),
so the models the logits are compared on are exactly the ones llama.cpp ran. NVFP4, which
llama-quantize makes only with --tensor-type (no file type), is written by ``write_f32`` with
ggml's reference quantizer and checked tensor by tensor against llama-quantize's.

The model: llama, n_embd 256 (the rows of every 256-block type), 2 query heads and 1 KV
head of 128 (so the attention output's rows are 256 long too), n_ff 256, tied output, a
259-token SPM vocabulary (3 specials and the 256 byte tokens). Its F32 weights come from
SEED; llama-quantize --pure (every weight takes the type) makes the quantized files, with
an importance matrix from llama-imatrix on TEXT (IQ1_*, IQ2_*: the token embedding, which
has no importance data, as Q8_0). The reference logits are lora_logits.cpp's (../lora;
n_ctx 2048, n_batch 2048, n_ubatch 512, 2 threads, default flash attention) against
llama.cpp's AVX2 build:

    python tests/data/tiny/make_tiny_iq.py [LLAMA_SRC] [LLAMA_BUILD]

LLAMA_BUILD (default ~/.cache/pyllama/llama.cpp/build-avx2) needs libllama and the
llama-quantize and llama-imatrix tools (cmake --build ... --target llama-quantize
llama-imatrix). The tools run in the work directory with relative file names (the
quantized files record the imatrix and dataset names as given), as ``build`` does.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
IMATRIX_NPZ = HERE / "tiny-iq-imatrix.npz"
HASHES = HERE / "tiny-iq-quantize.json"
sys.path.insert(0, str(HERE.parent / "imatrix"))
import imatrix_npz  # noqa: E402

SEED = 4242
N_EMBD, N_FF, N_HEAD, N_HEAD_KV, HEAD_DIM = 256, 256, 2, 1, 128
N_VOCAB = 259
TOPK = 20
# tensor type (the file's name suffix) -> the llama-quantize ftype whose --pure type it is
TYPES = {"IQ2_XXS": "IQ2_XXS", "IQ2_XS": "IQ2_XS", "IQ2_S": "IQ2_M", "IQ3_XXS": "IQ3_XXS", "IQ3_S": "IQ3_S",
         "IQ1_S": "IQ1_S", "IQ1_M": "IQ1_M", "TQ1_0": "TQ1_0", "TQ2_0": "TQ2_0", "MXFP4": "MXFP4_MOE",
         "Q1_0": "Q1_0", "Q2_0": "Q2_0"}
# types llama-quantize has no file type for: every weight made that type with --tensor-type
# (and written at test time by write_f32 with ggml's reference quantizer)
TENSOR_TYPE_ONLY = {"NVFP4": "nvfp4"}
# llama-imatrix has no data for token_embd (a lookup, not a product), and these types cannot
# be made without it: their token embedding (and tied output) is Q8_0
NO_IMATRIX_EMBD = {"IQ2_XXS", "IQ2_XS", "IQ2_M", "IQ1_S", "IQ1_M"}
# prompts: token ids (bos first). All under 64 tokens: from 64 queries on, llama.cpp's CPU
# flash attention switches to its tiled kernel, whose float order pyllama reproduces only
# under PYLLAMA_ORDER=llamacpp, and this model's attention is sensitive enough for that to
# move its logits by ~0.3 (with PYLLAMA_ORDER=llamacpp a 301-token prompt is bit-identical
# for MXFP4). Below 64, pyllama's logits are llama.cpp's to about 1e-5.
PROMPT_LENGTHS = [8, 33, 63]
TEXT = ("The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
        "How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow. ") * 40


def write_f32(path: Path, weight_type: str | None = None) -> Path:
    """The F32 model; with ``weight_type`` (NVFP4), every 2-D weight stored in that type by
    ggml's reference quantizer (pyllama's ``_core.quantize``), as llama-quantize --pure
    --tensor-type weight=<type> writes the tensors (the header differs: no file type)."""
    import gguf

    rng = np.random.default_rng(SEED)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_type("model")
    w.add_name("tiny-iq")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_uint32("llama.context_length", 2048)
    w.add_uint32("llama.embedding_length", N_EMBD)
    w.add_uint32("llama.block_count", 1)
    w.add_uint32("llama.feed_forward_length", N_FF)
    w.add_uint32("llama.attention.head_count", N_HEAD)
    w.add_uint32("llama.attention.head_count_kv", N_HEAD_KV)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_uint32("llama.attention.key_length", HEAD_DIM)
    w.add_uint32("llama.attention.value_length", HEAD_DIM)
    w.add_uint32("llama.vocab_size", N_VOCAB)
    w.add_uint32("llama.rope.dimension_count", HEAD_DIM)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)])
    w.add_token_scores([0.0] * N_VOCAB)
    w.add_token_types([2, 3, 3] + [6] * 256)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def add(name, ne, scale):
        a = np.ascontiguousarray((rng.standard_normal(tuple(reversed(ne)), dtype=np.float32) * np.float32(scale))
                                 .astype(np.float32))
        if weight_type is None:
            w.add_tensor(name, a)
        else:
            from pyllama import _core

            q = _core.quantize(a, weight_type)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType[weight_type])

    def norm(name):
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(N_EMBD, dtype=np.float32)).astype(np.float32))

    nq, nkv = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    add("token_embd.weight", [N_EMBD, N_VOCAB], 0.5)
    norm("blk.0.attn_norm.weight")
    add("blk.0.attn_q.weight", [N_EMBD, nq], 1 / 16)
    add("blk.0.attn_k.weight", [N_EMBD, nkv], 1 / 16)
    add("blk.0.attn_v.weight", [N_EMBD, nkv], 1 / 16)
    add("blk.0.attn_output.weight", [nq, N_EMBD], 1 / np.sqrt(nq))
    norm("blk.0.ffn_norm.weight")
    add("blk.0.ffn_gate.weight", [N_EMBD, N_FF], 1 / 16)
    add("blk.0.ffn_up.weight", [N_EMBD, N_FF], 1 / 16)
    add("blk.0.ffn_down.weight", [N_FF, N_EMBD], 1 / 16)
    norm("output_norm.weight")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(SEED + 1)
    return [[1] + rng.integers(3, N_VOCAB, n - 1).tolist() for n in PROMPT_LENGTHS]


def quantize_args(ty: str) -> tuple[str, list[str]]:
    """(llama-quantize ftype, its switches before the file names) for tensor type ``ty``."""
    ftype = TYPES[ty]
    embd = ["--token-embedding-type", "q8_0"] if ftype in NO_IMATRIX_EMBD else []
    return ftype, ["--pure", "--imatrix", "imatrix.gguf"] + embd


def build(out_dir: Path, ty: str) -> Path:
    """tiny-iq-<ty>.gguf in ``out_dir`` (reused when there), as the tests use it: the F32
    model and the importance matrix written once, the type quantized by ``pyllama
    quantize`` (in ``out_dir``, with the relative names llama-quantize was given). Raises
    AssertionError unless the file is byte for byte llama-quantize's (tiny-iq-quantize.json)."""
    from pyllama.imatrix import quantize

    out_dir = Path(out_dir)
    out = out_dir / f"tiny-iq-{ty}.gguf"
    if out.exists():
        return out
    if ty in TENSOR_TYPE_ONLY:
        return build_tensor_type_only(out_dir, ty)
    f32 = out_dir / "tiny-iq-F32.gguf"
    if not f32.exists():
        write_f32(f32)
    if not (out_dir / "imatrix.gguf").exists():
        imatrix_npz.to_gguf(IMATRIX_NPZ, out_dir / "imatrix.gguf")
    ftype, args = quantize_args(ty)
    tmp = out_dir / f"{out.name}.part"
    cwd = os.getcwd()
    os.chdir(out_dir)
    try:
        quantize(f32.name, tmp.name, ftype, n_threads=2, imatrix="imatrix.gguf", pure=True,
                 token_embedding_type="q8_0" if "--token-embedding-type" in args else None)
    finally:
        os.chdir(cwd)
    want = json.loads(HASHES.read_text())["models"][ty]
    got = hashlib.sha256(tmp.read_bytes()).hexdigest()
    if got != want["sha256"]:
        raise AssertionError(f"pyllama quantize {ftype} {' '.join(args)}: sha256 {got}, llama-quantize's is "
                             f"{want['sha256']} ({tmp})")
    tmp.rename(out)
    return out


def tensor_hashes(path: Path) -> dict:
    """name -> (type name, sha256 of the tensor's bytes) of every tensor of a GGUF."""
    import gguf

    r = gguf.GGUFReader(str(path))
    return {t.name: [t.tensor_type.name, hashlib.sha256(np.ascontiguousarray(t.data).tobytes()).hexdigest()]
            for t in r.tensors}


def build_tensor_type_only(out_dir: Path, ty: str) -> Path:
    """tiny-iq-<ty>.gguf for a type of TENSOR_TYPE_ONLY: written by write_f32 with the type's
    reference quantizer; raises AssertionError unless every tensor is byte for byte the one
    llama-quantize --tensor-type wrote (tiny-iq-quantize.json)."""
    out = Path(out_dir) / f"tiny-iq-{ty}.gguf"
    tmp = write_f32(Path(out_dir) / f"tiny-iq-{ty}.gguf.part", ty)
    want = json.loads(HASHES.read_text())["models"][ty]["tensors"]
    got = tensor_hashes(tmp)
    if got != want:
        bad = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        raise AssertionError(f"{ty}: tensors differ from llama-quantize's: {bad} ({tmp})")
    tmp.rename(out)
    return out


def main() -> None:
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp")
    build_dir = Path(sys.argv[2] if len(sys.argv) > 2 else Path.home() / ".cache/pyllama/llama.cpp/build-avx2")
    tmp = Path(tempfile.mkdtemp(prefix="pyllama-tinyiq-"))
    exe = tmp / "logits"
    subprocess.run(["g++", "-O2", "-std=c++17", str(HERE.parent / "lora" / "lora_logits.cpp"), f"-I{src}/include",
                    f"-I{src}/ggml/include", f"-I{src}/common", f"-I{src}/vendor", f"-L{build_dir}/bin", "-lllama",
                    "-lllama-common", "-lggml", "-lggml-base", f"-Wl,-rpath,{build_dir}/bin", "-o", str(exe)],
                   check=True)
    f32 = write_f32(tmp / "tiny-iq-F32.gguf")
    (tmp / "text.txt").write_text(TEXT)
    subprocess.run([str(build_dir / "bin" / "llama-imatrix"), "-m", f32.name, "-f", "text.txt", "-o", "imatrix.gguf",
                    "-c", "128", "-t", "2"], cwd=tmp, check=True, capture_output=True)
    imatrix_npz.to_npz(tmp / "imatrix.gguf", IMATRIX_NPZ)
    hashes: dict = {"generator": "tests/data/tiny/make_tiny_iq.py: llama-quantize of llama.cpp 0c1e570 (build-avx2)",
                    "imatrix": "llama-imatrix -m tiny-iq-F32.gguf -f text.txt -o imatrix.gguf -c 128 -t 2",
                    "models": {}}
    for ty in [*TYPES, *TENSOR_TYPE_ONLY]:
        name = f"tiny-iq-{ty}"
        out = tmp / f"{name}.gguf"
        if ty in TENSOR_TYPE_ONLY:
            ftype, args = "Q8_0", ["--pure", "--tensor-type", f"weight={TENSOR_TYPE_ONLY[ty]}"]
        else:
            ftype, args = quantize_args(ty)
        subprocess.run([str(build_dir / "bin" / "llama-quantize"), *args, f32.name, out.name, ftype, "2"], cwd=tmp,
                       check=True, capture_output=True)
        data = out.read_bytes()
        hashes["models"][ty] = {"ftype": ftype, "args": args, "sha256": hashlib.sha256(data).hexdigest(),
                                "size": len(data)}
        if ty in TENSOR_TYPE_ONLY:
            hashes["models"][ty]["tensors"] = tensor_hashes(out)
        z, meta = {}, []
        for i, toks in enumerate(prompts()):
            res = tmp / f"{name}-p{i}.f32"
            subprocess.run([str(exe), str(out), str(res), "--"] + [str(t) for t in toks], check=True,
                           capture_output=True)
            lg = np.fromfile(res, dtype=np.float32).reshape(len(toks), -1)
            ids = np.argsort(-lg, axis=1, kind="stable")[:, :TOPK].astype(np.int32)
            z[f"p{i}_topk_ids"] = ids
            z[f"p{i}_topk_vals"] = np.take_along_axis(lg, ids, axis=1)
            z[f"p{i}_last_logits"] = lg[-1]
            meta.append({"prompt": f"random ids {i}", "tokens": toks})
        embd = args[3:] if ty not in TENSOR_TYPE_ONLY else args[1:]
        ref = {"model": name, "n_vocab": N_VOCAB, "topk": TOPK,
               "settings": {"n_ctx": 2048, "n_batch": 2048, "n_ubatch": 512, "n_threads": 2,
                            "flash_attn": "default (auto)", "generator": "tests/data/tiny/make_tiny_iq.py",
                            "quantize": f"llama-quantize --pure --imatrix (llama-imatrix -c 128) {' '.join(embd)} {ftype}"},
               "prompts": meta}
        (HERE / f"{name}.logits.json").write_text(json.dumps(ref, indent=1) + "\n")
        np.savez_compressed(HERE / f"{name}.logits.npz", **z)
        print(name, len(data), "bytes")
    HASHES.write_text(json.dumps(hashes, indent=1) + "\n")


if __name__ == "__main__":
    main()
