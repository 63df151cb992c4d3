"""`pyllama perplexity`: llama-perplexity's default method and output.

The text is tokenized once (BOS added when the model adds one) and cut into chunks of n_ctx
tokens. Each chunk is decoded from an empty KV cache, its first token replaced by BOS when
the model adds BOS; only the second half is scored: the logits at position p (p >= n_ctx/2)
predict token p+1, so each chunk contributes n_ctx - n_ctx/2 - 1 negative log-likelihoods.
After each chunk the running estimate exp(mean nll) is printed as ``[i]ppl,``; at the end
``Final estimate: PPL = x +/- y`` (y from the standard error of the mean nll).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import typer

from . import _checks as O
from . import app
from ._checks import BATCH, UBATCH, kv_cache_type, load_mode as _load_mode, read_text_file


def _ctx_size(ctx, param, value):
    if value < 4:  # n_ctx/2 .. n_ctx-2 must hold at least one scored position
        raise typer.BadParameter(f"{value}: the context must hold at least 4 tokens")
    return value


def _chunks(ctx, param, value):
    if value == 0:  # llama-perplexity would print PPL = nan; any negative value means all, as there
        raise typer.BadParameter("0 chunks scores nothing: give a count >= 1, or -1 for all")
    return value


def nll_of_rows(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    import numpy as np  # here, not at the top: `pyllama --help` does not pay for numpy

    """float64 [n]: -log softmax(logits[i])[targets[i]] for logits float32 [n, n_vocab]
    (llama-perplexity's log_softmax: float exp terms summed in double)."""
    mx = logits.max(axis=1, keepdims=True)
    sums = np.exp(logits - mx).sum(axis=1, dtype=np.float64)
    picked = logits[np.arange(logits.shape[0]), targets].astype(np.float64) - mx[:, 0]
    return -(picked - np.log(sums))


def perplexity(ctx, tokens: Sequence[int], n_ctx: int, n_batch: int, n_chunks: int = -1, *,
               add_bos: bool, bos: int,
               on_chunk: Optional[Callable[[int, int, float, float], None]] = None) -> tuple[float, float]:
    """Perplexity of ``tokens`` with chunks of ``n_ctx`` on ``ctx`` (a pyllama Context with
    room for n_ctx tokens). Returns (ppl, its +/- estimate). ``on_chunk(i, n_chunk, ppl_so_far,
    seconds_for_chunk)`` is called after every chunk."""
    import numpy as np

    from ..batch import batch_get_one

    tokens = np.asarray(tokens, dtype=np.int32)
    if tokens.shape[0] < 2 * n_ctx:
        raise ValueError(f"you need at least {2 * n_ctx} tokens to evaluate perplexity with a context of "
                         f"{n_ctx}; the text tokenizes to only {tokens.shape[0]} tokens")
    n_chunk_max = tokens.shape[0] // n_ctx
    n_chunk = n_chunk_max if n_chunks < 0 else min(n_chunks, n_chunk_max)
    if n_chunk == 0:
        raise ValueError("n_chunks = 0: no chunk to score (give -1 for all)")
    if n_batch < 1:
        raise ValueError(f"n_batch = {n_batch} must be >= 1")
    n_batch = min(n_batch, n_ctx)
    num_batches = (n_ctx + n_batch - 1) // n_batch
    first = n_ctx // 2
    nll = nll2 = 0.0
    count = 0
    for i in range(n_chunk):
        t0 = time.perf_counter()
        start, end = i * n_ctx, (i + 1) * n_ctx
        ctx.memory_clear(True)
        rows = []
        for j in range(num_batches):
            b0 = start + j * n_batch
            size = min(end - b0, n_batch)
            toks = tokens[b0:b0 + size].copy()
            if add_bos and j == 0:
                toks[0] = bos
            pos = j * n_batch + np.arange(size)
            want = pos >= first
            batch = batch_get_one(toks)
            batch.logits = want.astype(np.int8)
            ctx.decode(batch)
            if want.any():
                rows.append(np.array(ctx.logits, dtype=np.float32, copy=True))
        logits = np.concatenate(rows, axis=0)[: n_ctx - 1 - first]  # positions first .. n_ctx-2
        targets = tokens[start + first + 1:end]
        v = nll_of_rows(logits, targets)
        nll += float(v.sum())
        nll2 += float((v * v).sum())
        count += v.shape[0]
        if on_chunk:
            on_chunk(i, n_chunk, math.exp(nll / count), time.perf_counter() - t0)
    mean = nll / count
    var = nll2 / count - mean * mean
    ppl = math.exp(mean)
    err = math.sqrt(var / (count - 1)) * ppl if var > 0 and count > 1 else float("nan")
    return ppl, err


@app.command("perplexity")
def perplexity_cmd(
    model: Optional[Path] = typer.Option(None, "-m", "--model", help="GGUF file (default: SmolLM2-135M-Instruct)"),
    hf_repo: Optional[str] = O.opt_hf_repo(),
    hf_file: Optional[str] = O.opt_hf_file(),
    hf_token: Optional[str] = O.opt_hf_token(),
    file: Path = typer.Option(..., "-f", "--file", help="text file to score (UTF-8, at most 256 MiB)"),
    ctx_size: int = typer.Option(512, "-c", "--ctx-size", callback=_ctx_size, help="tokens per chunk (>= 4)"),
    batch_size: int = typer.Option(2048, "-b", "--batch-size", callback=BATCH, help="logical batch size (capped at -c)"),
    ubatch_size: int = typer.Option(512, "-ub", "--ubatch-size", callback=UBATCH, help="physical batch size (0 = -b)"),
    chunks: int = typer.Option(-1, "--chunks", callback=_chunks, help="score at most this many chunks (< 0 = all)"),
    threads: Optional[int] = typer.Option(None, "-t", "--threads", help="(<= 0 = the default)"),
    threads_batch: Optional[int] = typer.Option(None, "-tb", "--threads-batch", help="(<= 0 = the default)"),
    load_mode: str = typer.Option("auto", "-lm", "--load-mode", callback=_load_mode),
    cache_type_k: str = typer.Option("f16", "-ctk", "--cache-type-k", callback=kv_cache_type),
    cache_type_v: str = typer.Option("f16", "-ctv", "--cache-type-v", callback=kv_cache_type),
) -> None:
    """Perplexity of a text file, the way llama-perplexity computes it."""
    from ..errors import PyllamaError
    from .generate import open_session

    text = read_text_file(file, "-f")
    n_batch = min(batch_size, ctx_size)
    model = O.model_by_name(model, hf_repo, hf_file, hf_token)
    try:
        _path, sess = open_session(model, ctx_size=ctx_size, batch_size=n_batch, ubatch_size=min(ubatch_size, n_batch),
                                   threads=threads, threads_batch=threads_batch, load_mode=load_mode,
                                   cache_type_k=cache_type_k, cache_type_v=cache_type_v)
        v = sess.vocab
        t0 = time.perf_counter()
        print("perplexity: tokenizing the input ..", file=sys.stderr)
        tokens = sess.tokenize(text, add_special=True, parse_special=False)
        print(f"perplexity: tokenization took {1e3 * (time.perf_counter() - t0):g} ms", file=sys.stderr)
        if len(tokens) < 2 * ctx_size:  # before the "calculating" line, as llama-perplexity
            raise ValueError(f"you need at least {2 * ctx_size} tokens to evaluate perplexity with a context of "
                             f"{ctx_size} (-c); {file} tokenizes to only {len(tokens)} tokens")
        n_chunk_max = len(tokens) // ctx_size
        n_chunk = n_chunk_max if chunks < 0 else min(chunks, n_chunk_max)
        print(f"perplexity: calculating perplexity over {n_chunk} chunks, n_ctx={ctx_size}, "
              f"batch_size={n_batch}, n_seq=1", file=sys.stderr)

        def on_chunk(i, n, ppl, dt):
            if i == 0:
                total = dt * n
                eta = f"{int(total // 3600)} hours " if total >= 3600 else ""
                print(f"perplexity: {dt:.2f} seconds per pass - ETA {eta}{(total % 3600) / 60:.2f} minutes",
                      file=sys.stderr, flush=True)
            sys.stdout.write(f"[{i + 1}]{ppl:.4f},")
            sys.stdout.flush()

        ppl, err = perplexity(sess.ctx, tokens, ctx_size, n_batch, chunks, add_bos=bool(v.add_bos),
                              bos=int(v.bos), on_chunk=on_chunk)
    except (BrokenPipeError, typer.Exit):  # a closed stdout (typer exits quietly) or our own exit
        raise
    except (PyllamaError, ValueError, FileNotFoundError, OSError, MemoryError) as e:
        typer.echo(f"\nerror: {e}", err=True)
        raise typer.Exit(1) from None
    sys.stdout.write("\n")
    print(f"Final estimate: PPL = {ppl:.4f} +/- {err:.5f}")
