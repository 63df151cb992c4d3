"""Per-token cost of a GBNF grammar during generation (issue 13): pyllama's Rust grammar
engine, its Python reference engine, and llama.cpp's own grammar sampler as the anchor,
on the same model, grammar and prompt, in the same run.

For each model and grammar (llama.cpp's grammars/json.gbnf, and a nested JSON schema:
objects in arrays, enums, strings with patterns; tests/data/grammar/nested_schema.json)
it prints, per engine:

- *first*: what greedy generation pays per token with grammar-first sampling (as
  llama.cpp's common_sampler_sample: the chain picks a token, the grammar checks that one
  token, the full mask is computed only when it is rejected), i.e. allows + mask + accept;
- *mask*: the full-vocabulary mask + accept computed at every token of the same text with
  the per-state mask cache emptied each time (the worst case: every token rejected);
- median and p99 of each, over the generated tokens (CPU time of the calling thread,
  which runs the mask too), and the tg token time (wall-clock ms per token of
  unconstrained generation) they are measured against (the issue's target: < 10%).

llama.cpp prints only totals: its column is `sampling time` / tokens (the whole sampler
chain, grammar included, with its own grammar-first resampling) from `llama-completion
--grammar-file` on the same prompt and its `eval time` per token (run with
OMP_WAIT_POLICY=PASSIVE: spinning OpenMP workers collapse on a busy shared machine).

    python benchmarks/bench_grammar.py [--models gemma3,smollm2] [--tokens 96] [--engines rust,py]
        [--llama-completion PATH] [--threads 2]

Build the anchor from the vendored llama.cpp (2 cores):
    cmake --build ~/.cache/pyllama/llama.cpp/build-avx2 --target llama-completion -j2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from pyllama import Llama, _models
from pyllama.grammar import Grammar, GrammarSampler
from pyllama.json_schema import json_schema_to_grammar
from pyllama.llama_grammar import LlamaGrammar

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "grammar"
LLAMA_COMPLETION = Path.home() / ".cache/pyllama/llama.cpp/build-avx2/bin/llama-completion"

PROMPTS = {
    "json.gbnf": "Describe a cat as a JSON object with its name, age, colors and favourite foods:\n",
    "nested schema": "A customer record as JSON: name, role, tags, and a list of orders (id, sku, status, size):\n",
}


# The grammar's own work is timed in CPU time of this thread (the mask runs on it with
# the GIL released): on a shared machine a wall-clock p99 measures the scheduler instead
# (a preemption costs milliseconds). tg is wall-clock, as `pyllama bench` reports it.
_clock = time.thread_time


class _Timed:
    """The grammar sampler generation uses, with the time of each call added up per token."""

    def __init__(self, gs: GrammarSampler):
        self.gs = gs
        self.cur = 0.0
        self.costs: list[float] = []
        self.tokens: list[int] = []
        self.n_masks = 0

    def allows(self, token: int) -> bool:
        t0 = _clock()
        r = self.gs.allows(token)
        self.cur += _clock() - t0
        return r

    def allowed_mask(self) -> np.ndarray:
        t0 = _clock()
        m = self.gs.allowed_mask()
        self.cur += _clock() - t0
        self.n_masks += 1
        return m

    def accept(self, token: int) -> None:
        t0 = _clock()
        self.gs.accept(token)
        self.costs.append(self.cur + _clock() - t0)
        self.tokens.append(int(token))
        self.cur = 0.0


class _TimedGrammar(LlamaGrammar):
    """A LlamaGrammar whose sampler is a fresh (cold) one of the chosen engine, timed."""

    def __init__(self, text: str, engine: str):
        super().__init__(_grammar=text)
        self.engine = engine
        self.timed: _Timed | None = None

    def sampler(self, vocab):
        v = getattr(vocab, "vocab", vocab)
        self.timed = _Timed(GrammarSampler(v, Grammar(self._grammar, self._root, v), engine=self.engine))
        return self.timed


def _ms(xs) -> tuple[float, float]:
    a = np.asarray(xs) * 1e3
    return float(np.median(a)), float(np.percentile(a, 99))


def _full_masks(llm: Llama, text: str, tokens: list[int], engine: str) -> list[float]:
    """Mask (cache emptied) + accept at every token of an accepted sequence."""
    v = llm._vocab
    gs = GrammarSampler(v, Grammar(text, "root", v), engine=engine)
    out = []
    for t in tokens:
        gs._masks.clear()
        t0 = _clock()
        m = gs.allowed_mask()
        gs.accept(t)
        out.append(_clock() - t0)
        assert m[t]
    return out


def _llama_cpp(exe: Path, model: Path, grammar: str, prompt: str, n: int, threads: int) -> dict | None:
    with tempfile.NamedTemporaryFile("w", suffix=".gbnf", delete=False) as f:
        f.write(grammar)
    try:
        r = subprocess.run([str(exe), "-m", str(model), "--grammar-file", f.name, "-p", prompt, "-n", str(n),
                            "--temp", "0", "-t", str(threads), "-c", "1024", "-no-cnv", "--no-warmup",
                            "--seed", "1"], capture_output=True, text=True, timeout=1800,
                           # OpenMP's spinning workers collapse on a shared, oversubscribed machine
                           env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    finally:
        os.unlink(f.name)
    log = r.stdout + r.stderr
    samp = re.search(r"sampling time =\s*([\d.]+) ms", log)
    ev = re.search(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs", log)
    if r.returncode != 0 or not samp or not ev:
        print(f"  llama-completion failed (rc {r.returncode}): {log[-400:]}")
        return None
    n_tok = int(ev.group(2)) + 1  # the first token comes from the prompt's eval
    return {"sampling_ms": float(samp.group(1)) / n_tok, "tg_ms": float(ev.group(1)) / int(ev.group(2)),
            "n": n_tok}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gemma3,smollm2")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--engines", default="rust,py")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-completion", default=str(LLAMA_COMPLETION))
    args = ap.parse_args()

    grammars = {
        "json.gbnf": (DATA / "json.gbnf").read_text(),
        "nested schema": json_schema_to_grammar(json.loads((DATA / "nested_schema.json").read_text())),
    }
    exe = Path(args.llama_completion)
    rows = []
    for name in args.models.split(","):
        path = _models.gemma3_path() if name == "gemma3" else _models.smollm2_path()
        if path is None:
            print(f"{name}: model not installed, skipped")
            continue
        llm = Llama(str(path), n_ctx=1024, n_threads=args.threads, verbose=False)
        for gname, text in grammars.items():
            prompt = PROMPTS[gname]
            llm.reset()
            llm.create_completion(prompt, max_tokens=args.tokens, temperature=0.0)
            st = llm._session.stats
            tg_ms = 1e3 * st.t_gen_s / max(1, st.n_gen)
            for engine in args.engines.split(","):
                g = _TimedGrammar(text, engine)
                llm.reset()
                llm.create_completion(prompt, max_tokens=args.tokens, temperature=0.0, grammar=g)
                timed = g.timed
                first = _ms(timed.costs)
                # the same tokens again, with a full mask at each one
                full = _ms(_full_masks(llm, text, timed.tokens, engine))
                rows.append((name, gname, f"pyllama {engine}", len(timed.costs), timed.n_masks, *first, *full, tg_ms))
                print(f"{name:8} {gname:14} {engine:5} tokens {len(timed.costs):4} masks {timed.n_masks:3} "
                      f"first med/p99 {first[0]:.3f}/{first[1]:.3f} ms  "
                      f"full mask med/p99 {full[0]:.3f}/{full[1]:.3f} ms  tg {tg_ms:.2f} ms", flush=True)
            if exe.exists():
                lc = _llama_cpp(exe, path, text, prompt, args.tokens, args.threads)
                if lc:
                    rows.append((name, gname, "llama.cpp", lc["n"], None, lc["sampling_ms"], None, None, None,
                                 lc["tg_ms"]))
                    print(f"{name:8} {gname:14} llama.cpp sampling {lc['sampling_ms']:.3f} ms/token "
                          f"(mean, whole chain)  tg {lc['tg_ms']:.2f} ms", flush=True)
            else:
                print(f"  {exe} not found: build it with cmake --build ... --target llama-completion")

    def f(x):
        return "-" if x is None else f"{x:.3f}"

    print()
    print("| model | grammar | engine | tokens | masks | grammar-first ms/token median | p99 | "
          "full mask ms/token median | p99 | tg ms/token | first p99 / tg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (m, g, e, n, nm, fmed, fp99, mmed, mp99, tg) in rows:
        ratio = "-" if fp99 is None else f"{100 * fp99 / tg:.1f}%"
        if e == "llama.cpp":
            ratio = f"{100 * fmed / tg:.1f}% (mean)"
        mean = " (mean)" if e == "llama.cpp" else ""
        print(f"| {m} | {g} | {e} | {n} | {'-' if nm is None else nm} | {f(fmed)}{mean} "
              f"| {f(fp99)} | {f(mmed)} | {f(mp99)} | {tg:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
