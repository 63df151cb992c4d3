#!/usr/bin/env python3
"""pyllama against llama.cpp per x86 CPU class, on one machine.

A CPU class is a set of instructions: what a wheel meets on a Haswell-class AVX2 server, an
Alder Lake client (AVX2 + AVX-VNNI), an AVX-512 Skylake-X or Ice Lake Xeon, an AMD Zen 4. One
machine that has the widest set can run each narrower class's code: pyllama through
``PYLLAMA_KERNELS`` (its kernel set), llama.cpp through the CPU backend built for that class.
llama.cpp's own packaging does the same (``GGML_CPU_ALL_VARIANTS`` builds one libggml-cpu per
class, with the flag lists below); here each class's libggml-cpu is built from the
llama-cpp-python 0.3.36 sdist into ``~/.cache/pyllama/llama.cpp/cls-<class>`` and put in front
of the base llama-bench (the haswell build) with ``LD_LIBRARY_PATH``; the libggml-base built
beside it (same sources, the class's flags) comes along. libllama holds no class-specific
kernels.

Microarchitecture is not emulated: the ratios say how pyllama's code for a class compares with
llama.cpp's code for that class on this machine's cores.

    python benchmarks/compare_classes.py [--classes haswell,alderlake,...] [compare_llamacpp options]

Options it does not know are passed to benchmarks/compare_llamacpp.py (``-r 3 --rounds 2``, ``-m``,
``-p``, ``-n``, ...), which alternates the two programs and prints a table per class; a summary
table of all classes ends the output.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from compare_llamacpp import CACHE, build_llama_bench, cpu_flags  # noqa: E402

_BASE = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_F16C=ON", "-DGGML_FMA=ON", "-DGGML_AVX2=ON", "-DGGML_BMI2=ON"]
_ICL = ["-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON"]

# name -> (pyllama kernel set, extra ggml flags over haswell's, CPU flags the class needs, what it is)
# (ggml/src/CMakeLists.txt: ggml_add_cpu_backend_variant lists; on Skylake-X, AVX-512 without
# VNNI, pyllama runs its avx512bw set)
CLASSES: dict[str, tuple[str, list[str], list[str], str]] = {
    "haswell": ("avx2", [], ["avx2", "fma", "f16c"], "AVX2 (CI's CPUs, most clouds' oldest)"),
    "alderlake": ("avx2vnni", ["-DGGML_AVX_VNNI=ON"], ["avx2", "avx_vnni"], "AVX2 + AVX-VNNI (Intel client)"),
    "skylakex": ("avx512bw", ["-DGGML_AVX512=ON"], ["avx512f", "avx512bw", "avx512vl", "avx512dq"], "AVX-512 without VNNI (Intel Xeon Skylake-SP)"),
    "icelake": ("avx512", _ICL, ["avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi"], "AVX-512 + VNNI (Intel Xeon Ice Lake)"),
    "zen4": ("avx512", [*_ICL, "-DGGML_AVX512_BF16=ON"], ["avx512f", "avx512_vnni", "avx512_bf16"], "AVX-512 + VNNI + BF16 (AMD Zen 4/5)"),
}


def _cmake() -> str:
    bindir = str(Path(sys.executable).parent)
    return shutil.which("cmake") or shutil.which("cmake", path=bindir) or "cmake"


def class_build(name: str) -> Path:
    """cls-<name>/bin: haswell's has llama-bench and all of llama.cpp; the others only libggml-cpu."""
    build = CACHE / f"cls-{name}"
    target = "llama-bench" if name == "haswell" else "ggml-cpu"
    done = build / "bin" / ("llama-bench" if name == "haswell" else "libggml-cpu.so")
    if done.exists():
        return build / "bin"
    build_llama_bench()  # makes sure the sdist is unpacked (and the native build exists for compare_llamacpp)
    root = next((CACHE / "src").glob("llama_cpp_python-*")) / "vendor" / "llama.cpp"
    ninja = shutil.which("ninja") or shutil.which("ninja", path=str(Path(sys.executable).parent))
    gen = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"] if ninja and not (build / "CMakeCache.txt").exists() else []
    print(f"building llama.cpp's {target} for {name} in {build} ...", file=sys.stderr, flush=True)
    subprocess.run([_cmake(), "-S", str(root), "-B", str(build), *gen, "-DCMAKE_BUILD_TYPE=Release",
                    "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_SERVER=OFF", *_BASE, *CLASSES[name][1]], check=True)
    subprocess.run([_cmake(), "--build", str(build), "-j", str(os.cpu_count() or 2), "--target", target], check=True)
    return build / "bin"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--classes", default=",".join(CLASSES), help=f"comma-separated, from {', '.join(CLASSES)}")
    a, rest = ap.parse_known_args()
    wanted = [c.strip() for c in a.classes.split(",") if c.strip()]
    unknown = [c for c in wanted if c not in CLASSES]
    if unknown:
        ap.error(f"unknown class {', '.join(unknown)}; known: {', '.join(CLASSES)}")
    have = cpu_flags()
    base = class_build("haswell")
    rows: list[tuple[str, str]] = []
    for name in wanted:
        kset, _, needs, what = CLASSES[name]
        missing = [f for f in needs if f not in have]
        if missing:
            print(f"\n## {name}: skipped, this CPU lacks {', '.join(missing)}", flush=True)
            continue
        lib = class_build(name)
        env = dict(os.environ, PYLLAMA_KERNELS=kset, LD_LIBRARY_PATH=os.pathsep.join(
            [str(lib), os.environ.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep))
        print(f"\n## {name}: {what}; pyllama PYLLAMA_KERNELS={kset}, llama.cpp {lib}/libggml-cpu.so", flush=True)
        out = subprocess.run([sys.executable, str(HERE / "compare_llamacpp.py"), "--llama-bench",
                              str(base / "llama-bench"), *rest], env=env, check=True, capture_output=True, text=True)
        sys.stderr.write(out.stderr)
        table = [ln for ln in out.stdout.splitlines() if ln.startswith("| ") and not ln.startswith("| model")]
        print(out.stdout, flush=True)
        rows += [(name, ln) for ln in table]
    head = "| class | model | test | llama.cpp t/s | pyllama t/s | ratio |"
    rule = "|---|---|---|---:|---:|---:|"
    if any(r == "--baseline" or r.startswith("--baseline=") for r in rest):
        # compare_llamacpp's rows carry the baseline's two columns then
        head += " baseline t/s | baseline ratio |"
        rule += "---:|---:|"
    print(f"\n{head}\n{rule}")
    for name, ln in rows:
        print(f"| {name} {ln}")


if __name__ == "__main__":
    main()
