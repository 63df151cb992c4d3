#!/usr/bin/env python3
"""Run llama.cpp's llama-bench and `pyllama bench` alternately on the same models, same
threads, same machine, and print pyllama / llama.cpp per test (median of repetitions).

llama-bench is found with --llama-bench, on PATH, or built from the llama-cpp-python 0.3.36
sdist (downloaded with pip into ~/.cache/pyllama/llama.cpp, built with cmake; needs cmake and
a C++ compiler; ~10 minutes on 2 cores the first time). Nothing of llama.cpp is committed.
A short llama-bench run checks the build first: where it dies of a signal on a CPU that
reports AMX (llama.cpp's AMX kernels did on a Sapphire Rapids class VM), llama.cpp is built
again without AMX (~/.cache/pyllama/llama.cpp/build-noamx) and a note says so; every llama.cpp
tool of these scripts (llama-batched-bench, llama-server) then comes from that build.

    python benchmarks/compare_llamacpp.py [-t 2] [-r 5] [-p 512] [-n 128] [--rounds N]
        [-d 4096] [-ctk q8_0 -ctv q8_0] [-fa 1] [--baseline DIR [--baseline-env KEY=VALUE]]

-d/--depth fills the KV cache with that many tokens before each test (untimed, llama-bench's
-d), so pp512 @ d4096 and tg128 @ d4096 time attention over a long cache; -ctk/-ctv/-fa go to
both programs (llama.cpp needs -fa 1 for a quantized V cache). ``--baseline DIR`` adds an older
pyllama (``pip install --target DIR pyllama_gguf-*.whl``) to the alternation: a before/after
table in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

CACHE = Path(os.environ.get("PYLLAMA_CACHE", Path.home() / ".cache" / "pyllama")) / "llama.cpp"
SDIST = "llama-cpp-python==0.3.36"


# compiler flags of a native build whose AMX kernels are left out (see `usable`)
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    m = re.search(r"^flags\s*:(.*)$", text, re.M)
    return set(m.group(1).split()) if m else set()


def build_llama_bench(target: str = "llama-bench", no_amx: bool = False) -> Path:
    """Return <build>/bin/<target> (llama-bench, llama-server, ...), building it first if
    missing. <build> is build-noamx (compiled without AMX instructions) when ``no_amx`` or once
    `usable` has made that build on this machine, so every tool then comes from it."""
    no_amx = no_amx or (CACHE / "build-noamx" / "CMakeCache.txt").exists()
    build = CACHE / ("build-noamx" if no_amx else "build")
    exe = build / "bin" / target
    if exe.exists():
        return exe
    CACHE.mkdir(parents=True, exist_ok=True)
    src = CACHE / "src"
    if not src.exists():
        tars = list(CACHE.glob("llama_cpp_python-*.tar.gz"))
        if not tars:
            print(f"downloading the {SDIST} sdist ...", file=sys.stderr)
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
                 SDIST, "-d", str(CACHE)],
                check=False,
            )
            tars = list(CACHE.glob("llama_cpp_python-*.tar.gz"))
            if not tars:
                sys.exit("could not download the llama-cpp-python sdist (pip reads its metadata without build "
                         "isolation, so scikit-build-core must be installed: pip install scikit-build-core)")
        with tarfile.open(tars[0]) as t:
            t.extractall(src)
    root = next(src.glob("llama_cpp_python-*")) / "vendor" / "llama.cpp"
    # cmake/ninja may be pip-installed next to this interpreter without the venv being activated
    bindir = str(Path(sys.executable).parent)
    cmake = shutil.which("cmake") or shutil.which("cmake", path=bindir) or "cmake"
    ninja = shutil.which("ninja") or shutil.which("ninja", path=bindir)
    gen = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"] if ninja and not (build / "CMakeCache.txt").exists() else []
    server = target == "llama-server"
    # the server's web UI is not needed: skip its download from Hugging Face (no network needed)
    extra = ["-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_USE_PREBUILT_UI=OFF"] if server else ["-DLLAMA_BUILD_SERVER=OFF"]
    subprocess.run([cmake, "-S", str(root), "-B", str(build), *gen, "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", *extra,
                    *([f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"] if no_amx else [])], check=True)
    subprocess.run([cmake, "--build", str(build), "-j", str(os.cpu_count() or 2), "--target", target], check=True)
    return exe


def usable(target: str, smoke: list[str]) -> Path:
    """This project's native build of `target`, checked with a short run (`smoke`: its
    arguments). A native build on a CPU that reports AMX compiles llama.cpp's AMX kernels; on
    a 2-vCPU Sapphire Rapids class VM (2026-12-05) they died in `ldtilecfg` (SIGILL, and
    SIGSEGV with the tile permission requested), so there the same tool is built again without
    AMX (`build-noamx`), which is llama.cpp's AVX-512 VNNI code, and a note says so."""
    exe = build_llama_bench(target)
    r = subprocess.run([str(exe), *smoke], capture_output=True, text=True)
    if r.returncode >= 0:
        return exe
    if "amx_tile" not in cpu_flags() or "build-noamx" in exe.parts:
        sys.exit(f"{exe} died of signal {-r.returncode} in a short run: {' '.join(smoke)}\n{r.stderr[-2000:]}")
    print(f"note: {target} (native build) died of signal {-r.returncode} on this AMX CPU; "
          f"using llama.cpp built without AMX ({NO_AMX})", file=sys.stderr, flush=True)
    return build_llama_bench(target, no_amx=True)


