"""Scale-out of ``pyllama serve`` on Ray Serve: N replicas of the same engine behind Ray
Serve's HTTP proxy, with the same routes (OpenAI's ``/v1/chat/completions``,
``/v1/completions``, ``/v1/models`` and llama-server's own; streaming included).

Each replica is a Ray actor that loads the model once, starts its own
:class:`~pyllama.server.engine.Engine` (its own context, slots and scheduler thread) and serves
:func:`~pyllama.server.app.create_app`'s Starlette app through ``serve.ingress``. Ray Serve's
proxy spreads requests over the replicas (at most ``max_ongoing_requests`` each, by default
twice the slots, so a replica keeps its batch full and the rest wait in Ray's router for the
first free replica). Every response carries an ``x-pyllama-replica`` header naming the replica
that answered. Ray Serve's health check replaces a replica whose engine has died. A client
that goes away (streaming or not) is cancelled through the proxy and frees its slot.

Needs ``pip install 'ray[serve]'`` (and pyllama, plus the model file at the same path, on
every node that runs a replica).

One machine (Ray starts a local cluster; the proxy listens on 127.0.0.1:8000)::

    serve run pyllama.server.ray:build_app model=/models/m.gguf num_replicas=2 num_cpus=4

or from Python::

    import ray
    from ray import serve
    from pyllama.server.ray import app

    ray.init()
    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    serve.run(app("/models/m.gguf", num_replicas=2, num_cpus=4, n_parallel=4), name="pyllama")

A cluster of several machines (keep Ray's ports on a private network; with Ray's token
authentication, ``RAY_AUTH_MODE=token`` and the same token on every node: ``ray
get-auth-token --generate`` on the head, then ``RAY_AUTH_TOKEN`` or ``~/.ray/auth_token`` on
the others)::

    # head node
    ray start --head --port=6379
    # every worker node
    ray start --address=HEAD_IP:6379
    # on the head (or any node): proxies on every node, listening on all interfaces
    serve start --http-host 0.0.0.0 --http-port 8000 --proxy-location EveryNode
    serve run --address=auto pyllama.server.ray:build_app model=/models/m.gguf num_replicas=8 num_cpus=8

or a Python script run on a node of the cluster: ``ray.init(address="auto")``, then
``serve.start(...)`` and ``serve.run(app(...))`` as above. Clients talk to any node's proxy
(``http://NODE:8000/v1``) as to ``pyllama serve``.

``num_cpus`` is what Ray reserves per replica (it places replicas by it); each replica's
engine uses that many threads unless ``threads`` says otherwise. The arguments of
:func:`build_app` (``key=value`` after ``serve run``) are :func:`app`'s keywords, plus
``api_key_file`` / ``chat_template_file`` (read where ``serve run`` runs) and the server's
default sampling settings by :class:`~pyllama.sampling.SamplerParams` field name
(``temp=0.7 top_k=40 seed=42``).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any, Iterable, Optional, Union

log = logging.getLogger("pyllama.server")

__all__ = ["REPLICA_HEADER", "app", "build_app"]

REPLICA_HEADER = "x-pyllama-replica"
_INSTALL = "pip install 'ray[serve]'"


def _serve():
    """``ray.serve``, imported only when needed, or an ImportError that says what to install."""
    try:
        from ray import serve
    except ImportError as e:
        raise ImportError(f"pyllama.server.ray needs Ray Serve, which is not installed ({e}): {_INSTALL}") from e
    return serve


# ------------------------------------------------------------------------- in each replica


class _ReplicaHeader:
    """ASGI middleware: adds ``x-pyllama-replica: <name>`` to every HTTP response."""

    def __init__(self, app, value: str):
        self.app = app
        self.header = (REPLICA_HEADER.encode("latin-1"), value.encode("latin-1", "replace"))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_header)


def _replica_name() -> str:
    """``<deployment>#<replica id>`` inside a Ray Serve replica, else ``<host>:<pid>``."""
    try:
        ctx = _serve().get_replica_context()
        tag = str(ctx.replica_tag)
        return tag if "#" in tag else f"{ctx.deployment}#{tag}"
    except Exception:  # noqa: BLE001 (not in a replica: tests, or an older Ray)
        return f"{socket.gethostname()}:{os.getpid()}"


_state = None  # this replica's ServerState (each replica is a Ray actor: a process of its own)


class _Replica:
    """The deployment class that ``serve.ingress`` wraps around the app: Ray Serve calls its
    ``check_health`` every few seconds and replaces a replica whose engine has died."""

    def check_health(self) -> None:
        st = _state
        if st is not None and st.engine.fatal is not None:
            raise RuntimeError(f"the pyllama engine has stopped: {st.engine.fatal}")


