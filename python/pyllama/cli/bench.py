"""`pyllama bench`: llama-bench's tests (pp N, tg N, pp+tg) and its table, on pyllama.

Same method as llama.cpp's tools/llama-bench: a warmup run, then `-r` repetitions, each
starting from an empty KV cache; pp N decodes N random tokens in batches of n_batch (the
first one BOS when the model adds BOS), tg N decodes N single random tokens one by one.
Tokens per second per repetition; the table shows mean +- sample stddev.
"""

from __future__ import annotations

import itertools
import random
import re
import sys
import time
from typing import Optional

import typer

from . import app
from ._checks import FLASH_ATTN_TYPES, integer
from .generate import freeze_heap

_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+)(?:([+*])([0-9]+))?)?")
OUTPUTS = ("md", "csv", "json", "jsonl", "sql")


def parse_int_range(s: str) -> list[int]:
    """llama-bench's parse_int_range: a comma list of ``first[-last[(+|*)step]]`` items,
    non-negative; ``1-4`` is 1,2,3,4, ``8-32+8`` 8,16,24,32, ``1-16*2`` 1,2,4,8,16.
    ValueError (with the offending item) on anything else."""
    out: list[int] = []
    for item in s.split(","):
        item = item.strip()
        if not item:
            continue  # llama-bench accepts a trailing comma
        m = _RANGE.fullmatch(item)
        if m is None:
            raise ValueError(f"{item!r} is not a non-negative integer or a range first-last[+step|*step]")
        first = int(m[1])
        last = int(m[2]) if m[2] is not None else first
        op, step = m[3] or "+", int(m[4]) if m[4] is not None else 1
        if max(first, last) > 2**31 - 1:
            raise ValueError(f"{item!r}: {max(first, last)} is too large")
        if first > last:
            raise ValueError(f"{item!r}: empty range (first > last)")
        i = first
        while i <= last:
            out.append(i)
            if len(out) > 10_000:
                raise ValueError(f"{item!r}: more than 10000 values")
            nxt = i + step if op == "+" else i * step
            if nxt <= i:  # as llama-bench: a step that does not advance is an error
                raise ValueError(f"{item!r}: the range does not advance ({op}{step} from {i})")
            i = nxt
    return out


def _items(value):
    """The comma-separated items of a list option (given once or repeated), stripped, empty
    ones dropped (llama-bench accepts a trailing comma)."""
    for v in value if isinstance(value, (list, tuple)) else [value]:
        for item in str(v).split(","):
            if item.strip():
                yield item.strip()


def _int_list(lo: int, what: str):
    """Option callback: the values of llama-bench list flags (each -p given adds its list)."""

    def check(ctx, param, value):
        vals: list[int] = []
        for v in value if isinstance(value, (list, tuple)) else [value]:
            try:
                vals += parse_int_range(v)
            except ValueError as e:
                raise typer.BadParameter(str(e)) from None
        bad = [v for v in vals if v < lo]
        if bad:
            raise typer.BadParameter(f"{bad[0]}: {what} must be >= {lo}")
        if not vals:
            raise typer.BadParameter(f"{value!r} gives no value")
        return vals

    return check


def _threads_list(ctx, param, value):
    """-t: as -p, each >= 1; none given: None (the physical cores)."""
    if not value:
        return None
    return _int_list(1, "a thread count")(ctx, param, value)


def _pairs(ctx, param, value):
    """-pg pp,tg (repeatable): pairs of non-negative ints; 0,0 is skipped, as llama-bench."""
    out = []
    for v in value or []:
        parts = [x.strip() for x in v.split(",")]
        if len(parts) != 2 or not all(re.fullmatch(r"[0-9]+", p) for p in parts):
            raise typer.BadParameter(f"{v!r}: expected 'pp,tg', two non-negative integers (e.g. 512,128)")
        pp, tg = int(parts[0]), int(parts[1])
        if max(pp, tg) > 2**31 - 1:
            raise typer.BadParameter(f"{v!r}: {max(pp, tg)} is too large")
        out.append((pp, tg))
    return out


