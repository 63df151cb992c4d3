"""llama.cpp's flags on `pyllama generate` and `pyllama chat` (issue 19's "Flags and parsing",
issue 13's CLI bullet): each one changes what it should. Sampling flags are held to the
API: the CLI's text under a fixed seed equals a SamplerChain built from SamplerParams with
the same fields, and differs from the run without the flag."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from pyllama.cli import app
from pyllama.cli._checks import process_escapes

runner = CliRunner()
PROMPT = "The capital of France is"


def _gen(path, *args, input=None):
    return runner.invoke(app, ["generate", "-m", str(path), "-c", "256", "--no-perf", "--no-display-prompt",
                               "--log-disable", *args], input=input)


def _ok(r):
    assert r.exit_code == 0 and r.exception is None or isinstance(r.exception, SystemExit), r.output
    assert r.exit_code == 0, r.output
    return r.stdout


def _usage(r, *fragments):
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    flat = " ".join(r.output.split())
    for f in fragments:
        assert f in flat, (f, r.output)


# -- -h, --version, -v, --log-disable, --color ---------------------------------------------

def test_h_is_help_and_version_prints_the_build():
    from pyllama import __version__

    for argv in (["-h"], ["generate", "-h"], ["chat", "-h"]):
        r = runner.invoke(app, argv)
        assert r.exit_code == 0 and "Usage:" in r.stdout, r.output
    for argv in (["--version"], ["generate", "--version"], ["chat", "--version"]):
        r = runner.invoke(app, argv)
        assert r.exit_code == 0, r.output
        assert r.stdout.startswith(f"version: {__version__} (pyllama, ") and "built for" in r.stdout


def test_errors_are_one_line_and_v_shows_the_traceback(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    for cmd in (["generate", "-p", "x"], ["chat", "-st", "-p", "x"]):
        r = runner.invoke(app, [cmd[0], "-m", str(bad), *cmd[1:]])
        assert r.exit_code == 1 and "Traceback" not in r.output, r.output
        assert [ln for ln in r.stderr.splitlines() if ln.strip()] == [r.stderr.strip()]
        assert r.stderr.startswith("error: ")
        r = runner.invoke(app, [cmd[0], "-m", str(bad), "-v", *cmd[1:]])
        assert r.exit_code == 1 and r.exception is not None and not isinstance(r.exception, SystemExit)
    # the same through a real process: the traceback on stderr only with -v
    import subprocess
    import sys

    base = [sys.executable, "-c", "from pyllama.cli import app; app()", "generate", "-m", str(bad), "-p", "x"]
    p = subprocess.run(base, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1, p.stderr
    p = subprocess.run(base + ["-v"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "Traceback" in p.stderr, p.stderr


def test_log_disable_silences_stderr(smollm2_path):
    args = ["generate", "-m", str(smollm2_path), "-p", PROMPT, "-n", "2", "--temp", "0", "-c", "128"]
    r = runner.invoke(app, args)
    assert "llama_perf" in r.stderr
    r = runner.invoke(app, [*args, "--log-disable"])
    assert r.exit_code == 0 and r.stderr == "" and r.stdout == PROMPT + " Paris.\n", r.output


def test_color(smollm2_path, monkeypatch):
    args = ["-p", PROMPT, "-n", "2", "--temp", "0"]
    r = runner.invoke(app, ["generate", "-m", str(smollm2_path), "-c", "128", "--no-perf", "--log-disable", *args])
    assert "\033[" not in r.stdout  # auto, and not a terminal: no escapes
    r = runner.invoke(app, ["generate", "-m", str(smollm2_path), "-c", "128", "--no-perf", "--log-disable",
                            "--color", "on", *args])
    assert r.stdout == f"\033[33m{PROMPT}\033[0m Paris.\n", repr(r.stdout)
    for v in ("off", "auto", "0", "false", "disabled"):
        r = runner.invoke(app, ["generate", "-m", str(smollm2_path), "-c", "128", "--no-perf", "--log-disable",
                                "--color", v, *args])
        assert "\033[" not in r.stdout, v
    # chat: the reply is coloured only when asked
    base = ["chat", "-m", str(smollm2_path), "-c", "256", "-n", "3", "--temp", "0", "-st", "-p", "Hi", "--log-disable"]
    assert "\033[33m" in _ok(runner.invoke(app, [*base, "-co", "on"]))
    assert "\033[" not in _ok(runner.invoke(app, base))
    _usage(runner.invoke(app, ["generate", "--color", "maybe", "-p", "x"]), "'--color'", "maybe")


def test_use_color_auto_follows_llama_cpp(monkeypatch):
    from pyllama.cli._checks import use_color

    class Tty:
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stdout", Tty())
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert use_color("auto") and use_color("on") and not use_color("off")
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_color("auto") and use_color("on")
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert not use_color("auto")
    monkeypatch.setenv("TERM", "xterm")

    class Pipe:
        def isatty(self):
            return False

    # stderr a terminal, stdout a pipe (`pyllama chat > file`): no escapes into the file
    monkeypatch.setattr("sys.stdout", Pipe())
    monkeypatch.setattr("sys.stderr", Tty())
    assert not use_color("auto") and use_color("on")


# -- escapes ------------------------------------------------------------------------------

@pytest.mark.parametrize("src,want", [
    (r"a\nb", "a\nb"), (r"a\tb\rc", "a\tb\rc"), (r"\'\"\\", "'\"\\"), (r"\x41\x42z", "ABz"),
    (r"\q", r"\q"),            # unknown escapes stay as written
    (r"end\\", "end\\"),      # an escaped backslash
    ("end\\", "end\\"),        # a trailing backslash stays
    (r"\x4", r"\x4"),          # one hex digit: kept
    (r"\x41", "A"), (r"\x-1.", "\ufffd."), (r"\x 9.", "\t."),  # strtol: sign and space before a digit
    (r"\x41.", "A."), (r"\xg1.", r"\xg1."), (r"\xc3\xa9.", "é."), ("é\\n", "é\n"),
])
def test_process_escapes_is_llama_cpps(src, want):
    assert process_escapes(src) == want


def test_escape_on_by_default_and_no_escape(smollm2_path):
    r = runner.invoke(app, ["generate", "-m", str(smollm2_path), "-p", r"Line one\nLine two", "-n", "1", "--temp", "0",
                            "-c", "128", "--no-perf", "--log-disable"])
    assert _ok(r).startswith("Line one\nLine two")
    r = runner.invoke(app, ["generate", "-m", str(smollm2_path), "-p", r"Line one\nLine two", "-n", "1", "--temp", "0",
                            "-c", "128", "--no-perf", "--log-disable", "--no-escape"])
    assert _ok(r).startswith(r"Line one\nLine two")
    r2 = runner.invoke(app, ["generate", "-m", str(smollm2_path), "-p", r"Line one\nLine two", "-n", "1", "--temp",
                             "0", "-c", "128", "--no-perf", "--log-disable", "-e"])
    assert _ok(r2).startswith("Line one\nLine two")


# -- reverse prompts, interactive, conversation ------------------------------------------

def test_reverse_prompt_stops_generation(smollm2_path):
    full = _ok(_gen(smollm2_path, "-p", PROMPT, "-n", "8", "--temp", "0"))
    assert full.startswith(" Paris.\n\n") and len(full) > len(" Paris.\n")
    assert _ok(_gen(smollm2_path, "-p", PROMPT, "-n", "8", "--temp", "0", "-r", ".")) == " Paris.\n"
    # repeatable; the first one reached stops; escapes apply to -r
    assert _ok(_gen(smollm2_path, "-p", PROMPT, "-n", "8", "--temp", "0", "-r", "zzz", "-r", r"\n\n")) == " Paris.\n\n\n"
    assert _ok(_gen(smollm2_path, "-p", PROMPT, "-n", "8", "--temp", "0", "--no-escape", "-r", r"\n\n")) == full


def test_interactive_reads_lines_and_goes_on(smollm2_path):
    one = _ok(_gen(smollm2_path, "-p", PROMPT, "-n", "3", "--temp", "0"))
    out = _ok(_gen(smollm2_path, "-p", PROMPT, "-n", "3", "--temp", "0", "-i", input=" The capital of Italy is\n"))
    # the typed line is not echoed (a terminal shows it as it is typed): " Paris.\n" then " Rome."
    assert out.startswith(one.rstrip("\n")) and " Rome" in out[len(one) - 1:], out
    # an empty line hands control back: the model goes on where it stopped
    out2 = _ok(_gen(smollm2_path, "-p", PROMPT, "-n", "3", "--temp", "0", "-i", input="\n"))
    six = _ok(_gen(smollm2_path, "-p", PROMPT, "-n", "6", "--temp", "0"))
    assert out2 == six, (out2, six)
    _usage(runner.invoke(app, ["generate", "-p", "x", "-i", "-cnv", "-m", str(smollm2_path)]), "'-i'", "pyllama chat")


def test_conversation_flags(smollm2_path):
    a = _ok(_gen(smollm2_path, "-p", "Hi", "-n", "4", "--temp", "0", "-cnv"))
    b = _ok(_gen(smollm2_path, "-p", "Hi", "-n", "4", "--temp", "0", "--chat"))
    c = _ok(_gen(smollm2_path, "-p", "Hi", "-n", "4", "--temp", "0", "-cnv", "-no-cnv"))
    d = _ok(_gen(smollm2_path, "-p", "Hi", "-n", "4", "--temp", "0"))
    assert a == b and c == d and a != d
    # --chat-template / --chat-template-file / --no-jinja pick the template of the one turn
    shown = _ok(runner.invoke(app, ["generate", "-m", str(smollm2_path), "-c", "256", "--no-perf", "--log-disable",
                                    "-p", "Hi", "-n", "1", "--temp", "0", "-cnv", "--chat-template", "llama3"]))
    assert shown.startswith("<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"), shown
    e = _ok(_gen(smollm2_path, "-p", "Hi", "-n", "4", "--temp", "0", "-cnv", "--chat-template", "chatml"))
    f = _ok(_gen(smollm2_path, "-p", "Hi", "-n", "4", "--temp", "0", "-cnv", "--no-jinja"))
    assert e == f  # SmolLM2's template is the chatml family: --no-jinja renders built-in chatml
    _usage(_gen(smollm2_path, "-p", "Hi", "--chat-template", "chatml"), "--chat-template", "-cnv")


def test_chat_prompt_single_turn_and_reverse_prompt(smollm2_path):
    base = ["chat", "-m", str(smollm2_path), "-c", "256", "-n", "24", "--temp", "0", "--log-disable"]
    one = _ok(runner.invoke(app, [*base, "-p", "What is 2+2?", "-st"]))
    assert one.strip()
    # -st with -p reads no input: the same reply with a message waiting on stdin
    assert _ok(runner.invoke(app, [*base, "-p", "What is 2+2?", "-st"], input="Another question\n")) == one
    # without -st the conversation goes on with stdin
    two = _ok(runner.invoke(app, [*base, "-p", "What is 2+2?"], input="And 3+3?\n"))
    assert two.startswith(one) and len(two) > len(one)
    # the reply ends where its text ends with the reverse prompt (checked at each token's end, as
    # llama.cpp's interactive check)
    assert one.startswith("The answer to this classic math problem is 4."), one
    cut = _ok(runner.invoke(app, [*base, "-p", "What is 2+2?", "-st", "-r", "answer"]))
    assert cut == "The answer\n", (cut, one)


def test_chat_template_file_and_jinja(smollm2_path, tmp_path):
    base = ["chat", "-m", str(smollm2_path), "-c", "256", "-n", "6", "--temp", "0", "-st", "-p", "Hi", "--log-disable"]
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", encoding="utf-8")
    via_file = _ok(runner.invoke(app, [*base, "--chat-template-file", str(f)]))
    assert via_file == _ok(runner.invoke(app, [*base, "--chat-template", "chatml"]))
    # --no-jinja: the built-in format the model's template matches (chatml, without the Jinja
    # template's default system message), as llama.cpp's llama_chat_apply_template
    no_jinja = _ok(runner.invoke(app, [*base, "--no-jinja"]))
    assert no_jinja == via_file and no_jinja != _ok(runner.invoke(app, base))
    odd = tmp_path / "odd.jinja"
    odd.write_text("{% for m in messages %}{{ m.content }}{% endfor %}", encoding="utf-8")
    _usage(runner.invoke(app, [*base, "--no-jinja", "--chat-template-file", str(odd)]), "--no-jinja", "built-in")
    _usage(runner.invoke(app, [*base, "--chat-template-file", str(tmp_path / "missing")]), "'--chat-template-file'")
    _usage(runner.invoke(app, [*base, "--chat-template", "bogus"]), "'--chat-template'", "bogus")
    _usage(runner.invoke(app, [*base, "--chat-template", "chatml", "--chat-template-file", str(f)]), "not both")


# -- grammars -------------------------------------------------------------------------------

def test_grammar_constrains_generate_and_chat(smollm2_path, tmp_path):
    g = r'root ::= " " ("yes" | "no") "." [ ]? [A-Z] [a-z]+'
    out = _ok(_gen(smollm2_path, "-p", "Is Paris in France? Answer:", "-n", "12", "--temp", "0", "--grammar", g))
    assert re.fullmatch(r" (yes|no)\. ?[A-Z][a-z]+\n", out), out
    gf = tmp_path / "g.gbnf"
    gf.write_text(g, encoding="utf-8")
    assert _ok(_gen(smollm2_path, "-p", "Is Paris in France? Answer:", "-n", "12", "--temp", "0",
                    "--grammar-file", str(gf))) == out
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                "n": {"type": "integer"}}, "required": ["city", "n"]}
    out = _ok(_gen(smollm2_path, "-p", "JSON:", "-n", "48", "--temp", "0", "-j", json.dumps(schema)))
    doc = json.loads(out)
    assert set(doc) == {"city", "n"} and isinstance(doc["n"], int), out
    sf = tmp_path / "s.json"
    sf.write_text(json.dumps(schema), encoding="utf-8")
    assert _ok(_gen(smollm2_path, "-p", "JSON:", "-n", "48", "--temp", "0", "-jf", str(sf))) == out
    r = runner.invoke(app, ["chat", "-m", str(smollm2_path), "-c", "256", "-n", "48", "--temp", "0", "--log-disable",
                            "-j", json.dumps(schema)], input="Give me a city\nAnother one\n")
    replies = [ln for ln in _ok(r).split("\n") if ln.strip()]
    text = _ok(r)
    # two replies, each a document of the schema (the grammar starts over each turn)
    dec = json.JSONDecoder()
    docs, i = [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        d, i = dec.raw_decode(text, i)
        docs.append(d)
    assert len(docs) == 2 and all(set(d) == {"city", "n"} for d in docs), (replies, text)


def test_grammar_errors_are_usage_errors(tmp_path):
    _usage(runner.invoke(app, ["generate", "-p", "x", "--grammar", 'root ::= "a" |\nfoo ::= ']),
           "'--grammar'", "line")
    _usage(runner.invoke(app, ["generate", "-p", "x", "--grammar", "root ::= undefined_rule"]), "'--grammar'")
    _usage(runner.invoke(app, ["chat", "-j", "{not json"]), "'--json-schema'", "not JSON")
    _usage(runner.invoke(app, ["generate", "-p", "x", "-jf", str(tmp_path / "none.json")]), "'--json-schema-file'")
    _usage(runner.invoke(app, ["generate", "-p", "x", "--grammar", 'root ::= "a"', "-j", "{}"]), "give one of")


# -- sampling flags against the API ---------------------------------------------------------

def _api_text(path, prompt: str, n: int, **fields) -> str:
    """The text the library generates with SamplerChain.from_params(SamplerParams(**fields))."""
    from pyllama.generation import Session, TextStream, load_model
    from pyllama.sampling import SamplerChain, SamplerParams

    sess = Session(load_model(path), n_ctx=256)
    chain = SamplerChain.from_params(SamplerParams(**fields), n_vocab=sess.n_vocab, vocab=sess.vocab)
    toks = sess.tokenize(prompt, add_special=True, parse_special=True)
    st = TextStream(sess.vocab, special=True)
    out = "".join(st.feed(t) for t in sess.generate(toks, chain, n, decode_last=False))
    return out + st.flush()


SEEDED = ["-s", "7", "--temp", "1.5", "--top-k", "0", "--top-p", "1", "--min-p", "0"]
# DRY acts on repeats: a prompt that repeats, and greedy (the last -- temp wins)
LOOP = "one two three four, one two three four, one two three four, one two"
GREEDY = (["--temp", "0"], dict(temp=0.0))
API_BASE = dict(seed=7, temp=1.5, top_k=0, top_p=1.0, min_p=0.0)
CASES = {
    "top-nsigma": (["--top-nsigma", "1.0"], dict(top_n_sigma=1.0)),
    "dry": (["--dry-multiplier", "4", "--dry-base", "2", "--dry-allowed-length", "1", "--dry-penalty-last-n", "32",
             "--repeat-last-n", "0"], dict(dry_multiplier=4.0, dry_base=2.0, dry_allowed_length=1,
                                            dry_penalty_last_n=32, penalty_last_n=0), LOOP),
    "dry-breakers": (["--dry-multiplier", "4", "--dry-allowed-length", "1", "--dry-sequence-breaker", r"\n",
                      "--dry-sequence-breaker", "three"],
                     dict(dry_multiplier=4.0, dry_allowed_length=1, dry_sequence_breakers=["\n", "three"]), LOOP),
    "xtc": (["--xtc-probability", "1", "--xtc-threshold", "0.05"], dict(xtc_probability=1.0, xtc_threshold=0.05)),
    "dynatemp": (["--dynatemp-range", "1.4", "--dynatemp-exp", "2"], dict(dynatemp_range=1.4, dynatemp_exponent=2.0)),
    "min-keep": (["--top-p", "0.01", "--min-keep", "20"], dict(top_p=0.01, min_keep=20)),
    "samplers": (["--top-k", "2", "--samplers", "temperature;top_k"],
                 dict(top_k=2, samplers=["temperature", "top_k"])),
    "sampling-seq": (["--top-k", "2", "--sampling-seq", "tk"], dict(top_k=2, samplers=["temperature", "top_k"])),
    "logit-bias": (["-l", "13+5", "-l", "30-2.5"], dict(logit_bias={13: 5.0, 30: -2.5})),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sampling_flag_matches_the_api_and_changes_the_output(smollm2_path, case):
    flags, fields, *loop = CASES[case]
    prompt = "Once upon a time, there was a little"
    base, api = (SEEDED, API_BASE)
    if loop:
        prompt, base, api = loop[0], SEEDED + GREEDY[0], {**API_BASE, **GREEDY[1]}
    plain = _ok(_gen(smollm2_path, "-p", prompt, "-n", "24", *base))
    got = _ok(_gen(smollm2_path, "-p", prompt, "-n", "24", *base, *flags))
    want = _api_text(smollm2_path, prompt, 24, **{**api, **fields})
    assert got == want + "\n", (case, got, want)
    if case != "min-keep":
        assert got != plain, case
    else:  # top-p 0.01 alone is near greedy; --min-keep 20 samples among 20
        near_greedy = _ok(_gen(smollm2_path, "-p", prompt, "-n", "24", *base, "--top-p", "0.01"))
        assert got != near_greedy


def test_samplers_order_is_the_chain(smollm2_path):
    """--samplers / --sampling-seq give SamplerParams.samplers in that order (the chain the API builds)."""
    from pyllama.cli._checks import samplers_arg, sampling_seq_arg
    from pyllama.cli.generate import sampler_params
    from pyllama.sampling import SamplerParams

    names = samplers_arg(None, None, "Penalties;DRY;top-n-sigma;topk;typ;nucleus;min_p;xtc;temp")
    assert names == SamplerParams().samplers
    assert sampling_seq_arg(None, None, "edskypmxt") == SamplerParams().samplers
    p = sampler_params(temp=0.8, top_k=40, top_p=0.95, min_p=0.05, typical=1.0, repeat_penalty=1.0,
                       repeat_last_n=64, presence_penalty=0.0, frequency_penalty=0.0, mirostat=0, mirostat_lr=0.1,
                       mirostat_ent=5.0, seed=1, samplers=["min_p", "top_k"], sampling_seq=None)
    assert p.samplers == ["min_p", "top_k"]


def test_logit_bias_bans_a_token(smollm2_path):
    assert _ok(_gen(smollm2_path, "-p", PROMPT, "-n", "2", "--temp", "0")) == " Paris.\n"
    out = _ok(_gen(smollm2_path, "-p", PROMPT, "-n", "2", "--temp", "0", "-l", "7042-inf"))  # 7042 = " Paris"
    assert not out.startswith(" Paris"), out
    out = _ok(_gen(smollm2_path, "-p", PROMPT, "-n", "2", "--temp", "0", "--logit-bias", "7042 - inf"))
    assert not out.startswith(" Paris"), out


@pytest.mark.parametrize("args,fragments", [
    (["--samplers", "top_k;bogus"], ["'--samplers'", "bogus"]),
    (["--samplers", "infill"], ["'--samplers'", "not supported"]),
    (["--sampling-seq", "kz"], ["'--sampling-seq'", "'z'"]),
    (["-l", "abc"], ["'-l'", "TOKEN_ID"]),
    (["-l", "15+nan"], ["'-l'"]),
    (["-l", "15*2"], ["'-l'"]),
    (["--xtc-probability", "1.5"], ["'--xtc-probability'", "1.5"]),
    (["--xtc-threshold", "nan"], ["'--xtc-threshold'"]),
    (["--top-nsigma", "inf"], ["'--top-nsigma'"]),
    (["--dry-multiplier", "nan"], ["'--dry-multiplier'"]),
    (["--dry-penalty-last-n", "-1"], ["'--dry-penalty-last-n'", "-1"]),  # llama.cpp refuses < 0
    (["--dynatemp-range", "inf"], ["'--dynatemp-range'"]),
    (["--min-keep", "-1"], ["'--min-keep'", "-1"]),
    (["--color", "sometimes"], ["'--color'"]),
])
def test_bad_values_name_the_flag(args, fragments):
    for cmd in (["generate", "-p", "x"], ["chat"]):
        _usage(runner.invoke(app, [*cmd, "-m", "/nonexistent/m.gguf", *args]), *fragments)


def test_logit_bias_token_out_of_the_vocabulary(smollm2_path):
    _usage(_gen(smollm2_path, "-p", "x", "-n", "1", "-l", "999999+1"), "'-l'", "999999")


NEW = ["--samplers", "--sampling-seq", "--dry-multiplier", "--dry-base", "--dry-allowed-length", "--dry-penalty-last-n",
       "--dry-sequence-breaker", "--xtc-probability", "--xtc-threshold", "--top-nsigma", "-l", "--dynatemp-range",
       "--dynatemp-exp", "--min-keep", "--grammar", "--grammar-file", "-j", "-jf", "-r", "-e", "--color", "-v",
       "--log-disable", "--version"]


def test_generate_and_chat_share_the_new_flags():
    import typer.main

    cmds = typer.main.get_command(app).commands

    def param(cmd, flag):
        found = [p for p in cmds[cmd].params if flag in p.opts or flag in p.secondary_opts]
        assert found, (cmd, flag)
        return found[0]

    for flag in NEW:
        g, c = param("generate", flag), param("chat", flag)
        assert (g.opts, g.secondary_opts, g.default, g.help) == (c.opts, c.secondary_opts, c.default, c.help), flag


def test_serve_takes_the_sampling_flags_as_defaults(smollm2_path, monkeypatch):
    """serve's --samplers, --dry-*, --xtc-*, --top-nsigma, --dynatemp-*, --min-keep (the same
    definitions as generate's) become the server's default SamplerParams."""
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    import pyllama.server as server

    seen = {}

    class Stop(Exception):
        pass

    def fake_state(model, cfg):
        seen["sampling"] = cfg.sampling
        raise Stop

    monkeypatch.setattr(server, "ServerState", fake_state)
    with pytest.raises(Stop):
        runner.invoke(app, ["serve", "-m", str(smollm2_path), "-c", "256", "--samplers", "top_k;temp",
                            "--dry-multiplier", "0.8", "--dry-base", "1.5", "--dry-allowed-length", "3",
                            "--dry-penalty-last-n", "16", "--dry-sequence-breaker", r"a\tb", "--xtc-probability",
                            "0.5", "--xtc-threshold", "0.2", "--top-nsigma", "1.5", "--dynatemp-range", "0.3",
                            "--dynatemp-exp", "1.2", "--min-keep", "5"], catch_exceptions=False)
    p = seen["sampling"]
    assert p.samplers == ["top_k", "temperature"] and p.dry_sequence_breakers == ["a\tb"]
    assert (p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n) == (0.8, 1.5, 3, 16)
    assert (p.xtc_probability, p.xtc_threshold, p.top_n_sigma, p.min_keep) == (0.5, 0.2, 1.5, 5)
    assert (p.dynatemp_range, p.dynatemp_exponent) == (0.3, 1.2)
    import typer.main

    cmds = typer.main.get_command(app).commands
    for flag in ("--samplers", "--dry-multiplier", "--xtc-threshold", "--top-nsigma", "--min-keep", "-e"):
        g = [q for q in cmds["generate"].params if flag in q.opts][0]
        s = [q for q in cmds["serve"].params if flag in q.opts][0]
        assert (g.opts, g.default, g.help) == (s.opts, s.default, s.help), flag


@pytest.mark.parametrize("argv,fragment", [
    (["generate", "-p", "x", "-c", "-1"], "error: Invalid value for '-c' / '--ctx-size': -1 is out of range"),
    (["chat", "--bogus"], "error: No such option: --bogus"),
    (["nosuch"], "error: No such command 'nosuch'"),
    (["generate", "-p", "x", "--grammar", "root ::= ("], "error: Invalid value for '--grammar':"),
])
def test_usage_errors_are_one_line(argv, fragment):
    """A usage error is one stderr line (exit 2), as llama.cpp's, with or without rich."""
    import os
    import subprocess
    import sys

    for rich in ("0", "1"):
        p = subprocess.run([sys.executable, "-c", "from pyllama.cli import app; app()", *argv], capture_output=True,
                           text=True, timeout=120, env={**os.environ, "TYPER_USE_RICH": rich})
        assert p.returncode == 2 and p.stdout == "", p
        assert p.stderr.count("\n") == 1 and p.stderr.startswith(fragment), p.stderr
    r = runner.invoke(app, argv)
    assert r.exit_code == 2 and r.stderr.startswith(fragment) and r.stderr.count("\n") == 1, r.output


