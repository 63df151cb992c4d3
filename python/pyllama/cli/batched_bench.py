"""`pyllama batched-bench`: llama.cpp's llama-batched-bench (tools/batched-bench) on pyllama.

Same method and table: one context with n_seq_max = max(npl); a warmup decode of 16 random
tokens; then for every (npp, ntg, npl): clear the cache, decode the prompts of all npl
sequences (npp random tokens each, an output only for each sequence's last token; one
prompt shared by all with -pps, copied to the others with seq_cp) in batches of n_batch
tokens (T_PP), then ntg steps of one random token per sequence, every one with an output
(T_TG; with -tgs the sequences one after another instead). Cases that need more cells
than n_ctx are skipped, as llama.cpp does. One run per case (llama-batched-bench has no
repetitions; benchmarks/compare_batched.py repeats and takes medians).

S_PP = tokens of prompt / T_PP, S_TG = npl * ntg / T_TG, S = all tokens / (T_PP + T_TG).
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import typer

from . import app
from ._checks import integer


def _int_csv(ctx, param, value: str) -> list[int]:
    """llama.cpp's string_split<int>: comma-separated integers (here: each >= 1)."""
    try:
        vals = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(f"{value!r}: expected comma-separated integers") from None
    if not vals or any(v < 1 for v in vals):
        raise typer.BadParameter(f"{value!r}: expected comma-separated integers >= 1")
    return vals


def _kv_type(ctx, param, value: str) -> str:
    from ..context import GGML_TYPE_NAMES

    v = value.strip().lower()
    if v not in GGML_TYPE_NAMES.values():
        raise typer.BadParameter(f"{value!r} is not a KV cache type ({', '.join(GGML_TYPE_NAMES.values())})")
    return v


def _out_format(ctx, param, value: str) -> str:
    v = value.lower()
    if v not in ("md", "jsonl"):
        raise typer.BadParameter(f"{value!r} is not md or jsonl")
    return v


class _Batch:
    """A reusable llama_batch with common_batch's add/clear (numpy arrays, one seq id each)."""

    def __init__(self, api, n_alloc: int) -> None:
        self.b = api.llama_batch_init(n_alloc, 0, 1)
        self.n = 0

    def clear(self) -> None:
        self.n = 0

    def add(self, tok: int, pos: int, seq: int, logits: bool) -> None:
        b, i = self.b, self.n
        b.token[i] = tok
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i, 0] = seq
        b.logits[i] = logits
        self.n = i + 1

    def decode(self, api, ctx, n_batch: int) -> None:
        """decode_helper: the batch in chunks of n_batch entries (views, no copies)."""
        from ..batch import Batch

        b = self.b
        for i in range(0, self.n, n_batch):
            n = min(n_batch, self.n - i)
            sub = Batch(n, b.token[i:i + n], None, b.pos[i:i + n], b.n_seq_id[i:i + n], b.seq_id[i:i + n], b.logits[i:i + n])
            ret = api.llama_decode(ctx, sub)
            if ret != 0:
                raise RuntimeError(f"failed to decode the batch, n_batch = {n_batch}, ret = {ret}")


