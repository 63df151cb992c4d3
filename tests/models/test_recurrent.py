"""Recurrent and hybrid memories (Mamba-2, LFM2, Qwen3.5, ...): multi-sequence batches and
llama.h's sequence operations replayed on the tiny fixtures against llama.cpp's answers
(tests/data/tiny/make_seq_ops_reference.py: same script through llama.cpp), plus what the
memory reports through llama.h's API."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import pyllama.llama_api as L
from pyllama import _core
from pyllama.batch import batch_init
from pyllama.context import Context, ContextParams

DATA = Path(__file__).parents[1] / "data"
# every architecture with a reference (qwen3: the plain KV cache, for comparison; gemma4 and
# gemma3n: KV caches whose last layers read earlier layers' cells, gemma4's with sliding-window
# layers of their own head size)
ALL = sorted(p.name[len("seq-ops-"):-len(".json")] for p in (DATA / "tiny").glob("seq-ops-*.json"))
ARCHS = [a for a in ALL if a not in ("qwen3", "gemma4", "gemma3n")]  # the recurrent and hybrid ones
NO_SHIFT = ("qwen35", "qwen35moe")  # M-RoPE
# llama.cpp's arwkv7 and rwkv6qwen2 (one token shift) store the shifted rows of a micro-batch
# with several sequences through ggml_view_1d of a strided view (arwkv7.cpp / rwkv6qwen2.cpp,
# build_rwkv_token_shift_store): sequence k > 0 keeps the normed row (n_seq_tokens - 1 + k) of
# the whole micro-batch, not its own last row. pyllama keeps each sequence's last row; the
# script's first decode (two sequences in one micro-batch) makes llama.cpp's row 4 (sequence 1
# continued) differ.
LLAMA_CPP_WRONG_ROWS = {"arwkv7": [4], "rwkv6qwen2": [4]}


def _tiny(arch, tmp_path_factory):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tiny", DATA / "make_tiny.py")
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    return mk.write_tiny(arch, tmp_path_factory.mktemp(f"tiny-{arch}"), "F32")


def _context(path, n_seq_max, **kw):
    p = ContextParams(**{"n_ctx": 256, "n_batch": 256, "n_ubatch": 512, "n_seq_max": n_seq_max, "n_threads": 2,
                         "n_threads_batch": 2, **kw})
    return Context(_core.Model([str(path)]), p)


def replay(ctx, script, n_vocab):
    """Run seq_ops.cpp's script language on a pyllama context: (answers, logits rows)."""
    mem = L.llama_get_memory(ctx)
    answers, rows = [], []
    saved = {}
    for line in script:
        op, *args = line.split()
        if op == "decode":
            seqs = [(int(s), [int(t) for t in toks.split(",")]) for s, toks in (p.split(":") for p in args[0].split(";"))]
            n = sum(len(t) for _, t in seqs)
            b = batch_init(n, 0, 1)
            k, last = 0, []
            for s, toks in seqs:
                p0 = L.llama_memory_seq_pos_max(mem, s) + 1
                for j, t in enumerate(toks):
                    b.token[k], b.pos[k], b.n_seq_id[k], b.seq_id[k][0] = t, p0 + j, 1, s
                    b.logits[k] = j + 1 == len(toks)
                    k += 1
                last.append(k - 1)
            b.n_tokens = n
            ret = L.llama_decode(ctx, b)
            answers.append(f"decode {ret}")
            if ret == 0:
                rows += [np.array(L.llama_get_logits_ith(ctx, i), dtype=np.float32) for i in last]
        elif op == "rm":
            answers.append(f"rm {int(L.llama_memory_seq_rm(mem, *map(int, args)))}")
        elif op == "cp":
            L.llama_memory_seq_cp(mem, *map(int, args))
        elif op == "keep":
            L.llama_memory_seq_keep(mem, int(args[0]))
        elif op == "add":
            L.llama_memory_seq_add(mem, *map(int, args))
        elif op == "div":
            L.llama_memory_seq_div(mem, *map(int, args))
        elif op == "pos":
            s = int(args[0])
            answers.append(f"pos {s} {L.llama_memory_seq_pos_min(mem, s)} {L.llama_memory_seq_pos_max(mem, s)}")
        elif op == "save":
            s = int(args[0])
            n = L.llama_state_get_size(ctx) if s < 0 else L.llama_state_seq_get_size(ctx, s)
            blob = np.zeros(n, dtype=np.uint8)
            got = L.llama_state_get_data(ctx, blob, n) if s < 0 else L.llama_state_seq_get_data(ctx, blob, n, s)
            saved[s] = blob[:got]
        elif op == "load":
            s, d = map(int, args)
            blob = saved[s]
            n = (L.llama_state_set_data(ctx, blob, len(blob)) if s < 0
                 else L.llama_state_seq_set_data(ctx, blob, len(blob), d))
            answers.append(f"load {int(n == len(blob))}")
        elif op == "clear":
            L.llama_memory_clear(mem, True)
        elif op == "nrs":
            answers.append(f"nrs {L.llama_n_rs_seq(ctx)}")
        else:
            raise ValueError(line)
    return answers, np.array(rows).reshape(-1, n_vocab)


