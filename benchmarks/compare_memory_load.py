"""Peak RSS and model load time, pyllama beside llama.cpp, same models, same n_ctx, same work.

Each measurement is a fresh process that loads the model (mmap), creates a context
(n_ctx, n_batch 2048, n_ubatch 512), decodes ``n_ctx - n_gen`` random tokens in n_batch
pieces (so the KV cache and the attention scratch are used to the end), then ``n_gen``
single tokens (greedy over the logits row), and reports: model load time, context
creation time, RSS after each step and the peak (VmHWM from /proc/self/status).

- llama.cpp: benchmarks/memory_load_llamacpp.cpp, compiled here against libllama
  (default: /work/cache/llama-avx2/bin, llama.h from the llama-cpp-python 0.3.36 sdist).
- pyllama: this file re-run as ``--worker``; its times also include ``import pyllama``.

Runs alternate (llama.cpp, pyllama) per configuration, ``--reps`` times; the table shows
medians. Wrap in ``flock /tmp/bench.lock`` on a shared machine.

    python benchmarks/compare_memory_load.py [-m MODEL ...] [-c 2048,8192] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_LIB = Path("/work/cache/llama-avx2/bin")
DEFAULT_INCLUDE = Path("/work/cache/llama_cpp_python-0.3.36/vendor/llama.cpp")


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return -1


def worker(model: str, n_ctx: int, n_fill: int, n_gen: int, threads: int) -> None:
    """pyllama's side, in this process: the same steps as memory_load_llamacpp.cpp."""
    t_import = time.perf_counter()
    rss_start = _status_kb("VmRSS")
    import numpy as np

    from pyllama.context import Context
    from pyllama.model import Model

    import_ms = 1e3 * (time.perf_counter() - t_import)
    t0 = time.perf_counter()
    m = Model.load(model, load_mode="mmap")
    m.vocab  # built lazily; llama.cpp's load includes its vocabulary
    load_ms = 1e3 * (time.perf_counter() - t0)
    rss_load = _status_kb("VmRSS")
    t1 = time.perf_counter()
    ctx = Context(m, n_ctx=n_ctx, n_batch=2048, n_ubatch=512, n_threads=threads, n_threads_batch=threads)
    ctx_ms = 1e3 * (time.perf_counter() - t1)
    rss_ctx = _status_kb("VmRSS")
    n_vocab = ctx.n_vocab
    rng = np.random.default_rng(1)
    t2 = time.perf_counter()
    done = 0
    bos = m.vocab.bos if getattr(m.vocab, "add_bos", False) else None
    while done < n_fill:
        n = min(n_fill - done, 2048)
        toks = rng.integers(0, n_vocab, size=n).astype(np.int32)
        if done == 0 and bos is not None and bos >= 0:
            toks[0] = bos
        ctx.decode(toks)
        done += n
    fill_ms = 1e3 * (time.perf_counter() - t2)
    rss_fill = _status_kb("VmRSS")
    tok = np.array([int(rng.integers(n_vocab))], np.int32)
    t3 = time.perf_counter()
    for _ in range(n_gen):
        ctx.decode(tok)
        tok[0] = int(np.argmax(ctx.logits_ith(-1)))
    gen_ms = 1e3 * (time.perf_counter() - t3)
    print(json.dumps({
        "impl": "pyllama", "import_ms": round(import_ms, 2), "load_ms": round(load_ms, 2),
        "ctx_ms": round(ctx_ms, 2), "fill_ms": round(fill_ms, 1), "gen_ms": round(gen_ms, 1),
        "rss_start_kb": rss_start, "rss_load_kb": rss_load, "rss_ctx_kb": rss_ctx,
        "rss_fill_kb": rss_fill, "rss_end_kb": _status_kb("VmRSS"), "peak_kb": _status_kb("VmHWM"),
    }))


def build_llamacpp(lib: Path, include: Path, out: Path) -> Path:
    src = HERE / "memory_load_llamacpp.cpp"
    exe = out / "memory_load_llamacpp"
    if exe.exists() and exe.stat().st_mtime > src.stat().st_mtime:
        return exe
    out.mkdir(parents=True, exist_ok=True)
    cmd = ["g++", "-O2", "-std=c++17", str(src), f"-I{include / 'include'}", f"-I{include / 'ggml' / 'include'}",
           f"-L{lib}", "-lllama", f"-Wl,-rpath,{lib}", "-o", str(exe)]
    subprocess.run(cmd, check=True)
    return exe


def _run(cmd: list[str], env=None) -> dict:
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", action="append", help="GGUF file (default: the two real models)")
    ap.add_argument("-c", "--ctx-size", default="2048,8192", help="n_ctx values, comma-separated")
    ap.add_argument("-n", "--n-gen", type=int, default=32, help="single-token decodes after the fill")
    ap.add_argument("--fill", type=float, default=1.0, help="fraction of n_ctx - n_gen to prefill")
    ap.add_argument("--prompt-tokens", type=int, default=None,
                    help="prefill exactly this many tokens instead (e.g. 32: a generate-like run)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lib", type=Path, default=DEFAULT_LIB, help="directory with libllama.so")
    ap.add_argument("--include", type=Path, default=DEFAULT_INCLUDE, help="llama.cpp source tree (include/llama.h)")
    ap.add_argument("--build-dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "pyllama-memload")
    ap.add_argument("--worker", nargs=5, metavar=("MODEL", "N_CTX", "N_FILL", "N_GEN", "THREADS"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        m, c, f, g, t = args.worker
        worker(m, int(c), int(f), int(g), int(t))
        return

    models = args.model
    if not models:
        from pyllama import _models

        models = [str(_models.smollm2_path()), str(_models.gemma3_path())]
    exe = build_llamacpp(args.lib, args.include, args.build_dir)
    env = dict(os.environ, LD_LIBRARY_PATH=f"{args.lib}:{os.environ.get('LD_LIBRARY_PATH', '')}")

    print("| model | n_ctx | prefill | impl | load ms | ctx ms | RSS load MiB | RSS ctx MiB | RSS fill MiB | peak RSS MiB | peak ratio | load ratio |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model in models:
        for n_ctx in [int(x) for x in args.ctx_size.split(",")]:
            n_fill = int((n_ctx - args.n_gen) * args.fill) if args.prompt_tokens is None else args.prompt_tokens
            res: dict[str, list[dict]] = {"llama.cpp": [], "pyllama": []}
            for _ in range(args.reps):
                res["llama.cpp"].append(_run([str(exe), model, str(n_ctx), str(n_fill), str(args.n_gen),
                                              str(args.threads)], env=env))
                res["pyllama"].append(_run([sys.executable, __file__, "--worker", model, str(n_ctx), str(n_fill),
                                            str(args.n_gen), str(args.threads)]))
            med = {k: {f: statistics.median(r[f] for r in v) for f in v[0] if f != "impl"} for k, v in res.items()}
            ref = med["llama.cpp"]
            for impl in ("llama.cpp", "pyllama"):
                d = med[impl]
                load = d["load_ms"]
                extra = f" (+{d['import_ms']:.0f} import)" if "import_ms" in d else ""
                print(f"| {Path(model).name} | {n_ctx} | {n_fill} | {impl} | {load:.1f}{extra} | {d['ctx_ms']:.1f} | "
                      f"{d['rss_load_kb'] / 1024:.1f} | {d['rss_ctx_kb'] / 1024:.1f} | {d['rss_fill_kb'] / 1024:.1f} | {d['peak_kb'] / 1024:.1f} | "
                      f"{d['peak_kb'] / ref['peak_kb']:.3f} | {load / ref['load_ms']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
