"""LoRA adapters and control vectors for the tiny test models (tests/models/test_lora.py), and
llama.cpp's logits with them applied (lora_reference.npz beside this file).

The adapters are random but deterministic (fixed seeds; gguf-py's writer output is
deterministic), laid out as llama.cpp's convert_lora_to_gguf.py writes them:
``general.type = adapter``, ``adapter.type = lora``, ``adapter.lora.alpha``, and per
adapted weight W {n_in, n_out} the tensors ``<W>.lora_a`` {n_in, rank} and ``<W>.lora_b``
{rank, n_out} (ggml order; numpy shapes are the reverse). Control vectors follow
llama.cpp's format: ``general.architecture = controlvector``, F32 tensors ``direction.N``
for layers N >= 1.

The tests rebuild these files at test time with :func:`write_case`; only the reference
logits are stored (the 20 highest at every position, and the whole last row). Regenerate them (needs llama.cpp's build, e.g. the llama-cpp-python
0.3.36 sdist built with AVX2 in ~/.cache/pyllama/llama.cpp/build-avx2):

    python tests/data/lora/make_lora.py [LLAMA_SRC] [LLAMA_BUILD] [TINY_DIR]

which compiles lora_logits.cpp against that build and runs it on every case of CASES.
llama.cpp runs ../shared/tiny's models (TINY_DIR): tests/data/make_tiny.py writes the same
weights (tests/models/test_logits.py checks that) but a tokenizer without BPE merges, which
llama.cpp refuses to load; the tests feed token ids, so the logits are the same.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
TOPK = 20
TOKENS = [1, 17, 402, 1999, 5, 733, 64, 1024, 12, 300, 1500, 7, 88, 2047, 640, 3]


def _make_tiny():
    spec = importlib.util.spec_from_file_location("make_tiny", HERE.parent / "make_tiny.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _shapes(model_path: Path) -> dict:
    import gguf

    r = gguf.GGUFReader(str(model_path))
    return {t.name: [int(d) for d in t.shape] for t in r.tensors}  # ggml order (ne)


def _tensor(w, name: str, a: np.ndarray, qtype: str) -> None:
    import gguf

    a = np.ascontiguousarray(a, dtype=np.float32)
    if qtype == "F32":
        w.add_tensor(name, a)
    elif qtype == "F16":
        w.add_tensor(name, a.astype(np.float16))
    else:
        t = getattr(gguf.GGMLQuantizationType, qtype)
        w.add_tensor(name, gguf.quants.quantize(a, t), raw_dtype=t)


def write_lora(path: Path, model_path: Path, arch: str, *, seed: int, rank: int, alpha: float | None,
               targets: list[str], qtype: str = "F32", extra_kv: dict | None = None) -> Path:
    """An adapter for the weights of `model_path` whose names end with one of `targets`
    (e.g. "attn_q.weight"; "token_embd.weight" uses llama.cpp's flipped layout)."""
    import gguf

    shapes = _shapes(model_path)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    if alpha is not None:
        w.add_float32("adapter.lora.alpha", alpha)
    for k, v in (extra_kv or {}).items():
        if isinstance(v, list):  # token ids: uint32, as convert_lora_to_gguf.py writes them
            w.add_key_value(k, v, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT32)
        else:
            w.add_string(k, v)
    for name, ne in shapes.items():
        if not any(name.endswith(t) for t in targets):
            continue
        if name == "token_embd.weight":
            n_embd, n_vocab = ne[0], ne[1]
            a = rng.standard_normal((n_vocab, rank)) * 0.5          # ne {rank, n_vocab}
            b = rng.standard_normal((n_embd, rank)) * (0.5 / rank)  # ne {rank, n_embd}
        else:
            n_in, n_out = ne[0], ne[1]
            lead = tuple(reversed(ne[2:]))  # experts first in numpy order
            a = rng.standard_normal(lead + (rank, n_in)) / np.sqrt(n_in)
            b = rng.standard_normal(lead + (n_out, rank)) * (0.4 / np.sqrt(rank))
        _tensor(w, name + ".lora_a", a, qtype)
        _tensor(w, name + ".lora_b", b, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_cvec(path: Path, n_embd: int, layers: list[int], seed: int) -> Path:
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "controlvector")
    w.add_string("controlvector.model_hint", "tiny")
    w.add_uint32("controlvector.layer_count", len(layers))
    for il in layers:
        w.add_tensor(f"direction.{il}", (rng.standard_normal(n_embd) * 0.5).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


ATTN_FFN = ["attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
            "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]

#: adapter name -> (arch, model qtype, write_lora keywords)
ADAPTERS = {
    "llama-a": ("llama", "F32", dict(seed=1, rank=8, alpha=16.0, targets=ATTN_FFN)),
    "llama-b-f16": ("llama", "F32", dict(seed=2, rank=4, alpha=None, targets=["attn_q.weight", "ffn_down.weight"],
                                         qtype="F16")),
    "llama-q8": ("llama", "Q8_0", dict(seed=3, rank=32, alpha=8.0, targets=ATTN_FFN, qtype="Q8_0")),
    "qwen3moe-bf16": ("qwen3moe", "F32", dict(
        seed=4, rank=4, alpha=6.0, qtype="BF16",
        targets=["attn_q.weight", "attn_output.weight", "ffn_gate_inp.weight", "ffn_gate_exps.weight",
                 "ffn_up_exps.weight", "ffn_down_exps.weight", "token_embd.weight", "output.weight"])),
    "gemma3-a": ("gemma3", "F32", dict(seed=5, rank=8, alpha=8.0, targets=ATTN_FFN)),
    "phi3-fused": ("phi3", "F32", dict(seed=13, rank=4, alpha=8.0, qtype="F16",
                                       targets=["attn_qkv.weight", "attn_output.weight", "ffn_up.weight",
                                                "ffn_down.weight", "token_embd.weight", "output.weight"])),
    "phi2-a": ("phi2", "F32", dict(seed=14, rank=8, alpha=4.0,
                                   targets=["attn_qkv.weight", "attn_output.weight", "ffn_up.weight", "ffn_down.weight",
                                            "output.weight"])),
    "llama-alora": ("llama", "F32", dict(seed=6, rank=2, alpha=4.0, targets=["attn_v.weight"],
                                         extra_kv={"adapter.alora.invocation_tokens": [5, 733, 64]})),
}
#: control vector name -> (arch, layers, seed)
CVECS = {
    "phi2-cv": ("phi2", [1], 15),
    "gemma3-cv": ("gemma3", [1, 2, 3, 4, 5], 7),
    "gemma3-cv2": ("gemma3", [2, 3], 8),
}

#: case -> (arch, model qtype, [(adapter, scale)], [(cvec, scale)], cvec layer range or None)
CASES = {
    "llama-one": ("llama", "F32", [("llama-a", 1.0)], [], None),
    "llama-two": ("llama", "F32", [("llama-a", 0.5), ("llama-b-f16", 0.75)], [], None),
    "llama-q8": ("llama", "Q8_0", [("llama-q8", 1.0)], [], None),
    "qwen3moe-bf16": ("qwen3moe", "F32", [("qwen3moe-bf16", 1.5)], [], None),
    "gemma3-lora-cvec": ("gemma3", "F32", [("gemma3-a", 0.8)], [("gemma3-cv", 0.8)], (2, 4)),
    "gemma3-cvec-two": ("gemma3", "F32", [], [("gemma3-cv", 1.0), ("gemma3-cv2", -0.5)], None),
    "phi3-fused": ("phi3", "F32", [("phi3-fused", 1.0)], [], None),
    "phi2-lora-cvec": ("phi2", "F32", [("phi2-a", 1.25)], [("phi2-cv", 2.0)], None),
}


def model_path(arch: str, qtype: str, out_dir: Path) -> Path:
    return Path(_make_tiny().write_tiny(arch, out_dir, qtype))


def write_adapter(name: str, out_dir: Path) -> Path:
    arch, qtype, kw = ADAPTERS[name]
    p = Path(out_dir) / f"{name}.gguf"
    if not p.exists():
        write_lora(p, model_path(arch, qtype, out_dir), arch, **kw)
    return p


def write_control_vector(name: str, out_dir: Path) -> Path:
    arch, layers, seed = CVECS[name]
    p = Path(out_dir) / f"{name}.gguf"
    if not p.exists():
        n_embd = _shapes(model_path(arch, "F32", out_dir))["token_embd.weight"][0]
        write_cvec(p, n_embd, layers, seed)
    return p


def write_case(case: str, out_dir: Path):
    """(model path, [(adapter path, scale)], [(cvec path, scale)], layer range) for a case."""
    arch, qtype, loras, cvecs, rng = CASES[case]
    return (model_path(arch, qtype, out_dir), [(write_adapter(a, out_dir), s) for a, s in loras],
            [(write_control_vector(c, out_dir), s) for c, s in cvecs], rng)


def main() -> None:
    import tempfile

    src = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp")
    build = Path(sys.argv[2] if len(sys.argv) > 2 else Path.home() / ".cache/pyllama/llama.cpp/build-avx2")
    tiny = Path(sys.argv[3] if len(sys.argv) > 3 else "/work/shared/tiny/models")
    tmp = Path(tempfile.mkdtemp(prefix="pyllama-lora-"))
    exe = tmp / "lora_logits"
    subprocess.run(["g++", "-O2", "-std=c++17", str(HERE / "lora_logits.cpp"), f"-I{src}/include",
                    f"-I{src}/ggml/include", f"-I{src}/common", f"-I{src}/vendor", f"-L{build}/bin", "-lllama",
                    "-lllama-common", "-lggml", "-lggml-base", f"-Wl,-rpath,{build}/bin", "-o", str(exe)], check=True)
    out = {}
    for case in CASES:
        _, loras, cvecs, rng = write_case(case, tmp)
        model = tiny / f"tiny-{CASES[case][0]}-{CASES[case][1]}.gguf"
        args = [str(exe), str(model), str(tmp / f"{case}.f32")]
        for p, s in loras:
            args += ["--lora", str(p), repr(s)]
        for p, s in cvecs:
            args += ["--cvec", str(p), repr(s)]
        if rng is not None:
            args += ["--cvec-range", str(rng[0]), str(rng[1])]
        args += ["--"] + [str(t) for t in TOKENS]
        subprocess.run(args, check=True, capture_output=True)
        out[case] = np.fromfile(tmp / f"{case}.f32", dtype=np.float32).reshape(len(TOKENS), -1)
        # and the base model alone, to show the adapters matter
        args = [str(exe), str(model), str(tmp / f"{case}-base.f32"), "--"] + [str(t) for t in TOKENS]
        subprocess.run(args, check=True, capture_output=True)
        base = np.fromfile(tmp / f"{case}-base.f32", dtype=np.float32).reshape(len(TOKENS), -1)
        print(f"{case}: max |adapted - base| = {np.abs(out[case] - base).max():.3f}, "
              f"top-1 changed at {(out[case].argmax(1) != base.argmax(1)).sum()}/{len(TOKENS)} positions")
    # kept small: the 20 highest logits at every position and the whole last row
    z = {"tokens": np.array(TOKENS, np.int32)}
    for case, lg in out.items():
        ids = np.argsort(-lg, axis=1, kind="stable")[:, :TOPK].astype(np.int32)
        z[f"{case}_topk_ids"] = ids
        z[f"{case}_topk_vals"] = np.take_along_axis(lg, ids, axis=1)
        z[f"{case}_last"] = lg[-1]
    np.savez_compressed(HERE / "lora_reference.npz", **z)


if __name__ == "__main__":
    main()
