"""The ``pyllama`` command line (Typer). Each subcommand lives in its own module here and
registers itself on ``app``."""

import sys

import typer
import typer.core


class _OneLineErrors(typer.core.TyperGroup):
    """Usage errors as one line on stderr, ``error: <what> (see 'pyllama CMD -h')``, exit 2,
    as llama.cpp prints a bad argument (click's default is a usage block, rich's a box).
    Help without arguments and everything else keep click's behaviour."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            from typer._click import exceptions as ce  # newer typer vendors click
        except ImportError:  # older typer depends on click
            from click import exceptions as ce

        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except ce.NoArgsIsHelpError as e:
            e.show()
            sys.exit(e.exit_code)
        except ce.ClickException as e:
            msg = " ".join(e.format_message().split())
            ctx = getattr(e, "ctx", None)
            hint = f" (see '{ctx.command_path} -h')" if isinstance(e, ce.UsageError) and ctx is not None else ""
            typer.echo(f"error: {msg}{hint}", err=True)
            sys.exit(e.exit_code)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
    name="pyllama",
    help="Run GGUF language models: inspect, tokenize, generate, chat, serve, embedding, perplexity, bench, verify, quantize, imatrix, list, rm, info.",
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
from . import quantize as _quantize  # noqa: E402,F401  (quantize, imatrix)
