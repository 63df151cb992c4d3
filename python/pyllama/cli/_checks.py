"""Flag and input-file checks shared by the subcommands: a bad value is a usage error that
names the flag (exit 2), never a traceback or a silently odd run.

Numbers follow llama.cpp's common/arg.cpp where it defines a meaning (``-t <= 0``: the
default thread count; ``--temp < 0``: greedy; ``--top-k <= 0``: off; ``-ub 0``: same as
``-b``) and are refused where it would crash or compute nonsense (``-b 0``, ``-c < 0``,
NaN or infinite floats, probabilities outside [0, 1], ``--repeat-penalty <= 0``).
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Callable, Iterable, Optional

import typer

# The most -f/--file (and --stdin) will read: far above any prompt or perplexity corpus
# pyllama can tokenize in reasonable time, low enough that an endless stream such as
# /dev/zero ends in a message instead of a MemoryError.
MAX_TEXT_BYTES = 256 * 2**20
_CHUNK = 2**20
FLT_MAX = 3.4028234663852886e38


def number(lo: Optional[float] = None, hi: Optional[float] = None, *, lo_open: bool = False,
           what: str = "") -> Callable:
    """Option callback for a float flag: finite, and within [lo, hi] (lo excluded when
    ``lo_open``). ``what`` names the range in the message ("a probability")."""

    def check(ctx, param, value):
        if value is None:
            return value
        if not math.isfinite(value):
            raise typer.BadParameter(f"{value} is not a finite number")
        if abs(value) > FLT_MAX:  # the samplers compute in float32, as llama.cpp's std::stof
            raise typer.BadParameter(f"{value:g} is out of the float32 range")
        low_bad = lo is not None and (value <= lo if lo_open else value < lo)
        if low_bad or (hi is not None and value > hi):
            if lo is not None and hi is not None:
                rng = f"in [{lo:g}, {hi:g}]"
            elif lo is not None:
                rng = f"> {lo:g}" if lo_open else f">= {lo:g}"
            else:
                rng = f"<= {hi:g}"
            raise typer.BadParameter(f"{value:g} is out of range: it must be {rng}" + (f" ({what})" if what else ""))
        return value

    return check


def integer(lo: Optional[int] = None, hi: Optional[int] = None, note: str = "") -> Callable:
    """Option callback for an int flag: within [lo, hi]; ``note`` says what the special
    values mean ("-1 = random")."""

    def check(ctx, param, value):
        if value is None:
            return value
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            if lo is not None and hi is not None:
                rng = f"in {lo}..{hi}"
            elif lo is not None:
                rng = f">= {lo}"
            else:
                rng = f"<= {hi}"
            raise typer.BadParameter(f"{value} is out of range: it must be {rng}" + (f" ({note})" if note else ""))
        return value

    return check


def one_of(choices: Iterable[str], *, lower: bool = True) -> Callable:
    """Option callback: the value must be one of ``choices`` (compared lower-cased)."""
    choices = tuple(choices)

    def check(ctx, param, value):
        if value is None:
            return value
        v = value.lower() if lower else value
        if v not in choices:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(choices)}")
        return v

    return check


def load_mode(ctx, param, value):
    from ..model import LOAD_MODES

    return one_of(LOAD_MODES)(ctx, param, value)


def kv_cache_type(ctx, param, value):
    """llama.cpp's -ctk/-ctv names (common/arg.cpp's kv_cache_types); whether this build
    implements a listed type is the library's answer when the context is made."""
    from ..context import GGML_TYPE_NAMES

    return one_of(GGML_TYPE_NAMES.values())(ctx, param, value)


def threads(value: Optional[int]) -> Optional[int]:
    """llama.cpp's -t / -tb: a value <= 0 means the default thread count (0 here)."""
    return None if value is None else max(value, 0)


def read_limited(fh, name: str, limit: int = MAX_TEXT_BYTES) -> bytes:
    """All of binary stream ``fh``, read in bounded chunks; a usage-style error when it
    holds more than ``limit`` bytes (an endless device such as /dev/zero included)."""
    chunks = []
    n = 0
    while True:
        b = fh.read(min(_CHUNK, limit + 1 - n))
        if not b:
            break
        chunks.append(b)
        n += len(b)
        if n > limit:
            raise typer.BadParameter(f"{name}: more than {limit // 2**20} MiB of input (the most pyllama reads); "
                                     "is it an endless stream such as /dev/zero?")
    return b"".join(chunks)


