"""`pyllama tokenize`: show how a model tokenizes a prompt, printed like llama.cpp's
llama-tokenize (``%6d -> 'piece'`` per token, or ``[id, id, ...]`` with --ids)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Optional

import typer

from . import _checks as O
from . import app
from ._checks import read_file_bytes, read_limited

_HEX2 = re.compile(rb"[ \t\n\v\f\r]*[+-]?[0-9a-fA-F]+")


def process_escapes(data: bytes) -> bytes:
    """llama.cpp's string_process_escapes: \\n \\r \\t \\' \\" \\\\ and \\xHH; others stay."""
    out = bytearray()
    i, n = 0, len(data)
    while i < n:
        c = data[i]
        if c == 0x5C and i + 1 < n:
            i += 1
            e = data[i]
            simple = {0x6E: 0x0A, 0x72: 0x0D, 0x74: 0x09, 0x27: 0x27, 0x22: 0x22, 0x5C: 0x5C}
            if e in simple:
                out.append(simple[e])
            elif e == 0x78 and i + 2 < n and _HEX2.fullmatch(data[i + 1 : i + 3]):
                out.append(int(data[i + 1 : i + 3], 16) & 0xFF)
                i += 2
            else:
                out += bytes([0x5C, e])
        else:
            out.append(c)
        i += 1
    return bytes(out)


@app.command("tokenize")
def tokenize_cmd(
    model: Optional[Path] = typer.Option(None, "-m", "--model", help="GGUF model file (only its vocabulary is read)"),
    hf_repo: Optional[str] = O.opt_hf_repo(),
    hf_file: Optional[str] = O.opt_hf_file(),
    hf_token: Optional[str] = O.opt_hf_token(),
    prompt: Optional[str] = typer.Option(None, "-p", "--prompt", help="text to tokenize"),
    file: Optional[Path] = typer.Option(None, "-f", "--file", help="read the text from a file (its raw bytes, at most 256 MiB)"),
    stdin: bool = typer.Option(False, "--stdin", help="read the text from standard input (at most 256 MiB)"),
    ids: bool = typer.Option(False, "--ids", help="print only the ids, as a Python-style list"),
    no_bos: bool = typer.Option(False, "--no-bos", help="do not add BOS even if the model asks for it"),
    no_parse_special: bool = typer.Option(False, "--no-parse-special", help="treat <|special|> texts as plain text"),
    show_count: bool = typer.Option(False, "--show-count", help="print the number of tokens at the end"),
    no_escape: bool = typer.Option(False, "--no-escape", help="do not process \\n-style escapes in the prompt"),
) -> None:
    """Tokenize a prompt with a model's vocabulary."""
    from ..errors import PyllamaError
    from ..vocab import Vocab

    if model is None and hf_repo is None:
        raise typer.BadParameter("give the model: -m FILE or -hf REPO[:QUANT]", param_hint="'-m'")
    model = O.model_by_name(model, hf_repo, hf_file, hf_token)
    sources = sum(x is not None and x is not False for x in (prompt, file, stdin))
    if sources != 1:
        raise typer.BadParameter("give exactly one of -p/--prompt, -f/--file or --stdin")
    if prompt is not None:
        text = prompt.encode("utf-8", "surrogateescape")
    elif file is not None:
        text = read_file_bytes(file, "-f")  # raw bytes, as llama-tokenize: no UTF-8 check
        if text.endswith(b"\n"):  # llama.cpp's -f drops one trailing newline
            text = text[:-1]
    else:
        try:
            text = read_limited(sys.stdin.buffer, "standard input")
        except typer.BadParameter as e:
            e.param_hint = "'--stdin'"
            raise
    if not no_escape:  # llama.cpp processes escapes in -p, -f and --stdin text alike
        text = process_escapes(text)
    try:
        vocab = Vocab.from_file(model)
        add_bos = vocab.add_bos and not no_bos
        toks = vocab.tokenize(text, add_special=add_bos, parse_special=not no_parse_special)
    except (PyllamaError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    out = sys.stdout.buffer
    if ids:
        out.write(("[" + ", ".join(str(t) for t in toks) + "]\n").encode())
    else:
        for t in toks:
            out.write(b"%6d -> '" % t + vocab.token_to_piece(t, special=True) + b"'\n")
    if show_count:
        out.write(b"Total number of tokens: %d\n" % len(toks))
    out.flush()