def _replica_app(s: dict):
    """Load the model, make the engine and the Starlette app (the engine starts and stops with
    the app's lifespan, which Ray Serve runs when the replica starts and stops)."""
    from ..generation import load_model, resolve_model_path
    from ..sampling import SamplerParams
    from .app import ServerConfig, ServerState, create_app
    from .engine import EngineConfig

    path = resolve_model_path(s["model"], progress=False)
    model = load_model(path, load_mode=s["load_mode"])
    n_ctx = s["n_ctx"] if s["n_ctx"] > 0 else (int(getattr(model, "n_ctx_train", 0)) or 4096)
    ecfg = EngineConfig(n_ctx=n_ctx, n_batch=s["n_batch"], n_ubatch=min(s["n_ubatch"] or s["n_batch"], s["n_batch"]),
                        n_parallel=s["n_parallel"], kv_unified=s["kv_unified"], n_threads=s["threads"],
                        n_threads_batch=s["threads_batch"], type_k=s["cache_type_k"], type_v=s["cache_type_v"],
                        context_shift=s["context_shift"], n_keep=s["keep"], max_queue=s["queue_size"])
    sampling = SamplerParams(**{**s["sampling"], "no_perf": True})
    cfg = ServerConfig(model_path=str(path), alias=s["alias"], api_keys=list(s["api_keys"]),
                       chat_template=s["chat_template"], metrics=s["metrics"], slots=s["slots"],
                       timeout=s["timeout"], n_predict=s["n_predict"], sampling=sampling, engine=ecfg)
    global _state
    state = _state = ServerState(model, cfg)
    asgi = create_app(state)
    name = _replica_name()
    if hasattr(asgi, "add_middleware"):  # keep the Starlette app (Ray adds its exception handlers to it)
        asgi.add_middleware(_ReplicaHeader, value=name)
    else:
        asgi = _ReplicaHeader(asgi, name)
    e = state.engine
    print(f"pyllama replica {name}: {path.name}, {len(e.slots)} slots x {e.n_ctx_slot} tokens, "
          f"{s['threads']} threads, chat template: {state.chat.name}", file=sys.stderr, flush=True)
    return asgi


# ------------------------------------------------------------------------------- builders


def app(model: Union[str, Path, None] = None, *, num_replicas: Union[int, str] = 1, num_cpus: float = 1.0,
        threads: Optional[int] = None, threads_batch: Optional[int] = None, n_parallel: int = 4,
        n_ctx: int = 4096, n_batch: int = 2048, n_ubatch: int = 512, kv_unified: bool = True,
        cache_type_k: str = "f16", cache_type_v: str = "f16", context_shift: bool = False, keep: int = 0,
        queue_size: int = 64, n_predict: int = -1, api_keys: Iterable[str] = (), alias: Optional[str] = None,
        chat_template: Optional[str] = None, metrics: bool = False, slots: bool = True, timeout: float = 600.0,
        load_mode: str = "auto", sampling: Optional[dict] = None, max_ongoing_requests: Optional[int] = None,
        name: str = "pyllama", ray_actor_options: Optional[dict] = None):
    """A Ray Serve application (``serve.run(app(...))``): ``num_replicas`` copies of
    ``pyllama serve``'s engine and routes, each reserving ``num_cpus`` CPUs.

    ``model``: GGUF path as seen on every node (None: the default SmolLM2, fetched per node).
    ``threads`` / ``threads_batch``: engine threads per replica (default: ``num_cpus``, at
    least 1). ``n_parallel``, ``n_ctx`` (0: the model's), ``n_batch``, ``n_ubatch``,
    ``kv_unified``, ``cache_type_k/v``, ``context_shift``, ``keep``, ``queue_size``,
    ``n_predict``, ``api_keys``, ``alias``, ``chat_template``, ``metrics``, ``slots``,
    ``timeout``, ``load_mode``: as ``pyllama serve``'s flags, per replica. ``sampling``:
    default :class:`~pyllama.sampling.SamplerParams` fields (``{"temp": 0.7}``).
    ``max_ongoing_requests``: the most requests Ray's router gives one replica at a time
    (default 2 * n_parallel; more wait in the router). ``num_replicas="auto"``: Ray Serve's
    default autoscaling. ``ray_actor_options``: more Ray actor options per replica (e.g.
    ``{"runtime_env": ...}``; its ``num_cpus`` wins over the argument).
    """
    from ..sampling import SamplerParams

    def positive(v, what, lo=1):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{what} must be an integer >= {lo}, got {v!r}")
        return v

    if num_replicas != "auto":
        positive(num_replicas, "num_replicas")
    if isinstance(num_cpus, bool) or not isinstance(num_cpus, (int, float)) or num_cpus < 0:
        raise ValueError(f"num_cpus must be a number >= 0, got {num_cpus!r}")
    n_parallel = positive(n_parallel, "n_parallel")
    positive(n_ctx, "n_ctx", 0)
    positive(n_batch, "n_batch")
    positive(n_ubatch, "n_ubatch", 0)
    positive(queue_size, "queue_size")
    threads = positive(threads, "threads", 0) if threads is not None else max(1, int(num_cpus))
    threads_batch = positive(threads_batch, "threads_batch", 0) if threads_batch is not None else threads
    if max_ongoing_requests is None:
        max_ongoing_requests = 2 * n_parallel
    positive(max_ongoing_requests, "max_ongoing_requests")
    if isinstance(api_keys, str):
        api_keys = [api_keys]
    keys = [k for k in (str(k).strip() for k in api_keys) if k]
    sampling = dict(sampling or {})
    if isinstance(sampling.get("seed"), int) and not isinstance(sampling["seed"], bool):
        sampling["seed"] = sampling["seed"] & 0xFFFFFFFF if sampling["seed"] >= 0 else 0xFFFFFFFF  # -1: random
    try:
        SamplerParams(**sampling)
    except TypeError as e:
        raise ValueError(f"sampling: {e}") from None
    if model is not None:
        model = str(model)
        if not Path(model).exists():  # may still exist on the nodes that run replicas
            log.warning("model %s is not on this machine: it must exist at that path on every node "
                        "that runs a replica", model)
    settings = dict(model=model, threads=threads, threads_batch=threads_batch, n_parallel=n_parallel, n_ctx=n_ctx,
                    n_batch=n_batch, n_ubatch=n_ubatch, kv_unified=bool(kv_unified), cache_type_k=cache_type_k,
                    cache_type_v=cache_type_v, context_shift=bool(context_shift), keep=keep,
                    queue_size=queue_size, n_predict=n_predict, api_keys=keys, alias=alias,
                    chat_template=chat_template, metrics=bool(metrics), slots=bool(slots), timeout=float(timeout),
                    load_mode=load_mode, sampling=sampling)

    serve = _serve()

    def build_asgi_app():  # run by Ray Serve in each replica, once, when it starts
        return _replica_app(settings)

    opts = {"num_cpus": num_cpus, **(ray_actor_options or {})}
    deployment = serve.deployment(serve.ingress(build_asgi_app)(_Replica), name=name, num_replicas=num_replicas,
                                  ray_actor_options=opts, max_ongoing_requests=max_ongoing_requests)
    return deployment.bind()


