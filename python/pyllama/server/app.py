"""The HTTP side of ``pyllama serve``: an ASGI app (Starlette, served by uvicorn) with
OpenAI's routes and llama-server's own, in their shapes.

Handlers parse and check a request, tokenize (in a worker thread: a long prompt must not
stall the event loop), make :class:`~pyllama.server.engine.Job` s and read their events from
an asyncio queue that the scheduler thread fills. A client that goes away cancels its jobs.
Errors use OpenAI's shape ``{"error": {"code", "message", "type"}}``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import re
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .engine import Engine, EngineConfig, Job, PromptTooLong, QueueFull
from ..chat import special_text
from .. import reasoning as reasoning_mod
from ..tool_calls import reply_message, with_object_arguments
from .params import (COMMON_FIELDS, BadRequest, check_fields, parse_generation, response_format_schema)

log = logging.getLogger("pyllama.server")

__all__ = ["ServerConfig", "ServerState", "create_app"]

_VERSION = "pyllama 0.1.0"
# llama-server's fingerprint shape is b<build>-<commit>; clients (and its tests) look for the "b"
_FINGERPRINT = "b1-pyllama-0.1.0"


@dataclass
class ServerConfig:
    model_path: str = ""
    alias: Optional[str] = None
    api_keys: list = field(default_factory=list)
    chat_template: Optional[str] = None   # built-in name or Jinja text; None: the model's
    metrics: bool = False
    slots: bool = True
    timeout: float = 600.0                # seconds without progress before a request is dropped
    threads_http: int = 0                 # worker threads for tokenizing / templates (0: anyio's default)
    max_body: int = 16 * 1024 * 1024      # bytes
    n_predict: int = -1                   # default when a request gives no max_tokens / n_predict
    max_n: int = 16                       # most choices per request ('n')
    cors_origins: list = field(default_factory=lambda: ["*"])  # origins browsers may call from
    reasoning: str = "auto"               # on / off: the template's enable_thinking; auto: the template's default
    spm_infill: bool = False              # /infill: suffix before prefix (--spm-infill)
    reasoning_format: str = "auto"        # where <think> thoughts go (pyllama.reasoning): auto, none, deepseek, deepseek-legacy
    sampling: Any = None                  # SamplerParams: defaults for what a request leaves out
    verbose: bool = False                 # -v: OpenAI-shaped answers carry llama-server's "__verbose"
    stops: list = field(default_factory=list)  # -r: stop strings of a request that gives none
    engine: EngineConfig = field(default_factory=EngineConfig)


class ServerState:
    """Model, vocabulary, chat format and engine: what every handler reads."""

    def __init__(self, model, config: ServerConfig):
        from ..chat import ChatFormat
        from ..generation import vocab_of

        self.config = config
        self.model = model
        self.vocab = vocab_of(model)
        self.n_vocab = len(self.vocab)
        self.chat = ChatFormat(model, self.vocab, config.chat_template, origin="--chat-template")
        self.engine = Engine(model, self.vocab, config.engine)
        self.model_id = config.alias or Path(config.model_path).name
        self.created = int(time.time())
        self.t_start = time.time()

    def start(self) -> None:
        self.engine.start()

    def stop(self) -> None:
        self.engine.stop()


# ---------------------------------------------------------------------------------- helpers


def _error(status: int, message: str, type_: Optional[str] = None, **extra):
    from starlette.responses import JSONResponse

    if type_ is None:
        type_ = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                 405: "invalid_request_error", 413: "invalid_request_error", 501: "not_supported_error",
                 503: "unavailable_error", 504: "timeout_error"}.get(status, "server_error")
    return JSONResponse({"error": {"code": status, "message": message, "type": type_, **extra}}, status_code=status)


async def _read_json(request, limit: int) -> Any:
    n = request.headers.get("content-length")
    if n is not None:
        try:
            if int(n) > limit:
                raise BadRequest(f"the request body is {int(n)} bytes, over the limit of {limit}", 413)
        except ValueError:
            raise BadRequest("bad Content-Length header") from None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"the request body is over the limit of {limit} bytes", 413)
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise BadRequest("the request body is empty: expected a JSON object")
    try:
        return json.loads(raw)
    except UnicodeDecodeError as e:
        raise BadRequest(f"the request body is not UTF-8 (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise BadRequest(f"the request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise BadRequest("the request body's JSON is nested too deeply") from None


def _sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n"


def _piece(vocab, tok: int) -> str:
    return vocab.token_to_piece(int(tok), False).decode("utf-8", "replace")


def _piece_bytes(vocab, tok: int) -> list:
    return list(vocab.token_to_piece(int(tok), False))


class _Run:
    """The jobs of one request and the queue their events arrive on."""

    def __init__(self, state: ServerState, loop):
        self.state = state
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.jobs: list[Job] = []

    def emit_for(self, index: int):
        put = self.queue.put_nowait
        loop = self.loop

        def emit(ev: dict) -> None:
            ev["index"] = index
            try:
                loop.call_soon_threadsafe(put, ev)
            except RuntimeError:  # the event loop has closed (server shutting down): nobody to tell
                pass
        return emit

    def cancel(self) -> None:
        for j in self.jobs:
            j.cancel()
        self.state.engine.wake()

    async def events(self, ping: float = -1):
        """Every job's events, as they come, until each job is done; raises TimeoutError
        when nothing has come for the configured timeout. With ``ping`` > 0, a
        ``{"type": "ping"}`` event after each ``ping`` seconds of silence (SSE keep-alive)."""
        left = len(self.jobs)
        timeout = self.state.config.timeout
        while left:
            waited = 0.0
            while True:
                wait = timeout - waited if timeout > 0 else None
                if ping > 0 and (wait is None or ping < wait):
                    wait = ping
                try:
                    ev = await asyncio.wait_for(self.queue.get(), timeout=wait)
                    break
                except asyncio.TimeoutError:
                    waited += wait
                    if timeout > 0 and waited >= timeout:
                        raise
                    yield {"type": "ping", "index": -1}
            if ev["type"] in ("done", "error"):
                left -= 1
            yield ev


def _make_job(state: ServerState, prompt: list, g, emit) -> Job:
    """A job with its own sampler chain (own seed: batch mates cannot change its output)."""
    from ..llama import _GrammarFirstSampler
    from ..sampling import build_chain

    chain = build_chain(g.sampling, n_vocab=state.n_vocab, vocab=state.vocab)
    sampler = chain
    grammar = _grammar_of(state, g)
    if grammar is not None:
        sampler = _GrammarFirstSampler(chain, grammar.sampler(state.vocab))
    return Job(prompt=prompt, sampler=sampler, chain=chain, emit=emit, n_predict=g.n_predict,
               stops=g.stops, n_probs=g.n_probs, ignore_eos=g.ignore_eos, n_keep=g.n_keep,
               cache_prompt=g.cache_prompt, id_slot=g.id_slot, n_cache_reuse=g.n_cache_reuse,
               n_discard=g.n_discard, n_indent=g.n_indent, t_max_predict_ms=g.t_max_predict_ms,
               post_sampling=g.post_sampling_probs, progress=g.return_progress and g.stream,
               timings_per_token=g.timings_per_token)


def _grammar_of(state: ServerState, g):
    from ..grammar import GrammarError
    from ..llama_grammar import JSON_GBNF, LlamaGrammar

    try:
        if g.grammar is not None and g.grammar_triggers:
            return LlamaGrammar.lazy(g.grammar, g.grammar_triggers)
        if g.grammar is not None:
            return LlamaGrammar.from_string(g.grammar, verbose=False)
        if g.json_schema == "json":
            return LlamaGrammar.from_string(JSON_GBNF, verbose=False)
        if g.json_schema is not None:
            return LlamaGrammar.from_json_schema(json.dumps(g.json_schema), verbose=False)
    except (GrammarError, ValueError, TypeError) as e:
        raise BadRequest(f"grammar: {e}") from None
    return None


async def _submit(state: ServerState, run: _Run, prompts: list, g, n: int) -> None:
    """Make and queue n jobs per prompt (choice index = prompt * n + j). With a seed, choice
    j samples with seed + j, so n choices differ yet each is reproducible."""
    from starlette.concurrency import run_in_threadpool

    for p in prompts:
        state.engine.check_prompt(len(p))
    if g.ignore_eos:  # as llama-server: end-of-generation tokens are never sampled
        for t in getattr(state.vocab, "eog_ids", ()):
            g.sampling.logit_bias[int(t)] = float("-inf")
    base_seed = g.sampling.seed
    specs = []
    for pi, p in enumerate(prompts):
        for j in range(n):
            gj = g
            if n > 1 and g.seed_given:
                gj = _with_seed(g, (base_seed + j) % 2**32)
            specs.append((pi * n + j, p, gj))

    def build():
        return [_make_job(state, p, gj, run.emit_for(i)) for i, p, gj in specs]

    run.jobs.extend(await run_in_threadpool(build))
    try:
        for job in run.jobs:
            state.engine.submit(job)
    except BaseException:
        run.cancel()
        raise


def _with_seed(g, seed: int):
    import copy

    g2 = copy.copy(g)
    g2.sampling = copy.copy(g.sampling)
    g2.sampling.seed = seed
    return g2


async def _until_disconnect(request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


async def _collect(request, run: _Run) -> dict:
    """Non-streaming: all events per choice index; cancels the jobs if the client leaves."""
    per: dict = {}
    watcher = asyncio.ensure_future(_until_disconnect(request))
    try:
        async def consume():
            async for ev in run.events():
                if ev["type"] in ("token", "done", "error"):
                    per.setdefault(ev["index"], []).append(ev)
        task = asyncio.ensure_future(consume())
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            task.cancel()
            run.cancel()
            raise _ClientGone()
        task.result()
    except asyncio.TimeoutError:
        run.cancel()
        raise BadRequest(f"no progress for {run.state.config.timeout:g} s (--timeout); the request was dropped",
                         504) from None
    finally:
        watcher.cancel()
    for evs in per.values():
        for ev in evs:
            if ev["type"] == "error":
                raise BadRequest(ev["message"], 500, "server_error")
    return per


class _ClientGone(Exception):
    pass


def _tokenize_prompt(state: ServerState, prompt, add_special: bool = True) -> list:
    """llama-server's prompt forms: a string, a list of token ids, a list mixing strings and
    ids (strings are tokenized; BOS added once, at the start, when the model wants one), or
    {"prompt_string": one of those} (with "multimodal_data": refused, no model here takes
    images)."""
    v = state.vocab
    if isinstance(prompt, dict):
        if "prompt_string" not in prompt:
            raise BadRequest('a prompt object needs "prompt_string" (and optionally "multimodal_data")')
        unknown = sorted(k for k in prompt if k not in ("prompt_string", "multimodal_data"))
        if unknown:
            raise BadRequest(f"a prompt object has unknown key {unknown[0]!r}")
        if "multimodal_data" in prompt:
            raise BadRequest("Multimodal data provided, but model does not support multimodal requests.")
        inner = prompt["prompt_string"]
        if isinstance(inner, dict):
            raise BadRequest('"prompt_string" must be a string or a list of strings and token ids')
        return _tokenize_prompt(state, inner, add_special)
    if isinstance(prompt, str):
        return list(v.tokenize(prompt, add_special=add_special, parse_special=True))
    if isinstance(prompt, list):
        out: list = []
        for i, x in enumerate(prompt):
            if isinstance(x, bool):
                raise BadRequest(f"prompt[{i}]: expected a token id or a string, got {x!r}")
            if isinstance(x, int):
                if not 0 <= x < state.n_vocab:
                    raise BadRequest(f"prompt[{i}] = {x} is not a valid token id (n_vocab = {state.n_vocab})")
                out.append(x)
            elif isinstance(x, str):
                out.extend(v.tokenize(x, add_special=add_special and i == 0, parse_special=True))
            else:
                raise BadRequest(f"prompt[{i}]: expected a token id or a string, got {type(x).__name__}")
        return out
    raise BadRequest(f"'prompt' must be a string, a list of token ids or a list of those, got {type(prompt).__name__}")


def _tokenize_mixed(state: ServerState, value, name: str) -> list:
    """llama-server's tokenize_mixed: a string, or a list of strings and token ids; strings
    are tokenized without special tokens and without parsing special-token text."""
    v = state.vocab
    if isinstance(value, str):
        return list(v.tokenize(value, add_special=False, parse_special=False))
    if isinstance(value, list):
        out: list = []
        for i, x in enumerate(value):
            if isinstance(x, str):
                out.extend(v.tokenize(x, add_special=False, parse_special=False))
            elif isinstance(x, int) and not isinstance(x, bool) and 0 <= x < state.n_vocab:
                out.append(x)
            else:
                raise BadRequest(f"'{name}'[{i}]: expected a string or a token id below {state.n_vocab}, got {x!r}")
        return out
    raise BadRequest(f"'{name}' must be a string or a list of strings and token ids, got {type(value).__name__}")


def _infill_prompt(state: ServerState, body: dict, n_predict: int) -> list:
    """llama-server's format_prompt_infill (FIM repo-level pattern): [FIM_REP]myproject
    [FIM_SEP]file0 extra0 ... [FIM_SEP]filename [FIM_PRE]prefix+prompt [FIM_SUF]suffix
    [FIM_MID], the prefix cut to 3/4 of a batch (its end kept), the suffix to what is left,
    and of the extra context only what fits n_ctx - n_batch - 2 * n_predict (its end kept)."""
    for f in ("input_prefix", "input_suffix"):
        if f not in body:
            raise BadRequest(f'"{f}" is required')
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise BadRequest('"prompt" must be a string')
    extra = body.get("input_extra", [])
    if not isinstance(extra, list):
        raise BadRequest('"input_extra" must be an array of {"filename": string, "text": string}')
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise BadRequest('extra_context chunk must contain a "text" field with a string value')
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise BadRequest("extra_context chunk's \"filename\" field must be a string")
    v = state.vocab

    def tok(text: str) -> list:
        return list(v.tokenize(text, add_special=False, parse_special=False))

    prefix = _tokenize_mixed(state, body["input_prefix"], "input_prefix")
    suffix = _tokenize_mixed(state, body["input_suffix"], "input_suffix")
    prompt_toks = list(v.tokenize(prompt, add_special=False, parse_special=True))
    extra_toks: list = []
    if v.fim_rep >= 0:
        extra_toks += [v.fim_rep] + tok("myproject\n")
    for chunk in extra:
        if v.fim_sep >= 0:
            extra_toks += [v.fim_sep] + tok(chunk.get("filename", "tmp") + "\n")
        else:
            extra_toks += tok("\n\n--- snippet ---\n\n")
        extra_toks += tok(chunk["text"])
    if v.fim_sep >= 0:
        extra_toks += [v.fim_sep] + tok("filename\n")
    n_batch, n_ctx = state.engine.n_batch, state.engine.n_ctx_slot
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt_toks))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_toks))
    pre = [v.fim_pre] + prefix[len(prefix) - n_prefix:] + prompt_toks
    suf = [v.fim_suf] + suffix[:n_suffix]
    first, last = (suf, pre) if state.config.spm_infill else (pre, suf)
    if v.add_bos:
        first = [v.bos] + first
    return extra_toks[len(extra_toks) - n_extra:] + first + last + [v.fim_mid]


def _prompts(state: ServerState, prompt) -> list:
    """One prompt or several: a list of strings / of token lists is several prompts."""
    if prompt is None:
        raise BadRequest("'prompt' is required")
    # llama-server: a list with no token id in it is a list of prompts (strings, token lists,
    # prompt objects); a list with ids is one prompt
    if isinstance(prompt, list) and not prompt:
        raise BadRequest("'prompt' must not be empty")
    if isinstance(prompt, list) and all(isinstance(x, (str, list, dict)) for x in prompt) and len(prompt) > 1 \
            or isinstance(prompt, list) and any(isinstance(x, (list, dict)) for x in prompt):
        if len(prompt) > 64:
            raise BadRequest(f"'prompt' has {len(prompt)} prompts; at most 64 per request")
        return [_tokenize_prompt(state, p) for p in prompt]
    return [_tokenize_prompt(state, prompt)]


def _int_field(body: dict, name: str, lo: int, hi: int, default: int) -> int:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise BadRequest(f"'{name}' must be an integer from {lo} to {hi}, got {v!r}")
    return v


# ------------------------------------------------------------------------------ the app


def create_app(state: ServerState):
    """The Starlette app for ``state`` (its engine is started and stopped with the app)."""
    import contextlib

    import anyio.to_thread
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    cfg = state.config
    keys = [k.encode("utf-8") for k in cfg.api_keys]

    def authorized(request: Request) -> bool:
        if not keys:
            return True
        got = request.headers.get("authorization", "")
        token = got[7:].strip() if got[:7].lower() == "bearer " else request.headers.get("x-api-key", "")
        tb = token.encode("utf-8", "replace")
        ok = False
        for k in keys:  # compare with every key, each in constant time
            ok |= hmac.compare_digest(tb, k)
        return ok

    def endpoint(fn, public: bool = False):
        async def handler(request: Request):
            if not public and not authorized(request):
                return _error(401, "Invalid API Key")
            try:
                return await fn(request)
            except BadRequest as e:
                return _error(e.status, e.message, e.type)
            except PromptTooLong as e:
                return _error(400, str(e), "exceed_context_size_error", n_prompt_tokens=e.n_prompt, n_ctx=e.n_ctx)
            except QueueFull as e:
                return _error(503, str(e))
            except _ClientGone:
                from starlette.responses import Response
                return Response(status_code=499)
            except (ValueError, TypeError) as e:  # e.g. a chat template or tokenizer refusing input
                return _error(400, f"{type(e).__name__}: {e}")
            except Exception as e:  # noqa: BLE001 (a bug: say so, keep serving)
                log.exception("error in %s", request.url.path)
                return _error(500, f"internal error: {type(e).__name__}: {e}")
        return handler

    # ---------------------------------------------------------------- llama-server's own

    async def health(request):
        return JSONResponse({"status": "ok"})

    async def models(request):
        return JSONResponse({"object": "list", "data": [{
            "id": state.model_id, "object": "model", "created": state.created, "owned_by": "pyllama",
            "meta": {"n_vocab": state.n_vocab, "n_ctx_train": int(getattr(state.model, "n_ctx_train", 0)),
                     "n_ctx": state.engine.n_ctx_slot}}]})

    async def props(request):
        e = state.engine
        return JSONResponse({
            "default_generation_settings": {"id": 0, "n_ctx": e.n_ctx_slot, "params": _defaults(cfg)},
            "total_slots": len(e.slots), "model_path": cfg.model_path, "model_alias": state.model_id,
            "chat_template": state.chat.source, "chat_template_name": state.chat.name,
            "bos_token": special_text(state.vocab, state.vocab.bos),
            "eos_token": special_text(state.vocab, state.vocab.eos),
            "build_info": _FINGERPRINT, "modalities": {"vision": False, "audio": False},
            "endpoint_slots": cfg.slots, "endpoint_metrics": cfg.metrics})

    async def slots(request):
        if not cfg.slots:
            return _error(501, "This server does not support slots endpoint. Start it without `--no-slots`")
        return JSONResponse(state.engine.slots_info())

    async def lora_adapters(request):
        if request.method == "GET":
            return JSONResponse(state.engine.lora_info())
        body = await _read_json(request, cfg.max_body)
        if not isinstance(body, list):
            raise BadRequest("Request body must be an array")
        config = {}
        for i, entry in enumerate(body):
            if not isinstance(entry, dict):
                raise BadRequest(f"entry {i} must be an object {{\"id\": int, \"scale\": number}}")
            aid, scale = entry.get("id", -1), entry.get("scale", 0.0)
            if isinstance(aid, bool) or not isinstance(aid, int):
                raise BadRequest(f"entry {i}: 'id' must be an integer")
            if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
                raise BadRequest(f"entry {i}: 'scale' must be a finite number")
            config[aid] = float(scale)
        state.engine.set_lora_scales(config)
        return JSONResponse({"success": True})

    async def metrics(request):
        if not cfg.metrics:
            return _error(501, "This server does not support metrics endpoint. Start it with `--metrics`")
        return PlainTextResponse(_prometheus(state), media_type="text/plain; version=0.0.4",
                                 headers={"Process-Start-Time-Unix": str(int(state.t_start))})

    async def tokenize(request):
        body = check_fields(await _read_json(request, cfg.max_body),
                            {"content", "add_special", "parse_special", "with_pieces"}, "/tokenize")
        content = body.get("content", "")
        if not isinstance(content, str):
            raise BadRequest("'content' must be a string")
        flags = {}
        for k, d in (("add_special", False), ("parse_special", True), ("with_pieces", False)):
            v = body.get(k, d)
            if not isinstance(v, bool):
                raise BadRequest(f"'{k}' must be true or false")
            flags[k] = v
        toks = await run_in_threadpool(lambda: list(state.vocab.tokenize(
            content, add_special=flags["add_special"], parse_special=flags["parse_special"])))
        if not flags["with_pieces"]:
            return JSONResponse({"tokens": toks})
        out = []
        for t in toks:
            b = state.vocab.token_to_piece(int(t), True)
            try:
                piece: Any = b.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(b)
            out.append({"id": t, "piece": piece})
        return JSONResponse({"tokens": out})

    async def detokenize(request):
        body = check_fields(await _read_json(request, cfg.max_body), {"tokens"}, "/detokenize")
        toks = body.get("tokens", [])
        if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
            raise BadRequest("'tokens' must be a list of token ids")
        for i, t in enumerate(toks):
            if not 0 <= t < state.n_vocab:
                raise BadRequest(f"tokens[{i}] = {t} is not a valid token id (n_vocab = {state.n_vocab})")
        text = b"".join(state.vocab.token_to_piece(int(t), True) for t in toks).decode("utf-8", "replace")
        return JSONResponse({"content": text})

    async def apply_template(request):
        body = check_fields(await _read_json(request, cfg.max_body),
                            {"messages", "chat_template_kwargs", "add_generation_prompt", "continue_final_message",
                             "model", "tools", "tool_choice", "parallel_tool_calls"}, "/apply-template")
        tools = _tools(state, body)
        text = await run_in_threadpool(lambda: _chat_prompt(state, body, tools))
        return JSONResponse({"prompt": text})

    async def rerank(request):
        """llama-server's /rerank (/v1/rerank, Jina's and Cohere's shape; TEI's with "texts"):
        each (query, document) pair is one embedding job whose rank-pooled output's first
        value is the score; results sorted by score, best first, cut to top_n."""
        if not cfg.engine.embedding or state.engine.pooling != 4:
            return _error(501, "This server does not support reranking. Start it with `--reranking`")
        body = check_fields(await _read_json(request, cfg.max_body),
                            {"query", "documents", "texts", "top_n", "model", "return_text", "return_documents",
                             "raw_scores", "truncate", "user"}, request.url.path)
        query = body.get("query")
        if query is None:
            raise BadRequest('"query" must be provided')
        if not isinstance(query, str):
            raise BadRequest('"query" must be a string')
        tei = "texts" in body
        docs = body.get("documents", body.get("texts"))
        if not isinstance(docs, list) or not docs:
            raise BadRequest('"documents" must be a non-empty string array')
        # Cohere's documents may be {"text": ...} objects
        docs = [d.get("text") if isinstance(d, dict) else d for d in docs]
        if not all(isinstance(d, str) for d in docs):
            raise BadRequest('"documents" must be a non-empty string array')
        if len(docs) > 256:
            raise BadRequest(f'"documents" has {len(docs)} items; at most 256 per request')
        top_n = _int_field(body, "top_n", 0, 2**31 - 1, len(docs))
        for name in ("return_text", "return_documents", "raw_scores", "truncate"):
            if body.get(name) not in (None, True, False):
                raise BadRequest(f"'{name}' must be true or false")
        from ..embedding import rerank_tokens

        prompts = await run_in_threadpool(lambda: [rerank_tokens(state.model, query, d) for d in docs])
        for p in prompts:
            state.engine.check_embed_input(len(p))
        loop = asyncio.get_running_loop()
        run = _Run(state, loop)
        for i, p in enumerate(prompts):
            run.jobs.append(Job(prompt=p, sampler=None, chain=None, emit=run.emit_for(i), embed=True, normalize=-1))
        try:
            for job in run.jobs:
                state.engine.submit(job)
        except BaseException:
            run.cancel()
            raise
        per = await _collect(request, run)
        dones = [next(ev for ev in per[i] if ev["type"] == "done") for i in sorted(per)]
        label = "score" if tei else "relevance_score"
        res = []
        for i, d in enumerate(dones):
            e = {"index": i, label: float(d["embedding"][0][0])}
            if tei and body.get("return_text"):
                e["text"] = docs[i]
            if body.get("return_documents"):
                e["document"] = {"text": docs[i]}
            res.append(e)
        res.sort(key=lambda e: -e[label])  # stable: ties keep document order
        res = res[:top_n]
        if tei:
            return JSONResponse(res)
        n = sum(d["n_prompt"] for d in dones)
        return JSONResponse({"model": body.get("model", state.model_id), "object": "list",
                             "usage": {"prompt_tokens": n, "total_tokens": n}, "results": res})

    async def embeddings(request, oai: bool):
        if not cfg.engine.embedding:
            return _error(501, "This server does not support embeddings. Start it with `--embeddings`")
        allowed = {"input", "model", "encoding_format", "user"} if oai else {"content", "input", "embd_normalize"}
        body = check_fields(await _read_json(request, cfg.max_body), allowed, request.url.path)
        inp = body.get("input", body.get("content"))
        if inp is None:
            raise BadRequest("'input' is required")
        from ..embedding import as_inputs

        try:
            items, _ = as_inputs(inp)
        except TypeError as e:
            raise BadRequest(str(e)) from None
        if len(items) > 256:
            raise BadRequest(f"'input' has {len(items)} items; at most 256 per request")
        if oai and state.engine.pooling == 0:
            raise BadRequest("Pooling type 'none' is not OAI compatible. Please use a different pooling type "
                             "(start the server with --pooling mean, cls or last)")
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise BadRequest("'encoding_format' must be 'float' or 'base64'")
        norm = body.get("embd_normalize", 2)
        if isinstance(norm, bool) or not isinstance(norm, int):
            raise BadRequest("'embd_normalize' must be an integer (-1 none, 0 max-abs, 1 taxicab, 2 euclidean, "
                             ">2 p-norm)")

        def tok(x):
            if isinstance(x, str):
                return list(state.vocab.tokenize(x, add_special=True, parse_special=True))
            for t in x:
                if not 0 <= t < state.n_vocab:
                    raise BadRequest(f"token {t} is not a valid token id (n_vocab = {state.n_vocab})")
            return list(x)

        prompts = await run_in_threadpool(lambda: [tok(x) for x in items])
        for p in prompts:
            state.engine.check_embed_input(len(p))
        loop = asyncio.get_running_loop()
        run = _Run(state, loop)
        for i, p in enumerate(prompts):
            run.jobs.append(Job(prompt=p, sampler=None, chain=None, emit=run.emit_for(i), embed=True,
                                normalize=norm))
        try:
            for job in run.jobs:
                state.engine.submit(job)
        except BaseException:
            run.cancel()
            raise
        per = await _collect(request, run)
        dones = [next(ev for ev in per[i] if ev["type"] == "done") for i in sorted(per)]
        if not oai:
            return JSONResponse([{"index": i, "embedding": d["embedding"]} for i, d in enumerate(dones)])
        data = []
        for i, d in enumerate(dones):
            vec = d["embedding"][0]
            if fmt == "base64":
                import base64

                import numpy as np

                vec = base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode("ascii")
            data.append({"object": "embedding", "index": i, "embedding": vec})
        n = sum(d["n_prompt"] for d in dones)
        return JSONResponse({"object": "list", "data": data, "model": state.model_id,
                             "usage": {"prompt_tokens": n, "total_tokens": n}})

    async def embeddings_oai(request):
        return await embeddings(request, True)

    async def embeddings_native(request):
        return await embeddings(request, False)

    # ---------------------------------------------------------------- generation

    async def run_generation(request, body, prompts, g, n, shape, tools=None, reasoning=None):
        """Queue the jobs and answer in ``shape`` ("native", "oai", "chat"); ``tools`` (a
        ToolCalls) turns chat replies into tool calls; ``reasoning`` (format, thinking forced
        open) splits a chat reply's thoughts into reasoning_content."""
        if cfg.engine.embedding:
            raise BadRequest("This server does not support completions: it was started with --embeddings",
                             501, "not_supported_error")
        loop = asyncio.get_running_loop()
        run = _Run(state, loop)
        await _submit(state, run, prompts, g, n)
        meta = {"id": ("chatcmpl-" if shape == "chat" else "cmpl-") + uuid.uuid4().hex,
                "created": int(time.time()), "model": state.model_id}
        if g.stream:
            return StreamingResponse(_stream(state, run, prompts, n, shape, meta, body, tools, g, reasoning),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        per = await _collect(request, run)
        return JSONResponse(_final(state, per, prompts, n, shape, meta, body, tools, g, reasoning))

    async def completion_native(request):
        body = check_fields(await _read_json(request, cfg.max_body),
                            COMMON_FIELDS | {"prompt", "content", "return_tokens", "response_fields", "n_cmpl"},
                            request.url.path)
        if body.get("return_tokens") not in (None, True, False):
            raise BadRequest("'return_tokens' must be true or false")
        rf = body.get("response_fields")
        if rf is not None and (not isinstance(rf, list) or not all(isinstance(x, str) for x in rf)):
            raise BadRequest("'response_fields' must be a list of field names (a/b for nested ones)")
        if "prompt" not in body and "content" in body:
            body["prompt"] = body.pop("content")
        g = parse_generation(body, state.vocab, state.n_vocab, default_n_predict=cfg.n_predict, defaults=cfg.sampling, default_stops=cfg.stops)
        n = _int_field(body, "n_cmpl", 1, cfg.max_n, 1)  # llama-server's several completions per prompt
        prompts = await run_in_threadpool(lambda: _prompts(state, body.get("prompt")))
        return await run_generation(request, body, prompts, g, n, "native")

    async def infill(request):
        """llama-server's /infill: fill in the middle with the model's FIM tokens."""
        v = state.vocab
        missing = "".join(f"{n} token is missing. " for n, t in (("prefix", v.fim_pre), ("suffix", v.fim_suf),
                                                                  ("middle", v.fim_mid)) if t < 0)
        if missing:
            raise BadRequest(f"Infill is not supported by this model: {missing}", 501, "not_supported_error")
        body = check_fields(await _read_json(request, cfg.max_body),
                            COMMON_FIELDS | {"prompt", "input_prefix", "input_suffix", "input_extra", "return_tokens",
                                             "response_fields"}, "/infill")
        if body.get("return_tokens") not in (None, True, False):
            raise BadRequest("'return_tokens' must be true or false")
        g = parse_generation(body, state.vocab, state.n_vocab, default_n_predict=cfg.n_predict, defaults=cfg.sampling, default_stops=cfg.stops)
        prompt = await run_in_threadpool(lambda: _infill_prompt(state, body, cfg.n_predict))
        return await run_generation(request, body, [prompt], g, 1, "native")

    async def completion_oai(request):
        body = check_fields(await _read_json(request, cfg.max_body),
                            COMMON_FIELDS | {"prompt", "n", "n_cmpl", "logprobs", "echo", "suffix", "best_of",
                                             "stream_options"}, "/v1/completions")
        g = parse_generation(body, state.vocab, state.n_vocab, default_n_predict=cfg.n_predict, defaults=cfg.sampling, default_stops=cfg.stops)
        g.verbose = g.verbose if body.get("verbose") is not None else cfg.verbose
        # llama-server: n_cmpl, with OpenAI's n as its fallback
        n = _int_field(body, "n_cmpl", 1, cfg.max_n, 0) or _int_field(body, "n", 1, cfg.max_n, 1)
        if _int_field(body, "best_of", 1, cfg.max_n, 1) != 1:
            raise BadRequest("'best_of' > 1 is not supported (pass n for several choices)")
        if body.get("suffix"):
            raise BadRequest("'suffix' (fill-in-the-middle) is not supported")
        lp = body.get("logprobs")
        if lp is not None:
            if isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= 20:
                raise BadRequest(f"'logprobs' must be an integer from 0 to 20, got {lp!r}")
            g.n_probs = lp if lp > 0 else -1
        if body.get("echo") not in (None, False, True):
            raise BadRequest("'echo' must be true or false")
        if body.get("echo") and lp is not None:
            raise BadRequest("'echo' with 'logprobs' (prompt log-probabilities) is not supported")
        _stream_options(body, g)
        prompts = await run_in_threadpool(lambda: _prompts(state, body.get("prompt")))
        return await run_generation(request, body, prompts, g, n, "oai")

    async def chat_completion(request):
        body = check_fields(await _read_json(request, cfg.max_body),
                            COMMON_FIELDS | {"messages", "n", "logprobs", "top_logprobs", "response_format",
                                             "tools", "tool_choice", "parallel_tool_calls", "stream_options",
                                             "max_completion_tokens", "chat_template_kwargs", "add_generation_prompt",
                                             "continue_final_message", "reasoning_format"},
                            request.url.path)
        rfmt = body.get("reasoning_format", cfg.reasoning_format)
        if rfmt not in reasoning_mod.FORMATS:
            raise BadRequest(f"'reasoning_format' must be one of {', '.join(reasoning_mod.FORMATS)}, got {rfmt!r}")
        g = parse_generation(body, state.vocab, state.n_vocab, default_n_predict=cfg.n_predict,
                             defaults=cfg.sampling, default_stops=cfg.stops, max_tokens_names=("n_predict", "max_tokens", "max_completion_tokens"))
        g.verbose = g.verbose if body.get("verbose") is not None else cfg.verbose
        n = _int_field(body, "n", 1, cfg.max_n, 1)
        tools = _tools(state, body)
        lp = body.get("logprobs")
        if lp not in (None, True, False):
            raise BadRequest("'logprobs' must be true or false")
        tl = body.get("top_logprobs")
        if tl is not None:
            if isinstance(tl, bool) or not isinstance(tl, int) or not 0 <= tl <= 20:
                raise BadRequest(f"'top_logprobs' must be an integer from 0 to 20, got {tl!r}")
            if not lp:
                raise BadRequest("'top_logprobs' needs 'logprobs': true")
        if lp:
            g.n_probs = tl if tl else -1
        kind, schema = response_format_schema(body.get("response_format"))
        if kind is not None:
            if g.grammar is not None or g.json_schema is not None:
                raise BadRequest("pass either 'response_format' or 'grammar' / 'json_schema', not both")
            g.json_schema = "json" if kind == "json" else schema
        _stream_options(body, g)
        if tools is not None and tools.grammar is not None:
            if g.grammar is not None or g.json_schema is not None:
                raise BadRequest("'tools' constrain the reply with their own grammar: pass no 'grammar', "
                                 "'json_schema' or 'response_format' with them")
            g.grammar = tools.grammar
            g.grammar_triggers = tools.grammar_triggers or None
        text = await run_in_threadpool(lambda: _chat_prompt(state, body, tools))
        prompt = await run_in_threadpool(lambda: state.chat.tokenize(text))
        return await run_generation(request, body, [prompt], g, n, "chat", tools,
                                    (rfmt, reasoning_mod.forced_open(text)))

    async def chat_input_tokens(request):
        """How many tokens a chat request's prompt is (llama-server's /chat/completions/input_tokens)."""
        body = check_fields(await _read_json(request, cfg.max_body),
                            COMMON_FIELDS | {"messages", "n", "logprobs", "top_logprobs", "response_format", "tools",
                                             "tool_choice", "parallel_tool_calls", "stream_options",
                                             "max_completion_tokens", "chat_template_kwargs", "add_generation_prompt",
                                             "continue_final_message", "reasoning_format"}, request.url.path)
        tools = _tools(state, body)
        toks = await run_in_threadpool(lambda: state.chat.tokenize(_chat_prompt(state, body, tools)))
        return JSONResponse({"input_tokens": len(toks)})

    def _stream_options(body, g):
        so = body.get("stream_options")
        if so is None:
            return
        if not g.stream:
            raise BadRequest("'stream_options' is only allowed with 'stream': true")
        if not isinstance(so, dict) or any(k != "include_usage" for k in so) \
                or not isinstance(so.get("include_usage", False), bool):
            raise BadRequest("'stream_options' must be {\"include_usage\": true|false}")

    routes = [
        Route("/health", endpoint(health, public=True), methods=["GET"]),
        Route("/v1/health", endpoint(health, public=True), methods=["GET"]),
        Route("/models", endpoint(models), methods=["GET"]),
        Route("/v1/models", endpoint(models), methods=["GET"]),
        Route("/props", endpoint(props), methods=["GET"]),
        Route("/slots", endpoint(slots), methods=["GET"]),
        Route("/metrics", endpoint(metrics), methods=["GET"]),
        Route("/lora-adapters", endpoint(lora_adapters), methods=["GET", "POST"]),
        Route("/tokenize", endpoint(tokenize), methods=["POST"]),
        Route("/detokenize", endpoint(detokenize), methods=["POST"]),
        Route("/apply-template", endpoint(apply_template), methods=["POST"]),
        Route("/completion", endpoint(completion_native), methods=["POST"]),
        Route("/completions", endpoint(completion_native), methods=["POST"]),
        Route("/v1/completions", endpoint(completion_oai), methods=["POST"]),
        Route("/infill", endpoint(infill), methods=["POST"]),
        Route("/chat/completions", endpoint(chat_completion), methods=["POST"]),
        Route("/v1/chat/completions", endpoint(chat_completion), methods=["POST"]),
        Route("/chat/completions/input_tokens", endpoint(chat_input_tokens), methods=["POST"]),
        Route("/v1/chat/completions/input_tokens", endpoint(chat_input_tokens), methods=["POST"]),
    ]
    routes += [Route("/embedding", endpoint(embeddings_native), methods=["POST"]),
               Route("/embeddings", endpoint(embeddings_native), methods=["POST"]),
               Route("/v1/embeddings", endpoint(embeddings_oai), methods=["POST"])]
    for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"):
        routes.append(Route(path, endpoint(rerank), methods=["POST"]))

    async def http_error(request, exc):
        msg = {404: f"File Not Found: {request.url.path}", 405: f"method {request.method} is not allowed on "
               f"{request.url.path}"}.get(exc.status_code, str(exc.detail))
        return _error(exc.status_code, msg)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if cfg.threads_http > 0:
            anyio.to_thread.current_default_thread_limiter().total_tokens = cfg.threads_http
        state.start()
        try:
            yield
        finally:
            state.stop()

    from starlette.middleware import Middleware

    return Starlette(routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan,
                     middleware=[Middleware(_LlamaServerHeaders, origins=list(cfg.cors_origins))])


_LOCAL_ORIGIN = re.compile(r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?$")


class _LlamaServerHeaders:
    """llama-server's CORS and header spelling, as plain ASGI middleware: an OPTIONS request
    (a browser's preflight) is answered 200 with no key needed; a request whose Origin is
    allowed (``--cors-origins``: "*" any, "localhost" local pages only, or a list) gets the
    origin echoed with credentials, llama-server's methods and "*" headers; response header
    names go out Title-Cased as llama-server writes them (clients that compare them
    case-sensitively exist)."""

    def __init__(self, app, origins: list):
        self.app = app
        self.any = "*" in origins
        self.local = "localhost" in origins
        self.exact = {o for o in origins if o not in ("*", "localhost")}

    def allowed(self, origin: str) -> bool:
        return self.any or origin in self.exact or (self.local and bool(_LOCAL_ORIGIN.match(origin)))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        origin = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"origin"), None)
        extra = []
        if origin is not None and self.allowed(origin):
            extra = [(b"Access-Control-Allow-Origin", origin.encode("latin-1")),
                     (b"Access-Control-Allow-Credentials", b"true"),
                     (b"Access-Control-Allow-Methods", b"GET, POST, DELETE, OPTIONS"),
                     (b"Access-Control-Allow-Headers", b"*")]
        if scope["method"] == "OPTIONS":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"Content-Length", b"0"), *extra]})
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_titled(msg):
            if msg["type"] == "http.response.start":
                msg = dict(msg)
                msg["headers"] = [(b"-".join(w[:1].upper() + w[1:] for w in k.split(b"-")), v)
                                  for k, v in msg.get("headers", [])] + extra
            await send(msg)

        await self.app(scope, receive, send_titled)


