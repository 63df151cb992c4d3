"""Tokenizer speed: tokenize ../shared/reference/text-gpl3.txt (35 KB) with each real model.

llama.cpp takes about 17 ms for this text; the goal is no worse than 3x. Prints the vocab
load time, the first (cold cache) and best of N warm runs. Not a test. For a ratio, run
bench_tokenize_llamacpp.cpp (llama.cpp's own llama_tokenize) right before or after.

    python benchmarks/bench_tokenize.py [TEXT_FILE] [-n 5]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pyllama import _models
from pyllama.vocab import Vocab


def main() -> None:
    ap = argparse.ArgumentParser()
    here = Path(__file__).resolve().parent
    ap.add_argument("text", nargs="?", default=str(here.parent.parent / "shared" / "reference" / "text-gpl3.txt"))
    ap.add_argument("-n", type=int, default=5)
    args = ap.parse_args()
    text = Path(args.text).read_text(encoding="utf-8")
    print(f"text: {args.text} ({len(text.encode())} bytes)")
    for name, path in (("smollm2", _models.smollm2_path()), ("gemma3", _models.gemma3_path())):
        if path is None:
            print(f"{name}: not installed")
            continue
        t0 = time.perf_counter()
        v = Vocab.from_file(path)
        load = time.perf_counter() - t0
        times = []
        for _ in range(args.n):
            if not times:
                v = Vocab.from_file(path)  # cold: empty word cache
            t0 = time.perf_counter()
            ids = v.tokenize(text, add_special=True, parse_special=False)
            times.append(time.perf_counter() - t0)
        print(f"{name:8s} load {load * 1e3:7.1f} ms   tokenize cold {times[0] * 1e3:7.1f} ms   "
              f"warm best {min(times[1:] or times) * 1e3:7.1f} ms   {len(ids)} tokens")


if __name__ == "__main__":
    main()
