"""Bad CLI input ends in a usage error naming the flag (exit 2) or an ``error: ...`` line
(exit 1), never a traceback, a hang or a silently odd run; values llama.cpp gives a
meaning to (``-t <= 0``, ``--temp < 0``, ``--top-k <= 0``, ``-ub 0``, ``--chunks < 0``) run.

Most cases stop at argument parsing, before any model is opened, so they need none (the
-m path does not exist); the runs that do use SmolLM2 with a few tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pyllama.cli import app

runner = CliRunner()
BOX = set("│╭╮╰╯─")


def _flat(s: str) -> str:
    """Output without whitespace and rich's box characters (rich wraps and boxes errors)."""
    return "".join(c for c in s if not c.isspace() and c not in BOX)


def _check(r, code: int, *fragments: str) -> None:
    out = r.output  # stdout and stderr
    assert not (r.exception and not isinstance(r.exception, SystemExit)), (r.exception, out)
    assert "Traceback" not in out, out
    assert r.exit_code == code, out
    flat = _flat(out)
    for f in fragments:
        assert _flat(f) in flat, (f, out)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_errors")
    (d / "latin1.txt").write_bytes(b"hello \xe9 world")
    (d / "binary.bin").write_bytes(b"\xff\xfe\x00\x01GGUF")
    (d / "ok.txt").write_text("hello world\n", encoding="utf-8")
    (d / "empty.txt").write_bytes(b"")
    (d / "adir").mkdir()
    return d


NO_MODEL = "/nonexistent/model.gguf"