def _names(choices_of, what: str):
    def check(ctx, param, value):
        choices = tuple(choices_of())
        vals = [x.lower() for x in _items(value)]
        for v in vals:
            if v not in choices:
                raise typer.BadParameter(f"{v!r} is not a {what} ({', '.join(choices)})")
        if not vals:
            raise typer.BadParameter(f"{value!r} gives no value")
        return vals

    return check


def _kv_types():
    from ..context import GGML_TYPE_NAMES

    return GGML_TYPE_NAMES.values()


# llama-bench's -fa words -> llama_flash_attn_type (the same words as generate's -fa)
_FA = FLASH_ATTN_TYPES


def _flash_attn(ctx, param, value):
    """-fa list: on, off or auto (llama.cpp's flash-attention kernel, or its mul_mat /
    soft_max / mul_mat path, both reproduced in ops/attention.rs)."""
    out = []
    for v in (x.lower() for x in _items(value)):
        if v not in _FA:
            raise typer.BadParameter(f"{v!r} is not a flash-attention setting (on, off, auto, 1, 0, -1)")
        out.append(_FA[v])
    if not out:
        raise typer.BadParameter(f"{value!r} gives no value")
    return out


def _signed_list(ctx, param, value):
    """-ngl: llama-bench's parse_int_range with negative values allowed (-1 = all layers)."""
    vals: list[int] = []
    for item in _items(value):
        if re.fullmatch(r"-[0-9]+", item):
            vals.append(int(item))
            continue
        try:
            vals += parse_int_range(item)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    if not vals:
        raise typer.BadParameter(f"{value!r} gives no value")
    return vals


def _split_modes(ctx, param, value):
    """-sm: comma-separated none, layer, row, tensor (llama-bench's list)."""
    out = [item.lower() for item in _items(value)]
    for item in out:
        if item not in ("none", "layer", "row", "tensor"):
            raise typer.BadParameter(f"{item!r} is not a split mode (none, layer, row, tensor)")
    if not out:
        raise typer.BadParameter(f"{value!r} gives no value")
    return out


def _tensor_splits(ctx, param, value):
    """-ts: comma-separated splits, each one share per adapter separated by / or ;
    (llama-bench's "ts0/ts1/..")."""
    from ._checks import parse_tensor_split

    out = [parse_tensor_split(item.replace(";", "/")) for item in _items(value)]
    if not out:
        raise typer.BadParameter(f"{value!r} gives no value")
    return out


def _bools(ctx, param, value):
    """-nkvo: comma-separated 0/1 (llama-bench's string_split<bool>)."""
    items = list(_items(value))
    for item in items:
        if item not in ("0", "1"):
            raise typer.BadParameter(f"{item!r} is not 0 or 1")
    if not items:
        raise typer.BadParameter(f"{value!r} gives no value")
    return [item == "1" for item in items]


def _ts_str(ts: list) -> str:
    """llama-bench's tensor_split column: %.2f per entry up to the last non-zero one, '/'-joined."""
    last = max([i for i, x in enumerate(ts) if x > 0], default=0)
    return "/".join(f"{x:.2f}" for x in (list(ts) + [0.0])[:last + 1])


def _output(ctx, param, value):
    v = value.lower()
    if v not in OUTPUTS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(OUTPUTS)}")
    return v


