"""Mirostat v1 / v2 against llama.cpp's own token streams.

tests/data/sampling/mirostat_reference.json holds what llama.cpp (0c1e570, x86-64, glibc,
libstdc++) selects with llama_sampler_init_mirostat / _v2 for 5 seeds x 6 (tau, eta, m)
settings and 5 seeds x 4 (tau, eta) settings on the 78 logit rows of mirostat_logits.npy
(made and run by tools/mirostat_reference.py + .cpp), plus "r" runs that reset the sampler
before every row. The first 64 rows include single-candidate steps (one token far ahead),
nearly flat rows and rows with a few finite logits, so the stream only stays aligned when
every branch draws exactly as llama.cpp does; the last 14 are rows where float32 and
float64 (or numpy's and libm's float functions) give a different v1 k or v2 cut.
"""

from __future__ import annotations

import json
import math
import platform
from pathlib import Path

import numpy as np
import pytest

from pyllama import llama_api as L
from pyllama import sampling as S
from pyllama.sampling import TokenDataArray

DATA = Path(__file__).parents[1] / "data" / "sampling"
REF = json.loads((DATA / "mirostat_reference.json").read_text())
LOGITS = np.load(DATA / "mirostat_logits.npy")
N_VOCAB = REF["n_vocab"]
N_PLAIN = REF["n_steps"] - REF["n_edge_rows"]
# The reference is llama.cpp on x86-64 with glibc. Elsewhere llama.cpp itself gives other
# streams: int(k) of an overflowed k saturates on aarch64 (pyllama does the same there),
# and another libm rounds the edge rows differently; off glibc only the first N_PLAIN rows
# of the plain runs are compared.
X86 = S._X86
GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def _sampler(spec: str):
    parts = spec.split(":")
    if parts[0].startswith("1"):
        _, seed, tau, eta, m = parts
        return L.llama_sampler_init_mirostat(N_VOCAB, int(seed), float(tau), float(eta), int(m))
    _, seed, tau, eta = parts
    return L.llama_sampler_init_mirostat_v2(int(seed), float(tau), float(eta))


def _stream(spec: str):
    """(tokens, candidates left, p of the token) for every row; "1r" / "2r" runs reset the
    sampler before each row (mu back to 2 * tau, rng reseeded), as llama_sampler_reset."""
    smpl = _sampler(spec)
    reset = spec.split(":")[0].endswith("r")
    toks, sizes, probs = [], [], []
    for row in LOGITS:
        if reset:
            L.llama_sampler_reset(smpl)
        cur = TokenDataArray(np.arange(N_VOCAB), row)  # unsorted, as llama.cpp's array
        L.llama_sampler_apply(smpl, cur)
        assert 0 <= cur.selected < cur.size
        tok = int(cur.ids[cur.selected])
        toks.append(tok)
        sizes.append(cur.size)
        probs.append(float(cur.p[cur.selected]))
        L.llama_sampler_accept(smpl, tok)
    return toks, sizes, probs


def test_reference_covers_the_interesting_branches():
    runs = REF["runs"]
    assert sum(s.startswith("1:") for s in runs) >= 20 and sum(s.startswith("2:") for s in runs) >= 20
    for spec, r in runs.items():
        assert len(r["tokens"]) == LOGITS.shape[0] == REF["n_steps"] >= 64 + REF["n_edge_rows"]
    # single-candidate steps (the draw llama.cpp skips) in every run, and wide ones too
    assert all(1 in r["sizes"] for r in runs.values())
    assert all(max(r["sizes"]) > 1 for spec, r in runs.items() if not spec.endswith(":1"))


