#!/usr/bin/env python3
"""Write docs/reference/cli.md from the Typer app itself: each command's help text exactly
as `pyllama COMMAND --help` prints it (plain, without rich's boxes), so the reference
cannot drift from the code. scripts/docs.sh runs this before `mkdocs build --strict`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["TYPER_USE_RICH"] = "0"  # before typer is imported: plain click help text
os.environ.setdefault("COLUMNS", "100")

import typer.main  # noqa: E402

from pyllama.cli import app  # noqa: E402


def _click():
    try:
        from typer import _click as c  # newer typer vendors click
    except ImportError:  # older typer depends on click
        import click as c
    return c


def main(out: Path) -> None:
    c = _click()
    root = typer.main.get_command(app)
    lines = ["# CLI reference", "",
             "Generated from the `pyllama` Typer app by `scripts/gen_cli_docs.py`: each section is what",
             "`pyllama COMMAND --help` prints.", ""]
    with c.Context(root, info_name="pyllama", terminal_width=100, max_content_width=100) as ctx:
        lines += ["## pyllama", "", "```text", root.get_help(ctx).rstrip(), "```", ""]
        for name in root.list_commands(ctx):
            cmd = root.get_command(ctx, name)
            with c.Context(cmd, info_name=name, parent=ctx, terminal_width=100, max_content_width=100) as sub:
                lines += [f"## pyllama {name}", "", "```text", cmd.get_help(sub).rstrip(), "```", ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {out} ({len(lines)} lines)", file=sys.stderr)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "docs" / "reference" / "cli.md")