_ALIASES = {"m": "model", "np": "n_parallel", "parallel": "n_parallel", "c": "n_ctx", "ctx_size": "n_ctx",
            "t": "threads", "tb": "threads_batch", "b": "n_batch", "ub": "n_ubatch", "api_key": "api_keys",
            "a": "alias", "replicas": "num_replicas", "n": "n_predict"}
_INTS = {"threads", "threads_batch", "n_parallel", "n_ctx", "n_batch", "n_ubatch", "keep", "queue_size",
         "n_predict", "max_ongoing_requests"}
_FLOATS = {"num_cpus", "timeout"}
_BOOLS = {"kv_unified", "context_shift", "metrics", "slots"}
_STRS = {"model", "alias", "chat_template", "cache_type_k", "cache_type_v", "load_mode", "name"}


def _to_bool(key: str, v) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{key}: expected true or false, got {v!r}")


def _to_num(key: str, v, kind):
    if isinstance(v, bool):
        raise ValueError(f"{key}: expected a number, got {v!r}")
    if isinstance(v, (int, float)) and (kind is float or isinstance(v, int)):
        return kind(v)
    try:
        return kind(str(v).strip())
    except ValueError:
        raise ValueError(f"{key}: expected {'an integer' if kind is int else 'a number'}, got {v!r}") from None


def build_app(args: dict):
    """Application builder for ``serve run pyllama.server.ray:build_app key=value ...`` (or
    ``build_app({...})`` from Python): values may be strings; see :func:`app` for the keys."""
    import dataclasses

    from ..sampling import SamplerParams

    sampler_fields = {f.name: f for f in dataclasses.fields(SamplerParams)
                      if f.name not in ("no_perf", "samplers", "dry_sequence_breakers", "logit_bias")}
    kw: dict[str, Any] = {}
    sampling: dict[str, Any] = {}
    for key, v in dict(args or {}).items():
        key = _ALIASES.get(key.replace("-", "_"), key.replace("-", "_"))
        if key in _INTS:
            kw[key] = _to_num(key, v, int)
        elif key in _FLOATS:
            kw[key] = _to_num(key, v, float)
        elif key in _BOOLS:
            kw[key] = _to_bool(key, v)
        elif key in _STRS:
            kw[key] = None if v is None else str(v)
        elif key == "num_replicas":
            kw[key] = v if v == "auto" else _to_num(key, v, int)
        elif key == "api_keys":
            vals = v if isinstance(v, (list, tuple)) else str(v).split(",")
            kw.setdefault("api_keys", []).extend(k.strip() for k in vals if str(k).strip())
        elif key == "api_key_file":
            text = Path(v).read_text(encoding="utf-8")
            kw.setdefault("api_keys", []).extend(ln.strip() for ln in text.splitlines() if ln.strip())
        elif key == "chat_template_file":
            kw["chat_template"] = Path(v).read_text(encoding="utf-8")
        elif key in sampler_fields:
            kind = type(sampler_fields[key].default)
            sampling[key] = _to_num(key, v, int if kind is int else float)
        else:
            known = sorted(_INTS | _FLOATS | _BOOLS | _STRS | set(_ALIASES) | set(sampler_fields)
                           | {"num_replicas", "api_keys", "api_key_file", "chat_template_file"})
            raise ValueError(f"unknown argument {key!r}; known: {', '.join(known)}")
    if sampling:
        kw["sampling"] = sampling
    return app(**kw)
