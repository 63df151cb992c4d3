"""Where the time goes inside a pyllama run, by kind of work, from `perf` samples.

Runs a command (default: ``pyllama bench`` on one model, tg or pp) under
``perf record`` (CPU-clock sampling of every thread: the caller and the pool's workers),
then folds the per-symbol percentages into categories: matmul by weight type (the
``dot_<type>`` / ``one_<type>`` kernels of quant/avx2.rs and their _ref twins), the
activation quantization (``quantize_q8_*``), attention (ops::attention and the f16
vector helpers it uses), norms / rope / activations, the thread pool's waiting, Python
and numpy, and the rest.

    flock /tmp/bench.lock python benchmarks/perf_breakdown.py -m MODEL --test tg [-n 64] [--top 25]
    python benchmarks/perf_breakdown.py --cmd "pyllama generate -m MODEL -n 64 --ignore-eos -p Hi"

Needs ``perf`` (linux-tools) and perf_event_paranoid <= 2. The pyllama build keeps its
symbols (release, not stripped), so the kernels show under their own names.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections import defaultdict

# first match wins
CATEGORIES = [
    # (the packed / pair / row-block prefill kernels and the row-block repack included)
    ("matmul {t}", re.compile(r"quant::\w+::(?:(?:dot|one|vec_dot|gemm|tile|packed|pair|repack|rows)_?)?(q\d_k|q\d_\d|q\d_0|iq4_nl|iq4_xs|bf16|f16|f32)", re.I)),
    # the column-lane prefill kernels of Q4_0/Q5_0 (lanes_signed) and Q4_1/Q5_1 (lanes_min)
    ("matmul (column lanes)", re.compile(r"quant::avx2_rb::(?:lanes_|decode_lanes)")),
    # the AVX-512 kernels over rows decoded once per matmul (any 32-element type): two rows
    # (min family) or interleaved row pairs (signed family: quad_one / quad_two)
    ("matmul (decoded pairs)", re.compile(r"quant::avx2_rb::(?:pair_min_decoded|quad_)")),
    ("matmul (driver)", re.compile(r"ops::matmul")),
    ("quantize activations", re.compile(r"quant::\w+::quantize_")),
    ("attention", re.compile(r"ops::attention|ops::vec::|dot_f16|axpy_f|mad_f16|scale_f16")),
    ("norm/rope/act", re.compile(r"ops::(norm|rope|act)|gelu|silu|rms_norm|RopeParams|expf|tanhf")),
    # the pool's worker loop is inlined into the thread's entry (__rust_begin_short_backtrace):
    # samples there are a worker spinning for the next parallel region
    ("thread pool wait", re.compile(r"threadpool|spin_loop|futex|sched_yield|__rust_begin_short_backtrace|"
                                    r"\[k\] (__schedule|do_sched_yield|finish_task_switch|do_syscall_64|_raw_spin)")),
    ("python GC", re.compile(r"gc_collect|visit_decref|visit_reachable|subtract_refs|move_unreachable")),
    ("numpy BLAS threads", re.compile(r"blas_thread_server")),
    ("kv cache / batch", re.compile(r"kv_cache|context::Context|load_ubatch")),
    ("forward glue (Step, decoder)", re.compile(r"ops::decoder|models::|context::Step")),
    ("python / numpy", re.compile(r"_Py|Py[A-Z]|libpython|python3|numpy|_multiarray|ufunc|npy_|PyArray")),
    ("memcpy/memset", re.compile(r"mem(cpy|set|move)|__memcpy|__memset")),
    ("kernel", re.compile(r"^\[k\]|\[kernel")),
]


def categorize(sym: str) -> str:
    for name, rx in CATEGORIES:
        m = rx.search(sym)
        if m:
            return name.format(t=m.group(1).upper()) if "{t}" in name else name
    return "other"


def parse_report(text: str) -> list[tuple[float, str]]:
    """(percent, symbol) rows of ``perf report --stdio --no-children --sort sym``."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\[[.k]\])\s+(.*)$", line)
        if m:
            sym = m.group(3).strip()
            if m.group(2) == "[k]":
                sym = "[k] " + sym
            rows.append((float(m.group(1)), sym))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", help="GGUF file for the default pyllama bench command")
    ap.add_argument("--test", choices=["tg", "pp"], default="tg")
    ap.add_argument("-n", type=int, default=64, help="tokens for tg / pp")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--cmd", help="run this command instead of pyllama bench")
    ap.add_argument("--freq", type=int, default=1999)
    ap.add_argument("--top", type=int, default=20, help="also list the top N symbols")
    args = ap.parse_args()
    if args.cmd:
        cmd = shlex.split(args.cmd)
    else:
        if not args.model:
            ap.error("give -m MODEL or --cmd")
        p, n = (0, args.n) if args.test == "tg" else (args.n, 0)
        cmd = [sys.executable, "-m", "pyllama", "bench", "-m", args.model, "-p", str(p), "-n", str(n),
               "-r", "3", "-t", str(args.threads)]
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "perf.data")
        subprocess.run(["perf", "record", "-F", str(args.freq), "-o", data, "--"] + cmd,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rep = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "--sort", "sym"],
                             check=True, capture_output=True, text=True).stdout
    rows = parse_report(rep)
    cats: dict[str, float] = defaultdict(float)
    for pct, sym in rows:
        cats[categorize(sym)] += pct
    print(f"command: {' '.join(cmd)}")
    print("| category | % of samples |\n|---|---:|")
    for name, pct in sorted(cats.items(), key=lambda kv: -kv[1]):
        if pct >= 0.05:
            print(f"| {name} | {pct:.1f} |")
    if args.top:
        print(f"\ntop {args.top} symbols:")
        for pct, sym in rows[: args.top]:
            print(f"  {pct:6.2f}%  {sym[:110]}")


if __name__ == "__main__":
    main()
