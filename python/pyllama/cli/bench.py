"""`pyllama bench`: llama-bench's tests (pp N, tg N, pp+tg) and its table, on pyllama.

Same method as llama.cpp's tools/llama-bench: a warmup run, then `-r` repetitions, each
starting from an empty KV cache; pp N decodes N random tokens in batches of n_batch (the
first one BOS when the model adds BOS), tg N decodes N single random tokens one by one.
Tokens per second per repetition; the table shows mean +- sample stddev.
"""

from __future__ import annotations

import json
import random
import re
import statistics
import sys
import time
from pathlib import Path

import typer

from . import app
from ._checks import integer
from .generate import freeze_heap

_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+)(?:([+*])([0-9]+))?)?")
OUTPUTS = ("md", "json", "csv")


def parse_int_range(s: str) -> list[int]:
    """llama-bench's parse_int_range: a comma list of ``first[-last[(+|*)step]]`` items,
    non-negative; ``1-4`` is 1,2,3,4, ``8-32+8`` 8,16,24,32, ``1-16*2`` 1,2,4,8,16.
    ValueError (with the offending item) on anything else."""
    out: list[int] = []
    for item in s.split(","):
        item = item.strip()
        if not item:
            continue  # llama-bench accepts a trailing comma
        m = _RANGE.fullmatch(item)
        if m is None:
            raise ValueError(f"{item!r} is not a non-negative integer or a range first-last[+step|*step]")
        first = int(m[1])
        last = int(m[2]) if m[2] is not None else first
        op, step = m[3] or "+", int(m[4]) if m[4] is not None else 1
        if max(first, last) > 2**31 - 1:
            raise ValueError(f"{item!r}: {max(first, last)} is too large")
        if first > last:
            raise ValueError(f"{item!r}: empty range (first > last)")
        i = first
        while i <= last:
            out.append(i)
            if len(out) > 10_000:
                raise ValueError(f"{item!r}: more than 10000 values")
            nxt = i + step if op == "+" else i * step
            if nxt <= i:  # as llama-bench: a step that does not advance is an error
                raise ValueError(f"{item!r}: the range does not advance ({op}{step} from {i})")
            i = nxt
    return out


def _int_list(lo: int, what: str):
    """Option callback: the values of llama-bench list flags (each -p given adds its list)."""

    def check(ctx, param, value):
        vals: list[int] = []
        for v in value if isinstance(value, (list, tuple)) else [value]:
            try:
                vals += parse_int_range(v)
            except ValueError as e:
                raise typer.BadParameter(str(e)) from None
        bad = [v for v in vals if v < lo]
        if bad:
            raise typer.BadParameter(f"{bad[0]}: {what} must be >= {lo}")
        if not vals:
            raise typer.BadParameter(f"{value!r} gives no value")
        return vals

    return check


def _pairs(ctx, param, value):
    """-pg pp,tg (repeatable): pairs of non-negative ints; 0,0 is skipped, as llama-bench."""
    out = []
    for v in value or []:
        parts = [x.strip() for x in v.split(",")]
        if len(parts) != 2 or not all(re.fullmatch(r"[0-9]+", p) for p in parts):
            raise typer.BadParameter(f"{v!r}: expected 'pp,tg', two non-negative integers (e.g. 512,128)")
        pp, tg = int(parts[0]), int(parts[1])
        if max(pp, tg) > 2**31 - 1:
            raise typer.BadParameter(f"{v!r}: {max(pp, tg)} is too large")
        out.append((pp, tg))
    return out


def _names(choices_of, what: str):
    def check(ctx, param, value):
        choices = tuple(choices_of())
        vals = [x.strip().lower() for x in value.split(",") if x.strip()]
        for v in vals:
            if v not in choices:
                raise typer.BadParameter(f"{v!r} is not a {what} ({', '.join(choices)})")
        if not vals:
            raise typer.BadParameter(f"{value!r} gives no value")
        return vals

    return check


def _kv_types():
    from ..context import GGML_TYPE_NAMES

    return GGML_TYPE_NAMES.values()


def _fa_values():
    return ("on", "off", "auto", "1", "0", "-1", "true", "false", "enabled", "disabled")


