"""`pyllama generate` and `pyllama chat` end to end on SmolLM2 (short runs: a few tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pyllama.cli import app

REF = json.loads((Path(__file__).parents[1] / "data" / "generate_reference.json").read_text(encoding="utf-8"))


def test_generate_prints_llama_cpp_greedy_text(smollm2_path):
    case = REF["models"]["smollm2"][0]  # "The capital of France is": margins > 0.8 for 5 steps
    r = CliRunner().invoke(app, ["generate", "-m", str(smollm2_path), "-p", case["prompt"], "-n", "5",
                                 "--temp", "0", "-c", "256"])
    assert r.exit_code == 0, r.output
    # llama.cpp's greedy ids 7042 30 198 198 504 detokenize to " Paris.\n\nThe"
    assert r.stdout == case["prompt"] + " Paris.\n\nThe" + "\n"
    assert "llama_perf_sampler_print:" in r.stderr and "main: decoded 5 tokens" in r.stderr
    # the rate to compare with `pyllama bench` tg: the 5 generated tokens, prompt apart
    assert "main: generation (after the prompt, end to end) = 5 tokens in" in r.stderr
    assert "; prompt = 5 tokens in" in r.stderr  # "The capital of France is": 5 tokens, no BOS


def test_generate_positional_prompt_file_and_flags(smollm2_path, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("The capital of France is", encoding="utf-8")
    args = ["-m", str(smollm2_path), "-n", "2", "-c", "128", "-b", "64", "-ub", "32", "-t", "1", "-tb", "1",
            "-ngl", "0", "-lm", "mmap", "-ctk", "f16", "-ctv", "f16", "-fa", "on", "--temp", "0",
            "--top-k", "10", "--top-p", "0.9", "--min-p", "0.1", "--typical", "1.0", "--repeat-penalty", "1.1",
            "--repeat-last-n", "16", "--presence-penalty", "0.0", "--frequency-penalty", "0.0", "-s", "3",
            "--no-perf", "--no-display-prompt"]
    r1 = CliRunner().invoke(app, ["generate", *args, "-f", str(f)])
    r2 = CliRunner().invoke(app, ["generate", *args, "The capital of France is"])
    assert r1.exit_code == 0 and r2.exit_code == 0, r1.output + r2.output
    assert r1.stdout == r2.stdout == " Paris.\n"
    assert "llama_perf" not in r1.stderr


def test_generate_seeded_sampling_repeats(smollm2_path):
    args = ["generate", "-m", str(smollm2_path), "-p", "Once upon a time", "-n", "6", "-s", "42", "-c", "128",
            "--no-perf"]
    a = CliRunner().invoke(app, args)
    b = CliRunner().invoke(app, args)
    assert a.exit_code == 0 and a.stdout == b.stdout


def test_generate_errors(smollm2_path, tmp_path):
    r = CliRunner().invoke(app, ["generate", "-m", str(tmp_path / "missing.gguf"), "-p", "x"])
    assert r.exit_code == 1 and "model file not found" in r.stderr
    r = CliRunner().invoke(app, ["generate", "-m", str(smollm2_path), "-p", "x", "y"])
    flat = "".join(c for c in r.output if c.isalnum())
    assert r.exit_code != 0 and "givethepromptonce" in flat
    r = CliRunner().invoke(app, ["generate", "-m", str(smollm2_path), "-p", "x", "-fa", "maybe"])
    flat = "".join(c for c in r.output if c.isalnum() or c == ",")  # rich wraps and boxes errors
    assert r.exit_code != 0 and "expectson,offorauto" in flat
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    r = CliRunner().invoke(app, ["generate", "-m", str(bad), "-p", "x"])
    assert r.exit_code == 1 and "error:" in r.stderr and "Traceback" not in r.output


def test_generate_chat_mode_uses_the_template(smollm2_path):
    r = CliRunner().invoke(app, ["generate", "-m", str(smollm2_path), "--chat", "-sys", "Be brief.", "-p",
                                 "What is 2+2?", "-n", "3", "--temp", "0", "-c", "256", "--no-perf"])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                               "<|im_start|>assistant\n")


def test_chat_two_turns_reuses_the_cache(smollm2_path):
    from pyllama.cli.chat import ChatLoop
    from pyllama.generation import Session, load_model
    from pyllama.sampling import SamplerParams, build_chain

    sess = Session(load_model(smollm2_path), n_ctx=512, n_batch=512)
    loop = ChatLoop(sess, system="You are a helpful assistant.")
    chain = build_chain(SamplerParams(temp=0.0), n_vocab=sess.n_vocab)
    written = []
    r1 = loop.turn("Hi!", chain, 4, write=written.append)
    assert "".join(written) == r1 and r1
    n_after_first = len(sess.tokens)
    loop.turn("And again?", chain, 4)
    assert sess.stats.n_reused >= n_after_first - 1  # only the new turn was decoded
    assert [m["role"] for m in loop.messages] == ["system", "user", "assistant", "user", "assistant"]
    # the cache holds exactly the rendered conversation so far (+ what the model said)
    rendered = loop.render(False)
    text = sess.vocab.detokenize(sess.tokens, unparse_special=True)
    text = text.decode() if isinstance(text, bytes) else text
    assert text.startswith(rendered[:40])


def test_chat_cli_ignores_empty_lines_and_ends_at_eof(smollm2_path):
    # an empty line is skipped (llama-cli, ollama); end of input ends the chat
    r = CliRunner().invoke(app, ["chat", "-m", str(smollm2_path), "-n", "3", "--temp", "0", "-c", "256"],
                           input="Hello\n\nHi\n")
    assert r.exit_code == 0, r.output
    assert r.stdout.count("\n") >= 2, r.stdout


def test_gemma_chat_has_one_bos(gemma3_path):
    from pyllama.cli.chat import ChatLoop
    from pyllama.generation import Session, load_model
    from pyllama.sampling import SamplerParams, build_chain

    sess = Session(load_model(gemma3_path), n_ctx=256, n_batch=256)
    loop = ChatLoop(sess)
    loop.turn("Hi", build_chain(SamplerParams(temp=0.0), n_vocab=sess.n_vocab), 2)
    bos = sess.vocab.bos
    assert sess.tokens[0] == bos and sess.tokens.count(bos) == 1


def test_generate_context_shift(smollm2_path):
    """-c 64 pads to a 256-token context: without --context-shift generation stops there; with
    it the context is shifted and -n 400 tokens come out (the perf line counts them)."""
    base = ["generate", "-m", str(smollm2_path), "-p", "Once upon a time", "-c", "64", "-n", "400", "--temp", "0",
            "--ignore-eos", "--no-display-prompt"]
    r = CliRunner().invoke(app, base)
    assert r.exit_code == 0 and "context full (n_ctx = 256)" in r.stderr, r.stderr
    r = CliRunner().invoke(app, base + ["--context-shift", "--keep", "-1"])
    assert r.exit_code == 0, r.output
    assert "context full" not in r.stderr and "decoded 400 tokens" in r.stderr, r.stderr
