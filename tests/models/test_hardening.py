"""Hostile input to the engine (issue 24): hyperparameters at absurd values, arrays rewritten
while a decode runs, positions at the end of int32, thread counts, broken BYTE tokens.

Each case is a process-level property (an abort or a Rust panic kills or escapes the
interpreter), so the sweeps run in a child process with an address-space limit: a huge
allocation fails there as it would on a small machine, and a crash fails the test with the
case that caused it instead of taking pytest down.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import pyllama
from pyllama import Context, Model
from pyllama import llama_api as L

DATA = Path(__file__).parents[1] / "data"
ARCHS = ["llama", "qwen2", "qwen3", "qwen3moe", "phi3", "phi2", "gemma", "gemma2", "gemma3", "mistral3", "smollm3", "olmo2", "granite", "starcoder2", "exaone4", "glm4", "llama4", "phimoe", "granitemoe", "glm4moe", "cohere2", "gpt-oss", "deepseek2", "mistral4",
         "mamba2", "lfm2", "qwen35", "qwen35moe", "qwen3next", "falcon-h1", "granitehybrid", "lfm2moe", "gemma4",
         "mamba", "rwkv6", "rwkv7", "arwkv7", "rwkv6qwen2", "gemma3n"]  # falcon-mamba: its keys are mamba.*
VALUES = [2**16, 2**20, 2**31, 2**32 - 1]
# keys swept on every architecture (added when the file lacks them), beside every integer
# {arch}.* key the file has
EXTRA_KEYS = ["expert_count", "expert_used_count", "expert_feed_forward_length", "attention.key_length",
              "attention.value_length", "context_length", "attention.sliding_window", "rope.dimension_count",
              "attention.sliding_window_pattern", "rope.scaling.original_context_length"]

_CHILD = textwrap.dedent(r'''
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    import numpy as np
    import pyllama
    from pyllama import Context, Model
    path, cases = sys.argv[1], json.loads(sys.argv[2])
    for key, value in cases:
        print(json.dumps(["start", key, value]), flush=True)
        try:
            m = Model.load(path, kv_overrides={key: value})
            with Context(m, n_ctx=0, n_threads=1, n_threads_batch=1) as ctx:  # n_ctx 0: the file's
                ctx.decode([1, 2, 3])
            out = "ok"
        except (pyllama.PyllamaError, ValueError, MemoryError) as e:
            out = type(e).__name__ + ": " + str(e)[:300]
        print(json.dumps(["done", key, value, out]), flush=True)
''')


def _int_keys(path: Path, arch: str) -> list[str]:
    md = pyllama.GGUFFile(str(path)).metadata
    keys = {k[len(arch) + 1:] for k, v in md.items()
            if k.startswith(arch + ".") and isinstance(v, int) and not isinstance(v, bool)}
    return sorted(keys | set(EXTRA_KEYS))


def _run_child(script: str, *args: str, timeout: int):
    """Run a child script that prints JSON lines: ["start", case...] before each case and
    any other record after it. Returns (the child's returncode and stderr tail, the last case
    started, the other records), so a crash is reported with the case that caused it."""
    r = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout)
    last, records = None, []
    for line in r.stdout.splitlines():
        rec = json.loads(line)
        if rec[0] == "start":
            last = rec[1:]
        else:
            records.append(rec)
    return (r.returncode, r.stderr[-3000:]), last, records


def _sweep(path: Path, arch: str, values) -> dict:
    cases = [[f"{arch}.{k}", v] for k in _int_keys(path, arch) for v in values]
    (rc, err), last, records = _run_child(_CHILD, str(path), json.dumps(cases), timeout=600)
    done = {(rec[1], rec[2]): rec[3] for rec in records}
    assert rc == 0 and len(done) == len(cases), f"{arch}: the child died (exit {rc}) at {last}:\n{err}"
    return done


def _sweep_values():
    # CI: every key at 2^31 and 2^32-1 (the abort cases) and 2^20; the slow run adds 2^16
    return VALUES if os.environ.get("PYLLAMA_SLOW") else VALUES[1:]


@pytest.mark.parametrize("arch", ARCHS)
def test_hyperparameter_sweep_never_crashes(tiny_model_path, arch):
    """Every integer hyperparameter at 2^16 / 2^20 / 2^31 / 2^32-1: the model loads and a
    context runs, or a PyllamaError / ValueError / MemoryError names what was wrong; never an
    abort (issue 24: expert_used_count = 2^31 made Context() abort on 2 TiB)."""
    path = tiny_model_path(arch)
    done = _sweep(path, arch, _sweep_values())
    moe = arch in ("qwen3moe", "qwen35moe", "qwen3next")
    for v in (2**20, 2**31, 2**32 - 1):
        out = done[(f"{arch}.expert_used_count", v)]
        assert out.startswith("UnsupportedModelError") and "expert_used_count" in out, out
        if not moe:
            out = done[(f"{arch}.expert_count", v)]
            assert out.startswith("UnsupportedModelError") and "expert_count" in out, out
    # a context as long as the file says, past what int32 positions or memory allow
    out = done[(f"{arch}.context_length", 2**32 - 1)]
    assert out.startswith(("ValueError", "MemoryError")) and "n_ctx" in out, out
    out = done[(f"{arch}.context_length", 2**31)]
    assert out.startswith(("ValueError", "MemoryError")), out


def test_dense_model_rejects_expert_keys(tiny_model_path):
    path = tiny_model_path("llama")
    with pytest.raises(pyllama.UnsupportedModelError, match=r"llama\.expert_used_count = 2147483648"):
        Model.load(path, kv_overrides={"llama.expert_used_count": 2**31})
    with pytest.raises(pyllama.UnsupportedModelError, match="mixture-of-experts 'llama' models are not supported"):
        Model.load(path, kv_overrides={"llama.expert_count": 8, "llama.expert_used_count": 2})
    m = Model.load(path, kv_overrides={"llama.expert_count": 0, "llama.expert_used_count": 0})
    with Context(m, n_ctx=256, n_threads=1) as ctx:
        ctx.decode([1, 2])


def test_moe_expert_counts_bounded(tiny_model_path):
    path = tiny_model_path("qwen3moe")
    with pytest.raises(pyllama.UnsupportedModelError, match=r"0 < expert_used_count <= expert_count \(got 4 and 5\)"):
        Model.load(path, kv_overrides={"qwen3moe.expert_used_count": 5})
    with pytest.raises(pyllama.UnsupportedModelError, match="more than llama.cpp's 512 experts"):
        Model.load(path, kv_overrides={"qwen3moe.expert_count": 513})


def test_head_sizes_that_disagree_with_the_tensors_fail_at_load(tiny_model_path):
    """phi3 (fused attn_qkv) with attention.value_length = 65536 loaded and then failed in
    decode with 'internal: bad fused slice'; the schema now states the widths the forward
    pass slices by."""
    for arch in ("phi3", "phi2", "qwen2"):
        path = tiny_model_path(arch)
        for key in ("attention.value_length", "attention.key_length"):
            with pytest.raises(pyllama.UnsupportedModelError, match="wrong shape|larger than|rope.dimension_count"):
                Model.load(path, kv_overrides={f"{arch}.{key}": 65536})


def test_too_large_context_is_a_clear_error(tiny_model_path):
    m = Model.load(tiny_model_path("llama"))
    with pytest.raises(ValueError, match="n_ctx = .* must be at most 2147483647"):
        Context(m, n_ctx=2**32, n_threads=1)


# ------------------------------------------------------------------------------------
# arrays rewritten during a decode


def _decode_logits(model, tokens, n_ubatch):
    with Context(model, n_ctx=256, n_batch=64, n_ubatch=n_ubatch, n_threads=1) as ctx:
        ctx.decode(tokens)
        return ctx.logits[-1].copy()


def test_abort_callback_rewriting_the_batch_cannot_panic(tiny_model_path):
    """llama_decode validates the batch, then runs its micro-batches with the GIL released
    and calls the abort callback between them. A callback that rewrites the caller's token
    array to an out-of-range id made the next micro-batch index past the embedding table
    (a Rust panic: PanicException, which `except Exception` does not catch). Rust now works
    on its own copy of what was validated, so the decode computes the original tokens."""
    model = Model.load(tiny_model_path("llama"))
    toks = list(range(1, 41))
    want = _decode_logits(model, toks, 8)

    cparams = L.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch, cparams.n_threads = 256, 64, 8, 1
    ctx = L.llama_init_from_model(model, cparams)
    batch = L.llama_batch_init(64, 0, 1)
    n = len(toks)
    batch.n_tokens = n
    batch.token[:n] = toks
    batch.pos[:n] = np.arange(n)
    batch.n_seq_id[:n] = 1
    batch.seq_id[:n, 0] = 0
    batch.logits[:n] = 0
    batch.logits[n - 1] = 1
    calls = []

    def rewrite(_data=None):
        calls.append(1)
        batch.token[:64] = 10**6
        batch.pos[:64] = -5
        batch.seq_id[:64] = 99
        return False

    L.llama_set_abort_callback(ctx, rewrite, None)
    assert L.llama_decode(ctx, batch) == 0
    assert len(calls) >= 2
    got = np.array(L.llama_get_logits_ith(ctx, -1))
    np.testing.assert_array_equal(got, want)
    L.llama_batch_free(batch)
    L.llama_free(ctx)


def test_core_decode_refuses_unusable_output_arrays(tiny_model_path):
    """A read-only or non-contiguous output array was `unwrap()`ed by the binding (a panic);
    now a ValueError naming it. Same for arrays of the wrong dtype (TypeError)."""
    model = Model.load(tiny_model_path("llama"))
    with Context(model, n_ctx=256, n_threads=1) as ctx:
        core = ctx._core
        tok = np.array([1, 2], dtype=np.int32)
        pos = np.array([0, 1], dtype=np.int32)
        nsi = np.ones(2, dtype=np.int32)
        sid = np.zeros((2, 1), dtype=np.int32)
        ubs = [np.array([0, 1], dtype=np.int32)]
        rows = np.array([-1, 0], dtype=np.int32)
        ro = np.zeros((1, core.n_vocab), dtype=np.float32)
        ro.setflags(write=False)
        with pytest.raises(ValueError, match="logits"):
            core.decode(tok, None, pos, nsi, sid, ubs, rows, ro)
        strided = np.zeros((1, 2 * core.n_vocab), dtype=np.float32)[:, ::2]
        with pytest.raises(ValueError, match="logits"):
            core.decode(tok, None, pos, nsi, sid, ubs, rows, strided)
        with pytest.raises(TypeError):
            core.decode(tok.astype(np.int64), None, pos, nsi, sid, ubs, rows, np.zeros((1, core.n_vocab), np.float32))
        with pytest.raises(TypeError, match="abort must be callable"):
            core.decode(tok, None, pos, nsi, sid, ubs, rows, np.zeros((1, core.n_vocab), np.float32), None, 42)
        ro1 = np.zeros(core.n_vocab, dtype=np.float32)
        ro1.setflags(write=False)
        with pytest.raises(ValueError, match="logits"):
            core.decode_one(1, ro1)
        # the same memory as input and output: an aliasing view is refused, not a panic
        buf = np.zeros((1, core.n_vocab), dtype=np.float32)
        alias = buf.view(np.int32).reshape(-1)[:2]
        alias[:] = [1, 2]
        out = core.decode(alias, None, pos, nsi, sid, ubs, rows, buf)
        assert (out.kind, out.n_done) == ("ok", 1)


def test_concurrent_mutation_from_another_thread(tiny_model_path):
    """Another Python thread rewriting the token array while decode runs with the GIL
    released: the decode's result is that of the tokens it validated."""
    model = Model.load(tiny_model_path("llama"))
    toks = np.arange(1, 65, dtype=np.int32)
    want = _decode_logits(model, toks.tolist(), 4)
    stop = threading.Event()
    arr = toks.copy()

    def scribble():
        while not stop.is_set():
            arr[:] = 10**6
            arr[:] = toks

    with Context(model, n_ctx=256, n_batch=64, n_ubatch=4, n_threads=1) as ctx:
        t = threading.Thread(target=scribble)
        t.start()
        try:
            for _ in range(5):
                ctx.memory_clear()
                b = pyllama.batch.batch_get_one(arr)
                rc = L.llama_decode(ctx, b)
                # the validator may see either content: the scribbled one is refused (-1)
                assert rc in (0, -1)
                if rc == 0:
                    np.testing.assert_array_equal(ctx.logits[-1], want)
        finally:
            stop.set()
            t.join()


