"""Regenerate tests/data/quantize/reference.json (and imatrix-text-llama.npz beside it) from
llama.cpp's own tools: the SHA-256 of what llama-quantize writes for each test model, type
and set of switches, and llama-imatrix's importance matrix for the text model.

    python tests/data/quantize/make_quantize_reference.py [--bin DIR]

DIR holds llama-quantize and llama-imatrix (default: $LLAMA_CPP_BIN or
~/.cache/pyllama/llama.cpp/build-avx2/bin; build them with
``cmake --build ~/.cache/pyllama/llama.cpp/build-avx2 --target llama-quantize llama-imatrix``).
The models come from models.py (written at test time by tests/gguf/test_quantize.py too).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import models  # noqa: E402

sys.path.insert(0, str(HERE.parent / "imatrix"))
import imatrix_npz  # noqa: E402

# Every llama-quantize type pyllama implements without an importance matrix.
TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L",
         "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4_MOE", "COPY",
         "IQ3_S", "IQ3_M"]
SMALL_TYPES = ["Q8_0", "Q4_0", "Q5_1", "Q2_K", "Q3_K_M", "Q4_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "TQ1_0", "MXFP4_MOE",
               "IQ3_S"]
# Types quantized with an importance matrix (the weighted searches).
IMATRIX_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q2_K_S", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M",
                 "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS",
                 "IQ3_S", "IQ3_M", "IQ1_S", "IQ1_M"]


def cases() -> list[dict]:
    """(model, switches, type, imatrix) of every reference file."""
    out = []
    for t in TYPES:
        out.append(dict(model="wide-llama", args=[], type=t))
        out.append(dict(model="tiny-llama", args=[], type=t))
    for m in ("tiny-qwen3moe", "tiny-phi2", "tiny-gemma3"):
        for t in SMALL_TYPES:
            out.append(dict(model=m, args=[], type=t))
    out += [
        dict(model="wide-llama", args=["--pure"], type="Q4_K_M"),
        dict(model="wide-llama", args=["--pure"], type="Q2_K"),
        dict(model="tiny-qwen3moe", args=["--pure"], type="Q4_K_M"),
        dict(model="wide-llama", args=["--leave-output-tensor"], type="Q4_K_M"),
        dict(model="wide-llama", args=["--output-tensor-type", "q8_0", "--token-embedding-type", "q4_k"], type="Q3_K_M"),
        dict(model="tiny-llama", args=["--token-embedding-type", "f16"], type="Q5_K_M"),
        dict(model="tiny-llama", args=["--keep-split"], type="Q8_0"),
        dict(model="wide-llama", args=["--token-embedding-type", "iq1_m", "--output-tensor-type", "iq2_s"], type="Q4_0"),
    ]
    # --tensor-type: regular expressions searched in tensor names, the first match wins, only
    # when the ftype's default type is quantized, not over --output/--token-embedding-type;
    # NVFP4 output is only reachable this way
    out += [
        dict(model="tiny-llama", args=["--tensor-type", "attn_q=q8_0", "--tensor-type", "ffn_down=q5_0"], type="Q4_K_M"),
        dict(model="tiny-llama", args=["--tensor-type", "attn=q4_0", "--tensor-type", "attn_q=q5_1"], type="Q8_0"),
        dict(model="tiny-llama", args=["--tensor-type", "ATTN_K=Q6_K"], type="F16"),
        dict(model="wide-llama", args=["--tensor-type", r"blk\.[01]\.ffn_(up|gate)=iq4_nl", "--tensor-type",
                                       r"^blk\.\d+\.attn_v\.weight$=q6_k", "--tensor-type", "output=q8_0"],
             type="Q4_K_M"),
        dict(model="wide-llama", args=["--tensor-type", "token_embd|output=q5_k", "--output-tensor-type", "q4_0"],
             type="Q3_K_S"),
        dict(model="wide-llama", args=["--tensor-type", "weight=nvfp4"], type="Q8_0"),
        dict(model="tiny-qwen3moe", args=["--tensor-type", "_exps=q4_k", "--tensor-type", "attn_.*=iq4_xs"],
             type="Q5_K_M"),
    ]
    # --override-kv: new keys appended, existing ones moved to the end; int written as u32 of
    # its absolute value, float as f32, C's atol/atof reading
    out += [
        dict(model="tiny-llama", args=["--override-kv", "general.name=str:renamed", "--override-kv", "test.i=int:-7",
                                       "--override-kv", "test.f=float:0.1", "--override-kv", "test.b=bool:true",
                                       "--override-kv", "llama.context_length=int:77x", "--override-kv",
                                       "test.e=float: 1e-3junk"], type="Q8_0"),
        # llama-quantize loads the input with the overrides: hyperparameters the mixes read count
        dict(model="tiny-qwen3moe", args=["--override-kv", "qwen3moe.expert_count=int:8"], type="Q4_K_M"),
        dict(model="wide-llama", args=["--override-kv", "llama.attention.head_count_kv=int:1"], type="IQ4_XS"),
        dict(model="wide-llama", args=["--override-kv", "llama.block_count=int:16"], type="Q4_K_M"),
    ]
    # --prune-layers: blocks dropped, the rest renumbered, block_count updated; the mixes still
    # count the original layers
    out += [
        dict(model="wide-llama", args=["--prune-layers", "1"], type="Q4_K_M"),
        dict(model="tiny-llama", args=["--prune-layers", "0"], type="Q3_K_M"),
        dict(model="tiny-qwen3moe", args=["--prune-layers", "1"], type="Q4_K_S"),
        dict(model="tiny-gemma3", args=["--prune-layers", "4,1, 3"], type="Q4_K_M"),
    ]
    for t in IMATRIX_TYPES:
        out.append(dict(model="text-llama", args=[], type=t, imatrix="text-llama"))
        out.append(dict(model="wide-llama", args=[], type=t, imatrix="wide-llama"))
    return out


def case_id(c: dict) -> str:
    parts = [c["model"], c["type"], *c["args"]]
    if c.get("imatrix"):
        parts.append("imatrix")
    return " ".join(parts)


def synthetic_imatrix(path: Path, model_path: Path) -> None:
    """An importance matrix for a model without a usable vocabulary: positive weights per
    input column of every blk.* matmul, from a fixed seed (written with pyllama's writer in
    llama-imatrix's format; llama-quantize and pyllama both read it)."""
    import gguf
    import numpy as np

    sys.path.insert(0, str(HERE.parents[2] / "python"))
    from pyllama.imatrix import save_imatrix

    rng = np.random.default_rng(99)
    r = gguf.GGUFReader(str(model_path))
    entries = {}
    for t in r.tensors:
        if t.name.startswith("blk.") and len(t.shape) >= 2 and not t.name.endswith("_norm.weight"):
            n_in = int(t.shape[0])
            sums = (rng.gamma(2.0, 1.0, size=(1, n_in)) * 100).astype(np.float32)
            sums[0, :7] = 0.0  # columns that saw no signal
            entries[t.name] = (sums, [100])
    save_imatrix(path, entries, datasets=["synthetic"], chunk_count=1, chunk_size=100)


def run_case(lq: Path, c: dict, paths: dict, tmp: Path) -> dict:
    """llama-quantize on one imatrix-free case -> its reference entry."""
    out = tmp / "out.gguf"
    subprocess.run([str(lq), *c["args"], str(paths[c["model"]]), str(out), c["type"], "2"], cwd=tmp, check=True,
                   capture_output=True)
    written = out if out.exists() else tmp / "out-00001-of-00001.gguf"
    data = written.read_bytes()
    written.unlink()
    return {**c, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "output": written.name}


def add_missing(lq: Path) -> None:
    ref = json.loads((HERE / "reference.json").read_text())
    todo = [c for c in cases() if case_id(c) not in ref["cases"]]
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        paths = {m: models.write_model(m, tmp / "models") for m in {c["model"] for c in todo}}
        for c in todo:
            assert not c.get("imatrix"), "imatrix cases need a full run"
            ref["cases"][case_id(c)] = run_case(lq, c, paths, tmp)
            print(case_id(c), ref["cases"][case_id(c)]["size"], flush=True)
    (HERE / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    default_bin = os.environ.get("LLAMA_CPP_BIN", str(Path.home() / ".cache/pyllama/llama.cpp/build-avx2/bin"))
    ap.add_argument("--bin", default=default_bin)
    ap.add_argument("--missing", action="store_true",
                    help="only add the imatrix-free cases reference.json lacks (keeps everything else)")
    a = ap.parse_args()
    lq, li = Path(a.bin) / "llama-quantize", Path(a.bin) / "llama-imatrix"
    if a.missing:
        add_missing(lq)
        return
    ref: dict = {"generator": "llama-quantize / llama-imatrix of llama.cpp 0c1e570 (build-avx2)", "cases": {}}
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        paths = {m: models.write_model(m, tmp / "models") for m in {c["model"] for c in cases()}}
        text = models.write_text(tmp)
        # llama-imatrix on the text model: 4 chunks of 128 tokens, 4 sequences per batch
        # (kept in git as .npz: the tests rebuild the GGUF and check it is this file's bytes)
        im_text = tmp / "imatrix-text-llama.gguf"
        subprocess.run([str(li), "-m", str(paths["text-llama"]), "-f", text.name, "-o", str(im_text), "-c", "128",
                        "-b", "512", "--chunks", "4", "-t", "2"], cwd=tmp, check=True, capture_output=True)
        imatrix_npz.to_npz(im_text, HERE / "imatrix-text-llama.npz")
        ref["imatrix"] = {"model": "text-llama", "ctx": 128, "batch": 512, "chunks": 4, "text": text.name,
                          "file": "imatrix-text-llama.npz"}
        im_files = {"text-llama": im_text, "wide-llama": tmp / "imatrix-wide-llama.gguf"}
        synthetic_imatrix(im_files["wide-llama"], paths["wide-llama"])
        for c in cases():
            out = tmp / "out.gguf"
            args = [str(lq), *c["args"]]
            if c.get("imatrix"):
                shutil.copy(im_files[c["imatrix"]], tmp / "imatrix.gguf")
                args += ["--imatrix", "imatrix.gguf"]
            args += [str(paths[c["model"]]), str(out), c["type"], "2"]
            subprocess.run(args, cwd=tmp, check=True, capture_output=True)
            written = out if out.exists() else tmp / "out-00001-of-00001.gguf"
            data = written.read_bytes()
            ref["cases"][case_id(c)] = {**c, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                                        "output": written.name}
            written.unlink()
            print(case_id(c), len(data), flush=True)
    (HERE / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")


if __name__ == "__main__":
    main()
