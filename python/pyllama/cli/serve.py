"""`pyllama serve`: an OpenAI- and llama-server-compatible HTTP server (llama-server's flags).

Loads the model, makes one context with a sequence per slot (-np), starts the scheduler
thread (continuous batching, see pyllama/server/engine.py) and serves the routes of
pyllama/server/app.py with uvicorn. Needs the `server` extra: pip install 'pyllama[server]'.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import List, Optional

import typer

from . import app
from . import _checks as O
from ._checks import integer, threads as _threads
from .generate import sampler_params


def _need_server_deps() -> None:
    missing = []
    for mod in ("starlette", "uvicorn"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        typer.echo(f"error: pyllama serve needs {' and '.join(missing)}: pip install 'pyllama[server]'", err=True)
        raise typer.Exit(1)


@app.command("serve")
def serve(
    model: Optional[Path] = typer.Option(None, "-m", "--model", help="GGUF file (default: SmolLM2-135M-Instruct)"),
    hf_repo: Optional[str] = O.opt_hf_repo(),
    hf_file: Optional[str] = O.opt_hf_file(),
    hf_token: Optional[str] = O.opt_hf_token(),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
    port: int = typer.Option(8080, "--port", callback=integer(0, 65535), help="port to listen on (0 = any free)"),
    parallel: int = typer.Option(-1, "-np", "--parallel", callback=integer(-1, 256),
                                 help="slots: requests decoded together (-1 = 4 with a unified KV cache)"),
    kv_unified: bool = typer.Option(False, "-kvu", "--kv-unified",
                                    help="one KV cache shared by all slots (the default with -np -1)"),
    ctx_size: int = typer.Option(4096, "-c", "--ctx-size", callback=O.CTX_SIZE,
                                 help="context size of all slots together (0 = from the model)"),
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
    n_predict: int = typer.Option(-1, "-n", "--n-predict", callback=integer(-2, note="-1 = until the end"),
                                  help="default tokens to generate per request (-1 = until end or a full slot)"),
    keep: int = typer.Option(0, "--keep", callback=integer(-1), help="tokens kept at the start by a context shift"),
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
    dynatemp_range: float = O.opt_dynatemp_range(),
    dynatemp_exp: float = O.opt_dynatemp_exp(),
    min_keep: int = O.opt_min_keep(),
    logit_bias: Optional[list[str]] = O.opt_logit_bias(),
    reverse_prompt: Optional[list[str]] = O.opt_reverse_prompt(),
    escape: bool = O.opt_escape(),
    version: bool = O.opt_version(),
    api_key: List[str] = typer.Option([], "--api-key", help="require this key (Bearer or X-Api-Key); "
                                      "repeat or comma-separate for several"),
    api_key_file: Optional[Path] = typer.Option(None, "--api-key-file", help="file with one API key per line"),
    alias: Optional[str] = typer.Option(None, "-a", "--alias", help="model name in responses and /v1/models"),
    chat_template: Optional[str] = typer.Option(None, "--chat-template",
                                                help="built-in template name or Jinja template text"),
    chat_template_file: Optional[Path] = O.opt_chat_template_file(),
    jinja: bool = O.opt_jinja(),
    embedding: bool = typer.Option(False, "--embedding", "--embeddings",
                                   help="serve embeddings (/v1/embeddings, /embedding) instead of completions"),
    pooling: Optional[str] = typer.Option(None, "--pooling", callback=O.one_of(("none", "mean", "cls", "last", "rank")),
                                          help="pooling of embeddings: none, mean, cls, last (default: the model's)"),
    reranking: bool = typer.Option(False, "--reranking", "--rerank", help="reranking endpoint /v1/rerank (an embeddings server with rank pooling: a reranker GGUF "
                                        "with a classifier head)"),
    metrics: bool = typer.Option(False, "--metrics", help="Prometheus metrics at /metrics"),
    slots: bool = typer.Option(True, "--slots/--no-slots", help="slot states at /slots"),
    context_shift: bool = typer.Option(False, "--context-shift/--no-context-shift",
                                       help="when a slot is full, drop half its tokens after --keep and go on"),
    cache_reuse: int = typer.Option(0, "--cache-reuse", callback=integer(0),
                                    help="min chunk size to reuse from a slot's cache by KV shifting, after its "
                                         "common prefix (0 = off; a request's n_cache_reuse overrides it)"),
    timeout: float = typer.Option(600, "-to", "--timeout", callback=O.number(0, lo_open=True),
                                  help="seconds a request may wait for progress"),
    threads_http: int = typer.Option(-1, "--threads-http", callback=integer(-1),
                                     help="threads that tokenize and render templates (-1 = default)"),
    cont_batching: bool = typer.Option(True, "-cb", "--cont-batching", help="continuous batching (always on)"),
    swa_full: bool = typer.Option(True, "--swa-full", help="full-size cache for sliding-window layers (always on)"),
    no_ui: bool = typer.Option(False, "--no-ui", "--no-webui", help="no web UI (there is none; accepted)"),
    cors_origins: str = typer.Option("*", "--cors-origins",
                                     help="comma-separated origins browsers may call from (* = any, llama-server's default)"),
    reasoning: str = typer.Option("auto", "--reasoning", callback=O.one_of(("on", "off", "auto")),
                                  help="thinking models: on / off sets the template's enable_thinking; auto leaves "
                                       "the template's default"),
    reasoning_format: str = typer.Option("auto", "--reasoning-format",
                                         callback=O.one_of(("auto", "none", "deepseek", "deepseek-legacy")),
                                         help="where a reply's <think> thoughts go: auto / deepseek: "
                                              "message.reasoning_content; deepseek-legacy: there and in content; "
                                              "none: left in content"),
    spm_infill: bool = typer.Option(False, "--spm-infill",
                                    help="/infill: the suffix before the prefix (Suffix/Prefix/Middle), for models "
                                         "trained that way"),
    queue_size: int = typer.Option(64, "--queue-size", callback=integer(1),
                                   help="requests that may wait for a slot; more get 503"),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="log every request; OpenAI-shaped answers carry llama-server's \"__verbose\" (the native answer)"),
    lora: Optional[list[str]] = O.opt_lora(),
    lora_scaled: Optional[list[str]] = O.opt_lora_scaled(),
    control_vector: Optional[list[str]] = O.opt_control_vector(),
    control_vector_scaled: Optional[list[str]] = O.opt_control_vector_scaled(),
    control_vector_layer_range: Optional[tuple[int, int]] = O.opt_control_vector_layer_range(),
) -> None:
    """Serve the model over HTTP: OpenAI's /v1/completions, /v1/chat/completions, /v1/models
    and llama-server's /completion, /tokenize, /detokenize, /apply-template, /props, /slots,
    /metrics, /health, /lora-adapters. Requests share one context: each slot is a sequence, decoded together."""
    _need_server_deps()
    model = O.model_by_name(model, hf_repo, hf_file, hf_token)
    if reranking:  # llama-server: --reranking is an embeddings server with rank pooling
        if pooling not in (None, "rank"):
            raise typer.BadParameter(f"--reranking needs rank pooling, not --pooling {pooling}", param_hint="--pooling")
        embedding, pooling = True, "rank"
    if pooling is not None and not embedding:
        raise typer.BadParameter("--pooling only applies with --embedding", param_hint="--pooling")
    keys = [k.strip() for v in api_key for k in v.split(",") if k.strip()]
    if api_key_file is not None:
        try:
            keys += [ln.strip() for ln in api_key_file.read_text(encoding="utf-8").splitlines() if ln.strip()]
        except (OSError, UnicodeDecodeError) as e:
            raise typer.BadParameter(f"cannot read {api_key_file}: {e}", param_hint="--api-key-file") from None
    chat_template = O.chat_template_arg(chat_template, chat_template_file, jinja, lambda: model_template(model))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from ..errors import PyllamaError
    from ..generation import load_model, progress_bar, resolve_model_path
    from ..server import EngineConfig, ServerConfig, ServerState, create_app

    n_parallel = 4 if parallel < 0 else max(parallel, 1)
    unified = kv_unified or parallel < 0
    try:
        path = resolve_model_path(model)
        m = load_model(path, load_mode=load_mode, progress=progress_bar(f"loading {path.name}"), n_gpu_layers=gpu_layers,
                       split_mode=split_mode, tensor_split=tensor_split, main_gpu=main_gpu)
        n_ctx = ctx_size if ctx_size > 0 else (int(m.n_ctx_train) or 4096)
        threads_, threads_batch_ = _threads(threads), _threads(threads_batch)
        defaults = sampler_params(
            temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, typical=typical, repeat_penalty=repeat_penalty,
            repeat_last_n=repeat_last_n, presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
            mirostat=mirostat, mirostat_lr=mirostat_lr, mirostat_ent=mirostat_ent, seed=seed, no_perf=True,
            samplers=samplers, sampling_seq=sampling_seq, dry_multiplier=dry_multiplier, dry_base=dry_base,
            dry_allowed_length=dry_allowed_length, dry_penalty_last_n=dry_penalty_last_n,
            dry_sequence_breakers=O.dry_breakers(dry_sequence_breaker, escape), xtc_probability=xtc_probability,
            xtc_threshold=xtc_threshold, top_nsigma=top_nsigma, dynatemp_range=dynatemp_range,
            dynatemp_exp=dynatemp_exp, min_keep=min_keep, logit_bias=logit_bias)
        bad = [t for t in defaults.logit_bias if not 0 <= int(t) < m.n_vocab]
        if bad:
            raise typer.BadParameter(f"token {bad[0]} is not in the vocabulary (n_vocab = {m.n_vocab})",
                                     param_hint="'-l'")
        ecfg = EngineConfig(n_ctx=n_ctx, n_batch=batch_size, n_ubatch=min(ubatch_size or batch_size, batch_size),
                            n_parallel=n_parallel, kv_unified=unified, n_threads=threads_ or 0,
                            n_threads_batch=threads_batch_ or threads_ or 0, type_k=cache_type_k,
                            type_v=cache_type_v, context_shift=context_shift, n_keep=keep, cache_reuse=cache_reuse,
                            max_queue=queue_size,
                            flash_attn=O.FLASH_ATTN_TYPES.get(flash_attn, -1),
                            embedding=embedding, pooling={"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}.get(pooling, -1),
                            loras=O.adapter_files(lora, lora_scaled, "--lora"),
                            control_vectors=O.adapter_files(control_vector, control_vector_scaled, "--control-vector"),
                            cvec_range=control_vector_layer_range, offload_kqv=not no_kv_offload)
        cfg = ServerConfig(model_path=str(path), alias=alias, api_keys=keys, chat_template=chat_template,
                           metrics=metrics, slots=slots, timeout=timeout, threads_http=max(threads_http, 0),
                           n_predict=n_predict, sampling=defaults, engine=ecfg,
                           reasoning=reasoning, reasoning_format=reasoning_format, spm_infill=spm_infill,
                           stops=[O.process_escapes(r) if escape else r for r in reverse_prompt or [] if r],
                           cors_origins=[o.strip() for o in cors_origins.split(",") if o.strip()] or ["*"],
                           verbose=verbose)
        state = ServerState(m, cfg)
    except (PyllamaError, FileNotFoundError, ValueError, OSError, MemoryError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None

    import uvicorn

    e = state.engine
    typer.echo(f"pyllama serve: {path.name}, {n_parallel} slots x {e.n_ctx_slot} tokens"
               f"{' (unified KV cache of ' + str(e.n_ctx) + ')' if unified else ''}, "
               f"chat template: {state.chat.name}", err=True)
    typer.echo(f"main: server is listening on http://{host}:{port} - starting the main loop", err=True)
    uvicorn.run(create_app(state), host=host, port=port, log_level="info" if verbose else "warning",
                timeout_keep_alive=5)


def model_template(model: Optional[Path]) -> str:
    """--no-jinja's template text: the model file's (the model is loaded later), or a usage error."""
    try:
        return _model_template(model)
    except (OSError, ValueError) as e:
        raise typer.BadParameter(f"cannot read the model's chat template: {e}", param_hint="'--no-jinja'") from None


def _model_template(model: Optional[Path]) -> str:
    """The model file's tokenizer.chat_template ("" when it has none)."""
    from ..generation import resolve_model_path
    from ..gguf import GGUFFile

    f = GGUFFile(str(resolve_model_path(model)))
    v = f.metadata.get("tokenizer.chat_template", "")
    return v if isinstance(v, str) else ""
