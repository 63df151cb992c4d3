"""Request bodies -> generation settings, checked field by field.

Every field a request may carry is listed here with what it does; a field not listed is a
400 naming it (a misspelt ``temprature`` must not silently sample at the default). OpenAI's
fields keep OpenAI's names; llama-server's native sampling fields (``top_k``, ``min_p``,
``repeat_penalty``, ``dry_*``, ``xtc_*``, ``mirostat*``, ``n_predict``, ``grammar``,
``json_schema`` ...) are accepted on every generation endpoint, as llama-server does.
Defaults are llama-server's (common_params_sampling), not OpenAI's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from ..sampling import LLAMA_DEFAULT_SEED, SamplerParams

__all__ = ["BadRequest", "GenSettings", "parse_generation", "COMMON_FIELDS"]


class BadRequest(ValueError):
    """A request the server refuses (HTTP ``status``, 400 unless said)."""

    def __init__(self, message: str, status: int = 400, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type_


@dataclass
class GenSettings:
    sampling: SamplerParams
    n_predict: int = -1
    stops: list = field(default_factory=list)
    n_probs: int = 0
    ignore_eos: bool = False
    grammar: Optional[str] = None        # GBNF text
    grammar_triggers: Optional[list] = None  # lazy: the grammar applies from a match on (tool calls)
    json_schema: Any = None              # a schema to turn into a grammar
    cache_prompt: bool = True
    n_keep: Optional[int] = None         # None: the server's --keep; -1: the whole prompt
    stream: bool = False
    seed_given: bool = False
    id_slot: int = -1                    # the slot to run in (-1: the one whose cache fits best)
    n_indent: int = 0                    # stop at a new line indented less than this (code completion)
    t_max_predict_ms: int = -1           # stop at a new line once generating took longer (<= 0: off)
    n_discard: int = 0                   # tokens a context shift drops (0: half of what is not kept)
    n_cache_reuse: Optional[int] = None  # min chunk reused by KV shifting (None: --cache-reuse)
    post_sampling_probs: bool = False    # n_probs as probabilities after the sampler chain
    return_progress: bool = False        # stream prompt-processing progress chunks
    timings_per_token: bool = False      # timings in every streamed chunk
    sse_ping_interval: int = -1          # seconds of silence before an SSE comment ping (-1: none)
    verbose: bool = False                # OpenAI-shaped answers also carry the native one ("__verbose")


# name -> (SamplerParams field, type, check) for llama-server's sampling fields
_FLOAT = "float"
_INT = "int"
_SAMPLING = {
    "temperature": ("temp", _FLOAT),
    "top_p": ("top_p", _FLOAT),
    "top_k": ("top_k", _INT),
    "min_p": ("min_p", _FLOAT),
    "typical_p": ("typ_p", _FLOAT),
    "repeat_penalty": ("penalty_repeat", _FLOAT),
    "repeat_last_n": ("penalty_last_n", _INT),
    "presence_penalty": ("penalty_present", _FLOAT),
    "frequency_penalty": ("penalty_freq", _FLOAT),
    "dry_multiplier": ("dry_multiplier", _FLOAT),
    "dry_base": ("dry_base", _FLOAT),
    "dry_allowed_length": ("dry_allowed_length", _INT),
    "dry_penalty_last_n": ("dry_penalty_last_n", _INT),
    "xtc_probability": ("xtc_probability", _FLOAT),
    "xtc_threshold": ("xtc_threshold", _FLOAT),
    "top_n_sigma": ("top_n_sigma", _FLOAT),
    "mirostat": ("mirostat", _INT),
    "mirostat_tau": ("mirostat_tau", _FLOAT),
    "mirostat_eta": ("mirostat_eta", _FLOAT),
    "dynatemp_range": ("dynatemp_range", _FLOAT),
    "dynatemp_exponent": ("dynatemp_exponent", _FLOAT),
    "min_keep": ("min_keep", _INT),
}

# fields every generation endpoint takes (besides the sampling ones)
COMMON_FIELDS = set(_SAMPLING) | {
    "model", "stream", "stop", "seed", "n_predict", "max_tokens", "ignore_eos", "logit_bias",
    "grammar", "json_schema", "cache_prompt", "n_keep", "samplers", "dry_sequence_breakers",
    "n_probs", "id_slot", "user", "n_indent", "t_max_predict_ms", "n_discard", "n_cache_reuse",
    "post_sampling_probs", "return_progress", "timings_per_token", "sse_ping_interval", "backend_sampling",
    "verbose",
}

_SAMPLER_NAMES = {"penalties", "dry", "top_n_sigma", "top_k", "typ_p", "typical_p", "typical", "top_p",
                  "min_p", "xtc", "temperature", "temp"}


def _num(body: dict, name: str, kind: str):
    v = body[name]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadRequest(f"'{name}' must be a number, got {type(v).__name__} {v!r}")
    if kind == _INT:
        if isinstance(v, float):
            if not v.is_integer():
                raise BadRequest(f"'{name}' must be an integer, got {v!r}")
            v = int(v)
        if not -(2**31) <= v < 2**31:
            raise BadRequest(f"'{name}' = {v} is out of range (int32)")
        return int(v)
    v = float(v)
    if not math.isfinite(v):
        raise BadRequest(f"'{name}' must be finite, got {v!r}")
    return v


def _bool(body: dict, name: str) -> bool:
    v = body[name]
    if not isinstance(v, bool):
        raise BadRequest(f"'{name}' must be true or false, got {v!r}")
    return v


def check_fields(body: Any, allowed: set, where: str) -> dict:
    if not isinstance(body, dict):
        raise BadRequest(f"{where}: the request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(k for k in body if k not in allowed)
    if unknown:
        raise BadRequest(f"{where}: unknown field{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(repr(k) for k in unknown)} (see the README's server section for the "
                         "fields each endpoint takes)")
    return body


def parse_stop(v) -> list:
    if v is None:
        return []
    if isinstance(v, str):
        return [v] if v else []
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise BadRequest(f"'stop' must be a string or a list of strings, got {v!r}"[:300])
    if len(v) > 16:
        raise BadRequest(f"'stop' has {len(v)} strings; at most 16 are allowed")
    return [s for s in v if s]


def parse_logit_bias(v, vocab, n_vocab: int) -> dict:
    """OpenAI's {"token_id": bias} or llama-server's [[token_or_text, bias|false], ...];
    a text is tokenized and every one of its tokens biased; false means never."""
    if v is None:
        return {}
    out: dict = {}

    def add(key, bias, where):
        if bias is False:
            bias = -math.inf
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)) or math.isnan(float(bias)):
            raise BadRequest(f"logit_bias{where}: the bias must be a number or false, got {bias!r}")
        if isinstance(key, str) and not key.lstrip("-").isdigit():
            toks = list(vocab.tokenize(key, add_special=False, parse_special=False))
        else:
            try:
                toks = [int(key)]
            except (TypeError, ValueError):
                raise BadRequest(f"logit_bias{where}: {key!r} is not a token id or a text") from None
        for t in toks:
            if not 0 <= t < n_vocab:
                raise BadRequest(f"logit_bias{where}: token {t} is out of range (n_vocab = {n_vocab})")
            out[t] = float(bias)

    if isinstance(v, dict):
        for k, b in v.items():
            add(k, b, f"[{k!r}]")
    elif isinstance(v, list):
        for i, item in enumerate(v):
            if not isinstance(item, list) or len(item) != 2:
                raise BadRequest(f"logit_bias[{i}] must be a [token, bias] pair, got {item!r}"[:300])
            add(item[0], item[1], f"[{i}]")
    else:
        raise BadRequest(f"'logit_bias' must be an object or a list of pairs, got {type(v).__name__}")
    return out


def parse_generation(body: dict, vocab, n_vocab: int, *, default_n_predict: int = -1,
                     defaults: Optional[SamplerParams] = None, default_stops=(),
                     max_tokens_names=("max_tokens", "n_predict")) -> GenSettings:
    """The sampling and stopping settings of a generation request (fields already checked
    against the endpoint's list); what it leaves out comes from ``defaults`` (the server's
    --temp, --top-k, -l ... flags) and ``default_stops`` (its -r strings), as llama-server:
    a request's logit_bias replaces the server's, and its stop strings do unless it gives
    none."""
    import copy

    p = copy.deepcopy(defaults) if defaults is not None else SamplerParams(no_perf=True)
    p.no_perf = True
    for name, (attr, kind) in _SAMPLING.items():
        if name in body and body[name] is not None:
            setattr(p, attr, _num(body, name, kind))
    if p.mirostat not in (0, 1, 2):
        raise BadRequest(f"'mirostat' must be 0, 1 or 2, got {p.mirostat}")
    if p.top_k < 0:
        p.top_k = 0
    g = GenSettings(sampling=p)
    seed = body.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise BadRequest(f"'seed' must be an integer, got {seed!r}")
        if seed == -1:
            seed = LLAMA_DEFAULT_SEED
        if not 0 <= seed < 2**32:
            raise BadRequest(f"'seed' = {seed} is out of range (0 .. 2^32-1, or -1 for random)")
        p.seed = seed
        g.seed_given = seed != LLAMA_DEFAULT_SEED
    else:
        g.seed_given = p.seed != LLAMA_DEFAULT_SEED
    n_predict = default_n_predict
    for name in max_tokens_names:
        if name in body and body[name] is not None:
            v = _num(body, name, _INT)
            n_predict = v if v != -1 else default_n_predict  # -1: the server's -n (llama-server)
    g.n_predict = n_predict if n_predict >= 0 else -1
    g.stops = parse_stop(body.get("stop")) or list(default_stops)
    if body.get("ignore_eos") is not None:
        g.ignore_eos = _bool(body, "ignore_eos")
    if body.get("cache_prompt") is not None:
        g.cache_prompt = _bool(body, "cache_prompt")
    if body.get("stream") is not None:
        g.stream = _bool(body, "stream")
    if body.get("n_keep") is not None:
        g.n_keep = _num(body, "n_keep", _INT)
        if g.n_keep < -1:
            raise BadRequest(f"'n_keep' must be >= -1 (-1 = the whole prompt), got {g.n_keep}")
    if body.get("n_probs") is not None:
        g.n_probs = _num(body, "n_probs", _INT)
        if not 0 <= g.n_probs <= 100:
            raise BadRequest(f"'n_probs' must be 0..100, got {g.n_probs}")
    if body.get("id_slot") is not None:
        g.id_slot = _num(body, "id_slot", _INT)
        if g.id_slot < -1:
            raise BadRequest(f"'id_slot' must be a slot number or -1 (any), got {g.id_slot}")
    if body.get("samplers") is not None:
        s = body["samplers"]
        if isinstance(s, str) or not isinstance(s, list) or not all(isinstance(x, str) for x in s):
            raise BadRequest("'samplers' must be a list of sampler names")
        bad = [x for x in s if x not in _SAMPLER_NAMES]
        if bad:
            raise BadRequest(f"'samplers': unknown sampler {bad[0]!r} (known: {', '.join(sorted(_SAMPLER_NAMES))})")
        p.samplers = list(s)
    if body.get("dry_sequence_breakers") is not None:
        s = body["dry_sequence_breakers"]
        if not isinstance(s, list) or not all(isinstance(x, str) and x for x in s):
            raise BadRequest("'dry_sequence_breakers' must be a list of non-empty strings")
        p.dry_sequence_breakers = list(s)
    for name, lo in (("n_indent", 0), ("t_max_predict_ms", -1), ("n_discard", 0), ("n_cache_reuse", 0),
                     ("sse_ping_interval", -1)):
        if body.get(name) is not None:
            v = _num(body, name, _INT)
            if v < lo:
                raise BadRequest(f"'{name}' must be >= {lo}, got {v}")
            setattr(g, name, v)
    for name in ("post_sampling_probs", "return_progress", "timings_per_token", "verbose"):
        if body.get(name) is not None:
            setattr(g, name, _bool(body, name))
    if body.get("backend_sampling") is not None and _bool(body, "backend_sampling"):
        raise BadRequest("'backend_sampling': sampling on the compute backend is not supported; pyllama "
                         "samples on the CPU (leave it out or pass false)")
    if body.get("logit_bias") is not None:
        p.logit_bias = parse_logit_bias(body.get("logit_bias"), vocab, n_vocab)
    gr = body.get("grammar")
    if gr is not None:
        if not isinstance(gr, str):
            raise BadRequest(f"'grammar' must be GBNF text, got {type(gr).__name__}")
        g.grammar = gr or None
    js = body.get("json_schema")
    if js is not None:
        if not isinstance(js, dict):
            raise BadRequest(f"'json_schema' must be a JSON object, got {type(js).__name__}")
        if g.grammar is not None:
            raise BadRequest("pass either 'grammar' or 'json_schema', not both")
        g.json_schema = js
    return g


def response_format_schema(rf: Any):
    """OpenAI's response_format -> (kind, schema): kind None (text), "json" (any JSON object,
    schema None) or "schema"."""
    if rf is None:
        return None, None
    if not isinstance(rf, dict):
        raise BadRequest("'response_format' must be an object such as {\"type\": \"json_object\"}")
    kind = rf.get("type", "text")
    if kind == "text":
        return None, None
    if kind == "json_object":
        schema = rf.get("schema")
        return ("schema", schema) if schema is not None else ("json", None)
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema"), dict):
            raise BadRequest("response_format type 'json_schema' needs {\"json_schema\": {\"schema\": {...}}}")
        return "schema", js["schema"]
    raise BadRequest(f"response_format type {kind!r} is not one of 'text', 'json_object', 'json_schema'")
