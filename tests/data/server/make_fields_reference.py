"""llama-server's answers to its per-request fields n_indent, t_max_predict_ms,
return_progress and n_cache_reuse, on SmolLM2-135M-Instruct Q4_1
(tests/server/test_server_fields.py replays the same requests against ``pyllama serve``).

Run llama-server (llama.cpp 0c1e570 from the llama-cpp-python 0.3.36 sdist) with
``-m SmolLM2-135M-Instruct.Q4_1.gguf -c 2048 -np 1 -b 32 -ub 32 -t 2`` on PORT, then
``python make_fields_reference.py PORT``: writes fields_llama_server.json beside this file.
The test starts ``pyllama serve`` with the same flags. ``run(url)`` is shared: it sends the
requests in order (some depend on the slot's cache from the one before) and keeps the
fields that are compared. The greedy texts were chosen where llama-server's AVX-512 build
and pyllama agree through every step (SmolLM2 Q4_1's logits differ by up to ~0.1 between
llama.cpp's AVX-512 and AVX2 builds, so a near tie can go either way)."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

SERVER_ARGS = ["-c", "2048", "-np", "1", "-b", "32", "-ub", "32"]

CODE = "def greet(name):\n    if name:"
LOOP = "for i in range(10):\n    if i % 2 == 0:"
STACK = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):"
STORY_A = "The quick brown fox jumps over the lazy dog. " * 4
STORY_B = "Once upon a time there was a princess who lived in a castle by the sea."
STORY_C = " Tell me what happened next."

# (name, path, body): run in this order on one server with one slot
CASES = [
    # the line after the if's body is indented by 4 < 8: it is cut after its indentation
    ("indent", "/completion", {"prompt": CODE, "n_indent": 8, "n_predict": 96, "temperature": 0,
                               "cache_prompt": False}),
    ("indent_loop", "/completion", {"prompt": LOOP, "n_indent": 8, "n_predict": 96, "temperature": 0,
                                    "cache_prompt": False}),
    # a blank line counts as a line indented by 0
    ("indent_blank", "/completion", {"prompt": STACK, "n_indent": 4, "n_predict": 96, "temperature": 0,
                                     "cache_prompt": False}),
    ("t_max_predict", "/completion", {"prompt": "A list of fruits:\n1.", "t_max_predict_ms": 1, "n_predict": 64,
                                      "temperature": 0, "cache_prompt": False}),
    ("progress", "/completion", {"prompt": STORY_A + STORY_B, "n_predict": 4, "temperature": 0, "stream": True,
                                 "return_progress": True}),
    ("progress_cached", "/completion", {"prompt": STORY_A + STORY_B + STORY_C, "n_predict": 4, "temperature": 0,
                                        "stream": True, "return_progress": True}),
    # the cached prompt has a sentence that the next one leaves out: the chunk after it is
    # reused by shifting its cells down (llama-server only skips over cached tokens)
    ("reuse_base", "/completion", {"prompt": STORY_A + "Here is another story. " + STORY_B + STORY_C, "n_predict": 1,
                                   "temperature": 0}),
    ("reuse", "/completion", {"prompt": STORY_A + STORY_B + STORY_C, "n_predict": 12, "temperature": 0,
                              "n_cache_reuse": 4}),
    ("no_reuse_base", "/completion", {"prompt": STORY_A + "Here is another story. " + STORY_B + STORY_C,
                                      "n_predict": 1, "temperature": 0}),
    ("no_reuse", "/completion", {"prompt": STORY_A + STORY_B + STORY_C, "n_predict": 12, "temperature": 0}),
]


def _post(url: str, body: dict):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        raw = r.read().decode()
    if not body.get("stream"):
        return json.loads(raw)
    return [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


def run(base: str) -> dict:
    out = {}
    for name, path, body in CASES:
        res = _post(base + path, body)
        if body.get("stream"):
            prog = [[c["prompt_progress"][k] for k in ("total", "cache", "processed")]
                    for c in res if "prompt_progress" in c]
            text = "".join(c.get("content", "") for c in res)
            out[name] = {"progress": prog, "content": text}
            continue
        rec = {"content": res["content"], "stop_type": res["stop_type"], "tokens_predicted": res["tokens_predicted"],
               "cache_n": res["timings"]["cache_n"], "tokens_evaluated": res["tokens_evaluated"]}
        out[name] = rec
    return out


def main(port: int) -> None:
    dst = Path(__file__).with_name("fields_llama_server.json")
    data = {"source": "llama-server (llama.cpp 0c1e570), SmolLM2-135M-Instruct Q4_1, " + " ".join(SERVER_ARGS),
            "cases": run(f"http://127.0.0.1:{port}")}
    dst.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {dst}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
