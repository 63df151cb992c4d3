"""llama-imatrix's importance matrices kept in git as .npz (no .gguf is tracked), rebuilt
as GGUF at test time.

``to_npz(gguf_path, npz_path)`` (run by the reference generators, beside llama-imatrix)
stores every entry's ``in_sum2`` and ``counts`` tensors, the datasets, chunk count and
chunk size, and the SHA-256 of the file llama-imatrix wrote. ``to_gguf(npz_path, out)``
writes them back with pyllama's imatrix writer (llama-imatrix's format) and raises if the
bytes differ from llama-imatrix's file, so what the tests quantize with is exactly what
llama-quantize was given.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np


def to_npz(gguf_path: Path, npz_path: Path) -> None:
    import gguf

    data = Path(gguf_path).read_bytes()
    r = gguf.GGUFReader(str(gguf_path))
    meta = {"datasets": list(r.fields["imatrix.datasets"].contents()),
            "chunk_count": int(r.fields["imatrix.chunk_count"].contents()),
            "chunk_size": int(r.fields["imatrix.chunk_size"].contents()),
            "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
            "tensors": [t.name for t in r.tensors]}
    arrays = {t.name: np.array(t.data, dtype=np.float32).reshape(tuple(int(n) for n in reversed(t.shape)))
              for t in r.tensors}
    np.savez_compressed(npz_path, __meta__=np.array(json.dumps(meta)), **arrays)


def to_gguf(npz_path: Path, out: Path) -> Path:
    from pyllama.imatrix import save_imatrix

    z = np.load(npz_path)
    meta = json.loads(str(z["__meta__"]))
    entries: dict = {}
    for name in meta["tensors"]:
        base, kind = name.rsplit(".", 1)
        sums, counts = entries.get(base, (None, None))
        a = z[name]
        if kind == "in_sum2":
            sums = a.reshape(-1, a.shape[-1])
        elif kind == "counts":
            counts = [int(c) for c in a.ravel()]
        else:
            raise ValueError(f"{npz_path}: unexpected tensor {name!r}")
        entries[base] = (sums, counts)
    save_imatrix(out, entries, datasets=meta["datasets"], chunk_count=meta["chunk_count"],
                 chunk_size=meta["chunk_size"])
    got = hashlib.sha256(Path(out).read_bytes()).hexdigest()
    if got != meta["sha256"]:
        raise AssertionError(f"{out}: rebuilt from {npz_path}, sha256 {got} is not llama-imatrix's {meta['sha256']}")
    return Path(out)
