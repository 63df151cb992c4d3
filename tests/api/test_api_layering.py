"""The llama.h-style layer (``pyllama._api_*``) sits on the idiomatic classes without
reaching into them (issue 18): no attribute whose name starts with one underscore is read
or written on anything but ``self`` or the layer's own modules. A new private access fails
here, naming the file and line; add a public method to Context / Model instead."""

from __future__ import annotations

import ast
from pathlib import Path

import pyllama

PKG = Path(pyllama.__file__).parent
# the layer's own helper modules (module-level names of one layer) and ctypes' documented
# pointer classes (ctypes._Pointer, ctypes._SimpleCData)
OWN = {"_api_check", "_chk", "_api_context", "_api_batch_ext", "_api_sampling", "_api_model", "_api_state",
       "_api_system", "_api_vocab", "_api_adapter", "ctypes", "self", "cls"}


def _private_uses(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Attribute):
            continue
        a = node.attr
        if not a.startswith("_") or (a.startswith("__") and a.endswith("__")):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id in OWN:
            continue
        out.append(f"{path.name}:{node.lineno}: .{a} on {ast.unparse(base)}")
    return out


def test_llama_layer_uses_only_public_members():
    files = sorted(PKG.glob("_api_*.py")) + [PKG / "llama_api.py"]
    assert len(files) >= 9
    uses = [u for f in files for u in _private_uses(f)]
    assert uses == []


def test_the_scan_finds_a_private_access(tmp_path):
    f = tmp_path / "_api_x.py"
    f.write_text("def f(ctx):\n    return ctx._decode_code(1) + self._ok\n")
    assert _private_uses(f) == ["_api_x.py:2: ._decode_code on ctx"]
