"""`pyllama verify`: run llama.cpp and pyllama on the same tokens and compare their logits.

llama.cpp is used through its C API (llama.h) with ctypes, from a build directory holding
``libllama.so`` (``--llama-cpp DIR``), or from llama-cpp-python's bundled library when that
package is installed. Only long-stable parts of llama.h are touched: the functions below, the
``llama_batch`` struct, and the first four fields of ``llama_context_params`` (n_ctx,
n_batch, n_ubatch, n_seq_max); the parameter structs are otherwise passed back as the
library filled them, in a buffer larger than any version's struct.

Both engines get pyllama's tokens (so a difference is the forward pass, not the
tokenizer); llama.cpp's own tokenization of each input is compared separately.
Per position: top-1 agreement, KL(llama.cpp || pyllama) of the softmaxes (float64), and
max |delta logit|; perplexity over a text the way llama-perplexity scores it (chunks of
n_ctx, BOS first, the second half of each chunk scored) for both.
"""

from __future__ import annotations

import ctypes
import importlib.util
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .errors import PyllamaError

LIB_NAMES = ("libllama.so", "libllama.dylib", "llama.dll")


class LlamaCppUnavailable(PyllamaError):
    """No usable llama.cpp library (missing, not loadable, or lacking a needed function)."""


def find_library(build_dir: Optional[str | os.PathLike] = None) -> Path:
    """libllama in ``build_dir`` (itself, bin/, lib/, build/bin/, src/), or, without a
    directory, llama-cpp-python's bundled one. LlamaCppUnavailable says where it looked."""
    if build_dir is not None:
        d = Path(build_dir).expanduser()
        if d.is_file():
            return d
        if not d.is_dir():
            raise LlamaCppUnavailable(f"--llama-cpp {d}: no such directory")
        cands = [d / sub / n for sub in ("", "bin", "lib", "build/bin", "build/src", "src") for n in LIB_NAMES]
        for c in cands:
            if c.is_file():
                return c
        raise LlamaCppUnavailable(f"no libllama in {d} (looked in {d}, bin/, lib/, build/bin/, build/src/, src/; "
                                  "build llama.cpp with -DBUILD_SHARED_LIBS=ON)")
    spec = importlib.util.find_spec("llama_cpp")
    pkg_dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    here = Path(__file__).resolve().parent
    for loc in pkg_dirs:
        loc = Path(loc).resolve()
        if loc == here or here in loc.parents:
            continue  # pyllama's own llama_cpp shim, not llama-cpp-python
        for c in [loc / "lib" / n for n in LIB_NAMES] + [loc / n for n in LIB_NAMES]:
            if c.is_file():
                return c
    raise LlamaCppUnavailable("no llama.cpp to compare with: pass --llama-cpp DIR (a llama.cpp build with "
                              "libllama.so) or install llama-cpp-python")


class _Params(ctypes.Structure):
    """llama_model_params / llama_context_params: the first four uint32 fields named (the
    context's n_ctx, n_batch, n_ubatch, n_seq_max), the rest opaque. 2 KiB: more than any
    llama.h version's struct, so by-value returns and arguments (passed in memory) fit."""
    _fields_ = [("u32", ctypes.c_uint32 * 4), ("rest", ctypes.c_uint8 * 2032)]


class _Batch(ctypes.Structure):
    _fields_ = [("n_tokens", ctypes.c_int32), ("token", ctypes.POINTER(ctypes.c_int32)),
                ("embd", ctypes.POINTER(ctypes.c_float)), ("pos", ctypes.POINTER(ctypes.c_int32)),
                ("n_seq_id", ctypes.POINTER(ctypes.c_int32)),
                ("seq_id", ctypes.POINTER(ctypes.POINTER(ctypes.c_int32))),
                ("logits", ctypes.POINTER(ctypes.c_int8))]


_LOG_CB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


@_LOG_CB
def _quiet(level, text, user_data):  # llama.cpp's log lines would bury the report
    return None


