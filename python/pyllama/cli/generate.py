"""`pyllama generate`: complete a prompt (llama.cpp's llama-cli / llama-simple flags).

Prints the prompt, then streams the continuation to stdout as it is sampled; the
llama_perf summary (sampler and context timings) goes to stderr. Without -m it runs the
default model (SmolLM2-135M-Instruct), fetched once into the cache directory.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from . import app
from . import _checks as O
from ._checks import integer, read_text_file, threads as _threads


def open_session(model: Optional[Path], *, ctx_size: int, batch_size: int, ubatch_size: int,
                 threads: Optional[int], threads_batch: Optional[int], load_mode: str,
                 cache_type_k: str, cache_type_v: str, flash_attn: str = "auto", quiet: bool = False,
                 loras: Optional[list] = None, control_vectors: Optional[list] = None,
                 cvec_range: Optional[tuple] = None, gpu_layers: int = 0, kv_offload: bool = True,
                 split_mode: str = "layer", tensor_split: Optional[list] = None, main_gpu: int = 0):
    """Model path (or the default model) -> (path, Session), with a progress bar on stderr.
    ``loras`` / ``control_vectors``: [(path, scale)] applied to the session's context as
    llama.cpp's common_init_from_params does (see :func:`apply_adapters`)."""
    from ..generation import Session, load_model, progress_bar, resolve_model_path

    path = resolve_model_path(model, progress=not quiet)
    m = load_model(path, load_mode=load_mode, progress=None if quiet else progress_bar(f"loading {path.name}"),
                   n_gpu_layers=gpu_layers, split_mode=split_mode, tensor_split=tensor_split, main_gpu=main_gpu)
    n_ctx = ctx_size
    if n_ctx <= 0:
        n_ctx = min(int(m.n_ctx_train), 4096) if int(m.n_ctx_train) > 0 else 4096
    params = {"n_ctx": n_ctx, "n_batch": batch_size, "n_ubatch": min(ubatch_size, batch_size),
              "type_k": cache_type_k, "type_v": cache_type_v,
              "flash_attn_type": O.FLASH_ATTN_TYPES.get(flash_attn, -1),
              "no_perf": False, "offload_kqv": kv_offload}
    threads, threads_batch = _threads(threads), _threads(threads_batch)  # <= 0: the default, as llama.cpp
    if threads is not None:
        params["n_threads"] = threads
        params["n_threads_batch"] = threads_batch if threads_batch is not None else threads
    elif threads_batch is not None:
        params["n_threads_batch"] = threads_batch
    sess = Session(m, **params)
    apply_adapters(sess, loras or [], control_vectors or [], cvec_range)
    return path, sess


def apply_adapters(sess, loras: list, control_vectors: list, cvec_range: Optional[tuple]) -> None:
    """--lora / --lora-scaled and --control-vector[-scaled] / --control-vector-layer-range,
    with llama.cpp's rules: every adapter loaded, then all set at once; control vectors
    summed (ControlVector.load) and applied to layers [start, end], where start <= 0
    means 1 and end <= 0 the last layer."""
    from ..adapter import ControlVector, LoraAdapter

    if control_vectors:
        n_layer = int(sess.model.hparams["n_layer"])
        start, end = cvec_range if cvec_range is not None else (-1, -1)
        start = 1 if start <= 0 else start
        end = n_layer if end <= 0 else end
        sess.ctx.set_control_vector(ControlVector.load(control_vectors), layer_start=start, layer_end=end)
    elif cvec_range is not None:
        typer.echo("warning: --control-vector-layer-range is only used with --control-vector: ignored", err=True)
    if loras:
        sess.ctx.set_lora_adapters([(LoraAdapter(sess.model, p), s) for p, s in loras])


def freeze_heap() -> None:
    """Move everything alive now (the vocabulary's hundreds of thousands of strings, lists
    and dicts, the model's metadata) out of the cyclic garbage collector's sight.

    Each token allocates a few hundred short-lived objects, so collections keep running
    during generation, and the older generations' collections walk the whole vocabulary:
    ~1% of a token's time on Gemma 3 (perf: gc_collect_main, visit_decref). These objects
    live as long as the process, which is what ``gc.freeze`` is for. CLI only: a library
    should not change the caller's collector."""
    import gc

    gc.collect()
    gc.freeze()


