"""`pyllama perplexity`: llama-perplexity's arithmetic, chunking and output format.

The math is checked against a direct float64 formula; the chunked pipeline against an
independent decode of each chunk; the CLI's output format against llama-perplexity's; and
the full acceptance numbers (about 20 s per model on 2 cores): within 0.5% of
llama.cpp's PPL on text-gpl3.txt with -c 256 -b 256 --chunks 16 (23.3681 SmolLM2,
19.0860 Gemma 3; llama.cpp itself moves ~0.05% between its own settings).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pyllama.cli import app
from pyllama.cli.perplexity import nll_of_rows, perplexity
from pyllama.generation import Session, load_model

TEXT = Path(__file__).parents[1] / "data" / "perplexity" / "text-gpl3.txt"


def test_nll_of_rows_matches_direct_formula():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((7, 1000)) * 4).astype(np.float32)
    targets = rng.integers(0, 1000, 7)
    got = nll_of_rows(logits, targets)
    x = logits.astype(np.float64)
    want = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) - (x[np.arange(7), targets] - x.max(1))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def _tiny_path(tmp_path_factory):
    import importlib.util

    import gguf

    spec = importlib.util.spec_from_file_location("make_tiny", Path(__file__).parents[1] / "data" / "make_tiny.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    orig = gguf.GGUFWriter.add_token_merges
    with pytest.MonkeyPatch.context() as mp:
        # one merge: GGUF drops the empty list and a BPE vocabulary needs the key
        mp.setattr(gguf.GGUFWriter, "add_token_merges", lambda self, m: orig(self, list(m) or ["< t"]))
        return mod.write_tiny("llama", tmp_path_factory.mktemp("tiny_ppl"))


def test_chunked_perplexity_equals_independent_decode(tmp_path_factory):
    model = load_model(_tiny_path(tmp_path_factory))
    n_ctx = 64
    sess = Session(model, n_ctx=256, n_batch=256)
    rng = np.random.default_rng(3)
    tokens = rng.integers(2, 2048, 3 * n_ctx + 10).astype(np.int32)
    seen = []
    ppl, err = perplexity(sess.ctx, tokens, n_ctx, 16, -1, add_bos=True, bos=1,
                          on_chunk=lambda i, n, p, dt: seen.append((i, n, p)))
    assert [s[:2] for s in seen] == [(0, 3), (1, 3), (2, 3)]
    # independent: each chunk decoded in one batch with every row, BOS first, second half scored
    nll = []
    for c in range(3):
        chunk = tokens[c * n_ctx:(c + 1) * n_ctx].copy()
        chunk[0] = 1
        sess.ctx.memory_clear(True)
        sess.ctx.decode(chunk, logits_all=True)
        rows = np.array(sess.ctx.logits, dtype=np.float64)
        for p in range(n_ctx // 2, n_ctx - 1):
            r = rows[p]
            nll.append(np.log(np.exp(r - r.max()).sum()) - (r[tokens[c * n_ctx + p + 1]] - r.max()))
    assert len(nll) == 3 * (n_ctx - n_ctx // 2 - 1)
    # F32 weights; batches of 16 vs one batch of 64 only reorder float sums
    assert ppl == pytest.approx(math.exp(np.mean(nll)), rel=1e-4)
    assert seen[-1][2] == pytest.approx(ppl)
    assert err > 0
    with pytest.raises(ValueError, match="at least 256 tokens"):
        perplexity(sess.ctx, tokens[:200], 128, 128, add_bos=True, bos=1)


def test_cli_output_format(smollm2_path, tmp_path):
    text = TEXT.read_text(encoding="utf-8")[:3000]
    f = tmp_path / "t.txt"
    f.write_text(text, encoding="utf-8")
    r = CliRunner().invoke(app, ["perplexity", "-m", str(smollm2_path), "-f", str(f), "-c", "64", "-b", "64",
                                 "--chunks", "2"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.strip().splitlines()
    assert re.fullmatch(r"\[1\]\d+\.\d{4},\[2\]\d+\.\d{4},", lines[-2]), lines
    m = re.fullmatch(r"Final estimate: PPL = (\d+\.\d{4}) \+/- (\d+\.\d{5})", lines[-1])
    assert m, lines
    assert float(m.group(1)) == pytest.approx(float(lines[-2].split("]")[-1].rstrip(",")), abs=1e-4)
    assert "calculating perplexity over 2 chunks, n_ctx=64, batch_size=64, n_seq=1" in r.stderr


def test_cli_errors(smollm2_path, tmp_path):
    f = tmp_path / "short.txt"
    f.write_text("too short", encoding="utf-8")
    r = CliRunner().invoke(app, ["perplexity", "-m", str(smollm2_path), "-f", str(f), "-c", "64"])
    assert r.exit_code == 1 and "you need at least 128 tokens" in r.stderr
    r = CliRunner().invoke(app, ["perplexity", "-m", str(tmp_path / "nope.gguf"), "-f", str(f)])
    assert r.exit_code == 1 and "model file not found" in r.stderr


@pytest.mark.parametrize("model,expected", [("smollm2", 23.3681), ("gemma3", 19.0860)])
def test_acceptance_within_half_percent_of_llama_cpp(model, expected, smollm2_path, gemma3_path):
    path = {"smollm2": smollm2_path, "gemma3": gemma3_path}[model]
    r = CliRunner().invoke(app, ["perplexity", "-m", str(path), "-f", str(TEXT), "-c", "256", "-b", "256",
                                 "--chunks", "16"])
    assert r.exit_code == 0, r.output
    ppl = float(re.search(r"Final estimate: PPL = (\d+\.\d+)", r.stdout).group(1))
    assert abs(ppl - expected) / expected < 0.005, ppl