def test_chat_log_disable_keeps_errors(smollm2_path):
    r = runner.invoke(app, ["chat", "-m", str(smollm2_path), "-c", "256", "-n", "2", "--temp", "0", "--log-disable"],
                      input="/read\nHi\n")
    assert r.exit_code == 0, r.output
    assert r.stderr == "error: /read needs a file name: /read FILE\n", r.stderr
    assert r.stdout.strip()


def test_serve_shares_the_chat_template_flags(smollm2_path, tmp_path, monkeypatch):
    """serve's --jinja / --chat-template-file are chat's definitions and rules."""
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    import pyllama.server as server

    seen = {}

    class Stop(Exception):
        pass

    def fake_state(model, cfg):
        seen["tmpl"] = cfg.chat_template
        raise Stop

    monkeypatch.setattr(server, "ServerState", fake_state)
    with pytest.raises(Stop):
        runner.invoke(app, ["serve", "-m", str(smollm2_path), "-c", "256", "--no-jinja"], catch_exceptions=False)
    assert seen["tmpl"] == "chatml"
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}{{ m.content }}{% endfor %}", encoding="utf-8")
    with pytest.raises(Stop):
        runner.invoke(app, ["serve", "-m", str(smollm2_path), "--chat-template-file", str(f)], catch_exceptions=False)
    assert seen["tmpl"] == f.read_text(encoding="utf-8")
    _usage(runner.invoke(app, ["serve", "-m", str(smollm2_path), "--chat-template-file", str(tmp_path / "no")]),
           "'--chat-template-file'")
    _usage(runner.invoke(app, ["serve", "-m", str(smollm2_path), "--no-jinja", "--chat-template-file", str(f)]),
           "--no-jinja", "built-in")
    import typer.main

    cmds = typer.main.get_command(app).commands
    for flag in ("--jinja", "--chat-template-file"):
        c = [q for q in cmds["chat"].params if flag in q.opts][0]
        s = [q for q in cmds["serve"].params if flag in q.opts][0]
        assert (c.opts, c.secondary_opts, c.default, c.help) == (s.opts, s.secondary_opts, s.default, s.help)


