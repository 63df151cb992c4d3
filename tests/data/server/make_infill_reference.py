"""llama-server's /infill answers for Qwen2.5-Coder-0.5B-Instruct Q4_K_M (tests/server/test_server_infill.py).

Run llama-server (llama.cpp 0c1e570 from the llama-cpp-python 0.3.36 sdist) with
``-m qwen2.5-coder-0.5b-instruct-q4_k_m.gguf -c 2048 -np 1 -t 2`` on PORT, then
``python make_infill_reference.py PORT``: writes infill_llama_server.json beside this file
(the request, and the answer's prompt text, prompt token count, content and stop type)."""

import json
import sys
from pathlib import Path

import urllib.request

CASES = [
    {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n\nprint(add(2, 3))\n", "n_predict": 16,
     "temperature": 0},
    {"input_prefix": "def fib(n):\n", "input_suffix": "    return fib(n - 1) + fib(n - 2)\n", "prompt": "    if",
     "n_predict": 12, "temperature": 0},
    {"input_prefix": "from utils import square\n\nx = ", "input_suffix": "\nprint(x)\n", "n_predict": 8,
     "temperature": 0,
     "input_extra": [{"filename": "utils.py", "text": "def square(x):\n    return x * x\n"},
                     {"text": "PI = 3.14159\n"}]},
    {"input_prefix": ["import os\n", "path = "], "input_suffix": "\n", "n_predict": 8, "temperature": 0},
]


def main(port: int) -> None:
    out = []
    for body in CASES:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/infill", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        r = json.loads(urllib.request.urlopen(req).read())
        out.append({"request": body, "prompt": r["prompt"], "tokens_evaluated": r["tokens_evaluated"],
                    "content": r["content"], "stop_type": r["stop_type"]})
    dst = Path(__file__).with_name("infill_llama_server.json")
    dst.write_text(json.dumps({"source": "llama-server (llama.cpp 0c1e570), Qwen2.5-Coder-0.5B-Instruct Q4_K_M, "
                                         "-c 2048 -np 1", "cases": out}, indent=1) + "\n")
    print(f"wrote {dst}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
