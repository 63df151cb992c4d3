"""`pyllama bench`: llama-bench's tests (pp N, tg N, pp+tg) and its table, on pyllama.

Same method as llama.cpp's tools/llama-bench: a warmup run, then `-r` repetitions, each
starting from an empty KV cache; pp N decodes N random tokens in batches of n_batch (the
first one BOS when the model adds BOS), tg N decodes N single random tokens one by one.
Tokens per second per repetition; the table shows mean +- sample stddev.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from . import app
from .generate import freeze_heap


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _strs(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _ggml_type(api, name: str) -> int:
    try:
        return getattr(api, f"GGML_TYPE_{name.upper()}")
    except AttributeError:
        raise typer.BadParameter(f"unknown cache type {name!r} (f32, f16, bf16, q8_0, q4_0, ...)") from None


def _run_prompt(api, ctx, vocab, n_prompt: int, n_batch: int, rng: random.Random) -> None:
    n_vocab = api.llama_vocab_n_tokens(vocab)
    add_bos = api.llama_vocab_get_add_bos(vocab)
    done = 0
    while done < n_prompt:
        n = min(n_prompt - done, n_batch)
        toks = np.array([rng.randrange(n_vocab) for _ in range(n)], dtype=np.int32)
        if done == 0 and add_bos:
            toks[0] = api.llama_vocab_bos(vocab)
        if api.llama_decode(ctx, api.llama_batch_get_one(toks, n)) != 0:
            raise RuntimeError("llama_decode failed on a prompt batch")
        done += n


def _run_gen(api, ctx, vocab, n_gen: int, rng: random.Random) -> None:
    n_vocab = api.llama_vocab_n_tokens(vocab)
    tok = api.llama_vocab_bos(vocab) if api.llama_vocab_get_add_bos(vocab) else rng.randrange(n_vocab)
    buf = np.zeros(1, dtype=np.int32)
    for _ in range(n_gen):
        buf[0] = tok
        if api.llama_decode(ctx, api.llama_batch_get_one(buf, 1)) != 0:
            raise RuntimeError("llama_decode failed on a generation step")
        tok = rng.randrange(n_vocab)


@app.command()
def bench(
    model: list[Path] = typer.Option(..., "-m", "--model", help="GGUF file (repeat for several)"),
    n_prompt: str = typer.Option("512", "-p", "--n-prompt", help="prompt sizes, comma-separated"),
    n_gen: str = typer.Option("128", "-n", "--n-gen", help="generation lengths, comma-separated"),
    pg: Optional[str] = typer.Option(None, "-pg", help="pp,tg pairs: 'pp,tg' (one pair)"),
    threads: str = typer.Option("2", "-t", "--threads", help="thread counts, comma-separated"),
    reps: int = typer.Option(5, "-r", "--repetitions", help="repetitions per test"),
    n_batch: str = typer.Option("2048", "-b", "--batch-size", help="n_batch values"),
    n_ubatch: str = typer.Option("512", "-ub", "--ubatch-size", help="n_ubatch values"),
    cache_type_k: str = typer.Option("f16", "-ctk", "--cache-type-k", help="K cache types"),
    cache_type_v: str = typer.Option("f16", "-ctv", "--cache-type-v", help="V cache types"),
    flash_attn: str = typer.Option("1", "-fa", "--flash-attn", help="accepted for llama-bench compatibility"),
    output: str = typer.Option("md", "-o", "--output", help="md, json or csv"),
    seed: int = typer.Option(0, "--seed", help="random tokens seed"),
    progress: bool = typer.Option(False, "--progress", help="print progress on stderr"),
) -> None:
    """Benchmark prompt processing (pp) and generation (tg) speed, like llama-bench."""
    from .. import llama_api as api

    tests: list[tuple[int, int]] = [(p, 0) for p in _ints(n_prompt) if p > 0]
    tests += [(0, g) for g in _ints(n_gen) if g > 0]
    if pg:
        pp, tg = _ints(pg)
        tests.append((pp, tg))
    api.llama_backend_init()
    rows = []
    for mpath in model:
        mparams = api.llama_model_default_params()
        lm = api.llama_model_load_from_file(str(mpath).encode(), mparams)
        if lm is None:
            raise typer.Exit(f"failed to load model {mpath}")
        vocab = api.llama_model_get_vocab(lm)
        desc = api.llama_model_desc(lm)
        size = api.llama_model_size(lm)
        n_params = api.llama_model_n_params(lm)
        for nt in _ints(threads):
            for nb in _ints(n_batch):
                for nub in _ints(n_ubatch):
                    for ctk in _strs(cache_type_k):
                        for ctv in _strs(cache_type_v):
                            for pp, tg in tests:
                                cp = api.llama_context_default_params()
                                cp.n_ctx = pp + tg
                                cp.n_batch = nb
                                cp.n_ubatch = nub
                                cp.n_threads = nt
                                cp.n_threads_batch = nt
                                cp.type_k = _ggml_type(api, ctk)
                                cp.type_v = _ggml_type(api, ctv)
                                ctx = api.llama_init_from_model(lm, cp)
                                if ctx is None:
                                    raise typer.Exit(f"failed to create a context for {mpath}")
                                rng = random.Random(seed)
                                name = f"pp{pp}" if tg == 0 else (f"tg{tg}" if pp == 0 else f"pp{pp}+tg{tg}")
                                if progress:
                                    print(f"pyllama bench: {mpath.name} {name}: warmup", file=sys.stderr)
                                mem = api.llama_get_memory(ctx)
                                api.llama_memory_clear(mem, False)
                                if pp:
                                    _run_prompt(api, ctx, vocab, pp, nb, rng)
                                if tg:
                                    _run_gen(api, ctx, vocab, 1, rng)
                                freeze_heap()  # as `pyllama generate` does: no GC walks of the vocabulary
                                samples = []
                                for r in range(reps):
                                    api.llama_memory_clear(mem, False)
                                    if progress:
                                        print(f"pyllama bench: {mpath.name} {name}: run {r + 1}/{reps}", file=sys.stderr)
                                    t0 = time.perf_counter_ns()
                                    if pp:
                                        _run_prompt(api, ctx, vocab, pp, nb, rng)
                                    if tg:
                                        _run_gen(api, ctx, vocab, tg, rng)
                                    dt = (time.perf_counter_ns() - t0) / 1e9
                                    samples.append((pp + tg) / dt)
                                api.llama_free(ctx)
                                rows.append(
                                    {
                                        "model_filename": str(mpath),
                                        "model_type": desc,
                                        "model_size": size,
                                        "model_n_params": n_params,
                                        "backend": "CPU",
                                        "n_threads": nt,
                                        "n_batch": nb,
                                        "n_ubatch": nub,
                                        "type_k": ctk,
                                        "type_v": ctv,
                                        "n_prompt": pp,
                                        "n_gen": tg,
                                        "test": name,
                                        "avg_ts": statistics.fmean(samples),
                                        "stddev_ts": statistics.stdev(samples) if len(samples) > 1 else 0.0,
                                        "samples_ts": samples,
                                    }
                                )
                                if output == "md" and len(rows) == 1:
                                    _md_header()
                                if output == "md":
                                    _md_row(rows[-1])
        api.llama_model_free(lm)
    if output == "json":
        print(json.dumps(rows, indent=2))
    elif output == "csv":
        keys = [k for k in rows[0] if k != "samples_ts"] if rows else []
        print(",".join(keys))
        for r in rows:
            print(",".join(str(r[k]) for k in keys))


def _md_header() -> None:
    print("| model                          |       size |     params | backend    | threads |            test |                  t/s |")
    print("| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: |")


def _md_row(r: dict) -> None:
    size = f"{r['model_size'] / 1024 / 1024:.2f} MiB"
    n = r["model_n_params"]
    params = f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"
    ts = f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}"
    print(f"| {r['model_type']:<30} | {size:>10} | {params:>10} | {r['backend']:<10} | {r['n_threads']:>7} | {r['test']:>15} | {ts:>20} |", flush=True)
