"""`pyllama chat`: interactive chat in the terminal, llama-cli's conversation loop.

Each turn renders the whole conversation with the model's chat template (sandboxed Jinja;
chatml when the model has none), tokenizes it and decodes only what follows the longest
prefix the KV cache already holds (as llama-server does for llama-cli), then streams the
reply until an end-of-generation token. So a reply cut by Ctrl-C, /regen, /clear and /load
all just change the messages: the cache follows.

At a terminal: readline editing and history, Ctrl-C stops a reply (the partial reply stays
in the conversation, as in llama-cli) and exits at an empty prompt or when pressed twice,
Ctrl-D exits. Multi-line input: ``\"\"\"`` ... ``\"\"\"`` (ollama) or ``\\`` at a line's end
(llama-cli). Lines starting with ``/`` are commands (/help). Without a terminal, stdin is
read line by line with the same rules.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Callable, Optional

import typer

from . import _checks as O
from . import app
from ._checks import MAX_TEXT_BYTES, integer, read_file_bytes, read_text_file, utf8_text

HELP = """available commands:
  /exit, /bye, Ctrl-D   exit (Ctrl-C stops a reply; at an empty prompt it exits)
  /regen                drop the last reply and generate it again
  /clear                forget the conversation (and the KV cache)
  /read FILE            send a text file's contents as the message
  /save FILE            write the conversation as JSON messages
  /load FILE            replace the conversation with a saved one (decoded into the context)
  /help                 this list
  \"\"\" ... \"\"\"           a multi-line message; a line ending in \\ continues on the next line"""


def _template(ctx, param, value):
    """--chat-template: a built-in name, or (as llama.cpp with --jinja) a Jinja template's text
    (which must parse: a broken one is an error when the chat starts)."""
    from ..chat import BUILTIN_TEMPLATES

    if value is None or value in BUILTIN_TEMPLATES or "{%" in value or "{{" in value:
        return value
    raise typer.BadParameter(f"{value!r} is neither a built-in template ({', '.join(BUILTIN_TEMPLATES)}) "
                             "nor a Jinja template (text with {% or {{)")


def _read_line(n: int) -> Optional[str]:
    """The next line of standard input without its newline (None at EOF): at most
    MAX_TEXT_BYTES, and UTF-8, or an error line and exit 1 (a script's input is wrong)."""
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
    return line.rstrip("\r\n") if line.endswith("\r\n") else line.rstrip("\n")