def sampler_params(*, temp, top_k, top_p, min_p, typical, repeat_penalty, repeat_last_n, presence_penalty,
                   frequency_penalty, mirostat, mirostat_lr, mirostat_ent, seed, no_perf: bool = False,
                   samplers=None, sampling_seq=None, dry_multiplier=0.0, dry_base=1.75, dry_allowed_length=2,
                   dry_penalty_last_n=64, dry_sequence_breakers=None, xtc_probability=0.0, xtc_threshold=0.1,
                   top_nsigma=-1.0, logit_bias=None, dynatemp_range=0.0, dynatemp_exp=1.0, min_keep=0):
    """The sampling flags (shared by generate, chat and serve) as SamplerParams; seed -1 = random.
    ``samplers`` / ``sampling_seq``: SamplerParams names (the --samplers / --sampling-seq
    callbacks' output; --sampling-seq wins, as it comes later in llama.cpp's table);
    ``logit_bias``: [(token, bias)] (-l, summed per token as llama.cpp adds them)."""
    from ..sampling import SamplerParams

    p = SamplerParams(
        seed=seed & 0xFFFFFFFF if seed >= 0 else 0xFFFFFFFF, temp=temp, top_k=top_k, top_p=top_p,
        min_p=min_p, typ_p=typical, penalty_repeat=repeat_penalty, penalty_last_n=repeat_last_n,
        penalty_present=presence_penalty, penalty_freq=frequency_penalty, mirostat=mirostat,
        mirostat_eta=mirostat_lr, mirostat_tau=mirostat_ent, no_perf=no_perf,
        dry_multiplier=dry_multiplier, dry_base=dry_base, dry_allowed_length=dry_allowed_length,
        dry_penalty_last_n=dry_penalty_last_n, xtc_probability=xtc_probability, xtc_threshold=xtc_threshold,
        top_n_sigma=top_nsigma, dynatemp_range=dynatemp_range, dynatemp_exponent=dynatemp_exp, min_keep=min_keep)
    order = sampling_seq if sampling_seq is not None else samplers
    if order is not None:
        p.samplers = list(order)
    if dry_sequence_breakers is not None:
        p.dry_sequence_breakers = list(dry_sequence_breakers)
    if logit_bias:
        bias: dict = {}
        for tok, b in logit_bias:
            bias[tok] = bias.get(tok, 0.0) + b
        p.logit_bias = bias
    return p


def sampler_from_flags(sess, **flags):
    """A sampler chain for ``sess`` from the sampling flags (see :func:`sampler_params`); a
    -l token outside the vocabulary is a usage error."""
    from ..sampling import build_chain

    try:
        return build_chain(sampler_params(**flags), n_vocab=sess.n_vocab, vocab=sess.vocab)
    except (ValueError, TypeError) as e:
        if flags.get("logit_bias") and "logit_bias" in str(e):
            raise typer.BadParameter(str(e).replace("logit_bias", "token", 1), param_hint="'-l'") from None
        raise


def with_grammar(sess, chain, grammar):
    """The sampler to generate with: ``chain``, or under ``grammar`` (a LlamaGrammar) the
    grammar-first sampler Llama.create_completion uses (llama.cpp's common_sampler_sample)."""
    if grammar is None:
        return chain
    from ..grammar import GrammarError
    from ..llama import _GrammarFirstSampler

    try:
        return _GrammarFirstSampler(chain, grammar.sampler(sess.vocab))
    except GrammarError as e:  # <token> references the vocabulary does not have
        raise typer.BadParameter(" ".join(str(e).split()), param_hint="'--grammar'") from None