# ------------------------------------------------------------------------ response shapes


def _defaults(cfg: ServerConfig) -> dict:
    from ..sampling import SamplerParams

    return _settings(cfg.sampling or SamplerParams(), cfg.n_predict)


def _settings(p, n_predict: int, g=None) -> dict:
    """llama-server's generation_settings: the sampling parameters in effect."""
    from ..sampling import LLAMA_DEFAULT_SEED

    out = {"n_predict": n_predict, "seed": -1 if p.seed == LLAMA_DEFAULT_SEED else int(p.seed),
           "temperature": p.temp, "dynatemp_range": p.dynatemp_range, "dynatemp_exponent": p.dynatemp_exponent,
           "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p, "top_n_sigma": p.top_n_sigma,
           "xtc_probability": p.xtc_probability, "xtc_threshold": p.xtc_threshold, "typical_p": p.typ_p,
           "repeat_last_n": p.penalty_last_n, "repeat_penalty": p.penalty_repeat,
           "presence_penalty": p.penalty_present, "frequency_penalty": p.penalty_freq,
           "dry_multiplier": p.dry_multiplier, "dry_base": p.dry_base, "dry_allowed_length": p.dry_allowed_length,
           "dry_penalty_last_n": p.dry_penalty_last_n, "dry_sequence_breakers": list(p.dry_sequence_breakers),
           "mirostat": p.mirostat, "mirostat_tau": p.mirostat_tau, "mirostat_eta": p.mirostat_eta,
           "min_keep": p.min_keep, "samplers": list(p.samplers),
           "logit_bias": [{"token": t, "bias": (None if b == float("-inf") else b)} for t, b in sorted(p.logit_bias.items())]}
    if g is not None:
        out.update({"stop": list(g.stops), "ignore_eos": g.ignore_eos, "n_probs": g.n_probs,
                    "n_keep": g.n_keep if g.n_keep is not None else 0, "cache_prompt": g.cache_prompt,
                    "stream": g.stream, "grammar": g.grammar or ""})
    return out