@pytest.mark.parametrize("arch", ALL)
def test_seq_ops_match_llamacpp(arch, tmp_path_factory):
    ref = json.loads((DATA / "tiny" / f"seq-ops-{arch}.json").read_text())
    want = np.load(DATA / "tiny" / f"seq-ops-{arch}.npz")["rows"]
    ctx = _context(_tiny(arch, tmp_path_factory), ref["n_seq_max"])
    answers, rows = replay(ctx, ref["script"], ref["n_vocab"])
    assert answers == ref["answers"]
    assert rows.shape == want.shape
    bad = LLAMA_CPP_WRONG_ROWS.get(arch, [])
    if bad:
        # those rows are llama.cpp's bug, not pyllama's answer: far from pyllama's
        assert (np.abs(rows[bad] - want[bad]).max(axis=1) > 1.0).all()
        keep = [i for i in range(len(rows)) if i not in bad]
        rows, want = rows[keep], want[keep]
    d = np.abs(rows - want)
    assert d.mean() <= 0.03 and np.percentile(d, 99) <= 0.15, (d.mean(), d.max())
    assert (rows.argmax(axis=1) == want.argmax(axis=1)).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_state_is_per_sequence_and_chunking_invariant(arch, tmp_path_factory):
    # the same tokens give the same last logits whether decoded alone, beside another
    # sequence, in one batch or one token at a time (up to the batch's float order)
    path = _tiny(arch, tmp_path_factory)
    toks = [17, 300, 5, 901, 44, 1203, 8, 77]
    script_one = ["decode 0:" + ",".join(map(str, toks))]
    script_two = ["decode 1:999,3,1500;0:" + ",".join(map(str, toks))]
    script_steps = [f"decode 0:{t}" for t in toks]
    nv = 2048
    a = replay(_context(path, 2), script_one, nv)[1][-1]
    b = replay(_context(path, 2), script_two, nv)[1][-1]
    c = replay(_context(path, 2), script_steps, nv)[1][-1]
    for other in (b, c):
        assert np.abs(a - other).max() < 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_memory_reports(arch, tmp_path_factory):
    ctx = _context(_tiny(arch, tmp_path_factory), 2)
    mem = L.llama_get_memory(ctx)
    # llama.cpp: shifting positions is trivial for a recurrent state (get_can_shift true);
    # a KV cache with M-RoPE cannot (llama.cpp aborts at the next decode: pyllama refuses)
    if arch in NO_SHIFT:
        assert L.llama_memory_can_shift(mem) is False
        with pytest.raises(ValueError, match="cannot shift"):
            L.llama_memory_seq_add(mem, 0, -1, -1, 3)
        with pytest.raises(ValueError, match="cannot shift"):
            L.llama_memory_seq_div(mem, 0, -1, -1, 2)
    else:
        assert L.llama_memory_can_shift(mem) is True
    assert ctx._core.memory_kind in ("recurrent", "hybrid")
    assert ctx._core.rs_bytes() > 0
    # seq ids beyond n_seq_max are refused by the API (no state cell for them)
    with pytest.raises(ValueError):
        L.llama_memory_seq_rm(mem, 5, -1, -1)


