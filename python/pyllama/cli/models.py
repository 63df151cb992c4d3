"""`pyllama list` and `pyllama rm`: the cached models, ollama-style.

The caches are pyllama's own (the default model; :func:`pyllama._models.cache_dir`) and the
Hugging Face Hub cache that ``-hf`` fills. Names: ``owner/repo:QUANT`` for a Hub model the
quant tag selects (what ``-hf`` takes), ``owner/repo/path/file.gguf`` for one it does not,
the file name for pyllama's cache.
"""

from __future__ import annotations

import time

import typer

from . import app


def human_bytes(n: int) -> str:
    """ollama's sizes: decimal units, one decimal under 10 ("6.9 MB", "98 MB", "1.2 GB")."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.1f} {unit}" if v < 10 else f"{v:.0f} {unit}"
    return f"{n} B"


def human_age(t: float, now: float | None = None) -> str:
    s = max(0.0, (now or time.time()) - t)
    for unit, secs in (("year", 365 * 86400), ("month", 30 * 86400), ("week", 7 * 86400), ("day", 86400),
                       ("hour", 3600), ("minute", 60)):
        if s >= secs:
            k = int(s // secs)
            return f"{k} {unit}{'s' if k > 1 else ''} ago"
    return "just now"


@app.command("list")
def list_cmd() -> None:
    """List the cached models: name (what -hf and rm take), file type, size, age."""
    from ..hub import cached_models, file_type

    rows = [(m.name, file_type(m.paths[0]), human_bytes(m.size), human_age(m.mtime)) for m in cached_models()]
    header = ("NAME", "TYPE", "SIZE", "MODIFIED")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
    for r in [header] + rows:
        print("    ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


@app.command("rm")
def rm_cmd(names: list[str] = typer.Argument(..., metavar="NAME...", help="model names as `pyllama list` shows them")) -> None:
    """Delete cached models (as `pyllama list` names them; a bare owner/repo when it has one model)."""
    from ..hub import find_cached, remove_model

    found = []
    for name in names:  # resolve every name before deleting anything
        ms = find_cached(name)
        if not ms:
            typer.echo(f"error: no cached model named {name!r} (see pyllama list)", err=True)
            raise typer.Exit(1)
        if len(ms) > 1:
            typer.echo(f"error: {name!r} is ambiguous: it names {', '.join(m.name for m in ms)}; give one of them",
                       err=True)
            raise typer.Exit(1)
        found.append(ms[0])
    for m in found:
        try:
            freed = remove_model(m)
        except OSError as e:
            typer.echo(f"error: cannot delete {m.name}: {e}", err=True)
            raise typer.Exit(1) from None
        print(f"deleted '{m.name}' ({human_bytes(freed)} freed)")