# (subcommand args after the command, fragments the message must hold); all exit 2.
USAGE = {
    # generate: every numeric flag's out-of-range values
    "gen-c-neg": (["generate", "-p", "x", "-c", "-1"], ["'-c'", "-1", ">= 0"]),
    "gen-n-lt-2": (["generate", "-p", "x", "-n", "-3"], ["'-n'", "-3", ">= -2"]),
    "gen-b-0": (["generate", "-p", "x", "-b", "0"], ["'-b'", "0", ">= 1"]),
    "gen-ub-neg": (["generate", "-p", "x", "-ub", "-1"], ["'-ub'", "-1"]),
    "gen-temp-nan": (["generate", "-p", "x", "--temp", "nan"], ["'--temp'", "nan", "finite"]),
    "gen-temp-inf": (["generate", "-p", "x", "--temp", "inf"], ["'--temp'", "inf"]),
    "gen-top-p-hi": (["generate", "-p", "x", "--top-p", "1.5"], ["'--top-p'", "1.5", "[0, 1]"]),
    "gen-top-p-lo": (["generate", "-p", "x", "--top-p", "-0.1"], ["'--top-p'", "-0.1"]),
    "gen-min-p": (["generate", "-p", "x", "--min-p", "2"], ["'--min-p'", "2"]),
    "gen-typical-nan": (["generate", "-p", "x", "--typical", "nan"], ["'--typical'", "nan"]),
    "gen-repeat-penalty-0": (["generate", "-p", "x", "--repeat-penalty", "0"], ["'--repeat-penalty'", "> 0"]),
    "gen-repeat-penalty-neg": (["generate", "-p", "x", "--repeat-penalty", "-1"], ["'--repeat-penalty'", "-1"]),
    "gen-repeat-penalty-tiny": (["generate", "-p", "x", "--repeat-penalty", "1e-45"], ["'--repeat-penalty'", "overflows"]),
    "gen-temp-f32": (["generate", "-p", "x", "--temp", "1e39"], ["'--temp'", "float32"]),
    "gen-repeat-last-n": (["generate", "-p", "x", "--repeat-last-n", "-1"], ["'--repeat-last-n'", "-1"]),
    "gen-presence-inf": (["generate", "-p", "x", "--presence-penalty", "inf"], ["'--presence-penalty'", "inf"]),
    "gen-frequency-nan": (["generate", "-p", "x", "--frequency-penalty", "nan"], ["'--frequency-penalty'"]),
    "gen-mirostat-3": (["generate", "-p", "x", "--mirostat", "3"], ["'--mirostat'", "3", "0..2"]),
    "gen-mirostat-lr": (["generate", "-p", "x", "--mirostat-lr", "nan"], ["'--mirostat-lr'"]),
    "gen-mirostat-ent": (["generate", "-p", "x", "--mirostat-ent", "-inf"], ["'--mirostat-ent'"]),
    "gen-seed-neg": (["generate", "-p", "x", "-s", "-2"], ["'-s'", "-2", "-1 = random"]),
    "gen-seed-big": (["generate", "-p", "x", "-s", "4294967296"], ["'-s'", "4294967296"]),
    "gen-seed-huge": (["generate", "-p", "x", "-s", "9" * 30], ["'-s'"]),
    "gen-threads-text": (["generate", "-p", "x", "-t", "x"], ["'-t'", "integer"]),
    "gen-load-mode": (["generate", "-p", "x", "-lm", "bogus"], ["'-lm'", "bogus", "mmap"]),
    "gen-ctk": (["generate", "-p", "x", "-ctk", "bogus"], ["'-ctk'", "bogus", "q8_0"]),
    "gen-ctv": (["generate", "-p", "x", "-ctv", "q9"], ["'-ctv'", "q9"]),
    "gen-fa": (["generate", "-p", "x", "-fa", "maybe"], ["'-fa'", "maybe"]),
    "chat-fa": (["chat", "-fa", "2"], ["'-fa'", "2"]),
    "serve-fa": (["serve", "-fa", "yes"], ["'-fa'", "yes"]),
    # chat
    "chat-template-name": (["chat", "--chat-template", "bogus"], ["'--chat-template'", "bogus", "chatml", "llama3"]),
    "chat-c-neg": (["chat", "-c", "-1"], ["'-c'", "-1"]),
    "chat-n": (["chat", "-n", "-3"], ["'-n'", "-3"]),
    "chat-b-0": (["chat", "-b", "0"], ["'-b'", "0"]),
    "chat-top-p": (["chat", "--top-p", "2"], ["'--top-p'", "2"]),
    "chat-temp": (["chat", "--temp", "nan"], ["'--temp'", "nan"]),
    "chat-seed": (["chat", "-s", "-7"], ["'-s'", "-7"]),
    "chat-repeat-penalty": (["chat", "--repeat-penalty", "0"], ["'--repeat-penalty'"]),
    "chat-ctk": (["chat", "-ctk", "bogus"], ["'-ctk'", "bogus"]),
    # perplexity (the -f file is fine: the flag is checked first)
    "ppl-chunks-0": (["perplexity", "-f", "{ok}", "--chunks", "0"], ["'--chunks'", "0", "-1"]),
    "ppl-c-small": (["perplexity", "-f", "{ok}", "-c", "3"], ["'-c'", "3", "at least 4"]),
    "ppl-c-neg": (["perplexity", "-f", "{ok}", "-c", "-1"], ["'-c'", "-1"]),
    "ppl-b-0": (["perplexity", "-f", "{ok}", "-b", "0"], ["'-b'", "0"]),
    "ppl-ub-neg": (["perplexity", "-f", "{ok}", "-ub", "-5"], ["'-ub'", "-5"]),
    "ppl-lm": (["perplexity", "-f", "{ok}", "-lm", "x"], ["'-lm'"]),
    # bench: llama-bench's list and range syntax, each value checked
    "bench-p-text": (["bench", "-p", "abc"], ["'-p'", "abc"]),
    "bench-t-list": (["bench", "-t", "1,2,x"], ["'-t'", "x"]),
    "bench-t-0": (["bench", "-t", "0"], ["'-t'", "0", ">= 1"]),
    "bench-p-neg": (["bench", "-p", "-1"], ["'-p'", "-1"]),
    "bench-p-empty-range": (["bench", "-p", "8-4"], ["'-p'", "8-4", "empty"]),
    "bench-p-stuck-range": (["bench", "-p", "0-8*2"], ["'-p'", "0-8*2", "advance"]),
    "bench-n-huge-range": (["bench", "-n", "1-100000"], ["'-n'", "10000"]),
    "bench-p-too-big": (["bench", "-p", "99999999999"], ["'-p'", "too large"]),
    "bench-pg-one": (["bench", "-pg", "8"], ["'-pg'", "8", "pp,tg"]),
    "bench-pg-text": (["bench", "-pg", "8,x"], ["'-pg'", "8,x"]),
    "bench-r-0": (["bench", "-r", "0"], ["'-r'", "0"]),
    "bench-b-0": (["bench", "-b", "0"], ["'-b'", "0"]),
    "bench-o": (["bench", "-o", "bogus"], ["'-o'", "bogus", "md", "json", "csv"]),
    "bench-ctk": (["bench", "-ctk", "f16,bogus"], ["'-ctk'", "bogus"]),
    "bench-fa": (["bench", "-fa", "maybe"], ["'-fa'", "maybe"]),
    "bench-d-neg": (["bench", "-d", "-4"], ["'-d'", "-4"]),
    "bench-ngl-text": (["bench", "-ngl", "all"], ["'-ngl'", "all"]),
    # GPU placement (llama.cpp's -sm / -ts / -mg; -ts splits on , and / as common/arg.cpp)
    "gen-sm": (["generate", "-p", "x", "-sm", "rows"], ["'-sm'", "rows", "none, layer, row or tensor"]),
    "chat-ts-text": (["chat", "-ts", "3,x"], ["'-ts'", "'x'", "not a number"]),
    "serve-ts-neg": (["serve", "-ts", "1,-1"], ["'-ts'", "-1", ">= 0"]),
    "gen-ts-17": (["generate", "-p", "x", "-ts", ",".join(["1"] * 17)], ["'-ts'", "17", "at most 16"]),
    "gen-mg-neg": (["generate", "-p", "x", "-mg", "-1"], ["'-mg'", "-1"]),
    "bench-sm": (["bench", "-sm", "layer,rows"], ["'-sm'", "rows"]),
    "bench-ts": (["bench", "-ts", "1/x"], ["'-ts'", "'x'"]),
    "bench-nkvo": (["bench", "-nkvo", "2"], ["'-nkvo'", "'2'"]),
    # -f files: missing, a directory, not UTF-8 (file name and byte offset in the message)
    "gen-f-missing": (["generate", "-f", "{d}/missing.txt"], ["'-f'", "missing.txt", "No such file"]),
    "gen-f-dir": (["generate", "-f", "{d}/adir"], ["'-f'", "adir", "directory"]),
    "gen-f-latin1": (["generate", "-f", "{d}/latin1.txt"], ["'-f'", "latin1.txt", "not UTF-8", "0xe9", "offset 6"]),
    "gen-f-binary": (["generate", "-f", "{d}/binary.bin"], ["'-f'", "binary.bin", "0xff", "offset 0"]),
    "ppl-f-latin1": (["perplexity", "-f", "{d}/latin1.txt"], ["'-f'", "latin1.txt", "offset 6"]),
    "ppl-f-binary": (["perplexity", "-f", "{d}/binary.bin"], ["'-f'", "binary.bin", "offset 0"]),
    "ppl-f-dir": (["perplexity", "-f", "{d}/adir"], ["'-f'", "adir"]),
    "tok-f-dir": (["tokenize", "-f", "{d}/adir"], ["'-f'", "adir"]),
    "tok-f-missing": (["tokenize", "-f", "{d}/missing.txt"], ["'-f'", "missing.txt"]),
    "tok-two-sources": (["tokenize", "-p", "x", "-f", "{ok}"], ["exactly one"]),
}


