"""llama.cpp's logits for every KV cache type (-ctk / -ctv) with flash attention on, off
and auto, for tests/kernels/test_kv_types.py (kv_reference.npz beside this file).

Regenerate (needs llama.cpp built from the llama-cpp-python 0.3.36 sdist, e.g. the AVX2
build in ~/.cache/pyllama/llama.cpp/build-avx2, and the reference models installed):

    PYTHONPATH=python python tests/data/kv_types/make_kv_reference.py [LLAMA_SRC] [LLAMA_BUILD] [TINY_DIR]

It compiles kv_logits.cpp against that build and runs it per (model, type_k, type_v,
flash_attn) case of CASES. llama.cpp runs ../shared/tiny's tiny-llama-F32 (TINY_DIR; the
same weights tests/data/make_tiny.py writes, with a tokenizer llama.cpp loads) on 48 fixed
token ids, SmolLM2 and Gemma 3 on the tokens of their reference prompt 2 (a short chat
turn; tests/data/reference/*.json) in one batch, and SmolLM2's first 20 of them one
llama_decode per token ("smollm2one": the token-generation kernels). Stored per case: the 20 highest logits at every
position and, for the tiny model, the whole last row; cases llama.cpp refuses are stored
as refused (``<case>_refused``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
TOPK = 20
TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
QUANTIZED = {"q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"}
#: flash_attn_type: -1 auto, 0 off, 1 on
TINY_TOKENS = [1] + [int(x) for x in np.random.default_rng(11).integers(2, 2048, 47)]


def tiny_cases() -> list[tuple[str, str, int]]:
    cases = []
    for t in TYPES:
        cases += [(t, "f16", 1), ("f16", t, 1), (t, t, 1), (t, t, -1), (t, "f16", 0)]
        if t not in QUANTIZED:
            cases.append((t, t, 0))
    cases += [("f16", "q4_0", 0), ("q8_0", "q8_0", 0)]  # refused: quantized V without flash attention
    return sorted(set(cases), key=lambda c: (TYPES.index(c[0]), TYPES.index(c[1]), c[2]))


def real_cases() -> list[tuple[str, str, int]]:
    return [(t, t, -1) for t in TYPES] + [("q8_0", "f16", 0), ("q4_0", "f16", 0), ("f16", "q4_0", 1)]


def decode_cases() -> list[tuple[str, str, int]]:
    """Token generation (one llama_decode per token) on SmolLM2: the single-query kernels."""
    return [("f16", "f16", 0), ("f32", "f32", 0), ("q4_0", "f16", 0), ("bf16", "bf16", 0), ("f32", "f32", 1),
            ("q4_1", "q4_1", 1), ("iq4_nl", "iq4_nl", 1), ("q8_0", "q5_0", -1), ("f16", "f16", 1)]


def case_name(model: str, tk: str, tv: str, fa: int) -> str:
    return f"{model}_{tk}_{tv}_{({-1: 'auto', 0: 'off', 1: 'on'})[fa]}"


def main() -> None:
    from pyllama import _models

    src = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp")
    build = Path(sys.argv[2] if len(sys.argv) > 2 else Path.home() / ".cache/pyllama/llama.cpp/build-avx2")
    tiny = Path(sys.argv[3] if len(sys.argv) > 3 else "/work/shared/tiny/models")
    tmp = Path(tempfile.mkdtemp(prefix="pyllama-kv-"))
    exe = tmp / "kv_logits"
    subprocess.run(["g++", "-O2", "-std=c++17", str(HERE / "kv_logits.cpp"), f"-I{src}/include",
                    f"-I{src}/ggml/include", f"-L{build}/bin", "-lllama", "-lggml", "-lggml-base",
                    f"-Wl,-rpath,{build}/bin", "-o", str(exe)], check=True)
    ref = HERE.parent / "reference"
    models = {
        "tiny": (tiny / "tiny-llama-F32.gguf", TINY_TOKENS, tiny_cases()),
        "smollm2": (_models.smollm2_path(), json.loads((ref / "smollm2-135m-q4_1.logits.json").read_text())
                    ["prompts"][2]["tokens"], real_cases()),
        "gemma3": (_models.gemma3_path(), json.loads((ref / "gemma3-270m-q4_k_m.logits.json").read_text())
                   ["prompts"][2]["tokens"], real_cases()),
        # "smollm2one": SmolLM2's first 20 prompt tokens decoded one at a time
        "smollm2one": (_models.smollm2_path(), json.loads((ref / "smollm2-135m-q4_1.logits.json").read_text())
                       ["prompts"][2]["tokens"][:20], decode_cases()),
    }
    z: dict = {}
    for model, (path, tokens, cases) in models.items():
        z[f"{model}_tokens"] = np.array(tokens, np.int32)
        names = []
        for tk, tv, fa in cases:
            name = case_name(model, tk, tv, fa)
            names.append(name)
            out = tmp / f"{name}.f32"
            one = ["one"] if model.endswith("one") else []
            r = subprocess.run([str(exe), str(path), str(out), tk, tv, str(fa), *one, "--"] + [str(t) for t in tokens],
                               capture_output=True, text=True)
            if r.returncode == 5:
                z[f"{name}_refused"] = np.array(True)
                print(f"{name}: refused")
                continue
            if r.returncode != 0:
                raise SystemExit(f"{name}: kv_logits failed ({r.returncode}): {r.stderr[-2000:]}")
            lg = np.fromfile(out, dtype=np.float32).reshape(len(tokens), -1)
            ids = np.argsort(-lg, axis=1, kind="stable")[:, :TOPK].astype(np.int32)
            z[f"{name}_topk_ids"] = ids
            z[f"{name}_topk_vals"] = np.take_along_axis(lg, ids, axis=1)
            if model == "tiny":
                z[f"{name}_last"] = lg[-1]
            print(f"{name}: top-1 {ids[:, 0][-4:]}")
        z[f"{model}_cases"] = np.array(names)
    np.savez_compressed(HERE / "kv_reference.npz", **z)


if __name__ == "__main__":
    main()
