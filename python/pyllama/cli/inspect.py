"""`pyllama inspect MODEL [--tensors] [--metadata] [--json]`: what is in a GGUF file, with
the numbers llama.cpp's print_info shows (architecture, type guess, size and bits per
weight, parameter count, hyperparameters, tokenizer, special tokens, chat template)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import typer

from . import _checks as O
from . import app

SPECIAL_TOKENS = ["bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask",
                  "cls", "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep"]


def _params_str(n: int) -> str:
    """llama.cpp's "model params = 134.52 M"."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n * 1e-3:.2f} K"


def _per_layer(v: Any) -> Any:
    """llama.cpp prints a per-layer value once when every layer has the same."""
    if isinstance(v, list) and v and all(x == v[0] for x in v):
        return v[0]
    return v


def collect(path: Path) -> dict[str, Any]:
    """Everything `inspect` shows, as plain data (the --json output)."""
    from ..errors import UnsupportedModelError
    from ..gguf import GGUFFile
    from ..model import Model

    f = GGUFFile(path)
    md = f.metadata
    info: dict[str, Any] = {
        "path": str(path),
        "gguf_version": f.version,
        "architecture": md.get("general.architecture"),
        "name": md.get("general.name"),
        "n_tensors": len(f.tensors),
        "n_kv": len(md),
        "file_size": f.file_size,
    }
    model: Optional[Model] = None
    try:
        model = Model.load(path, load_mode="mmap")
    except UnsupportedModelError as e:
        info["unsupported"] = str(e)
    if model is not None:
        info["n_tensors"] = len(model.tensors)
        n_params, size = model.n_params, model.size
        info.update(
            {
                "type_guess": model.ftype_name,
                "model_type": model.type_name,
                "desc": model.desc,
                "n_files": model._core.n_files(),
            }
        )
        hp = {k: _per_layer(v) for k, v in model.hparams.items() if k not in ("arch", "swa_layers")}
        hp["n_swa_layers"] = sum(model.hparams.get("swa_layers", []))
        info["hparams"] = hp
    else:
        n_params = sum(_n_elements(t.shape) for t in f.tensors)
        size = sum(t.nbytes for t in f.tensors)
    info["n_params"] = n_params
    info["size"] = size
    info["size_mib"] = round(size / 2**20, 2)
    info["bpw"] = round(size * 8 / max(n_params, 1), 2)
    # A split model's tensors live in several files: take them from the model when loaded.
    all_tensors = model.tensors if model is not None else f.tensors
    info["tensor_types"] = dict(sorted(Counter(t.type for t in all_tensors).items()))
    tokens = md.get("tokenizer.ggml.tokens")
    info["tokenizer"] = {
        "model": md.get("tokenizer.ggml.model"),
        "pre": md.get("tokenizer.ggml.pre"),
        "n_tokens": len(tokens) if isinstance(tokens, list) else None,
        "n_merges": len(md["tokenizer.ggml.merges"]) if isinstance(md.get("tokenizer.ggml.merges"), list) else 0,
        "add_bos": md.get("tokenizer.ggml.add_bos_token"),
        "add_eos": md.get("tokenizer.ggml.add_eos_token"),
        "special": {
            name: md[f"tokenizer.ggml.{name}_token_id"]
            for name in SPECIAL_TOKENS
            if f"tokenizer.ggml.{name}_token_id" in md
        },
    }
    tmpl = md.get("tokenizer.chat_template")
    info["chat_template"] = isinstance(tmpl, str)
    info["chat_template_chars"] = len(tmpl) if isinstance(tmpl, str) else 0
    info["_file"] = f
    info["_tensors"] = all_tensors
    return info


def _n_elements(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _short(v: Any, width: int = 100) -> str:
    if isinstance(v, list):
        s = json.dumps(v[:8], ensure_ascii=False, default=str)
        s = s[:-1] + (f", ... ({len(v)} items)]" if len(v) > 8 else "]")
    elif isinstance(v, str):
        s = json.dumps(v, ensure_ascii=False)
    else:
        s = repr(v)
    return s if len(s) <= width else s[: width - 3] + "..."


@app.command()
def inspect(
    model: Optional[Path] = typer.Argument(None, help="GGUF file (the first part of a split model finds the rest)"),
    hf_repo: Optional[str] = O.opt_hf_repo(),
    hf_file: Optional[str] = O.opt_hf_file(),
    hf_token: Optional[str] = O.opt_hf_token(),
    tensors: bool = typer.Option(False, "--tensors", help="print the tensor table"),
    metadata: bool = typer.Option(False, "--metadata", help="print all metadata"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Show a GGUF file's version, architecture, type, size, hyperparameters and tokenizer."""
    from ..errors import PyllamaError

    if model is None and hf_repo is None:
        raise typer.BadParameter("give the model: a GGUF file or -hf REPO[:QUANT]", param_hint="MODEL")
    model = O.model_by_name(model, hf_repo, hf_file, hf_token)
    try:
        info = collect(model)
    except (PyllamaError, OSError) as e:
        print(f"pyllama inspect: error: {e}", file=sys.stderr)
        raise typer.Exit(1)
    f = info.pop("_file")
    all_tensors = info.pop("_tensors")
    if as_json:
        if metadata:
            info["metadata"] = {k: (v if not isinstance(v, bytes) else v.hex()) for k, v in f.metadata.items()}
            info["metadata_types"] = f.types
        if tensors:
            info["tensors"] = [
                {"name": t.name, "type": t.type, "shape": list(t.shape), "offset": t.offset, "nbytes": t.nbytes}
                for t in all_tensors
            ]
        print(json.dumps(info, indent=2, ensure_ascii=False, default=str))
        return

    row = "{:22s} {}".format
    print(row("file", info["path"]))
    print(row("GGUF version", info["gguf_version"]))
    print(row("architecture", info["architecture"]))
    print(row("general.name", info["name"]))
    if "unsupported" in info:
        print(row("note", info["unsupported"]))
    else:
        print(row("model type", info["model_type"]))
        print(row("file type", info["type_guess"]))
    print(row("file size", f"{info['size_mib']:.2f} MiB ({info['bpw']:.2f} BPW)"))
    print(row("model params", _params_str(info["n_params"])))
    print(row("tensors", f"{info['n_tensors']}  " + ", ".join(f"{k}: {v}" for k, v in info["tensor_types"].items())))
    for k, v in info.get("hparams", {}).items():
        print(row(k, v))
    tok = info["tokenizer"]
    print(row("tokenizer", f"{tok['model']} (pre: {tok['pre']}), {tok['n_tokens']} tokens, {tok['n_merges']} merges"))
    print(row("add_bos / add_eos", f"{tok['add_bos']} / {tok['add_eos']}"))
    for name, tid in tok["special"].items():
        print(row(f"{name} token id", tid))
    print(row("chat template", f"yes ({info['chat_template_chars']} chars)" if info["chat_template"] else "no"))
    if metadata:
        print()
        for k, v in f.metadata.items():
            print(f"  {k:44s} {f.types[k]:12s} {_short(v)}")
    if tensors:
        print()
        for t in all_tensors:
            print(f"  {t.name:40s} {t.type:7s} {str(list(t.shape)):22s} {t.nbytes:>12d}")
