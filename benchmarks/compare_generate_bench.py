"""`pyllama generate` end to end against `pyllama bench`'s tg, same machine, same run.

For each model, alternates ``--rounds`` times: ``pyllama bench -p 0 -n N -r 1`` (N single
decodes of random tokens: the tg rate) and ``pyllama generate -n N --ignore-eos`` with the
default sampler chain, reading generate's end-to-end line (sampling, detokenizing and
printing included; the prompt excluded). Prints the medians, their ratio and the median of
the per-round ratios (each round's two runs are back to back, so slow drifts of a shared
machine cancel out of it).

    flock /tmp/bench.lock python benchmarks/compare_generate_bench.py [-m MODEL ...] [-n 128] [-t 2] [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

_GEN = re.compile(r"generation \(after the prompt, end to end\) = (\d+) tokens in [\d.]+ s, ([\d.]+) t/s")


def _cli(*args: str, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyllama", *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          errors="replace")


def bench_tg(model: str, n: int, threads: int) -> float:
    r = _cli("bench", "-m", model, "-p", "0", "-n", str(n), "-t", str(threads), "-r", "1", "-o", "json")
    if r.returncode != 0:
        raise RuntimeError(f"pyllama bench failed:\n{r.stderr[-2000:]}")
    return float(json.loads(r.stdout)[0]["avg_ts"])


def generate_rate(model: str, n: int, threads: int, prompt: str) -> float:
    # the text goes to /dev/null, as it would to a terminal: a pipe read by this process
    # would wake it at every streamed token, and on a 2-core machine that steals time
    # from the decode threads
    r = _cli("generate", "-m", model, "-p", prompt, "-n", str(n), "-t", str(threads), "--ignore-eos", "-s", "1",
             stdout=subprocess.DEVNULL)
    m = _GEN.search(r.stderr)
    if r.returncode != 0 or m is None:
        raise RuntimeError(f"pyllama generate failed:\n{r.stderr[-2000:]}")
    return float(m.group(2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", action="append", help="GGUF file (default: the two real models)")
    ap.add_argument("-n", type=int, default=128, help="tokens per run")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("-p", "--prompt", default="Once upon a time")
    args = ap.parse_args()
    models = args.model
    if not models:
        from pyllama import _models

        models = [str(_models.smollm2_path()), str(_models.gemma3_path())]
    print("| model | bench tg t/s (median) | generate t/s (median) | ratio of medians | median of paired ratios |")
    print("|---|---:|---:|---:|---:|")
    for model in models:
        tg, gen = [], []
        for _ in range(args.rounds):
            tg.append(bench_tg(model, args.n, args.threads))
            gen.append(generate_rate(model, args.n, args.threads, args.prompt))
        b, g = statistics.median(tg), statistics.median(gen)
        paired = statistics.median(y / x for x, y in zip(tg, gen))
        print(f"| {Path(model).name} | {b:.1f} | {g:.1f} | {g / b:.3f} | {paired:.3f} |", flush=True)
        print(f"<!-- bench {['%.1f' % x for x in tg]} generate {['%.1f' % x for x in gen]} -->", flush=True)


if __name__ == "__main__":
    main()
