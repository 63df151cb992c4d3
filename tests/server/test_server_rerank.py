"""`pyllama serve --reranking`'s /v1/rerank (and /rerank, TEI's "texts" shape) against
llama-server's answers for the same tiny random-weight rerankers (bert with a bge-style
classifier head, jina-bert-v2 with a single-output head), recorded by
tests/data/server/make_rerank_reference.py: the same order, the same scores (rel 1e-4),
the same usage counts; and the server's scores equal Llama.rerank's."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("gguf")

HERE = Path(__file__).parents[1] / "data" / "server"
REF = json.loads((HERE / "rerank_llama_server.json").read_text())
_spec = importlib.util.spec_from_file_location("make_rerank_reference", HERE / "make_rerank_reference.py")
MK = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(MK)


@pytest.fixture(scope="module", params=MK.MODELS)
def rserver(request, tmp_path_factory):
    from test_server import Server

    path = MK.tiny_encoders().write(request.param, tmp_path_factory.mktemp("rerank"), "F32")
    s = Server(path, *MK.SERVER_ARGS)
    s.model_path = path
    s.name = request.param
    yield s
    s.close()


def _results(ans):
    return ans if isinstance(ans, list) else ans["results"]


def test_rerank_matches_llama_server(rserver):
    got = MK.run(rserver.url)
    for (path, body), g, w in zip(MK.REQUESTS, got, REF["answers"][rserver.name]):
        gr, wr = _results(g), _results(w)
        assert [r["index"] for r in gr] == [r["index"] for r in wr], (path, body)
        key = "score" if "texts" in body else "relevance_score"
        assert [r[key] for r in gr] == pytest.approx([r[key] for r in wr], rel=1e-4)
        if isinstance(w, dict):
            assert g["usage"] == w["usage"] and g["object"] == "list"
        if body.get("return_text"):
            assert [r["text"] for r in gr] == [r["text"] for r in wr]
        if body.get("return_documents"):  # Cohere's field (llama-server leaves it out)
            assert [r["document"]["text"] for r in gr] == [body["documents"][r["index"]] for r in gr]


def test_rerank_equals_llama_rerank(rserver):
    from pyllama import Llama

    llm = Llama(str(rserver.model_path), embedding=True, n_ctx=512, n_batch=512, n_ubatch=512, verbose=False)
    q, docs = "what is the capital of france", MK.DOCS
    want = llm.rerank(q, docs)
    res = rserver.post("/v1/rerank", {"query": q, "documents": docs}).json()["results"]
    got = {r["index"]: r["relevance_score"] for r in res}
    assert sorted(got) == list(range(len(want)))
    # the same scores up to float order: encoder attention sums over the whole micro-batch in
    # llama.cpp's order (models/encoder.rs), so a sequence's last bits depend on where it sits
    # in the batch, and the server batches the documents otherwise (measured 3.6e-7)
    assert [got[i] for i in range(len(want))] == pytest.approx(want, rel=0, abs=2e-6)


@pytest.mark.parametrize("body, msg", [
    ({"documents": ["a"]}, "query"),
    ({"query": 3, "documents": ["a"]}, "query"),
    ({"query": "q", "documents": []}, "documents"),
    ({"query": "q", "documents": [1]}, "documents"),
    ({"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
    ({"query": "q", "documents": ["a"], "bogus": 1}, "bogus"),
])
def test_rerank_bad_requests(rserver, body, msg):
    r = rserver.post("/v1/rerank", body)
    assert r.status_code == 400 and msg in r.text


def test_rerank_needs_reranking_server(smollm2_path):
    from test_server import Server

    s = Server(smollm2_path, "-np", "1", "-c", "256")
    try:
        r = s.post("/v1/rerank", {"query": "q", "documents": ["a"]})
        assert r.status_code == 501 and "--reranking" in r.text
    finally:
        s.close()