def read_file_bytes(path: Path, flag: str = "-f", limit: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of ``path`` for option ``flag``: a usage error naming the file when it is
    missing, a directory, unreadable or larger than ``limit``."""
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            if stat.S_ISREG(st.st_mode) and st.st_size > limit:
                raise typer.BadParameter(f"{path} is {st.st_size / 2**20:.0f} MiB, over the {limit // 2**20} MiB "
                                         "that pyllama reads from a file", param_hint=f"'{flag}'")
            try:
                return read_limited(fh, str(path), limit)
            except typer.BadParameter as e:
                e.param_hint = f"'{flag}'"
                raise
    except OSError as e:
        raise typer.BadParameter(f"cannot read {path}: {e.strerror or e}", param_hint=f"'{flag}'") from None


def utf8_text(data: bytes, name: str, flag: Optional[str] = "-f") -> str:
    """``data`` decoded as UTF-8, or a usage error naming ``name`` and the byte offset of
    the first invalid sequence.

    An error rather than errors="replace": llama.cpp hands the raw bytes to its byte-level
    tokenizer, so replacing them with U+FFFD would silently tokenize (and score) different
    text than llama.cpp does, and a file that is not UTF-8 is nearly always the wrong file
    or a legacy encoding that one ``iconv`` fixes. (``pyllama tokenize`` keeps the raw bytes,
    as llama-tokenize does: showing byte-level tokenization is its job.)"""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = data[e.start:e.start + 1].hex()
        raise typer.BadParameter(
            f"{name} is not UTF-8 text: invalid byte 0x{bad} at byte offset {e.start} ({e.reason}); "
            "convert it first, e.g. iconv -f latin1 -t utf-8", param_hint=f"'{flag}'" if flag else None) from None


def read_text_file(path: Path, flag: str = "-f") -> str:
    return utf8_text(read_file_bytes(path, flag), str(path), flag)


# The callbacks of the flags several subcommands share.
CTX_SIZE = integer(0, note="0 = from the model")
BATCH = integer(1)
UBATCH = integer(0, note="0 = same as -b")
SEED = integer(-1, 2**32 - 1, note="-1 = random")
FINITE = number()
PROBABILITY = number(0, 1)


def repeat_penalty(ctx, param, value):
    """llama.cpp's check: finite, > 0, and 1/value finite in float32 (the penalty divides)."""
    value = number(0, lo_open=True)(ctx, param, value)
    if value is not None and 1.0 / value > FLT_MAX:
        raise typer.BadParameter(f"{value:g} is too small: 1/{value:g} overflows float32")
    return value


def flash_attn(ctx, param, value):
    """-fa: llama.cpp's on / off / auto (and its other spellings: enabled / disabled, true /
    false, 1 / 0 / -1). On runs llama.cpp's flash-attention kernel, off its mul_mat /
    soft_max / mul_mat path (both reproduced in ops/attention.rs); auto is on, as on
    llama.cpp's CPU backend. A quantized V cache needs it on (or auto)."""
    if value is None:
        return value
    v = value.strip().lower()
    if v not in FLASH_ATTN_TYPES:
        raise typer.BadParameter(f"--flash-attn expects on, off or auto, got {value!r}")
    return v


# ---- option definitions shared by generate and chat -------------------------------------
#
# One definition per flag, so both subcommands spell, check and document it alike (and a
# flag added to one cannot be missing from the other, where click would then read ``-ngl``
# as ``-n gl``). Each call makes a fresh typer.Option: one per command parameter.

def opt_ctx_size():
    return typer.Option(4096, "-c", "--ctx-size", callback=CTX_SIZE, help="context size (0 = from the model, capped at 4096)")


def opt_batch_size():
    return typer.Option(2048, "-b", "--batch-size", callback=BATCH, help="logical batch size")


def opt_ubatch_size():
    return typer.Option(512, "-ub", "--ubatch-size", callback=UBATCH, help="physical batch size (0 = -b)")


def opt_threads():
    return typer.Option(None, "-t", "--threads", help="threads for generation (<= 0 = the default)")


def opt_threads_batch():
    return typer.Option(None, "-tb", "--threads-batch", help="threads for prompt processing (<= 0 = the default)")


def gpu_layers(ctx, param, value):
    """-ngl (any integer, as llama.cpp: negative = all). Without the GPU backend a request
    for GPU layers says once, on stderr, that every layer runs on the CPU; with it the
    model load offloads them (and says so itself when no adapter is usable)."""
    if value is None:
        return value
    from .. import gpu

    if value != 0 and not gpu.built():
        typer.echo(f"warning: -ngl: {gpu.why_not()}; every layer runs on the CPU", err=True)
    return value


def opt_gpu_layers():
    return typer.Option(0, "-ngl", "--gpu-layers", "--n-gpu-layers", callback=gpu_layers,
                        help="layers on the GPU, the output layer counting as the topmost (negative: all); "
                             "needs the GPU backend and an adapter (PYLLAMA_GPU=cpu-ok admits a software one)")


def split_mode(ctx, param, value):
    """-sm: llama.cpp's names (none, layer, row, tensor)."""
    if value is None:
        return value
    v = value.strip().lower()
    if v not in ("none", "layer", "row", "tensor"):
        raise typer.BadParameter(f"expects none, layer, row or tensor, got {value!r}")
    return v


def parse_tensor_split(value: str) -> list[float]:
    """-ts "3,1" or "3/1" (llama.cpp's common/arg.cpp splits on , and /): one finite share
    >= 0 per adapter, at most llama_max_devices (16)."""
    import re

    parts = [p for p in re.split(r"[,/]+", value.strip()) if p != ""]
    if not parts:
        raise typer.BadParameter(f"expects proportions such as 3,1, got {value!r}")
    if len(parts) > 16:
        raise typer.BadParameter(f"got {len(parts)} proportions, but at most 16 devices (llama_max_devices)")
    out = []
    for p in parts:
        try:
            x = float(p)
        except ValueError:
            raise typer.BadParameter(f"{p!r} is not a number (expected proportions such as 3,1)") from None
        if not math.isfinite(x) or x < 0:
            raise typer.BadParameter(f"{p!r}: each proportion must be a finite number >= 0")
        out.append(x)
    return out


def tensor_split(ctx, param, value):
    if value is None:
        return value
    return parse_tensor_split(value)


def opt_split_mode():
    return typer.Option("layer", "-sm", "--split-mode", callback=split_mode,
                        help="how the GPU layers are split across adapters: none (one adapter, -mg), layer (the "
                             "default: whole layers and their KV cache spread by -ts); row and tensor are refused "
                             "(the wgpu backend cannot split a matrix)")


def opt_tensor_split():
    return typer.Option(None, "-ts", "--tensor-split", metavar="N0,N1,...", callback=tensor_split,
                        help="each adapter's share of the GPU layers with -sm layer, e.g. 3,1 (default: equal)")


def opt_main_gpu():
    return typer.Option(0, "-mg", "--main-gpu", metavar="INDEX", callback=integer(0),
                        help="the adapter to use with -sm none (index into `pyllama info`'s usable adapters)")


def opt_no_kv_offload():
    return typer.Option(False, "-nkvo", "--no-kv-offload",
                        help="keep the KV cache and attention of GPU-offloaded layers on the CPU (llama.cpp's "
                             "offload_kqv = false)")


def opt_load_mode():
    return typer.Option("auto", "-lm", "--load-mode", callback=load_mode, help="auto (read into memory on huge pages where Linux has them and the model fits, else "
                             "mmap), none, mmap, mlock, mmap+mlock, dio")


def opt_cache_type_k():
    return typer.Option("f16", "-ctk", "--cache-type-k", callback=kv_cache_type, help="K cache type")


def opt_cache_type_v():
    return typer.Option("f16", "-ctv", "--cache-type-v", callback=kv_cache_type, help="V cache type")


# -fa words (common_arg_utils is_truthy / is_falsey / is_autoy) -> llama_context_params.flash_attn_type
FLASH_ATTN_TYPES = {"on": 1, "enabled": 1, "true": 1, "1": 1, "off": 0, "disabled": 0, "false": 0, "0": 0,
                    "auto": -1, "-1": -1}


def opt_flash_attn():
    return typer.Option("auto", "-fa", "--flash-attn", callback=flash_attn,
                        help="flash attention: on, off (llama.cpp's unfused path; a quantized V cache needs on) or "
                             "auto (on)")


def opt_temp():
    return typer.Option(0.8, "--temp", callback=FINITE, help="temperature (<= 0: greedy)")


def opt_top_k():
    return typer.Option(40, "--top-k", help="top-k (<= 0 = off)")


def opt_top_p():
    return typer.Option(0.95, "--top-p", callback=PROBABILITY, help="top-p, in [0, 1] (1.0 = off)")


def opt_min_p():
    return typer.Option(0.05, "--min-p", callback=PROBABILITY, help="min-p, in [0, 1] (0.0 = off)")


def opt_typical():
    return typer.Option(1.0, "--typical", "--typical-p", callback=PROBABILITY,
                        help="locally typical p, in [0, 1] (1.0 = off)")


def opt_repeat_penalty():
    return typer.Option(1.0, "--repeat-penalty", callback=repeat_penalty, help="repeat penalty, > 0 (1.0 = off)")


def opt_repeat_last_n():
    return typer.Option(64, "--repeat-last-n", callback=integer(0), help="tokens the penalties look back at (0 = off)")


def opt_presence_penalty():
    return typer.Option(0.0, "--presence-penalty", callback=FINITE)


def opt_frequency_penalty():
    return typer.Option(0.0, "--frequency-penalty", callback=FINITE)


def opt_mirostat():
    return typer.Option(0, "--mirostat", callback=integer(0, 2), help="0 off, 1 mirostat, 2 mirostat 2.0")


def opt_mirostat_lr():
    return typer.Option(0.1, "--mirostat-lr", callback=FINITE, help="mirostat eta")


def opt_mirostat_ent():
    return typer.Option(5.0, "--mirostat-ent", callback=FINITE, help="mirostat tau")


def opt_seed():
    return typer.Option(-1, "-s", "--seed", callback=SEED, help="RNG seed, 0..4294967295 (-1 = random)")


# -- LoRA adapters and control vectors (llama.cpp's common/arg.cpp flags and formats) --------

def opt_lora():
    return typer.Option(None, "--lora", metavar="FNAME",
                        help="LoRA adapter (repeatable; comma-separated values load several)")


def opt_lora_scaled():
    return typer.Option(None, "--lora-scaled", metavar="FNAME:SCALE,...",
                        help="LoRA adapter with a scale (repeatable; format FNAME:SCALE, comma-separated)")


def opt_control_vector():
    return typer.Option(None, "--control-vector", metavar="FNAME",
                        help="control vector (repeatable; comma-separated values add several)")


def opt_control_vector_scaled():
    return typer.Option(None, "--control-vector-scaled", metavar="FNAME:SCALE,...",
                        help="control vector with a scale (repeatable; format FNAME:SCALE, comma-separated)")


def opt_control_vector_layer_range():
    return typer.Option(None, "--control-vector-layer-range", metavar="START END",
                        help="layers the control vectors apply to, both inclusive (default: 1 to the last)")


def adapter_files(plain: Optional[list], scaled: Optional[list], flag: str) -> list:
    """[(path, scale)] from repeated `--lora FNAME[,FNAME]` (scale 1) and
    `--lora-scaled FNAME:SCALE[,...]` values, in the order llama.cpp's parser adds them
    (all the plain ones, then the scaled ones, as separate options)."""
    out = []
    for v in plain or []:
        out += [(p, 1.0) for p in str(v).split(",") if p]
    for v in scaled or []:
        for item in str(v).split(","):
            path, sep, scale = item.rpartition(":")
            if not sep or not path:
                raise typer.BadParameter(f"{item!r}: expected FNAME:SCALE", param_hint=f"'{flag}-scaled'")
            try:
                s = float(scale)
            except ValueError:
                raise typer.BadParameter(f"{item!r}: SCALE {scale!r} is not a number",
                                         param_hint=f"'{flag}-scaled'") from None
            if not math.isfinite(s):
                raise typer.BadParameter(f"{item!r}: SCALE must be finite", param_hint=f"'{flag}-scaled'")
            out.append((path, s))
    return out


# -- models by name: -hf REPO[:QUANT] / --hf-file / --hf-token (llama.cpp's flags) ----------

def opt_hf_repo():
    return typer.Option(None, "-hf", "-hfr", "--hf-repo", metavar="USER/MODEL[:QUANT]",
                        help="Hugging Face repo (needs huggingface_hub); quant is case-insensitive, default "
                             "Q4_K_M, else Q8_0, else the first GGUF file; fetched once into the Hub cache")


def opt_hf_file():
    return typer.Option(None, "-hff", "--hf-file", metavar="FILE",
                        help="file in the -hf repo (overrides the quant)")


def opt_hf_token():
    return typer.Option(None, "-hft", "--hf-token", metavar="TOKEN",
                        help="Hugging Face access token (default: HF_TOKEN or the saved login)")


def model_by_name(model: Optional[Path], hf_repo: Optional[str], hf_file: Optional[str],
                  hf_token: Optional[str]) -> Optional[Path]:
    """-m, or the file -hf/--hf-file name (fetched into the Hub cache when missing), or None
    for the default model. Conflicting or incomplete flags are usage errors; a repo or file
    that cannot be found or fetched is a one-line error (exit 1)."""
    if hf_repo is None:
        if hf_file is not None:
            raise typer.BadParameter("--hf-file needs -hf USER/MODEL", param_hint="'--hf-file'")
        if hf_token is not None:
            raise typer.BadParameter("--hf-token is only used with -hf", param_hint="'--hf-token'")
        return model
    if model is not None:
        raise typer.BadParameter("give the model once: -m FILE or -hf REPO, not both", param_hint="'-hf'")
    from ..hub import HubError, hf_model

    try:
        return hf_model(hf_repo, hf_file, token=hf_token)
    except HubError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


# -- llama.cpp's common flags: help, version, logging, colour ------------------------------

def version_line() -> str:
    """``--version``: llama.cpp's two lines (``version: N (build ...)``, ``built with ...``)
    with pyllama's version and the extension's build (``pyllama info`` has the rest)."""
    from .. import __version__, _core

    b = dict(getattr(_core, "BUILD", {}))
    return (f"version: {__version__} (pyllama, {b.get('profile', '?')} build)\n"
            f"built for {b.get('target_os', '?')} {b.get('target_arch', '?')} (abi3 {b.get('abi3', '?')}+)")


def _print_version(ctx, param, value):
    if value and not ctx.resilient_parsing:
        typer.echo(version_line())
        raise typer.Exit()
    return value


def opt_version():
    return typer.Option(False, "--version", callback=_print_version, is_eager=True, expose_value=False,
                        help="print the version and build, then exit")


def opt_verbose():
    return typer.Option(False, "-v", "--verbose", "--log-verbose",
                        help="debug logging, and a traceback with an error (default: one error line)")


def opt_log_disable():
    return typer.Option(False, "--log-disable",
                        help="no log output on stderr (progress, timings, warnings); errors still print")


def _current_click_context():
    """The running command's click context: typer's vendored click (newer typer) or click."""
    import importlib

    for name in ("typer._click.globals", "click"):
        try:
            ctx = importlib.import_module(name).get_current_context(silent=True)
        except (ImportError, AttributeError):
            continue
        if ctx is not None:
            return ctx
    return None


def setup_logging(verbose: bool, log_disable: bool) -> None:
    """-v: every logger at DEBUG on stderr; --log-disable: none at all (llama.cpp's
    common_log_pause). Errors are not logs: they print either way. The logging state is
    restored when the command ends (the app may run in a process that goes on, e.g. tests
    or a program that calls it)."""
    import logging

    if not (log_disable or verbose):
        return
    root = logging.getLogger()
    saved = (root.level, list(root.handlers), logging.root.manager.disable)

    def restore() -> None:
        for h in root.handlers:
            if h not in saved[1]:
                h.close()
        root.handlers[:] = saved[1]
        root.setLevel(saved[0])
        logging.disable(saved[2])

    ctx = _current_click_context()
    if ctx is not None:
        ctx.call_on_close(restore)
    if log_disable:
        logging.disable(logging.CRITICAL)
    else:
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s", force=True)


def fail(e: BaseException, verbose: bool) -> "typer.Exit":
    """An error during a run: with -v the traceback (re-raised by the caller), else one line
    ``error: ...`` on stderr and exit 1."""
    if verbose:
        raise e
    msg = str(e) or type(e).__name__
    typer.echo(f"error: {msg.splitlines()[0] if msg.strip() else type(e).__name__}", err=True)
    return typer.Exit(1)


TRUTHY, FALSEY, AUTOY = ("on", "enabled", "true", "1"), ("off", "disabled", "false", "0"), ("auto", "-1")


def color_mode(ctx, param, value):
    """--color on|off|auto (llama.cpp's is_truthy / is_falsey / is_autoy spellings)."""
    if value is None:
        return value
    v = value.lower()
    if v in TRUTHY:
        return "on"
    if v in FALSEY:
        return "off"
    if v in AUTOY:
        return "auto"
    raise typer.BadParameter(f"unknown value {value!r}: expected on, off or auto")


def use_color(mode: str) -> bool:
    """--color: on / off, or for auto llama.cpp's tty_can_use_colors (not with NO_COLOR set or
    TERM=dumb) except that stdout itself must be a terminal: the coloured text goes to stdout,
    and llama.cpp's "stdout or stderr" would write escapes into `pyllama chat > file`."""
    import sys

    if mode != "auto":
        return mode == "on"
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("TERM") == "dumb":
        return False

    def tty(f):
        try:
            return f.isatty()
        except (AttributeError, ValueError):
            return False

    return tty(sys.stdout)


def opt_color():
    return typer.Option("auto", "-co", "--color", metavar="[on|off|auto]", callback=color_mode,
                        help="colour the prompt and user input: on, off, or auto (when stdout is a terminal, "
                             "NO_COLOR is unset and TERM is not dumb)")


# -- escapes and reverse prompts ------------------------------------------------------------

def _strtol2(x: bytes) -> Optional[int]:
    """strtol(x, &end, 16) over two characters when it consumes both, else None: two hex
    digits, or C whitespace / a sign before one hex digit ("\\x 1", "\\x-1")."""
    hexdig = b"0123456789abcdefABCDEF"
    a, b = x[0], x[1]
    if b not in hexdig:
        return None
    if a in hexdig:
        return int(x, 16)
    if a in b" \t\n\v\f\r" or a == ord("+"):
        return int(x[1:], 16)
    if a == ord("-"):
        return -int(x[1:], 16)
    return None


def process_escapes(s: str) -> str:
    """llama.cpp's string_process_escapes, exactly: \\n \\r \\t \\' \\" \\\\ and \\xNN (two hex
    digits: a byte); any other backslash pair, a lone \\x and a trailing backslash are kept
    as written. A \\xNN run that is not UTF-8 is decoded with U+FFFD replacements."""
    if "\\" not in s:
        return s
    src = s.encode("utf-8", "surrogatepass")
    out = bytearray()
    i, n = 0, len(src)
    simple = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("'"): b"'", ord('"'): b'"', ord("\\"): b"\\"}
    while i < n:
        c = src[i]
        if c == 0x5C and i + 1 < n:
            i += 1
            e = src[i]
            if e in simple:
                out += simple[e]
            elif e == ord("x") and i + 2 < n and _strtol2(src[i + 1:i + 3]) is not None:
                out.append(_strtol2(src[i + 1:i + 3]) & 0xFF)  # char(val): -1 is 0xFF
                i += 2
            else:
                out += b"\\" + bytes([e])
        else:
            out.append(c)
        i += 1
    return out.decode("utf-8", "replace")