def _messages(body: dict) -> list:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("'messages' must be a non-empty list of {\"role\", \"content\"} objects")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a 'role' string")
        m = dict(m)
        c = m.get("content")
        if isinstance(c, list):  # OpenAI's content parts: text only
            texts = []
            for j, part in enumerate(c):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise BadRequest(f"messages[{i}].content[{j}]: only text parts are supported "
                                     f"(got type {part.get('type') if isinstance(part, dict) else part!r})")
                texts.append(part["text"])
            m["content"] = "\n".join(texts)  # llama.cpp joins text parts with a newline
        elif c is not None and not isinstance(c, str):
            raise BadRequest(f"messages[{i}].content must be a string or a list of text parts")
        out.append(m)
    return out


def _tools(state: "ServerState", body: dict):
    """The request's ToolCalls (None without tools)."""
    if body.get("parallel_tool_calls") not in (None, True, False):
        raise BadRequest("'parallel_tool_calls' must be true or false")
    if body.get("tools") in (None, []):
        if body.get("tool_choice") not in (None, "none", "auto"):
            raise BadRequest(f"'tool_choice' = {body.get('tool_choice')!r} needs 'tools'")
        return None
    from ..tool_calls import ToolCallError, ToolCalls

    try:
        return ToolCalls(state.chat.source, body["tools"], body.get("tool_choice", "auto"),
                         bool(body.get("parallel_tool_calls", False)))
    except ToolCallError as e:
        raise BadRequest(str(e)) from None


