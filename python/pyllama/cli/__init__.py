"""The ``pyllama`` command line (Typer). Each subcommand lives in its own module here and
registers itself on ``app``."""

import typer

app = typer.Typer(
    name="pyllama",
    help="Run GGUF language models: inspect, tokenize, generate, chat, serve, embedding, perplexity, bench, verify, list, rm, info.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # llama.cpp's -h
)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", is_eager=True, help="print the version and build, then exit",
                                       callback=lambda ctx, p, v: _version(ctx, v))) -> None:
    """Run GGUF language models."""


def _version(ctx, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from ._checks import version_line

        typer.echo(version_line())
        raise typer.Exit()

from . import inspect as _inspect  # noqa: E402,F401  (registers its command)
from . import bench as _bench  # noqa: E402,F401
from . import batched_bench as _batched_bench  # noqa: E402,F401
from . import tokenize as _tokenize  # noqa: E402,F401  (registers its command)
from . import generate as _generate  # noqa: E402,F401
from . import chat as _chat  # noqa: E402,F401
from . import perplexity as _perplexity  # noqa: E402,F401
from . import serve as _serve  # noqa: E402,F401
from . import embedding as _embedding  # noqa: E402,F401
from . import info as _info  # noqa: E402,F401
from . import models as _models  # noqa: E402,F401  (list, rm)
from . import verify as _verify  # noqa: E402,F401