def opt_escape():
    return typer.Option(True, "--escape/--no-escape", "-e",
                        help="process escapes (\\n, \\r, \\t, \\', \\\", \\\\, \\xNN) in the prompt, system prompt, "
                             "reverse prompts and DRY sequence breakers")


def opt_reverse_prompt():
    return typer.Option(None, "-r", "--reverse-prompt", metavar="PROMPT",
                        help="stop generating at PROMPT (repeatable); in a chat, the reply ends there")


class ReversePrompts:
    """-r: whether the text so far ends with a reverse prompt, as llama-completion checks:
    the last 32 tokens' text searched for each prompt from len(prompt) + ``padding`` chars
    before its end (padding 2 when not interactive: the prompt may be tokenized together
    with a character or two after it)."""

    def __init__(self, prompts: Optional[list], padding: int = 2):
        self.prompts = [p for p in (prompts or []) if p]
        self.padding = padding

    def __bool__(self) -> bool:
        return bool(self.prompts)

    def found(self, tail: str) -> Optional[str]:
        for p in self.prompts:
            start = max(len(tail) - len(p) - self.padding, 0)
            if tail.find(p, start) >= 0:
                return p
        return None


# -- sampling: the rest of common_params_sampling's flags ----------------------------------

# llama.cpp's common_sampler_types_from_names: canonical names, kebab-case and no-dash
# aliases, and nucleus / temp / typ; -> SamplerParams.samplers names
_SAMPLER_CANON = ("dry", "top_k", "top_p", "top_n_sigma", "typ_p", "min_p", "temperature", "xtc", "penalties")
_SAMPLER_ALIASES = {**{c: c for c in _SAMPLER_CANON},
                    **{c.replace("_", "-"): c for c in _SAMPLER_CANON if "_" in c},
                    **{c.replace("_", ""): c for c in _SAMPLER_CANON if "_" in c},
                    "nucleus": "top_p", "temp": "temperature", "typ": "typ_p"}