_SIGS = {
    "llama_backend_init": (None, []),
    "llama_log_set": (None, [_LOG_CB, ctypes.c_void_p]),
    "llama_model_default_params": (_Params, []),
    "llama_context_default_params": (_Params, []),
    "llama_model_load_from_file": (ctypes.c_void_p, [ctypes.c_char_p, _Params]),
    "llama_model_free": (None, [ctypes.c_void_p]),
    "llama_model_get_vocab": (ctypes.c_void_p, [ctypes.c_void_p]),
    "llama_vocab_n_tokens": (ctypes.c_int32, [ctypes.c_void_p]),
    "llama_init_from_model": (ctypes.c_void_p, [ctypes.c_void_p, _Params]),
    "llama_free": (None, [ctypes.c_void_p]),
    "llama_set_n_threads": (None, [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32]),
    "llama_get_memory": (ctypes.c_void_p, [ctypes.c_void_p]),
    "llama_memory_clear": (None, [ctypes.c_void_p, ctypes.c_bool]),
    "llama_batch_init": (_Batch, [ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]),
    "llama_batch_free": (None, [_Batch]),
    "llama_decode": (ctypes.c_int32, [ctypes.c_void_p, _Batch]),
    "llama_get_logits_ith": (ctypes.POINTER(ctypes.c_float), [ctypes.c_void_p, ctypes.c_int32]),
    "llama_tokenize": (ctypes.c_int32, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32,
                                        ctypes.POINTER(ctypes.c_int32), ctypes.c_int32, ctypes.c_bool,
                                        ctypes.c_bool]),
}


class LlamaCpp:
    """A model and one context of the llama.cpp library at ``lib_path``, through ctypes."""

    def __init__(self, lib_path: Path, model_path: Path, *, n_ctx: int, n_batch: int, n_threads: int):
        self.lib_path = Path(lib_path)
        try:
            lib = ctypes.CDLL(str(self.lib_path), mode=getattr(ctypes, "RTLD_GLOBAL", 0))
        except OSError as e:
            raise LlamaCppUnavailable(f"cannot load {self.lib_path}: {e}") from None
        missing = [n for n in _SIGS if not hasattr(lib, n)]
        if missing:
            raise LlamaCppUnavailable(f"{self.lib_path} is not a llama.cpp this version of pyllama can drive: it has "
                                      f"no {', '.join(missing)} (a llama.h from mid-2025 or later is needed)")
        for name, (res, args) in _SIGS.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        self.lib = lib
        lib.llama_log_set(_quiet, None)
        self._load_backends()
        lib.llama_backend_init()
        mp = lib.llama_model_default_params()
        self.model = lib.llama_model_load_from_file(str(model_path).encode(), mp)
        if not self.model:
            raise PyllamaError(f"llama.cpp ({self.lib_path}) could not load {model_path}")
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        cp = lib.llama_context_default_params()
        cp.u32[0], cp.u32[1], cp.u32[2], cp.u32[3] = n_ctx, n_batch, n_batch, 1  # n_ctx, n_batch, n_ubatch, n_seq_max
        self.ctx = lib.llama_init_from_model(self.model, cp)
        if not self.ctx:
            lib.llama_model_free(self.model)
            raise PyllamaError(f"llama.cpp ({self.lib_path}) could not create a context (n_ctx {n_ctx})")
        if n_threads > 0:
            lib.llama_set_n_threads(self.ctx, n_threads, n_threads)
        self.n_batch = n_batch

    def _load_backends(self) -> None:
        """Builds with GGML_BACKEND_DL register no backend until asked to load them."""
        try:
            ggml = ctypes.CDLL(str(self.lib_path.with_name(self.lib_path.name.replace("llama", "ggml"))))
        except OSError:
            return
        if hasattr(ggml, "ggml_backend_reg_count") and hasattr(ggml, "ggml_backend_load_all_from_path"):
            ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
            if ggml.ggml_backend_reg_count() == 0:
                ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
                ggml.ggml_backend_load_all_from_path(str(self.lib_path.parent).encode())

    def close(self) -> None:
        if getattr(self, "ctx", None):
            self.lib.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            self.lib.llama_model_free(self.model)
            self.model = None

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        b = text.encode()
        n = max(len(b) + 8, 16)
        buf = (ctypes.c_int32 * n)()
        got = self.lib.llama_tokenize(self.vocab, b, len(b), buf, n, add_special, True)
        if got < 0:
            buf = (ctypes.c_int32 * -got)()
            got = self.lib.llama_tokenize(self.vocab, b, len(b), buf, -got, add_special, True)
        return list(buf[:got])

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """float32 [n, n_vocab]: every position's logits, from an empty cache."""
        lib = self.lib
        lib.llama_memory_clear(lib.llama_get_memory(self.ctx), True)
        out = np.empty((len(tokens), self.n_vocab), dtype=np.float32)
        batch = lib.llama_batch_init(self.n_batch, 0, 1)
        try:
            for b0 in range(0, len(tokens), self.n_batch):
                chunk = tokens[b0:b0 + self.n_batch]
                batch.n_tokens = len(chunk)
                for i, t in enumerate(chunk):
                    batch.token[i] = int(t)
                    batch.pos[i] = b0 + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = 1
                rc = lib.llama_decode(self.ctx, batch)
                if rc != 0:
                    raise PyllamaError(f"llama.cpp's llama_decode returned {rc}")
                for i in range(len(chunk)):
                    p = lib.llama_get_logits_ith(self.ctx, i)
                    out[b0 + i] = np.ctypeslib.as_array(p, shape=(self.n_vocab,))
        finally:
            lib.llama_batch_free(batch)
        return out


