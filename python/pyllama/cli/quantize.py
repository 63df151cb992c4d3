"""`pyllama quantize` and `pyllama imatrix`: llama-quantize and llama-imatrix.

``pyllama quantize IN.gguf [OUT.gguf] TYPE [nthreads]`` writes the same bytes as
llama-quantize for the same arguments (every llama-quantize type name, with or without
``--imatrix``); it prints a line per tensor and the sizes before and after.
``pyllama imatrix -m MODEL -f TEXT -o FILE`` computes llama-imatrix's importance matrix.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from . import _checks as O
from . import app


def _mib(n: int) -> float:
    return n / 1024.0 / 1024.0


def _shape(ne) -> str:
    return ", ".join(f"{int(d):5d}" for d in ne)


def _ftype_names() -> list[str]:
    from .. import _core

    return [n for n, _ in _core.quantize_ftypes()]


# ggml_type_name of every ggml type (what llama-quantize's parse_ggml_type accepts).
GGML_TYPES = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
              "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8",
              "I16", "I32", "I64", "F64", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "Q1_0", "Q2_0"}


def parse_tensor_type(arg: str) -> tuple[str, str]:
    """``--tensor-type NAME_REGEX=TYPE`` as llama-quantize parses it: split at the first '=',
    the pattern lowercased, TYPE a ggml type name (any case) -> (pattern, TYPE)."""
    import re

    name, sep, ty = arg.partition("=")
    if not sep:
        raise typer.BadParameter(f"--tensor-type: malformed tensor type '{arg}' (give NAME_REGEX=TYPE)")
    if not name:
        raise typer.BadParameter(f"--tensor-type '{arg}': missing tensor name")
    if not ty:
        raise typer.BadParameter(f"--tensor-type '{arg}': missing quantization type")
    if ty.upper() not in GGML_TYPES:
        raise typer.BadParameter(f"--tensor-type '{arg}': invalid quantization type '{ty}'")
    name = name.lower()
    try:
        re.compile(name)
    except re.error as e:
        raise typer.BadParameter(f"--tensor-type '{arg}': invalid regular expression: {e}") from None
    return name, ty.upper()


def parse_tensor_type_file(path: str) -> list[tuple[str, str]]:
    """``--tensor-type-file FILE`` as llama-quantize reads it: every whitespace-separated
    word of FILE is one ``NAME_REGEX=TYPE`` (as ``--tensor-type``), in file order."""
    import re

    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise typer.BadParameter(f"--tensor-type-file: failed to open file '{path}': {e.strerror or e}") from None
    out = []
    for word in re.split(rb"[ \t\n\v\f\r]+", data):
        if word:
            try:
                text = word.decode("utf-8")
            except UnicodeDecodeError:
                raise typer.BadParameter(f"--tensor-type-file '{path}': {word!r} is not UTF-8") from None
            out.append(parse_tensor_type(text))
    return out


def _c_number(s: str, pattern: str, conv):
    """C's atol/atof: leading blanks, the longest number prefix, 0 when there is none."""
    import re

    m = re.match(r"[ \t\n\v\f\r]*(" + pattern + ")", s)
    return conv(m.group(1)) if m else conv("0")


def parse_override_kv(arg: str) -> tuple[str, str, object]:
    """``--override-kv KEY=TYPE:VALUE`` as llama.cpp's string_parse_kv_override reads it
    (TYPE int, float, bool or str; int/float values read as atol/atof do)."""
    key, sep, rest = arg.partition("=")
    if not sep or not key or len(key.encode()) >= 128:
        raise typer.BadParameter(f"--override-kv: malformed KV override '{arg}' (give KEY=TYPE:VALUE)")
    tag, colon, val = rest.partition(":")
    if not colon or tag not in ("int", "float", "bool", "str"):
        raise typer.BadParameter(f"--override-kv: invalid type for KV override '{arg}' (int, float, bool or str)")
    if tag == "int":
        v: object = _c_number(val, r"[+-]?\d+", int)
        if not -(1 << 63) <= v < (1 << 63):  # type: ignore[operator]
            raise typer.BadParameter(f"--override-kv '{arg}': integer out of range")
    elif tag == "float":
        v = _c_number(val, r"[+-]?(?:inf(?:inity)?|nan|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)", float)
    elif tag == "bool":
        if val not in ("true", "false"):
            raise typer.BadParameter(f"--override-kv: invalid boolean value for KV override '{arg}'")
        v = val == "true"
    else:
        if len(val.encode()) > 127:
            raise typer.BadParameter(f"--override-kv: malformed KV override '{arg}', value cannot exceed 127 chars")
        v = val
    return key, tag, v