# common_sampler_type_to_chr
_SAMPLER_CHARS = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p",
                  "t": "temperature", "x": "xtc", "e": "penalties"}
_UNSUPPORTED = {"infill": "infill", "adaptive_p": "adaptive_p", "adaptive-p": "adaptive_p",
                "adaptivep": "adaptive_p", "i": "infill", "a": "adaptive_p"}


def samplers_arg(ctx, param, value):
    """--samplers "a;b;c" (llama.cpp's names and aliases, case-insensitive) -> SamplerParams
    names. llama.cpp warns and skips an unknown name; here it is a usage error."""
    if value is None:
        return value
    out = []
    for name in value.split(";"):
        low = name.lower()
        if low in _SAMPLER_ALIASES:
            out.append(_SAMPLER_ALIASES[low])
        elif low in _UNSUPPORTED:
            raise typer.BadParameter(f"the {_UNSUPPORTED[low]} sampler is not supported by pyllama")
        else:
            raise typer.BadParameter(f"unknown sampler {name!r} (known: {', '.join(_SAMPLER_CANON)})")
    return out


def sampling_seq_arg(ctx, param, value):
    """--sampling-seq "edskypmxt": one character per sampler (common_sampler_type_to_chr)."""
    if value is None:
        return value
    out = []
    for c in value:
        if c in _SAMPLER_CHARS:
            out.append(_SAMPLER_CHARS[c])
        elif c in _UNSUPPORTED:
            raise typer.BadParameter(f"{c!r}: the {_UNSUPPORTED[c]} sampler is not supported by pyllama")
        else:
            raise typer.BadParameter(f"unknown sampler character {c!r} (known: {''.join(_SAMPLER_CHARS)})")
    return out


