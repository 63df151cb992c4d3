#!/usr/bin/env python3
"""Run llama.cpp's llama-batched-bench and `pyllama batched-bench` alternately with the same
settings on the same models, and print S_PP, S_TG and S (tokens/s) of both per npl, as
medians over the rounds, with the ratio pyllama / llama.cpp.

llama-batched-bench is found with --llama-batched-bench, on PATH, or built from the
llama-cpp-python 0.3.36 sdist like compare_llamacpp.py's llama-bench (its
`build_llama_bench`; only the llama-batched-bench target). --build-dir picks another cmake
build directory of that source (e.g. ~/.cache/pyllama/llama.cpp/build-avx2, an AVX2-only
build like CI's CPUs); the target is built there if missing.

    python benchmarks/compare_batched.py [-t 2] [-npp 128] [-ntg 128] [-npl 1,2,4,8,16] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_llamacpp import CACHE, ROUNDS_HELP, n_rounds, round_order, usable  # noqa: E402

TARGET = "llama-batched-bench"


def find_tool(build_dir: str | None, model: str) -> str:
    if build_dir is None:
        return shutil.which(TARGET) or str(usable(TARGET, ["-m", model, "-npp", "16", "-ntg", "1", "-npl", "1", "-c", "64"]))
    exe = Path(build_dir).expanduser() / "bin" / TARGET
    if not exe.exists():
        bindir = str(Path(sys.executable).parent)
        cmake = shutil.which("cmake") or shutil.which("cmake", path=bindir) or "cmake"
        env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))  # its ninja
        subprocess.run([cmake, "--build", str(exe.parent.parent), "-j", str(os.cpu_count() or 2), "--target", TARGET],
                       check=True, env=env)
    return str(exe)


def run_jsonl(cmd: list[str], env: dict | None = None) -> list[dict]:
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return [json.loads(line) for line in (p.stdout + "\n" + p.stderr).splitlines() if line.startswith('{"n_kv_max"')]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", action="append", help="GGUF files (default: the two reference models)")
    ap.add_argument("-t", "--threads", default="2")
    ap.add_argument("-c", "--ctx-size", default="4096", help="n_ctx of both (enough for 16 x (128 + 128))")
    ap.add_argument("-npp", default="128")
    ap.add_argument("-ntg", default="128")
    ap.add_argument("-npl", default="1,2,4,8,16")
    ap.add_argument("-pps", action="store_true", help="shared prompt (both programs)")
    ap.add_argument("--rounds", type=int, default=None, help=ROUNDS_HELP)
    ap.add_argument("--llama-batched-bench", help="path to an existing llama-batched-bench")
    ap.add_argument("--build-dir", help=f"cmake build dir of the llama.cpp source (default {CACHE / 'build'})")
    ap.add_argument("--pyllama-env", action="append", default=[], metavar="K=V",
                    help="environment for pyllama only, e.g. PYLLAMA_KERNELS=avx2")
    ap.add_argument("--baseline", metavar="DIR",
                    help="also run the pyllama package in DIR (PYTHONPATH=DIR: a copy of python/pyllama with an "
                         "older build's extension) in the same rotation, and print its table too")
    a = ap.parse_args()

    models = a.model
    if not models:
        from pyllama import _models

        models = [str(p) for p in (_models.smollm2_path(), _models.gemma3_path()) if p]
    lbb = a.llama_batched_bench or find_tool(a.build_dir, models[0])
    common = ["-t", a.threads, "-c", a.ctx_size, "-npp", a.npp, "-ntg", a.ntg, "-npl", a.npl,
              "--output-format", "jsonl", *(["-pps"] if a.pps else [])]
    penv = dict(os.environ, **dict(kv.split("=", 1) for kv in a.pyllama_env))
    # samples[(model, pp, tg, pl, prog)] = list of (speed_pp, speed_tg, speed)
    samples: dict[tuple, list[tuple[float, float, float]]] = {}
    progs = [("llama.cpp", [lbb], None), ("pyllama", [sys.executable, "-m", "pyllama", "batched-bench"], penv)]
    if a.baseline:
        benv = dict(penv, PYTHONPATH=a.baseline + os.pathsep + penv.get("PYTHONPATH", ""))
        progs.append(("baseline", [sys.executable, "-m", "pyllama", "batched-bench"], benv))
    a.rounds = n_rounds(ap, a.rounds, len(progs))
    for rnd in range(a.rounds):
        for m in models:
            for prog, exe, env in round_order(progs, rnd):
                cmd = [*exe, "-m", m, *common]
                for r in run_jsonl(cmd, env):
                    k = (Path(m).name, r["pp"], r["tg"], r["pl"], prog)
                    samples.setdefault(k, []).append((r["speed_pp"], r["speed_tg"], r["speed"]))
                    print(f"  round {rnd + 1} {prog} {Path(m).name} B={r['pl']}: S_PP {r['speed_pp']:.1f} "
                          f"S_TG {r['speed_tg']:.1f} S {r['speed']:.1f} (load {os.getloadavg()[0]:.1f})",
                          file=sys.stderr, flush=True)
    try:
        load = os.getloadavg()
        print(f"\nload average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
              f"{a.rounds} rounds, medians; threads {a.threads}")
    except OSError:
        pass
    keys = sorted({k[:4] for k in samples}, key=lambda k: (models.index(next(m for m in models if Path(m).name == k[0])), *k[1:]))
    for prog in [p[0] for p in progs[1:]]:
        print(f"\n{prog} / llama.cpp (tokens/s, medians):\n")
        print(f"| model | PP | TG | B | S_PP llama.cpp | S_PP {prog} | ratio | S_TG llama.cpp | S_TG {prog} | ratio "
              f"| S llama.cpp | S {prog} | ratio |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for k in keys:
            ref, ours = samples.get((*k, "llama.cpp")), samples.get((*k, prog))
            if not ref or not ours:
                continue
            cells = []
            for i in range(3):
                r = statistics.median(s[i] for s in ref)
                o = statistics.median(s[i] for s in ours)
                cells += [f"{r:.1f}", f"{o:.1f}", f"{o / r:.2f}x"]
            print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