def parse_prune_layers(arg: str) -> list[int]:
    """``--prune-layers L0,L1,...`` as llama-quantize reads it (std::stoi per item: leading
    blanks, a number prefix; negative or no number is an error) -> sorted, unique."""
    import re

    out = []
    for item in arg.split(","):
        m = re.match(r"[ \t\n\v\f\r]*([+-]?\d+)", item)
        if not m or int(m.group(1)) < 0 or int(m.group(1)) >= 1 << 31:
            raise typer.BadParameter(f"--prune-layers: invalid layer id '{item}'")
        out.append(int(m.group(1)))
    return sorted(set(out))


def parse_positionals(args: List[str]) -> tuple[str, Optional[str], str, Optional[int]]:
    """llama-quantize's positional arguments: ``IN [OUT] TYPE [nthreads]`` -> (in, out or
    None for ggml-model-TYPE.gguf beside IN, type name, nthreads or None)."""
    from .. import _core

    names = {n.upper() for n, _ in _core.quantize_ftypes()}
    numbers = {str(i) for _, i in _core.quantize_ftypes()}

    def is_type(s: str) -> bool:
        return s.upper() in names or s.strip() in numbers

    if len(args) < 2:
        raise typer.BadParameter("give IN.gguf [OUT.gguf] TYPE [nthreads]")
    inp = args[0]
    if is_type(args[1]):
        out, ftype, rest = None, args[1], args[2:]
    else:
        if len(args) < 3:
            raise typer.BadParameter("missing TYPE (after OUT.gguf)")
        if not is_type(args[2]):
            raise typer.BadParameter(f"invalid ftype '{args[2]}' (one of {', '.join(_ftype_names())})")
        out, ftype, rest = args[1], args[2], args[3:]
    nthreads = None
    if rest:
        if len(rest) > 1:
            raise typer.BadParameter(f"unexpected arguments after nthreads: {' '.join(rest[1:])}")
        try:
            nthreads = int(rest[0])
        except ValueError:
            raise typer.BadParameter(f"invalid nthread '{rest[0]}'") from None
    return inp, out, ftype, nthreads