def logit_bias_arg(ctx, param, values):
    """-l TOKEN_ID(+/-)BIAS, repeatable -> [(token, bias)], as llama.cpp's parser: an integer,
    a sign, then a number (``15043-inf`` bans token 15043). The token's range is checked
    against the model's vocabulary when the sampler is built."""
    import re

    if not values:
        return []
    out = []
    for v in values:
        m = re.fullmatch(r"\s*([+-]?\d+)\s*([+-])\s*(\S.*?)\s*", v)
        try:
            bias = float(m.group(3)) if m else math.nan
        except ValueError:
            bias = math.nan
        if m is None or math.isnan(bias):
            raise typer.BadParameter(f"{v!r}: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS, e.g. 15043+1 or 15043-inf")
        out.append((int(m.group(1)), -bias if m.group(2) == "-" else bias))
    return out


def opt_samplers():
    return typer.Option(None, "--samplers", metavar="SAMPLERS", callback=samplers_arg,
                        help="samplers in order, separated by ';' (default: penalties;dry;top_n_sigma;top_k;typ_p;"
                             "top_p;min_p;xtc;temperature)")


def opt_sampling_seq():
    return typer.Option(None, "--sampling-seq", "--sampler-seq", metavar="SEQUENCE", callback=sampling_seq_arg,
                        help="the sampler order as characters (default: edskypmxt)")


