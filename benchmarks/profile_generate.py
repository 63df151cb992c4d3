"""Where a generated token's time goes, end to end, in pyllama's generation loop.

Runs the loop ``pyllama generate`` runs (Session.generate + TextStream + a write to a
sink) for N tokens with the default sampler chain, and splits each token's wall time into:

- forward: the Rust forward pass (``_core.Context.decode``, timed around the call),
- decode wrapper: the rest of ``Context.decode`` (batch allocation, output map, Python),
- sampling: ``SamplerChain.sample`` over the n_vocab logits row,
- detokenize + print: ``TextStream.feed`` and the write,
- loop: whatever is left (Session.generate's bookkeeping, generator overhead).

It also times the same number of bare ``llama_decode`` single-token steps (what
``pyllama bench``'s tg runs) so the two rates can be compared in one process.

    flock /tmp/bench.lock python benchmarks/profile_generate.py -m MODEL [-n 128] [-t 2] [-r 3]
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

import numpy as np


def _bench_tg(sess, n: int) -> float:
    """t/s of n single-token decodes of random tokens, as pyllama bench's tg does."""
    from pyllama import llama_api as api

    ctx = sess.ctx
    ctx.memory_clear(True)
    rng = np.random.default_rng(0)
    buf = np.zeros(1, dtype=np.int32)
    buf[0] = sess.vocab.bos if sess.vocab.bos is not None and sess.vocab.bos >= 0 else 1
    t0 = time.perf_counter()
    for _ in range(n):
        if api.llama_decode(ctx, api.llama_batch_get_one(buf, 1)) != 0:
            raise RuntimeError("llama_decode failed")
        buf[0] = int(rng.integers(len(sess.vocab)))
    dt = time.perf_counter() - t0
    ctx.memory_clear(True)
    sess.tokens = []
    return n / dt


def _profile_generate(sess, chain, prompt_toks, n: int) -> dict:
    from pyllama.generation import TextStream

    ctx = sess.ctx
    core = ctx._core
    t_fwd = [0.0]
    c_fwd = [0.0]  # thread CPU time of the calling thread: robust to other processes' load
    real_decode = core.decode
    real_decode_one = getattr(core, "decode_one", None)

    class _Timed:
        """Proxy for the Rust context that times decode and forwards everything else."""

        def __getattr__(self, name):
            return getattr(core, name)

        def decode(self, *a):
            t0, c0 = time.perf_counter(), time.thread_time()
            r = real_decode(*a)
            t_fwd[0] += time.perf_counter() - t0
            c_fwd[0] += time.thread_time() - c0
            return r

        def decode_one(self, *a):  # the generation step's call (pyllama >= this script)
            t0, c0 = time.perf_counter(), time.thread_time()
            r = real_decode_one(*a)
            t_fwd[0] += time.perf_counter() - t0
            c_fwd[0] += time.thread_time() - c0
            return r

    t_ctx_decode = [0.0]
    c_ctx_decode = [0.0]
    real_ctx_decode = ctx.decode

    def timed_ctx_decode(*a, **k):
        t0, c0 = time.perf_counter(), time.thread_time()
        r = real_ctx_decode(*a, **k)
        t_ctx_decode[0] += time.perf_counter() - t0
        c_ctx_decode[0] += time.thread_time() - c0
        return r

    t_sample = [0.0]
    c_sample = [0.0]
    real_sample = chain.sample

    def timed_sample(logits):
        t0, c0 = time.perf_counter(), time.thread_time()
        r = real_sample(logits)
        t_sample[0] += time.perf_counter() - t0
        c_sample[0] += time.thread_time() - c0
        return r

    sess.reset()
    ctx._core = _Timed()
    ctx.decode = timed_ctx_decode
    chain.sample = timed_sample
    out = io.StringIO()
    stream = TextStream(sess.vocab, special=True)
    t_detok = 0.0
    c_detok = 0.0
    n_gen = 0
    try:
        gen = sess.generate(prompt_toks, chain, n, ignore_eos=True, decode_last=False)
        first = next(gen)  # the prompt is decoded here: start the clock after it
        t_fwd[0] = t_ctx_decode[0] = t_sample[0] = 0.0
        c_fwd[0] = c_ctx_decode[0] = c_sample[0] = 0.0
        t0, c0 = time.perf_counter(), time.thread_time()
        tok = first
        while True:
            a, ac = time.perf_counter(), time.thread_time()
            piece = stream.feed(tok)
            if piece:
                out.write(piece)
                out.flush()
            t_detok += time.perf_counter() - a
            c_detok += time.thread_time() - ac
            n_gen += 1
            try:
                tok = next(gen)
            except StopIteration:
                break
        wall = time.perf_counter() - t0
        cpu = time.thread_time() - c0
    finally:
        ctx._core = core
        del ctx.decode
        del chain.sample
    # n_gen tokens were printed; n_gen - 1 decodes and samples happened inside the clock
    steps = n_gen - 1
    return {
        "steps": steps,
        "wall": wall,
        "forward": t_fwd[0],
        "decode_wrapper": t_ctx_decode[0] - t_fwd[0],
        "sampling": t_sample[0],
        "detok_print": t_detok,
        "loop": wall - t_ctx_decode[0] - t_sample[0] - t_detok,
        "cpu_decode_wrapper": c_ctx_decode[0] - c_fwd[0],
        "cpu_sampling": c_sample[0],
        "cpu_detok_print": c_detok,
        "cpu_loop": cpu - c_ctx_decode[0] - c_sample[0] - c_detok,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", action="append", required=True)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("-p", "--prompt", default="Once upon a time")
    args = ap.parse_args()

    from pyllama.generation import Session, load_model
    from pyllama.sampling import SamplerParams, build_chain

    for path in args.model:
        m = load_model(path)
        sess = Session(m, n_ctx=args.ctx_size, n_threads=args.threads, n_threads_batch=args.threads,
                       no_perf=False)
        toks = sess.tokenize(args.prompt)
        rows = []
        tg = []
        for _ in range(args.reps):
            tg.append(_bench_tg(sess, args.n))
            chain = build_chain(SamplerParams(seed=42), n_vocab=sess.n_vocab, vocab=sess.vocab)
            rows.append(_profile_generate(sess, chain, toks, args.n + 1))
        print(f"{path.split('/')[-1]}  n_vocab={sess.n_vocab}  threads={args.threads}  "
              f"{args.n} tokens x {args.reps} reps (median)")
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        steps = med["steps"]
        gen_tps = steps / med["wall"]
        print(f"  bench-style tg (llama_decode loop): {statistics.median(tg):8.2f} t/s")
        print(f"  generate loop:                      {gen_tps:8.2f} t/s "
              f"({100 * (statistics.median(tg) / gen_tps - 1):+.1f}% time per token vs tg)")
        print(f"    {'':15s} {'wall':>9s}           {'':5s}   {'main-thread CPU':>15s}")
        for k in ("forward", "decode_wrapper", "sampling", "detok_print", "loop"):
            us = 1e6 * med[k] / steps
            cpu = f"{1e6 * med['cpu_' + k] / steps:9.1f} us/token" if "cpu_" + k in med else ""
            print(f"    {k:15s} {us:9.1f} us/token  {100 * med[k] / med['wall']:5.1f}%   {cpu}")
        py = sum(med["cpu_" + k] for k in ("sampling", "detok_print", "loop")) / steps
        print(f"  generate's own per-token CPU (sampling + detokenize/print + loop): {1e6 * py:.1f} us "
              f"= {100 * py * statistics.median(tg):.1f}% of a bench-tg token here")


if __name__ == "__main__":
    main()