@pytest.mark.parametrize("arch", ARCHS)
def test_state_save_load_carries_the_recurrent_states(arch, tmp_path_factory):
    path = _tiny(arch, tmp_path_factory)
    ctx = _context(path, 2)
    nv = 2048
    replay(ctx, ["decode 0:17,300,5,901,44", "decode 1:999,3"], nv)
    # the whole context
    n = L.llama_state_get_size(ctx)
    blob = np.zeros(n, dtype=np.uint8)
    assert L.llama_state_get_data(ctx, blob, n) == n
    after = replay(ctx, ["decode 0:1203,8;1:77,6"], nv)[1]
    ctx2 = _context(path, 2)
    assert L.llama_state_set_data(ctx2, blob, n) == n
    assert replay(ctx2, ["pos 0", "pos 1"], nv)[0] == ["pos 0 4 4", "pos 1 1 1"]
    assert np.array_equal(replay(ctx2, ["decode 0:1203,8;1:77,6"], nv)[1], after)
    # one sequence, into another sequence id of a fresh context
    ctx3 = _context(path, 2)
    replay(ctx3, ["decode 0:17,300,5,901,44"], nv)
    m = L.llama_state_seq_get_size(ctx3, 0)
    sblob = np.zeros(m, dtype=np.uint8)
    assert L.llama_state_seq_get_data(ctx3, sblob, m, 0) == m
    ctx4 = _context(path, 2)
    assert L.llama_state_seq_set_data(ctx4, sblob, m, 1) == m
    assert replay(ctx4, ["pos 1"], nv)[0] == ["pos 1 4 4"]
    want = replay(ctx3, ["decode 0:1203"], nv)[1]
    assert np.array_equal(replay(ctx4, ["decode 1:1203"], nv)[1], want)


def _decode_at(ctx, seq, toks, p0):
    b = batch_init(len(toks), 0, 1)
    for j, t in enumerate(toks):
        b.token[j], b.pos[j], b.n_seq_id[j], b.seq_id[j][0], b.logits[j] = t, p0 + j, 1, seq, j + 1 == len(toks)
    b.n_tokens = len(toks)
    return L.llama_decode(ctx, b)


@pytest.mark.parametrize("arch", ARCHS)
def test_position_rules(arch, tmp_path_factory):
    # llama_batch_allocr::init: positions continue the memory's last one (Y = X + 1), except
    # for M-RoPE models, whose token batches may jump forward (X < Y) but not overlap
    ctx = _context(_tiny(arch, tmp_path_factory), 2)
    assert _decode_at(ctx, 0, [5, 6, 7], 0) == 0
    assert _decode_at(ctx, 0, [8], 2) == -1  # overlaps the cached position 2
    if arch in NO_SHIFT:
        assert _decode_at(ctx, 0, [8, 9], 10) == 0
        assert L.llama_memory_seq_pos_max(L.llama_get_memory(ctx), 0) == 11
    else:
        assert _decode_at(ctx, 0, [8, 9], 10) == -1
        assert _decode_at(ctx, 0, [8, 9], 3) == 0


ROLLBACK = ("lfm2", "lfm2moe", "qwen35", "qwen35moe")  # llm_arch_supports_rs_rollback
ROLLBACK_REFS = sorted(p.name[len("rollback-"):-len(".json")] for p in (DATA / "tiny").glob("rollback-*.json"))


@pytest.mark.parametrize("arch", ARCHS)
def test_n_rs_seq(arch, tmp_path_factory):
    # llama.cpp keeps rollback snapshots for lfm2 / lfm2moe / qwen35 / qwen35moe, and clamps
    # the request to 0 for the others; the snapshots are planes beside the states
    path = _tiny(arch, tmp_path_factory)
    ctx = _context(path, 2, n_rs_seq=2)
    if arch in ROLLBACK:
        assert L.llama_n_rs_seq(ctx) == 2
        assert ctx._core.rs_bytes() == 3 * _context(path, 2)._core.rs_bytes()
        # llama.cpp asserts n_ubatch > n_rs_seq + 1 at the first decode: refused up front
        with pytest.raises(ValueError, match="n_ubatch > n_rs_seq"):
            _context(path, 1, n_rs_seq=3, n_ubatch=4, n_batch=4)
    else:
        assert L.llama_n_rs_seq(ctx) == 0
        assert ctx._core.rs_bytes() == _context(path, 2)._core.rs_bytes()
    assert L.llama_n_rs_seq(_context(path, 1)) == 0
    with pytest.raises(ValueError, match="n_rs_seq"):
        _context(path, 1, n_rs_seq=-1)


@pytest.mark.parametrize("arch", ROLLBACK_REFS)
def test_rollback_matches_llamacpp(arch, tmp_path_factory):
    # tests/data/tiny/make_seq_ops_reference.py --rollback: llama.cpp's answers and logits for
    # scripts of partial removals with n_rs_seq > 0 (clamped to 0 for mamba2 and qwen3next)
    ref = json.loads((DATA / "tiny" / f"rollback-{arch}.json").read_text())
    want_all = np.load(DATA / "tiny" / f"rollback-{arch}.npz")
    path = _tiny(arch, tmp_path_factory)
    for run in ref["runs"]:
        ctx = _context(path, ref["n_seq_max"], n_rs_seq=run["n_rs_seq"], n_ubatch=run["n_ubatch"])
        answers, rows = replay(ctx, run["script"], ref["n_vocab"])
        assert answers == run["answers"], run["name"]
        want = want_all[run["name"]]
        assert rows.shape == want.shape
        d = np.abs(rows - want)
        # llama.cpp's F32 graph and pyllama's differ in float order only (measured: at most 9e-4)
        assert d.max() <= 5e-3, (run["name"], d.mean(), d.max())
        assert (rows.argmax(axis=1) == want.argmax(axis=1)).all(), run["name"]