class Pyllama:
    """pyllama's side: the same calls on a pyllama Context."""

    def __init__(self, model_path: Path, *, n_ctx: int, n_batch: int, n_threads: int):
        from .cli.generate import open_session

        _p, self.sess = open_session(model_path, ctx_size=n_ctx, batch_size=n_batch, ubatch_size=n_batch,
                                     threads=n_threads or None, threads_batch=n_threads or None, load_mode="auto",
                                     cache_type_k="f16", cache_type_v="f16", quiet=True)
        self.n_vocab = int(self.sess.n_vocab)
        self.n_batch = n_batch

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return list(self.sess.tokenize(text, add_special=add_special, parse_special=True))

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        from .batch import batch_get_one

        ctx = self.sess.ctx
        ctx.memory_clear(True)
        rows = []
        for b0 in range(0, len(tokens), self.n_batch):
            toks = np.asarray(tokens[b0:b0 + self.n_batch], dtype=np.int32)
            batch = batch_get_one(toks)
            batch.logits = np.ones(len(toks), dtype=np.int8)
            ctx.decode(batch)
            rows.append(np.array(ctx.logits, dtype=np.float32, copy=True))
        return np.concatenate(rows, axis=0)


@dataclass
class Compare:
    """Agreement of two [n, n_vocab] logit arrays (``ref`` is llama.cpp)."""
    n: int = 0
    top1: int = 0
    kl_sum: float = 0.0
    kl_max: float = 0.0
    dlogit_max: float = 0.0

    def add(self, ref: np.ndarray, got: np.ndarray) -> "Compare":
        ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
        lp = ref64 - ref64.max(axis=1, keepdims=True)
        lp -= np.log(np.exp(lp).sum(axis=1, keepdims=True))
        lq = got64 - got64.max(axis=1, keepdims=True)
        lq -= np.log(np.exp(lq).sum(axis=1, keepdims=True))
        kl = (np.exp(lp) * (lp - lq)).sum(axis=1)
        self.n += ref.shape[0]
        self.top1 += int((ref.argmax(axis=1) == got.argmax(axis=1)).sum())
        self.kl_sum += float(kl.sum())
        self.kl_max = max(self.kl_max, float(kl.max()))
        self.dlogit_max = max(self.dlogit_max, float(np.abs(ref64 - got64).max()))
        return self

    @property
    def kl_mean(self) -> float:
        return self.kl_sum / self.n if self.n else float("nan")

    def as_dict(self) -> dict:
        return {"positions": self.n, "top1_agree": self.top1, "top1_rate": self.top1 / self.n if self.n else None,
                "kl_mean": self.kl_mean, "kl_max": self.kl_max, "max_abs_dlogit": self.dlogit_max}