# ------------------------------------------------------------------------------------
# the validator, not the forward pass, refuses what it can see


def test_positions_at_the_end_of_int32_are_invalid_not_fatal(tiny_model_path, caplog):
    model = Model.load(tiny_model_path("llama"))
    cparams = L.llama_context_default_params()
    cparams.n_ctx, cparams.n_threads = 256, 1
    ctx = L.llama_init_from_model(model, cparams)
    toks = np.array([1, 2, 3], dtype=np.int32)
    assert L.llama_decode(ctx, L.llama_batch_get_one(toks, 3)) == 0
    mem = L.llama_get_memory(ctx)
    L.llama_memory_seq_add(mem, 0, -1, -1, 2**31 - 3)  # positions 2^31-3 .. 2^31-1
    assert L.llama_memory_seq_pos_max(mem, 0) == 2**31 - 1
    one = np.array([4], dtype=np.int32)
    assert L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) == -1
    assert L.llama_decode(ctx, L.llama_batch_get_one(toks, 3)) == -1
    assert "int32" in caplog.text
    L.llama_free(ctx)


def test_shared_token_without_unified_cache_is_invalid_not_fatal(tiny_model_path, caplog):
    model = Model.load(tiny_model_path("llama"))
    cparams = L.llama_context_default_params()
    cparams.n_ctx, cparams.n_threads, cparams.n_seq_max, cparams.kv_unified = 1024, 1, 4, False
    ctx = L.llama_init_from_model(model, cparams)
    batch = L.llama_batch_init(1, 0, 4)
    batch.n_tokens = 1
    batch.token[0] = 5
    batch.pos[0] = 0
    batch.n_seq_id[0] = 4
    batch.seq_id[0, :4] = [0, 1, 2, 3]
    batch.logits[0] = 1
    assert L.llama_decode(ctx, batch) == -1
    assert "unified KV cache" in caplog.text
    L.llama_batch_free(batch)
    L.llama_free(ctx)


