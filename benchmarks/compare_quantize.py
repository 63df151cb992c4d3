#!/usr/bin/env python3
"""Quantization throughput: llama-quantize and `pyllama quantize` alternately on the same
F32 input with the same thread count; prints the median wall time of each per type, the
ratio llama.cpp / pyllama (> 1: pyllama is faster), the same for CPU time (user + sys of
the process; steadier than wall time on a shared machine), and whether the outputs are
identical. pyllama's times include starting Python and the CLI (about 0.4 s of CPU, mostly
importing typer and pydantic); the last ratio, "excl. start", is llama.cpp's CPU time over
pyllama's less that start-up cost, measured each round as the CPU time of `pyllama quantize`
on a one-layer 64-wide model.

Types that need an importance matrix (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ2_M,
IQ3_XXS, IQ3_XS, IQ3_S, IQ3_M, Q2_K_S) get one: --imatrix, or else a random positive one
written for the input (llama-imatrix's GGUF format: NAME.in_sum2 and NAME.counts per
matmul weight), passed to both tools.

The input is a random-weight llama written once (default n_embd 1024, n_ff 2816, 8 layers,
8192-token vocabulary: ~105 M parameters, 420 MB), or --model. llama-quantize comes from
--bin (default: ~/.cache/pyllama/llama.cpp/build-avx2/bin; build it with
``cmake --build ~/.cache/pyllama/llama.cpp/build-avx2 --target llama-quantize``).

    python benchmarks/compare_quantize.py [-t 2] [--types Q8_0,Q4_0,Q4_K_M,Q6_K,IQ4_XS,Q2_K] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_model(path: Path, n_embd: int, n_ff: int, n_layer: int, n_vocab: int) -> Path:
    import gguf
    import numpy as np

    rng = np.random.default_rng(1)
    n_head, n_head_kv = max(1, n_embd // 64), max(1, n_embd // 256)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for k, v in (("context_length", 2048), ("embedding_length", n_embd), ("block_count", n_layer),
                 ("feed_forward_length", n_ff), ("attention.head_count", n_head),
                 ("attention.head_count_kv", n_head_kv), ("vocab_size", n_vocab)):
        w.add_uint32(f"llama.{k}", v)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)

    def t(name, ne):
        w.add_tensor(name, rng.standard_normal((ne[1], ne[0]), dtype=np.float32) * np.float32(ne[0] ** -0.5)
                     if len(ne) == 2 else np.ones(ne[0], dtype=np.float32))

    t("token_embd.weight", [n_embd, n_vocab])
    for i in range(n_layer):
        b = f"blk.{i}."
        t(b + "attn_norm.weight", [n_embd])
        t(b + "attn_q.weight", [n_embd, n_embd])
        t(b + "attn_k.weight", [n_embd, 64 * n_head_kv])
        t(b + "attn_v.weight", [n_embd, 64 * n_head_kv])
        t(b + "attn_output.weight", [n_embd, n_embd])
        t(b + "ffn_norm.weight", [n_embd])
        t(b + "ffn_gate.weight", [n_embd, n_ff])
        t(b + "ffn_up.weight", [n_embd, n_ff])
        t(b + "ffn_down.weight", [n_ff, n_embd])
    t("output_norm.weight", [n_embd])
    t("output.weight", [n_embd, n_vocab])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


NEEDS_IMATRIX = {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "IQ3_S",
                 "IQ3_M", "Q2_K_S"}


def write_imatrix(path: Path, model: Path) -> Path:
    """A random importance matrix for every 2-D weight of `model` (what llama-imatrix would
    write after 10 chunks of 512 tokens: sums of squared activations and their counts)."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(2)
    r = gguf.GGUFReader(str(model))
    w = gguf.GGUFWriter(str(path), arch="")
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", ["random"])
    w.add_uint32("imatrix.chunk_count", 10)
    w.add_uint32("imatrix.chunk_size", 512)
    for t in r.tensors:
        if len(t.shape) >= 2 and t.name != "token_embd.weight":
            n = int(t.shape[0])
            w.add_tensor(t.name + ".in_sum2", (rng.random(n, dtype=np.float32) + np.float32(0.05)) * np.float32(5120))
            w.add_tensor(t.name + ".counts", np.array([5120], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child: user + sys; on a busy machine the CPU time
    is the steadier measure)."""
    import resource

    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--types", default="Q8_0,Q4_0,Q4_K_M,Q6_K,IQ4_XS,Q2_K")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", type=Path, default=None, help="F32/F16 GGUF input (default: a random llama)")
    ap.add_argument("--imatrix", type=Path, default=None,
                    help="importance matrix for the types that need one (default: a random one)")
    ap.add_argument("--bin", type=Path, default=Path.home() / ".cache/pyllama/llama.cpp/build-avx2/bin")
    ap.add_argument("--size", default="1024,2816,8,8192", help="n_embd,n_ff,n_layer,n_vocab of the random model")
    a = ap.parse_args()
    lq = a.bin / "llama-quantize"
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        src = a.model or write_model(tmp / "in.gguf", *map(int, a.size.split(",")))
        print(f"input {src} ({src.stat().st_size / 2**20:.0f} MiB), {a.threads} threads, {a.rounds} rounds")
        tiny = write_model(tmp / "tiny.gguf", 64, 128, 1, 256)
        print(f"{'type':9s} {'llama.cpp s':>11s} {'pyllama s':>10s} {'ratio':>6s} {'llama cpu':>10s} "
              f"{'pyllama cpu':>11s} {'ratio':>6s} {'start cpu':>9s} {'excl. start':>11s}  identical")
        imatrix = a.imatrix
        for ty in a.types.split(","):
            extra: list[str] = []
            if ty in NEEDS_IMATRIX:
                imatrix = imatrix or write_imatrix(tmp / "imatrix.gguf", src)
                extra = ["--imatrix", str(imatrix)]
            tl, tp, ts = [], [], []
            for _ in range(a.rounds):
                ts.append(timed([sys.executable, "-m", "pyllama", "quantize", str(tiny), str(tmp / "t.gguf"), "Q8_0",
                                 str(a.threads)]))
                tl.append(timed([str(lq), *extra, str(src), str(tmp / "l.gguf"), ty, str(a.threads)]))
                tp.append(timed([sys.executable, "-m", "pyllama", "quantize", *extra, str(src), str(tmp / "p.gguf"), ty,
                                 str(a.threads)]))
            same = hashlib.sha256((tmp / "l.gguf").read_bytes()).digest() == hashlib.sha256((tmp / "p.gguf").read_bytes()).digest()
            ml, mp = statistics.median(x[0] for x in tl), statistics.median(x[0] for x in tp)
            cl, cp = statistics.median(x[1] for x in tl), statistics.median(x[1] for x in tp)
            cs = statistics.median(x[1] for x in ts)
            excl = f"{cl / (cp - cs):11.2f}" if cp > cs else f"{'-':>11s}"
            print(f"{ty:9s} {ml:11.2f} {mp:10.2f} {ml / mp:6.2f} {cl:10.2f} {cp:11.2f} {cl / cp:6.2f} {cs:9.2f} {excl}  {same}",
                  flush=True)


if __name__ == "__main__":
    main()