def perplexity(engine, tokens: Sequence[int], n_ctx: int, bos: Optional[int]) -> tuple[float, int, list]:
    """llama-perplexity's scoring over whole chunks of n_ctx tokens (BOS as the first token
    of each chunk when the model adds one; positions n_ctx/2 .. n_ctx-2 predict the next
    token). Returns (ppl, tokens scored, the per-chunk logits for the comparison)."""
    from .cli.perplexity import nll_of_rows

    toks = np.asarray(tokens, dtype=np.int32)
    n_chunk = len(toks) // n_ctx
    first = n_ctx // 2
    nll, count, all_logits = 0.0, 0, []
    for c in range(n_chunk):
        chunk = toks[c * n_ctx:(c + 1) * n_ctx].copy()
        if bos is not None:
            chunk[0] = bos
        lg = engine.logits(chunk)
        all_logits.append(lg)
        v = nll_of_rows(lg[first:n_ctx - 1], toks[c * n_ctx + first + 1:(c + 1) * n_ctx])
        nll += float(v.sum())
        count += v.shape[0]
    return (math.exp(nll / count) if count else float("nan")), count, all_logits


DEFAULT_PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Translate to German: The weather is nice today.",
    "1, 1, 2, 3, 5, 8, 13, 21,",
    "Qu'est-ce que la photosynthèse ? Expliquez en deux phrases.",
    "Les élèves ont étudié l'histoire du Japon: 東京は日本の首都です。",
    "<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n<|im_start|>assistant\n",
)

DEFAULT_TEXT = (
    "The history of computing is longer than the history of computing hardware and modern computing "
    "technology and includes the history of methods intended for pen and paper or for chalk and slate, "
    "with or without the aid of tables. Digital computing is intimately tied to the representation of "
    "numbers. But long before abstractions like the number arose, there were mathematical concepts to serve "
    "the purposes of civilization. These concepts are implicit in concrete practices such as one-to-one "
    "correspondence, the basis of counting, and comparison to a standard, used for measurement. "
    "The earliest known tool for use in computation was the abacus, and it was thought to have been invented "
    "in Babylon circa 2400 BC. Its original style of usage was by lines drawn in sand with pebbles. Abaci of "
    "a more modern design are still used as calculation tools today. This was the first known calculation aid, "
    "preceding Greek methods by 2,000 years. In 1623 Wilhelm Schickard designed a calculating machine, but "
    "abandoned the project when the prototype he had started building was destroyed by a fire in 1624. Around "
    "1640, Blaise Pascal, a leading French mathematician, constructed a mechanical adding device based on a "
    "design described by the Greek mathematician Hero of Alexandria. Then in 1672 Gottfried Wilhelm Leibniz "
    "invented the Stepped Reckoner which he completed in 1694. In 1837 Charles Babbage first described his "
    "Analytical Engine which is accepted as the first design for a modern computer. The analytical engine had "
    "expandable memory, an arithmetic unit, and logic processing capabilities able to interpret a programming "
    "language with loops and conditional branching. Although never built, the design has been studied "
    "extensively and is understood to be Turing equivalent. The analytical engine would have had a memory "
    "capacity of less than 1 kilobyte of memory and a clock speed of less than 10 Hertz. Considerable "
    "advancement in mathematics and electronics theory was required before the first modern computers could "
    "be designed. In 1703, Gottfried Wilhelm Leibniz developed logic in a formal, mathematical sense with his "
    "writings on the binary numeral system. In his system, the ones and zeros also represent true and false "
    "values or on and off states. But it took more than a century before George Boole published his Boolean "
    "algebra in 1854 with a complete system that allowed computational processes to be mathematically modeled."
)