def test_thread_counts_are_capped_with_a_warning(tiny_model_path):
    model = Model.load(tiny_model_path("llama"))
    with pytest.warns(RuntimeWarning, match="n_threads = 100000 is more than the maximum of 512"):
        ctx = Context(model, n_ctx=256, n_threads=100000, n_threads_batch=1)
    with ctx:
        assert ctx.n_threads == 512
        with pytest.warns(RuntimeWarning, match="n_threads_batch = 2147483648"):
            ctx.set_n_threads(2, 2**31)
        assert ctx.n_threads_batch == 512
        ctx.set_n_threads(1, 1)
        ctx.decode([1, 2])


# ------------------------------------------------------------------------------------
# vocabularies


def _spm_vocab_md(byte_text: str) -> dict:
    toks = ["<unk>", "<s>", "</s>", byte_text, "a", "b"]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": toks,
            "tokenizer.ggml.scores": [0.0] * len(toks), "tokenizer.ggml.token_type": [2, 3, 3, 6, 1, 1]}


@pytest.mark.parametrize("text", ["", "<0x>", "<0xZZ>", "<0x0A", "0x0A>", "<0x0A>x", "hello"])
def test_byte_token_with_bad_text_fails_at_load(text):
    """A BYTE-type token whose text is not <0xXX> made detokenizing fail with
    `ValueError: invalid literal for int() with base 16: ''`, naming no token or file."""
    from pyllama.vocab import Vocab

    with pytest.raises(pyllama.PyllamaError, match=r"token 3 is a BYTE token \(type 6\) but its text"):
        Vocab.from_metadata(_spm_vocab_md(text), source="hostile.gguf")


