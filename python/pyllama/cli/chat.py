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
    chat_template: Optional[str] = typer.Option(None, "--chat-template", help="built-in template name (chatml, llama3, gemma, ...) instead of the model's"),
    ctx_size: int = typer.Option(4096, "-c", "--ctx-size"),
    batch_size: int = typer.Option(2048, "-b", "--batch-size"),
    ubatch_size: int = typer.Option(512, "-ub", "--ubatch-size"),
    n_predict: int = typer.Option(-1, "-n", "--n-predict", help="max tokens per reply (-1 = until end of turn)"),
    threads: Optional[int] = typer.Option(None, "-t", "--threads"),
    threads_batch: Optional[int] = typer.Option(None, "-tb", "--threads-batch"),
    load_mode: str = typer.Option("auto", "-lm", "--load-mode"),
    cache_type_k: str = typer.Option("f16", "-ctk", "--cache-type-k"),
    cache_type_v: str = typer.Option("f16", "-ctv", "--cache-type-v"),
    temp: float = typer.Option(0.8, "--temp"),
    top_k: int = typer.Option(40, "--top-k"),
    top_p: float = typer.Option(0.95, "--top-p"),
    min_p: float = typer.Option(0.05, "--min-p"),
    repeat_penalty: float = typer.Option(1.0, "--repeat-penalty"),
    seed: int = typer.Option(-1, "-s", "--seed"),
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
    except (PyllamaError, FileNotFoundError, ValueError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    tty = sys.stdin.isatty()
    while True:
        if tty:
            sys.stdout.write("\033[32m> \033[0m")
            sys.stdout.flush()
        line = sys.stdin.readline()
        if not line or not line.strip():
            break
        if tty:
            sys.stdout.write("\033[33m")
        try:
            loop.turn(line.rstrip("\n"), sampler, n_predict, write=lambda s: (sys.stdout.write(s), sys.stdout.flush()))
        except (PyllamaError, ValueError) as e:
            typer.echo(f"\nerror: {e}", err=True)
            raise typer.Exit(1) from None
        sys.stdout.write("\033[0m\n" if tty else "\n")
        sys.stdout.flush()