def _chat_prompt(state: "ServerState", body: dict, tools) -> str:
    """The prompt text of a chat request, as llama-server renders it: a final assistant
    message is continued (prefilled), not closed; the template sees the tools; Jinja
    templates get llama.cpp's extra variables (today's date, enable_thinking)."""
    msgs = _messages(body)
    agp = body.get("add_generation_prompt", True)
    if not isinstance(agp, bool):
        raise BadRequest("'add_generation_prompt' must be true or false")
    cont = body.get("continue_final_message", False)
    if cont not in (True, False, None, "content"):
        raise BadRequest("'continue_final_message' must be true, false or \"content\"")
    cont = bool(cont)
    if not cont and msgs[-1]["role"] == "assistant":
        if len(msgs) >= 2 and msgs[-2]["role"] == "assistant":
            raise BadRequest("Cannot have 2 or more assistant messages at the end of the list.")
        cont, agp = True, False
    elif cont and agp:
        raise BadRequest("Cannot set both add_generation_prompt and continue_final_message to true.")
    prefix = ""
    if cont:
        last = msgs[-1]
        if last["role"] != "assistant":
            raise BadRequest("'continue_final_message' needs an assistant message at the end")
        if last.get("tool_calls"):
            raise BadRequest("Cannot continue an assistant message that contains tool calls.")
        msgs, prefix, agp = msgs[:-1], last.get("content") or "", True
    kw = _template_kwargs(state, body)
    if tools is not None:
        msgs = tools.messages(msgs)
        kw = {**kw, **tools.template_vars()}
    else:
        msgs = with_object_arguments(msgs)
    return state.chat.render(msgs, agp, **kw) + prefix