def test_byte_token_with_good_text_loads():
    from pyllama.vocab import Vocab

    v = Vocab.from_metadata(_spm_vocab_md("<0x0A>"))
    assert v.token_to_piece(3) == b"\n"


def test_truncated_mapped_file_is_an_error_at_context_creation(tiny_model_path, tmp_path):
    """Truncating a memory-mapped model file makes the next read of a weight past the new
    end a SIGBUS; Context() checks the file size first. A RAM copy (load_mode none) is
    immune and keeps working."""
    import shutil

    path = tmp_path / "m.gguf"
    shutil.copy(tiny_model_path("llama"), path)
    mapped = Model.load(path, load_mode="mmap")
    in_ram = Model.load(path, load_mode="none")
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(OSError, match=f"shrank from {size} to {size // 2} bytes .*load_mode='none'"):
        Context(mapped, n_ctx=256, n_threads=1)
    with Context(in_ram, n_ctx=256, n_threads=1) as ctx:
        ctx.decode([1, 2, 3])


_FUZZ_CHILD = textwrap.dedent(r'''
    import json, os, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    import numpy as np
    import pyllama
    from pyllama import Context, Model
    from pyllama import llama_api as L
    src, work, n, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    base = open(src, "rb").read()
    head = pyllama.GGUFFile(src).data_offset  # metadata + tensor index: where structure lives
    rng = np.random.default_rng(seed)
    counts = {}
    for i in range(n):
        b = bytearray(base)
        for _ in range(int(rng.integers(1, 9))):
            at = int(rng.integers(0, head))
            kind = int(rng.integers(0, 3))
            if kind == 0:
                b[at] ^= 1 << int(rng.integers(0, 8))
            elif kind == 1:
                b[at] = int(rng.integers(0, 256))
            else:  # an extreme little-endian integer over 4 or 8 bytes
                w = 4 if rng.integers(0, 2) else 8
                v = int(rng.choice([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1, 2**20]))
                b[at:at + w] = (v & ((1 << 8 * w) - 1)).to_bytes(w, "little")[: len(b) - at]
        path = os.path.join(work, "f.gguf")
        with open(path, "wb") as f:
            f.write(bytes(b))
        print(json.dumps(["start", i]), flush=True)
        stage = "load"
        try:
            m = Model.load(path, load_mode="none")
            stage = "context"
            with Context(m, n_ctx=0 if i % 2 else 256, n_threads=1, n_threads_batch=1) as ctx:
                stage = "decode"
                rc = L.llama_decode(ctx, pyllama.batch.batch_get_one(np.array([1, 2, 3], dtype=np.int32)))
                out = f"decoded {rc}"
        except (pyllama.PyllamaError, ValueError, MemoryError, OSError) as e:
            out = f"{stage}: {type(e).__name__}"
        counts[out] = counts.get(out, 0) + 1
    print(json.dumps(["counts", counts]), flush=True)
''')