def test_flash_attn_off_runs_llama_cpps_unfused_path(smollm2_path):
    """-fa off is honoured (llama.cpp's mul_mat / soft_max / mul_mat attention) on generate,
    and gives llama.cpp's greedy continuation like on / auto; every spelling llama.cpp takes."""
    want = "The capital of France is Paris.\n\nThe United States has a population of approximately 3"
    runner = CliRunner()
    for fa in ("off", "on", "auto", "0", "disabled", "true"):
        r = runner.invoke(app, ["generate", "-m", str(smollm2_path), "-p", "The capital of France is", "-n", "14",
                                "--temp", "0", "-fa", fa, "--no-perf"])
        assert r.exit_code == 0, (fa, r.output)
        assert r.stdout.rstrip("\n") == want, (fa, r.stdout)


def test_ngl_warns_that_there_is_no_gpu(smollm2_path):
    from pyllama import gpu

    if gpu.built():
        pytest.skip("this extension has the GPU backend: -ngl offloads (tests/kernels/test_gpu.py)")
    runner = CliRunner()
    base = ["generate", "-m", str(smollm2_path), "-p", "hi", "-n", "1", "--temp", "0", "--no-perf"]
    r = runner.invoke(app, base + ["-ngl", "99"])
    assert r.exit_code == 0 and r.stderr.count("without the GPU backend") == 1, r.stderr
    r = runner.invoke(app, base)
    assert r.exit_code == 0 and "GPU" not in r.stderr
