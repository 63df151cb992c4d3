"""Write the tiny random-weight llama and gemma3 GGUF models of ../shared/tiny at test time
(no .gguf is tracked in git).

The weights follow ../shared/tiny/make_tiny_models.py exactly (same seeds, same draws in
the same order), so ``tiny-llama`` and ``tiny-gemma3`` here hold the same F32 tensors as
``tiny-llama-F32.gguf`` / ``tiny-gemma3-F32.gguf`` there (checked against them when those
files exist). Only the tokenizer differs: a synthetic 2048-token BPE vocabulary, since
the tests that use these files feed token ids directly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

N_VOCAB = 2048

SPECS = {
    "llama": dict(name="tiny-llama", arch="llama", seed=1000, n_layer=2, n_embd=256, n_ff=512, n_head=4,
                  n_head_kv=2, head_dim=64, rope_base=10000.0, eps=1e-5, scale={}),
    "gemma3": dict(name="tiny-gemma3", arch="gemma3", seed=1009, n_layer=6, n_embd=64, n_ff=128, n_head=4,
                   n_head_kv=1, head_dim=32, rope_base=1000000.0, rope_base_swa=10000.0, eps=1e-6,
                   sliding_window=64, scale=dict(embd=1 / 3, output_norm=3.0, post_norm=3.0)),
}


def write_tiny(arch: str, out_dir: Path) -> Path:
    """Write ``out_dir/<name>-F32.gguf`` for ``arch`` in {"llama", "gemma3"}; return its path."""
    import gguf  # test dependency (gguf-py)

    s = SPECS[arch]
    path = Path(out_dir) / f"{s['name']}-F32.gguf"
    if path.exists():
        return path
    A = s["arch"]
    n_embd, n_ff, hd = s["n_embd"], s["n_ff"], s["head_dim"]
    n_q, n_kv = s["n_head"] * hd, s["n_head_kv"] * hd
    w = gguf.GGUFWriter(str(path), A)
    rng = np.random.default_rng(s["seed"])

    w.add_type("model")
    w.add_name(s["name"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_uint32(f"{A}.context_length", 2048)
    w.add_uint32(f"{A}.embedding_length", n_embd)
    w.add_uint32(f"{A}.block_count", s["n_layer"])
    w.add_uint32(f"{A}.feed_forward_length", n_ff)
    w.add_uint32(f"{A}.attention.head_count", s["n_head"])
    w.add_uint32(f"{A}.attention.head_count_kv", s["n_head_kv"])
    w.add_float32(f"{A}.attention.layer_norm_rms_epsilon", s["eps"])
    w.add_float32(f"{A}.rope.freq_base", s["rope_base"])
    if A == "gemma3":
        w.add_uint32(f"{A}.attention.key_length", hd)
        w.add_uint32(f"{A}.attention.value_length", hd)
        w.add_float32(f"{A}.rope.freq_base_swa", s["rope_base_swa"])
        w.add_uint32(f"{A}.attention.sliding_window", s["sliding_window"])
    else:
        w.add_uint32(f"{A}.vocab_size", N_VOCAB)
        w.add_uint32(f"{A}.rope.dimension_count", hd)

    # synthetic byte-free vocabulary: ids 0..2047, 0 = eos/eog, 1 = bos
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list([f"<t{i}>" for i in range(N_VOCAB)])
    w.add_token_types([3 if i < 2 else 1 for i in range(N_VOCAB)])
    w.add_token_merges([])
    w.add_bos_token_id(1)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)

    def add(name, ne, kind, scale=None):
        shape = tuple(reversed(ne))
        sc = np.float32(s["scale"].get(scale, 1.0)) if scale else np.float32(1.0)
        if kind == "w":
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / np.sqrt(ne[0]))
        elif kind == "embd":
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(3.0 / np.sqrt(n_embd))
        else:  # norm
            a = np.float32(1.0) + rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1)
        w.add_tensor(name, np.ascontiguousarray((a * sc).astype(np.float32)))

    add("token_embd.weight", [n_embd, N_VOCAB], "embd", scale="embd")
    for i in range(s["n_layer"]):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", [n_embd], "norm")
        add(b + "attn_q.weight", [n_embd, n_q], "w", scale="attn_q")
        add(b + "attn_k.weight", [n_embd, n_kv], "w", scale="attn_k")
        add(b + "attn_v.weight", [n_embd, n_kv], "w")
        if A == "gemma3":
            add(b + "attn_q_norm.weight", [hd], "norm")
            add(b + "attn_k_norm.weight", [hd], "norm")
        add(b + "attn_output.weight", [n_q, n_embd], "w", scale="attn_output")
        if A == "gemma3":
            add(b + "post_attention_norm.weight", [n_embd], "norm", scale="post_norm")
        add(b + "ffn_norm.weight", [n_embd], "norm")
        add(b + "ffn_gate.weight", [n_embd, n_ff], "w")
        add(b + "ffn_up.weight", [n_embd, n_ff], "w")
        add(b + "ffn_down.weight", [n_ff, n_embd], "w", scale="ffn_down")
        if A == "gemma3":
            add(b + "post_ffw_norm.weight", [n_embd], "norm", scale="post_norm")
    add("output_norm.weight", [n_embd], "norm", scale="output_norm")

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
