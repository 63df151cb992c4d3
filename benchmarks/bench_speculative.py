"""Speculative decoding with prompt lookup (Llama(draft_model=LlamaPromptLookupDecoding(...)))
against plain decoding: greedy completions of prompts whose answer repeats the prompt (code
to copy, a text to repeat), tokens/s of generation with and without the draft, the share of
drafted tokens the sampler kept, and a check that both outputs are the same text. Each
configuration runs --repeat times, alternating with the others, and the best run counts (a
busy machine only ever makes a run slower).

    python benchmarks/bench_speculative.py [--model PATH] [--max-tokens 160] [--pred 2,4,10] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

from pyllama import Llama, _models
from pyllama.llama_speculative import LlamaPromptLookupDecoding

CODE = '''def parse_args(argv):
    parser = argparse.ArgumentParser(description="Copy files")
    parser.add_argument("--src", required=True, help="source directory")
    parser.add_argument("--dst", required=True, help="destination directory")
    parser.add_argument("--dry-run", action="store_true", help="print only")
    return parser.parse_args(argv)


def copy_tree(src, dst, dry_run=False):
    for root, dirs, files in os.walk(src):
        for name in files:
            path = os.path.join(root, name)
            target = os.path.join(dst, os.path.relpath(path, src))
            if dry_run:
                print(path, "->", target)
            else:
                shutil.copy2(path, target)
'''

TEXT = ("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a "
        "single step. All that glitters is not gold. Actions speak louder than words. Better late "
        "than never. Every cloud has a silver lining. ")

PROMPTS = {
    "code": ("<|im_start|>user\nRename copy_tree to copy_files in this code and print the whole "
             f"code again:\n\n{CODE}<|im_end|>\n<|im_start|>assistant\n"),
    "text": f"{TEXT}\n{TEXT}\n{TEXT}\n",
}


def run(llm: Llama, prompt: str, max_tokens: int):
    llm.reset()
    t0 = time.perf_counter()
    text = llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0)["choices"][0]["text"]
    total = time.perf_counter() - t0
    st = llm._session.stats
    return text, st.n_gen / st.t_gen_s, total, st


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--pred", default="2,4,10", help="num_pred_tokens values to try")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    path = args.model or str(_models.smollm2_path())
    preds = [int(x) for x in args.pred.split(",")]
    llms = {0: Llama(path, n_ctx=args.n_ctx, verbose=False)}
    for k in preds:
        llms[k] = Llama(path, n_ctx=args.n_ctx, verbose=False, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=k))
    for name, prompt in PROMPTS.items():
        best: dict = {}
        for _ in range(args.repeat):
            for k, llm in llms.items():
                r = run(llm, prompt, args.max_tokens)
                if k not in best or r[1] > best[k][1]:
                    best[k] = r
        ref, tps, total, st = best[0]
        print(f"{name:5} plain                 {tps:6.1f} tok/s  ({st.n_gen} tokens, {total:.2f} s total)")
        for k in preds:
            text, tps2, total2, st2 = best[k]
            rate = st2.n_accepted / st2.n_drafted if st2.n_drafted else 0.0
            print(f"{name:5} draft num_pred={k:<3}    {tps2:6.1f} tok/s  ({st2.n_gen} tokens, {total2:.2f} s total)"
                  f"  x{tps2 / tps:.2f}  accepted {st2.n_accepted}/{st2.n_drafted} = {rate:.0%}"
                  f"  same output: {text == ref}")


if __name__ == "__main__":
    main()
