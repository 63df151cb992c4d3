"""Deterministic F32 inputs for the quantizer tests, written at test time (no .gguf in git).

- ``tiny-llama`` / ``tiny-qwen3moe`` / ``tiny-phi2`` / ``tiny-gemma3``: make_tiny's models (n_embd 256 and 64,
  MoE expert tensors, fused QKV, ncols that need the shape fallbacks);
- ``wide-llama``: a llama at a realistic width (n_embd 512, n_ff 1408 which is not a
  multiple of 256, GQA 4, untied output) whose weights include what exercises the
  quantizers' edge paths: all-zero rows and blocks, tiny blocks (below 1e-15), outliers,
  rows scaled over six orders of magnitude, constant blocks, negative-only blocks;
- ``text-llama``: tiny-llama with tiny_vocab's byte-level vocabulary, for llama-imatrix;
- ``TEXT``: the text the importance matrices are computed on.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "imatrix"))

import make_tiny  # noqa: E402
import tiny_vocab  # noqa: E402

WORDS = ("the quick brown fox jumps over the lazy dog and then runs into the forest where many trees "
         "grow tall under the bright sun").split()


def text(n_words: int = 2500) -> str:
    rng = np.random.default_rng(7)
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), n_words)) + "\n"


def _edge_cases(a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Plant the quantizers' edge cases in a 2-D weight [rows, cols]."""
    rows, cols = a.shape
    a[0] = 0.0                                  # an all-zero row
    a[1, : min(256, cols)] = 0.0                # an all-zero super-block / blocks
    a[2, 32:64] = 1e-20                         # a block below GROUP_MAX_EPS
    a[3, :32] = 0.25                            # a constant block
    a[4, :64] = -np.abs(a[4, :64])              # negative-only blocks
    a[5, 7] = 40.0 * np.abs(a[5]).max()         # an outlier
    a[6] *= np.float32(1e-4)                    # small and large rows
    a[7] *= np.float32(1e2)
    scale = np.exp(rng.uniform(-3, 3, size=(rows, 1))).astype(np.float32)
    a[8:] *= scale[8:]
    return a


def write_wide_llama(path: Path) -> Path:
    import gguf

    if path.exists():
        return path
    n_embd, n_ff, n_layer, n_head, n_head_kv, hd, n_vocab = 512, 1408, 2, 8, 2, 64, 1024
    rng = np.random.default_rng(20261202)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_type("model")
    w.add_name("wide-llama")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_uint32("llama.context_length", 2048)
    w.add_uint32("llama.embedding_length", n_embd)
    w.add_uint32("llama.block_count", n_layer)
    w.add_uint32("llama.feed_forward_length", n_ff)
    w.add_uint32("llama.attention.head_count", n_head)
    w.add_uint32("llama.attention.head_count_kv", n_head_kv)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_uint32("llama.vocab_size", n_vocab)
    w.add_uint32("llama.rope.dimension_count", hd)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list([f"<t{i}>" for i in range(n_vocab)])
    w.add_token_types([3 if i < 2 else 1 for i in range(n_vocab)])
    w.add_token_merges(["<t 1>"])

    def weight(name, ne):
        a = rng.standard_normal((ne[1], ne[0]), dtype=np.float32) * np.float32(1.0 / np.sqrt(ne[0]))
        w.add_tensor(name, np.ascontiguousarray(_edge_cases(a, rng)))

    def norm(name, n):
        w.add_tensor(name, (np.float32(1.0) + rng.standard_normal(n, dtype=np.float32) * np.float32(0.1)))

    weight("token_embd.weight", [n_embd, n_vocab])
    for i in range(n_layer):
        b = f"blk.{i}."
        norm(b + "attn_norm.weight", n_embd)
        weight(b + "attn_q.weight", [n_embd, n_head * hd])
        weight(b + "attn_k.weight", [n_embd, n_head_kv * hd])
        weight(b + "attn_v.weight", [n_embd, n_head_kv * hd])
        weight(b + "attn_output.weight", [n_head * hd, n_embd])
        norm(b + "ffn_norm.weight", n_embd)
        weight(b + "ffn_gate.weight", [n_embd, n_ff])
        weight(b + "ffn_up.weight", [n_embd, n_ff])
        weight(b + "ffn_down.weight", [n_ff, n_embd])
    norm("output_norm.weight", n_embd)
    weight("output.weight", [n_embd, n_vocab])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_model(name: str, out_dir: Path) -> Path:
    """Write model ``name`` (see the module docstring) into ``out_dir``; return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if name == "wide-llama":
        return write_wide_llama(out_dir / "wide-llama-F32.gguf")
    if name == "text-llama":
        sub = out_dir / "text"
        sub.mkdir(exist_ok=True)
        vocab = tiny_vocab.write_vocab(sub / "vocab.gguf") if not (sub / "vocab.gguf").exists() else sub / "vocab.gguf"
        return make_tiny.write_tiny("llama", sub, tokenizer_from=vocab)
    if name.startswith("tiny-"):
        return make_tiny.write_tiny(name[len("tiny-"):], out_dir)
    raise ValueError(name)


def write_text(out_dir: Path) -> Path:
    p = Path(out_dir) / "imatrix-text.txt"
    if not p.exists():
        p.write_text(text())
    return p