def opt_dry_multiplier():
    return typer.Option(0.0, "--dry-multiplier", callback=FINITE, help="DRY multiplier (0.0 = off)")


def _dry_base(ctx, param, value):
    # llama.cpp keeps the default for a base < 1 (it would reward repetition)
    value = FINITE(ctx, param, value)
    return 1.75 if value < 1.0 else value


def opt_dry_base():
    return typer.Option(1.75, "--dry-base", callback=_dry_base, help="DRY base (a value < 1 keeps 1.75)")


def opt_dry_allowed_length():
    return typer.Option(2, "--dry-allowed-length", help="DRY: repeats longer than this are penalized")


def opt_dry_penalty_last_n():
    return typer.Option(64, "--dry-penalty-last-n", callback=integer(0),
                        help="DRY: tokens looked back at (0 = off)")


def opt_dry_sequence_breaker():
    return typer.Option(None, "--dry-sequence-breaker", metavar="STRING",
                        help="DRY sequence breaker (repeatable; replaces the defaults '\\n', ':', '\"', '*'; "
                             "'none' = no breakers)")


def dry_breakers(values: Optional[list], escape: bool) -> Optional[list]:
    """--dry-sequence-breaker values as llama.cpp: the first one clears the defaults, 'none'
    clears the list; None when not given (the defaults)."""
    if not values:
        return None
    out: list = []
    for v in values:
        if v == "none":
            out = []
        else:
            out.append(process_escapes(v) if escape else v)
    return out


