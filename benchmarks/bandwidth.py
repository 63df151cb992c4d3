#!/usr/bin/env python3
"""Token generation against the machine's read bandwidth, and the thread pool's share of a token.

Single-token decoding reads every weight once per token, so its ceiling is the memory read
bandwidth. This prints, per model and thread count:

- tg t/s (``pyllama bench -p 0 -n 128``, median of the repetitions),
- the weight bytes one token reads (every tensor but the token embeddings, of which a token
  reads one row; all of them when the output layer is tied to them),
- the effective GB/s (bytes x t/s) and its fraction of the project's own read probe
  (``cargo bench --bench kernels -- bw``: every thread streams its part of a buffer of the
  model's weight size with 256-bit loads; a model that fits in the last-level cache is read
  from there, and so is the probe's buffer; the buffer is on 2 MiB pages (``huge``) when
  the model's weights are, i.e. when load_mode auto read them into memory rather than
  mapping the file). A shared host's memory bandwidth drifts between runs (this project's
  2-vCPU hosts: the 2-thread probe 29-64 GB/s within an hour), so ``--rounds R`` measures
  R times, each round the probe right before its tg runs, and each fraction is taken
  against its own round's probe: the table gives the medians and the rounds' range of
  fractions,
- parallel regions per token (``Context.n_parallel_regions`` over a greedy run) times the
  pool's cost per empty region (the same bench), as a percentage of a token's time.

    python benchmarks/bandwidth.py [-m MODEL ...] [-t 1,2] [-r 3] [-n 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def weight_bytes(path: str) -> tuple[int, bool]:
    """(bytes a token reads, whether the weights are in memory rather than mapped: on 2 MiB
    pages where the system has transparent huge pages)."""
    from pyllama import Model

    m = Model.load(path)
    names = {t.name: t.nbytes for t in m.tensors}
    total = sum(names.values())
    if "output.weight" in names:
        total -= names.get("token_embd.weight", 0)  # one row per token: negligible
    return total, not m._core.is_mmap


def probe(mib: int, huge: bool) -> tuple[dict[int, float], dict[int, float]]:
    """(GB/s per thread count, seconds per empty parallel region per thread count)."""
    env = dict(os.environ, PYLLAMA_BENCH_MIB=str(mib))
    out = subprocess.run(["cargo", "bench", "-q", "-p", "pyllama-core", "--bench", "kernels", "--", "bw"] + (["huge"] if huge else []),
                         cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout
    m = re.search(r"1 thread ([\d.]+) 2 threads ([\d.]+)", out)
    if not m:
        sys.exit(f"unexpected probe output:\n{out}")
    bw = {1: float(m.group(1)), 2: float(m.group(2))}
    pool = {int(n): float(us) * 1e-6 for n, us in re.findall(r"pool of (\d+): ([\d.]+) us", out)}
    return bw, pool


def tg(path: str, threads: int, reps: int, n_gen: int) -> float:
    cmd = [sys.executable, "-m", "pyllama", "bench", "-m", path, "-p", "0", "-n", str(n_gen), "-t", str(threads),
           "-r", str(reps), "-o", "json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = json.loads(out[out.index("["):])
    return statistics.median(rows[0]["samples_ts"])


def regions_per_token(path: str, threads: int, n: int = 32) -> float:
    from pyllama import Context, Model

    model = Model.load(path)
    with Context(model, n_ctx=256, n_threads=threads, n_threads_batch=threads) as ctx:
        ctx.decode([1])
        tok = int(ctx.logits[-1].argmax())
        before = ctx.n_parallel_regions
        for _ in range(n):
            ctx.decode([tok])
            tok = int(ctx.logits[-1].argmax())
        return (ctx.n_parallel_regions - before) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", action="append", help="GGUF files (default: the two reference models)")
    ap.add_argument("-t", "--threads", default="1,2")
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="probe + tg rounds per model (fractions against each round's own probe)")
    a = ap.parse_args()
    if a.rounds < 1 or a.repetitions < 1 or a.n_gen < 1:
        ap.error("--rounds, -r and -n must be at least 1")
    models = a.model
    if not models:
        from pyllama import _models

        models = [str(p) for p in (_models.smollm2_path(), _models.gemma3_path()) if p]
    threads = [int(t) for t in a.threads.split(",")]
    print("| model | threads | tg t/s | MiB/token | GB/s | probe GB/s | fraction | fraction range | regions/token | pool % of a token |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    med = statistics.median
    for m in models:
        nbytes, huge = weight_bytes(m)
        # per thread count: (tg t/s, probe GB/s, pool seconds per region) of each round
        rounds: dict[int, list[tuple[float, float, float]]] = {t: [] for t in threads}
        for r in range(a.rounds):
            bw, pool = probe(max(1, nbytes >> 20), huge)
            for t in threads:
                tps = tg(m, t, a.repetitions, a.n_gen)
                rounds[t].append((tps, bw.get(t, float("nan")), pool.get(t, float("nan"))))
                print(f"  {Path(m).name} round {r + 1}/{a.rounds}, {t} thread(s): tg {tps:.1f} t/s, probe {bw.get(t, float('nan')):.1f} GB/s, "
                      f"fraction {nbytes * tps / 1e9 / bw.get(t, float('nan')):.2f}", file=sys.stderr, flush=True)
        for t in threads:
            rpt = regions_per_token(m, t)
            tps = med([x[0] for x in rounds[t]])
            fr = [nbytes * x[0] / 1e9 / x[1] for x in rounds[t]]
            share = 100.0 * rpt * med([x[2] for x in rounds[t]]) * tps
            print(f"| {Path(m).name} | {t} | {tps:.1f} | {nbytes / 2**20:.1f} | {nbytes * tps / 1e9:.1f} | {med([x[1] for x in rounds[t]]):.1f} | "
                  f"{med(fr):.2f} | {min(fr):.2f}-{max(fr):.2f} | {rpt:.0f} | {share:.2f}% |", flush=True)


if __name__ == "__main__":
    main()
