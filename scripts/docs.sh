#!/usr/bin/env bash
# Build the documentation site into site/ (mkdocs-material + mkdocstrings), warnings as
# errors: the CLI reference is generated from the Typer app (scripts/gen_cli_docs.py), the
# API reference from the docstrings, the home page is the README. Needs .venv with pyllama
# (scripts/test.sh makes it and calls this). Serve it locally with `mkdocs serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
python -m pip install -q "mkdocs>=1.6,<2" "mkdocs-material>=9.5,<10" "mkdocstrings[python]>=0.26"
python scripts/gen_cli_docs.py docs/reference/cli.md
NO_MKDOCS_2_WARNING=1 mkdocs build --strict -q
echo "docs: site/ built ($(find site -name '*.html' | wc -l) pages)"