@pytest.mark.parametrize("arch", ["qwen3moe", "gemma3", "phi3", "qwen35"])
def test_mutated_model_files_load_run_or_fail_cleanly(tiny_model_path, tmp_path, arch):
    """Random corruption of a real model's metadata and tensor index (bit flips, random
    bytes, extreme integers), then load + context creation + a decode, each in a child with
    a 6 GiB address-space limit: every file loads and runs, or raises a PyllamaError /
    ValueError / MemoryError / OSError; nothing aborts, panics, hangs or segfaults.
    CI runs 150 files per architecture; PYLLAMA_SLOW=1 runs 3000."""
    n = 3000 if os.environ.get("PYLLAMA_SLOW") else 150
    src = tiny_model_path(arch)
    (rc, err), last, records = _run_child(_FUZZ_CHILD, str(src), str(tmp_path), str(n), str(7 + len(arch)),
                                          timeout=1200)
    counts = records[-1][1] if records else None
    assert rc == 0 and counts is not None, f"{arch}: mutated file {last} killed the child (exit {rc}):\n{err}"
    assert sum(counts.values()) == n
    # the corpus must exercise every stage, or it tests nothing past the parser
    assert any(k.startswith("load:") for k in counts), counts
    assert any(k.startswith("decoded") for k in counts), counts
    print(arch, counts)


