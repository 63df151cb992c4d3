#!/usr/bin/env python3
"""Serve the same model with llama.cpp's llama-server and with `pyllama serve`, load each
with the same concurrent streaming clients, and print pyllama / llama-server per level.

Both servers get the same settings: -np 8 slots, -c 8*1024 (1024 tokens per slot), -t 2,
-tb 2, --seed 42, on a free 127.0.0.1 port. Only one server runs at a time; each
(round, model, concurrency) level starts a fresh server, sends one warm-up request, runs the
level and stops it, and the two servers take turns going first, so that drift on the
machine affects both.

A level with concurrency K runs K client threads; each sends --requests-per-client
streaming POST /v1/completions requests one after the other: the same ~100-token prompt
with a per-request suffix (so prompts differ; both servers reuse the common prefix from a
slot's cache), max_tokens N, temperature 0, "ignore_eos": true (so every request generates
exactly N tokens). Measured:

- tok/s: generated tokens of the level (the servers' usage.completion_tokens) over the
  level's wall time (first request sent to last stream closed);
- TTFT: time from sending a request to its first chunk with text (p50 / p95);
- ITL: time between successive text chunks of a request (p50 / p95).

With several rounds tok/s is the median over rounds and the percentiles pool the requests
of every round. Ratios are pyllama / llama-server: above 1 is better for tok/s, below 1 is
better for the latencies.

llama-server is found with --llama-server, on PATH, or built from the llama-cpp-python
0.3.36 sdist like llama-bench (see compare_llamacpp.py; ~20 minutes on 2 cores the first
time). Needs httpx and pyllama's server extra.

    python benchmarks/compare_server.py [--models smollm2,gemma3] [--concurrency 1,2,4,8]
        [--rounds 1] [--max-tokens 64] [--requests-per-client 2] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_llamacpp import build_llama_bench  # noqa: E402

N_PARALLEL = 8
CTX_PER_SLOT = 1024
SEED = "42"

PROMPT = (
    "The old lighthouse keeper climbed the spiral staircase every evening at dusk, carrying a "
    "lantern, a notebook and a thermos of strong black tea. From the gallery at the top he could "
    "see the fishing boats returning to the harbour, the gulls circling over the breakwater and "
    "the long line of cliffs fading into the mist. He wrote down the wind, the colour of the sea "
    "and the names of the boats, as his father had done before him. One night, a ship he had "
    "never seen before appeared on the horizon, and"
)


# ------------------------------------------------------------------------------ servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_args(model: str, port: int, threads: str) -> list[str]:
    """The flags both servers take, in llama-server's spelling."""
    return ["-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", str(N_PARALLEL),
            "-c", str(N_PARALLEL * CTX_PER_SLOT), "-t", threads, "-tb", threads, "--seed", SEED]


class Server:
    """One server process (llama-server or pyllama serve); a context manager that waits for
    /health and stops the process (its log goes to a temporary file, shown on failure)."""

    def __init__(self, name: str, cmd: list[str], port: int, env: dict | None = None):
        self.name, self.cmd, self.port, self.env = name, cmd, port, env
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile("w+b", prefix=f"{name}-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Server":
        extra = " ".join(f"{k}={v}" for k, v in (self.env or {}).items())
        print("+ " + (extra + " " if extra else "") + " ".join(self.cmd), file=sys.stderr, flush=True)
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env={**os.environ, **(self.env or {})})
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.fail(f"exited with {self.proc.returncode} while starting")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.fail("did not answer /health within 300 s")
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        if exc[0] is None:
            os.unlink(self.log.name)
        else:
            print(f"{self.name} log kept: {self.log.name}", file=sys.stderr)

    def fail(self, why: str) -> None:
        self.log.flush()
        tail = Path(self.log.name).read_bytes()[-3000:].decode("utf-8", "replace")
        raise RuntimeError(f"{self.name} {why}; log {self.log.name}:\n{tail}")


