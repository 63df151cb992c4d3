"""Extract the headers (metadata without the tokenizer arrays, and the tensor table) of
../shared/tiny's F32 models into tiny_headers.json, so tests can rebuild files with the
same metadata and tensor shapes as the llama.cpp-accepted fixtures without tracking .gguf
files. Run from the repository root: python tests/data/make_tiny_headers.py /work/shared/tiny"""

import json
import sys
from pathlib import Path

from pyllama import _core

root = Path(sys.argv[1]) / "models"
out = {}
for p in sorted(root.glob("tiny-*-F32*.gguf")):
    f = _core.GGUFFile(str(p))
    md, types = f.metadata(), f.metadata_types()
    kvs = [
        [k, types[k][0], types[k][1], v]
        for k, v in md.items()
        if not (k.startswith("tokenizer.") and isinstance(v, list))
    ]
    tensors = [[name, ty, ne] for name, ty, ne, _off, _nb in f.tensors()]
    out[p.name] = {"kvs": kvs, "tensors": tensors}
dst = Path(__file__).parent / "tiny_headers.json"
dst.write_text(json.dumps(out, separators=(",", ":"), sort_keys=True))
print(f"wrote {dst} ({dst.stat().st_size} bytes, {len(out)} models)")
