"""pyllama's server on Ray Serve (pyllama/server/ray.py): a local Ray cluster, two replicas of
SmolLM2 behind Ray Serve's HTTP proxy on 127.0.0.1, driven by the official `openai` client.

Every request must be answered through the proxy (streaming included, chunk by chunk), both
replicas must serve some (the x-pyllama-replica header says which), and a greedy answer must
be the in-process `Llama`'s, whichever replica gave it.

Ray binds its own gRPC servers (GCS, raylet, workers) to every interface and has no option to
keep them on loopback; the node address is 127.0.0.1, Ray's token authentication (on by
default) guards those ports, and the Serve proxy the test talks to listens on 127.0.0.1 only.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import socket
import sys
import time
import warnings

import pytest

ray = pytest.importorskip("ray")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
with warnings.catch_warnings():
    # Ray Serve's config models pass extra keywords to pydantic's Field (deprecated since
    # pydantic 2.0): warnings about Ray's code, raised once when ray.serve is imported
    warnings.filterwarnings("ignore", message="Using extra keyword arguments on `Field`",
                            category=DeprecationWarning, module=r"ray\.serve\.")
    serve = pytest.importorskip("ray.serve")

from pyllama.server import ray as pyllama_ray  # noqa: E402

KEY = "sk-ray-test-0123"
N_TOKENS = 24
PROMPTS = ["The capital of France is", "Once upon a time, there was a"]
CHATS = [[{"role": "user", "content": "Name three colors."}],
         [{"role": "user", "content": "What is 2 + 2?"}]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llm(smollm2_path):
    from pyllama import Llama

    return Llama(str(smollm2_path), n_ctx=1024, verbose=False, n_threads=2)


@pytest.fixture(scope="module")
def expected(llm):
    """Greedy answers of the in-process Llama, computed before Ray takes the CPUs."""
    comp = [llm.create_completion(p, max_tokens=N_TOKENS, temperature=0)["choices"][0]["text"] for p in PROMPTS]
    chat = [llm.create_chat_completion(m, max_tokens=N_TOKENS, temperature=0)["choices"][0]["message"]["content"]
            for m in CHATS]
    return {"comp": comp, "chat": chat}


@pytest.fixture(scope="module")
def cluster(smollm2_path, tmp_path_factory, expected):
    if ray.is_initialized():
        pytest.skip("a Ray session is already initialized in this process")
    env = {"RAY_USAGE_STATS_ENABLED": "0"}  # no usage report (the raylet and GCS inherit it)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    t0 = time.monotonic()
    port = _free_port()
    try:
        ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
                 _temp_dir=str(tmp_path_factory.mktemp("ray")))
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        serve.run(pyllama_ray.app(smollm2_path, num_replicas=2, num_cpus=1, threads=1, n_parallel=4, n_ctx=1024,
                                  api_keys=[KEY], alias="smol"),
                  name="pyllama", route_prefix="/")
        sys.stderr.write(f"\n[test_server_ray] Ray + 2 replicas up in {time.monotonic() - t0:.1f} s\n")
        yield f"http://127.0.0.1:{port}"
    finally:
        t1 = time.monotonic()
        try:
            if ray.is_initialized():
                serve.shutdown()
        finally:
            ray.shutdown()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        sys.stderr.write(f"[test_server_ray] shutdown in {time.monotonic() - t1:.1f} s\n")


def _client(url, key=KEY):
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


def _one(url, i):
    """Request i of 16: completion or chat, streamed or not, one of two inputs (each
    combination twice). Returns (kind, input, text, replica, content chunks)."""
    kind = ("comp", "chat")[i % 2]
    stream = (i // 2) % 2 == 1
    k = (i // 4) % 2
    c = _client(url)
    common = dict(model="smol", max_tokens=N_TOKENS, temperature=0)
    if kind == "comp":
        create = dict(prompt=PROMPTS[k], **common)
        api = c.completions
    else:
        create = dict(messages=CHATS[k], **common)
        api = c.chat.completions
    if not stream:
        raw = api.with_raw_response.create(**create)
        r = raw.parse()
        text = r.choices[0].text if kind == "comp" else r.choices[0].message.content
        return kind, k, text, raw.headers.get(pyllama_ray.REPLICA_HEADER), 1
    parts = []
    with api.with_streaming_response.create(stream=True, **create) as resp:
        replica = resp.headers.get(pyllama_ray.REPLICA_HEADER)
        for chunk in resp.parse():
            for ch in chunk.choices:
                piece = ch.text if kind == "comp" else ch.delta.content
                if piece:
                    parts.append(piece)
    return kind, k, "".join(parts), replica, len(parts)


def test_concurrent_requests_spread_over_replicas(cluster, expected):
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: _one(cluster, i), range(16)))
    sys.stderr.write(f"[test_server_ray] 16 requests in {time.monotonic() - t0:.1f} s\n")
    assert len(results) == 16
    for i, (kind, k, text, replica, n_parts) in enumerate(results):
        assert text == expected[kind][k], f"request {i} ({kind}, input {k}) on {replica}"
        assert replica and replica.startswith("pyllama#"), replica
        if (i // 2) % 2 == 1:
            assert n_parts > 5, f"request {i}: streamed in {n_parts} pieces"  # token by token, not buffered
    replicas = {r[3] for r in results}
    assert len(replicas) == 2, f"served by {replicas}"


def test_routes_and_auth_through_proxy(cluster):
    h = httpx.get(cluster + "/health", timeout=30)
    assert h.status_code == 200 and h.json() == {"status": "ok"}
    assert h.headers[pyllama_ray.REPLICA_HEADER].startswith("pyllama#")
    denied = httpx.get(cluster + "/v1/models", timeout=30)
    assert denied.status_code == 401
    assert denied.json()["error"]["type"] == "authentication_error"
    assert denied.headers[pyllama_ray.REPLICA_HEADER].startswith("pyllama#")
    with pytest.raises(openai.AuthenticationError):
        _client(cluster, key="wrong").models.list()
    assert [m.id for m in _client(cluster).models.list().data] == ["smol"]


# ------------------------------------------------------------------ without a running cluster


def test_build_app_arguments(smollm2_path):
    a = pyllama_ray.build_app({"model": str(smollm2_path), "num_replicas": "3", "num_cpus": "0.5", "np": "2",
                               "api_key": "a,b", "temp": "0.5", "seed": "-1", "metrics": "true"})
    d = a._bound_deployment  # Ray's Application keeps its ingress deployment here
    assert d.name == "pyllama"
    assert d.num_replicas == 3
    assert d.ray_actor_options["num_cpus"] == 0.5
    assert d.max_ongoing_requests == 4  # 2 x the slots
    with pytest.raises(ValueError, match="unknown argument 'n_slots'.*n_parallel"):
        pyllama_ray.build_app({"model": str(smollm2_path), "n_slots": "2"})
    with pytest.raises(ValueError, match="n_parallel: expected an integer"):
        pyllama_ray.build_app({"model": str(smollm2_path), "np": "four"})
    with pytest.raises(ValueError, match="metrics: expected true or false"):
        pyllama_ray.build_app({"model": str(smollm2_path), "metrics": "maybe"})
    with pytest.raises(ValueError, match="num_replicas must be an integer >= 1"):
        pyllama_ray.app(str(smollm2_path), num_replicas=0)


def test_missing_ray_says_what_to_install(monkeypatch, smollm2_path):
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.serve", None)
    with pytest.raises(ImportError, match=r"pip install 'ray\[serve\]'"):
        pyllama_ray.app(str(smollm2_path))


def test_health_check_reports_a_dead_engine(monkeypatch):
    class Engine:
        fatal = None

    class State:
        engine = Engine()

    monkeypatch.setattr(pyllama_ray, "_state", State())
    pyllama_ray._Replica().check_health()  # a running engine: healthy
    monkeypatch.setattr(Engine, "fatal", "RuntimeError: decode failed")
    with pytest.raises(RuntimeError, match="engine has stopped: RuntimeError: decode failed"):
        pyllama_ray._Replica().check_health()