def run_json(cmd: list[str], env: dict | None = None) -> list[dict]:
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out[out.index("["):])


def round_order(progs: list, rnd: int) -> list:
    """The programs in round rnd's order: each round led by the next one (llama.cpp,
    pyllama[, baseline], then pyllama, ...[, llama.cpp]), so that with rounds a multiple of
    the programs each leads as often as the others. In a fixed order the baseline showed a
    tg128 lead over an equal build that runs in both orders did not (docs/profiling.md,
    tenth pass)."""
    k = rnd % len(progs)
    return progs[k:] + progs[:k]


ROUNDS_HELP = "rounds of all the programs, each round led by the next one in turn (default: one per program, so that each leads once)"


def n_rounds(ap: argparse.ArgumentParser, rounds: int | None, n_progs: int) -> int:
    """--rounds as given (at least 1), or one round per program (see `round_order`)."""
    if rounds is None:
        return n_progs
    if rounds < 1:
        ap.error(f"--rounds must be at least 1, got {rounds}")
    return rounds


def key(r: dict) -> str:
    p, g = r["n_prompt"], r["n_gen"]
    t = f"pp{p}" if g == 0 else (f"tg{g}" if p == 0 else f"pp{p}+tg{g}")
    d = r.get("n_depth", 0)
    return f"{t} @ d{d}" if d else t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", action="append", help="GGUF files (default: the two reference models)")
    ap.add_argument("-t", "--threads", default="2")
    ap.add_argument("-r", "--repetitions", default="5")
    ap.add_argument("-p", "--n-prompt", default="512")
    ap.add_argument("-n", "--n-gen", default="128")
    ap.add_argument("--rounds", type=int, default=None, help=ROUNDS_HELP)
    ap.add_argument("-d", "--depth", default="0", help="tokens in the KV cache before each test (llama-bench -d)")
    ap.add_argument("-ctk", "--cache-type-k", default="f16")
    ap.add_argument("-ctv", "--cache-type-v", default="f16")
    ap.add_argument("-fa", "--flash-attn", default=None, help="llama-bench -fa (both programs); default: each one's own")
    ap.add_argument("--llama-bench", help="path to an existing llama-bench")
    ap.add_argument("--baseline", metavar="DIR",
                    help="also run an older pyllama installed in DIR (pip install --target DIR), alternated with the others")
    ap.add_argument("--baseline-env", metavar="KEY=VALUE", action="append", default=[],
                    help="environment for the baseline only (repeatable), e.g. PYLLAMA_KERNELS=avx2 for a set "
                         "the older pyllama does not have")
    a = ap.parse_args()

    models = a.model
    if not models:
        from pyllama import _models

        models = [str(p) for p in (_models.smollm2_path(), _models.gemma3_path()) if p]
    lb = a.llama_bench or shutil.which("llama-bench") or str(usable("llama-bench", ["-m", models[0], "-p", "16", "-n", "0", "-r", "1"]))
    common = ["-t", a.threads, "-r", a.repetitions, "-p", a.n_prompt, "-n", a.n_gen, "-d", a.depth,
              "-ctk", a.cache_type_k, "-ctv", a.cache_type_v, "-o", "json"]
    if a.flash_attn is not None:
        common += ["-fa", a.flash_attn]
    samples: dict[tuple[str, str, str], list[float]] = {}
    progs: list[tuple[str, str, dict | None]] = [("llama.cpp", lb, None), ("pyllama", "", None)]
    if a.baseline:
        penv = dict(os.environ)
        benv = dict(penv, PYTHONPATH=a.baseline + os.pathsep + penv.get("PYTHONPATH", ""))
        for kv in a.baseline_env:
            k, eq, v = kv.partition("=")
            if not eq or not k:
                ap.error(f"--baseline-env wants KEY=VALUE, got {kv!r}")
            benv[k] = v
        progs.append(("baseline", "", benv))
    a.rounds = n_rounds(ap, a.rounds, len(progs))
    for rnd in range(a.rounds):
        for m in models:
            for prog, exe, env in round_order(progs, rnd):
                cmd = [exe, "-m", m, *common] if exe else [sys.executable, "-m", "pyllama", "bench", "-m", m, *common]
                for r in run_json(cmd, env):
                    samples.setdefault((Path(m).name, key(r), prog), []).extend(r["samples_ts"])
    extra = (" baseline t/s | baseline ratio |", "---:|---:|") if a.baseline else ("", "")
    print(f"\n| model | test | llama.cpp t/s | pyllama t/s | ratio |{extra[0]}\n|---|---|---:|---:|---:|{extra[1]}")
    for m in models:
        name = Path(m).name
        tests = sorted({t for (mm, t, _) in samples if mm == name}, key=lambda t: (t[:2] != "pp", t))
        for t in tests:
            ref = statistics.median(samples[(name, t, "llama.cpp")])
            ours = statistics.median(samples[(name, t, "pyllama")])
            row = f"| {name} | {t} | {ref:.1f} | {ours:.1f} | {ours / ref:.2f}x |"
            if a.baseline:
                base = statistics.median(samples[(name, t, "baseline")])
                row += f" {base:.1f} | {base / ref:.2f}x |"
            print(row)


if __name__ == "__main__":
    main()