def _template_kwargs(state: "ServerState", body: dict) -> dict:
    kw = body.get("chat_template_kwargs")
    base: dict = {}
    if state.chat.jinja:  # llama.cpp's extra context for Jinja templates
        base["date_string"] = time.strftime("%d %b %Y")
        if "enable_thinking" in state.chat.source or state.config.reasoning != "auto":
            base["enable_thinking"] = state.config.reasoning != "off"
    if kw is None:
        return base
    if not isinstance(kw, dict) or not all(isinstance(k, str) and k.isidentifier() for k in kw):
        raise BadRequest("'chat_template_kwargs' must be an object with identifier keys")
    reserved = {"messages", "add_generation_prompt", "bos_token", "eos_token"}
    bad = reserved & set(kw)
    if bad:
        raise BadRequest(f"'chat_template_kwargs' may not set {', '.join(sorted(bad))}")
    if not state.chat.jinja:
        raise BadRequest("'chat_template_kwargs' needs a Jinja chat template (this server renders a built-in one)")
    return {**base, **kw}


def _usage(dones: list) -> dict:
    n_p = sum(d["n_prompt"] for d in dones)
    n_g = sum(d["n_gen"] for d in dones)
    return {"prompt_tokens": n_p, "completion_tokens": n_g, "total_tokens": n_p + n_g,
            "prompt_tokens_details": {"cached_tokens": sum(d["n_cached"] for d in dones)}}


