"""`pyllama embedding`: llama.cpp's llama-embedding (same flags and output formats).

The prompt (-p or -f) is split at --embd-separator (default a newline) into inputs; each is
one sequence, decoded with the chosen pooling, normalized per --embd-normalize and printed:
by default llama-embedding's ``embedding N: ...`` lines (a cosine-similarity matrix under
several pooled inputs), or ``--embd-output-format json|json+|array|raw``.

With rank pooling (a reranker), an input holding --cls-separator (default a tab) is a
(query, document) pair, joined as llama-embedding joins it (the model's rerank template, or
query + the EOS / SEP texts the vocabulary adds + document), and the default output is
``rerank score N: ...`` lines; the other formats print the n_cls_out scores per input
(llama-embedding pads them to n_embd values with whatever its buffer holds).
Encoder models (bert, ...) run each batch in one micro-batch, so --ubatch-size is set to
--batch-size as llama-embedding does for non-causal models.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from . import app
from . import _checks as O
from ._checks import integer, read_text_file, threads as _threads


def _fmt(x: float, normalize: int) -> str:
    return f"{x:1.0f}" if normalize == 0 else f"{x:1.7f}"


@app.command("embedding")
def embedding(
    model: Optional[Path] = typer.Option(None, "-m", "--model", help="GGUF file (default: SmolLM2-135M-Instruct)"),
    hf_repo: Optional[str] = O.opt_hf_repo(),
    hf_file: Optional[str] = O.opt_hf_file(),
    hf_token: Optional[str] = O.opt_hf_token(),
    prompt: Optional[str] = typer.Option(None, "-p", "--prompt", help="text to embed (split at --embd-separator)"),
    file: Optional[Path] = typer.Option(None, "-f", "--file", help="read the text from a file"),
    pooling: Optional[str] = typer.Option(None, "--pooling", callback=O.one_of(("none", "mean", "cls", "last", "rank")),
                                          help="none, mean, cls, last or rank (default: the model's "
                                               "pooling_type; none for most decoders)"),
    embd_normalize: int = typer.Option(2, "--embd-normalize", callback=integer(-1),
                                       help="-1 none, 0 max absolute (int16 range), 1 taxicab, 2 euclidean, >2 p-norm"),
    embd_output_format: str = typer.Option("", "--embd-output-format",
                                           callback=O.one_of(("", "json", "json+", "array", "raw")),
                                           help="'' (llama-embedding's text), json, json+ (with cosine similarities), "
                                                "array, raw"),
    embd_separator: str = typer.Option("\n", "--embd-separator", help="separator between inputs in the text"),
    cls_separator: str = typer.Option("\t", "--cls-separator",
                                      help="separator of a (query, document) pair in an input (rank pooling)"),
    ctx_size: int = O.opt_ctx_size(),
    batch_size: int = O.opt_batch_size(),
    ubatch_size: int = O.opt_ubatch_size(),
    threads: Optional[int] = O.opt_threads(),
    threads_batch: Optional[int] = O.opt_threads_batch(),
    load_mode: str = O.opt_load_mode(),
) -> None:
    """Print the embeddings of a text's lines (llama.cpp's llama-embedding)."""
    import numpy as np

    from ..context import Context
    from ..embedding import POOLING_NAMES, embed_token_lists
    from ..errors import PyllamaError
    from ..generation import load_model, progress_bar, resolve_model_path, vocab_of

    if prompt is not None and file is not None:
        raise typer.BadParameter("give the text once: -p or -f")
    text = read_text_file(file, "-f") if file is not None else (prompt or "")
    if not embd_separator:
        raise typer.BadParameter("the separator is empty", param_hint="--embd-separator")
    inputs = text.split(embd_separator) if text else [""]
    model = O.model_by_name(model, hf_repo, hf_file, hf_token)
    try:
        path = resolve_model_path(model)
        m = load_model(path, load_mode=load_mode, progress=progress_bar(f"loading {path.name}"))
        v = vocab_of(m)
        hp = dict(m.hparams)
        encoder = not bool(hp.get("causal_attn", True))
        rank = pooling == "rank" or (pooling is None and int(hp.get("pooling_type", 0)) == 4)
        if rank and not encoder:
            raise typer.BadParameter(f"rank pooling needs a reranker with a classifier head; {hp.get('arch')} "
                                     "rerankers are not supported", param_hint="--pooling")
        if rank and cls_separator:
            inputs = [_pair_text(m, v, t, cls_separator) for t in inputs]
        toks = [list(v.tokenize(t, add_special=True, parse_special=True)) for t in inputs]
        n_ctx = ctx_size if ctx_size > 0 else (int(m.n_ctx_train) or 4096)
        if encoder:
            ubatch_size = batch_size  # llama-embedding: for non-causal models n_ubatch = n_batch
        kw = {}
        t, tb = _threads(threads), _threads(threads_batch)
        if t:
            kw["n_threads"] = t
        if tb or t:
            kw["n_threads_batch"] = tb or t
        ctx = Context(m, n_ctx=n_ctx, n_batch=batch_size, n_ubatch=min(ubatch_size or batch_size, batch_size),
                      embeddings=True, n_seq_max=min(max(len(toks), 1), 256), kv_unified=True,
                      pooling_type=POOLING_NAMES[pooling] if pooling else -1, **kw)
        # rank scores are not normalized (llama-embedding normalizes its n_embd-wide buffer, of
        # which only the n_cls_out scores are set)
        embs = embed_token_lists(ctx, toks, normalize_mode=-1 if int(ctx.pooling_type) == 4 else embd_normalize)
    except (PyllamaError, FileNotFoundError, ValueError, OSError, MemoryError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    pooled = int(ctx.pooling_type) != 0
    if int(ctx.pooling_type) == 4 and embd_output_format == "":
        for j, e in enumerate(embs):
            if e.shape[0] == 1:
                sys.stdout.write(f"rerank score {j}: {float(e[0]):8.3f}\n")
            else:
                for i, x in enumerate(e):
                    sys.stdout.write(f"rerank score {j}: {float(x):8.3f} [{i}]\n")
        sys.stdout.flush()
        return
    rows: list = []  # one vector per input (pooled) or per token of every input (pooling none)
    for e in embs:
        rows.extend([e] if e.ndim == 1 else list(e))
    out = sys.stdout
    fmt = embd_output_format
    if fmt == "":
        n_embd = rows[0].shape[0]
        for j, r in enumerate(rows):
            if not pooled:
                vals = " ".join(f"{x:9.6f}" for x in r[:3]) + "  ... " + " ".join(f"{x:9.6f}" for x in r[-3:])
            else:
                k = min(16, n_embd) if len(rows) > 1 else n_embd
                vals = " ".join((f"{x:6.0f}" if embd_normalize == 0 else f"{x:9.6f}") for x in r[:k])
            out.write(f"embedding {j}: {vals}\n")
        if pooled and len(rows) > 1:
            out.write("\ncosine similarity matrix:\n\n")
            out.write("".join(f"{t[:6]:>6} " for t in inputs) + "\n")
            for i in range(len(rows)):
                out.write("".join(f"{_cos(rows[i], rows[j]):6.2f} " for j in range(len(rows))) + f"{inputs[i][:10]}\n")
    elif fmt in ("json", "json+", "array"):
        items = ["[" + ",".join(_fmt(float(x), embd_normalize) for x in r) + "]" for r in rows]
        if fmt == "array":
            out.write("[" + ",".join(items) + "]\n")
        else:
            out.write('{\n  "object": "list",\n  "data": [\n')
            out.write(",\n".join(f'    {{\n      "object": "embedding",\n      "index": {j},\n      "embedding": {it}\n    }}'
                                 for j, it in enumerate(items)))
            out.write("\n  ]")
            if fmt == "json+" and pooled and len(rows) > 1:
                out.write(',\n  "cosineSimilarity": [\n')
                out.write(",\n".join("    [" + ", ".join(f"{_cos(rows[i], rows[j]):6.2f}" for j in range(len(rows))) + "]"
                                     for i in range(len(rows))))
                out.write("\n  ]")
            out.write("\n}\n")
    else:  # raw
        for r in rows:
            out.write(" ".join(_fmt(float(x), embd_normalize) for x in r) + "\n")
    out.flush()


def _pair_text(model, vocab, text: str, sep: str) -> str:
    """llama-embedding's pair text for rank pooling: the parts of ``text`` split at ``sep``,
    through the model's rerank template (query and document) or joined with the EOS and SEP
    texts the vocabulary adds."""
    if sep not in text:
        return text
    parts = text.split(sep)
    tmpl = model.chat_template("rerank") if hasattr(model, "chat_template") else None
    if tmpl is not None:
        return tmpl.replace("{query}", parts[0]).replace("{document}", parts[1] if len(parts) > 1 else "")
    mid = ""
    if vocab.add_eos and vocab.eos >= 0:
        mid += vocab.token_to_piece(vocab.eos, special=True).decode("utf-8", "replace")
    if vocab.add_sep and vocab.sep >= 0:
        mid += vocab.token_to_piece(vocab.sep, special=True).decode("utf-8", "replace")
    return mid.join(parts)


def _cos(a, b) -> float:
    import numpy as np

    na, nb = float(np.linalg.norm(a.astype(np.float64))), float(np.linalg.norm(b.astype(np.float64)))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a.astype(np.float64), b.astype(np.float64)) / (na * nb))