def perf_summary(sess, chain, n_decoded: int, t_s: float) -> str:
    """llama-simple's and llama_perf's lines, plus the generation rate alone (after the
    prompt, everything per token: decode, sampling, detokenize, print), the number to set
    beside ``pyllama bench``'s tg."""
    d = chain.perf()
    st = sess.stats
    gen_rate = st.n_gen / st.t_gen_s if st.t_gen_s > 0 else 0.0
    lines = [
        f"main: decoded {n_decoded} tokens in {t_s:.2f} s, speed: {n_decoded / t_s if t_s > 0 else 0.0:.2f} t/s",
        f"main: generation (after the prompt, end to end) = {st.n_gen} tokens in {st.t_gen_s:.2f} s, "
        f"{gen_rate:.2f} t/s; prompt = {st.n_prompt} tokens in {st.t_prompt_s:.2f} s",
        "",
        f"llama_perf_sampler_print:    sampling time = {d['t_sample_ms']:10.2f} ms / {d['n_sample']:5d} runs   "
        f"({d['t_sample_ms'] / max(1, d['n_sample']):8.2f} ms per token, "
        f"{1e3 * d['n_sample'] / d['t_sample_ms'] if d['t_sample_ms'] > 0 else 0.0:8.2f} tokens per second)",
    ]
    perf_text = getattr(sess.ctx, "perf_text", None)
    if perf_text:
        lines.append(perf_text())
    return "\n".join(lines)


