"""`pyllama serve` over real sockets on 127.0.0.1, driven by the official `openai` client
(and httpx for llama-server's own routes): the CLI is started as a child process with
SmolLM2, exactly as a user would start it.

Expected outputs come from pyllama's in-process `Llama` on the same model (itself held to
llama.cpp's logits and greedy continuations by test_llamacpp_exact / test_decode_greedy):
the server must give the same text, the same log-probabilities and the same tokens, whatever
else it is decoding at the time (batch invariance)."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

SLOW = os.environ.get("PYLLAMA_SLOW") == "1"
KEY = "sk-test-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model, *args):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "pyllama", "serve", "-m", str(model), "--port", str(self.port), "-t", "2",
               *map(str, args)]
        import tempfile

        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                out = self.log.read().decode(errors="replace")
                self.log.close()
                raise RuntimeError(f"server exited {self.proc.returncode}: {out}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                self.proc.kill()
                raise RuntimeError("server did not start in 120 s")
            time.sleep(0.2)
        self.http = httpx.Client(base_url=self.url, timeout=120)
        self._clients: dict = {}

    def client(self, key="none"):
        """One openai client per key, closed with the server (an unclosed one leaves its
        sockets to the garbage collector: a ResourceWarning, an error under pytest here)."""
        if key not in self._clients:
            self._clients[key] = openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120)
        return self._clients[key]

    def post(self, path, body, **kw):
        return self.http.post(path, json=body, **kw)

    def idle(self, timeout=10.0):
        """Wait until no slot is busy and nothing waits; the /slots list."""
        deadline = time.time() + timeout
        while True:
            slots = self.http.get("/slots").json()
            if not any(s["is_processing"] for s in slots) or time.time() > deadline:
                return slots
            time.sleep(0.05)

    def close(self):
        for c in self._clients.values():
            c.close()
        self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def server(smollm2_path):
    s = Server(smollm2_path, "-np", 4, "-c", 4096, "--metrics", "--queue-size", 256, "-n", 64)
    yield s
    s.close()


@pytest.fixture(scope="module")
def llm(smollm2_path):
    from pyllama import Llama

    return Llama(str(smollm2_path), n_ctx=1024, logits_all=True, verbose=False, n_threads=2)


PROMPT = "The capital of France is"
MSGS = [{"role": "user", "content": "Name three colors."}]


# ------------------------------------------------------------------------------ basics


def test_health_and_models(server):
    assert server.http.get("/health").json() == {"status": "ok"}
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]


def test_completion_greedy_matches_llama(server, llm):
    want = llm.create_completion(PROMPT, max_tokens=24, temperature=0)
    got = server.client().completions.create(model="x", prompt=PROMPT, max_tokens=24, temperature=0)
    assert got.choices[0].text == want["choices"][0]["text"]
    assert got.choices[0].finish_reason == "length"
    assert got.usage.prompt_tokens == want["usage"]["prompt_tokens"]
    assert got.usage.completion_tokens == 24


def test_chat_greedy_matches_llama_and_stream(server, llm):
    want = llm.create_chat_completion(MSGS, max_tokens=40, temperature=0)["choices"][0]["message"]["content"]
    c = server.client()
    got = c.chat.completions.create(model="x", messages=MSGS, max_tokens=40, temperature=0)
    assert got.choices[0].message.content == want
    assert got.choices[0].message.role == "assistant"
    parts, usage, finish = [], None, None
    for chunk in c.chat.completions.create(model="x", messages=MSGS, max_tokens=40, temperature=0, stream=True,
                                           stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.content:
                parts.append(ch.delta.content)
            finish = ch.finish_reason or finish
    assert len(parts) > 5  # streamed token by token, not in one piece
    assert "".join(parts) == want
    assert usage.completion_tokens == got.usage.completion_tokens
    assert finish == got.choices[0].finish_reason


def test_stop_strings(server, llm):
    full = llm.create_completion(PROMPT, max_tokens=24, temperature=0)["choices"][0]["text"]
    stop = full[8:11]
    assert stop and stop in full
    got = server.client().completions.create(model="x", prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop])
    assert got.choices[0].text == full[:full.index(stop)]
    assert got.choices[0].finish_reason == "stop"
    parts = [ch.choices[0].text for ch in server.client().completions.create(
        model="x", prompt=PROMPT, max_tokens=24, temperature=0, stop=stop, stream=True) if ch.choices]
    assert "".join(parts) == full[:full.index(stop)]


def test_seed_reproducible_and_n_choices(server):
    c = server.client()

    def sample(seed, **kw):
        return c.completions.create(model="x", prompt="Once upon a time", max_tokens=20, temperature=1.0,
                                    top_p=1.0, seed=seed, extra_body={"top_k": 0, "min_p": 0.0}, **kw)

    assert sample(1234).choices[0].text == sample(1234).choices[0].text
    assert len({sample(s).choices[0].text for s in range(5)}) > 1  # the seed does something
    three = sample(7, n=3)
    assert sorted(ch.index for ch in three.choices) == [0, 1, 2]
    # choice j samples with seed + j: choice 1 of seed 7 is choice 0 of seed 8
    assert three.choices[1].text == sample(8).choices[0].text
    assert three.usage.completion_tokens == sum(sample(7 + j).usage.completion_tokens for j in range(3))


def test_logprobs_match_llama(server, llm):
    want = llm.create_completion(PROMPT, max_tokens=6, temperature=0, logprobs=3)["choices"][0]["logprobs"]
    got = server.client().completions.create(model="x", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3)
    lp = got.choices[0].logprobs
    assert lp.tokens == want["tokens"]
    np.testing.assert_allclose(lp.token_logprobs, want["token_logprobs"], rtol=0, atol=1e-5)
    for g, w in zip(lp.top_logprobs, want["top_logprobs"]):
        assert len(g) == 3
        for k, v in g.items():
            assert abs(v - w[k]) < 1e-5
    chat = server.client().chat.completions.create(model="x", messages=MSGS, max_tokens=5, temperature=0,
                                                   logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 2
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
        assert t.token == t.top_logprobs[0].token  # greedy: the chosen token is the most likely
    assert "".join(t.token for t in content) == chat.choices[0].message.content


def test_json_response_format(server):
    c = server.client()
    from pyllama.grammar import Grammar
    from pyllama.llama_grammar import JSON_GBNF

    # SmolLM2-135M nests JSON objects without end: the reply stops at max_tokens, and must be
    # a prefix of a JSON object (the unconstrained reply is prose)
    r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "Give the color of the sky as JSON."}],
                                  max_tokens=60, temperature=0, response_format={"type": "json_object"})
    text = r.choices[0].message.content
    assert text.startswith("{")
    m = Grammar.from_string(JSON_GBNF).matcher()
    m.accept_string(text)
    assert not m.failed
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 30}},
              "required": ["name", "age"], "additionalProperties": False}
    r = c.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Describe a cat as JSON."}], max_tokens=100,
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "cat", "schema": schema}})
    obj = json.loads(r.choices[0].message.content)
    assert set(obj) == {"name", "age"} and isinstance(obj["age"], int) and 0 <= obj["age"] <= 30
    r = server.post("/completion", {"prompt": "List: ", "n_predict": 30, "temperature": 0,
                                    "grammar": 'root ::= "yes" | "no"'}).json()
    assert r["content"] in ("yes", "no") and r["stop_type"] == "eos"


# ---------------------------------------------------------------------------- llama-server


def test_native_routes(server, smollm2_path):
    from pyllama import Model
    from pyllama.chat import ChatFormat
    from pyllama.generation import vocab_of

    m = Model.load(smollm2_path)
    v = vocab_of(m)
    toks = server.post("/tokenize", {"content": "Hello world"}).json()["tokens"]
    assert toks == list(v.tokenize("Hello world", add_special=False, parse_special=True))
    pieces = server.post("/tokenize", {"content": "Hello", "with_pieces": True}).json()["tokens"]
    assert pieces == [{"id": t, "piece": v.token_to_piece(t, True).decode()} for t in v.tokenize("Hello", add_special=False)]
    assert server.post("/detokenize", {"tokens": toks}).json() == {"content": "Hello world"}
    assert server.post("/apply-template", {"messages": MSGS}).json()["prompt"] == ChatFormat(m, v).render(MSGS)
    props = server.http.get("/props").json()
    assert props["total_slots"] == 4 and props["default_generation_settings"]["n_ctx"] == 1024  # -np 4: 4096 / 4
    r = server.post("/completion", {"prompt": PROMPT, "n_predict": 5, "temperature": 0, "n_probs": 2}).json()
    assert r["stop"] is True and r["tokens_predicted"] == 5 and r["stop_type"] == "limit"
    assert len(r["completion_probabilities"]) == 5
    assert all(len(p["top_logprobs"]) == 2 for p in r["completion_probabilities"])
    text = server.http.get("/metrics").text
    assert "llamacpp:prompt_tokens_total" in text and "llamacpp:tokens_predicted_total" in text


def test_prompt_cache_reused(server):
    long = "Tell me a story about a dragon and a knight who became friends. " * 4
    a = server.post("/completion", {"prompt": long, "n_predict": 4, "temperature": 0}).json()
    b = server.post("/completion", {"prompt": long + "It began", "n_predict": 4, "temperature": 0}).json()
    assert b["timings"]["cache_n"] >= a["tokens_evaluated"] - 1
    assert b["timings"]["prompt_n"] <= 4


# ------------------------------------------------------------------------------- errors


def test_error_shapes(server):
    c = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="x", prompt="word " * 5000, max_tokens=4)
    assert "5001" in str(e.value) or "tokens" in str(e.value)
    assert e.value.status_code == 400
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="x", prompt="hi", max_tokens=4, extra_body={"temprature": 0.5})
    assert "temprature" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="x", messages=[], max_tokens=4)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="x", messages=MSGS, tools=[{"type": "function", "function": {"name": "f"}}],
                                  tool_choice={"type": "function", "function": {"name": "g"}})
    assert "names no function" in str(e.value)
    r = server.http.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = server.http.get("/no/such/route")
    assert r.status_code == 404 and "error" in r.json()
    r = server.post("/v1/embeddings", {"input": "x"})  # a generation server: start with --embedding
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
    assert "--embeddings" in r.json()["error"]["message"]
    r = server.post("/completion", {"prompt": [1, 2, 10**9]})
    assert r.status_code == 400 and "10000000" in r.json()["error"]["message"]


def test_auth(smollm2_path):
    s = Server(smollm2_path, "-np", 1, "-c", 512, "--api-key", KEY)
    try:
        assert s.http.get("/health").status_code == 200
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        r = s.post("/completion", {"prompt": "hi", "n_predict": 1})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert s.client(KEY).completions.create(model="x", prompt="hi", max_tokens=2).usage.completion_tokens >= 1
        r = s.post("/completion", {"prompt": "hi", "n_predict": 1}, headers={"X-Api-Key": KEY})
        assert r.status_code == 200
    finally:
        s.close()


# ------------------------------------------------------------------ batching and the load


def test_batch_invariance(server):
    """A seeded request gives byte-identical output alone and beside seven others, whatever
    the arrival order (llama-server does not promise this)."""
    def req(i, seed):
        return server.client().chat.completions.create(
            model="x", messages=[{"role": "user", "content": f"Write a short poem number {i}."}],
            max_tokens=32, temperature=0.9, seed=seed).choices[0].message.content

    alone = req(0, 42)
    for order in range(2):
        with cf.ThreadPoolExecutor(8) as ex:
            futs = {}
            ids = list(range(1, 8))
            if order:
                ids.reverse()
            for i in ids[:3]:
                futs[ex.submit(req, i, 100 + i)] = i
            futs[ex.submit(req, 0, 42)] = 0
            for i in ids[3:]:
                futs[ex.submit(req, i, 100 + i)] = i
            results = {futs[f]: f.result() for f in futs}
        assert results[0] == alone
    m = server.http.get("/metrics").text
    busy = float(next(ln.split()[1] for ln in m.splitlines() if ln.startswith("llamacpp:n_busy_slots_per_decode")))
    assert busy > 1.0  # requests really were decoded together


def test_load_mixed_streaming(server):
    n_req = 200 if SLOW else 40

    def one(i):
        c = server.client()
        if i % 2:
            text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
                model="x", messages=[{"role": "user", "content": f"Count to {i % 7 + 2}."}], max_tokens=8 + i % 9,
                temperature=0.5, seed=i, stream=True) if ch.choices)
            return text
        return c.completions.create(model="x", prompt=f"Item {i}:", max_tokens=8 + i % 9, temperature=0.5,
                                    seed=i).choices[0].text

    with cf.ThreadPoolExecutor(8) as ex:
        out = list(ex.map(one, range(n_req)))
    assert len(out) == n_req and all(isinstance(t, str) for t in out)
    slots = server.idle()
    assert not any(s["is_processing"] for s in slots)


def test_client_disconnect_frees_slot(server):
    with server.http.stream("POST", "/completion", json={"prompt": "Tell me everything.", "n_predict": 3000,
                                                          "ignore_eos": True, "stream": True}) as r:
        n = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                n += 1
            if n >= 3:
                break
    slots = server.idle(timeout=10)
    assert not any(s["is_processing"] for s in slots)
    assert all(s["n_past"] < 900 for s in slots)  # it stopped well before filling its 1024 cells


def test_a_failing_sampler_fails_only_its_request(server):
    """A grammar with no way on after "a" (a class that matches nothing): that request gets
    an error, the others in flight and after it are served."""
    with cf.ThreadPoolExecutor(3) as ex:
        bad = ex.submit(server.post, "/completion", {"prompt": "x", "n_predict": 8,
                                                      "grammar": 'root ::= "a" [^\\x00-\\U0010FFFF]'})
        good = [ex.submit(server.post, "/completion", {"prompt": "Hello", "n_predict": 8, "temperature": 0})
                for _ in range(2)]
        r = bad.result()
        assert r.status_code == 500 and "grammar" in r.json()["error"]["message"].lower(), r.text
        assert all(g.result().status_code == 200 for g in good)
    assert server.post("/completion", {"prompt": "Hi", "n_predict": 2}).status_code == 200


def test_client_timeout_cancels_non_streaming(server):
    """A client that gives up on a non-streaming request (closes the connection) frees the
    slot instead of leaving it generating 3000 tokens for nobody."""
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/completion", json={"prompt": "Write forever.", "n_predict": 3000,
                                                     "ignore_eos": True}, timeout=1.0)
    slots = server.idle(timeout=10)
    assert not any(s["is_processing"] for s in slots)
    # a slot holds 1024 cells: without the cancel, generation would have run on to fill it
    assert all(s["n_past"] < 900 for s in slots)


def test_queue_full_is_503(smollm2_path):
    s = Server(smollm2_path, "-np", 1, "-c", 2048, "--queue-size", 1)
    try:
        body = {"prompt": "Go:", "n_predict": 400, "ignore_eos": True}
        with cf.ThreadPoolExecutor(4) as ex:
            first = ex.submit(lambda: s.post("/completion", body).status_code)
            # once the one slot is busy, the queue (1) takes one more request and refuses the rest
            deadline = time.time() + 60
            while not any(x["is_processing"] for x in s.http.get("/slots").json()):
                assert time.time() < deadline, "the first request never started"
                time.sleep(0.05)
            rest = [ex.submit(lambda: s.post("/completion", body).status_code) for _ in range(3)]
            codes = sorted([first.result()] + [f.result() for f in rest])
        assert codes == [200, 200, 503, 503], codes
        r = s.post("/completion", {"prompt": "Go:", "n_predict": 2})
        assert r.status_code == 200
    finally:
        s.close()


def test_malformed_bodies(server):
    """Random bodies on every generation route: each is answered 4xx (never 5xx or a hang),
    and the server keeps serving."""
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    json_val = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
                            | st.text(max_size=20), lambda c: st.lists(c, max_size=4)
                            | st.dictionaries(st.text(max_size=10), c, max_size=4), max_leaves=10)
    fields = st.sampled_from(["prompt", "messages", "max_tokens", "n_predict", "temperature", "top_k", "stop",
                              "seed", "logit_bias", "n", "logprobs", "top_logprobs", "grammar", "json_schema",
                              "response_format", "stream", "tokens", "content", "n_probs", "samplers", "x"])
    bodies = st.one_of(st.binary(max_size=40), json_val.map(lambda v: json.dumps(v).encode()),
                       st.dictionaries(fields, json_val, max_size=5).map(lambda d: json.dumps(d).encode()))
    routes = st.sampled_from(["/v1/completions", "/v1/chat/completions", "/completion", "/tokenize",
                              "/detokenize", "/apply-template"])

    @settings(max_examples=500 if SLOW else 120, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(routes, bodies)
    def check(route, body):
        r = server.http.post(route, content=body, headers={"content-type": "application/json"})
        assert r.status_code < 500, (route, body, r.status_code, r.text)
        if r.status_code >= 400:
            assert "error" in r.json()

    check()
    assert server.client().completions.create(model="x", prompt="hi", max_tokens=2).choices[0].text is not None
    server.idle()


def test_logit_bias(server):
    toks = server.post("/tokenize", {"content": " banana"}).json()["tokens"]
    assert len(toks) == 1
    r = server.client().completions.create(model="x", prompt=PROMPT, max_tokens=3, temperature=0,
                                           logit_bias={str(toks[0]): 100})
    assert r.choices[0].text == " banana" * 3
    # llama-server's form: [text, bias] pairs; false bans a token
    want = server.post("/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0,
                                       "return_tokens": True}).json()
    first = want["tokens"][0]
    r = server.post("/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0, "return_tokens": True,
                                    "logit_bias": [[first, False]]}).json()
    assert r["tokens"][0] != first
    assert {"token": first, "bias": None} in r["generation_settings"]["logit_bias"]


def test_context_full_and_context_shift(smollm2_path):
    s = Server(smollm2_path, "-np", 1, "-c", 256)
    try:
        r = s.post("/completion", {"prompt": "Go:", "n_predict": 400, "ignore_eos": True}).json()
        # prompt + generated tokens fill the slot (llama-server's rule), and it says so
        assert r["tokens_predicted"] + r["tokens_evaluated"] == 256 and r["stop_type"] == "limit"
        assert r["truncated"] is True
        r = s.client().completions.create(model="x", prompt="Go:", max_tokens=400, extra_body={"ignore_eos": True})
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 256 - r.usage.prompt_tokens
    finally:
        s.close()
    s = Server(smollm2_path, "-np", 1, "-c", 256, "--context-shift", "--keep", 4)
    try:
        r = s.post("/completion", {"prompt": "Go:", "n_predict": 400, "ignore_eos": True}).json()
        assert r["tokens_predicted"] == 400 and r["truncated"] is True
        slots = s.idle()
        assert slots[0]["n_past"] <= 256
    finally:
        s.close()


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _check_call(call):
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    assert set(args) == {"city"} and isinstance(args["city"], str)


def test_tool_calls_generic_format(server):
    """SmolLM2's template knows no tools: llama.cpp's generic format (a system message and a
    JSON reply constrained by a grammar)."""
    c = server.client()
    r = c.chat.completions.create(model="x", messages=ASK, tools=WEATHER, tool_choice="required", max_tokens=80,
                                  temperature=0)
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.content is None
    _check_call(r.choices[0].message.tool_calls[0])
    deltas = [ch.choices[0].delta for ch in c.chat.completions.create(
        model="x", messages=ASK, tools=WEATHER, tool_choice="required", max_tokens=80, temperature=0, stream=True)
        if ch.choices]
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.arguments == r.choices[0].message.tool_calls[0].function.arguments
    # auto: either a call or a reply, never the JSON wrapper as text
    r = c.chat.completions.create(model="x", messages=ASK, tools=WEATHER, max_tokens=120, temperature=0)
    m = r.choices[0].message
    if m.tool_calls:
        _check_call(m.tool_calls[0])
    else:
        assert m.content and not m.content.lstrip().startswith('{"response"')
    # the call's result goes back in and the conversation continues
    call = r.choices[0].message.tool_calls[0] if m.tool_calls else None
    if call is not None:
        follow = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
        r2 = c.chat.completions.create(model="x", messages=follow, tools=WEATHER, max_tokens=60, temperature=0)
        assert r2.choices[0].message.content or r2.choices[0].message.tool_calls


def test_tool_calls_hermes_format(qwen25_path):
    """Qwen 2.5's template prints <tool_call> blocks: the tools go to the template, the reply
    is constrained to <tool_call> JSON blocks and parsed back."""
    s = Server(qwen25_path, "-np", 1, "-c", 2048)
    try:
        props = s.http.get("/props").json()
        assert "<tool_call>" in props["chat_template"]
        prompt = s.post("/apply-template", {"messages": ASK}).json()["prompt"]
        assert "get_weather" not in prompt
        r = s.client().chat.completions.create(model="x", messages=ASK, tools=WEATHER, tool_choice="required",
                                               max_tokens=60, temperature=0)
        assert r.choices[0].finish_reason == "tool_calls"
        _check_call(r.choices[0].message.tool_calls[0])
    finally:
        s.close()


def test_embeddings_server(smollm2_path):
    """--embedding --pooling mean: /v1/embeddings through the openai client (which asks for
    base64) equals Llama(embedding=True).embed(normalize=True); an input's vector does not
    depend on what else is in the request; completions are refused on this server."""
    from pyllama import Llama

    s = Server(smollm2_path, "--embedding", "--pooling", "mean", "-np", 4, "-c", 2048)
    try:
        texts = ["The cat sat on the mat.", "Stock markets fell today.", "A kitten rests on a rug."]
        r = s.client().embeddings.create(model="x", input=texts)
        got = np.array([d.embedding for d in r.data], dtype=np.float32)
        llm = Llama(str(smollm2_path), embedding=True, pooling_type=1, n_ctx=512, verbose=False, n_threads=2)
        want = np.array(llm.embed(texts, normalize=True), dtype=np.float32)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
        assert r.usage.prompt_tokens == sum(len(llm.tokenize(t.encode())) for t in texts)
        sims = got @ got.T
        assert sims[0, 2] > sims[0, 1]  # the two cat sentences are closer
        alone = s.client().embeddings.create(model="x", input=texts[1], encoding_format="float").data[0].embedding
        assert np.array_equal(np.asarray(alone, dtype=np.float32), got[1])
        native = s.post("/embedding", {"content": texts[0], "embd_normalize": -1}).json()
        raw = np.asarray(native[0]["embedding"][0], dtype=np.float32)
        np.testing.assert_allclose(raw / np.linalg.norm(raw), got[0], atol=2e-6)
        r = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 501 and "embeddings" in r.json()["error"]["message"]
    finally:
        s.close()


def test_llama_server_compat_details(server, smollm2_path):
    """Shapes llama-server's own suite checks: prefill of a final assistant message, two
    assistant messages refused, CORS preflight without a key, /props from the flags, the
    metrics header, the context error's fields."""
    msgs = [{"role": "user", "content": "Say a name."}, {"role": "assistant", "content": "Whill"}]
    p = server.post("/apply-template", {"messages": msgs}).json()["prompt"]
    assert p.endswith("<|im_start|>assistant\nWhill")
    r = server.post("/v1/chat/completions", {"messages": msgs + [{"role": "assistant", "content": "x"}]})
    assert r.status_code == 400 and "2 or more assistant" in r.json()["error"]["message"]
    r = server.http.options("/v1/completions", headers={"Origin": "http://example.org",
                                                         "Access-Control-Request-Method": "POST"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://example.org"
    assert server.http.get("/metrics").headers["process-start-time-unix"].isdigit()
    r = server.post("/completion", {"prompt": "word " * 2000})
    e = r.json()["error"]
    assert r.status_code == 400 and e["type"] == "exceed_context_size_error"
    assert e["n_ctx"] == 1024 and e["n_prompt_tokens"] > 1024 and "exceeds the available context size" in e["message"]
    r = server.post("/completion", {"prompt": PROMPT, "n_predict": 3, "response_fields": ["content",
                                                                                          "generation_settings/n_predict"]})
    assert set(r.json()) == {"content", "generation_settings/n_predict"} and r.json()["generation_settings/n_predict"] == 3


def test_no_jinja_and_server_defaults(smollm2_path):
    s = Server(smollm2_path, "-np", 1, "-c", 512, "--no-jinja", "--seed", 42, "--temp", 0.5)
    try:
        props = s.http.get("/props").json()
        assert props["chat_template"] == "chatml" and props["default_generation_settings"]["params"]["seed"] == 42
        assert props["default_generation_settings"]["params"]["temperature"] == 0.5
        p = s.post("/apply-template", {"messages": MSGS}).json()["prompt"]
        assert p == "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n"
        r = s.post("/chat/completions", {"messages": MSGS, "chat_template_kwargs": {"x": 1}})
        assert r.status_code == 400 and "Jinja" in r.json()["error"]["message"]
    finally:
        s.close()


def test_id_slot_and_input_tokens(server):
    """id_slot pins a request to a slot (two choices pinned to slot 0 run one after the other,
    without locking the scheduler); /chat/completions/input_tokens counts a chat prompt."""
    r = server.post("/v1/chat/completions", {"messages": MSGS, "max_tokens": 4, "n": 2, "id_slot": 0})
    assert r.status_code == 200 and len(r.json()["choices"]) == 2
    r = server.post("/completion", {"prompt": PROMPT, "n_predict": 2, "id_slot": 3})
    assert r.json()["id_slot"] == 3
    r = server.post("/completion", {"prompt": PROMPT, "n_predict": 2, "id_slot": 9})
    assert r.status_code == 400 and "id_slot 9" in r.json()["error"]["message"]
    n = server.post("/chat/completions/input_tokens", {"messages": MSGS}).json()["input_tokens"]
    assert n == server.client().chat.completions.create(model="x", messages=MSGS, max_tokens=1).usage.prompt_tokens