def physical_cores() -> int:
    """llama-bench's default -t (common_cpu_get_num_math on x86-64 Linux: the physical
    cores, counted as distinct thread-sibling sets in sysfs), limited to the CPUs this
    process may use; llama.cpp's fallback (half the logical CPUs above 4) without sysfs."""
    import os

    siblings = set()
    cpu = 0
    while True:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings") as f:
                siblings.add(f.readline().strip())
        except OSError:
            break
        cpu += 1
    try:
        avail = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        avail = os.cpu_count() or 4
    if siblings:
        return max(1, min(len(siblings), avail))
    n = os.cpu_count() or 4
    return max(1, min(n if n <= 4 else n // 2, avail))


def _ggml_type(api, name: str) -> int:
    return getattr(api, f"GGML_TYPE_{name.upper()}")


def _run_prompt(api, ctx, vocab, n_prompt: int, n_batch: int, rng: random.Random) -> None:
    import numpy as np  # here, not at the top: `pyllama --help` does not pay for numpy

    n_vocab = api.llama_vocab_n_tokens(vocab)
    add_bos = api.llama_vocab_get_add_bos(vocab)
    done = 0
    while done < n_prompt:
        n = min(n_prompt - done, n_batch)
        toks = np.array([rng.randrange(n_vocab) for _ in range(n)], dtype=np.int32)
        if done == 0 and add_bos:
            toks[0] = api.llama_vocab_bos(vocab)
        if api.llama_decode(ctx, api.llama_batch_get_one(toks, n)) != 0:
            raise RuntimeError("llama_decode failed on a prompt batch")
        done += n


def _run_gen(api, ctx, vocab, n_gen: int, rng: random.Random) -> None:
    import numpy as np

    n_vocab = api.llama_vocab_n_tokens(vocab)
    tok = api.llama_vocab_bos(vocab) if api.llama_vocab_get_add_bos(vocab) else rng.randrange(n_vocab)
    buf = np.zeros(1, dtype=np.int32)
    for _ in range(n_gen):
        buf[0] = tok
        if api.llama_decode(ctx, api.llama_batch_get_one(buf, 1)) != 0:
            raise RuntimeError("llama_decode failed on a generation step")
        tok = rng.randrange(n_vocab)


# llama-bench's test::get_fields(), in its order, and their types (get_field_type)
FIELDS = (
    "build_commit", "build_number", "cpu_info", "gpu_info", "backends",
    "model_filename", "model_type", "model_size", "model_n_params", "n_batch",
    "n_ubatch", "n_threads", "cpu_mask", "cpu_strict", "poll",
    "type_k", "type_v", "n_gpu_layers", "n_cpu_moe", "split_mode",
    "main_gpu", "no_kv_offload", "flash_attn", "devices", "tensor_split",
    "tensor_buft_overrides", "load_mode", "lazy_mode",
    "embeddings",
    "no_op_offload", "no_host", "repack", "fit_target", "fit_min_ctx",
    "n_prompt", "n_gen", "n_depth",
    "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts",
)
_INT = {"build_number", "n_batch", "n_ubatch", "n_threads", "poll", "model_size", "model_n_params", "n_gpu_layers",
        "main_gpu", "n_prompt", "n_gen", "n_depth", "avg_ns", "stddev_ns", "no_op_offload", "n_cpu_moe",
        "fit_target", "fit_min_ctx", "flash_attn"}
_BOOL = {"no_kv_offload", "cpu_strict", "embeddings", "no_host", "repack"}
_FLOAT = {"avg_ts", "stddev_ts"}


def _avg(v):
    """llama-bench's avg<T>: integer division for the ns samples."""
    if not v:
        return 0
    return sum(v) // len(v) if isinstance(v[0], int) else sum(v) / len(v)


def _stdev(v):
    """llama-bench's stdev<T> (sum of squares form; truncated for integers, as T is)."""
    import math

    if len(v) <= 1:
        return 0
    n = len(v)
    mean = _avg(v)
    sq = sum(x * x for x in v)
    if isinstance(v[0], int):
        var = sq // (n - 1) - mean * mean * n // (n - 1)
        return int(math.sqrt(var)) if var > 0 else 0
    var = sq / (n - 1) - mean * mean * n / (n - 1)
    return math.sqrt(var) if var > 0 else 0.0


def _cstr_double(x: float) -> str:
    """std::to_string(double): %f."""
    return f"{x:f}"


def _stream_double(x: float) -> str:
    """A double through std::stringstream (llama-bench's join of samples_ts): %g, 6 digits."""
    return f"{x:g}"


class Test:
    """One llama-bench test instance and its samples."""

    def __init__(self, **kw):
        self.__dict__.update(kw)
        self.samples_ns: list[int] = []

    @property
    def samples_ts(self) -> list[float]:
        n = self.n_prompt + self.n_gen
        return [1e9 * n / t for t in self.samples_ns]

    @property
    def name(self) -> str:
        pp, tg = self.n_prompt, self.n_gen
        s = f"pp{pp}" if tg == 0 else (f"tg{tg}" if pp == 0 else f"pp{pp}+tg{tg}")
        return s + (f" @ d{self.n_depth}" if self.n_depth > 0 else "")

    def values(self) -> list[str]:
        """llama-bench's get_values(): every field as the string it prints."""
        ts = self.samples_ts
        v = {
            "build_commit": self.build_commit, "build_number": "0", "cpu_info": self.cpu_info, "gpu_info": "",
            "backends": getattr(self, "backends", "CPU"), "model_filename": self.model_filename, "model_type": self.model_type,
            "model_size": str(self.model_size), "model_n_params": str(self.model_n_params),
            "n_batch": str(self.n_batch), "n_ubatch": str(self.n_ubatch), "n_threads": str(self.n_threads),
            "cpu_mask": "0x0", "cpu_strict": "0", "poll": "50", "type_k": self.type_k, "type_v": self.type_v,
            "n_gpu_layers": str(self.n_gpu_layers), "n_cpu_moe": "0", "split_mode": getattr(self, "split_mode", "layer"),
            "main_gpu": str(getattr(self, "main_gpu", 0)), "no_kv_offload": str(int(getattr(self, "no_kv_offload", False))),
            "flash_attn": str(self.flash_attn), "devices": "auto", "tensor_split": _ts_str(getattr(self, "tensor_split", [])),
            "tensor_buft_overrides": "none", "load_mode": "auto", "lazy_mode": "auto", "embeddings": "0",
            "no_op_offload": "0", "no_host": "0", "repack": "1", "fit_target": "0", "fit_min_ctx": "0",
            "n_prompt": str(self.n_prompt), "n_gen": str(self.n_gen), "n_depth": str(self.n_depth),
            "test_time": self.test_time, "avg_ns": str(_avg(self.samples_ns)),
            "stddev_ns": str(_stdev(self.samples_ns)), "avg_ts": _cstr_double(_avg(ts)),
            "stddev_ts": _cstr_double(_stdev(ts)),
        }
        return [v[f] for f in FIELDS]

    def avg_ts(self) -> float:
        return _avg(self.samples_ts)

    def stdev_ts(self) -> float:
        return _stdev(self.samples_ts)


def _escape_json(s: str) -> str:
    out = []
    for c in s:
        if c == '"':
            out.append('\\"')
        elif c == "\\":
            out.append("\\\\")
        elif ord(c) <= 0x1F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return "".join(out)


def _json_value(field: str, value: str) -> str:
    if field in _BOOL:
        return "false" if value == "0" else "true"
    if field in _INT or field in _FLOAT:
        return value
    return '"' + _escape_json(value) + '"'


class Printer:
    """llama-bench's printers: header, one record per test as it finishes, footer."""

    def __init__(self, fmt: str, out, params: dict):
        self.fmt, self.out, self.params, self.first = fmt, out, params, True
        self.md_fields: list[str] = []

    def w(self, s: str) -> None:
        self.out.write(s)

    def header(self) -> None:
        if self.fmt == "csv":
            self.w(",".join(FIELDS) + "\n")
        elif self.fmt == "json":
            self.w("[\n")
        elif self.fmt == "sql":
            types = {**{f: "INTEGER" for f in _INT | _BOOL}, **{f: "REAL" for f in _FLOAT}}
            self.w("CREATE TABLE IF NOT EXISTS llama_bench (\n")
            for i, f in enumerate(FIELDS):
                self.w(f"  {f} {types.get(f, 'TEXT')}{',' if i < len(FIELDS) - 1 else ''}\n")
            self.w(");\n\n")
        elif self.fmt == "md":
            self._md_header()
        self.out.flush()

    def test(self, t: Test) -> None:
        vals = t.values()
        if self.fmt == "csv":
            self.w(",".join('"' + v.replace('"', '""') + '"' for v in vals) + "\n")
        elif self.fmt in ("json", "jsonl"):
            ns = ", ".join(str(x) for x in t.samples_ns)
            ts = ", ".join(_stream_double(x) for x in t.samples_ts)
            if self.fmt == "json":
                if not self.first:
                    self.w(",\n")
                self.w("  {\n")
                for f, v in zip(FIELDS, vals):
                    self.w(f'    "{f}": {_json_value(f, v)},\n')
                self.w(f'    "samples_ns": [ {ns} ],\n    "samples_ts": [ {ts} ]\n  }}')
            else:
                self.w("{" + "".join(f'"{f}": {_json_value(f, v)}, ' for f, v in zip(FIELDS, vals)))
                self.w(f'"samples_ns": [ {ns} ],"samples_ts": [ {ts} ]}}\n')
        elif self.fmt == "sql":
            # llama-bench writes the values between quotes as they are; a quote is doubled
            # here so that a file name holding one still gives valid SQL
            q = ", ".join("'" + v.replace("'", "''") + "'" for v in vals)
            self.w(f"INSERT INTO llama_bench ({', '.join(FIELDS)}) VALUES ({q});\n")
        elif self.fmt == "md":
            self._md_row(t)
        self.first = False
        self.out.flush()

    def footer(self, build: str) -> None:
        if self.fmt == "json":
            self.w("\n]\n")
        elif self.fmt == "md":
            self.w(f"\nbuild: {build} (0)\n")
        self.out.flush()

    # markdown: the columns llama-bench shows (a parameter appears when it is not the default)
    _WIDTH = {"model": -30, "t/s": 20, "size": 10, "params": 10, "n_gpu_layers": 3, "n_threads": 7, "n_batch": 7,
              "n_ubatch": 8, "type_k": 6, "type_v": 6, "split_mode": 6, "flash_attn": 3, "test": 15}
    _SHOW = {"n_gpu_layers": "ngl", "n_threads": "threads", "flash_attn": "fa", "split_mode": "sm",
             "no_kv_offload": "nkvo", "tensor_split": "ts"}

    def _width(self, f: str) -> int:
        if f in self._WIDTH:
            return self._WIDTH[f]
        w = max(len(f), 10)
        return w if (f in _INT or f in _BOOL or f in _FLOAT) else -w

    def _md_header(self) -> None:
        p = self.params
        fields = ["model", "size", "params", "backend", "n_threads"]
        for f in ("n_batch", "n_ubatch", "type_k", "type_v", "main_gpu", "split_mode", "no_kv_offload", "flash_attn",
                  "tensor_split"):
            if f in p and p[f] != p["defaults"][f]:
                fields.append(f)
        fields += ["test", "t/s"]
        self.md_fields = fields
        self.w("|" + "".join(f" {self._SHOW.get(f, f):{'<' if self._width(f) < 0 else '>'}{abs(self._width(f))}} |"
                             for f in fields) + "\n")
        self.w("|" + "".join(" " + "-" * (abs(self._width(f)) - 1) + (":" if self._width(f) > 0 else "-") + " |"
                             for f in fields) + "\n")

    def _md_row(self, t: Test) -> None:
        vmap = dict(zip(FIELDS, t.values()))
        cells = []
        for f in self.md_fields:
            if f == "model":
                v = t.model_type
            elif f == "size":
                v = (f"{t.model_size / 1024 / 1024:.2f} MiB" if t.model_size < 1024 ** 3
                     else f"{t.model_size / 1024 ** 3:.2f} GiB")
            elif f == "params":
                v = f"{t.model_n_params / 1e6:.2f} M" if t.model_n_params < 1e9 else f"{t.model_n_params / 1e9:.2f} B"
            elif f == "backend":
                v = getattr(t, "backends", "CPU")
            elif f == "test":
                v = t.name
            elif f == "split_mode":
                v = t.split_mode
            elif f == "t/s":
                v = f"{t.avg_ts():.2f} ± {t.stdev_ts():.2f}"
            else:
                v = vmap[f]
            w = self._width(f)
            cells.append(f" {v:{'<' if w < 0 else '>'}{abs(w)}} |")
        self.w("|" + "".join(cells) + "\n")


@app.command()
def bench(
    model: list[str] = typer.Option([], "-m", "--model", help="GGUF files (repeat, or comma-separated)"),
    hf_repo: list[str] = typer.Option([], "-hf", "-hfr", "--hf-repo", metavar="USER/MODEL[:QUANT]",
                                      help="Hugging Face repos, as generate's -hf (repeat, or comma-separated; "
                                           "needs huggingface_hub)"),
    hf_file: list[str] = typer.Option([], "-hff", "--hf-file", metavar="FILE",
                                      help="file in the i-th -hf repo (repeat, or comma-separated, in -hf's order)"),
    hf_token: Optional[str] = typer.Option(None, "-hft", "--hf-token", help="Hugging Face access token (default: HF_TOKEN)"),
    n_prompt: list[str] = typer.Option(["512"], "-p", "--n-prompt", metavar="LIST", callback=_int_list(0, "a prompt size"),
                                       help="prompt sizes: comma list or range first-last[+step|*step] (0 = none)"),
    n_gen: list[str] = typer.Option(["128"], "-n", "--n-gen", metavar="LIST", callback=_int_list(0, "a generation length"),
                                    help="generation lengths, as -p (0 = none)"),
    pg: list[str] = typer.Option([], "-pg", metavar="PP,TG", callback=_pairs, help="a pp+tg test: 'pp,tg' (repeat for several)"),
    n_depth: list[str] = typer.Option(["0"], "-d", "--n-depth", metavar="LIST", callback=_int_list(0, "a depth"),
                                      help="tokens already in the KV cache before each test (untimed), as -p"),
    threads: Optional[list[str]] = typer.Option(None, "-t", "--threads", metavar="LIST", callback=_threads_list,
                                                help="thread counts, as -p (default: the physical cores, as llama-bench)"),
    reps: int = typer.Option(5, "-r", "--repetitions", callback=integer(1), help="repetitions per test"),
    n_batch: list[str] = typer.Option(["2048"], "-b", "--batch-size", metavar="LIST", callback=_int_list(1, "n_batch"),
                                      help="n_batch values, as -p"),
    n_ubatch: list[str] = typer.Option(["512"], "-ub", "--ubatch-size", metavar="LIST", callback=_int_list(0, "n_ubatch"),
                                       help="n_ubatch values, as -p (0 = -b)"),
    cache_type_k: str = typer.Option("f16", "-ctk", "--cache-type-k", callback=_names(_kv_types, "KV cache type"),
                                     help="K cache types, comma-separated"),
    cache_type_v: str = typer.Option("f16", "-ctv", "--cache-type-v", callback=_names(_kv_types, "KV cache type"),
                                     help="V cache types, comma-separated"),
    flash_attn: str = typer.Option("auto", "-fa", "--flash-attn", callback=_flash_attn,
                                   help="flash attention, comma-separated: on/1 or auto/-1 (pyllama's attention is "
                                        "always the fused kernel; off is refused)"),
    gpu_layers: list[str] = typer.Option(["-1"], "-ngl", "--n-gpu-layers", metavar="LIST", callback=_signed_list,
                                         help="layers on the GPU, as -p (-1 = all; the model is loaded once per value; "
                                              "without a usable GPU adapter every layer runs on the CPU, with one warning "
                                              "when more than 0 are asked for)"),
    split_mode: list[str] = typer.Option(["layer"], "-sm", "--split-mode", metavar="LIST", callback=_split_modes,
                                         help="none or layer, comma-separated (how the GPU layers are split across "
                                              "adapters; row and tensor are refused)"),
    main_gpu: list[str] = typer.Option(["0"], "-mg", "--main-gpu", metavar="LIST", callback=_int_list(0, "main_gpu"),
                                       help="the adapter of -sm none, as -p"),
    tensor_split: list[str] = typer.Option(["0"], "-ts", "--tensor-split", metavar="TS0/TS1/..",
                                           callback=_tensor_splits,
                                           help="each adapter's share of the GPU layers with -sm layer, '/'-separated; "
                                                "several splits comma-separated (0: equal shares)"),
    no_kv_offload: list[str] = typer.Option(["0"], "-nkvo", "--no-kv-offload", metavar="0|1",
                                            callback=_bools,
                                            help="1: the KV cache of GPU layers stays on the CPU; comma-separated"),
    output: str = typer.Option("md", "-o", "--output", callback=_output, help="md, csv, json, jsonl or sql (llama-bench's)"),
    seed: int = typer.Option(0, "--seed", help="random tokens seed"),
    progress: bool = typer.Option(False, "--progress", help="print progress on stderr"),
) -> None:
    """Benchmark prompt processing (pp) and generation (tg) speed, like llama-bench."""
    import datetime

    from .. import __version__, gpu
    from .. import llama_api as api
    from ..errors import PyllamaError
    from . import _checks as O
    from .info import _cpu_name

    nts = threads or [physical_cores()]
    if any(g > 0 for g in gpu_layers) and not gpu.available():
        typer.echo(f"warning: -ngl: {gpu.why_not()}; every layer runs on the CPU", err=True)
    models = [m for v in model for m in v.split(",") if m]
    repos = [h for v in hf_repo for h in v.split(",") if h]
    files = [f for v in hf_file for f in v.split(",")]
    if len(files) > len(repos):
        raise typer.BadParameter(f"{len(files)} --hf-file values for {len(repos)} -hf repos", param_hint="'--hf-file'")
    if hf_token is not None and not repos:
        raise typer.BadParameter("--hf-token is only used with -hf", param_hint="'--hf-token'")
    for i, h in enumerate(repos):
        models.append(str(O.model_by_name(None, h, (files[i] or None) if i < len(files) else None, hf_token)))
    if not models:
        raise typer.BadParameter("give a model: -m FILE or -hf REPO[:QUANT] (repeatable)", param_hint="'-m'")
    tests: list[tuple[int, int]] = [(p, 0) for p in n_prompt if p > 0]
    tests += [(0, g) for g in n_gen if g > 0]
    tests += [(pp, tg) for pp, tg in pg if pp or tg]
    api.llama_backend_init()
    params = {"n_batch": n_batch, "n_ubatch": n_ubatch, "type_k": cache_type_k, "type_v": cache_type_v,
              "flash_attn": flash_attn, "split_mode": split_mode, "main_gpu": main_gpu,
              "no_kv_offload": no_kv_offload, "tensor_split": tensor_split,
              "defaults": {"n_batch": [2048], "n_ubatch": [512], "type_k": ["f16"], "type_v": ["f16"],
                           "flash_attn": [-1], "split_mode": ["layer"], "main_gpu": [0], "no_kv_offload": [False],
                           "tensor_split": [[0.0]]}}
    printer = Printer(output, sys.stdout, params)
    build = f"pyllama {__version__}"
    cpu = _cpu_name()
    n_total = len(models) * len(nts) * len(n_batch) * len(n_ubatch) * len(cache_type_k) * len(cache_type_v) \
        * len(flash_attn) * len(gpu_layers) * len(n_depth) * len(tests) * len(split_mode) * len(main_gpu) \
        * len(tensor_split) * len(no_kv_offload)
    idx = 0
    header_done = False
    try:
        for mpath in models:
            for ngl, sm, mg, ts in itertools.product(gpu_layers, split_mode, main_gpu, tensor_split):
                # as llama-bench: the model is loaded again when its parameters change
                mparams = api.llama_model_default_params()
                mparams.n_gpu_layers = ngl
                mparams.split_mode = ("none", "layer", "row", "tensor").index(sm)
                mparams.main_gpu = mg
                mparams.tensor_split = ts
                lm = api.llama_model_load_from_file(str(mpath).encode(), mparams)
                if lm is None:
                    typer.echo(f"error: failed to load model {mpath}", err=True)
                    raise typer.Exit(1)
                vocab = api.llama_model_get_vocab(lm)
                desc = api.llama_model_desc(lm)
                size = api.llama_model_size(lm)
                n_params = api.llama_model_n_params(lm)
                backends = "CPU,wgpu" if lm.offload else "CPU"
                for nt in nts:
                    for nb in n_batch:
                        for nub in n_ubatch:
                            for ctk in cache_type_k:
                                for ctv in cache_type_v:
                                    for fa, nkvo in itertools.product(flash_attn, no_kv_offload):
                                        for nd in n_depth:
                                            for pp, tg in tests:
                                                idx += 1
                                                t = Test(build_commit=build, cpu_info=cpu, model_filename=str(mpath),
                                                         model_type=desc, model_size=size, model_n_params=n_params,
                                                         n_batch=nb, n_ubatch=nub, n_threads=nt, type_k=ctk, type_v=ctv,
                                                         n_gpu_layers=ngl, flash_attn=fa, n_prompt=pp, n_gen=tg,
                                                         split_mode=sm, main_gpu=mg, tensor_split=ts,
                                                         no_kv_offload=nkvo,
                                                         backends=backends,
                                                         n_depth=nd, test_time=datetime.datetime.now(
                                                             datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
                                                _run_test(api, lm, vocab, t, reps, seed, progress, idx, n_total)
                                                if not header_done:
                                                    printer.header()
                                                    header_done = True
                                                printer.test(t)
                api.llama_model_free(lm)
    except (BrokenPipeError, typer.Exit):  # a closed stdout (typer exits quietly) or our own exit
        raise
    except (PyllamaError, RuntimeError, ValueError, OSError, MemoryError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    if header_done:
        printer.footer(build)


def _run_test(api, lm, vocab, t: Test, reps: int, seed: int, progress: bool, idx: int, n_total: int) -> None:
    """llama-bench's loop for one instance: a context of n_prompt + n_gen + n_depth, a
    warmup, then per repetition: clear the cache, fill it with n_depth tokens (untimed),
    time the pp and/or tg part."""
    cp = api.llama_context_default_params()
    cp.n_ctx = t.n_prompt + t.n_gen + t.n_depth
    cp.n_batch = t.n_batch
    cp.n_ubatch = t.n_ubatch
    cp.n_threads = t.n_threads
    cp.n_threads_batch = t.n_threads
    cp.type_k = _ggml_type(api, t.type_k)
    cp.type_v = _ggml_type(api, t.type_v)
    cp.flash_attn_type = t.flash_attn
    cp.offload_kqv = not t.no_kv_offload
    ctx = api.llama_init_from_model(lm, cp)
    if ctx is None:
        typer.echo(f"error: failed to create a context for {t.model_filename} (-t {t.n_threads} -b {t.n_batch} "
                   f"-ub {t.n_ubatch} -ctk {t.type_k} -ctv {t.type_v}, n_ctx {cp.n_ctx})", err=True)
        raise typer.Exit(1)
    rng = random.Random(seed)

    def say(what: str) -> None:
        if progress:
            print(f"pyllama bench: benchmark {idx}/{n_total}: {what}", file=sys.stderr, flush=True)

    mem = api.llama_get_memory(ctx)
    api.llama_memory_clear(mem, False)
    if t.n_prompt:
        say("warmup prompt run")
        _run_prompt(api, ctx, vocab, t.n_prompt, t.n_batch, rng)
    if t.n_gen:
        say("warmup generation run")
        _run_gen(api, ctx, vocab, 1, rng)
    freeze_heap()  # as `pyllama generate` does: no GC walks of the vocabulary
    for r in range(reps):
        api.llama_memory_clear(mem, False)
        if t.n_depth:
            say(f"depth run {r + 1}/{reps}")
            _run_prompt(api, ctx, vocab, t.n_depth, t.n_batch, rng)
        t0 = time.perf_counter_ns()
        if t.n_prompt:
            say(f"prompt run {r + 1}/{reps}")
            _run_prompt(api, ctx, vocab, t.n_prompt, t.n_batch, rng)
        if t.n_gen:
            say(f"generation run {r + 1}/{reps}")
            _run_gen(api, ctx, vocab, t.n_gen, rng)
        t.samples_ns.append(time.perf_counter_ns() - t0)
    api.llama_free(ctx)