@dataclass
class Report:
    model: str
    library: str
    prompts: list = field(default_factory=list)  # per prompt: dict
    tokenize_same: int = 0
    overall: Compare = field(default_factory=Compare)
    text: dict = field(default_factory=dict)
    #: pyllama's float summation order: "pyllama" (its own, batch-invariant) or "llamacpp"
    #: (PYLLAMA_ORDER=llamacpp: llama.cpp's, for bit-exact comparisons)
    float_order: str = field(default_factory=lambda: "llamacpp" if os.environ.get("PYLLAMA_ORDER", "").lower()
                             == "llamacpp" else "pyllama")

    def as_dict(self) -> dict:
        return {"model": self.model, "llama_cpp_library": self.library, "float_order": self.float_order,
                "prompts": self.prompts,
                "tokenization_agree": self.tokenize_same, "overall": self.overall.as_dict(), "text": self.text}


def run(model_path: Path, lib_path: Path, *, prompts: Sequence[str], text: str, n_ctx: int = 128,
        n_batch: int = 512, n_threads: int = 0) -> Report:
    """The whole comparison: llama.cpp from ``lib_path`` and pyllama, every prompt, the
    text's perplexity."""
    n_ctx_engine = max(n_ctx, 1024)
    mine = Pyllama(model_path, n_ctx=n_ctx_engine, n_batch=n_batch, n_threads=n_threads)
    ref = LlamaCpp(lib_path, model_path, n_ctx=n_ctx_engine, n_batch=n_batch, n_threads=n_threads)
    try:
        return compare(ref, mine, prompts=prompts, text=text, n_ctx=n_ctx, model=str(model_path),
                       library=str(lib_path))
    finally:
        ref.close()


def compare(ref, mine, *, prompts: Sequence[str], text: str, n_ctx: int, model: str = "", library: str = "") -> Report:
    """Compare engine ``mine`` (pyllama) with ``ref`` (llama.cpp): both take pyllama's
    tokens; ``ref.tokenize`` is compared with them."""
    if ref.n_vocab != mine.n_vocab:
        raise PyllamaError(f"llama.cpp reports {ref.n_vocab} vocabulary entries, pyllama {mine.n_vocab}")
    rep = Report(model, library)
    for p in prompts:
        toks = mine.tokenize(p)
        if len(toks) > 1024:
            raise PyllamaError(f"a prompt of {len(toks)} tokens is longer than the 1024 verify compares")
        same_tok = ref.tokenize(p) == toks
        rep.tokenize_same += same_tok
        c = Compare().add(ref.logits(toks), mine.logits(toks))
        rep.prompts.append({"prompt": p, "tokens": len(toks), "same_tokens": same_tok, **c.as_dict()})
        _merge(rep.overall, c)
    toks = mine.tokenize(text)
    v = mine.sess.vocab
    bos = int(v.bos) if v.add_bos else None
    if len(toks) < 2 * n_ctx:
        raise PyllamaError(f"the text tokenizes to {len(toks)} tokens; perplexity with -c {n_ctx} needs at least "
                           f"{2 * n_ctx} (give a longer text with -f, or a smaller -c)")
    ppl_ref, count, lg_ref = perplexity(ref, toks, n_ctx, bos)
    ppl_mine, _, lg_mine = perplexity(mine, toks, n_ctx, bos)
    ct = Compare()
    for a, b in zip(lg_ref, lg_mine):
        ct.add(a, b)
    _merge(rep.overall, ct)
    rep.text = {"tokens": len(toks), "n_ctx": n_ctx, "chunks": len(lg_ref), "scored": count,
                "ppl_llama_cpp": ppl_ref, "ppl_pyllama": ppl_mine, "same_tokens": ref.tokenize(text) == toks,
                **ct.as_dict()}
    return rep


def _merge(into: Compare, c: Compare) -> None:
    into.n += c.n
    into.top1 += c.top1
    into.kl_sum += c.kl_sum
    into.kl_max = max(into.kl_max, c.kl_max)
    into.dlogit_max = max(into.dlogit_max, c.dlogit_max)
