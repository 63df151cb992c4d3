"""`pyllama chat` as a person uses it: the real command in a pseudo-terminal (pexpect),
on SmolLM2 with greedy sampling and short replies.

Ctrl-C stops a reply and keeps it in the conversation (llama-cli), Ctrl-C at an empty
prompt and Ctrl-D exit with 0, empty lines are ignored, the commands work, multi-line input
(ollama's \"\"\" and llama-cli's trailing \\) arrives as one message, the timings line is
printed unless --no-show-timings, and a full context says so and lets /clear go on.
The conversation is checked through /save, i.e. what the model is given next turn."""

from __future__ import annotations

import json
import os
import sys

import pytest
from typer.testing import CliRunner

from pyllama.cli import app

try:
    import pexpect
except ImportError:  # pragma: no cover - scripts/test.sh installs it
    pexpect = None

needs_pexpect = pytest.mark.skipif(pexpect is None, reason="pexpect is not installed (pip install pexpect): "
                                   "the chat loop is tested through a pseudo-terminal")
T = 120  # seconds per expect: a slow 2-core CI machine loads the model and decodes in a few
PROMPT = r"> \x1b\[0m"  # the coloured prompt (stdout is a terminal)


def _spawn(model, *args):
    c = pexpect.spawn(sys.executable, ["-m", "pyllama", "chat", "-m", str(model), "--temp", "0", "-c", "512",
                                       *args], encoding="utf-8", timeout=T, dimensions=(50, 300),
                      env={**os.environ, "TERM": "xterm"})  # readline's arrow keys, whatever CI sets
    i = c.expect(["template   : ", pexpect.EOF])
    assert i == 0, f"pyllama chat did not start: {c.before[-2000:]}"
    c.expect(PROMPT)
    return c


def _send(c, line):
    c.sendline(line)
    c.expect(PROMPT)
    return c.before


def _saved(c, path):
    out = _send(c, f"/save {path}")
    assert "Saved" in out, out
    return json.loads(path.read_text(encoding="utf-8"))


def _exit(c, code=0):
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == code, (c.exitstatus, c.signalstatus, c.before)


@needs_pexpect
def test_ctrl_c_stops_the_reply_and_keeps_the_conversation(smollm2_path, tmp_path):
    c = _spawn(smollm2_path, "-n", "400")
    c.sendline("Write a very long story about a dragon and a knight.")
    c.expect(r"\x1b\[33m")           # the reply starts
    c.expect(r"\w+\W+\w+\W+\w+")     # a few words of it
    c.sendcontrol("c")
    c.expect("reply interrupted")
    c.expect(PROMPT)
    msgs = _saved(c, tmp_path / "a.json")
    assert [m["role"] for m in msgs] == ["user", "assistant"]
    partial = msgs[1]["content"]
    assert partial.strip() and len(partial) < 400 * 4  # cut well before -n
    # the next turn is given the whole conversation, the partial reply included
    c.sendline("Now tell me the knight's name in one word.")
    c.expect(r"\[ Prompt: [\d.]+ t/s \| Generation: [\d.]+ t/s \]")
    c.expect(PROMPT)
    msgs = _saved(c, tmp_path / "b.json")
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert msgs[1]["content"] == partial and msgs[3]["content"].strip()
    # typed text and Ctrl-C: the line is dropped; Ctrl-C again exits, with 0
    c.send("half a line")
    c.expect("half a line")  # echoed: readline holds it (a ^C before that would flush it unread)
    c.sendcontrol("c")
    c.expect("input discarded")
    # the next ^C at the new prompt (one typed while readline re-arms the terminal may be
    # read as a character: a race of the tty, not of pyllama)
    c.expect(PROMPT)
    c.sendcontrol("c")
    _exit(c, 0)


