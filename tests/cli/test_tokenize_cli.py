"""`pyllama tokenize`: llama-tokenize's output format and options."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from pyllama.cli import app
from pyllama.cli.tokenize import process_escapes

DATA = Path(__file__).parents[1] / "data" / "tokenizer"
runner = CliRunner()


def _case(text):
    cases = json.loads((DATA / "smollm2-135m-q4_1.tokenize.json").read_text())["cases"]
    return next(c for c in cases if c["text"] == text)


def test_ids_match_reference(smollm2_path):
    text = "Hello, world! How are you today?"
    r = runner.invoke(app, ["tokenize", "-m", str(smollm2_path), "-p", text, "--ids"])
    assert r.exit_code == 0, r.output
    assert r.output == "[" + ", ".join(map(str, _case(text)["ids_add1_parse1"])) + "]\n"


def test_piece_lines_and_count(gemma3_path):
    r = runner.invoke(app, ["tokenize", "-m", str(gemma3_path), "-p", "Hi<start_of_turn>", "--show-count"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "     2 -> '<bos>'"
    assert lines[-2] == "   105 -> '<start_of_turn>'"
    assert lines[-1] == f"Total number of tokens: {len(lines) - 1}"


def test_no_bos_and_no_parse_special(gemma3_path):
    r = runner.invoke(app, ["tokenize", "-m", str(gemma3_path), "-p", "<start_of_turn>", "--ids", "--no-bos",
                            "--no-parse-special"])
    assert r.exit_code == 0, r.output
    ids = json.loads(r.output)
    assert 2 not in ids and 105 not in ids and len(ids) > 1


def test_escapes_like_llama_cpp():
    assert process_escapes(b"a\\nb\\tc\\\\d\\x41\\q\\x4") == b"a\nb\tc\\dA\\q\\x4"


def test_bad_model_is_a_clear_error(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf file at all")
    r = runner.invoke(app, ["tokenize", "-m", str(bad), "-p", "x"])
    assert r.exit_code == 1
    assert "x.gguf" in r.output and "Traceback" not in r.output


def test_file_and_stdin_like_llama_cpp(smollm2_path, tmp_path):
    """-f drops one trailing newline; escapes are processed in -p, -f and --stdin alike."""
    f = tmp_path / "p.txt"
    f.write_bytes(b"Hi\\nthere\n")
    by_file = runner.invoke(app, ["tokenize", "-m", str(smollm2_path), "-f", str(f), "--ids"])
    by_stdin = runner.invoke(app, ["tokenize", "-m", str(smollm2_path), "--stdin", "--ids"], input=b"Hi\\nthere")
    by_prompt = runner.invoke(app, ["tokenize", "-m", str(smollm2_path), "-p", "Hi\nthere", "--ids"])
    assert by_file.exit_code == by_stdin.exit_code == by_prompt.exit_code == 0
    assert by_file.output == by_stdin.output == by_prompt.output