@pytest.mark.skipif(not X86, reason="reference recorded on x86-64 (int(k) of inf differs on this CPU)")
@pytest.mark.parametrize("spec", sorted(REF["runs"]))
def test_token_stream_matches_llama_cpp(spec):
    ref = REF["runs"][spec]
    toks, sizes, probs = _stream(spec)
    if not GLIBC:
        if spec.split(":")[0].endswith("r"):
            pytest.skip("edge rows: reference made with glibc's libm")
        ref = {k: v[:N_PLAIN] for k, v in ref.items()}
        toks, sizes, probs = toks[:N_PLAIN], sizes[:N_PLAIN], probs[:N_PLAIN]
    first = next((i for i, (a, b) in enumerate(zip(toks, ref["tokens"])) if a != b), None)
    assert first is None, (
        f"{spec}: token stream leaves llama.cpp's at step {first} "
        f"(pyllama {toks[first]} with {sizes[first]} candidates, "
        f"llama.cpp {ref['tokens'][first]} with {ref['sizes'][first]})")
    assert sizes == ref["sizes"], spec
    # probabilities of the selected candidate: same float32 operations, libm may differ in
    # the last place
    np.testing.assert_allclose(probs, ref["p"], rtol=1e-5, atol=0)


def test_clone_continues_the_same_stream():
    spec = "2:42:3.0:0.5"
    smpl = _sampler(spec)
    rows = iter(LOGITS)
    for _ in range(10):
        cur = TokenDataArray(np.arange(N_VOCAB), next(rows))
        smpl.apply(cur)
        smpl.accept(int(cur.ids[cur.selected]))
    twin = smpl.clone()
    for row in rows:
        a, b = TokenDataArray(np.arange(N_VOCAB), row), TokenDataArray(np.arange(N_VOCAB), row)
        smpl.apply(a)
        twin.apply(b)
        assert a.ids[a.selected] == b.ids[b.selected]


def test_single_candidate_consumes_no_random_numbers():
    """libstdc++'s discrete_distribution with < 2 weights returns 0 without drawing."""
    rng = S._StdRng(7)
    ctl = S._StdRng(7)
    assert rng.discrete(np.array([1.0], np.float32)) == 0
    assert rng.next_u32() == ctl.next_u32()
    # two weights draw one uniform double (two 32-bit outputs)
    rng.discrete(np.array([0.5, 0.5], np.float32))
    ctl.uniform_double()
    assert rng.next_u32() == ctl.next_u32()


def test_k_conversion_follows_the_cpu():
    """int(k) for NaN / out-of-range k is what the CPU's conversion gives: x86-64's cvttss2si
    returns INT_MIN (then max(k, 1) = 1); aarch64's fcvtzs saturates (NaN -> 0)."""
    for k, x86, arm in [(math.nan, 1, 1), (math.inf, 1, 2**31 - 1), (3e9, 1, 2**31 - 1),
                        (-math.inf, 1, 1), (7.9, 7, 7), (0.3, 1, 1), (-2.5, 1, 1)]:
        assert S._mirostat_k(np.float32(k), "x86_64") == x86, k
        assert S._mirostat_k(np.float32(k), "aarch64") == arm, k


def test_float_functions_are_the_c_librarys():
    """The vectorized expf / logf / log2f give libm's float result for every argument (numpy
    decides only where it cannot differ), including arguments near 1 where glibc's logf is
    most often not correctly rounded."""
    libm = S._libm()
    if not libm:
        pytest.skip("no C library float functions to compare with")
    rng = np.random.default_rng(5)
    cases = [("expf", S._expf, -np.abs(rng.standard_normal(20000) * 10)),
             ("logf", S._logf, 1.0 + rng.random(20000) * 0.1),
             ("logf", S._logf, rng.random(20000) * 100),
             ("log2f", S._log2f, rng.random(20000))]
    for name, fn, x in cases:
        x = x.astype(np.float32)
        want = np.array([libm[name](v) for v in x.tolist()], np.float32)
        np.testing.assert_array_equal(fn(x), want, err_msg=name)
    assert S._powf(2.0, 10.5) == np.float32(libm["powf"](2.0, 10.5))