@needs_pexpect
def test_commands(smollm2_path, tmp_path):
    c = _spawn(smollm2_path, "-n", "8")
    assert "available commands" in _send(c, "/help") and "/regen" in c.before
    assert "unknown command /nope" in _send(c, "/nope")
    assert _saved(c, tmp_path / "empty.json") == []  # neither of them is a message
    _send(c, "")                                       # an empty line is ignored, the chat goes on
    _send(c, "   ")
    first = _send(c, "What is the capital of France?")
    msgs = _saved(c, tmp_path / "one.json")
    assert [m["role"] for m in msgs] == ["user", "assistant"] and msgs[1]["content"].strip()
    # /regen: the last reply is dropped and generated again (greedy: the same text)
    _send(c, "/regen")
    again = _saved(c, tmp_path / "regen.json")
    assert again == msgs, (again, msgs, first)
    # /read: a file's text is the message
    doc = tmp_path / "doc.txt"
    doc.write_text("Summarize: the cat sat on the mat.\nIt was warm.", encoding="utf-8")
    assert "Loaded text from" in _send(c, f"/read {doc}")
    msgs3 = _saved(c, tmp_path / "three.json")
    assert msgs3[2] == {"role": "user", "content": doc.read_text(encoding="utf-8")} and len(msgs3) == 4
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok \xff")
    assert "not UTF-8" in _send(c, f"/read {bad}") and "0xff" in c.before
    assert "cannot read" in _send(c, f"/read {tmp_path / 'missing.txt'}")
    # /clear forgets everything; /load brings a saved conversation back
    assert "cleared" in _send(c, "/clear")
    assert _saved(c, tmp_path / "cleared.json") == []
    assert "Loaded 2 messages" in _send(c, f"/load {tmp_path / 'one.json'}")
    assert _saved(c, tmp_path / "loaded.json") == msgs
    assert "error:" in _send(c, f"/load {doc}")      # not JSON: said, and nothing changes
    assert _saved(c, tmp_path / "loaded2.json") == msgs
    c.sendline("/bye")
    _exit(c, 0)


@needs_pexpect
def test_multiline_timings_and_ctrl_d(smollm2_path, tmp_path):
    c = _spawn(smollm2_path, "-n", "4")
    c.sendline('"""')
    c.sendline("line one")
    c.sendline('line two"""')
    c.expect(r"\[ Prompt: [\d.]+ t/s \| Generation: [\d.]+ t/s \]")
    c.expect(PROMPT)
    c.sendline("first\\")
    c.sendline("second")
    c.expect(PROMPT)
    msgs = _saved(c, tmp_path / "m.json")
    assert [m["content"] for m in msgs if m["role"] == "user"] == ["line one\nline two", "first\nsecond"]
    c.sendcontrol("d")
    _exit(c, 0)


@needs_pexpect
def test_no_show_timings_and_history(smollm2_path, tmp_path):
    c = _spawn(smollm2_path, "-n", "4", "--no-show-timings")
    out = _send(c, "Hi")
    assert "\x1b[33m" in out and "Prompt:" not in out and "Generation:" not in out, out
    c.send("\x1b[A")  # readline: the up arrow recalls "Hi"
    c.expect("Hi")
    c.sendline("")
    c.expect(PROMPT)
    assert [m["content"] for m in _saved(c, tmp_path / "h.json") if m["role"] == "user"] == ["Hi", "Hi"]
    c.sendcontrol("c")  # at an empty prompt: exit
    _exit(c, 0)


def test_a_full_context_is_said_and_clear_goes_on(smollm2_path):
    """--no-context-shift, -c 64 (a 256-token context: pyllama pads n_ctx to 256): the first reply fills the context (said, reply kept), the next message does
    not fit (an error naming /clear, the chat goes on), after /clear a message works."""
    r = CliRunner().invoke(app, ["chat", "-m", str(smollm2_path), "--temp", "0", "-c", "64", "-n", "-1",
                                 "--no-show-timings", "--no-context-shift"],
                           input="Write a long story about a dragon.\nAnd then?\n/clear\nHi\n")
    assert r.exit_code == 0, r.output
    assert "context full (n_ctx = 256)" in r.stderr and "/clear" in r.stderr, r.stderr
    assert "exceed the context size" in r.stderr and "Chat history cleared." in r.stderr, r.stderr
    assert len([ln for ln in r.stdout.split("\n") if ln.strip()]) >= 2  # the first and the last reply