@app.command("batched-bench")
def batched_bench(
    model: Path = typer.Option(..., "-m", "--model", help="GGUF file"),
    n_pp: str = typer.Option("128,256,512", "-npp", callback=_int_csv, help="prompt lengths, comma-separated"),
    n_tg: str = typer.Option("128,256", "-ntg", callback=_int_csv, help="generated tokens per sequence, comma-separated"),
    n_pl: str = typer.Option("1,2,4,8,16,32", "-npl", callback=_int_csv, help="parallel sequences, comma-separated"),
    pps: bool = typer.Option(False, "-pps", help="one prompt shared by all sequences (decoded once, then seq_cp)"),
    tgs: bool = typer.Option(False, "-tgs", help="generate for the sequences one after another, not together"),
    n_ctx: int = typer.Option(0, "-c", "--ctx-size", callback=integer(0), help="context size (0 = the model's)"),
    n_batch: int = typer.Option(2048, "-b", "--batch-size", callback=integer(1), help="logical batch size"),
    n_ubatch: int = typer.Option(512, "-ub", "--ubatch-size", callback=integer(1), help="physical batch size"),
    threads: int = typer.Option(0, "-t", "--threads", callback=integer(0), help="threads (0 = the physical cores)"),
    kv_unified: bool = typer.Option(False, "-kvu", "--kv-unified", help="one KV buffer shared by all sequences"),
    cache_type_k: str = typer.Option("f16", "-ctk", "--cache-type-k", callback=_kv_type, help="K cache type"),
    cache_type_v: str = typer.Option("f16", "-ctv", "--cache-type-v", callback=_kv_type, help="V cache type"),
    output_format: str = typer.Option("md", "--output-format", callback=_out_format, help="md (table) or jsonl"),
    seed: int = typer.Option(1, "--seed", help="random tokens seed"),
) -> None:
    """Benchmark batched decoding of several sequences at once, like llama-batched-bench."""
    from .. import llama_api as api
    from ..errors import PyllamaError
    from .generate import freeze_heap

    try:  # llama.cpp's default: the physical cores
        from .bench import physical_cores

        nt = threads or physical_cores()
    except ImportError:
        nt = threads or os.cpu_count() or 1
    api.llama_backend_init()
    lm = api.llama_model_load_from_file(str(model).encode(), api.llama_model_default_params())
    if lm is None:
        typer.echo(f"error: unable to load model {model}", err=True)
        raise typer.Exit(1)
    try:
        cp = api.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = n_ubatch
        cp.n_threads = nt
        cp.n_threads_batch = nt
        cp.n_seq_max = max(n_pl)
        cp.kv_unified = kv_unified
        cp.type_k = getattr(api, f"GGML_TYPE_{cache_type_k.upper()}")
        cp.type_v = getattr(api, f"GGML_TYPE_{cache_type_v.upper()}")
        ctx = api.llama_init_from_model(lm, cp)
        if ctx is None:
            typer.echo("error: failed to create the llama_context", err=True)
            raise typer.Exit(1)
        vocab = api.llama_model_get_vocab(lm)
        n_vocab = api.llama_vocab_n_tokens(vocab)
        rng = random.Random(seed)
        rand = lambda: rng.randrange(n_vocab)  # noqa: E731
        mem = api.llama_get_memory(ctx)
        n_kv_max = api.llama_n_ctx(ctx)
        nb = api.llama_n_batch(ctx)
        batch = _Batch(api, max(nb, max(n_pl) * max(n_pp), 16))
        for i in range(16):  # warm up
            batch.add(rand(), i, 0, False)
        batch.decode(api, ctx, nb)
        freeze_heap()  # as `pyllama bench`: no GC walks of the vocabulary while timing
        if output_format == "md":
            print()
            print(f"batched-bench: n_kv_max = {n_kv_max}, n_batch = {nb}, n_ubatch = {api.llama_n_ubatch(ctx)}, "
                  f"is_pp_shared = {int(pps)}, is_tg_separate = {int(tgs)}, n_threads = {nt}, n_threads_batch = {nt}")
            print()
            print("|%6s | %6s | %4s | %6s | %8s | %8s | %8s | %8s | %8s | %8s |"
                  % ("PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s"))
            print("|%6s-|-%6s-|-%4s-|-%6s-|-%8s-|-%8s-|-%8s-|-%8s-|-%8s-|-%8s-|"
                  % ("------", "------", "----", "------", "--------", "--------", "--------", "--------", "--------", "--------"),
                  flush=True)
        for pp in n_pp:
            for tg in n_tg:
                for pl in n_pl:
                    n_ctx_req = ((pp if kv_unified else pl * pp) + pl * tg) if pps else pl * (pp + tg)
                    if n_ctx_req > n_kv_max:
                        continue
                    batch.clear()
                    for j in range(1 if pps else pl):
                        for i in range(pp):
                            batch.add(rand(), i, j, i == pp - 1)
                    api.llama_memory_clear(mem, False)
                    t0 = time.perf_counter()
                    batch.decode(api, ctx, nb)
                    t1 = time.perf_counter()
                    if pps:
                        for s in range(1, pl):
                            api.llama_memory_seq_cp(mem, 0, s, -1, -1)
                        if not kv_unified:
                            # llama.cpp's dummy token that applies the copy (pyllama copies
                            # at once, but the same work keeps the timings comparable)
                            batch.clear()
                            batch.add(rand(), pp, 0, True)
                            batch.decode(api, ctx, nb)
                            api.llama_memory_seq_rm(mem, 0, pp, -1)
                    t2 = time.perf_counter()
                    if tgs:
                        for j in range(pl):
                            for i in range(tg):
                                batch.clear()
                                batch.add(rand(), pp + i, j, True)
                                batch.decode(api, ctx, nb)
                    else:
                        for i in range(tg):
                            batch.clear()
                            for j in range(pl):
                                batch.add(rand(), pp + i, j, True)
                            batch.decode(api, ctx, nb)
                    t3 = time.perf_counter()
                    t_pp, t_tg = t1 - t0, t3 - t2
                    t = t_pp + t_tg
                    s_pp = (pp if pps else pl * pp) / t_pp
                    s_tg = pl * tg / t_tg
                    s = ((pp if pps else pl * pp) + pl * tg) / t
                    if output_format == "jsonl":
                        print(json.dumps({
                            "n_kv_max": n_kv_max, "n_batch": nb, "n_ubatch": api.llama_n_ubatch(ctx),
                            "is_pp_shared": int(pps), "n_threads": nt, "n_threads_batch": nt,
                            "pp": pp, "tg": tg, "pl": pl, "n_kv": n_ctx_req, "t_pp": t_pp, "speed_pp": s_pp,
                            "t_tg": t_tg, "speed_tg": s_tg, "t": t, "speed": s,
                        }), flush=True)
                    else:
                        print("|%6d | %6d | %4d | %6d | %8.3f | %8.2f | %8.3f | %8.2f | %8.3f | %8.2f |"
                              % (pp, tg, pl, n_ctx_req, t_pp, s_pp, t_tg, s_tg, t, s), flush=True)
        api.llama_free(ctx)
    except (BrokenPipeError, typer.Exit):
        raise
    except (PyllamaError, RuntimeError, ValueError, OSError, MemoryError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    finally:
        api.llama_model_free(lm)