@app.command("quantize", context_settings={"allow_interspersed_args": True})
def quantize_cmd(
    args: List[str] = typer.Argument(..., metavar="IN.gguf [OUT.gguf] TYPE [nthreads]",
                                     help="input model, output (default: ggml-model-TYPE.gguf beside the input), "
                                          "type (Q4_K_M, Q8_0, IQ4_XS, F16, COPY, ... or its number), threads"),
    imatrix: Optional[Path] = typer.Option(None, "--imatrix", help="importance matrix (llama-imatrix's GGUF or .dat)"),
    include_weights: List[str] = typer.Option([], "--include-weights", help="use the imatrix only for tensors whose name contains this (repeatable)"),
    exclude_weights: List[str] = typer.Option([], "--exclude-weights", help="do not use the imatrix for tensors whose name contains this (repeatable)"),
    allow_requantize: bool = typer.Option(False, "--allow-requantize", help="allow requantizing tensors that are already quantized"),
    leave_output_tensor: bool = typer.Option(False, "--leave-output-tensor", help="leave output.weight un(re)quantized"),
    pure: bool = typer.Option(False, "--pure", help="no k-quant mixes: every tensor gets the same type"),
    output_tensor_type: Optional[str] = typer.Option(None, "--output-tensor-type", help="ggml type of output.weight"),
    token_embedding_type: Optional[str] = typer.Option(None, "--token-embedding-type", help="ggml type of the token embeddings"),
    keep_split: bool = typer.Option(False, "--keep-split", help="write the same splits as the input"),
    tensor_type: List[str] = typer.Option([], "--tensor-type", metavar="NAME_REGEX=TYPE",
                                          help="quantize tensors whose name matches NAME_REGEX (lowercased; searched "
                                               "with Python's re, which agrees with llama.cpp's std::regex on the usual "
                                               "patterns) as ggml TYPE, e.g. attn_q=q8_0 or 'blk\\.[0-3]\\.ffn=q6_k'; "
                                               "repeatable, the first match wins; not for output.weight / token_embd "
                                               "when --output-tensor-type / --token-embedding-type name them"),
    tensor_type_file: Optional[Path] = typer.Option(None, "--tensor-type-file", metavar="FILE",
                                                    help="NAME_REGEX=TYPE entries as --tensor-type takes them, "
                                                         "separated by spaces or newlines, first match wins"),
    override_kv: List[str] = typer.Option([], "--override-kv", metavar="KEY=TYPE:VALUE",
                                          help="set metadata KEY in the output (TYPE int, float, bool or str; int is "
                                               "written as u32, float as f32, as llama-quantize does) and in what "
                                               "the type mixes read (block_count, head counts, expert_count); "
                                               "repeatable"),
    prune_layers: Optional[str] = typer.Option(None, "--prune-layers", metavar="L0,L1,...",
                                               help="drop these blocks (blk.N.*), renumber the rest and update "
                                                    "block_count"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print each tensor's target type and size and the "
                                                          "totals; write nothing"),
) -> None:
    """Quantize a GGUF model the way llama-quantize does (same bytes)."""
    from .. import _core
    from ..errors import PyllamaError
    from ..imatrix import quantize

    inp, out, ftype, nthreads = parse_positionals(args)
    if include_weights and exclude_weights:
        raise typer.BadParameter("--include-weights and --exclude-weights cannot be used together")
    if (include_weights or exclude_weights) and imatrix is None:
        raise typer.BadParameter("--include-weights / --exclude-weights need --imatrix")
    for flag, t in (("--output-tensor-type", output_tensor_type), ("--token-embedding-type", token_embedding_type)):
        if t is not None and t.upper() not in GGML_TYPES:
            raise typer.BadParameter(f"{flag}: invalid ggml_type '{t}'")
    if tensor_type and tensor_type_file is not None:
        # llama-quantize keeps command-line order across the two, and the first match wins;
        # that order is not known here, so the mix is refused rather than guessed
        raise typer.BadParameter("give the tensor types either with --tensor-type or in --tensor-type-file, not both")
    tensor_types = [parse_tensor_type(s) for s in tensor_type]
    if tensor_type_file is not None:
        tensor_types = parse_tensor_type_file(str(tensor_type_file))
    kv_overrides = [parse_override_kv(s) for s in override_kv]
    prune = parse_prune_layers(prune_layers) if prune_layers is not None else []
    ftype_name = next(n for n, i in _core.quantize_ftypes()
                      if n.upper() == ftype.upper() or str(i) == ftype.strip())
    if out is None and not dry_run:
        base = os.path.dirname(inp)
        out = os.path.join(base, f"ggml-model-{ftype_name}") + ("" if keep_split else ".gguf")
    threads = nthreads if nthreads is not None and nthreads > 0 else (os.cpu_count() or 1)
    what = (f"calculating quantization size for '{inp}' as {ftype_name}" if dry_run
            else f"quantizing '{inp}' to '{out}' as {ftype_name}")
    print(f"quantize: {what}" + (f" using {nthreads} threads" if nthreads and nthreads > 0 else ""), file=sys.stderr)

    def progress(t: dict) -> None:
        src, dst = t["src_type"].lower(), t["dst_type"].lower()
        line = f"[{t['index']:4d}/{t['total']:4d}] {t['name']:>36s} - [{_shape(t['shape'])}], type = {src:>6s}, "
        if src != dst and dry_run:
            line += f"size = {_mib(t['src_bytes']):8.2f} MiB -> {_mib(t['dst_bytes']):8.2f} MiB ({dst})"
        elif src != dst:
            line += f"converting to {dst} .. size = {_mib(t['src_bytes']):8.2f} MiB -> {_mib(t['dst_bytes']):8.2f} MiB"
        else:
            line += f"size = {_mib(t['dst_bytes']):8.3f} MiB"
        print(line, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    try:
        s = quantize(inp, out if out is not None else os.devnull, ftype_name, n_threads=threads, imatrix=imatrix, allow_requantize=allow_requantize,
                     leave_output_tensor=leave_output_tensor, pure=pure, output_tensor_type=output_tensor_type,
                     token_embedding_type=token_embedding_type, keep_split=keep_split,
                     include_weights=include_weights, exclude_weights=exclude_weights, tensor_types=tensor_types,
                     kv_overrides=kv_overrides, prune_layers=prune, dry_run=dry_run, progress=progress)
    except (PyllamaError, ValueError, FileNotFoundError, OSError, MemoryError) as e:
        typer.echo(f"error: failed to quantize: {e}", err=True)
        raise typer.Exit(1) from None
    dt = time.perf_counter() - t0
    for w in s["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    n = max(1, s["n_elements"])
    print(f"quantize: model size  = {_mib(s['size_before']):8.2f} MiB ({s['size_before'] * 8.0 / n:.2f} BPW)", file=sys.stderr)
    print(f"quantize: quant size  = {_mib(s['size_after']):8.2f} MiB ({s['size_after'] * 8.0 / n:.2f} BPW)", file=sys.stderr)
    if s["n_fallback"]:
        print(f"quantize: WARNING: {s['n_fallback']} of {s['n_tensors']} tensor(s) required fallback quantization",
              file=sys.stderr)
    print(f"\nquantize: quantize time = {dt * 1e3:8.2f} ms")
    if not dry_run:
        print(f"quantize: wrote {', '.join(s['outputs'])}")


def _ctx_size(ctx, param, value):
    if value < 1:
        raise typer.BadParameter(f"{value}: the context must hold at least 1 token")
    return value


@app.command("imatrix")
def imatrix_cmd(
    model: Optional[Path] = typer.Option(None, "-m", "--model", help="GGUF file (default: SmolLM2-135M-Instruct)"),
    hf_repo: Optional[str] = O.opt_hf_repo(),
    hf_file: Optional[str] = O.opt_hf_file(),
    hf_token: Optional[str] = O.opt_hf_token(),
    file: Path = typer.Option(..., "-f", "--file", help="text to run through the model (UTF-8, at most 256 MiB)"),
    output: Path = typer.Option(Path("imatrix.gguf"), "-o", "--output-file", help="where to write the importance matrix"),
    ctx_size: int = typer.Option(512, "-c", "--ctx-size", callback=_ctx_size, help="tokens per chunk"),
    batch_size: int = typer.Option(2048, "-b", "--batch-size", callback=O.BATCH, help="logical batch size"),
    ubatch_size: int = typer.Option(512, "-ub", "--ubatch-size", callback=O.UBATCH, help="physical batch size (0 = -b)"),
    chunks: int = typer.Option(-1, "--chunks", help="process at most this many chunks (< 0 = all)"),
    process_output: bool = typer.Option(False, "--process-output", help="collect data for output.weight too"),
    threads: Optional[int] = typer.Option(None, "-t", "--threads", help="(<= 0 = the default)"),
    load_mode: str = typer.Option("auto", "-lm", "--load-mode", callback=O.load_mode),
) -> None:
    """Compute an importance matrix the way llama-imatrix does (GGUF format)."""
    from ..errors import PyllamaError
    from ..imatrix import compute_imatrix, save_imatrix
    from .generate import open_session

    if chunks == 0:
        raise typer.BadParameter("--chunks 0 processes nothing: give a count >= 1, or -1 for all")
    text = O.read_text_file(file, "-f")
    if text.endswith("\n"):  # llama.cpp's -f drops one trailing newline
        text = text[:-1]
    n_seq = max(1, batch_size // ctx_size)
    if not (batch_size < ctx_size or batch_size % ctx_size == 0):
        raise typer.BadParameter(f"-b {batch_size} must be below -c {ctx_size} or a multiple of it")
    n_kv = n_seq * ctx_size
    n_batch = min(batch_size, n_kv)
    path = O.model_by_name(model, hf_repo, hf_file, hf_token)
    try:
        from ..generation import Session, load_model, progress_bar, resolve_model_path

        p = resolve_model_path(path, progress=True)
        m = load_model(p, load_mode=load_mode, progress=progress_bar(f"loading {p.name}"))
        params = {"n_ctx": n_kv, "n_batch": n_batch, "n_ubatch": min(ubatch_size or n_batch, n_batch),
                  "n_seq_max": n_seq, "no_perf": False}
        t = O.threads(threads)
        if t is not None:
            params["n_threads"] = params["n_threads_batch"] = t
        sess = Session(m, **params)
        v = sess.vocab
        tokens = sess.tokenize(text, add_special=True, parse_special=False)
        print(f"compute_imatrix: computing over {len(tokens) // ctx_size if chunks < 0 else min(chunks, len(tokens) // ctx_size)}"
              f" chunks, n_ctx={ctx_size}, batch_size={n_batch}, n_seq={n_seq}", file=sys.stderr)

        def on_chunk(i, n, dt):
            print(f"[{i + 1}/{n}] {dt:.2f} s", file=sys.stderr, flush=True)

        entries, n_chunk = compute_imatrix(sess.ctx, tokens, ctx_size, n_batch, chunks, add_bos=bool(v.add_bos),
                                           bos=int(v.bos), n_seq=n_seq, process_output=process_output,
                                           on_chunk=on_chunk)
        save_imatrix(output, entries, datasets=[str(file)], chunk_count=n_chunk, chunk_size=ctx_size)
    except (BrokenPipeError, typer.Exit):
        raise
    except (PyllamaError, ValueError, FileNotFoundError, OSError, MemoryError) as e:
        typer.echo(f"\nerror: {e}", err=True)
        raise typer.Exit(1) from None
    print(f"imatrix: stored {len(entries)} entries after {n_chunk} chunks in {output}")
