"""`pyllama verify`. Without llama.cpp (CI builds none): the errors for a missing,
unloadable or foreign library, the flags, and the comparison arithmetic run with pyllama on
both sides (agreement 100%, KL 0, perplexity equal to `pyllama perplexity`'s). Where a
llama.cpp build exists ($PYLLAMA_LLAMA_CPP_DIR, else ~/.cache/pyllama/llama.cpp/build-avx2),
the real comparison on SmolLM2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pyllama import verify as V
from pyllama.cli import app

runner = CliRunner()
LLAMA_CPP_DIR = Path(os.environ.get("PYLLAMA_LLAMA_CPP_DIR", Path.home() / ".cache/pyllama/llama.cpp/build-avx2"))


def _err(r):
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output and not (r.exception and not isinstance(r.exception, SystemExit))
    return r.output


def test_missing_library_is_one_line(tmp_path, smollm2_path):
    out = _err(runner.invoke(app, ["verify", "-m", str(smollm2_path), "--llama-cpp", str(tmp_path / "nope")]))
    assert "error: --llama-cpp" in out and "no such directory" in out
    out = _err(runner.invoke(app, ["verify", "-m", str(smollm2_path), "--llama-cpp", str(tmp_path)]))
    assert f"no libllama in {tmp_path}" in out and "BUILD_SHARED_LIBS" in out


def test_unloadable_and_foreign_libraries(tmp_path, smollm2_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "libllama.so").write_bytes(b"not an ELF file")
    out = _err(runner.invoke(app, ["verify", "-m", str(smollm2_path), "--llama-cpp", str(bad)]))
    assert "cannot load" in out and "libllama.so" in out
    foreign = tmp_path / "foreign" / "bin"
    foreign.mkdir(parents=True)
    import pyllama._core as core

    (foreign / "libllama.so").symlink_to(core.__file__)  # a shared library, but not llama.cpp
    out = _err(runner.invoke(app, ["verify", "-m", str(smollm2_path), "--llama-cpp", str(foreign.parent)]))
    assert "is not a llama.cpp this version of pyllama can drive" in out and "llama_backend_init" in out


def test_without_llama_cpp_python_it_says_what_to_do(smollm2_path):
    code = ("import importlib.util, sys\n"
            "if importlib.util.find_spec('llama_cpp') is not None: print('SKIP'); sys.exit(0)\n"
            "from pyllama.cli import app; app(['verify', '-m', sys.argv[1]])")
    r = subprocess.run([sys.executable, "-c", code, str(smollm2_path)], capture_output=True, text=True, timeout=120)
    if r.stdout.strip() == "SKIP":
        pytest.skip("llama-cpp-python is installed here")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "no llama.cpp to compare with: pass --llama-cpp DIR" in r.stderr and r.stderr.count("\n") == 1


def test_usage_errors(smollm2_path):
    r = runner.invoke(app, ["verify", "-m", str(smollm2_path), "-c", "4"])
    assert r.exit_code == 2 and "-c" in r.output
    r = runner.invoke(app, ["verify", "-m", str(smollm2_path), "-f", "/nonexistent/text"])
    assert r.exit_code == 2 and "cannot read" in r.output


class _Pyllama2(V.Pyllama):
    """pyllama as the reference too: what the report says when both engines agree."""


def test_compare_arithmetic_with_pyllama_on_both_sides(smollm2_path, tmp_path):
    a = V.Pyllama(smollm2_path, n_ctx=1024, n_batch=512, n_threads=0)
    b = _Pyllama2(smollm2_path, n_ctx=1024, n_batch=64, n_threads=0)  # another batch split: batch-invariant
    rep = V.compare(a, b, prompts=V.DEFAULT_PROMPTS[:3], text=V.DEFAULT_TEXT, n_ctx=64)
    o = rep.overall
    assert o.top1 == o.n == sum(p["tokens"] for p in rep.prompts) + rep.text["chunks"] * 64
    assert o.kl_max == 0.0 and o.dlogit_max == 0.0 and rep.tokenize_same == 3
    t = rep.text
    assert t["ppl_llama_cpp"] == t["ppl_pyllama"] and t["chunks"] == t["tokens"] // 64
    assert t["scored"] == t["chunks"] * (64 - 1 - 32)
    # the same perplexity as `pyllama perplexity` (llama-perplexity's method) on that text
    f = tmp_path / "text.txt"
    f.write_text(V.DEFAULT_TEXT)
    r = runner.invoke(app, ["perplexity", "-m", str(smollm2_path), "-f", str(f), "-c", "64"])
    assert r.exit_code == 0, r.output
    ppl = float(re.search(r"Final estimate: PPL = ([0-9.]+)", r.output)[1])
    assert t["ppl_pyllama"] == pytest.approx(ppl, abs=5e-4)  # it prints 4 decimals


def test_kl_and_top1_of_known_logits():
    ref = V.np.array([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]], dtype=V.np.float32)
    got = V.np.array([[0.0, 2.5, 2.0], [3.0, 0.0, 0.5]], dtype=V.np.float32)
    c = V.Compare().add(ref, got)
    assert c.n == 2 and c.top1 == 1 and c.dlogit_max == 1.5
    r0, g0 = ref[0].astype(V.np.float64), got[0].astype(V.np.float64)
    p, q = V.np.exp(r0) / V.np.exp(r0).sum(), V.np.exp(g0) / V.np.exp(g0).sum()
    assert c.kl_max == pytest.approx(float((p * V.np.log(p / q)).sum()), rel=1e-9)


@pytest.mark.skipif(not any((LLAMA_CPP_DIR / s / "libllama.so").is_file() for s in ("", "bin")),
                    reason=f"no llama.cpp build at {LLAMA_CPP_DIR} (set PYLLAMA_LLAMA_CPP_DIR)")
def test_real_comparison_with_llama_cpp(smollm2_path):
    """llama.cpp's logits against pyllama's under PYLLAMA_ORDER=llamacpp (llama.cpp's float
    order): the same tokens, the same top-1 everywhere, and a perplexity within 0.1%."""
    env = {**os.environ, "PYLLAMA_ORDER": "llamacpp"}
    r = subprocess.run([sys.executable, "-m", "pyllama", "verify", "-m", str(smollm2_path), "--llama-cpp",
                        str(LLAMA_CPP_DIR), "-p", "The capital of France is", "-p", "def f(x):\n    return",
                        "-c", "64", "-t", "2", "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["float_order"] == "llamacpp" and rep["llama_cpp_library"].endswith("libllama.so")
    assert rep["tokenization_agree"] == 2 and rep["text"]["same_tokens"]
    o = rep["overall"]
    assert o["top1_agree"] == o["positions"] and o["kl_mean"] < 1e-4, o
    t = rep["text"]
    assert t["ppl_pyllama"] == pytest.approx(t["ppl_llama_cpp"], rel=1e-3)


@pytest.mark.skipif(not any((LLAMA_CPP_DIR / s / "libllama.so").is_file() for s in ("", "bin")),
                    reason=f"no llama.cpp build at {LLAMA_CPP_DIR} (set PYLLAMA_LLAMA_CPP_DIR)")
def test_flags_change_the_report(smollm2_path, tmp_path):
    """--prompts adds its lines to the -p prompts, -f and -c set the perplexity text and its
    chunks; the text report follows them."""
    (tmp_path / "prompts.txt").write_text("Hello\n\nThe sky is\n")
    (tmp_path / "text.txt").write_text(V.DEFAULT_TEXT[:1200])
    r = runner.invoke(app, ["verify", "-m", str(smollm2_path), "--llama-cpp", str(LLAMA_CPP_DIR), "-p", "Hi there",
                            "--prompts", str(tmp_path / "prompts.txt"), "-f", str(tmp_path / "text.txt"),
                            "-c", "32", "-t", "2", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert [p["prompt"] for p in rep["prompts"]] == ["Hi there", "Hello", "The sky is"]
    t = rep["text"]
    assert t["n_ctx"] == 32 and t["chunks"] == t["tokens"] // 32 and t["tokens"] < 300
    r = runner.invoke(app, ["verify", "-m", str(smollm2_path), "--llama-cpp", str(LLAMA_CPP_DIR), "-p", "x",
                            "-f", str(tmp_path / "text.txt"), "-c", "512"])
    assert r.exit_code == 1 and "needs at least 1024" in r.output
    r = runner.invoke(app, ["verify", "-m", str(smollm2_path), "--llama-cpp", str(LLAMA_CPP_DIR), "-p", "Hi"])
    assert r.exit_code == 0 and "top-1 agreement :" in r.stdout and "perplexity      : llama.cpp" in r.stdout


def test_llama_cpp_python_library_is_found(tmp_path, smollm2_path):
    """Without --llama-cpp, the libllama inside an installed llama_cpp package (llama-cpp-python
    ships it in llama_cpp/lib/) is used; here a stand-in package whose library is not one."""
    pkg = tmp_path / "site" / "llama_cpp"
    (pkg / "lib").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('verify must not import llama_cpp')\n")
    (pkg / "lib" / "libllama.so").write_bytes(b"\x7fELF but not really")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    r = subprocess.run([sys.executable, "-m", "pyllama", "verify", "-m", str(smollm2_path), "-p", "x"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"cannot load {pkg / 'lib' / 'libllama.so'}" in r.stderr
