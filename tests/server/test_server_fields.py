"""`pyllama serve` against llama-server's answers to its per-request fields n_indent,
t_max_predict_ms, post_sampling_probs, return_progress, timings_per_token and
n_cache_reuse (tests/data/server/fields_llama_server.json, made by
make_fields_reference.py there from llama-server 0c1e570 on SmolLM2): the same requests in
the same order give the same text, stop type, token counts, cached-token counts, progress
reports and post-sampling probabilities."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("starlette")

HERE = Path(__file__).parents[1] / "data" / "server"
REF = json.loads((HERE / "fields_llama_server.json").read_text())
_spec = importlib.util.spec_from_file_location("make_fields_reference", HERE / "make_fields_reference.py")
MK = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(MK)


@pytest.fixture(scope="module")
def fserver(smollm2_path):
    """Under llama.cpp's float order (PYLLAMA_ORDER=llamacpp), so greedy text follows
    llama-server's through near ties too."""
    import os

    from test_server import Server

    old = os.environ.get("PYLLAMA_ORDER")
    os.environ["PYLLAMA_ORDER"] = "llamacpp"
    try:
        s = Server(smollm2_path, *MK.SERVER_ARGS)
    finally:
        if old is None:
            del os.environ["PYLLAMA_ORDER"]
        else:
            os.environ["PYLLAMA_ORDER"] = old
    yield s
    s.close()


@pytest.fixture(scope="module")
def answers(fserver):
    return MK.run(fserver.url)


@pytest.mark.parametrize("name", list(REF["cases"]))
def test_field_matches_llama_server(answers, name):
    want, got = REF["cases"][name], answers[name]
    for k in want:
        assert got[k] == want[k], f"{name}: {k}"


@pytest.mark.parametrize("top_k, temp", [(4, 0.8), (3, 1.5)])
def test_post_sampling_probs(fserver, top_k, temp):
    """post_sampling_probs: each token's prob and top_probs are the sampler chain's final
    probabilities. With top-k alone (top_p 1, min_p 0), that is the softmax of the k best
    logits over the temperature: derived here from the same server's pre-sampling
    log-probabilities (cached prompt, same seed, so the same tokens are drawn)."""
    import math

    body = {"prompt": "My favourite colour is", "n_probs": 10, "temperature": temp, "top_k": top_k, "top_p": 1.0,
            "min_p": 0.0, "n_predict": 4, "seed": 7}
    post = fserver.http.post("/completion", json={**body, "post_sampling_probs": True}).json()
    pre = fserver.http.post("/completion", json=body).json()
    assert post["content"] == pre["content"]
    for a, b in zip(post["completion_probabilities"], pre["completion_probabilities"]):
        assert "logprob" not in a and "top_logprobs" not in a
        assert a["id"] == b["id"] and a["token"] == b["token"] and a["bytes"] == b["bytes"]
        best = b["top_logprobs"][:top_k]
        z = [lp["logprob"] / temp for lp in best]
        m = max(z)
        e = [math.exp(x - m) for x in z]
        want = [(lp["id"], x / sum(e)) for lp, x in zip(best, e)]
        got = [(t["id"], t["prob"]) for t in a["top_probs"]]
        assert [t for t, _ in got] == [t for t, _ in want]
        assert [p for _, p in got] == pytest.approx([p for _, p in want], rel=1e-4)
        assert a["prob"] == pytest.approx(dict(want)[a["id"]], rel=1e-4)
        assert sum(p for _, p in got) == pytest.approx(1.0, rel=1e-5)


def test_timings_per_token_and_progress_timings(fserver):
    """timings in every streamed token chunk (llama-server's timings_per_token) and in the
    progress chunks: the first before any prompt token (all zero), never going backwards."""
    r = fserver.http.post("/completion", json={"prompt": MK.STORY_A * 2, "n_predict": 4, "stream": True,
                                                "timings_per_token": True, "return_progress": True,
                                                "cache_prompt": False})
    chunks = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: ")]
    prog = [c for c in chunks if "prompt_progress" in c]
    assert len(prog) >= 3
    first = prog[0]["timings"]
    assert first["prompt_n"] == 0 and first["prompt_ms"] == 0.0 and first["predicted_n"] == 0
    last = 0.0
    for c in prog:
        assert c["timings"]["prompt_ms"] >= last
        last = c["timings"]["prompt_ms"]
    toks = [c for c in chunks if c.get("content")]
    assert toks and all("timings" in c for c in toks)
    assert [c["timings"]["predicted_n"] for c in toks] == sorted(c["timings"]["predicted_n"] for c in toks)


