"""Importance matrices (llama-imatrix) and model quantization (llama-quantize).

:func:`compute_imatrix` runs a text through a context the way llama-imatrix does and
collects, for every matmul weight of the layers, the sum over tokens of each input
column's squared activation (per expert for expert weights) and the token counts.
:func:`save_imatrix` writes them in llama-imatrix's GGUF format, which
:func:`quantize` (``pyllama quantize --imatrix``) and llama-quantize read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence, Tuple, Union

from . import _core

PathLike = Union[str, Path]


def compute_imatrix(ctx, tokens: Sequence[int], n_ctx: int, n_batch: int, n_chunks: int = -1, *,
                    add_bos: bool, bos: int, n_seq: int = 1, process_output: bool = False,
                    on_chunk: Optional[Callable[[int, int, float], None]] = None) -> tuple[dict, int]:
    """Collect an importance matrix over ``tokens`` (llama-imatrix's compute_imatrix).

    The tokens are cut into chunks of ``n_ctx``; ``n_seq`` chunks go through the context at
    a time as sequences 0..n_seq-1 of one batch (the context needs n_seq_max >= n_seq and
    room for n_seq * n_ctx tokens), each chunk from an empty KV cache, its first token
    replaced by ``bos`` when ``add_bos``, in batches of ``n_batch`` tokens, every token an
    output (as llama-imatrix asks). Returns ({weight name: (sums [n_mat, n_in], counts)},
    chunks processed). ``on_chunk(i, n_chunk, seconds)`` follows the progress.
    """
    import time

    import numpy as np

    from .batch import batch_init

    toks = np.asarray(tokens, dtype=np.int32)
    if n_ctx < 1 or n_batch < 1 or n_seq < 1:
        raise ValueError(f"n_ctx ({n_ctx}), n_batch ({n_batch}) and n_seq ({n_seq}) must be >= 1")
    if toks.shape[0] < 2 * n_ctx:
        raise ValueError(f"you need at least {2 * n_ctx} tokens for a context of {n_ctx} tokens; "
                         f"the text tokenizes to only {toks.shape[0]} tokens")
    n_chunk_max = toks.shape[0] // n_ctx
    n_chunk = n_chunk_max if n_chunks < 0 else min(n_chunks, n_chunk_max)
    if n_chunk == 0:
        raise ValueError("n_chunks = 0: nothing to process (give -1 for all)")
    num_batches = (n_ctx + n_batch - 1) // n_batch
    batch = batch_init(min(n_batch, n_ctx) * n_seq, 0, 1)
    _core.imatrix_begin(process_output)
    try:
        for i in range(0, n_chunk, n_seq):
            t0 = time.perf_counter()
            start = i * n_ctx
            end = start + n_ctx
            n_seq_batch = min(n_seq, n_chunk - i)
            ctx.memory_clear(True)
            for j in range(num_batches):
                b0 = start + j * n_batch
                size = min(end - b0, n_batch)
                batch.n_tokens = 0
                k = 0
                for seq in range(n_seq_batch):
                    s0 = b0 + seq * n_ctx
                    part = toks[s0:s0 + size].copy()
                    if add_bos and j == 0:
                        part[0] = bos
                    batch.token[k:k + size] = part
                    batch.pos[k:k + size] = j * n_batch + np.arange(size, dtype=np.int32)
                    batch.n_seq_id[k:k + size] = 1
                    batch.seq_id[k:k + size, 0] = seq
                    batch.logits[k:k + size] = 1
                    k += size
                batch.n_tokens = k
                ctx.decode(batch)
            if on_chunk:
                on_chunk(i, n_chunk, time.perf_counter() - t0)
    finally:
        entries = _core.imatrix_end()
    return entries, n_chunk


def save_imatrix(path: PathLike, entries: dict, *, datasets: Sequence[str], chunk_count: int, chunk_size: int) -> None:
    """Write ``entries`` ({name: (sums, counts)}) in llama-imatrix's GGUF format."""
    _core.imatrix_save(Path(path), dict(entries), list(datasets), int(chunk_count), int(chunk_size))


def quantize(input: PathLike, output: PathLike, ftype: str, *, n_threads: int = 1, imatrix: Optional[PathLike] = None,
             allow_requantize: bool = False, leave_output_tensor: bool = False, pure: bool = False,
             output_tensor_type: Optional[str] = None, token_embedding_type: Optional[str] = None,
             keep_split: bool = False, include_weights: Sequence[str] = (), exclude_weights: Sequence[str] = (),
             tensor_types: Sequence[Tuple[str, str]] = (),
             kv_overrides: Sequence[Tuple[str, str, Union[int, float, bool, str]]] = (),
             prune_layers: Sequence[int] = (), dry_run: bool = False,
             progress: Optional[Callable[[dict], None]] = None) -> dict:
    """Quantize a GGUF model as llama-quantize does (byte-identical output for the types
    pyllama implements). ``ftype``: a llama-quantize type name (Q4_K_M, Q8_0, IQ4_XS, ...).
    Returns a summary (size_before, size_after, n_elements, n_tensors, n_fallback, outputs,
    warnings); ``progress(info)`` is called after each tensor. ``tensor_types``: llama-quantize's
    ``--tensor-type`` as (regular expression, ggml type name) pairs; the first whose
    ``re.search`` matches a tensor's name sets its type (llama.cpp uses std::regex's ECMAScript
    search: the same for the usual patterns). ``kv_overrides``: ``--override-kv`` as (key,
    "int" | "float" | "bool" | "str", value) triples, set in the output's metadata as
    llama-quantize does (int as the u32 of its absolute value, float as f32). ``prune_layers``:
    ``--prune-layers``, block numbers to drop (the others are renumbered, block_count updated).
    ``dry_run``: only the per-tensor plan (progress) and sizes; nothing is written and
    ``outputs`` is empty."""
    return _core.quantize_model(Path(input), Path(output), ftype, n_threads=n_threads,
                                allow_requantize=allow_requantize, leave_output_tensor=leave_output_tensor,
                                pure=pure, output_tensor_type=output_tensor_type,
                                token_embedding_type=token_embedding_type, keep_split=keep_split,
                                imatrix=None if imatrix is None else Path(imatrix),
                                include_weights=list(include_weights), exclude_weights=list(exclude_weights),
                                tensor_types=[(str(p), str(t)) for p, t in tensor_types],
                                kv_overrides=[tuple(o) for o in kv_overrides], prune_layers=list(prune_layers),
                                dry_run=dry_run, progress=progress)