def start(name: str, model: str, a) -> Server:
    port = free_port()
    if name == "llama-server":
        cmd = [a.llama_server, *server_args(model, port, a.threads)]
        env = dict(kv.split("=", 1) for kv in a.llama_env)
    else:
        cmd = [sys.executable, "-m", "pyllama", "serve", *server_args(model, port, a.threads)]
        env = {}
    return Server(name, cmd, port, env)


# ------------------------------------------------------------------------------ clients


@dataclass
class Result:
    ttft: float = float("nan")                     # seconds to the first text chunk
    gaps: list = field(default_factory=list)       # seconds between text chunks
    n_gen: int = 0                                 # usage.completion_tokens (or text chunks)
    n_prompt: int = 0
    n_cached: int = 0
    error: str = ""


def stream_completion(client: httpx.Client, url: str, prompt: str, max_tokens: int) -> Result:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    r = Result()
    chunks = 0
    t0 = time.perf_counter()
    last = None
    try:
        with client.stream("POST", url + "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                return Result(error=f"HTTP {resp.status_code}: {resp.read()[:300]!r}")
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data.strip() == "[DONE]":
                    break
                now = time.perf_counter()
                obj = json.loads(data)
                if "error" in obj:
                    r.error = str(obj["error"])[:300]
                    continue
                if any(c.get("text") for c in obj.get("choices") or []):
                    chunks += 1
                    if last is None:
                        r.ttft = now - t0
                    else:
                        r.gaps.append(now - last)
                    last = now
                u = obj.get("usage")
                if u:
                    r.n_gen = u.get("completion_tokens", 0)
                    r.n_prompt = u.get("prompt_tokens", 0)
                    r.n_cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
    except httpx.HTTPError as e:
        r.error = f"{type(e).__name__}: {e}"
    if not r.n_gen:
        r.n_gen = chunks
    return r


def run_level(url: str, k: int, per_client: int, max_tokens: int, tag: str) -> tuple[float, list[Result]]:
    """K client threads, each sending per_client requests in turn; returns (wall s, results)."""
    results: list[Result] = []
    lock = threading.Lock()
    barrier = threading.Barrier(k + 1)

    def client(c: int) -> None:
        with httpx.Client(timeout=httpx.Timeout(600, connect=10)) as http:
            barrier.wait()
            for j in range(per_client):
                res = stream_completion(http, url, f"{PROMPT} (story {tag}-{c}-{j})", max_tokens)
                with lock:
                    results.append(res)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(k)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, results


# ------------------------------------------------------------------------------ report


def pct(xs: list[float], q: float) -> float:
    """The q-th percentile (linear interpolation); nan when empty."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    i = (len(xs) - 1) * q / 100
    lo = int(i)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)


@dataclass
class Level:
    tps: list = field(default_factory=list)        # tok/s per round
    results: list = field(default_factory=list)    # every request of every round

    def stats(self) -> dict:
        ok = [r for r in self.results if not r.error]
        ttft = [r.ttft for r in ok if r.ttft == r.ttft]
        gaps = [g for r in ok for g in r.gaps]
        return {"tok/s": statistics.median(self.tps) if self.tps else float("nan"),
                "TTFT p50": pct(ttft, 50) * 1e3, "TTFT p95": pct(ttft, 95) * 1e3,
                "ITL p50": pct(gaps, 50) * 1e3, "ITL p95": pct(gaps, 95) * 1e3}


def model_paths(spec: str) -> list[tuple[str, str]]:
    from pyllama import _models

    out = []
    for name in spec.split(","):
        name = name.strip()
        if name in ("smollm2", "gemma3"):
            p = _models.smollm2_path() if name == "smollm2" else _models.gemma3_path()
            if p is None:
                sys.exit(f"model {name} is not installed (see pyllama/_models.py)")
            out.append((Path(p).name, str(p)))
        elif name:
            out.append((Path(name).name, name))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2,gemma3", help="comma-separated: smollm2, gemma3 or GGUF paths")
    ap.add_argument("--concurrency", default="1,2,4,8", help="comma-separated client counts (at most 8 = -np)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat every level this many times")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request")
    ap.add_argument("--requests-per-client", type=int, default=2, help="requests each client sends in turn")
    ap.add_argument("-t", "--threads", default="2", help="-t and -tb of both servers")
    ap.add_argument("--llama-server", help="path to an existing llama-server")
    ap.add_argument("--llama-env", action="append", default=[], metavar="NAME=VALUE",
                    help="environment for llama-server only, e.g. OMP_WAIT_POLICY=PASSIVE (its OpenMP threads "
                         "then sleep at barriers instead of spinning: kinder to a busy machine)")
    a = ap.parse_args()
    levels = [int(x) for x in a.concurrency.split(",") if x.strip()]
    if any("=" not in kv for kv in a.llama_env):
        sys.exit("--llama-env: expected NAME=VALUE")
    if any(not 1 <= k <= N_PARALLEL for k in levels):
        sys.exit(f"--concurrency: each level must be 1..{N_PARALLEL}")
    models = model_paths(a.models)
    a.llama_server = a.llama_server or shutil.which("llama-server") or str(build_llama_bench("llama-server"))
    progs = ("llama-server", "pyllama")

    data: dict[tuple[str, int, str], Level] = {}
    load0 = os.getloadavg()[0]
    turn = 0
    for rnd in range(a.rounds):
        for name, path in models:
            for k in levels:
                order = progs if turn % 2 == 0 else progs[::-1]
                turn += 1
                for prog in order:
                    with start(prog, path, a) as srv:
                        with httpx.Client(timeout=600) as http:
                            stream_completion(http, srv.url, PROMPT + " (warm-up)", 8)
                        wall, res = run_level(srv.url, k, a.requests_per_client, a.max_tokens, f"{rnd}.{k}")
                    lv = data.setdefault((name, k, prog), Level())
                    n_gen = sum(r.n_gen for r in res if not r.error)
                    lv.tps.append(n_gen / wall)
                    lv.results.extend(res)
                    errs = [r.error for r in res if r.error]
                    short = [r.n_gen for r in res if not r.error and r.n_gen != a.max_tokens]
                    print(f"  round {rnd + 1} {name} K={k} {prog}: {n_gen} tokens in {wall:.2f} s = "
                          f"{n_gen / wall:.1f} tok/s; prompt {statistics.mean(r.n_prompt for r in res):.0f} tokens "
                          f"({statistics.mean(r.n_cached for r in res):.0f} cached)"
                          + (f"; {len(errs)} errors: {errs[0]}" if errs else "")
                          + (f"; {len(short)} requests did not generate {a.max_tokens} tokens: {short}" if short else ""),
                          file=sys.stderr, flush=True)

    metrics = ("tok/s", "TTFT p50", "TTFT p95", "ITL p50", "ITL p95")
    print(f"\n{a.rounds} round(s), {a.requests_per_client} requests per client, {a.max_tokens} tokens per request, "
          f"-np {N_PARALLEL} -c {N_PARALLEL * CTX_PER_SLOT} -t {a.threads} -tb {a.threads}"
          f"{'; llama-server with ' + ' '.join(a.llama_env) if a.llama_env else ''}; "
          f"times in ms; ls = llama-server, pyl = pyllama serve, x = pyl / ls")
    load1, ncpu = os.getloadavg()[0], os.cpu_count() or 1
    busy = " (other work was running: the results are skewed)" if max(load0, load1) > ncpu / 2 else ""
    print(f"1-min load average {load0:.1f} at the start, {load1:.1f} at the end, {ncpu} CPUs{busy}\n")
    head = "| model | K | " + " | ".join(f"{m} ls | {m} pyl | x" for m in metrics) + " |"
    print(head)
    print("|---|---:|" + "---:|---:|---:|" * len(metrics))
    for name, _ in models:
        for k in levels:
            ls, pyl = data[(name, k, "llama-server")].stats(), data[(name, k, "pyllama")].stats()
            cells = []
            for m in metrics:
                x = pyl[m] / ls[m] if ls[m] else float("nan")
                cells.append(f"{ls[m]:.1f} | {pyl[m]:.1f} | {x:.2f}")
            print(f"| {name} | {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