class ChatLoop:
    """The conversation (messages) on a Session; the KV cache holds a prefix of its
    rendered tokens."""

    def __init__(self, sess, template: Optional[str] = None, system: Optional[str] = None,
                 shift: bool = False, n_keep: int = 0):
        from ..chat import ChatFormat

        self.sess = sess
        self.format = ChatFormat(sess.model, sess.vocab, template, origin="--chat-template")
        self.template_name = self.format.name
        self.system = system
        self.shift = shift      # a full context shifts (and old messages go) instead of stopping
        self.n_keep = n_keep
        self.dropped = 0        # messages the last turn dropped to fit
        self.stops = None       # -r: a reply ends where it ends with one (O.ReversePrompts)
        self.messages: list[dict] = []
        self.clear()

    def clear(self) -> None:
        """Back to the system message alone, with an empty KV cache."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.sess.reset()

    def render(self, add_ass: bool) -> str:
        return self.format.render(self.messages, add_ass)

    def tokens(self, add_ass: bool) -> list[int]:
        """The rendered conversation's tokens; BOS added unless the template prints it."""
        return self.format.tokens(self.messages, add_ass)

    def turn(self, user: str, sampler, max_tokens: int = -1, write=None,
             stop: Optional[Callable[[], bool]] = None) -> str:
        """Add the user message, generate and return the reply (pieces go to ``write``).
        A prompt that does not fit the context raises ContextFullError, the message dropped."""
        self.messages.append({"role": "user", "content": user})
        try:
            self.dropped = self.fit() if self.shift else 0
            return self.reply(sampler, max_tokens, write, stop)
        except BaseException:
            if self.messages and self.messages[-1]["role"] == "user":
                self.messages.pop()
            raise

    def fit(self) -> int:
        """Drop the oldest messages (never the system message or the new one) until the
        conversation leaves a quarter of the context for the reply, as ollama truncates;
        how many were dropped."""
        n = 0
        first = 1 if self.messages and self.messages[0]["role"] == "system" else 0
        while len(self.messages) - first > 1 and len(self.tokens(True)) > self.sess.n_ctx * 3 // 4:
            del self.messages[first]
            n += 1
        return n

    def reply(self, sampler, max_tokens: int = -1, write=None, stop: Optional[Callable[[], bool]] = None) -> str:
        """Generate the assistant's reply to the conversation as it is and append it; stop
        early (keeping what was said) when ``stop()`` turns true or the context is full."""
        from ..generation import TextStream

        stream = TextStream(self.sess.vocab, special=True)
        out = []
        seen = ""
        toks = self.tokens(True)
        pre = None
        if stop is not None:
            # the prompt first, with stop() as the abort callback: a long prompt (/read,
            # /load) can be interrupted between micro-batches
            pre = self._eval_prompt(toks, stop)
            if pre is None:
                self.messages.append({"role": "assistant", "content": ""})
                return ""
        gen = self.sess.generate(toks, sampler, max_tokens, shift=self.shift, n_keep=self.n_keep)
        try:
            for tok in gen:
                piece = stream.feed(tok)
                if piece:
                    out.append(piece)
                    if write:
                        write(piece)
                    if self.stops:
                        seen = (seen + piece)[-4096:]
                        if self.stops.found(seen):
                            break
                if stop is not None and stop():
                    break
        finally:
            gen.close()  # the last token is decoded, so the next turn reuses the whole cache
            if pre is not None:  # generate re-decoded the prompt's last token only: count it all
                st = self.sess.stats
                st.n_prompt, st.n_reused, st.t_prompt_s = pre.n_prompt, pre.n_reused, st.t_prompt_s + pre.t_prompt_s
        tail = stream.flush()
        if tail:
            out.append(tail)
            if write:
                write(tail)
        reply = "".join(out)
        self.messages.append({"role": "assistant", "content": reply})
        return reply

    def _eval_prompt(self, toks: list[int], stop: Callable[[], bool]):
        """``sess.eval_prompt(toks)`` that ``stop()`` can abort: its stats, or None when
        aborted (the cache is cut back to the tokens the session knows it holds)."""
        from ..errors import Aborted

        sess = self.sess
        sess.ctx.set_abort_callback(stop)
        try:
            sess.eval_prompt(toks)
        except Aborted:
            # llama_decode keeps the micro-batches it finished; Session has not counted them
            sess.ctx.seq_rm(0, len(sess.tokens), -1)
            return None
        finally:
            sess.ctx.set_abort_callback(None)  # the one-token fast path needs none
        return sess.stats

    def regen_ready(self) -> bool:
        """Drop the last reply (True), or False when there is none to drop."""
        if self.messages and self.messages[-1]["role"] == "assistant":
            self.messages.pop()
            return True
        return False

    def load(self, messages: list[dict]) -> int:
        """Replace the conversation and decode it into the context; the token count. A
        conversation too long for the context raises ContextFullError, nothing changed."""
        old = self.messages
        self.messages = messages
        try:
            toks = self.tokens(False)
            if len(toks) > self.sess.n_ctx:
                from ..errors import ContextFullError

                raise ContextFullError(f"the conversation is {len(toks)} tokens, over the context size "
                                       f"n_ctx = {self.sess.n_ctx}; use a larger -c")
            if toks:
                self.sess.eval_prompt(toks)
            else:
                self.sess.reset()
        except BaseException:
            self.messages = old
            raise
        return len(toks)


