"""`pyllama chat`: interactive chat, llama.cpp's examples/simple-chat loop.

Each turn renders the whole conversation with the model's chat template (sandboxed Jinja;
chatml when the model has none), sends only the part after what was already decoded, and
streams the reply until an end-of-generation token. BOS is added on the first turn only
(and not when the template prints it itself). An empty line or EOF ends the chat.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from . import app
from ._checks import (BATCH, CTX_SIZE, FINITE, MAX_TEXT_BYTES, PROBABILITY, SEED, UBATCH, integer,
                      kv_cache_type, load_mode as _load_mode, repeat_penalty as _repeat_penalty,
                      utf8_text)


def _template(ctx, param, value):
    """--chat-template: a built-in name, or (as llama.cpp with --jinja) a Jinja template's text."""
    from ..chat import BUILTIN_TEMPLATES

    if value is None or value in BUILTIN_TEMPLATES or "{%" in value or "{{" in value:
        return value
    raise typer.BadParameter(f"{value!r} is neither a built-in template ({', '.join(BUILTIN_TEMPLATES)}) "
                             "nor a Jinja template (text with {% or {{)")


def _read_line(n: int) -> Optional[str]:
    """The next line of standard input without its newline (None at EOF): at most
    MAX_TEXT_BYTES, and UTF-8, or an error line and exit 1."""
    buf = getattr(sys.stdin, "buffer", None)
    line = buf.readline(MAX_TEXT_BYTES + 1) if buf is not None else sys.stdin.readline(MAX_TEXT_BYTES + 1)
    if not line:
        return None
    if len(line) > MAX_TEXT_BYTES:
        typer.echo(f"error: input line {n} is longer than {MAX_TEXT_BYTES // 2**20} MiB", err=True)
        raise typer.Exit(1)
    if isinstance(line, bytes):
        try:
            line = utf8_text(line, f"input line {n}", flag=None)
        except typer.BadParameter as e:
            typer.echo(f"error: {e.message}", err=True)
            raise typer.Exit(1) from None
    return line.rstrip("\n")


class ChatLoop:
    """The conversation state of simple-chat: messages and how much of the rendered text
    the KV cache already holds."""

    def __init__(self, sess, template: Optional[str] = None, system: Optional[str] = None):
        from ..chat import BUILTIN_TEMPLATES, ChatTemplate
        from ..llama import _token_text

        self.sess = sess
        v = sess.vocab
        self.bos_text = _token_text(v, v.bos)
        src = template if template is not None else sess.model.chat_template()
        if src and src not in BUILTIN_TEMPLATES:
            self._tmpl = ChatTemplate(src, bos_token=self.bos_text, eos_token=_token_text(v, v.eos),
                                      name="chat template")
            self._builtin = None
        else:
            self._tmpl = None
            self._builtin = src or "chatml"
        self.messages: list[dict] = [{"role": "system", "content": system}] if system else []
        self.prev_len = 0

    def render(self, add_ass: bool) -> str:
        from ..chat import apply_builtin

        if self._tmpl is not None:
            return self._tmpl.render(self.messages, add_ass)
        return apply_builtin(self._builtin, self.messages, add_ass)

    def turn(self, user: str, sampler, max_tokens: int = -1, write=None) -> str:
        """Add the user message, generate and return the reply (pieces go to ``write``)."""
        from ..generation import TextStream

        self.messages.append({"role": "user", "content": user})
        formatted = self.render(True)
        prompt = formatted[self.prev_len:]
        is_first = not self.sess.tokens
        add_bos = is_first and not (self.bos_text and formatted.startswith(self.bos_text))
        new = self.sess.tokenize(prompt, add_special=add_bos, parse_special=True)
        stream = TextStream(self.sess.vocab, special=True)
        out = []
        for tok in self.sess.generate(self.sess.tokens + new, sampler, max_tokens):
            piece = stream.feed(tok)
            if piece:
                out.append(piece)
                if write:
                    write(piece)
        tail = stream.flush()
        if tail:
            out.append(tail)
            if write:
                write(tail)
        reply = "".join(out)
        self.messages.append({"role": "assistant", "content": reply})
        self.prev_len = len(self.render(False))
        return reply