_SCAN_CHILD = textwrap.dedent(r'''
    import inspect, json, random, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    import numpy as np
    from pyllama import _core
    path, n_calls = sys.argv[1], int(sys.argv[2])
    rng = random.Random(1234)

    def arrays():
        out = []
        for dt in (np.float32, np.int32, np.int64, np.uint8, np.float64):
            a = np.arange(12, dtype=dt).reshape(3, 4)
            ro = a.copy(); ro.setflags(write=False)
            out += [a, a[:, ::2], ro, a.ravel(), ro.ravel(), np.zeros(0, dt), np.full(5, np.nan).astype(dt)]
        return out
    pool = [None, 0, 1, -1, 2**31, -2**31 - 1, 2**63, 1.5, float("nan"), "x", "", "f16", "Q4_0", b"\xff",
            [], [1, 2], [[1]], (1,), (2**40, 2**40), {}, object()] + arrays()

    model = _core.Model([path])
    ctx = _core.Context(model, n_ctx=256, n_seq_max=2, n_ubatch=8, n_threads=1, n_threads_batch=1)
    gf = _core.GGUFFile(path)
    targets = [(n, getattr(_core, n)) for n in dir(_core)
               if callable(getattr(_core, n)) and not isinstance(getattr(_core, n), type)]
    for obj in (ctx, model, gf):
        for n in dir(obj):
            if n.startswith("_"):
                continue
            m = getattr(obj, n)
            if callable(m):
                targets.append((type(obj).__name__ + "." + n, m))
    i32 = [np.array(v, dtype=np.int32) for v in ([0, 1], [1], [-1, 5], [2**31 - 1], [])]
    i32 += [np.zeros((2, 1), np.int32), np.ones((2, 2), np.int32)[:, ::2]]
    f32 = [np.zeros((1, 2048), np.float32), np.zeros(2048, np.float32), np.zeros((1, 2048), np.float32)[:, ::2]]
    ro = np.zeros((1, 2048), np.float32); ro.setflags(write=False); f32.append(ro)
    ro1 = np.zeros(2048, np.float32); ro1.setflags(write=False); f32.append(ro1)
    by_name = {"logits": f32, "hidden": f32 + [None], "embd": [None] + f32, "x": f32,
               "tokens": i32 + [None], "pos": i32, "n_seq_id": i32, "seq_id": i32, "out_rows": i32,
               "ubatches": [[a] for a in i32] + [[]], "raw": [np.zeros(34, np.uint8), np.zeros(0, np.uint8)],
               "type_name": ["Q4_0", "F32", "Q8_K", "bogus", ""], "shape": [(32,), (1, 32), (0,), (2**40,), ()],
               "abort": [None, 42, lambda: True]}

    def plausible(fn):
        sig = getattr(fn, "__text_signature__", None)
        if not sig:
            return None
        names = [p.strip().split("=")[0].lstrip("*") for p in sig.strip("()").split(",")]
        names = [n for n in names if n and n not in ("self", "$self", "/", "")]
        return [rng.choice(by_name.get(n, pool)) for n in names]

    panics, calls = [], 0
    for i in range(n_calls):
        name, fn = targets[i % len(targets)]
        args = plausible(fn) if rng.random() < 0.6 else None
        if args is None:
            args = [rng.choice(pool) for _ in range(rng.randint(0, 10))]
        calls += 1
        try:
            fn(*args)
        except Exception:
            pass
        except BaseException as e:  # PanicException derives from BaseException
            panics.append([name, repr(args)[:200], f"{type(e).__name__}: {e}"[:300]])
    print(json.dumps({"calls": calls, "targets": len(targets), "panics": panics}))
''')


def test_core_api_scan_never_panics(tiny_model_path):
    """Every function and method of the compiled module called with hostile arguments
    (None, huge and negative integers, NaN, wrong dtypes, read-only / non-contiguous / empty
    arrays, wrong arity): exceptions only, never a PanicException (a BaseException that
    `except Exception` does not catch) or a crash."""
    n = 20000 if os.environ.get("PYLLAMA_SLOW") else 3000
    r = subprocess.run([sys.executable, "-c", _SCAN_CHILD, str(tiny_model_path("qwen2")), str(n)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout.splitlines()[-1])
    assert rep["calls"] == n and rep["targets"] > 30
    assert rep["panics"] == [], rep["panics"][:10]


def test_abort_callback_switching_embeddings_on_mid_decode(tiny_model_path):
    """An abort callback that turns embeddings on while a decode runs made the decode raise
    `TypeError: 'NoneType' object is not subscriptable` (it pooled a buffer it never made);
    the decode now finishes as it started, and the next one produces embeddings."""
    model = Model.load(tiny_model_path("llama"))
    with Context(model, n_ctx=256, n_ubatch=2, n_threads=1, pooling_type="mean") as ctx:
        ctx.set_abort_callback(lambda: ctx.set_embeddings(True) or False)
        ctx.decode([1, 2, 3, 4])
        ctx.set_abort_callback(None)
        ctx.decode([5, 6])
        assert ctx.embeddings_seq(0).shape == (model.n_embd,)
