"""llama.cpp's logits for the tiny fixtures that exist only in tests/data/make_tiny.py (not in
../shared/tiny): tiny-<arch>-<qtype>.logits.json / .npz beside this file, in the format of
the other tiny references (../shared/reference/make_reference.py): per prompt its tokens, the
20 highest logits at every position and the whole last row, and for the architectures in
GREEDY llama.cpp's greedy continuation (N_GEN tokens) with its top-1 margin at each step.
tests/models/test_logits.py holds pyllama to them with the tolerances of every tiny model.

The prompts are the token ids of tiny-qwen3-F32's reference (8, 46 and 301 tokens: the
301-token prompt crosses llama.cpp's 256-key flash-attention tiles). llama.cpp runs
make_tiny.py's weights with ../shared/tiny's 2048-token BPE vocabulary (llama.cpp refuses a
BPE vocabulary without merges; the tests feed token ids, so the logits are the same). Uses
../lora/lora_logits.cpp (n_ctx 2048, n_batch 2048, n_ubatch 512 (N_UBATCH below), 2 threads, default flash
attention, every position an output) built against llama.cpp's library:

    python tests/data/tiny/make_tiny_reference.py <arch> [LLAMA_SRC] [LLAMA_BUILD] [TOKENIZER_GGUF]
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
TOPK = 20
N_GEN = 12
# micro-batch size of llama.cpp's run where 512 does not suit: at 64 queries and more
# llama.cpp switches to its tiled flash-attention kernel, whose float differences the tiny
# deepseek2's expert routing (MLA, expert groups, sigmoid with bias) turns into flipped
# experts (and the 22 layers of four AltUp streams of the tiny gemma3n amplify into
# logits); with 32, llama.cpp runs the one-chunk kernel pyllama runs at every size
N_UBATCH = {"deepseek2": 32, "mistral4": 32, "gemma3n": 32}
# architectures whose reference also holds llama.cpp's greedy continuation (checked by
# tests/models/test_logits.py up to the first near tie)
GREEDY = {"olmo2", "granite", "starcoder2", "exaone4", "glm4", "llama4", "phimoe", "granitemoe", "glm4moe", "cohere2",
          "gpt-oss", "deepseek2", "mistral4", "mamba2", "lfm2", "qwen35", "qwen35moe", "qwen3next", "falcon-h1",
          "granitehybrid", "lfm2moe", "gemma4", "mamba", "falcon-mamba", "rwkv6", "rwkv7", "arwkv7", "rwkv6qwen2", "gemma3n"}


def main() -> None:
    arch = sys.argv[1]
    src = Path(sys.argv[2] if len(sys.argv) > 2 else "/work/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp")
    build = Path(sys.argv[3] if len(sys.argv) > 3 else Path.home() / ".cache/pyllama/llama.cpp/build-avx2")
    tok = Path(sys.argv[4] if len(sys.argv) > 4 else "/work/shared/tiny/models/tiny-llama-F32.gguf")
    spec = importlib.util.spec_from_file_location("make_tiny", HERE.parent / "make_tiny.py")
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    tmp = Path(tempfile.mkdtemp(prefix="pyllama-tinyref-"))
    exe = tmp / "logits"
    subprocess.run(["g++", "-O2", "-std=c++17", str(HERE.parent / "lora" / "lora_logits.cpp"), f"-I{src}/include",
                    f"-I{src}/ggml/include", f"-I{src}/common", f"-I{src}/vendor", f"-L{build}/bin", "-lllama",
                    "-lllama-common", "-lggml", "-lggml-base", f"-Wl,-rpath,{build}/bin", "-o", str(exe)], check=True)
    prompts = json.loads((HERE / "tiny-qwen3-F32.logits.json").read_text())["prompts"]
    n_ubatch = N_UBATCH.get(arch, 512)
    env = dict(os.environ, LORA_LOGITS_N_UBATCH=str(n_ubatch))
    for qtype in ("F32", "Q8_0"):
        model = mk.write_tiny(arch, tmp, qtype, tokenizer_from=tok)
        name = f"tiny-{arch}-{qtype}"
        z, meta = {}, []
        for i, p in enumerate(prompts):
            toks = [int(t) for t in p["tokens"]]
            out = tmp / f"{name}-p{i}.f32"
            subprocess.run([str(exe), str(model), str(out), "--"] + [str(t) for t in toks], check=True,
                           capture_output=True, env=env)
            lg = np.fromfile(out, dtype=np.float32).reshape(len(toks), -1)
            ids = np.argsort(-lg, axis=1, kind="stable")[:, :TOPK].astype(np.int32)
            z[f"p{i}_topk_ids"] = ids
            z[f"p{i}_topk_vals"] = np.take_along_axis(lg, ids, axis=1)
            z[f"p{i}_last_logits"] = lg[-1]
            entry = {"prompt": p["prompt"], "tokens": toks}
            if arch in GREEDY:
                # llama.cpp's greedy continuation, one token per run over prompt + what came so far
                gen, margins, last = [], [], lg[-1]
                for _ in range(N_GEN):
                    order = np.argsort(-last, kind="stable")
                    gen.append(int(order[0]))
                    margins.append(float(last[order[0]] - last[order[1]]))
                    seq = toks + gen
                    subprocess.run([str(exe), str(model), str(out), "--"] + [str(t) for t in seq], check=True,
                                   capture_output=True, env=env)
                    last = np.fromfile(out, dtype=np.float32).reshape(len(seq), -1)[-1]
                entry.update(greedy=gen, greedy_top1_margin=margins)
            meta.append(entry)
        n_vocab = int(z["p0_last_logits"].shape[0])
        ref = {"model": name, "n_vocab": n_vocab, "topk": TOPK,
               "settings": {"n_ctx": 2048, "n_batch": 2048, "n_ubatch": n_ubatch, "n_threads": 2,
                            "flash_attn": "default (auto)", "generator": "tests/data/tiny/make_tiny_reference.py"},
               "prompts": meta}
        (HERE / f"{name}.logits.json").write_text(json.dumps(ref, indent=1) + "\n")
        np.savez_compressed(HERE / f"{name}.logits.npz", **z)
        print(name, "written")


if __name__ == "__main__":
    main()
