"""`pyllama verify`: check pyllama against llama.cpp on your own model, in one command
(see :mod:`pyllama.verify` for what is compared and how)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from . import _checks as O
from . import app
from ._checks import integer, read_text_file


@app.command("verify")
def verify(
    model: Optional[Path] = typer.Option(None, "-m", "--model", help="GGUF file (default: SmolLM2-135M-Instruct)"),
    hf_repo: Optional[str] = O.opt_hf_repo(),
    hf_file: Optional[str] = O.opt_hf_file(),
    hf_token: Optional[str] = O.opt_hf_token(),
    llama_cpp: Optional[Path] = typer.Option(None, "--llama-cpp", metavar="DIR",
                                             help="llama.cpp build directory holding libllama.so (default: "
                                                  "llama-cpp-python's library, when installed)"),
    file: Optional[Path] = typer.Option(None, "-f", "--file", help="text for the perplexity (default: a built-in "
                                                                   "paragraph; UTF-8)"),
    prompts_file: Optional[Path] = typer.Option(None, "--prompts", metavar="FILE",
                                                help="prompts to compare, one per line (default: 8 built-in ones)"),
    prompt: Optional[list[str]] = typer.Option(None, "-p", "--prompt", help="a prompt to compare (repeatable; "
                                                                            "replaces the built-in ones)"),
    ctx_size: int = typer.Option(128, "-c", "--ctx-size", callback=integer(8), help="tokens per perplexity chunk"),
    batch_size: int = typer.Option(512, "-b", "--batch-size", callback=integer(1), help="tokens per decode call"),
    threads: int = typer.Option(0, "-t", "--threads", help="threads for both engines (<= 0 = their defaults)"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Run llama.cpp and pyllama on prompts and a text; print top-1 agreement, KL, max |Δlogit| and both perplexities."""
    from .. import verify as V
    from ..errors import PyllamaError
    from ..generation import resolve_model_path

    prompts = list(prompt or [])
    if prompts_file is not None:
        prompts += [ln for ln in read_text_file(prompts_file, "--prompts").splitlines() if ln.strip()]
    if not prompts:
        prompts = list(V.DEFAULT_PROMPTS)
    text = read_text_file(file, "-f") if file is not None else V.DEFAULT_TEXT
    model = O.model_by_name(model, hf_repo, hf_file, hf_token)
    try:
        lib = V.find_library(llama_cpp)
        path = resolve_model_path(model)
        rep = V.run(path, lib, prompts=prompts, text=text, n_ctx=ctx_size, n_batch=batch_size, n_threads=max(threads, 0))
    except (PyllamaError, FileNotFoundError, ValueError, OSError, MemoryError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(rep.as_dict(), indent=2, ensure_ascii=False))
        return
    print(f"model     : {rep.model}")
    print(f"llama.cpp : {rep.library}")
    print(f"order     : {rep.float_order}" + ("" if rep.float_order == "llamacpp" else
          " (pyllama's float summation order; PYLLAMA_ORDER=llamacpp uses llama.cpp's, for bit-exact logits)"))
    print(f"tokens    : pyllama's for both engines; llama.cpp tokenizes {rep.tokenize_same}/{len(rep.prompts)} "
          f"prompts{' and the text' if rep.text.get('same_tokens') else ''} the same"
          + ("" if rep.text.get("same_tokens") else " (the text differently)"))
    print()
    print(f"{'#':>3} {'tokens':>6} {'top-1':>9} {'KL mean':>10} {'KL max':>10} {'max|Δlogit|':>12}  prompt")
    for i, p in enumerate(rep.prompts, 1):
        short = p["prompt"].replace("\n", "\\n")
        short = short if len(short) <= 40 else short[:37] + "..."
        print(f"{i:>3} {p['tokens']:>6} {p['top1_agree']:>4}/{p['positions']:<4} {p['kl_mean']:>10.3g} "
              f"{p['kl_max']:>10.3g} {p['max_abs_dlogit']:>12.4g}  {short}")
    t = rep.text
    print(f"{'text':>3} {t['tokens']:>6} {t['top1_agree']:>4}/{t['positions']:<4} {t['kl_mean']:>10.3g} "
          f"{t['kl_max']:>10.3g} {t['max_abs_dlogit']:>12.4g}  ({t['chunks']} chunks of {t['n_ctx']})")
    o = rep.overall
    print()
    print(f"top-1 agreement : {o.top1}/{o.n} positions ({100 * o.top1 / o.n:.2f}%)")
    print(f"KL divergence   : mean {o.kl_mean:.3g}, max {o.kl_max:.3g} (llama.cpp's softmax || pyllama's)")
    print(f"max |Δlogit|    : {o.dlogit_max:.4g}")
    print(f"perplexity      : llama.cpp {t['ppl_llama_cpp']:.4f}, pyllama {t['ppl_pyllama']:.4f} "
          f"({t['scored']} tokens scored; ratio {t['ppl_pyllama'] / t['ppl_llama_cpp']:.5f})")