def _scored(evs: list) -> list:
    """The token events that carry a log-probability (a stop string's held-back tail does
    not), or with post_sampling_probs a probability."""
    return [ev for ev in evs if ev["type"] == "token" and ev["token"] is not None
            and (ev["logprob"] is not None or ev.get("prob") is not None)]


def _oai_logprobs(state, evs: list, text_offset: int) -> dict:
    """OpenAI's completions logprobs: tokens, text_offset, token_logprobs, top_logprobs."""
    v = state.vocab
    tokens, offsets, token_lp, top_lp = [], [], [], []
    pos = text_offset
    for ev in _scored(evs):
        s = _piece(v, ev["token"])
        tokens.append(s)
        offsets.append(pos)
        token_lp.append(ev["logprob"])
        top_lp.append({_piece(v, t): lp for t, lp in (ev["top"] or [])} or None)
        pos += len(s)
    return {"tokens": tokens, "text_offset": offsets, "token_logprobs": token_lp, "top_logprobs": top_lp}


def _oai_lp(state, evs: list, text_offset: int, body: dict, g) -> Optional[dict]:
    """A completions choice's logprobs: OpenAI's shape, or with post_sampling_probs
    llama-server's {"content": [...probabilities...]}."""
    if body.get("logprobs") is None and not (g is not None and g.n_probs):
        return None
    if g is not None and g.post_sampling_probs:
        return {"content": _probs(state, evs, False)}
    if body.get("logprobs") is None:
        return None
    return _oai_logprobs(state, evs, text_offset)


