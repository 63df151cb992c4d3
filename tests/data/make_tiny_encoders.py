"""Write tiny random-weight encoder GGUFs (bert, nomic-bert, jina-bert-v2, a bert reranker)
at test time, with the metadata keys llama.cpp's convert_hf_to_gguf.py writes for them and
a small BERT WordPiece vocabulary (BERT's special-token layout: [PAD] 0, [UNK] 100, [CLS]
101, [SEP] 102, [MASK] 103). No .gguf is tracked in git; llama.cpp's outputs for these
files are in tests/data/encoders/ (made by tests/data/encoders/make_reference.py).

    python tests/data/make_tiny_encoders.py OUT_DIR     # writes every spec, F32 and Q8_0
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

WORDS = ("the quick brown fox jump ##s ##ed ##ing over lazy dog hello world what is a capital of france "
         "paris machine learn ##er embed ##ding sentence token model search query document cat sat on mat "
         "it was good bad rain ##y day un ##believ ##able to be or not question answer how are you i am "
         "fine thank ##ful ca ##fe deja vu nai ##ve re ##rank passage relevant about this that with for "
         "and in at by from as an my your we they he she ##ly ##tion data science").split()


def vocab() -> list:
    toks = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    toks += [c for c in "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"]
    toks += [str(d) for d in range(10)] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    toks += [f"##{chr(c)}" for c in range(ord("a"), ord("z") + 1)] + [f"##{d}" for d in range(10)]
    for w in WORDS:
        if w not in toks:
            toks.append(w)
    # as convert_hf_to_gguf.py's BertModel.set_vocab writes a WordPiece vocabulary: a word
    # start gets the phantom space U+2581, a "##" continuation loses its "##"
    return [t if t.startswith("[") and t.endswith("]") else t[2:] if t.startswith("##") else "\u2581" + t
            for t in toks]


BASE = dict(n_layer=2, n_ctx=512, n_embd=64, n_head=4, n_ff=128, eps=1e-12)

SPECS = {
    # bge-small style: learned positions, token types, CLS pooling
    "bert": dict(arch="bert", pooling=2, seed=2001),
    # a bert reranker (bge-reranker style head): cls dense + tanh, cls.output to 1 label
    "bert-rank": dict(arch="bert", pooling=4, seed=2002, rank=True),
    # nomic-embed-text style: fused qkv without bias, NEOX rope, SwiGLU, mean pooling
    "nomic-bert": dict(arch="nomic-bert", pooling=1, seed=2003, rope_base=1000.0),
    # jina-embeddings-v2 style: ALiBi, q/k LayerNorms, fused GEGLU up, mean pooling
    "jina-bert-v2": dict(arch="jina-bert-v2", pooling=1, seed=2004),
    # jina-reranker-v1 style: a single-output cls {n_embd, 1} + bias, tanh, no cls.output
    "jina-bert-v2-rank": dict(arch="jina-bert-v2", pooling=4, seed=2011, rank=True, cls_rows=1),
    # ModernBERT: pre-norm, no biases, NEOX rope with a local base, a symmetric window of 8 on
    # layers 1 and 2 (il % 3 != 0), fused GEGLU; a rank head (dense + GELU + norm, output)
    "modern-bert": dict(arch="modern-bert", pooling=1, seed=2005, n_layer=3, rope_base=160000.0,
                        rope_base_swa=10000.0, sliding_window=8, eps=1e-5),
    "modern-bert-rank": dict(arch="modern-bert", pooling=4, seed=2006, n_layer=3, rope_base=160000.0,
                             rope_base_swa=10000.0, sliding_window=8, eps=1e-5, rank=True),
    # EmbeddingGemma: gemma3's layer, GQA 4/2 with 16-wide heads, a window of 8 on layers 0 and 2
    # (sliding_window_pattern 2), mean pooling
    "gemma-embedding": dict(arch="gemma-embedding", pooling=1, seed=2007, n_layer=3, n_head_kv=2, head_dim=16,
                            rope_base=1000000.0, rope_base_swa=10000.0, sliding_window=8, swa_pattern=2,
                            eps=1e-6),
    # the same with the sentence-transformers dense projections after pooling (dense_2 {64, 96},
    # dense_3 {96, 64}, no biases), as convert_hf_to_gguf --sentence-transformers-dense-modules
    "gemma-embedding-dense": dict(arch="gemma-embedding", pooling=1, seed=2007, n_layer=3, n_head_kv=2,
                                  head_dim=16, rope_base=1000000.0, rope_base_swa=10000.0, sliding_window=8,
                                  swa_pattern=2, eps=1e-6, dense=96),
    # nomic-embed-text v2 MoE style: nomic's rope, BERT's GELU FFN with biases on layer 0,
    # 4 ungated GELU experts (2 used) on layer 1 (moe_every_n_layers 2), fused qkv with bias
    "nomic-bert-moe": dict(arch="nomic-bert-moe", pooling=1, seed=2009, rope_base=10000.0, n_expert=4,
                           n_expert_used=2, moe_every=2),
    # llama-embed: LLaMA's layer as a non-causal encoder (GQA 4/2), mean pooling
    "llama-embed": dict(arch="llama-embed", pooling=1, seed=2010, n_head_kv=2, head_dim=16, rope_base=10000.0,
                        eps=1e-5),
    # Qwen3-Embedding style: tests/data/make_tiny.py's tiny qwen3 decoder (same weights) with
    # qwen3.pooling_type = last and this WordPiece vocabulary padded to its 2048 tokens
    "qwen3-embed": dict(arch="qwen3", pooling=3, seed=0, decoder=True),
    # Qwen3-Reranker style: the same decoder with rank pooling (the last token) and a
    # `cls.output` head of two labels, softmaxed (llama.cpp's qwen3 reranker head)
    "qwen3-rank": dict(arch="qwen3", pooling=4, seed=0, decoder=True, rank=True, n_cls_out=2),
    # T5 encoder: relative-position buckets (32; only layer 0 has attn_rel_b), layer 0 ReLU,
    # layer 1 GELU-gated (flan); SentencePiece UGM vocabulary
    "t5encoder": dict(arch="t5encoder", pooling=1, seed=2008, head_dim=16, n_buckets=32, eps=1e-6),
}


def write(name: str, out_dir: Path, qtype: str = "F32", n_layer: int | None = None, n_embd: int | None = None,
          n_head: int | None = None, n_ff: int | None = None, tag: str | None = None) -> Path:
    """Write ``out_dir/tiny-<name>-<qtype>.gguf`` (or ``<tag>-<qtype>.gguf``) and return its
    path; the sizes default to BASE (2 layers of 64)."""
    import gguf  # test dependency (gguf-py)

    s = dict(BASE, **SPECS[name])
    for k, v in (("n_layer", n_layer), ("n_embd", n_embd), ("n_head", n_head), ("n_ff", n_ff)):
        if v is not None:
            s[k] = v
    A = s["arch"]
    path = Path(out_dir) / f"{tag or 'tiny-' + name}-{qtype}.gguf"
    if path.exists():
        return path
    if A == "t5encoder":
        return _write_t5(path, s, qtype)
    if s.get("decoder"):
        return _write_decoder(path, s, qtype)
    toks = vocab()
    nv = len(toks)
    ne, nff, nl, nh = s["n_embd"], s["n_ff"], s["n_layer"], s["n_head"]
    rng = np.random.default_rng(s["seed"])
    w = gguf.GGUFWriter(str(path), A)
    w.add_type("model")
    w.add_name(path.stem)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_uint32(f"{A}.context_length", s["n_ctx"])
    w.add_uint32(f"{A}.embedding_length", ne)
    w.add_uint32(f"{A}.block_count", nl)
    w.add_uint32(f"{A}.feed_forward_length", nff)
    w.add_uint32(f"{A}.attention.head_count", nh)
    if A == "llama-embed":
        w.add_float32(f"{A}.attention.layer_norm_rms_epsilon", s["eps"])
        w.add_uint32(f"{A}.attention.head_count_kv", s["n_head_kv"])
    elif A == "gemma-embedding":
        w.add_float32(f"{A}.attention.layer_norm_rms_epsilon", s["eps"])
        w.add_uint32(f"{A}.attention.head_count_kv", s["n_head_kv"])
        w.add_uint32(f"{A}.attention.key_length", s["head_dim"])
        w.add_uint32(f"{A}.attention.value_length", s["head_dim"])
        w.add_uint32(f"{A}.attention.sliding_window_pattern", s["swa_pattern"])
        if "dense" in s:
            w.add_uint32(f"{A}.dense_2_feat_in", ne)
            w.add_uint32(f"{A}.dense_2_feat_out", s["dense"])
            w.add_uint32(f"{A}.dense_3_feat_in", s["dense"])
            w.add_uint32(f"{A}.dense_3_feat_out", ne)
    else:
        w.add_float32(f"{A}.attention.layer_norm_epsilon", s["eps"])
    if "sliding_window" in s:
        w.add_uint32(f"{A}.attention.sliding_window", s["sliding_window"])
        w.add_float32(f"{A}.rope.freq_base_swa", s["rope_base_swa"])
    w.add_bool(f"{A}.attention.causal", False)
    w.add_uint32(f"{A}.pooling_type", s["pooling"])
    if "rope_base" in s:
        w.add_float32(f"{A}.rope.freq_base", s["rope_base"])
    if s.get("rank"):
        w.add_array(f"{A}.classifier.output_labels", ["relevant"])
    if "n_expert" in s:
        w.add_uint32(f"{A}.expert_count", s["n_expert"])
        w.add_uint32(f"{A}.expert_used_count", s["n_expert_used"])
        w.add_uint32(f"{A}.moe_every_n_layers", s["moe_every"])

    w.add_tokenizer_model("bert")
    w.add_token_list(toks)
    w.add_token_types([3 if t.startswith("[") and t.endswith("]") else 1 for t in toks])
    w.add_uint32("tokenizer.ggml.token_type_count", 2)
    w.add_uint32("tokenizer.ggml.unknown_token_id", 100)
    w.add_uint32("tokenizer.ggml.seperator_token_id", 102)
    w.add_uint32("tokenizer.ggml.padding_token_id", 0)
    w.add_uint32("tokenizer.ggml.cls_token_id", 101)
    w.add_uint32("tokenizer.ggml.mask_token_id", 103)
    w.add_uint32("tokenizer.ggml.bos_token_id", 101)

    def add(tname, shape_ggml, kind):
        shape = tuple(reversed(shape_ggml))
        if kind == "w":
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / np.sqrt(shape_ggml[0]))
        elif kind == "embd":
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.5)
        elif kind == "norm":
            a = np.float32(1.0) + rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1)
        else:  # bias
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1)
        a = np.ascontiguousarray(a.astype(np.float32))
        # llama-quantize keeps position embeddings, token types and expert routers unquantized
        keep = tname in ("position_embd.weight", "token_types.weight") or tname.endswith("ffn_gate_inp.weight")
        quant = len(shape_ggml) == 2 or tname.endswith("_exps.weight")
        if qtype == "Q8_0" and kind in ("w", "embd") and not keep and quant and shape_ggml[0] % 32 == 0:
            w.add_tensor(tname, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(tname, a)

    add("token_embd.weight", [ne, nv], "embd")
    if A in ("modern-bert", "gemma-embedding", "llama-embed"):
        _prenorm_layers(add, A, s, ne, nff, nl, nh)
        if s.get("rank"):
            add("cls.weight", [ne, ne], "w")
            add("cls.norm.weight", [ne], "norm")
            add("cls.output.weight", [ne, 1], "w")
            add("cls.output.bias", [1], "bias")
        if "dense" in s:
            add("dense_2.weight", [ne, s["dense"]], "w")
            add("dense_3.weight", [s["dense"], ne], "w")
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path
    add("token_types.weight", [ne, 2], "embd")
    if A == "bert":
        add("position_embd.weight", [ne, s["n_ctx"]], "embd")
    add("token_embd_norm.weight", [ne], "norm")
    add("token_embd_norm.bias", [ne], "bias")
    for i in range(nl):
        b = f"blk.{i}."
        if A == "nomic-bert":
            add(b + "attn_qkv.weight", [ne, 3 * ne], "w")
        elif A == "nomic-bert-moe":
            add(b + "attn_qkv.weight", [ne, 3 * ne], "w")
            add(b + "attn_qkv.bias", [3 * ne], "bias")
        else:
            for p in ("q", "k", "v"):
                add(b + f"attn_{p}.weight", [ne, ne], "w")
                add(b + f"attn_{p}.bias", [ne], "bias")
        if A == "jina-bert-v2":
            for p in ("q", "k"):
                add(b + f"attn_{p}_norm.weight", [ne], "norm")
                add(b + f"attn_{p}_norm.bias", [ne], "bias")
        add(b + "attn_output.weight", [ne, ne], "w")
        if A != "nomic-bert":
            add(b + "attn_output.bias", [ne], "bias")
        add(b + "attn_output_norm.weight", [ne], "norm")
        add(b + "attn_output_norm.bias", [ne], "bias")
        if A == "nomic-bert-moe" and i % s["moe_every"] == 1:
            add(b + "ffn_gate_inp.weight", [ne, s["n_expert"]], "w")
            add(b + "ffn_up_exps.weight", [ne, nff, s["n_expert"]], "w")
            add(b + "ffn_down_exps.weight", [nff, ne, s["n_expert"]], "w")
        elif A in ("bert", "nomic-bert-moe"):
            add(b + "ffn_up.weight", [ne, nff], "w")
            add(b + "ffn_up.bias", [nff], "bias")
            add(b + "ffn_down.weight", [nff, ne], "w")
            add(b + "ffn_down.bias", [ne], "bias")
        elif A == "nomic-bert":
            add(b + "ffn_up.weight", [ne, nff], "w")
            add(b + "ffn_gate.weight", [ne, nff], "w")
            add(b + "ffn_down.weight", [nff, ne], "w")
        else:  # jina: fused [gate; up]
            add(b + "ffn_up.weight", [ne, 2 * nff], "w")
            add(b + "ffn_up.bias", [2 * nff], "bias")
            add(b + "ffn_down.weight", [nff, ne], "w")
            add(b + "ffn_down.bias", [ne], "bias")
        add(b + "layer_output_norm.weight", [ne], "norm")
        add(b + "layer_output_norm.bias", [ne], "bias")
    if s.get("rank") and s.get("cls_rows") == 1:
        add("cls.weight", [ne, 1], "w")
        add("cls.bias", [1], "bias")
    elif s.get("rank"):
        add("cls.weight", [ne, ne], "w")
        add("cls.bias", [ne], "bias")
        add("cls.output.weight", [ne, 1], "w")
        add("cls.output.bias", [1], "bias")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _write_decoder(path: Path, s: dict, qtype: str) -> Path:
    """make_tiny.py's tiny decoder of s["arch"] (its weights, its keys) with
    ``{arch}.pooling_type`` and the WordPiece vocabulary of this file padded to n_vocab."""
    import tempfile

    import gguf
    import make_tiny

    A = s["arch"]
    with tempfile.TemporaryDirectory() as d:
        src = gguf.GGUFReader(str(make_tiny.write_tiny(A, Path(d), qtype)))
        w = gguf.GGUFWriter(str(path), A)
        for k, f in src.fields.items():
            if k.startswith(("tokenizer.", "GGUF.", "general.architecture")):
                continue
            sub = f.types[1] if len(f.types) > 1 else None
            w.add_key_value(k, f.contents(), f.types[0], sub)
        w.add_uint32(f"{A}.pooling_type", s["pooling"])
        if s.get("rank"):
            w.add_array(f"{A}.classifier.output_labels", ["yes", "no"][:s["n_cls_out"]])
        toks = vocab()
        toks += [f"[unused{i}]" for i in range(99, 99 + make_tiny.N_VOCAB - len(toks))]
        w.add_tokenizer_model("bert")
        w.add_token_list(toks)
        w.add_token_types([3 if t.startswith("[") and t.endswith("]") else 1 for t in toks])
        w.add_uint32("tokenizer.ggml.token_type_count", 2)
        for t in src.tensors:
            data = np.array(t.data)
            if t.tensor_type == gguf.GGMLQuantizationType.F32:
                w.add_tensor(t.name, data)
            else:
                w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
        if s.get("rank"):
            ne = int(src.fields[f"{A}.embedding_length"].contents())
            rng = np.random.default_rng(s["seed"] + 1)
            a = (rng.standard_normal((s["n_cls_out"], ne), dtype=np.float32) * np.float32(1.0 / np.sqrt(ne))).astype(np.float32)
            if qtype == "Q8_0" and ne % 32 == 0:
                w.add_tensor("cls.output.weight", gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                             raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            else:
                w.add_tensor("cls.output.weight", a)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return path


def t5_vocab() -> tuple:
    """(pieces, scores, types) of a small SentencePiece unigram vocabulary: <pad> 0, </s> 1,
    <unk> 2, then word pieces (with the U+2581 word-start marker) and single characters."""
    pieces = ["<pad>", "</s>", "<unk>"]
    scores = [0.0, 0.0, 0.0]
    types = [3, 3, 2]
    words = [w for w in WORDS if not w.startswith("##")]
    for i, wd in enumerate(words):
        pieces.append("\u2581" + wd)
        scores.append(-3.0 - 0.05 * i)
        types.append(1)
    for i, sub in enumerate(("s", "ed", "ing", "er", "ly", "tion", "able", "y")):
        pieces.append(sub)
        scores.append(-6.0 - 0.1 * i)
        types.append(1)
    for c in "\u2581abcdefghijklmnopqrstuvwxyz0123456789.,!?'-":
        if c not in pieces:
            pieces.append(c)
            scores.append(-10.0)
            types.append(1)
    return pieces, scores, types


def _write_t5(path: Path, s: dict, qtype: str) -> Path:
    import gguf

    A = s["arch"]
    pieces, scores, types = t5_vocab()
    nv = len(pieces)
    ne, nff, nl, nh, hd = s["n_embd"], s["n_ff"], s["n_layer"], s["n_head"], s["head_dim"]
    rng = np.random.default_rng(s["seed"])
    w = gguf.GGUFWriter(str(path), A)
    w.add_type("model")
    w.add_name(path.stem)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_uint32(f"{A}.context_length", s["n_ctx"])
    w.add_uint32(f"{A}.embedding_length", ne)
    w.add_uint32(f"{A}.block_count", nl)
    w.add_uint32(f"{A}.feed_forward_length", nff)
    w.add_uint32(f"{A}.attention.head_count", nh)
    w.add_uint32(f"{A}.attention.key_length", hd)
    w.add_uint32(f"{A}.attention.value_length", hd)
    w.add_float32(f"{A}.attention.layer_norm_rms_epsilon", s["eps"])
    w.add_uint32(f"{A}.attention.relative_buckets_count", s["n_buckets"])
    w.add_uint32(f"{A}.pooling_type", s["pooling"])
    w.add_tokenizer_model("t5")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_uint32("tokenizer.ggml.eos_token_id", 1)
    w.add_uint32("tokenizer.ggml.unknown_token_id", 2)
    w.add_uint32("tokenizer.ggml.padding_token_id", 0)
    w.add_bool("tokenizer.ggml.add_eos_token", True)

    def add(tname, shape_ggml, kind):
        shape = tuple(reversed(shape_ggml))
        if kind == "w":
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / np.sqrt(shape_ggml[0]))
        elif kind == "embd":
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.5)
        else:  # norm
            a = np.float32(1.0) + rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1)
        a = np.ascontiguousarray(a.astype(np.float32))
        if qtype == "Q8_0" and kind in ("w", "embd") and shape_ggml[0] % 32 == 0:
            w.add_tensor(tname, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(tname, a)

    add("token_embd.weight", [ne, nv], "embd")
    for i in range(nl):
        b = f"enc.blk.{i}."
        add(b + "attn_norm.weight", [ne], "norm")
        if i == 0:
            rel = rng.standard_normal((s["n_buckets"], nh), dtype=np.float32) * np.float32(0.5)
            w.add_tensor(b + "attn_rel_b.weight", np.ascontiguousarray(rel))
        add(b + "attn_q.weight", [ne, nh * hd], "w")
        add(b + "attn_k.weight", [ne, nh * hd], "w")
        add(b + "attn_v.weight", [ne, nh * hd], "w")
        add(b + "attn_o.weight", [nh * hd, ne], "w")
        add(b + "ffn_norm.weight", [ne], "norm")
        if i == 1:
            add(b + "ffn_gate.weight", [ne, nff], "w")
        add(b + "ffn_up.weight", [ne, nff], "w")
        add(b + "ffn_down.weight", [nff, ne], "w")
    add("enc.output_norm.weight", [ne], "norm")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _prenorm_layers(add, A, s, ne, nff, nl, nh):
    if A == "modern-bert":
        add("token_embd_norm.weight", [ne], "norm")
        for i in range(nl):
            b = f"blk.{i}."
            if i > 0:
                add(b + "attn_norm.weight", [ne], "norm")
            add(b + "attn_qkv.weight", [ne, 3 * ne], "w")
            add(b + "attn_output.weight", [ne, ne], "w")
            add(b + "ffn_norm.weight", [ne], "norm")
            add(b + "ffn_up.weight", [ne, 2 * nff], "w")
            add(b + "ffn_down.weight", [nff, ne], "w")
        add("output_norm.weight", [ne], "norm")
        return
    hd, nkv = s["head_dim"], s["n_head_kv"]
    if A == "llama-embed":
        for i in range(nl):
            b = f"blk.{i}."
            add(b + "attn_norm.weight", [ne], "norm")
            add(b + "attn_q.weight", [ne, nh * hd], "w")
            add(b + "attn_k.weight", [ne, nkv * hd], "w")
            add(b + "attn_v.weight", [ne, nkv * hd], "w")
            add(b + "attn_output.weight", [nh * hd, ne], "w")
            add(b + "ffn_norm.weight", [ne], "norm")
            add(b + "ffn_gate.weight", [ne, nff], "w")
            add(b + "ffn_up.weight", [ne, nff], "w")
            add(b + "ffn_down.weight", [nff, ne], "w")
        add("output_norm.weight", [ne], "norm")
        return
    for i in range(nl):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", [ne], "norm")
        add(b + "attn_q.weight", [ne, nh * hd], "w")
        add(b + "attn_k.weight", [ne, nkv * hd], "w")
        add(b + "attn_v.weight", [ne, nkv * hd], "w")
        add(b + "attn_q_norm.weight", [hd], "norm")
        add(b + "attn_k_norm.weight", [hd], "norm")
        add(b + "attn_output.weight", [nh * hd, ne], "w")
        add(b + "post_attention_norm.weight", [ne], "norm")
        add(b + "ffn_norm.weight", [ne], "norm")
        add(b + "ffn_gate.weight", [ne, nff], "w")
        add(b + "ffn_up.weight", [ne, nff], "w")
        add(b + "ffn_down.weight", [nff, ne], "w")
        add(b + "post_ffw_norm.weight", [ne], "norm")
    add("output_norm.weight", [ne], "norm")


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    for n in SPECS:
        for q in ("F32", "Q8_0"):
            print(write(n, out, q))