@pytest.mark.parametrize("case", list(USAGE))
def test_usage_errors(case, files):
    args, fragments = USAGE[case]
    args = [a.format(d=files, ok=files / "ok.txt") for a in args]
    r = runner.invoke(app, [args[0], "-m", NO_MODEL, *args[1:]])
    _check(r, 2, *fragments)


@pytest.mark.parametrize("argv", [
    ["generate", "-m", "{d}/adir", "-p", "x"],
    ["generate", "-m", "{d}/binary.bin", "-p", "x"],
    ["generate", "-m", "{d}/empty.txt", "-p", "x"],
    ["perplexity", "-m", "{d}/adir", "-f", "{ok}"],
    ["tokenize", "-m", "{d}/adir", "-p", "x"],
    ["bench", "-m", "{d}/adir", "-p", "4", "-n", "0", "-r", "1"],
    ["bench", "-m", "{d}/binary.bin", "-p", "4", "-n", "0", "-r", "1"],
    ["inspect", "{d}/adir"],
    ["inspect", "{d}/binary.bin"],
], ids=lambda a: "-".join(a[:3]).replace("{d}/", ""))
def test_bad_model_files(argv, files):
    """Directories and non-GGUF files as the model: an error line naming the file, exit 1."""
    argv = [a.format(d=files, ok=files / "ok.txt") for a in argv]
    r = runner.invoke(app, argv)
    _check(r, 1, "error", Path(argv[2] if argv[0] != "inspect" else argv[1]).name)


