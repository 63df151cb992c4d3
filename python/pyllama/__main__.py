"""`python -m pyllama` == the `pyllama` command."""

from .cli import app

app()