def test_context_shift_goes_on(smollm2_path):
    """The default: a reply longer than the context shifts it and goes on (said); the next
    message drops the oldest messages to fit instead of failing."""
    r = CliRunner().invoke(app, ["chat", "-m", str(smollm2_path), "--temp", "0", "-c", "64", "-n", "400",
                                 "--no-show-timings"],
                           input="Write a very long story about a dragon, in many chapters.\nAnd then?\n")
    assert r.exit_code == 0, r.output
    assert "shifted" in r.stderr and "oldest messages were dropped" in r.stderr, r.stderr
    assert "exceed the context size" not in r.stderr, r.stderr


def test_banner_names_model_context_and_template(smollm2_path):
    r = CliRunner().invoke(app, ["chat", "-m", str(smollm2_path), "-c", "512", "--chat-template", "chatml"],
                           input="")
    assert r.exit_code == 0, r.output
    assert smollm2_path.name in r.stderr and "n_ctx      : 512" in r.stderr
    assert "template   : chatml (--chat-template)" in r.stderr


@pytest.mark.parametrize("flags", [["-ngl", "99"], ["-fa", "on"], ["-ngl", "99", "-fa", "auto", "-ctk", "q8_0"],
                                   ["--typical", "0.9", "--mirostat", "2", "--repeat-last-n", "32"]])
def test_generate_flags_parse_on_chat(flags):
    """-ngl is one flag, not -n gl: past the parser to the missing model (exit 1, not 2)."""
    r = CliRunner().invoke(app, ["chat", "-m", "/nonexistent/model.gguf", *flags])
    assert r.exit_code == 1 and "model file not found" in r.output, r.output


SHARED = ["-c", "-b", "-ub", "-t", "-tb", "-ngl", "-lm", "-ctk", "-ctv", "-fa", "--temp", "--top-k", "--top-p",
          "--min-p", "--typical", "--repeat-penalty", "--repeat-last-n", "--presence-penalty", "--frequency-penalty",
          "--mirostat", "--mirostat-lr", "--mirostat-ent", "-s"]


def test_chat_and_generate_share_the_common_flags():
    """The same spellings, defaults and help on both commands (one definition in _checks)."""
    import typer.main

    cmds = typer.main.get_command(app).commands

    def param(cmd, flag):
        found = [p for p in cmds[cmd].params if flag in p.opts]
        assert found, (cmd, flag)
        return found[0]

    for flag in SHARED:
        g, c = param("generate", flag), param("chat", flag)
        assert (g.opts, g.secondary_opts, g.default, g.help) == (c.opts, c.secondary_opts, c.default, c.help), flag


@needs_pexpect
def test_ctrl_c_during_a_long_prompt(smollm2_path, tmp_path):
    """Ctrl-C while a long /read is decoded (micro-batches of 16 on one thread: seconds)
    stops between micro-batches; the KV cache stays in step, so the next turn works."""
    doc = tmp_path / "long.txt"
    doc.write_text(" ".join(["the cat sat on the mat and looked at the dog"] * 30), encoding="utf-8")
    c = _spawn(smollm2_path, "-n", "4", "-c", "4096", "-b", "16", "-ub", "16", "-t", "1")
    c.sendline(f"/read {doc}")
    c.expect("Loaded text")
    c.sendcontrol("c")
    c.expect("reply interrupted")
    c.expect(PROMPT)
    out = _send(c, "Hi")
    assert "Generation:" in out, out
    msgs = _saved(c, tmp_path / "p.json")
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert msgs[0]["content"] == doc.read_text(encoding="utf-8") and msgs[3]["content"].strip()
    c.sendcontrol("d")
    _exit(c, 0)
