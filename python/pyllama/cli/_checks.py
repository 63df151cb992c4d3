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
    """-fa: llama.cpp's on / auto (and 1). pyllama's CPU attention is always the fused
    streaming-softmax kernel (what llama.cpp calls flash attention, and what its auto picks
    on the CPU), so off, which asks for the unfused KQ / softmax / KQV path, is refused
    rather than silently run fused."""
    if value is None:
        return value
    v = value.lower()
    if v not in ("on", "off", "auto", "1", "0"):
        raise typer.BadParameter(f"--flash-attn expects on, off or auto, got {value!r}")
    if v in ("off", "0"):
        raise typer.BadParameter(f"{value!r}: pyllama has only the fused (flash) attention kernel, so it cannot run "
                                 "with flash attention off; use on or auto")
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


def opt_gpu_layers():
    return typer.Option(0, "-ngl", "--gpu-layers", "--n-gpu-layers", help="layers on the GPU (accepted; CPU here)")


def opt_load_mode():
    return typer.Option("auto", "-lm", "--load-mode", callback=load_mode, help="auto, none, mmap, mlock, mmap+mlock, dio")


def opt_cache_type_k():
    return typer.Option("f16", "-ctk", "--cache-type-k", callback=kv_cache_type, help="K cache type")


def opt_cache_type_v():
    return typer.Option("f16", "-ctv", "--cache-type-v", callback=kv_cache_type, help="V cache type")


# -fa values -> llama_context_params.flash_attn_type (anything else: -1, auto)
FLASH_ATTN_TYPES = {"on": 1, "1": 1, "off": 0, "0": 0}


def opt_flash_attn():
    return typer.Option("auto", "-fa", "--flash-attn", callback=flash_attn,
                        help="flash attention: on or auto (pyllama's attention is always the fused kernel; off is refused)")


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