def _output(ctx, param, value):
    v = value.lower()
    if v not in OUTPUTS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(OUTPUTS)}")
    return v


def _ggml_type(api, name: str) -> int:
    return getattr(api, f"GGML_TYPE_{name.upper()}")


def _run_prompt(api, ctx, vocab, n_prompt: int, n_batch: int, rng: random.Random) -> None:
    import numpy as np  # here, not at the top: `pyllama --help` does not pay for numpy

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
    import numpy as np

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
    n_prompt: list[str] = typer.Option(["512"], "-p", "--n-prompt", metavar="LIST", callback=_int_list(0, "a prompt size"),
                                       help="prompt sizes: comma list or range first-last[+step|*step] (0 = none)"),
    n_gen: list[str] = typer.Option(["128"], "-n", "--n-gen", metavar="LIST", callback=_int_list(0, "a generation length"),
                                    help="generation lengths, as -p (0 = none)"),
    pg: list[str] = typer.Option([], "-pg", metavar="PP,TG", callback=_pairs, help="a pp+tg test: 'pp,tg' (repeat for several)"),
    threads: list[str] = typer.Option(["2"], "-t", "--threads", metavar="LIST", callback=_int_list(1, "a thread count"),
                                      help="thread counts, as -p"),
    reps: int = typer.Option(5, "-r", "--repetitions", callback=integer(1), help="repetitions per test"),
    n_batch: list[str] = typer.Option(["2048"], "-b", "--batch-size", metavar="LIST", callback=_int_list(1, "n_batch"),
                                      help="n_batch values, as -p"),
    n_ubatch: list[str] = typer.Option(["512"], "-ub", "--ubatch-size", metavar="LIST", callback=_int_list(0, "n_ubatch"),
                                       help="n_ubatch values, as -p (0 = -b)"),
    cache_type_k: str = typer.Option("f16", "-ctk", "--cache-type-k", callback=_names(_kv_types, "KV cache type"),
                                     help="K cache types, comma-separated"),
    cache_type_v: str = typer.Option("f16", "-ctv", "--cache-type-v", callback=_names(_kv_types, "KV cache type"),
                                     help="V cache types, comma-separated"),
    flash_attn: str = typer.Option("1", "-fa", "--flash-attn", callback=_names(_fa_values, "flash-attention setting"),
                                   help="accepted for llama-bench compatibility (on, off, auto, 1, 0)"),
    output: str = typer.Option("md", "-o", "--output", callback=_output, help="md, json or csv"),
    seed: int = typer.Option(0, "--seed", help="random tokens seed"),
    progress: bool = typer.Option(False, "--progress", help="print progress on stderr"),
) -> None:
    """Benchmark prompt processing (pp) and generation (tg) speed, like llama-bench."""
    from .. import llama_api as api

    tests: list[tuple[int, int]] = [(p, 0) for p in n_prompt if p > 0]
    tests += [(0, g) for g in n_gen if g > 0]
    tests += [(pp, tg) for pp, tg in pg if pp or tg]
    api.llama_backend_init()
    from ..errors import PyllamaError

    rows = []
    try:
        for mpath in model:
            mparams = api.llama_model_default_params()
            lm = api.llama_model_load_from_file(str(mpath).encode(), mparams)
            if lm is None:
                typer.echo(f"error: failed to load model {mpath}", err=True)
                raise typer.Exit(1)
            vocab = api.llama_model_get_vocab(lm)
            desc = api.llama_model_desc(lm)
            size = api.llama_model_size(lm)
            n_params = api.llama_model_n_params(lm)
            for nt in threads:
                for nb in n_batch:
                    for nub in n_ubatch:
                        for ctk in cache_type_k:
                            for ctv in cache_type_v:
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
                                        typer.echo(f"error: failed to create a context for {mpath} "
                                                   f"(-t {nt} -b {nb} -ub {nub} -ctk {ctk} -ctv {ctv}, n_ctx {pp + tg})",
                                                   err=True)
                                        raise typer.Exit(1)
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
    except (BrokenPipeError, typer.Exit):  # a closed stdout (typer exits quietly) or our own exit
        raise
    except (PyllamaError, RuntimeError, ValueError, OSError, MemoryError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
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