def parse_messages(data: str, name: str) -> list[dict]:
    """/load's file: a JSON list of {"role": str, "content": str}, or ValueError saying why."""
    try:
        msgs = json.loads(data)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name} is not JSON: {e}") from None
    if isinstance(msgs, dict) and isinstance(msgs.get("messages"), list):
        msgs = msgs["messages"]  # an OpenAI-style request body
    if not isinstance(msgs, list):
        raise ValueError(f"{name}: expected a JSON list of messages, got {type(msgs).__name__}")
    out = []
    for i, m in enumerate(msgs):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ValueError(f"{name}: message {i} is not {{\"role\": text, \"content\": text}}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


class _Interrupt:
    """SIGINT while a reply is generated: the first sets ``hit`` (the loop stops after the
    current token, so the KV cache and the messages stay in step), a second one exits as
    llama-cli does (KeyboardInterrupt, caught by the command: exit 130)."""

    def __init__(self):
        self.hit = False
        self._old = None

    def _handler(self, signum, frame):
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True

    def __enter__(self):
        self.hit = False
        try:
            self._old = signal.signal(signal.SIGINT, self._handler)
        except ValueError:  # not the main thread: Ctrl-C keeps its default meaning
            self._old = None
        return self

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
        return False


class _Reader:
    """Messages from the terminal (readline) or from piped stdin. ``read()`` returns the
    next message (multi-line input joined), None at EOF; at a terminal Ctrl-C raises
    KeyboardInterrupt with ``pending`` telling whether any text was typed."""

    def __init__(self, tty: bool, color: bool):
        self.tty = tty
        self.n_line = 0
        self.pending = False
        self._rl = None
        if tty:
            try:
                import readline  # noqa: F401  (input() then edits lines and keeps history)

                self._rl = readline
            except ImportError:  # e.g. Windows without pyreadline: plain input()
                pass
        # \001 \002 tell readline the escape sequences take no room on the line
        wrap = (lambda s: f"\001{s}\002") if self._rl is not None else (lambda s: s)
        self.prompt = f"{wrap(chr(27) + '[32m')}> {wrap(chr(27) + '[0m')}" if color else "> "
        self.more = f"{wrap(chr(27) + '[32m')}. {wrap(chr(27) + '[0m')}" if color else ". "

    def _on_sigint(self, signum, frame):
        # readline runs this before it frees the line, so the typed text is still there
        if self._rl is not None and self._rl.get_line_buffer():
            self.pending = True
        raise KeyboardInterrupt

    def _line(self, prompt: str) -> Optional[str]:
        self.n_line += 1
        if not self.tty:
            return _read_line(self.n_line)
        try:
            old = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread
            old = None
        try:
            line = input(prompt)
        except EOFError:
            sys.stdout.write("\n")
            return None
        except UnicodeDecodeError as e:
            raise ValueError(f"input is not UTF-8 text ({e.reason} at byte {e.start})") from None
        finally:
            if old is not None:
                signal.signal(signal.SIGINT, old)
        if len(line.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
            raise ValueError(f"the line is longer than {MAX_TEXT_BYTES // 2**20} MiB")
        return line

    def read(self) -> Optional[str]:
        self.pending = False
        line = self._line(self.prompt)
        if line is None:
            return None
        if line.lstrip().startswith('"""'):
            # ollama: """ opens a block that ends at a line ending in """ (one line included)
            rest = line.lstrip()[3:]
            parts = []
            while not rest.rstrip().endswith('"""'):
                parts.append(rest)
                self.pending = True
                rest = self._line(self.more)
                if rest is None:
                    return None
            parts.append(rest.rstrip()[:-3])
            if parts and not parts[0].strip():
                parts.pop(0)
            text = "\n".join(parts)
        else:
            # llama-cli: a line ending in \ continues on the next one
            parts = []
            while line.endswith("\\"):
                parts.append(line[:-1])
                self.pending = True
                line = self._line(self.more)
                if line is None:
                    return None
            parts.append(line)
            text = "\n".join(parts)
        if len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
            raise ValueError(f"the message is longer than {MAX_TEXT_BYTES // 2**20} MiB")
        return text


def _timings(sess) -> str:
    st = sess.stats
    pp = st.n_prompt / st.t_prompt_s if st.t_prompt_s > 0 else 0.0
    tg = st.n_gen / st.t_gen_s if st.t_gen_s > 0 else 0.0
    return f"[ Prompt: {pp:.1f} t/s | Generation: {tg:.1f} t/s ]"


@app.command()
def chat(
    model: Optional[Path] = typer.Option(None, "-m", "--model", help="GGUF file (default: SmolLM2-135M-Instruct)"),
    hf_repo: Optional[str] = O.opt_hf_repo(),
    hf_file: Optional[str] = O.opt_hf_file(),
    hf_token: Optional[str] = O.opt_hf_token(),
    system: Optional[str] = typer.Option(None, "-sys", "--system", "--system-prompt", help="system message"),
    chat_template: Optional[str] = typer.Option(
        None, "--chat-template", callback=_template,
        help="built-in template name (chatml, llama2, llama3, gemma, phi3, ...) or a Jinja template's text, "
             "instead of the model's"),
    n_predict: int = typer.Option(-1, "-n", "--n-predict", callback=integer(-2, note="-1 or -2 = until the end"),
                                  help="max tokens per reply (-1 or -2 = until end of turn)"),
    show_timings: bool = typer.Option(True, "--show-timings/--no-show-timings",
                                      help="print [ Prompt: t/s | Generation: t/s ] after each reply (stderr)"),
    ctx_size: int = O.opt_ctx_size(),
    batch_size: int = O.opt_batch_size(),
    ubatch_size: int = O.opt_ubatch_size(),
    threads: Optional[int] = O.opt_threads(),
    threads_batch: Optional[int] = O.opt_threads_batch(),
    gpu_layers: int = O.opt_gpu_layers(),
    no_kv_offload: bool = O.opt_no_kv_offload(),
    split_mode: str = O.opt_split_mode(),
    tensor_split: Optional[str] = O.opt_tensor_split(),
    main_gpu: int = O.opt_main_gpu(),
    load_mode: str = O.opt_load_mode(),
    cache_type_k: str = O.opt_cache_type_k(),
    cache_type_v: str = O.opt_cache_type_v(),
    flash_attn: str = O.opt_flash_attn(),
    temp: float = O.opt_temp(),
    top_k: int = O.opt_top_k(),
    top_p: float = O.opt_top_p(),
    min_p: float = O.opt_min_p(),
    typical: float = O.opt_typical(),
    repeat_penalty: float = O.opt_repeat_penalty(),
    repeat_last_n: int = O.opt_repeat_last_n(),
    presence_penalty: float = O.opt_presence_penalty(),
    frequency_penalty: float = O.opt_frequency_penalty(),
    mirostat: int = O.opt_mirostat(),
    mirostat_lr: float = O.opt_mirostat_lr(),
    mirostat_ent: float = O.opt_mirostat_ent(),
    seed: int = O.opt_seed(),
    samplers: Optional[str] = O.opt_samplers(),
    sampling_seq: Optional[str] = O.opt_sampling_seq(),
    dry_multiplier: float = O.opt_dry_multiplier(),
    dry_base: float = O.opt_dry_base(),
    dry_allowed_length: int = O.opt_dry_allowed_length(),
    dry_penalty_last_n: int = O.opt_dry_penalty_last_n(),
    dry_sequence_breaker: Optional[list[str]] = O.opt_dry_sequence_breaker(),
    xtc_probability: float = O.opt_xtc_probability(),
    xtc_threshold: float = O.opt_xtc_threshold(),
    top_nsigma: float = O.opt_top_nsigma(),
    logit_bias: Optional[list[str]] = O.opt_logit_bias(),
    dynatemp_range: float = O.opt_dynatemp_range(),
    dynatemp_exp: float = O.opt_dynatemp_exp(),
    min_keep: int = O.opt_min_keep(),
    grammar: Optional[str] = O.opt_grammar(),
    grammar_file: Optional[Path] = O.opt_grammar_file(),
    json_schema: Optional[str] = O.opt_json_schema(),
    json_schema_file: Optional[Path] = O.opt_json_schema_file(),
    reverse_prompt: Optional[list[str]] = O.opt_reverse_prompt(),
    escape: bool = O.opt_escape(),
    prompt: Optional[str] = typer.Option(None, "-p", "--prompt", help="the first user message"),
    single_turn: bool = typer.Option(False, "-st", "--single-turn",
                                     help="one turn, then exit (with -p: no input is read)"),
    jinja: bool = O.opt_jinja(),
    chat_template_file: Optional[Path] = O.opt_chat_template_file(),
    color: str = O.opt_color(),
    verbose: bool = O.opt_verbose(),
    log_disable: bool = O.opt_log_disable(),
    version: bool = O.opt_version(),
    context_shift: bool = typer.Option(True, "--context-shift/--no-context-shift",
                                       help="when the context is full, drop the oldest tokens / messages and go on"),
    keep: int = typer.Option(0, "--keep", callback=integer(0), help="tokens a context shift keeps at the start"),
    lora: Optional[list[str]] = O.opt_lora(),
    lora_scaled: Optional[list[str]] = O.opt_lora_scaled(),
    control_vector: Optional[list[str]] = O.opt_control_vector(),
    control_vector_scaled: Optional[list[str]] = O.opt_control_vector_scaled(),
    control_vector_layer_range: Optional[tuple[int, int]] = O.opt_control_vector_layer_range(),
) -> None:
    """Chat with a model in the terminal (/help lists the commands; Ctrl-D or /exit to quit)."""
    from ..errors import PyllamaError
    from .generate import freeze_heap, open_session, sampler_from_flags, with_grammar

    O.setup_logging(verbose, log_disable)
    if escape:  # llama.cpp's -e: the system prompt, reverse prompts and -p (not what is typed)
        system = O.process_escapes(system) if system is not None else None
        prompt = O.process_escapes(prompt) if prompt is not None else None
        reverse_prompt = [O.process_escapes(r) for r in reverse_prompt or []]
    gram = O.one_grammar(grammar, grammar_file, json_schema, json_schema_file)

    loras = O.adapter_files(lora, lora_scaled, "--lora")
    cvecs = O.adapter_files(control_vector, control_vector_scaled, "--control-vector")
    model = O.model_by_name(model, hf_repo, hf_file, hf_token)
    from .serve import model_template

    chat_template = O.chat_template_arg(chat_template, chat_template_file, jinja, lambda: model_template(model))
    try:
        path, sess = open_session(model, ctx_size=ctx_size, batch_size=batch_size, ubatch_size=ubatch_size,
                                  threads=threads, threads_batch=threads_batch, load_mode=load_mode,
                                  cache_type_k=cache_type_k, cache_type_v=cache_type_v, flash_attn=flash_attn,
                                  loras=loras, control_vectors=cvecs, cvec_range=control_vector_layer_range,
                                  quiet=log_disable, gpu_layers=gpu_layers, kv_offload=not no_kv_offload,
                                  split_mode=split_mode, tensor_split=tensor_split, main_gpu=main_gpu)
        chain = sampler_from_flags(sess, temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, typical=typical,
                                   repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                   presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                   mirostat=mirostat, mirostat_lr=mirostat_lr, mirostat_ent=mirostat_ent, seed=seed,
                                   samplers=samplers, sampling_seq=sampling_seq, dry_multiplier=dry_multiplier,
                                   dry_base=dry_base, dry_allowed_length=dry_allowed_length,
                                   dry_penalty_last_n=dry_penalty_last_n,
                                   dry_sequence_breakers=O.dry_breakers(dry_sequence_breaker, escape),
                                   xtc_probability=xtc_probability, xtc_threshold=xtc_threshold,
                                   top_nsigma=top_nsigma, logit_bias=logit_bias, dynatemp_range=dynatemp_range,
                                   dynatemp_exp=dynatemp_exp, min_keep=min_keep)
        loop = ChatLoop(sess, chat_template, system, shift=context_shift, n_keep=keep)
        loop.stops = O.ReversePrompts(reverse_prompt, padding=0)
        freeze_heap()
    except (BrokenPipeError, typer.Exit, typer.BadParameter):  # a closed stdout, our own exit, usage
        raise
    except Exception as e:
        raise O.fail(e, verbose) from None

    def fresh_sampler():
        # a grammar constrains each reply from its start state
        return with_grammar(sess, chain, gram) if gram is not None else chain

    tty = sys.stdin.isatty()
    color = O.use_color(color)
    def say(s: str) -> None:
        """Messages go to stderr (replies to stdout); --log-disable keeps only the errors."""
        if not log_disable or s.startswith("error:"):
            typer.echo(s, err=True)

    say(f"model      : {path.name} ({sess.model.desc})\n"
        f"n_ctx      : {sess.n_ctx}\n"
        f"template   : {loop.template_name}\n"
        + ("using a system prompt\n" if system else "")
        + "type /help for the commands, Ctrl-C to stop a reply, Ctrl-D or /exit to quit\n")

    def write(s: str) -> None:
        sys.stdout.write(s)
        sys.stdout.flush()

    def respond(user: Optional[str], intro: Optional[str] = None) -> bool:
        """Generate a reply (to ``user``, or to the conversation as it is); True when
        Ctrl-C cut it. ``intro`` is said once Ctrl-C already means "stop the reply", so a
        Ctrl-C right after it cannot end the chat instead."""
        try:
            with _Interrupt() as intr:
                if intro is not None:
                    say(intro)
                if color:
                    write("\033[33m")
                sampler = fresh_sampler()
                if user is None:
                    loop.reply(sampler, n_predict, write=write, stop=lambda: intr.hit)
                else:
                    loop.turn(user, sampler, n_predict, write=write, stop=lambda: intr.hit)
        except PyllamaError as e:
            from ..errors import ContextFullError

            write("\033[0m\n" if color else "\n")
            if not isinstance(e, ContextFullError):
                raise
            say(f"error: {e}\n(/clear starts a new conversation" + (
                "; --context-shift drops old messages to make room)" if not context_shift else ")"))
            return False
        write("\033[0m\n" if color else "\n")
        if intr.hit:
            say("[ reply interrupted: kept in the conversation; Ctrl-C again or Ctrl-D to exit ]")
        if loop.dropped:
            say(f"[ context: the {loop.dropped} oldest messages were dropped to make room ]")
            loop.dropped = 0
        if sess.stats.n_shifted:
            say(f"[ context full (n_ctx = {sess.n_ctx}): shifted, {sess.stats.n_shifted} earlier tokens dropped ]")
        if sess.stats.stop_reason == "ctx":
            say(f"[ context full (n_ctx = {sess.n_ctx}): the reply was cut; /clear starts a new conversation"
                + (", --context-shift would go on ]" if not context_shift else " ]"))
        if show_timings:
            say(_timings(sess))
        return intr.hit

    reader = _Reader(tty, color)
    interrupted = False  # the last thing that happened was a Ctrl-C
    first = prompt  # -p: the first message, as if typed
    try:
        while True:
            try:
                text, first = (first, None) if first is not None else (reader.read(), None)
            except KeyboardInterrupt:
                if interrupted or not reader.pending:
                    write("\n")
                    break
                write("\n")
                say("[ input discarded; Ctrl-C again or Ctrl-D to exit ]")
                interrupted = True
                continue
            except ValueError as e:
                say(f"error: {e}")
                continue
            if text is None:
                break
            interrupted = False
            if not text.strip():
                continue  # an empty line does not end the chat
            if text.startswith("/"):
                cmd, _, arg = text.partition(" ")
                arg = arg.strip()
                if cmd in ("/exit", "/bye", "/quit"):
                    break
                if cmd in ("/help", "/?"):
                    say(HELP)
                elif cmd == "/clear":
                    loop.clear()
                    say("Chat history cleared.")
                elif cmd == "/regen":
                    if loop.regen_ready():
                        interrupted = respond(None)
                    else:
                        say("error: no reply to regenerate")
                elif cmd == "/read":
                    if not arg:
                        say("error: /read needs a file name: /read FILE")
                        continue
                    try:
                        content = read_text_file(Path(arg).expanduser(), "/read")
                    except typer.BadParameter as e:
                        say(f"error: {e.message}")
                        continue
                    if not content.strip():
                        say(f"error: {arg} is empty")
                        continue
                    interrupted = respond(content, f"Loaded text from '{arg}' ({len(content)} characters)")
                elif cmd == "/save":
                    if not arg:
                        say("error: /save needs a file name: /save FILE")
                        continue
                    try:
                        Path(arg).expanduser().write_text(
                            json.dumps(loop.messages, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
                    except OSError as e:
                        say(f"error: cannot write {arg}: {e.strerror or e}")
                        continue
                    say(f"Saved {len(loop.messages)} messages to '{arg}'")
                elif cmd == "/load":
                    if not arg:
                        say("error: /load needs a file name: /load FILE")
                        continue
                    try:
                        p = Path(arg).expanduser()
                        msgs = parse_messages(utf8_text(read_file_bytes(p, "/load"), arg, "/load"), arg)
                        n_tok = loop.load(msgs)
                    except typer.BadParameter as e:
                        say(f"error: {e.message}")
                        continue
                    except (ValueError, PyllamaError) as e:
                        say(f"error: {e}")
                        continue
                    say(f"Loaded {len(msgs)} messages from '{arg}' ({n_tok} tokens in the context)")
                else:
                    say(f"unknown command {cmd}: /help lists the commands")
                continue
            interrupted = respond(text)
            if single_turn:  # -st: one reply, then exit
                break
    except KeyboardInterrupt:  # a second Ctrl-C while a reply was being generated
        write("\033[0m\n" if color else "\n")
        raise typer.Exit(130) from None
    except BrokenPipeError:
        raise
    except Exception as e:
        typer.echo("", err=True)
        raise O.fail(e, verbose) from None
    if tty:
        say("Exiting...")