def _prob(v, t: int, lp: float, with_id: bool) -> dict:
    """One token's entry: OpenAI's chat shape (token, logprob, bytes), llama-server's adds id."""
    d = {"id": t} if with_id else {}
    d.update(token=_piece(v, t), logprob=lp, bytes=_piece_bytes(v, t))
    return d


def _probs(state, evs: list, with_id: bool) -> list:
    """Per token its entry and its top alternatives: log-probabilities (logprob /
    top_logprobs), or with post_sampling_probs the sampler chain's probabilities (prob /
    top_probs), as llama-server's probs_vector_to_json."""
    v = state.vocab
    out = []
    for ev in _scored(evs):
        if ev.get("prob") is not None:
            def entry(t, p):
                d = {"id": t} if with_id else {}
                d.update(token=_piece(v, t), prob=p, bytes=_piece_bytes(v, t))
                return d
            out.append({**entry(ev["token"], ev["prob"]),
                        "top_probs": [entry(i, p) for i, p in (ev["top"] or [])]})
        else:
            out.append({**_prob(v, ev["token"], ev["logprob"], with_id),
                        "top_logprobs": [_prob(v, i, lp, with_id) for i, lp in (ev["top"] or [])]})
    return out


def _chat_logprobs(state, evs: list) -> dict:
    return {"content": _probs(state, evs, False)}


def _native_probs(state, evs: list) -> list:
    return _probs(state, evs, True)


def _native_final(state, done: dict, evs: list, prompt: list, content: str, g, body: dict) -> dict:
    toks = [ev["token"] for ev in evs if ev["type"] == "token" and ev["token"] is not None]
    out = {"index": done["index"], "content": content,
           "tokens": toks if body.get("return_tokens") else [],
           "id_slot": done["slot"], "stop": True, "model": state.model_id,
           "tokens_predicted": done["n_gen"], "tokens_evaluated": done["n_prompt"],
           "generation_settings": _settings(g.sampling, g.n_predict, g),
           "prompt": state.vocab.detokenize(prompt, unparse_special=True),
           "has_new_line": "\n" in content, "truncated": done["truncated"],
           "stop_type": done["stop_type"], "stopping_word": done["stopping_word"],
           "tokens_cached": done["n_cache"], "timings": done["timings"]}
    fields = body.get("response_fields")
    if fields:
        out = _pick_fields(out, fields)
    return out


def _pick_fields(obj: dict, fields: list) -> dict:
    """llama-server's response_fields: only these (a/b names a nested field), flat."""
    res = {}
    for f in fields:
        cur: Any = obj
        for part in f.split("/"):
            if not isinstance(cur, dict) or part not in cur:
                cur = None
                break
            cur = cur[part]
        if cur is not None:
            res[f] = cur
    return res


