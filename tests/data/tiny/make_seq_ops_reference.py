"""llama.cpp's answers to SCRIPT (multi-sequence batches and sequence operations) for the
tiny recurrent and hybrid fixtures of tests/data/make_tiny.py (and qwen3's plain KV cache,
gemma3n's with layers reusing others' cells): seq-ops-<arch>.json (the
script, every printed answer, n_vocab) and seq-ops-<arch>.npz (the logits rows, in order)
beside this file, made by seq_ops.cpp built against llama.cpp's library. tests/models/test_recurrent.py
replays the script on pyllama and compares.

    python tests/data/tiny/make_seq_ops_reference.py <arch> [LLAMA_SRC] [LLAMA_BUILD] [TOKENIZER_GGUF]
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
N_SEQ_MAX = 4
# architectures whose KV cache cannot shift positions: the script goes without add / div
NO_SHIFT = ("qwen35", "qwen35moe")
_A = "17,300,5,901,44,1203,8,77"
_B = "999,3,1500,62,11,470"
# two sequences of different lengths in one batch (equal split: 6 + 6, then 2 of seq 0);
# refused and accepted removals; a copy that shares the state and splits it at the next
# decode; keep; a sequence rebuilt from nothing; position moves
SCRIPT = f"""decode 0:{_A};1:{_B}
pos 0
pos 1
rm 1 3 -1
rm 1 5 -1
rm 1 6 -1
rm 0 0 3
rm -1 2 -1
pos 1
cp 0 2 -1 -1
pos 2
decode 2:1000;0:1001
pos 0
pos 2
decode 1:5,6,7;3:{_B}
keep 2
pos 0
pos 1
pos 2
pos 3
rm 2 -1 -1
decode 2:{_B}
add 2 -1 -1 10
pos 2
div 2 -1 -1 2
pos 2
decode 2:42
rm 2 0 -1
pos 2
decode 0:{_A}
"""


def main() -> None:
    arch = sys.argv[1]
    src = Path(sys.argv[2] if len(sys.argv) > 2 else "/work/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp")
    build = Path(sys.argv[3] if len(sys.argv) > 3 else Path.home() / ".cache/pyllama/llama.cpp/build-avx2")
    tok = Path(sys.argv[4] if len(sys.argv) > 4 else "/work/shared/tiny/models/tiny-llama-F32.gguf")
    spec = importlib.util.spec_from_file_location("make_tiny", HERE.parent / "make_tiny.py")
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    tmp = Path(tempfile.mkdtemp(prefix="pyllama-seqops-"))
    exe = tmp / "seq_ops"
    subprocess.run(["g++", "-O2", "-std=c++17", str(HERE / "seq_ops.cpp"), f"-I{src}/include", f"-I{src}/ggml/include",
                    f"-L{build}/bin", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{build}/bin", "-o", str(exe)],
                   check=True)
    model = mk.write_tiny(arch, tmp, "F32", tokenizer_from=tok)
    script = SCRIPT
    if arch in NO_SHIFT:  # llama.cpp aborts when it would have to K-shift (M-RoPE)
        script = "".join(ln + "\n" for ln in SCRIPT.splitlines() if not ln.startswith(("add", "div")))
    out = tmp / "rows.f32"
    r = subprocess.run([str(exe), str(model), str(out), str(N_SEQ_MAX)], input=script, capture_output=True, text=True,
                       check=True)
    answers = [ln for ln in r.stdout.splitlines() if ln.strip()]
    rows = np.fromfile(out, dtype=np.float32)
    n_vocab = mk.N_VOCAB
    rows = rows.reshape(-1, n_vocab)
    ref = {"arch": arch, "n_vocab": n_vocab, "n_seq_max": N_SEQ_MAX, "script": script.splitlines(),
           "answers": answers, "generator": "tests/data/tiny/make_seq_ops_reference.py"}
    (HERE / f"seq-ops-{arch}.json").write_text(json.dumps(ref, indent=1) + "\n")
    np.savez_compressed(HERE / f"seq-ops-{arch}.npz", rows=rows)
    print(f"seq-ops-{arch}: {len(answers)} answers, {rows.shape[0]} rows")


if __name__ == "__main__":
    main()
