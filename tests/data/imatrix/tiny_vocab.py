"""A byte-level BPE vocabulary (GPT-2's byte alphabet, a few merges) of make_tiny's 2048
tokens, so that llama.cpp and pyllama can tokenize plain text with the tiny models
(llama-imatrix reads text). ``write_vocab(path)`` writes it as a tensor-less GGUF for
``make_tiny.write_tiny(..., tokenizer_from=path)``."""

from __future__ import annotations

from pathlib import Path

N_VOCAB = 2048


def _byte_chars() -> list[str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): ids 0 = <|endoftext|> (eos/bos), 1..256 the bytes,
    then the merged pieces, then unused filler tokens."""
    chars = _byte_chars()
    tokens = ["<|endoftext|>"] + chars
    merges: list[str] = []
    words = ["the", "and", "fox", "dog", "over", "tree", "sun", "run", "jump"]
    for w in words:
        for piece in (w, "\u0120" + w):  # Ġ = space
            cur = piece[0]
            for ch in piece[1:]:
                merged = cur + ch
                if merged not in tokens:
                    merges.append(f"{cur} {ch}")
                    tokens.append(merged)
                cur = merged
    types = [3] + [1] * (len(tokens) - 1)
    while len(tokens) < N_VOCAB:
        tokens.append(f"<unused{len(tokens)}>")
        types.append(5)
    return tokens, types, merges


def write_vocab(path: Path) -> Path:
    import gguf

    tokens, types, merges = vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