def _final(state, per: dict, prompts: list, n: int, shape: str, meta: dict, body: dict, tools=None, g=None,
           reasoning=None):
    choices, dones = [], []
    verbose = None  # llama-server's "__verbose": the first choice's native answer
    for idx in sorted(per):
        evs = per[idx]
        done = next(ev for ev in evs if ev["type"] == "done")
        dones.append(done)
        text = "".join(ev["text"] for ev in evs if ev["type"] == "token")
        if done.get("cut"):  # n_indent took back the last line's text
            text = done["text"]
        prompt = prompts[idx // n]
        if shape == "native":
            res = _native_final(state, done, evs, prompt, text, g, body)
            if _scored(evs):
                res["completion_probabilities"] = _native_probs(state, evs)
            choices.append(res)
            continue
        if shape == "oai":
            prompt_text = ""
            if body.get("echo"):
                prompt_text = _prompt_text(state, prompt)
                text = prompt_text + text
            lp = _oai_lp(state, evs, len(prompt_text), body, g)
            choices.append({"text": text, "index": idx, "logprobs": lp, "finish_reason": done["finish_reason"]})
            if g is not None and g.verbose and verbose is None:
                verbose = _native_final(state, done, evs, prompt, text, g, {})
        else:
            lp = _chat_logprobs(state, evs) if body.get("logprobs") else None
            thoughts, text = reasoning_mod.split(text, *(reasoning or ("none", False)))
            msg, fin = reply_message(text, tools)
            if thoughts is not None:
                msg["reasoning_content"] = thoughts
            choices.append({"index": idx, "message": msg, "logprobs": lp,
                            "finish_reason": fin or done["finish_reason"]})
            if g is not None and g.verbose and verbose is None:
                verbose = _native_final(state, done, evs, prompt, text, g, {})
    if shape == "native":
        return choices[0] if len(choices) == 1 else choices
    timings = dones[0]["timings"] if dones else {}
    res = {"id": meta["id"], "object": "chat.completion" if shape == "chat" else "text_completion",
           "created": meta["created"], "model": meta["model"], "system_fingerprint": _FINGERPRINT,
           "choices": choices, "usage": _usage(dones), "timings": timings}
    if verbose is not None:
        res["__verbose"] = verbose
    return res


def _prompt_text(state, prompt: list) -> str:
    return b"".join(state.vocab.token_to_piece(int(t), False) for t in prompt).decode("utf-8", "replace")


async def _stream(state, run: _Run, prompts: list, n: int, shape: str, meta: dict, body: dict, tools=None, g=None,
                  reasoning=None):
    """SSE chunks as the scheduler emits tokens. Leaving early (client gone) cancels the jobs.
    With tools, a choice's reply is held until it is complete (it may be a tool call, which
    is sent as one delta) and then sent as content or tool_calls."""
    dones: list = []
    held: dict = {}
    finished = False
    fmt, opened = reasoning or ("none", False)
    splitters: dict = {}  # choice -> reasoning_mod.StreamSplitter

    def chat_deltas(i: int, parts: list, lp, extra=None) -> list:
        chunks = []
        for k, (kind, t) in enumerate(parts):
            key = "reasoning_content" if kind == "reasoning" else "content"
            chunks.append(_sse({**base, "object": "chat.completion.chunk",
                                "choices": [{"index": i, "delta": {key: t}, "logprobs": lp, "finish_reason": None}],
                                **(extra if extra and k == len(parts) - 1 else {})}))
            lp = None
        return chunks
    try:
        base = {"id": meta["id"], "created": meta["created"], "model": meta["model"],
                "system_fingerprint": _FINGERPRINT}
        if shape == "chat":
            for i in range(len(run.jobs)):
                yield _sse({**base, "object": "chat.completion.chunk",
                            "choices": [{"index": i, "delta": {"role": "assistant", "content": None},
                                         "logprobs": None, "finish_reason": None}]})
        elif shape == "oai" and body.get("echo"):
            for i in range(len(run.jobs)):
                yield _sse({**base, "object": "text_completion",
                            "choices": [{"text": _prompt_text(state, prompts[i // n]), "index": i,
                                         "logprobs": None, "finish_reason": None}]})
        try:
            async for ev in run.events(g.sse_ping_interval if g is not None else -1):
                i = ev["index"]
                if ev["type"] == "ping":
                    yield b": ping\n\n"
                    continue
                if ev["type"] == "progress":
                    pp = {k: ev[k] for k in ("total", "cache", "processed", "time_ms")}
                    extra = {"prompt_progress": pp}
                    if ev.get("timings") is not None:
                        extra["timings"] = ev["timings"]
                    if shape == "native":
                        yield _sse({"index": i, "content": "", "tokens": [], "stop": False, "id_slot": run.jobs[i].slot,
                                    "tokens_predicted": 0, "tokens_evaluated": ev["total"], **extra})
                    elif shape == "oai":
                        yield _sse({**base, "object": "text_completion",
                                    "choices": [{"text": "", "index": i, "logprobs": None, "finish_reason": None}],
                                    **extra})
                    else:
                        yield _sse({**base, "object": "chat.completion.chunk",
                                    "choices": [{"index": i, "delta": {"role": "assistant", "content": None},
                                                 "logprobs": None, "finish_reason": None}], **extra})
                    continue
                if ev["type"] == "error":
                    yield _sse({"error": {"code": 500, "message": ev["message"], "type": "server_error"}})
                    continue
                if ev["type"] == "token":
                    scored = bool(_scored([ev]))
                    if not ev["text"] and (not scored or shape == "oai"):
                        continue
                    tm = {"timings": ev["timings"]} if ev.get("timings") is not None else {}
                    if shape == "native":
                        c = {"index": i, "content": ev["text"],
                             "tokens": [ev["token"]] if ev["token"] is not None else [],
                             "stop": False, "id_slot": run.jobs[i].slot, **tm}
                        if scored:
                            c["completion_probabilities"] = _native_probs(state, [ev])
                        yield _sse(c)
                    elif shape == "oai":
                        lp = _oai_lp(state, [ev], 0, body, g)
                        yield _sse({**base, "object": "text_completion",
                                    "choices": [{"text": ev["text"], "index": i, "logprobs": lp,
                                                 "finish_reason": None}], **tm})
                    elif tools is not None:
                        held.setdefault(i, []).append(ev["text"])
                    else:
                        lp = _chat_logprobs(state, [ev]) if body.get("logprobs") else None
                        sp = splitters.setdefault(i, reasoning_mod.StreamSplitter(fmt, opened))
                        parts = sp.feed(ev["text"])
                        if not parts and lp is not None:
                            parts = [("content", "")]  # the token's log-probability still goes out
                        for c in chat_deltas(i, parts, lp, tm):
                            yield c
                    continue
                # done
                dones.append(ev)
                if shape == "native":
                    yield _sse(_native_final(state, ev, [], prompts[i // n], "", g, body))
                elif shape == "oai":
                    yield _sse({**base, "object": "text_completion",
                                "choices": [{"text": "", "index": i, "logprobs": None,
                                             "finish_reason": ev["finish_reason"]}], "timings": ev["timings"]})
                else:
                    fin = None
                    if i in splitters:
                        for c in chat_deltas(i, splitters.pop(i).finish(), None):
                            yield c
                    if tools is not None:
                        thoughts, text = reasoning_mod.split("".join(held.pop(i, [])), fmt, opened)
                        msg, fin = reply_message(text, tools)
                        delta: dict = {}
                        if thoughts is not None:
                            delta["reasoning_content"] = thoughts
                        if msg["content"]:
                            delta["content"] = msg["content"]
                        if msg.get("tool_calls"):
                            delta["tool_calls"] = [{"index": k, **c} for k, c in enumerate(msg["tool_calls"])]
                        if delta:
                            yield _sse({**base, "object": "chat.completion.chunk",
                                        "choices": [{"index": i, "delta": delta, "logprobs": None,
                                                     "finish_reason": None}]})
                    yield _sse({**base, "object": "chat.completion.chunk",
                                "choices": [{"index": i, "delta": {}, "logprobs": None,
                                             "finish_reason": fin or ev["finish_reason"]}], "timings": ev["timings"]})
        except asyncio.TimeoutError:
            run.cancel()
            yield _sse({"error": {"code": 504, "message": f"no progress for {state.config.timeout:g} s "
                                  "(--timeout); the request was dropped", "type": "timeout_error"}})
            finished = True
            return
        so = body.get("stream_options") or {}
        if shape != "native" and so.get("include_usage"):
            yield _sse({**base, "object": "chat.completion.chunk" if shape == "chat" else "text_completion",
                        "choices": [], "usage": _usage(dones), "timings": dones[0]["timings"] if dones else {}})
        if shape != "native":
            yield b"data: [DONE]\n\n"
        finished = True
    finally:
        if not finished:
            run.cancel()


def _prometheus(state: ServerState) -> str:
    e = state.engine
    m = e.m
    rows = [
        ("prompt_tokens_total", "counter", "Number of prompt tokens processed.", m["prompt_tokens_total"]),
        ("prompt_seconds_total", "counter", "Prompt process time", m["prompt_seconds_total"]),
        ("tokens_predicted_total", "counter", "Number of generation tokens processed.", m["tokens_predicted_total"]),
        ("tokens_predicted_seconds_total", "counter", "Predict process time", m["tokens_predicted_seconds_total"]),
        ("n_decode_total", "counter", "Total number of llama_decode() calls", m["n_decode_total"]),
        ("n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call",
         m["n_busy_slots_total"] / m["n_decode_total"] if m["n_decode_total"] else 0.0),
        ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
         m["prompt_tokens_total"] / m["prompt_seconds_total"] if m["prompt_seconds_total"] else 0.0),
        ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
         m["tokens_predicted_total"] / m["tokens_predicted_seconds_total"]
         if m["tokens_predicted_seconds_total"] else 0.0),
        ("requests_processing", "gauge", "Number of requests processing.", e.n_busy),
        ("requests_deferred", "gauge", "Number of requests deferred.", e.n_waiting),
        ("n_tokens_max", "counter", "Largest observed n_tokens.", m["n_tokens_max"]),
        ("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache.",
         m["prompt_tokens_cached_total"]),
        # no speculative decoding in pyllama: llama-server's counters, always 0
        ("spec_decode_num_drafts_total", "counter", "Number of speculative drafts.", 0),
        ("spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", 0),
        ("spec_decode_num_accepted_tokens_total", "counter", "Number of accepted draft tokens.", 0),
    ]
    out = []
    for name, kind, help_, val in rows:
        out.append(f"# HELP llamacpp:{name} {help_}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {val}\n")
    return "".join(out)
