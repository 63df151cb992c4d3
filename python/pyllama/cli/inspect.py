"""`pyllama inspect MODEL`: what is in a GGUF file."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from . import app


@app.command()
def inspect(
    model: Path = typer.Argument(..., help="GGUF file"),
    tensors: bool = typer.Option(False, "--tensors", help="print the tensor table"),
    metadata: bool = typer.Option(False, "--metadata", help="print all metadata"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Show a GGUF file's version, architecture, hyperparameters and tokenizer."""
    from ..gguf import GGUFFile

    f = GGUFFile(model)
    info = {
        "path": str(model),
        "version": f.version,
        "architecture": f.metadata.get("general.architecture"),
        "name": f.metadata.get("general.name"),
        "n_tensors": len(f.tensors),
    }
    if as_json:
        print(json.dumps(info, indent=2))
        return
    for k, v in info.items():
        print(f"{k:14s} {v}")
    if metadata:
        for k, v in f.metadata.items():
            s = repr(v)
            print(f"  {k} = {s[:120]}")
    if tensors:
        for t in f.tensors:
            print(f"  {t.name:40s} {t.type:6s} {str(t.shape):20s} {t.nbytes}")
