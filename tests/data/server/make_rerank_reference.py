"""llama-server's /v1/rerank answers for the tiny bert and jina-bert-v2 rerankers of
tests/data/make_tiny_encoders.py (tests/server/test_server_rerank.py replays them against
``pyllama serve --reranking``).

    python make_rerank_reference.py [LLAMA_SERVER]

writes the tiny models to a temporary folder, starts llama-server (llama.cpp 0c1e570 from the
llama-cpp-python 0.3.36 sdist; default ~/.cache/pyllama/llama.cpp/build/bin/llama-server)
with ``--reranking -c 512 -b 512 -ub 512 -np 1 -fa off -t 2`` on each (-fa off: pyllama
encoders attend in f32, as llama.cpp without flash attention; its default casts K and V to
f16, about 1e-3 away), sends REQUESTS and writes
rerank_llama_server.json beside this file."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).parent
MODELS = ["bert-rank", "jina-bert-v2-rank"]
SERVER_ARGS = ["--reranking", "-c", "512", "-b", "512", "-ub", "512", "-np", "1", "-fa", "off"]
DOCS = ["the quick brown fox jumped over the lazy dog", "What is the capital of France? Paris!",
        "machine learning embeddings for sentence search", "a", "how are you? i am fine"]
REQUESTS = [
    ("/v1/rerank", {"query": "what is the capital of france", "documents": DOCS}),
    ("/v1/rerank", {"query": "hello world", "documents": DOCS, "top_n": 2}),
    ("/rerank", {"query": "a fox", "documents": DOCS[:3], "return_documents": True}),
    ("/v1/rerank", {"query": "search", "texts": DOCS[:4], "return_text": True}),  # TEI's shape
]


def tiny_encoders():
    spec = importlib.util.spec_from_file_location("make_tiny_encoders", HERE.parent / "make_tiny_encoders.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def post(url: str, body: dict):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def run(base: str) -> list:
    return [post(base + path, body) for path, body in REQUESTS]


def main() -> None:
    exe = sys.argv[1] if len(sys.argv) > 1 else str(Path.home() / ".cache/pyllama/llama.cpp/build/bin/llama-server")
    enc = tiny_encoders()
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for name in MODELS:
            path = enc.write(name, Path(d), "F32")
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            proc = subprocess.Popen([exe, "-m", str(path), "--port", str(port), "-t", "2", *SERVER_ARGS],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                for _ in range(100):
                    try:
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                        break
                    except OSError:
                        time.sleep(0.2)
                out[name] = run(f"http://127.0.0.1:{port}")
            finally:
                proc.terminate()
                proc.wait()
    dst = HERE / "rerank_llama_server.json"
    dst.write_text(json.dumps({"source": "llama-server (llama.cpp 0c1e570) " + " ".join(SERVER_ARGS),
                               "answers": out}, indent=1) + "\n")
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