def test_chat_progress_and_ping(fserver):
    """Chat streams carry prompt_progress in a role delta; an SSE ping interval is accepted
    (the comment lines are not data)."""
    client = fserver.client()
    chunks = list(client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": MK.STORY_A}], max_tokens=3, stream=True,
        extra_body={"return_progress": True, "sse_ping_interval": 1, "cache_prompt": False}))
    prog = [c for c in chunks if getattr(c, "prompt_progress", None)]
    assert prog and prog[-1].prompt_progress["processed"] == prog[-1].prompt_progress["total"]


@pytest.mark.parametrize("body, msg", [
    ({"n_indent": -1}, "n_indent"),
    ({"t_max_predict_ms": "x"}, "t_max_predict_ms"),
    ({"post_sampling_probs": 1}, "post_sampling_probs"),
    ({"n_cache_reuse": -2}, "n_cache_reuse"),
    ({"backend_sampling": True}, "backend_sampling"),
    ({"n_cmpl": 0}, "n_cmpl"),
])
def test_bad_fields(fserver, body, msg):
    r = fserver.http.post("/completion", json={"prompt": "hi", "n_predict": 1, **body})
    assert r.status_code == 400 and msg in r.text


def test_n_cmpl(fserver):
    r = fserver.http.post("/completion", json={"prompt": "Hello", "n_predict": 3, "n_cmpl": 2, "seed": 3,
                                               "temperature": 1.0})
    assert r.status_code == 200
    d = r.json()
    assert isinstance(d, list) and [c["index"] for c in d] == [0, 1]


def test_prompt_objects(fserver):
    """llama-server's {"prompt_string": ...} prompt form, alone and in a list of prompts;
    multimodal data is refused (no image model here)."""
    tokens = fserver.http.post("/tokenize", json={"content": "I believe the meaning of life is",
                                                  "add_special": True}).json()["tokens"]
    base = {"n_predict": 6, "temperature": 0}
    one = fserver.http.post("/completion", json={**base, "prompt": {"prompt_string": "I believe the meaning of life is"}})
    assert one.status_code == 200, one.text
    two = fserver.http.post("/completion", json={**base, "prompt": [tokens, {"prompt_string": "I believe the "
                                                                                        "meaning of life is"}]})
    assert two.status_code == 200, two.text
    d = two.json()
    assert len(d) == 2 and d[0]["content"] == d[1]["content"] == one.json()["content"]
    mm = fserver.http.post("/completion", json={**base, "prompt": {"prompt_string": "x <__media__>",
                                                                  "multimodal_data": ["aGk="]}})
    assert mm.status_code == 400 and "multimodal" in mm.text.lower()
    assert fserver.http.post("/completion", json={**base, "prompt": []}).status_code == 400
    assert fserver.http.post("/completion", json={**base, "prompt": {"text": "x"}}).status_code == 400


def test_verbose(fserver):
    """llama-server's "verbose": an OpenAI-shaped answer also carries the native one, whose
    prompt is the rendered chat prompt."""
    msgs = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
    for verbose in (True, False):
        r = fserver.http.post("/v1/chat/completions", json={"max_tokens": 2, "messages": msgs, "verbose": verbose})
        assert r.status_code == 200
        d = r.json()
        if verbose:
            assert "Book" in d["__verbose"]["prompt"]
            assert d["__verbose"]["content"] == d["choices"][0]["message"]["content"]
        else:
            assert "__verbose" not in d
    r = fserver.http.post("/v1/completions", json={"max_tokens": 2, "prompt": "Hi", "verbose": True})
    assert r.json()["__verbose"]["tokens_predicted"] == 2


def test_server_stop_and_bias_defaults(fserver, smollm2_path):
    """-r and -l as llama-server's: a request without stop strings stops at the server's;
    one with its own does not; the server's logit bias applies unless the request gives
    its own logit_bias (even an empty one)."""
    from test_server import Server

    body = {"prompt": "The capital of France is", "n_predict": 12, "temperature": 0, "return_tokens": True}
    free = fserver.http.post("/completion", json=body).json()
    first, text = free["tokens"][0], free["content"]
    cut = text[len(text) // 2:][:2]
    assert cut.strip() and cut in text
    s = Server(smollm2_path, "-np", "1", "-c", "512", "-r", cut, "-l", f"{first}-inf")
    try:
        d = s.post("/completion", {**body, "logit_bias": []}).json()
        assert d["tokens"][0] == first  # the request's (empty) bias replaces the server's
        assert d["stop_type"] == "word" and d["stopping_word"] == cut and d["content"] == text[:text.index(cut)]
        d = s.post("/completion", {**body, "logit_bias": [], "stop": ["@@@"]}).json()
        assert d["content"] == text and d["stop_type"] == "limit"
        d = s.post("/completion", body).json()
        assert d["tokens"][0] != first
    finally:
        s.close()
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "pyllama", "serve", "-m", str(smollm2_path), "-l", "99999999+1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "vocabulary" in r.stderr
