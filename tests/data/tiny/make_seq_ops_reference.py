"""llama.cpp's answers to SCRIPT (multi-sequence batches and sequence operations) for the
tiny recurrent and hybrid fixtures of tests/data/make_tiny.py (and qwen3's plain KV cache,
gemma3n's with layers reusing others' cells): seq-ops-<arch>.json (the
script, every printed answer, n_vocab) and seq-ops-<arch>.npz (the logits rows, in order)
beside this file, made by seq_ops.cpp built against llama.cpp's library. tests/models/test_recurrent.py
replays the script on pyllama and compares.

    python tests/data/tiny/make_seq_ops_reference.py <arch> [LLAMA_SRC] [LLAMA_BUILD] [TOKENIZER_GGUF]

With ``--rollback`` as the first argument: rollback-<arch>.json / .npz instead, the runs of
ROLLBACK (recurrent-state rollback snapshots, llama.cpp's n_rs_seq > 0: partial seq_rm, the
batch split that keeps a sequence's last n_rs_seq + 1 tokens together, state save / load with
a pending rollback), each with its own context (n_rs_seq, n_ubatch).
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
_C = "17,300,5,901,44,1203,8,77"
_D = "999,3,1500,62,11,470"
# n_rs_seq 2: refused (three back) and accepted rollbacks, a second one while the first is
# pending, rollbacks of two sequences continued in one batch, a negative seq id, state
# save / load (one sequence into another id, the whole context) with a rollback pending,
# rollbacks after a whole-state load (zeroed snapshots) and after a one-token decode (a
# snapshot the last micro-batch did not write: llama.cpp reads what the plane still holds)
ROLLBACK_1 = f"""nrs
decode 0:{_C};1:{_D}
pos 0
pos 1
rm 0 5 -1
rm 0 6 -1
pos 0
rm 0 5 -1
rm -1 -1 -1
decode 0:1000,1001
rm 0 6 -1
rm 1 5 -1
decode 0:1002;1:1003
pos 0
pos 1
rm 1 5 -1
rm 1 4 -1
save 1
save -1
decode 1:1004,1005,1006
load 1 2
pos 2
decode 2:1004,1005,1006
load -1 0
pos 0
pos 1
pos 2
decode 1:1004,1005,1006
rm 0 6 -1
decode 0:1007
rm 1 6 -1
decode 1:1008
rm 1 5 -1
decode 1:1009
rm 1 -1 -1
decode 1:999,3
rm 0 0 -1
pos 0
decode 0:17,300
"""
# n_rs_seq 3, n_ubatch 6: three sequences of 8, 6 and 7 tokens, then of 2, 5 and 1, then
# out of order (the sequential split takes 1 and 2 first): the split keeps each
# sequence's last 4 tokens in one micro-batch, so every rollback of up to 3 is valid
ROLLBACK_2 = f"""nrs
decode 0:{_C};1:{_D};2:7,8,9,10,11,12,13
pos 0
pos 1
pos 2
rm 0 5 -1
rm 1 1 -1
rm 1 3 -1
rm 2 6 -1
decode 0:20,21;1:22,23,24,25,26;2:27
rm 0 6 -1
rm 1 5 -1
rm 2 5 -1
decode 1:30,31,32,33,34,35,36,37,38;2:40,41,42,43,44,45;0:50,51,52,53,54
pos 0
pos 1
pos 2
rm 2 9 -1
rm 0 8 -1
decode 0:60,61,62,63,64,65,66,67,68,69,70,71,72;2:80
"""
# (name, n_rs_seq, n_ubatch, script)
ROLLBACK = [("rollback-2", 2, 512, ROLLBACK_1), ("rollback-3-ubatch-6", 3, 6, ROLLBACK_2)]


def _run(exe: Path, model: Path, script: str, n_vocab: int, *args: int) -> tuple[list, np.ndarray]:
    out = model.parent / "rows.f32"
    r = subprocess.run([str(exe), str(model), str(out), str(N_SEQ_MAX), *map(str, args)], input=script,
                       capture_output=True, text=True, check=True)
    rows = np.fromfile(out, dtype=np.float32).reshape(-1, n_vocab)
    return [ln for ln in r.stdout.splitlines() if ln.strip()], rows


def main() -> None:
    rollback = sys.argv[1] == "--rollback"
    if rollback:
        del sys.argv[1]
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
    if rollback:
        runs, arrays = [], {}
        for name, n_rs_seq, n_ubatch, script in ROLLBACK:
            answers, rows = _run(exe, model, script, mk.N_VOCAB, n_rs_seq, n_ubatch)
            runs.append({"name": name, "n_rs_seq": n_rs_seq, "n_ubatch": n_ubatch, "script": script.splitlines(),
                         "answers": answers})
            arrays[name] = rows
        ref = {"arch": arch, "n_vocab": mk.N_VOCAB, "n_seq_max": N_SEQ_MAX, "runs": runs,
               "generator": "tests/data/tiny/make_seq_ops_reference.py --rollback"}
        (HERE / f"rollback-{arch}.json").write_text(json.dumps(ref, indent=1) + "\n")
        np.savez_compressed(HERE / f"rollback-{arch}.npz", **arrays)
        print(f"rollback-{arch}: " + ", ".join(f"{k} {v.shape[0]} rows" for k, v in arrays.items()))
        return
    script = SCRIPT
    if arch in NO_SHIFT:  # llama.cpp aborts when it would have to K-shift (M-RoPE)
        script = "".join(ln + "\n" for ln in SCRIPT.splitlines() if not ln.startswith(("add", "div")))
    n_vocab = mk.N_VOCAB
    answers, rows = _run(exe, model, script, n_vocab)
    ref = {"arch": arch, "n_vocab": n_vocab, "n_seq_max": N_SEQ_MAX, "script": script.splitlines(),
           "answers": answers, "generator": "tests/data/tiny/make_seq_ops_reference.py"}
    (HERE / f"seq-ops-{arch}.json").write_text(json.dumps(ref, indent=1) + "\n")
    np.savez_compressed(HERE / f"seq-ops-{arch}.npz", rows=rows)
    print(f"seq-ops-{arch}: {len(answers)} answers, {rows.shape[0]} rows")


if __name__ == "__main__":
    main()