def opt_xtc_probability():
    return typer.Option(0.0, "--xtc-probability", callback=PROBABILITY, help="XTC probability (0.0 = off)")


def opt_xtc_threshold():
    return typer.Option(0.1, "--xtc-threshold", callback=FINITE, help="XTC threshold (> 0.5 = off)")


def opt_top_nsigma():
    return typer.Option(-1.0, "--top-nsigma", "--top-n-sigma", callback=FINITE, help="top-n-sigma (<= 0 = off)")


def opt_logit_bias():
    return typer.Option(None, "-l", "--logit-bias", metavar="TOKEN_ID(+/-)BIAS", callback=logit_bias_arg,
                        help="add BIAS to a token's logit (repeatable), e.g. 15043+1, 15043-inf bans it")


def opt_dynatemp_range():
    return typer.Option(0.0, "--dynatemp-range", callback=FINITE, help="dynamic temperature range (0.0 = off)")


def opt_dynatemp_exp():
    return typer.Option(1.0, "--dynatemp-exp", callback=FINITE, help="dynamic temperature exponent")


def opt_min_keep():
    return typer.Option(0, "--min-keep", callback=integer(0),
                        help="candidates top-p, min-p, typical and XTC keep at least (0 = 1)")


# -- grammars (llama.cpp's --grammar / --grammar-file / -j / -jf) ---------------------------

def _gbnf(ctx, param, value):
    if value is None:
        return value
    return check_grammar(value, f"'{param.opts[0]}'" if param.opts else None)