@app.command()
def chat(
    model: Optional[Path] = typer.Option(None, "-m", "--model", help="GGUF file (default: SmolLM2-135M-Instruct)"),
    system: Optional[str] = typer.Option(None, "-sys", "--system", "--system-prompt", help="system message"),
    chat_template: Optional[str] = typer.Option(
        None, "--chat-template", callback=_template,
        help="built-in template name (chatml, llama2, llama3, gemma, phi3, ...) or a Jinja template's text, "
             "instead of the model's"),
    ctx_size: int = typer.Option(4096, "-c", "--ctx-size", callback=CTX_SIZE,
                                 help="context size (0 = from the model, capped at 4096)"),
    batch_size: int = typer.Option(2048, "-b", "--batch-size", callback=BATCH),
    ubatch_size: int = typer.Option(512, "-ub", "--ubatch-size", callback=UBATCH, help="physical batch size (0 = -b)"),
    n_predict: int = typer.Option(-1, "-n", "--n-predict", callback=integer(-2, note="-1 or -2 = until the end"),
                                  help="max tokens per reply (-1 or -2 = until end of turn)"),
    threads: Optional[int] = typer.Option(None, "-t", "--threads", help="(<= 0 = the default)"),
    threads_batch: Optional[int] = typer.Option(None, "-tb", "--threads-batch", help="(<= 0 = the default)"),
    load_mode: str = typer.Option("auto", "-lm", "--load-mode", callback=_load_mode),
    cache_type_k: str = typer.Option("f16", "-ctk", "--cache-type-k", callback=kv_cache_type),
    cache_type_v: str = typer.Option("f16", "-ctv", "--cache-type-v", callback=kv_cache_type),
    temp: float = typer.Option(0.8, "--temp", callback=FINITE, help="(<= 0: greedy)"),
    top_k: int = typer.Option(40, "--top-k", help="(<= 0 = off)"),
    top_p: float = typer.Option(0.95, "--top-p", callback=PROBABILITY, help="in [0, 1] (1.0 = off)"),
    min_p: float = typer.Option(0.05, "--min-p", callback=PROBABILITY, help="in [0, 1] (0.0 = off)"),
    repeat_penalty: float = typer.Option(1.0, "--repeat-penalty", callback=_repeat_penalty, help="> 0 (1.0 = off)"),
    seed: int = typer.Option(-1, "-s", "--seed", callback=SEED, help="0..4294967295 (-1 = random)"),
) -> None:
    """Chat with a model in the terminal (empty line or Ctrl-D to quit)."""
    from ..errors import PyllamaError
    from .generate import freeze_heap, open_session, sampler_from_flags

    try:
        _path, sess = open_session(model, ctx_size=ctx_size, batch_size=batch_size, ubatch_size=ubatch_size,
                                   threads=threads, threads_batch=threads_batch, load_mode=load_mode,
                                   cache_type_k=cache_type_k, cache_type_v=cache_type_v)
        sampler = sampler_from_flags(sess, temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, typical=1.0,
                                     repeat_penalty=repeat_penalty, repeat_last_n=64, presence_penalty=0.0,
                                     frequency_penalty=0.0, mirostat=0, mirostat_lr=0.1, mirostat_ent=5.0, seed=seed)
        loop = ChatLoop(sess, chat_template, system)
        freeze_heap()
    except (BrokenPipeError, typer.Exit):  # a closed stdout (typer exits quietly) or our own exit
        raise
    except (PyllamaError, FileNotFoundError, ValueError, OSError, MemoryError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    tty = sys.stdin.isatty()
    n_line = 0
    while True:
        if tty:
            sys.stdout.write("\033[32m> \033[0m")
            sys.stdout.flush()
        n_line += 1
        line = _read_line(n_line)
        if line is None or not line.strip():
            break
        if tty:
            sys.stdout.write("\033[33m")
        try:
            loop.turn(line, sampler, n_predict, write=lambda s: (sys.stdout.write(s), sys.stdout.flush()))
        except (PyllamaError, ValueError, MemoryError) as e:
            typer.echo(f"\nerror: {e}", err=True)
            raise typer.Exit(1) from None
        sys.stdout.write("\033[0m\n" if tty else "\n")
        sys.stdout.flush()