ACCEPTED = [
    ["generate", "-p", "x", "-n", "-2", "-c", "0", "-ub", "0", "-t", "-5", "-tb", "0", "--top-k", "-3", "--temp", "-1",
     "--top-p", "0", "--min-p", "1", "--typical", "0", "-s", "4294967295", "-ngl", "-5", "--repeat-penalty", "1e-3"],
    ["generate", "-p", "x", "-s", "-1", "-lm", "MMAP", "-ctk", "Q8_0", "--mirostat", "2"],
    ["chat", "--chat-template", "llama3"],
    ["chat", "--chat-template", "{{ messages[0].content }}", "-n", "-2"],
    ["perplexity", "-f", "{ok}", "--chunks", "-7", "-ub", "0", "-c", "4", "-b", "1"],
    ["bench", "-p", "0,1-4*2,", "-n", "0", "-ub", "0", "-pg", "0,0", "-pg", "4,2", "-fa", "auto,on", "-ctk", "f16,q8_0",
     "-d", "0,8", "-ngl", "-1,0", "-o", "jsonl"],
    ["generate", "-p", "x", "-sm", "none", "-mg", "1", "-ts", "3/1", "-nkvo"],
    ["chat", "-sm", "LAYER", "-ts", "3,1,0"],
    ["serve", "-sm", "row", "-ts", "1", "-mg", "0", "-nkvo"],
    ["bench", "-sm", "none,layer", "-mg", "0,1", "-ts", "1/1,3;1", "-nkvo", "0,1"],
]


@pytest.mark.parametrize("args", ACCEPTED, ids=lambda a: a[0])
def test_values_with_a_meaning_are_accepted(args, files):
    """These values get past the flag checks (to the missing model: exit 1)."""
    args = [str(files / "ok.txt") if a == "{ok}" else a for a in args]
    r = runner.invoke(app, [args[0], "-m", NO_MODEL, *args[1:]])
    _check(r, 1, "model")


# ---- runs on a real model ---------------------------------------------------------------


def test_values_llama_cpp_defines_run(smollm2_path):
    """-t/-tb <= 0 (the default threads), --temp < 0 (greedy), --top-k < 0 (off) and -ub 0
    (= -b) are honoured as llama.cpp does: greedy " Paris." as with --temp 0."""
    r = runner.invoke(app, ["generate", "-m", str(smollm2_path), "-p", "The capital of France is", "-n", "2",
                            "--temp", "-1", "--top-k", "-3", "-t", "-5", "-tb", "0", "-ub", "0", "-c", "64",
                            "--no-perf", "--no-display-prompt", "-sys", "unused"])
    _check(r, 0, "warning: -sys/--system is only used with --chat")
    assert r.stdout == " Paris.\n"


def test_prompt_with_nul_bytes_and_empty_file(smollm2_path, files, tmp_path):
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"a\x00b\x00")
    for args in (["-p", "a\x00b"], ["-f", str(nul)]):
        r = runner.invoke(app, ["generate", "-m", str(smollm2_path), *args, "-n", "1", "--no-perf"])
        _check(r, 0)
    r = runner.invoke(app, ["generate", "-m", str(smollm2_path), "-f", str(files / "empty.txt"), "-n", "1"])
    _check(r, 2, "prompt is empty")