def _gbnf_file(ctx, param, value):
    if value is None:
        return value
    flag = param.opts[0] if param.opts else "--grammar-file"
    return check_grammar(read_text_file(Path(value), flag), f"'{flag}'")


def _schema(ctx, param, value):
    if value is None:
        return value
    flag = param.opts[-1] if param.opts else "--json-schema"
    return schema_grammar(value, f"'{flag}'")


def _schema_file(ctx, param, value):
    if value is None:
        return value
    flag = param.opts[-1] if param.opts else "--json-schema-file"
    return schema_grammar(read_text_file(Path(value), flag), f"'{flag}'")


def check_grammar(text: str, hint: Optional[str]):
    """GBNF text -> LlamaGrammar (parsed now), or a usage error with the parser's message
    (line, column, what was expected)."""
    from ..grammar import GrammarError
    from ..llama_grammar import LlamaGrammar

    try:
        return LlamaGrammar.from_string(text, verbose=False)
    except GrammarError as e:
        raise typer.BadParameter(" ".join(str(e).split()), param_hint=hint) from None


def schema_grammar(text: str, hint: Optional[str]):
    """A JSON schema's text -> LlamaGrammar (pyllama.json_schema), or a usage error."""
    import json
    import warnings

    from ..grammar import GrammarError
    from ..llama_grammar import LlamaGrammar

    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise typer.BadParameter(f"not JSON: {e}", param_hint=hint) from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # keywords the converter skips, as llama.cpp's
            return LlamaGrammar.from_json_schema(schema, verbose=False)
    except (GrammarError, ValueError, TypeError) as e:
        raise typer.BadParameter(" ".join(str(e).split()), param_hint=hint) from None


def opt_grammar():
    return typer.Option(None, "--grammar", metavar="GRAMMAR", callback=_gbnf,
                        help="GBNF grammar the output must follow (llama.cpp's grammars/)")


def opt_grammar_file():
    return typer.Option(None, "--grammar-file", metavar="FNAME", callback=_gbnf_file, help="file to read the grammar from")


def opt_json_schema():
    return typer.Option(None, "-j", "--json-schema", metavar="SCHEMA", callback=_schema,
                        help="JSON schema the output must follow, e.g. '{\"type\": \"object\"}'")


def opt_json_schema_file():
    return typer.Option(None, "-jf", "--json-schema-file", metavar="FILE", callback=_schema_file,
                        help="file with a JSON schema the output must follow")


def one_grammar(*grammars):
    """The one grammar given (or None); two of --grammar / --grammar-file / -j / -jf is a
    usage error (llama.cpp silently keeps the last)."""
    given = [g for g in grammars if g is not None]
    if len(given) > 1:
        raise typer.BadParameter("give one of --grammar, --grammar-file, -j/--json-schema, --json-schema-file")
    return given[0] if given else None


# -- chat templates ----------------------------------------------------------------------

def opt_jinja(default: bool = True):
    return typer.Option(default, "--jinja/--no-jinja",
                        help="render the Jinja chat template, or with --no-jinja the built-in format it matches "
                             "(llama.cpp's llama_chat_apply_template)")


def opt_chat_template_file():
    return typer.Option(None, "--chat-template-file", metavar="JINJA_TEMPLATE_FILE",
                        help="Jinja chat template file, instead of the model's")


def chat_template_arg(name: Optional[str], file: Optional[Path], jinja: bool, model_template) -> Optional[str]:
    """--chat-template / --chat-template-file / --jinja as llama.cpp's
    common_chat_verify_template: the file's text (a usage error when unreadable); with
    --no-jinja only a built-in name or a template that matches one (then that name).
    ``model_template()`` gives the model's template text (read only for --no-jinja)."""
    from ..chat import BUILTIN_TEMPLATES, detect_builtin

    if name is not None and file is not None:
        raise typer.BadParameter("give --chat-template or --chat-template-file, not both")
    tmpl = name
    if file is not None:
        tmpl = read_text_file(Path(file), "--chat-template-file")
        if not tmpl.strip():
            raise typer.BadParameter(f"{file} is empty", param_hint="'--chat-template-file'")
    if jinja:
        return tmpl
    if tmpl is None:
        tmpl = model_template()
    if tmpl and tmpl not in BUILTIN_TEMPLATES:
        fam = detect_builtin(tmpl)
        if fam is None:
            raise typer.BadParameter("the chat template is not one of the built-in formats "
                                     f"({', '.join(BUILTIN_TEMPLATES)}); drop --no-jinja to render it",
                                     param_hint="'--no-jinja'")
        tmpl = fam
    return tmpl or None