@pytest.mark.parametrize("arch", ROLLBACK)
def test_rollback_equals_decoding_the_shorter_prompt(arch, tmp_path_factory):
    # removing the last k <= n_rs_seq positions and continuing gives the logits of the
    # shorter prompt and the continuation decoded from scratch (up to the batch's float order);
    # n_rs_seq changes nothing else: the same decodes give bit-identical logits without it
    path = _tiny(arch, tmp_path_factory)
    nv = 2048
    prompt = [17, 300, 5, 901, 44, 1203, 8, 77]
    plain = replay(_context(path, 2), ["decode 0:" + ",".join(map(str, prompt))], nv)[1]
    for k in (1, 2, 3):
        ctx = _context(path, 2, n_rs_seq=3)
        rows = replay(ctx, ["decode 0:" + ",".join(map(str, prompt)), f"rm 0 {8 - k} -1", "decode 0:999,3"], nv)[1]
        assert np.array_equal(rows[0], plain[0])
        fresh = replay(_context(path, 2), ["decode 0:" + ",".join(map(str, prompt[:8 - k] + [999, 3]))], nv)[1]
        assert np.abs(rows[1] - fresh[0]).max() < 1e-3, k
        # one more than n_rs_seq: refused, nothing changed
        last = 8 - k + 1
        assert replay(ctx, [f"rm 0 {last - 3} -1", "pos 0"], nv)[0] == ["rm 0", f"pos 0 {last} {last}"]


@pytest.mark.parametrize("arch", ["mamba2", "qwen35"])
def test_llama_generate_reuses_prefix_only_where_the_state_allows(arch, tmp_path_factory):
    # Llama.generate keeps the common prefix of the previous prompt in the cache; a
    # recurrent state cannot drop its last tokens (seq_rm is false), so a prompt that
    # diverges from the cached one is decoded again from the start, and greedy tokens
    # equal those of a fresh Llama
    import importlib.util

    import gguf

    from pyllama import Llama

    # the fixtures' synthetic vocabulary has no merges, which a Llama's tokenizer needs:
    # the same weights with a loadable 2048-token BPE vocabulary
    d = tmp_path_factory.mktemp(f"vocab-{arch}")
    w = gguf.GGUFWriter(str(d / "vocab.gguf"), "llama")
    toks = [f"<t{i}>" for i in range(2048)]
    toks[2:5] = ["a", "b", "ab"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(toks)
    w.add_token_types([3 if i < 2 else 1 for i in range(2048)])
    w.add_token_merges(["a b"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    spec = importlib.util.spec_from_file_location("make_tiny", DATA / "make_tiny.py")
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    path = str(mk.write_tiny(arch, d, "F32", tokenizer_from=d / "vocab.gguf"))
    a = [17, 300, 5, 901, 44, 1203]
    b = a[:3] + [8, 77, 999]

    def greedy(llm, prompt, n=4):
        out = []
        for tok in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
            out.append(tok)
            if len(out) == n:
                break
        return out

    llm = Llama(path, n_ctx=256, verbose=False)
    greedy(llm, a)
    assert greedy(llm, b) == greedy(Llama(path, n_ctx=256, verbose=False), b)


def test_state_of_a_shared_cell_with_different_rollbacks_is_refused(tmp_path_factory):
    # a copied sequence shares its source's cell; a rollback of one of them leaves the cell's
    # sequences with different pending rollbacks, whose common state llama.cpp cannot write
    # (it aborts): pyllama raises, and a single sequence's state can still be saved
    from pyllama import StateError

    ctx = _context(_tiny("lfm2", tmp_path_factory), 2, n_rs_seq=2)
    assert replay(ctx, ["decode 0:1,2,3,4", "cp 0 1 -1 -1", "rm 0 3 -1", "pos 1"], 2048)[0] == [
        "decode 0", "rm 1", "pos 1 2 2"]
    with pytest.raises(StateError, match="different pending rollbacks"):
        L.llama_state_get_size(ctx)
    assert L.llama_state_seq_get_size(ctx, 0) > 0
