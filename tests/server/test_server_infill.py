"""`pyllama serve`'s /infill against llama-server's answers (tests/data/server/
infill_llama_server.json, made by make_infill_reference.py there from llama-server 0c1e570
on Qwen2.5-Coder-0.5B): the same prompt (FIM tokens, extra context cut as llama-server
cuts it), the same number of prompt tokens and the same greedy text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("starlette")

REF = json.loads((Path(__file__).parents[1] / "data" / "server" / "infill_llama_server.json").read_text())


@pytest.fixture(scope="module")
def qserver(qwen25_path):
    from test_server import Server

    s = Server(qwen25_path, "-np", "1", "-c", "2048")
    yield s
    s.close()


@pytest.mark.parametrize("case", REF["cases"], ids=lambda c: repr(c["request"]["input_prefix"])[:24])
def test_infill_matches_llama_server(qserver, case):
    r = qserver.post("/infill", case["request"])
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["prompt"] == case["prompt"]
    assert d["tokens_evaluated"] == case["tokens_evaluated"]
    assert d["content"] == case["content"]
    assert d["stop_type"] == case["stop_type"]


def test_infill_bad_requests(qserver):
    base = {"input_prefix": "a", "input_suffix": "b", "n_predict": 1}
    for body, what in [({"input_suffix": "b"}, '"input_prefix" is required'),
                       ({"input_prefix": "a"}, '"input_suffix" is required'),
                       ({**base, "prompt": 5}, '"prompt" must be a string'),
                       ({**base, "input_extra": {}}, '"input_extra" must be an array'),
                       ({**base, "input_extra": [{"filename": "x"}]}, 'must contain a "text" field'),
                       ({**base, "input_extra": [{"text": "x", "filename": 3}]}, '"filename" field must be a string'),
                       ({**base, "input_prefix": ["a", 10**9]}, "'input_prefix'[1]"),
                       ({**base, "n_indentt": 1}, "n_indentt")]:
        r = qserver.post("/infill", body)
        assert r.status_code == 400, (body, r.text)
        assert what in r.json()["error"]["message"], (what, r.text)


def test_infill_refused_without_fim_tokens(smollm2_path):
    from test_server import Server

    s = Server(smollm2_path, "-np", "1", "-c", "256")
    try:
        r = s.post("/infill", {"input_prefix": "a", "input_suffix": "b"})
        assert r.status_code == 501
        assert r.json()["error"]["message"] == ("Infill is not supported by this model: prefix token is missing. "
                                                "suffix token is missing. middle token is missing. ")
    finally:
        s.close()