def test_context_too_large_is_an_error_line(smollm2_path):
    r = runner.invoke(app, ["generate", "-m", str(smollm2_path), "-p", "x", "-n", "1", "-c", "100000000"])
    _check(r, 1, "error:")


def test_chat_templates(smollm2_path):
    """A built-in name and a Jinja text are accepted; a broken Jinja text is an error line."""
    base = ["chat", "-m", str(smollm2_path), "-n", "2", "--temp", "0", "-c", "128"]
    r = runner.invoke(app, [*base, "--chat-template", "chatml"], input="Hi\n")
    _check(r, 0)
    r = runner.invoke(app, [*base, "--chat-template", "{% for m in messages %}{{ m.content }}{% endfor %}"],
                      input="Hi\n")
    _check(r, 0)
    r = runner.invoke(app, [*base, "--chat-template", "{{ broken"], input="Hi\n")
    _check(r, 1, "error:", "chat template")


def test_chat_input_not_utf8(smollm2_path):
    r = runner.invoke(app, ["chat", "-m", str(smollm2_path), "-n", "2", "-c", "128"], input=b"hi \xff\n")
    _check(r, 1, "error: input line 1 is not UTF-8", "0xff", "offset 3")


def test_perplexity_negative_chunks_means_all(smollm2_path, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("The quick brown fox jumps over the lazy dog. " * 12, encoding="utf-8")
    args = ["perplexity", "-m", str(smollm2_path), "-f", str(f), "-c", "16"]
    all_ = runner.invoke(app, [*args, "--chunks", "-1"])
    neg = runner.invoke(app, [*args, "--chunks", "-7"])
    _check(all_, 0, "Final estimate")
    _check(neg, 0)
    assert neg.stdout == all_.stdout


def test_bench_ranges_and_pairs(smollm2_path):
    """llama-bench's syntax: 2-4+2 is pp2 and pp4, -pg repeats, 0,0 is skipped."""
    r = runner.invoke(app, ["bench", "-m", str(smollm2_path), "-p", "2-4+2", "-n", "0", "-pg", "2,1",
                            "-pg", "0,0", "-r", "1", "-t", "1", "-o", "json"])
    _check(r, 0)
    assert [(row["n_prompt"], row["n_gen"]) for row in json.loads(r.stdout)] == [(2, 0), (4, 0), (2, 1)]


# ---- end to end: endless input, closed pipes ----------------------------------------------


def _run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, timeout=60, **kw)


@pytest.mark.parametrize("argv", [
    ["generate", "-m", NO_MODEL, "-f", "/dev/zero"],
    ["perplexity", "-m", NO_MODEL, "-f", "/dev/zero"],
    ["tokenize", "-m", NO_MODEL, "-f", "/dev/zero"],
    ["tokenize", "-m", NO_MODEL, "--stdin"],
], ids=["generate", "perplexity", "tokenize-f", "tokenize-stdin"])
def test_endless_input_is_capped(argv):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    with open("/dev/zero", "rb") as zero:
        p = _run([sys.executable, "-m", "pyllama", *argv], stdin=zero)
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 2 and "Traceback" not in err, err
    assert "256MiB" in _flat(err) and "/dev/zero?" in _flat(err), err


def test_chat_endless_line(smollm2_path):
    with open("/dev/zero", "rb") as zero:
        p = _run([sys.executable, "-m", "pyllama", "chat", "-m", str(smollm2_path), "-c", "64"], stdin=zero)
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 1 and "Traceback" not in err and "input line 1 is longer than 256 MiB" in err, err


def test_closed_stdout_is_quiet(smollm2_path):
    cmd = (f"'{sys.executable}' -m pyllama generate -m '{smollm2_path}' -p 'Once upon a time' -n 40 "
           f"--temp 0 --no-perf | head -c 5")
    p = _run(["sh", "-c", cmd])
    err = p.stderr.decode(errors="replace")
    assert p.stdout == b"Once " and "Traceback" not in err and "Broken pipe" not in err, err
