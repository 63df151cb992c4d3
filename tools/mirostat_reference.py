"""Regenerate tests/data/sampling/mirostat_{logits.npy,reference.json}: llama.cpp's mirostat
v1 / v2 token streams on fixed logit rows (see tools/mirostat_reference.cpp).

    python tools/mirostat_reference.py --llama-src vendor/llama.cpp \
        --llama-lib /work/cache/llama-build/bin [--bin /work/cache/mirostat_reference]

The logit rows mix the shapes that reach every branch of the samplers: one token far ahead
(mirostat v1 truncates to k = 1, v2 keeps one candidate: the single-candidate draw), two
close leaders, language-model-like rows, Zipf rows, nearly flat rows (v1's k overflows to
inf, which llama.cpp's int(k) turns into k = 1 on x86-64) and rows with only a few finite
logits (v1's slope estimate becomes NaN). Finite logits within a row are distinct, so the
order of llama.cpp's unstable sort cannot matter.

After those N_STEPS rows come boundary rows, found by searching for rows where float32 and
float64 evaluations of the same formulas disagree: Zipf rows whose v1 k at mu = 10 lies
within float32 rounding of an integer, and rows whose second token has p within float32
rounding of 2^-10 (v2 keeps one or two candidates at mu = 10). The "r" runs reset the
sampler before every row, so each boundary row is sampled with mu = 2 * tau = 10.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "sampling"
N_VOCAB = 512
N_STEPS = 64
SEEDS = [0, 1, 42, 1234, 3735928559]
V1 = [(5.0, 0.1, 100), (3.0, 0.5, 100), (8.0, 0.2, 100), (2.0, 1.0, 10), (5.0, 0.1, 0), (6.0, 0.3, 1)]
V2 = [(5.0, 0.1), (3.0, 0.5), (8.0, 0.2), (1.5, 1.0)]
RESET_SEEDS = [3, 99]
# a * zipf(rng 7): v1's k at mu = 10 is within float32 rounding of an integer
V1_EDGE_A = [np.linspace(0.8, 1.6, 200001)[i]
             for i in (5900, 11971, 16259, 19611, 21914, 41877, 47733, 49901, 49902)]
# token 1 of a row with token 0 at 0 and the rest near -12 (rng 11): p(1) ~ 2^-10
V2_EDGE_X = np.float32(-6.925326824188232)
KINDS = ["peaked", "lm", "flat", "peaked", "zipf", "masked", "two", "lm", "peaked", "flat"]


def make_logits(seed: int = 2024) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(N_STEPS):
        kind = KINDS[s % len(KINDS)] if s % 7 else KINDS[rng.integers(len(KINDS))]
        x = rng.standard_normal(N_VOCAB)
        if kind == "peaked":
            x[rng.integers(N_VOCAB)] += rng.uniform(14.0, 30.0)
        elif kind == "lm":
            x = x * rng.uniform(1.5, 4.0)
        elif kind == "flat":
            x = x * rng.uniform(1e-4, 3e-2)
        elif kind == "zipf":
            a = rng.uniform(0.6, 2.0)
            x = -a * np.log(rng.permutation(N_VOCAB) + 1.0) + 1e-3 * x
        elif kind == "masked":
            keep = rng.choice(N_VOCAB, size=int(rng.integers(2, 30)), replace=False)
            y = np.full(N_VOCAB, -np.inf)
            y[keep] = 2.0 * x[keep]
            x = y
        elif kind == "two":
            i, j = rng.choice(N_VOCAB, size=2, replace=False)
            x[i] += 20.0
            x[j] += 20.0 - rng.uniform(0.0, 1.0)
        row = x.astype(np.float32)
        fin = row[np.isfinite(row)]
        assert np.unique(fin).shape[0] == fin.shape[0], "tied logits: regenerate"
        rows.append(row)
    rng = np.random.default_rng(7)
    zipf = -np.log(rng.permutation(N_VOCAB) + 1.0) + 1e-3 * rng.standard_normal(N_VOCAB)
    rows += [(a * zipf).astype(np.float32) for a in V1_EDGE_A]
    rng = np.random.default_rng(11)
    near = (rng.standard_normal(N_VOCAB) - 12).astype(np.float32)
    near[0] = 0.0
    for ulps in (-2, -1, 0, 1, 2):  # the edge value and its float32 neighbours
        row = near.copy()
        row[1] = V2_EDGE_X
        for _ in range(abs(ulps)):
            row[1] = np.nextafter(row[1], np.float32(np.inf if ulps > 0 else -np.inf))
        rows.append(row)
    return np.stack(rows)


def runs() -> list[str]:
    out = []
    for tau, eta, m in V1:
        out += [f"1:{seed}:{tau}:{eta}:{m}" for seed in SEEDS]
    for tau, eta in V2:
        out += [f"2:{seed}:{tau}:{eta}" for seed in SEEDS]
    out += [f"1r:{seed}:5.0:0.1:100" for seed in RESET_SEEDS]
    out += [f"2r:{seed}:5.0:0.1" for seed in RESET_SEEDS]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-src", required=True, type=Path, help="llama.cpp source tree")
    ap.add_argument("--llama-lib", required=True, type=Path, help="folder with libllama.so")
    ap.add_argument("--bin", type=Path, help="where to build the reference program")
    a = ap.parse_args()
    logits = make_logits()
    with tempfile.TemporaryDirectory() as tmp:
        binary = a.bin or Path(tmp) / "mirostat_reference"
        subprocess.run(["g++", "-O2", "-std=c++17", str(ROOT / "tools" / "mirostat_reference.cpp"),
                        "-I", str(a.llama_src / "include"), "-I", str(a.llama_src / "ggml" / "include"),
                        "-L", str(a.llama_lib), "-lllama", f"-Wl,-rpath,{a.llama_lib}", "-o", str(binary)],
                       check=True)
        f32 = Path(tmp) / "logits.f32"
        logits.astype("<f4").tofile(f32)
        res = subprocess.run([str(binary), str(f32), str(N_VOCAB), str(logits.shape[0]), *runs()],
                             check=True, capture_output=True, text=True)
    out = {}
    for line in res.stdout.splitlines():
        spec, *steps = line.split()
        toks, sizes, probs = [], [], []
        for st in steps:
            t, n, p = st.split(",")
            toks.append(int(t))
            sizes.append(int(n))
            probs.append(float.fromhex(p))
        out[spec] = {"tokens": toks, "sizes": sizes, "p": probs}
    DATA.mkdir(parents=True, exist_ok=True)
    np.save(DATA / "mirostat_logits.npy", logits)
    meta = {
        "source": "llama.cpp 0c1e570 src/llama-sampler.cpp via tools/mirostat_reference.cpp "
                  "(x86-64, glibc, libstdc++); regenerate with tools/mirostat_reference.py",
        "n_vocab": N_VOCAB, "n_steps": int(logits.shape[0]), "n_edge_rows": int(logits.shape[0]) - N_STEPS,
        "runs": out,
    }
    (DATA / "mirostat_reference.json").write_text(json.dumps(meta, separators=(",", ":")) + "\n")
    print(f"{len(out)} runs x {logits.shape[0]} steps -> {DATA}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