@app.command()
def generate(
    prompt_arg: Optional[str] = typer.Argument(None, metavar="[PROMPT]", help="prompt (or use -p / -f)"),
    model: Optional[Path] = typer.Option(None, "-m", "--model", help="GGUF file (default: SmolLM2-135M-Instruct, fetched once)"),
    hf_repo: Optional[str] = O.opt_hf_repo(),
    hf_file: Optional[str] = O.opt_hf_file(),
    hf_token: Optional[str] = O.opt_hf_token(),
    prompt: Optional[str] = typer.Option(None, "-p", "--prompt", help="prompt text"),
    file: Optional[Path] = typer.Option(None, "-f", "--file", help="read the prompt from a file (UTF-8, at most 256 MiB)"),
    n_predict: int = typer.Option(-1, "-n", "--n-predict", callback=integer(-2, note="-1 or -2 = until the end"),
                                  help="tokens to generate (-1 or -2 = until end of generation or a full context)"),
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
    interactive: bool = typer.Option(False, "-i", "--interactive",
                                     help="after each stop (-r, end of generation, -n) read a line from stdin and go "
                                          "on from it (an empty line: go on; EOF: exit), as llama-completion -i"),
    chat: bool = typer.Option(False, "-cnv/-no-cnv", "--conversation/--no-conversation", "--chat",
                              help="one chat turn: wrap the prompt (and -sys) in the model's chat template "
                                   "(off by default; `pyllama chat` is the interactive conversation)"),
    system: Optional[str] = typer.Option(None, "-sys", "--system", "--system-prompt", help="system message (with -cnv)"),
    chat_template: Optional[str] = typer.Option(
        None, "--chat-template", help="with -cnv: a built-in template name (chatml, llama3, gemma, phi3, ...) or a "
                                      "Jinja template's text, instead of the model's"),
    chat_template_file: Optional[Path] = O.opt_chat_template_file(),
    jinja: bool = O.opt_jinja(),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="do not stop at end of generation"),
    context_shift: bool = typer.Option(False, "--context-shift/--no-context-shift",
                                       help="when the context is full, drop the oldest half (after --keep) and go on"),
    keep: int = typer.Option(0, "--keep", callback=integer(-1), help="tokens a context shift keeps (-1 = the prompt)"),
    no_display_prompt: bool = typer.Option(False, "--no-display-prompt", help="print only the generated text"),
    perf: bool = typer.Option(True, "--perf/--no-perf", help="print the timing summary on stderr"),
    lora: Optional[list[str]] = O.opt_lora(),
    lora_scaled: Optional[list[str]] = O.opt_lora_scaled(),
    control_vector: Optional[list[str]] = O.opt_control_vector(),
    control_vector_scaled: Optional[list[str]] = O.opt_control_vector_scaled(),
    control_vector_layer_range: Optional[tuple[int, int]] = O.opt_control_vector_layer_range(),
    color: str = O.opt_color(),
    verbose: bool = O.opt_verbose(),
    log_disable: bool = O.opt_log_disable(),
    version: bool = O.opt_version(),
) -> None:
    """Generate text from a prompt, streaming it as it is sampled."""
    import time

    from ..generation import TextStream

    O.setup_logging(verbose, log_disable)
    texts = [t for t in (prompt_arg, prompt) if t is not None]
    if file is not None:
        texts.append(read_text_file(file, "-f"))  # a file is not escape-processed, as llama.cpp's -f
    if len(texts) > 1:
        raise typer.BadParameter("give the prompt once: a PROMPT argument, -p or -f")
    text = texts[0] if texts else ""
    if escape:
        if file is None:
            text = O.process_escapes(text)
        system = O.process_escapes(system) if system is not None else None
        reverse_prompt = [O.process_escapes(r) for r in reverse_prompt or []]
    if interactive and chat:
        raise typer.BadParameter("-i with -cnv is a conversation: use `pyllama chat`", param_hint="'-i'")
    if system is not None and not chat:
        if not log_disable:
            typer.echo("warning: -sys/--system is only used with --chat (-cnv): ignored", err=True)
    if (chat_template is not None or chat_template_file is not None) and not chat:
        raise typer.BadParameter("a chat template only applies with -cnv (--conversation)",
                                 param_hint="'--chat-template'")
    gram = O.one_grammar(grammar, grammar_file, json_schema, json_schema_file)
    stops = O.ReversePrompts(reverse_prompt, padding=0 if interactive else 2)
    colored = O.use_color(color)
    loras = O.adapter_files(lora, lora_scaled, "--lora")
    cvecs = O.adapter_files(control_vector, control_vector_scaled, "--control-vector")
    model = O.model_by_name(model, hf_repo, hf_file, hf_token)
    if chat:
        from .serve import model_template

        chat_template = O.chat_template_arg(chat_template, chat_template_file, jinja, lambda: model_template(model))
    try:
        _path, sess = open_session(model, ctx_size=ctx_size, batch_size=batch_size, ubatch_size=ubatch_size,
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
        sampler = with_grammar(sess, chain, gram)
        if chat:
            from ..chat import ChatFormat

            msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
            fmt = ChatFormat(sess.model, sess.vocab, chat_template, origin="--chat-template")
            text = fmt.render(msgs, True)
            toks = fmt.tokens(msgs, True)
        else:
            toks = sess.tokenize(text, add_special=True, parse_special=True)
        if not toks:
            raise typer.BadParameter("the prompt is empty and the model adds no BOS token: give a prompt with -p")
        freeze_heap()
        out = sys.stdout
        if not no_display_prompt:
            # llama-completion's console: the prompt in yellow, user input in bold green
            out.write(f"\033[33m{text}\033[0m" if colored and text else text)
            out.flush()
        t0 = time.perf_counter()
        n = 0
        n_keep = len(toks) if keep < 0 else keep
        seen = text  # the text so far, prompt included: -r looks at its end, as llama.cpp's prev_str
        while True:
            stream = TextStream(sess.vocab, special=True)
            gen = sess.generate(toks, sampler, n_predict, ignore_eos=ignore_eos, decode_last=interactive,
                                shift=context_shift, n_keep=n_keep)
            try:
                for tok in gen:
                    piece = stream.feed(tok)
                    n += 1
                    toks = toks + [tok]
                    if piece:
                        out.write(piece)
                        out.flush()
                        seen = (seen + piece)[-4096:]
                        if stops and stops.found(seen):
                            break
            finally:
                gen.close()
            tail = stream.flush()
            out.write(tail)
            seen = (seen + tail)[-4096:]
            if not interactive or sess.stats.stop_reason == "ctx":
                break
            out.write("\033[1;32m" if colored else "")
            out.flush()
            line = sys.stdin.readline()
            out.write("\033[0m" if colored else "")
            if not line:
                break
            line = line[:-1] if line.endswith("\n") else line
            if escape:
                line = O.process_escapes(line)
            if line:  # an empty line hands control back to the model
                toks = toks + sess.tokenize(line, add_special=False, parse_special=False)
                seen = (seen + line)[-4096:]
        out.write("\n")
        out.flush()
        dt = time.perf_counter() - t0
    except (BrokenPipeError, typer.Exit, typer.BadParameter):  # a closed stdout, our own exit, usage
        raise
    except Exception as e:
        raise O.fail(e, verbose) from None
    if sess.stats.stop_reason == "ctx" and not log_disable:
        typer.echo(f"\nmain: context full (n_ctx = {sess.n_ctx}), stopped", err=True)
    if perf and not log_disable:
        typer.echo("\n" + perf_summary(sess, chain, n, dt), err=True)
